"""
Replicated quorum queues (otter_tx/cluster/replication.py) on three
in-process nodes (test_inprocess.ClusterCase: whole brokers, real TCP
links, the in-memory metadata store), driven by pika.
"""

import time

import pika
import pika.exceptions
from twisted.internet.defer import inlineCallbacks

from otter_tx.cluster import metadata as md
from otter_tx.cluster import replication
from otter_tx.test.cluster.test_inprocess import ClusterCase
from otter_tx.test.interop.support import waitOnReactor

QUORUM = {"x-queue-type": "quorum"}


class ReplicatedQuorumTests(ClusterCase):

    def record(self, name="qq"):
        return self.meta.data.get(md.queueKey("/", name))

    def replicaEntries(self, i, name="qq"):
        replica = self.cluster[i].replication.replicas.get(("/", name))
        return None if replica is None else len(replica.entries)

    def publish(self, i, count, name="qq", arguments=QUORUM):
        def run():
            ch = self.conn(i).channel()
            ch.queue_declare(name, durable=True, arguments=arguments)
            ch.confirm_delivery()
            for k in range(count):
                ch.basic_publish("", name, b"m%d" % k, pika.BasicProperties(delivery_mode=2))
            return True

        return self.inThread(run)

    @inlineCallbacks
    def test_membersJoinAndHoldEveryMessage(self):
        """
        A quorum queue declared on node 1 has three members, all in sync once
        the followers joined; a confirmed message is on both followers, an
        acked one leaves them.
        """
        yield self.publish(0, 0)
        rec = self.record()
        self.assertEqual((rec["node"], len(rec["members"]), sorted(rec["members"])), ("n1", 3, ["n1", "n2", "n3"]))
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(0, 40)
        # confirmed: both followers hold every message already
        self.assertEqual((self.replicaEntries(1), self.replicaEntries(2)), (40, 40))

        def get():
            ch = self.conn(1).channel()
            for _ in range(15):
                method, _, _ = ch.basic_get("qq", auto_ack=False)
                ch.basic_ack(method.delivery_tag)
            return True

        yield self.inThread(get)
        yield waitOnReactor(lambda: self.replicaEntries(1) == 25 and self.replicaEntries(2) == 25, 5)

    @inlineCallbacks
    def test_leaderLostNothingLost(self):
        """
        The leader's node dies after 60 confirmed publishes: a follower takes
        over (epoch 2, the record names it) and every message is consumed
        from the new leader, through any surviving node.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(1, 60)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2, 5)
        rec = self.record()
        self.assertIn(rec["node"], ("n2", "n3"))
        self.assertEqual(rec["leader"], rec["node"])
        leader = int(rec["node"][1:]) - 1
        other = 1 if leader == 2 else 2
        self.assertIn("qq", self.fixtures[leader].broker.vhosts["/"].queues)
        yield waitOnReactor(lambda: not self.fixtures[other].broker.vhosts["/"].remoteQueues["qq"].down, 5)

        def consume():
            ch = self.conn(other).channel()
            got = []
            deadline = time.time() + 10
            while len(got) < 60 and time.time() < deadline:
                method, _, body = ch.basic_get("qq", auto_ack=True)
                if method is None:
                    time.sleep(0.05)
                    continue
                got.append(body)
            return got

        got = yield self.inThread(consume)
        self.assertEqual(got, [b"m%d" % k for k in range(60)])

    @inlineCallbacks
    def test_newLeaderTakesNewFollowers(self):
        """After a failover the other survivor joins the new leader and is in sync again."""
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(0, 10)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2 and len(self.record()["online"]) == 2, 5)
        leader = int(self.record()["node"][1:]) - 1
        other = 1 if leader == 2 else 2
        yield self.publish(other, 5)
        self.assertEqual(self.replicaEntries(other), 15)

    @inlineCallbacks
    def test_noMajorityNoConfirm(self):
        """Both followers gone: a publish to the leader is nacked, not confirmed (no majority in sync)."""
        self.patch(replication, "NO_MAJORITY_WAIT", 0.5)
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        self.kill(1)
        self.kill(2)
        yield waitOnReactor(lambda: self.record()["online"] == ["n1"], 5)

        outcome = yield self.publishOutcome(0, "qq")
        self.assertEqual(outcome, "nack")

    @inlineCallbacks
    def test_staleLeaderFenced(self):
        """A leader whose record moved to a newer epoch confirms nothing more (its frames are refused)."""
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        rec = self.record()
        # another node took over meanwhile (as when node 1 was paused past its lease)
        self.meta._put(md.queueKey("/", "qq"), dict(rec, node="n2", leader="n2", epoch=2, online=["n2"]), None)
        yield waitOnReactor(lambda: "qq" in self.fixtures[1].broker.vhosts["/"].queues
                            or "qq" not in self.fixtures[0].broker.vhosts["/"].queues, 5)
        self.assertNotIn("qq", self.fixtures[0].broker.vhosts["/"].queues)

    @inlineCallbacks
    def test_consumersSurviveLeaderLoss(self):
        """
        Consumers on both surviving nodes keep their subscriptions when the
        leader's node dies (no basic.cancel): every message published is
        received at least once after the failover, through the new leader.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        state = {"got": [], "cancelled": []}

        conns = yield self.inThread(self.ackingConsumers, (1, 2), "qq", state, 5)

        def pump(seconds, until):
            return self.pump(conns, seconds, until)

        yield self.publish(1, 20)
        yield self.inThread(pump, 10, lambda: len(state["got"]) >= 20)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2, 5)
        leader = int(self.record()["node"][1:]) - 1
        yield waitOnReactor(lambda: len(self.fixtures[leader].broker.vhosts["/"].queues["qq"].consumers) == 2, 5)
        yield self.publish(leader, 20, arguments=QUORUM)

        def rest():
            pump(10, lambda: len(set(state["got"])) >= 20 and len(state["got"]) >= 40)
            return state

        yield self.inThread(rest)
        self.assertEqual(state["cancelled"], [])
        self.assertEqual(sorted(set(state["got"])), sorted(b"m%d" % k for k in range(20)))
        self.assertGreaterEqual(len(state["got"]), 40)

    @inlineCallbacks
    def test_leadershipTransfer(self):
        """
        A record naming an in-sync follower as leader (epoch + 1, as a
        rebalance writes it) moves the queue there with every message; the
        old leader follows it.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(0, 12)
        rec = self.record()
        self.meta._put(md.queueKey("/", "qq"), dict(rec, node="n3", leader="n3", epoch=2, online=["n3"]), None)
        yield waitOnReactor(lambda: "qq" in self.fixtures[2].broker.vhosts["/"].queues, 5)
        q = self.fixtures[2].broker.vhosts["/"].queues["qq"]
        self.assertEqual(q.readyCount, 12)
        self.assertNotIn("qq", self.fixtures[0].broker.vhosts["/"].queues)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        self.assertEqual((self.replicaEntries(0), self.replicaEntries(1)), (12, 12))

    @inlineCallbacks
    def test_followerStoreFailed(self):
        """
        A follower whose store fails (a full disk) is dropped from the in-sync
        set before the confirm goes: publishes are confirmed by the leader and
        the other follower; once its store works again it joins again.
        """
        from twisted.internet import defer

        from otter_tx.store.interface import StoreFailedError

        self.patch(replication, "STORE_RETRY", 0.2)
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        journal = self.fixtures[1].broker.journal
        realSync = journal.sync
        journal.sync = lambda: defer.fail(StoreFailedError("/full", "No space left on device"))
        try:
            yield self.publish(0, 5)
            self.assertNotIn("n2", self.record()["online"])
            self.assertEqual(len(self.record()["online"]), 2)
        finally:
            journal.sync = realSync
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        self.assertEqual(self.replicaEntries(1), 5)

    @inlineCallbacks
    def test_heldDeadLettersSurviveLeaderLoss(self):
        """
        An at-least-once dead letter no queue took yet (held by the leader) is
        held by the followers too: after the leader's node dies the new leader
        holds it and dead-letters it again once its target exists.
        """
        from otter_tx.broker import deadletter

        self.patch(deadletter, "DLX_RETRY_MS", 300)
        args = dict(QUORUM, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq-later",
                               "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
        yield self.publish(0, 0, arguments=args)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(0, 1, arguments=args)

        def reject():
            ch = self.conn(1).channel()
            method, _, _ = ch.basic_get("qq", auto_ack=False)
            ch.basic_reject(method.delivery_tag, requeue=False)
            return True

        yield self.inThread(reject)
        leaderQ = self.fixtures[0].broker.vhosts["/"].queues["qq"]
        yield waitOnReactor(lambda: len(leaderQ.heldDeadLetters.messages or ()) == 1, 5)
        yield waitOnReactor(lambda: all(len(self.cluster[i].replication.replicas[("/", "qq")].held) == 1
                                        for i in (1, 2)), 5)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2, 5)
        leader = int(self.record()["node"][1:]) - 1

        def declareTarget():
            ch = self.conn(leader).channel()
            ch.queue_declare("dlq-later")
            deadline = time.time() + 10
            while time.time() < deadline:
                method, _, body = ch.basic_get("dlq-later", auto_ack=True)
                if method is not None:
                    return body
                time.sleep(0.05)

        body = yield self.inThread(declareTarget)
        self.assertEqual(body, b"m0")
