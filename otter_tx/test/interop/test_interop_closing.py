"""
Interop tests for how connections, channels and queues end, byte for byte.

Each behaviour here was observed on the RabbitMQ 3.10.8 peer and the tests
run against it in CI (``OTTER_TEST_AMQP_URL``, ``OTTER_TEST_MGMT_URL``):

- after ``connection.close-ok`` the broker keeps the socket open, discards
  further input, and waits for the client to close it; the socket is dropped
  after the heartbeat interval at most (``rabbit_reader:close_connection/1``,
  ``?CLOSING_TIMEOUT`` 30 s);
- crossing ``channel.close``: while the broker's own ``channel.close`` waits for
  its close-ok, a ``channel.close`` from the client is answered with close-ok,
  and the channel ends only at the client's close-ok (no 504 on the
  connection);
- ``queue.delete`` answers ``delete-ok`` before the ``basic.cancel`` its own
  channel's consumers receive;
- a passive ``exchange.declare`` of the default exchange gets
  ``403 ACCESS_REFUSED - operation not permitted on the default exchange``;
- ``DELETE /api/vhosts/V`` answers only once the vhost's connections have
  been sent ``connection.close`` 320.

The frames are built with the independent codec of ``test_interop_raw``.
"""

import select
import socket
import struct
import time
from urllib.parse import quote

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks

from otter_tx.test.interop.support import InteropTestCase, ManagementMixin, inProcessOnly, rabbitOnly
from otter_tx.test.interop.test_interop_raw import (
    CHANNEL_OPEN_OK,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_OPEN_OK,
    BASIC_CONSUME,
    BASIC_CONSUME_OK,
    CONNECTION_START,
    CONNECTION_TUNE,
    QUEUE_DECLARE,
    QUEUE_DECLARE_OK,
    RawTestMixin,
    basicPublish,
    channelOpen,
    closeArgs,
    connectionOpen,
    contentHeader,
    decodeStart,
    decodeTune,
    frame,
    FRAME_BODY,
    method,
    shortstr,
    startOk,
    table,
    tuneOk,
)

CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE = (40, 10)
QUEUE_DELETE = (50, 40)
QUEUE_DELETE_OK = (50, 41)
BASIC_CANCEL = (60, 30)


def connectionClose(code=200, text="bye"):
    """connection.close from the client."""
    return method(0, CONNECTION_CLOSE, struct.pack(">H", code) + shortstr(text) + struct.pack(">HH", 0, 0))


def channelClose(channel, code=200, text="bye"):
    """channel.close from the client."""
    return method(channel, CHANNEL_CLOSE, struct.pack(">H", code) + shortstr(text) + struct.pack(">HH", 0, 0))


def queueDeclare(channel, name, passive=False, durable=False, autoDelete=False):
    """queue.declare of ``name`` (not exclusive)."""
    bits = (1 if passive else 0) | (2 if durable else 0) | (8 if autoDelete else 0)
    return method(channel, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr(name) + struct.pack(">B", bits) + table({}))


def queueDelete(channel, name):
    """queue.delete of ``name`` (no if-unused / if-empty)."""
    return method(channel, QUEUE_DELETE, struct.pack(">H", 0) + shortstr(name) + struct.pack(">B", 0))


def basicConsume(channel, queue, tag):
    """basic.consume with no-ack."""
    return method(channel, BASIC_CONSUME,
                  struct.pack(">H", 0) + shortstr(queue) + shortstr(tag) + struct.pack(">B", 2) + table({}))


def exchangeDeclarePassive(channel, name):
    """A passive exchange.declare of ``name``."""
    return method(channel, EXCHANGE_DECLARE,
                  struct.pack(">H", 0) + shortstr(name) + shortstr("direct") + struct.pack(">B", 1) + table({}))


class ClosingTests(RawTestMixin, InteropTestCase):
    """How connections and channels end, as RabbitMQ 3.10 ends them."""

    def test_closeOkThenSocketStaysOpen(self):
        """
        A client that sends connection.close and keeps writing (a publish
        still in its buffer) reads close-ok, its further writes are
        discarded without an error, and the broker does not drop the socket:
        the client closes it.
        """
        def scenario():
            conn = self.ready()
            publish = (basicPublish(1, "", "no-such-queue") + contentHeader(1, 3)
                       + frame(FRAME_BODY, 1, b"abc"))
            conn.send(connectionClose() + publish * 50)
            conn.readMethod(CONNECTION_CLOSE_OK, 0)
            for _ in range(5):
                time.sleep(0.05)
                conn.send(publish * 20)
            # nothing more arrives and the socket stays open for at least 1 s
            self.assertRaises(socket.timeout, conn.waitClosed, 1.0)
            self.assertEqual(bytes(conn.buf), b"")
            # and a new connection is served normally
            self.assertFreshConnectionWorks()

        return self.inThread(scenario)

    def test_closedSocketDroppedAfterHeartbeat(self):
        """
        After close-ok the broker waits at most the heartbeat interval for
        the client to close the socket, then closes it itself.
        """
        def scenario():
            conn = self.connect()
            self.addCleanup(conn.close)
            self.handshake(conn, heartbeatInterval=1)
            conn.send(connectionClose())
            conn.readMethod(CONNECTION_CLOSE_OK, 0)
            _, waited = conn.waitClosed(10)
            self.assertGreater(waited, 0.5)
            self.assertLess(waited, 5)

        return self.inThread(scenario)

    def test_exclusiveQueueReleasedAtCloseOk(self):
        """
        A client's exclusive queue is gone once it has read close-ok, even
        though its socket is still open: another connection can declare it.
        """
        def scenario():
            conn = self.ready()
            name = self.name("excl")
            excl = method(1, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr(name)
                          + struct.pack(">B", 4) + table({}))
            conn.send(excl)
            conn.readMethod(QUEUE_DECLARE_OK, 1)
            conn.send(connectionClose())
            conn.readMethod(CONNECTION_CLOSE_OK, 0)
            other = self.ready()
            other.send(excl)
            other.readMethod(QUEUE_DECLARE_OK, 1)
            other.send(queueDelete(1, name))
            other.readMethod(QUEUE_DELETE_OK, 1)

        return self.inThread(scenario)

    def test_crossingChannelClose(self):
        """
        The broker closes channel 1 (404) while the client's own
        channel.close is on its way: the broker answers that close with
        close-ok and keeps the channel until the client's close-ok, which
        therefore lands on a known channel; the connection stays up and
        channel 1 can be opened again.
        """
        def scenario():
            conn = self.ready()
            conn.send(queueDeclare(1, self.name("missing"), passive=True) + channelClose(1))
            f = conn.readMethod(CHANNEL_CLOSE, 1)
            self.assertEqual(closeArgs(f)[0], 404)
            conn.readMethod(CHANNEL_CLOSE_OK, 1)
            conn.send(method(1, CHANNEL_CLOSE_OK))
            conn.send(channelOpen(1))
            conn.readMethod(CHANNEL_OPEN_OK, 1)
            self.assertAlive(conn, 1)

        return self.inThread(scenario)

    def test_crossingChannelCloseThenReopen(self):
        """
        A second channel.close while the broker's close is unanswered is
        answered again; everything else on the closing channel is ignored.
        """
        def scenario():
            conn = self.ready()
            conn.send(queueDeclare(1, self.name("missing"), passive=True) + channelClose(1)
                      + queueDeclare(1, self.name("ignored")) + channelClose(1))
            self.assertEqual(closeArgs(conn.readMethod(CHANNEL_CLOSE, 1))[0], 404)
            conn.readMethod(CHANNEL_CLOSE_OK, 1)
            conn.readMethod(CHANNEL_CLOSE_OK, 1)
            conn.send(method(1, CHANNEL_CLOSE_OK) + channelOpen(1))
            conn.readMethod(CHANNEL_OPEN_OK, 1)
            self.assertAlive(conn, 1)

        return self.inThread(scenario)

    def test_queueDeleteOkBeforeCancel(self):
        """
        Deleting a queue that the deleting channel consumes from: delete-ok
        first, then basic.cancel for that consumer.
        """
        def scenario():
            conn = self.ready()
            name = self.name("del")
            conn.send(queueDeclare(1, name))
            conn.readMethod(QUEUE_DECLARE_OK, 1)
            conn.send(basicConsume(1, name, "ctag-1"))
            conn.readMethod(BASIC_CONSUME_OK, 1)
            conn.send(queueDelete(1, name))
            conn.readMethod(QUEUE_DELETE_OK, 1)
            f = conn.readMethod(BASIC_CANCEL, 1)
            self.assertEqual(f.args.shortstr(), "ctag-1")
            self.assertAlive(conn, 1)

        return self.inThread(scenario)

    def test_queueDeleteOkBeforeOwnCancels(self):
        """
        With consumers of the deleted queue on two channels of the deleting
        connection, the deleting channel's delete-ok precedes its own cancel,
        and both consumers are cancelled.
        """
        def scenario():
            conn = self.ready()
            self.openChannel(conn, 2)
            name = self.name("del2")
            conn.send(queueDeclare(1, name))
            conn.readMethod(QUEUE_DECLARE_OK, 1)
            conn.send(basicConsume(1, name, "ctag-a"))
            conn.readMethod(BASIC_CONSUME_OK, 1)
            conn.send(basicConsume(2, name, "ctag-b"))
            conn.readMethod(BASIC_CONSUME_OK, 2)
            conn.send(queueDelete(1, name))
            seen = []
            while len(seen) < 3:
                f = conn.readFrame()
                seen.append((f.channel, f.classMethod))
            self.assertEqual(sorted(seen), sorted([(1, QUEUE_DELETE_OK), (1, BASIC_CANCEL), (2, BASIC_CANCEL)]))
            self.assertLess(seen.index((1, QUEUE_DELETE_OK)), seen.index((1, BASIC_CANCEL)))

        return self.inThread(scenario)

    def test_passiveDeclareDefaultExchange(self):
        """A passive declare of ``""`` is refused (403, channel-level) like every other operation on it."""
        def scenario():
            conn = self.ready()
            conn.send(exchangeDeclarePassive(1, ""))
            f = conn.readMethod(CHANNEL_CLOSE, 1)
            self.assertEqual(closeArgs(f),
                             (403, "ACCESS_REFUSED - operation not permitted on the default exchange", 40, 10))
            conn.send(method(1, CHANNEL_CLOSE_OK) + channelOpen(1))
            conn.readMethod(CHANNEL_OPEN_OK, 1)

        return self.inThread(scenario)


class ServerPropertiesTests(RawTestMixin, InteropTestCase):
    """
    ``--server-property product=RabbitMQ``: connection.start reports what the
    operator set, as RabbitMQ's ``server_properties`` setting does, so
    clients gating features on the product name see RabbitMQ.
    """

    brokerOptions = {"serverProperties": {"product": "RabbitMQ", "version": "3.10.8"}}

    @rabbitOnly("its server properties are set by brokerOptions in process; an external otter_tx "
                "node has its own defaults")
    def test_productAndVersion(self):
        """connection.start carries the configured product and version; capabilities stay."""
        def scenario():
            conn = self.connect()
            self.addCleanup(conn.close)
            start, _ = self.handshake(conn)
            props = start["serverProperties"]
            self.assertEqual(props["product"], "RabbitMQ")
            self.assertTrue(props["version"].startswith("3.10"), props["version"])
            self.assertIn("consumer_cancel_notify", props["capabilities"])

        return self.inThread(scenario)

    @inProcessOnly("the broker's own product name is otter_tx's, not RabbitMQ's")
    def test_defaultProduct(self):
        """Without the setting otter_tx names itself."""
        from otter_tx.door.protocol import AMQPServerFactory

        f = AMQPServerFactory(None, reactor)
        self.assertEqual(f.serverProperties, {})


class VHostDeletionTests(ManagementMixin, RawTestMixin, InteropTestCase):
    """Deleting a vhost over HTTP closes its connections before the HTTP answer."""

    def openOn(self, vhost):
        """A raw connection opened on ``vhost`` with channel 1 (worker thread)."""
        conn = self.connect()
        self.addCleanup(conn.close)
        conn.send(b"AMQP\x00\x00\x09\x01")
        decodeStart(conn.readMethod(CONNECTION_START, 0))
        conn.send(startOk())
        channelMax, frameMax, _ = decodeTune(conn.readMethod(CONNECTION_TUNE, 0))
        conn.send(tuneOk(channelMax, frameMax, 0) + connectionOpen(vhost))
        conn.readMethod(CONNECTION_OPEN_OK, 0)
        self.openChannel(conn, 1)
        return conn

    @inlineCallbacks
    def test_deleteClosesConnectionsFirst(self):
        """
        When ``DELETE /api/vhosts/V`` answers 204, connection.close 320
        ``CONNECTION_FORCED - vhost 'V' is ...`` is already waiting on each
        of the vhost's connections (RabbitMQ says "is deleted" or "is down").
        """
        import treq
        from twisted.web.client import HTTPConnectionPool

        pool = HTTPConnectionPool(reactor, persistent=False)
        auth = ("guest", "guest")
        vhost = self.name("vh")
        path = self.mgmtBase() + "/api/vhosts/" + quote(vhost, safe="")
        resp = yield treq.put(path, json={}, auth=auth, pool=pool)
        yield resp.content()
        self.assertIn(resp.code, (201, 204))
        perm = self.mgmtBase() + "/api/permissions/%s/guest" % (quote(vhost, safe=""),)
        resp = yield treq.put(perm, json={"configure": ".*", "write": ".*", "read": ".*"}, auth=auth, pool=pool)
        yield resp.content()
        conns = []
        for _ in range(2):
            c = yield self.inThread(self.openOn, vhost)
            conns.append(c)
        resp = yield treq.delete(path, auth=auth, pool=pool)
        yield resp.content()
        self.assertEqual(resp.code, 204)

        def check():
            for c in conns:
                readable, _, _ = select.select([c.sock], [], [], 0.05)
                self.assertTrue(readable, "no connection.close waiting when the HTTP answer came")
                f = c.readMethod(CONNECTION_CLOSE, 0)
                code, text, _, _ = closeArgs(f)
                self.assertEqual(code, 320)
                self.assertTrue(text.startswith("CONNECTION_FORCED - vhost '%s' is " % (vhost,)), text)
                try:
                    c.send(method(0, CONNECTION_CLOSE_OK))
                except OSError:
                    pass  # RabbitMQ may drop the socket right after its close
                c.waitClosed(5)

        yield self.inThread(check)
        yield pool.closeCachedConnections()
