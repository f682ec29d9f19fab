"""
Interop tests for quorum queues on one node (issue 11, docs/quorum.md),
driven by pika: every rule was calibrated on the RabbitMQ 3.10.8 peer and
the tests run unchanged against it (``OTTER_TEST_AMQP_URL`` and, for the
management ones, ``OTTER_TEST_MGMT_URL``)::

    OTTER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5682/ \\
    OTTER_TEST_MGMT_URL=http://127.0.0.1:15682 \\
        .venv-test/bin/trial otter_tx.test.interop.test_interop_quorum

Names start with ``quorum-``.  RabbitMQ's quorum queue is a Raft log, so
its counts and dead letters lag an operation slightly: assertions on them
poll with a deadline (``waitCount``, ``getOne``).
"""

import socket
import time
from urllib.parse import quote

import pika
import pika.exceptions

from otter_tx.test.interop.support import (
    EXTERNAL_OTTER,
    InteropTestCase,
    ManagementMixin,
    inProcessOnly,
    onlyOtter,
    pollGet,
    waitCount,
    waitUntil,
)
from otter_tx.test.interop.test_interop_pika import PikaTestCase
from otter_tx.test.unit.test_quorum import QQ, qq


def getOne(channel, queue, timeout=5.0, autoAck=False):
    """
    ``basic_get`` ``queue`` until a message comes or ``timeout`` seconds
    pass; ``(method, properties, body)`` or ``(None, None, None)``.
    """
    return pollGet(channel, queue, timeout, 0.02, autoAck=autoAck) or (None, None, None)


def countDeliveries(channel, queue, most):
    """
    Get the one message of ``queue`` and nack it with requeue until it is
    gone or ``most`` deliveries were made; return how many there were.
    """
    n = 0
    while n < most:
        method, _, _ = getOne(channel, queue, timeout=0.5 if n else 5.0)
        if method is None:
            break
        n += 1
        channel.basic_nack(method.delivery_tag, requeue=True)
    return n


def deliveryCount(properties):
    """The ``x-delivery-count`` header of ``properties`` (int) or None when absent."""
    return (properties.headers or {}).get("x-delivery-count")


def preconditionText(text, queue):
    """``PRECONDITION_FAILED - `` + ``text`` with ``queue`` named in vhost '/'."""
    return "PRECONDITION_FAILED - " + text % ("queue '%s' in vhost '/'" % (queue,),)


class QuorumTestCase(PikaTestCase):
    """Helpers: a dead-letter pair (fanout exchange and its queue)."""

    def deadLetterPair(self, channel):
        """Declare a fanout exchange and a bound durable queue; return ``(exchange, queue)``."""
        dlx = self.tempExchange("quorum-dlx")
        dlq = self.tempQueue("quorum-dlq")
        channel.exchange_declare(dlx, "fanout")
        channel.queue_declare(dlq, durable=True)
        channel.queue_bind(dlq, dlx)
        return dlx, dlq


class DeclareTests(QuorumTestCase):
    """The declare-time rules of a quorum queue, with RabbitMQ 3.10's 406 texts."""

    def test_declare(self):
        """A durable quorum queue declares; a passive declare answers its counts."""
        name = self.tempQueue("quorum-d")

        def body(connect):
            ch = connect().channel()
            ok = ch.queue_declare(name, durable=True, arguments=QQ).method
            self.assertEqual((ok.queue, ok.message_count, ok.consumer_count), (name, 0, 0))
            ch.basic_publish("", name, b"x")
            self.assertEqual(waitCount(ch, name, 1), 1)

        return self.runPika(body)

    def test_flagsRefused(self):
        """Non-durable, exclusive and auto-delete quorum queues get 406 invalid property."""
        name = self.tempQueue("quorum-f")

        def body(connect):
            c = connect()
            for kw, prop in ((dict(durable=False), "non-durable"),
                             (dict(durable=True, exclusive=True), "exclusive-owner"),
                             (dict(durable=True, auto_delete=True), "auto-delete")):
                self.assertChannelError(
                    406, preconditionText("invalid property '%s' for %%s" % (prop,), name),
                    c.channel().queue_declare, name, arguments=QQ, **kw)

        return self.runPika(body)

    def test_unsupportedArguments(self):
        """Priorities, queue mode and version, master locator and x-max-age are refused on a quorum queue."""
        name = self.tempQueue("quorum-u")

        def body(connect):
            c = connect()
            for key, value in (("x-max-priority", 5), ("x-queue-mode", "lazy"),
                               ("x-queue-master-locator", "min-masters"), ("x-queue-version", 2),
                               ("x-max-age", "1D")):
                self.assertChannelError(
                    406, preconditionText("invalid arg '%s' for %%s of queue type rabbit_quorum_queue" % (key,),
                                          name),
                    c.channel().queue_declare, name, durable=True, arguments=qq(**{key: value}))

        return self.runPika(body)

    def test_acceptedArguments(self):
        """Every quorum argument 3.10 accepts declares, x-delivery-limit of any type included."""
        names = []

        def body(connect):
            c = connect()
            for extra in ({"x-overflow": "reject-publish-dlx"}, {"x-overflow": "reject-publish"},
                          {"x-max-length": 10, "x-max-length-bytes": 100}, {"x-message-ttl": 1000},
                          {"x-expires": 60000}, {"x-single-active-consumer": True},
                          {"x-delivery-limit": 3}, {"x-delivery-limit": -1}, {"x-delivery-limit": "x"},
                          {"x-dead-letter-strategy": "at-least-once"},
                          {"x-dead-letter-strategy": "at-most-once"},
                          {"x-max-in-memory-length": 3}, {"x-quorum-initial-group-size": 3}):
                name = self.tempQueue("quorum-a")
                names.append(name)
                ok = c.channel().queue_declare(name, durable=True, arguments=qq(**extra)).method
                self.assertEqual(ok.queue, name)

        return self.runPika(body)

    def test_deadLetterStrategyInvalid(self):
        """An unknown x-dead-letter-strategy gets invalid_dlx_strategy."""
        name = self.tempQueue("quorum-s")

        def body(connect):
            self.assertChannelError(
                406, preconditionText("invalid arg 'x-dead-letter-strategy' for %s: invalid_dlx_strategy", name),
                connect().channel().queue_declare, name, durable=True,
                arguments=qq(**{"x-dead-letter-strategy": "bogus"}))

        return self.runPika(body)

    def test_queueTypeNotString(self):
        """An integer x-queue-type gets {unacceptable_type,signedint}."""
        name = self.tempQueue("quorum-t")

        def body(connect):
            self.assertChannelError(
                406, preconditionText("invalid arg 'x-queue-type' for %s: {unacceptable_type,signedint}", name),
                connect().channel().queue_declare, name, durable=True, arguments={"x-queue-type": 1})

        return self.runPika(body)

    def test_serverNamed(self):
        """A server-named quorum queue is refused."""

        def body(connect):
            self.assertChannelError(
                406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue",
                connect().channel().queue_declare, "", durable=True, arguments=QQ)

        return self.runPika(body)

    def test_redeclareOtherType(self):
        """Redeclaring a quorum queue as classic, without a type or with another limit is inequivalent, and so is a classic one as quorum."""
        name = self.tempQueue("quorum-r")
        classic = self.tempQueue("quorum-rc")

        def body(connect):
            c = connect()
            c.channel().queue_declare(name, durable=True, arguments=QQ)
            c.channel().queue_declare(classic, durable=True)
            prefix = "inequivalent arg '%s' for %%s: "
            for args, text in (
                (None, prefix % "x-queue-type" + "received none but current is the value 'quorum' of type 'longstr'"),
                ({"x-queue-type": "classic"}, prefix % "x-queue-type" + "received 'classic' but current is 'quorum'"),
                (qq(x_delivery_limit=3), prefix % "x-delivery-limit"
                 + "received the value '3' of type 'signedint' but current is none"),
            ):
                self.assertChannelError(406, preconditionText(text, name),
                                        c.channel().queue_declare, name, durable=True, arguments=args)
            self.assertChannelError(
                406, preconditionText(prefix % "x-queue-type"
                                      + "received the value 'quorum' of type 'longstr' but current is none", classic),
                c.channel().queue_declare, classic, durable=True, arguments=QQ)
            ok = c.channel().queue_declare(name, durable=True, arguments=QQ).method
            self.assertEqual(ok.queue, name)

        return self.runPika(body)

    def test_redeclareComparedArguments(self):
        """A quorum queue redeclared with classic-only arguments answers ok; with another quorum argument it is inequivalent."""
        name = self.tempQueue("quorum-rq")

        def body(connect):
            c = connect()
            c.channel().queue_declare(name, durable=True, arguments=QQ)
            for extra in ({"x-max-priority": 3}, {"x-queue-mode": "lazy"}, {"x-queue-version": 2}):
                self.assertEqual(c.channel().queue_declare(name, durable=True, arguments=qq(**extra)).method.queue,
                                 name)
            for key, value, kind in (("x-max-in-memory-length", 3, "signedint"),
                                     ("x-quorum-initial-group-size", 3, "signedint"),
                                     ("x-dead-letter-strategy", "at-least-once", "longstr")):
                self.assertChannelError(
                    406, preconditionText("inequivalent arg '%s' for %%s: received the value '%s' of type '%s' but "
                                          "current is none" % (key, value, kind), name),
                    c.channel().queue_declare, name, durable=True, arguments=qq(**{key: value}))

        return self.runPika(body)


class DeliveryLimitTests(QuorumTestCase):
    """The delivery count (x-delivery-count), x-delivery-limit and dead-letter reason delivery_limit."""

    def test_poisonMessage(self):
        """A poison message with x-delivery-limit 3 reaches its dead-letter queue after exactly 4 deliveries, with RabbitMQ's headers."""
        name = self.tempQueue("quorum-poison")

        def body(connect):
            c = connect()
            ch = c.channel()
            dlx, dlq = self.deadLetterPair(ch)
            ch.queue_declare(name, durable=True, arguments=qq(x_delivery_limit=3, x_dead_letter_exchange=dlx))
            ch.basic_publish("", name, b"poison", pika.BasicProperties(delivery_mode=2, headers={"app": "a"}))
            seen = []

            def onMessage(chan, method, props, body):
                seen.append((method.redelivered, deliveryCount(props)))
                chan.basic_nack(method.delivery_tag, requeue=True)

            ch.basic_consume(name, onMessage)
            waitUntil(lambda: len(seen) >= 4, connection=c)
            # once dead-lettered it cannot be delivered a fifth time
            method, props, got = getOne(ch, dlq, autoAck=True)
            c.process_data_events(time_limit=0)
            self.assertEqual(seen, [(False, None), (True, 1), (True, 2), (True, 3)])
            self.assertEqual(got, b"poison")
            self.assertEqual((method.exchange, method.routing_key), (dlx, name))
            self.assertEqual(props.delivery_mode, 2)
            h = props.headers
            self.assertEqual(h["app"], "a")
            self.assertNotIn("x-delivery-count", h)
            self.assertEqual((h["x-first-death-reason"], h["x-first-death-queue"], h["x-first-death-exchange"]),
                             ("delivery_limit", name, ""))
            (death,) = h["x-death"]
            self.assertEqual({k: v for k, v in death.items() if k != "time"},
                             {"count": 1, "reason": "delivery_limit", "queue": name, "exchange": "",
                              "routing-keys": [name]})
            self.assertEqual(waitCount(ch, name, 0), 0)

        return self.runPika(body)

    def test_getCountsFromZero(self):
        """basic.get answers carry x-delivery-count from the first (0), a consumer's deliveries only from the first return (1)."""
        name = self.tempQueue("quorum-get")

        def body(connect):
            c = connect()
            ch = c.channel()
            ch.queue_declare(name, durable=True, arguments=QQ)
            ch.basic_publish("", name, b"x")
            counts = []
            for _ in range(3):
                method, props, _ = getOne(ch, name)
                counts.append((method.redelivered, deliveryCount(props)))
                ch.basic_nack(method.delivery_tag, requeue=True)
            self.assertEqual(counts, [(False, 0), (True, 1), (True, 2)])
            seen = []
            ch.basic_consume(name, lambda chan, m, p, b: (seen.append(deliveryCount(p)), chan.basic_ack(m.delivery_tag)))
            waitUntil(lambda: seen, connection=c)
            self.assertEqual(seen, [3])

        return self.runPika(body)

    def test_everyReturnCounts(self):
        """nack and reject with requeue, basic.recover and a channel closing with the message unacked each count one delivery."""
        name = self.tempQueue("quorum-ret")

        def body(connect):
            c = connect()
            ch = c.channel()
            ch.queue_declare(name, durable=True, arguments=QQ)
            ch.basic_publish("", name, b"x")
            method, _, _ = getOne(ch, name)
            ch.basic_nack(method.delivery_tag, requeue=True)
            method, _, _ = getOne(ch, name)
            ch.basic_reject(method.delivery_tag, requeue=True)
            method, _, _ = getOne(ch, name)
            ch.basic_recover(requeue=True)
            other = c.channel()
            getOne(other, name)
            other.close()
            method, props, _ = getOne(ch, name)
            self.assertEqual(deliveryCount(props), 4)
            ch.basic_ack(method.delivery_tag)

        return self.runPika(body)

    def test_connectionLossCounts(self):
        """A connection lost with the message unacked counts one delivery too."""
        name = self.tempQueue("quorum-lost")

        def body(connect):
            first = connect()
            ch = first.channel()
            ch.queue_declare(name, durable=True, arguments=QQ)
            ch.basic_publish("", name, b"x")
            getOne(ch, name)
            first.close()
            ch = connect().channel()
            method, props, _ = getOne(ch, name)
            self.assertEqual((method.redelivered, deliveryCount(props)), (True, 1))

        return self.runPika(body)

    def test_limitWithoutDeadLetterExchange(self):
        """At the limit a message of a queue without a dead-letter exchange is dropped."""
        name = self.tempQueue("quorum-drop")

        def body(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=qq(x_delivery_limit=1))
            ch.basic_publish("", name, b"x")
            for expected in (0, 1):
                method, props, _ = getOne(ch, name)
                self.assertEqual(deliveryCount(props), expected)
                ch.basic_nack(method.delivery_tag, requeue=True)
            self.assertEqual(waitCount(ch, name, 0), 0)
            self.assertIsNone(ch.basic_get(name)[0])

        return self.runPika(body)

    def test_limitZeroAndNegative(self):
        """A limit of 0 (or -1, as 0 on 3.10) allows one delivery; a non-integer one is no limit."""

        def body(connect):
            ch = connect().channel()
            for limit, deliveries in ((0, 1), (-1, 1), ("x", 4)):
                name = self.tempQueue("quorum-lim")
                ch.queue_declare(name, durable=True, arguments=qq(x_delivery_limit=limit))
                ch.basic_publish("", name, b"x")
                self.assertEqual(countDeliveries(ch, name, 4), deliveries, limit)

        return self.runPika(body)

    def test_rejectedReason(self):
        """A reject without requeue dead-letters with reason rejected, not delivery_limit."""
        name = self.tempQueue("quorum-rej")

        def body(connect):
            ch = connect().channel()
            dlx, dlq = self.deadLetterPair(ch)
            ch.queue_declare(name, durable=True, arguments=qq(x_delivery_limit=5, x_dead_letter_exchange=dlx))
            ch.basic_publish("", name, b"x")
            method, _, _ = getOne(ch, name)
            ch.basic_reject(method.delivery_tag, requeue=False)
            _, props, _ = getOne(ch, dlq, autoAck=True)
            self.assertEqual(props.headers["x-death"][0]["reason"], "rejected")

        return self.runPika(body)

    def test_atLeastOnce(self):
        """With x-dead-letter-strategy at-least-once (and reject-publish) a dead letter reaches its target queue."""
        name = self.tempQueue("quorum-alo")

        def body(connect):
            ch = connect().channel()
            dlx, dlq = self.deadLetterPair(ch)
            ch.queue_declare(name, durable=True, arguments=qq(
                x_dead_letter_exchange=dlx, x_overflow="reject-publish", x_delivery_limit=0,
                **{"x-dead-letter-strategy": "at-least-once"}))
            ch.basic_publish("", name, b"x")
            method, _, _ = getOne(ch, name)
            ch.basic_nack(method.delivery_tag, requeue=True)
            _, props, got = getOne(ch, dlq, autoAck=True)
            self.assertEqual((got, props.headers["x-death"][0]["reason"]), (b"x", "delivery_limit"))

        return self.runPika(body)

    def test_atLeastOnceUnroutableHeld(self):
        """An at-least-once dead letter the DLX routes nowhere leaves the ready count and is not sent when a queue is bound later (RabbitMQ retries after 180 s)."""
        name = self.tempQueue("quorum-held")

        def body(connect):
            c = connect()
            ch = c.channel()
            dlx = self.tempExchange("quorum-hx")
            ch.exchange_declare(dlx, "fanout")
            ch.queue_declare(name, durable=True, arguments=qq(
                x_dead_letter_exchange=dlx, x_overflow="reject-publish",
                **{"x-dead-letter-strategy": "at-least-once"}))
            ch.basic_publish("", name, b"x")
            method, _, _ = getOne(ch, name)
            ch.basic_reject(method.delivery_tag, requeue=False)
            self.assertEqual(waitCount(ch, name, 0), 0)
            dlq = self.tempQueue("quorum-hq")
            ch.queue_declare(dlq, durable=True)
            ch.queue_bind(dlq, dlx)
            # nothing arrives within a second (a poll that fails as soon as one does)
            self.assertIsNone(getOne(ch, dlq, timeout=1.0)[0])
            self.assertIsNone(ch.basic_get(name)[0])

        return self.runPika(body)


class OverflowTests(QuorumTestCase):
    """x-overflow on a quorum queue: drop-head, a soft reject-publish, reject-publish-dlx as drop-head."""

    def fill(self, connect, overflow):
        """Publish 0..3 with confirms to a quorum queue of x-max-length 2; return (confirms, bodies left, dead letters)."""
        name = self.tempQueue("quorum-ov")
        ch = connect().channel()
        dlx, dlq = self.deadLetterPair(ch)
        ch.queue_declare(name, durable=True, arguments=qq(x_max_length=2, x_overflow=overflow,
                                                           x_dead_letter_exchange=dlx))
        ch.confirm_delivery()
        confirms = []
        for i in range(4):
            try:
                ch.basic_publish("", name, str(i).encode())
                confirms.append("ack")
            except pika.exceptions.NackError:
                confirms.append("nack")
        bodies = []
        while True:
            method, _, body = ch.basic_get(name, auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        dead = []
        while True:
            method, props, body = getOne(ch, dlq, timeout=0.5, autoAck=True)
            if method is None:
                break
            dead.append((body, props.headers["x-death"][0]["reason"]))
        return confirms, bodies, dead

    def test_dropHead(self):
        """drop-head keeps the newest two and dead-letters the others with reason maxlen."""
        return self.runPika(lambda connect: self.assertEqual(
            self.fill(connect, "drop-head"),
            (["ack"] * 4, [b"2", b"3"], [(b"0", "maxlen"), (b"1", "maxlen")])))

    def test_rejectPublish(self):
        """reject-publish accepts the message that goes over the limit and nacks the next (3.10's soft limit)."""
        return self.runPika(lambda connect: self.assertEqual(
            self.fill(connect, "reject-publish"),
            (["ack", "ack", "ack", "nack"], [b"0", b"1", b"2"], [])))

    def test_rejectPublishResumes(self):
        """Once over its reject-publish limit of 2 a quorum queue refuses publishes until one message is left (80 % of the limit)."""
        name = self.tempQueue("quorum-res")

        def body(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=qq(x_max_length=2, x_overflow="reject-publish"))
            ch.confirm_delivery()
            confirms = []

            def publish():
                try:
                    ch.basic_publish("", name, b"x")
                    confirms.append("ack")
                except pika.exceptions.NackError:
                    confirms.append("nack")

            for _ in range(4):
                publish()
            for left in (2, 1):
                getOne(ch, name, autoAck=True)
                self.assertEqual(waitCount(ch, name, left), left)
                publish()
            self.assertEqual(confirms, ["ack", "ack", "ack", "nack", "nack", "ack"])

        return self.runPika(body)

    def test_rejectPublishDlx(self):
        """reject-publish-dlx acts as drop-head on a quorum queue."""
        return self.runPika(lambda connect: self.assertEqual(
            self.fill(connect, "reject-publish-dlx"),
            (["ack"] * 4, [b"2", b"3"], [(b"0", "maxlen"), (b"1", "maxlen")])))


class FeatureTests(QuorumTestCase):
    """TTL, x-expires, single active consumer, QoS, priorities, get and purge on a quorum queue."""

    def test_messageTtl(self):
        """x-message-ttl and a per-message expiration expire messages of a quorum queue."""
        name = self.tempQueue("quorum-ttl")

        def body(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=qq(x_message_ttl=300))
            ch.basic_publish("", name, b"a")
            ch.basic_publish("", name, b"b", pika.BasicProperties(expiration="100"))
            # both TTLs must pass first: RabbitMQ's declare-ok count of a quorum
            # queue lags (0 right after the publish), so it cannot be polled for
            time.sleep(0.8)
            self.assertEqual(waitCount(ch, name, 0), 0)
            self.assertIsNone(ch.basic_get(name)[0])

        return self.runPika(body)

    def test_expires(self):
        """An unused quorum queue with x-expires is deleted (RabbitMQ checks on its 5 s tick)."""
        name = self.tempQueue("quorum-exp")

        def body(connect):
            connect().channel().queue_declare(name, durable=True, arguments=qq(x_expires=500))
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline:
                try:
                    connect().channel().queue_declare(name, passive=True)
                except pika.exceptions.ChannelClosedByBroker as e:
                    return e.reply_code
                time.sleep(0.5)
            return None

        return self.runPika(body).addCallback(self.assertEqual, 404)

    def test_singleActiveConsumer(self):
        """Only the first consumer of a single-active-consumer quorum queue gets messages until it cancels."""
        name = self.tempQueue("quorum-sac")

        def body(connect):
            c = connect()
            ch = c.channel()
            ch.queue_declare(name, durable=True, arguments=qq(x_single_active_consumer=True))
            got = []
            ch.basic_consume(name, lambda chan, m, p, b: (got.append(("A", b)), chan.basic_ack(m.delivery_tag)),
                             consumer_tag="A")
            ch.basic_consume(name, lambda chan, m, p, b: (got.append(("B", b)), chan.basic_ack(m.delivery_tag)),
                             consumer_tag="B")
            for i in range(3):
                ch.basic_publish("", name, str(i).encode())
            waitUntil(lambda: len(got) >= 3, connection=c)
            ch.basic_cancel("A")
            ch.basic_publish("", name, b"3")
            waitUntil(lambda: len(got) >= 4, connection=c)
            # the queue is empty, every delivery acked before the cancel: nothing more comes
            self.assertEqual(waitCount(ch, name, 0), 0)
            c.process_data_events(time_limit=0)
            self.assertEqual(got, [("A", b"0"), ("A", b"1"), ("A", b"2"), ("B", b"3")])

        return self.runPika(body)

    def test_globalQos(self):
        """Consuming from a quorum queue on a channel with a global prefetch closes the connection with 540."""
        name = self.tempQueue("quorum-qos")

        def body(connect):
            connect().channel().queue_declare(name, durable=True, arguments=QQ)
            c = connect()
            ch = c.channel()
            ch.basic_qos(prefetch_count=5, global_qos=True)
            self.assertIsNone(ch.basic_get(name)[0])
            self.assertConnectionError(
                c, 540, "NOT_IMPLEMENTED - queue '%s' in vhost '/' does not support global qos" % (name,),
                ch.basic_consume, name, lambda *a: None)

        return self.runPika(body)

    def test_perConsumerQosLiftsGlobal(self):
        """A per-consumer basic.qos after a global one lifts the global prefetch: the quorum consume is accepted, and a classic queue's consumer gets the per-consumer count."""
        name = self.tempQueue("quorum-qos2")
        classic = self.tempQueue("quorum-qos2c")

        def body(connect):
            c = connect()
            ch = c.channel()
            ch.queue_declare(name, durable=True, arguments=QQ)
            ch.queue_declare(classic, durable=True)
            for _ in range(5):
                ch.basic_publish("", classic, b"x")
            ch.basic_qos(prefetch_count=1, global_qos=True)
            ch.basic_qos(prefetch_count=3, global_qos=False)
            ch.basic_consume(name, lambda *a: None)
            got = []
            ch.basic_consume(classic, lambda chan, m, p, b: got.append(b))
            waitUntil(lambda: len(got) >= 3, connection=c)
            # two of the five are still ready: exactly three were delivered
            self.assertEqual(waitCount(ch, classic, 2), 2)
            c.process_data_events(time_limit=0)
            self.assertEqual(len(got), 3)

        return self.runPika(body)

    def test_exclusiveConsumeIgnored(self):
        """An exclusive consumer does not keep others off a quorum queue (3.10 ignores the flag)."""
        name = self.tempQueue("quorum-xc")

        def body(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=QQ)
            ch.basic_consume(name, lambda *a: None, exclusive=True)
            connect().channel().basic_consume(name, lambda *a: None)
            connect().channel().basic_consume(name, lambda *a: None, exclusive=True)
            self.assertEqual(ch.queue_declare(name, passive=True).method.consumer_count, 3)

        return self.runPika(body)

    def test_prioritiesIgnored(self):
        """Message priorities do not reorder a quorum queue: first in, first out."""
        name = self.tempQueue("quorum-prio")

        def body(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=QQ)
            for body_, prio in ((b"low", 1), (b"high", 9)):
                ch.basic_publish("", name, body_, pika.BasicProperties(priority=prio))
            self.assertEqual(waitCount(ch, name, 2), 2)
            self.assertEqual([getOne(ch, name, autoAck=True)[2] for _ in range(2)], [b"low", b"high"])

        return self.runPika(body)

    def test_conditionalDeleteRefused(self):
        """queue.delete with if-unused or if-empty closes the connection with 540 on a quorum queue; a plain delete works."""
        name = self.tempQueue("quorum-cdel")

        def body(connect):
            connect().channel().queue_declare(name, durable=True, arguments=QQ)
            for flag, kw in (("if-unused", dict(if_unused=True)), ("if-empty", dict(if_empty=True)),
                             ("if-unused", dict(if_unused=True, if_empty=True))):
                c = connect()
                self.assertConnectionError(
                    c, 540, "NOT_IMPLEMENTED - cannot delete queue '%s' in vhost '/'. queue.delete operations with "
                            "%s flag set are not supported by quorum queues" % (name, flag),
                    c.channel().queue_delete, name, **kw)
            self.assertEqual(connect().channel().queue_delete(name).method.message_count, 0)

        return self.runPika(body)

    def test_getPurgeDelete(self):
        """get-ok counts the rest, purge drops the ready ones, a requeued one stays, delete counts it."""
        name = self.tempQueue("quorum-gpd")

        def body(connect):
            ch = connect().channel()
            ch.queue_declare(name, durable=True, arguments=QQ)
            for _ in range(3):
                ch.basic_publish("", name, b"x")
            self.assertEqual(waitCount(ch, name, 3), 3)
            method, _, _ = ch.basic_get(name)
            self.assertEqual(method.message_count, 2)
            self.assertEqual(ch.queue_purge(name).method.message_count, 2)
            ch.basic_nack(method.delivery_tag, requeue=True)
            self.assertEqual(waitCount(ch, name, 1), 1)
            self.assertEqual(ch.queue_delete(name).method.message_count, 1)

        return self.runPika(body)


class WorkloadTests(QuorumTestCase):
    """A client that declares every durable queue as quorum (the RabbitMQ 4 default style) runs unchanged."""

    def test_ordinaryWorkload(self):
        """Publish with confirms, consume and ack, reject to a quorum dead-letter queue, get, purge and delete, all on quorum queues."""
        work = self.tempQueue("quorum-work")
        dead = self.tempQueue("quorum-dead")
        ex = self.tempExchange("quorum-wx")

        def body(connect):
            c = connect()
            ch = c.channel()
            ch.exchange_declare(ex, "direct", durable=True)
            ch.queue_declare(dead, durable=True, arguments=QQ)
            ch.queue_declare(work, durable=True, arguments=qq(x_dead_letter_exchange="",
                                                              x_dead_letter_routing_key=dead))
            ch.queue_bind(work, ex, "job")
            ch.confirm_delivery()
            for i in range(20):
                ch.basic_publish(ex, "job", b"job-%d" % i, pika.BasicProperties(delivery_mode=2))
            ch.basic_qos(prefetch_count=5)
            done = []

            def onMessage(chan, method, props, body):
                if body == b"job-7":
                    chan.basic_reject(method.delivery_tag, requeue=False)
                else:
                    chan.basic_ack(method.delivery_tag)
                done.append(body)

            tag = ch.basic_consume(work, onMessage)
            waitUntil(lambda: len(done) >= 20, connection=c)
            ch.basic_cancel(tag)
            self.assertEqual(done, [b"job-%d" % i for i in range(20)])
            _, props, got = getOne(ch, dead, autoAck=True)
            self.assertEqual((got, props.headers["x-death"][0]["reason"]), (b"job-7", "rejected"))
            for _ in range(3):
                ch.basic_publish(ex, "job", b"later")
            self.assertEqual(waitCount(ch, work, 3), 3)
            method, _, got = ch.basic_get(work)
            self.assertEqual(got, b"later")
            ch.basic_ack(method.delivery_tag)
            self.assertEqual(ch.queue_purge(work).method.message_count, 2)
            self.assertEqual(ch.queue_delete(work).method.message_count, 0)

        return self.runPika(body)


class ClassicExtensionTests(QuorumTestCase):
    """x-delivery-limit on a classic queue: otter_tx's extension (RabbitMQ 3.10 refuses the argument)."""

    @onlyOtter("x-delivery-limit on classic queues is an otter_tx extension (docs/compatibility.md)")
    def test_classicDeliveryLimit(self):
        """A classic queue with x-delivery-limit 1 counts returns in x-delivery-count and dead-letters at the limit."""
        name = self.tempQueue("quorum-classic")

        def body(connect):
            ch = connect().channel()
            dlx, dlq = self.deadLetterPair(ch)
            ch.queue_declare(name, durable=True, arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": dlx})
            ch.basic_publish("", name, b"x")
            counts = []
            for _ in range(2):
                method, props, _ = getOne(ch, name)
                counts.append(deliveryCount(props))
                ch.basic_nack(method.delivery_tag, requeue=True)
            self.assertEqual(counts, [None, 1])
            _, props, _ = getOne(ch, dlq, autoAck=True)
            self.assertEqual(props.headers["x-death"][0]["reason"], "delivery_limit")

        return self.runPika(body)


class DefaultLimitTests(QuorumTestCase):
    """--default-delivery-limit (RabbitMQ 4.x's default of 20 as a setting)."""

    brokerOptions = {"defaultDeliveryLimit": 1}

    @inProcessOnly("the default delivery limit is a broker setting")
    def test_defaultLimit(self):
        """With a default of 1 a quorum queue without x-delivery-limit allows two deliveries; a classic one is unlimited."""
        name = self.tempQueue("quorum-def")
        classic = self.tempQueue("quorum-defc")

        def body(connect):
            ch = connect().channel()
            counts = {}
            for q, args in ((name, QQ), (classic, None)):
                ch.queue_declare(q, durable=True, arguments=args)
                ch.basic_publish("", q, b"x")
                counts[q] = countDeliveries(ch, q, 3)
            self.assertEqual((counts[name], counts[classic]), (2, 3))

        return self.runPika(body)


class ManagementTests(ManagementMixin, InteropTestCase):
    """A quorum queue over the management API: its JSON keys and the delivery-limit policy."""

    def setUp(self):
        d = ManagementMixin.setUp(self)
        self.names = []

        def cleanup():
            for path in reversed(self.names):
                self.mgmtCall("DELETE", path)

        def started(_):
            # after the broker's own cleanup, so that it runs before it
            self.addCleanup(self.inThread, cleanup)

        if d is None:
            return started(None)
        return d.addCallback(started)

    def test_queueJson(self):
        """
        GET /api/queues/%2F/Q says type quorum, with the node as leader, only
        member and online; on a 3-node otter_tx cluster the leader and its
        two followers are the members, the in-sync ones are online (the
        followers once they joined, milliseconds later).
        """
        name = self.name("quorum-json")
        self.names.append("/api/queues/%2F/" + quote(name, safe=""))

        def body():
            status, _ = self.mgmtCall("PUT", "/api/queues/%2F/" + quote(name, safe=""),
                                      {"durable": True, "arguments": QQ})
            self.assertEqual(status, 201)
            status, q = self.mgmtCall("GET", "/api/queues/%2F/" + quote(name, safe=""))
            self.assertEqual((status, q["type"], q["durable"], q["arguments"]), (200, "quorum", True, QQ))
            self.assertIsInstance(q["leader"], str)
            if EXTERNAL_OTTER:
                self.assertEqual((len(set(q["members"])), q["members"][0]), (3, q["leader"]))
                deadline = time.time() + 5
                while len(q["online"]) < 3 and time.time() < deadline:
                    time.sleep(0.05)
                    q = self.mgmtCall("GET", "/api/queues/%2F/" + quote(name, safe=""))[1]
                self.assertEqual(sorted(q["online"]), sorted(q["members"]))
            else:
                self.assertEqual((q["members"], q["online"]), ([q["leader"]], [q["leader"]]))

        return self.inThread(body)

    def test_httpDeclareNonDurable(self):
        """PUT /api/queues of a quorum queue without durable (false by default) answers 400 invalid property 'non-durable'."""
        name = self.name("quorum-hnd")
        path = "/api/queues/%2F/" + quote(name, safe="")
        self.names.append(path)

        def body():
            self.assertEqual(self.mgmtCall("PUT", path, {"arguments": QQ}), (400, {
                "error": "bad_request",
                "reason": "invalid property 'non-durable' for queue '%s' in vhost '/'" % (name,)}))

        return self.inThread(body)

    def test_httpConditionalDelete(self):
        """DELETE /api/queues/%2F/Q?if-unused=true of a quorum queue answers 400 with 3.10's reason; without it 204."""
        name = self.name("quorum-hdel")
        path = "/api/queues/%2F/" + quote(name, safe="")
        self.names.append(path)

        def body():
            self.mgmtCall("PUT", path, {"durable": True, "arguments": QQ})
            self.assertEqual(self.mgmtCall("DELETE", path + "?if-unused=true"), (400, {
                "error": "bad_request",
                "reason": "cannot delete queue '%s' in vhost '/'. queue.delete operations with if-unused flag set "
                          "are not supported by quorum queues" % (name,)}))
            self.assertEqual(self.mgmtCall("DELETE", path)[0], 204)

        return self.inThread(body)

    def test_httpGetDeliveryCount(self):
        """POST .../get on a quorum queue answers x-delivery-count in the properties: 0, then 1 after a requeue."""
        name = self.name("quorum-hget")
        path = "/api/queues/%2F/" + quote(name, safe="")
        self.names.append(path)

        def body():
            self.mgmtCall("PUT", path, {"durable": True, "arguments": QQ})
            self.mgmtCall("POST", "/api/exchanges/%2F/amq.default/publish",
                          {"routing_key": name, "payload": "x", "payload_encoding": "string", "properties": {}})
            counts = []
            deadline = time.monotonic() + 5
            while len(counts) < 2 and time.monotonic() < deadline:
                status, got = self.mgmtCall("POST", path + "/get", {"count": 1, "ackmode": "ack_requeue_true",
                                                                    "encoding": "auto"})
                if got:
                    counts.append((got[0]["redelivered"], got[0]["properties"]["headers"]["x-delivery-count"]))
                else:
                    time.sleep(0.05)
            self.assertEqual(counts, [(False, 0), (True, 1)])

        return self.inThread(body)

    def test_policyValidation(self):
        """A delivery-limit policy must be a non-negative integer; an operator policy may set it."""
        pol = self.name("quorum-pol")
        self.names.extend(["/api/policies/%2F/" + pol, "/api/operator-policies/%2F/" + pol])

        def body():
            for value, text in ((-1, "-1 is not a valid delivery limit"),
                                ("x", '&lt;&lt;"x"&gt;&gt; is not a valid delivery limit')):
                status, err = self.mgmtCall("PUT", "/api/policies/%2F/" + pol,
                                            {"pattern": "^quorum-none", "definition": {"delivery-limit": value}})
                self.assertEqual(status, 400)
                self.assertIn(text, err["reason"])
            for path in ("/api/policies/%2F/", "/api/operator-policies/%2F/"):
                status, _ = self.mgmtCall("PUT", path + pol, {"pattern": "^quorum-none", "apply-to": "queues",
                                                              "definition": {"delivery-limit": 0}})
                self.assertEqual(status, 201)

        return self.inThread(body)

    def test_policyLimit(self):
        """A delivery-limit policy applies to a quorum queue; with x-delivery-limit the lower one wins."""
        pol = self.name("quorum-pl")
        self.names.append("/api/policies/%2F/" + pol)

        def body():
            self.mgmtCall("PUT", "/api/policies/%2F/" + pol,
                          {"pattern": "^" + pol, "apply-to": "queues", "definition": {"delivery-limit": 1}})
            connection = self.pikaConnection()
            try:
                ch = connection.channel()
                results = []
                for suffix, extra in (("-a", {}), ("-b", {"x-delivery-limit": 3}), ("-c", {"x-delivery-limit": 0})):
                    q = pol + suffix
                    self.names.append("/api/queues/%2F/" + quote(q, safe=""))
                    ch.queue_declare(q, durable=True, arguments=dict(QQ, **extra))
                    ch.basic_publish("", q, b"x")
                    results.append(countDeliveries(ch, q, 4))
                self.assertEqual(results, [2, 2, 1])
            finally:
                connection.close()

        return self.inThread(body)



class AioPikaWorkloadTests(InteropTestCase):
    """aio-pika (asyncio) with every queue quorum: the RabbitMQ 4 declare style, unchanged."""

    def setUp(self):
        from otter_tx.test.interop.support import requireModule

        self.aio_pika = requireModule("aio_pika")
        return InteropTestCase.setUp(self)

    def test_workload(self):
        """Declare quorum queues with a delivery limit, publish confirmed, consume with nack then ack, and read x-delivery-count; then delete."""
        aio_pika = self.aio_pika
        work = self.name("quorum-aio")
        dead = self.name("quorum-aiodl")

        async def scenario():
            import asyncio

            connection = await aio_pika.connect(self.url, timeout=10)
            try:
                channel = await connection.channel()
                await channel.declare_queue(dead, durable=True, arguments=QQ)
                queue = await channel.declare_queue(work, durable=True, arguments=qq(
                    x_delivery_limit=1, x_dead_letter_exchange="", x_dead_letter_routing_key=dead))
                for body in (b"good", b"poison"):
                    confirm = await channel.default_exchange.publish(aio_pika.Message(body), routing_key=work)
                    self.assertEqual(confirm.name, "Basic.Ack")
                seen = []
                async with queue.iterator() as it:
                    async for message in it:
                        seen.append((message.body, (message.headers or {}).get("x-delivery-count")))
                        if message.body == b"poison":
                            await message.nack(requeue=True)
                        else:
                            await message.ack()
                        if len(seen) == 3:
                            break
                deadQueue = await channel.get_queue(dead)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 5
                got = None
                while got is None and loop.time() < deadline:
                    got = await deadQueue.get(no_ack=True, fail=False)
                    if got is None:
                        await asyncio.sleep(0.02)
                # aio-pika's delete defaults to if-unused and if-empty, which
                # a quorum queue refuses: a RabbitMQ 4 style client says False
                await queue.delete(if_unused=False, if_empty=False)
                await deadQueue.delete(if_unused=False, if_empty=False)
                return seen, got.body, got.headers["x-death"][0]["reason"]
            finally:
                await connection.close()

        def check(result):
            seen, body, reason = result
            self.assertEqual(seen, [(b"good", None), (b"poison", None), (b"poison", 1)])
            self.assertEqual((body, reason), (b"poison", "delivery_limit"))

        return self.inAsyncio(scenario).addCallback(check)


class KombuWorkloadTests(InteropTestCase):
    """kombu (Celery's transport) with a quorum queue, unchanged."""

    def setUp(self):
        from otter_tx.test.interop.support import requireModule

        self.kombu = requireModule("kombu")
        return InteropTestCase.setUp(self)

    def test_requeueThenAck(self):
        """A kombu consumer that requeues once sees x-delivery-count 1 on the redelivery, acks it, and the queue is left empty."""
        kombu = self.kombu
        name = self.name("quorum-kq")
        exName = self.name("quorum-kx")

        def body():
            with kombu.Connection(self.url.rstrip("/") + "//") as conn:
                ch = conn.channel()
                ex = kombu.Exchange(exName, "direct", durable=True)(ch)
                q = kombu.Queue(name, ex, "k", durable=True, queue_arguments=qq(x_delivery_limit=1))(ch)
                q.declare()
                try:
                    kombu.Producer(ch, exchange=ex, routing_key="k").publish({"a": 1}, serializer="json")
                    got = []

                    def onMessage(payload, message):
                        got.append((payload, message.headers.get("x-delivery-count"),
                                    message.delivery_info.get("redelivered")))
                        if len(got) == 1:
                            message.requeue()
                        else:
                            message.ack()

                    with kombu.Consumer(ch, [q], callbacks=[onMessage]) as consumer:
                        consumer.qos(prefetch_count=10)
                        deadline = time.monotonic() + 5
                        while len(got) < 2 and time.monotonic() < deadline:
                            try:
                                conn.drain_events(timeout=0.2)
                            except socket.timeout:
                                pass
                    return got, q.get(no_ack=True)
                finally:
                    q.delete()
                    ex.delete()

        def check(result):
            got, left = result
            self.assertEqual(got, [({"a": 1}, None, False), ({"a": 1}, 1, True)])
            self.assertIsNone(left)

        return self.inThread(body).addCallback(check)
