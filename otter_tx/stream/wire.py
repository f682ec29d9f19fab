"""
The RabbitMQ stream protocol's frames (deps/rabbitmq_stream/docs/PROTOCOL.adoc
and rabbit_stream_core.erl): a size-prefixed frame reader with the frame-max
check, the decoders of every command a client sends and the encoders of every
command and response a server sends, the response codes by name.

Pure: no Twisted, no broker imports. Decoded requests are small tuples
``(key, version, correlationId, args...)``; a malformed frame raises
:class:`FrameError` (RabbitMQ closes such a connection with UNKNOWN_FRAME).
"""

import platform
import struct
import sys
from array import array

# command keys (rabbit_stream.hrl)
DECLARE_PUBLISHER = 1
PUBLISH = 2
PUBLISH_CONFIRM = 3
PUBLISH_ERROR = 4
QUERY_PUBLISHER_SEQUENCE = 5
DELETE_PUBLISHER = 6
SUBSCRIBE = 7
DELIVER = 8
CREDIT = 9
STORE_OFFSET = 10
QUERY_OFFSET = 11
UNSUBSCRIBE = 12
CREATE_STREAM = 13
DELETE_STREAM = 14
METADATA = 15
METADATA_UPDATE = 16
PEER_PROPERTIES = 17
SASL_HANDSHAKE = 18
SASL_AUTHENTICATE = 19
TUNE = 20
OPEN = 21
CLOSE = 22
HEARTBEAT = 23
ROUTE = 24
PARTITIONS = 25
CONSUMER_UPDATE = 26
EXCHANGE_COMMAND_VERSIONS = 27
STREAM_STATS = 28
CREATE_SUPER_STREAM = 29
DELETE_SUPER_STREAM = 30
RESOLVE_OFFSET_SPEC = 31

RESPONSE_FLAG = 0x8000

# response codes
OK = 0x01
STREAM_DOES_NOT_EXIST = 0x02
SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
STREAM_ALREADY_EXISTS = 0x05
STREAM_NOT_AVAILABLE = 0x06
SASL_MECHANISM_NOT_SUPPORTED = 0x07
AUTHENTICATION_FAILURE = 0x08
SASL_ERROR = 0x09
SASL_CHALLENGE = 0x0A
SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
VHOST_ACCESS_FAILURE = 0x0C
UNKNOWN_FRAME = 0x0D
FRAME_TOO_LARGE = 0x0E
INTERNAL_ERROR = 0x0F
ACCESS_REFUSED = 0x10
PRECONDITION_FAILED = 0x11
PUBLISHER_DOES_NOT_EXIST = 0x12
NO_OFFSET = 0x13

RESPONSE_NAMES = {
    OK: "OK",
    STREAM_DOES_NOT_EXIST: "STREAM_DOES_NOT_EXIST",
    SUBSCRIPTION_ID_ALREADY_EXISTS: "SUBSCRIPTION_ID_ALREADY_EXISTS",
    SUBSCRIPTION_ID_DOES_NOT_EXIST: "SUBSCRIPTION_ID_DOES_NOT_EXIST",
    STREAM_ALREADY_EXISTS: "STREAM_ALREADY_EXISTS",
    STREAM_NOT_AVAILABLE: "STREAM_NOT_AVAILABLE",
    SASL_MECHANISM_NOT_SUPPORTED: "SASL_MECHANISM_NOT_SUPPORTED",
    AUTHENTICATION_FAILURE: "AUTHENTICATION_FAILURE",
    SASL_ERROR: "SASL_ERROR",
    SASL_CHALLENGE: "SASL_CHALLENGE",
    SASL_AUTHENTICATION_FAILURE_LOOPBACK: "SASL_AUTHENTICATION_FAILURE_LOOPBACK",
    VHOST_ACCESS_FAILURE: "VHOST_ACCESS_FAILURE",
    UNKNOWN_FRAME: "UNKNOWN_FRAME",
    FRAME_TOO_LARGE: "FRAME_TOO_LARGE",
    INTERNAL_ERROR: "INTERNAL_ERROR",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    PUBLISHER_DOES_NOT_EXIST: "PUBLISHER_DOES_NOT_EXIST",
    NO_OFFSET: "NO_OFFSET",
}

# offset specification types
OFFSET_NONE = 0
OFFSET_FIRST = 1
OFFSET_LAST = 2
OFFSET_NEXT = 3
OFFSET_OFFSET = 4
OFFSET_TIMESTAMP = 5

DEFAULT_FRAME_MAX = 1048576
INITIAL_FRAME_MAX = 8192
DEFAULT_HEARTBEAT = 60

#: the commands and versions this server speaks (exchange_command_versions)
SERVER_COMMAND_VERSIONS = (
    (DECLARE_PUBLISHER, 1, 1), (PUBLISH, 1, 2), (PUBLISH_CONFIRM, 1, 1),
    (PUBLISH_ERROR, 1, 1), (QUERY_PUBLISHER_SEQUENCE, 1, 1), (DELETE_PUBLISHER, 1, 1),
    # deliver v2 (with the committed chunk id) is not sent, so not offered
    (SUBSCRIBE, 1, 1), (DELIVER, 1, 1), (CREDIT, 1, 1), (STORE_OFFSET, 1, 1),
    (QUERY_OFFSET, 1, 1), (UNSUBSCRIBE, 1, 1), (CREATE_STREAM, 1, 1), (DELETE_STREAM, 1, 1),
    (METADATA, 1, 1), (METADATA_UPDATE, 1, 1), (PEER_PROPERTIES, 1, 1),
    (SASL_HANDSHAKE, 1, 1), (SASL_AUTHENTICATE, 1, 1), (TUNE, 1, 1), (OPEN, 1, 1),
    (CLOSE, 1, 1), (HEARTBEAT, 1, 1), (ROUTE, 1, 1), (PARTITIONS, 1, 1),
    (CONSUMER_UPDATE, 1, 1), (EXCHANGE_COMMAND_VERSIONS, 1, 1), (STREAM_STATS, 1, 1),
    (CREATE_SUPER_STREAM, 1, 1), (DELETE_SUPER_STREAM, 1, 1), (RESOLVE_OFFSET_SPEC, 1, 1),
)

_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_HH = struct.Struct(">HH")
_HHI = struct.Struct(">HHI")
_HHIH = struct.Struct(">HHIH")
_IHH = struct.Struct(">IHH")
_IHHIH = struct.Struct(">IHHIH")
_QH = struct.Struct(">QH")
_SUB = struct.Struct(">HII")
_QI = struct.Struct(">QI")


class FrameError(Exception):
    """A frame that does not parse (RabbitMQ: UNKNOWN_FRAME)."""


class FrameTooLarge(Exception):
    """A frame header announcing more than frame_max."""

    def __init__(self, size, frameMax):
        Exception.__init__(self, size, frameMax)
        self.size = size
        self.frameMax = frameMax


class FrameReader:
    """
    Splits received bytes into frame bodies (the bytes after the size). The
    size is checked against ``frameMax`` (0: no limit) as soon as the 4 size
    bytes are in, before the body is buffered.
    """

    def __init__(self, frameMax=INITIAL_FRAME_MAX):
        self.frameMax = frameMax
        self._buf = b""

    def feed(self, data):
        """Frame bodies complete after ``data``; raises FrameTooLarge."""
        buf = self._buf + data if self._buf else data
        frames = []
        pos = 0
        n = len(buf)
        frameMax = self.frameMax
        unpack = _I.unpack_from
        while n - pos >= 4:
            (size,) = unpack(buf, pos)
            if frameMax and size > frameMax:
                self._buf = b""
                raise FrameTooLarge(size, frameMax)
            end = pos + 4 + size
            if end > n:
                break
            frames.append(buf[pos + 4:end])
            pos = end
        self._buf = buf[pos:] if pos < n else b""
        return frames

    def buffered(self):
        """How many bytes of an incomplete frame are held."""
        return len(self._buf)


#: the least bytes a frame has to come out of a :class:`ReceiveBuffer` as a view, and a publish
#: frame's messages for ``compact`` (below, slices and a join cost less than a memmove call a
#: message: 12 B messages, docs/performance.md)
COMPACT_MIN = 16384
#: the least free space :meth:`ReceiveBuffer.space` offers a read
MIN_READ = 4096
#: reads in a row of less than a sixteenth of a grown :class:`ReceiveBuffer` before it shrinks back
SHRINK_AFTER = 64


def _bytearrayView(n):
    return memoryview(bytearray(n))


class _Block:
    """One buffer of a :class:`ReceiveBuffer` and the frames lent from it."""

    __slots__ = ("view", "lent", "retired", "pool")

    def __init__(self, view, pool):
        self.view = view
        self.lent = 0
        self.retired = False
        self.pool = pool

    def release(self, result=None):
        """What was lent from it is no longer held (a Deferred callback: passes ``result`` on)."""
        self.lent -= 1
        if self.lent == 0 and self.retired:
            self.pool.give(self)
        return result


class BlockPool:
    """
    Released receive buffers of one size (``size`` bytes), kept for use again
    by any :class:`ReceiveBuffer` that uses the pool, at most ``limit`` bytes
    of them (a publisher's buffers are lent until its commits end: as many
    as the bytes it has in flight, tens of MB at full speed; the pool bounds
    what stays after, whatever the number of connections).
    """

    #: tests: fill a released buffer with this byte before it is used again (a use after release shows)
    poison = None

    def __init__(self, size=1024 * 1024, limit=64 * 1024 * 1024):
        self.size = size
        self.limit = limit
        self._free = []

    def take(self):
        """A released buffer (a :class:`_Block`), or None."""
        return self._free.pop() if self._free else None

    def give(self, block):
        block.retired = False
        if len(block.view) == self.size and (len(self._free) + 1) * self.size <= self.limit:
            if self.poison is not None:
                block.view[:] = self.poison * self.size
            self._free.append(block)


#: the pool of the stream door's connections (their buffers' ``largest``, 1 MiB)
SHARED_POOL = BlockPool()


class ReceiveBuffer:
    """
    The server's receive buffer: the socket reads into it (``recv_into``
    :meth:`space`, then :meth:`filled`) and frames are split in place, so a
    read makes no new object and a frame is not copied (a :class:`FrameReader`
    makes a string a read, a joined string when a frame spans reads and a
    slice a frame: on PyPy, whose garbage collector pays for every large
    string, most of the stream publish path's time; docs/performance.md).
    The frame bodies :meth:`filled` returns are memoryviews of the buffer
    (bytes below :data:`COMPACT_MIN` bytes: copying them costs less than
    decoding a view),
    valid until the next :meth:`space` or :meth:`feed`, unless :meth:`lend`
    was called: then the bytes already split stay as they are until the
    token it returned is released (the buffer is not rewound or compacted;
    more reads go after them, then into another buffer, and a released one
    is used again).

    The buffer starts at ``initial`` bytes, doubles (up to ``largest``) while
    reads fill it and while a frame larger than it comes in (``frameMax``, 0
    for no limit, bounds what it holds: the size is checked as soon as its 4
    bytes are in), and is small again after :data:`SHRINK_AFTER` small reads
    in a row that left it empty (an idle connection keeps ``initial`` bytes).
    ``allocate(n)`` makes a buffer (a writable memoryview of ``n`` bytes; by
    default a bytearray's); ``pool`` (a :class:`BlockPool` of ``largest``
    bytes) keeps released ones for use again.
    """

    def __init__(self, frameMax=INITIAL_FRAME_MAX, initial=8192, largest=1024 * 1024, allocate=None, pool=None):
        self.frameMax = frameMax
        self.initial = initial
        self.largest = largest
        self._allocate = allocate or _bytearrayView
        #: released buffers of ``largest`` bytes (their own pool unless given one of that size)
        self._pool = pool if pool is not None and pool.size == largest else BlockPool(largest, 4 * largest)
        #: reads in a row that took less than a sixteenth of the buffer
        self._small = 0
        self._block = _Block(self._allocate(initial), self._pool)
        self._view = self._block.view
        self._start = 0
        self._fill = 0
        #: bytes the buffer must hold from ``_start`` (the frame in progress), 0 when unknown
        self._need = 0
        self._grow = False

    def lend(self):
        """
        The frames :meth:`filled` returned last are held past the next read:
        their bytes stay until the token returned is released
        (``token.release()``, also a Deferred callback).
        """
        b = self._block
        b.lent += 1
        return b

    def _renew(self, size):
        """A buffer of ``size`` bytes (a released one when it can), what is held moved to its front."""
        start, fill = self._start, self._fill
        old = self._block
        block = self._pool.take() if size <= self.largest else None
        if block is None:
            block = _Block(self._allocate(size), self._pool)
        block.view[0:fill - start] = self._view[start:fill]
        old.retired = True
        if not old.lent:
            self._pool.give(old)
        self._block = block
        self._view = block.view
        self._start, self._fill = 0, fill - start

    def space(self, least=MIN_READ):
        """A writable memoryview of the buffer's free end (at least ``least`` bytes)."""
        start, fill = self._start, self._fill
        cap = len(self._view)
        lent = self._block.lent
        if start == fill and not lent:
            start = fill = self._start = self._fill = 0
            if self._small >= SHRINK_AFTER and cap > self.initial:
                # a burst is over: back to the small buffer an idle connection keeps (the large
                # one to the pool, for the next burst)
                self._pool.give(self._block)
                self._block = _Block(self._allocate(self.initial), self._pool)
                self._view = self._block.view
                cap = self.initial
                self._small = 0
        held = fill - start
        want = held + least
        if self._need:
            # toward a frame larger than the buffer, doubling (bytes it announced are not held yet)
            want = max(want, min(self._need, 2 * cap))
        if self._grow and cap < self.largest:
            want = max(want, min(cap * 2, self.largest))
        self._grow = False
        if want > cap:
            self._renew(want)
        elif cap - fill < want - held:
            if lent:
                # (lent bytes stay where they are)
                self._renew(cap)
            else:
                # room enough once what is held moves to the front
                moved = bytes(self._view[start:fill])
                self._view[0:held] = moved
                self._start, self._fill = 0, held
        return self._view[self._fill:]

    def filled(self, n):
        """
        ``n`` bytes were read into :meth:`space`: the frame bodies complete
        now (memoryviews); raises FrameTooLarge.
        """
        view = self._view
        cap = len(view)
        if n >= cap - self._fill:
            self._grow = True
            self._small = 0
        elif n < cap >> 4:
            self._small += 1
        else:
            self._small = 0
        self._fill += n
        pos = self._start
        fill = self._fill
        frameMax = self.frameMax
        unpack = _I.unpack_from
        frames = []
        self._need = 0
        while fill - pos >= 4:
            (size,) = unpack(view, pos)
            if frameMax and size > frameMax:
                self._start = self._fill = 0
                self._block = _Block(self._allocate(self.initial), self._pool)
                self._view = self._block.view
                raise FrameTooLarge(size, frameMax)
            end = pos + 4 + size
            if end > fill:
                self._need = 4 + size
                break
            # (a small frame as bytes: cheaper to decode, on PyPy above all, and held by nobody)
            frames.append(view[pos + 4:end] if size >= COMPACT_MIN else bytes(view[pos + 4:end]))
            pos = end
        self._start = pos
        return frames

    def feed(self, data):
        """:meth:`filled` after copying ``data`` (bytes-like) in."""
        n = len(data)
        if not n:
            return []
        self.space(n)[:n] = data
        return self.filled(n)

    def buffered(self):
        """How many bytes of an incomplete frame are held."""
        return self._fill - self._start


# --- decoding primitives


class _Cursor:
    __slots__ = ("b", "p")

    def __init__(self, b, p):
        self.b = b
        self.p = p

    def u8(self):
        p = self.p
        if p >= len(self.b):
            raise FrameError("short frame")
        self.p = p + 1
        return self.b[p]

    def u16(self):
        try:
            (v,) = _H.unpack_from(self.b, self.p)
        except struct.error:
            raise FrameError("short frame") from None
        self.p += 2
        return v

    def i16(self):
        v = self.u16()
        return v - 0x10000 if v & 0x8000 else v

    def u32(self):
        try:
            (v,) = _I.unpack_from(self.b, self.p)
        except struct.error:
            raise FrameError("short frame") from None
        self.p += 4
        return v

    def u64(self):
        try:
            (v,) = _Q.unpack_from(self.b, self.p)
        except struct.error:
            raise FrameError("short frame") from None
        self.p += 8
        return v

    def i64(self):
        try:
            (v,) = _q.unpack_from(self.b, self.p)
        except struct.error:
            raise FrameError("short frame") from None
        self.p += 8
        return v

    def string(self):
        n = self.i16()
        if n < 0:
            return None
        p = self.p
        if p + n > len(self.b):
            raise FrameError("short string")
        self.p = p + n
        try:
            return bytes(self.b[p:p + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("string not UTF-8") from None

    def bytes_(self):
        n = self.u32()
        if n == 0xFFFFFFFF:
            return None
        p = self.p
        if p + n > len(self.b):
            raise FrameError("short bytes")
        self.p = p + n
        return bytes(self.b[p:p + n])

    def strings(self):
        return [self.string() for _ in range(self.u32())]

    def stringMap(self):
        out = {}
        for _ in range(self.u32()):
            k = self.string()
            out[k] = self.string()
        return out

    def end(self):
        if self.p != len(self.b):
            raise FrameError("trailing bytes")


def _offsetSpec(c):
    t = c.u16()
    if t in (OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT):
        return (t, None)
    if t == OFFSET_OFFSET:
        return (t, c.u64())
    if t == OFFSET_TIMESTAMP:
        return (t, c.i64())
    if t == OFFSET_NONE:
        return (t, None)
    raise FrameError("unknown offset type %d" % t)


def decodeFrame(body):
    """
    One frame body into ``(key, version, correlationId, args)``; ``key``
    keeps the response bit (0x8000). ``correlationId`` is None for the
    commands without one. Raises FrameError.
    """
    if len(body) < 4:
        raise FrameError("short frame")
    key, version = _HH.unpack_from(body, 0)
    c = _Cursor(body, 4)
    if key == PUBLISH:
        if version not in (1, 2):
            raise FrameError("publish version")
        pid = c.u8()
        count = c.u32()
        return (key, version, None, (pid, count, body, c.p))
    if key == HEARTBEAT:
        return (key, version, None, ())
    if key == CREDIT:
        sid = c.u8()
        credit = c.i16()
        c.end()
        return (key, version, None, (sid, credit))
    if key == STORE_OFFSET:
        ref = c.string()
        stream = c.string()
        off = c.u64()
        c.end()
        return (key, version, None, (ref, stream, off))
    if key == TUNE or key == TUNE | RESPONSE_FLAG:
        frameMax = c.u32()
        hb = c.u32()
        c.end()
        return (TUNE, version, None, (frameMax, hb))
    if key == CONSUMER_UPDATE | RESPONSE_FLAG:
        corr = c.u32()
        code = c.u16()
        spec = _offsetSpec(c) if c.p < len(body) else (OFFSET_NONE, None)
        return (key, version, corr, (code, spec))
    if key & RESPONSE_FLAG:
        corr = c.u32()
        code = c.u16()
        return (key, version, corr, (code,))
    decoder = _REQUESTS.get(key)
    if decoder is None:
        raise FrameError("unknown command %d" % key)
    corr = c.u32()
    args = decoder(c)
    c.end()
    return (key, version, corr, args)


def _saslAuthenticate(c):
    mech = c.string()
    if c.p == len(c.b):
        return (mech, b"")
    data = c.bytes_()
    return (mech, data or b"")


def _subscribe(c):
    sid = c.u8()
    stream = c.string()
    spec = _offsetSpec(c)
    credit = c.u16()
    props = c.stringMap() if c.p < len(c.b) else {}
    return (sid, stream, spec, credit, props)


def _resolveOffsetSpec(c):
    stream = c.string()
    spec = _offsetSpec(c)
    props = c.stringMap() if c.p < len(c.b) else {}
    return (stream, spec, props)


def _createSuperStream(c):
    name = c.string()
    partitions = c.strings()
    keys = c.strings()
    args = c.stringMap()
    return (name, partitions, keys, args)


def _commandVersions(c):
    out = []
    for _ in range(c.u32()):
        k = c.u16()
        lo = c.u16()
        hi = c.u16()
        out.append((k, lo, hi))
    return (out,)


_REQUESTS = {
    DECLARE_PUBLISHER: lambda c: (c.u8(), c.string(), c.string()),
    QUERY_PUBLISHER_SEQUENCE: lambda c: (c.string(), c.string()),
    DELETE_PUBLISHER: lambda c: (c.u8(),),
    SUBSCRIBE: _subscribe,
    QUERY_OFFSET: lambda c: (c.string(), c.string()),
    UNSUBSCRIBE: lambda c: (c.u8(),),
    CREATE_STREAM: lambda c: (c.string(), c.stringMap()),
    DELETE_STREAM: lambda c: (c.string(),),
    METADATA: lambda c: (c.strings(),),
    PEER_PROPERTIES: lambda c: (c.stringMap(),),
    SASL_HANDSHAKE: lambda c: (),
    SASL_AUTHENTICATE: _saslAuthenticate,
    OPEN: lambda c: (c.string(),),
    CLOSE: lambda c: (c.u16(), c.string()),
    ROUTE: lambda c: (c.string(), c.string()),
    PARTITIONS: lambda c: (c.string(),),
    EXCHANGE_COMMAND_VERSIONS: _commandVersions,
    STREAM_STATS: lambda c: (c.string(),),
    CREATE_SUPER_STREAM: _createSuperStream,
    DELETE_SUPER_STREAM: lambda c: (c.string(),),
    RESOLVE_OFFSET_SPEC: _resolveOffsetSpec,
}


# sub-entry batch compression types (a publish entry with the top bit set)
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1


def publishedMessages(body, pos, count, version):
    """
    The entries of a publish frame body from ``pos``: a list of
    ``(publishingId, message)`` where ``message`` is bytes, or
    ``(publishingId, SubBatch)`` for a sub-entry batch. Raises FrameError.
    """
    out = []
    append = out.append
    n = len(body)
    unpackQ = _Q.unpack_from
    unpackI = _I.unpack_from
    try:
        for _ in range(count):
            (pubId,) = unpackQ(body, pos)
            pos += 8
            if version == 2:
                (flen,) = _H.unpack_from(body, pos)
                pos += 2
                if flen != 0xFFFF:
                    pos += flen
            (size,) = unpackI(body, pos)
            if size & 0x80000000:
                # 1:1 CompressionType:3 Unused:4 NumRecords:16 Uncompressed:32 Length:32
                ctype = (size >> 28) & 0x7
                records, uncompressed, length = _SUB.unpack_from(body, pos + 1)
                pos += 11
                end = pos + length
                if end > n:
                    raise FrameError("short publish")
                append((pubId, SubBatch(ctype, records, uncompressed, bytes(body[pos:end]))))
                pos = end
                continue
            pos += 4
            end = pos + size
            if end > n:
                raise FrameError("short publish")
            append((pubId, bytes(body[pos:end])))
            pos = end
    except struct.error:
        raise FrameError("short publish") from None
    if pos != n:
        raise FrameError("trailing bytes in publish")
    return out


_FIXED_CACHE = {}
#: PyPy's struct is slow with formats of hundreds of fields (its JIT compiles the loop instead)
_PYPY = platform.python_implementation() == "PyPy"
_LITTLE = sys.byteorder == "little"


def _fixedStructs(size, count):
    key = (size, count)
    st = _FIXED_CACHE.get(key)
    if st is None:
        if len(_FIXED_CACHE) > 256:
            _FIXED_CACHE.clear()
        st = _FIXED_CACHE[key] = (struct.Struct(">" + ("QI%dx" % size) * count),
                                  struct.Struct(">" + ("8x%ds" % (4 + size)) * count))
    return st


def publishBatch(body, pos, count, version, compact=None):
    """
    The fast form of :func:`publishedMessages` for a version 1 publish of
    simple entries: ``(publishingIds, data, crc)`` where ``data`` is the
    entries as a chunk holds them (size-prefixed, the publishing ids taken
    out; bytes, or what ``compact`` gave) and ``crc`` their CRC-32 or None
    (not computed); None when the frame has a sub-entry batch or is version
    2 (use publishedMessages).  Frames whose messages all have the same size
    take two struct calls whatever their count (CPython).  ``compact``
    (:data:`otter_tx.door.stream.COMPACT` on PyPy) moves the entries of a
    frame of at least :data:`COMPACT_MIN` bytes together in ``body`` (which
    it changes; a :class:`ReceiveBuffer`'s memoryview) and gives a view of
    them, with their CRC.  Raises FrameError.
    """
    if version != 1 or count == 0:
        return None
    n = len(body)
    if pos + 12 > n:
        raise FrameError("short publish")
    (size,) = _I.unpack_from(body, pos + 8)
    if size & 0x80000000:
        return None
    if count * (12 + size) == n - pos and count <= 4096 and not _PYPY:
        ids, parts = _fixedStructs(size, count)
        vals = ids.unpack_from(body, pos)
        sizes = vals[1::2]
        if sizes.count(size) == count:
            return list(vals[0::2]), b"".join(parts.unpack_from(body, pos)), None
    if compact is not None and (n - pos < COMPACT_MIN or type(body) is not memoryview or body.readonly):
        # (compact moves bytes inside body: a writable view, a ReceiveBuffer's, from COMPACT_MIN bytes)
        compact = None
    if _PYPY and compact is None and type(body) is memoryview:
        # (PyPy's struct and slices are slower on a memoryview than on bytes: a small frame is copied)
        body = bytes(body)
    out = []
    runs = []
    total = 0
    unpack = _QI.unpack_from
    try:
        for _ in range(count):
            pubId, size = unpack(body, pos)
            if size & 0x80000000:
                return None
            end = pos + 12 + size
            if end > n:
                raise FrameError("short publish")
            out.append(pubId)
            runs.append(pos + 8)
            runs.append(end)
            total += size + 4
            pos = end
    except struct.error:
        raise FrameError("short publish") from None
    if pos != n:
        raise FrameError("trailing bytes in publish")
    if compact is not None:
        # (PyPy: the entries moved together in place, no string a message)
        data, crc = compact(body, runs, total)
        return out, data, crc
    return out, b"".join([body[runs[i]:runs[i + 1]] for i in range(0, len(runs), 2)]), None


class SubBatch:
    """A sub-entry batch: ``records`` messages, each size:32 + bytes, maybe compressed."""

    __slots__ = ("compression", "records", "uncompressedSize", "data")

    def __init__(self, compression, records, uncompressedSize, data):
        self.compression = compression
        self.records = records
        self.uncompressedSize = uncompressedSize
        self.data = data

    def messages(self, maxUncompressed=64 * 1024 * 1024):
        """The batch's messages; raises FrameError on a batch RabbitMQ rejects."""
        if self.uncompressedSize > maxUncompressed or self.records == 0:
            raise FrameError("sub-entry batch rejected")
        if self.records * 4 > self.uncompressedSize:
            raise FrameError("sub-entry batch rejected")
        if self.compression == COMPRESSION_NONE:
            data = self.data
        elif self.compression == COMPRESSION_GZIP:
            import zlib
            try:
                d = zlib.decompressobj(wbits=31)
                data = d.decompress(self.data, self.uncompressedSize + 1)
            except zlib.error:
                raise FrameError("sub-entry batch does not decompress") from None
        else:
            raise FrameError("unsupported compression %d" % self.compression)
        out = []
        pos = 0
        try:
            for _ in range(self.records):
                (size,) = _I.unpack_from(data, pos)
                pos += 4
                out.append(bytes(data[pos:pos + size]))
                pos += size
        except struct.error:
            raise FrameError("short sub-entry batch") from None
        if pos > len(data):
            raise FrameError("short sub-entry batch")
        return out


# --- encoding


def _str(s):
    if s is None:
        return b"\xff\xff"
    b = s.encode("utf-8") if isinstance(s, str) else s
    return _H.pack(len(b)) + b


def _strMap(d):
    parts = [_I.pack(len(d))]
    for k, v in d.items():
        parts.append(_str(k))
        parts.append(_str(v))
    return b"".join(parts)


def _frame(payload):
    return _I.pack(len(payload)) + payload


def response(key, corr, code, extra=b""):
    """A response frame: key|0x8000, version 1, correlation id, code, extra bytes."""
    return _frame(_HHIH.pack(key | RESPONSE_FLAG, 1, corr, code) + extra)


def peerPropertiesResponse(corr, props):
    return response(PEER_PROPERTIES, corr, OK, _strMap(props))


def saslHandshakeResponse(corr, mechanisms):
    body = _I.pack(len(mechanisms)) + b"".join(_str(m) for m in mechanisms)
    return response(SASL_HANDSHAKE, corr, OK, body)


def saslAuthenticateResponse(corr, code, challenge=b""):
    extra = (_I.pack(len(challenge)) + challenge) if challenge else b""
    return response(SASL_AUTHENTICATE, corr, code, extra)


def tune(frameMax, heartbeat):
    """The server's Tune: ``frameMax`` in bytes, ``heartbeat`` in seconds (0: none)."""
    return _frame(_HH.pack(TUNE, 1) + struct.pack(">II", frameMax, heartbeat))


def openResponse(corr, code, props=None):
    return response(OPEN, corr, code, _strMap(props) if props else b"")


def closeRequest(corr, code, reason):
    return _frame(_HHI.pack(CLOSE, 1, corr) + _H.pack(code) + _str(reason))


def heartbeat():
    return b"\x00\x00\x00\x04\x00\x17\x00\x01"


def querySequenceResponse(corr, code, seq):
    return response(QUERY_PUBLISHER_SEQUENCE, corr, code, _Q.pack(seq))


def queryOffsetResponse(corr, code, offset):
    return response(QUERY_OFFSET, corr, code, _Q.pack(offset))


def resolveOffsetSpecResponse(corr, code, offset):
    return response(RESOLVE_OFFSET_SPEC, corr, code, _H.pack(OFFSET_OFFSET) + _Q.pack(offset))


def creditResponse(code, sid):
    """The credit response: no correlation id (rabbit_stream_core's special case)."""
    return _frame(_HH.pack(CREDIT | RESPONSE_FLAG, 1) + _H.pack(code) + bytes((sid,)))


def metadataResponse(corr, brokers, streams):
    """
    ``brokers``: [(host, port)] (references are their indexes);
    ``streams``: [(name, code, leaderIndex, [replicaIndexes])].
    """
    parts = [_HHI.pack(METADATA | RESPONSE_FLAG, 1, corr), _I.pack(len(brokers))]
    for i, (host, port) in enumerate(brokers):
        parts.append(_H.pack(i) + _str(host) + _I.pack(port))
    parts.append(_I.pack(len(streams)))
    for name, code, leader, replicas in streams:
        if code != OK:
            parts.append(_str(name) + _H.pack(code) + b"\xff\xff" + _I.pack(0))
        else:
            parts.append(_str(name) + _H.pack(code) + _H.pack(leader) + _I.pack(len(replicas))
                         + b"".join(_H.pack(r) for r in replicas))
    return _frame(b"".join(parts))


def metadataUpdate(code, stream):
    return _frame(_HH.pack(METADATA_UPDATE, 1) + _H.pack(code) + _str(stream))


def streamsResponse(key, corr, code, streams):
    """route and partitions: a code and a list of stream names."""
    return response(key, corr, code, _I.pack(len(streams)) + b"".join(_str(s) for s in streams))


def commandVersionsResponse(corr, versions=SERVER_COMMAND_VERSIONS):
    body = _I.pack(len(versions)) + b"".join(struct.pack(">HHH", *v) for v in versions)
    return response(EXCHANGE_COMMAND_VERSIONS, corr, OK, body)


def streamStatsResponse(corr, code, stats):
    parts = [_I.pack(len(stats))]
    for k, v in stats.items():
        parts.append(_str(k) + _q.pack(v))
    return response(STREAM_STATS, corr, code, b"".join(parts))


_CONFIRM_HEAD = struct.Struct(">IHHBI")


def publishConfirm(publisherId, ids):
    """
    The publish_confirm frame of ``ids`` (ints): the ids packed one by one
    into a bytearray on PyPy (a format string made a call is slow there),
    as a byte-swapped ``array`` elsewhere.
    """
    n = len(ids)
    if _PYPY:
        out = bytearray(13 + 8 * n)
        _CONFIRM_HEAD.pack_into(out, 0, 9 + 8 * n, PUBLISH_CONFIRM, 1, publisherId, n)
        pack = _Q.pack_into
        o = 13
        for i in ids:
            pack(out, o, i)
            o += 8
        return bytes(out)
    a = array("Q", ids)
    if _LITTLE:
        a.byteswap()
    return _CONFIRM_HEAD.pack(9 + 8 * n, PUBLISH_CONFIRM, 1, publisherId, n) + a.tobytes()


def publishError(publisherId, errors):
    """``errors``: [(publishingId, code)]."""
    body = b"".join(_QH.pack(i, c) for i, c in errors)
    return _frame(_HH.pack(PUBLISH_ERROR, 1) + bytes((publisherId,)) + _I.pack(len(errors)) + body)


def deliverHeader(subscriptionId, chunkLength, version=1, committedChunkId=0):
    """The bytes before a chunk in a deliver frame (the chunk follows unchanged)."""
    if version == 2:
        return (_I.pack(4 + 1 + 8 + chunkLength) + _HH.pack(DELIVER, 2) + bytes((subscriptionId,))
                + _Q.pack(committedChunkId))
    return _I.pack(4 + 1 + chunkLength) + _HH.pack(DELIVER, 1) + bytes((subscriptionId,))


def consumerUpdateRequest(corr, subscriptionId, active):
    return _frame(_HHI.pack(CONSUMER_UPDATE, 1, corr) + bytes((subscriptionId, 1 if active else 0)))


# --- client side encoders (tests, benchmarks): the requests a client sends


def request(key, corr, payload=b""):
    return _frame(_HHI.pack(key, 1, corr) + payload)


def encodeString(s):
    return _str(s)


def encodeStringMap(d):
    return _strMap(d)


def offsetSpec(kind, value=None):
    if kind == OFFSET_OFFSET:
        return _H.pack(kind) + _Q.pack(value)
    if kind == OFFSET_TIMESTAMP:
        return _H.pack(kind) + _q.pack(value)
    return _H.pack(kind)


def publishFrame(publisherId, messages, version=1):
    """``messages``: [(publishingId, bytes)] (version 2: [(id, filter, bytes)])."""
    parts = [_HH.pack(PUBLISH, version), bytes((publisherId,)), _I.pack(len(messages))]
    for m in messages:
        if version == 2:
            pid, flt, data = m
            parts.append(_Q.pack(pid) + _str(flt) + _I.pack(len(data)) + data)
        else:
            pid, data = m
            parts.append(_Q.pack(pid) + _I.pack(len(data)) + data)
    return _frame(b"".join(parts))


def responseName(code):
    return RESPONSE_NAMES.get(code, "0x%02x" % code)
