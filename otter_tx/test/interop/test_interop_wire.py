"""
Interop tests for issue 8's input-side promises, on real sockets against
otter_tx and the RabbitMQ 3.10 peer: malformed frames get protocol errors
(501/505, 406 for a message over ``max_message_size``), never 541, and a
publisher's malformed ``x-death`` header hurts no other client (pika).

Raw frames come from test_interop_raw's independent codec.  Deliberate
differences (``onlyOtter``, listed in docs/compatibility.md):

* field tables nested deeper than 100 levels are refused with 501 (RabbitMQ
  has no limit);
* an oversized message is refused at its content header, so a header
  claiming 2^63-1 octets gets 406 at once (RabbitMQ waits for the body);
* a body longer than its header announced is 501 (RabbitMQ 3.10 waits
  forever);
* undecodable content-header properties are 501 (RabbitMQ 3.10: 541);
* a dead-lettered message whose ``x-death`` is malformed is kept, with a
  repaired ``x-death`` (RabbitMQ's queue loses it), and clean messages
  expiring in the same batch are dead-lettered (RabbitMQ 3.10's queue
  crashes and loses them: observed, clean-2 never arrives).
"""

import struct
import time

import pika
from pika.exceptions import NackError

from otter_tx.test.interop.support import EXTERNAL, InteropTestCase, onlyOtter
from otter_tx.test.interop.test_interop_raw import (
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    FRAME_BODY,
    FRAME_HEADER,
    QUEUE_DECLARE,
    QUEUE_DECLARE_OK,
    ConnectionClosed,
    RawTestMixin,
    basicPublish,
    channelOpen,
    closeArgs,
    contentHeader,
    frame,
    method,
    shortstr,
)

#: RabbitMQ 3.10's default max_message_size (128 MiB)
DEFAULT_MAX = 134217728


def nested(depth):
    """A field table (with length prefix) nesting ``depth`` tables inside the outer one."""
    inner = struct.pack(">I", 0)
    for _ in range(depth):
        body = shortstr("a") + b"F" + inner
        inner = struct.pack(">I", len(body)) + body
    return inner


def declareWithTable(channel, tableBytes):
    """queue.declare of a server-named exclusive auto-delete queue with raw argument bytes."""
    return method(channel, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("") + b"\x0c" + tableBytes)


class MalformedFrameTests(RawTestMixin, InteropTestCase):
    """Malformed frames close the connection with RabbitMQ's code and text."""

    def closed(self, conn, code, text, classId, methodId):
        """Assert the connection.close, then check that a fresh connection still works."""
        self.assertConnectionClose(conn, code, text, classId, methodId)
        self.assertFreshConnectionWorks()

    def test_twoByteMethodFrame(self):
        """A 2-octet method frame is 501 unknown_frame (it was 541 and a traceback)."""
        def scenario():
            conn = self.ready()
            conn.send(frame(1, 1, b"\x00\x3c"))
            self.closed(conn, 501, "FRAME_ERROR - type 1, all octets = <<0,60>>: unknown_frame", 0, 0)

        return self.inThread(scenario)

    def test_heartbeatWithPayload(self):
        """A heartbeat frame carrying a payload is 501 unknown_frame, on channel 0 as elsewhere."""
        def scenario():
            conn = self.ready()
            conn.send(frame(8, 0, b"ab"))
            self.closed(conn, 501, 'FRAME_ERROR - type 8, all octets = <<"ab">>: unknown_frame', 0, 0)

        return self.inThread(scenario)

    def test_badFrameEndLongPayload(self):
        """A bad frame end after a 47-octet payload shows the first 16 octets, wrapped as Erlang does."""
        def scenario():
            conn = self.ready()
            conn.send(method(2, QUEUE_DECLARE, b"\x00\x00" + shortstr("x" * 40) + b"\x00"
                             + struct.pack(">I", 0))[:-1] + b"\x00")
            self.closed(conn, 501, "FRAME_ERROR - type 1, first 16 octets = <<0,50,0,10,0,0,40,120,120,120,"
                        "120,120,120,120,120,\n                            120>>: {invalid_frame_end_marker,0}",
                        0, 0)

        return self.inThread(scenario)

    def test_shortBasicAck(self):
        """basic.ack with 4 argument octets is 501 cannot decode naming basic.ack."""
        def scenario():
            conn = self.ready()
            conn.send(method(1, (60, 80), b"\x00\x00\x00\x01"))
            self.closed(conn, 501, "FRAME_ERROR - cannot decode <<0,0,0,1>>", 60, 80)

        return self.inThread(scenario)

    def test_octetsAfterArguments(self):
        """Octets after queue.declare's last argument are 501 cannot decode."""
        def scenario():
            conn = self.ready()
            conn.send(method(1, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("") + b"\x0c"
                             + struct.pack(">I", 0) + b"junk"))
            self.closed(conn, 501, "FRAME_ERROR - cannot decode <<0,0,0,12,0,0,0,0,106,117,110,107>>",
                        50, 10)

        return self.inThread(scenario)

    def test_truncatedTable(self):
        """A table length running past the frame is 501 cannot decode, the text cut at 255 octets."""
        def scenario():
            conn = self.ready()
            conn.send(method(1, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("q" * 200) + b"\x0c"
                             + struct.pack(">I", 1000) + b"abc"))
            expected = "FRAME_ERROR - cannot decode <<0,0,200," + ",".join(["113"] * 200)
            expected = expected[:252] + "..."
            self.closed(conn, 501, expected, 50, 10)

        return self.inThread(scenario)

    def test_badFieldTypeTag(self):
        """An unknown field type tag ends the connection (RabbitMQ drops it, otter_tx answers 501), never 541."""
        def scenario():
            conn = self.ready()
            conn.send(declareWithTable(1, struct.pack(">I", 4) + shortstr("a") + b"Z\x00"))
            try:
                while True:
                    f = conn.readFrame(5)
                    if f.classMethod == CONNECTION_CLOSE:
                        self.assertEqual(closeArgs(f)[0], 501)
                        conn.send(method(0, CONNECTION_CLOSE_OK))
                        conn.waitClosed(5)
                        break
            except ConnectionClosed:
                pass
            self.assertFreshConnectionWorks()

        return self.inThread(scenario)

    def test_moderatelyDeepTable(self):
        """A table nested 50 deep is accepted by both brokers."""
        def scenario():
            conn = self.ready()
            conn.send(declareWithTable(1, nested(50)))
            conn.readMethod(QUEUE_DECLARE_OK, 1)

        return self.inThread(scenario)

    @onlyOtter("tables nest at most 100 levels (RabbitMQ: no limit)")
    def test_deepTable(self):
        """A table nested 3,000 deep is 501 cannot decode (it was 541 from a RecursionError)."""
        def scenario():
            conn = self.ready()
            conn.send(declareWithTable(1, nested(3000)))
            f = conn.readMethod(CONNECTION_CLOSE, 0)
            code, text, classId, methodId = closeArgs(f)
            self.assertEqual((code, classId, methodId), (501, 50, 10))
            self.assertTrue(text.startswith("FRAME_ERROR - cannot decode <<0,0,0,12,"), text)
            self.assertEqual(len(text.encode()), 255)
            conn.send(method(0, CONNECTION_CLOSE_OK))
            conn.waitClosed(5)
            self.assertFreshConnectionWorks()

        return self.inThread(scenario)

    def test_shortContentHeader(self):
        """A content header of 4 octets is 501 unknown_frame."""
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + frame(FRAME_HEADER, 1, b"\x00\x3c\x00\x00"))
            self.closed(conn, 501, "FRAME_ERROR - type 2, all octets = <<0,60,0,0>>: unknown_frame", 0, 0)

        return self.inThread(scenario)

    def test_contentHeaderForOtherClass(self):
        """A content header for class 50 is 505 naming basic.publish."""
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + contentHeader(1, 5, classId=50))
            self.closed(conn, 505, "UNEXPECTED_FRAME - expected content header for class 60, got one "
                        "for class 50 instead", 60, 40)

        return self.inThread(scenario)

    def test_bodyBeforeHeader(self):
        """A body frame right after basic.publish is 505 expecting the content header."""
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + frame(FRAME_BODY, 1, b"hello"))
            self.closed(conn, 505, "UNEXPECTED_FRAME - expected content header for class 60, got non "
                        "content header frame instead", 60, 40)

        return self.inThread(scenario)

    def test_secondHeader(self):
        """A second content header where the body should follow is 505 expecting the body."""
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + contentHeader(1, 5) + contentHeader(1, 5))
            self.closed(conn, 505, "UNEXPECTED_FRAME - expected content body, got non content body "
                        "frame instead", 60, 40)

        return self.inThread(scenario)

    def test_headerOnOtherChannel(self):
        """A content header on a channel that is not open (publish pending on another) is 505."""
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + contentHeader(2, 5))
            self.closed(conn, 505, "UNEXPECTED_FRAME - expected method frame, got non method frame "
                        "instead", 0, 0)

        return self.inThread(scenario)

    def test_longContentFrameOnChannelZero(self):
        """A 302-octet header frame on channel 0 is 505 showing the first 16 octets as Erlang prints them."""
        def scenario():
            conn = self.ready()
            conn.send(frame(FRAME_HEADER, 0, b"\x00\x3c" + b"x" * 300))
            self.closed(conn, 505, "UNEXPECTED_FRAME - type 2, first 16 octets = <<0,60,120,120,120,120,"
                        "120,120,120,120,120,120,120,\n                            120,120,120>>", 0, 0)

        return self.inThread(scenario)

    def test_unexpectedCloseOk(self):
        """connection.close-ok out of the blue is 504."""
        def scenario():
            conn = self.ready()
            conn.send(method(0, CONNECTION_CLOSE_OK))
            self.closed(conn, 504, "CHANNEL_ERROR - unexpected method in connection state running", 10, 51)

        return self.inThread(scenario)

    @onlyOtter("undecodable content-header properties are 501 (RabbitMQ 3.10 answers 541 INTERNAL_ERROR)")
    def test_undecodableProperties(self):
        """Properties whose content_type runs past the header are 501 cannot decode naming basic.publish."""
        def scenario():
            conn = self.ready()
            header = frame(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 1) + b"\x80\x00\x09ab")
            conn.send(basicPublish(1, "", "nowhere") + header + frame(FRAME_BODY, 1, b"x"))
            self.closed(conn, 501, "FRAME_ERROR - cannot decode <<128,0,9,97,98>>", 60, 40)

        return self.inThread(scenario)

    @onlyOtter("a body longer than its header is 501 (RabbitMQ 3.10 waits forever)")
    def test_bodyLongerThanHeader(self):
        """More body octets than announced is 501."""
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + contentHeader(1, 3) + frame(FRAME_BODY, 1, b"hello"))
            self.closed(conn, 501, "FRAME_ERROR - content body larger than the size in its header", 0, 0)

        return self.inThread(scenario)


class MaxMessageSizeTests(RawTestMixin, InteropTestCase):
    """max_message_size (default 128 MiB): 406 on the channel with RabbitMQ's text."""

    timeout = 120

    def test_justOverDefault(self):
        """A body of 128 MiB + 1 gets 406 'message size ... is larger than configured max size' on its channel."""
        def scenario():
            conn = self.ready()
            size = DEFAULT_MAX + 1
            chunk = 131072 - 8
            piece = frame(FRAME_BODY, 1, b"a" * chunk)
            conn.send(basicPublish(1, "", "nowhere") + contentHeader(1, size))
            full, rest = divmod(size, chunk)
            batch = piece * 64
            for _ in range(full // 64):
                conn.send(batch)
            conn.send(piece * (full % 64) + frame(FRAME_BODY, 1, b"a" * rest))
            f = conn.readMethod((20, 40), 1, timeout=60)
            self.assertEqual(closeArgs(f), (
                406, "PRECONDITION_FAILED - message size 134217729 is larger than configured max size "
                "134217728", 60, 40))
            conn.send(method(1, (20, 41)))
            # the connection and a reopened channel still work
            conn.send(channelOpen(1))
            conn.readMethod((20, 11), 1)
            self.assertAlive(conn, 1)

        return self.inThread(scenario)

    @onlyOtter("an oversized message is refused at its content header (RabbitMQ waits for the whole body)")
    def test_hugeClaimRefusedAtHeader(self):
        """A header claiming 2^63-1 octets gets 406 at once and nothing is buffered."""
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + contentHeader(1, 2 ** 63 - 1))
            f = conn.readMethod((20, 40), 1)
            self.assertEqual(closeArgs(f), (
                406, "PRECONDITION_FAILED - message size 9223372036854775807 is larger than configured "
                "max size 134217728", 60, 40))
            # body frames the client had already sent are dropped, not buffered
            conn.send(frame(FRAME_BODY, 1, b"z" * 131064) * 16)
            conn.send(method(1, (20, 41)))
            conn.send(channelOpen(1))
            conn.readMethod((20, 11), 1)
            self.assertAlive(conn, 1)

        return self.inThread(scenario)


class PoisonedXDeathTests(InteropTestCase):
    """A publisher's malformed x-death header hurts no other client (pika)."""

    def setUpQueues(self, ch, **arguments):
        """A DLX (fanout), its queue and a source queue with ``arguments``; deleted at cleanup."""
        dlx, dlq, q = self.name("dlx"), self.name("dlq"), self.name("q")
        ch.exchange_declare(dlx, "fanout", auto_delete=False)
        ch.queue_declare(dlq)
        ch.queue_bind(dlq, dlx)
        arguments["x-dead-letter-exchange"] = dlx
        ch.queue_declare(q, arguments=arguments)
        return dlx, dlq, q

    def cleanUp(self, dlx, dlq, q):
        with pika.BlockingConnection(self.pikaParams()) as conn:
            ch = conn.channel()
            ch.queue_delete(q)
            ch.queue_delete(dlq)
            ch.exchange_delete(dlx)

    def poison(self, q):
        """x-death entries that match queue ``q`` with a count that is not a number."""
        return {"x-death": [{"count": "abc", "queue": q, "reason": "maxlen"},
                            {"count": "abc", "queue": q, "reason": "expired"}]}

    def collect(self, ch, queue, n, timeout=5):
        """Up to ``n`` messages from ``queue`` within ``timeout`` seconds: list of (body, headers)."""
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.02)
                continue
            out.append((body, props.headers or {}))
        return out

    def innocentScenario(self, checkKept):
        with pika.BlockingConnection(self.pikaParams()) as setup:
            ch = setup.channel()
            names = self.setUpQueues(ch, **{"x-max-length": 1})
            dlx, dlq, q = names
            try:
                with pika.BlockingConnection(self.pikaParams()) as poisoner:
                    pch = poisoner.channel()
                    pch.confirm_delivery()
                    pch.basic_publish("", q, b"poisoned", pika.BasicProperties(headers=self.poison(q)))
                with pika.BlockingConnection(self.pikaParams()) as innocent:
                    ich = innocent.channel()
                    ich.confirm_delivery()
                    # the first pushes the poisoned message out of the full queue
                    for body in (b"innocent-1", b"innocent-2"):
                        try:
                            ich.basic_publish("", q, body)
                        except NackError:
                            # RabbitMQ 3.10 (observed): the queue process
                            # crashes on the poisoned x-death and may nack
                            # publishes while it restarts; otter_tx never does
                            if not EXTERNAL:
                                raise
                    self.assertTrue(innocent.is_open)
                    self.assertTrue(ich.is_open)
                    # and still works (RabbitMQ's crashed queue itself may be gone)
                    ich.queue_declare("", exclusive=True)
                if checkKept:
                    got = self.collect(ch, q, 1)
                    self.assertEqual([b for b, _ in got], [b"innocent-2"])
                    got = self.collect(ch, dlq, 2)
                    self.assertEqual([b for b, _ in got], [b"poisoned", b"innocent-1"])
                    deaths = got[0][1]["x-death"]
                    self.assertEqual(deaths[0]["count"], 1)
                    self.assertEqual(deaths[0]["queue"], q)
            finally:
                self.cleanUp(dlx, dlq, q)

    def test_innocentPublisherUnaffected(self):
        """The publisher whose publish pushes a poisoned message out of an x-max-length queue is not closed."""
        return self.inThread(self.innocentScenario, False)

    @onlyOtter("a message with a malformed x-death is dead-lettered with a repaired x-death (RabbitMQ loses it)")
    def test_poisonedMessageKept(self):
        """The poisoned message itself reaches the dead-letter queue with count 1."""
        return self.inThread(self.innocentScenario, True)

    @onlyOtter("clean messages expiring with a poisoned one are dead-lettered (RabbitMQ's queue "
               "crashes and loses the messages behind it)")
    def test_expiryBatch(self):
        """Clean messages expiring in the same batch as a poisoned one are dead-lettered."""
        def scenario():
            with pika.BlockingConnection(self.pikaParams()) as conn:
                ch = conn.channel()
                dlx, dlq, q = self.setUpQueues(ch, **{"x-message-ttl": 200})
                try:
                    ch.confirm_delivery()
                    ch.basic_publish("", q, b"clean-1")
                    ch.basic_publish("", q, b"poisoned",
                                     pika.BasicProperties(headers={"x-death": [{"count": "abc", "queue": q,
                                                                                "reason": "expired"}]}))
                    ch.basic_publish("", q, b"clean-2")
                    got = [b for b, _ in self.collect(ch, dlq, 3, timeout=5)]
                    self.assertIn(b"clean-1", got)
                    self.assertIn(b"clean-2", got)
                    self.assertTrue(conn.is_open)
                finally:
                    self.cleanUp(dlx, dlq, q)

        return self.inThread(scenario)
