"""
rabbitmqadmin, the management CLI in Debian's ``rabbitmq-server`` package
(``/usr/bin/rabbitmqadmin``, a stdlib-only Python script), run against the
broker for its whole command set: ``list`` of every object type, ``show
overview``, ``declare`` / ``delete`` of every declarable type, ``publish``,
``get``, ``purge queue``, ``close connection``, ``export`` and ``import``.

Each call is a child process (:meth:`InteropTestCase.runProcess`) with
rabbitmqadmin's own HTTP timeout (``-t``) and a Deferred timeout, so a
broker that does not answer fails the test instead of hanging it.  The
module also runs against RabbitMQ 3.10 (``OTTER_TEST_AMQP_URL`` and
``OTTER_TEST_MGMT_URL``, as in CI), so every expectation here is what
RabbitMQ answers; names start with ``ops-`` and every test deletes what it
made.  RabbitMQ's object counters lag by its stats interval, so message
counts are read with ``get``, and connections are awaited in the list.
"""

import json
import os
import sys
import tempfile
import uuid
from urllib.parse import urlparse

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks, returnValue
from twisted.trial.unittest import SkipTest

from otter_tx.test.interop.support import EXTERNAL_OTTER, InteropTestCase, ManagementMixin, waitUntilDeferred

RABBITMQADMIN = "/usr/bin/rabbitmqadmin"

#: seconds rabbitmqadmin waits for one HTTP answer, and this test for the process
HTTP_TIMEOUT = 20
PROCESS_TIMEOUT = 40

#: the object types ``rabbitmqadmin list`` knows (its LISTABLE) and keys each object has on RabbitMQ 3.10
LIST_KEYS = {
    "connections": {"name", "user", "channels", "vhost", "node", "state", "peer_host", "peer_port"},
    "channels": {"name", "user", "number", "vhost", "node", "connection_details", "consumer_count"},
    "consumers": {"consumer_tag", "queue", "channel_details", "ack_required", "prefetch_count", "exclusive"},
    "exchanges": {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"},
    "queues": {"name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "node", "state"},
    "bindings": {"source", "vhost", "destination", "destination_type", "routing_key", "arguments",
                 "properties_key"},
    "users": {"name", "password_hash", "hashing_algorithm", "tags", "limits"},
    "vhosts": {"name", "tracing", "description", "tags"},
    "permissions": {"user", "vhost", "configure", "write", "read"},
    "nodes": {"name", "type", "running", "mem_used", "mem_limit", "mem_alarm", "disk_free", "disk_free_limit",
              "disk_free_alarm", "fd_used", "fd_total", "sockets_used", "sockets_total", "proc_used",
              "proc_total", "uptime", "os_pid", "processors", "run_queue", "partitions", "exchange_types",
              "auth_mechanisms", "applications", "contexts", "rates_mode", "net_ticktime"},
    "parameters": {"vhost", "component", "name", "value"},
    "policies": {"vhost", "name", "pattern", "apply-to", "definition", "priority"},
    "operator_policies": {"vhost", "name", "pattern", "apply-to", "definition", "priority"},
    "vhost_limits": {"vhost", "value"},
}


class RabbitmqadminTests(ManagementMixin, InteropTestCase):
    """rabbitmqadmin's commands give RabbitMQ's results against the broker under test."""

    timeout = 180

    def setUp(self):
        if not os.path.exists(RABBITMQADMIN):
            raise SkipTest("rabbitmqadmin is not installed (apt-get install rabbitmq-server)")
        return ManagementMixin.setUp(self)

    # --- running the tool ------------------------------------------------------

    def ops(self, base):
        """A unique name this helper may create on the shared peer (``ops-`` prefix)."""
        return "ops-%s-%s" % (base, uuid.uuid4().hex[:8])

    @inlineCallbacks
    def admin(self, *args, **kw):
        """
        ``(exitCode, stdout, stderr)`` (str) of one rabbitmqadmin run as guest
        on this broker's management port; ``check=True`` (the default)
        fails the test on a non-zero exit.
        """
        check = kw.pop("check", True)
        u = urlparse(self.mgmtBase())
        argv = [RABBITMQADMIN, "-H", u.hostname, "-P", str(u.port), "-u", "guest", "-p", "guest",
                "-t", str(HTTP_TIMEOUT)] + list(args)
        d = self.runProcess(sys.executable, argv)
        d.addTimeout(PROCESS_TIMEOUT, reactor)
        out, err, code = yield d
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        if check and code != 0:
            self.fail("rabbitmqadmin %s: exit %d\n%s%s" % (" ".join(args), code, out, err))
        returnValue((code, out, err))

    @inlineCallbacks
    def adminJson(self, *args):
        """The decoded ``-f raw_json`` output of one run (which must succeed)."""
        _, out, _ = yield self.admin("-f", "raw_json", *args)
        returnValue(json.loads(out))

    @inlineCallbacks
    def adminTsv(self, *args):
        """The ``-f tsv`` output of one run as a list of rows (lists of str), header first."""
        _, out, _ = yield self.admin("-f", "tsv", *args)
        returnValue([line.split("\t") for line in out.splitlines() if line])

    def cleanup(self, *args):
        """Run ``rabbitmqadmin *args`` (a delete) when the test ends, whatever happened."""
        self.addCleanup(lambda: self.admin(*args, check=False))

    @inlineCallbacks
    def vhost(self):
        """A fresh vhost (deleted at the end) where guest has every permission; its name."""
        vh = self.ops("vh")
        yield self.admin("declare", "vhost", "name=" + vh)
        self.cleanup("delete", "vhost", "name=" + vh)
        yield self.admin("declare", "permission", "vhost=" + vh, "user=guest",
                         "configure=.*", "write=.*", "read=.*")
        returnValue(vh)

    @inlineCallbacks
    def vhostAndUser(self, tags, configure, write, read):
        """
        A fresh vhost and user (password ``pw``, ``tags`` comma-separated) with
        the given permission regexes there, declared with rabbitmqadmin and
        deleted at the end; ``(vhost, user)``.
        """
        vh, user = self.ops("vh"), self.ops("u")
        yield self.admin("declare", "vhost", "name=" + vh)
        self.cleanup("delete", "vhost", "name=" + vh)
        yield self.admin("declare", "user", "name=" + user, "password=pw", "tags=" + tags)
        self.cleanup("delete", "user", "name=" + user)
        yield self.admin("declare", "permission", "vhost=" + vh, "user=" + user,
                         "configure=" + configure, "write=" + write, "read=" + read)
        returnValue((vh, user))

    @inlineCallbacks
    def waitFor(self, produce, ready, seconds=15):
        """Call ``produce()`` (a Deferred) until ``ready(result)`` or the deadline; the last result."""
        result = yield waitUntilDeferred(produce, ready, seconds, 0.25)
        returnValue(result)

    # --- list and show ---------------------------------------------------------

    @inlineCallbacks
    def test_listEveryType(self):
        """``list`` of every object type answers a JSON list whose objects have RabbitMQ's keys."""
        vh = yield self.vhost()
        q = self.ops("q")
        yield self.admin("-V", vh, "declare", "queue", "name=" + q, "durable=false")
        yield self.admin("-V", vh, "declare", "policy", "name=ops-p", "pattern=^ops-nothing$",
                         'definition={"max-length": 1}')
        yield self.admin("-V", vh, "declare", "operator_policy", "name=ops-op", "pattern=^ops-nothing$",
                         'definition={"max-length": 2}')
        yield self.admin("-V", vh, "declare", "vhost_limit", "vhost=" + vh, "name=max-queues", "value=100")
        yield self.admin("-V", vh, "declare", "binding", "source=amq.fanout", "destination=" + q)
        conn = yield self.inThread(self.pikaConnection, virtual_host=vh, heartbeat=0)
        self.addCleanup(self.inThread, conn.close)
        ch = yield self.inThread(conn.channel)
        yield self.inThread(ch.basic_consume, q, lambda *a: None)
        yield self.waitFor(lambda: self.adminJson("list", "consumers"),
                           lambda cs: any(c["queue"]["name"] == q for c in cs))
        for kind, keys in sorted(LIST_KEYS.items()):
            objects = yield self.adminJson("list", kind)
            self.assertIsInstance(objects, list, kind)
            mine = [o for o in objects if o.get("vhost", o.get("queue", {}).get("vhost")) == vh] or objects
            self.assertTrue(mine, kind)
            for o in mine:
                self.assertEqual(keys - set(o), set(), kind)
        nodes = yield self.adminJson("list", "nodes")
        node = nodes[0]
        if not EXTERNAL_OTTER:
            self.assertEqual(len(nodes), 1)
        self.assertEqual((node["type"], node["running"], node["partitions"]), ("disc", True, []))
        self.assertIsInstance(node["mem_used"], int)

    @inlineCallbacks
    def test_listColumns(self):
        """``list`` with its default columns (tsv) prints RabbitMQ's header and our objects' values."""
        vh = yield self.vhost()
        q = self.ops("q")
        yield self.admin("-V", vh, "declare", "queue", "name=" + q)
        yield self.admin("-V", vh, "declare", "exchange", "name=ops-x", "type=topic")
        yield self.admin("-V", vh, "declare", "binding", "source=ops-x", "destination=" + q, "routing_key=a.*")
        # RabbitMQ fills in a new queue's counts at its next stats emission
        rows = yield self.waitFor(lambda: self.adminTsv("-V", vh, "list", "queues"), lambda rows: rows[1][1])
        self.assertEqual(rows, [["name", "messages"], [q, "0"]])
        rows = yield self.adminTsv("-V", vh, "list", "exchanges")
        self.assertEqual(rows[0], ["name", "type"])
        self.assertIn(["ops-x", "topic"], rows)
        self.assertIn(["amq.rabbitmq.trace", "topic"], rows)
        rows = yield self.adminTsv("-V", vh, "list", "bindings")
        self.assertEqual(rows, [["source", "destination", "routing_key"], ["", q, q], ["ops-x", q, "a.*"]])
        rows = yield self.adminTsv("list", "vhosts")
        self.assertEqual(rows[0], ["name", "messages"])
        self.assertIn([vh, "0"], rows)
        rows = yield self.adminTsv("list", "nodes")
        self.assertEqual(rows[0], ["name", "type", "mem_used"])
        # one node, or each node of the otter_tx cluster the suite may run against
        self.assertEqual((len(rows) if not EXTERNAL_OTTER else 2, rows[1][1]), (2, "disc"))
        self.assertTrue(rows[1][2].isdigit())
        rows = yield self.adminTsv("list", "permissions", "user", "vhost", "configure", "write", "read")
        self.assertIn(["guest", vh, ".*", ".*", ".*"], rows)

    @inlineCallbacks
    def test_showOverview(self):
        """``show overview`` prints the release whose API is reproduced, the cluster name and the totals."""
        rows = yield self.adminTsv("show", "overview")
        self.assertEqual(rows[0], ["rabbitmq_version", "cluster_name", "queue_totals.messages",
                                   "object_totals.queues"])
        self.assertEqual(rows[1][0], "3.10.8")
        self.assertTrue(rows[1][2].isdigit() and rows[1][3].isdigit(), rows)
        [overview] = yield self.adminJson("show", "overview")
        for key in ("management_version", "node", "listeners", "contexts", "object_totals", "exchange_types"):
            self.assertIn(key, overview)

    # --- declare and delete ----------------------------------------------------

    @inlineCallbacks
    def test_queueAndExchange(self):
        """declare / delete queue and exchange with rabbitmqadmin's defaults and arguments; the lists show them."""
        vh = yield self.vhost()
        yield self.admin("-V", vh, "declare", "queue", "name=ops-q", "durable=false", "auto_delete=false",
                         'arguments={"x-max-length": 10, "x-message-ttl": 60000}')
        yield self.admin("-V", vh, "declare", "queue", "name=ops-qq", "queue_type=classic")
        yield self.admin("-V", vh, "declare", "exchange", "name=ops-x", "type=headers", "internal=true")
        queues = yield self.adminJson("-V", vh, "list", "queues", "name", "durable", "auto_delete", "arguments")
        self.assertEqual(sorted(queues, key=lambda q: q["name"]), [
            {"name": "ops-q", "durable": False, "auto_delete": False,
             "arguments": {"x-max-length": 10, "x-message-ttl": 60000}},
            {"name": "ops-qq", "durable": True, "auto_delete": False, "arguments": {"x-queue-type": "classic"}},
        ])
        exchanges = yield self.adminJson("-V", vh, "list", "exchanges", "name", "type", "durable", "internal")
        self.assertIn({"name": "ops-x", "type": "headers", "durable": True, "internal": True}, exchanges)
        yield self.admin("-V", vh, "delete", "queue", "name=ops-q")
        yield self.admin("-V", vh, "delete", "exchange", "name=ops-x")
        names = yield self.adminJson("-V", vh, "list", "queues", "name")
        self.assertEqual(names, [{"name": "ops-qq"}])
        names = yield self.adminJson("-V", vh, "list", "exchanges", "name")
        self.assertNotIn({"name": "ops-x"}, names)

    @inlineCallbacks
    def test_binding(self):
        """declare binding (queue and exchange destinations, arguments), delete it by its properties_key."""
        vh = yield self.vhost()
        yield self.admin("-V", vh, "declare", "queue", "name=ops-q")
        yield self.admin("-V", vh, "declare", "exchange", "name=ops-x", "type=direct")
        yield self.admin("-V", vh, "declare", "exchange", "name=ops-y", "type=fanout")
        yield self.admin("-V", vh, "declare", "binding", "source=ops-x", "destination=ops-q",
                         "routing_key=k", 'arguments={"a": 1}')
        yield self.admin("-V", vh, "declare", "binding", "source=ops-x", "destination=ops-y",
                         "destination_type=exchange", "routing_key=e")
        bindings = yield self.adminJson("-V", vh, "list", "bindings")
        mine = sorted((b for b in bindings if b["source"] == "ops-x"), key=lambda b: b["destination"])
        self.assertEqual([(b["destination"], b["destination_type"], b["routing_key"], b["arguments"])
                          for b in mine], [("ops-q", "queue", "k", {"a": 1}), ("ops-y", "exchange", "e", {})])
        self.assertEqual(mine[1]["properties_key"], "e")
        yield self.admin("-V", vh, "delete", "binding", "source=ops-x", "destination_type=queue",
                         "destination=ops-q", "properties_key=" + mine[0]["properties_key"])
        yield self.admin("-V", vh, "delete", "binding", "source=ops-x", "destination_type=exchange",
                         "destination=ops-y", "properties_key=e")
        bindings = yield self.adminJson("-V", vh, "list", "bindings")
        self.assertEqual([b for b in bindings if b["source"] == "ops-x"], [])

    @inlineCallbacks
    def test_vhostUserPermission(self):
        """declare / delete vhost, user (password or hash, tags) and permission; the lists follow."""
        vh, user = yield self.vhostAndUser("monitoring,policymaker", "^ops-", ".*", "")
        users = yield self.adminJson("list", "users")
        [u] = [u for u in users if u["name"] == user]
        self.assertEqual((sorted(u["tags"]), u["hashing_algorithm"]),
                         (["monitoring", "policymaker"], "rabbit_password_hashing_sha256"))
        perms = yield self.adminJson("list", "permissions")
        self.assertIn({"user": user, "vhost": vh, "configure": "^ops-", "write": ".*", "read": ""}, perms)
        vhosts = yield self.adminJson("list", "vhosts", "name")
        self.assertIn({"name": vh}, vhosts)
        yield self.admin("declare", "user", "name=" + user, "password_hash=" + u["password_hash"], "tags=")
        users = yield self.adminJson("list", "users")
        [u2] = [x for x in users if x["name"] == user]
        self.assertEqual((u2["tags"], u2["password_hash"]), ([], u["password_hash"]))
        yield self.admin("delete", "permission", "vhost=" + vh, "user=" + user)
        perms = yield self.adminJson("list", "permissions")
        self.assertEqual([p for p in perms if p["user"] == user], [])
        yield self.admin("delete", "user", "name=" + user)
        yield self.admin("delete", "vhost", "name=" + vh)
        users = yield self.adminJson("list", "users", "name")
        vhosts = yield self.adminJson("list", "vhosts", "name")
        self.assertNotIn({"name": user}, users)
        self.assertNotIn({"name": vh}, vhosts)

    @inlineCallbacks
    def test_parameterPolicyLimits(self):
        """declare / delete parameter, policy, operator_policy and vhost_limit; the lists show their JSON values."""
        vh = yield self.vhost()
        yield self.admin("-V", vh, "declare", "parameter", "component=vhost-limits", "name=limits",
                         'value={"max-connections": 10}')
        params = yield self.adminJson("list", "parameters")
        self.assertIn({"vhost": vh, "component": "vhost-limits", "name": "limits",
                       "value": {"max-connections": 10}}, params)
        yield self.admin("-V", vh, "declare", "vhost_limit", "vhost=" + vh, "name=max-queues", "value=7")
        limits = yield self.adminJson("list", "vhost_limits")
        self.assertIn({"vhost": vh, "value": {"max-connections": 10, "max-queues": 7}}, limits)
        yield self.admin("-V", vh, "delete", "vhost_limit", "vhost=" + vh, "name=max-queues")
        yield self.admin("-V", vh, "delete", "parameter", "component=vhost-limits", "name=limits")
        limits = yield self.adminJson("list", "vhost_limits")
        self.assertEqual([x for x in limits if x["vhost"] == vh], [])
        yield self.admin("-V", vh, "declare", "policy", "name=ops-p", "pattern=^ops-", "apply-to=queues",
                         "priority=3", 'definition={"max-length": 5}')
        yield self.admin("-V", vh, "declare", "operator_policy", "name=ops-op", "pattern=^ops-",
                         "apply-to=queues", 'definition={"message-ttl": 1000}')
        policies = yield self.adminJson("list", "policies")
        self.assertIn({"vhost": vh, "name": "ops-p", "pattern": "^ops-", "apply-to": "queues",
                       "definition": {"max-length": 5}, "priority": 3}, policies)
        ops = yield self.adminJson("list", "operator_policies")
        self.assertIn({"vhost": vh, "name": "ops-op", "pattern": "^ops-", "apply-to": "queues",
                       "definition": {"message-ttl": 1000}, "priority": 0}, ops)
        yield self.admin("-V", vh, "delete", "policy", "name=ops-p")
        yield self.admin("-V", vh, "delete", "operator_policy", "name=ops-op")
        policies = yield self.adminJson("list", "policies")
        ops = yield self.adminJson("list", "operator_policies")
        self.assertEqual([p for p in policies + ops if p["vhost"] == vh], [])

    @inlineCallbacks
    def test_refusals(self):
        """Bad declares and missing objects end rabbitmqadmin with RabbitMQ's messages and exit 1."""
        vh = yield self.vhost()
        code, _, err = yield self.admin("-V", vh, "declare", "parameter", "component=ops-nothing",
                                        "name=n", 'value={"a": 1}', check=False)
        self.assertEqual((code, err.split()[:3]), (1, ["***", "Validation", "failed"]))
        self.assertIn("component ops-nothing not found", err)
        code, _, err = yield self.admin("-V", vh, "delete", "queue", "name=ops-missing", check=False)
        self.assertEqual((code, err.strip()), (1, "*** Not found: /api/queues/%s/ops-missing" % (vh,)))
        code, _, err = yield self.admin("-V", "ops-no-such-vhost", "declare", "queue", "name=q", check=False)
        self.assertEqual(code, 1)
        self.assertIn("Not found: /api/queues/ops-no-such-vhost/q", err)
        code, _, err = yield self.admin("-V", vh, "get", "queue=ops-missing", check=False)
        self.assertEqual((code, err.strip()), (1, "*** Not found: /api/queues/%s/ops-missing/get" % (vh,)))

    # --- messages --------------------------------------------------------------

    @inlineCallbacks
    def test_publishGetPurge(self):
        """publish (properties, base64), get with requeue (then redelivered), get with ack, purge."""
        vh = yield self.vhost()
        yield self.admin("-V", vh, "declare", "queue", "name=ops-q")
        yield self.admin("-V", vh, "publish", "routing_key=ops-q", "payload=hello",
                         'properties={"content_type": "text/plain", "headers": {"h": 1}}')
        yield self.admin("-V", vh, "publish", "routing_key=ops-q", "payload=AAEC", "payload_encoding=base64")
        [m] = yield self.adminJson("-V", vh, "get", "queue=ops-q")
        self.assertEqual((m["payload"], m["payload_encoding"], m["payload_bytes"], m["redelivered"],
                          m["message_count"], m["exchange"], m["routing_key"]),
                         ("hello", "string", 5, False, 1, "", "ops-q"))
        self.assertEqual((m["properties"]["content_type"], m["properties"]["headers"]), ("text/plain", {"h": 1}))
        [m] = yield self.adminJson("-V", vh, "get", "queue=ops-q", "ackmode=ack_requeue_false")
        self.assertEqual((m["payload"], m["redelivered"]), ("hello", True))
        [m] = yield self.adminJson("-V", vh, "get", "queue=ops-q", "encoding=base64", "ackmode=ack_requeue_true")
        self.assertEqual((m["payload"], m["payload_encoding"], m["payload_bytes"]), ("AAEC", "base64", 3))
        rows = yield self.adminTsv("-V", vh, "get", "queue=ops-q", "count=5")
        self.assertEqual(rows[0][:4], ["routing_key", "exchange", "message_count", "payload"])
        self.assertEqual(len(rows), 2)
        yield self.admin("-V", vh, "purge", "queue", "name=ops-q")
        got = yield self.adminJson("-V", vh, "get", "queue=ops-q")
        self.assertEqual(got, [])
        _, out, _ = yield self.admin("-V", vh, "publish", "exchange=amq.direct", "routing_key=nowhere",
                                     "payload=x")
        self.assertEqual(out.strip(), "Message published but NOT routed")
        _, out, _ = yield self.admin("-V", vh, "publish", "routing_key=ops-q", "payload=x")
        self.assertEqual(out.strip(), "Message published")

    @inlineCallbacks
    def test_closeConnection(self):
        """close connection by the name list connections shows; the client sees the broker close it."""
        vh = yield self.vhost()
        conn = yield self.inThread(self.pikaConnection, virtual_host=vh, heartbeat=0)
        self.addCleanup(lambda: self.inThread(lambda: conn.is_open and conn.close()))
        conns = yield self.waitFor(lambda: self.adminJson("list", "connections", "name", "vhost", "user"),
                                   lambda cs: any(c["vhost"] == vh for c in cs))
        [c] = [c for c in conns if c["vhost"] == vh]
        self.assertEqual(c["user"], "guest")
        yield self.admin("close", "connection", "name=" + c["name"])

        def closed():
            try:
                conn.process_data_events(time_limit=5)
            except Exception as e:
                return type(e).__name__, getattr(e, "reply_code", None)
            return None

        outcome = yield self.inThread(closed)
        self.assertEqual(outcome, ("ConnectionClosedByBroker", 320))

    # --- definitions -----------------------------------------------------------

    @inlineCallbacks
    def test_exportImportVhost(self):
        """export -V writes the vhost's definitions; import -V of that file brings back what was deleted."""
        vh = yield self.vhost()
        yield self.admin("-V", vh, "declare", "queue", "name=ops-q", 'arguments={"x-max-length": 3}')
        yield self.admin("-V", vh, "declare", "exchange", "name=ops-x", "type=topic")
        yield self.admin("-V", vh, "declare", "binding", "source=ops-x", "destination=ops-q", "routing_key=#")
        yield self.admin("-V", vh, "declare", "policy", "name=ops-p", "pattern=^ops-q$",
                         'definition={"max-length": 9}')
        path = os.path.join(tempfile.mkdtemp(), "defs.json")
        yield self.admin("-V", vh, "export", path)
        with open(path) as f:
            defs = json.load(f)
        self.assertEqual([q["name"] for q in defs["queues"]], ["ops-q"])
        self.assertEqual([x["name"] for x in defs["exchanges"]], ["ops-x"])
        self.assertEqual([(b["source"], b["destination"], b["routing_key"]) for b in defs["bindings"]],
                         [("ops-x", "ops-q", "#")])
        self.assertEqual([p["name"] for p in defs["policies"]], ["ops-p"])
        yield self.admin("-V", vh, "delete", "queue", "name=ops-q")
        yield self.admin("-V", vh, "delete", "exchange", "name=ops-x")
        yield self.admin("-V", vh, "delete", "policy", "name=ops-p")
        yield self.admin("-V", vh, "import", path)
        queues = yield self.adminJson("-V", vh, "list", "queues", "name", "arguments")
        self.assertEqual(queues, [{"name": "ops-q", "arguments": {"x-max-length": 3}}])
        bindings = yield self.adminJson("-V", vh, "list", "bindings", "source", "destination", "routing_key")
        self.assertIn({"source": "ops-x", "destination": "ops-q", "routing_key": "#"}, bindings)
        policies = yield self.adminJson("list", "policies", "vhost", "name", "definition")
        self.assertEqual([p for p in policies if p["vhost"] == vh],
                         [{"vhost": vh, "name": "ops-p", "definition": {"max-length": 9}}])

    @inlineCallbacks
    def test_exportImportAll(self):
        """export of everything has RabbitMQ's keys; its part about our vhost and user, imported, re-creates them."""
        vh, user = yield self.vhostAndUser("management", ".*", ".*", ".*")
        yield self.admin("declare", "permission", "vhost=" + vh, "user=guest",
                         "configure=.*", "write=.*", "read=.*")
        yield self.admin("-V", vh, "declare", "queue", "name=ops-q")
        tmp = tempfile.mkdtemp()
        path = os.path.join(tmp, "all.json")
        yield self.admin("export", path)
        with open(path) as f:
            defs = json.load(f)
        self.assertEqual(set(defs) >= {"rabbit_version", "rabbitmq_version", "product_name", "product_version",
                                       "users", "vhosts", "permissions", "topic_permissions", "parameters",
                                       "global_parameters", "policies", "queues", "exchanges", "bindings"},
                         True, sorted(defs))
        # only our part goes back: the shared peer's other objects are left alone
        ours = {
            "users": [u for u in defs["users"] if u["name"] == user],
            "vhosts": [v for v in defs["vhosts"] if v["name"] == vh],
            "permissions": [p for p in defs["permissions"] if p["vhost"] == vh],
            "queues": [q for q in defs["queues"] if q["vhost"] == vh],
        }
        self.assertEqual([len(v) for _, v in sorted(ours.items())], [2, 1, 1, 1])
        part = os.path.join(tmp, "ours.json")
        with open(part, "w") as f:
            json.dump(ours, f)
        yield self.admin("delete", "vhost", "name=" + vh)
        yield self.admin("delete", "user", "name=" + user)
        yield self.admin("import", part)
        users = yield self.adminJson("list", "users", "name", "tags")
        self.assertIn({"name": user, "tags": ["management"]}, users)
        perms = yield self.adminJson("list", "permissions")
        self.assertEqual(sorted(p["user"] for p in perms if p["vhost"] == vh), sorted(["guest", user]))
        queues = yield self.adminJson("-V", vh, "list", "queues", "name")
        self.assertEqual(queues, [{"name": "ops-q"}])
