"""
The SQLite store's tables as its writer thread changes them: the queue id
map, the transaction that applies batches, and the background clean-up of
purged queues and of free pages.

Only the writer thread of :class:`~otter_tx.store.sqlite.writer.SQLiteStore`
uses a :class:`Tables` (no lock); the batches it applies come from
:mod:`otter_tx.store.sqlite.batch`, the file and its schema from
:mod:`otter_tx.store.sqlite.schema`.

Within one transaction the net changes of a batch are applied in this
order, which is equivalent to the issue order: entity upserts and deletes;
queue purges (from ``purgeQueue`` and ``deleteEntity('queue')``); message
inserts; queue entry inserts, deletes and redelivered marks; deletion of
messages no queue refers to any more.  A purge is applied before the entry
changes because the pending batch forgets the entry changes of a queue
when it is purged, so every entry change left was issued after the purge.

Purges (schema 2).  A purge or queue delete does not delete rows: it moves
the key to a fresh qid (and, for ``purgeQueue(key, keep)``, moves the few
kept entries with it) in the batch's transaction, and records the old qid
in ``dead_queues``.  That is a handful of index operations whatever the
queue's length, so the purge is durable with its batch and other
publishers' confirms are not held up.  The dead qid's entries and the
messages only they referred to are then deleted :data:`GC_CHUNK` entries
at a time, one chunk per transaction (appended to a regular batch, or
alone when the store is idle), and freed pages are returned to the file
system with ``PRAGMA incremental_vacuum`` (``auto_vacuum = INCREMENTAL``)
in steps of :data:`VACUUM_STEP` pages while no batch is pending.
"""

from otter_tx.store.sqlite.batch import DEQ, ENQ
from otter_tx.store.sqlite.schema import COUNT_ENTRIES, LOAD_MESSAGES, blob, unblob

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


def _real(value):
    """A time in ms as SQLite REAL; a value beyond a double becomes the largest one."""
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return 1.7976931348623157e308


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


class Tables:
    """
    The writer thread's view of the store's tables (no lock: only the
    writer thread uses it).

    :param stats: the store's counter dict (``SQLiteStore.stats``); this
        adds to ``commits``, ``gcEntries`` and ``vacuumedPages``.
    :ivar qids: ``{queueKey: qid}`` of the live queues with a qid.
    :ivar dead: qids of purged or deleted queues whose entries are not all
        cleaned up yet, oldest first (list of int).
    :ivar vacuumDue: ``bool``, there may be free pages to return.
    """

    def __init__(self, stats):
        self.stats = stats
        self.qids = {}
        self.dead = []
        self.vacuumDue = False
        self._nextQid = 1

    def hasBackgroundWork(self):
        """True while dead qids are left to clean up or pages to return."""
        return bool(self.dead) or self.vacuumDue

    def markClean(self, conn):
        """Mark the stop clean (inside the open transaction, or on its own)."""
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'clean_shutdown'")

    def qid(self, conn, key, create):
        """The qid of queue ``key`` (str), allocated when ``create``; else None."""
        qid = self.qids.get(key)
        if qid is None and create:
            qid = self._nextQid
            self._nextQid += 1
            conn.execute("INSERT INTO queues (key, qid) VALUES (?, ?)", (blob(key), qid))
            self.qids[key] = qid
        return qid

    def loadQids(self, conn):
        """Read the queue id map and the dead qids from the file."""
        self.qids = {unblob(key): qid for key, qid in conn.execute("SELECT key, qid FROM queues")}
        self.dead = [r[0] for r in conn.execute("SELECT qid FROM dead_queues ORDER BY qid")]
        top = conn.execute(
            "SELECT max(m) FROM (SELECT max(qid) AS m FROM queues "
            "UNION ALL SELECT max(qid) FROM dead_queues)"
        ).fetchone()[0]
        self._nextQid = (top or 0) + 1

    def write(self, conn, batches, finish=False):
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
                    self.markClean(conn)
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
                deletes.append((kind, blob(key)))
            else:
                upserts.append((kind, blob(key), raw))
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
                [(storeId, blob(a.exchange), blob(a.routingKey), a.propsRaw, a.body)
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
                    qid = self.qid(conn, queueKey, op == ENQ)
                    if qid is None:
                        continue  # nothing of this queue is on disk
                if op == ENQ:
                    inserts.append(
                        (qid, storeId, entry.seq, _real(entry.enqueuedAtMs), _real(entry.expiresAtMs),
                         int(entry.redelivered))
                    )
                elif op == DEQ:
                    removals.append((qid, storeId))
                else:
                    marks.append((qid, storeId))
        if removals:
            for sql, params in _rows(_DELETE_ENTRIES, 2, "))", removals):
                ex(sql, params)
            orphanCandidates.update(r[1] for r in removals)
            self.vacuumDue = True
        if inserts:
            for sql, params in _rows(_INSERT_ENTRIES, 6, "", inserts):
                ex(sql, params)
        if marks:
            for sql, params in _rows(_MARK_ENTRIES, 2, "))", marks):
                ex(sql, params)
        orphanCandidates.update(batch.orphans)
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
        old = self.qids.pop(queueKey, None)
        if old is None:
            return
        ex = conn.execute
        ex("DELETE FROM queues WHERE key = ?", (blob(queueKey),))
        ex("INSERT INTO dead_queues (qid) VALUES (?)", (old,))
        self.dead.append(old)
        if keep:
            new = self.qid(conn, queueKey, True)
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
        if not self.dead:
            return
        qid = self.dead[0]
        removed = [r[0] for r in conn.execute(_COLLECT, (qid, qid, chunk)).fetchall()]
        if len(removed) < chunk:
            conn.execute("DELETE FROM dead_queues WHERE qid = ?", (qid,))
            self.dead.pop(0)
        if removed:
            self._deleteOrphans(conn, removed)
            self.stats["gcEntries"] += len(removed)
        self.vacuumDue = True

    def vacuum(self, conn):
        """
        Return up to :data:`VACUUM_STEP` free pages to the file system when
        more than :data:`VACUUM_THRESHOLD` are free (its own small
        transaction; the file shrinks at the next WAL checkpoint).
        """
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        if free <= VACUUM_THRESHOLD:
            self.vacuumDue = False
            return
        # not fsync'd, as a clean-up chunk alone (see write)
        conn.execute("PRAGMA synchronous = NORMAL")
        try:
            conn.execute(f"PRAGMA incremental_vacuum({VACUUM_STEP})").fetchall()
        finally:
            conn.execute("PRAGMA synchronous = FULL")
        self.stats["vacuumedPages"] += min(free, VACUUM_STEP)


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
    "load": (LOAD_MESSAGES, 1),
    "countEntries": (COUNT_ENTRIES, 1),
}

