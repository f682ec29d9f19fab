"""
Deterministic tests (task.Clock, writes inline) for stream queues
(otter_tx/broker/stream.py, docs/streams.md): the log core (appends, group
commit, offsets, readers, retention, reopening, bounded memory), the
AMQP 0-9-1 face (consumers at offsets, headers, credit) and the queue seam's
contract where it applies.  test_interop_streams checks the wire rules
against RabbitMQ 3.10.
"""

import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import Timestamp, encodeProperties
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message
from otter_tx.broker.stream import (
    OffsetSpec,
    StreamRegistry,
    _Count,
    declareStream,
    deleteStream,
    findStream,
    parseOffsetSpec,
)
from otter_tx.test.unit.test_queue_contract import QueueContractMixin, RecordingConsumer, _Feeder

S = {"x-queue-type": "stream"}


def message(body=b"m", **props):
    return Message("", "s", encodeProperties(props), body)


class CoreTests(SynchronousTestCase):
    """StreamLog and StreamReader on a temporary directory."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.root = self.mktemp()
        self.registry = StreamRegistry(self.root)
        self.addCleanup(self.registry.close)

    def open(self, segmentBytes=1 << 20):
        return self.registry.open(self.clock, "/", "s", segmentBytes)

    def fill(self, log, n, body=b"x" * 12):
        ds = [log.append(message(body + b"%d" % i)) for i in range(n)]
        self.clock.advance(0)
        return ds

    def test_appendFiresWhenDurable(self):
        """An append's Deferred fires with its offset at the end of the turn (one group commit)."""
        log = self.open()
        fired = []
        log.append(message(b"a")).addCallback(fired.append)
        log.append(message(b"b")).addCallback(fired.append)
        self.assertEqual((fired, log.committed, log.registry.unsynced), ([], 0, 2))
        self.clock.advance(0)
        self.assertEqual((fired, log.first, log.committed, log.last), ([0, 1], 0, 2, 0))
        self.assertEqual(log.registry.unsynced, 0)

    def test_readFromOffsets(self):
        """Readers at first, next, last, an offset and a timestamp; independent of each other."""
        log = self.open()
        self.fill(log, 10)
        self.clock.advance(60)
        self.fill(log, 5)
        r = log.reader("first")
        got = r.read(100)
        self.assertEqual([o for o, _, _ in got], list(range(15)))
        self.assertEqual(got[3][2].body, b"x" * 12 + b"3")
        self.assertEqual(r.read(), [])
        self.assertEqual(log.reader("next").offset, 15)
        self.assertEqual(log.reader("last").offset, 10)
        self.assertEqual([o for o, _, _ in log.reader(12).read(2)], [12, 13])
        # the first message at or after the time (RabbitMQ 3.10: the first chunk)
        self.assertEqual(log.reader(("timestamp", 1030 * 1000.0)).offset, 10)
        self.assertEqual(log.startOffset(parseOffsetSpec("30s", 1061 * 1000.0)), 10)
        self.assertEqual(log.reader(99).offset, 15)

    def test_chunkStarts(self):
        """chunkStart finds the first offset of any message's group commit, across index blocks."""
        log = self.open(segmentBytes=1 << 20)
        sizes = [1, 63, 64, 1, 130, 5, 200, 1]
        starts = []
        for n in sizes:
            starts.append(log.committed)
            self.fill(log, n)
        for s, n in zip(starts, sizes):
            for o in (s, s + n // 2, s + n - 1):
                self.assertEqual(log.chunkStart(o), s, (o, s, n))

    def test_timestampAttachesAtChunk(self):
        """A timestamp reader starts at the first chunk at or after it; after the last one, at next (as 3.10)."""
        log = self.open()
        self.fill(log, 10)          # t = 1000 s
        self.clock.advance(10)
        self.fill(log, 10)          # t = 1010 s
        self.clock.advance(10)
        self.fill(log, 10)          # t = 1020 s
        self.assertEqual(log.startOffset(("timestamp", 1015 * 1000.0)), 20)
        self.assertEqual(log.startOffset(("timestamp", 1010 * 1000.0)), 10)
        self.assertEqual(log.startOffset(("timestamp", 999 * 1000.0)), 0)
        self.assertEqual(log.startOffset(("timestamp", 1021 * 1000.0)), 30)

    def test_timestampAcrossSegments(self):
        """Timestamp starts through the sparse timestamp index, across many segments and blocks."""
        log = self.open(segmentBytes=4096)
        for i in range(40):
            self.fill(log, 25)          # 25 messages per second
            self.clock.advance(1)
        self.assertGreater(len(log.log.segments), 5)
        for second in (0, 1, 7, 20, 39):
            self.assertEqual(log.startOffset(("timestamp", (1000 + second) * 1000.0)), 25 * second)
        self.assertEqual(log.startOffset(("timestamp", 1039.5 * 1000.0)), 1000)

    def test_readerAcrossSegmentsAndIndex(self):
        """A reader starts anywhere through the sparse index and crosses segment ends."""
        log = self.open(segmentBytes=4096)
        for _ in range(10):
            self.fill(log, 50)
        self.assertGreater(len(log.log.segments), 3)
        for start in (0, 63, 64, 130, 299, 499):
            r = log.reader(start)
            offsets = []
            while True:
                batch = r.read(37)
                if not batch:
                    break
                offsets.extend(o for o, _, _ in batch)
            self.assertEqual(offsets, list(range(start, 500)))

    def test_readerOverSmallChunks(self):
        """One message per group commit (a chunk header between each): readers start anywhere."""
        log = self.open(segmentBytes=8192)
        for _ in range(300):
            self.fill(log, 1)
        for start in (0, 1, 65, 200, 299):
            r = log.reader(start)
            offsets = []
            while True:
                # one read call touches at most a few segments (bounded work)
                batch = r.read(500)
                if not batch:
                    break
                offsets.extend(o for o, _, _ in batch)
            self.assertEqual(offsets, list(range(start, 300)))
        self.assertEqual(log.last, 299)

    def test_sealedSegmentsKeepOnlyIndexes(self):
        """Segments, the active one too, keep no per-message arrays (memory bounded by the sparse index)."""
        log = self.open(segmentBytes=4096)
        for _ in range(10):
            self.fill(log, 50)
        for seg in log.log.segments:
            self.assertIsInstance(seg.ids, _Count)
            self.assertEqual(len(seg.flags), 0)
        self.assertEqual(sum(len(s.ids) for s in log.log.segments), 500)

    def test_listenersToldOnCommit(self):
        """listen(): called when committed moves, once per group commit."""
        log = self.open()
        calls = []
        log.listen(lambda: calls.append(log.committed))
        self.fill(log, 3)
        self.fill(log, 2)
        self.assertEqual(calls, [3, 5])

    def test_retentionBySize(self):
        """x-max-length-bytes removes whole oldest segments when one rolls over; readers move on."""
        log = self.open(segmentBytes=4096)
        old = log.reader("first")
        log.setRetention(maxBytes=3 * 4096)
        for _ in range(20):
            self.fill(log, 50)
        self.assertLessEqual(log.bytes, 3 * 4096 + 4096)
        self.assertGreater(log.first, 0)
        self.assertGreater(log.segmentsDeleted, 0)
        self.assertEqual(old.read(1)[0][0], log.first)

    def test_retentionByAge(self):
        """x-max-age removes a segment once all of its messages are older, checked at roll-over."""
        log = self.open(segmentBytes=4096)
        log.setRetention(maxAgeSeconds=60)
        self.fill(log, 100)
        self.clock.advance(120)
        self.fill(log, 100)
        self.fill(log, 100)
        # whole segments only: the one holding both old and new messages stays
        self.assertGreater(log.first, 0)
        self.assertLessEqual(log.first, 100)

    def test_reopen(self):
        """A reopened stream has its offsets, its last chunk and its messages."""
        log = self.open(segmentBytes=4096)
        for _ in range(5):
            self.fill(log, 40)
        self.registry.close()
        registry = StreamRegistry(self.root)
        self.addCleanup(registry.close)
        again = registry.open(self.clock, "/", "s", 4096)
        self.assertEqual((again.first, again.committed, again.last), (0, 200, 160))
        self.assertEqual([o for o, _, _ in again.reader(150).read(5)], [150, 151, 152, 153, 154])
        self.fill(again, 1)
        self.assertEqual(again.committed, 201)

    def test_deleteDuringThreadedWrite(self):
        """A stream deleted while its write runs on the thread pool keeps its files until the write ends."""
        import os
        from twisted.internet import defer
        pending = []

        def run(f):
            d = defer.Deferred()
            pending.append((f, d))
            return d

        self.registry.runInThread = run
        log = self.open()
        appended = log.append(message())
        self.clock.advance(0)
        [(f, d)] = pending
        log.delete()
        self.failureResultOf(appended, AMQPError)
        # moved out of the way at once (a new stream of that name gets a fresh directory)
        self.assertTrue(os.path.isdir(log.directory))
        self.assertIn(".deleted-", log.directory)
        again = self.open()
        try:
            f()  # the write made no new file in the moved directory: it fails
        except OSError as e:
            d.errback(e)
        else:
            d.callback(None)
        self.assertFalse(os.path.isdir(log.directory))
        self.assertTrue(os.path.isdir(again.directory))
        self.assertEqual(self.registry.unsynced, 0)

    def test_parseOffsetSpec(self):
        """The x-stream-offset values."""
        self.assertEqual(parseOffsetSpec("first"), OffsetSpec("first"))
        self.assertEqual(parseOffsetSpec(-3), OffsetSpec("offset", 0))
        self.assertEqual(parseOffsetSpec(Timestamp(5)), OffsetSpec("timestamp", 5000.0))
        self.assertEqual(parseOffsetSpec("10m", 1_000_000.0), OffsetSpec("timestamp", 400_000.0))
        for bad in ("bogus", "1.5", True, 1.5):
            self.assertRaises(ValueError, parseOffsetSpec, bad, 0.0)

    def test_delete(self):
        """delete(): pending appends fail, listeners are told, the files go."""
        log = self.open()
        told = []
        log.listen(lambda: told.append(log.deleted))
        d = log.append(message())
        log.delete()
        self.failureResultOf(d, AMQPError)
        self.assertEqual(told, [True])
        self.assertEqual(self.registry.unsynced, 0)


def entries(msgs):
    from otter_tx.stream import chunk
    return chunk.entries(msgs)


class BatchRecordTests(SynchronousTestCase):
    """
    What a stream protocol publish frame becomes: one BATCH record of the log
    (StreamLog.appendEntries), mixed with AMQP 0-9-1 ENQ records; read back as
    stored (readRaw) or as Messages (read), from any offset, after a restart.
    """

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.root = self.mktemp()
        self.registry = StreamRegistry(self.root)
        self.addCleanup(self.registry.close)
        self.expected = []

    def open(self, segmentBytes=1 << 20, registry=None):
        return (registry or self.registry).open(self.clock, "/", "s", segmentBytes)

    def batch(self, log, n, size=12, advance=True):
        msgs = [(b"b%d-" % (len(self.expected) + i)).ljust(size, b".") for i in range(n)]
        d = log.appendEntries(entries(msgs), n)
        self.expected.extend(msgs)
        if advance:
            self.clock.advance(0)
        return d

    def enq(self, log, n, advance=True):
        for _ in range(n):
            body = b"e%d" % len(self.expected)
            log.append(message(body), wantDeferred=False)
            self.expected.append(body)
        if advance:
            self.clock.advance(0)

    def readAll(self, r, step):
        got = []
        while True:
            batch = r.read(step)
            if not batch:
                return got
            self.assertLessEqual(len(batch), step)
            got.extend(batch)

    def mixed(self, log):
        self.batch(log, 100)
        self.enq(log, 3)
        self.batch(log, 1)
        self.batch(log, 300, size=40)       # spans index blocks
        self.enq(log, 70)
        self.batch(log, 5, advance=False)   # one group commit: a batch, ENQs, a batch
        self.enq(log, 2, advance=False)
        self.batch(log, 64)

    def test_manyLargeRecordsSplitIntoCommits(self):
        """
        More large records than a commit writes as they are (COMMIT_LARGE_RECORDS,
        two parts each) go in two commits, none joined into one string; all
        are read back and every append fires.
        """
        from otter_tx.broker import stream as streamModule
        from otter_tx.store.log import segments

        self.patch(streamModule, "COMMIT_LARGE_RECORDS", 5)
        log = self.open(segmentBytes=64 << 20)
        written = []
        real = segments._pwritev

        def recording(fd, parts, offset):
            written.append(len(parts))
            return real(fd, parts, offset)

        self.patch(segments, "_pwritev", recording)
        joined = []
        realPieces = segments._Parts.pieces

        def pieces(parts):
            before = len(parts.parts)
            out = realPieces(parts)
            if len(out) < before:
                joined.append(before)
            return out

        self.patch(segments._Parts, "pieces", pieces)
        fired = []
        for _ in range(12):
            self.batch(log, 10, size=500, advance=False).addCallback(fired.append)
        for _ in range(5):
            self.clock.advance(0)
        # 12 records of 5,000 bytes: three commits of 5, 5 and 2, each a header and two parts a record
        self.assertEqual(written, [11, 11, 5])
        self.assertEqual(joined, [])
        self.assertEqual(fired, [i * 10 for i in range(12)])
        self.checkReads(log, [0, 55, 119])

    def checkReads(self, log, starts):
        n = len(self.expected)
        for start in starts:
            for step in (1, 7, 128, 1000):
                got = self.readAll(log.reader(start), step)
                self.assertEqual([o for o, _, _ in got], list(range(start, n)), (start, step))
                self.assertEqual([m.body for _, _, m in got], self.expected[start:], (start, step))

    def test_appendFiresWithFirstOffset(self):
        """One Deferred per batch, fired with its first offset once durable; offsets count messages."""
        log = self.open()
        fired = []
        self.batch(log, 10, advance=False).addCallback(fired.append)
        self.batch(log, 5, advance=False).addCallback(fired.append)
        self.assertEqual((fired, log.committed), ([], 0))
        self.clock.advance(0)
        self.assertEqual((fired, log.committed, log.last, log.appended), ([0, 10], 15, 0, 15))
        self.assertEqual(log.registry.unsynced, 0)
        self.assertIsInstance(log.log.segments[0].ids, _Count)

    def test_readsFromEveryOffset(self):
        """Readers at any offset (inside a batch too), any read size, see every message once, in order."""
        log = self.open()
        self.mixed(log)
        self.checkReads(log, range(0, len(self.expected), 3))

    def test_acrossSegments(self):
        """Batches roll segments over; readers cross them; retention still deletes whole segments."""
        log = self.open(segmentBytes=4096)
        for _ in range(6):
            self.mixed(log)
        self.assertGreater(len(log.log.segments), 5)
        self.checkReads(log, [0, 1, 99, 100, 250, 1000, len(self.expected) - 1])
        log.setRetention(maxBytes=8192)
        self.assertGreater(log.first, 0)
        got = self.readAll(log.reader("first"), 100)
        self.assertEqual([m.body for _, _, m in got], self.expected[log.first:])

    def test_largeRecords(self):
        """A batch larger than a read piece (64 KiB) is read whole or in parts."""
        log = self.open()
        self.batch(log, 100, size=1024)
        self.enq(log, 1)
        self.batch(log, 3, size=100000)
        self.checkReads(log, [0, 50, 99, 100, 101, 102, 103])

    def test_readRawAsStored(self):
        """readRaw gives a batch's entries as published, split at maxMessages and maxBytes."""
        log = self.open()
        self.batch(log, 10)
        self.enq(log, 1)
        r = log.reader("first")
        items = r.readRaw(100)
        self.assertEqual([(o, n, b) for o, n, _, _, b in items], [(0, 10, True), (10, 1, False)])
        self.assertEqual(items[0][3], entries(self.expected[:10]))
        r = log.reader(2)
        self.assertEqual([(o, n) for o, n, _, _, _ in r.readRaw(3)], [(2, 3)])
        self.assertEqual(r.readRaw(100, maxBytes=32)[0][3], entries(self.expected[5:7]))
        self.assertEqual([(o, n) for o, n, _, _, _ in r.readRaw(100)], [(7, 3), (10, 1)])
        # a record is split only when nothing was read before it
        self.batch(log, 10)
        r = log.reader("first")
        self.assertEqual([(o, n) for o, n, _, _, _ in r.readRaw(15)], [(0, 10), (10, 1)])
        self.assertEqual([(o, n) for o, n, _, _, _ in r.readRaw(2)], [(11, 2)])
        self.assertEqual([(o, n) for o, n, _, _, _ in r.readRaw(100)], [(13, 8)])
        # split=False: a record that does not fit stays whole for the next read
        r = log.reader("first")
        self.assertEqual(r.readRaw(100, maxBytes=100, split=False), [])
        self.assertEqual(r.offset, 0)
        self.assertEqual([(o, n) for o, n, _, _, _ in r.readRaw(5, split=False)], [])
        self.assertEqual([(o, n) for o, n, _, _, _ in r.readRaw(10, split=False)], [(0, 10)])

    def readViews(self, r, step, maxBytes=None):
        """Everything ``r`` reads with views: ``[(offset, n, entries)]`` (the buffers joined)."""
        got = []
        while True:
            items = r.readRaw(step, maxBytes, views=True)
            if not items:
                return got
            for o, n, _, payload, isBatch in items:
                self.assertTrue(isBatch)
                self.assertIsInstance(payload, list)
                got.append((o, n, b"".join(payload)))

    def test_views(self):
        """readRaw with views: a batch's entries as buffers (views of the pieces read), the same bytes."""
        from otter_tx.broker import stream as streamModule

        log = self.open()
        self.batch(log, 100, size=1024)     # a record larger than a piece
        self.batch(log, 10)
        self.batch(log, 3, size=100000)
        self.batch(log, 200, size=20)
        n = len(self.expected)
        for start in (0, 1, 99, 100, 105, 110, 112, 113, 200):
            for step, maxBytes in ((1, None), (7, None), (512, None), (4096, 10000), (4096, None)):
                got = self.readViews(log.reader(start), step, maxBytes)
                self.assertEqual([o for o, _, _ in got][0], start)
                self.assertEqual(sum(k for _, k, _ in got), n - start, (start, step, maxBytes))
                self.assertEqual(b"".join(e for _, _, e in got), entries(self.expected[start:]))
        # a whole record larger than the piece is read in pieces of at most READ_PIECE bytes
        r = log.reader(110)
        [(o, k, _, parts, _)] = r.readRaw(3, views=True)
        self.assertEqual((o, k), (110, 3))
        self.assertGreater(len(parts), 3)
        self.assertLessEqual(max(len(b) for b in parts), streamModule.READ_PIECE)

    def test_ranges(self):
        """
        readRaw with ranges: a record larger than a piece is a FileRange of the segment file (its
        bytes, its CRC), valid after the reader has moved on to another segment.
        """
        import zlib

        from otter_tx.broker.stream import FileRange

        log = self.open(segmentBytes=150000)
        self.batch(log, 100, size=1024)
        self.batch(log, 10)
        self.batch(log, 100, size=1024)
        self.batch(log, 100, size=1024)
        self.assertGreater(len(log.log.segments), 1)
        r = log.reader("first")
        got = []
        while True:
            items = r.readRaw(4096, None, views=True, ranges=True)
            if not items:
                break
            got.extend(items)
        ranges = [b for i in got for b in i[3] if type(b) is FileRange]
        self.assertEqual(len(ranges), 3)
        data = b"".join(b.read() if type(b) is FileRange else bytes(b) for i in got for b in i[3])
        self.assertEqual(data, entries(self.expected))
        self.assertEqual([(o, k) for o, k, _, _, _ in got], [(0, 100), (100, 10), (110, 100), (210, 100)])
        for b in ranges:
            self.assertEqual(b.crc32(), zlib.crc32(b.read()))
            self.assertEqual(b.crc32(7), zlib.crc32(b.read(), 7))
            self.assertEqual(b.read(1000), b.read()[1000:])
            self.assertEqual(len(b), len(b.read()))
        r.close()
        # the reader closed its own file, not those lent to the ranges
        self.assertEqual(ranges[0].read(), entries(self.expected[:100]))

    def readCrcs(self, r, step, maxBytes=None, ranges=False, mapped=False):
        """Everything ``r`` reads with views and crcs: ``([(offset, n, entries)], {offset: crc})``."""
        from otter_tx.broker.stream import FileRange

        got = []
        crcs = {}
        while True:
            items = r.readRaw(step, maxBytes, views=True, ranges=ranges, crcs=crcs, mapped=mapped)
            if not items:
                return got, crcs
            for o, n, _, payload, isBatch in items:
                if not isBatch:
                    got.append((o, n, None))
                    continue
                got.append((o, n, b"".join(b.read() if type(b) is FileRange else bytes(b) for b in payload)))

    def test_batchCrcStored(self):
        """
        A stream protocol publish is a BATCH_CRC record: its entries' CRC-32 stored in its
        head; a read gives it for each whole record it returns (none for part of one).
        """
        import zlib

        from otter_tx.store.log import segments

        log = self.open()
        self.batch(log, 100, size=1024)     # a record larger than a piece
        self.batch(log, 10)
        self.batch(log, 3, size=100000)
        self.batch(log, 200, size=20)
        sizes = [100, 10, 3, 200]
        firsts = [0, 100, 110, 113]
        records = []
        for f, k in zip(firsts, sizes):
            records.append((f, k, entries(self.expected[f:f + k])))
        # the file: each record's head holds its kind and its entries' CRC
        with open(log.log.segments[0].path, "rb") as f:
            data = f.read()
        for first, k, ents in records:
            at = data.index(ents) - segments.BATCH_CRC_HEAD.size
            length, kind, o, _, count, crc = segments.BATCH_CRC_HEAD.unpack_from(data, at)
            self.assertEqual((length, kind, o, count, crc),
                             (segments.BATCH_CRC_HEAD.size - 4 + len(ents), segments.BATCH_CRC, first, k,
                              zlib.crc32(ents)))
        for ranges, mapped in ((False, False), (True, False), (False, True)):
            # whole records: every one has its CRC
            got, crcs = self.readCrcs(log.reader("first"), 4096, ranges=ranges, mapped=mapped)
            self.assertEqual([(o, n) for o, n, _ in got], [(f, k) for f, k, _ in records])
            self.assertEqual(crcs, {f: zlib.crc32(e) for f, _, e in records})
            # split reads: only the items that are whole records
            got, crcs = self.readCrcs(log.reader("first"), 7, ranges=ranges, mapped=mapped)
            self.assertEqual(b"".join(e for _, _, e in got), entries(self.expected))
            self.assertEqual(crcs, {110: zlib.crc32(records[2][2])})
            for o, n, e in got:
                if o in crcs:
                    self.assertEqual(crcs[o], zlib.crc32(e))
            got, crcs = self.readCrcs(log.reader(50), 4096, ranges=ranges, mapped=mapped)
            self.assertNotIn(50, crcs)
            self.assertEqual(sorted(crcs), [100, 110, 113])

    def test_oldBatchRecords(self):
        """
        BATCH records (6, no CRC: written before BATCH_CRC) are still read, beside BATCH_CRC
        ones, after a restart too; a read has no CRC to give for them.
        """
        import zlib

        from otter_tx.broker import stream as streamModule
        from otter_tx.store.log import segments

        encoded = segments.encodedBatch
        log = self.open()
        # an otter_tx from before BATCH_CRC: encodedBatch took no CRC
        self.patch(streamModule._seg, "encodedBatch", lambda first, ts, count, ents, crc=None:
                   encoded(first, ts, count, ents))
        self.batch(log, 100, size=1024)
        self.batch(log, 10)
        self.patch(streamModule._seg, "encodedBatch", encoded)
        self.batch(log, 100, size=1024)
        self.batch(log, 10)
        self.enq(log, 1)
        with open(log.log.segments[0].path, "rb") as f:
            data = f.read()
        self.assertEqual(data[data.index(entries(self.expected[:100])) - segments.BATCH_HEAD.size + 4],
                         segments.BATCH)
        self.registry.close()
        registry = StreamRegistry(self.root)
        self.addCleanup(registry.close)
        log = self.open(registry=registry)
        self.assertEqual(log.committed, 221)
        for ranges in (False, True):
            got, crcs = self.readCrcs(log.reader("first"), 4096, ranges=ranges)
            self.assertEqual([(o, n) for o, n, _ in got], [(0, 100), (100, 10), (110, 100), (210, 10), (220, 1)])
            self.assertEqual(crcs, {110: zlib.crc32(entries(self.expected[110:210])),
                                    210: zlib.crc32(entries(self.expected[210:220]))})
        self.checkReads(log, [0, 5, 100, 109, 110, 150, 210, 220])
        # appended after the restart: BATCH_CRC
        self.batch(log, 5)
        got, crcs = self.readCrcs(log.reader(221), 4096)
        self.assertEqual(crcs, {221: zlib.crc32(entries(self.expected[221:]))})

    def test_logChunkCrc(self):
        """
        The message log's chunk CRC combines the BATCH_CRC records' stored CRCs (the entries are not
        hashed twice): it is zlib's CRC of the payload, for one record, for many (their parts
        joined for the write) and mixed with ENQ records; the log reopens with all of it.
        """
        import zlib

        from otter_tx.store.log import segments

        log = self.open()
        self.batch(log, 3, size=100000)
        for k in range(20):
            self.batch(log, 5, size=30 + k, advance=False)
            if k % 7 == 0:
                self.enq(log, 1, advance=False)
        self.clock.advance(0)
        with open(log.log.segments[0].path, "rb") as f:
            data = f.read()
        pos = segments.FILE_HEADER.size
        chunks = 0
        while pos < len(data):
            magic, length, crc, count = segments.CHUNK_HEADER.unpack_from(data, pos)
            start = pos + segments.CHUNK_HEADER.size
            self.assertEqual((magic, crc), (segments.CHUNK_MAGIC, zlib.crc32(data[start:start + length])))
            pos = start + length
            chunks += 1
        self.assertEqual(chunks, 2)
        self.registry.close()
        registry = StreamRegistry(self.root)
        self.addCleanup(registry.close)
        log = self.open(registry=registry)
        self.assertEqual(log.committed, len(self.expected))
        self.checkReads(log, [0, 3, 50, len(self.expected) - 1])

    def test_replicatedBatchCrc(self):
        """A follower's append of its leader's records computes their CRC: BATCH_CRC records too."""
        import zlib

        log = self.open()
        ents = entries([b"a" * 10, b"b" * 20])
        self.assertTrue(log.appendReplicated([(1, 0, 5.0, 2, ents)]))
        self.clock.advance(0)
        got, crcs = self.readCrcs(log.reader("first"), 100)
        self.assertEqual(got, [(0, 2, ents)])
        self.assertEqual(crcs, {0: zlib.crc32(ents)})

    def test_crc32Combine(self):
        """crc32_combine (ISA-L's or zlib-ng's) and the pure-zlib fallback give zlib's CRC of the concatenation."""
        import zlib

        from otter_tx.store.log import segments

        a = bytes(range(256)) * 3
        for n in (0, 1, 1000, 65536, 65537, 200001):
            b = (b"xyz" * (n // 3 + 1))[:n]
            for combine in (segments.crc32_combine, segments.crc32CombineZeros):
                self.assertEqual(combine(zlib.crc32(a), zlib.crc32(b), len(b)), zlib.crc32(a + b), n)
                self.assertEqual(combine(0, zlib.crc32(b), len(b)), zlib.crc32(b))

    def test_mapped(self):
        """
        readRaw with mapped: a record larger than a piece is a view of the segment file mapped,
        across segments and as the active one grows (mapped again), the same bytes.
        """
        from otter_tx.broker.stream import isMapped

        log = self.open(segmentBytes=250000)
        r = log.reader("first")
        got = []
        for k in range(6):
            self.batch(log, 100, size=1024 + k)
            self.batch(log, 3, size=20)
            while True:
                items = r.readRaw(4096, None, views=True, mapped=True)
                if not items:
                    break
                got.extend(items)
        self.assertGreater(len(log.log.segments), 1)
        views = [b for i in got for b in i[3]]
        self.assertEqual(sum(isMapped(b) for b in views), 6)
        self.assertEqual(b"".join(views), entries(self.expected))
        r.close()

    def test_mappedThenTruncated(self):
        """
        A reader that mapped a segment file goes on after a follower's truncate cut that file (it
        reads the new file, never its old mapping past the cut) and after new appends.
        """
        from otter_tx.broker.stream import isMapped

        log = self.open()
        for _ in range(4):
            self.batch(log, 100, size=1024)
        r = log.reader("first")
        items = r.readRaw(200, None, views=True, mapped=True)
        self.assertEqual([(o, n) for o, n, _, _, _ in items], [(0, 100), (100, 100)])
        self.assertTrue(isMapped(items[0][3][0]))
        del items
        self.assertEqual(log.truncate(200), 200)
        del self.expected[200:]
        self.batch(log, 100, size=700)
        got = []
        while True:
            items = r.readRaw(4096, None, views=True, mapped=True)
            if not items:
                break
            got.extend((o, n, b"".join(p)) for o, n, _, p, _ in items)
        self.assertEqual([(o, n) for o, n, _ in got], [(200, 100)])
        self.assertEqual(got[0][2], entries(self.expected[200:]))

    def test_smallRecordsNoRanges(self):

        """Small records across a piece's end are read as bytes, not left in the file."""
        from otter_tx.broker.stream import FileRange

        log = self.open()
        for _ in range(100):
            self.batch(log, 100)        # 1.6 KB records: 160 KB, pieces end inside records
        r = log.reader("first")
        got = []
        while True:
            items = r.readRaw(512, None, views=True, ranges=True)
            if not items:
                break
            got.extend(items)
        self.assertFalse([b for i in got for b in i[3] if type(b) is FileRange])
        self.assertEqual(b"".join(bytes(b) for i in got for b in i[3]), entries(self.expected))

    def test_conversionsShared(self):
        """Readers of the same offsets share a stream client's message converted once; a bounded number kept."""
        from otter_tx.broker import stream as streamModule

        self.patch(streamModule, "CONVERTED_MESSAGES", 5)
        log = self.open()
        self.batch(log, 10)
        self.enq(log, 1)
        a = log.reader("first").read()
        b = log.reader(7).read()
        self.assertEqual([m.body for _, _, m in a], self.expected)
        self.assertEqual([o for o, _, _ in b], list(range(7, 11)))
        for (oa, _, ma), (ob, _, mb) in zip(a[7:10], b):
            self.assertEqual(oa, ob)
            self.assertIs(ma, mb)
        self.assertIsNot(a[10][2], b[3][2])      # an AMQP 0-9-1 publish: its own Message a read
        self.assertEqual(sorted(streamModule._converted[log]), [5, 6, 7, 8, 9])
        c = log.reader("first").read()
        self.assertIsNot(c[0][2], a[0][2])
        self.assertEqual([m.body for _, _, m in c], self.expected)

    def test_pieceKeptForTheNextRead(self):
        """A reader's next read starts in the piece it read last: small records are read once."""
        from otter_tx.broker import stream as streamModule

        log = self.open()
        for _ in range(40):
            self.batch(log, 100)
        reads = []
        real = os.pread

        def pread(fd, n, pos):
            reads.append(n)
            return real(fd, n, pos)

        self.patch(streamModule.os, "pread", pread)
        r = log.reader("first")
        got = self.readViews(r, 250)
        self.assertEqual(sum(k for _, k, _ in got), 4000)
        # 4000 messages of 12 bytes and their record heads are about 70 KiB: two pieces
        # (and the first read's index look-up), not one a read
        self.assertLessEqual(len(reads), 4)
        # what is committed later is read (the piece of before is not trusted past its end)
        self.batch(log, 5)
        got = self.readViews(r, 250)
        self.assertEqual([(o, k) for o, k, _ in got], [(4000, 5)])
        self.assertEqual(got[0][2], entries(self.expected[4000:]))

    def test_reopen(self):
        """A restart reads BATCH records back: offsets, the last chunk, readers anywhere, new appends."""
        log = self.open(segmentBytes=4096)
        for _ in range(3):
            self.mixed(log)
        committed, last = log.committed, log.last
        self.registry.close()
        registry = StreamRegistry(self.root)
        self.addCleanup(registry.close)
        again = self.open(segmentBytes=4096, registry=registry)
        self.assertEqual((again.committed, again.last), (committed, last))
        self.checkReads(again, [0, 5, 130, 555, committed - 1])
        self.batch(again, 4)
        self.assertEqual(again.committed, committed + 4)
        self.checkReads(again, [committed - 2])

    def test_chunkStartsAndTimestamps(self):
        """chunkStart and timestamp starts know that a BATCH record holds many offsets."""
        log = self.open(segmentBytes=1 << 20)
        starts = []
        for n in (1, 200, 64, 3, 130):
            self.clock.advance(10)
            starts.append(log.committed)
            self.batch(log, n)
        ends = starts[1:] + [log.committed]
        for s, e in zip(starts, ends):
            for o in (s, (s + e) // 2, e - 1):
                self.assertEqual(log.chunkStart(o), s, (o, s))
        self.assertEqual(log.last, starts[-1])
        for i, s in enumerate(starts):
            self.assertEqual(log.startOffset(("timestamp", (1000 + 10 * (i + 1)) * 1000.0)), s)

    def test_amqp10ConvertedForAmqp091Readers(self):
        """An AMQP 1.0 message published over the stream protocol reads as RabbitMQ's to_amqp091 makes it."""
        from otter_tx.stream import amqp10
        log = self.open()
        m = amqp10.encodeMessage(b"hello", applicationProperties={"k": "v"})
        log.appendEntries(entries([m, b"opaque"]), 2)
        self.clock.advance(0)
        got = log.reader("first").read()
        self.assertEqual([(x.exchange, x.routingKey, x.body) for _, _, x in got],
                         [("", "s", b"hello"), ("", "s", b"opaque")])
        self.assertEqual(got[0][2].headers, {"k": "v"})


class ConsumerTests(SynchronousTestCase):
    """The AMQP face: StreamQueue in a vhost."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.broker = Broker(self.clock)
        self.addCleanup(self.broker.streams.close)
        self.vhost = self.broker.vhosts["/"]
        self.q = self.vhost.declareQueue("s", None, durable=True, arguments=dict(S))

    def consumer(self, offset=None, prefetch=10, tag="c"):
        c = RecordingConsumer(tag, noAck=False)
        c.prefetch = prefetch
        c.arguments = {} if offset is None else {"x-stream-offset": offset}
        inner = c.canTake
        c.canTake = lambda: inner() and sum(1 for _, e in c.delivered if e.state == 2) < c.prefetch
        return c

    def publish(self, n):
        for i in range(n):
            self.q.enqueue(message(b"%d" % i))
        self.clock.advance(0)

    def test_offsetsAndHeader(self):
        """A consumer at first gets every message with x-stream-offset (long); credit bounds it."""
        self.publish(5)
        c = self.consumer("first", prefetch=3)
        self.q.addConsumer(c)
        self.assertEqual([e.message.headers["x-stream-offset"] for _, e in c.delivered], [0, 1, 2])
        self.assertEqual(c.delivered[0][1].message.headers["x-stream-offset"].tag, "l")
        self.q.settle(c.delivered[0][1])
        self.assertEqual(len(c.delivered), 4)
        self.assertEqual(self.q.readyCount, 5)

    def test_nextGetsNewMessagesPromptly(self):
        """A consumer at next is pushed what the next group commit makes durable."""
        self.publish(2)
        c = self.consumer()
        self.q.addConsumer(c)
        self.assertEqual(c.delivered, [])
        self.q.enqueue(message(b"late"))
        self.clock.advance(0)
        self.assertEqual([e.message.body for _, e in c.delivered], [b"late"])

    def test_independentReaders(self):
        """Two consumers read the same messages; nothing is removed."""
        self.publish(3)
        a, b = self.consumer("first", tag="a"), self.consumer(1, tag="b")
        self.q.addConsumer(a)
        self.q.addConsumer(b)
        self.assertEqual(([e.offset for _, e in a.delivered], [e.offset for _, e in b.delivered]),
                         ([0, 1, 2], [1, 2]))
        self.assertEqual(sorted(dict(self.q.readerOffsets()).items()), [("a", 3), ("b", 3)])

    def test_boundedAndFairDispatch(self):
        """A deep backlog goes out at most DISPATCH_MESSAGES per call, readers taking turns."""
        from otter_tx.broker.stream import DISPATCH_MESSAGES
        self.publish(1000)
        a, b = self.consumer("first", prefetch=5000, tag="a"), self.consumer("first", prefetch=5000, tag="b")
        self.q.addConsumer(a)
        self.assertEqual(len(a.delivered), DISPATCH_MESSAGES)
        self.q.addConsumer(b)
        self.assertEqual(len(b.delivered), DISPATCH_MESSAGES)
        for _ in range(10):
            self.clock.advance(0)
        self.assertEqual((len(a.delivered), len(b.delivered)), (1000, 1000))

    def test_refusals(self):
        """basic.get, purge, nack: 540; no prefetch 406; no-ack 540 (checkConsume)."""
        for f in (lambda: self.q.basicGet(False), self.q.purge, lambda: self.q.reject([]),
                  lambda: self.q.requeue([])):
            self.assertEqual(self.assertRaises(AMQPError, f).code, 540)
        self.assertEqual(self.assertRaises(AMQPError, self.q.checkConsume, False, 0, {}).code, 406)
        self.assertEqual(self.assertRaises(AMQPError, self.q.checkConsume, True, 5, {}).code, 540)
        self.q.requeue([], dispatch=False)
        e = self.assertRaises(AMQPError, self.q.checkConsume, False, 5, {"x-stream-offset": "1.5"})
        self.assertIn("invalid_stream_offset_arg", e.text)
        self.assertEqual(self.assertRaises(AMQPError, self.q.checkConsume, False, 5,
                                           {"x-stream-offset": "bogus"}).code, 541)

    def test_deleteCancelsConsumers(self):
        """queue.delete: consumers are cancelled, the stream's files go."""
        self.publish(1)
        c = self.consumer("first")
        self.q.addConsumer(c)
        path = self.q.stream.directory
        self.assertEqual(self.vhost.deleteQueue(self.q), 0)
        self.assertTrue(c.cancelled)
        import os
        self.assertFalse(os.path.exists(path))

    def test_helpers(self):
        """findStream / declareStream / deleteStream, for the stream protocol door."""
        self.assertIs(findStream(self.broker, "/", "s"), self.q.stream)
        self.assertIsNone(findStream(self.broker, "/", "nope"))
        log = declareStream(self.broker, "/", "t", {"x-max-age": "1h"})
        self.assertEqual(log.maxAgeSeconds, 3600)
        self.assertRaises(AMQPError, declareStream, self.broker, "/", "t", {"x-max-age": "2h"})
        self.assertTrue(deleteStream(self.broker, "/", "t"))
        self.assertFalse(deleteStream(self.broker, "/", "t"))

    def test_declaredThroughTheCluster(self):
        """A node of an otter_tx cluster declares a new stream through the cluster (its record, its home node)."""
        calls = []

        class Cluster:
            applying = False

            def declareQueue(self, *a):
                calls.append(a[1:])
                return "declared"

        self.broker.cluster = Cluster()
        self.assertEqual(self.vhost.declareQueue("t", None, durable=True, arguments=dict(S)), "declared")
        self.assertEqual(calls, [("t", None, True, False, False, dict(S), False)])

    def test_policy(self):
        """The max-length-bytes and max-age policy keys apply to a stream."""
        from otter_tx.broker.policy import Policy
        self.vhost.setPolicy(Policy("p", "^s$", {"max-age": "10m", "max-length-bytes": 1000}, vhost="/"))
        self.assertEqual((self.q.stream.maxBytes, self.q.stream.maxAgeSeconds), (1000, 600))

    def test_confirmsWaitForTheStream(self):
        """The journal's sync waits for stream appends."""
        from otter_tx.testing import journaledBroker
        from otter_tx.store.memory import MemoryStore
        broker = journaledBroker(MemoryStore(), self.clock)
        self.addCleanup(broker.streams.close)
        q = broker.vhosts["/"].declareQueue("s", None, durable=True, arguments=dict(S))
        q.enqueue(message())
        d = broker.journal.sync()
        self.assertNoResult(d)
        self.clock.advance(0)
        self.successResultOf(d)


class StreamContractTests(QueueContractMixin, SynchronousTestCase):
    """
    A stream runs the IQueue contract: what it keeps as every queue does
    runs unchanged; where RabbitMQ 3.10's streams differ (checked on the
    peer: consumers are never no-ack and read from their ``x-stream-offset``,
    deliveries wait for the group commit and carry ``x-stream-offset``,
    consuming removes nothing, basic.get / purge / nack / reject are 540,
    the exclusive flag is ignored) the overriding test says how.  IQueue's
    docstrings allow each refusal (an AMQPError).
    """

    def makeSource(self):
        self.addCleanup(self.broker.streams.close)
        return self.vhost.declareQueue("stream", None, durable=True, arguments=dict(S))

    def pump(self):
        """The group commit: a stream's appends are readable at the end of the turn."""
        self.clock.advance(0)

    def refused(self, text, f, *args):
        """``f(*args)`` raises 540 NOT_IMPLEMENTED ``<text> not supported by stream queues queue 'stream' ...``."""
        e = self.assertRaises(AMQPError, f, *args)
        self.assertEqual(e.code, 540)
        self.assertIn("%s not supported by stream queues queue 'stream' in vhost '/'" % (text,), e.text)

    def consumeFirst(self, tag="c"):
        """A manual-ack consumer reading from the first offset, registered; returns it."""
        c = RecordingConsumer(tag, noAck=False, prefetch=100, arguments={"x-stream-offset": "first"})
        self.source.addConsumer(c)
        self.pump()
        return c

    def test_enqueueDelivers(self):
        """A routed message reaches a consumer at next once it is durable, with x-stream-offset."""
        c = RecordingConsumer()
        c.arguments = {}
        self.source.addConsumer(c)
        self.assertTrue(self.source.enqueue(self.message(b"hello")))
        self.clock.advance(0)
        [(queue, entry)] = c.delivered
        self.assertIs(queue, self.source)
        self.assertEqual((entry.message.body, entry.message.headers["x-stream-offset"]), (b"hello", 0))
        self.assertEqual((entry.redelivered, entry.returns), (False, 0))

    def test_deliveredMessage(self):
        """deliveredMessage is the delivered copy."""
        c = RecordingConsumer()
        c.arguments = {}
        self.source.addConsumer(c)
        self.source.enqueue(self.message(b"body"))
        self.clock.advance(0)
        [(_, entry)] = c.delivered
        self.assertEqual(self.source.deliveredMessage(entry).body, b"body")

    def test_dispatchAndRequeueOfNothing(self):
        """dispatch() and a channel close's requeue([], dispatch=False) are harmless; a nack's requeue is 540."""
        self.source.dispatch()
        self.source.requeue([], dispatch=False)
        self.refused("basic.nack and basic.reject", self.source.requeue, [])

    def test_keptWithoutConsumer(self):
        """A message is kept, and stays kept once a consumer has read it (readyCount is the stream's count)."""
        self.assertTrue(self.source.enqueue(self.message(b"a")))
        self.pump()
        self.assertEqual(self.source.readyCount, 1)
        c = self.consumeFirst()
        [(_, entry)] = c.delivered
        self.source.settle(entry)
        self.assertEqual((entry.message.body, self.source.readyCount), (b"a", 1))

    def test_getEmpty(self):
        """basic.get is 540, with or without acknowledgement."""
        self.refused("basic.get", self.source.basicGet, True)
        self.refused("basic.get", self.source.basicGet, False)

    def test_order(self):
        """A consumer added later reads the stream in publish order from the offset it asks (first)."""
        for body in (b"1", b"2", b"3"):
            self.source.enqueue(self.message(body))
            self.pump()
        c = self.consumeFirst()
        self.assertEqual([e.message.body for _, e in c.delivered], [b"1", b"2", b"3"])
        self.assertEqual(self.source.readyCount, 3)

    def test_requeueRedelivered(self):
        """A closing channel's requeue returns credit only; a nack / recover's requeue is 540."""
        self.source.enqueue(self.message(b"x"))
        self.pump()
        c = self.consumeFirst()
        [(_, entry)] = c.delivered
        self.source.requeue([entry], dispatch=False)
        self.assertEqual(self.source.unackedCount, 0)
        self.refused("basic.nack and basic.reject", self.source.requeue, [entry])

    def test_rejectDrops(self):
        """basic.reject is 540 and removes nothing."""
        self.source.enqueue(self.message())
        self.pump()
        c = self.consumeFirst()
        [(_, entry)] = c.delivered
        self.refused("basic.nack and basic.reject", self.source.reject, [entry])
        self.assertEqual(self.source.readyCount, 1)

    def test_purge(self):
        """queue.purge is 540 and removes nothing."""
        for _ in range(3):
            self.source.enqueue(self.message())
            self.pump()
        self.refused("queue.purge", self.source.purge)
        self.assertEqual(self.source.readyCount, 3)

    def test_exclusiveConsumer(self):
        """The exclusive flag is ignored: no consumer is ever refused."""
        self.assertFalse(self.source.refusesConsumer(True))
        self.source.addConsumer(RecordingConsumer("a", noAck=False, prefetch=1, arguments={}), exclusive=True)
        self.assertFalse(self.source.refusesConsumer(False))
        self.assertFalse(self.source.refusesConsumer(True))

    def test_requeueHold(self):
        """A stream holds nothing back for a requeue feeder: its hold and release change no delivery."""
        c = self.consumeFirst()
        feeder = _Feeder()
        self.source.holdRequeue(feeder)
        self.source.enqueue(self.message(b"x"))
        self.pump()
        self.source.releaseRequeue(feeder)
        self.assertEqual([e.message.body for _, e in c.delivered], [b"x"])

    def test_deleteIgnoresConditions(self):
        """queue.delete with if-unused and if-empty deletes a stream with consumers and messages (as 3.10)."""
        self.source.enqueue(self.message())
        self.pump()
        c = self.consumeFirst()
        self.assertEqual(self.source.deleteConditions(True, True), (False, False))
        self.vhost.deleteQueue(self.source, ifUnused=True, ifEmpty=True)
        self.assertNotIn("stream", self.vhost.queues)
        self.assertTrue(c.cancelled)

    def test_checkConsumeAcceptsAPlainConsumer(self):
        """A manual-ack consumer with a prefetch is accepted; no-ack (540) and no prefetch (406) are not."""
        QueueContractMixin.test_checkConsumeAcceptsAPlainConsumer(self)
        e = self.assertRaises(AMQPError, self.source.checkConsume, True, 10, {})
        self.assertEqual(e.code, 540)
        e = self.assertRaises(AMQPError, self.source.checkConsume, False, 0, {})
        self.assertEqual(e.code, 406)


class ManagementTests(SynchronousTestCase):
    """The management JSON of a stream (RabbitMQ 3.10's keys plus the ``stream`` object)."""

    def test_queueDict(self):
        from otter_tx.web._format import queueDict
        clock = Clock()
        clock.advance(1000)
        broker = Broker(clock)
        self.addCleanup(broker.streams.close)
        q = broker.vhosts["/"].declareQueue("s", None, durable=True, arguments=dict(S))
        for _ in range(3):
            q.enqueue(message())
        clock.advance(0)
        d = queueDict(q)
        self.assertEqual((d["type"], d["messages"], d["messages_ready"], d["durable"]), ("stream", 3, 3, True))
        self.assertEqual((d["stream"]["first_offset"], d["stream"]["committed_offset"]), (0, 3))
        self.assertEqual(len(d["stream"]["segments"]), 1)
        self.assertIn("members", d)

    def test_prometheus(self):
        """The queue gauges of /metrics count a stream's messages."""
        from otter_tx.web.metrics import renderMetrics
        clock = Clock()
        clock.advance(1000)
        broker = Broker(clock)
        self.addCleanup(broker.streams.close)
        q = broker.vhosts["/"].declareQueue("s", None, durable=True, arguments=dict(S))
        for _ in range(4):
            q.enqueue(message())
        clock.advance(0)
        text = renderMetrics(broker, 1.0, perObject=True)
        text = text.decode() if isinstance(text, bytes) else text
        self.assertIn('rabbitmq_queue_messages_ready{queue="s",vhost="/"} 4.0', text)
