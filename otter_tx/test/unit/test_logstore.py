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
