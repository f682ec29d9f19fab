"""
Interop tests for the disk alarm (https://www.rabbitmq.com/docs/disk-alarms)
with a real client (pika) and the management API over real HTTP.

The disk free limit is raised above the free space and lowered again inside
the test: on the in-process broker through its ``DiskMonitor`` (it also
starts with ``--disk-free-limit 1000000GB``), on RabbitMQ with ``rabbitmqctl
-n NODE set_disk_free_limit`` (NODE from ``/api/overview``, or
``OTTER_TEST_RABBITMQ_NODE``), restored to 50MB afterwards.  Against RabbitMQ
they need ``OTTER_TEST_MGMT_URL`` and a ``rabbitmqctl`` that can reach the
node (as for the peer started by tools/rabbitmq-peer.sh).
"""

import os
import shutil
import struct
import subprocess
import time

from twisted.internet import reactor, threads
from twisted.trial.unittest import SkipTest

from otter_tx.test.interop.support import EXTERNAL, EXTERNAL_OTTER, InteropTestCase, ManagementMixin, inProcessOnly, waitUntil
from otter_tx.test.interop.test_interop_flow import _frame, _shortstr
HUGE = "1000000GB"
NORMAL = "50MB"


class DiskAlarmTests(ManagementMixin, InteropTestCase):
    """Free space below disk_free_limit blocks publishers and fails the health checks until it returns."""

    timeout = 60
    brokerOptions = {"management": True, "diskFreeLimit": 1000000 * 1000 ** 3}

    def setUp(self):
        if EXTERNAL and shutil.which("rabbitmqctl") is None:
            raise SkipTest("against RabbitMQ this test needs rabbitmqctl to change disk_free_limit")
        if EXTERNAL_OTTER:
            raise SkipTest("against an external otter_tx node nothing changes its disk_free_limit "
                           "(rabbitmqctl is RabbitMQ's); the in-process run covers it")
        return ManagementMixin.setUp(self)

    # --- helpers (worker thread) ------------------------------------------------

    def http(self, path):
        """``(status, JSON)`` of ``GET path`` as guest."""
        return self.mgmtCall("GET", path)

    def node(self):
        """The node name the alarms are reported under."""
        return os.environ.get("OTTER_TEST_RABBITMQ_NODE") or self.http("/api/overview")[1]["node"]

    def nodeInfo(self, node, alarm):
        """``(status, JSON)`` of ``/api/nodes/{node}`` once its disk_free_alarm is ``alarm``, else None."""
        code, info = self.http("/api/nodes/%s" % (node,))
        if code == 200 and info.get("disk_free_alarm") is alarm:
            return code, info
        return None

    def setLimit(self, text):
        """Set disk_free_limit (``"50MB"``) on the broker under test."""
        if EXTERNAL:
            subprocess.run(["rabbitmqctl", "-n", self.node(), "set_disk_free_limit", text],
                           check=True, capture_output=True, timeout=30)
        else:
            from otter_tx.service.tap import parseDiskFreeLimit

            limit = parseDiskFreeLimit(text)[1]
            threads.blockingCallFromThread(reactor, self.fixture.service.diskMonitor.setLimit, limit)

    def waitFor(self, predicate, seconds=15):
        """Poll ``predicate()`` until true (or the deadline); returns its last value."""
        return waitUntil(predicate, seconds, 0.1)

    # --- the test ---------------------------------------------------------------

    def test_lowDiskBlocksAndClears(self):
        """pika sees connection.blocked "low on disk" then unblocked; health checks 503 then 200; nodes show it."""
        q = self.name("disk-alarm")

        def run():
            out = {}
            node = self.node()
            events = []
            pub = self.pikaConnection()
            pub.add_on_connection_blocked_callback(lambda c, m: events.append(m.method.reason))
            pub.add_on_connection_unblocked_callback(lambda c, m: events.append("unblocked"))
            ch = pub.channel()
            ch.queue_declare(q)
            # a freshly started RabbitMQ lists its node without disk_free until its
            # first statistics emission (a few seconds): wait for it before the alarm
            self.waitFor(lambda: "disk_free" in self.http("/api/nodes/%s" % (node,))[1], 30)
            try:
                # against the shared RabbitMQ peer the alarm blocks everyone's publishers:
                # keep it short (the nodes API, refreshed every few seconds there, is
                # checked for the alarm after it clears)
                self.setLimit(HUGE)
                out["alarms"] = self.waitFor(lambda: self.http("/api/health/checks/alarms")[0] == 503
                                             and self.http("/api/health/checks/alarms"))
                out["local"] = self.http("/api/health/checks/local-alarms")
                out["node"] = self.http("/api/nodes/%s" % (node,))
                ch.basic_publish("", q, b"held while low on disk")
                deadline = time.monotonic() + 10
                while not events and time.monotonic() < deadline:
                    pub.process_data_events(0.05)
                self.setLimit(NORMAL)
                deadline = time.monotonic() + 15
                while "unblocked" not in events and time.monotonic() < deadline:
                    pub.process_data_events(0.05)
                out["events"] = events
                out["count"] = ch.queue_declare(q, passive=True).method.message_count
                out["after"] = self.waitFor(lambda: self.http("/api/health/checks/alarms")[0] == 200
                                            and self.http("/api/health/checks/alarms"))
                out["nodeAfter"] = self.waitFor(lambda: self.nodeInfo(node, False))
                ch.queue_delete(q)
                pub.close()
            finally:
                if EXTERNAL:
                    self.setLimit(NORMAL)
            out["nodeName"] = node
            return out

        def check(out):
            node = out["nodeName"]
            alarm = {"node": node, "resource": "disk space"}
            self.assertEqual(out["alarms"], (503, {"status": "failed", "alarms": [alarm],
                                                   "reason": "There are alarms in effect in the cluster"}))
            self.assertEqual(out["local"], (503, {"status": "failed", "alarms": [alarm],
                                                  "reason": "There are alarms in effect on the node"}))
            code, info = out["node"]
            self.assertEqual(code, 200)
            self.assertGreater(info["disk_free"], 0)
            if not EXTERNAL:  # RabbitMQ shows it at its next statistics refresh
                self.assertEqual((info["disk_free_alarm"], info["disk_free_limit"]), (True, 1000000 * 1000 ** 3))
            self.assertEqual(out["events"], ["low on disk", "unblocked"])
            self.assertEqual(out["count"], 1)
            self.assertEqual(out["after"], (200, {"status": "ok"}))
            code, info = out["nodeAfter"]
            self.assertEqual((info["disk_free_alarm"], info["disk_free_limit"]), (False, 50 * 1000 ** 2))
            for key in ("mem_used", "mem_limit"):
                self.assertGreater(info[key], 0, key)
            self.assertIs(info["mem_alarm"], False)

        return self.inThread(run).addCallback(check)


    def test_httpPublishDuringAlarm(self):
        """
        A publish through the HTTP API during the alarm is accepted and
        routed (200 ``{"routed": true}``), as RabbitMQ 3.10 answers it; AMQP publishers are blocked.
        """
        q = self.name("disk-alarm-http")

        def run():
            out = {}
            self.mgmtCall("PUT", "/api/queues/%2F/" + q, {})
            try:
                self.setLimit(HUGE)
                self.waitFor(lambda: self.http("/api/health/checks/alarms")[0] == 503)
                out["publish"] = self.mgmtCall("POST", "/api/exchanges/%2F/amq.default/publish", {
                    "properties": {}, "routing_key": q, "payload": "during the alarm",
                    "payload_encoding": "string"})
            finally:
                self.setLimit(NORMAL)
            out["get"] = self.mgmtCall("POST", "/api/queues/%2F/" + q + "/get",
                                       {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
            self.mgmtCall("DELETE", "/api/queues/%2F/" + q)
            return out

        def check(out):
            self.assertEqual(out["publish"], (200, {"routed": True}))
            code, got = out["get"]
            self.assertEqual((code, [m["payload"] for m in got]), (200, ["during the alarm"]))

        return self.inThread(run).addCallback(check)


class MemoryFloodTests(InteropTestCase):
    """Under a flood of 64 B messages the memory alarm holds the process's RSS near the watermark."""

    timeout = 120
    #: raised above the test process's RSS by this much inside the test
    headroom = 100 * 1024 * 1024

    @inProcessOnly("the broker's RSS is read from the test process (/proc/self/statm)")
    def test_floodHeldNearWatermark(self):
        """RSS stays within 1.2x the watermark while a raw client floods 64 B messages; a purge unblocks it."""
        from otter_tx.resources.process_memory import rssBytes

        if rssBytes() is None:
            raise SkipTest("no /proc/self/statm here")
        broker = self.fixture.broker
        # keep the flood in memory: with the default budget the queue pages it
        # to disk (otter_tx.broker.paging) and RSS never reaches the watermark
        broker.queueMemoryBudget = 2 ** 62
        q = self.name("flood")
        watermark = rssBytes() + self.headroom
        broker.memoryHighWatermark = watermark

        def run():
            pika = self.pikaConnection()
            ch = pika.channel()
            ch.queue_declare(q)
            flooder = _Flooder(self.host, self.port, q)
            try:
                peak = flooder.pump(stall=2.0, deadline=60.0)
                alarmed = "memory" in broker.alarms.active
                queued = ch.queue_declare(q, passive=True).method.message_count
                ch.queue_purge(q)
                resumed = flooder.progresses(within=15.0)
                reasons = flooder.blockedReasons()
            finally:
                flooder.close()
                ch.queue_delete(q)
                pika.close()
                # the broker may still be parsing the flooder's buffered publishes: let it see
                # the end of both connections before the fixture stops
                deadline = time.monotonic() + 30
                while broker.connections and time.monotonic() < deadline:
                    time.sleep(0.05)
            return peak, alarmed, queued, resumed, reasons

        def check(result):
            peak, alarmed, queued, resumed, reasons = result
            self.assertTrue(alarmed)
            self.assertGreater(queued, 10000)
            self.assertLessEqual(peak, 1.2 * watermark, "peak RSS %d for a watermark of %d" % (peak, watermark))
            self.assertTrue(resumed, "the publisher was not unblocked after the purge")
            self.assertIn("low on memory", reasons)

        return self.inThread(run).addCallback(check)


class _Flooder:
    """A raw AMQP publisher (own socket, frames built here) that floods transient 64 B messages."""

    def __init__(self, host, port, queue):
        import socket

        self.sock = socket.create_connection((host, port), timeout=10)
        self._buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self._method()  # connection.start
        caps = _table({"connection.blocked": True})
        props = _shortstr("capabilities") + b"F" + struct.pack("!I", len(caps)) + caps
        self._send(1, 0, struct.pack("!HH", 10, 11) + struct.pack("!I", len(props)) + props
                   + _shortstr("PLAIN") + struct.pack("!I", 12) + b"\x00guest\x00guest" + _shortstr("en_US"))
        self._method()  # connection.tune
        self._send(1, 0, struct.pack("!HHHIH", 10, 31, 2047, 131072, 0))
        self._send(1, 0, struct.pack("!HH", 10, 40) + _shortstr("/") + _shortstr("") + b"\x00")
        self._method()  # connection.open-ok
        self._send(1, 1, struct.pack("!HH", 20, 10) + _shortstr(""))
        self._method()  # channel.open-ok
        one = (_frame(1, 1, struct.pack("!HHH", 60, 40, 0) + _shortstr("") + _shortstr(queue) + b"\x00")
               + _frame(2, 1, struct.pack("!HHQH", 60, 0, 64, 0)) + _frame(3, 1, b"m" * 64))
        self.batch = one * 500
        self._pending = b""
        self.sock.setblocking(False)

    def _send(self, ftype, channel, payload):
        self.sock.sendall(_frame(ftype, channel, payload))

    def _method(self):
        """Read one frame (blocking, during the handshake); returns its payload."""
        while True:
            if len(self._buf) >= 7:
                size = struct.unpack("!I", self._buf[3:7])[0]
                if len(self._buf) >= size + 8:
                    payload, self._buf = self._buf[7:7 + size], self._buf[size + 8:]
                    return payload
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the broker closed the connection")
            self._buf += data

    def _step(self, wait):
        """Send what the socket takes within ``wait`` seconds; returns bytes sent."""
        import select

        if not self._pending:
            self._pending = self.batch
        _, writable, _ = select.select([], [self.sock], [], wait)
        if not writable:
            return 0
        try:
            n = self.sock.send(self._pending)
        except BlockingIOError:
            return 0
        self._pending = self._pending[n:]
        return n

    def pump(self, stall, deadline):
        """Flood until no byte was taken for ``stall`` s (blocked) or ``deadline`` s; returns the peak RSS."""
        from otter_tx.resources.process_memory import rssBytes

        start = last = time.monotonic()
        peak = rssBytes()
        while time.monotonic() - last < stall and time.monotonic() - start < deadline:
            if self._step(0.05):
                last = time.monotonic()
            peak = max(peak, rssBytes())
        return peak

    def progresses(self, within):
        """True once the socket takes more than 1 MB again within ``within`` seconds (unblocked)."""
        end = time.monotonic() + within
        sent = 0
        while time.monotonic() < end:
            sent += self._step(0.05)
            if sent > 1000000:
                return True
        return False

    def blockedReasons(self):
        """The reasons of the connection.blocked frames received so far (list of str)."""
        import socket

        reasons = []
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                self._buf += data
        except (BlockingIOError, socket.timeout):
            pass
        buf = self._buf
        while len(buf) >= 7:
            size = struct.unpack("!I", buf[3:7])[0]
            if len(buf) < size + 8:
                break
            payload, buf = buf[7:7 + size], buf[size + 8:]
            if payload[:4] == struct.pack("!HH", 10, 60):
                reasons.append(payload[5:5 + payload[4]].decode())
        return reasons

    def close(self):
        self.sock.close()


def _table(d):
    """A field table of booleans (the only kind this client sends)."""
    return b"".join(_shortstr(k) + b"t" + (b"\x01" if v else b"\x00") for k, v in d.items())
