"""
The Prometheus endpoint, as RabbitMQ 3.10's ``rabbitmq_prometheus`` plugin
serves it: metric names, types, help texts and labels from its
``prometheus_rabbitmq_core_metrics_collector.erl``,
``prometheus_rabbitmq_global_metrics_collector.erl`` (the
``rabbit_global_counters`` families, prefixed ``rabbitmq_global_``) and
``prometheus_rabbitmq_alarm_metrics_collector.erl``; exposition by the
``prometheus_client`` library (text format 0.0.4) on a registry of our own
(no global registry, no library process collector: RabbitMQ names its own
process metrics).

Three views, as RabbitMQ's three paths:

* ``/metrics`` (:func:`renderMetrics`): aggregated values, no per-object
  labels;
* ``/metrics/per-object``: the same families, queue metrics labelled
  ``vhost``/``queue`` and connection metrics ``vhost``/``connection``;
* ``/metrics/detailed?family=F&vhost=V`` (:func:`renderDetailed`): only the
  asked families (:data:`DETAILED_FAMILIES`), per object, with the
  ``rabbitmq_detailed_`` prefix; ``vhost`` (repeatable) limits the queue and
  exchange families to those vhosts.

Our own additions are named ``otter_`` (see :data:`OTTER_FAMILIES`).  The
listener is :class:`PrometheusResource` (``--prometheus``, default
``tcp:15692``), served without authentication like RabbitMQ's.
"""

import functools
import os

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    UnknownMetricFamily,
)
from twisted.web.resource import Resource

from otter_tx import __version__
from otter_tx.broker.counters import STREAM_ERRORS
from otter_tx.broker.lateness import BUCKETS_MS
from otter_tx.resources.process_memory import rssBytes
from otter_tx.web._format import NODE, nodeName

#: the text exposition format generate_latest writes (newer prometheus_client
#: versions name 1.0.0 in their CONTENT_TYPE_LATEST; the text is the same)
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

#: the families ``/metrics/detailed?family=...`` knows (RabbitMQ 3.10 names);
#: others are ignored, as RabbitMQ ignores families it has no data for
DETAILED_FAMILIES = (
    "queue_coarse_metrics",
    "queue_consumer_count",
    "queue_metrics",
    "connection_churn_metrics",
    "connection_coarse_metrics",
    "connection_metrics",
    "channel_metrics",
    "channel_exchange_metrics",
    "channel_queue_metrics",
    "channel_queue_exchange_metrics",
    "node_coarse_metrics",
    "node_metrics",
    "exchange_names",
    "exchange_bindings",
)

#: our reaping-lateness histogram (name, help); buckets and kinds in otter_tx.broker.lateness
LATENESS_FAMILY = (
    "otter_reaping_lateness_seconds",
    "How late expiries were reaped after their due time, by kind: message (message TTL, per-message "
    "expiration), queue (x-expires), delayed (x-delayed-message holds)",
)

#: our families (name without ``_total``, type, help); not in RabbitMQ
OTTER_FAMILIES = (
    ("otter_dead_letter_dropped", "counter",
     "Messages dropped because their queue's dead-letter exchange does not exist"),
    ("otter_messages_dead_lettered", "counter",
     "Messages that left a queue as dead letters, by vhost, reason (expired, rejected, maxlen) "
     "and dead_letter_strategy (disabled: the queue has no dead-letter exchange)"),
    ("otter_delayed_messages", "gauge",
     "Messages held by an x-delayed-message exchange until their delay is over"),
    ("otter_queue_messages_published", "counter",
     "Total number of messages published to a queue"),
    (LATENESS_FAMILY[0], "histogram", LATENESS_FAMILY[1]),
)

_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")
_REASON_HELP = {
    "delivery_limit": "Total number of messages dead-lettered due to delivery-limit exceeded",
    "expired": "Total number of messages dead-lettered due to message TTL exceeded",
    "rejected": "Total number of messages dead-lettered due to basic.reject or basic.nack",
    "maxlen": "Total number of messages dead-lettered due to overflow drop-head or reject-publish-dlx",
}
_CLASSIC = "rabbit_classic_queue"
_QUORUM = "rabbit_quorum_queue"
_STREAM_QUEUE = "rabbit_stream_queue"
_AMQP = "amqp091"
_STREAM = "stream"
#: the dead_letter_strategy lines of each (queue type, reason), as RabbitMQ 3.10 lists them (a classic
#: queue has no delivery limit there: otter_tx lists those lines once one counted something)
_DEAD_LETTER_LINES = {
    ("classic", "expired"): ("at_most_once", "disabled"),
    ("classic", "rejected"): ("at_most_once", "disabled"),
    ("classic", "maxlen"): ("at_most_once", "disabled"),
    ("classic", "delivery_limit"): (),
    ("quorum", "expired"): ("at_least_once", "at_most_once", "disabled"),
    ("quorum", "rejected"): ("at_least_once", "at_most_once", "disabled"),
    ("quorum", "maxlen"): ("at_most_once", "disabled"),
    ("quorum", "delivery_limit"): ("at_least_once", "at_most_once", "disabled"),
}


def _deadLettered(snap, dead, qtype, strategy, reason):
    """The global dead-lettered count of one line (``Broker.deadLetterCounts``; else the vhosts' totals)."""
    if dead is not None:
        return dead.get((qtype, strategy, reason), 0)
    if qtype != "classic" or strategy == "at_least_once":
        return 0
    counts = "deadLetterDisabled" if strategy == "disabled" else "deadLettered"
    return sum(getattr(vh, counts).get(reason, 0) for vh in snap.vhosts)


def _counter(prefix, name, help, labels=()):
    # prometheus_client takes the name without _total and writes it back
    return CounterMetricFamily(prefix + name, help, labels=list(labels))


def _gauge(prefix, name, help, labels=()):
    return GaugeMetricFamily(prefix + name, help, labels=list(labels))


def openFds():
    """Open file descriptors of this process (int), None where ``/proc/self/fd`` is missing."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def maxFds():
    """The soft ``RLIMIT_NOFILE`` (int), None where unknown."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == getattr(resource, "RLIM_INFINITY", -1) else soft


class _Snapshot:
    """The broker objects one scrape reads, in a stable order."""

    def __init__(self, broker, vhostNames=None):
        self.broker = broker
        self.vhosts = [vh for _, vh in sorted(broker.vhosts.items())]
        shown = self.vhosts
        if vhostNames:
            shown = [vh for vh in self.vhosts if vh.name in vhostNames]
        self.shownVhosts = shown
        self.queues = [q for vh in shown for _, q in sorted(vh.queues.items())]
        self.allQueues = (self.queues if shown is self.vhosts  # unfiltered (/metrics): sort once
                          else [q for vh in self.vhosts for _, q in sorted(vh.queues.items())])
        self.conns = sorted(broker.connections, key=lambda c: getattr(c, "name", ""))
        self.channels = [ch for c in self.conns for _, ch in sorted(c.channels.items())]
        # the stream protocol's open connections and their subscriptions per (vhost, stream):
        # RabbitMQ 3.10 counts them as connections and consumers (checked on the peer)
        self.streamConns = sorted((c for c in getattr(getattr(broker, "streamCounters", None), "connections", ())
                                   if c.vhost is not None and not c.closed), key=lambda c: c.name)
        self.streamSubs = {}
        for c in self.streamConns:
            for sub in c.subscriptions.values():
                key = (c.vhost, sub.stream)
                self.streamSubs[key] = self.streamSubs.get(key, 0) + 1


def _connLabels(c):
    vhost = getattr(c, "vhost", None)
    if vhost is not None and not isinstance(vhost, str):
        vhost = vhost.name  # an AMQP connection's VHost (a stream connection has the name)
    return [vhost or "", getattr(c, "name", "")]


def _bytesIn(c):
    """Bytes received on an AMQP or a stream protocol connection."""
    return c.recvOct if hasattr(c, "recvOct") else c.bytesIn


def _bytesOut(c):
    """Bytes sent on an AMQP or a stream protocol connection."""
    return c.sendOct if hasattr(c, "sendOct") else c.bytesOut


def _channelLabels(ch):
    return [_connLabels(ch.connection)[0], "%s (%d)" % (getattr(ch.connection, "name", ""), ch.number)]


def _objectFamilies(prefix, perObject, objects, labelNames, labelsOf, specs):
    """
    One family per ``(name, kind, help, value)`` of ``specs``: a sample per
    object labelled ``labelsOf(obj)`` when ``perObject``, else one sample,
    the sum of ``value(obj)`` over ``objects``.
    """
    for name, kind, help, value in specs:
        make = _counter if kind == "counter" else _gauge
        if perObject:
            f = make(prefix, name, help, labelNames)
            for o in objects:
                f.add_metric(labelsOf(o), value(o))
        else:
            f = make(prefix, name, help)
            f.add_metric([], sum(value(o) for o in objects))
        yield f


class _Collector:
    """A ``prometheus_client`` collector that collects only when asked."""

    def describe(self):
        """Nothing to describe ahead (the registry must not collect at registration)."""
        return []


class BrokerCollector(_Collector):
    """
    A ``prometheus_client`` custom collector over a broker: :meth:`collect`
    yields the metric families of one view.

    :param broker: the :class:`~otter_tx.broker.broker.Broker`.
    :param uptime: a callable returning seconds (float) since start.
    :param perObject: label queue and connection metrics per object.
    :param diskMonitor: the service's :class:`~otter_tx.resources.alarms.DiskMonitor`
        or None (no disk metrics then).
    """

    def __init__(self, broker, uptime, perObject=False, diskMonitor=None):
        self.broker = broker
        self.uptime = uptime
        self.perObject = perObject
        self.diskMonitor = diskMonitor

    def collect(self):
        """The families of ``/metrics`` (or ``/metrics/per-object``)."""
        snap = _Snapshot(self.broker)
        prefix = "rabbitmq_"
        for family in (
            self._queueCoarse, self._queueMetrics, self._connectionChurn,
            self._connectionCoarse, self._connectionMetrics, self._channelMetrics,
            self._channelExchangeMetrics, self._channelQueueMetrics, self._channelQueueExchangeMetrics,
            self._nodeCoarse, self._nodeMetrics,
        ):
            for f in family(snap, prefix, self.perObject):
                yield f
        for f in self._totals(snap):
            yield f
        for f in self._info():
            yield f
        for f in self._global(snap):
            yield f
        for f in self._alarms():
            yield f
        for f in self._otter(snap):
            yield f
        yield self._lateness()

    # --- RabbitMQ's ?TOTALS, build and identity info ---------------------------------

    def _totals(self, snap):
        # stream protocol connections and subscriptions count too (checked on the 3.10 peer)
        yield GaugeMetricFamily("rabbitmq_connections", "Connections currently open",
                                value=len(snap.conns) + len(snap.streamConns))
        yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open", value=len(snap.channels))
        yield GaugeMetricFamily("rabbitmq_consumers", "Consumers currently connected",
                                value=sum(len(q.consumers) for q in snap.allQueues) + sum(snap.streamSubs.values()))
        yield GaugeMetricFamily("rabbitmq_queues", "Queues available", value=len(snap.allQueues))

    def _info(self):
        f = UnknownMetricFamily("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
                                labels=["rabbitmq_version", "prometheus_plugin_version",
                                        "prometheus_client_version", "erlang_version",
                                        "product_name", "product_version"])
        f.add_metric(["3.10.8", __version__, distVersion("prometheus_client"), "", "otter_tx", __version__], 1)
        yield f
        f = UnknownMetricFamily("rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
                                labels=["rabbitmq_node", "rabbitmq_cluster"])
        # in a cluster each node serves its own metrics, this node's name beside the cluster's
        broker = self.broker
        f.add_metric([nodeName(broker), broker.globalParameters.get("cluster_name", NODE)], 1)
        yield f

    # --- the families (also the detailed ones) ---------------------------------------

    def _queueFamilies(self, snap, prefix, perObject, specs):
        return _objectFamilies(prefix, perObject, snap.queues, ("vhost", "queue"),
                               lambda q: [q.vhost.name, q.name], specs)

    def _queueCoarse(self, snap, prefix, perObject):
        return self._queueFamilies(snap, prefix, perObject, (
            ("queue_messages_ready", "gauge", "Messages ready to be delivered to consumers",
             lambda q: q.readyCount),
            ("queue_messages_unacked", "gauge", "Messages delivered to consumers but not yet acknowledged",
             lambda q: q.unackedCount),
            ("queue_messages", "gauge", "Sum of ready and unacknowledged messages - total queue depth",
             lambda q: q.readyCount + q.unackedCount),
        ))

    def _queueConsumerCount(self, snap, prefix, perObject):
        return self._queueFamilies(snap, prefix, perObject, (
            ("queue_consumers", "gauge", "Consumers on a queue", self._consumersOf(snap)),
        ))

    @staticmethod
    def _consumersOf(snap):
        """A queue's consumers: its AMQP consumers and the stream protocol's subscriptions to it."""
        subs = snap.streamSubs
        if not subs:
            return lambda q: len(q.consumers)
        return lambda q: len(q.consumers) + subs.get((q.vhost.name, q.name), 0)

    def _queueMetrics(self, snap, prefix, perObject):
        return self._queueFamilies(snap, prefix, perObject, (
            ("queue_consumers", "gauge", "Consumers on a queue", self._consumersOf(snap)),
            ("queue_messages_ready_bytes", "gauge", "Size in bytes of ready messages",
             lambda q: q.readyBytes),
            ("queue_messages_paged_out", "gauge", "Messages paged out to disk", lambda q: q.pagedCount),
            ("queue_messages_paged_out_bytes", "gauge", "Size in bytes of messages paged out to disk",
             lambda q: q.pagedBytes),
        ))

    def _connectionChurn(self, snap, prefix, perObject):
        c = self.broker.counters
        for name, help, value in (
            ("connections_opened_total", "Total number of connections opened", c.connectionsOpened),
            ("connections_closed_total", "Total number of connections closed or terminated",
             c.connectionsClosed),
            ("channels_opened_total", "Total number of channels opened", c.channelsOpened),
            ("channels_closed_total", "Total number of channels closed", c.channelsClosed),
            ("queues_declared_total", "Total number of queues declared", c.queuesDeclared),
            ("queues_created_total", "Total number of queues created", c.queuesCreated),
            ("queues_deleted_total", "Total number of queues deleted", c.queuesDeleted),
        ):
            f = _counter(prefix, name, help)
            f.add_metric([], value)
            yield f

    def _connectionCoarse(self, snap, prefix, perObject):
        conns = snap.conns + snap.streamConns
        return _objectFamilies(prefix, perObject, conns, ("vhost", "connection"), _connLabels, (
            ("connection_incoming_bytes_total", "counter", "Total number of bytes received on a connection",
             _bytesIn),
            ("connection_outgoing_bytes_total", "counter", "Total number of bytes sent on a connection",
             _bytesOut),
        ))

    def _connectionMetrics(self, snap, prefix, perObject):
        conns = snap.conns + snap.streamConns
        return _objectFamilies(prefix, perObject, conns, ("vhost", "connection"), _connLabels, (
            ("connection_channels", "gauge", "Channels on a connection", lambda c: len(getattr(c, "channels", ()))),
        ))

    def _channelMetrics(self, snap, prefix, perObject):
        return _objectFamilies(prefix, perObject, snap.channels, ("vhost", "channel"), _channelLabels, (
            ("channel_consumers", "gauge", "Consumers on a channel", lambda ch: len(ch.consumers)),
            ("channel_messages_unacked", "gauge", "Delivered but not yet acknowledged messages",
             lambda ch: ch.unackedCount),
            ("consumer_prefetch", "gauge", "Limit of unacknowledged messages for each consumer",
             lambda ch: ch.prefetchCount),
            ("channel_prefetch", "gauge", "Total limit of unacknowledged messages for all consumers on a channel",
             lambda ch: ch.globalPrefetch),
            ("channel_messages_unconfirmed", "gauge", "Published but not yet confirmed messages",
             lambda ch: ch.session.pendingCounts()[0]),
            ("channel_messages_uncommitted", "gauge", "Messages received in a transaction but not yet committed",
             lambda ch: ch.session.pendingCounts()[1]),
            ("channel_acks_uncommitted", "gauge", "Message acknowledgements in a transaction not yet committed",
             lambda ch: ch.session.pendingCounts()[2]),
        ))

    # --- message counters per channel (message rates, otter_tx.broker.stats) ---------
    #
    # RabbitMQ keys channel_exchange_metrics by (channel, exchange),
    # channel_queue_metrics by (channel, queue) and
    # channel_queue_exchange_metrics by (channel, (queue, exchange)); otter_tx
    # counts per channel (and publishes per queue), so the per-object samples
    # carry the channel's ``vhost``/``channel`` labels (the queue's
    # ``vhost``/``queue`` for queue_messages_published_total).  Aggregated, the
    # values are the sums over the open channels, as RabbitMQ's tables hold
    # only those.

    def _channelExchangeMetrics(self, snap, prefix, perObject):
        return _objectFamilies(prefix, perObject, snap.channels, ("vhost", "channel"), _channelLabels, (
            ("channel_messages_published_total", "counter",
             "Total number of messages published into an exchange on a channel",
             lambda ch: ch.session.stats.publish),
            ("channel_messages_confirmed_total", "counter",
             "Total number of messages published into an exchange and confirmed on the channel",
             lambda ch: ch.session.stats.confirm),
            ("channel_messages_unroutable_returned_total", "counter",
             "Total number of messages published as mandatory into an exchange and returned to the "
             "publisher as unroutable", lambda ch: ch.session.stats.returnUnroutable),
            ("channel_messages_unroutable_dropped_total", "counter",
             "Total number of messages published as non-mandatory into an exchange and dropped as "
             "unroutable", lambda ch: ch.session.stats.dropUnroutable),
        ))

    def _channelQueueMetrics(self, snap, prefix, perObject):
        return _objectFamilies(prefix, perObject, snap.channels, ("vhost", "channel"), _channelLabels, (
            ("channel_get_ack_total", "counter",
             "Total number of messages fetched with basic.get in manual acknowledgement mode",
             lambda ch: ch.session.stats.get),
            ("channel_get_total", "counter",
             "Total number of messages fetched with basic.get in automatic acknowledgement mode",
             lambda ch: ch.session.stats.getNoAck),
            ("channel_messages_delivered_ack_total", "counter",
             "Total number of messages delivered to consumers in manual acknowledgement mode",
             lambda ch: ch.session.stats.deliver),
            ("channel_messages_delivered_total", "counter",
             "Total number of messages delivered to consumers in automatic acknowledgement mode",
             lambda ch: ch.session.stats.deliverNoAck),
            ("channel_messages_redelivered_total", "counter", "Total number of messages redelivered to consumers",
             lambda ch: ch.session.stats.redeliver),
            ("channel_messages_acked_total", "counter", "Total number of messages acknowledged by consumers",
             lambda ch: ch.session.stats.ack),
            ("channel_get_empty_total", "counter",
             "Total number of times basic.get operations fetched no message",
             lambda ch: ch.session.stats.getEmpty),
        ))

    def _channelQueueExchangeMetrics(self, snap, prefix, perObject):
        return self._queueFamilies(snap, prefix, perObject, (
            ("queue_messages_published_total", "counter", "Total number of messages published to queues",
             lambda q: q.publishedCount),
        ))

    def _nodeCoarse(self, snap, prefix, perObject):
        fds = openFds()
        if fds is not None:
            yield GaugeMetricFamily(prefix + "process_open_fds", "Open file descriptors", value=fds)
        yield GaugeMetricFamily(prefix + "process_open_tcp_sockets", "Open TCP sockets",
                                value=len(snap.conns) + len(snap.streamConns))
        rss = rssBytes()
        if rss is not None:
            yield GaugeMetricFamily(prefix + "process_resident_memory_bytes", "Memory used in bytes",
                                    value=rss)
        free = self._diskFree()
        if free is not None:
            yield GaugeMetricFamily(prefix + "disk_space_available_bytes", "Disk space available in bytes",
                                    value=free)

    def _nodeMetrics(self, snap, prefix, perObject):
        limit = maxFds()
        if limit is not None:
            yield GaugeMetricFamily(prefix + "process_max_fds", "Open file descriptors limit", value=limit)
            yield GaugeMetricFamily(prefix + "process_max_tcp_sockets", "Open TCP sockets limit",
                                    value=limit)
        watermark = self.broker.memoryHighWatermark
        if watermark is not None:
            yield GaugeMetricFamily(prefix + "resident_memory_limit_bytes", "Memory high watermark in bytes",
                                    value=watermark)
        if self.diskMonitor is not None:
            yield GaugeMetricFamily(prefix + "disk_space_available_limit_bytes",
                                    "Free disk space low watermark in bytes", value=self.diskMonitor.limit)
        yield GaugeMetricFamily(prefix + "erlang_uptime_seconds", "Node uptime", value=self.uptime())

    def _diskFree(self):
        m = self.diskMonitor
        if m is None:
            return None
        return m.free

    def _exchangeNames(self, snap, prefix, perObject):
        f = UnknownMetricFamily(prefix + "exchange_name", "Enumerates exchanges without any additional info. "
                                "This value is cluster-wide. A cheaper alternative to `exchange_bindings`",
                                labels=["vhost", "exchange", "type"])
        for vh in snap.shownVhosts:
            for name, ex in sorted(vh.exchanges.items()):
                f.add_metric([vh.name, name, ex.type], 1)
        yield f

    def _exchangeBindings(self, snap, prefix, perObject):
        f = UnknownMetricFamily(prefix + "exchange_bindings", "Number of bindings for an exchange. "
                                "This value is cluster-wide.", labels=["vhost", "exchange", "type"])
        counts = {}
        for vh in snap.shownVhosts:
            for q in vh.queues.values():
                for (ex, _, _) in q.bindings:
                    counts[(vh.name, ex.name)] = counts.get((vh.name, ex.name), 0) + 1
        for vh in snap.shownVhosts:
            for name, ex in sorted(vh.exchanges.items()):
                if name == "":
                    continue
                f.add_metric([vh.name, name, ex.type], counts.get((vh.name, name), 0))
        yield f

    # --- rabbit_global_counters ------------------------------------------------------

    def _global(self, snap):
        c = self.broker.counters.frozen()  # the message totals summed once for the ~19 reads below
        sc = getattr(self.broker, "streamCounters", None)
        amqp, stream = [_AMQP], [_STREAM]
        for name, help, value, streamValue in (
            ("messages_received_total", "Total number of messages received from publishers", c.received,
             sc and sc.received),
            ("messages_received_confirm_total",
             "Total number of messages received from publishers expecting confirmations", c.receivedConfirm,
             sc and sc.received),
            # (RabbitMQ 3.10's stream protocol counts no routed or unroutable messages: checked on the peer)
            ("messages_routed_total", "Total number of messages routed to queues or streams", c.routed, 0),
            ("messages_unroutable_dropped_total",
             "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
             c.unroutableDropped, 0),
            ("messages_unroutable_returned_total",
             "Total number of messages published as mandatory into an exchange and returned to the "
             "publisher as unroutable", c.unroutableReturned, 0),
            ("messages_confirmed_total", "Total number of messages confirmed to publishers", c.confirmed,
             sc and sc.confirmed),
        ):
            f = _counter("rabbitmq_global_", name, help, ("protocol",))
            f.add_metric(amqp, value)
            if sc is not None:
                f.add_metric(stream, streamValue)
            yield f
        sessions = [ch.session for ch in snap.channels if getattr(ch, "session", None) is not None]
        f = _gauge("rabbitmq_global_", "publishers", "Current number of publishers", ("protocol",))
        f.add_metric(amqp, sum(1 for s in sessions if s.publisher))
        if sc is not None:
            f.add_metric(stream, sc.publishers())
        yield f
        f = _gauge("rabbitmq_global_", "consumers", "Current number of consumers", ("protocol",))
        f.add_metric(amqp, sum(len(s.consumers) for s in sessions))
        if sc is not None:
            f.add_metric(stream, sc.consumers())
        yield f
        # by queue type: the quorum queues' and streams' own counts, a classic queue's the rest
        typed = getattr(self.broker, "typeCounts", {})
        quorum, streams = typed.get("quorum"), typed.get("stream")
        for name, help, value, attrs in (
            ("messages_delivered_total", "Total number of messages delivered to consumers", c.delivered,
             ("deliver", "deliverNoAck", "get", "getNoAck")),
            ("messages_delivered_consume_manual_ack_total",
             "Total number of messages delivered to consumers using basic.consume with manual acknowledgment",
             c.deliveredConsumeManualAck, ("deliver",)),
            ("messages_delivered_consume_auto_ack_total",
             "Total number of messages delivered to consumers using basic.consume with automatic "
             "acknowledgment", c.deliveredConsumeAutoAck, ("deliverNoAck",)),
            ("messages_delivered_get_manual_ack_total",
             "Total number of messages delivered to consumers using basic.get with manual acknowledgment",
             c.deliveredGetManualAck, ("get",)),
            ("messages_delivered_get_auto_ack_total",
             "Total number of messages delivered to consumers using basic.get with automatic acknowledgment",
             c.deliveredGetAutoAck, ("getNoAck",)),
            ("messages_get_empty_total", "Total number of times basic.get operations fetched no message",
             c.getEmpty, ("getEmpty",)),
            ("messages_redelivered_total", "Total number of messages redelivered to consumers", c.redelivered,
             ("redeliver",)),
            ("messages_acknowledged_total", "Total number of messages acknowledged by consumers",
             c.acknowledged, ("ack",)),
        ):
            f = _counter("rabbitmq_global_", name, help, ("protocol", "queue_type"))
            q = sum(getattr(quorum, a) for a in attrs) if quorum is not None else 0
            st = sum(getattr(streams, a) for a in attrs) if streams is not None else 0
            f.add_metric([_AMQP, _CLASSIC], max(value - q - st, 0))
            if quorum is not None:
                f.add_metric([_AMQP, _QUORUM], q)
            if streams is not None:
                f.add_metric([_AMQP, _STREAM_QUEUE], st)
            if sc is not None:
                # the stream protocol's deliveries (RabbitMQ counts them in messages_delivered_total only)
                f.add_metric([_STREAM, _STREAM_QUEUE], sc.delivered if name == "messages_delivered_total" else 0)
            yield f
        dead = getattr(self.broker, "deadLetterCounts", None)
        for reason in _REASONS:
            f = _counter("rabbitmq_global_", "messages_dead_lettered_%s_total" % (reason,), _REASON_HELP[reason],
                         ("queue_type", "dead_letter_strategy"))
            for qtype, label in (("classic", _CLASSIC), ("quorum", _QUORUM)):
                for strategy in _DEAD_LETTER_LINES[(qtype, reason)]:
                    f.add_metric([label, strategy], _deadLettered(snap, dead, qtype, strategy, reason))
            if reason == "delivery_limit":
                for strategy in ("at_most_once", "disabled"):
                    n = _deadLettered(snap, dead, "classic", strategy, reason)
                    if n:
                        f.add_metric([_CLASSIC, strategy], n)
            yield f
        f = _counter("rabbitmq_global_", "messages_dead_lettered_confirmed_total",
                     "Total number of messages dead-lettered and confirmed by target queues",
                     ("queue_type", "dead_letter_strategy"))
        f.add_metric([_QUORUM, "at_least_once"], (dead or {}).get(("quorum", "at_least_once", "confirmed"), 0))
        yield f
        if sc is not None:
            for code, errName in sorted(STREAM_ERRORS.items(), key=lambda kv: kv[1]):
                help = ("Total number of commands rejected with stream does not exist error"
                        if errName == "stream_does_not_exist" else
                        "Total number of commands failed with %s" % (errName.replace("_", " "),))
                f = _counter("rabbitmq_global_", "stream_error_%s_total" % (errName,), help, ("protocol",))
                f.add_metric(stream, sc.errors.get(code, 0))
                yield f

    def _alarms(self):
        active = self.broker.alarms.active
        for name, help, on in (
            ("alarms_file_descriptor_limit", "is 1 if file descriptor limit alarm is in effect", False),
            ("alarms_free_disk_space_watermark", "is 1 if free disk space watermark alarm is in effect",
             "disk" in active),
            ("alarms_memory_used_watermark", "is 1 if VM memory watermark alarm is in effect", "memory" in active),
        ):
            yield GaugeMetricFamily("rabbitmq_" + name, help, value=1 if on else 0)

    # --- ours ------------------------------------------------------------------------

    def _otter(self, snap):
        (dropped, _, dropHelp), (dl, _, dlHelp), (delayed, _, delayedHelp), (pub, _, pubHelp) = OTTER_FAMILIES[:4]
        f = CounterMetricFamily(dropped, dropHelp)
        f.add_metric([], sum(vh.deadLetterDropped for vh in snap.vhosts))
        yield f
        f = CounterMetricFamily(dl, dlHelp, labels=["vhost", "reason", "dead_letter_strategy"])
        for vh in snap.vhosts:
            for reason in _REASONS:
                f.add_metric([vh.name, reason, "disabled"], vh.deadLetterDisabled.get(reason, 0))
                f.add_metric([vh.name, reason, "at_most_once"], vh.deadLettered.get(reason, 0))
        yield f
        f = GaugeMetricFamily(delayed, delayedHelp, labels=["vhost", "exchange"])
        for vh in snap.vhosts:
            for name, ex in sorted(vh.exchanges.items()):
                if ex.delayed:
                    f.add_metric([vh.name, name], ex.held)
        yield f
        for f in self._queueFamilies(snap, "", self.perObject, (
            (pub + "_total", "counter", pubHelp, lambda q: q.publishedCount),
        )):
            yield f


    def _lateness(self):
        """``otter_reaping_lateness_seconds``: the broker's ReapingLateness, buckets in seconds, per ``kind``."""
        name, help = LATENESS_FAMILY
        f = HistogramMetricFamily(name, help, labels=["kind"])
        bounds = [repr(ms / 1000.0) for ms in BUCKETS_MS] + ["+Inf"]
        for kind, h in self.broker.reapingLateness.byKind():
            cumulative, buckets = 0, []
            for bound, n in zip(bounds, h.counts):
                cumulative += n
                buckets.append((bound, cumulative))
            f.add_metric([kind], buckets, h.sumMs / 1000.0)
        return f


class _DetailedCollector(_Collector):
    """The ``/metrics/detailed`` view: only the asked families, per object, ``rabbitmq_detailed_``."""

    def __init__(self, base, families, vhosts):
        self.base = base
        self.families = families
        self.vhosts = vhosts

    def collect(self):
        """The asked families, in :data:`DETAILED_FAMILIES` order."""
        b = self.base
        snap = _Snapshot(b.broker, self.vhosts)
        table = {
            "queue_coarse_metrics": b._queueCoarse,
            "queue_consumer_count": b._queueConsumerCount,
            "queue_metrics": b._queueMetrics,
            "connection_churn_metrics": b._connectionChurn,
            "connection_coarse_metrics": b._connectionCoarse,
            "connection_metrics": b._connectionMetrics,
            "channel_metrics": b._channelMetrics,
            "channel_exchange_metrics": b._channelExchangeMetrics,
            "channel_queue_metrics": b._channelQueueMetrics,
            "channel_queue_exchange_metrics": b._channelQueueExchangeMetrics,
            "node_coarse_metrics": b._nodeCoarse,
            "node_metrics": b._nodeMetrics,
            "exchange_names": b._exchangeNames,
            "exchange_bindings": b._exchangeBindings,
        }
        for name in DETAILED_FAMILIES:
            if name in self.families:
                for f in table[name](snap, "rabbitmq_detailed_", True):
                    yield f


@functools.lru_cache(maxsize=None)
def distVersion(dist):
    """
    The installed version (str) of distribution ``dist``, ``""`` when it
    is not installed.  Cached: a lookup reads package metadata from disk
    (tens of ms), and installed versions do not change while the broker
    runs (``rabbitmq_build_info``, ``/api/nodes`` ``applications``).
    """
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return ""


def _render(collector):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def renderMetrics(broker, uptimeSeconds, perObject=False, diskMonitor=None):
    """
    The exposition text (bytes, format 0.0.4) of ``/metrics`` (or
    ``/metrics/per-object`` with ``perObject``) for ``broker``;
    ``uptimeSeconds`` (float) since start.
    """
    return _render(BrokerCollector(broker, lambda: uptimeSeconds, perObject, diskMonitor))


def renderDetailed(broker, uptimeSeconds, families, vhosts=(), diskMonitor=None):
    """
    The exposition text (bytes) of ``/metrics/detailed``: ``families``
    (names from :data:`DETAILED_FAMILIES`; others ignored) per object under
    ``rabbitmq_detailed_`` names; ``vhosts`` (names) limits the queue and
    exchange families to those vhosts (all when empty).
    """
    base = BrokerCollector(broker, lambda: uptimeSeconds, True, diskMonitor)
    return _render(_DetailedCollector(base, set(families), set(vhosts)))


#: the paths the Prometheus listener serves (bytes)
PATHS = (b"/metrics", b"/metrics/per-object", b"/metrics/detailed")


class PrometheusResource(Resource):
    """
    The Prometheus listener's site root: ``GET /metrics``,
    ``/metrics/per-object`` and ``/metrics/detailed`` (200,
    ``text/plain; version=0.0.4; charset=utf-8``), no authentication (as
    rabbitmq_prometheus); 404 for any other path, 405 for other methods.
    Served by a :class:`otter_tx.web.request.NoBodySite`: no request body
    is ever stored (anyone can reach this listener).

    :param broker: the Broker.
    :param clock: ``IReactorTime`` (uptime is measured from construction).
    :param diskMonitor: the service's DiskMonitor or None.
    """

    isLeaf = True

    def __init__(self, broker, clock, diskMonitor=None):
        Resource.__init__(self)
        self.broker = broker
        self.clock = clock
        self.diskMonitor = diskMonitor
        #: clock seconds when the resource was built (float): the uptime gauge counts from it
        self.startedAt = clock.seconds()

    def refusal(self, method, path):
        """
        The answer to a request this resource refuses whatever it carries:
        ``(code, [(header, value)], body)`` (int, bytes pairs, bytes) for an
        unknown path (404) or a method other than GET and HEAD (405), else
        None.  ``method``, ``path``: bytes, ``path`` without its query.
        Also asked before a request's body is read
        (:class:`otter_tx.web.request.NoBodySite`).
        """
        path = path.rstrip(b"/") or b"/"
        if path not in PATHS:
            return 404, [(b"content-type", b"text/plain; charset=utf-8")], b"Not Found\n"
        if method not in (b"GET", b"HEAD"):
            return 405, [(b"allow", b"GET, HEAD")], b""
        return None

    def render(self, request):
        """Dispatch on the path; see the class docstring."""
        refused = self.refusal(request.method, request.path)
        if refused is not None:
            code, headers, body = refused
            request.setResponseCode(code)
            for name, value in headers:
                request.setHeader(name, value)
            return body
        path = request.path.rstrip(b"/") or b"/"
        uptime = self.clock.seconds() - self.startedAt
        request.setHeader(b"content-type", CONTENT_TYPE)
        if path == b"/metrics/detailed":
            args = request.args or {}
            families = [v.decode("utf-8", "replace") for v in args.get(b"family", [])]
            vhosts = [v.decode("utf-8", "replace") for v in args.get(b"vhost", [])]
            return renderDetailed(self.broker, uptime, families, vhosts, self.diskMonitor)
        return renderMetrics(self.broker, uptime, path == b"/metrics/per-object", self.diskMonitor)
