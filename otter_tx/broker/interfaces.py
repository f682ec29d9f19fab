"""
The declared seams of the broker core: what the core calls on the objects
around it.  Every real implementation and every test fake is checked with
``zope.interface.verify.verifyClass`` (``otter_tx/test/unit/test_seams.py``).

- :class:`IClientConnection`: one client connection as the core sees it (an
  AMQP connection, or the HTTP app's per-request door): close it, tell it the
  resource alarms changed, ask whether its output is backed up.
- :class:`IConsumer`: one subscription as a queue sees it.
- :class:`IQueue`: the part of a queue a :class:`~otter_tx.broker.session.Session`
  uses.  A queue on another node of a later cluster would implement the same
  interface; no cluster code exists yet.
- :class:`~otter_tx.broker.exchange.IExchangeType`: the routing table of one
  exchange type (re-exported here).

This module imports nothing from Twisted's reactor or from the AMQP wire.
"""

from zope.interface import Attribute, Interface

from otter_tx.broker.exchange import IExchangeType

__all__ = ["IClientConnection", "IConsumer", "IQueue", "IExchangeType"]


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


class IQueue(Interface):
    """
    A queue as a Session uses it: consume, get, settle, requeue, reject.
    Entries are opaque to the Session except for ``message`` and
    ``redelivered``.
    """

    name = Attribute("str: the queue name")
    readyCount = Attribute("int: messages ready for delivery (queue.declare-ok's message_count)")

    def addConsumer(consumer):
        """Register an :class:`IConsumer`; deliveries may start at once."""

    def removeConsumer(consumer):
        """Unregister ``consumer`` (may auto-delete the queue)."""

    def basicGet(noAck):
        """The head entry taken for basic.get, or None when empty."""

    def settle(entry):
        """``entry`` was acknowledged: gone for good."""

    def requeue(entries, dispatch=True):
        """Put delivered ``entries`` (list) back in their places, redelivered."""

    def reject(entries):
        """
        ``entries`` (list) were rejected without requeue: dead-lettered with
        reason ``rejected`` when the queue has a dead-letter exchange, else
        dropped (https://www.rabbitmq.com/docs/dlx).
        """

    def dispatch():
        """Consumers may have room again: deliver what can be delivered."""
