"""
Interop tests for issue 3 (message TTL, queue expiry, dead-lettering and
length limits) with the blocking pika client.

Every rule of ``rabbitmq-semantics.md`` sections 1-4 that a client can
observe has a test here; the same rules are covered again with aio-pika in
``test_interop_ttl_aiopika``.  All tests not marked
:func:`~otter_tx.test.interop.support.onlyOtter` pass against RabbitMQ 3.10.8.

Deliberate differences (``onlyOtter``):

* prompt reaping: otter_tx removes (and dead-letters) an expired message
  within 50 ms of its due time wherever it sits, and queue counts never
  include expired messages; RabbitMQ 3.10 reaps only at the head.
* the RabbitMQ 3.13/4.x dead-letter header form: ``x-last-death-reason``,
  ``x-last-death-queue`` and ``x-last-death-exchange`` (absent in 3.10).

Field types of the ``x-death`` header are checked on the wire: pika decodes
``I`` and ``l`` to the same Python ``int``, so :func:`rawProperties` swaps in a
``BasicProperties`` subclass that keeps the encoded property bytes, and
:func:`typedHeaders` decodes them keeping every AMQP type tag.

Timing: TTLs are 50-1000 ms; tests poll with deadlines.  Queue existence
under ``x-expires`` is probed by publishing with ``mandatory`` and confirms
(publishing does not renew the lease, a passive declare would).

Sources: ``/work/shared/reference/rabbitmq-semantics.md`` (cited as §n.m),
``/work/shared/seeds/`` (the OtterMQ TTL note and the hold-queue post).
"""

import struct
import time
from datetime import datetime

import pika
import pika.spec
from pika.compat import long as pikaLong
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError

from otter_tx.test.interop.support import InteropTestCase, messageCount, onlyOtter, pollGet, waitUntil

PROMPT = "prompt reaping: RabbitMQ reaps only at the head"
FORM313 = "RabbitMQ 3.13/4.x dead-letter headers (x-last-death-*); 3.10 omits them"

#: keys of one x-death entry as RabbitMQ writes them (original-expiration
#: only when the message carried an expiration property)
XDEATH_KEYS = {"count", "reason", "queue", "time", "exchange", "routing-keys"}


# -- typed decoding of the content header ------------------------------------


class _RawBasicProperties(pika.spec.BasicProperties):
    """
    ``BasicProperties`` that also keeps its encoded bytes in ``raw``.
    """

    def decode(self, encoded, offset=0):
        self.raw = bytes(encoded[offset:])
        return super().decode(encoded, offset)


def rawProperties(testCase):
    """
    Make pika keep the encoded content-header properties of every message it
    receives (in ``properties.raw``) until ``testCase`` ends.
    """
    original = pika.spec.props[pika.spec.BasicProperties.INDEX]
    pika.spec.props[pika.spec.BasicProperties.INDEX] = _RawBasicProperties

    def restore():
        pika.spec.props[pika.spec.BasicProperties.INDEX] = original

    testCase.addCleanup(restore)


_FIXED = {
    "t": (">B", 1),
    "b": (">b", 1),
    "B": (">B", 1),
    "s": (">h", 2),
    "u": (">H", 2),
    "I": (">i", 4),
    "i": (">I", 4),
    "l": (">q", 8),
    "L": (">q", 8),
    "f": (">f", 4),
    "d": (">d", 8),
    "T": (">Q", 8),
}


def _typedValue(data, offset):
    tag = chr(data[offset])
    offset += 1
    if tag in _FIXED:
        fmt, size = _FIXED[tag]
        return (tag, struct.unpack_from(fmt, data, offset)[0]), offset + size
    if tag in "Sx":
        (size,) = struct.unpack_from(">I", data, offset)
        value = data[offset + 4 : offset + 4 + size]
        if tag == "S":
            value = value.decode("utf-8")
        return (tag, value), offset + 4 + size
    if tag == "A":
        (size,) = struct.unpack_from(">I", data, offset)
        offset += 4
        end = offset + size
        items = []
        while offset < end:
            item, offset = _typedValue(data, offset)
            items.append(item)
        return (tag, items), offset
    if tag == "F":
        table, offset = _typedTable(data, offset)
        return (tag, table), offset
    if tag == "V":
        return (tag, None), offset
    if tag == "D":
        return (tag, (data[offset], struct.unpack_from(">i", data, offset + 1)[0])), offset + 5
    raise ValueError("unknown field type %r" % (tag,))


def _typedTable(data, offset):
    (size,) = struct.unpack_from(">I", data, offset)
    offset += 4
    end = offset + size
    table = []
    while offset < end:
        keyLength = data[offset]
        key = data[offset + 1 : offset + 1 + keyLength].decode("utf-8")
        offset += 1 + keyLength
        value, offset = _typedValue(data, offset)
        table.append((key, value))
    return table, offset


def typedHeaders(properties):
    """
    Decode the headers table of received ``properties`` (see
    :func:`rawProperties`) as a list of ``(key, (tag, value))`` in wire order;
    arrays are ``('A', [(tag, value), ...])`` and tables ``('F', [...])``.
    """
    raw = properties.raw
    (flags,) = struct.unpack_from(">H", raw, 0)
    offset = 2
    for bit in (0x8000, 0x4000):  # content-type, content-encoding
        if flags & bit:
            offset += 1 + raw[offset]
    if not flags & 0x2000:
        return []
    return _typedTable(raw, offset)[0]


# -- helpers run in the worker thread ----------------------------------------


def queueExists(probeChannel, queue):
    """
    Whether ``queue`` exists, found by a mandatory publish through the
    default exchange on a confirm-mode channel (this does not renew
    ``x-expires``, §2.2).
    """
    try:
        probeChannel.basic_publish(
            "", queue, b"probe", pika.BasicProperties(delivery_mode=1), mandatory=True
        )
    except UnroutableError:
        return False
    return True


def drain(channel, queue):
    """
    Get everything ready in ``queue`` (auto-ack) and return the bodies.
    """
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def death(properties):
    """
    The ``x-death`` list of a dead-lettered message.
    """
    return properties.headers["x-death"]


class PikaTTLCase(InteropTestCase):
    """
    Base class: run a body with a fresh pika connection in a worker thread,
    delete recorded exchanges and non-exclusive queues afterwards.
    """

    def setUp(self):
        self._exchanges = []
        self._queues = []
        return super().setUp()

    def runPika(self, body):
        """
        Run ``body(connection)`` in a worker thread with a new
        ``BlockingConnection``; return a Deferred with its result.
        """

        def run():
            connection = self.pikaConnection()
            try:
                return body(connection)
            finally:
                self._deleteDeclared(connection)

        return self.inThread(run)

    def _deleteDeclared(self, connection):
        if not connection.is_open:
            connection = self.pikaConnection()
        try:
            channel = self.channel(connection)
            for queue in self._queues:
                channel.queue_delete(queue)
            for exchange in self._exchanges:
                channel.exchange_delete(exchange)
        finally:
            connection.close()

    def channel(self, connection):
        """
        A new channel in confirm mode: a publish returns once the queues
        have enqueued it, so counts read afterwards include it (RabbitMQ
        serves a passive declare ahead of pending deliveries).
        """
        channel = connection.channel()
        channel.confirm_delivery()
        return channel

    def queue(self, channel, base, exclusive=True, **arguments):
        """
        Declare a queue named after ``base`` with ``arguments`` and return
        its name; non-exclusive queues are deleted after the test.
        """
        name = self.name(base)
        channel.queue_declare(name, exclusive=exclusive, arguments=arguments or None)
        if not exclusive:
            self._queues.append(name)
        return name

    def exchange(self, channel, base, kind="direct"):
        """
        Declare an exchange named after ``base``, deleted after the test.
        """
        name = self.name(base)
        channel.exchange_declare(name, kind)
        self._exchanges.append(name)
        return name

    def deadLetterPair(self, channel, **arguments):
        """
        Declare a dead-letter queue and a source queue dead-lettering into it
        through the default exchange; return ``(source, dlq)``.
        """
        dlq = self.queue(channel, "dlq")
        source = self.queue(
            channel,
            "src",
            **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
            **arguments,
        )
        return source, dlq

    def assertChannelError(self, connection, operation, code, text):
        """
        Run ``operation(channel)`` on a new channel and assert that the broker
        closes that channel with ``code`` and exactly ``text``, while the
        connection stays open.
        """
        channel = connection.channel()
        try:
            operation(channel)
            # a publish is asynchronous: a round trip reveals the close
            channel.basic_qos(prefetch_count=0)
        except ChannelClosedByBroker as e:
            self.assertEqual((e.reply_code, e.reply_text), (code, text))
        else:
            self.fail("channel was not closed; expected %d %s" % (code, text))
        self.assertTrue(connection.is_open)


# -- §1.4, §1.14: the expiration property -----------------------------------


class ExpirationPropertyTests(PikaTTLCase):
    """
    Per-message TTL from the ``expiration`` property (§1.4, §1.9, §1.14).
    """

    def test_ottermqPikaSnippet(self):
        """The OtterMQ TTL note's pika snippet publishes a message that is delivered with expiration '5000' untouched."""

        def body(connection):
            channel = self.channel(connection)
            queue = self.queue(channel, "my-queue")
            # the seed's snippet, with the queue name made unique
            properties = pika.BasicProperties(expiration="5000")
            channel.basic_publish(
                exchange="",
                routing_key=queue,
                body="This message expires in 5 seconds",
                properties=properties,
            )
            self.assertEqual(messageCount(channel, queue), 1)
            method, props, payload = channel.basic_get(queue, auto_ack=True)
            self.assertEqual(payload, b"This message expires in 5 seconds")
            self.assertEqual(props.expiration, "5000")

        return self.runPika(body)

    def test_acceptedForms(self):
        """Expiration values '+100', '007', '0' and '315360000000' are accepted and confirmed."""

        def body(connection):
            channel = self.channel(connection)
            queue = self.queue(channel, "forms")
            for value in ["+100", "007", "0", "315360000000"]:
                channel.basic_publish(
                    "", queue, value.encode(), pika.BasicProperties(expiration=value)
                )
            self.assertTrue(channel.is_open)
            time.sleep(0.2)
            self.assertEqual(drain(channel, queue), [b"315360000000"])

        return self.runPika(body)

    def test_invalidExpiration(self):
        """Each invalid expiration closes the channel with 406 and RabbitMQ's exact reply text."""
        cases = [
            ("abc", "no_integer"),
            ("", "no_integer"),
            ("  100", "no_integer"),
            ("-1", "{value_negative,-1}"),
            ("1.5", '{leftover_string,".5"}'),
            ("100 ", '{leftover_string," "}'),
            ("1e3", '{leftover_string,"e3"}'),
            ("315360000001", "{value_too_large,315360000001}"),
        ]

        def body(connection):
            queue = self.queue(connection.channel(), "bad-exp")
            for value, term in cases:

                def publish(channel, value=value):
                    channel.basic_publish(
                        "", queue, b"x", pika.BasicProperties(expiration=value)
                    )

                self.assertChannelError(
                    connection,
                    publish,
                    406,
                    "PRECONDITION_FAILED - invalid expiration '%s': %s" % (value, term),
                )
            self.assertEqual(messageCount(connection.channel(), queue), 0)

        return self.runPika(body)

    def test_invalidExpirationWithConfirms(self):
        """An invalid expiration on a confirm-mode channel is never confirmed: the channel closes with 406."""

        def body(connection):
            queue = self.queue(connection.channel(), "bad-exp-c")

            def publish(channel):
                channel.confirm_delivery()
                channel.basic_publish("", queue, b"x", pika.BasicProperties(expiration="-1"))

            self.assertChannelError(
                connection,
                publish,
                406,
                "PRECONDITION_FAILED - invalid expiration '-1': {value_negative,-1}",
            )

        return self.runPika(body)

    def test_expiredNotGot(self):
        """A message whose expiration passed is not returned by basic.get and is not counted."""

        def body(connection):
            channel = self.channel(connection)
            queue = self.queue(channel, "exp-get")
            channel.basic_publish("", queue, b"m", pika.BasicProperties(expiration="100"))
            self.assertEqual(messageCount(channel, queue), 1)
            time.sleep(0.3)
            self.assertEqual(channel.basic_get(queue, auto_ack=True), (None, None, None))
            self.assertEqual(messageCount(channel, queue), 0)

        return self.runPika(body)

    def test_expiredBehindLiveNeverDelivered(self):
        """An expired message behind a live one is skipped by basic.get and by a consumer."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            for queueName, mode in [(source, "get"), (self.queue(channel, "c"), "consume")]:
                channel.basic_publish("", queueName, b"A")
                channel.basic_publish(
                    "", queueName, b"B", pika.BasicProperties(expiration="50")
                )
                channel.basic_publish("", queueName, b"C")
                time.sleep(0.25)
                if mode == "get":
                    self.assertEqual(drain(channel, queueName), [b"A", b"C"])
                else:
                    received = []
                    channel.basic_consume(
                        queueName,
                        lambda ch, m, p, b: received.append(b),
                        auto_ack=True,
                    )
                    deadline = time.monotonic() + 2
                    while len(received) < 2 and time.monotonic() < deadline:
                        connection.process_data_events(time_limit=0.05)
                    connection.process_data_events(time_limit=0.2)
                    self.assertEqual(received, [b"A", b"C"])
            # the skipped message was dead-lettered as expired
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"B")
            self.assertEqual(death(got[1])[0]["reason"], "expired")

        return self.runPika(body)

    def test_perQueueIndependentExpiry(self):
        """A message routed to two queues expires in the queue with a TTL and stays in the one without."""

        def body(connection):
            channel = self.channel(connection)
            fanout = self.exchange(channel, "fan", "fanout")
            short = self.queue(channel, "short", **{"x-message-ttl": 100})
            keep = self.queue(channel, "keep")
            channel.queue_bind(short, fanout)
            channel.queue_bind(keep, fanout)
            channel.basic_publish(fanout, "", b"m")
            self.assertTrue(waitUntil(lambda: messageCount(channel, short) == 0))
            self.assertEqual(messageCount(channel, keep), 1)

        return self.runPika(body)


# -- §1.1-§1.3, §1.5, §1.6, §1.10: queue TTL and precedence -------------------


class QueueMessageTTLTests(PikaTTLCase):
    """
    ``x-message-ttl`` (§1.1), precedence (§1.5) and TTL 0 (§1.6).
    """

    def test_integerTypes(self):
        """x-message-ttl sent as 'I' and as 'l' (pika's long) both apply to the queue."""

        def body(connection):
            channel = self.channel(connection)
            for ttl in [150, pikaLong(150)]:
                queue = self.queue(channel, "ttl-type", **{"x-message-ttl": ttl})
                channel.basic_publish("", queue, b"m")
                self.assertEqual(messageCount(channel, queue), 1)
                self.assertTrue(waitUntil(lambda: messageCount(channel, queue) == 0))
            # 2**31 does not fit 'I': pika sends 'l'; within the 10-year cap
            big = self.queue(channel, "ttl-big", **{"x-message-ttl": 2**31})
            channel.basic_publish("", big, b"m")
            time.sleep(0.2)
            self.assertEqual(messageCount(channel, big), 1)

        return self.runPika(body)

    def test_equivalentIntegerTypesOnRedeclare(self):
        """Redeclaring with the same x-message-ttl value in another integer type ('I' vs 'l') is equivalent."""

        def body(connection):
            channel = self.channel(connection)
            queue = self.queue(channel, "ttl-eq", **{"x-message-ttl": 1000})
            channel.queue_declare(
                queue, exclusive=True, arguments={"x-message-ttl": pikaLong(1000)}
            )

            def redeclare(ch):
                ch.queue_declare(queue, exclusive=True, arguments={"x-message-ttl": 2000})

            self.assertChannelError(
                connection,
                redeclare,
                406,
                "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' "
                "in vhost '/': received '2000' but current is '1000'" % (queue,),
            )

        return self.runPika(body)

    def test_invalidMessageTTL(self):
        """Invalid x-message-ttl values close the channel with 406 and RabbitMQ's exact reply text."""
        cases = [
            (-1, "{value_negative,-1}"),
            (315360000001, "{value_too_large,315360000001}"),
            ("abc", '"expected integer, got longstr"'),
            (True, '"expected integer, got bool"'),
        ]

        def body(connection):
            for value, term in cases:
                name = self.name("bad-ttl")
                self.assertChannelError(
                    connection,
                    lambda ch: ch.queue_declare(name, arguments={"x-message-ttl": value}),
                    406,
                    "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '%s' "
                    "in vhost '/': %s" % (name, term),
                )

        return self.runPika(body)

    def test_lowerTTLWins(self):
        """With both a queue TTL and a per-message expiration, the lower one applies."""

        def body(connection):
            channel = self.channel(connection)
            # message lower than queue
            q1 = self.queue(channel, "low-msg", **{"x-message-ttl": 60000})
            channel.basic_publish("", q1, b"m", pika.BasicProperties(expiration="100"))
            channel.basic_publish("", q1, b"stay")
            # queue lower than message (the OtterMQ note claims the message wins)
            q2 = self.queue(channel, "low-q", **{"x-message-ttl": 100})
            channel.basic_publish("", q2, b"m", pika.BasicProperties(expiration="60000"))
            time.sleep(0.35)
            self.assertEqual(drain(channel, q1), [b"stay"])
            self.assertEqual(drain(channel, q2), [])

        return self.runPika(body)

    def test_queueTTLReapsWithoutConsumer(self):
        """Messages under a queue TTL are reaped by the broker with no consumer or get (§1.10)."""

        def body(connection):
            channel = self.channel(connection)
            queue = self.queue(channel, "fifo", **{"x-message-ttl": 100})
            for i in range(3):
                channel.basic_publish("", queue, b"m%d" % i)
            self.assertEqual(messageCount(channel, queue), 3)
            self.assertTrue(waitUntil(lambda: messageCount(channel, queue) == 0, timeout=1.0))

        return self.runPika(body)

    def test_ttlZeroNoConsumerDeadLettered(self):
        """With x-message-ttl 0 and no consumer a message is not kept and is dead-lettered as expired."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 0})
            channel.basic_publish("", source, b"m", mandatory=True)
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"m")
            self.assertEqual(death(got[1])[0]["reason"], "expired")
            self.assertEqual(messageCount(channel, source), 0)

        return self.runPika(body)

    def test_expirationZeroNoConsumer(self):
        """A message with expiration '0' and no consumer is expired at once."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            channel.basic_publish("", source, b"m", pika.BasicProperties(expiration="0"))
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"m")
            self.assertEqual(death(got[1])[0]["reason"], "expired")
            self.assertEqual(death(got[1])[0]["original-expiration"], "0")
            self.assertEqual(messageCount(channel, source), 0)

        return self.runPika(body)

    def test_ttlZeroConsumerReady(self):
        """With x-message-ttl 0 a message is delivered to a consumer that can take it at once."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 0})
            received = []
            channel.basic_consume(source, lambda ch, m, p, b: received.append(b), auto_ack=True)
            channel.basic_publish("", source, b"m")
            deadline = time.monotonic() + 2
            while not received and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.05)
            self.assertEqual(received, [b"m"])
            self.assertEqual(messageCount(channel, dlq), 0)

        return self.runPika(body)

    def test_ttlZeroConsumerFull(self):
        """With x-message-ttl 0 a message is expired when the only consumer has no prefetch room."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 0})
            channel.basic_qos(prefetch_count=1)
            received = []
            channel.basic_consume(source, lambda ch, m, p, b: received.append((m, b)))
            channel.basic_publish("", source, b"first")
            deadline = time.monotonic() + 2
            while not received and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.05)
            channel.basic_publish("", source, b"second")
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"second")
            self.assertEqual(death(got[1])[0]["reason"], "expired")
            channel.basic_ack(received[0][0].delivery_tag)
            connection.process_data_events(time_limit=0.2)
            self.assertEqual([b for _, b in received], [b"first"])

        return self.runPika(body)


# -- §1.7, §1.8: held and requeued messages ----------------------------------


class HeldAndRequeuedTests(PikaTTLCase):
    """
    Unacked messages never expire (§1.7); requeue keeps the expiry (§1.8).
    """

    def test_unackedGetDoesNotExpire(self):
        """A message fetched without ack outlives its TTL and is later rejected, not expired."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 150})
            channel.basic_publish("", source, b"m")
            method, _, _ = channel.basic_get(source)
            time.sleep(0.4)
            self.assertEqual(messageCount(channel, dlq), 0)
            channel.basic_reject(method.delivery_tag, requeue=False)
            got = pollGet(channel, dlq)
            self.assertEqual(death(got[1])[0]["reason"], "rejected")

        return self.runPika(body)

    def test_unackedConsumedDoesNotExpire(self):
        """A message held by a consumer past its expiration can still be acked and is never dead-lettered."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            received = []
            channel.basic_consume(source, lambda ch, m, p, b: received.append(m))
            channel.basic_publish("", source, b"m", pika.BasicProperties(expiration="100"))
            deadline = time.monotonic() + 2
            while not received and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.05)
            connection.sleep(0.35)
            channel.basic_ack(received[0].delivery_tag)
            # a round trip: an unknown tag would have closed the channel (406)
            self.assertEqual(messageCount(channel, source), 0)
            self.assertEqual(messageCount(channel, dlq), 0)

        return self.runPika(body)

    def test_requeueKeepsOriginalExpiry(self):
        """A message requeued before its expiry still expires at the original time, not a full TTL later."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 1000})
            published = time.monotonic()
            channel.basic_publish("", source, b"m")
            method, _, _ = channel.basic_get(source)
            time.sleep(max(0, published + 0.5 - time.monotonic()))
            requeued = time.monotonic()
            channel.basic_nack(method.delivery_tag, requeue=True)
            self.assertTrue(waitUntil(lambda: messageCount(channel, source) == 1, timeout=0.3))
            got = pollGet(channel, dlq, timeout=3)
            arrived = time.monotonic()
            self.assertEqual(death(got[1])[0]["reason"], "expired")
            self.assertGreater(arrived - published, 0.9)
            self.assertLess(arrived - requeued, 0.85)

        return self.runPika(body)

    def test_requeueAfterExpiryExpiresAtOnce(self):
        """A message requeued after its expiry passed is expired and dead-lettered immediately."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 200})
            channel.basic_publish("", source, b"m")
            method, _, _ = channel.basic_get(source)
            time.sleep(0.35)
            channel.basic_reject(method.delivery_tag, requeue=True)
            got = pollGet(channel, dlq, timeout=0.5)
            self.assertIsNotNone(got)
            self.assertEqual(death(got[1])[0]["reason"], "expired")
            self.assertEqual(messageCount(channel, source), 0)

        return self.runPika(body)

    def test_channelCloseRequeueKeepsExpiry(self):
        """A message requeued by closing its channel after its expiry passed is dead-lettered at once."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 300})
            other = connection.channel()
            other.basic_publish("", source, b"m")
            other.basic_get(source)
            time.sleep(0.4)
            other.close()
            got = pollGet(channel, dlq, timeout=1)
            self.assertEqual(got[2], b"m")
            self.assertEqual(death(got[1])[0]["reason"], "expired")

        return self.runPika(body)


# -- §1.10 beyond: prompt reaping (otter_tx only) ---------------------------


class PromptReapingTests(PikaTTLCase):
    """
    otter_tx reaps expired messages wherever they sit (issue 3, §7.6).
    """

    @onlyOtter(PROMPT)
    def test_expiredBehindHeadDeadLetteredPromptly(self):
        """A short-TTL message behind a long-TTL head is dead-lettered on time without anyone touching the queue."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            channel.basic_publish("", source, b"long", pika.BasicProperties(expiration="60000"))
            published = time.monotonic()
            channel.basic_publish("", source, b"short", pika.BasicProperties(expiration="100"))
            got = pollGet(channel, dlq, timeout=2)
            arrived = time.monotonic()
            self.assertIsNotNone(got)
            self.assertEqual(got[2], b"short")
            self.assertEqual(death(got[1])[0]["reason"], "expired")
            # on time, not when the 60 s head expires (a loaded machine adds its delay)
            self.assertLess(arrived - published, 1.0)
            self.assertEqual(messageCount(channel, source), 1)

        return self.runPika(body)

    @onlyOtter(PROMPT)
    def test_countExcludesExpiredBehindHead(self):
        """The ready count drops as soon as a message behind the head expires."""

        def body(connection):
            channel = self.channel(connection)
            queue = self.queue(channel, "count")
            channel.basic_publish("", queue, b"long", pika.BasicProperties(expiration="60000"))
            for i in range(5):
                channel.basic_publish("", queue, b"s", pika.BasicProperties(expiration="50"))
            channel.basic_publish("", queue, b"tail")
            self.assertEqual(messageCount(channel, queue), 7)
            # reaped without anyone fetching: the count falls by itself
            self.assertTrue(waitUntil(lambda: messageCount(channel, queue) == 2))

        return self.runPika(body)

    @onlyOtter(PROMPT)
    def test_mixedTTLsReapedInDueOrder(self):
        """Mixed per-message TTLs in one queue are each dead-lettered close to their own due time."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            start = time.monotonic()
            for ttl in ["400", "100", "300", "200"]:
                channel.basic_publish("", source, ttl.encode(), pika.BasicProperties(expiration=ttl))
            arrivals = []
            while len(arrivals) < 4 and time.monotonic() - start < 2:
                got = pollGet(channel, dlq, timeout=0.8, interval=0.005)
                if got is not None:
                    arrivals.append((got[2], time.monotonic() - start))
            self.assertEqual([b for b, _ in arrivals], [b"100", b"200", b"300", b"400"])
            for payload, at in arrivals:
                due = int(payload) / 1000.0
                self.assertTrue(due <= at + 0.01 and at < due + 0.15, (payload, at))

        return self.runPika(body)


# -- §2: x-expires ------------------------------------------------------------


class QueueExpiryTests(PikaTTLCase):
    """
    ``x-expires`` (§2.1-§2.4, §2.8).
    """

    def _probe(self, connection):
        channel = connection.channel()
        channel.confirm_delivery()
        return channel

    def _waitGone(self, probe, queue, timeout=3.0):
        gone = waitUntil(lambda: not queueExists(probe, queue), timeout=timeout, interval=0.02)
        return time.monotonic() if gone else None

    def test_unusedQueueDeleted(self):
        """An unused queue with x-expires is deleted after the period, not before, and then gives 404."""

        def body(connection):
            channel = self.channel(connection)
            probe = self._probe(connection)
            name = self.name("expires")
            declared = time.monotonic()
            channel.queue_declare(name, arguments={"x-expires": 400})
            self._queues.append(name)
            self.assertTrue(queueExists(probe, name))
            gone = self._waitGone(probe, name)
            self.assertIsNotNone(gone)
            # not before the period: declared was taken before the declare was sent
            self.assertGreater(gone - declared, 0.38)
            self.assertAsNotFound(connection, name)

        return self.runPika(body)

    def assertAsNotFound(self, connection, name):
        """
        Assert a passive declare of ``name`` fails with 404.
        """
        self.assertChannelError(
            connection,
            lambda ch: ch.queue_declare(name, passive=True),
            404,
            "NOT_FOUND - no queue '%s' in vhost '/'" % (name,),
        )

    def test_publishDoesNotRenewAndNothingDeadLettered(self):
        """Publishing does not keep a queue alive, and its messages are dropped with it, not dead-lettered."""

        def body(connection):
            channel = self.channel(connection)
            probe = self._probe(connection)
            dlq = self.queue(channel, "dlq")
            name = self.name("expires-pub")
            channel.queue_declare(
                name,
                arguments={
                    "x-expires": 400,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": dlq,
                },
            )
            self._queues.append(name)
            declared = time.monotonic()
            channel.basic_publish("", name, b"kept")
            # the probe publishes every 20 ms
            gone = self._waitGone(probe, name)
            self.assertIsNotNone(gone)
            self.assertLess(gone - declared, 1.5)
            self.assertEqual(messageCount(channel, dlq), 0)

        return self.runPika(body)

    def _renewTest(self, renew):
        def body(connection):
            channel = self.channel(connection)
            probe = self._probe(connection)
            name = self.name("expires-renew")
            channel.queue_declare(name, arguments={"x-expires": 300})
            self._queues.append(name)
            end = time.monotonic() + 0.8
            while True:
                # taken before the renewal is sent: the broker restarts the
                # period later, so the queue cannot go before last + 0.3 s
                last = time.monotonic()
                renew(channel, name)
                if last > end:
                    break
                time.sleep(0.1)
            # it outlived its first period: renewed
            self.assertTrue(queueExists(probe, name))
            gone = self._waitGone(probe, name)
            self.assertIsNotNone(gone)
            self.assertGreater(gone - last, 0.28)

        return self.runPika(body)

    def test_redeclareRenews(self):
        """Redeclaring a queue restarts its x-expires period."""
        return self._renewTest(
            lambda ch, name: ch.queue_declare(name, arguments={"x-expires": 300})
        )

    def test_passiveDeclareRenews(self):
        """A passive declare also restarts the x-expires period."""
        return self._renewTest(lambda ch, name: ch.queue_declare(name, passive=True))

    def test_basicGetRenews(self):
        """A basic.get, even one that finds the queue empty, restarts the x-expires period."""
        return self._renewTest(lambda ch, name: ch.basic_get(name, auto_ack=True))

    def test_consumerKeepsQueue(self):
        """A queue with a consumer is never expired; the period restarts when the last consumer cancels."""

        def body(connection):
            channel = self.channel(connection)
            probe = self._probe(connection)
            name = self.name("expires-cons")
            channel.queue_declare(name, arguments={"x-expires": 300})
            self._queues.append(name)
            tag = channel.basic_consume(name, lambda *a: None, auto_ack=True)
            connection.sleep(0.7)
            self.assertTrue(queueExists(probe, name))
            # taken before the cancel is sent: the period restarts later
            cancelled = time.monotonic()
            channel.basic_cancel(tag)
            self.assertTrue(queueExists(probe, name))
            gone = self._waitGone(probe, name)
            self.assertIsNotNone(gone)
            self.assertGreater(gone - cancelled, 0.28)

        return self.runPika(body)

    def test_autoDeleteNeverConsumedExpires(self):
        """An auto-delete queue that never had a consumer stays until x-expires deletes it (§2.8)."""

        def body(connection):
            channel = self.channel(connection)
            probe = self._probe(connection)
            name = self.name("expires-ad")
            channel.queue_declare(name, auto_delete=True, arguments={"x-expires": 300})
            self._queues.append(name)
            self.assertTrue(queueExists(probe, name))
            self.assertIsNotNone(self._waitGone(probe, name))

        return self.runPika(body)

    def test_invalidExpires(self):
        """Invalid x-expires values close the channel with 406 and RabbitMQ's exact reply text."""
        cases = [
            (0, "{value_zero,0}"),
            (-5, "{value_negative,-5}"),
            ("abc", '"expected integer, got longstr"'),
            (315360000001, "{value_too_large,315360000001}"),
        ]

        def body(connection):
            for value, term in cases:
                name = self.name("bad-expires")
                self.assertChannelError(
                    connection,
                    lambda ch: ch.queue_declare(name, arguments={"x-expires": value}),
                    406,
                    "PRECONDITION_FAILED - invalid arg 'x-expires' for queue '%s' "
                    "in vhost '/': %s" % (name, term),
                )

        return self.runPika(body)


# -- §3: dead-lettering -------------------------------------------------------


class DeadLetterTests(PikaTTLCase):
    """
    Reasons, routing and configuration errors of dead-lettering (§3.1-§3.5).
    """

    def test_rejectDeadLetters(self):
        """basic.reject requeue=false dead-letters to the DLX with the original routing key."""

        def body(connection):
            channel = self.channel(connection)
            source_x = self.exchange(channel, "src-x")
            dlx = self.exchange(channel, "dlx", "fanout")
            dlq = self.queue(channel, "dlq")
            channel.queue_bind(dlq, dlx)
            source = self.queue(channel, "src", **{"x-dead-letter-exchange": dlx})
            channel.queue_bind(source, source_x, "k1")
            channel.basic_publish(source_x, "k1", b"m")
            method, _, _ = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=False)
            got = pollGet(channel, dlq)
            self.assertEqual((got[0].exchange, got[0].routing_key), (dlx, "k1"))
            self.assertFalse(got[0].redelivered)
            entry = death(got[1])[0]
            self.assertEqual(
                (entry["reason"], entry["queue"], entry["exchange"], entry["routing-keys"]),
                ("rejected", source, source_x, ["k1"]),
            )
            self.assertEqual(messageCount(channel, source), 0)

        return self.runPika(body)

    def test_nackDeadLetters(self):
        """basic.nack requeue=false dead-letters with reason rejected."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            channel.basic_publish("", source, b"m")
            method, _, _ = channel.basic_get(source)
            channel.basic_nack(method.delivery_tag, multiple=False, requeue=False)
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"m")
            self.assertEqual(death(got[1])[0]["reason"], "rejected")

        return self.runPika(body)

    def test_nackMultipleDeadLetters(self):
        """basic.nack multiple=true requeue=false dead-letters every outstanding message up to the tag."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            for i in range(4):
                channel.basic_publish("", source, b"m%d" % i)
            tags = [channel.basic_get(source)[0].delivery_tag for i in range(3)]
            channel.basic_nack(tags[-1], multiple=True, requeue=False)
            self.assertTrue(waitUntil(lambda: messageCount(channel, dlq) == 3))
            bodies = drain(channel, dlq)
            self.assertEqual(sorted(bodies), [b"m0", b"m1", b"m2"])
            self.assertEqual(drain(channel, source), [b"m3"])

        return self.runPika(body)

    def test_requeueTrueDoesNotDeadLetter(self):
        """A reject with requeue=true puts the message back and dead-letters nothing."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            channel.basic_publish("", source, b"m")
            method, _, _ = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=True)
            method, _, payload = channel.basic_get(source, auto_ack=True)
            self.assertTrue(method.redelivered)
            self.assertEqual(messageCount(channel, dlq), 0)

        return self.runPika(body)

    def test_defaultExchangeWithRoutingKey(self):
        """DLX '' with x-dead-letter-routing-key delivers through the default exchange to the named queue."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            channel.basic_publish("", source, b"m")
            method, _, _ = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=False)
            got = pollGet(channel, dlq)
            self.assertEqual((got[0].exchange, got[0].routing_key), ("", dlq))
            entry = death(got[1])[0]
            self.assertEqual((entry["exchange"], entry["routing-keys"]), ("", [source]))

        return self.runPika(body)

    def test_routingKeyOverride(self):
        """x-dead-letter-routing-key replaces the routing key on a named DLX."""

        def body(connection):
            channel = self.channel(connection)
            dlx = self.exchange(channel, "dlx")
            dlq = self.queue(channel, "dlq")
            other = self.queue(channel, "orig-key")
            channel.queue_bind(dlq, dlx, "dead")
            source = self.queue(
                channel,
                "src",
                **{"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"},
            )
            channel.queue_bind(other, dlx, source)
            channel.basic_publish("", source, b"m")
            method, _, _ = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=False)
            got = pollGet(channel, dlq)
            self.assertEqual((got[0].exchange, got[0].routing_key), (dlx, "dead"))
            self.assertEqual(death(got[1])[0]["routing-keys"], [source])
            self.assertEqual(messageCount(channel, other), 0)

        return self.runPika(body)

    def test_missingDLXDropsAndChannelSurvives(self):
        """A dead-lettered message whose DLX does not exist is dropped and the channel stays usable."""

        def body(connection):
            channel = self.channel(connection)
            source = self.queue(
                channel,
                "src",
                **{"x-dead-letter-exchange": self.name("no-such-x"), "x-message-ttl": 50},
            )
            channel.basic_publish("", source, b"expire-me")
            channel.basic_publish("", source, b"reject-me")
            method, _, payload = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=False)
            self.assertTrue(waitUntil(lambda: messageCount(channel, source) == 0))
            # the same channel still works
            queue = self.queue(channel, "after")
            channel.basic_publish("", queue, b"ok")
            self.assertEqual(channel.basic_get(queue, auto_ack=True)[2], b"ok")
            self.assertTrue(channel.is_open)

        return self.runPika(body)

    def test_invalidDeadLetterArguments(self):
        """A DL routing key without a DLX, and a non-string DLX, get RabbitMQ's exact 406 texts."""

        def body(connection):
            name = self.name("bad-dl")
            self.assertChannelError(
                connection,
                lambda ch: ch.queue_declare(name, arguments={"x-dead-letter-routing-key": "k"}),
                406,
                "PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue "
                "'%s' in vhost '/': routing_key_but_no_dlx_defined" % (name,),
            )
            self.assertChannelError(
                connection,
                lambda ch: ch.queue_declare(name, arguments={"x-dead-letter-exchange": 1}),
                406,
                "PRECONDITION_FAILED - invalid type 'signedint' for arg "
                "'x-dead-letter-exchange' in queue '%s' in vhost '/'" % (name,),
            )

        return self.runPika(body)

    def test_ccAndBccRouteTheDeadLetteredCopy(self):
        """Without a DL routing key the copy routes by the publish, CC and BCC keys; BCC is never delivered or recorded."""

        def body(connection):
            channel = self.channel(connection)
            source_x = self.exchange(channel, "src-x")
            dlx = self.exchange(channel, "dlx")
            targets = {}
            for key in ["a", "b", "c"]:
                targets[key] = self.queue(channel, "dl-" + key)
                channel.queue_bind(targets[key], dlx, key)
            source = self.queue(channel, "src", **{"x-dead-letter-exchange": dlx})
            channel.queue_bind(source, source_x, "a")
            channel.basic_publish(
                source_x, "a", b"m", pika.BasicProperties(headers={"CC": ["b"], "BCC": ["c"]})
            )
            method, props, _ = channel.basic_get(source)
            self.assertEqual(props.headers, {"CC": ["b"]})
            channel.basic_reject(method.delivery_tag, requeue=False)
            for key in ["a", "b", "c"]:
                got = pollGet(channel, targets[key])
                self.assertIsNotNone(got, key)
                self.assertEqual(got[1].headers["CC"], ["b"])
                self.assertNotIn("BCC", got[1].headers)
                self.assertEqual(death(got[1])[0]["routing-keys"], ["a", "b"])

        return self.runPika(body)

    def test_dlRoutingKeyIgnoresCC(self):
        """With a DL routing key the copy goes only to that key, and RabbitMQ 3.10 removes the CC header."""

        def body(connection):
            channel = self.channel(connection)
            dlx = self.exchange(channel, "dlx")
            dead = self.queue(channel, "dead")
            ccq = self.queue(channel, "cc")
            channel.queue_bind(dead, dlx, "dead")
            channel.queue_bind(ccq, dlx, "b")
            source = self.queue(
                channel,
                "src",
                **{"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"},
            )
            channel.basic_publish("", source, b"m", pika.BasicProperties(headers={"CC": ["b"]}))
            method, _, _ = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=False)
            got = pollGet(channel, dead)
            self.assertEqual(death(got[1])[0]["routing-keys"], [source, "b"])
            self.assertNotIn("CC", got[1].headers)
            self.assertEqual(messageCount(channel, ccq), 0)

        return self.runPika(body)


class DeadLetterHeaderTests(PikaTTLCase):
    """
    The dead-lettered copy: x-death and x-first-death-* headers, properties
    (§3.5-§3.7).
    """

    def setUp(self):
        rawProperties(self)
        return super().setUp()

    def test_xDeathWireTypesRejected(self):
        """A rejected copy carries one x-death table with exactly RabbitMQ's keys and AMQP types."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            before = int(time.time())
            channel.basic_publish("", source, b"m", pika.BasicProperties(headers={"user": "u"}))
            method, _, _ = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=False)
            got = pollGet(channel, dlq)
            after = int(time.time()) + 1
            headers = dict(typedHeaders(got[1]))
            self.assertEqual(headers["user"], ("S", "u"))
            tag, entries = headers["x-death"]
            self.assertEqual((tag, len(entries)), ("A", 1))
            self.assertEqual(entries[0][0], "F")
            entry = dict(entries[0][1])
            self.assertEqual(set(entry), XDEATH_KEYS)
            self.assertEqual(entry["count"], ("l", 1))
            self.assertEqual(entry["reason"], ("S", "rejected"))
            self.assertEqual(entry["queue"], ("S", source))
            self.assertEqual(entry["exchange"], ("S", ""))
            self.assertEqual(entry["routing-keys"], ("A", [("S", source)]))
            self.assertEqual(entry["time"][0], "T")
            self.assertTrue(before <= entry["time"][1] <= after, (before, entry["time"], after))
            self.assertEqual(headers["x-first-death-reason"], ("S", "rejected"))
            self.assertEqual(headers["x-first-death-queue"], ("S", source))
            self.assertEqual(headers["x-first-death-exchange"], ("S", ""))
            # pika's view: a datetime for the timestamp
            self.assertIsInstance(death(got[1])[0]["time"], datetime)

        return self.runPika(body)

    def test_propertiesOfRejectedCopy(self):
        """The dead-lettered copy loses expiration, gains original-expiration, and keeps every other property."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            sent = pika.BasicProperties(
                content_type="application/json",
                content_encoding="utf-8",
                headers={"user": 7},
                delivery_mode=2,
                priority=3,
                correlation_id="corr",
                reply_to="reply",
                expiration="60000",
                message_id="mid",
                timestamp=1700000000,
                type="kind",
                user_id="guest",
                app_id="app",
            )
            channel.basic_publish("", source, b'{"a": 1}', sent)
            method, _, _ = channel.basic_get(source)
            channel.basic_reject(method.delivery_tag, requeue=False)
            method, props, payload = pollGet(channel, dlq)
            self.assertEqual(payload, b'{"a": 1}')
            self.assertIsNone(props.expiration)
            for name in [
                "content_type",
                "content_encoding",
                "delivery_mode",
                "priority",
                "correlation_id",
                "reply_to",
                "message_id",
                "timestamp",
                "type",
                "user_id",
                "app_id",
            ]:
                self.assertEqual(getattr(props, name), getattr(sent, name), name)
            self.assertEqual(props.headers["user"], 7)
            entry = dict(dict(typedHeaders(props))["x-death"][1][0][1])
            self.assertEqual(set(entry), XDEATH_KEYS | {"original-expiration"})
            self.assertEqual(entry["original-expiration"], ("S", "60000"))
            self.assertEqual(entry["reason"], ("S", "rejected"))

        return self.runPika(body)

    def test_expiredByMessageTTL(self):
        """A copy expired by its expiration property records reason expired and original-expiration."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel)
            channel.basic_publish("", source, b"m", pika.BasicProperties(expiration="100", delivery_mode=2))
            method, props, _ = pollGet(channel, dlq)
            self.assertIsNone(props.expiration)
            self.assertEqual(props.delivery_mode, 2)
            entry = dict(dict(typedHeaders(props))["x-death"][1][0][1])
            self.assertEqual(set(entry), XDEATH_KEYS | {"original-expiration"})
            self.assertEqual(entry["original-expiration"], ("S", "100"))
            self.assertEqual(entry["reason"], ("S", "expired"))
            self.assertEqual(entry["count"], ("l", 1))

        return self.runPika(body)

    def test_expiredByQueueTTL(self):
        """A copy expired by x-message-ttl has no original-expiration key."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-message-ttl": 100})
            channel.basic_publish("", source, b"m")
            method, props, _ = pollGet(channel, dlq)
            entry = dict(dict(typedHeaders(props))["x-death"][1][0][1])
            self.assertEqual(set(entry), XDEATH_KEYS)
            self.assertEqual(entry["reason"], ("S", "expired"))

        return self.runPika(body)

    def test_repeatedDeathIncrementsCount(self):
        """A second death in the same queue for the same reason increments count, moves the entry first, and keeps time and x-first-death-*."""

        def body(connection):
            channel = self.channel(connection)
            a = self.name("a")
            b = self.name("b")
            for name, target in [(a, b), (b, a)]:
                channel.queue_declare(
                    name,
                    exclusive=True,
                    arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target},
                )
            channel.basic_publish("", a, b"m")
            for queue in [a, b, a]:
                method = waitUntil(lambda: channel.basic_get(queue)[0])
                channel.basic_reject(method.delivery_tag, requeue=False)
            self.assertTrue(waitUntil(lambda: messageCount(channel, b) == 1))
            method, props, _ = channel.basic_get(b, auto_ack=True)
            headers = dict(typedHeaders(props))
            entries = [dict(e[1]) for e in headers["x-death"][1]]
            self.assertEqual(
                [(e["queue"][1], e["reason"][1], e["count"]) for e in entries],
                [(a, "rejected", ("l", 2)), (b, "rejected", ("l", 1))],
            )
            self.assertLessEqual(entries[0]["time"][1], entries[1]["time"][1])
            self.assertEqual(entries[0]["routing-keys"], ("A", [("S", a)]))
            self.assertEqual(entries[0]["exchange"], ("S", ""))
            self.assertEqual(entries[1]["exchange"], ("S", ""))
            self.assertEqual(entries[1]["routing-keys"], ("A", [("S", b)]))
            self.assertEqual(headers["x-first-death-queue"], ("S", a))
            self.assertEqual(headers["x-first-death-reason"], ("S", "rejected"))

        return self.runPika(body)

    def test_secondHopRecordsDLXAsExchange(self):
        """After a hop through a named DLX, the next x-death entry names that DLX as exchange."""

        def body(connection):
            channel = self.channel(connection)
            dlx = self.exchange(channel, "dlx", "fanout")
            final = self.queue(channel, "final")
            middle = self.queue(
                channel,
                "middle",
                **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": final},
            )
            channel.queue_bind(middle, dlx)
            source = self.queue(channel, "src", **{"x-dead-letter-exchange": dlx, "x-message-ttl": 50})
            channel.basic_publish("", source, b"m")
            method = waitUntil(lambda: channel.basic_get(middle)[0])
            channel.basic_reject(method.delivery_tag, requeue=False)
            method, props, _ = pollGet(channel, final)
            entries = [dict(e[1]) for e in dict(typedHeaders(props))["x-death"][1]]
            self.assertEqual(
                [(e["queue"][1], e["reason"][1], e["exchange"][1], e["routing-keys"][1]) for e in entries],
                [(middle, "rejected", dlx, [("S", source)]), (source, "expired", "", [("S", source)])],
            )
            headers = dict(typedHeaders(props))
            self.assertEqual(headers["x-first-death-queue"], ("S", source))
            self.assertEqual(headers["x-first-death-reason"], ("S", "expired"))

        return self.runPika(body)

    @onlyOtter(FORM313)
    def test_lastDeathHeaders(self):
        """The 3.13/4.x form adds x-last-death-reason/-queue/-exchange as longstr, updated on every death."""

        def body(connection):
            channel = self.channel(connection)
            dlx = self.exchange(channel, "dlx", "fanout")
            final = self.queue(channel, "final")
            middle = self.queue(
                channel,
                "middle",
                **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": final},
            )
            channel.queue_bind(middle, dlx)
            source = self.queue(channel, "src", **{"x-dead-letter-exchange": dlx, "x-message-ttl": 50})
            channel.basic_publish("", source, b"m")
            method, props, _ = pollGet(channel, middle)
            headers = dict(typedHeaders(props))
            self.assertEqual(headers["x-last-death-reason"], ("S", "expired"))
            self.assertEqual(headers["x-last-death-queue"], ("S", source))
            self.assertEqual(headers["x-last-death-exchange"], ("S", ""))
            channel.basic_publish("", source, b"m2")
            method = waitUntil(lambda: channel.basic_get(middle)[0])
            channel.basic_reject(method.delivery_tag, requeue=False)
            method, props, _ = pollGet(channel, final)
            headers = dict(typedHeaders(props))
            self.assertEqual(headers["x-last-death-reason"], ("S", "rejected"))
            self.assertEqual(headers["x-last-death-queue"], ("S", middle))
            self.assertEqual(headers["x-last-death-exchange"], ("S", dlx))
            self.assertEqual(headers["x-first-death-reason"], ("S", "expired"))
            self.assertEqual(headers["x-first-death-queue"], ("S", source))

        return self.runPika(body)


class CycleTests(PikaTTLCase):
    """
    Dead-letter cycle detection (§3.9, §5.9).
    """

    def test_automaticCycleDroppedOtherTargetsKept(self):
        """An expired copy routed back to its own queue is dropped there but still reaches other targets, once."""

        def body(connection):
            channel = self.channel(connection)
            fanout = self.exchange(channel, "cyc", "fanout")
            watcher = self.queue(channel, "watch")
            source = self.queue(channel, "loop", **{"x-message-ttl": 50, "x-dead-letter-exchange": fanout})
            channel.queue_bind(source, fanout)
            channel.queue_bind(watcher, fanout)
            channel.basic_publish("", source, b"m")
            got = pollGet(channel, watcher)
            self.assertEqual(death(got[1])[0]["count"], 1)
            time.sleep(0.4)
            self.assertEqual(messageCount(channel, watcher), 0)
            self.assertEqual(messageCount(channel, source), 0)

        return self.runPika(body)

    def test_selfCycleVanishes(self):
        """A queue dead-lettering expired messages to itself through the default exchange drops them."""

        def body(connection):
            channel = self.channel(connection)
            source = self.queue(channel, "self", **{"x-message-ttl": 50, "x-dead-letter-exchange": ""})
            channel.basic_publish("", source, b"m")
            self.assertTrue(waitUntil(lambda: messageCount(channel, source) == 0))
            # and it does not come back
            for i in range(10):
                self.assertEqual(messageCount(channel, source), 0)
                time.sleep(0.03)

        return self.runPika(body)

    def test_rejectionInLoopContinues(self):
        """A loop containing a rejection keeps circulating and counts each death per queue and reason."""

        def body(connection):
            channel = self.channel(connection)
            b1 = self.name("b1")
            b2 = self.name("b2")
            channel.queue_declare(
                b1,
                exclusive=True,
                arguments={
                    "x-message-ttl": 50,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": b2,
                },
            )
            channel.queue_declare(
                b2,
                exclusive=True,
                arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b1},
            )
            channel.basic_publish("", b1, b"m")
            for round in range(2):
                method = waitUntil(lambda: channel.basic_get(b2)[0])
                self.assertIsNotNone(method)
                channel.basic_reject(method.delivery_tag, requeue=False)
            method, props, _ = pollGet(channel, b2)
            self.assertEqual(
                [(e["queue"], e["reason"], e["count"]) for e in death(props)],
                [(b1, "expired", 3), (b2, "rejected", 2)],
            )
            self.assertEqual(props.headers["x-first-death-queue"], b1)
            self.assertEqual(props.headers["x-first-death-reason"], "expired")

        return self.runPika(body)


# -- §4: length limits ----------------------------------------------------------


class LengthLimitTests(PikaTTLCase):
    """
    ``x-max-length``, ``x-max-length-bytes`` and ``x-overflow`` (§3.11, §4).
    """

    def test_dropHeadDeadLettersOldest(self):
        """With x-max-length 2 the oldest message is dropped and dead-lettered as maxlen; publishes are acked."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-max-length": 2})
            for payload in [b"m1", b"m2", b"m3"]:
                channel.basic_publish("", source, payload)
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"m1")
            entry = death(got[1])[0]
            self.assertEqual((entry["reason"], entry["queue"]), ("maxlen", source))
            self.assertEqual(drain(channel, source), [b"m2", b"m3"])

        return self.runPika(body)

    def test_maxLengthBytesCountsBodies(self):
        """x-max-length-bytes counts body bytes only and drops from the head as maxlen."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-max-length-bytes": 10})
            channel.basic_publish(
                "", source, b"aaaaaa", pika.BasicProperties(headers={"h": "x" * 100})
            )
            self.assertEqual(messageCount(channel, source), 1)
            channel.basic_publish("", source, b"bbbbbb")
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"aaaaaa")
            self.assertEqual(death(got[1])[0]["reason"], "maxlen")
            self.assertEqual(drain(channel, source), [b"bbbbbb"])
            # one message larger than the limit is dead-lettered at once
            channel.basic_publish("", source, b"c" * 11)
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"c" * 11)
            self.assertEqual(messageCount(channel, source), 0)

        return self.runPika(body)

    def test_onlyReadyMessagesCount(self):
        """Unacked messages do not count toward x-max-length."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(
                channel, **{"x-max-length": 1, "x-overflow": "reject-publish"}
            )
            channel.basic_publish("", source, b"m1")
            channel.basic_get(source)
            channel.basic_publish("", source, b"m2")
            self.assertEqual(messageCount(channel, source), 1)

        return self.runPika(body)

    def test_rejectPublishNacks(self):
        """reject-publish nacks the overflowing publish, does not enqueue it and does not dead-letter it."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(
                channel, **{"x-max-length": 1, "x-overflow": "reject-publish"}
            )
            channel.basic_publish("", source, b"m1")
            self.assertRaises(NackError, channel.basic_publish, "", source, b"m2")
            self.assertRaises(
                NackError, channel.basic_publish, "", source, b"m3", mandatory=True
            )
            time.sleep(0.1)
            self.assertEqual(drain(channel, source), [b"m1"])
            self.assertEqual(messageCount(channel, dlq), 0)
            self.assertTrue(channel.is_open)

        return self.runPika(body)

    def test_rejectPublishWithoutConfirmsDropsSilently(self):
        """Without confirms, reject-publish drops the overflowing message and the channel stays open."""

        def body(connection):
            channel = connection.channel()
            queue = self.queue(channel, "rp", **{"x-max-length": 1, "x-overflow": "reject-publish"})
            channel.basic_publish("", queue, b"m1")
            channel.basic_publish("", queue, b"m2")
            self.assertEqual(drain(channel, queue), [b"m1"])

        return self.runPika(body)

    def test_rejectPublishDLX(self):
        """reject-publish-dlx nacks the overflowing publish and dead-letters it as maxlen."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(
                channel, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"}
            )
            channel.basic_publish("", source, b"m1")
            self.assertRaises(NackError, channel.basic_publish, "", source, b"m2")
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"m2")
            entry = death(got[1])[0]
            self.assertEqual((entry["reason"], entry["queue"]), ("maxlen", source))
            self.assertEqual(drain(channel, source), [b"m1"])

        return self.runPika(body)

    def test_multiQueueNackStillEnqueuedElsewhere(self):
        """If one of two target queues rejects the publish, the publisher is nacked and the other queue keeps it."""

        def body(connection):
            channel = self.channel(connection)
            fanout = self.exchange(channel, "fan", "fanout")
            full = self.queue(channel, "full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
            ok = self.queue(channel, "ok")
            channel.queue_bind(full, fanout)
            channel.queue_bind(ok, fanout)
            self.assertRaises(NackError, channel.basic_publish, fanout, "", b"m")
            self.assertEqual(drain(channel, ok), [b"m"])
            self.assertEqual(messageCount(channel, full), 0)

        return self.runPika(body)

    def test_requeueIntoFullQueueDropsRequeued(self):
        """Requeueing into a queue at its drop-head limit dead-letters the requeued message (§3.11)."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-max-length": 2})
            channel.basic_publish("", source, b"a")
            method, _, _ = channel.basic_get(source)
            channel.basic_publish("", source, b"b")
            channel.basic_publish("", source, b"c")
            channel.basic_nack(method.delivery_tag, requeue=True)
            got = pollGet(channel, dlq)
            self.assertEqual(got[2], b"a")
            self.assertEqual(death(got[1])[0]["reason"], "maxlen")
            self.assertEqual(drain(channel, source), [b"b", b"c"])

        return self.runPika(body)

    def test_maxLengthZeroDeliversOrDrops(self):
        """x-max-length 0 hands a message to a waiting consumer and drops it otherwise."""

        def body(connection):
            channel = self.channel(connection)
            source, dlq = self.deadLetterPair(channel, **{"x-max-length": 0})
            channel.basic_publish("", source, b"dropped")
            got = pollGet(channel, dlq)
            self.assertEqual(death(got[1])[0]["reason"], "maxlen")
            received = []
            channel.basic_consume(source, lambda ch, m, p, b: received.append(b), auto_ack=True)
            channel.basic_publish("", source, b"delivered")
            deadline = time.monotonic() + 2
            while not received and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.05)
            self.assertEqual(received, [b"delivered"])
            self.assertEqual(messageCount(channel, dlq), 0)

        return self.runPika(body)

    def test_invalidLengthArguments(self):
        """Invalid x-max-length, x-max-length-bytes and x-overflow values get RabbitMQ's exact 406 texts."""
        cases = [
            ("x-max-length", -1, "{value_negative,-1}"),
            ("x-max-length", "abc", '"expected integer, got longstr"'),
            ("x-max-length-bytes", -1, "{value_negative,-1}"),
            ("x-overflow", "foo", "invalid_overflow"),
            ("x-overflow", 1, "{unacceptable_type,signedint}"),
        ]

        def body(connection):
            for key, value, term in cases:
                name = self.name("bad-len")
                self.assertChannelError(
                    connection,
                    lambda ch: ch.queue_declare(name, arguments={key: value}),
                    406,
                    "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/': %s"
                    % (key, name, term),
                )

        return self.runPika(body)


# -- seeds: the Go DLX example and the hold-queue pattern (§5.8) ---------------


class SeedExampleTests(PikaTTLCase):
    """
    The seeds' own examples, with pika.
    """

    def test_ottermqGoDeadLetterExample(self):
        """The OtterMQ note's Go TTL+DLX example (int32 TTL, auto-delete entities) dead-letters to my-dlq as expired."""

        def body(connection):
            channel = self.channel(connection)
            dlx = self.name("my-dlx")
            dlq = self.name("my-dlq")
            queue = self.name("my-queue")
            self._queues += [queue, dlq]
            self._exchanges.append(dlx)
            channel.exchange_declare(dlx, "direct", durable=False, auto_delete=True)
            channel.queue_declare(dlq, durable=False, auto_delete=True)
            channel.queue_bind(dlq, dlx, "expired")
            args = {
                "x-message-ttl": 200,  # int32 in Go: 'I' on the wire, as pika sends it
                "x-dead-letter-exchange": dlx,
                "x-dead-letter-routing-key": "expired",
            }
            channel.queue_declare(queue, durable=False, auto_delete=True, arguments=args)
            channel.basic_publish("", queue, b"Will expire and go to DLQ")
            received = []

            def onMessage(ch, method, props, payload):
                received.append((props, payload))
                ch.basic_ack(method.delivery_tag)
                ch.stop_consuming()

            channel.basic_consume(dlq, onMessage)
            deadline = time.monotonic() + 3
            while not received and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.05)
            props, payload = received[0]
            self.assertEqual(payload, b"Will expire and go to DLQ")
            entry = death(props)[0]
            # the note's JSON also shows "original-expiration" for a queue TTL:
            # RabbitMQ records it only for a per-message expiration
            self.assertEqual(
                entry,
                {
                    "count": 1,
                    "reason": "expired",
                    "queue": queue,
                    "time": entry["time"],
                    "exchange": "",
                    "routing-keys": [queue],
                },
            )
            self.assertEqual(props.headers["x-first-death-queue"], queue)
            self.assertEqual(props.headers["x-first-death-reason"], "expired")
            self.assertEqual(props.headers["x-first-death-exchange"], "")

        return self.runPika(body)

    def test_holdQueueDelayedDelivery(self):
        """The hold-queue pattern delays messages by the hold TTL, redeclares renew it, and it expires once idle."""

        def body(connection):
            channel = self.channel(connection)
            probe = connection.channel()
            probe.confirm_delivery()
            destination_x = self.exchange(channel, "dest-x")
            work = self.queue(channel, "work")
            channel.queue_bind(work, destination_x, "job")
            hold = self.name("hold.300")
            self._queues.append(hold)
            args = {
                "x-message-ttl": 300,
                "x-dead-letter-exchange": destination_x,
                "x-dead-letter-routing-key": "job",
                "x-expires": 600,
            }
            sent = []
            for i in range(3):
                # "redeclare them on each message posting"
                channel.queue_declare(hold, arguments=args)
                sent.append(time.monotonic())
                channel.basic_publish("", hold, b"job%d" % i)
                time.sleep(0.2)
            arrivals = []
            while len(arrivals) < 3 and time.monotonic() < sent[-1] + 3:
                got = pollGet(channel, work, timeout=1)
                if got:
                    arrivals.append((got, time.monotonic()))
            self.assertEqual([g[2] for g, _ in arrivals], [b"job0", b"job1", b"job2"])
            for (got, at), t in zip(arrivals, sent):
                self.assertGreaterEqual(at - t, 0.28)
                entry = death(got[1])[0]
                self.assertEqual((entry["reason"], entry["queue"]), ("expired", hold))
                self.assertEqual(got[0].routing_key, "job")
            self.assertTrue(queueExists(probe, hold))
            self.assertTrue(waitUntil(lambda: not queueExists(probe, hold), timeout=3))

        return self.runPika(body)
