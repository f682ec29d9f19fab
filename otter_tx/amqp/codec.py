"""
AMQP 0-9-1 wire codec: field tables (with RabbitMQ's errata type tags),
method arguments and basic content-header properties.

No Twisted, no I/O.  Sources: AMQP 0-9-1 spec section 4.2 (framing) and
RabbitMQ's errata page (https://www.rabbitmq.com/amqp-0-9-1-errata.html,
``rabbit_binary_parser.erl`` / ``rabbit_binary_generator.erl``).

Field-table values decode to plain Python values wherever that is lossless
for re-encoding:

====  =============================  ==================================
tag   AMQP type                      Python value
====  =============================  ==================================
t     boolean                        ``bool``
b     int8                           :class:`TaggedInt` (tag ``b``)
B     uint8                          :class:`TaggedInt` (tag ``B``)
s     int16 (RabbitMQ errata)        :class:`TaggedInt` (tag ``s``)
u     uint16                         :class:`TaggedInt` (tag ``u``)
I     int32                          ``int``
i     uint32                         :class:`TaggedInt` (tag ``i``)
l     int64                          ``int`` (re-encoded as ``l`` when it
                                     does not fit int32)
L     uint64 (decoded signed, like   :class:`TaggedInt` (tag ``l``)
      RabbitMQ)
f     float32                        :class:`TaggedFloat`
d     float64                        ``float``
D     decimal                        ``decimal.Decimal``
S     long string                    ``str`` (UTF-8, surrogateescape)
x     byte array                     :class:`ByteArray` (``bytes``)
T     timestamp (seconds)            :class:`Timestamp`
F     nested table                   ``dict``
A     array                          ``list``
V     void                           ``None``
====  =============================  ==================================

Errors: malformed input raises :class:`FrameSyntaxError`; the connection
answers 501 FRAME_ERROR ``cannot decode <<...>>`` naming the method, as
RabbitMQ 3.10's ``rabbit_framing_amqp_0_9_1`` decoder does for truncated
arguments, a length that overruns its table, an unknown field type tag (on
which RabbitMQ's reader crashes and drops the socket) or octets left over
after the last argument.

Nesting: tables and arrays may nest at most :data:`MAX_NESTING` levels
(deeper input is a FrameSyntaxError, not a ``RecursionError``).  RabbitMQ
has no limit (Erlang recursion is cheap); no client library nests more
than a handful of levels, and a limit keeps every later walk of the value
(re-encoding for dead-lettering, headers-exchange matching, the management
API's JSON) safely inside Python's recursion limit.  docs/compatibility.md
lists this difference.
"""

import struct
from decimal import Decimal

_unpack_B = struct.Struct("!B").unpack_from
_unpack_b = struct.Struct("!b").unpack_from
_unpack_H = struct.Struct("!H").unpack_from
_unpack_h = struct.Struct("!h").unpack_from
_unpack_I = struct.Struct("!I").unpack_from
_unpack_i = struct.Struct("!i").unpack_from
_unpack_Q = struct.Struct("!Q").unpack_from
_unpack_q = struct.Struct("!q").unpack_from
_unpack_f = struct.Struct("!f").unpack_from
_unpack_d = struct.Struct("!d").unpack_from

_pack_B = struct.Struct("!B").pack
_pack_H = struct.Struct("!H").pack
_pack_I = struct.Struct("!I").pack
_pack_Q = struct.Struct("!Q").pack


#: deepest nesting of tables/arrays in a field value (the outermost table is
#: level 1); deeper input raises FrameSyntaxError
MAX_NESTING = 100


class FrameSyntaxError(Exception):
    """
    The peer sent bytes that do not decode as AMQP (reply code 502
    SYNTAX_ERROR at the connection level).
    """


class TaggedInt(int):
    """
    An integer that remembers its AMQP field type tag (``b``, ``B``, ``s``,
    ``u``, ``i``, ``l``) so re-encoding keeps the peer's type.
    """

    def __new__(cls, value, tag):
        self = int.__new__(cls, value)
        self.tag = tag
        return self

    def __repr__(self):
        return "TaggedInt(%d, %r)" % (int(self), self.tag)


class TaggedFloat(float):
    """
    A float decoded from a 32-bit ``f`` field; re-encoded as ``f``.
    """

    __slots__ = ()


class Timestamp(int):
    """
    An AMQP timestamp (``T``): whole seconds since the Unix epoch.
    """

    __slots__ = ()


class ByteArray(bytes):
    """
    A RabbitMQ byte array (``x``); plain ``bytes`` encode as long strings.
    """

    __slots__ = ()


_INT_TAGS = {
    # tag: (size, unpack)
    "b": (1, _unpack_b),
    "B": (1, _unpack_B),
    "s": (2, _unpack_h),
    "u": (2, _unpack_H),
    "i": (4, _unpack_I),
}


def _decodeValue(data, off, depth):
    try:
        tag = chr(data[off])
    except IndexError:
        raise FrameSyntaxError("truncated field value")
    off += 1
    if tag == "S":
        (n,) = _unpack_I(data, off)
        off += 4
        end = off + n
        if end > len(data):
            raise FrameSyntaxError("truncated long string")
        return bytes(data[off:end]).decode("utf-8", "surrogateescape"), end
    if tag == "I":
        return _unpack_i(data, off)[0], off + 4
    if tag == "t":
        if off >= len(data):
            raise FrameSyntaxError("truncated boolean")
        return bool(data[off]), off + 1
    if tag == "l":
        return _unpack_q(data, off)[0], off + 8
    if tag == "F":
        (n,) = _unpack_I(data, off)
        off += 4
        return decodeTable(data, off, off + n, depth + 1), off + n
    if tag == "A":
        (n,) = _unpack_I(data, off)
        off += 4
        end = off + n
        if end > len(data):
            raise FrameSyntaxError("truncated array")
        if depth >= MAX_NESTING:
            raise FrameSyntaxError("field value nested deeper than %d" % (MAX_NESTING,))
        items = []
        while off < end:
            v, off = _decodeValue(data, off, depth + 1)
            items.append(v)
        if off != end:
            raise FrameSyntaxError("array overrun")
        return items, end
    if tag in _INT_TAGS:
        size, unpack = _INT_TAGS[tag]
        return TaggedInt(unpack(data, off)[0], tag), off + size
    if tag == "L":
        return TaggedInt(_unpack_q(data, off)[0], "l"), off + 8
    if tag == "T":
        return Timestamp(_unpack_Q(data, off)[0]), off + 8
    if tag == "d":
        return _unpack_d(data, off)[0], off + 8
    if tag == "f":
        return TaggedFloat(_unpack_f(data, off)[0]), off + 4
    if tag == "D":
        if off + 5 > len(data):
            raise FrameSyntaxError("truncated decimal")
        scale = data[off]
        (v,) = _unpack_i(data, off + 1)
        return Decimal(v).scaleb(-scale), off + 5
    if tag == "x":
        (n,) = _unpack_I(data, off)
        off += 4
        end = off + n
        if end > len(data):
            raise FrameSyntaxError("truncated byte array")
        return ByteArray(data[off:end]), end
    if tag == "V":
        return None, off
    raise FrameSyntaxError("unknown field type %r" % (tag,))


def decodeTable(data, off, end, depth=1):
    """
    Decode the field-table body ``data[off:end]`` (without its length
    prefix) into a ``dict`` (str keys).

    :param depth: the nesting level of this table (1 for a method argument
        or the ``headers`` property); at most :data:`MAX_NESTING`.
    :raise FrameSyntaxError: truncated or overrunning input, an unknown type
        tag, or nesting deeper than :data:`MAX_NESTING`.
    """
    if end > len(data):
        raise FrameSyntaxError("truncated table")
    if depth > MAX_NESTING:
        raise FrameSyntaxError("field table nested deeper than %d" % (MAX_NESTING,))
    table = {}
    try:
        while off < end:
            n = data[off]
            off += 1
            key = bytes(data[off : off + n]).decode("utf-8", "surrogateescape")
            off += n
            value, off = _decodeValue(data, off, depth)
            table[key] = value
    except (struct.error, IndexError):
        raise FrameSyntaxError("truncated table")
    if off != end:
        raise FrameSyntaxError("table overrun")
    return table


def _encodeValue(v, out):
    t = type(v)
    if t is str:
        b = v.encode("utf-8", "surrogateescape")
        out.append(b"S" + _pack_I(len(b)) + b)
    elif t is bool:
        out.append(b"t\x01" if v else b"t\x00")
    elif t is int:
        if -0x80000000 <= v <= 0x7FFFFFFF:
            out.append(b"I" + struct.pack("!i", v))
        else:
            out.append(b"l" + struct.pack("!q", v))
    elif t is dict:
        b = encodeTable(v)
        out.append(b"F" + b)
    elif t is list or t is tuple:
        parts = []
        for item in v:
            _encodeValue(item, parts)
        b = b"".join(parts)
        out.append(b"A" + _pack_I(len(b)) + b)
    elif v is None:
        out.append(b"V")
    elif t is TaggedInt:
        tag = v.tag
        fmt = {"b": "!b", "B": "!B", "s": "!h", "u": "!H", "i": "!I", "l": "!q"}[tag]
        out.append(tag.encode() + struct.pack(fmt, v))
    elif t is Timestamp:
        out.append(b"T" + _pack_Q(v))
    elif t is float:
        out.append(b"d" + struct.pack("!d", v))
    elif t is TaggedFloat:
        out.append(b"f" + struct.pack("!f", v))
    elif t is Decimal:
        sign, digits, exp = v.as_tuple()
        scale = max(0, -exp)
        unscaled = int(v.scaleb(scale))
        out.append(b"D" + _pack_B(scale) + struct.pack("!i", unscaled))
    elif t is ByteArray:
        out.append(b"x" + _pack_I(len(v)) + v)
    elif t is bytes or t is bytearray:
        out.append(b"S" + _pack_I(len(v)) + bytes(v))
    elif isinstance(v, bool):
        _encodeValue(bool(v), out)
    elif isinstance(v, int):
        _encodeValue(int(v), out)
    elif isinstance(v, str):
        _encodeValue(str(v), out)
    elif isinstance(v, dict):
        _encodeValue(dict(v), out)
    else:
        raise TypeError("cannot encode %r in a field table" % (v,))


def encodeTable(table):
    """
    Encode ``table`` (a dict with str keys) as a field table including its
    32-bit length prefix.
    """
    if not table:
        return b"\x00\x00\x00\x00"
    parts = []
    for k, v in table.items():
        kb = k.encode("utf-8", "surrogateescape")
        parts.append(_pack_B(len(kb)) + kb)
        _encodeValue(v, parts)
    body = b"".join(parts)
    return _pack_I(len(body)) + body


def fieldTypeName(v):
    """
    RabbitMQ's name for the field type of ``v`` as used in PRECONDITION_FAILED
    texts (``signedint``, ``longstr``, ``long``, ``bool`` ...).
    """
    t = type(v)
    if t is bool:
        return "bool"
    if t is int:
        return "signedint" if -0x80000000 <= v <= 0x7FFFFFFF else "long"
    if t is TaggedInt:
        return {
            "b": "byte",
            "B": "unsignedbyte",
            "s": "short",
            "u": "unsignedshort",
            "i": "unsignedint",
            "l": "long",
        }[v.tag]
    if t is str or t is bytes:
        return "longstr"
    if t is float:
        return "double"
    if t is TaggedFloat:
        return "float"
    if t is Decimal:
        return "decimal"
    if t is Timestamp:
        return "timestamp"
    if t is dict:
        return "table"
    if t is list:
        return "array"
    if t is ByteArray:
        return "binary"
    if v is None:
        return "void"
    return t.__name__


# --- method argument codec ------------------------------------------------
#
# Argument type letters: o octet, h short, l long, q longlong, s shortstr,
# S longstr, b bit, T table, t timestamp.


def decodeArgs(types, data, off):
    """
    Decode method arguments of the given type letters from ``data[off:]``
    (which must end with the last argument); return a list of values.

    :raise FrameSyntaxError: truncated arguments, a bad field table, or
        octets left after the last argument (RabbitMQ 3.10 answers all of
        these with 501 ``cannot decode``).
    """
    values = []
    bitOctet = 0
    bitIndex = 8
    try:
        for t in types:
            if t == "b":
                if bitIndex > 7:
                    bitOctet = data[off]
                    off += 1
                    bitIndex = 0
                values.append(bool(bitOctet & (1 << bitIndex)))
                bitIndex += 1
                continue
            bitIndex = 8
            if t == "s":
                n = data[off]
                off += 1
                end = off + n
                if end > len(data):
                    raise FrameSyntaxError("truncated short string")
                values.append(bytes(data[off:end]).decode("utf-8", "surrogateescape"))
                off = end
            elif t == "h":
                values.append(_unpack_H(data, off)[0])
                off += 2
            elif t == "l":
                values.append(_unpack_I(data, off)[0])
                off += 4
            elif t == "q" or t == "t":
                values.append(_unpack_Q(data, off)[0])
                off += 8
            elif t == "o":
                values.append(data[off])
                off += 1
            elif t == "S":
                (n,) = _unpack_I(data, off)
                off += 4
                end = off + n
                if end > len(data):
                    raise FrameSyntaxError("truncated long string")
                values.append(bytes(data[off:end]))
                off = end
            elif t == "T":
                (n,) = _unpack_I(data, off)
                off += 4
                values.append(decodeTable(data, off, off + n))
                off += n
    except (IndexError, struct.error):
        raise FrameSyntaxError("truncated method arguments")
    if off != len(data):
        raise FrameSyntaxError("octets after the method arguments")
    return values


def _shortstr(s):
    b = s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s
    if len(b) > 255:
        raise ValueError("short string too long")
    return _pack_B(len(b)) + b


def encodeArgs(types, values):
    """
    Encode method arguments (``values`` in the order of ``types``) to bytes.
    """
    out = []
    bitOctet = 0
    bitIndex = -1
    for t, v in zip(types, values):
        if t == "b":
            if bitIndex < 0:
                bitIndex = 0
                bitOctet = 0
            if v:
                bitOctet |= 1 << bitIndex
            bitIndex += 1
            if bitIndex == 8:
                out.append(_pack_B(bitOctet))
                bitIndex = -1
            continue
        if bitIndex >= 0:
            out.append(_pack_B(bitOctet))
            bitIndex = -1
        if t == "s":
            out.append(_shortstr(v))
        elif t == "h":
            out.append(_pack_H(v))
        elif t == "l":
            out.append(_pack_I(v))
        elif t == "q" or t == "t":
            out.append(_pack_Q(v))
        elif t == "o":
            out.append(_pack_B(v))
        elif t == "S":
            b = v.encode("utf-8") if isinstance(v, str) else v
            out.append(_pack_I(len(b)) + b)
        elif t == "T":
            out.append(encodeTable(v or {}))
    if bitIndex >= 0:
        out.append(_pack_B(bitOctet))
    return b"".join(out)


# --- basic content-header properties --------------------------------------

#: (name, type letter) in flag order, highest flag bit (15) first.
BASIC_PROPERTIES = (
    ("content_type", "s"),
    ("content_encoding", "s"),
    ("headers", "T"),
    ("delivery_mode", "o"),
    ("priority", "o"),
    ("correlation_id", "s"),
    ("reply_to", "s"),
    ("expiration", "s"),
    ("message_id", "s"),
    ("timestamp", "t"),
    ("type", "s"),
    ("user_id", "s"),
    ("app_id", "s"),
    ("cluster_id", "s"),
)


#: (flag bit mask, name, type letter) of :data:`BASIC_PROPERTIES`
_PROPERTY_BITS = tuple(
    (1 << (15 - i), name, t) for i, (name, t) in enumerate(BASIC_PROPERTIES)
)

#: the flags word of a content header carrying only ``delivery_mode``
_DELIVERY_MODE_ONLY = 0x1000


def decodeProperties(data, off=0):
    """
    Decode the property flags and property list of a basic content header
    (``data[off:]`` starts at the 16-bit flags word) into a dict of the
    properties present.  Raises FrameSyntaxError.

    Hot path (every message that has properties, e.g. every persistent
    one): the values are decoded inline, not through :func:`decodeArgs`
    and a second pass to skip them, and a header carrying only
    ``delivery_mode`` (what most persistent publishers send) is one
    comparison.
    """
    try:
        (flags,) = _unpack_H(data, off)
        off += 2
        if flags == _DELIVERY_MODE_ONLY:
            return {"delivery_mode": data[off]}
        props = {}
        # continuation flags (bit 0) are not used by class basic
        for mask, name, t in _PROPERTY_BITS:
            if not flags & mask:
                continue
            if t == "s":
                end = off + 1 + data[off]
                if end > len(data):
                    raise FrameSyntaxError("truncated short string")
                props[name] = bytes(data[off + 1 : end]).decode("utf-8", "surrogateescape")
                off = end
            elif t == "o":
                props[name] = data[off]
                off += 1
            elif t == "t":
                props[name] = _unpack_Q(data, off)[0]
                off += 8
            else:  # "T"
                (n,) = _unpack_I(data, off)
                off += 4
                props[name] = decodeTable(data, off, off + n)
                off += n
    except (IndexError, struct.error):
        raise FrameSyntaxError("truncated content header")
    return props


def encodeProperties(props):
    """
    Encode a properties dict (names as in :data:`BASIC_PROPERTIES`) to the
    flags word plus property list.
    """
    flags = 0
    out = []
    bit = 15
    for name, t in BASIC_PROPERTIES:
        v = props.get(name)
        if v is not None:
            flags |= 1 << bit
            out.append(encodeArgs(t, [v]))
        bit -= 1
    return _pack_H(flags) + b"".join(out)


def jsonable(v):
    """
    An AMQP field value (codec types, bytes, Decimal, nested tables and
    arrays) as a JSON-serialisable value, as RabbitMQ renders field tables:
    integers and timestamps as numbers, byte strings as text.
    """
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, (float, TaggedFloat)):
        return float(v)
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (bytes, bytearray, ByteArray)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return str(v)
