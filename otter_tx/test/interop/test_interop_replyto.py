"""
Interop tests for direct reply-to (https://www.rabbitmq.com/docs/direct-reply-to)
with pika: the RPC pattern without a reply queue.
"""

import pika

from otter_tx.test.interop.support import InteropTestCase

REPLY_TO = "amq.rabbitmq.reply-to"


class DirectReplyToTests(InteropTestCase):
    """amq.rabbitmq.reply-to pseudo-queue."""

    def test_rpcRoundTrip(self):
        """A request published with reply_to amq.rabbitmq.reply-to gets its reply on the no-ack consumer."""
        q = self.name("rpc")

        def run():
            server = self.pikaConnection()
            sch = server.channel()
            sch.queue_declare(q, exclusive=True)
            client = self.pikaConnection()
            cch = client.channel()
            replies = []
            cch.basic_consume(REPLY_TO, lambda ch, m, p, b: replies.append((b, p.correlation_id, m.redelivered)),
                              auto_ack=True)
            cch.basic_publish("", q, b"ping", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c1"))
            method, props, body = None, None, None
            for _ in range(50):
                method, props, body = sch.basic_get(q, auto_ack=True)
                if method:
                    break
                server.process_data_events(0.02)
            rewritten = props.reply_to
            sch.basic_publish("", rewritten, b"pong", pika.BasicProperties(correlation_id=props.correlation_id))
            for _ in range(100):
                if replies:
                    break
                client.process_data_events(0.02)
            client.close()
            server.close()
            return rewritten, replies

        def check(result):
            rewritten, replies = result
            self.assertTrue(rewritten.startswith(REPLY_TO + "."), rewritten)
            self.assertEqual(replies, [(b"pong", "c1", False)])

        return self.inThread(run).addCallback(check)

    def test_publishWithoutConsumer(self):
        """Publishing with reply_to amq.rabbitmq.reply-to without a reply consumer is a 406."""

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(reply_to=REPLY_TO))
            try:
                ch.basic_qos(prefetch_count=1)  # a round trip to see the channel close
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code, e.reply_text
            finally:
                if c.is_open:
                    c.close()

        return self.inThread(run).addCallback(
            self.assertEqual, (406, "PRECONDITION_FAILED - fast reply consumer does not exist")
        )

    def test_consumeWithAckRefused(self):
        """The reply consumer must be no-ack."""

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            try:
                ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code, e.reply_text
            finally:
                if c.is_open:
                    c.close()

        return self.inThread(run).addCallback(
            self.assertEqual, (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
        )

    def test_passiveDeclare(self):
        """A passive declare of amq.rabbitmq.reply-to succeeds, reporting 0 messages and 1 consumer as RabbitMQ does."""

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            r = ch.queue_declare(REPLY_TO, passive=True).method
            c.close()
            return r.message_count, r.consumer_count

        return self.inThread(run).addCallback(self.assertEqual, (0, 1))

    def test_replyAfterConsumerGoneIsUnroutable(self):
        """A reply to a closed requester is unroutable (returned when mandatory)."""

        def run():
            client = self.pikaConnection()
            cch = client.channel()
            cch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
            q = self.name("rpc2")
            cch.queue_declare(q)
            cch.basic_publish("", q, b"req", pika.BasicProperties(reply_to=REPLY_TO))
            method, props, body = None, None, None
            for _ in range(50):
                method, props, body = cch.basic_get(q, auto_ack=True)
                if method:
                    break
            cch.queue_delete(q)
            client.close()
            server = self.pikaConnection()
            sch = server.channel()
            sch.confirm_delivery()
            try:
                sch.basic_publish("", props.reply_to, b"late", mandatory=True)
                returned = False
            except pika.exceptions.UnroutableError:
                returned = True
            server.close()
            return returned

        return self.inThread(run).addCallback(self.assertTrue)
