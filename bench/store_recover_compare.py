#!/usr/bin/env python3
"""
Recovery time and peak memory of N persistent messages (--store log, the
default: the message log; --store sqlite: the SQLite store) (default 1,000,000;
one durable queue) for the otter_tx checkout at ROOT.

Without DIR: fill a fresh store, close it, then time ``SQLiteStore.open()``
(integrity check included) and ``Journal.recover`` into a ``Broker``, in one
process.  Run it for two checkouts in turn (for example ``main`` and a
branch) to compare them on the same machine:

    for r in /work/main /work/wt-store; do python bench/store_recover_compare.py $r; done

With ``--dir DIR``: if DIR holds no store, fill one there (``--body`` bytes
per message) and stop; if it does, only recover it, so the peak RSS
(``ru_maxrss``) printed is that of the recovery alone (the fill is another
process).  Recovery marks the store clean again on close, so one filled
DIR can be recovered by several checkouts in turn, interleaved:

    python bench/store_recover_compare.py /work/main 1000000 --dir /tmp/rec --body 32
    for i in 1 2; do for r in /work/main /work/wt-recover; do
        python bench/store_recover_compare.py $r 1000000 --dir /tmp/rec; done; done
"""

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("n", nargs="?", type=int, default=1_000_000)
p.add_argument("--dir", help="keep the store here (fill once, then recover only)")
p.add_argument("--body", type=int, default=100, help="body bytes per message")
p.add_argument("--store", choices=("log", "sqlite"), default="log",
               help="the message log (LogStore, the default store) or the SQLite store")
args = p.parse_args()
ROOT = args.root
N = args.n
sys.path.insert(0, ROOT)

from twisted.internet import defer, task  # noqa: E402

import otter_tx  # noqa: E402
from otter_tx.broker.broker import Broker  # noqa: E402
from otter_tx.broker.durability import Journal, tableToText  # noqa: E402
from otter_tx.store.sqlite import STORE_FILENAME, SQLiteStore  # noqa: E402

if args.store == "log":
    from otter_tx.store.log import LogStore as Store  # noqa: E402
else:
    Store = SQLiteStore

assert otter_tx.__file__.startswith(ROOT), otter_tx.__file__


async def fill(reactor, d):
    s = Store(d, reactor)
    await s.open()
    s.putEntity("vhost", "/", {})
    s.putEntity("queue", "/\x00big", {"autoDelete": False, "arguments": tableToText({})})
    body = b"b" * args.body
    for i in range(N):
        s.addMessage(i, "", "big", b"\x10\x00\x02", body)
        s.enqueue("/\x00big", i, i, 1.7e12, None, False)
        if i % 20000 == 19999:
            await s.sync()
    await s.close()


async def recover(reactor, d):
    s = Store(d, reactor)
    t = time.perf_counter()
    state = await s.open()
    opened = time.perf_counter() - t
    b = Broker(task.Clock())
    t = time.perf_counter()
    Journal(b, s).recover(state)
    rebuilt = time.perf_counter() - t
    count = b.vhosts["/"].queues["big"].readyCount
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{ROOT} {args.store} {count:,}: open {opened:.2f} s, rebuild {rebuilt:.2f} s, "
          f"total {opened + rebuilt:.2f} s, peak RSS {rss:.0f} MiB", flush=True)
    await s.close()


async def main(reactor):
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
        if os.path.exists(os.path.join(args.dir, STORE_FILENAME)):
            await recover(reactor, args.dir)
        else:
            await fill(reactor, args.dir)
        return
    d = tempfile.mkdtemp()
    try:
        await fill(reactor, d)
        await recover(reactor, d)
    finally:
        shutil.rmtree(d)


task.react(lambda r: defer.Deferred.fromCoroutine(main(r)))
