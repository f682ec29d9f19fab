"""
Where the cluster's metadata lives (docs/cluster.md, "Metadata"): the keys,
the JSON records, and :class:`MemoryMetadata`, an in-process stand-in for
etcd that several nodes of one unit test share (the real one is
:class:`otter_tx.cluster.etcdmeta.EtcdMetadata`).

Both offer the same Deferred-returning calls: ``grantLease(ttl)`` (``ttl``
in seconds, int; fires the lease id),
``create(key, value, lease=None)`` (a transaction: put only if the key is
absent; fires ``(created, currentValue, revision)``), ``put`` and
``delete`` (fire the revision), ``load(prefix)`` (fires ``(items,
revision)``), and ``watch(prefix, revision, onEvents)`` (``onEvents(list
of (kind, key, value, revision))`` with kind ``"put"`` or ``"delete"``, in
revision order).  Values are JSON-able dicts.

:class:`OrderedWrites` puts one node's writes to a key in order and keeps
the watch's echo of them from undoing a later local change.
"""

import base64
import hashlib
import json
from urllib.parse import quote, unquote

from twisted.internet import defer
from twisted.python.failure import Failure

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
        events = [e + (self.revision,) for e in events]
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
            return False, self.data[key], self.revision
        self._put(key, value, lease)
        return True, value, self.revision

    def seed(self, prefix, items):
        """
        Put every ``(key, value)`` of ``items`` (no lease), only if no key
        starts with ``prefix``: a Deferred of ``(seeded bool, revision
        int)``.  A cluster's first node publishes its definitions so: a
        node that dies half-way leaves all of them or none (not a vhost
        without its users), and of two first nodes at once one wins.  On
        etcd one transaction holds the first :data:`SEED_OPS
        <otter_tx.cluster.etcdmeta.SEED_OPS>` items.
        """
        def seed():
            self._check()
            if any(k.startswith(prefix) for k in self.data):
                return False, self.revision
            for key, value in items:
                self._put(key, value, None)
            return True, self.revision
        return defer.maybeDeferred(seed)

    def put(self, key, value, lease=None):
        return defer.maybeDeferred(lambda: (self._check(), self._put(key, value, lease), self.revision)[2])

    def update(self, key, change):
        """
        Compare-and-swap: ``change(record)`` (the key's current value, or
        None) returns the new value, or None to leave it; a Deferred of
        ``(changed, value, revision)``, the value as it is afterwards (put
        without a lease: the records it changes, replicated quorum queues',
        have none).  On
        etcd a transaction that compares the key's mod revision, retried
        when another write came in between.
        """
        def update():
            self._check()
            current = self.data.get(key)
            new = change(current)
            if new is None:
                # (no revision: OrderedWrites must not take another node's write for its own)
                return False, current, None
            self._put(key, new, None)
            return True, new, self.revision
        return defer.maybeDeferred(update)

    def delete(self, key):
        return defer.maybeDeferred(lambda: (self._check(), self._delete(key), self.revision)[2])

    def deletePrefix(self, prefix):
        def delete():
            self._check()
            for key in sorted(k for k in self.data if k.startswith(prefix)):
                self._delete(key)
            return self.revision
        return defer.maybeDeferred(delete)

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


class OrderedWrites:
    """
    One node's writes, in order per key, and the filter its watch events go
    through.  The metadata store may apply writes sent at once in any order
    and the watch reports a node's own writes back to it, maybe after it
    changed the key again (an exchange declared then deleted at once would
    come back to life for a moment).  So a write to a key waits for the
    previous write to that key, and while a node has writes to a key in
    flight, events for it are held: when the last write is answered the
    latest held event is applied if it is newer than that write (another
    node's), and dropped if not (the echo).

    :param metadata: the metadata store.  :param onLate: called with a list
        of one held event ``(kind, key, value, revision)`` to apply.
    """

    def __init__(self, metadata, onLate):
        self.metadata = metadata
        self.onLate = onLate
        self._tail = {}      # key -> Deferred fired when its last write is answered
        self._inflight = {}  # key -> writes not answered yet
        self._own = {}       # key -> revision of this node's last answered write
        self._held = {}      # key -> the latest event seen while writes were in flight
        self._prefixes = {}  # prefix -> Deferred fired when a write to the whole prefix is answered

    #: the highest revision any of this node's writes got (int): what another
    #: node must have applied before it answers a request that follows them
    lastRevision = 0

    def write(self, key, call):
        """
        ``call()`` (a Deferred of a revision, or of a tuple ending with one)
        once the key's previous write is answered; a Deferred of its result.
        """
        self._inflight[key] = self._inflight.get(key, 0) + 1
        result = defer.Deferred()
        turn = defer.Deferred()
        prev = self._tail.get(key)
        self._tail[key] = turn
        for prefix, barrier in list(self._prefixes.items()):
            if key.startswith(prefix) and not barrier.called:
                # after a pending write to the whole prefix (a deleted vhost's records)
                if prev is None or prev.called:
                    prev = barrier
                else:
                    prev = defer.gatherResults([prev, barrier])

        def go(_=None):
            defer.maybeDeferred(call).addBoth(done)
            return None

        def done(r):
            rev = None
            if isinstance(r, int):
                rev = r
            elif isinstance(r, tuple) and r and isinstance(r[-1], int):
                rev = r[-1]
            if rev is not None and rev > self._own.get(key, 0):
                self._own[key] = rev
            if rev is not None and rev > self.lastRevision:
                self.lastRevision = rev
            n = self._inflight[key] - 1
            if n:
                self._inflight[key] = n
            else:
                del self._inflight[key]
                if self._tail.get(key) is turn:
                    del self._tail[key]
                held = self._held.pop(key, None)
                if held is not None and held[3] > self._own.get(key, 0):
                    self.onLate([held])
            turn.callback(None)
            result.callback(r) if not isinstance(r, Failure) else result.errback(r)

        if prev is None:
            go()
        else:
            prev.addCallback(go)
        return result

    def ownWrite(self, key, revision):
        """
        A write to ``key`` this node made outside :meth:`write` (a seed)
        answered at ``revision`` (int): its watch echo is dropped.
        """
        if revision > self._own.get(key, 0):
            self._own[key] = revision
        if revision > self.lastRevision:
            self.lastRevision = revision

    def settled(self, key):
        """A Deferred firing (with None) once the writes to ``key`` made so far are answered."""
        tail = self._tail.get(key)
        if tail is None or tail.called:
            return defer.succeed(None)
        d = defer.Deferred()

        def fired(r):
            d.callback(None)
            return r

        tail.addBoth(fired)
        return d

    def pending(self):
        """
        A Deferred firing (with None) once every write made so far (and
        every prefix delete) is answered: then :attr:`lastRevision` covers
        them all, and a request to another node may carry it.
        """
        waits = [d for d in list(self._tail.values()) + list(self._prefixes.values()) if not d.called]
        if not waits:
            return defer.succeed(None)
        return defer.DeferredList(waits).addCallback(lambda _: None)

    def writePrefix(self, prefix, call):
        """
        ``call()`` for every key under ``prefix`` (a deletePrefix): later
        writes to keys under it wait until it is answered.
        """
        barrier = defer.Deferred()
        self._prefixes[prefix] = barrier

        def done(r):
            if self._prefixes.get(prefix) is barrier:
                del self._prefixes[prefix]
            barrier.callback(None)
            return r

        return defer.maybeDeferred(call).addBoth(done)

    def accept(self, event):
        """True when watch ``event`` ``(kind, key, value, revision)`` is to be applied now."""
        key, rev = event[1], event[3]
        if key in self._inflight:
            self._held[key] = event
            return False
        own = self._own.get(key)
        if own is not None:
            if rev <= own:
                if rev == own:
                    del self._own[key]
                return False
            del self._own[key]
        return True
