"""
otter_tx.door.stream on StringTransport and task.Clock: the handshake,
streams, publishers (confirms, de-duplication), subscriptions (offset
specifications, credit, chunks), offsets, super streams, single active
consumer, heartbeats and back-pressure.
"""

import struct
import zlib

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.broker.broker import Broker
from otter_tx.door import stream as door
from otter_tx.door.streambackend import MemoryStreams
from otter_tx.stream import chunk, wire


class Client:
    """One stream connection driven by hand."""

    def __init__(self, factory, clock):
        self.clock = clock
        self.proto = factory.buildProtocol(None)
        self.transport = StringTransport(peerAddress=_Addr("127.0.0.1", 40000),
                                         hostAddress=_Addr("127.0.0.1", 5552))
        self.proto.makeConnection(self.transport)
        self.reader = wire.FrameReader(0)
        self.frames = []
        self.corr = 0

    def feed(self, data):
        self.proto.dataReceived(data)

    def read(self):
        """Every frame written since the last read: list of (key, version, body after them)."""
        data = self.transport.value()
        self.transport.clear()
        for body in self.reader.feed(data):
            k, v = struct.unpack_from(">HH", body)
            self.frames.append((k, v, bytes(body[4:])))
        out, self.frames = self.frames, []
        return out

    def call(self, key, payload=b""):
        """Send a request; ``(code, rest)`` of its response."""
        self.corr += 1
        self.feed(wire.request(key, self.corr, payload))
        frames = self.read()
        for i, (k, v, body) in enumerate(frames):
            if k == key | wire.RESPONSE_FLAG:
                corr, code = struct.unpack_from(">IH", body)
                assert corr == self.corr
                self.frames = frames[:i] + frames[i + 1:]
                return code, body[6:]
        raise AssertionError("no response to %d" % key)

    def handshake(self, user="guest", password="guest", vhost="/", frameMax=1048576, heartbeat=0):
        self.call(wire.PEER_PROPERTIES, wire.encodeStringMap({"product": "test"}))
        self.call(wire.SASL_HANDSHAKE)
        sasl = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.corr += 1
        self.feed(wire.request(wire.SASL_AUTHENTICATE, self.corr,
                               wire.encodeString("PLAIN") + struct.pack(">I", len(sasl)) + sasl))
        frames = self.read()
        code = struct.unpack_from(">IH", frames[0][2])[1]
        if code != wire.OK:
            return code
        assert frames[1][0] == wire.TUNE
        self.feed(struct.pack(">IHHII", 12, wire.TUNE | wire.RESPONSE_FLAG, 1, frameMax, heartbeat))
        return self.call(wire.OPEN, wire.encodeString(vhost))[0]

    def create(self, name, args=None):
        return self.call(wire.CREATE_STREAM, wire.encodeString(name) + wire.encodeStringMap(args or {}))[0]

    def declarePublisher(self, pid, ref, stream):
        return self.call(wire.DECLARE_PUBLISHER,
                         bytes((pid,)) + wire.encodeString(ref) + wire.encodeString(stream))[0]

    def subscribe(self, sid, stream, spec=(wire.OFFSET_FIRST, None), credit=10, props=None):
        return self.call(wire.SUBSCRIBE, bytes((sid,)) + wire.encodeString(stream) + wire.offsetSpec(*spec)
                         + struct.pack(">H", credit) + wire.encodeStringMap(props or {}))[0]

    def deliveries(self):
        """``[(subscriptionId, firstOffset, [messages])]`` after the reactor turn."""
        self.clock.advance(0)
        out = []
        for k, v, body in self.read():
            if k == wire.DELIVER:
                first, ts, msgs = chunk.parse(body[1:])
                out.append((body[0], first, msgs))
            else:
                self.frames.append((k, v, body))
        return out


class _Addr:
    def __init__(self, host, port):
        self.host = host
        self.port = port


def confirms(frames):
    out = []
    for k, v, body in frames:
        if k == wire.PUBLISH_CONFIRM:
            (n,) = struct.unpack_from(">I", body, 1)
            out.append((body[0], list(struct.unpack_from(">%dQ" % n, body, 5))))
        elif k == wire.PUBLISH_ERROR:
            (n,) = struct.unpack_from(">I", body, 1)
            out.append(("error", body[0], [struct.unpack_from(">QH", body, 5 + 10 * i) for i in range(n)]))
    return out


class StreamDoorTestCase(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock, memoryHighWatermark=None)
        self.backend = MemoryStreams(self.clock)
        self.factory = door.StreamServerFactory(self.broker, self.backend, self.clock, heartbeat=0)

    def client(self, **kw):
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(**kw), wire.OK)
        return c

    def settle(self):
        self.clock.advance(0)


class HandshakeTests(StreamDoorTestCase):
    def test_open(self):
        """Peer properties, SASL PLAIN, tune and open; open names the advertised endpoint."""
        c = Client(self.factory, self.clock)
        code, body = c.call(wire.PEER_PROPERTIES, wire.encodeStringMap({}))
        self.assertEqual(code, wire.OK)
        self.assertIn(b"product", body)
        code, body = c.call(wire.SASL_HANDSHAKE)
        self.assertEqual(body, struct.pack(">I", 1) + wire.encodeString("PLAIN"))
        c.corr = 2
        self.assertEqual(c.handshake(), wire.OK)
        self.assertEqual(c.proto.state, "open")

    def test_serverProperties(self):
        """
        peer_properties has RabbitMQ's keys (copyright and information too); configured server
        properties are added under the built-in ones, which win, as rabbit_stream_reader merges them.
        """
        def props(factory):
            c = Client(factory, self.clock)
            code, body = c.call(wire.PEER_PROPERTIES, wire.encodeStringMap({}))
            self.assertEqual(code, wire.OK)
            return wire._Cursor(body, 0).stringMap()

        got = props(self.factory)
        self.assertEqual(got["product"], "otter_tx")
        self.assertEqual(sorted(got), ["cluster_name", "copyright", "information", "platform", "product",
                                       "version"])
        factory = door.StreamServerFactory(self.broker, self.backend, self.clock, heartbeat=0,
                                           serverProperties={"product": "RabbitMQ", "x-extra": "1"})
        got = props(factory)
        self.assertEqual((got["product"], got["x-extra"], got["platform"]), ("otter_tx", "1", "Python/Twisted"))

    def test_badPassword(self):
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(password="nope"), wire.AUTHENTICATION_FAILURE)

    def test_loopbackOnly(self):
        """guest from a remote address: SASL_AUTHENTICATION_FAILURE_LOOPBACK."""
        c = Client(self.factory, self.clock)
        c.proto.peerHost = "10.0.0.1"
        self.assertEqual(c.handshake(), wire.SASL_AUTHENTICATION_FAILURE_LOOPBACK)

    def test_unknownMechanism(self):
        c = Client(self.factory, self.clock)
        code, _ = c.call(wire.SASL_AUTHENTICATE, wire.encodeString("AMQPLAIN") + struct.pack(">I", 0))
        self.assertEqual(code, wire.SASL_MECHANISM_NOT_SUPPORTED)

    def test_external(self):
        """
        SASL EXTERNAL is offered to a TLS client with a verified certificate and logs in as the
        user the certificate names (--ssl-cert-login-from), without a password, as the AMQP door
        and RabbitMQ's rabbitmq_auth_mechanism_ssl; refused while that user does not exist.
        """
        def external(c):
            c.call(wire.PEER_PROPERTIES, wire.encodeStringMap({}))
            code, body = c.call(wire.SASL_HANDSHAKE)
            c.corr += 1
            c.feed(wire.request(wire.SASL_AUTHENTICATE, c.corr, wire.encodeString("EXTERNAL") + struct.pack(">I", 0)))
            return body, struct.unpack_from(">IH", c.read()[0][2])[1]

        plain = Client(self.factory, self.clock)
        self.assertEqual(external(plain), (struct.pack(">I", 1) + wire.encodeString("PLAIN"),
                                           wire.SASL_MECHANISM_NOT_SUPPORTED))
        cert = object()
        self.patch(door, "peerCertificate", lambda transport: cert)
        self.patch(self.factory.certificateLogin, "userName", lambda c: "O=client,CN=app1" if c is cert else None)
        offered = struct.pack(">I", 2) + wire.encodeString("PLAIN") + wire.encodeString("EXTERNAL")
        self.assertEqual(external(Client(self.factory, self.clock)), (offered, wire.AUTHENTICATION_FAILURE))
        self.broker.addUser("O=client,CN=app1", None)
        self.broker.setPermissions("O=client,CN=app1", "/")
        c = Client(self.factory, self.clock)
        self.assertEqual(external(c), (offered, wire.OK))
        self.assertEqual(c.proto.state, "tuning")
        self.assertEqual(c.proto.user.name, "O=client,CN=app1")

    def test_vhostAccess(self):
        """An unknown vhost, or one without permissions: VHOST_ACCESS_FAILURE."""
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(vhost="nope"), wire.VHOST_ACCESS_FAILURE)
        self.broker.addVHost("v2")
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(vhost="v2"), wire.VHOST_ACCESS_FAILURE)

    def test_commandBeforeOpen(self):
        """A stream command before open closes the connection."""
        c = Client(self.factory, self.clock)
        c.feed(wire.request(wire.CREATE_STREAM, 1, wire.encodeString("s") + wire.encodeStringMap({})))
        self.assertTrue(c.transport.disconnecting)

    def test_preOpenFrameMax(self):
        """Before open, frames above 8192 bytes are refused (stream.initial_frame_max)."""
        c = Client(self.factory, self.clock)
        c.feed(struct.pack(">I", 9000))
        self.assertTrue(c.transport.disconnecting)

    def test_negotiatedFrameMax(self):
        """
        After open a frame above the tuned frame_max is awaited and taken, as RabbitMQ 3.10
        does; one above OPEN_FRAME_MAX gets close FRAME_TOO_LARGE.
        """
        c = self.client(frameMax=10000)
        c.feed(struct.pack(">I", 10001))
        self.assertEqual(c.read(), [])
        self.assertFalse(c.transport.disconnecting)
        c = self.client(frameMax=10000)
        c.feed(struct.pack(">I", door.OPEN_FRAME_MAX + 1))
        frames = c.read()
        self.assertEqual(frames[0][0], wire.CLOSE)
        self.assertEqual(struct.unpack_from(">IH", frames[0][2])[1], wire.FRAME_TOO_LARGE)

    def test_unknownFrame(self):
        c = self.client()
        c.feed(wire.request(0x7f, 1))
        frames = c.read()
        self.assertEqual(frames[0][0], wire.CLOSE)
        self.assertEqual(struct.unpack_from(">IH", frames[0][2])[1], wire.UNKNOWN_FRAME)

    def test_close(self):
        c = self.client()
        code, _ = c.call(wire.CLOSE, struct.pack(">H", 1) + wire.encodeString("bye"))
        self.assertEqual(code, wire.OK)
        self.assertTrue(c.transport.disconnecting)

    def test_heartbeats(self):
        """A heartbeat each interval while idle; silence for two intervals drops the client."""
        c = self.client(heartbeat=5)
        self.clock.advance(5)
        self.assertEqual(c.read(), [(wire.HEARTBEAT, 1, b"")])
        c.feed(wire.heartbeat())
        self.clock.advance(5)
        self.clock.advance(5)
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(5)
        self.assertTrue(c.proto.closed)

    def test_handshakeTimeout(self):
        c = Client(self.factory, self.clock)
        self.clock.advance(10)
        self.assertTrue(c.transport.disconnecting)


def decodeStats(rest):
    """A stream_stats response's map (after its code): dict of str -> int."""
    (n,), pos, out = struct.unpack_from(">I", rest), 4, {}
    for _ in range(n):
        (size,) = struct.unpack_from(">H", rest, pos)
        key = rest[pos + 2:pos + 2 + size].decode()
        (out[key],) = struct.unpack_from(">q", rest, pos + 2 + size)
        pos += 10 + size
    return out


class StreamTests(StreamDoorTestCase):
    def test_createDelete(self):
        c = self.client()
        self.assertEqual(c.create("s"), wire.OK)
        self.assertEqual(c.create("s"), wire.STREAM_ALREADY_EXISTS)
        self.assertEqual(c.create("amq.s"), wire.PRECONDITION_FAILED)
        self.assertEqual(c.call(wire.DELETE_STREAM, wire.encodeString("s"))[0], wire.OK)
        self.assertEqual(c.call(wire.DELETE_STREAM, wire.encodeString("s"))[0], wire.STREAM_DOES_NOT_EXIST)

    def test_permissions(self):
        """configure for create/delete, write for publishers, read for subscriptions."""
        self.broker.addUser("u", "p")
        self.broker.setPermissions("u", "/", configure="^c", write="^w", read="^r")
        c = self.client(user="u", password="p")
        self.assertEqual(c.create("x"), wire.ACCESS_REFUSED)
        self.assertEqual(c.create("c1"), wire.OK)
        self.assertEqual(c.declarePublisher(1, "", "c1"), wire.ACCESS_REFUSED)
        self.assertEqual(c.subscribe(1, "c1"), wire.ACCESS_REFUSED)

    def test_streamStats(self):
        """
        stream_stats as osiris' get_stats: -1 for each figure of a stream with no message
        (RabbitMQ's clients take -1 as "no offset"), then the first offset kept and the first
        offset of the last chunk; STREAM_DOES_NOT_EXIST for an unknown stream.
        """
        c = self.client()
        c.create("st")
        code, rest = c.call(wire.STREAM_STATS, wire.encodeString("st"))
        self.assertEqual((code, decodeStats(rest)),
                         (wire.OK, {"first_chunk_id": -1, "committed_chunk_id": -1, "last_chunk_id": -1}))
        c.declarePublisher(1, "", "st")
        for first in (1, 3):
            c.feed(wire.publishFrame(1, [(first, b"a"), (first + 1, b"b")]))
            self.settle()
        code, rest = c.call(wire.STREAM_STATS, wire.encodeString("st"))
        self.assertEqual((code, decodeStats(rest)),
                         (wire.OK, {"first_chunk_id": 0, "committed_chunk_id": 2, "last_chunk_id": 2}))
        self.assertEqual(c.call(wire.STREAM_STATS, wire.encodeString("none"))[0], wire.STREAM_DOES_NOT_EXIST)

    def test_metadata(self):
        c = self.client()
        c.create("s")
        code, body = c.call(wire.METADATA, struct.pack(">I", 2) + wire.encodeString("s") + wire.encodeString("m"))
        # no code in a metadata response: the broker count (1) sits where the code would be
        self.assertEqual(code, 0)
        self.assertIn(b"\x00\x01s\x00\x01\x00\x00\x00\x00\x00\x00", body)
        self.assertIn(b"\x00\x01m\x00\x02\xff\xff", body)

    def test_advertised(self):
        self.factory.advertisedHost = "broker.example"
        self.factory.advertisedPort = 6000
        c = Client(self.factory, self.clock)
        c.call(wire.PEER_PROPERTIES, wire.encodeStringMap({}))
        c.handshake()
        code, body = c.call(wire.METADATA, struct.pack(">I", 0))
        self.assertIn(wire.encodeString("broker.example") + struct.pack(">I", 6000), body)


class PublishTests(StreamDoorTestCase):
    def test_publishConfirm(self):
        c = self.client()
        c.create("s")
        self.assertEqual(c.declarePublisher(1, "", "s"), wire.OK)
        c.feed(wire.publishFrame(1, [(1, b"a"), (2, b"b")]))
        self.assertEqual(confirms(c.read()), [(1, [1, 2])])
        self.assertEqual(self.backend.messages("/", "s"), [(0, b"a"), (1, b"b")])

    def test_declareErrors(self):
        c = self.client()
        c.create("s")
        self.assertEqual(c.declarePublisher(1, "", "missing"), wire.STREAM_DOES_NOT_EXIST)
        self.assertEqual(c.declarePublisher(1, "r", "s"), wire.OK)
        self.assertEqual(c.declarePublisher(1, "", "s"), wire.PRECONDITION_FAILED)
        self.assertEqual(c.declarePublisher(2, "r", "s"), wire.PRECONDITION_FAILED)
        self.assertEqual(c.declarePublisher(3, "x" * 257, "s"), wire.PRECONDITION_FAILED)

    def test_deduplication(self):
        """With a reference, publishing ids not above the last one are confirmed and dropped."""
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "ref", "s")
        c.feed(wire.publishFrame(1, [(1, b"a"), (2, b"b")]))
        c.feed(wire.publishFrame(1, [(2, b"b"), (3, b"c")]))
        self.assertEqual(confirms(c.read()), [(1, [1, 2]), (1, [2, 3])])
        self.assertEqual(self.backend.messages("/", "s"), [(0, b"a"), (1, b"b"), (2, b"c")])
        code, body = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("ref") + wire.encodeString("s"))
        self.assertEqual((code, body), (wire.OK, struct.pack(">Q", 3)))
        code, body = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("ref") + wire.encodeString("m"))
        self.assertEqual(code, wire.STREAM_DOES_NOT_EXIST)

    def test_deduplicationFirstIdZero(self):
        """
        A reference that wrote nothing has no sequence: its first publish is kept whatever its
        id, 0 too (osiris_writer's is_duplicate: not_found is no duplicate; rabbitmq-stream-js-client
        publishes ids from 0), though query_publisher_sequence answers 0 for it before and after.
        """
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "ref", "s")
        q = wire.encodeString("ref") + wire.encodeString("s")
        self.assertEqual(c.call(wire.QUERY_PUBLISHER_SEQUENCE, q), (wire.OK, struct.pack(">Q", 0)))
        c.feed(wire.publishFrame(1, [(0, b"a"), (1, b"b")]))
        c.feed(wire.publishFrame(1, [(0, b"a"), (1, b"b"), (2, b"c")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [0, 1]), (1, [0, 1, 2])])
        self.assertEqual(self.backend.messages("/", "s"), [(0, b"a"), (1, b"b"), (2, b"c")])
        self.assertEqual(c.call(wire.QUERY_PUBLISHER_SEQUENCE, q), (wire.OK, struct.pack(">Q", 2)))
        # one by one, as the client's basicSend: 0 then 0 again
        c.declarePublisher(2, "other", "s")
        c.feed(wire.publishFrame(2, [(0, b"x")]))
        c.feed(wire.publishFrame(2, [(0, b"x")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(2, [0]), (2, [0])])
        self.assertEqual([m for _, m in self.backend.messages("/", "s")], [b"a", b"b", b"c", b"x"])
        q = wire.encodeString("other") + wire.encodeString("s")
        self.assertEqual(c.call(wire.QUERY_PUBLISHER_SEQUENCE, q), (wire.OK, struct.pack(">Q", 0)))

    def test_deduplicationSubEntryIdZero(self):
        """A sub-entry batch with publishing id 0 as a reference's first publish: all its messages kept."""
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "ref", "s")
        inner = struct.pack(">I", 1) + b"x" + struct.pack(">I", 1) + b"y"
        entry = (struct.pack(">Q", 0) + struct.pack(">BH", 0x80, 2)
                 + struct.pack(">II", len(inner), len(inner)) + inner)
        body = struct.pack(">HHBI", wire.PUBLISH, 1, 1, 1) + entry
        c.feed(struct.pack(">I", len(body)) + body)
        c.feed(struct.pack(">I", len(body)) + body)
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [0]), (1, [0])])
        self.assertEqual([m for _, m in self.backend.messages("/", "s")], [b"x", b"y"])

    def test_deduplicationWithinFrame(self):
        """
        As RabbitMQ, message by message: a frame's own repeats and ids below an earlier
        one of the frame are confirmed and dropped too (rstream's test_publish_deduplication_async).
        """
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "ref", "s")
        c.feed(wire.publishFrame(1, [(1, b"a"), (2, b"b"), (3, b"c"), (1, b"a"), (2, b"b"), (3, b"c")]))
        c.feed(wire.publishFrame(1, [(5, b"e"), (4, b"d"), (6, b"f"), (6, b"f")]))
        c.feed(wire.publishFrame(1, [(7, b"g"), (8, b"h")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [1, 2, 3, 1, 2, 3]), (1, [5, 4, 6, 6]), (1, [7, 8])])
        self.assertEqual([m for _, m in self.backend.messages("/", "s")],
                         [b"a", b"b", b"c", b"e", b"f", b"g", b"h"])
        code, body = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("ref") + wire.encodeString("s"))
        self.assertEqual((code, body), (wire.OK, struct.pack(">Q", 8)))

    def test_frameAboveTunedFrameMax(self):
        """
        Once open, a frame above the tuned frame_max is taken, as RabbitMQ 3.10 takes it
        (rstream's Producer sends all it buffered as one frame: test_publishing_several_messages);
        only one above OPEN_FRAME_MAX closes the connection (FRAME_TOO_LARGE).
        """
        self.patch(door, "OPEN_FRAME_MAX", 300000)
        c = self.client(frameMax=65536)
        c.create("s")
        c.declarePublisher(1, "", "s")
        msgs = [(i, b"x" * 100) for i in range(1, 1001)]
        c.feed(wire.publishFrame(1, msgs))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, list(range(1, 1001)))])
        self.assertEqual(len(self.backend.messages("/", "s")), 1000)
        c.feed(wire.publishFrame(1, [(i, b"x" * 100) for i in range(1001, 4001)]))
        closes = [body for k, _, body in c.read() if k == wire.CLOSE]
        self.assertEqual(len(closes), 1)
        self.assertEqual(struct.unpack_from(">H", closes[0], 4)[0], wire.FRAME_TOO_LARGE)
        self.assertTrue(c.transport.disconnecting)

    def test_resourceAlarmBlocksReading(self):
        """During a memory or disk alarm a publishing connection is not read; it is again after."""
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "", "s")
        self.patch(type(self.broker), "alarmed", property(lambda b: self._alarm))
        self._alarm = True
        c.feed(wire.publishFrame(1, [(1, b"a")]))
        self.assertEqual(c.transport.producerState, "paused")
        self.clock.advance(door.ALARM_CHECK)
        self.assertEqual(c.transport.producerState, "paused")
        self._alarm = False
        self.clock.advance(door.ALARM_CHECK)
        self.assertEqual(c.transport.producerState, "producing")

    def test_unknownPublisher(self):
        c = self.client()
        c.feed(wire.publishFrame(9, [(4, b"a")]))
        self.assertEqual(confirms(c.read()), [("error", 9, [(4, wire.PUBLISHER_DOES_NOT_EXIST)])])

    def test_deletePublisher(self):
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "", "s")
        self.assertEqual(c.call(wire.DELETE_PUBLISHER, b"\x01")[0], wire.OK)
        self.assertEqual(c.call(wire.DELETE_PUBLISHER, b"\x01")[0], wire.PUBLISHER_DOES_NOT_EXIST)

    def test_streamDeleted(self):
        """Deleting a stream tells its other users with metadata_update STREAM_NOT_AVAILABLE."""
        a = self.client()
        b = self.client()
        a.create("s")
        b.declarePublisher(1, "", "s")
        a.call(wire.DELETE_STREAM, wire.encodeString("s"))
        frames = b.read()
        self.assertEqual(frames[0][0], wire.METADATA_UPDATE)
        self.assertEqual(frames[0][2], struct.pack(">H", wire.STREAM_NOT_AVAILABLE) + wire.encodeString("s"))
        self.assertEqual(b.proto.publishers, {})


class SubscribeTests(StreamDoorTestCase):
    def publish(self, c, stream, n, start=0, perChunk=1):
        """``n`` messages, ``perChunk`` to a publish frame (one frame is one chunk)."""
        c.declarePublisher(200, "", stream) if 200 not in c.proto.publishers else None
        for f in range(start, start + n, perChunk):
            c.feed(wire.publishFrame(200, [(i, b"m%d" % i) for i in range(f, min(f + perChunk, start + n))]))
        c.read()

    def test_offsetSpecifications(self):
        c = self.client()
        c.create("s")
        self.publish(c, "s", 5)
        specs = [((wire.OFFSET_FIRST, None), 0), ((wire.OFFSET_LAST, None), 4),
                 ((wire.OFFSET_NEXT, None), None), ((wire.OFFSET_OFFSET, 3), 3),
                 ((wire.OFFSET_OFFSET, 99), None), ((wire.OFFSET_TIMESTAMP, 0), 0)]
        for sid, (spec, first) in enumerate(specs):
            self.assertEqual(c.subscribe(sid, "s", spec), wire.OK)
            got = c.deliveries()
            if first is None:
                self.assertEqual(got, [])
            else:
                self.assertEqual(got[0][:2], (sid, first))

    def test_timestamp(self):
        c = self.client()
        c.create("s")
        self.publish(c, "s", 2)
        self.clock.advance(10)
        self.publish(c, "s", 2, 2)
        # as osiris (RabbitMQ 3.10 to 4.x): the first chunk written at or after the timestamp
        c.subscribe(1, "s", (wire.OFFSET_TIMESTAMP, 10000))
        self.assertEqual(c.deliveries()[0][1:2], (2,))
        c.subscribe(2, "s", (wire.OFFSET_TIMESTAMP, 9999))
        self.assertEqual(c.deliveries()[0][1:2], (2,))
        c.subscribe(3, "s", (wire.OFFSET_TIMESTAMP, 0))
        self.assertEqual(c.deliveries()[0][1:2], (0,))
        # after the last chunk: next (the client's own suite subscribes so, then publishes)
        c.subscribe(4, "s", (wire.OFFSET_TIMESTAMP, 10001))
        self.assertEqual([d for d in c.deliveries() if d[0] == 4], [])
        self.publish(c, "s", 1, 4)
        self.assertEqual([d[1:] for d in c.deliveries() if d[0] == 4], [(4, [b"m4"])])

    def test_live(self):
        """A subscriber at next gets what is published afterwards."""
        c = self.client()
        c.create("s")
        c.subscribe(1, "s", (wire.OFFSET_NEXT, None))
        self.assertEqual(c.deliveries(), [])
        p = self.client()
        self.publish(p, "s", 3)
        self.assertEqual(c.deliveries(), [(1, 0, [b"m0"]), (1, 1, [b"m1"]), (1, 2, [b"m2"])])

    def test_chunkAsPublished(self):
        """A publish frame is one chunk; a reader starting inside it gets all of it, as from RabbitMQ."""
        c = self.client()
        c.create("s")
        self.publish(c, "s", 6, perChunk=3)
        c.subscribe(1, "s", (wire.OFFSET_OFFSET, 4))
        self.assertEqual(c.deliveries(), [(1, 3, [b"m3", b"m4", b"m5"])])
        c.subscribe(2, "s", (wire.OFFSET_LAST, None))
        self.assertEqual(c.deliveries(), [(2, 3, [b"m3", b"m4", b"m5"])])

    def test_credit(self):
        """One chunk per credit; credit brings the next."""
        c = self.client()
        c.create("s")
        self.publish(c, "s", 5, perChunk=2)
        c.subscribe(1, "s", credit=1)
        self.assertEqual(c.deliveries(), [(1, 0, [b"m0", b"m1"])])
        self.assertEqual(c.deliveries(), [])
        c.feed(struct.pack(">IHHBH", 7, wire.CREDIT, 1, 1, 2))
        self.assertEqual(c.deliveries(), [(1, 2, [b"m2", b"m3"]), (1, 4, [b"m4"])])

    def test_creditUnknown(self):
        c = self.client()
        c.feed(struct.pack(">IHHBH", 7, wire.CREDIT, 1, 9, 2))
        self.assertEqual(c.read(), [(wire.CREDIT | wire.RESPONSE_FLAG, 1,
                                     struct.pack(">H", wire.SUBSCRIPTION_ID_DOES_NOT_EXIST) + b"\x09")])

    def test_errors(self):
        c = self.client()
        c.create("s")
        self.assertEqual(c.subscribe(1, "missing"), wire.STREAM_DOES_NOT_EXIST)
        self.assertEqual(c.subscribe(1, "s"), wire.OK)
        self.assertEqual(c.subscribe(1, "s"), wire.SUBSCRIPTION_ID_ALREADY_EXISTS)
        self.assertEqual(c.call(wire.UNSUBSCRIBE, b"\x01")[0], wire.OK)
        self.assertEqual(c.call(wire.UNSUBSCRIBE, b"\x01")[0], wire.SUBSCRIPTION_ID_DOES_NOT_EXIST)

    def test_backPressure(self):
        """While the transport is paused nothing is read or written; a turn writes at most CHUNKS_PER_TURN."""
        c = self.client()
        c.create("s")
        self.publish(c, "s", 40)
        c.proto.pauseProducing()
        c.subscribe(1, "s", credit=100)
        self.assertEqual(c.deliveries(), [])
        c.proto.resumeProducing()
        (call,) = self.clock.getDelayedCalls()
        call.cancel()
        c.proto._pumpCall = None
        c.proto._pump()
        self.assertEqual(len([f for f in c.read() if f[0] == wire.DELIVER]), door.CHUNKS_PER_TURN)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.assertEqual(len(c.deliveries()), 40 - door.CHUNKS_PER_TURN)

    def test_offsets(self):
        """store_offset then query_offset; NO_OFFSET before."""
        c = self.client()
        c.create("s")
        q = wire.encodeString("app") + wire.encodeString("s")
        self.assertEqual(c.call(wire.QUERY_OFFSET, q)[0], wire.NO_OFFSET)
        c.feed(wire._frame(struct.pack(">HH", wire.STORE_OFFSET, 1) + q + struct.pack(">Q", 7)))
        self.assertEqual(c.call(wire.QUERY_OFFSET, q), (wire.OK, struct.pack(">Q", 7)))
        q2 = wire.encodeString("app") + wire.encodeString("missing")
        self.assertEqual(c.call(wire.QUERY_OFFSET, q2)[0], wire.STREAM_DOES_NOT_EXIST)


class SuperStreamTests(StreamDoorTestCase):
    def createSuper(self, c, name, n):
        parts = ["%s-%d" % (name, i) for i in range(n)]
        payload = (wire.encodeString(name) + struct.pack(">I", n) + b"".join(wire.encodeString(p) for p in parts)
                   + struct.pack(">I", n) + b"".join(wire.encodeString(str(i)) for i in range(n))
                   + wire.encodeStringMap({}))
        return c.call(wire.CREATE_SUPER_STREAM, payload)[0]

    def test_partitionsAndRoute(self):
        c = self.client()
        self.assertEqual(self.createSuper(c, "inv", 3), wire.OK)
        code, body = c.call(wire.PARTITIONS, wire.encodeString("inv"))
        self.assertEqual(code, wire.OK)
        self.assertEqual(body, struct.pack(">I", 3) + b"".join(wire.encodeString("inv-%d" % i) for i in range(3)))
        code, body = c.call(wire.ROUTE, wire.encodeString("1") + wire.encodeString("inv"))
        self.assertEqual(body, struct.pack(">I", 1) + wire.encodeString("inv-1"))
        self.assertEqual(c.call(wire.PARTITIONS, wire.encodeString("nope"))[0], wire.STREAM_DOES_NOT_EXIST)
        self.assertEqual(c.call(wire.DELETE_SUPER_STREAM, wire.encodeString("inv"))[0], wire.OK)
        self.assertFalse(self.backend.exists("/", "inv-0"))


class SingleActiveConsumerTests(StreamDoorTestCase):
    def updates(self, c):
        self.clock.advance(0)
        out = []
        for k, v, body in c.read():
            if k == wire.CONSUMER_UPDATE:
                corr, sid, active = struct.unpack_from(">IBB", body)
                out.append((corr, sid, active))
        return out

    def answer(self, c, corr, spec=(wire.OFFSET_NEXT, None)):
        c.feed(wire._frame(struct.pack(">HHIH", wire.CONSUMER_UPDATE | wire.RESPONSE_FLAG, 1, corr, wire.OK)
                           + wire.offsetSpec(*spec)))

    def test_failover(self):
        """The first consumer of a name is active; when it leaves the next is activated."""
        a = self.client()
        b = self.client()
        a.create("s")
        props = {"single-active-consumer": "true", "name": "app"}
        self.assertEqual(a.subscribe(1, "s", props=props), wire.OK)
        (corr, sid, active), = self.updates(a)
        self.assertEqual((sid, active), (1, 1))
        self.answer(a, corr, (wire.OFFSET_FIRST, None))
        self.assertEqual(b.subscribe(2, "s", props=props), wire.OK)
        self.assertEqual(self.updates(b), [])
        self.publish(a, "s")
        self.assertEqual([d[0] for d in a.deliveries()], [1])
        self.assertEqual(b.deliveries(), [])
        a.call(wire.UNSUBSCRIBE, b"\x01")
        (corr, sid, active), = self.updates(b)
        self.assertEqual((sid, active), (2, 1))
        self.answer(b, corr, (wire.OFFSET_FIRST, None))
        self.assertEqual(b.deliveries(), [(2, 0, [b"x"])])

    def test_needsName(self):
        c = self.client()
        c.create("s")
        self.assertEqual(c.subscribe(1, "s", props={"single-active-consumer": "true"}),
                         wire.PRECONDITION_FAILED)

    def publish(self, c, stream):
        c.declarePublisher(9, "", stream)
        c.feed(wire.publishFrame(9, [(1, b"x")]))
        self.clock.advance(0)


class OnBrokerStreams:
    """The same tests on the broker's stream queues (BrokerStreams) instead of MemoryStreams."""

    def setUp(self):
        from otter_tx.door.streambackend import BrokerStreams

        self.clock = Clock()
        self.broker = Broker(self.clock, memoryHighWatermark=None)
        self.backend = BrokerStreams(self.broker, self.clock)
        self.factory = door.StreamServerFactory(self.broker, self.backend, self.clock, heartbeat=0)
        self.addCleanup(self.broker.streams.close)

    def settle(self):
        for _ in range(5):
            self.clock.advance(0)
            self.broker.streams.drain() if hasattr(self.broker.streams, "drain") else None


class BrokerStreamTests(OnBrokerStreams, StreamDoorTestCase):
    test_streamStats = StreamTests.test_streamStats
    test_deduplicationFirstIdZero = PublishTests.test_deduplicationFirstIdZero
    test_deduplicationSubEntryIdZero = PublishTests.test_deduplicationSubEntryIdZero
    test_deduplicationWithinFrame = PublishTests.test_deduplicationWithinFrame
    test_frameAboveTunedFrameMax = PublishTests.test_frameAboveTunedFrameMax
    test_timestamp = SubscribeTests.test_timestamp
    publish = SubscribeTests.publish

    def test_roundTrip(self):
        """Published over the stream protocol, confirmed once durable, read back as RabbitMQ 3.10 gives it."""
        from otter_tx.stream import amqp10

        c = self.client()
        self.assertEqual(c.create("s", {"max-length-bytes": "1000000"}), wire.OK)
        self.assertEqual(self.broker.vhosts["/"].queues["s"].arguments["x-max-length-bytes"], 1000000)
        self.assertEqual(c.create("t", {"max-length-bytes": "lots"}), wire.PRECONDITION_FAILED)
        c.declarePublisher(1, "ref", "s")
        m = amqp10.encodeMessage(b"hello", applicationProperties={"k": "v"})
        c.feed(wire.publishFrame(1, [(1, m), (2, m)]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [1, 2])])
        c.feed(wire.publishFrame(1, [(2, m)]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [2])])
        msgs = self.backend.messages("/", "s")
        self.assertEqual([o for o, _ in msgs], [0, 1])
        self.assertEqual(amqp10.toAmqp091(msgs[0][1]), ({"headers": {"k": "v"}}, b"hello"))
        c.subscribe(1, "s")
        self.settle()
        got = c.deliveries()
        self.assertEqual([(sid, first, len(ms)) for sid, first, ms in got], [(1, 0, 2)])

    def test_keptAsPublished(self):
        """
        A stream client reads back the bytes it published (AMQP 1.0-only fields too, as from
        RabbitMQ); an AMQP 0-9-1 consumer of the same stream gets them converted (to_amqp091);
        publish frames are joined into one chunk as stored.
        """
        from otter_tx.stream import amqp10

        c = self.client()
        c.create("s")
        c.declarePublisher(1, "", "s")
        m = amqp10.encodeMessage(b"hello", properties={"subject": "subj", "to": "/x"},
                                 messageAnnotations={"x-custom": "v"})
        c.feed(wire.publishFrame(1, [(1, m), (2, b"opaque")]))
        c.feed(wire.publishFrame(1, [(3, b"third")]))
        self.settle()
        c.read()
        self.assertEqual(self.backend.messages("/", "s"), [(0, m), (1, b"opaque"), (2, b"third")])
        c.subscribe(1, "s")
        self.settle()
        self.assertEqual(c.deliveries(), [(1, 0, [m, b"opaque", b"third"])])
        from otter_tx.broker.stream import findStream

        got = findStream(self.broker, "/", "s").reader("first").read()
        self.assertEqual([(o, x.routingKey, x.body) for o, _, x in got],
                         [(0, "s", b"hello"), (1, "s", b"opaque"), (2, "s", b"third")])

    def test_fanOutSharesChunks(self):
        """Subscriptions reading in step get the same chunk objects (built once from the log)."""
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "", "s")
        c.feed(wire.publishFrame(1, [(i, b"m%d" % i) for i in range(10)]))
        self.settle()
        c.read()
        a = self.backend.chunks("/", "s", 0, 4)
        b = self.backend.chunks("/", "s", 0, 4)
        self.assertEqual([x.first for x in a], [0])
        self.assertIs(a[0], b[0])
        c.subscribe(1, "s")
        c.subscribe(2, "s")
        got = c.deliveries()
        self.assertEqual([(sid, first, len(ms)) for sid, first, ms in got], [(1, 0, 10), (2, 0, 10)])

    def test_largeRecordsInChunks(self):
        """
        Publish frames of 1 KiB messages (records larger than a read piece) and small ones are
        delivered as published, in chunks within the frame size, whatever the frame size.
        """
        c = self.client(frameMax=300000)
        c.create("s")
        c.declarePublisher(1, "", "s")
        msgs = []
        for k in range(12):
            size = 1024 if k % 3 else 12
            frame = [(len(msgs) + i + 1, bytes([k]) * size + b"%d" % i) for i in range(100)]
            msgs.extend(m for _, m in frame)
            c.feed(wire.publishFrame(1, frame))
            self.settle()
        c.read()
        c.subscribe(1, "s", credit=1000)
        got = c.deliveries()
        self.assertEqual([m for _, _, ms in got for m in ms], msgs)
        firsts = [first for _, first, _ in got]
        self.assertEqual(firsts, sorted(firsts))
        self.assertGreater(len(got), 4)
        # a chunk's parts are its data (FileRanges read), its CRC theirs
        from otter_tx.broker.stream import FileRange

        for first in (0, 100, 200):
            (again,) = self.backend.chunks("/", "s", first, 1)
            data = b"".join(p.read() if type(p) is FileRange else p for p in again.parts)
            self.assertEqual(data, again.data)
            self.assertEqual(again.crc, zlib.crc32(again.data))

    def test_chunkCrcs(self):
        """
        Delivered chunks carry zlib's CRC-32 of their data, whether it is made of the records'
        stored CRCs (BATCH_CRC, crc32_combine), of old BATCH records' bytes, or of both, read,
        with ranges or mapped; a chunk of whole large BATCH_CRC records is not read for its CRC.
        """
        from otter_tx.broker import stream as streamModule
        from otter_tx.broker.stream import FileRange

        encoded = streamModule._seg.encodedBatch
        c = self.client(frameMax=300000)
        c.create("s")
        c.declarePublisher(1, "", "s")
        msgs = []
        for k in range(16):
            # records 4-7 as an otter_tx from before BATCH_CRC wrote them (no CRC stored)
            old = 4 <= k < 8
            self.patch(streamModule._seg, "encodedBatch",
                       (lambda first, ts, count, ents, crc=None: encoded(first, ts, count, ents)) if old else encoded)
            size = (1024, 12, 700, 3000)[k % 4]
            frame = [(len(msgs) + i + 1, bytes([65 + k]) * size + b"%d" % i) for i in range(k % 5 * 20 + 1)]
            msgs.extend(m for _, m in frame)
            c.feed(wire.publishFrame(1, frame))
            self.settle()
        c.read()
        for sid, ranges, mapped in ((10, False, False), (11, True, False), (12, False, True)):
            self.patch(self.backend, "ranges", ranges)
            self.patch(self.backend, "mapped", mapped)
            self.backend._cache.clear()
            offset = 0
            while offset < len(msgs):
                (ch,) = self.backend.chunks("/", "s", offset, 1, 100000)
                data = b"".join(p.read() if type(p) is FileRange else bytes(p) for p in ch.parts)
                self.assertEqual(ch.crc, zlib.crc32(data), (ranges, offset))
                self.assertEqual(chunk.split(data, ch.count), msgs[offset:offset + ch.count])
                offset = ch.first + ch.count
            c.subscribe(sid, "s", credit=1000)
            got = c.deliveries()      # chunk.parse checks each chunk's CRC against zlib.crc32
            self.assertEqual([m for _, _, ms in got for m in ms], msgs)
        # only BATCH_CRC records, large ones: nothing of the file is read for the CRC
        c.create("t")
        c.declarePublisher(2, "", "t")
        tmsgs = [b"%04d" % i * 300 for i in range(300)]
        for f in range(0, 300, 100):
            c.feed(wire.publishFrame(2, [(i + 1, tmsgs[i]) for i in range(f, f + 100)]))
            self.settle()
        c.read()

        def noRead(*a):
            raise AssertionError("read for its CRC")

        from otter_tx.broker.stream import isMapped
        from otter_tx.door import streambackend

        self.patch(FileRange, "crc32", noRead)
        self.patch(streambackend, "_crc32", noRead)
        for ranges, mapped in ((True, False), (False, True)):
            self.patch(self.backend, "ranges", ranges)
            self.patch(self.backend, "mapped", mapped)
            (ch,) = self.backend.chunks("/", "t", 0, 1)
            self.assertTrue(ch.transient)
            if ranges:
                self.assertEqual([type(p) for p in ch.parts], [FileRange] * 3)
                data = b"".join(p.read() for p in ch.parts)
            else:
                self.assertEqual([isMapped(p) for p in ch.parts], [True] * 3)
                data = b"".join(ch.parts)
            self.assertEqual((ch.count, ch.crc), (300, zlib.crc32(data)))
            self.assertEqual(chunk.split(data, 300), tmsgs)
            self.assertNotIn(0, self.backend._cache[("/", "t")][1])

    def test_amqpDeleteTellsSubscribers(self):
        """A stream deleted over AMQP 0-9-1 ends the stream protocol's subscriptions (metadata_update)."""
        c = self.client()
        c.create("s")
        c.subscribe(1, "s")
        v = self.broker.vhosts["/"]
        v.deleteQueue(v.queues["s"])
        self.settle()
        frames = c.read()
        self.assertIn((wire.METADATA_UPDATE, 1, struct.pack(">H", wire.STREAM_NOT_AVAILABLE) + wire.encodeString("s")),
                      frames)
        self.assertEqual(c.proto.subscriptions, {})

    def test_subscribeResponseWrittenBeforeFirstChunk(self):
        """
        The subscribe response leaves in a write of its own, before the first chunk's (as
        RabbitMQ's two sends): rabbitmq-stream-js-client reading both at once runs its handler
        before its declareConsumer returns, so its own suite's handler that stores an offset
        through the consumer it was given failed. A socket that takes everything is faked here,
        taken only while the transport holds nothing, as directSocket's rule.
        """
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "", "s")
        c.feed(wire.publishFrame(1, [(1, b"a"), (2, b"b")]))
        self.settle()
        c.read()
        sends = []

        class Sock:
            def sendmsg(self, parts):
                sends.append(b"".join(bytes(p) for p in parts))
                return len(sends[-1])

        self.patch(door, "directSocket", lambda t: Sock() if t.value() == b"" else None)
        # (on PyPy a chunk of views goes through libc's writev on the socket's descriptor: this
        # fake socket has none, so sendmsg takes every write)
        self.patch(door, "WRITEV", None)
        c.corr += 1
        c.feed(wire.request(wire.SUBSCRIBE, c.corr, b"\x01" + wire.encodeString("s")
                            + wire.offsetSpec(wire.OFFSET_FIRST, None) + struct.pack(">H", 10)
                            + wire.encodeStringMap({})))
        self.settle()
        self.assertEqual(c.transport.value(), b"")
        self.assertEqual(len(sends), 2, sends)
        self.assertEqual(sends[0], wire.response(wire.SUBSCRIBE, c.corr, wire.OK))
        self.assertEqual(struct.unpack_from(">H", sends[1], 4)[0], wire.DELIVER)

    def test_amqpDeleteTellsPublishers(self):
        """
        A stream deleted over AMQP 0-9-1 (or HTTP) drops the stream protocol's publishers with one
        metadata_update per connection, as RabbitMQ's reader, which monitors the stream's leader;
        a publisher to another stream stays, and its appends do not end it.
        """
        c = self.client()
        c.create("s")
        c.create("t")
        c.declarePublisher(1, "ref", "s")
        c.declarePublisher(2, "", "s")
        c.declarePublisher(3, "", "t")
        c.feed(wire.publishFrame(1, [(1, b"a")]))
        c.feed(wire.publishFrame(3, [(1, b"b")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [1]), (3, [1])])
        v = self.broker.vhosts["/"]
        v.deleteQueue(v.queues["s"])
        self.settle()
        update = (wire.METADATA_UPDATE, 1, struct.pack(">H", wire.STREAM_NOT_AVAILABLE) + wire.encodeString("s"))
        self.assertEqual(c.read(), [update])
        self.assertEqual(sorted(c.proto.publishers), [3])
        c.feed(wire.publishFrame(1, [(2, b"x")]))
        self.assertEqual(confirms(c.read()), [("error", 1, [(2, wire.PUBLISHER_DOES_NOT_EXIST)])])
        # the ref is free again; the last publisher of t gone, t's appends call nothing of c's
        self.assertEqual(c.declarePublisher(4, "ref", "t"), wire.OK)
        self.assertEqual(c.call(wire.DELETE_PUBLISHER, b"\x03")[0], wire.OK)
        self.assertEqual(c.call(wire.DELETE_PUBLISHER, b"\x04")[0], wire.OK)
        self.assertEqual(c.proto._publishedStreams, {})
        self.assertEqual([cb for cb in v.queues["t"].stream._listeners if getattr(cb, "__self__", None) is None], [])

    def test_recreatedStream(self):
        """A stream deleted over AMQP and created again under its name is read afresh."""
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "", "s")
        c.feed(wire.publishFrame(1, [(1, b"old")]))
        self.settle()
        self.assertEqual(len(self.backend.chunks("/", "s", 0, 1)), 1)
        v = self.broker.vhosts["/"]
        v.deleteQueue(v.queues["s"])
        self.settle()
        c.read()
        c.create("s")
        c.declarePublisher(2, "", "s")
        c.feed(wire.publishFrame(2, [(1, b"new")]))
        self.settle()
        (chunk_,) = self.backend.chunks("/", "s", 0, 1)
        self.assertIn(b"new", chunk_.data)

    def test_offsetTracking(self):
        c = self.client()
        c.create("s")
        q = wire.encodeString("app") + wire.encodeString("s")
        self.assertEqual(c.call(wire.QUERY_OFFSET, q)[0], wire.NO_OFFSET)
        c.feed(wire._frame(struct.pack(">HH", wire.STORE_OFFSET, 1) + q + struct.pack(">Q", 7)))
        self.assertEqual(c.call(wire.QUERY_OFFSET, q), (wire.OK, struct.pack(">Q", 7)))

    def test_superStream(self):
        c = self.client()
        payload = (wire.encodeString("inv") + struct.pack(">I", 2) + wire.encodeString("inv-0")
                   + wire.encodeString("inv-1") + struct.pack(">I", 2) + wire.encodeString("a")
                   + wire.encodeString("b") + wire.encodeStringMap({}))
        self.assertEqual(c.call(wire.CREATE_SUPER_STREAM, payload)[0], wire.OK)
        self.assertEqual(self.broker.vhosts["/"].exchanges["inv"].arguments, {"x-super-stream": True})
        code, body = c.call(wire.PARTITIONS, wire.encodeString("inv"))
        self.assertEqual(body, struct.pack(">I", 2) + wire.encodeString("inv-0") + wire.encodeString("inv-1"))
        code, body = c.call(wire.ROUTE, wire.encodeString("b") + wire.encodeString("inv"))
        self.assertEqual(body, struct.pack(">I", 1) + wire.encodeString("inv-1"))
        self.assertEqual(c.call(wire.DELETE_SUPER_STREAM, wire.encodeString("inv"))[0], wire.OK)
        self.assertNotIn("inv", self.broker.vhosts["/"].exchanges)
        self.assertNotIn("inv-0", self.broker.vhosts["/"].queues)


    def test_lastOfLargeFrame(self):
        """
        last on a stream whose last publish frame holds more messages than a chunk starts at
        that frame's last chunk (its last chunkMessages messages), not at the frame's first
        message (rstream's test_offset_type_last: RabbitMQ cuts such a frame into chunks).
        """
        c = self.client()
        c.create("s")
        c.declarePublisher(1, "", "s")
        n = self.backend.chunkMessages * 2 + 10
        c.feed(wire.publishFrame(1, [(i, b"m%d" % i) for i in range(n)]))
        self.settle()
        c.read()
        c.subscribe(1, "s", (wire.OFFSET_LAST, None), credit=100)
        self.settle()
        got = c.deliveries()
        self.assertEqual(got[0][1], n - self.backend.chunkMessages)
        self.assertEqual(sum(len(m) for _, _, m in got), self.backend.chunkMessages)
        # a small last frame: all of it, as before
        c.feed(wire.publishFrame(1, [(n, b"a"), (n + 1, b"b")]))
        self.settle()
        c.read()
        c.subscribe(2, "s", (wire.OFFSET_LAST, None))
        self.settle()
        self.assertEqual([(first, msgs) for sid, first, msgs in c.deliveries() if sid == 2][:1],
                         [(n, [b"a", b"b"])])


class StreamOptionsTests(SynchronousTestCase):
    """--stream, --stream-advertised-host/-port and their config-file keys."""

    def settings(self, argv):
        from otter_tx.service.tap import Options, resolveSettings

        o = Options()
        o.parseOptions(argv)
        return resolveSettings(o)

    def test_default(self):
        s = self.settings([])
        self.assertEqual((s["stream"], s["stream-advertised-host"], s["stream-advertised-port"]),
                         (["tcp:5552"], None, None))

    def test_disabled(self):
        self.assertEqual(self.settings(["--stream", "none"])["stream"], [])

    def test_configFile(self):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write('stream = ["tcp:6000"]\nstream-advertised-host = "broker.example"\n'
                    'stream-advertised-port = 7000\n')
        s = self.settings(["--config", path])
        self.assertEqual((s["stream"], s["stream-advertised-host"], s["stream-advertised-port"]),
                         (["tcp:6000"], "broker.example", 7000))

    def test_badPort(self):
        from twisted.python.usage import UsageError

        self.assertRaises(UsageError, self.settings, ["--stream-advertised-port", "0"])


class CountersTests(OnBrokerStreams, StreamDoorTestCase):
    """
    The stream protocol's rabbitmq_global_* counters (Broker.streamCounters), as RabbitMQ 3.10's
    (checked on the peer): messages received and confirmed, deliveries, publishers and consumers,
    one error per error response after the connection opened (handshake refusals not counted).
    """

    def test_countsAsRabbitMQ(self):
        from otter_tx.test.unit.test_metrics import families, value
        from otter_tx.web.metrics import renderMetrics

        sc = self.broker.streamCounters
        bad = Client(self.factory, self.clock)
        self.assertEqual(bad.handshake(password="wrong"), wire.AUTHENTICATION_FAILURE)
        c = self.client()
        self.assertEqual(c.create("s"), wire.OK)
        self.assertEqual(c.declarePublisher(1, "", "s"), wire.OK)
        c.feed(wire.publishFrame(1, [(1, b"a"), (2, b"b"), (3, b"c")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [1, 2, 3])])
        self.assertEqual(c.subscribe(7, "s"), wire.OK)
        self.settle()
        self.assertEqual(sum(len(ms) for _, _, ms in c.deliveries()), 3)
        # errors: two stream_does_not_exist, a publish error of 2 ids counted once, two unknown
        # subscription ids (unsubscribe and credit)
        self.assertEqual(c.call(wire.DELETE_STREAM, wire.encodeString("nope"))[0], wire.STREAM_DOES_NOT_EXIST)
        self.assertEqual(c.declarePublisher(2, "", "nope"), wire.STREAM_DOES_NOT_EXIST)
        c.feed(wire.publishFrame(9, [(1, b"x"), (2, b"y")]))
        self.assertEqual(c.call(wire.UNSUBSCRIBE, bytes((9,)))[0], wire.SUBSCRIPTION_ID_DOES_NOT_EXIST)
        c.feed(struct.pack(">IHHBH", 7, wire.CREDIT, 1, 9, 1))
        self.settle()
        self.assertEqual((sc.received, sc.confirmed, sc.delivered), (3, 3, 3))
        self.assertEqual(sc.errors, {wire.STREAM_DOES_NOT_EXIST: 2, wire.PUBLISHER_DOES_NOT_EXIST: 1,
                                     wire.SUBSCRIPTION_ID_DOES_NOT_EXIST: 2})
        fams = families(renderMetrics(self.broker, 1.0, False))
        stream = {"protocol": "stream"}
        for name, want in (("rabbitmq_global_messages_received_total", 3),
                           ("rabbitmq_global_messages_received_confirm_total", 3),
                           ("rabbitmq_global_messages_confirmed_total", 3),
                           ("rabbitmq_global_messages_routed_total", 0),
                           ("rabbitmq_global_publishers", 1), ("rabbitmq_global_consumers", 1),
                           ("rabbitmq_global_stream_error_stream_does_not_exist_total", 2),
                           ("rabbitmq_global_stream_error_subscription_id_does_not_exist_total", 2),
                           ("rabbitmq_global_stream_error_authentication_failure_total", 0)):
            self.assertEqual(value(fams, name, **stream), want, name)
        self.assertEqual(value(fams, "rabbitmq_global_messages_delivered_total", protocol="stream",
                               queue_type="rabbit_stream_queue"), 3)
        self.assertEqual(value(fams, "rabbitmq_global_messages_delivered_consume_auto_ack_total",
                               protocol="stream", queue_type="rabbit_stream_queue"), 0)
        c.proto.connectionLost(None)
        self.assertEqual((sc.publishers(), sc.consumers()), (0, 0))
