"""
Replicated delayed messages after a SIGKILL (issue 22; docs/cluster.md,
"Replicated delayed messages"): three local twistd nodes and etcd; node 1
holds ``--count`` confirmed delayed messages (``--delay`` ms, published one
confirm at a time) of a durable x-delayed-message exchange bound to a
durable queue on node 2, and is SIGKILLed right after the last confirm.  A
consumer on node 2 counts what arrives (once, twice, missing) and how late
each message is after its due time (its publish time + the delay).

    .venv-test/bin/python bench/delayed_failover.py --count 500 --delay 3000 --rounds 3
"""

import argparse
import signal
import statistics
import sys
import time

import pika
from twisted.internet import defer, reactor, threads

sys.path.insert(0, ".")
from otter_tx.cluster.local import LocalCluster  # noqa: E402


def params(port):
    return pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, socket_timeout=10)


def publish(port, queuePort, count, delay, tag):
    c2 = pika.BlockingConnection(params(queuePort))
    c2.channel().queue_declare("fq", durable=True)
    c2.close()
    c = pika.BlockingConnection(params(port))
    ch = c.channel()
    ch.exchange_declare("fx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_bind("fq", "fx", "k")
    time.sleep(1)
    ch.confirm_delivery()
    due = {}
    for i in range(count):
        body = b"%s-%d" % (tag, i)
        t = time.time()
        ch.basic_publish("fx", "k", body, pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}))
        due[body] = t + delay / 1000.0
    c.close()
    return due


def consume(port, due, seconds):
    c = pika.BlockingConnection(params(port))
    ch = c.channel()
    got = {}
    late = []
    deadline = time.time() + seconds
    while time.time() < deadline and len(got) < len(due):
        m = ch.basic_get("fq", auto_ack=True)
        if m[0] is None:
            time.sleep(0.005)
            continue
        now = time.time()
        got[m[2]] = got.get(m[2], 0) + 1
        if got[m[2]] == 1 and m[2] in due:
            late.append((now - due[m[2]]) * 1000.0)
    time.sleep(1)
    while True:
        m = ch.basic_get("fq", auto_ack=True)
        if m[0] is None:
            break
        got[m[2]] = got.get(m[2], 0) + 1
    c.close()
    return got, late


@defer.inlineCallbacks
def run(count, delay, rounds):
    for r in range(rounds):
        cluster = LocalCluster(reactor, nodes=3)
        yield cluster.start()
        try:
            nodes = cluster.nodes
            due = yield threads.deferToThread(publish, nodes[0].amqpPort, nodes[1].amqpPort, count, delay, b"r%d" % r)
            killed = time.time()
            yield nodes[0].kill(signal.SIGKILL)
            got, late = yield threads.deferToThread(consume, nodes[1].amqpPort, due, delay / 1000.0 + 20)
        finally:
            yield cluster.stop()
        missing = len([b for b in due if b not in got])
        twice = len([b for b, n in got.items() if n > 1])
        print("round %d: %d published, %d received, %d missing, %d twice; last due %.2f s after the kill; "
              "lateness after due ms: min %.1f median %.1f max %.1f" % (
                  r + 1, count, len(got), missing, twice, max(due.values()) - killed,
                  min(late), statistics.median(late), max(late)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--delay", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    reactor.callWhenRunning(lambda: run(a.count, a.delay, a.rounds).addErrback(print)
                            .addBoth(lambda _: reactor.stop()))
    reactor.run()


if __name__ == "__main__":
    main()
