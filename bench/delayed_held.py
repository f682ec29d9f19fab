"""
Scheduled messages at scale (issue 11): N held messages (1,000,000 by
default) on one x-delayed-message exchange of an in-process broker, due
times spread uniformly over --spread seconds (10 minutes), each with its
own ``message_id`` and an ``x-delay-until`` header.

    .venv/bin/python bench/delayed_held.py [--messages N] [--spread S] [--setup S] [--run S] [--rate R]

Prints:

- memory per held message: the process RSS growth over holding them, after
  a full collection, divided by N (the message, its properties and the
  held set's entry and indexes);
- the time to list one page of 100 (``DelayedExchange.heldPage`` plus the
  ``json.dumps`` of the HTTP answer) at the first, middle and last page,
  and to cancel one by broker id and one by ``message_id`` (medians of
  repeated runs, ms);
- lateness on the real reactor (delivery into the bound queue minus due
  time, p50/p99/max ms) of a sample that fires during the run, while the N
  stay held: for --run seconds the reactor runs and a publisher adds --rate
  messages a second (default N / spread, the rate at which the N fire once
  they are due: 1,667/s) with an ``x-delay-until`` 1 to 10,000 ms ahead (a
  shortened spread, so the run stays under 3 minutes), then waits 10 s for
  the last ones.  The N are due from --setup seconds (300) after the start,
  so none fires during the run.

Everything runs in one process on the same code path as the server
(VHost.publish -> DelayedExchange -> HeldSet -> routing at fire time).
"""

import argparse
import gc
import json
import random
import statistics
import time
from array import array

from twisted.internet import reactor

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message

from memory import interpreter, rssBytes  # bench/memory.py (the script's directory is on sys.path)


def medianMs(f, repeat):
    """Median wall time of ``f()`` over ``repeat`` runs, in ms."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--spread", type=float, default=600.0, help="due times spread over this many seconds")
    ap.add_argument("--setup", type=float, default=300.0,
                    help="seconds from the start to the first due time of the N (longer than the whole run)")
    ap.add_argument("--run", type=float, default=30.0, help="seconds of publishing the lateness sample")
    ap.add_argument("--rate", type=float, default=None, help="sample messages per second (default N / spread)")
    ap.add_argument("--page-size", type=int, default=100)
    a = ap.parse_args()
    n = a.messages
    if hasattr(gc, "get_threshold"):
        g0, g1, _ = gc.get_threshold()
        gc.set_threshold(g0, g1, 1000000)  # as OtterService._tuneGC does
    broker = Broker(reactor)
    vh = broker.vhosts["/"]
    ex = vh.declareExchange("sched", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    q = vh.declareQueue("due", None)
    vh.bind(ex, q, "job", {})
    rnd = random.Random(11)
    start = time.time()
    base = (start + a.setup) * 1000.0
    due = array("d", bytes(8 * n))
    gc.collect()
    rss0 = rssBytes()
    t = time.perf_counter()
    for i in range(n):
        d = due[i] = int(base + rnd.random() * a.spread * 1000.0)
        props = {"headers": {"x-delay-until": d}, "message_id": "m%d" % i, "delivery_mode": 2}
        vh.publish(ex, Message("sched", "job", encodeProperties(props), b"%d" % i))
    publishS = time.perf_counter() - t
    gc.collect()
    rss1 = rssBytes()
    assert ex.held == n, ex.held
    size = a.page_size
    pages = -(-n // size)
    listing = {}
    walk = {}
    for label, page in (("first", 1), ("middle", pages // 2), ("last", pages)):
        listing[label] = medianMs(lambda: json.dumps(ex.heldPage(page, size)).encode(), 21)
        walk[label] = medianMs(lambda: ex._set.page((page - 1) * size, size), 21)
    ids = [i["id"] for i in ex.heldPage(pages // 3, size)["items"]]
    ids += [i["id"] for i in ex.heldPage(2 * pages // 3, size)["items"]]
    byId = iter(ids)
    cancelId = medianMs(lambda: ex.cancel(next(byId)), len(ids))
    mids = iter("m%d" % i for i in rnd.sample(range(n), 200))
    cancelled = []
    cancelMid = medianMs(lambda: cancelled.append(ex.cancelMessageId(next(mids))), 200)
    held = ex.held
    print("%s: %d held messages, due over %.0f s: publish %.1f s (%.1f us each); RSS +%.0f MiB = %.0f bytes "
          "per held message" % (interpreter(), n, a.spread, publishS, publishS / n * 1e6,
                                (rss1 - rss0) / 2.0 ** 20, (rss1 - rss0) / n))
    print("list a page of %d (heldPage + json.dumps): first %.3f ms, middle %.3f ms, last %.3f ms; finding "
          "the page alone (HeldSet.page, %d chunks): %.3f, %.3f, %.3f ms" % (
              size, listing["first"], listing["middle"], listing["last"], len(ex._set._chunks),
              walk["first"], walk["middle"], walk["last"]))
    print("cancel one: by id %.4f ms, by message_id %.4f ms (%d + %d cancelled, %d left)" % (
        cancelId, cancelMid, len(ids), sum(cancelled), held))

    if time.time() * 1000.0 >= base:
        print("warning: the N became due during the run (raise --setup)")
    late = []
    sampleDue = {}
    originalEnqueue = q.enqueue

    def arrived(message, now=None):
        late.append(time.time() * 1000.0 - sampleDue.pop(message.body))
        return originalEnqueue(message, now)

    q.enqueue = arrived
    rate = a.rate if a.rate is not None else n / a.spread
    runEnd = time.time() + a.run
    sent = [0]
    heldMax = [0]

    def publishSome():
        # a steady rate, as clients would, so the reactor keeps turning
        now = time.time()
        if now >= runEnd:
            reactor.callLater(10.0, reactor.stop)
            return
        target = int((a.run - (runEnd - now)) * rate)
        while sent[0] < target:
            body = b"s%d" % sent[0]
            d = sampleDue[body] = int(now * 1000.0) + rnd.randint(1, 10000)
            props = {"headers": {"x-delay-until": d}, "message_id": body.decode(), "delivery_mode": 2}
            vh.publish(ex, Message("sched", "job", encodeProperties(props), body))
            sent[0] += 1
        heldMax[0] = max(heldMax[0], ex.held)
        reactor.callLater(0.01, publishSome)

    reactor.callWhenRunning(publishSome)
    reactor.run()
    late.sort()
    k = len(late)
    if not k:
        print("no message fired")
        return
    print("lateness of %d sample messages (%.0f/s for %.0f s, due 1..10000 ms ahead) with %d to %d held: "
          "p50 %.2f ms, p99 %.2f ms, max %.2f ms, early %d, not fired %d" % (
              k, rate, a.run, held, heldMax[0], late[k // 2], late[int(k * 0.99)], late[-1],
              sum(1 for x in late if x < -0.01), len(sampleDue)))


if __name__ == "__main__":
    main()
