"""
Streams: RabbitMQ's append-only, replayable queues (``x-queue-type: stream``;
https://www.rabbitmq.com/docs/streams), on the message log's segment files
(:class:`~otter_tx.store.log.segments.QueueLog`, docs/storage.md "The message
log").  docs/streams.md describes what works and what differs; the API the
stream protocol door builds on is :class:`StreamLog` / :class:`StreamReader`
(``/work/wt/STREAM_API.md`` while both are built).

Parts:

- :class:`StreamRegistry` (``Broker.streams``): where stream logs live
  (``<dataDir>/streams``, or a temporary directory for a broker without a
  data directory: a stream always has its messages in a log on disk) and
  how their writes run (inline, or on a thread the service provides).
- :class:`StreamLog`: one stream: appends as one group commit per reactor
  turn (a Deferred per message fires when it is durable: publisher
  confirms), offsets, readers, listeners told when the committed end moves,
  retention by size and age (whole segments, evaluated when a segment
  rolls over, as RabbitMQ does).
- :class:`StreamReader`: a cursor at an offset, reading committed messages
  from disk through the sparse offset index, a bounded batch per call; memory
  stays bounded whatever the backlog (sealed segments keep only their sparse
  indexes in memory).
- :class:`StreamQueue`: the AMQP 0-9-1 face (an :class:`~otter_tx.broker.
  interfaces.IQueue`): each consumer is a reader at its ``x-stream-offset``,
  deliveries carry ``x-stream-offset``, acks only return credit.
- the argument rules: :func:`parseMaxAge`, :func:`parseOffsetSpec`.

Nothing here imports the global reactor; time comes from the vhost's clock.
"""

import bisect
import mmap
import os
import shutil
import struct
import sys
import tempfile
import weakref

from twisted.internet import defer
from zope.interface import implementer

from otter_tx.amqp.codec import TaggedInt, Timestamp
from otter_tx.amqp.errors import AMQPError, notImplemented, preconditionFailed, resourceText
from otter_tx.broker.arguments import _DURATION, _Crash, _duration, parseMaxAge
from otter_tx.broker.expiry import nowMs
from otter_tx.broker.interfaces import IDeclaredQueue, IQueue
from otter_tx.broker.message import Message
from otter_tx.broker.queue import Queue
from otter_tx.broker.streamconvert import toMessage
from otter_tx.store.log import segments as _seg
from otter_tx.store.log.segments import crc32 as _crc32
from otter_tx.store.log.segments import (BATCH, BATCH_CRC, BATCH_CRC_HEAD, BATCH_HEAD, CHUNK_HEADER, ENQ,
                                         FILE_HEADER, INDEX_EVERY, QueueLog, decodeEnq)

__all__ = ["StreamRegistry", "StreamLog", "StreamReader", "StreamQueue", "OffsetSpec", "parseMaxAge",
           "parseOffsetSpec", "findStream", "declareStream", "deleteStream", "applyRetention", "STREAM"]

STREAM = "stream"

#: the segment size without x-stream-max-segment-size-bytes: 64 MiB (RabbitMQ's
#: default is 500 MB; smaller segments make retention finer and a restart,
#: which reads each segment once, lighter; docs/streams.md)
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
#: messages one StreamQueue.dispatch call hands out before yielding the reactor
DISPATCH_MESSAGES = 256
#: messages one reader read fetches (a bounded piece of disk work)
READ_BATCH = 128
#: most message bytes one reader read returns
READ_BYTES = 1024 * 1024
#: bytes read from a segment file at a time (a larger record is read whole)
READ_PIECE = 64 * 1024
#: what a reader reads after a record it left in the file (FileRange): the next record's head
HEAD_PIECE = 4096
#: the most a reader reads at a time after meeting records larger than READ_PIECE
MAX_READ_PIECE = 1024 * 1024
#: writers (forwarding nodes' publishers) a stream remembers the last sequence of
MAX_WRITERS = 4096
#: a stream entry's size (big endian, as a stream protocol chunk holds it)
_BE_U32 = struct.Struct(">I")
#: stream clients' messages an AMQP 0-9-1 reader converted, kept per stream for the readers
#: after it (consumers in step convert each message once): at most this many
CONVERTED_MESSAGES = 4096
#: StreamLog -> {offset: Message} (insertion order: the oldest conversion goes first)
_converted = weakref.WeakKeyDictionary()
#: a large record read for a stream client is a view of the segment file mapped (``mmap``): sent
#: from the page cache, no ``pread`` copy (its CRC is stored: no read either); on PyPy the door
#: writes it with libc's writev (``otter_tx.door.writev``), whose absence (no cffi) falls back to
#: RANGES
MAPPED = sys.implementation.name != "pypy"
#: on PyPy without that writev, a large record is left on disk (a :class:`FileRange`, sent with
#: ``sendfile``): gigabytes a second of large strings cost its GC more than the rest
RANGES = sys.implementation.name == "pypy"


def isMapped(part):
    """True when ``part`` (a chunk's) is a view of a mapped segment file (``readRaw`` with ``mapped``)."""
    return type(part) is memoryview and type(part.obj) is mmap.mmap


class FileRange:
    """
    ``size`` bytes of the open (unbuffered) file ``f`` at ``pos``, not read:
    what a :class:`StreamReader` gives with ``ranges`` for the entries of a
    large BATCH record. Valid while ``f`` is open (a closed file raises
    ValueError rather than reading another).
    """

    __slots__ = ("f", "pos", "size")

    def __init__(self, f, pos, size):
        self.f = f
        self.pos = pos
        self.size = size

    def __len__(self):
        return self.size

    def __repr__(self):
        return "<FileRange %d+%d>" % (self.pos, self.size)

    def pieces(self, start=0):
        """Its bytes from ``start`` on, in pieces of at most :data:`READ_PIECE` bytes."""
        fd = self.f.fileno()
        at = self.pos + start
        end = self.pos + self.size
        while at < end:
            piece = os.pread(fd, min(READ_PIECE, end - at), at)
            if not piece:
                raise OSError("segment file shorter than its record")
            yield piece
            at += len(piece)

    def read(self, start=0):
        """Its bytes from ``start`` on (bytes)."""
        return b"".join(self.pieces(start))

    def crc32(self, crc=0):
        """``zlib.crc32`` of its bytes, from ``crc``, read into scratch buffers (nothing to collect)."""
        f = self.f
        at = self.pos
        end = self.pos + self.size
        while at < end:
            n = min(READ_PIECE, end - at)
            buf = _scratch.get(n)
            if buf is None:
                if len(_scratch) >= 16:
                    _scratch.clear()
                buf = _scratch[n] = bytearray(n)
            f.seek(at)
            if f.readinto(buf) != n:
                raise OSError("segment file shorter than its record")
            crc = _crc32(buf, crc)
            at += n
        return crc


#: bytearrays FileRange.crc32 reads into, by size (the reactor thread's only)
_scratch = {}



class OffsetSpec:
    """
    Where a reader starts: ``kind`` is ``first``, ``last``, ``next``,
    ``offset`` (``value`` int), ``timestamp`` (``value`` ms since the epoch).
    """

    __slots__ = ("kind", "value")

    def __init__(self, kind, value=None):
        self.kind = kind
        self.value = value

    def __repr__(self):
        return "OffsetSpec(%r, %r)" % (self.kind, self.value)

    def __eq__(self, other):
        return isinstance(other, OffsetSpec) and (self.kind, self.value) == (other.kind, other.value)


def parseOffsetSpec(value, now=None):
    """
    An :class:`OffsetSpec` from an ``x-stream-offset`` consumer argument or
    an API value: ``"first"``, ``"last"``, ``"next"``, an integer offset
    (negative: first), an AMQP timestamp (:class:`~otter_tx.amqp.codec.
    Timestamp`, seconds), an interval string such as ``"10m"`` (that long
    before ``now``, ms), ``("timestamp", ms)``, ``("interval", "10m")``, or
    an OffsetSpec.  Raises ValueError for anything else (see
    :meth:`StreamQueue.checkConsume` for RabbitMQ's errors).
    """
    if isinstance(value, OffsetSpec):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        kind, v = value
        if kind == "timestamp":
            return OffsetSpec("timestamp", float(v))
        if kind == "interval":
            value = v
        else:
            raise ValueError(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if type(value) is Timestamp:
        return OffsetSpec("timestamp", int(value) * 1000.0)
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return OffsetSpec(value)
        try:
            seconds = _duration(value)
        except _Crash:
            raise ValueError(value)
        if seconds is None:
            raise ValueError(value)
        if now is None:
            raise ValueError("an interval needs the time")
        return OffsetSpec("timestamp", now - seconds * 1000.0)
    if isinstance(value, int) and not isinstance(value, bool):
        return OffsetSpec("offset", max(int(value), 0))
    raise ValueError(value)


class _Count:
    """
    Stands for a stream segment's per-message id array (``Segment.ids``):
    only its length is kept (a stream's messages are never acknowledged, so
    the log never looks an id up); ``append`` counts.
    """

    __slots__ = ("n",)

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def append(self, _):
        self.n += 1

    def extend(self, ids):
        self.n += len(ids)


class _NoFlags:
    """Stands for a stream segment's per-message flags (``Segment.flags``): nothing is kept."""

    __slots__ = ()

    def append(self, _):
        pass

    def extend(self, _):
        pass

    def __len__(self):
        return 0

    def __getitem__(self, i):
        raise IndexError(i)


def _dirName(vhost, name):
    return "%s.%s" % (vhost.encode("utf-8", "surrogateescape").hex(), name.encode("utf-8", "surrogateescape").hex())


class StreamRegistry:
    """
    Where the streams' logs live and how their writes run (``Broker.streams``).

    :param root: directory (str) holding one subdirectory per stream, or None
        for a temporary directory made on first use (a broker without a data
        directory; removed by :meth:`close`).
    :ivar runInThread: ``f -> Deferred`` running ``f()`` off the reactor
        (the service sets ``threads.deferToThread``), or None: writes run
        inline on the reactor at the end of the turn (tests).
    """

    def __init__(self, root=None):
        self.root = root
        self._temp = None
        self._swept = False
        self.runInThread = None
        #: appends not durable yet, over every stream (int; publisher confirms wait when non-zero)
        self.unsynced = 0
        #: {(vhost, name): StreamLog}
        self.logs = {}

    def directory(self):
        """The root directory, made now if needed."""
        if self.root is None:
            if self._temp is None:
                self._temp = tempfile.mkdtemp(prefix="otter-streams-")
            return self._temp
        if not self._swept:
            os.makedirs(self.root, exist_ok=True)
            # streams deleted just before a crash: their directories were moved aside
            for name in os.listdir(self.root):
                if ".deleted-" in name:
                    shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
            self._swept = True
        return self.root

    def open(self, clock, vhost, name, segmentBytes=DEFAULT_SEGMENT_BYTES):
        """The :class:`StreamLog` of stream ``name`` in ``vhost`` (str), opened or created."""
        key = (vhost, name)
        log = self.logs.get(key)
        if log is None:
            path = os.path.join(self.directory(), _dirName(vhost, name))
            log = self.logs[key] = StreamLog(self, clock, vhost, name, path, segmentBytes)
        return log

    def orphans(self):
        """
        The stream directories under the root that no open log uses (list of
        ``(vhost, name, path)``): a cluster node's copies of streams that were
        deleted, or whose member it stopped being, while it was down.
        """
        if self.root is None or not os.path.isdir(self.root):
            return []
        used = {os.path.basename(log.directory) for log in self.logs.values()}
        out = []
        for entry in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, entry)
            if entry in used or ".deleted-" in entry or not os.path.isdir(path):
                continue
            vhost, dot, name = entry.partition(".")
            try:
                out.append((bytes.fromhex(vhost).decode("utf-8", "surrogateescape"),
                            bytes.fromhex(name).decode("utf-8", "surrogateescape"), path))
            except ValueError:
                continue  # not a stream's (_dirName)
        return out

    def forget(self, log):
        """``log`` was deleted."""
        if self.logs.get((log.vhost, log.name)) is log:
            del self.logs[(log.vhost, log.name)]

    def pending(self):
        """Deferreds of the appends not durable yet (list)."""
        out = []
        for log in self.logs.values():
            if log._waiting or log._incoming:
                out.append(log.sync())
        return out

    def drain(self):
        """A Deferred firing once every append made so far is durable (or failed)."""
        return defer.DeferredList(self.pending(), consumeErrors=True)

    def close(self):
        """Close every log's files (after :meth:`drain`); a temporary root is removed."""
        for log in list(self.logs.values()):
            log.close()
        self.logs = {}
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None


#: PyPy: most records of at least _LARGE_ENTRIES bytes (a publish frame of 100 messages of 1 KiB is
#: 100 KiB) one commit of a stream writes (two parts each: otter_tx.store.log.segments,
#: _Parts.pieces, joins a commit of more than 512 into one string: three publishers at full speed
#: made a major collection a commit, 2.4 us of broker CPU a message against 1.3 with this).  None
#: on CPython, where that join is a cheap copy and more commits cost more (1.0 against 2.2 us with
#: three publishers): docs/performance.md
COMMIT_LARGE_RECORDS = 240 if sys.implementation.name == "pypy" else None
_LARGE_ENTRIES = 4096


class StreamLog:
    """
    One stream: a :class:`~otter_tx.store.log.segments.QueueLog` whose
    messages are never acknowledged, appended to by :meth:`append` and read
    by any number of :class:`StreamReader` s.

    Offsets are the log's: 0 for the first message ever, never reused.
    ``first`` moves when retention deletes the oldest segments.
    """

    def __init__(self, registry, clock, vhost, name, directory, segmentBytes=DEFAULT_SEGMENT_BYTES):
        self.registry = registry
        self.clock = clock
        self.vhost = vhost
        self.name = name
        self.directory = directory
        self.segmentBytes = segmentBytes
        self._openLog()
        #: retention: bytes (x-max-length-bytes) and seconds (x-max-age), None for none
        self.maxBytes = None
        self.maxAgeSeconds = None
        self.deleted = False
        self._listeners = []
        # appends of this turn: (record, enqueuedAtMs, Deferred or None, message count):
        # an ENQ record's bytes and None, or a BATCH record's (head, entries) and its count
        self._incoming = []
        # appends being written: their Deferreds (offset order)
        self._waiting = []
        # sync(): (offset the appends so far reach, Deferred), in offset order
        self._syncWaiters = []
        # a cluster's replicator the appends waiting for the next group commit were made under
        # (their confirms wait for its barrier even if it is gone by the time they are written)
        self._pendingReplicator = None
        # the replication barrier of the group commit being written (a Deferred), or None
        self._barrier = None
        self._flushCall = None
        self._writing = False
        self._nextOffset = self.log.committed
        #: a cluster's replication of this stream while this node leads it
        #: (:class:`otter_tx.cluster.streamrepl.StreamReplicator`), else None
        self.replicator = None
        #: a cluster's forwarded publishes taken: writer id (str) -> its last sequence (int), so a
        #: publish sent again to a new leader is taken once (StreamQueue.enqueueFrom)
        self.writers = {}
        #: messages appended (counter, for rates)
        self.appended = 0
        #: segments deleted by retention (counter)
        self.segmentsDeleted = 0

    def __repr__(self):
        return "<StreamLog %r in %r %d..%d>" % (self.name, self.vhost, self.first, self.committed)

    # --- offsets ---------------------------------------------------------------

    @property
    def first(self):
        """The first offset still kept (int)."""
        segs = self.log.segments
        return segs[0].first if segs else self.log.committed

    @property
    def committed(self):
        """The offset after the last durable message (int): where ``next`` attaches."""
        return self.log.committed

    @property
    def last(self):
        """The first offset of the last committed chunk (int), or None when empty."""
        if self.committed <= self.first:
            return None
        return self._lastChunk if self._lastChunk is not None else self.committed - 1

    @property
    def count(self):
        """Messages kept (int)."""
        return self.committed - self.first

    @property
    def bytes(self):
        """Bytes of the kept segments (int)."""
        return sum(s.size for s in self.log.segments)

    def segmentsInfo(self):
        """``[{"first", "next", "bytes", "path"}]`` per segment, oldest first."""
        c = self.committed
        return [{"first": s.first, "next": min(s.next, c), "bytes": s.size, "path": s.path}
                for s in self.log.segments if s.first < c or s is self.log.segments[0]]

    # --- appending -------------------------------------------------------------

    def append(self, message, wantDeferred=True):
        """
        Append ``message`` (a :class:`~otter_tx.broker.message.Message`);
        returns a Deferred firing with its offset once it is durable (None
        with ``wantDeferred=False``).  Appends of one reactor turn are one
        group commit.  On a cluster's leader (``replicator`` set) durable
        means on this node and on every in-sync follower: the group commit's
        Deferreds wait for its replication barrier (:meth:`_written`).
        """
        if self.deleted:
            return defer.fail(AMQPError(404, "stream deleted")) if wantDeferred else None
        now = nowMs(self.clock)
        offset = self._nextOffset
        self._nextOffset += 1
        ex = message.exchange.encode("utf-8", "surrogateescape")
        rk = message.routingKey.encode("utf-8", "surrogateescape")
        rec = _seg.encodedEnq(offset, offset, now, None, False, ex, rk, message.propsRaw, message.body)
        d = defer.Deferred() if wantDeferred else None
        self._incoming.append((rec, now, d, None))
        self.appended += 1
        self.registry.unsynced += 1
        if self.replicator is not None:
            self._pendingReplicator = self.replicator
        if self._flushCall is None and not self._writing:
            self._flushCall = self.clock.callLater(0, self._flush)
        return d

    def appendEntries(self, entries, count, wantDeferred=True, crc=None):
        """
        Append ``count`` messages as a stream protocol chunk holds them
        (``entries``: each message's size, u32 big endian, then its bytes, as
        a stream client published them) as one record; returns a Deferred
        firing with the first one's offset once they are durable (None with
        ``wantDeferred=False``).  ``crc``: their CRC-32 (int) when the caller
        has it, else None (computed here).  They are read back as they are (the stream
        protocol) or converted to AMQP 0-9-1 messages when an AMQP 0-9-1
        consumer reads them (:func:`otter_tx.broker.streamconvert.toMessage`).
        """
        if self.deleted:
            return defer.fail(AMQPError(404, "stream deleted")) if wantDeferred else None
        if count <= 0:
            return defer.succeed(self._nextOffset) if wantDeferred else None
        now = nowMs(self.clock)
        offset = self._nextOffset
        self._nextOffset += count
        # the entries' CRC-32 is stored with them: a consumer's chunk header is made of it (no read)
        if crc is None:
            crc = _crc32(entries)
        rec = (_seg.encodedBatch(offset, now, count, entries, crc), entries)
        d = defer.Deferred() if wantDeferred else None
        self._incoming.append((rec, now, d, count))
        self.appended += count
        self.registry.unsynced += 1
        if self.replicator is not None:
            self._pendingReplicator = self.replicator
        if self._flushCall is None and not self._writing:
            self._flushCall = self.clock.callLater(0, self._flush)
        return d

    def appendReplicated(self, items):
        """
        A follower's append of what its leader shipped (``items``: ``[(kind,
        first offset, timestamp ms, messages, bytes)]``, kind 0 an ENQ record
        as the leader's log holds it, 1 a BATCH record's entries): the same
        records at the same offsets.  False (nothing appended) when the first
        offset is not this log's next one (the follower joins again).
        """
        if self.deleted or not items or items[0][1] != self._nextOffset:
            return not items
        for kind, first, ts, count, data in items:
            if first != self._nextOffset:
                return False
            if kind == 0:
                self._incoming.append((data, ts, None, None))
                self._nextOffset += 1
                self.appended += 1
            else:
                # (the leader ships the entries; their CRC is computed here, as on the leader)
                self._incoming.append(((_seg.encodedBatch(first, ts, count, data, _crc32(data)), data), ts, None,
                                       count))
                self._nextOffset += count
                self.appended += count
            self.registry.unsynced += 1
        if self._flushCall is None and not self._writing:
            self._flushCall = self.clock.callLater(0, self._flush)
        return True

    @property
    def next(self):
        """The offset the next append gets (int): ``committed`` plus the appends not durable yet."""
        return self._nextOffset

    def _flush(self):
        self._flushCall = None
        if self._writing or not self._incoming or self.deleted:
            return
        incoming, self._incoming = self._incoming, []
        cap = COMMIT_LARGE_RECORDS
        if cap is not None and len(incoming) > cap:
            large = 0
            for i, (rec, _, _, count) in enumerate(incoming):
                if count is not None and len(rec[1]) >= _LARGE_ENTRIES:
                    large += 1
                    if large > cap:
                        # the rest in the next commit, as soon as this one is written
                        incoming, self._incoming = incoming[:i], incoming[i:]
                        break
        log = self.log
        nseg = len(log.segments)
        firstOffset = None
        waiting = []
        enqueueRecord = log.enqueueRecord
        rep = self.replicator or self._pendingReplicator
        self._pendingReplicator = None
        shipped = [] if rep is not None and rep.joined else None
        for rec, now, d, count in incoming:
            if count is None:
                o = enqueueRecord(log._lastId + 1, 0, now, False, rec)
                if shipped is not None:
                    shipped.append((0, o, now, 1, rec))
            else:
                if log.segments:
                    _trim(log.segments[-1])
                o = log.enqueueBatch(log._lastId + 1, now, rec[0], rec[1], count)
                if shipped is not None:
                    # (a memoryview is the stream door's receive buffer, lent until this commit's
                    # Deferreds fire: a follower's link may hold what it ships longer, so a copy)
                    data = rec[1]
                    shipped.append((1, o, now, count, bytes(data) if type(data) is memoryview else data))
            if firstOffset is None:
                firstOffset = o
            waiting.append((d, o))
        if rep is not None:
            # to the followers as written here (their SYNC answers come after their fsync); the
            # commit's appends are confirmed once it is durable here and the barrier fired
            self._barrier = rep.flushed(shipped)
        for seg in log.segments[nseg - 1 if nseg else 0:]:
            # the per-message arrays hold at most this turn's messages
            _trim(seg)
        self._waiting = waiting
        self._writing = True
        rolled = len(log.segments) > nseg
        run = self.registry.runInThread
        if run is None:
            try:
                log.flush()
            except Exception as e:
                self._failed(e)
            else:
                self._written(firstOffset, rolled)
        else:
            run(log.flush).addCallbacks(lambda _: self._written(firstOffset, rolled), self._failed)

    def _removeFiles(self):
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _written(self, chunkFirst, rolled):
        self._writing = False
        if self.deleted:
            self._removeFiles()
            return
        log = self.log
        log.done()
        # a commit that rolled over wrote one chunk per segment: the last starts the last segment
        self._lastChunk = max(chunkFirst, log.segments[-1].first)
        waiting, self._waiting = self._waiting, []
        barrier, self._barrier = self._barrier, None
        self.registry.unsynced -= len(waiting)
        if rolled:
            self.applyRetention()
        if barrier is None:
            for d, offset in waiting:
                if d is not None:
                    d.callback(offset)
        else:
            # one callback for the commit's appends, when its followers hold it too (the next
            # commit is written meanwhile: the two overlap)
            barrier.addCallbacks(_fireWaiting, _failWaiting, callbackArgs=(waiting,), errbackArgs=(waiting,))
        self._fireSync()
        self._notify()
        if self._incoming:
            self._flush()

    def _failed(self, failure):
        self._writing = False
        self._barrier = None
        self._pendingReplicator = None
        if self.deleted:
            self._removeFiles()
            return
        try:
            self.log.rollback()
            for seg in self.log.segments:
                _trim(seg)
        except Exception:
            pass
        self._nextOffset = self.log.committed
        waiting, self._waiting = self._waiting, []
        incoming, self._incoming = self._incoming, []
        self.registry.unsynced -= len(waiting) + len(incoming)
        for d, _ in waiting:
            if d is not None:
                d.errback(failure)
        for _, _, d, _ in incoming:
            if d is not None:
                d.errback(failure)
        syncs, self._syncWaiters = self._syncWaiters, []
        for _, d in syncs:
            d.errback(failure)
        if self.replicator is not None:
            self.replicator.flushed(None)

    def truncate(self, offset):
        """
        Drop every message from ``offset`` on (a follower whose log holds
        what a deposed leader shipped and the new one never had): the file
        is cut at the record holding ``offset`` and the log read back (a chunk
        cut in two is dropped whole, so it may end before ``offset``).  Only
        with nothing being written (the follower waits for :meth:`sync`).
        Returns the new end (int).
        """
        if offset >= self.committed or self._writing or self._incoming:
            return self.committed
        log = self.log
        segs = log.segments
        i = _seg._bisectFirst(segs, offset)
        if i < 0 or offset <= segs[0].first:
            return self.reset(min(offset, self.first))
        reader = StreamReader(self, offset)
        try:
            reader._seek()
            pos = reader._pos
            seg = reader._seg
        finally:
            reader.close()
        log.close()
        for later in segs[segs.index(seg) + 1:] if seg in segs else ():
            _seg._remove(later.path)
        if seg is not None and pos is not None:
            os.truncate(seg.path, pos)
        _seg._fsyncDirectory(self.directory)
        self._reopen()
        return self.committed

    def reset(self, firstOffset):
        """
        Drop every message and start empty at ``firstOffset`` (a follower
        behind its leader's retention, or holding nothing the leader has).
        Returns ``firstOffset``.
        """
        self.log.close()
        for name in os.listdir(self.directory):
            if name.endswith(".seg"):
                _seg._remove(os.path.join(self.directory, name))
        _seg._fsyncDirectory(self.directory)
        self.log = QueueLog.create(self.directory, firstOffset, segmentBytes=self.segmentBytes)
        self.log._lastId = firstOffset - 1
        self._lastChunk = None
        self._nextOffset = firstOffset
        self._notify()
        return firstOffset

    def _openLog(self):
        """``self.log`` read from the directory's segments (only their sparse indexes kept), or a new one."""
        d = self.directory
        if os.path.isdir(d) and any(n.endswith(".seg") for n in os.listdir(d)):
            self.log = QueueLog.open(d, self.segmentBytes)
            self.log.releaseRecovery()
            self._lastChunk = _lastChunkFirst(self.log)
            for seg in self.log.segments:
                _trim(seg)
        else:
            self.log = QueueLog.create(d, segmentBytes=self.segmentBytes)
            self._lastChunk = None

    def _reopen(self):
        self._openLog()
        self._nextOffset = self.log.committed
        self._notify()

    def _fireSync(self):
        syncs = self._syncWaiters
        if not syncs:
            return
        if self._incoming or self._waiting:
            # the waiters whose appends are durable (later appends may be on their way: a
            # follower's log under a leader's steady stream is never idle)
            done = self.log.committed
            n = 0
            while n < len(syncs) and syncs[n][0] <= done:
                n += 1
            if not n:
                return
            fire, self._syncWaiters = syncs[:n], syncs[n:]
        else:
            fire, self._syncWaiters = syncs, []
        for _, d in fire:
            d.callback(None)

    def sync(self):
        """A Deferred firing once every append so far is durable."""
        if not self._incoming and not self._waiting:
            return defer.succeed(None)
        d = defer.Deferred()
        self._syncWaiters.append((self._nextOffset, d))
        return d

    # --- retention -------------------------------------------------------------

    def setRetention(self, maxBytes=None, maxAgeSeconds=None):
        """Retention limits (None: none); evaluated now and when a segment rolls over."""
        self.maxBytes = maxBytes
        self.maxAgeSeconds = maxAgeSeconds
        self.applyRetention()

    def applyRetention(self):
        """
        Delete whole sealed segments (never the active one) from the oldest
        while the stream holds more than ``maxBytes`` or the segment's
        messages are all older than ``maxAgeSeconds``; returns how many.
        """
        log = self.log
        segs = log.segments
        if self._writing or len(segs) < 2:
            return 0
        deleted = 0
        total = sum(s.size for s in segs)
        now = nowMs(self.clock)
        while len(segs) > 1 and segs[1].first <= log.committed:
            old, nxt = segs[0], segs[1]
            drop = self.maxBytes is not None and total > self.maxBytes
            if not drop and self.maxAgeSeconds is not None and nxt.stamps:
                # every message of `old` came before the first of `nxt`
                drop = nxt.stamps[0] < now - self.maxAgeSeconds * 1000.0
            if not drop:
                break
            total -= old.size
            _seg._remove(old.path)
            log._forget(old)
            deleted += 1
        if deleted:
            self.segmentsDeleted += deleted
            _seg._fsyncDirectory(log.directory)
        return deleted

    # --- readers and listeners -------------------------------------------------

    def startOffset(self, spec):
        """The offset (int) a reader for ``spec`` (OffsetSpec or a value parseOffsetSpec takes) starts at."""
        spec = parseOffsetSpec(spec, nowMs(self.clock))
        kind = spec.kind
        if kind == "first":
            return self.first
        if kind == "next":
            return self.committed
        if kind == "last":
            last = self.last
            return self.committed if last is None else last
        if kind == "offset":
            return min(max(spec.value, self.first), self.committed)
        if kind == "timestamp":
            return self._timestampOffset(spec.value)
        raise ValueError(spec)

    def _timestampOffset(self, ms):
        """
        Where a timestamp reader starts: the first message enqueued at or
        after ``ms``, or ``next`` when there is none.  RabbitMQ 3.10 (checked
        on the peer over AMQP 0-9-1) starts at the first chunk whose
        timestamp is at or after it, and delivers nothing for a time after
        its last chunk; a chunk here is a group commit whose messages are
        stamped one by one, so the two differ only when one group commit
        straddles ``ms``.
        """
        segs = [s for s in self.log.segments if s.first < self.committed]
        for i, seg in enumerate(segs):
            nxt = segs[i + 1] if i + 1 < len(segs) else None
            if nxt is not None and nxt.stamps and nxt.stamps[0] < ms:
                # every message of this segment came before the next one's first
                continue
            stamps = seg.stamps
            if not stamps:
                continue
            # the sparse timestamp index: the block before the first whose first stamp is >= ms
            k = max(bisect.bisect_left(stamps, ms) - 1, 0)
            reader = StreamReader(self, seg.first + k * INDEX_EVERY)
            try:
                while reader.offset < min(seg.next, self.committed):
                    batch = reader.readRaw(INDEX_EVERY)
                    if not batch:
                        break
                    for offset, _, stamp, _, _ in batch:
                        if stamp >= ms:
                            return offset
            finally:
                reader.close()
            if nxt is not None:
                return nxt.first
        return self.committed

    def chunkStart(self, offset):
        """The first offset of the chunk holding committed ``offset`` (int); reads back one index block at a time."""
        log = self.log
        segs = log.segments
        i = _seg._bisectFirst(segs, offset)
        if i < 0:
            return self.first
        seg = segs[i]
        if not seg.first <= offset < seg.next:
            return offset
        k = min((offset - seg.first) // INDEX_EVERY, len(seg.index) - 1)
        try:
            f = open(seg.path, "rb")
        except FileNotFoundError:
            return offset
        with f:
            target = offset
            while k >= 0:
                start = seg.first + k * INDEX_EVERY
                found = _lastChunkIn(f, seg.index[k], start, target)
                if found is not None:
                    return found
                # a chunk starting at this block's first message shows in the block before
                target = start
                k -= 1
        # the segment's first chunk
        return seg.first

    def reader(self, spec="next"):
        """A :class:`StreamReader` at ``spec`` (see :meth:`startOffset`)."""
        return StreamReader(self, self.startOffset(spec))

    def listen(self, callback):
        """``callback()`` each time ``committed`` moves, and once when the stream is deleted."""
        self._listeners.append(callback)

    def unlisten(self, callback):
        """Stop calling ``callback``; unknown ones are ignored."""
        try:
            self._listeners.remove(callback)
        except ValueError:
            pass

    def _notify(self):
        for cb in list(self._listeners):
            cb()

    # --- life --------------------------------------------------------------------

    def close(self):
        """Stop (broker shutdown, after StreamRegistry.drain): close the files."""
        if self._flushCall is not None and self._flushCall.active():
            self._flushCall.cancel()
        self._flushCall = None
        if self._incoming and not self._writing:
            run, self.registry.runInThread = self.registry.runInThread, None
            try:
                self._flush()
            finally:
                self.registry.runInThread = run
        if not self._writing:
            self.log.close()

    def delete(self):
        """The stream is deleted: its files go, listeners are told, appends fail."""
        if self.deleted:
            return
        self.deleted = True
        if self._flushCall is not None and self._flushCall.active():
            self._flushCall.cancel()
        self._flushCall = None
        err = AMQPError(404, "stream deleted")
        self.registry.unsynced -= len(self._waiting) + len(self._incoming)
        for d, _ in self._waiting:
            if d is not None:
                d.errback(err)
        for _, _, d, _ in self._incoming:
            if d is not None:
                d.errback(err)
        self._waiting = []
        self._incoming = []
        for _, d in self._syncWaiters:
            d.callback(None)
        self._syncWaiters = []
        # out of the way at once: a stream declared again under this name gets a fresh directory
        gone = "%s.deleted-%d" % (self.directory, id(self))
        try:
            os.rename(self.directory, gone)
            self.directory = gone
        except OSError:
            pass
        if not self._writing:
            self._removeFiles()
        # else: a write is running on the thread pool; the files go when it ends
        self.registry.forget(self)
        self._notify()
        self._listeners = []


def _fireWaiting(_, waiting):
    """A replicated group commit's barrier fired: its appends' Deferreds get their offsets."""
    for d, offset in waiting:
        if d is not None:
            d.callback(offset)


def _failWaiting(failure, waiting):
    """A replicated group commit's barrier failed (no majority in sync, fenced): its appends fail."""
    for d, _ in waiting:
        if d is not None:
            d.errback(failure)


def _trim(seg):
    """A stream segment keeps only its sparse indexes (memory stays bounded, active segment too)."""
    if not isinstance(seg.ids, _Count):
        seg.ids = _Count(len(seg.ids))
        seg.flags = _NoFlags()
        seg.pins = set()
        seg.pinnedBy = set()


def _lastChunkIn(f, pos, offset, target):
    """
    Walk the records of a segment file ``f`` from byte ``pos`` (the record of
    ``offset``) through offset ``target``; the first offset of the last chunk
    met on the way whose first offset is at most ``target`` (a chunk header
    right before ``target`` counts), or None.
    """
    magic = _seg.CHUNK_MAGIC
    headSize = CHUNK_HEADER.size
    unpack = _seg._LEN_TYPE.unpack_from
    found = None
    while offset <= target:
        f.seek(pos)
        buf = f.read(READ_PIECE)
        n = len(buf)
        p = 0
        while p + 5 <= n and offset <= target:
            if buf[p:p + 4] == magic:
                if p + headSize > n:
                    break
                p += headSize
                found = offset
                continue
            length, kind = unpack(buf, p)
            if p + 4 + length > n and p:
                break
            if kind == ENQ:
                offset += 1
            elif kind == BATCH or kind == BATCH_CRC:
                # its own first offset (an index entry may point at a record holding several blocks)
                _, _, first, _, count = BATCH_HEAD.unpack_from(buf, p)
                offset = first + count
            p += 4 + length
        if p == 0:
            break
        pos += p
    return found


def _lastChunkFirst(log):
    """The offset of the first message of the last chunk of ``log`` (after open), or None."""
    if not log.segments:
        return None
    seg = log.segments[-1]
    last = None
    k = 0
    with open(seg.path, "rb") as f:
        p = FILE_HEADER.size
        while p + CHUNK_HEADER.size <= seg.size:
            f.seek(p)
            _, length, _, count = CHUNK_HEADER.unpack(f.read(CHUNK_HEADER.size))
            if count:
                last = seg.first + k
            k += count
            p += CHUNK_HEADER.size + length
    return last


class StreamReader:
    """
    A cursor over a stream's committed messages.

    :ivar offset: the next offset :meth:`read` returns (int).

    Each read does bounded work: at most ``maxMessages`` messages from at
    most :data:`READ_BYTES` bytes of one segment file, found through the
    sparse offset index (never by reading the stream before it).
    """

    def __init__(self, stream, offset):
        self.stream = stream
        self.offset = offset
        self._f = None
        self._seg = None
        # the next record's byte position in the segment file, and its offset
        self._pos = None
        self._cursorOffset = None
        # inside a BATCH record at _pos: messages and bytes of its entries already read
        self._skip = 0
        self._skipBytes = 0
        # the last _records call stopped at its limit (not at the end of what is there)
        self._full = False
        # bytes read from the segment file at a time
        self._piece = READ_PIECE
        # the last piece read (bytes), its position in the file and the committed end when it was
        # read: the next read starts in it more often than not (a read takes a few records of it)
        self._buf = None
        self._bufPos = 0
        self._bufCommitted = None
        # FileRanges of the open file were handed out
        self._lent = False
        # the open file mapped (mapped reads): a memoryview of its first _mapLen bytes
        self._map = None
        self._mapLen = 0
        self.closed = False

    def close(self):
        """Release the open segment file."""
        self.closed = True
        self._drop()

    def _drop(self):
        if self._f is not None and not self._lent:
            self._f.close()
        # a file that FileRanges were made of is theirs now: closed when they are gone
        self._f = None
        self._lent = False
        self._seg = None
        self._buf = None
        # (not closed: views of it may still be on their way to a socket; freed with the last)
        self._map = None
        self._mapLen = 0

    def _mapped(self, end):
        """A memoryview of the open segment file mapped, at least ``end`` bytes long, or None."""
        if self._map is None or self._mapLen < end:
            fd = self._f.fileno()
            size = os.fstat(fd).st_size
            if size < end:
                return None
            try:
                self._map = memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ))
            except (OSError, ValueError):
                # (a file system that cannot map: read as without ``mapped``)
                return None
            self._mapLen = size
        return self._map

    def _seek(self):
        """Position the cursor at ``self.offset``; False when it is past the committed end."""
        log = self.stream.log
        segs = log.segments
        if not segs or self.offset >= log.committed:
            return False
        if self.offset < segs[0].first:
            self.offset = segs[0].first
        i = _seg._bisectFirst(segs, self.offset)
        seg = segs[max(i, 0)]
        if self.offset >= seg.next:
            # in a gap: go on at the next segment
            if i + 1 >= len(segs):
                return False
            seg = segs[i + 1]
            self.offset = seg.first
        self._drop()
        try:
            # unbuffered: reads are os.pread of the sizes wanted (no copy through a buffer)
            self._f = open(seg.path, "rb", buffering=0)
        except FileNotFoundError:
            return False
        self._seg = seg
        self._buf = None
        self._skip = self._skipBytes = 0
        k = (self.offset - seg.first) // INDEX_EVERY
        if k < len(seg.index):
            # the byte position of the record holding message first + k * INDEX_EVERY
            self._pos = seg.index[k]
            self._cursorOffset = seg.first + k * INDEX_EVERY
            head = os.pread(self._f.fileno(), BATCH_HEAD.size, self._pos)
            if len(head) == BATCH_HEAD.size and (head[4] == BATCH or head[4] == BATCH_CRC):
                # a BATCH record: the cursor is at its first message
                self._cursorOffset = BATCH_HEAD.unpack(head)[2]
        else:
            self._pos = FILE_HEADER.size
            self._cursorOffset = seg.first
        # skip records to the wanted offset
        skip = self.offset - self._cursorOffset
        while skip > 0:
            _, got, _ = self._records(min(skip, 4096), None, decode=False)
            if not got:
                return False
            skip -= got
        return True

    def _records(self, limit, maxBytes, decode=True, split=True, views=False, ranges=False, crcs=None,
                 mapped=False):
        """
        Up to ``limit`` messages from the cursor within one segment, as
        ``(items, count, bytes)``; advances it.  An item is ``(offset, n,
        timestampMs, payload, isBatch)``: for an ENQ record ``n`` is 1 and
        ``payload`` its decoded fields (None without ``decode``); for (part
        of) a BATCH record, ``n`` messages and ``payload`` their entries (bytes,
        as the stream client published them; with ``views`` a list of buffers
        that hold them in order, views of the pieces read and pieces).
        With ``crcs`` (a dict), an item that is a whole BATCH_CRC record's
        entries gets its stored CRC-32 there, by its offset.
        Records of a chunk are contiguous and a chunk header starts with
        :data:`~otter_tx.store.log.segments.CHUNK_MAGIC` (as a record length
        it would be over 1 GB, which no record is), so the cursor walks
        records and steps over the headers it meets without knowing where
        chunks end.
        """
        fd = self._f.fileno()
        pread = os.pread
        out = []
        total = 0
        size = 0
        committed = min(self.stream.log.committed, self._seg.next)
        magic = _seg.CHUNK_MAGIC
        headSize = CHUNK_HEADER.size
        unpack = _seg._LEN_TYPE.unpack_from
        batchHead = BATCH_HEAD.unpack_from
        batchSize = BATCH_HEAD.size
        crcSize = BATCH_CRC_HEAD.size
        entrySize = _BE_U32.unpack_from
        u32 = _seg._U32.unpack_from
        full = False
        buf = self._buf
        if buf is not None and (self._bufCommitted != self.stream.log.committed or
                                not self._bufPos <= self._pos < self._bufPos + len(buf)):
            # a piece read before more was committed may end with bytes of a write not yet
            # committed then (rolled back and written again since): read again
            buf = None
        pieceSize = self._piece
        while total < limit and self._cursorOffset < committed and not full:
            if buf is None:
                buf = pread(fd, pieceSize, self._pos)
                pieceSize = self._piece
                self._buf = buf
                self._bufPos = self._pos
                self._bufCommitted = self.stream.log.committed
                if len(buf) < 5:
                    break
            p = p0 = self._pos - self._bufPos
            n = len(buf)
            while p + 5 <= n and total < limit and self._cursorOffset < committed:
                if buf[p:p + 4] == magic:
                    if p + headSize > n:
                        break
                    p += headSize
                    continue
                length, kind = unpack(buf, p)
                if p + 4 + length > n:
                    hs = crcSize if kind == BATCH_CRC else batchSize
                    if (views or not decode) and (kind == BATCH or kind == BATCH_CRC) and 4 + length > READ_PIECE \
                            and not self._skip and p + hs <= n:
                        _, _, _, ts, count = batchHead(buf, p)
                        esize = 4 + length - hs
                        if count <= limit - total and (maxBytes is None or size + esize <= maxBytes):
                            # a whole BATCH record larger than a piece: its entries are the
                            # rest of the piece and pieces read on from the file
                            # (no large string: PyPy makes and collects those slowly), or a
                            # FileRange (``ranges``)
                            end = self._bufPos + p + 4 + length
                            mv = self._mapped(self._bufPos + p + 4 + length) if decode and mapped else None
                            if mv is not None:
                                # a view of the file mapped: no read (the page cache's pages)
                                parts = [mv[self._bufPos + p + hs:self._bufPos + p + 4 + length]]
                                pieceSize = HEAD_PIECE
                            elif decode and ranges:
                                # all of them left in the file; the next piece is small (a record
                                # head, most likely of another large record)
                                parts = [FileRange(self._f, self._bufPos + p + hs, esize)]
                                self._lent = True
                                pieceSize = HEAD_PIECE
                            elif decode:
                                parts = []
                                if p + hs < n:
                                    parts.append(memoryview(buf)[p + hs:])
                                at = self._bufPos + n
                                while at < end:
                                    piece = pread(fd, min(READ_PIECE, end - at), at)
                                    if not piece:
                                        break
                                    parts.append(piece)
                                    at += len(piece)
                                if at < end:
                                    break
                            else:
                                parts = None
                            if crcs is not None and kind == BATCH_CRC:
                                crcs[self._cursorOffset] = u32(buf, p + batchSize)[0]
                            out.append((self._cursorOffset, count, ts, parts, True))
                            self._cursorOffset += count
                            total += count
                            size += esize
                            p += 4 + length
                            if maxBytes is not None and size >= maxBytes:
                                full = True
                            break
                        if total or not split:
                            # not taken whole, and not split (as below): for the next read
                            full = True
                            break
                    if p == p0 and p0 == 0:
                        # one record larger than a piece (BATCH records of large messages):
                        # read it whole, and larger pieces from now on
                        self._piece = min(max(self._piece, 2 * (4 + length)), MAX_READ_PIECE)
                        buf = pread(fd, max(4 + length, self._piece), self._pos)
                        self._buf = buf
                        n = len(buf)
                        if n < 4 + length:
                            break
                        continue
                    break
                if kind == ENQ:
                    if decode:
                        rec = decodeEnq(buf, p)
                        out.append((self._cursorOffset, 1, rec[2], rec, False))
                    else:
                        out.append(None)
                    self._cursorOffset += 1
                    total += 1
                    size += length
                elif kind == BATCH or kind == BATCH_CRC:
                    _, _, _, ts, count = batchHead(buf, p)
                    end = p + 4 + length
                    start = p + (crcSize if kind == BATCH_CRC else batchSize)
                    q = start + self._skipBytes
                    avail = count - self._skip
                    want = min(avail, limit - total)
                    if want == avail and (maxBytes is None or size + end - q <= maxBytes):
                        r = end
                        m = avail
                    elif total or not split:
                        # a record is not split when something was read before it (or ``split`` is False)
                        full = True
                        break
                    else:
                        # walk the entries: what fits (at least one message a read)
                        r = q
                        m = 0
                        sz = size
                        while m < want and (maxBytes is None or sz < maxBytes or not (total or m)):
                            step = 4 + entrySize(buf, r)[0]
                            r += step
                            sz += step
                            m += 1
                    size += r - q
                    if m:
                        if not decode:
                            payload = None
                        elif views:
                            payload = [memoryview(buf)[q:r]]
                        else:
                            payload = buf[q:r]
                        if crcs is not None and kind == BATCH_CRC and m == avail and q == start:
                            crcs[self._cursorOffset] = u32(buf, p + batchSize)[0]
                        out.append((self._cursorOffset, m, ts, payload, True))
                        self._cursorOffset += m
                        total += m
                    if m < avail:
                        # the rest of this record is for the next read
                        self._skip += m
                        self._skipBytes = r - start
                        full = True
                        break
                    self._skip = self._skipBytes = 0
                    p = end
                    if maxBytes is not None and size >= maxBytes:
                        full = True
                        break
                    continue
                p += 4 + length
                if maxBytes is not None and size >= maxBytes:
                    full = True
                    break
            if p == p0:
                if p0 == 0:
                    break
                # the rest of the piece holds no whole record: read on from the cursor
                buf = None
                continue
            self._pos = self._bufPos + p
            if p + 5 > n or (p + 4 <= n and buf[p:p + 4] != magic and p + 4 + unpack(buf, p)[0] > n):
                # the piece is used up (its tail is the start of a record read next time)
                buf = None
        self._full = full
        return out, total, size

    def readRaw(self, maxMessages=READ_BATCH, maxBytes=READ_BYTES, split=True, views=False, ranges=False,
                crcs=None, mapped=False):
        """
        Up to ``maxMessages`` committed messages from :attr:`offset` on, as
        stored: the items of :meth:`_records` (``(offset, n, timestampMs,
        payload, isBatch)``); ``[]`` when there is nothing (yet).  With ``split``
        False, a BATCH record that does not fit is left whole for the next read.  With
        ``views`` a BATCH record's entries are a list of buffers that hold them in
        order (views of the pieces read, no copy; none larger than :data:`READ_PIECE`
        when the record is larger; with ``ranges`` too, the rest of such a record
        is a :class:`FileRange`, not read), else bytes.  With ``crcs`` (a dict), the
        items that are whole BATCH_CRC records get their entries' stored CRC-32 there
        (offset -> CRC).  With ``mapped`` (and ``views``) the entries of such a record are
        a view of the segment file mapped (:func:`isMapped`; valid while the file is not
        truncated under it: write it at once, keep nothing).
        """
        if self.closed or self.stream.deleted:
            return []
        out = []
        got = 0
        for _ in range(4):
            if maxBytes is not None and maxBytes <= 0:
                break
            if self.offset >= self.stream.log.committed:
                break
            if self._seg is None or self._seg not in self.stream.log.segments or \
                    self._cursorOffset != self.offset:
                if not self._seek():
                    break
            recs, n, size = self._records(maxMessages - got, maxBytes, split=split, views=views, ranges=ranges,
                                          crcs=crcs, mapped=mapped)
            if maxBytes is not None:
                maxBytes -= size
            if n:
                out.extend(recs)
                got += n
                self.offset = self._cursorOffset
            elif self._full:
                # the next record is left whole (split=False)
                break
            else:
                # end of this segment: the next one
                nxt = [s for s in self.stream.log.segments if s.first > self._seg.first]
                self._drop()
                if not nxt:
                    break
                self.offset = max(self.offset, nxt[0].first)
            if got >= maxMessages or self._full:
                break
        return out

    def read(self, maxMessages=READ_BATCH, maxBytes=READ_BYTES):
        """
        Up to ``maxMessages`` committed messages from :attr:`offset` on, as
        ``(offset, timestampMs, Message)``; ``[]`` when there is nothing
        (yet).  A reader whose offset retention removed goes on at ``first``.
        A stream client's message is converted once for the readers of a
        stream (the last :data:`CONVERTED_MESSAGES` conversions are kept).
        """
        out = []
        converted = None
        for offset, n, ts, payload, isBatch in self.readRaw(maxMessages, maxBytes):
            if isBatch:
                name = self.stream.name
                if converted is None:
                    converted = _converted.get(self.stream)
                    if converted is None:
                        converted = _converted[self.stream] = {}
                p = 0
                unpack = _BE_U32.unpack_from
                for i in range(n):
                    (size,) = unpack(payload, p)
                    o = offset + i
                    m = converted.get(o)
                    if m is None:
                        m = converted[o] = toMessage(name, payload[p + 4:p + 4 + size])
                        if len(converted) > CONVERTED_MESSAGES:
                            del converted[next(iter(converted))]
                    out.append((o, ts, m))
                    p += 4 + size
            else:
                _, _, ts, _, _, ex, rk, propsRaw, body = payload
                out.append((offset, ts, Message(ex.decode("utf-8", "surrogateescape"),
                                                rk.decode("utf-8", "surrogateescape"),
                                                bytes(propsRaw), bytes(body))))
        return out


# --- the AMQP 0-9-1 face ------------------------------------------------------------------


class _StreamEntry:
    """A delivery of a stream consumer (what the Session's ledger holds; see IConsumerSource)."""

    __slots__ = ("message", "redelivered", "returns", "deliveredAt", "state", "offset", "consumer")

    def __init__(self, message, offset, consumer, deliveredAt):
        self.message = message
        self.offset = offset
        self.consumer = consumer
        self.redelivered = False
        self.returns = 0
        self.deliveredAt = deliveredAt
        self.state = 2


class _ConsumerState:
    __slots__ = ("consumer", "reader", "buffer")

    def __init__(self, consumer, reader):
        self.consumer = consumer
        self.reader = reader
        self.buffer = []


@implementer(IQueue, IDeclaredQueue)
class StreamQueue(Queue):
    """
    A stream queue as AMQP 0-9-1 sees it (RabbitMQ 3.10, checked on the
    peer): consumers need a prefetch and manual acks, each reads from its
    ``x-stream-offset`` (default ``next``) and gets ``x-stream-offset`` on
    each delivery; acks only return credit; consuming removes nothing;
    basic.get, purge, nack and reject are refused (540).

    :ivar stream: the :class:`StreamLog`.
    """

    queueType = STREAM

    def __init__(self, vhost, name, durable, autoDelete, owner, arguments):
        Queue.__init__(self, vhost, name, durable, autoDelete, owner, arguments)
        self.queueType = STREAM
        self.quorum = False
        self.typeCounts = getattr(vhost.broker, "typeCounts", {}).get(STREAM)
        self.singleActive = False
        broker = vhost.broker
        seg = arguments.get("x-stream-max-segment-size-bytes")
        self.stream = broker.streams.open(self.clock, vhost.name, name,
                                          int(seg) if seg else DEFAULT_SEGMENT_BYTES)
        self.stream.listen(self._committed)
        self._states = {}
        self._turn = 0
        self._dispatchScheduled = None
        self._applyRetention()

    def __repr__(self):
        return "<StreamQueue %r in %r>" % (self.name, self.vhost.name)

    def _applyRetention(self):
        applyRetention(self.stream, self.arguments, self.effectiveDefinition, self.name, self.vhost.name)

    def applySettings(self, settings, policy=None):
        """Policies: ``max-length-bytes``, ``max-age``, ``stream-max-segment-size-bytes`` apply."""
        self.settings = settings
        self.policy = policy
        self._applyRetention()

    def touch(self):
        """Streams have no x-expires lease."""

    def deleteConditions(self, ifUnused, ifEmpty):
        """RabbitMQ 3.10 deletes a stream whatever if-unused / if-empty say (checked on the peer)."""
        return False, False

    # --- counts --------------------------------------------------------------------

    @property
    def readyCount(self):
        """Messages in the stream (int): RabbitMQ's ``messages`` for a stream."""
        return self.stream.count

    @property
    def readyBytes(self):
        return self.stream.bytes

    @property
    def pagedCount(self):
        return 0

    @property
    def pagedBytes(self):
        return 0

    def readyEntries(self):
        return iter(())

    # --- publish ---------------------------------------------------------------------

    def enqueue(self, message, now=None, redelivered=False):
        """Append ``message`` to the stream (durable at the end of the turn)."""
        self.publishedCount += 1
        stream = self.stream
        stream.append(message, wantDeferred=False)
        rep = stream.replicator
        if rep is not None:
            # a cluster's replicated stream: the publisher's confirm waits for the followers in
            # sync as for a link's answer (Session._route: message.forwarded; Broker.sync)
            if message.forwarded is None:
                message.forwarded = [(rep, 0)]
            else:
                message.forwarded.append((rep, 0))
        return True

    def enqueueFrom(self, writer, message):
        """
        A publish another node of a cluster forwarded, with its ``writer``
        (``(writer id, sequence)``): appended unless this stream took that
        sequence already (the node sent it again after a leader change and
        the old leader had taken and replicated it); True either way (the
        confirm follows).
        """
        wid, seq = writer
        stream = self.stream
        writers = stream.writers
        if writers.get(wid, 0) >= seq:
            return True
        writers.pop(wid, None)
        writers[wid] = seq
        if len(writers) > MAX_WRITERS:
            del writers[next(iter(writers))]
        self.enqueue(message)
        rep = stream.replicator
        if rep is not None:
            rep.writerTaken(wid, seq)
        return True

    # --- consumers ----------------------------------------------------------------------

    def checkConsume(self, noAck, prefetch, arguments):
        """
        RabbitMQ 3.10's stream consumer rules (checked on the peer, in this
        order): a zero consumer prefetch is 406 ``consumer prefetch count is
        not set for 'queue 'Q' in vhost 'V''`` (a global one does not
        count); no-ack 540 ``automatic acknowledgement not supported by
        stream queues queue 'Q' in vhost 'V'`` (connection);
        a malformed ``x-stream-offset`` 406 ``{invalid_stream_offset_arg,
        ...}`` (or 541, where RabbitMQ crashes).
        """
        where = resourceText("queue", self.name, self.vhost.name)
        if not prefetch:
            raise preconditionFailed("consumer prefetch count is not set for '%s'" % (where,))
        if noAck:
            raise notImplemented("automatic acknowledgement not supported by stream queues %s" % (where,))
        value = (arguments or {}).get("x-stream-offset", "next")
        try:
            parseOffsetSpec(value, nowMs(self.clock))
        except ValueError:
            if isinstance(value, (str, bytes)):
                text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                m = _DURATION.match(text)
                if m.group(1):
                    raise preconditionFailed(
                        "invalid arg 'x-stream-offset' for %s: {invalid_stream_offset_arg,{longstr,<<\"%s\">>}}"
                        % (where, text))
            raise AMQPError.fromReplyText(541, "INTERNAL_ERROR")

    def refusesConsumer(self, exclusive):
        """Stream consumers are never exclusive of one another (the flag is ignored, as RabbitMQ 3.10)."""
        return False

    def addConsumer(self, consumer, exclusive=False, resumeAt=None):
        """
        ``consumer`` reads from its ``x-stream-offset`` (default ``next``), or
        from offset ``resumeAt`` (int: a cluster's consumer moved here from
        another leader goes on where it was).
        """
        spec = (consumer.arguments or {}).get("x-stream-offset", "next") if resumeAt is None else int(resumeAt)
        try:
            reader = self.stream.reader(parseOffsetSpec(spec, nowMs(self.clock)))
        except ValueError:
            reader = self.stream.reader("next")
        self.consumers.append(consumer)
        self._states[consumer] = _ConsumerState(consumer, reader)
        self.dispatch()

    def removeConsumer(self, consumer):
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        state = self._states.pop(consumer, None)
        if state is not None:
            state.reader.close()

    def readerOffsets(self):
        """``[(consumer tag, next offset)]`` of the consumers (management)."""
        return [(s.consumer.tag, s.reader.offset - len(s.buffer) if s.buffer else s.reader.offset)
                for s in self._states.values()]

    def _committed(self):
        if self.deleted or self.stream.deleted:
            return
        self.dispatch()

    def dispatch(self):
        """
        Deliver to each consumer with credit from its reader, at most
        :data:`DISPATCH_MESSAGES` messages per call (the rest on a later
        turn), reading a bounded batch from disk at a time.
        """
        if self._dispatching or self.deleted or self.stopped:
            return
        self._dispatching = True
        n = 0
        more = False
        states = list(self._states.values())
        if len(states) > 1:
            # start with the next consumer each call, so no reader starves the others
            self._turn = (self._turn + 1) % len(states)
            states = states[self._turn:] + states[:self._turn]
        try:
            for state in states:
                c = state.consumer
                while c.canTake():
                    if n >= DISPATCH_MESSAGES:
                        more = True
                        break
                    if not state.buffer:
                        state.buffer = state.reader.read(min(READ_BATCH, c.prefetch or READ_BATCH))
                        state.buffer.reverse()
                        if not state.buffer:
                            break
                    offset, _, message = state.buffer.pop()
                    self._deliverOne(state, offset, message)
                    n += 1
                if more:
                    break
        finally:
            self._dispatching = False
        if more and self._dispatchScheduled is None:
            self._dispatchScheduled = self.clock.callLater(0, self._dispatchLater)

    def _dispatchLater(self):
        self._dispatchScheduled = None
        self.dispatch()

    def _deliverOne(self, state, offset, message):
        headers = dict(message.headers or {})
        headers["x-stream-offset"] = TaggedInt(offset, "l")
        m = message.withHeaders(headers)
        entry = _StreamEntry(m, offset, state.consumer, self.clock.seconds())
        self.deliveredCount += 1
        self.unackedCount += 1
        state.consumer.deliver(self, entry)

    def deliveredMessage(self, entry, get=False):
        return entry.message

    # --- settling -------------------------------------------------------------------------

    def settle(self, entry):
        """An ack returns credit (the message stays in the stream)."""
        if entry.state == 2:
            entry.state = 3
            self.unackedCount -= 1
            self.ackCount += 1
            self.dispatch()

    def requeue(self, entries, dispatch=True):
        """
        A channel closing hands its deliveries back (``dispatch=False``):
        credit only.  basic.nack / basic.recover with requeue (dispatch) are
        540 ``basic.nack and basic.reject not supported by stream queues``.
        """
        for entry in entries:
            if entry.state == 2:
                entry.state = 3
                self.unackedCount -= 1
        if dispatch:
            raise self._noNack()

    def reject(self, entries):
        for entry in entries:
            if entry.state == 2:
                entry.state = 3
                self.unackedCount -= 1
        raise self._noNack()

    def _noNack(self):
        return notImplemented("basic.nack and basic.reject not supported by stream queues %s"
                              % (resourceText("queue", self.name, self.vhost.name),))

    def holdRequeue(self, feeder):
        pass

    def releaseRequeue(self, feeder):
        pass

    def basicGet(self, noAck):
        """540 ``basic.get not supported by stream queues queue 'Q' in vhost 'V'`` (RabbitMQ 3.10)."""
        raise notImplemented("basic.get not supported by stream queues %s"
                             % (resourceText("queue", self.name, self.vhost.name),))

    def purge(self):
        """540 ``queue.purge not supported by stream queues queue 'Q' in vhost 'V'`` (RabbitMQ 3.10)."""
        raise notImplemented("queue.purge not supported by stream queues %s"
                             % (resourceText("queue", self.name, self.vhost.name),))

    # --- life ---------------------------------------------------------------------------

    def stopTimers(self):
        """Broker stop: no more deliveries (the service drains and closes the streams)."""
        if self._dispatchScheduled is not None and self._dispatchScheduled.active():
            self._dispatchScheduled.cancel()
        self._dispatchScheduled = None
        self.stopped = True

    def shutdown(self):
        """Deleted: consumers are cancelled, the stream's files go; returns 0 (as RabbitMQ's delete-ok)."""
        self.deleted = True
        if self._dispatchScheduled is not None and self._dispatchScheduled.active():
            self._dispatchScheduled.cancel()
        self._dispatchScheduled = None
        consumers, self.consumers = self.consumers, []
        for state in self._states.values():
            state.reader.close()
        self._states = {}
        for c in consumers:
            c.cancelledByBroker(self)
        self.stream.unlisten(self._committed)
        if self.keepStream:
            # a cluster's stream led elsewhere now: its log stays, this node's replica
            self.stream.replicator = None
        else:
            self.stream.delete()
        return 0

    #: True when the queue goes but its log stays (a cluster node no longer leading it)
    keepStream = False


def applyRetention(stream, arguments, definition, name, vhostName):
    """
    Set ``stream``'s (a :class:`StreamLog`) segment size and retention from
    its queue ``arguments`` (``x-max-length-bytes``, ``x-max-age``,
    ``x-stream-max-segment-size-bytes``), else the policy ``definition``
    (dict or None: ``max-length-bytes``, ``max-age``,
    ``stream-max-segment-size-bytes``); an invalid age is no age limit.
    """
    pol = definition or {}
    maxBytes = arguments.get("x-max-length-bytes", pol.get("max-length-bytes"))
    age = arguments.get("x-max-age", pol.get("max-age"))
    seconds = None
    if age is not None:
        try:
            seconds = parseMaxAge(age, name, vhostName)
        except AMQPError:
            seconds = None
    segBytes = arguments.get("x-stream-max-segment-size-bytes", pol.get("stream-max-segment-size-bytes"))
    if segBytes:
        stream.log.segmentBytes = int(segBytes)
    stream.setRetention(int(maxBytes) if maxBytes is not None else None, seconds)


# --- the helpers the stream protocol door uses ---------------------------------------------


def findStream(broker, vhostName, name):
    """The :class:`StreamLog` of stream ``name`` in vhost ``vhostName``, or None."""
    vh = broker.vhosts.get(vhostName)
    q = vh.queues.get(name) if vh is not None else None
    return q.stream if q is not None else None


def declareStream(broker, vhostName, name, arguments=None):
    """
    Declare stream ``name`` (the AMQP declare's rules and errors); returns
    its :class:`StreamLog`.  Raises AMQPError (404 for an unknown vhost).
    """
    vh = broker.vhosts.get(vhostName)
    if vh is None:
        raise AMQPError(404, "vhost '%s' not found" % (vhostName,))
    args = dict(arguments or {})
    args["x-queue-type"] = STREAM
    q = vh.declareQueue(name, None, durable=True, arguments=args)
    if isinstance(q, defer.Deferred):
        # a cluster node's new stream: a Deferred firing with its queue once at its home
        # (a StreamQueue here, a RemoteQueue when elsewhere: docs/streams.md, "In a cluster")
        return q
    if q.stream is None:
        raise preconditionFailed("inequivalent arg 'x-queue-type' for %s" % (resourceText("queue", name, vhostName),))
    return q.stream


def deleteStream(broker, vhostName, name):
    """Delete stream ``name``; True when it existed."""
    vh = broker.vhosts.get(vhostName)
    q = vh.queues.get(name) if vh is not None else None
    if q is None or q.stream is None:
        return False
    vh.deleteQueue(q)
    return True

