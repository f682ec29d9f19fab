"""
Interop tests for the x-delayed-message exchange with pika and aio-pika.
Debian's RabbitMQ has no rabbitmq-delayed-message-exchange plugin, so these
run against the in-process broker only; they encode the plugin's documented
behaviour (its README, "Limitations").
"""

import time

import aio_pika
import pika

from otter_tx.test.interop.support import InteropTestCase, inProcessOnly, waitCount

NO_PLUGIN = "Debian's RabbitMQ 3.10 ships without the delayed-message plugin"


class PikaDelayedTests(InteropTestCase):
    """pika against an x-delayed-message exchange."""

    @inProcessOnly(NO_PLUGIN)
    def test_delayedDelivery(self):
        """Messages with x-delay arrive after their delay, in due order, with x-delay negated."""
        ex = self.name("delayed")

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            ch.exchange_declare(ex, "x-delayed-message", arguments={"x-delayed-type": "direct"})
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(q, ex, "k")
            t0 = time.monotonic()
            for delay, body in ((600, b"slow"), (200, b"fast")):
                ch.basic_publish(ex, "k", body, pika.BasicProperties(headers={"x-delay": delay}))
            got = []
            deadline = time.monotonic() + 5
            while len(got) < 2 and time.monotonic() < deadline:
                m = ch.basic_get(q, auto_ack=True)
                if m[0] is None:
                    c.process_data_events(0.01)
                    continue
                got.append((m[2], round(time.monotonic() - t0, 1), m[1].headers["x-delay"]))
            ch.exchange_delete(ex)
            c.close()
            return got

        def check(got):
            self.assertEqual([(b, d) for b, _, d in got], [(b"fast", -200), (b"slow", -600)])
            self.assertGreaterEqual(got[0][1], 0.2)
            self.assertGreaterEqual(got[1][1], 0.6)
            self.assertLess(got[1][1], 1.5)

        return self.inThread(run).addCallback(check)

    @inProcessOnly(NO_PLUGIN)
    def test_mandatoryIsReturnedAtOnce(self):
        """A mandatory delayed publish is returned at once (no route yet) but still delivered later."""
        ex = self.name("delayed")

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            ch.confirm_delivery()
            ch.exchange_declare(ex, "x-delayed-message", arguments={"x-delayed-type": "fanout"})
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(q, ex, "")
            try:
                ch.basic_publish(ex, "", b"x", pika.BasicProperties(headers={"x-delay": 100}), mandatory=True)
                returned = False
            except pika.exceptions.UnroutableError:
                returned = True
            # returned (no queue bound when it was published), then delivered after its delay
            n = waitCount(ch, q, 1)
            ch.exchange_delete(ex)
            c.close()
            return returned, n

        return self.inThread(run).addCallback(self.assertEqual, (True, 1))

    @inProcessOnly(NO_PLUGIN)
    def test_declareErrors(self):
        """A missing x-delayed-type is a 406 with the plugin's text."""
        ex = self.name("delayed")

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            try:
                ch.exchange_declare(ex, "x-delayed-message")
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code, e.reply_text
            finally:
                if c.is_open:
                    c.close()

        return self.inThread(run).addCallback(
            self.assertEqual,
            (406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"),
        )


class AioPikaDelayedTests(InteropTestCase):
    """aio-pika against an x-delayed-message exchange."""

    @inProcessOnly(NO_PLUGIN)
    def test_topicDelayed(self):
        """A topic-typed delayed exchange routes by pattern when the delay is over."""
        ex = self.name("delayed")

        async def run():
            conn = await aio_pika.connect(self.url, timeout=10)
            try:
                ch = await conn.channel()
                x = await ch.declare_exchange(ex, "x-delayed-message", arguments={"x-delayed-type": "topic"})
                q = await ch.declare_queue(exclusive=True)
                await q.bind(x, "a.#")
                t0 = time.monotonic()
                await x.publish(aio_pika.Message(b"hello", headers={"x-delay": 300}), routing_key="a.b.c",
                                mandatory=False)
                immediately = await q.get(no_ack=True, fail=False)
                async with q.iterator() as it:
                    async for message in it:
                        waited = time.monotonic() - t0
                        body = message.body
                        await message.ack()
                        break
                await x.delete()
                return immediately, body, waited
            finally:
                await conn.close()

        def check(result):
            immediately, body, waited = result
            self.assertIsNone(immediately)
            self.assertEqual(body, b"hello")
            self.assertGreaterEqual(waited, 0.3)

        return self.inAsyncio(run).addCallback(check)
