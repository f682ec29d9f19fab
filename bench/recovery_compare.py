#!/usr/bin/env python3
"""
N persistent messages in one durable queue (issue 20): disk bytes per message,
recovery time and the broker's peak RSS while recovering, for a private
RabbitMQ node or an otter_tx process, each started here with its own data
directory and ports.

For one target:

1. start the broker on an empty data directory, declare the durable queue
   (with ``--queue-args``), stop it cleanly and take the size of the data
   directory (the baseline; the time to start empty is reported too);
2. start it again and publish N persistent messages of ``--body`` bytes with
   ``bench/amqp-perf`` (publish only, ``--producers`` connections, at most
   ``--confirm`` unconfirmed each); stop it (cleanly, or SIGKILL with
   ``--crash``) and take the size again: bytes per message is
   (after - baseline) / N, both as ``st_size`` (apparent) and as allocated
   blocks;
3. ``--rounds`` times: start it and time, from the start of the process,
   until a ``queue.declare(passive)`` reports N ready messages and a
   ``basic.get`` returns the first one (the connection is retried every 20 ms
   until the port accepts it); then read ``VmHWM`` (peak RSS since the process
   started, so boot included) and ``VmRSS`` from ``/proc/PID/status`` of the
   broker process (``beam.smp`` for RabbitMQ, the Python process for otter_tx)
   and stop it (cleanly, or SIGKILL with ``--crash``).

Targets (one per run):

- ``--rabbit``: RabbitMQ from Debian's ``rabbitmq-server`` (as
  ``/work/shared/tools/rabbitmq-peer.sh`` starts it) as node
  ``recovery@localhost`` on 127.0.0.1:``--rabbit-port`` (default 5692, Erlang
  distribution on port + 20000), no plugins, data under ``--dir``; stopped
  with ``rabbitmqctl stop``.  ``--queue-args x-queue-version=2`` for classic
  queues v2 (3.10's default is v1), ``x-queue-mode=lazy`` for a lazy queue.
- ``--otter PYTHON``: ``PYTHON -c "<twistd>" -n --pidfile= ottermq --amqp
  tcp:PORT:interface=127.0.0.1 --management tcp:0 --prometheus none
  --data-dir DIR`` with the checkout ``--otter-root`` (default: this one)
  first on ``PYTHONPATH``; stopped with SIGTERM (twistd's clean shutdown).

Examples::

    .venv-test/bin/python bench/recovery_compare.py --rabbit
    .venv-test/bin/python bench/recovery_compare.py --rabbit --queue-args x-queue-version=2
    .venv-test/bin/python bench/recovery_compare.py --otter .venv-test/bin/python --rounds 3
    .venv-test/bin/python bench/recovery_compare.py --otter .venv-test/bin/python --otter-root /tmp/old

Output: progress on stderr, one JSON object on stdout (``--markdown`` adds a
table row).  Needs root for ``--rabbit`` (the node runs as user rabbitmq);
pika from the venv is the polling client.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PERF = os.path.join(HERE, "amqp-perf")
RUN_TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"
QUEUE = "recovery"


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def freePort():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def dirSize(path):
    """(apparent bytes, allocated bytes) of every file under path."""
    apparent = allocated = 0
    for root, dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def procStatus(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0]) * 1024
    except FileNotFoundError:
        pass
    return out


def parseQueueArgs(spec):
    args = {}
    for item in filter(None, (spec or "").split(",")):
        key, _, value = item.partition("=")
        try:
            args[key] = int(value)
        except ValueError:
            args[key] = {"true": True, "false": False}.get(value, value)
    return args


class Rabbit:
    """A private RabbitMQ node from Debian's package (see tools/rabbitmq-peer.sh)."""

    name = "rabbitmq"

    def __init__(self, base, port):
        self.base = base
        self.port = port
        self.node = "recovery@localhost"
        self.dataDir = os.path.join(base, "mnesia")
        self.proc = None
        self.pid = None
        os.makedirs(self.dataDir, exist_ok=True)
        os.makedirs(os.path.join(base, "log"), exist_ok=True)
        with open(os.path.join(base, "rabbitmq.conf"), "w") as f:
            f.write("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n" % port)
        with open(os.path.join(base, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        subprocess.check_call(["chown", "-R", "rabbitmq:rabbitmq", base])
        self.env = dict(
            os.environ, RABBITMQ_NODENAME=self.node, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(port), RABBITMQ_DIST_PORT=str(port + 20000),
            RABBITMQ_MNESIA_BASE=self.dataDir, RABBITMQ_LOG_BASE=os.path.join(base, "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(base, "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=os.path.join(base, "rabbitmq"), ERL_EPMD_ADDRESS="127.0.0.1",
            HOME=base)

    def start(self):
        out = open(os.path.join(self.base, "server.out"), "ab")
        self.proc = subprocess.Popen(["rabbitmq-server"], env=self.env, stdout=out, stderr=out,
                                     start_new_session=True)
        self.pid = None

    def brokerPid(self):
        """The beam.smp descended from the process start() made (su starts a new session)."""
        if self.pid is None:
            parents = {}
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open("/proc/%s/stat" % entry) as f:
                        stat = f.read()
                except OSError:
                    continue
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                parents[int(entry)] = (int(stat[stat.rindex(")") + 2:].split()[1]), comm)
            for pid, (ppid, comm) in parents.items():
                if comm.startswith("beam"):
                    p = ppid
                    while p > 1 and p != self.proc.pid:
                        p = parents.get(p, (1, ""))[0]
                    if p == self.proc.pid:
                        self.pid = pid
        return self.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, crash=False):
        if crash:
            os.kill(self.brokerPid(), signal.SIGKILL)
        else:
            subprocess.call(["rabbitmqctl", "-n", self.node, "stop"], env=self.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # the rest of the session (su, sh, erl_child_setup, inet_gethost) ends with beam
        deadline = time.time() + 20
        while self.pid and os.path.exists("/proc/%d" % self.pid) and time.time() < deadline:
            time.sleep(0.05)
        self.proc = None

    def version(self):
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
                             capture_output=True, text=True).stdout
        return "RabbitMQ " + out

    def logTail(self):
        return open(os.path.join(self.base, "server.out"), errors="replace").read()[-3000:]


class Otter:
    """otter_tx under twistd -n, with PYTHON and the checkout ROOT."""

    name = "otter_tx"

    def __init__(self, base, port, python, root, extraArgs=()):
        self.base = base
        self.port = port
        self.python = python
        self.root = os.path.abspath(root)
        self.extraArgs = list(extraArgs)
        self.dataDir = os.path.join(base, "data")
        self.proc = None
        os.makedirs(self.dataDir, exist_ok=True)

    def start(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = self.root + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [self.python, "-c", RUN_TWISTD, "-n", "--pidfile=",
               "--logfile", os.path.join(self.base, "twistd.log"),
               "ottermq", "--amqp", "tcp:%d:interface=127.0.0.1" % self.port,
               "--management", "tcp:0", "--prometheus", "none", "--stream", "none",
               "--data-dir", self.dataDir] + self.extraArgs
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.root, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.base, "stderr"), "ab"))

    def brokerPid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, crash=False):
        self.proc.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def version(self):
        rev = subprocess.run(["git", "-C", self.root, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        impl = subprocess.run([self.python, "-c", "import platform; print(platform.python_implementation(),"
                               " platform.python_version())"], capture_output=True, text=True).stdout
        return "otter_tx %s %s" % (rev or self.root, impl.strip())

    def logTail(self):
        path = os.path.join(self.base, "twistd.log")
        return open(path, errors="replace").read()[-3000:] if os.path.exists(path) else ""


def waitReady(broker, n, timeout):
    """Seconds from broker.start() until the queue holds n ready messages and a
    basic.get returns one; the broker is started here."""
    t0 = time.monotonic()
    broker.start()
    params = pika.ConnectionParameters("127.0.0.1", broker.port, socket_timeout=5,
                                       blocked_connection_timeout=None, heartbeat=0,
                                       connection_attempts=1)
    conn = None
    while True:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("not ready after %.0f s:\n%s" % (timeout, broker.logTail()))
        if not broker.alive():
            raise RuntimeError("broker exited:\n%s" % broker.logTail())
        try:
            if conn is None:
                conn = pika.BlockingConnection(params)
                tConnected = time.monotonic() - t0
                ch = conn.channel()
            count = ch.queue_declare(QUEUE, passive=True).method.message_count
            if count >= n:
                method, props, body = ch.basic_get(QUEUE, auto_ack=False)
                if method is not None or n == 0:
                    tReady = time.monotonic() - t0
                    break
        except pika.exceptions.ChannelClosedByBroker:
            ch = conn.channel()
        except (pika.exceptions.AMQPConnectionError, OSError):
            conn = None
        time.sleep(0.02)
    conn.close()
    if n and count != n:
        log("note: %d ready, expected %d" % (count, n))
    return tReady, tConnected, count


def declare(broker, queueArgs):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    conn.channel().queue_declare(QUEUE, durable=True, arguments=queueArgs or None)
    conn.close()


def publish(broker, n, body, producers, confirm):
    per = [n // producers + (1 if i < n % producers else 0) for i in range(producers)]
    procs = []
    for i, count in enumerate(per):
        cmd = [PERF, "--port", str(broker.port), "-x", "1", "-y", "0", "-C", str(count),
               "-c", str(confirm), "--persistent", "-s", str(body), "-u", QUEUE, "-p",
               "--quiet", "--id", "p%d" % i]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    sums = []
    for p in procs:
        out, _ = p.communicate()
        line = [ln for ln in out.splitlines() if ln.startswith("SUMMARY")]
        if p.returncode or not line or "status=ok" not in line[0]:
            raise RuntimeError("amqp-perf failed: %s" % out[-2000:])
        sums.append(dict(kv.split("=", 1) for kv in line[0].split()[1:]))
    confirmed = sum(int(s["confirmed"]) for s in sums)
    if confirmed != n:
        raise RuntimeError("confirmed %d of %d" % (confirmed, n))
    return confirmed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    t = p.add_mutually_exclusive_group(required=True)
    t.add_argument("--rabbit", action="store_true", help="a private RabbitMQ node (Debian's rabbitmq-server)")
    t.add_argument("--otter", metavar="PYTHON", help="otter_tx on this interpreter")
    p.add_argument("--otter-root", default=REPO, help="otter_tx checkout (default: this one)")
    p.add_argument("--otter-arg", action="append", default=[], help="extra 'ottermq' option (repeatable)")
    p.add_argument("--rabbit-port", type=int, default=5692)
    p.add_argument("-n", "--messages", type=int, default=1_000_000)
    p.add_argument("--body", type=int, default=16, help="body bytes (default 16)")
    p.add_argument("--queue-args", default="", help="K=V,... e.g. x-queue-version=2 or x-queue-mode=lazy")
    p.add_argument("--producers", type=int, default=2, help="publishing connections (default 2)")
    p.add_argument("--confirm", type=int, default=1000, help="unconfirmed messages per producer (default 1000)")
    p.add_argument("--rounds", type=int, default=1, help="recoveries (restarts) after the fill")
    p.add_argument("--crash", action="store_true", help="SIGKILL the broker instead of a clean stop")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for a recovery")
    p.add_argument("--dir", help="work directory (default: a new one under /tmp, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table row")
    args = p.parse_args(argv)
    if not os.path.exists(PERF):
        subprocess.check_call(["sh", os.path.join(HERE, "build-perf.sh")])
    queueArgs = parseQueueArgs(args.queue_args)
    base = args.dir or tempfile.mkdtemp(prefix="recovery-")
    os.makedirs(base, exist_ok=True)
    os.chmod(base, 0o755)
    if args.rabbit:
        broker = Rabbit(base, args.rabbit_port)
    else:
        broker = Otter(base, freePort(), args.otter, args.otter_root, args.otter_arg)
    result = {"target": broker.version(), "messages": args.messages, "body": args.body,
              "queue_args": queueArgs, "crash": args.crash}
    log("%s in %s, port %d" % (result["target"], base, broker.port))
    try:
        t0 = time.monotonic()
        broker.start()
        # empty start: time until the port accepts a connection
        while True:
            try:
                declare(broker, queueArgs)
                break
            except (pika.exceptions.AMQPConnectionError, OSError):
                if not broker.alive():
                    raise RuntimeError("broker exited:\n%s" % broker.logTail())
                if time.monotonic() - t0 > args.timeout:
                    raise
                time.sleep(0.02)
        result["start_empty_s"] = round(time.monotonic() - t0, 3)
        result["empty_hwm_bytes"] = procStatus(broker.brokerPid()).get("VmHWM")
        broker.stop()
        baseline = dirSize(broker.dataDir)
        log("empty start %.2f s; baseline %d bytes" % (result["start_empty_s"], baseline[0]))

        waitReady(broker, 0, args.timeout)
        log("publishing %d x %d B" % (args.messages, args.body))
        t1 = time.monotonic()
        publish(broker, args.messages, args.body, args.producers, args.confirm)
        fill = time.monotonic() - t1
        result["fill_msg_per_s"] = round(args.messages / fill)
        result["fill_hwm_bytes"] = procStatus(broker.brokerPid()).get("VmHWM")
        log("filled in %.1f s (%.0f msg/s)" % (fill, args.messages / fill))
        t2 = time.monotonic()
        broker.stop(crash=args.crash)
        result["stop_s"] = round(time.monotonic() - t2, 2)
        after = dirSize(broker.dataDir)
        result["disk_bytes_apparent"] = after[0] - baseline[0]
        result["disk_bytes_allocated"] = after[1] - baseline[1]
        result["bytes_per_msg_apparent"] = round((after[0] - baseline[0]) / args.messages, 1)
        result["bytes_per_msg_allocated"] = round((after[1] - baseline[1]) / args.messages, 1)
        log("disk: %s B/msg apparent, %s B/msg allocated" % (
            result["bytes_per_msg_apparent"], result["bytes_per_msg_allocated"]))

        rounds = []
        for i in range(args.rounds):
            tReady, tConn, count = waitReady(broker, args.messages, args.timeout)
            st = procStatus(broker.brokerPid())
            rounds.append({"recovery_s": round(tReady, 3), "port_open_s": round(tConn, 3),
                           "ready": count, "hwm_bytes": st.get("VmHWM"), "rss_bytes": st.get("VmRSS")})
            log("recovery %d: %.2f s (port open at %.2f s), VmHWM %.0f MiB, VmRSS %.0f MiB" % (
                i + 1, tReady, tConn, st.get("VmHWM", 0) / 2**20, st.get("VmRSS", 0) / 2**20))
            broker.stop(crash=args.crash)
        result["rounds"] = rounds
        result["recovery_s_median"] = statistics.median(r["recovery_s"] for r in rounds)
        result["hwm_mib_median"] = round(statistics.median(r["hwm_bytes"] for r in rounds) / 2**20, 1)
    finally:
        if broker.alive():
            broker.stop(crash=True)
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result))
    if args.markdown:
        print("| %s %s | %.0f | %s / %s | %s | %s MiB | %.2f s |" % (
            result["target"], args.queue_args, result["fill_msg_per_s"],
            result["bytes_per_msg_apparent"], result["bytes_per_msg_allocated"],
            " / ".join("%.2f s" % r["recovery_s"] for r in rounds), result["hwm_mib_median"],
            result["start_empty_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
