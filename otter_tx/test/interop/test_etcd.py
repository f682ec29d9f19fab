"""
otter_tx.cluster.etcd against real etcd processes (Debian's etcd-server 3.4, which CI installs:
.ci/run). Each test class starts its own members on free loopback ports (otter_tx.cluster.etcdtest)
and kills them afterwards, even when a test fails.

Waiting is always bounded: a condition polled with a deadline, never a bare sleep.
"""

import uuid

from twisted.internet import defer, reactor, task
from twisted.trial.unittest import TestCase

from otter_tx.cluster.etcd import (
    Compare, EtcdClient, EtcdError, EtcdTimeout, EtcdUnavailable, LeaseKeeper, Op,
)
from otter_tx.cluster.etcdtest import etcdAvailable, freePort, startEtcd
from otter_tx.test.interop.support import waitOnReactor

SKIP = None if etcdAvailable() else "/usr/bin/etcd is missing (apt-get install etcd-server; CI installs it)"


def sleep(seconds):
    return task.deferLater(reactor, seconds, lambda: None)


class _EtcdCase(TestCase):
    members = 1
    timeout = 90
    skip = SKIP

    async def setUp(self):
        self.cluster = await startEtcd(self.members)
        self.addCleanup(self.cluster.stop)
        self.client = self.makeClient()
        self.prefix = "/t-%s/" % (uuid.uuid4().hex[:8],)

    def makeClient(self, endpoints=None, timeout=5.0):
        c = EtcdClient(endpoints or self.cluster.endpoints, reactor, timeout=timeout)
        self.addCleanup(c.close)
        return c


class KVTests(_EtcdCase):
    """Keys, prefixes, transactions and leases on one member."""

    async def test_putGetDelete(self):
        """put returns the new revision; get returns value, modRevision and version; delete removes it."""
        k = self.prefix + "a"
        self.assertIsNone(await self.client.get(k))
        rev = await self.client.put(k, b"\x00one")
        self.assertEqual(await self.client.get(k), (b"\x00one", rev, 1))
        rev2 = await self.client.put(k, "two")
        got = await self.client.get(k)
        self.assertEqual((got.value, got.modRevision, got.version), (b"two", rev2, 2))
        self.assertEqual(await self.client.delete(k), 1)
        self.assertIsNone(await self.client.get(k))
        self.assertEqual(await self.client.delete(k), 0)

    async def test_prefix(self):
        """getPrefix lists only the keys under the prefix, sorted, with the read's revision; deletePrefix removes them."""
        for name in ("b", "a", "c"):
            await self.client.put(self.prefix + name, name.upper())
        outside = self.prefix[:-1] + "0"  # the byte after "/" : outside the prefix
        last = await self.client.put(outside, "x")
        kvs, rev = await self.client.getPrefix(self.prefix)
        self.assertEqual([(kv.key, kv.value, kv.version) for kv in kvs],
                         [((self.prefix + n).encode(), n.upper().encode(), 1) for n in "abc"])
        self.assertEqual(rev, last)
        self.assertEqual(await self.client.getPrefix(self.prefix, serializable=True), (kvs, rev))
        self.assertEqual((await self.client.get(self.prefix + "a", serializable=True)).value, b"A")
        self.assertEqual(await self.client.deletePrefix(self.prefix), 3)
        self.assertEqual((await self.client.getPrefix(self.prefix))[0], [])
        self.assertIsNotNone(await self.client.get(outside))

    async def test_txnCompareAndSwap(self):
        """A txn runs its success ops when every compare holds, its failure ops otherwise, with decoded responses."""
        k = self.prefix + "q"
        ok, responses, rev = await self.client.txn([Compare.version(k, "=", 0)], [Op.put(k, "v1")], [Op.get(k)])
        self.assertTrue(ok)
        self.assertEqual([r.kind for r in responses], ["put"])
        ok, responses, rev2 = await self.client.txn([Compare.version(k, "=", 0)], [Op.put(k, "v2")], [Op.get(k)])
        self.assertFalse(ok)
        self.assertEqual(rev2, rev)
        self.assertEqual(responses[0].kind, "range")
        self.assertEqual([(kv.value, kv.modRevision) for kv in responses[0].kvs], [(b"v1", rev)])
        ok, responses, _ = await self.client.txn(
            [Compare.modRevision(k, "=", rev), Compare.value(k, "=", "v1")],
            [Op.put(k, "v3"), Op.get(self.prefix, prefix=True), Op.delete(self.prefix + "other", prefix=True)])
        self.assertTrue(ok)
        self.assertEqual([r.kind for r in responses], ["put", "range", "delete"])
        self.assertEqual([kv.value for kv in responses[1].kvs], [b"v3"])
        self.assertEqual(responses[2].deleted, 0)

    async def test_concurrentCreatorsOneWins(self):
        """Two clients creating one key with a version = 0 txn at once: exactly one succeeds."""
        other = self.makeClient()
        for i in range(20):
            k = self.prefix + "race%d" % (i,)
            results = await defer.gatherResults([
                c.txn([Compare.version(k, "=", 0)], [Op.put(k, name)], [Op.get(k)])
                for c, name in ((self.client, "A"), (other, "B"))])
            winners = [name for (ok, _, _), name in zip(results, "AB") if ok]
            self.assertEqual(len(winners), 1)
            loser = [r for r in results if not r[0]][0]
            self.assertEqual(loser[1][0].kvs[0].value, winners[0].encode())
            self.assertEqual((await self.client.get(k)).value, winners[0].encode())

    async def test_seedAllOrNothing(self):
        """
        EtcdMetadata.seed puts its items only into an empty prefix (a compare of every key's
        version over a range), more than one transaction holds (SEED_OPS), and of two seeds
        at once one wins whole.
        """
        from otter_tx.cluster.etcdmeta import SEED_OPS, EtcdMetadata

        metas = []
        for _ in range(2):
            m = EtcdMetadata(self.cluster.endpoints, reactor, prefix=self.prefix)
            self.addCleanup(m.client.close)
            metas.append(m)
        n = SEED_OPS * 2 + 5
        items = {name: [("entities/k%03d" % (i,), {"by": name}) for i in range(n)] for name in "AB"}
        # a key beside the prefix (entities-x) does not count as under it
        await metas[0].put("entities-x", {"beside": True})
        results = await defer.gatherResults([m.seed("entities/", items[name]) for m, name in zip(metas, "AB")])
        self.assertEqual(sorted(ok for ok, _ in results), [False, True])
        winner = "AB"[[ok for ok, _ in results].index(True)]
        loaded, revision = await metas[1].load("entities/")
        self.assertEqual(loaded, items[winner])
        self.assertEqual(revision, max(r for _, r in results))
        self.assertEqual(await metas[0].seed("entities/", [("entities/late", {})]), (False, revision))

    async def test_leaseRevoke(self):
        """A key put with a lease disappears when the lease is revoked; a later keepAlive says TTL 0."""
        lease = await self.client.grantLease(30)
        self.assertGreater(await self.client.keepAlive(lease), 0)
        k = self.prefix + "leased"
        await self.client.put(k, "x", lease=lease)
        self.assertIsNotNone(await self.client.get(k))
        await self.client.revokeLease(lease)
        self.assertIsNone(await self.client.get(k))
        self.assertEqual(await self.client.keepAlive(lease), 0)
        e = await self.assertFailure(self.client.revokeLease(lease), EtcdError)
        self.assertEqual(e.code, 5)
        e = await self.assertFailure(self.client.put(k, "y", lease=lease), EtcdError)
        self.assertEqual(e.code, 5)

    async def test_leaseExpiry(self):
        """A key on a 2 s lease nobody keeps alive disappears within a bounded time."""
        lease = await self.client.grantLease(2)
        k = self.prefix + "expiring"
        await self.client.put(k, "x", lease=lease)
        start = reactor.seconds()
        gone = []

        async def poll():
            while reactor.seconds() - start < 8:
                if await self.client.get(k) is None:
                    gone.append(reactor.seconds() - start)
                    return
                await sleep(0.1)
        await poll()
        self.assertTrue(gone, "the leased key outlived its lease by 6 s")
        self.assertGreater(gone[0], 1.0)

    async def test_leaseKeeper(self):
        """LeaseKeeper keeps a 2 s lease alive past its TTL, and reports the loss when the lease is revoked."""
        lost = []
        keeper = LeaseKeeper(self.client, 2, reactor, onLost=lost.append)
        lease = await keeper.start()
        self.addCleanup(keeper.stop)
        k = self.prefix + "kept"
        await self.client.put(k, "x", lease=lease)
        await sleep(3.5)
        self.assertIsNotNone(await self.client.get(k))
        self.assertEqual(lost, [])
        await self.client.revokeLease(lease)
        await waitOnReactor(lambda: lost, 5, what="the keeper to see the revoke")
        self.assertIsNone(keeper.leaseId)

    async def test_status(self):
        """status() names the version, the leader and the revision."""
        st = await self.client.status()
        self.assertTrue(st["version"].startswith("3."))
        self.assertTrue(st["leader"])
        self.assertGreater(st["revision"], 0)
        self.assertEqual(st["endpoint"], self.cluster.endpoints[0])

    async def test_gatewayError(self):
        """A bad request surfaces as EtcdError with the gateway's code and message."""
        e = await self.assertFailure(self.client.compact(10 ** 9), EtcdError)
        self.assertEqual(e.code, 11)
        self.assertIn("future revision", e.message)


class PortTakenTests(_EtcdCase):
    async def test_clientPortTakenByAnotherEtcd(self):
        """
        A second cluster whose member's client port is already another etcd's (taken between the
        pick and the start, as by a test running beside it) starts on fresh ports instead of
        taking that etcd for its own.
        """
        from otter_tx.cluster import etcdtest

        taken = int(self.cluster.endpoints[0].rsplit(":", 1)[1])
        real = etcdtest.freePorts
        picks = [[taken, freePort()]]
        self.patch(etcdtest, "freePorts", lambda n: picks.pop() if picks else real(n))
        other = await etcdtest.startEtcd(1)
        self.addCleanup(other.stop)
        self.assertNotEqual(other.endpoints, self.cluster.endpoints)
        await self.client.put(self.prefix + "mine", "1")
        theirs = self.makeClient(other.endpoints)
        self.assertIsNone(await theirs.get(self.prefix + "mine"))


class WatchTests(_EtcdCase):
    """Watches on one member."""

    async def test_watchSeesPutsAndDeletesInOrder(self):
        """A prefix watch reports puts and deletes in revision order, and nothing outside the prefix."""
        seen = []
        states = []
        w = self.client.watchPrefix(self.prefix, None, seen.extend, onStateChange=states.append)
        self.addCleanup(w.stop)
        await waitOnReactor(lambda: w.connected, 5, what="the watch to be created")
        revs = []
        revs.append(await self.client.put(self.prefix + "a", "1"))
        await self.client.put("/elsewhere", "x")
        revs.append(await self.client.put(self.prefix + "b", "2"))
        revs.append(await self.client.put(self.prefix + "a", "3"))
        await self.client.delete(self.prefix + "b")
        await waitOnReactor(lambda: len(seen) >= 4, 5, what="four events")
        self.assertEqual([(e.type, e.key, e.value) for e in seen], [
            ("PUT", (self.prefix + "a").encode(), b"1"), ("PUT", (self.prefix + "b").encode(), b"2"),
            ("PUT", (self.prefix + "a").encode(), b"3"), ("DELETE", (self.prefix + "b").encode(), b"")])
        self.assertEqual([e.modRevision for e in seen[:3]], revs)
        self.assertEqual(states, [True])
        await w.stop()

    async def test_watchFromRevision(self):
        """A watch from getPrefix's revision + 1 reports only later changes; from an old revision, the history."""
        first = await self.client.put(self.prefix + "a", "1")
        _, rev = await self.client.getPrefix(self.prefix)
        await self.client.put(self.prefix + "a", "2")
        later, history = [], []
        w1 = self.client.watchPrefix(self.prefix, rev + 1, later.extend)
        w2 = self.client.watchPrefix(self.prefix, first, history.extend)
        self.addCleanup(w1.stop)
        self.addCleanup(w2.stop)
        await waitOnReactor(lambda: later and len(history) >= 2, 5, what="the events")
        self.assertEqual([e.value for e in later], [b"2"])
        self.assertEqual([e.value for e in history], [b"1", b"2"])

    async def test_compactionReported(self):
        """A watch from a compacted revision reports the compaction revision and stops."""
        r1 = await self.client.put(self.prefix + "a", "1")
        r2 = await self.client.put(self.prefix + "a", "2")
        await self.client.compact(r2)
        compacted, events = [], []
        w = self.client.watchPrefix(self.prefix, r1, events.extend, onCompacted=compacted.append)
        self.addCleanup(w.stop)
        await waitOnReactor(lambda: compacted, 5, what="the compaction report")
        self.assertEqual(compacted, [r2])
        self.assertEqual(events, [])

    async def test_watchReconnectsAfterRestart(self):
        """The only member restarted: the watch reports etcd unreachable, then reconnects and loses no event."""
        seen, states = [], []
        w = self.client.watchPrefix(self.prefix, None, seen.extend, onStateChange=states.append, maxBackoff=0.2)
        self.addCleanup(w.stop)
        await waitOnReactor(lambda: w.connected, 5, what="the watch to be created")
        await self.client.put(self.prefix + "a", "1")
        await waitOnReactor(lambda: seen, 5, what="the first event")
        self.cluster.kill(0)
        await waitOnReactor(lambda: states[-1] is False, 5, what="the watch to see the member die")
        await self.cluster.restart(0)
        await self.client.put(self.prefix + "a", "2")
        await self.client.put(self.prefix + "a", "3")
        await waitOnReactor(lambda: len(seen) >= 3, 10, what="the events after the restart")
        self.assertEqual([e.value for e in seen], [b"1", b"2", b"3"])
        self.assertEqual(states, [True, False, True])


class FailureTests(TestCase):
    """Unreachable and paused etcd."""

    timeout = 60
    skip = SKIP

    async def test_unavailableWhenNothingListens(self):
        """With no member listening on any endpoint, a request fails with EtcdUnavailable naming each endpoint."""
        eps = ["http://127.0.0.1:%d" % (freePort(),) for _ in range(2)]
        c = EtcdClient(eps, reactor, timeout=2.0)
        self.addCleanup(c.close)
        for d in (c.get("k"), c.put("k", "v")):
            e = await self.assertFailure(d, EtcdUnavailable)
            self.assertEqual([ep for ep, _ in e.failures], eps)

    async def test_timeoutOnPausedMember(self):
        """A SIGSTOPped single member: reads fail with EtcdUnavailable, writes with EtcdTimeout, within the timeout."""
        cluster = await startEtcd(1)
        self.addCleanup(cluster.stop)
        c = EtcdClient(cluster.endpoints, reactor, timeout=1.0)
        self.addCleanup(c.close)
        await c.put("k", "v")
        cluster.pause(0)
        start = reactor.seconds()
        e = await self.assertFailure(c.get("k"), EtcdUnavailable)
        self.assertNotIsInstance(e, EtcdTimeout)
        await self.assertFailure(c.put("k", "w"), EtcdTimeout)
        self.assertLess(reactor.seconds() - start, 4.0)
        cluster.resume(0)
        self.assertIn((await c.get("k")).value, (b"v", b"w"))


class ThreeMemberTests(_EtcdCase):
    """A 3-member cluster: fail-over of requests and of watches."""

    members = 3

    async def followerFirst(self, timeout=5.0):
        """A follower's index and a client whose first endpoint is that follower."""
        statuses = [await self.makeClient([ep]).status() for ep in self.cluster.endpoints]
        follower = [i for i, st in enumerate(statuses) if st["memberId"] != st["leader"]][0]
        eps = self.cluster.endpoints
        return follower, self.makeClient([eps[follower]] + [ep for ep in eps if ep != eps[follower]], timeout)

    async def test_requestsFailOver(self):
        """With the member the client talks to killed (a follower), requests go to the next member, which is remembered."""
        follower, client = await self.followerFirst()
        eps = self.cluster.endpoints
        await client.put(self.prefix + "a", "1")
        self.assertEqual(client.endpoint, eps[follower])
        self.cluster.kill(follower)
        # let the reactor see the pooled connection close: a write racing the kill in the same turn
        # fails as EtcdTimeout (unclear), by design (etcd.py)
        await sleep(0.1)
        await client.put(self.prefix + "a", "2")
        self.assertEqual((await client.get(self.prefix + "a")).value, b"2")
        self.assertNotEqual(client.endpoint, eps[follower])

    async def test_watchSurvivesMemberKill(self):
        """The member serving a watch is killed during a stream of puts: the watch continues on another member, no event lost or repeated."""
        seen, states = [], []
        w = self.client.watchPrefix(self.prefix, None, seen.extend, onStateChange=states.append, maxBackoff=0.2)
        self.addCleanup(w.stop)
        await waitOnReactor(lambda: w.connected, 5, what="the watch to be created")
        writer = self.makeClient(self.cluster.endpoints[1:])
        written = []
        for i in range(60):
            if i == 20:
                self.cluster.kill(0)
            while True:
                try:
                    await writer.put(self.prefix + "k%d" % (i % 7,), str(i))
                    break
                except EtcdError:  # a leader election under way: the put may be retried
                    await sleep(0.05)
            written.append(str(i).encode())
        await waitOnReactor(lambda: len(seen) >= len(written), 15, what="every event")
        values = [e.value for e in seen]
        # a put retried after an unclear failure may show up twice: keep first occurrences
        dedup = [v for i, v in enumerate(values) if v not in values[:i]]
        self.assertEqual(dedup, written)
        revs = [e.modRevision for e in seen]
        self.assertEqual(revs, sorted(set(revs)))
        self.assertEqual(states[:2], [True, False])
        self.assertEqual(states[-1], True)

    async def test_leaseKeptThroughPausedMember(self):
        """The member a LeaseKeeper talks to is paused: keepalives go to the others and the 3 s lease is kept."""
        follower, client = await self.followerFirst(timeout=10.0)
        lost = []
        keeper = LeaseKeeper(client, 3, reactor, onLost=lost.append)
        lease = await keeper.start()
        self.addCleanup(keeper.stop)
        self.cluster.pause(follower)
        self.addCleanup(self.cluster.resume, follower)
        await sleep(7)
        self.assertEqual(lost, [])
        self.assertGreater(await self.makeClient(self.cluster.endpoints[follower + 1:] + self.cluster.endpoints[:follower]).keepAlive(lease), 0)

    async def test_watchReportsLostQuorum(self):
        """Two members of three killed: the survivor cancels the watch (it has no leader) and the watch reports it is not connected."""
        states = []
        w = self.client.watchPrefix(self.prefix, None, lambda events: None, onStateChange=states.append,
                                    maxBackoff=0.5)
        self.addCleanup(w.stop)
        await waitOnReactor(lambda: w.connected, 5, what="the watch to be created")
        self.cluster.kill(1)
        self.cluster.kill(2)
        await waitOnReactor(lambda: states[-1] is False, 15, what="the watch to report the lost quorum")
        await sleep(2)
        self.assertFalse(w.connected)  # no stream can be made while the member has no leader
        await self.cluster.restart(1)
        await waitOnReactor(lambda: w.connected, 15, what="the watch to come back with the quorum")
