"""
Broker-wide totals since start, the counters behind the Prometheus
endpoint's ``rabbitmq_global_*`` and churn families (RabbitMQ's
``rabbit_global_counters`` and ``connection_churn_metrics``).

One :class:`GlobalCounters` per broker (``Broker.counters``).  The message
counters are each channel's own (``Session.stats``, a
:class:`~otter_tx.broker.stats.MessageCounts` the publish, deliver and ack
paths increment, nothing else, so the hot path stays as it was;
docs/performance.md); the broker-wide message totals here are their sum,
read when asked (``messages``).  The churn counters are plain ints here.
"""

from otter_tx.broker.stats import MessageCounts


def _message(name, doc):
    """A read-only property: attribute ``name`` of :meth:`GlobalCounters.messages`."""
    return property(lambda self: getattr(self.messages(), name), doc=doc)


class GlobalCounters:
    """
    Totals since the broker started (all ints, never reset).

    Messages (RabbitMQ's ``protocol="amqp091"`` global counters; read-only,
    summed over every channel, open or closed, by ``totals``):

    :ivar received: messages published by clients (``basic.publish`` and
        the HTTP API's publish), counted when routed (at ``tx.commit`` in a
        transaction).
    :ivar receivedConfirm: of those, published on a confirm-mode channel.
    :ivar unroutableDropped: non-mandatory messages that reached no queue.
    :ivar unroutableReturned: mandatory messages returned (312 NO_ROUTE).
    :ivar confirmed: messages confirmed to publishers with ``basic.ack``
        (each message once, also when acked ``multiple``; nacks are not
        counted, as RabbitMQ).
    :ivar deliveredConsumeManualAck: ``basic.deliver`` to consumers in
        manual acknowledgement mode.
    :ivar deliveredConsumeAutoAck: ``basic.deliver`` to no-ack consumers.
    :ivar deliveredGetManualAck: ``basic.get-ok`` in manual mode.
    :ivar deliveredGetAutoAck: ``basic.get-ok`` with no-ack.
    :ivar getEmpty: ``basic.get-empty`` answers.
    :ivar redelivered: deliveries (consume or get) with the redelivered flag.
    :ivar acknowledged: deliveries acknowledged by ``basic.ack``.

    Churn (RabbitMQ's ``connection_churn_metrics``):

    :ivar connectionsOpened: AMQP connections accepted, and stream protocol
        connections that opened a vhost (as RabbitMQ 3.10 counts them).
    :ivar connectionsClosed: AMQP and stream protocol connections gone (closed
        or dropped; a stream connection that never opened too, as 3.10).
    :ivar channelsOpened: AMQP channels opened.
    :ivar channelsClosed: AMQP channels finished.
    :ivar queuesDeclared: successful non-passive ``queue.declare`` (also
        of an existing queue), AMQP or HTTP.
    :ivar queuesCreated: queues created (declared anew).
    :ivar queuesDeleted: queues deleted, for any reason (``queue.delete``,
        auto-delete, exclusive owner gone, ``x-expires``).
    """

    def __init__(self, totals=None):
        #: a callable returning the broker's MessageCounts total, or None (all zero)
        self._totals = totals
        self.connectionsOpened = 0
        self.connectionsClosed = 0
        self.channelsOpened = 0
        self.channelsClosed = 0
        self.queuesDeclared = 0
        self.queuesCreated = 0
        self.queuesDeleted = 0

    def messages(self):
        """The broker-wide :class:`~otter_tx.broker.stats.MessageCounts` (a new object)."""
        return self._totals() if self._totals is not None else MessageCounts()

    def frozen(self):
        """
        A copy of these counters whose message totals were summed once,
        now: for a reader of many of them (a ``/metrics`` scrape), since
        each property of a live GlobalCounters sums every channel again.
        """
        totals = self.messages()
        out = GlobalCounters.__new__(GlobalCounters)
        out.__dict__.update(self.__dict__)
        out._totals = lambda: totals
        return out

    received = _message("publish", "Messages published (int).")
    receivedConfirm = _message("publishConfirm", "Of those, on confirm-mode channels (int).")
    unroutableDropped = _message("dropUnroutable", "Non-mandatory messages routed nowhere (int).")
    unroutableReturned = _message("returnUnroutable", "Mandatory messages returned (int).")
    confirmed = _message("confirm", "Messages confirmed with basic.ack (int).")
    deliveredConsumeManualAck = _message("deliver", "basic.deliver, manual acks (int).")
    deliveredConsumeAutoAck = _message("deliverNoAck", "basic.deliver, no-ack (int).")
    deliveredGetManualAck = _message("get", "basic.get-ok, manual acks (int).")
    deliveredGetAutoAck = _message("getNoAck", "basic.get-ok, no-ack (int).")
    getEmpty = _message("getEmpty", "basic.get-empty answers (int).")
    redelivered = _message("redeliver", "Deliveries flagged redelivered (int).")
    acknowledged = _message("ack", "Deliveries acknowledged (int).")

    @property
    def routed(self):
        """Messages that reached at least one queue (int): received less the unroutable ones."""
        return self.received - self.unroutableDropped - self.unroutableReturned

    @property
    def delivered(self):
        """All deliveries: consume and get, manual and automatic acknowledgement (int)."""
        return (self.deliveredConsumeManualAck + self.deliveredConsumeAutoAck
                + self.deliveredGetManualAck + self.deliveredGetAutoAck)


#: the stream protocol's error counters, as RabbitMQ 3.10 lists them
#: (``rabbitmq_global_stream_error_<name>_total``): response code -> name
STREAM_ERRORS = {
    0x02: "stream_does_not_exist", 0x03: "subscription_id_already_exists",
    0x04: "subscription_id_does_not_exist", 0x05: "stream_already_exists", 0x06: "stream_not_available",
    0x07: "sasl_mechanism_not_supported", 0x08: "authentication_failure", 0x09: "sasl_error",
    0x0A: "sasl_challenge", 0x0B: "sasl_authentication_failure_loopback", 0x0C: "vhost_access_failure",
    0x0D: "unknown_frame", 0x0E: "frame_too_large", 0x0F: "internal_error", 0x10: "access_refused",
    0x11: "precondition_failed", 0x12: "publisher_does_not_exist",
}


class StreamCounters:
    """
    The stream protocol's totals since start (``Broker.streamCounters``;
    RabbitMQ's ``protocol="stream"`` global counters), counted by the stream
    door (:mod:`otter_tx.door.stream`):

    :ivar received: messages published (each publish frame's count, as
        RabbitMQ; every stream publish expects a confirm, so it is also the
        ``received_confirm`` figure).
    :ivar confirmed: publishing ids confirmed.
    :ivar delivered: messages delivered to subscriptions (each chunk's count).
    :ivar errors: response code (int) -> error responses sent after the
        connection opened (RabbitMQ counts those; the handshake's SASL and
        vhost refusals are not counted, checked on 3.10).
    :ivar connections: the open stream connections (``publishers`` and
        ``subscriptions`` give the publisher and consumer gauges).
    """

    def __init__(self):
        self.received = 0
        self.confirmed = 0
        self.delivered = 0
        self.errors = {}
        self.connections = set()

    def error(self, code):
        """One error response with ``code`` (int) sent."""
        self.errors[code] = self.errors.get(code, 0) + 1

    def publishers(self):
        """Declared publishers on the open connections (int)."""
        return sum(len(c.publishers) for c in self.connections)

    def consumers(self):
        """Subscriptions on the open connections (int)."""
        return sum(len(c.subscriptions) for c in self.connections)
