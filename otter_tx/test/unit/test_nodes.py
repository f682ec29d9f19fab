"""
Unit tests for ``/api/nodes``, ``/api/nodes/{name}`` and the memory
breakdowns (otter_tx.web.nodes), on StubTreq and task.Clock.  The shapes are
RabbitMQ 3.10's, taken from the peer's ``/api/nodes``.
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.resources.alarms import DiskMonitor
from otter_tx.test.unit.test_web import WebTestCase
from otter_tx.web import nodes

#: keys RabbitMQ 3.10's node object has that a single otter_tx node gives too
RABBITMQ_KEYS = {
    "name", "type", "running", "os_pid", "mem_used", "mem_used_details", "mem_limit", "mem_alarm",
    "mem_calculation_strategy", "disk_free", "disk_free_details", "disk_free_limit", "disk_free_alarm",
    "fd_used", "fd_used_details", "fd_total", "sockets_used", "sockets_used_details", "sockets_total",
    "proc_used", "proc_used_details", "proc_total", "uptime", "run_queue", "processors", "rates_mode",
    "exchange_types", "auth_mechanisms", "applications", "contexts", "log_files", "config_files", "db_dir",
    "enabled_plugins", "net_ticktime", "partitions", "cluster_links",
}


class NodesEndpointTests(WebTestCase):
    """The node object's keys, types and values."""

    def test_keys(self):
        """The node has every RabbitMQ 3.10 key a single node can give, with RabbitMQ's types."""
        [node] = self.get("/api/nodes").json()
        self.assertEqual(RABBITMQ_KEYS - set(node), set())
        for key in ("mem_used", "mem_limit", "disk_free", "disk_free_limit", "fd_used", "fd_total",
                    "sockets_used", "sockets_total", "proc_used", "proc_total", "uptime", "run_queue",
                    "processors", "net_ticktime"):
            self.assertIsInstance(node[key], int, key)
        self.assertEqual((node["type"], node["running"], node["being_drained"], node["partitions"]),
                         ("disc", True, False, []))
        self.assertIsInstance(node["os_pid"], str)
        self.assertLessEqual(node["fd_used"], node["fd_total"])
        self.assertLessEqual(node["proc_used"], node["proc_total"])
        self.assertEqual([m["name"] for m in node["auth_mechanisms"]], ["PLAIN", "AMQPLAIN", "EXTERNAL"])
        self.assertIn("x-delayed-message", [t["name"] for t in node["exchange_types"]])
        self.assertIn("otter_tx", [a["name"] for a in node["applications"]])
        self.assertNotIn("memory", node)
        self.assertNotIn("binary", node)

    def test_uptimeInMs(self):
        """uptime counts ms on the app's clock since it started."""
        self.clock.advance(2.5)
        self.assertEqual(self.get("/api/nodes/otter_tx@localhost").json()["uptime"], 2500)

    def test_runQueue(self):
        """run_queue counts the clock's calls that are due and not yet run."""
        self.clock.callLater(1, lambda: None)
        self.clock.callLater(5, lambda: None)
        self.assertEqual(nodes.runQueue(self.clock), 0)
        self.clock.rightNow += 2
        self.assertEqual(nodes.runQueue(self.clock), 1)

    def test_alarmsAndLimits(self):
        """mem_limit is the watermark, disk_free/disk_free_limit the disk monitor's, the alarms as raised."""
        self.broker.memoryHighWatermark = 10 ** 12
        DiskMonitor(self.broker.alarms, self.clock, "/data", limit=2000, probe=lambda path: 1000).check()
        self.broker.alarms.set("memory")
        node = self.get("/api/nodes/otter_tx@localhost").json()
        self.assertEqual((node["disk_free"], node["disk_free_limit"], node["disk_free_alarm"], node["mem_alarm"],
                          node["mem_limit"]), (1000, 2000, True, True, 10 ** 12))

    def test_serviceFacts(self):
        """db_dir, config_files, log_files and contexts come from what the service told the app."""
        self.mgmt.dataDir = "/var/lib/ottermq"
        self.mgmt.configFiles = ["/etc/ottermq.toml"]
        self.mgmt.logFiles = ["<stdout>"]
        self.mgmt.listeners = [{"protocol": "http", "ip_address": "127.0.0.1", "port": 15672,
                               "certfile": None, "cacertfile": None}]
        node = self.get("/api/nodes/otter_tx@localhost").json()
        self.assertEqual((node["db_dir"], node["config_files"], node["log_files"]),
                         ("/var/lib/ottermq", ["/etc/ottermq.toml"], ["<stdout>"]))
        self.assertEqual(node["contexts"], [{"description": "RabbitMQ Management", "path": "/",
                                             "cowboy_opts": "[{sendfile,false}]", "ip": "127.0.0.1",
                                             "port": "15672"}])

    def test_memoryAndBinary(self):
        """?memory=true adds RabbitMQ's breakdown (summing to RSS), ?binary=true the binary one."""
        vh = self.broker.vhosts["/"]
        vh.declareQueue("q", None)
        from otter_tx.broker.message import Message

        vh.publish(vh.exchanges[""], Message("", "q", b"\x00\x00", b"x" * 1000))
        node = self.get("/api/nodes/otter_tx@localhost?memory=true&binary=true").json()
        memory = node["memory"]
        self.assertEqual(set(nodes.MEMORY_KEYS) | {"strategy", "total"}, set(memory))
        self.assertEqual(sum(memory[k] for k in nodes.MEMORY_KEYS), memory["total"]["rss"])
        self.assertEqual(memory["total"]["rss"], node["mem_used"])
        self.assertGreaterEqual(memory["queue_procs"], 1000)
        self.assertEqual(node["binary"]["queue_procs"], 1000)
        self.assertEqual(set(node["binary"]), set(nodes.BINARY_KEYS))

    def test_memoryEndpoints(self):
        """/memory answers {"memory": breakdown}, /memory/relative whole percentages with total 100."""
        memory = self.get("/api/nodes/otter_tx@localhost/memory").json()["memory"]
        self.assertEqual(memory["strategy"], "rss")
        relative = self.get("/api/nodes/otter_tx@localhost/memory/relative").json()["memory"]
        self.assertEqual(relative["total"], 100)
        self.assertTrue(95 <= sum(relative[k] for k in nodes.MEMORY_KEYS) <= 105)

    def test_otherNodeNotFound(self):
        """Another node's name is 404 on every node path."""
        for path in ("/api/nodes/rabbit@elsewhere", "/api/nodes/rabbit@elsewhere/memory",
                     "/api/nodes/rabbit@elsewhere/memory/relative"):
            self.assertError(self.get(path), 404, "Object Not Found", "Not Found")

    def test_memoryNeedsMonitoring(self):
        """A management-only user gets 401 "Not monitor user" on the memory breakdown too."""
        self.broker.addUser("mgr", "pw", tags=["management"])
        self.assertError(self.get("/api/nodes/otter_tx@localhost/memory", auth=("mgr", "pw")),
                         401, "not_authorised", "Not monitor user")


class HelperTests(SynchronousTestCase):
    """The process facts the node object is built from."""

    def test_relativeMemory(self):
        """relativeMemory rounds each key to a whole percentage of RSS."""
        breakdown = dict.fromkeys(nodes.MEMORY_KEYS, 0)
        breakdown.update({"queue_procs": 250, "other_proc": 750, "total": {"rss": 1000}})
        relative = nodes.relativeMemory(breakdown)
        self.assertEqual((relative["total"], relative["queue_procs"], relative["other_proc"], relative["code"]),
                         (100, 25, 75, 0))

    def test_runQueueWithoutDelayedCalls(self):
        """A clock that cannot list its calls has run_queue 0."""
        class Bare:
            def seconds(self):
                return 0.0

        self.assertEqual(nodes.runQueue(Bare()), 0)
        self.assertEqual(nodes.runQueue(Clock()), 0)

    def test_threads(self):
        """proc_used counts at least this thread and proc_total is at least that."""
        used = nodes.threadsUsed()
        self.assertGreaterEqual(used, 1)
        self.assertGreaterEqual(nodes.threadsTotal(used), used)


class LogFilesTests(SynchronousTestCase):
    """What tap tells /api/nodes about twistd's log."""

    def _logFiles(self, parent):
        from otter_tx.service import tap

        class Options(dict):
            pass

        options = Options()
        if parent is not None:
            options.parent = parent
        return tap._logFiles(options)

    def test_forms(self):
        """--logfile - and --nodaemon are <stdout>, a path is made absolute, outside twistd nothing."""
        import os

        self.assertEqual(self._logFiles(None), [])
        self.assertEqual(self._logFiles({"logfile": "-"}), ["<stdout>"])
        self.assertEqual(self._logFiles({"logfile": None, "nodaemon": True}), ["<stdout>"])
        self.assertEqual(self._logFiles({"logfile": "/var/log/otter.log"}), ["/var/log/otter.log"])
        self.assertEqual(self._logFiles({"logfile": None, "nodaemon": False}), [os.path.abspath("twistd.log")])
