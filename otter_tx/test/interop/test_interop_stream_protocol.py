"""
The RabbitMQ stream protocol with real clients: rstream (Python) and
rabbitmq-stream-js-client (Node.js), plus a raw client for the exact response
codes. Against the in-process broker the stream listener is on tcp:0; in the
reference run (``OTTER_TEST_STREAM_PORT``, 5562 on the RabbitMQ 3.10 peer with
rabbitmq_stream) the same tests run against RabbitMQ.

Super streams and single active consumer are RabbitMQ 3.11+ features the 3.10
peer lacks: those tests run against otter_tx only.
"""

import asyncio
import json
import os
import platform
import shutil
import struct
import time

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from otter_tx.stream import amqp10, chunk, wire
from otter_tx.test.interop.support import EXTERNAL, InteropTestCase, inProcessOnly, requireModule, waitUntilAsync

EXTERNAL_STREAM_PORT = os.environ.get("OTTER_TEST_STREAM_PORT")
NODE_DIR = os.path.join(os.path.dirname(__file__), "node")


def only311(reason):
    """RabbitMQ 3.11+ behaviour: the 3.10 reference peer cannot check it."""

    def deco(f):
        if EXTERNAL:
            f.skip = "RabbitMQ 3.11+ feature, the 3.10 peer lacks it: " + reason
        return f

    return deco


class StreamInteropTestCase(InteropTestCase):
    brokerOptions = {"stream": True}

    def setUp(self):
        d = InteropTestCase.setUp(self)

        def ports(_):
            if EXTERNAL:
                if not EXTERNAL_STREAM_PORT:
                    raise SkipTest("OTTER_TEST_STREAM_PORT is not set for the external broker")
                self.streamPort = int(EXTERNAL_STREAM_PORT)
            else:
                self.streamPort = self.fixture.streamPort

        if d is None:
            ports(None)
            return None
        return d.addCallback(ports)

    def raw(self):
        from otter_tx.test.interop.stream_raw import RawStreamClient

        c = RawStreamClient(self.host, self.streamPort)
        self.addCleanup(c.close)
        return c

    def rstream(self):
        if platform.python_implementation() != "CPython":
            raise SkipTest("rstream needs mmh3, which does not build on PyPy (setup.cfg installs it on CPython)")
        return requireModule("rstream")

    def producer(self, rstream, **kw):
        return rstream.Producer(self.host, port=self.streamPort, username="guest", password="guest", **kw)

    def consumer(self, rstream, **kw):
        return rstream.Consumer(self.host, port=self.streamPort, username="guest", password="guest", **kw)

    def deleteLater(self, name):
        def delete():
            c = self.raw()
            c.handshake()
            c.delete(name)

        self.addCleanup(lambda: self.inThread(delete))


async def collect(consumer, stream, rstream, n, spec=None, timeout=10.0, **kw):
    """Subscribe and gather ``n`` ``(offset, body)``."""
    return await (await subscribed(consumer, stream, rstream, n, spec, timeout, **kw))


async def subscribed(consumer, stream, rstream, n, spec=None, timeout=10.0, **kw):
    """
    Subscribe: returns once the server has answered the subscribe (rstream
    awaits its response), with a coroutine that gathers ``n`` ``(offset,
    body)`` within ``timeout`` seconds.
    """
    got = []
    done = asyncio.Event()

    async def cb(msg, ctx):
        got.append((ctx.offset, bytes(msg.body) if isinstance(msg.body, (bytes, bytearray)) else msg.body))
        if len(got) >= n:
            done.set()

    if spec is None:
        spec = rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST, None)
    await consumer.subscribe(stream, cb, decoder=rstream.amqp_decoder, offset_specification=spec, **kw)

    async def gathered():
        await asyncio.wait_for(done.wait(), timeout)
        return got

    return gathered()


async def publishOneFrame(case, name, bodies, timeout=10.0):
    """
    Create stream ``name`` and publish ``bodies`` (AMQP 1.0 bytes) with ids 1.. in ONE publish
    frame, whatever its size, through rstream's low-level client (its Producer batches):
    the ids confirmed (list), once all are or the connection is gone.
    """
    from rstream import schema
    from rstream.client import Client

    c = Client(case.host, case.streamPort, frame_max=1048576, heartbeat=60)
    await c.start()
    try:
        await c.authenticate(vhost="/", username="guest", password="guest")
        await c.create_stream(name)
        await c.declare_publisher(name, None, 1)
        confirmed = []
        c.add_handler(schema.PublishConfirm, lambda f: confirmed.extend(f.publishing_ids), name="confirms")
        await c.publish([schema.Message(publishing_id=i, filter_value=None, data=b)
                         for i, b in enumerate(bodies, 1)], 1)
        await waitUntilAsync(lambda: len(confirmed) >= len(bodies) or not c.is_connection_alive(),
                             timeout=timeout)
    finally:
        await c.close()
    return confirmed


async def publishSuperStream(case, rstream, name, n=30, partitions=3):
    """
    Create super stream ``name`` with ``partitions`` partitions and publish
    ``n`` messages ``m0``.. routed by the hash of their ``id`` property;
    returns once every one is confirmed (stored in its partition).
    """
    async def key(m):
        return m.application_properties["id"]

    async with rstream.SuperStreamProducer(
            case.host, port=case.streamPort, username="guest", password="guest",
            super_stream=name, routing_extractor=key, routing=rstream.RouteType.Hash,
            super_stream_creation_option=rstream.SuperStreamCreationOption(n_partitions=partitions)) as p:
        confirmed = []

        async def onConfirm(status):
            confirmed.append(status.is_confirmed)

        for i in range(n):
            await p.send(rstream.AMQPMessage(body=b"m%d" % i, application_properties={"id": str(i)}),
                         on_publish_confirm=onConfirm)
        await waitUntilAsync(lambda: len(confirmed) >= n, timeout=10)


class RstreamTests(StreamInteropTestCase):
    """rstream against the stream door."""

    def test_publishConfirmConsume(self):
        """send_wait (confirmed) and a batch, read back from first with their offsets."""
        rstream = self.rstream()
        name = self.name("s")

        async def run():
            async with self.producer(rstream) as p:
                await p.create_stream(name)
                for i in range(5):
                    await p.send_wait(name, rstream.AMQPMessage(body=b"m%d" % i))
                await p.send_batch(name, [rstream.AMQPMessage(body=b"b%d" % i) for i in range(200)])
            async with self.consumer(rstream) as c:
                got = await collect(c, name, rstream, 205)
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            return got

        got = yield self.inAsyncio(run)
        self.assertEqual([o for o, _ in got], list(range(205)))
        self.assertEqual(got[0][1], b"m0")
        self.assertEqual(got[-1][1], b"b199")

    test_publishConfirmConsume = inlineCallbacks(test_publishConfirmConsume)

    @inlineCallbacks
    def test_offsetSpecifications(self):
        """offset, next, last and timestamp subscriptions start where RabbitMQ starts them."""
        rstream = self.rstream()
        name = self.name("s")

        async def run():
            out = {}
            async with self.producer(rstream) as p:
                await p.create_stream(name)
                for i in range(10):
                    await p.send_wait(name, rstream.AMQPMessage(body=b"m%d" % i))
                before = int(time.time() * 1000)
                await asyncio.sleep(0.05)
                async with self.consumer(rstream) as c:
                    got = await collect(c, name, rstream, 1,
                                        rstream.ConsumerOffsetSpecification(rstream.OffsetType.OFFSET, 7))
                    out["offset"] = got[0]
                async with self.consumer(rstream) as c:
                    got = await collect(c, name, rstream, 1,
                                        rstream.ConsumerOffsetSpecification(rstream.OffsetType.LAST, None))
                    out["last"] = got[-1]
                async with self.consumer(rstream) as c:
                    # attached once the subscribe is answered: "next" is the message sent after it
                    waiting = await subscribed(
                        c, name, rstream, 1, rstream.ConsumerOffsetSpecification(rstream.OffsetType.NEXT, None))
                    await p.send_wait(name, rstream.AMQPMessage(body=b"after"))
                    out["next"] = (await waiting)[0]
                async with self.consumer(rstream) as c:
                    got = await collect(c, name, rstream, 1,
                                        rstream.ConsumerOffsetSpecification(rstream.OffsetType.TIMESTAMP, before))
                    out["timestamp"] = got[0]
                await p.delete_stream(name)
            return out

        out = yield self.inAsyncio(run)
        self.assertEqual(out["offset"], (7, b"m7"))
        self.assertEqual(out["last"], (9, b"m9"), out)
        self.assertEqual(out["next"], (10, b"after"))
        # the first chunk stamped at or after the time asked (osiris): stamps are whole
        # milliseconds, so the first of the messages sent in the millisecond "before" was taken
        # (m9, m8, ... m5 was seen on RabbitMQ 3.10), else "after";
        # test_timestampBetweenBatches checks the rule with times far from any message
        self.assertLessEqual(out["timestamp"][0], 10, out)

    @inlineCallbacks
    def test_timestampBetweenBatches(self):
        """
        A timestamp subscription starts at the first chunk stamped at or after the time,
        as RabbitMQ 3.10 (osiris): a time between two batches starts at the second (rstream's
        test_offset_type_timestamp), a time after every chunk at next.
        """
        rstream = self.rstream()
        name = self.name("s")

        async def run():
            out = {}
            async with self.producer(rstream) as p:
                await p.create_stream(name)
                for i in range(3):
                    await p.send_wait(name, rstream.AMQPMessage(body=b"a%d" % i))
                await asyncio.sleep(0.3)
                between = int(time.time() * 1000)
                await asyncio.sleep(0.3)
                for i in range(3):
                    await p.send_wait(name, rstream.AMQPMessage(body=b"b%d" % i))
                await asyncio.sleep(0.3)
                after = int(time.time() * 1000)
                await asyncio.sleep(0.3)
                async with self.consumer(rstream) as c:
                    out["between"] = await collect(c, name, rstream, 3, rstream.ConsumerOffsetSpecification(
                        rstream.OffsetType.TIMESTAMP, between))
                async with self.consumer(rstream) as c:
                    waiting = await subscribed(c, name, rstream, 1, rstream.ConsumerOffsetSpecification(
                        rstream.OffsetType.TIMESTAMP, after))
                    await asyncio.sleep(0.3)
                    await p.send_wait(name, rstream.AMQPMessage(body=b"late"))
                    out["after"] = (await waiting)[0]
                await p.delete_stream(name)
            return out

        out = yield self.inAsyncio(run)
        self.assertEqual(out["between"][:3], [(3, b"b0"), (4, b"b1"), (5, b"b2")], out)
        self.assertEqual(out["after"], (6, b"late"), out)

    @inlineCallbacks
    def test_deduplication(self):
        """A named publisher's repeated publishing ids are confirmed but stored once."""
        rstream = self.rstream()
        name = self.name("s")

        async def run():
            async with self.producer(rstream) as p:
                await p.create_stream(name)
                for i in range(1, 4):
                    m = rstream.AMQPMessage(body=b"m%d" % i)
                    m.publishing_id = i
                    await p.send_wait(name, m, publisher_name="app")
            async with self.producer(rstream) as p:
                for i in range(2, 6):
                    m = rstream.AMQPMessage(body=b"m%d" % i)
                    m.publishing_id = i
                    await p.send_wait(name, m, publisher_name="app")
            async with self.consumer(rstream) as c:
                got = await collect(c, name, rstream, 5)
                await asyncio.sleep(0.3)
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            return got

        got = yield self.inAsyncio(run)
        self.assertEqual([b for _, b in got], [b"m1", b"m2", b"m3", b"m4", b"m5"])

    @inlineCallbacks
    def test_deduplicationWithinFrame(self):
        """
        De-duplication is message by message, as osiris' writer does it: the repeats of
        one publish frame ([1, 2, 3, 1, 2, 3]) and ids below an earlier one of the frame
        ([5, 4, 6, 6]: 4 and the second 6) are confirmed and not stored (rstream's
        test_publish_deduplication_async batches its sends into such frames).
        """
        rstream = self.rstream()
        from rstream import schema
        from rstream.client import Client

        name = self.name("s")

        async def run():
            c = Client(self.host, self.streamPort, frame_max=1048576, heartbeat=60)
            await c.start()
            try:
                await c.authenticate(vhost="/", username="guest", password="guest")
                await c.create_stream(name)
                await c.declare_publisher(name, "app", 1)
                confirmed = []
                c.add_handler(schema.PublishConfirm, lambda f: confirmed.extend(f.publishing_ids), name="confirms")
                for ids in ([1, 2, 3, 1, 2, 3], [5, 4, 6, 6]):
                    await c.publish([schema.Message(publishing_id=i, filter_value=None,
                                                    data=amqp10.dataSection(b"m%d" % i)) for i in ids], 1)
                await waitUntilAsync(lambda: len(confirmed) >= 10, timeout=10)
                sequence = await c.query_publisher_sequence(name, "app")
            finally:
                await c.close()
            async with self.consumer(rstream) as cons:
                got = await collect(cons, name, rstream, 5)
                await asyncio.sleep(0.3)
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            return sorted(confirmed), sequence, got

        confirmed, sequence, got = yield self.inAsyncio(run)
        self.assertEqual(confirmed, [1, 1, 2, 2, 3, 3, 4, 5, 6, 6])
        self.assertEqual(sequence, 6)
        self.assertEqual([b for _, b in got], [b"m1", b"m2", b"m3", b"m5", b"m6"])

    @inlineCallbacks
    def test_frameAboveFrameMax(self):
        """
        A publish frame above the tuned frame_max (100,000 small messages, about 1.6 MB, with
        1 MiB tuned) is taken: RabbitMQ 3.10 does not hold an open connection to frame_max, and
        rstream's Producer (1.0) sends all it buffered as one frame (its
        test_publishing_several_messages).
        """
        rstream = self.rstream()

        name = self.name("s")
        n = 100000

        async def run():
            body = amqp10.dataSection(b"one")
            confirmed = await publishOneFrame(self, name, [body] * n, timeout=30)
            async with self.consumer(rstream) as cons:
                got = await collect(cons, name, rstream, n, timeout=30)
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            return len(confirmed), len(got)

        self.assertEqual((yield self.inAsyncio(run)), (n, n))

    @inlineCallbacks
    def test_lastOfLargeFrame(self):
        """
        last after one publish frame of 4,999 messages starts at its last chunk, not at its
        first message: RabbitMQ's writer cuts such a frame into several chunks (rstream's
        test_offset_type_last).
        """
        rstream = self.rstream()

        name = self.name("s")
        n = 4999

        async def run():
            await publishOneFrame(self, name, [amqp10.dataSection(b"%d" % i) for i in range(1, n + 1)])
            async with self.consumer(rstream) as cons:
                got = await collect(cons, name, rstream, 1, rstream.ConsumerOffsetSpecification(
                    rstream.OffsetType.LAST, None))
                await asyncio.sleep(0.5)
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            return got

        got = yield self.inAsyncio(run)
        self.assertEqual(got[-1], (n - 1, b"%d" % n))
        self.assertGreater(got[0][0], 0, got[:3])
        self.assertLess(len(got), n)

    @inlineCallbacks
    def test_storeQueryOffset(self):
        """Server-side offset tracking by consumer name."""
        rstream = self.rstream()
        name = self.name("s")

        async def run():
            async with self.producer(rstream) as p:
                await p.create_stream(name)
                await p.send_wait(name, rstream.AMQPMessage(body=b"x"))
            async with self.consumer(rstream) as c:
                try:
                    await c.query_offset(name, "reader")
                    before = "found"
                except rstream.exceptions.OffsetNotFound:
                    before = "none"
                await c.store_offset(name, "reader", 41)
                for _ in range(50):
                    try:
                        after = await c.query_offset(name, "reader")
                        break
                    except rstream.exceptions.OffsetNotFound:
                        await asyncio.sleep(0.05)
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            return before, after

        before, after = yield self.inAsyncio(run)
        self.assertEqual((before, after), ("none", 41))

    @inlineCallbacks
    def test_amqpMessageProperties(self):
        """Properties and application properties of an AMQP 1.0 message come back as sent."""
        rstream = self.rstream()
        from rstream._pyamqp.message import Properties

        name = self.name("s")

        async def run():
            async with self.producer(rstream) as p:
                await p.create_stream(name)
                m = rstream.AMQPMessage(body=b"x", application_properties={"k": "v"},
                                        properties=Properties(message_id="id1", content_type="text/plain"))
                await p.send_wait(name, m)
            got = []
            done = asyncio.Event()

            async def cb(msg, ctx):
                got.append(msg)
                done.set()

            async with self.consumer(rstream) as c:
                await c.subscribe(name, cb, decoder=rstream.amqp_decoder)
                await asyncio.wait_for(done.wait(), 10)
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            m = got[0]
            return m.application_properties, m.properties.message_id, m.properties.content_type

        ap, mid, ct = yield self.inAsyncio(run)
        self.assertEqual({_s(k): _s(v) for k, v in ap.items()}, {"k": "v"})
        self.assertEqual((_s(mid), _s(ct)), ("id1", "text/plain"))

    @only311("super streams (route, partitions, create_super_stream)")
    @inlineCallbacks
    def test_superStream(self):
        """A super stream: partitions, routing by hash, every message read back once."""
        rstream = self.rstream()
        name = self.name("ss")

        async def run():
            await publishSuperStream(self, rstream, name)
            seen = []
            async with self.consumer(rstream) as c:
                for part in range(3):
                    try:
                        seen += [b for _, b in await collect(c, "%s-%d" % (name, part), rstream, 1, timeout=3)]
                    except asyncio.TimeoutError:
                        pass
            async with self.producer(rstream) as p:
                client = await p.default_client
                parts = await client.partitions(name)
                await client.delete_super_stream(name)
            return parts, seen

        parts, seen = yield self.inAsyncio(run)
        self.assertEqual(parts, ["%s-%d" % (name, i) for i in range(3)])
        self.assertTrue(seen)

    @only311("single active consumer for streams")
    @inlineCallbacks
    def test_singleActiveConsumer(self):
        """Two consumers with the same name: one gets the messages; when it leaves, the other does."""
        rstream = self.rstream()
        name = self.name("s")

        async def run():
            async with self.producer(rstream) as p:
                await p.create_stream(name)
                for i in range(3):
                    await p.send_wait(name, rstream.AMQPMessage(body=b"m%d" % i))
            got = {1: [], 2: []}

            def cb(n):
                async def f(msg, ctx):
                    got[n].append(bytes(msg.body))
                return f

            async def listener(active, ctx):
                return rstream.OffsetSpecification(rstream.OffsetType.FIRST, 0)

            props = {"single-active-consumer": "true", "name": "grp"}
            c1 = self.consumer(rstream)
            c2 = self.consumer(rstream)
            await c1.start()
            await c2.start()
            await c1.subscribe(name, cb(1), decoder=rstream.amqp_decoder, properties=props,
                               subscriber_name="grp", consumer_update_listener=listener)
            await c2.subscribe(name, cb(2), decoder=rstream.amqp_decoder, properties=dict(props),
                               subscriber_name="grp", consumer_update_listener=listener)
            for _ in range(100):
                if len(got[1]) >= 3:
                    break
                await asyncio.sleep(0.05)
            first = (list(got[1]), list(got[2]))
            await c1.close()
            for _ in range(100):
                if len(got[2]) >= 3:
                    break
                await asyncio.sleep(0.05)
            await c2.close()
            async with self.producer(rstream) as p:
                await p.delete_stream(name)
            return first, got[2]

        (first1, first2), later2 = yield self.inAsyncio(run)
        self.assertEqual((first1, first2), ([b"m0", b"m1", b"m2"], []))
        self.assertEqual(later2, [b"m0", b"m1", b"m2"])


class SuperStreamSacTests(StreamInteropTestCase):
    @only311("single active consumer on a super stream's partitions")
    @inlineCallbacks
    def test_partitionsShared(self):
        """
        Two SuperStreamConsumers of one name on a 3-partition super stream: the second one
        to join becomes the active consumer of partition 1 (index % consumers, as RabbitMQ's
        coordinator) and reads it from where its consumer_update answer says.
        """
        rstream = self.rstream()
        name = self.name("sss")

        async def run():
            await publishSuperStream(self, rstream, name)
            got = {1: [], 2: []}

            def cb(n):
                async def f(msg, ctx):
                    got[n].append(ctx.stream)
                return f

            async def listener(active, ctx):
                return rstream.OffsetSpecification(rstream.OffsetType.FIRST, 0)

            consumers = []
            for n in (1, 2):
                c = rstream.SuperStreamConsumer(self.host, port=self.streamPort, username="guest",
                                                password="guest", super_stream=name)
                await c.start()
                await c.subscribe(cb(n), decoder=rstream.amqp_decoder, subscriber_name="grp",
                                  properties={"single-active-consumer": "true", "name": "grp",
                                              "super-stream": name},
                                  consumer_update_listener=listener)
                consumers.append(c)
                for _ in range(100):
                    if (n == 1 and len(got[1]) >= 30) or (n == 2 and got[2]):
                        break
                    await asyncio.sleep(0.05)
            # the second one has read all of partition 1 (the first one read every partition whole)
            part1 = name + "-1"
            await waitUntilAsync(lambda: got[2].count(part1) >= got[1].count(part1), timeout=10)
            second = sorted(set(got[2]))
            # when the first one leaves, the second takes its partitions over
            await consumers[0].close()
            for _ in range(100):
                if len(set(got[2])) == 3:
                    break
                await asyncio.sleep(0.05)
            await consumers[1].close()
            async with self.producer(rstream) as p:
                client = await p.default_client
                await client.delete_super_stream(name)
            return len(got[1]), second, sorted(set(got[2]))

        first, second, later = yield self.inAsyncio(run)
        self.assertEqual(first, 30)
        self.assertEqual(second, [name + "-1"])
        self.assertEqual(later, [name + "-%d" % i for i in range(3)])


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


class ServerPropertiesTests(StreamInteropTestCase):
    """
    peer_properties as RabbitMQ 3.10's rabbit_stream_reader answers it: product, version,
    cluster_name, platform, copyright and information; configured server properties
    (``--server-property``) are added under them, the built-in ones winning.
    """

    brokerOptions = {"stream": True, "serverProperties": {"product": "RabbitMQ", "x-site": "eu"}}

    def peerProperties(self):
        self.rstream()
        from rstream.client import Client

        async def run():
            c = Client(self.host, self.streamPort, frame_max=1048576, heartbeat=60)
            await c.start()
            try:
                return await c.peer_properties()
            finally:
                await c.close()

        return self.inAsyncio(run)

    @inlineCallbacks
    def test_peerPropertiesKeys(self):
        """The keys RabbitMQ 3.10 sends (copyright and information among them)."""
        props = yield self.peerProperties()
        self.assertLessEqual({"cluster_name", "copyright", "information", "platform", "product", "version"},
                             set(props), props)

    @inProcessOnly("the configured server properties are brokerOptions of the in-process broker")
    @inlineCallbacks
    def test_configuredPropertiesAdded(self):
        """A configured key is added; the configured product does not replace the built-in one."""
        props = yield self.peerProperties()
        self.assertEqual((props["product"], props["x-site"]), ("otter_tx", "eu"), props)


class RawProtocolTests(StreamInteropTestCase):
    """Response codes, byte for byte the same on otter_tx and RabbitMQ 3.10."""

    @inlineCallbacks
    def test_responseCodes(self):
        name = self.name("s")

        def run():
            c = self.raw()
            out = {"open": c.handshake()}
            out["delete missing"] = c.delete(name)
            out["create"] = c.create(name)
            out["create again"] = c.create(name)
            out["publisher missing stream"] = c.declarePublisher(1, "", name + "-x")
            out["publisher"] = c.declarePublisher(1, "ref", name)
            out["publisher same id"] = c.declarePublisher(1, "", name)
            out["publisher same ref"] = c.declarePublisher(2, "ref", name)
            c.publish(1, [(1, amqp10.dataSection(b"a")), (2, amqp10.dataSection(b"b"))])
            # a broker may confirm the two in one frame or in two (RabbitMQ 3.10 does either)
            pid, ids = c.confirms()
            while len(ids) < 2:
                more = c.confirms()
                if more[0] != pid:
                    break
                ids = ids + more[1]
            out["confirm"] = (pid, ids)
            c.publish(9, [(5, b"x")])
            out["unknown publisher"] = c.confirms()
            out["sequence"] = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("ref") + wire.encodeString(name))
            q = wire.encodeString("c1") + wire.encodeString(name)
            out["no offset"] = c.call(wire.QUERY_OFFSET, q)[0]
            out["subscribe missing"] = c.subscribe(1, name + "-x")
            out["subscribe"] = c.subscribe(1, name)
            sid, data = c.deliver()
            first, ts, msgs = chunk.parse(data)
            # the messages as an AMQP 0-9-1 reader sees them: RabbitMQ sends the bytes as
            # published, otter_tx as stored (docs/stream-protocol.md, "Messages across the protocols")
            out["chunk"] = (sid, first, [amqp10.toAmqp091(m) for m in msgs])
            out["subscribe again"] = c.subscribe(1, name)
            out["unsubscribe missing"] = c.call(wire.UNSUBSCRIBE, b"\x07")[0]
            c.credit(7, 1)
            out["credit unknown"] = c.response(wire.CREDIT)
            out["unsubscribe"] = c.call(wire.UNSUBSCRIBE, b"\x01")[0]
            out["delete publisher"] = c.call(wire.DELETE_PUBLISHER, b"\x01")[0]
            out["delete publisher again"] = c.call(wire.DELETE_PUBLISHER, b"\x01")[0]
            out["delete"] = c.delete(name)
            c2 = self.raw()
            out["bad password"] = c2.handshake(password="wrong")
            c3 = self.raw()
            out["bad vhost"] = c3.handshake(vhost="no-such-vhost")
            return out

        out = yield self.inThread(run)
        self.assertEqual(out, {
            "open": wire.OK, "delete missing": wire.STREAM_DOES_NOT_EXIST, "create": wire.OK,
            "create again": wire.STREAM_ALREADY_EXISTS,
            "publisher missing stream": wire.STREAM_DOES_NOT_EXIST, "publisher": wire.OK,
            "publisher same id": wire.PRECONDITION_FAILED, "publisher same ref": wire.PRECONDITION_FAILED,
            "confirm": (1, [1, 2]),
            "unknown publisher": ("error", 9, [(5, wire.PUBLISHER_DOES_NOT_EXIST)]),
            "sequence": (wire.OK, struct.pack(">Q", 2)), "no offset": wire.NO_OFFSET,
            "subscribe missing": wire.STREAM_DOES_NOT_EXIST, "subscribe": wire.OK,
            "chunk": (1, 0, [({}, b"a"), ({}, b"b")]),
            "subscribe again": wire.SUBSCRIPTION_ID_ALREADY_EXISTS,
            "unsubscribe missing": wire.SUBSCRIPTION_ID_DOES_NOT_EXIST,
            "credit unknown": (wire.SUBSCRIPTION_ID_DOES_NOT_EXIST, b"\x07"),
            "unsubscribe": wire.OK, "delete publisher": wire.OK,
            "delete publisher again": wire.PUBLISHER_DOES_NOT_EXIST, "delete": wire.OK,
            "bad password": wire.AUTHENTICATION_FAILURE, "bad vhost": wire.VHOST_ACCESS_FAILURE,
        })


    @inlineCallbacks
    def test_timestampBetweenChunks(self):
        """
        A timestamp subscription attaches at the first chunk written at or after the time
        (osiris' search): one between two chunks starts at the later one, one after the last
        at next (rabbitmq-stream-js-client's own suite subscribes so, then publishes).
        """
        name = self.name("ts")
        self.deleteLater(name)

        def run():
            c = self.raw()
            c.handshake()
            c.create(name)
            c.declarePublisher(1, "", name)
            c.publish(1, [(1, amqp10.dataSection(b"a1")), (2, amqp10.dataSection(b"a2"))])
            c.confirms()
            time.sleep(0.3)
            between = int(time.time() * 1000)
            time.sleep(0.3)
            c.publish(1, [(3, amqp10.dataSection(b"b"))])
            c.confirms()
            time.sleep(0.3)
            after = int(time.time() * 1000)
            time.sleep(0.3)
            out = {"between": c.subscribe(1, name, (wire.OFFSET_TIMESTAMP, between))}
            sid, data = c.deliver()
            out["between chunk"] = (sid, chunk.parse(data)[0])
            out["after"] = c.subscribe(2, name, (wire.OFFSET_TIMESTAMP, after))
            c.publish(1, [(4, amqp10.dataSection(b"c"))])
            got = []
            while len(got) < 2:
                sid, data = c.deliver()
                got.append((sid, chunk.parse(data)[0]))
            out["after chunks"] = sorted(got)
            return out

        out = yield self.inThread(run)
        self.assertEqual(out, {"between": wire.OK, "between chunk": (1, 2), "after": wire.OK,
                               "after chunks": [(1, 3), (2, 3)]})

    @inlineCallbacks
    def test_deduplicationFromZero(self):
        """
        A reference that wrote nothing keeps its first publish whatever its id, 0 too (osiris'
        is_duplicate: no sequence is no duplicate); query_publisher_sequence says 0 before and
        after it.
        """
        name = self.name("dz")
        self.deleteLater(name)

        def run():
            c = self.raw()
            c.handshake()
            c.create(name)
            c.declarePublisher(1, "ref0", name)
            q = wire.encodeString("ref0") + wire.encodeString(name)
            out = {"before": c.call(wire.QUERY_PUBLISHER_SEQUENCE, q)}
            for _ in range(2):
                c.publish(1, [(0, amqp10.dataSection(b"zero"))])
                out.setdefault("confirms", []).append(c.confirms())
            c.publish(1, [(1, amqp10.dataSection(b"one"))])
            out["confirms"].append(c.confirms())
            out["after"] = c.call(wire.QUERY_PUBLISHER_SEQUENCE, q)
            c.subscribe(1, name)
            msgs = []
            while len(msgs) < 2:
                msgs.extend(chunk.parse(c.deliver()[1])[2])
            out["messages"] = [amqp10.toAmqp091(m)[1] for m in msgs]
            return out

        out = yield self.inThread(run)
        self.assertEqual(out, {"before": (wire.OK, struct.pack(">Q", 0)), "confirms": [(1, [0]), (1, [0]), (1, [1])],
                               "after": (wire.OK, struct.pack(">Q", 1)), "messages": [b"zero", b"one"]})

class CrossProtocolTests(StreamInteropTestCase):
    """A stream is one log for AMQP 0-9-1 and the stream protocol (needs stream queues in the core)."""

    def declareStream(self, ch, name):
        import pika

        try:
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        except pika.exceptions.ChannelClosedByBroker as e:
            raise SkipTest("this broker has no stream queues over AMQP 0-9-1: %s" % (e,))

    @inlineCallbacks
    def test_amqp091ToStreamProtocol(self):
        """Published over AMQP 0-9-1, read over the stream protocol as RabbitMQ 3.10 converts it."""
        pika = requireModule("pika")
        name = self.name("x")

        def run():
            conn = pika.BlockingConnection(self.pikaParams())
            try:
                ch = conn.channel()
                self.declareStream(ch, name)
                ch.confirm_delivery()
                ch.basic_publish("", name, b"hi", pika.BasicProperties(delivery_mode=2, headers={"k": "v"}))
                c = self.raw()
                c.handshake()
                c.subscribe(1, name)
                sid, data = c.deliver()
                return chunk.parse(data)[2]
            finally:
                try:
                    conn.channel().queue_delete(name)
                finally:
                    conn.close()

        msgs = yield self.inThread(run)
        self.assertEqual(msgs, [amqp10.fromAmqp091({"delivery_mode": 2, "headers": {"k": "v"}}, b"hi", "", name)])

    @inlineCallbacks
    def test_streamProtocolToAmqp091(self):
        """Published over the stream protocol, consumed over AMQP 0-9-1 with x-stream-offset."""
        pika = requireModule("pika")
        name = self.name("x")

        def run():
            conn = pika.BlockingConnection(self.pikaParams())
            try:
                ch = conn.channel()
                self.declareStream(ch, name)
                c = self.raw()
                c.handshake()
                c.declarePublisher(1, "", name)
                m = amqp10.encodeMessage(b"body", properties={"content_type": amqp10.Typed("symbol", "text/plain")},
                                         applicationProperties={"k": "v"})
                c.publish(1, [(1, m)])
                c.confirms()
                ch.basic_qos(prefetch_count=10)
                got = []
                ch.basic_consume(name, lambda ch_, method, props, body: got.append((props, body)),
                                 arguments={"x-stream-offset": "first"})
                deadline = time.time() + 10
                while not got and time.time() < deadline:
                    conn.process_data_events(0.1)
                return got
            finally:
                try:
                    conn.channel().queue_delete(name)
                finally:
                    conn.close()

        got = yield self.inThread(run)
        props, body = got[0]
        self.assertEqual(body, b"body")
        self.assertEqual(props.content_type, "text/plain")
        self.assertEqual(props.headers.get("k"), "v")


class NodeStreamClientTests(StreamInteropTestCase):
    """rabbitmq-stream-js-client (npm) runs the scenarios in otter_tx/test/interop/node (stream*.js)."""

    @inlineCallbacks
    def runScenario(self, script, name, modules=("rabbitmq-stream-js-client",)):
        """Run ``node script HOST PORT name`` (skipped without node or ``modules``): its JSON line."""
        node = shutil.which("node")
        if node is None:
            raise SkipTest("node is not installed")
        for module in modules:
            if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", module)):
                raise SkipTest("%s is not installed (npm ci --prefix %s)" % (module, NODE_DIR))
        out, err, code = yield self.runProcess(
            node, [os.path.join(NODE_DIR, script), self.host, str(self.streamPort), name], path=NODE_DIR)
        self.assertEqual(code, 0, (out, err))
        return json.loads(out.decode().strip().splitlines()[-1])

    @only311("rabbitmq-stream-js-client (every version on npm) sends exchange_command_versions, "
             "a 3.11 command, when it connects; RabbitMQ 3.10 closes the connection")
    @inlineCallbacks
    def test_nodeClient(self):
        result = yield self.runScenario("stream.js", self.name("js"))
        self.assertEqual(result["received"], ["m0", "m1", "m2", "m3", "m4"])
        self.assertEqual(result["offsets"], [0, 1, 2, 3, 4])
        self.assertEqual(result["storedOffset"], 3)
        # stream_stats (3.11): -1 each for a stream with no message, as osiris' get_stats
        self.assertEqual(result["emptyStats"], {"firstChunkId": -1, "committedChunkId": -1, "lastChunkId": -1})
        stats = result["stats"]
        self.assertEqual(stats["firstChunkId"], 0)
        self.assertIn(stats["committedChunkId"], range(5))
        self.assertEqual(stats["lastChunkId"], stats["committedChunkId"])

    @only311("rabbitmq-stream-js-client (every version on npm) sends exchange_command_versions, "
             "a 3.11 command, when it connects; RabbitMQ 3.10 closes the connection")
    @inlineCallbacks
    def test_nodeClientDeduplicationFromZero(self):
        """
        The client's publishing ids start at 0 (its own suite's de-duplication test sends 0..99
        twice and expects 100 messages): a reference that wrote nothing keeps its first publish
        whatever its id, as osiris_writer's is_duplicate, and the duplicates are dropped.
        """
        result = yield self.runScenario("stream_dedup.js", self.name("jsdedup"))
        self.assertEqual(result["received"], ["m0-0", "m1-0", "m2-0", "m3-0", "m4-0", "end"])
        # query_publisher_sequence: 0 for a reference that wrote nothing, then the last id
        self.assertEqual((result["before"], result["after"]), (0, 5))

    @only311("rabbitmq-stream-js-client (every version on npm) sends exchange_command_versions, "
             "a 3.11 command, when it connects; RabbitMQ 3.10 closes the connection")
    @inlineCallbacks
    def test_nodeClientStreamDeletedElsewhere(self):
        """
        A stream deleted over AMQP 0-9-1 closes the client's publisher as well as its consumer
        (metadata_update STREAM_NOT_AVAILABLE), as RabbitMQ's reader, which monitors the stream
        (the client's own suite deletes it over the management API).
        """
        name = self.name("jsdel")
        self.deleteLater(name)
        result = yield self.runScenario("stream_deleted.js", name, ("rabbitmq-stream-js-client", "amqplib"))
        self.assertEqual(result, {"publisherClosed": True, "publishers": 0, "consumers": 0, "publisherCallbacks": 1,
                                  "consumerCallbacks": 1, "sendError": "Publisher has been closed"})

    @only311("rabbitmq-stream-js-client (every version on npm) sends exchange_command_versions, "
             "a 3.11 command, when it connects; RabbitMQ 3.10 closes the connection")
    @inlineCallbacks
    def test_nodeClientHandlerAfterSubscribe(self):
        """
        The subscribe response and the first chunk leave in two writes, as RabbitMQ's: the client
        runs the handler of a chunk read with the response before declareConsumer returns, and its
        own suite's handler stores an offset through the consumer it returned.
        """
        for i in range(3):
            name = self.name("jsfirst")
            self.deleteLater(name)
            result = yield self.runScenario("stream_first_delivery.js", name)
            self.assertEqual(result, {"early": 0, "seen": 4, "stored": 1, "second": ["marker", "hello", "world"]})
