"""
CPU per delivered message for a deep queue, in process (no sockets): N
messages of 16 B with a timestamp and a one-entry headers table in one
queue, then one no-ack consumer (through otter_tx.testing.FakeClient) drains
it; CPU time per message, paged (default budget) or not (``--budget`` huge).

    .venv/bin/python bench/paging_cpu.py                       # paged, 8 MiB budget
    .venv/bin/python bench/paging_cpu.py --budget 100000000000  # all in memory
"""

import argparse
import gc
import shutil
import tempfile
import time

from twisted.internet.task import Clock

from otter_tx.amqp import spec
from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message
from otter_tx.broker.paging import DEFAULT_BUDGET
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.testing import FakeClient


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300000)
    ap.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    a = ap.parse_args()
    gc.set_threshold(700, 10, 1000000)  # as OtterService tunes it
    directory = tempfile.mkdtemp(prefix="otter_tx-paging-cpu-")
    try:
        clock = Clock()
        broker = Broker(clock, memoryHighWatermark=None, queueMemoryBudget=a.budget, pagingDirectory=directory)
        factory = AMQPServerFactory(broker, clock, heartbeat=0)
        vh = broker.vhosts["/"]
        q = vh.declareQueue("deep", None)
        props = encodeProperties({"timestamp": 1, "headers": {"x": 1}})
        for _ in range(a.messages):
            vh.publish(vh.exchanges[""], Message("", "deep", props, b"x" * 16))
        broker.paging.flush()
        paged = q.pagedCount
        client = FakeClient(factory)
        client.openChannel(1)
        t = time.process_time()
        client.send(1, spec.BasicConsume(0, "deep", "t", False, True, False, False, {}))
        while q.readyCount:
            clock.advance(0)
            client.transport.clear()
        cpu = time.process_time() - t
        print("%d messages, budget %d B, %d paged at start: %.2f CPU us per delivered message" % (
            a.messages, a.budget, paged, cpu / a.messages * 1e6))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
