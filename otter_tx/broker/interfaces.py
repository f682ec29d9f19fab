"""
The declared seams of the broker core: what the core calls on the objects
around it.  Every real implementation and every test fake is checked with
``zope.interface.verify.verifyClass`` / ``verifyObject``
(``otter_tx/test/unit/test_seams.py``).

- :class:`IClientConnection`: one client connection as the core sees it (an
  AMQP connection, or the HTTP app's per-request door): close it, tell it the
  resource alarms changed, check its channels' acknowledgement timeout, ask
  whether its output is backed up.
- :class:`IConsumer`: one subscription as a queue sees it.
- :class:`IConsumerSource`: what a consumer is registered on: a queue, or the
  direct reply-to pseudo-queue (:class:`~otter_tx.broker.replyto.ReplyToQueue`).
- :class:`IQueue`: the part of a queue a :class:`~otter_tx.broker.session.Session`
  uses.  A queue on another node of a later cluster would implement the same
  interface; no cluster code exists yet.
- :class:`IExchangeType`: the routing table of one exchange type.

The store's seam is :class:`~otter_tx.store.interface.IMessageStore` (and
its health part, :class:`~otter_tx.store.interface.IStoreHealth`).

This module imports nothing from Twisted's reactor, from the AMQP wire, or
from the rest of the broker.
"""

from zope.interface import Attribute, Interface

__all__ = ["IClientConnection", "IConsumer", "IConsumerSource", "IQueue", "IExchangeType"]


class IClientConnection(Interface):
    """
    One client connection, as the broker core (vhost deletion, shutdown,
    alarms, the management API) drives it.
    """

    name = Attribute("str: RabbitMQ's connection name, ``'peer:port -> local:port'``")
    user = Attribute("the authenticated broker user (has ``name``, ``tags``), or None before login")
    vhost = Attribute("the opened VHost, or None before connection.open")
    paused = Attribute(
        "bool: True while the connection's output is backed up; its consumers then take nothing"
    )
    flowState = Attribute(
        "str: ``'running'``, ``'blocking'`` or ``'blocked'``, as RabbitMQ's connection ``state``"
    )

    # what the management views read (otter_tx.web._format.connectionDict / channelDict)
    peer = Attribute("the client's address (``host``, ``port``), or None")
    local = Attribute("the address the client connected to (``host``, ``port``), or None")
    ssl = Attribute("bool: the connection is TLS")
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

    def whenClosed():
        """A Deferred that fires (with None) once the connection is gone."""

    def checkAckTimeout(limitSeconds, timeoutMs):
        """
        Close, with channel-level 406 PRECONDITION_FAILED ``delivery
        acknowledgement on channel N timed out. Timeout value used: T ms.
        This timeout value can be configured, see consumers doc guide to
        learn more``, every channel whose oldest unacknowledged delivery was
        made before ``limitSeconds`` (float, clock seconds); ``timeoutMs``
        (int) is the configured consumer timeout, for the text
        (https://www.rabbitmq.com/docs/consumers#acknowledgement-timeout).
        Called periodically by ``Broker.checkAckTimeouts``.
        """


class IConsumer(Interface):
    """
    One subscription on a queue (basic.consume, or the direct reply-to
    pseudo-consumer), as :class:`~otter_tx.broker.queue.Queue` drives it.
    """

    tag = Attribute("str: the consumer tag")
    noAck = Attribute("bool: deliveries are settled when sent")
    priority = Attribute("int: x-priority; higher is served first")

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
    What a Session registers consumers on and hands deliveries back to: a
    queue (:class:`IQueue`) or the direct reply-to pseudo-queue, whose
    consumers are always no-ack.
    """

    name = Attribute("str: the queue name (``amq.rabbitmq.reply-to`` for the pseudo-queue)")

    def addConsumer(consumer):
        """Register an :class:`IConsumer`; deliveries may start at once."""

    def removeConsumer(consumer):
        """Unregister ``consumer`` (may auto-delete the queue)."""

    def requeue(entries, dispatch=True):
        """Put delivered ``entries`` (list) back in their places, redelivered."""

    def dispatch():
        """Consumers may have room again: deliver what can be delivered."""


class IQueue(IConsumerSource):
    """
    A queue as a Session uses it: consume, get, settle, requeue, reject.
    Entries are opaque to the Session except for ``message`` and
    ``redelivered``.
    """

    readyCount = Attribute("int: messages ready for delivery (queue.declare-ok's message_count)")

    def basicGet(noAck):
        """The head entry taken for basic.get, or None when empty."""

    def settle(entry):
        """``entry`` was acknowledged: gone for good."""

    def reject(entries):
        """
        ``entries`` (list) were rejected without requeue: dead-lettered with
        reason ``rejected`` when the queue has a dead-letter exchange, else
        dropped (https://www.rabbitmq.com/docs/dlx).
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
        """A READY entry for a recovered message (``expiresAt`` ms or None)."""

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
        """Iterate ``(expiresAt, count, exact)`` for the ready messages, reading no file."""

    def persistent():
        """``(count, bytes)`` of the persistent ready messages."""
