"""
The queue seam's contract as tests, the way ``StoreContractMixin``
(``test_store.py``) states the store's: what a Session may rely on from an
:class:`~otter_tx.broker.interfaces.IQueue`, whatever stands behind it.

The contract is split in two, as the interfaces are:

- :class:`ConsumerSourceContractMixin`: every
  :class:`~otter_tx.broker.interfaces.IConsumerSource` (routed messages in,
  deliveries out to registered consumers, no-ack deliveries only).  The
  direct reply-to pseudo-queue implements only this part: it holds
  nothing, so it has no ready messages, gets, settles or purges.
- :class:`QueueContractMixin`: every ``IQueue`` (also runs the first):
  ready messages, basic.get, settle, requeue (redelivered), reject,
  purge, the exclusive-consume rule and the requeue holds.

Run here against the classic queue, the quorum queue, the direct reply-to
pseudo-queue and a queue on another node (the cluster's RemoteQueue), and
in ``test_stream.py`` against the stream queue (StreamContractTests, which
overrides the tests of what a stream refuses); testing.py has no fake
queue (the unit tests use real queues on a ``task.Clock``).  A new kind
runs the same mixins: subclass one with a ``SynchronousTestCase`` and give
:meth:`makeSource`.
"""

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.interfaces import IConsumer, IConsumerSource, IDeclaredQueue, IQueue
from otter_tx.broker.message import Message
from otter_tx.broker.replyto import ReplyToQueue


@implementer(IConsumer)
class RecordingConsumer:
    """
    A consumer that records ``(queue, entry)`` of each delivery in
    ``delivered``; ``room`` (bool) is what :meth:`canTake` answers.
    """

    def __init__(self, tag="c", noAck=True, priority=0, prefetch=0, arguments=None):
        self.tag = tag
        self.noAck = noAck
        self.priority = priority
        self.prefetch = prefetch
        self.arguments = arguments
        self.room = True
        self.delivered = []
        self.cancelled = False

    def canTake(self):
        return self.room

    def deliver(self, queue, entry):
        self.delivered.append((queue, entry))

    def cancelledByBroker(self, queue):
        self.cancelled = True


class _Feeder:
    """A requeue feeder that has nothing left to hand over."""

    def finish(self):
        pass


class ConsumerSourceContractMixin:
    """
    The :class:`~otter_tx.broker.interfaces.IConsumerSource` contract.
    Subclasses define :meth:`makeSource`; ``self.clock`` is the
    ``task.Clock`` it runs on.
    """

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.broker = Broker(self.clock)
        self.vhost = self.broker.vhosts["/"]
        self.source = self.makeSource()

    def makeSource(self):
        """The IConsumerSource under test, on ``self.vhost``."""
        raise NotImplementedError()

    def pump(self):
        """Let what the source started finish (a queue on another node: the link's frames)."""

    def result(self, value):
        """The outcome of a call that a queue on another node answers later (a Deferred there)."""
        return value

    def message(self, body=b"m"):
        """A message as published to the default exchange with the source's name as routing key."""
        return Message("", self.source.name, encodeProperties({}), body)

    def test_interface(self):
        """The source provides IConsumerSource."""
        self.assertTrue(verifyObject(IConsumerSource, self.source))

    def test_enqueueDelivers(self):
        """A routed message goes to a registered no-ack consumer with room, as a fresh entry of this source."""
        c = RecordingConsumer()
        self.source.addConsumer(c)
        self.pump()
        m = self.message(b"hello")
        self.assertTrue(self.source.enqueue(m))
        self.pump()
        [(queue, entry)] = c.delivered
        self.assertIs(queue, self.source)
        self.assertIs(entry.message, m)
        self.assertEqual((entry.redelivered, entry.returns), (False, 0))

    def test_deliveredMessage(self):
        """deliveredMessage of a delivered entry is a message with the published body."""
        c = RecordingConsumer()
        self.source.addConsumer(c)
        self.pump()
        self.source.enqueue(self.message(b"body"))
        self.pump()
        [(_, entry)] = c.delivered
        self.assertEqual(self.source.deliveredMessage(entry).body, b"body")

    def test_removedConsumerGetsNothing(self):
        """After removeConsumer, a routed message does not reach the consumer."""
        c = RecordingConsumer()
        self.source.addConsumer(c)
        self.pump()
        self.source.removeConsumer(c)
        self.pump()
        self.source.enqueue(self.message())
        self.pump()
        self.source.dispatch()
        self.pump()
        self.assertEqual(c.delivered, [])

    def test_removeUnknownConsumer(self):
        """Removing a consumer that was never added is not an error."""
        self.source.removeConsumer(RecordingConsumer())
        self.pump()

    def test_dispatchAndRequeueOfNothing(self):
        """dispatch() with no consumer and requeue([]) are harmless."""
        self.source.dispatch()
        self.pump()
        self.source.requeue([])
        self.pump()
        self.source.requeue([], dispatch=False)
        self.pump()


class QueueContractMixin(ConsumerSourceContractMixin):
    """
    The :class:`~otter_tx.broker.interfaces.IQueue` contract (includes the
    :class:`ConsumerSourceContractMixin` one).
    """

    def get(self):
        """basic.get with acknowledgement: the entry (asserted present)."""
        entry = self.result(self.source.basicGet(False))
        self.assertIsNotNone(entry)
        return entry

    def test_interface(self):
        """The queue provides IQueue, and its clock is an IReactorTime."""
        self.assertTrue(verifyObject(IQueue, self.source))
        self.assertTrue(IReactorTime.providedBy(self.source.clock))

    def test_declaredInterface(self):
        """
        The queue provides IDeclaredQueue (what the vhost, the exchanges and
        the management views use), with the values its kind has.
        """
        self.assertTrue(verifyObject(IDeclaredQueue, self.source))
        self.assertIs(self.source.deleted, False)
        self.assertIs(self.source.down, False)
        self.assertIn(self.source.queueType, ("classic", "quorum", "stream"))
        self.assertEqual(self.source.remote, self.source.name in self.source.vhost.remoteQueues)
        self.assertEqual(self.source.stream is not None, self.source.queueType == "stream")

    def test_keptWithoutConsumer(self):
        """A message with no consumer is kept: readyCount counts it until a get takes it."""
        self.assertTrue(self.source.enqueue(self.message(b"a")))
        self.pump()
        self.assertEqual(self.source.readyCount, 1)
        entry = self.get()
        self.assertEqual((entry.message.body, entry.redelivered), (b"a", False))
        self.assertEqual(self.source.readyCount, 0)
        self.source.settle(entry)
        self.pump()
        self.assertIsNone(self.result(self.source.basicGet(False)))

    def test_getEmpty(self):
        """basic.get on an empty queue is None."""
        self.assertIsNone(self.result(self.source.basicGet(True)))
        self.assertIsNone(self.result(self.source.basicGet(False)))

    def test_order(self):
        """A consumer added later gets the ready messages in publish order."""
        for body in (b"1", b"2", b"3"):
            self.source.enqueue(self.message(body))
            self.pump()
        c = RecordingConsumer(noAck=False)
        self.source.addConsumer(c)
        self.pump()
        self.assertEqual([e.message.body for _, e in c.delivered], [b"1", b"2", b"3"])
        self.assertEqual(self.source.readyCount, 0)

    def test_canTakeRespected(self):
        """A consumer without room gets nothing until dispatch() after it has room again."""
        c = RecordingConsumer(noAck=False)
        c.room = False
        self.source.addConsumer(c)
        self.pump()
        self.source.enqueue(self.message())
        self.pump()
        self.pump()
        self.assertEqual((c.delivered, self.source.readyCount), ([], 1))
        c.room = True
        self.source.dispatch()
        self.pump()
        self.pump()
        self.assertEqual(len(c.delivered), 1)

    def test_consumerCount(self):
        """consumerCount follows addConsumer and removeConsumer."""
        a, b = RecordingConsumer("a"), RecordingConsumer("b")
        self.source.addConsumer(a)
        self.pump()
        self.source.addConsumer(b)
        self.pump()
        self.assertEqual(self.source.consumerCount, 2)
        self.source.removeConsumer(a)
        self.pump()
        self.assertEqual(self.source.consumerCount, 1)

    def test_requeueRedelivered(self):
        """A requeued entry is ready again and comes back marked redelivered, with the same message."""
        self.source.enqueue(self.message(b"x"))
        self.pump()
        entry = self.get()
        self.source.requeue([entry])
        self.pump()
        self.assertEqual(self.source.readyCount, 1)
        again = self.get()
        self.assertEqual((again.message.body, again.redelivered), (b"x", True))

    def test_rejectDrops(self):
        """A rejected entry (no dead-letter exchange) is gone."""
        self.source.enqueue(self.message())
        self.pump()
        self.source.reject([self.get()])
        self.pump()
        self.assertEqual(self.source.readyCount, 0)
        self.assertIsNone(self.result(self.source.basicGet(False)))

    def test_purge(self):
        """purge() drops the ready messages and says how many."""
        for _ in range(3):
            self.source.enqueue(self.message())
            self.pump()
        self.assertEqual(self.result(self.source.purge()), 3)
        self.pump()
        self.assertEqual(self.source.readyCount, 0)

    def test_checkConsumeAcceptsAPlainConsumer(self):
        """checkConsume accepts a manual-ack consumer with a prefetch and no x-arguments (None)."""
        self.assertIsNone(self.source.checkConsume(False, 10, {}))

    def test_exclusiveConsumer(self):
        """An exclusive consumer refuses every other until it goes; an exclusive one is refused beside others."""
        self.assertFalse(self.result(self.source.refusesConsumer(True)))
        a = RecordingConsumer("a")
        self.source.addConsumer(a, exclusive=True)
        self.pump()
        self.assertTrue(self.result(self.source.refusesConsumer(False)))
        self.source.removeConsumer(a)
        self.pump()
        self.assertFalse(self.result(self.source.refusesConsumer(False)))
        self.source.addConsumer(RecordingConsumer("b"))
        self.pump()
        self.assertTrue(self.result(self.source.refusesConsumer(True)))
        self.assertFalse(self.result(self.source.refusesConsumer(False)))

    def test_requeueHold(self):
        """While a feeder holds the queue, requeued entries are not delivered; after release they are."""
        self.source.enqueue(self.message(b"x"))
        self.pump()
        entry = self.get()
        c = RecordingConsumer(noAck=False)
        self.source.addConsumer(c)
        self.pump()
        feeder = _Feeder()
        self.source.holdRequeue(feeder)
        self.pump()
        self.source.requeue([entry], dispatch=False)
        self.pump()
        self.clock.advance(0)
        self.assertEqual(c.delivered, [])
        self.source.releaseRequeue(feeder)
        self.pump()
        self.clock.advance(0)
        self.source.dispatch()
        self.pump()
        [(_, again)] = c.delivered
        self.assertEqual((again.message.body, again.redelivered), (b"x", True))


class ClassicQueueContractTests(QueueContractMixin, SynchronousTestCase):
    """A classic queue keeps the IQueue contract."""

    def makeSource(self):
        return self.vhost.declareQueue("classic", None)

    def test_quorumFlag(self):
        """A classic queue is not quorum."""
        self.assertFalse(self.source.quorum)

    def test_declared(self):
        """A declare of the queue (VHost.declareQueue's passive and redeclare) answers with the queue itself."""
        self.assertIs(self.source.declared(renew=True), self.source)
        self.assertIs(self.source.declared(renew=False), self.source)

    def test_checkConsumeAcceptsAll(self):
        """A classic queue has no consume rules of its own: no-ack, no prefetch, any arguments."""
        self.assertIsNone(self.source.checkConsume(True, 0, {"x-stream-offset": "first"}))


class QuorumQueueContractTests(QueueContractMixin, SynchronousTestCase):
    """A quorum queue keeps the IQueue contract."""

    def makeSource(self):
        return self.vhost.declareQueue("quorum", None, durable=True, arguments={"x-queue-type": "quorum"})

    def test_quorumFlag(self):
        """A quorum queue says so (the Session's quorum rules read it)."""
        self.assertTrue(self.source.quorum)


class ReplyToContractTests(ConsumerSourceContractMixin, SynchronousTestCase):
    """The direct reply-to pseudo-queue keeps the IConsumerSource contract (it is not an IQueue)."""

    def makeSource(self):
        return ReplyToQueue(self.vhost)

    def test_notAQueue(self):
        """It holds nothing, so it does not claim IQueue."""
        self.assertFalse(IQueue.providedBy(self.source))


class RemoteQueueContractTests(QueueContractMixin, SynchronousTestCase):
    """
    A queue on another node (:class:`~otter_tx.cluster.remote.RemoteQueue`)
    keeps the IQueue contract: two brokers on one ``task.Clock``, joined
    through a :class:`~otter_tx.cluster.metadata.MemoryMetadata` and a link
    over an in-memory transport (``twisted.test.iosim``); the queue lives on
    node ``a``, the source under test is node ``b``'s view of it.
    """

    def setUp(self):
        from twisted.test import iosim

        from otter_tx.cluster.link import LinkProtocol
        from otter_tx.cluster.metadata import MemoryMetadata
        from otter_tx.cluster.node import ClusterNode

        self.clock = Clock()
        self.clock.advance(1000)
        meta = MemoryMetadata(self.clock)
        self.home = Broker(self.clock)
        self.broker = Broker(self.clock)
        self.vhost = self.broker.vhosts["/"]
        nodes = []
        for name, broker in (("a", self.home), ("b", self.broker)):
            node = ClusterNode(broker, name, meta, self.clock)
            node._dial = lambda peer: None
            self.successResultOf(node.start(1))
            nodes.append(node)
        self.addCleanup(lambda: [n.stop() for n in nodes])
        dialler, server = LinkProtocol(nodes[0], dialled="b"), LinkProtocol(nodes[1])
        self.io = iosim.connect(server, iosim.FakeTransport(server, True), dialler,
                                iosim.FakeTransport(dialler, False))
        self.pump()
        self.result(self.home.vhosts["/"].declareQueue("remote", None))
        self.pump()
        self.source = self.vhost.remoteQueues["remote"]
        self.homeQueue = self.home.vhosts["/"].queues["remote"]

    def pump(self):
        for _ in range(6):
            self.clock.advance(0)
            self.io.flush()
        # the home node's figures (readyCount, consumers) come once a second
        self.clock.advance(1)
        self.io.flush()
        self.clock.advance(0)

    def result(self, value):
        from twisted.internet.defer import Deferred

        if isinstance(value, Deferred):
            self.pump()
            return self.successResultOf(value)
        return value

    def test_quorumFlag(self):
        """A classic queue on another node is not quorum."""
        self.assertFalse(self.source.quorum)

    def test_declared(self):
        """A declare of the queue here answers (later) with this node's view of it, counts from home."""
        self.homeQueue.enqueue(self.message())
        self.assertIs(self.result(self.source.declared(renew=True)), self.source)
        self.assertEqual(self.source.readyCount, 1)

    def test_linkConsumerIsAnIConsumer(self):
        """A consumer here is, on the home queue, a LinkConsumer that provides IConsumer."""
        from otter_tx.cluster.remote import LinkConsumer

        self.source.addConsumer(RecordingConsumer(noAck=False, prefetch=3))
        self.pump()
        [home] = self.homeQueue.consumers
        self.assertIsInstance(home, LinkConsumer)
        self.assertTrue(verifyObject(IConsumer, home))
        self.assertEqual(home.prefetch, 3)

    def test_enqueueWhileHomeDown(self):
        """While its home node is down, enqueue is None (unroutable, IConsumerSource.enqueue); after, True."""
        self.source.homeDown()
        self.assertIsNone(self.source.enqueue(self.message()))
        self.source.homeUp()
        self.assertTrue(self.source.enqueue(self.message()))

    def test_homeHoldsTheMessages(self):
        """Published through node b, the message is in node a's queue."""
        self.source.enqueue(self.message(b"there"))
        self.pump()
        self.assertEqual(self.homeQueue.readyCount, 1)

    def test_enqueueDelivers(self):
        """
        A routed message reaches a no-ack consumer with room as a fresh entry
        of this source: a copy (it crossed the link), same exchange, routing
        key, property bytes and body.
        """
        c = RecordingConsumer()
        self.source.addConsumer(c)
        self.pump()
        m = self.message(b"hello")
        self.assertTrue(self.source.enqueue(m))
        self.pump()
        [(queue, entry)] = c.delivered
        self.assertIs(queue, self.source)
        self.assertEqual((entry.message.exchange, entry.message.routingKey, entry.message.propsRaw,
                          entry.message.body), (m.exchange, m.routingKey, m.propsRaw, m.body))
        self.assertEqual((entry.redelivered, entry.returns), (False, 0))
