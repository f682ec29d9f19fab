"""
Deterministic tests (task.Clock) for the two operations bounded per reactor
turn besides dispatch and purge (issue 8 "Fair and bounded delivery"): a
large requeue (Requeuer, REQUEUE_SLICE entries per turn) and a length
limit lowered far below the depth (LengthLimits.enforce, counts at once,
dead-lettering DROP_SLICE messages per turn).
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.broker import limits, paging, queue as queuemod, requeue
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.test.unit.test_paging import PagingTestCase, Taker, body, oneTurn
from otter_tx.testing import FakeClient


def runDue(clock, most=1000):
    """Run turns while some call is due now (at most ``most`` turns, so a test never hangs)."""
    for _ in range(most):
        if not any(c.getTime() <= clock.seconds() for c in clock.getDelayedCalls()):
            return
        oneTurn(clock)
    raise AssertionError("still busy after %d turns" % (most,))


class SlicedTestCase(PagingTestCase):
    def setUp(self):
        PagingTestCase.setUp(self)
        self.patch(requeue, "REQUEUE_SLICE", 10)
        self.patch(limits, "DROP_SLICE", 8)

    def takeAll(self, q):
        """basic.get (ack mode) until empty; the entries, now unacked."""
        return self.drainEntries(q, noAck=False)


class BoundedRequeueTests(SlicedTestCase):
    """A requeue larger than REQUEUE_SLICE is reinserted over several turns."""

    def test_slicedCounts(self):
        """Each turn moves at most REQUEUE_SLICE entries from unacked to ready; the total is always right."""
        q = self.declare("q")
        self.fill("q", 35)
        taken = self.takeAll(q)
        q.requeue(taken)
        seen = []
        for _ in range(100):
            self.assertEqual(q.readyCount + q.unackedCount, 35)
            seen.append(q.readyCount)
            if not self.clock.getDelayedCalls():
                break
            oneTurn(self.clock)
        self.assertEqual(seen, [0, 10, 20, 30, 35])
        self.assertEqual(q.unackedCount, 0)
        got = [(e.message.body, e.redelivered) for e in self.drainEntries(q)]
        self.assertEqual(got, [(body(i), True) for i in range(35)])

    def test_dispatchWaits(self):
        """A consumer gets nothing while a requeue is pending, then everything in seq order, redelivered first."""
        q = self.declare("q")
        self.fill("q", 30)
        taken = [q.basicGet(False) for _ in range(25)]
        q.requeue(taken)
        c = Taker(noAck=False)
        q.addConsumer(c)
        self.publish("q", body(30))
        oneTurn(self.clock)
        self.assertEqual(c.delivered, [])
        for _ in range(5):
            oneTurn(self.clock)
        got = [(e.message.body, e.redelivered) for e in c.delivered]
        self.assertEqual(got, [(body(i), i < 25) for i in range(31)])

    def test_basicGetFinishesRequeue(self):
        """basic.get during a pending requeue returns the earliest message, not a later ready one."""
        q = self.declare("q")
        self.fill("q", 30)
        taken = [q.basicGet(False) for _ in range(25)]
        q.requeue(taken)
        oneTurn(self.clock)
        e = q.basicGet(True)
        self.assertEqual((e.message.body, e.redelivered), (body(0), True))
        self.assertEqual((q.readyCount, q.unackedCount), (29, 0))
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(1, 30)])

    def test_outOfOrderAndInterleaved(self):
        """Entries requeued in any order, interleaved with ready ones, end at their seq positions."""
        q = self.declare("q")
        self.fill("q", 40)
        taken = self.takeAll(q)
        keep = taken[::2]
        back = taken[1::2]
        q.requeue(keep[::-1][:5])  # small requeue: in place at once
        q.requeue(back[7:] + back[:7][::-1])
        q.requeue(keep[::-1][5:])  # joins the pending one
        self.clock.advance(0)
        runDue(self.clock)
        self.assertEqual(q.unackedCount, 0)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(40)])

    def test_expiredWhilePending(self):
        """An entry whose TTL passes while it waits to be reinserted is dead-lettered as expired."""
        dlq = self.declare("dlq")
        q = self.declare("q", **{"x-message-ttl": 1000, "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": "dlq"})
        self.fill("q", 30)
        taken = self.takeAll(q)
        q.requeue(taken)
        oneTurn(self.clock)  # the newest 10 are back (and expire by the index)
        self.clock.advance(1.0)
        runDue(self.clock)
        self.assertEqual((q.readyCount, q.unackedCount), (0, 0))
        self.assertEqual(dlq.readyCount, 30)
        reasons = {e.message.props["headers"]["x-death"][0]["reason"] for e in dlq.readyEntries()}
        self.assertEqual(reasons, {"expired"})

    def test_limitAfterRequeue(self):
        """A length limit is enforced once the requeue is complete: the head (requeued) messages go."""
        q = self.declare("q", **{"x-max-length": 30})
        self.fill("q", 30)
        taken = self.takeAll(q)
        self.fill("q", 5, start=30)
        q.requeue(taken)
        runDue(self.clock)
        self.assertEqual(q.readyCount, 30)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(5, 35)])

    def test_deleteWhilePending(self):
        """Deleting the queue during a pending requeue drops the rest without error."""
        q = self.declare("q")
        self.fill("q", 30)
        taken = self.takeAll(q)
        q.requeue(taken)
        oneTurn(self.clock)
        self.vhost.deleteQueue(q)
        runDue(self.clock)
        self.assertEqual({e.state for e in taken}, {queuemod.GONE})

    def test_smallRequeueAtOnce(self):
        """A requeue of at most REQUEUE_SLICE entries is done within the call (the hot path)."""
        q = self.declare("q")
        self.fill("q", 20)
        taken = [q.basicGet(False) for _ in range(10)]
        q.requeue(taken)
        self.assertEqual((q.readyCount, q.unackedCount), (20, 0))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_channelClose(self):
        """A channel closing with many unacked messages requeues them over turns, in order, redelivered."""
        q = self.declare("q")
        self.fill("q", 45)
        c = Taker(noAck=False)
        q.addConsumer(c)
        runDue(self.clock)
        q.removeConsumer(c)
        q.requeue(list(c.delivered), dispatch=False)
        q.dispatch()
        self.assertEqual((q.readyCount, q.unackedCount), (0, 45))
        oneTurn(self.clock)
        self.assertEqual((q.readyCount, q.unackedCount), (10, 35))
        runDue(self.clock)
        got = [(e.message.body, e.redelivered) for e in self.drainEntries(q)]
        self.assertEqual(got, [(body(i), True) for i in range(45)])


class BoundedLimitTests(SlicedTestCase):
    """A lowered length limit holds at once; dead-lettering goes on a slice per turn."""

    def setUp(self):
        SlicedTestCase.setUp(self)
        self.dlq = self.declare("dlq")

    def deep(self, n):
        q = self.declare("q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.fill("q", n)
        return q

    def test_countsAtOnce(self):
        """Lowering max-length to 5 on 100 messages (90 paged) leaves 5 ready at once, the newest."""
        q = self.deep(100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 5})
        self.assertEqual((q.readyCount, q.readyBytes), (5, 5 * 16))
        self.assertEqual(q.pagedCount + len([e for dq in q.ready._levels for e in dq if e.state == queuemod.READY]), 5)
        self.assertEqual([e.message.body for e in q.readyEntries()], [body(i) for i in range(95, 100)])

    def test_deadLetteredPerTurn(self):
        """The 95 dropped messages are dead-lettered at most DROP_SLICE per turn, in order, reason maxlen."""
        q = self.deep(100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 5})
        counts = [self.dlq.readyCount]
        for _ in range(100):
            if q.limits._dropCall is None:
                break
            oneTurn(self.clock)
            counts.append(self.dlq.readyCount)
        self.assertEqual(counts[0], 0)  # none within the call
        self.assertTrue(all(b - a <= 8 for a, b in zip(counts, counts[1:])), counts)
        self.assertEqual(counts[-1], 95)
        entries = list(self.dlq.readyEntries())
        self.assertEqual([e.message.body for e in entries], [body(i) for i in range(95)])
        reasons = {e.message.props["headers"]["x-death"][0]["reason"] for e in entries}
        self.assertEqual(reasons, {"maxlen"})
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(95, 100)])

    def test_maxLengthBytes(self):
        """Lowering max-length-bytes holds at once by bytes; the dropped are dead-lettered over turns."""
        q = self.deep(100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length-bytes": 16 * 7})
        self.assertEqual((q.readyCount, q.readyBytes), (7, 16 * 7))
        runDue(self.clock)
        self.assertEqual(self.dlq.readyCount, 93)
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(93, 100)])

    def test_publishDuringDrain(self):
        """Messages dropped by later publishes are dead-lettered after the pending ones, keeping order."""
        q = self.deep(100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 5})
        self.fill("q", 3, start=100)
        self.assertEqual(q.readyCount, 5)
        runDue(self.clock)
        self.assertEqual([e.message.body for e in self.dlq.readyEntries()], [body(i) for i in range(98)])
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(98, 103)])

    def test_filesRemoved(self):
        """The detached segment files are removed as they are dead-lettered."""
        self.deep(100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 5})
        runDue(self.clock)
        # what is left paged belongs to the dead-letter queue alone
        qfiles = [f for f in self.files()]
        dlqPaged = self.dlq.pagedCount
        self.assertLessEqual(len(qfiles), dlqPaged // paging.SEGMENT_COUNT + 1)

    def test_deleteDuringDrain(self):
        """Deleting the queue while its dropped messages are dead-lettered finishes without error."""
        q = self.deep(100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 5})
        oneTurn(self.clock)
        self.vhost.deleteQueue(q)
        runDue(self.clock)
        self.assertEqual(q.readyCount, 0)
        self.assertLessEqual(self.dlq.readyCount, 95)

    def test_stopFinishes(self):
        """A broker stop finishes the pending dead-lettering at once."""
        q = self.deep(100)
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 5})
        q.stopTimers()
        self.assertEqual(self.dlq.readyCount, 95)


class RequeueThenLimitTests(SlicedTestCase):
    """A limit lowered after a big requeue filled memory detaches the in-memory part at once."""

    def test_detachInMemory(self):
        """The requeued (in-memory) head is dropped by counts at once and dead-lettered in order, holes skipped."""
        dlq = self.declare("dlq")
        q = self.declare("q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq",
                                 "x-message-ttl": 5000})
        self.fill("q", 60)
        taken = self.takeAll(q)
        self.fill("q", 40, start=60)  # 10 in memory, 30 paged
        q.requeue(taken)
        runDue(self.clock)
        self.assertEqual(q.readyCount - q.pagedCount, 70)
        # a hole: one requeued message expires early by the index
        q.ready._expiry.remove(taken[3])
        taken[3].expiresAt = self.clock.seconds() * 1000
        q.ready._expiry.add(taken[3], taken[3].expiresAt)
        self.clock.advance(0.001)
        self.assertEqual((q.readyCount, dlq.readyCount), (99, 1))
        head = q.ready._levels[0]
        self.broker.setPolicy("/", "short", "^q$", {"max-length": 25})
        self.assertIsNot(q.ready._levels[0], head)  # detached whole, not popped one by one
        self.assertEqual((q.readyCount, q.readyBytes), (25, 25 * 16))
        runDue(self.clock)
        bodies = [e.message.body for e in dlq.readyEntries()]
        self.assertEqual(bodies, [body(3)] + [body(i) for i in range(75) if i != 3])
        self.assertEqual(self.drainBodies(q), [body(i) for i in range(75, 100)])


class ChannelRequeueTests(SynchronousTestCase):
    """A channel closing or recovering with many unacked deliveries hands them back a slice per turn."""

    def setUp(self):
        self.patch(requeue, "REQUEUE_SLICE", 10)
        self.patch(queuemod, "REQUEUE_SLICE", 10)  # the Session's feeder reads it there
        self.clock = Clock()
        self.broker = Broker(self.clock, memoryHighWatermark=None, queueMemoryBudget=2 ** 40)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0, handshakeTimeout=10)
        self.vhost = self.broker.vhosts["/"]
        self.q = self.vhost.declareQueue("q", None)
        for i in range(45):
            self.vhost.publish(self.vhost.exchanges[""], Message("", "q", b"\x00\x00", body(i)))
        self.c = FakeClient(self.factory)
        self.c.openChannel(1)
        self.c.send(1, spec.BasicConsume(0, "q", "t", False, False, False, False, {}))
        runDue(self.clock)
        self.assertEqual(self.q.unackedCount, 45)

    def test_closeSliced(self):
        """Channel close moves at most REQUEUE_SLICE unacked to ready per turn; another consumer waits, then gets all in order."""
        other = FakeClient(self.factory)
        other.openChannel(1)
        other.send(1, spec.BasicConsume(0, "q", "t2", True, False, False, False, {}))
        self.c.send(1, spec.ChannelClose(200, "bye", 0, 0))
        counts = []
        for _ in range(20):
            counts.append((self.q.readyCount, self.q.unackedCount))
            if not self.q.requeuer.feeders and self.q.requeuer.pending is None:
                break
            self.assertFalse([m for _, m, _ in other.received() if isinstance(m, spec.BasicDeliver)])
            oneTurn(self.clock)
        self.assertEqual(counts[0], (0, 45))
        self.assertEqual({r + u for r, u in counts}, {45})
        # before the last turn (where the other consumer takes them all) ready grows 10 at most per turn
        steps = [r for r, _ in counts[:-1]]
        self.assertGreater(len(steps), 4)
        self.assertTrue(all(0 <= b - a <= 10 for a, b in zip(steps, steps[1:])), counts)
        runDue(self.clock)
        got = [(m.redelivered, m.delivery_tag) for _, m, _ in other.received() if isinstance(m, spec.BasicDeliver)]
        self.assertEqual(got, [(True, i) for i in range(1, 46)])

    def test_closeOrder(self):
        """After a sliced close the queue holds the messages in publish order, all redelivered."""
        self.c.send(1, spec.ChannelClose(200, "bye", 0, 0))
        runDue(self.clock)
        got = []
        while True:
            e = self.q.basicGet(True)
            if e is None:
                break
            got.append((e.message.body, e.redelivered))
        self.assertEqual(got, [(body(i), True) for i in range(45)])

    def test_basicGetDuringFeed(self):
        """basic.get while the channel is still handing entries back returns the first message."""
        self.c.send(1, spec.ChannelClose(200, "bye", 0, 0))
        oneTurn(self.clock)
        e = self.q.basicGet(True)
        self.assertEqual((e.message.body, e.redelivered), (body(0), True))
        self.assertEqual((self.q.readyCount, self.q.unackedCount), (44, 0))

    def test_recoverSliced(self):
        """basic.recover with many unacked redelivers them all, in order, redelivered, after the feed."""
        self.c.transport.clear()
        self.c.send(1, spec.BasicRecover(True))
        oneTurn(self.clock)
        self.assertEqual(self.q.unackedCount + self.q.readyCount, 45)
        runDue(self.clock)
        got = [(m.redelivered, m.delivery_tag) for _, m, _ in self.c.received() if isinstance(m, spec.BasicDeliver)]
        self.assertEqual(got, [(True, i) for i in range(46, 91)])
        self.assertEqual(self.q.unackedCount, 45)
