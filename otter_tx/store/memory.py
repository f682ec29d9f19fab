"""
:class:`MemoryStore`: the in-memory :class:`~otter_tx.store.interface.IMessageStore`.

It keeps the same contract as the durable store so the broker and the
contract suite cannot tell them apart, except that nothing reaches disk:
every change is "durable" as soon as it is made and ``sync()`` fires at
once.  A closed MemoryStore can be opened again and hands back what it
held, which is how in-process restart tests simulate a restart without a
disk.  It never touches a reactor.
"""

import json

from twisted.internet.defer import fail, succeed
from zope.interface import implementer

from otter_tx.store.interface import (
    ENTITY_KINDS,
    IMessageStore,
    RecoveredMessage,
    RecoveredState,
    StoreClosedError,
    StoreFailedError,
)


def _checkKind(kind):
    if kind not in ENTITY_KINDS:
        raise ValueError(f"unknown entity kind {kind!r}; expected one of {ENTITY_KINDS}")


@implementer(IMessageStore)
class MemoryStore:
    """
    An :class:`IMessageStore` that keeps everything in dicts.

    Records are kept JSON-encoded, exactly as the durable store keeps them,
    so a record that round-trips differently (tuples become lists, int keys
    become strings) does so in tests too.
    """

    path = None

    def __init__(self):
        self._open = False
        #: True unless :meth:`failWrites` made it fail
        self.healthy = True
        self._healthObservers = []
        self._failReason = None
        # {kind: {key: json str}}
        self._entities = {kind: {} for kind in ENTITY_KINDS}
        # {storeId: (exchange, routingKey, propsRaw, body)}
        self._messages = {}
        # {storeId: number of queues holding it}
        self._refs = {}
        # {queueKey: {storeId: [seq, enqueuedAtMs, expiresAtMs, redelivered]}}
        self._queues = {}

    def _checkOpen(self):
        if not self._open:
            raise StoreClosedError("MemoryStore is not open")

    # --- lifecycle -------------------------------------------------------

    def open(self):
        """
        Open (or reopen after ``close()``) and return what is held, after
        the same repairs the durable store does at boot.
        """
        if self._open:
            raise StoreClosedError("MemoryStore is already open")
        stats = {"droppedOrphanMessages": 0, "droppedDanglingEntries": 0}
        queueEntities = self._entities["queue"]
        for queueKey in [q for q in self._queues if q not in queueEntities]:
            entries = self._queues.pop(queueKey)
            stats["droppedDanglingEntries"] += len(entries)
            for storeId in entries:
                # the message itself goes in the orphan sweep below (counted
                # there, as the durable store counts it)
                self._refs[storeId] -= 1
        for storeId in [m for m in self._messages if self._refs.get(m, 0) == 0]:
            del self._messages[storeId]
            self._refs.pop(storeId, None)
            stats["droppedOrphanMessages"] += 1

        entities = {
            kind: {key: json.loads(raw) for key, raw in byKey.items()}
            for kind, byKey in self._entities.items()
        }
        messages = {}
        queued = 0
        for queueKey, entries in self._queues.items():
            if not entries:
                continue
            recovered = []
            for storeId, (seq, enqueuedAtMs, expiresAtMs, redelivered) in entries.items():
                exchange, routingKey, propsRaw, body = self._messages[storeId]
                recovered.append(
                    RecoveredMessage(
                        storeId,
                        seq,
                        enqueuedAtMs,
                        expiresAtMs,
                        redelivered,
                        exchange,
                        routingKey,
                        propsRaw,
                        body,
                    )
                )
            recovered.sort(key=lambda m: m.seq)
            messages[queueKey] = recovered
            queued += len(recovered)
        for kind in ENTITY_KINDS:
            stats[kind] = len(entities[kind])
        stats["messages"] = len(self._messages)
        stats["queuedMessages"] = queued
        stats["bodyBytes"] = sum(len(m[3]) for m in self._messages.values())
        self._open = True
        return succeed(RecoveredState(entities, messages, stats, None))

    def close(self):
        """
        Close; the data stays in memory for a later ``open()``.
        """
        self._open = False
        return succeed(None)

    def sync(self):
        """
        Fire at once: every change is already "durable"; fail with
        :class:`StoreFailedError` at once while :meth:`failWrites` is in
        effect (the changes are kept, as the durable store keeps a failed
        batch to write again).
        """
        self._checkOpen()
        if self._failReason is not None:
            return fail(StoreFailedError("<memory>", self._failReason))
        return succeed(None)

    # --- health ----------------------------------------------------------

    def addHealthObserver(self, callback):
        """
        Call ``callback(healthy, reason)`` each time :attr:`healthy`
        changes (see :meth:`IMessageStore.addHealthObserver`); only
        :meth:`failWrites` and :meth:`writesRecovered` change it.
        """
        self._healthObservers.append(callback)

    def failWrites(self, reason="disk I/O error"):
        """
        For tests: act as a durable store whose writes fail: ``healthy``
        turns False (observers get ``"store write failed: " + reason``) and
        ``sync()`` fails until :meth:`writesRecovered`.
        """
        self._failReason = reason
        self._setHealth(False, "store write failed: " + reason)

    def writesRecovered(self):
        """For tests: writes succeed again; ``healthy`` turns True."""
        self._failReason = None
        self._setHealth(True, None)

    def _setHealth(self, healthy, reason):
        if healthy == self.healthy:
            return
        self.healthy = healthy
        for callback in list(self._healthObservers):
            callback(healthy, reason)

    # --- entities --------------------------------------------------------

    def putEntity(self, kind, key, record):
        """
        Insert or replace an entity (see :meth:`IMessageStore.putEntity`).
        """
        self._checkOpen()
        _checkKind(kind)
        self._entities[kind][key] = json.dumps(record)

    def deleteEntity(self, kind, key):
        """
        Delete an entity; a queue takes its messages with it.
        """
        self._checkOpen()
        _checkKind(kind)
        self._entities[kind].pop(key, None)
        if kind == "queue":
            self._dropQueue(key)

    # --- messages --------------------------------------------------------

    def addMessage(self, storeId, exchange, routingKey, propsRaw, body, again=False):
        """
        Store a message once (see :meth:`IMessageStore.addMessage`).
        """
        self._checkOpen()
        self._messages[storeId] = (exchange, routingKey, bytes(propsRaw), bytes(body))
        self._refs.setdefault(storeId, 0)

    def enqueue(self, queueKey, storeId, seq, enqueuedAtMs, expiresAtMs, redelivered):
        """
        Put a stored message in a queue (replacing an entry for the same
        ``(queueKey, storeId)``).
        """
        self._checkOpen()
        if storeId not in self._messages:
            raise KeyError(f"enqueue of unknown message {storeId!r}")
        entries = self._queues.setdefault(queueKey, {})
        if storeId not in entries:
            self._refs[storeId] = self._refs.get(storeId, 0) + 1
        entries[storeId] = [seq, enqueuedAtMs, expiresAtMs, bool(redelivered)]

    def dequeue(self, queueKey, storeId):
        """
        Remove a message from a queue; delete it when no queue holds it.
        """
        self._checkOpen()
        entries = self._queues.get(queueKey)
        if entries is None or entries.pop(storeId, None) is None:
            return
        if not entries:
            del self._queues[queueKey]
        self._unref(storeId)

    def markRedelivered(self, queueKey, storeId):
        """
        Set the redelivered flag of one entry.
        """
        self._checkOpen()
        entry = self._queues.get(queueKey, {}).get(storeId)
        if entry is not None:
            entry[3] = True

    def purgeQueue(self, queueKey, keep=()):
        """
        Remove every entry of a queue except those of the storeIds in
        ``keep``.
        """
        self._checkOpen()
        keep = set(keep)
        if not keep:
            self._dropQueue(queueKey)
            return
        entries = self._queues.get(queueKey, {})
        for storeId in [m for m in entries if m not in keep]:
            del entries[storeId]
            self._unref(storeId)
        if not entries:
            self._queues.pop(queueKey, None)

    def _dropQueue(self, queueKey):
        for storeId in self._queues.pop(queueKey, {}):
            self._unref(storeId)

    def _unref(self, storeId):
        refs = self._refs.get(storeId, 0) - 1
        if refs <= 0:
            self._refs.pop(storeId, None)
            self._messages.pop(storeId, None)
        else:
            self._refs[storeId] = refs
