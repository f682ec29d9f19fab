"""
Deterministic tests (task.Clock, a real Broker, no wire) for quorum queues
on one node and delivery limits (docs/quorum.md): declare rules, the
delivery count and ``x-delivery-count``, ``x-delivery-limit`` and the
``delivery-limit`` policy, dead-letter reason ``delivery_limit``, overflow,
global QoS, the management JSON and ``--default-delivery-limit``.  The
interop module ``test_interop_quorum`` checks the same rules against
RabbitMQ 3.10.
"""

from twisted.internet.testing import MemoryReactorClock
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.service import tap
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.broker import Broker
from otter_tx.broker.policy import OperatorPolicy, Policy, PolicyError
from otter_tx.test.unit.test_session import SessionTestCase
from otter_tx.test.unit.test_tap import _Parsing
from otter_tx.test.unit.test_ttl_dlx import BrokerTestCase, FakeConsumer, msg
from otter_tx.test.unit.test_web import WebTestCase

QQ = {"x-queue-type": "quorum"}


def qq(**extra):
    """Quorum declare arguments plus ``extra`` (underscores become dashes; the interop tests use it too)."""
    args = dict(QQ)
    for k, v in extra.items():
        args[k.replace("_", "-")] = v
    return args


class DeclareTests(BrokerTestCase):
    """Declare-time rules and texts of a quorum queue (RabbitMQ 3.10)."""

    def refused(self, name, durable=True, exclusive=False, autoDelete=False, arguments=QQ, **kw):
        """The (code, text) of the AMQPError a declare raises, the text without ``PRECONDITION_FAILED - ``."""
        e = self.assertRaises(AMQPError, self.vhost.declareQueue, name, None, durable=durable,
                              exclusive=exclusive, autoDelete=autoDelete, arguments=arguments, **kw)
        prefix = "PRECONDITION_FAILED - "
        self.assertTrue(e.text.startswith(prefix), e.text)
        return e.code, e.text[len(prefix):]

    def test_declare(self):
        """A durable quorum queue declares with type quorum and no priority levels."""
        q = self.vhost.declareQueue("q", None, durable=True, arguments=QQ)
        self.assertEqual((q.queueType, q.quorum, q.durable), ("quorum", True, True))
        self.assertEqual(self.declare("c").queueType, "classic")

    def test_flags(self):
        """Auto-delete, exclusive and non-durable are refused in that order of checks."""
        self.assertEqual(self.refused("q", durable=False, exclusive=True, autoDelete=True),
                         (406, "invalid property 'auto-delete' for queue 'q' in vhost '/'"))
        self.assertEqual(self.refused("q", durable=False, exclusive=True),
                         (406, "invalid property 'exclusive-owner' for queue 'q' in vhost '/'"))
        self.assertEqual(self.refused("q", durable=False),
                         (406, "invalid property 'non-durable' for queue 'q' in vhost '/'"))
        self.assertNotIn("q", self.vhost.queues)

    def test_unsupportedArguments(self):
        """x-max-priority and the other classic or stream arguments are refused of queue type rabbit_quorum_queue."""
        for key in ("x-max-priority", "x-queue-mode", "x-queue-master-locator", "x-queue-version", "x-max-age"):
            self.assertEqual(self.refused("q", arguments=qq(**{key: 1})),
                             (406, "invalid arg '%s' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"
                              % (key,)))

    def test_ownArguments(self):
        """Quorum-only arguments are accepted on a quorum queue; a bad strategy is invalid_dlx_strategy."""
        self.vhost.declareQueue("q", None, durable=True, arguments=qq(
            x_delivery_limit="x", x_max_in_memory_length=3, x_quorum_initial_group_size=3,
            **{"x-dead-letter-strategy": "at-least-once"}))
        self.assertEqual(self.refused("r", arguments=qq(**{"x-dead-letter-strategy": "no"})),
                         (406, "invalid arg 'x-dead-letter-strategy' for queue 'r' in vhost '/': invalid_dlx_strategy"))

    def test_classicRefusesQuorumArguments(self):
        """A classic queue still refuses x-dead-letter-strategy but takes x-delivery-limit (our extension)."""
        self.assertEqual(self.refused("q", arguments={"x-dead-letter-strategy": "at-most-once"}),
                         (406, "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/' of queue type "
                               "rabbit_classic_queue"))
        self.assertEqual(self.declare("c", **{"x-delivery-limit": 2}).settings.deliveryLimit, 2)

    def test_queueTypeValue(self):
        """An integer x-queue-type is an unacceptable type; an unknown type is unsupported."""
        self.assertEqual(self.refused("q", arguments={"x-queue-type": 1}),
                         (406, "invalid arg 'x-queue-type' for queue 'q' in vhost '/': {unacceptable_type,signedint}"))
        self.assertEqual(self.refused("q", arguments={"x-queue-type": "other"}),
                         (406, "invalid arg 'x-queue-type' for queue 'q' in vhost '/': "
                               "\"unsupported queue type 'other'\""))

    def test_serverNamed(self):
        """A server-named quorum queue is refused, whether named by the vhost or the session."""
        text = (406, "Cannot declare a server-named queue for type rabbit_quorum_queue")
        self.assertEqual(self.refused(""), text)
        self.assertEqual(self.refused("amq.gen-x", serverNamed=True), text)

    def test_redeclare(self):
        """Without x-queue-type a quorum queue is inequivalent, a classic one is not; the limit is compared."""
        self.vhost.declareQueue("q", None, durable=True, arguments=QQ)
        self.assertEqual(self.refused("q", arguments={}),
                         (406, "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received none but "
                               "current is the value 'quorum' of type 'longstr'"))
        self.assertEqual(self.refused("q", arguments=qq(x_delivery_limit=3)),
                         (406, "inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received the "
                               "value '3' of type 'signedint' but current is none"))
        self.vhost.declareQueue("c", None, durable=True, arguments={"x-queue-type": "classic"})
        self.vhost.declareQueue("c", None, durable=True, arguments={})

    def test_redeclareComparesOwnArguments(self):
        """A quorum queue compares its own arguments on redeclare, not the classic-only ones; a classic queue does not compare the quorum ones (nor its x-delivery-limit, as RabbitMQ does not)."""
        self.vhost.declareQueue("q", None, durable=True, arguments=QQ)
        self.vhost.declareQueue("q", None, durable=True, arguments=qq(x_max_priority=3, x_queue_mode="lazy"))
        self.assertEqual(self.refused("q", arguments=qq(**{"x-dead-letter-strategy": "at-least-once"}))[1],
                         "inequivalent arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': received the "
                         "value 'at-least-once' of type 'longstr' but current is none")
        self.vhost.declareQueue("c", None, durable=True)
        c = self.vhost.declareQueue("c", None, durable=True, arguments={
            "x-dead-letter-strategy": "at-least-once", "x-max-in-memory-length": 3, "x-delivery-limit": 3})
        self.assertIsNone(c.settings.deliveryLimit)


class DeleteTests(BrokerTestCase):
    """queue.delete of a quorum queue."""

    def test_conditionalRefused(self):
        """if-unused or if-empty is 540 naming the flag (if-unused first); a plain delete works."""
        q = self.vhost.declareQueue("q", None, durable=True, arguments=QQ)
        for kw, flag in ((dict(ifUnused=True), "if-unused"), (dict(ifEmpty=True), "if-empty"),
                         (dict(ifUnused=True, ifEmpty=True), "if-unused")):
            e = self.assertRaises(AMQPError, self.vhost.deleteQueue, q, **kw)
            self.assertEqual((e.code, e.text), (540, "NOT_IMPLEMENTED - cannot delete queue 'q' in vhost '/'. "
                                                     "queue.delete operations with %s flag set are not supported "
                                                     "by quorum queues" % (flag,)))
        self.vhost.deleteQueue(q)
        self.assertNotIn("q", self.vhost.queues)


class DeliveryCountTests(BrokerTestCase):
    """Returns counted per entry, the limit and dead-letter reason delivery_limit."""

    def setUp(self):
        BrokerTestCase.setUp(self)
        self.vhost.declareExchange("dlx", "fanout")
        self.dlq = self.declare("dlq")
        self.vhost.bind(self.vhost.exchanges["dlx"], self.dlq, "", {})

    def quorum(self, name="q", **extra):
        return self.vhost.declareQueue(name, None, durable=True, arguments=qq(**extra))

    def test_countAndHeader(self):
        """Each return adds one; get answers carry x-delivery-count from 0, consumer deliveries from 1."""
        q = self.quorum()
        self.publish("q", b"a", headers={"mine": 1})
        counts = []
        for _ in range(3):
            e = q.basicGet(False)
            counts.append(q.deliveredMessage(e, get=True).headers["x-delivery-count"])
            q.requeue([e])
        self.assertEqual(counts, [0, 1, 2])
        e = q.basicGet(False)
        m = q.deliveredMessage(e)
        self.assertEqual((m.headers["x-delivery-count"], m.headers["x-delivery-count"].tag, m.headers["mine"]),
                         (3, "l", 1))
        self.assertNotIn("x-delivery-count", e.message.headers)

    def test_firstConsumerDeliveryPlain(self):
        """A first delivery to a consumer sends the message itself (no copy, no header)."""
        q = self.quorum()
        self.publish("q")
        c = FakeConsumer()
        q.addConsumer(c)
        (e,) = c.delivered
        self.assertEqual(e.returns, 0)
        self.assertIs(q.deliveredMessage(e), e.message)

    def test_classicWithoutLimitUnchanged(self):
        """A classic queue without a limit never adds the header, even on a redelivery."""
        q = self.declare("c")
        self.publish("c")
        e = q.basicGet(False)
        q.requeue([e])
        e = q.basicGet(False)
        self.assertEqual(e.returns, 1)
        self.assertIs(q.deliveredMessage(e, get=True), e.message)

    def test_limitDeadLetters(self):
        """With x-delivery-limit 2 the third return dead-letters with reason delivery_limit and RabbitMQ's x-death."""
        q = self.quorum(x_delivery_limit=2, x_dead_letter_exchange="dlx")
        self.publish("q", b"poison", delivery_mode=2)
        n = 0
        while True:
            e = q.basicGet(False)
            if e is None:
                break
            n += 1
            q.requeue([e])
        self.assertEqual(n, 3)
        (m,) = self.drain(self.dlq)
        self.assertEqual(m.body, b"poison")
        self.assertNotIn("x-delivery-count", m.headers)
        (d,) = m.headers["x-death"]
        self.assertEqual((d["reason"], d["queue"], d["count"], d["exchange"], d["routing-keys"]),
                         ("delivery_limit", "q", 1, "", ["q"]))
        self.assertEqual(m.headers["x-first-death-reason"], "delivery_limit")
        self.assertEqual(self.vhost.deadLettered["delivery_limit"], 1)
        self.assertEqual((q.readyCount, q.unackedCount), (0, 0))

    def test_limitWithoutDlxDrops(self):
        """At the limit a queue without a dead-letter exchange drops the message (counted as disabled)."""
        q = self.quorum(x_delivery_limit=0)
        self.publish("q")
        q.requeue([q.basicGet(False)])
        self.assertEqual((q.readyCount, q.unackedCount), (0, 0))
        self.assertEqual(self.vhost.deadLetterDisabled["delivery_limit"], 1)

    def test_negativeAndNonIntegerLimit(self):
        """A negative limit allows one delivery (as 0 on 3.10); a non-integer one is no limit."""
        q = self.quorum("n", x_delivery_limit=-1)
        self.assertEqual(q.settings.deliveryLimit, -1)
        self.publish("n")
        q.requeue([q.basicGet(False)])
        self.assertEqual(q.readyCount, 0)
        self.assertIsNone(self.quorum("s", x_delivery_limit="x").settings.deliveryLimit)

    def test_policyLimit(self):
        """The delivery-limit policy applies; with an argument the lower wins, and an operator policy merges."""
        self.vhost.setPolicy(Policy("p", "^p", {"delivery-limit": 2}, applyTo="queues"))
        self.assertEqual(self.quorum("pa").settings.deliveryLimit, 2)
        self.assertEqual(self.quorum("pb", x_delivery_limit=5).settings.deliveryLimit, 2)
        self.assertEqual(self.quorum("pc", x_delivery_limit=1).settings.deliveryLimit, 1)
        self.vhost.setOperatorPolicy(OperatorPolicy("o", "^p", {"delivery-limit": 0}, applyTo="queues"))
        self.assertEqual(self.vhost.queues["pa"].settings.deliveryLimit, 0)

    def test_policyValidation(self):
        """A delivery-limit policy must be a non-negative integer, with RabbitMQ's texts."""
        e = self.assertRaises(PolicyError, Policy, "p", ".*", {"delivery-limit": -1})
        self.assertEqual(str(e), "-1 is not a valid delivery limit")
        e = self.assertRaises(PolicyError, Policy, "p", ".*", {"delivery-limit": "x"})
        self.assertEqual(str(e), '<<"x">> is not a valid delivery limit')
        OperatorPolicy("o", ".*", {"delivery-limit": 0})

    def test_classicExtension(self):
        """A classic queue with x-delivery-limit counts and dead-letters the same way."""
        q = self.declare("c", **{"x-delivery-limit": 0, "x-dead-letter-exchange": "dlx"})
        self.publish("c")
        e = q.basicGet(False)
        self.assertIs(q.deliveredMessage(e, get=True), e.message)
        q.requeue([e])
        (m,) = self.drain(self.dlq)
        self.assertEqual(m.headers["x-death"][0]["reason"], "delivery_limit")

    def test_restoredCountsOnce(self):
        """A message restored as redelivered counts as returned once."""
        q = self.quorum()
        q.restore(msg(b"r", "q"), 1, None, True)
        q.restore(msg(b"s", "q"), 2, None, False)
        e1, e2 = q.readyEntries()
        self.assertEqual((e1.returns, e2.returns), (1, 0))


class OverflowTests(BrokerTestCase):
    """x-overflow on a quorum queue (RabbitMQ 3.10's rabbit_fifo)."""

    def quorum(self, overflow):
        return self.vhost.declareQueue("q", None, durable=True,
                                       arguments=qq(x_max_length=2, x_overflow=overflow))

    def test_rejectPublishSoft(self):
        """reject-publish accepts the message that goes over the limit, refuses the next, drops nothing, and accepts again at 80 % of the limit."""
        q = self.quorum("reject-publish")
        self.assertEqual([q.enqueue(msg(b"%d" % i, "q")) for i in range(4)], [True, True, True, False])
        self.assertEqual(self.bodies(q), [b"0", b"1", b"2"])
        accepted = []
        for i in range(3):
            q.basicGet(True)
            accepted.append(q.enqueue(msg(b"x", "q")))
        self.assertEqual(accepted, [False, True, True])

    def test_rejectPublishBytes(self):
        """The byte limit is soft the same way: over it, publishes are refused until 80 % of it is left."""
        q = self.vhost.declareQueue("b", None, durable=True,
                                    arguments=qq(x_max_length_bytes=10, x_overflow="reject-publish"))
        self.assertEqual([q.enqueue(msg(b"12345", "b")) for _ in range(4)], [True, True, True, False])
        q.basicGet(True)
        self.assertFalse(q.enqueue(msg(b"1", "b")))
        q.basicGet(True)
        self.assertTrue(q.enqueue(msg(b"1", "b")))

    def test_rejectPublishDlxAsDropHead(self):
        """reject-publish-dlx acts as drop-head."""
        q = self.quorum("reject-publish-dlx")
        self.assertEqual(q.settings.overflow, "drop-head")
        self.assertEqual([q.enqueue(msg(b"%d" % i, "q")) for i in range(4)], [True] * 4)
        self.assertEqual(self.bodies(q), [b"2", b"3"])

    def test_atLeastOnceNeedsRejectPublish(self):
        """at-least-once holds only with reject-publish overflow; otherwise the strategy is at-most-once."""
        strategy = {"x-dead-letter-strategy": "at-least-once"}
        q = self.vhost.declareQueue("a", None, durable=True, arguments=qq(x_overflow="reject-publish", **strategy))
        self.assertEqual(q.settings.dlStrategy, "at-least-once")
        q = self.vhost.declareQueue("b", None, durable=True, arguments=qq(**strategy))
        self.assertEqual(q.settings.dlStrategy, "at-most-once")

    def test_prioritiesIgnored(self):
        """Message priorities do not reorder a quorum queue."""
        q = self.vhost.declareQueue("p", None, durable=True, arguments=QQ)
        q.enqueue(msg(b"low", "p", priority=1))
        q.enqueue(msg(b"high", "p", priority=9))
        self.assertEqual(self.bodies(q), [b"low", b"high"])


class SessionTests(SessionTestCase):
    """Consuming from a quorum queue through a Session."""

    def setUp(self):
        SessionTestCase.setUp(self)
        self.s.deleteQueue("q")
        self.s.declareQueue("q", durable=True, arguments=QQ)

    def test_globalQos(self):
        """A consume with a global prefetch set is 540 NOT_IMPLEMENTED naming the queue."""
        self.s.qos(5, global_=True)
        e = self.assertRaises(AMQPError, self.s.consume, "q", "c")
        self.assertEqual((e.code, e.text), (540, "NOT_IMPLEMENTED - queue 'q' in vhost '/' does not support global qos"))

    def test_perConsumerQosLiftsGlobal(self):
        """A per-consumer qos after a global one lifts the global prefetch, so the consume is accepted."""
        self.s.qos(5, global_=True)
        self.s.qos(3)
        self.assertEqual(self.s.globalPrefetch, 0)
        self.s.consume("q", "c")

    def test_exclusiveIgnored(self):
        """An exclusive consume does not keep another consumer off a quorum queue."""
        self.s.consume("q", "a", exclusive=True)
        self.s.consume("q", "b", exclusive=True)
        self.assertEqual(self.vh.queues["q"].consumerCount, 2)
        self.assertIsNone(self.vh.queues["q"].exclusiveConsumer)

    def test_redeliveryHeader(self):
        """A consumer's redelivery after a nack carries x-delivery-count 1."""
        sent = []
        self.conn.delivered = lambda number, consumer, tag, redelivered, message: sent.append(
            (redelivered, (message.headers or {}).get("x-delivery-count")))
        q = self.vh.queues["q"]
        q.enqueue(msg(b"x", "q"))
        self.s.consume("q", "c")
        self.s.nack(1, requeue=True)
        self.assertEqual(sent, [(False, None), (True, 1)])


class ManagementTests(WebTestCase):
    """The queue JSON of a quorum queue."""

    def test_json(self):
        """type quorum, and the node as leader, only member and online member; a classic queue has none of those."""
        self.vh.declareQueue("q", None, durable=True, arguments=QQ)
        self.vh.declareQueue("c", None, durable=True)
        q = self.get("/api/queues/%2F/q").json()
        self.assertEqual(q["type"], "quorum")
        self.assertEqual((q["members"], q["online"]), ([q["leader"]], [q["leader"]]))
        self.assertEqual(q["leader"], q["node"])
        c = self.get("/api/queues/%2F/c").json()
        self.assertEqual(c["type"], "classic")
        self.assertNotIn("leader", c)

    def test_declareOverHttp(self):
        """PUT /api/queues with x-queue-type quorum and durable false answers 400 with the 406 text."""
        r = self.put("/api/queues/%2F/q", {"durable": False, "arguments": QQ})
        self.assertEqual(r.code, 400)
        self.assertEqual(r.json(), {"error": "bad_request",
                                    "reason": "invalid property 'non-durable' for queue 'q' in vhost '/'"})


class DefaultLimitTests(_Parsing, SynchronousTestCase):
    """--default-delivery-limit N|unlimited."""

    def test_option(self):
        """unlimited (the default) is None; a number is taken, in the file too; junk is refused in one line."""
        self.assertIsNone(self.parse()["default-delivery-limit"])
        self.assertIsNone(self.parse("--default-delivery-limit", "unlimited")["default-delivery-limit"])
        self.assertEqual(self.parse("--default-delivery-limit", "20")["default-delivery-limit"], 20)
        path = self.config("default-delivery-limit = 20\n")
        self.assertEqual(self.parse("--config", path)["default-delivery-limit"], 20)
        path = self.config('default-delivery-limit = "unlimited"\n')
        self.assertIsNone(self.parse("--config", path)["default-delivery-limit"])
        self.assertEqual(self.refused("--default-delivery-limit", "-1"),
                         "--default-delivery-limit: must be a non-negative integer or \"unlimited\", got '-1'")
        self.refused("--default-delivery-limit", "many")
        o = tap.Options()
        o.parseOptions(["--amqp", "tcp:0", "--management", "tcp:0", "--data-dir", self.mktemp(),
                        "--default-delivery-limit", "20"])
        self.assertEqual(tap.makeService(o, reactor=MemoryReactorClock()).broker.defaultDeliveryLimit, 20)

    def test_appliesToQuorumOnly(self):
        """The default limits quorum queues without their own limit; classic queues and explicit limits keep theirs."""
        broker = Broker(Clock(), defaultDeliveryLimit=20)
        vh = broker.vhosts["/"]
        self.assertEqual(vh.declareQueue("q", None, durable=True, arguments=QQ).settings.deliveryLimit, 20)
        self.assertEqual(vh.declareQueue("r", None, durable=True, arguments=qq(x_delivery_limit=3))
                         .settings.deliveryLimit, 3)
        self.assertIsNone(vh.declareQueue("c", None).settings.deliveryLimit)


class AtLeastOnceTests(BrokerTestCase):
    """x-dead-letter-strategy at-least-once: dead letters no queue takes stay with the source queue."""

    def setUp(self):
        BrokerTestCase.setUp(self)
        self.vhost.declareExchange("dlx", "fanout")
        self.q = self.vhost.declareQueue("q", None, durable=True, arguments=qq(
            x_dead_letter_exchange="dlx", x_overflow="reject-publish",
            **{"x-dead-letter-strategy": "at-least-once"}))

    def rejectOne(self, body=b"x"):
        self.publish("q", body)
        self.q.reject([self.q.basicGet(False)])

    def test_heldUntilRetry(self):
        """A dead letter the DLX routes nowhere is held (messages_dlx), not ready, and sent on the retry after 180 s, not on a new binding."""
        self.rejectOne(b"held")
        self.assertEqual((self.q.readyCount, len(self.q.heldDeadLetters.messages), self.q.heldDeadLetters.bytes), (0, 1, 4))
        dlq = self.declare("dlq")
        self.vhost.bind(self.vhost.exchanges["dlx"], dlq, "", {})
        self.assertEqual(dlq.readyCount, 0)
        self.clock.advance(179.9)
        self.assertEqual(dlq.readyCount, 0)
        self.clock.advance(0.1)
        (m,) = self.drain(dlq)
        self.assertEqual((m.body, m.headers["x-death"][0]["reason"]), (b"held", "rejected"))
        self.assertIsNone(self.q.heldDeadLetters.messages)
        self.assertEqual(self.vhost.deadLettered["rejected"], 1)

    def test_missingExchangeHeldAndRetried(self):
        """With the DLX missing the message is held, and held again when the retry still finds no queue."""
        self.vhost.deleteExchange("dlx")
        self.rejectOne()
        self.clock.advance(180)
        self.assertEqual(len(self.q.heldDeadLetters.messages), 1)
        self.assertEqual(self.vhost.deadLetterDropped, 0)

    def test_routedAtOnce(self):
        """When the DLX routes to a queue the dead letter goes there at once."""
        dlq = self.declare("dlq")
        self.vhost.bind(self.vhost.exchanges["dlx"], dlq, "", {})
        self.rejectOne()
        self.assertEqual((dlq.readyCount, self.q.heldDeadLetters.messages), (1, None))

    def test_deleteForgets(self):
        """Deleting the queue drops its held dead letters and their timer."""
        self.rejectOne()
        self.vhost.deleteQueue(self.q)
        self.assertEqual((self.q.heldDeadLetters.messages, self.clock.getDelayedCalls()), (None, []))

    def test_json(self):
        """messages_dlx and message_bytes_dlx of a quorum queue count the held dead letters."""
        from otter_tx.web._format import queueDict

        self.rejectOne(b"abc")
        d = queueDict(self.q)
        self.assertEqual((d["messages_dlx"], d["message_bytes_dlx"], d["messages"]), (1, 3, 0))


class ExpiresTests(BrokerTestCase):
    """x-expires of a quorum queue."""

    def test_passiveDeclareDoesNotRenew(self):
        """A passive declare does not renew a quorum queue's lease; a full redeclare does."""
        args = qq(x_expires=1000)
        q = self.vhost.declareQueue("q", None, durable=True, arguments=args)
        self.clock.advance(0.9)
        self.vhost.declareQueue("q", None, durable=True, arguments=args)
        self.clock.advance(0.9)
        self.assertFalse(q.deleted)
        self.vhost.declareQueue("q", None, passive=True)
        self.clock.advance(0.1)
        self.assertTrue(q.deleted)


class RestartTests(SynchronousTestCase):
    """A quorum queue's messages through a deterministic restart (MemoryStore)."""

    def restart(self, store, clock, broker=None):
        from otter_tx.testing import journaledBroker

        if broker is not None:
            broker.stop()
            self.successResultOf(store.close())
        return journaledBroker(store, clock)

    def test_transientStored(self):
        """A transient message in a quorum queue survives a restart, in a durable classic queue it does not; an acked one is gone."""
        from otter_tx.store.memory import MemoryStore

        clock = Clock()
        store = MemoryStore()
        broker = self.restart(store, clock)
        vh = broker.vhosts["/"]
        q = vh.declareQueue("q", None, durable=True, arguments=QQ)
        vh.declareQueue("c", None, durable=True)
        for body in (b"acked", b"keep"):
            for name in ("q", "c"):
                vh.publish(vh.exchanges[""], msg(body, name))
        q.settle(q.basicGet(False))
        broker = self.restart(store, clock, broker)
        vh = broker.vhosts["/"]
        self.assertEqual([e.message.body for e in vh.queues["q"].readyEntries()], [b"keep"])
        self.assertEqual(vh.queues["c"].readyCount, 0)
        self.assertEqual(vh.queues["q"].queueType, "quorum")


class HttpGetTests(WebTestCase):
    """POST /api/queues/{vhost}/{name}/get on a quorum queue."""

    def test_deliveryCountHeader(self):
        """The answer's properties carry x-delivery-count, 0 then 1 after a requeue, as RabbitMQ 3.10's."""
        q = self.vh.declareQueue("q", None, durable=True, arguments=QQ)
        q.enqueue(msg(b"x", "q"))
        counts = []
        for _ in range(2):
            r = self.post("/api/queues/%2F/q/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
            (m,) = r.json()
            counts.append((m["redelivered"], m["properties"]["headers"]["x-delivery-count"]))
        self.assertEqual(counts, [(False, 0), (True, 1)])


class ClassicPolicyTests(BrokerTestCase):
    """The delivery-limit policy and classic queues."""

    def test_policyIgnoredOnClassic(self):
        """A delivery-limit policy does not limit a classic queue; its own x-delivery-limit does."""
        self.vhost.setPolicy(Policy("p", ".*", {"delivery-limit": 1}, applyTo="queues"))
        self.assertIsNone(self.declare("c").settings.deliveryLimit)
        self.assertEqual(self.declare("d", **{"x-delivery-limit": 3}).settings.deliveryLimit, 3)
        self.assertEqual(self.vhost.declareQueue("q", None, durable=True, arguments=QQ).settings.deliveryLimit, 1)
