"""
The AMQP door onto a :class:`~otter_tx.broker.session.Session`: one open
channel.  A table maps each decoded channel method (AMQP 0-9-1 chapter 1
and RabbitMQ's extensions) to a small function that calls the Session and
sends the reply; publishes and the hot ``basic.ack`` come in through
:meth:`Channel.publishMessage` (basic.publish with its whole content, the
hot path), or :meth:`Channel.publishMethod` then
:meth:`Channel.publishContent` (the content arrived later), and
:meth:`Channel.ack`.  What the Session sends back goes through the
connection's :class:`~otter_tx.broker.interfaces.ISessionClient` calls.
The channel keeps nothing of the broker's semantics.

Errors are raised as :class:`~otter_tx.amqp.errors.AMQPError`; the
connection turns channel-level codes (403, 404, 405, 406) into
channel.close and the rest into connection.close, as RabbitMQ does.
"""

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from otter_tx.amqp import spec
from otter_tx.amqp.errors import AMQPError, notImplemented
from otter_tx.broker.publish import publishTarget
from otter_tx.broker.session import Session


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


def _then(result, fn):
    """``fn(result)`` now, or when ``result`` (a Deferred: a cluster's answer) fires."""
    if isinstance(result, Deferred):
        return result.addCallback(fn)
    fn(result)
    return None


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
    return _then(q, lambda q: _reply(ch, m, spec.QueueDeclareOk(q.name, q.readyCount, q.consumerCount)))


def _queueBind(ch, m):
    ch.session.bindQueue(m.queue, m.exchange, m.routing_key, m.arguments)
    _reply(ch, m, spec.QueueBindOk())


def _queueUnbind(ch, m):
    ch.session.unbindQueue(m.queue, m.exchange, m.routing_key, m.arguments)
    ch.connection.sendMethod(ch.number, spec.QueueUnbindOk())


def _queuePurge(ch, m):
    n = ch.session.purgeQueue(m.queue)
    return _then(n, lambda n: _reply(ch, m, spec.QueuePurgeOk(n)))


def _queueDelete(ch, m):
    # RabbitMQ answers delete-ok before this connection's consumers of the
    # queue see basic.cancel: the connection holds those until the reply is out
    conn = ch.connection
    conn.holdCancels()
    later = False
    try:
        n = ch.session.deleteQueue(m.queue, m.if_unused, m.if_empty)
        if isinstance(n, Deferred):
            # a queue on another node: the cancels wait for the reply too
            later = True

            def done(result):
                if not isinstance(result, Failure):
                    _reply(ch, m, spec.QueueDeleteOk(result or 0))
                conn.releaseCancels()
                return result

            return n.addBoth(done)
        _reply(ch, m, spec.QueueDeleteOk(n or 0))
    finally:
        if not later:
            conn.releaseCancels()


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

    tag = ch.session.consume(m.queue, m.consumer_tag, m.no_ack, m.exclusive, m.arguments, consumeOk)
    if isinstance(tag, Deferred):
        # a queue on another node: the door waits for its home node's answer
        return tag


def _basicCancel(ch, m):
    ch.session.cancel(m.consumer_tag)
    _reply(ch, m, spec.BasicCancelOk(m.consumer_tag))


def _basicGet(ch, m):
    got = ch.session.get(m.queue, m.no_ack)
    if isinstance(got, Deferred):
        return got.addCallback(lambda got: _getOk(ch, got))
    _getOk(ch, got)


def _getOk(ch, got):
    if got is None:
        ch.connection.sendMethod(ch.number, spec.BasicGetEmpty(""))
        return
    tag, entry, q = got
    ch.connection.sendGetOk(ch.number, tag, entry.redelivered, q.deliveredMessage(entry, get=True), q.readyCount)


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
        connection.broker.counters.channelsOpened += 1

    # --- the door (inbound) ----------------------------------------------------------

    def method(self, m):
        """A decoded channel method (not open/close/close-ok/publish/ack); may raise AMQPError."""
        cls = m.__class__
        handler = HANDLERS.get(cls)
        if handler is None:
            raise AMQPError(spec.COMMAND_INVALID, "%s not allowed on a channel" % (cls.NAME,), cls)
        try:
            result = handler(self, m)
        except AMQPError as e:
            if e.method is None:
                e.method = cls
            raise
        if result is not None:
            # the answer comes later (a cluster's metadata or another node):
            # the connection reads nothing more until it is sent
            def named(f):
                if f.check(AMQPError) and f.value.method is None:
                    f.value.method = cls
                return f

            return result.addErrback(named)
        return None

    def publishMethod(self, exchange, routingKey, mandatory, address):
        """
        basic.publish's method frame alone (its content is not all here
        yet): the checks that need no content (write permission, 404,
        internal exchange 403); :meth:`publishContent` follows.
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

    def publishContent(self, propsRaw, body):
        """
        The content of the publish begun by :meth:`publishMethod` is
        complete: publish it through the Session.
        """
        ex, routingKey, mandatory, address = self._target
        self._target = None
        try:
            self.session.publish(ex, routingKey, mandatory, propsRaw, body, address)
        except AMQPError as e:
            e.method = spec.BasicPublish
            raise

    def publishMessage(self, exchange, routingKey, mandatory, address, propsRaw, body):
        """
        basic.publish and its whole content at once (the hot path): the
        checks of :meth:`publishMethod`, then the Session's publish as in
        :meth:`publishContent`.
        """
        session = self.session
        try:
            ex = publishTarget(session.vhost, session.access, exchange)
            session.publish(ex, routingKey, mandatory, propsRaw, body, address)
        except AMQPError as e:
            e.method = spec.BasicPublish
            raise
        conn = self.connection
        if conn.blocked:
            conn.publishedWhileBlocked()

    def ack(self, deliveryTag, multiple):
        """basic.ack (the hot path)."""
        try:
            self.session.ack(deliveryTag, multiple)
        except AMQPError as e:
            e.method = spec.BasicAck
            raise

    def closed(self):
        """The channel is finished: cancel consumers, requeue unacked.  Idempotent."""
        self._target = None
        s = self.session
        if not s.closed:  # set by Session.close() only: the first call counts
            s.counters.channelsClosed += 1
        s.close()

    # --- what the management API and the bench read (the session's state) ------------

    unacked = _fromSession("unacked", "The ledger: delivery tag -> (queue, entry, consumer, tag).")
    unackedCount = _fromSession("unackedCount", "Deliveries not yet acknowledged (int).")
    consumers = _fromSession("consumers", "Consumer tag -> Consumer.")
    prefetchCount = _fromSession("prefetchCount", "basic.qos per-consumer prefetch (int).")
    globalPrefetch = _fromSession("globalPrefetch", "basic.qos global prefetch (int).")
    deliveryTag = _fromSession("deliveryTag", "The last delivery tag used (int).")
    publishSeq = _fromSession("publishSeq", "The last publish sequence number in confirm mode (int).")
