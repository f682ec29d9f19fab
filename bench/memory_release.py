"""
Is memory returned to the operating system after a purge, a queue delete
and closed connections?  Resident set size (RSS, from /proc/self/statm, the
current value, not the peak) of an in-process broker, measured before,
during and after, on whichever interpreter runs the script:

    .venv/bin/python bench/memory_release.py [--messages N] [--size B] [--connections C]
    .venv-pypy/bin/python bench/memory_release.py ...

Each phase fills (N messages of B bytes published into one queue, or C
connections opened with a channel each through the real protocol code on
in-memory transports) and empties (purge, delete, close), then reports RSS
at these points:

- ``full``: filled;
- ``emptied``: right after the purge, delete or close;
- ``idle``: after ``--idle`` seconds of doing nothing (default 2);
- ``released``: after :func:`otter_tx.resources.process_memory.releaseMemory` (what the
  broker's :class:`~otter_tx.resources.process_memory.MemoryReleaser` runs after a large drop:
  ``gc.collect()`` on PyPy, and on CPython after closed connections only;
  then glibc's ``malloc_trim(0)`` on both).

``--no-release`` skips the last step (to see what the runtime does alone).
"""

import argparse
import gc
import platform
import time

from twisted.internet.task import Clock

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message
from otter_tx.resources.process_memory import releaseMemory, rssBytes


def mib(n):
    return "%7.1f MiB" % (n / 1048576.0,)


def report(phase, point, base, note=""):
    rss = rssBytes()
    print("%-12s %-9s RSS %s  (%+8.1f MiB over start)%s" % (
        phase, point, mib(rss), (rss - base) / 1048576.0, note), flush=True)
    return rss


def afterwards(phase, base, a, collect=False):
    report(phase, "emptied", base)
    time.sleep(a.idle)
    report(phase, "idle", base, "  %.0f s later" % (a.idle,))
    if not a.no_release:
        t0 = time.perf_counter()
        releaseMemory(collect=collect)
        report(phase, "released", base, "  releaseMemory() took %.0f ms" % ((time.perf_counter() - t0) * 1000,))


def fill(vh, ex, name, props, a):
    vh.declareQueue(name, None)
    body = b"x" * a.size
    for _ in range(a.messages):
        # each publish gets its own body object, as one read from a socket would
        vh.publish(ex, Message("", name, props, bytes(body)))
    return vh.queues[name]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--idle", type=float, default=2.0)
    ap.add_argument("--no-release", action="store_true")
    a = ap.parse_args()
    print("%s %s, %d messages of %d B, %d connections" % (
        platform.python_implementation(), platform.python_version(), a.messages, a.size, a.connections))
    clock = Clock()
    broker = Broker(clock)
    vh = broker.vhosts["/"]
    ex = vh.exchanges[""]
    props = encodeProperties({})
    # warm up (PyPy's JIT, CPython's free lists) on a small round first
    warm = argparse.Namespace(**vars(a))
    warm.messages = min(a.messages, 50000)
    fill(vh, ex, "warm", props, warm).purge()
    vh.deleteQueue(vh.queues["warm"])
    gc.collect()
    releaseMemory()
    base = report("start", "", rssBytes())

    q = fill(vh, ex, "purged", props, a)
    report("purge", "full", base)
    q.purge()
    afterwards("purge", base, a)

    q = fill(vh, ex, "deleted", props, a)
    report("delete", "full", base)
    vh.deleteQueue(q)
    afterwards("delete", base, a)

    if a.connections:
        from twisted.internet.error import ConnectionDone
        from twisted.python.failure import Failure

        from otter_tx.amqp import spec
        from otter_tx.door.protocol import AMQPServerFactory
        from otter_tx.testing import FakeClient

        factory = AMQPServerFactory(broker, clock, heartbeat=0)
        clients = []
        for _ in range(a.connections):
            c = FakeClient(factory)
            c.openChannel(1)
            c.send(1, spec.QueueDeclare(0, "", False, False, True, True, False, {}))
            c.received()
            clients.append(c)
        report("connections", "full", base)
        for c in clients:
            c.protocol.connectionLost(Failure(ConnectionDone()))
        del clients, c
        afterwards("connections", base, a, collect=True)


if __name__ == "__main__":
    main()
