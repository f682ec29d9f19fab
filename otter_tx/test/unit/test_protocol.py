"""
Deterministic tests for otter_tx.door.protocol and otter_tx.door.channel driven with
StringTransport and task.Clock (otter_tx.testing.FakeClient).
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyClass, verifyObject

from otter_tx.amqp import spec
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import CLOSE_OK_DELAY, AMQPServerFactory
from otter_tx.testing import FakeClient


class ProtocolTestCase(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock, memoryHighWatermark=None)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0, handshakeTimeout=10)

    def client(self, **kw):
        c = FakeClient(self.factory, **kw)
        return c

    def ready(self):
        c = self.client()
        c.openChannel(1)
        return c

    def withHeartbeat(self, seconds):
        """An opened connection whose tune-ok asked for a ``seconds`` heartbeat."""
        c = self.client(handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        c.send(0, spec.ConnectionStartOk({}, "PLAIN", b"\0guest\0guest", "en_US"))
        c.send(0, spec.ConnectionTuneOk(2047, 131072, seconds))
        c.send(0, spec.ConnectionOpen("/", "", False))
        c.received()
        return c


class SeamTests(ProtocolTestCase):
    """The connection implements what the broker core calls on it."""

    def test_clientConnection(self):
        """AMQPServerProtocol provides IClientConnection, IConnectionInfo and ISessionClient."""
        from otter_tx.broker.interfaces import IClientConnection, IConnectionInfo, ISessionClient

        c = self.ready()
        for iface in (IClientConnection, IConnectionInfo, ISessionClient):
            self.assertTrue(verifyClass(iface, type(c.protocol)))
            self.assertTrue(verifyObject(iface, c.protocol))


class HandshakeTests(ProtocolTestCase):
    """Connection negotiation."""

    def test_startAdvertisesCapabilities(self):
        """connection.start is 0-9 with PLAIN AMQPLAIN and RabbitMQ capability names."""
        c = self.client(handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        [(ch, m, _)] = c.received()
        self.assertIsInstance(m, spec.ConnectionStart)
        self.assertEqual((m.version_major, m.version_minor), (0, 9))
        self.assertEqual(m.mechanisms, b"PLAIN AMQPLAIN")
        caps = m.server_properties["capabilities"]
        for name in ("publisher_confirms", "basic.nack", "consumer_cancel_notify",
                     "connection.blocked", "per_consumer_qos", "exchange_exchange_bindings"):
            self.assertIs(caps[name], True)
        self.assertEqual(m.server_properties["product"], "otter_tx")

    def test_openOk(self):
        """A full handshake ends with connection.open-ok."""
        c = self.client(handshake=False)
        out = [m for _, m, _ in c.handshake()]
        self.assertIsInstance(out[-1], spec.ConnectionOpenOk)

    def test_badHeader(self):
        """Another protocol header gets the 0-9-1 header and the socket closed."""
        c = self.client(handshake=False)
        c.feed(b"HTTP/1.1")
        self.assertEqual(c.transport.value(), spec.PROTOCOL_HEADER)
        self.assertTrue(c.transport.disconnecting)

    def test_oldHeaderAccepted(self):
        """The 0-9 protocol header is accepted like RabbitMQ does."""
        c = self.client(handshake=False)
        c.feed(spec.PROTOCOL_HEADER_0_9)
        self.assertIsInstance(c.received()[0][1], spec.ConnectionStart)

    def test_badPassword(self):
        """A wrong password closes the connection with 403 ACCESS_REFUSED."""
        c = self.client(handshake=False)
        out = c.handshake(password="nope")
        close = [m for _, m, _ in out if isinstance(m, spec.ConnectionClose)][0]
        self.assertEqual(close.reply_code, 403)
        self.assertIn("Login was refused using authentication mechanism PLAIN", close.reply_text)

    def test_guestOnlyFromLoopback(self):
        """guest may not log in from a non-loopback address."""
        c = self.client(handshake=False, peerHost="10.1.2.3")
        close = [m for _, m, _ in c.handshake() if isinstance(m, spec.ConnectionClose)][0]
        self.assertEqual(close.reply_code, 403)

    def test_unknownVhost(self):
        """Opening an unknown vhost gives 530 NOT_ALLOWED."""
        c = self.client(handshake=False)
        close = [m for _, m, _ in c.handshake(vhost="nope") if isinstance(m, spec.ConnectionClose)][0]
        self.assertEqual((close.reply_code, close.reply_text), (530, "NOT_ALLOWED - vhost nope not found"))

    def test_handshakeTimeout(self):
        """A client that says nothing is dropped after the handshake timeout."""
        c = self.client(handshake=False)
        self.clock.advance(9.9)
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(c.transport.disconnecting)

    def test_heartbeatTimeout(self):
        """A silent peer is closed after two missed heartbeat intervals; heartbeats are sent meanwhile."""
        c = self.withHeartbeat(1)
        for _ in range(4):
            self.clock.advance(0.5)
        self.assertIn((0, "heartbeat", None), c.received())
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(0.5)
        self.assertTrue(c.transport.disconnecting)


class ChannelTests(ProtocolTestCase):
    """Channel-level behaviour and error classes."""

    def test_channelErrorKeepsConnection(self):
        """A 404 closes only the channel."""
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "missing", True))
        [(ch, m, _)] = c.received()
        self.assertEqual((ch, m.reply_code), (1, 404))
        self.assertEqual(m.reply_text, "NOT_FOUND - no queue 'missing' in vhost '/'")
        self.assertEqual((m.class_id, m.method_id), (50, 10))
        c.send(1, spec.ChannelCloseOk())
        c.openChannel(1)
        c.send(1, spec.QueueDeclare(0, "q"))
        self.assertIsInstance(c.methods()[0], spec.QueueDeclareOk)

    def test_framesIgnoredWhileClosing(self):
        """After channel.close is sent, other frames on that channel are ignored until close-ok."""
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "missing", True))
        c.received()
        c.send(1, spec.QueueDeclare(0, "q"))
        self.assertEqual(c.received(), [])

    def test_immediateIsConnectionError(self):
        """basic.publish immediate=true is a 540 connection error."""
        c = self.ready()
        c.send(1, spec.BasicPublish(0, "", "q", False, True))
        [(ch, m, _)] = c.received()
        self.assertEqual((ch, m.reply_code, m.reply_text), (0, 540, "NOT_IMPLEMENTED - immediate=true"))

    def test_unknownDeliveryTag(self):
        """Acking an unknown delivery tag gives 406 unknown delivery tag."""
        c = self.ready()
        c.send(1, spec.BasicAck(99, False))
        [(ch, m, _)] = c.received()
        self.assertEqual((m.reply_code, m.reply_text), (406, "PRECONDITION_FAILED - unknown delivery tag 99"))

    def test_prefetchSizeNotImplemented(self):
        """basic.qos with prefetch_size gives connection 540."""
        c = self.ready()
        c.send(1, spec.BasicQos(10, 0, False))
        [(ch, m, _)] = c.received()
        self.assertEqual((ch, m.reply_code, m.reply_text), (0, 540, "NOT_IMPLEMENTED - prefetch_size!=0 (10)"))


class MessagingTests(ProtocolTestCase):
    """Publish, consume, get, ack, confirms and transactions end to end in memory."""

    def declare(self, c, name="q", **args):
        c.send(1, spec.QueueDeclare(0, name, arguments=args))
        return c.methods()

    def test_consumeConsumeOkBeforeDeliveries(self):
        """consume-ok precedes the first deliveries of already-queued messages."""
        c = self.ready()
        self.declare(c)
        c.publish(1, "", "q", b"one")
        c.send(1, spec.BasicConsume(0, "q", "t"))
        out = c.received()
        self.assertIsInstance(out[0][1], spec.BasicConsumeOk)
        self.assertIsInstance(out[1][1], spec.BasicDeliver)
        self.assertEqual(out[1][2][1], b"one")

    def test_prefetchLimitsDeliveries(self):
        """Per-consumer prefetch bounds unacked deliveries; acks release more."""
        c = self.ready()
        self.declare(c)
        for i in range(5):
            c.publish(1, "", "q", b"%d" % i)
        c.send(1, spec.BasicQos(0, 2, False))
        c.send(1, spec.BasicConsume(0, "q", "t"))
        delivers = [m for _, m, _ in c.received() if isinstance(m, spec.BasicDeliver)]
        self.assertEqual(len(delivers), 2)
        c.send(1, spec.BasicAck(2, True))
        delivers = [m for _, m, _ in c.received() if isinstance(m, spec.BasicDeliver)]
        self.assertEqual([d.delivery_tag for d in delivers], [3, 4])

    def test_largeBodySplitByFrameMax(self):
        """A body larger than frame_max arrives in several frames and is reassembled."""
        c = self.ready()
        self.declare(c)
        body = bytes(range(256)) * 2000
        c.publish(1, "", "q", body, frameMax=4096)
        c.send(1, spec.BasicGet(0, "q", True))
        [(_, m, (props, got))] = c.received()
        self.assertIsInstance(m, spec.BasicGetOk)
        self.assertEqual(got, body)

    def test_contentHeaderForwardedUntouched(self):
        """
        Delivered content-header property bytes are the publisher's own,
        byte for byte: a headers table with field types and key order the
        canonical encoder would not write (``b`` and ``l`` for small
        integers, where it writes ``I``; keys not in its order) comes back
        as sent, not re-encoded.
        """
        import struct

        from otter_tx.amqp.codec import decodeProperties, encodeProperties
        from otter_tx.door.protocol import frame, methodFrame

        c = self.ready()
        self.declare(c)
        table = b"\x01kb\x05" + b"\x01al" + struct.pack("!q", 1)
        # property flags: content-type (bit 15) and headers (bit 13)
        propsRaw = struct.pack("!H", 0x8000 | 0x2000) + b"\x03x/y" + struct.pack("!I", len(table)) + table
        # the bytes decode to properties the canonical encoder writes differently
        self.assertEqual(decodeProperties(propsRaw), {"content_type": "x/y", "headers": {"k": 5, "a": 1}})
        self.assertNotEqual(encodeProperties(decodeProperties(propsRaw)), propsRaw)
        c.feed(methodFrame(1, spec.BasicPublish(0, "", "q", False, False))
               + frame(2, 1, struct.pack("!HHQ", 60, 0, 1) + propsRaw)
               + frame(3, 1, b"b"))
        c.transport.clear()
        c.send(1, spec.BasicGet(0, "q", True))
        raw = c.transport.value()
        headers = []
        while raw:
            ftype, _, size = struct.unpack("!BHI", raw[:7])
            if ftype == 2:
                headers.append(raw[7 + 12 : 7 + size])
            raw = raw[8 + size :]
        self.assertEqual(headers, [propsRaw])

    def test_confirmsCoalesced(self):
        """Confirms for publishes in one read are one basic.ack multiple=true."""
        c = self.ready()
        self.declare(c)
        c.send(1, spec.ConfirmSelect(False))
        c.received()
        import struct
        from otter_tx.door.protocol import frame, methodFrame
        data = b""
        for i in range(3):
            data += methodFrame(1, spec.BasicPublish(0, "", "q", False, False))
            data += frame(2, 1, struct.pack("!HHQH", 60, 0, 1, 0))
            data += frame(3, 1, b"x")
        c.feed(data)
        [(_, ack, _)] = c.received()
        self.assertEqual((ack.delivery_tag, ack.multiple), (3, True))

    def test_rejectPublishNack(self):
        """reject-publish overflow produces basic.nack for that publish."""
        c = self.ready()
        self.declare(c, **{"x-max-length": 1, "x-overflow": "reject-publish"})
        c.send(1, spec.ConfirmSelect(False))
        c.received()
        c.publish(1, "", "q", b"1")
        c.publish(1, "", "q", b"2")
        out = c.methods()
        self.assertEqual(
            [(type(m), m.delivery_tag) for m in out],
            [(spec.BasicAck, 1), (spec.BasicNack, 2)],
        )

    def test_mandatoryReturn(self):
        """An unroutable mandatory publish comes back as basic.return 312 NO_ROUTE."""
        c = self.ready()
        c.publish(1, "", "nowhere", b"b", mandatory=True)
        [(_, m, (_, body))] = c.received()
        self.assertEqual((m.reply_code, m.reply_text, body), (312, "NO_ROUTE", b"b"))

    def test_txRollbackDiscardsPublishes(self):
        """Publishes in a rolled-back transaction are never enqueued; committed ones are."""
        c = self.ready()
        self.declare(c)
        c.send(1, spec.TxSelect())
        c.publish(1, "", "q", b"gone")
        c.send(1, spec.TxRollback())
        c.publish(1, "", "q", b"kept")
        c.send(1, spec.TxCommit())
        c.received()
        self.assertEqual(self.broker.vhosts["/"].queues["q"].readyCount, 1)

    def test_txRollbackRestoresAcks(self):
        """Acks in a rolled-back transaction are undone: the delivery can be acked again."""
        c = self.ready()
        self.declare(c)
        c.publish(1, "", "q", b"m")
        c.send(1, spec.BasicGet(0, "q", False))
        c.send(1, spec.TxSelect())
        c.send(1, spec.BasicAck(1, False))
        c.send(1, spec.TxRollback())
        c.send(1, spec.BasicAck(1, False))
        c.send(1, spec.TxCommit())
        out = c.methods()
        self.assertIsInstance(out[-1], spec.TxCommitOk)
        self.assertEqual(self.broker.vhosts["/"].queues["q"].unackedCount, 0)

    def test_channelCloseRequeues(self):
        """Closing a channel requeues its unacked messages with redelivered set."""
        c = self.ready()
        self.declare(c)
        c.publish(1, "", "q", b"m")
        c.send(1, spec.BasicGet(0, "q", False))
        c.send(1, spec.ChannelClose(200, "", 0, 0))
        c.received()
        c.openChannel(2)
        c.send(2, spec.BasicGet(0, "q", True))
        [(_, m, _)] = c.received()
        self.assertTrue(m.redelivered)

    def test_queueDeleteCancelsConsumers(self):
        """Deleting a queue sends basic.cancel to its consumers."""
        c = self.ready()
        self.declare(c)
        c.send(1, spec.BasicConsume(0, "q", "t"))
        c.received()
        other = self.ready()
        other.send(1, spec.QueueDelete(0, "q"))
        [(_, m, _)] = c.received()
        self.assertEqual((type(m), m.consumer_tag), (spec.BasicCancel, "t"))

    def test_slowConsumerBackpressure(self):
        """While the transport is paused, no more messages are pushed to the consumer."""
        c = self.ready()
        self.declare(c)
        c.send(1, spec.BasicConsume(0, "q", "t", no_ack=True))
        c.received()
        c.protocol.pauseProducing()
        for i in range(3):
            c.publish(1, "", "q", b"x")
        self.assertEqual([m for m in c.methods() if isinstance(m, spec.BasicDeliver)], [])
        c.protocol.resumeProducing()
        self.assertEqual(len([m for m in c.methods() if isinstance(m, spec.BasicDeliver)]), 3)

    def test_memoryAlarmBlocks(self):
        """Over the high-watermark, the next publish gets connection.blocked and stops reading; below 0.9x, unblocked."""
        used = [0]
        self.broker.memoryHighWatermark = 1000
        self.broker.memoryMonitor.probe = lambda: used[0]
        c = self.ready()
        self.declare(c)
        c.publish(1, "", "q", b"x" * 20)
        used[0] = 1001
        self.broker.memoryMonitor.check()
        self.assertEqual(c.received(), [])  # told only when it publishes, as RabbitMQ
        c.publish(1, "", "q", b"y")
        [(_, m, _)] = c.received()
        self.assertIsInstance(m, spec.ConnectionBlocked)
        self.assertEqual(m.reason, "low on memory")
        self.assertEqual(c.transport.producerState, "paused")
        used[0] = 899
        self.broker.memoryMonitor.check()
        self.assertIsInstance(c.methods()[0], spec.ConnectionUnblocked)
        self.assertEqual(c.transport.producerState, "producing")


class AckTimeoutTests(ProtocolTestCase):
    """The delivery acknowledgement timeout (RabbitMQ consumer_timeout)."""

    def test_overdueChannelClosed(self):
        """A delivery unacked for longer than the timeout closes its channel with RabbitMQ's 406; the message is requeued."""
        self.broker.consumerTimeout = 5000
        self.broker.startAckTimeoutChecks()
        self.addCleanup(self.broker.stop)
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "q"))
        c.publish(1, "", "q", b"held")
        c.send(1, spec.BasicConsume(0, "q", "t"))
        c.received()
        for _ in range(4):
            self.clock.advance(1.25)
        self.assertEqual(c.received(), [])
        for _ in range(2):
            self.clock.advance(2.5)
        [(ch, m, _)] = c.received()
        self.assertEqual((ch, m.reply_code), (1, 406))
        self.assertEqual(
            m.reply_text,
            "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value "
            "used: 5000 ms. This timeout value can be configured, see consumers doc guide to learn more",
        )
        q = self.broker.vhosts["/"].queues["q"]
        self.assertEqual((q.readyCount, q.unackedCount), (1, 0))

    def test_ackedInTimeKeepsChannel(self):
        """Deliveries acked within the timeout never close the channel."""
        self.broker.consumerTimeout = 5000
        self.broker.startAckTimeoutChecks()
        self.addCleanup(self.broker.stop)
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "q"))
        c.send(1, spec.BasicConsume(0, "q", "t"))
        c.received()
        for i in range(10):
            c.publish(1, "", "q", b"m")
            self.clock.advance(2)
            c.send(1, spec.BasicAck(i + 1, False))
        self.assertEqual([m for m in c.methods() if isinstance(m, spec.ChannelClose)], [])


class ClosingTests(ProtocolTestCase):
    """How connections and channels end (rabbit_reader's closing states)."""

    def test_clientCloseKeepsSocket(self):
        """After close-ok the socket stays open, input is discarded, and it is dropped after 30 s."""
        c = self.ready()
        c.send(0, spec.ConnectionClose(200, "bye", 0, 0))
        self.assertEqual(c.methods(), [])
        self.clock.advance(CLOSE_OK_DELAY)
        self.assertEqual([type(m) for m in c.methods()], [spec.ConnectionCloseOk])
        c.send(1, spec.QueueDeclare(0, "q"))
        c.publish(1, "", "q", b"late")
        self.assertEqual(c.received(), [])
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(29)
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(1)
        self.assertTrue(c.transport.disconnected)  # abortive, as RabbitMQ's linger 0

    def test_clientEOFEndsConnection(self):
        """A client that shuts down its sending side ends the connection at once (abortively)."""
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "excl", False, False, True))
        c.protocol.readConnectionLost()
        self.assertTrue(c.transport.disconnected)
        c.protocol.connectionLost(None)
        self.assertNotIn("excl", self.broker.vhosts["/"].queues)

    def test_clientCloseTimeoutIsHeartbeat(self):
        """With a heartbeat below 30 s, the socket is dropped after one heartbeat interval."""
        c = self.withHeartbeat(5)
        c.send(0, spec.ConnectionClose(200, "bye", 0, 0))
        self.clock.advance(4.9)
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(c.transport.disconnecting)

    def test_clientCloseReleasesAtOnce(self):
        """Exclusive queues and unacked messages are released at close, before the socket goes."""
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "excl", False, False, True))
        c.send(1, spec.QueueDeclare(0, "work"))
        c.publish(1, "", "work", b"m")
        c.send(1, spec.BasicGet(0, "work", False))
        c.received()
        c.send(0, spec.ConnectionClose(200, "bye", 0, 0))
        vh = self.broker.vhosts["/"]
        self.assertNotIn("excl", vh.queues)
        self.assertEqual(vh.queues["work"].readyCount, 1)
        self.assertFalse(c.transport.disconnecting)

    def test_serverCloseWaitsForCloseOk(self):
        """After a connection error, a crossing connection.close is answered and close-ok ends it."""
        c = self.ready()
        c.send(1, spec.BasicPublish(0, "", "q", False, True))  # immediate: 540
        [m] = c.methods()
        self.assertEqual(m.reply_code, 540)
        c.send(0, spec.ConnectionClose(200, "bye", 0, 0))
        self.assertEqual([type(m) for m in c.methods()], [spec.ConnectionCloseOk])
        self.assertFalse(c.transport.disconnecting)
        c.send(0, spec.ConnectionCloseOk())
        self.assertTrue(c.transport.disconnecting)

    def test_failedHandshakeDroppedSoon(self):
        """A connection closed during the handshake is dropped after RabbitMQ's 3 s silent-close delay."""
        c = self.client(handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        c.send(0, spec.ConnectionStartOk({}, "PLAIN", b"\0guest\0guest", "en_US"))
        c.send(0, spec.ConnectionTuneOk(2047, 4000, 0))  # below the 4096 minimum
        self.clock.advance(2.9)
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(c.transport.disconnecting)

    def test_crossingChannelClose(self):
        """The client's channel.close while ours is pending gets close-ok; the channel ends at its close-ok."""
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "missing", True))
        c.send(1, spec.ChannelClose(200, "bye", 0, 0))
        self.assertEqual([type(m) for m in c.methods()], [spec.ChannelClose, spec.ChannelCloseOk])
        self.assertIn(1, c.protocol.channels)
        c.send(1, spec.ChannelCloseOk())
        self.assertNotIn(1, c.protocol.channels)
        self.assertEqual(c.methods(), [])
        c.openChannel(1)
        self.assertIn(1, c.protocol.channels)

    def test_queueDeleteOkBeforeCancel(self):
        """The deleting connection gets delete-ok first, then basic.cancel for its consumers."""
        c = self.ready()
        c.openChannel(2)
        c.send(1, spec.QueueDeclare(0, "q"))
        c.send(2, spec.BasicConsume(0, "q", "t2"))
        c.send(1, spec.BasicConsume(0, "q", "t1"))
        c.received()
        c.send(1, spec.QueueDelete(0, "q"))
        got = [(ch, type(m)) for ch, m, _ in c.received()]
        self.assertEqual(got[0], (1, spec.QueueDeleteOk))
        self.assertEqual(sorted(got[1:], key=repr), sorted([(1, spec.BasicCancel), (2, spec.BasicCancel)], key=repr))

    def test_queueDeletedElsewhereCancelsAtOnce(self):
        """A consumer whose queue another connection deletes gets basic.cancel at once."""
        c = self.ready()
        c.send(1, spec.QueueDeclare(0, "q"))
        c.send(1, spec.BasicConsume(0, "q", "t1"))
        c.received()
        other = self.ready()
        other.send(1, spec.QueueDelete(0, "q"))
        self.assertEqual([type(m) for m in other.methods()], [spec.QueueDeleteOk])
        [(ch, m, _)] = c.received()
        self.assertEqual((ch, type(m), m.consumer_tag), (1, spec.BasicCancel, "t1"))

    def test_noCancelWithoutCapability(self):
        """A client without consumer_cancel_notify gets delete-ok and no basic.cancel."""
        c = self.client(capabilities={})
        c.openChannel(1)
        c.send(1, spec.QueueDeclare(0, "q"))
        c.send(1, spec.BasicConsume(0, "q", "t1"))
        c.received()
        c.send(1, spec.QueueDelete(0, "q"))
        self.assertEqual([type(m) for m in c.methods()], [spec.QueueDeleteOk])

    def test_refusedDeleteHoldsNothing(self):
        """After a refused queue.delete (406 if-unused) later cancels are not held back."""
        c = self.ready()
        c.openChannel(2)
        c.send(2, spec.QueueDeclare(0, "q"))
        c.send(2, spec.BasicConsume(0, "q", "t2"))
        c.received()
        c.send(1, spec.QueueDelete(0, "q", True))
        self.assertEqual([type(m) for m in c.methods()], [spec.ChannelClose])
        other = self.ready()
        other.send(1, spec.QueueDelete(0, "q"))
        [(ch, m, _)] = c.received()
        self.assertEqual((ch, type(m)), (2, spec.BasicCancel))

    def test_passiveDeclareDefaultExchange(self):
        """A passive declare of the default exchange is a 403 channel error."""
        c = self.ready()
        c.send(1, spec.ExchangeDeclare(0, "", "direct", True))
        [m] = c.methods()
        self.assertEqual((m.reply_code, m.reply_text), (403, "ACCESS_REFUSED - operation not permitted on the default exchange"))

    def test_serverProperties(self):
        """serverProperties replace connection.start's values; ours are the default."""
        factory = AMQPServerFactory(self.broker, self.clock, serverProperties={"product": "RabbitMQ"})
        c = FakeClient(factory, handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        [start] = c.methods()
        self.assertEqual(start.server_properties["product"], "RabbitMQ")
        self.assertIn("capabilities", start.server_properties)
        c = FakeClient(self.factory, handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        [start] = c.methods()
        self.assertEqual(start.server_properties["product"], "otter_tx")


class BatchingTests(ProtocolTestCase):
    """Writes caused by one received chunk go out as one write per connection."""

    def test_deliveriesToOtherConnectionBatched(self):
        """Three publishes in one chunk reach a consumer on another connection in one transport.write."""
        consumer = self.ready()
        consumer.send(1, spec.QueueDeclare(0, "q"))
        consumer.send(1, spec.BasicConsume(0, "q", "t", False, True))
        consumer.received()
        writes = []
        original = consumer.transport.write
        consumer.transport.write = lambda data: (writes.append(data), original(data))
        publisher = self.ready()
        from otter_tx.amqp.codec import encodeProperties
        from otter_tx.door.protocol import frame, methodFrame
        import struct

        chunk = b"".join(
            methodFrame(1, spec.BasicPublish(0, "", "q", False, False))
            + frame(2, 1, struct.pack("!HHQ", 60, 0, 1) + encodeProperties({}))
            + frame(3, 1, b"%d" % i)
            for i in range(3)
        )
        publisher.feed(chunk)
        self.assertEqual(len(writes), 1)
        bodies = [msg[1] for _, m, msg in consumer.received() if isinstance(m, spec.BasicDeliver)]
        self.assertEqual(bodies, [b"0", b"1", b"2"])

    def test_writesOutsideAChunkGoOutAtOnce(self):
        """A write not caused by a received chunk (a timer, say) is not held back."""
        c = self.ready()
        c.protocol.sendMethod(1, spec.BasicCancel("t", True))
        self.assertIsInstance(c.methods()[0], spec.BasicCancel)
        self.assertEqual(self.factory._dirty, [])


class LoggingTests(ProtocolTestCase):
    """The operator's log lines, as RabbitMQ's."""

    def setUp(self):
        ProtocolTestCase.setUp(self)
        from twisted.logger import formatEvent, globalLogPublisher

        self.lines = []

        def observer(event):
            if event.get("log_namespace", "").startswith("otter_tx"):
                self.lines.append(formatEvent(event))

        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)

    def test_acceptOpenClose(self):
        """Accepted, authenticated (user and vhost) and closed (vhost and user) connections are logged."""
        c = self.ready()
        c.send(0, spec.ConnectionClose(200, "bye", 0, 0))
        name = "127.0.0.1:40000 -> %s:%s" % (c.transport.getHost().host, c.transport.getHost().port)
        self.assertIn("accepting AMQP connection " + name, self.lines)
        self.assertIn("connection %s: user 'guest' authenticated and granted access to vhost '/'" % (name,),
                      self.lines)
        self.assertIn("closing AMQP connection %s (vhost: '/', user: 'guest')" % (name,), self.lines)

    def test_refusedLogin(self):
        """A refused login names the user and the mechanism."""
        c = self.client(handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        c.send(0, spec.ConnectionStartOk({}, "PLAIN", b"\0mallory\0nope", "en_US"))
        self.assertTrue(
            [l for l in self.lines if "PLAIN login refused: user 'mallory' - invalid credentials" in l],
            self.lines,
        )

    def test_unexpectedClose(self):
        """A client that drops the socket is logged as RabbitMQ words it."""
        c = self.ready()
        c.protocol.connectionLost(None)
        self.assertTrue([l for l in self.lines if l.endswith(
            "(vhost: '/', user: 'guest'): client unexpectedly closed TCP connection")], self.lines)
