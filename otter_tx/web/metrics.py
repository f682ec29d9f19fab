"""
Prometheus text exposition (format 0.0.4) of broker state under the names
RabbitMQ's ``rabbitmq_prometheus`` plugin uses
(../shared/reference/rabbitmq-semantics.md sections 8.9, 1.13 and 3.12;
``prometheus_rabbitmq_core_metrics_collector.erl``,
``prometheus_rabbitmq_global_metrics_collector.erl``).

``/metrics`` gives aggregated values (no per-object labels), like
RabbitMQ's endpoint of that name; ``/metrics/per-object`` adds
``vhost``/``queue`` labelled queue metrics.  Dead-letter counters come
from ``VHost.deadLettered`` (``{"expired", "rejected", "maxlen"}``) and
are labelled ``queue_type="rabbit_classic_queue"`` and
``dead_letter_strategy="at_most_once"``; messages whose dead-letter
exchange is missing (``VHost.deadLetterDropped``) are reported under
``otter_dead_letter_dropped_total`` since RabbitMQ has no counter for them.
"""

from otter_tx import __version__
from otter_tx.web._format import NODE


def _escape(v):
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels):
    if not labels:
        return ""
    return "{" + ",".join('%s="%s"' % (k, _escape(v)) for k, v in labels) + "}"


class _Writer:
    def __init__(self):
        self.lines = []

    def family(self, name, kind, help, samples):
        """``samples``: iterable of ``(labels, value)``; labels a list of pairs."""
        self.lines.append("# TYPE %s %s" % (name, kind))
        self.lines.append("# HELP %s %s" % (name, help))
        for labels, value in samples:
            self.lines.append("%s%s %s" % (name, _labels(labels), value))

    def text(self):
        return "\n".join(self.lines) + "\n"


def renderMetrics(broker, uptimeSeconds, perObject=False):
    """
    The exposition text (str) for ``broker``; ``uptimeSeconds`` (float)
    since the management app started.
    """
    w = _Writer()
    vhosts = [vh for _, vh in sorted(broker.vhosts.items())]
    queues = [q for vh in vhosts for _, q in sorted(vh.queues.items())]
    conns = list(broker.connections)

    w.family("rabbitmq_identity_info", "untyped", "RabbitMQ node & cluster identity info",
             [([("rabbitmq_node", NODE), ("rabbitmq_cluster", NODE),
                ("rabbitmq_cluster_permanent_id", NODE)], 1)])
    w.family("rabbitmq_build_info", "untyped", "RabbitMQ & Erlang/OTP version info",
             [([("rabbitmq_version", "3.10.8"), ("product_name", "otter_tx"),
                ("product_version", __version__), ("prometheus_plugin_version", __version__)], 1)])
    w.family("rabbitmq_connections", "gauge", "Connections currently open", [([], len(conns))])
    w.family("rabbitmq_channels", "gauge", "Channels currently open",
             [([], sum(len(c.channels) for c in conns))])
    w.family("rabbitmq_consumers", "gauge", "Consumers currently connected",
             [([], sum(len(q.consumers) for q in queues))])
    w.family("rabbitmq_queues", "gauge", "Queues available", [([], len(queues))])
    w.family("rabbitmq_erlang_uptime_seconds", "gauge", "Node uptime", [([], "%.3f" % uptimeSeconds)])
    w.family("rabbitmq_alarms_free_disk_space_watermark", "gauge",
             "is 1 if free disk space watermark alarm is in effect",
             [([], 1 if "disk" in broker.alarms.active else 0)])
    w.family("rabbitmq_alarms_memory_used_watermark", "gauge",
             "is 1 if VM memory watermark alarm is in effect",
             [([], 1 if "memory" in broker.alarms.active else 0)])

    def queueFamily(name, help, value):
        if perObject:
            samples = [([("vhost", q.vhost.name), ("queue", q.name)], value(q)) for q in queues]
        else:
            samples = [([], sum(value(q) for q in queues))]
        w.family(name, "gauge", help, samples)

    queueFamily("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers",
                lambda q: q.readyCount)
    queueFamily("rabbitmq_queue_messages_unacked",
                "Messages delivered to consumers but not yet acknowledged", lambda q: q.unackedCount)
    queueFamily("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth",
                lambda q: q.readyCount + q.unackedCount)
    queueFamily("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages",
                lambda q: q.readyBytes)
    queueFamily("rabbitmq_queue_consumers", "Consumers on a queue", lambda q: len(q.consumers))
    queueFamily("rabbitmq_queue_messages_published_total", "Total number of messages published to queues",
                lambda q: q.publishedCount)

    if perObject:
        w.family("rabbitmq_connection_incoming_bytes_total", "counter",
                 "Total number of bytes received on a connection",
                 [([("vhost", c.vhost.name if c.vhost else ""), ("connection", c.name)], c.bytesIn)
                  for c in conns])
        w.family("rabbitmq_connection_outgoing_bytes_total", "counter",
                 "Total number of bytes sent on a connection",
                 [([("vhost", c.vhost.name if c.vhost else ""), ("connection", c.name)], c.bytesOut)
                  for c in conns])
    else:
        w.family("rabbitmq_connection_incoming_bytes_total", "counter",
                 "Total number of bytes received on a connection", [([], sum(c.bytesIn for c in conns))])
        w.family("rabbitmq_connection_outgoing_bytes_total", "counter",
                 "Total number of bytes sent on a connection", [([], sum(c.bytesOut for c in conns))])

    for reason in ("expired", "rejected", "maxlen"):
        total = sum(vh.deadLettered.get(reason, 0) for vh in vhosts)
        w.family(
            "rabbitmq_global_messages_dead_lettered_%s_total" % (reason,), "counter",
            "Total number of messages dead-lettered due to %s" % (
                {"expired": "message TTL exceeded", "rejected": "basic.reject or basic.nack",
                 "maxlen": "overflow drop-head or reject-publish-dlx"}[reason],),
            [([("queue_type", "rabbit_classic_queue"), ("dead_letter_strategy", "at_most_once")], total)],
        )
    w.family("otter_dead_letter_dropped_total", "counter",
             "Messages dropped because their queue's dead-letter exchange does not exist",
             [([], sum(vh.deadLetterDropped for vh in vhosts))])
    return w.text()
