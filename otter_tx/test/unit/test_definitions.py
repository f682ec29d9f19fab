"""
Definitions import and export (``POST`` / ``GET /api/definitions`` and
``/api/definitions/{vhost}``) with the two RabbitMQ 3.10 exports of
``data/`` and RabbitMQ's password hashes.
"""

import base64
import hashlib
import json
import os

from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.broker import access
from otter_tx.broker.access import User
from otter_tx.broker.definitions import importDefinitions
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.test.unit.test_web import WebTestCase
from otter_tx.testing import FakeClient

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def fixture(name):
    """The parsed JSON of ``data/name``."""
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


WHOLE = "rabbitmq-3.10-definitions.json"
PER_VHOST = "rabbitmq-3.10-definitions-vhost.json"


class PasswordHashTests(SynchronousTestCase):
    """RabbitMQ's salted password hashes on User."""

    def _hash(self, digest, password, salt=b"\x01\x02\x03\x04"):
        return base64.b64encode(salt + digest(salt + password.encode()).digest()).decode()

    def test_algorithms(self):
        """A sha256, sha512 or md5 RabbitMQ hash checks the right password only."""
        for name, digest in [("rabbit_password_hashing_sha256", hashlib.sha256),
                             ("rabbit_password_hashing_sha512", hashlib.sha512),
                             ("rabbit_password_hashing_md5", hashlib.md5)]:
            u = User("u", None)
            u.setPasswordHash(self._hash(digest, "pw"), name)
            self.assertEqual((u.checkPassword("pw"), u.checkPassword("px")), (True, False), name)
            self.assertEqual(u.exportHash(), self._hash(digest, "pw"))

    def test_rabbitmqHash(self):
        """The fixture's hash of defs-alice (made by RabbitMQ 3.10) checks alice-pw."""
        alice = [u for u in fixture(WHOLE)["users"] if u["name"] == "defs-alice"][0]
        u = User("defs-alice", None)
        u.setPasswordHash(alice["password_hash"], alice["hashing_algorithm"])
        self.assertTrue(u.checkPassword("alice-pw"))

    def test_invalid(self):
        """A hash of the wrong length, not base64, or an unknown algorithm is refused."""
        u = User("u", None)
        for h, alg in [("AAAA", None), ("%%", None), (self._hash(hashlib.md5, "x"), None),
                       (self._hash(hashlib.sha256, "x"), "rabbit_password_hashing_nope")]:
            self.assertRaises(ValueError, u.setPasswordHash, h, alg)

    def test_empty(self):
        """An empty hash means no password: nothing logs in."""
        u = User("u", "pw")
        u.setPasswordHash("")
        self.assertFalse(u.checkPassword(""))


class ImportTests(WebTestCase):
    """POST /api/definitions with RabbitMQ 3.10's exports."""

    def importWhole(self):
        return self.post("/api/definitions", fixture(WHOLE))

    def amqpLogin(self, user, password, vhost):
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), handshake=False)
        return not any(isinstance(m, spec.ConnectionClose) for _, m, _ in c.handshake(vhost, user, password))

    def test_whole(self):
        """The whole-broker export imports: users, vhost, permissions, policy, queues (the quorum one too), exchanges, bindings."""
        r = self.importWhole()
        self.assertEqual(r.code, 204)
        vh = self.broker.vhosts["defs-v"]
        self.assertEqual(sorted(vh.queues), ["defs-dlq", "defs-q", "defs-qq"])
        self.assertEqual(vh.queues["defs-qq"].queueType, "quorum")
        self.assertEqual(vh.queues["defs-q"].arguments,
                         {"x-dead-letter-exchange": "defs-ae", "x-message-ttl": 60000})
        self.assertEqual(vh.exchanges["defs-x"].arguments, {"alternate-exchange": "defs-ae"})
        self.assertEqual(vh.exchanges["defs-x"].type, "topic")
        self.assertEqual(self.broker.permissions[("defs-alice", "defs-v")], ("^a-", ".*", ".*"))
        self.assertEqual(self.broker.users["defs-bob"].tags, ["administrator", "monitoring"])
        self.assertEqual(vh.policies["defs-ttl"].definition, {"ha-mode": "all", "max-length": 100})
        bindings = {(b["source"], b["destination"], b["routing_key"])
                    for b in self.get("/api/bindings/defs-v").json() if b["source"]}
        self.assertEqual(bindings, {("defs-ae", "defs-dlq", ""), ("defs-x", "defs-q", "a.#"),
                                    ("defs-x", "defs-ae", "b.*")})

    def test_reported(self):
        """A queue of an unknown type is named in the 400 reason; quorum and stream ones import (3.10 export)."""
        self.addCleanup(self.broker.streams.close)
        r = self.post("/api/definitions", {"queues": [
            {"name": "s", "vhost": "/", "durable": True, "auto_delete": False,
             "arguments": {"x-queue-type": "stream", "x-max-age": "7D", "x-max-length-bytes": 20000000000,
                           "x-stream-max-segment-size-bytes": 100000000}},
            {"name": "o", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {"x-queue-type": "other"}},
            {"name": "qq", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {"x-queue-type": "quorum"}}]})
        self.assertEqual(r.json()["reason"], "queue 'o' in vhost '/' not imported: other queues are not supported")
        self.assertEqual(sorted(self.vh.queues), ["qq", "s"])
        self.assertEqual(self.vh.queues["s"].queueType, "stream")

    def test_limitsAndGlobalParameters(self):
        """The fixture's vhost limit and cluster_name are applied; internal_cluster_id is skipped."""
        self.importWhole()
        self.assertEqual(self.broker.vhosts["defs-v"].limits, {"max-connections": 10})
        self.assertEqual(self.get("/api/vhost-limits/defs-v").json(),
                         [{"vhost": "defs-v", "value": {"max-connections": 10}}])
        self.assertEqual(self.broker.globalParameters, {"cluster_name": "defs-cluster"})
        self.assertEqual(self.get("/api/overview").json()["cluster_name"], "defs-cluster")

    def test_userLimits(self):
        """A user's ``limits`` are set as PUT /api/user-limits does; an invalid one is reported."""
        r = self.post("/api/definitions", {"users": [
            {"name": "l", "password_hash": "", "tags": [], "limits": {"max-connections": 2, "max-channels": 5}},
            {"name": "m", "password_hash": "", "tags": [], "limits": {"max-queues": 1}}]})
        self.assertEqual(r.json()["reason"],
                         "user limit max-queues of 'm' not imported: Unrecognised terms [{<<\"max-queues\">>,1}]"
                         " in user-limits")
        self.assertEqual(self.get("/api/user-limits/l").json(),
                         [{"user": "l", "value": {"max-connections": 2, "max-channels": 5}}])
        self.assertNotIn("m", self.broker.userLimits)

    def test_vhostLimitsInvalid(self):
        """An invalid vhost-limits value, another component or a missing vhost is reported."""
        r = self.post("/api/definitions", {"parameters": [
            {"vhost": "/", "component": "vhost-limits", "name": "limits", "value": {"max-queues": "x"}},
            {"vhost": "/", "component": "federation-upstream", "name": "u", "value": {}},
            {"vhost": "nope", "component": "vhost-limits", "name": "limits", "value": {"max-queues": 1}}]})
        reason = r.json()["reason"].split("; ")
        self.assertEqual(len(reason), 3)
        self.assertTrue(reason[0].startswith("parameter vhost-limits/limits in vhost '/' not imported: "))
        self.assertIn("component federation-upstream is not supported", reason[1])
        self.assertIn("vhost_not_found", reason[2])
        self.assertIsNone(self.vh.limits)

    def test_operatorPolicies(self):
        """Operator policies, parameters of component operator_policy as RabbitMQ 3.10 exports them, are applied as PUT /api/operator-policies does; a non-operator key is reported."""
        r = self.post("/api/definitions", {"parameters": [
            {"vhost": "/", "component": "operator_policy", "name": "op",
             "value": {"pattern": "^q", "apply-to": "queues", "priority": 1, "definition": {"max-length": 3}}},
            {"vhost": "/", "component": "operator_policy", "name": "bad",
             "value": {"pattern": "^q", "apply-to": "queues", "priority": 0,
                       "definition": {"dead-letter-exchange": "x"}}}]})
        self.assertEqual(r.code, 400)
        self.assertIn("operator policy 'bad' in vhost '/' not imported: ", r.json()["reason"])
        self.assertEqual(self.get("/api/operator-policies/%2F").json(), [
            {"vhost": "/", "name": "op", "pattern": "^q", "apply-to": "queues", "definition": {"max-length": 3},
             "priority": 1}])

    def test_policyValidatedAsHTTP(self):
        """
        An imported policy is validated by the same function as PUT /api/policies: apply-to
        classic_queues (RabbitMQ 3.12's) is reported with the HTTP API's text and not applied.
        """
        r = self.post("/api/definitions", {"policies": [
            {"vhost": "/", "name": "p", "pattern": "^q", "apply-to": "classic_queues", "priority": 0,
             "definition": {"message-ttl": 5}}]})
        self.assertEqual(r.code, 400)
        self.assertIn("policy 'p' in vhost '/' not imported: apply-to 'classic_queues' unrecognised; "
                      "should be 'queues', 'exchanges' or 'all'", r.json()["reason"])
        self.assertEqual(self.get("/api/policies/%2F").json(), [])

    def test_loginAMQP(self):
        """defs-alice logs in over AMQP with alice-pw after the import, not with another password."""
        self.importWhole()
        self.assertTrue(self.amqpLogin("defs-alice", "alice-pw", "defs-v"))
        self.assertFalse(self.amqpLogin("defs-alice", "bob-pw", "defs-v"))

    def test_loginHTTP(self):
        """defs-bob (administrator) and defs-alice (management) log in over HTTP with their passwords."""
        self.importWhole()
        self.assertEqual(self.get("/api/overview", auth=("defs-bob", "bob-pw")).code, 200)
        self.assertEqual(self.get("/api/whoami", auth=("defs-alice", "alice-pw")).code, 200)
        self.assertEqual(self.get("/api/whoami", auth=("defs-alice", "x")).code, 401)

    def test_secondImportNoOp(self):
        """A second import changes nothing: no entity change is announced."""
        self.importWhole()
        changes = []
        self.broker.listeners.append(lambda *a: changes.append(a))
        self.assertEqual(self.importWhole().code, 204)
        self.assertEqual(changes, [])

    def test_secondImportNoOpLimits(self):
        """User limits, vhost limits, global parameters and operator policies: a second import announces nothing."""
        doc = {"users": [{"name": "l", "password_hash": "", "tags": [], "limits": {"max-channels": 3}}],
               "parameters": [{"vhost": "/", "component": "vhost-limits", "name": "limits",
                               "value": {"max-queues": 4}}],
               "global_parameters": [{"name": "cluster_name", "value": "c"}]}
        doc["parameters"].append({"vhost": "/", "component": "operator_policy", "name": "op", "value": {
            "pattern": ".*", "apply-to": "queues", "priority": 0, "definition": {"expires": 1000}}})
        self.assertEqual(self.post("/api/definitions", doc).code, 204)
        changes = []
        self.broker.listeners.append(lambda *a: changes.append(a))
        self.assertEqual(self.post("/api/definitions", doc).code, 204)
        self.assertEqual(changes, [])

    def test_perVHost(self):
        """The per-vhost export imports into another vhost name (its vhost limit too)."""
        self.put("/api/vhosts/other")
        r = self.post("/api/definitions/other", fixture(PER_VHOST))
        self.assertEqual(r.code, 204)
        vh = self.broker.vhosts["other"]
        self.assertEqual(vh.limits, {"max-connections": 10})
        self.assertEqual(sorted(vh.queues), ["defs-dlq", "defs-q", "defs-qq"])
        self.assertEqual(sorted(x for x in vh.exchanges if x.startswith("defs-")), ["defs-ae", "defs-x"])
        self.assertIn("defs-ttl", vh.policies)
        self.assertNotIn("defs-v", self.broker.vhosts)

    def test_perVHostWholeFile(self):
        """The whole-broker file posted to a vhost: its users, vhosts and permissions are reported, not applied."""
        reason = self.post("/api/definitions/%2F", fixture(WHOLE)).json()["reason"]
        self.assertIn("users (3) not imported: not part of a per-vhost import", reason)
        self.assertIn("permissions (3) not imported", reason)
        self.assertNotIn("defs-alice", self.broker.users)
        self.assertIn("defs-q", self.vh.queues)

    def test_perVHostMissing(self):
        """Import into a missing vhost: 404 vhost_not_found, as RabbitMQ 3.10."""
        self.assertError(self.post("/api/definitions/nope", {"queues": []}), 404, "not_found", "vhost_not_found")

    def test_clean(self):
        """A file otter_tx fully supports imports with 204."""
        self.assertEqual(self.post("/api/definitions", {"vhosts": [{"name": "w"}], "queues": [
            {"name": "q", "vhost": "w", "durable": True, "auto_delete": False, "arguments": {}}]}).code, 204)
        self.assertIn("q", self.broker.vhosts["w"].queues)

    def test_notJson(self):
        """A body that is not JSON: 400 failed_to_parse_json."""
        self.assertError(self.request("POST", "/api/definitions", raw=b"notjson"), 400, "bad_request",
                         "failed_to_parse_json")

    def test_invalidItem(self):
        """A failing item is reported with the broker's text and the other items are still applied."""
        r = self.post("/api/definitions", {"queues": [
            {"name": "a", "vhost": "/", "durable": True, "arguments": {"x-max-length": "x"}},
            {"name": "b", "vhost": "/", "durable": True, "arguments": {}}]})
        self.assertEqual(r.code, 400)
        self.assertIn("queue 'a' in vhost '/' not imported: PRECONDITION_FAILED", r.json()["reason"])
        self.assertEqual(sorted(self.vh.queues), ["b"])

    def test_otherReports(self):
        """Topic permissions, unknown permission users and dangling bindings are each named."""
        r = self.post("/api/definitions", {
            "users": [{"name": "l", "password_hash": "", "tags": [], "limits": {"max-connections": 1}}],
            "permissions": [{"user": "nobody", "vhost": "/", "configure": "", "write": "", "read": ""}],
            "topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": ".*",
                                   "read": ".*"}],
            "bindings": [{"source": "nox", "vhost": "/", "destination": "q", "destination_type": "queue",
                          "routing_key": "k", "arguments": {}}]})
        self.assertEqual(r.json()["reason"].split("; "), [
            "permissions of user 'nobody' in vhost '/' not imported: vhost_or_user_not_found",
            "topic permissions of user 'guest' in vhost '/' on exchange 'amq.topic' not imported: "
            "topic permissions are not supported",
            "binding from 'nox' to queue 'q' with key 'k' in vhost '/' not imported: "
            "source or destination not found",
        ])
        self.assertIn("l", self.broker.users)
        self.assertEqual(self.broker.userLimits["l"], {"max-connections": 1})

    def test_multipart(self):
        """The UI's multipart/form-data upload (field ``file``) imports too."""
        doc = json.dumps({"vhosts": [{"name": "mp"}]}).encode()
        body = (b"--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"d.json\"\r\n"
                b"Content-Type: application/json\r\n\r\n" + doc + b"\r\n--XX--\r\n")
        r = self.request("POST", "/api/definitions", raw=body,
                         headers={"content-type": "multipart/form-data; boundary=XX"})
        self.assertEqual(r.code, 204)
        self.assertIn("mp", self.broker.vhosts)

    def test_notAdmin(self):
        """Only administrators import."""
        self.broker.addUser("m", "m", tags=["management"])
        self.assertEqual(self.post("/api/definitions", {}, auth=("m", "m")).code, 401)


class ExportTests(WebTestCase):
    """GET /api/definitions round trips."""

    def test_fixtureShapes(self):
        """The vhost limit, user limits and cluster_name export in the shapes of RabbitMQ 3.10's export."""
        doc = fixture(WHOLE)
        self.post("/api/definitions", doc)
        exported = self.get("/api/definitions").json()
        self.assertEqual(sorted(exported), sorted(doc))
        self.assertEqual(exported["parameters"], doc["parameters"])
        self.assertEqual(exported["global_parameters"],
                         [p for p in doc["global_parameters"] if p["name"] != "internal_cluster_id"])
        users = {u["name"]: u for u in exported["users"]}
        for u in doc["users"]:
            self.assertEqual(users[u["name"]], u)
        self.assertEqual(self.get("/api/definitions/defs-v").json()["parameters"], doc["parameters"])

    def test_roundTripLimits(self):
        """User limits, vhost limits, global parameters and operator policies round-trip through an export."""
        self.put("/api/users/l", {"password": "pw", "tags": ""})
        self.put("/api/user-limits/l/max-channels", {"value": 7})
        self.put("/api/vhost-limits/%2F/max-queues", {"value": 9})
        self.put("/api/global-parameters/cluster_name", {"value": "rt"})
        self.put("/api/operator-policies/%2F/op", {"pattern": "^q", "definition": {"max-length": 2},
                                                   "apply-to": "queues", "priority": 3})
        exported = self.get("/api/definitions").json()
        self.assertEqual([u["limits"] for u in exported["users"] if u["name"] == "l"], [{"max-channels": 7}])
        self.assertEqual(exported["parameters"], [
            {"value": {"max-queues": 9}, "vhost": "/", "component": "vhost-limits", "name": "limits"},
            {"value": {"pattern": "^q", "apply-to": "queues", "definition": {"max-length": 2}, "priority": 3},
             "vhost": "/", "component": "operator_policy", "name": "op"}])
        self.assertEqual(exported["global_parameters"], [{"name": "cluster_name", "value": "rt"}])
        self.assertNotIn("operator_policies", exported)
        self.setUp()
        self.assertEqual(self.post("/api/definitions", exported).code, 204)
        self.assertEqual(self.get("/api/definitions").json(), exported)
        self.assertEqual(self.broker.userLimits["l"], {"max-channels": 7})
        self.assertEqual(self.vh.limits, {"max-queues": 9})
        self.assertIn("op", self.vh.operatorPolicies)

    def test_roundTrip(self):
        """An export imported into a fresh broker gives the same export (users keep their passwords)."""
        self.post("/api/definitions", fixture(WHOLE))
        self.broker.addUser("sha512", None)
        self.put("/api/users/sha512", {"password_hash": base64.b64encode(
            b"abcd" + hashlib.sha512(b"abcdpw").digest()).decode(),
            "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": "management"})
        exported = self.get("/api/definitions").json()
        self.assertEqual([u["hashing_algorithm"] for u in exported["users"] if u["name"] == "sha512"],
                         ["rabbit_password_hashing_sha512"])
        self.setUp()
        self.assertEqual(self.post("/api/definitions", exported).code, 204)
        self.assertEqual(self.get("/api/definitions").json(), exported)
        self.assertEqual(self.get("/api/whoami", auth=("sha512", "pw")).code, 200)

    def test_perVHost(self):
        """GET /api/definitions/{vhost} has the per-vhost form: no vhost fields on queues, exchanges, bindings."""
        self.post("/api/definitions", fixture(WHOLE))
        d = self.get("/api/definitions/defs-v").json()
        self.assertEqual(sorted(d), ["bindings", "exchanges", "parameters", "policies", "queues", "rabbit_version"])
        self.assertEqual(d["queues"][0], {"name": "defs-dlq", "durable": True, "auto_delete": False,
                                          "arguments": {}})
        self.assertNotIn("vhost", d["bindings"][0])


class DirectTests(SynchronousTestCase):
    """importDefinitions on a Broker, without HTTP."""

    def test_haWarning(self):
        """An ha-* policy key is accepted; a warning names the policy and the keys."""
        from twisted.internet.task import Clock

        from otter_tx.broker.broker import Broker

        broker = Broker(Clock())
        events = []
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        problems = importDefinitions(broker, {"policies": [
            {"vhost": "/", "name": "p", "pattern": ".*", "apply-to": "all", "priority": 0,
             "definition": {"ha-mode": "all"}}]})
        self.assertEqual(problems, [])
        self.assertIn("p", broker.vhosts["/"].policies)
        self.assertTrue(any("ha-mode" in str(e.get("keys")) for e in events))


class ImportDurabilityTests(SynchronousTestCase):
    """What an import creates survives a restart through the journal."""

    def test_restart(self):
        """Imported users (with their RabbitMQ hash and algorithm), permissions, queues and bindings survive a restart."""
        from twisted.internet.task import Clock

        from otter_tx.store.memory import MemoryStore
        from otter_tx.testing import journaledBroker

        clock, store = Clock(), MemoryStore()
        broker = journaledBroker(store, clock)
        doc = fixture(WHOLE)
        doc["users"].append({"name": "defs-md5", "hashing_algorithm": "rabbit_password_hashing_md5", "tags": [],
                             "password_hash": base64.b64encode(b"salt" + hashlib.md5(b"saltmd5-pw").digest()).decode()})
        importDefinitions(broker, doc)
        broker.stop()
        self.successResultOf(store.close())
        broker = journaledBroker(store, clock)
        self.assertIsNotNone(access.login(broker.users, "defs-alice", "alice-pw", None)[0])
        self.assertIsNotNone(access.login(broker.users, "defs-md5", "md5-pw", None)[0])
        self.assertEqual(broker.users["defs-md5"].hashingAlgorithm, "rabbit_password_hashing_md5")
        self.assertEqual(broker.permissions[("defs-alice", "defs-v")], ("^a-", ".*", ".*"))
        vh = broker.vhosts["defs-v"]
        self.assertEqual(sorted(vh.queues), ["defs-dlq", "defs-q", "defs-qq"])
        self.assertEqual(vh.queues["defs-qq"].queueType, "quorum")
        self.assertEqual(vh.limits, {"max-connections": 10})
        self.assertEqual(broker.globalParameters, {"cluster_name": "defs-cluster"})
        self.assertEqual(importDefinitions(broker, doc), [])
