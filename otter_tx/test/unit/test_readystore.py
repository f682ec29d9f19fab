"""
Deterministic tests (task.Clock) of a queue's ready store on its own
(otter_tx.broker.readystore.ReadyStore, the IReadyStore seam): delivery
order across priority levels, paging beyond the memory budget, expiry
reaped wherever an entry sits, reinsertion at seq positions, clearing and
detaching the head for a lowered length limit.
"""

from collections import deque

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyClass, verifyObject

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker import paging
from otter_tx.broker.interfaces import IReadyStore
from otter_tx.broker.message import Message
from otter_tx.broker.paging import ENTRY_OVERHEAD, IncrementalFree, PagingDirectory
from otter_tx.broker.readystore import GONE, READY, QueueEntry, ReadyStore

#: what one 16-byte message costs against the budget
COST = 16 + ENTRY_OVERHEAD


def body(i):
    """A 16-byte body numbered ``i``."""
    return b"%016d" % (i,)


class ReadyStoreTestCase(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.patch(paging, "SEGMENT_COUNT", 4)
        self.patch(PagingDirectory, "threaded", False)
        self.paging = PagingDirectory(self.mktemp())
        self.freer = IncrementalFree(self.clock)
        self.expired = []
        self.seq = 0

    def makeStore(self, maxPriority=None, budget=10 * COST):
        """A store whose expired entries land in ``self.expired``."""
        return ReadyStore(self.clock, maxPriority, budget, self.paging, self.freer, None, self.expired.extend)

    def entry(self, store, i, ttlMs=None, **props):
        """A new READY entry of a 16-byte message numbered ``i`` (its seq is ``i``)."""
        m = Message("", "q", encodeProperties(props), body(i), props)
        expiresAt = None if ttlMs is None else self.clock.seconds() * 1000.0 + ttlMs
        return QueueEntry(m, i, expiresAt, store.levelOf(m))

    def fill(self, store, n, start=0, **kw):
        entries = [self.entry(store, i, **kw) for i in range(start, start + n)]
        for e in entries:
            store.append(e)
        return entries

    def drain(self, store):
        """popLive until empty: the message bodies."""
        out = []
        while True:
            e = store.popLive()
            if e is None:
                return out
            out.append(e.message.body)


class ReadyStoreSeamTests(ReadyStoreTestCase):
    """ReadyStore is what IReadyStore declares."""

    def test_verifyClass(self):
        """ReadyStore implements every method of IReadyStore."""
        self.assertTrue(verifyClass(IReadyStore, ReadyStore))

    def test_verifyObject(self):
        """A store has IReadyStore's attributes too."""
        self.assertTrue(verifyObject(IReadyStore, self.makeStore()))


class OrderTests(ReadyStoreTestCase):
    """Entries come out in delivery order."""

    def test_fifo(self):
        """Without priorities, entries come out in the order they were appended; counts follow."""
        s = self.makeStore()
        self.fill(s, 5)
        self.assertEqual((s.readyCount, s.readyBytes), (5, 80))
        self.assertEqual(self.drain(s), [body(i) for i in range(5)])
        self.assertEqual((s.readyCount, s.readyBytes), (0, 0))

    def test_priorityLevels(self):
        """The highest level comes first, FIFO within a level; a priority above the maximum counts as it."""
        s = self.makeStore(maxPriority=2)
        for i, p in enumerate([0, 2, 1, 9, 0]):
            s.append(self.entry(s, i, priority=p))
        self.assertEqual(self.drain(s), [body(1), body(3), body(2), body(0), body(4)])

    def test_reinsert(self):
        """Reinserted entries go back at their seq positions: before the head, after the tail, in the middle."""
        s = self.makeStore()
        entries = self.fill(s, 6)
        taken = [s.popLive() for _ in range(6)]
        self.assertEqual(taken, entries)
        for i in (1, 3, 4):
            s.append(entries[i])
        s.reinsert([entries[5], entries[2], entries[0]])
        self.assertEqual(s.readyCount, 6)
        self.assertEqual(self.drain(s), [body(i) for i in range(6)])


class ExpiryTests(ReadyStoreTestCase):
    """Expired entries are reaped wherever they sit and handed to onExpired."""

    def test_reapedInTheMiddle(self):
        """An expiring entry behind others is reaped on time, out of the counts, and handed over GONE."""
        s = self.makeStore()
        self.fill(s, 2)
        e = self.entry(s, 2, ttlMs=100)
        s.append(e)
        self.fill(s, 2, start=3)
        self.clock.advance(0.1)
        self.assertEqual(self.expired, [e])
        self.assertEqual((e.state, s.readyCount, s.readyBytes), (GONE, 4, 64))
        self.assertEqual(self.drain(s), [body(0), body(1), body(3), body(4)])

    def test_popLiveSkipsExpired(self):
        """popLive never returns an expired entry: those met on the way are handed to onExpired."""
        s = self.makeStore()
        s.freeze()  # no timer: only popLive can find them
        dead = self.fill(s, 3, ttlMs=10)
        self.fill(s, 1, start=3)
        self.clock.advance(1)
        self.assertEqual(s.popLive().message.body, body(3))
        self.assertEqual(self.expired, dead)
        self.assertEqual({e.state for e in dead}, {GONE})

    def test_freeze(self):
        """freeze cancels the expiry timer; the entries stay."""
        s = self.makeStore()
        self.fill(s, 2, ttlMs=10)
        s.freeze()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(1)
        self.assertEqual((s.readyCount, self.expired), (2, []))


class PagingTests(ReadyStoreTestCase):
    """Beyond the memory budget entries are paged and come back in order."""

    def test_pagedBeyondBudget(self):
        """30 messages with a 10-message budget: 20 paged, counted in readyCount, read back in order."""
        s = self.makeStore()
        self.fill(s, 30, delivery_mode=2)
        self.assertEqual((s.readyCount, s.pagedCount, s.pagedBytes), (30, 20, 320))
        self.assertEqual(s.persistent(), (30, 480))
        self.assertEqual([e.message.body for e in s.entries()], [body(i) for i in range(30)])
        self.assertEqual(self.drain(s), [body(i) for i in range(30)])
        self.assertEqual((s.readyCount, s.pagedCount), (0, 0))

    def test_expiriesReadNoFile(self):
        """expiries gives in-memory entries one by one and a paged segment as one inexact triple."""
        s = self.makeStore(budget=2 * COST)
        self.fill(s, 6, ttlMs=1000)
        triples = list(s.expiries())
        self.assertEqual([t[1:] for t in triples], [(1, True), (1, True), (4, False)])
        self.assertEqual(sum(t[1] for t in triples), s.readyCount)

    def test_pagedExpiry(self):
        """A paged segment whose messages expire is reaped unread by the queue: onExpired gets them."""
        s = self.makeStore(budget=2 * COST)
        self.fill(s, 2)
        dead = self.fill(s, 4, start=2, ttlMs=100)
        self.assertEqual(s.pagedCount, 4)
        self.clock.advance(0.1)
        self.assertEqual([e.message.body for e in self.expired], [e.message.body for e in dead])
        self.assertEqual((s.readyCount, s.pagedCount), (2, 0))


class RemovalTests(ReadyStoreTestCase):
    """clear and detachHead take entries out at once."""

    def test_clear(self):
        """clear zeroes the counts at once; the entries are marked GONE over later turns."""
        s = self.makeStore()
        entries = self.fill(s, 30, ttlMs=1000)
        s.clear()
        self.assertEqual((s.readyCount, s.readyBytes, s.pagedCount, s.pagedBytes), (0, 0, 0, 0))
        self.assertIsNone(s.popLive())
        self.clock.advance(0)
        self.assertEqual({e.state for e in entries[:10]}, {GONE})
        self.clock.advance(2)
        self.assertEqual(self.expired, [])

    def test_clearCancelsTimers(self):
        """clear cancels the expiry timer that outlives the last entry taken, so a deleted queue leaves no call."""
        s = self.makeStore()
        self.fill(s, 1, ttlMs=1000)
        s.popLive()
        s.clear()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_detachHead(self):
        """detachHead leaves at most the limit at once and hands over the head in order, paged segments unread."""
        s = self.makeStore()
        self.fill(s, 30)
        work = deque()
        s.detachHead(5, None, work)
        self.assertEqual(s.readyCount, 5)
        taken = []
        for ref, entries, _ in work:
            taken.extend(s.readDetached(ref) if ref is not None else entries)
        taken = [e for e in taken if e.state == READY]
        self.assertEqual([e.message.body for e in taken], [body(i) for i in range(25)])
        self.assertEqual(self.drain(s), [body(i) for i in range(25, 30)])

    def test_detachHeadBytes(self):
        """A byte limit: whole messages leave until the body bytes are within it."""
        s = self.makeStore()
        self.fill(s, 4)
        work = deque()
        s.detachHead(None, 40, work)
        self.assertEqual((s.readyCount, s.readyBytes), (2, 32))
