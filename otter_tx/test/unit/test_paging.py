"""
Deterministic tests (task.Clock) for queues larger than memory
(otter_tx.broker.paging) and for fair, bounded delivery (Queue.dispatch per
turn, the connection's write high-water mark in otter_tx.door.protocol).
"""

import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from otter_tx.amqp import spec
from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker import paging, queue as queuemod, readystore
from otter_tx.broker.broker import Broker
from otter_tx.broker.interfaces import IConsumer
from otter_tx.broker.message import Message
from otter_tx.door.protocol import WRITE_HIGH_WATER, AMQPServerFactory
from otter_tx.store.memory import MemoryStore
from otter_tx.test.unit.test_ttl_dlx import BrokerTestCase
from otter_tx.testing import FakeClient, journaledBroker

#: what one 16-byte message costs against the budget
COST = 16 + paging.ENTRY_OVERHEAD


@implementer(IConsumer)
class Taker:
    """A consumer that always has room (up to ``limit`` deliveries) and records deliveries."""

    def __init__(self, noAck=True, limit=None):
        self.tag = "taker"
        self.noAck = noAck
        self.priority = 0
        self.prefetch = 0
        self.arguments = None
        self.limit = limit
        self.delivered = []

    def canTake(self):
        return self.limit is None or len(self.delivered) < self.limit

    def deliver(self, queue, entry):
        self.delivered.append(entry)

    def cancelledByBroker(self, queue):
        pass


def oneTurn(clock):
    """
    Run the calls due now, as one reactor turn does: calls they schedule
    wait for the next turn (``Clock.advance`` would run them at once).
    """
    due = [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]
    for c in due:
        if c.active():
            clock.calls.remove(c)
            c.called = 1
            c.func(*c.args, **c.kw)


def body(i):
    """A 16-byte body numbered ``i``."""
    return b"%016d" % (i,)


class PagingTestCase(BrokerTestCase):
    threaded = False

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.dir = self.mktemp()
        # ten 16 B messages in memory, segments of four, written inline
        self.patch(paging, "SEGMENT_COUNT", 4)
        self.patch(paging.PagingDirectory, "threaded", True if self.threaded else False)
        self.broker = Broker(self.clock, queueMemoryBudget=10 * COST, pagingDirectory=self.dir)
        self.vhost = self.broker.vhosts["/"]

    def fill(self, rk, n, start=0, **props):
        for i in range(start, start + n):
            self.publish(rk, body(i), **props)

    def drainEntries(self, q, noAck=True):
        """basic.get (no-ack unless told) until empty; the entries."""
        out = []
        while True:
            e = q.basicGet(noAck)
            if e is None:
                return out
            out.append(e)

    def drainBodies(self, q):
        return [e.message.body for e in self.drainEntries(q)]

    def inMemory(self, q):
        return q.readyCount - q.pagedCount

    def files(self):
        out = []
        for root, _, names in os.walk(self.dir):
            out.extend(os.path.join(root, n) for n in names)
        return out


class PagingOrderTests(PagingTestCase):
    """Messages beyond the budget go to disk and come back in order."""

    def test_pagedBeyondBudget(self):
        """100 messages with a 10-message budget: 10 in memory, 90 paged, counts include the paged ones."""
        q = self.declare("q")
        self.fill("q", 100)
        self.assertEqual(self.inMemory(q), 10)
        self.assertEqual(q.pagedCount, 90)
        self.assertEqual(q.readyCount, 100)
        self.assertEqual(q.readyBytes, 1600)
        self.assertEqual(q.pagedBytes, 90 * 16)
        self.assertEqual(q.readyCount, 100)
        # 90 paged = 22 closed segments of 4 (files) + an open one of 2
        self.assertEqual(len(self.files()), 22)

    def test_order(self):
        """basic.get returns every message in publish order across memory and disk; files are gone after."""
        q = self.declare("q")
        self.fill("q", 100)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(100)])
        self.assertEqual((q.readyCount, q.readyBytes, q.pagedCount, q.pagedBytes), (0, 0, 0, 0))
        self.assertEqual(self.files(), [])

    def test_memoryBoundedWhileDraining(self):
        """While 1,000 messages drain, memory never holds more than the budget's worth plus one segment."""
        q = self.declare("q")
        self.fill("q", 1000)
        worst = 0
        got = []
        while q.readyCount:
            got.append(q.basicGet(True).message.body)
            worst = max(worst, self.inMemory(q))
        self.assertEqual(got, [body(i) for i in range(1000)])
        self.assertLessEqual(worst, 10 + paging.SEGMENT_COUNT)

    def test_refillAheadOfNeed(self):
        """The head is refilled before it runs dry: once a segment fits again it is read back."""
        self.patch(readystore, "REFILL_EVERY", 1)
        q = self.declare("q")
        self.fill("q", 100)
        self.assertEqual(self.inMemory(q), 10)
        for _ in range(4):
            q.basicGet(True)
        # 6 left in memory, room for a segment of 4: it was read back
        self.assertEqual(self.inMemory(q), 10)
        self.assertEqual(q.readyCount, 96)

    def test_refillLooksEveryFewMessages(self):
        """With REFILL_EVERY at 3, the head is topped up on every third message taken, not each one."""
        self.patch(readystore, "REFILL_EVERY", 3)
        q = self.declare("q")
        self.fill("q", 100)
        sizes = []
        for _ in range(6):
            q.basicGet(True)
            sizes.append(self.inMemory(q))
        # a segment (4) fits once 6 or fewer are in memory; looked at after the 3rd and 6th get
        self.assertEqual(sizes, [9, 8, 7, 6, 5, 8])

    def test_interleavedPublishAndGet(self):
        """Publishing while draining keeps FIFO order with paging on and off."""
        q = self.declare("q")
        got = []
        n = 0
        for rnd in range(20):
            self.fill("q", 37, start=n)
            n += 37
            for _ in range(23):
                got.append(q.basicGet(True).message.body)
        got.extend(self.drainBodies(q))
        self.assertEqual(got, [body(i) for i in range(n)])

    def test_properties(self):
        """A paged message keeps exchange, routing key, properties, body and persistence."""
        q = self.declare("q")
        self.fill("q", 20)
        self.publish("q", b"last", delivery_mode=2, headers={"a": 1}, message_id="m")
        self.assertEqual(q.pagedCount, 11)
        m = self.drainEntries(q)[-1].message
        self.assertEqual((m.exchange, m.routingKey, m.body), ("", "q", b"last"))
        self.assertEqual(m.props["headers"], {"a": 1})
        self.assertEqual(m.props["message_id"], "m")
        self.assertTrue(m.persistent)

    def test_consumerDrainsInOrder(self):
        """A consumer gets a paged queue in order, a bounded number per turn."""
        q = self.declare("q")
        self.fill("q", 1000)
        c = Taker()
        q.addConsumer(c)
        self.assertEqual(len(c.delivered), queuemod.DISPATCH_MESSAGES)
        while q.readyCount:
            self.clock.advance(0)
        self.assertEqual([e.message.body for e in c.delivered], [body(i) for i in range(1000)])

    def test_zeroBudget(self):
        """A zero budget keeps one message in memory and pages the rest."""
        self.broker.queueMemoryBudget = 0
        q = self.declare("z")
        self.fill("z", 10)
        self.assertEqual(self.inMemory(q), 1)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(10)])


class PagingPriorityTests(PagingTestCase):
    """Priority queues page per level."""

    def test_levels(self):
        """Higher priorities come first, FIFO within a level, with every level paged."""
        q = self.declare("p", **{"x-max-priority": 2})
        expected = {0: [], 1: [], 2: []}
        for i in range(90):
            p = i % 3
            self.publish("p", body(i), priority=p)
            expected[p].append(body(i))
        self.assertGreater(q.pagedCount, 0)
        self.assertEqual(self.drainBodies(q), expected[2] + expected[1] + expected[0])

    def test_highPriorityWhileLowPaged(self):
        """A high-priority message published after a paged backlog of low ones is delivered first."""
        q = self.declare("p", **{"x-max-priority": 5})
        self.fill("p", 50)
        self.publish("p", b"urgent", priority=5)
        self.assertEqual(q.basicGet(True).message.body, b"urgent")
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(50)])


class PagingTTLTests(PagingTestCase):
    """Message TTL is honoured promptly for paged messages."""

    def test_pagedExpiryReaped(self):
        """Paged messages with a short per-message TTL are dead-lettered at their deadline, not when paged in."""
        dlq = self.declare("dlq")
        q = self.declare("q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.fill("q", 20)  # no TTL, fills memory and starts paging
        self.fill("q", 20, start=20, expiration="500")
        self.fill("q", 20, start=40)
        self.assertEqual(q.readyCount, 60)
        self.clock.advance(0.499)
        self.assertEqual(q.readyCount, 60)
        self.clock.advance(0.001)
        self.assertEqual(q.readyCount, 40)
        self.assertEqual(dlq.readyCount, 20)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(20)] + [body(i) for i in range(40, 60)])
        self.assertEqual(sorted(self.drainBodies(dlq)), [body(i) for i in range(20, 40)])

    def test_queueTTLWholeSegments(self):
        """With x-message-ttl every paged segment expires on time and its file is removed."""
        q = self.declare("q", **{"x-message-ttl": 1000})
        self.fill("q", 100)
        self.assertEqual(q.readyCount, 100)
        self.clock.advance(1)
        self.assertEqual((q.readyCount, q.readyBytes, q.pagedCount), (0, 0, 0))
        self.assertEqual(self.files(), [])

    def test_partialSegment(self):
        """A segment with some expired messages keeps the others, in order, with exact counts."""
        q = self.declare("q")
        self.fill("q", 10)
        for i in range(10, 30):
            if i % 2:
                self.publish("q", body(i), expiration="100")
            else:
                self.publish("q", body(i))
        self.clock.advance(0.1)
        self.assertEqual(q.readyCount, 20)
        self.assertEqual(q.readyBytes, 320)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(10)] + [body(i) for i in range(10, 30, 2)])


class PagingLimitTests(PagingTestCase):
    """x-max-length / -bytes with every x-overflow over paged queues."""

    def test_dropHead(self):
        """drop-head keeps the newest messages in order when most of them are paged."""
        dlq = self.declare("dlq")
        q = self.declare("q", **{"x-max-length": 50, "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": "dlq"})
        self.fill("q", 120)
        self.assertEqual(q.readyCount, 50)
        self.assertEqual(dlq.readyCount, 70)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(70, 120)])

    def test_maxLengthBytes(self):
        """x-max-length-bytes counts paged bytes."""
        q = self.declare("q", **{"x-max-length-bytes": 16 * 40})
        self.fill("q", 100)
        self.assertEqual(q.readyBytes, 16 * 40)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(60, 100)])

    def test_rejectPublish(self):
        """reject-publish refuses beyond a limit that counts paged messages."""
        q = self.declare("q", **{"x-max-length": 30, "x-overflow": "reject-publish"})
        self.fill("q", 40)
        self.assertEqual(q.readyCount, 30)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(30)])

    def test_rejectPublishDlx(self):
        """reject-publish-dlx dead-letters the refused messages; the paged ones stay."""
        dlq = self.declare("dlq")
        q = self.declare("q", **{"x-max-length": 30, "x-overflow": "reject-publish-dlx",
                                 "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.fill("q", 40)
        self.assertEqual((q.readyCount, dlq.readyCount), (30, 10))
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(30)])

    def test_lowerLimitByPolicy(self):
        """A policy lowering max-length drops the head, paging in as needed."""
        q = self.declare("q")
        self.fill("q", 100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 5})
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(95, 100)])


class PagingRequeueTests(PagingTestCase):
    """Requeued messages go back before the paged tail."""

    def test_requeue(self):
        """Taken and requeued messages come back first, redelivered, then the paged rest in order."""
        q = self.declare("q")
        self.fill("q", 100)
        taken = [q.basicGet(False) for _ in range(15)]
        self.assertEqual(q.readyCount, 85)
        q.requeue(taken)
        got = [(e.message.body, e.redelivered) for e in self.drainEntries(q)]
        self.assertEqual(got, [(body(i), i < 15) for i in range(100)])


class PagingPurgeDeleteTests(PagingTestCase):
    """Purge and delete answer at once and free memory and files over later turns."""

    def test_purge(self):
        """purge returns the full count, counts are zero at once, files go on later turns."""
        q = self.declare("q")
        self.fill("q", 100)
        self.assertNotEqual(self.files(), [])
        self.assertEqual(q.purge(), 100)
        self.assertEqual((q.readyCount, q.readyBytes, q.pagedCount, q.pagedBytes), (0, 0, 0, 0))
        while self.broker.freer.pending():
            self.clock.advance(0)
        self.assertEqual(self.files(), [])
        self.fill("q", 30, start=500)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(500, 530)])

    def test_purgeIncremental(self):
        """A purge of many in-memory entries is freed a slice per turn, not in one go."""
        self.broker.queueMemoryBudget = 2 ** 40
        self.patch(self.broker.freer, "perTurn", 100)
        q = self.declare("big")
        self.fill("big", 1000)
        entries = list(q.readyEntries())
        self.assertEqual(q.purge(), 1000)
        oneTurn(self.clock)
        self.assertEqual(sum(1 for e in entries if e.state == queuemod.GONE), 100)
        while self.broker.freer.pending():
            self.clock.advance(0)
        self.assertTrue(all(e.state == queuemod.GONE for e in entries))

    def test_purgePaged_TTL(self):
        """After a purge, paged TTL timers are gone: nothing expires into the DLX."""
        dlq = self.declare("dlq")
        q = self.declare("q", **{"x-message-ttl": 100, "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": "dlq"})
        self.fill("q", 50)
        q.purge()
        self.clock.advance(1)
        self.assertEqual(dlq.readyCount, 0)

    def test_delete(self):
        """Deleting a paged queue reports its count and removes its files."""
        q = self.declare("q")
        self.fill("q", 100)
        self.assertEqual(self.vhost.deleteQueue(q), 100)
        while self.broker.freer.pending():
            self.clock.advance(0)
        self.assertEqual(self.files(), [])

    def test_queueExpiry(self):
        """x-expires deletes a paged queue and its files."""
        self.declare("q", **{"x-expires": 1000})
        self.fill("q", 100)
        self.clock.advance(1)
        self.assertNotIn("q", self.vhost.queues)
        while self.broker.freer.pending():
            self.clock.advance(0)
        self.assertEqual(self.files(), [])

    def test_purgeJournal(self):
        """Purging a durable paged queue removes its persistent messages from the store, paged ones too."""
        store = MemoryStore()
        broker = journaledBroker(store, self.clock, queueMemoryBudget=10 * COST,
                                 pagingDirectory=self.mktemp())
        vh = broker.vhosts["/"]
        q = vh.declareQueue("d", None, durable=True)
        for i in range(50):
            vh.publish(vh.exchanges[""], Message("", "d", encodeProperties({"delivery_mode": 2}), body(i)))
        self.assertGreater(q.pagedCount, 0)
        self.assertEqual(q.purge(), 50)
        store.close()
        rebuilt = journaledBroker(store, self.clock)
        self.assertEqual(rebuilt.vhosts["/"].queues["d"].readyCount, 0)


class PagingRecoveryTests(PagingTestCase):
    """Recovery pages beyond the budget."""

    def test_restorePages(self):
        """Queue.restore beyond the budget pages, keeping seq order and redelivered flags."""
        q = self.declare("r")
        for i in range(100):
            q.restore(Message("", "r", b"\x00\x00", body(i)), i + 1, None, i % 2 == 0)
        self.assertEqual(self.inMemory(q), 10)
        self.assertEqual(q.pagedCount, 90)
        got = [(e.message.body, e.redelivered) for e in self.drainEntries(q)]
        self.assertEqual(got, [(body(i), i % 2 == 0) for i in range(100)])

    def test_recoverDurableQueue(self):
        """A durable queue of persistent messages rebuilt from the store is paged and drains in order."""
        store = MemoryStore()
        broker = journaledBroker(store, self.clock)
        vh = broker.vhosts["/"]
        vh.declareQueue("d", None, durable=True)
        for i in range(100):
            vh.publish(vh.exchanges[""], Message("", "d", encodeProperties({"delivery_mode": 2}), body(i)))
        store.close()
        rebuilt = journaledBroker(store, self.clock, queueMemoryBudget=10 * COST,
                                  pagingDirectory=self.mktemp())
        q = rebuilt.vhosts["/"].queues["d"]
        self.assertEqual(q.readyCount, 100)
        self.assertEqual(q.pagedCount, 90)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(100)])


class BoundedDispatchTests(PagingTestCase):
    """Dispatch is bounded per reactor turn and continues on later turns."""

    def setUp(self):
        PagingTestCase.setUp(self)
        self.broker.queueMemoryBudget = 2 ** 40

    def test_boundedByCount(self):
        """One dispatch hands out DISPATCH_MESSAGES, the rest follow one turn at a time."""
        q = self.declare("q")
        self.fill("q", 1000)
        c = Taker()
        q.addConsumer(c)
        self.assertEqual(len(c.delivered), queuemod.DISPATCH_MESSAGES)
        oneTurn(self.clock)
        self.assertEqual(len(c.delivered), 2 * queuemod.DISPATCH_MESSAGES)
        while q.readyCount:
            self.clock.advance(0)
        self.assertEqual([e.message.body for e in c.delivered], [body(i) for i in range(1000)])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_boundedByBytes(self):
        """One dispatch stops once DISPATCH_BYTES of bodies went out."""
        q = self.declare("q")
        big = b"x" * (256 * 1024)
        for _ in range(10):
            self.publish("q", big)
        c = Taker()
        q.addConsumer(c)
        self.assertEqual(len(c.delivered), queuemod.DISPATCH_BYTES // len(big))

    def test_fairAcrossQueues(self):
        """Two deep queues with eager consumers alternate turns instead of one draining first."""
        a, b = self.declare("a"), self.declare("b")
        self.fill("a", 1000)
        self.fill("b", 1000)
        ca, cb = Taker(), Taker()
        a.addConsumer(ca)
        b.addConsumer(cb)
        oneTurn(self.clock)
        self.assertEqual(len(ca.delivered), 2 * queuemod.DISPATCH_MESSAGES)
        self.assertEqual(len(cb.delivered), 2 * queuemod.DISPATCH_MESSAGES)

    def test_deleteCancelsContinuation(self):
        """Deleting a queue mid-drain leaves no dispatch timer behind."""
        q = self.declare("q")
        self.fill("q", 1000)
        q.addConsumer(Taker())
        self.vhost.deleteQueue(q)
        while self.broker.freer.pending():
            self.clock.advance(0)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class WriteBackPressureTests(SynchronousTestCase):
    """No-ack consumers respect the connection's write buffer."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock, memoryHighWatermark=None, queueMemoryBudget=2 ** 40)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0, handshakeTimeout=10)
        self.vhost = self.broker.vhosts["/"]
        self.q = self.vhost.declareQueue("deep", None)
        for i in range(5000):
            self.vhost.publish(self.vhost.exchanges[""], Message("", "deep", b"\x00\x00", b"y" * 1000))
        self.c = FakeClient(self.factory)
        self.c.openChannel(1)

    def consume(self):
        self.c.send(1, spec.BasicConsume(0, "deep", "t", False, True, False, False, {}))

    def test_batchBounded(self):
        """A no-ack consume of a deep queue writes about WRITE_HIGH_WATER bytes in its turn, not the queue."""
        self.consume()
        written = len(self.c.transport.value())
        self.assertLessEqual(written, WRITE_HIGH_WATER + 2000)
        self.assertGreater(self.q.readyCount, 4000)

    def test_resumesOnLaterTurns(self):
        """Delivery continues turn by turn and every message arrives, in order and counted."""
        self.consume()
        while self.q.readyCount:
            self.clock.advance(0)
        delivers = [m for _, m, _ in self.c.received() if isinstance(m, spec.BasicDeliver)]
        self.assertEqual(len(delivers), 5000)
        self.assertEqual([m.delivery_tag for m in delivers], list(range(1, 5001)))

    def test_transportPause(self):
        """While the transport has paused the connection nothing is delivered; resuming continues."""
        self.consume()
        oneTurn(self.clock)
        self.c.protocol.pauseProducing()
        self.c.transport.clear()
        left = self.q.readyCount
        for _ in range(5):
            self.clock.advance(0)
        self.assertEqual(self.q.readyCount, left)
        self.assertEqual(self.c.transport.value(), b"")
        self.c.protocol.resumeProducing()
        self.assertLess(self.q.readyCount, left)

    def test_pausedStaysPausedAfterBatch(self):
        """A batch that filled the socket does not resume delivery until the transport drains."""
        self.consume()
        self.c.protocol.pauseProducing()  # the flush filled the socket buffer
        left = self.q.readyCount
        for _ in range(5):
            self.clock.advance(0)
        self.assertEqual(self.q.readyCount, left)
        self.c.protocol.resumeProducing()
        self.assertLess(self.q.readyCount, left)


class PagingManagementTests(PagingTestCase):
    """Management's queue view counts paged messages without reading them."""

    def test_queueDict(self):
        """messages_ready counts every message; *_paged_out and *_ram split them; persistent counts include paged."""
        from otter_tx.web._format import queueDict

        q = self.declare("q")
        self.fill("q", 30)
        self.fill("q", 20, start=30, delivery_mode=2)
        self.assertEqual(q.ready.persistent(), (20, 320))
        d = queueDict(q, detail=True)
        self.assertEqual(d["messages_ready"], 50)
        self.assertEqual(d["message_bytes_ready"], 800)
        self.assertEqual(d["messages_paged_out"], 40)
        self.assertEqual(d["message_bytes_paged_out"], 640)
        self.assertEqual(d["messages_ready_ram"], 10)
        self.assertEqual((d["messages_persistent"], d["message_bytes_persistent"]), (20, 320))
        q.basicGet(True)
        self.assertEqual(q.ready.persistent(), (20, 320))
        self.drainEntries(q)
        self.assertEqual(q.ready.persistent(), (0, 0))


class PagingPurgeUnackedTests(PagingTestCase):
    """Purging a durable queue keeps its unacknowledged persistent messages in the store."""

    def test_purgeWithUnacked(self):
        """An unacked persistent message survives a purge of the ready ones and comes back after a restart."""
        store = MemoryStore()
        broker = journaledBroker(store, self.clock, queueMemoryBudget=10 * COST,
                                 pagingDirectory=self.mktemp())
        vh = broker.vhosts["/"]
        q = vh.declareQueue("d", None, durable=True)
        for i in range(50):
            vh.publish(vh.exchanges[""], Message("", "d", encodeProperties({"delivery_mode": 2}), body(i)))
        held = q.basicGet(False)
        self.assertEqual(q.purge(), 49)
        store.close()
        rebuilt = journaledBroker(store, self.clock)
        self.assertEqual([m.body for m in self.drain(rebuilt.vhosts["/"].queues["d"])], [held.message.body])


class ThreadedWriterTests(PagingTestCase):
    """Segment files are written by the writer thread; entries stay readable meanwhile."""

    threaded = True

    def test_orderWithWriterThread(self):
        """With the writer thread, paged messages come back in order and every file is removed."""
        q = self.declare("q")
        self.fill("q", 200)
        # readable before and after the writer is done
        self.assertEqual(q.basicGet(True).message.body, body(0))
        self.broker.paging.flush()
        self.assertEqual(len(self.files()), q.pagedCount // 4)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(1, 200)])
        self.broker.paging.flush()
        self.assertEqual(self.files(), [])

    def test_purgeWhileWriting(self):
        """Files still being written when a purge comes are removed by the writer."""
        q = self.declare("q")
        self.fill("q", 200)
        q.purge()
        self.broker.paging.flush()
        while self.broker.freer.pending():
            self.clock.advance(0)
        self.assertEqual(self.files(), [])

    def test_failedWriteKeepsEntries(self):
        """A segment whose file cannot be written keeps its entries in memory and loses nothing."""
        q = self.declare("q")
        self.fill("q", 10)
        real = paging.writeSegmentFile

        def failing(sfile, data):
            sfile.path = os.path.join(self.mktemp(), "missing", "x.seg")
            real(sfile, data)

        self.patch(paging, "writeSegmentFile", failing)
        self.fill("q", 20, start=10)
        self.broker.paging.flush()
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(30)])


class PagedMessageTests(PagingTestCase):
    """Messages read back from segments decode their properties lazily and keep every field."""

    def test_fields(self):
        """ttl, priority, persistence, ids and the property bytes survive a round trip through a segment."""
        q = self.declare("q", **{"x-max-priority": 9})
        self.fill("q", 10, priority=0)
        self.fill("q", 10, start=10, priority=3)
        self.publish("q", b"p", priority=3, expiration="60000", delivery_mode=2,
                     headers={"h": "v"}, timestamp=5)
        self.fill("q", 4, start=20, priority=3)  # closes the segment holding it
        original = [e.message for e in q.readyEntries()][0]
        self.assertIsNot(type(original), paging.PagedMessage)
        self.assertGreater(q.pagedCount, 0)
        self.broker.paging.flush()
        entries = self.drainEntries(q)
        [m] = [e.message for e in entries if e.message.body == b"p"]
        self.assertIsInstance(m, paging.PagedMessage)
        self.assertEqual((m.ttl, m.priority, m.persistent, m.exchange, m.routingKey, m.size),
                         (60000, 3, True, "", "q", 1))
        self.assertIsNone(paging._propsSlot.__get__(m, Message))
        self.assertEqual(m.props["headers"], {"h": "v"})
        self.assertEqual(m.headers, {"h": "v"})
        self.assertEqual(m.addressBytes(), b"\x00\x01q")
        m.props = {"x": 1}
        self.assertEqual(m.props, {"x": 1})


class WriterBoundTests(PagingTestCase):
    """The writer thread's backlog is bounded."""

    threaded = True

    def test_writerBehindWritesInline(self):
        """When the writer thread has maxQueued writes waiting, segments are written inline: memory stays bounded."""
        self.patch(paging.PagingDirectory, "maxQueued", 0)
        q = self.declare("q")
        self.fill("q", 100)
        self.assertEqual(self.broker.paging.inlineWrites, 22)
        self.assertEqual(len(self.files()), 22)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(100)])


class PagedDeadLetterTests(PagingTestCase):
    """Dead-lettering a message read back from a segment."""

    def test_deadLetterKeepsHeaders(self):
        """A paged message rejected to a DLX keeps its headers and gets x-death, decoded on demand."""
        dlq = self.declare("dlq")
        q = self.declare("q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.fill("q", 10)
        self.publish("q", b"h", headers={"keep": "me"})
        self.fill("q", 4, start=10)  # closes the segment holding it
        got = None
        while got is None or got.message.body != b"h":
            got = q.basicGet(False)
        self.assertIsInstance(got.message, paging.PagedMessage)
        q.reject([got])
        [e] = [e for e in dlq.readyEntries()]
        headers = e.message.props["headers"]
        self.assertEqual(headers["keep"], "me")
        self.assertEqual(headers["x-death"][0]["reason"], "rejected")
        self.assertEqual(e.message.body, b"h")
