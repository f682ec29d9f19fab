"""
Quorum queue membership (otter_tx/cluster/membership.py) over the HTTP
management API on three in-process nodes (test_inprocess.ClusterCase with
their management apps): add and delete members, grow, shrink, rebalance.
"""

import pika
import pika.exceptions
from twisted.internet.defer import inlineCallbacks

from otter_tx.cluster import metadata as md
from otter_tx.test.cluster import test_inprocess
from otter_tx.test.cluster.test_inprocess import ClusterCase
from otter_tx.test.interop.support import waitOnReactor

QUORUM = {"x-queue-type": "quorum"}


class MembershipTests(ClusterCase):

    management = True
    api = test_inprocess.ManagementTests.api

    def record(self, name="qq"):
        return self.meta.data.get(md.queueKey("/", name))

    def replicaEntries(self, i, name="qq"):
        replica = self.cluster[i].replication.replicas.get(("/", name))
        return None if replica is None else len(replica.entries)

    def publish(self, i, count, name="qq", arguments=QUORUM, start=0):
        return self.publishConfirmed(i, name, arguments, count, start)

    def drain(self, i, name="qq", expect=0):
        def run():
            ch = self.conn(i).channel()
            got = []
            while True:
                method, _, body = ch.basic_get(name, auto_ack=True)
                if method is None:
                    return got
                got.append(body)

        return self.inThread(run)

    def call(self, i, method, path, body=None):
        return self.inThread(self.api, i, method, path, body)

    @inlineCallbacks
    def test_addMemberJoinsWithTheData(self):
        """
        A quorum queue of two members gets the third node over HTTP on a
        node that is not its leader: 204, the record lists it, it joins,
        holds every message and is in sync.
        """
        yield self.publish(0, 0, arguments=dict(QUORUM, **{"x-quorum-initial-group-size": 2}))
        rec = self.record()
        self.assertEqual(len(rec["members"]), 2)
        (outsider,) = {"n1", "n2", "n3"} - set(rec["members"])
        yield waitOnReactor(lambda: len(self.record()["online"]) == 2, 5)
        yield self.publish(0, 25, arguments=dict(QUORUM, **{"x-quorum-initial-group-size": 2}))
        code, body = yield self.call(int(outsider[1:]) - 1, "POST", "/api/queues/quorum/%2F/qq/replicas/add",
                                     {"node": outsider})
        self.assertEqual((code, body), (204, None))
        self.assertIn(outsider, self.record()["members"])
        yield waitOnReactor(lambda: outsider in self.record()["online"], 5)
        self.assertEqual(self.replicaEntries(int(outsider[1:]) - 1), 25)
        # the leader's Replicator counts it: the next publish is on the new member too
        yield self.publish(0, 5, start=25, arguments=dict(QUORUM, **{"x-quorum-initial-group-size": 2}))
        self.assertEqual(self.replicaEntries(int(outsider[1:]) - 1), 30)
        # again: idempotent (RabbitMQ); a node that is not in the cluster: 503 node_not_running
        code, _ = yield self.call(0, "POST", "/api/queues/quorum/%2F/qq/replicas/add", {"node": outsider})
        self.assertEqual(code, 204)
        code, body = yield self.call(0, "POST", "/api/queues/quorum/%2F/qq/replicas/add", {"node": "n9"})
        self.assertEqual((code, body), (503, {"error": "service_unavailable", "reason": "node_not_running"}))

    @inlineCallbacks
    def test_deleteFollowerDropsReplica(self):
        """A follower's member deleted (202): out of members and online, its replica gone."""
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(0, 10)
        code, _ = yield self.call(1, "DELETE", "/api/queues/quorum/%2F/qq/replicas/delete", {"node": "n3"})
        self.assertEqual(code, 202)
        rec = self.record()
        self.assertEqual((rec["members"], sorted(rec["online"]), rec["epoch"]), (["n1", "n2"], ["n1", "n2"], 1))
        yield waitOnReactor(lambda: self.replicaEntries(2) is None, 5)
        self.assertEqual(self.cluster[0].replication.leading[("/", "qq")].members, ["n1", "n2"])
        yield self.publish(2, 5, start=10)
        self.assertEqual(self.replicaEntries(1), 15)
        # down to one member, then the last one is refused
        code, _ = yield self.call(0, "DELETE", "/api/queues/quorum/%2F/qq/replicas/delete", {"node": "n2"})
        self.assertEqual(code, 202)
        yield waitOnReactor(lambda: self.replicaEntries(1) is None, 5)
        code, body = yield self.call(0, "DELETE", "/api/queues/quorum/%2F/qq/replicas/delete", {"node": "n1"})
        self.assertEqual((code, body), (503, {"error": "service_unavailable", "reason": "last_node"}))
        got = yield self.drain(1)
        self.assertEqual(got, [b"m%d" % k for k in range(15)])

    @inlineCallbacks
    def test_deleteLeaderTransfersKeepingEveryMessage(self):
        """
        The leader's own member deleted: an in-sync follower leads (epoch 2,
        online [it]), the old leader holds nothing, every confirmed message
        is consumed from the new leader, the third member joins it.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(1, 40)
        code, _ = yield self.call(2, "DELETE", "/api/queues/quorum/%2F/qq/replicas/delete", {"node": "n1"})
        self.assertEqual(code, 202)
        rec = self.record()
        self.assertIn(rec["node"], ("n2", "n3"))
        self.assertEqual((rec["leader"], rec["epoch"], sorted(rec["members"])), (rec["node"], 2, ["n2", "n3"]))
        leader = int(rec["node"][1:]) - 1
        yield waitOnReactor(lambda: "qq" in self.fixtures[leader].broker.vhosts["/"].queues, 5)
        self.assertNotIn("qq", self.fixtures[0].broker.vhosts["/"].queues)
        self.assertIsNone(self.replicaEntries(0))
        yield waitOnReactor(lambda: len(self.record()["online"]) == 2, 5)
        yield waitOnReactor(lambda: not self.fixtures[0].broker.vhosts["/"].remoteQueues["qq"].down, 5)
        got = yield self.drain(0)
        self.assertEqual(got, [b"m%d" % k for k in range(40)])

    @inlineCallbacks
    def test_growAndShrink(self):
        """
        Shrink n3 (202): off every queue where it is not the only member;
        grow n3 with strategy all and a queue pattern (204): on the matching
        ones again, with their messages.
        """
        yield self.publish(0, 3, name="g1")
        yield self.publish(1, 4, name="g2")
        yield self.publish(2, 2, name="solo", arguments=dict(QUORUM, **{"x-quorum-initial-group-size": 1}))
        yield waitOnReactor(lambda: len(self.record("g1")["online"]) == 3 and len(self.record("g2")["online"]) == 3,
                            5)
        code, _ = yield self.call(0, "DELETE", "/api/queues/quorum/replicas/on/n3/shrink")
        self.assertEqual(code, 202)
        self.assertEqual([sorted(self.record(q)["members"]) for q in ("g1", "g2", "solo")],
                         [["n1", "n2"], ["n1", "n2"], ["n3"]])
        code, _ = yield self.call(1, "POST", "/api/queues/quorum/replicas/on/n3/grow",
                                  {"strategy": "all", "vhost_pattern": ".*", "queue_pattern": "^g1$"})
        self.assertEqual(code, 204)
        self.assertEqual([sorted(self.record(q)["members"]) for q in ("g1", "g2")], [["n1", "n2", "n3"], ["n1", "n2"]])
        yield waitOnReactor(lambda: "n3" in self.record("g1")["online"], 5)
        self.assertEqual(self.replicaEntries(2, "g1"), 3)
        # even: only queues with an even number of members (g2, two)
        code, _ = yield self.call(1, "POST", "/api/queues/quorum/replicas/on/n3/grow",
                                  {"strategy": "even", "vhost_pattern": ".*", "queue_pattern": ".*"})
        self.assertEqual(code, 204)
        self.assertEqual(sorted(self.record("g2")["members"]), ["n1", "n2", "n3"])
        self.assertEqual(self.record("solo")["members"], ["n3"])
        code, _ = yield self.call(1, "POST", "/api/queues/quorum/replicas/on/n9/grow",
                                  {"strategy": "all", "vhost_pattern": ".*", "queue_pattern": ".*"})
        self.assertEqual(code, 404)
        # a queue of one member gets its first follower: the snapshot has its messages
        code, _ = yield self.call(0, "POST", "/api/queues/quorum/%2F/solo/replicas/add", {"node": "n1"})
        self.assertEqual(code, 204)
        yield waitOnReactor(lambda: self.record("solo").get("online") == ["n3", "n1"], 5)
        self.assertEqual(self.replicaEntries(0, "solo"), 2)

    @inlineCallbacks
    def test_rebalance(self):
        """
        Six quorum queues all led by n1: after POST /api/rebalance/queues
        (204) each node leads two, every queue keeps its messages.
        """
        names = ["r%d" % k for k in range(6)]
        for name in names:
            yield self.publish(0, 3, name=name)
        yield waitOnReactor(lambda: all(len(self.record(n)["online"]) == 3 for n in names), 10)
        code, _ = yield self.call(1, "POST", "/api/rebalance/queues")
        self.assertEqual(code, 204)
        leaders = [self.record(n)["node"] for n in names]
        self.assertEqual(sorted(leaders.count(n) for n in ("n1", "n2", "n3")), [2, 2, 2])
        for name, leader in zip(names, leaders):
            i = int(leader[1:]) - 1
            yield waitOnReactor(lambda: name in self.fixtures[i].broker.vhosts["/"].queues, 5)
            self.assertEqual(self.fixtures[i].broker.vhosts["/"].queues[name].readyCount, 3)
        yield waitOnReactor(lambda: all(len(self.record(n)["online"]) == 3 for n in names), 10)

    @inlineCallbacks
    def test_errors(self):
        """A classic queue: 503 classic_queue_not_supported; no node key: 400; no queue: 404; no admin tag: 401."""
        def declare():
            self.conn(0).channel().queue_declare("cq", durable=True)

        yield self.inThread(declare)
        code, body = yield self.call(0, "POST", "/api/queues/quorum/%2F/cq/replicas/add", {"node": "n2"})
        self.assertEqual((code, body), (503, {"error": "service_unavailable", "reason": "classic_queue_not_supported"}))
        code, body = yield self.call(0, "POST", "/api/queues/quorum/%2F/cq/replicas/add", {})
        self.assertEqual((code, body), (400, {"error": "bad_request", "reason": "[{key_missing,node}]"}))
        code, _ = yield self.call(0, "DELETE", "/api/queues/quorum/%2F/nope/replicas/delete", {"node": "n2"})
        self.assertEqual(code, 404)


    @inlineCallbacks
    def test_consumersFollowTransfer(self):
        """
        Consumers on the old leader's node and on another node keep their
        subscriptions (no basic.cancel) when the leadership moves, and get
        what is published afterwards.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        state = {"got": [], "cancelled": []}

        conns = yield self.inThread(self.ackingConsumers, (0, 1), "qq", state)

        def pump(seconds, until):
            return self.pump(conns, seconds, until)

        code, _ = yield self.call(2, "POST", "/api/rebalance/queues")
        self.assertEqual(code, 204)
        # one queue, three nodes: nothing to move (each leads at most one)
        self.assertEqual(self.record()["node"], "n1")
        result = yield self.cluster[2].membership.transfer("/", "qq", "n2")
        self.assertEqual(result, "transferred")
        yield waitOnReactor(lambda: len(self.fixtures[1].broker.vhosts["/"].queues.get("qq").consumers) == 2
                            if "qq" in self.fixtures[1].broker.vhosts["/"].queues else False, 5)
        yield self.publish(2, 20)
        yield self.inThread(pump, 10, lambda: len(state["got"]) >= 20)
        self.assertEqual(state["cancelled"], [])
        self.assertEqual(sorted(state["got"]), sorted(b"m%d" % k for k in range(20)))


class TransferUnderLoadTests(ClusterCase):

    management = True
    api = test_inprocess.ManagementTests.api

    def record(self):
        return self.meta.data.get(md.queueKey("/", "qq"))

    @inlineCallbacks
    def test_confirmedMessagesSurviveTransfer(self):
        """
        A publisher with confirms keeps publishing to node 2 while the
        leadership moves from node 1 to node 3 (Membership.transfer): every
        confirmed message is consumed afterwards (a nacked one may be missing).
        """
        import threading

        def declare():
            self.conn(1).channel().queue_declare("qq", durable=True, arguments=QUORUM)

        yield self.inThread(declare)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        state = {"confirmed": [], "nacked": 0, "stop": threading.Event()}

        def publish():
            ch = self.conn(1).channel()
            ch.confirm_delivery()
            k = 0
            while not state["stop"].is_set() and k < 2000:
                body = b"m%d" % k
                try:
                    ch.basic_publish("", "qq", body, pika.BasicProperties(delivery_mode=2))
                    state["confirmed"].append(body)
                except pika.exceptions.NackError:
                    state["nacked"] += 1
                k += 1
            return k

        publishing = self.inThread(publish)
        yield waitOnReactor(lambda: len(state["confirmed"]) >= 50, 10)
        result = yield self.cluster[1].membership.transfer("/", "qq", "n3")
        self.assertEqual(result, "transferred")
        yield waitOnReactor(lambda: "qq" in self.fixtures[2].broker.vhosts["/"].queues, 5)
        yield waitOnReactor(lambda: len(state["confirmed"]) >= 150, 10)
        state["stop"].set()
        yield publishing
        yield waitOnReactor(lambda: not self.fixtures[1].broker.vhosts["/"].remoteQueues["qq"].down, 5)

        def drain():
            ch = self.conn(0).channel()
            got = []
            while True:
                method, _, body = ch.basic_get("qq", auto_ack=True)
                if method is None:
                    return got
                got.append(body)

        got = yield self.inThread(drain)
        self.assertEqual(self.record()["node"], "n3")
        missing = set(state["confirmed"]) - set(got)
        self.assertEqual(missing, set())
