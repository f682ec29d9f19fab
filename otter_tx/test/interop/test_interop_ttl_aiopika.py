"""
Interop tests for issue 3 (message TTL, queue expiry, dead-lettering and
length limits) with aio-pika, the second client for every rule.

The full catalogue is in ``test_interop_ttl_pika``; here every rule has at
least one case through aio-pika (aiormq/pamqp on the wire).  pamqp encodes
Python ints in the smallest AMQP type (``b``, ``s``, ``u``, ``I``, ``i``,
``l``), which covers the integer types pika cannot send.  aio-pika's
``Message(expiration=...)`` takes seconds and sends milliseconds; invalid
expiration strings go through the underlying aiormq channel.

Channels are in publisher-confirm mode (aio-pika's default), so a publish
returns once the message is enqueued.  Queue existence under ``x-expires``
is probed with a mandatory publish (a ``basic.return`` means gone), which
does not renew the lease.

Sources: ``/work/shared/reference/rabbitmq-semantics.md`` §1-§4, §5.8, §6;
``/work/shared/seeds/`` (the hold-queue delayed-delivery pattern).
"""

import asyncio
import time
from datetime import datetime

import aio_pika
import aiormq
import pamqp.commands

from otter_tx.test.interop.support import (
    InteropTestCase,
    messageCountAsync,
    onlyOtter,
    pamqpInt,
    pollGetAsync,
    waitUntilAsync,
)

PROMPT = "prompt reaping: RabbitMQ reaps only at the head"
FORM313 = "RabbitMQ 3.13/4.x dead-letter headers (x-last-death-*); 3.10 omits them"

XDEATH_KEYS = {"count", "reason", "queue", "time", "exchange", "routing-keys"}


async def drain(queue):
    """
    Get everything ready in ``queue`` and return the bodies.
    """
    bodies = []
    while True:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            return bodies
        bodies.append(message.body)


async def queueExists(channel, name):
    """
    Whether queue ``name`` exists, by a mandatory publish through the
    default exchange (a ``basic.return`` means it does not).
    """
    result = await channel.default_exchange.publish(
        aio_pika.Message(b"probe"), routing_key=name, mandatory=True
    )
    return not isinstance(getattr(result, "delivery", None), pamqp.commands.Basic.Return)


class AioTTLCase(InteropTestCase):
    """
    Base class: run a coroutine with a fresh aio-pika connection; delete
    recorded exchanges and non-exclusive queues afterwards.
    """

    def setUp(self):
        self._exchanges = []
        self._queues = []
        return super().setUp()

    def runAio(self, body):
        """
        Run ``await body(connection)`` on a fresh asyncio loop in a worker
        thread; return a Deferred with its result.
        """

        async def run():
            connection = await aio_pika.connect(self.url, timeout=10)
            try:
                return await body(connection)
            finally:
                try:
                    channel = await connection.channel()
                    for name in self._queues:
                        await channel.queue_delete(name)
                    for name in self._exchanges:
                        await channel.exchange_delete(name)
                finally:
                    await connection.close()

        return self.inAsyncio(run)

    async def queue(self, channel, base, exclusive=True, **arguments):
        """
        Declare a queue named after ``base``; return the aio-pika Queue.
        """
        name = self.name(base)
        queue = await channel.declare_queue(name, exclusive=exclusive, arguments=arguments or None)
        if not exclusive:
            self._queues.append(name)
        return queue

    async def exchange(self, channel, base, kind="direct"):
        """
        Declare an exchange named after ``base``, deleted after the test.
        """
        name = self.name(base)
        exchange = await channel.declare_exchange(name, kind)
        self._exchanges.append(name)
        return exchange

    async def deadLetterPair(self, channel, **arguments):
        """
        Declare a DLQ and a source queue dead-lettering into it through the
        default exchange; return ``(source, dlq)`` Queue objects.
        """
        dlq = await self.queue(channel, "dlq")
        source = await self.queue(
            channel,
            "src",
            **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq.name},
            **arguments,
        )
        return source, dlq

    async def assertChannelError(self, connection, operation, exceptionType, text):
        """
        Await ``operation(channel)`` on a new channel; assert the broker
        closes the channel with ``exceptionType`` (406 is
        ``ChannelPreconditionFailed``, 404 ``ChannelNotFoundEntity``) and
        exactly ``text``, while the connection stays open.
        """
        channel = await connection.channel()
        try:
            await operation(channel)
            await channel.declare_queue("", exclusive=True)
        except aiormq.exceptions.ChannelClosed as e:
            self.assertIsInstance(e, exceptionType)
            self.assertEqual(e.args[0], text)
        else:
            self.fail("channel was not closed; expected %s" % (text,))
        self.assertFalse(connection.is_closed)


def publishRaw(queueName, expiration):
    """
    An operation publishing with a raw ``expiration`` string through the
    underlying aiormq channel.
    """

    async def operation(channel):
        raw = await channel.get_underlay_channel()
        await raw.basic_publish(
            b"x",
            routing_key=queueName,
            properties=pamqp.commands.Basic.Properties(expiration=expiration),
        )

    return operation


class ExpiryTests(AioTTLCase):
    """
    Per-message and per-queue TTL (§1).
    """

    def test_expirationDeliveredAsIs(self):
        """A valid expiration is delivered unchanged while the message is live."""

        async def body(connection):
            channel = await connection.channel()
            queue = await self.queue(channel, "exp")
            await channel.default_exchange.publish(
                aio_pika.Message(b"m", expiration=5), routing_key=queue.name
            )
            self.assertEqual(await messageCountAsync(channel, queue.name), 1)
            message = await queue.get(no_ack=True)
            self.assertEqual(message.properties.expiration, "5000")

        return self.runAio(body)

    def test_invalidExpiration(self):
        """Invalid expiration strings close the channel with 406 and RabbitMQ's exact text."""
        cases = [
            ("-1", "{value_negative,-1}"),
            ("abc", "no_integer"),
            ("1.5", '{leftover_string,".5"}'),
        ]

        async def body(connection):
            queue = await self.queue(await connection.channel(), "bad-exp")
            for value, term in cases:
                await self.assertChannelError(
                    connection,
                    publishRaw(queue.name, value),
                    aiormq.exceptions.ChannelPreconditionFailed,
                    "PRECONDITION_FAILED - invalid expiration '%s': %s" % (value, term),
                )

        return self.runAio(body)

    def test_messageTtlIntegerTypes(self):
        """x-message-ttl is accepted in every integer type pamqp sends (b, s, u, I, i, l) and applies."""

        async def body(connection):
            channel = await connection.channel()
            # pamqp picks: 100 'b', 300 's', 40000 'u', 100000 'I', 3e9 'i', 2**33 'l'
            for ttl in [100, 300, 40000, 100000, 3000000000, 2**33]:
                queue = await self.queue(channel, "ttl-type", **{"x-message-ttl": ttl})
                await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=queue.name)
                self.assertEqual(await messageCountAsync(channel, queue.name), 1)
                if ttl <= 300:
                    self.assertTrue(
                        await waitUntilAsync(lambda: self._isEmpty(channel, queue.name), timeout=1.5)
                    )

        return self.runAio(body)

    async def _isEmpty(self, channel, name):
        return await messageCountAsync(channel, name) == 0

    def test_invalidMessageTtl(self):
        """Negative, string, bool and float x-message-ttl values get RabbitMQ's exact 406 text."""
        cases = [
            (pamqpInt(-1), "{value_negative,%d}" % (pamqpInt(-1),)),
            ("abc", '"expected integer, got longstr"'),
            (True, '"expected integer, got bool"'),
            (1.5, '"expected integer, got float"'),
        ]

        async def body(connection):
            for value, term in cases:
                name = self.name("bad-ttl")

                async def declare(channel, name=name, value=value):
                    await channel.declare_queue(name, arguments={"x-message-ttl": value})

                await self.assertChannelError(
                    connection,
                    declare,
                    aiormq.exceptions.ChannelPreconditionFailed,
                    "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '%s' "
                    "in vhost '/': %s" % (name, term),
                )

        return self.runAio(body)

    def test_lowerTtlWins(self):
        """The lower of queue TTL and message expiration applies, in both directions."""

        async def body(connection):
            channel = await connection.channel()
            q1 = await self.queue(channel, "low-msg", **{"x-message-ttl": 60000})
            q2 = await self.queue(channel, "low-q", **{"x-message-ttl": 100})
            x = channel.default_exchange
            await x.publish(aio_pika.Message(b"m", expiration=0.1), routing_key=q1.name)
            await x.publish(aio_pika.Message(b"stay"), routing_key=q1.name)
            await x.publish(aio_pika.Message(b"m", expiration=60), routing_key=q2.name)
            await asyncio.sleep(0.35)
            self.assertEqual(await drain(q1), [b"stay"])
            self.assertEqual(await drain(q2), [])

        return self.runAio(body)

    def test_ttlZero(self):
        """TTL 0 delivers to a ready consumer and otherwise dead-letters the message as expired."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(channel, **{"x-message-ttl": 0})
            x = channel.default_exchange
            await x.publish(aio_pika.Message(b"nobody"), routing_key=source.name)
            message = await pollGetAsync(dlq)
            self.assertEqual(message.body, b"nobody")
            self.assertEqual(message.headers["x-death"][0]["reason"], "expired")
            received = []

            async def onMessage(message):
                received.append(message.body)

            await source.consume(onMessage, no_ack=True)
            await x.publish(aio_pika.Message(b"ready"), routing_key=source.name)
            await waitUntilAsync(lambda: len(received) >= 1, timeout=2.0)
            self.assertEqual(received, [b"ready"])
            await asyncio.sleep(0.1)
            self.assertEqual(await messageCountAsync(channel, dlq.name), 0)

        return self.runAio(body)

    def test_expiredNeverDelivered(self):
        """An expired message behind live ones is skipped by get and by a consumer."""

        async def body(connection):
            channel = await connection.channel()
            x = channel.default_exchange
            got = await self.queue(channel, "get")
            consumed = await self.queue(channel, "consume")
            for queue in [got, consumed]:
                await x.publish(aio_pika.Message(b"A"), routing_key=queue.name)
                await x.publish(aio_pika.Message(b"B", expiration=0.05), routing_key=queue.name)
                await x.publish(aio_pika.Message(b"C"), routing_key=queue.name)
            await asyncio.sleep(0.25)
            self.assertEqual(await drain(got), [b"A", b"C"])
            received = []

            async def onMessage(message):
                received.append(message.body)

            await consumed.consume(onMessage, no_ack=True)
            await waitUntilAsync(lambda: len(received) >= 2, timeout=2.0)
            await asyncio.sleep(0.2)
            self.assertEqual(received, [b"A", b"C"])

        return self.runAio(body)

    def test_heldMessageDoesNotExpire(self):
        """A message held unacked past its TTL is later rejected, not expired."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(channel, **{"x-message-ttl": 150})
            await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=source.name)
            message = await source.get()
            await asyncio.sleep(0.4)
            self.assertEqual(await messageCountAsync(channel, dlq.name), 0)
            await message.reject(requeue=False)
            dead = await pollGetAsync(dlq)
            self.assertEqual(dead.headers["x-death"][0]["reason"], "rejected")

        return self.runAio(body)

    def test_requeueKeepsOriginalExpiry(self):
        """A requeued message expires at its original time; one requeued after that time expires at once."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(channel, **{"x-message-ttl": 800})
            x = channel.default_exchange
            published = time.monotonic()
            await x.publish(aio_pika.Message(b"early"), routing_key=source.name)
            message = await source.get()
            await asyncio.sleep(max(0, published + 0.4 - time.monotonic()))
            requeued = time.monotonic()
            await message.nack(requeue=True)
            dead = await pollGetAsync(dlq)
            arrived = time.monotonic()
            self.assertEqual(dead.body, b"early")
            self.assertGreater(arrived - published, 0.7)
            self.assertLess(arrived - requeued, 0.7)
            # requeued after the expiry passed
            await x.publish(aio_pika.Message(b"late"), routing_key=source.name)
            message = await source.get()
            await asyncio.sleep(0.9)
            await message.reject(requeue=True)
            dead = await pollGetAsync(dlq, timeout=0.5)
            self.assertEqual(dead.body, b"late")
            self.assertEqual(dead.headers["x-death"][0]["reason"], "expired")

        return self.runAio(body)

    @onlyOtter(PROMPT)
    def test_promptReapingBehindHead(self):
        """A short-TTL message behind a long-TTL head is dead-lettered on time and leaves the count at once."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(channel)
            x = channel.default_exchange
            await x.publish(aio_pika.Message(b"long", expiration=60), routing_key=source.name)
            published = time.monotonic()
            await x.publish(aio_pika.Message(b"short", expiration=0.1), routing_key=source.name)
            dead = await pollGetAsync(dlq, timeout=2)
            self.assertIsNotNone(dead)
            self.assertEqual(dead.body, b"short")
            # on time, not when the 60 s head expires (a loaded machine adds its delay)
            self.assertLess(time.monotonic() - published, 1.0)
            self.assertEqual(await messageCountAsync(channel, source.name), 1)

        return self.runAio(body)


class QueueExpiryTests(AioTTLCase):
    """
    ``x-expires`` (§2).
    """

    def test_useKeepsQueueAndIdleDeletes(self):
        """Consumers, redeclares and basic.get keep an x-expires queue; publishing does not, and idle it is deleted."""

        async def body(connection):
            channel = await connection.channel()
            probe = await connection.channel()
            name = self.name("expires")
            self._queues.append(name)
            args = {"x-expires": 300}
            queue = await channel.declare_queue(name, arguments=args)

            async def redeclare():
                await channel.declare_queue(name, arguments=args)

            async def passive():
                await channel.declare_queue(name, passive=True)

            async def get():
                await queue.get(no_ack=True, fail=False)

            for renew in [redeclare, passive, get]:
                end = time.monotonic() + 0.6
                while time.monotonic() < end:
                    await renew()
                    await asyncio.sleep(0.1)
                self.assertTrue(await queueExists(probe, name))
            async def ignore(message):
                pass

            tag = await queue.consume(ignore, no_ack=True)
            await asyncio.sleep(0.6)
            self.assertTrue(await queueExists(probe, name))
            # taken before the cancel is sent: the period restarts later
            cancelled = time.monotonic()
            await queue.cancel(tag)
            self.assertTrue(await queueExists(probe, name))

            async def gone():
                return not await queueExists(probe, name)

            # the probe keeps publishing: that does not renew the lease
            self.assertTrue(await waitUntilAsync(gone, interval=0.02))
            self.assertGreater(time.monotonic() - cancelled, 0.28)

            async def passive(channel):
                await channel.declare_queue(name, passive=True)

            await self.assertChannelError(
                connection,
                passive,
                aiormq.exceptions.ChannelNotFoundEntity,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (name,),
            )

        return self.runAio(body)

    def test_invalidExpires(self):
        """x-expires 0, negative or a string get RabbitMQ's exact 406 text."""
        cases = [
            (0, "{value_zero,0}"),
            (pamqpInt(-5), "{value_negative,%d}" % (pamqpInt(-5),)),
            ("abc", '"expected integer, got longstr"'),
        ]

        async def body(connection):
            for value, term in cases:
                name = self.name("bad-expires")

                async def declare(channel, name=name, value=value):
                    await channel.declare_queue(name, arguments={"x-expires": value})

                await self.assertChannelError(
                    connection,
                    declare,
                    aiormq.exceptions.ChannelPreconditionFailed,
                    "PRECONDITION_FAILED - invalid arg 'x-expires' for queue '%s' "
                    "in vhost '/': %s" % (name, term),
                )

        return self.runAio(body)


class DeadLetterTests(AioTTLCase):
    """
    Dead-lettering reasons, routing, headers and cycles (§3).
    """

    def test_rejectNackAndNackMultiple(self):
        """reject, nack and nack multiple with requeue=false all dead-letter with reason rejected."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(channel)
            for i in range(4):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"m%d" % i), routing_key=source.name
                )
            messages = [await source.get() for i in range(4)]
            await messages[0].reject(requeue=False)
            await messages[1].nack(requeue=False)
            await messages[3].nack(multiple=True, requeue=False)
            bodies = []
            while len(bodies) < 4:
                message = await pollGetAsync(dlq, timeout=2)
                self.assertIsNotNone(message)
                self.assertEqual(message.headers["x-death"][0]["reason"], "rejected")
                bodies.append(message.body)
            self.assertEqual(sorted(bodies), [b"m0", b"m1", b"m2", b"m3"])
            self.assertEqual(await messageCountAsync(channel, source.name), 0)

        return self.runAio(body)

    def test_headersAndProperties(self):
        """The copy has x-death fields of the right types, x-first-death-*, no expiration, and keeps other properties."""

        async def body(connection):
            channel = await connection.channel()
            exchange = await self.exchange(channel, "src-x")
            dlq = await self.queue(channel, "dlq")
            source = await self.queue(
                channel,
                "src",
                **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq.name},
            )
            await source.bind(exchange, "k1")
            before = int(time.time())
            await exchange.publish(
                aio_pika.Message(
                    b"body",
                    expiration=60,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    priority=4,
                    correlation_id="corr",
                    message_id="mid",
                    reply_to="r",
                    content_type="text/plain",
                    app_id="app",
                    type="kind",
                    headers={"user": "u"},
                ),
                routing_key="k1",
            )
            message = await source.get()
            await message.reject(requeue=False)
            dead = await pollGetAsync(dlq)
            self.assertEqual(dead.body, b"body")
            self.assertFalse(dead.redelivered)
            self.assertEqual(dead.routing_key, dlq.name)
            self.assertIsNone(dead.properties.expiration)
            self.assertEqual(dead.delivery_mode, aio_pika.DeliveryMode.PERSISTENT)
            self.assertEqual(
                (dead.priority, dead.correlation_id, dead.message_id, dead.reply_to),
                (4, "corr", "mid", "r"),
            )
            self.assertEqual((dead.content_type, dead.app_id, dead.type), ("text/plain", "app", "kind"))
            self.assertEqual(dead.headers["user"], "u")
            [entry] = dead.headers["x-death"]
            self.assertEqual(set(entry), XDEATH_KEYS | {"original-expiration"})
            self.assertEqual(entry["count"], 1)
            self.assertIsInstance(entry["count"], int)
            self.assertEqual(entry["reason"], "rejected")
            self.assertEqual(entry["queue"], source.name)
            self.assertEqual(entry["exchange"], exchange.name)
            self.assertEqual(entry["routing-keys"], ["k1"])
            self.assertEqual(entry["original-expiration"], "60000")
            self.assertIsInstance(entry["time"], datetime)
            self.assertTrue(before <= entry["time"].timestamp() <= time.time() + 1)
            self.assertEqual(dead.headers["x-first-death-reason"], "rejected")
            self.assertEqual(dead.headers["x-first-death-queue"], source.name)
            self.assertEqual(dead.headers["x-first-death-exchange"], exchange.name)

        return self.runAio(body)

    def test_expiredAndMaxlenReasons(self):
        """Expiry by queue TTL dead-letters as expired without original-expiration; drop-head as maxlen."""

        async def body(connection):
            channel = await connection.channel()
            expiring, dlq = await self.deadLetterPair(channel, **{"x-message-ttl": 50})
            await channel.default_exchange.publish(aio_pika.Message(b"e"), routing_key=expiring.name)
            dead = await pollGetAsync(dlq)
            [entry] = dead.headers["x-death"]
            self.assertEqual(set(entry), XDEATH_KEYS)
            self.assertEqual((entry["reason"], entry["queue"]), ("expired", expiring.name))
            full, dlq2 = await self.deadLetterPair(channel, **{"x-max-length": 1})
            for payload in [b"m1", b"m2"]:
                await channel.default_exchange.publish(aio_pika.Message(payload), routing_key=full.name)
            dead = await pollGetAsync(dlq2)
            self.assertEqual(dead.body, b"m1")
            self.assertEqual(dead.headers["x-death"][0]["reason"], "maxlen")
            self.assertEqual(await drain(full), [b"m2"])

        return self.runAio(body)

    def test_missingDlxDropsSilently(self):
        """A message dead-lettered to a missing exchange is dropped and the channel stays usable."""

        async def body(connection):
            channel = await connection.channel()
            source = await self.queue(
                channel, "src", **{"x-dead-letter-exchange": self.name("missing")}
            )
            await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=source.name)
            message = await source.get()
            await message.reject(requeue=False)

            async def empty():
                return await messageCountAsync(channel, source.name) == 0

            self.assertTrue(await waitUntilAsync(empty))
            await channel.default_exchange.publish(aio_pika.Message(b"ok"), routing_key=source.name)
            self.assertEqual((await source.get(no_ack=True)).body, b"ok")
            self.assertFalse(channel.is_closed)

        return self.runAio(body)

    def test_ccAndBcc(self):
        """Without a DL routing key the copy follows publish, CC and BCC keys; x-death lists publish and CC keys only."""

        async def body(connection):
            channel = await connection.channel()
            source_x = await self.exchange(channel, "src-x")
            dlx = await self.exchange(channel, "dlx")
            targets = {}
            for key in ["a", "b", "c"]:
                targets[key] = await self.queue(channel, "dl-" + key)
                await targets[key].bind(dlx, key)
            source = await self.queue(channel, "src", **{"x-dead-letter-exchange": dlx.name})
            await source.bind(source_x, "a")
            await source_x.publish(
                aio_pika.Message(b"m", headers={"CC": ["b"], "BCC": ["c"]}), routing_key="a"
            )
            message = await source.get()
            await message.reject(requeue=False)
            for key in ["a", "b", "c"]:
                dead = await pollGetAsync(targets[key])
                self.assertIsNotNone(dead, key)
                self.assertNotIn("BCC", dead.headers)
                self.assertEqual(dead.headers["x-death"][0]["routing-keys"], ["a", "b"])

        return self.runAio(body)

    def test_dlRoutingKeyIgnoresCC(self):
        """With a DL routing key the copy goes only to that key and RabbitMQ 3.10 drops the CC header."""

        async def body(connection):
            channel = await connection.channel()
            dlx = await self.exchange(channel, "dlx")
            dead = await self.queue(channel, "dead")
            ccq = await self.queue(channel, "cc")
            await dead.bind(dlx, "dead")
            await ccq.bind(dlx, "b")
            source = await self.queue(
                channel,
                "src",
                **{"x-dead-letter-exchange": dlx.name, "x-dead-letter-routing-key": "dead"},
            )
            await channel.default_exchange.publish(
                aio_pika.Message(b"m", headers={"CC": ["b"]}), routing_key=source.name
            )
            message = await source.get()
            await message.reject(requeue=False)
            copy = await pollGetAsync(dead)
            self.assertEqual(copy.routing_key, "dead")
            self.assertEqual(copy.headers["x-death"][0]["routing-keys"], [source.name, "b"])
            self.assertNotIn("CC", copy.headers)
            self.assertEqual(await messageCountAsync(channel, ccq.name), 0)

        return self.runAio(body)

    def test_invalidDeadLetterAndLengthArguments(self):
        """Bad DL and length-limit arguments get RabbitMQ's exact 406 texts."""

        async def body(connection):
            name = self.name("bad-args")
            prefix = "PRECONDITION_FAILED - invalid arg '%%s' for queue '%s' in vhost '/': " % (name,)
            cases = [
                ({"x-dead-letter-routing-key": "k"},
                 prefix % "x-dead-letter-routing-key" + "routing_key_but_no_dlx_defined"),
                ({"x-dead-letter-exchange": 1},
                 "PRECONDITION_FAILED - invalid type 'byte' for arg 'x-dead-letter-exchange' "
                 "in queue '%s' in vhost '/'" % (name,)),
                ({"x-max-length": pamqpInt(-1)},
                 prefix % "x-max-length" + "{value_negative,%d}" % (pamqpInt(-1),)),
                ({"x-max-length-bytes": "1"},
                 prefix % "x-max-length-bytes" + '"expected integer, got longstr"'),
                ({"x-overflow": "drop-tail"}, prefix % "x-overflow" + "invalid_overflow"),
            ]
            for arguments, text in cases:

                async def declare(channel, arguments=arguments):
                    await channel.declare_queue(name, arguments=arguments)

                await self.assertChannelError(
                    connection, declare, aiormq.exceptions.ChannelPreconditionFailed, text
                )

        return self.runAio(body)

    def test_repeatedDeathCountsAndRejectionLoopContinues(self):
        """A TTL/reject retry loop keeps circulating and counts deaths per queue and reason, newest first."""

        async def body(connection):
            channel = await connection.channel()
            b1 = self.name("b1")
            b2 = self.name("b2")
            await channel.declare_queue(
                b1,
                exclusive=True,
                arguments={
                    "x-message-ttl": 50,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": b2,
                },
            )
            work = await channel.declare_queue(
                b2,
                exclusive=True,
                arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b1},
            )
            await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=b1)
            for round in range(2):
                message = await waitUntilAsync(lambda: work.get(fail=False))
                self.assertIsNotNone(message)
                await message.reject(requeue=False)
            dead = await pollGetAsync(work)
            self.assertEqual(
                [(e["queue"], e["reason"], e["count"]) for e in dead.headers["x-death"]],
                [(b1, "expired", 3), (b2, "rejected", 2)],
            )
            self.assertEqual(dead.headers["x-first-death-queue"], b1)

        return self.runAio(body)

    def test_automaticCycleDropped(self):
        """An expired copy routed back to its own queue is dropped there; another target still gets one copy."""

        async def body(connection):
            channel = await connection.channel()
            fanout = await self.exchange(channel, "cyc", aio_pika.ExchangeType.FANOUT)
            watcher = await self.queue(channel, "watch")
            source = await self.queue(
                channel, "loop", **{"x-message-ttl": 50, "x-dead-letter-exchange": fanout.name}
            )
            await source.bind(fanout)
            await watcher.bind(fanout)
            await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=source.name)
            dead = await pollGetAsync(watcher)
            self.assertEqual(dead.headers["x-death"][0]["count"], 1)
            await asyncio.sleep(0.4)
            self.assertEqual(await messageCountAsync(channel, watcher.name), 0)
            self.assertEqual(await messageCountAsync(channel, source.name), 0)

        return self.runAio(body)

    @onlyOtter(FORM313)
    def test_lastDeathHeaders(self):
        """The 3.13/4.x form carries x-last-death-reason/-queue/-exchange of the latest death."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(channel, **{"x-message-ttl": 50})
            await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=source.name)
            dead = await pollGetAsync(dlq)
            self.assertEqual(dead.headers["x-last-death-reason"], "expired")
            self.assertEqual(dead.headers["x-last-death-queue"], source.name)
            self.assertEqual(dead.headers["x-last-death-exchange"], "")

        return self.runAio(body)


class LengthLimitTests(AioTTLCase):
    """
    ``x-max-length-bytes`` and ``x-overflow`` (§4).
    """

    def test_maxLengthBytes(self):
        """x-max-length-bytes counts body bytes and drops the oldest as maxlen."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(channel, **{"x-max-length-bytes": 10})
            x = channel.default_exchange
            await x.publish(aio_pika.Message(b"aaaaaa", headers={"h": "x" * 100}), routing_key=source.name)
            self.assertEqual(await messageCountAsync(channel, source.name), 1)
            await x.publish(aio_pika.Message(b"bbbbbb"), routing_key=source.name)
            dead = await pollGetAsync(dlq)
            self.assertEqual(dead.body, b"aaaaaa")
            self.assertEqual(dead.headers["x-death"][0]["reason"], "maxlen")
            self.assertEqual(await drain(source), [b"bbbbbb"])

        return self.runAio(body)

    def test_rejectPublish(self):
        """reject-publish nacks the overflowing publish, keeps it out of the queue and does not dead-letter it."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(
                channel, **{"x-max-length": 1, "x-overflow": "reject-publish"}
            )
            x = channel.default_exchange
            await x.publish(aio_pika.Message(b"m1"), routing_key=source.name)
            with self.assertRaises(aiormq.exceptions.DeliveryError) as caught:
                await x.publish(aio_pika.Message(b"m2"), routing_key=source.name)
            self.assertIsInstance(caught.exception.frame, pamqp.commands.Basic.Nack)
            await asyncio.sleep(0.1)
            self.assertEqual(await drain(source), [b"m1"])
            self.assertEqual(await messageCountAsync(channel, dlq.name), 0)

        return self.runAio(body)

    def test_rejectPublishDlx(self):
        """reject-publish-dlx nacks the overflowing publish and dead-letters it as maxlen."""

        async def body(connection):
            channel = await connection.channel()
            source, dlq = await self.deadLetterPair(
                channel, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"}
            )
            x = channel.default_exchange
            await x.publish(aio_pika.Message(b"m1"), routing_key=source.name)
            with self.assertRaises(aiormq.exceptions.DeliveryError):
                await x.publish(aio_pika.Message(b"m2"), routing_key=source.name)
            dead = await pollGetAsync(dlq)
            self.assertEqual(dead.body, b"m2")
            self.assertEqual(dead.headers["x-death"][0]["reason"], "maxlen")
            self.assertEqual(await drain(source), [b"m1"])

        return self.runAio(body)


class SeedExampleTests(AioTTLCase):
    """
    The delayed-delivery post's hold-queue pattern (§5.8), with aio-pika.
    """

    def test_holdQueuePattern(self):
        """A hold queue (TTL + DLX + routing key + x-expires, redeclared per post) delivers each message after the delay."""

        async def body(connection):
            channel = await connection.channel()
            work = await self.queue(channel, "work")
            hold = self.name("wait.300")
            self._queues.append(hold)
            args = {
                "x-message-ttl": 300,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": work.name,
                "x-expires": 1000,
            }
            sent = []
            for i in range(2):
                await channel.declare_queue(hold, arguments=args)
                sent.append(time.monotonic())
                await channel.default_exchange.publish(aio_pika.Message(b"job%d" % i), routing_key=hold)
            arrived = []
            while len(arrived) < 2 and time.monotonic() < sent[-1] + 3:
                message = await pollGetAsync(work, timeout=1)
                if message is not None:
                    arrived.append((message, time.monotonic()))
            self.assertEqual([m.body for m, _ in arrived], [b"job0", b"job1"])
            for (message, at), t in zip(arrived, sent):
                self.assertGreaterEqual(at - t, 0.28)
                [entry] = message.headers["x-death"]
                self.assertEqual((entry["reason"], entry["queue"]), ("expired", hold))

        return self.runAio(body)
