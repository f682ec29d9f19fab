"""
The stream door's direct writes (otter_tx.door.stream.writeDirect): chunks go
straight to a plain TCP connection's socket with one sendmsg while it takes
them; the rest, and everything on other transports (TLS, tests), goes through
the transport's buffer, in order. Real sockets (a socket pair) under a
Twisted tcp.Connection driven by hand: no reactor runs, nothing waits.
"""

import socket
import struct

from twisted.internet import tcp
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.broker.broker import Broker
from otter_tx.door import stream as door
from otter_tx.door.streambackend import MemoryStreams
from otter_tx.stream import chunk, wire
from otter_tx.test.unit.test_stream_door import Client, _Addr


class _Reactor:
    """What a tcp.Connection asks of its reactor, recorded."""

    def __init__(self):
        self.writers = set()
        self.readers = set()

    def addWriter(self, w):
        self.writers.add(w)

    def removeWriter(self, w):
        self.writers.discard(w)

    def addReader(self, r):
        self.readers.add(r)

    def removeReader(self, r):
        self.readers.discard(r)


class _Conn(tcp.Connection):
    def getPeer(self):
        return _Addr("127.0.0.1", 40000)

    def getHost(self):
        return _Addr("127.0.0.1", 5552)


def socketTransport(testCase, protocol=None, sndbuf=None):
    """A connected tcp.Connection on one end of a socket pair, and the other end (non-blocking)."""
    a, b = socket.socketpair()
    if sndbuf:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    b.setblocking(False)
    reactor = _Reactor()
    conn = _Conn(a, protocol, reactor)
    conn.connected = 1
    testCase.addCleanup(a.close)
    testCase.addCleanup(b.close)
    return conn, b, reactor


def drain(conn, other, reactor, clock=None, rounds=100000):
    """Read everything ``other`` gets, letting ``conn`` write what it buffered (and the clock run)."""
    got = bytearray()
    for _ in range(rounds):
        progress = False
        while True:
            try:
                data = other.recv(1 << 20)
            except BlockingIOError:
                break
            if not data:
                break
            got += data
            progress = True
        if conn in reactor.writers:
            conn.doWrite()
            progress = True
        if clock is not None and clock.getDelayedCalls():
            clock.advance(0)
            progress = True
        if not progress:
            break
    return bytes(got)


class WriteDirectTests(SynchronousTestCase):
    def test_straightToTheSocket(self):
        """Bytes, bytearrays and memoryviews go out with one sendmsg; nothing is buffered."""
        conn, other, reactor = socketTransport(self)
        self.assertIs(door.directSocket(conn), conn.socket)
        self.assertTrue(door.writeDirect(conn, [b"a" * 10, bytearray(b"b" * 20), memoryview(b"c" * 5)]))
        self.assertEqual(conn._tempDataBuffer, [])
        self.assertEqual(reactor.writers, set())
        self.assertEqual(other.recv(100), b"a" * 10 + b"b" * 20 + b"c" * 5)

    def test_socketFull(self):
        """What the socket does not take waits in the transport's buffer, in order, as bytes."""
        conn, other, reactor = socketTransport(self, sndbuf=4096)
        parts = [bytes([i]) * 100000 for i in range(40)]
        parts[3] = bytearray(parts[3])
        self.assertFalse(door.writeDirect(conn, parts))
        self.assertTrue(conn._tempDataBuffer)
        self.assertTrue(all(type(p) is bytes for p in conn._tempDataBuffer))
        self.assertIn(conn, reactor.writers)
        # while the transport holds something, writes go behind it
        self.assertIsNone(door.directSocket(conn))
        self.assertFalse(door.writeDirect(conn, [b"tail"]))
        self.assertEqual(drain(conn, other, reactor), b"".join(bytes(p) for p in parts) + b"tail")

    def test_bufferedFirst(self):
        """What was written through the transport before goes first."""
        conn, other, reactor = socketTransport(self)
        conn.write(b"first ")
        self.assertFalse(door.writeDirect(conn, [b"second"]))
        self.assertEqual(drain(conn, other, reactor), b"first second")

    def test_otherTransports(self):
        """A test transport or a TLS connection gets everything through its own write, as bytes."""
        t = StringTransport()
        self.assertIsNone(door.directSocket(t))
        self.assertFalse(door.writeDirect(t, [b"x", bytearray(b"y"), memoryview(b"z")]))
        self.assertEqual(t.value(), b"xyz")
        conn, other, reactor = socketTransport(self)
        conn.TLS = True
        self.assertIsNone(door.directSocket(conn))

    def test_closed(self):
        conn, other, reactor = socketTransport(self)
        conn.connected = 0
        self.assertIsNone(door.directSocket(conn))


class DoorOnSocketTests(SynchronousTestCase):
    """A subscription's chunks over a real socket: direct while it takes them, paused when full."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock, memoryHighWatermark=None)
        self.backend = MemoryStreams(self.clock)
        self.factory = door.StreamServerFactory(self.broker, self.backend, self.clock, heartbeat=0)

    def connect(self, sndbuf=None):
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(), wire.OK)
        c.create("s")
        c.declarePublisher(1, "", "s")
        proto = c.proto
        conn, other, reactor = socketTransport(self, proto, sndbuf)
        proto.transport = conn
        conn.registerProducer(proto, True)
        return c, conn, other, reactor

    def deliveries(self, data):
        out = []
        for body in wire.FrameReader(0).feed(data):
            k, _ = struct.unpack_from(">HH", body)
            if k == wire.DELIVER:
                first, _, msgs = chunk.parse(bytes(body[5:]))
                out.append((first, msgs))
        return out

    def publish(self, c, count, size):
        msgs = [(i + 1, bytes([i % 251]) * size) for i in range(count)]
        for k in range(0, count, 50):
            c.feed(wire.publishFrame(1, msgs[k:k + 50]))
        self.clock.advance(0)
        return [m for _, m in msgs]

    def subscribe(self, c, credit):
        """Subscribe (the response goes to the socket, with the chunks)."""
        c.corr += 1
        c.feed(wire.request(wire.SUBSCRIBE, c.corr, bytes((1,)) + wire.encodeString("s")
                            + wire.offsetSpec(wire.OFFSET_FIRST, None) + struct.pack(">H", credit)
                            + wire.encodeStringMap({})))

    def test_direct(self):
        c, conn, other, reactor = self.connect()
        msgs = self.publish(c, 200, 100)
        self.subscribe(c, 100)
        self.clock.advance(0)
        got = self.deliveries(drain(conn, other, reactor, self.clock))
        self.assertEqual([m for _, ms in got for m in ms], msgs)
        self.assertEqual(conn._tempDataBuffer, [])

    def test_socketFull(self):
        """The socket fills: the door pauses until the transport has written the rest, then goes on."""
        c, conn, other, reactor = self.connect(sndbuf=4096)
        msgs = self.publish(c, 600, 5000)
        self.subscribe(c, 1000)
        self.clock.advance(0)
        self.assertTrue(c.proto.paused)
        got = self.deliveries(drain(conn, other, reactor, self.clock))
        self.assertFalse(c.proto.paused)
        self.assertEqual([first for first, _ in got], sorted(first for first, _ in got))
        self.assertEqual([m for _, ms in got for m in ms], msgs)


class FileRangeTests(SynchronousTestCase):
    """Parts that are bytes of a file (FileRange) go out with sendfile, or are read when they cannot."""

    def setUp(self):
        from otter_tx.broker.stream import FileRange

        path = self.mktemp()
        self.content = bytes(range(256)) * 4000
        with open(path, "wb") as f:
            f.write(self.content)
        self.f = open(path, "rb", buffering=0)
        self.addCleanup(self.f.close)
        self.FileRange = FileRange

    def test_sendfile(self):
        conn, other, reactor = socketTransport(self)
        r = self.FileRange(self.f, 1000, 5000)
        self.assertTrue(door.writeDirect(conn, [b"head", r, b"mid", self.FileRange(self.f, 0, 10), b"end"]))
        self.assertEqual(drain(conn, other, reactor),
                         b"head" + self.content[1000:6000] + b"mid" + self.content[:10] + b"end")

    def test_socketFull(self):
        """The rest of a range the socket did not take is read and waits in the transport's buffer."""
        conn, other, reactor = socketTransport(self, sndbuf=4096)
        parts = [b"h" * 100, self.FileRange(self.f, 0, len(self.content)), b"tail",
                 self.FileRange(self.f, 5, 100)]
        self.assertFalse(door.writeDirect(conn, parts))
        self.assertTrue(all(type(p) is bytes for p in conn._tempDataBuffer))
        self.assertEqual(drain(conn, other, reactor), b"h" * 100 + self.content + b"tail" + self.content[5:105])

    def test_otherTransports(self):
        t = StringTransport()
        self.assertFalse(door.writeDirect(t, [b"a", self.FileRange(self.f, 3, 4), b"b"]))
        self.assertEqual(t.value(), b"a" + self.content[3:7] + b"b")

    def test_closedFile(self):
        """A range of a closed file is never another file's bytes: the write fails loudly."""
        t = StringTransport()
        r = self.FileRange(self.f, 0, 10)
        self.f.close()
        self.assertRaises(ValueError, door.writeDirect, t, [r])


class BrokerDoorOnSocketTests(DoorOnSocketTests):
    """The same on the broker's streams, large records left in the file (FileRange, sendfile)."""

    def setUp(self):
        from otter_tx.door.streambackend import BrokerStreams

        self.clock = Clock()
        self.broker = Broker(self.clock, memoryHighWatermark=None)
        self.backend = BrokerStreams(self.broker, self.clock)
        self.backend.ranges = True
        self.factory = door.StreamServerFactory(self.broker, self.backend, self.clock, heartbeat=0)
        self.addCleanup(self.broker.streams.close)

    def publish(self, c, count, size):
        msgs = DoorOnSocketTests.publish(self, c, count, size)
        for _ in range(5):
            self.clock.advance(0)
        return msgs

    def test_overStringTransport(self):
        """A test transport gets the ranges read (the door's own write path)."""
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(), wire.OK)
        c.create("s")
        c.declarePublisher(1, "", "s")
        msgs = self.publish(c, 300, 3000)
        c.read()
        c.subscribe(1, "s", credit=100)
        got = c.deliveries()
        self.assertEqual([m for _, _, ms in got for m in ms], msgs)


class MappedBrokerDoorOnSocketTests(BrokerDoorOnSocketTests):
    """The same, large records as views of the segment file mapped (mmap, the default on CPython)."""

    def setUp(self):
        BrokerDoorOnSocketTests.setUp(self)
        self.backend.ranges = False
        self.backend.mapped = True


class WritevTests(SynchronousTestCase):
    """libc's writev through cffi (PyPy's direct writes: its sendmsg copies non-bytes buffers)."""

    def setUp(self):
        from otter_tx.door.writev import makeWritev

        self.writev = makeWritev()
        if self.writev is None:
            from twisted.trial.unittest import SkipTest

            raise SkipTest("no cffi")

    def test_buffers(self):
        """bytes, bytearrays, memoryviews of bytes and of a mapped file go out in order; a full socket raises."""
        import mmap

        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * 100)
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        view = memoryview(mapped)
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        parts = [b"head", bytearray(b"ba"), memoryview(b"xmvx")[1:3], view[10:5000], b""]
        self.assertEqual(self.writev(a.fileno(), parts), 4 + 2 + 2 + 4990)
        self.assertEqual(b.recv(10000), b"headbamv" + bytes(view[10:5000]))
        a.setblocking(False)
        with self.assertRaises(BlockingIOError):
            for _ in range(10000):
                self.writev(a.fileno(), [view])
        del view

    def test_writeDirect(self):
        """writeDirect with it (as on PyPy): the same bytes, the rest buffered when the socket is full."""
        self.patch(door, "WRITEV", self.writev)
        conn, other, reactor = socketTransport(self, sndbuf=4096)
        parts = [bytes([i]) * 100000 for i in range(40)]
        parts[3] = bytearray(parts[3])
        parts[5] = memoryview(parts[5])[10:]
        self.assertFalse(door.writeDirect(conn, parts))
        self.assertTrue(all(type(p) is bytes for p in conn._tempDataBuffer))
        self.assertEqual(drain(conn, other, reactor), b"".join(bytes(p) for p in parts))
        conn, other, reactor = socketTransport(self)
        self.assertTrue(door.writeDirect(conn, [b"a" * 10, memoryview(b"c" * 5)]))
        self.assertEqual(other.recv(100), b"a" * 10 + b"c" * 5)


class WritevBrokerDoorOnSocketTests(MappedBrokerDoorOnSocketTests):
    """Mapped records written with libc's writev (PyPy's way)."""

    def setUp(self):
        from otter_tx.door.writev import makeWritev

        MappedBrokerDoorOnSocketTests.setUp(self)
        w = makeWritev()
        if w is None:
            from twisted.trial.unittest import SkipTest

            raise SkipTest("no cffi")
        self.patch(door, "WRITEV", w)
