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

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE

#: the heartbeat frame (type 8 on channel 0, empty payload)
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_frameHeader = struct.Struct("!BHI")
unpackFrameHeader = _frameHeader.unpack_from
#: ``packFrameHeader(type, channel, size)``: the 7 octets before a payload
packFrameHeader = _frameHeader.pack


def frame(frameType, channel, payload):
    """One wire frame (bytes) of ``frameType`` on ``channel`` carrying ``payload`` (bytes)."""
    return _frameHeader.pack(frameType, channel, len(payload)) + payload + b"\xce"


def methodFrame(channel, method):
    """A method frame (bytes) for ``method`` (a :class:`otter_tx.amqp.spec.Method`)."""
    return frame(FRAME_METHOD, channel, method.encode())


def contentFrames(channel, methodPayload, header, body, frameMax):
    """
    A content-bearing method as bytes: the method frame for the encoded
    ``methodPayload``, the content header frame (``header``: class, weight,
    body size and properties, bytes) and ``body`` (bytes) split in body
    frames of at most ``frameMax - 8`` octets (none for an empty body).
    """
    pack = _frameHeader.pack
    parts = [
        pack(1, channel, len(methodPayload)),
        methodPayload,
        b"\xce",
        pack(2, channel, len(header)),
        header,
        b"\xce",
    ]
    size = len(body)
    if size:
        chunk = frameMax - 8
        if size <= chunk:
            parts.append(pack(3, channel, size))
            parts.append(body)
            parts.append(b"\xce")
        else:
            for i in range(0, size, chunk):
                piece = body[i : i + chunk]
                parts.append(pack(3, channel, len(piece)))
                parts.append(piece)
                parts.append(b"\xce")
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
    """

    def __init__(self, frameMax):
        self.frameMax = frameMax
        self._buf = b""
        self._off = 0
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
                self._buf = b"".join(parts)
                self._off = 0
                self._parts = None
            return
        off = self._off
        if off == len(self._buf):
            self._buf = data
        else:
            # the unparsed rest is less than one frame
            self._buf = self._buf[off:] + data
        self._off = 0

    def buffered(self):
        """Octets received and not yet returned as frames (int)."""
        if self._parts is not None:
            return self._partsLen
        return len(self._buf) - self._off

    def take(self, n):
        """
        The next ``n`` unparsed octets (bytes), consumed, or None when fewer
        are buffered (the protocol header, before any frame).
        """
        if self._parts is not None:
            self.feed(b"")
        if self._parts is not None or len(self._buf) - self._off < n:
            return None
        off = self._off
        self._off = off + n
        return self._buf[off : off + n]

    def peek(self):
        """Every unparsed octet buffered (bytes), not consumed."""
        if self._parts is not None:
            return b"".join(self._parts)
        return self._buf[self._off :]

    def clear(self):
        """Drop everything buffered (after a fatal error: the rest is not parsed)."""
        self._buf = b""
        self._off = 0
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
        buf = self._buf
        off = self._off
        n = len(buf)
        if n - off < 7:
            return None
        ftype, chno, size = _frameHeader.unpack_from(buf, off)
        if size > self.frameMax:
            raise AMQPError(
                spec.FRAME_ERROR,
                "type %d, all octets = <<>>: {frame_too_large,%d,%d}" % (ftype, size, self.frameMax - 8),
            )
        end = off + 7 + size
        if end >= n:
            if size > 65536:
                # gather a large frame in a list, joined once complete
                self._parts = [buf[off:]]
                self._partsLen = n - off
                self._need = size + 8
                self._buf = b""
                self._off = 0
            return None
        if buf[end] != 0xCE:
            raise AMQPError(
                spec.FRAME_ERROR,
                "%s: {invalid_frame_end_marker,%d}" % (octetsSnippet("type %d, " % (ftype,), buf[off + 7 : end]), buf[end]),
            )
        self._off = end + 1
        return ftype, chno, buf[off + 7 : end]
