"""
Deterministic tests (StringTransport and task.Clock) for issue 8's edge
promises on the input side: malformed frames get RabbitMQ 3.10's reply
codes (never 541 INTERNAL_ERROR) with one short log line per connection,
field tables have a nesting limit, ``max_message_size`` is enforced at the
content header without buffering the body, and malformed broker-owned
headers (``x-death``, ``x-delay``) from a publisher never raise.

The expected codes and texts were observed on the RabbitMQ 3.10.8 peer with
raw sockets (see test_interop_wire for the same cases on real sockets).
"""

import struct

from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.amqp.codec import (
    MAX_NESTING,
    FrameSyntaxError,
    TaggedInt,
    decodeArgs,
    decodeTable,
    encodeProperties,
    encodeTable,
)
from otter_tx.amqp.errors import octetsSnippet, replyText
from otter_tx.broker.broker import Broker
from otter_tx.broker.delayed import messageDelay
from otter_tx.broker.message import Message
from otter_tx.door.protocol import DEFAULT_MAX_MESSAGE_SIZE, AMQPServerFactory, frame, methodFrame
from otter_tx.service import tap
from otter_tx.service.assembly import OtterService
from otter_tx.service.tap import parseMaxMessageSize
from otter_tx.testing import FakeClient


def nestedTable(depth):
    """Field-table bytes (with length prefix) nesting ``depth`` tables inside the outer one."""
    inner = b"\x00\x00\x00\x00"
    for _ in range(depth):
        body = b"\x01aF" + inner
        inner = struct.pack("!I", len(body)) + body
    return inner


def queueDeclareArgs(tableBytes, name=b"q"):
    """queue.declare's argument bytes with a raw arguments table."""
    return b"\x00\x00" + bytes([len(name)]) + name + b"\x00" + tableBytes


def contentHeader(channel, size, props=b"\x00\x00", classId=60):
    """A content-header frame."""
    return frame(2, channel, struct.pack("!HHQ", classId, 0, size) + props)


def publishFrame(channel, exchange="", routingKey="q"):
    """A basic.publish method frame."""
    return methodFrame(channel, spec.BasicPublish(0, exchange, routingKey, False, False))


class LogCapture:
    """Collect log events while installed (removed on cleanup)."""

    def __init__(self, testCase):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        testCase.addCleanup(globalLogPublisher.removeObserver, self.events.append)


class WireTestCase(SynchronousTestCase):
    """A broker and a connected, opened client with channel 1 open."""

    maxMessageSize = None

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0,
                                         maxMessageSize=self.maxMessageSize)
        self.client = FakeClient(self.factory)
        self.client.openChannel(1)

    def closeOf(self, data):
        """Feed ``data``; return (channel, code, text, classId, methodId) of the close that came back."""
        self.client.feed(data)
        for ch, m, _ in self.client.received():
            if isinstance(m, (spec.ConnectionClose, spec.ChannelClose)):
                return (ch, m.reply_code, m.reply_text, m.class_id, m.method_id)
        return None


class FrameErrorTests(WireTestCase):
    """Each malformed frame gets RabbitMQ 3.10's connection error, not 541."""

    def test_twoByteMethodFrame(self):
        """A 2-octet method frame is 501 unknown_frame showing its octets."""
        self.assertEqual(self.closeOf(frame(1, 1, b"\x00\x3c")),
                         (0, 501, "FRAME_ERROR - type 1, all octets = <<0,60>>: unknown_frame", 0, 0))

    def test_emptyMethodFrameOnChannelZero(self):
        """An empty method frame on channel 0 is 501 unknown_frame."""
        self.assertEqual(self.closeOf(frame(1, 0, b"")),
                         (0, 501, "FRAME_ERROR - type 1, all octets = <<>>: unknown_frame", 0, 0))

    def test_heartbeatWithPayload(self):
        """A heartbeat frame with a payload is 501 unknown_frame on any channel."""
        self.assertEqual(self.closeOf(frame(8, 0, b"ab")),
                         (0, 501, 'FRAME_ERROR - type 8, all octets = <<"ab">>: unknown_frame', 0, 0))
        self.setUp()
        self.assertEqual(self.closeOf(frame(8, 5, bytes(range(40))))[1:3], (
            501, "FRAME_ERROR - type 8, first 16 octets = <<0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15>>: unknown_frame"))

    def test_shortBasicAck(self):
        """A basic.ack with 4 argument octets is 501 cannot decode naming basic.ack."""
        self.assertEqual(self.closeOf(frame(1, 1, b"\x00\x3c\x00\x50\x00\x00\x00\x01")),
                         (0, 501, "FRAME_ERROR - cannot decode <<0,0,0,1>>", 60, 80))

    def test_basicAckWithoutBits(self):
        """A basic.ack missing its bits octet is 501 cannot decode."""
        self.assertEqual(self.closeOf(frame(1, 1, b"\x00\x3c\x00\x50" + b"\x00" * 8))[:2], (0, 501))

    def test_octetsAfterArguments(self):
        """Octets after the last argument are 501 cannot decode, as RabbitMQ answers."""
        args = queueDeclareArgs(b"\x00\x00\x00\x00") + b"junk"
        self.assertEqual(self.closeOf(frame(1, 1, b"\x00\x32\x00\x0a" + args)),
                         (0, 501, "FRAME_ERROR - cannot decode <<0,0,1,113,0,0,0,0,0,106,117,110,107>>", 50, 10))

    def test_octetsAfterPublish(self):
        """basic.publish (decoded by hand on the hot path) also refuses trailing octets."""
        payload = spec.BasicPublish(0, "", "q", False, False).encode() + b"x"
        self.assertEqual(self.closeOf(frame(1, 1, payload))[1:4:2], (501, 60))

    def test_badFieldTypeTag(self):
        """An unknown field type tag is 501 cannot decode (RabbitMQ's reader crashes)."""
        table = struct.pack("!I", 4) + b"\x01aZ\x00"
        result = self.closeOf(frame(1, 1, b"\x00\x32\x00\x0a" + queueDeclareArgs(table)))
        self.assertEqual(result[:2] + result[3:], (0, 501, 50, 10))
        self.assertTrue(result[2].startswith("FRAME_ERROR - cannot decode <<"))

    def test_deepTable(self):
        """A table nested 3,000 deep is 501 cannot decode, not a RecursionError."""
        table = nestedTable(3000)
        result = self.closeOf(frame(1, 1, b"\x00\x32\x00\x0a" + queueDeclareArgs(table)))
        self.assertEqual(result[:2] + result[3:], (0, 501, 50, 10))
        self.assertLessEqual(len(result[2].encode()), 255)
        self.assertTrue(result[2].endswith("..."))

    def test_deepHeadersProperty(self):
        """A headers property nested 3,000 deep closes the publisher with 501, naming basic.publish."""
        table = nestedTable(3000)
        props = b"\x20\x00" + table
        data = publishFrame(1) + contentHeader(1, 0, props)
        self.assertEqual(self.closeOf(data)[1:4:2], (501, 60))

    def test_undecodableProperties(self):
        """Truncated content-header properties are 501 cannot decode naming basic.publish."""
        data = publishFrame(1) + contentHeader(1, 1, b"\x80\x00\x09ab") + frame(3, 1, b"x")
        self.assertEqual(self.closeOf(data),
                         (0, 501, "FRAME_ERROR - cannot decode <<128,0,9,97,98>>", 60, 40))

    def test_shortContentHeader(self):
        """A content header shorter than 14 octets is 501 unknown_frame."""
        data = publishFrame(1) + frame(2, 1, b"\x00\x3c\x00\x00")
        self.assertEqual(self.closeOf(data),
                         (0, 501, "FRAME_ERROR - type 2, all octets = <<0,60,0,0>>: unknown_frame", 0, 0))

    def test_contentHeaderForOtherClass(self):
        """A content header for class 50 after basic.publish is 505 with RabbitMQ's text."""
        data = publishFrame(1) + contentHeader(1, 5, classId=50)
        self.assertEqual(self.closeOf(data), (
            0, 505,
            "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
            60, 40))

    def test_bodyBeforeHeader(self):
        """A body frame right after basic.publish is 505 expecting the content header."""
        data = publishFrame(1) + frame(3, 1, b"hello")
        self.assertEqual(self.closeOf(data), (
            0, 505,
            "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead",
            60, 40))

    def test_secondHeader(self):
        """A second content header while the body is awaited is 505 expecting the body."""
        data = publishFrame(1) + contentHeader(1, 5) + contentHeader(1, 5)
        self.assertEqual(self.closeOf(data), (
            0, 505, "UNEXPECTED_FRAME - expected content body, got non content body frame instead", 60, 40))

    def test_methodDuringBody(self):
        """A method frame while the body is awaited is 505 expecting the body."""
        data = publishFrame(1) + contentHeader(1, 10) + frame(3, 1, b"hello") \
            + methodFrame(1, spec.QueueDeclare(0, "x"))
        self.assertEqual(self.closeOf(data)[1:3], (
            505, "UNEXPECTED_FRAME - expected content body, got non content body frame instead"))

    def test_headerOnUnopenedChannel(self):
        """A content header on a channel that is not open is 505 (not 504)."""
        data = publishFrame(1) + contentHeader(2, 5)
        self.assertEqual(self.closeOf(data), (
            0, 505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0))

    def test_contentOnChannelZero(self):
        """A body frame on channel 0 is 505 showing the first 16 octets as Erlang prints them."""
        self.assertEqual(self.closeOf(frame(3, 0, b"abc")),
                         (0, 505, 'UNEXPECTED_FRAME - type 3, all octets = <<"abc">>', 0, 0))
        self.setUp()
        self.assertEqual(self.closeOf(frame(2, 0, b"\x00\x3c" + b"x" * 300))[2], (
            "UNEXPECTED_FRAME - type 2, first 16 octets = <<0,60,120,120,120,120,120,120,120,120,120,"
            "120,120,\n                            120,120,120>>"))

    def test_unexpectedCloseOk(self):
        """connection.close-ok out of the blue is 504 as RabbitMQ answers it."""
        self.assertEqual(self.closeOf(methodFrame(0, spec.ConnectionCloseOk())), (
            0, 504, "CHANNEL_ERROR - unexpected method in connection state running", 10, 51))

    def test_bodyLongerThanHeader(self):
        """More body octets than the header announced is 501 (RabbitMQ waits forever)."""
        data = publishFrame(1) + contentHeader(1, 3) + frame(3, 1, b"hello")
        self.assertEqual(self.closeOf(data)[1], 501)


class LoggingTests(WireTestCase):
    """A bad frame makes one short log line per connection and no traceback."""

    def test_hugeBadFrameOneShortLine(self):
        """A 100 KB undecodable frame logs one warning under 1 KB and no failure."""
        capture = LogCapture(self)
        garbage = struct.pack("!I", 100000) + b"\x01aZ" + b"\xff" * 99997
        result = self.closeOf(frame(1, 1, b"\x00\x32\x00\x0a" + queueDeclareArgs(garbage)))
        self.assertEqual(result[1], 501)
        self.assertEqual(len(result[2].encode()), 255)
        self.client.feed(b"\x01\x00\x01\x00\x00\x00\x02\x00\x3c\xce" * 50)  # ignored while closing
        lines = [e for e in capture.events if e.get("log_level") is not None
                 and e["log_level"].name in ("warn", "error", "critical")]
        self.assertEqual(len(lines), 1)
        self.assertNotIn("log_failure", lines[0])
        from twisted.logger import formatEvent
        self.assertLess(len(formatEvent(lines[0])), 1024)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_hugeUsernameShortLine(self):
        """A refused login with a 100 KB user name logs lines under 1 KB each."""
        capture = LogCapture(self)
        c = FakeClient(self.factory, handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        c.send(0, spec.ConnectionStartOk({}, "PLAIN", b"\0" + b"u" * 100000 + b"\0pw", "en_US"))
        from twisted.logger import formatEvent
        lines = [formatEvent(e) for e in capture.events]
        self.assertTrue(any("login refused" in line for line in lines), lines)
        self.assertLess(max(len(line) for line in lines), 1024)

    def test_replyTextCut(self):
        """Reply texts longer than 255 octets are cut to 252 and '...' as RabbitMQ cuts them."""
        self.assertEqual(replyText("a" * 255), "a" * 255)
        self.assertEqual(replyText("a" * 256), "a" * 252 + "...")
        self.assertEqual(len(replyText("\u00e9" * 200).encode()), 255)

    def test_snippet(self):
        """Up to 16 octets are 'all octets', more are 'first 16 octets'."""
        self.assertEqual(octetsSnippet("type 9, ", b"abcd"), 'type 9, all octets = <<"abcd">>')
        self.assertEqual(octetsSnippet("type 9, ", b"a" * 17), 'type 9, first 16 octets = <<"%s">>' % ("a" * 16,))


class NestingTests(SynchronousTestCase):
    """Field tables and arrays nest at most MAX_NESTING levels."""

    def test_limit(self):
        """MAX_NESTING levels decode; one more is a FrameSyntaxError."""
        ok = nestedTable(MAX_NESTING - 1)
        decodeTable(ok, 4, len(ok))
        deep = nestedTable(MAX_NESTING)
        self.assertRaises(FrameSyntaxError, decodeTable, deep, 4, len(deep))

    def test_arraysCount(self):
        """Arrays count as a level: an array 3,000 deep is refused without recursion errors."""
        inner = b"A\x00\x00\x00\x00"
        for _ in range(3000):
            inner = b"A" + struct.pack("!I", len(inner)) + inner
        body = b"\x01a" + inner
        data = struct.pack("!I", len(body)) + body
        self.assertRaises(FrameSyntaxError, decodeTable, data, 4, len(data))

    def test_roundTripAtLimit(self):
        """A value at the limit re-encodes (dead-lettering re-encodes headers)."""
        value = {}
        for _ in range(MAX_NESTING - 1):
            value = {"a": value}
        raw = encodeTable(value)
        self.assertEqual(decodeTable(raw, 4, len(raw)), value)

    def test_truncatedValues(self):
        """Truncated booleans and decimals at the end of a table are FrameSyntaxErrors."""
        for raw in (b"\x01at", b"\x01aD\x02\x00"):
            data = struct.pack("!I", len(raw)) + raw
            self.assertRaises(FrameSyntaxError, decodeTable, data, 4, len(data))

    def test_trailingOctets(self):
        """decodeArgs refuses octets after the last argument."""
        self.assertEqual(decodeArgs("sb", b"\x01a\x01", 0), ["a", True])
        self.assertRaises(FrameSyntaxError, decodeArgs, "sb", b"\x01a\x01\x00", 0)


class MaxMessageSizeTests(WireTestCase):
    """max_message_size: 406 at the content header, the body is never buffered."""

    maxMessageSize = 1000

    def test_default(self):
        """The default is RabbitMQ's 128 MiB."""
        self.assertEqual(DEFAULT_MAX_MESSAGE_SIZE, 134217728)
        self.assertEqual(AMQPServerFactory(self.broker, self.clock).maxMessageSize, 134217728)

    def test_atLimitAccepted(self):
        """A body of exactly the maximum is accepted."""
        self.client.send(1, spec.QueueDeclare(0, "q"))
        self.client.publish(1, "", "q", b"x" * 1000)
        self.client.received()
        self.assertEqual(self.broker.vhosts["/"].queues["q"].readyCount, 1)

    def test_overLimit406(self):
        """One byte more is 406 on the channel with RabbitMQ's text naming basic.publish."""
        self.assertEqual(self.closeOf(publishFrame(1) + contentHeader(1, 1001)), (
            1, 406, "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000",
            60, 40))

    def test_hugeClaimBuffersNothing(self):
        """A header claiming 2^63-1 bytes is refused at once; the body frames after it are dropped as they come."""
        self.assertEqual(self.closeOf(publishFrame(1) + contentHeader(1, 2 ** 63 - 1))[1], 406)
        ch = self.client.protocol.engine.channels[1]
        chunk = frame(3, 1, b"z" * 131064)
        for _ in range(40):  # 5 MB of body frames
            self.client.feed(chunk)
            self.assertIsNone(ch.bodyParts)
            self.assertLess(self.client.protocol.engine.buffered(), 131072 + 8)
        # the client acknowledges the close; the channel can be opened again and works
        self.client.send(1, spec.ChannelCloseOk())
        self.client.openChannel(1)
        self.client.send(1, spec.QueueDeclare(0, "q"))
        self.client.publish(1, "", "q", b"fine")
        self.client.send(1, spec.BasicGet(0, "q", True))
        out = self.client.received()
        self.assertEqual(out[-1][2][1], b"fine")

    def test_connectionSurvives(self):
        """Other channels of the connection keep working after the 406."""
        self.client.openChannel(2)
        self.closeOf(publishFrame(1) + contentHeader(1, 5000))
        self.client.send(2, spec.QueueDeclare(0, "q2"))
        self.assertIsInstance(self.client.methods()[-1], spec.QueueDeclareOk)

    def test_parse(self):
        """--max-message-size takes bytes or RabbitMQ's units, up to 512 MiB."""
        self.assertEqual(parseMaxMessageSize(134217728), 134217728)
        self.assertEqual(parseMaxMessageSize("128MiB"), 134217728)
        self.assertEqual(parseMaxMessageSize("100MB"), 100000000)
        self.assertEqual(parseMaxMessageSize("512MiB"), 536870912)
        for bad in (0, -1, "536870913", "1GiB", "big", 1.5, True, "10 MB"):
            self.assertRaises(ValueError, parseMaxMessageSize, bad)

    def test_option(self):
        """--max-message-size and max_message_size in the file reach the service; a bad one is one line naming it."""
        from twisted.python import usage

        def settings(*argv):
            o = tap.Options()
            o.parseOptions(list(argv))
            return o.settings

        self.assertEqual(settings()["max-message-size"], 134217728)
        self.assertEqual(settings("--max-message-size", "64MiB")["max-message-size"], 64 * 1024 ** 2)
        path = self.mktemp()
        with open(path, "w") as f:
            f.write('max_message_size = 1000\n')
        self.assertEqual(settings("--config", path)["max-message-size"], 1000)
        e = self.assertRaises(usage.UsageError, settings, "--max-message-size", "1GiB")
        self.assertEqual(str(e), "--max-message-size: must be a number of bytes from 1 to 536870912 "
                                 "(512MiB), optionally with a unit (128MiB, 100MB), got '1GiB'")
        svc = OtterService(amqp=[], reactor=Clock(), maxMessageSize=2048)
        self.assertEqual(svc.factory.maxMessageSize, 2048)
        self.assertRaises(ValueError, OtterService, amqp=[], reactor=Clock(), maxMessageSize=2 ** 30)


class PoisonedHeaderTests(SynchronousTestCase):
    """Malformed broker-owned headers from a publisher hurt only nobody."""

    POISONS = [
        {"x-death": [{"count": "abc", "queue": "q", "reason": "maxlen"}]},
        {"x-death": [{"count": {"nested": 1}, "queue": "q", "reason": "expired"}]},
        {"x-death": [{"count": -5, "queue": "q", "reason": "expired"}]},
        {"x-death": "not an array"},
        {"x-death": [1, "two", None, {"queue": 3}]},
        {"x-death": [{"count": TaggedInt(2, "l"), "queue": "q", "reason": "maxlen"}], "x-delay": float("nan")},
    ]

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.broker = Broker(self.clock)
        self.vhost = self.broker.vhosts["/"]
        self.vhost.declareExchange("dlx", "fanout")
        self.dlq = self.vhost.declareQueue("dlq", None)
        self.vhost.bind(self.vhost.exchanges["dlx"], self.dlq, "", {})

    def drainDlq(self):
        out = []
        while True:
            e = self.dlq.basicGet(True)
            if e is None:
                return out
            out.append(e.message)

    def publish(self, body, headers=None, **props):
        if headers is not None:
            props["headers"] = headers
        m = Message("", "q", encodeProperties(props), body)
        return self.vhost.publish(self.vhost.exchanges[""], m)

    def test_maxlenDropHead(self):
        """A poisoned message pushed out of a full queue is dead-lettered with a sane x-death."""
        for poison in self.POISONS:
            q = self.vhost.declareQueue("q", None, arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 1})
            self.publish(b"poisoned", poison)
            self.publish(b"innocent")
            (m,) = self.drainDlq()
            self.assertEqual(m.body, b"poisoned")
            deaths = m.headers["x-death"]
            self.assertIsInstance(deaths, list)
            self.assertTrue(all(isinstance(d, dict) for d in deaths), deaths)
            self.assertEqual(deaths[0]["queue"], "q")
            self.assertEqual(deaths[0]["reason"], "maxlen")
            self.assertIsInstance(deaths[0]["count"], int)
            self.assertGreaterEqual(deaths[0]["count"], 1)
            self.vhost.deleteQueue(q)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_matchingEntryWithBadCountRestarts(self):
        """A matching entry whose count is not a number counts from 0 again: count 1."""
        self.vhost.declareQueue("q", None, arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 1})
        self.publish(b"p", {"x-death": [{"count": "abc", "queue": "q", "reason": "maxlen", "keep": "me"}]})
        self.publish(b"i")
        (m,) = self.drainDlq()
        (d,) = m.headers["x-death"]
        self.assertEqual((d["count"], d["keep"]), (1, "me"))

    def test_validCountIncrements(self):
        """A well-formed matching entry still counts up."""
        self.vhost.declareQueue("q", None, arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 1})
        self.publish(b"p", {"x-death": [{"count": TaggedInt(2, "l"), "queue": "q", "reason": "maxlen"}]})
        self.publish(b"i")
        (m,) = self.drainDlq()
        self.assertEqual(m.headers["x-death"][0]["count"], 3)

    def test_expiryBatch(self):
        """Clean messages behind a poisoned one in an expiry batch are dead-lettered normally."""
        self.vhost.declareQueue("q", None, arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 50})
        self.publish(b"clean-1")
        for i, poison in enumerate(self.POISONS):
            self.publish(b"poison-%d" % i, poison)
        self.publish(b"clean-2")
        self.clock.advance(0.05)
        bodies = [m.body for m in self.drainDlq()]
        self.assertEqual(bodies, [b"clean-1"] + [b"poison-%d" % i for i in range(len(self.POISONS))]
                         + [b"clean-2"])
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_rejected(self):
        """A rejected poisoned message is dead-lettered."""
        q = self.vhost.declareQueue("q", None, arguments={"x-dead-letter-exchange": "dlx"})
        self.publish(b"p", {"x-death": "oops"})
        q.reject([q.basicGet(False)])
        (m,) = self.drainDlq()
        self.assertEqual(m.headers["x-death"][0]["reason"], "rejected")

    def test_innocentPublisherOverTheWire(self):
        """The innocent publisher whose publish pushes a poisoned message out is not closed."""
        factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0)
        self.vhost.declareQueue("q", None, arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 1})
        poisoner = FakeClient(factory)
        poisoner.openChannel(1)
        poisoner.publish(1, "", "q", b"poisoned", props={"headers": self.POISONS[0]})
        innocent = FakeClient(factory)
        innocent.openChannel(1)
        innocent.send(1, spec.ConfirmSelect(False))
        innocent.received()
        innocent.publish(1, "", "q", b"innocent")
        self.assertEqual([type(m) for m in innocent.methods()], [spec.BasicAck])
        self.assertEqual([m.body for m in self.drainDlq()], [b"poisoned"])
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_xDelay(self):
        """x-delay NaN, infinity or a huge string means no delay, never an exception."""
        for v in (float("nan"), float("inf"), float("-inf"), "9" * 5000, {"a": 1}, [1]):
            m = Message("", "q", encodeProperties({"headers": {"x-delay": v}}), b"")
            self.assertIsNone(messageDelay(m), v)
