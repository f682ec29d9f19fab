"""
The journal's merge of what was declared before the store opened: an
embedder may declare vhosts, users, permissions, policies, exchanges,
queues and bindings through the Python API between constructing
``OtterService`` and ``startService``, before the store has recovered.

:class:`PreStartRecorder` listens to the broker from construction until
recovery and keeps the last change of every entity; when the store has
recovered, :meth:`PreStartRecorder.attachJournal` merges those changes with
the recovered state (the declarations win: their vhosts stay, their
exchanges are not replaced, their queues take the stored messages),
attaches the journal (:meth:`Broker.attachJournal
<otter_tx.broker.broker.Broker.attachJournal>`), deletes the stored
entities a declaration superseded, and writes the declarations (or applies
the deletions) as if they had been made afterwards.  The store keys are
those of :mod:`otter_tx.store.keys`.
"""

from twisted.logger import Logger

from otter_tx.broker.durability import tableToText
from otter_tx.broker.exchange import destinationKind, isExchange
from otter_tx.store import keys
from otter_tx.store.interface import RecoveredState

log = Logger()

#: the order in which the merged changes are written (a queue after its
#: vhost, a binding after its exchange and queue)
_ORDER = ("vhost", "user", "permission", "policy", "exchange", "queue", "binding")


class PreStartRecorder:
    """
    Broker listener installed from construction until recovery: remembers
    the last change of every entity declared, changed or deleted through
    the Python API before ``startService`` so it can be merged with what
    the store recovers and then written (:meth:`attachJournal`).

    :param broker: the :class:`~otter_tx.broker.broker.Broker`; the
        recorder adds itself to its listeners.
    :ivar events: ``{recordKey: (kind, vhost, obj, deleted)}`` in the order
        of each entity's last change.
    """

    def __init__(self, broker):
        self.broker = broker
        self.events = {}
        broker.listeners.append(self)

    def __call__(self, kind, vhost, obj, deleted):
        key = self.key(kind, vhost, obj)
        self.events.pop(key, None)
        self.events[key] = (kind, vhost, obj, deleted)

    @staticmethod
    def key(kind, vhost, obj):
        """The identity of an entity change: ``(kind, name parts...)`` (a binding's: ``(kind, its store key)``)."""
        if kind in ("vhost", "user"):
            return (kind, obj.name)
        if kind == "permission":
            return (kind,) + tuple(obj)
        if kind == "global_parameter":
            return (kind, obj)
        if kind == "binding":
            source, dest, routingKey, arguments = obj
            return (kind, keys.bindingKey(vhost.name, source.name, destinationKind(dest), dest.name, routingKey,
                                          tableToText(arguments)))
        return (kind, vhost.name, obj.name)

    def attachJournal(self, store, state):
        """
        Stop recording; attach the durability journal to the broker through
        ``store`` (opened) from the recovered ``state`` merged with the
        changes recorded; write them.  Later calls merge nothing.

        :return: the :class:`~otter_tx.broker.durability.Journal`.
        """
        broker = self.broker
        if self in broker.listeners:
            broker.listeners.remove(self)
        actions, state, storeDeletes = self._merge(state)
        journal = broker.attachJournal(store, state)
        for kind, key in storeDeletes:
            store.deleteEntity(kind, key)
        self._replay(journal, actions)
        return journal

    def _merge(self, state):
        """
        Decide what each recorded change means for recovery.  Returns
        ``(actions, state, storeDeletes)``: ``actions`` a list of ``(kind,
        vhost, obj, live, extra)`` in change order; ``state`` a copy of the
        recovered state adjusted so that ``Journal.recover`` keeps the
        objects declared before start (their vhosts stay, their exchanges are
        not replaced, their queues take the stored messages); ``storeDeletes``
        ``(kind, key)`` of stored entities a pre-start declaration supersedes.
        """
        broker = self.broker
        ents = {kind: dict(records) for kind, records in state.entities.items()}
        for kind in _ORDER:
            ents.setdefault(kind, {})
        firstBoot = not ents["vhost"]
        storeDeletes = []
        keepVHosts = set()
        actions = []

        def vhostLive(vh):
            return vh is not None and broker.vhosts.get(vh.name) is vh

        events, self.events = self.events, {}
        for kind, vhost, obj, deleted in events.values():
            extra = None
            if kind == "vhost":
                live = not deleted and broker.vhosts.get(obj.name) is obj
                if live:
                    keepVHosts.add(obj.name)
            elif kind == "user":
                live = not deleted and broker.users.get(obj.name) is obj
            elif kind == "permission":
                extra = broker.permissions.get(tuple(obj))
                live = not deleted and extra is not None
            elif kind == "policy":
                live = not deleted and vhostLive(vhost) and vhost.policies.get(obj.name) is obj
            elif kind == "exchange":
                live = not deleted and vhostLive(vhost) and vhost.exchanges.get(obj.name) is obj
                if live:
                    key = keys.exchangeKey(vhost.name, obj.name)
                    stored = ents["exchange"].pop(key, None)
                    delayedKey = keys.delayedKey(vhost.name, obj.name)
                    if stored is not None and stored.get("type") != obj.type:
                        log.warn("exchange {name!r} in vhost {vhost!r} was declared before start as "
                                 "type {new!r}; the stored one (type {old!r}) is replaced",
                                 name=obj.name, vhost=vhost.name, new=obj.type, old=stored.get("type"))
                    if not obj.durable:
                        if stored is not None:
                            storeDeletes.append(("exchange", key))
                    if delayedKey in ents["queue"] and not (obj.durable and obj.delayed):
                        ents["queue"].pop(delayedKey)
                        storeDeletes.append(("queue", delayedKey))
            elif kind == "queue":
                live = not deleted and vhostLive(vhost) and vhost.queues.get(obj.name) is obj
                if live:
                    key = keys.queueKey(vhost.name, obj.name)
                    stored = ents["queue"].get(key)
                    if stored is not None:
                        if obj.durable:
                            mine = {"autoDelete": obj.autoDelete, "arguments": tableToText(obj.arguments)}
                            if (stored.get("autoDelete"), stored.get("arguments")) != (
                                    mine["autoDelete"], mine["arguments"]):
                                log.warn("queue {name!r} in vhost {vhost!r} was declared before start with "
                                         "other arguments than the stored one; the new declaration wins",
                                         name=obj.name, vhost=vhost.name)
                            ents["queue"][key] = dict(stored, **mine)
                        else:
                            ents["queue"].pop(key)
                            storeDeletes.append(("queue", key))
                    if obj.durable and obj.readyCount:
                        log.warn("{n} message(s) published to durable queue {name!r} before the broker "
                                 "started are kept in memory only", n=obj.readyCount, name=obj.name)
            elif kind == "binding":
                source, dest, _, _ = obj
                live = (not deleted and vhostLive(vhost)
                        and vhost.exchanges.get(source.name) is source
                        and (vhost.queues.get(dest.name) is dest or vhost.exchanges.get(dest.name) is dest))
            else:
                continue
            if live and vhost is not None and kind != "vhost" and vhostLive(vhost):
                keepVHosts.add(vhost.name)
            actions.append((kind, vhost, obj, live, extra))
        if not firstBoot:
            for name in keepVHosts:
                ents["vhost"].setdefault(name, {})
        merged = RecoveredState(ents, state.messages, state.stats, getattr(state, "path", None))
        return actions, merged, storeDeletes

    def _replay(self, journal, actions):
        """Write what was declared before start; apply what was deleted before start."""
        broker = self.broker
        actions = sorted(actions, key=lambda a: _ORDER.index(a[0]))
        for kind, vhost, obj, live, extra in actions:
            if kind == "vhost":
                if live:
                    broker.vhosts[obj.name] = obj
                    journal.entityChanged("vhost", obj, obj, False)
                elif obj.name in broker.vhosts:
                    broker.deleteVHost(obj.name)
                continue
            if kind == "user":
                if live:
                    broker.putUser(obj)
                elif obj.name in broker.users:
                    broker.deleteUser(obj.name)
                continue
            if kind == "permission":
                if live:
                    broker.setPermissions(obj[0], obj[1], *extra)
                else:
                    broker.clearPermissions(*obj)
                continue
            vh = broker.vhosts.get(vhost.name)
            if vh is None:
                continue
            if kind == "policy":
                if live:
                    journal.entityChanged("policy", vh, obj, False)
                elif obj.name in vh.policies:
                    broker.clearPolicy(vh.name, obj.name)
            elif kind == "exchange":
                if live:
                    journal.entityChanged("exchange", vh, obj, False)
                elif obj.name in vh.exchanges and not obj.name.startswith("amq."):
                    vh.deleteExchange(obj.name)
            elif kind == "queue":
                if live:
                    journal.entityChanged("queue", vh, obj, False)
                else:
                    q = vh.queues.get(obj.name)
                    if q is not None:
                        vh.deleteQueue(q)
            elif kind == "binding":
                source, dest, routingKey, arguments = obj
                if live:
                    journal.entityChanged("binding", vh, obj, False)
                else:
                    src = vh.exchanges.get(source.name)
                    table = vh.exchanges if isExchange(dest) else vh.queues
                    dst = table.get(dest.name)
                    if src is not None and dst is not None and src.name:
                        vh.unbind(src, dst, routingKey, arguments)
