"""
One queue's message log: append-only segment files of records, written in
chunks (one per group commit), read back from any offset.

Plain file I/O and plain data: no Twisted, no thread of its own, no lock.
:class:`~otter_tx.store.log.store.LogStore`'s writer thread owns every
:class:`QueueLog` it writes; a recovery stream reads one on the reactor
thread only before that queue changes (the store contract).  The format is
documented in ``docs/storage.md`` ("The message log").

Files.  A queue log is a directory ``q<qid>/`` of segments named by the
offset of their first message record, ``%020d.seg``.  A segment starts with
a 16-byte file header (:data:`FILE_MAGIC`, 8 bytes, then the first offset,
u64) followed by chunks.  A chunk is one group commit's records for this
queue: a 16-byte header (:data:`CHUNK_MAGIC`, payload length u32, CRC-32 of
the payload u32, record count u32) and its payload.  A torn write can only
damage the last chunk of the last segment (each commit appends one chunk
and fsyncs it before its syncs fire); recovery drops such a chunk (its CRC
or length fails) and truncates the file there.

Records (little endian; each is its length u32, not counting those 4
bytes, then the type u8):

- ``ENQ`` (1): a message entering the queue.  storeId u64, seq i64,
  enqueuedAtMs f64, expiresAtMs f64 (NaN for none), flags u8 (1:
  redelivered), exchange length u8, routing key length u8, property bytes
  length u32, then exchange, routing key (UTF-8, surrogateescape), the
  encoded content-header properties and the body.  A name of 255 bytes
  or more has the length byte 255 and its length as u32 just before it
  (AMQP names are short strings, but the HTTP API and
  ``x-dead-letter-routing-key`` allow longer ones).  Each ENQ record has an
  *offset*: the segment's first offset plus its index among the segment's
  ENQ records (offsets count messages, not bytes, and never repeat).
- ``ACK`` (2): offset u64: that message left the queue (ack, expiry,
  dead-lettering, drop).
- ``MARK`` (3): offset u64: that message was delivered (it comes back
  redelivered).
- ``PURGE`` (4): upto u64, count u32, then ``count`` offsets u64: every
  message below ``upto`` left except those listed (``queue.purge`` keeps
  unacknowledged messages).
- ``REDELIVER_ALL`` (5): upto u64: every message below ``upto`` comes back
  redelivered (written once per queue after an unclean stop).
- ``BATCH`` (6): streams only: first offset u64, enqueuedAtMs f64, count
  u32, then ``count`` messages as a stream protocol chunk holds them (each
  its size u32 big endian, then its bytes, as the client published them).
  It has ``count`` offsets from ``first`` (one record, many messages: a
  stream protocol publish frame is appended as one record and delivered as
  it is stored).
- ``BATCH_CRC`` (7): streams only: a ``BATCH`` record whose head ends with
  the CRC-32 of its entries (u32, after count): what a stream consumer's
  chunk header needs, so a chunk of whole records is sent without reading
  it (``crc32_combine`` of the stored CRCs).  Written for every stream
  protocol publish since; ``BATCH`` records are still read.

Reclaiming.  A segment is deleted once it is not the active (last) one,
none of its messages is live, and no record in it still matters to an
older segment: an ``ACK``/``MARK``/``PURGE``/``REDELIVER_ALL`` in segment
S about a message of an older segment T *pins* S until T is deleted
(otherwise T's message would come back at recovery).  Segments between
others can go, so the offsets of a log's files may have gaps.
"""

import bisect
import math
import os
import struct
import zlib
from array import array

from otter_tx.store.rawio import PWRITEV, makeCrc32

try:
    # ISA-L's crc32: the same CRC-32 as zlib's, about 9x its speed here (0.015 against 0.14 s a
    # GB); every chunk written, every stream chunk sent (docs/performance.md)
    from isal.isal_zlib import crc32
except ImportError:
    try:
        # PyPy, where isal does not build: zlib-ng's (0.016 s a GB; PyPy's zlib.crc32 0.2-0.5) for
        # a bytearray (through cpyext) and other buffers, memoryviews, mapped files (through cffi:
        # cpyext keeps what a memoryview shows for good, otter_tx.store.rawio.makeCrc32); PyPy's
        # own zlib for bytes (cpyext copies a young bytes object first: 0.5 s a GB against zlib's
        # 0.2); docs/performance.md
        from zlib_ng import zlib_ng as _zng
    except ImportError:  # neither installed
        crc32 = zlib.crc32
    else:
        _viewCrc32 = makeCrc32(_zng.__file__) or (lambda data, value=0: zlib.crc32(bytes(data), value))

        def crc32(data, value=0, _bytes=zlib.crc32, _bytearray=_zng.crc32, _buffer=_viewCrc32):
            """``zlib.crc32(data, value)``, by the fastest of three implementations for ``data``'s type."""
            t = type(data)
            if t is bytes:
                return _bytes(data, value)
            if t is bytearray:
                return _bytearray(data, value)
            return _buffer(data, value)

_ZEROS = bytes(64 * 1024)


def crc32CombineZeros(crc1, crc2, len2):
    """
    The CRC-32 of A + B from ``crc1`` (A's), ``crc2`` (B's) and ``len2`` (B's length),
    with ``crc32`` alone (Python's zlib has no crc32_combine): crc32(B, c) is affine in
    c, so crc32(B, crc1) = crc2 ^ crc32(Z, crc1) ^ crc32(Z, 0), Z being ``len2`` zeros
    (hashed here: as slow as hashing B, but no read of it).
    """
    c1 = crc1
    c0 = 0
    while len2 > 0:
        k = min(len2, len(_ZEROS))
        z = _ZEROS if k == len(_ZEROS) else memoryview(_ZEROS)[:k]
        c1 = crc32(z, c1)
        c0 = crc32(z, c0)
        len2 -= k
    return crc2 ^ c1 ^ c0


try:
    # crc32_combine(crc1, crc2, len2): zlib's, O(log len2) (about 0.3 us): a stream chunk's CRC
    # from its records' stored ones
    from isal.isal_zlib import crc32_combine
except ImportError:
    try:
        from zlib_ng.zlib_ng import crc32_combine
    except ImportError:
        crc32_combine = crc32CombineZeros


#: the first 8 bytes of every segment file (format version 1)
FILE_MAGIC = b"OTXLOG\x00\x01"
#: the first 4 bytes of every chunk
CHUNK_MAGIC = b"OTXC"
FILE_HEADER = struct.Struct("<8sQ")
CHUNK_HEADER = struct.Struct("<4sIII")

ENQ = 1
ACK = 2
MARK = 3
PURGE = 4
REDELIVER_ALL = 5
BATCH = 6
BATCH_CRC = 7

#: ENQ: length, type, storeId, seq, enqueuedAtMs, expiresAtMs, flags, exchange
#: length, routing key length, property bytes length (44 bytes)
ENQ_HEAD = struct.Struct("<IBQqddBBBI")
#: ACK, MARK, REDELIVER_ALL: length, type, offset (13 bytes)
REF = struct.Struct("<IBQ")
#: PURGE: length, type, upto, count (then count u64 offsets)
PURGE_HEAD = struct.Struct("<IBQI")
_LEN_TYPE = struct.Struct("<IB")
#: BATCH: length, type, first offset, enqueuedAtMs, count (25 bytes; then the entries)
BATCH_HEAD = struct.Struct("<IBQdI")
#: BATCH_CRC: BATCH_HEAD then the CRC-32 of the entries (29 bytes; then the entries)
BATCH_CRC_HEAD = struct.Struct("<IBQdII")
_U32 = struct.Struct("<I")
#: an ENQ name length byte meaning "the length follows as u32"
LONG_NAME = 255
_U64 = struct.Struct("<Q")
_ID_SEQ = struct.Struct("<Qq")

#: a new segment is started when the active one holds this many bytes
SEGMENT_BYTES = 4 * 1024 * 1024

#: the sparse offset index keeps the byte position of every Nth message
INDEX_EVERY = 64

# flags per message in a segment (Segment.flags)
LIVE = 1
REDELIVERED = 2
#: the message id slot is a copy of the previous one (its id is in
#: QueueLog.exceptions): see QueueLog.locate
OUT_OF_ORDER = 4

_NAN = float("nan")

# bytes.translate table: every live message becomes live and redelivered
_ALL_REDELIVERED = bytes((f | REDELIVERED) if f & LIVE else f for f in range(256))


class LogCorruptError(Exception):
    """
    A segment is damaged somewhere other than its torn tail.

    :ivar path: the segment file (``str``).  :ivar reason: ``str``.
    """

    def __init__(self, path, reason):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def segmentName(firstOffset):
    """The file name of the segment starting at ``firstOffset`` (int)."""
    return "%020d.seg" % (firstOffset,)


def encodeEnq(out, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered, exchange, routingKey,
              propsRaw, body):
    """
    Append one ENQ record to ``out`` (bytearray); ``exchange`` and
    ``routingKey`` are the encoded names (bytes).  Returns the record's
    length in bytes.
    """
    exLen = len(exchange)
    rkLen = len(routingKey)
    n = ENQ_HEAD.size - 4 + exLen + rkLen + len(propsRaw) + len(body)
    if exLen >= LONG_NAME or rkLen >= LONG_NAME:
        n += 4 * ((exLen >= LONG_NAME) + (rkLen >= LONG_NAME))
    out += ENQ_HEAD.pack(n, ENQ, storeId, seq, enqueuedAtMs,
                         _NAN if expiresAtMs is None else expiresAtMs,
                         1 if redelivered else 0, min(exLen, LONG_NAME), min(rkLen, LONG_NAME),
                         len(propsRaw))
    if exLen >= LONG_NAME:
        out += _U32.pack(exLen)
    out += exchange
    if rkLen >= LONG_NAME:
        out += _U32.pack(rkLen)
    out += routingKey
    out += propsRaw
    out += body
    return n + 4


def encodedEnq(storeId, seq, enqueuedAtMs, expiresAtMs, redelivered, exchange, routingKey, propsRaw,
               body):
    """One ENQ record as ``bytes`` (see :func:`encodeEnq`)."""
    exLen = len(exchange)
    rkLen = len(routingKey)
    n = ENQ_HEAD.size - 4 + exLen + rkLen + len(propsRaw) + len(body)
    if exLen < LONG_NAME and rkLen < LONG_NAME:
        return b"".join((
            ENQ_HEAD.pack(n, ENQ, storeId, seq, enqueuedAtMs, _NAN if expiresAtMs is None else expiresAtMs,
                          1 if redelivered else 0, exLen, rkLen, len(propsRaw)),
            exchange, routingKey, propsRaw, body))
    out = bytearray()
    encodeEnq(out, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered, exchange, routingKey, propsRaw,
              body)
    return bytes(out)


def encodedBatch(firstOffset, enqueuedAtMs, count, entries, crc=None):
    """
    The head of a BATCH record (bytes) for ``count`` messages ``entries``
    (size-prefixed); the entries follow it.  With ``crc`` (``crc32(entries)``)
    a BATCH_CRC record's, which stores it.
    """
    if crc is None:
        return BATCH_HEAD.pack(BATCH_HEAD.size - 4 + len(entries), BATCH, firstOffset, enqueuedAtMs, count)
    return BATCH_CRC_HEAD.pack(BATCH_CRC_HEAD.size - 4 + len(entries), BATCH_CRC, firstOffset, enqueuedAtMs,
                               count, crc)


#: the byte of an ENQ record holding its flags (redelivered)
ENQ_FLAGS_AT = 37


def decodeEnq(buf, pos):
    """
    The fields of the ENQ record at ``pos`` in ``buf``: ``(storeId, seq,
    enqueuedAtMs, expiresAtMs, redelivered, exchange, routingKey, propsRaw,
    body)`` with names as bytes.
    """
    n, _, storeId, seq, enq, exp, flags, exLen, rkLen, propsLen = ENQ_HEAD.unpack_from(buf, pos)
    p = pos + ENQ_HEAD.size
    if exLen == LONG_NAME:
        exLen = _U32.unpack_from(buf, p)[0]
        p += 4
    exchange = buf[p:p + exLen]
    p += exLen
    if rkLen == LONG_NAME:
        rkLen = _U32.unpack_from(buf, p)[0]
        p += 4
    routingKey = buf[p:p + rkLen]
    p += rkLen
    propsRaw = buf[p:p + propsLen]
    p += propsLen
    body = buf[p:pos + 4 + n]
    return (storeId, seq, enq, None if math.isnan(exp) else exp, bool(flags & 1), exchange,
            routingKey, propsRaw, body)


class Segment:
    """
    One segment file's state in memory.

    :ivar first: offset of its first message (int).
    :ivar path: its file (str).
    :ivar size: bytes of the file that are committed (int).
    :ivar ids: ``array('q')``: the storeId of each of its messages, by
        offset (an out-of-order id holds a copy of the previous id; see
        :meth:`QueueLog.locate`).
    :ivar flags: ``bytearray``: :data:`LIVE`, :data:`REDELIVERED`,
        :data:`OUT_OF_ORDER` per message.
    :ivar live: number of live messages (int).
    :ivar minId: the storeId of its first in-order message, or None.
    :ivar pins: the older segments a record of this one is about (set).
    :ivar pinnedBy: the newer segments whose records are about this one (set).
    :ivar index: ``array('I')``: byte position of every
        :data:`INDEX_EVERY`-th message (the sparse offset index).
    :ivar stamps: ``array('d')``: enqueuedAtMs of the same messages (the
        sparse timestamp index).
    """

    __slots__ = ("first", "path", "size", "ids", "flags", "live", "minId", "pins", "pinnedBy",
                 "index", "stamps", "positions", "meta", "__weakref__")

    def __init__(self, first, path, size):
        self.first = first
        self.path = path
        self.size = size
        self.ids = array("q")
        self.flags = bytearray()
        self.live = 0
        self.minId = None
        self.pins = set()
        self.pinnedBy = set()
        self.index = array("I")
        self.stamps = array("d")
        # byte position of every message, and (seqs, body sizes, expiries),
        # kept only between recovery and the recovery stream
        self.positions = None
        self.meta = None

    @property
    def next(self):
        """The offset after its last message (int)."""
        return self.first + len(self.ids)

    def __repr__(self):
        return f"<Segment {self.first}+{len(self.ids)} live={self.live} {self.size}B>"


class QueueLog:
    """
    One queue's log: its segments, which messages are live, and the
    records of the commit being built.

    Writing is three steps, all on the store's writer thread:
    :meth:`enqueue` / :meth:`ack` / :meth:`mark` / :meth:`purge` update the
    state and append records to a pending chunk; :meth:`flush` writes the
    chunk and fsyncs; :meth:`reclaim` deletes the segments the commit freed.
    If anything fails before the commit is done, :meth:`rollback` truncates
    the files and reads the state back from them.

    :param directory: the queue's directory (str; created by :meth:`create`).
    :ivar exceptions: ``{storeId: offset}`` of live messages enqueued out
        of id order.
    :ivar committed: the offset after the last committed message (int).
    """

    def __init__(self, directory, segmentBytes=SEGMENT_BYTES):
        self.directory = directory
        self.segmentBytes = segmentBytes
        self.segments = []
        # minId of the segments that have one, and those segments (bisect)
        self._minIds = []
        self._byMinId = []
        self.exceptions = {}
        # the same, offset -> storeId
        self._exceptionIds = {}
        self._lastId = -1
        self._lastSeq = None
        #: True when a message's seq is lower than one before it (the
        #: recovery stream then sorts by seq)
        self.disordered = False
        self.committed = 0
        # pending records of the active segment (ENQ / the others) and of
        # segments sealed before they were written
        self._chunk = _Parts()
        self._count = 0
        self._other = bytearray()
        self._otherCount = 0
        self._sealed = []
        # segments whose file is not made yet
        self._unborn = set()
        # writer: open segment files {path: fd}; files made by the commit
        # being written; {path: size before it}
        self._fds = {}
        self._createdPaths = []
        self._rollbackSizes = None
        # the end of the last written commit, made visible at done()
        self._flushed = None
        # the pending records were written as two chunks (phases 1 and 2)
        self._split = False

    # --- opening --------------------------------------------------------------

    @classmethod
    def create(cls, directory, firstOffset=0, segmentBytes=SEGMENT_BYTES):
        """A new, empty log in ``directory`` (made now; its first segment on the first write)."""
        if not os.path.isdir(directory):
            os.makedirs(directory)
            # the new directory's entry must survive a power loss as its files do
            _fsyncDirectory(os.path.dirname(os.path.abspath(directory)))
        log = cls(directory, segmentBytes)
        log.committed = firstOffset
        return log

    @classmethod
    def open(cls, directory, segmentBytes=SEGMENT_BYTES, truncateTail=True):
        """
        Read an existing log's state from its segments (every record is
        read once; message bodies are not kept).  A torn last chunk of the
        last segment is cut off (with ``truncateTail``).

        :raise LogCorruptError: a segment is damaged elsewhere.
        """
        log = cls(directory, segmentBytes)
        names = sorted(n for n in os.listdir(directory) if n.endswith(".seg"))
        for i, name in enumerate(names):
            path = os.path.join(directory, name)
            log._scan(path, last=(i == len(names) - 1), truncateTail=truncateTail)
        if log.segments:
            log.committed = log.segments[-1].next
        for seg in log.segments:
            # only the recovery stream reads them, and only where a message is live
            if not seg.live:
                seg.positions = None
                seg.meta = None
        return log

    def _scan(self, path, last, truncateTail):
        with open(path, "rb") as f:
            buf = f.read()
        if len(buf) < FILE_HEADER.size:
            if last:
                # created but its header never made it: nothing was in it
                if truncateTail:
                    os.remove(path)
                return
            raise LogCorruptError(path, "shorter than its header")
        magic, first = FILE_HEADER.unpack_from(buf, 0)
        if last and buf[:FILE_HEADER.size] == bytes(FILE_HEADER.size):
            # created but its header never reached the disk (zeros after a
            # crash): nothing was in it
            if truncateTail:
                os.remove(path)
            return
        if magic != FILE_MAGIC:
            raise LogCorruptError(path, f"not a message log segment (magic {magic!r})")
        # a gap is a reclaimed segment (any sealed one with nothing live and
        # no pin is deleted, not only the oldest); an overlap is damage
        if self.segments and first < self.segments[-1].next:
            raise LogCorruptError(path, f"starts at offset {first}, before {self.segments[-1].next}")
        seg = Segment(first, path, FILE_HEADER.size)
        seg.positions = array("I")
        seg.meta = (array("q"), array("I"), array("d"))
        self._addSegment(seg)
        pos = FILE_HEADER.size
        end = len(buf)
        while pos < end:
            bad = None
            if end - pos < CHUNK_HEADER.size:
                bad = "a torn chunk header"
            else:
                magic, length, crc, count = CHUNK_HEADER.unpack_from(buf, pos)
                start = pos + CHUNK_HEADER.size
                if magic != CHUNK_MAGIC:
                    bad = "a chunk without its magic"
                elif start + length > end:
                    bad = "a torn chunk"
                elif crc32(buf[start:start + length]) != crc:
                    bad = "a chunk failing its CRC"
            if bad is not None:
                if not last:
                    raise LogCorruptError(path, f"{bad} at byte {pos} of a sealed segment")
                if bad == "a chunk failing its CRC" and _validChunkAt(buf, start + length):
                    # a torn write damages only the last chunk: one that is
                    # followed by a sound chunk was damaged after its commit
                    raise LogCorruptError(path, f"{bad} at byte {pos}, followed by committed chunks")
                if truncateTail:
                    with open(path, "r+b") as f:
                        f.truncate(pos)
                        os.fsync(f.fileno())
                break
            self._replay(seg, buf, start, start + length)
            pos = start + length
            seg.size = pos

    def _replay(self, seg, buf, pos, end):
        """Apply the records of one chunk (recovery)."""
        unpackLT = _LEN_TYPE.unpack_from
        unpackQ = _U64.unpack_from
        ids = seg.ids
        flags = seg.flags
        positions = seg.positions
        seqs, sizes, expiries = seg.meta
        unpackEnq = ENQ_HEAD.unpack_from
        headSize = ENQ_HEAD.size - 4
        while pos < end:
            n, kind = unpackLT(buf, pos)
            if kind == ENQ:
                _, _, storeId, seq, enq, exp, f, exLen, rkLen, propsLen = unpackEnq(buf, pos)
                if self._lastSeq is not None and seq < self._lastSeq:
                    self.disordered = True
                self._lastSeq = seq
                if len(ids) % INDEX_EVERY == 0:
                    seg.index.append(pos)
                    seg.stamps.append(enq)
                positions.append(pos)
                seqs.append(seq)
                if exLen == LONG_NAME or rkLen == LONG_NAME:
                    at = pos + ENQ_HEAD.size
                    if exLen == LONG_NAME:
                        exLen = 4 + _U32.unpack_from(buf, at)[0]
                    if rkLen == LONG_NAME:
                        rkLen = 4 + _U32.unpack_from(buf, at + exLen)[0]
                sizes.append(n - headSize - exLen - rkLen - propsLen)
                expiries.append(exp)
                self._appendId(seg, storeId)
                flags[-1] |= (f & 1) * REDELIVERED
            elif kind == BATCH or kind == BATCH_CRC:
                _, _, first, enq, count = BATCH_HEAD.unpack_from(buf, pos)
                base = len(ids)
                k = -(-base // INDEX_EVERY) * INDEX_EVERY
                while k < base + count:
                    seg.index.append(pos)
                    seg.stamps.append(enq)
                    k += INDEX_EVERY
                positions.extend([pos] * count)
                seqs.extend(range(first, first + count))
                sizes.extend([0] * count)
                expiries.extend([_NAN] * count)
                self._appendIds(seg, first, count)
                self._lastSeq = first + count - 1
            elif kind == ACK or kind == MARK or kind == REDELIVER_ALL:
                offset = unpackQ(buf, pos + 5)[0]
                if kind == ACK:
                    self._ackOffset(seg, offset)
                elif kind == MARK:
                    self._markOffset(seg, offset)
                else:
                    self._redeliverAll(seg, offset)
            elif kind == PURGE:
                upto, count = struct.unpack_from("<QI", buf, pos + 5)
                keep = set(struct.unpack_from("<%dQ" % count, buf, pos + 17)) if count else ()
                self._purgeBelow(seg, upto, keep)
            else:
                raise LogCorruptError(seg.path, f"unknown record type {kind} at byte {pos}")
            pos += 4 + n

    # --- state ----------------------------------------------------------------

    def _addSegment(self, seg):
        self.segments.append(seg)

    def _appendId(self, seg, storeId):
        """A message at the next offset of ``seg`` (the active segment), live."""
        if storeId > self._lastId:
            seg.ids.append(storeId)
            seg.flags.append(LIVE)
            if seg.minId is None:
                seg.minId = storeId
                self._minIds.append(storeId)
                self._byMinId.append(seg)
            self._lastId = storeId
        else:
            seg.ids.append(self._lastId)
            seg.flags.append(LIVE | OUT_OF_ORDER)
            offset = seg.first + len(seg.ids) - 1
            self.exceptions[storeId] = offset
            self._exceptionIds[offset] = storeId
        seg.live += 1

    def _appendIds(self, seg, firstId, count):
        """``count`` messages of ids from ``firstId`` at the next offsets of ``seg``, live."""
        if firstId > self._lastId:
            seg.ids.extend(range(firstId, firstId + count))
            seg.flags.extend(bytes((LIVE,)) * count)
            if seg.minId is None:
                seg.minId = firstId
                self._minIds.append(firstId)
                self._byMinId.append(seg)
            self._lastId = firstId + count - 1
            seg.live += count
        else:
            for i in range(count):
                self._appendId(seg, firstId + i)

    def segmentOf(self, offset):
        """The segment holding ``offset``, or None (deleted or never written)."""
        segs = self.segments
        if not segs:
            return None
        seg = segs[-1]
        if offset >= seg.first:
            # most acks are about the active segment
            return seg if offset < seg.first + len(seg.ids) else None
        i = _bisectFirst(segs, offset)
        if i < 0:
            return None
        seg = segs[i]
        return seg if offset < seg.first + len(seg.ids) else None

    def locate(self, storeId):
        """
        The offset of live message ``storeId`` (int), or None.  In-order
        ids (each greater than every id before it) are found by bisection
        over the segments' ids; the others are in :attr:`exceptions`.
        """
        offset = self.exceptions.get(storeId)
        if offset is not None:
            return offset
        minIds = self._minIds
        if not minIds:
            return None
        if storeId >= minIds[-1]:
            i = len(minIds) - 1
        else:
            i = bisect.bisect_right(minIds, storeId) - 1
            if i < 0:
                return None
        seg = self._byMinId[i]
        ids = seg.ids
        j = bisect.bisect_left(ids, storeId)
        if j < len(ids) and ids[j] == storeId and seg.flags[j] & LIVE and not seg.flags[j] & OUT_OF_ORDER:
            return seg.first + j
        return None

    def _pin(self, seg, target):
        if target is not seg:
            seg.pins.add(target)
            target.pinnedBy.add(seg)

    def _ackOffset(self, seg, offset):
        target = self.segmentOf(offset)
        if target is None:
            return False
        j = offset - target.first
        f = target.flags[j]
        if not f & LIVE:
            return False
        target.flags[j] = f & OUT_OF_ORDER
        target.live -= 1
        if f & OUT_OF_ORDER:
            self._dropException(offset)
        self._pin(seg, target)
        return True

    def _dropException(self, offset):
        storeId = self._exceptionIds.pop(offset, None)
        # the id may be live again at a later offset (acked and enqueued
        # again in one commit: its ENQ record comes before the ACK on disk)
        if storeId is not None and self.exceptions.get(storeId) == offset:
            del self.exceptions[storeId]

    def _markOffset(self, seg, offset):
        target = self.segmentOf(offset)
        if target is None:
            return False
        j = offset - target.first
        if not target.flags[j] & LIVE:
            return False
        target.flags[j] |= REDELIVERED
        self._pin(seg, target)
        return True

    def _redeliverAll(self, seg, upto):
        for target in self.segments:
            if target.first >= upto:
                break
            if target.live:
                below = min(upto, target.next) - target.first
                flags = target.flags
                target.flags = bytearray(flags[:below].translate(_ALL_REDELIVERED)) + flags[below:]
                self._pin(seg, target)

    def _purgeBelow(self, seg, upto, keep):
        for target in self.segments:
            if target.first >= upto:
                break
            if not target.live:
                continue
            flags = target.flags
            below = min(upto, target.next) - target.first
            kept = [o for o in keep if target.first <= o < target.first + below
                    and flags[o - target.first] & LIVE]
            # every message below upto goes (out-of-order bits kept), then
            # the kept come back; messages from upto on stay
            newFlags = bytearray(flags[:below].translate(_DEAD)) + flags[below:]
            for o in kept:
                newFlags[o - target.first] = flags[o - target.first]
            target.flags = newFlags
            # a message that is not live has flag 0 or OUT_OF_ORDER
            target.live = len(newFlags) - newFlags.count(0) - newFlags.count(OUT_OF_ORDER)
            self._pin(seg, target)
        if self.exceptions:
            self.exceptions = {i: o for i, o in self.exceptions.items() if o >= upto or o in keep}
            self._exceptionIds = {o: i for i, o in self.exceptions.items()}

    # --- writing (writer thread) ---------------------------------------------------
    #
    # Records are appended to the pending chunks of the active segment:
    # ``_chunk`` for ENQ records, ``_other`` for the rest (ACK, MARK, PURGE,
    # REDELIVER_ALL).  A segment sealed before they were written keeps its
    # pending chunks in ``_sealed``.  writePhase() writes them: phase 1 the
    # ENQ chunks, phase 2 the others (each chunk at a position fixed when
    # its first record was appended: a segment's ENQ chunk, then its other
    # chunk), phase 0 both.  The store fsyncs every log's phase 1 before any
    # phase 2 when a commit moves messages between queues, so a crash can
    # leave a message in both queues, never in neither.  finish() then
    # makes the written chunks part of the segments; rollback() undoes them.

    def _active(self):
        """The segment the next records go to, starting a new one when needed."""
        segs = self.segments
        if segs:
            seg = segs[-1]
            # a segment without messages is never sealed: the next one would
            # start at the same offset, under the same file name
            if seg.size + len(self._chunk) + len(self._other) < self.segmentBytes or not seg.ids:
                return seg
        return self._roll()

    def _roll(self):
        """Seal the active segment and start the next (its file is made when written)."""
        segs = self.segments
        if segs and (self._count or self._otherCount):
            self._sealed.append(_Pending(segs[-1], self._chunk, self._count, self._other,
                                         self._otherCount, segs[-1] in self._unborn))
            self._chunk = _Parts()
            self._other = bytearray()
            self._count = self._otherCount = 0
        first = segs[-1].next if segs else self.committed
        seg = Segment(first, os.path.join(self.directory, segmentName(first)), FILE_HEADER.size)
        self._unborn.add(seg)
        self._addSegment(seg)
        return seg

    def enqueue(self, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered, exchange, routingKey,
                propsRaw, body):
        """Append a message (names encoded, bytes); returns its offset."""
        return self.enqueueRecord(storeId, seq, enqueuedAtMs, redelivered, encodedEnq(
            storeId, seq, enqueuedAtMs, expiresAtMs, redelivered, exchange, routingKey, propsRaw, body))

    def enqueueRecord(self, storeId, seq, enqueuedAtMs, redelivered, record):
        """Append a message already encoded (:func:`encodedEnq`); returns its offset."""
        seg = self._active()
        chunk = self._chunk
        if len(seg.ids) % INDEX_EVERY == 0:
            # the ENQ chunk is written first at seg.size
            seg.index.append(seg.size + CHUNK_HEADER.size + len(chunk))
            seg.stamps.append(enqueuedAtMs)
        if redelivered and not record[ENQ_FLAGS_AT]:
            # marked after it was encoded
            record = record[:ENQ_FLAGS_AT] + b"\x01" + record[ENQ_FLAGS_AT + 1:]
        chunk += record
        self._count += 1
        if self._lastSeq is not None and seq < self._lastSeq:
            self.disordered = True
        self._lastSeq = seq
        if storeId > self._lastId:
            # _appendId, inline (the hot path)
            seg.ids.append(storeId)
            seg.flags.append(LIVE | REDELIVERED if redelivered else LIVE)
            if seg.minId is None:
                seg.minId = storeId
                self._minIds.append(storeId)
                self._byMinId.append(seg)
            self._lastId = storeId
            seg.live += 1
        else:
            self._appendId(seg, storeId)
            if redelivered:
                seg.flags[-1] |= REDELIVERED
        return seg.first + len(seg.ids) - 1

    def enqueueBatch(self, firstId, enqueuedAtMs, head, entries, count):
        """
        Append ``count`` messages as one BATCH record (streams: ``head`` from
        :func:`encodedBatch`, then ``entries``, bytes); their ids are
        ``firstId``...; returns the first one's offset.
        """
        seg = self._active()
        chunk = self._chunk
        base = len(seg.ids)
        pos = seg.size + CHUNK_HEADER.size + len(chunk)
        k = -(-base // INDEX_EVERY) * INDEX_EVERY
        while k < base + count:
            # the sparse index points at the record holding the indexed offset
            seg.index.append(pos)
            seg.stamps.append(enqueuedAtMs)
            k += INDEX_EVERY
        chunk += head
        if head[4] == BATCH_CRC:
            # the entries' CRC is in the head: the chunk's CRC combines it (not hashed again)
            chunk.add(entries, _U32.unpack_from(head, BATCH_HEAD.size)[0])
        else:
            chunk += entries
        self._count += count
        self._lastSeq = firstId + count - 1
        self._appendIds(seg, firstId, count)
        return seg.first + base

    def ack(self, storeId):
        """Message ``storeId`` left the queue; False if it was not live here."""
        offset = self.locate(storeId)
        if offset is None:
            return False
        seg = self._active()
        if offset >= seg.first:
            # in the active segment (the common case), inline _ackOffset
            j = offset - seg.first
            f = seg.flags[j]
            seg.flags[j] = f & OUT_OF_ORDER
            seg.live -= 1
            if f & OUT_OF_ORDER:
                self._dropException(offset)
        else:
            self._ackOffset(seg, offset)
        self._other += REF.pack(9, ACK, offset)
        self._otherCount += 1
        return True

    def mark(self, storeId):
        """Message ``storeId`` was delivered (comes back redelivered)."""
        offset = self.locate(storeId)
        if offset is None:
            return False
        seg = self._active()
        self._markOffset(seg, offset)
        self._other += REF.pack(9, MARK, offset)
        self._otherCount += 1
        return True

    def purge(self, keepIds):
        """Every live message leaves except those of the storeIds in ``keepIds``."""
        keep = [o for o in (self.locate(i) for i in keepIds) if o is not None]
        seg = self._active()
        upto = seg.next
        self._purgeBelow(seg, upto, set(keep))
        self._other += PURGE_HEAD.pack(13 + 8 * len(keep), PURGE, upto, len(keep))
        if keep:
            self._other += struct.pack("<%dQ" % len(keep), *keep)
        self._otherCount += 1

    def redeliverAll(self):
        """Every live message comes back redelivered (after an unclean stop)."""
        seg = self._active()
        upto = seg.next
        self._redeliverAll(seg, upto)
        self._other += REF.pack(9, REDELIVER_ALL, upto)
        self._otherCount += 1

    def _pending(self):
        """The pending chunks, sealed segments first: a list of :class:`_Pending`."""
        pending = list(self._sealed)
        if self._count or self._otherCount:
            seg = self.segments[-1]
            pending.append(_Pending(seg, self._chunk, self._count, self._other, self._otherCount,
                                    seg in self._unborn))
        return pending

    def hasPending(self):
        """True when records wait to be written."""
        return bool(self._sealed or self._count or self._otherCount)

    def pendingKinds(self):
        """``(has ENQ records, has other records)`` waiting to be written."""
        enq = bool(self._count) or any(p.count for p in self._sealed)
        other = bool(self._otherCount) or any(p.otherCount for p in self._sealed)
        return enq, other

    def _fdFor(self, pend, synced):
        seg = pend.seg
        fd = self._fds.get(seg.path)
        if fd is None:
            # O_DSYNC: each write returns once its data is durable (one
            # system call instead of a write and an fdatasync: the writer
            # thread waits for the GIL after each call it makes)
            if pend.new and seg.path not in self._createdPaths:
                fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DSYNC, 0o644)
                # made: a rollback removes it, even if the header write fails
                self._fds[seg.path] = fd
                self._createdPaths.append(seg.path)
                os.pwrite(fd, FILE_HEADER.pack(FILE_MAGIC, seg.first), 0)
                synced.setdefault("dirs", set()).add(self.directory)
            else:
                fd = os.open(seg.path, os.O_WRONLY | os.O_DSYNC)
            self._fds[seg.path] = fd
        return fd

    def writePhase(self, phase, synced):
        """
        Write the pending ENQ chunks (``phase`` 1), the other chunks (2) or
        both (0), one write per segment, durable when it returns (the
        files are opened ``O_DSYNC``), creating segment files as needed;
        adds to ``synced["dirs"]`` the directories to fsync
        (:func:`syncWritten`).  Nothing is part of the log until
        :meth:`finish`.
        """
        if self._rollbackSizes is None:
            self._rollbackSizes = {}
        if phase:
            self._split = True
        for pend in self._pending():
            seg = pend.seg
            self._rollbackSizes.setdefault(seg.path, seg.size)
            at = seg.size
            start = None
            parts = []
            if phase == 0:
                # one chunk: the commit is all there or not at all
                data = pend.enq.pieces()
                crc = pend.enq.crc()
                if pend.other:
                    other = bytes(pend.other)
                    data = data + [other]
                    crc = crc32(other, crc)
                size = len(pend.enq) + len(pend.other)
                start = at
                parts.append(CHUNK_HEADER.pack(CHUNK_MAGIC, size, crc, pend.count + pend.otherCount))
                parts.extend(data)
            else:
                for which, data, count in ((1, pend.enq.pieces(), pend.count),
                                           (2, [bytes(pend.other)], pend.otherCount)):
                    if not count:
                        continue
                    size = sum(len(x) for x in data)
                    if phase == which:
                        start = at
                        crc = pend.enq.crc() if which == 1 else _crc(data)
                        parts.append(CHUNK_HEADER.pack(CHUNK_MAGIC, size, crc, count))
                        parts.extend(data)
                    at += CHUNK_HEADER.size + size
            if parts:
                # the chunks of one phase are contiguous: one write (gathered, not joined)
                fd = self._fdFor(pend, synced)
                total = sum(len(x) for x in parts)
                written = _pwritev(fd, parts, start)
                if written < total:
                    out = b"".join(parts)
                    while written < total:
                        written += os.pwrite(fd, out[written:], start + written)

    def finish(self):
        """The written chunks are durable and committed: they are part of the segments now."""
        for pend in self._pending():
            seg = pend.seg
            if self._split:
                if pend.count:
                    seg.size += CHUNK_HEADER.size + len(pend.enq)
                if pend.otherCount:
                    seg.size += CHUNK_HEADER.size + len(pend.other)
            else:
                seg.size += CHUNK_HEADER.size + len(pend.enq) + len(pend.other)
            self._unborn.discard(seg)
        self._split = False
        self._sealed = []
        self._chunk = _Parts()
        self._other = bytearray()
        self._count = self._otherCount = 0
        segs = self.segments
        # readers see it at done(): a failed commit is rolled back and its
        # offsets are used again
        self._flushed = segs[-1].next if segs else self.committed
        # keep only the active segment's file open
        active = segs[-1].path if segs else None
        for path in [p for p in self._fds if p != active]:
            os.close(self._fds.pop(path))

    def flush(self):
        """
        Write and fsync the pending records on the calling thread
        (recovery, migration, tests): :meth:`writePhase` 0, fsync,
        :meth:`finish`.  :meth:`rollback` can still undo it until
        :meth:`done`.
        """
        if not self.hasPending():
            return
        synced = {}
        self.writePhase(0, synced)
        syncWritten(synced)
        self.finish()

    def done(self):
        """
        The commit covering the flushed records succeeded: forget how to
        undo it, and let readers see its messages (:attr:`committed`).
        """
        self._rollbackSizes = None
        self._createdPaths = []
        if self._flushed is not None:
            self.committed = self._flushed
            self._flushed = None

    def rollback(self):
        """
        The commit failed: cut the files back to what they held before it,
        remove the segments it created, and read the state back from disk.
        """
        self._closeFd()
        created = set(self._createdPaths)
        for path, size in (self._rollbackSizes or {}).items():
            if path not in created and os.path.exists(path):
                with open(path, "r+b") as f:
                    f.truncate(size)
        for path in created:
            _remove(path)
        committed = self.committed
        first = self.segments[0].first if self.segments else committed
        fresh = QueueLog.open(self.directory, self.segmentBytes, truncateTail=True)
        for seg in fresh.segments:
            # no recovery stream reads them (it would find them again)
            seg.positions = None
            seg.meta = None
        if not fresh.segments:
            fresh.committed = min(committed, first)
        self.__dict__.update(fresh.__dict__)

    def reclaim(self):
        """
        Delete the segments that hold nothing live and pin nothing (never
        the active one); returns how many were deleted.
        """
        deleted = 0
        while True:
            gone = [s for s in self.segments[:-1] if not s.live and not s.pins]
            if not gone:
                return deleted
            for seg in gone:
                _remove(seg.path)
                self._forget(seg)
                deleted += 1
            _fsyncDirectory(self.directory)

    def _forget(self, seg):
        self.segments.remove(seg)
        if seg.minId is not None:
            i = self._byMinId.index(seg)
            del self._byMinId[i]
            del self._minIds[i]
        for newer in seg.pinnedBy:
            newer.pins.discard(seg)
        for older in seg.pins:
            older.pinnedBy.discard(seg)

    def close(self):
        """Close the segment files (writer thread)."""
        self._closeFd()

    def _closeFd(self):
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    # --- reading -----------------------------------------------------------------

    def liveCount(self):
        """Messages live in the log (int)."""
        return sum(s.live for s in self.segments)

    def liveBytes(self):
        """
        Body bytes of the live messages (int); only known between
        :meth:`open` and the recovery stream (reads record headers).
        """
        total = 0
        for seg in self.segments:
            if not seg.live or seg.meta is None:
                continue
            flags = seg.flags
            sizes = seg.meta[1]
            if seg.live == len(flags):
                total += sum(sizes)
            else:
                total += sum(size for f, size in zip(flags, sizes) if f & LIVE)
        return total

    def ranges(self, start, limit=512):
        """
        The live messages from ``start`` = ``(segment index, index in it)``
        on, as :class:`LogRange` s of at most ``limit`` messages within one
        segment (what a queue pages without reading: recovery hands the
        tail of a deep queue to the broker this way, so the paged messages
        stay in the log and are not copied).  Only between :meth:`open` and
        the end of the recovery stream (needs the scan's positions).
        """
        out = []
        i, j = start
        segs = self.segments
        while i < len(segs):
            seg = segs[i]
            if not seg.live:
                # nothing to page (its positions were not kept)
                i += 1
                j = 0
                continue
            if seg.positions is None:
                raise ValueError("ranges() after the recovery stream")
            flags = seg.flags
            positions = seg.positions
            seqs, sizes, expiries = seg.meta
            n = len(flags)
            while j < n:
                rng = LogRange(seg.path)
                while j < n and rng.count < limit:
                    f = flags[j]
                    if f & LIVE:
                        rng.add(positions[j], bool(f & REDELIVERED), seqs[j], sizes[j], expiries[j])
                    j += 1
                if rng.count:
                    out.append(rng)
            i += 1
            j = 0
        return out

    def releaseRecovery(self):
        """Forget the scan's per-message arrays (after the recovery stream)."""
        for seg in self.segments:
            seg.positions = None
            seg.meta = None

    def liveRecords(self, release=True):
        """
        Yield ``(segment index, index in it, record)`` for each live message
        in offset order, reading one segment at a time; ``record`` as in
        :meth:`recovered`, its redelivered flag from the log's state.  With
        ``release`` a segment's recovery arrays are dropped once it is read.
        """
        for i, seg in enumerate(list(self.segments)):
            if not seg.live:
                continue
            with open(seg.path, "rb") as f:
                buf = f.read(seg.size)
            flags = seg.flags
            positions = seg.positions
            if positions is None:
                positions = _positions(buf, seg)
            for j, pos in enumerate(positions):
                f = flags[j]
                if f & LIVE:
                    rec = decodeEnq(buf, pos)
                    if f & REDELIVERED and not rec[4]:
                        rec = rec[:4] + (True,) + rec[5:]
                    yield i, j, rec
            if release:
                seg.positions = None
                seg.meta = None

    def recovered(self, allRedelivered=False):
        """
        Yield ``(storeId, seq, enqueuedAtMs, expiresAtMs, redelivered,
        exchange, routingKey, propsRaw, body)`` (names as bytes) for each
        live message in offset order, reading one segment at a time.
        Meant for the recovery stream, before the queue changes.
        """
        for _, _, rec in self.liveRecords():
            if allRedelivered and not rec[4]:
                rec = rec[:4] + (True,) + rec[5:]
            yield rec

    def read(self, offset, limit=None):
        """
        Yield ``(offset, record)`` for the messages from ``offset`` on, acked
        or not, up to the committed end (what a stream reader or a follower
        reads; ``record`` as in :meth:`recovered`).  Finds the start with
        the sparse index, without reading the log before it.
        """
        emitted = 0
        if limit is not None and limit <= 0:
            return
        offset = max(offset, self.segments[0].first if self.segments else offset)
        for seg in list(self.segments):
            if seg.next <= offset:
                continue
            # past a reclaimed segment: go on at this one's first message
            offset = max(offset, seg.first)
            end = min(seg.next, self.committed)
            if offset >= end:
                return
            try:
                with open(seg.path, "rb") as f:
                    buf = f.read(seg.size)
            except FileNotFoundError:
                # reclaimed by the writer since this reader took the list
                continue
            k = (offset - seg.first) // INDEX_EVERY
            pos = seg.index[k] if k < len(seg.index) else FILE_HEADER.size
            o = seg.first + k * INDEX_EVERY
            # len(buf): a rollback may have cut the file since seg.size was read
            for o2, p in _iterEnq(buf, pos, len(buf)):
                o_ = o + o2
                if o_ >= end:
                    break
                if o_ >= offset:
                    yield o_, decodeEnq(buf, p)
                    emitted += 1
                    if limit is not None and emitted >= limit:
                        return
            offset = end

    def offsetAt(self, timestampMs):
        """
        The first offset whose message was enqueued at or after
        ``timestampMs`` (float, ms since the epoch), or the committed end
        if there is none: the sparse timestamp index finds the block, one
        block (at most :data:`INDEX_EVERY` records) is read.  Enqueue
        times are assumed to grow with the offset (as they do when the
        broker's clock does not step back).
        """
        for seg in list(self.segments):
            stamps = seg.stamps
            if not stamps or seg.next <= seg.first:
                continue
            k = bisect.bisect_left(stamps, timestampMs)
            if k == len(stamps) and seg is not self.segments[-1]:
                # maybe in the last block of this segment
                start = seg.first + (k - 1) * INDEX_EVERY
                for offset, rec in self.read(start, INDEX_EVERY):
                    if rec[2] >= timestampMs:
                        return offset
                continue
            start = seg.first + max(k - 1, 0) * INDEX_EVERY
            for offset, rec in self.read(start, 2 * INDEX_EVERY):
                if rec[2] >= timestampMs:
                    return offset
        return self.committed


class _Pending:
    """A segment's records not written yet: its ENQ chunk and its other chunk."""

    __slots__ = ("seg", "enq", "count", "other", "otherCount", "new")

    def __init__(self, seg, enq, count, other, otherCount, new):
        self.seg = seg
        self.enq = enq
        self.count = count
        self.other = other
        self.otherCount = otherCount
        self.new = new


def syncWritten(synced):
    """
    Make what :meth:`QueueLog.writePhase` wrote durable: its writes are
    (``O_DSYNC``), so this fsyncs the directories of new files.
    """
    for directory in synced.get("dirs", ()):
        _fsyncDirectory(directory)


class LogRange:
    """
    Live messages of one segment, by byte position: a paged run of a
    recovered queue that stays in the log (:meth:`QueueLog.ranges`).

    :ivar path: the segment file (str).  :ivar positions: ``array('I')``.
    :ivar redelivered: ``bytearray`` of 0/1 per message.
    :ivar firstSeq, lastSeq: ints.  :ivar count: int.  :ivar bytes: body
        bytes (int).  :ivar minExpiresAt: earliest expiry (ms) or None.
    """

    __slots__ = ("path", "positions", "redelivered", "firstSeq", "lastSeq", "count", "bytes",
                 "minExpiresAt")

    def __init__(self, path):
        self.path = path
        self.positions = array("I")
        self.redelivered = bytearray()
        self.firstSeq = None
        self.lastSeq = None
        self.count = 0
        self.bytes = 0
        self.minExpiresAt = None

    def add(self, position, redelivered, seq, size, expiresAt):
        """One more message (``expiresAt``: clock ms, NaN for none; ``size``: bytes)."""
        self.positions.append(position)
        self.redelivered.append(1 if redelivered else 0)
        if self.firstSeq is None:
            self.firstSeq = seq
        self.lastSeq = seq
        self.count += 1
        self.bytes += size
        if expiresAt == expiresAt and (self.minExpiresAt is None or expiresAt < self.minExpiresAt):
            self.minExpiresAt = expiresAt

    def read(self):
        """
        Read the messages back: a list of ``(storeId, seq, enqueuedAtMs,
        expiresAtMs, redelivered, exchange, routingKey, propsRaw, body)``
        (names as bytes), in order.
        """
        with open(self.path, "rb") as f:
            buf = f.read()
        out = []
        for pos, redelivered in zip(self.positions, self.redelivered):
            rec = decodeEnq(buf, pos)
            if redelivered and not rec[4]:
                rec = rec[:4] + (True,) + rec[5:]
            out.append(rec)
        return out


_DEAD = bytes(f & OUT_OF_ORDER for f in range(256))


class _Parts:
    """
    The ENQ records of a pending chunk: the bytes appended (``+=``), kept
    as they are and joined at most once, when written (appending to a
    ``bytearray`` copies every byte, which is slow on PyPy).
    """

    __slots__ = ("parts", "n", "crcs")

    def __init__(self):
        self.parts = []
        self.n = 0
        # each part's CRC-32 when known (a BATCH_CRC record's entries), else None
        self.crcs = []

    def __iadd__(self, data):
        self.parts.append(data)
        self.crcs.append(None)
        self.n += len(data)
        return self

    def add(self, data, crc):
        """Append ``data`` whose CRC-32 is ``crc``."""
        self.parts.append(data)
        self.crcs.append(crc)
        self.n += len(data)

    def __len__(self):
        return self.n

    def crc(self):
        """The CRC-32 of the bytes: the known ones combined, the rest hashed."""
        c = 0
        for p, k in zip(self.parts, self.crcs):
            c = crc32(p, c) if k is None else crc32_combine(c, k, len(p))
        return c

    def pieces(self):
        """
        The bytes as a short list: joined when there are many small ones (one
        write takes a few); large ones (a stream's BATCH records, about 100 KiB
        a publish frame of 1 KiB messages) are written as they are, up to 512.
        """
        parts = self.parts
        if len(parts) > 16 and (len(parts) > 512 or self.n < 512 * len(parts)):
            crc = self.crc()
            self.parts = [b"".join(parts)]
            self.crcs = [crc]
        return self.parts


def _crc(parts):
    crc = 0
    for p in parts:
        crc = crc32(p, crc)
    return crc


def _pwritev(fd, parts, offset):
    """
    Write ``parts`` at ``offset`` in one system call; returns the bytes
    written.  PyPy has no ``os.pwritev``: parts that are all ``bytes`` are
    joined (cffi would copy each), others (the stream door's entries, in
    memory that does not move) go through libc's ``pwritev``
    (:mod:`otter_tx.store.rawio`).
    """
    if len(parts) > 1:
        pwritev = getattr(os, "pwritev", None)
        if pwritev is not None:
            return pwritev(fd, parts, offset)
        if PWRITEV is not None and not all(type(p) is bytes for p in parts):
            return PWRITEV(fd, parts, offset)
    return os.pwrite(fd, b"".join(parts), offset)


def _bisectFirst(segs, offset):
    lo, hi = 0, len(segs)
    while lo < hi:
        mid = (lo + hi) // 2
        if offset < segs[mid].first:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def _iterEnq(buf, pos, end):
    """Yield (index among ENQ records from pos, byte position) through chunks and records."""
    # pos is either the file header end or a record position inside a chunk;
    # walk chunk by chunk from the start when it is a chunk boundary
    unpackLT = _LEN_TYPE.unpack_from
    k = 0
    p = FILE_HEADER.size
    while p < end:
        magic, length, _, _ = CHUNK_HEADER.unpack_from(buf, p)
        start = p + CHUNK_HEADER.size
        stop = start + length
        if stop <= pos:
            p = stop
            continue
        q = max(start, pos) if pos >= start else start
        while q + _LEN_TYPE.size <= stop:
            n, kind = unpackLT(buf, q)
            if kind == ENQ:
                yield k, q
                k += 1
            q += 4 + n
        p = stop


def _validChunkAt(buf, pos):
    """True if a whole chunk with its magic and a matching CRC starts at ``pos`` of ``buf``."""
    if len(buf) - pos < CHUNK_HEADER.size:
        return False
    magic, length, crc, _ = CHUNK_HEADER.unpack_from(buf, pos)
    start = pos + CHUNK_HEADER.size
    return magic == CHUNK_MAGIC and start + length <= len(buf) and crc32(buf[start:start + length]) == crc


def _positions(buf, seg):
    out = array("I")
    for _, p in _iterEnq(buf, FILE_HEADER.size, seg.size):
        out.append(p)
    return out


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _fsyncDirectory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
