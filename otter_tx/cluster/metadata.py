"""
Where the cluster's metadata lives (docs/cluster.md, "Metadata"): the keys,
the JSON records, and :class:`MemoryMetadata`, an in-process stand-in for
etcd that several nodes of one unit test share (the real one is
:class:`otter_tx.cluster.etcdmeta.EtcdMetadata`).

Both offer the same Deferred-returning calls: ``grantLease(ttl)``,
``create(key, value, lease=None)`` (a transaction: put only if the key is
absent; fires ``(created, currentValue)``), ``put``, ``delete``,
``load(prefix)`` (fires ``(items, revision)``), and
``watch(prefix, revision, onEvents)`` (``onEvents(list of (kind, key,
value))`` with kind ``"put"`` or ``"delete"``, in revision order).
Values are JSON-able dicts.
"""

import base64
import hashlib
import json
from urllib.parse import quote, unquote

from twisted.internet import defer

from otter_tx.amqp.codec import TaggedInt


def nodeKey(name):
    return "nodes/" + quote(name, safe="")


def queueKey(vhost, name):
    return "queues/%s/%s" % (quote(vhost, safe=""), quote(name, safe=""))


def exchangeKey(vhost, name):
    return "exchanges/%s/%s" % (quote(vhost, safe=""), quote(name, safe=""))


def bindingKey(vhost, source, destinationType, destination, routingKey, arguments):
    h = hashlib.sha1(json.dumps([source, destinationType, destination, routingKey, toJSON(arguments)],
                                sort_keys=True).encode()).hexdigest()
    return "bindings/%s/%s" % (quote(vhost, safe=""), h)


def splitKey(key):
    """``kind/part/part`` -> (kind, [unquoted parts])."""
    kind, _, rest = key.partition("/")
    return kind, [unquote(p) for p in rest.split("/")] if rest else []


def toJSON(value):
    """AMQP field values -> JSON (bytes as ``{"$b": base64}``; typed ints keep their value)."""
    if isinstance(value, dict):
        return {k: toJSON(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [toJSON(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, TaggedInt):
        return int(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def fromJSON(value):
    if isinstance(value, dict):
        if set(value) == {"$b"}:
            return base64.b64decode(value["$b"])
        return {k: fromJSON(v) for k, v in value.items()}
    if isinstance(value, list):
        return [fromJSON(v) for v in value]
    return value


class MemoryMetadata:
    """
    etcd's semantics for the calls above, in memory, with events delivered
    on a later reactor turn of ``clock`` (as a watch delivers them).
    ``expireLease(id)`` plays a lease that lapsed (its keys are deleted).
    """

    def __init__(self, clock):
        self.clock = clock
        self.data = {}
        self.leases = {}     # lease id -> set of keys
        self.keyLease = {}
        self.revision = 0
        self.watches = []
        self._lease = 0
        self.available = True

    def _check(self):
        if not self.available:
            raise ConnectionError("metadata store unavailable")

    def grantLease(self, ttl):
        self._lease += 1
        self.leases[self._lease] = set()
        return defer.succeed(self._lease)

    def expireLease(self, lease):
        for key in sorted(self.leases.pop(lease, ())):
            self._delete(key)

    def revokeLease(self, lease):
        self.expireLease(lease)
        return defer.succeed(None)

    def _notify(self, events):
        for prefix, onEvents in list(self.watches):
            mine = [e for e in events if e[1].startswith(prefix)]
            if mine:
                self.clock.callLater(0, onEvents, mine)

    def _put(self, key, value, lease):
        self.revision += 1
        self.data[key] = value
        old = self.keyLease.pop(key, None)
        if old is not None and old in self.leases:
            self.leases[old].discard(key)
        if lease is not None:
            self.leases.setdefault(lease, set()).add(key)
            self.keyLease[key] = lease
        self._notify([("put", key, value)])

    def _delete(self, key):
        if key in self.data:
            self.revision += 1
            del self.data[key]
            lease = self.keyLease.pop(key, None)
            if lease is not None and lease in self.leases:
                self.leases[lease].discard(key)
            self._notify([("delete", key, None)])

    def create(self, key, value, lease=None):
        return defer.maybeDeferred(self._create, key, value, lease)

    def _create(self, key, value, lease):
        self._check()
        if key in self.data:
            return False, self.data[key]
        self._put(key, value, lease)
        return True, value

    def put(self, key, value, lease=None):
        return defer.maybeDeferred(lambda: (self._check(), self._put(key, value, lease))[1])

    def delete(self, key):
        return defer.maybeDeferred(lambda: (self._check(), self._delete(key))[1])

    def load(self, prefix):
        def load():
            self._check()
            return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix)), self.revision
        return defer.maybeDeferred(load)

    def watch(self, prefix, revision, onEvents):
        entry = (prefix, onEvents)
        self.watches.append(entry)
        return entry

    def stop(self):
        self.watches = []
