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

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request

from twisted.internet import reactor, threads
from twisted.trial.unittest import SkipTest

from otter_tx.test.interop import EXTERNAL, InteropTestCase, ManagementMixin
HUGE = "1000000GB"
NORMAL = "50MB"


class DiskAlarmTests(ManagementMixin, InteropTestCase):
    """Free space below disk_free_limit blocks publishers and fails the health checks until it returns."""

    timeout = 60
    brokerOptions = {"management": True, "diskFreeLimit": 1000000 * 1000 ** 3}

    def setUp(self):
        if EXTERNAL and shutil.which("rabbitmqctl") is None:
            raise SkipTest("against RabbitMQ this test needs rabbitmqctl to change disk_free_limit")
        return ManagementMixin.setUp(self)

    # --- helpers (worker thread) ------------------------------------------------

    def http(self, path):
        """``(status, JSON)`` of ``GET path`` as guest."""
        req = urllib.request.Request(self.mgmtBase() + path)
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

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
            from otter_tx.tap import parseDiskFreeLimit

            limit = parseDiskFreeLimit(text)[1]
            threads.blockingCallFromThread(reactor, self.fixture.service.diskMonitor.setLimit, limit)

    def waitFor(self, predicate, seconds=15):
        """Poll ``predicate()`` until true (or the deadline); returns its last value."""
        deadline = time.monotonic() + seconds
        value = predicate()
        while not value and time.monotonic() < deadline:
            time.sleep(0.1)
            value = predicate()
        return value

    # --- the test ---------------------------------------------------------------

    def test_lowDiskBlocksAndClears(self):
        """pika sees connection.blocked "low on disk" then unblocked; health checks 503 then 200; nodes shows it."""
        q = self.name("disk-alarm")

        def run():
            out = {}
            node = self.node()
            try:
                self.setLimit(HUGE)
                out["alarms"] = self.waitFor(lambda: self.http("/api/health/checks/alarms")[0] == 503
                                             and self.http("/api/health/checks/alarms"))
                out["local"] = self.http("/api/health/checks/local-alarms")
                # RabbitMQ refreshes node statistics every few seconds
                out["node"] = self.waitFor(lambda: self.nodeInfo(node, True))
                events = []
                pub = self.pikaConnection()
                pub.add_on_connection_blocked_callback(lambda c, m: events.append(m.method.reason))
                pub.add_on_connection_unblocked_callback(lambda c, m: events.append("unblocked"))
                ch = pub.channel()
                ch.queue_declare(q)
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
            self.assertEqual((info["disk_free_alarm"], info["disk_free_limit"]), (True, 1000000 * 1000 ** 3))
            self.assertGreater(info["disk_free"], 0)
            self.assertEqual(out["events"], ["low on disk", "unblocked"])
            self.assertEqual(out["count"], 1)
            self.assertEqual(out["after"], (200, {"status": "ok"}))
            code, info = out["nodeAfter"]
            self.assertEqual((info["disk_free_alarm"], info["disk_free_limit"]), (False, 50 * 1000 ** 2))
            for key in ("mem_used", "mem_limit"):
                self.assertGreater(info[key], 0, key)
            self.assertIs(info["mem_alarm"], False)

        return self.inThread(run).addCallback(check)
