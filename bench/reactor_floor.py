"""
The floor under otter_tx's CPU per message at low rates (issue 12): the
same reactor with no broker in it.

A Twisted server process (CPython or PyPy, whichever runs this script)
accepts two connections from a paced client process: every read from the
first is either dropped (``recv``: one reactor wake-up and one ``recv`` per
message, the publisher's side alone) or written to the second (``forward``:
plus one ``send``, a broker's publish in and deliver out with no broker
work between).  The client sends one 60-byte message every 1/RATE s, as
``amqp-perf -r RATE`` paces its publisher, so each read carries one
message.  The server's CPU time (user + sys, ``/proc/PID/stat``) divided by
the messages it received is printed per mode and rate:

    .venv/bin/python bench/reactor_floor.py [--seconds 4] [--rates 1000,10000] [--repeat 2]

Compare with ``bench/cpu-per-message.sh`` on a real broker
(docs/performance.md, "CPU per message at low rates").
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

SERVER = r"""
import sys
from twisted.internet import protocol, reactor
mode = sys.argv[1]
conns = []
class P(protocol.Protocol):
    def connectionMade(self):
        conns.append(self)
    def dataReceived(self, data):
        if mode == "forward" and self is conns[0] and len(conns) > 1:
            conns[1].transport.write(data)
port = reactor.listenTCP(0, protocol.Factory.forProtocol(P), interface="127.0.0.1")
print(port.getHost().port, flush=True)
reactor.run()
"""


def cpuSeconds(pid):
    """User + system CPU seconds of process ``pid`` (float)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(mode, rate, seconds):
    """One measurement: (messages received by the server, server CPU µs per message)."""
    server = subprocess.Popen([sys.executable, "-c", SERVER, mode], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        producer = socket.create_connection(("127.0.0.1", port))
        time.sleep(0.1)
        consumer = socket.create_connection(("127.0.0.1", port))
        time.sleep(0.1)

        def drain():
            while consumer.recv(65536):
                pass

        threading.Thread(target=drain, daemon=True).start()
        msg = b"x" * 60
        before = cpuSeconds(server.pid)
        n, start, interval = 0, time.perf_counter(), 1.0 / rate
        while True:
            now = time.perf_counter()
            if now - start >= seconds:
                break
            due = start + n * interval
            if now < due:
                time.sleep(due - now)
            producer.send(msg)
            n += 1
        time.sleep(0.3)
        used = cpuSeconds(server.pid) - before
        producer.close()
        consumer.close()
        return n, used * 1e6 / n
    finally:
        server.kill()
        server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rates", default="1000,10000")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    print("interpreter: %s %s" % (sys.implementation.name, sys.version.split()[0]))
    for _ in range(a.repeat):
        for rate in [int(r) for r in a.rates.split(",")]:
            for mode in ("recv", "forward"):
                n, us = run(mode, rate, a.seconds)
                print("%-8s rate %6d msg/s  messages %7d  server CPU %6.1f us/msg" % (mode, rate, n, us))


if __name__ == "__main__":
    main()
