"""
Stream queues in a cluster (docs/streams.md, "In a cluster"): three nodes in
this process (test_inprocess's ClusterCase), pika on a node that is not the
stream's home.  A stream has one member, its leader at its home node.
"""

import asyncio
import time

import pika
import pika.exceptions
from twisted.internet.defer import inlineCallbacks

from otter_tx.cluster import metadata as md
from otter_tx.test.cluster.test_inprocess import ClusterCase, RStreamClusterCase
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
        self.assertEqual((record["node"], record["leader"], sorted(record["members"])), ("n1", "n1", ["n1", "n2", "n3"]))
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
    def test_unackedComeBackAsCreditAndNackIsRefused(self):
        """
        Unacked deliveries of a consumer on another node: its channel closing
        gives them back to the home as credit (nothing is requeued in a
        stream); basic.nack there is 540 as at home.
        """
        def run():
            ch1 = self.conn(0).channel()
            ch1.queue_declare("s4", durable=True, arguments={"x-queue-type": "stream"})
            ch1.confirm_delivery()
            for i in range(5):
                ch1.basic_publish("", "s4", b"m%d" % i)
            c = self.conn(1)
            ch = c.channel()
            ch.basic_qos(prefetch_count=3)
            tags = []
            ch.basic_consume("s4", lambda ch, m, p, b: tags.append(m.delivery_tag),
                             arguments={"x-stream-offset": "first"})
            deadline = time.time() + 10
            while len(tags) < 3 and time.time() < deadline:
                c.process_data_events(0.1)
            assert len(tags) == 3, tags
            ch.close()
            ch = c.channel()
            ch.basic_qos(prefetch_count=3)
            tags = []
            ch.basic_consume("s4", lambda ch, m, p, b: tags.append(m.delivery_tag),
                             arguments={"x-stream-offset": "first"})
            deadline = time.time() + 10
            while len(tags) < 1 and time.time() < deadline:
                c.process_data_events(0.1)
            try:
                ch.basic_nack(tags[0])
                deadline = time.time() + 5
                while c.is_open and time.time() < deadline:
                    c.process_data_events(0.1)
                c.channel()
            except pika.exceptions.ConnectionClosedByBroker as e:
                return 3, (e.reply_code, e.reply_text)
            return None, None

        n, closed = yield self.inThread(run)
        self.assertEqual(n, 3)
        self.assertEqual(closed, (540, "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream "
                                       "queues queue 's4' in vhost '/'"))
        home = self.fixtures[0].broker.vhosts["/"].queues["s4"]
        yield waitOnReactor(lambda: home.unackedCount == 0 and not home.consumers, 5)
        self.assertEqual(home.readyCount, 5)

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


class StreamProtocolInClusterTests(RStreamClusterCase):
    """The stream protocol on every node (rstream): metadata names the leader, at the stream's home."""

    stream = True


    def inAsyncio(self, f):
        return self.inThread(lambda: asyncio.run(asyncio.wait_for(f(), 30)))

    def client(self, i):
        from rstream.client import Client

        async def start():
            c = Client("127.0.0.1", self.fixtures[i].streamPort, frame_max=1048576, heartbeat=60)
            await c.start()
            await c.authenticate("/", "guest", "guest")
            return c

        return start()

    @inlineCallbacks
    def test_metadataLeaderPublishConsumeDelete(self):
        """
        A stream created with the stream protocol on node 2 lives there;
        metadata on node 3 names node 2's stream listener as its leader, no
        replicas; rstream's producer and consumer on node 1 follow it there;
        subscribing on node 3 itself is STREAM_NOT_AVAILABLE (as RabbitMQ
        3.10 where the stream has no member), a publisher there is forwarded
        (confirmed once durable at the home), one with a reference too; deleted from node 1, it is gone
        everywhere.
        """
        rs = self.rs
        from rstream import constants, schema

        async def create():
            c = await self.client(1)
            try:
                # one member (x-initial-cluster-size 1): nodes 1 and 3 hold no replica
                await c.create_stream("ps1", arguments={"initial-cluster-size": "1"})
            finally:
                await c.close()

        yield self.inAsyncio(create)
        self.assertIn("ps1", self.fixtures[1].broker.vhosts["/"].queues)
        yield waitOnReactor(lambda: all("ps1" in f.broker.vhosts["/"].remoteQueues
                                        for f in (self.fixtures[0], self.fixtures[2])), 5)

        async def run():
            out = {}
            c = await self.client(2)
            try:
                r = await c.sync_request(schema.Metadata(c._corr_id_seq.next(), streams=["ps1", "nosuch"]),
                                         resp_schema=schema.MetadataResponse, raise_exception=False)
                brokers = {b.reference: (b.host, b.port) for b in r.brokers}
                out["brokers"] = sorted(brokers.values())
                out["metadata"] = [(m.name, m.response_code, brokers.get(m.leader_ref), m.replicas_refs)
                                   for m in r.metadata]
                r = await c.sync_request(
                    schema.Subscribe(c._corr_id_seq.next(), subscription_id=1, stream="ps1",
                                     offset_spec=schema.OffsetSpec(constants.OffsetType.FIRST), credit=10,
                                     properties=[]),
                    resp_schema=schema.SubscribeResponse, raise_exception=False)
                out["subscribe"] = r.response_code
                r = await c.sync_request(
                    schema.DeclarePublisher(c._corr_id_seq.next(), publisher_id=1, stream="ps1", reference=""),
                    resp_schema=schema.DeclarePublisherResponse, raise_exception=False)
                out["publisher"] = r.response_code
                r = await c.sync_request(
                    schema.DeclarePublisher(c._corr_id_seq.next(), publisher_id=2, stream="ps1", reference="ref"),
                    resp_schema=schema.DeclarePublisherResponse, raise_exception=False)
                out["publisher with a reference"] = r.response_code
                confirmed = asyncio.Event()
                c.add_handler(schema.PublishConfirm, lambda f: confirmed.set())
                await c.publish([schema.Message(publishing_id=1, data=bytes(rs.AMQPMessage(body=b"fwd")),
                                                filter_value=None)], 1)
                await asyncio.wait_for(confirmed.wait(), 10)
            except BaseException:
                await c.close()
                raise
            port = self.fixtures[0].streamPort
            async with rs.Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
                for i in range(5):
                    await p.send_wait("ps1", rs.AMQPMessage(body=b"m%d" % i))
            got = []
            done = asyncio.Event()

            async def cb(msg, ctx):
                got.append((ctx.offset, bytes(msg.body)))
                if len(got) == 6:
                    done.set()

            async with rs.Consumer("127.0.0.1", port=port, username="guest", password="guest") as cons:
                await cons.subscribe("ps1", cb, decoder=rs.amqp_decoder,
                                  offset_specification=rs.ConsumerOffsetSpecification(rs.OffsetType.FIRST, None))
                await asyncio.wait_for(done.wait(), 10)
            out["got"] = got
            updates = []
            updated = asyncio.Event()

            def onUpdate(frame):
                updates.append((frame.metadata_info.code, frame.metadata_info.stream))
                updated.set()

            c.add_handler(schema.MetadataUpdate, onUpdate)
            async with rs.Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
                await p.delete_stream("ps1")
            # node 3's publisher of it is told (as a publisher where the stream lives)
            try:
                await asyncio.wait_for(updated.wait(), 5)
            finally:
                await c.close()
            out["updates"] = updates
            return out

        out = yield self.inAsyncio(run)
        self.assertEqual(out["metadata"], [
            ("ps1", 1, ("127.0.0.1", self.fixtures[1].streamPort), []),
            ("nosuch", 2, None, []),
        ])
        # as RabbitMQ 3.10's: only the brokers the streams name
        self.assertEqual(out["brokers"], [("127.0.0.1", self.fixtures[1].streamPort)])
        self.assertEqual(out["subscribe"], 6)  # STREAM_NOT_AVAILABLE
        # a publisher there is forwarded to the leader, as RabbitMQ 3.10 writes to it; one with a
        # reference too (the leader de-duplicates: test_streamtracking)
        self.assertEqual(out["publisher"], 1)
        self.assertEqual(out["publisher with a reference"], 1)
        self.assertEqual(out["got"], [(0, b"fwd")] + [(i + 1, b"m%d" % i) for i in range(5)])
        self.assertEqual(out["updates"], [(6, "ps1")])
        yield waitOnReactor(lambda: all("ps1" not in f.broker.vhosts["/"].queues
                                        and "ps1" not in f.broker.vhosts["/"].remoteQueues
                                        for f in self.fixtures), 5)
