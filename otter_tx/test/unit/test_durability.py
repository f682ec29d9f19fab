"""
Deterministic journal tests on a MemoryStore and task.Clock: what a restart
recovers, waiting for the disk, purges.  The restarts of the real broker
(SQLite store, real reactor) are in ``otter_tx.test.e2e.test_restart``.
"""

import json

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import TaggedInt, encodeProperties
from otter_tx.broker.message import Message
from otter_tx.store.memory import MemoryStore
from otter_tx.testing import journaledBroker


class JournalTests(SynchronousTestCase):
    """The journal on a MemoryStore with a task.Clock: deterministic restarts."""

    def boot(self, store, clock):
        return journaledBroker(store, clock)

    def publish(self, vh, rk, body, **props):
        props.setdefault("delivery_mode", 2)
        m = Message("", rk, encodeProperties(props), body)
        return vh.publish(vh.exchanges[""], m)

    def restart(self, store, clock, broker):
        broker.stop()
        self.successResultOf(store.close())
        return self.boot(store, clock)

    def test_ttlKeepsRunningAcrossRestart(self):
        """A message's expiry deadline is absolute: 300 ms left before the restart means 300 ms after."""
        clock = Clock()
        clock.advance(1000)
        store = MemoryStore()
        b = self.boot(store, clock)
        vh = b.vhosts["/"]
        vh.declareQueue("q", None, durable=True, arguments={"x-message-ttl": TaggedInt(1000, "l")})
        self.publish(vh, "q", b"m")
        clock.advance(0.7)
        b = self.restart(store, clock, b)
        q = b.vhosts["/"].queues["q"]
        self.assertEqual(q.readyCount, 1)
        clock.advance(0.29)
        self.assertEqual(q.readyCount, 1)
        clock.advance(0.01)
        self.assertEqual(q.readyCount, 0)

    def test_expiredDuringDowntimeIsDeadLettered(self):
        """A message whose deadline passed while the broker was down expires (and is dead-lettered) at boot."""
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        vh = b.vhosts["/"]
        vh.declareQueue("dlq", None, durable=True)
        vh.declareQueue("q", None, durable=True,
                        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.publish(vh, "q", b"m", expiration="100")
        b.stop()
        self.successResultOf(store.close())
        clock.advance(5)
        b = self.boot(store, clock)
        clock.advance(0)
        vh = b.vhosts["/"]
        self.assertEqual(vh.queues["q"].readyCount, 0)
        (e,) = list(vh.queues["dlq"].readyEntries())
        self.assertEqual(e.message.headers["x-death"][0]["reason"], "expired")

    def test_expiresLeaseRestartsAtBoot(self):
        """A durable queue's x-expires lease starts again at boot."""
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        b.vhosts["/"].declareQueue("q", None, durable=True, arguments={"x-expires": 1000})
        clock.advance(0.9)
        b = self.restart(store, clock, b)
        clock.advance(0.9)
        self.assertIn("q", b.vhosts["/"].queues)
        clock.advance(0.1)
        self.assertNotIn("q", b.vhosts["/"].queues)

    def test_journalAttachedOnDeclareAndRestore(self):
        """Durable queues and delayed exchanges get the journal when declared, restored, or present at attach; transient ones never."""
        from otter_tx.broker.broker import Broker

        clock = Clock()
        store = MemoryStore()
        b = Broker(clock)
        early = b.vhosts["/"].declareQueue("early", None, durable=True)
        self.assertIsNone(early.journal)
        journal = b.attachJournal(store, self.successResultOf(store.open()))
        self.assertIs(b.journal, journal)
        self.assertIs(early.journal, journal)
        vh = b.vhosts["/"]
        self.assertIs(vh.declareQueue("d", None, durable=True).journal, journal)
        self.assertIsNone(vh.declareQueue("t", None, durable=False).journal)
        dx = vh.declareExchange("dx", "x-delayed-message", durable=True,
                                arguments={"x-delayed-type": "direct"})
        self.assertIs(dx.journal, journal)
        self.assertIsNone(vh.declareExchange("tx", "x-delayed-message",
                                             arguments={"x-delayed-type": "direct"}).journal)
        self.assertEqual(b.listeners.count(journal.entityChanged), 1)
        b = self.restart(store, clock, b)
        vh = b.vhosts["/"]
        self.assertIs(vh.queues["d"].journal, b.journal)
        self.assertIs(vh.exchanges["dx"].journal, b.journal)

    def test_journalSync(self):
        """``Journal.sync`` fires after the store's sync and fails with StoreFailedError as the store does."""
        from otter_tx.store.interface import StoreFailedError

        store = MemoryStore()
        b = self.boot(store, Clock())
        self.assertIsNone(self.successResultOf(b.journal.sync()))
        store.failWrites()
        self.failureResultOf(b.journal.sync(), StoreFailedError)

    def test_transientMessagesNotWritten(self):
        """Transient messages and non-durable queues never reach the store."""
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        vh = b.vhosts["/"]
        vh.declareQueue("d", None, durable=True)
        vh.declareQueue("t", None, durable=False)
        self.publish(vh, "d", b"transient", delivery_mode=1)
        self.publish(vh, "t", b"persistent-in-transient-queue")
        b = self.restart(store, clock, b)
        self.assertEqual(b.vhosts["/"].queues["d"].readyCount, 0)
        self.assertNotIn("t", b.vhosts["/"].queues)

    def test_sharedMessageRecoveredPerQueue(self):
        """
        A message routed to two durable queues comes back in both after a
        restart, as one Message per queue (recovery streams and keeps no
        map of shared messages); acking it in one leaves the other's.
        """
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        vh = b.vhosts["/"]
        for name in ("a", "b"):
            vh.declareQueue(name, None, durable=True)
            vh.bind(vh.exchanges["amq.fanout"], vh.queues[name], "", {})
        m = Message("amq.fanout", "", encodeProperties({"delivery_mode": 2}), b"both")
        vh.publish(vh.exchanges["amq.fanout"], m)
        b = self.restart(store, clock, b)
        vh = b.vhosts["/"]
        (ea,) = vh.queues["a"].readyEntries()
        (eb,) = vh.queues["b"].readyEntries()
        self.assertIsNot(ea.message, eb.message)
        self.assertEqual((ea.message.storeId, ea.message.body), (eb.message.storeId, eb.message.body))
        fanout = vh.exchanges["amq.fanout"]
        self.assertEqual(vh.route(fanout, ea.message, [""]), {vh.queues["a"], vh.queues["b"]})
        vh.queues["a"].purge()
        b = self.restart(store, clock, b)
        vh = b.vhosts["/"]
        self.assertEqual(vh.queues["a"].readyCount, 0)
        self.assertEqual([e.message.body for e in vh.queues["b"].readyEntries()], [b"both"])

    def test_vhostLimitsSurviveRestart(self):
        """Vhost limits are stored with their vhost and come back after a restart, deletions too."""
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        b.addVHost("v").setLimit("max-queues", 3)
        b.vhosts["/"].setLimit("max-connections", 2)
        b = self.restart(store, clock, b)
        self.assertEqual((b.vhosts["v"].limits, b.vhosts["/"].limits),
                         ({"max-queues": 3}, {"max-connections": 2}))
        b.vhosts["v"].clearLimit("max-queues")
        b = self.restart(store, clock, b)
        self.assertEqual((b.vhosts["v"].limits, b.vhosts["/"].limits), ({}, {"max-connections": 2}))


    def test_globalParametersSurviveRestart(self):
        """Global parameters are stored; a deleted one stays deleted after a restart."""
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        b.setGlobalParameter("cluster_name", "blue")
        b.setGlobalParameter("other", {"a": [1, 2]})
        b = self.restart(store, clock, b)
        self.assertEqual(b.globalParameters, {"cluster_name": "blue", "other": {"a": [1, 2]}})
        b.clearGlobalParameter("other")
        b = self.restart(store, clock, b)
        self.assertEqual(b.globalParameters, {"cluster_name": "blue"})

    def test_userLimitsSurviveRestart(self):
        """User limits are stored with their user and come back after a restart."""
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        b.addUser("u", "pw")
        b.setUserLimit("u", "max-channels", 5)
        b = self.restart(store, clock, b)
        self.assertEqual(b.userLimits, {"u": {"max-channels": 5}})
        b.clearUserLimit("u", "max-channels")
        b = self.restart(store, clock, b)
        self.assertEqual(b.userLimits, {})

    def test_oldUserRecordWithLoopbackFlagLoads(self):
        """A user record of an older store, with its per-user "loopbackOnly" flag, still loads; the flag is ignored."""
        from otter_tx.broker import access

        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        b.addUser("old", "pw", tags=["management"])
        b.stop()
        salt, digest = b.users["old"].salt, b.users["old"].passwordHash
        store.putEntity("user", "old", {"salt": salt, "hash": digest, "tags": ["management"],
                                        "loopbackOnly": True, "algorithm": access.DEFAULT_HASHING})
        self.successResultOf(store.close())
        b = self.boot(store, clock)
        self.assertEqual(b.users["old"].tags, ["management"])
        user, refusal = access.login(b.users, "old", "pw", "10.0.0.1", b.loopbackUsers)
        self.assertEqual((user.name, refusal), ("old", None))

    def test_operatorPoliciesSurviveRestart(self):
        """Operator policies are stored and applied again to the recovered queues."""
        from otter_tx.broker.policy import OperatorPolicy

        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        vh = b.vhosts["/"]
        vh.setOperatorPolicy(OperatorPolicy("op", "^q", {"max-length": 3}, applyTo="queues"))
        vh.declareQueue("q", None, durable=True)
        b = self.restart(store, clock, b)
        vh = b.vhosts["/"]
        self.assertEqual((sorted(vh.operatorPolicies), vh.queues["q"].settings.maxLength), (["op"], 3))
        vh.clearOperatorPolicy("op")
        b = self.restart(store, clock, b)
        self.assertEqual(b.vhosts["/"].operatorPolicies, {})

class StoreKeyTests(SynchronousTestCase):
    """The journal writes under the key formats of store/keys.py, which existing data directories hold."""

    def test_keyFormats(self):
        """Each durable entity kind and a delayed exchange's held messages are stored under NUL-joined keys."""
        store = MemoryStore()
        b = journaledBroker(store, Clock())
        vh = b.vhosts["/"]
        vh.declareExchange("x", "direct", durable=True)
        dx = vh.declareExchange("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        q = vh.declareQueue("q", None, durable=True)
        vh.bind(vh.exchanges["x"], q, "rk", {})
        b.setPolicy("/", "p", "^q$", {"max-length": 1})
        ents = store._entities
        self.assertIn("/\x00x", ents["exchange"])
        self.assertIn("/\x00q", ents["queue"])
        self.assertIn("/\x00p", ents["policy"])
        self.assertIn("guest\x00/", ents["permission"])
        self.assertEqual(dx.storeKey(), "\x01delayed\x00/\x00dx")
        self.assertEqual(json.loads(ents["queue"][dx.storeKey()]),
                         {"delayedExchange": True, "names": ["", "/", "dx"], "idsReserved": 0})
        (binding,) = ents["binding"]
        self.assertEqual(binding.split("\x00")[:5], ["/", "x", "queue", "q", "rk"])


class OddNameTests(SynchronousTestCase):
    """Names holding NUL or bytes that are not UTF-8 survive a restart (the journal's keys and records)."""

    def test_namesWithNulAndSurrogates(self):
        """A vhost, user, permission, exchange, queue, binding and message whose names hold NUL and lone surrogates all come back."""
        clock = Clock()
        store = MemoryStore()
        b = journaledBroker(store, clock)
        odd = b"x\x00y\xff".decode("utf-8", "surrogateescape")
        b.addVHost("v" + odd)
        b.addUser("u" + odd, "pw")
        b.setPermissions("u" + odd, "v" + odd, "c", "w", "r")
        vh = b.vhosts["v" + odd]
        vh.declareExchange("e" + odd, "fanout", False, True, False, False, {})
        q = vh.declareQueue("q" + odd, None, durable=True)
        vh.bind(vh.exchanges["e" + odd], q, "k" + odd, {})
        m = Message("e" + odd, "k" + odd, encodeProperties({"delivery_mode": 2}), b"body")
        vh.publish(vh.exchanges["e" + odd], m)
        b.stop()
        self.successResultOf(store.close())
        b = journaledBroker(store, clock)
        vh = b.vhosts["v" + odd]
        self.assertEqual(b.permissions[("u" + odd, "v" + odd)], ("c", "w", "r"))
        self.assertIn("e" + odd, vh.exchanges)
        (entry,) = vh.queues["q" + odd].readyEntries()
        self.assertEqual((entry.message.exchange, entry.message.routingKey), ("e" + odd, "k" + odd))
        self.assertEqual(vh.route(vh.exchanges["e" + odd], entry.message, ["k" + odd]), {vh.queues["q" + odd]})


class _HeldSyncStore(MemoryStore):
    """A MemoryStore whose sync() waits until the test releases it."""

    def __init__(self):
        MemoryStore.__init__(self)
        self.waiting = []

    def sync(self):
        from twisted.internet.defer import Deferred

        d = Deferred()
        self.waiting.append(d)
        return d

    def release(self):
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.callback(None)

    def failPending(self):
        """Fail the waiting syncs as the durable store fails a batch it could not write."""
        from otter_tx.store.interface import StoreFailedError

        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.errback(StoreFailedError("<test>", "OperationalError: database or disk is full"))


class _ClientOnJournaledBroker:
    """setUp: a journaled broker on ``makeStore()`` with a FakeClient on channel 1."""

    def setUp(self):
        from otter_tx.door.protocol import AMQPServerFactory
        from otter_tx.testing import FakeClient

        self.clock = Clock()
        self.store = self.makeStore()
        self.broker = journaledBroker(self.store, self.clock)
        self.client = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0))
        self.client.openChannel(1)


class WaitForDiskTests(_ClientOnJournaledBroker, SynchronousTestCase):
    """Confirms and tx.commit-ok for persistent messages in durable queues wait for the store's sync."""

    makeStore = _HeldSyncStore

    def test_confirmAfterSync(self):
        """basic.ack for a persistent publish to a durable queue is sent only after sync; transient ones at once."""
        from otter_tx.amqp import spec

        c = self.client
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        c.send(1, spec.ConfirmSelect(False))
        c.received()
        c.publish(1, "", "d", b"transient", props={"delivery_mode": 1})
        self.assertEqual([type(m) for m in c.methods()], [spec.BasicAck])
        c.publish(1, "", "d", b"persistent", props={"delivery_mode": 2})
        c.publish(1, "", "d", b"transient-after", props={"delivery_mode": 1})
        self.assertEqual(c.methods(), [])
        self.store.release()
        acks = c.methods()
        self.assertEqual([(type(m), m.delivery_tag) for m in acks], [(spec.BasicAck, 2), (spec.BasicAck, 3)])

    def test_failedSyncNacks(self):
        """Publishes whose store batch failed get basic.nack in order; the connection stays open and later ones are acked."""
        from otter_tx.amqp import spec

        c = self.client
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        c.send(1, spec.ConfirmSelect(False))
        c.received()
        c.publish(1, "", "d", b"p1", props={"delivery_mode": 2})
        c.publish(1, "", "d", b"p2", props={"delivery_mode": 2})
        self.assertEqual(c.methods(), [])
        self.store.failPending()
        nacks = c.methods()
        self.assertEqual({type(m) for m in nacks}, {spec.BasicNack})
        self.assertEqual(sorted(m.delivery_tag for m in nacks), [1, 2])
        c.publish(1, "", "d", b"p3", props={"delivery_mode": 2})
        self.store.release()
        self.assertEqual([(type(m), m.delivery_tag) for m in c.methods()], [(spec.BasicAck, 3)])
        self.assertFalse(c.transport.disconnecting)

    def test_txCommitAfterSync(self):
        """tx.commit-ok for persistent messages in a durable queue waits for sync."""
        from otter_tx.amqp import spec

        c = self.client
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        c.send(1, spec.TxSelect())
        c.received()
        c.publish(1, "", "d", b"p", props={"delivery_mode": 2})
        c.send(1, spec.TxCommit())
        self.assertEqual(c.methods(), [])
        self.store.release()
        self.assertEqual([type(m) for m in c.methods()], [spec.TxCommitOk])


class JournalPurgedTests(_ClientOnJournaledBroker, SynchronousTestCase):
    """Journal.purged removes exactly a durable queue's ready entries from the store, in one store call."""

    makeStore = MemoryStore

    def storedIds(self):
        return sorted(self.store._queues.get("/\x00d", {}))

    def test_purgedKeepsUnacked(self):
        """Ready entries go, the one delivered by basic.get and not acked stays, and only one purgeQueue call is made."""
        from otter_tx.amqp import spec

        c = self.client
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        for i in range(5):
            c.publish(1, "", "d", b"m%d" % i, props={"delivery_mode": 2})
        c.send(1, spec.BasicGet(0, "d", False))
        c.received()
        queue = self.broker.vhosts["/"].queues["d"]
        (held,) = [entry for _, entry, _, _ in c.protocol.channels[1].unacked.values()]
        self.assertEqual(len(self.storedIds()), 5)
        calls = []
        original = self.store.purgeQueue
        self.store.purgeQueue = lambda key, keep=(): (calls.append(key), original(key, keep))
        self.broker.journal.purged(queue)
        self.assertEqual(calls, ["/\x00d"])
        self.assertEqual(self.storedIds(), [held.message.storeId])

    def test_requeuedAreReadyAgain(self):
        """A delivery that was requeued (basic.reject requeue=true) is ready again and goes with the purge."""
        from otter_tx.amqp import spec

        c = self.client
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        for i in range(3):
            c.publish(1, "", "d", b"m%d" % i, props={"delivery_mode": 2})
        c.send(1, spec.BasicGet(0, "d", False))
        c.send(1, spec.BasicGet(0, "d", False))
        c.received()
        tags = sorted(c.protocol.channels[1].unacked)
        c.send(1, spec.BasicReject(tags[0], True))
        c.received()
        (held,) = [entry for _, entry, _, _ in c.protocol.channels[1].unacked.values()]
        queue = self.broker.vhosts["/"].queues["d"]
        self.broker.journal.purged(queue)
        self.assertEqual(self.storedIds(), [held.message.storeId])

    def test_purgedWithoutUnacked(self):
        """With nothing unacknowledged, every entry of the queue goes."""
        from otter_tx.amqp import spec

        c = self.client
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        for i in range(3):
            c.publish(1, "", "d", b"m%d" % i, props={"delivery_mode": 2})
        c.received()
        queue = self.broker.vhosts["/"].queues["d"]
        self.broker.journal.purged(queue)
        self.assertEqual(self.storedIds(), [])


class JournalRedeliveredTests(_ClientOnJournaledBroker, SynchronousTestCase):
    """
    The redelivered flag reaches the store when a delivered persistent
    message goes back to its queue, not at each delivery (an acked delivery
    writes nothing but its removal).
    """

    makeStore = MemoryStore

    def flags(self):
        """{storeId: redelivered} of the store's entries of queue d."""
        return {i: e[3] for i, e in self.store._queues.get("/\x00d", {}).items()}

    def deliverOne(self):
        from otter_tx.amqp import spec

        c = self.client
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        for i in range(2):
            c.publish(1, "", "d", b"m%d" % i, props={"delivery_mode": 2})
        c.send(1, spec.BasicGet(0, "d", False))
        c.received()
        [tag] = list(c.protocol.channels[1].unacked)
        return tag

    def test_deliveryWritesNoMark(self):
        """A delivered, unacked message is not marked; acked, it is removed."""
        from otter_tx.amqp import spec

        tag = self.deliverOne()
        self.assertEqual(sorted(self.flags().values()), [False, False])
        self.client.send(1, spec.BasicAck(tag, False))
        self.assertEqual(list(self.flags().values()), [False])

    def test_requeueMarks(self):
        """basic.reject with requeue marks the message redelivered in the store."""
        from otter_tx.amqp import spec

        tag = self.deliverOne()
        self.client.send(1, spec.BasicReject(tag, True))
        self.assertEqual(sorted(self.flags().values()), [False, True])

    def test_closedConnectionMarks(self):
        """A connection that goes away (or is closed by a stopping broker) marks its unacked deliveries."""
        from twisted.python.failure import Failure
        from twisted.internet.error import ConnectionDone

        self.deliverOne()
        self.client.protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(sorted(self.flags().values()), [False, True])
