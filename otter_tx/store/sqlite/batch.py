"""
The SQLite store's pending batch: the net effect of the changes issued
since the writer last took a batch, as plain data and plain code.

No I/O, no lock, no thread: :class:`~otter_tx.store.sqlite.writer.SQLiteStore`
calls the merge methods with its lock held on the reactor thread, the
writer thread applies a taken batch with
:meth:`Tables.write <otter_tx.store.sqlite.tables.Tables.write>`, and the
unit tests (``test_store.PendingBatchTests``) call them directly.

Coalescing.  The batch is not a log but the net effect of the changes:
one entry per entity, one per (queue, message) and a set of queues to
purge.  An ``enqueue`` followed by a ``dequeue`` of the same (queue,
message) before the writer took them cancels out, and a message whose
every enqueue cancelled out is never written (``SQLiteStore.stats``
counts these).  With a consumer keeping up with a producer most messages
never touch the disk.  ``coalesce=False`` turns this off (for the bench).
A purge forgets the pending entry changes of its queue, so every entry
change left in a batch was issued after the batch's purge of that queue.
"""

from collections import namedtuple

#: the kinds of entry change (EntryChange.op)
ENQ = 1  # an enqueue, with its fields (see EntryChange)
DEQ = 2  # a dequeue
MARK = 3  # set the redelivered flag of an entry already on disk


class PendingMessage:
    """
    A message given to ``addMessage`` in the pending batch.

    :ivar exchange: str.  :ivar routingKey: str.
    :ivar propsRaw: bytes.  :ivar body: bytes.
    :ivar liveEnqueues: pending enqueues of it not cancelled (int).
    :ivar enqueueCancelled: True once one of its pending enqueues was
        cancelled (a dequeue or purge in the same batch).
    :ivar fresh: False when the message was given again (``again=True``):
        entries of it may be on disk already.
    """

    __slots__ = ("exchange", "routingKey", "propsRaw", "body", "liveEnqueues", "enqueueCancelled", "fresh")

    def __init__(self, exchange, routingKey, propsRaw, body, fresh=True):
        self.exchange = exchange
        self.routingKey = routingKey
        self.propsRaw = propsRaw
        self.body = body
        self.liveEnqueues = 0
        self.enqueueCancelled = False
        self.fresh = fresh


class EntryChange(namedtuple("EntryChange", "op seq enqueuedAtMs expiresAtMs redelivered replaces record")):
    """
    The net pending change of one (queue, message) entry (a tuple with
    named fields; made with :data:`_tupleNew`).

    :ivar op: ``ENQ``, ``DEQ`` or ``MARK``.
    :ivar seq: enqueue order in the queue (int; ``ENQ`` only).
    :ivar enqueuedAtMs: float ms since the epoch (``ENQ`` only).
    :ivar expiresAtMs: float ms since the epoch or None (``ENQ`` only).
    :ivar redelivered: bool (``ENQ`` only).
    :ivar replaces: the entry may already be on disk, so cancelling this
        enqueue must still delete it (``ENQ`` only).
    :ivar record: the entry already encoded by the store (``bytes``; the
        message log's ENQ record, made on the reactor thread), or None.
    """

    __slots__ = ()


#: builds an EntryChange from a 6-tuple in field order without the Python
#: ``__new__`` of a namedtuple (an enqueue is on the hot path)
_tupleNew = tuple.__new__


#: the (shared, never changed) pending change of a dequeue and of a redelivered mark
DEQUEUE = EntryChange(DEQ, None, None, None, False, False, None)
MARK_REDELIVERED = EntryChange(MARK, None, None, None, False, False, None)


class Batch:
    """
    The net effect of the changes issued since the writer last took a
    batch, plus the ``sync()`` Deferreds waiting for it.

    The merge methods (:meth:`putEntity` .. :meth:`purge`) are plain code
    with no lock and no thread: the writer's ``SQLiteStore`` calls them with its
    lock held, and the unit tests call them directly.  Those that can
    cancel pending changes return how many they cancelled (int, for
    ``stats["cancelled"]``).

    :ivar entities: ``{(kind, key): json str, or None to delete}``.
    :ivar purges: ``{queueKey: frozenset of storeIds kept}``: every other
        entry of the queue on disk is removed before ``entries`` apply.
    :ivar adds: ``{storeId: PendingMessage}``.
    :ivar entries: ``{queueKey: {storeId: EntryChange}}``.
    :ivar waiters: the ``sync()`` Deferreds waiting for this batch.
    :ivar size: number of changes recorded (for "is there anything to write").
    :ivar addedBytes: bytes of the bodies and properties in ``adds`` (int),
        kept as they come and go (``SQLiteStore.pendingWriteBytes``).
    :ivar coalesce: cancel enqueue/dequeue pairs (``SQLiteStore(coalesce=)``).
    """

    __slots__ = ("entities", "purges", "adds", "entries", "orphans", "waiters", "size", "addedBytes", "coalesce")

    def __init__(self, coalesce=True):
        self.entities = {}
        self.purges = {}
        self.adds = {}
        self.entries = {}
        #: storeIds whose pending enqueue was cancelled while their message was written by an
        #: earlier batch (the writer took it between addMessage and enqueue): removed at commit
        #: when no queue entry refers to them
        self.orphans = set()
        self.waiters = []
        self.size = 0
        self.addedBytes = 0
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

    def addMessage(self, storeId, exchange, routingKey, propsRaw, body, again=False):
        """
        Write message ``storeId`` (its enqueues follow).  ``again``: it was
        given before, in this batch or an earlier one (the message log
        writes it with each queue's entry); a repeat in the same batch
        changes nothing.
        """
        adds = self.adds
        if storeId in adds:
            return
        adds[storeId] = PendingMessage(exchange, routingKey, propsRaw, body, not again)
        self.addedBytes += len(body) + len(propsRaw)

    def enqueue(self, queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered, record=None):
        """
        Put message ``storeId`` in queue ``queueKey`` (replacing a pending
        change of that entry); ``record``: the entry as the store encoded it.
        """
        entries = self.entries.get(queueKey)
        if entries is None:
            entries = self.entries[queueKey] = {}
        previous = entries.get(storeId)
        # `replaces`: the entry may already be on disk, so cancelling this
        # enqueue must still delete it.  It cannot be when the message is
        # new in this batch or the queue was purged in it (a purge forgets
        # the pending entries, so `previous` is then from after it).
        if previous is None:
            add = self.adds.get(storeId)
            replaces = (add is None or not add.fresh) and queueKey not in self.purges
        else:
            replaces = previous.op != ENQ or previous.replaces
        entries[storeId] = _tupleNew(EntryChange, (ENQ, seq, enqueuedAtMs, expiresAtMs, bool(redelivered),
                                                   replaces, record))
        if previous is None or previous.op != ENQ:
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
        if previous is None or previous.op != ENQ:
            entries[storeId] = DEQUEUE
            return 0
        if not self.coalesce:
            self._cancelEnqueue(storeId)
            entries[storeId] = DEQUEUE
            return 0
        if previous.replaces:
            entries[storeId] = DEQUEUE
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
            entries[storeId] = MARK_REDELIVERED
        elif previous.op == ENQ:
            entries[storeId] = _tupleNew(EntryChange, previous[:4] + (True,) + previous[5:])
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
                elif entry.op == ENQ:
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
            self.orphans.add(storeId)
            return 0
        add.liveEnqueues -= 1
        add.enqueueCancelled = True
        if add.liveEnqueues <= 0 and self.coalesce:
            del self.adds[storeId]
            self.addedBytes -= len(add.body) + len(add.propsRaw)
            return 1
        return 0
