"""
Replicated streams (otter_tx/cluster/streamrepl.py) on three in-process
nodes (test_inprocess.ClusterCase: whole brokers, real TCP links, the
in-memory metadata store), driven by pika and rstream.
"""

import asyncio
import os
import time

from twisted.internet.defer import Deferred, inlineCallbacks

from otter_tx.cluster import metadata as md
from otter_tx.cluster import replication
from otter_tx.test.cluster.test_inprocess import ClusterCase, RStreamClusterCase
from otter_tx.test.interop.support import waitOnReactor

STREAM = {"x-queue-type": "stream"}


class _StreamCluster(ClusterCase):

    def record(self, name="rs"):
        return self.meta.data.get(md.queueKey("/", name))

    def replicaLog(self, i, name="rs"):
        replica = self.cluster[i].replication.replicas.get(("/", name))
        return None if replica is None else replica.stream

    def leaderLog(self, i, name="rs"):
        q = self.fixtures[i].broker.vhosts["/"].queues.get(name)
        return None if q is None else q.stream

    def publish(self, i, count, name="rs", start=0, arguments=STREAM):
        return self.publishConfirmed(i, name, arguments, count, start)

    @inlineCallbacks
    def holdOut(self, i, name="rs"):
        """
        Node ``i``'s replica is dropped by the leader (node 1), as when it
        stops answering, and does not join again until the function this
        fires with is called.
        """
        manager = self.cluster[i].replication
        rejoin = manager._maybeJoin
        manager._maybeJoin = lambda replica: None
        self.addCleanup(setattr, manager, "_maybeJoin", rejoin)
        yield self.cluster[0].replication.leading[("/", name)].followerLost("n%d" % (i + 1,))

        def letIn():
            manager._maybeJoin = rejoin
            replica = manager.replicas[("/", name)]
            replica.joinedEpoch = None
            rejoin(replica)

        return letIn

    def consume(self, i, count, name="rs"):
        def run():
            c = self.conn(i)
            ch = c.channel()
            ch.basic_qos(prefetch_count=100)
            got = []

            def onMessage(ch, method, props, body):
                got.append((props.headers["x-stream-offset"], body))
                ch.basic_ack(method.delivery_tag)

            ch.basic_consume(name, onMessage, arguments={"x-stream-offset": "first"})
            deadline = time.time() + 15
            while len(got) < count and time.time() < deadline:
                c.process_data_events(0.05)
            return got

        return self.inThread(run)


class ReplicatedStreamTests(_StreamCluster):

    @inlineCallbacks
    def test_membersHoldEveryConfirmedMessage(self):
        """
        A stream declared on node 1 has a member on every node (RabbitMQ
        3.10's default initial cluster size), the followers join and are in
        sync; once a publish is confirmed both followers' logs hold it, at
        the same offsets, byte for byte as the leader's records.
        """
        yield self.publish(0, 0)
        rec = self.record()
        self.assertEqual((rec["node"], sorted(rec["members"]), rec["stream_epochs"]),
                         ("n1", ["n1", "n2", "n3"], [[1, 0]]))
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(1, 50)
        self.assertEqual([self.replicaLog(i).committed for i in (1, 2)], [50, 50])
        leader = self.leaderLog(0)
        for i in (1, 2):
            self.assertEqual(sorted(n for n in __import__("os").listdir(self.replicaLog(i).directory)
                                    if n.endswith(".seg")),
                             sorted(n for n in __import__("os").listdir(leader.directory) if n.endswith(".seg")))
        got = yield self.consume(2, 50)
        self.assertEqual(got, [(k, b"m%d" % k) for k in range(50)])

    @inlineCallbacks
    def test_lateFollowerCatchesUpFromTheLog(self):
        """
        A member whose node was away while 300 messages were confirmed joins
        again: the leader sends what it lacks from its log, then it is in
        sync and holds them all.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        # node 3's replica falls behind: the leader drops it (as when it stops answering), and
        # it joins again only once 300 more messages were confirmed (by the leader and node 2)
        letIn = yield self.holdOut(2)
        self.assertNotIn("n3", self.record()["online"])
        yield self.publish(0, 300)
        self.assertEqual(self.replicaLog(2).committed, 0)
        letIn()
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 10)
        yield self.publish(0, 1, start=300)
        self.assertEqual(self.replicaLog(2).committed, 301)
        self.assertEqual(self.replicaLog(1).committed, 301)

    @inlineCallbacks
    def test_leaderLostNothingConfirmedLost(self):
        """
        The leader's node dies after 80 confirmed publishes: a follower takes
        over (epoch 2, its history records where epoch 2 starts), and every
        message is read from the first offset through a surviving node; the
        other survivor follows the new leader.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(1, 80)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2, 5)
        rec = self.record()
        self.assertIn(rec["node"], ("n2", "n3"))
        self.assertEqual(rec["stream_epochs"], [[1, 0], [2, 80]])
        leader = int(rec["node"][1:]) - 1
        other = 1 if leader == 2 else 2
        self.assertIsNotNone(self.leaderLog(leader))
        yield waitOnReactor(lambda: len(self.record()["online"]) == 2, 5)
        yield self.publish(other, 20, start=80)
        self.assertEqual(self.replicaLog(other).committed, 100)
        got = yield self.consume(other, 100)
        self.assertEqual(got, [(k, b"m%d" % k) for k in range(100)])

    @inlineCallbacks
    def test_noMajorityNoConfirm(self):
        """Both followers gone: a publish to the stream is nacked after the wait, not confirmed."""
        self.patch(replication, "NO_MAJORITY_WAIT", 0.5)
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        self.kill(1)
        self.kill(2)
        yield waitOnReactor(lambda: self.record()["online"] == ["n1"], 5)

        outcome = yield self.publishOutcome(0, "rs")
        self.assertEqual(outcome, "nack")

    @inlineCallbacks
    def test_deposedLeaderCutsItsLog(self):
        """
        A leader deposed while it held records no follower had (written
        after it lost them) rejoins as a follower: it cuts its log where the
        new epoch starts and then holds exactly the new leader's records.
        """
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(0, 10)
        old = self.leaderLog(0)
        # records only the leader has: appended while no follower is joined
        rep = old.replicator
        joined, rep.joined = rep.joined, {}
        for k in range(5):
            old.appendEntries(b"\x00\x00\x00\x01x", 1, wantDeferred=False)
        yield old.sync()
        rep.joined = joined
        self.assertEqual(old.committed, 15)
        # node 2 takes over at offset 10 (as after node 1 was paused past its lease)
        rec = self.record()
        self.meta._put(md.queueKey("/", "rs"), dict(rec, node="n2", leader="n2", epoch=2, online=["n2"],
                                                     stream_epochs=[[1, 0], [2, 10]]), None)
        yield waitOnReactor(lambda: "rs" in self.fixtures[1].broker.vhosts["/"].queues, 5)
        yield waitOnReactor(lambda: "rs" not in self.fixtures[0].broker.vhosts["/"].queues, 5)
        yield waitOnReactor(lambda: "n1" in self.record()["online"], 10)
        yield self.publish(1, 3, start=10)
        self.assertEqual(self.replicaLog(0).committed, 13)
        got = yield self.consume(0, 13)
        self.assertEqual(got, [(k, b"m%d" % k) for k in range(13)])


class ReplicatedStreamProtocolTests(_StreamCluster, RStreamClusterCase):
    """The stream protocol on a replicated stream: metadata, reads on replicas, tracking."""

    stream = True


    @inlineCallbacks
    def test_metadataNamesReplicasAndReplicasServeReaders(self):
        """
        Metadata on any node names the leader and the in-sync replicas (as
        RabbitMQ's); a subscription on a replica's node reads its replica;
        stored offsets reach the followers and answer after a failover.
        """
        rs = self.rs
        from rstream import schema
        from rstream.client import Client

        ports = [f.streamPort for f in self.fixtures]

        async def create():
            async with rs.Producer("127.0.0.1", port=ports[0], username="guest", password="guest") as p:
                await p.create_stream("rs")

        yield self.inAsyncio(create)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)

        async def run():
            out = {}
            # on a follower's node and on the leader's (whose record of the declare named no
            # follower in sync: it answers from its replicator's in-sync set)
            for key, port in (("", ports[2]), (" on the leader", ports[0])):
                c = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
                await c.start()
                await c.authenticate("/", "guest", "guest")
                try:
                    r = await c.sync_request(schema.Metadata(c._corr_id_seq.next(), streams=["rs"]),
                                             resp_schema=schema.MetadataResponse, raise_exception=False)
                    brokers = {b.reference: b.port for b in r.brokers}
                    m = r.metadata[0]
                    out["leader" + key] = brokers[m.leader_ref]
                    out["replicas" + key] = sorted(brokers[x] for x in m.replicas_refs)
                finally:
                    await c.close()
            async with rs.Producer("127.0.0.1", port=ports[0], username="guest", password="guest") as p:
                for i in range(30):
                    await p.send_wait("rs", rs.AMQPMessage(body=b"m%d" % i))
            got = []
            done = asyncio.Event()

            async def cb(msg, ctx):
                got.append((ctx.offset, bytes(msg.body)))
                if len(got) == 30:
                    done.set()

            # a raw subscription on node 3 (a replica), not following metadata
            c = Client("127.0.0.1", ports[2], frame_max=1048576, heartbeat=60)
            await c.start()
            await c.authenticate("/", "guest", "guest")
            try:
                from rstream import constants

                r = await c.sync_request(
                    schema.Subscribe(c._corr_id_seq.next(), subscription_id=1, stream="rs",
                                     offset_spec=schema.OffsetSpec(constants.OffsetType.FIRST), credit=100,
                                     properties=[]),
                    resp_schema=schema.SubscribeResponse, raise_exception=False)
                out["subscribe on a replica"] = r.response_code
            finally:
                await c.close()
            async with rs.Consumer("127.0.0.1", port=ports[1], username="guest", password="guest") as cons:
                await cons.subscribe("rs", cb, decoder=rs.amqp_decoder,
                                     offset_specification=rs.ConsumerOffsetSpecification(rs.OffsetType.FIRST,
                                                                                          None))
                await asyncio.wait_for(done.wait(), 10)
            c = Client("127.0.0.1", ports[0], frame_max=1048576, heartbeat=60)
            await c.start()
            await c.authenticate("/", "guest", "guest")
            try:
                await c.store_offset("rs", "reader-1", 17)
                await c.query_offset("rs", "reader-1")
            finally:
                await c.close()
            out["got"] = got
            return out

        out = yield self.inAsyncio(run)
        self.assertEqual(out["leader"], ports[0])
        self.assertEqual(out["replicas"], sorted(ports[1:]))
        self.assertEqual((out["leader on the leader"], out["replicas on the leader"]), (ports[0], sorted(ports[1:])))
        self.assertEqual(out["subscribe on a replica"], 1)
        self.assertEqual(out["got"], [(k, b"m%d" % k) for k in range(30)])
        # the offset stored at the leader reaches every follower
        yield waitOnReactor(lambda: all(
            f.service.streamFactory.backend.tracking.get("/", "rs")["offsets"].get("reader-1") == 17
            for f in self.fixtures), 5)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2, 5)
        leader = int(self.record()["node"][1:]) - 1

        async def query():
            async with rs.Consumer("127.0.0.1", port=ports[leader], username="guest", password="guest") as cons:
                return await cons.query_offset("rs", "reader-1")

        offset = yield self.inAsyncio(query)
        self.assertEqual(offset, 17)


class ReplicatedStreamManagementTests(_StreamCluster):
    """The queue JSON of a replicated stream, on its leader's node and on the others."""

    management = True

    def api(self, i, method, path, body=None):
        from otter_tx.test.cluster.test_inprocess import ManagementTests

        return ManagementTests.api(self, i, method, path, body)

    @inlineCallbacks
    def test_membersOnlineLeader(self):
        """``leader``, ``members`` and the in-sync ``online`` come from the stream's record on every node."""
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        for i in range(3):
            code, q = yield self.inThread(self.api, i, "GET", "/api/queues/%2F/rs")
            self.assertEqual(code, 200)
            self.assertEqual((q["type"], q["leader"], sorted(q["members"]), sorted(q["online"])),
                             ("stream", "n1", ["n1", "n2", "n3"], ["n1", "n2", "n3"]))


class PartialMembersTests(_StreamCluster, RStreamClusterCase):
    """A stream with fewer members than nodes: the node without a replica forwards to the leader."""

    stream = True


    @inlineCallbacks
    def test_publishOnNonMemberConfirmedOnceReplicated(self):
        """
        A stream of two members (x-initial-cluster-size 2) on three nodes: a
        stream protocol publisher on the third node is confirmed once the
        leader and its follower hold the messages.
        """
        yield self.publish(0, 0, arguments={"x-queue-type": "stream", "x-initial-cluster-size": 2})
        yield waitOnReactor(lambda: len(self.record()["online"]) == 2, 5)
        members = self.record()["members"]
        outsider = [i for i in range(3) if "n%d" % (i + 1) not in members][0]
        follower = [i for i in range(1, 3) if "n%d" % (i + 1) in members][0]
        rs = self.rs
        port = self.fixtures[outsider].streamPort

        async def run():
            from rstream.client import Client
            from rstream import schema

            c = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
            await c.start()
            await c.authenticate("/", "guest", "guest")
            try:
                await c.declare_publisher("rs", "", 1)
                confirmed = []
                done = asyncio.Event()

                def onConfirm(frame):
                    confirmed.extend(frame.publishing_ids)
                    if len(confirmed) == 10:
                        done.set()

                c.add_handler(schema.PublishConfirm, onConfirm)
                await c.publish([schema.Message(publishing_id=k, data=bytes(rs.AMQPMessage(body=b"p%d" % k)),
                                                filter_value=None) for k in range(1, 11)], 1)
                await asyncio.wait_for(done.wait(), 10)
                return sorted(confirmed)
            finally:
                await c.close()

        confirmed = yield self.inAsyncio(run)
        self.assertEqual(confirmed, list(range(1, 11)))
        # confirmed: the follower holds them already
        self.assertEqual(self.replicaLog(follower).committed, 10)


class TrackingSnapshotTests(_StreamCluster):
    """A follower joining late gets the stream protocol tracking stored before it joined."""

    stream = True

    @inlineCallbacks
    def test_lateFollowerGetsTracking(self):
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        letIn = yield self.holdOut(2)
        self.fixtures[0].service.streamFactory.backend.storeOffset("/", "rs", "reader", 7)
        backend3 = self.fixtures[2].service.streamFactory.backend
        self.assertIsNone(backend3.tracking.get("/", "rs")["offsets"].get("reader"))
        letIn()
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 10)
        yield waitOnReactor(lambda: backend3.tracking.get("/", "rs")["offsets"].get("reader") == 7, 5)


class ConsumersAcrossFailoverTests(_StreamCluster):

    def test_consumerOnOtherNodeResumesAfterLeaderLoss(self):
        """
        An AMQP 0-9-1 stream consumer on a surviving node keeps its
        subscription through the leader's loss and goes on at the offset
        after the last one it was handed: no offset twice, none missed
        (whether its node becomes the leader or follows the new one).
        """
        return self.resumes(1)

    def test_consumerOnThirdNodeResumes(self):
        """The same with the consumer on the other survivor."""
        return self.resumes(2)

    @inlineCallbacks
    def resumes(self, node):
        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        yield self.publish(0, 30)
        state = {"got": [], "cancelled": 0}

        def subscribe():
            c = self.conn(node)
            ch = c.channel()
            ch.basic_qos(prefetch_count=10)
            ch.add_on_cancel_callback(lambda frame: state.__setitem__("cancelled", state["cancelled"] + 1))

            def onMessage(ch, method, props, body):
                state["got"].append(props.headers["x-stream-offset"])
                ch.basic_ack(method.delivery_tag)

            ch.basic_consume("rs", onMessage, arguments={"x-stream-offset": "first"})
            deadline = time.time() + 10
            while len(state["got"]) < 30 and time.time() < deadline:
                c.process_data_events(0.05)
            return c

        conn = yield self.inThread(subscribe)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2, 5)
        leader = int(self.record()["node"][1:]) - 1
        yield waitOnReactor(lambda: len(self.record()["online"]) == 2, 5)
        yield self.publish(leader, 10, start=30)

        def rest():
            deadline = time.time() + 10
            while len(state["got"]) < 40 and time.time() < deadline:
                conn.process_data_events(0.05)
            conn.process_data_events(0.3)
            return state

        state = yield self.inThread(rest)
        self.maxDiff = None
        self.assertEqual(([int(o) for o in state["got"]], state["cancelled"]), (list(range(40)), 0))


class SequenceWithRecordsTests(_StreamCluster):
    """
    A publisher sequence reaches the followers with its records, not after
    the confirm: a new leader that holds a record knows its sequence, so a
    publisher resending an unconfirmed batch after the failover is
    de-duplicated (found by test_stream_faults: the batch was stored twice).
    """

    stream = True

    @inlineCallbacks
    def test_newLeaderKnowsSequenceOfUnconfirmedRecords(self):
        from otter_tx.stream import chunk

        yield self.publish(0, 0)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        backend = self.fixtures[0].service.streamFactory.backend
        # the followers hold the records, the leader dies before the confirm
        rep = self.cluster[0].replication.leading[("/", "rs")]
        # (the records are shipped; the barrier their confirm waits for never fires)
        self.patch(rep, "_syncNow", lambda barrier=False: Deferred())
        ids = list(range(1, 6))
        _, d = backend.append("/", "rs", "ref", ids, chunk.entries([b"p%d" % k for k in ids]), len(ids))
        yield waitOnReactor(lambda: all(self.replicaLog(i).committed == 5 for i in (1, 2)), 5)
        self.assertFalse(d.called)
        self.kill(0)
        yield waitOnReactor(lambda: self.record()["epoch"] == 2, 5)
        for i in (1, 2):
            t = self.fixtures[i].service.streamFactory.backend.tracking.get("/", "rs")
            self.assertEqual(t["sequences"].get("ref"), 5, "n%d" % (i + 1,))
        leader = int(self.record()["node"][1:]) - 1
        yield waitOnReactor(lambda: ("/", "rs") in self.cluster[leader].replication.leading, 5)
        # the publisher sends the batch again at the new leader, and one more: only the new one is stored
        newBackend = self.fixtures[leader].service.streamFactory.backend
        ids = list(range(1, 7))
        kept, d = newBackend.append("/", "rs", "ref", ids, chunk.entries([b"p%d" % k for k in ids]), len(ids))
        yield d
        self.assertEqual(self.leaderLog(leader).committed, 6)

    def test_heldUntilTheRecordsCome(self):
        """A sequence shipped before its records is taken once the log holds them, dropped at a new join."""
        from otter_tx.cluster import streamrepl, wire

        class Stream:
            next = 3

        taken = []
        replica = streamrepl.StreamReplica.__new__(streamrepl.StreamReplica)
        replica.vhostName, replica.name, replica.stream, replica.heldTracking = "/", "rs", Stream(), []
        replica.manager = type("M", (), {"streamTracked": lambda s, v, n, c: taken.append(c)})()

        class Blob:
            def __init__(self, change):
                self.data = __import__("json").dumps(change).encode()

            def blob(self):
                return self.data

        replica.apply(2, wire.R_STRACK, Blob({"sequences": {"a": 1}, "upTo": 3}))
        replica.apply(2, wire.R_STRACK, Blob({"sequences": {"a": 4}, "upTo": 5}))
        replica.apply(1, wire.R_STRACK, Blob({"sequences": {"b": 9}, "upTo": 9}))
        self.assertEqual(taken, [{"sequences": {"a": 1}}])
        Stream.next = 5
        replica._releaseTracking(2)
        self.assertEqual(taken, [{"sequences": {"a": 1}}, {"sequences": {"a": 4}}])
        self.assertEqual(replica.heldTracking, [])


class FollowerRetentionTests(_StreamCluster):

    @inlineCallbacks
    def test_followersApplyTheStreamsRetention(self):
        """A follower's log has the retention of the stream's arguments (x-max-length-bytes, x-max-age)."""
        yield self.publish(0, 0, arguments={"x-queue-type": "stream", "x-max-length-bytes": 1000000,
                                            "x-max-age": "2h"})
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        for i in (1, 2):
            log = self.replicaLog(i)
            self.assertEqual((log.maxBytes, log.maxAgeSeconds), (1000000, 7200))

    @inlineCallbacks
    def test_followersApplyPolicyRetention(self):
        """
        A policy's max-length-bytes / max-age reach the followers' logs too, set and cleared on
        any node (the stream's arguments still win), as the leader applies them.
        """
        yield self.publish(0, 0, arguments={"x-queue-type": "stream", "x-max-age": "1h"})
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        self.fixtures[2].broker.setPolicy("/", "keep", "^rs$", {"max-length-bytes": 5000000, "max-age": "2D"},
                                          0, "queues")

        def retention():
            return [(log.maxBytes, log.maxAgeSeconds) for log in
                    (self.leaderLog(0), self.replicaLog(1), self.replicaLog(2))]

        yield waitOnReactor(lambda: retention() == [(5000000, 3600)] * 3, 5)
        self.fixtures[1].broker.clearPolicy("/", "keep")
        yield waitOnReactor(lambda: retention() == [(None, 3600)] * 3, 5)


class StreamMembershipTests(_StreamCluster):
    """
    A replicated stream's members over the management API, as
    ``rabbitmq-streams add_replica`` / ``delete_replica`` (otter_tx/cluster/membership.py,
    otter_tx/web/management/members.py), and rebalance with streams.
    """

    management = True

    def api(self, i, method, path, body=None):
        from otter_tx.test.cluster import test_inprocess

        return test_inprocess.ManagementTests.api(self, i, method, path, body)

    def call(self, i, method, path, body=None):
        return self.inThread(self.api, i, method, path, body)

    def addr(self, name, action):
        return "/api/queues/stream/%%2F/%s/replicas/%s" % (name, action)

    @inlineCallbacks
    def test_addReplicaReadsTheLog(self):
        """
        A stream of two members gets the third node (204, asked on another
        node than the leader): it joins, holds every message at the same
        offsets, is in sync, and holds what is published afterwards.
        """
        two = dict(STREAM, **{"x-initial-cluster-size": 2})
        yield self.publish(0, 25, arguments=two)
        (outsider,) = {"n1", "n2", "n3"} - set(self.record()["members"])
        o = int(outsider[1:]) - 1
        yield waitOnReactor(lambda: len(self.record()["online"]) == 2, 5)
        code, body = yield self.call((o + 1) % 3 or 1, "POST", self.addr("rs", "add"), {"node": outsider})
        self.assertEqual((code, body), (204, None))
        self.assertIn(outsider, self.record()["members"])
        yield waitOnReactor(lambda: outsider in self.record()["online"], 10)
        self.assertEqual((self.replicaLog(o).first, self.replicaLog(o).committed), (0, 25))
        yield self.publish(0, 5, start=25, arguments=two)
        yield waitOnReactor(lambda: self.replicaLog(o).committed == 30, 5)
        # again: nothing to do (204); a node not in the cluster: 503 node_not_running
        code, _ = yield self.call(0, "POST", self.addr("rs", "add"), {"node": outsider})
        self.assertEqual(code, 204)
        code, body = yield self.call(0, "POST", self.addr("rs", "add"), {"node": "n9"})
        self.assertEqual((code, body), (503, {"error": "service_unavailable", "reason": "node_not_running"}))

    @inlineCallbacks
    def test_deleteReplicaDropsItsLog(self):
        """A follower's member deleted (202): out of members and online, its log deleted there."""
        yield self.publish(0, 10)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        directory = self.replicaLog(2).directory
        code, _ = yield self.call(1, "DELETE", self.addr("rs", "delete"), {"node": "n3"})
        self.assertEqual(code, 202)
        rec = self.record()
        self.assertNotIn("n3", rec["members"])
        self.assertNotIn("n3", rec["online"])
        yield waitOnReactor(lambda: self.replicaLog(2) is None and not os.path.exists(directory), 5)
        # a member no longer: 202 again; the stream goes on with two members
        code, _ = yield self.call(0, "DELETE", self.addr("rs", "delete"), {"node": "n3"})
        self.assertEqual(code, 202)
        yield self.publish(1, 5, start=10)
        self.assertEqual(self.replicaLog(1).committed, 15)

    @inlineCallbacks
    def test_deleteLeadersMemberMovesTheLeadership(self):
        """
        Deleting the leader's own member hands the stream to an in-sync
        follower first (a new epoch, recorded in stream_epochs where the
        new leader's log ends): every confirmed message is read back from
        the first offset, in order, with no gap; publishing goes on.
        """
        yield self.publish(0, 20)
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)
        epoch = self.record()["epoch"]
        directory = self.leaderLog(0).directory
        code, _ = yield self.call(2, "DELETE", self.addr("rs", "delete"), {"node": "n1"})
        self.assertEqual(code, 202)
        rec = self.record()
        self.assertNotIn("n1", rec["members"])
        self.assertIn(rec["node"], ("n2", "n3"))
        self.assertEqual(rec["epoch"], epoch + 1)
        self.assertEqual(rec["stream_epochs"][-1], [epoch + 1, 20])
        leader = int(rec["node"][1:]) - 1
        yield waitOnReactor(lambda: self.leaderLog(leader) is not None, 5)
        yield waitOnReactor(lambda: "rs" not in self.fixtures[0].broker.vhosts["/"].queues, 5)
        # no longer a member: its copy of the log goes too
        yield waitOnReactor(lambda: not os.path.exists(directory), 5)
        self.assertIsNone(self.replicaLog(0))
        yield self.publish(leader, 5, start=20)
        got = yield self.consume(leader, 25)
        self.assertEqual([o for o, _ in got], list(range(25)))
        self.assertEqual([b for _, b in got], [b"m%d" % k for k in range(25)])

    @inlineCallbacks
    def test_errors(self):
        """
        The last member: 503 last_stream_member; a quorum queue or a classic
        queue on the stream routes: quorum_queue_not_supported /
        classic_queue_not_supported; no queue: 404.
        """
        yield self.publish(0, 0, arguments=dict(STREAM, **{"x-initial-cluster-size": 1}))
        code, body = yield self.call(1, "DELETE", self.addr("rs", "delete"), {"node": "n1"})
        self.assertEqual((code, body), (503, {"error": "service_unavailable", "reason": "last_stream_member"}))
        yield self.publishConfirmed(0, "qq", {"x-queue-type": "quorum"}, 0)
        yield self.publishConfirmed(0, "cq", {}, 0)
        for name, reason in (("qq", "quorum_queue_not_supported"), ("cq", "classic_queue_not_supported")):
            code, body = yield self.call(0, "POST", self.addr(name, "add"), {"node": "n2"})
            self.assertEqual((code, body), (503, {"error": "service_unavailable", "reason": reason}))
        code, _ = yield self.call(0, "POST", self.addr("nope", "add"), {"node": "n2"})
        self.assertEqual(code, 404)

    @inlineCallbacks
    def test_rebalanceMovesStreams(self):
        """Three streams led by n1: after POST /api/rebalance/queues each node leads one, every message kept."""
        names = ["s%d" % k for k in range(3)]
        for name in names:
            yield self.publish(0, 4, name=name)
        yield waitOnReactor(lambda: all(len(self.record(n)["online"]) == 3 for n in names), 10)
        code, _ = yield self.call(1, "POST", "/api/rebalance/queues")
        self.assertEqual(code, 204)
        leaders = sorted(self.record(n)["node"] for n in names)
        self.assertEqual(leaders, ["n1", "n2", "n3"])
        for name in names:
            i = int(self.record(name)["node"][1:]) - 1
            yield waitOnReactor(lambda: self.leaderLog(i, name) is not None, 5)
            self.assertEqual(self.leaderLog(i, name).committed, 4)
        yield waitOnReactor(lambda: all(len(self.record(n)["online"]) == 3 for n in names), 10)
