"""
A quorum queue and its persistent messages survive a SIGKILL and a clean
restart of the broker process (``twistd -n ottermq``), like any durable
queue (docs/quorum.md): the queue keeps its type and arguments, every
confirmed message comes back, a transient one too (a quorum queue stores
every message, as RabbitMQ's does).  The delivery count itself is not stored: a
message that may have been delivered before the restart (after a SIGKILL,
every message: the store marks them all) counts as returned once, so it
comes back redelivered with ``x-delivery-count`` 1.
"""

import os
import signal

import pika
from twisted.internet import defer, threads
from twisted.trial.unittest import TestCase

from otter_tx.test.e2e.test_crash import _params, _startBroker

QUEUE = "quorum-restart"
ARGS = {"x-queue-type": "quorum", "x-delivery-limit": 5}


def _fill(port):
    """Declare the quorum queue, publish 99 persistent messages and a transient one with confirms, return one to the queue once and hold it unacked; return the open connection."""
    c = pika.BlockingConnection(_params(port))
    ch = c.channel()
    ch.queue_declare(QUEUE, durable=True, arguments=ARGS)
    ch.confirm_delivery()
    for i in range(99):
        ch.basic_publish("", QUEUE, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    # a transient message: a quorum queue stores it too (RabbitMQ's Raft log does)
    ch.basic_publish("", QUEUE, b"99")
    method, _, _ = ch.basic_get(QUEUE)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, props, body = ch.basic_get(QUEUE)
    return c, (body, props.headers["x-delivery-count"])


def _closeQuietly(connection):
    """Close a pika connection whose broker was killed."""
    try:
        connection.close()
    except Exception:
        pass


def _recovered(port):
    """
    After a restart: the redeclare answers (equivalent arguments), a classic
    redeclare is inequivalent, and the messages drain with their
    ``(body, redelivered, x-delivery-count)``.
    """
    c = pika.BlockingConnection(_params(port))
    ch = c.channel()
    ok = ch.queue_declare(QUEUE, durable=True, arguments=ARGS).method
    inequivalent = None
    try:
        c.channel().queue_declare(QUEUE, durable=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        inequivalent = e.reply_code
    got = []
    while True:
        method, props, body = ch.basic_get(QUEUE)
        if method is None:
            break
        got.append((body, method.redelivered, (props.headers or {}).get("x-delivery-count")))
    c.close()
    return ok.message_count, inequivalent, got


class QuorumRestartTests(TestCase):
    """A quorum queue is as durable as any durable queue."""

    timeout = 120

    @defer.inlineCallbacks
    def recoverOnce(self, dataDir):
        """Start the broker on ``dataDir``, run :func:`_recovered`, stop it cleanly (SIGTERM); its result."""
        proc, transport = _startBroker(dataDir)
        port = yield proc.port
        try:
            result = yield threads.deferToThread(_recovered, port)
        finally:
            transport.signalProcess(signal.SIGTERM)
            yield proc.ended
        return result

    @defer.inlineCallbacks
    def test_surviveKill9AndRestart(self):
        """After a SIGKILL the quorum queue and its 100 messages (one transient) are back, each redelivered with count 1; a clean restart keeps them too."""
        dataDir = os.path.abspath(self.mktemp())
        proc, transport = _startBroker(dataDir)
        port = yield proc.port
        conn, held = yield threads.deferToThread(_fill, port)
        self.assertEqual(held, (b"0", 1))
        transport.signalProcess(signal.SIGKILL)
        yield proc.ended
        yield threads.deferToThread(_closeQuietly, conn)
        count, inequivalent, got = yield self.recoverOnce(dataDir)
        self.assertEqual((count, inequivalent), (100, 406))
        self.assertEqual(sorted(int(b) for b, _, _ in got), list(range(100)))
        self.assertEqual({(r, n) for _, r, n in got}, {(True, 1)})
        # every get above left its message unacked; the clean stop keeps them
        count, _, got = yield self.recoverOnce(dataDir)
        self.assertEqual((count, len(got)), (100, 100))
