"""
A stream survives a SIGKILL and a clean restart of the broker process
(``twistd -n ottermq --data-dir``, docs/streams.md): the queue keeps its type
and arguments, every confirmed message is read back from its offset, and
new appends continue the offsets.
"""

import os
import re
import signal
import struct
import time

import pika
from twisted.internet import defer, reactor, task, threads
from twisted.trial.unittest import TestCase

from otter_tx.stream import wire
from otter_tx.test.e2e.test_crash import _params, _startBroker
from otter_tx.test.e2e.test_quorum_restart import _closeQuietly
from otter_tx.test.interop.stream_raw import RawStreamClient

_STREAM_PORT = re.compile(rb"otter_tx ready: .*stream rabbitmq-stream://[^:]+:(\d+)")


@defer.inlineCallbacks
def _streamPort(proc):
    """The stream port of a broker started by _startBroker, once its ready line is out (30 s at most)."""
    yield proc.port
    for _ in range(600):
        m = _STREAM_PORT.search(proc.output)
        if m:
            return int(m.group(1))
        yield task.deferLater(reactor, 0.05, lambda: None)
    raise AssertionError("no stream port in:\n" + proc.output.decode("utf-8", "replace"))

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


def _publishConfirmed(port, frames, size=10):
    """
    Publish ``frames`` frames of ``size`` messages (ids from 1) as publisher
    reference "ref" to stream "dedup" over the stream protocol, each frame
    after the last one's confirm, so the tracking is written between them;
    returns the last id confirmed (the connection is left open).
    """
    c = RawStreamClient("127.0.0.1", port)
    assert c.handshake() == wire.OK
    assert c.create("dedup") in (wire.OK, wire.STREAM_ALREADY_EXISTS)
    assert c.declarePublisher(1, "ref", "dedup") == wire.OK
    last = 0
    for k in range(frames):
        ids = list(range(k * size + 1, (k + 1) * size + 1))
        c.publish(1, [(i, b"m%d" % i) for i in ids])
        got = []
        while len(got) < size:
            pid, confirmed = c.confirms()
            assert pid == 1, confirmed
            got.extend(confirmed)
        last = ids[-1]
    return c, last


def _sequenceAndLast(port):
    """The publisher sequence of "ref" on "dedup" and the stream's committed_chunk_id (stream_stats)."""
    c = RawStreamClient("127.0.0.1", port)
    try:
        assert c.handshake() == wire.OK
        code, rest = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("ref") + wire.encodeString("dedup"))
        assert code == wire.OK, code
        (sequence,) = struct.unpack_from(">Q", rest)
        code, rest = c.call(wire.STREAM_STATS, wire.encodeString("dedup"))
        assert code == wire.OK, code
        stats = {}
        (n,) = struct.unpack_from(">I", rest)
        pos = 4
        for _ in range(n):
            (k,) = struct.unpack_from(">H", rest, pos)
            key = rest[pos + 2:pos + 2 + k].decode()
            (value,) = struct.unpack_from(">q", rest, pos + 2 + k)
            stats[key] = value
            pos += 2 + k + 8
        return sequence, stats["committed_chunk_id"]
    finally:
        c.close()


class StreamDedupCrashTests(TestCase):
    """A publisher's sequence (de-duplication) survives a SIGKILL: it is written before the confirm goes out."""

    timeout = 120

    @defer.inlineCallbacks
    def test_sequenceSurvivesKill9(self):
        """
        SIGKILL right after the last confirm: after the restart the publisher
        sequence is the last confirmed id, and sending the confirmed
        publishes again stores nothing (as RabbitMQ, which keeps it in the chunk).
        """
        dataDir = os.path.abspath(self.mktemp())
        proc, transport = _startBroker(dataDir, stream="tcp:0:interface=127.0.0.1")
        port = yield _streamPort(proc)
        c, last = yield threads.deferToThread(_publishConfirmed, port, 40)
        transport.signalProcess(signal.SIGKILL)
        yield proc.ended
        c.close()
        proc, transport = _startBroker(dataDir, stream="tcp:0:interface=127.0.0.1")
        try:
            port = yield _streamPort(proc)
            sequence, chunk = yield threads.deferToThread(_sequenceAndLast, port)
            self.assertEqual(sequence, last)
            # the last confirmed publishes sent again: confirmed, not stored again
            c, _ = yield threads.deferToThread(_publishConfirmed, port, 4)
            c.close()
            self.assertEqual((yield threads.deferToThread(_sequenceAndLast, port)), (last, chunk))
        finally:
            transport.signalProcess(signal.SIGTERM)
            yield proc.ended
