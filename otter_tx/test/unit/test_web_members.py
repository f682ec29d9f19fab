"""
The quorum queue membership routes (otter_tx/web/management/members.py)
on a node without a cluster: RabbitMQ's answers for a node that is not in
the cluster, and the request checks every node makes.
"""

from otter_tx.test.unit.test_web import WebTestCase
from otter_tx.web import _format as fmt

QQ = {"durable": True, "arguments": {"x-queue-type": "quorum"}}


class SingleNodeMembersTests(WebTestCase):

    def setUp(self):
        WebTestCase.setUp(self)
        self.assertEqual(self.put("/api/queues/%2F/qq", QQ).code, 201)
        self.assertEqual(self.put("/api/queues/%2F/cq", {"durable": True}).code, 201)
        self.me = fmt.nodeName(self.broker)

    def test_addOtherNode(self):
        """Another node is not running here: 503 node_not_running; this node is a member already: 204."""
        self.assertError(self.post("/api/queues/quorum/%2F/qq/replicas/add", {"node": "rabbit@other"}),
                         503, "service_unavailable", "node_not_running")
        self.assertEqual(self.post("/api/queues/quorum/%2F/qq/replicas/add", {"node": self.me}).code, 204)

    def test_deleteMembers(self):
        """This node, the only member: 503 last_node; another node, not a member: 202 (idempotent)."""
        self.assertError(self.request("DELETE", "/api/queues/quorum/%2F/qq/replicas/delete", body={"node": self.me}),
                         503, "service_unavailable", "last_node")
        self.assertEqual(self.request("DELETE", "/api/queues/quorum/%2F/qq/replicas/delete",
                                      body={"node": "rabbit@other"}).code, 202)

    def test_requestChecks(self):
        """No node: 400 key_missing (before the type); a classic queue: 503; no queue or vhost: 404."""
        self.assertError(self.post("/api/queues/quorum/%2F/cq/replicas/add", {}), 400, "bad_request",
                         "[{key_missing,node}]")
        self.assertError(self.post("/api/queues/quorum/%2F/cq/replicas/add", {"node": self.me}), 503,
                         "service_unavailable", "classic_queue_not_supported")
        self.assertError(self.post("/api/queues/quorum/%2F/nope/replicas/add", {"node": self.me}), 404,
                         "Object Not Found", "Not Found")
        self.assertError(self.request("DELETE", "/api/queues/quorum/nope/qq/replicas/delete", body={"node": "x"}),
                         404, "Object Not Found", "Not Found")
        self.assertEqual(self.get("/api/queues/quorum/%2F/qq/replicas/add").code, 405)

    def test_growShrinkRebalance(self):
        """grow: a node not running 404, this node 204, a bad strategy or no pattern 400; shrink 202; rebalance 204."""
        grow = {"strategy": "all", "vhost_pattern": ".*", "queue_pattern": ".*"}
        self.assertError(self.post("/api/queues/quorum/replicas/on/rabbit@other/grow", grow), 404,
                         "Object Not Found", "Not Found")
        self.assertEqual(self.post("/api/queues/quorum/replicas/on/%s/grow" % (self.me,), grow).code, 204)
        self.assertError(self.post("/api/queues/quorum/replicas/on/%s/grow" % (self.me,), dict(grow, strategy="odd")),
                         400, "bad_request", "strategy must be one of all, even")
        self.assertError(self.post("/api/queues/quorum/replicas/on/%s/grow" % (self.me,), {"strategy": "all"}),
                         400, "bad_request", "[{key_missing,vhost_pattern}]")
        self.assertEqual(self.delete("/api/queues/quorum/replicas/on/rabbit@other/shrink").code, 202)
        self.assertEqual(self.post("/api/rebalance/queues").code, 204)

    def test_administratorOnly(self):
        """A management user without the administrator tag: 401 Not administrator user."""
        self.assertEqual(self.put("/api/users/mon", {"password": "pw", "tags": "monitoring"}).code, 201)
        self.assertEqual(self.put("/api/permissions/%2F/mon", {"configure": ".*", "write": ".*", "read": ".*"}).code,
                         201)
        reply = self.post("/api/queues/quorum/%2F/qq/replicas/add", {"node": "x"}, auth=("mon", "pw"))
        self.assertEqual((reply.code, reply.json()["error"]), (401, "not_authorised"))
        self.assertEqual(self.post("/api/rebalance/queues", auth=("mon", "pw")).code, 401)
