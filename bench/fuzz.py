"""
Fuzz a real otter_tx broker process over many connections (issue 8): at
least 100,000 frames of mutated valid sessions, payload-mutated sessions,
mutated handshakes and random frames, from deterministic seeds, while a
canary client (pika, confirms) keeps publishing and consuming.

Pass when: no connection.close with 541 INTERNAL_ERROR was seen, the
broker's log has no traceback and no ``INTERNAL_ERROR``, the canary never
failed, and the broker still accepts a fresh connection at the end.

Usage (from the repository root)::

    .venv-test/bin/python bench/fuzz.py                       # 4,000 connections
    .venv-test/bin/python bench/fuzz.py --connections 500 --seed 7 --workers 4
    .venv-test/bin/python bench/fuzz.py --url amqp://guest:guest@127.0.0.1:5672/  # a broker already running

It prints one summary line (frames, connections, 541 count, other close
codes, tracebacks in the log, canary round trips and failures) and exits 1
on failure.  The generators come from ``otter_tx.test.unit.test_fuzz``.
"""

import argparse
import collections
import os
import random
import socket
import sys
import threading
import time
from urllib.parse import urlparse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from otter_tx.amqp import spec  # noqa: E402
from otter_tx.door.protocol import methodFrame  # noqa: E402
from otter_tx.test.unit.test_fuzz import closeCodes, mutate, mutateFrames, randomFrames, validSession  # noqa: E402

from memory_broker import startBrokerProcess, stopBrokerProcess  # noqa: E402


HANDSHAKE = [
    methodFrame(0, spec.ConnectionStartOk({"product": "fuzz"}, "PLAIN", b"\x00guest\x00guest", "en_US")),
    methodFrame(0, spec.ConnectionTuneOk(2047, 131072, 0)),
    methodFrame(0, spec.ConnectionOpen("/", "", False)),
]


def readFor(sock, seconds):
    """Everything the broker sends within ``seconds`` or until it closes: bytes."""
    out = bytearray()
    answered = False
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), False
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            return bytes(out), False
        except OSError:
            return bytes(out), True
        if not data:
            return bytes(out), True
        out += data
        if b"\x00\x0a\x00\x33" in out:  # close-ok: the session is over
            return bytes(out), True
        if not answered and b"\x00\x0a\x00\x32" in out:
            # the broker closed the connection: acknowledge, it then drops the socket
            answered = True
            try:
                sock.sendall(methodFrame(0, spec.ConnectionCloseOk()))
            except OSError:
                return bytes(out), True


def oneConnection(host, port, rnd, stats):
    """Run one fuzzed session; add to ``stats`` (a Counter)."""
    kind = rnd.random()
    sock = socket.create_connection((host, port), timeout=10)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(spec.PROTOCOL_HEADER)
        session = validSession()
        if kind < 0.1:
            # the handshake itself mutated
            data = mutate(rnd, HANDSHAKE + session[:6])
            frames = len(HANDSHAKE) + 6
        else:
            sock.sendall(b"".join(HANDSHAKE))
            if kind < 0.45:
                data, frames = mutateFrames(rnd, session)
            elif kind < 0.75:
                data = mutate(rnd, session)
                frames = len(session)
            else:
                n = rnd.randint(5, 60)
                data = session[0] + randomFrames(rnd, n)
                frames = n + 1
        try:
            for i in range(0, len(data), 4096):
                sock.sendall(data[i : i + 4096])
            # whatever survived ends with connection.close
            sock.sendall(methodFrame(0, spec.ConnectionClose(200, "", 0, 0)))
        except OSError:
            pass
        reply, _ = readFor(sock, 2.0)
        codes = closeCodes(reply)
        stats["frames"] += frames + len(HANDSHAKE)
        stats["connections"] += 1
        for c in codes:
            stats["code %d" % c] += 1
    finally:
        sock.close()


def canary(url, stop, stats):
    """Publish with confirms and get the message back, in a loop, until ``stop`` is set."""
    import pika

    params = pika.URLParameters(url)
    params.socket_timeout = 10
    params.blocked_connection_timeout = 10
    try:
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.confirm_delivery()
        q = ch.queue_declare("", exclusive=True).method.queue
        n = 0
        while not stop.is_set():
            body = b"canary-%d" % n
            ch.basic_publish("", q, body)
            deadline = time.monotonic() + 5
            while True:
                method, _, got = ch.basic_get(q, auto_ack=True)
                if method is not None:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("canary message %d not delivered within 5 s" % n)
                conn.process_data_events(0.01)
            if got != body:
                raise RuntimeError("canary got %r, expected %r" % (got, body))
            n += 1
            stats["canary round trips"] += 1
            conn.process_data_events(0.005)
        conn.close()
    except Exception as e:  # reported in the summary
        stats["canary failures"] += 1
        stats["canary error"] = str(e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=8, help="fuzzing connections at a time")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--url", help="fuzz this running broker instead of starting one (its log is not checked)")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose venv runs twistd")
    a = ap.parse_args()

    proc = tmp = None
    if a.url:
        url = a.url
    else:
        proc, tmp, url = startBrokerProcess(a.python, "ottermq-fuzz-")
    u = urlparse(url)
    host, port = u.hostname, u.port or 5672
    stats = collections.Counter()
    ok = False
    started = time.monotonic()
    try:
        stop = threading.Event()
        canaryThread = threading.Thread(target=canary, args=(url, stop, stats), daemon=True)
        canaryThread.start()
        lock = threading.Lock()
        nextIndex = [0]

        def worker():
            local = collections.Counter()
            while True:
                with lock:
                    i = nextIndex[0]
                    nextIndex[0] += 1
                if i >= a.connections:
                    break
                try:
                    oneConnection(host, port, random.Random(a.seed * 1000003 + i), local)
                except OSError as e:
                    local["socket errors"] += 1
                    local["socket error"] = str(e)
            with lock:
                stats.update(local)

        workers = [threading.Thread(target=worker) for _ in range(a.workers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        canaryThread.join(30)
        fresh = True
        try:
            s = socket.create_connection((host, port), 5)
            s.sendall(spec.PROTOCOL_HEADER)
            fresh = s.recv(7)[:1] == b"\x01"
            s.close()
        except OSError:
            fresh = False
        tracebacks = internal = 0
        if tmp is not None:
            for name in os.listdir(tmp):
                if name.startswith("twistd.log"):
                    with open(os.path.join(tmp, name), errors="replace") as f:
                        for line in f:
                            tracebacks += "Traceback" in line
                            internal += "INTERNAL_ERROR" in line or "internal error" in line
        elapsed = time.monotonic() - started
        others = ", ".join("%s: %d" % (k, v) for k, v in sorted(stats.items())
                           if k.startswith("code ") and k != "code 541")
        print("fuzz seed %d: %d frames over %d connections in %.0f s; 541 closes: %d; log tracebacks: %s; "
              "log internal errors: %s; canary round trips: %d, failures: %d%s; fresh connection: %s; "
              "socket errors: %d" % (
                  a.seed, stats["frames"], stats["connections"], elapsed, stats["code 541"],
                  tracebacks if tmp else "n/a", internal if tmp else "n/a",
                  stats["canary round trips"], stats["canary failures"],
                  " (%s)" % stats["canary error"] if stats["canary failures"] else "",
                  "ok" if fresh else "FAILED", stats["socket errors"]))
        print("close codes seen:", others)
        ok = (stats["code 541"] == 0 and not tracebacks and not internal and not stats["canary failures"]
              and stats["canary round trips"] > 0 and fresh)
    finally:
        if proc is not None:
            stopBrokerProcess(proc, tmp, keep=not ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
