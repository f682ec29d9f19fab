"""
Deterministic tests (task.Clock, writes inline) for what a stream's
replication does to a log (otter_tx/cluster/streamrepl.py and
StreamLog.appendReplicated / truncate / reset): a follower's log holds the
leader's records at the same offsets, is cut where a new epoch starts, and
starts again where the leader's retention left it.
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.message import Message
from otter_tx.broker.stream import StreamReader, StreamRegistry
from otter_tx.cluster import wire
from otter_tx.cluster.streamrepl import cutPoint, initialClusterSize
from otter_tx.store.log import segments as _seg


def message(body):
    return Message("", "s", encodeProperties({}), body)


class _Shipper:
    """A stand-in replicator: records what the leader's group commits ship."""

    def __init__(self):
        self.joined = {"n2": object()}
        self.items = []

    def flushed(self, items):
        if items:
            self.items.extend(items)


class FollowerLogTests(SynchronousTestCase):

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.leaderRegistry = StreamRegistry(self.mktemp())
        self.followerRegistry = StreamRegistry(self.mktemp())
        self.addCleanup(self.leaderRegistry.close)
        self.addCleanup(self.followerRegistry.close)
        self.leader = self.leaderRegistry.open(self.clock, "/", "s", 4096)
        self.follower = self.followerRegistry.open(self.clock, "/", "s", 4096)
        self.shipper = _Shipper()
        self.leader.replicator = self.shipper

    def read(self, log):
        r = StreamReader(log, log.first)
        out = []
        try:
            while True:
                got = r.read(1000)
                if not got:
                    return out
                out.extend((o, m.body) for o, _, m in got)
        finally:
            r.close()

    def ship(self):
        """What the leader wrote, through the wire format, appended by the follower."""
        frame = wire.streamRecords(b"", 1, self.shipper.items)
        self.shipper.items = []
        r = wire.Reader(frame, 4 + 1 + 8 + 1)
        ok = self.follower.appendReplicated(wire.readStreamRecords(r))
        self.clock.advance(0)
        return ok

    def test_sameRecordsSameOffsets(self):
        """AMQP 0-9-1 messages and stream protocol batches reach the follower at the leader's offsets."""
        for i in range(5):
            self.leader.append(message(b"a%d" % i), wantDeferred=False)
        self.leader.appendEntries(b"\x00\x00\x00\x02b0\x00\x00\x00\x02b1", 2, wantDeferred=False)
        self.clock.advance(0)
        self.assertTrue(self.ship())
        self.assertEqual((self.follower.committed, self.follower.next), (7, 7))
        leaderOffsets = [o for o, _ in self.read(self.leader)]
        self.assertEqual([o for o, _ in self.read(self.follower)], leaderOffsets)
        self.assertEqual([b for _, b in self.read(self.follower)][:5], [b"a%d" % i for i in range(5)])

    def test_gapRefused(self):
        """Records that do not start at the follower's next offset are refused (it joins again)."""
        for i in range(3):
            self.leader.append(message(b"a%d" % i), wantDeferred=False)
        self.clock.advance(0)
        self.shipper.items = self.shipper.items[1:]
        self.assertFalse(self.ship())
        self.assertEqual(self.follower.committed, 0)

    def test_truncateCutsAtTheRecord(self):
        """A follower's log cut at an offset ends there (or at the start of the chunk holding it)."""
        for k in range(4):
            for i in range(10):
                self.follower.append(message(b"m%d" % (k * 10 + i)), wantDeferred=False)
            self.clock.advance(0)
        self.assertEqual(self.follower.committed, 40)
        end = self.follower.truncate(20)
        self.assertEqual(end, 20)
        self.assertEqual(self.read(self.follower), [(i, b"m%d" % i) for i in range(20)])
        # it goes on from there, and reopens the same
        self.follower.append(message(b"new"), wantDeferred=False)
        self.clock.advance(0)
        self.assertEqual(self.read(self.follower)[-1], (20, b"new"))
        # a cut inside a chunk drops that chunk whole
        end = self.follower.truncate(15)
        self.assertEqual(end, 10)
        self.assertEqual(self.read(self.follower), [(i, b"m%d" % i) for i in range(10)])

    def test_truncateAcrossSegments(self):
        """A cut in an earlier segment deletes the later ones."""
        for i in range(200):
            self.follower.append(message(b"x" * 100), wantDeferred=False)
            self.clock.advance(0)
        self.assertGreater(len(self.follower.log.segments), 2)
        self.follower.truncate(30)
        self.assertEqual(self.follower.committed, 30)
        self.assertEqual([s.first < 30 for s in self.follower.log.segments], [True, True])
        self.assertEqual(self.read(self.follower)[-1][0], 29)

    def test_resetStartsAtTheLeadersFirst(self):
        """A follower behind the leader's retention starts again, empty, at the leader's first offset."""
        for i in range(5):
            self.follower.append(message(b"old"), wantDeferred=False)
        self.clock.advance(0)
        self.follower.reset(1000)
        self.assertEqual((self.follower.first, self.follower.committed), (1000, 1000))
        rec = _seg.encodedEnq(1000, 1000, 5.0, None, False, b"", b"s", encodeProperties({}), b"late")
        self.assertTrue(self.follower.appendReplicated([(0, 1000, 5.0, 1, rec)]))
        self.clock.advance(0)
        self.assertEqual(self.read(self.follower), [(1000, b"late")])


class RulesTests(SynchronousTestCase):

    def test_cutPoint(self):
        """A follower is cut at the start of the first epoch after its last record's, when its log goes past it."""
        epochs = [[1, 0], [2, 80], [4, 120]]
        self.assertIsNone(cutPoint(epochs, 4, 130))
        self.assertEqual(cutPoint(epochs, 1, 95), 80)
        self.assertIsNone(cutPoint(epochs, 1, 80))
        self.assertEqual(cutPoint(epochs, 2, 125), 120)
        self.assertEqual(cutPoint(epochs, 3, 125), 120)
        self.assertIsNone(cutPoint(epochs, 0, 0))

    def test_initialClusterSize(self):
        """x-initial-cluster-size: default every node, at most the nodes there are."""
        self.assertEqual(initialClusterSize({}, 3), 3)
        self.assertEqual(initialClusterSize({"x-initial-cluster-size": 2}, 3), 2)
        self.assertEqual(initialClusterSize({"x-initial-cluster-size": 5}, 3), 3)
        self.assertEqual(initialClusterSize({"x-initial-cluster-size": "x"}, 3), 3)


class WriterTests(SynchronousTestCase):
    """A publish another node forwards with its writer id and sequence is taken once (StreamQueue.enqueueFrom)."""

    def setUp(self):
        from otter_tx.broker.broker import Broker

        self.clock = Clock()
        self.broker = Broker(self.clock, streamDirectory=self.mktemp())
        self.addCleanup(self.broker.streams.close)
        vh = self.broker.vhosts["/"]
        self.q = vh.declareQueue("s", None, durable=True, arguments={"x-queue-type": "stream"})

    def test_sequenceTakenOnce(self):
        q = self.q
        self.assertTrue(q.enqueueFrom(("n2:a", 1), message(b"one")))
        self.assertTrue(q.enqueueFrom(("n2:a", 2), message(b"two")))
        # sent again after a leader change: confirmed, not appended
        self.assertTrue(q.enqueueFrom(("n2:a", 2), message(b"two")))
        self.assertTrue(q.enqueueFrom(("n2:a", 1), message(b"one")))
        # another writer's sequences are its own
        self.assertTrue(q.enqueueFrom(("n3:b", 1), message(b"other")))
        self.clock.advance(0)
        self.assertEqual(q.stream.committed, 3)
        self.assertEqual(q.stream.writers, {"n2:a": 2, "n3:b": 1})

    def test_forwardFrameCarriesTheWriter(self):
        """FORWARD's flag 2: the writer id and sequence follow the message."""
        frame = wire.forwardNamed(wire.string("/") + wire.string("s"), True, message(b"x"), ("n2:a", 7))
        r = wire.Reader(frame, 5)
        self.assertEqual((r.string(), r.string(), r.u8()), ("/", "s", 3))
        r.message()
        self.assertEqual((r.string(), r.u64()), ("n2:a", 7))


class _Barrier:
    """A stand-in replicator whose group commit barriers the test fires."""

    def __init__(self):
        self.joined = {}
        self.barriers = []

    def flushed(self, items):
        from twisted.internet.defer import Deferred

        d = Deferred()
        self.barriers.append(d)
        return d


class ReplicatedCommitTests(SynchronousTestCase):
    """
    A leader's group commit is confirmed once it is durable here and its
    replication barrier fired (one barrier a commit, not one a publish); a
    stream's sync() waits for the appends made so far only.
    """

    def setUp(self):
        self.clock = Clock()
        self.registry = StreamRegistry(self.mktemp())
        self.addCleanup(self.registry.close)
        self.log = self.registry.open(self.clock, "/", "s", 1 << 20)
        self.rep = _Barrier()
        self.log.replicator = self.rep

    def test_confirmWaitsForTheBarrier(self):
        got = []
        for i in range(3):
            self.log.appendEntries(b"\x00\x00\x00\x01x", 1).addCallback(got.append)
        self.clock.advance(0)
        self.assertEqual((self.log.committed, len(self.rep.barriers), got), (3, 1, []))
        self.rep.barriers[0].callback(None)
        self.assertEqual(got, [0, 1, 2])

    def test_failedBarrierFailsTheCommit(self):
        from otter_tx.cluster.replication import NoMajority

        failed = []
        self.log.appendEntries(b"\x00\x00\x00\x01x", 1).addErrback(lambda f: failed.append(f.type))
        self.clock.advance(0)
        self.rep.barriers[0].errback(NoMajority("no"))
        self.assertEqual(failed, [NoMajority])

    def test_appendsUnderAReplicatorGoneBeforeTheirCommit(self):
        """An append made while leading still waits for that replicator's barrier."""
        got = []
        self.log.appendEntries(b"\x00\x00\x00\x01x", 1).addCallback(got.append)
        self.log.replicator = None
        self.clock.advance(0)
        self.assertEqual((len(self.rep.barriers), got), (1, []))
        self.rep.barriers[0].callback(None)
        self.assertEqual(got, [0])

    def test_syncWaitsForAppendsSoFarOnly(self):
        """A follower's SYNC under a steady stream: answered once what came before it is durable."""
        log = self.log
        log.replicator = None
        run = []
        # writes off the reactor: each one completes when the test says
        from twisted.internet.defer import Deferred

        def runInThread(f):
            d = Deferred()
            run.append((f, d))
            return d

        self.registry.runInThread = runInThread

        def complete():
            f, d = run.pop(0)
            f()
            d.callback(None)

        log.appendEntries(b"\x00\x00\x00\x01x", 1, wantDeferred=False)
        self.clock.advance(0)
        synced = []
        log.sync().addCallback(synced.append)
        # more arrives while the first commit is written
        log.appendEntries(b"\x00\x00\x00\x01y", 1, wantDeferred=False)
        later = []
        log.sync().addCallback(later.append)
        complete()
        self.assertEqual((synced, later, log.committed), ([None], [], 1))
        complete()
        self.assertEqual(later, [None])


class RecordPartsTests(SynchronousTestCase):
    """R_SAPPEND as parts (sent without joining) is the frame streamRecords makes."""

    def test_partsAreTheFrame(self):
        items = [(1, 10, 5.0, 2, b"\x00\x00\x00\x01a\x00\x00\x00\x01b"), (0, 12, 6.0, 1, b"enq-record")]
        names = wire.string("/") + wire.string("s")
        parts = wire.streamRecordParts(names, 3, items)
        self.assertIs(parts[-1], items[-1][4])
        frame = b"".join(parts)
        self.assertEqual(frame, wire.streamRecords(names, 3, items))
        frames, used = wire.splitFrames(bytearray(frame + b"\x00\x00"))
        self.assertEqual((used, len(frames), frames[0][0]), (len(frame), 1, wire.REPLICATE))
        r = wire.Reader(frames[0][1])
        self.assertEqual((r.string(), r.string(), r.u64(), r.u8()), ("/", "s", 3, wire.R_SAPPEND))
        self.assertEqual(wire.readStreamRecords(r), items)

    def test_noItems(self):
        frame = b"".join(wire.streamRecordParts(b"", 1, []))
        frames, _ = wire.splitFrames(frame)
        r = wire.Reader(frames[0][1])
        self.assertEqual((r.u64(), r.u8(), r.u32()), (1, wire.R_SAPPEND, 0))


class WritePartsTests(SynchronousTestCase):
    """LinkProtocol's direct writes: what the socket does not take goes through the transport, in order."""

    def test_partialSend(self):
        from twisted.internet.testing import StringTransport

        from otter_tx.cluster import link

        class Sock:
            def __init__(self, take):
                self.take = take
                self.got = b""

            def sendmsg(self, parts):
                data = b"".join(bytes(p) for p in parts)[:self.take]
                self.take -= len(data)
                self.got += data
                return len(data)

        for take in (0, 3, 5, 9, 100):
            sock = Sock(take)
            self.patch(link, "directSocket", lambda t: sock)
            t = StringTransport()
            link.writeParts(t, [b"abc", memoryview(b"defg"), b"", b"hij"])
            self.assertEqual(sock.got + t.value(), b"abcdefghij", take)
            self.assertEqual(len(sock.got), min(take, 10))

    def test_notATcpTransport(self):
        from twisted.internet.testing import StringTransport

        from otter_tx.cluster import link

        t = StringTransport()
        link.writeParts(t, [b"ab", memoryview(b"cd")])
        self.assertEqual(t.value(), b"abcd")


class HeldOutputTests(SynchronousTestCase):
    """
    A link's direct writes: what the socket does not take is held by the
    link (not the transport's buffer) and written when the socket is
    writable, in order with later output; the node's publishers are in flow
    while it holds more than LINK_HIGH_WATER.
    """

    def test_heldUntilWritable(self):
        from otter_tx.cluster import link

        class Sock:
            take = 0
            got = b""

            def sendmsg(self, parts):
                data = b"".join(bytes(p) for p in parts)[:self.take]
                self.take -= len(data)
                self.got += data
                return len(data)

        class Transport:
            writing = False

            def __init__(self):
                self.socket = Sock()
                self.written = b""

            def startWriting(self):
                self.writing = True

            def stopWriting(self):
                self.writing = False

            def writeSequence(self, data):
                self.written += b"".join(data)

            def doWrite(self):
                # (the transport's own: nothing of its own to write)
                self.stopWriting()

        class Node:
            def __init__(self):
                self.clock = Clock()
                self.events = []

            def linkPaused(self, l):
                self.events.append("paused")

            def linkResumed(self, l):
                self.events.append("resumed")

        t = Transport()
        node = Node()
        proto = link.LinkProtocol(node)
        proto.transport = t
        proto.connected = True
        proto.peer = "n2"
        self.patch(link, "directSocket", lambda tr: tr.socket)
        self.patch(link, "LINK_HIGH_WATER", 8)
        t.socket.take = 3
        proto.sendParts([b"abcd", b"efgh", memoryview(b"ij")])
        proto.flush()
        self.assertEqual((t.socket.got, t.writing, proto.paused), (b"abc", True, False))
        # later output, direct or not, goes after what is held
        proto.send(b"KLMNOP")
        proto.flush()
        self.assertEqual((proto._heldBytes, proto.paused, node.events), (13, True, ["paused"]))
        t.socket.take = 5
        self.assertIsNone(t.doWrite())
        self.assertEqual((t.socket.got, t.writing, proto.paused), (b"abcdefgh", True, True))
        t.socket.take = 100
        self.assertIsNone(t.doWrite())
        self.assertEqual(t.socket.got, b"abcdefghijKLMNOP")
        self.assertEqual((t.writing, proto.paused, node.events, proto._held), (False, False, ["paused", "resumed"],
                                                                               None))
        self.assertNotIn("doWrite", vars(t))
        self.assertEqual(t.written, b"")
