"""
AMQP 0-9-1 stream consumers, otter_tx against the RabbitMQ peer, interleaved.

For each round and each broker: declare a fresh stream, publish N 12-byte
messages (pika, no confirms, then wait until the stream holds them), time
one reader from ``first`` to the last message (prefetch 1000, an ack with
``multiple`` every 500), time starting a reader at offset N-10 (consume to
its first delivery), and for otter_tx the broker process's RSS (VmRSS) with
the stream in place (after both reads).  otter_tx runs as ``twistd ottermq`` with a temporary
``--data-dir`` (the stream is on disk, as RabbitMQ's).  Medians over the
rounds are printed; pika is the client for both, so the reader rate is
bounded by the client on this machine.

    .venv-test/bin/python bench/streams.py [--messages N] [--rounds R] [--peer-port 5682] [--no-peer]
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def freePort():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def startOtter(dataDir, port):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon", "--pidfile=",
         "ottermq", "--amqp", "tcp:%d:interface=127.0.0.1" % port,
         "--management", "tcp:%d:interface=127.0.0.1" % freePort(),
         "--prometheus", "none", "--data-dir", dataDir],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("otter_tx did not start")


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def connect(port):
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))


def run(port, name, n, sample=None):
    c = connect(port)
    ch = c.channel()
    try:
        ch.queue_delete(name)
    except Exception:
        ch = c.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    body = b"x" * 12
    t0 = time.perf_counter()
    for _ in range(n):
        ch.basic_publish("", name, body)
    deadline = time.time() + 600
    while ch.queue_declare(name, passive=True).method.message_count < n:
        if time.time() > deadline:
            raise RuntimeError("stream never reached %d messages" % n)
        c.process_data_events(0.05)
    publish = time.perf_counter() - t0

    def read(offset):
        """Consume from ``offset`` to the last message (offset n - 1); (total s, s to the first delivery)."""
        rc = connect(port)
        rch = rc.channel()
        rch.basic_qos(prefetch_count=1000)
        state = {"n": 0, "first": None, "done": False}
        t = time.perf_counter()

        def cb(ch_, method, props, body):
            state["n"] += 1
            if state["first"] is None:
                state["first"] = time.perf_counter() - t
            last = props.headers["x-stream-offset"] == n - 1
            if state["n"] % 500 == 0 or last:
                ch_.basic_ack(method.delivery_tag, multiple=True)
            if last:
                state["done"] = True

        rch.basic_consume(name, cb, arguments={"x-stream-offset": offset})
        end = time.time() + 600
        while not state["done"] and time.time() < end:
            rc.process_data_events(0.01)
        total = time.perf_counter() - t
        # nothing is left in pika's buffer (the last message was read), so closing nacks nothing
        rc.close()
        return total, state["first"]

    readAll, _ = read("first")
    _, startNearEnd = read(n - 10)
    memory = sample() if sample is not None else None
    ch.queue_delete(name)
    c.close()
    return {"publish_s": publish, "read_all_s": readAll, "read_rate": n / readAll,
            "start_near_end_ms": startNearEnd * 1000, "rss": memory or 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer-port", type=int, default=5682)
    ap.add_argument("--no-peer", action="store_true")
    a = ap.parse_args()
    dataDir = tempfile.mkdtemp(prefix="otter-streams-bench-")
    port = freePort()
    proc = startOtter(dataDir, port)
    results = {"otter_tx": [], "rabbitmq": []}
    rsses = []
    try:
        base = rss(proc.pid)
        for r in range(a.rounds):
            name = "bench-stream-%d-%d" % (os.getpid(), r)
            results["otter_tx"].append(run(port, name + "-o", a.messages, lambda: rss(proc.pid)))
            rsses.append(results["otter_tx"][-1]["rss"])
            if not a.no_peer:
                results["rabbitmq"].append(run(a.peer_port, name + "-r", a.messages))
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(dataDir, ignore_errors=True)
    print("messages=%d (12 B), rounds=%d, %s" % (a.messages, a.rounds, sys.version.split()[0]))
    for broker, rows in results.items():
        if not rows:
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print("%-9s publish (until declare-ok counts them) %.2f s  read from first %.2f s (%.0f msg/s)  "
              "start at N-10: %.1f ms"
              % (broker, med["publish_s"], med["read_all_s"], med["read_rate"], med["start_near_end_ms"]))
    print("otter_tx RSS: %.1f MiB at start, %.1f MiB with the last round's stream in place (max %.1f MiB)"
          % (base / 2 ** 20, rsses[-1] / 2 ** 20, max(rsses) / 2 ** 20))


if __name__ == "__main__":
    main()
