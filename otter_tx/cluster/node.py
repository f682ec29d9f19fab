"""
One node of an otter_tx cluster (docs/cluster.md): :class:`ClusterNode`
joins the metadata store (etcd, or :class:`~otter_tx.cluster.metadata.MemoryMetadata`
in unit tests), mirrors the cluster's queues, exchanges and bindings into
the local :class:`~otter_tx.broker.broker.Broker` (routing stays a local
dictionary lookup), keeps one link to every other node
(:mod:`otter_tx.cluster.link`) and answers what other nodes ask of its
queues.

Rules, as RabbitMQ 4's classic queues: a queue lives on one node (its
home); an exclusive queue on its declaring connection's node, others where
``x-queue-leader-locator`` / the node default (``client-local`` or
``balanced``) puts them.  Declaring a new queue is a create-if-absent
transaction on its key, so two nodes declaring one name at once get
RabbitMQ's answers (one creates it, the other sees it, or gets 406).
Exchanges and bindings are written after the local change (every node sees
them through its watch, milliseconds later).  When a node's link drops, its
exclusive and transient queues are gone everywhere and the consumers of its
queues elsewhere get basic.cancel; its durable queues answer 404 ``home node
'...' of durable queue '...' in vhost '...' is down or inaccessible`` until
it returns.
"""

import heapq
import os
import shutil
from urllib.parse import quote

from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.logger import Logger

from otter_tx.amqp import spec
from otter_tx.amqp.errors import AMQPError, notFound
from otter_tx.broker.arguments import QUORUM, STREAM, queueType
from otter_tx.broker.policy import matchPolicy
from otter_tx.cluster import metadata as md
from otter_tx.cluster import wire
from otter_tx.cluster.entities import KINDS as ENTITY_KINDS
from otter_tx.cluster.entities import PREFIX as ENTITIES
from otter_tx.cluster.entities import Entities
from otter_tx.cluster.link import LinkProtocol, messageFromJSON, messageJSON
from otter_tx.cluster.membership import Membership
from otter_tx.cluster.remote import LinkLost, RemoteQueue, downText
from otter_tx.cluster.delayedrepl import DelayedReplication
from otter_tx.cluster.replication import ReplicationManager, groupSize, isReplicated
from otter_tx.cluster.streamrepl import initialClusterSize

log = Logger()

LOCATORS = ("client-local", "balanced")
#: seconds a request from another node waits for this node's mirror to apply
#: the revision it follows (then it is answered from what the mirror has)
APPLIED_WAIT = 5.0


class ClusterNode:
    """
    :param broker: the local Broker.  :param name: this node's name (str).
    :param metadata: the metadata store (see :mod:`otter_tx.cluster.metadata`).
    :param clock: the reactor (IReactorTime, and IReactorTCP for dialling).
    :param locator: the default queue leader locator (``client-local`` or ``balanced``).
    :param leaseTTL: seconds the node's lease lives without a keep-alive.
    """

    def __init__(self, broker, name, metadata, clock, locator="client-local", leaseTTL=5,
                 advertise="127.0.0.1"):
        if locator not in LOCATORS:
            raise ValueError("queue-leader-locator must be one of %s" % (", ".join(LOCATORS),))
        self.broker = broker
        self.name = name
        self.metadata = metadata
        self.clock = clock
        self.locator = locator
        self.leaseTTL = leaseTTL
        self.advertise = advertise
        self.lease = None
        self.linkPort = None
        self.links = {}
        self._revisionWaiters = []  # heap of (revision, seq, Deferred): requests waiting for the mirror
        self._revisionSeq = 0
        #: op (str) -> callable(args dict) answering other nodes' :meth:`askAll` (JSON-able result)
        self.handlers = {}
        #: links whose write buffer is over its high-water mark (publishers are in flow)
        self._flowLinks = set()
        self.nodes = {}
        self.figures = {}        # node name -> its last figures (dict)
        self.applying = False
        self.running = False
        self._consumers = {}
        self._cid = 0
        self._memberTurn = 0
        self._dialling = set()
        self._figuresCall = None
        self._calls = []
        self.info = {}
        #: every node name seen in the cluster (a stopped node stays listed in /api/nodes)
        self.known = {name}
        self._bindings = {}  # binding key -> record (to unbind on delete events)
        #: objects with beginBatch()/endBatch() (the AMQP door's factory): a link's
        #: frames are handled inside a batch of theirs, so client writes are gathered
        self.batchers = []
        #: callables ``(vhost name, stream name)`` told when a stream on another node is gone
        #: (deleted, or its record dropped): the stream door's publishers of it here
        self.remoteStreamGone = []
        #: this node's writes, in order per key; the watch's echo of them filtered
        self.writes = md.OrderedWrites(metadata, self._applyNow)
        #: replicated quorum queues: the ones this node leads and follows (replication.py)
        self.replication = ReplicationManager(self)
        #: add / delete members of quorum queues, grow, shrink, rebalance (membership.py)
        self.membership = Membership(self)
        #: replicated delayed messages (delayedrepl.py)
        self.delayed = DelayedReplication(self)
        broker.cluster = self

    # --- joining --------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self, linkPort, info=None):
        """
        Join: take a lease, register this node (its link port and ``info``,
        a dict the management API shows), mirror every record, watch for
        changes, and publish the local queues that have no record yet.
        """
        self.linkPort = linkPort
        self.info = dict(info or {})
        #: None while the node holds its lease, else why not (str): it can no longer tell
        #: which nodes are up, so new queues, exchanges and bindings are refused (541)
        self.lost = None
        if hasattr(self.metadata, "onLost"):
            self.metadata.onLost = self._lostMetadata
        self.lease = yield self.metadata.grantLease(self.leaseTTL)
        record = {"name": self.name, "host": self.advertise, "link": linkPort, "lease": self.lease}
        record.update(self.info)
        yield self.metadata.put(md.nodeKey(self.name), record, lease=self.lease)
        items, revision = yield self.metadata.load("")
        self.entities = Entities(self, _logged)
        definitions = [(k, v) for k, v in items if k.startswith(ENTITIES)]
        if not definitions:
            # the first node: its records, all or none (a node killed half-way through one
            # write each left a vhost without its users, and the next node adopted that)
            records = self.entities.collect()
            seeded, seedRevision = yield self.metadata.seed(ENTITIES, records)
            if seeded:
                for k, _ in records:
                    self.writes.ownWrite(k, seedRevision)
            else:
                # another node was first meanwhile: take its records
                self.entities.records.clear()
                items, revision = yield self.metadata.load("")
                definitions = [(k, v) for k, v in items if k.startswith(ENTITIES)]
        self.applying = True
        try:
            if definitions:
                self.entities.adopt(definitions)
        finally:
            self.applying = False
        # (bindings last: the queues and exchanges they join must be mirrored first, and the
        # store lists keys in order, "bindings/" before "queues/")
        self._applyNow(sorted([("put", k, v, revision) for k, v in items if not k.startswith(ENTITIES)],
                              key=lambda e: e[1].startswith("bindings/")))
        self._caughtUp(revision)
        self.metadata.watch("", revision + 1, self._apply)
        self._registerLocal()
        self.broker.listeners.append(self._entityChanged)
        self.running = True
        self.delayed.start()
        self.replication.started()
        self._sweepStreams()
        self._figuresCall = self.clock.callLater(1, self._sendFigures)

    def _sweepStreams(self):
        """
        After the mirror is loaded: this node's copies of streams that are
        gone, or that it is no longer a member of (deleted while it was
        down), are deleted, as RabbitMQ's stream coordinator deletes a
        removed member's data when its node is back.
        """
        streams = getattr(self.broker, "streams", None)
        if streams is None:
            return
        for vhostName, name, path in streams.orphans():
            log.info("cluster: stream {q} in vhost {v} has no member on this node: its copy {p} is deleted",
                     q=name, v=vhostName, p=path)
            gone = "%s.deleted-orphan" % (path,)
            try:
                os.rename(path, gone)
            except OSError:
                continue
            shutil.rmtree(gone, ignore_errors=True)

    def _later(self, seconds, f, *a):
        self._calls = [c for c in self._calls if c.active()]
        self._calls.append(self.clock.callLater(seconds, f, *a))

    def _lostMetadata(self, reason):
        if self.lost is None:
            log.error("cluster: node {node} lost its place in the metadata store: {reason}; it refuses "
                      "declares until it is back (docs/cluster.md)", node=self.name, reason=reason)
            self._later(1, self._rejoin)
        self.lost = reason

    @defer.inlineCallbacks
    def _rejoin(self):
        """
        After a lost lease (etcd unreachable, or this process paused): a new
        lease, the node's record and its queues' records again.
        """
        if not self.running or self.lost is None:
            return
        try:
            self.lease = yield self.metadata.grantLease(self.leaseTTL)
            record = {"name": self.name, "host": self.advertise, "link": self.linkPort, "lease": self.lease}
            record.update(self.info)
            yield self.metadata.put(md.nodeKey(self.name), record, lease=self.lease)
        except Exception as e:
            log.info("cluster: node {node} cannot rejoin yet: {e}", node=self.name, e=e)
            self._later(1, self._rejoin)
            return
        self._registerLocal()
        self.lost = None
        log.info("cluster: node {node} is back in the cluster", node=self.name)

    def updateInfo(self, extra):
        """
        More of this node's ``info`` (dict), known after it joined (its stream
        listener's port, once listening): its record is written again; a
        Deferred.
        """
        self.info.update(extra)
        record = {"name": self.name, "host": self.advertise, "link": self.linkPort, "lease": self.lease}
        record.update(self.info)
        return self.metadata.put(md.nodeKey(self.name), record, lease=self.lease)

    def health(self):
        """None when the node is in the cluster, else the reason (str) for the health checks."""
        return self.lost

    def stop(self):
        """Leave: links closed, the lease revoked (a Deferred)."""
        self.running = False
        if self._figuresCall is not None and self._figuresCall.active():
            self._figuresCall.cancel()
        for c in self._calls:
            if c.active():
                c.cancel()
        self._calls = []
        for link in list(self.links.values()):
            link.transport.loseConnection()
        if self.lease is not None:
            return self.metadata.revokeLease(self.lease).addErrback(lambda f: None)
        return defer.succeed(None)

    def _registerLocal(self):
        for vh in self.broker.vhosts.values():
            for q in list(vh.queues.values()):
                key = md.queueKey(vh.name, q.name)
                self.writes.write(key, lambda key=key, q=q: self.metadata.create(
                    key, self._queueRecord(q), self._leaseFor(q.durable, self.name)))

    def _queueRecord(self, q):
        return {"vhost": q.vhost.name, "name": q.name, "node": self.name, "durable": q.durable,
                "auto_delete": q.autoDelete, "exclusive": q.owner is not None,
                "arguments": md.toJSON(q.arguments), "leader": self.name, "members": [self.name],
                "epoch": 1}

    def _leaseFor(self, durable, home):
        if durable:
            return None
        rec = self.nodes.get(home)
        return rec.get("lease") if rec is not None else (self.lease if home == self.name else None)

    # --- the mirror -------------------------------------------------------------

    def _apply(self, events):
        """The watch's events: those not held back by this node's own writes (OrderedWrites)."""
        accept = self.writes.accept
        self._applyNow([e for e in events if accept(e)])
        if events:
            self._caughtUp(max(e[3] for e in events))

    #: the metadata revision this node's mirror has applied (int)
    appliedRevision = 0

    def _caughtUp(self, revision):
        if revision > self.appliedRevision:
            self.appliedRevision = revision
        waiters = self._revisionWaiters
        while waiters and waiters[0][0] <= self.appliedRevision:
            d = heapq.heappop(waiters)[2]
            if not d.called:  # (one that waited APPLIED_WAIT has been answered)
                d.callback(None)

    def _applied(self, revision):
        """
        A Deferred firing once this node's mirror has applied ``revision``
        (int), or after :data:`APPLIED_WAIT` seconds whatever it has: a
        request from another node that follows that node's metadata writes
        (a queue created right after its vhost was deleted and made again)
        must not be answered from an older mirror.
        """
        if revision <= self.appliedRevision:
            return defer.succeed(None)
        d = defer.Deferred()
        self._revisionSeq += 1
        heapq.heappush(self._revisionWaiters, (revision, self._revisionSeq, d))
        return d.addTimeout(APPLIED_WAIT, self.clock, onTimeoutCancel=lambda result, timeout: None)

    def _applyNow(self, events):
        for kind, key, value, _ in events:
            what, parts = md.splitKey(key)
            try:
                if what == "nodes":
                    self._node(parts[0], value if kind == "put" else None)
                elif what == "queues":
                    self._queue(parts[0], parts[1], value if kind == "put" else None)
                elif what == "exchanges":
                    self._exchange(parts[0], parts[1], value if kind == "put" else None)
                elif what == "bindings":
                    self._binding(parts[0], key, value if kind == "put" else None)
                elif key.startswith(ENTITIES):
                    self.applying = True
                    try:
                        self.entities.apply(key, value if kind == "put" else None)
                    finally:
                        self.applying = False
            except Exception:
                log.failure("applying cluster record {key}", key=key)

    def _node(self, name, record):
        if name == self.name:
            return
        if record is None:
            if self.nodes.pop(name, None) is not None:
                self._nodeDown(name)
                # its lease lapsed (a paused or cut-off node): it is out until it registers again
                link = self.links.get(name)
                if link is not None:
                    link.transport.loseConnection()
            return
        self.nodes[name] = record
        self.known.add(name)
        if name not in self.links and self.name < name:
            self._dial(name)

    def _dial(self, name):
        record = self.nodes.get(name)
        if record is None or name in self.links or name in self._dialling or not self.running and self.lease is None:
            return
        self._dialling.add(name)
        endpoint = TCP4ClientEndpoint(self.clock, record["host"], record["link"], timeout=5)
        d = connectProtocol(endpoint, LinkProtocol(self, dialled=name))

        def failed(f):
            self._dialling.discard(name)
            if name in self.nodes and self.running:
                self._later(0.2, self._dial, name)

        d.addCallbacks(lambda p: self._dialling.discard(name), failed)

    def _vhost(self, name):
        return self.broker.vhosts.get(name)

    def _queue(self, vhostName, name, record):
        vh = self._vhost(vhostName)
        if vh is None:
            return
        moving = ()
        if record is None:
            self.replication.queueGone(vhostName, name)
            rq = vh.remoteQueues.get(name)
            if rq is not None:
                self._dropRemote(vh, rq)
            return
        if isReplicated(record) or (vhostName, name) in self.replication.records:
            # (also a record down to one member: the deleted members drop their replicas)
            self.replication.records[(vhostName, name)] = record
            if self.replication.record(vhostName, name, record):
                q = vh.queues.get(name)
                if q is not None:
                    self.replication.lead(q, record)
                else:
                    replica = self.replication.replicas.get((vhostName, name))
                    if replica is None:
                        # the leader's own copy as its store kept it (killed while it was being
                        # promoted, before the queue itself was written)
                        replica = self.replication.recovered(vhostName, name, record)
                    if replica is not None:
                        # another node gave this one the leadership (a transfer: rebalance,
                        # the old leader's member deleted)
                        self.promote(replica, record)
                return
            q = vh.queues.get(name)
            if q is not None and (q.quorum or getattr(q, "stream", None) is not None):
                # this node led it and another node leads it now (a newer epoch): it follows
                moving = self._demote(vh, q, self.name in (record.get("members") or ()))
        if record["node"] == self.name:
            return
        rq = vh.remoteQueues.get(name)
        if rq is None:
            rq = RemoteQueue(self, vh, name, dict(record, arguments=md.fromJSON(record["arguments"])))
            rq.down = record["node"] not in self.links
            vh.remoteQueues[name] = rq
            # (its bindings whose records came before its own)
            self._rebind(vh, name)
        else:
            moved = rq.home != record["node"]
            rq.update(dict(record, arguments=md.fromJSON(record["arguments"])))
            if moved:
                # a replicated quorum queue's new leader: the consumers here follow it
                rq.down = record["node"] not in self.links
                if not rq.down:
                    if not rq._detached:
                        rq.detach()
                    rq.reattach()
                    rq.unpark()
                elif not rq._detached:
                    rq.detach()
        if moving:
            # the consumers of the local queue this node led, now subscribed at the new leader
            rq = vh.remoteQueues.get(name)
            for consumer, exclusive, resume in moving:
                consumer.queue = rq
                if resume is not None:
                    # a stream consumer: on at the new leader from where it was
                    rq._resume[consumer] = resume
                try:
                    rq.addConsumer(consumer, exclusive)
                except AMQPError:
                    consumer.cancelledByBroker(rq)

    def _rebind(self, vh, name, kinds=("queue",)):
        """
        The bindings (from the mirror) of ``name`` made again locally: those
        whose destination is queue ``name`` (``kinds`` has ``"queue"``), whose
        source is exchange ``name`` (``"source"``), or whose destination is
        exchange ``name`` (``"exchange"``).
        """
        for key, record in list(self._bindings.items()):
            if (("queue" in kinds and record["destination_type"] == "queue" and record["destination"] == name)
                    or ("source" in kinds and record["source"] == name)
                    or ("exchange" in kinds and record["destination_type"] == "exchange"
                        and record["destination"] == name)):
                what, parts = md.splitKey(key)
                if parts[0] == vh.name:
                    self._binding(vh.name, key, record)

    def _demote(self, vh, q, member=True):
        """
        A quorum queue this node led is led elsewhere now: the local queue
        goes (this node's follower joins the new leader; a stream's log
        stays as its copy while this node is still a ``member``, else it is
        deleted too).  Its consumers here are returned (``[(consumer,
        exclusive)]``) to subscribe at the new leader; other nodes'
        consumers are dropped without a cancel (their nodes subscribe them
        at the new leader as they see it).
        """
        led = self.replication.leading.pop((vh.name, q.name), None)
        rep = q.journal
        if hasattr(rep, "fence"):
            rep.fence()
            q.journal = rep.inner
        if getattr(q, "stream", None) is not None:
            # a stream: its log stays, this node's replica now (unless it is no longer a member)
            if led is not None:
                led.fence()
            q.keepStream = member
        moving = []
        for c in list(q.consumers):
            link = getattr(c, "link", None)
            if link is not None:
                link._consumers.pop(c.cid, None)
            else:
                state = getattr(q, "_states", {}).get(c)
                moving.append((c, c is q.exclusiveConsumer, state.reader.offset if state is not None else None))
            q.removeConsumer(c)
        self.applying = True
        try:
            vh.deleteQueue(q)
        finally:
            self.applying = False
        return moving

    def promote(self, replica, record):
        """
        This node won the leadership of ``replica``'s queue (``record``, the
        new epoch's): its replica becomes the live queue.  Messages delivered
        and not settled at the old leader come back redelivered with their
        delivery count + 1; the queue's bindings are made again here.
        """
        vh = self._vhost(replica.vhostName)
        if vh is None:
            return
        self.replication.replicas.pop((replica.vhostName, replica.name), None)
        self.replication.records[(replica.vhostName, replica.name)] = record
        rq = vh.remoteQueues.get(replica.name)
        moving = []
        if rq is not None:
            # this node's consumers of the queue stay subscribed, to the queue here now
            for consumer, cid in list(rq._cids.items()):
                moving.append((consumer, consumer is rq._exclusive, rq._resume.get(consumer)))
                self.consumerGone(cid)
            rq._cids, rq.consumers, rq._backlog, rq._exclusive = {}, [], {}, None
            parked, rq.parked = rq.parked, None
            self._dropRemote(vh, rq)
        else:
            parked = None
        self.applying = True
        try:
            q = vh.declareQueue(replica.name, None, False, True, False, record["auto_delete"],
                                md.fromJSON(record["arguments"]))
        finally:
            self.applying = False
        self.replication.lead(q, record)
        journal = q.journal
        ready = q.ready
        for seq in sorted(replica.entries):
            m, expiresAt, returns, redelivered = replica.entries[seq]
            entry = ready.makeEntry(m, seq, expiresAt, redelivered)
            entry.returns = returns + 1 if redelivered else returns
            q._seq = max(q._seq, seq)
            ready.append(entry)
            if journal is not None:
                journal.enqueued(q, entry)
        for message, reason in getattr(replica, "held", ()):
            # the old leader's at-least-once dead letters no queue had taken yet
            q.heldDeadLetters.hold([message], reason)
        if getattr(replica, "isStream", False):
            replica.release()  # (a stream's log is the live queue's now)
        else:
            replica.drop()
        self._rebind(vh, replica.name)
        if parked is not None and not parked.flushed:
            # publishes made here while the queue had no leader: into it now (a stream's that
            # the old leader had taken and shipped here are not taken twice)
            for message, redelivered in parked.messages:
                writer = rq.writerOf(message) if rq is not None else None
                if writer is not None and getattr(q, "stream", None) is not None:
                    q.enqueueFrom(writer, message)
                else:
                    q.enqueue(message, None, redelivered)
            parked.flush(q.journal.sync())
        for consumer, exclusive, resume in moving:
            consumer.queue = q
            if resume is not None:
                # a stream consumer: on from the offset after the last one it was handed
                q.addConsumer(consumer, exclusive, resumeAt=resume)
            else:
                q.addConsumer(consumer, exclusive)
        q.dispatch()

    def _dropRemote(self, vh, rq):
        if vh.remoteQueues.get(rq.name) is rq:
            del vh.remoteQueues[rq.name]
        self.applying = True
        try:
            for (ex, key, _), args in list(rq.bindings.items()):
                vh._unbind(ex, rq, key, args)
        finally:
            self.applying = False
        rq.shutdown()
        if getattr(rq, "isStream", False):
            for gone in list(self.remoteStreamGone):
                gone(vh.name, rq.name)

    def _exchange(self, vhostName, name, record):
        vh = self._vhost(vhostName)
        if vh is None:
            return
        created = False
        self.applying = True
        try:
            if record is None:
                if name in vh.exchanges:
                    vh.deleteExchange(name)
            elif name not in vh.exchanges:
                vh.declareExchange(name, record["type"], False, record["durable"], record["auto_delete"],
                                   record["internal"], md.fromJSON(record["arguments"]))
                created = True
        finally:
            self.applying = False
        if record is not None and created:
            # a binding of it whose record came first (two keys written at once by another node
            # commit in either order): made now
            self._rebind(vh, name, kinds=("source", "exchange"))

    def _binding(self, vhostName, key, record):
        vh = self._vhost(vhostName)
        if vh is None:
            return
        if record is None:
            record = self._bindings.pop(key, None)
            if record is None:
                return
        else:
            self._bindings[key] = record
        src = vh.exchanges.get(record["source"])
        if record["destination_type"] == "queue":
            dest = vh.findQueue(record["destination"])
        else:
            dest = vh.exchanges.get(record["destination"])
        if src is None or dest is None:
            return
        args = md.fromJSON(record["arguments"])
        self.applying = True
        try:
            if key in self._bindings:
                vh.bind(src, dest, record["routing_key"], args)
            else:
                vh._unbind(src, dest, record["routing_key"], args)
        finally:
            self.applying = False

    # --- local changes -> metadata -------------------------------------------------

    def _entityChanged(self, kind, vhost, obj, deleted):
        if self.applying:
            return
        m = self.metadata
        if kind in ENTITY_KINDS:
            self.entities.changed(kind, vhost, obj, deleted)
            if kind == "vhost" and deleted:
                # its queues, exchanges and bindings go from the cluster's records at once (the
                # queues' home nodes delete their own when they see the vhost go)
                q = quote(vhost.name, safe="")
                for what in ("queues/", "exchanges/", "bindings/"):
                    prefix = "%s%s/" % (what, q)
                    self.writes.writePrefix(prefix, lambda prefix=prefix: m.deletePrefix(prefix)
                                            ).addErrback(_logged, prefix)
        elif kind == "queue":
            if obj.vhost.queues.get(obj.name) is not obj and not deleted:
                return
            key = md.queueKey(vhost.name, obj.name)
            if deleted:
                self.replication.queueGone(vhost.name, obj.name)
                self.writes.write(key, lambda: m.delete(key)).addErrback(_logged, key)
            # creations go through declareQueue's transaction
        elif kind == "exchange":
            key = md.exchangeKey(vhost.name, obj.name)
            if deleted:
                self.writes.write(key, lambda: m.delete(key)).addErrback(_logged, key)
            else:
                record = {"type": obj.type, "durable": obj.durable, "auto_delete": obj.autoDelete,
                          "internal": obj.internal, "arguments": md.toJSON(obj.arguments)}
                self.writes.write(key, lambda: m.put(key, record)).addErrback(_logged, key)
        elif kind == "binding":
            source, dest, routingKey, arguments = obj
            isQueue = hasattr(dest, "consumers")
            dtype = "queue" if isQueue else "exchange"
            key = md.bindingKey(vhost.name, source.name, dtype, dest.name, routingKey, arguments)
            if deleted:
                self._bindings.pop(key, None)
                self.writes.write(key, lambda: m.delete(key)).addErrback(_logged, key)
            else:
                record = {"source": source.name, "destination_type": dtype, "destination": dest.name,
                          "routing_key": routingKey, "arguments": md.toJSON(arguments)}
                self._bindings[key] = record
                lease = None
                if isQueue and not dest.durable:
                    lease = self._leaseFor(False, getattr(dest, "home", self.name))
                self.writes.write(key, lambda: m.put(key, record, lease=lease)).addErrback(_logged, key)

    # --- declares that need the cluster --------------------------------------------

    def locate(self, vhost, name, arguments):
        """
        The home node of a new queue: ``x-queue-leader-locator``, else the
        ``queue-leader-locator`` key of the policy that matches it, else the
        node default (``client-local``: here; ``balanced``: the reachable node
        with the fewest queues).
        """
        locator = arguments.get("x-queue-leader-locator")
        if locator is None:
            policy = matchPolicy(vhost.policies.values(), name, "queues")
            if policy is not None:
                locator = policy.definition.get("queue-leader-locator")
        if locator is None:
            locator = self.locator
        if locator not in ("balanced", "random", "least-leaders"):
            return self.name
        up = [self.name] + sorted(n for n in self.links)
        counts = {n: 0 for n in up}
        for vh in self.broker.vhosts.values():
            counts[self.name] += len(vh.queues)
            for rq in vh.remoteQueues.values():
                if rq.home in counts:
                    counts[rq.home] += 1
        return min(up, key=lambda n: (counts[n], n))

    def _chooseMembers(self, home, size):
        """
        A replicated queue's members: ``home`` first, then reachable nodes
        in turn (new queues spread their followers), ``size(nodes)`` in all
        (``nodes``: how many there are to choose from, int).
        """
        others = sorted(n for n in self.nodes if n != home and n in self.links)
        if home != self.name:
            others = sorted(set(others + [self.name]) - {home})
        count = size(len(others) + 1)
        start = self._memberTurn % len(others) if others else 0
        self._memberTurn += 1
        return [home] + (others[start:] + others[:start])[:count - 1]

    @defer.inlineCallbacks
    def declareQueue(self, vhost, name, connection, durable, exclusive, autoDelete, arguments,
                     serverNamed=False):
        """
        A new queue: the create-if-absent transaction, then the queue at its
        home.  Fires with the Queue or RemoteQueue; the AMQPErrors of
        :meth:`VHost.declareQueue <otter_tx.broker.vhost.VHost.declareQueue>`.
        """
        if self.lost is not None:
            raise AMQPError(spec.INTERNAL_ERROR, "cluster metadata store unreachable: %s" % (self.lost,))
        home = self.name if exclusive else self.locate(vhost, name, arguments)
        record = {"vhost": vhost.name, "name": name, "node": home, "durable": durable and not exclusive,
                  "auto_delete": autoDelete, "exclusive": exclusive, "arguments": md.toJSON(arguments),
                  "leader": home, "members": [home], "epoch": 1}
        kind = queueType(arguments)
        if kind == QUORUM:
            # members on distinct nodes (x-quorum-initial-group-size, default 3); in sync: the
            # leader, until its followers joined (docs/cluster.md, "Replicated quorum queues")
            record["members"] = self._chooseMembers(home, lambda nodes: groupSize(arguments, nodes))
            record["online"] = [home]
        elif kind == STREAM and not exclusive:
            # members on distinct nodes (x-initial-cluster-size, default every node, as RabbitMQ
            # 3.10); the leader's records shipped to them (streamrepl.py)
            record["members"] = self._chooseMembers(home, lambda nodes: initialClusterSize(arguments, nodes))
            record["online"] = [home]
            record["stream_epochs"] = [[1, 0]]
        key = md.queueKey(vhost.name, name)
        try:
            created, current, _ = yield self.writes.write(
                key, lambda: self.metadata.create(key, record, self._leaseFor(record["durable"], home)))
        except Exception as e:
            raise AMQPError(spec.INTERNAL_ERROR, "cluster metadata store unavailable (%s)" % (e,))
        if not created:
            # declared elsewhere meanwhile: answer as for an existing queue
            if current["node"] != self.name:
                self._queue(vhost.name, name, current)
            self.applying = True
            try:
                return vhost.declareQueue(name, connection, False, durable, exclusive, autoDelete, arguments,
                                          serverNamed=serverNamed)
            finally:
                self.applying = False
        if home == self.name:
            self.applying = True
            try:
                q = vhost.declareQueue(name, connection, False, durable, exclusive, autoDelete, arguments,
                                       serverNamed=serverNamed)
            finally:
                self.applying = False
            self.broker.entityChanged("queue", vhost, q)
            if isReplicated(record):
                self.replication.records[(vhost.name, name)] = record
                self.replication.lead(q, record)
            return q
        link = self.links.get(home)
        if link is None:
            raise notFound(downText(home, name, vhost.name))
        # this node's metadata writes still in flight (the vhost a definitions import has just
        # put, the one it deleted before) must be in the revision the home node waits for
        yield self.writes.pending()
        try:
            yield link.ask("create", {"vhost": vhost.name, "name": name, "durable": durable,
                                      "autoDelete": autoDelete, "arguments": md.toJSON(arguments),
                                      "serverNamed": serverNamed, "revision": self.writes.lastRevision})
        except LinkLost:
            raise notFound(downText(home, name, vhost.name))
        self._queue(vhost.name, name, record)
        return vhost.remoteQueues[name]

    def deleteRemote(self, vhost, rq, ifUnused, ifEmpty):
        """queue.delete of a queue on another node: a Deferred firing with its message count."""
        d = rq.remoteDelete(ifUnused, ifEmpty)

        def deleted(n):
            if vhost.remoteQueues.get(rq.name) is rq:
                self._dropRemote(vhost, rq)
            return n

        return d.addCallback(deleted)

    # --- what other nodes ask ---------------------------------------------------

    def localQueue(self, vhostName, name):
        vh = self._vhost(vhostName)
        return vh.queues.get(name) if vh is not None else None

    def forwarded(self, link, vhostName, name, redelivered, message, writer=None):
        q = self.localQueue(vhostName, name)
        if q is None or q.deleted:
            return
        self.broker.nextMessageId(message)
        if writer is not None and getattr(q, "stream", None) is not None:
            # a publish to a replicated stream sent again after a leader change: once only
            return q.enqueueFrom(writer, message)
        return q.enqueue(message, None, redelivered)

    def streamAppended(self, vhostName, name, count, entries):
        """
        A stream protocol publish made on another node to a stream here
        (STREAM_APPEND): appended as the stream door appends (the SYNC that
        follows waits for its fsync).  Returns the stream's replicator when
        it is replicated (the SYNC waits for its followers too), None, or
        False when there is no such stream here (the forward is refused).
        """
        log = getattr(self.localQueue(vhostName, name), "stream", None)
        if log is None or log.deleted:
            return False
        log.appendEntries(entries, count, wantDeferred=False)
        return log.replicator

    def askAll(self, op, args):
        """
        Ask every other node this node has a link to: a Deferred firing with
        ``{node name: result}`` (a node whose link is lost, or that does not
        answer in the link's ask timeout, or that fails, is left out).  The
        other nodes answer with the handler registered under ``op`` in their
        :attr:`handlers` (the management app's, for cluster-wide lists).
        """
        names = sorted(self.links)
        ds = [self.links[name].ask(op, args) for name in names]

        def gathered(results):
            return {name: value for name, (ok, value) in zip(names, results) if ok}

        return defer.DeferredList(ds, consumeErrors=True).addCallback(gathered)

    def answer(self, link, op, args):
        revision = args.pop("revision", None)
        if revision is not None and revision > self.appliedRevision:
            # the asking node wrote metadata this node has not applied yet: answer after it
            return self._applied(revision).addCallback(lambda _: self.answer(link, op, args))
        if op == "replicaJoin":
            return self.replication.join(link, args)
        handler = self.handlers.get(op)
        if handler is not None:
            # a request registered by another layer (the management app's lists)
            return handler(args)
        vh = self._vhost(args["vhost"])
        if vh is None:
            raise notFound("no vhost '%s'" % (args["vhost"],))
        name = args["name"]
        if op == "create":
            self.applying = True
            try:
                q = vh.declareQueue(name, None, False, args["durable"], False, args["autoDelete"],
                                    md.fromJSON(args["arguments"]), serverNamed=args.get("serverNamed", False))
            finally:
                self.applying = False
            self.broker.entityChanged("queue", vh, q)
            record = self.replication.records.get((vh.name, name))
            if record is not None and record["node"] == self.name:
                self.replication.lead(q, record)
            return {"messages": q.readyCount}
        q = vh.queues.get(name)
        if q is None:
            if op == "delete":
                # deleted meanwhile (auto-delete, x-expires): queue.delete of a missing queue is ok
                return {"messages": 0}
            raise notFound("no queue '%s' in vhost '%s'" % (name, vh.name))
        if op == "touch":
            q.touch()
            return {}
        if op == "declare":
            if args["renew"]:
                q.touch()
            return {"messages": q.readyCount, "consumers": q.consumerCount}
        if op == "consumable":
            return {"refused": bool(q.refusesConsumer(args["exclusive"]))}
        if op == "purge":
            return {"messages": q.purge()}
        if op == "delete":
            n = vh.deleteQueue(q, args["ifUnused"], args["ifEmpty"]) or 0
            # answered once the record is gone from etcd: a declare the asking node's client
            # makes next must not find it (a stream redeclared with other arguments)
            return self.writes.settled(md.queueKey(vh.name, name)).addCallback(lambda _: {"messages": n})
        if op == "get":
            entry = q.basicGet(args["noAck"])
            if entry is None:
                return None
            eid = 0 if args["noAck"] else link.outstanding(q, entry)
            message = entry.message if not (entry.returns or q.quorum) else q.deliveredMessage(entry, get=True)
            return messageJSON(message, redelivered=entry.redelivered, eid=eid, remaining=q.readyCount)
        raise AMQPError(spec.NOT_IMPLEMENTED, "unknown link request %r" % (op,))

    messageFromJSON = staticmethod(messageFromJSON)

    # --- consumers on other nodes' queues -----------------------------------------

    def newConsumerId(self, rq, consumer):
        self._cid += 1
        self._consumers[self._cid] = (rq, consumer)
        return self._cid

    def consumerFor(self, cid):
        return self._consumers.get(cid)

    def consumerQueue(self, cid):
        found = self._consumers.get(cid)
        return found[0] if found is not None else None

    def consumerGone(self, cid):
        self._consumers.pop(cid, None)

    def cancelledByHome(self, cid):
        found = self._consumers.get(cid)
        if found is not None:
            found[0].cancelledByHome(cid)

    # --- links --------------------------------------------------------------------

    def linkUp(self, link):
        old = self.links.get(link.peer)
        if old is not None and old is not link:
            old.transport.loseConnection()
        self.links[link.peer] = link
        for vh in self.broker.vhosts.values():
            for rq in vh.remoteQueues.values():
                if rq.home == link.peer:
                    rq.homeUp()
        self.replication.linkUp(link.peer)
        self.delayed.linkUp(link.peer)

    def linkPaused(self, link):
        """
        ``link``'s write buffer is over its high-water mark: the other node
        takes forwards slower than this one's publishers send them.  Every
        AMQP connection here that publishes is then no longer read until it
        drains (RabbitMQ's credit flow), so the buffer, the latency and this
        process's memory stay bounded and the reactor keeps its etcd lease.
        """
        if not self._flowLinks:
            self._setFlow(True)
        self._flowLinks.add(link)

    def linkResumed(self, link):
        """``link``'s write buffer drained: publishers are read again once no link is backed up."""
        if link in self._flowLinks:
            self._flowLinks.discard(link)
            if not self._flowLinks:
                self._setFlow(False)

    def _setFlow(self, on):
        self.broker.linkFlow = on
        for conn in list(self.broker.connections):
            conn.flowChanged(on)

    def linkDown(self, link):
        self.linkResumed(link)
        if self.links.get(link.peer) is link:
            del self.links[link.peer]
            self._nodeDown(link.peer)
            if self.running and link.peer in self.nodes and self.name < link.peer:
                self._later(0.2, self._dial, link.peer)

    def _nodeDown(self, name):
        self.figures.pop(name, None)
        self.replication.nodeDown(name)
        self.delayed.nodeDown(name)
        for vh in self.broker.vhosts.values():
            for rq in list(vh.remoteQueues.values()):
                if rq.home != name:
                    continue
                if rq.exclusive or not rq.durable:
                    self._dropRemote(vh, rq)
                    key = md.queueKey(vh.name, rq.name)
                    self.writes.write(key, lambda key=key: self.metadata.delete(key)).addErrback(lambda f: None)
                else:
                    rq.homeDown()

    def syncs(self, links=None):
        """
        Deferreds (a list) that fire once each of ``links`` (a set of
        :class:`~otter_tx.cluster.link.LinkProtocol`; None: every link that
        forwarded since its last barrier) has answered for everything
        forwarded over it so far; one lost meanwhile fails with ``LinkLost``.
        """
        if links is None:
            return [link.sync() for link in self.links.values() if link._forwarded]
        return [link.sync() for link in links]

    # --- figures --------------------------------------------------------------------

    def _sendFigures(self):
        self._figuresCall = None
        if not self.running:
            return
        queues = {}
        # the stream protocol's subscriptions here, by stream (as the management app lists them,
        # when it runs here): consumers of the stream (RabbitMQ counts them), on this node's
        # replica or leader
        describeSubs = getattr(self.broker, "describeStreamSubscriptions", None)
        subs = describeSubs() if describeSubs is not None else {}
        # the management app's message_stats of a queue (its rates), when it runs here
        queueStats = getattr(self.broker, "describeQueueStats", None)
        for vh in self.broker.vhosts.values():
            for q in vh.queues.values():
                key = "%s\x00%s" % (vh.name, q.name)
                f = queues[key] = {
                    "messages_ready": q.readyCount, "messages_unacknowledged": q.unackedCount,
                    "messages": q.readyCount + q.unackedCount,
                    "consumers": len(q.consumers) + (len(subs.get(key, ())) if q.stream is not None else 0),
                    "policy": q.policy.name if q.policy is not None else None,
                    "message_bytes": q.readyBytes}
                if queueStats is not None:
                    f["message_stats"] = queueStats(q)
        figures = {"queues": queues, "streamSubscriptions": subs}
        describe = getattr(self.broker, "describeNode", None)
        if describe is not None:
            # the management app's own /api/nodes object for this node
            try:
                figures["node"] = describe()
            except Exception:
                log.failure("describing node {node}", node=self.name)
        overview = getattr(self.broker, "describeOverview", None)
        if overview is not None:
            # the management app's connection and channel counts, for other nodes' overviews
            figures["overview"] = overview()
        frame = wire.jsonframe(wire.STATS, figures)
        for link in self.links.values():
            link.send(frame)
        self._figuresCall = self.clock.callLater(1, self._sendFigures)

    def figuresFrom(self, peer, figures):
        self.figures[peer] = figures
        for key, f in figures.get("queues", {}).items():
            vhostName, _, name = key.partition("\x00")
            vh = self._vhost(vhostName)
            if vh is not None:
                rq = vh.remoteQueues.get(name)
                if rq is not None:
                    rq.figures = f


def _logged(f, key):
    log.failure("cluster metadata write {key}", f, key=key)
