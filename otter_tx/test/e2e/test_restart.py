"""
Restarts of the real broker on the real reactor: durable entities and
persistent messages survive a restart of the in-process broker (SQLite store
under a data dir), transient ones do not
(https://www.rabbitmq.com/docs/queues#durability); a damaged store file, a
data dir held by another broker, a full disk, and recovery streamed from a
big store.  The deterministic journal tests (MemoryStore, task.Clock) are in
``otter_tx.test.unit.test_durability``.
"""

import os

import pika
from twisted.internet import reactor, threads
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker import access
from otter_tx.broker.message import Message
from otter_tx.testing import startBroker


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
                access.login(b.users, "alice", "secret", None)[0] is not None,
                access.login(b.users, "alice", "wrong", None)[0] is None,
                b.canAccess(b.users["alice"], "v2"),
                b.vhosts["v2"].policies["ttl"].definition,
            )
            yield f.stop()
            return result

        return run().addCallback(self.assertEqual, (True, True, True, True, {"message-ttl": 500}))

    def test_limitsAndGlobalParametersSurvive(self):
        """Vhost limits, user limits and global parameters come back from the SQLite store."""

        @inlineCallbacks
        def run():
            dataDir = self.mktemp()
            f = yield startBroker(reactor, dataDir=dataDir)
            f.broker.addVHost("v2").setLimit("max-queues", 7)
            f.broker.addUser("alice", "secret")
            f.broker.setUserLimit("alice", "max-channels", 3)
            f.broker.setGlobalParameter("cluster_name", "blue")
            yield f.stop()
            f = yield startBroker(reactor, dataDir=dataDir)
            b = f.broker
            result = (b.vhosts["v2"].limits, b.userLimits, b.globalParameters)
            yield f.stop()
            return result

        return run().addCallback(self.assertEqual, (
            {"max-queues": 7}, {"alice": {"max-channels": 3}}, {"cluster_name": "blue"}))


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
        from otter_tx.service.assembly import DataDirInUse

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


class DiskFullTests(TestCase):
    """A full disk under the real SQLite store: confirms become basic.nack, the connection lives, and it recovers."""

    timeout = 30

    @inlineCallbacks
    def test_nackThenRecover(self):
        """Publishes whose batch hits SQLITE_FULL are nacked and the store turns unhealthy; once space is back the next publish is acked."""
        from otter_tx.amqp import spec
        from otter_tx.broker.broker import Broker
        from otter_tx.broker.durability import Journal
        from otter_tx.door.protocol import AMQPServerFactory
        from otter_tx.store.interface import StoreFailedError
        from otter_tx.store.sqlite import SQLiteStore
        from otter_tx.test.unit.test_store import limitStorePages
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
        from otter_tx.test.unit.test_delayed import msg

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
