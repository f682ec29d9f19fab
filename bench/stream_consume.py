"""
Stream protocol consumes and what they cost the broker: publish one stream once, then consume
it ``--consumes`` times (after one warm-up consume: PyPy compiles); for each, the rate and the
broker's CPU (``/proc/PID/stat``, user + system) over the wall time, and the broker's CPU
seconds a GB over all the consumes. CPU a GB says more than a rate on a shared machine: a
broker that waits for its client or for the CPU does not count it.

    .venv-test/bin/python bench/stream_consume.py                          # otter_tx on this python
    .venv-test/bin/python bench/stream_consume.py --python /path/to/pypy-venv/bin/python
    # the RabbitMQ peer: the pid of the beam.smp listening on 5562 (ss -ltnp | grep 5562)
    .venv-test/bin/python bench/stream_consume.py --port 5562 --broker-pid PID

The client is ``bench/stream_protocol.py``'s (its publisher and consumer; credit 10, one back a
chunk). Run it under the shared benchmark lock, as the others.
"""

import argparse
import multiprocessing
import os
import resource
import shutil
import statistics
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import stream_protocol as sp  # noqa: E402
from otter_tx.stream import wire  # noqa: E402


class _Running:
    """A broker this script did not start (``--broker-pid``)."""

    def __init__(self, pid):
        self.pid = pid

    def terminate(self):
        pass

    def wait(self, timeout):
        pass


def cpuSeconds(pid):
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", help="the interpreter that runs otter_tx (default: this one)")
    p.add_argument("--port", type=int, default=5599, help="the stream port (otter_tx is started on it)")
    p.add_argument("--broker-pid", type=int, help="measure the broker already listening on --port")
    p.add_argument("--messages", type=int, default=400000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--consumes", type=int, default=10)
    p.add_argument("--each", action="store_true", help="print each consume's rate and CPU / wall time")
    a = p.parse_args()
    if a.broker_pid:
        proc, data = _Running(a.broker_pid), None
    else:
        proc, data = sp.startOtter(a.port, python=a.python)
    try:
        stream = "consume-%d" % os.getpid()
        admin = sp.Conn(a.port)
        admin.handshake()
        assert admin.call(wire.CREATE_STREAM, wire.encodeString(stream) + struct.pack(">I", 0)) == wire.OK
        ctx = multiprocessing.get_context("fork")
        ready, go, result = ctx.Event(), ctx.Event(), ctx.Queue()
        pub = ctx.Process(target=sp.publisher,
                          args=(a.port, stream, a.messages, a.size, 100, 20000, 0, ready, go, result))
        pub.start()
        ready.wait(60)
        t0 = time.perf_counter()
        go.set()
        result.get(timeout=600)
        print("publish %.0f msg/s" % (a.messages / (time.perf_counter() - t0)))
        pub.join(60)
        sp.consume(a.port, stream, a.messages)
        rates, broker, client = [], [], []
        for _ in range(a.consumes):
            b0 = cpuSeconds(proc.pid)
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            elapsed = sp.consume(a.port, stream, a.messages)
            b1 = cpuSeconds(proc.pid)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            rates.append(a.messages / elapsed)
            broker.append(b1 - b0)
            client.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            if a.each:
                print("  %.2fM msg/s, broker CPU / wall %.2f, client %.2f" % (
                    rates[-1] / 1e6, broker[-1] / elapsed, client[-1] / elapsed))
        admin.call(wire.DELETE_STREAM, wire.encodeString(stream))
        gb = a.consumes * a.messages * a.size / 1e9
        print("consume median %.0f msg/s (%s)" % (statistics.median(rates),
                                                  " ".join("%.2fM" % (r / 1e6) for r in rates)))
        walls = [a.messages / r for r in rates]
        print("broker CPU / wall median %.2f, client %.2f" % (
            statistics.median(b / w for b, w in zip(broker, walls)),
            statistics.median(c / w for c, w in zip(client, walls))))
        print("broker CPU s a GB: %.3f (all consumes)" % (sum(broker) / gb))
    finally:
        proc.terminate()
        proc.wait(10)
        if data:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
