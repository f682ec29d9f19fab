"""
Stream protocol throughput on a 3-node cluster: otter_tx (``LocalCluster``)
beside RabbitMQ 3.10 (``rabbitmq-cluster.sh``), interleaved (issue 23;
docs/performance.md, "The stream protocol on a 3-node cluster").

    .venv-test/bin/python bench/stream_cluster.py                    # both; otter_tx's cluster started here
    .venv-test/bin/python bench/stream_cluster.py --targets otter --otter-ports 5552,5553,5554   # running nodes
    .venv-test/bin/python bench/stream_cluster.py --targets rabbit --sizes 12 --publishers 1
    .venv-test/bin/python bench/stream_cluster.py --targets base,otter,rabbit --base-root /tmp/base  # before/after

Each round creates a fresh stream through the stream protocol's create
command on node 1 with ``initial-cluster-size`` 3 (so node 1 leads it, both
brokers' default locator being client-local), waits until the metadata
command names its leader and two replicas, then runs
``bench/stream_protocol.py``'s publishers against the leader's stream port
(``--publishers`` processes, publish frames of ``--batch`` messages, at most
``--window`` unconfirmed each; a confirm means every in-sync member holds
the messages) and its consumer (credit 10, one back per chunk, from the
first offset) on the leader's port and on a replica's, each ``--consumes``
times (the median). Then the stream is deleted. Scenarios x targets are
interleaved ``--rounds`` times; medians are printed.

otter_tx: ``python -m otter_tx.cluster.local --nodes 3`` is started unless
``--otter-ports`` names running nodes' stream ports (node 1 first); its nodes'
pids are printed (for py-spy). ``--otter-python`` runs the nodes on another
interpreter.

RabbitMQ: the cluster of ``/work/shared/tools/rabbitmq-cluster.sh`` (started
beforehand, as root). That script does not enable rabbitmq_stream: unless
its ports (``--rabbit-ports``, default 5591,5592,5593) already accept
connections, each node is given its own listener and advertised
host/port (``application:set_env`` through ``ctl N eval``, after loading
the application so its defaults do not override them) and the plugin is
enabled with ``rabbitmq-plugins`` under that script's environment.
"""

import argparse
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import stream_protocol as sp  # noqa: E402

from otter_tx.stream import wire  # noqa: E402

RMQ_SCRIPT = "/work/shared/tools/rabbitmq-cluster.sh"
RMQ_BASE = os.environ.get("RMQ_CLUSTER_DIR", "/tmp/rmq-cluster")
RMQ_EPMD_PORT = os.environ.get("RMQ_CLUSTER_EPMD_PORT", "24369")
RMQ_BIN = "/usr/lib/rabbitmq/bin"


def portOpen(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def metadata(c, stream):
    """(leader port, [replica ports]) of ``stream`` from the metadata command, or None."""
    body = c.callBody(wire.METADATA, struct.pack(">I", 1) + wire.encodeString(stream))
    pos = 8
    (nb,) = struct.unpack_from(">I", body, pos)
    pos += 4
    brokers = {}
    for _ in range(nb):
        ref, hl = struct.unpack_from(">Hh", body, pos)
        pos += 4 + hl
        (port,) = struct.unpack_from(">I", body, pos)
        pos += 4
        brokers[ref] = port
    pos += 4  # one stream
    (nl,) = struct.unpack_from(">h", body, pos)
    pos += 2 + nl
    code, leader, nr = struct.unpack_from(">HHI", body, pos)
    pos += 8
    if code != wire.OK:
        return None
    replicas = [brokers[r] for r in struct.unpack_from(">%dH" % nr, body, pos)]
    return brokers.get(leader), replicas


def run(ports, messages, size, publishers, batch, window, consumes, members=3):
    """One scenario on one cluster (``ports``: its nodes' stream ports, node 1 first)."""
    stream = "bench-%d-%d" % (os.getpid(), time.monotonic_ns())
    admin = sp.Conn(ports[0])
    admin.handshake()
    args = wire.encodeStringMap({"initial-cluster-size": str(members)})
    code = admin.call(wire.CREATE_STREAM, wire.encodeString(stream) + args)
    assert code == wire.OK, code
    deadline = time.time() + 60
    while True:
        md = metadata(admin, stream)
        if md is not None and md[0] is not None and len(md[1]) >= members - 1:
            break
        if time.time() > deadline:
            raise RuntimeError("stream %s: metadata %r after 60 s" % (stream, md))
        time.sleep(0.1)
    leader, replicas = md
    total, pubElapsed = sp.publishAll(leader, stream, messages, size, publishers, batch, window)
    conLeader = statistics.median(sp.consume(leader, stream, total) for _ in range(consumes))
    conReplica = statistics.median(sp.consume(replicas[0], stream, total) for _ in range(consumes))
    admin.call(wire.DELETE_STREAM, wire.encodeString(stream))
    admin.sock.close()
    return total / pubElapsed, total / conLeader, total / conReplica, leader, replicas


# --- otter_tx ----------------------------------------------------------------

_NODE_LINE = re.compile(r"^(otter\d+): amqp \S+  stream 127\.0\.0\.1:(\d+) .* pid (\d+)")


def startOtter(nodes=3, python=None, root=ROOT):
    """``python -m otter_tx.cluster.local`` of the checkout ``root``; (process, [stream ports], [pids])."""
    python = python or sys.executable
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([python, "-u", "-m", "otter_tx.cluster.local", "--nodes", str(nodes)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=root, env=env,
                            start_new_session=True)
    ports, pids = [], []
    deadline = time.time() + 120
    lines = []
    while len(ports) < nodes:
        line = proc.stdout.readline().decode("utf-8", "replace")
        if not line or time.time() > deadline:
            stopOtter(proc)
            raise SystemExit("the otter_tx cluster did not start:\n" + "".join(lines[-40:]))
        lines.append(line)
        m = _NODE_LINE.match(line)
        if m:
            ports.append(int(m.group(2)))
            pids.append(int(m.group(3)))
    print("otter_tx cluster: stream ports %s, pids %s" % (ports, pids), flush=True)
    return proc, ports, pids


def stopOtter(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# --- RabbitMQ ----------------------------------------------------------------

def _rmqEnv(n):
    return ["runuser", "-u", "rabbitmq", "--", "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
            "LC_ALL=C.UTF-8", "ERL_EPMD_ADDRESS=127.0.0.1", "ERL_EPMD_PORT=%s" % RMQ_EPMD_PORT,
            "HOME=%s/c%d/home" % (RMQ_BASE, n),
            "RABBITMQ_ENABLED_PLUGINS_FILE=%s/c%d/enabled_plugins" % (RMQ_BASE, n)]


def rabbitStreams(ports):
    """Give RabbitMQ's cluster nodes a stream listener each (``ports``), unless they have one."""
    for n, port in enumerate(ports, 1):
        if portOpen(port):
            continue
        plugins = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins"
        expr = ("[code:add_pathz(P) || P <- filelib:wildcard(\"%s/rabbitmq_stream*/ebin\")], "
                "application:load(rabbitmq_stream_common), application:load(rabbitmq_stream), "
                "application:set_env(rabbitmq_stream, tcp_listeners, [%d]), "
                "application:set_env(rabbitmq_stream, advertised_host, <<\"127.0.0.1\">>), "
                "application:set_env(rabbitmq_stream, advertised_port, %d)." % (plugins, port, port))
        subprocess.run([RMQ_SCRIPT, "ctl", str(n), "eval", expr], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(_rmqEnv(n) + [RMQ_BIN + "/rabbitmq-plugins", "-n", "c%d@localhost" % n, "enable",
                                     "rabbitmq_stream"], check=True, cwd=RMQ_BASE, stdout=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not portOpen(port):
            if time.time() > deadline:
                raise SystemExit("RabbitMQ node c%d: no stream listener on %d" % (n, port))
            time.sleep(0.5)
        print("RabbitMQ c%d@localhost: stream port %d" % (n, port), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="otter,rabbit")
    ap.add_argument("--otter-ports", default=None, help="running otter_tx nodes' stream ports (else a cluster "
                                                        "is started)")
    ap.add_argument("--otter-python", default=None, help="the nodes' interpreter (default: this one)")
    ap.add_argument("--base-root", default=None,
                    help="another checkout (e.g. a git archive of an older commit): target 'base' is an otter_tx "
                         "cluster started from it, to compare with 'otter' (this checkout)")
    ap.add_argument("--rabbit-ports", default="5591,5592,5593")
    ap.add_argument("--messages", type=int, default=500000, help="12 B messages a run (1 KiB: a fifth)")
    ap.add_argument("--sizes", default="12,1024")
    ap.add_argument("--publishers", default="1,3")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--window", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--consumes", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0,
                    help="seconds to wait after starting the cluster (to attach a profiler)")
    args = ap.parse_args()
    targets = args.targets.split(",")
    clusters = {}
    procs = []
    if "rabbit" in targets:
        clusters["rabbit"] = [int(p) for p in args.rabbit_ports.split(",")]
        rabbitStreams(clusters["rabbit"])
    results = {}
    try:
        if "otter" in targets:
            if args.otter_ports:
                clusters["otter"] = [int(p) for p in args.otter_ports.split(",")]
            else:
                proc, clusters["otter"], _ = startOtter(3, args.otter_python)
                procs.append(proc)
        if "base" in targets:
            proc, clusters["base"], _ = startOtter(3, args.otter_python, os.path.abspath(args.base_root))
            procs.append(proc)
        if args.pause:
            time.sleep(args.pause)
        for rnd in range(args.rounds):
            for size in [int(s) for s in args.sizes.split(",")]:
                for pubs in [int(p) for p in args.publishers.split(",")]:
                    messages = args.messages if size < 1000 else max(args.messages // 5, 1000)
                    for t in targets:
                        pub, cl, cr, leader, replicas = run(clusters[t], messages, size, pubs, args.batch,
                                                            args.window, args.consumes)
                        results.setdefault((size, pubs, t), []).append((pub, cl, cr))
                        print("round %d size %5d publishers %d %-6s publish %9.0f  consume leader %10.0f  "
                              "replica %10.0f msg/s  (leader :%d, replicas %s)"
                              % (rnd + 1, size, pubs, t, pub, cl, cr, leader, replicas), flush=True)
    finally:
        for proc in procs:
            stopOtter(proc)
    print("\nmedians (msg/s)")
    print("%6s %10s %-6s %12s %15s %16s" % ("size", "publishers", "target", "publish", "consume leader",
                                             "consume replica"))
    for (size, pubs, t), rs in sorted(results.items()):
        print("%6d %10d %-6s %12.0f %15.0f %16.0f" % (size, pubs, t, statistics.median(r[0] for r in rs),
                                                      statistics.median(r[1] for r in rs),
                                                      statistics.median(r[2] for r in rs)))


if __name__ == "__main__":
    main()
