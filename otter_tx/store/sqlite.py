"""
:class:`SQLiteStore`: the embedded durable :class:`~otter_tx.store.interface.IMessageStore`.

Engine: the standard library's ``sqlite3`` on one file, WAL journal,
``synchronous=FULL`` (every commit fsyncs the WAL).  Why SQLite and not a
segment log, the file layout and the guarantees are in ``docs/storage.md``.

Threads.  The reactor thread only records changes: each mutating call
updates an in-memory *pending batch* under a lock and returns.  One
``threading.Thread`` (the writer; not the reactor's threadpool) owns the
SQLite connection and does all file I/O: it opens and recovers the store,
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
"""

import json
import os
import sqlite3
import threading

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

#: schema version written by this code; files with a higher one are refused
SCHEMA_VERSION = 1

_FILE_SUFFIXES = (".sqlite3", ".sqlite", ".db")

_SCHEMA = """
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE entities (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
CREATE TABLE messages (
    msg_id INTEGER PRIMARY KEY,
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    props BLOB NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE queue_messages (
    queue TEXT NOT NULL,
    msg_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    enqueued_at REAL NOT NULL,
    expires_at REAL,
    redelivered INTEGER NOT NULL,
    PRIMARY KEY (queue, msg_id)
) WITHOUT ROWID;
CREATE INDEX queue_messages_by_msg ON queue_messages (msg_id);
"""

# --- pending batch entry kinds -------------------------------------------
_ENQ = 1  # value: (seq, enqueuedAtMs, expiresAtMs, redelivered, replaces)
_DEQ = 2
_MARK = 3


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


class _Batch:
    """
    The net effect of the changes issued since the writer last took a
    batch, plus the ``sync()`` Deferreds waiting for it.
    """

    __slots__ = ("entities", "purges", "adds", "entries", "waiters", "size")

    def __init__(self):
        # {(kind, key): json str, or None to delete}
        self.entities = {}
        # queue keys whose every entry is removed before `entries` apply
        self.purges = set()
        # {msgId: [exchange, routingKey, props, body, liveEnqueues,
        #          anEnqueueWasCancelled]}
        self.adds = {}
        # {queueKey: {msgId: (_ENQ, seq, enq, exp, redelivered, replaces)
        #                    | (_DEQ,) | (_MARK,)}}
        self.entries = {}
        self.waiters = []
        # number of changes recorded (for "is there anything to write")
        self.size = 0


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

    :ivar stats: ``{str: int}`` counters for the bench and management:
        ``commits`` (transactions = fsyncs of the WAL), ``changes`` (calls
        recorded), ``cancelled`` (changes that cancelled out before being
        written), ``syncs``.
    """

    def __init__(self, pathOrDataDir, reactor, integrityCheck=True, coalesce=True):
        self.path = resolvePath(pathOrDataDir)
        self._reactor = reactor
        self._integrityCheck = integrityCheck
        self._coalesce = coalesce
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending = _Batch()
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
        # set by the writer thread (under _lock) when a commit failed
        self._failure = None
        # tests only: make the writer drop everything and exit at once
        self._abandoned = False
        self.stats = {"commits": 0, "changes": 0, "cancelled": 0, "syncs": 0}

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

    def _changed(self, batch):
        """
        Count a change; wake the writer if the batch was empty.  Call with
        ``_lock`` held.
        """
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
            batch.entities[(kind, key)] = raw
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
            batch.entities[(kind, key)] = None
            if kind == "queue":
                self._purgeLocked(batch, key)
            self._changed(batch)

    def addMessage(self, msgId, exchange, routingKey, propsRaw, body):
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
            batch.adds[msgId] = [exchange, routingKey, propsRaw, body, 0, False]
            self._changed(batch)

    def enqueue(self, queueKey, msgId, seq, enqueuedAtMs, expiresAtMs, redelivered):
        """
        Put a stored message in a queue.  The message must have been given
        to :meth:`addMessage`; that is not checked here (it would need a
        read), and an entry without its message is dropped at recovery.
        """
        self._checkOpen()
        with self._lock:
            batch = self._pending
            entries = batch.entries.get(queueKey)
            if entries is None:
                entries = batch.entries[queueKey] = {}
            previous = entries.get(msgId)
            # `replaces`: the entry may already be on disk, so cancelling this
            # enqueue must still delete it.  It cannot be when the message is
            # new in this batch or the queue was purged in it (a purge forgets
            # the pending entries, so `previous` is then from after it).
            if previous is None:
                replaces = msgId not in batch.adds and queueKey not in batch.purges
            else:
                replaces = previous[0] != _ENQ or previous[5]
            entries[msgId] = (
                _ENQ,
                seq,
                enqueuedAtMs,
                expiresAtMs,
                bool(redelivered),
                replaces,
            )
            if previous is None or previous[0] != _ENQ:
                add = batch.adds.get(msgId)
                if add is not None:
                    add[4] += 1
            self._changed(batch)

    def dequeue(self, queueKey, msgId):
        """
        Remove a message from a queue; the message row goes when no queue
        refers to it.  Cancels a pending enqueue of the same entry.
        """
        self._checkOpen()
        with self._lock:
            batch = self._pending
            entries = batch.entries.get(queueKey)
            if entries is None:
                entries = batch.entries[queueKey] = {}
            previous = entries.get(msgId)
            if self._coalesce and previous is not None and previous[0] == _ENQ:
                self.stats["cancelled"] += 2
                if previous[5]:
                    entries[msgId] = (_DEQ,)
                else:
                    del entries[msgId]
                self._cancelEnqueueLocked(batch, msgId)
            else:
                if previous is not None and previous[0] == _ENQ:
                    self._cancelEnqueueLocked(batch, msgId, dropAdd=False)
                entries[msgId] = (_DEQ,)
            self._changed(batch)

    def markRedelivered(self, queueKey, msgId):
        """
        Set the redelivered flag of one entry (merged into a pending
        enqueue of it).
        """
        self._checkOpen()
        with self._lock:
            batch = self._pending
            entries = batch.entries.get(queueKey)
            if entries is None:
                entries = batch.entries[queueKey] = {}
            previous = entries.get(msgId)
            if previous is None:
                entries[msgId] = (_MARK,)
            elif previous[0] == _ENQ:
                entries[msgId] = previous[:4] + (True,) + previous[5:]
            # after a pending dequeue: nothing to mark
            self._changed(batch)

    def purgeQueue(self, queueKey):
        """
        Remove every entry of a queue (see :meth:`IMessageStore.purgeQueue`).
        """
        self._checkOpen()
        with self._lock:
            batch = self._pending
            self._purgeLocked(batch, queueKey)
            self._changed(batch)

    def _purgeLocked(self, batch, queueKey):
        entries = batch.entries.pop(queueKey, None)
        if entries:
            for msgId, entry in entries.items():
                if entry[0] == _ENQ:
                    self.stats["cancelled"] += 1
                    self._cancelEnqueueLocked(batch, msgId)
        batch.purges.add(queueKey)

    def _cancelEnqueueLocked(self, batch, msgId, dropAdd=True):
        """
        A pending enqueue of ``msgId`` went away; forget the pending
        message too when that was its last pending enqueue.
        """
        add = batch.adds.get(msgId)
        if add is None:
            return
        add[4] -= 1
        add[5] = True
        if add[4] <= 0 and dropAdd and self._coalesce:
            del batch.adds[msgId]
            self.stats["cancelled"] += 1

    def sync(self):
        """
        :return: ``Deferred[None]`` fired on the reactor thread once every
            change issued before this call is committed and fsync'd.
        """
        self._checkOpen()
        d = Deferred()
        with self._lock:
            if self._failure is not None:
                return fail(self._failure)
            batch = self._pending
            batch.waiters.append(d)
            self.stats["syncs"] += 1
            if batch.size == 0 and len(batch.waiters) == 1:
                self._wake.notify()
        return d

    # --- tests only -----------------------------------------------------------

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
                with self._lock:
                    self._failure = failure
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

    def _writeLoop(self, conn):
        while True:
            with self._lock:
                while (
                    self._pending.size == 0
                    and not self._pending.waiters
                    and self._state != "closing"
                    and not self._abandoned
                ):
                    self._wake.wait()
                if self._abandoned:
                    conn.close()
                    return
                batch = self._pending
                self._pending = _Batch()
                closing = self._state == "closing"
                failure = self._failure
            if batch.size and failure is None:
                try:
                    self._write(conn, batch)
                except Exception as e:
                    log.failure("store write failed; the store stops writing")
                    error = StoreFailedError(self.path, f"{type(e).__name__}: {e}")
                    error.__cause__ = e
                    failure = Failure(error)
                    with self._lock:
                        self._failure = failure
                    try:
                        conn.rollback()
                    except Exception:
                        pass
            for d in batch.waiters:
                self._fire(d, failure if failure is not None else None)
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

    def _write(self, conn, batch):
        """
        Apply one batch in one transaction and commit it (one fsync).
        """
        orphanCandidates = set()
        ex = conn.execute
        exm = conn.executemany
        ex("BEGIN IMMEDIATE")
        try:
            upserts = []
            deletes = []
            for (kind, key), raw in batch.entities.items():
                if raw is None:
                    deletes.append((kind, key))
                else:
                    upserts.append((kind, key, raw))
            if upserts:
                exm(
                    "INSERT OR REPLACE INTO entities (kind, key, record) VALUES (?, ?, ?)",
                    upserts,
                )
            if deletes:
                exm("DELETE FROM entities WHERE kind = ? AND key = ?", deletes)
            for queueKey in batch.purges:
                orphanCandidates.update(
                    row[0]
                    for row in ex("SELECT msg_id FROM queue_messages WHERE queue = ?", (queueKey,))
                )
                ex("DELETE FROM queue_messages WHERE queue = ?", (queueKey,))
            if batch.adds:
                rows = _rows(
                    "INSERT OR REPLACE INTO messages "
                    "(msg_id, exchange, routing_key, props, body) VALUES ",
                    5,
                    "",
                    [(msgId, a[0], a[1], a[2], a[3]) for msgId, a in batch.adds.items()],
                )
                for sql, params in rows:
                    ex(sql, params)
                # with coalescing off, a message whose pending enqueues were
                # all dequeued again is written and must go at commit.  (A
                # message with no enqueue yet is kept: its enqueue may be in
                # the next batch; a stop in between leaves an orphan that
                # recovery removes.)
                orphanCandidates.update(
                    m for m, a in batch.adds.items() if a[4] <= 0 and a[5]
                )
            inserts = []
            removals = []
            marks = []
            for queueKey, entries in batch.entries.items():
                for msgId, entry in entries.items():
                    op = entry[0]
                    if op == _ENQ:
                        inserts.append(
                            (queueKey, msgId, entry[1], entry[2], entry[3], int(entry[4]))
                        )
                    elif op == _DEQ:
                        removals.append((queueKey, msgId))
                    else:
                        marks.append((queueKey, msgId))
            if removals:
                for sql, params in _rows(
                    "DELETE FROM queue_messages WHERE (queue, msg_id) IN (VALUES ",
                    2,
                    ")",
                    removals,
                ):
                    ex(sql, params)
                orphanCandidates.update(r[1] for r in removals)
            if inserts:
                for sql, params in _rows(
                    "INSERT OR REPLACE INTO queue_messages "
                    "(queue, msg_id, seq, enqueued_at, expires_at, redelivered) VALUES ",
                    6,
                    "",
                    inserts,
                ):
                    ex(sql, params)
            if marks:
                exm(
                    "UPDATE queue_messages SET redelivered = 1 WHERE queue = ? AND msg_id = ?",
                    marks,
                )
            if orphanCandidates:
                for sql, params in _rows(
                    "DELETE FROM messages WHERE msg_id IN (VALUES ",
                    1,
                    ") AND NOT EXISTS (SELECT 1 FROM queue_messages "
                    "WHERE queue_messages.msg_id = messages.msg_id)",
                    [(m,) for m in orphanCandidates],
                ):
                    ex(sql, params)
            ex("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        self.stats["commits"] += 1

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
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            conn.execute("PRAGMA synchronous = FULL").fetchall()
            conn.executescript(
                "BEGIN;"
                + _SCHEMA
                + f"INSERT INTO meta VALUES ('format', '{FORMAT}');"
                + f"INSERT INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');"
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
        Check the file, repair what an unclean stop leaves (in one
        transaction), and load everything.
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
        return self._load(conn)

    def _load(self, conn):
        stats = {}
        conn.execute("BEGIN IMMEDIATE")
        try:
            cursor = conn.execute(
                "DELETE FROM queue_messages WHERE queue NOT IN "
                "(SELECT key FROM entities WHERE kind = 'queue') "
                "OR msg_id NOT IN (SELECT msg_id FROM messages)"
            )
            stats["droppedDanglingEntries"] = max(cursor.rowcount, 0)
            cursor = conn.execute(
                "DELETE FROM messages WHERE msg_id NOT IN (SELECT msg_id FROM queue_messages)"
            )
            stats["droppedOrphanMessages"] = max(cursor.rowcount, 0)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

        # one read transaction, so the three tables are read from one
        # snapshot even if another writer commits meanwhile (a queue entry
        # never names a message the earlier read of `messages` missed)
        conn.execute("BEGIN")
        try:
            recovered = self._loadSnapshot(conn, stats)
        except BaseException:
            try:
                conn.rollback()
            except sqlite3.Error:
                pass
            raise
        conn.execute("COMMIT")
        return recovered

    def _loadSnapshot(self, conn, stats):
        entities = {kind: {} for kind in ENTITY_KINDS}
        for kind, key, raw in conn.execute("SELECT kind, key, record FROM entities"):
            byKind = entities.get(kind)
            if byKind is None:
                raise self._corrupt(f"it holds an entity of unknown kind {kind!r}")
            try:
                byKind[key] = json.loads(raw)
            except ValueError as e:
                raise self._corrupt(f"entity {kind}/{key!r} is not valid JSON ({e})") from e
        for kind in ENTITY_KINDS:
            stats[kind] = len(entities[kind])

        bodies = {}
        bodyBytes = 0
        for msgId, exchange, routingKey, props, body in conn.execute(
            "SELECT msg_id, exchange, routing_key, props, body FROM messages"
        ):
            bodies[msgId] = (exchange, routingKey, props, body)
            bodyBytes += len(body)
        messages = {}
        queued = 0
        for queueKey, msgId, seq, enq, exp, redelivered in conn.execute(
            "SELECT queue, msg_id, seq, enqueued_at, expires_at, redelivered "
            "FROM queue_messages"
        ):
            exchange, routingKey, props, body = bodies[msgId]
            recovered = messages.get(queueKey)
            if recovered is None:
                recovered = messages[queueKey] = []
            recovered.append(
                RecoveredMessage(
                    msgId,
                    seq,
                    enq,
                    exp,
                    bool(redelivered),
                    exchange,
                    routingKey,
                    props,
                    body,
                )
            )
            queued += 1
        for recovered in messages.values():
            recovered.sort(key=lambda m: m.seq)
        stats["messages"] = len(bodies)
        stats["queuedMessages"] = queued
        stats["bodyBytes"] = bodyBytes
        return RecoveredState(entities, messages, stats, self.path)
