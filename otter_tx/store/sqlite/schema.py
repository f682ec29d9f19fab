"""
The SQLite store's file: its schema, creation, migration and recovery, and
the streaming reader of the recovered messages.

Everything here runs on the writer thread of
:class:`~otter_tx.store.sqlite.writer.SQLiteStore` (creating, checking,
migrating and repairing the file when it opens), except
:class:`QueueStream`, which reads on whatever thread iterates it (the
reactor thread at boot) through a read-only connection of its own.

Queue ids (schema 2).  Queue entries are keyed by a small integer ``qid``
that the ``queues`` table maps to the queue key; a purged or deleted
queue's old qid is listed in ``dead_queues`` until its entries are cleaned
up (:mod:`otter_tx.store.sqlite.tables`).  Recovery reads only live qids,
so a stop in the middle of that clean-up loses nothing and resurrects
nothing; the clean-up resumes at the next open.

Client strings.  Every key, exchange name and routing key is stored as a
BLOB of its UTF-8 encoding with ``surrogateescape`` (the codec decodes
shortstr bytes that are not UTF-8 to lone surrogates, which SQLite TEXT
cannot take), so any string the broker holds is storable and comes back
unchanged (:func:`blob`, :func:`unblob`).  Records are JSON with
``ensure_ascii``, hence ASCII.

Clean stop.  ``meta.clean_shutdown`` is '0' while the store is open and
set to '1' by the last transaction of ``SQLiteStore.close``.  A store
opened after an unclean stop marks every recovered entry redelivered (on
disk and in the RecoveredState): any of them may have been delivered
before the crash, since a delivery is not made durable before it is sent
(AMQP 0-9-1 basic.deliver "redelivered";
https://www.rabbitmq.com/docs/reliability#consumer-side).
"""

import json
import os
import sqlite3

from twisted.logger import Logger

from otter_tx.store.interface import (
    ENTITY_KINDS,
    RecoveredMessage,
    RecoveredState,
    StoreCorruptError,
)

log = Logger()

#: file name used when the store is given a data directory
STORE_FILENAME = "otter_tx.sqlite3"

#: value of meta.format: identifies our files
FORMAT = "otter_tx-store"

#: schema version written by this code; files with a higher one are refused,
#: files with a lower one are migrated when opened (see :func:`migrate`)
SCHEMA_VERSION = 2

_FILE_SUFFIXES = (".sqlite3", ".sqlite", ".db")

SCHEMA = """
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

_LOAD_COLUMNS = (
    "SELECT q.msg_id, q.seq, q.enqueued_at, q.expires_at, q.redelivered, "
    "m.exchange, m.routing_key, m.props, m.body "
    "FROM queue_messages AS q JOIN messages AS m ON m.msg_id = q.msg_id "
    "WHERE q.qid = ? "
)
#: one queue's entries along the primary key (when msg_id order is seq order)
LOAD_MESSAGES = _LOAD_COLUMNS + "ORDER BY q.msg_id"
#: one queue's entries sorted by seq (when it is not)
LOAD_BY_SEQ = _LOAD_COLUMNS + "ORDER BY q.seq, q.msg_id"
#: a row if some entry of the queue has a lower seq than the one before it
#: in msg_id order (an index-only scan, no body read)
DISORDERED = (
    "SELECT 1 FROM (SELECT seq < lag(seq) OVER (ORDER BY msg_id) AS back "
    "FROM queue_messages WHERE qid = ?) WHERE back LIMIT 1"
)
COUNT_ENTRIES = "SELECT count(*) FROM queue_messages WHERE qid = ?"
_COUNT_LIVE_MESSAGES = (
    "SELECT count(*), total(length(m.body)) FROM messages AS m WHERE EXISTS "
    "(SELECT 1 FROM queue_messages AS q WHERE q.msg_id = m.msg_id "
    "AND q.qid IN (SELECT qid FROM queues))"
)


def blob(text):
    """A str as stored: UTF-8 with surrogateescape (lossless for any str the codec makes)."""
    return text.encode("utf-8", "surrogateescape")


def unblob(raw):
    """The inverse of :func:`blob`."""
    return raw.decode("utf-8", "surrogateescape")


def cachedName(cache, convert, name):
    """
    ``convert(name)`` through ``cache`` (a dict kept by the caller, holding
    at most :data:`_NAME_CACHE` names): a queue's messages share a few
    exchange names and routing keys, converted once each.
    """
    out = cache.get(name)
    if out is None:
        out = convert(name)
        if len(cache) < _NAME_CACHE:
            cache[name] = out
    return out


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


# --- opening (writer thread) ---------------------------------------------------


def connect(path):
    """
    Open the store file at ``path`` (absolute ``str``), creating it
    (atomically, :func:`create`) when it does not exist; the connection is
    in autocommit mode with ``synchronous = FULL``.
    """
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    if not os.path.exists(path):
        create(path, directory)
    conn = sqlite3.connect(path, isolation_level=None, cached_statements=512)
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


def create(path, directory):
    """
    Create an empty store under a temporary name, fsync it and rename it
    to ``path`` in ``directory`` (fsync'd too), so a file at ``path`` is
    always a complete store: a missing table there means damage, never an
    interrupted creation.
    """
    tmp = path + ".new"
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
            + SCHEMA
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
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- recovery (writer thread) --------------------------------------------------


def check(conn, path, integrityCheck, readsUpTo=SCHEMA_VERSION):
    """
    Check that the file is an otter_tx store this code reads (schema
    version at most ``readsUpTo``), run the integrity check, and set WAL
    mode.  Returns ``(version, meta)``: the file's schema version (int) and
    its ``meta`` table (dict).

    :raise StoreCorruptError: the file is not a usable otter_tx store.
    """
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            raise StoreCorruptError(
                path,
                "it is not an otter_tx store (no 'meta' table); it may be "
                "truncated or another program's database",
            ) from e
        raise
    if rows.get("format") != FORMAT:
        raise StoreCorruptError(path, f"it is not an otter_tx store (format {rows.get('format')!r})")
    try:
        version = int(rows.get("schema_version", ""))
    except ValueError:
        raise StoreCorruptError(
            path, f"its schema version {rows.get('schema_version')!r} is unreadable"
        ) from None
    if version > readsUpTo:
        raise StoreCorruptError(
            path,
            f"it was written by a newer otter_tx (schema version {version}, "
            f"this one reads up to {readsUpTo}); upgrade otter_tx "
            "rather than moving the file aside",
        )
    if integrityCheck:
        problems = [r[0] for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
        if problems != ["ok"]:
            raise StoreCorruptError(path, "SQLite's integrity check failed: " + "; ".join(problems))
    # the file was created in WAL mode and the mode is persistent;
    # set it only after the checks so an unusable file is not written
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
    if mode != "wal":
        raise StoreCorruptError(path, f"SQLite cannot use WAL mode on it (got {mode!r})")
    return version, rows


def recover(conn, path, integrityCheck, tables):
    """
    Check the file, migrate an older schema, repair what an unclean stop
    leaves (in one transaction), and count everything.

    :param conn: the writer's connection (from :func:`connect`).
    :param path: the file's path (``str``), for errors and the streams.
    :param integrityCheck: run ``PRAGMA quick_check`` first (``bool``).
    :param tables: the writer's :class:`~otter_tx.store.sqlite.tables.Tables`,
        whose queue id map is loaded (and pruned of queues whose entity is
        gone) here.
    :return: the ``RecoveredState``; its messages are one lazy
        :class:`QueueStream` per queue.
    :raise StoreCorruptError: the file is not a usable otter_tx store.
    """
    version, rows = check(conn, path, integrityCheck)
    if version < 2:
        migrate(conn, path)
    # a file of schema 1 does not say whether its last stop was clean
    clean = rows.get("clean_shutdown") == "1"
    return _load(conn, path, clean, tables)


def migrate(conn, path):
    """
    Schema 1 -> 2 in one transaction, then a VACUUM that switches
    ``auto_vacuum`` to INCREMENTAL (it rewrites the file once).
    """
    log.info("store {path}: migrating schema 1 to 2", path=path)
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


def _load(conn, path, clean, tables):
    stats = {"droppedDanglingEntries": 0, "droppedOrphanMessages": 0}
    conn.execute("BEGIN IMMEDIATE")
    try:
        entities = _loadEntities(conn, path, stats)
        tables.loadQids(conn)
        qids = tables.qids
        # qids whose queue entity is gone: their entries are dropped now
        # (not left to the background clean-up: the count is reported)
        for key in [k for k in qids if k not in entities["queue"]]:
            qid = qids.pop(key)
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
        # themselves are streamed later, see QueueStream)
        recovered = _loadMessages(conn, path, entities, stats, tables)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    tables.vacuumDue = True
    return recovered


def _loadEntities(conn, path, stats):
    entities = {kind: {} for kind in ENTITY_KINDS}
    for kind, key, raw in conn.execute("SELECT kind, key, record FROM entities"):
        byKind = entities.get(kind)
        key = unblob(key)
        if byKind is None:
            raise StoreCorruptError(path, f"it holds an entity of unknown kind {kind!r}")
        try:
            byKind[key] = json.loads(raw)
        except ValueError as e:
            raise StoreCorruptError(path, f"entity {kind}/{key!r} is not valid JSON ({e})") from e
    for kind in ENTITY_KINDS:
        stats[kind] = len(entities[kind])
    return entities


def _loadMessages(conn, path, entities, stats, tables):
    """
    The recovered messages as one lazy :class:`QueueStream` per live
    queue holding entries (nothing is read into memory here: a queue
    of 10M messages is read back a row at a time while the broker
    restores it, so recovery costs bounded memory, issue 8).  The
    counts for the summary line are index scans; the body bytes a scan
    of the message rows (no body is read for that: SQLite gets a
    BLOB's length from its record header).
    """
    messages = {}
    queued = 0
    for key, qid in tables.qids.items():
        count = conn.execute(COUNT_ENTRIES, (qid,)).fetchone()[0]
        if count:
            messages[key] = QueueStream(path, qid, count)
            queued += count
    if tables.dead:
        # entries of purged queues not cleaned up yet: count only the
        # messages a live queue holds
        row = conn.execute(_COUNT_LIVE_MESSAGES).fetchone()
    else:
        row = conn.execute("SELECT count(*), total(length(body)) FROM messages").fetchone()
    stats["messages"] = row[0]
    stats["queuedMessages"] = queued
    stats["bodyBytes"] = int(row[1])
    return RecoveredState(entities, messages, stats, path)


# --- the streaming reader (the iterating thread) -------------------------------

#: distinct names decoded once per recovered queue, at most this many
_NAME_CACHE = 4096


class QueueStream:
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
        return f"<QueueStream qid={self.qid} entries={self.count}>"


def _streamQueue(path, qid):
    """
    The generator behind :class:`QueueStream`; an SQLite error while
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
        disordered = conn.execute(DISORDERED, (qid,)).fetchone() is not None
        names = {}
        Recovered = RecoveredMessage
        for storeId, seq, enq, exp, redelivered, exchange, routingKey, props, body in conn.execute(
            LOAD_BY_SEQ if disordered else LOAD_MESSAGES, (qid,)
        ):
            yield Recovered(storeId, seq, enq, exp, redelivered == 1, cachedName(names, unblob, exchange),
                            cachedName(names, unblob, routingKey), props, body)
    finally:
        conn.close()
