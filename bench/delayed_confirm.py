"""
Confirm latency of a delayed publish in a 3-node otter_tx cluster (issue 22;
docs/cluster.md, "Replicated delayed messages"): one publisher on node 1
publishes persistent messages one at a time and waits for each confirm, to
a durable x-delayed-message exchange (``x-delay`` 10 min: held on node 1 and
copied to the two other nodes' stores before the confirm) and, interleaved
in rounds, to a durable classic queue on node 1 (its own fsync only) and to
a 3-member quorum queue led by node 1.  Medians and 99th percentiles, ms.

    .venv-test/bin/python bench/delayed_confirm.py --count 300 --rounds 3
"""

import argparse
import statistics
import sys
import time

import pika
from twisted.internet import defer, reactor, threads

sys.path.insert(0, ".")
from otter_tx.cluster.local import LocalCluster  # noqa: E402


def params(port):
    return pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, socket_timeout=10)


def measure(port, count, rounds):
    c = pika.BlockingConnection(params(port))
    ch = c.channel()
    ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare("cq", durable=True)
    ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind("cq", "dx", "k")
    time.sleep(1)
    ch.confirm_delivery()
    kinds = {"delayed (replicated)": ("dx", "k", {"x-delay": 600000}), "classic queue": ("", "cq", None),
             "quorum queue": ("", "qq", None)}
    out = {k: [] for k in kinds}
    for _ in range(rounds):
        for kind, (ex, rk, headers) in kinds.items():
            props = pika.BasicProperties(delivery_mode=2, headers=headers)
            for i in range(count):
                t = time.perf_counter()
                ch.basic_publish(ex, rk, b"x" * 100, props)
                out[kind].append((time.perf_counter() - t) * 1000.0)
    c.close()
    return out


@defer.inlineCallbacks
def run(count, rounds):
    cluster = LocalCluster(reactor, nodes=3)
    yield cluster.start()
    try:
        out = yield threads.deferToThread(measure, cluster.nodes[0].amqpPort, count, rounds)
    finally:
        yield cluster.stop()
    for kind, xs in out.items():
        xs.sort()
        print("%-22s n=%d median %.2f ms  p99 %.2f ms" % (kind, len(xs), statistics.median(xs),
                                                           xs[int(len(xs) * 0.99) - 1]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    reactor.callWhenRunning(lambda: run(a.count, a.rounds).addErrback(print).addBoth(lambda _: reactor.stop()))
    reactor.run()


if __name__ == "__main__":
    main()
