"""
:class:`SQLiteStore`: the embedded durable :class:`~otter_tx.store.interface.IMessageStore`,
its writer thread, the retry of failed writes and the store's health.

Engine: the standard library's ``sqlite3`` on one file, WAL journal,
``synchronous=FULL`` (every commit fsyncs the WAL).  Why SQLite and not a
segment log, the file layout and the guarantees are in ``docs/storage.md``.
The parts: :mod:`~otter_tx.store.sqlite.batch` (the pending batch, plain
code), :mod:`~otter_tx.store.sqlite.schema` (the file: schema, creation,
migration, recovery, the streaming reader of recovered messages),
:mod:`~otter_tx.store.sqlite.tables` (the transactions that apply batches,
and the background clean-up), and this module.

Threads.  The reactor thread only records changes: each mutating call
updates an in-memory *pending batch* (:class:`~otter_tx.store.sqlite.batch.Batch`,
which coalesces them) under a lock and returns.  One ``threading.Thread``
(the writer; not the reactor's threadpool) owns the SQLite connection and
does all file I/O: it opens and recovers the store (the recovered messages
are read later, a row at a time, by read-only connections of whoever
iterates them: :class:`~otter_tx.store.sqlite.schema.QueueStream`), then
loops taking the whole pending batch, applying it in ONE transaction and
committing (one fsync), and fires the ``sync()`` Deferreds that were issued
before it took the batch, through ``reactor.callFromThread``.  While it
writes, new changes gather in the next batch: that is the group commit,
and the batch grows with the load.  When nothing is pending it cleans up
purged queues and returns free pages (:mod:`~otter_tx.store.sqlite.tables`).

Everything the broker writes is on the reactor thread; everything the
writer does is on its own thread; they share only the pending batch (under
``_lock``) and a few flags.

Write failures.  A batch that cannot be committed (disk full, I/O error)
is rolled back; the ``sync()`` Deferreds waiting for it fail with
:class:`StoreFailedError` (the broker answers basic.nack), :attr:`healthy`
turns False and the observers are told.  The failed batch's changes are
kept and written again, ahead of everything issued since, after a back-off
(:data:`RETRY_DELAYS`); the first commit that succeeds makes the store
healthy again.  Nothing a successful ``sync()`` reported is lost, and a
change is never applied out of order.
"""

import json
import sqlite3
import threading
import time

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from otter_tx.store.interface import (
    ENTITY_KINDS,
    IMessageStore,
    StoreClosedError,
    StoreCorruptError,
    StoreFailedError,
)
from otter_tx.store.sqlite import schema
from otter_tx.store.sqlite.batch import Batch
from otter_tx.store.sqlite.schema import resolvePath
from otter_tx.store.sqlite.tables import Tables

log = Logger()

#: seconds to wait before writing again after a failed commit; the last
#: value repeats
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)


@implementer(IMessageStore)
class SQLiteStore:
    """
    The durable store on one SQLite file.

    :param pathOrDataDir: the data directory (the file is
        ``<dir>/otter_tx.sqlite3``) or a file path ending in ``.sqlite3`` /
        ``.sqlite`` / ``.db`` (see :func:`~otter_tx.store.sqlite.schema.resolvePath`).
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
        self._pending = Batch(self._coalesce)
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
        # ahead of the next one (the tables are writer-thread only too)
        self._retry = []
        # the batch the writer took and has not finished writing (under _lock)
        self._writing = None
        self._failures = 0
        # Deferreds of _whenIdle() (under _lock)
        self._idleWaiters = []
        # tests only: make the writer drop everything and exit at once
        self._abandoned = False
        self.stats = {"commits": 0, "changes": 0, "cancelled": 0, "syncs": 0,
                      "failedCommits": 0, "gcEntries": 0, "vacuumedPages": 0}
        self._tables = Tables(self.stats)

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

    def addMessage(self, storeId, exchange, routingKey, propsRaw, body, again=False):
        """
        Store a message (see :meth:`IMessageStore.addMessage`); ``again``:
        it was given before (written again only if not pending).
        """
        self._checkOpen()
        if type(propsRaw) is not bytes:
            propsRaw = bytes(propsRaw)
        if type(body) is not bytes:
            body = bytes(body)
        with self._lock:
            batch = self._pending
            batch.addMessage(storeId, exchange, routingKey, propsRaw, body, again)
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

    def enqueueMessage(self, queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered,
                       exchange, routingKey, propsRaw, body, again=False):
        """
        :meth:`addMessage` then :meth:`enqueue` in one call (and in the same
        batch): what the broker does for each persistent message entering a
        durable queue, with one lock round trip instead of two.
        """
        if self._state != "open":
            self._checkOpen()
        if type(propsRaw) is not bytes:
            propsRaw = bytes(propsRaw)
        if type(body) is not bytes:
            body = bytes(body)
        with self._lock:
            batch = self._pending
            batch.addMessage(storeId, exchange, routingKey, propsRaw, body, again)
            batch.enqueue(queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered)
            stats = self.stats
            stats["changes"] += 2
            batch.size += 2
            if batch.size == 2 and not batch.waiters:
                self._wake.notify()

    def dequeue(self, queueKey, storeId):
        """
        Remove a message from a queue; the message row goes when no queue
        refers to it.  Cancels a pending enqueue of the same entry.
        """
        if self._state != "open":
            self._checkOpen()
        with self._lock:
            batch = self._pending
            cancelled = batch.dequeue(queueKey, storeId)
            # _changed, inline (an ack of every persistent message comes here)
            stats = self.stats
            if cancelled:
                stats["cancelled"] += cancelled
            stats["changes"] += 1
            batch.size += 1
            if batch.size == 1 and not batch.waiters:
                self._wake.notify()

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
        sums each batch's running ``Batch.addedBytes`` (a failed batch is
        both in ``_retry`` and ``_writing`` until the writer lets go of it).
        """
        with self._lock:
            total = self._pending.addedBytes
            retry = self._retry
            for batch in retry:
                total += batch.addedBytes
            writing = self._writing
            if writing is not None and writing not in retry:
                total += writing.addedBytes
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

    def _fireAll(self, waiters, result):
        """Fire ``waiters`` in order with ``result`` (reactor thread)."""
        for d in waiters:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(result)

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
                    raise StoreCorruptError(self.path, f"SQLite reports: {e}") from e
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

    def _writeLoop(self, conn):
        """
        Take the pending batch, write it (with the failed batches before
        it and one clean-up chunk), fire its waiters; when there is nothing
        pending, do background clean-up; when a write failed, wait a
        back-off first.  Ends after the close's last write.
        """
        tables = self._tables
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
                    if self._pending.size or self._pending.waiters or tables.hasBackgroundWork():
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
                self._pending = Batch(self._coalesce)
                self._writing = batch
                closing = self._state == "closing"
            batches = self._retry + [batch] if batch.size else list(self._retry)
            failure = None
            waiters = batch.waiters
            if not batches and not closing and not tables.dead and tables.vacuumDue:
                # idle: return free pages, one small step per loop turn
                # (the waiters of an empty batch have nothing to wait for: a
                # failed vacuum step is not theirs to fail)
                try:
                    tables.vacuum(conn)
                except Exception as e:
                    self._writeFailed(conn, e, [])
                    retryAt = time.monotonic() + self._retryDelay()
                else:
                    self._wroteAgain()
            elif batches or (tables.hasBackgroundWork() and not closing):
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
                    tables.markClean(conn)
                except Exception as e:
                    failure = self._writeFailed(conn, e, [])
            with self._lock:
                self._writing = None
            if waiters:
                # one hand-over to the reactor thread for all of them
                self._reactor.callFromThread(self._fireAll, waiters, failure)
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
            self._tables.loadQids(conn)
        except Exception:
            pass
        for batch in batches:
            batch.waiters = []
        self._retry = batches
        self._reportHealth(False, "store write failed: " + reason.splitlines()[0])
        return Failure(failed)


    # --- the writer's steps (writer thread; tests wrap them) ---------------------

    def _connect(self):
        """Open the file, creating it (atomically) when it does not exist."""
        return schema.connect(self.path)

    def _recover(self, conn):
        """
        Check the file, migrate an older schema, repair what an unclean
        stop leaves, and count everything: the ``RecoveredState``.
        """
        return schema.recover(conn, self.path, self._integrityCheck, self._tables)

    def _write(self, conn, batches, finish=False):
        """Apply ``batches`` and one clean-up chunk in one transaction (:meth:`Tables.write`)."""
        self._tables.write(conn, batches, finish)
