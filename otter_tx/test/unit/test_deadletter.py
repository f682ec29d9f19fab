"""
Unit tests for :mod:`otter_tx.broker.deadletter`: the x-death copy, the
cycle rule and the defensive reading of ``count`` (docs/dead-lettering.md;
https://www.rabbitmq.com/docs/dlx).  Behaviour through queues stays in
test_ttl_dlx.
"""

from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import TaggedInt, Timestamp, decodeProperties, encodeProperties
from otter_tx.broker.deadletter import MAX_DEATH_COUNT, deadLetterCopy, deathCount, isCycle
from otter_tx.broker.message import Message


def msg(rk="k", exchange="ex", body=b"body", **props):
    """A Message as published with ``props``."""
    return Message(exchange, rk, encodeProperties(props), body)


class DeathCountTests(SynchronousTestCase):
    """:func:`deathCount` reads a publisher's ``count`` defensively."""

    def test_validCountsKept(self):
        """Non-negative ints up to the int64 bound are kept as they are."""
        for v in (0, 1, 41, MAX_DEATH_COUNT, TaggedInt(7, "l")):
            self.assertEqual(deathCount(v), int(v))

    def test_anythingElseIsZero(self):
        """Strings, floats, tables, booleans, negatives and out-of-range numbers count as 0."""
        for v in ("abc", 1.5, {"a": 1}, True, False, -1, MAX_DEATH_COUNT + 1, None, [1]):
            self.assertEqual(deathCount(v), 0, v)


class IsCycleTests(SynchronousTestCase):
    """:func:`isCycle` is RabbitMQ's ``is_cycle/2``."""

    def test_automaticCycle(self):
        """Reaching the queue again through expiries only is a cycle."""
        deaths = [{"queue": "b", "reason": "expired"}, {"queue": "a", "reason": "maxlen"}]
        self.assertTrue(isCycle("a", deaths))
        self.assertTrue(isCycle("b", deaths))

    def test_rejectedOnTheWayBreaksCycle(self):
        """A rejected death before (or at) the match means a client took part: no cycle."""
        deaths = [{"queue": "b", "reason": "rejected"}, {"queue": "a", "reason": "expired"}]
        self.assertFalse(isCycle("a", deaths))
        self.assertFalse(isCycle("b", deaths))

    def test_unknownQueueNoCycle(self):
        """A queue the message never died in is no cycle."""
        self.assertFalse(isCycle("c", [{"queue": "a", "reason": "expired"}]))
        self.assertFalse(isCycle("c", []))

    def test_malformedEntryStopsWalk(self):
        """A non-table entry ends the walk without a cycle."""
        self.assertFalse(isCycle("a", ["junk", {"queue": "a", "reason": "expired"}]))


class DeadLetterCopyTests(SynchronousTestCase):
    """:func:`deadLetterCopy` builds the republished message and its x-death."""

    def test_firstDeath(self):
        """A first death adds one complete x-death entry and the first/last headers."""
        m = msg(expiration="500", headers={"CC": ["c1"]}, message_id="id")
        copy, deaths = deadLetterCopy(m, "q", "dlx", "expired", None, 1234.9)
        self.assertEqual((copy.exchange, copy.routingKey, copy.body), ("dlx", "k", b"body"))
        self.assertEqual(
            deaths,
            [
                {
                    "count": 1,
                    "reason": "expired",
                    "queue": "q",
                    "time": Timestamp(1234),
                    "exchange": "ex",
                    "routing-keys": ["k", "c1"],
                    "original-expiration": "500",
                }
            ],
        )
        self.assertIsInstance(deaths[0]["count"], TaggedInt)
        props = decodeProperties(copy.propsRaw)
        self.assertNotIn("expiration", props)
        self.assertEqual(props["message_id"], "id")
        h = props["headers"]
        self.assertEqual(h["CC"], ["c1"])
        self.assertEqual(
            (h["x-first-death-reason"], h["x-first-death-queue"], h["x-first-death-exchange"]),
            ("expired", "q", "ex"),
        )
        self.assertEqual(
            (h["x-last-death-reason"], h["x-last-death-queue"], h["x-last-death-exchange"]),
            ("expired", "q", "ex"),
        )

    def test_dlrkReplacesKeyAndDropsCC(self):
        """With a dead-letter routing key the copy uses it and loses its CC header."""
        m = msg(headers={"CC": ["c1"]})
        copy, _ = deadLetterCopy(m, "q", "dlx", "rejected", "dead", 0)
        self.assertEqual(copy.routingKey, "dead")
        self.assertNotIn("CC", copy.props["headers"])

    def test_repeatDeathMovesEntryToFront(self):
        """A repeat (queue, reason) increments count and moves the entry first, keeping its time."""
        old = [
            {"queue": "other", "reason": "expired", "count": TaggedInt(1, "l")},
            {"queue": "q", "reason": "rejected", "count": TaggedInt(2, "l"), "time": Timestamp(5)},
        ]
        m = msg(headers={"x-death": old, "x-first-death-reason": "rejected"})
        copy, deaths = deadLetterCopy(m, "q", "dlx", "rejected", None, 99)
        self.assertEqual([(d["queue"], d["count"]) for d in deaths], [("q", 3), ("other", 1)])
        self.assertEqual(deaths[0]["time"], Timestamp(5))
        self.assertEqual(copy.props["headers"]["x-first-death-reason"], "rejected")

    def test_malformedXDeathRepaired(self):
        """A non-array x-death is replaced, non-table entries dropped, a bad count restarts at 1."""
        copy, deaths = deadLetterCopy(msg(headers={"x-death": "junk"}), "q", "dlx", "expired", None, 0)
        self.assertEqual(len(deaths), 1)
        bad = [5, {"queue": "q", "reason": "expired", "count": "abc"}]
        copy, deaths = deadLetterCopy(msg(headers={"x-death": bad}), "q", "dlx", "expired", None, 0)
        self.assertEqual([(d["queue"], d["count"]) for d in deaths], [("q", 1)])

    def test_ignoreDeaths(self):
        """``ignoreDeaths`` starts a fresh x-death whatever the message carries."""
        old = [{"queue": "q", "reason": "expired", "count": TaggedInt(4, "l")}]
        _, deaths = deadLetterCopy(msg(headers={"x-death": old}), "q", "dlx", "expired", None, 0,
                                   ignoreDeaths=True)
        self.assertEqual([d["count"] for d in deaths], [1])

    def test_originalUntouched(self):
        """The dead-lettered message itself is not changed."""
        m = msg(expiration="5", headers={"a": 1})
        raw = m.propsRaw
        deadLetterCopy(m, "q", "dlx", "expired", "x", 0)
        self.assertEqual((m.propsRaw, m.props["expiration"], m.props["headers"]), (raw, "5", {"a": 1}))


class ReachableQueuesTests(SynchronousTestCase):
    """VHost.reachableQueues: where a message would go now, through the vhost's routing, counting and holding nothing."""

    def setUp(self):
        from twisted.internet.task import Clock

        from otter_tx.broker.broker import Broker

        self.vh = Broker(Clock()).vhosts["/"]
        self.qa = self.vh.declareQueue("qa", None)
        self.qb = self.vh.declareQueue("qb", None)

    def test_headersExchange(self):
        """A headers exchange matches the given headers; without headers only an all-empty binding matches."""
        ex = self.vh.declareExchange("h", "headers")
        self.vh.bind(ex, self.qa, "", {"x-match": "all", "kind": "a"})
        self.assertEqual(self.vh.reachableQueues("h", "", {"kind": "a"}), {"qa": ""})
        self.assertEqual(self.vh.reachableQueues("h", "", None), {})

    def test_delayedExchangeHoldsNothing(self):
        """An x-delayed-message exchange routes as if the message were due; nothing is held or counted."""
        ex = self.vh.declareExchange("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        self.vh.bind(ex, self.qb, "k", {})
        self.assertEqual(self.vh.reachableQueues("dx", "k", {"x-delay": 5000}), {"qb": "k"})
        self.assertEqual((ex.publishIn, self.qb.readyCount), (0, 0))

    def test_defaultAndMissing(self):
        """The default exchange reaches the queue named by the key (every queue without a key); a missing exchange nothing."""
        self.assertEqual(self.vh.reachableQueues("", "qa"), {"qa": "qa"})
        self.assertEqual(self.vh.reachableQueues("", None), {"qa": "qa", "qb": "qb"})
        self.assertEqual(self.vh.reachableQueues("nope", "qa"), {})

    def assertAsRouted(self, exchangeName, routingKey):
        """reachableQueues names exactly the queues route delivers a message with ``routingKey`` to."""
        ex = self.vh.exchanges[exchangeName]
        routed = self.vh.route(ex, msg(routingKey, exchangeName), [routingKey])
        self.assertEqual(set(self.vh.reachableQueues(exchangeName, routingKey)), {q.name for q in routed},
                         (exchangeName, routingKey))

    def test_asRouteDeliversOverTopologies(self):
        """
        Over exchange-to-exchange chains and cycles and alternate exchanges,
        reachableQueues follows route's rules: each exchange once, and an
        exchange whose destinations are all exchanges already visited passes
        the message to its alternate exchange.
        """
        vh = self.vh
        qc = vh.declareQueue("qc", None)
        ae = vh.declareExchange("ae", "fanout")
        vh.bind(ae, qc, "", {})
        # a -> b -> a (a cycle); b's only destination is visited: its alternate applies
        a = vh.declareExchange("a", "direct")
        b = vh.declareExchange("b", "direct", arguments={"alternate-exchange": "ae"})
        vh.bind(a, b, "k", {})
        vh.bind(b, a, "k", {})
        # t: topic to a queue and to itself; u: no bindings, with an alternate
        t = vh.declareExchange("t", "topic", arguments={"alternate-exchange": "ae"})
        vh.bind(t, self.qa, "x.*", {})
        vh.bind(t, t, "#", {})
        vh.declareExchange("u", "direct", arguments={"alternate-exchange": "ae"})
        # c -> d -> c with a queue on d; the alternate chain ends in a cycle ae2 <-> ae3
        c = vh.declareExchange("c", "fanout", arguments={"alternate-exchange": "ae2"})
        d = vh.declareExchange("d", "direct")
        vh.bind(c, d, "", {})
        vh.bind(d, c, "k", {})
        vh.bind(d, self.qb, "q", {})
        ae2 = vh.declareExchange("ae2", "fanout", arguments={"alternate-exchange": "ae3"})
        ae3 = vh.declareExchange("ae3", "fanout", arguments={"alternate-exchange": "ae2"})
        vh.bind(ae2, ae3, "", {})
        vh.bind(ae3, ae2, "", {})
        for name in ("a", "b", "t", "u", "c", "d", "ae", "ae2", "ae3"):
            for key in ("k", "q", "x.y", "z"):
                self.assertAsRouted(name, key)
        self.assertEqual(vh.reachableQueues("a", "k"), {"qc": "k"})
