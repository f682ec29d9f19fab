"""
The declared seams of the broker core, in both directions.  Every real
implementation and every test fake is checked with
``zope.interface.verify.verifyClass`` / ``verifyObject``
(``otter_tx/test/unit/test_seams.py``).

What the core calls on the objects around it:

- :class:`ISessionClient`: the Session's outbound door, one per client
  connection (the AMQP connection, or the HTTP app's per-request door):
  a delivery made, a message returned, publisher confirms, a consumer
  cancelled by the broker, a channel or the connection failed, and whether
  the client's output is backed up (flow).  It carries broker values
  (``Message``, ``AMQPError``, consumers, ints), never ``spec.Method``
  objects: the AMQP door turns them into frames.
- :class:`IClientConnection`: one client connection as the broker core
  drives it (vhost deletion, shutdown, alarms, the acknowledgement timeout).
- :class:`IConnectionInfo`: the read-only facts the management views
  (``otter_tx.web._format``) show about a listed connection.
- :class:`IConsumer`: one subscription as a queue sees it.

What the core is called through:

- :class:`IConsumerSource`: what a consumer is registered on and what a
  vhost routes to: a queue, or the direct reply-to pseudo-queue
  (:class:`~otter_tx.broker.replyto.ReplyToQueue`).
- :class:`IQueue`: all of a queue a :class:`~otter_tx.broker.session.Session`
  (and the AMQP door's declare-ok / get-ok) uses: the classic and quorum
  :class:`~otter_tx.broker.queue.Queue`, the stream queue
  (:class:`~otter_tx.broker.stream.StreamQueue`) and a queue on another
  node of the cluster (:class:`~otter_tx.cluster.remote.RemoteQueue`).
  Each runs the contract suite (``otter_tx/test/unit/test_queue_contract.py``).
- :class:`IExchangeType`: the routing table of one exchange type.

The store's seam is :class:`~otter_tx.store.interface.IMessageStore` (and
its health part, :class:`~otter_tx.store.interface.IStoreHealth`).

This module imports nothing from Twisted's reactor, from the AMQP wire, or
from the rest of the broker.
"""

from zope.interface import Attribute, Interface

__all__ = [
    "ISessionClient",
    "IClientConnection",
    "IConnectionInfo",
    "IConsumer",
    "IConsumerSource",
    "IQueue",
    "IDeclaredQueue",
    "IExchangeType",
    "IReadyStore",
]


class ISessionClient(Interface):
    """
    The client a :class:`~otter_tx.broker.session.Session` answers to: its
    outbound door.  One object serves every channel of a connection, so
    each call names the channel ``number`` (int) the Session was opened
    with.  The AMQP implementation is
    :class:`~otter_tx.door.protocol.AMQPServerProtocol` (each call becomes
    frames through the wire engine); the HTTP one is
    :class:`~otter_tx.web.door.HTTPRequestConnection`.

    Calls on the delivery path (:meth:`delivered`) are plain synchronous
    calls, one per message.
    """

    paused = Attribute(
        "bool, flow: True while the client's output is backed up; the Session's consumers "
        "then take nothing (Consumer.canTake) until a later Session.resumeDelivery()"
    )
    exclusiveQueues = Attribute(
        "set of the queues this client owns (exclusive queues it declared); the vhost adds "
        "and removes them, and deletes those left when the connection closes "
        "(VHost.connectionClosed)"
    )

    def delivered(number, consumer, deliveryTag, redelivered, message):
        """
        A delivery to ``consumer`` (the Session's Consumer: ``tag`` str and
        ``tagBytes``, the tag encoded once as a shortstr) on channel
        ``number``: delivery tag ``deliveryTag`` (int), ``redelivered``
        (bool), ``message`` (a :class:`~otter_tx.broker.message.Message`;
        its publisher's property bytes are forwarded untouched).  AMQP:
        basic.deliver, its content header and body frames.
        """

    def returned(number, replyCode, replyText, message):
        """
        ``message`` (a Message) published mandatory on channel ``number``
        could not be routed: ``replyCode`` (int, 312 NO_ROUTE) and
        ``replyText`` (str, ``"NO_ROUTE"``).  AMQP: basic.return with the
        content.
        """

    def confirmed(number, confirms):
        """
        Publisher confirms for channel ``number``: ``confirms`` is a list of
        ``(seq, ok)`` in ascending ``seq`` (int publish sequence numbers;
        ``ok`` bool: ack, or nack when a queue refused the message or the
        store failed).  AMQP: a run of acks becomes one ``basic.ack
        multiple=true``; a nack is ``basic.nack multiple=false``
        (https://www.rabbitmq.com/docs/confirms).
        """

    def noteConfirms(session):
        """
        ``session`` has confirms pending: the client calls
        ``session.flushConfirms()`` once it has handled the chunk of input
        it is reading (so that a chunk's confirms go out together), or at
        once when it reads nothing.
        """

    def consumerCancelled(number, consumerTag):
        """
        The broker cancelled consumer ``consumerTag`` (str) of channel
        ``number``: its queue was deleted.  AMQP: basic.cancel, sent only
        when the client advertised the ``consumer_cancel_notify``
        capability, and, when this connection deleted the queue, after its
        queue.delete-ok, as RabbitMQ orders them
        (https://www.rabbitmq.com/docs/consumer-cancel).
        """

    def channelFailed(number, error):
        """
        Channel ``number`` must close for ``error`` (an
        :class:`~otter_tx.amqp.errors.AMQPError` with a channel-level code,
        e.g. 406 PRECONDITION_FAILED for the acknowledgement timeout): the
        client releases the channel's Session (``Session.close()``) and
        tells the peer (AMQP: channel.close, then the channel drops
        everything until close-ok).  Nothing happens for a channel that is
        already closing.
        """

    def connectionFailed(code, text):
        """
        The whole connection must close: ``code`` (int, 541 INTERNAL_ERROR
        when the store failed) and ``text`` (str, the full reply text,
        ``"INTERNAL_ERROR - message store failed"``).  AMQP:
        connection.close, then close-ok is awaited.
        """


class IClientConnection(Interface):
    """
    One client connection, as the broker core (vhost deletion, shutdown,
    alarms, the acknowledgement timeout, connection and channel limits, the
    statistics sampler's byte rates) drives it: the members of
    ``Broker.connections``.
    """

    user = Attribute("the authenticated broker user (has ``name``, ``tags``), or None before login")
    vhost = Attribute("the opened VHost, or None before connection.open")
    channels = Attribute("dict: channel number -> open channel (a user's max-channels limit counts them)")
    bytesIn = Attribute("int: bytes received (the sampler's ``recv_oct`` rate)")
    bytesOut = Attribute("int: bytes sent (the sampler's ``send_oct`` rate)")

    def close(code, text):
        """
        Close the connection politely from the broker side: AMQP sends
        connection.close with ``code`` (int, e.g. 320 CONNECTION_FORCED) and
        ``text`` (str) and waits for close-ok.
        """

    def alarmChanged(alarmed):
        """
        The broker's resource alarms changed; ``alarmed`` (bool) is whether any
        is in effect (https://www.rabbitmq.com/docs/connection-blocked).
        """

    def flowChanged(flowing):
        """
        A cluster link of this node is backed up (``flowing`` True) or
        drained (False): RabbitMQ's credit flow.  A connection that publishes
        meanwhile is no longer read until it drains; its state reads
        ``flow`` (https://www.rabbitmq.com/docs/flow-control).
        """

    def whenClosed():
        """A Deferred that fires (with None) once the connection is gone."""

    def checkAckTimeout(limitSeconds, timeoutMs):
        """
        Close, with channel-level 406 PRECONDITION_FAILED ``delivery
        acknowledgement on channel N timed out. Timeout value used: T ms.
        This timeout value can be configured, see consumers doc guide to
        learn more``, every channel whose oldest unacknowledged delivery was
        made before ``limitSeconds`` (float, clock seconds); ``timeoutMs``
        (int, milliseconds) is the configured consumer timeout, for the
        text (https://www.rabbitmq.com/docs/consumers#acknowledgement-timeout).
        Called periodically by ``Broker.checkAckTimeouts``.
        """


class IConnectionInfo(Interface):
    """
    What the management views (``otter_tx.web._format.connectionDict`` /
    ``channelDict``, the management API's listings) read about a listed
    connection; nothing here is written by its readers.
    """

    name = Attribute("str: RabbitMQ's connection name, ``'peer:port -> local:port'``")
    user = Attribute("the authenticated broker user (has ``name``, ``tags``), or None before login")
    vhost = Attribute("the opened VHost, or None before connection.open")
    flowState = Attribute(
        "str: ``'running'``, ``'flow'``, ``'blocking'`` or ``'blocked'``, as RabbitMQ's connection ``state``"
    )
    peer = Attribute("the client's address (``host``, ``port``), or None")
    local = Attribute("the address the client connected to (``host``, ``port``), or None")
    ssl = Attribute("bool: the connection is TLS")
    authMechanism = Attribute("str: the SASL mechanism it logged in with (PLAIN, AMQPLAIN, EXTERNAL), or None")
    peerCertificateInfo = Attribute(
        "dict: ``peer_cert_subject``, ``peer_cert_issuer``, ``peer_cert_validity`` (str in RabbitMQ's"
        " formats, otter_tx.door.tls.certificateInfo; each None without a client certificate)"
    )
    channels = Attribute("dict: channel number -> open channel (with ``session``, ``number``)")
    clientProperties = Attribute("dict: the client's connection.start-ok properties")
    connectedAt = Attribute("float: clock seconds when the connection was accepted")
    channelMax = Attribute("int: negotiated channel_max")
    frameMax = Attribute("int: negotiated frame_max, bytes")
    heartbeat = Attribute("int: negotiated heartbeat interval, seconds (0: none)")
    bytesIn = Attribute("int: bytes received (RabbitMQ's ``recv_oct``)")
    bytesOut = Attribute("int: bytes sent (``send_oct``)")
    recvCount = Attribute("int: socket reads (``recv_cnt``)")
    sendCount = Attribute("int: socket writes (``send_cnt``)")


class IConsumer(Interface):
    """
    One subscription on a queue (basic.consume, or the direct reply-to
    pseudo-consumer), as :class:`~otter_tx.broker.queue.Queue` drives it.
    """

    tag = Attribute("str: the consumer tag")
    noAck = Attribute("bool: deliveries are settled when sent")
    priority = Attribute("int: x-priority; higher is served first")
    prefetch = Attribute(
        "int: the consumer's prefetch count, 0 for none (a stream reads this many ahead; a queue on "
        "another node asks its home node for this much credit)"
    )
    arguments = Attribute(
        "dict or None: basic.consume's x-arguments (a stream reads ``x-stream-offset`` from them)"
    )

    def canTake():
        """
        True when a delivery may be made now: the client's output is not
        backed up and neither the consumer's nor the channel's (global)
        prefetch is exhausted.
        """

    def deliver(queue, entry):
        """Hand ``entry`` (a QueueEntry of ``queue``) to the client now."""

    def cancelledByBroker(queue):
        """``queue`` was deleted: the consumer is gone (consumer cancel notification)."""


class IConsumerSource(Interface):
    """
    What a Session registers consumers on, what a vhost routes messages to,
    and what takes deliveries back: a queue (:class:`IQueue`) or the direct
    reply-to pseudo-queue, whose consumers are always no-ack and which holds
    nothing (it implements only this interface).

    The entries a source hands to :meth:`IConsumer.deliver` (``QueueEntry``)
    are opaque to the Session except for ``message`` (the Message),
    ``redelivered`` (bool), ``returns`` (int: times it came back unsettled;
    non-zero makes the Session ask :meth:`deliveredMessage`) and
    ``deliveredAt`` (float clock seconds of the delivery, or None; the
    acknowledgement timeout reads it).  The source counts its own
    deliveries and redeliveries; the Session counts its channel's.

    ``otter_tx/test/unit/test_queue_contract.py``'s
    ``ConsumerSourceContractMixin`` states this contract as tests.
    """

    name = Attribute("str: the queue name (``amq.rabbitmq.reply-to`` for the pseudo-queue)")

    def enqueue(message, now=None, redelivered=False):
        """
        ``message`` (a Message) was routed here (basic.publish): delivered
        to a consumer that can take it, or kept for later (a queue).
        ``now``: the clock's time in ms if the caller has read it (float, as
        :func:`~otter_tx.broker.expiry.nowMs` gives it), or None to read the
        clock; ``redelivered`` (bool): the message may have
        been delivered before (a delayed exchange firing again what it may
        have fired before an unclean stop), so it goes out marked
        ``redelivered``.
        Returns True when taken, False when refused (a queue's
        ``reject-publish`` overflow; the publisher then gets basic.nack with
        confirms on, https://www.rabbitmq.com/docs/maxlength), or None when
        it cannot reach the queue at all (a queue on another node that is
        down: ``VHost.publish`` counts it unroutable, as RabbitMQ 3.10 does).
        """

    def addConsumer(consumer, exclusive=False):
        """
        Register an :class:`IConsumer`; deliveries may start at once.
        ``exclusive`` (bool): basic.consume's exclusive flag; no other
        consumer is accepted until this one goes.  Check
        :meth:`IQueue.refusesConsumer` first.
        """

    def removeConsumer(consumer):
        """Unregister ``consumer`` (may auto-delete the queue); unknown consumers are ignored."""

    def requeue(entries, dispatch=True):
        """
        Put delivered ``entries`` (list) back in their places, marked
        redelivered (basic.nack / reject with requeue, recover, channel
        close); ``dispatch=False`` leaves dispatching to a later
        :meth:`dispatch`.  A queue kind that cannot requeue raises
        :class:`~otter_tx.amqp.errors.AMQPError` when ``dispatch`` is true
        (a stream: 540; a closing channel's ``dispatch=False`` only returns
        credit there).
        """

    def dispatch():
        """Consumers may have room again: deliver what can be delivered."""

    def deliveredMessage(entry, get=False):
        """
        The Message to send for ``entry``: its own, or a copy with the
        headers the source adds on delivery (a quorum queue's
        ``x-delivery-count``); ``get`` (bool) for a basic.get-ok.
        """


class IQueue(IConsumerSource):
    """
    A queue as a Session (and the AMQP door's declare-ok / get-ok) uses it:
    consume, get, settle, requeue, reject, purge, and the quorum rules the
    Session applies.  Classic and quorum queues are both
    :class:`~otter_tx.broker.queue.Queue`; a stream is its subclass
    :class:`~otter_tx.broker.stream.StreamQueue`, a queue on another node
    :class:`~otter_tx.cluster.remote.RemoteQueue`.  ``ConsumerSourceContractMixin`` and
    ``QueueContractMixin`` (``otter_tx/test/unit/test_queue_contract.py``)
    state the contract as tests; every implementation runs them (the
    stream's, in ``test_stream.py``, overrides the tests of what a stream
    refuses).  A call a queue kind does not support raises
    :class:`~otter_tx.amqp.errors.AMQPError` with RabbitMQ's answer (a
    stream's basic.get, purge, reject and requeue: 540 NOT_IMPLEMENTED).
    """

    readyCount = Attribute("int: messages ready for delivery (queue.declare-ok's message_count)")
    consumerCount = Attribute("int: consumers registered (queue.declare-ok's consumer_count)")
    quorum = Attribute(
        "bool: RabbitMQ 3.10's quorum queue rules apply to consumers (docs/quorum.md): "
        "no global prefetch (540), the exclusive flag of basic.consume is ignored"
    )
    clock = Attribute("IReactorTime: the queue's clock (RequeueFeeder schedules its slices on it)")

    def checkConsume(noAck, prefetch, arguments):
        """
        The queue kind's own rules for a new basic.consume, checked before
        :meth:`refusesConsumer`: ``noAck`` (bool), ``prefetch`` (int: the
        channel's per-consumer prefetch count, 0 for none), ``arguments``
        (dict: the consume's x-arguments).  Raises
        :class:`~otter_tx.amqp.errors.AMQPError` to refuse (a stream's 406 /
        540, docs/streams.md); returns None to accept.  Classic and quorum
        queues accept everything here (the quorum rules the Session applies
        follow :attr:`quorum`).
        """

    def refusesConsumer(exclusive):
        """
        True when a new basic.consume (``exclusive``, bool) must be refused
        with 403 ACCESS_REFUSED ``queue 'Q' in vhost 'V' in exclusive use``:
        the queue has an exclusive consumer, or an exclusive one is asked
        while it has consumers or is single-active-consumer.  (A stream
        ignores the flag and never refuses.)  A queue on another node may
        answer a Deferred firing with that bool (its home node decides).
        """

    def basicGet(noAck):
        """
        basic.get: the head entry, taken (settled at once with ``noAck``,
        else unacknowledged), or None when nothing is ready (a stream: 540).
        """

    def settle(entry):
        """``entry`` was acknowledged: gone for good."""

    def reject(entries):
        """
        ``entries`` (list) were rejected without requeue: dead-lettered with
        reason ``rejected`` when the queue has a dead-letter exchange, else
        dropped (https://www.rabbitmq.com/docs/dlx).  A stream: 540.
        """

    def purge():
        """queue.purge: drop every ready message; the number dropped (int).  A stream: 540."""

    def holdRequeue(feeder):
        """
        A large requeue (``RequeueFeeder``) hands this queue entries over
        several reactor turns: hold deliveries until
        :meth:`releaseRequeue`, so no consumer gets a later message before
        an earlier one still in the feeder.  ``feeder.finish()`` must hand
        everything over at once when the queue needs it whole (a basic.get,
        a broker stop).
        """

    def releaseRequeue(feeder):
        """``feeder`` has handed everything back: deliver again."""


class IDeclaredQueue(Interface):
    """
    A queue as its vhost, the exchanges, the dead-letter and delayed paths
    and the management views hold it: what it was declared as, its
    bindings and its lifecycle.  It is separate from :class:`IQueue` (the
    Session's seam: consume, get, settle) the way
    :class:`IConnectionInfo` is separate from :class:`IClientConnection`:
    the two are used by different rooms, and the direct reply-to
    pseudo-queue is neither.  Every queue kind provides both: the classic
    and quorum :class:`~otter_tx.broker.queue.Queue`, the stream
    :class:`~otter_tx.broker.stream.StreamQueue` and a queue on another
    node, :class:`~otter_tx.cluster.remote.RemoteQueue`
    (``test_seams.py`` and ``test_queue_contract.py`` check each).  It
    is plain attributes and rare calls: declaring it adds nothing to the
    per-message path.  What only a local queue has (policy settings,
    paging and dead-letter state, the statistics the views read from
    ``vhost.queues``) is not part of it.
    """

    name = Attribute("str: the queue's name")
    vhost = Attribute("the VHost the queue belongs to")
    queueType = Attribute("str: x-queue-type as declared: 'classic', 'quorum' or 'stream'")
    durable = Attribute("bool: survives a broker restart")
    autoDelete = Attribute("bool: deleted when its last consumer goes")
    exclusive = Attribute("bool: owned by one connection")
    owner = Attribute(
        "the connection an exclusive queue belongs to (a placeholder for one on another node), else None"
    )
    arguments = Attribute("dict: the declare's x-arguments")
    bindings = Attribute("dict: (exchange, routing key, arguments key) -> arguments, the queue's bindings")
    consumers = Attribute(
        "list: the consumers registered here (queue.delete's if-unused, the management views; "
        "a queue on another node: those of this node)"
    )
    deleted = Attribute("bool: the queue has been deleted (a stale reference must not be used)")
    down = Attribute("bool: the queue lives on a node that is unreachable (always False for a local queue)")
    downText = Attribute("str: the 404 text while :attr:`down` (None for a local queue)")
    remote = Attribute("bool: the queue lives on another node of the cluster (its vhost's remoteQueues)")
    stream = Attribute("the StreamLog of a local stream, else None (the stream protocol door's helpers read it)")

    def declared(renew):
        """
        queue.declare (passive, or an equivalent redeclare) found this
        queue; ``renew`` (bool) restarts its ``x-expires`` lease.  Returns
        the queue (a queue on another node: a Deferred firing with it, its
        counts fetched from its home node).
        """

    def touch():
        """The queue was used (basic.get, a consume, ...): restart its ``x-expires`` lease."""

    def deleteConditions(ifUnused, ifEmpty):
        """
        queue.delete's ``if-unused`` / ``if-empty`` (bools) as this kind
        applies them: the pair ``(ifUnused, ifEmpty)`` the vhost then checks
        (a stream: ``(False, False)``, RabbitMQ 3.10 deletes it whatever
        they say).
        """

    def shutdown():
        """
        The queue goes (deleted, or the broker stops): mark it deleted,
        cancel its timers, tell its consumers.  Returns how many ready
        messages went with it (int).
        """


class IExchangeType(Interface):
    """
    The routing table of one exchange type (direct, fanout, topic, headers
    in :mod:`otter_tx.broker.exchange`; an x-delayed-message exchange routes
    with the table of its ``x-delayed-type``).
    """

    name = Attribute("The AMQP exchange type name (str).")

    def add(destination, routingKey, arguments):
        """Add a binding; return False if it already existed."""

    def remove(destination, routingKey, arguments):
        """Remove a binding; return False if it did not exist."""

    def route(message, keys, out):
        """Add the destinations matching ``message`` (with routing ``keys``) to the set ``out``."""

    def bindings():
        """Iterate ``(destination, routingKey, arguments)``."""

    def removeDestination(destination):
        """Drop every binding to ``destination``; return how many."""

    def __len__():
        """The number of bindings (int)."""


class IReadyStore(Interface):
    """
    The ready messages of one queue in delivery order, as
    :class:`~otter_tx.broker.queue.Queue` drives them
    (:class:`~otter_tx.broker.readystore.ReadyStore`): priority levels
    (``x-max-priority``, highest first, enqueue order within a level),
    messages beyond the memory budget paged to disk, and every ready
    message's expiry reaped where it sits.  Entries are
    :class:`~otter_tx.broker.readystore.QueueEntry` s; the store changes
    their ``state`` only to mark expired or cleared ones GONE.  It never
    touches the durable store and dead-letters nothing: expired entries go
    to the ``onExpired`` callback it was made with.
    """

    readyCount = Attribute("int: ready messages, paged ones included")
    readyBytes = Attribute("int: their body bytes")
    pagedCount = Attribute("int: ready messages paged out to disk")
    pagedBytes = Attribute("int: their body bytes")
    memoryBudget = Attribute("int: bytes of ready messages kept in memory (bodies + a fixed overhead each)")

    def levelOf(message):
        """The priority level (int) a message goes to."""

    def makeEntry(message, seq, expiresAt, redelivered):
        """A READY entry for a recovered message (``expiresAt``: clock ms, float, or None)."""

    def append(entry):
        """Put a new READY entry at the tail of its level."""

    def reinsert(entries):
        """Put READY ``entries`` (list, descending seq) back at their seq positions."""

    def popHead():
        """Remove and return the first ready entry (highest level first), expired or not, or None."""

    def popLive():
        """
        Remove and return the first ready entry that has not expired, or
        None; expired ones met on the way go to ``onExpired``.
        """

    def clear():
        """Forget every ready entry at once (purge, delete); counts are zero at once."""

    def detachHead(maxLength, maxBytes, work):
        """
        Take head entries out until at most ``maxLength`` messages and
        ``maxBytes`` bytes are left (None: no limit), appending them to the
        deque ``work`` as ``[segmentRef, entries, 0]`` items (a lowered
        length limit).
        """

    def readDetached(segmentRef):
        """The entries (list) of a paged segment :meth:`detachHead` took unread."""

    def freeze():
        """Stop every timer for good (broker shutdown); the entries stay."""

    def entries():
        """Iterate the ready entries in delivery order, paged ones included."""

    def expiries():
        """
        Iterate ``(expiresAt, count, exact)`` for the ready messages, reading
        no file: ``expiresAt`` in clock ms (float) or None (no TTL),
        ``exact`` False for a paged segment counted at its earliest expiry.
        """

    def persistent():
        """``(count, bytes)`` of the persistent ready messages."""
