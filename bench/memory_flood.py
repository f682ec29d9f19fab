"""
The memory alarm under a flood of small messages (issue 8): peak RSS of a
real broker under ``--memory-high-watermark``, then the longest reactor stall
while the backlog is drained and publishers are unblocked.

    .venv-test/bin/python bench/memory_flood.py [--watermark 300MB] [--publishers 4] [--size 64]
    .venv-test/bin/python bench/memory_flood.py --root /work/main   # the same against another tree

1. The broker (``twistd -n ottermq`` of ``--otter-python``, sources from
   ``--root``) starts with ``--memory-high-watermark``, on a free port.
2. ``--publishers`` processes flood one queue (no consumer) with transient
   messages of ``--size`` bytes over plain sockets (1,000 publishes per
   ``sendall``) until they have made no progress for ``--stuck`` seconds (the
   broker stopped reading them: blocked), or ``--flood`` seconds, or RSS
   passes ``--cap``.  RSS (/proc/PID/statm) is sampled every 10 ms.
3. The queue is drained: by a consumer process with manual acks (prefetch
   2,000, ``multiple`` acks every 1,000; ``--drain ack``, the default), or by
   a purge (``--drain purge``).  The publishers are still there: once RSS
   falls below the clear level they are unblocked and flood again.
4. Throughout, a probe connection times ``basic.qos`` round trips every
   10 ms: the longest round trip is the longest reactor stall (ms) a client
   saw.  Reported: over the whole drain, and in the 5 s after the first
   unblock (publishers making progress again).

Prints one line per phase and, at the end, the broker's alarm log lines.
"""

import argparse
import multiprocessing
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from memory_broker import _readFrame, freePort, openRaw, rss, stopBroker, waitForPort  # noqa: E402

QUEUE = "flood"


def _shortstr(s):
    b = s.encode()
    return bytes([len(b)]) + b


def _frame(ftype, channel, payload):
    return struct.pack("!BHI", ftype, channel, len(payload)) + payload + b"\xce"


def publishBatch(size, count=1000):
    """``count`` transient publishes of ``size`` bytes to QUEUE on channel 1 (bytes)."""
    method = _frame(1, 1, struct.pack("!HHH", 60, 40, 0) + _shortstr("") + _shortstr(QUEUE) + b"\x00")
    header = _frame(2, 1, struct.pack("!HHQH", 60, 0, size, 0))
    body = _frame(3, 1, b"m" * size)
    return (method + header + body) * count


def publisher(port, size, counter):
    """Flood until killed; ``counter`` (a shared int) counts publishes sent."""
    sock = openRaw(port)
    batch = publishBatch(size)
    while True:
        sock.sendall(batch)
        with counter.get_lock():
            counter.value += 1000


def consumer(port, counter):
    """Consume QUEUE with manual acks (prefetch 2,000, multiple acks every 1,000)."""
    sock = openRaw(port)
    sock.sendall(_frame(1, 1, struct.pack("!HHIHB", 60, 10, 0, 2000, 0)))
    _readFrame(sock)
    sock.sendall(_frame(1, 1, struct.pack("!HHH", 60, 20, 0) + _shortstr(QUEUE) + _shortstr("drain")
                        + b"\x00" + b"\x00\x00\x00\x00"))
    buf = b""
    off = 0
    delivered = acked = 0
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return
        buf = buf[off:] + data
        off = 0
        n = len(buf)
        while n - off >= 7:
            ftype, _, length = struct.unpack_from("!BHI", buf, off)
            if n - off < length + 8:
                break
            if ftype == 1 and buf[off + 7:off + 11] == b"\x00\x3c\x00\x3c":  # basic.deliver
                delivered += 1
            off += length + 8
        if delivered - acked >= 1000:
            sock.sendall(_frame(1, 1, struct.pack("!HHQB", 60, 80, delivered, 1)))
            acked = delivered
            with counter.get_lock():
                counter.value = acked


class Probe(threading.Thread):
    """basic.qos round trips every 10 ms on its own connection; keeps (time, ms) of each."""

    def __init__(self, port):
        threading.Thread.__init__(self, daemon=True)
        self.sock = openRaw(port)
        self.samples = []
        self.running = True
        self.qos = _frame(1, 1, struct.pack("!HHIHB", 60, 10, 0, 0, 0))

    def run(self):
        while self.running:
            start = time.monotonic()
            self.sock.sendall(self.qos)
            _readFrame(self.sock)
            now = time.monotonic()
            self.samples.append((now, (now - start) * 1000.0))
            time.sleep(0.01)

    def longest(self, since=0.0, until=float("inf")):
        """The longest round trip (ms) that ended in [since, until]."""
        return max((ms for t, ms in self.samples if since <= t <= until), default=0.0)


class Sampler(threading.Thread):
    """RSS of ``pid`` every 10 ms; ``peak`` and the latest value."""

    def __init__(self, pid):
        threading.Thread.__init__(self, daemon=True)
        self.pid = pid
        self.peak = self.last = rss(pid)
        self.running = True

    def run(self):
        while self.running:
            try:
                self.last = rss(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, self.last)
            time.sleep(0.01)


def mib(n):
    return "%.0f MiB" % (n / 1048576.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--otter-python", default=sys.executable)
    ap.add_argument("--root", default=ROOT, help="source tree of the broker under test")
    ap.add_argument("--watermark", default="300MB")
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--flood", type=float, default=60.0, help="longest flood, seconds")
    ap.add_argument("--stuck", type=float, default=3.0, help="seconds without progress that end the flood")
    ap.add_argument("--cap", type=float, default=4096, help="MiB of RSS that end the flood")
    ap.add_argument("--drain", choices=("ack", "purge"), default="ack")
    ap.add_argument("--after", type=float, default=5.0, help="seconds measured after the first unblock")
    a = ap.parse_args()

    import pika

    twistd = os.path.join(os.path.dirname(os.path.abspath(a.otter_python)), "twistd")
    tmp = tempfile.mkdtemp(prefix="ottermq-flood-")
    port = freePort()
    log = os.path.join(tmp, "twistd.log")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(a.root))
    proc = subprocess.Popen(
        [twistd, "-n", "--pidfile=", "--logfile=" + log, "ottermq", "--amqp", "tcp:%d:interface=127.0.0.1" % port,
         "--management", "tcp:0:interface=127.0.0.1", "--prometheus", "none", "--stream", "none",
         "--data-dir", os.path.join(tmp, "data"),
         "--memory-high-watermark", a.watermark], env=env, cwd=os.path.abspath(a.root))
    workers = []
    try:
        waitForPort(port)
        conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:%d/" % port))
        ch = conn.channel()
        ch.queue_declare(QUEUE)
        sampler = Sampler(proc.pid)
        sampler.start()
        probe = Probe(port)
        probe.start()
        base = sampler.last
        print("broker from %s, --memory-high-watermark %s; %d publishers of %d B; RSS at start %s" % (
            a.root, a.watermark, a.publishers, a.size, mib(base)), flush=True)

        published = multiprocessing.Value("q", 0)
        workers = [multiprocessing.Process(target=publisher, args=(port, a.size, published), daemon=True)
                   for _ in range(a.publishers)]
        for w in workers:
            w.start()
        start = time.monotonic()
        last, lastChange = 0, start
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            if published.value != last:
                last, lastChange = published.value, now
            ended = ("publishers blocked" if now - lastChange >= a.stuck else
                     "--flood time up" if now - start >= a.flood else
                     "RSS over --cap" if sampler.last >= a.cap * 1048576 else None)
            if ended:
                break
        depth = ch.queue_declare(QUEUE, passive=True).method.message_count
        print("flood      ended (%s) after %.1f s: %d sent, %d queued; peak RSS %s (%.2fx the watermark), "
              "now %s; longest stall %.0f ms" % (
                  ended, lastChange - start, published.value, depth, mib(sampler.peak),
                  sampler.peak / float(_bytes(a.watermark)), mib(sampler.last), probe.longest()), flush=True)
        floodPeak = sampler.peak

        drainStart = time.monotonic()
        drained = multiprocessing.Value("q", 0)
        if a.drain == "purge":
            ch.queue_purge(QUEUE)
        else:
            w = multiprocessing.Process(target=consumer, args=(port, drained), daemon=True)
            w.start()
            workers.append(w)
        blocked = published.value
        unblockedAt = None
        deadline = drainStart + 300
        if ended != "publishers blocked":
            print("drain      (the publishers were never blocked: nothing to unblock)")
            deadline = 0
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if unblockedAt is None and published.value > blocked + 2000 * a.publishers:
                unblockedAt = time.monotonic()
            if unblockedAt is not None and time.monotonic() - unblockedAt >= a.after:
                break
        end = time.monotonic()
        if unblockedAt is None and deadline:
            print("drain      (%s) no unblock within %.0f s; RSS now %s; longest stall %.0f ms" % (
                a.drain, end - drainStart, mib(sampler.last), probe.longest(drainStart)))
        elif unblockedAt is not None:
            print("drain      (%s) unblocked after %.1f s; longest stall: %.0f ms during the drain, %.0f ms "
                  "from 1 s before to %.0f s after the unblock; peak RSS after it %s" % (
                      a.drain, unblockedAt - drainStart, probe.longest(drainStart, unblockedAt),
                      probe.longest(unblockedAt - 1, end), a.after, mib(sampler.peak)), flush=True)
        print("summary    peak RSS %s (flood) / %s (whole run) for a %s watermark" % (
            mib(floodPeak), mib(sampler.peak), a.watermark))
        probe.running = sampler.running = False
    finally:
        for w in workers:
            w.kill()
        stopBroker(proc)
        logs = sorted((name for name in os.listdir(tmp) if name.startswith("twistd.log")), reverse=True)
        for name in logs:
            with open(os.path.join(tmp, name)) as f:
                for line in f:
                    if "vm_memory_high_watermark" in line or "memory alarm" in line or "memory released" in line \
                            or "released to the system" in line:
                        print("broker log:", line.rstrip()[:200])
        shutil.rmtree(tmp, ignore_errors=True)


def _bytes(text):
    from otter_tx.service.tap import memoryHighWatermarkBytes

    return memoryHighWatermarkBytes(text)


if __name__ == "__main__":
    main()
