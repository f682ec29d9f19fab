"""
Tests for :mod:`otter_tx.amqp.engine` and :mod:`otter_tx.amqp.frames`: byte
vectors in, events and bytes out, no Twisted and no broker.
"""

import struct
import unittest

from otter_tx.amqp import engine as wire
from otter_tx.amqp import spec
from otter_tx.amqp.codec import encodeProperties, encodeTable
from otter_tx.amqp.engine import CLIENT, SERVER, ConnectionEngine, LocalProtocolError
from otter_tx.amqp.errors import AMQPError
from otter_tx.amqp.frames import HEARTBEAT_FRAME, FrameReader, contentFrames, frame, methodFrame


def events(engine, data=b""):
    """Feed ``data`` and return every event until the engine needs more bytes."""
    engine.receiveData(data)
    out = []
    while True:
        event = engine.nextEvent()
        if event is None:
            return out
        out.append(event)


def header(size, props=b"\x00\x00", classId=60):
    """A content header frame payload for a body of ``size`` octets."""
    return struct.pack("!HHQ", classId, 0, size) + props


def openServer(heartbeat=0, **kw):
    """A server engine through the handshake, with channel 1 open."""
    e = ConnectionEngine(SERVER, heartbeat=heartbeat, **kw)
    events(e, spec.PROTOCOL_HEADER)
    e.start({})
    events(e, methodFrame(0, spec.ConnectionStartOk({}, "PLAIN", b"\0guest\0guest", "en_US")))
    e.tune()
    events(e, methodFrame(0, spec.ConnectionTuneOk(2047, 131072, heartbeat)))
    events(e, methodFrame(0, spec.ConnectionOpen("/", "", False)))
    e.openOk()
    assert events(e, methodFrame(1, spec.ChannelOpen(""))) == [(wire.CHANNEL_OPEN, 1)]
    return e


def errorOf(engine, data):
    """The AMQPError the engine raises for ``data``."""
    try:
        events(engine, data)
    except AMQPError as e:
        return e
    raise AssertionError("no error")


class HandshakeTests(unittest.TestCase):
    """The connection handshake in both roles."""

    def test_serverHandshake(self):
        """The server role reports header, start-ok, tune-ok and open, and answers through its encoders."""
        e = ConnectionEngine(SERVER, frameMax=131072, channelMax=2047, heartbeat=60)
        self.assertEqual(events(e, spec.PROTOCOL_HEADER), [(wire.PROTOCOL_HEADER, spec.PROTOCOL_HEADER)])
        start = e.start({"product": "x"})
        self.assertEqual(start, methodFrame(0, spec.ConnectionStart(0, 9, {"product": "x"}, b"PLAIN AMQPLAIN", b"en_US")))
        startOk = spec.ConnectionStartOk({}, "PLAIN", b"\0u\0p", "en_US")
        self.assertEqual(events(e, methodFrame(0, startOk)), [(wire.START_OK, startOk)])
        self.assertEqual(e.tune(), methodFrame(0, spec.ConnectionTune(2047, 131072, 60)))
        (tuneOk,) = events(e, methodFrame(0, spec.ConnectionTuneOk(100, 8192, 30)))
        self.assertEqual(tuneOk[0], wire.TUNE_OK)
        self.assertEqual((e.frameMax, e.channelMax, e.heartbeat), (8192, 100, 30))
        (opened,) = events(e, methodFrame(0, spec.ConnectionOpen("/", "", False)))
        self.assertEqual(opened[0], wire.OPEN_CONNECTION)
        self.assertEqual(e.openOk(), methodFrame(0, spec.ConnectionOpenOk("")))
        self.assertEqual(e.state, wire.OPEN)

    def test_clientRoleFollowsServer(self):
        """A client engine decodes what a server engine sends, its states following the handshake."""
        server = ConnectionEngine(SERVER)
        client = ConnectionEngine(CLIENT)
        events(server, spec.PROTOCOL_HEADER)
        (start,) = events(client, server.start({}))
        self.assertIsInstance(start[2], spec.ConnectionStart)
        self.assertEqual(client.state, wire.AWAIT_TUNE)
        events(server, client.method(0, spec.ConnectionStartOk({}, "PLAIN", b"\0a\0b", "en_US")))
        events(client, server.tune())
        self.assertEqual(client.state, wire.AWAIT_OPEN_OK)
        events(server, client.method(0, spec.ConnectionTuneOk(0, 0, 0)))
        events(server, client.method(0, spec.ConnectionOpen("/", "", False)))
        events(client, server.openOk())
        self.assertEqual((client.state, server.state), (wire.OPEN, wire.OPEN))

    def test_clientAssemblesDeliveries(self):
        """The client role assembles basic.deliver with its content header and body frames."""
        server = openServer()
        client = ConnectionEngine(CLIENT)
        data = server.deliver(1, b"\x03tag", 7, True, b"\x00\x01q", header(5, b"\x80\x00\x0atext/plain"), b"hello")
        ((kind, ch, m, propsRaw, body),) = events(client, data)
        self.assertEqual((kind, ch, body, propsRaw), (wire.CONTENT, 1, b"hello", b"\x80\x00\x0atext/plain"))
        self.assertEqual(m, spec.BasicDeliver("tag", 7, True, "", "q"))

    def test_badHeader(self):
        """Anything but an AMQP 0-9-1 header is BAD_HEADER and the engine is closed (section 4.2.2)."""
        e = ConnectionEngine(SERVER)
        self.assertEqual(events(e, b"GET / HTTP/1.1\r\n"), [(wire.BAD_HEADER, b"GET / HT")])
        self.assertEqual(e.state, wire.CLOSED)

    def test_partialHeaderWaits(self):
        """A header arriving in pieces waits for its eighth octet."""
        e = ConnectionEngine(SERVER)
        self.assertEqual(events(e, b"AMQ"), [])
        self.assertEqual(events(e, b"P\x00\x00\x09\x01"), [(wire.PROTOCOL_HEADER, spec.PROTOCOL_HEADER)])

    def test_misuse(self):
        """Answers out of state and an unknown role are LocalProtocolError, not AMQPError."""
        self.assertRaises(LocalProtocolError, ConnectionEngine, "peer")
        e = ConnectionEngine(SERVER)
        self.assertRaises(LocalProtocolError, e.openOk)
        self.assertRaises(LocalProtocolError, ConnectionEngine(CLIENT).start, {})


class SASLTests(unittest.TestCase):
    """The credentials of connection.start-ok's response."""

    def test_plain(self):
        """PLAIN is authzid NUL authcid NUL password; other shapes are unreadable."""
        self.assertEqual(wire.saslCredentials("PLAIN", b"\0guest\0pw"), ("guest", "pw"))
        self.assertEqual(wire.saslCredentials("PLAIN", b"guest\0pw"), (None, None))

    def test_amqplain(self):
        """AMQPLAIN is a table with LOGIN and PASSWORD strings; a bad table or missing keys are unreadable."""
        table = encodeTable({"LOGIN": "guest", "PASSWORD": "pw"})[4:]
        self.assertEqual(wire.saslCredentials("AMQPLAIN", table), ("guest", "pw"))
        self.assertEqual(wire.saslCredentials("AMQPLAIN", encodeTable({"LOGIN": "guest"})[4:]), (None, None))
        self.assertEqual(wire.saslCredentials("AMQPLAIN", b"\xff"), (None, None))

    def test_unsupported(self):
        """A mechanism connection.start did not offer is None."""
        self.assertIsNone(wire.saslCredentials("EXTERNAL", b""))
        self.assertEqual(wire.MECHANISMS, b"PLAIN AMQPLAIN")


class TuneTests(unittest.TestCase):
    """tune-ok limits (530 NOT_ALLOWED, rabbit_reader's texts)."""

    def tuned(self, tuneOk):
        e = ConnectionEngine(SERVER, frameMax=131072, channelMax=2047)
        events(e, spec.PROTOCOL_HEADER)
        e.start({})
        events(e, methodFrame(0, spec.ConnectionStartOk({}, "PLAIN", b"\0a\0b", "en_US")))
        e.tune()
        return errorOf(e, methodFrame(0, tuneOk))

    def test_frameMaxTooSmall(self):
        """frame_max under 4096 is refused."""
        err = self.tuned(spec.ConnectionTuneOk(0, 100, 0))
        self.assertEqual((err.code, err.text), (530, "NOT_ALLOWED - frame_max=100 < 4096 min size"))

    def test_frameMaxTooLarge(self):
        """frame_max over ours is refused."""
        err = self.tuned(spec.ConnectionTuneOk(0, 131073, 0))
        self.assertEqual(err.text, "NOT_ALLOWED - frame_max=131073 > 131072 max size")

    def test_channelMaxTooLarge(self):
        """channel_max over ours is refused."""
        err = self.tuned(spec.ConnectionTuneOk(2048, 0, 0))
        self.assertEqual(err.text, "NOT_ALLOWED - channel_max=2048 > 2047 max size")

    def test_zeroMeansOurs(self):
        """Zero frame_max and channel_max take our proposals."""
        e = ConnectionEngine(SERVER, frameMax=65536, channelMax=10)
        events(e, spec.PROTOCOL_HEADER)
        e.start({})
        events(e, methodFrame(0, spec.ConnectionStartOk({}, "PLAIN", b"\0a\0b", "en_US")))
        e.tune()
        events(e, methodFrame(0, spec.ConnectionTuneOk(0, 0, 0)))
        self.assertEqual((e.frameMax, e.channelMax), (65536, 10))


class WireErrorTests(unittest.TestCase):
    """Every wire error, with RabbitMQ's code and text."""

    def test_frameTooLarge(self):
        """A header announcing more than frame_max is 501 at once, before its payload arrives."""
        err = errorOf(openServer(), struct.pack("!BHI", 1, 1, 131073))
        self.assertEqual((err.code, err.text),
                         (501, "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,131073,131064}"))

    def test_badFrameEnd(self):
        """A frame not ending in 0xCE is 501 invalid_frame_end_marker."""
        err = errorOf(openServer(), frame(8, 0, b"")[:-1] + b"\x00")
        self.assertEqual(err.text, "FRAME_ERROR - type 8, all octets = <<>>: {invalid_frame_end_marker,0}")

    def test_shortMethod(self):
        """A method frame of under 4 octets is 501 unknown_frame."""
        err = errorOf(openServer(), frame(1, 1, b"\x00\x14"))
        self.assertEqual(err.text, "FRAME_ERROR - type 1, all octets = <<0,20>>: unknown_frame")

    def test_heartbeatWithPayload(self):
        """A heartbeat frame with a payload is 501 unknown_frame."""
        err = errorOf(openServer(), frame(8, 0, b"x"))
        self.assertEqual(err.code, 501)
        self.assertTrue(err.text.endswith("unknown_frame"), err.text)

    def test_contentOnChannelZero(self):
        """Content frames on channel 0 are 505."""
        self.assertEqual(errorOf(openServer(), frame(3, 0, b"x")).code, 505)

    def test_channelBeforeOpen(self):
        """A channel used before connection.open is 504."""
        e = ConnectionEngine(SERVER)
        events(e, spec.PROTOCOL_HEADER)
        e.start({})
        err = errorOf(e, methodFrame(1, spec.ChannelOpen("")))
        self.assertEqual((err.code, err.text), (504, "CHANNEL_ERROR - channel 1 used before connection.open"))

    def test_expectedChannelOpen(self):
        """A method on an unopened channel is 504 expected 'channel.open', naming the method."""
        err = errorOf(openServer(), methodFrame(2, spec.QueueDeclare(0, "q")))
        self.assertEqual((err.code, err.text, err.method, err.channel),
                         (504, "CHANNEL_ERROR - expected 'channel.open'", spec.QueueDeclare, 2))

    def test_contentOnUnopenedChannel(self):
        """A content frame on an unopened channel is 505."""
        err = errorOf(openServer(), frame(2, 2, header(1)))
        self.assertEqual(err.text, "UNEXPECTED_FRAME - expected method frame, got non method frame instead")

    def test_unknownMethod(self):
        """An unknown class/method is 503."""
        err = errorOf(openServer(), frame(1, 1, b"\x00\x63\x00\x01"))
        self.assertEqual(err.text, "COMMAND_INVALID - unknown method class 99 method 1")

    def test_notAllowedOnChannel(self):
        """A server-only method sent on a channel is 503."""
        err = errorOf(openServer(), methodFrame(1, spec.BasicDeliver("t", 1, False, "", "q")))
        self.assertEqual(err.text, "COMMAND_INVALID - basic.deliver not allowed on a channel")

    def test_secondChannelOpen(self):
        """channel.open on an open channel is 504."""
        err = errorOf(openServer(), methodFrame(1, spec.ChannelOpen("")))
        self.assertEqual((err.code, err.text), (504, "CHANNEL_ERROR - second 'channel.open' seen"))

    def test_channelMax(self):
        """Opening more channels than channel_max is 530."""
        e = ConnectionEngine(SERVER, channelMax=1)
        events(e, spec.PROTOCOL_HEADER)
        e.start({})
        events(e, methodFrame(0, spec.ConnectionStartOk({}, "PLAIN", b"\0a\0b", "en_US")))
        e.tune()
        events(e, methodFrame(0, spec.ConnectionTuneOk(0, 0, 0)) + methodFrame(0, spec.ConnectionOpen("/", "", False)))
        e.openOk()
        events(e, methodFrame(1, spec.ChannelOpen("")))
        err = errorOf(e, methodFrame(2, spec.ChannelOpen("")))
        self.assertEqual(err.text,
                         "NOT_ALLOWED - number of channels opened (1) has reached the negotiated channel_max (1)")

    def test_unexpectedConnectionMethod(self):
        """A connection method out of its state is 504 naming RabbitMQ's state."""
        err = errorOf(openServer(), methodFrame(0, spec.ConnectionTuneOk(0, 0, 0)))
        self.assertEqual((err.code, err.text), (504, "CHANNEL_ERROR - unexpected method in connection state running"))

    def test_undecodable(self):
        """Undecodable arguments are 501 cannot decode, naming the method."""
        err = errorOf(openServer(), frame(1, 1, b"\x00\x32\x00\x0a\x00\x00\x05ab"))
        self.assertEqual((err.code, err.method), (501, spec.QueueDeclare))
        self.assertTrue(err.text.startswith("FRAME_ERROR - cannot decode <<"), err.text)

    def test_malformedShortstr(self):
        """Non-UTF-8 in a short string is 501 with class and method 0."""
        err = errorOf(openServer(), frame(1, 1, b"\x00\x32\x00\x0a\x00\x00\x02\xff\xfe" + b"\x00" + b"\x00" * 4))
        self.assertEqual((err.code, err.text, err.method), (501, "FRAME_ERROR - Malformed UTF-8 in shortstr", None))

    def test_immediate(self):
        """basic.publish with immediate=true is 540."""
        err = errorOf(openServer(), methodFrame(1, spec.BasicPublish(0, "", "q", False, True)))
        self.assertEqual((err.code, err.text, err.method), (540, "NOT_IMPLEMENTED - immediate=true", spec.BasicPublish))

    def test_ackWrongSize(self):
        """A basic.ack of the wrong size is 501 cannot decode naming basic.ack."""
        err = errorOf(openServer(), frame(1, 1, b"\x00\x3c\x00\x50" + b"\x00" * 8))
        self.assertEqual((err.code, err.method), (501, spec.BasicAck))


class ContentTests(unittest.TestCase):
    """basic.publish content assembly in the server role."""

    def test_publishAndContent(self):
        """A publish, its header and two body frames are PUBLISH then CONTENT with the body joined."""
        e = openServer()
        data = (methodFrame(1, spec.BasicPublish(0, "ex", "rk", True, False)) + frame(2, 1, header(5, b"\x10\x00\x02"))
                + frame(3, 1, b"hel") + frame(3, 1, b"lo"))
        self.assertEqual(events(e, data), [
            (wire.PUBLISH, 1, "ex", "rk", True, b"\x02ex\x02rk"),
            (wire.CONTENT, 1, b"\x10\x00\x02", b"hello"),
        ])

    def test_emptyBody(self):
        """A header announcing no body completes the message at once."""
        e = openServer()
        out = events(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)) + frame(2, 1, header(0)))
        self.assertEqual(out, [(wire.MESSAGE, 1, "", "q", False, b"\x00\x01q", b"\x00\x00", b"")])

    def test_emptyBodyArrivingLater(self):
        """A header announcing no body, after its publish was handled, completes the content at once."""
        e = openServer()
        events(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)))
        self.assertEqual(events(e, frame(2, 1, header(0))), [(wire.CONTENT, 1, b"\x00\x00", b"")])

    def test_wholeMessageOneEvent(self):
        """A publish buffered with its header and its single body frame is one MESSAGE event."""
        e = openServer()
        data = (methodFrame(1, spec.BasicPublish(0, "ex", "rk", True, False)) + frame(2, 1, header(5, b"\x10\x00\x02"))
                + frame(3, 1, b"hello"))
        self.assertEqual(events(e, data + data), [
            (wire.MESSAGE, 1, "ex", "rk", True, b"\x02ex\x02rk", b"\x10\x00\x02", b"hello"),
        ] * 2)

    def test_joinContentOff(self):
        """With joinContent off (a blocked connection) a wholly buffered publish is PUBLISH, then CONTENT."""
        e = openServer()
        e.joinContent = False
        data = (methodFrame(1, spec.BasicPublish(0, "ex", "rk", False, False)) + frame(2, 1, header(5))
                + frame(3, 1, b"hello"))
        self.assertEqual(events(e, data), [
            (wire.PUBLISH, 1, "ex", "rk", False, b"\x02ex\x02rk"),
            (wire.CONTENT, 1, b"\x00\x00", b"hello"),
        ])

    def test_partialMessageFrameByFrame(self):
        """A publish whose content is not all buffered yet is PUBLISH, then CONTENT once the body is in."""
        e = openServer()
        data = (methodFrame(1, spec.BasicPublish(0, "ex", "rk", False, False)) + frame(2, 1, header(5))
                + frame(3, 1, b"hello"))
        self.assertEqual(events(e, data[:-3]), [(wire.PUBLISH, 1, "ex", "rk", False, b"\x02ex\x02rk")])
        self.assertEqual(events(e, data[-3:]), [(wire.CONTENT, 1, b"\x00\x00", b"hello")])

    def test_wholeMessageChecksKeptOnTheFramePath(self):
        """A buffered message that breaks a rule (here: its size over the maximum) is not one event."""
        e = openServer(maxMessageSize=4)
        data = (methodFrame(1, spec.BasicPublish(0, "", "q", False, False)) + frame(2, 1, header(5))
                + frame(3, 1, b"hello"))
        e.receiveData(data, 0)
        self.assertEqual(e.nextEvent()[0], wire.PUBLISH)
        with self.assertRaises(AMQPError) as caught:
            e.nextEvent()
        self.assertEqual(caught.exception.code, spec.PRECONDITION_FAILED)

    def test_publishDecodeMatchesCodec(self):
        """The hand decode of basic.publish agrees with the generic codec, odd bytes included."""
        e = openServer()
        m = spec.BasicPublish(0, "x\udcff", "k" * 255, False, False)
        ((kind, ch, exchange, routingKey, mandatory, address),) = events(e, methodFrame(1, m))
        self.assertEqual((exchange, routingKey, mandatory), (m.exchange, m.routing_key, False))

    def test_tooLarge406(self):
        """A header over maxMessageSize is a channel-level 406 naming basic.publish."""
        e = openServer(maxMessageSize=10)
        err = errorOf(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)) + frame(2, 1, header(11)))
        self.assertEqual((err.code, err.text, err.method, err.channel, err.channelLevel),
                         (406, "PRECONDITION_FAILED - message size 11 is larger than configured max size 10",
                          spec.BasicPublish, 1, True))

    def test_methodInsideContent(self):
        """A method where a content header is expected is 505 with the assembler's text."""
        e = openServer()
        events(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)))
        err = errorOf(e, methodFrame(1, spec.BasicQos(0, 1, False)))
        self.assertEqual(err.text, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead")

    def test_methodInsideBody(self):
        """A method where a body frame is expected is 505."""
        e = openServer()
        events(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)) + frame(2, 1, header(3)))
        err = errorOf(e, methodFrame(1, spec.BasicQos(0, 1, False)))
        self.assertEqual(err.text, "UNEXPECTED_FRAME - expected content body, got non content body frame instead")

    def test_headerWrongClass(self):
        """A content header for a class other than 60 is 505."""
        e = openServer()
        events(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)))
        err = errorOf(e, frame(2, 1, header(3, classId=50)))
        self.assertEqual(err.text, "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead")

    def test_bodyWithoutHeader(self):
        """A body frame with no publish is 505 expected method frame."""
        err = errorOf(openServer(), frame(3, 1, b"x"))
        self.assertEqual(err.text, "UNEXPECTED_FRAME - expected method frame, got non method frame instead")

    def test_bodyTooLong(self):
        """More body octets than announced is 501."""
        e = openServer()
        events(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)) + frame(2, 1, header(2)))
        err = errorOf(e, frame(3, 1, b"abc"))
        self.assertEqual((err.code, err.text), (501, "FRAME_ERROR - content body larger than the size in its header"))

    def test_ack(self):
        """basic.ack is decoded by hand into ACK."""
        e = openServer()
        self.assertEqual(events(e, methodFrame(1, spec.BasicAck(2 ** 40, True))), [(wire.ACK, 1, 2 ** 40, True)])

    def test_otherMethods(self):
        """Other channel methods come decoded as METHOD."""
        e = openServer()
        m = spec.QueueDeclare(0, "q", durable=True)
        self.assertEqual(events(e, methodFrame(1, m)), [(wire.METHOD, 1, m)])


class EncoderTests(unittest.TestCase):
    """The hand-built encoders agree with the generic codec."""

    def test_deliver(self):
        """basic.deliver with one body frame equals the generic encoding."""
        e = openServer()
        hdr = header(3)
        got = e.deliver(1, b"\x02ct", 9, False, b"\x01x\x01k", hdr, b"abc")
        self.assertEqual(got, methodFrame(1, spec.BasicDeliver("ct", 9, False, "x", "k")) + frame(2, 1, hdr)
                         + frame(3, 1, b"abc"))

    def test_deliverSplit(self):
        """A body larger than frame_max - 8 is split in body frames."""
        e = openServer()
        body = b"z" * (131072 * 2)
        got = e.deliver(1, b"\x02ct", 1, True, b"\x00\x01q", header(len(body)), body)
        expected = contentFrames(1, spec.BasicDeliver("ct", 1, True, "", "q").encode(), header(len(body)), body, 131072)
        self.assertEqual(got, expected)
        self.assertEqual(expected.count(b"\x03\x00\x01\x00\x01\xff\xf8"), 2)

    def test_getOk(self):
        """basic.get-ok equals the generic encoding."""
        e = openServer()
        got = e.getOk(1, 3, True, b"\x00\x01q", 42, header(1), b"x")
        self.assertEqual(got, methodFrame(1, spec.BasicGetOk(3, True, "", "q", 42)) + frame(2, 1, header(1))
                         + frame(3, 1, b"x"))

    def test_confirms(self):
        """Runs of acks collapse into one multiple ack; a nack is single."""
        e = openServer()
        self.assertEqual(e.confirms(1, [(1, True), (2, True), (3, False), (4, True)]),
                         methodFrame(1, spec.BasicAck(2, True)) + methodFrame(1, spec.BasicNack(3, False, False))
                         + methodFrame(1, spec.BasicAck(4, True)))
        self.assertEqual(e.confirms(1, [(5, True)]), methodFrame(1, spec.BasicAck(5, False)))

    def test_publish(self):
        """The client's publish encoder is what the server engine decodes."""
        client = ConnectionEngine(CLIENT)
        props = encodeProperties({"content_type": "a/b"})
        out = events(openServer(), client.publish(1, "ex", "rk", props, b"body", mandatory=True))
        self.assertEqual(out, [(wire.MESSAGE, 1, "ex", "rk", True, b"\x02ex\x02rk", props, b"body")])


class HeartbeatTests(unittest.TestCase):
    """Heartbeat deadlines from tick(now)."""

    def test_deadlines(self):
        """Checks every half interval, sends a heartbeat when idle, times out after twice the interval."""
        e = openServer(heartbeat=10)
        self.assertIsNone(e.nextDeadline())
        e.startHeartbeat(0.0)
        self.assertEqual(e.nextDeadline(), 5.0)
        self.assertEqual(e.tick(5.0), HEARTBEAT_FRAME)
        self.assertEqual(e.nextDeadline(), 10.0)
        self.assertIsNone(e.tick(10.0, sent=True))
        e.receiveData(b"", 12.0)
        self.assertEqual(e.tick(15.0, sent=True), HEARTBEAT_FRAME)
        self.assertIsNone(e.tick(20.0, sent=True))
        self.assertEqual(e.tick(30.0, sent=True), HEARTBEAT_FRAME)  # 15 s since the last one
        self.assertEqual(e.tick(32.5, sent=True), wire.TIMED_OUT)
        self.assertIsNone(e.nextDeadline())

    def test_pausedNotTimedOut(self):
        """A connection we do not read is not timed out."""
        e = openServer(heartbeat=10)
        e.startHeartbeat(0.0)
        self.assertNotEqual(e.tick(100.0, readPaused=True), wire.TIMED_OUT)

    def test_noHeartbeat(self):
        """heartbeat 0 has no deadline."""
        e = openServer(heartbeat=0)
        e.startHeartbeat(0.0)
        self.assertIsNone(e.nextDeadline())


class ClosingTests(unittest.TestCase):
    """The closing states of the connection and of a channel."""

    def test_connectionClosing(self):
        """After our close only a crossing close (answered) and close-ok (ends it) are read."""
        e = openServer()
        self.assertEqual(e.closeConnection(320, "CONNECTION_FORCED - bye"),
                         methodFrame(0, spec.ConnectionClose(320, "CONNECTION_FORCED - bye", 0, 0)))
        self.assertIsNone(e.closeConnection(320, "again"))
        self.assertEqual(events(e, methodFrame(1, spec.BasicQos(0, 1, False)) + frame(3, 1, b"x")), [])
        self.assertEqual(events(e, methodFrame(0, spec.ConnectionClose(200, "", 0, 0))),
                         [(wire.SEND, methodFrame(0, spec.ConnectionCloseOk()))])
        self.assertEqual(events(e, methodFrame(0, spec.ConnectionCloseOk())), [(wire.CONNECTION_CLOSE_OK,)])
        self.assertEqual(e.state, wire.CLOSED)

    def test_peerCloses(self):
        """The peer's connection.close closes the engine and close-ok answers it."""
        e = openServer()
        m = spec.ConnectionClose(200, "bye", 0, 0)
        self.assertEqual(events(e, methodFrame(0, m)), [(wire.CONNECTION_CLOSE, m)])
        self.assertEqual(e.state, wire.CLOSING)
        self.assertEqual(e.closeOk(), methodFrame(0, spec.ConnectionCloseOk()))
        self.assertEqual(e.channels, {})

    def test_channelClosing(self):
        """A channel we close drops everything but close-ok and a crossing close."""
        e = openServer()
        events(e, methodFrame(1, spec.BasicPublish(0, "", "q", False, False)))
        self.assertEqual(e.closeChannel(1, 406, "PRECONDITION_FAILED - x", spec.BasicPublish),
                         methodFrame(1, spec.ChannelClose(406, "PRECONDITION_FAILED - x", 60, 40)))
        self.assertIsNone(e.closeChannel(1, 406, "again"))
        self.assertEqual(events(e, frame(2, 1, header(1)) + frame(3, 1, b"x") + methodFrame(1, spec.BasicAck(1, False))), [])
        self.assertEqual(events(e, methodFrame(1, spec.ChannelClose(200, "", 0, 0))),
                         [(wire.SEND, methodFrame(1, spec.ChannelCloseOk()))])
        self.assertEqual(events(e, methodFrame(1, spec.ChannelCloseOk())), [(wire.CHANNEL_CLOSED, 1)])
        self.assertNotIn(1, e.channels)

    def test_peerClosesChannel(self):
        """The peer's channel.close forgets the channel; the number can be opened again."""
        e = openServer()
        m = spec.ChannelClose(200, "", 0, 0)
        self.assertEqual(events(e, methodFrame(1, m)), [(wire.CHANNEL_CLOSE, 1, m)])
        self.assertEqual(e.channelCloseOk(1), methodFrame(1, spec.ChannelCloseOk()))
        self.assertEqual(events(e, methodFrame(1, spec.ChannelOpen(""))), [(wire.CHANNEL_OPEN, 1)])


class FrameReaderTests(unittest.TestCase):
    """The offset frame parser."""

    def test_split(self):
        """Frames split anywhere come out whole, in order."""
        data = frame(1, 1, b"abcd") + frame(3, 2, b"x" * 100000) + frame(8, 0, b"")
        r = FrameReader(131072)
        got = []
        for i in range(0, len(data), 977):
            r.feed(data[i : i + 977])
            while True:
                f = r.nextFrame()
                if f is None:
                    break
                got.append(f)
        self.assertEqual(got, [(1, 1, b"abcd"), (3, 2, b"x" * 100000), (8, 0, b"")])
        self.assertEqual(r.buffered(), 0)

    def test_bufferedWhileGathering(self):
        """A large frame arriving in pieces is counted while it is gathered."""
        r = FrameReader(200000)
        r.feed(frame(3, 1, b"y" * 150000)[:70000])
        self.assertIsNone(r.nextFrame())
        r.feed(b"y" * 10)
        self.assertEqual(r.buffered(), 70010)
