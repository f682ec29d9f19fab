"""
Deterministic tests (task.Clock) for message TTL, queue expiry,
dead-lettering, length limits and policies in otter_tx.broker
(../shared/reference sections 1-4; https://www.rabbitmq.com/docs/ttl, /dlx,
/maxlength).
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from otter_tx.amqp.codec import TaggedInt, Timestamp, encodeProperties
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.broker import Broker
from otter_tx.broker.interfaces import IConsumer
from otter_tx.broker.message import Message, parseExpiration
from otter_tx.broker.policy import PolicyError


class FakeChannel:
    """
    What the FakeConsumers of one channel share, as a real channel's
    consumers do: the connection's ``paused`` (output backed up) and the
    channel's global prefetch (``globalPrefetch``, 0 = unlimited) counted
    against ``unackedCount``.
    """

    def __init__(self, globalPrefetch=0):
        self.paused = False
        self.globalPrefetch = globalPrefetch
        self.unackedCount = 0


@implementer(IConsumer)
class FakeConsumer:
    """
    A consumer with a prefetch limit that records deliveries; it honours
    ``canTake``'s contract (paused connection, consumer and global prefetch)
    through its :class:`FakeChannel`.
    """

    _tags = 0

    def __init__(self, prefetch=0, noAck=False, priority=0, channel=None, tag=None):
        if tag is None:
            FakeConsumer._tags += 1
            tag = "ctag-%d" % (FakeConsumer._tags,)
        self.tag = tag
        self.prefetch = prefetch
        self.noAck = noAck
        self.priority = priority
        self.arguments = None
        self.channel = channel if channel is not None else FakeChannel()
        self.delivered = []
        self.cancelled = False

    def canTake(self):
        ch = self.channel
        if ch.paused:
            return False
        if self.noAck:
            return True
        if self.prefetch and len(self.delivered) >= self.prefetch:
            return False
        g = ch.globalPrefetch
        return not (g and ch.unackedCount >= g)

    def deliver(self, queue, entry):
        self.delivered.append(entry)
        if not self.noAck:
            self.channel.unackedCount += 1

    def cancelledByBroker(self, queue):
        self.cancelled = True


def msg(body=b"x", rk="q", exchange="", **props):
    """A Message as published with ``props``."""
    return Message(exchange, rk, encodeProperties(props), body)


class BrokerTestCase(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.broker = Broker(self.clock)
        self.vhost = self.broker.vhosts["/"]

    def declare(self, name, **args):
        return self.vhost.declareQueue(name, None, arguments=args)

    def publish(self, rk, body=b"x", exchange="", **props):
        m = msg(body, rk, exchange, **props)
        return self.vhost.publish(self.vhost.exchanges[exchange], m)

    def bodies(self, q):
        return [e.message.body for e in q.readyEntries()]

    def drain(self, q):
        out = []
        while True:
            e = q.basicGet(True)
            if e is None:
                return out
            out.append(e.message)


class ExpirationParsingTests(SynchronousTestCase):
    """The expiration property is parsed like Erlang string:to_integer (reference 1.4)."""

    def test_accepted(self):
        """'+100', '007', '0' and the 10-year maximum are accepted."""
        self.assertEqual(parseExpiration("+100"), 100)
        self.assertEqual(parseExpiration("007"), 7)
        self.assertEqual(parseExpiration("0"), 0)
        self.assertEqual(parseExpiration("315360000000"), 315360000000)

    def test_rejectedTexts(self):
        """Invalid values give 406 with RabbitMQ's exact texts."""
        cases = {
            "abc": "invalid expiration 'abc': no_integer",
            "": "invalid expiration '': no_integer",
            "  100": "invalid expiration '  100': no_integer",
            "-1": "invalid expiration '-1': {value_negative,-1}",
            "1.5": "invalid expiration '1.5': {leftover_string,\".5\"}",
            "100 ": "invalid expiration '100 ': {leftover_string,\" \"}",
            "1e3": "invalid expiration '1e3': {leftover_string,\"e3\"}",
            "315360000001": "invalid expiration '315360000001': {value_too_large,315360000001}",
        }
        for value, text in cases.items():
            e = self.assertRaises(AMQPError, parseExpiration, value)
            self.assertEqual(e.code, 406)
            self.assertEqual(e.text, "PRECONDITION_FAILED - " + text)


class MessageTTLTests(BrokerTestCase):
    """Per-message and per-queue TTL with prompt reaping."""

    def test_queueTTL(self):
        """x-message-ttl expires messages on time without any consumer."""
        q = self.declare("q", **{"x-message-ttl": 100})
        self.publish("q")
        self.clock.advance(0.099)
        self.assertEqual(q.readyCount, 1)
        self.clock.advance(0.001)
        self.assertEqual(q.readyCount, 0)

    def test_promptReapingBehindHead(self):
        """A short-TTL message behind a long-TTL head is reaped on time (RabbitMQ waits for the head)."""
        q = self.declare("q")
        self.publish("q", b"long", expiration="60000")
        self.publish("q", b"short", expiration="50")
        self.clock.advance(0.05)
        self.assertEqual(q.readyCount, 1)
        self.assertEqual(self.bodies(q), [b"long"])

    def test_lowerTTLWins(self):
        """With both queue and message TTL the lower one applies."""
        q = self.declare("q", **{"x-message-ttl": 1000})
        self.publish("q", b"a", expiration="100")
        self.publish("q", b"b", expiration="5000")
        self.clock.advance(0.1)
        self.assertEqual(self.bodies(q), [b"b"])
        self.clock.advance(0.9)
        self.assertEqual(q.readyCount, 0)

    def test_allIntegerTypesAccepted(self):
        """x-message-ttl accepts every AMQP integer type."""
        for i, tag in enumerate("bBsuil"):
            q = self.declare("q%d" % i, **{"x-message-ttl": TaggedInt(10, tag)})
            self.assertEqual(q.settings.messageTtl, 10)

    def test_invalidQueueTTL(self):
        """Negative, too large or non-integer x-message-ttl gives RabbitMQ's 406 texts."""
        cases = [
            (-1, "{value_negative,-1}"),
            (315360000001, "{value_too_large,315360000001}"),
            ("abc", '"expected integer, got longstr"'),
            (True, '"expected integer, got bool"'),
            (1.5, '"expected integer, got double"'),
        ]
        for value, term in cases:
            e = self.assertRaises(AMQPError, self.declare, "bad", **{"x-message-ttl": value})
            self.assertEqual(
                e.text,
                "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue 'bad' in vhost '/': " + term,
            )

    def test_ttlZeroWithoutConsumerExpires(self):
        """TTL 0 with no consumer: never enqueued, dead-lettered as expired."""
        self.declare("dlq")
        q = self.declare("q", **{"x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.publish("q")
        self.assertEqual(q.readyCount, 0)
        dead = self.drain(self.vhost.queues["dlq"])
        self.assertEqual(dead[0].headers["x-death"][0]["reason"], "expired")

    def test_ttlZeroWithConsumerDelivered(self):
        """TTL 0 is delivered to a consumer that can take it at once."""
        q = self.declare("q", **{"x-message-ttl": 0})
        c = FakeConsumer(prefetch=1)
        q.addConsumer(c)
        self.publish("q", b"1")
        self.publish("q", b"2")
        self.assertEqual([e.message.body for e in c.delivered], [b"1"])
        self.assertEqual(q.readyCount, 0)

    def test_unackedNeverExpires(self):
        """A delivered, unacked message does not expire while held."""
        q = self.declare("q", **{"x-message-ttl": 100})
        self.publish("q")
        e = q.basicGet(False)
        self.clock.advance(1)
        self.assertEqual(q.unackedCount, 1)
        q.settle(e)
        self.assertEqual(q.unackedCount, 0)

    def test_requeueKeepsExpiry(self):
        """A requeued message keeps its original expiry; if passed, it expires at once."""
        self.declare("dlq")
        q = self.declare("q", **{"x-message-ttl": 400, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.publish("q", b"a")
        self.publish("q", b"b")
        ea = q.basicGet(False)
        self.clock.advance(0.25)
        q.requeue([ea])
        self.assertEqual(q.readyCount, 2)
        self.assertTrue(next(q.readyEntries()).redelivered)
        self.clock.advance(0.15)
        self.assertEqual(q.readyCount, 0)
        eb = None
        self.publish("q", b"c")
        eb = q.basicGet(False)
        self.clock.advance(0.5)
        q.requeue([eb])
        self.assertEqual(q.readyCount, 0)
        self.assertEqual([m.body for m in self.drain(self.vhost.queues["dlq"])], [b"a", b"b", b"c"])

    def test_getNeverReturnsExpired(self):
        """basic.get skips an expired head even before the timer runs."""
        q = self.declare("q")
        self.publish("q", b"old", expiration="10")
        self.publish("q", b"new")
        # move the clock without running timers: the index has not fired yet
        self.clock.rightNow += 0.02
        e = q.basicGet(True)
        self.assertEqual(e.message.body, b"new")

    def test_deleteCancelsExpiryTimer(self):
        """Deleting a queue whose messages with a TTL were all taken leaves no expiry timer behind."""
        q = self.declare("q")
        self.publish("q", expiration="60000")
        self.assertIsNotNone(q.basicGet(True))
        self.vhost.deleteQueue(q)
        self.assertEqual([c for c in self.clock.getDelayedCalls() if c.func.__name__ == "_fire"], [])

    def test_millionMessagesOneTimer(self):
        """Many messages with mixed TTLs keep exactly one timer per queue."""
        q = self.declare("q")
        for i in range(2000):
            self.publish("q", expiration=str(1 + (i * 7919) % 5000))
        timers = [c for c in self.clock.getDelayedCalls()]
        self.assertEqual(len(timers), 1)
        self.clock.advance(5.001)
        self.assertEqual(q.readyCount, 0)

    def test_manyMessagesReapedOnTime(self):
        """
        20,000 messages with random TTLs (1 ms to 60 s) are each reaped exactly
        at their deadline by one timer.

        This was the 1,000,000-message check ``test_millionMessagesReapedOnTime``
        (24 s of the unit run); the million now runs in
        ``bench/reaping_queue.py``, with the same assertions.
        """
        import random

        n = 20000
        q = self.declare("q")
        # all in memory: reaping of paged segments is tested in test_paging
        q.ready.memoryBudget = 2 ** 62
        rnd = random.Random(20261122)
        ex = self.vhost.exchanges[""]
        for _ in range(n):
            m = Message("", "q", b"\x00\x00", b"x")
            m.ttl = rnd.randint(1, 60000)
            self.vhost.publish(ex, m)
        self.assertEqual(q.readyCount, n)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        worst = [0.0]
        reaped = [0]
        original = q.ready._expiry._onExpire

        def record(entries):
            now = self.clock.seconds() * 1000
            for e in entries:
                worst[0] = max(worst[0], now - e.expiresAt)
            reaped[0] += len(entries)
            original(entries)

        q.ready._expiry._onExpire = record
        while q.readyCount:
            calls = self.clock.getDelayedCalls()
            self.assertEqual(len(calls), 1)
            self.clock.advance(calls[0].getTime() - self.clock.seconds())
        self.assertEqual(reaped[0], n)
        self.assertLess(worst[0], 0.001)

    def test_requeuedPositionKept(self):
        """Requeued messages go back to their original position with redelivered set."""
        q = self.declare("q")
        for b in (b"1", b"2", b"3"):
            self.publish("q", b)
        e1 = q.basicGet(False)
        e2 = q.basicGet(False)
        q.requeue([e2, e1])
        self.assertEqual(self.bodies(q), [b"1", b"2", b"3"])


class QueueExpiryTests(BrokerTestCase):
    """x-expires deletes unused queues (reference section 2)."""

    def test_deletedWhenUnused(self):
        """An idle queue is deleted after x-expires ms."""
        self.declare("q", **{"x-expires": 500})
        self.clock.advance(0.499)
        self.assertIn("q", self.vhost.queues)
        self.clock.advance(0.001)
        self.assertNotIn("q", self.vhost.queues)

    def test_publishDoesNotRenew(self):
        """Publishing does not renew the lease."""
        self.declare("q", **{"x-expires": 500})
        for _ in range(6):
            self.clock.advance(0.1)
            if "q" in self.vhost.queues:
                self.publish("q")
        self.assertNotIn("q", self.vhost.queues)

    def test_getAndDeclareRenew(self):
        """basic.get (even empty) and redeclare renew the lease."""
        q = self.declare("q", **{"x-expires": 500})
        self.clock.advance(0.4)
        q.basicGet(True)
        self.clock.advance(0.4)
        self.declare("q", **{"x-expires": 500})
        self.clock.advance(0.4)
        self.assertIn("q", self.vhost.queues)
        self.clock.advance(0.1)
        self.assertNotIn("q", self.vhost.queues)

    def test_consumerHoldsQueue(self):
        """A queue with a consumer never expires; the lease restarts when it leaves."""
        q = self.declare("q", **{"x-expires": 500})
        c = FakeConsumer()
        q.addConsumer(c)
        self.clock.advance(5)
        self.assertIn("q", self.vhost.queues)
        q.removeConsumer(c)
        self.clock.advance(0.3)
        self.assertIn("q", self.vhost.queues)
        self.clock.advance(0.2)
        self.assertNotIn("q", self.vhost.queues)

    def test_invalidExpires(self):
        """0, negative and non-integer x-expires give RabbitMQ's 406 texts."""
        for value, term in [(0, "{value_zero,0}"), (-5, "{value_negative,-5}"), ("x", '"expected integer, got longstr"')]:
            e = self.assertRaises(AMQPError, self.declare, "bad", **{"x-expires": value})
            self.assertEqual(
                e.text, "PRECONDITION_FAILED - invalid arg 'x-expires' for queue 'bad' in vhost '/': " + term
            )

    def test_expiryDoesNotDeadLetter(self):
        """Messages of an expired queue are not dead-lettered."""
        self.declare("dlq")
        self.declare("q", **{"x-expires": 100, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        self.publish("q")
        self.clock.advance(0.2)
        self.assertEqual(self.vhost.queues["dlq"].readyCount, 0)


class DeadLetterTests(BrokerTestCase):
    """Dead-lettering with RabbitMQ's x-death headers (reference section 3)."""

    def setUp(self):
        BrokerTestCase.setUp(self)
        self.vhost.declareExchange("dlx", "fanout")
        self.dlq = self.declare("dlq")
        self.vhost.bind(self.vhost.exchanges["dlx"], self.dlq, "", {})

    def test_rejectedXDeath(self):
        """A rejected message gets one x-death entry with RabbitMQ's fields and types."""
        q = self.declare("q", **{"x-dead-letter-exchange": "dlx"})
        self.publish("q", b"body", expiration="60000", delivery_mode=2, priority=3,
                     headers={"CC": ["cc1"], "mine": "keep"}, message_id="m1")
        e = q.basicGet(False)
        q.reject([e])
        (m,) = self.drain(self.dlq)
        self.assertEqual(m.body, b"body")
        self.assertNotIn("expiration", m.props)
        self.assertEqual(m.props["delivery_mode"], 2)
        self.assertEqual(m.props["priority"], 3)
        self.assertEqual(m.props["message_id"], "m1")
        h = m.headers
        self.assertEqual(h["mine"], "keep")
        (d,) = h["x-death"]
        self.assertEqual(d["count"], 1)
        self.assertEqual(d["count"].tag, "l")
        self.assertEqual(d["reason"], "rejected")
        self.assertEqual(d["queue"], "q")
        self.assertIsInstance(d["time"], Timestamp)
        self.assertEqual(d["time"], 1000)
        self.assertEqual(d["exchange"], "")
        self.assertEqual(d["routing-keys"], ["q", "cc1"])
        self.assertEqual(d["original-expiration"], "60000")
        self.assertEqual(h["x-first-death-reason"], "rejected")
        self.assertEqual(h["x-first-death-queue"], "q")
        self.assertEqual(h["x-first-death-exchange"], "")
        self.assertEqual(h["x-last-death-reason"], "rejected")
        self.assertEqual(m.exchange, "dlx")
        self.assertEqual(m.routingKey, "q")

    def test_expiredReason(self):
        """An expired message is dead-lettered with reason expired, promptly."""
        self.declare("q", **{"x-dead-letter-exchange": "dlx", "x-message-ttl": 50})
        self.publish("q")
        self.clock.advance(0.05)
        (m,) = self.drain(self.dlq)
        self.assertEqual(m.headers["x-death"][0]["reason"], "expired")

    def test_maxlenDropHead(self):
        """drop-head dead-letters the oldest message as maxlen."""
        q = self.declare("q", **{"x-dead-letter-exchange": "dlx", "x-max-length": 2})
        for b in (b"1", b"2", b"3"):
            self.publish("q", b)
        self.assertEqual(self.bodies(q), [b"2", b"3"])
        (m,) = self.drain(self.dlq)
        self.assertEqual((m.body, m.headers["x-death"][0]["reason"]), (b"1", "maxlen"))

    def test_maxLengthBytes(self):
        """x-max-length-bytes counts body bytes only."""
        q = self.declare("q", **{"x-max-length-bytes": 10})
        self.publish("q", b"123456", headers={"big": "x" * 100})
        self.publish("q", b"abcdef")
        self.assertEqual(self.bodies(q), [b"abcdef"])

    def test_rejectPublish(self):
        """reject-publish refuses the new message and does not dead-letter it."""
        q = self.declare("q", **{"x-dead-letter-exchange": "dlx", "x-max-length": 1, "x-overflow": "reject-publish"})
        self.assertEqual(self.publish("q", b"1"), (1, False))
        self.assertEqual(self.publish("q", b"2"), (1, True))
        self.assertEqual(self.bodies(q), [b"1"])
        self.assertEqual(self.dlq.readyCount, 0)

    def test_rejectPublishDlx(self):
        """reject-publish-dlx refuses and dead-letters the new message as maxlen."""
        self.declare("q", **{"x-dead-letter-exchange": "dlx", "x-max-length": 1, "x-overflow": "reject-publish-dlx"})
        self.publish("q", b"1")
        self.assertEqual(self.publish("q", b"2"), (1, True))
        (m,) = self.drain(self.dlq)
        self.assertEqual((m.body, m.headers["x-death"][0]["reason"]), (b"2", "maxlen"))

    def test_repeatDeathIncrementsCount(self):
        """A repeat death in the same queue for the same reason increments count and keeps the first time."""
        q = self.declare("q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "back"})
        back = self.declare("back", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q"})
        self.publish("q", b"m")
        for _ in range(3):
            e = q.basicGet(False)
            self.clock.advance(1)
            q.reject([e])
            e = back.basicGet(False)
            back.reject([e])
        e = q.basicGet(True)
        deaths = e.message.headers["x-death"]
        self.assertEqual([(d["queue"], d["count"]) for d in deaths], [("back", 3), ("q", 3)])
        self.assertEqual(deaths[1]["time"], 1001)
        self.assertEqual(e.message.headers["x-first-death-queue"], "q")
        self.assertEqual(e.message.headers["x-last-death-queue"], "back")

    def test_automaticCycleDropped(self):
        """A fully automatic cycle (TTL back to itself) is dropped."""
        q = self.declare("q", **{"x-dead-letter-exchange": "", "x-message-ttl": 50})
        self.publish("q")
        self.clock.advance(0.05)
        self.assertEqual(q.readyCount, 0)
        self.clock.advance(1)
        self.assertEqual(q.readyCount, 0)

    def test_cycleWithRejectContinues(self):
        """A cycle that includes a rejection keeps circulating (count on the expiring queue grows)."""
        self.declare("b1", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b2", "x-message-ttl": 50})
        b2 = self.declare("b2", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b1"})
        self.publish("b1")
        for _ in range(2):
            self.clock.advance(0.05)
            e = b2.basicGet(False)
            b2.reject([e])
        self.clock.advance(0.05)
        e = b2.basicGet(True)
        counts = {(d["queue"], d["reason"]): d["count"] for d in e.message.headers["x-death"]}
        self.assertEqual(counts[("b1", "expired")], 3)

    def test_missingDlxDrops(self):
        """A missing DLX drops the message silently."""
        q = self.declare("q", **{"x-dead-letter-exchange": "nope"})
        self.publish("q")
        e = q.basicGet(False)
        q.reject([e])
        self.assertEqual(self.vhost.deadLetterDropped, 1)

    def test_dlrkWithoutDlx(self):
        """x-dead-letter-routing-key without a DLX is a 406."""
        e = self.assertRaises(AMQPError, self.declare, "bad", **{"x-dead-letter-routing-key": "k"})
        self.assertEqual(
            e.text,
            "PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue 'bad' in "
            "vhost '/': routing_key_but_no_dlx_defined",
        )

    def test_requeueIntoFullQueueDropsRequeued(self):
        """With drop-head, a requeue into a full queue dead-letters the requeued message."""
        q = self.declare("q", **{"x-dead-letter-exchange": "dlx", "x-max-length": 2})
        for b in (b"a", b"b", b"c"):
            self.publish("q", b)
        self.drain(self.dlq)
        # queue: b, c ; take b, add d -> c, d ; requeue b -> dropped
        e = q.basicGet(False)
        self.publish("q", b"d")
        q.requeue([e])
        self.assertEqual(self.bodies(q), [b"c", b"d"])
        self.assertEqual([m.body for m in self.drain(self.dlq)], [b"b"])


class ConsumerContractTests(BrokerTestCase):
    """A queue delivers only while its consumers' ``canTake`` allows (IConsumer)."""

    def test_pausedConnectionTakesNothing(self):
        """While the connection's output is backed up nothing is delivered; dispatch resumes after."""
        q = self.declare("q")
        c = FakeConsumer(noAck=True)
        c.channel.paused = True
        q.addConsumer(c)
        self.publish("q")
        self.assertEqual((len(c.delivered), q.readyCount), (0, 1))
        c.channel.paused = False
        q.dispatch()
        self.assertEqual((len(c.delivered), q.readyCount), (1, 0))

    def test_globalPrefetchSharedByChannel(self):
        """Two consumers on one channel share its global prefetch; one on another channel is not limited."""
        a, b = self.declare("a"), self.declare("b")
        ch = FakeChannel(globalPrefetch=3)
        ca, cb = FakeConsumer(channel=ch), FakeConsumer(channel=ch)
        other = FakeConsumer()
        a.addConsumer(ca)
        b.addConsumer(cb)
        for _ in range(5):
            self.publish("a")
            self.publish("b")
        self.assertEqual(len(ca.delivered) + len(cb.delivered), 3)
        b.addConsumer(other)
        self.assertEqual(len(other.delivered), 5 - len(cb.delivered))


class ExchangeCounterTests(BrokerTestCase):
    """An exchange's publish_in / publish_out counters (management ``message_stats``)."""

    def test_publishOutCountsRoutedMessages(self):
        """publish_out counts the messages an exchange routed onwards, not the unroutable ones."""
        ex = self.vhost.declareExchange("x", "direct")
        self.vhost.bind(ex, self.declare("q"), "k", {})
        self.publish("k", exchange="x")
        self.publish("k", exchange="x")
        self.publish("nowhere", exchange="x")
        self.assertEqual(ex.publishOut, 2)
        self.assertGreaterEqual(ex.publishIn, ex.publishOut)

    def test_exchangeToExchange(self):
        """Through an exchange-to-exchange binding both exchanges count the message out."""
        src = self.vhost.declareExchange("src", "fanout")
        dst = self.vhost.declareExchange("dst", "fanout")
        self.vhost.bind(src, dst, "", {})
        self.vhost.bind(dst, self.declare("q"), "", {})
        self.publish("k", exchange="src")
        self.assertEqual((src.publishIn, src.publishOut, dst.publishIn, dst.publishOut), (1, 1, 1, 1))


class PolicyTests(BrokerTestCase):
    """Policies apply to existing and new queues; arguments win where RabbitMQ says."""

    def test_policyAppliesToNewAndExisting(self):
        """A message-ttl policy applies to matching queues, old and new."""
        old = self.declare("p.old")
        self.broker.setPolicy("/", "ttl", "^p\\.", {"message-ttl": 100}, applyTo="queues")
        new = self.declare("p.new")
        self.assertEqual(old.settings.messageTtl, 100)
        self.assertEqual(new.settings.messageTtl, 100)
        self.assertIsNone(self.declare("other").settings.messageTtl)

    def test_minOfArgAndPolicy(self):
        """Numeric keys take the lower of argument and policy."""
        q = self.declare("q", **{"x-message-ttl": 50, "x-max-length": 10})
        self.broker.setPolicy("/", "p", ".*", {"message-ttl": 100, "max-length": 5})
        self.assertEqual((q.settings.messageTtl, q.settings.maxLength), (50, 5))

    def test_argumentBeatsPolicyForDlx(self):
        """x-dead-letter-exchange and x-overflow arguments beat the policy."""
        q = self.declare("q", **{"x-dead-letter-exchange": "a", "x-overflow": "reject-publish"})
        self.broker.setPolicy("/", "p", ".*", {"dead-letter-exchange": "b", "overflow": "drop-head"})
        self.assertEqual((q.settings.dlx, q.settings.overflow), ("a", "reject-publish"))

    def test_priorityChoosesPolicy(self):
        """The highest-priority matching policy wins."""
        q = self.declare("q")
        self.broker.setPolicy("/", "lo", ".*", {"max-length": 1}, priority=0)
        self.broker.setPolicy("/", "hi", "^q$", {"max-length": 7}, priority=5)
        self.assertEqual(q.settings.maxLength, 7)
        self.broker.clearPolicy("/", "hi")
        self.assertEqual(q.settings.maxLength, 1)

    def test_loweredMaxLengthDropsAtOnce(self):
        """Lowering max-length by policy drops from the head immediately."""
        q = self.declare("q")
        for b in (b"1", b"2", b"3"):
            self.publish("q", b)
        self.broker.setPolicy("/", "p", ".*", {"max-length": 1})
        self.assertEqual(self.bodies(q), [b"3"])

    def test_expiresPolicy(self):
        """An expires policy deletes an idle queue."""
        self.declare("q")
        self.broker.setPolicy("/", "p", ".*", {"expires": 100})
        self.clock.advance(0.1)
        self.assertNotIn("q", self.vhost.queues)

    def test_invalidPolicies(self):
        """Invalid policy values are refused with RabbitMQ's validation texts."""
        e = self.assertRaises(PolicyError, self.broker.setPolicy, "/", "p", ".*", {"message-ttl": -5})
        self.assertEqual(str(e), "-5 is not a valid message TTL")
        e = self.assertRaises(PolicyError, self.broker.setPolicy, "/", "p", ".*", {"expires": 0})
        self.assertEqual(str(e), "0 is not a valid queue expiry")
        self.assertRaises(PolicyError, self.broker.setPolicy, "/", "p", ".*", {"max-priority": 5})


class TopicTrieTests(SynchronousTestCase):
    """The topic trie routes exactly like the reference regex matcher."""

    def test_randomAgainstRegex(self):
        """Random patterns and keys: trie routing equals topicMatches for every binding."""
        import random

        from otter_tx.broker.exchange import TopicRouting, topicMatches

        rnd = random.Random(5)
        words = ["a", "b", "c", "", "*", "#"]
        patterns = set()
        for _ in range(300):
            patterns.add(".".join(rnd.choice(words) for _ in range(rnd.randint(0, 4))))
        t = TopicRouting()
        for p in patterns:
            t.add(p, p, {})
        for _ in range(2000):
            key = ".".join(rnd.choice(["a", "b", "c", ""]) for _ in range(rnd.randint(0, 5)))
            out = set()
            t.route(None, [key], out)
            expected = {p for p in patterns if topicMatches(p, key)}
            self.assertEqual(out, expected, key)
        for p in list(patterns)[:150]:
            t.remove(p, p, {})
            patterns.discard(p)
        for _ in range(500):
            key = ".".join(rnd.choice(["a", "b", "c", ""]) for _ in range(rnd.randint(0, 5)))
            out = set()
            t.route(None, [key], out)
            self.assertEqual(out, {p for p in patterns if topicMatches(p, key)}, key)
