"""
Memory per queued message: publish N messages (default 1,000,000) into one
queue of an in-process broker and report the bytes of Python heap per
message (tracemalloc) and the process RSS growth.

    .venv/bin/python bench/memory.py [--messages N] [--size B] [--ttl] [--persistent]

--ttl gives every message a random expiration (so the expiry index is
included); --persistent makes the queue durable and the messages persistent
with a MemoryStore journal attached (the store's own copy is not counted
apart: it shares the body bytes).
"""

import argparse
import random
import resource
import time
import tracemalloc

from twisted.internet.task import Clock

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message


def rssKiB():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--ttl", action="store_true")
    ap.add_argument("--persistent", action="store_true")
    a = ap.parse_args()
    clock = Clock()
    broker = Broker(clock)
    vh = broker.vhosts["/"]
    q = vh.declareQueue("mem", None, durable=a.persistent)
    ex = vh.exchanges[""]
    props = encodeProperties({"delivery_mode": 2} if a.persistent else {})
    body = b"x" * a.size
    rnd = random.Random(1)
    rss0 = rssKiB()
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
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    rss1 = rssKiB()
    print(
        "messages=%d size=%d ttl=%s persistent=%s: %.0f bytes/message (tracemalloc), "
        "RSS +%.0f MiB (%.0f bytes/message incl. tracemalloc overhead), %.1f s to publish"
        % (a.messages, a.size, a.ttl, a.persistent, used / a.messages, (rss1 - rss0) / 1024.0,
           (rss1 - rss0) * 1024.0 / a.messages, dt)
    )
    assert q.messageCount == a.messages


if __name__ == "__main__":
    main()
