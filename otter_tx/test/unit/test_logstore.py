"""
Tests for :class:`otter_tx.store.log.LogStore` (the message log): the store
contract suite of ``test_store`` on it, and what is specific to the log.
"""

import os

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from otter_tx.store.log import LogStore
from otter_tx.test.unit.test_store import StoreContractMixin, _SQLiteFixture, listed


class _LogFixture(_SQLiteFixture):
    """Stores are LogStores on this test's data dir."""

    def newStore(self, path=None, **kwargs):
        store = LogStore(path or self.dataDir, reactor, **kwargs)
        self.addCleanup(self._cleanupStore, store)
        return store


class LogStoreContractTests(StoreContractMixin, _LogFixture, TestCase):
    """The store contract on :class:`LogStore`, with the real reactor and files."""

    storesOnce = False

    def makeStore(self):
        return self.newStore()

    async def reopen(self):
        await self.store.close()
        self.store = self.newStore()
        return listed(await self.store.open())

    def drive(self, coroutine):
        return defer.Deferred.fromCoroutine(coroutine)


class LogStoreBatchTests(_LogFixture, TestCase):
    """How the message log meets the pending batches."""

    async def test_enqueueOneBatchAfterItsMessage(self):
        """
        The writer can take the pending batch between the broker's
        addMessage and its enqueue: the enqueue finds the message in the
        batch written just before.
        """
        store = self.newStore()
        await store.open()
        store.putEntity("queue", "q", {})
        store.addMessage(1, "ex", "rk", b"\x00\x00", b"body")
        await store.sync()
        store.enqueue("q", 1, 1, 1000.0, None, False)
        await store.close()
        store = self.newStore()
        recovered = listed(await store.open())
        [message] = recovered.messages["q"]
        self.assertEqual((message.storeId, message.body, message.routingKey), (1, b"body", "rk"))

    def test_enqueueWithoutMessageFails(self):
        """An enqueue whose message was never given fails its batch's sync (a bug in the caller)."""
        async def run():
            store = self.newStore(retryDelays=(60,))
            await store.open()
            store.putEntity("queue", "q", {})
            store.enqueue("q", 7, 1, 1000.0, None, False)
            [failure] = await store.sync().addCallbacks(lambda _: [None], lambda f: [f])
            self.assertIn("without its addMessage", str(failure.value))
            store._abandon()
        return defer.Deferred.fromCoroutine(run())


class DeepQueueRecoveryTests(_LogFixture, TestCase):
    """
    A recovered queue deeper than its memory budget keeps its paged tail in
    the message log: nothing is read or copied for it until it is paged in.
    """

    async def fill(self, n, expiring=()):
        from otter_tx.broker.durability import tableToText

        store = self.newStore(segmentBytes=16 * 1024)
        await store.open()
        store.putEntity("vhost", "/", {})
        store.putEntity("queue", "/\x00deep", {"autoDelete": False, "arguments": tableToText({})})
        for i in range(1, n + 1):
            store.addMessage(i, "ex", "rk", b"\x10\x00\x02", b"body-%05d" % i + b"x" * 90)
            store.enqueue("/\x00deep", i, i, 1000.0, 5000.0 if i in expiring else None, False)
        await store.sync()
        store.markRedelivered("/\x00deep", n - 1)
        await store.close()

    async def recoverInto(self, budget=20000):
        from twisted.internet.task import Clock

        from otter_tx.broker.broker import Broker
        from otter_tx.broker.durability import Journal

        clock = Clock()
        clock.advance(1)
        broker = Broker(clock, queueMemoryBudget=budget, pagingDirectory=self.mktemp())
        store = self.newStore(segmentBytes=16 * 1024)
        state = await store.open()
        Journal(broker, store).recover(state)
        return broker, store, clock, broker.vhosts["/"].queues["deep"]

    async def test_pagedTailStaysInTheLog(self):
        """Counts are right at once, the tail is paged without a paging file, and it reads back in order."""
        from otter_tx.broker.paging import StoredRun

        await self.fill(3000)
        broker, store, clock, q = await self.recoverInto()
        self.assertEqual(q.readyCount, 3000)
        self.assertGreater(q.ready.pagedCount, 2000)
        pager = q.ready._pagers[0]
        # the message that started the paging is paged as usual, the rest is the log's
        self.assertTrue(all(isinstance(seg.file, StoredRun) for seg in list(pager.segments)[1:]))
        self.assertEqual(pager.segments[0].count, 1)
        self.assertFalse(os.path.exists(broker.paging.path()) and os.listdir(broker.paging.path()))
        got = []
        while True:
            entry = q.ready.popLive()
            if entry is None:
                break
            got.append((entry.message.storeId, entry.message.body[:10], entry.redelivered))
        self.assertEqual([g[0] for g in got], list(range(1, 3001)))
        self.assertEqual(got[2998], (2999, b"body-02999", True))
        self.assertEqual(got[5], (6, b"body-00006", False))
        for storeId, _, _ in got:
            store.dequeue("/\x00deep", storeId)
        await store.sync()
        await store.close()
        # every segment but the active one was reclaimed
        qdir = os.path.join(store.messagesPath, "q%d" % store._tables.qids["/\x00deep"])
        logs = os.listdir(qdir)
        qlog = store._tables.logs[store._tables.qids["/\x00deep"]]
        self.assertEqual(len(logs), 1, (logs, qlog.segments, [(s, s.pins) for s in qlog.segments]))

    async def test_pagedTailExpires(self):
        """A message with a TTL in the paged tail expires on time, without being delivered."""
        await self.fill(3000, expiring={2500})
        broker, store, clock, q = await self.recoverInto()
        clock.advance(10)
        self.assertEqual(q.readyCount, 2999)
        await store.close()
