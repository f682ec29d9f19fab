"""
One channel's semantics, the only front door to the broker for a client
(an AMQP channel through ``otter_tx.door.channel``, or one HTTP request of the
management app): declares, bindings and purges with their permission
checks, consumers and prefetch (per consumer and global), the unacked
ledger, ack / nack / reject / recover, tx, publisher confirms ordered
behind the store's sync, the acknowledgement timeout, direct reply-to
consumers, and publishing through :mod:`otter_tx.broker.publish`.

The seam, both directions (:mod:`otter_tx.broker.interfaces`):

- inward, a Session reaches queues only through
  :class:`~otter_tx.broker.interfaces.IQueue` (the direct reply-to
  pseudo-queue through :class:`~otter_tx.broker.interfaces.IConsumerSource`),
  plus the declare / purge / delete of its vhost, and queues reach it only
  through :class:`~otter_tx.broker.interfaces.IConsumer` (:class:`Consumer`):
  a queue on another node could stand behind the same seam;
- outward, a Session answers its client only through
  :class:`~otter_tx.broker.interfaces.ISessionClient`: ``delivered``,
  ``returned``, ``confirmed`` / ``noteConfirms``, ``consumerCancelled``,
  ``channelFailed``, ``connectionFailed`` and the ``paused`` flow flag,
  with broker values (Messages, consumers, errors), never wire methods.
  The AMQP client is ``otter_tx.door.protocol.AMQPServerProtocol`` behind the
  door ``otter_tx.door.channel.Channel``; the HTTP one is
  ``otter_tx.web.door.HTTPRequestConnection``.

Errors are :class:`~otter_tx.amqp.errors.AMQPError` with RabbitMQ's codes
and texts.
"""

import base64
import os
from collections import OrderedDict, deque
from operator import itemgetter

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from zope.interface import implementer

from otter_tx.amqp import codec, spec
from otter_tx.amqp.errors import (
    AMQPError,
    accessRefused,
    erlBinary,
    notFound,
    notImplemented,
    preconditionFailed,
    resourceText,
)
from otter_tx.broker import queue as _queuemod
from otter_tx.broker.access import (
    CONFIGURE,
    READ,
    Access,
    bindChecks,
    exchangeDeclareChecks,
    queueDeclareChecks,
)
from otter_tx.broker.arguments import isInteger
from otter_tx.broker.interfaces import IConsumer
from otter_tx.broker.message import Message
from otter_tx.broker.publish import checkedPublishTarget, checkPublish, prepareMessage, publishTarget
from otter_tx.broker.replyto import REPLY_TO, ReplyToQueue
from otter_tx.broker.stats import MessageCounts
from otter_tx.broker.vhost import serverNamedQueue
from otter_tx.store.interface import StoreFailedError

log = Logger()


def serverConsumerTag():
    """``amq.ctag-`` + 22 base64url characters, as RabbitMQ names consumers."""
    return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode()[:22]


@implementer(IConsumer)
class Consumer:
    """
    A basic.consume subscription of a :class:`Session`.

    :ivar tag: consumer tag (str).  :ivar tagBytes: the tag as a shortstr.
    :ivar queue: the IQueue.  :ivar noAck: bool.  :ivar exclusive: bool.
    :ivar priority: x-priority (int).
    :ivar prefetch: per-consumer prefetch count (0 = unlimited).
    :ivar unacked: this consumer's deliveries in the session's ledger (int).
    """

    __slots__ = ("session", "tag", "tagBytes", "queue", "noAck", "exclusive", "priority",
                 "prefetch", "unacked", "arguments")

    def __init__(self, session, tag, queue, noAck, exclusive, priority, prefetch, arguments):
        self.session = session
        self.tag = tag
        self.tagBytes = codec._shortstr(tag)
        self.queue = queue
        self.noAck = noAck
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def canTake(self):
        """
        True when a delivery may be sent now: the client's output is not
        backed up (``ISessionClient.paused``), the session is open, and
        neither the consumer's nor the session's (global) prefetch is
        exhausted.
        """
        s = self.session
        if s.client.paused or s.closed:
            return False
        if self.noAck:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        g = s.globalPrefetch
        if g and s.unackedCount >= g:
            return False
        return True

    def deliver(self, queue, entry):
        """
        Hand ``entry`` of ``queue`` to the client (called by the queue, which
        counts its own deliveries): the next delivery tag of the session,
        recorded in its ledger unless no-ack, counted in the channel's
        stats, and ``ISessionClient.delivered``.
        """
        s = self.session
        tag = s.deliveryTag = s.deliveryTag + 1
        typed = queue.typeCounts
        if not self.noAck:
            s.unacked[tag] = (queue, entry, self, tag)
            s.unackedCount += 1
            self.unacked += 1
            s.stats.deliver += 1
            if typed is not None:
                typed.deliver += 1
        else:
            s.stats.deliverNoAck += 1
            if typed is not None:
                typed.deliverNoAck += 1
        if entry.redelivered:
            s.stats.redeliver += 1
            if typed is not None:
                typed.redeliver += 1
        s.client.delivered(s.number, self, tag, entry.redelivered,
                               entry.message if not entry.returns else queue.deliveredMessage(entry))

    def cancelledByBroker(self, queue):
        """The queue was deleted: consumer cancel notification."""
        self.session.consumerCancelledByBroker(self)


class Session:
    """
    One channel's state and operations.

    :param broker: the Broker.  :param client: the client, an
        :class:`~otter_tx.broker.interfaces.ISessionClient` (also the owner
        of the exclusive queues this session declares).
    :param vhost: the VHost.  :param user: the authenticated User.
    :param number: the channel number (int) the outbound calls carry.

    The unacked ledger is the Session's alone: :attr:`unacked`, ``delivery
    tag -> (queue, entry, consumer or None, tag)`` in tag order, with
    :attr:`unackedCount` and each of its consumers' ``unacked`` count kept
    in step by :meth:`deliver`, :meth:`get` and :meth:`_takeUnacked`;
    acknowledgements made in a transaction wait in ``_txAcks`` as ``(kind,
    records, requeue)`` until commit, and :class:`RequeueFeeder` hands a
    large ledger back to the queues a slice per turn.
    """

    _needSync = False
    _confirmOutbox = None
    replyTo = None
    #: True once this session published (RabbitMQ's rabbitmq_global_publishers)
    publisher = False

    def __init__(self, broker, client, vhost, user, number=0, stats=None):
        self.broker = broker
        self.client = client
        self.vhost = vhost
        self.user = user
        self.number = number
        self.access = Access(broker, user.name, vhost.name)
        #: the broker's GlobalCounters (churn counters)
        self.counters = broker.counters
        #: this channel's message counters (plain increments on the hot path):
        #: its own MessageCounts, registered with the vhost until closed, or
        #: ``stats`` (an HTTP request counts straight into its vhost's)
        if stats is None:
            stats = MessageCounts()
            vhost.sessions.add(self)
        self.stats = stats
        #: True once :meth:`close` ran: nothing more is delivered or confirmed
        self.closed = False
        self.consumers = {}
        self.unacked = OrderedDict()
        self.unackedCount = 0
        self.deliveryTag = 0
        self.prefetchCount = 0
        self.globalPrefetch = 0
        self.confirmMode = False
        self.publishSeq = 0
        self._confirms = []
        #: [(publish seq, [(link, forward number)])] of confirms waiting on other nodes' answers
        self._forwardedConfirms = None
        self.txMode = False
        self._txPublishes = []
        self._txAcks = []
        self.lastQueue = None

    # --- exchanges ------------------------------------------------------------

    def declareExchange(self, name, type, passive=False, durable=False, autoDelete=False,
                        internal=False, arguments=None):
        """exchange.declare; 403 without configure permission (and the alternate's)."""
        arguments = arguments or {}
        if not passive:
            self.checkExchangeDeclare(name, arguments)
        return self.vhost.declareExchange(name, type, passive, durable, autoDelete, internal, arguments)

    def checkExchangeDeclare(self, name, arguments=None):
        """
        The permission checks of a (non-passive) declare of exchange
        ``name`` with ``arguments`` (dict;
        :func:`~otter_tx.broker.access.exchangeDeclareChecks`); with
        ``arguments`` None, those that need no arguments (configure on the
        exchange), for a door to run before it reads a request's body.
        403 ``ACCESS_REFUSED``.
        """
        self.access.checkAll(exchangeDeclareChecks(name, arguments or {}))

    def deleteExchange(self, name, ifUnused=False):
        """exchange.delete; 403 without configure permission."""
        self.access.check(CONFIGURE, "exchange", name)
        self.vhost.deleteExchange(name, ifUnused)

    def bindExchange(self, destination, source, routingKey, arguments=None):
        """exchange.bind; 403 without write on ``destination`` and read on ``source``; 404."""
        self.checkBind("exchange", destination, source)
        dest = self.vhost.getExchange(destination)
        src = self.vhost.getExchange(source)
        self.vhost.bind(src, dest, routingKey, arguments or {})

    def unbindExchange(self, destination, source, routingKey, arguments=None):
        """exchange.unbind (no error when either end or the binding is missing)."""
        self.checkBind("exchange", destination, source)
        dest = self.vhost.exchanges.get(destination)
        src = self.vhost.exchanges.get(source)
        if dest is not None and src is not None:
            self.vhost.unbind(src, dest, routingKey, arguments or {})

    def checkBind(self, destinationKind, destination, source):
        """
        The permission checks of a bind or unbind of ``destination`` (str;
        ``destinationKind`` ``"queue"`` or ``"exchange"``) to exchange
        ``source`` (str), which need no arguments
        (:func:`~otter_tx.broker.access.bindChecks`): 403 ``ACCESS_REFUSED``.
        """
        self.access.checkAll(bindChecks(destinationKind, destination, source))

    # --- queues -----------------------------------------------------------------

    def queueName(self, name):
        """``name``, or for ``""`` the last queue declared here (404 when none)."""
        if name == "":
            if self.lastQueue is None:
                raise notFound("no previously declared queue")
            return self.lastQueue
        return name

    def declareQueue(self, name, passive=False, durable=False, exclusive=False, autoDelete=False,
                     arguments=None):
        """queue.declare (``""`` names it ``amq.gen-...``); the Queue."""
        serverNamed = False
        args = arguments or {}
        if not passive:
            if name == "":
                name = serverNamedQueue()
                serverNamed = True
            self.checkQueueDeclare(name, args)
        existed = self.vhost.findQueue(name) is not None
        q = self.vhost.declareQueue(
            name, self.client, passive, durable, exclusive, autoDelete, args,
            serverNamed=serverNamed,
        )
        if isinstance(q, Deferred):
            # a new queue of a cluster: declared once its record is written
            return q.addCallback(self._declared, passive, existed)
        return self._declared(q, passive, existed)

    def _declared(self, q, passive, existed):
        if not passive:
            self.counters.queuesDeclared += 1
            if not existed:
                self.counters.queuesCreated += 1
        self.lastQueue = q.name
        return q

    def checkQueueDeclare(self, name, arguments=None):
        """
        The permission checks of a (non-passive) declare of queue ``name``
        with ``arguments`` (dict;
        :func:`~otter_tx.broker.access.queueDeclareChecks`); with
        ``arguments`` None, those that need no arguments (configure on the
        queue), for a door to run before it reads a request's body.
        403 ``ACCESS_REFUSED``.
        """
        self.access.checkAll(queueDeclareChecks(name, arguments or {}))

    def bindQueue(self, queue, exchange, routingKey, arguments=None):
        """queue.bind; an empty key with an empty queue name binds with the queue's name."""
        qname = self.queueName(queue)
        self.checkBind("queue", qname, exchange)
        q = self.vhost.getQueue(qname, self.client)
        ex = self.vhost.getExchange(exchange)
        self.vhost.bind(ex, q, routingKey if routingKey or queue else qname, arguments or {})

    def unbindQueue(self, queue, exchange, routingKey, arguments=None):
        """queue.unbind (no error when the exchange or the binding is missing)."""
        qname = self.queueName(queue)
        self.checkBind("queue", qname, exchange)
        q = self.vhost.findQueue(qname)
        if q is None:
            return
        self.vhost.getQueue(qname, self.client)  # 405 for another connection's exclusive queue
        ex = self.vhost.exchanges.get(exchange)
        if ex is not None:
            self.vhost.unbind(ex, q, routingKey, arguments or {})

    def readableQueue(self, queue):
        """
        The queue a get, consume or purge of ``queue`` (str, ``""`` for the
        last declared) reads: 403 without read permission, then 404 or 405.
        """
        qname = self.queueName(queue)
        self.checkQueueRead(qname)
        return self.vhost.getQueue(qname, self.client)

    def checkQueueRead(self, name):
        """
        The permission check of a get, consume or purge of queue ``name``
        (str), which needs nothing else: 403 ``ACCESS_REFUSED`` without read
        permission.
        """
        self.access.check(READ, "queue", name)

    def purgeQueue(self, queue):
        """queue.purge: the number of messages purged; 403 without read permission."""
        return self.readableQueue(queue).purge()

    def deleteQueue(self, queue, ifUnused=False, ifEmpty=False):
        """
        queue.delete: the number of messages deleted, or None when there
        was no such queue; 403 without configure permission.
        """
        name = self.queueName(queue)
        self.access.check(CONFIGURE, "queue", name)
        q = self.vhost.findQueue(name)
        if q is None:
            return None
        self.vhost.getQueue(name, self.client)
        return self.vhost.deleteQueue(q, ifUnused, ifEmpty)

    # --- consumers ------------------------------------------------------------------

    def qos(self, prefetchCount, global_=False):
        """
        basic.qos (prefetch_size must be 0, checked by the caller).  As in
        RabbitMQ 3.10 (``rabbit_channel``, checked on the peer), a per-consumer
        basic.qos also lifts the channel's global prefetch.
        """
        if global_:
            self.globalPrefetch = prefetchCount
            self.resumeDelivery()
        else:
            self.prefetchCount = prefetchCount
            if self.globalPrefetch:
                self.globalPrefetch = 0
                self.resumeDelivery()

    def consume(self, queue, tag="", noAck=False, exclusive=False, arguments=None, reply=None):
        """
        basic.consume: the consumer tag (str), or a Deferred firing with it
        for a queue on another node (whose home node decides the 403).
        ``reply(tag)`` runs before the queue may deliver (the door sends
        consume-ok there).  Errors: 403 read permission, 404, 530 reused tag,
        406 x-priority, 403 exclusive use, 540 (connection) global prefetch on
        a quorum queue.
        """
        qname = self.queueName(queue)
        if qname == REPLY_TO:
            return self._replyToConsume(tag, noAck, reply)
        q = self.readableQueue(qname)
        if not tag:
            tag = serverConsumerTag()
        elif tag in self.consumers:
            raise AMQPError(spec.NOT_ALLOWED, "attempt to reuse consumer tag '%s'" % (tag,))
        args = arguments or {}
        priority = args.get("x-priority", 0)
        if not isInteger(priority):
            raise preconditionFailed(
                "invalid arg 'x-priority' for %s: \"expected integer, got %s\""
                % (resourceText("queue", qname, self.vhost.name), codec.fieldTypeName(priority))
            )
        if q.quorum:
            # RabbitMQ 3.10's quorum queues (docs/quorum.md): no global
            # prefetch (540, connection), and the exclusive flag is ignored
            if self.globalPrefetch:
                raise notImplemented(
                    "%s does not support global qos" % (resourceText("queue", qname, self.vhost.name),))
            exclusive = False
        # a queue kind's own consumer rules (a stream's: docs/streams.md)
        q.checkConsume(noAck, self.prefetchCount, args)
        refused = q.refusesConsumer(exclusive)
        if isinstance(refused, Deferred):
            # a queue on another node: its home node answers (the door reads nothing meanwhile)
            return refused.addCallback(self._admitted, q, qname, tag, noAck, exclusive, priority, args, reply)
        return self._admitted(refused, q, qname, tag, noAck, exclusive, priority, args, reply)

    def _admitted(self, refused, q, qname, tag, noAck, exclusive, priority, args, reply):
        if refused:
            raise accessRefused("%s in exclusive use" % (resourceText("queue", qname, self.vhost.name),))
        if self.closed:
            return tag
        c = Consumer(self, tag, q, noAck, exclusive, int(priority), self.prefetchCount, args)
        self.consumers[tag] = c
        if reply is not None:
            reply(tag)
        q.addConsumer(c, exclusive)
        return tag

    def _replyToConsume(self, tag, noAck, reply):
        if not noAck:
            raise preconditionFailed("reply consumer cannot acknowledge")
        if self.replyTo is not None and self.replyTo.consumer is not None:
            raise preconditionFailed("reply consumer already set")
        tag = tag or serverConsumerTag()
        if tag in self.consumers:
            raise AMQPError(spec.NOT_ALLOWED, "attempt to reuse consumer tag '%s'" % (tag,))
        pseudo = self.replyTo = ReplyToQueue(self.vhost)
        c = Consumer(self, tag, pseudo, True, False, 0, 0, {})
        self.consumers[tag] = c
        if reply is not None:
            reply(tag)
        pseudo.addConsumer(c)
        return tag

    def cancel(self, tag):
        """basic.cancel (no error for an unknown tag)."""
        c = self.consumers.pop(tag, None)
        if c is not None:
            c.queue.removeConsumer(c)

    def consumerCancelledByBroker(self, consumer):
        """
        The consumer's queue was deleted: the consumer is gone, and the
        client is told (``ISessionClient.consumerCancelled``; the AMQP door
        sends basic.cancel when the client advertised
        ``consumer_cancel_notify``, https://www.rabbitmq.com/docs/consumer-cancel).
        """
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]
            if not self.closed:
                self.client.consumerCancelled(self.number, consumer.tag)

    def resumeDelivery(self):
        """Consumers may have room again: let their queues dispatch."""
        for q in {c.queue for c in self.consumers.values()}:
            q.dispatch()

    def get(self, queue, noAck=False):
        """
        basic.get: ``(deliveryTag, entry, queue)`` or None when the queue is
        empty; 403 without read permission, 404.
        """
        q = self.readableQueue(queue)
        entry = q.basicGet(noAck)
        if isinstance(entry, Deferred):
            # a queue on another node
            return entry.addCallback(self._got, q, noAck)
        return self._got(entry, q, noAck)

    def _got(self, entry, q, noAck):
        stats = self.stats
        typed = q.typeCounts
        if entry is None:
            stats.getEmpty += 1
            if typed is not None:
                typed.getEmpty += 1
            return None
        self.deliveryTag += 1
        tag = self.deliveryTag
        if not noAck:
            self.unacked[tag] = (q, entry, None, tag)
            self.unackedCount += 1
            stats.get += 1
            if typed is not None:
                typed.get += 1
        else:
            stats.getNoAck += 1
            if typed is not None:
                typed.getNoAck += 1
        if entry.redelivered:
            stats.redeliver += 1
            if typed is not None:
                typed.redeliver += 1
        return tag, entry, q

    # --- acknowledgements -----------------------------------------------------------

    def _takeUnacked(self, tag, multiple):
        """
        Remove and return the ledger records for ``tag`` (and below with
        ``multiple``; tag 0 with multiple means all).  406 ``unknown
        delivery tag N`` otherwise.
        """
        unacked = self.unacked
        if multiple:
            if tag != 0 and tag not in unacked:
                raise preconditionFailed("unknown delivery tag %d" % (tag,))
            taken = []
            while unacked:
                first = next(iter(unacked))
                if tag and first > tag:
                    break
                taken.append(unacked.popitem(last=False)[1])
        else:
            rec = unacked.pop(tag, None)
            if rec is None:
                raise preconditionFailed("unknown delivery tag %d" % (tag,))
            taken = [rec]
        self.unackedCount -= len(taken)
        for _, _, consumer, _ in taken:
            if consumer is not None:
                consumer.unacked -= 1
        return taken

    def ack(self, tag, multiple=False):
        """basic.ack; 406 ``unknown delivery tag N``."""
        if not multiple and not self.txMode:
            # hot path: one delivery acknowledged
            rec = self.unacked.pop(tag, None)
            if rec is not None:
                queue, entry, consumer, _ = rec
                self.unackedCount -= 1
                self.stats.ack += 1
                if queue.typeCounts is not None:
                    queue.typeCounts.ack += 1
                if consumer is not None:
                    consumer.unacked -= 1
                queue.settle(entry)
                if self.globalPrefetch:
                    self.resumeDelivery()
                elif queue.readyCount:
                    queue.dispatch()
                return
        taken = self._takeUnacked(tag, multiple)
        if self.txMode:
            self._txAcks.append(("ack", taken, False))
            return
        self._settle(taken)

    def _settle(self, taken):
        self.stats.ack += len(taken)
        queues = set()
        for queue, entry, consumer, _ in taken:
            queue.settle(entry)
            queues.add(queue)
            if queue.typeCounts is not None:
                queue.typeCounts.ack += 1
        self._afterSettle(queues)

    def _afterSettle(self, queues):
        if self.globalPrefetch:
            self.resumeDelivery()
            return
        for q in queues:
            q.dispatch()

    def reject(self, tag, requeue=True):
        """basic.reject; 406 ``unknown delivery tag N``."""
        self._rejectTaken(self._takeUnacked(tag, False), requeue)

    def nack(self, tag, multiple=False, requeue=True):
        """basic.nack; 406 ``unknown delivery tag N``."""
        self._rejectTaken(self._takeUnacked(tag, multiple), requeue)

    def _rejectTaken(self, taken, requeue):
        if self.txMode:
            self._txAcks.append(("reject", taken, requeue))
            return
        self._doReject(taken, requeue)

    def _doReject(self, taken, requeue):
        byQueue = {}
        for queue, entry, consumer, _ in taken:
            byQueue.setdefault(queue, []).append(entry)
        for queue, entries in byQueue.items():
            if requeue:
                queue.requeue(entries)
            else:
                queue.reject(entries)
        self._afterSettle(byQueue)

    def recover(self, requeue=True):
        """basic.recover / recover-async: every unacked delivery is requeued (540 for requeue=false)."""
        if not requeue:
            raise notImplemented("requeue=false")
        if len(self.unacked) > _queuemod.REQUEUE_SLICE and not self.txMode:
            # every unacked delivery, handed to the queues a slice per turn
            unacked, self.unacked = self.unacked, OrderedDict()
            self.unackedCount = 0
            for c in self.consumers.values():
                c.unacked = 0
            self._afterSettle(RequeueFeeder(unacked).start())
            return
        taken = self._takeUnacked(0, True) if self.unacked else []
        self._doReject(taken, True)

    def checkAckTimeout(self, limitSeconds, timeoutMs):
        """
        Fail this channel (``ISessionClient.channelFailed``) with RabbitMQ's
        406 when its oldest unacked delivery was made before
        ``limitSeconds`` (float, clock seconds); ``timeoutMs`` (int,
        milliseconds) is the configured consumer timeout, for the text.
        """
        if self.closed or not self.unacked:
            return
        entry = next(iter(self.unacked.values()))[1]
        if entry.deliveredAt is not None and entry.deliveredAt < limitSeconds:
            self.client.channelFailed(
                self.number,
                preconditionFailed(
                    "delivery acknowledgement on channel %d timed out. Timeout value used: %d ms. "
                    "This timeout value can be configured, see consumers doc guide to learn more"
                    % (self.number, timeoutMs)
                ),
            )

    # --- publish ---------------------------------------------------------------------

    def checkPublish(self, exchange):
        """
        The permission check of a publish to ``exchange`` (str), which needs
        no message: 403 ``ACCESS_REFUSED`` without write permission
        (:func:`publish.checkPublish`).
        """
        checkPublish(self.access, exchange)

    def publishTarget(self, exchange):
        """The Exchange a publish to ``exchange`` (str) goes to (see :func:`publish.publishTarget`)."""
        return publishTarget(self.vhost, self.access, exchange)

    def checkedPublishTarget(self, exchange):
        """
        :meth:`publishTarget` after :meth:`checkPublish` passed, whose check
        is not run again (:func:`publish.checkedPublishTarget`): 404, or 403
        for an internal exchange.
        """
        return checkedPublishTarget(self.vhost, exchange)

    def publish(self, ex, routingKey, mandatory, propsRaw, body, address=None, props=None):
        """
        A complete publish to ``ex`` (from :meth:`publishTarget`): build the
        message, apply the property rules (:func:`publish.prepareMessage`),
        then route it now, or at tx.commit.  Returns ``(routed, rejected)``
        when routed now, else None.  With confirms on, the confirm goes out
        after the chunk (and the store's sync for persistent messages).
        """
        try:
            message = Message(ex.name, routingKey, propsRaw, body, props)
        except codec.FrameSyntaxError:
            # undecodable properties (RabbitMQ decodes them lazily and
            # answers 541 INTERNAL_ERROR; docs/compatibility.md)
            raise AMQPError(spec.FRAME_ERROR, "cannot decode %s" % (erlBinary(propsRaw),))
        message.addressCache = address
        props = message.props
        # hot path: most properties (delivery_mode, content_type...) need no rule
        if props and ("user_id" in props or "headers" in props or "reply_to" in props):
            prepareMessage(message, self.user.name, self.replyTo)
        if self.confirmMode:
            self.publishSeq += 1
            seq = self.publishSeq
        else:
            seq = 0
        if self.txMode:
            self._txPublishes.append((ex, message, mandatory))
            return None
        return self._route(ex, message, mandatory, seq)

    def _route(self, ex, message, mandatory, seq):
        routed, rejected = self.vhost.publish(ex, message)
        if not self.publisher:
            self.publisher = True
        # hot path: one increment (routed is derived, see GlobalCounters)
        stats = self.stats
        stats.publish += 1
        if not routed:
            if mandatory:
                stats.returnUnroutable += 1
                self.client.returned(self.number, spec.NO_ROUTE, "NO_ROUTE", message)
            else:
                stats.dropUnroutable += 1
        if seq:
            stats.publishConfirm += 1
            self._confirms.append((seq, not rejected))
            forwarded = message.forwarded
            if forwarded:
                # taken by queues on other nodes: the confirm waits for their answer
                # (and a nack for a queue there that refused it, reject-publish)
                self._needSync = True
                if self._forwardedConfirms is None:
                    self._forwardedConfirms = []
                self._forwardedConfirms.append((seq, forwarded))
            elif message.stored or self.broker.streams.unsynced:
                # (or a stream append not durable yet: docs/streams.md)
                self._needSync = True
            self.client.noteConfirms(self)
        return routed, rejected

    def _sync(self, forwarded=None):
        """
        A Deferred that fires once the store has synced everything written
        so far and, for ``forwarded`` (``[(seq, [(link, n)])]``), each link
        those publishes went over has its answer: a link lost meanwhile fails it.
        """
        links = {link for _, fwds in forwarded for link, _ in fwds} if forwarded else None
        return self.broker.sync(links)

    def flushConfirms(self):
        """
        Send the pending publisher confirms.  When any of them is a
        persistent message written to a durable queue, the batch waits for
        the store's ``sync()`` (fsync'd group commit), and later batches wait
        behind it so confirms stay in order
        (https://www.rabbitmq.com/docs/confirms#when-publishes-are-confirmed).
        When the store could not write that batch (``StoreFailedError``),
        every publish of the batch gets basic.nack ("the broker could not
        take responsibility", same page) and the connection stays open.
        """
        confirms, self._confirms = self._confirms, []
        if self.closed or not confirms:
            return
        needSync, self._needSync = self._needSync, False
        forwarded, self._forwardedConfirms = self._forwardedConfirms, None
        outbox = self._confirmOutbox
        if outbox is None:
            outbox = self._confirmOutbox = deque()
        if needSync:
            slot = [confirms, False]
            outbox.append(slot)

            def synced(_):
                if forwarded:
                    refused = {seq for seq, fwds in forwarded
                               if any([link.refused(n) for link, n in fwds])}
                    if refused:
                        slot[0] = [(seq, ok and seq not in refused) for seq, ok in confirms]
                slot[1] = True
                self._drainConfirms()

            def failed(f):
                if not f.check(StoreFailedError):
                    log.failure("store sync failed; confirms withheld", f)
                    self.client.connectionFailed(
                        spec.INTERNAL_ERROR, "INTERNAL_ERROR - message store failed"
                    )
                    return
                slot[0] = [(seq, False) for seq, _ in confirms]
                slot[1] = True
                self._drainConfirms()

            self._sync(forwarded).addCallbacks(synced, failed)
        else:
            outbox.append([confirms, True])
            self._drainConfirms()

    def _drainConfirms(self):
        outbox = self._confirmOutbox
        while outbox and outbox[0][1]:
            confirms = outbox.popleft()[0]
            if self.closed:
                continue
            # RabbitMQ counts the basic.acks, not the nacks
            self.stats.confirm += sum(1 for c in confirms if c[1])
            self.client.confirmed(self.number, confirms)

    # --- tx / confirm ------------------------------------------------------------------

    def txSelect(self):
        """tx.select; 406 on a confirm-mode channel."""
        if self.confirmMode:
            raise preconditionFailed("cannot switch from confirm to tx mode")
        self.txMode = True

    def txCommit(self, committed):
        """
        tx.commit: route the held publishes, apply the held acks; call
        ``committed()`` once done (after the store's sync when a persistent
        message reached a durable queue).  406 outside tx mode.
        """
        if not self.txMode:
            raise preconditionFailed("channel is not transactional")
        publishes, self._txPublishes = self._txPublishes, []
        acks, self._txAcks = self._txAcks, []
        for ex, message, mandatory in publishes:
            if ex.deleted:
                continue
            self._route(ex, message, mandatory, 0)
        for kind, taken, requeue in acks:
            if kind == "ack":
                self._settle(taken)
            else:
                self._doReject(taken, requeue)
        if any(message.stored or message.forwarded for _, message, _ in publishes):
            # persistent messages in durable queues: commit-ok once on disk
            def done(_):
                if not self.closed:
                    committed()

            def failed(f):
                log.failure("store sync failed; tx.commit not confirmed", f)
                self.client.connectionFailed(spec.INTERNAL_ERROR, "INTERNAL_ERROR - message store failed")

            # (the links and replicated quorum queues they went to answer too)
            forwarded = [(0, m.forwarded) for _, m, _ in publishes if m.forwarded]
            self._sync(forwarded or None).addCallbacks(done, failed)
            return
        committed()

    def txRollback(self):
        """tx.rollback: drop the held publishes; held acks become unacked again.  406 outside tx."""
        if not self.txMode:
            raise preconditionFailed("channel is not transactional")
        self._txPublishes = []
        acks, self._txAcks = self._txAcks, []
        if acks:
            merged = list(self.unacked.values())
            for _, taken, _ in acks:
                for rec in taken:
                    merged.append(rec)
                    if rec[2] is not None:
                        rec[2].unacked += 1
            merged.sort(key=lambda rec: rec[3])
            self.unacked = OrderedDict((rec[3], rec) for rec in merged)
            self.unackedCount = len(self.unacked)

    def pendingCounts(self):
        """
        ``(unconfirmed, uncommitted, acksUncommitted)`` (ints), RabbitMQ's
        channel ``messages_unconfirmed``, ``messages_uncommitted`` and
        ``acks_uncommitted``: publishes not confirmed yet, publishes and
        acknowledgements held by an open transaction.
        """
        unconfirmed = len(self._confirms)
        for slot in self._confirmOutbox or ():
            unconfirmed += len(slot[0])
        return unconfirmed, len(self._txPublishes), sum(len(a[1]) for a in self._txAcks)

    def confirmSelect(self):
        """confirm.select; 406 on a tx-mode channel."""
        if self.txMode:
            raise preconditionFailed("cannot switch from tx to confirm mode")
        self.confirmMode = True

    # --- the end ---------------------------------------------------------------------

    def close(self):
        """
        Close the session: mark it :attr:`closed` (nothing more is
        delivered, confirmed or cancelled through the client) and release
        everything it holds: cancel its consumers and requeue its
        unacknowledged messages, including acks held by an open transaction
        (RabbitMQ requeues on channel close).  Idempotent.
        """
        self.closed = True
        vhost = self.vhost
        if self in vhost.sessions:
            # its counts stay in the vhost's totals (RabbitMQ keeps them too)
            vhost.sessions.discard(self)
            vhost.channelStats.add(self.stats)
        consumers, self.consumers = self.consumers, {}
        unacked, self.unacked = self.unacked, OrderedDict()
        self.unackedCount = 0
        byQueue = {}
        if len(unacked) > _queuemod.REQUEUE_SLICE:
            # a million unacked: handed to their queues a slice per turn
            for queue in RequeueFeeder(unacked).start():
                byQueue[queue] = []
        else:
            for queue, entry, consumer, _ in unacked.values():
                byQueue.setdefault(queue, []).append(entry)
        for txAck in self._txAcks:
            for queue, entry, consumer, _ in txAck[1]:
                byQueue.setdefault(queue, []).append(entry)
        self._txAcks = []
        self._txPublishes = []
        for queue, entries in byQueue.items():
            if entries:
                queue.requeue(entries, dispatch=False)
        for c in consumers.values():
            c.queue.removeConsumer(c)
        for queue in byQueue:
            queue.dispatch()


class RequeueFeeder:
    """
    Hands a session's unacked records (``tag -> (queue, entry, consumer,
    tag)``, an ``OrderedDict``, consumed) back to their queues
    :data:`~otter_tx.broker.queue.REQUEUE_SLICE` records per reactor turn,
    newest first, so that a channel closing (or ``basic.recover``) with a
    million unacked deliveries never holds the reactor: each queue holds
    its delivery until the feeder is done (``Queue.holdRequeue``), so no
    consumer gets a later message before an earlier one still here.
    Finding the queues is one C-level pass (``set(map(...))``, about 30 ms
    per million).
    """

    def __init__(self, unacked):
        self._unacked = unacked
        self._queues = set(map(itemgetter(0), unacked.values()))
        self._call = None
        self._clock = next(iter(self._queues)).clock if self._queues else None

    def start(self):
        """Hold every queue concerned and schedule the first slice; returns the queues (set)."""
        for q in self._queues:
            q.holdRequeue(self)
        self._schedule()
        return self._queues

    def _schedule(self):
        if self._unacked or self._queues:
            self._call = self._clock.callLater(0, self._turn)

    def _turn(self):
        self._call = None
        self._feed(_queuemod.REQUEUE_SLICE)
        if self._unacked:
            self._schedule()

    def _feed(self, n):
        unacked = self._unacked
        byQueue = {}
        pop = unacked.popitem
        for _ in range(min(n, len(unacked))):
            queue, entry, _, _ = pop()[1]
            byQueue.setdefault(queue, []).append(entry)
        for queue, entries in byQueue.items():
            queue.requeue(entries, dispatch=False)
        if not unacked:
            queues, self._queues = self._queues, set()
            for q in queues:
                q.releaseRequeue(self)

    def finish(self):
        """Hand over everything left now (a ``basic.get`` or a stop needs the queue whole)."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._feed(len(self._unacked))
