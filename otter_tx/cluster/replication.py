"""
Replicated quorum queues (docs/cluster.md, "Replicated quorum queues"):
a quorum queue of a cluster has members on distinct nodes
(``x-quorum-initial-group-size``, default 3, or every node when there are
fewer), one of them its leader.  No home-made consensus: which member
leads, the ``epoch`` and the in-sync set (``online``) live in the queue's
record in etcd and change only by compare-and-swap transactions
(:meth:`update <otter_tx.cluster.metadata.MemoryMetadata.update>`), as
Kafka keeps its ISR in ZooKeeper and LavinMQ its in-sync followers in etcd.

- **The leader** is the node holding the live :class:`Queue
  <otter_tx.broker.queue.Queue>`.  Its journal is a :class:`Replicator`:
  every change the queue journals (enqueue, delivery, requeue with its
  delivery count, removal, purge) is written locally and shipped over the
  link as ``REPLICATE`` frames, tagged with the epoch, to every follower
  that joined.  A publisher confirm waits (:meth:`Replicator.sync`,
  through :meth:`Broker.sync <otter_tx.broker.broker.Broker.sync>`, as for a link's answer) until
  every in-sync follower has answered the link's ``SYNC`` (sent once its
  store fsync'd what came before) and the in-sync set is a majority of the
  members.  A follower whose link is lost, or that does not answer within
  :data:`FOLLOWER_TIMEOUT`, is dropped from ``online`` in etcd before the
  confirm goes without it.  Without a majority in sync a confirm waits at
  most :data:`NO_MAJORITY_WAIT` seconds, then the publish is nacked.
- **A follower** holds a :class:`Replica`: the entries, written to its own
  store under the queue's replica key.  It joins the leader of the record's
  epoch with a ``replicaJoin`` request: the leader sends a snapshot
  (``RESET`` and every entry) and then the live changes, and once the
  follower has synced the snapshot adds it to ``online``.  A frame of an
  older epoch is refused (``FENCED``): a deposed leader confirms nothing.
- **Failover:** when the leader's node is gone (its link closes at once on
  SIGKILL; its lease lapses for a paused process), every in-sync follower
  tries the transaction ``epoch == E and node == old leader -> node = self,
  epoch = E + 1, online = [self]``; one wins, turns its replica into the
  live queue (messages that were delivered and not settled come back
  redelivered with their delivery count + 1) and the others join it.
"""

import os

from twisted.internet import defer
from twisted.logger import Logger

from otter_tx.amqp import spec
from otter_tx.amqp.errors import AMQPError, notFound
from otter_tx.broker.message import Message
from otter_tx.broker.queue import UNACKED
from otter_tx.cluster import metadata as md
from otter_tx.cluster import wire
from otter_tx.cluster.remote import LinkLost
from otter_tx.store import keys
from otter_tx.store.interface import StoreFailedError

log = Logger()

#: seconds an in-sync follower may take to answer a SYNC before it is dropped from ``online``
FOLLOWER_TIMEOUT = 5.0
#: seconds a confirm waits for a majority of the members to be in sync before its nack
NO_MAJORITY_WAIT = 10.0
#: seconds between a follower's attempts to join its leader
JOIN_RETRY = 0.5
#: seconds before a follower whose store failed tries to join again
STORE_RETRY = 5.0


class NoMajority(StoreFailedError):
    """
    A replicated quorum queue could not get a majority of its members to
    hold a message (confirms become nacks); ``NoMajority(text)``.
    """

    def __init__(self, text):
        self.path = None
        self.reason = text
        Exception.__init__(self, text)


def groupSize(arguments, nodes):
    """``x-quorum-initial-group-size`` (default 3), at most ``nodes`` (int), at least 1."""
    size = arguments.get("x-quorum-initial-group-size", 3)
    try:
        size = int(size)
    except (TypeError, ValueError):
        size = 3
    return max(1, min(size, nodes))


def isReplicated(record):
    """True for the record of a quorum queue with more than one member."""
    return len(record.get("members") or ()) > 1


def majority(members):
    return len(members) // 2 + 1


def replicaKey(vhostName, name):
    """The store key a follower keeps a queue's replica under (never a queue's own key)."""
    return keys.queueKey(vhostName, name) + "\x00replica"


class Replicator:
    """
    The journal of a replicated quorum queue on its leader: the node's
    :class:`Journal <otter_tx.broker.durability.Journal>` (``inner``) and
    the replication to the followers.

    :ivar epoch: the leader epoch (int) of the record this node leads.
    :ivar members: node names (list of str).  :ivar online: the in-sync ones.
    :ivar joined: follower name -> link, those that receive the live changes.
    :ivar live: seq -> QueueEntry, every entry not removed (for snapshots).
    """

    def __init__(self, manager, queue, inner, record):
        self.manager = manager
        self.queue = queue
        self.inner = inner
        self.vhostName = queue.vhost.name
        self.name = queue.name
        self.names = wire.string(self.vhostName) + wire.string(queue.name)
        self.key = md.queueKey(self.vhostName, queue.name)
        self.epoch = record["epoch"]
        self.members = list(record["members"])
        self.online = list(record.get("online") or [manager.node.name])
        self.joined = {}
        self.live = {}
        self.fenced = False
        self._changes = []  # online changes in flight (a confirm waits for them)
        self._majorityWaiters = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def update(self, record):
        """``record`` (this node's, a newer one) names the epoch, members and in-sync ones now."""
        self.epoch = record["epoch"]
        self.members = list(record["members"])
        self.online = list(record.get("online") or [self.manager.node.name])
        self.fenced = False

    # --- the queue's journal -------------------------------------------------

    def _send(self, frame):
        for link in self.joined.values():
            link.send(frame)

    def enqueued(self, queue, entry):
        self.inner.enqueued(queue, entry)
        self.live[entry.seq] = entry
        # the publisher's confirm waits for this queue's followers as for a link's answer
        # (Session._route: message.forwarded; Broker.sync calls sync() below)
        m = entry.message
        if m.forwarded is None:
            m.forwarded = [(self, 0)]
        else:
            m.forwarded.append((self, 0))
        if self.joined:
            self._send(wire.replicateEnqueue(self.names, self.epoch, entry.seq, entry.expiresAt, entry.returns,
                                             entry.redelivered, entry.message))

    def delivered(self, queue, entry):
        self.inner.delivered(queue, entry)
        if self.joined and not entry.returns:
            self._send(wire.replicate(self.names, self.epoch, wire.R_DLV, wire._Q.pack(entry.seq)))

    def requeued(self, queue, entry):
        self.inner.requeued(queue, entry)
        if self.joined:
            self._send(wire.replicate(self.names, self.epoch, wire.R_RET,
                                      wire._Q.pack(entry.seq) + wire._U32.pack(entry.returns)))

    def removed(self, queue, entry):
        self.inner.removed(queue, entry)
        self.live.pop(entry.seq, None)
        if self.joined:
            self._send(wire.replicate(self.names, self.epoch, wire.R_DEL, wire.seqs((entry.seq,))))

    def purged(self, queue, keep=None):
        self.inner.purged(queue, keep)
        self.live = {s: e for s, e in self.live.items() if e.state == UNACKED}
        if self.joined:
            self._send(wire.replicate(self.names, self.epoch, wire.R_PURGE, wire.seqs(list(self.live))))

    def dlxHeld(self, queue, messages, reason):
        """``messages`` went into the at-least-once dead-letter buffer (HeldDeadLetters.hold)."""
        if self.joined:
            for m in messages:
                self._send(self._holdFrame(m, reason))

    def _holdFrame(self, message, reason):
        return wire.replicate(self.names, self.epoch, wire.R_HOLD, wire.string(reason) + wire.messagePart(message))

    def dlxRetried(self, queue):
        """The buffer's messages are dead-lettered again; those no queue takes are held again."""
        if self.joined:
            self._send(wire.replicate(self.names, self.epoch, wire.R_UNHOLD))

    # --- followers -----------------------------------------------------------

    def info(self):
        """``leader``, ``members``, ``online`` as RabbitMQ's queue JSON has them."""
        return {"leader": self.manager.node.name, "members": list(self.members), "online": list(self.online)}

    def join(self, follower, link):
        """
        ``follower`` (a member) asked to join: the snapshot, then the live
        changes; a Deferred firing once it holds the snapshot durably and is
        in ``online``.
        """
        if follower not in self.members:
            raise notFound("node '%s' is not a member of queue '%s'" % (follower, self.name))
        self.joined[follower] = link
        out = [wire.replicate(self.names, self.epoch, wire.R_RESET)]
        for seq in sorted(self.live):
            e = self.live[seq]
            out.append(wire.replicateEnqueue(self.names, self.epoch, seq, e.expiresAt, e.returns,
                                             e.redelivered or e.state == UNACKED, e.message))
        for m, reason in self.queue.heldDeadLetters.messages or ():
            out.append(self._holdFrame(m, reason))
        for frame in out:
            link.send(frame)
        epoch = self.epoch

        def synced(_):
            if self.fenced or self.epoch != epoch or self.joined.get(follower) is not link:
                raise AMQPError(spec.INTERNAL_ERROR, "leadership of queue '%s' changed" % (self.name,))
            return self._changeOnline(add=follower)

        def lost(f):
            f.trap(StoreFailedError)  # the link went (LinkLost) before the follower synced
            raise AMQPError(spec.INTERNAL_ERROR, "follower %s of queue '%s' lost" % (follower, self.name))

        return link.sync().addCallback(synced).addCallback(lambda _: {"epoch": epoch}).addErrback(lost)

    def _changeOnline(self, add=None, drop=None):
        node = self.manager.node
        epoch = self.epoch

        def change(rec):
            if rec is None or rec.get("node") != node.name or rec.get("epoch") != epoch:
                return None
            online = list(rec.get("online") or [])
            if add is not None and add not in online:
                online.append(add)
            elif drop is not None and drop in online:
                online.remove(drop)
            else:
                return None
            return dict(rec, online=online)

        def done(result):
            changed, rec, _ = result
            if rec is None or rec.get("node") != node.name or rec.get("epoch") != epoch:
                self.fence()
                return
            self.online = list(rec.get("online") or [])
            self._checkMajority()

        return node.writes.write(self.key, lambda: node.metadata.update(self.key, change)).addCallback(done)

    def followerLost(self, follower):
        """
        ``follower``'s link closed, it stopped answering or its store failed:
        out of ``joined`` and ``online`` (in etcd before any confirm that
        goes without it: :meth:`sync` waits for the change).
        """
        self.joined.pop(follower, None)
        if follower in self.online:
            self.online.remove(follower)
            d = self._changeOnline(drop=follower).addErrback(
                lambda f: log.failure("dropping {f} from {q}", f, f=follower, q=self.name))
            self._changes.append(d)
            d.addBoth(lambda r: (self._changes.remove(d) if d in self._changes else None, r)[1])
            return d
        return defer.succeed(None)

    def fence(self):
        """A newer epoch leads: nothing more is confirmed here."""
        if not self.fenced:
            self.fenced = True
            log.warn("cluster: {node} is no longer the leader of quorum queue {q} (epoch {e})",
                     node=self.manager.node.name, q=self.name, e=self.epoch)
        self._checkMajority()

    def _checkMajority(self):
        if self.fenced or len(self.online) >= majority(self.members):
            waiters, self._majorityWaiters = self._majorityWaiters, []
            for d in waiters:
                if not d.called:
                    d.callback(None)

    def refused(self, n):
        """(As a link's: a forward the other node refused.)  Never: a failed barrier fails the sync."""
        return False

    def sync(self):
        """
        A Deferred firing once everything shipped so far is fsync'd on every
        in-sync follower and the in-sync set is a majority; fails with
        :class:`NoMajority` (the confirms become nacks).
        """
        ds = []
        me = self.manager.node.name
        for follower in list(self.online):
            if follower == me:
                continue
            link = self.joined.get(follower)
            if link is None:
                # in sync by the record, but not receiving this leader's changes: out first
                ds.append(self.followerLost(follower))
            else:
                ds.append(self._followerSync(follower, link))
        d = defer.gatherResults(ds, consumeErrors=True) if ds else defer.succeed(None)
        return d.addCallback(self._afterSyncs)

    def _followerSync(self, follower, link):
        d = link.sync()
        d.addTimeout(FOLLOWER_TIMEOUT, self.manager.node.clock)

        def lost(f):
            log.info("cluster: follower {f} of quorum queue {q} out of sync: {why}", f=follower, q=self.name,
                     why=f.getErrorMessage())
            if self.joined.get(follower) is link:
                return self.followerLost(follower)
            return None

        return d.addErrback(lost)

    def _afterSyncs(self, _):
        if self._changes:
            # a follower is being dropped from the in-sync set: in etcd first
            return defer.gatherResults(list(self._changes), consumeErrors=True).addBoth(self._afterSyncs)
        if self.fenced:
            raise NoMajority("%s: no longer the leader of quorum queue '%s'" % (self.manager.node.name, self.name))
        if len(self.online) >= majority(self.members):
            return None
        d = defer.Deferred()
        self._majorityWaiters.append(d)
        d.addTimeout(NO_MAJORITY_WAIT, self.manager.node.clock)

        def checked(result):
            if self.fenced or len(self.online) < majority(self.members):
                raise NoMajority("quorum queue '%s' in vhost '%s' has %d of %d members in sync" % (
                    self.name, self.vhostName, len(self.online), len(self.members)))
            return None

        return d.addBoth(checked)


class Replica:
    """
    A follower's copy of one replicated quorum queue: ``entries`` (seq ->
    ``[message, expiresAt, returns, redelivered]``, in seq order), written
    to this node's store under :func:`replicaKey`.
    """

    def __init__(self, manager, vhostName, name, record):
        self.manager = manager
        self.vhostName = vhostName
        self.name = name
        self.key = replicaKey(vhostName, name)
        self.record = record
        self.epoch = record["epoch"]
        self.leader = record["node"]
        self.entries = {}
        #: the leader's at-least-once dead-letter buffer: ``[(message, reason)]`` (memory only)
        self.held = []
        #: the epoch this replica joined (holds a snapshot of), or None
        self.joinedEpoch = None
        self.joining = False
        journal = manager.node.broker.journal
        self.store = journal.store
        # what this node's store kept of it before a restart: the copy it may lead from when the
        # old leader never comes back (the journal's ``kept``: a pseudo-queue entity marked so)
        kept = getattr(journal, "kept", {}).pop(self.key, None)
        if kept is not None:
            for rec in sorted(kept[1], key=lambda rec: rec.seq):
                m = Message(rec.exchange, rec.routingKey, rec.propsRaw, rec.body)
                m.storeId = rec.storeId
                m.stored = True
                self.entries[rec.seq] = [m, rec.expiresAtMs, 1 if rec.redelivered else 0, bool(rec.redelivered)]
        else:
            self.store.putEntity("queue", self.key, {"kept": "quorum-replica", "names": [vhostName, name]})

    def apply(self, epoch, op, r):
        store = self.store
        if op == wire.R_ENQ:
            seq, expiresAt, returns, redelivered = r.u64(), r.f64(), r.u32(), r.u8()
            ex, rk, props, body = r.message()
            m = Message(ex, rk, props, body)
            self.manager.node.broker.nextMessageId(m)
            m.stored = True
            if expiresAt < 0:
                expiresAt = None
            self.entries[seq] = [m, expiresAt, returns, bool(redelivered)]
            store.addMessage(m.storeId, ex, rk, props, body, False)
            store.enqueue(self.key, m.storeId, seq, self.manager.node.clock.seconds() * 1000.0, expiresAt,
                          bool(redelivered))
        elif op == wire.R_DEL:
            for seq in r.seqs():
                e = self.entries.pop(seq, None)
                if e is not None:
                    store.dequeue(self.key, e[0].storeId)
        elif op == wire.R_DLV:
            e = self.entries.get(r.u64())
            if e is not None:
                e[3] = True
        elif op == wire.R_RET:
            e = self.entries.get(r.u64())
            returns = r.u32()
            if e is not None:
                e[2] = returns
                e[3] = True
        elif op == wire.R_PURGE:
            keep = set(r.seqs())
            self.entries = {s: e for s, e in self.entries.items() if s in keep}
            store.purgeQueue(self.key, [e[0].storeId for e in self.entries.values()])
        elif op == wire.R_HOLD:
            reason = r.string()
            ex, rk, props, body = r.message()
            self.held.append((Message(ex, rk, props, body), reason))
        elif op == wire.R_UNHOLD:
            self.held = []
        elif op == wire.R_RESET:
            self.entries = {}
            self.held = []
            store.purgeQueue(self.key, ())
            self.epoch = epoch
            self.joinedEpoch = epoch

    def drop(self):
        """This node is no longer a member (or leads it now): the replica goes from the store."""
        self.entries = {}
        self.held = []
        self.store.deleteEntity("queue", self.key)


class ReplicationManager:
    """The replicated quorum queues of one :class:`ClusterNode <otter_tx.cluster.node.ClusterNode>`."""

    def __init__(self, node):
        self.node = node
        #: (vhost name, queue name) -> Replicator (this node leads) / Replica (it follows)
        self.leading = {}
        self.replicas = {}
        #: (vhost name, queue name) -> the last record of a replicated queue
        self.records = {}
        node.broker.listeners.append(self._entityChanged)

    def _entityChanged(self, kind, vhost, obj, deleted):
        if kind in ("policy", "operator_policy"):
            # a stream's followers keep the retention its leader keeps (StreamReplica.retention)
            for (vhostName, _), replica in list(self.replicas.items()):
                if vhostName == vhost.name and getattr(replica, "isStream", False):
                    replica.retention()

    # --- leader ----------------------------------------------------------------

    def lead(self, queue, record):
        """``queue`` (a local Queue) is the leader of ``record``: its journal replicates."""
        if getattr(queue, "stream", None) is not None:
            return self._leadStream(queue, record)
        rep = queue.journal
        if isinstance(rep, Replicator):
            rep.update(record)
        else:
            rep = Replicator(self, queue, queue.journal, record)
            queue.journal = rep
        self.leading[(queue.vhost.name, queue.name)] = rep
        if [n for n in rep.online if n != self.node.name and n not in rep.joined]:
            # (a leader starting again: its followers join it anew)
            for n in list(rep.online):
                if n != self.node.name and n not in rep.joined:
                    rep.followerLost(n)
        return rep

    def _leadStream(self, queue, record):
        from otter_tx.cluster.streamrepl import StreamReplicator

        key = (queue.vhost.name, queue.name)
        rep = self.leading.get(key)
        if isinstance(rep, StreamReplicator) and rep.stream is queue.stream:
            rep.update(record)
        else:
            rep = StreamReplicator(self, queue, record)
        self.leading[key] = rep
        for n in list(rep.online):
            if n != self.node.name and n not in rep.joined:
                rep.followerLost(n)
        return rep

    def join(self, link, args):
        """A follower's ``replicaJoin`` request (a Deferred of ``{"epoch": E}``)."""
        rep = self.leading.get((args["vhost"], args["name"]))
        if rep is None or rep.fenced or rep.queue.deleted:
            raise notFound("%s does not lead queue '%s' in vhost '%s'" % (self.node.name, args["name"], args["vhost"]))
        if args.get("stream"):
            return rep.join(link.peer, link, args)
        return rep.join(link.peer, link)

    def streamTracked(self, vhostName, name, change):
        """A stream's leader shipped its stream protocol tracking changes: kept here too."""
        backend = getattr(self.node.broker, "streamBackend", None)
        if backend is not None:
            backend.trackingChanged(vhostName, name, change)

    def queueGone(self, vhostName, name):
        self.records.pop((vhostName, name), None)
        rep = self.leading.pop((vhostName, name), None)
        if rep is not None:
            rep.fence()
        replica = self.replicas.pop((vhostName, name), None)
        if replica is not None:
            replica.drop()

    # --- follower -------------------------------------------------------------

    def record(self, vhostName, name, record):
        """
        A quorum queue's record as the mirror has it now: this node follows,
        leads or is not a member.  Returns True when this node should hold
        the live queue (it is the record's leader).
        """
        me = self.node.name
        key = (vhostName, name)
        members = record.get("members") or []
        if record["node"] == me:
            return True
        replica = self.replicas.get(key)
        if me not in members:
            if replica is not None:
                del self.replicas[key]
                replica.drop()
            return False
        if replica is None:
            replica = self.replicas[key] = self._replica(vhostName, name, record)
        replica.record = record
        if record["epoch"] > replica.epoch or replica.leader != record["node"]:
            replica.epoch = record["epoch"]
            replica.leader = record["node"]
            replica.joinedEpoch = None
        self._maybeJoin(replica)
        return False

    def _replica(self, vhostName, name, record):
        from otter_tx.cluster.streamrepl import StreamReplica, isStreamRecord

        if isStreamRecord(record):
            return StreamReplica(self, vhostName, name, record)
        return Replica(self, vhostName, name, record)

    def recovered(self, vhostName, name, record):
        """A Replica of what this node's store kept of the queue (a Replica or None)."""
        from otter_tx.broker.stream import _dirName
        from otter_tx.cluster.streamrepl import StreamReplica, isStreamRecord

        if isStreamRecord(record):
            streams = self.node.broker.streams
            if (vhostName, name) not in streams.logs and not os.path.isdir(
                    os.path.join(streams.directory(), _dirName(vhostName, name))):
                return None
            replica = self.replicas[(vhostName, name)] = StreamReplica(self, vhostName, name, record)
            return replica
        kept = getattr(self.node.broker.journal, "kept", {})
        if replicaKey(vhostName, name) not in kept:
            return None
        replica = self.replicas[(vhostName, name)] = Replica(self, vhostName, name, record)
        return replica

    def _maybeJoin(self, replica):
        if replica.joining or replica.joinedEpoch == replica.epoch:
            return
        link = self.node.links.get(replica.leader)
        if link is None:
            return
        replica.joining = True
        epoch = replica.epoch
        if getattr(replica, "isStream", False):
            # nothing being written when the answer comes (it may cut the log)
            d = replica.stream.sync().addCallback(lambda _: link.ask("replicaJoin", replica.joinArgs()))
        else:
            d = link.ask("replicaJoin", {"vhost": replica.vhostName, "name": replica.name, "epoch": epoch})

        def joined(result):
            replica.joining = False
            if getattr(replica, "isStream", False):
                if replica.stream._writing or replica.stream._incoming:
                    raise AMQPError(spec.INTERNAL_ERROR, "stream replica busy")
                replica.joinedWith(result)
            replica.joinedEpoch = result["epoch"]

        def failed(f):
            replica.joining = False
            if self.replicas.get((replica.vhostName, replica.name)) is replica and self.node.running:
                self.node._later(JOIN_RETRY, self._maybeJoin, replica)

        d.addCallback(joined).addErrback(failed)

    def replicated(self, link, r):
        """A REPLICATE frame from ``link``."""
        vhostName, name, epoch, op = r.string(), r.string(), r.u64(), r.u8()
        replica = self.replicas.get((vhostName, name))
        if replica is None:
            return
        if epoch < replica.epoch or link.peer != replica.leader:
            link.send(wire.frame(wire.FENCED, wire.string(vhostName) + wire.string(name)
                                 + wire._Q.pack(replica.epoch)))
            return
        if op != wire.R_RESET and replica.joinedEpoch != epoch:
            return
        replica.apply(epoch, op, r)

    def followerFailed(self, peer):
        """REPL_FAILED from ``peer``: its store could not hold what it was sent."""
        for rep in list(self.leading.values()):
            if peer in rep.joined or peer in rep.online:
                rep.followerLost(peer)

    def storeFailed(self, leader):
        """This node's store failed while following ``leader``: those replicas join again later."""
        for replica in list(self.replicas.values()):
            if replica.leader == leader:
                replica.joinedEpoch = None
                self.node._later(STORE_RETRY, self._maybeJoin, replica)

    def fencedBy(self, link, r):
        vhostName, name, epoch = r.string(), r.string(), r.u64()
        rep = self.leading.get((vhostName, name))
        if rep is not None and epoch > rep.epoch:
            rep.fence()

    # --- links and nodes -----------------------------------------------------

    def started(self):
        """
        The node joined: a replica whose leader's node is not in the cluster
        (every member was down, the leader has not come back) is taken over
        by an in-sync member from what its store kept.
        """
        for replica in list(self.replicas.values()):
            if replica.leader not in self.node.nodes:
                self.takeOver(replica)

    def linkUp(self, peer):
        for replica in list(self.replicas.values()):
            if replica.leader == peer:
                self._maybeJoin(replica)

    def nodeDown(self, peer):
        """``peer``'s link closed or its lease lapsed: followers lost, leaders to replace."""
        if not self.node.running:
            return
        for rep in list(self.leading.values()):
            if peer in rep.joined or peer in rep.online:
                rep.followerLost(peer)
        for replica in list(self.replicas.values()):
            if replica.leader == peer:
                # (it joins again when the link is back, if no one took over)
                replica.joinedEpoch = None
                self.takeOver(replica)

    def takeOver(self, replica):
        """
        The leader ``replica.leader`` is gone: become the leader if this node
        is in sync, by the epoch-compare transaction; a Deferred.
        """
        node = self.node
        me = node.name
        old, epoch = replica.leader, replica.epoch
        key = md.queueKey(replica.vhostName, replica.name)

        stream = getattr(replica, "stream", None)

        def change(rec):
            if rec is None or rec.get("node") != old or rec.get("epoch") != epoch:
                return None
            if me not in (rec.get("online") or []) or (old in node.links and old in node.nodes):
                # not in sync, or the old leader is back (a killed node's link is gone at once; a
                # paused one's record when its lease lapsed)
                return None
            new = dict(rec, node=me, leader=me, epoch=epoch + 1, online=[me])
            if stream is not None:
                # where this epoch's records start: a follower holding more cuts its log there
                new["stream_epochs"] = list(rec.get("stream_epochs") or [[1, 0]]) + [[epoch + 1, stream.next]]
            return new

        def done(result):
            changed, rec, _ = result
            if changed:
                log.info("cluster: {node} leads quorum queue {q} in vhost {v} (epoch {e}), after {old}",
                         node=me, q=replica.name, v=replica.vhostName, e=rec["epoch"], old=old)
                node.promote(replica, rec)

        if stream is not None:
            # its records durable first: the epoch starts after them
            d = stream.sync().addCallback(lambda _: node.writes.write(key, lambda: node.metadata.update(key, change)))
            d.addCallback(done)
        else:
            d = node.writes.write(key, lambda: node.metadata.update(key, change)).addCallback(done)
        d.addErrback(lambda f: log.failure("taking over quorum queue {q}", f, q=replica.name))
        return d


__all__ = ["NoMajority", "Replica", "ReplicationManager", "Replicator", "groupSize", "isReplicated", "LinkLost"]
