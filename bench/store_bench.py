#!/usr/bin/env python3
"""
Throughput of the durable store (:class:`otter_tx.store.sqlite.SQLiteStore`)
on its own, without AMQP: how many persistent messages per second it can
make durable, and how many fsyncs that costs.

Workload (like a publisher with confirms): N messages (default 100,000),
each one ``addMessage`` + ``enqueue`` into one durable queue, a ``sync()``
after every ``--sync-every`` messages (default 100, one confirm per sync),
and at most ``--window`` messages not yet confirmed (default 100: the
producer waits for the sync before publishing more, like a confirm window
of 100).  ``--consume LAG`` adds a consumer that acks (``dequeue``) each
message LAG messages after it was published, which is where coalescing
(an enqueue and dequeue in the same pending batch cancel out) pays;
``--no-coalesce`` turns it off for comparison.

Printed per run: messages/s, commits/s (each commit is one fsync of the
WAL; WAL checkpoints into the main file, about one per 1000 pages written,
add a few fsyncs that are not counted), messages per commit, sync latency
(p50/p99 ms, from ``sync()`` to its Deferred firing on the reactor), and
changes cancelled by coalescing.  ``--fsync-baseline`` first measures raw
``write`` + ``fsync`` of 100 bytes on the same filesystem, the floor for
one commit.

    .venv/bin/python bench/store_bench.py                      # the default run
    .venv/bin/python bench/store_bench.py --window 1000        # 10 syncs in flight
    .venv/bin/python bench/store_bench.py --consume 50         # with an acking consumer
    .venv/bin/python bench/store_bench.py --all                # the table in docs/storage.md
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from twisted.internet import defer, task  # noqa: E402

from otter_tx.store.sqlite import SQLiteStore  # noqa: E402


def fsyncBaseline(directory, count=300):
    """Raw ``write`` + ``fsync`` calls per second in ``directory``."""
    path = os.path.join(directory, "fsync-baseline")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(count):
            os.write(fd, b"x" * 100)
            os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.remove(path)
    return count / elapsed


async def runOnce(reactor, directory, n, syncEvery, window, lag, bodySize, coalesce):
    """One run on a fresh store; returns a dict of results."""
    dataDir = tempfile.mkdtemp(prefix="store-bench-", dir=directory)
    try:
        store = SQLiteStore(dataDir, reactor, coalesce=coalesce)
        await store.open()
        queue = "/\x00bench"
        store.putEntity("queue", queue, {"durable": True, "arguments": {}})
        await store.sync()
        commitsBefore = store.stats["commits"]
        body = b"b" * bodySize
        props = b"\x10\x00\x02"  # flags: delivery-mode; delivery-mode 2
        latencies = []
        pending = []  # Deferreds of syncs not yet fired, oldest first
        confirmed = [0]

        def onSync(_, upTo, issuedAt):
            latencies.append(time.perf_counter() - issuedAt)
            confirmed[0] = max(confirmed[0], upTo)

        start = time.perf_counter()
        i = 0
        while i < n:
            while i < n and i - confirmed[0] < window:
                store.addMessage(i, "", "bench", props, body)
                store.enqueue(queue, i, i, 1.7e12, None, False)
                if lag and i >= lag:
                    store.dequeue(queue, i - lag)
                i += 1
                if i % syncEvery == 0 or i == n:
                    d = store.sync()
                    d.addCallback(onSync, i, time.perf_counter())
                    pending.append(d)
            while pending and (i == n or i - confirmed[0] >= window):
                await pending.pop(0)
        elapsed = time.perf_counter() - start
        commits = store.stats["commits"] - commitsBefore
        cancelled = store.stats["cancelled"]
        await store.close()
        size = sum(
            os.path.getsize(os.path.join(dataDir, name)) for name in os.listdir(dataDir)
        )
    finally:
        shutil.rmtree(dataDir, ignore_errors=True)
    latencies.sort()
    return {
        "msgs": n,
        "seconds": elapsed,
        "msgPerSec": n / elapsed,
        "commitsPerSec": commits / elapsed,
        "msgPerCommit": n / max(commits, 1),
        "p50ms": latencies[len(latencies) // 2] * 1000,
        "p99ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "cancelled": cancelled,
        "fileBytes": size,
    }


def describe(args, result, label):
    return (
        f"{label:<42} {result['msgPerSec']:>9,.0f} msg/s  "
        f"{result['commitsPerSec']:>7,.0f} commits(fsync)/s  "
        f"{result['msgPerCommit']:>6.1f} msg/commit  "
        f"sync p50 {result['p50ms']:.2f} ms p99 {result['p99ms']:.2f} ms  "
        f"cancelled {result['cancelled']:,}  file {result['fileBytes'] / 1e6:.1f} MB"
    )


async def main(reactor, args):
    directory = args.dir or tempfile.gettempdir()
    if args.fsync_baseline or args.all:
        rate = fsyncBaseline(directory)
        print(f"raw write+fsync of 100 bytes in {directory}: {rate:,.0f}/s")
    if args.all:
        runs = [
            ("window 100, sync/100", dict(window=100, lag=0, coalesce=True)),
            ("window 1000, sync/100", dict(window=1000, lag=0, coalesce=True)),
            ("window 100, sync/100, consumer lag 50", dict(window=100, lag=50, coalesce=True)),
            ("  same, --no-coalesce", dict(window=100, lag=50, coalesce=False)),
            ("window 1000, sync/100, consumer lag 500", dict(window=1000, lag=500, coalesce=True)),
            ("  same, --no-coalesce", dict(window=1000, lag=500, coalesce=False)),
        ]
    else:
        runs = [
            (
                f"window {args.window}, sync/{args.sync_every}"
                + (f", consumer lag {args.consume}" if args.consume else "")
                + ("" if args.coalesce else ", no coalescing"),
                dict(window=args.window, lag=args.consume, coalesce=args.coalesce),
            )
        ]
    print(
        f"N={args.n:,} messages, body {args.body} bytes, sync every {args.sync_every}, "
        f"python {sys.version.split()[0]}"
    )
    for label, kw in runs:
        results = []
        for _ in range(args.rounds):
            results.append(
                await runOnce(reactor, directory, args.n, args.sync_every,
                              bodySize=args.body, **kw)
            )
        best = max(results, key=lambda r: r["msgPerSec"])
        print(describe(args, best, label), flush=True)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=100_000, help="messages per run")
    p.add_argument("--sync-every", type=int, default=100)
    p.add_argument("--window", type=int, default=100, help="max unconfirmed messages")
    p.add_argument("--consume", type=int, default=0, metavar="LAG",
                   help="dequeue each message LAG messages after publishing it")
    p.add_argument("--no-coalesce", dest="coalesce", action="store_false")
    p.add_argument("--body", type=int, default=100, help="body size in bytes")
    p.add_argument("--rounds", type=int, default=1, help="runs per setting; best is shown")
    p.add_argument("--dir", help="where the temporary data dirs go (default: system temp)")
    p.add_argument("--fsync-baseline", action="store_true")
    p.add_argument("--all", action="store_true", help="the table for docs/storage.md")
    return p.parse_args()


if __name__ == "__main__":
    arguments = parse()
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, arguments)))
