"""
Tests for :class:`otter_tx.store.log.LogStore` (the message log): the store
contract suite of ``test_store`` on it, and what is specific to the log.
"""

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
