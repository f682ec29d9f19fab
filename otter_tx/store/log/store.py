"""
:class:`LogStore`: the durable :class:`~otter_tx.store.interface.IMessageStore`
with persistent messages in a message log and entities in SQLite.

Layout of a data directory::

    otter_tx.sqlite3         entities (vhosts, users, permissions, policies,
                             exchanges, queues, bindings) and the queue id map
    messages/q<qid>/*.seg    each durable queue's message log (segments.py)

It is :class:`~otter_tx.store.sqlite.writer.SQLiteStore` with another
writer-side table object (:class:`LogTables`): the reactor side (the
pending batch and its coalescing, ``sync()``, health, retry, close) is the
same code.  What a group commit does:

1. every queue log that changed gets one chunk appended to its active
   segment, fsync'd (``fdatasync``; the directory too when a segment was
   created);
2. if entities or the queue id map changed (or on close), one SQLite
   transaction, committed with ``synchronous = FULL``;
3. only then the batch's ``sync()`` Deferreds fire; segments nothing
   needs any more are deleted, and purged or deleted queues' directories
   are removed in the background.

A purge without kept messages and a queue delete move the queue key to a
fresh qid (step 2), as the SQLite store did, so they cost O(1) whatever
the queue's length; a ``queue.purge`` that keeps unacknowledged messages
appends one PURGE record.  If a step fails the logs are cut back to what
they held before it and the batch is retried (``SQLiteStore``'s retry).

Atomicity: a batch's records in one queue log are one chunk, all there or
none after a crash.  Across queues and between the logs and SQLite a
crash can leave part of a batch whose ``sync()`` had not fired: for
example the enqueues of a batch without its binding.  Entries of a queue
whose entity did not make it are dropped at recovery (their qid is not in
the map), as before.

Files of schema 2 (messages in SQLite) are migrated when opened: each
queue's entries are written to its log in seq order and fsync'd, then one
transaction empties the message tables and sets ``schema_version = 3``; a
crash before that transaction just migrates again.  An older otter_tx
refuses a schema-3 file with a one-line message (upgrade otter_tx).
"""

import os
import shutil

from twisted.logger import Logger

from otter_tx.store.interface import RecoveredMessage, RecoveredState, StoreCorruptError
from otter_tx.store.log.segments import (
    syncWritten,
    SEGMENT_BYTES,
    LogCorruptError,
    QueueLog,
    _fsyncDirectory,
    encodedEnq,
)
from otter_tx.store.sqlite import schema
from otter_tx.store.sqlite.batch import DEQ, ENQ
from otter_tx.store.sqlite.schema import blob, cachedName, unblob
from otter_tx.store.sqlite.writer import RETRY_DELAYS, SQLiteStore

log = Logger()

#: the schema version of a store whose messages are in the log
LOG_SCHEMA_VERSION = 3

#: the directory beside the SQLite file that holds the queue logs
MESSAGES_DIRNAME = "messages"

#: ENQ records of messages with bodies up to this many bytes are encoded on
#: the reactor thread (enqueueMessage); bigger ones by the writer
PRE_ENCODE_MAX = 256


class LogDamagedError(StoreCorruptError):
    """
    A queue log segment is damaged (somewhere a torn write cannot reach):
    raised as the failure of ``open()``; the broker does not start.
    ``str(error)`` names the file and says what to do.
    """

    def __init__(self, path, reason):
        self.path = path
        self.reason = reason
        Exception.__init__(
            self,
            f"otter_tx message log segment {path!r} is damaged: {reason}. The broker did not start "
            "and did not change it. To recover: stop the broker, move the segment file aside (keep "
            "it for inspection) and start again: the messages it held that are not acked are lost, "
            "the rest of the store is used as it is; or restore the data directory from a backup.")


def messagesDirectory(path):
    """The queue logs' directory for the store file ``path`` (str)."""
    directory, name = os.path.split(path)
    if name == schema.STORE_FILENAME:
        return os.path.join(directory, MESSAGES_DIRNAME)
    return path + "." + MESSAGES_DIRNAME


class LogStore(SQLiteStore):
    """
    The durable store: queue logs for messages, SQLite for entities.

    :param pathOrDataDir: the data directory (or an SQLite file path, as
        for :class:`SQLiteStore`; the logs then go in ``<file>.messages/``).
    :param reactor: provides ``callFromThread``.
    :param integrityCheck: run SQLite's ``quick_check`` on the entity file
        when opening (the logs are checked chunk by chunk by their CRCs).
    :param coalesce: cancel enqueue/dequeue pairs inside a pending batch.
    :param retryDelays: as for :class:`SQLiteStore`.
    :param segmentBytes: start a new segment when the active one holds
        this many bytes (int; 4 MiB).
    """

    def __init__(self, pathOrDataDir, reactor, integrityCheck=True, coalesce=True,
                 retryDelays=RETRY_DELAYS, segmentBytes=SEGMENT_BYTES):
        super().__init__(pathOrDataDir, reactor, integrityCheck, coalesce, retryDelays)
        self.messagesPath = messagesDirectory(self.path)
        self.stats.update({"segmentsDeleted": 0, "migratedEntries": 0, "droppedEnqueues": 0})
        self._tables = LogTables(self.stats, self.messagesPath, segmentBytes)
        # reactor thread: names' stored bytes
        self._names = {}

    def close(self):
        """Write what is pending and close (see :meth:`SQLiteStore.close`); logs the store's counters."""
        if self._state == "open":
            log.info("store {path}: {stats}", path=self.path, stats=dict(self.stats))
        return super().close()

    def enqueueMessage(self, queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered,
                       exchange, routingKey, propsRaw, body, again=False):
        """
        :meth:`addMessage` then :meth:`enqueue` in one call, with the ENQ
        record encoded here on the reactor thread, so the writer thread
        (which holds up every confirm while it works) only appends it.
        """
        if self._state != "open":
            self._checkOpen()
        if type(propsRaw) is not bytes:
            propsRaw = bytes(propsRaw)
        if type(body) is not bytes:
            body = bytes(body)
        if len(body) <= PRE_ENCODE_MAX:
            names = self._names
            record = encodedEnq(storeId, seq, enqueuedAtMs, expiresAtMs, redelivered,
                                cachedName(names, blob, exchange), cachedName(names, blob, routingKey),
                                propsRaw, body)
        else:
            # a big body is copied once, by the writer, and only if its
            # enqueue is not cancelled by an ack in the same batch
            record = None
        with self._lock:
            batch = self._pending
            batch.addMessage(storeId, exchange, routingKey, propsRaw, body, again)
            batch.enqueue(queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered, record)
            self.stats["changes"] += 2
            batch.size += 2
            if batch.size == 2 and not batch.waiters:
                self._wake.notify()

    def _recover(self, conn):
        return recover(conn, self.path, self._integrityCheck, self._tables)

    def queueLog(self, queueKey):
        """
        The :class:`~otter_tx.store.log.segments.QueueLog` of durable queue
        ``queueKey`` (str), or None when nothing of it is on disk.  Its
        :meth:`~otter_tx.store.log.segments.QueueLog.read` and
        :meth:`~otter_tx.store.log.segments.QueueLog.offsetAt` may be used
        from the reactor thread: they read committed records only.
        """
        qid = self._tables.qids.get(queueKey)
        return None if qid is None else self._tables.logs.get(qid)


class LogTables:
    """
    The writer thread's side of a :class:`LogStore` (the same interface
    as :class:`otter_tx.store.sqlite.tables.Tables`; only the writer
    thread uses it).

    :ivar qids: ``{queueKey: qid}`` of the queues with a log.
    :ivar logs: ``{qid: QueueLog}``.
    :ivar dead: qids whose directories are left to remove (list of int).
    """

    def __init__(self, stats, directory, segmentBytes=SEGMENT_BYTES):
        self.stats = stats
        self.directory = directory
        self.segmentBytes = segmentBytes
        self.qids = {}
        self.logs = {}
        self.dead = []
        self.vacuumDue = False
        self._nextQid = 1
        self._names = {}
        # the adds of the last batch written: the broker's addMessage and
        # its enqueue are two calls, and the writer can take the pending
        # batch between them, so an enqueue's message can be one batch back
        self._lastAdds = {}

    # --- the Tables interface used by SQLiteStore's writer loop ----------------

    def hasBackgroundWork(self):
        """True while directories of purged or deleted queues are left to remove."""
        return bool(self.dead)

    def markClean(self, conn):
        """Mark the stop clean."""
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'clean_shutdown'")

    def vacuum(self, conn):
        """Nothing to do: the entity file stays small."""
        self.vacuumDue = False

    def loadQids(self, conn):
        """
        Read the queue id map from the file (after a failed write, the map
        as committed) and match the open logs to it.
        """
        self.qids = {unblob(key): qid for key, qid in conn.execute("SELECT key, qid FROM queues")}
        top = conn.execute("SELECT max(qid) FROM queues").fetchone()[0]
        self._nextQid = max(self._nextQid, (top or 0) + 1)
        live = set(self.qids.values())
        for qid in list(self.logs):
            if qid not in live:
                self.logs.pop(qid).close()
        for qid in live:
            if qid not in self.logs:
                self.logs[qid] = self._openLog(qid)

    def _dir(self, qid):
        return os.path.join(self.directory, "q%d" % (qid,))

    def _openLog(self, qid):
        directory = self._dir(qid)
        if not os.path.isdir(directory):
            return QueueLog.create(directory, segmentBytes=self.segmentBytes)
        return QueueLog.open(directory, self.segmentBytes)

    def write(self, conn, batches, finish=False):
        """
        Apply ``batches`` in order: the queue logs' chunks (fsync'd), then
        the entity changes in one SQLite transaction; with ``finish`` (the
        close) mark the stop clean.  Without batches: remove one dead
        queue's directory.  On failure the logs are cut back and the error
        raised (the caller rolls SQLite back, reloads the map with
        :meth:`loadQids` and retries the batches later).
        """
        if not batches and not finish:
            self._collect()
            return
        touched = {}
        entities = {}
        qmap = {}
        died = []
        created = []
        qids = self.qids
        logs = self.logs
        names = self._names
        earlier = [self._lastAdds]
        try:
            for batch in batches:
                for kk, raw in batch.entities.items():
                    entities[kk] = raw
                for key, keep in batch.purges.items():
                    qid = qids.get(key)
                    if qid is None:
                        continue
                    if keep:
                        # touched before it changes: a failure inside (a new
                        # segment on a full disk) must roll it back too
                        qlog = touched[qid] = logs[qid]
                        qlog.purge(keep)
                    else:
                        del qids[key]
                        qmap[key] = None
                        died.append(qid)
                adds = batch.adds
                for key, entries in batch.entries.items():
                    qid = qids.get(key)
                    qlog = None if qid is None else logs[qid]
                    if qlog is not None:
                        touched[qid] = qlog
                    for storeId, entry in entries.items():
                        op = entry[0]
                        if op == ENQ:
                            if qlog is None:
                                qid = self._nextQid
                                self._nextQid += 1
                                qids[key] = qid
                                qmap[key] = qid
                                created.append(qid)
                                qlog = logs[qid] = QueueLog.create(self._dir(qid),
                                                                    segmentBytes=self.segmentBytes)
                                touched[qid] = qlog
                            a = adds.get(storeId)
                            if a is None and entry[6] is None:
                                a = _lookBack(earlier, storeId)
                            if a is None and entry[6] is None:
                                # a bug in the caller: raising would fail
                                # this batch for good (it is retried as it
                                # is), so the entry is left out, loudly
                                self.stats["droppedEnqueues"] += 1
                                log.error("queue log {key!r}: enqueue of message {storeId} without its "
                                          "addMessage just before; not stored (a bug)",
                                          key=key, storeId=storeId)
                                continue
                            if entry[5]:
                                qlog.ack(storeId)
                            _, seq, enq, exp, redelivered, _, record = entry
                            if record is not None:
                                qlog.enqueueRecord(storeId, seq, enq, redelivered, record)
                            else:
                                qlog.enqueue(storeId, seq, enq, exp, redelivered,
                                             cachedName(names, blob, a.exchange),
                                             cachedName(names, blob, a.routingKey), a.propsRaw, a.body)
                        elif qlog is None:
                            continue
                        elif op == DEQ:
                            qlog.ack(storeId)
                        else:
                            qlog.mark(storeId)
                earlier.append(adds)
            pending = [qlog for qlog in touched.values() if qlog.hasPending()]
            synced = {}
            if len(pending) > 1:
                kinds = [qlog.pendingKinds() for qlog in pending]
                moves = any(k[0] for k in kinds) and any(k[1] for k in kinds)
            else:
                moves = False
            if moves:
                # messages may move between queues in this commit (a
                # dead-lettering, a delayed message released): every
                # enqueue is durable before any removal, so a crash in
                # between leaves a copy in both queues, never in neither
                for qlog in pending:
                    qlog.writePhase(1, synced)
                syncWritten(synced)
                synced = {}
                for qlog in pending:
                    qlog.writePhase(2, synced)
            else:
                for qlog in pending:
                    qlog.writePhase(0, synced)
            syncWritten(synced)
            if entities or qmap or finish:
                self._commit(conn, entities, qmap, finish)
        except BaseException:
            for qlog in touched.values():
                if qlog.directory is not None and os.path.isdir(qlog.directory):
                    qlog.rollback()
            for qid in created:
                logs.pop(qid, None)
                shutil.rmtree(self._dir(qid), ignore_errors=True)
            raise
        self.stats["commits"] += 1
        if batches:
            self._lastAdds = batches[-1].adds
        for qid in died:
            qlog = logs.pop(qid, None)
            if qlog is not None:
                qlog.close()
            self.dead.append(qid)
        # the batch is committed: nothing below may fail it (its syncs would
        # fail and the retry would write it again)
        for qlog in touched.values():
            qlog.finish()
            qlog.done()
        deleted = 0
        for qlog in touched.values():
            try:
                deleted += qlog.reclaim()
            except OSError as e:
                # what it could not delete goes at a later commit
                log.warn("queue log {directory}: reclaiming segments failed: {error}",
                         directory=qlog.directory, error=e)
        if deleted:
            self.stats["segmentsDeleted"] += deleted
        if finish:
            for qlog in logs.values():
                qlog.close()

    def _commit(self, conn, entities, qmap, finish):
        ex = conn.execute
        ex("BEGIN IMMEDIATE")
        try:
            upserts = [(kind, blob(key), raw) for (kind, key), raw in entities.items() if raw is not None]
            deletes = [(kind, blob(key)) for (kind, key), raw in entities.items() if raw is None]
            if deletes:
                conn.executemany("DELETE FROM entities WHERE kind = ? AND key = ?", deletes)
            if upserts:
                conn.executemany("INSERT OR REPLACE INTO entities (kind, key, record) VALUES (?, ?, ?)",
                                 upserts)
            for key, qid in qmap.items():
                ex("DELETE FROM queues WHERE key = ?", (blob(key),))
                if qid is not None:
                    ex("INSERT INTO queues (key, qid) VALUES (?, ?)", (blob(key), qid))
            if finish:
                self.markClean(conn)
            ex("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    def _collect(self):
        """Remove the directory of one purged or deleted queue."""
        if self.dead:
            qid = self.dead.pop(0)
            shutil.rmtree(self._dir(qid), ignore_errors=True)
            self.stats["gcEntries"] += 1

    # --- opening ------------------------------------------------------------------

    def migrate(self, conn, path):
        """
        Schema 2 -> 3: write the messages held in SQLite to the queue logs
        (seq order, fsync'd), then empty the message tables and set the
        schema version in one transaction.  Returns the entries migrated.
        """
        migrated = 0
        for key, qid in self.qids.items():
            directory = self._dir(qid)
            shutil.rmtree(directory, ignore_errors=True)
            qlog = QueueLog.create(directory, segmentBytes=self.segmentBytes)
            count = 0
            for r in conn.execute(schema.LOAD_BY_SEQ, (qid,)):
                storeId, seq, enq, exp, redelivered, exchange, routingKey, props, body = r
                qlog.enqueue(storeId, seq, enq, exp, redelivered == 1, exchange, routingKey, props, body)
                count += 1
                if count % 4096 == 0:
                    qlog.flush()
            if qlog.hasPending():
                qlog.flush()
            qlog.done()
            qlog.close()
            migrated += count
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM queue_messages")
            conn.execute("DELETE FROM messages")
            conn.execute("DELETE FROM dead_queues")
            conn.execute(f"UPDATE meta SET value = '{LOG_SCHEMA_VERSION}' WHERE key = 'schema_version'")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        if migrated:
            log.info("store {path}: moved {n} queued messages into the message log",
                     path=path, n=migrated)
            conn.execute("VACUUM")
        self.stats["migratedEntries"] += migrated
        return migrated


def _lookBack(earlier, storeId):
    for adds in reversed(earlier):
        a = adds.get(storeId)
        if a is not None:
            return a
    return None


def recover(conn, path, integrityCheck, tables):
    """
    Check the entity file, migrate older schemas, read every queue log's
    state, repair what an unclean stop leaves, and return the
    ``RecoveredState`` (messages as one lazy :class:`LogQueueStream` per
    queue).

    :raise StoreCorruptError: the entity file or a queue log is unusable.
    """
    version, meta = schema.check(conn, path, integrityCheck, LOG_SCHEMA_VERSION)
    if version < 2:
        schema.migrate(conn, path)
    clean = meta.get("clean_shutdown") == "1"
    stats = {"droppedDanglingEntries": 0, "droppedOrphanMessages": 0}
    entities = schema._loadEntities(conn, path, stats)
    tables.qids = {unblob(key): qid for key, qid in conn.execute("SELECT key, qid FROM queues")}
    top = conn.execute("SELECT max(m) FROM (SELECT max(qid) AS m FROM queues "
                       "UNION ALL SELECT max(qid) FROM dead_queues)").fetchone()[0]
    tables._nextQid = (top or 0) + 1
    if not os.path.isdir(tables.directory):
        os.makedirs(tables.directory)
        _fsyncDirectory(os.path.dirname(os.path.abspath(tables.directory)))
    if version < LOG_SCHEMA_VERSION:
        tables.migrate(conn, path)
    # queues whose entity is gone, and directories no queue owns
    gone = [k for k in tables.qids if k not in entities["queue"]]
    try:
        for key in gone:
            qid = tables.qids.pop(key)
            directory = tables._dir(qid)
            if os.path.isdir(directory):
                stats["droppedDanglingEntries"] += QueueLog.open(directory, truncateTail=False).liveCount()
        live = set(tables.qids.values())
        for name in os.listdir(tables.directory):
            qid = int(name[1:]) if name.startswith("q") and name[1:].isdigit() else None
            if qid not in live:
                shutil.rmtree(os.path.join(tables.directory, name), ignore_errors=True)
        for key, qid in tables.qids.items():
            tables.logs[qid] = tables._openLog(qid)
    except LogCorruptError as e:
        raise LogDamagedError(e.path, e.reason) from e
    conn.execute("BEGIN IMMEDIATE")
    try:
        for key in gone:
            conn.execute("DELETE FROM queues WHERE key = ?", (blob(key),))
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clean_shutdown', '0')")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    messages = {}
    queued = 0
    body = 0
    for key, qid in tables.qids.items():
        qlog = tables.logs[qid]
        count = qlog.liveCount()
        if not count:
            continue
        if not clean:
            # may all have been delivered: they come back redelivered
            # (one record per queue; https://www.rabbitmq.com/docs/reliability#consumer-side)
            qlog.redeliverAll()
            qlog.flush()
            qlog.done()
        messages[key] = LogQueueStream(qlog, count)
        queued += count
        body += qlog.liveBytes()
    for kind in entities:
        stats[kind] = len(entities[kind])
    stats["messages"] = queued
    stats["queuedMessages"] = queued
    stats["bodyBytes"] = body
    return RecoveredState(entities, messages, stats, path)


class LogQueueStream:
    """
    The recovered messages of one queue: an iterable of
    :class:`~otter_tx.store.interface.RecoveredMessage` in seq order,
    reading the queue's segments one at a time.  Iterate it before the
    queue changes.  ``len()`` is the number of messages when the store
    was opened.

    While iterating, :meth:`pagedRanges` hands the rest over as ranges of
    the log instead (what a queue pages without reading them now).
    """

    __slots__ = ("qlog", "count", "_at")

    def __init__(self, qlog, count):
        self.qlog = qlog
        self.count = count
        self._at = None

    def __len__(self):
        return self.count

    def __iter__(self):
        names = {}
        Recovered = RecoveredMessage

        def make(rec):
            storeId, seq, enq, exp, redelivered, exchange, routingKey, props, body = rec
            return Recovered(storeId, seq, enq, exp, redelivered, cachedName(names, unblob, exchange),
                             cachedName(names, unblob, routingKey), props, body)

        qlog = self.qlog
        if qlog.disordered:
            for rec in sorted(qlog.recovered(), key=_seqOf):
                yield make(rec)
            qlog.releaseRecovery()
            return
        # the arrays are kept until the end: pagedRanges needs the rest's
        for i, j, rec in qlog.liveRecords(release=False):
            self._at = (i, j + 1)
            yield make(rec)
        self._at = None
        qlog.releaseRecovery()

    def maxStoreId(self):
        """The highest storeId in the queue's log (int; -1 if none)."""
        return self.qlog._lastId

    def pagedRanges(self, limit=512):
        """
        During iteration: the messages after the last one yielded, as
        :class:`~otter_tx.store.log.segments.LogRange` s of at most
        ``limit`` (list), or None when the order needs a sort.  Stop
        iterating after calling it.
        """
        if self._at is None or self.qlog.disordered:
            return None
        ranges = self.qlog.ranges(self._at, limit)
        self._at = None
        self.qlog.releaseRecovery()
        return ranges

    def __repr__(self):
        return f"<LogQueueStream {self.qlog.directory} messages={self.count}>"


def _seqOf(record):
    return record[1]

