"""
The cluster's metadata in etcd (docs/cluster.md, "Metadata"): the calls of
:mod:`otter_tx.cluster.metadata` over :class:`otter_tx.cluster.etcd.EtcdClient`.
Every key is under ``prefix`` (default ``/otter/``); values are JSON.
A declare's create-if-absent is one transaction (compare ``version == 0``,
put; else get), so two nodes declaring one queue at once see one record.
"""

import json

from twisted.internet import defer

from otter_tx.cluster.etcd import Compare, EtcdClient, LeaseKeeper, Op

#: items :meth:`EtcdMetadata.seed` puts in its guarded transaction (etcd's
#: ``--max-txn-ops`` is 128 by default)
SEED_OPS = 120


class EtcdMetadata:
    """
    :param endpoints: etcd client URLs (list of str, ``http://host:port``).
    :param clock: the reactor.  :param prefix: the key prefix (str).
    :param timeout: seconds each etcd request may take (float).
    :ivar connected: False while the watch stream or the lease is lost.
    :ivar onLost: called with a reason (str) when the node's lease is lost
        or etcd cannot be reached (set by the node).
    """

    def __init__(self, endpoints, clock, prefix="/otter/", timeout=5.0):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e]
        self.client = EtcdClient(list(endpoints), clock, timeout=timeout)
        self.clock = clock
        self.prefix = prefix
        self.keeper = None
        self.watcher = None
        self.connected = True
        self.onLost = None
        self.onState = None

    def _k(self, key):
        return (self.prefix + key).encode()

    def grantLease(self, ttl):
        self.keeper = LeaseKeeper(self.client, ttl, self.clock, onLost=self._lost)
        return self.keeper.start()

    def _lost(self, reason):
        self.connected = False
        if self.onLost is not None:
            self.onLost(reason)

    def revokeLease(self, lease):
        keeper, self.keeper = self.keeper, None
        d = keeper.stop(revoke=True) if keeper is not None else self.client.revokeLease(lease)
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        return d.addBoth(lambda _: self.client.close())

    def create(self, key, value, lease=None):
        k = self._k(key)
        d = self.client.txn([Compare.version(k, "=", 0)],
                            [Op.put(k, json.dumps(value).encode(), lease)],
                            [Op.get(k)])

        def done(result):
            ok, responses, revision = result
            if ok:
                return True, value, revision
            kvs = responses[0].kvs if responses else []
            return False, json.loads(kvs[0].value) if kvs else None, revision

        return d.addCallback(done)

    @defer.inlineCallbacks
    def seed(self, prefix, items):
        """
        See :meth:`MemoryMetadata.seed
        <otter_tx.cluster.metadata.MemoryMetadata.seed>`: one transaction
        that compares the version of every key under ``prefix`` with 0 and
        puts the first :data:`SEED_OPS` items; the rest are put after it.
        """
        items = list(items)
        head, rest = items[:SEED_OPS], items[SEED_OPS:]
        ok, _, revision = yield self.client.txn(
            [Compare.version(self._k(prefix), "=", 0, prefix=True)],
            [Op.put(self._k(k), json.dumps(v).encode()) for k, v in head], [])
        if not ok:
            return False, revision
        for i in range(0, len(rest), SEED_OPS):
            _, _, revision = yield self.client.txn(
                [], [Op.put(self._k(k), json.dumps(v).encode()) for k, v in rest[i:i + SEED_OPS]], [])
        return True, revision

    def put(self, key, value, lease=None):
        return self.client.put(self._k(key), json.dumps(value).encode(), lease)

    @defer.inlineCallbacks
    def update(self, key, change):
        """
        Compare-and-swap (see :meth:`MemoryMetadata.update
        <otter_tx.cluster.metadata.MemoryMetadata.update>`): read the key,
        ``change(record)``, then a transaction that puts the new value only
        if the key's mod revision is still the one read; retried (at most
        20 times) when another write came in between.
        """
        k = self._k(key)
        for _ in range(20):
            got = yield self.client.get(k)
            current = json.loads(got.value) if got is not None and got.value else None
            modRevision = got.modRevision if got is not None else 0
            new = change(current)
            if new is None:
                # (no revision: OrderedWrites must not take another node's write for its own)
                return False, current, None
            ok, _, revision = yield self.client.txn([Compare.modRevision(k, "=", modRevision)],
                                                    [Op.put(k, json.dumps(new).encode())], [])
            if ok:
                return True, new, revision
        raise RuntimeError("metadata update of %s: too many concurrent writes" % (key,))

    def delete(self, key):
        """Delete ``key``; fires the store revision after it (a transaction, for its revision)."""
        return self.client.txn([], [Op.delete(self._k(key))]).addCallback(lambda r: r[2])

    def deletePrefix(self, prefix):
        """Delete every key under ``prefix``; fires the store revision after it."""
        return self.client.txn([], [Op.delete(self._k(prefix), prefix=True)]).addCallback(lambda r: r[2])

    def load(self, prefix):
        n = len(self.prefix)

        def loaded(result):
            kvs, revision = result
            return [(kv.key.decode()[n:], json.loads(kv.value)) for kv in kvs], revision

        return self.client.getPrefix(self._k(prefix)).addCallback(loaded)

    def watch(self, prefix, revision, onEvents):
        n = len(self.prefix)

        def events(evs):
            onEvents([("put" if e.type == "PUT" else "delete", e.key.decode()[n:],
                       json.loads(e.value) if e.type == "PUT" and e.value else None, e.modRevision)
                      for e in evs])

        def state(up):
            self.connected = up
            if self.onState is not None:
                self.onState(up)

        self.watcher = self.client.watchPrefix(self._k(prefix), revision, events, onCompacted=self._compacted,
                                               onStateChange=state)
        return self.watcher

    def _compacted(self, revision):
        # the mirror can no longer follow: the node leaves so that it starts again clean
        self._lost("etcd compacted past revision %d of the watch" % (revision,))
