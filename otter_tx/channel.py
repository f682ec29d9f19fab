"""
One AMQP channel: the channel, exchange, queue, basic, tx and confirm
classes (AMQP 0-9-1 spec chapter 1 and RabbitMQ's extensions), content
assembly, consumers, prefetch, acknowledgements and publisher confirms.

Errors are raised as :class:`~otter_tx.amqp.errors.AMQPError`; the
connection turns channel-level codes (403, 404, 405, 406) into
channel.close and the rest into connection.close, as RabbitMQ does.
"""

import base64
import os
import struct
from collections import OrderedDict, deque
from operator import itemgetter

from twisted.logger import Logger

from otter_tx.amqp import codec, spec
from otter_tx.amqp.codec import FrameSyntaxError
from otter_tx.amqp.errors import (
    AMQPError,
    accessRefused,
    erlBinary,
    notFound,
    notImplemented,
    preconditionFailed,
    resourceAccessRefused,
    rs,
)
from otter_tx.broker.arguments import isInteger
from otter_tx.broker.broker import exchangeDeclareChecks, queueDeclareChecks
from otter_tx.broker import queue as _queuemod
from otter_tx.broker.message import Message
from otter_tx.broker.replyto import REPLY_TO, ReplyToQueue
from otter_tx.broker.vhost import serverNamedQueue
from otter_tx.store.interface import StoreFailedError

log = Logger()

_pack_B = struct.Struct("!B").pack


def _shortstr(s):
    b = s.encode("utf-8", "surrogateescape")
    return _pack_B(len(b)) + b


def _serverConsumerTag():
    """``amq.ctag-`` + 22 base64url characters, as RabbitMQ names consumers."""
    return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode()[:22]


class Consumer:
    """
    A basic.consume subscription.

    :ivar tag: consumer tag (str).  :ivar queue: the Queue.
    :ivar noAck: bool.  :ivar exclusive: bool.  :ivar priority: x-priority (int).
    :ivar prefetch: per-consumer prefetch count (0 = unlimited).
    :ivar unacked: deliveries not yet acknowledged (int).
    """

    __slots__ = ("channel", "tag", "tagBytes", "queue", "noAck", "exclusive", "priority",
                 "prefetch", "unacked", "arguments")

    def __init__(self, channel, tag, queue, noAck, exclusive, priority, prefetch, arguments):
        self.channel = channel
        self.tag = tag
        self.tagBytes = _shortstr(tag)
        self.queue = queue
        self.noAck = noAck
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def canTake(self):
        """
        True when a delivery may be sent now: the connection's socket is not
        backed up and neither the consumer's nor the channel's (global)
        prefetch is exhausted.
        """
        ch = self.channel
        if ch.connection.paused or ch.closing:
            return False
        if self.noAck:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        g = ch.globalPrefetch
        if g and ch.unackedCount >= g:
            return False
        return True

    def deliver(self, queue, entry):
        """Send basic.deliver for ``entry`` (called by the queue)."""
        self.channel.deliver(self, queue, entry)

    def cancelledByBroker(self, queue):
        """The queue was deleted: consumer cancel notification."""
        self.channel.consumerCancelledByBroker(self)


class Channel:
    """
    Channel state and method handlers.

    :ivar number: the channel number.  :ivar connection: the protocol.
    """

    def __init__(self, connection, number):
        self.connection = connection
        self.number = number
        self.broker = connection.broker
        self.vhost = connection.vhost
        self.closing = False
        self.consumers = {}
        self.unacked = OrderedDict()  # delivery tag -> (queue, entry, consumer)
        self.unackedCount = 0
        self.deliveryTag = 0
        self.prefetchCount = 0
        self.globalPrefetch = 0
        self.confirmMode = False
        self.publishSeq = 0
        self._confirms = []
        self.txMode = False
        self._txPublishes = []
        self._txAcks = []
        self.lastQueue = None
        self._pending = None  # (exchange, routingKey, mandatory)
        self._header = None
        self._handlers = {
            spec.ChannelFlow: self._channelFlow,
            spec.ChannelFlowOk: self._ignore,
            spec.ExchangeDeclare: self._exchangeDeclare,
            spec.ExchangeDelete: self._exchangeDelete,
            spec.ExchangeBind: self._exchangeBind,
            spec.ExchangeUnbind: self._exchangeUnbind,
            spec.QueueDeclare: self._queueDeclare,
            spec.QueueBind: self._queueBind,
            spec.QueueUnbind: self._queueUnbind,
            spec.QueuePurge: self._queuePurge,
            spec.QueueDelete: self._queueDelete,
            spec.BasicQos: self._basicQos,
            spec.BasicConsume: self._basicConsume,
            spec.BasicCancel: self._basicCancel,
            spec.BasicGet: self._basicGet,
            spec.BasicReject: self._basicReject,
            spec.BasicNack: self._basicNack,
            spec.BasicRecover: self._basicRecover,
            spec.BasicRecoverAsync: self._basicRecoverAsync,
            spec.TxSelect: self._txSelect,
            spec.TxCommit: self._txCommit,
            spec.TxRollback: self._txRollback,
            spec.ConfirmSelect: self._confirmSelect,
        }

    # --- frames -------------------------------------------------------------

    def method(self, m):
        """
        Handle a decoded method (a :class:`~otter_tx.amqp.spec.Method`) for
        this channel: every channel method but channel.open/close/close-ok,
        basic.publish and basic.ack, which the wire engine handles.
        """
        cls = type(m)
        handler = self._handlers.get(cls)
        if handler is None:
            raise AMQPError(spec.COMMAND_INVALID, "%s not allowed on a channel" % (cls.NAME,), cls)
        try:
            handler(m)
        except AMQPError as e:
            if e.method is None:
                e.method = cls
            raise

    def content(self, propsRaw, body):
        """
        The content of the basic.publish given to :meth:`publish` is
        complete: ``propsRaw`` the content header's property flags and list
        (bytes), ``body`` bytes.
        """
        self._header = propsRaw
        self._completePublish(body)

    def closed(self):
        """The channel is finished (closed either way, or the connection released): :meth:`cleanup`."""
        self.cleanup()

    # --- channel class --------------------------------------------------------

    def _ignore(self, m):
        pass

    def _channelFlow(self, m):
        if not m.active:
            raise notImplemented("active=false")
        self.connection.sendMethod(self.number, spec.ChannelFlowOk(True))

    def cleanup(self):
        """
        Release everything this channel holds: cancel consumers and requeue
        unacknowledged messages (RabbitMQ requeues on channel close).
        """
        self.closing = True
        self._pending = self._header = None
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

    # --- exchange class -------------------------------------------------------

    def _reply(self, m, reply):
        if not getattr(m, "nowait", False):
            self.connection.sendMethod(self.number, reply)

    # --- permissions (https://www.rabbitmq.com/docs/access-control) ---------------

    _permCache = None
    _permVersion = -1

    def _check(self, perm, kind, name):
        """
        403 ``access to queue 'Q' in vhost '/' refused for user 'U'`` unless
        the user's ``perm`` regex (0 configure, 1 write, 2 read) matches
        ``name``; the default exchange is checked as ``amq.default``.
        """
        broker = self.broker
        if self._permVersion != broker.permissionsVersion:
            self._permCache = {}
            self._permVersion = broker.permissionsVersion
        key = (perm, kind, name)
        ok = self._permCache.get(key)
        if ok is None:
            ok = self._permCache[key] = broker.permits(self.connection.user.name, self.vhost.name, perm, kind, name)
        if not ok:
            raise resourceAccessRefused(kind, name, self.vhost.name, self.connection.user.name)

    def _exchangeDeclare(self, m):
        if not m.passive:
            for perm, kind, resource in exchangeDeclareChecks(m.exchange, m.arguments or {}):
                self._check(perm, kind, resource)
        self.vhost.declareExchange(
            m.exchange, m.type, m.passive, m.durable, m.auto_delete, m.internal, m.arguments or {}
        )
        self._reply(m, spec.ExchangeDeclareOk())

    def _exchangeDelete(self, m):
        self._check(0, "exchange", m.exchange)
        self.vhost.deleteExchange(m.exchange, m.if_unused)
        self._reply(m, spec.ExchangeDeleteOk())

    def _exchangeBind(self, m):
        self._check(1, "exchange", m.destination)
        self._check(2, "exchange", m.source)
        dest = self.vhost.getExchange(m.destination)
        src = self.vhost.getExchange(m.source)
        self.vhost.bind(src, dest, m.routing_key, m.arguments or {})
        self._reply(m, spec.ExchangeBindOk())

    def _exchangeUnbind(self, m):
        self._check(1, "exchange", m.destination)
        self._check(2, "exchange", m.source)
        dest = self.vhost.exchanges.get(m.destination)
        src = self.vhost.exchanges.get(m.source)
        if dest is not None and src is not None:
            self.vhost.unbind(src, dest, m.routing_key, m.arguments or {})
        self._reply(m, spec.ExchangeUnbindOk())

    # --- queue class ------------------------------------------------------------

    def _queueName(self, name):
        if name == "":
            if self.lastQueue is None:
                raise notFound("no previously declared queue")
            return self.lastQueue
        return name

    def _queueDeclare(self, m):
        name = m.queue
        serverNamed = False
        args = m.arguments or {}
        if not m.passive:
            if name == "":
                name = serverNamedQueue()
                serverNamed = True
            for perm, kind, resource in queueDeclareChecks(name, args):
                self._check(perm, kind, resource)
        q = self.vhost.declareQueue(
            name,
            self.connection,
            m.passive,
            m.durable,
            m.exclusive,
            m.auto_delete,
            args,
            serverNamed=serverNamed,
        )
        self.lastQueue = q.name
        self._reply(m, spec.QueueDeclareOk(q.name, q.messageCount, q.consumerCount))

    def _queueBind(self, m):
        qname = self._queueName(m.queue)
        self._check(1, "queue", qname)
        self._check(2, "exchange", m.exchange)
        q = self.vhost.getQueue(qname, self.connection)
        ex = self.vhost.getExchange(m.exchange)
        self.vhost.bind(ex, q, m.routing_key if m.routing_key or m.queue else qname, m.arguments or {})
        self._reply(m, spec.QueueBindOk())

    def _queueUnbind(self, m):
        qname = self._queueName(m.queue)
        self._check(1, "queue", qname)
        self._check(2, "exchange", m.exchange)
        q = self.vhost.queues.get(qname)
        ex = self.vhost.exchanges.get(m.exchange)
        if q is not None:
            self.vhost.getQueue(qname, self.connection)
        if q is not None and ex is not None:
            self.vhost.unbind(ex, q, m.routing_key, m.arguments or {})
        self.connection.sendMethod(self.number, spec.QueueUnbindOk())

    def _queuePurge(self, m):
        qname = self._queueName(m.queue)
        self._check(2, "queue", qname)
        q = self.vhost.getQueue(qname, self.connection)
        n = q.purge()
        self._reply(m, spec.QueuePurgeOk(n))

    def _queueDelete(self, m):
        name = self._queueName(m.queue)
        self._check(0, "queue", name)
        q = self.vhost.queues.get(name)
        n = 0
        if q is not None:
            self.vhost.getQueue(name, self.connection)
            # RabbitMQ answers delete-ok before this connection's consumers
            # of the queue see basic.cancel: hold those until the reply is out
            conn = self.connection
            conn.heldCancels = held = []
            try:
                n = self.vhost.deleteQueue(q, m.if_unused, m.if_empty)
            finally:
                conn.heldCancels = None
            self._reply(m, spec.QueueDeleteOk(n))
            for number, tag in held:
                conn.sendMethod(number, spec.BasicCancel(tag, True))
            return
        self._reply(m, spec.QueueDeleteOk(n))

    # --- basic class: consumers ---------------------------------------------------

    def _basicQos(self, m):
        if m.prefetch_size != 0:
            raise notImplemented("prefetch_size!=0 (%d)" % (m.prefetch_size,))
        if m.global_:
            self.globalPrefetch = m.prefetch_count
        else:
            self.prefetchCount = m.prefetch_count
        self.connection.sendMethod(self.number, spec.BasicQosOk())
        if m.global_:
            self.resumeDelivery()

    def _basicConsume(self, m):
        qname = self._queueName(m.queue)
        if qname == REPLY_TO:
            return self._replyToConsume(m)
        self._check(2, "queue", qname)
        q = self.vhost.getQueue(qname, self.connection)
        tag = m.consumer_tag
        if not tag:
            tag = _serverConsumerTag()
        elif tag in self.consumers:
            raise AMQPError(spec.NOT_ALLOWED, "attempt to reuse consumer tag '%s'" % (tag,))
        args = m.arguments or {}
        priority = args.get("x-priority", 0)
        if not isInteger(priority):
            raise preconditionFailed(
                "invalid arg 'x-priority' for %s: \"expected integer, got %s\""
                % (rs("queue", qname, self.vhost.name), codec.fieldTypeName(priority))
            )
        if q.exclusiveConsumer is not None or (m.exclusive and (q.consumers or q.singleActive)):
            raise accessRefused("%s in exclusive use" % (rs("queue", qname, self.vhost.name),))
        c = Consumer(self, tag, q, m.no_ack, m.exclusive, int(priority), self.prefetchCount, args)
        self.consumers[tag] = c
        if m.exclusive:
            q.exclusiveConsumer = c
        if not m.nowait:
            self.connection.sendMethod(self.number, spec.BasicConsumeOk(tag))
        q.addConsumer(c)

    def _replyToConsume(self, m):
        if not m.no_ack:
            raise preconditionFailed("reply consumer cannot acknowledge")
        if self.replyTo is not None and self.replyTo.consumer is not None:
            raise preconditionFailed("reply consumer already set")
        tag = m.consumer_tag or _serverConsumerTag()
        if tag in self.consumers:
            raise AMQPError(spec.NOT_ALLOWED, "attempt to reuse consumer tag '%s'" % (tag,))
        pseudo = self.replyTo = ReplyToQueue(self.vhost)
        c = Consumer(self, tag, pseudo, True, False, 0, 0, {})
        self.consumers[tag] = c
        if not m.nowait:
            self.connection.sendMethod(self.number, spec.BasicConsumeOk(tag))
        pseudo.addConsumer(c)

    replyTo = None

    def _basicCancel(self, m):
        c = self.consumers.pop(m.consumer_tag, None)
        if c is not None:
            c.queue.removeConsumer(c)
        self._reply(m, spec.BasicCancelOk(m.consumer_tag))

    def consumerCancelledByBroker(self, consumer):
        """
        The consumer's queue was deleted: send basic.cancel when the client
        advertised ``consumer_cancel_notify``
        (https://www.rabbitmq.com/docs/consumer-cancel).
        """
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]
            conn = self.connection
            if not self.closing and conn.capabilities.get("consumer_cancel_notify"):
                if conn.heldCancels is not None:
                    conn.heldCancels.append((self.number, consumer.tag))
                else:
                    conn.sendMethod(self.number, spec.BasicCancel(consumer.tag, True))

    def checkAckTimeout(self, limit, timeoutMs):
        """
        Close this channel with RabbitMQ's 406 when its oldest unacked
        delivery was made before ``limit`` (clock seconds).
        """
        if self.closing or not self.unacked:
            return
        entry = next(iter(self.unacked.values()))[1]
        if entry.deliveredAt is not None and entry.deliveredAt < limit:
            self.connection.closeChannel(
                self.number,
                preconditionFailed(
                    "delivery acknowledgement on channel %d timed out. Timeout value used: %d ms. "
                    "This timeout value can be configured, see consumers doc guide to learn more"
                    % (self.number, timeoutMs)
                )
            )

    def resumeDelivery(self):
        """Consumers may have room again: let their queues dispatch."""
        for q in {c.queue for c in self.consumers.values()}:
            q.dispatch()

    def deliver(self, consumer, queue, entry):
        """Send basic.deliver to ``consumer`` (called by the queue)."""
        self.deliveryTag += 1
        tag = self.deliveryTag
        message = entry.message
        if not consumer.noAck:
            self.unacked[tag] = (queue, entry, consumer, tag)
            self.unackedCount += 1
            consumer.unacked += 1
        self.connection.sendDeliver(self.number, consumer.tagBytes, tag, entry.redelivered, message)

    def _basicGet(self, m):
        qname = self._queueName(m.queue)
        self._check(2, "queue", qname)
        q = self.vhost.getQueue(qname, self.connection)
        entry = q.basicGet(m.no_ack)
        if entry is None:
            self.connection.sendMethod(self.number, spec.BasicGetEmpty(""))
            return
        self.deliveryTag += 1
        tag = self.deliveryTag
        if not m.no_ack:
            self.unacked[tag] = (q, entry, None, tag)
            self.unackedCount += 1
        message = entry.message
        self.connection.sendGetOk(self.number, tag, entry.redelivered, message, q.messageCount)

    # --- basic class: acknowledgements -------------------------------------------

    def _takeUnacked(self, tag, multiple):
        """
        Remove and return the unacked records for ``tag`` (and below with
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

    def _basicAck(self, tag, multiple):
        if not multiple and not self.txMode:
            # hot path: one delivery acknowledged
            rec = self.unacked.pop(tag, None)
            if rec is not None:
                queue, entry, consumer, _ = rec
                self.unackedCount -= 1
                if consumer is not None:
                    consumer.unacked -= 1
                queue.settle(entry)
                if self.globalPrefetch:
                    self.resumeDelivery()
                elif queue.readyCount:
                    queue.dispatch()
                return
        try:
            taken = self._takeUnacked(tag, multiple)
        except AMQPError as e:
            e.method = spec.BasicAck
            raise
        if self.txMode:
            self._txAcks.append(("ack", taken, False))
            return
        self._settle(taken)

    #: basic.ack of ``deliveryTag`` (int), ``multiple`` (bool), decoded by the
    #: wire engine: the hot path, so the door is the handler itself
    ack = _basicAck

    def _settle(self, taken):
        queues = set()
        for queue, entry, consumer, _ in taken:
            queue.settle(entry)
            queues.add(queue)
        self._afterSettle(queues)

    def _afterSettle(self, queues):
        if self.globalPrefetch:
            self.resumeDelivery()
            return
        for q in queues:
            q.dispatch()

    def _basicReject(self, m):
        taken = self._takeUnacked(m.delivery_tag, False)
        self._rejectTaken(taken, m.requeue)

    def _basicNack(self, m):
        taken = self._takeUnacked(m.delivery_tag, m.multiple)
        self._rejectTaken(taken, m.requeue)

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
                queue.discard(entries)
        self._afterSettle(byQueue)

    def _basicRecover(self, m):
        self._recover(m)
        self.connection.sendMethod(self.number, spec.BasicRecoverOk())

    def _basicRecoverAsync(self, m):
        self._recover(m)

    def _recover(self, m):
        if not m.requeue:
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

    # --- basic class: publish -----------------------------------------------------

    def publish(self, exchange, routingKey, mandatory, address):
        """
        basic.publish (decoded by the wire engine; immediate=true was
        refused there): ``exchange`` and ``routingKey`` str,
        ``mandatory`` bool, ``address`` the exchange and routing key as the
        two short strings deliveries repeat (bytes).  Its content follows
        in :meth:`content`.
        """
        try:
            self._check(1, "exchange", exchange)
        except AMQPError as e:
            e.method = spec.BasicPublish
            raise
        ex = self.vhost.exchanges.get(exchange)
        if ex is None:
            raise AMQPError(
                spec.NOT_FOUND, "no %s" % (rs("exchange", exchange, self.vhost.name),),
                spec.BasicPublish,
            )
        if ex.internal:
            raise AMQPError(
                spec.ACCESS_REFUSED,
                "cannot publish to internal %s" % (rs("exchange", exchange, self.vhost.name),),
                spec.BasicPublish,
            )
        # exchange and routing key as the short strings deliveries repeat
        self._pending = (ex, routingKey, mandatory, address)
        self._header = None
        if self.connection.blocked:
            self.connection.publishedWhileBlocked()

    def _completePublish(self, body):
        ex, routingKey, mandatory, address = self._pending
        propsRaw = self._header
        self._pending = self._header = None
        try:
            message = Message(ex.name, routingKey, propsRaw, body)
        except AMQPError as e:
            e.method = spec.BasicPublish
            raise
        except FrameSyntaxError:
            # undecodable properties (RabbitMQ decodes them lazily and
            # answers 541 INTERNAL_ERROR; docs/compatibility.md)
            raise AMQPError(
                spec.FRAME_ERROR, "cannot decode %s" % (erlBinary(propsRaw),), spec.BasicPublish
            )
        message.address = address
        props = message.props
        if props:
            uid = props.get("user_id")
            if uid is not None and uid != self.connection.user.name:
                raise AMQPError(
                    spec.PRECONDITION_FAILED,
                    "user_id property set to '%s' but authenticated user was '%s'"
                    % (uid, self.connection.user.name),
                    spec.BasicPublish,
                )
            headers = props.get("headers")
            if headers and ("CC" in headers or "BCC" in headers):
                self._senderSelected(message, headers)
            if props.get("reply_to") == REPLY_TO:
                if self.replyTo is None or self.replyTo.consumer is None:
                    raise AMQPError(
                        spec.PRECONDITION_FAILED, "fast reply consumer does not exist",
                        spec.BasicPublish,
                    )
                props = dict(message.props)
                props["reply_to"] = self.replyTo.address
                message.props = props
                message.propsRaw = codec.encodeProperties(props)
        if self.confirmMode:
            self.publishSeq += 1
            seq = self.publishSeq
        else:
            seq = 0
        if self.txMode:
            self._txPublishes.append((ex, message, mandatory))
            return
        self._route(ex, message, mandatory, seq)

    def _senderSelected(self, message, headers):
        extra = []
        for key in ("CC", "BCC"):
            v = headers.get(key)
            if isinstance(v, list):
                extra.extend(k for k in v if isinstance(k, str))
        message.extraKeys = extra or None
        if "BCC" in headers:
            props = dict(message.props)
            h = dict(headers)
            del h["BCC"]
            props["headers"] = h
            message.props = props
            message.propsRaw = codec.encodeProperties(props)

    def _route(self, ex, message, mandatory, seq):
        routed, rejected = self.vhost.publish(ex, message)
        if not routed and mandatory:
            self.connection.sendReturn(self.number, spec.NO_ROUTE, "NO_ROUTE", message)
        if seq:
            self._confirms.append((seq, not rejected))
            if message.stored:
                self._needSync = True
            self.connection.noteConfirms(self)

    _needSync = False

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
        if self.closing or not confirms:
            return
        needSync, self._needSync = self._needSync, False
        outbox = self._confirmOutbox
        if outbox is None:
            outbox = self._confirmOutbox = deque()
        if needSync:
            slot = [confirms, False]
            outbox.append(slot)

            def synced(_):
                slot[1] = True
                self._drainConfirms()

            def failed(f):
                if not f.check(StoreFailedError):
                    log.failure("store sync failed; confirms withheld", f)
                    self.connection.forceClose(
                        spec.INTERNAL_ERROR, "INTERNAL_ERROR - message store failed"
                    )
                    return
                slot[0] = [(seq, False) for seq, _ in confirms]
                slot[1] = True
                self._drainConfirms()

            self.broker.journal.store.sync().addCallbacks(synced, failed)
        else:
            outbox.append([confirms, True])
            self._drainConfirms()

    _confirmOutbox = None

    def _drainConfirms(self):
        outbox = self._confirmOutbox
        while outbox and outbox[0][1]:
            confirms = outbox.popleft()[0]
            if self.closing:
                continue
            self._sendConfirms(confirms)

    def _sendConfirms(self, confirms):
        """
        Runs of acks collapse into one ``basic.ack multiple=true`` (every
        earlier publish is already settled: confirms go out in order).
        """
        self.connection.sendConfirms(self.number, confirms)

    # --- tx / confirm ---------------------------------------------------------------

    def _txSelect(self, m):
        if self.confirmMode:
            raise preconditionFailed("cannot switch from confirm to tx mode")
        self.txMode = True
        self.connection.sendMethod(self.number, spec.TxSelectOk())

    def _txCommit(self, m):
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
        if any(message.stored for _, message, _ in publishes):
            # persistent messages in durable queues: commit-ok once on disk
            def committed(_):
                if not self.closing:
                    self.connection.sendMethod(self.number, spec.TxCommitOk())

            def failed(f):
                log.failure("store sync failed; tx.commit not confirmed", f)
                self.connection.forceClose(spec.INTERNAL_ERROR, "INTERNAL_ERROR - message store failed")

            self.broker.journal.store.sync().addCallbacks(committed, failed)
            return
        self.connection.sendMethod(self.number, spec.TxCommitOk())

    def _txRollback(self, m):
        if not self.txMode:
            raise preconditionFailed("channel is not transactional")
        self._txPublishes = []
        acks, self._txAcks = self._txAcks, []
        if acks:
            # the acknowledgements are undone: the deliveries are unacked again
            merged = list(self.unacked.values())
            for _, taken, _ in acks:
                for rec in taken:
                    merged.append(rec)
                    if rec[2] is not None:
                        rec[2].unacked += 1
            merged.sort(key=lambda rec: rec[3])
            self.unacked = OrderedDict((rec[3], rec) for rec in merged)
            self.unackedCount = len(self.unacked)
        self.connection.sendMethod(self.number, spec.TxRollbackOk())

    def _confirmSelect(self, m):
        if self.txMode:
            raise preconditionFailed("cannot switch from tx to confirm mode")
        self.confirmMode = True
        self._reply(m, spec.ConfirmSelectOk())


class RequeueFeeder:
    """
    Hands a channel's unacked records (``tag -> (queue, entry, consumer,
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
