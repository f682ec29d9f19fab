#!/usr/bin/env python3
"""
Overload across the inter-node link (issue 21, docs/performance.md "Link
back-pressure"): a 2-node cluster, a queue and its autoack consumer on node
2, ``--producers`` unconfirmed amqp-perf publishers at full speed on node 1,
so node 1 forwards faster than node 2 can take.  Reports the consumer's
rate and end-to-end latency, node 1's peak RSS, and whether either node lost
its etcd lease (a ``lost its cluster lease`` line in a node log).

    .venv/bin/python bench/link_flow.py --seconds 15 --producers 2
"""

import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as bc  # noqa: E402


def rss(pid):
    try:
        with open("/proc/%d/status" % (pid,)) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--rate", type=int, default=0, help="per-producer cap, msg/s (0: unlimited)")
    a = ap.parse_args()
    c = bc.Cluster(a.python, 2).start()
    try:
        urls = c.urls()
        bc.declare(urls[1], ["flow-q"], False)
        runId = 4242
        cons = subprocess.Popen(bc.perfArgv(urls[1], a.seconds + 2, runId, "cons",
                                            ["-x", "0", "-y", "1", "-a", "-u", "flow-q", "-s", str(a.size)]),
                                stdout=subprocess.PIPE, text=True)
        prods = [subprocess.Popen(bc.perfArgv(urls[0], a.seconds, runId, "prod%d" % i,
                                              ["-x", "1", "-y", "0", "-u", "flow-q", "-s", str(a.size),
                                               "-r", str(a.rate)]),
                                  stdout=subprocess.PIPE, text=True) for i in range(a.producers)]
        peak = 0
        end = time.monotonic() + a.seconds + 3
        while time.monotonic() < end:
            peak = max(peak, rss(c.pids()[0]) or 0)
            time.sleep(0.25)
        for p in prods:
            print("producer:", p.communicate()[0].strip().splitlines()[-1])
        print("consumer:", cons.communicate(timeout=30)[0].strip().splitlines()[-1])
        print("node 1 peak RSS: %d MiB" % (peak,))
        with open(c.logFile.name, errors="replace") as f:
            logsDir = [line.split(":", 1)[1].strip().split("/<node>")[0]
                       for line in f if line.startswith("logs:")]
        lost = []
        for path in glob.glob(os.path.join(logsDir[0], "*.log")) if logsDir else []:
            with open(path, errors="replace") as f:
                lost += [line.strip() for line in f if "lost its place" in line]
        print("lease lost:", lost[:3] or "never")
        bc.delete(urls[1], ["flow-q"])
    finally:
        c.stop()


if __name__ == "__main__":
    main()
