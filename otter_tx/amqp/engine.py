"""
The AMQP 0-9-1 connection and channel engines: bytes in, events out, bytes
to send from encoders, in either role (server or client).  No Twisted, no
sockets, no timers, no broker: the engine reports its next heartbeat
deadline (:meth:`ConnectionEngine.nextDeadline`) and is told the time
(:meth:`ConnectionEngine.tick`), as h11's ``Connection`` and h2's
``H2Connection`` (Twisted's ``web/_http2.py`` is the glue over the latter).

Usage (server role, as ``otter_tx.door.protocol`` drives it)::

    engine = ConnectionEngine(SERVER, frameMax=131072, channelMax=2047)
    engine.receiveData(data, now)
    while True:
        event = engine.nextEvent()      # raises AMQPError on a protocol error
        if event is None:               # needs more bytes
            break
        ...                             # event[0] is one of the event kinds below

Events are tuples, the kind first (compare with ``is``):

=====================  ===================================================
``PROTOCOL_HEADER``    ``(kind, header)``: a valid 8-octet header (server
                       role: answer with :meth:`start`; client role: the
                       server refused our header and sent its own)
``BAD_HEADER``         ``(kind, data)``: not an AMQP header (server: write
                       ``spec.PROTOCOL_HEADER`` and close; section 4.2.2)
``START_OK`` ...       ``(kind, method)``: connection.start-ok, tune-ok,
                       open (server role; answer with :meth:`tune`,
                       nothing, :meth:`openOk` or :meth:`closeConnection`)
``CONNECTION_CLOSE``   ``(kind, method)``: the peer's connection.close; the
                       engine is closing (answer with :meth:`closeOk`)
``CONNECTION_CLOSE_OK``  ``(kind,)``: the close handshake is over
``SEND``               ``(kind, bytes)``: an answer the engine made itself
                       (close-ok for a crossing close, update-secret-ok)
``CHANNEL_OPEN``       ``(kind, channel)``: channel.open (answer open-ok)
``CHANNEL_CLOSE``      ``(kind, channel, method)``: the peer closed the
                       channel (answer :meth:`channelCloseOk`)
``CHANNEL_CLOSED``     ``(kind, channel)``: close-ok for our channel.close
``METHOD``             ``(kind, channel, method)``: any other method
``MESSAGE``            ``(kind, channel, exchange, routingKey, mandatory,
                       address, propsRaw, body)``: basic.publish whose
                       content header and single body frame were buffered
                       with it (server; the usual case, one event)
``PUBLISH``            ``(kind, channel, exchange, routingKey, mandatory,
                       address)``: basic.publish (server) whose content was
                       not all buffered; it follows as ``CONTENT``
``CONTENT``            server: ``(kind, channel, propsRaw, body)``; client:
                       ``(kind, channel, method, propsRaw, body)`` for
                       basic.deliver / get-ok / return
``ACK``                ``(kind, channel, deliveryTag, multiple)``: basic.ack
                       (server)
``HEARTBEAT``          ``(kind, channel)``: client role only
=====================  ===================================================

Errors: the peer broke the protocol -> :class:`~otter_tx.amqp.errors.AMQPError`
with RabbitMQ's code and text (``rabbit_reader.erl``,
``rabbit_command_assembler.erl``, ``rabbit_channel.erl``) and its
``channel`` set to the frame's channel: channel-level codes (4xx) close that
channel, the others the connection (the caller decides, with
``AMQPError.channelLevel``).  Our own code misusing the engine ->
:class:`LocalProtocolError`.

The hot path (basic.publish + content header + body in, basic.ack in,
basic.deliver out) is decoded and encoded by hand, measured with
``bench/hotpath.py``; every other method goes through the generic codec.
"""

import struct

from otter_tx.amqp import spec
from otter_tx.amqp.codec import FrameSyntaxError, decodeTable
from otter_tx.amqp.errors import AMQPError, erlBinary, octetsSnippet
from otter_tx.amqp.frames import (
    CONTENT_HEADER_MIN_SIZE,
    CONTENT_PROPERTIES_AT,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    FrameReader,
    contentFrames,
    methodFrame,
    packFrameHeader,
)
from otter_tx.amqp.spec import CLASS_BASIC, CLASS_CHANNEL

SERVER = "server"
CLIENT = "client"

# --- connection states (both roles; the client's await states mirror the server's) ---
AWAIT_HEADER = "await-header"
AWAIT_START_OK = "await-start-ok"
AWAIT_TUNE_OK = "await-tune-ok"
AWAIT_OPEN = "await-open"
AWAIT_START = "await-start"
AWAIT_TUNE = "await-tune"
AWAIT_OPEN_OK = "await-open-ok"
OPEN = "open"
CLOSING = "closing"
CLOSED = "closed"

#: RabbitMQ's names for the server states in "unexpected method in connection state X"
_STATE_NAMES = {
    AWAIT_START_OK: "starting",
    AWAIT_TUNE_OK: "tuning",
    AWAIT_OPEN: "opening",
    OPEN: "running",
}

# --- event kinds ---
PROTOCOL_HEADER = "protocol-header"
BAD_HEADER = "bad-header"
START = "start"
START_OK = "start-ok"
TUNE = "tune"
TUNE_OK = "tune-ok"
OPEN_CONNECTION = "open"
OPEN_OK = "open-ok"
CONNECTION_CLOSE = "connection-close"
CONNECTION_CLOSE_OK = "connection-close-ok"
SEND = "send"
CHANNEL_OPEN = "channel-open"
CHANNEL_CLOSE = "channel-close"
CHANNEL_CLOSED = "channel-closed"
METHOD = "method"
MESSAGE = "message"
PUBLISH = "publish"
CONTENT = "content"
ACK = "ack"
HEARTBEAT = "heartbeat"

#: :meth:`ConnectionEngine.tick` result: no input for twice the heartbeat interval
TIMED_OUT = "timed-out"

#: RabbitMQ's default ``max_message_size``: 128 MiB in bytes (rabbit.app.src)
DEFAULT_MAX_MESSAGE_SIZE = 134217728

_unpack_HH = struct.Struct("!HH").unpack_from
_unpack_frameHeader = struct.Struct("!BHI").unpack_from
_unpack_HHQ = struct.Struct("!HHQ").unpack_from
_unpack_Q = struct.Struct("!Q").unpack_from
_pack_Q = struct.Struct("!Q").pack
_pack_I = struct.Struct("!I").pack

_PUBLISH_PREFIX = spec.BasicPublish.PREFIX
_DELIVER_PREFIX = spec.BasicDeliver.PREFIX
_GET_OK_PREFIX = spec.BasicGetOk.PREFIX
# basic.ack / basic.nack (publisher confirms and the client's acks)
_ACK_PREFIX = spec.BasicAck.PREFIX
_NACK_PREFIX = spec.BasicNack.PREFIX
_CONNECTION_CLOSE_PREFIX = spec.ConnectionClose.PREFIX
_CONNECTION_CLOSE_OK_PREFIX = spec.ConnectionCloseOk.PREFIX
#: payload octets of basic.ack / basic.nack: class and method ids, delivery-tag (8), bits (1)
_ACK_SIZE = 4 + 8 + 1
#: payload octets of basic.deliver besides its consumer tag and address:
#: class and method ids, delivery-tag (8), redelivered (1)
_DELIVER_FIXED_SIZE = 4 + 8 + 1
#: the smallest content header frame up to its end octet
_HEADER_FRAME_MIN = FRAME_HEADER_SIZE + CONTENT_HEADER_MIN_SIZE

#: channel methods a client may send (server role); others are 503 "not allowed on a channel"
_CLIENT_CHANNEL_METHODS = frozenset([
    spec.ChannelClose, spec.ChannelCloseOk, spec.ChannelFlow, spec.ChannelFlowOk, spec.ChannelOpen,
    spec.ExchangeDeclare, spec.ExchangeDelete, spec.ExchangeBind, spec.ExchangeUnbind,
    spec.QueueDeclare, spec.QueueBind, spec.QueueUnbind, spec.QueuePurge, spec.QueueDelete,
    spec.BasicQos, spec.BasicConsume, spec.BasicCancel, spec.BasicGet, spec.BasicReject,
    spec.BasicNack, spec.BasicRecover, spec.BasicRecoverAsync,
    spec.TxSelect, spec.TxCommit, spec.TxRollback, spec.ConfirmSelect,
])


class LocalProtocolError(Exception):
    """Our own code misused the engine (a bug here, never the peer's fault)."""


def _unknownFrame(ftype, payload):
    return AMQPError(spec.FRAME_ERROR, "%s: unknown_frame" % (octetsSnippet("type %d, " % (ftype,), payload),))


def _decode(cls, payload):
    """
    ``cls`` decoded from a method frame's ``payload``; undecodable arguments
    are 501 ``FRAME_ERROR - cannot decode <<...>>`` naming ``cls``
    (``rabbit_misc:frame_error``), the decoder's reason in ``detail``.
    """
    try:
        return cls.decode(payload, 4)
    except FrameSyntaxError as e:
        raise _cannotDecode(cls, payload[4:], e) from None


def _cannotDecode(cls, args, e):
    err = AMQPError(spec.FRAME_ERROR, "cannot decode %s" % (erlBinary(args),), cls)
    err.detail = str(e)
    return err


#: the SASL mechanisms connection.start offers (and :func:`saslCredentials` reads)
MECHANISMS = b"PLAIN AMQPLAIN"


def saslCredentials(mechanism, response):
    """
    The ``(username, password)`` (str, str) in a connection.start-ok
    ``response`` (bytes) for ``mechanism`` (str): ``PLAIN`` is
    ``authzid NUL authcid NUL password`` (RFC 4616), ``AMQPLAIN`` a field
    table with ``LOGIN`` and ``PASSWORD`` (AMQP 0-8).  ``(None, None)`` when
    the response cannot be read (RabbitMQ then refuses the login as for bad
    credentials); None when the mechanism is not one of :data:`MECHANISMS`
    (RabbitMQ: 403 ``unsupported authentication mechanism``).
    """
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) == 3:
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        return None, None
    if mechanism == "AMQPLAIN":
        try:
            t = decodeTable(response, 0, len(response))
        except FrameSyntaxError:
            return None, None
        username, password = t.get("LOGIN"), t.get("PASSWORD")
        if isinstance(username, str) and isinstance(password, str):
            return username, password
        return None, None
    return None


def checkShortStrings(m):
    """
    A method's short strings must be UTF-8, as RabbitMQ checks them in
    every method but basic.publish: 501 "FRAME_ERROR - Malformed UTF-8 in
    shortstr", a connection error with class and method 0 (checked on
    RabbitMQ 3.10 for queue.declare/bind/purge/delete, exchange.declare/
    delete, basic.consume/get).  The codec decodes undecodable bytes to
    lone surrogates, so such names never reach a queue, an exchange or the
    store.
    """
    cls = type(m)
    for name, t in zip(cls.FIELDS, cls.TYPES):
        if t == "s":
            value = getattr(m, name)
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise AMQPError(spec.FRAME_ERROR, "Malformed UTF-8 in shortstr") from None


def _unexpectedInContent(expected):
    """
    505 for a frame of the wrong kind while basic.publish's content is
    being assembled, with rabbit_command_assembler's text.
    """
    return AMQPError(
        spec.UNEXPECTED_FRAME,
        "expected %s for class 60, got non %s frame instead" % (expected, expected)
        if expected == "content header"
        else "expected content body, got non content body frame instead",
        spec.BasicPublish,
    )


class ChannelEngine:
    """
    One open channel's wire state.

    :ivar number: the channel number (int).
    :ivar closing: True once we sent channel.close: only close-ok ends it, a
        crossing channel.close is answered, everything else is dropped.
    :ivar pending: a content-bearing method awaits its content (server:
        True after basic.publish; client: the deliver / get-ok / return).
    :ivar header: the content header's property bytes once it arrived, else None.
    :ivar bodyParts: body frames (list of bytes) of a content being assembled, or None.
    :ivar remaining: body octets still expected (int).
    """

    __slots__ = ("number", "closing", "pending", "header", "bodyParts", "remaining")

    def __init__(self, number):
        self.number = number
        self.closing = False
        self.reset()

    def reset(self):
        """Forget a content being assembled."""
        self.pending = self.header = self.bodyParts = None
        self.remaining = 0


class ConnectionEngine:
    """
    One AMQP connection's wire: framing, the handshake, heartbeats, close
    rules and the channels' content assembly, in ``role`` SERVER or CLIENT.

    :param frameMax: server: the frame_max we propose (bytes), the limit
        until tune-ok; client: the limit for frames we accept.
    :param channelMax: server: the channel_max we propose (0: none).
    :param heartbeat: server: the heartbeat interval we propose (seconds, 0: none).
    :param maxMessageSize: server: largest body (bytes) a publish may
        announce; 406 on its channel above it, answered at the content
        header (RabbitMQ's ``max_message_size``; its rabbit_channel
        ``check_msg_size/3`` answers once the body has arrived).
    :ivar state: one of the module's state constants.
    :ivar frameMax: the negotiated frame_max (bytes).
    :ivar channelMax: the negotiated channel_max.
    :ivar heartbeat: the negotiated heartbeat interval (seconds, 0: none).
    :ivar channels: channel number -> :class:`ChannelEngine`.
    """

    def __init__(self, role=SERVER, frameMax=131072, channelMax=2047, heartbeat=0,
                 maxMessageSize=DEFAULT_MAX_MESSAGE_SIZE):
        if role not in (SERVER, CLIENT):
            raise LocalProtocolError("role must be SERVER or CLIENT, not %r" % (role,))
        self.role = role
        self.proposedFrameMax = frameMax
        self.proposedChannelMax = channelMax
        self.frameMax = frameMax
        self.channelMax = channelMax
        self.proposedHeartbeat = heartbeat
        self.maxMessageSize = maxMessageSize
        #: join a basic.publish with its content into one MESSAGE event when
        #: all of it is buffered (server role).  The glue turns it off while
        #: the connection is blocked by a resource alarm, so that a publish
        #: stops the reading before its content is taken, as RabbitMQ holds
        #: such a publish until the alarm clears (checked on the 3.10 peer)
        self.joinContent = True
        self.heartbeat = 0
        self.channels = {}
        self.state = AWAIT_HEADER if role == SERVER else AWAIT_START
        self._reader = FrameReader(frameMax)
        self.lastReceived = 0.0
        self._lastSend = 0.0
        self._nextBeat = None
        if role == SERVER:
            self.nextEvent = self._nextServerEvent
            # the connection state table: (state, method class) -> handler
            self._table = {
                (AWAIT_START_OK, spec.ConnectionStartOk): self._startOk,
                (AWAIT_TUNE_OK, spec.ConnectionTuneOk): self._tuneOk,
                (AWAIT_OPEN, spec.ConnectionOpen): self._open,
                (OPEN, spec.ConnectionUpdateSecret): self._updateSecret,
                (OPEN, spec.ConnectionBlocked): None,
                (OPEN, spec.ConnectionUnblocked): None,
            }
        else:
            self.nextEvent = self._nextClientEvent

    # --- input -----------------------------------------------------------------

    def receiveData(self, data, now=None):
        """
        Add received bytes; ``now`` (clock seconds) is when, for the
        heartbeat timeout.  Then call :meth:`nextEvent` until it returns None.
        """
        if now is not None:
            self.lastReceived = now
        self._reader.feed(data)

    def buffered(self):
        """Received octets not yet turned into events (int)."""
        return self._reader.buffered()

    def nextEvent(self):
        """
        The next event (a tuple, see the module docstring), or None when
        more bytes are needed.  Raises AMQPError when the peer broke the
        protocol (its ``channel`` names the frame's channel).
        """
        raise LocalProtocolError("replaced per role in __init__")

    def _readHeader(self):
        reader = self._reader
        data = reader.peek()
        if len(data) < 8:
            if not spec.PROTOCOL_HEADER.startswith(data) and not data.startswith(b"AMQP"[: len(data)]):
                reader.clear()
                self.state = CLOSED
                return (BAD_HEADER, data)
            return None
        header = reader.take(8)
        if header not in (spec.PROTOCOL_HEADER, spec.PROTOCOL_HEADER_0_9, spec.PROTOCOL_HEADER_0_9_ALT):
            reader.clear()
            self.state = CLOSED
            return (BAD_HEADER, header)
        return (PROTOCOL_HEADER, header)

    def _nextFrame(self):
        try:
            return self._reader.nextFrame()
        except AMQPError:
            # the rest of the input is not parsed
            self._reader.clear()
            raise

    def _nextServerEvent(self):
        reader = self._reader
        channels = self.channels
        while True:
            state = self.state
            if state is not OPEN:
                if state is AWAIT_HEADER:
                    return self._readHeader()
                if state is CLOSED:
                    return None
            # the hot path parses a frame that is wholly buffered here, over
            # the reader's buffer; FrameReader.nextFrame does the rest
            # (errors, a frame still arriving)
            buf = reader.buffer
            off = reader.offset
            n = len(buf)
            payload = None
            if n - off >= FRAME_HEADER_SIZE:
                ftype, chno, size = _unpack_frameHeader(buf, off)
                start = off + FRAME_HEADER_SIZE
                end = start + size
                if size <= reader.frameMax and end < n and buf[end] == FRAME_END:
                    payload = buf[start:end]
                    reader.offset = end + 1
            if payload is None:
                f = self._nextFrame()
                if f is None:
                    return None
                ftype, chno, payload = f
                size = len(payload)
            if state is not OPEN and state is CLOSING:
                # only connection.close / close-ok matter now; the rest is
                # dropped (rabbit_reader in its 'closed' state)
                if ftype == FRAME_METHOD and chno == 0:
                    ids = payload[:4]
                    if ids == _CONNECTION_CLOSE_PREFIX:
                        # crossing closes: answer, and wait for the peer's
                        # close-ok or for it to drop the socket
                        return (SEND, methodFrame(0, spec.ConnectionCloseOk()))
                    if ids == _CONNECTION_CLOSE_OK_PREFIX:
                        self.state = CLOSED
                        self._reader.clear()
                        return (CONNECTION_CLOSE_OK,)
                continue
            if ftype != FRAME_BODY and ((ftype == FRAME_METHOD and size < 4)
                                        or (ftype == FRAME_HEADER and size < CONTENT_HEADER_MIN_SIZE)
                                        or (ftype == FRAME_HEARTBEAT and size)):
                # too short to name a method / to be a content header, or a
                # heartbeat with a payload: rabbit_reader cannot even
                # analyse it (501, on any channel)
                self._reader.clear()
                raise _unknownFrame(ftype, payload)
            ch = channels.get(chno) if chno else None
            try:
                if ch is not None:
                    # the hot path: frames on an open channel
                    if ftype == FRAME_BODY:
                        if ch.closing:
                            continue
                        parts = ch.bodyParts
                        if parts is None:
                            if ch.pending is not None:
                                raise _unexpectedInContent("content header")
                            raise AMQPError(spec.UNEXPECTED_FRAME,
                                            "expected method frame, got non method frame instead")
                        remaining = ch.remaining = ch.remaining - size
                        if remaining > 0:
                            parts.append(payload)
                            continue
                        if remaining < 0:
                            raise AMQPError(spec.FRAME_ERROR, "content body larger than the size in its header")
                        if parts:
                            parts.append(payload)
                            payload = b"".join(parts)
                        event = (CONTENT, chno, ch.header, payload)
                        ch.pending = ch.header = ch.bodyParts = None
                        return event
                    if ftype == FRAME_METHOD:
                        if ch.pending is None and not ch.closing:
                            ids = payload[:4]
                            if ids == _PUBLISH_PREFIX:
                                return self._publish(ch, payload)
                            if ids == _ACK_PREFIX and size == _ACK_SIZE:
                                return (ACK, chno, _unpack_Q(payload, 4)[0], bool(payload[12] & 1))
                        event = self._channelMethod(ch, payload)
                        if event is None:
                            continue
                        return event
                    if ftype == FRAME_HEADER:
                        if ch.closing:
                            continue
                        if ch.pending is not None and ch.header is None:
                            classId, _, bodySize = _unpack_HHQ(payload, 0)
                            if classId == CLASS_BASIC and 0 < bodySize <= self.maxMessageSize:
                                # the usual header: a body follows
                                ch.header = payload[CONTENT_PROPERTIES_AT:]
                                ch.bodyParts = []
                                ch.remaining = bodySize
                                continue
                        event = self._contentHeader(ch, payload)
                        if event is None:
                            continue
                        return event
                    event = self._otherFrame(ftype, chno, payload)
                else:
                    event = self._otherFrame(ftype, chno, payload)
            except AMQPError as e:
                e.channel = chno
                raise
            if event is not None:
                return event

    def _channelMethod(self, ch, payload):
        classId, methodId = _unpack_HH(payload, 0)
        if ch.closing:
            # we sent channel.close: only close-ok ends it; a crossing
            # channel.close from the peer is answered but the channel stays
            # until our close is acknowledged (rabbit_reader, closing channel)
            if classId == CLASS_CHANNEL:
                if methodId == spec.ChannelCloseOk.METHOD_ID:
                    del self.channels[ch.number]
                    return (CHANNEL_CLOSED, ch.number)
                if methodId == spec.ChannelClose.METHOD_ID:
                    return (SEND, methodFrame(ch.number, spec.ChannelCloseOk()))
            return None
        if ch.pending is not None:
            raise _unexpectedInContent("content header" if ch.header is None else "content body")
        if classId == CLASS_BASIC and methodId == spec.BasicAck.METHOD_ID:
            # the fast path in nextEvent took every basic.publish and every
            # well-formed basic.ack (delivery-tag, 8 octets, and the bits
            # octet) of an open channel with no content pending; what is left
            # here is an ack of the wrong size
            raise _cannotDecode(
                spec.BasicAck, payload[4:],
                FrameSyntaxError("basic.ack of %d octets" % (len(payload) - 4,)),
            )
        cls = spec.METHODS.get((classId, methodId))
        if cls is None:
            raise AMQPError(spec.COMMAND_INVALID, "unknown method class %d method %d" % (classId, methodId))
        if cls not in _CLIENT_CHANNEL_METHODS:
            raise AMQPError(spec.COMMAND_INVALID, "%s not allowed on a channel" % (cls.NAME,), cls)
        m = _decode(cls, payload)
        if "s" in cls.TYPES:
            checkShortStrings(m)
        if cls is spec.ChannelClose:
            del self.channels[ch.number]
            return (CHANNEL_CLOSE, ch.number, m)
        if cls is spec.ChannelCloseOk:
            return None
        if cls is spec.ChannelOpen:
            raise AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen", cls)
        return (METHOD, ch.number, m)

    def _publish(self, ch, payload):
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
            raise _cannotDecode(spec.BasicPublish, payload[4:], FrameSyntaxError("truncated basic.publish")) from None
        if len(payload) != off + 2 + k:
            raise _cannotDecode(
                spec.BasicPublish, payload[4:], FrameSyntaxError("octets after the basic.publish arguments")
            )
        if bits & 2:
            raise AMQPError(spec.NOT_IMPLEMENTED, "immediate=true", spec.BasicPublish)
        # exchange and routing key as the short strings deliveries repeat
        address = payload[6 : off + 1 + k]
        # the usual case: the content header and the one body frame are
        # buffered too, well formed and within the limits: one event for
        # the whole message (anything else takes the frame-by-frame path,
        # with its errors)
        reader = self._reader
        buf = reader.buffer
        o = reader.offset
        n = len(buf)
        if n - o >= _HEADER_FRAME_MIN and self.joinContent:
            ftype, chno, hsize = _unpack_frameHeader(buf, o)
            hstart = o + FRAME_HEADER_SIZE
            hend = hstart + hsize
            if (ftype == FRAME_HEADER and chno == ch.number and CONTENT_HEADER_MIN_SIZE <= hsize <= reader.frameMax
                    and hend < n and buf[hend] == FRAME_END):
                classId, _, bodySize = _unpack_HHQ(buf, hstart)
                if classId == CLASS_BASIC and bodySize <= self.maxMessageSize:
                    if not bodySize:
                        reader.offset = hend + 1
                        return (MESSAGE, chno, exchange, routingKey, bool(bits & 1), address,
                                buf[hstart + CONTENT_PROPERTIES_AT : hend], b"")
                    b = hend + 1
                    if n - b >= FRAME_HEADER_SIZE:
                        ftype, bch, bsize = _unpack_frameHeader(buf, b)
                        bstart = b + FRAME_HEADER_SIZE
                        bend = bstart + bsize
                        if (ftype == FRAME_BODY and bch == chno and bsize == bodySize and bsize <= reader.frameMax
                                and bend < n and buf[bend] == FRAME_END):
                            reader.offset = bend + 1
                            return (MESSAGE, chno, exchange, routingKey, bool(bits & 1), address,
                                    buf[hstart + CONTENT_PROPERTIES_AT : hend], buf[bstart:bend])
        ch.pending = True
        ch.header = None
        return (PUBLISH, ch.number, exchange, routingKey, bool(bits & 1), address)

    def _contentHeader(self, ch, payload):
        """
        Errors: 505 UNEXPECTED_FRAME when no basic.publish awaits its header
        or its body is being read, or for a class other than 60 (RabbitMQ's
        texts); 406 PRECONDITION_FAILED (channel) ``message size N is larger
        than configured max size M``; the closing channel then drops the
        body frames as they arrive, so a header claiming 2^64-1 octets
        buffers nothing.
        """
        if ch.pending is None:
            raise AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        if ch.header is not None:
            raise _unexpectedInContent("content body")
        classId, _, size = _unpack_HHQ(payload, 0)
        if classId != CLASS_BASIC:
            raise AMQPError(
                spec.UNEXPECTED_FRAME,
                "expected content header for class 60, got one for class %d instead" % (classId,),
                spec.BasicPublish,
            )
        if size > self.maxMessageSize:
            ch.reset()
            raise AMQPError(
                spec.PRECONDITION_FAILED,
                "message size %d is larger than configured max size %d" % (size, self.maxMessageSize),
                spec.BasicPublish,
            )
        propsRaw = payload[CONTENT_PROPERTIES_AT:]
        if size == 0:
            ch.pending = None
            return (CONTENT, ch.number, propsRaw, b"")
        ch.header = propsRaw
        ch.bodyParts = []
        ch.remaining = size
        return None

    def _otherFrame(self, ftype, chno, payload):
        if chno == 0:
            if ftype == FRAME_METHOD:
                return self._connectionMethod(payload)
            if ftype == FRAME_HEARTBEAT:
                return None
            if ftype in (FRAME_HEADER, FRAME_BODY):
                # rabbit_reader: content frames on channel 0
                raise AMQPError(spec.UNEXPECTED_FRAME, octetsSnippet("type %d, " % (ftype,), payload))
            raise _unknownFrame(ftype, payload)
        if self.state is not OPEN:
            raise AMQPError(spec.CHANNEL_ERROR, "channel %d used before connection.open" % chno)
        if ftype == FRAME_METHOD:
            return self._openChannel(chno, payload)
        if ftype in (FRAME_HEADER, FRAME_BODY):
            # content frames on a channel that is not open: RabbitMQ's
            # command assembler expects a method first
            raise AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        if ftype == FRAME_HEARTBEAT:
            raise AMQPError(spec.UNEXPECTED_FRAME, octetsSnippet("type 8, ", payload))
        raise _unknownFrame(ftype, payload)

    def _openChannel(self, chno, payload):
        classId, methodId = _unpack_HH(payload, 0)
        if (classId, methodId) != (spec.ChannelOpen.CLASS_ID, spec.ChannelOpen.METHOD_ID):
            raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'", spec.METHODS.get((classId, methodId)))
        # RabbitMQ limits how many channels are open, not the channel number
        if len(self.channels) >= self.channelMax:
            raise AMQPError(
                spec.NOT_ALLOWED,
                "number of channels opened (%d) has reached the negotiated channel_max (%d)"
                % (len(self.channels), self.channelMax),
            )
        self.channels[chno] = ChannelEngine(chno)
        return (CHANNEL_OPEN, chno)

    def _connectionMethod(self, payload):
        classId, methodId = _unpack_HH(payload, 0)
        cls = spec.METHODS.get((classId, methodId))
        if cls is None:
            raise AMQPError(spec.COMMAND_INVALID, "unknown method class %d method %d" % (classId, methodId))
        m = _decode(cls, payload)
        if cls is spec.ConnectionClose:
            self._enterClosing()
            return (CONNECTION_CLOSE, m)
        key = (self.state, cls)
        if key not in self._table:
            raise AMQPError(
                spec.CHANNEL_ERROR,
                "unexpected method in connection state %s" % (_STATE_NAMES.get(self.state, "running"),),
                cls,
            )
        handler = self._table[key]
        if handler is None:
            return None
        return handler(m)

    def _startOk(self, m):
        return (START_OK, m)

    def _tuneOk(self, m):
        fmax = m.frame_max or self.proposedFrameMax
        if fmax < spec.FRAME_MIN_SIZE:
            raise AMQPError(spec.NOT_ALLOWED, "frame_max=%d < %d min size" % (fmax, spec.FRAME_MIN_SIZE))
        if fmax > self.proposedFrameMax:
            raise AMQPError(spec.NOT_ALLOWED, "frame_max=%d > %d max size" % (fmax, self.proposedFrameMax))
        cmax = m.channel_max or self.proposedChannelMax or 65535
        if self.proposedChannelMax and cmax > self.proposedChannelMax:
            raise AMQPError(
                spec.NOT_ALLOWED, "channel_max=%d > %d max size" % (cmax, self.proposedChannelMax)
            )
        self.frameMax = self._reader.frameMax = fmax
        self.channelMax = cmax
        self.heartbeat = m.heartbeat
        self.state = AWAIT_OPEN
        return (TUNE_OK, m)

    def _open(self, m):
        return (OPEN_CONNECTION, m)

    def _updateSecret(self, m):
        return (SEND, methodFrame(0, spec.ConnectionUpdateSecretOk()))

    # --- client role input ---------------------------------------------------------

    def _nextClientEvent(self):
        reader = self._reader
        channels = self.channels
        while True:
            if reader.peek()[:4] == b"AMQP":
                header = reader.take(8)
                if header is None:
                    return None
                return (PROTOCOL_HEADER, header)
            f = self._nextFrame()
            if f is None:
                return None
            ftype, chno, payload = f
            if ftype == FRAME_METHOD:
                cls = spec.METHODS.get(_unpack_HH(payload, 0))
                if cls is None:
                    raise AMQPError(spec.COMMAND_INVALID, "unknown method %r" % (payload[:4],))
                m = _decode(cls, payload)
                if cls.CONTENT:
                    ch = channels.get(chno)
                    if ch is None:
                        ch = channels[chno] = ChannelEngine(chno)
                    ch.reset()
                    ch.pending = m
                    continue
                self._clientTransition(cls)
                return (METHOD, chno, m)
            if ftype == FRAME_HEADER:
                ch = channels.get(chno)
                if ch is None or ch.pending is None:
                    raise AMQPError(spec.UNEXPECTED_FRAME, "content header without a method")
                size = _unpack_HHQ(payload, 0)[2]
                if size == 0:
                    m = ch.pending
                    ch.reset()
                    return (CONTENT, chno, m, payload[CONTENT_PROPERTIES_AT:], b"")
                ch.header = payload[CONTENT_PROPERTIES_AT:]
                ch.bodyParts = []
                ch.remaining = size
                continue
            if ftype == FRAME_BODY:
                ch = channels.get(chno)
                if ch is None or ch.bodyParts is None:
                    raise AMQPError(spec.UNEXPECTED_FRAME, "content body without a header")
                ch.bodyParts.append(payload)
                ch.remaining -= len(payload)
                if ch.remaining <= 0:
                    event = (CONTENT, chno, ch.pending, ch.header, b"".join(ch.bodyParts))
                    ch.reset()
                    return event
                continue
            if ftype == FRAME_HEARTBEAT:
                return (HEARTBEAT, chno)
            raise _unknownFrame(ftype, payload)

    def _clientTransition(self, cls):
        """The client's connection states follow what the server sent (leniently: a test client)."""
        if cls is spec.ConnectionStart:
            self.state = AWAIT_TUNE
        elif cls is spec.ConnectionTune:
            self.state = AWAIT_OPEN_OK
        elif cls is spec.ConnectionOpenOk:
            self.state = OPEN
        elif cls is spec.ConnectionClose:
            self.state = CLOSING
        elif cls is spec.ConnectionCloseOk:
            self.state = CLOSED

    # --- server role: answers ---------------------------------------------------------

    def _expect(self, role, *states):
        if self.role != role or self.state not in states:
            raise LocalProtocolError("not allowed as %s in state %s" % (self.role, self.state))

    def start(self, serverProperties, mechanisms=MECHANISMS, locales=b"en_US"):
        """
        connection.start (bytes) after the peer's protocol header;
        ``serverProperties`` a dict.  The engine then awaits start-ok.
        """
        self._expect(SERVER, AWAIT_HEADER)
        self.state = AWAIT_START_OK
        return methodFrame(0, spec.ConnectionStart(0, 9, serverProperties, mechanisms, locales))

    def tune(self):
        """connection.tune (bytes) proposing our channel_max, frame_max and the heartbeat given at start."""
        self._expect(SERVER, AWAIT_START_OK)
        self.state = AWAIT_TUNE_OK
        return methodFrame(
            0, spec.ConnectionTune(self.proposedChannelMax, self.proposedFrameMax, self.proposedHeartbeat)
        )

    def openOk(self):
        """connection.open-ok (bytes); the connection is open."""
        self._expect(SERVER, AWAIT_OPEN)
        self.state = OPEN
        return methodFrame(0, spec.ConnectionOpenOk(""))

    def closeConnection(self, code, text, method=None):
        """
        connection.close (bytes) for ``code`` / ``text`` (``method``: the
        method class that caused it, or None), or None when already closing.
        The engine then only answers a crossing close and waits for close-ok.
        """
        if self.state in (CLOSING, CLOSED):
            return None
        self._enterClosing()
        return methodFrame(
            0,
            spec.ConnectionClose(
                code, text, method.CLASS_ID if method is not None else 0, method.METHOD_ID if method is not None else 0
            ),
        )

    def _enterClosing(self):
        self.state = CLOSING
        self.channels = {}
        self._nextBeat = None

    def closeOk(self):
        """connection.close-ok (bytes) for the peer's close, or None when no longer closing."""
        if self.state is not CLOSING:
            return None
        return methodFrame(0, spec.ConnectionCloseOk())

    def connectionLost(self):
        """The transport is gone: nothing more is read."""
        self.state = CLOSED
        self.channels = {}
        self._nextBeat = None
        self._reader.clear()

    # --- channels -------------------------------------------------------------------

    def channelOpenOk(self, number):
        """channel.open-ok (bytes) for channel ``number``."""
        return methodFrame(number, spec.ChannelOpenOk(b""))

    def channelCloseOk(self, number):
        """channel.close-ok (bytes) for the peer's channel.close on ``number``."""
        return methodFrame(number, spec.ChannelCloseOk())

    def closeChannel(self, number, code, text, method=None):
        """
        channel.close (bytes) for ``code`` / ``text`` (``method``: the
        method class that caused it, or None), or None when the channel is
        not open or already closing.  The channel then drops every frame
        but close-ok (ends it, :data:`CHANNEL_CLOSED`) and channel.close
        (answered with close-ok).
        """
        ch = self.channels.get(number)
        if ch is None or ch.closing:
            return None
        ch.reset()
        ch.closing = True
        return methodFrame(
            number,
            spec.ChannelClose(
                code, text, method.CLASS_ID if method is not None else 0, method.METHOD_ID if method is not None else 0
            ),
        )

    # --- heartbeats -------------------------------------------------------------------

    def startHeartbeat(self, now):
        """
        Arm the heartbeat checks (after tune-ok, when ``heartbeat`` > 0):
        every half interval, like RabbitMQ; ``now`` in clock seconds.
        """
        if self.heartbeat:
            self._nextBeat = now + self.heartbeat / 2.0

    def nextDeadline(self):
        """Clock seconds at which :meth:`tick` is due, or None (no heartbeat, or closing)."""
        return self._nextBeat

    def tick(self, now, sent=False, readPaused=False):
        """
        The heartbeat check at ``now`` (clock seconds).  ``sent``: we wrote
        something since the last tick; ``readPaused``: we are not reading
        (blocked by a resource alarm: as RabbitMQ's
        ``rabbit_heartbeat:pause_monitor``, not timed out).

        Returns :data:`TIMED_OUT` when nothing was received for twice the
        heartbeat interval (drop the connection), ``HEARTBEAT_FRAME`` bytes
        to send when nothing was sent for a while, else None.
        """
        if self._nextBeat is None:
            return None
        self._nextBeat = now + self.heartbeat / 2.0
        if readPaused:
            self.lastReceived = now
        if now - self.lastReceived > 2 * self.heartbeat:
            self._nextBeat = None
            self.state = CLOSED
            return TIMED_OUT
        if not sent or now - self._lastSend >= self.heartbeat:
            self._lastSend = now
            return HEARTBEAT_FRAME
        return None

    # --- encoders -----------------------------------------------------------------------

    def method(self, number, method):
        """A method frame (bytes) for ``method`` on channel ``number``."""
        return methodFrame(number, method)

    def deliver(self, number, consumerTagBytes, deliveryTag, redelivered, address, header, body):
        """
        basic.deliver with its content (bytes), built by hand (hot path).

        :param consumerTagBytes: the consumer tag as an encoded shortstr
            (length octet included).
        :param address: exchange and routing key as two encoded shortstrs.
        :param header: the content header payload (class, weight, size,
            property flags and list) as bytes.
        :param body: bytes, split by the negotiated frame_max.
        """
        size = len(body)
        if not 0 < size <= self.frameMax - FRAME_OVERHEAD:
            payload = b"".join(
                (_DELIVER_PREFIX, consumerTagBytes, _pack_Q(deliveryTag), b"\x01" if redelivered else b"\x00",
                 address)
            )
            return contentFrames(number, payload, header, body, self.frameMax)
        # the hot path: one body frame, built in one join.  b"\xce" is
        # frames.FRAME_END_OCTET, written as a literal on purpose: the name
        # (a global load each) cost ~80 instructions/message under callgrind
        return b"".join((
            packFrameHeader(FRAME_METHOD, number, _DELIVER_FIXED_SIZE + len(consumerTagBytes) + len(address)),
            _DELIVER_PREFIX, consumerTagBytes, _pack_Q(deliveryTag), b"\x01" if redelivered else b"\x00",
            address, b"\xce",
            packFrameHeader(FRAME_HEADER, number, len(header)), header, b"\xce",
            packFrameHeader(FRAME_BODY, number, size), body, b"\xce",
        ))

    def getOk(self, number, deliveryTag, redelivered, address, messageCount, header, body):
        """basic.get-ok with its content (bytes); ``messageCount``: messages left in the queue."""
        payload = b"".join(
            (_GET_OK_PREFIX, _pack_Q(deliveryTag), b"\x01" if redelivered else b"\x00", address,
             _pack_I(messageCount))
        )
        return contentFrames(number, payload, header, body, self.frameMax)

    def basicReturn(self, number, replyCode, replyText, exchange, routingKey, header, body):
        """basic.return with its content (bytes)."""
        payload = spec.BasicReturn(replyCode, replyText, exchange, routingKey).encode()
        return contentFrames(number, payload, header, body, self.frameMax)

    def confirms(self, number, confirms):
        """
        Publisher confirms (bytes) for ``confirms``, a list of ``(seq, ok)``
        in seq order: runs of acks collapse into one ``basic.ack
        multiple=true`` (every earlier publish is already settled: confirms
        go out in order); a nack is ``multiple=false, requeue=false``.
        """
        header = packFrameHeader(FRAME_METHOD, number, _ACK_SIZE)
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
            out.append(header + _ACK_PREFIX + _pack_Q(runEnd) + (b"\x01\xce" if len(confirms) > 1 else b"\x00\xce"))
        return out[0] if len(out) == 1 else b"".join(out)

    def publish(self, number, exchange, routingKey, propsRaw, body, mandatory=False):
        """
        basic.publish with its content (bytes; client role): ``propsRaw``
        the encoded property flags and list, ``body`` split by frame_max.
        """
        payload = spec.BasicPublish(0, exchange, routingKey, mandatory, False).encode()
        header = struct.pack("!HHQ", CLASS_BASIC, 0, len(body)) + propsRaw
        return contentFrames(number, payload, header, body, self.frameMax)
