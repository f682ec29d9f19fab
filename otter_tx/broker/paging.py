"""
Paging: the part of a queue beyond its memory budget lives in segment files.

RabbitMQ 3.12+ classic queues keep only a small head of each queue in memory
and the rest on disk (which made ``x-queue-mode: lazy`` the default
behaviour; https://www.rabbitmq.com/docs/lazy-queues,
https://www.rabbitmq.com/docs/persistence-conf).  otter_tx does the same per
queue and per priority level: once the ready messages held in memory cost
more than the queue's budget (:data:`DEFAULT_BUDGET` bytes, ``--queue-memory-
budget``), later messages of that level go to a :class:`Pager` instead.  A
pager is a FIFO of :class:`Segment` s; the newest one is an open buffer in
memory (at most :data:`SEGMENT_COUNT` messages or :data:`SEGMENT_BYTES` body
bytes), older ones are files of serialised entries.  The queue pages a whole
segment back in when its in-memory head has room for it, so consumers find
messages in memory ahead of need.

Segment files are sequential and never fsync'd: a pager's data is discarded
at start (transient messages do not survive a restart; persistent ones are
also in the durable store through the Journal, which recovery reads).
Writes go to one writer thread per :class:`PagingDirectory` (a ``write()``
can block for a long time when the kernel throttles dirty pages); a segment
keeps its entries in memory until its file is written, and a read of such a
segment uses them.  Reads happen on the reactor thread in bounded chunks:
one segment (:data:`SEGMENT_COUNT` messages or :data:`SEGMENT_BYTES` of
bodies, a few milliseconds) at most per message taken from the queue.

Each segment keeps ``(firstSeq, lastSeq, count, bytes, minExpiresAt)`` so
counts and byte counts stay exact without reading it, and a segment whose
earliest expiry passes can be read and its expired messages dead-lettered
wherever it sits in the queue.

Record format (little-endian): ``seq`` u64, ``expiresAt`` f64 (ms; NaN for
none), ``storeId`` u64, ``ttl`` i64 (ms; -1 for none), flags u8 (1
redelivered, 2 stored, 4 persistent), priority u8, property-bytes length
u32, body length u32, then the exchange and the routing key as two AMQP
short strings (as basic.deliver carries them, so they are reused as the
delivery's address bytes), the property bytes and the body.  A message read back is a
:class:`PagedMessage`: its properties are decoded only if something asks
for them (delivery forwards the property bytes untouched), which makes a
page-in several times cheaper.
"""

import math
import os
import queue as _queue
import shutil
import struct
import tempfile
import threading
from collections import deque
from itertools import count

from otter_tx.amqp import codec
from otter_tx.broker.message import Message

#: default per-queue memory budget in bytes (body bytes plus
#: :data:`ENTRY_OVERHEAD` per message) for ready messages held in memory
DEFAULT_BUDGET = 8 * 1024 * 1024
#: estimated bytes a ready message costs in memory besides its body
#: (``QueueEntry`` + ``Message`` + small objects; docs/performance.md
#: "Memory per queued message": about 344 bytes for a 16 B body)
ENTRY_OVERHEAD = 350
#: a segment is closed (written to its file) at this many messages ...
#: (reading one back costs about 15 us per message on CPython 3.11, most of
#: it decoding properties: 512 keep a page-in near 8 ms)
SEGMENT_COUNT = 512
#: ... or at this many body bytes, whichever comes first
SEGMENT_BYTES = 1024 * 1024

_HEAD = struct.Struct("<QdQqBBII")
_NAN = float("nan")
_ids = count(1)
#: guards the written/dropped hand-over between the reactor and writer threads
_fileLock = threading.Lock()


class SegmentFile:
    """
    One written (or being written) segment file.

    :ivar path: str.  :ivar written: set by the writer once done (bool).
    :ivar failed: the write failed (bool; the entries stay in memory).
    :ivar dropped: the file is no longer wanted: whoever comes last removes it.
    """

    __slots__ = ("path", "written", "failed", "dropped")

    #: the pager owns the file (it writes and removes it)
    owned = True

    def __init__(self, path):
        self.path = path
        self.written = False
        self.failed = False
        self.dropped = False


def writeSegmentFile(sfile, data):
    """Write ``data`` to ``sfile.path`` (any thread); remove it if it was dropped meanwhile."""
    try:
        with open(sfile.path, "wb") as f:
            f.write(data)
    except OSError:
        sfile.failed = True
    with _fileLock:
        sfile.written = True
        dropped = sfile.dropped
    if dropped and not sfile.failed:
        _unlink(sfile.path)


def dropSegmentFile(sfile):
    """
    The file is not wanted any more: remove it now if written, else the
    writer removes it when done.  Returns True if it was removed here.
    """
    if not sfile.owned:
        return False
    with _fileLock:
        sfile.dropped = True
        done = sfile.written
    if done and not sfile.failed:
        _unlink(sfile.path)
        return True
    return False


class StoredRun:
    """
    The "file" of a paged segment whose messages the durable store keeps:
    a :class:`~otter_tx.store.log.segments.LogRange` of the message log,
    handed over at recovery so a deep queue's tail is not copied into
    paging files (issue 20: "no second copy").  The pager neither writes
    nor removes it; the store deletes its segment once every message in it
    is acked.

    :ivar range: the ``LogRange``.
    """

    __slots__ = ("range", "dropped")

    owned = False
    written = True
    failed = False
    path = None

    def __init__(self, rng):
        self.range = rng
        self.dropped = False

    def read(self, makeEntry):
        """The entries, read from the store's file (``makeEntry`` as for :func:`decodeEntries`)."""
        out = []
        names = {}
        propsCache = {}
        for storeId, seq, _, exp, redelivered, exchange, routingKey, raw, body in self.range.read():
            ex = names.get(exchange)
            if ex is None:
                ex = names[exchange] = exchange.decode("utf-8", "surrogateescape")
            rk = names.get(routingKey)
            if rk is None:
                rk = names[routingKey] = routingKey.decode("utf-8", "surrogateescape")
            props = propsCache.get(raw)
            m = Message(ex, rk, raw, body, props)
            if props is None and len(propsCache) < 256:
                propsCache[raw] = m.props
            m.storeId = storeId
            m.stored = True
            out.append(makeEntry(m, seq, exp, redelivered))
        return out


class Segment:
    """
    A run of consecutive paged entries of one priority level.

    :ivar firstSeq: seq of its first entry (int).  :ivar lastSeq: of its last.
    :ivar count: entries (int).  :ivar bytes: body bytes (int).
    :ivar minExpiresAt: the earliest expiry in ms, or None.
    :ivar entries: the segment's entries (list of ``QueueEntry``) while it
        is open or its file is being written, else None.
    :ivar file: its :class:`SegmentFile` once closed, else None (open).
    :ivar persistent: persistent messages in it (int); ``persistentBytes`` their body bytes.
    """

    __slots__ = ("firstSeq", "lastSeq", "count", "bytes", "minExpiresAt", "entries", "file", "level",
                 "persistent", "persistentBytes")

    def __init__(self, level):
        self.level = level
        self.firstSeq = None
        self.lastSeq = None
        self.count = 0
        self.bytes = 0
        self.minExpiresAt = None
        self.entries = []
        self.file = None
        self.persistent = 0
        self.persistentBytes = 0

    @property
    def cost(self):
        """Its memory cost once paged in (bytes, as the budget counts)."""
        return self.bytes + self.count * ENTRY_OVERHEAD

    def __repr__(self):
        return "<Segment %s..%s n=%d %s>" % (self.firstSeq, self.lastSeq, self.count,
                                             "open" if self.file is None else self.file.path)


def encodeEntries(entries):
    """The segment-file bytes of ``entries`` (``QueueEntry`` list)."""
    parts = []
    pack = _HEAD.pack
    for e in entries:
        m = e.message
        flags = (1 if e.redelivered else 0) | (2 if m.stored else 0) | (4 if m.persistent else 0)
        exp = _NAN if e.expiresAt is None else e.expiresAt
        ttl = -1 if m.ttl is None else m.ttl
        parts.append(pack(e.seq, exp, m.storeId, ttl, flags, min(m.priority, 255), len(m.propsRaw), m.size))
        parts.append(m.addressBytes())
        parts.append(m.propsRaw)
        parts.append(m.body)
    return b"".join(parts)


def decodeEntries(data, makeEntry):
    """
    Parse segment-file bytes back into entries: ``makeEntry(message, seq,
    expiresAt, redelivered)`` builds each (the queue's ``QueueEntry``).
    """
    out = []
    off = 0
    end = len(data)
    unpack = _HEAD.unpack_from
    hsize = _HEAD.size
    new = Message.__new__
    isnan = math.isnan
    while off < end:
        seq, exp, storeId, ttl, flags, priority, pl, bl = unpack(data, off)
        off += hsize
        m = new(PagedMessage)
        start = off
        exl = data[off]
        off += 1
        m.exchange = data[off:off + exl].decode("utf-8", "surrogateescape")
        off += exl
        rkl = data[off]
        off += 1
        m.routingKey = data[off:off + rkl].decode("utf-8", "surrogateescape")
        off += rkl
        m.addressCache = data[start:off]
        m.propsRaw = data[off:off + pl]
        off += pl
        m.body = data[off:off + bl]
        off += bl
        m.size = bl
        m.storeId = storeId
        m.stored = bool(flags & 2)
        m.persistent = bool(flags & 4)
        m.priority = priority
        m.ttl = None if ttl < 0 else ttl
        m.extraKeys = None
        _propsSlot.__set__(m, None)
        out.append(makeEntry(m, seq, None if isnan(exp) else exp, bool(flags & 1)))
    return out


_propsSlot = Message.props


class PagedMessage(Message):
    """
    A :class:`~otter_tx.broker.message.Message` read back from a segment
    file: ``props`` is decoded from ``propsRaw`` on first use (``ttl``,
    ``priority`` and ``persistent`` were stored with it).
    """

    __slots__ = ()

    @property
    def props(self):
        """The decoded properties (dict), decoded on first access."""
        p = _propsSlot.__get__(self, Message)
        if p is None:
            raw = self.propsRaw
            p = codec.decodeProperties(raw) if raw[:2] != b"\x00\x00" else {}
            _propsSlot.__set__(self, p)
        return p

    @props.setter
    def props(self, value):
        _propsSlot.__set__(self, value)


class PagingDirectory:
    """
    Where pagers put their files: ``root`` (created on first use), or a
    temporary directory when ``root`` is None (a broker without
    ``--data-dir``).  :meth:`reset` empties it (boot: paged data of the
    previous run is discarded).  Files are written by one daemon thread
    (``threaded``; tests set it False to write inline).
    """

    #: write segment files on a writer thread (False: inline, for tests)
    threaded = True
    #: most writes queued for the writer thread; beyond, writes are inline
    #: (the writer, short of the GIL or of disk, must not let paged
    #: entries pile up in memory)
    maxQueued = 16

    def __init__(self, root=None):
        self.root = root
        self._made = None
        self._jobs = None
        self._thread = None
        #: writes handed to the writer thread and not done yet
        self.queued = 0
        #: writes done inline because the writer was behind (int)
        self.inlineWrites = 0

    def write(self, sfile, data):
        """
        Write ``data`` to ``sfile``: on the writer thread, or inline when
        not ``threaded`` or when :attr:`maxQueued` writes are waiting.
        """
        if not self.threaded:
            writeSegmentFile(sfile, data)
            return
        if self.queued >= self.maxQueued:
            self.inlineWrites += 1
            writeSegmentFile(sfile, data)
            return
        if self._thread is None:
            self._jobs = _queue.Queue()
            self._thread = threading.Thread(target=self._run, args=(self._jobs,),
                                            name="otter_tx-paging-writer", daemon=True)
            self._thread.start()
        with _fileLock:
            self.queued += 1
        self._jobs.put((sfile, data))

    def _run(self, jobs):
        while True:
            job = jobs.get()
            try:
                if job is None:
                    return
                writeSegmentFile(*job)
            finally:
                with _fileLock:
                    self.queued -= 1
                jobs.task_done()

    def flush(self):
        """Block until every queued write is done (stop, tests)."""
        if self._jobs is not None:
            self._jobs.join()

    def path(self):
        """The directory (str), created if needed."""
        if self._made is None:
            if self.root is None:
                self._made = tempfile.mkdtemp(prefix="otter_tx-paging-")
            else:
                os.makedirs(self.root, exist_ok=True)
                self._made = self.root
        return self._made

    def newPagerDirectory(self):
        """A fresh directory for one pager (str)."""
        d = os.path.join(self.path(), "q%d" % (next(_ids),))
        os.makedirs(d, exist_ok=True)
        return d

    def reset(self):
        """Remove everything paged (boot, and stop of a temporary directory)."""
        self.flush()
        target = self._made if self._made is not None else self.root
        if target is not None and os.path.isdir(target):
            shutil.rmtree(target, ignore_errors=True)
        self._made = None


class Pager:
    """
    The paged tail of one priority level of one queue: a FIFO of
    :class:`Segment` s.

    :param directory: a :class:`PagingDirectory`.
    :param level: the priority level (int).
    """

    def __init__(self, directory, level):
        self._directory = directory
        self._dir = None
        self.level = level
        self.segments = deque()
        self.count = 0
        self.bytes = 0
        #: persistent messages paged here (int) and their body bytes
        self.persistent = 0
        self.persistentBytes = 0
        self._n = 0
        self._unsettled = deque()  # (segment, SegmentFile) being written

    def __bool__(self):
        return self.count > 0

    def append(self, entry):
        """Page ``entry`` (a READY ``QueueEntry``) at the tail."""
        segs = self.segments
        seg = segs[-1] if segs else None
        if seg is None or seg.file is not None:
            seg = Segment(self.level)
            segs.append(seg)
        size = entry.message.size
        seg.entries.append(entry)
        if seg.firstSeq is None:
            seg.firstSeq = entry.seq
        seg.lastSeq = entry.seq
        seg.count += 1
        seg.bytes += size
        exp = entry.expiresAt
        if exp is not None and (seg.minExpiresAt is None or exp < seg.minExpiresAt):
            seg.minExpiresAt = exp
        self.count += 1
        self.bytes += size
        if entry.message.persistent:
            seg.persistent += 1
            seg.persistentBytes += size
            self.persistent += 1
            self.persistentBytes += size
        if seg.count >= SEGMENT_COUNT or seg.bytes >= SEGMENT_BYTES:
            self._close(seg)
        return seg

    def appendStored(self, run):
        """
        Page at the tail a run of messages the durable store keeps
        (:class:`StoredRun`): nothing is written, the entries are read from
        the store's file when paged in.  Returns the new segment.
        """
        seg = Segment(self.level)
        seg.entries = None
        seg.file = run
        rng = run.range
        seg.firstSeq = rng.firstSeq
        seg.lastSeq = rng.lastSeq
        seg.count = rng.count
        seg.bytes = rng.bytes
        seg.minExpiresAt = rng.minExpiresAt
        # a classic queue's log holds persistent messages only
        seg.persistent = rng.count
        seg.persistentBytes = rng.bytes
        self.segments.append(seg)
        self.count += seg.count
        self.bytes += seg.bytes
        self.persistent += seg.persistent
        self.persistentBytes += seg.persistentBytes
        return seg

    def _close(self, seg):
        """
        Close ``seg``: its file is written (by the writer thread); its
        entries leave memory once that is done (:meth:`_settle`).
        """
        self._settle()
        if self._dir is None:
            self._dir = self._directory.newPagerDirectory()
        self._n += 1
        sfile = seg.file = SegmentFile(os.path.join(self._dir, "%d.seg" % (self._n,)))
        self._directory.write(sfile, encodeEntries(seg.entries))
        self._unsettled.append((seg, sfile))
        self._settle()

    def _settle(self):
        """Drop from memory the entries of segments whose files are written."""
        pending = self._unsettled
        while pending and pending[0][1].written:
            seg, sfile = pending.popleft()
            if seg.file is sfile and not sfile.failed:
                seg.entries = None

    def head(self):
        """The oldest segment, or None."""
        return self.segments[0] if self.segments else None

    def read(self, seg, makeEntry):
        """The entries of ``seg`` (a list; read from its file once written)."""
        self._settle()
        if seg.entries is not None:
            return list(seg.entries)
        if not seg.file.owned:
            return seg.file.read(makeEntry)
        with open(seg.file.path, "rb") as f:
            data = f.read()
        return decodeEntries(data, makeEntry)

    def popHead(self, makeEntry):
        """Remove the oldest segment and return ``(segment, entries)``."""
        seg = self.segments.popleft()
        entries = self.read(seg, makeEntry)
        self._forget(seg)
        return seg, entries

    def _forget(self, seg):
        self._uncount(seg)
        if seg.file is not None:
            dropSegmentFile(seg.file)

    def replace(self, seg, entries):
        """
        ``seg`` now holds only ``entries`` (some were taken out, e.g.
        expired): rewrite it, or drop it when empty.  Returns the segment
        or None.
        """
        self._uncount(seg)
        if not entries:
            if seg.file is not None:
                dropSegmentFile(seg.file)
            self.segments.remove(seg)
            return None
        seg.count = len(entries)
        seg.bytes = sum(e.message.size for e in entries)
        seg.firstSeq = entries[0].seq
        seg.lastSeq = entries[-1].seq
        exps = [e.expiresAt for e in entries if e.expiresAt is not None]
        seg.minExpiresAt = min(exps) if exps else None
        sizes = [e.message.size for e in entries if e.message.persistent]
        seg.persistent = len(sizes)
        seg.persistentBytes = sum(sizes)
        self.count += seg.count
        self.bytes += seg.bytes
        self.persistent += seg.persistent
        self.persistentBytes += seg.persistentBytes
        seg.entries = list(entries)
        if seg.file is not None:
            dropSegmentFile(seg.file)
            self._close(seg)
        return seg

    def _uncount(self, seg):
        self.count -= seg.count
        self.bytes -= seg.bytes
        self.persistent -= seg.persistent
        self.persistentBytes -= seg.persistentBytes

    def iterEntries(self, makeEntry):
        """Every paged entry in order (reads every file: management and tests only)."""
        for seg in list(self.segments):
            for e in self.read(seg, makeEntry):
                yield e

    def detach(self):
        """
        Empty the pager at once and return the files to remove (list of
        str); counts are zero afterwards.
        """
        paths = []
        for s in self.segments:
            f = s.file
            if f is not None and f.owned:
                with _fileLock:
                    f.dropped = True
                    if f.written and not f.failed:
                        paths.append(f.path)
        self.segments = deque()
        self._unsettled = deque()
        self.count = self.bytes = self.persistent = self.persistentBytes = 0
        if self._dir is not None:
            paths.append(self._dir)
            self._dir = None
        return paths


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def removePaths(paths):
    """Remove files and (emptied) directories, ignoring those already gone."""
    for p in paths:
        if p.endswith(".seg"):
            _unlink(p)
        else:
            shutil.rmtree(p, ignore_errors=True)


class IncrementalFree:
    """
    Frees big collections a slice per reactor turn so that dropping a
    million entries (purge, delete) never holds the reactor for long.

    :param clock: ``IReactorTime``.
    :param perTurn: items dropped per turn (int).
    """

    def __init__(self, clock, perTurn=20000):
        self.clock = clock
        self.perTurn = perTurn
        self._work = deque()
        self._call = None

    def add(self, items, onItem=None):
        """Drop ``items`` (a deque or list; consumed) over later turns."""
        if not items:
            return
        self._work.append((items, onItem))
        self._schedule()

    def addPaths(self, paths):
        """Remove these files over later turns (a few hundred per turn)."""
        if paths:
            self._work.append((deque(paths), _removeOne))
            self._schedule()

    def _schedule(self):
        if self._call is None or not self._call.active():
            self._call = self.clock.callLater(0, self._step)

    def pending(self):
        """True while some work is left."""
        return bool(self._work)

    def _step(self):
        self._call = None
        budget = self.perTurn
        work = self._work
        while work and budget > 0:
            items, onItem = work[0]
            if not isinstance(items, deque):
                items = deque(items)
                work[0] = (items, onItem)
            n = min(budget, len(items))
            if onItem is _removeOne:
                n = min(n, 200)
                budget -= n * 100
            else:
                budget -= n
            pop = items.popleft
            if onItem is None:
                for _ in range(n):
                    pop()
            else:
                for _ in range(n):
                    onItem(pop())
            if not items:
                work.popleft()
        if work:
            self._call = self.clock.callLater(0, self._step)

    def flush(self):
        """Do all remaining work now (shutdown, tests)."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        while self._work:
            items, onItem = self._work.popleft()
            for item in items:
                if onItem is not None:
                    onItem(item)


def _removeOne(path):
    removePaths((path,))
