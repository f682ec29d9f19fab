"""
The membership of replicated quorum queues (docs/cluster.md,
"Membership"), as RabbitMQ's ``rabbitmq-queues add_member``,
``delete_member``, ``grow``, ``shrink`` and ``rebalance``, and of
replicated streams, as ``rabbitmq-streams add_replica`` and
``delete_replica`` (docs/streams.md, "In a cluster").

Every change is made by the queue's leader: a request made on another
node goes to it over the link (``qqMembership``, a request registered in
:attr:`ClusterNode.handlers <otter_tx.cluster.node.ClusterNode.handlers>`).
The leader changes the queue's record in etcd by one compare-and-swap that
checks the record still names it at the epoch it read, and then applies
the new record to itself (its own write's watch echo is dropped,
:class:`~otter_tx.cluster.metadata.OrderedWrites`), so its
:class:`~otter_tx.cluster.replication.Replicator` sees the members at
once.  The other nodes see the record through their watch:

- **add**: the node is appended to ``members``; it makes a replica, joins
  the leader (the snapshot) and is added to ``online`` once it synced;
- **delete**: the node leaves ``members`` and ``online`` and drops its
  replica; deleting the leader's own member first hands the leadership to
  an in-sync follower in the same transaction (``epoch + 1``, ``online``
  = ``[new leader]``), which promotes itself; the last member is refused;
- **transfer** (rebalance): ``node`` = an in-sync follower, ``epoch + 1``,
  ``online`` = ``[new leader]``; the old leader demotes itself and joins
  the new one.  Before a transfer the leader waits until the new leader
  has synced everything shipped to it, so every confirmed message is there.

A stream's transfer also records where the new epoch's records start
(``stream_epochs``, after a barrier that puts everything appended so far on
the new leader), so a member holding later records of the old leader cuts
them when it joins.

Errors are :class:`MembershipError` with RabbitMQ's reason atoms
(``node_not_running``, ``last_node``, ``not_found``,
``classic_queue_not_supported``; for streams ``quorum_queue_not_supported``
and ``last_stream_member``, as ``rabbit_stream_queue``) and otter_tx's own
(``no_in_sync_follower``, ``leader_down``).
"""

import re

from twisted.internet import defer
from twisted.logger import Logger

from otter_tx.broker.arguments import QUORUM, STREAM
from otter_tx.cluster import metadata as md
from otter_tx.cluster.remote import LinkLost
from otter_tx.store.interface import StoreFailedError

log = Logger()

#: the link request a node sends a queue's leader
OP = "qqMembership"
#: attempts when the record changed between the read and the compare-and-swap
ATTEMPTS = 5
STRATEGIES = ("all", "even")


class MembershipError(Exception):
    """
    A membership change refused: ``reason`` (RabbitMQ's atom, str) and
    ``text`` (a sentence).
    """

    def __init__(self, reason, text):
        Exception.__init__(self, reason, text)
        self.reason = reason
        self.text = text


def isQuorum(record):
    args = record.get("arguments") or {}
    return args.get("x-queue-type") == QUORUM


def isStream(record):
    args = record.get("arguments") or {}
    return args.get("x-queue-type") == STREAM


class Membership:
    """
    The membership operations of one :class:`ClusterNode
    <otter_tx.cluster.node.ClusterNode>` (``node.membership``); each
    returns a Deferred.
    """

    #: what the operations raise (the management app, which must not import the cluster, catches it so)
    Error = MembershipError
    #: grow's strategies
    strategies = STRATEGIES

    def __init__(self, node):
        self.node = node
        node.handlers[OP] = self._answer

    # --- reading ------------------------------------------------------------

    def running(self):
        """The running nodes: this one and every one with a record and a link (sorted)."""
        n = self.node
        return sorted({n.name} | {p for p in n.nodes if p in n.links})

    def record(self, vhost, name):
        """A Deferred of queue ``name``'s record in etcd (dict), or None."""
        key = md.queueKey(vhost, name)
        return self.node.metadata.load(key).addCallback(
            lambda result: next((v for k, v in result[0] if k == key), None))

    def quorumRecords(self, streams=False):
        """A Deferred of every quorum queue's record (a list of dicts); with ``streams``, every stream's too."""
        return self.node.metadata.load("queues/").addCallback(
            lambda result: [v for _, v in result[0] if isQuorum(v) or (streams and isStream(v))])

    # --- the operations (on any node) --------------------------------------------

    def addMember(self, vhost, name, node, kind=QUORUM):
        """
        ``node`` (a running node, not yet a member) becomes a member of the
        quorum queue (``kind`` ``"quorum"``) or the stream (``"stream"``:
        ``rabbitmq-streams add_replica``); fires with ``"added"`` or
        ``"already"``.
        """
        return self._onLeader("add", vhost, name, node, kind)

    def deleteMember(self, vhost, name, node, kind=QUORUM):
        """``node`` is no longer a member; fires with ``"deleted"`` or ``"not_a_member"``."""
        return self._onLeader("delete", vhost, name, node, kind)

    def transfer(self, vhost, name, node):
        """
        The leadership of a quorum queue or stream goes to ``node`` (an
        in-sync follower); fires with ``"transferred"``.
        """
        return self._onLeader("transfer", vhost, name, node, None)

    @defer.inlineCallbacks
    def grow(self, node, strategy="all", vhostPattern=".*", queuePattern=".*"):
        """
        ``node`` becomes a member of every quorum queue whose vhost and name
        match the patterns (regular expressions, searched as RabbitMQ's
        ``re:run``) and that it is not a member of; with ``strategy``
        ``even``, only of those with an even number of members.  Fires with
        ``[(vhost, name, result or error reason)]``.
        """
        if strategy not in STRATEGIES:
            raise MembershipError("bad_request", "strategy must be one of %s" % (", ".join(STRATEGIES),))
        try:
            vre, qre = re.compile(vhostPattern), re.compile(queuePattern)
        except re.error as e:
            raise MembershipError("bad_request", "invalid pattern: %s" % (e,))
        if node not in self.running():
            raise MembershipError("node_not_running", "node '%s' is not a running cluster node" % (node,))
        records = yield self.quorumRecords()
        out = []
        for rec in records:
            members = rec.get("members") or []
            if node in members or not vre.search(rec["vhost"]) or not qre.search(rec["name"]):
                continue
            if strategy == "even" and len(members) % 2:
                continue
            result = yield self._quiet(self.addMember(rec["vhost"], rec["name"], node))
            out.append((rec["vhost"], rec["name"], result))
        return out

    @defer.inlineCallbacks
    def shrink(self, node):
        """
        ``node``'s member goes from every quorum queue it is a member of and
        not the only one; fires with ``[(vhost, name, result or error reason)]``.
        """
        records = yield self.quorumRecords()
        out = []
        for rec in records:
            members = rec.get("members") or []
            if node not in members or len(members) < 2:
                continue
            out.append((rec["vhost"], rec["name"],
                        (yield self._quiet(self.deleteMember(rec["vhost"], rec["name"], node)))))
        return out

    @defer.inlineCallbacks
    def rebalance(self, vhostPattern=".*", queuePattern=".*"):
        """
        Move leaderships so that each running node leads about as many
        replicated quorum queues and streams as the others: one led by a
        node with more than the fewest goes to an in-sync follower on a
        running node that leads at least two fewer (RabbitMQ's
        ``rabbitmq-queues rebalance all``).  Fires with ``{node: leaders}``
        afterwards.
        """
        vre, qre = re.compile(vhostPattern), re.compile(queuePattern)
        running = self.running()
        records = yield self.quorumRecords(streams=True)
        counts = {n: 0 for n in running}
        for rec in records:
            if rec["node"] in counts:
                counts[rec["node"]] += 1
        moved = True
        rounds = 0
        while moved and rounds < 100:
            moved = False
            rounds += 1
            for rec in sorted(records, key=lambda r: (r["vhost"], r["name"])):
                leader = rec["node"]
                if leader not in counts or not vre.search(rec["vhost"]) or not qre.search(rec["name"]):
                    continue
                candidates = [n for n in rec.get("online") or () if n != leader and n in counts]
                if not candidates:
                    continue
                best = min(candidates, key=lambda n: (counts[n], n))
                if counts[leader] - counts[best] < 2:
                    continue
                result = yield self._quiet(self.transfer(rec["vhost"], rec["name"], best))
                if result == "transferred":
                    counts[leader] -= 1
                    counts[best] += 1
                    rec["node"] = best
                    rec["online"] = [best]
                    moved = True
        return counts

    @staticmethod
    def _quiet(d):
        """A per-queue step of grow/shrink/rebalance: its error's reason instead of a failure."""
        def failed(f):
            f.trap(MembershipError)
            return f.value.reason

        return d.addErrback(failed)

    # --- the leader -----------------------------------------------------------------

    @defer.inlineCallbacks
    def _onLeader(self, action, vhost, name, node, kind=QUORUM):
        n = self.node
        for _ in range(ATTEMPTS):
            rec = yield self.record(vhost, name)
            if rec is None:
                raise MembershipError("not_found", "no queue '%s' in vhost '%s'" % (name, vhost))
            leader = rec["node"]
            if leader == n.name:
                result = yield self._local(action, vhost, name, node, kind)
            else:
                link = n.links.get(leader)
                if link is None:
                    raise MembershipError("leader_down", "the leader of queue '%s' in vhost '%s', node '%s', is down"
                                          % (name, vhost, leader))
                yield n.writes.pending()
                try:
                    answer = yield link.ask(OP, {"action": action, "vhost": vhost, "name": name, "node": node,
                                                 "kind": kind, "revision": n.writes.lastRevision})
                except LinkLost as e:
                    raise MembershipError("leader_down", "the leader of queue '%s' in vhost '%s', node '%s': %s"
                                          % (name, vhost, leader, e))
                result = answer.get("result")
                if "error" in answer:
                    if answer["error"] != "retry":
                        raise MembershipError(answer["error"], answer.get("text", ""))
                    result = "retry"
            if result != "retry":
                return result
        raise MembershipError("changed", "queue '%s' in vhost '%s' kept changing" % (name, vhost))

    def _answer(self, args):
        """Another node's ``qqMembership`` request: done here, as the leader."""
        d = self._local(args["action"], args["vhost"], args["name"], args["node"], args.get("kind", QUORUM))

        def failed(f):
            f.trap(MembershipError)
            return {"error": f.value.reason, "text": f.value.text}

        return d.addCallbacks(lambda result: {"result": result}, failed)

    @defer.inlineCallbacks
    def _local(self, action, vhost, name, target, kind=QUORUM):
        """
        ``action`` on this node, the leader, for a queue of type ``kind``
        (``"quorum"``, ``"stream"``, or None for either: rebalance):
        ``"retry"`` when the record no longer names it (the asking node
        reads it again and asks the new leader) or changed meanwhile.
        """
        n = self.node
        me = n.name
        rec = yield self.record(vhost, name)
        if rec is None:
            raise MembershipError("not_found", "no queue '%s' in vhost '%s'" % (name, vhost))
        stream = isStream(rec)
        if kind == STREAM and not stream:
            # (rabbit_stream_queue:add_replica's answers)
            reason = "quorum_queue_not_supported" if isQuorum(rec) else "classic_queue_not_supported"
            raise MembershipError(reason, "queue '%s' in vhost '%s' is not a stream" % (name, vhost))
        if not isQuorum(rec) and not (stream and kind != QUORUM):
            raise MembershipError("classic_queue_not_supported",
                                  "queue '%s' in vhost '%s' is not a quorum queue" % (name, vhost))
        if rec["node"] != me:
            return "retry"
        epoch = rec.get("epoch", 1)
        members = list(rec.get("members") or [me])
        online = list(rec.get("online") or [me])
        if action == "add":
            if target in members:
                return "already"
            if target not in self.running():
                raise MembershipError("node_not_running", "node '%s' is not a running cluster node" % (target,))
            new = dict(rec, members=members + [target], online=online)
            done = "added"
        elif action == "delete":
            if target not in members:
                return "not_a_member"
            if members == [target]:
                raise MembershipError("last_stream_member" if stream else "last_node",
                                      "node '%s' is the last member of queue '%s' in vhost '%s'"
                                      % (target, name, vhost))
            if target == me:
                # the leader's own member: the leadership goes first, in the same transaction
                heir, start = yield self._heir(vhost, name, rec)
                new = dict(rec, node=heir, leader=heir, epoch=epoch + 1, online=[heir],
                           members=[m for m in members if m != me])
                self._epochStarts(new, rec, start)
            else:
                new = dict(rec, members=[m for m in members if m != target],
                           online=[m for m in online if m != target])
            done = "deleted"
        elif action == "transfer":
            if target == me:
                return "transferred"
            if target not in members:
                raise MembershipError("not_a_member", "node '%s' is not a member of queue '%s'" % (target, name))
            heir, start = yield self._heir(vhost, name, rec, target)
            new = dict(rec, node=heir, leader=heir, epoch=epoch + 1, online=[heir])
            self._epochStarts(new, rec, start)
            done = "transferred"
        else:
            raise MembershipError("bad_request", "unknown membership action %r" % (action,))
        result = yield self._swap(vhost, name, rec, new)
        return done if result else "retry"

    @staticmethod
    def _epochStarts(new, rec, start):
        """A stream's new epoch (``new``'s) starts at offset ``start``: in its ``stream_epochs``."""
        if start is not None:
            new["stream_epochs"] = list(rec.get("stream_epochs") or [[1, 0]]) + [[new["epoch"], start]]

    @defer.inlineCallbacks
    def _heir(self, vhost, name, rec, target=None):
        """
        ``(heir, start)``: the in-sync follower (``target``, or the first
        running one) to take over, once it has synced everything this leader
        shipped to it; for a stream, ``start`` is the offset its log holds
        everything below (every append made before this call, after the
        stream's own barrier), else None.
        """
        n = self.node
        rep = n.replication.leading.get((vhost, name))
        joined = rep.joined if rep is not None else {}
        online = [m for m in rec.get("online") or () if m != n.name]
        candidates = [target] if target is not None else online
        stream = getattr(rep, "stream", None) if rep is not None else None
        for heir in candidates:
            if heir in online and heir in joined and heir in self.running():
                start = None
                try:
                    if stream is not None:
                        start = stream.next
                        # every append so far on every in-sync follower (the heir included)
                        yield rep.sync()
                    yield joined[heir].sync()
                except StoreFailedError:  # (LinkLost: gone meanwhile; NoMajority)
                    continue
                return heir, start
        if target is None:
            text = "no in-sync follower of queue '%s' in vhost '%s' to take over" % (name, vhost)
        else:
            text = "node '%s' is not an in-sync follower of queue '%s' in vhost '%s'" % (target, name, vhost)
        raise MembershipError("no_in_sync_follower", text)

    @defer.inlineCallbacks
    def _swap(self, vhost, name, old, new):
        """The compare-and-swap (same leader, same epoch), then the new record applied here; True when done."""
        n = self.node
        key = md.queueKey(vhost, name)
        me, epoch = n.name, old.get("epoch", 1)

        def change(rec):
            if rec is None or rec.get("node") != me or rec.get("epoch", 1) != epoch:
                return None
            if (rec.get("members") or [me]) != (old.get("members") or [me]):
                return None
            # the in-sync set may have changed meanwhile (a follower joined): keep it, less the deleted
            online = new["online"]
            if new.get("node") == me:
                online = [m for m in rec.get("online") or [me] if m in new["members"]]
            return dict(new, online=online)

        changed, rec, _ = yield n.writes.write(key, lambda: n.metadata.update(key, change))
        if not changed:
            return False
        log.info("cluster: queue {q} in vhost {v}: members {m}, leader {l} (epoch {e})", q=name, v=vhost,
                 m=rec.get("members"), l=rec.get("node"), e=rec.get("epoch"))
        # this node's own write: its watch echo is dropped, so it applies the record itself
        n._queue(vhost, name, rec)
        rep = n.replication.leading.get((vhost, name))
        if rep is not None:
            members = rec.get("members") or []
            for follower in list(rep.joined):
                if follower not in members:
                    del rep.joined[follower]
            if getattr(rep, "stream", None) is None and not rep.live:
                # a queue of one member gaining its first follower: its snapshot needs the entries
                q = rep.queue
                rep.live = {e.seq: e for e in q.readyEntries()}
        return True


__all__ = ["Membership", "MembershipError", "OP", "STRATEGIES", "isQuorum", "isStream"]
