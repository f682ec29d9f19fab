"""
AMQP 0-9-1 framing (spec section 4.2.3): ``type:octet channel:short
size:long payload frame-end(0xCE)``, the frame encoders and
:class:`FrameReader`, the offset parser over received bytes.

No Twisted, no broker: bytes in, ``(type, channel, payload)`` out.  Errors
in the framing itself are connection-level 501 FRAME_ERROR with RabbitMQ's
texts (``rabbit_reader.erl``), raised as
:class:`~otter_tx.amqp.errors.AMQPError`.
"""

import struct

from otter_tx.amqp import spec
from otter_tx.amqp.errors import AMQPError, octetsSnippet

from otter_tx.amqp.spec import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD  # noqa: F401

#: octets before a frame's payload: type (1), channel (2), payload size (4)
FRAME_HEADER_SIZE = 7
#: octets of a frame besides its payload: the header and the end octet
FRAME_OVERHEAD = FRAME_HEADER_SIZE + 1
#: the frame-end octet (:data:`~otter_tx.amqp.spec.FRAME_END`) as bytes, ``b"\xce"``
FRAME_END_OCTET = bytes((FRAME_END,))
#: the smallest content header payload: class id (2), weight (2), body size
#: (8), property flags (2)
CONTENT_HEADER_MIN_SIZE = 14
#: where a content header payload's property flags, then property list (the
#: publisher's property bytes), start
CONTENT_PROPERTIES_AT = 12

#: the heartbeat frame (type 8 on channel 0, empty payload)
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_frameHeader = struct.Struct("!BHI")
unpackFrameHeader = _frameHeader.unpack_from
#: ``packFrameHeader(type, channel, size)``: the 7 octets before a payload
packFrameHeader = _frameHeader.pack


def frame(frameType, channel, payload):
    """One wire frame (bytes) of ``frameType`` on ``channel`` carrying ``payload`` (bytes)."""
    return _frameHeader.pack(frameType, channel, len(payload)) + payload + FRAME_END_OCTET


def methodFrame(channel, method):
    """A method frame (bytes) for ``method`` (a :class:`otter_tx.amqp.spec.Method`)."""
    return frame(FRAME_METHOD, channel, method.encode())


def contentFrames(channel, methodPayload, header, body, frameMax):
    """
    A content-bearing method as bytes: the method frame for the encoded
    ``methodPayload``, the content header frame (``header``: class, weight,
    body size and properties, bytes) and ``body`` (bytes) split in body
    frames of at most ``frameMax - FRAME_OVERHEAD`` octets (none for an empty body).
    """
    pack = _frameHeader.pack
    end = FRAME_END_OCTET
    parts = [
        pack(FRAME_METHOD, channel, len(methodPayload)),
        methodPayload,
        end,
        pack(FRAME_HEADER, channel, len(header)),
        header,
        end,
    ]
    size = len(body)
    if size:
        chunk = frameMax - FRAME_OVERHEAD
        if size <= chunk:
            parts.append(pack(FRAME_BODY, channel, size))
            parts.append(body)
            parts.append(end)
        else:
            for i in range(0, size, chunk):
                piece = body[i : i + chunk]
                parts.append(pack(FRAME_BODY, channel, len(piece)))
                parts.append(piece)
                parts.append(end)
    return b"".join(parts)


class FrameReader:
    """
    Frames out of a byte stream, parsed with an offset over the received
    buffer (no copy per frame, no quadratic ``buf + data``): a frame larger
    than what is buffered is gathered in a list and joined once, when its
    last octet has arrived.

    :ivar frameMax: the largest frame (bytes, header and end octet
        included) accepted; a header announcing a larger payload is refused
        as soon as it arrives.
    :ivar buffer: received octets (bytes); those from ``offset`` on are not
        yet returned as frames, and a frame, when one is buffered, starts
        at ``offset``.  Empty while a frame larger than 64 KiB is being
        gathered.  Read-only for callers.
    :ivar offset: index (int) in ``buffer`` of the first octet not yet
        returned.  A caller may parse a frame in place (the engine's hot
        path parses the usual wholly buffered frames without a call per
        frame): having checked the whole frame, end octet included, it sets
        ``offset`` just past that end octet, and takes anything else
        through :meth:`nextFrame`.
    """

    def __init__(self, frameMax):
        self.frameMax = frameMax
        self.buffer = b""
        self.offset = 0
        self._parts = None  # [bytes] gathering one large frame
        self._partsLen = 0
        self._need = 0

    def feed(self, data):
        """Add received ``data`` (bytes)."""
        parts = self._parts
        if parts is not None:
            parts.append(data)
            self._partsLen += len(data)
            if self._partsLen >= self._need:
                self.buffer = b"".join(parts)
                self.offset = 0
                self._parts = None
            return
        off = self.offset
        if off == len(self.buffer):
            self.buffer = data
        else:
            # the unparsed rest is less than one frame
            self.buffer = self.buffer[off:] + data
        self.offset = 0

    def buffered(self):
        """Octets received and not yet returned as frames (int)."""
        if self._parts is not None:
            return self._partsLen
        return len(self.buffer) - self.offset

    def take(self, n):
        """
        The next ``n`` unparsed octets (bytes), consumed, or None when fewer
        are buffered (the protocol header, before any frame).
        """
        if self._parts is not None:
            self.feed(b"")
        if self._parts is not None or len(self.buffer) - self.offset < n:
            return None
        off = self.offset
        self.offset = off + n
        return self.buffer[off : off + n]

    def peek(self):
        """Every unparsed octet buffered (bytes), not consumed."""
        if self._parts is not None:
            return b"".join(self._parts)
        return self.buffer[self.offset :]

    def clear(self):
        """Drop everything buffered (after a fatal error: the rest is not parsed)."""
        self.buffer = b""
        self.offset = 0
        self._parts = None

    def nextFrame(self):
        """
        The next complete frame as ``(type, channel, payload)``, or None when
        more bytes are needed.

        Errors (connection-level 501, RabbitMQ's texts): ``{frame_too_large,
        Size, FrameMax - 8}`` when the header announces more than
        ``frameMax`` (RabbitMQ lets up to ``frameMax`` through but names
        ``frameMax - 8`` as the limit), ``{invalid_frame_end_marker, N}``.
        """
        buf = self.buffer
        off = self.offset
        n = len(buf)
        if n - off < FRAME_HEADER_SIZE:
            return None
        ftype, chno, size = _frameHeader.unpack_from(buf, off)
        if size > self.frameMax:
            raise AMQPError(
                spec.FRAME_ERROR,
                "type %d, all octets = <<>>: {frame_too_large,%d,%d}" % (ftype, size, self.frameMax - FRAME_OVERHEAD),
            )
        end = off + FRAME_HEADER_SIZE + size
        if end >= n:
            if size > 65536:
                # gather a large frame in a list, joined once complete
                self._parts = [buf[off:]]
                self._partsLen = n - off
                self._need = size + FRAME_OVERHEAD
                self.buffer = b""
                self.offset = 0
            return None
        if buf[end] != FRAME_END:
            raise AMQPError(
                spec.FRAME_ERROR,
                "%s: {invalid_frame_end_marker,%d}"
                % (octetsSnippet("type %d, " % (ftype,), buf[off + FRAME_HEADER_SIZE : end]), buf[end]),
            )
        self.offset = end + 1
        return ftype, chno, buf[off + FRAME_HEADER_SIZE : end]
