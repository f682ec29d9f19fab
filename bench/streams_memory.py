"""
Memory of a large stream, and starting a reader near its end (the stream
core alone, in process, no AMQP): append N 12-byte messages to one stream
(otter_tx.broker.stream, writes inline, one group commit per B messages),
then report the process RSS, the time to open a reader at offset N-10 and
read its 10 messages, and the time and RSS to reopen the stream (what a
restart does).

    .venv-test/bin/python bench/streams_memory.py [--messages N] [--batch B] [--dir D]
"""

import argparse
import gc
import os
import shutil
import tempfile
import time

from twisted.internet.task import Clock

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.message import Message
from otter_tx.broker.stream import StreamRegistry


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    root = a.dir or tempfile.mkdtemp(prefix="otter-streams-mem-")
    clock = Clock()
    clock.advance(1_700_000_000)
    gc.collect()
    base = rss()
    reg = StreamRegistry(root)
    log = reg.open(clock, "/", "big")
    m = Message("", "big", encodeProperties({}), b"x" * 12)
    t0 = time.perf_counter()
    done = 0
    while done < a.messages:
        n = min(a.batch, a.messages - done)
        for _ in range(n):
            log.append(m, wantDeferred=False)
        clock.advance(0.001)
        done += n
    appendS = time.perf_counter() - t0
    gc.collect()
    full = rss()
    t = time.perf_counter()
    got = log.reader(a.messages - 10).read(10)
    startMs = (time.perf_counter() - t) * 1000
    assert [o for o, _, _ in got] == list(range(a.messages - 10, a.messages)), got[:2]
    diskBytes = log.bytes
    segments = len(log.log.segments)
    reg.close()
    gc.collect()
    t = time.perf_counter()
    reg2 = StreamRegistry(root)
    log2 = reg2.open(clock, "/", "big")
    reopenS = time.perf_counter() - t
    gc.collect()
    reopened = rss()
    t = time.perf_counter()
    got = log2.reader(a.messages - 10).read(10)
    start2Ms = (time.perf_counter() - t) * 1000
    assert len(got) == 10
    reg2.close()
    if a.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    print("messages=%d (12 B) in %d segments, %.0f MiB on disk; appends %.1f s (%.0f msg/s, writes inline)"
          % (a.messages, segments, diskBytes / 2 ** 20, appendS, a.messages / appendS))
    print("RSS: %.1f MiB before, %.1f MiB with the stream (+%.1f MiB, %.2f B/message)"
          % (base / 2 ** 20, full / 2 ** 20, (full - base) / 2 ** 20, (full - base) / a.messages))
    print("reader at N-10: %.2f ms to its 10 messages" % (startMs,))
    print("reopen: %.1f s, RSS then %.1f MiB; reader at N-10 after reopen: %.2f ms"
          % (reopenS, reopened / 2 ** 20, start2Ms))
    print("pid %d, python %s" % (os.getpid(), os.sys.version.split()[0]))


if __name__ == "__main__":
    main()
