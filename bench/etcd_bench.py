#!/usr/bin/env python3
"""
What one :class:`otter_tx.cluster.etcd.EtcdClient` gets out of etcd here: puts/s and txns/s (a
declare-shaped transaction: create the key if its version is 0, else read it) with 1 request in
flight and with ``--concurrency`` in flight, keys/s written by transactions of 64 puts each (etcd's
``--max-txn-ops`` is 128), and the watch latency (put sent -> event received on a
prefix watch of the same client) as p50/p99/max in ms. Also the client's own CPU per request
(``time.process_time`` of this process, which runs only the client: etcd runs in its own processes).

Each configuration starts fresh etcd members with otter_tx.cluster.etcdtest.startEtcd (1 member,
then 3 members), on tmpfs (``/dev/shm``: fsync is free) unless ``--data-dir`` names a directory on
a disk (etcd then fsyncs every write, as in production). Rounds interleave the configurations so
the machine's noise spreads over both; the medians are printed.

    .venv-test/bin/python bench/etcd_bench.py                       # ~1 min
    .venv-test/bin/python bench/etcd_bench.py --data-dir /var/tmp --rounds 3
"""

import argparse
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from twisted.internet import defer, task  # noqa: E402

from otter_tx.cluster.etcd import Compare, EtcdClient, Op  # noqa: E402
from otter_tx.cluster.etcdtest import startEtcd  # noqa: E402


async def rate(reactor, n, concurrency, make):
    """Run ``make(i)`` (-> Deferred) n times with ``concurrency`` in flight: (ops/s, CPU µs per op)."""
    nextIndex = [0]

    async def worker():
        while nextIndex[0] < n:
            i = nextIndex[0]
            nextIndex[0] += 1
            await make(i)
    wall, cpu = time.perf_counter(), time.process_time()
    await defer.gatherResults([defer.Deferred.fromCoroutine(worker()) for _ in range(concurrency)])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, cpu / n * 1e6


async def watchLatency(reactor, client, n):
    """Sequential puts under a watched prefix: put sent -> its event, in ms (sorted list)."""
    prefix = "/bench-w-%s/" % (uuid.uuid4().hex[:6],)
    waiting = {}

    def onEvents(events):
        for e in events:
            d = waiting.pop(e.value, None)
            if d is not None:
                d.callback(time.perf_counter())
    w = client.watchPrefix(prefix, None, onEvents)
    while not w.connected:
        await task.deferLater(reactor, 0.01, lambda: None)
    out = []
    for i in range(n):
        value = b"%d" % i
        d = waiting[value] = defer.Deferred()
        sent = time.perf_counter()
        client.put(prefix + "k", value)
        got = await d
        out.append((got - sent) * 1000)
    await w.stop()
    return sorted(out)


def pct(xs, p):
    return xs[min(len(xs) - 1, int(len(xs) * p))]


async def oneRound(reactor, members, args):
    cluster = await startEtcd(members, dataDir=args.data_dir)
    try:
        client = EtcdClient(cluster.endpoints, reactor)
        try:
            prefix = "/bench-%s/" % (uuid.uuid4().hex[:6],)
            for i in range(200):  # warm up
                await client.put(prefix + "warm", "x")
            res = {}
            res["put x1"] = await rate(reactor, args.n, 1, lambda i: client.put(prefix + "p%d" % (i % 1000), "v"))
            res["put x%d" % args.concurrency] = await rate(
                reactor, args.n, args.concurrency, lambda i: client.put(prefix + "p%d" % (i % 1000), "v"))

            def declare(i, tag):
                k = prefix + "q%s-%d" % (tag, i)
                return client.txn([Compare.version(k, "=", 0)], [Op.put(k, "{}")], [Op.get(k)])
            res["txn x1"] = await rate(reactor, args.n, 1, lambda i: declare(i, "a"))
            res["txn x%d" % args.concurrency] = await rate(reactor, args.n, args.concurrency,
                                                           lambda i: declare(i, "b"))
            batches, cpu = await rate(reactor, args.n // 10, 1, lambda i: client.txn(
                [], [Op.put(prefix + "b%d-%d" % (i, j), "{}") for j in range(64)]))
            res["64-put txn x1"] = (batches * 64, cpu / 64)  # keys/s and CPU per key
            res["get x1"] = await rate(reactor, args.n, 1, lambda i: client.get(prefix + "p%d" % (i % 1000)))
            lat = await watchLatency(reactor, client, args.watch_n)
            res["watch"] = (pct(lat, 0.5), pct(lat, 0.99), lat[-1])
            return res
        finally:
            await client.close()
    finally:
        cluster.stop()


async def main(reactor, args):
    results = {1: [], 3: []}
    for r in range(args.rounds):
        for members in (1, 3):
            results[members].append(await oneRound(reactor, members, args))
            print("round %d, %d member(s): done" % (r + 1, members), file=sys.stderr)
    print("etcd 3.4 (%s), one EtcdClient, %d requests per figure, median of %d rounds" % (
        args.data_dir or "tmpfs", args.n, args.rounds))
    print("%-14s %22s %22s" % ("", "1 member", "3 members"))
    for key in results[1][0]:
        if key == "watch":
            continue
        cells = []
        for members in (1, 3):
            ops = statistics.median(x[key][0] for x in results[members])
            cpu = statistics.median(x[key][1] for x in results[members])
            cells.append("%7.0f/s %5.0f µs CPU" % (ops, cpu))
        print("%-14s %22s %22s" % (key, cells[0], cells[1]))
    cells = []
    for members in (1, 3):
        p50 = statistics.median(x["watch"][0] for x in results[members])
        p99 = statistics.median(x["watch"][1] for x in results[members])
        mx = statistics.median(x["watch"][2] for x in results[members])
        cells.append("%.2f/%.2f/%.1f ms" % (p50, p99, mx))
    print("%-14s %22s %22s   (put -> event, p50/p99/max)" % ("watch", cells[0], cells[1]))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=2000, help="requests per figure (default 2000)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight for the concurrent figures")
    p.add_argument("--watch-n", type=int, default=500, help="puts timed through the watch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data-dir", default=None, help="where the members keep their data (default /dev/shm)")
    args = p.parse_args()
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, args)))
