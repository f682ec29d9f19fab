"""
What an oversized message costs the broker (issue 8): a raw client
publishes with a content header claiming ``--claim`` octets (default
2^63-1) and then keeps streaming ``--stream`` bytes (default 2 GiB) of
body frames anyway; the broker answers 406 at the header and must drop
the frames as they come.  Prints the broker's RSS before, at the peak
(sampled every 50 ms) and after, the time to stream, and whether the
connection still works afterwards (channel reopened, queue declared).

    .venv-test/bin/python bench/oversize.py
    .venv-test/bin/python bench/oversize.py --claim 134217729 --stream 134217729   # just over the default max

Before issue 8 the 2^63-1 header buffered everything (2 GB in 7.5 s).
"""

import argparse
import os
import socket
import struct
import sys
import threading
import time
from urllib.parse import urlparse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fuzz import HANDSHAKE, ROOT  # noqa: E402
from memory_broker import rss, startBrokerProcess, stopBrokerProcess  # noqa: E402

sys.path.insert(0, ROOT)
from otter_tx.amqp import spec  # noqa: E402
from otter_tx.door.protocol import frame, methodFrame  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claim", type=int, default=2 ** 63 - 1, help="body size the header announces")
    ap.add_argument("--stream", type=int, default=2 * 1024 ** 3, help="body bytes sent after it")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    proc, tmp, url = startBrokerProcess(a.python, "ottermq-oversize-")
    try:
        u = urlparse(url)
        sock = socket.create_connection((u.hostname, u.port), 10)
        sock.sendall(spec.PROTOCOL_HEADER + b"".join(HANDSHAKE) + methodFrame(1, spec.ChannelOpen("")))
        replies = bytearray()
        stop = threading.Event()

        def reader():
            while not stop.is_set():
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                replies.extend(data)

        threading.Thread(target=reader, daemon=True).start()
        time.sleep(0.3)
        peak = [rss(proc.pid)]
        before = peak[0]

        def sampler():
            while not stop.is_set():
                peak[0] = max(peak[0], rss(proc.pid))
                time.sleep(0.05)

        threading.Thread(target=sampler, daemon=True).start()
        sock.sendall(methodFrame(1, spec.BasicPublish(0, "", "nowhere", False, False))
                     + frame(2, 1, struct.pack("!HHQH", 60, 0, a.claim, 0)))
        chunk = frame(3, 1, b"z" * (131072 - 8))
        batch = chunk * 64
        sent = 0
        started = time.monotonic()
        while sent < a.stream:
            sock.sendall(batch)
            sent += len(batch)
        elapsed = time.monotonic() - started
        # acknowledge the channel.close, reopen the channel, declare a queue
        sock.sendall(methodFrame(1, spec.ChannelCloseOk()) + methodFrame(1, spec.ChannelOpen(""))
                     + methodFrame(1, spec.QueueDeclare(0, "", False, False, True, True)))
        deadline = time.monotonic() + 10
        while b"\x00\x32\x00\x0b" not in replies and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        after = rss(proc.pid)
        text = bytes(replies)
        i = text.find(b"\x00\x14\x00\x28")  # channel.close
        code = struct.unpack_from("!H", text, i + 4)[0] if i >= 0 else None
        print("header claims %d octets, %d bytes of body frames streamed in %.1f s (%.0f MB/s); "
              "channel.close %s; broker RSS before %.1f MiB, peak %.1f MiB, after %.1f MiB; "
              "connection usable afterwards: %s" % (
                  a.claim, sent, elapsed, sent / elapsed / 1e6, code, before / 1048576.0,
                  peak[0] / 1048576.0, after / 1048576.0, b"\x00\x32\x00\x0b" in text))
        sock.close()
    finally:
        stopBrokerProcess(proc, tmp)


if __name__ == "__main__":
    main()
