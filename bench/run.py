#!/usr/bin/env python3
"""
Throughput and latency of otter_tx beside RabbitMQ, measured with amqp-perf.

For each scenario and each round, every target is driven in turn by
``bench/amqp-perf`` (a PerfTest-style C client, built by
``bench/build-perf.sh``) for a fixed time.  Targets are interleaved (otter,
rabbit, otter, rabbit, ...; the order flips every round) so that a noisy
machine penalises both alike.  The per-target figure is the median over the
rounds.

Targets:

- ``--rabbit URL``: a running RabbitMQ (default
  ``amqp://guest:guest@127.0.0.1:5682/`` when it accepts TCP connections;
  ``--no-rabbit`` to skip it).
- ``--otter``: start otter_tx with twistd as a subprocess on a free port of
  127.0.0.1 and a temporary data directory, stop it at the end.
- ``--otter-python PATH`` (repeatable, or a comma list): start one otter_tx
  per interpreter (CPython, PyPy, ...), each labelled by its interpreter
  (``otter/cpython3.11``, ``otter/pypy3.9``), all interleaved in one run.
- ``--otter-url URL``: an otter_tx that is already running.

Every run also reports the broker's CPU time per message received (µs, from
``/proc/PID/stat``) for brokers whose pid is known (the ones started here,
and RabbitMQ: ``--rabbit-pid`` or found from its listening socket).
``--rate R[,R...]`` runs each scenario at fixed publish rates (0 = as fast
as possible), e.g. ``--rate 1000,10000,20000`` for CPU per message at low load.

Output: progress on stderr; on stdout a plain table (default), a Markdown
table (``--markdown``), and/or JSON (``--json PATH``, ``-`` for stdout).
Rates are messages per second, latencies milliseconds (end-to-end, publish
to delivery, measured by amqp-perf from a timestamp in each body).

Python standard library only; pika from the project venv is used, if
present, to read the brokers' product/version for the report.

    .venv/bin/python bench/run.py --otter --rounds 3 --markdown
    .venv/bin/python bench/run.py --otter-python .venv/bin/python,/tmp/pypyvenv/bin/python
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from urllib.parse import unquote, urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PERF = os.path.join(HERE, "amqp-perf")
BUILD = os.path.join(HERE, "build-perf.sh")
TWISTD = os.path.join(REPO, ".venv", "bin", "twistd")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
#: runs twistd with the interpreter it is started by: ``PYTHON -c RUN_TWISTD
#: -n --pidfile= ottermq ...`` (``python -m twisted`` is ``twist``, which has
#: neither ``-n`` nor ``--pidfile``)
RUN_TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"
DEFAULT_RABBIT = "amqp://guest:guest@127.0.0.1:5682/"


class Scenario:
    """
    One amqp-perf workload.

    :param name: short identifier (used on the command line and in output).
    :param title: one-line human description.
    :param args: amqp-perf arguments for the workload (no URI, time, queue).
    :param durable: whether the queue is durable (else it is auto-delete).
    :param fanout: number of queues bound to a fanout exchange the producer
        publishes to (0: one queue, published to through the default exchange).
    """

    def __init__(self, name, title, args, durable=False, fanout=0):
        self.name = name
        self.title = title
        self.args = args
        self.durable = durable
        self.fanout = fanout

    def perfArgs(self, queue):
        """
        amqp-perf arguments for the workload on queue(s) named after ``queue``.
        """
        if self.fanout:
            topo = ["--exchange", queue + "-x", "--type", "fanout",
                    "--queue-pattern", queue + "-%d", "--queue-pattern-from", "1",
                    "--queue-pattern-to", str(self.fanout)]
        else:
            topo = ["--queue", queue]
        if self.durable:
            topo.append("--durable")
        elif not self.fanout:
            # not with fanout: consumers stop first at the end of a run, their
            # auto-delete queues go, the auto-delete exchange with them, and
            # the producer's last publishes fail with 404; --cleanup deletes
            # the queues and exchange instead
            topo.append("--auto-delete")
        return topo + self.args


SCENARIOS = [
    Scenario("autoack-16B", "1 producer / 1 consumer, 16 B, autoack",
             ["-x", "1", "-y", "1", "-s", "16", "--autoack"]),
    Scenario("autoack-1KiB", "1 producer / 1 consumer, 1 KiB, autoack",
             ["-x", "1", "-y", "1", "-s", "1024", "--autoack"]),
    Scenario("ack-q100-16B", "1p/1c, 16 B, manual ack, prefetch 100",
             ["-x", "1", "-y", "1", "-s", "16", "--prefetch", "100"]),
    Scenario("ack-q100-1KiB", "1p/1c, 1 KiB, manual ack, prefetch 100",
             ["-x", "1", "-y", "1", "-s", "1024", "--prefetch", "100"]),
    Scenario("persist-confirm100-1KiB",
             "1p/1c, 1 KiB persistent, confirms (window 100), durable queue, "
             "manual ack, prefetch 100",
             ["-x", "1", "-y", "1", "-s", "1024", "--persistent",
              "--confirm", "100", "--prefetch", "100"],
             durable=True),
    # RabbitMQ 4.0's published persistent setting (issue 20's second row)
    Scenario("persist-confirm192-12B-multiack200",
             "1p/1c, 12 B persistent, confirms (window 192), durable queue, "
             "prefetch 200, multi-ack every 200",
             ["-x", "1", "-y", "1", "-s", "12", "--persistent",
              "--confirm", "192", "--prefetch", "200", "--multi-ack-every", "200"],
             durable=True),
    # fanout: every message is delivered 4 times; recv msg/s counts deliveries
    Scenario("fanout4-16B",
             "1 producer -> fanout exchange -> 4 queues, 4 consumers, 16 B, autoack "
             "(recv = deliveries)",
             ["-x", "1", "-y", "4", "-s", "16", "--autoack"], fanout=4),
]


def log(msg):
    """
    Print a progress line on stderr.
    """
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# URLs and reachability


def parseUrl(url):
    """
    Split an AMQP URL into amqp-perf connection options.

    A path of ``""`` or ``"/"`` means vhost ``/`` (as pika and the RabbitMQ
    docs read it); rabbitmq-c would read ``amqp://h/`` as vhost ``""``, so
    we never hand amqp-perf the URL itself.

    :returns: dict with host, port, user, password, vhost.
    """
    u = urlsplit(url)
    if u.scheme != "amqp":
        raise ValueError(f"only amqp:// URLs are supported: {url!r}")
    path = u.path
    vhost = "/" if path in ("", "/") else unquote(path[1:])
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 5672,
        "user": unquote(u.username) if u.username is not None else "guest",
        "password": unquote(u.password) if u.password is not None else "guest",
        "vhost": vhost,
    }


def reachable(host, port, timeout=1.0):
    """
    Whether ``host:port`` accepts a TCP connection within ``timeout`` s.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def freePort(host="127.0.0.1"):
    """
    A TCP port on ``host`` that was free a moment ago.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serverProduct(conn):
    """
    ``"product version"`` from connection.start, via pika if available.
    """
    try:
        import pika
    except ImportError:
        return "unknown (pika not installed)"
    try:
        params = pika.ConnectionParameters(
            host=conn["host"], port=conn["port"], virtual_host=conn["vhost"],
            credentials=pika.PlainCredentials(conn["user"], conn["password"]),
            socket_timeout=5, blocked_connection_timeout=5,
            connection_attempts=1)
        c = pika.BlockingConnection(params)
        try:
            props = c._impl.server_properties
        finally:
            c.close()

        def s(v):
            return v.decode() if isinstance(v, bytes) else str(v)

        return f"{s(props.get('product', '?'))} {s(props.get('version', '?'))}"
    except Exception as e:  # report, do not fail the bench
        return f"unknown ({e.__class__.__name__})"


# --------------------------------------------------------------------------
# Process CPU (Linux /proc), for brokers we started


def cpuSeconds(pid):
    """
    utime + stime of ``pid`` in seconds, or ``None`` if unavailable.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def listeningPid(port):
    """
    The pid of the local process listening on TCP ``port`` (from
    ``/proc/net/tcp*`` and ``/proc/*/fd``), or ``None``.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    # local_address is HEXIP:HEXPORT; state 0A is LISTEN
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add("socket:[%s]" % parts[9])
        except OSError:
            pass
    if not inodes:
        return None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return int(pid)
                except OSError:
                    continue
        except OSError:
            continue
    return None


def interpreterInfo(python):
    """
    ``(label, description)`` of a Python interpreter, e.g.
    ``("pypy3.9", "PyPy 3.9.16 (7.3.11)")``.
    """
    code = ("import platform, sys; i = sys.implementation; "
            "v = getattr(sys, 'pypy_version_info', None); "
            "print(i.name, '%d.%d' % sys.version_info[:2], platform.python_version(), "
            "'.'.join(map(str, v[:3])) if v else '')")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    name, short, full, pypy = (out.stdout.split() + [""])[:4]
    desc = ("PyPy" if name == "pypy" else "CPython" if name == "cpython" else name) + " " + full
    if pypy:
        desc += f" ({pypy})"
    return f"{name}{short}", desc


# --------------------------------------------------------------------------
# otter_tx as a subprocess


class OtterProcess:
    """
    otter_tx run as ``twistd -n --pidfile= ottermq ...`` in the foreground.

    ``-n`` keeps twistd in the foreground (no fork, so the pid we hold is the
    broker's and its log goes to stdout, captured here in a file);
    ``--pidfile=`` (empty) writes no pidfile, so concurrent runs do not
    collide.  twistd stops the reactor cleanly on SIGTERM; we escalate to
    SIGKILL after a grace period.
    """

    def __init__(self, twistd=TWISTD, startTimeout=30.0, extraArgs=(), python=None, repo=REPO):
        self.twistd = twistd
        self.python = python
        #: the checkout put first on PYTHONPATH (another one compares before/after)
        self.repo = repo
        self.startTimeout = startTimeout
        self.extraArgs = list(extraArgs)
        self.proc = None
        self.tmpdir = None
        self.port = None
        self.logPath = None
        self._logFile = None

    def start(self):
        """
        Start the broker and wait until its AMQP port accepts connections.

        :raises RuntimeError: if it exits or is not listening by the deadline;
            the message carries the tail of its log.
        """
        self.tmpdir = tempfile.mkdtemp(prefix="otter-bench-")
        dataDir = os.path.join(self.tmpdir, "data")
        os.mkdir(dataDir)
        self.logPath = os.path.join(self.tmpdir, "twistd.log")
        self.port = freePort()
        if self.python:
            # twistd on this interpreter (its own site-packages), our repo first
            launcher = [self.python, "-c", RUN_TWISTD]
        else:
            launcher = [self.twistd]
        argv = launcher + ["-n", "--pidfile=", "ottermq",
                "--amqp", f"tcp:{self.port}:interface=127.0.0.1",
                "--management", "tcp:0", "--prometheus", "none", "--stream", "none",
                "--data-dir", dataDir] + self.extraArgs
        env = dict(os.environ)
        # twistd finds plugins in twisted/plugins/ directories on sys.path;
        # an editable install does not put the repo root there.
        env["PYTHONPATH"] = self.repo + (os.pathsep + env["PYTHONPATH"]
                                    if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        self._logFile = open(self.logPath, "wb")
        log(f"otter: starting {' '.join(repr(a) if ' ' in a else a for a in argv)}")
        self.proc = subprocess.Popen(
            argv, cwd=self.tmpdir, env=env, stdin=subprocess.DEVNULL,
            stdout=self._logFile, stderr=subprocess.STDOUT,
            # own session: a Ctrl-C aimed at us does not hit the broker
            # mid-run; stop() ends it.
            start_new_session=True)
        deadline = time.monotonic() + self.startTimeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"otter_tx exited with status {self.proc.returncode} "
                    f"before listening; log {self.logPath}:\n{self.logTail()}")
            if reachable("127.0.0.1", self.port, timeout=0.5):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"otter_tx not listening on 127.0.0.1:{self.port} after "
                    f"{self.startTimeout:.0f} s; log:\n{self.logTail()}")
            time.sleep(0.1)
        log(f"otter: pid {self.proc.pid} listening on 127.0.0.1:{self.port}")
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def logTail(self, lines=30):
        """
        The last ``lines`` lines of the broker's log.
        """
        try:
            with open(self.logPath, "rb") as f:
                data = f.read()
        except (OSError, TypeError):
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def cpuSeconds(self):
        """
        CPU seconds the broker has used so far, or ``None``.
        """
        if self.proc is None or self.proc.poll() is not None:
            return None
        return cpuSeconds(self.proc.pid)

    def alive(self):
        """
        Whether the broker process is still running.
        """
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace=10.0, keepTmp=False):
        """
        SIGTERM, wait up to ``grace`` s, then SIGKILL; remove the temp dir.
        """
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                log("otter: no exit after SIGTERM; sending SIGKILL")
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            rc = self.proc.returncode
            # after a clean SIGTERM shutdown twistd re-raises the signal on
            # itself, so -SIGTERM is the normal status here
            how = ("cleanly" if rc in (0, -signal.SIGTERM) else
                   "killed" if rc == -signal.SIGKILL else "with an error")
            log(f"otter: stopped {how} (status {rc})")
        if self._logFile is not None:
            self._logFile.close()
            self._logFile = None
        if self.tmpdir and not keepTmp:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


# --------------------------------------------------------------------------
# One amqp-perf run


def parseSummary(text):
    """
    The ``SUMMARY k=v ...`` line of amqp-perf output as a dict, or ``None``.

    Numeric values become int or float.
    """
    for line in reversed(text.splitlines()):
        if line.startswith("SUMMARY "):
            out = {}
            for item in line.split()[1:]:
                k, _, v = item.partition("=")
                try:
                    out[k] = int(v)
                except ValueError:
                    try:
                        out[k] = float(v)
                    except ValueError:
                        out[k] = v
            return out
    return None


def runPerf(perf, conn, scenario, seconds, queue, rate=0, verbose=False,
            brokerCpu=None):
    """
    Run amqp-perf once; return a result dict (``status`` ``ok`` or ``error``).

    :param conn: parsed URL (see :func:`parseUrl`).
    :param brokerCpu: optional callable returning broker CPU seconds, sampled
        around the run to give ``broker_cpu_pct`` (100 = one core).
    """
    argv = [perf,
            "--host", conn["host"], "--port", str(conn["port"]),
            "--user", conn["user"], "--password", conn["password"],
            "--vhost", conn["vhost"],
            "--time", str(seconds), "--cleanup",
            "--id", scenario.name] + scenario.perfArgs(queue)
    if rate:
        argv += ["--rate", str(rate)]
    if not verbose:
        argv.append("--quiet")
    cpu0 = brokerCpu() if brokerCpu else None
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=seconds + 60)
        rc = proc.returncode
    except BaseException as e:
        # Timeout, Ctrl-C or SIGTERM: ask amqp-perf to stop (it then closes
        # and, with --cleanup, deletes its queue), SIGKILL if it does not.
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        err += "\namqp-perf did not finish in time"
        rc = None
    wall = time.monotonic() - t0
    cpu1 = brokerCpu() if brokerCpu else None
    if verbose:
        for line in out.splitlines():
            if not line.startswith("SUMMARY"):
                log("    " + line)
    summary = parseSummary(out) or {}
    result = {"status": "ok" if rc == 0 and summary.get("status") == "ok"
              else "error",
              "exit": rc, "summary": summary}
    if result["status"] != "ok":
        result["stderr"] = err.strip()[-2000:]
    if cpu0 is not None and cpu1 is not None and wall > 0:
        # includes the few hundred ms of setup and cleanup around the run
        result["broker_cpu_pct"] = round(100.0 * (cpu1 - cpu0) / wall, 1)
        result["broker_cpu_s"] = round(cpu1 - cpu0, 3)
        received = summary.get("received")
        if received:
            # CPU time per message received (per delivery with fanout)
            result["cpu_us_per_msg"] = round(1e6 * (cpu1 - cpu0) / received, 2)
    return result


# --------------------------------------------------------------------------
# Aggregation and output

METRICS = [
    ("recv_rate", "recv msg/s", 0),
    ("sent_rate", "sent msg/s", 0),
    ("lat_p50_us", "p50 ms", 2),
    ("lat_p95_us", "p95 ms", 2),
    ("lat_p99_us", "p99 ms", 2),
]


def aggregate(runs):
    """
    Median over the successful runs of each (scenario, target).

    :returns: list of dicts with scenario, target, ok, failed and the
        median of every metric in :data:`METRICS` (latencies in ms).
    """
    groups = {}
    for r in runs:
        groups.setdefault((r["scenario"], r.get("rate", 0), r["target"]), []).append(r)
    rows = []
    for (scen, rate, target), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        row = {"scenario": scen, "rate": rate, "target": target, "ok": len(ok),
               "failed": len(rs) - len(ok)}
        for key, _, _ in METRICS:
            vals = [r["summary"][key] for r in ok if key in r["summary"]]
            if vals:
                v = statistics.median(vals)
                row[key.replace("_us", "_ms") if key.endswith("_us") else key] = (
                    v / 1000.0 if key.endswith("_us") else v)
        rates = [r["summary"]["recv_rate"] for r in ok]
        if len(rates) > 1:
            row["recv_rate_min"] = min(rates)
            row["recv_rate_max"] = max(rates)
        cpus = [r["broker_cpu_pct"] for r in ok if "broker_cpu_pct" in r]
        if cpus:
            row["broker_cpu_pct"] = statistics.median(cpus)
        perMsg = [r["cpu_us_per_msg"] for r in ok if "cpu_us_per_msg" in r]
        if perMsg:
            row["cpu_us_per_msg"] = statistics.median(perMsg)
        clients = [r["summary"]["client_cpu_pct"] for r in ok
                   if "client_cpu_pct" in r["summary"]]
        if clients:
            row["client_cpu_pct"] = statistics.median(clients)
        rows.append(row)
    # throughput relative to RabbitMQ in the same scenario and rate
    ref = {(r["scenario"], r["rate"]): r.get("recv_rate") for r in rows
           if r["target"] == "rabbitmq"}
    for r in rows:
        base = ref.get((r["scenario"], r["rate"]))
        if base and r.get("recv_rate") is not None and r["target"] != "rabbitmq":
            r["vs_rabbit"] = round(r["recv_rate"] / base, 2)
    return rows


def tableCells(row):
    """
    The display cells of one aggregated row.
    """
    def fmt(key, digits):
        k = key.replace("_us", "_ms")
        if k not in row:
            return "-"
        return f"{row[k]:,.{digits}f}"

    cells = [row["scenario"], f"{row['rate']:,.0f}" if row["rate"] else "max", row["target"]]
    cells += [fmt(key, digits) for key, _, digits in METRICS]
    spread = ("-" if "recv_rate_min" not in row else
              f"{row['recv_rate_min']:,.0f}..{row['recv_rate_max']:,.0f}")
    cells.append(spread)
    cells.append(f"{row['vs_rabbit']:.2f}x" if "vs_rabbit" in row else "-")
    cells.append(f"{row['broker_cpu_pct']:.0f}" if "broker_cpu_pct" in row else "-")
    cells.append(f"{row['cpu_us_per_msg']:.1f}" if "cpu_us_per_msg" in row else "-")
    cells.append(f"{row['ok']}" + (f" ({row['failed']} failed)" if row["failed"] else ""))
    return cells


HEADERS = (["scenario", "rate", "target"] + [label for _, label, _ in METRICS]
           + ["recv min..max", "recv vs rabbit", "broker CPU %", "CPU us/msg", "runs"])
NLEFT = 3  # left-aligned (text) columns


def plainTable(rows):
    """
    A fixed-width text table.
    """
    lines = [HEADERS] + [tableCells(r) for r in rows]
    widths = [max(len(l[i]) for l in lines) for i in range(len(HEADERS))]
    out = []
    for n, l in enumerate(lines):
        out.append("  ".join(c.ljust(w) if i < NLEFT else c.rjust(w)
                             for i, (c, w) in enumerate(zip(l, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdownTable(rows):
    """
    A GitHub-flavoured Markdown table.
    """
    out = ["| " + " | ".join(HEADERS) + " |",
           "|" + "|".join(["---"] * NLEFT + ["---:"] * (len(HEADERS) - NLEFT)) + "|"]
    for r in rows:
        out.append("| " + " | ".join(tableCells(r)) + " |")
    return "\n".join(out)


# --------------------------------------------------------------------------
# Main


def parseArgs(argv):
    p = argparse.ArgumentParser(
        description="Benchmark otter_tx beside RabbitMQ with amqp-perf.",
        epilog="Scenarios: " + "; ".join(f"{s.name}: {s.title}" for s in SCENARIOS))
    p.add_argument("--rabbit", metavar="URL",
                   help=f"RabbitMQ to measure (default {DEFAULT_RABBIT} if reachable)")
    p.add_argument("--no-rabbit", action="store_true", help="do not measure RabbitMQ")
    p.add_argument("--rabbit-pid", type=int, metavar="PID",
                   help="RabbitMQ's beam.smp pid, to report its CPU use (optional)")
    p.add_argument("--otter", action="store_true",
                   help="start otter_tx (twistd ottermq) as a subprocess and measure it")
    p.add_argument("--otter-python", action="append", default=[], metavar="PATH",
                   help="start otter_tx with this Python interpreter (twistd from its "
                   "site-packages, the repo on PYTHONPATH; PATH=REPO puts another checkout there, "
                   "to compare before and after); repeatable or a comma list, "
                   "one target per interpreter, labelled by it (otter/cpython3.11, otter/pypy3.9)")
    p.add_argument("--otter-url", metavar="URL", help="measure an otter_tx already running")
    p.add_argument("--otter-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for 'twistd ottermq' (repeatable)")
    p.add_argument("--twistd", default=TWISTD, help="twistd to start otter_tx with")
    p.add_argument("--start-timeout", type=float, default=30.0,
                   help="seconds to wait for a started otter_tx to listen (default 30)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="duration of each run (default 10)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds per scenario and target (default 3)")
    p.add_argument("--scenario", action="append", metavar="NAME",
                   choices=[s.name for s in SCENARIOS],
                   help="run only this scenario (repeatable); default all")
    p.add_argument("--rate", action="append", default=[], metavar="R[,R...]",
                   help="cap the producer at R msg/s (0 = unlimited, the default); "
                   "repeatable or a comma list: every scenario runs at every rate")
    p.add_argument("--warmup", type=float, default=0, metavar="S",
                   help="before the first round, run every scenario for S seconds on each "
                   "otter_tx started here, results discarded (PyPy's JIT warms up; default 0)")
    p.add_argument("--pause", type=float, default=1.0,
                   help="seconds to idle between runs (default 1)")
    p.add_argument("--perf", default=PERF, help="amqp-perf binary (default bench/amqp-perf, "
                   "built by bench/build-perf.sh when missing)")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON ('-' = stdout)")
    p.add_argument("--markdown", action="store_true",
                   help="print a Markdown table (for docs/performance.md) instead of plain text")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show amqp-perf's per-second lines on stderr")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        p.error("--rounds must be >= 1 and --seconds > 0")
    # absolute: the brokers run in their own temporary directories
    args.otter_python = [os.path.abspath(x) if os.sep in x else (shutil.which(x) or x)
                         for v in args.otter_python for x in v.split(",") if x]
    try:
        args.rate = [float(x) for v in args.rate for x in v.split(",") if x] or [0.0]
    except ValueError:
        p.error("--rate takes numbers")
    if any(r < 0 for r in args.rate):
        p.error("--rate must be >= 0")
    if args.otter_url and (args.otter or args.otter_python):
        p.error("use either --otter/--otter-python or --otter-url")
    if args.rabbit and args.no_rabbit:
        p.error("use either --rabbit or --no-rabbit")
    return args


def ensurePerf(perf):
    """
    Build bench/amqp-perf if needed; return the binary's path.
    """
    if perf == PERF:
        subprocess.run(["sh", BUILD], check=True)
    if not os.access(perf, os.X_OK):
        raise SystemExit(f"run.py: {perf} is not an executable")
    return perf


def _raiseOnTerm(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None):
    args = parseArgs(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _raiseOnTerm)  # so finally: stops otter
    perf = ensurePerf(args.perf)
    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]

    targets = []  # (name, url, conn dict, brokerCpu callable or None)
    rabbitTarget = None
    if not args.no_rabbit:
        url = args.rabbit or DEFAULT_RABBIT
        conn = parseUrl(url)
        if reachable(conn["host"], conn["port"]):
            pid = args.rabbit_pid
            if pid is None and conn["host"] in ("127.0.0.1", "localhost", "::1"):
                pid = listeningPid(conn["port"])
            cpu = None
            if pid is not None and cpuSeconds(pid) is not None:
                log(f"rabbitmq: CPU from pid {pid}")
                cpu = lambda pid=pid: cpuSeconds(pid)  # noqa: E731
            rabbitTarget = ("rabbitmq", url, conn, cpu)
        elif args.rabbit:
            raise SystemExit(f"run.py: RabbitMQ at {url} is not reachable")
        else:
            log(f"RabbitMQ at {url} not reachable; skipping it")
    otters = []  # (name, OtterProcess)
    interpreters = {}
    try:
        pythons = list(args.otter_python)
        if args.otter:
            pythons.insert(0, None)  # --twistd
        for python in pythons:
            repo = REPO
            if python is not None and "=" in python:
                # PATH=REPO: that interpreter on another checkout (before/after)
                python, repo = python.split("=", 1)
            if python is None:
                name, desc = "otter_tx", f"twistd {args.twistd}"
            else:
                label, desc = interpreterInfo(python)
                name = f"otter/{label}"
                k = 2
                while name in interpreters:
                    name = f"otter/{label}#{k}"
                    k += 1
                desc = f"{desc}: {python}"
                if repo != REPO:
                    name = f"{name}@{os.path.basename(repo.rstrip(os.sep))}"
                    desc += f" on {repo}"
            interpreters[name] = desc
            otter = OtterProcess(args.twistd, args.start_timeout, args.otter_arg, python=python,
                                 repo=repo)
            otters.append((name, otter))
            url = otter.start()
            targets.append((name, url, parseUrl(url), otter.cpuSeconds))
        if args.otter_url:
            conn = parseUrl(args.otter_url)
            if not reachable(conn["host"], conn["port"]):
                raise SystemExit(f"run.py: otter_tx at {args.otter_url} is not reachable")
            targets.append(("otter_tx", args.otter_url, conn, None))
        if rabbitTarget is not None:
            targets.append(rabbitTarget)
        if not targets:
            raise SystemExit("run.py: no target (give --otter, --otter-python, --otter-url "
                             "or a reachable --rabbit)")

        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["bench/run.py"] + (sys.argv[1:] if argv is None else argv)),
            "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                     "python": platform.python_version()},
            "seconds": args.seconds, "rounds": args.rounds, "rates": args.rate,
            "warmup": args.warmup,
            "targets": {name: {"url": url, "server": serverProduct(conn),
                               "interpreter": interpreters.get(name),
                               "cpu": cpu is not None}
                        for name, url, conn, cpu in targets},
            "scenarios": {s.name: {"title": s.title, "amqp_perf_args": s.perfArgs("QUEUE")}
                          for s in scenarios},
        }
        for name, info in meta["targets"].items():
            log(f"target {name}: {info['url']} ({info['server']}"
                + (f"; {info['interpreter']}" if info["interpreter"] else "") + ")")

        def checkAlive(name):
            for oname, otter in otters:
                if oname == name and not otter.alive():
                    raise RuntimeError(
                        f"{name} died (status {otter.proc.returncode}); "
                        f"log:\n{otter.logTail()}")

        if args.warmup > 0:
            for name, url, conn, cpu in targets:
                if name not in interpreters:
                    continue
                for scen in scenarios:
                    checkAlive(name)
                    queue = f"bench-warmup-{scen.name}-{os.getpid()}"
                    res = runPerf(perf, conn, scen, args.warmup, queue, 0, args.verbose)
                    s = res["summary"]
                    log(f"warm-up {scen.name:24} {name:16} recv "
                        f"{s.get('recv_rate', 0):>9,.0f}/s ({res['status']})")

        runs = []
        total = len(scenarios) * len(targets) * args.rounds * len(args.rate)
        n = 0
        for rnd in range(args.rounds):
            order = targets if rnd % 2 == 0 else targets[::-1]
            for rate in args.rate:
                for scen in scenarios:
                    for name, url, conn, cpu in order:
                        n += 1
                        checkAlive(name)
                        queue = f"bench-{scen.name}-{os.getpid()}-{n}"
                        res = runPerf(perf, conn, scen, args.seconds, queue, rate,
                                      args.verbose, cpu)
                        res.update({"scenario": scen.name, "rate": rate, "target": name,
                                    "round": rnd + 1})
                        runs.append(res)
                        s = res["summary"]
                        what = (f"[{n}/{total}] round {rnd + 1} {scen.name:24} "
                                f"{'@' + format(rate, ',.0f') if rate else 'max':>7} {name:16}")
                        if res["status"] == "ok":
                            log(f"{what} recv {s.get('recv_rate', 0):>9,.0f}/s  sent "
                                f"{s.get('sent_rate', 0):>9,.0f}/s  p50 "
                                f"{s.get('lat_p50_us', 0) / 1000:7.2f} ms  p99 "
                                f"{s.get('lat_p99_us', 0) / 1000:7.2f} ms"
                                + (f"  cpu {res['cpu_us_per_msg']:.1f} us/msg"
                                   if "cpu_us_per_msg" in res else ""))
                        else:
                            log(f"{what} FAILED (exit {res['exit']}): {res.get('stderr', '')}")
                        time.sleep(args.pause)
    finally:
        for name, otter in otters:
            otter.stop()

    order = {s.name: i for i, s in enumerate(scenarios)}
    tnames = [t[0] for t in targets]
    rows = sorted(aggregate(runs), key=lambda r: (args.rate.index(r["rate"]), order[r["scenario"]],
                                                  tnames.index(r["target"])))

    if args.json:
        doc = json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=2)
        if args.json == "-":
            print(doc)
        else:
            with open(args.json, "w") as f:
                f.write(doc + "\n")
            log(f"wrote {args.json}")
    if args.json != "-":
        if args.markdown:
            print(f"Command: `{meta['command']}` ({meta['date']}, {meta['host']['cpus']} CPUs, "
                  f"{meta['host']['platform']})\n")
            for name, info in meta["targets"].items():
                print(f"- {name}: {info['server']}"
                      + (f" on {info['interpreter']}" if info["interpreter"] else ""))
            print()
            print(markdownTable(rows))
            print("\nMedian over rounds; latency is end-to-end publish-to-delivery; "
                  "CPU us/msg is broker CPU time over the run / messages received. Scenarios:")
            for s in scenarios:
                print(f"- `{s.name}`: {s.title}")
        else:
            print(plainTable(rows))
    return 0 if all(r["status"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
