"""
Robustness: mutated and random frame streams never raise out of the
protocol, never log an internal error, never answer 541 INTERNAL_ERROR, and
leave the broker serving other connections (deterministic seeds;
StringTransport and task.Clock).

The generators here (:func:`validSession`, :func:`mutate`,
:func:`mutateFrames`, :func:`randomFrames`) also drive the long run against
a real broker process in ``bench/fuzz.py`` (issue 8).
"""

import random
import struct

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory, frame, methodFrame
from otter_tx.testing import FakeClient


def validSession():
    """A realistic client byte stream after the handshake."""
    out = [
        methodFrame(1, spec.ChannelOpen("")),
        methodFrame(1, spec.ExchangeDeclare(0, "x", "topic", arguments={"alternate-exchange": "ae"})),
        methodFrame(1, spec.QueueDeclare(0, "q", arguments={"x-message-ttl": 100, "x-max-length": 3,
                                                           "x-dead-letter-exchange": ""})),
        methodFrame(1, spec.QueueBind(0, "q", "x", "a.#")),
        methodFrame(1, spec.BasicQos(0, 2, False)),
        methodFrame(1, spec.ConfirmSelect(False)),
        methodFrame(1, spec.BasicConsume(0, "q", "c1")),
    ]
    for i in range(4):
        body = b"body-%d" % i
        props = encodeProperties({"headers": {"CC": ["q"], "n": i}, "expiration": "50", "priority": 1})
        out.append(methodFrame(1, spec.BasicPublish(0, "x", "a.b", True, False)))
        out.append(frame(2, 1, struct.pack("!HHQ", 60, 0, len(body)) + props))
        out.append(frame(3, 1, body))
    out += [
        methodFrame(1, spec.BasicAck(1, False)),
        methodFrame(1, spec.BasicNack(2, True, False)),
        methodFrame(1, spec.BasicGet(0, "q", False)),
        methodFrame(1, spec.BasicReject(3, True)),
        methodFrame(1, spec.BasicRecover(True)),
        methodFrame(1, spec.TxSelect()),
        methodFrame(1, spec.QueuePurge(0, "q")),
        methodFrame(1, spec.QueueUnbind(0, "q", "x", "a.#")),
        methodFrame(1, spec.ExchangeDelete(0, "x")),
        methodFrame(1, spec.BasicCancel("c1")),
        methodFrame(1, spec.QueueDelete(0, "q")),
        methodFrame(1, spec.ChannelClose(200, "", 0, 0)),
        methodFrame(0, spec.ConnectionClose(200, "", 0, 0)),
    ]
    return out


def mutate(rnd, frames):
    data = bytearray(b"".join(frames))
    for _ in range(rnd.randint(1, 6)):
        op = rnd.random()
        i = rnd.randrange(len(data))
        if op < 0.4:
            data[i] = rnd.randrange(256)
        elif op < 0.6:
            del data[i : i + rnd.randint(1, 8)]
        elif op < 0.8:
            data[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        else:
            j = rnd.randrange(len(data))
            data[i:i] = data[j : j + rnd.randint(1, 40)]
    return bytes(data)


def mutateFrames(rnd, frames):
    """
    Mutate the payloads of some of ``frames`` (wire frames) and re-frame
    them with a consistent size, so that the decoders (not the framing)
    see truncated, extended and corrupted arguments: short ``basic.ack``,
    cut tables, bad type tags, 2-octet method frames, deep tables.
    Returns ``(bytes, frameCount)``.
    """
    out = []
    for f in frames:
        ftype, ch, size = struct.unpack_from("!BHI", f, 0)
        payload = bytearray(f[7 : 7 + size])
        if rnd.random() < 0.3:
            op = rnd.random()
            if op < 0.3 and payload:
                del payload[rnd.randrange(len(payload)) :]
            elif op < 0.5:
                payload += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 12)))
            elif op < 0.7 and payload:
                for _ in range(rnd.randint(1, 3)):
                    payload[rnd.randrange(len(payload))] = rnd.randrange(256)
            elif op < 0.8 and len(payload) > 4:
                # a field type tag where a table may be
                payload[rnd.randrange(4, len(payload))] = rnd.choice(b"FASsIlLtTdfDxVZ\x00")
            elif op < 0.9:
                ch = rnd.choice([0, 1, 2, ch])
            else:
                ftype = rnd.choice([1, 2, 3, 8, 9])
        out.append(frame(ftype, ch, bytes(payload)))
    return b"".join(out), len(out)


def randomFrames(rnd, count):
    """``count`` well-framed frames of random type, channel and payload: ``bytes``."""
    out = []
    for _ in range(count):
        ftype = rnd.choice([1, 1, 1, 2, 3, 8, rnd.randrange(256)])
        ch = rnd.choice([0, 1, 1, 2, rnd.randrange(65536)])
        payload = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 2, 4, 8, 13, 14, rnd.randint(0, 64)])))
        if ftype == 1 and len(payload) >= 4 and rnd.random() < 0.7:
            # a known method id, so the argument decoders are reached
            cid, mid = rnd.choice(sorted(spec.METHODS))
            payload = struct.pack("!HH", cid, mid) + payload[4:]
        out.append(frame(ftype, ch, payload))
    return b"".join(out)


def closeCodes(data):
    """Reply codes of the connection.close / channel.close frames in server output ``data``."""
    codes = []
    off = 0
    while len(data) - off >= 8:
        ftype, _, size = struct.unpack_from("!BHI", data, off)
        payload = data[off + 7 : off + 7 + size]
        off += size + 8
        if ftype == 1 and payload[:4] in (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28"):
            codes.append(struct.unpack_from("!H", payload, 4)[0])
    return codes


class FuzzTests(SynchronousTestCase):
    """Malformed input is an AMQP error, never a crash."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0)

    def check(self, data, chunk):
        c = FakeClient(self.factory)
        c.received()
        for i in range(0, len(data), chunk):
            c.feed(data[i : i + chunk])
        self.clock.advance(1)
        self.assertNotIn(541, closeCodes(c.transport.value()))
        c.protocol.connectionLost(None)

    def test_mutatedSessions(self):
        """2,000 randomly mutated valid sessions cause no internal error."""
        rnd = random.Random(1122)
        frames = validSession()
        for _ in range(2000):
            self.check(mutate(rnd, frames), rnd.choice([1, 7, 64, 4096]))
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_mutatedHandshakes(self):
        """1,000 mutated handshakes (header, start-ok, tune-ok, open) cause no internal error."""
        rnd = random.Random(99)
        handshake = [
            spec.PROTOCOL_HEADER,
            methodFrame(0, spec.ConnectionStartOk({"capabilities": {"a": True}}, "AMQPLAIN",
                                                  b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x05guest",
                                                  "en_US")),
            methodFrame(0, spec.ConnectionTuneOk(2047, 131072, 60)),
            methodFrame(0, spec.ConnectionOpen("/", "", False)),
        ] + validSession()[:6]
        for _ in range(1000):
            c = FakeClient(self.factory, handshake=False)
            data = mutate(rnd, handshake)
            for i in range(0, len(data), 11):
                c.feed(data[i : i + 11])
            self.clock.advance(11)
            c.protocol.connectionLost(None)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_randomBytes(self):
        """Random bytes after the handshake cause no internal error."""
        rnd = random.Random(7)
        for _ in range(500):
            data = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 300)))
            self.check(data, 13)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_mutatedFramePayloads(self):
        """3,000 sessions with mutated, re-framed payloads (10,000+ frames) get protocol errors, never 541."""
        rnd = random.Random(2026)
        frames = validSession()
        total = 0
        for _ in range(3000):
            data, n = mutateFrames(rnd, frames)
            total += n
            self.check(data, rnd.choice([7, 4096]))
        self.assertGreater(total, 10000)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_randomFrames(self):
        """Well-framed random frames (known method ids, random arguments) never get 541."""
        rnd = random.Random(11)
        for _ in range(1000):
            self.check(validSession()[0] + randomFrames(rnd, 10), 4096)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_brokerStillServes(self):
        """After the fuzzing, a fresh connection still works end to end."""
        rnd = random.Random(3)
        frames = validSession()
        for _ in range(200):
            self.check(mutate(rnd, frames), 64)
        c = FakeClient(self.factory)
        c.openChannel(1)
        c.send(1, spec.QueueDeclare(0, "ok"))
        c.publish(1, "", "ok", b"fine")
        c.send(1, spec.BasicGet(0, "ok", True))
        out = c.received()
        self.assertEqual(out[-1][2][1], b"fine")
