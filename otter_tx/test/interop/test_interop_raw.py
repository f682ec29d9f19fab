"""
Raw-socket interop tests: hand-built AMQP 0-9-1 frames against the broker.

These tests speak the wire protocol directly through a blocking socket run in
a worker thread (:meth:`InteropTestCase.inThread`), with a tiny frame codec
defined in this module (independent of the broker's own codec and of pamqp),
so that malformed input can be produced byte for byte.

Every reply code and reply text asserted here was observed on the RabbitMQ
3.10.8 peer (``OTTER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5682/``).
Notable RabbitMQ behaviours encoded here:

- frame errors are connection.close 501 with class-id/method-id 0/0 and a text
  ``FRAME_ERROR - type T, all octets = <<...>>: REASON`` where the octets are
  the (first 16 octets of the) payload in Erlang binary syntax; the frame size
  is checked as soon as the 7-octet frame header arrives, so an oversized
  frame reports ``all octets = <<>>`` and ``{frame_too_large,SIZE,FRAMEMAX-8}``;
- the channel-max limit counts open channels (530 NOT_ALLOWED when one more
  would exceed it); RabbitMQ 3.10 does not reject a channel *number* above
  channel-max, so that is not tested here;
- errors during the handshake (bad password without the
  ``authentication_failure_close`` capability, unacceptable tune-ok values,
  unknown mechanism) close the socket without a connection.close frame;
- the heartbeat timeout and the handshake timeout close the socket without
  a connection.close frame;
- 'AMQP\x01\x01\x00\x09' (0-9) gets a 0-9 connection.start and works as
  0-9-1; 'AMQP\x01\x01\x09\x01' gets an AMQP 0-8 connection.start (version
  8-0, no capabilities table); any other header gets the 0-9-1 header back;
- an unknown method class/id crashes RabbitMQ's reader, which drops the
  socket without connection.close (we only require that the connection
  ends and the broker keeps serving).

Source: AMQP 0-9-1 specification section 4.2 (framing) and RabbitMQ 3.10.8
``rabbit_reader.erl`` / ``rabbit_command_assembler.erl``.
"""

import socket
import struct
import time

from twisted.internet import defer

from otter_tx.test.interop.support import EXTERNAL, InteropTestCase

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

# (class-id, method-id) of the methods used here
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_PUBLISH = (60, 40)
BASIC_DELIVER = (60, 60)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)

#: the capabilities RabbitMQ 3.10 advertises that issue 2 asks us to support
CAPABILITIES = (
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
)


# -- a tiny codec ------------------------------------------------------------


def shortstr(s):
    """
    Encode ``s`` (str or bytes) as an AMQP short string.
    """
    if isinstance(s, str):
        s = s.encode("utf-8")
    return struct.pack(">B", len(s)) + s


def longstr(s):
    """
    Encode ``s`` (str or bytes) as an AMQP long string.
    """
    if isinstance(s, str):
        s = s.encode("utf-8")
    return struct.pack(">I", len(s)) + s


def fieldValue(v):
    """
    Encode one field-table value (bool, int, str/bytes or dict only).
    """
    if isinstance(v, bool):
        return b"t" + struct.pack(">B", v)
    if isinstance(v, int):
        return b"l" + struct.pack(">q", v)
    if isinstance(v, dict):
        return b"F" + table(v)
    return b"S" + longstr(v)


def table(d):
    """
    Encode a dict as an AMQP field table.
    """
    body = b"".join(shortstr(k) + fieldValue(v) for k, v in d.items())
    return struct.pack(">I", len(body)) + body


def frame(frameType, channel, payload, end=FRAME_END):
    """
    Encode one frame; ``end`` may be changed to build a malformed frame.
    """
    return (
        struct.pack(">BHI", frameType, channel, len(payload))
        + payload
        + struct.pack(">B", end)
    )


def method(channel, classMethod, args=b""):
    """
    Encode a method frame for ``classMethod`` (class-id, method-id).
    """
    return frame(FRAME_METHOD, channel, struct.pack(">HH", *classMethod) + args)


def contentHeader(channel, bodySize, classId=60):
    """
    Encode a content header frame without properties.
    """
    return frame(
        FRAME_HEADER, channel, struct.pack(">HHQH", classId, 0, bodySize, 0)
    )


def heartbeat(channel=0):
    """
    Encode a heartbeat frame.
    """
    return frame(FRAME_HEARTBEAT, channel, b"")


def startOk(
    clientProperties=None,
    mechanism="PLAIN",
    response=b"\x00guest\x00guest",
    locale="en_US",
):
    """
    Encode connection.start-ok.
    """
    if clientProperties is None:
        clientProperties = {
            "product": "otter_tx raw test",
            "capabilities": {
                "consumer_cancel_notify": True,
                "authentication_failure_close": True,
            },
        }
    return method(
        0,
        CONNECTION_START_OK,
        table(clientProperties)
        + shortstr(mechanism)
        + longstr(response)
        + shortstr(locale),
    )


def tuneOk(channelMax, frameMax, heartbeatInterval):
    """
    Encode connection.tune-ok.
    """
    return method(
        0,
        CONNECTION_TUNE_OK,
        struct.pack(">HIH", channelMax, frameMax, heartbeatInterval),
    )


def connectionOpen(vhost="/"):
    """
    Encode connection.open.
    """
    return method(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00")


def channelOpen(channel):
    """
    Encode channel.open (reserved short string empty: payload 0,20,0,10,0).
    """
    return method(channel, CHANNEL_OPEN, shortstr(""))


def queueDeclare(channel, name="", exclusive=True):
    """
    Encode queue.declare (auto-delete and exclusive by default).
    """
    bits = 0
    if exclusive:
        bits |= 4 | 8  # exclusive, auto-delete
    return method(
        channel,
        QUEUE_DECLARE,
        struct.pack(">H", 0) + shortstr(name) + struct.pack(">B", bits) + table({}),
    )


def basicPublish(channel, exchange="", routingKey="", mandatory=False,
                 immediate=False):
    """
    Encode basic.publish.
    """
    bits = (1 if mandatory else 0) | (2 if immediate else 0)
    return method(
        channel,
        BASIC_PUBLISH,
        struct.pack(">H", 0)
        + shortstr(exchange)
        + shortstr(routingKey)
        + struct.pack(">B", bits),
    )


def basicGet(channel, queue, noAck=True):
    """
    Encode basic.get.
    """
    return method(
        channel,
        BASIC_GET,
        struct.pack(">H", 0) + shortstr(queue) + struct.pack(">B", int(noAck)),
    )


class _Reader:
    """
    Offset-based decoder over one method payload's arguments.
    """

    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        v = self.data[self.pos:self.pos + n]
        if len(v) != n:
            raise ValueError("truncated")
        self.pos += n
        return v

    def unpack(self, fmt):
        v = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return v[0] if len(v) == 1 else v

    def shortstr(self):
        return self.take(self.unpack(">B")).decode("utf-8")

    def longstr(self):
        return self.take(self.unpack(">I"))

    def table(self):
        end = self.pos + 4 + self.unpack(">I")
        result = {}
        while self.pos < end:
            key = self.shortstr()
            result[key] = self.value()
        return result

    def value(self):
        tag = self.take(1)
        simple = {
            b"t": ">B", b"b": ">b", b"B": ">B", b"s": ">h", b"u": ">H",
            b"I": ">i", b"i": ">I", b"l": ">q", b"L": ">q", b"f": ">f",
            b"d": ">d", b"T": ">Q",
        }
        if tag in simple:
            v = self.unpack(simple[tag])
            return bool(v) if tag == b"t" else v
        if tag == b"S":
            return self.longstr().decode("utf-8")
        if tag == b"x":
            return self.longstr()
        if tag == b"D":
            return self.unpack(">Bi")
        if tag == b"F":
            return self.table()
        if tag == b"A":
            end = self.pos + 4 + self.unpack(">I")
            items = []
            while self.pos < end:
                items.append(self.value())
            return items
        if tag == b"V":
            return None
        raise ValueError("unknown field type %r" % (tag,))


class Frame:
    """
    One decoded frame: ``type``, ``channel``, ``payload`` and, for method
    frames, ``classMethod`` and an argument reader ``args``.
    """

    def __init__(self, frameType, channel, payload):
        self.type = frameType
        self.channel = channel
        self.payload = payload
        self.classMethod = None
        if frameType == FRAME_METHOD:
            self.classMethod = struct.unpack(">HH", payload[:4])
            self.args = _Reader(payload[4:])

    def __repr__(self):
        return "<Frame type=%d channel=%d method=%r payload=%r>" % (
            self.type, self.channel, self.classMethod, self.payload[:60])


class ConnectionClosed(Exception):
    """
    The broker closed the socket (EOF or reset).
    """


class RawConnection:
    """
    A blocking socket to the broker with frame reading helpers.  Call only
    from a worker thread.
    """

    def __init__(self, host, port, timeout=10):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = bytearray()
        self.eof = False

    def send(self, data):
        self.sock.sendall(data)

    def close(self):
        self.sock.close()

    def _fill(self, deadline):
        if self.eof:
            raise ConnectionClosed()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out waiting for the broker")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise ConnectionClosed()
        self.buf += data

    def readExactly(self, n, timeout=5):
        """
        Return the next ``n`` bytes from the socket.
        """
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            self._fill(deadline)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def readFrame(self, timeout=5, skipHeartbeats=True):
        """
        Return the next :class:`Frame` (heartbeats skipped unless asked).
        """
        deadline = time.monotonic() + timeout
        while True:
            frameType, channel, size = struct.unpack(
                ">BHI", self.readExactly(7, deadline - time.monotonic()))
            payload = self.readExactly(size + 1, deadline - time.monotonic())
            if payload[-1] != FRAME_END:
                raise AssertionError("bad frame end from broker: %r" % payload)
            f = Frame(frameType, channel, payload[:-1])
            if skipHeartbeats and frameType == FRAME_HEARTBEAT:
                continue
            return f

    def readMethod(self, expected, channel=None, timeout=5):
        """
        Read the next frame and check that it is method ``expected`` (on
        ``channel`` when given); return it.
        """
        f = self.readFrame(timeout)
        if f.classMethod != expected:
            raise AssertionError("expected method %r, got %r (%r)" % (
                expected, f, closeArgs(f) if f.classMethod == CONNECTION_CLOSE
                else ""))
        if channel is not None and f.channel != channel:
            raise AssertionError("expected channel %d, got %r" % (channel, f))
        return f

    def waitClosed(self, timeout):
        """
        Read and collect everything until the broker closes the socket;
        return ``(bytesReceived, secondsWaited)``.  Raise ``socket.timeout``
        if it stays open for ``timeout`` seconds.
        """
        start = time.monotonic()
        deadline = start + timeout
        try:
            while True:
                self._fill(deadline)
        except ConnectionClosed:
            pass
        data = bytes(self.buf)
        del self.buf[:]
        return data, time.monotonic() - start


def parseFrames(data):
    """
    Split complete frames out of ``data``; return a list of :class:`Frame`.
    """
    frames = []
    pos = 0
    while len(data) - pos >= 8:
        frameType, channel, size = struct.unpack(">BHI", data[pos:pos + 7])
        if len(data) - pos < size + 8:
            break
        frames.append(Frame(frameType, channel, data[pos + 7:pos + 7 + size]))
        pos += size + 8
    return frames


def closeArgs(f):
    """
    Decode a connection.close / channel.close frame into
    ``(replyCode, replyText, classId, methodId)``.
    """
    r = _Reader(f.payload[4:])
    return (r.unpack(">H"), r.shortstr(), r.unpack(">H"), r.unpack(">H"))


def decodeStart(f):
    """
    Decode connection.start into a dict.
    """
    r = f.args
    major, minor = r.unpack(">BB")
    return {
        "version": (major, minor),
        "serverProperties": r.table(),
        "mechanisms": r.longstr().decode("utf-8"),
        "locales": r.longstr().decode("utf-8"),
    }


def decodeTune(f):
    """
    Decode connection.tune into ``(channelMax, frameMax, heartbeat)``.
    """
    return f.args.unpack(">HIH")


# -- test base ---------------------------------------------------------------


class RawTestMixin:
    """
    Helpers for raw-protocol tests (mixed into :class:`InteropTestCase`).
    """

    def connect(self, timeout=10):
        """
        Open a raw socket to the broker (worker thread only).
        """
        return RawConnection(self.host, self.port, timeout)

    def handshake(self, conn, channelMax=None, frameMax=None,
                  heartbeatInterval=0, header=PROTOCOL_HEADER,
                  clientProperties=None):
        """
        Run the handshake up to connection.open-ok; return ``(start, tune)``
        where ``start`` is the decoded connection.start dict and ``tune`` the
        broker's proposal.  ``None`` accepts the broker's proposal.
        """
        conn.send(header)
        start = decodeStart(conn.readMethod(CONNECTION_START, 0))
        conn.send(startOk(clientProperties))
        tune = decodeTune(conn.readMethod(CONNECTION_TUNE, 0))
        conn.send(tuneOk(
            tune[0] if channelMax is None else channelMax,
            tune[1] if frameMax is None else frameMax,
            heartbeatInterval))
        conn.send(connectionOpen("/"))
        conn.readMethod(CONNECTION_OPEN_OK, 0)
        return start, tune

    def openChannel(self, conn, channel=1):
        """
        Open ``channel`` and wait for channel.open-ok.
        """
        conn.send(channelOpen(channel))
        conn.readMethod(CHANNEL_OPEN_OK, channel)

    def ready(self, **kw):
        """
        A connected, opened RawConnection with channel 1 open.
        """
        conn = self.connect()
        self.addCleanup(conn.close)
        self.handshake(conn, **kw)
        self.openChannel(conn, 1)
        return conn

    def assertConnectionClose(self, conn, code, text, classId, methodId,
                              timeout=5):
        """
        Read frames until connection.close; check its code, text and the
        failing method ids; answer close-ok and check that the broker then
        closes the socket.
        """
        deadline = time.monotonic() + timeout
        while True:
            f = conn.readFrame(deadline - time.monotonic())
            if f.classMethod == CONNECTION_CLOSE:
                break
        self.assertEqual(f.channel, 0)
        self.assertEqual(closeArgs(f), (code, text, classId, methodId))
        try:
            conn.send(method(0, CONNECTION_CLOSE_OK))
        except OSError:
            pass  # the broker may already have closed the socket
        conn.waitClosed(5)

    def assertAlive(self, conn, channel=1):
        """
        Check that ``conn`` still works: declare a server-named exclusive
        queue on ``channel`` and get declare-ok.
        """
        conn.send(queueDeclare(channel))
        f = conn.readMethod(QUEUE_DECLARE_OK, channel)
        name = f.args.shortstr()
        self.assertTrue(name.startswith("amq.gen-"), name)

    def assertFreshConnectionWorks(self):
        """
        A brand-new connection completes the handshake and opens a channel.
        """
        conn = self.connect()
        try:
            self.handshake(conn)
            self.openChannel(conn, 1)
            self.assertAlive(conn, 1)
        finally:
            conn.close()

    def inParallel(self, *functions):
        """
        Run each blocking function in its own worker thread; fire with the
        list of their results once all are done (first failure wins).
        """
        ds = [self.inThread(f) for f in functions]
        d = defer.gatherResults(ds, consumeErrors=True)
        d.addErrback(lambda f: f.value.subFailure)
        return d


class ProtocolHeaderTests(RawTestMixin, InteropTestCase):
    """
    Protocol header negotiation and connection.start contents.
    """

    def test_connectionStart(self):
        """
        The 0-9-1 header gets connection.start 0-9 with PLAIN AMQPLAIN, en_US
        and RabbitMQ's capability table.
        """
        def scenario():
            conn = self.connect()
            try:
                conn.send(PROTOCOL_HEADER)
                f = conn.readMethod(CONNECTION_START, 0)
                start = decodeStart(f)
                self.assertEqual(start["version"], (0, 9))
                self.assertEqual(start["mechanisms"], "PLAIN AMQPLAIN")
                self.assertEqual(start["locales"], "en_US")
                props = start["serverProperties"]
                for key in ("product", "version", "platform"):
                    self.assertIsInstance(props.get(key), str, key)
                caps = props["capabilities"]
                for cap in CAPABILITIES:
                    self.assertIs(caps.get(cap), True, cap)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_handshake(self):
        """
        start-ok, tune-ok and open (vhost '/') get connection.open-ok and a
        channel opens.
        """
        def scenario():
            conn = self.connect()
            try:
                self.handshake(conn)
                self.openChannel(conn, 1)
                self.assertAlive(conn, 1)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_amqplainMechanism(self):
        """
        AMQPLAIN credentials (a field table without its length prefix) log in.
        """
        def scenario():
            conn = self.connect()
            try:
                conn.send(PROTOCOL_HEADER)
                conn.readMethod(CONNECTION_START, 0)
                response = table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
                conn.send(method(
                    0, CONNECTION_START_OK,
                    table({}) + shortstr("AMQPLAIN") + longstr(response)
                    + shortstr("en_US")))
                channelMax, frameMax, _ = decodeTune(
                    conn.readMethod(CONNECTION_TUNE, 0))
                conn.send(tuneOk(channelMax, frameMax, 0))
                conn.send(connectionOpen("/"))
                conn.readMethod(CONNECTION_OPEN_OK, 0)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_tuneDefaults(self):
        """
        connection.tune proposes RabbitMQ's defaults: channel_max 2047,
        frame_max 131072, heartbeat 60.
        """
        def scenario():
            conn = self.connect()
            try:
                _, tune = self.handshake(conn)
                self.assertEqual(tune, (2047, 131072, 60))
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_header0_9(self):
        """
        The AMQP 0-9 header 'AMQP\\x01\\x01\\x00\\x09' (txAMQP's 0-9 spec) is
        answered with connection.start 0-9 and the connection works.
        """
        def scenario():
            conn = self.connect()
            try:
                start, _ = self.handshake(conn, header=b"AMQP\x01\x01\x00\x09")
                self.assertEqual(start["version"], (0, 9))
                self.assertIs(
                    start["serverProperties"]["capabilities"]["basic.nack"],
                    True)
                self.openChannel(conn, 1)
                self.assertAlive(conn, 1)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_header0_8Style(self):
        """
        The older header 'AMQP\\x01\\x01\\x09\\x01' is answered with a
        connection.start on channel 0 offering PLAIN (RabbitMQ reports
        version 8-0 there).
        """
        def scenario():
            conn = self.connect()
            try:
                conn.send(b"AMQP\x01\x01\x09\x01")
                start = decodeStart(conn.readMethod(CONNECTION_START, 0))
                self.assertIn("PLAIN", start["mechanisms"].split())
                self.assertEqual(start["locales"], "en_US")
            finally:
                conn.close()

        return self.inThread(scenario)

    def _assertBadHeader(self, header):
        def scenario():
            conn = self.connect()
            try:
                conn.send(header)
                data, _ = conn.waitClosed(5)
                self.assertEqual(data, PROTOCOL_HEADER)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_badHeaderVersion(self):
        """
        'AMQP\\x00\\x00\\x0a\\x00' gets the 0-9-1 header back and the socket
        is closed.
        """
        return self._assertBadHeader(b"AMQP\x00\x00\x0a\x00")

    def test_badHeader0_9_0(self):
        """
        'AMQP\\x00\\x00\\x09\\x00' (0-9-0 in 0-9-1 style) is refused with the
        0-9-1 header.
        """
        return self._assertBadHeader(b"AMQP\x00\x00\x09\x00")

    def test_badHeaderHTTP(self):
        """
        An HTTP request line gets the 0-9-1 header back and the socket closed.
        """
        return self._assertBadHeader(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    def test_badPasswordWithCapability(self):
        """
        A wrong password from a client advertising authentication_failure_close
        gets connection.close 403 ACCESS_REFUSED with RabbitMQ's text.
        """
        def scenario():
            conn = self.connect()
            try:
                conn.send(PROTOCOL_HEADER)
                conn.readMethod(CONNECTION_START, 0)
                conn.send(startOk(
                    {"capabilities": {"authentication_failure_close": True}},
                    response=b"\x00guest\x00wrong-password"))
                self.assertConnectionClose(
                    conn, 403,
                    "ACCESS_REFUSED - Login was refused using authentication "
                    "mechanism PLAIN. For details see the broker logfile.",
                    0, 0, timeout=10)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_handshakeFailuresCloseSocket(self):
        """
        A wrong password without authentication_failure_close, an unknown
        mechanism, and tune-ok values above the broker's limits each get the
        socket closed without connection.open-ok.
        """
        def badLogin(mechanism, response):
            def scenario():
                conn = self.connect()
                try:
                    conn.send(PROTOCOL_HEADER)
                    conn.readMethod(CONNECTION_START, 0)
                    conn.send(startOk({}, mechanism, response))
                    data, _ = conn.waitClosed(10)
                    # RabbitMQ sends nothing; a connection.close is tolerated
                    # but never a tune.
                    self.assertNotIn(b"\x00\x0a\x00\x1e", data[7:11])
                finally:
                    conn.close()
            return scenario

        def badTune(channelMax, frameMax):
            def scenario():
                conn = self.connect()
                try:
                    conn.send(PROTOCOL_HEADER)
                    conn.readMethod(CONNECTION_START, 0)
                    conn.send(startOk())
                    conn.readMethod(CONNECTION_TUNE, 0)
                    conn.send(tuneOk(channelMax, frameMax, 0))
                    data, _ = conn.waitClosed(10)
                    self.assertNotIn(struct.pack(">HH", *CONNECTION_OPEN_OK),
                                     data)
                finally:
                    conn.close()
            return scenario

        return self.inParallel(
            badLogin("PLAIN", b"\x00guest\x00wrong-password"),
            badLogin("EXTERNAL", b""),
            badTune(0, 131072),          # channel_max 0 = unlimited > 2047
            badTune(2047, 1048576),      # frame_max above the broker's
            badTune(2047, 4095),         # below the spec minimum 4096
        )


class FrameErrorTests(RawTestMixin, InteropTestCase):
    """
    Malformed frames and frames out of sequence close the connection with
    RabbitMQ's hard-error codes and texts.
    """

    def test_frameTooLarge(self):
        """
        A frame header announcing more than the negotiated frame_max (4096)
        gets 501 FRAME_ERROR {frame_too_large,8192,4088} at once.
        """
        def scenario():
            conn = self.ready(frameMax=4096)
            # only the frame header: the size must be checked on arrival
            conn.send(struct.pack(">BHI", FRAME_BODY, 1, 8192))
            self.assertConnectionClose(
                conn, 501,
                "FRAME_ERROR - type 3, all octets = <<>>: "
                "{frame_too_large,8192,4088}", 0, 0)

        return self.inThread(scenario)

    def test_methodFrameTooLargeDefault(self):
        """
        A method frame header over the default frame_max 131072 gets 501
        FRAME_ERROR {frame_too_large,200000,131064}.
        """
        def scenario():
            conn = self.ready()
            conn.send(struct.pack(">BHI", FRAME_METHOD, 1, 200000)
                      + b"\x00\x3c\x00\x28")
            self.assertConnectionClose(
                conn, 501,
                "FRAME_ERROR - type 1, all octets = <<>>: "
                "{frame_too_large,200000,131064}", 0, 0)

        return self.inThread(scenario)

    def test_badFrameEnd(self):
        """
        A frame whose end octet is 0x00 instead of 0xCE gets 501 FRAME_ERROR
        {invalid_frame_end_marker,0}.
        """
        def scenario():
            conn = self.ready()
            conn.send(method(2, CHANNEL_OPEN, shortstr(""))[:-1] + b"\x00")
            self.assertConnectionClose(
                conn, 501,
                "FRAME_ERROR - type 1, all octets = <<0,20,0,10,0>>: "
                "{invalid_frame_end_marker,0}", 0, 0)

        return self.inThread(scenario)

    def test_unknownFrameType(self):
        """
        A frame of type 9 gets 501 FRAME_ERROR unknown_frame.
        """
        def scenario():
            conn = self.ready()
            conn.send(frame(9, 1, b"abcd"))
            self.assertConnectionClose(
                conn, 501,
                'FRAME_ERROR - type 9, all octets = <<"abcd">>: unknown_frame',
                0, 0)

        return self.inThread(scenario)

    def test_truncatedMethodArguments(self):
        """
        A queue.declare whose arguments stop after the reserved short gets 501
        FRAME_ERROR 'cannot decode' naming queue.declare.
        """
        def scenario():
            conn = self.ready()
            conn.send(method(1, QUEUE_DECLARE, b"\x00\x00"))
            self.assertConnectionClose(
                conn, 501, "FRAME_ERROR - cannot decode <<0,0>>", 50, 10)

        return self.inThread(scenario)

    def test_garbageAfterHandshake(self):
        """
        Garbage bytes after the handshake are read as an oversized frame
        header: 501 FRAME_ERROR frame_too_large.
        """
        def scenario():
            conn = self.ready()
            conn.send(b"\xde\xad\xbe\xef" * 10)
            self.assertConnectionClose(
                conn, 501,
                "FRAME_ERROR - type 222, all octets = <<>>: "
                "{frame_too_large,4024348094,131064}", 0, 0)

        return self.inThread(scenario)

    def test_tooManyChannels(self):
        """
        Opening a third channel with channel_max 2 negotiated gets 530
        NOT_ALLOWED naming the count and the limit.
        """
        def scenario():
            conn = self.ready(channelMax=2)
            self.openChannel(conn, 2)
            conn.send(channelOpen(3))
            self.assertConnectionClose(
                conn, 530,
                "NOT_ALLOWED - number of channels opened (2) has reached the "
                "negotiated channel_max (2)", 0, 0)

        return self.inThread(scenario)

    def test_contentHeaderWithoutPublish(self):
        """
        A content header frame with no basic.publish before it gets 505
        UNEXPECTED_FRAME.
        """
        def scenario():
            conn = self.ready()
            conn.send(contentHeader(1, 5))
            self.assertConnectionClose(
                conn, 505,
                "UNEXPECTED_FRAME - expected method frame, got non method "
                "frame instead", 0, 0)

        return self.inThread(scenario)

    def test_bodyWithoutPublish(self):
        """
        A body frame with no basic.publish before it gets 505 UNEXPECTED_FRAME.
        """
        def scenario():
            conn = self.ready()
            conn.send(frame(FRAME_BODY, 1, b"hello"))
            self.assertConnectionClose(
                conn, 505,
                "UNEXPECTED_FRAME - expected method frame, got non method "
                "frame instead", 0, 0)

        return self.inThread(scenario)

    def test_methodInsteadOfContentHeader(self):
        """
        A method frame where basic.publish's content header should follow gets
        505 UNEXPECTED_FRAME naming class 60 and basic.publish.
        """
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere") + queueDeclare(1))
            self.assertConnectionClose(
                conn, 505,
                "UNEXPECTED_FRAME - expected content header for class 60, got "
                "non content header frame instead", 60, 40)

        return self.inThread(scenario)

    def test_heartbeatOnChannel(self):
        """
        A heartbeat frame on a non-zero channel gets 505 UNEXPECTED_FRAME.
        """
        def scenario():
            conn = self.ready()
            conn.send(heartbeat(1))
            self.assertConnectionClose(
                conn, 505, "UNEXPECTED_FRAME - type 8, all octets = <<>>",
                0, 0)

        return self.inThread(scenario)

    def test_methodOnUnopenedChannel(self):
        """
        queue.declare on a channel that was never opened gets 504
        CHANNEL_ERROR expected 'channel.open'.
        """
        def scenario():
            conn = self.ready()
            conn.send(queueDeclare(3))
            self.assertConnectionClose(
                conn, 504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)

        return self.inThread(scenario)

    def test_secondChannelOpen(self):
        """
        channel.open on an already open channel gets 504 CHANNEL_ERROR.
        """
        def scenario():
            conn = self.ready()
            conn.send(channelOpen(1))
            self.assertConnectionClose(
                conn, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)

        return self.inThread(scenario)

    def test_channelMethodOnChannelZero(self):
        """
        A non-connection method on channel 0 gets 504 CHANNEL_ERROR.
        """
        def scenario():
            conn = self.ready()
            conn.send(queueDeclare(0))
            self.assertConnectionClose(
                conn, 504,
                "CHANNEL_ERROR - unexpected method in connection state running",
                50, 10)

        return self.inThread(scenario)

    def test_immediatePublish(self):
        """
        basic.publish with immediate=true gets 540 NOT_IMPLEMENTED.
        """
        def scenario():
            conn = self.ready()
            conn.send(basicPublish(1, "", "nowhere", immediate=True)
                      + contentHeader(1, 2) + frame(FRAME_BODY, 1, b"hi"))
            self.assertConnectionClose(
                conn, 540, "NOT_IMPLEMENTED - immediate=true", 60, 40)

        return self.inThread(scenario)

    def test_unknownMethod(self):
        """
        A method frame for an unknown class closes the connection (RabbitMQ
        drops the socket; a 5xx connection.close is accepted) and the broker
        keeps serving new connections.
        """
        def scenario():
            conn = self.ready()
            conn.send(method(1, (99, 10)))
            try:
                f = conn.readFrame(5)
            except ConnectionClosed:
                pass
            else:
                # a connection.close is answered, as a client would
                self.assertEqual(f.classMethod, CONNECTION_CLOSE)
                self.assertIn(closeArgs(f)[0], (503, 540))
                conn.send(method(0, CONNECTION_CLOSE_OK))
            conn.waitClosed(5)
            self.assertFreshConnectionWorks()

        return self.inThread(scenario)

    def test_publishSplitOverBodyFrames(self):
        """
        A message published as header plus three body frames is delivered
        whole (basic.get) on the same raw connection.
        """
        def scenario():
            conn = self.ready(frameMax=4096)
            conn.send(queueDeclare(1))
            queue = conn.readMethod(QUEUE_DECLARE_OK, 1).args.shortstr()
            body = bytes(range(256)) * 40  # 10240 octets, over frame_max
            parts = [body[i:i + 4000] for i in range(0, len(body), 4000)]
            conn.send(basicPublish(1, "", queue) + contentHeader(1, len(body))
                      + b"".join(frame(FRAME_BODY, 1, p) for p in parts))
            conn.send(basicGet(1, queue))
            conn.readMethod(BASIC_GET_OK, 1)
            header = conn.readFrame()
            self.assertEqual(header.type, FRAME_HEADER)
            self.assertEqual(struct.unpack(">HHQ", header.payload[:12])[2],
                             len(body))
            received = b""
            while len(received) < len(body):
                f = conn.readFrame()
                self.assertEqual(f.type, FRAME_BODY)
                self.assertLessEqual(len(f.payload), 4096 - 8)
                received += f.payload
            self.assertEqual(received, body)

        return self.inThread(scenario)

    def test_garbageDoesNotAffectOtherConnections(self):
        """
        A connection sending garbage (before and after the handshake) is
        closed while another open connection keeps working.
        """
        def scenario():
            good = self.ready()
            bad1 = self.connect()
            bad2 = self.ready()
            try:
                bad1.send(b"\x00\xff" * 64)
                data, _ = bad1.waitClosed(5)
                self.assertEqual(data, PROTOCOL_HEADER)
                bad2.send(b"\xde\xad\xbe\xef" * 10)
                self.assertConnectionClose(
                    bad2, 501,
                    "FRAME_ERROR - type 222, all octets = <<>>: "
                    "{frame_too_large,4024348094,131064}", 0, 0)
                self.assertAlive(good, 1)
                self.openChannel(good, 2)
                self.assertAlive(good, 2)
                self.assertFreshConnectionWorks()
            finally:
                bad1.close()

        return self.inThread(scenario)


class HeartbeatTests(RawTestMixin, InteropTestCase):
    """
    Heartbeats both ways with a negotiated interval of 1 s.
    """

    brokerOptions = {"heartbeat": 1}

    def test_brokerSendsHeartbeats(self):
        """
        With heartbeat 1 negotiated the broker sends heartbeat frames on
        channel 0 and keeps a client that sends heartbeats open.
        """
        def scenario():
            conn = self.connect()
            try:
                _, tune = self.handshake(conn, heartbeatInterval=1)
                if not EXTERNAL:
                    self.assertEqual(tune[2], 1)
                beats = 0
                deadline = time.monotonic() + 3.5
                nextBeat = time.monotonic()
                while time.monotonic() < deadline:
                    if time.monotonic() >= nextBeat:
                        conn.send(heartbeat(0))
                        nextBeat += 0.4
                    try:
                        f = conn.readFrame(0.2, skipHeartbeats=False)
                    except socket.timeout:
                        continue
                    self.assertEqual((f.type, f.channel, f.payload),
                                     (FRAME_HEARTBEAT, 0, b""))
                    beats += 1
                self.assertGreaterEqual(beats, 2)
                self.openChannel(conn, 1)
                self.assertAlive(conn, 1)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_silentClientIsClosed(self):
        """
        A client that negotiates heartbeat 1 and then sends nothing is
        disconnected after about two missed intervals (RabbitMQ: ~3 s).
        """
        def scenario():
            conn = self.connect()
            try:
                self.handshake(conn, heartbeatInterval=1)
                data, waited = conn.waitClosed(8)
                self.assertGreaterEqual(waited, 1.0)
                # nothing but heartbeats (and at most a connection.close)
                self.assertTrue(data.startswith(heartbeat(0)) or not data
                                or data[7:11] == b"\x00\x0a\x00\x32", data)
            finally:
                conn.close()

        return self.inThread(scenario)

    def test_silentClientDoesNotAffectOthers(self):
        """
        While a silent client is being timed out another connection that
        heartbeats stays open.
        """
        def silent():
            conn = self.connect()
            try:
                self.handshake(conn, heartbeatInterval=1)
                conn.waitClosed(8)
            finally:
                conn.close()

        def chatty():
            conn = self.connect()
            try:
                self.handshake(conn, heartbeatInterval=1)
                self.openChannel(conn, 1)
                end = time.monotonic() + 4
                while time.monotonic() < end:
                    conn.send(heartbeat(0))
                    time.sleep(0.3)
                self.assertAlive(conn, 1)
            finally:
                conn.close()

        return self.inParallel(silent, chatty)


class HandshakeTimeoutTests(RawTestMixin, InteropTestCase):
    """
    A client that connects and says nothing is dropped after the handshake
    timeout (RabbitMQ: 10 s; otter_tx here: 1 s) and blocks nobody.
    """

    brokerOptions = {"handshakeTimeout": 1}

    def test_silentSocketsAreDropped(self):
        """
        A socket that sends nothing, one that sends half a header and one that
        stops after the protocol header are all closed by the broker, while a
        normal client connects meanwhile.
        """
        limit = 15 if EXTERNAL else 5

        def silent(prefix):
            def scenario():
                conn = self.connect(timeout=limit + 5)
                try:
                    if prefix:
                        conn.send(prefix)
                    data, waited = conn.waitClosed(limit)
                    if prefix == PROTOCOL_HEADER:
                        self.assertEqual(data[7:11], b"\x00\x0a\x00\x0a")
                    else:
                        self.assertEqual(data, b"")
                    self.assertGreaterEqual(waited, 0.5)
                finally:
                    conn.close()
            return scenario

        def normal():
            time.sleep(0.2)
            start = time.monotonic()
            self.assertFreshConnectionWorks()
            self.assertLess(time.monotonic() - start, 2)

        return self.inParallel(
            silent(b""), silent(b"AM"), silent(PROTOCOL_HEADER), normal)

