"""
Replicated delayed messages (docs/cluster.md, "Replicated delayed
messages"): the held set of a durable ``x-delayed-message`` exchange of a
cluster survives the loss of the node holding it.

- **Leader:** every node is the leader of the messages published on it (its
  own :class:`DelayedExchange <otter_tx.broker.delayed.DelayedExchange>`
  fires them).  Their ids are ``NODE:SEQ`` in a cluster (the exchange's
  ``idPrefix``), so an ``x-delayed-id`` names one message cluster-wide.  The
  exchange's journal is a :class:`DelayedJournal`: each hold, fire, cancel
  and purge is written locally and shipped as ``DELAYED`` frames over the
  link to the node's followers: the next :data:`COPIES` nodes after it in
  name order among those it has a link to.  A publisher confirm of a
  delayed publish waits until those followers answered the link's ``SYNC``
  (their store fsync'd the copy): :class:`DelayedReplication` stands in
  ``message.forwarded`` as a link does (``sync()``, ``refused()``).
- **Followers** keep copies in their store under a key of their own
  (:func:`copyKey`, never the exchange's), so a restart does not fire them.
- **Adoption:** when a node is gone (its link closed, or its lease lapsed),
  each follower holding copies of its messages tries the compare-and-swap
  ``delayed/NODE`` absent (or naming an adopter that is gone too) ->
  ``{"adopter": self}``; the winner holds the copies in its own adopted set,
  fires them when due through its exchange with their original
  ``x-delayed-id`` (marked redelivered when they were due already: the dead
  node may have fired them), and ships them to its own followers (an
  adopter lost in turn is adopted from).  Then every node drops its copies
  of the dead node's messages (``D_FORGET``).
- **A node that returns** finds ``delayed/NODE`` naming an adopter: the held
  messages it had (restored from its store, or held while its links were
  down) were adopted, so it drops them (its timers wait for this check at
  start) and deletes the record.  A message published on it while it was
  cut off and not copied is kept.  Duplicates are possible (at-least-once,
  with the same ``x-delayed-id``): a message that fired on the dead node
  just before its death and whose drop did not reach the followers, or a
  node that was only paused or cut off and fired before it saw the claim.
- **list / cancel / purge** of the management API act on every node
  (:meth:`DelayedReplication.page`, :meth:`cancel`, :meth:`purge`, through
  :meth:`ClusterNode.askAll <otter_tx.cluster.node.ClusterNode.askAll>`).
"""

from urllib.parse import quote

from twisted.internet import defer
from twisted.logger import Logger

from otter_tx.broker.delayed import HeldSet, _swapDelay, heldItem
from otter_tx.broker.expiry import _EPSILON_MS, nowMs
from otter_tx.broker.message import Message
from otter_tx.cluster import wire
from otter_tx.store.keys import delayedKey

log = Logger()

#: followers that hold a copy of each node's held messages (or every other node when fewer)
COPIES = 2
#: seconds a confirm waits for a follower's SYNCED before it goes without it
FOLLOWER_TIMEOUT = 5.0
#: seconds a starting node's held messages wait for its links to every live node (overdue ones
#: must not fire while the queues they route to look down)
LINKS_WAIT = 5.0


def claimKey(node):
    """The metadata key naming the adopter of node ``node``'s held messages."""
    return "delayed/" + quote(node, safe="")


def copyKey(vhostName, exchangeName, leader):
    """
    The store key a follower keeps ``leader``'s held messages of an exchange
    under (a pseudo-queue entity ``{"kept": "delayed-copy", "names": [vhost,
    exchange, leader]}``, which the broker's restore leaves to this module).
    A copy's message is written with its held id in the store's exchange
    field (the exchange is the key's), so the id survives a restart.
    """
    return delayedKey(vhostName, exchangeName) + "\x00copy\x00" + leader


def adoptedKey(vhostName, exchangeName):
    """The store key of the messages of an exchange this node adopted (``"kept": "delayed-adopted"``)."""
    return delayedKey(vhostName, exchangeName) + "\x00adopted"


class DelayedJournal:
    """
    The journal of a durable x-delayed-message exchange in a cluster: the
    node's :class:`Journal <otter_tx.broker.durability.Journal>` (``inner``)
    and the shipping of its held set to the followers.

    :ivar ids: storeId -> held id (``NODE:SEQ``) of the messages it holds.
    """

    def __init__(self, manager, exchange, inner):
        self.manager = manager
        self.exchange = exchange
        self.inner = inner
        prefix = exchange.idPrefix
        self.ids = {m.storeId: prefix + str(seq) for _, seq, m in exchange._set.byId.values()}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def held(self, exchange, message, seq, fireAt, now=None):
        self.inner.held(exchange, message, seq, fireAt, now)
        heldId = exchange.idPrefix + str(seq)
        self.ids[message.storeId] = heldId
        self.manager.shipHold(exchange, heldId, fireAt, message)

    def released(self, exchange, message):
        self.inner.released(exchange, message)
        heldId = self.ids.pop(message.storeId, None)
        if heldId is not None:
            self.manager.shipDrop(exchange, [heldId])

    def heldPurged(self, exchange):
        self.inner.heldPurged(exchange)
        self.ids.clear()
        self.manager.ship(exchange.vhost.name, exchange.name, wire.D_PURGE)

    def sync(self):
        """The store's sync, then the followers' (a cancel or purge answered once they have it)."""
        return self.inner.sync().addCallback(lambda _: self.manager.sync())


class HeldId(str):
    """
    A held id in an adopted set: a str that sorts before any float (the
    HeldSet's ``(due, inf)`` probe meets it when a message is due exactly
    then; ints, the exchange's own ids, compare with floats already).
    """

    __slots__ = ()

    def __lt__(self, other):
        if isinstance(other, float):
            return True
        return str.__lt__(self, other)


class Adopted:
    """The held messages of one exchange this node adopted from nodes that are gone."""

    def __init__(self, manager, vhostName, exchangeName):
        self.manager = manager
        self.vhostName = vhostName
        self.exchangeName = exchangeName
        self.key = adoptedKey(vhostName, exchangeName)
        #: held id -> storeId (under :func:`adoptedKey`)
        self.stored = {}
        #: ids that were due when adopted (the dead node may have fired them)
        self.mayHaveFired = set()
        self.set = HeldSet(manager.node.clock, self._fire)

    def add(self, heldId, message, due, write=True, mayHaveFired=None):
        """Hold ``message`` (``heldId``, due at ``due`` ms); ``write``: to the store too."""
        self.stored[heldId] = message.storeId
        if write:
            self.manager.storeCopy(self.key, {"kept": "delayed-adopted", "names": [self.vhostName, self.exchangeName]},
                                   heldId, due, message, True)
        self.set.add(HeldId(heldId), message, due)
        if mayHaveFired is None:
            mayHaveFired = due <= nowMs(self.manager.node.clock) + _EPSILON_MS
        if mayHaveFired:
            self.mayHaveFired.add(heldId)

    def remove(self, heldId):
        entry = self.set.remove(heldId)
        if entry is None:
            return False
        self._forget([heldId])
        return True

    def _forget(self, ids):
        store = self.manager.store()
        for heldId in ids:
            self.mayHaveFired.discard(heldId)
            found = self.stored.pop(heldId, None)
            if found is not None and store is not None:
                store.dequeue(self.key, found)
        self.manager.shipDrop(None, ids, self.vhostName, self.exchangeName)

    def purge(self):
        n = self.set.clear()
        self._forget(list(self.stored))
        return n

    def _fire(self, entries):
        again = [e[1] in self.mayHaveFired for e in entries]
        self._forget([e[1] for e in entries])
        vh = self.manager.node.broker.vhosts.get(self.vhostName)
        ex = vh.exchanges.get(self.exchangeName) if vh is not None else None
        if ex is None or not ex.delayed or ex.deleted:
            return
        copies = 0
        for (_, heldId, message), redelivered in zip(entries, again):
            out = _swapDelay(message, heldId)
            vh.broker.nextMessageId(out)
            for q in vh.route(ex, out, out.routingKeys()):
                q.enqueue(out, None, redelivered)
                copies += 1
        log.info("cluster: {node} fired {n} adopted delayed messages of exchange {x} ({c} routed)",
                 node=self.manager.node.name, n=len(entries), x=self.exchangeName, c=copies)


class DelayedReplication:
    """The replicated delayed messages of one :class:`ClusterNode <otter_tx.cluster.node.ClusterNode>`."""

    def __init__(self, node):
        self.node = node
        self.broker = node.broker
        #: the nodes that get this node's held messages (names)
        self.followers = []
        #: leader name -> {(vhost name, exchange name): {held id: (due, Message)}}
        self.copies = {}
        #: (vhost name, exchange name) -> Adopted
        self.adopted = {}
        self._seq = 0
        #: the store keys this node has a copy or adopted pseudo-queue entity for
        self._entities = set()
        #: (vhost name, exchange name) -> (the exchange's last id, the adopted ids) when this
        #: node's links went down: what a claim on this node's messages may have adopted
        self.marks = {}
        self.started = False
        self._checking = None
        #: nodes whose link went down (not waited for by a confirm until linked again)
        self.down = set()
        node.handlers.update({
            "delayed.list": self._answerList,
            "delayed.cancel": self._answerCancel,
            "delayed.purge": self._answerPurge,
        })
        self.broker.listeners.append(self._entityChanged)
        for vh in self.broker.vhosts.values():
            for ex in vh.exchanges.values():
                if ex.delayed:
                    self.attach(ex)
                    # restored held messages wait for the claim check at start (they may
                    # have been adopted by another node while this one was down)
                    ex._set._frozen = True
                    ex._set._cancel()
        self._restore()

    def _restore(self):
        """The copies and adopted messages this node's store held at boot (the journal's ``kept``)."""
        kept = getattr(self.broker.journal, "kept", None) or {}
        store = self.store()
        now = self.node.clock.seconds() * 1000.0
        for key, (rec, recs) in list(kept.items()):
            kind, names = rec.get("kept"), rec.get("names") or []
            if kind == "delayed-copy" and len(names) == 3:
                v, name, leader = names
            elif kind == "delayed-adopted" and len(names) == 2:
                (v, name), leader = names, None
            else:
                continue
            kept.pop(key, None)
            ex = self._exchange(v, name)
            if ex is None or not ex.durable:
                if store is not None:
                    store.deleteEntity("queue", key)
                continue
            self._entities.add(key)
            if leader is not None:
                copies = self.copies.setdefault(leader, {}).setdefault((v, name), {})
            else:
                adopted = self.adopted.get((v, name))
                if adopted is None:
                    adopted = self.adopted[(v, name)] = Adopted(self, v, name)
                    adopted.set._frozen = True
            for r in recs:
                m = Message(name, r.routingKey, r.propsRaw, r.body)
                m.storeId = r.storeId
                m.stored = True
                self._seq = max(self._seq, r.seq)
                due = r.expiresAtMs if r.expiresAtMs is not None else now
                if leader is not None:
                    copies[r.exchange] = (due, m)
                else:
                    # (one due before now may have fired before the stop)
                    adopted.add(r.exchange, m, due, write=False)
            log.info("cluster: {n} {what} delayed messages of exchange {x} restored", n=len(recs), x=name,
                     what="copied" if leader is not None else "adopted")

    def storeCopy(self, key, entity, heldId, due, message, again):
        """Write ``message`` (held id ``heldId``, due ``due``) under ``key``, a kept pseudo-queue."""
        store = self.store()
        if store is None:
            return
        if key not in self._entities:
            self._entities.add(key)
            store.putEntity("queue", key, entity)
        self._seq += 1
        store.addMessage(message.storeId, heldId, message.routingKey, message.propsRaw, message.body, again)
        store.enqueue(key, message.storeId, self._seq, self.node.clock.seconds() * 1000.0, due, False)

    def dropStored(self, key):
        """Every entry under ``key`` (and its entity) gone from the store."""
        store = self.store()
        if key in self._entities:
            self._entities.discard(key)
            if store is not None:
                store.deleteEntity("queue", key)

    def store(self):
        journal = self.broker.journal
        return getattr(journal, "store", None)

    # --- exchanges ---------------------------------------------------------------

    def _entityChanged(self, kind, vhost, obj, deleted):
        if kind != "exchange" or not getattr(obj, "delayed", False):
            return
        if deleted:
            # its held messages go everywhere: adopted ones, and the copies of other nodes' (an
            # exchange made again with the name must not adopt and fire them later)
            found = self.adopted.pop((vhost.name, obj.name), None)
            if found is not None:
                found.set.clear()
            self.dropStored(adoptedKey(vhost.name, obj.name))
            for origin, byExchange in self.copies.items():
                byExchange.pop((vhost.name, obj.name), None)
                self.dropStored(copyKey(vhost.name, obj.name, origin))
            return
        self.attach(obj)

    def attach(self, ex):
        """A delayed exchange of this node: ids ``NODE:SEQ``; a durable one's journal replicates."""
        ex.idPrefix = self.node.name + ":"
        ex.cluster = self
        journal = ex.journal
        if journal is not None and not isinstance(journal, DelayedJournal):
            ex.journal = DelayedJournal(self, ex, journal)

    def _exchanges(self):
        for vh in self.broker.vhosts.values():
            for ex in vh.exchanges.values():
                if ex.delayed and isinstance(ex.journal, DelayedJournal):
                    yield ex

    def _exchange(self, vhostName, name):
        vh = self.broker.vhosts.get(vhostName)
        ex = vh.exchanges.get(name) if vh is not None else None
        return ex if ex is not None and ex.delayed else None

    # --- leader: shipping ------------------------------------------------------------

    def _links(self):
        links = self.node.links
        return [links[f] for f in self.followers if f in links]

    def ship(self, vhostName, exchangeName, op, fields=b""):
        frame = wire.delayed(vhostName, exchangeName, op, fields)
        for link in self._links():
            link.send(frame)

    def _wanted(self):
        """
        How many followers a confirm waits for: :data:`COPIES`, or fewer when
        there are fewer other nodes with a lease whose link did not go down
        (a node starting, not linked yet, is waited for; a dead one is not).
        """
        node = self.node
        return min(COPIES, len([n for n in node.nodes if n != node.name and n not in self.down]))

    def shipHold(self, exchange, heldId, due, message):
        links = self._links()
        if not links and not self._wanted():
            return
        if links:
            frame = wire.delayedHold(exchange.vhost.name, exchange.name, heldId, due, message)
            for link in links:
                link.send(frame)
        # the publisher's confirm waits for the followers as for a link's answer (Session._route)
        if message.forwarded is None:
            message.forwarded = [(self, 0)]
        else:
            message.forwarded.append((self, 0))

    def shipDrop(self, exchange, ids, vhostName=None, exchangeName=None):
        if exchange is not None:
            vhostName, exchangeName = exchange.vhost.name, exchange.name
        if self.followers:
            self.ship(vhostName, exchangeName, wire.D_DROP, wire.strings(ids))

    def refused(self, n):
        """(As a link's: a forward the other node refused.)  Never."""
        return False

    def sync(self, retry=True):
        """
        A Deferred firing once every follower has fsync'd what was shipped to
        it so far; a follower lost (or silent for :data:`FOLLOWER_TIMEOUT`)
        is replaced (the new one gets the snapshot) and synced once more.
        With fewer followers than :meth:`_wanted` (a node still starting),
        it first waits for them, at most :data:`FOLLOWER_TIMEOUT`.
        """
        if len(self._links()) < self._wanted():
            return self._followersUp(self.node.clock.seconds() + FOLLOWER_TIMEOUT).addCallback(
                lambda _: self._syncLinks(retry))
        return self._syncLinks(retry)

    def _followersUp(self, until, d=None):
        node = self.node
        if d is None:
            d = defer.Deferred()
        if len(self._links()) >= self._wanted() or node.clock.seconds() >= until or not node.running:
            d.callback(None)
        else:
            node._later(0.02, self._followersUp, until, d)
        return d

    def _syncLinks(self, retry):
        ds = []
        for link in self._links():
            d = link.sync()
            d.addTimeout(FOLLOWER_TIMEOUT, self.node.clock)
            ds.append(d)
        if not ds:
            return defer.succeed(None)

        def failed(f):
            log.info("cluster: a follower of the delayed messages of {node} did not sync: {why}",
                     node=self.node.name, why=f.value.subFailure.getErrorMessage())
            self._chooseFollowers()
            return self._syncLinks(False) if retry else None

        return defer.gatherResults(ds, consumeErrors=True).addCallbacks(lambda _: None, failed)

    def _snapshot(self, link):
        """Everything this node holds (its own and adopted) to a new follower."""
        me = self.node.name
        link.send(wire.delayed("", "", wire.D_FORGET, wire.string(me)))
        for ex in self._exchanges():
            v, n = ex.vhost.name, ex.name
            prefix = ex.idPrefix
            for due, seq, m in list(ex._set.byId.values()):
                link.send(wire.delayedHold(v, n, prefix + str(seq), due, m))
        for (v, n), adopted in self.adopted.items():
            for due, heldId, m in list(adopted.set.byId.values()):
                link.send(wire.delayedHold(v, n, heldId, due, m))

    def _chooseFollowers(self):
        me = self.node.name
        names = sorted(set(self.node.links) | {me})
        i = names.index(me)
        chosen = (names[i + 1:] + names[:i])[:COPIES]
        new = [f for f in chosen if f not in self.followers]
        self.followers = chosen
        for f in new:
            self._snapshot(self.node.links[f])

    # --- follower ------------------------------------------------------------------------

    def frame(self, link, r):
        """A DELAYED frame from ``link``'s node (the leader of what it names)."""
        vhostName, exchangeName, op = r.string(), r.string(), r.u8()
        leader = link.peer
        if op == wire.D_FORGET:
            self._forget(r.string())
            return
        store = self.store()
        byExchange = self.copies.setdefault(leader, {})
        copies = byExchange.setdefault((vhostName, exchangeName), {})
        key = copyKey(vhostName, exchangeName, leader)
        if op == wire.D_HOLD:
            heldId, due = r.string(), r.f64()
            ex, rk, props, body = r.message()
            m = Message(ex, rk, props, body)
            self.broker.nextMessageId(m)
            m.stored = True
            old = copies.get(heldId)
            copies[heldId] = (due, m)
            if old is not None and store is not None:
                store.dequeue(key, old[1].storeId)
            self.storeCopy(key, {"kept": "delayed-copy", "names": [vhostName, exchangeName, leader]}, heldId, due,
                           m, False)
        elif op == wire.D_DROP:
            for heldId in r.strings():
                e = copies.pop(heldId, None)
                if e is not None and store is not None:
                    store.dequeue(key, e[1].storeId)
        elif op == wire.D_PURGE:
            copies.clear()
            if store is not None:
                store.purgeQueue(key, ())

    def _forget(self, origin):
        """Drop every copy of ``origin``'s messages (it sends a snapshot, or they were adopted)."""
        for (v, n) in self.copies.pop(origin, {}):
            self.dropStored(copyKey(v, n, origin))

    # --- nodes coming and going -------------------------------------------------------------

    def start(self):
        """The node joined: the claim check, then this node's held messages may fire."""
        self.started = True
        d = self._checkClaim(all=True).addCallback(lambda _: self._linksUp(self.node.clock.seconds() + LINKS_WAIT))

        def thaw(_):
            if not self.node.running:
                return
            sets = [a.set for a in self.adopted.values()]
            for vh in self.broker.vhosts.values():
                for ex in vh.exchanges.values():
                    if ex.delayed and not ex.deleted:
                        sets.append(ex._set)
            for s in sets:
                if s._frozen:
                    s._frozen = False
                    if s._chunks:
                        s._schedule(s._chunks[0][0][0])
            # copies restored from the store of nodes that are gone (no lease): adopted now
            for origin in list(self.copies):
                if origin not in self.node.nodes and origin not in self.node.links and self.copies[origin]:
                    self._claim(origin)

        return d.addBoth(thaw)

    def _linksUp(self, until, d=None):
        """A Deferred firing once this node has a link to every node with a record (or at ``until``)."""
        node = self.node
        if d is None:
            d = defer.Deferred()
        if not node.running:
            return d  # (stopped: its held messages stay frozen)
        if all(n in node.links for n in node.nodes) or node.clock.seconds() >= until:
            d.callback(None)
        else:
            # (a call the node cancels when it stops)
            node._later(0.05, self._linksUp, until, d)
        return d

    def linkUp(self, peer):
        link = self.node.links.get(peer)
        if link is None:
            return
        self.down.discard(peer)
        if peer not in self.followers:
            # (copies it kept of this node's messages from before are stale)
            link.send(wire.delayed("", "", wire.D_FORGET, wire.string(self.node.name)))
        self._chooseFollowers()
        if self.marks and self.started:
            self._checkClaim()

    def nodeDown(self, peer):
        self.down.add(peer)
        if not self.node.running:
            return
        if not self.marks:
            for ex in self._exchanges():
                adopted = self.adopted.get((ex.vhost.name, ex.name))
                self.marks[(ex.vhost.name, ex.name)] = (ex._seq, set(adopted.stored) if adopted is not None else set())
        if peer in self.followers:
            self._chooseFollowers()
        for origin in list(self.copies):
            if origin not in self.node.links and self.copies[origin]:
                self._claim(origin)

    def _claim(self, origin):
        node = self.node
        me = node.name
        key = claimKey(origin)

        def change(rec):
            if origin in node.links or not node.running:
                return None
            if rec is not None and not rec.get("done") and (rec.get("adopter") == me
                                                            or rec.get("adopter") in node.links):
                return None
            return {"node": origin, "adopter": me, "at": int(nowMs(node.clock))}

        def done(result):
            changed, rec, _ = result
            if changed:
                self._adopt(origin)

        d = node.writes.write(key, lambda: node.metadata.update(key, change)).addCallback(done)
        d.addErrback(lambda f: log.failure("claiming the delayed messages of {o}", f, o=origin))
        return d

    def _adopt(self, origin):
        byExchange = self.copies.pop(origin, {})
        n = 0
        for (v, name), copies in byExchange.items():
            key = copyKey(v, name, origin)
            if self._exchange(v, name) is None:
                self.dropStored(key)
                continue
            adopted = self.adopted.get((v, name))
            if adopted is None:
                adopted = self.adopted[(v, name)] = Adopted(self, v, name)
            links = self._links()
            for heldId, (due, m) in copies.items():
                # (written under the adopted key, then the copies' entity goes: one group commit)
                adopted.add(heldId, m, due)
                n += 1
                if links:
                    frame = wire.delayedHold(v, name, heldId, due, m)
                    for link in links:
                        link.send(frame)
            self.dropStored(key)
        # the other followers of the dead node drop their copies (they have this node's now)
        forget = wire.delayed("", "", wire.D_FORGET, wire.string(origin))
        for link in list(self.node.links.values()):
            link.send(forget)
        log.info("cluster: {node} adopted {n} delayed messages of {origin}", node=self.node.name, n=n,
                 origin=origin)

    def _checkClaim(self, all=False):
        """
        ``delayed/<this node>`` names an adopter and is not ``done``: the
        held messages (its own and those it had adopted) this node had when
        its links went down (the marks; ``all``: every one, at start) were
        adopted; they are dropped here and the record marked ``done``.  A
        Deferred.
        """
        node = self.node
        key = claimKey(node.name)
        if self._checking is not None:
            # (one at a time: links coming back together would each start one)
            return defer.succeed(None)

        def loaded(result):
            items, _ = result
            rec = dict(items).get(key)
            marks, self.marks = self.marks, {}
            if rec is None or rec.get("done"):
                return None
            n = 0
            for ex in list(self._exchanges()):
                mark = None if all else marks.get((ex.vhost.name, ex.name), (0, set()))
                seqs = [seq for _, seq, _ in list(ex._set.byId.values()) if mark is None or seq <= mark[0]]
                for seq in seqs:
                    n += 1 if ex.cancel(seq) else 0
                adopted = self.adopted.get((ex.vhost.name, ex.name))
                if adopted is not None:
                    for heldId in list(adopted.stored):
                        if mark is None or heldId in mark[1]:
                            n += 1 if adopted.remove(heldId) else 0
            log.info("cluster: {node}'s {n} held delayed messages were adopted by {a}: dropped here",
                     node=node.name, n=n, a=rec.get("adopter"))
            # the adopter told every node to forget their copies of this node's messages: the
            # followers get everything it holds now again
            for link in self._links():
                self._snapshot(link)

            def change(now):
                if now is None or now.get("adopter") != rec.get("adopter") or now.get("at") != rec.get("at"):
                    return None
                return dict(now, done=True)

            # (kept, not deleted: a node restarting later with copies of this one's messages may
            # still find which node adopted them)
            return node.writes.write(key, lambda: node.metadata.update(key, change))

        d = node.metadata.load(key).addCallback(loaded)
        d.addErrback(lambda f: log.failure("checking the claim on {node}'s delayed messages", f, node=node.name))

        def done(_):
            self._checking = None

        d.addBoth(done)
        if not d.called:
            self._checking = d
        return d

    # --- list, cancel, purge across the cluster --------------------------------------------

    def _local(self, vhostName, name, count, dueFrom=None):
        ex = self._exchange(vhostName, name)
        if ex is None:
            return {"items": [], "total": 0, "rank": 0}
        prefix = ex.idPrefix
        own = [(due, prefix + str(seq), m) for due, seq, m in ex._set.page(0, count)]
        adopted = self.adopted.get((vhostName, name))
        total = len(ex._set)
        rank = ex._set.rank(dueFrom) if dueFrom is not None else 0
        if adopted is not None:
            own += adopted.set.page(0, count)
            total += len(adopted.set)
            if dueFrom is not None:
                rank += adopted.set.rank(dueFrom)
        own.sort(key=lambda e: (e[0], e[1]))
        return {"items": [heldItem(*e) for e in own[:count]], "total": total, "rank": rank}

    def _answerList(self, args):
        return self._local(args["vhost"], args["exchange"], args["count"], args.get("due_from"))

    def page(self, ex, page, pageSize, dueFrom=None):
        """
        The page of :meth:`DelayedExchange.heldPage
        <otter_tx.broker.delayed.DelayedExchange.heldPage>` over every
        node's held messages (a Deferred).
        """
        v, name = ex.vhost.name, ex.name

        def ask(count):
            args = {"vhost": v, "exchange": name, "count": count, "due_from": dueFrom}
            local = self._local(v, name, count, dueFrom)
            return self.node.askAll("delayed.list", args).addCallback(
                lambda answers: [local] + [a for _, a in sorted(answers.items()) if isinstance(a, dict)])

        def ranked(answers):
            total = sum(a["total"] for a in answers)
            rank = sum(a["rank"] for a in answers)
            p = min(rank, max(0, total - 1)) // pageSize + 1
            return ask(p * pageSize).addCallback(paged, p)

        def paged(answers, p):
            items = [i for a in answers for i in a["items"]]
            items.sort(key=lambda i: (i["due"], i["id"]))
            return {"items": items[(p - 1) * pageSize:p * pageSize], "total_count": sum(a["total"] for a in answers),
                    "page": p, "page_size": pageSize}

        if dueFrom is not None:
            return ask(0).addCallback(ranked)
        return ask(page * pageSize).addCallback(paged, page)

    def _cancelLocal(self, vhostName, name, heldId=None, messageId=None):
        ex = self._exchange(vhostName, name)
        if ex is None:
            return {"n": 0, "copies": []}
        adopted = self.adopted.get((vhostName, name))
        if heldId is not None:
            # (a cluster's ids are NODE:SEQ: a bare number names no message, not SEQ on every node)
            own = isinstance(heldId, str) and heldId.startswith(ex.idPrefix)
            n = 1 if own and ex.cancel(heldId) else 0
            if adopted is not None and adopted.remove(str(heldId)):
                n += 1
            match = lambda hid, m: hid == str(heldId)  # noqa: E731
        else:
            n = ex.cancelMessageId(messageId)
            if adopted is not None:
                for seq in adopted.set.withMessageId(messageId):
                    n += 1 if adopted.remove(seq) else 0
            match = lambda hid, m: (m.props or {}).get("message_id") == messageId  # noqa: E731
        # copies of a node that is gone and not adopted yet
        gone = []
        store = self.store()
        for origin, byExchange in self.copies.items():
            if origin in self.node.links:
                continue
            copies = byExchange.get((vhostName, name)) or {}
            for hid in [h for h, (_, m) in copies.items() if match(h, m)]:
                _, m = copies.pop(hid)
                gone.append(hid)
                if store is not None:
                    store.dequeue(copyKey(vhostName, name, origin), m.storeId)
        return {"n": n, "copies": gone}

    def _synced(self, ex, result):
        journal = ex.journal if ex is not None else None
        if journal is None:
            return result
        return journal.sync().addCallback(lambda _: result)

    def _answerCancel(self, args):
        v, name = args["vhost"], args["exchange"]
        result = self._cancelLocal(v, name, args.get("id"), args.get("message_id"))
        return self._synced(self._exchange(v, name), result)

    def cancel(self, ex, heldId=None, messageId=None):
        """Cancel on every node (by id or by ``message_id``): a Deferred of how many were held."""
        v, name = ex.vhost.name, ex.name
        local = self._cancelLocal(v, name, heldId, messageId)
        args = {"vhost": v, "exchange": name, "id": heldId, "message_id": messageId}

        def counted(answers):
            results = [local] + [a for a in answers.values() if isinstance(a, dict)]
            n = sum(a["n"] for a in results)
            if not n:
                n = len({h for a in results for h in a["copies"]})
            return n

        d = self.node.askAll("delayed.cancel", args).addCallback(counted)
        return d.addCallback(lambda n: self._synced(ex, n))

    def _purgeLocal(self, vhostName, name):
        ex = self._exchange(vhostName, name)
        if ex is None:
            return 0
        n = ex.purgeHeld()
        adopted = self.adopted.get((vhostName, name))
        if adopted is not None:
            n += adopted.purge()
        store = self.store()
        for origin, byExchange in self.copies.items():
            if origin not in self.node.links and byExchange.pop((vhostName, name), None) and store is not None:
                store.purgeQueue(copyKey(vhostName, name, origin), ())
        return n

    def _answerPurge(self, args):
        v, name = args["vhost"], args["exchange"]
        n = self._purgeLocal(v, name)
        return self._synced(self._exchange(v, name), {"n": n})

    def purge(self, ex):
        """Purge every node's held messages of ``ex``: a Deferred of how many there were."""
        v, name = ex.vhost.name, ex.name
        n = self._purgeLocal(v, name)

        def counted(answers):
            return n + sum(a["n"] for a in answers.values() if isinstance(a, dict))

        d = self.node.askAll("delayed.purge", {"vhost": v, "exchange": name}).addCallback(counted)
        return d.addCallback(lambda total: self._synced(ex, total))


__all__ = ["Adopted", "DelayedJournal", "DelayedReplication", "claimKey", "copyKey"]
