"""
Broker-wide totals since start, the counters behind the Prometheus
endpoint's ``rabbitmq_global_*`` and churn families (RabbitMQ's
``rabbit_global_counters`` and ``connection_churn_metrics``).

One :class:`GlobalCounters` per broker (``Broker.counters``); the publish,
deliver and ack paths reach it through ``Session.counters`` and do plain
integer increments, nothing else, so the hot path stays as it was
(docs/performance.md).
"""


class GlobalCounters:
    """
    Totals since the broker started (all ints, never reset).

    Messages (RabbitMQ's ``protocol="amqp091"`` global counters):

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

    :ivar connectionsOpened: AMQP connections accepted.
    :ivar connectionsClosed: AMQP connections gone (closed or dropped).
    :ivar channelsOpened: AMQP channels opened.
    :ivar channelsClosed: AMQP channels finished.
    :ivar queuesDeclared: successful non-passive ``queue.declare`` (also
        of an existing queue), AMQP or HTTP.
    :ivar queuesCreated: queues created (declared anew).
    :ivar queuesDeleted: queues deleted, for any reason (``queue.delete``,
        auto-delete, exclusive owner gone, ``x-expires``).
    """

    def __init__(self):
        self.received = 0
        self.receivedConfirm = 0
        self.unroutableDropped = 0
        self.unroutableReturned = 0
        self.confirmed = 0
        self.deliveredConsumeManualAck = 0
        self.deliveredConsumeAutoAck = 0
        self.deliveredGetManualAck = 0
        self.deliveredGetAutoAck = 0
        self.getEmpty = 0
        self.redelivered = 0
        self.acknowledged = 0
        self.connectionsOpened = 0
        self.connectionsClosed = 0
        self.channelsOpened = 0
        self.channelsClosed = 0
        self.queuesDeclared = 0
        self.queuesCreated = 0
        self.queuesDeleted = 0

    @property
    def routed(self):
        """Messages that reached at least one queue (int): received less the unroutable ones."""
        return self.received - self.unroutableDropped - self.unroutableReturned

    @property
    def delivered(self):
        """All deliveries: consume and get, manual and automatic acknowledgement (int)."""
        return (self.deliveredConsumeManualAck + self.deliveredConsumeAutoAck
                + self.deliveredGetManualAck + self.deliveredGetAutoAck)
