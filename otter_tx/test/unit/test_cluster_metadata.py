"""
The cluster's metadata helpers without sockets: the in-memory stand-in of
etcd and :class:`~otter_tx.cluster.metadata.OrderedWrites` (a node's writes
in order per key; the watch's echo of them never undoes a later change).
"""

from twisted.internet import defer, task
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.cluster import metadata as md
from otter_tx.cluster import wire


class MemoryMetadataTests(SynchronousTestCase):

    def test_createOnce(self):
        m = md.MemoryMetadata(task.Clock())
        first = self.successResultOf(m.create("queues/%2F/q", {"node": "a"}))
        second = self.successResultOf(m.create("queues/%2F/q", {"node": "b"}))
        self.assertEqual((first[0], second[0], second[1]), (True, False, {"node": "a"}))

    def test_seedOnlyIntoAnEmptyPrefix(self):
        """seed puts every item when nothing is under the prefix, and none when something is."""
        m = md.MemoryMetadata(task.Clock())
        self.successResultOf(m.put("entities-x", {}))
        items = [("entities/vhost/%2F", {"a": 1}), ("entities/user/guest", {"b": 2})]
        ok, revision = self.successResultOf(m.seed("entities/", items))
        self.assertEqual((ok, revision), (True, 3))
        self.assertEqual(self.successResultOf(m.seed("entities/", [("entities/user/other", {})])), (False, 3))
        self.assertEqual(self.successResultOf(m.load("entities/")), (sorted(items), 3))

    def test_seedEchoDropped(self):
        """A seeded key's watch echo is dropped (ownWrite); another node's later write to it is applied."""
        w = md.OrderedWrites(md.MemoryMetadata(task.Clock()), [].extend)
        w.ownWrite("entities/user/guest", 5)
        self.assertFalse(w.accept(("put", "entities/user/guest", {}, 4)))
        self.assertFalse(w.accept(("put", "entities/user/guest", {}, 5)))
        self.assertTrue(w.accept(("put", "entities/user/guest", {}, 6)))
        self.assertEqual(w.lastRevision, 5)

    def test_leaseExpiryDeletesItsKeys(self):
        clock = task.Clock()
        m = md.MemoryMetadata(clock)
        seen = []
        m.watch("", 1, seen.extend)
        lease = self.successResultOf(m.grantLease(5))
        m.put("nodes/a", {}, lease=lease)
        m.put("queues/%2F/t", {}, lease=lease)
        m.expireLease(lease)
        clock.advance(0)
        self.assertEqual([(e[0], e[1]) for e in seen],
                         [("put", "nodes/a"), ("put", "queues/%2F/t"), ("delete", "nodes/a"),
                          ("delete", "queues/%2F/t")])


class OrderedWritesTests(SynchronousTestCase):

    def setUp(self):
        self.clock = task.Clock()
        self.m = md.MemoryMetadata(self.clock)
        self.applied = []
        self.writes = md.OrderedWrites(self.m, self.applied.extend)
        self.m.watch("", 1, lambda evs: self.applied.extend(e for e in evs if self.writes.accept(e)))

    def test_echoOfAnEarlierWriteIsDropped(self):
        """Put then delete at once: the put's echo arrives after the delete and is dropped."""
        self.writes.write("exchanges/%2F/x", lambda: self.m.put("exchanges/%2F/x", {"type": "direct"}))
        self.writes.write("exchanges/%2F/x", lambda: self.m.delete("exchanges/%2F/x"))
        self.clock.advance(0)
        self.assertEqual(self.applied, [])

    def test_anotherNodesLaterWriteIsApplied(self):
        """While our write is in flight another node writes the key after it: theirs is applied after ours."""
        gate = defer.Deferred()
        self.writes.write("k", lambda: gate.addCallback(lambda _: self.m.put("k", {"v": "ours"})))
        gate.callback(None)
        self.m.put("k", {"v": "theirs"})
        self.clock.advance(0)
        self.assertEqual([(e[0], e[2]) for e in self.applied], [("put", {"v": "theirs"})])

    def test_writesToOneKeyRunInOrder(self):
        """A second write starts only once the first is answered."""
        order = []
        first = defer.Deferred()
        self.writes.write("k", lambda: first.addCallback(lambda _: order.append(1) or 1))
        self.writes.write("k", lambda: order.append(2) or 2)
        self.assertEqual(order, [])
        first.callback(None)
        self.assertEqual(order, [1, 2])

    def test_pendingCoversWritesInFlight(self):
        """pending() fires once every write made so far is answered, and lastRevision then covers them."""
        gate = defer.Deferred()
        self.writes.write("a", lambda: self.m.put("a", {}))
        self.clock.advance(0)
        self.writes.write("entities/vhost/v", lambda: gate.addCallback(lambda _: self.m.put("entities/vhost/v", {})))
        done = self.writes.pending()
        self.assertNoResult(done)
        before = self.writes.lastRevision
        gate.callback(None)
        self.successResultOf(done)
        self.assertGreater(self.writes.lastRevision, before)
        self.successResultOf(self.writes.pending())


class WireTests(SynchronousTestCase):

    def test_framesSplitAcrossReads(self):
        """Frames cut anywhere come out whole, in order."""
        from otter_tx.broker.message import Message

        data = wire.forward("/", "q", True, Message("ex", "rk", b"\x00\x00", b"body")) + wire.synced(7, [3, 9])
        for cut in range(len(data)):
            frames, used = wire.splitFrames(data[:cut])
            rest, used2 = wire.splitFrames(data[used:])
            self.assertEqual([k for k, _ in frames + rest], [wire.FORWARD, wire.SYNCED])
        (kind, payload), = wire.splitFrames(wire.synced(7, [3, 9]))[0]
        r = wire.Reader(payload)
        self.assertEqual((r.u64(), r.u32(), r.u64(), r.u64()), (7, 2, 3, 9))

    def test_consumeArguments(self):
        """CONSUME carries the consumer's arguments (a stream's x-stream-offset); one without them reads as none."""
        from otter_tx.amqp.codec import TaggedInt, encodeTable
        from otter_tx.cluster.link import _consumeArguments

        for frame, expected in (
                (wire.consume(3, "/", "s", False, False, 0, 10, encodeTable({"x-stream-offset": TaggedInt(7, "l")})),
                 {"x-stream-offset": 7}),
                (wire.consume(3, "/", "s", False, False, 0, 10), None)):
            (kind, payload), = wire.splitFrames(frame)[0]
            r = wire.Reader(payload)
            fields = (r.u32(), r.string(), r.string(), r.u8(), r.i32(), r.u32())
            self.assertEqual((kind, fields), (wire.CONSUME, (3, "/", "s", 0, 0, 10)))
            self.assertEqual(_consumeArguments(r.blob()) if r.more() else None, expected)

    def test_streamAppend(self):
        """STREAM_APPEND: the stream's names, the count, the chunk's entries as published."""
        (kind, payload), = wire.splitFrames(wire.streamAppend(wire.string("/") + wire.string("s"), 2, b"entries"))[0]
        r = wire.Reader(payload)
        self.assertEqual((kind, r.string(), r.string(), r.u32(), r.blob()), (wire.STREAM_APPEND, "/", "s", 2, b"entries"))


class _ForwardsNode:
    """What a LinkProtocol needs of its node to take forwards: a clock, no batchers, a record of forwards."""

    name = "n2"

    def __init__(self):
        self.clock = task.Clock()
        self.batchers = []
        self.taken = []

    def forwarded(self, link, vhost, queue, redelivered, message, writer=None):
        self.taken.append(message.body)

    def linkUp(self, link):
        pass


class LinkSliceTests(SynchronousTestCase):
    """A link handles at most FRAMES_PER_SLICE frames per reactor turn and stops reading meanwhile."""

    def test_sliced(self):
        from twisted.internet.testing import StringTransport

        from otter_tx.broker.message import Message
        from otter_tx.cluster import link as L

        node = _ForwardsNode()
        proto = L.LinkProtocol(node)
        proto.makeConnection(StringTransport())
        names = wire.string("/") + wire.string("q")
        n = 2 * L.FRAMES_PER_SLICE + 100
        data = b"".join(wire.forwardNamed(names, False, Message("", "q", b"\x00\x00", b"%d" % i)) for i in range(n))
        proto.dataReceived(data[:-3])  # the last frame incomplete
        self.assertEqual(len(node.taken), L.FRAMES_PER_SLICE)
        self.assertEqual(proto.transport.producerState, "paused")
        [later] = node.clock.getDelayedCalls()
        self.assertEqual(later.getTime(), 0)
        node.clock.advance(0)  # task.Clock runs the next slices' calls in one advance
        self.assertEqual(len(node.taken), n - 1)
        self.assertEqual(proto.transport.producerState, "producing")
        proto.dataReceived(data[-3:])
        self.assertEqual(node.taken, [b"%d" % i for i in range(n)])
        self.assertEqual(node.clock.getDelayedCalls(), [])

    def test_bigFrameGathered(self):
        """
        A large frame that arrives in pieces is gathered from the reads and
        joined once (not appended to the receive buffer and copied out of
        it); the frames around it come in order, whatever the read sizes.
        """
        from twisted.internet.testing import StringTransport

        from otter_tx.broker.message import Message
        from otter_tx.cluster import link as L

        names = wire.string("/") + wire.string("q")
        bodies = [b"a", b"B" * (L.BIG_FRAME + 7), b"c", b"D" * (3 * L.BIG_FRAME), b"e", b"f"]
        data = b"".join(wire.forwardNamed(names, False, Message("", "q", b"\x00\x00", b)) for b in bodies)
        for step in (1000, 65536, L.BIG_FRAME - 3, L.BIG_FRAME + 11, len(data) - 2):
            node = _ForwardsNode()
            proto = L.LinkProtocol(node)
            proto.makeConnection(StringTransport())
            gathered = False
            for i in range(0, len(data), step):
                proto.dataReceived(data[i:i + step])
                gathered = gathered or proto._big is not None
            node.clock.advance(0)
            self.assertEqual(node.taken, bodies, step)
            # (the last step reads both large frames whole: nothing to gather)
            self.assertEqual(gathered, step < len(data) - 2, step)
            self.assertEqual((proto._big, bytes(proto._buf), proto._ready), (None, b"", []), step)
