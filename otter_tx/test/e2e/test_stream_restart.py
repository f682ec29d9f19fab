"""
A stream survives a SIGKILL and a clean restart of the broker process
(``twistd -n ottermq --data-dir``, docs/streams.md): the queue keeps its type
and arguments, every confirmed message is read back from its offset, and
new appends continue the offsets.
"""

import os
import signal
import time

import pika
from twisted.internet import defer, threads
from twisted.trial.unittest import TestCase

from otter_tx.test.e2e.test_crash import _params, _startBroker
from otter_tx.test.e2e.test_quorum_restart import _closeQuietly

QUEUE = "stream-restart"
ARGS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


def _fill(port, first, n):
    """Declare the stream, publish ``n`` messages numbered from ``first`` with confirms; return the open connection."""
    c = pika.BlockingConnection(_params(port))
    ch = c.channel()
    ch.queue_declare(QUEUE, durable=True, arguments=ARGS)
    ch.confirm_delivery()
    for i in range(first, first + n):
        ch.basic_publish("", QUEUE, b"%d" % i)
    return c


def _read(port, n):
    """Read ``n`` messages from first: ``[(x-stream-offset, int(body))]``."""
    c = pika.BlockingConnection(_params(port))
    ch = c.channel()
    ch.queue_declare(QUEUE, durable=True, arguments=ARGS)
    ch.basic_qos(prefetch_count=100)
    got = []

    def cb(ch_, method, props, body):
        got.append((props.headers["x-stream-offset"], int(body)))
        ch_.basic_ack(method.delivery_tag)

    ch.basic_consume(QUEUE, cb, arguments={"x-stream-offset": "first"})
    deadline = time.time() + 30
    while len(got) < n and time.time() < deadline:
        c.process_data_events(0.1)
    c.close()
    return got


class StreamRestartTests(TestCase):
    """A stream is durable: its log is on disk."""

    timeout = 120

    @defer.inlineCallbacks
    def test_surviveKill9AndRestart(self):
        """Confirmed messages come back after a SIGKILL and a clean restart, offsets continue."""
        dataDir = os.path.abspath(self.mktemp())
        proc, transport = _startBroker(dataDir)
        port = yield proc.port
        conn = yield threads.deferToThread(_fill, port, 0, 300)
        transport.signalProcess(signal.SIGKILL)
        yield proc.ended
        yield threads.deferToThread(_closeQuietly, conn)
        proc, transport = _startBroker(dataDir)
        port = yield proc.port
        try:
            got = yield threads.deferToThread(_read, port, 300)
            self.assertEqual(got, [(i, i) for i in range(300)])
            conn = yield threads.deferToThread(_fill, port, 300, 10)
            yield threads.deferToThread(conn.close)
        finally:
            transport.signalProcess(signal.SIGTERM)
            yield proc.ended
        proc, transport = _startBroker(dataDir)
        port = yield proc.port
        try:
            got = yield threads.deferToThread(_read, port, 310)
            self.assertEqual(got, [(i, i) for i in range(310)])
        finally:
            transport.signalProcess(signal.SIGTERM)
            yield proc.ended
