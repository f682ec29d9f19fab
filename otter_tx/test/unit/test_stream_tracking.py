"""
The stream protocol's tracking file (otter_tx.door.streambackend.Tracking):
publisher sequences are written in the reactor turn that makes them durable
(before their confirms reach the socket), and only the durable ones.
"""

import json
import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.broker.broker import Broker
from otter_tx.door import stream as door
from otter_tx.door.streambackend import BrokerStreams, Tracking
from otter_tx.stream import wire
from otter_tx.test.unit.test_stream_door import Client, confirms


def _file(tracking, vhost, name):
    with open(tracking._path(vhost, name)) as f:
        return json.load(f)


class TrackingTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.dir = self.mktemp()
        self.tracking = Tracking(self.clock, self.dir, delay=0.2)

    def test_durableSequenceThisTurn(self):
        """A durable sequence is written at once (callLater(0)), ahead of a pending delayed write."""
        t = self.tracking.get("/", "s")
        t["offsets"]["c"] = 5
        self.tracking.changed("/", "s")
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [0.2])
        self.tracking.durableSequence("/", "s", "ref", 10)
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [0])
        self.tracking.durableSequence("/", "s", "ref", 12)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(0)
        self.assertEqual(_file(self.tracking, "/", "s")["sequences"], {"ref": 12})
        self.assertEqual(_file(self.tracking, "/", "s")["offsets"], {"c": 5})
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_onlyDurableSequencesInTheFile(self):
        """A sequence moved ahead for appends not durable yet stays out of the file (a crash would lose those)."""
        t = self.tracking.get("/", "s")
        self.tracking.durableSequence("/", "s", "ref", 10)
        t["sequences"]["ref"] = 50
        # (another publisher's, as a leader shipped it to this node)
        t["sequences"]["other"] = 7
        self.clock.advance(0)
        self.assertEqual(_file(self.tracking, "/", "s")["sequences"], {"ref": 10, "other": 7})
        self.assertEqual(self.tracking.get("/", "s")["sequences"]["ref"], 50)
        # read back by a fresh Tracking (a restart)
        again = Tracking(Clock(), self.dir)
        self.assertEqual(again.get("/", "s")["sequences"], {"ref": 10, "other": 7})


    def test_durableSequenceZero(self):
        """Publishing id 0 made durable is a sequence like any other: in the file, read back after a restart."""
        self.tracking.durableSequence("/", "s", "ref", 0)
        self.clock.advance(0)
        self.assertEqual(_file(self.tracking, "/", "s")["sequences"], {"ref": 0})
        again = Tracking(Clock(), self.dir)
        self.assertEqual(again.get("/", "s")["sequences"], {"ref": 0})

class DoorWritesSequencesBeforeConfirmingTests(SynchronousTestCase):
    """Through the door: when a publish confirm is sent, the file already holds its sequence."""

    def test_fileBeforeConfirm(self):
        clock = Clock()
        broker = Broker(clock, memoryHighWatermark=None)
        directory = os.path.abspath(self.mktemp())
        backend = BrokerStreams(broker, clock, directory)
        self.addCleanup(broker.streams.close)
        factory = door.StreamServerFactory(broker, backend, clock, heartbeat=0)
        c = Client(factory, clock)
        self.assertEqual(c.handshake(), wire.OK)
        c.create("s")
        self.assertEqual(c.declarePublisher(1, "ref", "s"), wire.OK)
        c.feed(wire.publishFrame(1, [(i, b"x%d" % i) for i in range(1, 11)]))
        # the reactor sends what a turn wrote to a transport after the turn's calls due now (its
        # timed calls, then the poll): after each turn here, a confirm written means the file holds it
        got = []
        for _ in range(5):
            clock.advance(0)
            frames = confirms(c.read())
            if frames:
                self.assertEqual(_file(backend.tracking, "/", "s")["sequences"], {"ref": 10})
            got.extend(frames)
        self.assertEqual(got, [(1, list(range(1, 11)))])
