"""
The journal between the broker and an :class:`~otter_tx.store.interface.IMessageStore`:
what survives a restart, written as it changes, and rebuilt at boot.

Durable (as in RabbitMQ, https://www.rabbitmq.com/docs/queues#durability):
vhosts, users, permissions, policies, durable exchanges, durable queues with
their arguments, bindings whose source and destination are both durable
(including the predeclared ``amq.*`` exchanges), and persistent messages
(delivery-mode 2) in durable queues with their properties, redelivered state
and absolute expiry deadline (a TTL keeps running across a restart).  A
durable queue's ``x-expires`` lease restarts at boot.  Transient messages
and non-durable entities are not written.

The store keys (names joined with NUL; records also carry the names, since
names may contain NUL) are defined in :mod:`otter_tx.store.keys`.  Declare
arguments are kept as base64 of their AMQP field-table encoding so every
type tag survives.  What was declared through the Python API before the
store opened is merged in by :mod:`otter_tx.broker.prestart`.
"""

import base64
import gc

from twisted.internet import defer
from twisted.logger import Logger

from otter_tx.amqp.codec import decodeTable, encodeTable
from otter_tx.broker.access import DEFAULT_HASHING
from otter_tx.broker.delayed import DELAYED_TYPE, DelayedExchange
from otter_tx.broker.exchange import Exchange, destinationKind
from otter_tx.broker.message import Message
from otter_tx.broker.paging import StoredRun
from otter_tx.broker.policy import OperatorPolicy
from otter_tx.broker.queue import UNACKED
from otter_tx.store import keys

log = Logger()


def tableToText(table):
    """A field table as base64 text (lossless for every AMQP type)."""
    return base64.b64encode(encodeTable(table or {})[4:]).decode("ascii")


def textToTable(text):
    """The inverse of :func:`tableToText`."""
    raw = base64.b64decode(text)
    return decodeTable(raw, 0, len(raw))


class Journal:
    """
    Writes broker changes to ``store`` and rebuilds the broker from it.

    :param broker: the :class:`~otter_tx.broker.broker.Broker`.
    :param store: an opened ``IMessageStore``.
    """

    def __init__(self, broker, store):
        self.broker = broker
        self.store = store
        self.clock = broker.clock
        # {queue: {storeId: QueueEntry}}: persistent entries delivered and not
        # removed yet (UNACKED, or READY again after a requeue), for purged()
        self._held = {}
        #: the store's optional one-call addMessage + enqueue (``enqueueMessage``
        #: of :class:`~otter_tx.store.sqlite.writer.SQLiteStore` and the log
        #: store), or None
        self._enqueueMessage = getattr(store, "enqueueMessage", None)
        #: store key -> (record, [RecoveredMessage]): the entries recovered for the pseudo-queue
        #: entities marked ``"kept"``, for the layer that wrote them (the cluster's copies of other
        #: nodes' delayed messages, otter_tx/cluster/delayedrepl.py)
        self.kept = {}

    # --- keys ------------------------------------------------------------------

    @staticmethod
    def queueKey(queue):
        """
        The store key of ``queue``: ``vhost NUL name`` (kept on the queue:
        it is needed up to three times per persistent message).
        """
        key = queue.journalKey
        if key is None:
            key = queue.journalKey = keys.queueKey(queue.vhost.name, queue.name)
        return key

    # --- entity changes --------------------------------------------------------

    def entityChanged(self, kind, vhost, obj, deleted):
        """Broker listener: persist durable entity changes."""
        store = self.store
        if kind == "vhost":
            key = obj.name
            if deleted:
                store.deleteEntity("vhost", key)
            else:
                store.putEntity("vhost", key, {} if obj.limits is None else {"limits": obj.limits})
        elif kind == "user":
            if deleted:
                store.deleteEntity("user", obj.name)
            else:
                store.putEntity(
                    "user",
                    obj.name,
                    dict({"salt": obj.salt, "hash": obj.passwordHash, "tags": obj.tags,
                          "algorithm": obj.hashingAlgorithm},
                         **({"limits": self.broker.userLimits[obj.name]}
                            if obj.name in self.broker.userLimits else {})),
                )
        elif kind == "permission":
            user, vh = obj
            key = keys.permissionKey(user, vh)
            perms = self.broker.permissions.get(obj)
            if deleted or perms is None:
                store.deleteEntity("permission", key)
            else:
                configure, write, read = perms
                store.putEntity("permission", key, {"configure": configure, "write": write, "read": read,
                                                    "names": [user, vh]})
        elif kind == "global_parameter":
            if deleted or obj not in self.broker.globalParameters:
                store.deleteEntity("global_parameter", obj)
            else:
                store.putEntity("global_parameter", obj, {"value": self.broker.globalParameters[obj]})
        elif kind in ("policy", "operator_policy"):
            key = keys.policyKey(vhost.name, obj.name)
            if deleted:
                store.deleteEntity(kind, key)
            else:
                store.putEntity(kind, key, obj.asDict())
        elif kind == "exchange":
            if not obj.durable or obj.name == "" or obj.name.startswith("amq."):
                return
            key = keys.exchangeKey(vhost.name, obj.name)
            if deleted:
                store.deleteEntity("exchange", key)
                if obj.delayed:
                    store.deleteEntity("queue", obj.storeKey())
            else:
                if obj.delayed:
                    self.idsReserved(obj)
                store.putEntity(
                    "exchange",
                    key,
                    {"type": obj.type, "autoDelete": obj.autoDelete, "internal": obj.internal,
                     "arguments": tableToText(obj.arguments), "names": [vhost.name, obj.name]},
                )
        elif kind == "queue":
            if not obj.durable:
                return
            key = self.queueKey(obj)
            if deleted:
                self._held.pop(obj, None)
                store.deleteEntity("queue", key)
            else:
                store.putEntity(
                    "queue", key, {"autoDelete": obj.autoDelete, "arguments": tableToText(obj.arguments),
                                   "names": [obj.vhost.name, obj.name]}
                )
        elif kind == "binding":
            source, dest, routingKey, arguments = obj
            if not (source.durable and dest.durable):
                return
            destKind = destinationKind(dest)
            args = tableToText(arguments)
            key = keys.bindingKey(vhost.name, source.name, destKind, dest.name, routingKey, args)
            if deleted:
                store.deleteEntity("binding", key)
            else:
                store.putEntity(
                    "binding",
                    key,
                    {"source": source.name, "destinationKind": destKind, "destination": dest.name,
                     "routingKey": routingKey, "arguments": args, "vhost": vhost.name},
                )

    # --- message changes (called by durable queues) ----------------------------

    def sync(self):
        """
        A Deferred that fires (with None) once everything written so far is
        durable (the store's fsync'd group commit), or fails with
        :class:`~otter_tx.store.interface.StoreFailedError` as
        ``IMessageStore.sync`` does.  Publisher confirms of persistent
        messages wait for it, and so do those of messages appended to a
        stream (``Broker.streams``: its logs' group commits, docs/streams.md).
        """
        streams = self.broker.streams.pending()
        if not streams:
            return self.store.sync()
        return defer.gatherResults([self.store.sync()] + streams, consumeErrors=True).addCallbacks(
            lambda _: None, lambda f: f.value.subFailure)

    def enqueued(self, queue, entry):
        """A persistent message entered durable ``queue``."""
        m = entry.message
        store = self.store
        # the message is given with every enqueue: the message log writes it
        # with each queue's entry (a store that holds it once ignores a
        # repeat); one call where the store offers it (the hot path)
        key = queue.journalKey
        if key is None:
            key = self.queueKey(queue)
        again = m.stored
        m.stored = True
        enqueueMessage = self._enqueueMessage
        if enqueueMessage is not None:
            enqueueMessage(key, m.storeId, entry.seq, self.clock.seconds() * 1000.0, entry.expiresAt,
                           entry.redelivered, m.exchange, m.routingKey, m.propsRaw, m.body, again)
            return
        store.addMessage(m.storeId, m.exchange, m.routingKey, m.propsRaw, m.body, again)
        store.enqueue(key, m.storeId, entry.seq, self.clock.seconds() * 1000.0, entry.expiresAt,
                      entry.redelivered)

    def held(self, exchange, message, seq, fireAt, now=None):
        """
        A durable x-delayed-message exchange is holding ``message`` until
        ``fireAt`` (clock ms); ``now``: the clock's time in ms (float), or
        None to read the clock (the entry's enqueue time in the store).
        """
        store = self.store
        store.addMessage(message.storeId, message.exchange, message.routingKey, message.propsRaw,
                         message.body, message.stored)
        message.stored = True
        if now is None:
            now = self.clock.seconds() * 1000.0
        store.enqueue(exchange.storeKey(), message.storeId, seq, now, fireAt, False)

    def idsReserved(self, exchange):
        """
        Write the record of a durable x-delayed-message exchange's held
        messages (a pseudo-queue entity) with the broker ids it has reserved
        (``exchange.idsReserved``), so they are not given again after a
        restart.
        """
        vhost = exchange.vhost
        self.store.putEntity("queue", exchange.storeKey(),
                             {"delayedExchange": True, "names": keys.delayedNames(vhost.name, exchange.name),
                              "idsReserved": exchange.idsReserved})

    def released(self, exchange, message):
        """A held message's delay is over (or it was dropped)."""
        self.store.dequeue(exchange.storeKey(), message.storeId)

    def heldPurged(self, exchange):
        """Every held message of a durable x-delayed-message exchange was dropped (one store call)."""
        self.store.purgeQueue(exchange.storeKey(), ())

    def delivered(self, queue, entry):
        """
        A persistent message was delivered and not acked yet; remembered
        until it is removed, for :meth:`purged`.  Nothing is written: a
        delivery that is acked never needs its redelivered flag on disk.
        After a crash every recovered message comes back redelivered (it
        may have been delivered); a delivered message that goes back to
        its queue, at any time or when the broker stops cleanly and its
        channels close, is marked by :meth:`requeued`.
        """
        held = self._held.get(queue)
        if held is None:
            held = self._held[queue] = {}
        held[entry.message.storeId] = entry

    def requeued(self, queue, entry):
        """
        A delivered persistent message is ready again (basic.reject/nack
        with requeue, basic.recover, its channel closed): it comes back
        redelivered after a restart.
        """
        self.store.markRedelivered(self.queueKey(queue), entry.message.storeId)

    def removed(self, queue, entry):
        """A persistent message left durable ``queue`` for good."""
        storeId = entry.message.storeId
        held = self._held.get(queue)
        if held is not None:
            held.pop(storeId, None)
        key = queue.journalKey
        self.store.dequeue(key if key is not None else self.queueKey(queue), storeId)

    def purged(self, queue, keep=None):
        """
        ``queue.purge`` of durable ``queue`` (AMQP 0-9-1 queue.purge: the
        ready messages go, unacknowledged ones stay): remove exactly its
        READY entries from the store with one ``purgeQueue`` call, whose
        cost does not depend on the queue's length (the durable store
        drops the entries in the background; ``docs/storage.md``).  Call
        it instead of :meth:`removed` per purged entry.

        :param keep: iterable of the storeIds of the queue's persistent
            entries that are delivered and not yet settled; ``None`` (the
            default): the entries :meth:`delivered` reported that are still
            UNACKED (requeued ones are READY again and go).
        """
        if keep is None:
            held = self._held.pop(queue, None)
            if held:
                held = {i: e for i, e in held.items() if e.state == UNACKED}
                if held:
                    self._held[queue] = held
            keep = list(held) if held else ()
        self.store.purgeQueue(self.queueKey(queue), keep)

    # --- boot ----------------------------------------------------------------------

    def recover(self, state):
        """
        Rebuild the broker from a ``RecoveredState``; the restored durable
        queues and delayed exchanges get this journal.  Returns True on a
        first boot (no stored vhost).  Called by
        :meth:`Broker.attachJournal <otter_tx.broker.broker.Broker.attachJournal>`
        before the journal listens for changes (nothing is written back).
        """
        broker = self.broker
        ents = state.entities
        firstBoot = not ents.get("vhost")
        if not firstBoot:
            for name, rec in ents.get("vhost", {}).items():
                broker.addVHost(name).limits = (rec or {}).get("limits")
            for name in list(broker.vhosts):
                if name not in ents["vhost"]:
                    broker.vhosts.pop(name)
            users = ents.get("user", {})
            if users:
                broker.users.clear()
                for name, rec in users.items():
                    # an older store's "loopbackOnly" flag is ignored: the rule goes by name
                    u = broker.addUser(name, None, rec.get("tags", ()))
                    u.salt, u.passwordHash = rec["salt"], rec["hash"]
                    u.hashingAlgorithm = rec.get("algorithm", DEFAULT_HASHING)
                    if rec.get("limits"):
                        broker.userLimits[name] = dict(rec["limits"])
            broker.permissions.clear()
            for key, rec in ents.get("permission", {}).items():
                user, vh = keys.names(key, rec, 2)
                broker.permissions[(user, vh)] = (rec["configure"], rec["write"], rec["read"])
        for name, rec in ents.get("global_parameter", {}).items():
            broker.globalParameters[name] = rec["value"]
        for key, rec in ents.get("operator_policy", {}).items():
            vh = broker.vhosts.get(rec["vhost"])
            if vh is not None:
                vh.operatorPolicies[rec["name"]] = OperatorPolicy(
                    rec["name"], rec["pattern"], rec["definition"], rec.get("priority", 0),
                    rec.get("apply-to", "all"), vh.name)
        for key, rec in ents.get("policy", {}).items():
            vh = broker.vhosts.get(keys.vhostOf(key, rec))
            if vh is not None and rec["name"] not in vh.policies:
                broker.setPolicy(vh.name, rec["name"], rec["pattern"], rec["definition"],
                                 rec.get("priority", 0), rec.get("apply-to", "all"))
        for key, rec in ents.get("exchange", {}).items():
            vhName, name = keys.names(key, rec, 2)
            vh = broker.vhosts.get(vhName)
            if vh is None:
                continue
            cls = DelayedExchange if rec["type"] == DELAYED_TYPE else Exchange
            ex = vh.exchanges[name] = cls(
                vh, name, rec["type"], True, rec["autoDelete"], rec["internal"],
                textToTable(rec["arguments"]),
            )
            if ex.delayed:
                ex.journal = self
        queues = {}
        delayed = {}
        for key, rec in ents.get("queue", {}).items():
            if rec.get("kept"):
                self.kept[key] = (rec, [])
                continue
            if rec.get("delayedExchange"):
                _, vhName, name = keys.names(key, rec, 3)
                vh = broker.vhosts.get(vhName)
                ex = vh.exchanges.get(name) if vh is not None else None
                if ex is not None and ex.delayed:
                    delayed[key] = ex
                    ex.restoreIds(rec.get("idsReserved", 0))
                continue
            vhName, name = keys.names(key, rec, 2)
            vh = broker.vhosts.get(vhName)
            if vh is None:
                continue
            q = vh.declareQueue(name, None, durable=True, autoDelete=rec["autoDelete"],
                                arguments=textToTable(rec["arguments"]))
            q.journal = self
            queues[key] = q
        for key, rec in ents.get("binding", {}).items():
            vh = broker.vhosts.get(keys.vhostOf(key, rec))
            if vh is None:
                continue
            src = vh.exchanges.get(rec["source"])
            if rec["destinationKind"] == "queue":
                dest = vh.queues.get(rec["destination"])
            else:
                dest = vh.exchanges.get(rec["destination"])
            if src is not None and dest is not None:
                vh.bind(src, dest, rec["routingKey"], textToTable(rec["arguments"]))
        # no cyclic garbage collection while a million messages and queue
        # entries are made (its full passes over them would add seconds)
        collecting = gc.isenabled()
        gc.disable()
        try:
            maxId = self._restoreMessages(state, queues, delayed)
        finally:
            if collecting:
                gc.enable()
        broker.reserveMessageIds(maxId)
        log.info("{summary}", summary=state.summary())
        return firstBoot

    def _restoreMessages(self, state, queues, delayed):
        """
        Put the recovered messages back into their queues (and delayed
        exchanges) in seq order; returns the highest storeId.

        ``state.messages`` holds one iterable per queue that the store may
        read lazily (:class:`~otter_tx.store.sqlite.SQLiteStore` reads a row
        at a time); each entry is restored as it is read and nothing here
        keeps it, so with :meth:`Queue.restore <otter_tx.broker.queue.Queue.restore>`
        paging beyond the queue's memory budget, recovering a backlog of
        any size costs bounded memory (issue 8).  For the same reason a
        message held by several queues becomes one :class:`Message` per
        queue (equal content; the store still holds it once, and acking it
        in one queue removes only that queue's entry).  Decoded properties
        are shared between messages with identical property bytes (most
        messages of a queue have the same few properties; nothing changes a
        message's ``props`` in place, dead-lettering and the delayed exchange
        copy them), which makes the broker's part of recovering 1M messages
        about twice as fast (``bench/store_purge_bench.py recover``).
        """
        propsCache = {}
        maxId = 0
        for qkey, recs in state.messages.items():
            q = queues.get(qkey)
            ex = delayed.get(qkey) if q is None else None
            if q is None and ex is None:
                kept = self.kept.get(qkey)
                if kept is not None:
                    kept[1].extend(recs)
                    maxId = max([maxId] + [r.storeId for r in kept[1]])
                continue
            restore = q.restore if q is not None else None
            # a deep classic queue: once it pages, the rest stays in the
            # message log (paged without being read or copied)
            pagedRanges = getattr(recs, "pagedRanges", None)
            if q is None or q.quorum or q.ready.maxPriority:
                pagedRanges = None
            ready = q.ready if q is not None else None
            for r in recs:
                storeId = r.storeId
                raw = r.propsRaw
                props = propsCache.get(raw)
                if props is None:
                    m = Message(r.exchange, r.routingKey, raw, r.body)
                    if len(propsCache) < 4096:
                        propsCache[raw] = m.props
                else:
                    m = Message(r.exchange, r.routingKey, raw, r.body, props)
                m.storeId = storeId
                m.stored = True
                if storeId > maxId:
                    maxId = storeId
                if restore is not None:
                    restore(m, r.seq, r.expiresAtMs, r.redelivered)
                    if pagedRanges is not None and ready.pagedCount:
                        ranges = pagedRanges()
                        if ranges is not None:
                            for rng in ranges:
                                q.restoreStored(StoredRun(rng))
                            maxId = max(maxId, recs.maxStoreId())
                            break
                        pagedRanges = None
                else:
                    ex.restore(m, r.seq, r.expiresAtMs, r.redelivered)
        return maxId

    def writeAll(self):
        """
        First boot: write the vhosts, users, permissions, policies and
        global parameters the broker was configured with.
        """
        b = self.broker
        for vh in b.vhosts.values():
            self.entityChanged("vhost", vh, vh, False)
            for p in vh.policies.values():
                self.entityChanged("policy", vh, p, False)
            for p in vh.operatorPolicies.values():
                self.entityChanged("operator_policy", vh, p, False)
        for u in b.users.values():
            self.entityChanged("user", None, u, False)
        for name in b.globalParameters:
            self.entityChanged("global_parameter", None, name, False)
        for key in b.permissions:
            self.entityChanged("permission", None, key, False)

