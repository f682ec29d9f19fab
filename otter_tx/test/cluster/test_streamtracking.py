"""
The stream protocol's tracking on a node that does not lead the stream
(docs/streams.md, "In a cluster"): query_offset, store_offset,
query_publisher_sequence and stream_stats are answered by the stream's
leader over the link, and a publisher with a reference (de-duplication)
publishes there through the leader, which keeps its sequence.  Two
in-process nodes (test_inprocess.ClusterCase), driven by rstream's client
and the raw client of the interop tests.
"""

import asyncio

from twisted.internet.defer import inlineCallbacks

from otter_tx.stream import wire
from otter_tx.test.cluster.test_inprocess import RStreamClusterCase
from otter_tx.test.interop.support import waitOnReactor

N = 20


class TrackingOnOtherNodeTests(RStreamClusterCase):

    nodes = 2
    stream = True


    def inAsyncio(self, f):
        return self.inThread(lambda: asyncio.run(asyncio.wait_for(f(), 40)))

    async def client(self, i):
        from rstream.client import Client

        c = Client("127.0.0.1", self.fixtures[i].streamPort, frame_max=1048576, heartbeat=60)
        await c.start()
        await c.authenticate("/", "guest", "guest")
        return c

    def raw(self, i):
        from otter_tx.test.interop.stream_raw import RawStreamClient

        c = RawStreamClient("127.0.0.1", self.fixtures[i].streamPort, timeout=10)
        self.addCleanup(c.close)
        self.assertEqual(c.handshake(), wire.OK)
        return c

    def leaderLog(self, name):
        return self.fixtures[0].broker.vhosts["/"].queues[name].stream

    @inlineCallbacks
    def create(self, name, size):
        async def create():
            c = await self.client(0)
            try:
                await c.create_stream(name, arguments={"initial-cluster-size": str(size)})
            finally:
                await c.close()

        yield self.inAsyncio(create)
        self.assertIn(name, self.fixtures[0].broker.vhosts["/"].queues)
        yield waitOnReactor(lambda: name in self.fixtures[1].broker.vhosts["/"].remoteQueues, 5)

    def scenario(self, name):
        """Through node 2 (not the leader): de-duplicated publishes, the sequence, offsets."""
        rs = self.rs
        from rstream import schema

        async def run():
            out = {}
            b = await self.client(1)
            try:
                confirmed = []
                errors = []
                b.add_handler(schema.PublishConfirm, lambda f: confirmed.extend(f.publishing_ids))
                b.add_handler(schema.PublishError, lambda f: errors.append(f))
                # a publisher with a reference (a named producer) on a node that does not lead
                await b.declare_publisher(name, "producer-1", 1)
                out["sequence before"] = await b.query_publisher_sequence(name, "producer-1")
                for rnd in range(2):
                    # ids 1..N, twice: the second round is confirmed and not stored
                    await b.publish([schema.Message(publishing_id=k,
                                                    data=bytes(rs.AMQPMessage(body=b"m%d-%d" % (rnd, k))),
                                                    filter_value=None) for k in range(1, N + 1)], 1)
                    for _ in range(200):
                        if len(confirmed) >= N * (rnd + 1) or errors:
                            break
                        await asyncio.sleep(0.05)
                out["confirmed"] = sorted(confirmed)
                out["errors"] = len(errors)
                out["sequence"] = await b.query_publisher_sequence(name, "producer-1")
                out["unknown sequence"] = await b.query_publisher_sequence(name, "nobody")
                await b.store_offset(name, "reader-1", 7)
                out["offset via 2"] = await b.query_offset(name, "reader-1")
                r = await b.sync_request(schema.QueryOffset(b._corr_id_seq.next(), reference="nobody", stream=name),
                                         resp_schema=schema.QueryOffsetResponse, raise_exception=False)
                out["no offset"] = r.response_code
            finally:
                await b.close()
            a = await self.client(0)
            try:
                out["offset via 1"] = await a.query_offset(name, "reader-1")
                out["sequence via 1"] = await a.query_publisher_sequence(name, "producer-1")
            finally:
                await a.close()
            return out

        return self.inAsyncio(run)

    def stats(self, i, name):
        def run():
            return self.raw(i).call(wire.STREAM_STATS, wire.encodeString(name))

        return self.inThread(run)

    @inlineCallbacks
    def check(self, name):
        out = yield self.scenario(name)
        self.assertEqual(out, {
            "sequence before": 0, "confirmed": sorted(list(range(1, N + 1)) * 2), "errors": 0,
            "sequence": N, "unknown sequence": 0,
            "offset via 2": 7, "no offset": wire.NO_OFFSET, "offset via 1": 7, "sequence via 1": N,
        })
        log = self.leaderLog(name)
        self.assertEqual(log.committed, N)
        got = self.fixtures[0].service.streamFactory.backend.messages("/", name)
        # the first round's messages, each once
        self.assertEqual([bytes(m).endswith(b"m0-%d" % k) for k, (_, m) in enumerate(got, 1)], [True] * N)
        here = yield self.stats(0, name)
        there = yield self.stats(1, name)
        self.assertEqual(here[0], wire.OK)
        self.assertEqual(there, here)

    @inlineCallbacks
    def test_nodeWithoutMember(self):
        """A stream with one member (node 1): node 2 answers from it and its publisher de-duplicates there."""
        yield self.create("t1", 1)
        yield self.check("t1")

    @inlineCallbacks
    def test_follower(self):
        """A replicated stream: node 2 holds a replica, and asks the leader all the same."""
        yield self.create("t2", 2)
        yield waitOnReactor(lambda: ("/", "t2") in self.cluster[1].replication.replicas, 5)
        yield self.check("t2")
        replica = self.cluster[1].replication.replicas[("/", "t2")].stream
        yield waitOnReactor(lambda: replica.committed == N, 5)
        # the leader ships its tracking: the follower holds the sequence and the offset too
        backend = self.fixtures[1].service.streamFactory.backend
        yield waitOnReactor(lambda: backend.tracking.get("/", "t2")["offsets"].get("reader-1") == 7, 5)
        self.assertEqual(backend.tracking.get("/", "t2")["sequences"].get("producer-1"), N)

    @inlineCallbacks
    def test_leaderDown(self):
        """The leader's node gone (and no member elsewhere): STREAM_NOT_AVAILABLE, at once."""
        yield self.create("t3", 1)
        n = self.cluster[0]
        n.running = False
        for link in list(n.links.values()):
            link.transport.abortConnection()
        rq = self.fixtures[1].broker.vhosts["/"].remoteQueues["t3"]
        yield waitOnReactor(lambda: rq.down, 5)

        def run():
            c = self.raw(1)
            q = wire.encodeString("reader-1") + wire.encodeString("t3")
            return {
                "query_offset": c.call(wire.QUERY_OFFSET, q)[0],
                "sequence": c.call(wire.QUERY_PUBLISHER_SEQUENCE, q)[0],
                "stats": c.call(wire.STREAM_STATS, wire.encodeString("t3"))[0],
                "publisher": c.declarePublisher(1, "producer-1", "t3"),
            }

        out = yield self.inThread(run)
        self.assertEqual(out, {"query_offset": wire.STREAM_NOT_AVAILABLE, "sequence": wire.STREAM_NOT_AVAILABLE,
                               "stats": wire.STREAM_NOT_AVAILABLE, "publisher": wire.STREAM_NOT_AVAILABLE})
