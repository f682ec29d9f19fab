"""
Tests for :mod:`otter_tx.store`: one contract suite
(:class:`StoreContractMixin`) run against :class:`MemoryStore` (synchronously,
no reactor) and :class:`SQLiteStore` (real reactor, real files, the writer
thread), plus SQLite-only tests: reopening, recovery after an unclean stop,
corrupt files, the threading rule and group commit.  Recovery after SIGKILL
of a separate process is in ``otter_tx.test.e2e.test_store_crash``.

The contract tests are ``async def`` methods; ``__init_subclass__`` turns
each into a plain test method that the concrete class drives: the memory
variant with ``successResultOf`` (so a Deferred that does not fire at once
fails the test), the SQLite variant with ``Deferred.fromCoroutine``.
"""

import inspect
import json
import os
import sqlite3
import threading

from twisted.internet import defer, reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface.verify import verifyObject

from otter_tx.store.interface import (
    ENTITY_KINDS,
    IMessageStore,
    RecoveredMessage,
    StoreClosedError,
    StoreCorruptError,
    StoreFailedError,
)
from otter_tx.store.sqlite import batch as batchModule
from otter_tx.store.sqlite import schema as schemaModule
from otter_tx.store.sqlite import tables as tablesModule
from otter_tx.store.memory import MemoryStore
from otter_tx.store.sqlite import STORE_FILENAME, SQLiteStore, resolvePath


def listed(recovered):
    """
    ``recovered`` with each queue's (possibly lazy) messages read into a
    list, for tests that index or compare them.
    """
    recovered.messages = {key: list(recs) for key, recs in recovered.messages.items()}
    return recovered


def limitStorePages(store):
    """
    Make ``store``'s writer run each write with ``PRAGMA max_page_count``
    set to ``limit[0]`` (SQLite's own "database or disk is full", as on a
    full disk); returns ``limit``, a one-item list the test changes.
    """
    limit = [1 << 30]
    original = store._write

    def limited(conn, batches, finish=False):
        conn.execute(f"PRAGMA max_page_count = {limit[0]}").fetchall()
        return original(conn, batches, finish)

    store._write = limited
    return limit


class _CursorKeepingConnection(sqlite3.Connection):
    """
    A connection that keeps every cursor it hands out alive, as PyPy does
    until its next garbage collection: a statement whose rows were not read
    to the end then stays open.
    """

    def execute(self, *args):
        cursor = sqlite3.Connection.execute(self, *args)
        self.__dict__.setdefault("kept", []).append(cursor)
        return cursor


class _CursorKeepingSQLite:
    """Stands in for the ``sqlite3`` module: ``connect`` makes :class:`_CursorKeepingConnection` objects."""

    def __getattr__(self, name):
        return getattr(sqlite3, name)

    def connect(self, *args, **kwargs):
        return sqlite3.connect(*args, factory=_CursorKeepingConnection, **kwargs)


def _drivenBy(f):
    """
    A plain test method running the coroutine test ``f`` through
    ``self.drive``.
    """

    def test(self):
        return self.drive(f(self))

    test.__name__ = f.__name__
    test.__qualname__ = f.__qualname__
    test.__doc__ = f.__doc__
    return test


class StoreContractMixin:
    """
    The behaviour every :class:`IMessageStore` shares.  Subclasses provide
    ``makeStore()`` (a new, unopened store), ``reopen()`` (a coroutine:
    close ``self.store``, open the same data again as ``self.store`` and
    return the RecoveredState) and ``drive(coroutine)``.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(StoreContractMixin).items()):
            if name.startswith("test_") and inspect.iscoroutinefunction(value):
                setattr(cls, name, _drivenBy(value))

    #: the store keeps a message held by several queues once (the message
    #: log writes it with each queue's entry instead)
    storesOnce = True

    def setUp(self):
        self.store = self.makeStore()

    async def openStore(self):
        """Open ``self.store`` and return its RecoveredState."""
        return listed(await self.store.open())

    def addQueueMessage(self, queueKey, storeId, seq=None, body=None, again=False, **kw):
        """Add message ``storeId`` (``again``: not the first time) and enqueue it in ``queueKey``."""
        self.store.addMessage(
            storeId, "ex", "rk.%d" % storeId, b"\x80\x00props", body or b"body-%d" % storeId, again
        )
        self.store.enqueue(
            queueKey,
            storeId,
            storeId if seq is None else seq,
            kw.get("enqueuedAtMs", 1000.5),
            kw.get("expiresAtMs"),
            kw.get("redelivered", False),
        )

    def ids(self, recovered, queueKey):
        """The storeIds recovered for ``queueKey``, in order."""
        return [m.storeId for m in recovered.messages.get(queueKey, [])]

    async def test_providesInterface(self):
        """The store provides IMessageStore completely."""
        self.assertTrue(verifyObject(IMessageStore, self.store))

    async def test_freshOpenIsEmpty(self):
        """A new store recovers an empty dict for every entity kind and no messages."""
        recovered = await self.openStore()
        self.assertEqual(recovered.entities, {kind: {} for kind in ENTITY_KINDS})
        self.assertEqual(recovered.messages, {})
        self.assertEqual(recovered.stats["messages"], 0)
        self.assertEqual(recovered.stats["queuedMessages"], 0)

    async def test_entitiesSurviveRestart(self):
        """Entities of every kind come back after a restart with their records."""
        await self.openStore()
        for kind in ENTITY_KINDS:
            self.store.putEntity(kind, kind + "/1", {"kind": kind, "args": {"x-max-length": 5}})
        await self.store.sync()
        recovered = await self.reopen()
        for kind in ENTITY_KINDS:
            self.assertEqual(
                recovered.entities[kind],
                {kind + "/1": {"kind": kind, "args": {"x-max-length": 5}}},
            )
            self.assertEqual(recovered.stats[kind], 1)

    async def test_putEntityUpserts(self):
        """A second putEntity for the same key replaces the record."""
        await self.openStore()
        self.store.putEntity("policy", "/\x00p", {"priority": 1})
        await self.store.sync()
        self.store.putEntity("policy", "/\x00p", {"priority": 2})
        recovered = await self.reopen()
        self.assertEqual(recovered.entities["policy"], {"/\x00p": {"priority": 2}})

    async def test_recordCopiedAtCall(self):
        """Mutating a record after putEntity does not change what is stored."""
        await self.openStore()
        record = {"durable": True}
        self.store.putEntity("exchange", "/\x00x", record)
        record["durable"] = False
        recovered = await self.reopen()
        self.assertEqual(recovered.entities["exchange"]["/\x00x"], {"durable": True})

    async def test_badEntityRejectedAtOnce(self):
        """A record that is not JSON-serialisable raises TypeError and an unknown kind ValueError, at the call."""
        await self.openStore()
        self.assertRaises(TypeError, self.store.putEntity, "queue", "q", {"x": object()})
        self.assertRaises(ValueError, self.store.putEntity, "thing", "q", {})
        self.assertRaises(ValueError, self.store.deleteEntity, "thing", "q")

    async def test_deleteEntity(self):
        """deleteEntity removes one entity; deleting an absent one is not an error."""
        await self.openStore()
        self.store.putEntity("user", "guest", {"tags": ["administrator"]})
        self.store.putEntity("user", "bob", {"tags": []})
        await self.store.sync()
        self.store.deleteEntity("user", "guest")
        self.store.deleteEntity("user", "nobody")
        recovered = await self.reopen()
        self.assertEqual(recovered.entities["user"], {"bob": {"tags": []}})

    async def test_messageRoundTrip(self):
        """Every field of a queued message survives a restart unchanged."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        self.store.addMessage(7, "amq.direct", "key", b"\x90\x00\x02\x01", b"\x00payload\xff")
        self.store.enqueue("q", 7, 42, 1700000000123.5, 1700000060123.5, True)
        await self.store.sync()
        recovered = await self.reopen()
        self.assertEqual(
            recovered.messages,
            {
                "q": [
                    RecoveredMessage(
                        7,
                        42,
                        1700000000123.5,
                        1700000060123.5,
                        True,
                        "amq.direct",
                        "key",
                        b"\x90\x00\x02\x01",
                        b"\x00payload\xff",
                    )
                ]
            },
        )
        self.assertIsInstance(recovered.messages["q"][0].body, bytes)

    async def test_bytesLikeAccepted(self):
        """memoryview and bytearray bodies and properties are stored as bytes."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        buffer = bytearray(b"hello")
        self.store.addMessage(1, "", "q", memoryview(b"pp"), buffer)
        self.store.enqueue("q", 1, 1, 1.0, None, False)
        buffer[:] = b"HELLO"
        recovered = await self.reopen()
        message = recovered.messages["q"][0]
        self.assertEqual((message.propsRaw, message.body), (b"pp", b"hello"))
        self.assertIs(type(message.body), bytes)

    async def test_sortedBySeq(self):
        """Recovered messages of a queue are sorted by seq, not by insertion order or id."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        for storeId, seq in [(1, 30), (2, 10), (3, 20), (4, -5)]:
            self.addQueueMessage("q", storeId, seq=seq)
        recovered = await self.reopen()
        self.assertEqual(self.ids(recovered, "q"), [4, 2, 3, 1])

    async def test_messageInSeveralQueues(self):
        """A message enqueued in two queues is stored once and recovered in both."""
        await self.openStore()
        self.store.putEntity("queue", "a", {})
        self.store.putEntity("queue", "b", {})
        self.addQueueMessage("a", 1)
        self.addQueueMessage("b", 1, seq=5, again=True)
        recovered = await self.reopen()
        self.assertEqual((self.ids(recovered, "a"), self.ids(recovered, "b")), ([1], [1]))
        # a store that keeps a message once counts it once; the message log
        # writes it with each queue's entry
        copies = 1 if self.storesOnce else 2
        self.assertEqual(recovered.stats["messages"], copies)
        self.assertEqual(recovered.stats["queuedMessages"], 2)
        self.assertEqual(recovered.stats["bodyBytes"], copies * len(b"body-1"))

    async def test_dequeueKeepsMessageWhileReferenced(self):
        """After a dequeue from one of two queues the message stays; after the last it is gone."""
        await self.openStore()
        self.store.putEntity("queue", "a", {})
        self.store.putEntity("queue", "b", {})
        self.addQueueMessage("a", 1)
        self.addQueueMessage("b", 1, seq=1, again=True)
        await self.store.sync()
        self.store.dequeue("a", 1)
        self.store.dequeue("a", 99)
        recovered = await self.reopen()
        self.assertEqual((self.ids(recovered, "a"), self.ids(recovered, "b")), ([], [1]))
        self.store.dequeue("b", 1)
        recovered = await self.reopen()
        self.assertEqual(recovered.messages, {})
        self.assertEqual(recovered.stats["messages"], 0)
        self.assertEqual(recovered.stats["droppedOrphanMessages"], 0)

    async def test_markRedelivered(self):
        """markRedelivered sets the flag of one entry only; an absent entry is ignored."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        self.addQueueMessage("q", 1)
        self.addQueueMessage("q", 2)
        await self.store.sync()
        self.store.markRedelivered("q", 2)
        self.store.markRedelivered("q", 3)
        recovered = await self.reopen()
        self.assertEqual([m.redelivered for m in recovered.messages["q"]], [False, True])

    async def test_markRedeliveredBeforeWrite(self):
        """markRedelivered right after enqueue, before any sync, still sets the flag."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        self.addQueueMessage("q", 1)
        self.store.markRedelivered("q", 1)
        recovered = await self.reopen()
        self.assertTrue(recovered.messages["q"][0].redelivered)

    async def test_enqueueThenDequeueLeavesNothing(self):
        """An enqueue and a dequeue of the same entry before a sync leave no message behind."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        self.addQueueMessage("q", 1)
        self.store.markRedelivered("q", 1)
        self.store.dequeue("q", 1)
        self.addQueueMessage("q", 2)
        recovered = await self.reopen()
        self.assertEqual(self.ids(recovered, "q"), [2])
        self.assertEqual(recovered.stats["messages"], 1)
        self.assertEqual(recovered.stats["droppedOrphanMessages"], 0)

    async def test_reEnqueueReplaces(self):
        """Enqueueing an entry again (after a dequeue, or over it) keeps one entry with the newest fields."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        self.store.putEntity("queue", "r", {})
        self.addQueueMessage("q", 1, seq=1)
        self.addQueueMessage("r", 1, seq=1, again=True)
        await self.store.sync()
        self.store.dequeue("q", 1)
        self.addQueueMessage("q", 1, seq=9, again=True, enqueuedAtMs=2.0, expiresAtMs=3.0, redelivered=True)
        self.addQueueMessage("r", 1, seq=4, again=True, enqueuedAtMs=5.0)
        self.store.dequeue("r", 1)
        recovered = await self.reopen()
        [message] = recovered.messages["q"]
        self.assertEqual(
            (message.seq, message.enqueuedAtMs, message.expiresAtMs, message.redelivered),
            (9, 2.0, 3.0, True),
        )
        self.assertEqual(self.ids(recovered, "r"), [])

    async def test_purgeQueue(self):
        """purgeQueue removes every entry of one queue and keeps other queues' copies."""
        await self.openStore()
        self.store.putEntity("queue", "a", {})
        self.store.putEntity("queue", "b", {})
        self.addQueueMessage("a", 1)
        self.addQueueMessage("a", 2)
        self.store.enqueue("b", 2, 2, 1.0, None, False)
        await self.store.sync()
        self.addQueueMessage("a", 3)
        self.store.purgeQueue("a")
        self.addQueueMessage("a", 4)
        recovered = await self.reopen()
        self.assertEqual((self.ids(recovered, "a"), self.ids(recovered, "b")), ([4], [2]))
        self.assertEqual(recovered.stats["messages"], 2)

    async def test_purgeQueueKeeps(self):
        """purgeQueue(key, keep) removes every entry of the queue except the kept storeIds, on disk and pending."""
        await self.openStore()
        self.store.putEntity("queue", "a", {})
        for i in range(1, 5):
            self.addQueueMessage("a", i)
        await self.store.sync()
        self.addQueueMessage("a", 5)
        self.addQueueMessage("a", 6)
        self.store.purgeQueue("a", keep=[2, 3, 6, 99])
        self.store.markRedelivered("a", 3)
        recovered = await self.reopen()
        self.assertEqual(self.ids(recovered, "a"), [2, 3, 6])
        self.assertEqual([m.redelivered for m in recovered.messages["a"]], [False, True, False])
        self.assertEqual(recovered.stats["messages"], 3)

    async def test_anyStringIsStorable(self):
        """Keys, exchange names and routing keys holding lone surrogates (shortstr bytes that are not UTF-8) round-trip unchanged."""
        await self.openStore()
        odd = b"q\xff\xed\xb0\x80".decode("utf-8", "surrogateescape")
        self.store.putEntity("queue", "/\x00" + odd, {"name": odd})
        self.store.putEntity("exchange", odd, {})
        self.store.addMessage(1, odd, odd + "rk", b"p", b"b")
        self.store.enqueue("/\x00" + odd, 1, 1, 1.0, None, False)
        await self.store.sync()
        recovered = await self.reopen()
        self.assertEqual(recovered.entities["queue"], {"/\x00" + odd: {"name": odd}})
        self.assertEqual(recovered.entities["exchange"], {odd: {}})
        [message] = recovered.messages["/\x00" + odd]
        self.assertEqual((message.exchange, message.routingKey), (odd, odd + "rk"))
        self.store.putEntity("vhost", "/", {})
        await self.store.sync()

    async def test_healthInterface(self):
        """A working store is healthy and accepts health observers without calling them."""
        await self.openStore()
        calls = []
        self.store.addHealthObserver(lambda healthy, reason: calls.append((healthy, reason)))
        self.store.putEntity("vhost", "/", {})
        await self.store.sync()
        self.assertIs(self.store.healthy, True)
        self.assertEqual(calls, [])

    async def test_deleteQueueDropsMessages(self):
        """Deleting a queue entity drops its entries; a queue declared again starts empty."""
        await self.openStore()
        self.store.putEntity("queue", "a", {"v": 1})
        self.store.putEntity("queue", "b", {})
        self.addQueueMessage("a", 1)
        self.addQueueMessage("a", 2)
        self.store.enqueue("b", 2, 2, 1.0, None, False)
        await self.store.sync()
        self.store.deleteEntity("queue", "a")
        self.store.putEntity("queue", "a", {"v": 2})
        self.addQueueMessage("a", 3)
        recovered = await self.reopen()
        self.assertEqual(recovered.entities["queue"]["a"], {"v": 2})
        self.assertEqual((self.ids(recovered, "a"), self.ids(recovered, "b")), ([3], [2]))
        self.assertEqual(recovered.stats["messages"], 2)

    async def test_recoveryDropsDanglingAndOrphans(self):
        """Recovery drops entries of a queue with no entity and messages no queue holds, and counts them."""
        await self.openStore()
        self.addQueueMessage("no-such-queue", 1)
        self.store.addMessage(2, "", "", b"", b"lonely")
        recovered = await self.reopen()
        self.assertEqual(recovered.messages, {})
        self.assertEqual(recovered.stats["droppedDanglingEntries"], 1)
        if self.storesOnce:
            self.assertEqual(recovered.stats["droppedOrphanMessages"], 2)
            self.assertIn("dropped 2 unreferenced messages", recovered.summary())
        else:
            # the message log writes a message only with a queue entry
            self.assertEqual(recovered.stats["droppedOrphanMessages"], 0)
            self.assertIn("dropped 0 unreferenced messages and 1 entries", recovered.summary())
        recovered = await self.reopen()
        self.assertEqual(recovered.stats["droppedOrphanMessages"], 0)

    async def test_syncFiresInOrder(self):
        """sync() Deferreds fire in the order they were asked for, each with None."""
        await self.openStore()
        self.store.putEntity("queue", "q", {})
        fired = []
        ds = []
        for i in range(5):
            self.addQueueMessage("q", i)
            ds.append(self.store.sync().addCallback(lambda r, i=i: fired.append((i, r))))
        await defer.gatherResults(ds)
        self.assertEqual(fired, [(i, None) for i in range(5)])

    async def test_closedStoreRefusesCalls(self):
        """Calls before open() and after close() raise StoreClosedError; close() twice is fine."""
        self.assertRaises(StoreClosedError, self.store.putEntity, "vhost", "/", {})
        self.assertRaises(StoreClosedError, self.store.sync)
        await self.openStore()
        await self.store.close()
        await self.store.close()
        self.assertRaises(StoreClosedError, self.store.addMessage, 1, "", "", b"", b"")
        self.assertRaises(StoreClosedError, self.store.enqueue, "q", 1, 1, 1.0, None, False)
        self.assertRaises(StoreClosedError, self.store.dequeue, "q", 1)
        self.assertRaises(StoreClosedError, self.store.sync)

    async def test_summary(self):
        """summary() gives the entity and message counts in one line."""
        await self.openStore()
        self.store.putEntity("vhost", "/", {})
        self.store.putEntity("queue", "q", {})
        self.addQueueMessage("q", 1, body=b"12345")
        recovered = await self.reopen()
        line = recovered.summary()
        self.assertIn("vhost=1", line)
        self.assertIn("queue=1", line)
        self.assertIn("1 messages (1 queue entries, 5 body bytes) in 1 queues", line)
        self.assertNotIn("\n", line)


class MemoryStoreTests(StoreContractMixin, SynchronousTestCase):
    """
    The contract on :class:`MemoryStore`, synchronously.
    """

    def makeStore(self):
        return MemoryStore()

    async def reopen(self):
        await self.store.close()
        return listed(await self.store.open())

    def drive(self, coroutine):
        self.successResultOf(defer.Deferred.fromCoroutine(coroutine))


class MemoryStoreFailureTests(SynchronousTestCase):
    """The memory store's simulated write failures, for the alarm and confirm tests."""

    def test_failWrites(self):
        """failWrites() makes sync() fail and the store unhealthy; writesRecovered() undoes it; observers see both."""
        store = MemoryStore()
        self.successResultOf(store.open())
        calls = []
        store.addHealthObserver(lambda healthy, reason: calls.append((healthy, reason)))
        store.failWrites("disk full")
        self.assertFalse(store.healthy)
        self.failureResultOf(store.sync(), StoreFailedError)
        store.writesRecovered()
        self.assertTrue(store.healthy)
        self.successResultOf(store.sync())
        self.assertEqual(calls, [(False, "store write failed: disk full"), (True, None)])


class PendingBatchTests(SynchronousTestCase):
    """The durable store's batch merging (``sqlite.batch.Batch``) as plain code, without the writer thread."""

    def batch(self, coalesce=True):
        return batchModule.Batch(coalesce)

    def enqueue(self, b, queueKey, storeId, redelivered=False):
        b.enqueue(queueKey, storeId, storeId, 1.0, None, redelivered)

    def test_enqueueThenDequeueCancels(self):
        """A message added, enqueued and dequeued in one batch leaves nothing to write (3 changes cancelled)."""
        b = self.batch()
        b.addMessage(1, "ex", "rk", b"p", b"body")
        self.enqueue(b, "q", 1)
        self.assertEqual(b.adds[1].liveEnqueues, 1)
        self.assertEqual(b.dequeue("q", 1), 3)
        self.assertEqual((b.adds, b.entries), ({}, {"q": {}}))

    def test_sharedMessageKeptUntilLastEnqueueCancelled(self):
        """A message enqueued in two queues stays pending until both enqueues are cancelled."""
        b = self.batch()
        b.addMessage(1, "", "rk", b"", b"m")
        self.enqueue(b, "a", 1)
        self.enqueue(b, "b", 1)
        self.assertEqual(b.dequeue("a", 1), 2)
        self.assertEqual((b.adds[1].liveEnqueues, b.adds[1].enqueueCancelled), (1, True))
        self.assertEqual(b.dequeue("b", 1), 3)
        self.assertNotIn(1, b.adds)

    def test_enqueueOfStoredMessageReplaces(self):
        """An enqueue of a message not added in this batch may be on disk: its dequeue stays a delete."""
        b = self.batch()
        self.enqueue(b, "q", 7)
        self.assertTrue(b.entries["q"][7].replaces)
        self.assertEqual(b.dequeue("q", 7), 2)
        self.assertEqual(b.entries["q"][7], batchModule.DEQUEUE)

    def test_markRedeliveredMerges(self):
        """A mark after a pending enqueue sets its flag; alone it is a mark; after a dequeue it is dropped."""
        b = self.batch()
        b.addMessage(1, "", "rk", b"", b"m")
        self.enqueue(b, "q", 1)
        b.markRedelivered("q", 1)
        entry = b.entries["q"][1]
        self.assertEqual((entry.op, entry.seq, entry.redelivered), (batchModule.ENQ, 1, True))
        b.markRedelivered("q", 2)
        self.assertEqual(b.entries["q"][2], batchModule.MARK_REDELIVERED)
        b.dequeue("q", 3)
        b.markRedelivered("q", 3)
        self.assertEqual(b.entries["q"][3], batchModule.DEQUEUE)

    def test_purgeKeepsOnlyKept(self):
        """A purge forgets the queue's other pending entries, cancels their enqueues, and intersects repeated keeps."""
        b = self.batch()
        for i in (1, 2, 3):
            b.addMessage(i, "", "rk", b"", b"m")
            self.enqueue(b, "q", i)
        self.assertEqual(b.purge("q", frozenset({2, 3})), 2)
        self.assertEqual(sorted(b.entries["q"]), [2, 3])
        self.assertEqual(sorted(b.adds), [2, 3])
        b.purge("q", frozenset({3}))
        self.assertEqual(b.purges["q"], frozenset({3}))
        self.enqueue(b, "q", 9)
        self.assertFalse(b.entries["q"][9].replaces)

    def test_deleteQueueEntityPurges(self):
        """Deleting a queue entity records the delete and purges the queue's pending entries."""
        b = self.batch()
        b.addMessage(1, "", "rk", b"", b"m")
        self.enqueue(b, "q", 1)
        self.assertEqual(b.deleteEntity("queue", "q"), 2)
        self.assertEqual((b.entities, b.purges, b.entries, b.adds),
                         ({("queue", "q"): None}, {"q": frozenset()}, {}, {}))
        b.putEntity("vhost", "/", "{}")
        self.assertEqual(b.deleteEntity("vhost", "x"), 0)
        self.assertEqual(b.entities[("vhost", "/")], "{}")

    def test_noCoalesce(self):
        """Without coalescing a dequeue after a pending enqueue is kept, and the message with it."""
        b = self.batch(coalesce=False)
        b.addMessage(1, "", "rk", b"", b"m")
        self.enqueue(b, "q", 1)
        self.assertEqual(b.dequeue("q", 1), 0)
        self.assertEqual(b.entries["q"][1], batchModule.DEQUEUE)
        self.assertEqual((b.adds[1].liveEnqueues, b.adds[1].enqueueCancelled), (0, True))

    def assertAddedBytes(self, b):
        """``addedBytes`` equals the bodies and properties in ``adds``; returns it."""
        self.assertEqual(b.addedBytes, sum(len(a.body) + len(a.propsRaw) for a in b.adds.values()))
        return b.addedBytes

    def test_addedBytes(self):
        """addedBytes follows adds through a replace and every cancel path (dequeue, purge, queue delete)."""
        b = self.batch()
        self.assertEqual(self.assertAddedBytes(b), 0)
        b.addMessage(1, "", "rk", b"pp", b"x" * 19)
        b.addMessage(1, "", "rk", b"p", b"x" * 20, again=True)  # a repeat changes nothing
        self.assertEqual(self.assertAddedBytes(b), 21)
        for i in (2, 3, 4, 5):
            b.addMessage(i, "", "rk", b"", b"m" * i)
        self.enqueue(b, "q", 1)
        self.enqueue(b, "r", 1)
        self.enqueue(b, "q", 2)
        self.enqueue(b, "q", 3)
        self.enqueue(b, "d", 4)
        self.assertEqual(self.assertAddedBytes(b), 21 + 2 + 3 + 4 + 5)
        b.dequeue("q", 1)
        self.assertEqual(self.assertAddedBytes(b), 21 + 2 + 3 + 4 + 5)  # still enqueued in r
        b.dequeue("r", 1)
        self.assertEqual(self.assertAddedBytes(b), 2 + 3 + 4 + 5)
        b.purge("q", frozenset({3}))
        self.assertEqual(self.assertAddedBytes(b), 3 + 4 + 5)
        b.deleteEntity("queue", "d")
        self.assertEqual(self.assertAddedBytes(b), 3 + 5)

    def test_addedBytesNoCoalesce(self):
        """Without coalescing a cancelled message is still written, so still counted."""
        b = self.batch(coalesce=False)
        b.addMessage(1, "", "rk", b"p", b"m")
        self.enqueue(b, "q", 1)
        b.dequeue("q", 1)
        self.assertEqual(self.assertAddedBytes(b), 2)


class _SQLiteFixture:
    """
    Shared helpers of the SQLite test cases: a data dir per test and
    stores that are closed (or abandoned) at cleanup.
    """

    timeout = 30

    def newStore(self, path=None, **kwargs):
        """A new SQLiteStore on ``path`` (default: this test's data dir)."""
        store = SQLiteStore(path or self.dataDir, reactor, **kwargs)
        self.addCleanup(self._cleanupStore, store)
        return store

    def _cleanupStore(self, store):
        if store._thread is not None and store._thread.is_alive():
            if store._state == "closed":
                return store._ended
            return store.close().addErrback(lambda f: None)
        return None

    @property
    def dataDir(self):
        if not hasattr(self, "_dataDir"):
            self._dataDir = self.mktemp()
        return self._dataDir


class SQLiteStoreContractTests(StoreContractMixin, _SQLiteFixture, TestCase):
    """
    The contract on :class:`SQLiteStore`, with the real reactor and files.
    """

    def makeStore(self):
        return self.newStore()

    async def reopen(self):
        await self.store.close()
        self.store = self.newStore()
        return listed(await self.store.open())

    def drive(self, coroutine):
        return defer.Deferred.fromCoroutine(coroutine)


class SQLiteStoreTests(_SQLiteFixture, TestCase):
    """
    Behaviour specific to :class:`SQLiteStore`: files, threads, recovery,
    corruption, group commit.
    """

    async def _filled(self, count=3):
        """A closed store file holding a queue with ``count`` messages; returns its path."""
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {"durable": True})
        for i in range(count):
            store.addMessage(i, "", "q", b"p", b"x" * 3000)
            store.enqueue("q", i, i, 1.0, None, False)
        await store.close()
        return store.path

    async def test_enqueueCancelledAfterItsMessageWasWritten(self):
        """
        The writer takes a batch between a message's addMessage and its
        enqueue (another thread: a loaded PyPy run made the contract test
        fail so): an enqueue and dequeue that cancel out in the next batch
        still remove the message at that commit, not at the next recovery.
        """
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        store.addMessage(1, "", "q", b"p", b"body")
        await store.sync()  # the message written alone, as the writer may take it
        store.enqueue("q", 1, 1, 1.0, None, False)
        store.dequeue("q", 1)
        store.addMessage(2, "", "q", b"p", b"kept")
        store.enqueue("q", 2, 2, 1.0, None, False)
        await store.close()
        again = self.newStore(store.path)
        recovered = listed(await again.open())
        self.assertEqual([m.storeId for m in recovered.messages["q"]], [2])
        self.assertEqual((recovered.stats["messages"], recovered.stats["droppedOrphanMessages"]), (1, 0))
        await again.close()

    def test_resolvePath(self):
        """A data dir maps to <dir>/otter_tx.sqlite3; a name ending in .sqlite3/.sqlite/.db is the file."""
        base = os.path.abspath(self.mktemp())
        self.assertEqual(resolvePath(base), os.path.join(base, STORE_FILENAME))
        self.assertEqual(resolvePath(base + "/s.db"), base + "/s.db")
        self.assertEqual(resolvePath(base + "/s.sqlite3"), base + "/s.sqlite3")
        os.makedirs(base + "/dir.db")
        self.assertEqual(resolvePath(base + "/dir.db"), base + "/dir.db/" + STORE_FILENAME)

    async def closedStoreWith(self, bodies, queueKey="q"):
        """A store holding ``bodies`` (storeIds and seqs 1, 2, ...) in ``queueKey``, closed; returns it."""
        store = self.newStore()
        await store.open()
        store.putEntity("queue", queueKey, {})
        for storeId, body in enumerate(bodies, 1):
            store.addMessage(storeId, "", queueKey, b"", body)
            store.enqueue(queueKey, storeId, storeId, 1.0, None, False)
        await store.close()
        return store

    async def test_reopenAfterClose(self):
        """close() writes pending changes without a sync and leaves one checkpointed file with WAL mode on."""
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        store.addMessage(1, "", "q", b"", b"kept")
        store.enqueue("q", 1, 1, 1.0, None, False)
        await store.close()
        self.assertFalse(store._thread.is_alive())
        self.assertEqual(os.listdir(self.dataDir), [STORE_FILENAME])
        conn = sqlite3.connect(store.path)
        try:
            self.assertEqual(conn.execute("PRAGMA journal_mode").fetchone()[0], "wal")
        finally:
            conn.close()
        again = self.newStore()
        recovered = listed(await again.open())
        self.assertEqual([m.body for m in recovered.messages["q"]], [b"kept"])
        self.assertEqual(recovered.path, os.path.join(os.path.abspath(self.dataDir), STORE_FILENAME))

    async def test_syncMeansCommitted(self):
        """When sync() fires, another connection already sees the change, and each commit is counted."""
        store = self.newStore()
        await store.open()
        store.putEntity("vhost", "/", {"tracing": False})
        await store.sync()
        self.assertGreaterEqual(store.stats["commits"], 1)
        conn = sqlite3.connect(store.path)
        try:
            rows = conn.execute("SELECT kind, key, record FROM entities").fetchall()
        finally:
            conn.close()
        self.assertEqual([(k, key, json.loads(r)) for k, key, r in rows], [("vhost", b"/", {"tracing": False})])

    async def test_writesOffReactorThread(self):
        """Opening, recovery and every write run on the writer thread, never the reactor thread."""
        reactorThread = threading.get_ident()
        store = self.newStore()
        threads = []
        for name in ("_connect", "_recover", "_write"):
            original = getattr(store, name)

            def recording(*args, _original=original, _name=name):
                threads.append((_name, threading.get_ident()))
                return _original(*args)

            setattr(store, name, recording)
        await store.open()
        store.putEntity("queue", "q", {})
        await store.sync()
        await store.close()
        self.assertEqual({name for name, _ in threads}, {"_connect", "_recover", "_write"})
        self.assertNotIn(reactorThread, {ident for _, ident in threads})
        self.assertEqual(len({ident for _, ident in threads}), 1)

    async def test_groupCommit(self):
        """Changes and syncs issued while the writer is busy are committed together in one transaction."""
        store = self.newStore()
        await store.open()
        gate = threading.Event()
        original = store._write

        def slowWrite(conn, batches, finish=False):
            gate.wait(10)
            return original(conn, batches, finish)

        store._write = slowWrite
        store.putEntity("queue", "q", {})
        first = store.sync()
        ds = []
        for i in range(200):
            store.addMessage(i, "", "q", b"", b"m")
            store.enqueue("q", i, i, 1.0, None, False)
            ds.append(store.sync())
        gate.set()
        await defer.gatherResults([first] + ds)
        self.assertLessEqual(store.stats["commits"], 3)
        self.assertEqual(store.stats["syncs"], 201)

    async def test_coalescingCancelsPairs(self):
        """An enqueue and dequeue of the same entry in one pending batch never reach the file."""
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        await store.sync()
        gate = threading.Event()
        entered = threading.Event()
        original = store._write
        written = []

        def recordingWrite(conn, batches, finish=False):
            entered.set()
            gate.wait(10)
            for batch in batches:
                written.append((dict(batch.adds), {q: dict(e) for q, e in batch.entries.items()}))
            return original(conn, batches, finish)

        store._write = recordingWrite
        store.putEntity("vhost", "/", {})
        blocker = store.sync()
        # the writer holds the blocker's batch before the pairs are issued, so
        # all of them meet in one pending batch (else a slow writer thread may
        # take a batch between a message's add and its enqueue)
        self.assertTrue(entered.wait(10))
        for i in range(10):
            store.addMessage(i, "", "q", b"", b"m")
            store.enqueue("q", i, i, 1.0, None, False)
            store.dequeue("q", i)
        gate.set()
        await defer.gatherResults([blocker, store.sync()])
        self.assertEqual(store.stats["cancelled"], 30)
        for adds, entries in written:
            self.assertEqual(adds, {})
            self.assertEqual(entries, {"q": {}} if entries else {})

    async def test_uncleanStop(self):
        """A second store opened on the file of one never closed recovers everything synced before, consistently."""
        first = self.newStore()
        await first.open()
        first.putEntity("queue", "q", {})
        for i in range(100):
            first.addMessage(i, "", "q", b"", b"synced-%d" % i)
            first.enqueue("q", i, i, 1.0, None, False)
        await first.sync()
        for i in range(100, 200):
            first.addMessage(i, "", "q", b"", b"late-%d" % i)
            first.enqueue("q", i, i, 1.0, None, False)
        second = self.newStore()
        recovered = listed(await second.open())
        await first._abandon()
        ids = self.ids(recovered)
        self.assertEqual(ids[:100], list(range(100)))
        self.assertEqual(ids, list(range(len(ids))))
        for message in recovered.messages["q"]:
            prefix = b"synced-" if message.storeId < 100 else b"late-"
            self.assertEqual(message.body, prefix + b"%d" % message.storeId)

    def ids(self, recovered, queueKey="q"):
        """The storeIds recovered for ``queueKey``, in order."""
        return [m.storeId for m in recovered.messages.get(queueKey, [])]

    async def _assertCorrupt(self, path):
        """Opening ``path`` fails with StoreCorruptError naming it, and leaves the file unchanged."""
        before = open(path, "rb").read()
        store = self.newStore(path)
        try:
            await store.open()
        except StoreCorruptError as e:
            error = e
        else:
            self.fail(f"{path} opened although it is damaged")
        self.assertEqual(error.path, path)
        self.assertIn(path, str(error))
        self.assertIn("move the file", str(error))
        self.assertIn("backup", str(error))
        self.assertEqual(open(path, "rb").read(), before)
        self.assertRaises(StoreClosedError, store.sync)
        await store._ended
        return error

    async def test_truncatedFile(self):
        """A store file cut in half is refused with StoreCorruptError, before anything is loaded."""
        path = await self._filled(300)
        os.truncate(path, os.path.getsize(path) // 2)
        error = await self._assertCorrupt(path)
        self.assertIn("malformed", error.reason)

    async def test_damagedPages(self):
        """A store file with overwritten pages in the middle fails the integrity check."""
        path = await self._filled(300)
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            f.write(bytes(range(256)) * 32)
        await self._assertCorrupt(path)

    async def test_notADatabase(self):
        """A file that is not SQLite at all is refused with StoreCorruptError."""
        path = os.path.abspath(self.mktemp()) + ".db"
        with open(path, "wb") as f:
            f.write(b"this is not a database\n" * 100)
        error = await self._assertCorrupt(path)
        self.assertIn("not a database", error.reason)

    async def test_emptyFile(self):
        """A zero-length store file is damage (stores are created whole), not a fresh start."""
        path = await self._filled(1)
        os.truncate(path, 0)
        error = await self._assertCorrupt(path)
        self.assertIn("no 'meta' table", error.reason)

    async def test_newerSchema(self):
        """A file from a newer schema version is refused and the message says to upgrade."""
        path = await self._filled(1)
        conn = sqlite3.connect(path)
        with conn:
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        conn.close()
        error = await self._assertCorrupt(path)
        self.assertIn("upgrade otter_tx", error.reason)

    async def test_statementsReadToTheEnd(self):
        """
        Every statement the store runs is finished at once, so cursors kept
        alive until a garbage collection (PyPy) block no COMMIT: create, write,
        close and reopen all work.
        """
        self.patch(schemaModule, "sqlite3", _CursorKeepingSQLite())
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {"durable": True})
        store.addMessage(1, "", "q", b"", b"kept")
        store.enqueue("q", 1, 1, 1.0, None, False)
        await store.sync()
        await store.close()
        again = self.newStore()
        recovered = listed(await again.open())
        self.assertEqual([m.body for m in recovered.messages["q"]], [b"kept"])
        again.putEntity("queue", "q2", {"durable": True})
        await again.sync()

    async def test_recoveryStreams(self):
        """
        Opening reads no message: each queue's messages are a lazy iterable
        (not a list) that reads the rows one at a time as it is consumed,
        so consuming 3,000 messages of 4 KiB (12 MiB) without keeping them
        peaks far below their size; the summary counts are exact anyway.
        """
        try:
            import tracemalloc
        except ImportError:  # PyPy has no tracemalloc: the peak is measured on CPython
            tracemalloc = None

        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        for i in range(3000):
            store.addMessage(i, "", "q", b"", b"%04d" % i + b"z" * 4092)
            store.enqueue("q", i, i, 1.0, None, False)
        await store.close()
        again = self.newStore(store.path)
        if tracemalloc is not None:
            tracemalloc.start()
        try:
            recovered = await again.open()
            stream = recovered.messages["q"]
            self.assertNotIsInstance(stream, (list, tuple))
            self.assertEqual(len(stream), 3000)
            if tracemalloc is not None:
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
            seen = 0
            nbytes = 0
            for message in stream:
                self.assertEqual(message.body[:4], b"%04d" % seen)
                seen += 1
                nbytes += len(message.body)
            if tracemalloc is not None:
                peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            if tracemalloc is not None:
                tracemalloc.stop()
        self.assertEqual((seen, nbytes), (3000, 3000 * 4096))
        if tracemalloc is not None:
            self.assertLess(peak, 1024 * 1024)
        self.assertEqual(
            (recovered.stats["messages"], recovered.stats["queuedMessages"],
             recovered.stats["bodyBytes"]),
            (3000, 3000, 3000 * 4096),
        )
        # a second iteration reads the queue again
        self.assertEqual(sum(1 for _ in recovered.messages["q"]), 3000)
        await again.close()

    async def test_recoveryStreamFailsAsCorrupt(self):
        """
        A file damaged after the open's checks makes reading the stream fail
        with StoreCorruptError naming the file (the broker's start then
        fails as for a failed open), not with a raw sqlite3 error.
        """
        store = await self.closedStoreWith([b"one"])
        again = self.newStore(store.path)
        recovered = await again.open()
        other = sqlite3.connect(store.path, isolation_level=None, timeout=5)
        try:
            other.execute("DROP TABLE messages")
        finally:
            other.close()
        with self.assertRaises(StoreCorruptError) as caught:
            list(recovered.messages["q"])
        self.assertIn(store.path, str(caught.exception))
        self.assertIn("no such table", str(caught.exception))

    async def test_recoveryOrdersBySeq(self):
        """
        A queue whose msg_id order is not its seq order (a delayed
        exchange enqueues old messages late) comes back in seq order; a
        queue in order is read along the primary key.
        """
        store = self.newStore()
        await store.open()
        for key in ("mixed", "plain"):
            store.putEntity("queue", key, {})
        seqs = [5, 1, 3, 2, 6, 4]
        for storeId, seq in enumerate(seqs, 1):
            store.addMessage(storeId, "", "mixed", b"", b"%d" % seq)
            store.enqueue("mixed", storeId, seq, 1.0, None, False)
            store.enqueue("plain", storeId, storeId, 1.0, None, False)
        recovered = await self._reopen(store)
        self.assertEqual([m.seq for m in recovered.messages["mixed"]], [1, 2, 3, 4, 5, 6])
        self.assertEqual([m.body for m in recovered.messages["mixed"]], [b"1", b"2", b"3", b"4", b"5", b"6"])
        self.assertEqual([m.storeId for m in recovered.messages["plain"]], [1, 2, 3, 4, 5, 6])
        conn = sqlite3.connect(recovered.path)
        try:
            for sql in (schemaModule.LOAD_MESSAGES, schemaModule.DISORDERED):
                plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, (1,))]
                self.assertFalse([p for p in plan if "TEMP B-TREE" in p], plan)
        finally:
            conn.close()

    async def test_recoveryMultiQueueAndPurged(self):
        """
        A message held by two queues comes back in both and counts once;
        entries of a purged queue not cleaned up yet are neither returned
        nor counted.
        """
        self.patch(tablesModule, "GC_CHUNK", 0)
        self.patch(tablesModule, "GC_CHUNK_IDLE", 0)
        store = self.newStore()
        await store.open()
        for key in ("a", "b", "gone"):
            store.putEntity("queue", key, {})
        store.addMessage(1, "", "x", b"", b"both")
        store.enqueue("a", 1, 1, 1.0, None, False)
        store.enqueue("b", 1, 1, 1.0, None, False)
        store.addMessage(2, "", "x", b"", b"purged")
        store.enqueue("gone", 2, 2, 1.0, None, False)
        await store.sync()
        store.purgeQueue("gone")
        recovered = await self._reopen(store)
        self.assertEqual(sorted(recovered.messages), ["a", "b"])
        self.assertEqual([m.body for m in recovered.messages["a"]], [b"both"])
        self.assertEqual([m.body for m in recovered.messages["b"]], [b"both"])
        self.assertEqual(
            (recovered.stats["messages"], recovered.stats["queuedMessages"],
             recovered.stats["bodyBytes"]),
            (1, 2, 4),
        )

    async def test_recoveryReadsOneSnapshot(self):
        """
        A queue's recovered messages are read lazily but from one snapshot:
        an entry committed by another writer while they are being read does
        not appear in them.
        """
        first = await self.closedStoreWith([b"m1", b"m2"])
        second = self.newStore(first.path)
        recovered = await second.open()
        stream = iter(recovered.messages["q"])
        self.assertEqual(next(stream).body, b"m1")
        other = sqlite3.connect(first.path, isolation_level=None, timeout=5)
        try:
            other.execute("INSERT INTO messages VALUES (3, x'', x'', x'', x'6d33')")
            other.execute("INSERT INTO queue_messages VALUES (1, 3, 3, 1.0, NULL, 0)")
        finally:
            other.close()
        self.assertEqual([m.body for m in stream], [b"m2"])
        self.assertEqual([m.body for m in recovered.messages["q"]], [b"m1", b"m2", b"m3"])
        await second.close()

    async def test_diskFullFailsOnlyThatBatchAndRecovers(self):
        """
        A batch that hits a full disk fails only its own syncs (StoreFailedError),
        turns the store unhealthy with a one-line reason, keeps its changes and
        writes them once space is back; the store turns healthy by itself.
        """
        store = self.newStore(retryDelays=(0.05,))
        await store.open()
        health = []
        store.addHealthObserver(lambda healthy, reason: health.append((healthy, reason)))
        self.assertTrue(store.healthy)
        limit = limitStorePages(store)
        store.putEntity("queue", "q", {})
        store.addMessage(1, "", "q", b"", b"before")
        store.enqueue("q", 1, 1, 1.0, None, False)
        await store.sync()
        conn = sqlite3.connect(store.path)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.close()
        limit[0] = pages + 2
        for i in range(2, 50):
            store.addMessage(i, "", "q", b"", b"x" * 4000)
            store.enqueue("q", i, i, 1.0, None, False)
        with self.assertRaises(StoreFailedError) as caught:
            await store.sync()
        self.assertIn("full", str(caught.exception))
        self.assertFalse(store.healthy)
        self.assertEqual(len(health), 1)
        self.assertEqual(health[0][0], False)
        self.assertTrue(health[0][1].startswith("store write failed: "), health[0][1])
        self.assertIn("full", health[0][1])
        self.assertNotIn("\n", health[0][1])
        # still full: a later sync fails too (the kept batch cannot be written)
        store.dequeue("q", 1)
        with self.assertRaises(StoreFailedError):
            await store.sync()
        limit[0] = 1 << 30
        await store.sync()
        self.assertTrue(store.healthy)
        self.assertEqual(health[1:], [(True, None)])
        recovered = await self._reopen(store)
        self.assertEqual([m.storeId for m in recovered.messages["q"]], list(range(2, 50)))
        self.assertGreaterEqual(store.stats["failedCommits"], 2)

    async def _reopen(self, store):
        await store.close()
        again = self.newStore(store.path)
        return listed(await again.open())

    async def test_failingCloseFails(self):
        """close() fails with StoreFailedError when its last write fails, and the stop is not clean."""
        store = self.newStore(retryDelays=(0.05,))
        await store.open()
        limit = limitStorePages(store)
        store.putEntity("queue", "q", {})
        store.addMessage(1, "", "q", b"", b"synced")
        store.enqueue("q", 1, 1, 1.0, None, False)
        await store.sync()
        limit[0] = 1
        store.addMessage(2, "", "q", b"", b"y" * 8000)
        store.enqueue("q", 2, 2, 1.0, None, False)
        with self.assertRaises(StoreFailedError):
            await store.close()
        again = self.newStore(store.path)
        recovered = listed(await again.open())
        self.assertEqual([(m.storeId, m.redelivered) for m in recovered.messages["q"]], [(1, True)])

    async def test_writerBugFailsWaiters(self):
        """An exception in the write fails that batch's sync() with StoreFailedError naming the file and the cause."""
        store = self.newStore(retryDelays=(0.05,))
        await store.open()
        # the writer idle first: the write that fails is the one of the entity below (on a
        # loaded PyPy run a batch of the open could otherwise take the failure unseen)
        await store.sync()
        calls = []

        def failingOnce(conn, batches, finish=False, _original=store._write):
            calls.append(len(batches))
            if len(calls) == 1:
                raise sqlite3.OperationalError("disk I/O error")
            return _original(conn, batches, finish)

        store._write = failingOnce
        store.putEntity("vhost", "/", {})
        with self.assertRaises(StoreFailedError) as caught:
            await store.sync()
        self.assertIn("disk I/O error", str(caught.exception))
        self.assertIn(store.path, str(caught.exception))
        store.putEntity("vhost", "/2", {})
        await store.sync()
        recovered = await self._reopen(store)
        self.assertEqual(set(recovered.entities["vhost"]), {"/", "/2"})

    def test_hotStatementsUseIndexes(self):
        """Every statement of the write path is planned as index searches, and recovery reads without a sort."""
        conn = sqlite3.connect(":memory:")
        self.addCleanup(conn.close)
        conn.executescript(schemaModule.SCHEMA)
        for name, (sql, count) in tablesModule.HOT_STATEMENTS.items():
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, [1] * count)]
            if name == "load":
                self.assertEqual(plan[0], "SEARCH q USING PRIMARY KEY (qid=?)")
                self.assertEqual(plan[-1], "SEARCH m USING INTEGER PRIMARY KEY (rowid=?)")
                self.assertFalse([s for s in plan if "TEMP B-TREE" in s or s.startswith("SCAN")], plan)
                continue
            for step in plan:
                if step.startswith("SCAN"):
                    self.assertRegex(step, r"^SCAN (\d+ CONSTANT ROWS|\(subquery-\d+\))$", (name, plan))
            self.assertFalse([s for s in plan if "TEMP B-TREE" in s], (name, plan))
        self.assertIn("queue_messages", conn.execute(
            "EXPLAIN QUERY PLAN " + tablesModule.HOT_STATEMENTS["dequeue"][0], [1] * 4).fetchall()[0][3])

    async def test_purgeIsBackgroundAndSpaceReturned(self):
        """
        A purge commits in one small transaction; its entries and messages are
        removed in GC_CHUNK(_IDLE) steps afterwards and the freed pages go back to the
        file system; a message still held by another queue stays.
        """
        self.patch(tablesModule, "GC_CHUNK", 100)
        self.patch(tablesModule, "GC_CHUNK_IDLE", 30)
        self.patch(tablesModule, "VACUUM_THRESHOLD", 8)
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        store.putEntity("queue", "other", {})
        for i in range(1000):
            store.addMessage(i, "", "q", b"", b"z" * 2000)
            store.enqueue("q", i, i, 1.0, None, False)
        store.enqueue("other", 7, 7, 1.0, None, False)
        await store.sync()
        await store._whenIdle()
        full = os.path.getsize(store.path) + os.path.getsize(store.path + "-wal")
        store.purgeQueue("q")
        store.addMessage(5000, "", "q", b"", b"after")
        store.enqueue("q", 5000, 5000, 1.0, None, False)
        await store.sync()
        await store._whenIdle()
        self.assertEqual(store.stats["gcEntries"], 1000)
        self.assertGreater(store.stats["vacuumedPages"], 0)
        recovered = await self._reopen(store)
        self.assertEqual([m.storeId for m in recovered.messages["q"]], [5000])
        self.assertEqual([m.storeId for m in recovered.messages["other"]], [7])
        self.assertEqual(recovered.stats["messages"], 2)
        self.assertLess(os.path.getsize(store.path), full / 4)

    async def test_stopDuringCleanUp(self):
        """A stop before a purge's clean-up finished resurrects nothing; the clean-up resumes at the next open."""
        self.patch(tablesModule, "GC_CHUNK", 10)
        self.patch(tablesModule, "GC_CHUNK_IDLE", 10)
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        for i in range(500):
            store.addMessage(i, "", "q", b"", b"w")
            store.enqueue("q", i, i, 1.0, None, False)
        await store.sync()
        store.purgeQueue("q", keep=[3, 4])
        await store.sync()
        await store._abandon()
        again = self.newStore(store.path)
        recovered = listed(await again.open())
        self.assertEqual([m.storeId for m in recovered.messages["q"]], [3, 4])
        await again._whenIdle()
        await again.close()
        conn = sqlite3.connect(store.path)
        self.addCleanup(conn.close)
        self.assertEqual(conn.execute("SELECT count(*) FROM queue_messages").fetchone()[0], 2)
        self.assertEqual(conn.execute("SELECT count(*) FROM messages").fetchone()[0], 2)
        self.assertEqual(conn.execute("SELECT count(*) FROM dead_queues").fetchone()[0], 0)

    async def test_uncleanStopMarksRedelivered(self):
        """After an unclean stop every recovered entry is redelivered, and stays so; after a clean one flags are as stored."""
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        for i in range(3):
            store.addMessage(i, "", "q", b"", b"m")
            store.enqueue("q", i, i, 1.0, None, i == 1)
        await store.close()
        clean = self.newStore(store.path)
        recovered = listed(await clean.open())
        self.assertEqual([m.redelivered for m in recovered.messages["q"]], [False, True, False])
        await clean._abandon()
        crashed = self.newStore(store.path)
        recovered = listed(await crashed.open())
        self.assertEqual([m.redelivered for m in recovered.messages["q"]], [True, True, True])
        recovered = await self._reopen(crashed)
        self.assertEqual([m.redelivered for m in recovered.messages["q"]], [True, True, True])

    async def test_migrateSchema1(self):
        """A schema-1 file is migrated on open: everything comes back, auto_vacuum is incremental, the version is 2."""
        path = os.path.abspath(self.mktemp()) + ".sqlite3"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(_SCHEMA_1 + """
            INSERT INTO meta VALUES ('format', 'otter_tx-store'), ('schema_version', '1');
            INSERT INTO entities VALUES ('queue', '/' || char(0) || 'q', '{"a": 1}');
            INSERT INTO entities VALUES ('queue', '/' || char(0) || 'r', '{}');
            INSERT INTO messages VALUES (1, 'ex', 'rk', x'01', x'626f6479');
            INSERT INTO messages VALUES (2, 'ex', 'rk2', x'', x'');
            INSERT INTO queue_messages VALUES ('/' || char(0) || 'q', 1, 10, 5.0, NULL, 1);
            INSERT INTO queue_messages VALUES ('/' || char(0) || 'q', 2, 11, 5.0, 9.0, 0);
            INSERT INTO queue_messages VALUES ('/' || char(0) || 'r', 2, 3, 6.0, NULL, 0);
        """)
        conn.close()
        store = self.newStore(path)
        recovered = listed(await store.open())
        self.assertEqual(recovered.entities["queue"], {"/\x00q": {"a": 1}, "/\x00r": {}})
        self.assertEqual(
            [(m.storeId, m.seq, m.exchange, m.routingKey, m.body, m.expiresAtMs)
             for m in recovered.messages["/\x00q"]],
            [(1, 10, "ex", "rk", b"body", None), (2, 11, "ex", "rk2", b"", 9.0)],
        )
        self.assertEqual([m.storeId for m in recovered.messages["/\x00r"]], [2])
        store.putEntity("queue", "/\x00s", {})
        store.addMessage(3, "", "s", b"", b"new")
        store.enqueue("/\x00s", 3, 1, 1.0, None, False)
        recovered = await self._reopen(store)
        self.assertEqual([m.storeId for m in recovered.messages["/\x00s"]], [3])
        conn = sqlite3.connect(path)
        self.addCleanup(conn.close)
        self.assertEqual(conn.execute("PRAGMA auto_vacuum").fetchone()[0], 2)
        self.assertEqual(
            conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0], "2")


#: the schema-1 tables, as otter_tx wrote them before schema 2
_SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE entities (kind TEXT NOT NULL, key TEXT NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (kind, key)) WITHOUT ROWID;
CREATE TABLE messages (msg_id INTEGER PRIMARY KEY, exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL, props BLOB NOT NULL, body BLOB NOT NULL);
CREATE TABLE queue_messages (queue TEXT NOT NULL, msg_id INTEGER NOT NULL, seq INTEGER NOT NULL,
    enqueued_at REAL NOT NULL, expires_at REAL, redelivered INTEGER NOT NULL,
    PRIMARY KEY (queue, msg_id)) WITHOUT ROWID;
CREATE INDEX queue_messages_by_msg ON queue_messages (msg_id);
"""
