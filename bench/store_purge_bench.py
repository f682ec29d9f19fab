#!/usr/bin/env python3
"""
The durable store under big deletions and big recoveries (issue 8, "a store
that stays fast and small"), measured on :class:`otter_tx.store.sqlite.SQLiteStore`
with the real reactor, without AMQP:

- ``ack``: a queue of N persistent messages (default 500,000) is acked at
  ``--ack-rate`` messages/s (default 100,000/s, faster than one AMQP
  consumer acks on otter_tx; 1,000 ``dequeue`` calls per reactor turn) while a second publisher publishes
  one persistent message at a time into
  another queue and waits for its ``sync()`` (a confirm window of 1); the
  second publisher's confirm latency p50 / p99 / max is printed.
- ``purge``: the same with one ``purgeQueue`` of the N-message queue instead
  of the acks (the second publisher runs until the background clean-up of
  the purged entries has finished).
- ``size``: the file size (main file + WAL) with N messages (default
  1,000,000 via ``--size-n``), then after purging them, once the
  background clean-up and incremental vacuum are done, and after close.
- ``recover``: ``open()`` of a store holding N messages (default 1,000,000)
  and the broker rebuild from it (``Journal.recover`` into a ``Broker``),
  timed separately; then the time of a clean ``close()`` issued right after
  purging all of them (the clean-up is left for the next open).

    .venv/bin/python bench/store_purge_bench.py ack purge          # 500k
    .venv/bin/python bench/store_purge_bench.py size recover       # 1M
    .venv/bin/python bench/store_purge_bench.py all
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

QUEUE = "/\x00big"
OTHER = "/\x00other"
PROPS = b"\x10\x00\x02"  # flags: delivery-mode; delivery-mode 2


def fileBytes(path):
    """Main file + WAL, in bytes."""
    total = 0
    for name in (path, path + "-wal"):
        if os.path.exists(name):
            total += os.path.getsize(name)
    return total


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] * 1000


async def filledStore(reactor, dataDir, n, body):
    """An open store with queue QUEUE holding ``n`` messages (and the entities a broker needs)."""
    from otter_tx.broker.durability import tableToText

    store = SQLiteStore(dataDir, reactor)
    await store.open()
    store.putEntity("vhost", "/", {})
    for key in (QUEUE, OTHER):
        store.putEntity("queue", key, {"autoDelete": False, "arguments": tableToText({})})
    for i in range(n):
        store.addMessage(i, "", "big", PROPS, body)
        store.enqueue(QUEUE, i, i, 1.7e12, None, False)
        if i % 20000 == 19999:
            await store.sync()
    await store.sync()
    return store


async def secondPublisher(reactor, store, firstId, stop):
    """Publish one message at a time into OTHER, each waiting for its sync; returns latencies (s)."""
    latencies = []
    i = firstId
    while not stop():
        store.addMessage(i, "", "other", PROPS, b"x" * 100)
        store.enqueue(OTHER, i, i, 1.7e12, None, False)
        started = time.perf_counter()
        await store.sync()
        latencies.append(time.perf_counter() - started)
        store.dequeue(OTHER, i)
        i += 1
        await task.deferLater(reactor, 0.001, lambda: None)
    return latencies


async def confirmsDuring(reactor, directory, n, body, what, ackRate):
    dataDir = tempfile.mkdtemp(prefix="store-purge-bench-", dir=directory)
    try:
        store = await filledStore(reactor, dataDir, n, body)
        await store._whenIdle()
        done = [False]
        publisher = defer.Deferred.fromCoroutine(
            secondPublisher(reactor, store, 10 * n, lambda: done[0]))
        await task.deferLater(reactor, 0.2, lambda: None)
        started = time.perf_counter()
        if what == "ack":
            step = 1000
            for i in range(0, n, step):
                for storeId in range(i, min(n, i + step)):
                    store.dequeue(QUEUE, storeId)
                due = started + (i + step) / ackRate
                await task.deferLater(reactor, max(0.0, due - time.perf_counter()), lambda: None)
            await store.sync()
            await store._whenIdle()
        else:
            store.purgeQueue(QUEUE)
            await store.sync()
            issued = time.perf_counter() - started
            await store._whenIdle()
        elapsed = time.perf_counter() - started
        await task.deferLater(reactor, 0.2, lambda: None)
        done[0] = True
        latencies = await publisher
        await store.close()
        line = (f"{what} of {n:,}: {elapsed:.1f} s; second publisher's confirms "
                f"p50 {percentile(latencies, 0.5):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms, "
                f"max {max(latencies) * 1000:.1f} ms over {len(latencies):,} confirms")
        if what == "purge":
            line += f"; purge durable (its sync fired) after {issued * 1000:.1f} ms"
        print(line, flush=True)
    finally:
        shutil.rmtree(dataDir, ignore_errors=True)


async def sizeAfterPurge(reactor, directory, n, body):
    dataDir = tempfile.mkdtemp(prefix="store-purge-bench-", dir=directory)
    try:
        store = await filledStore(reactor, dataDir, n, body)
        await store._whenIdle()
        full = fileBytes(store.path)
        started = time.perf_counter()
        store.purgeQueue(QUEUE)
        await store.sync()
        await store._whenIdle()
        cleaned = time.perf_counter() - started
        running = fileBytes(store.path)
        await store.close()
        closed = fileBytes(store.path)
        print(f"size: {n:,} messages of {len(body)} B: {full / 1e6:.1f} MB; after purge and clean-up "
              f"({cleaned:.1f} s, store open): {running / 1e6:.2f} MB (file + WAL); after close: "
              f"{closed / 1e6:.2f} MB", flush=True)
    finally:
        shutil.rmtree(dataDir, ignore_errors=True)


async def recovery(reactor, directory, n, body):
    from otter_tx.broker.broker import Broker
    from otter_tx.broker.durability import Journal

    dataDir = tempfile.mkdtemp(prefix="store-purge-bench-", dir=directory)
    try:
        store = await filledStore(reactor, dataDir, n, body)
        await store.close()
        store = SQLiteStore(dataDir, reactor)
        started = time.perf_counter()
        state = await store.open()
        opened = time.perf_counter() - started
        broker = Broker(task.Clock())
        started = time.perf_counter()
        Journal(broker, store).recover(state)
        rebuilt = time.perf_counter() - started
        count = broker.vhosts["/"].queues["big"].readyCount
        del state, broker
        print(f"recover: {count:,} messages: store open {opened:.2f} s "
              f"(integrity check included) + broker rebuild {rebuilt:.2f} s "
              f"= {opened + rebuilt:.2f} s", flush=True)
        store.purgeQueue(QUEUE)
        await store.sync()
        started = time.perf_counter()
        await store.close()
        print(f"clean stop right after purging {n:,}: {time.perf_counter() - started:.2f} s",
              flush=True)
        store = SQLiteStore(dataDir, reactor)
        started = time.perf_counter()
        state = await store.open()
        print(f"  next open: {time.perf_counter() - started:.2f} s, "
              f"{state.stats['queuedMessages']} entries", flush=True)
        await store._whenIdle()
        await store.close()
    finally:
        shutil.rmtree(dataDir, ignore_errors=True)


async def main(reactor, args):
    directory = args.dir or tempfile.gettempdir()
    what = set(args.what)
    if "all" in what:
        what = {"ack", "purge", "size", "recover"}
    print(f"python {sys.version.split()[0]}, body {args.body} B", flush=True)
    for kind in ("ack", "purge"):
        if kind in what:
            await confirmsDuring(reactor, directory, args.n, b"b" * args.body, kind, args.ack_rate)
    if "size" in what:
        await sizeAfterPurge(reactor, directory, args.size_n, b"b" * args.body)
    if "recover" in what:
        await recovery(reactor, directory, args.size_n, b"b" * args.body)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="+", choices=["ack", "purge", "size", "recover", "all"])
    p.add_argument("-n", type=int, default=500_000, help="queue length for ack and purge")
    p.add_argument("--ack-rate", type=float, default=100_000, help="acks per second")
    p.add_argument("--size-n", type=int, default=1_000_000, help="messages for size and recover")
    p.add_argument("--body", type=int, default=100, help="body size in bytes")
    p.add_argument("--dir", help="where the temporary data dirs go (default: system temp)")
    return p.parse_args()


if __name__ == "__main__":
    arguments = parse()
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, arguments)))
