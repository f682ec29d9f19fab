"""
The AMQP 0-9-1 server connection: a Twisted ``Protocol`` that frames bytes,
runs the connection handshake (start / start-ok / tune / tune-ok / open),
heartbeats, the handshake timeout and flow control, and hands channel
frames to :class:`otter_tx.channel.Channel`.

Framing follows AMQP 0-9-1 section 4.2.3: ``type:octet channel:short
size:long payload frame-end(0xCE)``; the frame size is checked against the
negotiated ``frame_max`` as soon as the 7-byte header arrives.  Errors follow
RabbitMQ ``rabbit_reader.erl``: frame errors are connection-level 501, a
method on an unopened channel 504, content frames out of place 505.

Why the connection engine lives in the protocol here (docs/style.md prefers a
sans-IO engine): the hot path (publish in, deliver out) is one tight loop
over the receive buffer, and keeping it in one object saves a layer of
per-frame calls; every timer still runs on the injected clock and the unit
tests drive it with ``StringTransport`` and ``task.Clock``.
"""

import struct

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IHalfCloseableProtocol, IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.tcp import Connection as _TCPConnection
from twisted.logger import Logger
from zope.interface import implementer

from otter_tx import __version__
from otter_tx.amqp import spec
from otter_tx.amqp.codec import FrameSyntaxError, decodeTable
from otter_tx.amqp.errors import AMQPError, erlBinary, loggable, octetsSnippet, replyText
from otter_tx.broker.access import isLoopback
from otter_tx.broker.interfaces import IClientConnection
from otter_tx.channel import Channel

log = Logger()

_frameHeader = struct.Struct("!BHI")
_unpack_frameHeader = _frameHeader.unpack_from
_pack_frameHeader = _frameHeader.pack
_pack_Q = struct.Struct("!Q").pack
_pack_I = struct.Struct("!I").pack

# the fixed starts of the hand-built method payloads: class 60 and method
# 60 basic.deliver, 71 basic.get-ok, 80 basic.ack, 120 basic.nack
_DELIVER_PREFIX = b"\x00\x3c\x00\x3c"
_GET_OK_PREFIX = b"\x00\x3c\x00\x47"
_ACK_PREFIX = b"\x00\x3c\x00\x50"
_NACK_PREFIX = b"\x00\x3c\x00\x78"
_unpack_HH = struct.Struct("!HH").unpack_from

#: frames handled per read before yielding to the reactor (publisher fairness)
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
DEFAULT_MAX_MESSAGE_SIZE = 134217728

#: RabbitMQ's ceiling on ``max_message_size``: 512 MiB in bytes (?MAX_MSG_SIZE)
MAX_MESSAGE_SIZE_LIMIT = 536870912

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

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

# connection states
_AWAIT_HEADER = 0
_AWAIT_START_OK = 1
_AWAIT_TUNE_OK = 2
_AWAIT_OPEN = 3
_OPEN = 4
_CLOSING = 5
_CLOSED = 6
_STATE_NAMES = {
    _AWAIT_START_OK: "starting",
    _AWAIT_TUNE_OK: "tuning",
    _AWAIT_OPEN: "opening",
    _OPEN: "running",
}


def frame(frameType, channel, payload):
    """
    One wire frame (bytes).
    """
    return _pack_frameHeader(frameType, channel, len(payload)) + payload + b"\xce"


def methodFrame(channel, method):
    """
    A method frame for ``method`` (a :class:`otter_tx.amqp.spec.Method`).
    """
    return frame(spec.FRAME_METHOD, channel, method.encode())


#: bytes batched for one connection within one reactor turn above which its
#: consumers stop taking messages until the batch is written (see ``send``);
#: the transport's own buffer pauses them at Twisted's ``bufferSize``
WRITE_HIGH_WATER = 256 * 1024


@implementer(IPushProducer, IHalfCloseableProtocol, IClientConnection)
class AMQPServerProtocol(Protocol):
    """
    One client connection.

    :ivar vhost: the opened :class:`~otter_tx.broker.vhost.VHost` or None.
    :ivar user: the authenticated :class:`~otter_tx.broker.broker.User`.
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
        self._buf = b""
        self._state = _AWAIT_HEADER
        self.channels = {}
        self.vhost = None
        self.user = None
        self.frameMax = factory.frameMax
        self.channelMax = factory.channelMax
        #: largest body size in bytes a publish may announce (406 above it)
        self.maxMessageSize = factory.maxMessageSize
        self.heartbeat = 0
        self.exclusiveQueues = set()
        self.clientProperties = {}
        self.capabilities = {}
        self.paused = False
        self._transportPaused = False
        self._batchFull = False
        self._outBytes = 0
        self._resumeCall = None
        self.blocked = False
        self._readPaused = False
        self._heartbeatTimer = None
        self._handshakeTimer = None
        self._lastRecv = 0.0
        self._sent = False
        self._lastSend = 0.0
        self._out = None
        self._confirming = set()
        self._closeTimer = None
        self.connectedAt = 0.0
        self.peer = None
        self.name = ""
        self.bytesIn = 0
        self.bytesOut = 0
        #: while a queue.delete runs: [(channel, consumer tag)] of basic.cancel
        #: to send after its delete-ok (Channel._queueDelete)
        self.heldCancels = None
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
        self.transport.registerProducer(self, True)
        # plain TCP (not TLS): write straight to the socket when nothing is queued
        self._eagerWrites = isinstance(self.transport, _TCPConnection)
        self.connectedAt = self.clock.seconds()
        peer = self.transport.getPeer()
        self.peer = peer
        local = self.transport.getHost()
        # RabbitMQ's connection name, used in every log line about it
        self.name = "%s:%s -> %s:%s" % (
            getattr(peer, "host", "?"), getattr(peer, "port", 0),
            getattr(local, "host", "?"), getattr(local, "port", 0),
        )
        log.info("accepting AMQP connection {name}", name=self.name)
        self._lastRecv = self.clock.seconds()
        if self.factory.handshakeTimeout:
            self._handshakeTimer = self.clock.callLater(
                self.factory.handshakeTimeout, self._handshakeTimedOut
            )
        self.broker.connections.add(self)

    def connectionLost(self, reason=None):
        """Release channels (requeue unacked), delete exclusive queues, stop timers."""
        if self._state not in (_CLOSING, _CLOSED):
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
        self._state = _CLOSED
        self._cancelTimers()
        self.broker.connections.discard(self)
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
            ch.cleanup()
        if self.vhost is not None:
            self.vhost.connectionClosed(self)
        self.exclusiveQueues.clear()

    def _cancelTimers(self):
        for name in ("_heartbeatTimer", "_handshakeTimer", "_closeTimer", "_resumeCall"):
            t = getattr(self, name)
            if t is not None:
                if hasattr(t, "running"):
                    if t.running:
                        t.stop()
                elif t.active():
                    t.cancel()
                setattr(self, name, None)

    def _handshakeTimedOut(self):
        self._handshakeTimer = None
        if self._state < _OPEN:
            log.info("closing {peer}: handshake timeout", peer=self.name)
            self.transport.abortConnection()

    # --- IPushProducer (the transport's write buffer is full / drained) -----

    def pauseProducing(self):
        """
        The socket's write buffer is over Twisted's ``bufferSize`` (64 KiB):
        consumers here take no more messages until it drains.
        """
        self._transportPaused = True
        self.paused = True

    def resumeProducing(self):
        """The write buffer drained: let this connection's consumers take messages again."""
        self._transportPaused = False
        if self._batchFull or self._state == _CLOSED:
            return
        self.paused = False
        for ch in list(self.channels.values()):
            ch.resumeDelivery()

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
            self._write(data)

    _eagerWrites = False

    def _write(self, data):
        """
        Hand ``data`` to the transport, writing it to the socket at once when
        the transport's buffer is empty (the usual case).  Twisted's
        ``write`` only buffers and registers the socket for writability, so
        every reply cost another reactor turn and two ``epoll_ctl`` calls;
        at low message rates that was a large part of the broker's CPU per
        message (docs/performance.md).  Whatever the socket does not take
        goes through ``transport.write`` as before, so ordering and
        back-pressure (``pauseProducing``) are unchanged.  Only plain TCP
        transports (``twisted.internet.tcp.Connection``) take this path.
        """
        t = self.transport
        if self._eagerWrites and not t._tempDataLen and t.offset == len(t.dataBuffer) and not t.disconnecting:
            n = t.writeSomeData(data)
            if n.__class__ is int:
                if n == len(data):
                    return
                data = data[n:]
        t.write(data)

    def sendMethod(self, channel, method):
        """Send one method frame."""
        self.send(methodFrame(channel, method))

    def sendContent(self, channel, methodPayload, message):
        """
        Send a content-bearing method (payload already encoded) with the
        message's content header (publisher's property bytes forwarded) and
        body frames split by frame_max.
        """
        header = message.contentHeader()
        body = message.body
        parts = [
            _pack_frameHeader(1, channel, len(methodPayload)),
            methodPayload,
            b"\xce",
            _pack_frameHeader(2, channel, len(header)),
            header,
            b"\xce",
        ]
        size = message.size
        if size:
            chunk = self.frameMax - 8
            if size <= chunk:
                parts.append(_pack_frameHeader(3, channel, size))
                parts.append(body)
                parts.append(b"\xce")
            else:
                for i in range(0, size, chunk):
                    piece = body[i : i + chunk]
                    parts.append(_pack_frameHeader(3, channel, len(piece)))
                    parts.append(piece)
                    parts.append(b"\xce")
        self.send(b"".join(parts))

    def sendDeliver(self, channel, consumerTagBytes, deliveryTag, redelivered, message):
        """
        basic.deliver with the message's content: ``consumerTagBytes`` the
        tag as an encoded shortstr (length octet included).
        """
        self.sendContent(channel, b"".join((
            _DELIVER_PREFIX, consumerTagBytes, _pack_Q(deliveryTag),
            b"\x01" if redelivered else b"\x00", message.addressBytes(),
        )), message)

    def sendGetOk(self, channel, deliveryTag, redelivered, message, messageCount):
        """basic.get-ok with the message's content; ``messageCount`` the messages left."""
        self.sendContent(channel, b"".join((
            _GET_OK_PREFIX, _pack_Q(deliveryTag), b"\x01" if redelivered else b"\x00",
            message.addressBytes(), _pack_I(messageCount),
        )), message)

    def sendReturn(self, channel, replyCode, replyText, message):
        """basic.return (``replyCode`` e.g. 312, ``replyText`` ``NO_ROUTE``) with the message's content."""
        payload = spec.BasicReturn(replyCode, replyText, message.exchange, message.routingKey).encode()
        self.sendContent(channel, payload, message)

    def sendConfirms(self, channel, confirms):
        """
        Publisher confirms ``confirms``, a list of ``(seq, ok)`` in seq order.
        Runs of acks collapse into one ``basic.ack multiple=true`` (every
        earlier publish is already settled: confirms go out in order); a
        nack is multiple=false, requeue=false.
        """
        # hot path (every read with confirms): the frames are built here,
        # not through the generic Method codec
        header = _pack_frameHeader(1, channel, 13)
        out = []
        runEnd = None
        for seq, ok in confirms:
            if ok:
                runEnd = seq
            else:
                if runEnd is not None:
                    out.append(header + _ACK_PREFIX + _pack_Q(runEnd) + b"\x01\xce")
                    runEnd = None
                out.append(header + _NACK_PREFIX + _pack_Q(seq) + b"\x00\xce")
        if runEnd is not None:
            out.append(header + _ACK_PREFIX + _pack_Q(runEnd)
                       + (b"\x01\xce" if len(confirms) > 1 else b"\x00\xce"))
        self.send(out[0] if len(out) == 1 else b"".join(out))

    def closeChannel(self, channel, error):
        """
        Close channel ``channel`` for ``error`` (AMQPError): channel.close
        sent, the channel's door ``closed()``; only close-ok ends it.
        """
        ch = self.channels.get(channel)
        if ch is not None:
            ch.closeWithError(error)

    def _flush(self):
        if self._confirming:
            for ch in self._confirming:
                ch.flushConfirms()
            self._confirming.clear()
        out = self._out
        self._out = None
        self._outBytes = 0
        if out:
            data = b"".join(out)
            self.bytesOut += len(data)
            self._write(data)
        if self._batchFull:
            # resume on a later turn, once the reactor had a chance to
            # write; if the socket did not take it all, the transport has
            # paused us and resumes us when it drains
            self._batchFull = False
            if self._resumeCall is None and self._state != _CLOSED:
                self._resumeCall = self.clock.callLater(0, self._afterBatch)

    _confirming = None

    def flushBatched(self):
        """Write what was batched for this connection while another connection's chunk was processed."""
        if self._state == _CLOSED:
            self._out = None
            self._outBytes = 0
        elif self._out is not None:
            self._flush()

    # --- input ------------------------------------------------------------------

    def dataReceived(self, data):
        """Parse the protocol header, then frames (offset-based, frame_max checked on each header)."""
        if self._state == _CLOSED:
            return
        self._lastRecv = self.clock.seconds()
        self.bytesIn += len(data)
        meter = self.broker.memoryMonitor
        if meter is not None:
            # the memory alarm reads RSS every so many received bytes (otter_tx.alarms)
            meter.received(len(data))
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self._state == _AWAIT_HEADER:
            if len(data) < 8:
                if not spec.PROTOCOL_HEADER.startswith(data[:8]) and not data.startswith(b"AMQP"[: len(data)]):
                    self._badHeader()
                    return
                self._buf = data
                return
            header = data[:8]
            if header not in (
                spec.PROTOCOL_HEADER,
                spec.PROTOCOL_HEADER_0_9,
                spec.PROTOCOL_HEADER_0_9_ALT,
            ):
                self._badHeader()
                return
            data = data[8:]
            self._sendStart()
        if self._out is None:
            self._out = []
        if self._confirming is None:
            self._confirming = set()
        factory = self.factory
        factory._batchDepth += 1
        try:
            self._processFrames(data)
        finally:
            factory._batchDepth -= 1
            if self._state != _CLOSED:
                self._flush()
            else:
                self._out = None
            if not factory._batchDepth and factory._dirty:
                factory.flushDirty()

    def _badHeader(self):
        # AMQP 0-9-1 section 4.2.2: answer with our header and close
        self.transport.write(spec.PROTOCOL_HEADER)
        self._state = _CLOSED
        self.transport.loseConnection()

    def _processFrames(self, data):
        off = 0
        n = len(data)
        maxPayload = self.frameMax - 8
        channels = self.channels
        budget = FRAMES_PER_SLICE
        while n - off >= 7:
            ftype, chno, size = _unpack_frameHeader(data, off)
            # RabbitMQ lets a payload of up to frame_max through but reports
            # frame_max - 8 as the limit in its error text
            if size > maxPayload + 8:
                self._connectionError(
                    spec.FRAME_ERROR,
                    "FRAME_ERROR - type %d, all octets = <<>>: {frame_too_large,%d,%d}"
                    % (ftype, size, maxPayload),
                )
                return
            end = off + 7 + size
            if end >= n:
                break
            if data[end] != 0xCE:
                self._connectionError(
                    spec.FRAME_ERROR,
                    "FRAME_ERROR - %s: {invalid_frame_end_marker,%d}"
                    % (octetsSnippet("type %d, " % (ftype,), data[off + 7 : end]), data[end]),
                )
                return
            payload = data[off + 7 : end]
            off = end + 1
            if self._state == _CLOSING:
                # only connection.close / close-ok matter now; the rest is
                # dropped (rabbit_reader in its 'closed' state)
                if ftype == 1 and chno == 0 and len(payload) >= 4:
                    ids = _unpack_HH(payload, 0)
                    if ids == (10, 50):
                        # crossing closes: answer, and wait for the client's
                        # close-ok or for it to drop the socket
                        self.sendMethod(0, spec.ConnectionCloseOk())
                    elif ids == (10, 51):
                        self._closeNow()
                if self._state == _CLOSED:
                    return
                continue
            if (ftype == 1 and size < 4) or (ftype == 2 and size < 14) or (ftype == 8 and size):
                # too short to name a method / to be a content header, or a
                # heartbeat with a payload: rabbit_reader cannot even
                # analyse it (501, on any channel)
                self._connectionError(
                    spec.FRAME_ERROR,
                    "FRAME_ERROR - %s: unknown_frame" % (octetsSnippet("type %d, " % (ftype,), payload),),
                )
                return
            try:
                ch = channels.get(chno) if chno else None
                if ch is not None and self._state == _OPEN:
                    # the hot path: frames on an open channel
                    if ftype == 3:
                        ch.bodyFrame(payload)
                    elif ftype == 1:
                        ch.methodFrame(payload)
                    elif ftype == 2:
                        ch.headerFrame(payload)
                    else:
                        self._otherFrame(ftype, chno, payload)
                else:
                    self._otherFrame(ftype, chno, payload)
            except AMQPError as e:
                if e.channelLevel and chno != 0 and chno in channels:
                    channels[chno].closeWithError(e)
                else:
                    self._connectionError(e.code, e.text, e.method)
                    return
            except FrameSyntaxError as e:
                # RabbitMQ: rabbit_misc:frame_error(Method, Args), "cannot
                # decode" and the method's arguments; a content header's
                # properties are named with basic.publish (RabbitMQ decodes
                # them lazily and answers 541; docs/compatibility.md)
                method = None
                args = b""
                if ftype == 1:
                    method = spec.METHODS.get(_unpack_HH(payload, 0))
                    args = payload[4:]
                elif ftype == 2:
                    method = spec.BasicPublish
                    args = payload[12:]
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
            if self._state == _CLOSED:
                return
            if self._readPaused:
                # blocked by a resource alarm: stop after this publish
                self._buf = data[off:]
                return
            budget -= 1
            if not budget and off < n:
                # fairness: let the reactor serve other connections (consumers
                # acking, say) before the rest of this publisher's bytes
                self._buf = data[off:]
                self._sliced = True
                self.transport.pauseProducing()
                self.clock.callLater(0, self._continueSlice)
                return
        if off < n:
            self._buf = data[off:]

    _sliced = False

    def _otherFrame(self, ftype, chno, payload):
        if chno == 0:
            if ftype == 1:
                self._connectionMethod(payload)
            elif ftype == 8:
                pass
            elif ftype in (2, 3):
                # rabbit_reader: content frames on channel 0
                raise AMQPError(
                    spec.UNEXPECTED_FRAME, octetsSnippet("type %d, " % (ftype,), payload)
                )
            else:
                raise AMQPError(
                    spec.FRAME_ERROR,
                    "%s: unknown_frame" % (octetsSnippet("type %d, " % (ftype,), payload),),
                )
            return
        if self._state != _OPEN:
            raise AMQPError(spec.CHANNEL_ERROR, "channel %d used before connection.open" % chno)
        if ftype == 1:
            self._openChannel(chno, payload)
        elif ftype in (2, 3):
            # content frames on a channel that is not open: RabbitMQ's
            # command assembler expects a method first
            raise AMQPError(
                spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        elif ftype == 8:
            raise AMQPError(spec.UNEXPECTED_FRAME, octetsSnippet("type 8, ", payload))
        else:
            raise AMQPError(
                spec.FRAME_ERROR,
                "%s: unknown_frame" % (octetsSnippet("type %d, " % (ftype,), payload),),
            )

    def _continueSlice(self):
        self._sliced = False
        if self._state == _CLOSED:
            return
        if not self._readPaused:
            self.transport.resumeProducing()
        buf, self._buf = self._buf, b""
        if buf:
            self.bytesIn -= len(buf)
            self.dataReceived(buf)

    # --- connection class -------------------------------------------------------

    def _sendStart(self):
        props = {
            "capabilities": dict(SERVER_CAPABILITIES),
            "cluster_name": self.factory.clusterName,
            "copyright": "Copyright (c) otter_tx contributors",
            "information": "Licensed under the MIT license. See https://github.com/otter-tx",
            "platform": "Python/Twisted",
            "product": self.factory.product,
            "version": __version__,
        }
        props.update(self.factory.serverProperties)
        self.transport.write(
            methodFrame(
                0,
                spec.ConnectionStart(
                    0, 9, props, b"PLAIN AMQPLAIN", b"en_US"
                ),
            )
        )
        self._state = _AWAIT_START_OK

    def _connectionMethod(self, payload):
        classId, methodId = _unpack_HH(payload, 0)
        cls = spec.METHODS.get((classId, methodId))
        if cls is None:
            raise AMQPError(
                spec.COMMAND_INVALID, "unknown method class %d method %d" % (classId, methodId)
            )
        m = cls.decode(payload, 4)
        state = self._state
        if cls is spec.ConnectionClose:
            self._clientClosed()
            return
        if state == _CLOSING:
            if cls is spec.ConnectionCloseOk:
                self._closeNow()
            return
        if state == _AWAIT_START_OK and cls is spec.ConnectionStartOk:
            self._startOk(m)
        elif state == _AWAIT_TUNE_OK and cls is spec.ConnectionTuneOk:
            self._tuneOk(m)
        elif state == _AWAIT_OPEN and cls is spec.ConnectionOpen:
            self._open(m)
        elif state == _OPEN and cls is spec.ConnectionUpdateSecret:
            self.sendMethod(0, spec.ConnectionUpdateSecretOk())
        elif state == _OPEN and cls in (spec.ConnectionBlocked, spec.ConnectionUnblocked):
            pass
        else:
            raise AMQPError(
                spec.CHANNEL_ERROR,
                "unexpected method in connection state %s" % (_STATE_NAMES.get(state, "running"),),
                cls,
            )

    def _startOk(self, m):
        self.clientProperties = m.client_properties or {}
        caps = self.clientProperties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = m.mechanism
        username = password = None
        resp = m.response
        if mechanism == "PLAIN":
            parts = resp.split(b"\x00")
            if len(parts) == 3:
                username = parts[1].decode("utf-8", "replace")
                password = parts[2].decode("utf-8", "replace")
        elif mechanism == "AMQPLAIN":
            try:
                t = decodeTable(resp, 0, len(resp))
            except FrameSyntaxError:
                t = {}
            username = t.get("LOGIN")
            password = t.get("PASSWORD")
            if not isinstance(username, str) or not isinstance(password, str):
                username = password = None
        else:
            self._connectionError(
                spec.ACCESS_REFUSED,
                "ACCESS_REFUSED - unsupported authentication mechanism '%s'" % (mechanism,),
            )
            return
        user = None
        if username is not None:
            user = self.broker.authenticate(username, password)
            if user is not None and user.loopbackOnly and not isLoopback(getattr(self.peer, "host", None)):
                log.warn(
                    "user {user!r} can only connect via localhost", user=loggable(replyText(username))
                )
                user = None
        if user is None:
            log.warn(
                "AMQP connection {name}: {mechanism} login refused: user '{user}' - invalid credentials",
                name=self.name, mechanism=loggable(mechanism),
                # the name may be as long as a frame: log at most 255 octets of it
                user=loggable(replyText(username)) if username is not None else "(unreadable)",
            )
            self._connectionError(
                spec.ACCESS_REFUSED,
                "ACCESS_REFUSED - Login was refused using authentication mechanism %s. "
                "For details see the broker logfile." % (mechanism,),
            )
            return
        self.user = user
        self.sendMethod(
            0,
            spec.ConnectionTune(self.factory.channelMax, self.factory.frameMax, self.factory.heartbeat),
        )
        self._state = _AWAIT_TUNE_OK

    def _tuneOk(self, m):
        fmax = m.frame_max or self.factory.frameMax
        if fmax < spec.FRAME_MIN_SIZE:
            raise AMQPError(
                spec.NOT_ALLOWED,
                "frame_max=%d < %d min size" % (fmax, spec.FRAME_MIN_SIZE),
            )
        if fmax > self.factory.frameMax:
            raise AMQPError(
                spec.NOT_ALLOWED,
                "frame_max=%d > %d max size" % (fmax, self.factory.frameMax),
            )
        self.frameMax = fmax
        cmax = m.channel_max or self.factory.channelMax or 65535
        if self.factory.channelMax and cmax > self.factory.channelMax:
            raise AMQPError(
                spec.NOT_ALLOWED,
                "channel_max=%d > %d max size" % (cmax, self.factory.channelMax),
            )
        self.channelMax = cmax
        self.heartbeat = m.heartbeat
        self._state = _AWAIT_OPEN
        if self.heartbeat:
            from twisted.internet.task import LoopingCall

            self._heartbeatTimer = LoopingCall(self._heartbeatTick)
            self._heartbeatTimer.clock = self.clock
            # like RabbitMQ: check (and send) every half interval
            self._heartbeatTimer.start(self.heartbeat / 2.0, now=False)

    def _heartbeatTick(self):
        now = self.clock.seconds()
        if self._readPaused:
            # blocked by an alarm we read nothing, heartbeats included: as
            # RabbitMQ (rabbit_heartbeat:pause_monitor), do not time it out
            self._lastRecv = now
        if now - self._lastRecv > 2 * self.heartbeat:
            log.info("closing {peer}: missed heartbeats from client, timeout: {t}s",
                     peer=self.name, t=self.heartbeat)
            self._heartbeatTimer.stop()
            self._heartbeatTimer = None
            self._state = _CLOSED
            self.transport.abortConnection()
            return
        if not self._sent or now - self._lastSend >= self.heartbeat:
            self.transport.write(HEARTBEAT_FRAME)
            self._lastSend = now
        self._sent = False

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
        self.vhost = vhost
        if self._handshakeTimer is not None and self._handshakeTimer.active():
            self._handshakeTimer.cancel()
        self._handshakeTimer = None
        self.sendMethod(0, spec.ConnectionOpenOk(""))
        self._state = _OPEN
        log.info(
            "connection {name}: user '{user}' authenticated and granted access to vhost '{vhost}'",
            name=self.name, user=loggable(self.user.name), vhost=loggable(vhostName),
        )
        if self.broker.alarmed:
            self.alarmChanged(True)

    def _openChannel(self, chno, payload):
        classId, methodId = _unpack_HH(payload, 0)
        if (classId, methodId) != (20, 10):
            raise AMQPError(
                spec.CHANNEL_ERROR, "expected 'channel.open'", spec.METHODS.get((classId, methodId))
            )
        # RabbitMQ limits how many channels are open, not the channel number
        if len(self.channels) >= self.channelMax:
            raise AMQPError(
                spec.NOT_ALLOWED,
                "number of channels opened (%d) has reached the negotiated channel_max (%d)"
                % (len(self.channels), self.channelMax),
            )
        ch = Channel(self, chno)
        self.channels[chno] = ch
        self.sendMethod(chno, spec.ChannelOpenOk(b""))

    def channelClosed(self, chno):
        """Forget channel ``chno`` (after close / close-ok)."""
        self.channels.pop(chno, None)

    def noteConfirms(self, channel):
        """``channel`` has publisher confirms to send when this chunk is done."""
        if self._out is not None:
            self._confirming.add(channel)
        else:
            channel.flushConfirms()

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
        if self._state in (_CLOSING, _CLOSED):
            return
        text = replyText(text)
        log.warn(
            "closing AMQP connection {name}{who}: {code} {text}{detail}",
            name=self.name, who=self._who(), code=code, text=loggable(text),
            detail=" (%s)" % (detail,) if detail else "",
        )
        classId = method.CLASS_ID if method is not None else 0
        methodId = method.METHOD_ID if method is not None else 0
        self.sendMethod(0, spec.ConnectionClose(code, text, classId, methodId))
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
        if self._state == _CLOSING:
            self.sendMethod(0, spec.ConnectionCloseOk())

    def _enterClosing(self):
        """
        RabbitMQ's 'closed' state (rabbit_reader:close_connection/1):
        channels and exclusive queues are released now; only
        connection.close (answered) and close-ok (ends it) are read; the
        socket is dropped after the heartbeat interval, at most
        :data:`CLOSING_TIMEOUT` seconds.
        """
        opened = self._state >= _OPEN
        self._state = _CLOSING
        if self._heartbeatTimer is not None:
            self._heartbeatTimer.stop()
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
        """Close from the broker side (e.g. vhost deleted, management)."""
        self._connectionError(code, text)

    def _closeNow(self):
        """
        Drop the socket.  With nothing left to send the close is abortive
        (RST), as RabbitMQ's sockets with their default ``{linger, {true,
        0}}``: clients such as aio-pika tell a reset from an orderly EOF.
        """
        if self._state == _CLOSED:
            return
        self._state = _CLOSED
        if self._out:
            data = b"".join(self._out)
            self._out = None
            self.transport.write(data)
            self.transport.loseConnection()
        else:
            self.transport.abortConnection()

    def readConnectionLost(self):
        """
        The client shut down its sending side (EOF): as RabbitMQ's reader
        on ``tcp_closed``, end the connection (abortively, see _closeNow).
        """
        if self._state not in (_CLOSING, _CLOSED):
            log.warn(
                "closing AMQP connection {name}{who}: client unexpectedly closed TCP connection",
                name=self.name, who=self._who(),
            )
        self._state = _CLOSED
        self.transport.abortConnection()

    def writeConnectionLost(self):
        """Our sending side is shut (not used: we never half-close)."""

    # --- acknowledgement timeout ----------------------------------------------------

    def checkAckTimeout(self, limitSeconds, timeoutMs):
        """
        :class:`~otter_tx.broker.interfaces.IClientConnection`: close (406)
        each channel whose oldest unacknowledged delivery was made before
        ``limitSeconds`` (clock seconds); ``timeoutMs`` is for the text.
        """
        for ch in list(self.channels.values()):
            ch.checkAckTimeout(limitSeconds, timeoutMs)

    # --- resource alarms ----------------------------------------------------------

    def alarmChanged(self, alarmed):
        """
        The broker's resource alarms changed (``alarmed``: any in effect,
        bool; see ``otter_tx.alarms.Alarms``).  As RabbitMQ 3.10 (checked on
        the peer): nothing is sent yet; the connection is "blocking" and
        only when it publishes is it told ``connection.blocked`` (if it has
        the capability) and no longer read (:meth:`publishedWhileBlocked`).
        On clearing, a connection that was told gets ``connection.unblocked``
        and is read again (https://www.rabbitmq.com/docs/connection-blocked).
        """
        if self._state != _OPEN:
            return
        if alarmed:
            self.blocked = True
            return
        if not self.blocked:
            return
        self.blocked = False
        if self._blockedSent:
            self._blockedSent = False
            self.sendMethod(0, spec.ConnectionUnblocked())
        if self._readPaused:
            self._readPaused = False
            if self._sliced:
                return
            self.transport.resumeProducing()
            if self._buf:
                buf, self._buf = self._buf, b""
                self.dataReceived(buf)

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
        return "blocked" if self._readPaused else "blocking"

    def publishedWhileBlocked(self):
        """
        A publish arrived while an alarm is in effect: send
        ``connection.blocked`` with the alarms' reason (``"low on disk"``,
        ``"low on memory"``, ``"low on disk & memory"``; once until
        unblocked) and stop reading the socket.
        """
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
    """

    protocol = AMQPServerProtocol

    def __init__(self, broker, clock, heartbeat=60, frameMax=131072, channelMax=2047,
                 handshakeTimeout=10.0, product="otter_tx", clusterName="otter_tx@localhost",
                 serverProperties=None, maxMessageSize=None):
        self.broker = broker
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

    def flushDirty(self):
        """Flush every connection whose writes were batched during a chunk."""
        dirty, self._dirty = self._dirty, []
        for p in dirty:
            p.flushBatched()

    def buildProtocol(self, addr):
        """A new :class:`AMQPServerProtocol` for one client."""
        p = self.protocol(self)
        return p

