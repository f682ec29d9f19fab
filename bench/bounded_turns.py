"""
The longest reactor turn of two operations on a deep queue, measured at the
unit level (a ``task.Clock`` broker, no sockets; issue 8 "no single
operation holds the reactor for more than about 50 ms"):

* requeue: N messages are taken unacked (``basicGet``) and requeued in one
  call, as a channel close, ``basic.recover`` or ``basic.nack multiple
  requeue`` does; then the clock is stepped a turn at a time until the queue
  is whole again.
* limit: N messages are queued, then a policy lowers ``max-length`` to 10
  (with a dead-letter exchange, so every dropped message is republished to
  a second queue, and without one).
* close: the same through a channel's unacked records (``tag -> (queue,
  entry, consumer, tag)``) handed to ``RequeueFeeder`` as a channel close
  does (the old code grouped them by queue in one pass first).
* small: requeue of 5 entries repeated, the hot path (us per call).

    .venv-test/bin/python bench/bounded_turns.py --messages 1000000
    .venv-test/bin/python bench/bounded_turns.py --otter-root /tmp/before   # other code

Prints, per case, the time of the call itself, the p99 and longest turn
after it, the number of turns and the total.  Paging uses a temporary
directory and its writer thread; the default memory budget (8 MB) applies.
The full (generation 2) collection is tuned as ``OtterService`` does it
(threshold 1,000,000, a timed ``gc.collect`` instead); ``--default-gc``
leaves CPython's defaults, under which a full collection of the millions of
live objects (~100 ms) lands in some turns whatever they do.
"""

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time


def _root():
    """``--otter-root DIR`` (before the imports): the otter_tx checkout to measure."""
    if "--otter-root" in sys.argv:
        return sys.argv[sys.argv.index("--otter-root") + 1]
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


sys.path.insert(0, _root())

from twisted.internet.task import Clock  # noqa: E402

from otter_tx.broker.broker import Broker  # noqa: E402
from otter_tx.amqp.codec import encodeProperties  # noqa: E402
from otter_tx.broker.message import Message  # noqa: E402


RAW = encodeProperties({})


def runTurns(clock):
    """Run due calls one turn at a time; returns the list of turn times (s)."""
    times = []
    while True:
        due = [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]
        if not due:
            return times
        t0 = time.perf_counter()
        for c in due:
            if c.active():
                clock.calls.remove(c)
                c.called = 1
                c.func(*c.args, **c.kw)
        times.append(time.perf_counter() - t0)


def setup(n, directory):
    clock = Clock()
    clock.advance(1000)
    broker = Broker(clock, pagingDirectory=directory)
    vhost = broker.vhosts["/"]
    return clock, broker, vhost


def fill(vhost, name, n, **args):
    q = vhost.declareQueue(name, None, arguments=args)
    ex = vhost.exchanges[""]
    for i in range(n):
        vhost.publish(ex, Message("", name, RAW, b"%016d" % (i,)))
    return q


def show(label, call, after):
    s = sorted(after) or [0.0]
    print("%-34s call %8.1f ms  later turns: p99 %6.1f ms, longest %7.1f ms, %5d turns  total %8.1f ms"
          % (label, call * 1e3, s[int(len(s) * 0.99)] * 1e3, s[-1] * 1e3, len(after),
             (call + sum(after)) * 1e3))


def benchRequeue(n, directory):
    clock, broker, vhost = setup(n, directory)
    q = fill(vhost, "q", n)
    taken = [q.basicGet(False) for _ in range(n)]
    runTurns(clock)
    t0 = time.perf_counter()
    q.requeue(taken)
    call = time.perf_counter() - t0
    show("requeue %d unacked" % (n,), call, runTurns(clock))
    assert q.readyCount == n and q.unackedCount == 0, (q.readyCount, q.unackedCount)


def benchClose(n, directory):
    from collections import OrderedDict

    clock, broker, vhost = setup(n, directory)
    q = fill(vhost, "q", n)
    unacked = OrderedDict()
    for tag in range(1, n + 1):
        unacked[tag] = (q, q.basicGet(False), None, tag)
    runTurns(clock)
    try:
        from otter_tx.broker.session import RequeueFeeder
    except ImportError:
        RequeueFeeder = None
    t0 = time.perf_counter()
    if RequeueFeeder is None:  # before: group in one pass, then requeue
        byQueue = {}
        for queue, entry, consumer, _ in unacked.values():
            byQueue.setdefault(queue, []).append(entry)
        unacked = None
        for queue, entries in byQueue.items():
            queue.requeue(entries, dispatch=False)
    else:
        RequeueFeeder(unacked).start()
        unacked = None
    call = time.perf_counter() - t0
    show("channel close, %d unacked" % (n,), call, runTurns(clock))
    assert q.readyCount == n and q.unackedCount == 0, (q.readyCount, q.unackedCount)


def benchLimit(n, directory, dlx):
    clock, broker, vhost = setup(n, directory)
    args = {}
    if dlx:
        vhost.declareQueue("dlq", None, arguments={})
        args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    q = fill(vhost, "q", n, **args)
    runTurns(clock)
    t0 = time.perf_counter()
    broker.setPolicy("/", "short", "^q$", {"max-length": 10})
    call = time.perf_counter() - t0
    assert q.readyCount == 10, q.readyCount
    show("max-length %d -> 10%s" % (n, " (DLX)" if dlx else ""), call, runTurns(clock))
    if dlx:
        assert vhost.queues["dlq"].readyCount == n - 10


def benchSmall(directory, rounds=20000):
    clock, broker, vhost = setup(0, directory)
    q = fill(vhost, "q", 1000)
    t0 = time.perf_counter()
    for _ in range(rounds):
        taken = [q.basicGet(False) for _ in range(5)]
        q.requeue(taken)
        runTurns(clock)
    dt = time.perf_counter() - t0
    print("%-34s %.2f us per round (5 basic.get + requeue of 5)" % ("small requeue", dt / rounds * 1e6))


CASES = ("requeue", "close", "limit", "limitdlx", "small")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1000000)
    p.add_argument("--otter-root", help="the otter_tx checkout to import (default: this one)")
    p.add_argument("--default-gc", action="store_true", help="leave CPython's GC thresholds alone")
    p.add_argument("--case", action="append", choices=CASES, help="run only these (repeatable)")
    a = p.parse_args()
    if not a.default_gc:
        g0, g1, _ = gc.get_threshold()
        gc.set_threshold(g0, g1, 1000000)
    for case in a.case or CASES:
        d = tempfile.mkdtemp(prefix="otter_tx-bench-")
        try:
            if case == "requeue":
                benchRequeue(a.messages, d)
            elif case == "close":
                benchClose(a.messages, d)
            elif case == "limit":
                benchLimit(a.messages, d, False)
            elif case == "limitdlx":
                benchLimit(a.messages, d, True)
            else:
                benchSmall(d)
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
