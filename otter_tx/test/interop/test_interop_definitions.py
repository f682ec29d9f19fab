"""
Definitions export and import over real HTTP, on otter_tx (in-process) or
RabbitMQ 3.10 (``OTTER_TEST_MGMT_URL``): export, delete the objects,
import the export back, the objects are back and the user keeps its
password.  With ``OTTER_TEST_MGMT_URL`` set, one more test posts otter_tx's
export to that RabbitMQ (the issue's "otter_tx's export imports into
RabbitMQ").  Names start with ``defs-``.
"""

from urllib.parse import quote

import treq
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks, returnValue
from twisted.trial.unittest import SkipTest

from otter_tx.test.interop.support import EXTERNAL_OTTER
from otter_tx.test.interop.test_interop_http import EXTERNAL_MGMT, GUEST, ManagementHTTPCase


def _byName(item):
    return item["name"]


def _ofVHost(doc, vhost, user):
    """The parts of a whole-broker export about ``vhost`` and ``user``, comparable across brokers."""
    return {
        "users": [{k: u[k] for k in ("name", "password_hash", "hashing_algorithm", "tags")}
                  for u in doc["users"] if u["name"] == user],
        "vhosts": [{"name": v["name"]} for v in doc["vhosts"] if v["name"] == vhost],
        "permissions": [p for p in doc["permissions"] if p["vhost"] == vhost and p["user"] == user],
        "policies": sorted((p for p in doc["policies"] if p["vhost"] == vhost), key=_byName),
        "queues": sorted((q for q in doc["queues"] if q["vhost"] == vhost), key=_byName),
        "exchanges": sorted((x for x in doc["exchanges"] if x["vhost"] == vhost), key=_byName),
        "bindings": sorted((b for b in doc["bindings"] if b["vhost"] == vhost),
                           key=lambda b: (b["source"], b["destination"], b["routing_key"])),
    }


class DefinitionsInteropTests(ManagementHTTPCase):
    """Export, delete, import back: the same objects, on both brokers."""

    @inlineCallbacks
    def makeObjects(self, call):
        """A vhost with a user, permissions, a policy (with ``ha-mode``), queues, exchanges and bindings."""
        v, u = self.name("defs-v"), self.name("defs-u")
        ev = quote(v, safe="")
        self.cleanups += ["/api/users/" + u, "/api/vhosts/" + ev]
        steps = [
            ("PUT", "/api/vhosts/" + ev, {}),
            ("PUT", "/api/users/" + u, {"password": "pw", "tags": "management"}),
            ("PUT", "/api/permissions/%s/%s" % (ev, u), {"configure": "^a-", "write": ".*", "read": ".*"}),
            ("PUT", "/api/policies/%s/defs-p" % ev, {"pattern": "^defs-q$", "apply-to": "queues",
                                                     "definition": {"ha-mode": "all", "max-length": 100},
                                                     "priority": 1}),
            ("PUT", "/api/exchanges/%s/defs-ae" % ev, {"type": "fanout", "durable": True}),
            ("PUT", "/api/exchanges/%s/defs-x" % ev, {"type": "topic", "durable": True,
                                                       "arguments": {"alternate-exchange": "defs-ae"}}),
            ("PUT", "/api/queues/%s/defs-dlq" % ev, {"durable": True}),
            ("PUT", "/api/queues/%s/defs-q" % ev, {"durable": True, "arguments": {
                "x-dead-letter-exchange": "defs-ae", "x-message-ttl": 60000}}),
            ("POST", "/api/bindings/%s/e/defs-ae/q/defs-dlq" % ev, {"routing_key": ""}),
            ("POST", "/api/bindings/%s/e/defs-x/q/defs-q" % ev, {"routing_key": "a.#"}),
            ("POST", "/api/bindings/%s/e/defs-x/e/defs-ae" % ev, {"routing_key": "b.*"}),
        ]
        for method, path, body in steps:
            code, data, _ = yield call(method, path, body)
            self.assertIn(code, (201, 204), (path, data))
        returnValue((v, u))

    @inlineCallbacks
    def test_roundTrip(self):
        """The whole-broker export, imported after deleting the vhost and user, brings them back (204)."""
        v, u = yield self.makeObjects(self.call)
        _, whole, _ = yield self.call("GET", "/api/definitions")
        before = _ofVHost(whole, v, u)
        self.assertEqual(len(before["bindings"]), 3)
        for path in ("/api/vhosts/" + quote(v, safe=""), "/api/users/" + u):
            code, _, _ = yield self.call("DELETE", path)
            self.assertEqual(code, 204)
        code, data, _ = yield self.call("POST", "/api/definitions", before)
        self.assertEqual((code, data), (204, None), str(data))
        _, whole, _ = yield self.call("GET", "/api/definitions")
        self.assertEqual(_ofVHost(whole, v, u), before)
        code, data, _ = yield self.call("GET", "/api/whoami", auth=(u, "pw"))
        self.assertEqual((code, data["name"]), (200, u))

    @inlineCallbacks
    def test_perVHostRoundTrip(self):
        """The per-vhost export imports back into a recreated vhost (204) with the same objects."""
        v, _ = yield self.makeObjects(self.call)
        ev = quote(v, safe="")
        _, before, _ = yield self.call("GET", "/api/definitions/" + ev)
        self.assertEqual(sorted(q["name"] for q in before["queues"]), ["defs-dlq", "defs-q"])
        self.assertNotIn("vhost", before["queues"][0])
        yield self.call("DELETE", "/api/vhosts/" + ev)
        yield self.call("PUT", "/api/vhosts/" + ev, {})
        code, data, _ = yield self.call("POST", "/api/definitions/" + ev, before)
        self.assertEqual((code, data), (204, None), str(data))
        _, after, _ = yield self.call("GET", "/api/definitions/" + ev)
        for key in ("policies", "queues", "exchanges", "bindings"):
            self.assertEqual(after[key], before[key], key)

    @inlineCallbacks
    def test_quorumImported(self):
        """A quorum queue in a definitions file imports (204) and lists with type quorum, on otter_tx as on RabbitMQ."""
        v = self.name("defs-v")
        ev = quote(v, safe="")
        self.cleanups.append("/api/vhosts/" + ev)
        yield self.call("PUT", "/api/vhosts/" + ev, {})
        code, data, _ = yield self.call("POST", "/api/definitions/" + ev, {"queues": [
            {"name": "defs-qq", "durable": True, "auto_delete": False, "arguments": {"x-queue-type": "quorum"}},
            {"name": "defs-cq", "durable": True, "auto_delete": False, "arguments": {}}]})
        self.assertEqual((code, data), (204, None), str(data))
        code, q, _ = yield self.call("GET", "/api/queues/%s/defs-qq" % ev)
        self.assertEqual((code, q["type"]), (200, "quorum"))
        code, _, _ = yield self.call("GET", "/api/queues/%s/defs-cq" % ev)
        self.assertEqual(code, 200)

    @inlineCallbacks
    def test_otterExportIntoRabbitMQ(self):
        """otter_tx's export imports into the RabbitMQ of OTTER_TEST_MGMT_URL (204), the user keeping its password."""
        if not EXTERNAL_MGMT or EXTERNAL_OTTER:
            raise SkipTest("set OTTER_TEST_MGMT_URL for the RabbitMQ to import into")
        from otter_tx.testing import startBroker

        otter = yield startBroker(reactor, management=True)
        self.addCleanup(otter.stop)
        otterBase = "http://127.0.0.1:%d" % (otter.managementPort,)

        @inlineCallbacks
        def callOtter(method, path, body=None):
            resp = yield treq.request(method, otterBase + path, auth=GUEST, json=body, pool=self.pool)
            raw = yield resp.content()
            returnValue((resp.code, raw, resp))

        v, u = yield self.makeObjects(callOtter)
        resp = yield treq.get(otterBase + "/api/definitions", auth=GUEST, pool=self.pool)
        exported = _ofVHost((yield resp.json()), v, u)
        code, data, _ = yield self.call("POST", "/api/definitions", exported)
        self.assertEqual((code, data), (204, None), str(data))
        _, whole, _ = yield self.call("GET", "/api/definitions")
        self.assertEqual(_ofVHost(whole, v, u), exported)
        code, _, _ = yield self.call("GET", "/api/whoami", auth=(u, "pw"))
        self.assertEqual(code, 200)
