"""
Memory per queued message: publish N messages (default 1,000,000) into one
queue of an in-process broker and report the bytes of Python heap per
message (tracemalloc, CPython only) and the process RSS growth.

    .venv/bin/python bench/memory.py [--messages N] [--size B] [--ttl] [--persistent]
                                     [--no-tracemalloc]
    pypy-venv/bin/python bench/memory.py ...     (PYTHONPATH=. when otter_tx is not installed)

--ttl gives every message a random expiration (so the expiry index is
included); --persistent makes the queue durable and the messages persistent
with a MemoryStore journal attached (the store's own copy is not counted
apart: it shares the body bytes).

RSS is the resident set (``VmRSS``) after a full collection, before and
after publishing, so it is comparable across interpreters.  tracemalloc's
own bookkeeping inflates RSS, so on CPython the RSS figure is honest only
with --no-tracemalloc; PyPy has no tracemalloc and reports RSS only (and
``gc.get_stats()``'s GC-managed memory).
"""

import argparse
import gc
import platform
import random
import sys
import time

from twisted.internet.task import Clock

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message

PYPY = platform.python_implementation() == "PyPy"


def rssBytes():
    """Current resident set size of this process in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def collect():
    gc.collect()
    gc.collect()


def interpreter():
    v = getattr(sys, "pypy_version_info", None)
    return "%s %s%s" % (platform.python_implementation(), platform.python_version(),
                        " (%d.%d.%d)" % v[:3] if v else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--ttl", action="store_true")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--no-tracemalloc", action="store_true",
                    help="RSS only (always so on PyPy, which has no tracemalloc)")
    a = ap.parse_args()
    trace = not a.no_tracemalloc and not PYPY
    clock = Clock()
    broker = Broker(clock)
    vh = broker.vhosts["/"]
    if a.persistent:
        from otter_tx.broker.durability import Journal
        from otter_tx.store.memory import MemoryStore

        store = MemoryStore()
        journal = Journal(broker, store)
        journal.recover(store.open().result)
        broker.journal = journal
        broker.listeners.append(journal.entityChanged)
    q = vh.declareQueue("mem", None, durable=a.persistent)
    ex = vh.exchanges[""]
    props = encodeProperties({"delivery_mode": 2} if a.persistent else {})
    body = b"x" * a.size
    rnd = random.Random(1)
    collect()
    rss0 = rssBytes()
    if trace:
        import tracemalloc

        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    for _ in range(a.messages):
        # each publish gets its own body object, as one read from a socket would
        m = Message("", "mem", props, bytes(body))
        if a.ttl:
            m.ttl = rnd.randint(60000, 3600000)
        vh.publish(ex, m)
    dt = time.perf_counter() - t0
    heap = None
    if trace:
        heap = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
    collect()
    rss1 = rssBytes()
    n = a.messages
    parts = ["%s: messages=%d size=%d ttl=%s persistent=%s:" % (
        interpreter(), n, a.size, a.ttl, a.persistent)]
    if heap is not None:
        parts.append("%.0f bytes/message (tracemalloc)," % (heap / n,))
    parts.append("RSS +%.0f MiB = %.0f bytes/message%s, %.1f s to publish" % (
        (rss1 - rss0) / 2.0 ** 20, (rss1 - rss0) / n,
        " (incl. tracemalloc overhead)" if trace else "", dt))
    if PYPY:
        stats = gc.get_stats()
        parts.append("(PyPy GC memory in use %s)" % (stats.total_gc_memory,))
    print(" ".join(parts))
    assert q.readyCount == n


if __name__ == "__main__":
    main()
