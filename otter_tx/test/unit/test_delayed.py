"""
Deterministic tests (task.Clock) for the x-delayed-message exchange
(rabbitmq-delayed-message-exchange compatibility; ../shared/reference 5a).
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.amqp.codec import TaggedInt, encodeProperties
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.broker import Broker
from otter_tx.broker.delayed import messageDelay
from otter_tx.broker.message import Message
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.store.memory import MemoryStore
from otter_tx.testing import FakeClient, journaledBroker


def msg(delay, rk="k", body=b"m", exchange="dx", **props):
    headers = props.pop("headers", {})
    if delay is not None:
        headers["x-delay"] = delay
    props["headers"] = headers
    return Message(exchange, rk, encodeProperties(props), body)


class DelayParsingTests(SynchronousTestCase):
    """x-delay header values as the plugin reads them."""

    def test_values(self):
        """Integers, numeric strings and truncated floats delay; others route at once."""
        self.assertEqual(messageDelay(msg(100)), 100)
        self.assertEqual(messageDelay(msg(TaggedInt(5, "s"))), 5)
        self.assertEqual(messageDelay(msg("250")), 250)
        self.assertEqual(messageDelay(msg(1.9)), 1)
        self.assertEqual(messageDelay(msg(4294967295)), 4294967295)
        for value in (0, -5, 4294967296, "abc", True, None, [1]):
            self.assertIsNone(messageDelay(msg(value)), value)


class DelayedExchangeTests(SynchronousTestCase):
    """Holding, firing and routing."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.ex = self.vh.declareExchange("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        self.q = self.vh.declareQueue("q", None)
        self.vh.bind(self.ex, self.q, "k", {})

    def test_heldThenRouted(self):
        """A delayed message reaches the queue when its delay is over, with x-delay negated."""
        self.assertEqual(self.vh.publish(self.ex, msg(500)), (0, False))
        self.assertEqual(self.ex.held, 1)
        self.clock.advance(0.499)
        self.assertEqual(self.q.readyCount, 0)
        self.clock.advance(0.001)
        self.assertEqual(self.q.readyCount, 1)
        (e,) = self.q.readyEntries()
        self.assertEqual(e.message.headers["x-delay"], -500)
        self.assertEqual(self.ex.held, 0)

    def test_noDelayRoutesAtOnce(self):
        """Without a usable x-delay the message is routed synchronously."""
        self.assertEqual(self.vh.publish(self.ex, msg(None)), (1, False))
        self.assertEqual(self.vh.publish(self.ex, msg(-1)), (1, False))

    def test_bindingsEvaluatedAtFireTime(self):
        """A binding added during the delay receives the message."""
        self.vh.publish(self.ex, msg(100, rk="later"))
        late = self.vh.declareQueue("late", None)
        self.vh.bind(self.ex, late, "later", {})
        self.clock.advance(0.1)
        self.assertEqual(late.readyCount, 1)

    def test_orderByDueTime(self):
        """Messages fire in due order whatever the publish order."""
        for d, b in ((300, b"c"), (100, b"a"), (200, b"b")):
            self.vh.publish(self.ex, msg(d, body=b))
        self.clock.advance(0.3)
        self.assertEqual([e.message.body for e in self.q.readyEntries()], [b"a", b"b", b"c"])

    def test_alternateExchangeGetsItAtOnce(self):
        """An alternate-exchange receives a delayed message immediately (plugin limitation)."""
        ae = self.vh.declareQueue("ae-q", None)
        self.vh.declareExchange("ae", "fanout")
        self.vh.bind(self.vh.exchanges["ae"], ae, "", {})
        ex2 = self.vh.declareExchange("dx2", "x-delayed-message",
                                      arguments={"x-delayed-type": "fanout", "alternate-exchange": "ae"})
        self.vh.publish(ex2, msg(100, exchange="dx2"))
        self.assertEqual(ae.readyCount, 1)

    def test_messageTTLStartsInQueue(self):
        """Per-message expiration counts from when the message enters the queue."""
        self.vh.publish(self.ex, msg(1000, expiration="500"))
        self.clock.advance(1.0)
        self.assertEqual(self.q.readyCount, 1)
        self.clock.advance(0.5)
        self.assertEqual(self.q.readyCount, 0)

    def test_deleteDropsHeld(self):
        """Deleting the exchange loses its held messages."""
        self.vh.publish(self.ex, msg(100))
        self.vh.deleteExchange("dx")
        self.clock.advance(1)
        self.assertEqual(self.q.readyCount, 0)

    def test_declareErrors(self):
        """x-delayed-type missing, recursive or unknown gives the plugin's errors."""
        e = self.assertRaises(AMQPError, self.vh.declareExchange, "a", "x-delayed-message")
        self.assertEqual(
            (e.code, e.text),
            (406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"),
        )
        e = self.assertRaises(AMQPError, self.vh.declareExchange, "a", "x-delayed-message",
                              arguments={"x-delayed-type": "x-delayed-message"})
        self.assertEqual(
            e.text, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
        )
        e = self.assertRaises(AMQPError, self.vh.declareExchange, "a", "x-delayed-message",
                              arguments={"x-delayed-type": "nope"})
        self.assertEqual((e.code, e.text), (503, "COMMAND_INVALID - unknown exchange type 'nope'"))

    def test_manyHeldOneTimer(self):
        """100,000 held messages use one DelayedCall."""
        for i in range(100000):
            self.vh.publish(self.ex, msg(1 + (i * 7) % 60000))
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(60)
        self.assertEqual(self.q.readyCount, 100000)


class DelayedProtocolTests(SynchronousTestCase):
    """Client-visible effects of holding: returns and confirms at publish time."""

    def test_mandatoryReturnedAndConfirmedAtOnce(self):
        """A mandatory delayed publish is returned at once and acked; the message still arrives later."""
        clock = Clock()
        broker = Broker(clock)
        c = FakeClient(AMQPServerFactory(broker, clock, heartbeat=0))
        c.openChannel(1)
        c.send(1, spec.ExchangeDeclare(0, "dx", "x-delayed-message", arguments={"x-delayed-type": "direct"}))
        c.send(1, spec.QueueDeclare(0, "q"))
        c.send(1, spec.QueueBind(0, "q", "dx", "k"))
        c.send(1, spec.ConfirmSelect(False))
        c.received()
        c.publish(1, "dx", "k", b"later", props={"headers": {"x-delay": 200}}, mandatory=True)
        out = c.received()
        self.assertEqual([type(m) for _, m, _ in out], [spec.BasicReturn, spec.BasicAck])
        clock.advance(0.2)
        c.send(1, spec.BasicGet(0, "q", True))
        [(_, m, (props, body))] = c.received()
        self.assertEqual((body, props["headers"]["x-delay"]), (b"later", -200))


class DelayedDurabilityTests(SynchronousTestCase):
    """Held messages of a durable exchange survive a restart with absolute due times."""

    def boot(self, store, clock):
        return journaledBroker(store, clock)

    def test_restart(self):
        """Time spent down counts; overdue messages fire at boot; released ones are not kept."""
        clock = Clock()
        store = MemoryStore()
        b = self.boot(store, clock)
        vh = b.vhosts["/"]
        ex = vh.declareExchange("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        q = vh.declareQueue("q", None, durable=True)
        vh.bind(ex, q, "k", {})
        vh.publish(ex, msg(100, body=b"early", delivery_mode=2))
        vh.publish(ex, msg(1000, body=b"late", delivery_mode=2))
        vh.publish(ex, msg(5000, body=b"later", delivery_mode=2))
        clock.advance(0.1)
        self.assertEqual(q.readyCount, 1)
        b.stop()
        self.successResultOf(store.close())
        clock.advance(2)
        b = self.boot(store, clock)
        clock.advance(0)
        vh = b.vhosts["/"]
        q = vh.queues["q"]
        self.assertEqual([e.message.body for e in q.readyEntries()], [b"early", b"late"])
        self.assertEqual(vh.exchanges["dx"].held, 1)
        clock.advance(2.8)  # t = 4.9 s
        self.assertEqual(q.readyCount, 2)
        clock.advance(0.1)
        self.assertEqual(q.readyCount, 3)


def _storeState(store):
    """A deep copy of what a MemoryStore holds (its committed state at this instant)."""
    import copy

    return copy.deepcopy((store._entities, store._messages, store._refs, store._queues))


def _crash(broker, store, committed):
    """
    Stop ``broker`` and leave ``store`` as a kill -9 would: only the
    ``committed`` state (:func:`_storeState`) is left, and, as the durable
    store does when it is opened after an unclean stop, every entry is
    marked redelivered.
    """
    broker.stop()
    store._entities, store._messages, store._refs, store._queues = committed
    for entries in store._queues.values():
        for entry in entries.values():
            entry[3] = True
    store._open = False


class CrashRedeliveryTests(SynchronousTestCase):
    """
    After an unclean stop, a held message that may already have fired
    arrives again marked redelivered, with the same x-delayed-id
    (docs/delayed.md, "Durability and deletion").
    """

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_800_000_000)
        self.store = MemoryStore()
        self.boot()
        vh = self.broker.vhosts["/"]
        ex = vh.declareExchange("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        q = vh.declareQueue("q", None, durable=True)
        vh.bind(ex, q, "k", {})

    def boot(self):
        self.broker = journaledBroker(self.store, self.clock)
        self.vh = self.broker.vhosts["/"]
        self.factory = AMQPServerFactory(self.broker, self.clock)

    def consumer(self):
        """A FakeClient consuming q with acks on channel 1."""
        c = FakeClient(self.factory)
        c.send(1, spec.ChannelOpen(""))
        c.send(1, spec.BasicConsume(0, "q", "c", False, False, False, False, {}))
        c.kept = c.received()
        return c

    def deliveries(self, client):
        """``[(redelivered, x-delayed-id, body)]`` of the basic.delivers since the last call."""
        received, client.kept = client.kept + client.received(), []
        return [(m.redelivered, props["headers"].get("x-delayed-id"), body)
                for _, m, content in received if isinstance(m, spec.BasicDeliver)
                for props, body in [content]]

    def publish(self, delay, body):
        self.vh.publish(self.vh.exchanges["dx"], msg(delay, body=body, delivery_mode=2))

    def test_firedNotRecorded(self):
        """A message fired and delivered whose fire was not committed fires again at boot, redelivered, same id."""
        self.publish(100, b"a")
        self.publish(200, b"b")
        c = self.consumer()
        committed = _storeState(self.store)
        self.clock.advance(0.1)
        self.assertEqual(self.deliveries(c), [(False, "1", b"a")])
        _crash(self.broker, self.store, committed)
        self.clock.advance(5)
        self.boot()
        c = self.consumer()
        self.clock.advance(0)
        self.assertEqual(sorted(self.deliveries(c)), [(True, "1", b"a"), (True, "2", b"b")])
        self.assertEqual(self.vh.exchanges["dx"].held, 0)
        # the queue's stored entries carry the mark: a later crash still says redelivered
        key = "/\x00q"
        self.assertEqual(sorted(e[3] for e in self.store._queues[key].values()), [True, True])

    def test_notDueAtBoot(self):
        """A held message due after the broker came back cannot have fired: it fires later, not redelivered."""
        self.publish(100, b"due")
        self.publish(60000, b"later")
        committed = _storeState(self.store)
        self.clock.advance(0.1)
        _crash(self.broker, self.store, committed)
        self.clock.advance(1)
        self.boot()
        c = self.consumer()
        self.clock.advance(0)
        self.assertEqual(self.deliveries(c), [(True, "1", b"due")])
        self.clock.advance(60)
        self.assertEqual(self.deliveries(c), [(False, "2", b"later")])

    def test_cleanStop(self):
        """After a clean stop, messages that fell due while the broker was down fire as new."""
        self.publish(100, b"a")
        self.broker.stop()
        self.successResultOf(self.store.close())
        self.clock.advance(5)
        self.boot()
        c = self.consumer()
        self.clock.advance(0)
        self.assertEqual(self.deliveries(c), [(False, "1", b"a")])

    def test_recordedFireNotRepeated(self):
        """A fire committed before the crash is not repeated; new messages after the boot get new ids."""
        self.publish(100, b"a")
        self.publish(200, b"b")
        c = self.consumer()
        self.clock.advance(0.1)
        committed = _storeState(self.store)
        self.clock.advance(0.1)
        self.assertEqual(self.deliveries(c), [(False, "1", b"a"), (False, "2", b"b")])
        _crash(self.broker, self.store, committed)
        self.boot()
        c = self.consumer()
        self.clock.advance(0)
        # "a" was acked by no one: it is back from the queue, redelivered, as any recovered entry
        self.assertEqual(sorted(self.deliveries(c)), [(True, "1", b"a"), (True, "2", b"b")])
        self.publish(100, b"c")
        self.clock.advance(0.1)
        # ids 1..1000 were reserved before the crash: a new message's id was never given
        self.assertEqual(self.deliveries(c), [(False, "1001", b"c")])

    def test_cancelledAfterBoot(self):
        """A may-have-fired message cancelled after the boot, before it fires, is not delivered."""
        self.publish(100, b"a")
        committed = _storeState(self.store)
        self.clock.advance(0.1)
        _crash(self.broker, self.store, committed)
        self.boot()
        ex = self.vh.exchanges["dx"]
        self.assertTrue(ex.cancel("1"))
        self.assertEqual(ex._mayHaveFired, set())
        self.clock.advance(1)
        self.assertEqual(self.vh.queues["q"].readyCount, 0)
