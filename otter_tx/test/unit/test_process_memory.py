"""
Tests for :mod:`otter_tx.resources.process_memory`: when the MemoryReleaser gives memory back
(large drops of queued messages or connections, never steady traffic), and
releaseMemory / rssBytes on the running interpreter.
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.resources import process_memory as memory
from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message
from otter_tx.resources.process_memory import CONNECTION_BYTES, MESSAGE_BYTES, MemoryReleaser
from otter_tx.testing import FakeConnection


class MemoryReleaserTests(SynchronousTestCase):
    """MemoryReleaser: what counts, what triggers a release, and with or without a collection."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.released = []
        self.releaser = MemoryReleaser(self.broker, self.clock, interval=5.0, threshold=100000,
                                       release=lambda collect: self.released.append(collect))
        self.releaser.start()
        self.addCleanup(self.releaser.stop)

    def publish(self, queue, count, size=100):
        ex = self.vh.exchanges[""]
        props = encodeProperties({})
        for _ in range(count):
            self.vh.publish(ex, Message("", queue, props, b"x" * size))

    def test_amounts(self):
        """Messages count body bytes plus MESSAGE_BYTES each; connections CONNECTION_BYTES each."""
        self.vh.declareQueue("q", None)
        self.publish("q", 10, size=100)
        self.broker.connections.update(FakeConnection() for _ in range(3))
        self.assertEqual(self.releaser.amounts(), (10 * (100 + MESSAGE_BYTES), 3 * CONNECTION_BYTES))

    def test_purgeReleases(self):
        """A purge dropping more than the threshold releases once, at the next look, without a CPython collection."""
        q = self.vh.declareQueue("q", None)
        self.publish("q", 300)
        self.clock.advance(5)
        self.assertEqual(self.released, [])
        q.purge()
        self.clock.advance(5)
        self.assertEqual(self.released, [False])
        self.clock.advance(50)
        self.assertEqual(self.released, [False])
        self.assertEqual(self.releaser.releases, 1)

    def test_logsOneLine(self):
        """A release logs one info line with the estimated drop and the RSS before and after."""
        from twisted.logger import formatEvent, globalLogPublisher

        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        self.releaser.release = lambda collect: True
        q = self.vh.declareQueue("q", None)
        self.publish("q", 300)
        self.clock.advance(5)
        q.purge()
        self.clock.advance(5)
        lines = [formatEvent(e) for e in events if e.get("log_namespace") == "otter_tx.resources.process_memory"]
        self.assertEqual(len(lines), 1)
        self.assertRegex(lines[0], r"^memory released \(messages fell by about 0 MiB, connections by about "
                                   r"0 MiB\): RSS \d+ -> \d+ MiB$")

    def test_deleteReleases(self):
        """Deleting a large queue releases too."""
        q = self.vh.declareQueue("q", None)
        self.publish("q", 300)
        self.clock.advance(5)
        self.vh.deleteQueue(q)
        self.clock.advance(5)
        self.assertEqual(self.released, [False])

    def test_peakBetweenLooks(self):
        """A fill and purge both between two looks is not seen (nothing was measured at its peak)."""
        q = self.vh.declareQueue("q", None)
        self.publish("q", 300)
        q.purge()
        self.clock.advance(5)
        self.assertEqual(self.released, [])

    def test_smallDropsDoNot(self):
        """Steady traffic (drops below the threshold) never releases."""
        q = self.vh.declareQueue("q", None)
        for _ in range(10):
            self.publish("q", 100)
            self.clock.advance(5)
            q.purge()
            self.clock.advance(5)
        self.assertEqual(self.released, [])

    def test_closedConnectionsCollect(self):
        """Many closed connections release with a collection (their objects form cycles on CPython)."""
        conns = [FakeConnection() for _ in range(100000 // CONNECTION_BYTES + 1)]
        self.broker.connections.update(conns)
        self.clock.advance(5)
        self.broker.connections.clear()
        self.clock.advance(5)
        self.assertEqual(self.released, [True])

    def test_failureLogged(self):
        """A release that raises is logged; the looks go on."""
        q = self.vh.declareQueue("q", None)

        def fails(collect):
            raise RuntimeError("boom")

        self.releaser.release = fails
        self.publish("q", 300)
        self.clock.advance(5)
        q.purge()
        self.clock.advance(5)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertTrue(self.releaser._timer.running)

    def test_stop(self):
        """After stop no more looks happen; start again works."""
        self.releaser.stop()
        self.releaser.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.releaser.start()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)


class ReleaseMemoryTests(SynchronousTestCase):
    """releaseMemory and rssBytes on this interpreter."""

    def test_collectsOnPyPyOrWhenAsked(self):
        """gc.collect runs on PyPy always, on CPython only with collect=True."""
        calls = []
        self.patch(memory.gc, "collect", lambda *a: calls.append(a) or 0)
        memory.releaseMemory()
        self.assertEqual(len(calls), 1 if memory.PYPY else 0)
        memory.releaseMemory(collect=True)
        self.assertEqual(len(calls), 2 if memory.PYPY else 1)

    def test_trim(self):
        """With glibc's malloc_trim it is called with 0 and its answer returned as a bool."""
        trims = []
        self.patch(memory, "_trim", lambda pad: trims.append(pad) or 1)
        self.assertIs(memory.releaseMemory(), True)
        self.assertEqual(trims, [0])
        self.patch(memory, "_trim", None)
        self.assertIs(memory.releaseMemory(), False)

    def test_realTrim(self):
        """On this machine (glibc) the real malloc_trim is found and the call succeeds."""
        self.assertIsNotNone(memory._mallocTrim())
        self.assertIn(memory.releaseMemory(), (True, False))

    def test_rss(self):
        """rssBytes is a plausible resident size in bytes (1 MiB to 64 GiB)."""
        rss = memory.rssBytes()
        self.assertGreater(rss, 1 << 20)
        self.assertLess(rss, 64 << 30)
