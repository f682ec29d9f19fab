#!/usr/bin/env python3
"""
Replicated quorum queues on a 3-node cluster (issue 22): the same
measurements on RabbitMQ 3.10 (``/work/shared/tools/rabbitmq-cluster.sh``)
and on otter_tx (:class:`otter_tx.cluster.local.LocalCluster`).

1. ``throughput``: confirmed publishing to one 3-member quorum queue
   (declared on node 1) with ``bench/amqp-perf`` (1 producer with
   ``--confirm``, 1 consumer, both on one node), connected to the leader's
   node and to a non-leader node, interleaved over ``--perf-rounds``:
   msg/s (confirmed and received) and end-to-end latency percentiles.
2. ``failover``: a publisher with confirms (a fixed ``--rate``, pipelined)
   on one surviving node and an acking consumer on the other; the leader's
   node is SIGKILLed.  Measured from the kill: the first confirm of a
   publish sent after the kill, the first delivery (of any message, and of
   one published after the kill), and the first management answer (from a
   surviving node) that names a new leader.  Nacks, publishes never
   confirmed (within ``--confirm-timeout``) and channel errors are counted.
   The killed node is started again between rounds and the next round waits
   until it is back in the queue's ``online`` list.
3. ``catchup``: one follower killed, ``--catchup-messages`` 16-byte messages
   published with confirms (amqp-perf, to the leader's node), the follower
   started again; from the start command: the follower in the queue's
   ``online`` list, and in sync.  On RabbitMQ "in sync" is its Raft log
   index equal to the leader's, read on the leader's node by an Erlang loop
   (``rabbit_quorum_queue:status/2``, what ``rabbitmq-queues
   quorum_status`` prints) run through ``rabbitmq-cluster.sh ctl N eval``
   every 10 ms; on otter_tx ``online`` is defined as the in-sync members,
   so both times are the same unless its queue JSON says otherwise.

``--queue-type stream`` (issue 23) measures the same on a 3-member stream
(``x-queue-type: stream``, ``x-initial-cluster-size: 3``): each throughput
run and failover round gets a new stream (a stream cannot be purged), the
consumers give a prefetch, ack manually and read from ``x-stream-offset:
next`` (after a ``basic.cancel``, from the offset after the last one they
got); amqp-perf's consumer reads from ``next``, started before its
producer.  On RabbitMQ "in sync" is the follower's offset equal to the
writer's, read with ``rabbit_stream_queue:status/2`` (``rabbitmq-streams
stream_status``); its stream JSON has no ``leader`` (the writer's node is
``node``) and its ``members`` / ``online`` come from its stats, emitted
every 5 s, so they lag behind a kill or a restart.

Both brokers are read through the same queue JSON fields
(``GET /api/queues/%2F/NAME``: ``leader``, ``members``, ``online``); node
names differ (``c1@localhost`` / ``otter1``), so nodes are matched by index.

Output: progress on stderr; a human table and one ``JSON {...}`` line on
stdout (``--json PATH`` writes the JSON to a file too).

    sh bench/build-perf.sh
    # RabbitMQ (as root: the script starts and stops the cluster itself)
    .venv-test/bin/python bench/quorum_cluster.py --broker rabbitmq --rounds 3
    # otter_tx (a LocalCluster of 3 nodes and a 3-member etcd, removed at the end)
    .venv-test/bin/python bench/quorum_cluster.py --broker otter --rounds 3
    # one part only, a running RabbitMQ cluster left running
    .venv-test/bin/python bench/quorum_cluster.py --broker rabbitmq --parts failover --no-start --keep
    # replicated streams instead of quorum queues
    .venv-test/bin/python bench/quorum_cluster.py --broker otter --queue-type stream

Every wait is bounded; processes started here (cluster nodes, amqp-perf,
rabbitmqctl) are ended on exit.
"""

import argparse
import asyncio
import base64
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

DEFAULT_RABBIT_SCRIPT = "/work/shared/tools/rabbitmq-cluster.sh"
PERF = os.path.join(HERE, "amqp-perf")
QQ_ARGS = {"x-queue-type": "quorum"}
#: --queue-type stream: a 3-member stream (RabbitMQ 3.10's default is every node; said anyway)
STREAM_ARGS = {"x-queue-type": "stream", "x-initial-cluster-size": 3}
#: the arguments queues are declared with, and their names' prefix (set by main from --queue-type)
QUEUE = {"args": QQ_ARGS, "prefix": "qq", "stream": False}


def setQueueType(kind):
    QUEUE.update(args=STREAM_ARGS if kind == "stream" else QQ_ARGS, prefix="sq" if kind == "stream" else "qq",
                 stream=kind == "stream")


def log(msg):
    sys.stderr.write("[%s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


class Children:
    """Process groups started here, ended (SIGKILL to the group) on exit."""

    def __init__(self):
        self.procs = []
        self.lock = threading.Lock()

    def popen(self, args, **kw):
        p = subprocess.Popen(args, start_new_session=True, **kw)
        with self.lock:
            self.procs.append(p)
        return p

    def reap(self, p):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        with self.lock:
            if p in self.procs:
                self.procs.remove(p)

    def reapAll(self):
        for p in list(self.procs):
            self.reap(p)


CHILDREN = Children()


def run(args, timeout, **kw):
    """Run to the end within ``timeout`` s (its process group killed after): (rc, output)."""
    p = CHILDREN.popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        CHILDREN.reap(p)
        raise RuntimeError("%s: no answer in %s s" % (" ".join(args[:3]), timeout))
    CHILDREN.reap(p)
    return p.returncode, out.decode("utf-8", "replace")


class Handle:
    """A background operation (a node starting): ``wait(timeout)`` -> True when done."""

    def __init__(self):
        self.event = threading.Event()
        self.error = None
        self.finished = None

    def done(self, error=None):
        self.error = error
        self.finished = time.monotonic()
        self.event.set()

    def wait(self, timeout):
        if not self.event.wait(timeout):
            return False
        if self.error:
            raise RuntimeError(self.error)
        return True


# --- the two clusters, one interface -------------------------------------------------------------

class RabbitCluster:
    """The 3-node RabbitMQ 3.10 cluster of ``rabbitmq-cluster.sh`` (nodes c1..c3)."""

    broker = "rabbitmq"

    def __init__(self, script, base, noStart, keep):
        self.script = script
        self.base = base
        self.noStart = noStart
        self.keep = keep
        self.started = False

    def name(self, i):
        return "c%d@localhost" % (i + 1,)

    def amqpPort(self, i):
        return 5701 + i

    def mgmtPort(self, i):
        return 15701 + i

    def start(self):
        if self.noStart:
            return
        log("starting the RabbitMQ cluster (%s start)" % (self.script,))
        rc, out = run([self.script, "start"], 900)
        if rc != 0:
            raise RuntimeError("rabbitmq-cluster.sh start failed:\n" + out)
        self.started = True
        log(out.strip().splitlines()[-1])

    def stop(self):
        if self.started and not self.keep:
            log("stopping the RabbitMQ cluster")
            run([self.script, "stop"], 300)

    def beamPid(self, i):
        """Node i's beam.smp (as rabbitmq-cluster.sh's beam_pid finds it), or None."""
        home = " -home %s/c%d/home " % (self.base, i + 1)
        want = b"RABBITMQ_NODENAME=" + self.name(i).encode()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    argv = f.read().split(b"\0")
                if not argv or not argv[0].endswith(b"beam.smp"):
                    continue
                args = " ".join(a.decode("utf-8", "replace") for a in argv) + " "
                if home not in args or " -s rabbit boot " not in args or "epmd-starter" in args:
                    continue
                with open("/proc/%s/environ" % d, "rb") as f:
                    if want in f.read().split(b"\0"):
                        return int(d)
            except OSError:
                continue
        return None

    def kill(self, i):
        """SIGKILL node i; the monotonic time of the signal (returns once the process is gone)."""
        pid = self.beamPid(i)
        if pid is None:
            raise RuntimeError("%s: no beam.smp found" % (self.name(i),))
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        deadline = t + 10
        while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().split(") ", 1)[1].startswith("Z"):
                        break
            except OSError:
                break
            time.sleep(0.005)
        return t

    def restart(self, i):
        """Start node i again on its data (``rabbitmq-cluster.sh restart``); a :class:`Handle`."""
        h = Handle()
        p = CHILDREN.popen([self.script, "restart", str(i + 1)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)

        def waiter():
            out = p.communicate()[0].decode("utf-8", "replace")
            CHILDREN.reap(p)
            h.done(None if p.returncode == 0 else "restart %d failed: %s" % (i + 1, out))

        threading.Thread(target=waiter, daemon=True).start()
        return h

    def ctl(self, i, *args, timeout=60):
        return run([self.script, "ctl", str(i + 1)] + list(args), timeout)

    def syncProbe(self, leader, follower, queue, limitS):
        """
        Start, on the leader's node, an Erlang loop reading rabbit_quorum_queue:status/2 every
        10 ms; it prints the wall-clock ms when ``follower`` is first a running Raft member
        (state follower) and when its log index first equals the leader's.  A :class:`Handle`
        with ``.result`` = dict(up_ms, sync_ms, leader_index, follower_index) or None.
        """
        if QUEUE["stream"]:
            expr = self._streamSyncExpr(follower, queue, limitS)
        else:
            expr = self._quorumSyncExpr(follower, queue, limitS)
        return self._probe(leader, expr, limitS)

    def _streamSyncExpr(self, follower, queue, limitS):
        """
        A stream's: rabbit_stream_queue:status/2 (what ``rabbitmq-streams
        stream_status`` prints) every 10 ms; up = the follower's row has an
        offset, in sync = that offset reached the writer's (its last written: nothing is
        published then; its committed_offset lags behind it).
        """
        return ("Q = <<\"%s\">>, F = '%s', Dl = erlang:system_time(millisecond) + %d, "
                "G = fun(Rows, Pred, K) -> case [proplists:get_value(K, R) || R <- Rows, Pred(R)] "
                "of [V | _] -> V; _ -> undefined end end, "
                "IsF = fun(R) -> proplists:get_value(node, R) =:= F end, "
                "IsL = fun(R) -> proplists:get_value(role, R) =:= writer end, "
                "L = fun Loop(Up) -> Now = erlang:system_time(millisecond), "
                "case Now > Dl of true -> {timeout, Up}; false -> "
                "Rows0 = try rabbit_stream_queue:status(<<\"/\">>, Q) catch _:_ -> [] end, "
                "Rows = case is_list(Rows0) of true -> Rows0; false -> [] end, "
                "FI = G(Rows, IsF, offset), LI = G(Rows, IsL, offset), "
                "Up2 = case {Up, is_integer(FI)} of {undefined, true} -> Now; _ -> Up end, "
                "case is_integer(FI) andalso is_integer(LI) andalso FI >= LI of "
                "true -> {sync, Up2, Now, LI, FI}; "
                "false -> timer:sleep(10), Loop(Up2) end end end, "
                "L(undefined)." % (queue, self.name(follower), int(limitS * 1000)))

    def _quorumSyncExpr(self, follower, queue, limitS):
        return ("Q = <<\"%s\">>, F = '%s', Dl = erlang:system_time(millisecond) + %d, "
                "G = fun(Rows, Pred, K) -> case [proplists:get_value(K, R) || R <- Rows, Pred(R)] "
                "of [V | _] -> V; _ -> undefined end end, "
                "IsF = fun(R) -> proplists:get_value(<<\"Node Name\">>, R) =:= F end, "
                "IsL = fun(R) -> proplists:get_value(<<\"Raft State\">>, R) =:= leader end, "
                "L = fun Loop(Up) -> Now = erlang:system_time(millisecond), "
                "case Now > Dl of true -> {timeout, Up}; false -> "
                "Rows = try rabbit_quorum_queue:status(<<\"/\">>, Q) catch _:_ -> [] end, "
                "St = G(Rows, IsF, <<\"Raft State\">>), FI = G(Rows, IsF, <<\"Log Index\">>), "
                "LI = G(Rows, IsL, <<\"Log Index\">>), "
                "Up2 = case {Up, St} of {undefined, follower} -> Now; _ -> Up end, "
                "case St =:= follower andalso is_integer(FI) andalso is_integer(LI) andalso FI >= LI of "
                "true -> {sync, Up2, Now, LI, FI}; "
                "false -> timer:sleep(10), Loop(Up2) end end end, "
                "L(undefined)." % (queue, self.name(follower), int(limitS * 1000)))

    def _probe(self, leader, expr, limitS):
        h = Handle()
        h.result = None
        p = CHILDREN.popen([self.script, "ctl", str(leader + 1), "eval", expr], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)

        def waiter():
            try:
                out = p.communicate(timeout=limitS + 30)[0].decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                CHILDREN.reap(p)
                h.done("the sync probe did not end")
                return
            CHILDREN.reap(p)
            m = re.search(r"\{sync,(\w+),(\d+),(\d+),(\d+)\}", out.replace(" ", "").replace("\n", ""))
            if m:
                h.result = dict(up_ms=None if m.group(1) == "undefined" else int(m.group(1)),
                                sync_ms=int(m.group(2)), leader_index=int(m.group(3)),
                                follower_index=int(m.group(4)))
                h.done()
            else:
                h.done("sync probe: " + out.strip()[-500:])

        threading.Thread(target=waiter, daemon=True).start()
        return h


class OtterCluster:
    """
    otter_tx's :class:`LocalCluster` (otter1..3, a 3-member etcd), run on a Twisted reactor in
    the main thread while the benchmark runs in a worker thread (:func:`blockingCallFromThread`).
    """

    broker = "otter"

    def __init__(self, reactor, etcdMembers, python, nodeArgs, dataDir):
        self.reactor = reactor
        self.etcdMembers = etcdMembers
        self.python = python
        self.nodeArgs = nodeArgs
        self.dataDir = dataDir
        self.cluster = None

    def _call(self, f, *a):
        from twisted.internet.threads import blockingCallFromThread
        return blockingCallFromThread(self.reactor, f, *a)

    def name(self, i):
        return self.cluster.nodes[i].name

    def amqpPort(self, i):
        return self.cluster.nodes[i].amqpPort

    def mgmtPort(self, i):
        return self.cluster.nodes[i].managementPort

    def start(self):
        from twisted.internet import defer

        from otter_tx.cluster.local import LocalCluster
        self.cluster = LocalCluster(self.reactor, nodes=3, etcdMembers=self.etcdMembers, dataDir=self.dataDir,
                                    extraArgs=self.nodeArgs, python=self.python)
        log("starting an otter_tx LocalCluster (3 nodes, %d etcd members) in %s" % (
            self.etcdMembers, self.cluster.top))

        def go():
            d = self.cluster.start()
            timeout = self.reactor.callLater(300, d.cancel)
            d.addBoth(lambda r: (timeout.active() and timeout.cancel(), r)[1])
            return d

        self._call(lambda: defer.maybeDeferred(go))
        for i in range(3):
            log("%s: amqp %d management %d" % (self.name(i), self.amqpPort(i), self.mgmtPort(i)))

    def stop(self):
        if self.cluster is not None:
            log("stopping the otter_tx cluster")
            c, self.cluster = self.cluster, None
            self._call(c.stop)

    def kill(self, i):
        node = self.cluster.nodes[i]
        if node.process is None or node.process.exited:
            raise RuntimeError("%s is not running" % (node.name,))
        t = time.monotonic()
        os.kill(node.pid, signal.SIGKILL)
        ended = threading.Event()
        self.reactor.callFromThread(lambda: node.process.ended.addBoth(lambda r: ended.set()))
        ended.wait(10)
        return t

    def restart(self, i):
        h = Handle()
        node = self.cluster.nodes[i]

        def go():
            d = node.start()
            d.addCallbacks(lambda r: h.done(), lambda f: h.done(f.getErrorMessage()))

        self.reactor.callFromThread(go)
        return h

    def syncProbe(self, leader, follower, queue, limitS):
        return None


# --- management API --------------------------------------------------------------------------------

def getQueue(cluster, i, queue, timeout=2.0):
    """The queue JSON from node i's management API, or None (an error or a timeout)."""
    url = "http://127.0.0.1:%d/api/queues/%%2F/%s" % (cluster.mgmtPort(i), urllib.parse.quote(queue, safe=""))
    req = urllib.request.Request(url)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


def nodeIndex(cluster, name):
    """The index of the node called ``name`` (exact, or before an ``@``), or None."""
    if not name:
        return None
    for i in range(3):
        n = cluster.name(i)
        if name == n or name.split("@")[0] == n.split("@")[0]:
            return i
    return None


def leaderName(q):
    """
    The leader's node in a queue JSON: ``leader`` (quorum queues; otter_tx's
    streams); RabbitMQ 3.10's stream JSON has none and names the writer's
    node as ``node`` (from its stats, a few seconds late after a change).
    """
    if not q:
        return None
    return q.get("leader") or (q.get("node") if q.get("type") == "stream" else None)


def onlineIndexes(cluster, q):
    return sorted(i for i in (nodeIndex(cluster, n) for n in (q or {}).get("online") or []) if i is not None)


def waitQueueState(cluster, via, queue, pred, timeout, interval=0.02):
    """Poll node ``via``'s queue JSON until ``pred(json)``: (monotonic time, json), or (None, last)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        q = getQueue(cluster, via, queue)
        if q is not None:
            last = q
            if pred(q):
                return time.monotonic(), q
        time.sleep(interval)
    return None, last


def waitAllOnline(cluster, queue, timeout, vias=(0, 1, 2)):
    """Wait until some node's queue JSON names a leader and all 3 members online: the leader's index."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for v in vias:
            q = getQueue(cluster, v, queue)
            if q and nodeIndex(cluster, leaderName(q)) is not None and onlineIndexes(cluster, q) == [0, 1, 2]:
                return nodeIndex(cluster, leaderName(q))
        time.sleep(0.1)
    raise RuntimeError("queue %s: not all 3 members online after %s s" % (queue, timeout))


def declare(cluster, i, queue, purge=False):
    import pika
    c = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.amqpPort(i), heartbeat=0, socket_timeout=10, blocked_connection_timeout=60))
    try:
        ch = c.channel()
        ch.queue_declare(queue, durable=True, arguments=QUEUE["args"])
        if purge:
            ch.queue_purge(queue)
    finally:
        c.close()


def freshQueue(cluster, base, tag, old=None):
    """
    An empty queue for the next run, declared on node 1: ``base`` purged
    (a quorum queue), or a new stream ``base-tag`` (a stream cannot be
    purged; ``old`` is deleted first).  Its name.
    """
    if not QUEUE["stream"]:
        declare(cluster, 0, base, purge=True)
        return base
    if old is not None:
        deleteQueue(cluster, 0, old)
    name = "%s-%s" % (base, tag)
    declare(cluster, 0, name)
    return name


def deleteQueue(cluster, i, queue):
    import pika
    try:
        c = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", cluster.amqpPort(i), heartbeat=0, socket_timeout=10))
        c.channel().queue_delete(queue)
        c.close()
    except Exception as e:  # noqa: BLE001 - cleanup only
        log("deleting %s: %r" % (queue, e))


def url(cluster, i):
    return "amqp://guest:guest@127.0.0.1:%d/%%2f" % (cluster.amqpPort(i),)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# --- 1. throughput ---------------------------------------------------------------------------------

def perfSummary(out):
    for line in out.splitlines():
        if line.startswith("SUMMARY "):
            return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return None


def runPerf(cluster, i, queue, a, label, extra=(), timeout=None):
    args = [PERF, "--uri", url(cluster, i), "-u", queue, "-p", "--persistent", "-s", str(a.size),
            "--quiet", "--id", label] + list(extra)
    rc, out = run(args, timeout)
    s = perfSummary(out)
    if s is None:
        raise RuntimeError("amqp-perf (%s) printed no SUMMARY (rc %s):\n%s" % (label, rc, out[-2000:]))
    return s


def throughput(cluster, a):
    queue = base = QUEUE["prefix"] + "-perf"
    if QUEUE["stream"]:
        queue = freshQueue(cluster, base, "0")
    else:
        declare(cluster, 0, queue)
    leader = waitAllOnline(cluster, queue, 120)
    other = (leader + 1) % 3
    log("throughput: %s declared on %s, leader %s" % (queue, cluster.name(0), cluster.name(leader)))
    runs = {"leader": [], "non-leader": []}
    order = [("leader", leader), ("non-leader", other)]
    for r in range(a.perf_rounds):
        for label, i in (order if r % 2 == 0 else order[::-1]):
            queue = freshQueue(cluster, base, "%s-%d" % (label, r + 1), queue)
            if QUEUE["stream"]:
                # (a new stream: its leader is where node 1 placed it, its members all in online)
                leaderNow = waitAllOnline(cluster, queue, 120)
                i = leaderNow if label == "leader" else (leaderNow + 1) % 3
            # (a stream consumer needs a prefetch; it reads from "next", started before the producer)
            prefetch = ["-q", str(a.prefetch)] if QUEUE["stream"] else []
            s = runPerf(cluster, i, queue, a, "%s-%d" % (label, r + 1),
                        ["-x", "1", "-y", "1", "-c", str(a.perf_confirm), "-z", str(a.seconds)] + prefetch,
                        timeout=a.seconds + 120)
            row = dict(node=cluster.name(i), confirm_rate=float(s.get("confirm_rate", 0)),
                       recv_rate=float(s.get("recv_rate", 0)), nacked=int(s.get("nacked", 0)),
                       status=s.get("status"))
            for p in ("p50", "p95", "p99", "p999", "max"):
                v = s.get("lat_%s_us" % p)
                row["lat_%s_ms" % p] = float(v) / 1000 if v not in (None, "") else None
            runs[label].append(row)
            log("throughput %s (%s) round %d: %.0f confirmed msg/s, %.0f received msg/s, p50 %s ms, p99 %s ms" % (
                label, row["node"], r + 1, row["confirm_rate"], row["recv_rate"], row["lat_p50_ms"],
                row["lat_p99_ms"]))
    deleteQueue(cluster, 0, queue)
    summary = {}
    for label, rows in runs.items():
        summary[label] = {k: med([x[k] for x in rows]) for k in (
            "confirm_rate", "recv_rate", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "lat_p999_ms", "lat_max_ms")}
        summary[label]["node"] = rows[0]["node"] if rows else None
        summary[label]["nacked"] = sum(x["nacked"] for x in rows)
        summary[label]["runs"] = rows
    return summary


# --- 2. failover -----------------------------------------------------------------------------------

class FailoverClients:
    """A publisher with confirms (fixed rate, pipelined) and an acking consumer, on one asyncio loop."""

    def __init__(self, cluster, queue, pubNode, consNode, a):
        self.cluster = cluster
        self.queue = queue
        self.pubNode = pubNode
        self.consNode = consNode
        self.a = a
        self.sent = {}         # seq -> monotonic send time
        self.confirmed = {}    # seq -> monotonic confirm time
        self.nacked = {}       # seq -> time
        self.pubErrors = []
        self.deliveries = []   # (time, seq, redelivered)
        self.consErrors = []
        self.cancels = []      # times the broker cancelled the consumer (it consumes again at once)
        self.pubErrorCount = 0
        self.stopping = False
        self.pending = set()
        self.lastOffset = None  # a stream's: the last x-stream-offset delivered

    async def open(self):
        import aiormq
        self.pconn = await asyncio.wait_for(aiormq.connect(url(self.cluster, self.pubNode)), 15)
        self.pch = await asyncio.wait_for(self.pconn.channel(publisher_confirms=True), 15)
        self.cconn = await asyncio.wait_for(aiormq.connect(url(self.cluster, self.consNode)), 15)
        self.cch = await asyncio.wait_for(self.cconn.channel(publisher_confirms=False), 15)
        await asyncio.wait_for(self.cch.basic_qos(prefetch_count=self.a.prefetch), 15)
        self.cch.on_consumer_cancel_callbacks.add(self.onCancel)
        await self.consume()

    async def consume(self):
        args = None
        if QUEUE["stream"]:
            # from the next message; consuming again (after a basic.cancel), after the last one seen
            args = {"x-stream-offset": "next" if self.lastOffset is None else self.lastOffset + 1}
        await asyncio.wait_for(self.cch.basic_consume(self.queue, self.onMessage, no_ack=False, arguments=args), 15)

    async def onCancel(self, frame):
        """A basic.cancel from the broker (RabbitMQ does not send one here): recorded, and consume again."""
        self.cancels.append(time.monotonic())
        if not self.stopping:
            asyncio.ensure_future(self.consumeAgain())

    async def consumeAgain(self):
        try:
            await self.consume()
        except Exception as e:  # noqa: BLE001 - recorded
            if len(self.consErrors) < 5:
                self.consErrors.append((time.monotonic(), "consuming again: %r" % (e,)))

    async def onMessage(self, message):
        t = time.monotonic()
        body = message.body
        seq = int.from_bytes(body[:8], "big") if len(body) >= 8 else -1
        self.deliveries.append((t, seq, bool(message.delivery.redelivered)))
        if QUEUE["stream"]:
            offset = (message.header.properties.headers or {}).get("x-stream-offset")
            if isinstance(offset, int):
                self.lastOffset = offset
        try:
            await message.channel.basic_ack(message.delivery.delivery_tag)
        except Exception as e:  # noqa: BLE001 - recorded
            if len(self.consErrors) < 5:
                self.consErrors.append((time.monotonic(), repr(e)))

    async def publishOne(self, seq):
        from aiormq.exceptions import DeliveryError
        from pamqp import commands as spec
        body = seq.to_bytes(8, "big") + b"q" * max(0, self.a.size - 8)
        self.sent[seq] = time.monotonic()
        try:
            await self.pch.basic_publish(body, routing_key=self.queue,
                                         properties=spec.Basic.Properties(delivery_mode=2))
            self.confirmed[seq] = time.monotonic()
        except DeliveryError:
            self.nacked[seq] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - recorded
            self.pubErrorCount += 1
            if len(self.pubErrors) < 5:
                self.pubErrors.append((time.monotonic(), repr(e)))

    async def publisher(self):
        interval = 1.0 / self.a.rate
        seq = 0
        nextAt = time.monotonic()
        while not self.stopping:
            if len(self.sent) - len(self.confirmed) - len(self.nacked) < self.a.max_outstanding:
                seq += 1
                t = asyncio.ensure_future(self.publishOne(seq))
                self.pending.add(t)
                t.add_done_callback(self.pending.discard)
            nextAt += interval
            await asyncio.sleep(max(0.0, nextAt - time.monotonic()))
        return seq

    async def close(self):
        for conn in (self.pconn, self.cconn):
            try:
                await asyncio.wait_for(conn.close(), 5)
            except Exception:  # noqa: BLE001 - closing
                pass


def pollLeader(cluster, via, queue, oldLeader, deadline):
    """Poll node ``via`` until the queue JSON names a leader other than ``oldLeader``: (time, index)."""
    while time.monotonic() < deadline:
        q = getQueue(cluster, via, queue, timeout=1.0)
        if q is not None:
            li = nodeIndex(cluster, leaderName(q))
            if li is not None and li != oldLeader:
                return time.monotonic(), li
        time.sleep(0.01)
    return None, None


async def failoverRound(cluster, a, r, queue):
    loop = asyncio.get_running_loop()
    leader = await loop.run_in_executor(None, waitAllOnline, cluster, queue, 300)
    stalls = []
    for attempt in range(2):
        # (the second attempt swaps the two surviving nodes' roles)
        pubNode, consNode = (leader + 1 + attempt) % 3, (leader + 2 - attempt) % 3
        log("failover round %d: leader %s; publisher on %s, consumer on %s" % (
            r, cluster.name(leader), cluster.name(pubNode), cluster.name(consNode)))
        cl = FailoverClients(cluster, queue, pubNode, consNode, a)
        tOpen = time.monotonic()
        await cl.open()
        pubTask = asyncio.ensure_future(cl.publisher())
        # at least --warmup s of publishing, and confirms and deliveries flowing (at most --warmup-timeout s)
        await asyncio.sleep(a.warmup)
        while (not cl.confirmed or not cl.deliveries) and time.monotonic() < tOpen + a.warmup_timeout:
            await asyncio.sleep(0.05)
        if cl.confirmed and cl.deliveries:
            break
        stall = "publisher on %s, consumer on %s: %d confirmed, %d delivered in %.0f s before any kill" % (
            cluster.name(pubNode), cluster.name(consNode), len(cl.confirmed), len(cl.deliveries),
            time.monotonic() - tOpen)
        log("round %d: %s" % (r, stall))
        stalls.append(stall)
        cl.stopping = True
        await pubTask
        for t in list(cl.pending):
            t.cancel()
        await cl.close()
    else:
        raise RuntimeError("round %d: no confirms or no deliveries before the kill: %s" % (r, "; ".join(stalls)))
    firstDelivery = cl.deliveries[0][0] - tOpen
    tKill = await loop.run_in_executor(None, cluster.kill, leader)
    leaderF = loop.run_in_executor(None, pollLeader, cluster, pubNode, queue, leader, tKill + a.failover_timeout)

    def seen():
        return (any(t > tKill and cl.sent[s] > tKill for s, t in cl.confirmed.items())
                and any(t > tKill and cl.sent.get(s, 0) > tKill for t, s, _ in cl.deliveries))

    while time.monotonic() < tKill + a.failover_timeout and not (seen() and leaderF.done()):
        await asyncio.sleep(0.05)
    await asyncio.sleep(a.after)
    cl.stopping = True
    sentCount = await pubTask
    # every publish answered (confirm, nack or error), at most --confirm-timeout more
    deadline = time.monotonic() + a.confirm_timeout
    while cl.pending and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    unconfirmed = len(cl.pending)
    # the consumer drains what was confirmed
    deadline = time.monotonic() + 10
    while len({s for _, s, _ in cl.deliveries}) < len(cl.confirmed) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for t in list(cl.pending):
        t.cancel()
    await cl.close()
    tLeader, newLeader = await asyncio.wait_for(leaderF, a.failover_timeout + 5)

    def after(t):
        return None if t is None else round((t - tKill) * 1000, 1)

    postConfirms = [t for s, t in cl.confirmed.items() if cl.sent[s] > tKill]
    anyConfirms = [t for t in cl.confirmed.values() if t > tKill]
    postDeliveries = [t for t, s, _ in cl.deliveries if t > tKill and cl.sent.get(s, 0) > tKill]
    anyDeliveries = [t for t, _, _ in cl.deliveries if t > tKill]
    latAround = [cl.confirmed[s] - cl.sent[s] for s in cl.confirmed if abs(cl.sent[s] - tKill) < a.failover_timeout]
    delivered = {s for _, s, _ in cl.deliveries}
    res = dict(
        round=r, killed=cluster.name(leader), publisher_on=cluster.name(pubNode), consumer_on=cluster.name(consNode),
        new_leader=cluster.name(newLeader) if newLeader is not None else None,
        confirm_ms=after(min(postConfirms) if postConfirms else None),
        any_confirm_ms=after(min(anyConfirms) if anyConfirms else None),
        deliver_ms=after(min(postDeliveries) if postDeliveries else None),
        any_deliver_ms=after(min(anyDeliveries) if anyDeliveries else None),
        leader_ms=after(tLeader),
        max_confirm_latency_ms=round(max(latAround) * 1000, 1) if latAround else None,
        sent=sentCount, confirmed=len(cl.confirmed), nacked=len(cl.nacked), unconfirmed=unconfirmed,
        publish_errors=[e for _, e in cl.pubErrors], publish_error_count=cl.pubErrorCount,
        consumer_errors=[e for _, e in cl.consErrors],
        consumer_cancels_ms=[after(t) for t in cl.cancels],
        delivered=len(delivered), redelivered=sum(1 for _, _, rd in cl.deliveries if rd),
        first_delivery_after_open_s=round(firstDelivery, 3), warmup_stalls=stalls,
        confirmed_not_delivered=len(set(cl.confirmed) - delivered))
    log("round %d: first confirm of a post-kill publish %s ms (any confirm %s ms), first delivery %s ms "
        "(post-kill message %s ms), new leader %s in the API at %s ms; sent %d confirmed %d nacked %d "
        "unconfirmed %d, max confirm latency %s ms" % (
            r, res["confirm_ms"], res["any_confirm_ms"], res["any_deliver_ms"], res["deliver_ms"],
            res["new_leader"], res["leader_ms"], sentCount, res["confirmed"], res["nacked"], unconfirmed,
            res["max_confirm_latency_ms"]))
    # the killed node back, and in online again
    # (online is polled from the start command on: a node can be listed before its start script returns)
    tStart = time.monotonic()
    h = await loop.run_in_executor(None, cluster.restart, leader)
    onlineF = loop.run_in_executor(None, waitQueueState, cluster, pubNode, queue,
                                   lambda q: leader in onlineIndexes(cluster, q), a.restart_timeout, 0.05)
    ok = await loop.run_in_executor(None, h.wait, a.restart_timeout)
    if not ok:
        raise RuntimeError("%s not started again in %s s" % (cluster.name(leader), a.restart_timeout))
    tOnline, _ = await onlineF
    res["restart_boot_s"] = round(h.finished - tStart, 2)
    res["restart_online_s"] = round(tOnline - tStart, 2) if tOnline else None
    log("round %d: %s started again in %.1f s, in online at %s s" % (
        r, cluster.name(leader), res["restart_boot_s"], res["restart_online_s"]))
    return res


def failover(cluster, a):
    base = queue = QUEUE["prefix"] + "-failover"
    if QUEUE["stream"]:
        queue = freshQueue(cluster, base, "1")
    else:
        declare(cluster, 0, queue)
    rounds = []
    try:
        for r in range(1, a.rounds + 1):
            if r > 1:
                queue = freshQueue(cluster, base, str(r), queue)
            rounds.append(asyncio.run(failoverRound(cluster, a, r, queue)))
    finally:
        leader = None
        try:
            leader = waitAllOnline(cluster, queue, 60)
        except RuntimeError:
            pass
        deleteQueue(cluster, leader if leader is not None else 0, queue)
    keys = ("confirm_ms", "any_confirm_ms", "deliver_ms", "any_deliver_ms", "leader_ms", "max_confirm_latency_ms",
            "restart_online_s")
    summary = {k: med([x[k] for x in rounds]) for k in keys}
    summary.update({"max_" + k: max((x[k] for x in rounds if x[k] is not None), default=None) for k in keys[:5]})
    summary.update(nacked=sum(x["nacked"] for x in rounds), unconfirmed=sum(x["unconfirmed"] for x in rounds),
                   publish_errors=sum(x["publish_error_count"] for x in rounds),
                   consumer_cancels=sum(len(x["consumer_cancels_ms"]) for x in rounds),
                   warmup_stalls=sum(len(x["warmup_stalls"]) for x in rounds), rounds=rounds)
    return summary


# --- 3. catch-up -----------------------------------------------------------------------------------

def catchup(cluster, a):
    rounds = []
    for r in range(1, a.catchup_rounds + 1):
        res = catchupRound(cluster, a, (r - 1) % 3, "%s-catchup-%d" % (QUEUE["prefix"], r))
        res["round"] = r
        rounds.append(res)
    summary = {k: med([x.get(k) for x in rounds]) for k in (
        "publish_rate", "boot_s", "online_s", "raft_up_s", "sync_s")}
    summary.update(messages=a.catchup_messages, nacked=sum(x["nacked"] for x in rounds),
                   sync_how=rounds[0]["sync_how"], rounds=rounds)
    return summary


def catchupRound(cluster, a, declareOn, queue):
    """
    One follower's catch-up; the queue declared on node ``declareOn`` (the next round's follower differs).
    Each round has its own queue, and it has existed for ``--settle`` s before the kill: on RabbitMQ 3.10 a
    member killed at once after its queue was deleted and declared again under the same name stayed
    ``noproc`` after its node's restart (seen once here).
    """
    declare(cluster, declareOn, queue)
    leader = waitAllOnline(cluster, queue, 300)
    time.sleep(a.settle)
    follower = (leader + 2) % 3
    log("catch-up: leader %s; killing follower %s" % (cluster.name(leader), cluster.name(follower)))
    cluster.kill(follower)
    res = dict(leader=cluster.name(leader), follower=cluster.name(follower), messages=a.catchup_messages)
    t0 = time.monotonic()
    s = runPerf(cluster, leader, queue, a, "catchup",
                ["-x", "1", "-y", "0", "-C", str(a.catchup_messages), "-c", str(a.catchup_confirm)],
                timeout=a.catchup_publish_timeout)
    res["publish_s"] = round(time.monotonic() - t0, 1)
    res["publish_rate"] = float(s.get("confirm_rate", 0))
    res["confirmed"] = int(s.get("confirmed", 0))
    res["nacked"] = int(s.get("nacked", 0))
    if not res["confirmed"]:
        raise RuntimeError("catch-up: nothing confirmed: %s" % (s,))
    log("catch-up: %d confirmed (%d nacked) in %.1f s (%.0f msg/s) with %s down" % (
        res["confirmed"], res["nacked"], res["publish_s"], res["publish_rate"], cluster.name(follower)))
    q = getQueue(cluster, leader, queue, timeout=10)
    res["online_before"] = [cluster.name(i) for i in onlineIndexes(cluster, q)]
    probe = cluster.syncProbe(leader, follower, queue, a.catchup_timeout)
    time.sleep(0.5 if probe is not None else 0)   # the probe's CLI is up before the node starts
    tWall, t0 = time.time(), time.monotonic()
    h = cluster.restart(follower)
    tOnline, q = waitQueueState(cluster, leader, queue, lambda q: follower in onlineIndexes(cluster, q),
                                a.catchup_timeout, 0.02)
    res["online_s"] = round(tOnline - t0, 3) if tOnline else None
    if not h.wait(a.restart_timeout):
        raise RuntimeError("%s not started again in %s s" % (cluster.name(follower), a.restart_timeout))
    res["boot_s"] = round(h.finished - t0, 3)
    if probe is not None:
        probe.wait(a.catchup_timeout + 60)
        p = probe.result
        res["raft_up_s"] = round(p["up_ms"] / 1000.0 - tWall, 3) if p and p["up_ms"] else None
        res["sync_s"] = round(p["sync_ms"] / 1000.0 - tWall, 3) if p else None
        res["sync_log_index"] = p["leader_index"] if p else None
        res["sync_how"] = ("the follower's offset = the writer's (rabbit_stream_queue:status/2 "
                           "every 10 ms)" if QUEUE["stream"] else
                           "Raft log index of the follower = the leader's (rabbit_quorum_queue:status/2 every 10 ms)")
    else:
        res["sync_s"] = res["online_s"]
        res["sync_how"] = "in the queue's online list (defined as in sync)"
    log("catch-up: %s booted %.1f s after the start command, in online at %s s, in sync at %s s" % (
        cluster.name(follower), res["boot_s"], res["online_s"], res["sync_s"]))
    deleteQueue(cluster, leader, queue)
    return res


# --- output ----------------------------------------------------------------------------------------

def fmt(v, spec="%.1f"):
    return "-" if v is None else (spec % v)


def table(summary):
    lines = ["broker: %s  (%s), %s queues; load average before %s, after %s (%d cores)" % (
        summary["broker"], summary.get("version") or "?", summary["args"]["queue_type"],
        "/".join("%.2f" % x for x in summary["loadavg_before"]),
        "/".join("%.2f" % x for x in summary.get("loadavg_after") or ()), os.cpu_count())]
    t = summary.get("throughput")
    if t:
        lines.append("")
        lines.append("1. confirmed publish, 1 producer (-c %d) + 1 consumer, %d B, medians of %d x %d s" % (
            summary["args"]["perf_confirm"], summary["args"]["size"], summary["args"]["perf_rounds"],
            summary["args"]["seconds"]))
        lines.append("%-12s %-14s %10s %10s %8s %8s %8s %8s" % (
            "clients on", "node", "conf msg/s", "recv msg/s", "p50 ms", "p95 ms", "p99 ms", "max ms"))
        for label in ("leader", "non-leader"):
            x = t[label]
            lines.append("%-12s %-14s %10s %10s %8s %8s %8s %8s" % (
                label, x["node"], fmt(x["confirm_rate"], "%.0f"), fmt(x["recv_rate"], "%.0f"),
                fmt(x["lat_p50_ms"], "%.2f"), fmt(x["lat_p95_ms"], "%.2f"), fmt(x["lat_p99_ms"], "%.2f"),
                fmt(x["lat_max_ms"], "%.1f")))
    f = summary.get("failover")
    if f:
        lines.append("")
        lines.append("2. failover after SIGKILL of the leader's node (ms after the kill), %d rounds, "
                     "publishing %d/s" % (len(f["rounds"]), summary["args"]["rate"]))
        lines.append("%-6s %-14s %-14s %9s %9s %9s %9s %9s %9s %6s %6s %9s" % (
            "round", "killed", "new leader", "confirm", "any conf", "deliver", "any dlv", "API ldr", "max lat",
            "nacks", "unconf", "back s"))
        for x in f["rounds"]:
            lines.append("%-6s %-14s %-14s %9s %9s %9s %9s %9s %9s %6d %6d %9s" % (
                x["round"], x["killed"], x["new_leader"] or "-", fmt(x["confirm_ms"]), fmt(x["any_confirm_ms"]),
                fmt(x["deliver_ms"]), fmt(x["any_deliver_ms"]), fmt(x["leader_ms"]),
                fmt(x["max_confirm_latency_ms"]), x["nacked"], x["unconfirmed"], fmt(x["restart_online_s"])))
        lines.append("%-6s %-14s %-14s %9s %9s %9s %9s %9s %9s %6d %6d %9s" % (
            "median", "", "", fmt(f["confirm_ms"]), fmt(f["any_confirm_ms"]), fmt(f["deliver_ms"]),
            fmt(f["any_deliver_ms"]), fmt(f["leader_ms"]), fmt(f["max_confirm_latency_ms"]), f["nacked"],
            f["unconfirmed"], fmt(f["restart_online_s"])))
        lines.append("confirm = first confirm of a publish sent after the kill; deliver = first delivery of a "
                     "message published after the kill; any = of any message; API ldr = a surviving node's queue "
                     "JSON names the new leader; max lat = the longest confirm latency; back s = the killed node "
                     "in online again, s after its start command")
        for x in f["rounds"]:
            for stall in x["warmup_stalls"]:
                lines.append("round %s, before the kill, clients moved: %s" % (x["round"], stall))
            if x["publish_errors"] or x["consumer_errors"]:
                lines.append("round %s errors (%d publishes failed; the first 5 of each side): %s" % (
                    x["round"], x["publish_error_count"], x["publish_errors"] + x["consumer_errors"]))
            if x["consumer_cancels_ms"]:
                lines.append("round %s: the broker cancelled the consumer at %s ms (it consumed again)" % (
                    x["round"], x["consumer_cancels_ms"]))
    c = summary.get("catchup")
    if c:
        lines.append("")
        lines.append("3. catch-up of a follower after %d messages (%d B) published while it was down; s after its "
                     "start command" % (c["messages"], summary["args"]["size"]))
        lines.append("in sync: " + c["sync_how"])
        lines.append("%-6s %-14s %-14s %10s %9s %8s %9s %9s" % (
            "round", "leader", "follower", "publish/s", "booted s", "online s",
            "member up" if summary["args"]["queue_type"] == "stream" else "raft up s", "in sync s"))
        for x in c["rounds"] + [dict(c, round="median", leader="", follower="")]:
            lines.append("%-6s %-14s %-14s %10s %9s %8s %9s %9s" % (
                x["round"], x["leader"], x["follower"], fmt(x["publish_rate"], "%.0f"), fmt(x["boot_s"], "%.2f"),
                fmt(x["online_s"], "%.2f"), fmt(x.get("raft_up_s"), "%.2f"), fmt(x["sync_s"], "%.2f")))
    return "\n".join(lines)


def brokerVersion(cluster):
    try:
        import pika
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.amqpPort(0), socket_timeout=5))
        props = c._impl.server_properties
        c.close()
        return "%s %s" % (props.get("product", b"").decode() if isinstance(props.get("product"), bytes)
                          else props.get("product"),
                          props.get("version", b"").decode() if isinstance(props.get("version"), bytes)
                          else props.get("version"))
    except Exception:  # noqa: BLE001 - informative only
        return None


def body(cluster, a):
    summary = {"broker": cluster.broker, "args": {k: v for k, v in vars(a).items() if k != "node_arg"}}
    summary["args"]["node_arg"] = a.node_arg
    started = time.time()
    summary["loadavg_before"] = os.getloadavg()
    cluster.start()
    try:
        summary["version"] = brokerVersion(cluster)
        parts = a.parts.split(",")
        if "throughput" in parts:
            summary["throughput"] = throughput(cluster, a)
        if "failover" in parts:
            summary["failover"] = failover(cluster, a)
        if "catchup" in parts:
            summary["catchup"] = catchup(cluster, a)
    finally:
        CHILDREN.reapAll()
        try:
            cluster.stop()
        finally:
            CHILDREN.reapAll()
    summary["elapsed_s"] = round(time.time() - started, 1)
    summary["loadavg_after"] = os.getloadavg()
    print(table(summary))
    line = json.dumps(summary, sort_keys=True)
    print("JSON " + line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    sys.stdout.flush()
    return summary


def parseArgs(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broker", choices=("rabbitmq", "otter"), required=True)
    p.add_argument("--queue-type", choices=("quorum", "stream"), default="quorum",
                   help="quorum queues (default), or streams (x-initial-cluster-size 3; consumers with a "
                   "prefetch and x-stream-offset next)")
    p.add_argument("--parts", default="throughput,failover,catchup",
                   help="comma list of throughput, failover, catchup (default all)")
    p.add_argument("--size", type=int, default=16, help="body bytes (default 16; >= 12 for amqp-perf latency)")
    g = p.add_argument_group("throughput")
    g.add_argument("--seconds", type=int, default=10, help="seconds per amqp-perf run (default 10)")
    g.add_argument("--perf-rounds", type=int, default=3, help="leader/non-leader runs, interleaved (default 3)")
    g.add_argument("--perf-confirm", type=int, default=100, help="amqp-perf -c: unconfirmed at most (default 100)")
    g = p.add_argument_group("failover")
    g.add_argument("--rounds", type=int, default=3, help="leader kills (default 3)")
    g.add_argument("--rate", type=int, default=500, help="publish rate msg/s during failover (default 500)")
    g.add_argument("--max-outstanding", type=int, default=50000,
                   help="publishes unconfirmed at most; the publisher skips a tick beyond (default 50000)")
    g.add_argument("--prefetch", type=int, default=100, help="consumer prefetch (default 100)")
    g.add_argument("--warmup", type=float, default=3.0, help="seconds of publishing before the kill (default 3)")
    g.add_argument("--warmup-timeout", type=float, default=30.0,
                   help="at most this for the first confirm and delivery before the kill; then once more with "
                   "the publisher's and consumer's nodes swapped (default 30)")
    g.add_argument("--after", type=float, default=1.0,
                   help="seconds of publishing after everything was seen (default 1)")
    g.add_argument("--failover-timeout", type=float, default=60.0,
                   help="wait at most this for confirms, deliveries and a new leader after the kill (default 60)")
    g.add_argument("--confirm-timeout", type=float, default=30.0,
                   help="after publishing stops, wait at most this for the last confirms (default 30)")
    g.add_argument("--restart-timeout", type=float, default=300.0, help="a node's start, at most (default 300)")
    g = p.add_argument_group("catch-up")
    g.add_argument("--catchup-messages", type=int, default=1000000, help="default 1,000,000")
    g.add_argument("--catchup-rounds", type=int, default=1, help="catch-ups, one after the other (default 1)")
    g.add_argument("--settle", type=float, default=2.0, help="seconds between the declare and the kill (default 2)")
    g.add_argument("--catchup-confirm", type=int, default=1000, help="amqp-perf -c for them (default 1000)")
    g.add_argument("--catchup-publish-timeout", type=float, default=3600.0, help="default 3600 s")
    g.add_argument("--catchup-timeout", type=float, default=900.0,
                   help="the follower in online / in sync, at most (default 900 s)")
    g = p.add_argument_group("RabbitMQ")
    g.add_argument("--rabbit-script", default=DEFAULT_RABBIT_SCRIPT, help="rabbitmq-cluster.sh")
    g.add_argument("--rabbit-dir", default=os.environ.get("RMQ_CLUSTER_DIR", "/tmp/rmq-cluster"),
                   help="its RMQ_CLUSTER_DIR (to find beam.smp pids)")
    g.add_argument("--no-start", action="store_true", help="use the running cluster (do not start one)")
    g.add_argument("--keep", action="store_true", help="do not stop the cluster at the end")
    g = p.add_argument_group("otter_tx")
    g.add_argument("--etcd-members", type=int, default=3)
    g.add_argument("--python", default=None, help="the nodes' interpreter (default this one)")
    g.add_argument("--node-arg", action="append", default=[], help="one more twistd ottermq argument per node "
                   "(repeatable; e.g. --node-arg=--queue-leader-locator --node-arg=client-local)")
    g.add_argument("--data-dir", default=None, help="where the nodes' directories go (default a temp dir)")
    p.add_argument("--json", default=None, help="also write the JSON summary here")
    a = p.parse_args(argv)
    bad = set(a.parts.split(",")) - {"throughput", "failover", "catchup"}
    if bad:
        p.error("unknown --parts: %s" % ",".join(sorted(bad)))
    return a


def ensurePerf(a):
    if "throughput" in a.parts or "catchup" in a.parts:
        if not os.access(PERF, os.X_OK):
            subprocess.run(["sh", os.path.join(HERE, "build-perf.sh")], check=True, timeout=600)


def main(argv=None):
    a = parseArgs(argv)
    setQueueType(a.queue_type)
    ensurePerf(a)
    if a.broker == "rabbitmq":
        if os.geteuid() != 0:
            sys.exit("rabbitmq-cluster.sh runs as root")
        cluster = RabbitCluster(a.rabbit_script, a.rabbit_dir, a.no_start, a.keep)
        try:
            body(cluster, a)
        finally:
            CHILDREN.reapAll()
        return
    from twisted.internet import reactor
    cluster = OtterCluster(reactor, a.etcd_members, a.python, a.node_arg, a.data_dir)
    result = {}

    def work():
        try:
            result["summary"] = body(cluster, a)
        except BaseException as e:  # noqa: BLE001 - reported below
            result["error"] = e
        finally:
            reactor.callFromThread(reactor.stop)

    # the benchmark in a thread, the cluster's processes on the reactor (which reaps them)
    reactor.callWhenRunning(lambda: threading.Thread(target=work, daemon=True).start())
    reactor.addSystemEventTrigger("before", "shutdown", lambda: cluster.cluster.stop() if cluster.cluster else None)
    reactor.run()
    CHILDREN.reapAll()
    if "error" in result:
        raise result["error"]


if __name__ == "__main__":
    main()
