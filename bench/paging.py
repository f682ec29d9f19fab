"""
A deep queue on a real broker: RSS with N queued messages (paged beyond
--queue-memory-budget), the longest stall another client sees while a
second deep queue is purged, while a no-ack consumer that never reads its
socket subscribes (how many messages it takes), and while a no-ack consumer
drains the queue, and how long the drain takes (issue 8: "Queues larger
than memory", "Fair and bounded delivery").

    .venv/bin/python bench/paging.py --messages 1000000 --size 16
    .venv/bin/python bench/paging.py --messages 1000000 --budget 1TB   # paging off: the old behaviour

The broker is ``twistd -n ottermq`` from this venv on a free port with a
temporary --data-dir; messages are published and drained by bench/amqp-perf
(bench/build-perf.sh); a canary pika connection in this process makes a
round trip (queue.declare passive) every 5 ms and the longest one is the
stall.  RSS is /proc/PID/statm.
"""

import argparse
import os
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from memory_broker import rss, startBrokerProcess, stopBrokerProcess  # noqa: E402

sys.path.insert(0, ROOT)
from otter_tx.test.interop.test_interop_flow import _rawConsumer  # noqa: E402


class Canary(threading.Thread):
    """Round trips on its own connection, timed (``times``) since ``reset``."""

    def __init__(self, url, queue):
        threading.Thread.__init__(self, daemon=True)
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self.ch = self.conn.channel()
        self.queue = queue
        self.ch.queue_declare(queue)
        self.times = []
        self.running = True

    def reset(self):
        self.times = []

    def summary(self):
        """``canary p99 X ms, worst Y ms over N round trips``."""
        t = sorted(self.times)
        if not t:
            return "canary: no round trips"
        return "canary p99 %.0f ms, worst %.0f ms over %d round trips" % (
            t[int(len(t) * 0.99)] * 1000, t[-1] * 1000, len(t))

    def run(self):
        while self.running:
            t = time.perf_counter()
            self.ch.queue_declare(self.queue, passive=True)
            self.times.append(time.perf_counter() - t)
            time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--otter-python", default=sys.executable)
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--budget", default=None, help="--queue-memory-budget for the broker (default: its default)")
    ap.add_argument("--no-purge", action="store_true", help="skip the second queue and its purge")
    ap.add_argument("--otter-root", default=ROOT,
                    help="the otter_tx checkout the broker runs (default: this one; another for a before/after)")
    a = ap.parse_args()
    subprocess.run(["sh", os.path.join(HERE, "build-perf.sh")], check=True)
    perf = os.path.join(HERE, "amqp-perf")
    options = ["--queue-memory-budget", a.budget] if a.budget else []
    proc, tmp, url = startBrokerProcess(a.otter_python, "ottermq-paging-", *options, root=a.otter_root)
    port = urlparse(url).port
    perfUri = url + "%2f"
    try:
        print("%d messages of %d B in one queue; budget %s; broker code from %s" % (
            a.messages, a.size, a.budget or "default", a.otter_root))
        base = rss(proc.pid)

        def report(point, extra=""):
            value = rss(proc.pid)
            print("%-28s RSS %7.1f MiB (%+7.1f over start)%s" % (
                point, value / 1048576.0, (value - base) / 1048576.0, extra), flush=True)

        report("start")
        canary = Canary(url, "paging-canary")
        canary.start()
        time.sleep(3)
        report("idle 3 s", "; " + canary.summary())
        # no heartbeats: this connection idles while amqp-perf runs
        conn = pika.BlockingConnection(pika.URLParameters(url + "?heartbeat=0"))
        ch = conn.channel()
        queues = ("paging-deep",) if a.no_purge else ("paging-deep", "paging-purge")
        for q in queues:
            ch.queue_declare(q)
            canary.reset()
            t = time.perf_counter()
            subprocess.run([perf, "--uri", perfUri, "-x", "1", "-y", "0", "-C", str(a.messages), "-s", str(a.size),
                            "-u", q, "-p", "--quiet"], check=True, stdout=subprocess.DEVNULL)
            count = ch.queue_declare(q, passive=True).method.message_count
            report("%s full (%d)" % (q, count), "; publish %.1f s, %s" % (
                time.perf_counter() - t, canary.summary()))
        if not a.no_purge:
            canary.reset()
            t = time.perf_counter()
            n = ch.queue_purge("paging-purge").method.message_count
            dt = time.perf_counter() - t
            time.sleep(1)
            report("purged %d" % n, "; purge-ok in %.0f ms, %s" % (dt * 1000, canary.summary()))
        # the case: a no-ack consumer that does not read its socket
        canary.reset()
        before = ch.queue_declare("paging-deep", passive=True).method.message_count
        stuck = _rawConsumer("127.0.0.1", port, "paging-deep")
        time.sleep(3)
        after = ch.queue_declare("paging-deep", passive=True).method.message_count
        report("stuck no-ack consumer", "; took %d messages in 3 s (lost when it goes), %s" % (
            before - after, canary.summary()))
        stuck.close()
        time.sleep(0.5)
        canary.reset()
        t = time.perf_counter()
        left = ch.queue_declare("paging-deep", passive=True).method.message_count
        if not left:
            print("nothing left to drain")
            out = subprocess.CompletedProcess((), 0, "", "")
        else:
            out = subprocess.run([perf, "--uri", perfUri, "-x", "0", "-y", "1", "-a", "-D", str(left),
                                  "-u", "paging-deep", "-p", "--quiet"], check=True, capture_output=True, text=True)
        dt = time.perf_counter() - t
        report("drained no-ack (%d)" % left, "; %.1f s (%.0f msg/s), %s" % (
            dt, left / dt if left else 0, canary.summary()))
        print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "")
        canary.running = False
        canary.join(5)
        for q in queues:
            ch.queue_delete(q)
        ch.queue_delete("paging-canary")
        conn.close()
    finally:
        stopBrokerProcess(proc, tmp, seconds=30)


if __name__ == "__main__":
    main()
