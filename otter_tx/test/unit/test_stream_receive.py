"""
The stream door's receive path: wire.ReceiveBuffer (frames split in place),
otter_tx.resources.sockets.readInto (recv_into the buffer on a plain TCP
connection) and otter_tx.store.rawio's compaction (a publish frame's entries
moved together with memmove, PyPy's way of not making a string a message).  Real sockets (a socket pair) under a
Twisted tcp.Connection driven by hand: no reactor runs, nothing waits.
"""

import random
import struct
import zlib

from twisted.internet import main
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from otter_tx.door import stream as door
from otter_tx.resources.sockets import readInto
from otter_tx.store import rawio
from otter_tx.stream import chunk, wire
from otter_tx.test.unit.test_stream_direct import drain, socketTransport
from otter_tx.test.unit.test_stream_door import Client, OnBrokerStreams


def _frames(sizes):
    """Frames (size-prefixed) with bodies of ``sizes`` bytes, each body's bytes telling it apart."""
    return [struct.pack(">I", n) + bytes([(i * 7 + k) % 256 for k in range(n)]) for i, n in enumerate(sizes)]


class ReceiveBufferTests(SynchronousTestCase):
    def test_splitsFramesInPlace(self):
        """
        Frames split across reads come out whole: as memoryviews of the buffer
        from COMPACT_MIN bytes, copied below.
        """
        r = wire.ReceiveBuffer(0)
        data = wire.heartbeat() + wire.heartbeat()
        self.assertEqual(r.feed(data[:3]), [])
        frames = r.feed(data[3:10])
        self.assertEqual(frames, [b"\x00\x17\x00\x01"])
        self.assertIs(type(frames[0]), bytes)
        self.assertEqual(r.buffered(), 2)
        self.assertEqual(r.feed(data[10:]), [b"\x00\x17\x00\x01"])
        self.assertEqual(r.buffered(), 0)
        small, large = _frames([wire.COMPACT_MIN - 1, wire.COMPACT_MIN])
        frames = r.feed(small + large)
        self.assertEqual([type(f) for f in frames], [bytes, memoryview])
        self.assertEqual([bytes(f) for f in frames], [small[4:], large[4:]])

    def test_randomReads(self):
        """Any split of a stream of frames of any size gives the frames a FrameReader gives (seeded)."""
        seed = random.randrange(1 << 30)
        print("test_randomReads seed", seed)
        rnd = random.Random(seed)
        sizes = [rnd.choice((0, 1, 7, 100, 4000, 9000, 70000, 300000)) for _ in range(200)]
        frames = _frames(sizes)
        data = b"".join(frames)
        r = wire.ReceiveBuffer(0, initial=1024, largest=256 * 1024)
        got = []
        pos = 0
        while pos < len(data):
            space = r.space()
            k = min(len(space), rnd.choice((1, 3, 100, 5000, 65536, 1 << 20)), len(data) - pos)
            space[:k] = data[pos:pos + k]
            pos += k
            # (bytes now: the views are valid until the next read)
            got.extend(bytes(f) for f in r.filled(k))
        self.assertEqual(got, [f[4:] for f in frames], "seed %d" % seed)

    def test_growsWhileReadsFillIt(self):
        """A read that fills the buffer doubles it, up to ``largest``."""
        r = wire.ReceiveBuffer(0, initial=8192, largest=32768)
        sizes = []
        for _ in range(5):
            space = r.space()
            sizes.append(len(space))
            space[:] = b"\x00" * len(space)
            r.filled(len(space))
        # (the bytes are one huge unfinished frame announcing 0: zero-length frames, all taken)
        self.assertEqual(sizes, [8192, 16384, 32768, 32768, 32768])

    def test_growsForALargeFrame(self):
        """A frame larger than the buffer is held whole, the buffer doubling toward it as its bytes come."""
        r = wire.ReceiveBuffer(0, initial=8192, largest=8192)
        (frame,) = _frames([100000])
        pos = 0
        caps = []
        out = []
        while pos < len(frame):
            space = r.space()
            caps.append(len(r._view))
            k = min(len(space), len(frame) - pos)
            space[:k] = frame[pos:pos + k]
            pos += k
            out.extend(bytes(f) for f in r.filled(k))
        self.assertEqual(out, [frame[4:]])
        self.assertEqual(caps[:4], [8192, 16384, 32768, 65536])
        self.assertEqual(max(caps), 100004)

    def test_shrinksWhenIdleAgain(self):
        """After a burst grew it, small reads that leave it empty bring it back to its initial size."""
        r = wire.ReceiveBuffer(0, initial=8192, largest=1 << 20)
        for _ in range(8):
            space = r.space()
            space[:] = b"\x00" * len(space)
            r.filled(len(space))
        self.assertEqual(len(r._view), 1 << 20)
        hb = wire.heartbeat()
        for _ in range(wire.SHRINK_AFTER):
            self.assertEqual(len(r.feed(hb)), 1)
        r.space()
        self.assertEqual(len(r._view), 8192)

    def test_frameTooLarge(self):
        """A size above frame_max is refused as soon as the 4 size bytes are in, before it is buffered."""
        r = wire.ReceiveBuffer(8192)
        e = self.assertRaises(wire.FrameTooLarge, r.feed, struct.pack(">I", 8193))
        self.assertEqual((e.size, e.frameMax), (8193, 8192))
        self.assertEqual(r.buffered(), 0)

    def test_lentBytesStay(self):
        """
        After lend, the frames split stay as they are until released, while
        reads go on (into another buffer when full); released buffers are used
        again (poisoned first here: a frame read after its release would show it).
        """
        seed = random.randrange(1 << 30)
        print("test_lentBytesStay seed", seed)
        rnd = random.Random(seed)
        allocated = []

        def allocate(n):
            allocated.append(n)
            return memoryview(bytearray(n))

        pool = wire.BlockPool(65536, 8 * 65536)
        pool.poison = b"\xee"
        r = wire.ReceiveBuffer(0, initial=8192, largest=65536, allocate=allocate, pool=pool)
        frames = _frames([rnd.choice((0, 10, 1000, 5000, 20000)) for _ in range(2000)])
        data = b"".join(frames)
        want = iter([f[4:] for f in frames])
        held = []
        got = 0
        pos = 0
        while pos < len(data):
            space = r.space()
            k = min(len(space), rnd.choice((1, 100, 3000, 70000)), len(data) - pos)
            space[:k] = data[pos:pos + k]
            pos += k
            views = r.filled(k)
            if views:
                held.append((r.lend(), views))
            # release some (oldest first, as commits end), checking what they held first
            while held and (len(held) > 8 or rnd.random() < 0.3):
                token, views = held.pop(0)
                for v in views:
                    self.assertEqual(bytes(v), next(want), "seed %d" % seed)
                    got += 1
                token.release()
        for token, views in held:
            for v in views:
                self.assertEqual(bytes(v), next(want), "seed %d" % seed)
                got += 1
        self.assertEqual(got, len(frames))
        # (4.3 MB read through 64 KiB buffers: most of them used again)
        self.assertLess(sum(allocated), len(data) // 4, "seed %d" % seed)

    def test_releasedAsACallback(self):
        """A token's release passes a Deferred's result on."""
        r = wire.ReceiveBuffer(0)
        r.feed(wire.heartbeat())
        token = r.lend()
        self.assertEqual(token.release("result"), "result")
        self.assertEqual(token.lent, 0)

    def test_notLentRewinds(self):
        """Without lend, an emptied buffer is used again from its start (no new buffer)."""
        allocated = []

        def allocate(n):
            allocated.append(n)
            return memoryview(bytearray(n))

        r = wire.ReceiveBuffer(0, initial=8192, largest=8192, allocate=allocate)
        hb = wire.heartbeat()
        for _ in range(10000):
            self.assertEqual(len(r.feed(hb)), 1)
        self.assertEqual(allocated, [8192])
        # lent and never released: a new buffer each time one is full
        for _ in range(10000):
            self.assertEqual(len(r.feed(hb)), 1)
            r.lend()
        # (80,000 bytes lent: about one new 8 KiB buffer each 1,024 heartbeats)
        self.assertGreaterEqual(len(allocated), 9)

    def test_heldFrameSurvivesAMove(self):
        """The unfinished frame moved to the front of the buffer (to make room) keeps its bytes."""
        r = wire.ReceiveBuffer(0, initial=8192, largest=8192)
        a, b = _frames([5000, 6000])
        data = a + b
        got = [bytes(f) for f in r.feed(data[:7000])]
        got += [bytes(f) for f in r.feed(data[7000:])]
        self.assertEqual(got, [a[4:], b[4:]])


class _Sink:
    """A protocol's receiving end for readInto."""

    def __init__(self):
        self.reader = wire.ReceiveBuffer(0)
        self.frames = []

    def filled(self, n):
        self.frames.extend(bytes(f) for f in self.reader.filled(n))


class ReadIntoTests(SynchronousTestCase):
    def test_readsIntoTheBuffer(self):
        """doRead reads into the protocol's buffer; the end of the connection is CONNECTION_DONE."""
        conn, other, reactor = socketTransport(self)
        sink = _Sink()
        self.assertTrue(readInto(conn, sink.reader.space, sink.filled))
        frames = _frames([10, 200000, 3])
        other.setblocking(True)
        data = b"".join(frames)
        other.sendall(data[:100000])
        while len(sink.frames) < 1:
            self.assertIsNone(conn.doRead())
        # nothing more to read now: the transport's doRead answers nothing (EWOULDBLOCK)
        self.assertIsNone(conn.doRead())
        other.sendall(data[100000:])
        while len(sink.frames) < 3:
            self.assertIsNone(conn.doRead())
        self.assertEqual(sink.frames, [f[4:] for f in frames])
        other.close()
        self.assertIs(conn.doRead(), main.CONNECTION_DONE)

    def test_otherTransports(self):
        """A test transport (or TLS) is left as it is: its protocol gets dataReceived."""
        t = StringTransport()
        sink = _Sink()
        self.assertFalse(readInto(t, sink.reader.space, sink.filled))
        self.assertFalse(hasattr(t, "doRead"))


class CompactTests(SynchronousTestCase):
    """A memmove compaction through cffi (used on PyPy; tested wherever cffi is)."""

    def setUp(self):
        self.compact = rawio.makeCompact(zlib.crc32)
        if self.compact is None:
            raise SkipTest("no cffi")

    def test_compact(self):
        """The runs of a buffer (a memoryview of a bytearray) moved together in it, with their CRC."""
        src = bytearray(range(256))
        view = memoryview(src)[10:]
        data, crc = self.compact(view, [3, 10, 100, 110, 115, 115, 200, 246], 7 + 10 + 0 + 46)
        want = bytes(range(13, 20)) + bytes(range(110, 120)) + bytes(range(210, 256))
        self.assertEqual((bytes(data), crc), (want, zlib.crc32(want)))
        # moved in place: the buffer holds them from the first run's start, data is a view of it
        self.assertEqual(bytes(src[13:13 + len(want)]), want)
        src[13] = 0
        self.assertEqual(data[0], 0)

    def test_pwritev(self):
        """pwritev writes views of a bytearray (and bytes) at an offset, in one call."""
        pwritev = rawio.makePwritev()
        m = memoryview(bytearray(b"0123456789"))
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(b"." * 20)
        import os

        fd = os.open(path, os.O_RDWR)
        self.addCleanup(os.close, fd)
        self.assertEqual(pwritev(fd, [b"ab", m[2:5], bytearray(b"c")], 4), 6)
        self.assertEqual(os.pread(fd, 100, 0), b"....ab234c" + b"." * 10)
        self.assertRaises(OSError, pwritev, 999999, [b"a", m], 0)

    def test_publishBatchCompacted(self):
        """publishBatch with it gives the entries it gives without (mixed sizes, a view body), and their CRC."""
        msgs = [(i + 1, bytes([i]) * (i * 37 % 900)) for i in range(100)]
        frame = wire.publishFrame(1, msgs)[4:]
        key, version, corr, (pid, count, b, pos) = wire.decodeFrame(frame)
        plain = wire.publishBatch(b, pos, count, version)
        body = memoryview(bytearray(frame))
        compacted = wire.publishBatch(body, pos, count, version, self.compact)
        want = b"".join(struct.pack(">I", len(m)) + m for _, m in msgs)
        self.assertEqual(plain, ([i for i, _ in msgs], want, None))
        self.assertEqual((compacted[0], bytes(compacted[1]), compacted[2]), ([i for i, _ in msgs], want, zlib.crc32(want)))
        # a short frame is refused with or without
        self.assertRaises(wire.FrameError, wire.publishBatch, b[:-1], pos, count, version)
        # a small frame is not compacted (slices and a join cost less): bytes, no CRC
        small = wire.publishFrame(1, msgs[:10])[4:]
        body = memoryview(bytearray(small))
        key, version, corr, (pid, count, b, pos) = wire.decodeFrame(body)
        self.assertEqual(wire.publishBatch(body, pos, count, version, self.compact),
                         ([i for i, _ in msgs[:10]], b"".join(struct.pack(">I", len(m)) + m for _, m in msgs[:10]), None))
        body = memoryview(bytearray(frame))
        self.assertRaises(wire.FrameError, wire.publishBatch, body[:-1], pos, count, version, self.compact)


class DoorReadsIntoItsBufferTests(OnBrokerStreams, SynchronousTestCase):
    """The door on a real socket reads publish frames into its buffer; the broker's stream gets them whole."""

    def _publishOverSocket(self):
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(), wire.OK)
        c.create("s")
        c.declarePublisher(1, "", "s")
        proto = c.proto
        conn, other, reactor = socketTransport(self, proto)
        proto.transport = conn
        conn.registerProducer(proto, True)
        # small buffers, counted: frames span them and released ones are used again
        self.allocated = []
        self.received = b""

        def allocate(n):
            self.allocated.append(n)
            return memoryview(bytearray(n))

        self.pool = wire.BlockPool(65536, 32 * 65536)
        proto.reader = wire.ReceiveBuffer(wire.DEFAULT_FRAME_MAX, initial=4096, largest=65536, allocate=allocate,
                                          pool=self.pool)
        self.assertTrue(readInto(conn, proto.reader.space, proto.bytesReceived))
        rnd = random.Random(7)
        msgs = [(i + 1, bytes([i % 251]) * rnd.choice((1, 50, 1024, 3000))) for i in range(3000)]
        # frames of 20 (about 20 KB: most of them compacted on PyPy) and of 3 (small: joined)
        frames = []
        k = 0
        while k < len(msgs):
            step = 3 if len(frames) % 10 == 0 else 20
            frames.append(wire.publishFrame(1, msgs[k:k + step]))
            k += step
        data = b"".join(frames)
        other.setblocking(True)
        sent = 0
        while sent < len(data):
            # odd pieces: frames span reads; commits end (and lent buffers are released) meanwhile
            k = rnd.choice((1, 999, 4096, 70000))
            other.sendall(data[sent:sent + k])
            sent += k
            while True:
                before = proto.recvOct
                self.assertIsNone(conn.doRead())
                if proto.recvOct == before:
                    break
            self.clock.advance(0)
            other.setblocking(False)
            self.received += drain(conn, other, reactor)
            other.setblocking(True)
        for _ in range(100):
            before = proto.recvOct
            conn.doRead()
            if proto.recvOct == before:
                break
        for _ in range(5):
            self.clock.advance(0)
        other.setblocking(False)
        return c, conn, other, reactor, msgs

    def test_publishedWhole(self):
        """Every publish is confirmed, and a subscription reads the messages back as published."""
        c, conn, other, reactor, msgs = self._publishOverSocket()
        c.corr += 1
        c.feed(wire.request(wire.SUBSCRIBE, c.corr, bytes((1,)) + wire.encodeString("s")
                            + wire.offsetSpec(wire.OFFSET_FIRST, None) + struct.pack(">H", 100)
                            + wire.encodeStringMap({})))
        self.clock.advance(0)
        ids = []
        got = []
        for body in wire.FrameReader(0).feed(self.received + drain(conn, other, reactor, self.clock)):
            k, _ = struct.unpack_from(">HH", body)
            if k == wire.PUBLISH_CONFIRM:
                (n,) = struct.unpack_from(">I", body, 5)
                ids.extend(struct.unpack_from(">%dQ" % n, body, 9))
            elif k == wire.DELIVER:
                got.extend(chunk.parse(bytes(body[5:]))[2])
        self.assertEqual(sorted(ids), [i for i, _ in msgs])
        self.assertEqual(got, [m for _, m in msgs])

    def test_compacted(self):
        """The same with PyPy's compaction (where cffi is), its CRC stored with the record."""
        from otter_tx.store.log.segments import crc32

        compact = rawio.makeCompact(crc32)
        if compact is None:
            raise SkipTest("no cffi")
        self.patch(door, "COMPACT", compact)
        # a buffer released too early would show: it is poisoned before it is used again
        self.patch(wire.BlockPool, "poison", b"\xee")
        self.test_publishedWhole()
        # (about 3.3 MB through 64 KiB buffers: released ones were used again)
        self.assertLess(sum(self.allocated), 2 * 1024 * 1024)


class Crc32Tests(SynchronousTestCase):
    """The store's crc32 (ISA-L on CPython; zlib, zlib-ng and zlib-ng through cffi on PyPy) is zlib's."""

    def test_everyBufferType(self):
        import mmap

        from otter_tx.store.log.segments import crc32

        data = bytes(range(256)) * 1000
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(data)
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        self.addCleanup(mapped.close)
        view = memoryview(mapped)
        self.addCleanup(view.release)
        for buf in (data, bytearray(data), memoryview(data)[7:], memoryview(bytearray(data))[100:-3], view[5:]):
            self.assertEqual(crc32(buf), zlib.crc32(bytes(buf)))
            self.assertEqual(crc32(buf, 0xFFFFFFF0), zlib.crc32(bytes(buf), 0xFFFFFFF0))
        self.assertEqual(crc32(b""), 0)

    def test_zlibNgThroughCffi(self):
        """zng_crc32_z of the zlib_ng package's extension module (PyPy's way for memoryviews)."""
        try:
            from zlib_ng import zlib_ng
        except ImportError:
            raise SkipTest("zlib-ng is installed on PyPy only")
        crc32 = rawio.makeCrc32(zlib_ng.__file__)
        if crc32 is None:
            raise SkipTest("no cffi")
        data = bytearray(range(256)) * 300
        self.assertEqual(crc32(memoryview(data)[3:]), zlib.crc32(bytes(data[3:])))
        self.assertEqual(crc32(memoryview(data), 12345), zlib.crc32(bytes(data), 12345))
        self.assertIsNone(rawio.makeCrc32("/nonexistent/library.so"))
