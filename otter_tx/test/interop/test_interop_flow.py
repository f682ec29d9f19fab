"""
Interop tests for flow control with real clients: connection.blocked /
unblocked on the memory high-watermark (https://www.rabbitmq.com/docs/
connection-blocked) and a consumer that does not read its socket.
"""

import socket
import struct
import time

from otter_tx.test.interop.support import InteropTestCase, inProcessOnly, waitUntil


class MemoryAlarmTests(InteropTestCase):
    """Publishers are told connection.blocked when the high-watermark is crossed."""

    @inProcessOnly("RabbitMQ's memory watermark cannot be lowered from a test")
    def test_blockedAndUnblocked(self):
        """pika sees connection.blocked after the watermark is crossed and unblocked after a purge."""
        q = self.name("alarm")
        # the process's RSS is what counts; here a probe stands for it that
        # grows with the queued bytes, so that a purge brings it down
        broker = self.fixture.broker
        broker.memoryHighWatermark = 100000
        broker.memoryMonitor.probe = broker.queuedBytes

        def run():
            events = []
            pub = self.pikaConnection()
            pub.add_on_connection_blocked_callback(lambda c, m: events.append(m.method.reason))
            pub.add_on_connection_unblocked_callback(lambda c, m: events.append("unblocked"))
            ch = pub.channel()
            ch.queue_declare(q, auto_delete=False)
            for _ in range(3):
                ch.basic_publish("", q, b"x" * 50000)
            deadline = time.monotonic() + 5
            while not broker.alarmed and time.monotonic() < deadline:
                pub.process_data_events(0.05)
            # as RabbitMQ, a connection is told when it publishes during the alarm
            ch.basic_publish("", q, b"blocked")
            deadline = time.monotonic() + 5
            while not events and time.monotonic() < deadline:
                pub.process_data_events(0.05)
            other = self.pikaConnection()
            och = other.channel()
            och.queue_purge(q)
            deadline = time.monotonic() + 5
            while "unblocked" not in events and time.monotonic() < deadline:
                pub.process_data_events(0.05)
            ch.basic_publish("", q, b"after")
            n = och.queue_declare(q, passive=True).method.message_count
            deadline = time.monotonic() + 5
            while n < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
                n = och.queue_declare(q, passive=True).method.message_count
            och.queue_delete(q)
            other.close()
            pub.close()
            return events, n

        def check(result):
            events, n = result
            self.assertEqual(events, ["low on memory", "unblocked"])
            self.assertEqual(n, 2)  # "blocked", held until unblocked, and "after"

        return self.inThread(run).addCallback(check)


class SlowConsumerTests(InteropTestCase):
    """A consumer that stops reading does not make the broker buffer without bound."""

    @inProcessOnly("the broker's queue depth is read from the in-process fixture")
    def test_unreadSocketBackpressure(self):
        """With a no-ack consumer that never reads, messages stay queued instead of piling up in the socket buffer."""
        q = self.name("slow")
        body = b"y" * 10000
        total = 2000  # 20 MB

        def run():
            pub = self.pikaConnection()
            ch = pub.channel()
            ch.queue_declare(q)
            s = _rawConsumer(self.host, self.port, q)
            try:
                for _ in range(total):
                    ch.basic_publish("", q, body)
                ch.queue_declare(q, passive=True)  # round trip: all publishes processed
                broker = self.fixture.broker

                def pausedConnections():
                    return [c for c in list(broker.connections) if c.paused]

                conn = waitUntil(pausedConnections)
                ready = broker.vhosts["/"].queues[q].readyCount
                return ready, len(conn)
            finally:
                s.close()
                ch.queue_delete(q)
                pub.close()

        def check(result):
            ready, paused = result
            # socket buffers hold a few MB at most; the rest must still be queued
            self.assertGreater(ready, total // 2)
            self.assertEqual(paused, 1)

        return self.inThread(run).addCallback(check)


def _frame(t, ch, payload):
    return struct.pack("!BHI", t, ch, len(payload)) + payload + b"\xce"


def _shortstr(s):
    b = s.encode()
    return bytes([len(b)]) + b


def _rawConsumer(host, port, queue):
    """A hand-rolled AMQP client that opens a no-ack consumer and then never reads."""
    s = socket.create_connection((host, port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    s.recv(65536)  # connection.start
    s.sendall(_frame(1, 0, struct.pack("!HH", 10, 11) + b"\x00\x00\x00\x00" + _shortstr("PLAIN")
                     + struct.pack("!I", 12) + b"\x00guest\x00guest" + _shortstr("en_US")))
    s.sendall(_frame(1, 0, struct.pack("!HHHIH", 10, 31, 2047, 131072, 0)))
    s.sendall(_frame(1, 0, struct.pack("!HH", 10, 40) + _shortstr("/") + _shortstr("") + b"\x00"))
    s.sendall(_frame(1, 1, struct.pack("!HH", 20, 10) + _shortstr("")))
    s.sendall(_frame(1, 1, struct.pack("!HHH", 60, 20, 0) + _shortstr(queue) + _shortstr("slow")
                     + b"\x02" + b"\x00\x00\x00\x00"))
    # read up to basic.consume-ok (class 60, method 21): the consumer is there
    seen = b""
    while b"\x00\x3c\x00\x15" not in seen:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before basic.consume-ok: %r" % (seen,))
        seen += chunk
    return s


class DeepQueueTests(InteropTestCase):
    """A no-ack consumer of a deep queue gets every message, in order (paged on otter_tx)."""

    timeout = 180

    def test_noAckDeepQueue(self):
        """pika consuming 50,000 queued messages with no-ack gets all of them in publish order."""
        q = self.name("deep")
        total = 50000

        def run():
            conn = self.pikaConnection()
            ch = conn.channel()
            ch.queue_declare(q)
            try:
                ch.confirm_delivery()
                for i in range(total):
                    ch.basic_publish("", q, b"%08d" % (i,))
                depth = ch.queue_declare(q, passive=True).method.message_count
                paged = None
                if self.fixture is not None:
                    # 50,000 x (8 B + overhead) is beyond the default budget
                    paged = self.fixture.broker.vhosts["/"].queues[q].pagedCount
                got = []
                redelivered = 0
                for method, _, body in ch.consume(q, auto_ack=True, inactivity_timeout=10):
                    if method is None:
                        break
                    got.append(body)
                    redelivered += method.redelivered
                    if len(got) == total:
                        break
                ch.cancel()
                left = ch.queue_declare(q, passive=True).method.message_count
                return depth, paged, got, redelivered, left
            finally:
                ch.queue_delete(q)
                conn.close()

        def check(result):
            depth, paged, got, redelivered, left = result
            self.assertEqual(depth, total)
            if paged is not None:
                self.assertGreater(paged, 0)
            self.assertEqual(len(got), total)
            self.assertEqual(got, [b"%08d" % (i,) for i in range(total)])
            self.assertEqual((redelivered, left), (0, 0))

        return self.inThread(run).addCallback(check)
