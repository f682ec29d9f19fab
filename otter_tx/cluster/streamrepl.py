"""
Replicated streams (docs/streams.md, "In a cluster"): a stream of a
cluster has members on distinct nodes (``x-initial-cluster-size``, default
every node, as RabbitMQ 3.10), one of them its leader, with the machinery
of the replicated quorum queues (:mod:`otter_tx.cluster.replication`): the
leader, the ``epoch`` and the in-sync set (``online``) live in the stream's
record in etcd and change only by compare-and-swap; a follower joins the
leader of the record's epoch; a confirm waits for every in-sync follower
and a majority; a deposed leader is fenced.

What differs is what is shipped: a stream is its log, so the leader ships
the log's records as it writes them (``REPLICATE`` / ``R_SAPPEND``: each
record with its first offset and timestamp) and a follower appends the
same records at the same offsets to its own :class:`StreamLog
<otter_tx.broker.stream.StreamLog>` (its group commits fsync'd before it
answers the link's ``SYNC``).  A follower joining sends where its log ends
and the epoch of its last record; the leader answers where it must cut its
log (the start of the first epoch after that one, from the record's
``stream_epochs`` history, as Kafka's leader epochs) or start again (what
it needs was deleted by retention), then sends what it lacks from its own
log, one bounded read per reactor turn, and once it is level ships it the
live records and adds it to ``online``.  A follower's log serves the
stream's readers on its node (the stream protocol's subscriptions) as
RabbitMQ's replicas do; publishes go to the leader.

Failover is the quorum queues': an in-sync follower wins the epoch-compare
transaction (it holds every confirmed message), records where its epoch
starts, and its log becomes the live stream's.
"""

import json
import os

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from otter_tx.amqp.errors import notFound
from otter_tx.broker.stream import MAX_WRITERS, READ_BYTES, StreamReader, applyRetention
from otter_tx.cluster import wire
from otter_tx.cluster.replication import Replicator
from otter_tx.store.log import segments as _seg

log = Logger()

#: messages one catch-up read ships (at most READ_BYTES bytes), one read per reactor turn
CATCH_UP_MESSAGES = 4096
#: a follower's file naming the epoch of its log's last record
EPOCH_FILE = "epoch"


def isStreamRecord(record):
    """True for the record of a stream queue."""
    args = record.get("arguments") or {}
    return args.get("x-queue-type") == "stream" or args.get("x-queue-type") == ["longstr", "stream"]


def initialClusterSize(arguments, nodes):
    """``x-initial-cluster-size`` (default: every node, as RabbitMQ 3.10), at most ``nodes``."""
    size = arguments.get("x-initial-cluster-size")
    try:
        size = int(size) if size is not None else nodes
    except (TypeError, ValueError):
        size = nodes
    return max(1, min(size, nodes))


def readEpoch(stream):
    """The epoch of the last record of ``stream``'s log (int), 0 when unknown."""
    try:
        with open(os.path.join(stream.directory, EPOCH_FILE)) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def writeEpoch(stream, epoch):
    """Record (durably, before any record of it) that ``stream``'s log goes on in ``epoch``."""
    path = os.path.join(stream.directory, EPOCH_FILE)
    os.makedirs(stream.directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(epoch))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _seg._fsyncDirectory(stream.directory)


def cutPoint(epochs, followerEpoch, followerNext):
    """
    Where a follower whose log ends at ``followerNext`` with a last record
    of ``followerEpoch`` must cut it to agree with a leader whose history is
    ``epochs`` (``[[epoch, first offset], ...]``): the first offset of the
    first epoch after the follower's, when its log goes past it; else None.
    """
    for epoch, start in sorted(epochs or ()):
        if epoch > followerEpoch:
            return start if followerNext > start else None
    return None


class StreamReplicator(Replicator):
    """
    The replication of a stream on its leader: ships the log's records as
    the leader writes them (:meth:`flushed`, called by
    :meth:`StreamLog._flush <otter_tx.broker.stream.StreamLog._flush>`),
    catches joining followers up from the log, and answers
    :meth:`sync` once the in-sync followers hold everything written so far.
    """

    def __init__(self, manager, queue, record):
        Replicator.__init__(self, manager, queue, None, record)
        self.stream = queue.stream
        self.stream.replicator = self
        self.epochs = [list(e) for e in record.get("stream_epochs") or [[record["epoch"], 0]]]
        #: follower -> its catch-up call, while it is not level with the log
        self.catching = {}
        self._waiters = []
        self._syncCall = None
        self._markEpoch()

    def __getattr__(self, name):
        raise AttributeError(name)

    def update(self, record):
        Replicator.update(self, record)
        self.epochs = [list(e) for e in record.get("stream_epochs") or self.epochs]
        self.stream.replicator = self
        self._markEpoch()

    def _markEpoch(self):
        """The log's next records are this epoch's (its ``epoch`` file says so before any is written)."""
        if readEpoch(self.stream) != self.epoch:
            writeEpoch(self.stream, self.epoch)

    # --- the log -------------------------------------------------------------

    def flushed(self, items):
        """
        The log wrote a group commit (``items``: its records, for the
        followers receiving live records; None after a failed write): shipped,
        then one barrier for it and the :meth:`sync` calls waiting; returns
        the barrier (a Deferred firing once the followers in sync hold what
        was shipped so far, or failing as :meth:`sync`).
        """
        if items:
            # (parts: the records' bytes go to each follower's socket as they are)
            parts = wire.streamRecordParts(self.names, self.epoch, items)
            for link in self.joined.values():
                link.sendParts(parts)
        return self._syncNow(True)

    def sync(self):
        """
        A Deferred firing once everything appended so far is on every
        in-sync follower (fsync'd there) and they are a majority; fails with
        :class:`~otter_tx.cluster.replication.NoMajority`.  Calls of one
        reactor turn share one barrier.
        """
        d = defer.Deferred()
        self._waiters.append(d)
        if not self.stream._incoming and self._syncCall is None:
            # nothing left to ship: the barrier at the end of this turn
            self._syncCall = self.manager.node.clock.callLater(0, self._syncNow)
        # (else: after the group commit that ships them, flushed() above)
        return d

    def _syncNow(self, barrier=False):
        if self._syncCall is not None and self._syncCall.active():
            self._syncCall.cancel()
        self._syncCall = None
        if not self._waiters and not barrier:
            return None
        waiters, self._waiters = self._waiters, []
        out = None
        if barrier:
            out = defer.Deferred()
            waiters.append(out)
        d = Replicator.sync(self)

        def done(result):
            for w in waiters:
                if isinstance(result, Failure):
                    w.errback(result)
                else:
                    w.callback(None)

        d.addBoth(done)
        return out

    # --- followers -----------------------------------------------------------

    def join(self, follower, link, args):
        """
        ``follower`` (a member) asks to join: where it must cut or reset its
        log (the answer), then what it lacks and the live records; it is in
        ``online`` once level and synced.
        """
        if follower not in self.members:
            raise notFound("node '%s' is not a member of stream '%s'" % (follower, self.name))
        self._stopCatching(follower)
        self.joined.pop(follower, None)
        stream = self.stream
        nxt = int(args.get("next", 0))
        first = int(args.get("first", 0))
        answer = {"epoch": self.epoch}
        cut = cutPoint(self.epochs, int(args.get("lastEpoch", 0)), nxt)
        if cut is not None:
            answer["truncate"] = cut
            nxt = cut
        if nxt > stream.next:
            # (a deposed leader's records no one else had)
            answer["truncate"] = stream.next
            nxt = stream.next
        if nxt < stream.first or (first > nxt and nxt > 0):
            # what it lacks was deleted by retention here: it starts again where this log starts
            answer["reset"] = stream.first
            nxt = stream.first
        # (after the answer: the follower cuts its log before it takes records)
        self.catching[follower] = (None, self.manager.node.clock.callLater(0, self._catchUp, follower, link, nxt,
                                                                           None))
        return answer

    def _stopCatching(self, follower):
        call = self.catching.pop(follower, None)
        if call is not None:
            reader, c = call
            if c is not None and c.active():
                c.cancel()
            if reader is not None:
                reader.close()

    def _catchUp(self, follower, link, cursor, reader):
        """One bounded read of what ``follower`` lacks, shipped; level: live records from now on."""
        if self.fenced or follower not in self.catching or self.manager.node.links.get(follower) is not link:
            if reader is not None:
                reader.close()
            self.catching.pop(follower, None)
            return
        stream = self.stream
        clock = self.manager.node.clock
        if getattr(link, "paused", False):
            # the link's write buffer is full: no more of the backlog until it drains
            self.catching[follower] = (reader, clock.callLater(0.005, self._catchUp, follower, link, cursor, reader))
            return
        if cursor < stream.committed:
            if reader is None or reader.offset != cursor:
                if reader is not None:
                    reader.close()
                reader = StreamReader(stream, cursor)
            items = reader.readRaw(CATCH_UP_MESSAGES, READ_BYTES)
            out = []
            for offset, n, ts, payload, isBatch in items:
                if isBatch:
                    out.append((1, offset, ts, n, bytes(payload)))
                else:
                    _, _, ts, _, _, ex, rk, props, body = payload
                    out.append((0, offset, ts, 1, _seg.encodedEnq(offset, offset, ts, None, False, bytes(ex),
                                                                  bytes(rk), bytes(props), bytes(body))))
            if out:
                link.send(wire.streamRecords(self.names, self.epoch, out))
                cursor = reader.offset
            elif reader.offset > cursor:
                cursor = reader.offset
            self.catching[follower] = (reader, clock.callLater(0, self._catchUp, follower, link, cursor, reader))
            return
        if cursor == stream.committed and not stream._writing:
            # level: the next group commit ships to it as to the others
            if reader is not None:
                reader.close()
            self.catching.pop(follower, None)
            self.joined[follower] = link
            backend = getattr(self.manager.node.broker, "streamBackend", None)
            if backend is not None:
                # the stream protocol's tracking as it stands (the changes follow as they happen)
                t = backend.tracking.get(self.vhostName, self.name)
            else:
                t = {"sequences": {}, "offsets": {}}
            if t["sequences"] or t["offsets"] or stream.writers:
                # (sequences and writers move as publishes are appended: taken once the
                # follower's log holds what is appended so far)
                link.send(self._trackFrame({"sequences": t["sequences"], "offsets": t["offsets"],
                                            "writers": stream.writers, "upTo": stream.next}))
            epoch = self.epoch

            def synced(_):
                if self.fenced or self.epoch != epoch or self.joined.get(follower) is not link:
                    return None
                return self._changeOnline(add=follower)

            link.sync().addCallback(synced).addErrback(
                lambda f: log.info("cluster: follower {f} of stream {q} not in sync: {why}", f=follower,
                                   q=self.name, why=f.getErrorMessage()))
            return
        # a group commit is being written: after it
        self.catching[follower] = (reader, clock.callLater(0.001, self._catchUp, follower, link, cursor, reader))

    def followerLost(self, follower):
        self._stopCatching(follower)
        return Replicator.followerLost(self, follower)

    def fence(self):
        for follower in list(self.catching):
            self._stopCatching(follower)
        Replicator.fence(self)
        self._syncNow()

    def writerTaken(self, wid, seq):
        """A forwarded publish of writer ``wid`` with ``seq`` was appended: the followers learn it with its record."""
        if self.joined:
            self.tracked({"writers": {wid: seq}, "upTo": self.stream.next})

    def tracked(self, change):
        """The stream protocol's tracking changed (``{"sequences": {...}, "offsets": {...}}``): to the followers."""
        if self.joined:
            frame = self._trackFrame(change)
            for link in self.joined.values():
                link.send(frame)

    def _trackFrame(self, change):
        return wire.replicate(self.names, self.epoch, wire.R_STRACK, wire.blob(json.dumps(change).encode()))


class StreamReplica:
    """
    A follower's copy of one stream: its own :class:`StreamLog
    <otter_tx.broker.stream.StreamLog>` (the registry's, where the stream's
    log would be), appended to as the leader ships records.
    """

    def __init__(self, manager, vhostName, name, record):
        from otter_tx.broker.stream import DEFAULT_SEGMENT_BYTES
        from otter_tx.cluster import metadata as md

        self.manager = manager
        self.vhostName = vhostName
        self.name = name
        self.record = record
        self.epoch = record["epoch"]
        self.leader = record["node"]
        self.joinedEpoch = None
        self.joining = False
        self.isStream = True
        node = manager.node
        args = md.fromJSON(record.get("arguments") or {})
        seg = args.get("x-stream-max-segment-size-bytes")
        self.stream = node.broker.streams.open(node.clock, vhostName, name,
                                               int(seg) if seg else DEFAULT_SEGMENT_BYTES)
        self.lastEpoch = readEpoch(self.stream)
        #: tracking changes of records this log does not hold yet: [(epoch, upTo, change)]
        self.heldTracking = []
        self.retention(args)

    def retention(self, args=None):
        """
        The stream's retention from its arguments (``args``, a dict; None: the
        record's), else the policy that matches it on this node (policies are
        the cluster's, the same on every node), as its leader applies them.
        """
        from otter_tx.cluster import metadata as md

        if args is None:
            args = md.fromJSON(self.record.get("arguments") or {})
        vh = self.manager.node.broker.vhosts.get(self.vhostName)
        effective = vh.effectivePolicy(self.name)[2] if vh is not None else None
        applyRetention(self.stream, args, effective.definition if effective is not None else None,
                       self.name, self.vhostName)

    @property
    def entries(self):
        """(For the quorum queue code paths that count a replica's entries.)"""
        return {}

    def joinArgs(self):
        s = self.stream
        return {"vhost": self.vhostName, "name": self.name, "epoch": self.epoch, "stream": True,
                "next": s.next, "first": s.first, "lastEpoch": self.lastEpoch}

    def joinedWith(self, answer):
        """The leader's answer to the join: cut or restart the log as it says (nothing is being written)."""
        s = self.stream
        self.heldTracking = []
        if "reset" in answer or "truncate" in answer:
            # (records cut: the leader's writers come with its snapshot once this log is level)
            s.writers.clear()
        if "reset" in answer:
            log.info("cluster: stream {q} replica starts again at {o}", q=self.name, o=answer["reset"])
            s.reset(answer["reset"])
        elif "truncate" in answer and answer["truncate"] < s.next:
            log.info("cluster: stream {q} replica cut at {o} (a deposed leader's records)", q=self.name,
                     o=answer["truncate"])
            s.truncate(answer["truncate"])

    def apply(self, epoch, op, r):
        if op == wire.R_SAPPEND:
            items = wire.readStreamRecords(r)
            if epoch != self.lastEpoch and items:
                writeEpoch(self.stream, epoch)
                self.lastEpoch = epoch
            if not self.stream.appendReplicated(items):
                # out of step (a record lost in a race with the join): join again
                log.info("cluster: stream {q} replica out of step at {o} (next {n}): joining again",
                         q=self.name, o=items[0][1], n=self.stream.next)
                self.joinedEpoch = None
                self.manager._maybeJoin(self)
            elif self.heldTracking:
                self._releaseTracking(epoch)
        elif op == wire.R_STRACK:
            change = json.loads(bytes(r.blob()).decode())
            upTo = change.pop("upTo", None)
            if upTo is not None and self.stream.next < upTo:
                # a publisher sequence of records still to come: taken once this log holds them
                self.heldTracking.append((epoch, upTo, change))
                return
            self._take(change)

    def _take(self, change):
        writers = change.pop("writers", None)
        if writers:
            mine = self.stream.writers
            for wid, seq in writers.items():
                if seq > mine.get(wid, 0):
                    mine.pop(wid, None)
                    mine[wid] = seq
            while len(mine) > MAX_WRITERS:
                del mine[next(iter(mine))]
        if change.get("sequences") or change.get("offsets"):
            self.manager.streamTracked(self.vhostName, self.name, change)

    def _releaseTracking(self, epoch):
        """The held tracking changes whose records this log holds now (another epoch's are dropped)."""
        keep = []
        for e, upTo, change in self.heldTracking:
            if e != epoch:
                continue
            if self.stream.next >= upTo:
                self._take(change)
            else:
                keep.append((e, upTo, change))
        self.heldTracking = keep

    def drop(self):
        """This node is no longer a member: the replica's log goes."""
        if not self.stream.deleted:
            self.stream.delete()

    def release(self):
        """This node leads the stream now: the log is the live stream's (kept)."""
