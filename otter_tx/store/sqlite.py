"""
:class:`SQLiteStore`: the embedded durable :class:`~otter_tx.store.interface.IMessageStore`.

Engine: the standard library's ``sqlite3`` on one file, WAL journal,
``synchronous=FULL`` (every commit fsyncs the WAL).  Why SQLite and not a
segment log, the file layout and the guarantees are in ``docs/storage.md``.

Threads.  The reactor thread only records changes: each mutating call
updates an in-memory *pending batch* under a lock and returns.  One
``threading.Thread`` (the writer; not the reactor's threadpool) owns the
SQLite connection and does all file I/O: it opens and recovers the store
(the recovered messages are read later, a row at a time, by read-only
connections of whoever iterates them: :class:`_QueueStream`),
then loops taking the whole pending batch, applying it in ONE transaction
and committing (one fsync), and fires the ``sync()`` Deferreds that were
issued before it took the batch, through ``reactor.callFromThread``.  While
it writes, new changes gather in the next batch: that is the group commit,
and the batch grows with the load.

Coalescing.  The pending batch is not a log but the net effect of the
changes since the last take: one entry per entity, one per (queue, message)
and a set of queues to purge.  An ``enqueue`` followed by a ``dequeue`` of
the same (queue, message) before the writer took them cancels out, and a
message whose every enqueue cancelled out is never written (``stats``
counts these).  With a consumer keeping up with a producer most messages
never touch the disk.  ``coalesce=False`` turns this off (for the bench).
The merging is plain code on :class:`_Batch` (named fields, no lock, no
thread, unit-tested on its own); the store calls it with ``_lock`` held.

Within one transaction the net changes are applied in this order, which is
equivalent to the issue order: entity upserts and deletes; queue purges
(from ``purgeQueue`` and ``deleteEntity('queue')``); message inserts; queue
entry inserts, deletes and redelivered marks; deletion of messages no queue
refers to any more.  A purge is applied before the entry changes because
the pending batch forgets the entry changes of a queue when it is purged,
so every entry change left was issued after the purge.

Everything the broker writes is on the reactor thread; everything the
writer does is on its own thread; they share only the pending batch (under
``_lock``) and a few flags.

Queue ids and purges (schema 2).  Queue entries are keyed by a small
integer ``qid`` that the ``queues`` table maps to the queue key.  A purge
or queue delete does not delete rows: it moves the key to a fresh qid (and,
for ``purgeQueue(key, keep)``, moves the few kept entries with it) in the
batch's transaction, and records the old qid in ``dead_queues``.  That is a
handful of index operations whatever the queue's length, so the purge is
durable with its batch and other publishers' confirms are not held up.
The dead qid's entries and the messages only they referred to are then
deleted :data:`GC_CHUNK` entries at a time, one chunk per transaction
(appended to a regular batch, or alone when the store is idle), and freed
pages are returned to the file system with ``PRAGMA incremental_vacuum``
(``auto_vacuum = INCREMENTAL``) in steps of :data:`VACUUM_STEP` pages
while no batch is pending.
Recovery reads only live qids, so a stop in the middle of that clean-up
loses nothing and resurrects nothing; the clean-up resumes at the next
open.

Write failures.  A batch that cannot be committed (disk full, I/O error)
is rolled back; the ``sync()`` Deferreds waiting for it fail with
:class:`StoreFailedError` (the broker answers basic.nack), :attr:`healthy`
turns False and the observers are told.  The failed batch's changes are
kept and written again, ahead of everything issued since, after a back-off
(:data:`RETRY_DELAYS`); the first commit that succeeds makes the store
healthy again.  Nothing a successful ``sync()`` reported is lost, and a
change is never applied out of order.

Client strings.  Every key, exchange name and routing key is stored as a
BLOB of its UTF-8 encoding with ``surrogateescape`` (the codec decodes
shortstr bytes that are not UTF-8 to lone surrogates, which SQLite TEXT
cannot take), so any string the broker holds is storable and comes back
unchanged.  Records are JSON with ``ensure_ascii``, hence ASCII.

Clean stop.  ``meta.clean_shutdown`` is '0' while the store is open and
set to '1' by the last transaction of :meth:`SQLiteStore.close`.  A store
opened after an unclean stop marks every recovered entry redelivered (on
disk and in the RecoveredState): any of them may have been delivered
before the crash, since a delivery is not made durable before it is sent
(AMQP 0-9-1 basic.deliver "redelivered";
https://www.rabbitmq.com/docs/reliability#consumer-side).
"""

import json
import os
import sqlite3
import threading
import time
from collections import namedtuple

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from otter_tx.store.interface import (
    ENTITY_KINDS,
    IMessageStore,
    RecoveredMessage,
    RecoveredState,
    StoreClosedError,
    StoreCorruptError,
    StoreFailedError,
)

log = Logger()

#: file name used when the store is given a data directory
STORE_FILENAME = "otter_tx.sqlite3"

#: value of meta.format: identifies our files
FORMAT = "otter_tx-store"

#: schema version written by this code; files with a higher one are refused,
#: files with a lower one are migrated when opened (see ``_migrate``)
SCHEMA_VERSION = 2

#: queue entries of a purged or deleted queue deleted per transaction, in
#: a transaction that also writes a batch (small: it delays that batch's
#: syncs by about 1 ms)
GC_CHUNK = 100

#: the same in a transaction of its own (the store has nothing else to do;
#: small, so a sync arriving meanwhile waits little)
GC_CHUNK_IDLE = 250

#: free pages above which the writer returns space to the file system
VACUUM_THRESHOLD = 256

#: pages returned per ``PRAGMA incremental_vacuum`` step (4 KiB pages); a
#: step runs only when no batch is pending
VACUUM_STEP = 256

#: seconds to wait before writing again after a failed commit; the last
#: value repeats
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)

_FILE_SUFFIXES = (".sqlite3", ".sqlite", ".db")

_SCHEMA = """
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE entities (
    kind TEXT NOT NULL,
    key BLOB NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
CREATE TABLE messages (
    msg_id INTEGER PRIMARY KEY,
    exchange BLOB NOT NULL,
    routing_key BLOB NOT NULL,
    props BLOB NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE queues (
    key BLOB PRIMARY KEY,
    qid INTEGER NOT NULL UNIQUE
) WITHOUT ROWID;
CREATE TABLE dead_queues (
    qid INTEGER PRIMARY KEY
);
CREATE TABLE queue_messages (
    qid INTEGER NOT NULL,
    msg_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    enqueued_at REAL NOT NULL,
    expires_at REAL,
    redelivered INTEGER NOT NULL,
    PRIMARY KEY (qid, msg_id)
) WITHOUT ROWID;
CREATE INDEX queue_messages_by_msg ON queue_messages (msg_id);
"""

#: schema 1 -> 2, in one transaction: BLOB keys and names, integer queue
#: ids; ``CAST(text AS BLOB)`` is the text's UTF-8 (schema 1 could only hold
#: valid UTF-8).  ``auto_vacuum`` is switched on by a VACUUM afterwards.
_MIGRATE_1_TO_2 = """
CREATE TABLE entities2 (
    kind TEXT NOT NULL, key BLOB NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
INSERT INTO entities2 SELECT kind, CAST(key AS BLOB), record FROM entities;
DROP TABLE entities;
ALTER TABLE entities2 RENAME TO entities;
CREATE TABLE messages2 (
    msg_id INTEGER PRIMARY KEY, exchange BLOB NOT NULL, routing_key BLOB NOT NULL,
    props BLOB NOT NULL, body BLOB NOT NULL
);
INSERT INTO messages2 SELECT msg_id, CAST(exchange AS BLOB), CAST(routing_key AS BLOB),
    props, body FROM messages;
DROP TABLE messages;
ALTER TABLE messages2 RENAME TO messages;
CREATE TABLE queues (key BLOB PRIMARY KEY, qid INTEGER NOT NULL UNIQUE) WITHOUT ROWID;
INSERT INTO queues SELECT CAST(queue AS BLOB), row_number() OVER (ORDER BY queue)
    FROM (SELECT DISTINCT queue FROM queue_messages);
CREATE TABLE dead_queues (qid INTEGER PRIMARY KEY);
CREATE TABLE queue_messages2 (
    qid INTEGER NOT NULL, msg_id INTEGER NOT NULL, seq INTEGER NOT NULL,
    enqueued_at REAL NOT NULL, expires_at REAL, redelivered INTEGER NOT NULL,
    PRIMARY KEY (qid, msg_id)
) WITHOUT ROWID;
INSERT INTO queue_messages2 SELECT q.qid, m.msg_id, m.seq, m.enqueued_at, m.expires_at,
    m.redelivered FROM queue_messages AS m JOIN queues AS q ON q.key = CAST(m.queue AS BLOB);
DROP TABLE queue_messages;
ALTER TABLE queue_messages2 RENAME TO queue_messages;
CREATE INDEX queue_messages_by_msg ON queue_messages (msg_id);
UPDATE meta SET value = '2' WHERE key = 'schema_version';
"""



def _b(text):
    """A str as stored: UTF-8 with surrogateescape (lossless for any str the codec makes)."""
    return text.encode("utf-8", "surrogateescape")


def _s(raw):
    """The inverse of :func:`_b`."""
    return raw.decode("utf-8", "surrogateescape")


def _real(value):
    """A time in ms as SQLite REAL; a value beyond a double becomes the largest one."""
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return 1.7976931348623157e308


# --- pending batch entry kinds -------------------------------------------
_ENQ = 1  # an enqueue, with its fields (see _EntryChange)
_DEQ = 2  # a dequeue
_MARK = 3  # set the redelivered flag of an entry already on disk


#: most rows per multi-row statement (see _rows); a power of two
_CHUNK = 512

_sqlCache = {}


def _rows(head, width, tail, rows):
    """
    Yield ``(sql, params)`` running ``head (?,..),(?,..) tail`` over
    ``rows`` (tuples of ``width`` values), in chunks of :data:`_CHUNK` rows
    and then power-of-two chunks for the rest (so at most about ten
    distinct statements per ``head``, all kept prepared by the statement
    cache, and ``len(rows) // 512 + 10`` statements per call).

    One multi-row statement instead of ``executemany`` means one
    ``sqlite3_step`` (one GIL release and re-acquisition) per chunk rather
    than per row.  While the reactor thread is busy, re-acquiring the GIL
    can take up to ``sys.getswitchinterval()`` (5 ms), so per-row steps let
    a busy reactor starve the writer; measured with bench/store_bench.py.
    """
    start = 0
    total = len(rows)
    size = _CHUNK
    while start < total:
        while size > total - start:
            size //= 2
        chunk = rows[start : start + size]
        start += size
        key = (head, size)
        sql = _sqlCache.get(key)
        if sql is None:
            one = "(" + ", ".join("?" * width) + ")"
            sql = _sqlCache[key] = head + ", ".join([one] * size) + tail
        if width == 1:
            params = [row[0] for row in chunk]
        else:
            params = [value for row in chunk for value in row]
        yield sql, params


def resolvePath(pathOrDataDir):
    """
    The store file for ``pathOrDataDir`` (``str`` or path-like): a name
    ending in ``.sqlite3``, ``.sqlite`` or ``.db`` that is not a directory
    is the file itself; anything else is a data directory (created on open)
    holding :data:`STORE_FILENAME`.
    """
    path = os.fspath(pathOrDataDir)
    if not os.path.isdir(path) and path.endswith(_FILE_SUFFIXES):
        return os.path.abspath(path)
    return os.path.abspath(os.path.join(path, STORE_FILENAME))


class _PendingMessage:
    """
    A message given to ``addMessage`` in the pending batch.

    :ivar exchange: str.  :ivar routingKey: str.
    :ivar propsRaw: bytes.  :ivar body: bytes.
    :ivar liveEnqueues: pending enqueues of it not cancelled (int).
    :ivar enqueueCancelled: True once one of its pending enqueues was
        cancelled (a dequeue or purge in the same batch).
    """

    __slots__ = ("exchange", "routingKey", "propsRaw", "body", "liveEnqueues", "enqueueCancelled")

    def __init__(self, exchange, routingKey, propsRaw, body):
        self.exchange = exchange
        self.routingKey = routingKey
        self.propsRaw = propsRaw
        self.body = body
        self.liveEnqueues = 0
        self.enqueueCancelled = False


class _EntryChange(namedtuple("_EntryChange", "op seq enqueuedAtMs expiresAtMs redelivered replaces")):
    """
    The net pending change of one (queue, message) entry (a tuple with
    named fields; made with :data:`_tupleNew`).

    :ivar op: ``_ENQ``, ``_DEQ`` or ``_MARK``.
    :ivar seq: enqueue order in the queue (int; ``_ENQ`` only).
    :ivar enqueuedAtMs: float ms since the epoch (``_ENQ`` only).
    :ivar expiresAtMs: float ms since the epoch or None (``_ENQ`` only).
    :ivar redelivered: bool (``_ENQ`` only).
    :ivar replaces: the entry may already be on disk, so cancelling this
        enqueue must still delete it (``_ENQ`` only).
    """

    __slots__ = ()


#: builds an _EntryChange from a 6-tuple in field order without the Python
#: ``__new__`` of a namedtuple (an enqueue is on the hot path)
_tupleNew = tuple.__new__


#: the (shared, never changed) pending change of a dequeue and of a redelivered mark
_DEQUEUE = _EntryChange(_DEQ, None, None, None, False, False)
_MARK_REDELIVERED = _EntryChange(_MARK, None, None, None, False, False)


class _Batch:
    """
    The net effect of the changes issued since the writer last took a
    batch, plus the ``sync()`` Deferreds waiting for it.

    The merge methods (:meth:`putEntity` .. :meth:`purge`) are plain code
    with no lock and no thread: :class:`SQLiteStore` calls them with its
    lock held, and the unit tests call them directly.  Those that can
    cancel pending changes return how many they cancelled (int, for
    ``stats["cancelled"]``).

    :ivar entities: ``{(kind, key): json str, or None to delete}``.
    :ivar purges: ``{queueKey: frozenset of storeIds kept}``: every other
        entry of the queue on disk is removed before ``entries`` apply.
    :ivar adds: ``{storeId: _PendingMessage}``.
    :ivar entries: ``{queueKey: {storeId: _EntryChange}}``.
    :ivar waiters: the ``sync()`` Deferreds waiting for this batch.
    :ivar size: number of changes recorded (for "is there anything to write").
    :ivar coalesce: cancel enqueue/dequeue pairs (``SQLiteStore(coalesce=)``).
    """

    __slots__ = ("entities", "purges", "adds", "entries", "waiters", "size", "coalesce")

    def __init__(self, coalesce=True):
        self.entities = {}
        self.purges = {}
        self.adds = {}
        self.entries = {}
        self.waiters = []
        self.size = 0
        self.coalesce = coalesce

    def putEntity(self, kind, key, raw):
        """Insert or replace entity ``(kind, key)`` with JSON text ``raw``."""
        self.entities[(kind, key)] = raw

    def deleteEntity(self, kind, key):
        """Delete entity ``(kind, key)``; a queue's entries go with it."""
        self.entities[(kind, key)] = None
        if kind == "queue":
            return self.purge(key)
        return 0

    def addMessage(self, storeId, exchange, routingKey, propsRaw, body):
        """Write message ``storeId`` (its enqueues follow)."""
        self.adds[storeId] = _PendingMessage(exchange, routingKey, propsRaw, body)

    def enqueue(self, queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered):
        """Put message ``storeId`` in queue ``queueKey`` (replacing a pending change of that entry)."""
        entries = self.entries.get(queueKey)
        if entries is None:
            entries = self.entries[queueKey] = {}
        previous = entries.get(storeId)
        # `replaces`: the entry may already be on disk, so cancelling this
        # enqueue must still delete it.  It cannot be when the message is
        # new in this batch or the queue was purged in it (a purge forgets
        # the pending entries, so `previous` is then from after it).
        if previous is None:
            replaces = storeId not in self.adds and queueKey not in self.purges
        else:
            replaces = previous.op != _ENQ or previous.replaces
        entries[storeId] = _tupleNew(_EntryChange, (_ENQ, seq, enqueuedAtMs, expiresAtMs, bool(redelivered), replaces))
        if previous is None or previous.op != _ENQ:
            add = self.adds.get(storeId)
            if add is not None:
                add.liveEnqueues += 1

    def dequeue(self, queueKey, storeId):
        """
        Remove message ``storeId`` from queue ``queueKey``; with coalescing
        a pending enqueue of it cancels out (and the message, if that was
        its last pending enqueue).  Returns the changes cancelled.
        """
        entries = self.entries.get(queueKey)
        if entries is None:
            entries = self.entries[queueKey] = {}
        previous = entries.get(storeId)
        if previous is None or previous.op != _ENQ:
            entries[storeId] = _DEQUEUE
            return 0
        if not self.coalesce:
            self._cancelEnqueue(storeId)
            entries[storeId] = _DEQUEUE
            return 0
        if previous.replaces:
            entries[storeId] = _DEQUEUE
        else:
            del entries[storeId]
        return 2 + self._cancelEnqueue(storeId)

    def markRedelivered(self, queueKey, storeId):
        """Set the redelivered flag of one entry (merged into a pending enqueue of it)."""
        entries = self.entries.get(queueKey)
        if entries is None:
            entries = self.entries[queueKey] = {}
        previous = entries.get(storeId)
        if previous is None:
            entries[storeId] = _MARK_REDELIVERED
        elif previous.op == _ENQ:
            entries[storeId] = _tupleNew(_EntryChange, previous[:4] + (True,) + previous[5:])
        # after a pending dequeue: nothing to mark

    def purge(self, queueKey, keep=frozenset()):
        """
        Remove every entry of queue ``queueKey`` except those of the
        storeIds in ``keep`` (frozenset): pending changes of the others are
        forgotten (their enqueues cancelled).  Returns the changes cancelled.
        """
        cancelled = 0
        entries = self.entries.pop(queueKey, None)
        if entries:
            kept = {}
            for storeId, entry in entries.items():
                if storeId in keep:
                    kept[storeId] = entry
                elif entry.op == _ENQ:
                    cancelled += 1 + self._cancelEnqueue(storeId)
            if kept:
                self.entries[queueKey] = kept
        previous = self.purges.get(queueKey)
        self.purges[queueKey] = keep if previous is None else previous & keep
        return cancelled

    def _cancelEnqueue(self, storeId):
        """
        A pending enqueue of ``storeId`` went away; forget the pending
        message too when that was its last pending enqueue (with
        coalescing).  Returns 1 when the message was forgotten, else 0.
        """
        add = self.adds.get(storeId)
        if add is None:
            return 0
        add.liveEnqueues -= 1
        add.enqueueCancelled = True
        if add.liveEnqueues <= 0 and self.coalesce:
            del self.adds[storeId]
            return 1
        return 0


@implementer(IMessageStore)
class SQLiteStore:
    """
    The durable store on one SQLite file.

    :param pathOrDataDir: the data directory (the file is
        ``<dir>/otter_tx.sqlite3``) or a file path ending in ``.sqlite3`` /
        ``.sqlite`` / ``.db`` (see :func:`resolvePath`).
    :param reactor: provides ``callFromThread``; the only reactor method
        used, and only from the writer thread.
    :param integrityCheck: run ``PRAGMA quick_check`` when opening (reads
        the whole file once; catches truncation and damaged pages before
        anything is loaded).  On by default.
    :param coalesce: cancel enqueue/dequeue pairs inside a pending batch.
    :param retryDelays: seconds to wait before each retry after a failed
        commit (the last one repeats); :data:`RETRY_DELAYS` by default.

    :ivar healthy: ``bool``, True while writes succeed (see
        :meth:`addHealthObserver`).
    :ivar stats: ``{str: int}`` counters for the bench and management:
        ``commits`` (transactions = fsyncs of the WAL), ``changes`` (calls
        recorded), ``cancelled`` (changes that cancelled out before being
        written), ``syncs``, ``failedCommits``, ``gcEntries`` (entries of
        purged or deleted queues removed in the background),
        ``vacuumedPages`` (pages returned to the file system).
    """

    def __init__(self, pathOrDataDir, reactor, integrityCheck=True, coalesce=True,
                 retryDelays=RETRY_DELAYS):
        self.path = resolvePath(pathOrDataDir)
        self._reactor = reactor
        self._integrityCheck = integrityCheck
        self._coalesce = coalesce
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending = _Batch(self._coalesce)
        # "new" -> "opening" -> "open" -> "closing" -> "closed"
        self._state = "new"
        self._thread = None
        self._openDeferred = None
        # close(): None until the writer ends, then the result (None or a
        # Failure); callers waiting meanwhile are in _closeWaiters
        self._closeResult = None
        self._closeWaiters = []
        self._ended = Deferred()
        # set by the writer thread just before it ends: close()'s result
        self._closeOutcome = None
        self._retryDelays = tuple(retryDelays)
        # reactor thread: health as last reported by the writer
        self.healthy = True
        self._healthObservers = []
        # writer thread only: batches whose commit failed, to write again
        # ahead of the next one; the queue id map; dead qids to clean up
        self._retry = []
        # the batch the writer took and has not finished writing (under _lock)
        self._writing = None
        self._failures = 0
        self._qids = {}
        self._nextQid = 1
        self._dead = []
        self._vacuumDue = False
        # Deferreds of _whenIdle() (under _lock)
        self._idleWaiters = []
        # tests only: make the writer drop everything and exit at once
        self._abandoned = False
        self.stats = {"commits": 0, "changes": 0, "cancelled": 0, "syncs": 0,
                      "failedCommits": 0, "gcEntries": 0, "vacuumedPages": 0}

    # --- lifecycle (reactor thread) ----------------------------------------

    def open(self):
        """
        Start the writer thread, which creates or opens the file, checks
        it, repairs what an unclean stop can leave, and loads everything.

        :return: ``Deferred[RecoveredState]``, failing with
            :class:`StoreCorruptError` for an unusable file.
        """
        if self._state != "new":
            raise StoreClosedError(
                f"SQLiteStore.open() called in state {self._state!r}; "
                "make a new SQLiteStore to reopen"
            )
        self._state = "opening"
        self._openDeferred = Deferred()
        self._thread = threading.Thread(
            target=self._run, name=f"otter_tx store writer {self.path}", daemon=True
        )
        self._thread.start()
        return self._openDeferred

    def close(self):
        """
        Write what is pending, checkpoint the WAL into the main file, close
        the file and end the writer thread.

        :return: ``Deferred[None]`` (a new one per call, all for the same
            close); fails with :class:`StoreFailedError` if a write failed.
        """
        if self._state == "new":
            self._state = "closed"
            self._closeResult = (None,)
        if self._state in ("open", "opening"):
            with self._lock:
                self._state = "closing"
                self._wake.notify()
        if self._closeResult is not None:
            result = self._closeResult[0]
            return fail(result) if isinstance(result, Failure) else succeed(result)
        d = Deferred()
        self._closeWaiters.append(d)
        return d

    def _closed(self, result):
        """
        The writer thread has closed the file and ended (reactor thread):
        fire ``close()``.
        """
        self._closeResult = (result,)
        waiters, self._closeWaiters = self._closeWaiters, []
        for d in waiters:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(result)

    def _checkOpen(self):
        if self._state != "open":
            raise StoreClosedError(f"SQLiteStore {self.path!r} is {self._state}, not open")

    # --- changes (reactor thread) ------------------------------------------

    def _changed(self, batch, cancelled=0):
        """
        Count a change (and ``cancelled``: pending writes it made
        unnecessary); wake the writer if the batch was empty.  Call with
        ``_lock`` held.
        """
        if cancelled:
            self.stats["cancelled"] += cancelled
        batch.size += 1
        self.stats["changes"] += 1
        if batch.size == 1 and not batch.waiters:
            self._wake.notify()

    def putEntity(self, kind, key, record):
        """
        Insert or replace an entity (see :meth:`IMessageStore.putEntity`).
        """
        self._checkOpen()
        if kind not in ENTITY_KINDS:
            raise ValueError(f"unknown entity kind {kind!r}; expected one of {ENTITY_KINDS}")
        raw = json.dumps(record)
        with self._lock:
            batch = self._pending
            batch.putEntity(kind, key, raw)
            self._changed(batch)

    def deleteEntity(self, kind, key):
        """
        Delete an entity; deleting a queue drops its messages.
        """
        self._checkOpen()
        if kind not in ENTITY_KINDS:
            raise ValueError(f"unknown entity kind {kind!r}; expected one of {ENTITY_KINDS}")
        with self._lock:
            batch = self._pending
            self._changed(batch, batch.deleteEntity(kind, key))

    def addMessage(self, storeId, exchange, routingKey, propsRaw, body):
        """
        Store a message once (see :meth:`IMessageStore.addMessage`).
        """
        self._checkOpen()
        if type(propsRaw) is not bytes:
            propsRaw = bytes(propsRaw)
        if type(body) is not bytes:
            body = bytes(body)
        with self._lock:
            batch = self._pending
            batch.addMessage(storeId, exchange, routingKey, propsRaw, body)
            self._changed(batch)

    def enqueue(self, queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered):
        """
        Put a stored message in a queue.  The message must have been given
        to :meth:`addMessage`; that is not checked here (it would need a
        read), and an entry without its message is dropped at recovery.
        """
        self._checkOpen()
        with self._lock:
            batch = self._pending
            batch.enqueue(queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered)
            self._changed(batch)

    def dequeue(self, queueKey, storeId):
        """
        Remove a message from a queue; the message row goes when no queue
        refers to it.  Cancels a pending enqueue of the same entry.
        """
        self._checkOpen()
        with self._lock:
            batch = self._pending
            self._changed(batch, batch.dequeue(queueKey, storeId))

    def markRedelivered(self, queueKey, storeId):
        """
        Set the redelivered flag of one entry (merged into a pending
        enqueue of it).
        """
        self._checkOpen()
        with self._lock:
            batch = self._pending
            batch.markRedelivered(queueKey, storeId)
            self._changed(batch)

    def purgeQueue(self, queueKey, keep=()):
        """
        Remove every entry of a queue except those of the storeIds in
        ``keep`` (see :meth:`IMessageStore.purgeQueue`): O(len(keep)) index
        operations in the next batch; the entries themselves are deleted
        in the background.
        """
        self._checkOpen()
        keep = frozenset(keep)
        with self._lock:
            batch = self._pending
            self._changed(batch, batch.purge(queueKey, keep))

    def pendingWriteBytes(self):
        """
        Bytes of message bodies and properties given to :meth:`addMessage`
        and not committed yet (int): the pending batch, the batch being
        written and failed batches waiting to be written again.  What the
        file is about to grow by, roughly; the disk alarm counts it as used
        (:class:`otter_tx.resources.alarms.DiskMonitor`).  Reactor thread;
        costs one pass over the messages not committed yet.
        """
        with self._lock:
            batches = [self._pending, self._writing] + list(self._retry)
            seen = set()
            total = 0
            for batch in batches:
                if batch is None or id(batch) in seen:
                    continue
                seen.add(id(batch))
                for m in batch.adds.values():
                    total += len(m.body) + len(m.propsRaw)
        return total

    def sync(self):
        """
        :return: ``Deferred[None]`` fired on the reactor thread once every
            change issued before this call is committed and fsync'd.
        """
        self._checkOpen()
        d = Deferred()
        with self._lock:
            batch = self._pending
            batch.waiters.append(d)
            self.stats["syncs"] += 1
            if batch.size == 0 and len(batch.waiters) == 1:
                self._wake.notify()
        return d

    # --- health (reactor thread) ---------------------------------------------

    def addHealthObserver(self, callback):
        """
        Call ``callback(healthy, reason)`` on the reactor thread each time
        :attr:`healthy` changes: ``healthy`` is a ``bool``, ``reason`` a
        one-line ``str`` (``"store write failed: OperationalError: database
        or disk is full"``) when it turns False and ``None`` when it turns
        True again.  An exception from a callback is logged.
        """
        self._healthObservers.append(callback)

    def _setHealth(self, healthy, reason):
        if healthy == self.healthy:
            return
        self.healthy = healthy
        if healthy:
            log.info("store {path} writes again", path=self.path)
        for callback in list(self._healthObservers):
            try:
                callback(healthy, reason)
            except Exception:
                log.failure("store health observer failed")

    # --- tests only -----------------------------------------------------------

    def _whenIdle(self):
        """
        A Deferred that fires once the writer has nothing pending, no
        failed batch to retry and no background clean-up or vacuum left
        (for tests and the bench).
        """
        d = Deferred()
        with self._lock:
            self._idleWaiters.append(d)
            self._wake.notify()
        return d

    def _abandon(self):
        """
        Simulate a crash for tests: the writer thread drops the pending
        batch without writing it and exits; nothing is checkpointed.  The
        Deferreds of ``sync()`` and ``close()`` never fire.  Returns a
        Deferred that fires when the thread has ended.
        """
        with self._lock:
            self._abandoned = True
            self._state = "closed"
            self._wake.notify()
        return self._ended

    # --- writer thread ---------------------------------------------------------

    def _fire(self, d, result):
        """Fire ``d`` with ``result`` on the reactor thread."""
        if isinstance(result, Failure):
            self._reactor.callFromThread(d.errback, result)
        else:
            self._reactor.callFromThread(d.callback, result)

    def _run(self):
        """
        The writer thread: open and recover, then write batches until
        closed.
        """
        conn = None
        try:
            try:
                try:
                    conn = self._connect()
                    recovered = self._recover(conn)
                except sqlite3.DatabaseError as e:
                    if isinstance(e, sqlite3.OperationalError) and (
                        "locked" in str(e) or "unable to open" in str(e)
                    ):
                        # not damage: another process holds it, or permissions
                        raise
                    raise self._corrupt(f"SQLite reports: {e}") from e
            except BaseException:
                failure = Failure()
                with self._lock:
                    self._state = "closed"
                if conn is not None:
                    conn.close()
                self._fire(self._openDeferred, failure)
                self._closeOutcome = None
                return

            def opened():
                if self._state == "opening":
                    self._state = "open"
                self._openDeferred.callback(recovered)

            self._reactor.callFromThread(opened)
            try:
                self._writeLoop(conn)
            except BaseException:
                # a bug in the loop itself (a failed commit is handled
                # inside): fail every waiter rather than leave them hanging
                log.failure("store writer thread crashed")
                failure = Failure(StoreFailedError(self.path, "the writer thread crashed"))
                self._reportHealth(False, "store writer thread crashed")
                with self._lock:
                    self._state = "closed"
                    waiters, self._pending.waiters = self._pending.waiters, []
                for d in waiters:
                    self._fire(d, failure)
                self._closeOutcome = failure
        finally:
            self._reactor.callFromThread(self._threadEnded)

    def _threadEnded(self):
        """
        The writer thread is ending (reactor thread): join it (it has
        nothing left to do, so this does not wait), then fire ``close()``.
        """
        self._thread.join()
        if not self._abandoned:
            self._closed(self._closeOutcome)
        self._ended.callback(None)

    def _reportHealth(self, healthy, reason):
        """Tell the reactor thread the store's health (writer thread)."""
        self._reactor.callFromThread(self._setHealth, healthy, reason)

    def _hasBackgroundWork(self):
        return bool(self._dead) or self._vacuumDue

    def _writeLoop(self, conn):
        """
        Take the pending batch, write it (with the failed batches before
        it and one clean-up chunk), fire its waiters; when there is nothing
        pending, do background clean-up; when a write failed, wait a
        back-off first.  Ends after the close's last write.
        """
        retryAt = None
        while True:
            with self._lock:
                while not self._abandoned and self._state != "closing":
                    if retryAt is not None:
                        delay = retryAt - time.monotonic()
                        if delay > 0:
                            self._wake.wait(delay)
                            continue
                        retryAt = None
                        break
                    if self._pending.size or self._pending.waiters or self._hasBackgroundWork():
                        break
                    if self._idleWaiters and not self._retry:
                        idle, self._idleWaiters = self._idleWaiters, []
                        for d in idle:
                            self._fire(d, None)
                    self._wake.wait()
                if self._abandoned:
                    conn.close()
                    return
                batch = self._pending
                self._pending = _Batch(self._coalesce)
                self._writing = batch
                closing = self._state == "closing"
            batches = self._retry + [batch] if batch.size else list(self._retry)
            failure = None
            waiters = batch.waiters
            if not batches and not closing and not self._dead and self._vacuumDue:
                # idle: return free pages, one small step per loop turn
                # (the waiters of an empty batch have nothing to wait for: a
                # failed vacuum step is not theirs to fail)
                try:
                    self._vacuum(conn)
                except Exception as e:
                    self._writeFailed(conn, e, [])
                    retryAt = time.monotonic() + self._retryDelay()
                else:
                    self._wroteAgain()
            elif batches or (self._hasBackgroundWork() and not closing):
                try:
                    self._write(conn, batches, closing)
                except Exception as e:
                    failure = self._writeFailed(conn, e, batches)
                    retryAt = time.monotonic() + self._retryDelay()
                else:
                    self._retry = []
                    self._wroteAgain()
            elif closing:
                try:
                    self._markClean(conn)
                except Exception as e:
                    failure = self._writeFailed(conn, e, [])
            with self._lock:
                self._writing = None
            for d in waiters:
                self._fire(d, failure)
            if closing:
                with self._lock:
                    more = self._pending.size or self._pending.waiters
                if more:
                    continue
                result = failure
                try:
                    if failure is None:
                        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                    conn.close()
                except Exception:
                    result = Failure()
                with self._lock:
                    self._state = "closed"
                self._closeOutcome = result
                return

    def _wroteAgain(self):
        """A write succeeded (writer thread): healthy again if it was not."""
        if self._failures:
            self._failures = 0
            self._reportHealth(True, None)

    def _retryDelay(self):
        delays = self._retryDelays or (0.0,)
        return delays[min(self._failures, len(delays)) - 1]

    def _writeFailed(self, conn, error, batches):
        """
        A commit failed (writer thread): roll back, keep ``batches`` for
        the next attempt, reload the queue id map, report the store
        unhealthy.  Returns the Failure for the waiters.
        """
        self.stats["failedCommits"] += 1
        self._failures += 1
        reason = f"{type(error).__name__}: {error}"
        if self._failures == 1:
            log.error("store {path} write failed ({reason}); the batch's syncs fail and "
                      "its changes are written again after a back-off",
                      path=self.path, reason=reason)
        failed = StoreFailedError(self.path, reason)
        failed.__cause__ = error
        try:
            if conn.in_transaction:
                conn.rollback()
        except Exception:
            pass
        try:
            self._loadQids(conn)
        except Exception:
            pass
        for batch in batches:
            batch.waiters = []
        self._retry = batches
        self._reportHealth(False, "store write failed: " + reason.splitlines()[0])
        return Failure(failed)

    def _markClean(self, conn):
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'clean_shutdown'")

    def _qid(self, conn, key, create):
        """The qid of queue ``key`` (str), allocated when ``create``; else None."""
        qid = self._qids.get(key)
        if qid is None and create:
            qid = self._nextQid
            self._nextQid += 1
            conn.execute("INSERT INTO queues (key, qid) VALUES (?, ?)", (_b(key), qid))
            self._qids[key] = qid
        return qid

    def _loadQids(self, conn):
        """Read the queue id map and the dead qids (writer thread)."""
        self._qids = {_s(key): qid for key, qid in conn.execute("SELECT key, qid FROM queues")}
        self._dead = [r[0] for r in conn.execute("SELECT qid FROM dead_queues ORDER BY qid")]
        top = conn.execute(
            "SELECT max(m) FROM (SELECT max(qid) AS m FROM queues "
            "UNION ALL SELECT max(qid) FROM dead_queues)"
        ).fetchone()[0]
        self._nextQid = (top or 0) + 1

    def _write(self, conn, batches, finish=False):
        """
        Apply ``batches`` in order, then one clean-up chunk, in ONE
        transaction and commit it (one fsync).  With ``finish`` (the close)
        the transaction also marks the stop clean.  Without batches (a
        clean-up chunk alone) the chunk is :data:`GC_CHUNK_IDLE` entries and
        the commit is not fsync'd (``synchronous = NORMAL``): losing it in a
        crash only means doing it again, and the next fsync'd commit makes
        it durable anyway (WAL order).
        """
        ex = conn.execute
        alone = not batches and not finish
        if alone:
            ex("PRAGMA synchronous = NORMAL")
        try:
            ex("BEGIN IMMEDIATE")
            try:
                for batch in batches:
                    self._apply(conn, batch)
                if not finish:
                    self._collect(conn, GC_CHUNK_IDLE if alone else GC_CHUNK)
                else:
                    self._markClean(conn)
                ex("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
        finally:
            if alone:
                ex("PRAGMA synchronous = FULL")
        self.stats["commits"] += 1

    def _apply(self, conn, batch):
        """Apply one batch's net changes inside the open transaction."""
        orphanCandidates = set()
        ex = conn.execute
        exm = conn.executemany
        upserts = []
        deletes = []
        for (kind, key), raw in batch.entities.items():
            if raw is None:
                deletes.append((kind, _b(key)))
            else:
                upserts.append((kind, _b(key), raw))
        if upserts:
            exm("INSERT OR REPLACE INTO entities (kind, key, record) VALUES (?, ?, ?)", upserts)
        if deletes:
            exm("DELETE FROM entities WHERE kind = ? AND key = ?", deletes)
        for queueKey, keep in batch.purges.items():
            self._purge(conn, queueKey, keep)
        if batch.adds:
            rows = _rows(
                "INSERT OR REPLACE INTO messages "
                "(msg_id, exchange, routing_key, props, body) VALUES ",
                5,
                "",
                [(storeId, _b(a.exchange), _b(a.routingKey), a.propsRaw, a.body)
                 for storeId, a in batch.adds.items()],
            )
            for sql, params in rows:
                ex(sql, params)
            # with coalescing off, a message whose pending enqueues were
            # all dequeued again is written and must go at commit.  (A
            # message with no enqueue yet is kept: its enqueue may be in
            # the next batch; a stop in between leaves an orphan that
            # recovery removes.)
            orphanCandidates.update(
                m for m, a in batch.adds.items() if a.liveEnqueues <= 0 and a.enqueueCancelled
            )
        inserts = []
        removals = []
        marks = []
        for queueKey, entries in batch.entries.items():
            qid = None
            for storeId, entry in entries.items():
                op = entry.op
                if qid is None:
                    qid = self._qid(conn, queueKey, op == _ENQ)
                    if qid is None:
                        continue  # nothing of this queue is on disk
                if op == _ENQ:
                    inserts.append(
                        (qid, storeId, entry.seq, _real(entry.enqueuedAtMs), _real(entry.expiresAtMs),
                         int(entry.redelivered))
                    )
                elif op == _DEQ:
                    removals.append((qid, storeId))
                else:
                    marks.append((qid, storeId))
        if removals:
            for sql, params in _rows(_DELETE_ENTRIES, 2, "))", removals):
                ex(sql, params)
            orphanCandidates.update(r[1] for r in removals)
            self._vacuumDue = True
        if inserts:
            for sql, params in _rows(_INSERT_ENTRIES, 6, "", inserts):
                ex(sql, params)
        if marks:
            for sql, params in _rows(_MARK_ENTRIES, 2, "))", marks):
                ex(sql, params)
        if orphanCandidates:
            self._deleteOrphans(conn, orphanCandidates)

    def _deleteOrphans(self, conn, storeIds):
        """Delete the messages among ``storeIds`` that no queue entry refers to."""
        for sql, params in _rows(_DELETE_ORPHANS, 1, _DELETE_ORPHANS_TAIL, [(m,) for m in storeIds]):
            conn.execute(sql, params)

    def _purge(self, conn, queueKey, keep):
        """
        Move queue ``queueKey`` to a fresh qid, taking only the entries of
        ``keep`` along; the old qid is dead (cleaned up by :meth:`_collect`).
        """
        old = self._qids.pop(queueKey, None)
        if old is None:
            return
        ex = conn.execute
        ex("DELETE FROM queues WHERE key = ?", (_b(queueKey),))
        ex("INSERT INTO dead_queues (qid) VALUES (?)", (old,))
        self._dead.append(old)
        if keep:
            new = self._qid(conn, queueKey, True)
            for sql, params in _rows(
                "UPDATE queue_messages SET qid = ? WHERE qid = ? AND msg_id IN (VALUES ",
                1,
                ")",
                [(m,) for m in keep],
            ):
                ex(sql, [new, old] + params)

    def _collect(self, conn, chunk):
        """
        Delete up to ``chunk`` entries of the oldest dead qid and the
        messages only they referred to (inside the open transaction).
        """
        if not self._dead:
            return
        qid = self._dead[0]
        removed = [r[0] for r in conn.execute(_COLLECT, (qid, qid, chunk)).fetchall()]
        if len(removed) < chunk:
            conn.execute("DELETE FROM dead_queues WHERE qid = ?", (qid,))
            self._dead.pop(0)
        if removed:
            self._deleteOrphans(conn, removed)
            self.stats["gcEntries"] += len(removed)
        self._vacuumDue = True

    def _vacuum(self, conn):
        """
        Return up to :data:`VACUUM_STEP` free pages to the file system when
        more than :data:`VACUUM_THRESHOLD` are free (its own small
        transaction; the file shrinks at the next WAL checkpoint).
        """
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        if free <= VACUUM_THRESHOLD:
            self._vacuumDue = False
            return
        # not fsync'd, as a clean-up chunk alone (see _write)
        conn.execute("PRAGMA synchronous = NORMAL")
        try:
            conn.execute(f"PRAGMA incremental_vacuum({VACUUM_STEP})").fetchall()
        finally:
            conn.execute("PRAGMA synchronous = FULL")
        self.stats["vacuumedPages"] += min(free, VACUUM_STEP)

    # --- opening and recovery (writer thread) ---------------------------------

    def _corrupt(self, reason):
        return StoreCorruptError(self.path, reason)

    def _connect(self):
        """
        Open the file, creating it (atomically) when it does not exist.
        """
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        if not os.path.exists(self.path):
            self._create(directory)
        conn = sqlite3.connect(self.path, isolation_level=None, cached_statements=512)
        try:
            conn.execute("PRAGMA synchronous = FULL").fetchall()
            conn.execute("PRAGMA cache_size = -16384").fetchall()
            # a checkpoint truncates the WAL back to this size, so the space
            # the WAL took during a purge's clean-up is returned as well
            conn.execute("PRAGMA journal_size_limit = 16777216").fetchall()
        except BaseException:
            conn.close()
            raise
        return conn

    def _create(self, directory):
        """
        Create an empty store under a temporary name, fsync it and rename
        it into place, so a file at :attr:`path` is always a complete
        store: a missing table there means damage, never an interrupted
        creation.
        """
        tmp = self.path + ".new"
        for leftover in (tmp, tmp + "-wal", tmp + "-shm", tmp + "-journal"):
            if os.path.exists(leftover):
                os.remove(leftover)
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            # auto_vacuum must be chosen before the first table exists
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL").fetchall()
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            conn.execute("PRAGMA synchronous = FULL").fetchall()
            conn.executescript(
                "BEGIN;"
                + _SCHEMA
                + f"INSERT INTO meta VALUES ('format', '{FORMAT}');"
                + f"INSERT INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');"
                + "INSERT INTO meta VALUES ('clean_shutdown', '1');"
                + "COMMIT;"
            )
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.close()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _recover(self, conn):
        """
        Check the file, migrate an older schema, repair what an unclean
        stop leaves (in one transaction), and load everything.
        """
        try:
            rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                raise self._corrupt(
                    "it is not an otter_tx store (no 'meta' table); it may be "
                    "truncated or another program's database"
                ) from e
            raise
        if rows.get("format") != FORMAT:
            raise self._corrupt(
                f"it is not an otter_tx store (format {rows.get('format')!r})"
            )
        try:
            version = int(rows.get("schema_version", ""))
        except ValueError:
            raise self._corrupt(
                f"its schema version {rows.get('schema_version')!r} is unreadable"
            ) from None
        if version > SCHEMA_VERSION:
            raise self._corrupt(
                f"it was written by a newer otter_tx (schema version {version}, "
                f"this one reads up to {SCHEMA_VERSION}); upgrade otter_tx "
                "rather than moving the file aside"
            )
        if self._integrityCheck:
            problems = [r[0] for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
            if problems != ["ok"]:
                raise self._corrupt(
                    "SQLite's integrity check failed: " + "; ".join(problems)
                )
        # the file was created in WAL mode and the mode is persistent;
        # set it only after the checks so an unusable file is not written
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
        if mode != "wal":
            raise self._corrupt(f"SQLite cannot use WAL mode on it (got {mode!r})")
        if version < 2:
            self._migrate(conn)
        # a file of schema 1 does not say whether its last stop was clean
        clean = rows.get("clean_shutdown") == "1"
        return self._load(conn, clean)

    def _migrate(self, conn):
        """
        Schema 1 -> 2 in one transaction, then a VACUUM that switches
        ``auto_vacuum`` to INCREMENTAL (it rewrites the file once).
        """
        log.info("store {path}: migrating schema 1 to 2", path=self.path)
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _MIGRATE_1_TO_2.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL").fetchall()
        conn.execute("VACUUM")

    def _load(self, conn, clean):
        stats = {"droppedDanglingEntries": 0, "droppedOrphanMessages": 0}
        conn.execute("BEGIN IMMEDIATE")
        try:
            entities = self._loadEntities(conn, stats)
            self._loadQids(conn)
            # qids whose queue entity is gone: their entries are dropped now
            # (not left to the background clean-up: the count is reported)
            for key in [k for k in self._qids if k not in entities["queue"]]:
                qid = self._qids.pop(key)
                cursor = conn.execute("DELETE FROM queue_messages WHERE qid = ?", (qid,))
                stats["droppedDanglingEntries"] += max(cursor.rowcount, 0)
                conn.execute("DELETE FROM queues WHERE qid = ?", (qid,))
            if not clean or stats["droppedDanglingEntries"]:
                # messages added without a queue entry (a stop between the
                # batch of addMessage and that of enqueue), or left by
                # dropped entries
                cursor = conn.execute(
                    "DELETE FROM messages WHERE msg_id NOT IN "
                    "(SELECT msg_id FROM queue_messages)"
                )
                stats["droppedOrphanMessages"] = max(cursor.rowcount, 0)
            if not clean:
                conn.execute("UPDATE queue_messages SET redelivered = 1 WHERE redelivered = 0")
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('clean_shutdown', '0')"
            )
            # counted in the same transaction: one snapshot (the messages
            # themselves are streamed later, see _QueueStream)
            recovered = self._loadMessages(conn, entities, stats)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        self._vacuumDue = True
        return recovered

    def _loadEntities(self, conn, stats):
        entities = {kind: {} for kind in ENTITY_KINDS}
        for kind, key, raw in conn.execute("SELECT kind, key, record FROM entities"):
            byKind = entities.get(kind)
            key = _s(key)
            if byKind is None:
                raise self._corrupt(f"it holds an entity of unknown kind {kind!r}")
            try:
                byKind[key] = json.loads(raw)
            except ValueError as e:
                raise self._corrupt(f"entity {kind}/{key!r} is not valid JSON ({e})") from e
        for kind in ENTITY_KINDS:
            stats[kind] = len(entities[kind])
        return entities

    def _loadMessages(self, conn, entities, stats):
        """
        The recovered messages as one lazy :class:`_QueueStream` per live
        queue holding entries (nothing is read into memory here: a queue
        of 10M messages is read back a row at a time while the broker
        restores it, so recovery costs bounded memory, issue 8).  The
        counts for the summary line are index scans; the body bytes a scan
        of the message rows (no body is read for that: SQLite gets a
        BLOB's length from its record header).
        """
        messages = {}
        queued = 0
        for key, qid in self._qids.items():
            count = conn.execute(_COUNT_ENTRIES, (qid,)).fetchone()[0]
            if count:
                messages[key] = _QueueStream(self.path, qid, count)
                queued += count
        if self._dead:
            # entries of purged queues not cleaned up yet: count only the
            # messages a live queue holds
            row = conn.execute(_COUNT_LIVE_MESSAGES).fetchone()
        else:
            row = conn.execute("SELECT count(*), total(length(body)) FROM messages").fetchone()
        stats["messages"] = row[0]
        stats["queuedMessages"] = queued
        stats["bodyBytes"] = int(row[1])
        return RecoveredState(entities, messages, stats, self.path)


#: distinct names decoded once per recovered queue, at most this many
_NAME_CACHE = 4096


class _QueueStream:
    """
    The recovered entries of one queue, as an iterable of
    :class:`RecoveredMessage` in ``seq`` order that reads the store file
    lazily: each iteration opens its own read-only connection on the
    calling thread (the reactor thread at boot; the writer thread keeps
    its own) and yields one row at a time, so only the rows not yet
    consumed stay on disk.  The read is one SQLite snapshot (WAL), taken
    when iteration starts: iterate before changing that queue.

    Order: the rows are read along the primary key ``(qid, msg_id)``
    (no sort) when msg_id order is seq order, which it almost always is;
    otherwise (e.g. a delayed exchange enqueues old messages late)
    ``ORDER BY seq``, which SQLite sorts in bounded memory (its sorter
    spills to temporary files).

    ``len()`` is the number of entries when the store was opened.
    """

    __slots__ = ("path", "qid", "count")

    def __init__(self, path, qid, count):
        self.path = path
        self.qid = qid
        self.count = count

    def __len__(self):
        return self.count

    def __iter__(self):
        return _streamQueue(self.path, self.qid)

    def __repr__(self):
        return f"<_QueueStream qid={self.qid} entries={self.count}>"


def _streamQueue(path, qid):
    """
    The generator behind :class:`_QueueStream`; an SQLite error while
    reading (a file damaged after the open's checks) is raised as
    :class:`StoreCorruptError`, which stops the broker's start as a
    failed ``open()`` does.
    """
    try:
        yield from _readQueue(path, qid)
    except sqlite3.DatabaseError as e:
        raise StoreCorruptError(
            path, f"SQLite reports while reading the messages of queue id {qid}: {e}"
        ) from e


def _readQueue(path, qid):
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA query_only = 1").fetchall()
        conn.execute("PRAGMA busy_timeout = 10000").fetchall()
        conn.execute("BEGIN")  # one snapshot for both statements
        disordered = conn.execute(_DISORDERED, (qid,)).fetchone() is not None
        names = {}
        Recovered = RecoveredMessage
        for storeId, seq, enq, exp, redelivered, exchange, routingKey, props, body in conn.execute(
            _LOAD_BY_SEQ if disordered else _LOAD_MESSAGES, (qid,)
        ):
            ex = names.get(exchange)
            if ex is None:
                ex = _s(exchange)
                if len(names) < _NAME_CACHE:
                    names[exchange] = ex
            rk = names.get(routingKey)
            if rk is None:
                rk = _s(routingKey)
                if len(names) < _NAME_CACHE:
                    names[routingKey] = rk
            yield Recovered(storeId, seq, enq, exp, redelivered == 1, ex, rk, props, body)
    finally:
        conn.close()


_DELETE_ENTRIES = (
    "DELETE FROM queue_messages WHERE (qid, msg_id) IN (SELECT column1, column2 FROM (VALUES "
)
_INSERT_ENTRIES = (
    "INSERT OR REPLACE INTO queue_messages "
    "(qid, msg_id, seq, enqueued_at, expires_at, redelivered) VALUES "
)
_MARK_ENTRIES = (
    "UPDATE queue_messages SET redelivered = 1 WHERE (qid, msg_id) IN "
    "(SELECT column1, column2 FROM (VALUES "
)
_DELETE_ORPHANS = "DELETE FROM messages WHERE msg_id IN (VALUES "
_DELETE_ORPHANS_TAIL = (
    ") AND NOT EXISTS (SELECT 1 FROM queue_messages WHERE queue_messages.msg_id = messages.msg_id)"
)
_COLLECT = (
    "DELETE FROM queue_messages WHERE qid = ? AND msg_id IN "
    "(SELECT msg_id FROM queue_messages WHERE qid = ? LIMIT ?) RETURNING msg_id"
)
_LOAD_COLUMNS = (
    "SELECT q.msg_id, q.seq, q.enqueued_at, q.expires_at, q.redelivered, "
    "m.exchange, m.routing_key, m.props, m.body "
    "FROM queue_messages AS q JOIN messages AS m ON m.msg_id = q.msg_id "
    "WHERE q.qid = ? "
)
#: one queue's entries along the primary key (when msg_id order is seq order)
_LOAD_MESSAGES = _LOAD_COLUMNS + "ORDER BY q.msg_id"
#: one queue's entries sorted by seq (when it is not)
_LOAD_BY_SEQ = _LOAD_COLUMNS + "ORDER BY q.seq, q.msg_id"
#: a row if some entry of the queue has a lower seq than the one before it
#: in msg_id order (an index-only scan, no body read)
_DISORDERED = (
    "SELECT 1 FROM (SELECT seq < lag(seq) OVER (ORDER BY msg_id) AS back "
    "FROM queue_messages WHERE qid = ?) WHERE back LIMIT 1"
)
_COUNT_ENTRIES = "SELECT count(*) FROM queue_messages WHERE qid = ?"
_COUNT_LIVE_MESSAGES = (
    "SELECT count(*), total(length(m.body)) FROM messages AS m WHERE EXISTS "
    "(SELECT 1 FROM queue_messages AS q WHERE q.msg_id = m.msg_id "
    "AND q.qid IN (SELECT qid FROM queues))"
)

#: the statements the writer runs per batch and per clean-up chunk (the hot
#: ones: publish, ack, dequeue, redelivered mark, purge, clean-up) and the
#: recovery's per-queue read and count, as
#: ``{name: (sql, parameter count)}``; ``test_store`` asserts that SQLite
#: plans each as an index search, never a scan of a whole table
HOT_STATEMENTS = {
    "dequeue": (_DELETE_ENTRIES + "(?, ?), (?, ?)))", 4),
    "enqueue": (_INSERT_ENTRIES + "(?, ?, ?, ?, ?, ?)", 6),
    "markRedelivered": (_MARK_ENTRIES + "(?, ?), (?, ?)))", 4),
    "deleteOrphans": (_DELETE_ORPHANS + "(?), (?)" + _DELETE_ORPHANS_TAIL, 2),
    "addMessage": (
        "INSERT OR REPLACE INTO messages (msg_id, exchange, routing_key, props, body) "
        "VALUES (?, ?, ?, ?, ?)", 5),
    "purgeKeep": (
        "UPDATE queue_messages SET qid = ? WHERE qid = ? AND msg_id IN (VALUES (?), (?))", 4),
    "purgeQueue": ("DELETE FROM queues WHERE key = ?", 1),
    "collect": (_COLLECT, 3),
    "load": (_LOAD_MESSAGES, 1),
    "countEntries": (_COUNT_ENTRIES, 1),
}
