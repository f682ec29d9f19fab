"""
Memory of a real broker process, before, during and after: a burst of
traffic, 1,000,000 queued messages then a purge, the same then a queue
delete, and many connections then closing them.  RSS (from
/proc/PID/statm) is read right after each step and again after --idle
seconds, long enough for the broker's MemoryReleaser (it looks every second).

    .venv/bin/python bench/memory_broker.py --otter-python .venv-pypy/bin/python
    .venv/bin/python bench/memory_broker.py --otter-python .venv/bin/python [--messages N] [--connections C]

The broker is ``twistd -n ottermq`` from the given interpreter's venv, on a
free port with a temporary --data-dir; messages are published by
bench/amqp-perf (built by bench/build-perf.sh), purges, deletes and
connections are made from the driver's interpreter (pika, and plain
sockets through the AMQP handshake for the connections).  Extra
environment for the broker (PYPY_GC_* knobs) can be given with --env K=V.
"""

import argparse
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlparse

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def freePort():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss(pid):
    with open("/proc/%d/statm" % pid) as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def waitForPort(port, seconds=60):
    """Wait until something accepts connections on 127.0.0.1:``port`` (the broker started)."""
    for _ in range(int(seconds * 2)):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.5)


def stopBroker(proc, seconds=30):
    """SIGTERM the broker process; kill it if it is not gone within ``seconds``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def startBrokerProcess(python, prefix, *options, root=ROOT, env=None):
    """
    Start ``twistd -n ottermq`` from ``python``'s venv, running the
    otter_tx checkout at ``root``, on a free loopback port with a fresh
    data directory and ``options``; ``env`` adds to the environment.
    Waits until it listens.  Returns ``(process, tmpDir, amqpUrl)``; the
    log is ``tmpDir/twistd.log``.
    """
    twistd = os.path.join(os.path.dirname(os.path.abspath(python)), "twistd")
    tmp = tempfile.mkdtemp(prefix=prefix)
    port = freePort()
    proc = subprocess.Popen(
        [twistd, "-n", "--pidfile=", "--logfile=" + os.path.join(tmp, "twistd.log"), "ottermq",
         "--amqp", "tcp:%d:interface=127.0.0.1" % port, "--management", "tcp:0:interface=127.0.0.1",
         "--prometheus", "none", "--stream", "none",
         "--data-dir", os.path.join(tmp, "data")] + list(options),
        env=dict(os.environ, PYTHONPATH=os.path.abspath(root)) | (env or {}), cwd=tmp)
    waitForPort(port)
    return proc, tmp, "amqp://guest:guest@127.0.0.1:%d/" % port


def stopBrokerProcess(proc, tmp, keep=False, seconds=15):
    """:func:`stopBroker`, then remove ``tmp`` unless ``keep`` (then say where it is)."""
    stopBroker(proc, seconds)
    if keep:
        print("broker log kept in", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def _readFrame(sock):
    """Read one whole frame (bytes) from a blocking socket."""
    data = b""
    while len(data) < 7 or len(data) < 8 + struct.unpack("!I", data[3:7])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError("broker closed the connection")
        data += chunk
    return data


def openRaw(port):
    """
    A plain socket that went through the AMQP handshake and opened channel 1
    (one descriptor per connection on our side, unlike pika's).
    """
    from otter_tx.amqp import spec
    from otter_tx.door.protocol import methodFrame

    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(spec.PROTOCOL_HEADER)
    _readFrame(sock)  # connection.start
    sock.sendall(methodFrame(0, spec.ConnectionStartOk({}, "PLAIN", b"\0guest\0guest", "en_US")))
    _readFrame(sock)  # connection.tune
    sock.sendall(methodFrame(0, spec.ConnectionTuneOk(2047, 131072, 0))
                 + methodFrame(0, spec.ConnectionOpen("/", "", False)))
    _readFrame(sock)  # connection.open-ok
    sock.sendall(methodFrame(1, spec.ChannelOpen("")))
    _readFrame(sock)  # channel.open-ok
    return sock


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--otter-python", default=sys.executable)
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--idle", type=float, default=12.0)
    ap.add_argument("--traffic", type=float, default=10.0, help="seconds of 1p/1c autoack traffic first")
    ap.add_argument("--env", action="append", default=[], help="K=V for the broker's environment")
    a = ap.parse_args()
    subprocess.run(["sh", os.path.join(HERE, "build-perf.sh")], check=True)
    perf = os.path.join(HERE, "amqp-perf")
    extra = dict(kv.split("=", 1) for kv in a.env)
    proc, tmp, url = startBrokerProcess(a.otter_python, "ottermq-mem-", env=extra)
    port = urlparse(url).port
    perfUri = url + "%2f"
    try:
        version = subprocess.run([a.otter_python, "-c", "import platform; print(platform.python_implementation(),"
                                  " platform.python_version())"], capture_output=True, text=True).stdout.strip()
        print("broker on %s%s; %d messages of %d B; %d connections; idle %.0f s" % (
            version, (" with " + " ".join(a.env)) if a.env else "", a.messages, a.size, a.connections, a.idle))
        base = rss(proc.pid)

        def report(phase, point):
            value = rss(proc.pid)
            print("%-12s %-16s RSS %7.1f MiB (%+7.1f over start)" % (
                phase, point, value / 1048576.0, (value - base) / 1048576.0), flush=True)

        def settle(phase):
            time.sleep(1)
            report(phase, "+1 s")
            time.sleep(a.idle - 1)
            report(phase, "+%.0f s" % a.idle)

        report("start", "")
        if a.traffic:
            subprocess.run([perf, "--uri", perfUri, "-x", "1", "-y", "1", "-a", "-z", str(int(a.traffic)),
                            "-u", "traffic", "--auto-delete", "--quiet"], check=True, stdout=subprocess.DEVNULL)
            report("traffic", "done")
            settle("traffic")

        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        for phase in ("purge", "delete"):
            ch.queue_declare("mem-" + phase)
            subprocess.run([perf, "--uri", perfUri, "-x", "1", "-y", "0", "-C", str(a.messages), "-s", str(a.size),
                            "-u", "mem-" + phase, "-p", "--quiet"], check=True, stdout=subprocess.DEVNULL)
            count = ch.queue_declare("mem-" + phase, passive=True).method.message_count
            report(phase, "full (%d)" % count)
            if phase == "purge":
                ch.queue_purge("mem-purge")
            else:
                ch.queue_delete("mem-delete")
            report(phase, "emptied")
            settle(phase)
        ch.queue_delete("mem-purge")
        conn.close()

        if a.connections:
            conns = [openRaw(port) for _ in range(a.connections)]
            report("connections", "open")
            for c in conns:
                c.close()
            del conns
            report("connections", "closed")
            settle("connections")
    finally:
        stopBroker(proc)
        logs = sorted((name for name in os.listdir(tmp) if name.startswith("twistd.log")), reverse=True)
        for name in logs:  # twistd rotates at 1 MB: twistd.log.2, .1, then twistd.log
            with open(os.path.join(tmp, name)) as f:
                for line in f:
                    if "otter_tx.resources.process_memory" in line:
                        print("broker log:", line.rstrip())
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
