"""
Interop tests for issue 2's Protocol section with kombu on its py-amqp
transport, plus raw ``amqp`` (py-amqp) tests for what pika cannot send:
AMQPLAIN logins, channel.flow(active=false), basic.recover and
basic.recover-async with requeue=false, an empty consumer tag, a cancel of an
unknown consumer tag, and field tables using every RabbitMQ errata type tag.

Reply codes and texts are RabbitMQ 3.10's (``rabbitmq-semantics.md``
§6.5-§6.11, §6.19, or observed on the 3.10.8 peer).  Blocking client code runs
in a worker thread; named entities are deleted by cleanups so the module can
run against the shared RabbitMQ peer::

    OTTER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5682/ \\
        .venv/bin/trial otter_tx.test.interop.test_interop_kombu
"""

import re
import socket
import struct
import time
from urllib.parse import unquote, urlparse

import amqp
import amqp.exceptions
import amqp.serialization
from kombu import Connection, Consumer, Exchange, Producer, Queue

from otter_tx.test.interop.support import InteropTestCase


class Tagged(object):
    """
    A field-table value written as type tag ``tag`` followed by the
    already-packed bytes ``raw`` (for the types py-amqp never encodes:
    b, B, s, u, i, l, f, x).
    """

    def __init__(self, tag, raw):
        self.tag = tag
        self.raw = raw


#: RabbitMQ's errata reading of the tags py-amqp before 5.4 reads otherwise
#: (5.3.1 is the newest for Python 3.9, hence PyPy): it takes ``s`` for a
#: short string, swaps ``b`` and ``B``, and reads ``l`` unsigned
_ERRATA_READS = {"s": ">h", "b": ">b", "B": ">B", "l": ">q"}


def _errataReader(original):
    """
    py-amqp's ``_read_item`` as it is when it reads RabbitMQ's errata tags
    (py-amqp 5.4+); for an older py-amqp, one that reads the tags of
    :data:`_ERRATA_READS` as RabbitMQ writes them and leaves the rest to
    ``original``, so the test checks the broker, not the client's decoder.
    """
    if original(b"b\xff", 0)[0] == -1:
        return original

    def readItem(buf, offset):
        fmt = _ERRATA_READS.get(chr(buf[offset]))
        if fmt is None:
            return original(buf, offset)
        val, = struct.unpack_from(fmt, buf, offset + 1)
        return val, offset + 1 + struct.calcsize(fmt)

    return readItem


def drainUntil(connection, predicate, timeout=5.0):
    """
    Drain events from the kombu or py-amqp ``connection`` until
    ``predicate()`` is true or ``timeout`` seconds pass; return the last
    value of ``predicate()``.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            connection.drain_events(timeout=min(remaining, 0.1))
        except socket.timeout:
            pass
    return predicate()


class KombuTestCase(InteropTestCase):
    """
    Helpers: kombu and py-amqp connections to this test's broker, names
    deleted after the test, and exact reply assertions.
    """

    def credentials(self):
        """
        ``(user, password, vhost)`` from ``self.url``.
        """
        u = urlparse(self.url)
        vhost = unquote(u.path[1:]) if len(u.path) > 1 else "/"
        return unquote(u.username or "guest"), unquote(u.password or "guest"), vhost

    def kombuConnection(self, **kw):
        """
        A kombu ``Connection`` for ``self.url`` (py-amqp transport).
        """
        kw.setdefault("connect_timeout", 10)
        return Connection(self.url, **kw)

    def amqpConnection(self, **kw):
        """
        A connected py-amqp ``Connection`` (call from a worker thread).
        """
        user, password, vhost = self.credentials()
        kw.setdefault("userid", user)
        kw.setdefault("password", password)
        kw.setdefault("virtual_host", vhost)
        kw.setdefault("connect_timeout", 10)
        kw.setdefault("read_timeout", 10)
        kw.setdefault("write_timeout", 10)
        connection = amqp.Connection("%s:%d" % (self.host, self.port), **kw)
        connection.connect()
        return connection

    def withAmqp(self, body, **kw):
        """
        Run ``body(connection)`` with a py-amqp connection in a worker
        thread, closing the connection afterwards.
        """

        def run():
            connection = self.amqpConnection(**kw)
            try:
                return body(connection)
            finally:
                try:
                    connection.close()
                except Exception:
                    pass

        return self.inThread(run)

    def withKombu(self, body, **kw):
        """
        Run ``body(connection)`` with a connected kombu connection in a
        worker thread, releasing it afterwards.
        """

        def run():
            connection = self.kombuConnection(**kw)
            try:
                connection.connect()
                return body(connection)
            finally:
                connection.release()

        return self.inThread(run)

    def deleteAfter(self, queues=(), exchanges=()):
        """
        Delete ``queues`` and ``exchanges`` (if they exist) after the test.
        """

        def cleanup():
            connection = self.amqpConnection()
            try:
                for name in queues:
                    connection.channel().queue_delete(name)
                for name in exchanges:
                    connection.channel().exchange_delete(name)
            finally:
                connection.close()

        self.addCleanup(self.inThread, cleanup)

    def assertReply(self, exceptionType, code, text, f, *a, **kw):
        """
        Assert that ``f(*a, **kw)`` raises ``exceptionType`` carrying
        exactly reply ``code`` and ``text``.
        """
        e = self.assertRaises(exceptionType, f, *a, **kw)
        self.assertEqual((e.reply_code, e.reply_text), (code, text))
        return e


class KombuTests(KombuTestCase):
    """
    The kombu user experience: Connection, SimpleQueue, Exchange/Queue
    declarations, Producer/Consumer, acks, rejects, properties, priority.
    """

    def test_connect(self):
        """
        kombu connects over its py-amqp transport and sees the broker's
        capabilities.
        """

        def body(connection):
            self.assertTrue(connection.connected)
            self.assertEqual(connection.transport.driver_name, "py-amqp")
            caps = connection.connection.server_properties["capabilities"]
            self.assertIs(caps["publisher_confirms"], True)
            self.assertIs(caps["consumer_cancel_notify"], True)
            connection.default_channel.basic_qos(0, 10, False)

        return self.withKombu(body)

    def test_simpleQueue(self):
        """
        SimpleQueue put/get/ack round-trips a JSON payload and leaves the
        queue empty.
        """
        name = self.name("simple")
        self.deleteAfter(queues=[name], exchanges=[name])

        def body(connection):
            queue = connection.SimpleQueue(name)
            try:
                queue.put({"hello": "world", "n": [1, 2]})
                queue.put({"second": True})
                message = queue.get(block=True, timeout=5)
                self.assertEqual(message.payload, {"hello": "world", "n": [1, 2]})
                self.assertEqual(message.content_type, "application/json")
                message.ack()
                queue.get(block=True, timeout=5).ack()
                self.assertRaises(queue.Empty, queue.get, block=False)
                self.assertEqual(queue.qsize(), 0)
            finally:
                queue.close()

        return self.withKombu(body)

    def test_producerConsumerDirect(self):
        """
        A Producer publishes to a direct exchange and a Consumer on the bound
        queue receives it with its delivery info.
        """
        exchange = Exchange(self.name("kd"), "direct", auto_delete=True)
        queue = Queue(self.name("kq"), exchange, routing_key="jobs", exclusive=True)
        self.deleteAfter(exchanges=[exchange.name])

        def body(connection):
            channel = connection.channel()
            got = []
            with Consumer(channel, [queue], callbacks=[lambda b, m: got.append((b, m))]):
                producer = Producer(channel, exchange)
                producer.publish({"job": 1}, routing_key="jobs")
                producer.publish({"job": 2}, routing_key="other")
                drainUntil(connection, lambda: got)
                [(payload, message)] = got
                self.assertEqual(payload, {"job": 1})
                self.assertEqual(
                    (message.delivery_info["exchange"], message.delivery_info["routing_key"],
                     message.delivery_info["redelivered"]),
                    (exchange.name, "jobs", False),
                )
                message.ack()

        return self.withKombu(body)

    def routeThrough(self, exchange, queues, publishes):
        """
        Declare ``queues`` (bound to ``exchange``), publish each
        ``(routing_key, headers, label)`` and return {queue name: [labels]}.
        """
        self.deleteAfter(queues=[q.name for q in queues], exchanges=[exchange.name])

        def body(connection):
            channel = connection.channel()
            for queue in queues:
                queue(channel).declare()
            producer = Producer(channel, exchange)
            for key, headers, label in publishes:
                producer.publish(label, routing_key=key, headers=headers, serializer="json")
            result = {}
            for queue in queues:
                bound = queue(channel)
                labels = []
                deadline = time.monotonic() + 2
                while True:
                    message = bound.get(no_ack=True)
                    if message is None:
                        if labels or time.monotonic() > deadline:
                            break
                        time.sleep(0.02)
                        continue
                    labels.append(message.payload)
                result[queue.name] = labels
            return result

        return self.withKombu(body)

    def test_topicExchange(self):
        """
        kombu topic bindings route by pattern.
        """
        exchange = Exchange(self.name("kt"), "topic")
        stock = Queue(self.name("stock"), exchange, routing_key="stock.*")
        everything = Queue(self.name("all"), exchange, routing_key="#")
        d = self.routeThrough(
            exchange,
            [stock, everything],
            [("stock.usd", None, "a"), ("stock.eur.x", None, "b"), ("news", None, "c")],
        )
        return d.addCallback(
            self.assertEqual, {stock.name: ["a"], everything.name: ["a", "b", "c"]}
        )

    def test_fanoutExchange(self):
        """
        A kombu fanout exchange copies each message to every bound queue.
        """
        exchange = Exchange(self.name("kf"), "fanout")
        first = Queue(self.name("f1"), exchange)
        second = Queue(self.name("f2"), exchange)
        d = self.routeThrough(exchange, [first, second], [("ignored", None, "m")])
        return d.addCallback(self.assertEqual, {first.name: ["m"], second.name: ["m"]})

    def test_headersExchange(self):
        """
        kombu headers bindings (binding_arguments) route with x-match all and
        any.
        """
        exchange = Exchange(self.name("kh"), "headers")
        every = Queue(
            self.name("hall"), exchange,
            binding_arguments={"x-match": "all", "format": "pdf", "type": "report"},
        )
        some = Queue(
            self.name("hany"), exchange,
            binding_arguments={"x-match": "any", "format": "pdf", "type": "report"},
        )
        d = self.routeThrough(
            exchange,
            [every, some],
            [
                ("", {"format": "pdf", "type": "report"}, "both"),
                ("", {"format": "pdf", "type": "log"}, "pdf"),
                ("", {"format": "zip"}, "none"),
            ],
        )
        return d.addCallback(self.assertEqual, {every.name: ["both"], some.name: ["both", "pdf"]})

    def test_requeueAndReject(self):
        """
        message.requeue() brings the message back redelivered;
        message.reject() then discards it.
        """
        name = self.name("kr")
        self.deleteAfter(queues=[name], exchanges=[name])

        def body(connection):
            queue = connection.SimpleQueue(name)
            try:
                queue.put("payload")
                first = queue.get(block=True, timeout=5)
                self.assertFalse(first.delivery_info["redelivered"])
                first.requeue()
                second = queue.get(block=True, timeout=5)
                self.assertEqual(second.payload, "payload")
                self.assertTrue(second.delivery_info["redelivered"])
                second.reject()
                self.assertRaises(queue.Empty, queue.get, block=True, timeout=0.3)
                self.assertEqual(queue.qsize(), 0)
            finally:
                queue.close()

        return self.withKombu(body)

    def test_unackedReturnOnClose(self):
        """
        A message a kombu consumer never acked is back in the queue after its
        connection closes.
        """
        name = self.name("ku")
        self.deleteAfter(queues=[name], exchanges=[name])

        def body():
            first = self.kombuConnection()
            try:
                queue = first.SimpleQueue(name)
                queue.put("keep-me")
                self.assertEqual(queue.get(block=True, timeout=5).payload, "keep-me")
            finally:
                first.release()
            second = self.kombuConnection()
            try:
                queue = second.SimpleQueue(name)
                message = queue.get(block=True, timeout=5)
                self.assertEqual(message.payload, "keep-me")
                self.assertTrue(message.delivery_info["redelivered"])
                message.ack()
                queue.close()
            finally:
                second.release()

        return self.inThread(body)

    def test_propertiesAndHeaders(self):
        """
        Message properties and application headers set by a kombu Producer
        reach the consumer unchanged.
        """
        queue = Queue(self.name("kp"), exclusive=True)

        def body(connection):
            channel = connection.channel()
            queue(channel).declare()
            Producer(channel).publish(
                b"\x00raw\xff",
                routing_key=queue.name,
                content_type="application/x-custom",
                content_encoding="binary",
                headers={"trace": "t-1", "attempt": 3, "flags": [True, None], "meta": {"k": "v"}},
                priority=4,
                delivery_mode=2,
                correlation_id="corr-9",
                reply_to="replies",
                message_id="id-9",
                expiration=60,
                type="evt",
                app_id="kombu-test",
                timestamp=1700000000,
            )
            message = None
            deadline = time.monotonic() + 5
            while message is None and time.monotonic() < deadline:
                message = queue(channel).get(no_ack=True)
            self.assertEqual(message.body, b"\x00raw\xff")
            self.assertEqual(
                message.headers,
                {"trace": "t-1", "attempt": 3, "flags": [True, None], "meta": {"k": "v"}},
            )
            props = message.properties
            self.assertEqual(
                dict((k, props.get(k)) for k in [
                    "content_type", "content_encoding", "priority", "delivery_mode",
                    "correlation_id", "reply_to", "message_id", "expiration", "type", "app_id",
                ]),
                {
                    "content_type": "application/x-custom",
                    "content_encoding": "binary",
                    "priority": 4,
                    "delivery_mode": 2,
                    "correlation_id": "corr-9",
                    "reply_to": "replies",
                    "message_id": "id-9",
                    "expiration": "60000",
                    "type": "evt",
                    "app_id": "kombu-test",
                },
            )
            self.assertEqual(props["timestamp"], 1700000000)

        return self.withKombu(body)

    def test_priorityQueue(self):
        """
        A kombu Queue with max_priority delivers higher priorities first.
        """
        queue = Queue(self.name("kprio"), max_priority=10, exclusive=True)

        def body(connection):
            channel = connection.channel()
            queue(channel).declare()
            producer = Producer(channel)
            for label, priority in [("low", 1), ("high", 9), ("mid", 5), ("none", 0)]:
                producer.publish(label, routing_key=queue.name, priority=priority)
            got = []
            deadline = time.monotonic() + 5
            while len(got) < 4 and time.monotonic() < deadline:
                message = queue(channel).get(no_ack=True)
                if message is None:
                    time.sleep(0.02)
                else:
                    got.append(message.payload)
            self.assertEqual(got, ["high", "mid", "low", "none"])

        return self.withKombu(body)

    def test_consumerPrefetch(self):
        """
        A kombu Consumer with prefetch_count 1 holds one unacked message at a
        time.
        """
        queue = Queue(self.name("kpf"), exclusive=True)

        def body(connection):
            channel = connection.channel()
            queue(channel).declare()
            producer = Producer(channel)
            for i in range(3):
                producer.publish(i, routing_key=queue.name)
            got = []
            with Consumer(
                connection.channel(), [queue], callbacks=[lambda b, m: got.append(m)],
                prefetch_count=1,
            ):
                drainUntil(connection, lambda: got)
                drainUntil(connection, lambda: len(got) > 1, timeout=0.3)
                self.assertEqual([m.payload for m in got], [0])
                got[0].ack()
                drainUntil(connection, lambda: len(got) > 1)
                self.assertEqual([m.payload for m in got], [0, 1])
                got[1].ack()

        return self.withKombu(body)

    def test_confirmPublish(self):
        """
        With transport_options confirm_publish kombu waits for the broker's
        basic.ack on each publish.
        """
        queue = Queue(self.name("kc"), exclusive=True)

        def body(connection):
            channel = connection.default_channel
            queue(channel).declare()
            producer = Producer(channel)
            for i in range(5):
                producer.publish({"i": i}, routing_key=queue.name)
            producer.publish("dropped", exchange="amq.direct", routing_key=self.name("unbound"))
            ok = channel.queue_declare(queue.name, passive=True)
            self.assertEqual(ok.message_count, 5)

        return self.withKombu(body, transport_options={"confirm_publish": True})

    def test_channelErrors(self):
        """
        Channel errors reach kombu users as py-amqp exceptions with
        RabbitMQ's reply code and text.
        """
        name = self.name("kx")
        self.deleteAfter(exchanges=[name])

        def body(connection):
            self.assertReply(
                amqp.exceptions.NotFound,
                404,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (name,),
                Queue(name)(connection.channel()).queue_declare,
                passive=True,
            )
            Exchange(name, "direct")(connection.channel()).declare()
            self.assertReply(
                amqp.exceptions.PreconditionFailed,
                406,
                "PRECONDITION_FAILED - inequivalent arg 'type' for exchange '%s' in "
                "vhost '/': received 'topic' but current is 'direct'" % (name,),
                Exchange(name, "topic")(connection.channel()).declare,
            )
            self.assertTrue(connection.connected)

        return self.withKombu(body)


class PyAmqpTests(KombuTestCase):
    """
    Raw py-amqp tests for frames pika does not send.
    """

    def test_amqplainLogin(self):
        """
        An AMQPLAIN login opens a working connection.
        """

        def body(connection):
            [mechanism] = connection.authentication
            self.assertEqual(mechanism.mechanism, b"AMQPLAIN")
            channel = connection.channel()
            queue, messages, consumers = channel.queue_declare("", exclusive=True)
            self.assertTrue(queue.startswith("amq.gen-"))

        return self.withAmqp(body, login_method="AMQPLAIN")

    def test_amqplainWrongPassword(self):
        """
        A wrong AMQPLAIN password gets 403 ACCESS_REFUSED naming AMQPLAIN.
        """

        def body():
            self.assertReply(
                amqp.exceptions.AccessRefused,
                403,
                "ACCESS_REFUSED - Login was refused using authentication mechanism "
                "AMQPLAIN. For details see the broker logfile.",
                self.amqpConnection,
                login_method="AMQPLAIN",
                password="not-the-password",
            )

        return self.inThread(body)

    def test_startAdvertisesMechanisms(self):
        """
        connection.start offers PLAIN and AMQPLAIN and locale en_US.
        """

        def body(connection):
            self.assertIn(b"PLAIN", connection.mechanisms)
            self.assertIn(b"AMQPLAIN", connection.mechanisms)
            self.assertIn("en_US", connection.locales)

        return self.withAmqp(body)

    def test_flowInactiveNotImplemented(self):
        """
        channel.flow active=false closes the connection with 540.
        """

        def body(connection):
            channel = connection.channel()

            def flow():
                channel.flow(False)
                connection.drain_events(timeout=5)

            self.assertReply(
                amqp.exceptions.AMQPNotImplementedError, 540, "NOT_IMPLEMENTED - active=false", flow
            )

        return self.withAmqp(body)

    def test_recoverNoRequeueNotImplemented(self):
        """
        basic.recover requeue=false closes the connection with 540.
        """

        def body(connection):
            channel = connection.channel()

            def recover():
                channel.basic_recover(requeue=False)
                connection.drain_events(timeout=5)

            self.assertReply(
                amqp.exceptions.AMQPNotImplementedError,
                540,
                "NOT_IMPLEMENTED - requeue=false",
                recover,
            )

        return self.withAmqp(body)

    def test_recoverAsyncNoRequeueNotImplemented(self):
        """
        basic.recover-async requeue=false closes the connection with 540.
        """

        def body(connection):
            channel = connection.channel()

            def recover():
                channel.basic_recover_async(requeue=False)
                connection.drain_events(timeout=5)

            self.assertReply(
                amqp.exceptions.AMQPNotImplementedError,
                540,
                "NOT_IMPLEMENTED - requeue=false",
                recover,
            )

        return self.withAmqp(body)

    def test_recoverAsyncRequeue(self):
        """
        basic.recover-async requeue=true redelivers unacked messages with
        redelivered set.
        """

        def body(connection):
            channel = connection.channel()
            queue, _, _ = channel.queue_declare("", exclusive=True)
            channel.confirm_select()
            for i in range(2):
                channel.basic_publish(amqp.Message(b"%d" % i), routing_key=queue)
            got = []
            channel.basic_consume(
                queue,
                callback=lambda m: got.append((m.body, m.delivery_info["redelivered"])),
            )
            drainUntil(connection, lambda: len(got) == 2)
            channel.basic_recover_async(requeue=True)
            drainUntil(connection, lambda: len(got) == 4)
            self.assertEqual(got[:2], [(b"0", False), (b"1", False)])
            self.assertEqual(sorted(got[2:]), [(b"0", True), (b"1", True)])

        return self.withAmqp(body)

    def test_emptyConsumerTag(self):
        """
        basic.consume with an empty tag gets a server tag amq.ctag- plus 22
        base64url characters, used on deliveries.
        """

        def body(connection):
            channel = connection.channel()
            queue, _, _ = channel.queue_declare("", exclusive=True)
            got = []
            tag = channel.basic_consume(queue, consumer_tag="", callback=got.append)
            self.assertTrue(re.match(r"^amq\.ctag-[A-Za-z0-9_-]{22}$", tag), tag)
            other = channel.basic_consume(queue, consumer_tag="", callback=got.append)
            self.assertNotEqual(tag, other)
            channel.basic_cancel(other)
            channel.basic_publish(amqp.Message(b"x"), routing_key=queue)
            drainUntil(connection, lambda: got)
            self.assertEqual(got[0].delivery_info["consumer_tag"], tag)

        return self.withAmqp(body)

    def test_cancelUnknownTag(self):
        """
        basic.cancel of an unknown consumer tag is answered cancel-ok and the
        channel stays open.
        """

        def body(connection):
            channel = connection.channel()
            self.assertEqual(channel.basic_cancel("no-such-consumer"), "no-such-consumer")
            self.assertTrue(channel.is_open)
            channel.queue_declare("", exclusive=True)

        return self.withAmqp(body)

    def test_errataFieldTypes(self):
        """
        Headers using every RabbitMQ errata type tag (b B s u I i l L f d D S
        x T t V A F) survive a queue, a headers exchange and BCC stripping.
        """
        original = amqp.serialization._write_item

        def writeItem(value, write, bits):
            if isinstance(value, Tagged):
                write(value.tag)
                write(value.raw)
            else:
                original(value, write, bits)

        self.patch(amqp.serialization, "_write_item", writeItem)
        self.patch(amqp.serialization, "_read_item", _errataReader(amqp.serialization._read_item))
        headers = {
            "b": Tagged(b"b", struct.pack(">b", -5)),
            "B": Tagged(b"B", struct.pack(">B", 250)),
            "s": Tagged(b"s", struct.pack(">h", -300)),
            "u": Tagged(b"u", struct.pack(">H", 65000)),
            "I": -70000,
            "i": Tagged(b"i", struct.pack(">I", 4000000000)),
            "l": Tagged(b"l", struct.pack(">q", -(1 << 50))),
            "L": 1 << 50,
            "f": Tagged(b"f", struct.pack(">f", 1.5)),
            "d": -2.25,
            "x": Tagged(b"x", struct.pack(">I", 3) + b"\x00\xff\x01"),
            "t": True,
            "V": None,
            "A": [Tagged(b"s", struct.pack(">h", 7)), Tagged(b"x", struct.pack(">I", 1) + b"z")],
            "F": {"in": Tagged(b"b", struct.pack(">b", -1))},
            "key": "match",
        }
        expected = {
            "b": -5, "B": 250, "s": -300, "u": 65000, "I": -70000, "i": 4000000000,
            "l": -(1 << 50), "L": 1 << 50, "f": 1.5, "d": -2.25, "x": b"\x00\xff\x01",
            "t": True, "V": None, "A": [7, b"z"], "F": {"in": -1}, "key": "match",
        }
        headersExchange = self.name("errata-h")
        directExchange = self.name("errata-d")
        self.deleteAfter(exchanges=[headersExchange, directExchange])

        def body(connection):
            channel = connection.channel()
            plain, _, _ = channel.queue_declare("", exclusive=True)
            matched, _, _ = channel.queue_declare("", exclusive=True)
            visible, _, _ = channel.queue_declare("", exclusive=True)
            blind, _, _ = channel.queue_declare("", exclusive=True)
            channel.exchange_declare(headersExchange, "headers", auto_delete=True)
            channel.exchange_declare(directExchange, "direct", auto_delete=True)
            channel.queue_bind(matched, headersExchange, "", arguments={"key": "match"})
            channel.queue_bind(visible, directExchange, "k")
            channel.queue_bind(blind, directExchange, "k2")
            channel.confirm_select()
            channel.basic_publish(
                amqp.Message(b"1", application_headers=headers), routing_key=plain
            )
            channel.basic_publish(
                amqp.Message(b"2", application_headers=headers), exchange=headersExchange
            )
            withBcc = dict(headers, BCC=["k2"])
            channel.basic_publish(
                amqp.Message(b"3", application_headers=withBcc),
                exchange=directExchange,
                routing_key="k",
            )
            for queue in [plain, matched, visible, blind]:
                message = channel.basic_get(queue, no_ack=True)
                self.assertIsNot(message, None, queue)
                self.assertEqual(message.headers, expected)

        return self.withAmqp(body)
