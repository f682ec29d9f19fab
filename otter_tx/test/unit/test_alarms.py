"""
Deterministic tests for otter_tx.resources.alarms: the alarm set, the disk and memory
monitors on a task.Clock with fake probes, what publishers see
(connection.blocked through FakeClient) and what the health checks and the
nodes API answer (StubTreq).  Texts and JSON bodies were checked against
RabbitMQ 3.10 (the peer, with ``rabbitmqctl set_disk_free_limit 1000GB`` and
``set_vm_memory_high_watermark absolute 10MB``).
"""

from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from otter_tx.resources.alarms import (
    CLEAR_FRACTION, OVERSHOOT_FRACTION, Alarms, DiskMonitor, MemoryMonitor, diskFreeBytes, diskFreeLimitBytes,
)
from otter_tx.amqp import spec
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.store.interface import IStoreHealth
from otter_tx.test.unit.test_web import WebTestCase
from otter_tx.testing import FakeClient, FakeConnection
from otter_tx.web.metrics import renderMetrics


class _Broker:
    """Just what Alarms needs: a set of connections."""

    def __init__(self):
        self.connections = set()


class _Conn(FakeConnection):
    """A connection that records its ``alarmChanged`` calls (``calls``)."""

    @property
    def calls(self):
        return self.alarms


@implementer(IStoreHealth)
class FakeStore:
    """A store with the health contract: ``healthy`` and ``addHealthObserver(callback(healthy, reason))``."""

    def __init__(self, healthy=True):
        self.healthy = healthy
        self.observers = []

    def addHealthObserver(self, callback):
        self.observers.append(callback)

    def setHealthy(self, healthy, reason=None):
        self.healthy = healthy
        for cb in self.observers:
            cb(healthy, reason)


def _logged(testCase):
    """Collect formatted log lines for the rest of the test."""
    from twisted.logger import formatEvent

    lines = []

    def observer(event):
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observer)
    testCase.addCleanup(globalLogPublisher.removeObserver, observer)
    return lines


class AlarmSetTests(SynchronousTestCase):
    """One set of alarms; connections are told only when it becomes empty or non-empty."""

    def setUp(self):
        self.broker = _Broker()
        self.conn = _Conn()
        self.broker.connections.add(self.conn)
        self.alarms = Alarms(self.broker)

    def test_reasonTexts(self):
        """The blocked reason is RabbitMQ's: low on memory, low on disk, low on disk & memory."""
        self.assertEqual(self.alarms.reason(), "")
        self.alarms.set("memory")
        self.assertEqual(self.alarms.reason(), "low on memory")
        self.alarms.set("disk")
        self.assertEqual(self.alarms.reason(), "low on disk & memory")
        self.alarms.clear("memory")
        self.assertEqual(self.alarms.reason(), "low on disk")
        self.alarms.set("store", "disk I/O error")
        self.assertEqual(self.alarms.reason(), "low on disk; message store unavailable")

    def test_notifiedOnEdgesOnly(self):
        """Connections hear True when the first alarm is set and False when the last clears, nothing between."""
        self.alarms.set("disk")
        self.alarms.set("memory")
        self.alarms.set("disk")
        self.alarms.clear("disk")
        self.assertEqual(self.conn.calls, [True])
        self.alarms.clear("memory")
        self.alarms.clear("memory")
        self.assertEqual(self.conn.calls, [True, False])

    def test_logLines(self):
        """Set and clear each log RabbitMQ's line once."""
        lines = _logged(self)
        self.alarms.set("disk")
        self.alarms.set("disk")
        self.alarms.clear("disk")
        self.assertEqual(
            [line for line in lines if "alarm" in line],
            ["disk resource limit alarm set on node otter_tx@localhost.\n"
             "*** Publishers will be blocked until this alarm clears ***",
             "disk resource limit alarm cleared on node otter_tx@localhost"])

    def test_describe(self):
        """Health checks list alarms as RabbitMQ's {"node","resource"} with "disk space" and "memory"."""
        self.alarms.set("memory")
        self.alarms.set("disk")
        self.assertEqual(self.alarms.describe(), [
            {"node": "otter_tx@localhost", "resource": "disk space"},
            {"node": "otter_tx@localhost", "resource": "memory"},
        ])

    def test_storeHealth(self):
        """An unhealthy store raises the store alarm with its reason; healthy again clears it."""
        store = FakeStore()
        self.alarms.watchStore(store)
        self.assertEqual(self.alarms.active, {})
        store.setHealthy(False, "database or disk is full")
        self.assertEqual(self.alarms.active, {"store": "database or disk is full"})
        self.assertEqual(self.alarms.describe(), [{"node": "otter_tx@localhost", "resource": "message store",
                                                   "reason": "database or disk is full"}])
        store.setHealthy(True)
        self.assertEqual(self.alarms.active, {})
        self.assertEqual(self.conn.calls, [True, False])

    def test_storeUnhealthyAtWatch(self):
        """A store already unhealthy when watched raises the alarm at once."""
        self.alarms.watchStore(FakeStore(healthy=False))
        self.assertIn("store", self.alarms.active)

    def test_storeWithoutContract(self):
        """A store without addHealthObserver is taken as healthy."""
        self.alarms.watchStore(object())
        self.assertEqual(self.alarms.active, {})

    def test_unblockingMayRaiseAgain(self):
        """Unblocking one connection may raise an alarm again: it is blocked again, the others never told False."""
        alarms = self.alarms

        class Reraising(_Conn):
            def alarmChanged(self, alarmed):
                _Conn.alarmChanged(self, alarmed)
                if not alarmed:
                    alarms.set("memory")

        first, second = Reraising(), _Conn()
        self.broker.connections = [first, second]
        alarms.set("memory")
        alarms.clear("memory")
        self.assertEqual(first.calls, [True, False, True])
        self.assertNotIn(False, second.calls)  # (a repeated True is a no-op for a real connection)
        self.assertIn("memory", alarms.active)


class DiskMonitorTests(SynchronousTestCase):
    """The disk alarm on a fake free-space probe and a task.Clock."""

    def setUp(self):
        self.clock = Clock()
        self.broker = _Broker()
        self.alarms = Alarms(self.broker)
        self.free = 10 ** 9
        self.paths = []

        def probe(path):
            self.paths.append(path)
            return self.free

        self.monitor = DiskMonitor(self.alarms, self.clock, "/data", limit=50 * 10 ** 6, probe=probe)
        self.addCleanup(self.monitor.stop)

    def test_setAndClear(self):
        """Free space below the limit raises "disk" at the next check; space returning clears it."""
        lines = _logged(self)
        self.monitor.start()
        self.assertEqual(self.paths, ["/data"])
        self.assertEqual(self.alarms.active, {})
        self.free = 49 * 10 ** 6
        self.clock.advance(2.5)
        self.assertIn("disk", self.alarms.active)
        self.assertIn("Free disk space is insufficient. Free bytes: 49000000. Limit: 50000000", lines)
        self.free = 60 * 10 ** 6
        self.clock.advance(0.25)  # within twice the limit: checked every 0.25 s
        self.assertEqual(self.alarms.active, {})
        self.assertIn("Free disk space is sufficient. Free bytes: 60000000. Limit: 50000000", lines)

    def test_interval(self):
        """The interval is 2 x headroom / 250 MB/s, from 0.1 to 2.5 s (rabbit_disk_monitor's); 0.25 s alarmed."""
        self.monitor.start()
        self.clock.advance(2.4)
        self.assertEqual(len(self.paths), 1)
        self.clock.advance(0.1)
        self.assertEqual(len(self.paths), 2)
        for free, interval in ((10 ** 9, 2.5), (150 * 10 ** 6, 0.8), (60 * 10 ** 6, 0.1), (50 * 10 ** 6, 0.1)):
            self.free = free
            self.monitor.check()
            self.assertAlmostEqual(self.monitor.nextInterval(), interval)
        self.free = 49 * 10 ** 6
        self.monitor.check()
        self.assertEqual(self.monitor.nextInterval(), 0.25)
        self.free = None
        self.monitor.check()
        self.assertEqual(self.monitor.nextInterval(), 2.5)

    def test_fillingDiskCaughtInTime(self):
        """A disk filling at 10 MB/s is alarmed within 0.1 s of passing the limit (at 2.5 s it was up to 25 MB late)."""
        self.free = 300 * 10 ** 6
        start = self.clock.seconds()
        alarmedAt = []

        def probe(path):
            self.paths.append(path)
            free = self.free - int((self.clock.seconds() - start) * 10 ** 7)
            if free < self.monitor.limit and not alarmedAt:
                alarmedAt.append(free)
            return free

        self.monitor.probe = probe
        self.monitor.start()
        for _ in range(3000):
            self.clock.advance(0.01)
            if "disk" in self.alarms.active:
                break
        self.assertIn("disk", self.alarms.active)
        crossedAt = start + 25.0  # 250 MB of headroom at 10 MB/s
        self.assertLessEqual(self.clock.seconds() - crossedAt, 0.1 + 1e-6)
        self.assertGreaterEqual(alarmedAt[0], self.monitor.limit - 10 ** 6)
        self.assertLess(len(self.paths), 60)

    def test_pendingCountsAsUsed(self):
        """Bytes the store is about to write count as used: they raise the alarm and shorten the interval."""
        pending = [0]
        self.monitor.pending = lambda: pending[0]
        self.free = 80 * 10 ** 6
        self.monitor.start()
        self.assertEqual(self.alarms.active, {})
        pending[0] = 40 * 10 ** 6
        self.clock.advance(self.monitor.nextInterval())
        self.assertEqual(self.alarms.active["disk"],
                         "free 40000000 bytes, limit 50000000 (40000000 bytes about to be written counted as used)")
        self.assertEqual(self.monitor.free, 80 * 10 ** 6)
        pending[0] = 0
        self.clock.advance(0.25)
        self.assertEqual(self.alarms.active, {})

    def test_sqlitePendingWriteBytes(self):
        """SQLiteStore.pendingWriteBytes counts bodies and properties not committed: pending, in flight, to retry."""
        from otter_tx.store.sqlite import SQLiteStore
        from otter_tx.store.sqlite.batch import Batch

        store = SQLiteStore(self.mktemp(), self.clock)
        self.assertEqual(store.pendingWriteBytes(), 0)
        store._pending.addMessage(1, "", "q", b"\x00\x00", b"x" * 100)
        store._pending.addMessage(2, "", "q", b"\x00\x00", b"y" * 50)
        self.assertEqual(store.pendingWriteBytes(), 154)
        writing, retry = Batch(), Batch()
        writing.addMessage(3, "", "q", b"", b"z" * 1000)
        retry.addMessage(4, "", "q", b"", b"w" * 7)
        store._writing, store._retry = writing, [retry]
        self.assertEqual(store.pendingWriteBytes(), 154 + 1000 + 7)
        # a failed batch is in _retry and still _writing: counted once
        store._retry = [retry, writing]
        self.assertEqual(store.pendingWriteBytes(), 154 + 1000 + 7)
        # a pending message whose only enqueue is cancelled is no longer counted
        store._pending.enqueue("q", 2, 1, 1.0, None, False)
        store._pending.dequeue("q", 2)
        self.assertEqual(store.pendingWriteBytes(), 102 + 1000 + 7)
        store._pending.addMessage(2, "", "q", b"\x00\x00", b"y" * 50)
        store._writing, store._retry = None, []
        self.assertEqual(store.pendingWriteBytes(), 154)

    def test_unknownFreeSpace(self):
        """A probe that cannot tell (None) changes nothing."""
        self.free = None
        self.monitor.start()
        self.assertEqual(self.alarms.active, {})
        self.assertIsNone(self.monitor.free)

    def test_stop(self):
        """After stop no more checks happen."""
        self.monitor.start()
        self.monitor.stop()
        self.clock.advance(10)
        self.assertEqual(len(self.paths), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_setLimit(self):
        """Raising the limit above the free space raises the alarm at once."""
        self.monitor.start()
        self.monitor.setLimit(2 * 10 ** 9)
        self.assertIn("disk", self.alarms.active)

    def test_probeFailureLogged(self):
        """A probe that raises is logged and the checks go on."""
        self.monitor.probe = lambda path: 1 // 0
        self.monitor.start()
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_realProbe(self):
        """diskFreeBytes reads a real filesystem's available bytes; None for a missing path."""
        self.assertGreater(diskFreeBytes(self.mktemp().rsplit("/", 1)[0] or "."), 0)
        self.assertIsNone(diskFreeBytes("/nonexistent/surely/not"))

    def test_relativeLimit(self):
        """A relative limit is a multiple of RAM (disk_free_limit.relative)."""
        self.assertEqual(diskFreeLimitBytes(("relative", 1.5), totalMemory=1000), 1500)
        self.assertEqual(diskFreeLimitBytes(("absolute", 7)), 7)
        self.assertEqual(diskFreeLimitBytes(7), 7)


class MemoryMonitorTests(SynchronousTestCase):
    """The memory alarm on a fake RSS probe: hysteresis, hot-path checks, releases."""

    def setUp(self):
        self.clock = Clock()
        self.alarms = Alarms(_Broker())
        self.rss = 100
        self.estimate = 0
        self.releases = []
        self.monitor = MemoryMonitor(self.alarms, self.clock, 1000, probe=lambda: self.rss,
                                     estimate=lambda: self.estimate, release=self._release)
        self.addCleanup(self.monitor.stop)

    def _release(self):
        self.releases.append(self.clock.seconds())
        self.rss = self.rssAfterRelease

    rssAfterRelease = 0

    def test_hysteresis(self):
        """Set above the watermark; stays set down to 0.9 of it; clears below."""
        lines = _logged(self)
        self.monitor.start()
        self.rss = 1001
        self.clock.advance(0.25)
        self.assertIn("memory", self.alarms.active)
        self.assertIn("vm_memory_high_watermark set. Memory used:1001 allowed:1000", lines)
        self.rss = 950
        self.clock.advance(0.25)
        self.assertIn("memory", self.alarms.active)
        self.rss = int(1000 * CLEAR_FRACTION) - 1
        self.clock.advance(0.25)
        self.assertEqual(self.alarms.active, {})
        self.assertIn("vm_memory_high_watermark clear. Memory used:899 allowed:1000", lines)

    def test_receivedBytesCheck(self):
        """Every `step` bytes received, RSS is read at once, without waiting for the timer."""
        monitor = MemoryMonitor(self.alarms, self.clock, 300 * 10 ** 6, probe=lambda: self.rss)
        self.assertEqual(monitor.step, 300 * 10 ** 6 // 128)
        monitor.received(monitor.step - 1)
        self.assertEqual(monitor.checks, 0)
        self.rss = 301 * 10 ** 6
        monitor.received(1)
        self.assertEqual(monitor.checks, 1)
        self.assertIn("memory", self.alarms.active)
        self.assertEqual(monitor.pending, 0)

    def test_stepBounds(self):
        """The hot-path step is 1/128 of the watermark, at least 64 KiB and at most 8 MiB."""
        self.monitor.setWatermark(1000)
        self.assertEqual(self.monitor.step, 65536)
        self.monitor.setWatermark(10 ** 12)
        self.assertEqual(self.monitor.step, 8 * 1024 * 1024)

    def test_releaseWhileAlarmed(self):
        """Stuck above the clear level after the queues drained, memory is released and the alarm clears."""
        self.estimate = 900
        self.rss = 1100
        self.monitor.check()
        self.assertIn("memory", self.alarms.active)
        self.rss = 1000  # the allocator keeps what the drained messages freed
        self.monitor.check()
        self.assertEqual(self.releases, [])  # nothing drained: no release
        self.estimate = 100
        self.rssAfterRelease = 500
        self.monitor.check()
        self.assertEqual(self.releases, [])  # the estimate is looked at once a second at most
        self.clock.advance(self.monitor.lookInterval)
        self.monitor.check()
        self.assertEqual(self.releases, [self.monitor.lookInterval])
        self.assertEqual(self.alarms.active, {})

    def test_releaseRateLimited(self):
        """Releases happen at most every releaseInterval seconds."""
        self.estimate = 1000
        self.rss = 1100
        self.monitor.check()
        self.rssAfterRelease = 1000
        self.estimate = 500
        self.monitor.check()
        self.estimate = 0
        for _ in range(4):
            self.clock.advance(self.monitor.lookInterval)
            self.monitor.check()
        self.assertEqual(self.releases, [0])
        self.clock.advance(self.monitor.lookInterval)
        self.monitor.check()
        self.assertEqual(self.releases, [0, self.monitor.releaseInterval])

    def test_overshootReleases(self):
        """Above 1.05x the watermark while alarmed, memory is released every second even if nothing drained."""
        self.estimate = 1000
        self.rss = 1001
        self.monitor.check()
        self.rss = int(1000 * OVERSHOOT_FRACTION) + 1  # garbage piling up (PyPy)
        self.rssAfterRelease = self.rss
        self.monitor.check()
        self.clock.advance(0.25)
        self.monitor.check()
        self.assertEqual(self.releases, [0])
        self.clock.advance(self.monitor.lookInterval - 0.25)
        self.monitor.check()
        self.assertEqual(self.releases, [0, self.monitor.lookInterval])
        self.rss = self.rssAfterRelease = 1000  # at or below 1.05x: back to the estimate rule
        self.clock.advance(self.monitor.lookInterval)
        self.monitor.check()
        self.assertEqual(len(self.releases), 2)

    def test_estimateWithoutRSS(self):
        """Where RSS cannot be read the queued-message estimate is used."""
        self.monitor.probe = lambda: None
        self.estimate = 2000
        self.monitor.check()
        self.assertIn("memory", self.alarms.active)


class BlockingTests(SynchronousTestCase):
    """What AMQP clients see (FakeClient over the real protocol)."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0, handshakeTimeout=10)
        self.free = 10 ** 9
        self.disk = DiskMonitor(self.broker.alarms, self.clock, "/data", probe=lambda path: self.free)
        self.addCleanup(self.disk.stop)

    def ready(self, **kw):
        c = FakeClient(self.factory, **kw)
        c.openChannel(1)
        c.send(1, spec.QueueDeclare(0, "q"))
        c.received()
        return c

    def test_diskAlarmBlocksPublishers(self):
        """Low disk: a publisher is told "low on disk" and not read; an idle one is not told; both resume."""
        c = self.ready()
        idle = self.ready()
        self.disk.start()
        self.free = 10
        self.clock.advance(2.5)
        self.assertEqual(c.received(), [])
        self.assertEqual(self.connectionStates(), ["blocking", "blocking"])
        c.publish(1, "", "q", b"x")
        [(_, m, _)] = c.received()
        self.assertEqual((type(m), m.reason), (spec.ConnectionBlocked, "low on disk"))
        self.assertEqual(c.transport.producerState, "paused")
        self.assertEqual(sorted(self.connectionStates()), ["blocked", "blocking"])
        self.free = 10 ** 9
        self.clock.advance(0.25)
        self.assertIsInstance(c.methods()[0], spec.ConnectionUnblocked)
        self.assertEqual(c.transport.producerState, "producing")
        self.assertEqual(idle.received(), [])  # never published: never told
        self.assertEqual(self.connectionStates(), ["running", "running"])

    def connectionStates(self):
        return [conn.flowState for conn in self.broker.connections]

    def test_twoAlarmsOneBlock(self):
        """Disk then memory: one connection.blocked naming both; unblocked only when both cleared."""
        self.broker.memoryHighWatermark = 1000
        used = [0]
        self.broker.memoryMonitor.probe = lambda: used[0]
        c = self.ready()
        self.free = 10
        self.disk.check()
        used[0] = 2000
        self.broker.memoryMonitor.check()
        c.publish(1, "", "q", b"x")
        self.free = 10 ** 9
        self.disk.check()
        [(_, m, _)] = c.received()
        self.assertEqual(m.reason, "low on disk & memory")
        used[0] = 0
        self.broker.memoryMonitor.check()
        self.assertIsInstance(c.methods()[0], spec.ConnectionUnblocked)

    def test_bothReasons(self):
        """A connection opened while both alarms are in effect is told "low on disk & memory" when it publishes."""
        self.broker.alarms.set("memory")
        self.broker.alarms.set("disk")
        c = self.ready()
        c.publish(1, "", "q", b"x")
        self.assertEqual([m.reason for _, m, _ in c.received()], ["low on disk & memory"])
        self.assertEqual(c.transport.producerState, "paused")

    def test_storeUnhealthyBlocks(self):
        """While the store is unhealthy publishers are blocked; healthy again, they are unblocked."""
        store = FakeStore()
        self.broker.alarms.watchStore(store)
        c = self.ready()
        store.setHealthy(False, "disk I/O error")
        c.publish(1, "", "q", b"x")
        [(_, m, _)] = c.received()
        self.assertEqual((type(m), m.reason), (spec.ConnectionBlocked, "message store unavailable"))
        store.setHealthy(True)
        self.assertIsInstance(c.methods()[0], spec.ConnectionUnblocked)

    def test_publishCountsTowardsMemory(self):
        """Bytes a publisher sends trigger an RSS reading every step, before the timer would."""
        self.broker.memoryHighWatermark = 10 ** 7
        monitor = self.broker.memoryMonitor
        used = [0]
        monitor.probe = lambda: used[0]
        c = self.ready()
        used[0] = 2 * 10 ** 7
        before = monitor.checks
        body = b"x" * 10000
        for _ in range(monitor.step // len(body) + 2):
            c.publish(1, "", "q", body)
        self.assertGreater(monitor.checks, before)
        self.assertTrue(self.broker.alarmed)
        self.assertEqual(c.transport.producerState, "paused")

    def test_withoutCapability(self):
        """A client without the connection.blocked capability is not sent the method but is still paused."""
        c = self.ready(capabilities={})
        self.broker.alarms.set("disk")
        self.assertEqual(c.received(), [])
        c.publish(1, "", "q", b"x")
        self.assertEqual(c.transport.producerState, "paused")


class LinkFlowTests(SynchronousTestCase):
    """A cluster link backed up: RabbitMQ's credit flow at the AMQP door (``flowChanged``)."""

    setUp = BlockingTests.setUp
    ready = BlockingTests.ready

    def setFlow(self, on):
        self.broker.linkFlow = on
        for conn in list(self.broker.connections):
            conn.flowChanged(on)

    def test_flowPausesPublishersSilently(self):
        """A publisher is no longer read and says ``flow``, told nothing; an idle one stays running; both resume."""
        c = self.ready()
        idle = self.ready()
        self.setFlow(True)
        c.publish(1, "", "q", b"a")
        self.assertEqual(c.received(), [])
        self.assertEqual(c.transport.producerState, "paused")
        self.assertEqual(sorted(conn.flowState for conn in self.broker.connections), ["flow", "flow"])
        self.assertEqual(self.broker.vhosts["/"].queues["q"].readyCount, 1)
        self.setFlow(False)
        self.assertEqual(c.transport.producerState, "producing")
        c.publish(1, "", "q", b"b")
        self.assertEqual(c.transport.producerState, "producing")
        self.assertEqual(self.broker.vhosts["/"].queues["q"].readyCount, 2)
        self.assertEqual(c.received(), [])
        self.assertEqual(idle.received(), [])
        self.assertEqual(sorted(conn.flowState for conn in self.broker.connections), ["running", "running"])

    def test_alarmOutlastsFlow(self):
        """Flow ends while a disk alarm holds: the publisher stays blocked until the alarm clears too."""
        c = self.ready()
        self.setFlow(True)
        self.broker.alarms.set("disk")
        c.publish(1, "", "q", b"a")
        [(_, m, _)] = c.received()
        self.assertIsInstance(m, spec.ConnectionBlocked)
        self.setFlow(False)
        self.assertEqual(c.transport.producerState, "paused")
        self.broker.alarms.clear("disk")
        self.assertIsInstance(c.methods()[0], spec.ConnectionUnblocked)
        self.assertEqual(c.transport.producerState, "producing")

    def test_openedDuringFlow(self):
        """A connection opened while a link is backed up is in flow from its first publish."""
        self.broker.linkFlow = True
        c = self.ready()
        c.publish(1, "", "q", b"a")
        self.assertEqual(c.transport.producerState, "paused")
        self.assertEqual([conn.flowState for conn in self.broker.connections], ["flow"])


class HealthAndNodesTests(WebTestCase):
    """The health checks and the nodes API during alarms (bodies as RabbitMQ 3.10's)."""

    def test_okWithoutAlarms(self):
        """Without alarms every health check answers 200 {"status":"ok"}."""
        for path in ("/api/healthchecks/node", "/api/health/checks/alarms", "/api/health/checks/local-alarms"):
            r = self.get(path)
            self.assertEqual((r.code, r.json()), (200, {"status": "ok"}), path)

    def test_diskAlarm(self):
        """A disk alarm makes the checks answer 503 with RabbitMQ's bodies."""
        self.broker.alarms.set("disk")
        alarms = [{"node": "otter_tx@localhost", "resource": "disk space"}]
        r = self.get("/api/health/checks/alarms")
        self.assertEqual((r.code, r.json()), (503, {
            "status": "failed", "reason": "There are alarms in effect in the cluster", "alarms": alarms}))
        r = self.get("/api/health/checks/local-alarms")
        self.assertEqual((r.code, r.json()), (503, {
            "status": "failed", "reason": "There are alarms in effect on the node", "alarms": alarms}))
        r = self.get("/api/healthchecks/node")
        self.assertEqual((r.code, r.json()), (503, {
            "status": "failed", "reason": "resource alarm(s) in effect:[{resource_limit,disk,otter_tx@localhost}]"}))

    def test_bothAlarms(self):
        """Disk and memory are both listed, disk first, as RabbitMQ does."""
        self.broker.alarms.set("memory")
        self.broker.alarms.set("disk")
        self.assertEqual([a["resource"] for a in self.get("/api/health/checks/alarms").json()["alarms"]],
                         ["disk space", "memory"])
        self.assertEqual(self.get("/api/healthchecks/node").json()["reason"],
                         "resource alarm(s) in effect:[{resource_limit,disk,otter_tx@localhost},"
                         "{resource_limit,memory,otter_tx@localhost}]")

    def test_storeUnhealthy(self):
        """An unhealthy store makes every health check answer 503 saying why; healthy again, 200."""
        store = FakeStore()
        self.broker.alarms.watchStore(store)
        store.setHealthy(False, "database or disk is full")
        r = self.get("/api/healthchecks/node")
        self.assertEqual(r.code, 503)
        self.assertIn("message store unavailable: database or disk is full", r.json()["reason"])
        r = self.get("/api/health/checks/local-alarms")
        self.assertEqual((r.code, r.json()["alarms"]), (503, [
            {"node": "otter_tx@localhost", "resource": "message store", "reason": "database or disk is full"}]))
        store.setHealthy(True)
        self.assertEqual(self.get("/api/health/checks/alarms").code, 200)

    def test_nodes(self):
        """/api/nodes shows disk_free, disk_free_limit, the alarms and mem_used/mem_limit."""
        self.broker.memoryHighWatermark = 10 ** 12
        disk = DiskMonitor(self.broker.alarms, self.clock, "/data", limit=2000, probe=lambda path: 1000)
        disk.check()
        [node] = self.get("/api/nodes").json()
        self.assertEqual(node["name"], "otter_tx@localhost")
        self.assertEqual((node["disk_free"], node["disk_free_limit"], node["disk_free_alarm"]), (1000, 2000, True))
        self.assertEqual((node["mem_limit"], node["mem_alarm"]), (10 ** 12, False))
        self.assertGreater(node["mem_used"], 0)
        self.assertEqual(node["mem_calculation_strategy"], "rss")
        self.assertEqual(self.get("/api/nodes/otter_tx@localhost").json()["disk_free"], 1000)

    def test_nodeNotFound(self):
        """Another node's name is 404."""
        r = self.get("/api/nodes/rabbit@elsewhere")
        self.assertError(r, 404, "Object Not Found", "Not Found")

    def test_nodesNeedMonitoring(self):
        """A management-only user gets RabbitMQ's 401 "Not monitor user"; a monitoring user sees the node."""
        self.broker.addUser("mgr", "pw", tags=["management"])
        self.broker.addUser("mon", "pw", tags=["monitoring"])
        self.assertError(self.get("/api/nodes", auth=("mgr", "pw")), 401, "not_authorised", "Not monitor user")
        self.assertEqual(self.get("/api/nodes", auth=("mon", "pw")).code, 200)

    def test_metrics(self):
        """The Prometheus alarm gauges follow their own alarm."""
        self.broker.alarms.set("disk")
        text = renderMetrics(self.broker, 1.0).decode("utf-8")
        self.assertIn("rabbitmq_alarms_free_disk_space_watermark 1.0\n", text)
        self.assertIn("rabbitmq_alarms_memory_used_watermark 0.0\n", text)


class BlockedHeartbeatTests(SynchronousTestCase):
    """A blocked connection is not read, so its heartbeats are not timed out (RabbitMQ pauses the monitor)."""

    def test_blockedNotTimedOut(self):
        """Blocked for 10 heartbeat intervals, the connection stays open; unblocked, the timeout applies again."""
        clock = Clock()
        broker = Broker(clock)
        factory = AMQPServerFactory(broker, clock, heartbeat=10, handshakeTimeout=10)
        c = FakeClient(factory, handshake=False)
        c.feed(spec.PROTOCOL_HEADER)
        c.send(0, spec.ConnectionStartOk({"capabilities": {"connection.blocked": True}}, "PLAIN",
                                         b"\0guest\0guest", "en_US"))
        c.send(0, spec.ConnectionTuneOk(2047, 131072, 10))
        c.send(0, spec.ConnectionOpen("/", "", False))
        c.openChannel(1)
        broker.alarms.set("disk")
        c.publish(1, "", "q", b"x")
        self.assertEqual(c.transport.producerState, "paused")
        clock.pump([5] * 20)
        self.assertFalse(c.transport.disconnecting)
        broker.alarms.clear("disk")
        clock.pump([5] * 6)
        self.assertTrue(c.transport.disconnecting)


class ConnectionStateTests(WebTestCase):
    """/api/connections shows a connection "blocking" during an alarm and "blocked" once it published, as RabbitMQ."""

    def test_states(self):
        """running, then blocking (alarm), then blocked (published), then running again."""
        factory = AMQPServerFactory(self.broker, self.clock, heartbeat=0, handshakeTimeout=10)
        c = FakeClient(factory)
        c.openChannel(1)

        def state():
            [conn] = self.get("/api/connections").json()
            return conn["state"]

        self.assertEqual(state(), "running")
        self.broker.alarms.set("memory")
        self.assertEqual(state(), "blocking")
        c.publish(1, "", "q", b"x")
        self.assertEqual(state(), "blocked")
        self.broker.alarms.clear("memory")
        self.assertEqual(state(), "running")


class MonitorStopTests(SynchronousTestCase):
    """A monitor stopped from inside its own check does not re-arm."""

    def test_stopDuringCheck(self):
        """stop() called by a check leaves no timer behind."""
        clock = Clock()
        alarms = Alarms(_Broker())
        monitor = DiskMonitor(alarms, clock, "/data", probe=lambda path: monitor.stop() or 10 ** 9)
        monitor.start()
        self.assertEqual(clock.getDelayedCalls(), [])


class ReleaseFromPeakTests(SynchronousTestCase):
    """The drain that triggers a release is measured from the estimate's peak, not from when the alarm was set."""

    def test_growthAfterAlarmCounts(self):
        """Messages that arrived after the alarm and were then drained count towards the release."""
        clock = Clock()
        estimate = [1000]
        releases = []
        monitor = MemoryMonitor(Alarms(_Broker()), clock, 1000, probe=lambda: 1001,
                                estimate=lambda: estimate[0], release=lambda: releases.append(clock.seconds()))
        monitor.check()  # alarm set with the estimate at 1000
        estimate[0] = 2000  # buffered publishes still arrived
        monitor.check()
        clock.advance(monitor.lookInterval)
        estimate[0] = 1900  # drained 100 > 1000 // 16, but still above the estimate when set
        monitor.check()
        self.assertEqual(releases, [monitor.lookInterval])


class HotPathRaisesOnlyTests(SynchronousTestCase):
    """Received bytes may raise the memory alarm; only the timer clears it or releases memory."""

    def test_receivedDoesNotClear(self):
        """Below the clear level, received bytes leave the alarm set; the next timed check clears it."""
        clock = Clock()
        alarms = Alarms(_Broker())
        rss = [2000]
        releases = []
        monitor = MemoryMonitor(alarms, clock, 1000, probe=lambda: rss[0], release=lambda: releases.append(1))
        monitor.start()
        self.addCleanup(monitor.stop)
        self.assertIn("memory", alarms.active)
        rss[0] = 100
        monitor.received(monitor.step)
        self.assertIn("memory", alarms.active)
        rss[0] = 1100  # over 1.05x: a timed check would release
        monitor.received(monitor.step)
        self.assertEqual(releases, [])
        rss[0] = 100
        clock.advance(monitor.interval)
        self.assertEqual(alarms.active, {})
