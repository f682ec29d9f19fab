"""
Tests for :class:`otter_tx.store.log.LogStore` (the message log): the store
contract suite of ``test_store`` on it, and what is specific to the log.
"""

import os
import random

from twisted.internet import defer, reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from otter_tx.store.log import LogStore, segments
from otter_tx.store.log.segments import LogCorruptError, QueueLog
from otter_tx.test.unit.test_store import StoreContractMixin, _SQLiteFixture, listed


class _LogFixture(_SQLiteFixture):
    """Stores are LogStores on this test's data dir."""

    def newStore(self, path=None, **kwargs):
        store = LogStore(path or self.dataDir, reactor, **kwargs)
        self.addCleanup(self._cleanupStore, store)
        return store


class LogStoreContractTests(StoreContractMixin, _LogFixture, TestCase):
    """The store contract on :class:`LogStore`, with the real reactor and files."""

    storesOnce = False

    def makeStore(self):
        return self.newStore()

    async def reopen(self):
        await self.store.close()
        self.store = self.newStore()
        return listed(await self.store.open())

    def drive(self, coroutine):
        return defer.Deferred.fromCoroutine(coroutine)


def _enq(qlog, storeId, seq=None, ts=None, body=None, redelivered=False):
    """Enqueue message ``storeId`` in ``qlog`` (seq and timestamp default to the id); returns its offset."""
    return qlog.enqueue(storeId, storeId if seq is None else seq,
                        float(storeId if ts is None else ts), None, redelivered, b"ex", b"rk.%d" % storeId,
                        b"\x80\x00p", b"body-%d" % storeId if body is None else body)


def _commit(qlog):
    """Flush, finish the commit and reclaim; returns the segments deleted."""
    qlog.flush()
    qlog.done()
    return qlog.reclaim()


def _liveView(qlog):
    """``[(offset, storeId, redelivered)]`` of the live messages, from the in-memory state."""
    out = []
    for seg in qlog.segments:
        for j, f in enumerate(seg.flags):
            if f & segments.LIVE:
                offset = seg.first + j
                storeId = seg.ids[j]
                if f & segments.OUT_OF_ORDER:
                    storeId = qlog._exceptionIds[offset]
                out.append((offset, storeId, bool(f & segments.REDELIVERED)))
    return out


def _files(directory):
    """``{name: bytes}`` of the files in ``directory``."""
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


class QueueLogTests(SynchronousTestCase):
    """:class:`QueueLog` directly: segments, reopening, reclaiming, damage, rollback, reads."""

    def newLog(self, segmentBytes=256):
        self.directory = os.path.abspath(self.mktemp())
        qlog = QueueLog.create(self.directory, segmentBytes=segmentBytes)
        self.addCleanup(qlog.close)
        return qlog

    def reopen(self, qlog, **kwargs):
        """Close ``qlog`` and open its directory again."""
        qlog.close()
        again = QueueLog.open(qlog.directory, qlog.segmentBytes, **kwargs)
        self.addCleanup(again.close)
        return again

    def assertSameState(self, qlog, again):
        """``again`` (reopened) holds what ``qlog`` holds: live set, flags, offsets, bodies."""
        self.assertEqual(_liveView(again), _liveView(qlog))
        self.assertEqual(again.committed, qlog.committed)
        self.assertEqual([(s.first, s.next, s.live) for s in again.segments],
                         [(s.first, s.next, s.live) for s in qlog.segments])
        self.assertEqual(again.exceptions, {i: o for i, o in qlog.exceptions.items()
                                            if o >= again.segments[0].first} if again.segments else {})
        for storeId in [sid for _, sid, _ in _liveView(qlog)]:
            self.assertEqual(again.locate(storeId), qlog.locate(storeId))

    def test_enqueueAckMarkAcrossRolls(self):
        """Messages, acks and marks across segment rolls come back the same when the log is reopened."""
        qlog = self.newLog()
        for i in range(1, 41):
            _enq(qlog, i)
            if i % 3 == 0:
                _commit(qlog)
        _commit(qlog)
        self.assertGreater(len(qlog.segments), 5)
        for i in range(1, 41, 4):
            self.assertTrue(qlog.ack(i))
        for i in range(2, 41, 5):
            self.assertEqual(qlog.mark(i), i % 4 != 1)
        _commit(qlog)
        self.assertEqual(qlog.committed, 40)
        self.assertEqual(qlog.liveCount(), 30)
        again = self.reopen(qlog)
        self.assertSameState(qlog, again)
        self.assertEqual([(r[0], r[4]) for r in again.recovered()],
                         [(i, i % 5 == 2) for i in range(1, 41) if i % 4 != 1])
        # and the reopened log goes on where the first one stopped
        self.assertEqual(_enq(again, 41), 40)
        _commit(again)
        self.assertSameState(again, self.reopen(again))

    def test_modelAcrossReopens(self):
        """
        A pseudo-random run of enqueues (some out of id order), acks, marks
        and purges over 256-byte segments, committed in small groups, agrees
        with a plain model after each commit and after each reopen.
        """
        rnd = random.Random(20)
        qlog = self.newLog()
        model = {}
        nextId = 100
        seq = 0
        for step in range(600):
            r = rnd.random()
            if r < 0.45 or not model:
                if rnd.random() < 0.1:
                    storeId = rnd.randrange(1, 100)
                    if storeId in model:
                        continue
                else:
                    nextId += 1
                    storeId = nextId
                seq += 1
                _enq(qlog, storeId, seq=seq, body=b"x" * rnd.randrange(0, 60))
                model[storeId] = False
            elif r < 0.8:
                storeId = rnd.choice(sorted(model))
                self.assertTrue(qlog.ack(storeId))
                del model[storeId]
            elif r < 0.97:
                storeId = rnd.choice(sorted(model))
                self.assertTrue(qlog.mark(storeId))
                model[storeId] = True
            else:
                keep = set(rnd.sample(sorted(model), min(3, len(model))))
                qlog.purge(keep)
                model = {i: model[i] for i in keep}
            if rnd.random() < 0.3:
                _commit(qlog)
                self.assertEqual(sorted((sid, red) for _, sid, red in _liveView(qlog)), sorted(model.items()))
            if rnd.random() < 0.05:
                _commit(qlog)
                again = self.reopen(qlog)
                self.assertSameState(qlog, again)
                self.assertEqual(len(os.listdir(qlog.directory)), len(again.segments))
                qlog = again
        _commit(qlog)
        again = self.reopen(qlog)
        self.assertSameState(qlog, again)
        self.assertEqual(sorted((r[0], r[4]) for r in again.recovered()), sorted(model.items()))
        self.assertGreater(qlog.reclaim() + len(qlog.segments), 3)

    def test_outOfOrderIds(self):
        """Ids lower than one before them (exceptions) are located, acked and marked, across rolls and reopens."""
        qlog = self.newLog()
        order = [10, 5, 20, 7, 30, 6, 40, 8, 50]
        offsets = {storeId: _enq(qlog, storeId) for storeId in order}
        _commit(qlog)
        self.assertEqual(offsets, {storeId: i for i, storeId in enumerate(order)})
        self.assertEqual(set(qlog.exceptions), {5, 7, 6, 8})
        for storeId in order:
            self.assertEqual(qlog.locate(storeId), offsets[storeId])
        self.assertTrue(qlog.ack(5))
        self.assertTrue(qlog.mark(7))
        self.assertFalse(qlog.ack(5))
        _commit(qlog)
        again = self.reopen(qlog)
        self.assertSameState(qlog, again)
        self.assertIsNone(again.locate(5))
        self.assertTrue(again.ack(7))
        self.assertTrue(again.mark(6))
        self.assertTrue(again.ack(20))
        _commit(again)
        third = self.reopen(again)
        self.assertSameState(again, third)
        self.assertEqual([(r[0], r[4]) for r in third.recovered()],
                         [(10, False), (30, False), (6, True), (40, False), (8, False), (50, False)])

    def test_ackOfAbsentIdIsNoop(self):
        """A dequeue (ack or mark) of an id not live in the log writes nothing."""
        qlog = self.newLog()
        _enq(qlog, 1)
        _commit(qlog)
        before = _files(qlog.directory)
        self.assertFalse(qlog.ack(2))
        self.assertFalse(qlog.mark(0))
        self.assertFalse(qlog.hasPending())
        _commit(qlog)
        self.assertTrue(qlog.ack(1))
        _commit(qlog)
        self.assertFalse(qlog.ack(1))
        self.assertFalse(qlog.hasPending())
        self.assertNotEqual(_files(qlog.directory), before)

    def roll(self, qlog):
        """Start a new segment now (as if the active one were full)."""
        size = qlog.segmentBytes
        qlog.segmentBytes = 0
        try:
            qlog._active()
        finally:
            qlog.segmentBytes = size

    def test_reclaimAndPins(self):
        """
        A sealed segment with nothing live is deleted, unless it holds an
        ACK about an older segment that is still there (it would bring that
        message back); once the older one goes, so does it.  The active
        segment is never deleted.
        """
        qlog = self.newLog(segmentBytes=1 << 20)
        _enq(qlog, 1)
        _enq(qlog, 2)
        _commit(qlog)                      # A = [1, 2]
        self.roll(qlog)
        _enq(qlog, 3)
        qlog.ack(1)                        # B = [3] + ACK(1 in A): pins A
        _commit(qlog)
        self.roll(qlog)
        _enq(qlog, 4)
        _enq(qlog, 5)
        _commit(qlog)                      # C = [4, 5]
        self.roll(qlog)
        _enq(qlog, 6)                      # D = [6], active
        _commit(qlog)
        a, b, c, d = qlog.segments
        self.assertEqual([s.first for s in qlog.segments], [0, 2, 3, 5])
        self.assertEqual(b.pins, {a})
        qlog.ack(3)
        self.assertEqual(_commit(qlog), 0)           # B: nothing live, but pinned by its ACK about A
        self.assertEqual(qlog.segments, [a, b, c, d])
        qlog.ack(4)
        qlog.ack(5)                                   # C: nothing live, no pin: deleted
        self.assertEqual(_commit(qlog), 1)
        self.assertEqual(qlog.segments, [a, b, d])
        self.assertEqual(sorted(os.listdir(qlog.directory)),
                         [segments.segmentName(s.first) for s in (a, b, d)])
        again = self.reopen(qlog)
        self.assertSameState(qlog, again)
        qlog = again
        a, b, d = qlog.segments
        self.assertEqual(b.pins, {a})
        qlog.ack(2)                                   # A goes, then B
        self.assertEqual(_commit(qlog), 2)
        self.assertEqual([s.first for s in qlog.segments], [5])
        qlog.ack(6)
        self.assertEqual(_commit(qlog), 0)            # the active segment stays
        self.assertEqual(os.listdir(qlog.directory), [segments.segmentName(5)])
        again = self.reopen(qlog)
        self.assertEqual((again.committed, again.liveCount()), (6, 0))
        self.assertEqual(_enq(again, 7), 6)

    def test_markAndPurgePin(self):
        """MARK, PURGE and REDELIVER_ALL records about an older segment pin theirs like an ACK."""
        for op in ("mark", "purge", "redeliverAll"):
            qlog = self.newLog(segmentBytes=1 << 20)
            _enq(qlog, 1)
            _enq(qlog, 2)
            _commit(qlog)
            self.roll(qlog)
            _enq(qlog, 3)
            if op == "mark":
                qlog.mark(1)
            elif op == "purge":
                qlog.purge([1, 3])
            else:
                qlog.redeliverAll()
            _commit(qlog)
            self.roll(qlog)
            _enq(qlog, 4)
            qlog.ack(3)
            self.assertEqual(_commit(qlog), 0, op)
            self.assertEqual(len(qlog.segments), 3, op)
            again = self.reopen(qlog)
            self.assertSameState(qlog, again)
            again.ack(1)
            if op != "purge":
                again.ack(2)
            self.assertEqual(_commit(again), 2, op)

    def test_purgeKeepAcrossSegments(self):
        """A purge keeping a few messages spread over segments keeps exactly those, across a reopen."""
        qlog = self.newLog()
        for i in range(1, 31):
            _enq(qlog, i)
            if i % 4 == 0:
                _commit(qlog)
        qlog.ack(3)
        _enq(qlog, 3, seq=100)           # again, out of id order (as a re-enqueue writes it)
        _commit(qlog)
        qlog.mark(12)
        qlog.purge([2, 12, 29, 3, 99])
        _enq(qlog, 31)
        deleted = _commit(qlog)
        self.assertGreater(deleted, 2)
        self.assertEqual([(sid, red) for _, sid, red in _liveView(qlog)],
                         [(2, False), (12, True), (29, False), (3, False), (31, False)])
        again = self.reopen(qlog)
        self.assertSameState(qlog, again)
        self.assertEqual([(r[0], r[4]) for r in again.recovered()],
                         [(2, False), (12, True), (29, False), (3, False), (31, False)])
        again.purge([])
        _commit(again)
        self.assertEqual(again.liveCount(), 0)
        self.assertEqual(self.reopen(again).liveCount(), 0)

    def test_redeliverAll(self):
        """redeliverAll marks every live message redelivered, and only those before it."""
        qlog = self.newLog()
        for i in range(1, 11):
            _enq(qlog, i)
        qlog.ack(4)
        _commit(qlog)
        qlog.redeliverAll()
        _enq(qlog, 11)
        _commit(qlog)
        expected = [(i, i != 11) for i in range(1, 12) if i != 4]
        self.assertEqual([(sid, red) for _, sid, red in _liveView(qlog)], expected)
        again = self.reopen(qlog)
        self.assertSameState(qlog, again)
        self.assertEqual([(r[0], r[4]) for r in again.recovered()], expected)

    def _lastChunkStart(self, path):
        """Byte position of the last chunk of segment ``path``."""
        with open(path, "rb") as f:
            buf = f.read()
        pos = last = segments.FILE_HEADER.size
        while pos < len(buf):
            last = pos
            pos += segments.CHUNK_HEADER.size + segments.CHUNK_HEADER.unpack_from(buf, pos)[1]
        return last

    def test_tornTail(self):
        """
        A last chunk cut short or failing its CRC is dropped (the file is
        cut there) and the log holds what it held before that commit.
        """
        for damage in ("truncate", "flip", "header"):
            qlog = self.newLog(segmentBytes=1024)
            for i in range(1, 13):
                _enq(qlog, i)
                if i % 2 == 0:
                    _commit(qlog)
            before = _liveView(qlog)
            last = qlog.segments[-1].path
            start = os.path.getsize(last)
            qlog.ack(1)
            _enq(qlog, 13)
            _commit(qlog)
            self.assertEqual(qlog.segments[-1].path, last)
            end = os.path.getsize(last)
            qlog.close()
            with open(last, "r+b") as f:
                if damage == "truncate":
                    f.truncate((start + end) // 2)
                elif damage == "header":
                    f.truncate(start + 7)
                else:
                    f.seek(end - 3)
                    byte = f.read(1)
                    f.seek(end - 3)
                    f.write(bytes([byte[0] ^ 0x20]))
            again = QueueLog.open(qlog.directory, 1024)
            self.addCleanup(again.close)
            self.assertEqual(_liveView(again), before, damage)
            self.assertEqual(again.committed, 12)
            self.assertEqual(os.path.getsize(last), start, damage)
            self.assertEqual(_enq(again, 13), 12)

    def test_tornSegmentHeader(self):
        """A last segment created but without its whole header is removed."""
        qlog = self.newLog()
        for i in range(1, 6):
            _enq(qlog, i)
            _commit(qlog)
        before = _liveView(qlog)
        qlog.close()
        path = os.path.join(qlog.directory, segments.segmentName(qlog.committed))
        with open(path, "wb") as f:
            f.write(segments.FILE_MAGIC[:5])
        again = QueueLog.open(qlog.directory, 256)
        self.addCleanup(again.close)
        self.assertEqual(_liveView(again), before)
        self.assertFalse(os.path.exists(path))

    def test_sealedSegmentDamage(self):
        """Damage in a segment other than the last is LogCorruptError naming the file; nothing is changed."""
        for damage in ("flip", "truncate"):
            qlog = self.newLog()
            for i in range(1, 13):
                _enq(qlog, i)
                _commit(qlog)
            qlog.close()
            path = qlog.segments[1].path
            with open(path, "r+b") as f:
                if damage == "truncate":
                    f.truncate(os.path.getsize(path) - 5)
                else:
                    f.seek(os.path.getsize(path) - 5)
                    f.write(b"\xff")
            before = _files(qlog.directory)
            error = self.assertRaises(LogCorruptError, QueueLog.open, qlog.directory, 256)
            self.assertEqual(error.path, path)
            self.assertIn("sealed segment", error.reason)
            self.assertEqual(_files(qlog.directory), before)

    def test_rollbackRestoresState(self):
        """
        rollback() after a flush whose commit failed leaves exactly the
        files and the state of before, across created segments, and the
        same changes made again give the same log as without the failure.
        """
        qlog = self.newLog()
        for i in range(1, 8):
            _enq(qlog, i)
            _commit(qlog)
        qlog.ack(2)
        qlog.mark(3)
        _commit(qlog)
        files = _files(qlog.directory)
        view = _liveView(qlog)
        firsts = [s.first for s in qlog.segments]

        def changes(log):
            for i in range(8, 20):
                _enq(log, i)
            log.ack(1)
            log.ack(9)
            log.mark(4)
            log.purge([5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
        changes(qlog)
        qlog.flush()
        self.assertGreater(len(qlog.segments), len(firsts))
        qlog.rollback()
        self.assertEqual(_files(qlog.directory), files)
        self.assertEqual(_liveView(qlog), view)
        self.assertEqual(qlog.committed, 7)
        self.assertEqual([s.first for s in qlog.segments], firsts)
        self.assertFalse(qlog.hasPending())
        changes(qlog)
        _commit(qlog)
        other = self.newLog()
        for i in range(1, 8):
            _enq(other, i)
            _commit(other)
        other.ack(2)
        other.mark(3)
        _commit(other)
        changes(other)
        _commit(other)
        self.assertEqual(_files(qlog.directory), _files(other.directory))
        self.assertSameState(other, self.reopen(qlog))

    def test_rollbackOfFirstWrite(self):
        """Rolling back the first commit of a new log leaves it empty, at its first offset."""
        qlog = self.newLog()
        _enq(qlog, 1)
        qlog.flush()
        qlog.rollback()
        self.assertEqual(os.listdir(qlog.directory), [])
        self.assertEqual((qlog.committed, qlog.liveCount()), (0, 0))
        self.assertEqual(_enq(qlog, 1), 0)
        _commit(qlog)
        self.assertEqual(self.reopen(qlog).liveCount(), 1)

    def test_read(self):
        """read(offset) returns every message from any offset on (acked ones too), with and without limit."""
        self.patch(segments, "INDEX_EVERY", 4)
        qlog = self.newLog(segmentBytes=1024)
        for i in range(60):
            _enq(qlog, 1000 + i, ts=i)
            if i % 5 == 4:
                _commit(qlog)
        for i in range(0, 60, 3):
            qlog.ack(1000 + i)
        _commit(qlog)
        self.assertGreater(len(qlog.segments), 3)
        for log in (qlog, self.reopen(qlog)):
            for start in range(62):
                got = [(o, rec[0], rec[-1]) for o, rec in log.read(start)]
                self.assertEqual(got, [(o, 1000 + o, b"body-%d" % (1000 + o)) for o in range(start, 60)])
                for limit in (1, 3, 7):
                    self.assertEqual([o for o, _ in log.read(start, limit)],
                                     list(range(start, min(60, start + limit))))

    def test_readSkipsDeletedSegments(self):
        """read() from an offset of a deleted segment (at the start or between others) goes on from the next one."""
        qlog = self.newLog(segmentBytes=1 << 20)
        for group in ((1, 2), (3, 4), (5, 6), (7, 8)):
            for i in group:
                _enq(qlog, i)
            _commit(qlog)
            self.roll(qlog)
        for i in (1, 2, 5, 6):
            qlog.ack(i)
        _enq(qlog, 9)
        _commit(qlog)
        self.assertEqual([s.first for s in qlog.segments], [2, 6, 8])
        for log in (qlog, self.reopen(qlog)):
            for start, expected in ((0, [2, 3, 6, 7, 8]), (4, [6, 7, 8]), (5, [6, 7, 8]), (7, [7, 8])):
                self.assertEqual([o for o, _ in log.read(start)], expected)
            self.assertEqual([o for o, _ in log.read(4, 1)], [6])

    def test_readOnlyCommitted(self):
        """
        read() and offsetAt() see only messages of finished commits: not
        pending ones, and not those flushed by a commit that is rolled back.
        """
        qlog = self.newLog()
        _enq(qlog, 1, ts=10)
        _commit(qlog)
        _enq(qlog, 2, ts=20)
        self.assertEqual([o for o, _ in qlog.read(0)], [0])
        qlog.flush()
        self.assertEqual([o for o, _ in qlog.read(0)], [0])
        self.assertEqual(qlog.offsetAt(15), 1)
        qlog.rollback()
        _enq(qlog, 3, ts=30)
        _commit(qlog)
        self.assertEqual([(o, rec[0]) for o, rec in qlog.read(0)], [(0, 1), (1, 3)])

    def test_offsetAt(self):
        """offsetAt(t) is the first offset enqueued at or after t, across blocks and segments, or the end."""
        self.patch(segments, "INDEX_EVERY", 4)
        qlog = self.newLog(segmentBytes=1024)
        stamps = [100.0 + 10 * i for i in range(50)]
        for i, ts in enumerate(stamps):
            _enq(qlog, i + 1, ts=ts)
            if i % 3 == 2:
                _commit(qlog)
        _commit(qlog)
        for i in range(0, 50, 2):
            qlog.ack(i + 1)
        _commit(qlog)
        self.assertGreater(len(qlog.segments), 3)
        for log in (qlog, self.reopen(qlog)):
            self.assertEqual(log.offsetAt(0), 0)
            for i, ts in enumerate(stamps):
                self.assertEqual(log.offsetAt(ts), i, ts)
                self.assertEqual(log.offsetAt(ts - 5), i, ts)
            self.assertEqual(log.offsetAt(stamps[-1] + 1), 50)

    def test_rollWithEmptyActiveSegment(self):
        """
        Acks that fill a segment holding no message of its own roll to a
        new segment without overwriting it: every record stays, each
        segment file is distinct.
        """
        qlog = self.newLog()
        for i in range(1, 61):
            _enq(qlog, i)
        _commit(qlog)
        for i in range(1, 60):
            qlog.ack(i)
        _commit(qlog)
        names = sorted(os.listdir(qlog.directory))
        self.assertEqual(len(names), len({s.path for s in qlog.segments}))
        self.assertEqual(len(names), len(qlog.segments))
        again = self.reopen(qlog)
        self.assertEqual([sid for _, sid, _ in _liveView(again)], [60])
        self.assertSameState(qlog, again)

    def test_rollFsyncsEverySegmentWritten(self):
        """
        A commit whose chunk rolled over to a new segment fsyncs the old
        segment too before it is done (else the sync fires for records
        that may not be on disk, and a crash leaves a torn sealed segment).
        """
        qlog = self.newLog()
        _enq(qlog, 1)
        _commit(qlog)
        synced = []
        real = os.fdatasync

        def recording(fd):
            synced.append(os.readlink("/proc/self/fd/%d" % fd))
            return real(fd)

        self.patch(os, "fdatasync", recording)
        written = {}
        sizes = {s.path: os.path.getsize(s.path) for s in qlog.segments}
        for i in range(2, 20):
            _enq(qlog, i)
        qlog.flush()
        qlog.done()
        for seg in qlog.segments:
            if os.path.getsize(seg.path) != sizes.get(seg.path):
                written[seg.path] = True
        self.assertGreater(len(written), 1)
        self.assertEqual(set(written) - set(synced), set())

    def test_newLogDirectoryIsSynced(self):
        """The directory that holds a new queue log is fsync'd, so the log survives a power loss."""
        synced = []
        real = segments._fsyncDirectory

        def recording(directory):
            synced.append(os.path.abspath(directory))
            return real(directory)

        self.patch(segments, "_fsyncDirectory", recording)
        parent = os.path.abspath(self.mktemp())
        os.makedirs(parent)
        qlog = QueueLog.create(os.path.join(parent, "q1"))
        self.addCleanup(qlog.close)
        _enq(qlog, 1)
        _commit(qlog)
        self.assertIn(parent, synced)
        self.assertIn(os.path.join(parent, "q1"), synced)
