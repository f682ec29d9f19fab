"""
Interop tests with aio-pika (asyncio, on aiormq and pamqp).

Each test runs a coroutine on a fresh asyncio loop in a worker thread through
:meth:`InteropTestCase.inAsyncio`.  aio-pika channels have publisher confirms
on by default, so every ``publish`` here waits for the broker's basic.ack.

aiormq maps channel.close reply codes to exception classes
(404 ``ChannelNotFoundEntity``, 405 ``ChannelLockedResource``, 406
``ChannelPreconditionFailed``) and keeps only the reply text, so the tests
assert the class (the code) and the exact text.  Texts are RabbitMQ 3.10's
(see ../shared/reference/rabbitmq-semantics.md §6.2-6.5).
"""

import asyncio
import datetime
from decimal import Decimal

from otter_tx.test.interop.support import (
    InteropTestCase,
    messageCountAsync,
    pamqpInt,
    pollGetAsync,
    requireModule,
    waitUntilAsync,
)

#: seconds a whole scenario may take before it is abandoned
SCENARIO_TIMEOUT = 30


async def getWithin(queue, timeout=5.0, noAck=False):
    """
    Poll ``queue.get`` until a message arrives; fail after ``timeout`` s.
    """
    message = await pollGetAsync(queue, timeout, 0.02, noAck=noAck)
    if message is None:
        raise AssertionError("no message on %s within %ss" % (queue.name, timeout))
    return message


async def collect(q, count, timeout=5.0):
    """
    Take ``count`` items from asyncio queue ``q`` or fail after ``timeout``.
    """
    return [await asyncio.wait_for(q.get(), timeout) for _ in range(count)]


class AioPikaTests(InteropTestCase):
    """
    aio-pika against the broker.
    """

    def setUp(self):
        self.aio_pika = requireModule("aio_pika")
        return InteropTestCase.setUp(self)

    def runScenario(self, scenario, robust=False):
        """
        Run ``scenario(connection)`` with a fresh aio-pika connection that is
        closed afterwards; return a Deferred.
        """
        aio_pika = self.aio_pika

        async def main():
            connect = aio_pika.connect_robust if robust else aio_pika.connect
            connection = await connect(self.url, timeout=10)
            try:
                return await asyncio.wait_for(
                    scenario(connection), SCENARIO_TIMEOUT)
            finally:
                await connection.close()

        return self.inAsyncio(main)

    # -- connecting ------------------------------------------------------

    def test_connectRobust(self):
        """
        connect_robust opens a connection and channel that declare, publish
        (confirmed) and get.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            confirm = await channel.default_exchange.publish(
                aio_pika.Message(b"robust"), routing_key=queue.name)
            self.assertEqual(confirm.name, "Basic.Ack")
            message = await getWithin(queue, noAck=True)
            self.assertEqual(message.body, b"robust")
            self.assertFalse(connection.is_closed)

        return self.runScenario(scenario, robust=True)

    def test_serverProperties(self):
        """
        The connection sees RabbitMQ's capabilities (confirms, nack, cancel
        notify, per-consumer qos).
        """
        async def scenario(connection):
            await connection.channel()
            caps = connection.transport.connection.server_capabilities
            for cap in ("publisher_confirms", "basic.nack",
                        "consumer_cancel_notify", "per_consumer_qos",
                        "exchange_exchange_bindings", "connection.blocked"):
                self.assertIs(caps.get(cap), True, cap)

        return self.runScenario(scenario)

    # -- exchanges and routing -------------------------------------------

    def test_directAndFanout(self):
        """
        A direct exchange routes by exact key; a fanout exchange copies to
        every bound queue.
        """
        aio_pika = self.aio_pika
        ExchangeType = aio_pika.ExchangeType

        async def scenario(connection):
            channel = await connection.channel()
            direct = await channel.declare_exchange(
                self.name("direct"), ExchangeType.DIRECT, auto_delete=True)
            fanout = await channel.declare_exchange(
                self.name("fanout"), ExchangeType.FANOUT, auto_delete=True)
            try:
                q1 = await channel.declare_queue(exclusive=True)
                q2 = await channel.declare_queue(exclusive=True)
                await q1.bind(direct, "k1")
                await q2.bind(direct, "k2")
                await q1.bind(fanout)
                await q2.bind(fanout)
                await direct.publish(aio_pika.Message(b"to-k1"), "k1")
                await fanout.publish(aio_pika.Message(b"fan"), "ignored")
                self.assertEqual(
                    (await getWithin(q1, noAck=True)).body, b"to-k1")
                self.assertEqual((await getWithin(q1, noAck=True)).body, b"fan")
                self.assertEqual((await getWithin(q2, noAck=True)).body, b"fan")
                self.assertIsNone(await q2.get(no_ack=True, fail=False))
            finally:
                await direct.delete()
                await fanout.delete()

        return self.runScenario(scenario)

    def test_topicRouting(self):
        """
        A topic exchange matches '*' to one word and '#' to zero or more.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            topic = await channel.declare_exchange(
                self.name("topic"), aio_pika.ExchangeType.TOPIC,
                auto_delete=True)
            try:
                star = await channel.declare_queue(exclusive=True)
                hash_ = await channel.declare_queue(exclusive=True)
                await star.bind(topic, "a.*")
                await hash_.bind(topic, "a.#")
                for key in ("a", "a.b", "a.b.c", "b.a"):
                    await topic.publish(aio_pika.Message(key.encode()), key)
                got = []
                for queue in (star, hash_):
                    names = []
                    while True:
                        m = await queue.get(no_ack=True, fail=False)
                        if m is None:
                            break
                        names.append(m.body.decode())
                    got.append(names)
                self.assertEqual(got, [["a.b"], ["a", "a.b", "a.b.c"]])
            finally:
                await topic.delete()

        return self.runScenario(scenario)

    def test_headersExchange(self):
        """
        A headers exchange routes on x-match all and any.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            exchange = await channel.declare_exchange(
                self.name("headers"), aio_pika.ExchangeType.HEADERS,
                auto_delete=True)
            try:
                qAll = await channel.declare_queue(exclusive=True)
                qAny = await channel.declare_queue(exclusive=True)
                await qAll.bind(exchange, arguments={
                    "x-match": "all", "color": "red", "size": 1})
                await qAny.bind(exchange, arguments={
                    "x-match": "any", "color": "red", "size": 1})
                await exchange.publish(aio_pika.Message(
                    b"both", headers={"color": "red", "size": 1}), "")
                await exchange.publish(aio_pika.Message(
                    b"one", headers={"color": "red", "size": 2}), "")
                await exchange.publish(aio_pika.Message(
                    b"none", headers={"color": "blue"}), "")
                self.assertEqual(
                    (await getWithin(qAll, noAck=True)).body, b"both")
                self.assertIsNone(await qAll.get(no_ack=True, fail=False))
                self.assertEqual(
                    (await getWithin(qAny, noAck=True)).body, b"both")
                self.assertEqual(
                    (await getWithin(qAny, noAck=True)).body, b"one")
                self.assertIsNone(await qAny.get(no_ack=True, fail=False))
            finally:
                await exchange.delete()

        return self.runScenario(scenario)

    def test_exchangeToExchangeBinding(self):
        """
        A message published to a source exchange reaches a queue bound to an
        exchange bound to it (exchange.bind).
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            source = await channel.declare_exchange(
                self.name("e2e-src"), aio_pika.ExchangeType.TOPIC,
                auto_delete=True)
            destination = await channel.declare_exchange(
                self.name("e2e-dst"), aio_pika.ExchangeType.FANOUT,
                auto_delete=True)
            try:
                queue = await channel.declare_queue(exclusive=True)
                await queue.bind(destination)
                await destination.bind(source, "logs.#")
                await source.publish(aio_pika.Message(b"e2e"), "logs.x")
                await source.publish(aio_pika.Message(b"miss"), "other")
                self.assertEqual(
                    (await getWithin(queue, noAck=True)).body, b"e2e")
                self.assertIsNone(await queue.get(no_ack=True, fail=False))
            finally:
                await destination.delete()
                await source.delete()

        return self.runScenario(scenario)

    # -- consuming -------------------------------------------------------

    def test_iteratorConsume(self):
        """
        queue.iterator() yields messages in publish order and process() acks
        them, leaving the queue empty.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            for i in range(5):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"m%d" % i), queue.name)
            bodies = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        bodies.append(message.body)
                    if len(bodies) == 5:
                        break
            self.assertEqual(bodies, [b"m%d" % i for i in range(5)])
            again = await channel.declare_queue(queue.name, passive=True)
            self.assertEqual(again.declaration_result.message_count, 0)

        return self.runScenario(scenario)

    def test_callbackConsume(self):
        """
        queue.consume(callback) delivers to the callback with consumer tag,
        delivery tags 1.. and redelivered=False; manual acks empty the queue.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            received = asyncio.Queue()

            async def onMessage(message):
                await received.put(message)

            tag = await queue.consume(onMessage)
            for i in range(3):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"c%d" % i), queue.name)
            messages = await collect(received, 3)
            self.assertEqual([m.body for m in messages], [b"c0", b"c1", b"c2"])
            self.assertEqual([m.delivery_tag for m in messages], [1, 2, 3])
            self.assertEqual({m.consumer_tag for m in messages}, {tag})
            self.assertEqual({m.redelivered for m in messages}, {False})
            self.assertEqual({m.routing_key for m in messages}, {queue.name})
            for m in messages:
                await m.ack()
            await queue.cancel(tag)
            again = await channel.declare_queue(queue.name, passive=True)
            self.assertEqual(again.declaration_result.message_count, 0)
            self.assertEqual(again.declaration_result.consumer_count, 0)

        return self.runScenario(scenario)

    def test_nackRequeueAndReject(self):
        """
        nack(requeue=True) redelivers with redelivered=True; reject(requeue=
        False) drops the message.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(
                aio_pika.Message(b"again"), queue.name)
            first = await getWithin(queue)
            self.assertFalse(first.redelivered)
            await first.nack(requeue=True)
            second = await getWithin(queue)
            self.assertEqual(second.body, b"again")
            self.assertTrue(second.redelivered)
            await second.reject(requeue=False)
            # the channel handles the reject before the get
            self.assertIsNone(await queue.get(fail=False))

        return self.runScenario(scenario)

    def test_nackMultiple(self):
        """
        nack(multiple=True, requeue=True) requeues every unacked delivery up to
        the tag, in original order.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            for i in range(3):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"n%d" % i), queue.name)
            got = [await getWithin(queue) for _ in range(3)]
            await got[2].nack(multiple=True, requeue=True)
            again = [await getWithin(queue, noAck=True) for _ in range(3)]
            self.assertEqual([m.body for m in again], [b"n0", b"n1", b"n2"])
            self.assertEqual({m.redelivered for m in again}, {True})

        return self.runScenario(scenario)

    def test_getEmpty(self):
        """
        get on an empty queue returns None (fail=False) or raises QueueEmpty.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            self.assertIsNone(await queue.get(fail=False))
            with self.assertRaises(aio_pika.exceptions.QueueEmpty):
                await queue.get()
            await channel.default_exchange.publish(
                aio_pika.Message(b"x"), queue.name)
            message = await getWithin(queue)
            self.assertEqual(message.message_count, 0)
            await message.ack()

        return self.runScenario(scenario)

    def test_qosPrefetch(self):
        """
        With prefetch_count 2 a consumer holds at most two unacked messages;
        acking one lets the next in.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=2)
            queue = await channel.declare_queue(exclusive=True)
            for i in range(5):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"p%d" % i), queue.name)
            received = asyncio.Queue()
            await queue.consume(received.put)
            first = await collect(received, 2)

            async def ready(count):
                # the broker delivered exactly 5 - count: no delivery is still coming
                return await waitUntilAsync(lambda: readyIs(count))

            async def readyIs(count):
                return await messageCountAsync(channel, queue.name) == count

            self.assertTrue(await ready(3))
            self.assertEqual(received.qsize(), 0)
            await first[0].ack()
            third = await collect(received, 1)
            self.assertEqual(third[0].body, b"p2")
            self.assertTrue(await ready(2))
            self.assertEqual(received.qsize(), 0)

        return self.runScenario(scenario)

    # -- publishing ------------------------------------------------------

    def test_publisherConfirms(self):
        """
        Every publish on a confirming channel is answered with basic.ack,
        including an unroutable non-mandatory one.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(exclusive=True)
            results = await asyncio.gather(*[
                channel.default_exchange.publish(
                    aio_pika.Message(b"c%d" % i), queue.name)
                for i in range(20)])
            self.assertEqual({r.name for r in results}, {"Basic.Ack"})
            lost = await channel.default_exchange.publish(
                aio_pika.Message(b"lost"), self.name("no-such-queue"),
                mandatory=False)
            self.assertEqual(lost.name, "Basic.Ack")
            again = await channel.declare_queue(queue.name, passive=True)
            self.assertEqual(again.declaration_result.message_count, 20)

        return self.runScenario(scenario)

    def test_mandatoryReturnRaises(self):
        """
        An unroutable mandatory publish with on_return_raises raises
        DeliveryError carrying basic.return 312 NO_ROUTE.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel(on_return_raises=True)
            key = self.name("nowhere")
            with self.assertRaises(aio_pika.exceptions.DeliveryError) as cm:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"ret"), key, mandatory=True)
            returned = cm.exception.message
            self.assertEqual(returned.delivery.reply_code, 312)
            self.assertEqual(returned.delivery.reply_text, "NO_ROUTE")
            self.assertEqual(returned.delivery.routing_key, key)
            self.assertEqual(returned.delivery.exchange, "")
            self.assertEqual(returned.body, b"ret")
            # the channel stays usable
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(
                aio_pika.Message(b"ok"), queue.name, mandatory=True)

        return self.runScenario(scenario)

    def test_mandatoryReturnCallback(self):
        """
        Without on_return_raises the returned message goes to the channel's
        return callbacks with its body and headers.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            returned = asyncio.Queue()
            channel.return_callbacks.add(
                lambda _channel, message: returned.put_nowait(message))
            exchange = await channel.declare_exchange(
                self.name("ret"), aio_pika.ExchangeType.DIRECT,
                auto_delete=True)
            try:
                await exchange.publish(
                    aio_pika.Message(b"back", headers={"h": "v"}), "unbound",
                    mandatory=True)
                [message] = await collect(returned, 1)
                self.assertEqual(message.body, b"back")
                self.assertEqual(message.headers, {"h": "v"})
                self.assertEqual(message.routing_key, "unbound")
                self.assertEqual(message.exchange, exchange.name)
            finally:
                await exchange.delete()

        return self.runScenario(scenario)

    def test_transactions(self):
        """
        Publishes in a transaction are invisible until commit and discarded by
        rollback.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            observer = await connection.channel()
            queue = await observer.declare_queue(exclusive=True)
            channel = await connection.channel(publisher_confirms=False)
            tx = channel.transaction()
            await tx.select()
            await channel.default_exchange.publish(
                aio_pika.Message(b"committed"), queue.name)
            # a round trip on the tx channel: the publish was handled, and held
            await channel.declare_queue(queue.name, passive=True)
            self.assertIsNone(await queue.get(fail=False))
            await tx.commit()
            self.assertEqual(
                (await getWithin(queue, noAck=True)).body, b"committed")
            await channel.default_exchange.publish(
                aio_pika.Message(b"rolled-back"), queue.name)
            await tx.rollback()
            self.assertIsNone(await queue.get(fail=False))

        return self.runScenario(scenario)

    def test_headersAndPropertiesRoundTrip(self):
        """
        Headers of many field types and all basic properties arrive unchanged.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            stamp = datetime.datetime(2024, 5, 6, 7, 8, 9,
                                      tzinfo=datetime.timezone.utc)
            headers = {
                "str": "text é",
                "int": 42,
                "neg": pamqpInt(-7),
                "big": 2 ** 40,
                "bool": True,
                "float": 1.5,
                "decimal": Decimal("3.14"),
                "bytes": bytearray(b"\x00\x01\xff"),
                "list": [1, "two", False],
                "table": {"nested": "yes", "n": 1},
                "none": None,
                "time": stamp,
            }
            await channel.default_exchange.publish(aio_pika.Message(
                b"props", headers=headers, content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT, priority=5,
                correlation_id="corr-1", reply_to="reply-q",
                expiration=60, message_id="mid-1", timestamp=stamp,
                type="kind", user_id="guest", app_id="otter-tests"),
                queue.name)
            m = await getWithin(queue, noAck=True)
            self.assertEqual(m.body, b"props")
            self.assertEqual(m.content_type, "application/json")
            self.assertEqual(m.content_encoding, "utf-8")
            self.assertEqual(m.delivery_mode, aio_pika.DeliveryMode.PERSISTENT)
            self.assertEqual(m.priority, 5)
            self.assertEqual(m.correlation_id, "corr-1")
            self.assertEqual(m.reply_to, "reply-q")
            self.assertEqual(m.expiration, 60)
            self.assertEqual(m.message_id, "mid-1")
            self.assertEqual(m.timestamp, stamp)
            self.assertEqual(m.type, "kind")
            self.assertEqual(m.user_id, "guest")
            self.assertEqual(m.app_id, "otter-tests")
            got = dict(m.headers)
            self.assertEqual(got, headers)

        return self.runScenario(scenario)

    def test_largeMessage(self):
        """
        A 1 MiB body (many body frames at frame_max 131072) arrives intact
        through a consumer.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            body = bytes(range(256)) * 4096
            await channel.default_exchange.publish(
                aio_pika.Message(body), queue.name)
            async with queue.iterator() as it:
                async for message in it:
                    await message.ack()
                    self.assertEqual(message.body, body)
                    break

        return self.runScenario(scenario)

    def test_emptyBody(self):
        """
        A message with an empty body is delivered with an empty body.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(
                aio_pika.Message(b""), queue.name)
            message = await getWithin(queue, noAck=True)
            self.assertEqual(message.body, b"")

        return self.runScenario(scenario)

    # -- lifecycle -------------------------------------------------------

    def test_queueDeleteCancelsConsumer(self):
        """
        Deleting a queue from another connection sends the consumer a
        server-initiated basic.cancel with its tag.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            name = self.name("cancel")
            queue = await channel.declare_queue(name, auto_delete=False)
            cancelled = asyncio.get_running_loop().create_future()
            underlay = await channel.get_underlay_channel()
            # aiormq 6.9+ calls on_consumer_cancel_callbacks with the
            # server's basic.cancel; older ones (6.8.1 with aio-pika 9.5.6,
            # the newest for Python 3.9, hence PyPy) only drop the consumer
            # from channel.consumers when it arrives, so watch that instead
            callbacks = getattr(underlay, "on_consumer_cancel_callbacks", None)
            if callbacks is not None:
                callbacks.add(lambda frame: cancelled.done() or cancelled.set_result(frame))
            tag = await queue.consume(lambda message: None)
            self.assertIn(tag, underlay.consumers)
            other = await aio_pika.connect(self.url, timeout=10)
            try:
                otherChannel = await other.channel()
                await otherChannel.queue_delete(name)
            finally:
                await other.close()
            if callbacks is not None:
                frame = await asyncio.wait_for(cancelled, 5)
                self.assertEqual(frame.name, "Basic.Cancel")
                self.assertEqual(frame.consumer_tag, tag)
            else:
                deadline = asyncio.get_running_loop().time() + 5
                while tag in underlay.consumers:
                    self.assertLess(asyncio.get_running_loop().time(), deadline,
                                    "no basic.cancel for %s within 5 s" % (tag,))
                    await asyncio.sleep(0.02)
            # the channel is still open and a later cancel is harmless
            self.assertFalse(channel.is_closed)
            await channel.declare_queue(exclusive=True)

        return self.runScenario(scenario)

    def test_deleteIfUnusedAndIfEmpty(self):
        """
        queue.delete if_unused with a consumer and if_empty with a message
        give 406 PRECONDITION_FAILED with RabbitMQ's texts.
        """
        aio_pika = self.aio_pika
        exceptions = aio_pika.exceptions

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(
                aio_pika.Message(b"full"), queue.name)
            await queue.consume(lambda message: None, no_ack=False)
            with self.assertRaises(exceptions.ChannelPreconditionFailed) as cm:
                await queue.delete(if_unused=True)
            self.assertEqual(
                cm.exception.args[0],
                "PRECONDITION_FAILED - queue '%s' in vhost '/' in use"
                % (queue.name,))
            channel = await connection.channel()
            queue = await channel.get_queue(queue.name)
            with self.assertRaises(exceptions.ChannelPreconditionFailed) as cm:
                await queue.delete(if_empty=True)
            self.assertEqual(
                cm.exception.args[0],
                "PRECONDITION_FAILED - queue '%s' in vhost '/' not empty"
                % (queue.name,))

        return self.runScenario(scenario)

    # -- errors ----------------------------------------------------------

    def test_passiveDeclareNotFound(self):
        """
        A passive declare of a missing queue or exchange raises 404 NOT_FOUND;
        the connection stays usable.
        """
        aio_pika = self.aio_pika
        exceptions = aio_pika.exceptions

        async def scenario(connection):
            name = self.name("missing")
            channel = await connection.channel()
            with self.assertRaises(exceptions.ChannelNotFoundEntity) as cm:
                await channel.declare_queue(name, passive=True)
            self.assertEqual(cm.exception.args[0],
                             "NOT_FOUND - no queue '%s' in vhost '/'" % (name,))
            channel = await connection.channel()
            with self.assertRaises(exceptions.ChannelNotFoundEntity) as cm:
                await channel.declare_exchange(name, passive=True)
            self.assertEqual(
                cm.exception.args[0],
                "NOT_FOUND - no exchange '%s' in vhost '/'" % (name,))
            channel = await connection.channel()
            await channel.declare_queue(exclusive=True)

        return self.runScenario(scenario)

    def test_inequivalentQueue(self):
        """
        Redeclaring a queue with another durable flag raises 406 with the
        inequivalent arg text (an exclusive queue ignores durable instead).
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            exclusive = await channel.declare_queue(self.name("ineq-excl"),
                                                    exclusive=True)
            # exclusive queues are never durable, so this is equivalent
            await channel.declare_queue(exclusive.name, exclusive=True,
                                        durable=True)
            name = self.name("ineq-q")
            await channel.declare_queue(name, durable=False, auto_delete=False)
            try:
                with self.assertRaises(
                        aio_pika.exceptions.ChannelPreconditionFailed) as cm:
                    await channel.declare_queue(name, durable=True)
                self.assertEqual(
                    cm.exception.args[0],
                    "PRECONDITION_FAILED - inequivalent arg 'durable' for "
                    "queue '%s' in vhost '/': received 'true' but current is "
                    "'false'" % (name,))
            finally:
                channel = await connection.channel()
                await channel.queue_delete(name)

        return self.runScenario(scenario)

    def test_inequivalentExchange(self):
        """
        Redeclaring an exchange with another type raises 406 with the
        inequivalent arg 'type' text.
        """
        aio_pika = self.aio_pika

        async def scenario(connection):
            channel = await connection.channel()
            name = self.name("ineq-x")
            await channel.declare_exchange(
                name, aio_pika.ExchangeType.DIRECT, auto_delete=True)
            try:
                with self.assertRaises(
                        aio_pika.exceptions.ChannelPreconditionFailed) as cm:
                    await channel.declare_exchange(
                        name, aio_pika.ExchangeType.FANOUT, auto_delete=True)
                self.assertEqual(
                    cm.exception.args[0],
                    "PRECONDITION_FAILED - inequivalent arg 'type' for "
                    "exchange '%s' in vhost '/': received 'fanout' but "
                    "current is 'direct'" % (name,))
            finally:
                channel = await connection.channel()
                await channel.exchange_delete(name)

        return self.runScenario(scenario)

    def test_exclusiveQueueLocked(self):
        """
        Declaring or consuming another connection's exclusive queue raises 405
        RESOURCE_LOCKED with RabbitMQ's text.
        """
        aio_pika = self.aio_pika
        exceptions = requireModule("aiormq").exceptions

        async def scenario(connection):
            channel = await connection.channel()
            queue = await channel.declare_queue(self.name("excl"),
                                                exclusive=True)
            text = (
                "RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                "queue '%s' in vhost '/'. It could be originally declared on "
                "another connection or the exclusive property value does not "
                "match that of the original declaration." % (queue.name,))
            other = await aio_pika.connect(self.url, timeout=10)
            try:
                otherChannel = await other.channel()
                with self.assertRaises(exceptions.ChannelLockedResource) as cm:
                    await otherChannel.declare_queue(queue.name, exclusive=True)
                self.assertEqual(cm.exception.args[0], text)
                otherChannel = await other.channel()
                with self.assertRaises(exceptions.ChannelLockedResource) as cm:
                    await otherChannel.declare_queue(queue.name, passive=True)
                self.assertEqual(cm.exception.args[0], text)
            finally:
                await other.close()

        return self.runScenario(scenario)

    def test_reservedName(self):
        """
        Declaring a queue named 'amq.*' raises 403 ACCESS_REFUSED, even when
        it is this connection's own server-named queue.
        """
        exceptions = requireModule("aiormq").exceptions

        async def scenario(connection):
            channel = await connection.channel()
            with self.assertRaises(exceptions.ChannelAccessRefused) as cm:
                await channel.declare_queue("amq.otter-test")
            self.assertEqual(
                cm.exception.args[0],
                "ACCESS_REFUSED - queue name 'amq.otter-test' contains "
                "reserved prefix 'amq.*'")
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            self.assertTrue(queue.name.startswith("amq.gen-"), queue.name)
            with self.assertRaises(exceptions.ChannelAccessRefused) as cm:
                await channel.declare_queue(queue.name, exclusive=True)
            self.assertEqual(
                cm.exception.args[0],
                "ACCESS_REFUSED - queue name '%s' contains reserved prefix "
                "'amq.*'" % (queue.name,))

        return self.runScenario(scenario)
