"""
Deterministic tests (task.Clock) of the reaping-lateness histograms
(otter_tx.broker.lateness) and their exposition as
``otter_reaping_lateness_seconds`` on ``/metrics``.
"""

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import TaggedInt, encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.expiry import ExpiryIndex
from otter_tx.broker.lateness import BUCKETS_MS, LatenessHistogram
from otter_tx.broker.message import Message
from otter_tx.web.metrics import renderMetrics


def bucketOf(histogram):
    """The upper bound (ms, or None for +Inf) of the one bucket ``histogram`` has counted in."""
    [index] = [i for i, n in enumerate(histogram.counts) if n]
    return BUCKETS_MS[index] if index < len(BUCKETS_MS) else None


class HistogramTests(SynchronousTestCase):
    """LatenessHistogram's buckets."""

    def test_bounds(self):
        """A value equal to a bound counts in that bound's bucket, above the last bound in +Inf, below 0 as 0."""
        for value, bound in ((0.0, 1), (1.0, 1), (1.01, 2.5), (10000, 10000), (10000.5, None), (-3, 1)):
            h = LatenessHistogram()
            h.observe(value)
            self.assertEqual((bucketOf(h), h.count), (bound, 1), value)
        h = LatenessHistogram()
        h.observe(-3)
        h.observe(7.5)
        self.assertEqual(h.sumMs, 7.5)

    def test_indexObserves(self):
        """An ExpiryIndex whose timer fires late observes each expired key's lateness."""
        clock = Clock()
        h = LatenessHistogram()
        expired = []
        index = ExpiryIndex(clock, expired.extend, h)
        index.add("a", 100.0)
        index.add("b", 120.0)
        clock.advance(0.3)
        self.assertEqual((expired, h.count, h.sumMs), (["a", "b"], 2, 200.0 + 180.0))
        self.assertEqual([BUCKETS_MS[i] for i, n in enumerate(h.counts) if n], [250])

    def test_indexWithoutHistogram(self):
        """An ExpiryIndex built without a histogram reaps as before."""
        clock = Clock()
        expired = []
        index = ExpiryIndex(clock, expired.extend)
        index.add("a", 10.0)
        clock.advance(1)
        self.assertEqual(expired, ["a"])


class BrokerLatenessTests(SynchronousTestCase):
    """The broker's three kinds, measured where each expiry is reaped."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.lateness = self.broker.reapingLateness

    def publish(self, exchange, rk, **props):
        self.vh.publish(self.vh.exchanges[exchange], Message(exchange, rk, encodeProperties(props), b"m"))

    def test_messageTtlOnTime(self):
        """A message reaped by a timer that fires on time is 0 to 1 ms late."""
        self.vh.declareQueue("q", None, arguments={"x-message-ttl": TaggedInt(100, "l")})
        self.publish("", "q")
        self.clock.advance(0.1)
        self.assertEqual(self.vh.queues["q"].readyCount, 0)
        self.assertEqual(bucketOf(self.lateness.message), 1)

    def test_messageReactorLate(self):
        """A TTL timer the reactor runs 40 ms late counts in the (25 ms, 50 ms] bucket of kind message."""
        self.vh.declareQueue("q", None, arguments={"x-message-ttl": TaggedInt(100, "l")})
        self.publish("", "q")
        self.clock.advance(0.14)
        self.assertEqual(self.vh.queues["q"].readyCount, 0)
        self.assertEqual((bucketOf(self.lateness.message), self.lateness.message.count), (50, 1))
        self.assertEqual((self.lateness.queue.count, self.lateness.delayed.count), (0, 0))

    def test_perMessageExpiration(self):
        """A per-message expiration reaped 3 s late counts in the (2.5 s, 5 s] bucket."""
        self.vh.declareQueue("q", None)
        self.publish("", "q", expiration="1000")
        self.clock.advance(4)
        self.assertEqual(bucketOf(self.lateness.message), 5000)

    def test_queueExpires(self):
        """An x-expires queue deleted 300 ms after its lease ran out counts in (250 ms, 500 ms] of kind queue."""
        self.vh.declareQueue("q", None, arguments={"x-expires": 1000})
        self.clock.advance(1.3)
        self.assertNotIn("q", self.vh.queues)
        self.assertEqual((bucketOf(self.lateness.queue), self.lateness.message.count), (500, 0))

    def test_queueInUseNotCounted(self):
        """A lease timer that finds the queue in use reaps nothing and observes nothing."""
        q = self.vh.declareQueue("q", None, arguments={"x-expires": 1000})
        q.consumers.append(object())
        self.clock.advance(2)
        q.consumers.clear()
        self.assertEqual(self.lateness.queue.count, 0)

    def test_delayed(self):
        """A delayed message released 12 s late counts in +Inf of kind delayed."""
        ex = self.vh.declareExchange("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        q = self.vh.declareQueue("q", None)
        self.vh.bind(ex, q, "k", {})
        self.vh.publish(ex, Message("dx", "k", encodeProperties({"headers": {"x-delay": 200}}), b"m"))
        self.clock.advance(12.2)
        self.assertEqual(q.readyCount, 1)
        self.assertEqual((bucketOf(self.lateness.delayed), self.lateness.delayed.count), (None, 1))


class ExpositionTests(SynchronousTestCase):
    """otter_reaping_lateness_seconds on /metrics."""

    def test_parses(self):
        """/metrics parses with prometheus_client's parser and has a cumulative histogram per kind in seconds."""
        broker = Broker(Clock())
        broker.reapingLateness.message.observe(40)
        broker.reapingLateness.message.observe(0.5)
        broker.reapingLateness.queue.observe(20000)
        families = {f.name: f for f in text_string_to_metric_families(renderMetrics(broker, 1.0).decode())}
        family = families["otter_reaping_lateness_seconds"]
        self.assertEqual(family.type, "histogram")
        samples = {(s.name, s.labels.get("kind"), s.labels.get("le")): s.value for s in family.samples}
        self.assertEqual(samples[("otter_reaping_lateness_seconds_bucket", "message", "0.001")], 1)
        self.assertEqual(samples[("otter_reaping_lateness_seconds_bucket", "message", "0.025")], 1)
        self.assertEqual(samples[("otter_reaping_lateness_seconds_bucket", "message", "0.05")], 2)
        self.assertEqual(samples[("otter_reaping_lateness_seconds_bucket", "message", "+Inf")], 2)
        self.assertEqual(samples[("otter_reaping_lateness_seconds_count", "message", None)], 2)
        self.assertAlmostEqual(samples[("otter_reaping_lateness_seconds_sum", "message", None)], 0.0405)
        self.assertEqual(samples[("otter_reaping_lateness_seconds_bucket", "queue", "10.0")], 0)
        self.assertEqual(samples[("otter_reaping_lateness_seconds_bucket", "queue", "+Inf")], 1)
        self.assertEqual(samples[("otter_reaping_lateness_seconds_count", "delayed", None)], 0)
        self.assertEqual(len([k for k in samples if k[0].endswith("_bucket") and k[1] == "delayed"]),
                         len(BUCKETS_MS) + 1)
