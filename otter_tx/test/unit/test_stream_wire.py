"""
otter_tx.stream: the stream protocol's frames (byte vectors from
PROTOCOL.adoc and rabbit_stream_core.erl), the OSIRIS chunk, AMQP 1.0 messages.
"""

import struct
import zlib

from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import ByteArray, TaggedInt, Timestamp
from otter_tx.stream import amqp10, chunk, wire


class FrameReaderTests(SynchronousTestCase):
    def test_splitsFrames(self):
        """Size-prefixed frames split across reads come out whole."""
        r = wire.FrameReader(0)
        data = wire.heartbeat() + wire.heartbeat()
        self.assertEqual(r.feed(data[:3]), [])
        self.assertEqual(r.feed(data[3:10]), [b"\x00\x17\x00\x01"])
        self.assertEqual(r.buffered(), 2)
        self.assertEqual(r.feed(data[10:]), [b"\x00\x17\x00\x01"])

    def test_frameTooLarge(self):
        """A size above frame_max is refused as soon as the 4 size bytes are in."""
        r = wire.FrameReader(8192)
        e = self.assertRaises(wire.FrameTooLarge, r.feed, struct.pack(">I", 8193))
        self.assertEqual((e.size, e.frameMax), (8193, 8192))


class DecodeTests(SynchronousTestCase):
    def test_peerProperties(self):
        body = bytes.fromhex("0011 0001 00000001 00000001 0004 6e616d65 0001 78".replace(" ", ""))
        self.assertEqual(wire.decodeFrame(body), (17, 1, 1, ({"name": "x"},)))

    def test_saslAuthenticate(self):
        body = (b"\x00\x13\x00\x01\x00\x00\x00\x03" + wire.encodeString("PLAIN")
                + b"\x00\x00\x00\x0c\x00guest\x00guest")
        self.assertEqual(wire.decodeFrame(body), (19, 1, 3, ("PLAIN", b"\x00guest\x00guest")))

    def test_tuneBothForms(self):
        """The client's tune answer, with or without the response bit."""
        for key in (0x0014, 0x8014):
            body = struct.pack(">HHII", key, 1, 1048576, 60)
            self.assertEqual(wire.decodeFrame(body), (20, 1, None, (1048576, 60)))

    def test_subscribe(self):
        body = (struct.pack(">HHIB", 7, 1, 9, 3) + wire.encodeString("s") + struct.pack(">HQH", 4, 42, 10)
                + wire.encodeStringMap({"name": "c"}))
        self.assertEqual(wire.decodeFrame(body), (7, 1, 9, (3, "s", (4, 42), 10, {"name": "c"})))

    def test_subscribeTimestampNoProperties(self):
        body = struct.pack(">HHIB", 7, 1, 9, 3) + wire.encodeString("s") + struct.pack(">HqH", 5, -1, 1)
        self.assertEqual(wire.decodeFrame(body)[3], (3, "s", (5, -1), 1, {}))

    def test_credit(self):
        self.assertEqual(wire.decodeFrame(struct.pack(">HHBH", 9, 1, 2, 5)), (9, 1, None, (2, 5)))

    def test_storeOffset(self):
        body = struct.pack(">HH", 10, 1) + wire.encodeString("r") + wire.encodeString("s") + struct.pack(">Q", 7)
        self.assertEqual(wire.decodeFrame(body), (10, 1, None, ("r", "s", 7)))

    def test_publishV1(self):
        frame = wire.publishFrame(1, [(5, b"ab"), (6, b"c")])
        key, version, corr, args = wire.decodeFrame(frame[4:])
        self.assertEqual((key, version, corr), (2, 1, None))
        pid, count, body, pos = args
        self.assertEqual((pid, count), (1, 2))
        self.assertEqual(wire.publishedMessages(body, pos, count, version), [(5, b"ab"), (6, b"c")])

    def test_publishV2FilterValue(self):
        frame = wire.publishFrame(1, [(5, "f", b"ab"), (6, None, b"c")], version=2)
        key, version, corr, (pid, count, body, pos) = wire.decodeFrame(frame[4:])
        self.assertEqual(wire.publishedMessages(body, pos, count, version), [(5, b"ab"), (6, b"c")])

    def test_subEntryBatch(self):
        """An uncompressed and a gzip sub-entry batch give their messages back."""
        inner = struct.pack(">I", 1) + b"a" + struct.pack(">I", 2) + b"bc"
        for ctype, data in ((0, inner), (1, _gzip(inner))):
            entry = (struct.pack(">Q", 9) + struct.pack(">BH", 0x80 | (ctype << 4), 2)
                     + struct.pack(">II", len(inner), len(data)) + data)
            body = struct.pack(">HHBI", 2, 1, 1, 1) + entry
            (pubId, batch), = wire.publishedMessages(body, 9, 1, 1)
            self.assertEqual(pubId, 9)
            self.assertEqual(batch.messages(), [b"a", b"bc"])

    def test_shortFrame(self):
        self.assertRaises(wire.FrameError, wire.decodeFrame, b"\x00\x0d\x00\x01\x00\x00\x00\x01\x00\x05ab")

    def test_unknownCommand(self):
        self.assertRaises(wire.FrameError, wire.decodeFrame, b"\x00\x7f\x00\x01\x00\x00\x00\x01")

    def test_trailingBytes(self):
        body = struct.pack(">HHIB", 6, 1, 1, 2) + b"x"
        self.assertRaises(wire.FrameError, wire.decodeFrame, body)

    def test_createSuperStream(self):
        body = (struct.pack(">HHI", 29, 1, 4) + wire.encodeString("ss") + struct.pack(">I", 2)
                + wire.encodeString("ss-0") + wire.encodeString("ss-1") + struct.pack(">I", 2)
                + wire.encodeString("0") + wire.encodeString("1") + wire.encodeStringMap({}))
        self.assertEqual(wire.decodeFrame(body)[3], ("ss", ["ss-0", "ss-1"], ["0", "1"], {}))


class EncodeTests(SynchronousTestCase):
    def test_response(self):
        self.assertEqual(wire.response(wire.CREATE_STREAM, 7, wire.STREAM_ALREADY_EXISTS),
                         bytes.fromhex("0000000a800d000100000007" "0005"))

    def test_publishConfirm(self):
        self.assertEqual(wire.publishConfirm(1, [1, 2]),
                         bytes.fromhex("00000019" "0003" "0001" "01" "00000002"
                                       "0000000000000001" "0000000000000002"))

    def test_publishError(self):
        self.assertEqual(wire.publishError(3, [(9, 0x12)]),
                         bytes.fromhex("00000013" "0004" "0001" "03" "00000001" "0000000000000009" "0012"))

    def test_creditResponseHasNoCorrelationId(self):
        self.assertEqual(wire.creditResponse(wire.SUBSCRIPTION_ID_DOES_NOT_EXIST, 7),
                         bytes.fromhex("00000007" "8009" "0001" "0004" "07"))

    def test_tune(self):
        self.assertEqual(wire.tune(1048576, 60), bytes.fromhex("0000000c" "0014" "0001" "00100000" "0000003c"))

    def test_metadata(self):
        """Brokers by index; a missing stream has leader 0xffff and no replicas (rabbit_stream_core)."""
        out = wire.metadataResponse(5, [("h", 5552)], [("s", wire.OK, 0, []),
                                                      ("m", wire.STREAM_DOES_NOT_EXIST, 0, [])])
        self.assertEqual(out, bytes.fromhex(
            "0000002f" "800f0001" "00000005"
            "00000001" "0000" "000168" "000015b0"
            "00000002" "000173" "0001" "0000" "00000000"
            "00016d" "0002" "ffff" "00000000"))

    def test_deliverHeader(self):
        self.assertEqual(wire.deliverHeader(4, 100), bytes.fromhex("00000069" "0008" "0001" "04"))
        self.assertEqual(wire.deliverHeader(4, 100, 2, 9),
                         bytes.fromhex("00000071" "0008" "0002" "04" "0000000000000009"))

    def test_saslHandshake(self):
        self.assertEqual(wire.saslHandshakeResponse(2, ["PLAIN"]),
                         bytes.fromhex("00000015" "8012" "0001" "00000002" "0001" "00000001" "0005") + b"PLAIN")

    def test_consumerUpdate(self):
        self.assertEqual(wire.consumerUpdateRequest(3, 1, True),
                         bytes.fromhex("0000000a" "001a" "0001" "00000003" "01" "01"))

    def test_responseNames(self):
        self.assertEqual(wire.responseName(wire.NO_OFFSET), "NO_OFFSET")
        self.assertEqual(wire.responseName(0x99), "0x99")


class ChunkTests(SynchronousTestCase):
    def test_layout(self):
        """The 48-byte header as RabbitMQ 3.10 sends it (magic/version 0x50, epoch 1, no trailer)."""
        c = chunk.chunk(10, [b"a", b"bc"], 1700000000000)
        data = b"\x00\x00\x00\x01a\x00\x00\x00\x02bc"
        self.assertEqual(c[:48], bytes.fromhex("50" "00" "0002" "00000002") + struct.pack(">q", 1700000000000)
                         + struct.pack(">QQI", 1, 10, zlib.crc32(data)) + struct.pack(">II", len(data), 0)
                         + b"\x00\x00\x00\x00")
        self.assertEqual(c[48:], data)
        self.assertEqual(chunk.parse(c), (10, 1700000000000, [b"a", b"bc"]))


class Amqp10Tests(SynchronousTestCase):
    def test_fromAmqp091(self):
        """RabbitMQ 3.10's bytes for two AMQP 0-9-1 messages (captured from the peer)."""
        m = amqp10.fromAmqp091({"delivery_mode": 2}, b"hi", "", "conv1")
        self.assertEqual(m.hex(), (
            "005372c13e06a30d782d726f7574696e672d6b6579a105636f6e7631a30a782d65786368616e6765a100"
            "a315782d62617369632d64656c69766572792d6d6f64655002005375a0026869"))
        props = {"content_type": "text/plain", "content_encoding": "gzip", "message_id": "m1",
                 "correlation_id": "c1", "reply_to": "r", "expiration": "100000", "priority": 3,
                 "timestamp": Timestamp(1700000000), "type": "t", "app_id": "a", "user_id": "guest",
                 "headers": {"s": "x", "i": 5, "l": 2 ** 40, "b": True, "bin": ByteArray(b"\x00\x01"),
                             "arr": [1], "tbl": {"a": 1}}}
        m = amqp10.fromAmqp091(props, b"full", "", "conv1")
        self.assertEqual(m.hex(), (
            "005372c15508a30d782d726f7574696e672d6b6579a105636f6e7631a30a782d65786368616e6765a100"
            "a310782d62617369632d7072696f726974795003a312782d62617369632d65787069726174696f6ea106"
            "313030303030005373c0340da1026d31a00567756573744040a10172a1026331a30a746578742f706c61"
            "696ea304677a697040830000018bcfe56800404040005374c14a0ea10c782d62617369632d74797065a1"
            "0174a10e782d62617369632d6170702d6964a10161a10173a10178a101695405a1016c81000001000000"
            "0000a101625601a10362696ea0020001005375a00466756c6c"))

    def test_roundTrip(self):
        props = {"content_type": "text/plain", "content_encoding": "gzip", "message_id": "m1",
                 "correlation_id": "c1", "reply_to": "r", "expiration": "1000", "priority": 3,
                 "timestamp": Timestamp(1700000000), "type": "t", "app_id": "a", "user_id": "guest",
                 "delivery_mode": 2,
                 "headers": {"s": "x", "i": 5, "l": 2 ** 40, "b": True, "u8": TaggedInt(7, "B"),
                             "ts": Timestamp(5), "bin": b"\x00"}}
        out, body = amqp10.toAmqp091(amqp10.fromAmqp091(props, b"body"))
        self.assertEqual(body, b"body")
        self.assertEqual(out, props)

    def test_streamClientMessage(self):
        """A message a stream client sends (properties, application properties, data) reads as 0-9-1."""
        m = amqp10.encodeMessage(b"x", properties={"message_id": amqp10.Typed("ulong", 7),
                                                   "content_type": amqp10.Typed("symbol", "a/b")},
                                 applicationProperties={"k": "v"})
        props, body = amqp10.toAmqp091(m)
        self.assertEqual(body, b"x")
        self.assertEqual(props, {"message_id": "7", "content_type": "a/b",
                                 "headers": {"x-message-id-type": "ulong", "k": "v"}})

    def test_notAMessage(self):
        self.assertRaises(amqp10.DecodeError, amqp10.toAmqp091, b"\x41")


def _gzip(data):
    c = zlib.compressobj(wbits=31)
    return c.compress(data) + c.flush()
