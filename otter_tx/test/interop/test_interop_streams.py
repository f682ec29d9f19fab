"""
Interop tests for stream queues over AMQP 0-9-1 (issue 23, docs/streams.md),
with pika and aio-pika; every rule was checked on the RabbitMQ 3.10 peer and
the tests run unchanged against it::

    OTTER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5682/ \\
        .venv-test/bin/trial otter_tx.test.interop.test_interop_streams

Names start with ``stream-``.
"""

import datetime
import time

import pika
import pika.exceptions

from otter_tx.test.interop.test_interop_pika import PikaTestCase

S = {"x-queue-type": "stream"}


def st(**kw):
    """Stream declare arguments plus ``kw``."""
    a = dict(S)
    a.update(kw)
    return a


def where(name):
    return "queue '%s' in vhost '/'" % (name,)


def consume(channel, queue, n, offset=None, prefetch=10, timeout=10.0, ack=True):
    """Consume ``n`` messages of stream ``queue`` from ``offset``; ``[(offset header, body)]``."""
    channel.basic_qos(prefetch_count=prefetch)
    got = []

    def cb(ch, method, props, body):
        got.append(((props.headers or {}).get("x-stream-offset"), body))
        if ack:
            ch.basic_ack(method.delivery_tag)

    args = {} if offset is None else {"x-stream-offset": offset}
    tag = channel.basic_consume(queue, cb, arguments=args)
    deadline = time.time() + timeout
    while len(got) < n and time.time() < deadline:
        channel.connection.process_data_events(0.05)
    channel.basic_cancel(tag)
    return got


def publish(channel, queue, bodies):
    channel.confirm_delivery()
    for b in bodies:
        channel.basic_publish("", queue, b)


class DeclareTests(PikaTestCase):
    """Declare rules of a stream, with RabbitMQ 3.10's texts."""


    def test_declare(self):
        """A durable stream declares; a redeclare and a passive declare answer."""
        name = self.tempQueue("stream-d")

        def body(connect):
            ch = connect().channel()
            ok = ch.queue_declare(name, durable=True, arguments=S).method
            self.assertEqual((ok.queue, ok.consumer_count), (name, 0))
            ch.queue_declare(name, durable=True, arguments=S)
            ch.queue_declare(name, passive=True)

        return self.runPika(body)

    def test_flagsRefused(self):
        """Non-durable, exclusive and auto-delete streams get 406 invalid property."""
        name = self.tempQueue("stream-f")

        def body(connect):
            c = connect()
            for kw, prop in ((dict(durable=False), "non-durable"),
                             (dict(durable=True, exclusive=True), "exclusive-owner"),
                             (dict(durable=True, auto_delete=True), "auto-delete")):
                self.assertChannelError(
                    406, "PRECONDITION_FAILED - invalid property '%s' for %s" % (prop, where(name)),
                    c.channel().queue_declare, name, arguments=S, **kw)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue",
                c.channel().queue_declare, "", durable=True, arguments=S)

        return self.runPika(body)

    def test_otherTypesArguments(self):
        """The arguments of the other queue types are refused."""
        name = self.tempQueue("stream-o")

        def body(connect):
            c = connect()
            for key, value in (("x-max-priority", 5), ("x-message-ttl", 1000), ("x-expires", 1000),
                               ("x-dead-letter-exchange", "x"), ("x-max-length", 5),
                               ("x-overflow", "drop-head"), ("x-single-active-consumer", True),
                               ("x-queue-mode", "lazy"), ("x-delivery-limit", 3),
                               ("x-quorum-initial-group-size", 3), ("x-max-in-memory-length", 1),
                               ("x-dead-letter-strategy", "at-most-once"), ("x-queue-version", 2)):
                self.assertChannelError(
                    406, "PRECONDITION_FAILED - invalid arg '%s' for %s of queue type rabbit_stream_queue"
                    % (key, where(name)),
                    c.channel().queue_declare, name, durable=True, arguments=st(**{key: value}))

        return self.runPika(body)

    def test_streamArguments(self):
        """x-max-age, x-max-length-bytes, segment size and cluster size: accepted values and 406s."""
        name = self.tempQueue("stream-a")

        def body(connect):
            c = connect()
            for age in ("7D", "10m", "30s", "1Y", "1M", "1h"):
                ch = c.channel()
                ch.queue_declare(name, durable=True, arguments=st(**{"x-max-age": age}))
                ch.queue_delete(name)
            for key, value, term in (
                    ("x-max-age", 5, "{unacceptable_type,signedint}"),
                    ("x-max-age", "0s", "invalid_max_age"),
                    ("x-max-age", "10x", "invalid_max_age"),
                    ("x-max-length-bytes", -1, "{value_negative,-1}"),
                    ("x-max-length-bytes", "a", '"expected integer, got longstr"'),
                    ("x-stream-max-segment-size-bytes", -1, "{value_negative,-1}"),
                    ("x-initial-cluster-size", 0, "{value_zero,0}")):
                self.assertChannelError(
                    406, "PRECONDITION_FAILED - invalid arg '%s' for %s: %s" % (key, where(name), term),
                    c.channel().queue_declare, name, durable=True, arguments=st(**{key: value}))
            ch = c.channel()
            ch.queue_declare(name, durable=True, arguments=st(**{
                "x-max-length-bytes": 10 ** 9, "x-stream-max-segment-size-bytes": 10 ** 6,
                "x-initial-cluster-size": 1}))
            self.assertChannelError(
                406, "PRECONDITION_FAILED - inequivalent arg 'x-max-age' for %s: received the value '1h' of "
                "type 'longstr' but current is none" % (where(name),),
                c.channel().queue_declare, name, durable=True, arguments=st(**{
                    "x-max-length-bytes": 10 ** 9, "x-stream-max-segment-size-bytes": 10 ** 6,
                    "x-initial-cluster-size": 1, "x-max-age": "1h"}))
            self.assertChannelError(
                406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for %s: received none but current "
                "is the value 'stream' of type 'longstr'" % (where(name),),
                c.channel().queue_declare, name, durable=True, arguments={"x-max-length-bytes": 10 ** 9})

        return self.runPika(body)

    def test_maxAgeCrash(self):
        """An x-max-age without digits: RabbitMQ 3.10 closes the connection with 541."""
        name = self.tempQueue("stream-c")

        def body(connect):
            c = connect()
            self.assertConnectionError(c, 541, "INTERNAL_ERROR", c.channel().queue_declare, name,
                                       durable=True, arguments=st(**{"x-max-age": "bad"}))

        return self.runPika(body)


class ConsumeTests(PikaTestCase):
    """Consumers of a stream: offsets, headers, credit, independence."""


    def filled(self, connect, name, n=20):
        ch = connect().channel()
        ch.queue_declare(name, durable=True, arguments=S)
        publish(ch, name, [b"m%d" % i for i in range(n)])
        return ch

    def test_offsets(self):
        """first, offsets, timestamps and intervals; each delivery carries x-stream-offset."""
        name = self.tempQueue("stream-off")

        def body(connect):
            self.filled(connect, name)
            c = connect()
            got = consume(c.channel(), name, 20, "first")
            self.assertEqual(got, [(i, b"m%d" % i) for i in range(20)])
            self.assertEqual(consume(c.channel(), name, 5, 15), [(i, b"m%d" % i) for i in range(15, 20)])
            self.assertEqual(consume(c.channel(), name, 20, -1)[:1], [(0, b"m0")])
            hourAgo = datetime.datetime.now() - datetime.timedelta(hours=1)
            self.assertEqual(len(consume(c.channel(), name, 20, hourAgo)), 20)
            self.assertEqual(len(consume(c.channel(), name, 20, "10m")), 20)
            # the last chunk: the last message here (each publish waited for its confirm)
            self.assertEqual(consume(c.channel(), name, 1, "last"), [(19, b"m19")])
            self.assertEqual(consume(c.channel(), name, 1, "next", timeout=0.5), [])
            self.assertEqual(consume(c.channel(), name, 1, 100, timeout=0.5), [])
            self.assertEqual(consume(c.channel(), name, 1, None, timeout=0.5), [])

        return self.runPika(body)

    def test_timestampBetweenPublishes(self):
        """A timestamp between two publishes starts at the later one; one after the last, at next (as 3.10)."""
        name = self.tempQueue("stream-ts")

        def body(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=S)
            publish(ch, name, [b"a0", b"a1", b"a2"])
            # AMQP timestamps are whole seconds: one strictly between the two publishes
            time.sleep(1.2)
            between = datetime.datetime.fromtimestamp(int(time.time()))
            time.sleep(1.2)
            publish(ch, name, [b"b0", b"b1"])
            time.sleep(1.2)
            after = datetime.datetime.fromtimestamp(int(time.time()))
            c = connect()
            self.assertEqual(consume(c.channel(), name, 2, between), [(3, b"b0"), (4, b"b1")])
            self.assertEqual(consume(c.channel(), name, 1, after, timeout=0.5), [])

        return self.runPika(body)

    def test_newMessagesReachWaitingConsumer(self):
        """A consumer at next gets what is published later; consuming removes nothing."""
        name = self.tempQueue("stream-n")

        def body(connect):
            self.filled(connect, name, 3)
            c = connect()
            ch = c.channel()
            ch.basic_qos(prefetch_count=5)
            got = []
            ch.basic_consume(name, lambda ch_, m, p, b: (got.append(b), ch_.basic_ack(m.delivery_tag)),
                             arguments={"x-stream-offset": "next"})
            pub = connect().channel()
            publish(pub, name, [b"late1", b"late2"])
            deadline = time.time() + 10
            while len(got) < 2 and time.time() < deadline:
                c.process_data_events(0.05)
            self.assertEqual(got, [b"late1", b"late2"])
            # a second reader still sees everything
            self.assertEqual(len(consume(connect().channel(), name, 5, "first")), 5)

        return self.runPika(body)

    def test_prefetchIsCredit(self):
        """Without acks a consumer gets its prefetch and no more."""
        name = self.tempQueue("stream-p")

        def body(connect):
            self.filled(connect, name, 10)
            got = consume(connect().channel(), name, 10, "first", prefetch=3, ack=False, timeout=1.0)
            self.assertEqual(len(got), 3)

        return self.runPika(body)

    def test_consumerRules(self):
        """No prefetch: 406; auto-ack: 540; basic.get, purge, nack and reject: 540."""
        name = self.tempQueue("stream-r")

        def body(connect):
            self.filled(connect, name, 2)
            c = connect()
            self.assertChannelError(
                406, "PRECONDITION_FAILED - consumer prefetch count is not set for '%s'" % (where(name),),
                c.channel().basic_consume, name, lambda *a: None)
            ch = c.channel()
            ch.basic_qos(prefetch_count=5, global_qos=True)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - consumer prefetch count is not set for '%s'" % (where(name),),
                ch.basic_consume, name, lambda *a: None)
            ch = c.channel()
            ch.basic_qos(prefetch_count=5)
            self.assertConnectionError(
                c, 540, "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues %s"
                % (where(name),), ch.basic_consume, name, lambda *a: None, auto_ack=True)
            c = connect()
            self.assertConnectionError(
                c, 540, "NOT_IMPLEMENTED - basic.get not supported by stream queues %s" % (where(name),),
                c.channel().basic_get, name)
            c = connect()
            self.assertConnectionError(
                c, 540, "NOT_IMPLEMENTED - queue.purge not supported by stream queues %s" % (where(name),),
                c.channel().queue_purge, name)
            c = connect()
            ch = c.channel()
            ch.basic_qos(prefetch_count=5)
            tags = []
            ch.basic_consume(name, lambda ch_, m, p, b: tags.append(m.delivery_tag),
                             arguments={"x-stream-offset": "first"})
            deadline = time.time() + 10
            while not tags and time.time() < deadline:
                c.process_data_events(0.05)
            ch.basic_nack(tags[0], requeue=True)
            e = self.assertRaises(pika.exceptions.ConnectionClosedByBroker, c.process_data_events, 5)
            self.assertEqual((e.reply_code, e.reply_text),
                             (540, "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream "
                                   "queues %s" % (where(name),)))

        return self.runPika(body)

    def test_offsetArgument(self):
        """A malformed x-stream-offset interval: 406 invalid_stream_offset_arg."""
        name = self.tempQueue("stream-x")

        def body(connect):
            self.filled(connect, name, 1)
            ch = connect().channel()
            ch.basic_qos(prefetch_count=5)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for %s: "
                "{invalid_stream_offset_arg,{longstr,<<\"1.5\">>}}" % (where(name),),
                ch.basic_consume, name, lambda *a: None, arguments={"x-stream-offset": "1.5"})

        return self.runPika(body)


class AioPikaTests(PikaTestCase):
    """aio-pika reads a stream from an offset."""


    def test_aiopika(self):
        name = self.tempQueue("stream-aio")

        def fill(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=S)
            publish(ch, name, [b"a%d" % i for i in range(10)])

        async def read():
            import asyncio

            import aio_pika
            conn = await aio_pika.connect(self.url)
            try:
                ch = await conn.channel()
                await ch.set_qos(prefetch_count=10)
                q = await ch.declare_queue(name, durable=True, arguments=S)
                got = []
                async with q.iterator(arguments={"x-stream-offset": 5}) as it:
                    async for m in it:
                        got.append((m.headers.get("x-stream-offset"), m.body))
                        await m.ack()
                        if len(got) == 5:
                            break
                return got
            finally:
                await asyncio.wait_for(conn.close(), 10)

        d = self.runPika(fill)
        d.addCallback(lambda _: self.inAsyncio(read))
        d.addCallback(self.assertEqual, [(i, b"a%d" % i) for i in range(5, 10)])
        return d
