#!/usr/bin/env python3
"""
Recovery time of N persistent messages (default 1,000,000; one durable
queue, 100 B bodies) for the otter_tx checkout at ROOT: fill a fresh store,
close it, then time ``SQLiteStore.open()`` (integrity check included) and
``Journal.recover`` into a ``Broker``.  Run it for two checkouts in turn
(for example ``main`` and a branch) to compare them on the same machine:

    for r in /work/main /work/wt-store; do python bench/store_recover_compare.py $r; done
"""

import shutil
import sys
import tempfile
import time

ROOT = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
sys.path.insert(0, ROOT)

from twisted.internet import defer, task  # noqa: E402

import otter_tx  # noqa: E402
from otter_tx.broker.broker import Broker  # noqa: E402
from otter_tx.broker.durability import Journal, tableToText  # noqa: E402
from otter_tx.store.sqlite import SQLiteStore  # noqa: E402

assert otter_tx.__file__.startswith(ROOT), otter_tx.__file__


async def main(reactor):
    d = tempfile.mkdtemp()
    try:
        s = SQLiteStore(d, reactor)
        await s.open()
        s.putEntity("vhost", "/", {})
        s.putEntity("queue", "/\x00big", {"autoDelete": False, "arguments": tableToText({})})
        for i in range(N):
            s.addMessage(i, "", "big", b"\x10\x00\x02", b"b" * 100)
            s.enqueue("/\x00big", i, i, 1.7e12, None, False)
            if i % 20000 == 19999:
                await s.sync()
        await s.close()
        s = SQLiteStore(d, reactor)
        t = time.perf_counter()
        state = await s.open()
        opened = time.perf_counter() - t
        b = Broker(task.Clock())
        t = time.perf_counter()
        Journal(b, s).recover(state)
        rebuilt = time.perf_counter() - t
        print(f"{ROOT} {N:,}: open {opened:.2f} s, rebuild {rebuilt:.2f} s, "
              f"total {opened + rebuilt:.2f} s", flush=True)
        await s.close()
    finally:
        shutil.rmtree(d)


task.react(lambda r: defer.Deferred.fromCoroutine(main(r)))
