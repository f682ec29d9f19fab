"""
AMQP 1.0 message encoding, as far as streams need it: stream-protocol clients
publish and read messages as AMQP 1.0 bare messages (sections: header,
message-annotations, properties, application-properties, data, ...).

:func:`fromAmqp091` and :func:`toAmqp091` are RabbitMQ 3.10's conversions
(rabbit_msg_record:from_amqp091/to_amqp091): a message published over
AMQP 0-9-1 to a stream is stored as AMQP 1.0 and read back the same way.

Pure (no Twisted, no broker): values decode to Python values, with
:class:`Typed` keeping an AMQP 1.0 type where a plain value would lose it.
"""

import struct
import uuid

from otter_tx.amqp.codec import ByteArray, TaggedFloat, TaggedInt, Timestamp


class DecodeError(Exception):
    """Bytes that are not an AMQP 1.0 message."""


class Typed:
    """A value with its AMQP 1.0 type name (``ubyte``, ``symbol``, ``timestamp``, ...)."""

    __slots__ = ("type", "value")

    def __init__(self, type_, value):
        self.type = type_
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Typed) and (self.type, self.value) == (other.type, other.value)

    def __hash__(self):
        return hash((self.type, self.value))

    def __repr__(self):
        return "Typed(%r, %r)" % (self.type, self.value)


class Described:
    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor, value):
        self.descriptor = descriptor
        self.value = value

    def __repr__(self):
        return "Described(%r, %r)" % (self.descriptor, self.value)


# section descriptors
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_FIXED = {
    0x50: ("ubyte", 1, struct.Struct(">B")),
    0x51: ("byte", 1, struct.Struct(">b")),
    0x60: ("ushort", 2, struct.Struct(">H")),
    0x61: ("short", 2, struct.Struct(">h")),
    0x70: ("uint", 4, struct.Struct(">I")),
    0x71: ("int", 4, struct.Struct(">i")),
    0x72: ("float", 4, struct.Struct(">f")),
    0x73: ("char", 4, struct.Struct(">I")),
    0x80: ("ulong", 8, struct.Struct(">Q")),
    0x81: ("long", 8, struct.Struct(">q")),
    0x82: ("double", 8, struct.Struct(">d")),
    0x83: ("timestamp", 8, struct.Struct(">q")),
    0x52: ("uint", 1, struct.Struct(">B")),
    0x53: ("ulong", 1, struct.Struct(">B")),
    0x54: ("int", 1, struct.Struct(">b")),
    0x55: ("long", 1, struct.Struct(">b")),
}


def _decode(b, p, ctor=None):
    if ctor is None:
        if p >= len(b):
            raise DecodeError("short value")
        ctor = b[p]
        p += 1
    if ctor == 0x00:
        desc, p = _decode(b, p)
        val, p = _decode(b, p)
        return Described(desc, val), p
    if ctor == 0x40:
        return None, p
    if ctor == 0x41:
        return True, p
    if ctor == 0x42:
        return False, p
    if ctor == 0x56:
        return b[p] != 0, p + 1
    if ctor == 0x43:
        return Typed("uint", 0), p
    if ctor == 0x44:
        return Typed("ulong", 0), p
    if ctor == 0x45:
        return [], p
    f = _FIXED.get(ctor)
    if f is not None:
        name, size, st = f
        try:
            (v,) = st.unpack_from(b, p)
        except struct.error:
            raise DecodeError("short value") from None
        return Typed(name, v), p + size
    if ctor == 0x98:
        return Typed("uuid", uuid.UUID(bytes=bytes(b[p:p + 16]))), p + 16
    if ctor in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        if ctor & 0x10:
            (n,) = struct.unpack_from(">I", b, p)
            p += 4
        else:
            n = b[p]
            p += 1
        raw = bytes(b[p:p + n])
        if len(raw) != n:
            raise DecodeError("short value")
        p += n
        low = ctor & 0x0F
        if low == 0:
            return raw, p
        if low == 1:
            return raw.decode("utf-8", "surrogateescape"), p
        return Typed("symbol", raw.decode("ascii", "replace")), p
    if ctor in (0xC0, 0xC1, 0xD0, 0xD1):
        if ctor & 0x10:
            size, count = struct.unpack_from(">II", b, p)
            p += 8
        else:
            size, count = b[p], b[p + 1]
            p += 2
        items = []
        for _ in range(count):
            v, p = _decode(b, p)
            items.append(v)
        if ctor & 1:
            return dict(zip(items[0::2], items[1::2])), p
        return items, p
    if ctor in (0xE0, 0xF0):
        if ctor & 0x10:
            size, count = struct.unpack_from(">II", b, p)
            p += 8
        else:
            size, count = b[p], b[p + 1]
            p += 2
        elem = b[p]
        p += 1
        items = []
        for _ in range(count):
            v, p = _decode(b, p, elem)
            items.append(v)
        return items, p
    raise DecodeError("unknown constructor 0x%02x" % ctor)


def decodeSections(data):
    """The message's sections as a list of ``(descriptorCode, value)``."""
    out = []
    p = 0
    n = len(data)
    try:
        while p < n:
            v, p = _decode(data, p)
            if not isinstance(v, Described):
                raise DecodeError("not a section")
            d = v.descriptor
            code = d.value if isinstance(d, Typed) else d
            out.append((code, v.value))
    except (IndexError, struct.error):
        raise DecodeError("short message") from None
    return out


# --- encoding


def _encStr(s, small, large):
    b = s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s
    if len(b) < 256:
        return bytes((small, len(b))) + b
    return bytes((large,)) + struct.pack(">I", len(b)) + b


def _encTyped(t, v):
    # the compact forms RabbitMQ's amqp10_binary_generator picks
    if t == "ubyte":
        return b"\x50" + struct.pack(">B", v)
    if t == "byte":
        return b"\x51" + struct.pack(">b", v)
    if t == "ushort":
        return b"\x60" + struct.pack(">H", v)
    if t == "short":
        return b"\x61" + struct.pack(">h", v)
    if t == "uint":
        if v == 0:
            return b"\x43"
        if v < 256:
            return b"\x52" + bytes((v,))
        return b"\x70" + struct.pack(">I", v)
    if t == "int":
        if -128 <= v < 128:
            return b"\x54" + struct.pack(">b", v)
        return b"\x71" + struct.pack(">i", v)
    if t == "ulong":
        if v == 0:
            return b"\x44"
        if v < 256:
            return b"\x53" + bytes((v,))
        return b"\x80" + struct.pack(">Q", v)
    if t == "long":
        if -128 <= v < 128:
            return b"\x55" + struct.pack(">b", v)
        return b"\x81" + struct.pack(">q", v)
    if t == "boolean":
        return b"\x56\x01" if v else b"\x56\x00"
    if t == "float":
        return b"\x72" + struct.pack(">f", v)
    if t == "double":
        return b"\x82" + struct.pack(">d", v)
    if t == "timestamp":
        return b"\x83" + struct.pack(">q", v)
    if t == "symbol":
        return _encStr(v.encode("ascii", "replace") if isinstance(v, str) else v, 0xA3, 0xB3)
    if t == "uuid":
        return b"\x98" + v.bytes
    if t == "char":
        return b"\x73" + struct.pack(">I", v)
    raise ValueError(t)


def encodeValue(v):
    if v is None:
        return b"\x40"
    if v is True:
        return b"\x41"
    if v is False:
        return b"\x42"
    if isinstance(v, Typed):
        return _encTyped(v.type, v.value)
    if isinstance(v, str):
        return _encStr(v, 0xA1, 0xB1)
    if isinstance(v, (bytes, bytearray)):
        return _encStr(bytes(v), 0xA0, 0xB0)
    if isinstance(v, int):
        return _encTyped("long", v)
    if isinstance(v, float):
        return _encTyped("double", v)
    if isinstance(v, dict):
        body = b"".join(encodeValue(k) + encodeValue(x) for k, x in v.items())
        return _compound(0xC1, 0xD1, body, 2 * len(v))
    if isinstance(v, (list, tuple)):
        body = b"".join(encodeValue(x) for x in v)
        if not v:
            return b"\x45"
        return _compound(0xC0, 0xD0, body, len(v))
    if isinstance(v, Described):
        return b"\x00" + encodeValue(v.descriptor) + encodeValue(v.value)
    raise ValueError("cannot encode %r" % (v,))


def _compound(small, large, body, count):
    if len(body) + 1 < 256 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return bytes((large,)) + struct.pack(">II", len(body) + 4, count) + body


def section(code, value):
    return b"\x00\x53" + bytes((code,)) + encodeValue(value)


def dataSection(body):
    return b"\x00\x53\x75" + _encStr(body, 0xA0, 0xB0)


def encodeMessage(body, properties=None, applicationProperties=None, messageAnnotations=None,
                  header=None):
    """
    A bare message: optional sections and one data section. ``properties`` is
    a dict by AMQP 1.0 field name (message_id, user_id, to, subject, reply_to,
    correlation_id, content_type, content_encoding, absolute_expiry_time,
    creation_time, group_id, group_sequence, reply_to_group_id).
    """
    parts = []
    if header:
        parts.append(section(HEADER, header))
    if messageAnnotations:
        parts.append(section(MESSAGE_ANNOTATIONS, messageAnnotations))
    if properties:
        # all 13 fields, as RabbitMQ writes them
        parts.append(section(PROPERTIES, [properties.get(n) for n in PROPERTY_FIELDS]))
    if applicationProperties:
        parts.append(section(APPLICATION_PROPERTIES, applicationProperties))
    parts.append(dataSection(body))
    return b"".join(parts)


PROPERTY_FIELDS = (
    "message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
    "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
    "reply_to_group_id",
)


# --- RabbitMQ 3.10's AMQP 0-9-1 <-> AMQP 1.0 conversion


def _headerTo10(v):
    """A 0-9-1 header value as rabbit_msg_record:from_091 maps it (or ``_SKIP``)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return Typed("boolean", v)
    if isinstance(v, TaggedInt):
        return Typed({"b": "byte", "B": "ubyte", "s": "short", "u": "ushort", "i": "uint",
                      "l": "long"}[v.tag], int(v))
    if isinstance(v, Timestamp):
        return Typed("timestamp", int(v) * 1000)
    if isinstance(v, int):
        if -2 ** 31 <= v < 2 ** 31:
            return Typed("int", v)
        return Typed("long", v)
    if isinstance(v, TaggedFloat):
        return Typed("float", float(v))
    if isinstance(v, float):
        return Typed("double", v)
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, ByteArray)):
        return bytes(v)
    return _SKIP


_SKIP = object()


def onlyData(data):
    """The body of a message that is one data section and nothing else, else None (a fast path)."""
    if data[:3] != b"\x00\x53\x75":
        return None
    c = data[3:4]
    if c == b"\xa0" and len(data) >= 5 and len(data) == 5 + data[4]:
        return data[5:]
    if c == b"\xb0" and len(data) >= 8 and len(data) == 8 + struct.unpack_from(">I", data, 4)[0]:
        return data[8:]
    return None


_ANNOTATIONS = {}


def _addressAnnotations(exchange, routingKey):
    """The message-annotations section of a message without properties (cached per address)."""
    key = (exchange, routingKey)
    b = _ANNOTATIONS.get(key)
    if b is None:
        if len(_ANNOTATIONS) > 1024:
            _ANNOTATIONS.clear()
        b = _ANNOTATIONS[key] = section(MESSAGE_ANNOTATIONS, {Typed("symbol", "x-routing-key"): routingKey,
                                                              Typed("symbol", "x-exchange"): exchange})
    return b


def fromAmqp091(props, body, exchange=None, routingKey=None):
    """
    The AMQP 1.0 bytes RabbitMQ 3.10 stores in a stream for an AMQP 0-9-1
    message with properties ``props`` (otter_tx codec names) and ``body``
    published to ``exchange`` with ``routingKey`` (message annotations
    x-routing-key and x-exchange, first, as rabbit_stream_queue adds them;
    None: left out). Checked byte for byte against RabbitMQ 3.10.
    """
    if not props and exchange is not None and routingKey is not None:
        return _addressAnnotations(exchange, routingKey) + dataSection(body)
    p = {}
    ma = {}
    if routingKey is not None:
        ma[Typed("symbol", "x-routing-key")] = routingKey
    if exchange is not None:
        ma[Typed("symbol", "x-exchange")] = exchange
    ap = {}
    if props:
        g = props.get
        if g("message_id") is not None:
            p["message_id"] = g("message_id")
        if g("user_id") is not None:
            p["user_id"] = g("user_id").encode("utf-8", "surrogateescape")
        if g("reply_to") is not None:
            p["reply_to"] = g("reply_to")
        if g("correlation_id") is not None:
            p["correlation_id"] = g("correlation_id")
        if g("content_type") is not None:
            p["content_type"] = Typed("symbol", g("content_type"))
        if g("content_encoding") is not None:
            p["content_encoding"] = Typed("symbol", g("content_encoding"))
        if g("timestamp") is not None:
            p["creation_time"] = Typed("timestamp", int(g("timestamp")) * 1000)
        if g("type") is not None:
            ap["x-basic-type"] = g("type")
        if g("app_id") is not None:
            ap["x-basic-app-id"] = g("app_id")
        for k, v in (g("headers") or {}).items():
            c = _headerTo10(v)
            if c is not _SKIP:
                ap[k] = c
        if g("priority") is not None:
            ma[Typed("symbol", "x-basic-priority")] = Typed("ubyte", g("priority"))
        if g("delivery_mode") is not None:
            ma[Typed("symbol", "x-basic-delivery-mode")] = Typed("ubyte", g("delivery_mode"))
        if g("expiration") is not None:
            ma[Typed("symbol", "x-basic-expiration")] = g("expiration")
    return encodeMessage(body, properties=p or None, applicationProperties=ap or None,
                         messageAnnotations=ma or None)


def _headerTo091(v):
    if isinstance(v, Typed):
        t, x = v.type, v.value
        if t == "long":
            return x
        if t == "int":
            return x
        if t == "byte":
            return TaggedInt(x, "b")
        if t == "ubyte":
            return TaggedInt(x, "B")
        if t == "short":
            return TaggedInt(x, "s")
        if t == "ushort":
            return TaggedInt(x, "u")
        if t == "uint":
            return TaggedInt(x, "i")
        if t == "ulong":
            return TaggedInt(x, "l")
        if t == "double":
            return x
        if t == "float":
            return TaggedFloat(x)
        if t == "timestamp":
            return Timestamp(x // 1000)
        if t == "symbol":
            return x
        return str(x)
    if isinstance(v, bytes):
        return ByteArray(v)
    if isinstance(v, (str, bool)) or v is None:
        return v
    return _SKIP


def _plain(v):
    if isinstance(v, Typed):
        return v.value
    return v


def toAmqp091(data):
    """
    ``(props, body)``: the AMQP 0-9-1 view of stored AMQP 1.0 bytes, as
    rabbit_msg_record:to_amqp091 gives it (the data sections' bytes as body;
    an amqp-value or sequence body is given as its encoded bytes).
    Raises DecodeError.
    """
    props = {}
    body = []
    headers = {}
    for code, value in decodeSections(data):
        if code == DATA:
            body.append(value)
        elif code in (AMQP_VALUE, AMQP_SEQUENCE):
            body.append(value if isinstance(value, bytes) else
                        (value.encode("utf-8") if isinstance(value, str) else encodeValue(value)))
        elif code == PROPERTIES:
            fields = dict(zip(PROPERTY_FIELDS, value or []))
            mid = fields.get("message_id")
            if mid is not None:
                props["message_id"] = str(_plain(mid))
                if isinstance(mid, Typed):
                    headers["x-message-id-type"] = mid.type
            if fields.get("user_id") is not None:
                props["user_id"] = bytes(fields["user_id"]).decode("utf-8", "surrogateescape")
            if fields.get("reply_to") is not None:
                props["reply_to"] = str(_plain(fields["reply_to"]))
            cid = fields.get("correlation_id")
            if cid is not None:
                props["correlation_id"] = str(_plain(cid))
                if isinstance(cid, Typed):
                    headers["x-correlation-id-type"] = cid.type
            if fields.get("content_type") is not None:
                props["content_type"] = str(_plain(fields["content_type"]))
            if fields.get("content_encoding") is not None:
                props["content_encoding"] = str(_plain(fields["content_encoding"]))
            if fields.get("creation_time") is not None:
                props["timestamp"] = int(_plain(fields["creation_time"])) // 1000
        elif code == APPLICATION_PROPERTIES:
            for k, v in (value or {}).items():
                k = _plain(k)
                if k == "x-basic-type":
                    props["type"] = _plain(v)
                elif k == "x-basic-app-id":
                    props["app_id"] = _plain(v)
                else:
                    c = _headerTo091(v)
                    if c is not _SKIP:
                        headers[str(k)] = c
        elif code == MESSAGE_ANNOTATIONS:
            for k, v in (value or {}).items():
                k = _plain(k)
                if k == "x-basic-priority":
                    props["priority"] = _plain(v)
                elif k == "x-basic-delivery-mode":
                    props["delivery_mode"] = _plain(v)
                elif k == "x-basic-expiration":
                    props["expiration"] = str(_plain(v))
    if headers:
        props["headers"] = headers
    return props, b"".join(body)
