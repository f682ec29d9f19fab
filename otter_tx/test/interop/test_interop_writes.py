"""
The broker's write path on real sockets (otter_tx.door.writer.EagerWriter on
plain TCP): a consumer that does not read while many large deliveries are
made for it backs the broker's socket up (partial sends, the rest queued in
the transport, the connection paused), then reads them all: every delivery
arrives, whole and in order.  RabbitMQ 3.10 behaves the same (run with
``OTTER_TEST_AMQP_URL``).  Frames are read with the independent codec of
``test_interop_raw``.
"""

import socket
import struct

from otter_tx.test.interop.support import InteropTestCase, waitUntil
from otter_tx.test.interop.test_interop_raw import (
    BASIC_CONSUME,
    BASIC_CONSUME_OK,
    BASIC_DELIVER,
    FRAME_BODY,
    FRAME_HEADER,
    QUEUE_DECLARE_OK,
    RawConnection,
    RawTestMixin,
    method,
    queueDeclare,
    shortstr,
    table,
)


def body(i, size):
    """Message ``i``'s body: ``size`` octets that say which message they are."""
    stamp = b"%08d" % (i,)
    return (stamp * (size // len(stamp) + 1))[:size]


class SlowReaderTests(RawTestMixin, InteropTestCase):
    """Deliveries to a consumer whose socket is backed up arrive whole and in order."""

    timeout = 60

    def test_backedUpConsumerGetsEverything(self):
        """
        A no-ack consumer that reads nothing while 12 MiB of deliveries are
        made for it (64 KiB bodies and a few 1 MiB ones, split by frame_max),
        then reads: every message arrives once, whole, in publish order.
        """
        sizes = [65536] * 180 + [1048576] * 4

        def scenario():
            # a small receive window, set before connecting (shrinking it on a
            # connection with data in flight makes the kernel drop segments)
            consumer = RawConnection.__new__(RawConnection)
            consumer.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            consumer.sock.settimeout(10)
            consumer.sock.connect((self.host, self.port))
            consumer.buf = bytearray()
            consumer.eof = False
            self.addCleanup(consumer.close)
            self.handshake(consumer)
            self.openChannel(consumer, 1)
            consumer.send(queueDeclare(1, ""))
            queue = consumer.readMethod(QUEUE_DECLARE_OK, 1).args.shortstr()
            consumer.send(method(1, BASIC_CONSUME, struct.pack(">H", 0) + shortstr(queue) + shortstr("slow")
                                 + b"\x02" + table({})))  # no-ack
            consumer.readMethod(BASIC_CONSUME_OK, 1)

            if self.fixture is not None:
                broker = self.fixture.broker

                def pausedConsumer():
                    return [c for c in list(broker.connections) if c.paused]

            publisher = self.pikaConnection()
            try:
                channel = publisher.channel()
                channel.confirm_delivery()
                for i, size in enumerate(sizes):
                    channel.basic_publish("", queue, body(i, size))
            finally:
                publisher.close()
            if self.fixture is not None:
                # the consumer's socket and then its transport filled: paused
                self.assertTrue(waitUntil(pausedConsumer))

            got = []
            while len(got) < len(sizes):
                deliver = consumer.readMethod(BASIC_DELIVER, 1, timeout=30)
                self.assertEqual(deliver.args.shortstr(), "slow")
                deliveryTag = deliver.args.unpack(">Q")
                header = consumer.readFrame(timeout=30)
                self.assertEqual(header.type, FRAME_HEADER)
                size = struct.unpack(">Q", header.payload[4:12])[0]
                parts = []
                while size > sum(map(len, parts)):
                    f = consumer.readFrame(timeout=30)
                    self.assertEqual(f.type, FRAME_BODY)
                    parts.append(f.payload)
                got.append((deliveryTag, b"".join(parts)))
            return got

        def check(got):
            self.assertEqual([tag for tag, _ in got], list(range(1, len(sizes) + 1)))
            for i, (_, data) in enumerate(got):
                self.assertEqual(len(data), sizes[i])
                self.assertEqual(data, body(i, sizes[i]), "message %d differs" % (i,))

        return self.inThread(scenario).addCallback(check)
