#!/usr/bin/env python3
"""
Reaping one queue of N messages with random TTLs, through the whole broker
core (``VHost.publish`` into a ``Queue``, its ``ExpiryIndex`` on a
``task.Clock``): one timer for the queue at every moment, every message
reaped exactly at its deadline, none early.

This was the unit test ``test_millionMessagesReapedOnTime`` (24 s of the unit
run); the unit suite keeps a 20,000-message version of the same check
(``otter_tx/test/unit/test_ttl_dlx.py``), and this script runs the million.

The clock is advanced straight to each next timer, so lateness is the
index's own error (expected 0 ms; the check fails at 0.001 ms late or
early, the float error of seconds-to-ms conversions is far below that), not a
polling step.  Prints the time to publish and to reap, the worst lateness,
and exits 1 if any check fails.

    .venv/bin/python bench/reaping_queue.py                # 1,000,000 messages, ~25 s
    .venv/bin/python bench/reaping_queue.py -n 100000 --seed 7
"""

import argparse
import random
import sys
import time

from twisted.internet.task import Clock

from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message


def run(n, seed, maxTtl):
    """
    Publish ``n`` messages with TTLs uniform in [1, ``maxTtl``] ms into one
    queue and reap them all; returns a dict of measurements and failures.
    """
    clock = Clock()
    clock.advance(1000)
    broker = Broker(clock)
    vhost = broker.vhosts["/"]
    q = vhost.declareQueue("q", None)
    # all in memory: reaping of paged segments is tested in test_paging
    q.ready.memoryBudget = 2 ** 62
    rnd = random.Random(seed)
    ex = vhost.exchanges[""]
    failures = []
    t0 = time.perf_counter()
    for _ in range(n):
        m = Message("", "q", b"\x00\x00", b"x")
        m.ttl = rnd.randint(1, maxTtl)
        vhost.publish(ex, m)
    published = time.perf_counter() - t0
    if q.readyCount != n:
        failures.append("queued %d, expected %d" % (q.readyCount, n))
    worst = [0.0]
    early = [0]
    reaped = [0]
    original = q.ready._expiry._onExpire

    def record(entries):
        now = clock.seconds() * 1000
        for e in entries:
            late = now - e.expiresAt
            if late < -0.001:
                early[0] += 1
            worst[0] = max(worst[0], late)
        reaped[0] += len(entries)
        original(entries)

    q.ready._expiry._onExpire = record
    t0 = time.perf_counter()
    maxTimers = 0
    while q.readyCount:
        calls = clock.getDelayedCalls()
        maxTimers = max(maxTimers, len(calls))
        if not calls:
            failures.append("no timer while %d messages wait" % (q.readyCount,))
            break
        clock.advance(calls[0].getTime() - clock.seconds())
    reap = time.perf_counter() - t0
    if maxTimers != 1:
        failures.append("%d timers at once, expected 1" % (maxTimers,))
    if reaped[0] != n:
        failures.append("reaped %d, expected %d" % (reaped[0], n))
    if early[0]:
        failures.append("%d reaped before their deadline" % (early[0],))
    if worst[0] >= 0.001:
        failures.append("worst lateness %.6f ms" % (worst[0],))
    return {"publish_s": published, "reap_s": reap, "worst_late_ms": worst[0], "reaped": reaped[0],
            "failures": failures}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=1000000, help="messages (default 1,000,000)")
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--max-ttl", type=int, default=60000, help="largest TTL in ms (default 60,000)")
    args = p.parse_args(argv)
    r = run(args.n, args.seed, args.max_ttl)
    print("%d messages: publish %.1f s, reap %.1f s, reaped %d, worst lateness %.4f ms"
          % (args.n, r["publish_s"], r["reap_s"], r["reaped"], r["worst_late_ms"]))
    for f in r["failures"]:
        print("FAILED: " + f)
    return 1 if r["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
