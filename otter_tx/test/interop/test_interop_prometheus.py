"""
The Prometheus listener over real TCP: a pika workload, then ``/metrics``,
``/metrics/per-object`` and ``/metrics/detailed`` fetched with treq from the
in-process broker's listener on ``tcp:0`` (``startBroker(prometheus=True)``)
and parsed with ``prometheus_client``'s parser.
"""

import treq
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks, returnValue
from twisted.web.client import HTTPConnectionPool

from otter_tx.test.interop.support import InteropTestCase, inProcessOnly
from otter_tx.test.unit.test_metrics import RABBITMQ_310, families, value

_PEER = "the suite knows no rabbitmq_prometheus URL of the peer (it has no OTTER_TEST_ variable)"


class PrometheusListenerTests(InteropTestCase):
    """The real listener: names, counters after a workload, 404s."""

    brokerOptions = {"prometheus": True, "management": True}

    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        return InteropTestCase.setUp(self)

    @inlineCallbacks
    def fetch(self, path):
        """``(status, content-type, body text)`` of GET ``path`` on the Prometheus port."""
        r = yield treq.get("http://127.0.0.1:%d%s" % (self.fixture.prometheusPort, path), pool=self.pool)
        body = yield r.text("utf-8")
        returnValue((r.code, r.headers.getRawHeaders("content-type", [""])[0], body))

    def workload(self, queue):
        """Publish 3 to ``queue`` and 1 unroutable, get and ack 2 (blocking; in a thread)."""
        conn = self.pikaConnection()
        try:
            ch = conn.channel()
            ch.queue_declare(queue)
            for _ in range(3):
                ch.basic_publish("", queue, b"m")
            ch.basic_publish("", queue + "-nowhere", b"m")
            for _ in range(2):
                method, _, _ = ch.basic_get(queue)
                ch.basic_ack(method.delivery_tag)
        finally:
            conn.close()

    @inProcessOnly(_PEER)
    @inlineCallbacks
    def test_metricsAfterWorkload(self):
        """After the workload /metrics parses, its rabbitmq_ names are 3.10's and the counters add up."""
        q = self.name("prom-q")
        yield self.inThread(self.workload, q)
        code, ctype, body = yield self.fetch("/metrics")
        self.assertEqual(code, 200)
        self.assertTrue(ctype.startswith("text/plain; version=0.0.4"), ctype)
        fams = families(body)
        for name, (kind, _) in fams.items():
            if name.startswith("rabbitmq_"):
                self.assertEqual(RABBITMQ_310.get(name), kind, name)
        amqp = {"protocol": "amqp091"}
        classic = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}
        self.assertEqual(value(fams, "rabbitmq_global_messages_received_total", **amqp), 4)
        self.assertEqual(value(fams, "rabbitmq_global_messages_routed_total", **amqp), 3)
        self.assertEqual(value(fams, "rabbitmq_global_messages_unroutable_dropped_total", **amqp), 1)
        self.assertEqual(value(fams, "rabbitmq_global_messages_acknowledged_total", **classic), 2)
        self.assertEqual(value(fams, "rabbitmq_queue_messages_ready"), 1)
        self.assertEqual(value(fams, "rabbitmq_connections_opened_total"), 1)
        self.assertGreater(value(fams, "rabbitmq_process_resident_memory_bytes"), 0)
        code, _, body = yield self.fetch("/metrics/per-object")
        self.assertEqual(value(families(body), "rabbitmq_queue_messages_ready", vhost="/", queue=q), 1)
        code, _, body = yield self.fetch("/metrics/detailed?family=queue_coarse_metrics&vhost=%2F")
        self.assertEqual(value(families(body), "rabbitmq_detailed_queue_messages", vhost="/", queue=q), 1)

    @inProcessOnly(_PEER)
    @inlineCallbacks
    def test_unknownPath(self):
        """Paths other than the three metrics paths are 404."""
        for path in ("/", "/api/overview", "/metrics/other"):
            code, _, _ = yield self.fetch(path)
            self.assertEqual(code, 404, path)

    @inProcessOnly(_PEER)
    @inlineCallbacks
    def test_overviewListener(self):
        """/api/overview lists the Prometheus port as an http/prometheus listener, as RabbitMQ does."""
        r = yield treq.get("http://127.0.0.1:%d/api/overview" % (self.fixture.managementPort,),
                           auth=("guest", "guest"), pool=self.pool)
        overview = yield r.json()
        self.assertIn(("http/prometheus", self.fixture.prometheusPort),
                      [(l["protocol"], l["port"]) for l in overview["listeners"]])

    def tearDown(self):
        return self.pool.closeCachedConnections()
