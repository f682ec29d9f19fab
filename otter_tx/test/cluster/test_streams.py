"""
Stream queues in a cluster (docs/streams.md, "In a cluster"): three nodes in
this process (test_inprocess's ClusterCase), pika on a node that is not the
stream's home.  A stream has one member, its leader at its home node.
"""

import time

import pika
import pika.exceptions
from twisted.internet.defer import inlineCallbacks

from otter_tx.cluster import metadata as md
from otter_tx.test.cluster.test_inprocess import ClusterCase
from otter_tx.test.interop.support import waitOnReactor


class StreamAcrossNodesTests(ClusterCase):

    @inlineCallbacks
    def test_declarePublishConsumeOnOtherNodes(self):
        """
        A stream declared on node 1 lives on node 1 (client-local), recorded
        with its leader and members; node 2 publishes with confirms, node 3
        consumes from an x-stream-offset with a prefetch and acks, and each
        delivery carries x-stream-offset.
        """
        def declare():
            ch = self.conn(0).channel()
            ch.queue_declare("s1", durable=True, arguments={"x-queue-type": "stream",
                                                            "x-initial-cluster-size": 3})

        yield self.inThread(declare)
        self.assertIn("s1", self.fixtures[0].broker.vhosts["/"].queues)
        record = self.meta.data[md.queueKey("/", "s1")]
        record = record[0] if isinstance(record, tuple) else record
        self.assertEqual((record["node"], record["leader"], record["members"]), ("n1", "n1", ["n1"]))
        yield waitOnReactor(lambda: all("s1" in f.broker.vhosts["/"].remoteQueues for f in self.fixtures[1:]), 5)

        def run():
            ch2 = self.conn(1).channel()
            ch2.confirm_delivery()
            for i in range(20):
                ch2.basic_publish("", "s1", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
            c3 = self.conn(2)
            ch3 = c3.channel()
            ch3.basic_qos(prefetch_count=5)
            got = []

            def onMessage(ch, method, props, body):
                got.append((body, props.headers["x-stream-offset"]))
                ch.basic_ack(method.delivery_tag)

            ch3.basic_consume("s1", onMessage, arguments={"x-stream-offset": 10})
            deadline = time.time() + 20
            while len(got) < 10 and time.time() < deadline:
                c3.process_data_events(0.1)
            # a later publish reaches the consumer too (it reads on from the end)
            ch2.basic_publish("", "s1", b"late", pika.BasicProperties(delivery_mode=2))
            deadline = time.time() + 20
            while len(got) < 11 and time.time() < deadline:
                c3.process_data_events(0.1)
            return got

        got = yield self.inThread(run)
        self.assertEqual(got, [(b"m%d" % i, i) for i in range(10, 20)] + [(b"late", 20)])
        home = self.fixtures[0].broker.vhosts["/"].queues["s1"]
        self.assertEqual(home.readyCount, 21)  # consuming removes nothing

    @inlineCallbacks
    def test_consumeRulesOnOtherNode(self):
        """RabbitMQ 3.10's stream consumer rules hold on a node that is not the home: prefetch, no-ack, get."""
        def run():
            ch1 = self.conn(0).channel()
            ch1.queue_declare("s2", durable=True, arguments={"x-queue-type": "stream"})
            out = []
            c = self.conn(1)
            ch = c.channel()
            try:
                ch.basic_consume("s2", lambda *a: None)
            except pika.exceptions.ChannelClosedByBroker as e:
                out.append((e.reply_code, e.reply_text))
            ch = c.channel()
            ch.basic_qos(prefetch_count=1)
            try:
                ch.basic_consume("s2", lambda *a: None, auto_ack=True)
            except pika.exceptions.ConnectionClosedByBroker as e:
                out.append((e.reply_code, e.reply_text))
            c = self.conn(1)
            ch = c.channel()
            try:
                ch.basic_get("s2")
            except pika.exceptions.ConnectionClosedByBroker as e:
                out.append((e.reply_code, e.reply_text))
            return out

        out = yield self.inThread(run)
        self.assertEqual(out, [
            (406, "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue 's2' in vhost '/''"),
            (540, "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue 's2' in vhost '/'"),
            (540, "NOT_IMPLEMENTED - basic.get not supported by stream queues queue 's2' in vhost '/'"),
        ])

    @inlineCallbacks
    def test_balancedHomeAndDelete(self):
        """A balanced stream goes to the node with fewest queues; deleted from another node, it goes everywhere."""
        def run():
            ch = self.conn(0).channel()
            ch.queue_declare("pad", durable=True)
            ch.queue_declare("s3", durable=True, arguments={"x-queue-type": "stream",
                                                            "x-queue-leader-locator": "balanced"})

        yield self.inThread(run)
        homes = [i for i, f in enumerate(self.fixtures) if "s3" in f.broker.vhosts["/"].queues]
        self.assertEqual(homes, [1])
        log = self.fixtures[1].broker.vhosts["/"].queues["s3"].stream

        def delete():
            ch = self.conn(2).channel()
            ch.queue_delete("s3")

        yield self.inThread(delete)
        yield waitOnReactor(lambda: all("s3" not in f.broker.vhosts["/"].queues
                                        and "s3" not in f.broker.vhosts["/"].remoteQueues for f in self.fixtures), 5)
        self.assertTrue(log.deleted)
