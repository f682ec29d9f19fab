"""
Unit tests for otter_tx.broker.session: a Session on a task.Clock over a
real Broker, talking to a fake connection that records what it is asked to
send (no wire, no Twisted protocol).
"""

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyClass, verifyObject

from otter_tx.amqp.codec import encodeProperties
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.broker import Broker
from otter_tx.broker.interfaces import IConsumer, ISessionClient
from otter_tx.broker.session import Consumer, Session
from otter_tx.store.interface import StoreFailedError
from otter_tx.web.door import HTTPRequestConnection
from otter_tx import testing


class FakeConnection(testing.FakeConnection):
    """
    ``testing.FakeConnection`` recording the Session's outbound calls
    (:class:`~otter_tx.broker.interfaces.ISessionClient`) in ``sent`` as
    short tuples; :meth:`take` reads them by kind.
    """

    def __init__(self, user):
        testing.FakeConnection.__init__(self, name="fake", user=user)
        self.sent = []

    def connectionFailed(self, code, text):
        testing.FakeConnection.connectionFailed(self, code, text)
        self.sent.append(("close", code, text))

    def consumerCancelled(self, number, consumerTag):
        self.sent.append(("cancelled", consumerTag))

    def delivered(self, number, consumer, deliveryTag, redelivered, message):
        self.sent.append(("deliver", deliveryTag, redelivered, message.body))

    def returned(self, number, code, text, message):
        self.sent.append(("return", code, text, message.body))

    def confirmed(self, number, confirms):
        self.sent.append(("confirms", list(confirms)))

    def channelFailed(self, number, error):
        self.sent.append(("closeChannel", error.code, error.text))

    def take(self, kind):
        """The recorded calls of ``kind``, removed from the record."""
        got = [s[1:] for s in self.sent if s[0] == kind]
        self.sent = [s for s in self.sent if s[0] != kind]
        return got


class _Journal:
    def __init__(self):
        self.syncs = []

    def sync(self):
        d = Deferred()
        self.syncs.append(d)
        return d


class SessionTestCase(SynchronousTestCase):
    """A broker on a Clock, a queue ``q`` and one Session of guest."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.conn = FakeConnection(self.broker.users["guest"])
        self.conn.vhost = self.vh
        self.s = Session(self.broker, self.conn, self.vh, self.conn.user, 1)
        self.s.declareQueue("q")

    def publish(self, n=1, queue="q", props=None, session=None):
        s = session or self.s
        props = props or {}
        for i in range(n):
            s.publish(s.publishTarget(""), queue, False, encodeProperties(props), b"m%d" % (i,), props=props)

    def delivered(self):
        return [(tag, body) for tag, _, body in self.conn.take("deliver")]


class SeamTests(SynchronousTestCase):
    """The declared interfaces."""

    def test_verified(self):
        """Consumer provides IConsumer; the fake and the HTTP door provide ISessionClient."""
        verifyClass(IConsumer, Consumer)
        verifyClass(ISessionClient, FakeConnection)
        verifyClass(ISessionClient, HTTPRequestConnection)
        broker = Broker(Clock())
        verifyObject(ISessionClient, HTTPRequestConnection(broker, broker.users["guest"], broker.vhosts["/"]))


class HTTPDoorTests(SynchronousTestCase):
    """The HTTP door answers what a request can cause and refuses the rest as a bug."""

    def setUp(self):
        broker = Broker(Clock())
        self.door = HTTPRequestConnection(broker, broker.users["guest"], broker.vhosts["/"])

    def test_failuresRaised(self):
        """A failed channel or connection becomes the request's error (raised for its answer)."""
        error = AMQPError(406, "PRECONDITION_FAILED - x")
        self.assertIs(self.assertRaises(AMQPError, self.door.channelFailed, 0, error), error)
        e = self.assertRaises(AMQPError, self.door.connectionFailed, 541, "INTERNAL_ERROR - message store failed")
        self.assertEqual((e.code, e.text), (541, "INTERNAL_ERROR - message store failed"))

    def test_outcomesARequestCannotCause(self):
        """Deliveries, returns, confirms and cancels never reach a request: each is an UnexpectedOutcome."""
        from otter_tx.web.door import UnexpectedOutcome

        for call in (lambda: self.door.delivered(0, None, 1, False, None),
                     lambda: self.door.returned(0, 312, "NO_ROUTE", None),
                     lambda: self.door.confirmed(0, [(1, True)]),
                     lambda: self.door.noteConfirms(None),
                     lambda: self.door.consumerCancelled(0, "c")):
            self.assertRaises(UnexpectedOutcome, call)


class ConsumeTests(SessionTestCase):
    """Consumers, prefetch and back-pressure."""

    def test_prefetch(self):
        """A consumer with prefetch 2 gets two deliveries, a third after an ack."""
        self.publish(3)
        self.s.qos(2)
        self.s.consume("q", "c")
        self.assertEqual(self.delivered(), [(1, b"m0"), (2, b"m1")])
        self.s.ack(1)
        self.assertEqual(self.delivered(), [(3, b"m2")])

    def test_globalPrefetch(self):
        """Global prefetch bounds the session's unacked deliveries over all its consumers."""
        self.s.declareQueue("q2")
        self.publish(2)
        self.publish(2, "q2")
        self.s.qos(3, global_=True)
        self.s.consume("q", "a")
        self.s.consume("q2", "b")
        self.assertEqual(len(self.delivered()), 3)
        self.s.ack(0, multiple=True)
        self.assertEqual(len(self.delivered()), 1)

    def test_paused(self):
        """Nothing is delivered while the connection is paused; resumeDelivery sends what is waiting."""
        self.conn.paused = True
        self.publish(1)
        self.s.consume("q", "c")
        self.assertEqual(self.delivered(), [])
        self.conn.paused = False
        self.s.resumeDelivery()
        self.assertEqual(self.delivered(), [(1, b"m0")])

    def test_reusedTag(self):
        """A consumer tag in use is 530 NOT_ALLOWED."""
        self.s.consume("q", "c")
        e = self.assertRaises(AMQPError, self.s.consume, "q", "c")
        self.assertEqual(e.code, 530)

    def test_cancelledByBroker(self):
        """Deleting the queue tells the client its consumer was cancelled."""
        self.s.consume("q", "c")
        self.vh.deleteQueue(self.vh.queues["q"])
        self.assertEqual(self.conn.take("cancelled"), [("c",)])
        self.assertEqual(self.s.consumers, {})


class AckTests(SessionTestCase):
    """The unacked ledger: ack, nack, reject, recover."""

    def setUp(self):
        SessionTestCase.setUp(self)
        self.q = self.vh.queues["q"]
        self.publish(3)
        self.s.consume("q", "c")
        self.delivered()

    def test_ackSingleAndMultiple(self):
        """A single ack settles one delivery, multiple settles up to the tag."""
        self.s.ack(2)
        self.assertEqual(sorted(self.s.unacked), [1, 3])
        self.s.ack(3, multiple=True)
        self.assertEqual((self.s.unackedCount, self.q.unackedCount), (0, 0))

    def test_unknownTag(self):
        """An unknown delivery tag is 406 unknown delivery tag N."""
        e = self.assertRaises(AMQPError, self.s.ack, 9)
        self.assertEqual((e.code, e.text), (406, "PRECONDITION_FAILED - unknown delivery tag 9"))

    def test_nackRequeues(self):
        """nack multiple with requeue puts the deliveries back, redelivered."""
        self.s.cancel("c")
        self.s.nack(2, multiple=True, requeue=True)
        self.assertEqual(self.q.readyCount, 2)
        self.assertEqual(sorted(self.s.unacked), [3])

    def test_rejectDrops(self):
        """reject without requeue drops the message."""
        self.s.reject(1, requeue=False)
        self.assertEqual((self.q.readyCount, self.q.unackedCount), (0, 2))

    def test_recover(self):
        """recover redelivers every unacked delivery; requeue=false is 540."""
        self.s.recover()
        self.assertEqual([r for _, r, _ in self.conn.take("deliver")], [True, True, True])
        self.assertRaises(AMQPError, self.s.recover, False)

    def test_closedRequeues(self):
        """Closing the session requeues the unacked and cancels the consumer."""
        self.s.close()
        self.assertEqual((self.q.readyCount, self.q.consumerCount), (3, 0))
        self.s.close()

    def test_ackTimeout(self):
        """An unacked delivery older than the limit closes the channel with 406."""
        self.s.checkAckTimeout(self.clock.seconds() - 1, 1000)
        self.assertEqual(self.conn.take("closeChannel"), [])
        self.clock.advance(2)
        self.s.checkAckTimeout(self.clock.seconds() - 1, 1000)
        [(code, text)] = self.conn.take("closeChannel")
        self.assertEqual(code, 406)
        self.assertIn("delivery acknowledgement on channel 1 timed out", text)


class TxTests(SessionTestCase):
    """Transactions."""

    def test_commit(self):
        """Publishes and acks in a transaction take effect at commit."""
        self.publish(1)
        got = self.s.get("q")
        self.s.txSelect()
        self.publish(1)
        self.s.ack(got[0])
        q = self.vh.queues["q"]
        self.assertEqual((q.readyCount, q.unackedCount), (0, 1))
        done = []
        self.s.txCommit(lambda: done.append(True))
        self.assertEqual((q.readyCount, q.unackedCount, done), (1, 0, [True]))

    def test_rollback(self):
        """Rollback drops publishes and makes the held acks unacked again."""
        self.publish(1)
        got = self.s.get("q")
        self.s.txSelect()
        self.publish(1)
        self.s.ack(got[0])
        self.s.txRollback()
        self.assertEqual(list(self.s.unacked), [got[0]])
        self.assertEqual(self.vh.queues["q"].readyCount, 0)

    def test_modes(self):
        """tx and confirm modes exclude each other; commit outside tx is 406."""
        self.assertRaises(AMQPError, self.s.txCommit, lambda: None)
        self.s.confirmSelect()
        self.assertRaises(AMQPError, self.s.txSelect)


class ConfirmTests(SessionTestCase):
    """Publisher confirms, ordered behind the store's sync."""

    def setUp(self):
        SessionTestCase.setUp(self)
        self.s.confirmSelect()

    def test_transientConfirmedAtFlush(self):
        """A transient publish is confirmed at the flush, with no sync."""
        self.publish(2)
        self.assertEqual(self.conn.noted, [self.s, self.s])
        self.s.flushConfirms()
        self.assertEqual(self.conn.take("confirms"), [([(1, True), (2, True)],)])

    def _markStored(self):
        # a persistent message in a durable queue: the session must wait for the sync
        self.s._needSync = True

    def test_afterSync(self):
        """A batch with a stored message is confirmed only after the journal's sync fires."""
        self.broker.journal = _Journal()
        self.publish(1)
        self._markStored()
        self.s.flushConfirms()
        self.publish(1)
        self.s.flushConfirms()
        self.assertEqual(self.conn.take("confirms"), [])
        self.broker.journal.syncs[0].callback(None)
        self.assertEqual(self.conn.take("confirms"), [([(1, True)],), ([(2, True)],)])

    def test_nackOnStoreFailed(self):
        """A failed sync (StoreFailedError) nacks the whole batch and keeps the connection."""
        self.broker.journal = _Journal()
        self.publish(2)
        self._markStored()
        self.s.flushConfirms()
        self.broker.journal.syncs[0].errback(StoreFailedError("store.db", "disk full"))
        self.assertEqual(self.conn.take("confirms"), [([(1, False), (2, False)],)])
        self.assertEqual(self.conn.take("close"), [])

    def test_rejectPublishNacks(self):
        """A queue at its reject-publish limit nacks the publish."""
        self.s.declareQueue("full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
        self.publish(1, "full")
        self.s.flushConfirms()
        self.assertEqual(self.conn.take("confirms"), [([(1, False)],)])


class PublishTests(SessionTestCase):
    """Publishing through the session."""

    def test_mandatoryReturned(self):
        """An unroutable mandatory publish is returned 312 NO_ROUTE."""
        self.s.publish(self.s.publishTarget(""), "nowhere", True, b"\x00\x00", b"x")
        self.assertEqual(self.conn.take("return"), [(312, "NO_ROUTE", b"x")])

    def test_replyTo(self):
        """reply_to amq.rabbitmq.reply-to needs a reply consumer, and is rewritten to its address."""
        props = {"reply_to": "amq.rabbitmq.reply-to"}
        e = self.assertRaises(AMQPError, self.publish, 1, "q", props)
        self.assertEqual((e.code, e.text), (406, "PRECONDITION_FAILED - fast reply consumer does not exist"))
        self.s.consume("amq.rabbitmq.reply-to", noAck=True)
        self.publish(1, "q", props)
        got = self.s.get("q", noAck=True)
        self.assertTrue(got[1].message.props["reply_to"].startswith("amq.rabbitmq.reply-to."))


class DeclareTests(SessionTestCase):
    """Declares and deletes with the user's permissions."""

    def test_refused(self):
        """A user without configure permission gets 403 on declare and delete."""
        self.broker.addUser("u", "pw")
        self.broker.setPermissions("u", "/", "^only-this$", "^only-this$", "^only-this$")
        s = Session(self.broker, FakeConnection(self.broker.users["u"]), self.vh, self.broker.users["u"])
        for call in (lambda: s.declareQueue("x"), lambda: s.deleteQueue("q"),
                     lambda: s.declareExchange("x", "direct"), lambda: s.purgeQueue("q"),
                     lambda: s.get("q"), lambda: s.bindQueue("q", "amq.direct", "k")):
            self.assertEqual(self.assertRaises(AMQPError, call).code, 403)
        s.declareQueue("only-this")
        self.assertEqual(s.deleteQueue("only-this"), 0)
        self.assertIsNone(s.deleteQueue("only-this"))
