"""
How promptly the other nodes of an otter_tx cluster see a SIGKILLed node
(issue 21; docs/cluster.md, "Failures"): a durable queue on node 2, a
consumer of it on node 3; node 2 is killed and the script measures, from
the kill, the consumer's basic.cancel and the first 404 ``home node ... is
down`` answer of a passive declare on node 1.  Node 2 is restarted between
rounds.  RabbitMQ 3.10 (a 3-node cluster on this machine, measured for the
issue): all within 0.12 s.

    .venv-test/bin/python bench/cluster_failover.py --rounds 5
"""

import argparse
import signal
import statistics
import sys
import threading
import time

import pika
import pika.exceptions
from twisted.internet import defer, reactor, threads

sys.path.insert(0, ".")
from otter_tx.cluster.local import LocalCluster  # noqa: E402


def params(port):
    return pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, socket_timeout=5)


def prepare(cluster):
    c = pika.BlockingConnection(params(cluster.nodes[1].amqpPort))
    c.channel().queue_declare("fq", durable=True)
    c.close()
    c3 = pika.BlockingConnection(params(cluster.nodes[2].amqpPort))
    ch3 = c3.channel()
    cancelled = []
    ch3.add_on_cancel_callback(lambda f: cancelled.append(time.monotonic()))
    ch3.basic_consume("fq", lambda *a: None)
    stop = threading.Event()

    def pump():
        while not stop.is_set() and not cancelled:
            c3.process_data_events(0.001)

    t = threading.Thread(target=pump)
    t.start()
    return c3, cancelled, stop, t


def probe404(port, deadline):
    c = pika.BlockingConnection(params(port))
    while time.monotonic() < deadline:
        ch = c.channel()
        try:
            ch.queue_declare("fq", durable=True, passive=True)
            ch.close()
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code == 404:
                c.close()
                return time.monotonic()
        time.sleep(0.002)
    return None


@defer.inlineCallbacks
def run(rounds):
    cluster = LocalCluster(reactor, nodes=3)
    yield cluster.start()
    cancels, notFound = [], []
    try:
        for i in range(rounds):
            c3, cancelled, stop, t = yield threads.deferToThread(prepare, cluster)
            yield threads.deferToThread(time.sleep, 0.3)
            killed = time.monotonic()
            yield cluster.nodes[1].kill(signal.SIGKILL)
            when404 = yield threads.deferToThread(probe404, cluster.nodes[0].amqpPort, killed + 5)
            yield threads.deferToThread(t.join, 5)
            stop.set()
            if cancelled:
                cancels.append(cancelled[0] - killed)
            if when404:
                notFound.append(when404 - killed)
            print("round %d: cancel %.3f s, 404 %.3f s" % (
                i + 1, cancels[-1] if cancelled else -1, notFound[-1] if when404 else -1))
            yield threads.deferToThread(lambda: c3.is_open and c3.close())
            yield cluster.nodes[1].start()
    finally:
        yield cluster.stop()
    for name, xs in (("basic.cancel", cancels), ("404", notFound)):
        if xs:
            print("%s after SIGKILL: median %.3f s, max %.3f s (%d rounds)" % (
                name, statistics.median(xs), max(xs), len(xs)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    reactor.callWhenRunning(lambda: run(a.rounds).addBoth(lambda r: (print(r) if r else None, reactor.stop())))
    reactor.run()


if __name__ == "__main__":
    main()
