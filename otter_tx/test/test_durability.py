"""
Restart tests: durable entities and persistent messages survive a restart of
the in-process broker (SQLite store under a data dir), transient ones do not
(https://www.rabbitmq.com/docs/queues#durability); and deterministic journal
tests on a MemoryStore and task.Clock.
"""

import os

import pika
from twisted.internet import reactor, threads
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from otter_tx.amqp.codec import TaggedInt, encodeProperties
from otter_tx.broker.message import Message
from otter_tx.store.memory import MemoryStore
from otter_tx.testing import journaledBroker, startBroker


def params(port):
    return pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10, connection_attempts=1)


class RestartTests(TestCase):
    """Stop and start the real broker on the same data dir."""

    timeout = 60

    @inlineCallbacks
    def restart(self, before, after):
        dataDir = self.mktemp()
        fixture = yield startBroker(reactor, dataDir=dataDir)
        try:
            yield threads.deferToThread(before, fixture.amqpPort)
        finally:
            yield fixture.stop()
        fixture = yield startBroker(reactor, dataDir=dataDir)
        try:
            result = yield threads.deferToThread(after, fixture.amqpPort, fixture)
        finally:
            yield fixture.stop()
        return result

    def test_durableEntitiesAndPersistentMessages(self):
        """Durable exchanges, queues (with arguments), bindings and confirmed persistent messages come back; transient ones do not."""

        def before(port):
            c = pika.BlockingConnection(params(port))
            ch = c.channel()
            ch.confirm_delivery()
            ch.exchange_declare("dx", "topic", durable=True)
            ch.exchange_declare("tx", "fanout", durable=False)
            ch.queue_declare("dq", durable=True, arguments={"x-max-length": 100, "x-queue-mode": "lazy"})
            ch.queue_declare("tq", durable=False)
            ch.queue_bind("dq", "dx", "a.#")
            ch.queue_bind("dq", "amq.direct", "k")
            for i in range(5):
                ch.basic_publish("dx", "a.b", b"p%d" % i,
                                 pika.BasicProperties(delivery_mode=2, headers={"i": i}, priority=1))
            ch.basic_publish("dx", "a.b", b"transient", pika.BasicProperties(delivery_mode=1))
            ch.basic_publish("", "tq", b"gone", pika.BasicProperties(delivery_mode=2))
            # one delivered, not acked: comes back redelivered
            method, props, body = ch.basic_get("dq", auto_ack=False)
            c.close()

        def after(port, fixture):
            c = pika.BlockingConnection(params(port))
            ch = c.channel()
            ch.exchange_declare("dx", "topic", durable=True, passive=True)
            q = ch.queue_declare("dq", durable=True, passive=True)
            out = []
            while True:
                method, props, body = ch.basic_get("dq", auto_ack=True)
                if method is None:
                    break
                out.append((body, method.redelivered, props.headers, props.delivery_mode))
            try:
                ch.queue_declare("tq", passive=True)
                tq = True
            except pika.exceptions.ChannelClosedByBroker as e:
                tq = e.reply_code
            ch = c.channel()
            try:
                ch.exchange_declare("tx", "fanout", passive=True)
                tx = True
            except pika.exceptions.ChannelClosedByBroker as e:
                tx = e.reply_code
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("amq.direct", "k", b"via-amq-direct", pika.BasicProperties(delivery_mode=2))
            via = ch.basic_get("dq", auto_ack=True)[2]
            vhq = fixture.broker.vhosts["/"].queues["dq"]
            args = dict(vhq.arguments)
            c.close()
            return q.method.message_count, out, tq, tx, via, args

        def check(result):
            count, out, tq, tx, via, args = result
            self.assertEqual(count, 5)
            self.assertEqual([o[0] for o in out], [b"p0", b"p1", b"p2", b"p3", b"p4"])
            self.assertEqual([o[1] for o in out], [True, False, False, False, False])
            self.assertEqual(out[3][2], {"i": 3})
            self.assertEqual(out[3][3], 2)
            self.assertEqual((tq, tx), (404, 404))
            self.assertEqual(via, b"via-amq-direct")
            self.assertEqual(args, {"x-max-length": 100, "x-queue-mode": "lazy"})

        return self.restart(before, after).addCallback(check)

    def test_ackedMessagesStayGone(self):
        """Acked, rejected and purged persistent messages do not come back."""

        def before(port):
            c = pika.BlockingConnection(params(port))
            ch = c.channel()
            ch.confirm_delivery()
            ch.queue_declare("q", durable=True)
            for i in range(6):
                ch.basic_publish("", "q", b"%d" % i, pika.BasicProperties(delivery_mode=2))
            m1 = ch.basic_get("q")[0]
            ch.basic_ack(m1.delivery_tag)
            m2 = ch.basic_get("q")[0]
            ch.basic_reject(m2.delivery_tag, requeue=False)
            ch.basic_get("q", auto_ack=True)
            ch.queue_declare("q2", durable=True)
            ch.basic_publish("", "q2", b"x", pika.BasicProperties(delivery_mode=2))
            ch.queue_purge("q2")
            c.close()

        def after(port, fixture):
            vh = fixture.broker.vhosts["/"]
            return [e.message.body for e in vh.queues["q"].readyEntries()], vh.queues["q2"].readyCount

        return self.restart(before, after).addCallback(self.assertEqual, ([b"3", b"4", b"5"], 0))

    def test_usersPoliciesVhostsSurvive(self):
        """Vhosts, users, permissions and policies added through the Python API survive."""

        def before(port):
            pass

        @inlineCallbacks
        def run():
            dataDir = self.mktemp()
            f = yield startBroker(reactor, dataDir=dataDir)
            f.broker.addVHost("v2")
            f.broker.addUser("alice", "secret")
            f.broker.setPermissions("alice", "v2")
            f.broker.setPolicy("v2", "ttl", "^t", {"message-ttl": 500}, applyTo="queues")
            yield f.stop()
            f = yield startBroker(reactor, dataDir=dataDir)
            b = f.broker
            result = (
                "v2" in b.vhosts,
                b.authenticate("alice", "secret") is not None,
                b.authenticate("alice", "wrong") is None,
                b.canAccess(b.users["alice"], "v2"),
                b.vhosts["v2"].policies["ttl"].definition,
            )
            yield f.stop()
            return result

        return run().addCallback(self.assertEqual, (True, True, True, True, {"message-ttl": 500}))


class CorruptStoreTests(TestCase):
    """A damaged store file stops the start with an error naming the file."""

    def test_corruptStoreRefusesToStart(self):
        """startBroker fails with StoreCorruptError naming the file; no port is opened."""
        import os

        from otter_tx.store.interface import StoreCorruptError

        dataDir = os.path.abspath(self.mktemp())
        os.makedirs(dataDir)
        path = os.path.join(dataDir, "otter_tx.sqlite3")
        with open(path, "wb") as f:
            f.write(b"this is not a database" * 300)
        d = self.assertFailure(startBroker(reactor, dataDir=dataDir), StoreCorruptError)

        def check(e):
            self.assertIn(path, str(e))
            self.assertIn("To recover", str(e))
            self.flushLoggedErrors(StoreCorruptError)

        return d.addCallback(check)


class DataDirLockTests(TestCase):
    """Two brokers never share one data directory."""

    @inlineCallbacks
    def test_secondBrokerRefused(self):
        """A second broker on a data dir in use fails to start, naming the directory; after a stop it works."""
        from otter_tx.service import DataDirInUse

        dataDir = self.mktemp()
        first = yield startBroker(reactor, dataDir=dataDir)
        try:
            e = yield self.assertFailure(startBroker(reactor, dataDir=dataDir), DataDirInUse)
            self.assertIn(dataDir, str(e))
            self.flushLoggedErrors(DataDirInUse)
        finally:
            yield first.stop()
        again = yield startBroker(reactor, dataDir=dataDir)
        yield again.stop()


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
        from otter_tx.protocol import AMQPServerFactory
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


class DiskFullTests(TestCase):
    """A full disk under the real SQLite store: confirms become basic.nack, the connection lives, and it recovers."""

    timeout = 30

    @inlineCallbacks
    def test_nackThenRecover(self):
        """Publishes whose batch hits SQLITE_FULL are nacked and the store turns unhealthy; once space is back the next publish is acked."""
        from otter_tx.amqp import spec
        from otter_tx.broker.broker import Broker
        from otter_tx.broker.durability import Journal
        from otter_tx.protocol import AMQPServerFactory
        from otter_tx.store.interface import StoreFailedError
        from otter_tx.store.sqlite import SQLiteStore
        from otter_tx.test.test_store import limitStorePages
        from otter_tx.testing import FakeClient

        store = SQLiteStore(self.mktemp(), reactor, retryDelays=(0.05,))
        state = yield store.open()
        self.addCleanup(lambda: store.close().addErrback(lambda f: None))
        limit = limitStorePages(store)
        clock = Clock()
        broker = Broker(clock)
        journal = Journal(broker, store)
        journal.recover(state)
        broker.journal = journal
        broker.listeners.append(journal.entityChanged)
        journal.writeAll()
        health = []
        store.addHealthObserver(lambda healthy, reason: health.append(healthy))
        c = FakeClient(AMQPServerFactory(broker, clock, heartbeat=0))
        c.openChannel(1)
        c.send(1, spec.QueueDeclare(0, "d", durable=True))
        c.send(1, spec.ConfirmSelect(False))
        yield store.sync()
        c.received()
        limit[0] = os.path.getsize(store.path) // 4096 + 2
        c.publish(1, "", "d", b"x" * 200000, props={"delivery_mode": 2})
        yield self.assertFailure(store.sync(), StoreFailedError)
        self.assertEqual([type(m) for m in c.methods()], [spec.BasicNack])
        self.assertEqual(health, [False])
        limit[0] = 1 << 30
        c.publish(1, "", "d", b"small", props={"delivery_mode": 2})
        yield store.sync()
        self.assertEqual([(type(m), m.delivery_tag) for m in c.methods()], [(spec.BasicAck, 2)])
        self.assertEqual(health, [False, True])
        self.assertFalse(c.transport.disconnecting)


class StreamedRecoveryTests(TestCase):
    """
    A broker rebuilt from a real :class:`SQLiteStore`, whose recovered
    messages are read lazily while the journal restores them (issue 8:
    a backlog costs bounded memory).
    """

    timeout = 60

    async def boot(self, dataDir, clock, **options):
        from otter_tx.broker.broker import Broker
        from otter_tx.broker.durability import Journal
        from otter_tx.store.sqlite import SQLiteStore

        store = SQLiteStore(dataDir, reactor)
        state = await store.open()
        broker = Broker(clock, pagingDirectory=self.mktemp(), **options)
        journal = Journal(broker, store)
        if journal.recover(state):
            journal.writeAll()
        broker.journal = journal
        broker.listeners.append(journal.entityChanged)
        return broker, store

    async def _restart(self):
        from otter_tx.test.test_delayed import msg

        dataDir = self.mktemp()
        clock = Clock()
        b, store = await self.boot(dataDir, clock)
        vh = b.vhosts["/"]
        big = vh.declareQueue("big", None, durable=True)
        for name in ("a", "b"):
            vh.declareQueue(name, None, durable=True)
            vh.bind(vh.exchanges["amq.fanout"], vh.queues[name], "", {})
        dx = vh.declareExchange("dx", "x-delayed-message", durable=True,
                                arguments={"x-delayed-type": "direct"})
        vh.bind(dx, big, "k", {})
        props = encodeProperties({"delivery_mode": 2})
        # held first, enqueued in big last once released
        vh.publish(dx, msg(60000, body=b"held", delivery_mode=2))
        for i in range(2000):
            vh.publish(vh.exchanges[""], Message("", "big", props, b"%06d" % i + b"x" * 500))
        vh.publish(vh.exchanges["amq.fanout"], Message("amq.fanout", "", props, b"both"))
        top = max(e.message.storeId for e in vh.queues["a"].readyEntries())
        b.stop()
        await store.close()
        # a budget of 64 KiB: all but about a hundred of big's messages are paged as read
        b, store = await self.boot(dataDir, clock, queueMemoryBudget=64 * 1024)
        self.addCleanup(lambda: self.stores[-1].close())
        self.stores = [store]
        self.clock = clock
        self.dataDir = dataDir
        return b, top

    async def test_restoresStreamed(self):
        """
        A 2,000-message queue comes back in order and mostly paged; a
        message of two queues comes back in both; a held delayed message
        is held again; new message ids are above every recovered one.
        """
        b, top = await self._restart()
        vh = b.vhosts["/"]
        big = vh.queues["big"]
        self.assertEqual(big.readyCount, 2000)
        self.assertGreater(big.pagedCount, 1500)
        self.assertEqual([e.message.body for e in vh.queues["a"].readyEntries()], [b"both"])
        self.assertEqual([e.message.body for e in vh.queues["b"].readyEntries()], [b"both"])
        self.assertEqual(vh.exchanges["dx"].held, 1)
        m = Message("", "big", encodeProperties({}), b"new")
        b.nextMessageId(m)
        self.assertGreater(m.storeId, top)
        got = [e.message.body[:6] for e in big.readyEntries()]
        self.assertEqual(got, [b"%06d" % i for i in range(2000)])

    async def test_releasedDelayedMessageKeepsSeqOrder(self):
        """
        A delayed message published first but released into a queue after
        2,000 later-published ones comes back after them, across a second
        restart of the streamed recovery.  (The release routes a copy with
        a new storeId, so this queue is in storeId order too; the sort by seq
        for queues that are not is tested in test_store.)
        """
        b, top = await self._restart()
        self.clock.advance(61)
        big = b.vhosts["/"].queues["big"]
        self.assertEqual(big.readyCount, 2001)
        b.stop()
        await self.stores[-1].close()
        b, store = await self.boot(self.dataDir, self.clock, queueMemoryBudget=64 * 1024)
        self.stores.append(store)
        got = [e.message.body[:6] for e in b.vhosts["/"].queues["big"].readyEntries()]
        self.assertEqual(got, [b"%06d" % i for i in range(2000)] + [b"held"])
