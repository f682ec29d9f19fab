"""
The declared seams (:mod:`otter_tx.broker.interfaces`,
:mod:`otter_tx.store.interface`): every real implementation and every test
fake is checked with ``verifyClass`` (and ``verifyObject`` where an instance
is cheap), so a fake cannot drift from what the core calls.
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyClass, verifyObject

from otter_tx.broker.broker import Broker
from otter_tx.broker.exchange import (
    EXCHANGE_TYPES,
    DirectRouting,
    FanoutRouting,
    HeadersRouting,
    TopicRouting,
)
from otter_tx.broker.interfaces import (
    IClientConnection,
    IConsumer,
    IConsumerSource,
    IExchangeType,
    IQueue,
)
from otter_tx.broker.queue import Queue
from otter_tx.broker.replyto import ReplyToQueue
from otter_tx.store.interface import IMessageStore, IStoreHealth
from otter_tx.store.memory import MemoryStore
from otter_tx.store.sqlite import SQLiteStore
from otter_tx.testing import FakeConnection


class RealImplementationTests(SynchronousTestCase):
    """The broker's own classes provide the interfaces the core calls them through."""

    def setUp(self):
        self.broker = Broker(Clock())
        self.vhost = self.broker.vhosts["/"]

    def test_queue(self):
        """Queue is an IQueue (and so an IConsumerSource)."""
        self.assertTrue(verifyClass(IQueue, Queue))
        self.assertTrue(verifyObject(IQueue, self.vhost.declareQueue("q", None)))
        self.assertTrue(IConsumerSource.implementedBy(Queue))

    def test_replyToQueue(self):
        """The direct reply-to pseudo-queue is the narrower IConsumerSource, not an IQueue."""
        self.assertTrue(verifyClass(IConsumerSource, ReplyToQueue))
        self.assertTrue(verifyObject(IConsumerSource, ReplyToQueue(self.vhost)))
        self.assertFalse(IQueue.implementedBy(ReplyToQueue))

    def test_exchangeTypes(self):
        """The four routing tables are IExchangeType, and they are all the types there are."""
        classes = [DirectRouting, FanoutRouting, TopicRouting, HeadersRouting]
        self.assertEqual(sorted(EXCHANGE_TYPES.values(), key=classes.index), classes)
        for cls in classes:
            self.assertTrue(verifyClass(IExchangeType, cls))
            self.assertTrue(verifyObject(IExchangeType, cls()))

    def test_delayedExchangeRoutesWithAnExchangeType(self):
        """An x-delayed-message exchange routes with the IExchangeType of its x-delayed-type."""
        ex = self.vhost.declareExchange("d", "x-delayed-message", arguments={"x-delayed-type": "topic"})
        self.assertTrue(verifyObject(IExchangeType, ex.routing))

    def test_stores(self):
        """Both stores are IMessageStore (and so IStoreHealth)."""
        for cls in (MemoryStore, SQLiteStore):
            self.assertTrue(verifyClass(IMessageStore, cls))
            self.assertTrue(IStoreHealth.implementedBy(cls))
        self.assertTrue(verifyObject(IMessageStore, MemoryStore()))

    def test_protocol(self):
        """The AMQP protocol is an IClientConnection."""
        from otter_tx.door.protocol import AMQPServerProtocol

        self.assertTrue(verifyClass(IClientConnection, AMQPServerProtocol))

    def test_consumer(self):
        """The Session's Consumer is an IConsumer."""
        from otter_tx.broker.session import Consumer

        self.assertTrue(verifyClass(IConsumer, Consumer))

    def test_clientConnections(self):
        """The AMQP connection and the HTTP door are IClientConnections."""
        from otter_tx.door.protocol import AMQPServerProtocol
        from otter_tx.web.door import HTTPRequestConnection

        self.assertTrue(verifyClass(IClientConnection, AMQPServerProtocol))
        self.assertTrue(verifyClass(IClientConnection, HTTPRequestConnection))


class FakeTests(SynchronousTestCase):
    """Every test fake of a seam provides its interface fully."""

    def test_fakeConnection(self):
        """testing.FakeConnection (also test_alarms' and test_memory's connections) is an IClientConnection."""
        from otter_tx.test.unit.test_alarms import _Conn

        for cls in (FakeConnection, _Conn):
            self.assertTrue(verifyClass(IClientConnection, cls))
            self.assertTrue(verifyObject(IClientConnection, cls()))

    def test_fakeConsumers(self):
        """test_ttl_dlx.FakeConsumer and test_paging.Taker are IConsumer."""
        from otter_tx.test.unit.test_paging import Taker
        from otter_tx.test.unit.test_ttl_dlx import FakeConsumer

        for cls in (FakeConsumer, Taker):
            self.assertTrue(verifyClass(IConsumer, cls))
            self.assertTrue(verifyObject(IConsumer, cls()))

    def test_fakeStores(self):
        """test_alarms.FakeStore is IStoreHealth; test_service's wrapper and test_durability's store are IMessageStore."""
        from otter_tx.test.unit.test_alarms import FakeStore
        from otter_tx.test.unit.test_durability import _HeldSyncStore
        from otter_tx.test.unit.test_service import _HealthStore

        self.assertTrue(verifyClass(IStoreHealth, FakeStore))
        self.assertTrue(verifyObject(IStoreHealth, FakeStore()))
        self.assertTrue(verifyObject(IMessageStore, _HealthStore(MemoryStore(), FakeStore())))
        self.assertTrue(verifyClass(IMessageStore, _HeldSyncStore))


class CoreCallsThroughSeamsTests(SynchronousTestCase):
    """The core reaches connections only through IClientConnection."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock, consumerTimeout=10000)
        self.conn = FakeConnection(vhost=self.broker.vhosts["/"])
        self.broker.connections.add(self.conn)

    def test_ackTimeoutAsksConnections(self):
        """Broker.checkAckTimeouts hands each connection the limit (clock seconds) and the timeout (ms)."""
        self.clock.advance(100)
        self.broker.checkAckTimeouts()
        self.assertEqual(self.conn.ackTimeoutChecks, [(90.0, 10000)])

    def test_vhostDeletionCloses(self):
        """Deleting the vhost closes its connections politely with 320."""
        self.broker.addVHost("v")
        other = FakeConnection(vhost=self.broker.vhosts["v"])
        self.broker.connections.add(other)
        self.assertEqual(self.broker.deleteVHost("v"), [other])
        self.assertEqual(other.closes, [(320, "CONNECTION_FORCED - vhost 'v' is deleted")])
        self.assertEqual(self.conn.closes, [])
        self.successResultOf(other.whenClosed())

    def test_alarmsTellConnections(self):
        """Raising and clearing an alarm calls alarmChanged on every connection."""
        self.broker.alarms.set("memory")
        self.broker.alarms.clear("memory")
        self.assertEqual(self.conn.alarms, [True, False])
