"""
Deterministic tests (task.Clock, FakeClient, StubTreq) of the message rates
(otter_tx.broker.stats): the counters after a known workload on every
object, rates and samples after advancing the clock, the sampler's bounds,
a known publish rate read back everywhere, the range parameters and
``disable_stats``.  The shapes are RabbitMQ 3.10's (``rabbit_mgmt_stats``;
curl probes of the reference peer).
"""

from twisted.internet.task import Clock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.broker import stats
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.test.unit.test_web import WebTestCase
from otter_tx.testing import FakeClient


class _Workload(WebTestCase):
    """A broker with an AMQP client: exchange ``ex`` (direct) bound to queue ``q`` with key ``k``."""

    def setUp(self):
        WebTestCase.setUp(self)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0)
        self.client = FakeClient(self.factory)
        self.client.openChannel(1)
        self.client.send(1, spec.ExchangeDeclare(0, "ex", "direct", False, False, False, False, False, {}))
        self.client.send(1, spec.QueueDeclare(0, "q", False, False, False, False, {}))
        self.client.send(1, spec.QueueBind(0, "q", "ex", "k", False, {}))
        self.client.received()
        self.q = self.vh.queues["q"]
        self.ex = self.vh.exchanges["ex"]

    def session(self, number=1):
        """The Session behind AMQP channel ``number``."""
        return self.broker.connections.copy().pop().channels[number].session

    def sample(self):
        """Record one sample now."""
        self.broker.sampler.sample()


class _KnownWorkload(_Workload):
    """The known workload of the counter tests."""

    def workload(self):
        """
        Channel 1 (confirm mode) publishes 5 routed, 1 returned and 1 dropped;
        channel 2 gets twice (manual, no-ack), gets empty once, consumes
        (manual) the other 2, rejects one with requeue (redelivered, acked)
        and acks the rest.
        """
        c = self.client
        c.send(1, spec.ConfirmSelect(False))
        for _ in range(5):
            c.publish(1, "ex", "k", b"x")
        c.publish(1, "ex", "nowhere", b"x", mandatory=True)
        c.publish(1, "ex", "nowhere", b"x")
        c.openChannel(2)
        c.send(2, spec.BasicGet(0, "q", False))
        c.send(2, spec.BasicGet(0, "q", True))
        c.received()
        c.send(2, spec.BasicAck(1, False))
        c.send(2, spec.BasicConsume(0, "q", "ct", False, False, False, False, {}))
        c.received()
        # deliveries 3 and 4 (consume), 5 with its redelivery
        c.send(2, spec.BasicReject(3, True))
        c.received()
        c.send(2, spec.BasicAck(0, True))
        c.send(2, spec.BasicCancel("ct", False))
        c.send(2, spec.BasicGet(0, "q", False))
        c.received()


class CounterTests(_KnownWorkload):
    """Every object's counters after a known workload."""

    def test_channel(self):
        """A channel counts its publishes, confirms, returns, drops, deliveries, gets, acks and redeliveries."""
        self.workload()
        one, two = self.session(1).stats, self.session(2).stats
        self.assertEqual(
            (one.publish, one.publishConfirm, one.confirm, one.returnUnroutable, one.dropUnroutable),
            (7, 7, 7, 1, 1))
        self.assertEqual(
            (two.get, two.getNoAck, two.getEmpty, two.deliver, two.deliverNoAck, two.ack, two.redeliver),
            (1, 1, 1, 4, 0, 4, 1))

    def test_queue(self):
        """A queue counts what arrived and what left it, by kind of delivery."""
        self.workload()
        values = dict(zip(stats.QUEUE_KEYS, stats.queueValues(self.q)))
        self.assertEqual(
            {k: values[k] for k in ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack",
                                    "get_empty", "ack", "redeliver", "deliver_get")},
            {"publish": 5, "deliver": 4, "deliver_no_ack": 0, "get": 1, "get_no_ack": 1, "get_empty": 1,
             "ack": 4, "redeliver": 1, "deliver_get": 6})

    def test_exchange(self):
        """An exchange counts publish_in for every message and publish_out for the routed ones."""
        self.workload()
        self.assertEqual(stats.exchangeValues(self.ex), (7, 5))

    def test_closedChannelsStayInVHostTotals(self):
        """Closing the channels and the connection keeps their counts and bytes in the vhost's and node's totals."""
        self.workload()
        self.client.send(1, spec.ChannelClose(200, "", 0, 0))
        self.client.send(2, spec.ChannelClose(200, "", 0, 0))
        self.client.received()
        self.assertEqual(self.vh.sessions, set())
        messageStats = self.get("/api/vhosts/%2F").json()["message_stats"]
        self.assertEqual((messageStats["publish"], messageStats["confirm"], messageStats["deliver"], messageStats["ack"],
                          messageStats["get_empty"], messageStats["deliver_get"]), (7, 7, 4, 4, 1, 6))
        overview = self.get("/api/overview").json()["message_stats"]
        self.assertEqual((overview["publish"], overview["redeliver"]), (7, 1))
        conn = self.broker.connections.copy().pop()
        received = self.get("/api/vhosts/%2F").json()["recv_oct"]
        self.assertEqual(received, conn.bytesIn)
        conn.connectionLost(None)
        self.assertEqual(self.get("/api/vhosts/%2F").json()["recv_oct"], received)
        self.assertEqual((self.broker.counters.received, self.broker.counters.acknowledged), (7, 4))

    def test_httpPublishCountsInVHost(self):
        """A publish through the HTTP API counts in its vhost's publish total."""
        r = self.post("/api/exchanges/%2F/ex/publish",
                      {"routing_key": "k", "payload": "p", "payload_encoding": "string", "properties": {}})
        self.assertEqual(r.json(), {"routed": True})
        self.assertEqual(self.get("/api/vhosts/%2F").json()["message_stats"]["publish"], 1)

    def test_httpGetCounts(self):
        """/get with ack_requeue_false counts a get_no_ack, with ack_requeue_true a get, as RabbitMQ's plugin."""
        for _ in range(3):
            self.client.publish(1, "ex", "k", b"x")
        self.client.received()
        self.post("/api/queues/%2F/q/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        self.post("/api/queues/%2F/q/get", {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"})
        messageStats = self.get("/api/queues/%2F/q").json()["message_stats"]
        self.assertEqual((messageStats["get"], messageStats["get_no_ack"], messageStats["ack"], messageStats["redeliver"],
                          messageStats["deliver_get"]), (1, 2, 0, 1, 3))
        self.assertEqual(self.q.readyCount, 1)

    def test_deadLetteredByReason(self):
        """Expired, rejected and max-length messages count on their queue and vhost by reason."""
        self.vh.declareQueue("dlq", None)
        self.vh.declareQueue("src", None, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq",
            "x-message-ttl": 1000, "x-max-length": 2})
        src = self.vh.queues["src"]
        self.client.send(1, spec.ConfirmSelect(False))
        for _ in range(3):
            self.client.publish(1, "", "src", b"x")
        self.clock.advance(1.5)
        self.client.publish(1, "", "src", b"x")
        self.client.send(1, spec.BasicGet(0, "src", False))
        self.client.received()
        self.client.send(1, spec.BasicReject(1, False))
        self.client.received()
        values = dict(zip(stats.QUEUE_KEYS, stats.queueValues(src)))
        self.assertEqual((values["expired"], values["dead_lettered_expired"], values["dead_lettered_maxlen"],
                          values["dead_lettered_rejected"]), (2, 2, 1, 1))
        messageStats = self.get("/api/vhosts/%2F").json()["message_stats"]
        self.assertEqual((messageStats["expired"], messageStats["dead_lettered_expired"], messageStats["dead_lettered_maxlen"],
                          messageStats["dead_lettered_rejected"], messageStats["dead_lettered_delivery_limit"]),
                         (2, 2, 1, 1, 0))
        self.assertEqual(self.vh.queues["dlq"].readyCount, 4)

    def test_expiredWithoutDeadLetterExchange(self):
        """A queue without a dead-letter exchange counts its expired messages, none dead-lettered."""
        self.vh.declareQueue("ttl", None, arguments={"x-message-ttl": 100})
        self.client.publish(1, "", "ttl", b"x")
        self.clock.advance(0.2)
        values = dict(zip(stats.QUEUE_KEYS, stats.queueValues(self.vh.queues["ttl"])))
        self.assertEqual((values["expired"], values["dead_lettered_expired"]), (1, 0))

    def test_delayed(self):
        """A delayed exchange, its vhost and the overview count the messages taken into hold."""
        self.client.send(1, spec.ExchangeDeclare(0, "dx", "x-delayed-message", False, False, False, False,
                                                 False, {"x-delayed-type": "direct"}))
        self.client.publish(1, "dx", "k", b"x", props={"headers": {"x-delay": 5000}})
        self.client.publish(1, "dx", "k", b"x", props={"headers": {"x-delay": 5000}})
        self.client.received()
        ex = self.get("/api/exchanges/%2F/dx").json()
        self.assertEqual((ex["message_stats"]["delayed"], ex["messages_delayed"]), (2, 2))
        self.assertEqual(self.get("/api/overview").json()["message_stats"]["delayed"], 2)
        self.assertNotIn("delayed", self.get("/api/exchanges/%2F/ex").json()["message_stats"])

    def test_channelView(self):
        """/api/channels shows message_stats and the unconfirmed count of a confirm channel."""
        self.client.send(1, spec.ConfirmSelect(False))
        self.client.publish(1, "ex", "k", b"x")
        self.client.received()
        [ch] = self.get("/api/channels").json()
        self.assertEqual((ch["message_stats"]["publish"], ch["message_stats"]["confirm"],
                          ch["message_stats"]["publish_details"], ch["messages_unconfirmed"]),
                         (1, 1, {"rate": 0.0}, 0))

    def test_oneChannel(self):
        """GET /api/channels/{name} shows the channel with its consumers; 404 for no such channel; 401 for others'."""
        from urllib.parse import quote

        self.client.send(1, spec.BasicConsume(0, "q", "ct", False, False, False, False, {}))
        self.client.received()
        [listed] = self.get("/api/channels").json()
        path = "/api/channels/" + quote(listed["name"], safe="")
        d = self.get(path).json()
        self.assertEqual((d["name"], d["number"], [c["consumer_tag"] for c in d["consumer_details"]],
                          d["deliveries"], d["publishes"]), (listed["name"], 1, ["ct"], [], []))
        self.assertIn("publish_details", d["message_stats"])
        self.assertError(self.get("/api/channels/" + quote("nope (1)", safe="")), 404, "Object Not Found",
                         "Not Found")
        self.broker.addUser("mgmt", "pw", ["management"])
        self.broker.setPermissions("mgmt", "/")
        self.assertError(self.get(path, auth=("mgmt", "pw")), 401, "not_authorised",
                         "User not authorised to access object")

    def test_txUncommitted(self):
        """A transactional channel shows its held publishes and acks as uncommitted."""
        self.client.publish(1, "ex", "k", b"x")
        self.client.send(1, spec.TxSelect())
        self.client.publish(1, "ex", "k", b"y")
        self.client.send(1, spec.BasicGet(0, "q", False))
        self.client.send(1, spec.BasicAck(1, False))
        self.client.received()
        [ch] = self.get("/api/channels").json()
        self.assertEqual((ch["messages_uncommitted"], ch["acks_uncommitted"]), (1, 1))

    def test_connectionView(self):
        """/api/connections shows byte and packet counts with rates, and reads only IConnectionInfo."""
        [c] = self.get("/api/connections").json()
        conn = self.broker.connections.copy().pop()
        self.assertEqual((c["recv_oct"], c["send_oct"], c["recv_cnt"], c["send_cnt"]),
                         (conn.bytesIn, conn.bytesOut, conn.recvCount, conn.sendCount))
        self.assertGreater(c["recv_cnt"], 0)
        self.assertEqual(c["recv_oct_details"], {"rate": 0.0})


class InterfaceViewTests(WebTestCase):
    """The connection views read only what IConnectionInfo declares."""

    def test_fakeConnectionListed(self):
        """A testing.FakeConnection in broker.connections is listed with its declared attributes and rates."""
        from twisted.internet.address import IPv4Address
        from zope.interface.verify import verifyObject

        from otter_tx.broker.interfaces import IConnectionInfo
        from otter_tx.testing import FakeConnection

        conn = FakeConnection(user=self.broker.users["guest"], vhost=self.vh)
        conn.peer = IPv4Address("TCP", "10.0.0.1", 40000)
        conn.local = IPv4Address("TCP", "10.0.0.2", 5672)
        conn.bytesIn, conn.bytesOut, conn.recvCount, conn.sendCount = 100, 200, 3, 4
        self.assertTrue(verifyObject(IConnectionInfo, conn))
        self.broker.connections.add(conn)
        self.broker.sampler.sample()
        conn.bytesIn += 500
        self.clock.advance(5)
        self.broker.sampler.sample()
        [c] = self.get("/api/connections").json()
        self.assertEqual(
            (c["name"], c["peer_host"], c["port"], c["recv_oct"], c["send_oct"], c["recv_cnt"], c["send_cnt"],
             c["recv_oct_details"], c["channel_max"], c["ssl"]),
            (conn.name, "10.0.0.1", 5672, 600, 200, 3, 4, {"rate": 100.0}, 2047, False))
        self.assertEqual(self.get("/api/vhosts/%2F").json()["recv_oct_details"], {"rate": 100.0})


class RateTests(_Workload):
    """Rates and samples after advancing the clock."""

    def publishAt(self, perSecond, seconds):
        """Publish ``perSecond`` messages a second to ``ex``/``k`` for ``seconds`` of clock time."""
        step = 1.0 / perSecond
        for _ in range(int(perSecond * seconds)):
            self.client.publish(1, "ex", "k", b"x")
            self.clock.advance(step)
        self.client.received()

    def test_knownRate(self):
        """50 msg/s for 20 s reads back as 50 msg/s (within 20 %) on queue, exchange, channel, vhost and overview."""
        self.broker.startStatistics()
        self.addCleanup(self.broker.sampler.stop)
        self.clock.advance(0.001)
        self.publishAt(50, 20)
        q = self.get("/api/queues/%2F/q").json()["message_stats"]["publish_details"]["rate"]
        ex = self.get("/api/exchanges/%2F/ex").json()["message_stats"]
        [ch] = self.get("/api/channels").json()
        vh = self.get("/api/vhosts/%2F").json()["message_stats"]["publish_details"]["rate"]
        ov = self.get("/api/overview").json()["message_stats"]["publish_details"]["rate"]
        rates = [q, ex["publish_in_details"]["rate"], ex["publish_out_details"]["rate"],
                 ch["message_stats"]["publish_details"]["rate"], vh, ov]
        for r in rates:
            self.assertTrue(40.0 <= r <= 60.0, rates)

    def test_rateIsTheLastInterval(self):
        """The rate is the difference of the last two samples over their distance, per second."""
        self.sample()
        for _ in range(10):
            self.client.publish(1, "ex", "k", b"x")
        self.client.received()
        self.clock.advance(5)
        self.sample()
        self.assertEqual(self.get("/api/queues/%2F/q").json()["message_stats"]["publish_details"],
                         {"rate": 2.0})

    def test_staleRateIsZero(self):
        """Once the last sample is older than the previous interval, the rate is 0.0 (RabbitMQ's rule)."""
        self.sample()
        self.client.publish(1, "ex", "k", b"x")
        self.client.received()
        self.clock.advance(5)
        self.sample()
        self.clock.advance(11)
        self.assertEqual(self.get("/api/queues/%2F/q").json()["message_stats"]["publish_details"],
                         {"rate": 0.0})

    def test_samples(self):
        """With msg_rates_age/incr the details carry samples newest first, avg and avg_rate as RabbitMQ's."""
        self.clock.advance(1000)
        self.sample()
        for i in range(4):
            for _ in range(10):
                self.client.publish(1, "ex", "k", b"x")
            self.client.received()
            self.clock.advance(5)
            self.sample()
        self.clock.advance(1)
        d = self.get("/api/queues/%2F/q?msg_rates_age=20&msg_rates_incr=5").json()
        details = d["message_stats"]["publish_details"]
        self.assertEqual(details["samples"], [
            {"sample": 40, "timestamp": 1020000}, {"sample": 30, "timestamp": 1015000},
            {"sample": 20, "timestamp": 1010000}, {"sample": 10, "timestamp": 1005000},
            {"sample": 0, "timestamp": 1000000}])
        self.assertEqual((details["rate"], details["avg_rate"], details["avg"]), (2.0, 2.0, 20.0))
        # nothing consumed: the queue grew as fast
        self.assertEqual(d["messages_details"], {"rate": 2.0})

    def test_lengthSamples(self):
        """With lengths_age/incr the queue lengths carry samples, rounded up to the increment as RabbitMQ."""
        self.clock.advance(1000)
        self.sample()
        self.client.publish(1, "ex", "k", b"x")
        self.client.received()
        self.clock.advance(5)
        self.sample()
        self.clock.advance(1)
        d = self.get("/api/queues/%2F/q?lengths_age=10&lengths_incr=5").json()
        self.assertEqual(d["messages_ready_details"]["samples"], [
            {"sample": 1, "timestamp": 1010000}, {"sample": 1, "timestamp": 1005000},
            {"sample": 0, "timestamp": 1000000}])
        self.assertEqual(d["message_stats"]["publish_details"], {"rate": 0.2})
        ov = self.get("/api/overview?lengths_age=10&lengths_incr=5").json()["queue_totals"]
        self.assertEqual([s["sample"] for s in ov["messages_details"]["samples"]], [1, 1, 0])

    def test_dataRates(self):
        """Connections and vhosts show recv_oct/send_oct rates and, with data_rates_age/incr, samples."""
        self.sample()
        self.client.publish(1, "ex", "k", b"x" * 1000)
        self.client.received()
        self.clock.advance(5)
        self.sample()
        [c] = self.get("/api/connections?data_rates_age=5&data_rates_incr=5").json()
        self.assertEqual(len(c["recv_oct_details"]["samples"]), 2)
        self.assertGreater(self.get("/api/connections").json()[0]["recv_oct_details"]["rate"], 200.0)
        self.assertGreater(self.get("/api/vhosts/%2F").json()["recv_oct_details"]["rate"], 200.0)

    def test_churnRates(self):
        """The overview's churn_rates count connections, channels and queues with RabbitMQ's keys."""
        churn = self.get("/api/overview").json()["churn_rates"]
        self.assertEqual(sorted(k for k in churn if not k.endswith("_details")), sorted(stats.CHURN_KEYS))
        self.assertEqual((churn["connection_created"], churn["channel_created"], churn["queue_created"]),
                         (1, 1, 1))

    def test_overviewShape(self):
        """The overview says rates_mode basic, RabbitMQ's retention policies and every message_stats key."""
        o = self.get("/api/overview").json()
        self.assertEqual((o["rates_mode"], o["statistics_db_event_queue"]), ("basic", 0))
        self.assertEqual(o["sample_retention_policies"],
                         {"global": [600, 3600, 28800, 86400], "basic": [600, 3600], "detailed": [600]})
        for key in stats.VHOST_KEYS:
            self.assertEqual(o["message_stats"][key + "_details"], {"rate": 0.0})

    def test_monitorSeesItsVHostsSummed(self):
        """A user who sees only some vhosts gets the overview summed over those, rates included."""
        self.broker.addVHost("other")
        self.broker.addUser("mon", "pw", ["management"])
        self.broker.setPermissions("mon", "/")
        self.client.publish(1, "ex", "k", b"x")
        self.client.received()
        o = self.get("/api/overview?msg_rates_age=5&msg_rates_incr=5", auth=("mon", "pw")).json()
        self.assertEqual(o["message_stats"]["publish"], 1)
        self.assertEqual(len(o["message_stats"]["publish_details"]["samples"]), 2)


class RangeTests(_Workload):
    """The range parameters and disable_stats, as RabbitMQ 3.10 answers them."""

    def test_invalidRange(self):
        """A range that is not positive or asks for more than 500 samples gets 400 bad_request."""
        self.assertError(self.get("/api/overview?msg_rates_age=0&msg_rates_incr=1"), 400, "bad_request",
                         "Invalid range parameters: age 0, incr 1")
        self.assertError(self.get("/api/queues?lengths_age=600&lengths_incr=1"), 400, "bad_request",
                         "Invalid range parameters: age 600, incr 1")

    def test_nonIntegerIgnored(self):
        """A range that is not two integers is ignored (no samples), as RabbitMQ."""
        d = self.get("/api/queues/%2F/q?msg_rates_age=abc&msg_rates_incr=5").json()
        self.assertEqual(d["message_stats"]["publish_details"], {"rate": 0.0})

    def test_disableStats(self):
        """disable_stats=true leaves out message_stats, the details and the overview's statistics."""
        o = self.get("/api/overview?disable_stats=true").json()
        self.assertTrue(o["disable_stats"])
        for key in ("message_stats", "churn_rates", "queue_totals", "listeners", "contexts"):
            self.assertNotIn(key, o)
        self.assertIn("object_totals", o)
        [ex] = [e for e in self.get("/api/exchanges/%2F?disable_stats=true").json() if e["name"] == "ex"]
        self.assertNotIn("message_stats", ex)
        [c] = self.get("/api/connections?disable_stats=true").json()
        self.assertNotIn("recv_oct_details", c)

    def test_disableStatsQueueTotals(self):
        """A queue list with disable_stats shows the basic fields, and the lengths with enable_queue_totals."""
        [q] = self.get("/api/queues?disable_stats=true").json()
        self.assertEqual(sorted(q), ["arguments", "auto_delete", "durable", "exclusive", "name", "node",
                                     "policy", "state", "type", "vhost"])
        [q] = self.get("/api/queues/%2F?disable_stats=true&enable_queue_totals=true").json()
        self.assertEqual((q["messages"], q["messages_ready"], q["messages_unacknowledged"]), (0, 0, 0))
        page = self.get("/api/queues?disable_stats=true&page=1").json()
        self.assertNotIn("message_stats", page["items"][0])


class SamplerTests(SynchronousTestCase):
    """The sampler's clock, bounds and forgetting."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.q = self.vh.declareQueue("q", None)

    def test_interval(self):
        """The sampler samples at start and every intervalMs on the injected clock."""
        self.broker.sampler.intervalMs = 1000
        self.broker.startStatistics()
        self.addCleanup(self.broker.stop)
        self.q.publishedCount = 3
        self.clock.advance(1)
        series = self.broker.sampler.series("queue", self.q)
        self.assertEqual([ts for ts, _ in series.points], [0, 1000])
        self.broker.stop()
        self.clock.advance(5)
        self.assertEqual(series.lastTs, 1000)

    def test_boundedHistory(self):
        """A busy queue keeps at most RETENTION_S / interval + 2 points; an idle one keeps one."""
        idle = self.vh.declareQueue("idle", None)
        sampler = self.broker.sampler
        for i in range(1000):
            self.q.publishedCount += 1
            sampler.sample()
            self.clock.advance(5)
        self.assertLessEqual(len(sampler.series("queue", self.q).points), stats.RETENTION_S // 5 + 2)
        self.assertGreaterEqual(len(sampler.series("queue", self.q).points), stats.RETENTION_S // 5)
        self.assertEqual(len(sampler.series("queue", idle).points), 1)

    def test_coarseTier(self):
        """Samples older than 600 s come from the one-a-minute tier, kept 3600 s, as RabbitMQ's basic policy."""
        sampler = self.broker.sampler
        for i in range(1000):
            self.q.publishedCount += 1
            sampler.sample()
            self.clock.advance(5)
        series = sampler.series("queue", self.q)
        self.assertLessEqual(len(series.coarse), stats.COARSE_RETENTION_S // 60 + 2)
        now = sampler.nowMs()
        d = stats.rangeDetails(series, 0, now, 900, 60)
        self.assertEqual(len(d["samples"]), 16)
        # the sample at time t (ms) counted t // 5000 + 1 publishes; the fine tier
        # answers exactly, the coarse one (older than 600 s) at most a minute late
        coarse = 0
        for ts, v in [(smp["timestamp"], smp["sample"]) for smp in d["samples"]]:
            exact = ts // 5000 + 1
            if ts >= now - stats.RETENTION_S * 1000:
                self.assertEqual(v, exact)
            else:
                coarse += 1
                self.assertTrue(exact - 12 <= v <= exact, (ts, v))
        self.assertGreater(coarse, 3)
        self.clock.advance(4000)
        sampler.sample()
        self.assertEqual(len(series.coarse), 2)

    def test_deletedForgotten(self):
        """A deleted queue's series is dropped at the next sample."""
        sampler = self.broker.sampler
        sampler.sample()
        self.assertIsNotNone(sampler.series("queue", self.q))
        self.vh.deleteQueue(self.q)
        sampler.sample()
        self.assertIsNone(sampler.series("queue", self.q))

    def test_rangeDetailsBeforeData(self):
        """Samples before an object's first snapshot are 0; avg and avg_rate need two samples."""
        d = stats.rangeDetails(None, 0, 12345, 10, 5)
        self.assertEqual(d, {"rate": 0.0, "samples": [{"sample": 0, "timestamp": 10000},
                                                      {"sample": 0, "timestamp": 5000},
                                                      {"sample": 0, "timestamp": 0}],
                             "avg_rate": 0.0, "avg": 0.0})

    def test_parseRange(self):
        """parseRange: None unless both are integers; InvalidRange beyond 500 steps or not positive."""
        self.assertIsNone(stats.parseRange(None, "5"))
        self.assertIsNone(stats.parseRange("1.5", "5"))
        r = stats.parseRange("600", "5")
        self.assertEqual((r.age, r.incr), (600, 5))
        self.assertRaises(stats.InvalidRange, stats.parseRange, "501", "1")
        self.assertRaises(stats.InvalidRange, stats.parseRange, "5", "-1")
        self.assertEqual(stats.parseRange("500", "1").age, 500)


class SettingTests(SynchronousTestCase):
    """The collect-statistics-interval setting."""

    def test_option(self):
        """--collect-statistics-interval takes a positive integer of ms; anything else is a one-line error."""
        from otter_tx.service.tap import Options

        o = Options()
        o.parseOptions(["--collect-statistics-interval", "250"])
        self.assertEqual(o.settings["collect-statistics-interval"], 250)
        for bad in ("0", "-5", "abc"):
            e = self.assertRaises(usage.UsageError, Options().parseOptions,
                                  ["--collect-statistics-interval", bad])
            self.assertTrue(str(e).startswith("--collect-statistics-interval: must be an integer of at least 1"))

    def test_default(self):
        """Without the option the interval is RabbitMQ's 5000 ms."""
        from otter_tx.service.tap import Options

        o = Options()
        o.parseOptions([])
        self.assertEqual(o.settings["collect-statistics-interval"], 5000)

    def test_service(self):
        """OtterService passes the interval to the sampler and refuses one that is not a positive int."""
        from otter_tx.service.assembly import OtterService

        svc = OtterService(amqp=[], reactor=Clock(), collectStatisticsInterval=1234)
        self.assertEqual(svc.broker.sampler.intervalMs, 1234)
        for bad in (0, -1, 2.5, True):
            self.assertRaises(ValueError, OtterService, amqp=[], reactor=Clock(),
                              collectStatisticsInterval=bad)


class PrometheusTests(_KnownWorkload):
    """The per-channel Prometheus families of rabbitmq_prometheus 3.10, after the same workload."""

    def test_aggregated(self):
        """/metrics sums the open channels' counters under 3.10's names and types."""
        from otter_tx.test.unit.test_metrics import RABBITMQ_310, families, value
        from otter_tx.web.metrics import renderMetrics

        self.workload()
        fams = families(renderMetrics(self.broker, 1.0))
        expected = {
            "rabbitmq_channel_messages_published_total": 7,
            "rabbitmq_channel_messages_confirmed_total": 7,
            "rabbitmq_channel_messages_unroutable_returned_total": 1,
            "rabbitmq_channel_messages_unroutable_dropped_total": 1,
            "rabbitmq_channel_get_ack_total": 1,
            "rabbitmq_channel_get_total": 1,
            "rabbitmq_channel_get_empty_total": 1,
            "rabbitmq_channel_messages_delivered_ack_total": 4,
            "rabbitmq_channel_messages_delivered_total": 0,
            "rabbitmq_channel_messages_redelivered_total": 1,
            "rabbitmq_channel_messages_acked_total": 4,
            "rabbitmq_queue_messages_published_total": 5,
            "rabbitmq_channel_messages_unconfirmed": 0,
        }
        for name, v in expected.items():
            self.assertEqual((fams[name][0], value(fams, name)), (RABBITMQ_310[name], v), name)

    def test_perObject(self):
        """/metrics/per-object labels the channel families by vhost and channel, the queue's by vhost and queue."""
        from otter_tx.test.unit.test_metrics import families, value
        from otter_tx.web.metrics import renderMetrics

        self.workload()
        fams = families(renderMetrics(self.broker, 1.0, perObject=True))
        name = self.broker.connections.copy().pop().name
        self.assertEqual(value(fams, "rabbitmq_channel_messages_published_total",
                               vhost="/", channel="%s (1)" % (name,)), 7)
        self.assertEqual(value(fams, "rabbitmq_channel_messages_acked_total",
                               vhost="/", channel="%s (2)" % (name,)), 4)
        self.assertEqual(value(fams, "rabbitmq_queue_messages_published_total", vhost="/", queue="q"), 5)

    def test_detailed(self):
        """/metrics/detailed serves channel_exchange/queue/queue_exchange_metrics per object when asked."""
        from otter_tx.test.unit.test_metrics import families, value
        from otter_tx.web.metrics import renderDetailed

        self.workload()
        fams = families(renderDetailed(self.broker, 1.0, ["channel_queue_metrics",
                                                          "channel_queue_exchange_metrics"]))
        self.assertEqual(sorted(fams), sorted([
            "rabbitmq_detailed_channel_get_ack_total", "rabbitmq_detailed_channel_get_total",
            "rabbitmq_detailed_channel_messages_delivered_ack_total",
            "rabbitmq_detailed_channel_messages_delivered_total",
            "rabbitmq_detailed_channel_messages_redelivered_total",
            "rabbitmq_detailed_channel_messages_acked_total", "rabbitmq_detailed_channel_get_empty_total",
            "rabbitmq_detailed_queue_messages_published_total"]))
        self.assertEqual(value(fams, "rabbitmq_detailed_queue_messages_published_total", vhost="/", queue="q"), 5)
