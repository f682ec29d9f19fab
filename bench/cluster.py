#!/usr/bin/env python3
"""
The cluster benchmarks of issue 21: otter_tx on 1 node and on 2 nodes beside
RabbitMQ, interleaved in one run (docs/performance.md, "The cluster
(issue 21)").

Every scenario is driven by separate ``bench/amqp-perf`` processes, one per
producer and one per consumer, so that each client can connect to a node of
its own.  Queues (and the fanout exchange) are declared beforehand with pika
on the node that should hold them (otter_tx's default ``client-local``
locator puts a queue where it is first declared), amqp-perf runs with
``--predeclared``, and pika deletes them afterwards.  Producer and consumer
of one pair share ``--run-id`` so the consumer measures end-to-end latency.

Targets (each optional):

- ``rabbitmq``: the running RabbitMQ peer (``--rabbit URL``, default
  port 5682); every client on it.
- ``otter-1``: one otter_tx without a cluster (twistd, a temp data dir).
- ``otter-2n-cross``: a 2-node cluster (``python -m otter_tx.cluster.local
  --nodes 2``, its own etcd); pair ``i``'s queue and consumer on node
  ``i % 2``, its producer on the other node, so every message crosses the
  inter-node link once.
- ``otter-2n-local``: the same cluster; pair ``i`` entirely on node
  ``i % 2`` (no message crosses the link).

For fanout (one producer, 4 queues): queues 1-2 and their consumers on node
1, queues 3-4 and theirs on node 2, the producer on node 1 (half of the
deliveries cross the link); run under ``otter-2n-cross`` only.

Rates are the sum of the consumers' ``recv_rate`` (deliveries per second);
CPU is the sum over the broker processes (µs per delivery).  The cross-node
latency scenario (``latency``) runs one pair at a fixed rate on the 2-node
cluster: producer and consumer on one node vs on different nodes.

    .venv/bin/python bench/cluster.py --rounds 3 --seconds 6 --fresh-cluster --json out.json
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import run as benchrun  # noqa: E402

PERF = benchrun.PERF


#: name -> (amqp-perf producer args, consumer args, queues per pair, fanout)
SCENARIOS = {
    "pairs1": dict(title="1 producer / 1 consumer, 16 B, autoack", pairs=1,
                   p=["-s", "16"], c=["--autoack"]),
    "pairs4": dict(title="4 pairs, each its own queue, 16 B, autoack", pairs=4,
                   p=["-s", "16"], c=["--autoack"]),
    "fanout4": dict(title="1 producer -> fanout -> 4 queues, 4 consumers, 16 B, autoack", pairs=1,
                    fanout=4, p=["-s", "16"], c=["--autoack"]),
    "persist": dict(title="1 pair, 1 KiB persistent, confirms 100, durable, prefetch 100, manual ack",
                    pairs=1, durable=True, p=["-s", "1024", "--persistent", "--confirm", "100"],
                    c=["--prefetch", "100"]),
    "latency": dict(title="1 pair at 1000 msg/s, 16 B, autoack (latency)", pairs=1,
                    p=["-s", "16", "--rate", "1000"], c=["--autoack"]),
}


def log(msg):
    benchrun.log(msg)


# --------------------------------------------------------------------------
# brokers


class Cluster:
    """``python -m otter_tx.cluster.local --nodes N`` as a subprocess."""

    def __init__(self, python, nodes, repo=REPO):
        self.python = python
        self.repo = repo
        self.count = nodes
        self.proc = None
        self.nodes = []  # (name, port, pid)

    def start(self, timeout=90):
        env = dict(os.environ, PYTHONPATH=self.repo, PYTHONUNBUFFERED="1")
        # its output goes to a file: a pipe nobody reads would fill and stall it
        self.logFile = tempfile.NamedTemporaryFile(prefix="otter-cluster-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [self.python, "-m", "otter_tx.cluster.local", "--nodes", str(self.count)],
            cwd=self.repo, env=env, stdin=subprocess.DEVNULL, stdout=self.logFile,
            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while len(self.nodes) < self.count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("cluster did not start; log %s" % (self.logFile.name,))
            time.sleep(0.2)
            self.nodes = []
            with open(self.logFile.name) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 7 and parts[0].startswith("otter") and parts[1] == "amqp":
                        port = int(parts[2].rsplit(":", 1)[1])
                        self.nodes.append((parts[0].rstrip(":"), port, int(parts[-1])))
        log("cluster: %s" % (self.nodes,))
        return self

    def urls(self):
        return ["amqp://guest:guest@127.0.0.1:%d/" % (port,) for _, port, _ in self.nodes]

    def pids(self):
        return [pid for _, _, pid in self.nodes]

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None and self.proc.returncode not in (0, -signal.SIGINT):
            log("cluster: exited with %s; log kept: %s" % (self.proc.returncode, self.logFile.name))
        elif self.proc is not None:
            os.unlink(self.logFile.name)


def cpuOf(pids):
    def cpu():
        vals = [benchrun.cpuSeconds(p) for p in pids]
        return None if any(v is None for v in vals) else sum(vals)
    return cpu


# --------------------------------------------------------------------------
# topology with pika


def pikaConn(url):
    import pika
    return pika.BlockingConnection(pika.URLParameters(url + "%2F?socket_timeout=10&connection_attempts=3"))


def declare(url, queues, durable, exchange=None):
    c = pikaConn(url)
    try:
        ch = c.channel()
        if exchange:
            ch.exchange_declare(exchange, "fanout", durable=durable)
        for q in queues:
            ch.queue_declare(q, durable=durable)
            if exchange:
                ch.queue_bind(q, exchange, routing_key=q)
    finally:
        c.close()


def delete(url, queues, exchange=None):
    try:
        c = pikaConn(url)
    except Exception as e:  # report, go on
        log("cleanup: %s" % (e,))
        return
    try:
        ch = c.channel()
        for q in queues:
            ch.queue_delete(q)
        if exchange:
            ch.exchange_delete(exchange)
    except Exception as e:
        log("cleanup: %s" % (e,))
    finally:
        try:
            c.close()
        except Exception:
            pass


def perfArgv(url, seconds, runId, ident, extra):
    conn = benchrun.parseUrl(url)
    return [PERF, "--host", conn["host"], "--port", str(conn["port"]), "--user", conn["user"],
            "--password", conn["password"], "--vhost", conn["vhost"], "--time", str(seconds),
            "--predeclared", "--quiet", "--run-id", str(runId), "--id", ident] + extra


# --------------------------------------------------------------------------
# placements: which node each client and queue goes to


def plan(scen, placement, nodes, tag):
    """
    ``[(queueNode, [queues], consumerNode, producerNode, exchange)]`` for one run.

    ``placement``: ``single`` (everything on node 0), ``cross`` or ``local``.
    """
    s = SCENARIOS[scen]
    out = []
    if s.get("fanout"):
        ex = "%s-x" % (tag,)
        qs = ["%s-%d" % (tag, i + 1) for i in range(s["fanout"])]
        if placement == "single" or nodes == 1:
            out.append((0, qs, 0, 0, ex))
        else:
            half = len(qs) // 2
            out.append((0, qs[:half], 0, 0, ex))
            out.append((1, qs[half:], 1, None, ex))
        return out
    for i in range(s["pairs"]):
        q = "%s-%d" % (tag, i)
        if placement == "single" or nodes == 1:
            out.append((0, [q], 0, 0, None))
        elif placement == "cross":
            out.append((i % 2, [q], i % 2, (i + 1) % 2, None))
        else:
            out.append((i % 2, [q], i % 2, i % 2, None))
    return out


def runOnce(scen, urls, placement, seconds, cpu, tag, runIdBase):
    s = SCENARIOS[scen]
    durable = bool(s.get("durable"))
    layout = plan(scen, placement, len(urls), tag)
    exchange = layout[0][4]
    for qn, qs, _, _, ex in layout:
        declare(urls[qn], qs, durable, ex)
    procs = []
    for i, (qn, qs, cn, pn, ex) in enumerate(layout):
        runId = runIdBase + i
        if ex:
            topo = ["--exchange", ex, "--type", "fanout", "--queue-pattern",
                    "%s-%%d" % (tag,), "--queue-pattern-from", qs[0].rsplit("-", 1)[1],
                    "--queue-pattern-to", qs[-1].rsplit("-", 1)[1]]
        else:
            topo = ["--queue", qs[0]]
        procs.append(("c", perfArgv(urls[cn], seconds, runId, "%s-c%d" % (scen, i),
                                    topo + ["-x", "0", "-y", str(len(qs))] + s["c"])))
        if pn is not None:
            procs.append(("p", perfArgv(urls[pn], seconds, runId, "%s-p%d" % (scen, i),
                                        topo + ["-x", "1", "-y", "0"] + s["p"])))
    cpu0 = cpu() if cpu else None
    t0 = time.monotonic()
    running = [(kind, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)) for kind, argv in procs]
    results = []
    for kind, p in running:
        try:
            out, err = p.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append((kind, p.returncode, benchrun.parseSummary(out) or {}, err))
    wall = time.monotonic() - t0
    cpu1 = cpu() if cpu else None
    delete(urls[0], [q for qn, qs, _, _, _ in layout if qn == 0 for q in qs], exchange)
    if len(urls) > 1:
        delete(urls[1], [q for qn, qs, _, _, _ in layout if qn == 1 for q in qs])
    ok = all(rc == 0 and sm.get("status") == "ok" for _, rc, sm, _ in results)
    cons = [sm for kind, _, sm, _ in results if kind == "c"]
    prods = [sm for kind, _, sm, _ in results if kind == "p"]
    r = {"status": "ok" if ok else "error",
         "recv_rate": sum(sm.get("recv_rate", 0) for sm in cons),
         "sent_rate": sum(sm.get("sent_rate", 0) for sm in prods),
         "received": sum(sm.get("received", 0) for sm in cons)}
    for key in ("lat_p50_us", "lat_p99_us"):
        vals = [sm[key] for sm in cons if key in sm]
        if vals:
            r[key] = max(vals)  # the worst consumer's percentile
    if not ok:
        r["errors"] = [err.strip()[-500:] for _, rc, sm, err in results if rc != 0 or sm.get("status") != "ok"]
    if cpu0 is not None and cpu1 is not None and r["received"]:
        r["broker_cpu_pct"] = round(100.0 * (cpu1 - cpu0) / wall, 1)
        r["cpu_us_per_msg"] = round(1e6 * (cpu1 - cpu0) / r["received"], 2)
    return r


def summarise(runs):
    groups = {}
    for r in runs:
        groups.setdefault((r["scenario"], r["target"]), []).append(r)
    rows = []
    for (scen, target), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        row = {"scenario": scen, "target": target, "ok": len(ok), "failed": len(rs) - len(ok)}
        for key in ("recv_rate", "sent_rate", "lat_p50_us", "lat_p99_us", "broker_cpu_pct", "cpu_us_per_msg"):
            vals = [r[key] for r in ok if key in r]
            if vals:
                row[key] = statistics.median(vals)
        rates = [r["recv_rate"] for r in ok]
        if rates:
            row["min"], row["max"] = min(rates), max(rates)
        rows.append(row)
    ref = {r["scenario"]: r.get("recv_rate") for r in rows if r["target"] == "rabbitmq"}
    for r in rows:
        if ref.get(r["scenario"]) and r["target"] != "rabbitmq" and r.get("recv_rate"):
            r["vs_rabbit"] = r["recv_rate"] / ref[r["scenario"]]
    return rows


def markdown(rows):
    head = ("| scenario | target | recv msg/s | min..max | vs RabbitMQ | p50 ms | p99 ms | broker CPU % "
            "| CPU µs/msg | runs |")
    out = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(row, k, fmt):
        return fmt % row[k] if k in row else "-"

    for r in rows:
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["scenario"], r["target"], f(r, "recv_rate", "%.0f"),
            ("%.0f..%.0f" % (r["min"], r["max"])) if "min" in r else "-",
            f(r, "vs_rabbit", "%.2fx"),
            ("%.2f" % (r["lat_p50_us"] / 1000.0)) if "lat_p50_us" in r else "-",
            ("%.2f" % (r["lat_p99_us"] / 1000.0)) if "lat_p99_us" in r else "-",
            f(r, "broker_cpu_pct", "%.0f"), f(r, "cpu_us_per_msg", "%.1f"),
            "%d%s" % (r["ok"], " (%d failed)" % r["failed"] if r["failed"] else "")))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--scenarios", default="pairs1,pairs4,fanout4,persist")
    ap.add_argument("--targets", default="rabbitmq,otter-1,otter-2n-cross,otter-2n-local")
    ap.add_argument("--rabbit", default=benchrun.DEFAULT_RABBIT)
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"),
                    help="the interpreter of the otter_tx nodes")
    ap.add_argument("--repo", default=REPO,
                    help="the otter_tx checkout the cluster nodes run (first on PYTHONPATH; for before/after)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--hold", type=float, default=0,
                    help="with --targets otter-2n-*: print the node pids and wait this many seconds "
                         "before the first round (to attach a profiler)")
    ap.add_argument("--fresh-cluster", action="store_true",
                    help="start a new 2-node cluster for every otter-2n run (see docs/performance.md)")
    a = ap.parse_args(argv)
    a.python = os.path.abspath(a.python)
    a.repo = os.path.abspath(a.repo)
    if not os.path.exists(PERF):
        subprocess.run(["sh", benchrun.BUILD], check=True)
    scenarios = a.scenarios.split(",")
    targets = a.targets.split(",")
    brokers = {}
    single = cluster = None
    try:
        if "rabbitmq" in targets:
            conn = benchrun.parseUrl(a.rabbit)
            pid = benchrun.listeningPid(conn["port"])
            brokers["rabbitmq"] = ([a.rabbit], "single", cpuOf([pid]) if pid else None)
        if "otter-1" in targets:
            single = benchrun.OtterProcess(python=a.python)
            url = single.start()
            brokers["otter-1"] = ([url], "single", cpuOf([single.proc.pid]))
        if any(t.startswith("otter-2n") for t in targets) and not a.fresh_cluster:
            cluster = Cluster(a.python, 2, a.repo).start()
            for t in targets:
                if t.startswith("otter-2n"):
                    brokers[t] = (cluster.urls(), t.rsplit("-", 1)[1], cpuOf(cluster.pids()))
            if a.hold:
                log("node pids: %s; waiting %.0f s" % (cluster.pids(), a.hold))
                time.sleep(a.hold)
        runs = []
        n = 0
        for rnd in range(a.rounds):
            order = targets if rnd % 2 == 0 else list(reversed(targets))
            for scen in scenarios:
                for t in order:
                    if t == "otter-2n-local" and SCENARIOS[scen].get("fanout"):
                        continue  # the same layout as otter-2n-cross
                    fresh = None
                    if t.startswith("otter-2n") and a.fresh_cluster:
                        # a cluster of its own for every run: an overloaded
                        # cross-node run can cost the nodes their etcd lease
                        fresh = Cluster(a.python, 2, a.repo).start()
                        brokers[t] = (fresh.urls(), t.rsplit("-", 1)[1], cpuOf(fresh.pids()))
                    urls, placement, cpu = brokers[t]
                    n += 1
                    tag = "cb%d-%s-r%d" % (os.getpid(), scen, n)
                    try:
                        r = runOnce(scen, urls, placement, a.seconds, cpu, tag, 1000 * n)
                    except Exception as e:  # a broker that went away: record, go on
                        r = {"status": "error", "recv_rate": 0, "errors": [repr(e)]}
                    finally:
                        if fresh is not None:
                            fresh.stop()
                    r.update(scenario=scen, target=t, round=rnd)
                    log("round %d %-8s %-16s %s recv %.0f msg/s p50 %s p99 %s cpu %s%% %s µs/msg %s" % (
                        rnd, scen, t, r["status"], r["recv_rate"], r.get("lat_p50_us"), r.get("lat_p99_us"),
                        r.get("broker_cpu_pct"), r.get("cpu_us_per_msg"), r.get("errors", "")))
                    runs.append(r)
        rows = summarise(runs)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"runs": runs, "rows": rows}, f, indent=1)
        print(markdown(rows))
    finally:
        if single is not None:
            single.stop()
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
