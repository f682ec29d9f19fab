"""
The AMQP door onto a :class:`~otter_tx.broker.session.Session`: one open
channel.  A table maps each decoded channel method (AMQP 0-9-1 chapter 1
and RabbitMQ's extensions) to a small function that calls the Session and
sends the reply; publishes, content and the hot ``basic.ack`` come in
through :meth:`Channel.publish`, :meth:`Channel.content` and
:meth:`Channel.ack`.  The channel keeps nothing of the broker's semantics.

Errors are raised as :class:`~otter_tx.amqp.errors.AMQPError`; the
connection turns channel-level codes (403, 404, 405, 406) into
channel.close and the rest into connection.close, as RabbitMQ does.
"""

import struct

from twisted.logger import Logger

from otter_tx.amqp import spec
from otter_tx.amqp.codec import FrameSyntaxError
from otter_tx.amqp.errors import (
    AMQPError,
    loggable,
    notImplemented,
    replyText,
)
from otter_tx.broker.publish import publishTarget
from otter_tx.broker.session import Session

log = Logger()

_unpack_HH = struct.Struct("!HH").unpack_from
_unpack_HHQ = struct.Struct("!HHQ").unpack_from
_unpack_Q = struct.Struct("!Q").unpack_from


def _checkShortStrings(cls, m):
    """
    A method's short strings must be UTF-8, as RabbitMQ checks them in
    every method but basic.publish: 501 "FRAME_ERROR - Malformed UTF-8 in
    shortstr", a connection error with class and method 0 (checked on
    RabbitMQ 3.10 for queue.declare/bind/purge/delete, exchange.declare/
    delete, basic.consume/get).  The codec decodes undecodable bytes to
    lone surrogates, so such names never reach a queue, an exchange or the
    store.
    """
    for name, t in zip(cls.FIELDS, cls.TYPES):
        if t == "s":
            value = getattr(m, name)
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise AMQPError(spec.FRAME_ERROR, "Malformed UTF-8 in shortstr") from None


# --- the method table: one small function per method ------------------------------


def _reply(ch, m, reply):
    if not getattr(m, "nowait", False):
        ch.connection.sendMethod(ch.number, reply)


def _channelFlow(ch, m):
    if not m.active:
        raise notImplemented("active=false")
    ch.connection.sendMethod(ch.number, spec.ChannelFlowOk(True))


def _ignore(ch, m):
    pass


def _exchangeDeclare(ch, m):
    ch.session.declareExchange(m.exchange, m.type, m.passive, m.durable, m.auto_delete, m.internal,
                               m.arguments)
    _reply(ch, m, spec.ExchangeDeclareOk())


def _exchangeDelete(ch, m):
    ch.session.deleteExchange(m.exchange, m.if_unused)
    _reply(ch, m, spec.ExchangeDeleteOk())


def _exchangeBind(ch, m):
    ch.session.bindExchange(m.destination, m.source, m.routing_key, m.arguments)
    _reply(ch, m, spec.ExchangeBindOk())


def _exchangeUnbind(ch, m):
    ch.session.unbindExchange(m.destination, m.source, m.routing_key, m.arguments)
    _reply(ch, m, spec.ExchangeUnbindOk())


def _queueDeclare(ch, m):
    q = ch.session.declareQueue(m.queue, m.passive, m.durable, m.exclusive, m.auto_delete, m.arguments)
    _reply(ch, m, spec.QueueDeclareOk(q.name, q.readyCount, q.consumerCount))


def _queueBind(ch, m):
    ch.session.bindQueue(m.queue, m.exchange, m.routing_key, m.arguments)
    _reply(ch, m, spec.QueueBindOk())


def _queueUnbind(ch, m):
    ch.session.unbindQueue(m.queue, m.exchange, m.routing_key, m.arguments)
    ch.connection.sendMethod(ch.number, spec.QueueUnbindOk())


def _queuePurge(ch, m):
    n = ch.session.purgeQueue(m.queue)
    _reply(ch, m, spec.QueuePurgeOk(n))


def _queueDelete(ch, m):
    # RabbitMQ answers delete-ok before this connection's consumers of the
    # queue see basic.cancel: hold those until the reply is out
    conn = ch.connection
    conn.heldCancels = held = []
    try:
        n = ch.session.deleteQueue(m.queue, m.if_unused, m.if_empty)
    finally:
        conn.heldCancels = None
    _reply(ch, m, spec.QueueDeleteOk(n or 0))
    for number, tag in held:
        conn.sendMethod(number, spec.BasicCancel(tag, True))


def _basicQos(ch, m):
    if m.prefetch_size != 0:
        raise notImplemented("prefetch_size!=0 (%d)" % (m.prefetch_size,))
    if m.global_:
        ch.connection.sendMethod(ch.number, spec.BasicQosOk())
        ch.session.qos(m.prefetch_count, True)
    else:
        ch.session.qos(m.prefetch_count, False)
        ch.connection.sendMethod(ch.number, spec.BasicQosOk())


def _basicConsume(ch, m):
    def consumeOk(tag):
        if not m.nowait:
            ch.connection.sendMethod(ch.number, spec.BasicConsumeOk(tag))

    ch.session.consume(m.queue, m.consumer_tag, m.no_ack, m.exclusive, m.arguments, consumeOk)


def _basicCancel(ch, m):
    ch.session.cancel(m.consumer_tag)
    _reply(ch, m, spec.BasicCancelOk(m.consumer_tag))


def _basicGet(ch, m):
    got = ch.session.get(m.queue, m.no_ack)
    if got is None:
        ch.connection.sendMethod(ch.number, spec.BasicGetEmpty(""))
        return
    tag, entry, q = got
    ch.connection.sendGetOk(ch.number, tag, entry.redelivered, entry.message, q.readyCount)


def _basicReject(ch, m):
    ch.session.reject(m.delivery_tag, m.requeue)


def _basicNack(ch, m):
    ch.session.nack(m.delivery_tag, m.multiple, m.requeue)


def _basicRecover(ch, m):
    ch.session.recover(m.requeue)
    ch.connection.sendMethod(ch.number, spec.BasicRecoverOk())


def _basicRecoverAsync(ch, m):
    ch.session.recover(m.requeue)


def _txSelect(ch, m):
    ch.session.txSelect()
    ch.connection.sendMethod(ch.number, spec.TxSelectOk())


def _txCommit(ch, m):
    ch.session.txCommit(lambda: ch.connection.sendMethod(ch.number, spec.TxCommitOk()))


def _txRollback(ch, m):
    ch.session.txRollback()
    ch.connection.sendMethod(ch.number, spec.TxRollbackOk())


def _confirmSelect(ch, m):
    ch.session.confirmSelect()
    _reply(ch, m, spec.ConfirmSelectOk())


#: the channel methods the wire answers itself (the shim below, until the engine lands)
_CHANNEL_CLASS = (spec.ChannelOpen, spec.ChannelClose, spec.ChannelCloseOk)

#: spec.Method class -> function(channel, method): every channel method the
#: door takes through :meth:`Channel.method`
HANDLERS = {
    spec.ChannelFlow: _channelFlow,
    spec.ChannelFlowOk: _ignore,
    spec.ExchangeDeclare: _exchangeDeclare,
    spec.ExchangeDelete: _exchangeDelete,
    spec.ExchangeBind: _exchangeBind,
    spec.ExchangeUnbind: _exchangeUnbind,
    spec.QueueDeclare: _queueDeclare,
    spec.QueueBind: _queueBind,
    spec.QueueUnbind: _queueUnbind,
    spec.QueuePurge: _queuePurge,
    spec.QueueDelete: _queueDelete,
    spec.BasicQos: _basicQos,
    spec.BasicConsume: _basicConsume,
    spec.BasicCancel: _basicCancel,
    spec.BasicGet: _basicGet,
    spec.BasicReject: _basicReject,
    spec.BasicNack: _basicNack,
    spec.BasicRecover: _basicRecover,
    spec.BasicRecoverAsync: _basicRecoverAsync,
    spec.TxSelect: _txSelect,
    spec.TxCommit: _txCommit,
    spec.TxRollback: _txRollback,
    spec.ConfirmSelect: _confirmSelect,
}


def _fromSession(name, doc):
    """A read-only property showing the session's attribute ``name``."""
    return property(lambda self: getattr(self.session, name), doc=doc)


class Channel:
    """
    One open AMQP channel: the door between the wire (protocol.py) and its
    :class:`~otter_tx.broker.session.Session`.

    :ivar number: the channel number.  :ivar connection: the protocol.
    :ivar session: the Session.
    """

    def __init__(self, connection, number):
        self.connection = connection
        self.number = number
        self.session = Session(connection.broker, connection, connection.vhost, connection.user, number)
        self._target = None  # (exchange, routingKey, mandatory, address) of the publish in flight
        self._pending = None  # wire shim: the publish whose content is assembled
        self._header = None
        self._bodyParts = None
        self._bodySize = 0
        self._bodyRemaining = 0

    # --- the door (inbound) ----------------------------------------------------------

    def method(self, m):
        """A decoded channel method (not open/close/close-ok/publish/ack); may raise AMQPError."""
        cls = m.__class__
        handler = HANDLERS.get(cls)
        if handler is None:
            raise AMQPError(spec.COMMAND_INVALID, "%s not allowed on a channel" % (cls.NAME,), cls)
        try:
            handler(self, m)
        except AMQPError as e:
            if e.method is None:
                e.method = cls
            raise

    def publish(self, exchange, routingKey, mandatory, address):
        """
        basic.publish's method frame: the checks that need no content
        (write permission, 404, internal exchange 403); the content follows.
        """
        session = self.session
        try:
            ex = publishTarget(session.vhost, session.access, exchange)
        except AMQPError as e:
            e.method = spec.BasicPublish
            raise
        self._target = (ex, routingKey, mandatory, address)
        conn = self.connection
        if conn.blocked:
            conn.publishedWhileBlocked()

    def content(self, propsRaw, body):
        """The content of the publish in flight is complete: publish it through the Session."""
        ex, routingKey, mandatory, address = self._target
        self._target = None
        try:
            self.session.publish(ex, routingKey, mandatory, propsRaw, body, address)
        except AMQPError as e:
            e.method = spec.BasicPublish
            raise

    def ack(self, deliveryTag, multiple):
        """basic.ack (the hot path)."""
        try:
            self.session.ack(deliveryTag, multiple)
        except AMQPError as e:
            e.method = spec.BasicAck
            raise

    def closed(self):
        """The channel is finished: cancel consumers, requeue unacked.  Idempotent."""
        self._target = self._pending = self._header = self._bodyParts = None
        self.session.closed()

    # --- what the management API and the bench read (the session's state) ------------

    closing = _fromSession("closing", "True once the channel is closing or closed.")
    unacked = _fromSession("unacked", "The ledger: delivery tag -> (queue, entry, consumer, tag).")
    unackedCount = _fromSession("unackedCount", "Deliveries not yet acknowledged (int).")
    consumers = _fromSession("consumers", "Consumer tag -> Consumer.")
    confirmMode = _fromSession("confirmMode", "True after confirm.select.")
    txMode = _fromSession("txMode", "True after tx.select.")
    prefetchCount = _fromSession("prefetchCount", "basic.qos per-consumer prefetch (int).")
    globalPrefetch = _fromSession("globalPrefetch", "basic.qos global prefetch (int).")
    deliveryTag = _fromSession("deliveryTag", "The last delivery tag used (int).")
    publishSeq = _fromSession("publishSeq", "The last publish sequence number in confirm mode (int).")

    # --- wire shim: deleted when the wire engine lands ---------------------------------
    # protocol.py still hands raw frame payloads to the channel; this is
    # today's decode and content assembly, calling the door above.

    def flushConfirms(self):
        """Send the pending publisher confirms (see Session.flushConfirms)."""
        self.session.flushConfirms()

    def resumeDelivery(self):
        """Consumers may have room again."""
        self.session.resumeDelivery()

    def checkAckTimeout(self, limit, timeoutMs):
        """See Session.checkAckTimeout."""
        self.session.checkAckTimeout(limit, timeoutMs)

    def cleanup(self):
        """Release everything this channel holds (see :meth:`closed`)."""
        self.closed()

    def closeWithError(self, error):
        """
        Close this channel for a channel-level ``error`` (AMQPError): send
        channel.close and ignore everything until close-ok.
        """
        if self.session.closing:
            return
        m = error.method
        log.info(
            "closing channel {ch} of {peer}: {code} {text}",
            ch=self.number, peer=self.connection.name, code=error.code,
            text=loggable(replyText(error.text)),
        )
        self.closed()
        self.connection.sendMethod(
            self.number,
            spec.ChannelClose(
                error.code,
                replyText(error.text),
                m.CLASS_ID if m is not None else 0,
                m.METHOD_ID if m is not None else 0,
            ),
        )

    def methodFrame(self, payload):
        """Handle a method frame payload for this channel."""
        classId, methodId = _unpack_HH(payload, 0)
        if self.session.closing:
            # we sent channel.close: only close-ok ends it; a crossing
            # channel.close from the client is answered but the channel stays
            # until our close is acknowledged (rabbit_reader, closing channel)
            if classId == 20:
                if methodId == 41:
                    self.connection.channelClosed(self.number)
                elif methodId == 40:
                    self.connection.sendMethod(self.number, spec.ChannelCloseOk())
            return
        if self._pending is not None:
            self._unexpectedInContent("content header" if self._header is None else "content body")
        if classId == 60:
            if methodId == 40:
                return self._basicPublish(payload)
            if methodId == 80:
                # basic.ack is delivery-tag (8 octets) and the bits octet
                if len(payload) != 13:
                    raise FrameSyntaxError("basic.ack of %d octets" % (len(payload) - 4,))
                return self.ack(_unpack_Q(payload, 4)[0], bool(payload[12] & 1))
        cls = spec.METHODS.get((classId, methodId))
        if cls is None:
            raise AMQPError(
                spec.COMMAND_INVALID, "unknown method class %d method %d" % (classId, methodId)
            )
        if cls not in HANDLERS and cls not in _CHANNEL_CLASS:
            raise AMQPError(spec.COMMAND_INVALID, "%s not allowed on a channel" % (cls.NAME,), cls)
        m = cls.decode(payload, 4)
        if "s" in cls.TYPES:
            _checkShortStrings(cls, m)
        if cls is spec.ChannelClose:
            self.closed()
            self.connection.sendMethod(self.number, spec.ChannelCloseOk())
            self.connection.channelClosed(self.number)
        elif cls is spec.ChannelOpen:
            raise AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen", cls)
        elif cls is not spec.ChannelCloseOk:
            self.method(m)

    def _unexpectedInContent(self, expected):
        """
        505 for a frame of the wrong kind while basic.publish's content is
        being assembled, with rabbit_command_assembler's text.
        """
        raise AMQPError(
            spec.UNEXPECTED_FRAME,
            "expected %s for class 60, got non %s frame instead" % (expected, expected)
            if expected == "content header"
            else "expected content body, got non content body frame instead",
            spec.BasicPublish,
        )

    def headerFrame(self, payload):
        """
        Handle a content-header frame (``payload`` of at least 14 octets,
        checked by the connection).

        Errors: 505 UNEXPECTED_FRAME when no basic.publish awaits its header
        or its body is being read, or for a class other than 60 (RabbitMQ's
        texts); 406 PRECONDITION_FAILED (channel) ``message size N is larger
        than configured max size M`` when the body size exceeds the
        connection's ``maxMessageSize`` (RabbitMQ's ``max_message_size``,
        rabbit_channel ``check_msg_size/3``), answered at the header.
        """
        if self.session.closing:
            return
        if self._pending is None:
            raise AMQPError(
                spec.UNEXPECTED_FRAME,
                "expected method frame, got non method frame instead",
            )
        if self._header is not None:
            self._unexpectedInContent("content body")
        classId, _, size = _unpack_HHQ(payload, 0)
        if classId != 60:
            raise AMQPError(
                spec.UNEXPECTED_FRAME,
                "expected content header for class 60, got one for class %d instead" % (classId,),
                spec.BasicPublish,
            )
        maxSize = self.connection.maxMessageSize
        if size > maxSize:
            self._pending = None
            raise AMQPError(
                spec.PRECONDITION_FAILED,
                "message size %d is larger than configured max size %d" % (size, maxSize),
                spec.BasicPublish,
            )
        self._header = payload[12:]
        self._bodySize = size
        if size == 0:
            self._completePublish(b"")
        else:
            self._bodyParts = []
            self._bodyRemaining = size

    def bodyFrame(self, payload):
        """
        Handle a content-body frame.  505 UNEXPECTED_FRAME when no content
        header came first; 501 FRAME_ERROR for more octets than the header
        announced.
        """
        if self.session.closing:
            return
        if self._header is None:
            if self._pending is not None:
                self._unexpectedInContent("content header")
            raise AMQPError(
                spec.UNEXPECTED_FRAME,
                "expected method frame, got non method frame instead",
            )
        self._bodyRemaining -= len(payload)
        if self._bodyRemaining < 0:
            raise AMQPError(spec.FRAME_ERROR, "content body larger than the size in its header")
        if self._bodyRemaining == 0 and not self._bodyParts:
            self._completePublish(payload)
            return
        self._bodyParts.append(payload)
        if self._bodyRemaining == 0:
            body = b"".join(self._bodyParts)
            self._bodyParts = None
            self._completePublish(body)

    def _completePublish(self, body):
        propsRaw = self._header
        self._pending = self._header = None
        self.content(propsRaw, body)

    def _basicPublish(self, payload):
        # hot path: decode basic.publish by hand (reserved short, exchange
        # shortstr, routing-key shortstr, bits mandatory/immediate)
        try:
            n = payload[6]
            exchange = payload[7 : 7 + n].decode("utf-8", "surrogateescape")
            off = 7 + n
            k = payload[off]
            routingKey = payload[off + 1 : off + 1 + k].decode("utf-8", "surrogateescape")
            bits = payload[off + 1 + k]
        except IndexError:
            raise FrameSyntaxError("truncated basic.publish")
        if len(payload) != off + 2 + k:
            raise FrameSyntaxError("octets after the basic.publish arguments")
        if bits & 2:
            raise AMQPError(spec.NOT_IMPLEMENTED, "immediate=true", spec.BasicPublish)
        # exchange and routing key as the short strings deliveries repeat
        self.publish(exchange, routingKey, bool(bits & 1), payload[6 : off + 1 + k])
        self._pending = True
        self._header = None
