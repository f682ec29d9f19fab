"""
Interop tests for client strings that reach the store (issue 8: "input can
never break shared state"), on real sockets, against otter_tx and RabbitMQ.

Observed on the RabbitMQ 3.10 peer with hand-built frames: a short string
that is not UTF-8 in queue.declare (durable or not), exchange.declare,
queue.bind/purge/delete, exchange.delete, basic.consume or basic.get closes
the connection with 501 ``FRAME_ERROR - Malformed UTF-8 in shortstr`` and
class/method 0/0; basic.publish does not check its routing key, so a
persistent message with such a routing key is confirmed, stored and
delivered with the same bytes.  Neither affects any other connection.
"""

import struct

import pika
from twisted.internet.defer import inlineCallbacks

from otter_tx.test.interop.support import InteropTestCase
from otter_tx.test.interop.test_interop_raw import (
    BASIC_GET,
    BASIC_GET_OK,
    CONNECTION_CLOSE,
    FRAME_BODY,
    FRAME_HEADER,
    QUEUE_DECLARE,
    RawTestMixin,
    basicPublish,
    closeArgs,
    frame,
    method,
    shortstr,
    table,
)

#: a short string that is not UTF-8
BAD = b"q\xff\x80"

EXCHANGE_DECLARE = (40, 10)
QUEUE_BIND = (50, 20)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)
BASIC_ACK = (60, 80)


class NonUtf8NameTests(RawTestMixin, InteropTestCase):
    """A name that is not UTF-8 fails only its own connection, with RabbitMQ's 501; the store keeps working."""

    def setUp(self):
        # the in-process broker writes to a real SQLite store
        self.brokerOptions = {"dataDir": self.mktemp()}
        return InteropTestCase.setUp(self)

    def _assertMalformed(self, payload):
        def run():
            conn = self.ready()
            conn.send(payload)
            f = conn.readFrame()
            self.assertEqual(f.classMethod, CONNECTION_CLOSE)
            self.assertEqual(f.channel, 0)
            self.assertEqual(closeArgs(f), (501, "FRAME_ERROR - Malformed UTF-8 in shortstr", 0, 0))

        return self.inThread(run)

    def _assertOthersUnaffected(self):
        """Another connection declares a durable queue and gets a persistent publish confirmed."""
        name = self.name("store-canary")

        def run():
            c = self.pikaConnection()
            try:
                ch = c.channel()
                ch.confirm_delivery()
                ch.queue_declare(name, durable=True)
                ch.basic_publish("", name, b"canary", pika.BasicProperties(delivery_mode=2))
                method_, _, body = ch.basic_get(name, auto_ack=True)
                self.assertEqual(body, b"canary")
                ch.queue_delete(name)
            finally:
                c.close()

        return self.inThread(run)

    @inlineCallbacks
    def test_durableQueueDeclare(self):
        """queue.declare of a durable queue named with bytes that are not UTF-8: 501 for that connection only."""
        yield self._assertMalformed(method(
            1, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr(BAD) + b"\x02" + table({})))
        yield self._assertOthersUnaffected()

    @inlineCallbacks
    def test_durableExchangeDeclare(self):
        """exchange.declare of a durable exchange named with bytes that are not UTF-8: 501 for that connection only."""
        yield self._assertMalformed(method(
            1, EXCHANGE_DECLARE,
            struct.pack(">H", 0) + shortstr(BAD) + shortstr("fanout") + b"\x02" + table({})))
        yield self._assertOthersUnaffected()

    @inlineCallbacks
    def test_bindingKey(self):
        """queue.bind with a binding key that is not UTF-8: 501 for that connection only."""
        yield self._assertMalformed(method(
            1, QUEUE_BIND,
            struct.pack(">H", 0) + shortstr("nope") + shortstr("amq.direct") + shortstr(BAD)
            + b"\x00" + table({})))
        yield self._assertOthersUnaffected()

    @inlineCallbacks
    def test_persistentRoutingKey(self):
        """A persistent publish with a routing key that is not UTF-8 is confirmed and delivered with the same bytes."""
        queue = self.name("store-rk")

        def declare():
            c = self.pikaConnection()
            try:
                ch = c.channel()
                ch.queue_declare(queue, durable=True)
                ch.queue_bind(queue, "amq.fanout")
            finally:
                c.close()

        yield self.inThread(declare)

        def run():
            conn = self.ready()
            conn.send(method(1, CONFIRM_SELECT, b"\x00"))
            conn.readMethod(CONFIRM_SELECT_OK, 1)
            props = struct.pack(">H", 0x1000) + b"\x02"  # delivery-mode 2
            conn.send(basicPublish(1, "amq.fanout", BAD)
                      + frame(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 4) + props)
                      + frame(FRAME_BODY, 1, b"body"))
            ack = conn.readMethod(BASIC_ACK, 1)
            self.assertEqual(struct.unpack(">Q", ack.payload[4:12])[0], 1)
            conn.send(method(1, BASIC_GET, struct.pack(">H", 0) + shortstr(queue) + b"\x01"))
            got = conn.readMethod(BASIC_GET_OK, 1)
            # delivery-tag Q, redelivered bit, exchange, routing key
            off = 4 + 8 + 1
            n = got.payload[off]
            off += 1 + n
            n = got.payload[off]
            return got.payload[off + 1:off + 1 + n]

        try:
            routingKey = yield self.inThread(run)
            self.assertEqual(routingKey, BAD)
        finally:
            def delete():
                c = self.pikaConnection()
                try:
                    c.channel().queue_delete(queue)
                finally:
                    c.close()

            yield self.inThread(delete)
        yield self._assertOthersUnaffected()

