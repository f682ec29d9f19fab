"""
Where a profiled broker's time went, by thread and category (issue 20).

    python bench/profile_summary.py /tmp/prof/cpython-confirm100

reads ``PREFIX.collapsed`` (py-spy ``--format raw --threads --idle --native``)
or ``PREFIX.vmprof`` (PyPy, bench/profile_broker.py), and ``PREFIX.gc.json``.

Every sample goes to one category (exclusive), decided from the leaf up:
native leaves first (GIL wait: ``pthread_cond_timedwait`` right under a call
that released the GIL, i.e. ``take_gil``; idle in ``epoll_wait``; a writer
waiting for work on its lock; ``fdatasync``; file writes; socket send/recv;
the cyclic GC), then the innermost otter_tx frame's module (codec, store,
journal, routing and queues, the socket writer, the door and session glue),
then Twisted.  ``paths`` are inclusive: the share of samples with a frame of
the publish, deliver, ack or confirm path anywhere on the stack.
"""

import collections
import json
import os
import re
import sys

MODULES = [
    ("otter_tx/store/", "store"),
    ("otter_tx/broker/durability.py", "journal"),
    ("otter_tx/amqp/", "frame codec"),
    ("otter_tx/door/writer.py", "socket writes (Python)"),
    ("otter_tx/broker/vhost.py", "routing+queues"),
    ("otter_tx/broker/exchange.py", "routing+queues"),
    ("otter_tx/broker/publish.py", "routing+queues"),
    ("otter_tx/broker/queue.py", "routing+queues"),
    ("otter_tx/broker/readystore.py", "routing+queues"),
    ("otter_tx/broker/message.py", "routing+queues"),
    ("otter_tx/broker/expiry.py", "routing+queues"),
    ("otter_tx/", "session/channel glue"),
    ("twisted/", "Twisted reactor"),
]

PATHS = [
    ("publish", re.compile(r"publishMessage|Session\.publish ")),
    ("deliver", re.compile(r"Queue\._deliver|Consumer\.deliver")),
    ("ack", re.compile(r"Channel\.ack |Session\.ack")),
    ("confirm", re.compile(r"[Cc]onfirm")),
    ("journal+store calls", re.compile(r"durability\.py|otter_tx/store/")),
]


def native(frames, cat):
    """
    A category from the native frames near the leaf, or None.
    """
    tail = frames[-3:]
    text = ";".join(tail)
    if "pthread_cond_timedwait" in text or "take_gil" in text:
        return "GIL wait"
    if "epoll_wait" in text:
        return "idle (epoll)"
    if "PyThread_acquire_lock_timed" in text or "sem_clockwait" in text:
        return "idle (waiting for work)" if cat == "writer" else "lock wait"
    whole = ";".join(frames)
    if "gc_collect" in whole or "collect_with_callback" in whole:
        return "GC"
    if "fdatasync" in text or "fsync" in text:
        return "fdatasync"
    if "pwrite" in text or "os_write" in text:
        return "file write syscall"
    if "sock_send" in text or "send (libc" in text or "sendmsg" in text:
        return "socket send syscall"
    if "recv (libc" in text or "sock_recv" in text:
        return "socket recv syscall"
    return None


def category(frames, cat):
    c = native(frames, cat)
    if c:
        return c
    for f in reversed(frames):
        for needle, name in MODULES:
            if needle in f:
                return name
    return "other"


def readCollapsed(path):
    for line in open(path):
        stack, n = line.rstrip("\n").rsplit(" ", 1)
        frames = stack.split(";")
        yield frames[0], frames[1:], int(n)


def readVmprof(path):
    import vmprof

    stats = vmprof.read_profile(path)
    names = {}
    for prof in stats.profiles:
        addrs, count, tid = prof[0], prof[1], prof[2]
        frames = []
        for a in addrs:
            name = stats.adr_dict.get(a)
            if name is None:
                continue
            if name not in names:
                parts = name.split(":")
                # py:function:line:file
                names[name] = (f"{parts[1]} ({parts[3]}:{parts[2]})" if len(parts) >= 4
                               else name)
            frames.append(names[name])
        yield f"thread {tid}", frames, count


def threadKind(thread, frames):
    if "MainThread" in thread or any("ReactorBase.run" in f or "mainLoop" in f for f in frames):
        return "reactor"
    if "writer" in thread or any("otter_tx/store/" in f and "_run" in f for f in frames[:12]):
        return "writer"
    return "other"


def summarize(prefix):
    if os.path.exists(prefix + ".collapsed"):
        samples = list(readCollapsed(prefix + ".collapsed"))
    elif os.path.exists(prefix + ".vmprof"):
        samples = list(readVmprof(prefix + ".vmprof"))
    else:
        samples = []  # PROFILER=none: only the GC figures
    total = collections.Counter()
    by = collections.defaultdict(collections.Counter)
    paths = collections.defaultdict(collections.Counter)
    for thread, frames, n in samples:
        kind = threadKind(thread, frames)
        total[kind] += n
        by[kind][category(frames, kind)] += n
        joined = ";".join(frames)
        for name, rx in PATHS:
            if rx.search(joined):
                paths[kind][name] += n
    out = {"samples": dict(total), "categories": {}, "paths": {}}
    for kind in total:
        out["categories"][kind] = {c: round(100.0 * n / total[kind], 1)
                                   for c, n in by[kind].most_common()}
        out["paths"][kind] = {c: round(100.0 * n / total[kind], 1)
                              for c, n in paths[kind].most_common()}
    if os.path.exists(prefix + ".gc.json"):
        out["gc"] = json.load(open(prefix + ".gc.json"))
    return out


def main():
    out = summarize(sys.argv[1])
    gc = out.pop("gc", None)
    print(f"samples per thread: {out['samples']}")
    for kind, cats in out["categories"].items():
        print(f"{kind}: " + ", ".join(f"{c} {p}%" for c, p in cats.items()))
        print("  paths (inclusive): " + ", ".join(f"{c} {p}%" for c, p in out["paths"][kind].items()))
    if gc:
        keep = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in gc.items()
                if k not in ("interpreter",)}
        print(f"gc/window: {json.dumps(keep)}")
    with open(sys.argv[1] + ".summary.json", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
