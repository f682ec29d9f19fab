"""
The broker's CPU a message over the stream protocol (user and system time,
from /proc), publish with confirms and consume, for otter_tx (started here,
any interpreter) and the RabbitMQ 3.10 peer (its beam.smp, stream port 5562):
what the throughput of a 2-core machine shared with the load generator
hides (docs/performance.md, "The stream protocol's publish path on PyPy").

    .venv-test/bin/python bench/stream_cpu.py --targets otter,peer --size 1024
    .venv-test/bin/python bench/stream_cpu.py --otter-python /path/to/pypy --otter-code /tmp/base

Each round publishes ``--messages`` messages (one publisher unless
``--publishers``; frames of 100, at most 20,000 unconfirmed) to a fresh
stream, then consumes it ``--consumes`` times (credit 10), and deletes it;
the first round is a warm-up (PyPy's JIT) and is not counted.  Printed: the
medians of the other rounds, rates and microseconds of broker CPU a message.
"""

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)

import stream_protocol as sp  # noqa: E402

from otter_tx.stream import wire  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid):
    """(user, system) seconds of process ``pid``."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def peerPid():
    out = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True).stdout.split()
    if not out:
        raise SystemExit("no beam.smp: start the peer (/work/shared/tools/rabbitmq-peer.sh start)")
    return int(out[0])


def measure(port, pid, args):
    rows = []
    for rnd in range(args.rounds + 1):
        stream = "cpu-%d-%d" % (os.getpid(), rnd)
        admin = sp.Conn(port)
        admin.handshake()
        assert admin.call(wire.CREATE_STREAM, wire.encodeString(stream) + struct.pack(">I", 0)) == wire.OK
        u0, s0 = cpu(pid)
        total, elapsed = sp.publishAll(port, stream, args.messages, args.size, args.publishers, 100, 20000)
        u1, s1 = cpu(pid)
        times = [sp.consume(port, stream, total) for _ in range(args.consumes)]
        u2, s2 = cpu(pid)
        admin.call(wire.DELETE_STREAM, wire.encodeString(stream))
        admin.sock.close()
        n = total * args.consumes
        row = (total / elapsed, (u1 - u0) / total * 1e6, (s1 - s0) / total * 1e6,
               total / statistics.median(times), (u2 - u1) / n * 1e6, (s2 - s1) / n * 1e6)
        print("  round %d%s: publish %9.0f/s cpu %.3f+%.3f us, consume %10.0f/s cpu %.3f+%.3f us (user+sys)"
              % ((rnd, " (warm-up)" if rnd == 0 else "") + row), flush=True)
        if rnd:
            rows.append(row)
    return [statistics.median(r[i] for r in rows) for i in range(6)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="otter,peer")
    ap.add_argument("--otter-python", default=sys.executable)
    ap.add_argument("--otter-code", default=ROOT, help="the checkout otter_tx runs from")
    ap.add_argument("--peer-port", type=int, default=sp.PEER_PORT)
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--publishers", type=int, default=1)
    ap.add_argument("--consumes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = {}
    for target in args.targets.split(","):
        print("%s:" % target, flush=True)
        if target == "otter":
            port = 15600 + os.getpid() % 300
            proc, data = sp.startOtter(port, python=args.otter_python, cwd=args.otter_code)
            try:
                results[target] = measure(port, proc.pid, args)
            finally:
                proc.terminate()
                proc.wait(30)
                shutil.rmtree(data, ignore_errors=True)
        else:
            results[target] = measure(args.peer_port, peerPid(), args)
    print("\nmedians, %d B, %d publisher(s): rates a second, broker CPU a message in us (user + system)"
          % (args.size, args.publishers))
    for target, r in results.items():
        print("%-6s publish %9.0f  %.3f + %.3f = %.3f   consume %10.0f  %.3f + %.3f = %.3f"
              % (target, r[0], r[1], r[2], r[1] + r[2], r[3], r[4], r[5], r[4] + r[5]))


if __name__ == "__main__":
    main()
