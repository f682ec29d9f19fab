"""
The contract between the broker and a message store.

The broker keeps every queue in memory and tells a store about the changes
that must survive a restart: durable entities (vhosts, users, permissions,
policies, durable exchanges and queues, bindings between durable objects)
and persistent messages (delivery-mode 2) in durable queues.  At boot the
store hands everything back in one :class:`RecoveredState` (its messages
as per-queue iterables that may read the store lazily).

Two implementations run the same contract suite
(``otter_tx/test/unit/test_store.py``):

- :class:`otter_tx.store.memory.MemoryStore`: nothing reaches disk; for
  tests and ``--data-dir`` not given.
- :class:`otter_tx.store.sqlite.SQLiteStore`: the embedded durable default
  (stdlib ``sqlite3``, WAL, one writer thread with group commit).  See
  ``docs/storage.md``.

Threading: every method is called on the reactor thread.  Mutating methods
never block and never do I/O: they record the change in a pending batch
and return ``None``.  :meth:`IMessageStore.sync` returns a Deferred that
fires (on the reactor thread) once every change issued before the call is
durable.  A publisher confirm for a persistent message is sent from that
Deferred's callback.

Keys: ``kind`` is one of :data:`ENTITY_KINDS`; ``key`` is any ``str`` the
broker chooses (for example ``"vhost\\x00name"``; the journal's formats are
defined in :mod:`otter_tx.store.keys`).  The ``queueKey`` given
to the message methods must equal the key of the queue's ``'queue'``
entity: deleting that entity drops the queue's messages, and at recovery
messages whose queue entity does not exist are dropped (and counted in
:attr:`RecoveredState.stats`).
"""

from zope.interface import Attribute, Interface

#: the entity kinds a store accepts in ``putEntity`` / ``deleteEntity``
ENTITY_KINDS = (
    "vhost",
    "user",
    "permission",
    "policy",
    "exchange",
    "queue",
    "binding",
    "global_parameter",
    "operator_policy",
)


class StoreError(Exception):
    """
    Base class of the errors a store reports.
    """


class StoreCorruptError(StoreError):
    """
    The store file cannot be used: it is not a store, it is corrupt or
    truncated, or it was written by a newer schema.  Raised (as the failure
    of ``open()``) before anything is loaded or changed; the broker must not
    start.  ``str(error)`` names the file and says what to do.

    :ivar path: the store file (``str``).
    :ivar reason: the short cause (``str``), for example SQLite's message.
    """

    def __init__(self, path, reason):
        self.path = path
        self.reason = reason
        super().__init__(
            f"otter_tx store file {path!r} is unusable: {reason}. "
            "The broker did not start and did not change the file. "
            "To recover: stop the broker, move the file and its '-wal' and "
            "'-shm' companions aside (keep them for inspection), then either "
            "restore the data directory from a backup or start with an empty "
            "store (durable entities and persistent messages in it are lost). "
            "The sqlite3 shell's '.recover' command can salvage rows from a "
            "damaged file."
        )


class StoreFailedError(StoreError):
    """
    A write batch could not be committed (disk full, I/O error): the
    ``sync()`` Deferreds waiting for that batch fail with this error (the
    broker answers basic.nack for the publishes they cover).  The store
    keeps the batch's changes, writes them again after a back-off and
    turns healthy again by itself once a commit succeeds; what was durable
    before is intact.  ``close()`` fails with it if the last write failed.
    ``__cause__`` / :attr:`reason` carry the original error.
    """

    def __init__(self, path, reason):
        self.path = path
        self.reason = reason
        super().__init__(f"otter_tx store {path!r} failed to write: {reason}")


class StoreClosedError(StoreError, RuntimeError):
    """
    A store method was called before ``open()`` fired or after ``close()``
    was called.  This is a bug in the caller, not a runtime condition.
    """


class RecoveredMessage:
    """
    One queued copy of a persistent message, as recovered at boot.

    :ivar storeId: ``int``, the broker's message id (unique per store).
    :ivar seq: ``int``, the queue's ordering key (lower is delivered first).
    :ivar enqueuedAtMs: ``float``, original enqueue time, ms since the epoch
        (TTL keeps running across a restart).
    :ivar expiresAtMs: ``float`` or ``None``, absolute expiry deadline in ms.
    :ivar redelivered: ``bool``.
    :ivar exchange: ``str``, the exchange it was published to.
    :ivar routingKey: ``str``.
    :ivar propsRaw: ``bytes``, the encoded content-header properties.
    :ivar body: ``bytes``.
    """

    __slots__ = (
        "storeId",
        "seq",
        "enqueuedAtMs",
        "expiresAtMs",
        "redelivered",
        "exchange",
        "routingKey",
        "propsRaw",
        "body",
    )

    def __init__(
        self,
        storeId,
        seq,
        enqueuedAtMs,
        expiresAtMs,
        redelivered,
        exchange,
        routingKey,
        propsRaw,
        body,
    ):
        self.storeId = storeId
        self.seq = seq
        self.enqueuedAtMs = enqueuedAtMs
        self.expiresAtMs = expiresAtMs
        self.redelivered = redelivered
        self.exchange = exchange
        self.routingKey = routingKey
        self.propsRaw = propsRaw
        self.body = body

    def _key(self):
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other):
        if not isinstance(other, RecoveredMessage):
            return NotImplemented
        return self._key() == other._key()

    def __repr__(self):
        return (
            f"RecoveredMessage(storeId={self.storeId!r}, seq={self.seq!r}, "
            f"redelivered={self.redelivered!r}, bodyLen={len(self.body)})"
        )


class RecoveredState:
    """
    Everything a store held when it was opened.

    :ivar entities: ``{kind: {key: record}}`` for every kind in
        :data:`ENTITY_KINDS` (empty dicts included); ``record`` is the dict
        given to ``putEntity`` (after a JSON round trip).
    :ivar messages: ``{queueKey: iterable of RecoveredMessage}`` in
        ``seq`` order; only queues with at least one message appear.  The
        iterable may be lazy and read the store as it is consumed (the
        SQLite store's is, so a backlog of any size is recovered in bounded
        memory, issue 8): consume it on the reactor thread before changing
        that queue, and do not expect a list (``len()`` works; each
        iteration reads again).  A message held by several queues appears
        in each, as equal but possibly distinct objects.
    :ivar stats: ``{str: int}``: one count per entity kind, ``messages``
        (distinct messages; the message log counts each queue's copy, as it
        stores it), ``queuedMessages`` (queue entries),
        ``bodyBytes``, and the repairs done while opening:
        ``droppedOrphanMessages`` (message rows no queue referred to, left by
        a stop between ``addMessage`` and ``enqueue``) and
        ``droppedDanglingEntries`` (queue entries whose queue entity is
        missing).
    :ivar path: the store file, or ``None`` for a memory store.
    """

    def __init__(self, entities, messages, stats, path=None):
        self.entities = entities
        self.messages = messages
        self.stats = stats
        self.path = path

    def summary(self):
        """
        One line for the startup log, e.g. ``"recovered vhost=1 user=1 ...
        binding=3; 12 messages (14 queue entries, 340 body bytes) in 2
        queues from /data/otter_tx.sqlite3"``.
        """
        parts = [f"{kind}={self.stats.get(kind, 0)}" for kind in ENTITY_KINDS]
        text = "recovered " + " ".join(parts)
        text += (
            f"; {self.stats.get('messages', 0)} messages "
            f"({self.stats.get('queuedMessages', 0)} queue entries, "
            f"{self.stats.get('bodyBytes', 0)} body bytes) "
            f"in {len(self.messages)} queues"
        )
        repaired = self.stats.get("droppedOrphanMessages", 0) + self.stats.get(
            "droppedDanglingEntries", 0
        )
        if repaired:
            text += (
                f"; dropped {self.stats.get('droppedOrphanMessages', 0)} "
                f"unreferenced messages and "
                f"{self.stats.get('droppedDanglingEntries', 0)} entries of "
                "missing queues"
            )
        if self.path is not None:
            text += f" from {self.path}"
        return text


class IStoreHealth(Interface):
    """
    The health part of a store, all that the resource alarms
    (:meth:`otter_tx.resources.alarms.Alarms.watchStore`) use.
    """

    healthy = Attribute(
        "bool: True while writes succeed; False from a failed commit until "
        "the next successful one.  Read on the reactor thread.  While it is "
        "False the broker blocks publishers of persistent messages and its "
        "health checks answer 503 (RabbitMQ's resource alarms, "
        "https://www.rabbitmq.com/docs/alarms)."
    )

    def addHealthObserver(callback):
        """
        Register ``callback(healthy, reason)``, called on the reactor
        thread each time :attr:`healthy` changes.  ``healthy`` is the new
        ``bool``; ``reason`` is a one-line ``str`` such as ``"store write
        failed: OperationalError: database or disk is full"`` when it turns
        False, ``None`` when it turns True.  Not called at registration.
        """


class IMessageStore(IStoreHealth):
    """
    Durable state of a broker: entities and persistent queued messages.

    Every method is called on the reactor thread.  Mutating methods return
    ``None`` at once and raise :class:`StoreClosedError` unless the store is
    open (``open()`` fired and ``close()`` not called).  Changes are applied
    in the order they were issued; :meth:`sync` reports when they are
    durable.
    """

    path = Attribute("The store file (str), or None for a memory store.")

    def open():
        """
        Create or open the store and load everything back.

        :return: ``Deferred[RecoveredState]``; fails with
            :class:`StoreCorruptError` if the file is unusable (nothing was
            changed in that case).
        """

    def close():
        """
        Write every pending change (committed and fsync'd) and release the
        file.  Later mutating calls raise :class:`StoreClosedError`.
        Calling it again returns a Deferred for the same close.

        :return: ``Deferred[None]``; fails with :class:`StoreFailedError` if
            the pending changes could not be written.
        """

    def putEntity(kind, key, record):
        """
        Insert or replace one entity.

        :param kind: one of :data:`ENTITY_KINDS` (``ValueError`` otherwise).
        :param key: ``str``.
        :param record: JSON-serialisable ``dict``; it is serialised during
            the call (``TypeError``/``ValueError`` raised at once), so the
            caller may mutate it afterwards.
        """

    def deleteEntity(kind, key):
        """
        Delete one entity (no error if absent).  Deleting a ``'queue'`` also
        drops every message entry of that queue.
        """

    def addMessage(storeId, exchange, routingKey, propsRaw, body, again=False):
        """
        Give a message's content; it is placed in queues with
        :meth:`enqueue`.  Call it before EVERY enqueue of the message (the
        message log writes the message with each queue's entry, so its
        ``enqueue`` needs the content in the same batch), with ``again``
        True after the first time: a store that keeps a message once
        (SQLite, memory) then changes nothing it already holds.

        :param storeId: ``int`` unique for the life of the store; the broker
            must not reuse an id.
        :param exchange: ``str``.
        :param routingKey: ``str``.
        :param propsRaw: ``bytes``-like: the encoded content-header property
            flags and list.
        :param body: ``bytes``-like (copied if it is not ``bytes``).
        :param again: ``bool``, the message was given before.
        """

    def enqueue(queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered):
        """
        Put message ``storeId`` (just given to :meth:`addMessage`) in queue
        ``queueKey`` at position ``seq`` (``int``).  ``enqueuedAtMs`` and
        ``expiresAtMs`` (``float`` or ``None``) are absolute times in ms
        since the epoch.  Enqueueing the same ``(queueKey, storeId)`` again
        replaces the entry.
        """

    def dequeue(queueKey, storeId):
        """
        Remove a message from a queue (ack, dead-lettering, expiry, drop).
        The message itself is deleted once no queue refers to it.  No error
        if absent.
        """

    def markRedelivered(queueKey, storeId):
        """
        Set the redelivered flag of one queue entry (the message was
        delivered and then requeued).  No error if absent.
        """

    def purgeQueue(queueKey, keep=()):
        """
        Remove every message entry of a queue except those of the storeIds in
        ``keep`` (an iterable of ``int``; for ``queue.purge``, which keeps
        unacknowledged messages: AMQP 0-9-1 queue.purge).  The cost is
        O(len(keep)), not O(queue length): the durable store drops the
        entries in the background (see ``docs/storage.md``).
        """

    def sync():
        """
        :return: ``Deferred[None]`` that fires on the reactor thread once
            every change issued before this call is durable (committed and
            fsync'd); Deferreds fire in the order ``sync()`` was called.
            Fails with :class:`StoreFailedError` if the write of a change
            it covers failed; later calls are not affected (the store
            retries and recovers by itself).
        """
