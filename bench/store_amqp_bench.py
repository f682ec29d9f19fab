#!/usr/bin/env python3
"""
Issue 8's store rows end to end: a real broker process (``twistd -n ottermq
--data-dir``, or any broker at ``--url``, e.g. RabbitMQ) and pika clients.

``idle``: the second publisher's confirm latency with nothing else going
on (the baseline).  For each of ``ack``, ``delete`` and ``purge``: fill a durable queue with N
persistent messages (default 500,000; published without confirms, then one
confirmed publish so all are on disk), then, while a second publisher
publishes one persistent message every 10 ms into another durable queue
with publisher confirms, either consume-and-ack the whole queue (prefetch
1,000, ``multiple`` acks every 100, in a separate process), delete the queue, or purge it.  Printed:
how long the operation took and the second publisher's confirm latency
(p50 / p99 / max) while it ran and for 2 s after.  ``stop`` then fills N,
purges, and times a SIGTERM stop of the broker process.

    .venv/bin/python bench/store_amqp_bench.py idle ack delete purge stop
    .venv/bin/python bench/store_amqp_bench.py ack --url amqp://guest:guest@127.0.0.1:5682/
"""

import argparse
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def startBroker(dataDir):
    """A ``twistd -n ottermq`` child on port 0; returns (process, port)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon",
         "--pidfile=", "ottermq", "--amqp", "tcp:0:interface=127.0.0.1", "--data-dir", dataDir],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    output = b""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("broker exited:\n" + output.decode("utf-8", "replace"))
        output += line
        m = re.search(rb"AMQPServerFactory starting on (\d+)", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(m.group(1))


def params(url):
    p = pika.URLParameters(url)
    p.socket_timeout = 60
    p.blocked_connection_timeout = 300
    p.heartbeat = 0
    return p


def fill(url, queue, n):
    c = pika.BlockingConnection(params(url))
    ch = c.channel()
    ch.queue_declare(queue, durable=True)
    props = pika.BasicProperties(delivery_mode=2)
    body = b"b" * 100
    for _ in range(n):
        ch.basic_publish("", queue, body, props)
    ch.confirm_delivery()
    ch.basic_publish("", queue, body, props)
    c.close()


class SecondPublisher(threading.Thread):
    """Publishes one confirmed persistent message every 10 ms; records confirm latencies (s)."""

    def __init__(self, url, queue, deliveryMode=2):
        threading.Thread.__init__(self, daemon=True)
        self.deliveryMode = deliveryMode
        self.url = url
        self.queue = queue
        self.latencies = []
        self.stop = threading.Event()

    def run(self):
        c = pika.BlockingConnection(params(self.url))
        ch = c.channel()
        ch.queue_declare(self.queue, durable=True)
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=self.deliveryMode)
        while not self.stop.is_set():
            started = time.perf_counter()
            ch.basic_publish("", self.queue, b"second", props)
            self.latencies.append((started, time.perf_counter() - started))
            time.sleep(0.01)
        ch.queue_delete(self.queue)
        c.close()


def drain(url, queue, n):
    c = pika.BlockingConnection(params(url))
    ch = c.channel()
    ch.basic_qos(prefetch_count=1000)
    got = 0
    for method, _, _ in ch.consume(queue, inactivity_timeout=30):
        if method is None:
            break
        got += 1
        if got % 100 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if got >= n + 1:
            ch.basic_ack(method.delivery_tag, multiple=True)
            break
    ch.cancel()
    c.close()
    return got


def operate(url, queue, what):
    c = pika.BlockingConnection(params(url))
    ch = c.channel()
    if what == "delete":
        ch.queue_delete(queue)
    else:
        ch.queue_purge(queue)
        ch.queue_delete(queue)
    c.close()


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] * 1000


def measure(url, what, n, deliveryMode):
    queue = "bench-big-" + what
    if what != "idle":
        fill(url, queue, n)
    second = SecondPublisher(url, "bench-second-" + what, deliveryMode)
    second.start()
    time.sleep(1)
    started = time.perf_counter()
    if what == "idle":
        time.sleep(3)
    elif what == "ack":
        # the consumer runs in its own process, so it does not take the GIL
        # from the second publisher's thread
        consumer = multiprocessing.Process(target=drain, args=(url, queue, n))
        consumer.start()
        consumer.join()
        operate(url, queue, "delete")
    else:
        operate(url, queue, what)
    elapsed = time.perf_counter() - started
    time.sleep(2)
    second.stop.set()
    second.join(30)
    during = [lat for t, lat in second.latencies if t >= started]
    print(f"{what} of {n:,}: {elapsed:.1f} s; second publisher's confirms p50 "
          f"{percentile(during, 0.5):.1f} ms, p99 {percentile(during, 0.99):.1f} ms, "
          f"max {max(during) * 1000:.1f} ms over {len(during):,} confirms", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="+", choices=["idle", "ack", "delete", "purge", "stop"])
    p.add_argument("-n", type=int, default=500_000)
    p.add_argument("--transient", action="store_true",
                   help="the second publisher sends transient messages (no store sync): "
                        "what the broker itself adds to the latency")
    p.add_argument("--url", help="an external broker instead of a twistd child")
    args = p.parse_args()
    proc = None
    dataDir = tempfile.mkdtemp(prefix="store-amqp-bench-")
    url = args.url
    if url is None:
        proc, port = startBroker(dataDir)
        url = f"amqp://guest:guest@127.0.0.1:{port}/"
    try:
        for what in args.what:
            if what != "stop":
                measure(url, what, args.n, 1 if args.transient else 2)
        if "stop" in args.what and proc is not None:
            fill(url, "bench-stop", args.n)
            operate(url, "bench-stop", "purge")
            started = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            proc.wait(600)
            print(f"SIGTERM stop right after purging {args.n:,}: "
                  f"{time.perf_counter() - started:.2f} s", flush=True)
            proc = None
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(600)


if __name__ == "__main__":
    main()
