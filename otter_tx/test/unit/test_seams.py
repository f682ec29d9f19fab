"""
The declared seams (:mod:`otter_tx.broker.interfaces`,
:mod:`otter_tx.store.interface`): every real implementation and every test
fake is checked with ``verifyClass`` (and ``verifyObject`` where an instance
is cheap), so a fake cannot drift from what the core calls.
:class:`EveryImplementationTests` finds them rather than listing them: every
class of the product, testing.py and the unit tests that declares one of
these interfaces, and any class that has an interface's methods without
declaring it.
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
from otter_tx.broker import interfaces
from otter_tx.broker.interfaces import (
    IClientConnection,
    IConnectionInfo,
    IConsumer,
    IConsumerSource,
    IDeclaredQueue,
    IExchangeType,
    IReadyStore,
    IQueue,
    ISessionClient,
)
from otter_tx.broker.queue import Queue
from otter_tx.broker.readystore import ReadyStore
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
        self.assertTrue(verifyClass(IDeclaredQueue, Queue))
        self.assertTrue(verifyObject(IDeclaredQueue, self.vhost.queues["q"]))

    def test_clusterSeams(self):
        """
        A queue on another node is an IQueue (it runs the queue contract:
        RemoteQueueContractTests); the home node's side of a consumer on
        another node is an IConsumer.
        """
        from otter_tx.cluster.remote import LinkConsumer, RemoteQueue

        self.assertTrue(verifyClass(IQueue, RemoteQueue))
        self.assertTrue(verifyClass(IDeclaredQueue, RemoteQueue))
        self.assertTrue(verifyClass(IConsumer, LinkConsumer))

    def test_replyToQueue(self):
        """The direct reply-to pseudo-queue is the narrower IConsumerSource, not an IQueue."""
        self.assertTrue(verifyClass(IConsumerSource, ReplyToQueue))
        self.assertTrue(verifyObject(IConsumerSource, ReplyToQueue(self.vhost)))
        self.assertFalse(IQueue.implementedBy(ReplyToQueue))
        self.assertFalse(IDeclaredQueue.implementedBy(ReplyToQueue))

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
        """The AMQP protocol is an IClientConnection, an IConnectionInfo and a Session's ISessionClient."""
        from otter_tx.door.protocol import AMQPServerProtocol

        for iface in (IClientConnection, IConnectionInfo, ISessionClient):
            self.assertTrue(verifyClass(iface, AMQPServerProtocol))

    def test_consumer(self):
        """The Session's Consumer is an IConsumer."""
        from otter_tx.broker.session import Consumer

        self.assertTrue(verifyClass(IConsumer, Consumer))

    def test_httpDoor(self):
        """The HTTP door is a Session's ISessionClient and nothing more: the core never lists, closes or alarms it."""
        from otter_tx.web.door import HTTPRequestConnection

        self.assertTrue(verifyClass(ISessionClient, HTTPRequestConnection))
        door = HTTPRequestConnection(self.broker, self.broker.users["guest"], self.vhost)
        self.assertTrue(verifyObject(ISessionClient, door))
        self.assertFalse(IClientConnection.implementedBy(HTTPRequestConnection))
        self.assertFalse(IConnectionInfo.implementedBy(HTTPRequestConnection))

    def test_quorumQueue(self):
        """A quorum queue is an IQueue too (the same class with quorum rules)."""
        q = self.vhost.declareQueue("qq", None, durable=True, arguments={"x-queue-type": "quorum"})
        self.assertTrue(verifyObject(IQueue, q))
        self.assertTrue(verifyObject(IDeclaredQueue, q))


class FakeTests(SynchronousTestCase):
    """Every test fake of a seam provides its interface fully."""

    def test_fakeConnection(self):
        """testing.FakeConnection (and test_alarms' and test_session's subclasses) is all a protocol is to the core."""
        from otter_tx.test.unit.test_alarms import _Conn
        from otter_tx.test.unit.test_session import FakeConnection as SessionFakeConnection

        for cls in (FakeConnection, _Conn, SessionFakeConnection):
            for iface in (IClientConnection, IConnectionInfo, ISessionClient):
                self.assertTrue(verifyClass(iface, cls))
        for obj in (FakeConnection(), _Conn(), SessionFakeConnection(None)):
            for iface in (IClientConnection, IConnectionInfo, ISessionClient):
                self.assertTrue(verifyObject(iface, obj))

    def test_fakeConsumers(self):
        """test_ttl_dlx.FakeConsumer, test_paging.Taker and the queue contract's RecordingConsumer are IConsumer."""
        from otter_tx.test.unit.test_paging import Taker
        from otter_tx.test.unit.test_queue_contract import RecordingConsumer
        from otter_tx.test.unit.test_ttl_dlx import FakeConsumer

        for cls in (FakeConsumer, Taker, RecordingConsumer):
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


class ReadyStoreSeamTests(SynchronousTestCase):
    """A queue's ready messages stand behind IReadyStore (its own suite: test_readystore)."""

    def test_queueReadyStore(self):
        """A declared queue's ready store is an IReadyStore."""
        q = Broker(Clock()).vhosts["/"].declareQueue("q", None)
        self.assertTrue(verifyClass(IReadyStore, ReadyStore))
        self.assertTrue(verifyObject(IReadyStore, q.ready))


class CoverageTests(SynchronousTestCase):
    """Every interface of broker/interfaces.py is checked here against at least one implementation."""

    def test_everyInterfaceChecked(self):
        """The interfaces this module verifies are all those broker/interfaces.py declares."""
        declared = {getattr(interfaces, name) for name in interfaces.__all__}
        checked = {IClientConnection, IConnectionInfo, ISessionClient, IConsumer, IConsumerSource, IQueue,
                   IDeclaredQueue, IExchangeType, IReadyStore}
        self.assertEqual(declared, checked)


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

    def test_userChannelLimitCountsChannels(self):
        """A user's max-channels limit counts the channels of IClientConnection.channels."""
        from otter_tx.amqp.errors import AMQPError

        self.conn.user = self.broker.users["guest"]
        self.conn.channels = {1: object()}
        self.broker.userLimits["guest"] = {"max-channels": 1}
        self.assertRaises(AMQPError, self.broker.checkUserChannelLimit, "guest")
        self.conn.channels = {}
        self.broker.checkUserChannelLimit("guest")

    def test_alarmsTellConnections(self):
        """Raising and clearing an alarm calls alarmChanged on every connection."""
        self.broker.alarms.set("memory")
        self.broker.alarms.clear("memory")
        self.assertEqual(self.conn.alarms, [True, False])


def _seamInterfaces():
    """Every interface of broker/interfaces.py and store/interface.py."""
    from otter_tx.store import interface as storeInterface

    out = [getattr(interfaces, name) for name in interfaces.__all__]
    out += [IMessageStore, IStoreHealth]
    assert all(i.__module__ in (interfaces.__name__, storeInterface.__name__) for i in out)
    return out


def _classes():
    """
    ``(module name, class)`` of every class defined at the top level of the
    product's modules, of testing.py and of the unit tests (the fakes).
    """
    import importlib
    import inspect
    import os

    import otter_tx

    root = os.path.dirname(os.path.abspath(otter_tx.__file__))
    out = []
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root).split(os.sep)
        if rel[0] == "test" and rel[1:] != ["unit"]:
            dirs[:] = [d for d in dirs if d == "unit"] if rel == ["test"] else []
            continue
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "static", "data"))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            parts = ["otter_tx"] + [p for p in rel if p != "."]
            if f != "__init__.py":
                parts.append(f[:-3])
            name = ".".join(parts)
            module = importlib.import_module(name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == name:
                    out.append((name, cls))
    return out


class EveryImplementationTests(SynchronousTestCase):
    """
    Found, not listed: every class of the product, testing.py and the unit
    tests that declares a seam's interface is checked with ``verifyClass``,
    and no class has all of an interface's methods without declaring it (an
    undeclared fake would drift unseen).
    """

    def test_everyDeclaredImplementationVerifies(self):
        """verifyClass for each (class, interface) it declares; the known implementations are among them."""
        found = set()
        for _, cls in _classes():
            for iface in _seamInterfaces():
                if iface.implementedBy(cls):
                    found.add(cls.__name__)
                    if "__getattr__" in vars(cls):
                        # a delegating wrapper (test_service's _HealthStore): its
                        # instances are checked with verifyObject (FakeTests)
                        continue
                    self.assertTrue(verifyClass(iface, cls), (cls, iface))
        for name in ("Queue", "StreamQueue", "RemoteQueue", "ReplyToQueue", "Consumer", "LinkConsumer",
                     "AMQPServerProtocol", "HTTPRequestConnection", "FakeConnection", "ReadyStore",
                     "DirectRouting", "MemoryStore", "SQLiteStore", "LogStore", "RecordingConsumer", "Taker",
                     "FakeConsumer", "FakeStore", "_HealthStore", "_HeldSyncStore"):
            self.assertIn(name, found)

    def test_noUndeclaredImplementation(self):
        """A class with every method of a seam's interface declares that interface."""
        undeclared = []
        for module, cls in _classes():
            for iface in _seamInterfaces():
                methods = [n for n, d in iface.namesAndDescriptions(all=True) if hasattr(d, "getSignatureInfo")]
                if methods and all(callable(getattr(cls, n, None)) for n in methods) and \
                        not iface.implementedBy(cls):
                    undeclared.append("%s.%s: %s" % (module, cls.__name__, iface.__name__))
        self.assertEqual(undeclared, [])


class StreamAndLogStoreSeamTests(SynchronousTestCase):
    """The stream queue and the default durable store, as instances."""

    def test_streamQueue(self):
        """A declared stream is an IQueue."""
        from otter_tx.broker.stream import StreamQueue

        broker = Broker(Clock())
        self.addCleanup(broker.streams.close)
        q = broker.vhosts["/"].declareQueue("s", None, durable=True, arguments={"x-queue-type": "stream"})
        self.assertIsInstance(q, StreamQueue)
        self.assertTrue(verifyClass(IQueue, StreamQueue))
        self.assertTrue(verifyObject(IQueue, q))
        self.assertTrue(verifyClass(IDeclaredQueue, StreamQueue))
        self.assertTrue(verifyObject(IDeclaredQueue, q))

    def test_logStore(self):
        """The log store (the default durable store) is an IMessageStore and an IStoreHealth."""
        from otter_tx.store.log.store import LogStore

        self.assertTrue(verifyClass(IMessageStore, LogStore))
        self.assertTrue(IStoreHealth.implementedBy(LogStore))
