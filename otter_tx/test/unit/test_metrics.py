"""
The Prometheus endpoint (otter_tx.web.metrics): RabbitMQ 3.10's names and
types, counters after a known workload, per-object labels, the detailed
view and the listener's routes.
"""

from prometheus_client.parser import text_string_to_metric_families
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.testing import FakeClient
from otter_tx.web.metrics import OTTER_FAMILIES, PrometheusResource, renderDetailed, renderMetrics

#: rabbitmq_prometheus 3.10's metric names and types for what otter_tx reports.
#: Sources (rabbitmq-server v3.10.x): deps/rabbitmq_prometheus/src/collectors/
#: prometheus_rabbitmq_core_metrics_collector.erl (?METRICS_RAW, ?TOTALS,
#: build_info/identity_info), prometheus_rabbitmq_alarm_metrics_collector.erl,
#: and deps/rabbit/src/rabbit_global_counters.erl (?PROTOCOL_COUNTERS,
#: ?PROTOCOL_QUEUE_TYPE_COUNTERS, the dead-letter counters) emitted by
#: prometheus_rabbitmq_global_metrics_collector.erl with the rabbitmq_global_ prefix.
RABBITMQ_310 = {
    # ?TOTALS
    "rabbitmq_connections": "gauge",
    "rabbitmq_channels": "gauge",
    "rabbitmq_consumers": "gauge",
    "rabbitmq_queues": "gauge",
    # build_info(), identity_info()
    "rabbitmq_build_info": "untyped",
    "rabbitmq_identity_info": "untyped",
    # queue_coarse_metrics
    "rabbitmq_queue_messages_ready": "gauge",
    "rabbitmq_queue_messages_unacked": "gauge",
    "rabbitmq_queue_messages": "gauge",
    # queue_metrics
    "rabbitmq_queue_consumers": "gauge",
    "rabbitmq_queue_messages_ready_bytes": "gauge",
    "rabbitmq_queue_messages_paged_out": "gauge",
    "rabbitmq_queue_messages_paged_out_bytes": "gauge",
    # connection_churn_metrics
    "rabbitmq_connections_opened_total": "counter",
    "rabbitmq_connections_closed_total": "counter",
    "rabbitmq_channels_opened_total": "counter",
    "rabbitmq_channels_closed_total": "counter",
    "rabbitmq_queues_declared_total": "counter",
    "rabbitmq_queues_created_total": "counter",
    "rabbitmq_queues_deleted_total": "counter",
    # connection_coarse_metrics, connection_metrics
    "rabbitmq_connection_incoming_bytes_total": "counter",
    "rabbitmq_connection_outgoing_bytes_total": "counter",
    "rabbitmq_connection_channels": "gauge",
    # channel_metrics
    "rabbitmq_channel_consumers": "gauge",
    "rabbitmq_channel_messages_unacked": "gauge",
    "rabbitmq_consumer_prefetch": "gauge",
    "rabbitmq_channel_prefetch": "gauge",
    "rabbitmq_channel_messages_unconfirmed": "gauge",
    "rabbitmq_channel_messages_uncommitted": "gauge",
    "rabbitmq_channel_acks_uncommitted": "gauge",
    # channel_exchange_metrics
    "rabbitmq_channel_messages_published_total": "counter",
    "rabbitmq_channel_messages_confirmed_total": "counter",
    "rabbitmq_channel_messages_unroutable_returned_total": "counter",
    "rabbitmq_channel_messages_unroutable_dropped_total": "counter",
    # channel_queue_metrics
    "rabbitmq_channel_get_ack_total": "counter",
    "rabbitmq_channel_get_total": "counter",
    "rabbitmq_channel_messages_delivered_ack_total": "counter",
    "rabbitmq_channel_messages_delivered_total": "counter",
    "rabbitmq_channel_messages_redelivered_total": "counter",
    "rabbitmq_channel_messages_acked_total": "counter",
    "rabbitmq_channel_get_empty_total": "counter",
    # channel_queue_exchange_metrics
    "rabbitmq_queue_messages_published_total": "counter",
    # node_coarse_metrics, node_metrics
    "rabbitmq_process_open_fds": "gauge",
    "rabbitmq_process_open_tcp_sockets": "gauge",
    "rabbitmq_process_resident_memory_bytes": "gauge",
    "rabbitmq_disk_space_available_bytes": "gauge",
    "rabbitmq_process_max_fds": "gauge",
    "rabbitmq_process_max_tcp_sockets": "gauge",
    "rabbitmq_resident_memory_limit_bytes": "gauge",
    "rabbitmq_disk_space_available_limit_bytes": "gauge",
    "rabbitmq_erlang_uptime_seconds": "gauge",
    # prometheus_rabbitmq_alarm_metrics_collector
    "rabbitmq_alarms_file_descriptor_limit": "gauge",
    "rabbitmq_alarms_free_disk_space_watermark": "gauge",
    "rabbitmq_alarms_memory_used_watermark": "gauge",
    # rabbit_global_counters, protocol="amqp091"
    "rabbitmq_global_messages_received_total": "counter",
    "rabbitmq_global_messages_received_confirm_total": "counter",
    "rabbitmq_global_messages_routed_total": "counter",
    "rabbitmq_global_messages_unroutable_dropped_total": "counter",
    "rabbitmq_global_messages_unroutable_returned_total": "counter",
    "rabbitmq_global_messages_confirmed_total": "counter",
    "rabbitmq_global_publishers": "gauge",
    "rabbitmq_global_consumers": "gauge",
    # rabbit_global_counters, protocol="amqp091", queue_type=...
    "rabbitmq_global_messages_delivered_total": "counter",
    "rabbitmq_global_messages_delivered_consume_manual_ack_total": "counter",
    "rabbitmq_global_messages_delivered_consume_auto_ack_total": "counter",
    "rabbitmq_global_messages_delivered_get_manual_ack_total": "counter",
    "rabbitmq_global_messages_delivered_get_auto_ack_total": "counter",
    "rabbitmq_global_messages_get_empty_total": "counter",
    "rabbitmq_global_messages_redelivered_total": "counter",
    "rabbitmq_global_messages_acknowledged_total": "counter",
    # rabbit_global_counters, queue_type=..., dead_letter_strategy=...
    "rabbitmq_global_messages_dead_lettered_expired_total": "counter",
    "rabbitmq_global_messages_dead_lettered_rejected_total": "counter",
    "rabbitmq_global_messages_dead_lettered_maxlen_total": "counter",
    "rabbitmq_global_messages_dead_lettered_delivery_limit_total": "counter",
    "rabbitmq_global_messages_dead_lettered_confirmed_total": "counter",
}
#: with rabbitmq_stream enabled (as on the 3.10 peer): protocol="stream" error counters
RABBITMQ_310.update(("rabbitmq_global_stream_error_%s_total" % (name,), "counter") for name in (
    "access_refused", "authentication_failure", "frame_too_large", "internal_error", "precondition_failed",
    "publisher_does_not_exist", "sasl_authentication_failure_loopback", "sasl_challenge", "sasl_error",
    "sasl_mechanism_not_supported", "stream_already_exists", "stream_does_not_exist", "stream_not_available",
    "subscription_id_already_exists", "subscription_id_does_not_exist", "unknown_frame",
    "vhost_access_failure"))

#: the detailed families' names (rabbitmq_detailed_ + the core name), 3.10's
#: /metrics/detailed; exchange_names and exchange_bindings as untyped
RABBITMQ_310_DETAILED = {
    "rabbitmq_detailed_exchange_name": "untyped",
    "rabbitmq_detailed_exchange_bindings": "untyped",
}
RABBITMQ_310_DETAILED.update(
    ("rabbitmq_detailed_" + name[len("rabbitmq_"):], kind) for name, kind in RABBITMQ_310.items()
)


def families(text):
    """``{exposition name: (type, [(sample name, labels, value)])}`` parsed with prometheus_client."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    out = {}
    for f in text_string_to_metric_families(text):
        kind = "untyped" if f.type == "unknown" else f.type
        name = f.name + "_total" if kind == "counter" else f.name
        out[name] = (kind, [(s.name, s.labels, s.value) for s in f.samples])
    return out


def value(fams, name, **labels):
    """The value of the sample of family ``name`` with exactly ``labels``."""
    for _, sampleLabels, v in fams[name][1]:
        if sampleLabels == labels:
            return v
    raise KeyError((name, labels, fams[name][1]))


class MetricsTestCase(SynchronousTestCase):
    """A broker with an AMQP client in memory."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0)

    def client(self):
        """A FakeClient, handshaken, channel 1 open."""
        c = FakeClient(self.factory)
        c.openChannel(1)
        c.received()
        return c

    def metrics(self, perObject=False):
        """``/metrics`` (or per-object) parsed."""
        return families(renderMetrics(self.broker, 1.0, perObject))


class NamesTests(MetricsTestCase):
    """Every family is RabbitMQ 3.10's (name and type) or one of ours."""

    def test_namesAndTypes(self):
        """/metrics parses and each family's name and type are in the 3.10 table (or otter_)."""
        c = self.client()
        c.send(1, spec.QueueDeclare(0, "q", False, False, False, False, False, {}))
        fams = self.metrics()
        ours = {(n + "_total" if k == "counter" else n): k for n, k, _ in OTTER_FAMILIES}
        for name, (kind, _) in fams.items():
            if name.startswith("otter_"):
                self.assertEqual(ours.get(name), kind, name)
            else:
                self.assertEqual(RABBITMQ_310.get(name), kind, name)
        for name in ("rabbitmq_connections", "rabbitmq_global_messages_received_total",
                     "rabbitmq_process_resident_memory_bytes", "rabbitmq_process_open_fds",
                     "rabbitmq_process_max_fds", "rabbitmq_build_info", "rabbitmq_identity_info",
                     "rabbitmq_queues_declared_total"):
            self.assertIn(name, fams)

    def test_perObjectNames(self):
        """/metrics/per-object has the same names and types."""
        fams = self.metrics(perObject=True)
        ours = {(n + "_total" if k == "counter" else n): k for n, k, _ in OTTER_FAMILIES}
        for name, (kind, _) in fams.items():
            self.assertEqual((ours if name.startswith("otter_") else RABBITMQ_310).get(name), kind, name)

    def test_detailedNames(self):
        """/metrics/detailed with every family gives only rabbitmq_detailed_ names of 3.10's types."""
        from otter_tx.web.metrics import DETAILED_FAMILIES

        self.broker.vhosts["/"].declareQueue("q", None)
        fams = families(renderDetailed(self.broker, 1.0, DETAILED_FAMILIES + ("no_such_family",)))
        self.assertIn("rabbitmq_detailed_queue_messages_ready", fams)
        for name, (kind, _) in fams.items():
            self.assertEqual(RABBITMQ_310_DETAILED.get(name), kind, name)


class CounterTests(MetricsTestCase):
    """The global counters after a known workload."""

    def test_publishRouteDeliverAck(self):
        """5 routed (2 confirmed), 2 dropped, 1 returned; 1 got, 4 consumed (3 acked), 2 get-empty."""
        c = self.client()
        c.send(1, spec.QueueDeclare(0, "q", False, False, False, False, False, {}))
        for _ in range(3):
            c.publish(1, "", "q", b"x")
        c.publish(1, "", "nowhere", b"x")
        c.publish(1, "", "nowhere", b"x")
        c.publish(1, "", "nowhere", b"x", mandatory=True)
        c.send(2, spec.ChannelOpen(""))
        c.send(2, spec.ConfirmSelect(False))
        c.publish(2, "", "q", b"x")
        c.publish(2, "", "q", b"x")
        c.received()
        c.send(1, spec.BasicGet(0, "q", True))
        c.send(1, spec.BasicConsume(0, "q", "ctag", False, False, False, False, {}))
        tags = [m.delivery_tag for m in c.methods() if isinstance(m, spec.BasicDeliver)]
        self.assertEqual(len(tags), 4)
        c.send(1, spec.BasicAck(tags[0], False))
        c.send(1, spec.BasicAck(tags[2], True))
        c.send(1, spec.BasicCancel("ctag", False))
        c.send(1, spec.BasicGet(0, "q", False))
        c.send(1, spec.BasicGet(0, "q", False))
        c.received()
        fams = self.metrics()
        amqp = {"protocol": "amqp091"}
        classic = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}
        g = "rabbitmq_global_messages_"
        self.assertEqual(value(fams, g + "received_total", **amqp), 8)
        self.assertEqual(value(fams, g + "received_confirm_total", **amqp), 2)
        self.assertEqual(value(fams, g + "routed_total", **amqp), 5)
        self.assertEqual(value(fams, g + "unroutable_dropped_total", **amqp), 2)
        self.assertEqual(value(fams, g + "unroutable_returned_total", **amqp), 1)
        self.assertEqual(value(fams, g + "confirmed_total", **amqp), 2)
        self.assertEqual(value(fams, g + "delivered_get_auto_ack_total", **classic), 1)
        self.assertEqual(value(fams, g + "delivered_consume_manual_ack_total", **classic), 4)
        self.assertEqual(value(fams, g + "delivered_get_manual_ack_total", **classic), 0)
        self.assertEqual(value(fams, g + "delivered_total", **classic), 5)
        self.assertEqual(value(fams, g + "get_empty_total", **classic), 2)
        self.assertEqual(value(fams, g + "acknowledged_total", **classic), 3)
        # the cancelled consumer's fourth delivery is still unacked on the channel
        self.assertEqual(value(fams, "rabbitmq_queue_messages_unacked"), 1)
        self.assertEqual(value(fams, "rabbitmq_channel_messages_unacked"), 1)
        self.assertEqual(value(fams, "rabbitmq_global_publishers", **amqp), 2)
        self.assertEqual(value(fams, "rabbitmq_queues_declared_total"), 1)

    def test_getEmptyAndRedelivered(self):
        """basic.get on an empty queue counts get_empty; a rejected-and-requeued delivery is redelivered."""
        c = self.client()
        c.send(1, spec.QueueDeclare(0, "q", False, False, False, False, False, {}))
        c.send(1, spec.BasicGet(0, "q", False))
        c.publish(1, "", "q", b"x")
        c.send(1, spec.BasicGet(0, "q", False))
        c.send(1, spec.BasicReject(1, True))
        c.send(1, spec.BasicGet(0, "q", True))
        c.received()
        fams = self.metrics()
        classic = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}
        self.assertEqual(value(fams, "rabbitmq_global_messages_get_empty_total", **classic), 1)
        self.assertEqual(value(fams, "rabbitmq_global_messages_redelivered_total", **classic), 1)
        self.assertEqual(value(fams, "rabbitmq_global_messages_acknowledged_total", **classic), 0)

    def test_byQueueType(self):
        """
        Deliveries, gets and acks of a quorum queue and a stream count under their queue_type
        (rabbit_quorum_queue, rabbit_stream_queue), a classic queue's under rabbit_classic_queue;
        dead-lettering by queue type and strategy as 3.10 lists the lines.
        """
        c = self.client()
        c.send(1, spec.QueueDeclare(0, "cq", False, True, False, False, False, {}))
        c.send(1, spec.QueueDeclare(0, "qq", False, True, False, False, False,
                                    {"x-queue-type": "quorum", "x-delivery-limit": 0}))
        c.send(1, spec.QueueDeclare(0, "sq", False, True, False, False, False, {"x-queue-type": "stream"}))
        for q in ("cq", "qq", "qq", "sq", "sq", "sq"):
            c.publish(1, "", q, b"x")
        self.clock.advance(0)
        self.addCleanup(self.broker.streams.close)
        c.send(1, spec.BasicGet(0, "cq", True))
        c.send(1, spec.BasicGet(0, "qq", False))
        c.send(1, spec.BasicQos(0, 10, False))
        c.send(1, spec.BasicConsume(0, "sq", "s", False, False, False, False, {"x-stream-offset": "first"}))
        for _ in range(3):
            self.clock.advance(0)
        tags = [m.delivery_tag for m in c.methods() if isinstance(m, (spec.BasicDeliver, spec.BasicGetOk))]
        self.assertEqual(len(tags), 5)
        c.send(1, spec.BasicAck(tags[-1], True))
        # the quorum queue's other message: rejected past its delivery limit of 0, dead-lettered (no DLX)
        c.send(1, spec.BasicGet(0, "qq", False))
        got = [m.delivery_tag for m in c.methods() if isinstance(m, spec.BasicGetOk)]
        self.assertEqual(len(got), 1)
        c.send(1, spec.BasicReject(got[0], True))
        self.clock.advance(0)
        fams = self.metrics()
        g = "rabbitmq_global_messages_"
        for qtype, delivered, acked in (("rabbit_classic_queue", 1, 0), ("rabbit_quorum_queue", 2, 1),
                                        ("rabbit_stream_queue", 3, 3)):
            labels = {"protocol": "amqp091", "queue_type": qtype}
            self.assertEqual(value(fams, g + "delivered_total", **labels), delivered, qtype)
            self.assertEqual(value(fams, g + "acknowledged_total", **labels), acked, qtype)
        self.assertEqual(value(fams, g + "delivered_consume_manual_ack_total", protocol="amqp091",
                               queue_type="rabbit_stream_queue"), 3)
        self.assertEqual(value(fams, g + "delivered_get_manual_ack_total", protocol="amqp091",
                               queue_type="rabbit_quorum_queue"), 2)
        self.assertEqual(value(fams, g + "delivered_get_auto_ack_total", protocol="amqp091",
                               queue_type="rabbit_classic_queue"), 1)
        limit = g + "dead_lettered_delivery_limit_total"
        self.assertEqual(value(fams, limit, queue_type="rabbit_quorum_queue", dead_letter_strategy="disabled"), 1)
        self.assertEqual(value(fams, limit, queue_type="rabbit_quorum_queue", dead_letter_strategy="at_least_once"),
                         0)
        self.assertEqual(value(fams, g + "dead_lettered_maxlen_total", queue_type="rabbit_quorum_queue",
                               dead_letter_strategy="at_most_once"), 0)
        self.assertEqual(value(fams, g + "dead_lettered_confirmed_total", queue_type="rabbit_quorum_queue",
                               dead_letter_strategy="at_least_once"), 0)

    def test_churn(self):
        """Connections, channels and queues opened/created/declared/closed/deleted are counted."""
        c = self.client()
        c.send(2, spec.ChannelOpen(""))
        c.send(2, spec.ChannelClose(200, "bye", 0, 0))
        c.send(1, spec.QueueDeclare(0, "q", False, False, False, False, False, {}))
        c.send(1, spec.QueueDeclare(0, "q", False, False, False, False, False, {}))
        c.send(1, spec.QueueDeclare(0, "q", True, False, False, False, False, {}))
        c.send(1, spec.QueueDeclare(0, "", False, False, True, False, False, {}))
        c.send(1, spec.QueueDelete(0, "q", False, False, False))
        c2 = self.client()
        c2.send(0, spec.ConnectionClose(200, "bye", 0, 0))
        c2.protocol.connectionLost(None)
        c.received()
        fams = self.metrics()
        self.assertEqual(value(fams, "rabbitmq_connections_opened_total"), 2)
        self.assertEqual(value(fams, "rabbitmq_connections_closed_total"), 1)
        self.assertEqual(value(fams, "rabbitmq_channels_opened_total"), 3)
        self.assertEqual(value(fams, "rabbitmq_channels_closed_total"), 2)
        self.assertEqual(value(fams, "rabbitmq_queues_declared_total"), 3)
        self.assertEqual(value(fams, "rabbitmq_queues_created_total"), 2)
        self.assertEqual(value(fams, "rabbitmq_queues_deleted_total"), 1)
        self.assertEqual(value(fams, "rabbitmq_connections"), 1)
        self.assertEqual(value(fams, "rabbitmq_channels"), 1)
        self.assertEqual(value(fams, "rabbitmq_queues"), 1)

    def test_deadLettered(self):
        """Expired messages count under dead_letter_strategy disabled (no DLX) or at_most_once, by vhost."""
        c = self.client()
        c.send(1, spec.QueueDeclare(0, "plain", False, False, False, False, False, {"x-message-ttl": 10}))
        c.send(1, spec.QueueDeclare(0, "dl", False, False, False, False, False,
                                    {"x-message-ttl": 10, "x-dead-letter-exchange": ""}))
        c.publish(1, "", "plain", b"x")
        c.publish(1, "", "plain", b"x")
        c.publish(1, "", "dl", b"x")
        self.clock.advance(1)
        c.received()
        fams = self.metrics()
        name = "rabbitmq_global_messages_dead_lettered_expired_total"
        self.assertEqual(value(fams, name, queue_type="rabbit_classic_queue", dead_letter_strategy="disabled"), 2)
        self.assertEqual(value(fams, name, queue_type="rabbit_classic_queue",
                               dead_letter_strategy="at_most_once"), 1)
        self.assertEqual(value(fams, "otter_messages_dead_lettered_total", vhost="/", reason="expired",
                               dead_letter_strategy="disabled"), 2)


class PerObjectTests(MetricsTestCase):
    """Per-object and detailed labels."""

    def test_queueLabels(self):
        """/metrics/per-object labels queue families with vhost and queue."""
        self.broker.addVHost("v")
        self.broker.vhosts["/"].declareQueue("a", None)
        self.broker.vhosts["v"].declareQueue("b", None)
        c = self.client()
        c.publish(1, "", "a", b"x")
        c.received()
        fams = self.metrics(perObject=True)
        self.assertEqual(value(fams, "rabbitmq_queue_messages_ready", vhost="/", queue="a"), 1)
        self.assertEqual(value(fams, "rabbitmq_queue_messages_ready", vhost="v", queue="b"), 0)
        name = c.protocol.name
        self.assertGreater(value(fams, "rabbitmq_connection_incoming_bytes_total", vhost="/", connection=name), 0)

    def test_detailedVhostFilter(self):
        """/metrics/detailed?vhost=v limits the queue families to that vhost."""
        self.broker.addVHost("v")
        self.broker.vhosts["/"].declareQueue("a", None)
        self.broker.vhosts["v"].declareQueue("b", None)
        fams = families(renderDetailed(self.broker, 1.0, ["queue_coarse_metrics"], ["v"]))
        self.assertEqual(sorted(fams), ["rabbitmq_detailed_queue_messages", "rabbitmq_detailed_queue_messages_ready",
                                        "rabbitmq_detailed_queue_messages_unacked"])
        self.assertEqual([s[1] for s in fams["rabbitmq_detailed_queue_messages_ready"][1]],
                         [{"vhost": "v", "queue": "b"}])

    def test_delayedHeld(self):
        """otter_delayed_messages gives the messages an x-delayed-message exchange holds."""
        c = self.client()
        c.send(1, spec.ExchangeDeclare(0, "d", "x-delayed-message", False, False, False, False, False,
                                       {"x-delayed-type": "direct"}))
        c.publish(1, "d", "k", b"x", props={"headers": {"x-delay": 5000}})
        c.received()
        fams = self.metrics()
        self.assertEqual(value(fams, "otter_delayed_messages", vhost="/", exchange="d"), 1)


class ResourceTests(SynchronousTestCase):
    """The listener's site: the three paths, no authentication, 404 elsewhere."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.treq = StubTreq(PrometheusResource(self.broker, self.clock))

    def get(self, path):
        """(code, content-type, body) of GET ``path``."""
        d = self.treq.get("http://localhost" + path)
        r = self.successResultOf(d)
        body = self.successResultOf(r.content())
        ctype = r.headers.getRawHeaders(b"content-type", [b""])[0]
        return r.code, ctype, body

    def test_paths(self):
        """/metrics, /metrics/per-object and /metrics/detailed answer 200 in text format 0.0.4."""
        self.broker.vhosts["/"].declareQueue("q", None)
        for path in ("/metrics", "/metrics/per-object", "/metrics/detailed?family=queue_coarse_metrics"):
            code, ctype, body = self.get(path)
            self.assertEqual(code, 200, path)
            self.assertTrue(ctype.startswith(b"text/plain; version=0.0.4"), ctype)
            self.assertTrue(families(body), path)
        _, _, body = self.get("/metrics/detailed?family=queue_coarse_metrics")
        self.assertIn(b'rabbitmq_detailed_queue_messages_ready{queue="q",vhost="/"}', body)

    def test_uptime(self):
        """rabbitmq_erlang_uptime_seconds counts from the listener's start."""
        self.clock.advance(42)
        _, _, body = self.get("/metrics")
        self.assertEqual(value(families(body), "rabbitmq_erlang_uptime_seconds"), 42)

    def test_notFound(self):
        """Other paths are 404, as rabbitmq_prometheus answers them."""
        for path in ("/", "/api/overview", "/metrics/nope"):
            self.assertEqual(self.get(path)[0], 404, path)
