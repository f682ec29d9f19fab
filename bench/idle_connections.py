"""
Idle AMQP connections: open N connections (default 15,000; full handshake,
heartbeat 0, no channel) to each broker and report its RSS per connection.

    ulimit -n 40000   # if the hard limit allows; each side needs N descriptors
    .venv/bin/python bench/idle_connections.py --otter-python .venv/bin/python,pypy-venv/bin/python

Targets as in bench/run.py: ``--otter-python PATH`` (repeatable or a comma
list) starts one otter_tx per interpreter (its own temporary data directory,
a free port), ``--rabbit URL`` / ``--no-rabbit`` for RabbitMQ (its pid is
found from its listening socket, or ``--rabbit-pid``).  For each target:
RSS before, after opening all connections (plus ``--settle`` seconds), and
after closing them again (plus ``--settle`` seconds); bytes per connection
= (after - before) / N.  Targets are measured one after another (each gets
the whole machine).  The client is this script: blocking sockets, one
handshake at a time, so nothing is pipelined that a broker might refuse.

The client process also needs N file descriptors: its soft limit is raised
to the hard limit at start.
"""

import argparse
import os
import resource
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run as benchrun  # noqa: E402  (bench/run.py: OtterProcess, listeningPid, ...)

_frame = struct.Struct("!BHI")


def rssBytes(pid):
    """VmRSS of ``pid`` in bytes (all its threads)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _method(classId, methodId, args):
    payload = struct.pack("!HH", classId, methodId) + args
    return _frame.pack(1, 0, len(payload)) + payload + b"\xce"


def _shortstr(b):
    return bytes((len(b),)) + b


def _longstr(b):
    return struct.pack("!I", len(b)) + b


def _readFrame(sock, buf):
    """Read one whole frame; return (type, payload, rest of buf)."""
    while len(buf) < 7:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("broker closed the connection during the handshake")
        buf += chunk
    ftype, _, size = _frame.unpack_from(buf, 0)
    while len(buf) < 8 + size:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("broker closed the connection during the handshake")
        buf += chunk
    return ftype, buf[7:7 + size], buf[8 + size:]


def handshake(host, port, user, password, vhost, heartbeat=0):
    """One open, idle AMQP connection (a connected socket)."""
    s = socket.create_connection((host, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    buf = b""
    _, payload, buf = _readFrame(s, buf)  # connection.start
    if payload[:4] != b"\x00\x0a\x00\x0a":
        raise ConnectionError(f"expected connection.start, got {payload[:4]!r}")
    response = b"\x00" + user.encode() + b"\x00" + password.encode()
    s.sendall(_method(10, 11, struct.pack("!I", 0) + _shortstr(b"PLAIN")
                      + _longstr(response) + _shortstr(b"en_US")))
    _, payload, buf = _readFrame(s, buf)  # connection.tune
    if payload[:4] != b"\x00\x0a\x00\x1e":
        raise ConnectionError(f"expected connection.tune, got {payload[:4]!r}")
    channelMax, frameMax, _ = struct.unpack_from("!HIH", payload, 4)
    # heartbeat 0 (default): idle connections are kept without heartbeat
    # traffic; with --heartbeat the broker runs its heartbeat timer (and
    # sends heartbeats this client never reads: they are few and small)
    s.sendall(_method(10, 31, struct.pack("!HIH", channelMax, frameMax, heartbeat))
              + _method(10, 40, _shortstr(vhost.encode()) + _shortstr(b"") + b"\x00"))
    _, payload, buf = _readFrame(s, buf)  # connection.open-ok
    if payload[:4] != b"\x00\x0a\x00\x29":
        raise ConnectionError(f"expected connection.open-ok, got {payload[:4]!r}")
    s.settimeout(None)
    return s


def measure(name, pid, conn, n, settle, heartbeat=0):
    """Open n connections to one broker; return a result dict."""
    time.sleep(settle)
    before = rssBytes(pid)
    socks = []
    t0 = time.monotonic()
    error = None
    try:
        for i in range(n):
            socks.append(handshake(conn["host"], conn["port"], conn["user"],
                                   conn["password"], conn["vhost"], heartbeat))
            if (i + 1) % 5000 == 0:
                benchrun.log(f"{name}: {i + 1} connections ({time.monotonic() - t0:.0f} s)")
    except OSError as e:
        error = f"{type(e).__name__}: {e} after {len(socks)} connections"
        benchrun.log(f"{name}: {error}")
    opened = len(socks)
    openSeconds = time.monotonic() - t0
    time.sleep(settle)
    during = rssBytes(pid)
    for s in socks:
        s.close()
    socks = None
    time.sleep(settle)
    after = rssBytes(pid)
    res = {"target": name, "connections": opened, "heartbeat": heartbeat, "open_s": round(openSeconds, 1),
           "rss_before_mib": round(before / 2 ** 20, 1), "rss_open_mib": round(during / 2 ** 20, 1),
           "rss_closed_mib": round(after / 2 ** 20, 1),
           "bytes_per_connection": round((during - before) / opened) if opened else None}
    if error:
        res["error"] = error
    benchrun.log(f"{name}: {res}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=15000)
    ap.add_argument("--otter-python", action="append", default=[], metavar="PATH")
    ap.add_argument("--rabbit", metavar="URL")
    ap.add_argument("--no-rabbit", action="store_true")
    ap.add_argument("--rabbit-pid", type=int)
    ap.add_argument("--heartbeat", type=int, default=0,
                    help="heartbeat seconds the client asks for in tune-ok (default 0: none)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds to wait before each RSS reading (default 3)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < a.connections + 100:
        benchrun.log(f"warning: RLIMIT_NOFILE hard limit {hard} < {a.connections} connections")
    pythons = [os.path.abspath(x) if os.sep in x else x
               for v in a.otter_python for x in v.split(",") if x]
    results = []
    for python in pythons:
        label, desc = benchrun.interpreterInfo(python)
        otter = benchrun.OtterProcess(python=python)
        try:
            url = otter.start()
            results.append(measure(f"otter/{label}", otter.proc.pid, benchrun.parseUrl(url),
                                   a.connections, a.settle, a.heartbeat))
        finally:
            otter.stop()
    if not a.no_rabbit:
        url = a.rabbit or benchrun.DEFAULT_RABBIT
        conn = benchrun.parseUrl(url)
        pid = a.rabbit_pid or benchrun.listeningPid(conn["port"])
        if pid is None:
            benchrun.log(f"RabbitMQ at {url}: no pid found; skipped")
        else:
            results.append(measure("rabbitmq", pid, conn, a.connections, a.settle, a.heartbeat))
    print("| target | connections | heartbeat | RSS before | RSS with them open | RSS after closing | "
          "per connection |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['target']} | {r['connections']:,} | {r['heartbeat']} s | {r['rss_before_mib']} MiB | "
              f"{r['rss_open_mib']} MiB | {r['rss_closed_mib']} MiB | "
              f"{r['bytes_per_connection'] / 1000:.1f} kB |"
              + (f" ({r['error']})" if "error" in r else ""))


if __name__ == "__main__":
    main()
