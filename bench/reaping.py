#!/usr/bin/env python3
"""
How promptly and how cheaply :class:`otter_tx.broker.expiry.ExpiryIndex`
reaps expired keys.

The index is driven on a ``twisted.internet.task.Clock``: N keys (default
1,000,000) are added with random TTLs between 1 ms and 60 s, then the clock
is advanced in 10 ms steps until every key has expired.  For every key that
``onExpire(keys)`` reports, lateness = clock time at the callback - the key's
deadline (ms).  With 10 ms steps lateness is expected in [0, 10) ms; a
negative value would mean a key expired early and is counted as an error.

Printed: add and reap time, p50/p99/max lateness in ms, and memory per
entry in bytes measured with ``tracemalloc`` in a second, separate build of
the index (tracemalloc slows allocation down, so it is kept out of the
timings).  Keys and deadlines are created before measuring, so the figure is
the index's own overhead (heap slot, dict entry, sequence number), not the
keys'.

API used (``otter_tx/broker/expiry.py``): ``ExpiryIndex(clock, onExpire)``,
``index.add(key, deadlineMs)`` with the deadline in ms on the clock's time
base (``clock.seconds() * 1000``), ``index.remove(key)``, ``len(index)``;
``onExpire(keys)`` gets the list of keys due.

    .venv/bin/python bench/reaping.py              # ~10-20 s
    .venv/bin/python bench/reaping.py -n 100000 --remove-fraction 0.5
"""

import argparse
import gc
import json
import os
import random
import sys
import time
import tracemalloc
from array import array

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    from otter_tx.broker.expiry import ExpiryIndex
except ImportError as e:
    raise ImportError(
        "bench/reaping.py needs otter_tx.broker.expiry.ExpiryIndex "
        "(ExpiryIndex(clock, onExpire), add(key, deadline_ms), remove(key), "
        f"len()); it is not importable yet: {e}") from e

from twisted.internet.task import Clock


def makeWorkload(n, minTtlMs, maxTtlMs, seed):
    """
    Keys ``0..n-1`` and their TTLs in ms, uniform in [minTtlMs, maxTtlMs].

    :returns: ``(keys, ttls)`` lists, created up front so that neither is
        counted as index memory.
    """
    rng = random.Random(seed)
    keys = list(range(n))
    ttls = [rng.uniform(minTtlMs, maxTtlMs) for _ in range(n)]
    return keys, ttls


def percentile(sortedValues, q):
    """
    The ``q`` quantile (0..1) of an ascending sequence, nearest rank.
    """
    if not sortedValues:
        return float("nan")
    i = min(len(sortedValues) - 1, max(0, int(round(q * len(sortedValues) + 0.5)) - 1))
    return sortedValues[i]


def measureMemory(keys, deadlines):
    """
    Bytes per entry of an index holding ``len(keys)`` keys (tracemalloc).
    """
    clock = Clock()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = ExpiryIndex(clock, lambda keys: None)
        add = index.add
        for key, deadline in zip(keys, deadlines):
            add(key, deadline)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    n = len(index)
    del index
    gc.collect()
    return (after - before) / n, (peak - before) / n


def runTiming(keys, deadlines, stepMs, removeKeys):
    """
    Add every key, remove ``removeKeys``, advance the clock in ``stepMs``
    steps until the index is empty.

    :returns: dict of timings and lateness statistics (ms).
    """
    clock = Clock()
    lateness = array("d")
    deadlineOf = dict(zip(keys, deadlines))
    seen = 0
    early = 0
    removedFired = 0
    removed = set(removeKeys)

    def onExpire(expired):
        nonlocal seen, early, removedFired
        now = clock.seconds() * 1000.0
        for key in expired:
            late = now - deadlineOf[key]
            if late < -1e-3:
                early += 1
            if key in removed:
                removedFired += 1
            lateness.append(late)
        seen += len(expired)

    index = ExpiryIndex(clock, onExpire)
    gc.collect()
    t0 = time.perf_counter()
    add = index.add
    for key, deadline in zip(keys, deadlines):
        add(key, deadline)
    tAdd = time.perf_counter() - t0

    t0 = time.perf_counter()
    for key in removeKeys:
        index.remove(key)
    tRemove = time.perf_counter() - t0

    expected = len(index)
    horizon = max(deadlines) + 10 * stepMs
    step = stepMs / 1000.0
    steps = 0
    t0 = time.perf_counter()
    while len(index) and clock.seconds() * 1000.0 <= horizon:
        clock.advance(step)
        steps += 1
    tReap = time.perf_counter() - t0

    values = sorted(lateness)
    return {
        "added": len(keys),
        "removed": len(removeKeys),
        "expected_expiries": expected,
        "expired": seen,
        "left_in_index": len(index),
        "early": early,
        "removed_but_fired": removedFired,
        "steps": steps,
        "simulated_s": round(clock.seconds(), 3),
        "add_s": round(tAdd, 3),
        "add_per_s": round(len(keys) / tAdd) if tAdd else None,
        "remove_s": round(tRemove, 3),
        "reap_s": round(tReap, 3),
        "reap_per_s": round(seen / tReap) if tReap else None,
        "lateness_p50_ms": percentile(values, 0.50),
        "lateness_p99_ms": percentile(values, 0.99),
        "lateness_max_ms": values[-1] if values else float("nan"),
        "lateness_min_ms": values[0] if values else float("nan"),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description="ExpiryIndex reaping lateness and memory.")
    p.add_argument("-n", "--keys", type=int, default=1_000_000,
                   help="number of keys (default 1,000,000)")
    p.add_argument("--min-ttl-ms", type=float, default=1.0, help="default 1")
    p.add_argument("--max-ttl-ms", type=float, default=60_000.0, help="default 60000")
    p.add_argument("--step-ms", type=float, default=10.0,
                   help="clock advance step (default 10)")
    p.add_argument("--remove-fraction", type=float, default=0.0,
                   help="remove this fraction of the keys (at random) before "
                        "advancing, as acked messages would be (default 0)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-memory", action="store_true",
                   help="skip the tracemalloc pass")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    if args.keys < 1 or not 0 <= args.remove_fraction < 1:
        p.error("need --keys >= 1 and 0 <= --remove-fraction < 1")

    t0 = time.perf_counter()
    keys, ttls = makeWorkload(args.keys, args.min_ttl_ms, args.max_ttl_ms, args.seed)
    # Clock() starts at 0, so deadline = now_ms (0) + ttl
    deadlines = ttls
    removeKeys = random.Random(args.seed + 1).sample(
        keys, int(args.keys * args.remove_fraction))

    result = {"keys": args.keys, "ttl_ms": [args.min_ttl_ms, args.max_ttl_ms],
              "step_ms": args.step_ms, "seed": args.seed}
    result.update(runTiming(keys, deadlines, args.step_ms, removeKeys))
    if not args.no_memory:
        perEntry, peakPerEntry = measureMemory(keys, deadlines)
        result["memory_bytes_per_entry"] = round(perEntry, 1)
        result["memory_peak_bytes_per_entry"] = round(peakPerEntry, 1)
    result["wall_s"] = round(time.perf_counter() - t0, 1)

    ok = (result["expired"] == result["expected_expiries"] and result["early"] == 0
          and result["removed_but_fired"] == 0 and result["left_in_index"] == 0)
    result["ok"] = ok
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        r = result
        print(f"ExpiryIndex: {r['added']:,} keys, TTL {args.min_ttl_ms:g}..{args.max_ttl_ms:g} ms "
              f"(uniform), clock steps of {args.step_ms:g} ms, {r['removed']:,} removed")
        print(f"  add:       {r['add_s']:.2f} s ({r['add_per_s']:,} keys/s)")
        if r["removed"]:
            print(f"  remove:    {r['remove_s']:.2f} s")
        print(f"  reap:      {r['reap_s']:.2f} s for {r['expired']:,} expiries over "
              f"{r['steps']:,} steps ({r['simulated_s']:g} s simulated)")
        print(f"  lateness:  p50 {r['lateness_p50_ms']:.3f} ms  p99 {r['lateness_p99_ms']:.3f} ms  "
              f"max {r['lateness_max_ms']:.3f} ms  (min {r['lateness_min_ms']:.3f} ms)")
        if "memory_bytes_per_entry" in r:
            print(f"  memory:    {r['memory_bytes_per_entry']:.1f} bytes/entry "
                  f"(peak {r['memory_peak_bytes_per_entry']:.1f}; tracemalloc, keys and "
                  f"deadlines not counted)")
        print(f"  check:     {'ok' if ok else 'FAILED'} (expired {r['expired']:,} of "
              f"{r['expected_expiries']:,}, early {r['early']}, removed-but-fired "
              f"{r['removed_but_fired']}, left {r['left_in_index']})")
        print(f"  wall time: {r['wall_s']:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
