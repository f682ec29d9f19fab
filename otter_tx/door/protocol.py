"""
The AMQP 0-9-1 server connection: thin Twisted glue over the sans-IO wire
engine (:class:`otter_tx.amqp.engine.ConnectionEngine` in the server role).

Bytes from the transport go into the engine; its events go to the broker
(authentication and vhost access at start-ok / open) and to the door of
each channel (:class:`otter_tx.door.channel.Channel`: ``method``,
``publishMessage``, ``publishMethod``, ``publishContent``, ``ack``,
``closed``).  What the Sessions send back arrives through this
connection's :class:`~otter_tx.broker.interfaces.ISessionClient` calls
(``delivered``, ``returned``, ``confirmed``, ``consumerCancelled``,
``channelFailed``, ``connectionFailed``) and the channel doors' replies
through ``sendMethod`` / ``sendGetOk``; all go out through the engine's
encoders.  This module owns what
needs Twisted: the transport and ``IPushProducer`` back-pressure, the
fairness slices, write batching (per chunk and across connections), the
eager socket write, the timers on the injected clock (handshake timeout,
the engine's heartbeat deadlines, the closing delays), resource-alarm read
pausing and the log lines.  Errors follow RabbitMQ ``rabbit_reader.erl``;
the engine raises them, this module closes the channel (4xx) or the
connection (the rest).
"""

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IHalfCloseableProtocol, IPushProducer, ISSLTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.tcp import Connection as _TCPConnection
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from otter_tx import __version__
from otter_tx.amqp import engine as _engine
from otter_tx.amqp import spec
from otter_tx.amqp.codec import FrameSyntaxError
from otter_tx.amqp.engine import ACK, CONTENT, MECHANISMS, MESSAGE, METHOD, PUBLISH, ConnectionEngine, saslCredentials
from otter_tx.amqp.errors import AMQPError, erlBinary, loggable, replyText
from otter_tx.amqp.frames import HEARTBEAT_FRAME, frame, methodFrame  # noqa: F401 (re-exported)
from otter_tx.broker.access import LOOPBACK_ONLY, certificateLogin, login
from otter_tx.broker.interfaces import IClientConnection, IConnectionInfo, ISessionClient
from otter_tx.door.channel import Channel
from otter_tx.door.tls import CertificateLogin, certificateInfo, peerCertificate
from otter_tx.door.writer import EagerWriter

__all__ = ["AMQPServerFactory", "AMQPServerProtocol", "HEARTBEAT_FRAME", "frame", "methodFrame"]

log = Logger()

#: frames handled per read before yielding to the reactor (publisher
#: fairness), counted by engine events: a whole message (MESSAGE) counts
#: three, any other event one
FRAMES_PER_SLICE = 300

#: seconds a closed connection's socket is kept for the client to close it
#: (RabbitMQ's ?CLOSING_TIMEOUT; the heartbeat interval when shorter)
CLOSING_TIMEOUT = 30

#: seconds between the client's connection.close and our close-ok.  RabbitMQ
#: answers only after its channel processes have stopped (1-4 ms on the
#: reference peer); aio-pika 10.2.1's robust connection loses a race against
#: an immediate answer (its test_create_channels_during_reconnect fails), so
#: the answer waits this long on the clock.
CLOSE_OK_DELAY = 0.002

#: seconds before the socket of a connection whose handshake failed is dropped
#: (RabbitMQ's ?SILENT_CLOSE_DELAY)
SILENT_CLOSE_DELAY = 3

#: RabbitMQ's default ``max_message_size``: 128 MiB in bytes (rabbit.app.src)
DEFAULT_MAX_MESSAGE_SIZE = _engine.DEFAULT_MAX_MESSAGE_SIZE

#: RabbitMQ's ceiling on ``max_message_size``: 512 MiB in bytes (?MAX_MSG_SIZE)
MAX_MESSAGE_SIZE_LIMIT = 536870912


#: capabilities we really implement (RabbitMQ names, rabbit_reader:server_capabilities/1)
SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


#: engine events whose second item is a channel number
_CHANNEL_EVENTS = frozenset([
    _engine.CHANNEL_OPEN, _engine.CHANNEL_CLOSE, _engine.CHANNEL_CLOSED, METHOD, MESSAGE, PUBLISH, CONTENT, ACK,
])

#: bytes batched for one connection within one reactor turn above which its
#: consumers stop taking messages until the batch is written (see ``send``);
#: the transport's own buffer pauses them at Twisted's ``bufferSize``
WRITE_HIGH_WATER = 256 * 1024


#: connection.start's (and the stream protocol's peer_properties') copyright and information
COPYRIGHT = "Copyright (c) otter_tx contributors"
INFORMATION = "Licensed under the MIT license. See https://github.com/otter-tx"


@implementer(IPushProducer, IHalfCloseableProtocol, IClientConnection, IConnectionInfo, ISessionClient)
class AMQPServerProtocol(Protocol):
    """
    One client connection.

    :ivar vhost: the opened :class:`~otter_tx.broker.vhost.VHost` or None.
    :ivar user: the authenticated :class:`~otter_tx.broker.broker.User`.
    :ivar engine: the :class:`~otter_tx.amqp.engine.ConnectionEngine` (server role).
    :ivar frameMax: negotiated frame_max in bytes.
    :ivar exclusiveQueues: queues this connection owns (deleted on close).
    :ivar paused: True while the transport asked us to stop producing, or
        while more than :data:`WRITE_HIGH_WATER` bytes are batched for this
        connection in the current reactor turn (consumers on this
        connection take no more messages; RabbitMQ bounds the same with
        credit flow, https://www.rabbitmq.com/docs/flow-control).
    """

    def __init__(self, factory):
        self.factory = factory
        self.broker = factory.broker
        self.clock = factory.clock
        self.engine = ConnectionEngine(
            _engine.SERVER, frameMax=factory.frameMax, channelMax=factory.channelMax,
            heartbeat=factory.heartbeat, maxMessageSize=factory.maxMessageSize,
        )
        self.channels = {}
        self.vhost = None
        self.user = None
        self.exclusiveQueues = set()
        self.clientProperties = {}
        self.capabilities = {}
        #: the verified client certificate (cryptography x509.Certificate) seen
        #: at connection.start, or None; it offers SASL EXTERNAL
        self.peerCertificate = None
        #: what /api/connections shows of it (otter_tx.door.tls.certificateInfo)
        self.peerCertificateInfo = certificateInfo(None)
        #: the SASL mechanism the client logged in with (str), once it has
        self.authMechanism = None
        self.paused = False
        self._transportPaused = False
        self._batchFull = False
        self._outBytes = 0
        self._resumeCall = None
        self.blocked = False
        self._readPaused = False
        self._heartbeatTimer = None
        self._handshakeTimer = None
        self._sent = False
        self._out = None
        self._confirming = set()
        self._closeTimer = None
        self.connectedAt = 0.0
        self.peer = None
        self.local = None
        self.name = ""
        self.bytesIn = 0
        self.bytesOut = 0
        #: reads and writes of the socket (RabbitMQ's recv_cnt / send_cnt)
        self.recvCount = 0
        self.sendCount = 0
        #: while a queue.delete of this connection runs: [(channel, consumer
        #: tag)] of basic.cancel to send after its delete-ok (holdCancels)
        self._heldCancels = None
        self._closedWaiters = []  # whenClosed() Deferreds; None once closed

    # --- transport events ---------------------------------------------------

    def connectionMade(self):
        """Set TCP_NODELAY, register as the transport's push producer, arm the handshake timeout."""
        # RabbitMQ sets TCP_NODELAY (tcp_listen_options nodelay=true); without
        # it Nagle plus delayed ACKs stall small deliveries by ~40 ms
        setNoDelay = getattr(self.transport, "setTcpNoDelay", None)
        if setNoDelay is not None:
            try:
                setNoDelay(True)
            except OSError:
                pass
        if isinstance(self.transport, _TCPConnection):
            # plain TCP (not TLS): write straight to the socket when the
            # transport holds nothing of ours (otter_tx.door.writer)
            writer = EagerWriter(self.transport, self)
            self._write = writer.write
            self._loseConnection = writer.loseConnection
        else:
            # TLS and the rest: through the transport (the methods below)
            self.transport.registerProducer(self, True)
        self.connectedAt = self.clock.seconds()
        peer = self.transport.getPeer()
        self.peer = peer
        local = self.transport.getHost()
        self.local = local
        # RabbitMQ's connection name, used in every log line about it
        self.name = "%s:%s -> %s:%s" % (
            getattr(peer, "host", "?"), getattr(peer, "port", 0),
            getattr(local, "host", "?"), getattr(local, "port", 0),
        )
        log.info("accepting AMQP connection {name}", name=self.name)
        self.engine.lastReceived = self.clock.seconds()
        if self.factory.handshakeTimeout:
            self._handshakeTimer = self.clock.callLater(
                self.factory.handshakeTimeout, self._handshakeTimedOut
            )
        self.broker.connections.add(self)
        self.broker.counters.connectionsOpened += 1

    def connectionLost(self, reason=None):
        """Release channels (requeue unacked), delete exclusive queues, stop timers."""
        if self.engine.state not in (_engine.CLOSING, _engine.CLOSED):
            if reason is not None and reason.check("OpenSSL.SSL.Error"):
                log.warn(
                    "closing AMQP connection {name}{who}: TLS handshake failed: {why}",
                    name=self.name, who=self._who(), why=reason.getErrorMessage(),
                )
            else:
                log.warn(
                    "closing AMQP connection {name}{who}: client unexpectedly closed TCP connection",
                    name=self.name, who=self._who(),
                )
        self._dropped = True
        self.engine.connectionLost()
        self._cancelTimers()
        if self in self.broker.connections:
            self.broker.connections.discard(self)
            self.broker.counters.connectionsClosed += 1
            if self.vhost is not None:
                # its vhost's recv_oct / send_oct keep them (RabbitMQ's vhost stats do)
                self.vhost.closedBytes[0] += self.bytesIn
                self.vhost.closedBytes[1] += self.bytesOut
        self._release()
        waiters, self._closedWaiters = self._closedWaiters, None
        for d in waiters:
            d.callback(None)

    def whenClosed(self):
        """A Deferred firing (with None) once the socket is gone."""
        if self._closedWaiters is None:
            return succeed(None)
        d = Deferred()
        self._closedWaiters.append(d)
        return d

    def _who(self):
        """`` (vhost: '/', user: 'guest')`` for log lines, once known."""
        if self.user is None:
            return ""
        if self.vhost is None:
            return " (user: '%s')" % (loggable(self.user.name),)
        return " (vhost: '%s', user: '%s')" % (loggable(self.vhost.name), loggable(self.user.name))

    def _release(self):
        """
        Give back what the connection holds: close its channels (requeueing
        unacked messages) and delete its exclusive queues.  RabbitMQ does
        this when the connection closes (rabbit_reader:close_connection), not
        when the socket goes, so another connection can redeclare an
        exclusive queue as soon as it has seen close-ok.  Idempotent.
        """
        channels, self.channels = self.channels, {}
        for ch in channels.values():
            ch.closed()
        if self.vhost is not None:
            self.vhost.connectionClosed(self)
        self.exclusiveQueues.clear()

    def _cancelTimers(self):
        for name in ("_heartbeatTimer", "_handshakeTimer", "_closeTimer", "_resumeCall"):
            t = getattr(self, name)
            if t is not None:
                if t.active():
                    t.cancel()
                setattr(self, name, None)

    def _handshakeTimedOut(self):
        self._handshakeTimer = None
        if self.engine.state not in (_engine.OPEN, _engine.CLOSING, _engine.CLOSED):
            log.info("closing {peer}: handshake timeout", peer=self.name)
            self.transport.abortConnection()

    # --- IPushProducer (the transport's write buffer is full / drained) -----

    def pauseProducing(self):
        """
        The socket's write buffer is over Twisted's ``bufferSize`` (64 KiB;
        on plain TCP the :class:`~otter_tx.door.writer.EagerWriter` says so
        for the transport): consumers here take no more messages until it
        drains.
        """
        self._transportPaused = True
        self.paused = True

    def resumeProducing(self):
        """The write buffer drained: let this connection's consumers take messages again."""
        self._transportPaused = False
        if self._batchFull or self.engine.state is _engine.CLOSED:
            return
        self.paused = False
        for ch in list(self.channels.values()):
            ch.session.resumeDelivery()

    def stopProducing(self):
        """The transport is going away."""
        self._transportPaused = True
        self.paused = True

    def _batchIsFull(self):
        """
        More than :data:`WRITE_HIGH_WATER` bytes are batched in ``_out``:
        this connection's consumers stop taking until the batch is written
        and the socket has taken it (:meth:`_afterBatch`).
        """
        self._batchFull = True
        self.paused = True

    def _afterBatch(self):
        """A turn after a full batch was written: resume unless the socket is backed up."""
        self._resumeCall = None
        if not self._transportPaused:
            self.resumeProducing()

    # --- output ---------------------------------------------------------------

    def send(self, data):
        """
        Write bytes; batched while a received chunk is being processed.
        """
        self._sent = True
        out = self._out
        if out is not None:
            out.append(data)
            n = self._outBytes = self._outBytes + len(data)
            if n > WRITE_HIGH_WATER:
                self._batchIsFull()
        elif self.factory._batchDepth:
            # another connection's chunk is being processed (a delivery to
            # this consumer, say): join this connection's writes of the
            # whole chunk into one, flushed when that chunk is done
            self._out = [data]
            self.factory._dirty.append(self)
            self._outBytes = len(data)
            if self._outBytes > WRITE_HIGH_WATER:
                self._batchIsFull()
        else:
            self.bytesOut += len(data)
            self.sendCount += 1
            self._write(data)

    def _write(self, data):
        """
        Hand ``data`` to the transport; on plain TCP this is an
        :class:`~otter_tx.door.writer.EagerWriter`'s, which writes straight
        to the socket when the transport holds nothing of ours: Twisted's
        ``write`` only buffers and registers the socket for writability,
        so every reply cost another reactor turn and two ``epoll_ctl``
        calls (docs/performance.md).  Everything this connection writes
        goes through here, so bytes keep their order.
        """
        self.transport.write(data)

    def _loseConnection(self):
        """Close once what is buffered is written (on plain TCP the ``EagerWriter``'s)."""
        self.transport.loseConnection()

    def sendMethod(self, channel, method):
        """Send one method frame."""
        self.send(self.engine.method(channel, method))

    def delivered(self, number, consumer, deliveryTag, redelivered, message):
        """
        ``ISessionClient``: basic.deliver of ``message`` (a broker Message:
        its content header from ``message.contentHeader()``, the
        publisher's property bytes forwarded) to ``consumer`` (its
        ``tagBytes``: the tag as an encoded shortstr, length octet
        included) on channel ``number``.
        """
        self.send(self.engine.deliver(number, consumer.tagBytes, deliveryTag, redelivered,
                                      message.addressBytes(), message.contentHeader(), message.body))

    def sendGetOk(self, number, deliveryTag, redelivered, message, messageCount):
        """basic.get-ok of ``message`` on channel ``number``; ``messageCount``: messages left."""
        self.send(self.engine.getOk(number, deliveryTag, redelivered, message.addressBytes(), messageCount,
                                    message.contentHeader(), message.body))

    def returned(self, number, replyCode, replyText, message):
        """
        ``ISessionClient``: basic.return of ``message`` (to its exchange and
        routing key) on channel ``number``.
        """
        self.send(self.engine.basicReturn(number, replyCode, replyText, message.exchange, message.routingKey,
                                          message.contentHeader(), message.body))

    def confirmed(self, number, confirms):
        """
        ``ISessionClient``: publisher confirms on channel ``number``:
        ``confirms`` a list of ``(seq, ok)`` in seq order; runs of acks
        collapse into one ``basic.ack multiple=true``, a nack is
        ``multiple=false``.
        """
        self.send(self.engine.confirms(number, confirms))

    def consumerCancelled(self, number, consumerTag):
        """
        ``ISessionClient``: basic.cancel (no-wait) for ``consumerTag`` on
        channel ``number``, when the client advertised
        ``consumer_cancel_notify``; held while this connection's own
        queue.delete runs (:meth:`holdCancels`).
        """
        if not self.capabilities.get("consumer_cancel_notify"):
            return
        held = self._heldCancels
        if held is not None:
            held.append((number, consumerTag))
        else:
            self.sendMethod(number, spec.BasicCancel(consumerTag, True))

    def holdCancels(self):
        """
        A queue.delete of this connection begins: RabbitMQ answers
        delete-ok before this connection's consumers of the queue see
        basic.cancel, so :meth:`consumerCancelled` holds them until
        :meth:`releaseCancels` (the channel door calls both).
        """
        self._heldCancels = []

    def releaseCancels(self):
        """The queue.delete is answered: send the basic.cancel held since :meth:`holdCancels`."""
        held, self._heldCancels = self._heldCancels, None
        for number, tag in held or ():
            self.sendMethod(number, spec.BasicCancel(tag, True))

    def _flush(self):
        if self._confirming:
            for session in self._confirming:
                session.flushConfirms()
            self._confirming.clear()
        out = self._out
        self._out = None
        self._outBytes = 0
        if out:
            data = b"".join(out)
            self.bytesOut += len(data)
            self.sendCount += 1
            self._write(data)
        if self._batchFull:
            # resume on a later turn, once the reactor had a chance to
            # write; if the socket did not take it all, the transport has
            # paused us and resumes us when it drains
            self._batchFull = False
            if self._resumeCall is None and self.engine.state is not _engine.CLOSED:
                self._resumeCall = self.clock.callLater(0, self._afterBatch)

    _confirming = None

    def flushBatched(self):
        """Write what was batched for this connection while another connection's chunk was processed."""
        if self.engine.state is _engine.CLOSED:
            self._out = None
            self._outBytes = 0
        elif self._out is not None:
            self._flush()

    # --- input ------------------------------------------------------------------

    def dataReceived(self, data):
        """Hand received bytes to the engine and handle its events (see :meth:`_process`)."""
        engine = self.engine
        if engine.state is _engine.CLOSED:
            return
        self.bytesIn += len(data)
        self.recvCount += 1
        # the memory alarm reads RSS every so many received bytes, whichever door (Broker.received)
        self.broker.received(len(data))
        engine.receiveData(data, self.clock.seconds())
        if self._waiting is None:
            self._process()

    def _process(self):
        """
        Handle the engine's events for what is buffered, with this
        connection's writes (and other connections' writes caused by them)
        batched until the end.
        """
        if self._out is None:
            self._out = []
        if self._confirming is None:
            self._confirming = set()
        factory = self.factory
        factory._batchDepth += 1
        try:
            self._handleEvents()
        finally:
            factory._batchDepth -= 1
            if self.engine.state is not _engine.CLOSED:
                self._flush()
            else:
                self._out = None
            if not factory._batchDepth and factory._dirty:
                factory.flushDirty()

    def _handleEvents(self):
        engine = self.engine
        nextEvent = engine.nextEvent
        channels = self.channels
        budget = FRAMES_PER_SLICE
        closed = _engine.CLOSED
        while True:
            event = None
            try:
                event = nextEvent()
                if event is None:
                    return
                kind = event[0]
                # the hot path: a whole message, publish, its content, ack
                if kind is MESSAGE:
                    _, chno, exchange, routingKey, mandatory, address, propsRaw, body = event
                    channels[chno].publishMessage(exchange, routingKey, mandatory, address, propsRaw, body)
                    # three frames: a slice stays about FRAMES_PER_SLICE frames
                    budget -= 2
                elif kind is CONTENT:
                    _, chno, propsRaw, body = event
                    channels[chno].publishContent(propsRaw, body)
                elif kind is PUBLISH:
                    _, chno, exchange, routingKey, mandatory, address = event
                    channels[chno].publishMethod(exchange, routingKey, mandatory, address)
                elif kind is ACK:
                    _, chno, tag, multiple = event
                    channels[chno].ack(tag, multiple)
                elif kind is METHOD:
                    later = channels[event[1]].method(event[2])
                    if later is not None:
                        self._wait(later, event[1])
                        return
                else:
                    self._otherEvent(event)
            except AMQPError as e:
                chno = event[1] if event is not None and event[0] in _CHANNEL_EVENTS else e.channel
                if e.channelLevel and chno != 0 and chno in channels:
                    self.closeChannel(chno, e)
                else:
                    self._connectionError(e.code, e.text, e.method, detail=e.detail)
                    return
            except FrameSyntaxError as e:
                # a decoder below the engine (RabbitMQ: rabbit_misc:frame_error,
                # "cannot decode" and the method's arguments)
                method = type(event[2]) if event is not None and event[0] is METHOD else None
                args = event[2].encode()[4:] if method is not None else b""
                self._connectionError(
                    spec.FRAME_ERROR, "FRAME_ERROR - cannot decode %s" % (erlBinary(args),), method,
                    detail=str(e),
                )
                return
            except Exception:
                # a bug of ours: never let it take the reactor's connection
                # handling down silently; close this connection with 541
                log.failure("internal error handling a frame from {peer}", peer=self.name)
                self._connectionError(spec.INTERNAL_ERROR, "INTERNAL_ERROR - internal error")
                return
            if engine.state is closed:
                return
            if self._readPaused:
                # blocked by a resource alarm: stop after this publish
                return
            budget -= 1
            if budget <= 0 and engine.buffered():
                # fairness: let the reactor serve other connections (consumers
                # acking, say) before the rest of this publisher's bytes
                self._sliced = True
                self.transport.pauseProducing()
                self.clock.callLater(0, self._continueSlice)
                return

    _sliced = False
    #: the Deferred of a method answered later (a cluster's), or None
    _waiting = None
    _opened = False  # connection.open-ok was sent
    _dropped = False  # the socket is being dropped (_closeNow)

    def _otherEvent(self, event):
        """The engine's cold events: the handshake, closes, channel open and close."""
        kind = event[0]
        engine = self.engine
        if kind is _engine.CHANNEL_OPEN:
            chno = event[1]
            self.broker.checkUserChannelLimit(self.user.name)
            self.channels[chno] = Channel(self, chno)
            self.send(engine.channelOpenOk(chno))
        elif kind is _engine.CHANNEL_CLOSE:
            ch = self.channels.pop(event[1], None)
            if ch is not None:
                ch.closed()
            self.send(engine.channelCloseOk(event[1]))
        elif kind is _engine.CHANNEL_CLOSED:
            self.channels.pop(event[1], None)
        elif kind is _engine.SEND:
            self.send(event[1])
        elif kind is _engine.PROTOCOL_HEADER:
            self._sendStart()
        elif kind is _engine.BAD_HEADER:
            # AMQP 0-9-1 section 4.2.2: answer with our header and close
            self._dropped = True
            self._write(spec.PROTOCOL_HEADER)
            self._loseConnection()
        elif kind is _engine.START_OK:
            self._startOk(event[1])
        elif kind is _engine.TUNE_OK:
            self._tuneOk(event[1])
        elif kind is _engine.OPEN_CONNECTION:
            self._open(event[1])
        elif kind is _engine.CONNECTION_CLOSE:
            self._clientClosed()
        elif kind is _engine.CONNECTION_CLOSE_OK:
            self._closeNow()

    def _wait(self, later, chno):
        """
        A channel method is answered later (``later``, a Deferred: a
        cluster's metadata write or another node's reply): nothing more is
        read from this connection until it fires, so every method after it
        sees its outcome, in order (AMQP 0-9-1 section 2.3.2).
        """
        self._waiting = later
        self.transport.pauseProducing()

        def done(result):
            self._waiting = None
            if isinstance(result, Failure):
                if self.engine.state is _engine.CLOSED:
                    return None
                e = result.value
                if result.check(AMQPError):
                    if e.channelLevel and chno in self.channels:
                        self.closeChannel(chno, e)
                    else:
                        self._connectionError(e.code, e.text, e.method, detail=e.detail)
                else:
                    log.failure("internal error answering a method from {peer}", result, peer=self.name)
                    self._connectionError(spec.INTERNAL_ERROR, "INTERNAL_ERROR - internal error")
                self._flush()
            if self.engine.state is _engine.CLOSED:
                return None
            self._flush()
            if not self._readPaused and not self._sliced:
                self.transport.resumeProducing()
            if self.engine.buffered():
                self._process()
            return None

        later.addBoth(done)

    def _continueSlice(self):
        self._sliced = False
        if self.engine.state is _engine.CLOSED:
            return
        if self._waiting is not None:
            return
        if not self._readPaused:
            self.transport.resumeProducing()
        if self.engine.buffered():
            self._process()

    # --- connection class -------------------------------------------------------

    def _sendStart(self):
        props = {
            "capabilities": dict(SERVER_CAPABILITIES),
            "cluster_name": self.factory.clusterName,
            "copyright": COPYRIGHT,
            "information": INFORMATION,
            "platform": "Python/Twisted",
            "product": self.factory.product,
            "version": __version__,
        }
        props.update(self.factory.serverProperties)
        # the client's AMQP header comes after the TLS handshake, so a client
        # certificate is known by now
        mechanisms = MECHANISMS
        if self.ssl:
            self.peerCertificate = peerCertificate(self.transport)
            if self.peerCertificate is not None:
                self.peerCertificateInfo = certificateInfo(self.peerCertificate)
                mechanisms += b" EXTERNAL"
        self._write(self.engine.start(props, mechanisms))

    def _startOk(self, m):
        self.clientProperties = m.client_properties or {}
        caps = self.clientProperties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = m.mechanism
        host = getattr(self.peer, "host", None)
        if mechanism == "EXTERNAL" and self.peerCertificate is not None:
            # RabbitMQ's rabbitmq_auth_mechanism_ssl: the name comes from the
            # verified certificate; the response is not read
            username = self.factory.certificateLogin.userName(self.peerCertificate)
            user, refusal = certificateLogin(self.broker.users, username, host, self.broker.loopbackUsers)
        else:
            credentials = saslCredentials(mechanism, m.response)
            if credentials is None:
                self._connectionError(
                    spec.ACCESS_REFUSED,
                    "ACCESS_REFUSED - unsupported authentication mechanism '%s'" % (mechanism,),
                )
                return
            username, password = credentials
            user, refusal = login(self.broker.users, username, password, host, self.broker.loopbackUsers)
        if refusal == LOOPBACK_ONLY:
            log.warn("user {user!r} can only connect via localhost", user=loggable(replyText(username)))
        if user is None:
            log.warn(
                "AMQP connection {name}: {mechanism} login refused: user '{user}' - invalid credentials",
                name=self.name, mechanism=loggable(mechanism),
                # the name may be as long as a frame: log at most 255 octets of it
                user=(loggable(replyText(username)) if username is not None
                      else "(no name in the client certificate)" if mechanism == "EXTERNAL" else "(unreadable)"),
            )
            self._connectionError(
                spec.ACCESS_REFUSED,
                "ACCESS_REFUSED - Login was refused using authentication mechanism %s. "
                "For details see the broker logfile." % (mechanism,),
            )
            return
        self.user = user
        self.authMechanism = mechanism
        self.send(self.engine.tune())

    def _tuneOk(self, m):
        """The engine checked and took the client's tune-ok: arm the heartbeat checks."""
        self.engine.startHeartbeat(self.clock.seconds())
        self._scheduleHeartbeat()

    @property
    def ssl(self):
        """True when the transport is TLS (``ISSLTransport``)."""
        return ISSLTransport.providedBy(self.transport)

    @property
    def frameMax(self):
        """The negotiated frame_max (bytes)."""
        return self.engine.frameMax

    @property
    def channelMax(self):
        """The negotiated channel_max."""
        return self.engine.channelMax

    @property
    def heartbeat(self):
        """The negotiated heartbeat interval (seconds, 0: none)."""
        return self.engine.heartbeat

    @property
    def maxMessageSize(self):
        """Largest body size in bytes a publish may announce (406 above it)."""
        return self.engine.maxMessageSize

    def _scheduleHeartbeat(self):
        deadline = self.engine.nextDeadline()
        if deadline is not None:
            self._heartbeatTimer = self.clock.callLater(
                max(0, deadline - self.clock.seconds()), self._heartbeatTick
            )

    def _heartbeatTick(self):
        self._heartbeatTimer = None
        sent, self._sent = self._sent, False
        outcome = self.engine.tick(self.clock.seconds(), sent, self._readPaused)
        if outcome is _engine.TIMED_OUT:
            self._dropped = True
            log.info("closing {peer}: missed heartbeats from client, timeout: {t}s",
                     peer=self.name, t=self.heartbeat)
            self.transport.abortConnection()
            return
        if outcome is not None:
            self._write(outcome)
        self._scheduleHeartbeat()

    def _open(self, m):
        vhostName = m.virtual_host
        vhost = self.broker.vhosts.get(vhostName)
        if vhost is None:
            raise AMQPError(spec.NOT_ALLOWED, "vhost %s not found" % (vhostName,))
        if not self.broker.canAccess(self.user, vhostName):
            raise AMQPError(
                spec.NOT_ALLOWED,
                "access to vhost '%s' refused for user '%s'" % (vhostName, self.user.name),
            )
        vhost.checkConnectionLimit(self.user.name)
        self.broker.checkUserConnectionLimit(self.user.name)
        self.vhost = vhost
        if self._handshakeTimer is not None and self._handshakeTimer.active():
            self._handshakeTimer.cancel()
        self._handshakeTimer = None
        self.send(self.engine.openOk())
        self._opened = True
        log.info(
            "connection {name}: user '{user}' authenticated and granted access to vhost '{vhost}'",
            name=self.name, user=loggable(self.user.name), vhost=loggable(vhostName),
        )
        if self.broker.alarmed:
            self.alarmChanged(True)
        if self.broker.linkFlow:
            self.flowChanged(True)

    def closeChannel(self, number, error):
        """
        Close channel ``number`` for a channel-level ``error`` (AMQPError):
        the door releases what it holds (``closed()``), channel.close is
        sent, and the channel drops everything until close-ok (a crossing
        channel.close is answered with close-ok).  Nothing happens for a
        channel that is not open or already closing.
        """
        text = replyText(error.text)
        data = self.engine.closeChannel(number, error.code, text, error.method)
        if data is None:
            return
        log.info(
            "closing channel {ch} of {peer}: {code} {text}",
            ch=number, peer=self.name, code=error.code, text=loggable(text),
        )
        ch = self.channels.get(number)
        if ch is not None:
            ch.closed()
        self.send(data)

    def channelFailed(self, number, error):
        """``ISessionClient``: the Session's channel must close: :meth:`closeChannel`."""
        self.closeChannel(number, error)

    def connectionFailed(self, code, text):
        """``ISessionClient``: the connection must close (541 after a store failure): :meth:`close`."""
        self.close(code, text)

    def noteConfirms(self, session):
        """``session`` (a Session) has publisher confirms to send when this chunk is done."""
        if self._out is not None:
            self._confirming.add(session)
        else:
            session.flushConfirms()

    # --- closing ----------------------------------------------------------------

    def _connectionError(self, code, text, method=None, detail=None):
        """
        Send connection.close with ``code`` / ``text`` and wait (briefly)
        for close-ok; frames other than close/close-ok are then ignored.

        Logs one line, never a traceback: the text is cut to a short
        string's 255 octets as RabbitMQ cuts it (:func:`replyText`), so a
        huge bad frame makes a short log entry.

        :param detail: optional short str for the log line only (what the
            decoder found wrong).
        """
        engine = self.engine
        if engine.state is _engine.CLOSING or engine.state is _engine.CLOSED:
            return
        text = replyText(text)
        log.warn(
            "closing AMQP connection {name}{who}: {code} {text}{detail}",
            name=self.name, who=self._who(), code=code, text=loggable(text),
            detail=" (%s)" % (detail,) if detail else "",
        )
        self.send(engine.closeConnection(code, text, method))
        self._enterClosing()

    def _clientClosed(self):
        """
        The client sent connection.close: release everything, answer
        close-ok, then keep the socket open, discarding input, until the
        client closes it (or the closing timeout), as RabbitMQ does: a client
        still flushing buffered frames must not get EPIPE before it reads
        close-ok.
        """
        log.info("closing AMQP connection {name}{who}", name=self.name, who=self._who())
        self._enterClosing()
        self.clock.callLater(CLOSE_OK_DELAY, self._sendCloseOk)

    def _sendCloseOk(self):
        data = self.engine.closeOk()
        if data is not None:
            self.send(data)

    def _enterClosing(self):
        """
        RabbitMQ's 'closed' state (rabbit_reader:close_connection/1):
        channels and exclusive queues are released now; only
        connection.close (answered) and close-ok (ends it) are read; the
        socket is dropped after the heartbeat interval, at most
        :data:`CLOSING_TIMEOUT` seconds.
        """
        opened = self._opened
        if self._heartbeatTimer is not None:
            if self._heartbeatTimer.active():
                self._heartbeatTimer.cancel()
            self._heartbeatTimer = None
        self._release()
        if self._readPaused:
            # blocked by a resource alarm: read again, or close-ok is never seen
            self._readPaused = False
            if not self._sliced:
                self.transport.resumeProducing()
        wait = CLOSING_TIMEOUT
        if not opened:
            # a failed handshake: RabbitMQ's reader gives up after ?SILENT_CLOSE_DELAY
            wait = SILENT_CLOSE_DELAY
        elif 0 < self.heartbeat < CLOSING_TIMEOUT:
            wait = self.heartbeat
        self._closeTimer = self.clock.callLater(wait, self._closeNow)

    def close(self, code, text):
        """
        Close politely from the broker side (e.g. vhost deleted, management):
        connection.close with ``code`` / ``text`` (the full reply text), then
        wait for close-ok.
        """
        self._connectionError(code, text)

    def checkAckTimeout(self, limitSeconds, timeoutMs):
        """
        :class:`~otter_tx.broker.interfaces.IClientConnection`: close (406)
        each channel whose oldest unacknowledged delivery was made before
        ``limitSeconds`` (clock seconds); ``timeoutMs`` is for the text.
        """
        for ch in list(self.channels.values()):
            ch.session.checkAckTimeout(limitSeconds, timeoutMs)

    def _closeNow(self):
        """
        Drop the socket.  With nothing left to send the close is abortive
        (RST), as RabbitMQ's sockets with their default ``{linger, {true,
        0}}``: clients such as aio-pika tell a reset from an orderly EOF.
        """
        if self._dropped:
            return
        self._dropped = True
        self.engine.connectionLost()
        if self._out:
            data = b"".join(self._out)
            self._out = None
            self._write(data)
            self._loseConnection()
        else:
            self.transport.abortConnection()

    def readConnectionLost(self):
        """
        The client shut down its sending side (EOF): as RabbitMQ's reader
        on ``tcp_closed``, end the connection (abortively, see _closeNow).
        """
        if self.engine.state not in (_engine.CLOSING, _engine.CLOSED):
            log.warn(
                "closing AMQP connection {name}{who}: client unexpectedly closed TCP connection",
                name=self.name, who=self._who(),
            )
        self._dropped = True
        self.engine.connectionLost()
        self.transport.abortConnection()

    def writeConnectionLost(self):
        """Our sending side is shut (not used: we never half-close)."""

    # --- resource alarms ----------------------------------------------------------

    def alarmChanged(self, alarmed):
        """
        The broker's resource alarms changed (``alarmed``: any in effect,
        bool; see ``otter_tx.resources.alarms.Alarms``).  As RabbitMQ 3.10 (checked on
        the peer): nothing is sent yet; the connection is "blocking" and
        only when it publishes is it told ``connection.blocked`` (if it has
        the capability) and no longer read (:meth:`publishedWhileBlocked`).
        On clearing, a connection that was told gets ``connection.unblocked``
        and is read again (https://www.rabbitmq.com/docs/connection-blocked).
        """
        if self.engine.state is not _engine.OPEN:
            return
        if alarmed:
            self.blocked = True
            self.engine.joinContent = False
            return
        self._unblock()

    def flowChanged(self, flowing):
        """
        A cluster link's write buffer is over its high-water mark
        (``flowing`` True) or drained (False): RabbitMQ's credit flow.  A
        connection that publishes while it is on is no longer read until it
        drains (its state is ``flow``); nothing is sent to the client
        (https://www.rabbitmq.com/docs/flow-control).
        """
        self._flow = flowing
        if self.engine.state is not _engine.OPEN:
            return
        if flowing:
            # the publish that finds it on is taken whole; reading stops after it
            self.blocked = True
            return
        self._unblock()

    _flow = False

    def _unblock(self):
        """Read again, and say ``connection.unblocked``, once neither an alarm nor flow holds it."""
        if not self.blocked or self._flow or self.broker.alarmed:
            return
        self.blocked = False
        self.engine.joinContent = True
        if self._blockedSent:
            self._blockedSent = False
            self.sendMethod(0, spec.ConnectionUnblocked())
        if self._readPaused:
            self._readPaused = False
            if self._sliced:
                return
            if self._waiting is None:
                self.transport.resumeProducing()
            if self.engine.buffered():
                self._process()

    _blockedSent = False

    @property
    def flowState(self):
        """
        ``"running"``, ``"blocking"`` (an alarm is in effect, the connection
        has not published since) or ``"blocked"`` (it published and is no
        longer read), as RabbitMQ's connection ``state``.
        """
        if not self.blocked:
            return "running"
        if self._flow and not self.broker.alarmed:
            return "flow"
        return "blocked" if self._readPaused else "blocking"

    def publishedWhileBlocked(self):
        """
        A publish arrived while an alarm is in effect: send
        ``connection.blocked`` with the alarms' reason (``"low on disk"``,
        ``"low on memory"``, ``"low on disk & memory"``; once until
        unblocked) and stop reading the socket.
        """
        if not self.broker.alarmed:
            # only a cluster link's flow: stop reading, say nothing (RabbitMQ's "flow" state)
            if self.blocked and not self._readPaused:
                self._readPaused = True
                self.transport.pauseProducing()
            return
        if not self._blockedSent and self.capabilities.get("connection.blocked"):
            self._blockedSent = True
            self.sendMethod(0, spec.ConnectionBlocked(self.broker.alarms.reason()))
        if not self._readPaused:
            self._readPaused = True
            self.transport.pauseProducing()


class AMQPServerFactory(Factory):
    """
    Builds :class:`AMQPServerProtocol` for a :class:`~otter_tx.broker.broker.Broker`.

    :param broker: the Broker.  :param clock: IReactorTime for timers.
    :param heartbeat: proposed heartbeat in seconds (0 disables).
    :param frameMax: maximum frame size in bytes (RabbitMQ default 131072).
    :param channelMax: maximum channel number (RabbitMQ default 2047).
    :param handshakeTimeout: seconds a client may take to open (10 like RabbitMQ).
    :param maxMessageSize: largest message body in bytes (RabbitMQ's
        ``max_message_size``, default 134217728 = 128 MiB, at most
        :data:`MAX_MESSAGE_SIZE_LIMIT`); a content header announcing more
        gets 406 PRECONDITION_FAILED on its channel.
    :param serverProperties: dict of ``connection.start`` server properties
        (str -> str) added to or replacing ours, like RabbitMQ's
        ``server_properties`` setting (e.g. ``{"product": "RabbitMQ"}``).
    :param certificateLogin: how a verified client certificate names the
        user of a SASL ``EXTERNAL`` login, a
        :class:`~otter_tx.door.tls.CertificateLogin` (default: its subject's
        distinguished name, as RabbitMQ's default ``ssl_cert_login_from``).
    """

    protocol = AMQPServerProtocol

    def __init__(self, broker, clock, heartbeat=60, frameMax=131072, channelMax=2047,
                 handshakeTimeout=10.0, product="otter_tx", clusterName="otter_tx@localhost",
                 serverProperties=None, maxMessageSize=None, certificateLogin=None):
        self.broker = broker
        self.certificateLogin = certificateLogin if certificateLogin is not None else CertificateLogin()
        self.maxMessageSize = DEFAULT_MAX_MESSAGE_SIZE if maxMessageSize is None else maxMessageSize
        self.clock = clock
        self.heartbeat = heartbeat
        self.frameMax = frameMax
        self.channelMax = channelMax
        self.handshakeTimeout = handshakeTimeout
        self.product = product
        self.clusterName = clusterName
        #: >0 while some connection processes a received chunk; writes of
        #: other connections are then batched in their ``_out`` (see send)
        self._batchDepth = 0
        #: connections with writes batched during the current chunk
        self._dirty = []
        self.serverProperties = dict(serverProperties or {})

    def beginBatch(self):
        """
        Work that may deliver to many connections begins outside a client's
        chunk (a cluster link's frames): their writes are gathered until
        :meth:`endBatch`, one write per connection.
        """
        self._batchDepth += 1

    def endBatch(self):
        """The batch begun by :meth:`beginBatch` is done: write what it gathered."""
        self._batchDepth -= 1
        if not self._batchDepth and self._dirty:
            self.flushDirty()

    def flushDirty(self):
        """Flush every connection whose writes were batched during a chunk."""
        dirty, self._dirty = self._dirty, []
        for p in dirty:
            p.flushBatched()

    def buildProtocol(self, addr):
        """A new :class:`AMQPServerProtocol` for one client."""
        p = self.protocol(self)
        return p

