"""
The stream door on a cluster node that does not lead the stream
(docs/streams.md, "In a cluster"), on task.Clock: two brokers, the
leader's (the stream's log, its BrokerStreams answering) and another
node's, whose RemoteQueue reaches the leader over a fake link that hands
STREAM_DEDUP frames and requests to the leader's backend as the real link
does (otter_tx.cluster.link).  Tracking (query_offset, store_offset,
query_publisher_sequence, stream_stats) is the leader's; a publisher with a
reference is de-duplicated there; a leader down or silent answers
STREAM_NOT_AVAILABLE.
"""

import struct
from types import SimpleNamespace

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.broker.broker import Broker
from otter_tx.cluster import wire as cwire
from otter_tx.cluster.link import LinkLost
from otter_tx.cluster.remote import RemoteQueue
from otter_tx.door import stream as door
from otter_tx.door.streambackend import BrokerStreams
from otter_tx.stream import chunk, wire
from otter_tx.test.unit.test_stream_door import Client, confirms


class FakeLink:
    """What RemoteQueue uses of a LinkProtocol, delivering to the leader's backend at once."""

    def __init__(self, leader):
        self.leader = leader
        self.frames = []
        self.pending = []     # what the leader's SYNCED waits for
        self.refusedSet = set()
        self.silent = False   # requests are never answered (a paused node)
        self.n = 0

    def _taken(self, taken):
        self.n += 1
        if taken is False:
            self.refusedSet.add(self.n)
        elif taken is not None:
            self.pending.append(taken.sync())
        return self.n

    def streamDedup(self, names, reference, groups, entries):
        # through the wire encoding, as the other end reads it
        frame = cwire.streamDedup(names, reference, groups, entries)
        vhost, queue, ref, gs, data = cwire.readStreamDedup(cwire.Reader(frame[5:]))
        return self._taken(self.leader.appendForwarded(vhost, queue, ref, gs, data))

    def streamAppend(self, names, count, entries):
        r = cwire.Reader(names)
        vhost, queue = r.string(), r.string()
        _, d = self.leader.append(vhost, queue, None, list(range(count)), entries, count)
        return self._taken(None if d is None else _Pending(d))

    _chain = None

    def sync(self):
        # as the link's SYNCED: in order, each after the writes forwarded before it
        pending, self.pending = self.pending, []
        if self._chain is not None and not self._chain.called:
            pending.insert(0, self._chain)
        d = defer.DeferredList(pending, fireOnOneErrback=True, consumeErrors=True).addCallback(lambda _: None)
        self._chain = d
        out = defer.Deferred()
        d.addBoth(lambda r: out.callback(None) if not isinstance(r, Failure) else out.errback(r))
        return out

    def refused(self, n):
        return n in self.refusedSet

    def ask(self, op, args):
        if self.silent:
            return defer.Deferred()
        return defer.maybeDeferred(self.leader.broker.clusterHandlers[op], args)


class _Pending:
    def __init__(self, d):
        self.d = d

    def sync(self):
        return self.d


class LeaderTrackingTests(SynchronousTestCase):

    def setUp(self):
        self.clock = Clock()
        self.home = Broker(self.clock, memoryHighWatermark=None)
        self.addCleanup(self.home.streams.close)
        self.leader = BrokerStreams(self.home, self.clock)
        self.assertEqual(self.leader.create("/", "s", {}), wire.OK)
        self.other = Broker(self.clock, memoryHighWatermark=None)
        self.addCleanup(self.other.streams.close)
        self.link = FakeLink(self.leader)
        self.node = SimpleNamespace(links={"n1": self.link}, handlers={},
                                    nodes={"n1": {"host": "h1", "stream_port": 5553}},
                                    replication=SimpleNamespace(replicas={}, records={}))
        self.other.cluster = self.node
        self.backend = BrokerStreams(self.other, self.clock)
        vh = self.other.vhosts["/"]
        self.rq = vh.remoteQueues["s"] = RemoteQueue(self.node, vh, "s", {
            "node": "n1", "durable": True, "auto_delete": False, "exclusive": False,
            "arguments": {"x-queue-type": "stream"}})
        self.factory = door.StreamServerFactory(self.other, self.backend, self.clock, heartbeat=0)

    def client(self):
        c = Client(self.factory, self.clock)
        self.assertEqual(c.handshake(), wire.OK)
        return c

    def settle(self):
        for b in (self.home, self.other):
            for _ in range(3):
                self.clock.advance(0)
                if hasattr(b.streams, "drain"):
                    b.streams.drain()
        self.clock.advance(0)

    def log(self):
        return self.home.vhosts["/"].queues["s"].stream

    def test_handlersRegistered(self):
        """The leader's backend answers the other nodes' questions (its broker's cluster handlers)."""
        self.assertTrue({"stream.queryOffset", "stream.storeOffset", "stream.sequence",
                         "stream.stats"} <= set(self.home.clusterHandlers))
        # and the other node's too, once in a cluster
        self.assertIn("stream.sequence", self.node.handlers)

    def test_publisherWithReferenceDeduplicatedAtLeader(self):
        """
        ids at or below the leader's sequence are confirmed and not written
        (RabbitMQ's de-duplication); the confirm comes after the leader's write.
        """
        c = self.client()
        self.assertEqual(c.declarePublisher(1, "ref", "s"), wire.OK)
        c.feed(wire.publishFrame(1, [(1, b"a"), (2, b"b")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [1, 2])])
        c.feed(wire.publishFrame(1, [(2, b"b"), (3, b"c")]))
        c.feed(wire.publishFrame(1, [(1, b"a")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [2, 3]), (1, [1])])
        self.assertEqual([m for _, m in self.leader.messages("/", "s")], [b"a", b"b", b"c"])
        self.assertEqual(self.leader.sequence("/", "s", "ref"), 3)
        code, rest = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("ref") + wire.encodeString("s"))
        self.assertEqual((code, struct.unpack(">Q", rest)[0]), (wire.OK, 3))
        code, rest = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("nobody") + wire.encodeString("s"))
        self.assertEqual((code, struct.unpack(">Q", rest)[0]), (wire.OK, 0))
        # nothing of it kept on this node
        self.assertEqual(self.backend.tracking.get("/", "s")["sequences"], {})

    def test_subEntryBatchOneId(self):
        """A sub-entry batch's messages share its publishing id: kept or dropped together at the leader."""
        c = self.client()
        c.declarePublisher(1, "ref", "s")
        inner = struct.pack(">I", 1) + b"x" + struct.pack(">I", 1) + b"y"

        def sub(pid):
            return (struct.pack(">Q", pid) + struct.pack(">BH", 0x80, 2)
                    + struct.pack(">II", len(inner), len(inner)) + inner)

        def publish(*entries):
            body = struct.pack(">HHBI", wire.PUBLISH, 1, 1, len(entries)) + b"".join(entries)
            c.feed(struct.pack(">I", len(body)) + body)

        plain = struct.pack(">Q", 6) + struct.pack(">I", 1) + b"z"
        publish(sub(5), plain)
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [5, 6])])
        publish(sub(5), sub(7))
        self.settle()
        self.assertEqual(confirms(c.read()), [(1, [5, 7])])
        self.assertEqual([m for _, m in self.leader.messages("/", "s")], [b"x", b"y", b"z", b"x", b"y"])
        self.assertEqual(self.leader.sequence("/", "s", "ref"), 7)

    def test_appendForwardedGroups(self):
        """appendForwarded: groups at or below the sequence dropped; None when nothing is written."""
        data = chunk.entries([b"1", b"2", b"3"])
        self.assertIsNotNone(self.leader.appendForwarded("/", "s", "r", [(1, 2), (2, 1)], data))
        self.assertIsNone(self.leader.appendForwarded("/", "s", "r", [(1, 2), (2, 1)], data))
        self.assertIs(self.leader.appendForwarded("/", "nosuch", "r", [(1, 1)], chunk.entries([b"1"])), False)
        self.settle()
        self.assertEqual(self.log().committed, 3)

    def test_offsetsAtLeader(self):
        """store_offset there, query_offset there and at the leader agree; NO_OFFSET for none."""
        c = self.client()
        q = wire.encodeString("reader") + wire.encodeString("s")
        c.feed(wire._frame(struct.pack(">HH", wire.STORE_OFFSET, 1) + q + struct.pack(">Q", 42)))
        self.settle()
        self.assertEqual(self.leader.queryOffset("/", "s", "reader"), 42)
        code, rest = c.call(wire.QUERY_OFFSET, wire.encodeString("reader") + wire.encodeString("s"))
        self.assertEqual((code, struct.unpack(">Q", rest)[0]), (wire.OK, 42))
        code, _ = c.call(wire.QUERY_OFFSET, wire.encodeString("nobody") + wire.encodeString("s"))
        self.assertEqual(code, wire.NO_OFFSET)
        code, _ = c.call(wire.QUERY_OFFSET, wire.encodeString("reader") + wire.encodeString("nosuch"))
        self.assertEqual(code, wire.STREAM_DOES_NOT_EXIST)

    def test_streamStatsAtLeader(self):
        self.leader.publish("/", "s", None, [(1, b"a"), (2, b"b")])
        self.settle()
        c = self.client()
        code, rest = c.call(wire.STREAM_STATS, wire.encodeString("s"))
        self.assertEqual(code, wire.OK)
        self.assertEqual(rest, wire.streamStatsResponse(0, wire.OK, self.leader.stats("/", "s"))[14:])

    def test_leaderDown(self):
        """The leader's node down: every question and a referenced publisher are STREAM_NOT_AVAILABLE."""
        c = self.client()
        self.assertEqual(c.declarePublisher(1, "ref", "s"), wire.OK)
        self.rq.down = True
        q = wire.encodeString("reader") + wire.encodeString("s")
        self.assertEqual(c.call(wire.QUERY_OFFSET, q)[0], wire.STREAM_NOT_AVAILABLE)
        self.assertEqual(c.call(wire.QUERY_PUBLISHER_SEQUENCE, q)[0], wire.STREAM_NOT_AVAILABLE)
        self.assertEqual(c.call(wire.STREAM_STATS, wire.encodeString("s"))[0], wire.STREAM_NOT_AVAILABLE)
        self.assertEqual(c.declarePublisher(2, "ref2", "s"), wire.STREAM_NOT_AVAILABLE)
        c.feed(wire.publishFrame(1, [(1, b"a")]))
        self.settle()
        self.assertEqual(confirms(c.read()), [("error", 1, [(1, wire.STREAM_NOT_AVAILABLE)])])

    def test_leaderSilent(self):
        """A leader that does not answer (a paused node): STREAM_NOT_AVAILABLE after homeTimeout, not a hang."""
        c = self.client()
        self.link.silent = True
        c.feed(wire.request(wire.QUERY_OFFSET, 9, wire.encodeString("reader") + wire.encodeString("s")))
        self.assertEqual(c.read(), [])
        self.clock.advance(self.backend.homeTimeout)
        (k, v, body), = c.read()
        self.assertEqual((k, struct.unpack_from(">IH", body)), (wire.QUERY_OFFSET | wire.RESPONSE_FLAG,
                                                               (9, wire.STREAM_NOT_AVAILABLE)))

    def test_linkLost(self):
        """The link lost before the answer: STREAM_NOT_AVAILABLE at once."""
        c = self.client()
        self.link.ask = lambda op, args: defer.fail(LinkLost("lost"))
        code, _ = c.call(wire.QUERY_PUBLISHER_SEQUENCE, wire.encodeString("ref") + wire.encodeString("s"))
        self.assertEqual(code, wire.STREAM_NOT_AVAILABLE)

    def test_notLeaderAnymore(self):
        """A node asked about a stream it no longer leads answers as RabbitMQ would for each case."""
        self.assertEqual(self.leader.answerHome("stream.sequence", {"vhost": "/", "name": "gone",
                                                                    "reference": "r"}),
                         {"code": wire.STREAM_DOES_NOT_EXIST})
        self.assertEqual(self.backend.answerHome("stream.sequence", {"vhost": "/", "name": "s",
                                                                     "reference": "r"}),
                         {"code": wire.STREAM_NOT_AVAILABLE})


class StreamDedupFrameTests(SynchronousTestCase):
    def test_roundTrip(self):
        names = cwire.string("/") + cwire.string("s")
        frame = cwire.streamDedup(names, "ref", [(1, 1), (2 ** 63, 3)], b"entries")
        (kind, payload), = cwire.splitFrames(frame)[0]
        self.assertEqual(kind, cwire.STREAM_DEDUP)
        self.assertEqual(cwire.STREAM_DEDUP, 20)
        self.assertEqual(cwire.readStreamDedup(cwire.Reader(payload)),
                         ("/", "s", "ref", [(1, 1), (2 ** 63, 3)], b"entries"))
