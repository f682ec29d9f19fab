"""
Tests for :class:`otter_tx.store.log.LogStore` (the message log): the store
contract suite of ``test_store`` on it, and what is specific to the log.
"""

import errno
import os
import random
import sqlite3

from twisted.internet import defer, reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from otter_tx.store import keys
from otter_tx.store.interface import RecoveredMessage, StoreCorruptError, StoreFailedError
from otter_tx.store.log import LogStore, segments
from otter_tx.store.memory import MemoryStore
from otter_tx.store.log.segments import LogCorruptError, QueueLog
from otter_tx.store.sqlite import SQLiteStore
from otter_tx.test.unit.test_store import _SCHEMA_1, StoreContractMixin, _SQLiteFixture, listed


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


class LogStoreBatchTests(_LogFixture, TestCase):
    """How the message log meets the pending batches."""

    async def test_enqueueOneBatchAfterItsMessage(self):
        """
        The writer can take the pending batch between the broker's
        addMessage and its enqueue: the enqueue finds the message in the
        batch written just before.
        """
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        store.addMessage(1, "ex", "rk", b"\x00\x00", b"body")
        await store.sync()
        store.enqueue("q", 1, 1, 1000.0, None, False)
        await store.close()
        store = self.newStore()
        recovered = listed(await store.open())
        [message] = recovered.messages["q"]
        self.assertEqual((message.storeId, message.body, message.routingKey), (1, b"body", "rk"))

    async def test_enqueueWithoutMessageIsLeftOut(self):
        """
        An enqueue whose message was never given (a bug in the caller) is
        left out, counted and logged; the batch's other changes are written
        and its sync fires (failing it would fail every retry of it too).
        """
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        store.enqueue("q", 7, 1, 1000.0, None, False)
        store.addMessage(8, "ex", "rk", b"\x00\x00", b"body")
        store.enqueue("q", 8, 2, 1000.0, None, False)
        await store.sync()
        self.assertEqual(store.stats["droppedEnqueues"], 1)
        await store.close()
        store = self.newStore()
        recovered = listed(await store.open())
        self.assertEqual([m.storeId for m in recovered.messages["q"]], [8])


    async def test_killBetweenTwoQueuesChunks(self):
        """
        A batch's chunks in two queue logs are two writes: a kill between
        them (the files as the first write left them) recovers that batch,
        whose sync had not fired, in the queue written first only; every
        batch a fired sync covered is in both queues.  The writer takes
        the pending batch between any two calls, so a batch can start with
        the second queue's enqueue of a message (what the SIGKILL test of
        ``test_store_crash`` met on PyPy: a message in q2 and not in q1).
        """
        import shutil

        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q1", {})
        store.putEntity("queue", "q2", {})
        for n in (1, 2):
            store.addMessage(n, "ex", "rk", b"\x00\x00", b"body")
            store.enqueue("q1", n, n, 1000.0, None, False)
            store.addMessage(n, "ex", "rk", b"\x00\x00", b"body", True)
            store.enqueue("q2", n, n, 1000.0, None, False)
        await store.sync()
        killed = os.path.abspath(self.mktemp())
        writePhase = QueueLog.writePhase

        def writeThenKill(qlog, phase, synced):
            writePhase(qlog, phase, synced)
            if not os.path.exists(killed):
                shutil.copytree(self.dataDir, killed)

        self.patch(QueueLog, "writePhase", writeThenKill)
        # the batch starts with q2's enqueue of message 3, then q1's
        store.addMessage(3, "ex", "rk", b"\x00\x00", b"body")
        store.enqueue("q2", 3, 3, 1000.0, None, False)
        store.enqueue("q1", 3, 3, 1000.0, None, False)
        await store.sync()
        store = self.newStore(killed)
        recovered = listed(await store.open())
        ids = {key: [m.storeId for m in recovered.messages[key]] for key in ("q1", "q2")}
        self.assertEqual(ids, {"q1": [1, 2], "q2": [1, 2, 3]})


class DeepQueueRecoveryTests(_LogFixture, TestCase):
    """
    A recovered queue deeper than its memory budget keeps its paged tail in
    the message log: nothing is read or copied for it until it is paged in.
    """

    async def fill(self, n, expiring=()):
        from otter_tx.broker.durability import tableToText

        store = self.newStore(segmentBytes=16 * 1024)
        await store.open()
        store.putEntity("vhost", "/", {})
        store.putEntity("queue", "/\x00deep", {"autoDelete": False, "arguments": tableToText({})})
        for i in range(1, n + 1):
            store.addMessage(i, "ex", "rk", b"\x10\x00\x02", b"body-%05d" % i + b"x" * 90)
            store.enqueue("/\x00deep", i, i, 1000.0, 5000.0 if i in expiring else None, False)
        await store.sync()
        store.markRedelivered("/\x00deep", n - 1)
        await store.close()

    async def recoverInto(self, budget=20000):
        from twisted.internet.task import Clock

        from otter_tx.broker.broker import Broker
        from otter_tx.broker.durability import Journal

        clock = Clock()
        clock.advance(1)
        broker = Broker(clock, queueMemoryBudget=budget, pagingDirectory=self.mktemp())
        store = self.newStore(segmentBytes=16 * 1024)
        state = await store.open()
        Journal(broker, store).recover(state)
        return broker, store, clock, broker.vhosts["/"].queues["deep"]

    async def test_pagedTailStaysInTheLog(self):
        """Counts are right at once, the tail is paged without a paging file, and it reads back in order."""
        from otter_tx.broker.paging import StoredRun

        await self.fill(3000)
        broker, store, clock, q = await self.recoverInto()
        self.assertEqual(q.readyCount, 3000)
        self.assertGreater(q.ready.pagedCount, 2000)
        pager = q.ready._pagers[0]
        # the message that started the paging is paged as usual, the rest is the log's
        self.assertTrue(all(isinstance(seg.file, StoredRun) for seg in list(pager.segments)[1:]))
        self.assertEqual(pager.segments[0].count, 1)
        self.assertFalse(os.path.exists(broker.paging.path()) and os.listdir(broker.paging.path()))
        got = []
        while True:
            entry = q.ready.popLive()
            if entry is None:
                break
            got.append((entry.message.storeId, entry.message.body[:10], entry.redelivered))
        self.assertEqual([g[0] for g in got], list(range(1, 3001)))
        self.assertEqual(got[2998], (2999, b"body-02999", True))
        self.assertEqual(got[5], (6, b"body-00006", False))
        for storeId, _, _ in got:
            store.dequeue("/\x00deep", storeId)
        await store.sync()
        await store.close()
        # every segment but the active one was reclaimed
        qdir = os.path.join(store.messagesPath, "q%d" % store._tables.qids["/\x00deep"])
        logs = os.listdir(qdir)
        qlog = store._tables.logs[store._tables.qids["/\x00deep"]]
        self.assertEqual(len(logs), 1, (logs, qlog.segments, [(s, s.pins) for s in qlog.segments]))

    async def test_pagedTailExpires(self):
        """A message with a TTL in the paged tail expires on time, without being delivered."""
        await self.fill(3000, expiring={2500})
        broker, store, clock, q = await self.recoverInto()
        clock.advance(10)
        self.assertEqual(q.readyCount, 2999)
        await store.close()

    async def test_deadSegmentInTheTail(self):
        """Recovery pages past a kept segment whose messages were all acked (it is not read)."""
        from otter_tx.broker.durability import tableToText
        from otter_tx.broker.paging import StoredRun

        store = self.newStore(segmentBytes=16 * 1024)
        await store.open()
        store.putEntity("vhost", "/", {})
        store.putEntity("queue", "/\x00deep", {"autoDelete": False, "arguments": tableToText({})})

        def add(i):
            store.addMessage(i, "ex", "rk", b"\x10\x00\x02", b"body-%05d" % i + b"x" * 90)
            store.enqueue("/\x00deep", i, i, 1000.0, None, False)

        for i in range(1, 1001):
            add(i)
        await store.sync()
        # an ACK of the first segment's message 1 lands in a later segment,
        # which that pins while the first segment lives
        store.dequeue("/\x00deep", 1)
        for i in range(1001, 3001):
            add(i)
        await store.sync()
        qlog = store.queueLog("/\x00deep")
        [pinning] = [seg for seg in qlog.segments if seg.pins]
        dead = set(pinning.ids)
        for storeId in dead:
            store.dequeue("/\x00deep", storeId)
        await store.sync()
        self.assertIn(pinning, qlog.segments)
        self.assertEqual(pinning.live, 0)
        await store.close()
        broker, store, clock, q = await self.recoverInto()
        want = [i for i in range(2, 3001) if i not in dead]
        self.assertEqual(q.readyCount, len(want))
        pager = q.ready._pagers[0]
        self.assertTrue(all(isinstance(seg.file, StoredRun) for seg in list(pager.segments)[1:]))
        got = []
        while True:
            entry = q.ready.popLive()
            if entry is None:
                break
            got.append(entry.message.storeId)
        self.assertEqual(got, want)
        await store.close()



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

    def test_zeroHeaderLastSegmentIsEmpty(self):
        """A last segment whose header is zeros (made, then a crash before its header reached the disk) is removed."""
        qlog = self.newLog()
        for i in range(1, 4):
            _enq(qlog, i)
        _commit(qlog)
        qlog.close()
        stray = os.path.join(self.directory, segments.segmentName(3))
        with open(stray, "wb") as f:
            f.write(bytes(segments.FILE_HEADER.size))
        again = QueueLog.open(self.directory, 256)
        self.addCleanup(again.close)
        self.assertFalse(os.path.exists(stray))
        self.assertEqual((again.committed, again.liveCount()), (3, 3))

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
        self.assertEqual([s for s in again.segments if s.positions is not None and not s.live], [])
        self.assertEqual(sorted((r[0], r[4]) for r in again.recovered()), sorted(model.items()))
        self.assertEqual([s.positions for s in again.segments], [None] * len(again.segments))
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

    def test_damageBeforeTheTailOfTheLastSegment(self):
        """
        A chunk of the last segment failing its CRC with sound chunks after
        it was damaged after its commit (a torn write hits only the last
        chunk): LogCorruptError, and the file is left as it is.
        """
        qlog = self.newLog(segmentBytes=1 << 20)
        for i in range(1, 5):
            _enq(qlog, i)
            _commit(qlog)
        qlog.close()
        path = qlog.segments[-1].path
        with open(path, "r+b") as f:
            f.seek(self._lastChunkStart(path) - 3)
            f.write(b"\xff")
        before = _files(qlog.directory)
        error = self.assertRaises(LogCorruptError, QueueLog.open, qlog.directory, 1 << 20)
        self.assertIn("followed by committed chunks", error.reason)
        self.assertEqual(_files(qlog.directory), before)

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
        self.assertEqual([s.positions for s in qlog.segments], [None] * len(qlog.segments))
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
                self.assertEqual(list(log.read(start, 0)), [])
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

    def test_readWhileSegmentsAreReclaimed(self):
        """
        A reader part way through read() (a stream consumer on the reactor
        thread) while the writer reclaims segments ahead of it goes on with
        the segments that are left, without an error.
        """
        qlog = self.newLog(segmentBytes=1 << 20)
        for group in ((1, 2), (3, 4), (5, 6)):
            for i in group:
                _enq(qlog, i)
            _commit(qlog)
            self.roll(qlog)
        _enq(qlog, 7)
        _commit(qlog)
        reader = qlog.read(0)
        self.assertEqual(next(reader)[0], 0)
        for i in (3, 4):
            qlog.ack(i)
        self.assertEqual(_commit(qlog), 1)
        self.assertEqual([o for o, _ in reader], [1, 4, 5, 6])

    def test_readWhileACommitIsRolledBack(self):
        """
        A reader part way through read() when the writer rolls a failed
        commit back (the file cut shorter than the segment it holds) reads
        the committed messages and stops there, without an error.
        """
        qlog = self.newLog(segmentBytes=1 << 20)
        _enq(qlog, 1)
        _commit(qlog)
        self.roll(qlog)
        _enq(qlog, 2)
        _commit(qlog)
        reader = qlog.read(0)
        self.assertEqual(next(reader)[0], 0)
        _enq(qlog, 3)
        qlog.flush()
        qlog.rollback()
        self.assertEqual([o for o, _ in reader], [1])

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
        A commit whose records rolled over to a new segment writes the old
        segment durably too before it is done (else the sync fires for
        records that may not be on disk, and a crash leaves a torn sealed
        segment): every write goes to a file opened ``O_DSYNC``.
        """
        import fcntl

        qlog = self.newLog()
        _enq(qlog, 1)
        _commit(qlog)
        synced = []
        real = os.pwrite
        realv = getattr(os, "pwritev", None)

        def recording(fd, data, offset):
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DSYNC:
                synced.append(os.readlink("/proc/self/fd/%d" % fd))
            return real(fd, data, offset)

        def recordingv(fd, parts, offset):
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DSYNC:
                synced.append(os.readlink("/proc/self/fd/%d" % fd))
            return realv(fd, parts, offset)

        self.patch(os, "pwrite", recording)
        if realv is not None:
            self.patch(os, "pwritev", recordingv)
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


class _FailingOs:
    """
    Stands in for ``segments.os``: ``os.open`` with ``O_CREAT`` (a new
    segment) or ``os.pwrite`` (the log's durable write: its files are
    ``O_DSYNC``) raises ``OSError(errno)`` while the matching count in
    ``failures`` is above zero (counting down); ``os.pwritev`` too.
    """

    def __init__(self):
        self.failures = {"create": 0, "write": 0}

    def __getattr__(self, name):
        return getattr(os, name)

    def _failing(self, what):
        if self.failures[what] > 0:
            self.failures[what] -= 1
            return True
        return False

    def open(self, path, flags, *args):
        if flags & os.O_CREAT and self._failing("create"):
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        return os.open(path, flags, *args)

    def pwrite(self, fd, data, offset):
        if self._failing("write"):
            raise OSError(errno.EIO, "Input/output error (test)")
        return os.pwrite(fd, data, offset)

    if hasattr(os, "pwritev"):  # not on PyPy 3.9
        def pwritev(self, fd, parts, offset):
            if self._failing("write"):
                raise OSError(errno.EIO, "Input/output error (test)")
            return os.pwritev(fd, parts, offset)


def _fields(message):
    return tuple(getattr(message, name) for name in RecoveredMessage.__slots__)


class LogStoreTests(_LogFixture, TestCase):
    """What is specific to :class:`LogStore`: recovery order and flags, purges, failed writes, migration."""

    async def _reopen(self, store, **kwargs):
        await store.close()
        again = self.newStore(store.path, **kwargs)
        return again, listed(await again.open())

    def add(self, store, queueKey, storeId, seq=None, redelivered=False, body=None, again=False, ts=None):
        store.addMessage(storeId, "ex", "rk.%d" % storeId, b"\x80\x00p",
                         b"body-%d" % storeId if body is None else body, again)
        store.enqueue(queueKey, storeId, storeId if seq is None else seq,
                      float(storeId if ts is None else ts), None, redelivered)

    def ids(self, recovered, queueKey="q"):
        return [m.storeId for m in recovered.messages.get(queueKey, [])]

    def logRecords(self, store, queueKey="q"):
        """``[(offset, storeId)]`` of every record of ``queueKey``'s log (acked ones too)."""
        qlog = store.queueLog(queueKey)
        return [(offset, rec[0]) for offset, rec in qlog.read(0)]

    async def test_disorderedSeqsRecoveredInSeqOrder(self):
        """Messages whose seqs are not in log order come back sorted by seq, across segments."""
        store = self.newStore(segmentBytes=256)
        await store.open()
        store.putEntity("queue", "q", {})
        seqs = [5, 1, 9, 2, 8, 3, 7, 4, 6, 10]
        for storeId, seq in enumerate(seqs, 1):
            self.add(store, "q", storeId, seq=seq)
            await store.sync()
        store.dequeue("q", 3)
        store.markRedelivered("q", 4)
        await store.sync()
        self.assertGreater(len(store.queueLog("q").segments), 2)
        store, recovered = await self._reopen(store, segmentBytes=256)
        self.assertEqual([m.seq for m in recovered.messages["q"]], [1, 2, 3, 4, 5, 6, 7, 8, 10])
        self.assertEqual([(m.storeId, m.redelivered, m.body) for m in recovered.messages["q"]],
                         [(storeId, storeId == 4, b"body-%d" % storeId) for storeId in (2, 4, 6, 8, 1, 9, 7, 5, 10)])
        await store.close()

    async def test_uncleanStopRedeliversAll(self):
        """
        After an unclean stop every recovered message is redelivered; a
        later clean stop keeps them so; a message enqueued after the
        crash is not.
        """
        store = self.newStore(segmentBytes=256)
        await store.open()
        store.putEntity("queue", "q", {})
        store.putEntity("queue", "empty", {})
        for i in range(1, 9):
            self.add(store, "q", i, redelivered=(i == 2))
        await store.sync()
        store.dequeue("q", 5)
        await store.sync()
        await store._abandon()
        crashed = self.newStore(store.path, segmentBytes=256)
        recovered = listed(await crashed.open())
        self.assertEqual([(m.storeId, m.redelivered) for m in recovered.messages["q"]],
                         [(i, True) for i in (1, 2, 3, 4, 6, 7, 8)])
        self.add(crashed, "q", 9)
        crashed, recovered = await self._reopen(crashed, segmentBytes=256)
        self.assertEqual([(m.storeId, m.redelivered) for m in recovered.messages["q"]],
                         [(i, True) for i in (1, 2, 3, 4, 6, 7, 8)] + [(9, False)])
        crashed, recovered = await self._reopen(crashed, segmentBytes=256)
        self.assertEqual([m.redelivered for m in recovered.messages["q"]], [True] * 7 + [False])
        await crashed.close()

    async def test_purgeAndDeleteThenRecover(self):
        """
        A purge, a purge keeping some messages and a queue delete are what
        recovery sees; the logs of purged and deleted queues are removed.
        """
        store = self.newStore(segmentBytes=256)
        await store.open()
        for key in ("purged", "kept", "deleted"):
            store.putEntity("queue", key, {})
            for i in range(1, 11):
                self.add(store, key, i)
        await store.sync()
        oldPurged = store.queueLog("purged").directory
        oldDeleted = store.queueLog("deleted").directory
        store.purgeQueue("purged")
        store.purgeQueue("kept", keep=[2, 7])
        store.deleteEntity("queue", "deleted")
        self.add(store, "purged", 11, again=True)
        await store.sync()
        await store._whenIdle()
        self.assertFalse(os.path.exists(oldPurged))
        self.assertFalse(os.path.exists(oldDeleted))
        self.assertIsNone(store.queueLog("deleted"))
        store, recovered = await self._reopen(store)
        self.assertEqual(sorted(recovered.messages), ["kept", "purged"])
        self.assertEqual(self.ids(recovered, "purged"), [11])
        self.assertEqual(self.ids(recovered, "kept"), [2, 7])
        self.assertEqual(len(os.listdir(store.messagesPath)), 2)
        store.purgeQueue("kept")
        store, recovered = await self._reopen(store)
        self.assertEqual(sorted(recovered.messages), ["purged"])
        self.assertEqual(len(os.listdir(store.messagesPath)), 1)
        await store.close()

    async def test_purgeNotCollectedBeforeStop(self):
        """The log directory of a queue purged just before a stop is removed at the next open."""
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        self.add(store, "q", 1)
        await store.sync()
        store._tables.hasBackgroundWork = lambda: False    # the clean-up does not get to run
        store.purgeQueue("q")
        await store.sync()
        await store._abandon()
        self.assertEqual(len(os.listdir(store.messagesPath)), 1)
        again = self.newStore(store.path)
        recovered = listed(await again.open())
        self.assertEqual(recovered.messages, {})
        self.assertEqual(os.listdir(store.messagesPath), [])
        await again.close()

    async def test_failedCommitRollsBackAndRetries(self):
        """
        A batch whose SQLite commit fails after its logs were written fails
        its syncs; the logs are cut back and the batch is written again
        after the retry, each record once.
        """
        store = self.newStore(retryDelays=(0.05,), segmentBytes=256)
        await store.open()
        store.putEntity("queue", "q", {})
        for i in range(1, 4):
            self.add(store, "q", i)
        await store.sync()
        tables = store._tables
        calls = []

        failing = [True]

        def failingCommit(conn, *args, _original=tables._commit):
            # fails until the test has seen the failure: the writer may take
            # the changes below in more than one batch (it runs when it
            # gets the GIL), and every batch queued behind a failed one
            # waits for its retry
            calls.append(1)
            if failing[0]:
                raise sqlite3.OperationalError("disk I/O error")
            return _original(conn, *args)

        tables._commit = failingCommit
        store.putEntity("vhost", "/", {})
        for i in range(4, 12):
            self.add(store, "q", i)
        store.dequeue("q", 2)
        with self.assertRaises(StoreFailedError):
            await store.sync()
        self.assertEqual(self.logRecords(store), [(0, 1), (1, 2), (2, 3)])
        failing[0] = False
        await store.sync()
        self.assertEqual(self.logRecords(store), [(i - 1, i) for i in range(1, 12)])
        store, recovered = await self._reopen(store)
        self.assertEqual(self.ids(recovered), [1] + list(range(3, 12)))
        self.assertEqual(set(recovered.entities["vhost"]), {"/"})
        await store.close()

    async def test_failedSegmentCreationMidBatch(self):
        """
        A new segment that cannot be created (disk full) in the middle of a
        queue's changes fails the batch without leaving any of them behind:
        after the retry each message is in the log once.
        """
        fake = _FailingOs()
        self.patch(segments, "os", fake)
        store = self.newStore(retryDelays=(0.05,), segmentBytes=256)
        await store.open()
        store.putEntity("queue", "q", {})
        self.add(store, "q", 1)
        await store.sync()
        # every segment creation fails until the test has seen the failure
        # (the writer may take these changes in more than one batch)
        fake.failures["create"] = 10 ** 9
        for i in range(2, 12):
            self.add(store, "q", i)
        with self.assertRaises(StoreFailedError) as caught:
            await store.sync()
        self.assertIn("No space left", str(caught.exception))
        # what is on disk is a prefix of the batch's records, each once
        records = self.logRecords(store)
        self.assertLess(len(records), 11)
        self.assertEqual(records, [(i - 1, i) for i in range(1, len(records) + 1)])
        fake.failures["create"] = 0
        await store.sync()
        self.assertEqual(self.logRecords(store), [(i - 1, i) for i in range(1, 12)])
        store, recovered = await self._reopen(store)
        self.assertEqual(self.ids(recovered), list(range(1, 12)))

    async def test_failedFsyncRetries(self):
        """A durable write of a queue log that fails nacks the batch; the retry writes it once."""
        fake = _FailingOs()
        self.patch(segments, "os", fake)
        store = self.newStore(retryDelays=(0.05,), segmentBytes=256)
        await store.open()
        health = []
        store.addHealthObserver(lambda healthy, reason: health.append(healthy))
        store.putEntity("queue", "q", {})
        store.putEntity("queue", "r", {})
        self.add(store, "q", 1)
        self.add(store, "r", 1, again=True)
        await store.sync()
        # every write fails until the test has seen the failure (the writer
        # may take these changes in more than one batch)
        fake.failures["write"] = 10 ** 9
        for i in range(2, 8):
            self.add(store, "q", i)
            self.add(store, "r", i, again=True)
        store.dequeue("r", 1)
        with self.assertRaises(StoreFailedError):
            await store.sync()
        fake.failures["write"] = 0
        await store.sync()
        self.assertEqual(health, [False, True])
        for key in ("q", "r"):
            self.assertEqual(self.logRecords(store, key), [(i - 1, i) for i in range(1, 8)])
        store, recovered = await self._reopen(store)
        self.assertEqual(self.ids(recovered, "q"), list(range(1, 8)))
        self.assertEqual(self.ids(recovered, "r"), list(range(2, 8)))

    async def test_failedReclaimAfterCommit(self):
        """
        A segment deletion that fails after the batch committed does not
        fail the committed batch, nor write it again: the segment goes at a
        later commit.
        """
        store = self.newStore(retryDelays=(0.05,), segmentBytes=256)
        await store.open()
        store.putEntity("queue", "q", {})
        store.putEntity("queue", "r", {})
        for i in range(1, 9):
            self.add(store, "q", i)
            self.add(store, "r", i, again=True)
            await store.sync()
        failing = [1]
        real = segments._remove

        def remove(path):
            if failing:
                del failing[:]
                raise OSError(errno.EIO, "Input/output error (test)")
            return real(path)

        self.patch(segments, "_remove", remove)
        for i in range(1, 5):
            store.dequeue("q", i)
            store.dequeue("r", i)
        await store.sync()
        self.assertEqual(failing, [])
        self.assertTrue(store.healthy)
        self.assertEqual(store.stats["failedCommits"], 0)
        for key in ("q", "r"):
            # each message once (the segments left start somewhere in 1..5)
            ids = [storeId for _, storeId in self.logRecords(store, key)]
            self.assertEqual(ids, list(range(ids[0], 9)))
            self.assertLessEqual(ids[0], 5)
        kept = len(store.queueLog("q").segments)
        store.dequeue("q", 5)
        await store.sync()
        self.assertLess(len(store.queueLog("q").segments), kept)
        store, recovered = await self._reopen(store)
        self.assertEqual(self.ids(recovered, "q"), [6, 7, 8])
        self.assertEqual(self.ids(recovered, "r"), [5, 6, 7, 8])
        await store.close()

    async def test_longNamesAreStorable(self):
        """
        Exchange names and routing keys longer than a short string (the
        HTTP API and x-dead-letter-routing-key allow them) are written and
        read back; a name of exactly 255 bytes too.
        """
        store = self.newStore(retryDelays=(0.05,), segmentBytes=256)
        await store.open()
        store.putEntity("queue", "q", {})
        odd = b"\xff\xed".decode("utf-8", "surrogateescape")
        names = [("e" * 300, "k" * 70000 + odd), ("x" * 255, "r" * 254), ("", "k" * 255), (odd * 200, "")]
        for storeId, (exchange, routingKey) in enumerate(names, 1):
            store.addMessage(storeId, exchange, routingKey, b"p%d" % storeId, b"b%d" % storeId)
            store.enqueue("q", storeId, storeId, 1.0, None, False)
        await store.sync()
        records = [(rec[5], rec[6], rec[7], rec[8]) for _, rec in store.queueLog("q").read(0)]
        self.assertEqual(records, [(e.encode("utf-8", "surrogateescape"), rk.encode("utf-8", "surrogateescape"),
                                    b"p%d" % i, b"b%d" % i) for i, (e, rk) in enumerate(names, 1)])
        store, recovered = await self._reopen(store)
        self.assertEqual([(m.exchange, m.routingKey, m.propsRaw, m.body) for m in recovered.messages["q"]],
                         [(e, rk, b"p%d" % i, b"b%d" % i) for i, (e, rk) in enumerate(names, 1)])
        self.assertEqual(recovered.stats["bodyBytes"], 8)
        await store.close()

    maxDiff = None

    def test_agreesWithMemoryStore(self):
        """The pseudo-random run of :meth:`_agreesWithMemoryStore`, with coalescing."""
        return defer.Deferred.fromCoroutine(self._agreesWithMemoryStore(True))

    def test_agreesWithMemoryStoreNotCoalescing(self):
        """The pseudo-random run of :meth:`_agreesWithMemoryStore`, every change written (the bench's setting)."""
        return defer.Deferred.fromCoroutine(self._agreesWithMemoryStore(False))

    async def _agreesWithMemoryStore(self, coalesce):
        """
        A pseudo-random run of the broker's calls (addMessage before each
        enqueue, dequeues, redelivered marks, purges with and without kept
        messages, re-enqueues, several queues sharing messages) over
        256-byte segments recovers what a MemoryStore given the same calls
        recovers, after each reopen (clean, or abandoned after a sync).
        """
        rnd = random.Random(int(os.environ.get("LOGTEST_SEED", "2020")))
        fake = _FailingOs()
        self.patch(segments, "os", fake)
        failCommit = []
        failures = [0]
        memory = MemoryStore()
        await memory.open()

        def newStore():
            store = self.newStore(self.dataDir, segmentBytes=256, retryDelays=(0.01,), coalesce=coalesce)
            original = store._tables._commit

            def commit(*args):
                if failCommit:
                    del failCommit[:]
                    raise sqlite3.OperationalError("disk I/O error (test)")
                return original(*args)

            store._tables._commit = commit
            return store

        store = newStore()
        await store.open()
        queues = ["a", "b", "c"]
        live = {key: set() for key in queues}
        added = set()
        nextId = 0
        seq = 0
        reopens = deleted = 0

        def both(name, *args):
            getattr(memory, name)(*args)
            getattr(store, name)(*args)

        for key in queues:
            both("putEntity", "queue", key, {})
        for step in range(1500):
            key = rnd.choice(queues)
            r = rnd.random()
            if r < 0.4:
                if rnd.random() < 0.15 and added:
                    storeId = rnd.choice(sorted(added))
                    if storeId in live[key]:
                        both("dequeue", key, storeId)
                else:
                    nextId += 1
                    storeId = nextId
                seq += 1
                both("addMessage", storeId, "ex", "rk%d" % storeId, b"p", b"m%d" % storeId * (1 + storeId % 8),
                     storeId in added)
                added.add(storeId)
                both("enqueue", key, storeId, seq, 1.0 * seq, None, rnd.random() < 0.1)
                live[key].add(storeId)
            elif r < 0.75 and live[key]:
                storeId = rnd.choice(sorted(live[key]))
                both("dequeue", key, storeId)
                live[key].discard(storeId)
            elif r < 0.9 and live[key]:
                both("markRedelivered", key, rnd.choice(sorted(live[key])))
            elif r < 0.93:
                keep = set(rnd.sample(sorted(live[key]), min(2, len(live[key])))) if rnd.random() < 0.5 else set()
                both("purgeQueue", key, keep)
                live[key] = keep
            if rnd.random() < 0.2:
                await store.sync()
            if rnd.random() < 0.04:
                # a failed write: its syncs fail, it is written again after the retry
                if rnd.random() < 0.5:
                    fake.failures[rnd.choice(["create", "write"])] = 1
                else:
                    failCommit.append(1)
                try:
                    await store.sync()
                except StoreFailedError:
                    failures[0] += 1
                fake.failures.update(create=0, write=0)
                del failCommit[:]
                await store.sync()
            if rnd.random() < 0.015:
                await store.sync()
                reopens += 1
                deleted += store.stats["segmentsDeleted"]
                await memory.close()
                expected = listed(await memory.open())
                if rnd.random() < 0.3:
                    await store._abandon()
                    store = newStore()
                    recovered = listed(await store.open())
                    # an unclean stop: everything comes back redelivered
                    for messages in expected.messages.values():
                        for m in messages:
                            m.redelivered = True
                    await memory.close()
                    memory = MemoryStore()
                    await memory.open()
                    for key2 in queues:
                        memory.putEntity("queue", key2, {})
                    for key2, messages in expected.messages.items():
                        for m in messages:
                            memory.addMessage(m.storeId, m.exchange, m.routingKey, m.propsRaw, m.body, True)
                            memory.enqueue(key2, m.storeId, m.seq, m.enqueuedAtMs, m.expiresAtMs, True)
                else:
                    await store.close()
                    store = newStore()
                    recovered = listed(await store.open())
                self.assertEqual(
                    {k: [_fields(m) for m in v] for k, v in recovered.messages.items()},
                    {k: [_fields(m) for m in v] for k, v in expected.messages.items()}, step)
        store, recovered = await self._reopen(store, segmentBytes=256)
        await memory.close()
        expected = listed(await memory.open())
        self.assertEqual({k: [_fields(m) for m in v] for k, v in recovered.messages.items()},
                         {k: [_fields(m) for m in v] for k, v in expected.messages.items()})
        self.assertGreater(reopens, 10)
        self.assertGreater(failures[0], 10)
        self.assertGreater(deleted + store.stats["segmentsDeleted"], 50)
        await store.close()

    async def test_damagedSealedSegmentRefusesOpen(self):
        """A queue log damaged in a sealed segment makes open() fail with StoreCorruptError naming that file."""
        store = self.newStore(segmentBytes=256)
        await store.open()
        store.putEntity("queue", "q", {})
        for i in range(1, 10):
            self.add(store, "q", i)
            await store.sync()
        path = store.queueLog("q").segments[0].path
        await store.close()
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(b"\x00\x01")
        again = self.newStore(store.path, segmentBytes=256)
        try:
            await again.open()
        except StoreCorruptError as e:
            error = e
        else:
            self.fail("a damaged queue log was opened")
        self.assertEqual(error.path, path)
        self.assertIn(path, str(error))
        self.assertIn("CRC", error.reason)
        self.assertNotIn("\n", str(error))

    async def test_queueLogReadFromReactor(self):
        """queueLog(key).read() and offsetAt() on the reactor thread see each commit once its sync fired."""
        store = self.newStore(segmentBytes=256)
        await store.open()
        self.assertIsNone(store.queueLog("q"))
        store.putEntity("queue", "q", {})
        for i in range(1, 21):
            self.add(store, "q", i, ts=1000 + i)
            if i % 4 == 0:
                await store.sync()
                qlog = store.queueLog("q")
                self.assertEqual([o for o, _ in qlog.read(0)], list(range(i)))
                self.assertEqual(qlog.offsetAt(1000.5 + i), i)
        store.dequeue("q", 3)
        await store.sync()
        qlog = store.queueLog("q")
        self.assertEqual([(o, rec[0], rec[-1]) for o, rec in qlog.read(17)],
                         [(17, 18, b"body-18"), (18, 19, b"body-19"), (19, 20, b"body-20")])
        self.assertEqual([o for o, _ in qlog.read(2, 2)], [2, 3])
        self.assertEqual(qlog.offsetAt(1010), 9)
        self.assertEqual(qlog.offsetAt(0), 0)
        self.assertEqual(qlog.offsetAt(5000), 20)
        await store.close()

    async def _schema2Store(self):
        """
        A closed schema-2 store (SQLiteStore) with messages in several
        queues, one disordered, one a delayed exchange's pseudo-queue;
        returns ``(path, expected messages by queue)``.
        """
        old = SQLiteStore(self.dataDir, reactor)
        self.addCleanup(self._cleanupStore, old)
        await old.open()
        delayed = keys.DELAYED_PREFIX + keys.SEP + "/" + keys.SEP + "dx"
        for key in ("/\x00a", "/\x00b", delayed, "/\x00empty"):
            old.putEntity("queue", key, {"durable": True})
        for i in range(1, 6):
            old.addMessage(i, "amq.direct", "k\udcff%d" % i, b"\x90\x00props", b"m%d" % i * 50)
            old.enqueue("/\x00a", i, 100 + i, 1000.0 + i, 9000.0 if i == 2 else None, i == 3)
        old.enqueue("/\x00b", 1, 7, 1000.0, None, False)
        for storeId, seq in ((6, 3), (7, 1), (8, 2)):
            old.addMessage(storeId, "", "b", b"", b"b%d" % seq)
            old.enqueue("/\x00b", storeId, seq, 2000.0, None, False)
        old.addMessage(9, "dx", "later", b"\x01", b"delayed")
        old.enqueue(delayed, 9, 1, 3000.0, None, False)
        old.dequeue("/\x00a", 4)
        await old.close()
        check = SQLiteStore(self.dataDir, reactor)
        self.addCleanup(self._cleanupStore, check)
        expected = listed(await check.open()).messages
        await check.close()
        self.assertEqual(sorted(expected), sorted(["/\x00a", "/\x00b", delayed]))
        self.assertEqual([m.seq for m in expected["/\x00b"]], [1, 2, 3, 7])
        return check.path, {k: [_fields(m) for m in v] for k, v in expected.items()}

    def _meta(self, path):
        conn = sqlite3.connect(path)
        try:
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
            counts = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                      for t in ("messages", "queue_messages", "dead_queues")]
        finally:
            conn.close()
        return version, counts

    async def test_migrateSchema2(self):
        """
        A schema-2 file (messages in SQLite) opened by LogStore comes back
        with the same messages, then holds them in queue logs: schema
        version 3, message tables empty; it opens again, and an older
        otter_tx (SQLiteStore) refuses it saying to upgrade.
        """
        path, expected = await self._schema2Store()
        self.assertEqual(self._meta(path)[0], "2")
        store = self.newStore()
        recovered = listed(await store.open())
        self.assertEqual({k: [_fields(m) for m in v] for k, v in recovered.messages.items()}, expected)
        self.assertEqual(store.stats["migratedEntries"], 9)
        self.assertEqual(self._meta(path), ("3", [0, 0, 0]))
        store, recovered = await self._reopen(store)
        self.assertEqual({k: [_fields(m) for m in v] for k, v in recovered.messages.items()}, expected)
        self.assertEqual(store.stats["migratedEntries"], 0)
        self.add(store, "/\x00a", 10, seq=200)
        store, recovered = await self._reopen(store)
        self.assertEqual([m.storeId for m in recovered.messages["/\x00a"]], [1, 2, 3, 5, 10])
        await store.close()
        old = SQLiteStore(self.dataDir, reactor)
        self.addCleanup(self._cleanupStore, old)
        with self.assertRaises(StoreCorruptError) as caught:
            await old.open()
        self.assertIn("upgrade otter_tx", str(caught.exception))
        self.assertNotIn("\n", str(caught.exception))
        self.assertEqual(self._meta(path)[0], "3")

    async def test_migrateAfterUncleanStop(self):
        """A schema-2 file left by an unclean stop migrates with every message redelivered and no orphan."""
        old = SQLiteStore(self.dataDir, reactor)
        self.addCleanup(self._cleanupStore, old)
        await old.open()
        old.putEntity("queue", "q", {})
        for i in range(1, 4):
            old.addMessage(i, "", "q", b"", b"m%d" % i)
            old.enqueue("q", i, i, 1.0, None, False)
        old.addMessage(9, "", "q", b"", b"orphan")
        await old.sync()
        await old._abandon()
        store = self.newStore()
        recovered = listed(await store.open())
        self.assertEqual([(m.storeId, m.redelivered) for m in recovered.messages["q"]],
                         [(1, True), (2, True), (3, True)])
        self.assertEqual(self._meta(store.path), ("3", [0, 0, 0]))
        store, recovered = await self._reopen(store)
        self.assertEqual([(m.storeId, m.redelivered) for m in recovered.messages["q"]],
                         [(1, True), (2, True), (3, True)])
        await store.close()

    async def test_migrateSchema1(self):
        """A schema-1 file is migrated through schema 2 into the queue logs in one open."""
        path = os.path.abspath(self.mktemp()) + ".sqlite3"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(_SCHEMA_1 + """
            INSERT INTO meta VALUES ('format', 'otter_tx-store'), ('schema_version', '1');
            INSERT INTO entities VALUES ('queue', '/' || char(0) || 'q', '{"a": 1}');
            INSERT INTO messages VALUES (1, 'ex', 'rk', x'01', x'626f6479');
            INSERT INTO messages VALUES (2, 'ex', 'rk2', x'', x'');
            INSERT INTO queue_messages VALUES ('/' || char(0) || 'q', 1, 11, 5.0, NULL, 1);
            INSERT INTO queue_messages VALUES ('/' || char(0) || 'q', 2, 10, 5.0, 9.0, 0);
        """)
        conn.close()
        store = self.newStore(path)
        recovered = listed(await store.open())
        self.assertEqual(
            [(m.storeId, m.seq, m.exchange, m.routingKey, m.body, m.expiresAtMs, m.redelivered)
             for m in recovered.messages["/\x00q"]],
            [(2, 10, "ex", "rk2", b"", 9.0, True), (1, 11, "ex", "rk", b"body", None, True)],
        )
        self.assertEqual(self._meta(path), ("3", [0, 0, 0]))
        store, recovered = await self._reopen(store)
        self.assertEqual([m.storeId for m in recovered.messages["/\x00q"]], [2, 1])
        await store.close()

    async def test_migrationInterruptedRunsAgain(self):
        """
        A migration stopped after writing the logs but before its SQLite
        transaction runs again at the next open: the logs are written
        afresh, not appended to.
        """
        path, expected = await self._schema2Store()
        with open(path, "rb") as f:
            schema2 = f.read()
        first = self.newStore()
        await first.open()
        await first.close()
        self.assertTrue(os.listdir(first.messagesPath))
        # the SQLite file as it was before the migration's transaction, the logs as written
        with open(path, "wb") as f:
            f.write(schema2)
        again = self.newStore()
        recovered = listed(await again.open())
        self.assertEqual({k: [_fields(m) for m in v] for k, v in recovered.messages.items()}, expected)
        self.assertEqual(self._meta(path), ("3", [0, 0, 0]))
        await again.close()


class CrcTests(SynchronousTestCase):
    """
    The message log's crc32 (ISA-L's on CPython; on PyPy zlib-ng's for buffers and zlib's for
    bytes; zlib's where they are missing) is zlib's CRC-32.
    """

    def test_sameAsZlib(self):
        import platform
        import zlib

        from otter_tx.store.log.segments import crc32

        big = bytes(range(256)) * 4099
        for data in (b"", b"a", big, memoryview(b"xyz" * 1000)[5:2000], bytearray(big),
                     memoryview(bytearray(big))[7:70000]):
            self.assertEqual(crc32(data), zlib.crc32(data))
            self.assertEqual(crc32(data, 12345), zlib.crc32(data, 12345))
        # installed with otter_tx on both runtimes (setup.cfg)
        self.assertIsNot(crc32, zlib.crc32)
        if platform.python_implementation() == "PyPy":
            from zlib_ng.zlib_ng import crc32 as zng

            self.assertIs(crc32.__defaults__[2], zng)
