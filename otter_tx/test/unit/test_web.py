"""
Unit tests for the management HTTP app (otter_tx.web): treq's StubTreq drives
the Klein resource in memory over a Broker on a task.Clock.  Expected shapes,
status codes and texts were taken from RabbitMQ 3.10.8's management API
(../shared/reference/rabbitmq-semantics.md section 8, and curl probes of the
reference peer).
"""

import base64
import json

from treq.testing import StubTreq
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.test.unit.test_metrics import families, value
from otter_tx.testing import FakeClient
from otter_tx.web.management import ManagementApp
from otter_tx.web.metrics import PrometheusResource

BASE = "http://localhost:15672"
GUEST = ("guest", "guest")


class _Reply:
    def __init__(self, code, headers, body):
        self.code = code
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def header(self, name):
        v = self.headers.getRawHeaders(name)
        return (v[0].decode() if isinstance(v[0], bytes) else v[0]) if v else None


class WebTestCase(SynchronousTestCase):
    """A broker, a clock, the app and an in-memory HTTP client."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.mgmt = ManagementApp(self.broker, self.clock)
        self.http = StubTreq(self.mgmt.app.resource())

    def request(self, method, path, body=None, auth=GUEST, headers=None, raw=None):
        kw = {}
        if auth is not None:
            kw["auth"] = auth
        if body is not None:
            kw["json"] = body
        if raw is not None:
            kw["data"] = raw
        if headers:
            kw["headers"] = headers
        d = self.http.request(method, BASE + path, **kw)
        self.http.flush()
        resp = self.successResultOf(d)
        d2 = resp.content()
        self.http.flush()
        return _Reply(resp.code, resp.headers, self.successResultOf(d2).decode("utf-8"))

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body=body if body is not None else {}, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body if body is not None else {}, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    def assertError(self, reply, code, error, reason):
        self.assertEqual((reply.code, reply.json()), (code, {"error": error, "reason": reason}))

    def publish(self, queue, body=b"x", props=None):
        from otter_tx.amqp.codec import encodeProperties
        from otter_tx.broker.message import Message

        props = props or {}
        m = Message("", queue, encodeProperties(props), body, props)
        return self.vh.publish(self.vh.exchanges[""], m)


class RoomsTests(WebTestCase):
    """The root mounts one Klein app per resource family and sends each path to the room that has its route."""

    def test_everyRouteReachesItsRoom(self):
        """Every route of every room is reached through the root (roomFor), and no route is in two rooms."""
        import re

        from otter_tx.web.management import roomFor

        seen = {}
        for cls, room in self.mgmt.rooms.items():
            for rule in room.app.url_map.iter_rules():
                path = re.sub(r"<[^>]+>", "x", rule.rule)
                self.assertNotIn(rule.rule, seen, "%s in %s and %s" % (rule.rule, cls, seen.get(rule.rule)))
                seen[rule.rule] = cls
                self.assertIs(roomFor(path.encode().split(b"/")[1:]), cls, rule.rule)
        self.assertGreater(len(seen), 80)

    def test_trailingSlash(self):
        """
        One trailing slash names the same resource, for every method, as RabbitMQ's router
        (rabbitmq-stream-js-client's suite lists /api/stream/consumers/%2F/).
        """
        self.assertEqual(self.put("/api/queues/%2F/q/", {"durable": True}).code, 201)
        self.assertIn("q", self.vh.queues)
        for path in ("/api/overview", "/api/queues", "/api/queues/%2F", "/api/exchanges/%2F/amq.direct",
                     "/api/consumers/%2F", "/api/stream/consumers/%2F", "/api/stream/publishers/%2F",
                     "/api/stream/connections/%2F", "/api/vhosts/%2F/connections"):
            plain, slash = self.get(path), self.get(path + "/")
            self.assertEqual((slash.code, slash.json()), (plain.code, plain.json()), path)
            self.assertEqual(plain.code, 200, path)
        self.assertEqual([q["name"] for q in self.get("/api/queues/%2F/").json()], ["q"])
        self.assertEqual(self.delete("/api/queues/%2F/q/").code, 204)
        self.assertNotIn("q", self.vh.queues)

    def test_unknownPaths(self):
        """A path no room has is 404 Object Not Found, under /api and outside it."""
        for path in ("/api/nothing", "/api/queues/%2F/q/nothing", "/api/vhosts/%2F/nothing", "/nothing"):
            self.assertError(self.get(path), 404, "Object Not Found", "Not Found")


class AuthTests(WebTestCase):
    """HTTP Basic authentication and tag checks."""

    def test_noCredentials(self):
        """A request without credentials gets 401 with an empty body and a Basic challenge."""
        r = self.get("/api/overview", auth=None)
        self.assertEqual((r.code, r.body), (401, ""))
        self.assertEqual(r.header("www-authenticate"), 'Basic realm="RabbitMQ Management"')

    def test_wrongPassword(self):
        """A wrong password gets 401 not_authorized / Login failed."""
        self.assertError(self.get("/api/overview", auth=("guest", "nope")), 401, "not_authorized", "Login failed")

    def test_unknownUser(self):
        """An unknown user gets 401 not_authorized / Login failed."""
        self.assertError(self.get("/api/queues", auth=("who", "x")), 401, "not_authorized", "Login failed")

    def test_notManagementUser(self):
        """A user without a management tag gets 401 Not management user."""
        self.broker.addUser("plain", "pw", [])
        self.assertError(self.get("/api/overview", auth=("plain", "pw")), 401, "not_authorised",
                         "Not management user")

    def test_notAdministrator(self):
        """A management user gets 401 Not administrator user on /api/users."""
        self.broker.addUser("mon", "pw", ["management"])
        self.assertError(self.get("/api/users", auth=("mon", "pw")), 401, "not_authorised",
                         "Not administrator user")

    def test_vhostAccess(self):
        """A management user without permissions on a vhost gets 401 on its queues."""
        self.broker.addUser("mon", "pw", ["management"])
        self.assertError(self.get("/api/queues/%2F", auth=("mon", "pw")), 401, "not_authorised",
                         "User not authorised to access virtual host")

    def test_managementUserListsOwnVHosts(self):
        """A management user with permissions sees that vhost's queues."""
        self.broker.addUser("mon", "pw", ["management"])
        self.broker.setPermissions("mon", "/")
        self.put("/api/queues/%2F/q1")
        r = self.get("/api/queues", auth=("mon", "pw"))
        self.assertEqual([q["name"] for q in r.json()], ["q1"])

    def test_managementUserCannotSetPolicy(self):
        """A management user (not policymaker) may not create policies."""
        self.broker.addUser("mon", "pw", ["management"])
        self.broker.setPermissions("mon", "/")
        r = self.put("/api/policies/%2F/p", {"pattern": "x", "definition": {"message-ttl": 1}}, auth=("mon", "pw"))
        self.assertError(r, 401, "not_authorised", "User not authorised to access object")

    def test_whoami(self):
        """whoami returns the user's name and tags list."""
        self.assertEqual(self.get("/api/whoami").json(), {"name": "guest", "tags": ["administrator"]})


class AuthorisationTests(WebTestCase):
    """
    Per-endpoint checks as RabbitMQ 3.10's is_authorized_* and per-resource
    permissions (the interop table in test_interop_http_authz covers every
    tag against both brokers; these pin the main rows in memory).
    """

    def setUp(self):
        WebTestCase.setUp(self)
        for name, tag in (("mgmt", "management"), ("pol", "policymaker"), ("mon", "monitoring")):
            self.broker.addUser(name, "pw", [tag])
            self.broker.setPermissions(name, "/", "^c-", "^w-", "^r-")
        self.broker.addVHost("other")
        for q in ("c-q", "w-q", "r-q"):
            self.put("/api/queues/%2F/" + q)
        for x in ("w-x", "r-x"):
            self.put("/api/exchanges/%2F/" + x, {"type": "fanout"})

    def client(self, user):
        """An in-memory AMQP connection of ``user`` (password pw, or guest) and its name."""
        from urllib.parse import quote

        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), user=user,
                       password="guest" if user == "guest" else "pw")
        c.received()
        [conn] = self.get("/api/connections").json()
        return c, "/api/connections/" + quote(conn["name"], safe="")

    def closes(self, client):
        return [(m.reply_code, m.reply_text) for m in client.methods() if isinstance(m, spec.ConnectionClose)]

    def test_monitoringCannotCloseAnothersConnection(self):
        """A monitoring user sees another user's connection but DELETE is 401 and sends no connection.close."""
        c, path = self.client("guest")
        self.assertEqual(self.get(path, auth=("mon", "pw")).code, 200)
        self.assertError(self.delete(path, auth=("mon", "pw")), 401, "not_authorised",
                         "User not authorised to access object")
        self.assertEqual(self.closes(c), [])

    def test_monitoringClosesItsOwnConnection(self):
        """A monitoring user's DELETE of its own connection closes it with 320."""
        c, path = self.client("mon")
        self.assertEqual(self.delete(path, auth=("mon", "pw")).code, 204)
        self.assertEqual(self.closes(c), [(320, "CONNECTION_FORCED - Closed via management plugin")])

    def test_managementSeesOnlyItsOwnConnections(self):
        """A management user neither lists nor reads another user's connection (401 on the object)."""
        c, path = self.client("guest")
        self.assertEqual(self.get("/api/connections", auth=("mgmt", "pw")).json(), [])
        self.assertEqual(self.get("/api/channels", auth=("mgmt", "pw")).json(), [])
        self.assertError(self.get(path, auth=("mgmt", "pw")), 401, "not_authorised",
                         "User not authorised to access object")
        self.assertError(self.delete(path, auth=("mgmt", "pw")), 401, "not_authorised",
                         "User not authorised to access object")
        self.assertEqual(self.closes(c), [])

    def test_purgeNeedsRead(self):
        """Purge needs read permission on the queue: 401 Access refused. and the messages stay."""
        self.publish("c-q")
        self.assertError(self.delete("/api/queues/%2F/c-q/contents", auth=("mgmt", "pw")), 401, "not_authorised",
                         "Access refused.")
        self.assertEqual(self.vh.queues["c-q"].readyCount, 1)
        self.publish("r-q")
        self.assertEqual(self.delete("/api/queues/%2F/r-q/contents", auth=("mgmt", "pw")).code, 204)
        self.assertEqual(self.vh.queues["r-q"].readyCount, 0)

    def test_getNeedsRead(self):
        """/get needs read permission: 401 with the AMQP refusal text, and the message stays."""
        self.publish("w-q")
        r = self.post("/api/queues/%2F/w-q/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
                      auth=("mgmt", "pw"))
        self.assertError(r, 401, "not_authorised",
                         "ACCESS_REFUSED - access to queue 'w-q' in vhost '/' refused for user 'mgmt'")
        self.assertEqual(self.vh.queues["w-q"].readyCount, 1)

    def test_publishNeedsWrite(self):
        """Publishing needs write permission on the exchange (the default one is amq.default): 400 with the 403."""
        body = {"routing_key": "r-q", "properties": {}, "payload": "x", "payload_encoding": "string"}
        for x in ("r-x", "amq.default"):
            self.assertError(self.post("/api/exchanges/%2F/" + x + "/publish", body, auth=("mgmt", "pw")), 400,
                             "bad_request",
                             "403 ACCESS_REFUSED - access to exchange '%s' in vhost '/' refused for user 'mgmt'" % (x,))
        self.assertEqual(self.vh.queues["r-q"].readyCount, 0)
        self.assertEqual(self.post("/api/exchanges/%2F/w-x/publish", body, auth=("mgmt", "pw")).json(),
                         {"routed": False})

    def test_declareDeleteNeedConfigure(self):
        """Declaring or deleting a queue or exchange needs configure permission: 401 Access refused."""
        for method, path in (("PUT", "/api/queues/%2F/w-new"), ("DELETE", "/api/queues/%2F/w-q"),
                             ("PUT", "/api/exchanges/%2F/w-newx"), ("DELETE", "/api/exchanges/%2F/w-x")):
            r = self.request(method, path, body={} if method == "PUT" else None, auth=("mgmt", "pw"))
            self.assertError(r, 401, "not_authorised", "Access refused.")
        self.assertNotIn("w-new", self.vh.queues)
        self.assertIn("w-q", self.vh.queues)
        self.assertEqual(self.put("/api/queues/%2F/c-new", auth=("mgmt", "pw")).code, 201)

    def test_bindNeedsWriteOnDestinationReadOnSource(self):
        """A binding needs write on its destination and read on its source exchange."""
        self.assertEqual(self.post("/api/bindings/%2F/e/r-x/q/w-q", {"routing_key": "k"}, auth=("mgmt", "pw")).code,
                         201)
        self.assertError(self.post("/api/bindings/%2F/e/w-x/q/r-q", {"routing_key": "k"}, auth=("mgmt", "pw")),
                         401, "not_authorised", "Access refused.")
        self.assertError(self.post("/api/bindings/%2F/e/r-x/e/r-x", {}, auth=("mgmt", "pw")),
                         401, "not_authorised", "Access refused.")
        self.assertEqual(self.post("/api/bindings/%2F/e/w-x/q/r-q", {"routing_key": "k"}).code, 201)
        self.assertError(self.delete("/api/bindings/%2F/e/w-x/q/r-q/k", auth=("mgmt", "pw")),
                         401, "not_authorised", "Access refused.")
        self.assertEqual(self.delete("/api/bindings/%2F/e/r-x/q/w-q/k", auth=("mgmt", "pw")).code, 204)

    def test_monitoringReadsOnlyItsVHostsObjects(self):
        """A monitoring user lists every vhost but gets 401 on the objects of one it has no permissions on."""
        self.assertEqual([v["name"] for v in self.get("/api/vhosts", auth=("mon", "pw")).json()], ["/", "other"])
        self.assertEqual([v["name"] for v in self.get("/api/vhosts", auth=("mgmt", "pw")).json()], ["/"])
        self.assertError(self.get("/api/queues/other", auth=("mon", "pw")), 401, "not_authorised",
                         "User not authorised to access virtual host")
        self.assertEqual({q["vhost"] for q in self.get("/api/queues", auth=("mon", "pw")).json()}, {"/"})

    def test_vhostIsAdminOnly(self):
        """GET /api/vhosts/{v} is for administrators only, as in 3.10."""
        self.assertError(self.get("/api/vhosts/%2F", auth=("mon", "pw")), 401, "not_authorised",
                         "Not administrator user")

    def test_monitorLevel(self):
        """The MONITOR level answers 401 Not monitor user to management and policymaker users."""
        from otter_tx.web.management.authz import MONITOR

        self.assertError(self._authorise("mgmt", MONITOR), 401, "not_authorised", "Not monitor user")
        self.assertEqual(self._authorise("mon", MONITOR), "mon")

    def _authorise(self, user, access):
        """The user name ``authenticate`` returns for ``access``, or the HTTPError as a reply."""
        from otter_tx.web.management.authz import authenticate
        from otter_tx.web.management.http import HTTPError

        class Req:
            def getHeader(self, name):
                return b"Basic " + base64.b64encode(("%s:pw" % (user,)).encode())

            def getClientAddress(self):
                return IPv4Address("TCP", "127.0.0.1", 40000)

        try:
            return authenticate(self.broker, Req(), access).name
        except HTTPError as e:
            return _Reply(e.code, None, json.dumps({"error": e.error, "reason": e.reason}))

    def test_policies(self):
        """Every tag lists a vhost's policies; reading or changing one needs policymaker."""
        self.put("/api/policies/%2F/p", {"pattern": "^zz", "definition": {"max-length": 1}})
        for user in ("mgmt", "mon", "pol"):
            self.assertEqual([p["name"] for p in self.get("/api/policies", auth=(user, "pw")).json()], ["p"])
        for user in ("mgmt", "mon"):
            self.assertError(self.get("/api/policies/%2F/p", auth=(user, "pw")), 401, "not_authorised",
                             "User not authorised to access object")
        self.assertEqual(self.get("/api/policies/%2F/p", auth=("pol", "pw")).code, 200)
        self.assertError(self.put("/api/policies/other/p", {"pattern": "x", "definition": {"max-length": 1}},
                                  auth=("pol", "pw")), 401, "not_authorised", "User not authorised to access object")


class RoutingTests(WebTestCase):
    """Generic HTTP behaviour: unknown paths, methods, HEAD, list parameters."""

    def test_unknownPath(self):
        """An unknown path is 404 Object Not Found."""
        self.assertError(self.get("/api/nothing"), 404, "Object Not Found", "Not Found")

    def test_methodNotAllowed(self):
        """An unsupported method is 405 with an allow header and no body."""
        r = self.post("/api/policies/%2F/p")
        self.assertEqual((r.code, r.body), (405, ""))
        self.assertIn("PUT", r.header("allow"))

    def test_head(self):
        """HEAD on a GET endpoint answers 200 without a body."""
        r = self.request("HEAD", "/api/queues")
        self.assertEqual((r.code, r.body), (200, ""))

    def test_emptySortAccepted(self):
        """An empty sort= parameter is accepted."""
        self.assertEqual(self.get("/api/queues?sort=").code, 200)

    def test_columnsAndSort(self):
        """columns selects fields and sort/sort_reverse orders the list."""
        for n in ("b", "a", "c"):
            self.put("/api/queues/%2F/" + n)
        r = self.get("/api/queues?columns=name,vhost&sort=name&sort_reverse=true")
        self.assertEqual(r.json(), [{"name": n, "vhost": "/"} for n in ("c", "b", "a")])

    def test_pagination(self):
        """page/page_size wrap the list; name filters only with page."""
        for n in ("q1", "q2", "x3"):
            self.put("/api/queues/%2F/" + n)
        r = self.get("/api/queues?page=1&page_size=1&name=q&columns=name")
        self.assertEqual(r.json(), {"filtered_count": 2, "item_count": 1, "items": [{"name": "q1"}],
                                    "page": 1, "page_count": 2, "page_size": 1, "total_count": 3})

    def test_nameFilterIgnoresCase(self):
        """name matches ignoring case, as a substring or (use_regex=true) a regex, as RabbitMQ's filter."""
        for n in ("Orders.in", "orders.out", "work"):
            self.put("/api/queues/%2F/" + n)
        for q in ("name=ORDERS", "name=%5Eorders%5C.&use_regex=true"):
            r = self.get("/api/queues?page=1&page_size=10&columns=name&" + q)
            self.assertEqual([i["name"] for i in r.json()["items"]], ["Orders.in", "orders.out"], q)

    def test_badPagination(self):
        """page_size over 500 is 400 invalid_pagination_parameters."""
        self.assertError(self.get("/api/queues?page=1&page_size=501"), 400, "invalid_pagination_parameters",
                         "Invalid pagination parameters: page number 1, page size 501")

    def test_badJson(self):
        """A body that is not JSON is 400 not_json."""
        r = self.request("PUT", "/api/policies/%2F/p", raw=b"{bad", headers={"content-type": ["application/json"]})
        self.assertError(r, 400, "bad_request", "not_json")


class PolicyTests(WebTestCase):
    """/api/policies."""

    def test_createUpdateDelete(self):
        """PUT creates (201), PUT again updates (204), DELETE removes (204), then 404."""
        body = {"pattern": "^ttl\\.", "definition": {"message-ttl": 5000}, "priority": 1, "apply-to": "queues"}
        self.assertEqual(self.put("/api/policies/%2F/p1", body).code, 201)
        self.assertEqual(self.put("/api/policies/%2F/p1", body).code, 204)
        self.assertEqual(self.get("/api/policies/%2F/p1").json(), {
            "vhost": "/", "name": "p1", "pattern": "^ttl\\.", "apply-to": "queues",
            "definition": {"message-ttl": 5000}, "priority": 1})
        self.assertEqual(self.delete("/api/policies/%2F/p1").code, 204)
        self.assertError(self.delete("/api/policies/%2F/p1"), 404, "Object Not Found", "Not Found")
        self.assertError(self.get("/api/policies/%2F/p1"), 404, "Object Not Found", "Not Found")

    def test_lists(self):
        """/api/policies and /api/policies/{vhost} list policies."""
        self.put("/api/policies/%2F/p1", {"pattern": "x", "definition": {"expires": 100}})
        expected = [{"vhost": "/", "name": "p1", "pattern": "x", "apply-to": "all",
                     "definition": {"expires": 100}, "priority": 0}]
        self.assertEqual(self.get("/api/policies").json(), expected)
        self.assertEqual(self.get("/api/policies/%2F").json(), expected)

    def test_appliesToQueue(self):
        """A policy set over HTTP becomes the queue's effective policy."""
        self.put("/api/queues/%2F/dl.q")
        self.put("/api/policies/%2F/dl", {"pattern": "^dl\\.", "definition": {
            "dead-letter-exchange": "dlx", "max-length": 3}})
        q = self.get("/api/queues/%2F/dl.q").json()
        self.assertEqual((q["policy"], q["effective_policy_definition"]),
                         ("dl", {"dead-letter-exchange": "dlx", "max-length": 3}))
        self.assertEqual(self.vh.queues["dl.q"].settings.maxLength, 3)

    def test_invalidMessageTtl(self):
        """A negative message-ttl is 400 Validation failed with RabbitMQ's text."""
        r = self.put("/api/policies/%2F/p", {"pattern": ".*", "definition": {"message-ttl": -5}})
        self.assertError(r, 400, "bad_request", "Validation failed\n\n-5 is not a valid message TTL\n")

    def test_invalidExpires(self):
        """expires 0 is 400 with 'is not a valid queue expiry'."""
        r = self.put("/api/policies/%2F/p", {"pattern": ".*", "definition": {"expires": 0}})
        self.assertError(r, 400, "bad_request", "Validation failed\n\n0 is not a valid queue expiry\n")

    def test_unknownKeyEscaped(self):
        """An unknown key is rejected with the HTML-escaped Erlang term, as 3.10 does."""
        r = self.put("/api/policies/%2F/p", {"pattern": "x", "definition": {"x-message-ttl": 5}})
        self.assertError(r, 400, "bad_request", 'Validation failed\n\n[{&lt;&lt;"x-message-ttl"&gt;&gt;,5}] '
                                                "are not recognised policy settings\n")

    def test_emptyDefinition(self):
        """An empty definition is 400 'no policy provided'."""
        r = self.put("/api/policies/%2F/p", {"pattern": "x", "definition": {}})
        self.assertError(r, 400, "bad_request", "Validation failed\n\nno policy provided\n")

    def test_missingPattern(self):
        """A body without pattern is 400 [{key_missing,pattern}]."""
        r = self.put("/api/policies/%2F/p", {"definition": {"message-ttl": 5}})
        self.assertError(r, 400, "bad_request", "[{key_missing,pattern}]")

    def test_badApplyTo(self):
        """An unknown apply-to is 400 with RabbitMQ's text."""
        r = self.put("/api/policies/%2F/p", {"pattern": "x", "definition": {"message-ttl": 5}, "apply-to": "foo"})
        self.assertError(r, 400, "bad_request", "Validation failed\n\napply-to 'foo' unrecognised; "
                                                "should be 'queues', 'exchanges' or 'all'\n")

    def test_badPriority(self):
        """A string priority is 400 'priority should be a number'."""
        r = self.put("/api/policies/%2F/p", {"pattern": "x", "definition": {"message-ttl": 5}, "priority": "3"})
        self.assertError(r, 400, "bad_request",
                         'Validation failed\n\npriority should be a number, actually was &lt;&lt;"3"&gt;&gt;\n')

    def test_unknownVHost(self):
        """PUT in a missing vhost is 404 not_found / vhost_not_found."""
        r = self.put("/api/policies/nope/p", {"pattern": "x", "definition": {"message-ttl": 5}})
        self.assertError(r, 404, "not_found", "vhost_not_found")


class QueueTests(WebTestCase):
    """/api/queues."""

    def test_declareAndShape(self):
        """PUT declares (201, then 204) and GET shows RabbitMQ's fields."""
        body = {"durable": True, "auto_delete": False, "arguments": {"x-message-ttl": 60000}}
        self.assertEqual(self.put("/api/queues/%2F/q1", body).code, 201)
        self.assertEqual(self.put("/api/queues/%2F/q1", body).code, 204)
        self.publish("q1", b"hello")
        q = self.get("/api/queues/%2F/q1").json()
        sub = {k: q[k] for k in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "messages",
                                 "messages_ready", "messages_unacknowledged", "message_bytes",
                                 "message_bytes_ready", "consumers", "policy", "effective_policy_definition",
                                 "state", "type", "single_active_consumer_tag", "consumer_details")}
        self.assertEqual(sub, {
            "name": "q1", "vhost": "/", "durable": True, "auto_delete": False, "exclusive": False,
            "arguments": {"x-message-ttl": 60000}, "messages": 1, "messages_ready": 1,
            "messages_unacknowledged": 0, "message_bytes": 5, "message_bytes_ready": 5, "consumers": 0,
            "policy": None, "effective_policy_definition": {}, "state": "running", "type": "classic",
            "single_active_consumer_tag": None, "consumer_details": []})

    def test_nameWithSlash(self):
        """Percent-encoded names (a slash, a percent sign, a space) round-trip."""
        self.assertEqual(self.put("/api/queues/%2F/a%2Fb%25c%20d").code, 201)
        self.assertIn("a/b%c d", self.vh.queues)
        self.assertEqual(self.get("/api/queues/%2F/a%2Fb%25c%20d").json()["name"], "a/b%c d")

    def test_inequivalent(self):
        """PUT with different arguments is 400 with the AMQP text minus its prefix."""
        self.put("/api/queues/%2F/q1", {"arguments": {"x-message-ttl": 60000}})
        r = self.put("/api/queues/%2F/q1", {"arguments": {"x-message-ttl": 1000}})
        self.assertError(r, 400, "bad_request", "inequivalent arg 'x-message-ttl' for queue 'q1' in vhost '/': "
                                                "received '1000' but current is '60000'")

    def test_inequivalentDurable(self):
        """PUT with a different durable flag is 400 inequivalent arg 'durable'."""
        self.put("/api/queues/%2F/q1")
        r = self.put("/api/queues/%2F/q1", {"durable": True})
        self.assertError(r, 400, "bad_request", "inequivalent arg 'durable' for queue 'q1' in vhost '/': "
                                                "received 'true' but current is 'false'")

    def test_invalidArgument(self):
        """An invalid argument is 400 invalid arg ... {value_negative,-1}."""
        r = self.put("/api/queues/%2F/q3", {"arguments": {"x-message-ttl": -1}})
        self.assertError(r, 400, "bad_request", "invalid arg 'x-message-ttl' for queue 'q3' in vhost '/': "
                                                "{value_negative,-1}")

    def test_reservedName(self):
        """An amq. queue name is 401 Access refused."""
        self.assertError(self.put("/api/queues/%2F/amq.foo"), 401, "not_authorised", "Access refused.")

    def test_missing(self):
        """GET and DELETE of a missing queue are 404."""
        self.assertError(self.get("/api/queues/%2F/nope"), 404, "Object Not Found", "Not Found")
        self.assertError(self.delete("/api/queues/%2F/nope"), 404, "Object Not Found", "Not Found")

    def test_missingVHost(self):
        """Listing the queues of a missing vhost is 404."""
        self.assertError(self.get("/api/queues/nosuch"), 404, "Object Not Found", "Not Found")

    def test_deleteIfEmpty(self):
        """DELETE ?if-empty=true on a queue with messages is 400 ... not empty; plain DELETE is 204."""
        self.put("/api/queues/%2F/q1")
        self.publish("q1")
        self.assertError(self.delete("/api/queues/%2F/q1?if-empty=true"), 400, "bad_request",
                         "queue 'q1' in vhost '/' not empty")
        self.assertEqual(self.delete("/api/queues/%2F/q1").code, 204)
        self.assertNotIn("q1", self.vh.queues)

    def test_purge(self):
        """DELETE .../contents purges (204)."""
        self.put("/api/queues/%2F/q1")
        self.publish("q1")
        self.publish("q1")
        self.assertEqual(self.delete("/api/queues/%2F/q1/contents").code, 204)
        self.assertEqual(self.vh.queues["q1"].readyCount, 0)

    def test_getRequeue(self):
        """get with ack_requeue_true returns the messages and leaves them, redelivered, in the queue."""
        self.put("/api/queues/%2F/q1")
        self.publish("q1", b"hello")
        self.publish("q1", b"hi", {"content_type": "text/plain", "headers": {"a": 1}, "delivery_mode": 2})
        body = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 50000}
        r = self.post("/api/queues/%2F/q1/get", body)
        self.assertEqual(r.json(), [
            {"payload_bytes": 5, "redelivered": False, "exchange": "", "routing_key": "q1", "message_count": 1,
             "properties": [], "payload": "hello", "payload_encoding": "string"},
            {"payload_bytes": 2, "redelivered": False, "exchange": "", "routing_key": "q1", "message_count": 0,
             "properties": {"content_type": "text/plain", "headers": {"a": 1}, "delivery_mode": 2},
             "payload": "hi", "payload_encoding": "string"}])
        r = self.post("/api/queues/%2F/q1/get", dict(body, count=1, truncate=3))
        self.assertEqual((r.json()[0]["redelivered"], r.json()[0]["payload"]), (True, "hel"))
        self.assertEqual(self.vh.queues["q1"].readyCount, 2)

    def test_getAckRemoves(self):
        """get with ack_requeue_false removes the message."""
        self.put("/api/queues/%2F/q1")
        self.publish("q1")
        self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        self.assertEqual((self.vh.queues["q1"].readyCount, self.vh.queues["q1"].unackedCount), (0, 0))

    def test_getRejectDeadLetters(self):
        """get with reject_requeue_false dead-letters with reason rejected."""
        self.put("/api/queues/%2F/dlq")
        self.put("/api/queues/%2F/q1", {"arguments": {"x-dead-letter-exchange": "",
                                                      "x-dead-letter-routing-key": "dlq"}})
        self.publish("q1")
        self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"})
        self.assertEqual((self.vh.queues["q1"].readyCount, self.vh.queues["dlq"].readyCount), (0, 1))
        self.assertEqual(self.vh.deadLettered["rejected"], 1)

    def test_getBase64(self):
        """encoding base64 and binary payloads under auto come back base64-encoded."""
        self.put("/api/queues/%2F/q1")
        self.publish("q1", b"\xff")
        r = self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        self.assertEqual((r.json()[0]["payload"], r.json()[0]["payload_encoding"]), ("/w==", "base64"))

    def test_getBadEncoding(self):
        """An unknown encoding is 400 with RabbitMQ's text."""
        self.put("/api/queues/%2F/q1")
        r = self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "zz"})
        self.assertError(r, 400, "bad_request", "Unsupported encoding. Please use auto or base64.")

    def test_getMissingEncoding(self):
        """A get body without encoding is 400 [{key_missing,encoding}]."""
        self.put("/api/queues/%2F/q1")
        r = self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "ack_requeue_true"})
        self.assertError(r, 400, "bad_request", "[{key_missing,encoding}]")

    def test_getBadAckmode(self):
        """An unknown ackmode is 400 (RabbitMQ 3.10 answers 500)."""
        self.put("/api/queues/%2F/q1")
        r = self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "bogus", "encoding": "auto"})
        self.assertEqual(r.code, 400)

    def test_getMissingQueue(self):
        """get from a missing queue is 404 not_found with the AMQP text."""
        r = self.post("/api/queues/%2F/nope/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        self.assertError(r, 404, "not_found", "NOT_FOUND - no queue 'nope' in vhost '/'")

    def test_queueBindings(self):
        """A queue's bindings start with the implicit default-exchange binding."""
        self.put("/api/queues/%2F/q1")
        self.assertEqual(self.get("/api/queues/%2F/q1/bindings").json(), [
            {"source": "", "vhost": "/", "destination": "q1", "destination_type": "queue",
             "routing_key": "q1", "arguments": {}, "properties_key": "q1"}])


class ExchangeTests(WebTestCase):
    """/api/exchanges and publishing."""

    def test_declareAndShape(self):
        """PUT declares (201, 204) and GET shows name, type, flags, arguments."""
        self.assertEqual(self.put("/api/exchanges/%2F/x1", {"type": "topic"}).code, 201)
        self.assertEqual(self.put("/api/exchanges/%2F/x1", {"type": "topic"}).code, 204)
        x = self.get("/api/exchanges/%2F/x1").json()
        self.assertEqual({k: x[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal",
                                            "arguments")},
                         {"name": "x1", "vhost": "/", "type": "topic", "durable": False, "auto_delete": False,
                          "internal": False, "arguments": {}})

    def test_defaultTypeDirect(self):
        """PUT without a type declares a direct exchange."""
        self.put("/api/exchanges/%2F/x1")
        self.assertEqual(self.vh.exchanges["x1"].type, "direct")

    def test_inequivalentType(self):
        """Redeclaring with another type is 400 inequivalent arg 'type'."""
        self.put("/api/exchanges/%2F/x1", {"type": "topic"})
        self.assertError(self.put("/api/exchanges/%2F/x1", {"type": "direct"}), 400, "bad_request",
                         "inequivalent arg 'type' for exchange 'x1' in vhost '/': received 'direct' but current "
                         "is 'topic'")

    def test_unknownType(self):
        """An unknown type is 400 unknown exchange type."""
        self.assertError(self.put("/api/exchanges/%2F/x2", {"type": "bogus"}), 400, "bad_request",
                         "unknown exchange type 'bogus'")

    def test_reserved(self):
        """Declaring amq.* or deleting amq.direct is 401 Access refused."""
        self.assertError(self.put("/api/exchanges/%2F/amq.foo", {"type": "direct"}), 401, "not_authorised",
                         "Access refused.")
        self.assertError(self.delete("/api/exchanges/%2F/amq.direct"), 401, "not_authorised", "Access refused.")

    def test_list(self):
        """The list has the default exchange named "" and the amq.* exchanges (the tracer's too, as RabbitMQ)."""
        names = [x["name"] for x in self.get("/api/exchanges/%2F").json()]
        self.assertEqual(names, ["", "amq.direct", "amq.fanout", "amq.headers", "amq.match",
                                 "amq.rabbitmq.trace", "amq.topic"])

    def test_delayed(self):
        """An x-delayed-message exchange reports messages_delayed."""
        self.put("/api/exchanges/%2F/dx", {"type": "x-delayed-message", "arguments": {"x-delayed-type": "direct"}})
        self.post("/api/exchanges/%2F/dx/publish", {"properties": {"headers": {"x-delay": 5000}},
                                                    "routing_key": "k", "payload": "p",
                                                    "payload_encoding": "string"})
        x = self.get("/api/exchanges/%2F/dx").json()
        self.assertEqual((x["type"], x["messages_delayed"]), ("x-delayed-message", 1))

    def test_deleteIfUnused(self):
        """DELETE ?if-unused=true of a bound exchange is 400 in use; DELETE is 204 then 404."""
        self.put("/api/exchanges/%2F/x1")
        self.put("/api/queues/%2F/q1")
        self.post("/api/bindings/%2F/e/x1/q/q1", {"routing_key": "k"})
        self.assertError(self.delete("/api/exchanges/%2F/x1?if-unused=true"), 400, "bad_request",
                         "exchange 'x1' in vhost '/' in use")
        self.assertEqual(self.delete("/api/exchanges/%2F/x1").code, 204)
        self.assertError(self.delete("/api/exchanges/%2F/x1"), 404, "Object Not Found", "Not Found")

    def test_publish(self):
        """publish to amq.default routes by queue name and reports routed."""
        self.put("/api/queues/%2F/q1")
        body = {"properties": {"priority": 3, "timestamp": 1700000000}, "routing_key": "q1", "payload": "aGk=",
                "payload_encoding": "base64"}
        self.assertEqual(self.post("/api/exchanges/%2F/amq.default/publish", body).json(), {"routed": True})
        self.assertEqual(self.post("/api/exchanges/%2F/amq.default/publish", dict(body, routing_key="no")).json(),
                         {"routed": False})
        entry = self.vh.queues["q1"].basicGet(True)
        self.assertEqual((entry.message.body, entry.message.props["priority"], entry.message.props["timestamp"]),
                         (b"hi", 3, 1700000000))

    def test_publishBadExpiration(self):
        """An invalid expiration is 400 with the AMQP code and text."""
        body = {"properties": {"expiration": "abc"}, "routing_key": "q", "payload": "x",
                "payload_encoding": "string"}
        self.assertError(self.post("/api/exchanges/%2F/amq.default/publish", body), 400, "bad_request",
                         "406 PRECONDITION_FAILED - invalid expiration 'abc': no_integer")

    def test_publishMissingExchange(self):
        """Publishing to a missing exchange is 400 with 404 NOT_FOUND text."""
        body = {"properties": {}, "routing_key": "q", "payload": "x", "payload_encoding": "string"}
        self.assertError(self.post("/api/exchanges/%2F/nosuchx/publish", body), 400, "bad_request",
                         "404 NOT_FOUND - no exchange 'nosuchx' in vhost '/'")

    def test_publishMissingKey(self):
        """A publish body without payload_encoding is 400 [{key_missing,payload_encoding}]."""
        body = {"properties": {}, "routing_key": "q", "payload": "x"}
        self.assertError(self.post("/api/exchanges/%2F/amq.direct/publish", body), 400, "bad_request",
                         "[{key_missing,payload_encoding}]")

    def test_publishBadBase64(self):
        """Invalid base64 is 400 with reason ["not_base64", payload]."""
        body = {"properties": {}, "routing_key": "q", "payload": "!!", "payload_encoding": "base64"}
        self.assertError(self.post("/api/exchanges/%2F/amq.direct/publish", body), 400, "bad_request",
                         ["not_base64", "!!"])


class BindingTests(WebTestCase):
    """/api/bindings."""

    def setUp(self):
        WebTestCase.setUp(self)
        self.put("/api/exchanges/%2F/x1", {"type": "direct"})
        self.put("/api/queues/%2F/q1")

    def test_createGetDelete(self):
        """POST binds (201 + Location), GET by properties_key finds it, DELETE removes it."""
        r = self.post("/api/bindings/%2F/e/x1/q/q1", {"routing_key": "a.b", "arguments": {}})
        self.assertEqual((r.code, r.header("location")), (201, "q1/a.b"))
        binding = {"source": "x1", "vhost": "/", "destination": "q1", "destination_type": "queue",
                   "routing_key": "a.b", "arguments": {}, "properties_key": "a.b"}
        self.assertEqual(self.get("/api/bindings/%2F/e/x1/q/q1").json(), [binding])
        self.assertEqual(self.get("/api/bindings/%2F/e/x1/q/q1/a.b").json(), binding)
        self.assertEqual(self.delete("/api/bindings/%2F/e/x1/q/q1/a.b").code, 204)
        self.assertError(self.delete("/api/bindings/%2F/e/x1/q/q1/a.b"), 404, "Object Not Found", "Not Found")
        self.assertEqual(len(self.vh.exchanges["x1"].routing), 0)

    def test_locationEncoding(self):
        """properties_key percent-encodes '*' and the Location header encodes it once more, as RabbitMQ."""
        r = self.post("/api/bindings/%2F/e/x1/q/q1", {"routing_key": "a.*"})
        self.assertEqual(r.header("location"), "q1/a.%252A")
        self.assertEqual(self.get("/api/bindings/%2F/e/x1/q/q1/a.%252A").json()["properties_key"], "a.%2A")

    def test_emptyKey(self):
        """An empty key without arguments has properties_key ~."""
        r = self.post("/api/bindings/%2F/e/x1/q/q1")
        self.assertEqual(r.header("location"), "q1/~")
        self.assertEqual(self.delete("/api/bindings/%2F/e/x1/q/q1/~").code, 204)

    def test_exchangeToExchange(self):
        """e/{src}/e/{dst} binds two exchanges and lists them with destination_type exchange."""
        self.put("/api/exchanges/%2F/x2", {"type": "fanout"})
        self.assertEqual(self.post("/api/bindings/%2F/e/x1/e/x2", {"routing_key": "k"}).code, 201)
        self.assertEqual([b["destination_type"] for b in self.get("/api/exchanges/%2F/x2/bindings/destination")
                          .json()], ["exchange"])

    def test_missingEnds(self):
        """Binding from a missing exchange is 404 not_found with the AMQP text."""
        self.assertError(self.post("/api/bindings/%2F/e/nosuch/q/q1", {"routing_key": "k"}), 404, "not_found",
                         "no exchange 'nosuch' in vhost '/'")

    def test_defaultExchangeRefused(self):
        """Binding from amq.default is 401 Access refused."""
        self.assertError(self.post("/api/bindings/%2F/e/amq.default/q/q1", {"routing_key": "k"}), 401,
                         "not_authorised", "Access refused.")

    def test_vhostList(self):
        """The vhost list has default bindings then declared ones."""
        self.post("/api/bindings/%2F/e/x1/q/q1", {"routing_key": "k"})
        self.assertEqual([(b["source"], b["routing_key"]) for b in self.get("/api/bindings/%2F").json()],
                         [("", "q1"), ("x1", "k")])


class AdminTests(WebTestCase):
    """Overview, vhosts, users, permissions, health and definitions."""

    def test_overview(self):
        """overview has product, version, totals and the delayed exchange type."""
        self.put("/api/queues/%2F/q1")
        self.publish("q1")
        o = self.get("/api/overview").json()
        self.assertEqual((o["product_name"], o["rabbitmq_version"]), ("otter_tx", "3.10.8"))
        self.assertEqual(o["object_totals"], {"channels": 0, "connections": 0, "consumers": 0, "exchanges": 7,
                                              "queues": 1})
        self.assertEqual((o["queue_totals"]["messages"], o["queue_totals"]["messages_ready"]), (1, 1))
        self.assertIn("x-delayed-message", [t["name"] for t in o["exchange_types"]])
        self.assertEqual(o["policy_keys"]["operator-policies"],
                         ["expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit"])
        self.assertIn("dead-letter-exchange", o["policy_keys"]["policies"])

    def test_vhosts(self):
        """PUT creates a vhost (201, then 204), GET lists it, DELETE removes it (204, then 404)."""
        self.assertEqual(self.put("/api/vhosts/v1").code, 201)
        self.assertEqual(self.put("/api/vhosts/v1").code, 204)
        self.assertEqual(self.broker.permissions[("guest", "v1")], (".*", ".*", ".*"))
        self.assertEqual([v["name"] for v in self.get("/api/vhosts").json()], ["/", "v1"])
        self.assertEqual(self.delete("/api/vhosts/v1").code, 204)
        self.assertError(self.delete("/api/vhosts/v1"), 404, "Object Not Found", "Not Found")

    def test_vhostDeleteAnswersAtOnce(self):
        """
        DELETE of a vhost whose client has not answered connection.close yet
        is 204 at once (no time passes), as RabbitMQ answers; the client has its 320.
        """
        self.put("/api/vhosts/v1")
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), vhost="v1")
        c.received()
        r = self.delete("/api/vhosts/v1")
        self.assertEqual(r.code, 204)
        self.assertEqual([(m.reply_code, m.reply_text) for m in c.methods() if isinstance(m, spec.ConnectionClose)],
                         [(320, "CONNECTION_FORCED - vhost 'v1' is deleted")])

    def test_users(self):
        """PUT creates a user who can then log in; tags may be a comma string; DELETE removes it."""
        self.assertEqual(self.put("/api/users/bob", {"password": "pw", "tags": "management,monitoring"}).code, 201)
        u = self.get("/api/users/bob").json()
        self.assertEqual((u["tags"], u["hashing_algorithm"]), (["management", "monitoring"],
                                                               "rabbit_password_hashing_sha256"))
        self.assertEqual(len(base64.b64decode(u["password_hash"])), 36)
        self.assertEqual(self.get("/api/whoami", auth=("bob", "pw")).json()["name"], "bob")
        self.assertEqual(self.put("/api/users/bob", {"tags": "administrator"}).code, 204)
        self.assertEqual(self.get("/api/users", auth=("bob", "pw")).code, 200)
        self.assertEqual(self.delete("/api/users/bob").code, 204)
        self.assertError(self.get("/api/users/bob"), 404, "Object Not Found", "Not Found")

    def test_passwordHashImport(self):
        """A user PUT with an exported password_hash keeps the same password."""
        self.put("/api/users/bob", {"password": "pw", "tags": "management"})
        h = self.get("/api/users/bob").json()["password_hash"]
        self.delete("/api/users/bob")
        self.put("/api/users/bob", {"password_hash": h, "tags": "management"})
        self.assertEqual(self.get("/api/whoami", auth=("bob", "pw")).code, 200)

    def test_permissions(self):
        """PUT sets permissions (201/204), GET shows them, DELETE removes them; missing user is 400."""
        self.put("/api/users/bob", {"password": "pw", "tags": ""})
        perms = {"configure": ".*", "write": "w", "read": "r"}
        self.assertEqual(self.put("/api/permissions/%2F/bob", perms).code, 201)
        self.assertEqual(self.put("/api/permissions/%2F/bob", perms).code, 204)
        self.assertEqual(self.get("/api/permissions/%2F/bob").json(), dict(perms, user="bob", vhost="/"))
        self.assertIn(dict(perms, user="bob", vhost="/"), self.get("/api/permissions").json())
        self.assertEqual(self.delete("/api/permissions/%2F/bob").code, 204)
        self.assertError(self.put("/api/permissions/%2F/nobody", perms), 400, "bad_request",
                         "vhost_or_user_not_found")

    def test_healthcheck(self):
        """healthchecks/node is {"status":"ok"}."""
        self.assertEqual(self.get("/api/healthchecks/node").json(), {"status": "ok"})

    def test_aliveness(self):
        """aliveness-test answers ok, leaves an empty aliveness-test queue; a missing vhost is 404."""
        self.assertEqual(self.get("/api/aliveness-test/%2F").json(), {"status": "ok"})
        self.assertEqual(self.vh.queues["aliveness-test"].readyCount, 0)
        self.assertEqual(self.get("/api/aliveness-test/nope").code, 404)

    def test_definitions(self):
        """The export has RabbitMQ's keys and skips amq.*, exclusive queues and default bindings."""
        self.put("/api/queues/%2F/q1", {"durable": True})
        self.put("/api/exchanges/%2F/x1")
        self.post("/api/bindings/%2F/e/x1/q/q1", {"routing_key": "k"})
        self.put("/api/policies/%2F/p", {"pattern": "x", "definition": {"message-ttl": 5}})
        d = self.get("/api/definitions").json()
        self.assertEqual(sorted(d), sorted(["rabbit_version", "rabbitmq_version", "product_name",
                                            "product_version", "users", "vhosts", "permissions",
                                            "topic_permissions", "parameters", "global_parameters",
                                            "policies", "queues", "exchanges", "bindings"]))
        self.assertEqual(d["queues"], [{"name": "q1", "vhost": "/", "durable": True, "auto_delete": False,
                                        "arguments": {}}])
        self.assertEqual([x["name"] for x in d["exchanges"]], ["x1"])
        self.assertEqual(d["bindings"], [{"source": "x1", "vhost": "/", "destination": "q1",
                                          "destination_type": "queue", "routing_key": "k", "arguments": {}}])
        self.assertEqual([p["name"] for p in d["policies"]], ["p"])


class ConnectionTests(WebTestCase):
    """/api/connections, /api/channels, /api/consumers against an in-memory AMQP client."""

    def setUp(self):
        WebTestCase.setUp(self)
        self.client = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0),
                                 capabilities={"consumer_cancel_notify": True})
        self.client.openChannel(1)
        self.client.send(1, spec.QueueDeclare(0, "cq", False, False, False, False, {}))
        self.client.send(1, spec.BasicQos(0, 7, False))
        self.client.send(1, spec.BasicConsume(0, "cq", "ctag1", False, False, False, False, {}))
        self.client.received()

    def test_connections(self):
        """The connection is listed with user, vhost, protocol and a RabbitMQ-style name."""
        [c] = self.get("/api/connections").json()
        self.assertEqual((c["user"], c["vhost"], c["protocol"], c["channels"]), ("guest", "/", "AMQP 0-9-1", 1))
        self.assertIn(" -> ", c["name"])

    def test_channelsAndConsumers(self):
        """Channels show prefetch and consumer count; consumers show tag, prefetch and queue."""
        [ch] = self.get("/api/channels").json()
        self.assertEqual((ch["number"], ch["prefetch_count"], ch["consumer_count"]), (1, 7, 1))
        [c] = self.get("/api/consumers").json()
        self.assertEqual((c["consumer_tag"], c["ack_required"], c["prefetch_count"], c["queue"]),
                         ("ctag1", True, 7, {"name": "cq", "vhost": "/"}))
        q = self.get("/api/queues/%2F/cq").json()
        self.assertEqual([d["consumer_tag"] for d in q["consumer_details"]], ["ctag1"])

    def test_closeConnection(self):
        """DELETE closes the connection with 320 CONNECTION_FORCED and the X-Reason text."""
        from urllib.parse import quote

        [c] = self.get("/api/connections").json()
        r = self.delete("/api/connections/" + quote(c["name"], safe=""), headers={"X-Reason": ["bye"]})
        self.assertEqual(r.code, 204)
        closes = [m for m in self.client.methods() if isinstance(m, spec.ConnectionClose)]
        self.assertEqual([(m.reply_code, m.reply_text) for m in closes], [(320, "CONNECTION_FORCED - bye")])


class MetricsTests(WebTestCase):
    """Prometheus metrics are served on the Prometheus listener only, as RabbitMQ does."""

    def metrics(self, path):
        """``(code, body text)`` of ``GET path`` on the Prometheus listener's resource."""
        http = StubTreq(PrometheusResource(self.broker, self.clock))
        d = http.get(BASE + path)
        http.flush()
        resp = self.successResultOf(d)
        d2 = resp.content()
        http.flush()
        return resp.code, self.successResultOf(d2).decode("utf-8")

    def test_notOnManagementPort(self):
        """The management port answers /metrics and its sub-paths 404 Object Not Found, as RabbitMQ's 15672."""
        for path in ("/metrics", "/metrics/per-object", "/metrics/detailed?family=queue_metrics"):
            for auth in (None, GUEST):
                self.assertError(self.get(path, auth=auth), 404, "Object Not Found", "Not Found")

    def test_queueAndDeadLetterMetrics(self):
        """/metrics reports ready messages and dead-letter counters under rabbitmq_ names, without auth."""
        self.put("/api/queues/%2F/q1", {"arguments": {"x-max-length": 1, "x-dead-letter-exchange": ""}})
        self.publish("q1")
        self.publish("q1")
        code, body = self.metrics("/metrics")
        self.assertEqual(code, 200)
        fams = families(body)
        self.assertEqual(value(fams, "rabbitmq_queue_messages_ready"), 1)
        self.assertEqual(value(fams, "rabbitmq_queues"), 1)
        self.assertEqual(value(fams, "rabbitmq_global_messages_dead_lettered_maxlen_total",
                               queue_type="rabbit_classic_queue", dead_letter_strategy="at_most_once"), 1)

    def test_perObject(self):
        """/metrics/per-object labels queue metrics with vhost and queue."""
        self.put("/api/queues/%2F/q1")
        self.publish("q1")
        fams = families(self.metrics("/metrics/per-object")[1])
        self.assertEqual(value(fams, "rabbitmq_queue_messages_ready", vhost="/", queue="q1"), 1)


class OnlyThisTests(WebTestCase):
    """
    The "security hole" of issue 9: a user whose permissions are
    ``^only-this$`` is refused every HTTP operation a permission governs on
    any other resource, exactly where AMQP refuses it, and allowed where
    AMQP allows it (each operation runs through a Session acting as the user).
    """

    USER = ("only", "pw")

    def setUp(self):
        WebTestCase.setUp(self)
        self.broker.addUser("only", "pw", ["management"])
        self.broker.setPermissions("only", "/", "^only-this$", "^only-this$", "^only-this$")
        for q in ("other", "only-this"):
            self.put("/api/queues/%2F/" + q)
        self.put("/api/exchanges/%2F/only-this", {"type": "fanout"})
        self.publish("other")
        self.publish("only-this")

    def amqp(self):
        """An AMQP connection of the same user with channel 1 open."""
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), user="only", password="pw")
        c.openChannel(1)
        c.received()
        return c

    def amqpRefuses(self, method, code=403):
        """The same operation over AMQP closes the channel with ``code``."""
        c = self.amqp()
        c.send(1, method)
        closes = [m.reply_code for m in c.methods() if isinstance(m, spec.ChannelClose)]
        self.assertEqual(closes, [code])

    def test_publish(self):
        """Publishing to amq.direct is 400 with the 403 text (and nothing is delivered), to only-this it routes."""
        body = {"routing_key": "other", "properties": {}, "payload": "x", "payload_encoding": "string"}
        for x in ("amq.direct", "amq.default"):
            self.assertError(self.post("/api/exchanges/%2F/" + x + "/publish", body, auth=self.USER), 400,
                             "bad_request",
                             "403 ACCESS_REFUSED - access to exchange '%s' in vhost '/' refused for user 'only'"
                             % (x,))
        self.assertEqual(self.vh.queues["other"].readyCount, 1)
        self.post("/api/bindings/%2F/e/only-this/q/only-this", {})
        self.assertEqual(self.post("/api/exchanges/%2F/only-this/publish", body, auth=self.USER).json(),
                         {"routed": True})
        self.assertEqual(self.vh.queues["only-this"].readyCount, 2)
        c = self.amqp()
        c.publish(1, "amq.direct", "other", b"x")
        self.assertEqual([m.reply_code for m in c.methods() if isinstance(m, spec.ChannelClose)], [403])

    def test_get(self):
        """/get on another queue is 401 with the AMQP text and the message stays; on only-this it is allowed."""
        body = {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"}
        self.assertError(self.post("/api/queues/%2F/other/get", body, auth=self.USER), 401, "not_authorised",
                         "ACCESS_REFUSED - access to queue 'other' in vhost '/' refused for user 'only'")
        self.assertEqual(self.vh.queues["other"].readyCount, 1)
        self.assertEqual(len(self.post("/api/queues/%2F/only-this/get", body, auth=self.USER).json()), 1)
        self.assertEqual(self.vh.queues["only-this"].readyCount, 0)
        self.amqpRefuses(spec.BasicGet(0, "other", False))

    def test_purge(self):
        """Purging another queue is 401 Access refused. and the message stays; only-this is purged."""
        self.assertError(self.delete("/api/queues/%2F/other/contents", auth=self.USER), 401, "not_authorised",
                         "Access refused.")
        self.assertEqual(self.vh.queues["other"].readyCount, 1)
        self.assertEqual(self.delete("/api/queues/%2F/only-this/contents", auth=self.USER).code, 204)
        self.assertEqual(self.vh.queues["only-this"].readyCount, 0)
        self.amqpRefuses(spec.QueuePurge(0, "other", False))

    def test_queueDeclareDelete(self):
        """Declaring or deleting another queue is 401 Access refused.; only-this may be redeclared and deleted."""
        self.assertError(self.put("/api/queues/%2F/new", auth=self.USER), 401, "not_authorised", "Access refused.")
        self.assertError(self.delete("/api/queues/%2F/other", auth=self.USER), 401, "not_authorised",
                         "Access refused.")
        self.assertNotIn("new", self.vh.queues)
        self.assertIn("other", self.vh.queues)
        self.assertEqual(self.put("/api/queues/%2F/only-this", auth=self.USER).code, 204)
        self.assertEqual(self.delete("/api/queues/%2F/only-this", auth=self.USER).code, 204)
        self.amqpRefuses(spec.QueueDeclare(0, "new", False, False, False, False, False, {}))
        self.amqpRefuses(spec.QueueDelete(0, "other", False, False, False))

    def test_exchangeDeclareDelete(self):
        """Declaring or deleting another exchange is 401 Access refused.; only-this may be."""
        self.assertError(self.put("/api/exchanges/%2F/newx", {"type": "direct"}, auth=self.USER), 401,
                         "not_authorised", "Access refused.")
        self.assertError(self.delete("/api/exchanges/%2F/amq.direct", auth=self.USER), 401, "not_authorised",
                         "Access refused.")
        self.assertEqual(self.put("/api/exchanges/%2F/only-this", {"type": "fanout"}, auth=self.USER).code, 204)
        self.assertEqual(self.delete("/api/exchanges/%2F/only-this", auth=self.USER).code, 204)
        self.amqpRefuses(spec.ExchangeDeclare(0, "newx", "direct", False, False, False, False, False, {}))

    def test_bindUnbind(self):
        """Binding another queue or from another exchange is refused; only-this to only-this binds and unbinds."""
        self.assertError(self.post("/api/bindings/%2F/e/amq.direct/q/other", {"routing_key": "k"}, auth=self.USER),
                         401, "not_authorised", "Access refused.")
        self.assertError(self.post("/api/bindings/%2F/e/amq.direct/q/only-this", {"routing_key": "k"},
                                   auth=self.USER), 401, "not_authorised", "Access refused.")
        self.post("/api/bindings/%2F/e/amq.direct/q/other", {"routing_key": "k"})
        self.assertError(self.delete("/api/bindings/%2F/e/amq.direct/q/other/k", auth=self.USER),
                         401, "not_authorised", "Access refused.")
        r = self.post("/api/bindings/%2F/e/only-this/q/only-this", {"routing_key": "k"}, auth=self.USER)
        self.assertEqual(r.code, 201)
        self.assertEqual(self.delete("/api/bindings/%2F/e/only-this/q/only-this/k", auth=self.USER).code, 204)
        self.amqpRefuses(spec.QueueBind(0, "other", "amq.direct", "k", False, {}))


    def test_refusedBeforeBodyParsed(self):
        """
        A request refused by a permission is refused before its body is
        parsed (issue 19): a body that is not JSON still gets the refusal, not 400 not_json.
        """
        junk = b"[" * 100000
        read = "ACCESS_REFUSED - access to queue 'other' in vhost '/' refused for user 'only'"
        cases = [
            ("PUT", "/api/queues/%2F/other", 401, "not_authorised", "Access refused."),
            ("POST", "/api/queues/%2F/other/get", 401, "not_authorised", read),
            ("POST", "/api/queues/%2F/other/browse", 401, "not_authorised", read),
            ("PUT", "/api/exchanges/%2F/other", 401, "not_authorised", "Access refused."),
            ("POST", "/api/exchanges/%2F/amq.direct/publish", 400, "bad_request",
             "403 ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'only'"),
            ("POST", "/api/bindings/%2F/e/amq.direct/q/other", 401, "not_authorised", "Access refused."),
        ]
        for method, path, code, error, reason in cases:
            r = self.request(method, path, raw=junk, auth=self.USER, headers={"content-type": ["application/json"]})
            self.assertError(r, code, error, reason)
        self.broker.addUser("none", "pw", ["management"])  # no permissions on the vhost at all
        for method, path, _, _, _ in cases:
            r = self.request(method, path, raw=junk, auth=("none", "pw"))
            self.assertIn(r.code, (400, 401), path)
            self.assertNotEqual(r.json()["reason"], "not_json", path)

class JsonBodyBoundTests(WebTestCase):
    """A JSON body beyond 1 MiB is refused before it is parsed, except a publish's (issue 19)."""

    def test_bounded(self):
        import json as _json

        big = b"[" + b"{}," * 400000 + b"{}]"  # 1.2 MB: parsed, about 30 MB of objects
        for method, path in (("PUT", "/api/queues/%2F/q"), ("POST", "/api/queues/%2F/q/get"),
                             ("PUT", "/api/policies/%2F/p")):
            r = self.request(method, path, raw=big, headers={"content-type": ["application/json"]})
            self.assertError(r, 400, "bad_request", "Exceeded HTTP request body size limit")
        self.request("PUT", "/api/queues/%2F/q", body={})
        payload = "x" * (2 << 20)
        r = self.request("POST", "/api/exchanges/%2F/amq.default/publish",
                         raw=_json.dumps({"routing_key": "q", "properties": {}, "payload": payload,
                                          "payload_encoding": "string"}).encode(),
                         headers={"content-type": ["application/json"]})
        self.assertEqual((r.code, r.json()), (200, {"routed": True}))


class PublishPipelineTests(WebTestCase):
    """HTTP publish goes through the same pipeline as basic.publish."""

    def setUp(self):
        WebTestCase.setUp(self)
        for q in ("a", "b", "c"):
            self.put("/api/queues/%2F/" + q)

    def send(self, props, key="a"):
        body = {"routing_key": key, "properties": props, "payload": "x", "payload_encoding": "string"}
        return self.post("/api/exchanges/%2F/amq.default/publish", body)

    def test_senderSelected(self):
        """CC and BCC headers add routing keys; BCC is not delivered."""
        self.assertEqual(self.send({"headers": {"CC": ["b"], "BCC": ["c"]}}).json(), {"routed": True})
        for q in ("a", "b", "c"):
            entry = self.vh.queues[q].basicGet(True)
            self.assertEqual(entry.message.props["headers"], {"CC": ["b"]}, q)

    def test_userId(self):
        """A user_id other than the authenticated user is 400 with the 406 text."""
        self.assertError(self.send({"user_id": "someone"}), 400, "bad_request",
                         "406 PRECONDITION_FAILED - user_id property set to 'someone' but authenticated "
                         "user was 'guest'")
        self.assertEqual(self.send({"user_id": "guest"}).json(), {"routed": True})

    def test_replyToWithoutConsumer(self):
        """reply_to amq.rabbitmq.reply-to has no reply consumer over HTTP: 400 with the 406 text."""
        self.assertError(self.send({"reply_to": "amq.rabbitmq.reply-to"}), 400, "bad_request",
                         "406 PRECONDITION_FAILED - fast reply consumer does not exist")
        self.assertEqual(self.vh.queues["a"].readyCount, 0)

    def test_internalExchange(self):
        """Publishing to an internal exchange is 400 with the 403 text."""
        self.put("/api/exchanges/%2F/ix", {"type": "fanout", "internal": True})
        body = {"routing_key": "", "properties": {}, "payload": "x", "payload_encoding": "string"}
        self.assertError(self.post("/api/exchanges/%2F/ix/publish", body), 400, "bad_request",
                         "403 ACCESS_REFUSED - cannot publish to internal exchange 'ix' in vhost '/'")


    def test_acceptedDuringAlarm(self):
        """
        An HTTP publish during a resource alarm is accepted and routed, as
        RabbitMQ 3.10 answers it (checked on the peer): only AMQP publishers are blocked.
        """
        self.put("/api/queues/%2F/q")
        for resource in ("memory", "disk"):
            self.broker.alarms.set(resource)
        r = self.post("/api/exchanges/%2F/amq.default/publish",
                      {"properties": {}, "routing_key": "q", "payload": "x", "payload_encoding": "string"})
        self.assertEqual((r.code, r.json()), (200, {"routed": True}))
        self.assertEqual(self.vh.queues["q"].readyCount, 1)

    def test_bodyCountsTowardMemoryCheck(self):
        """An HTTP publish's body counts toward the memory check as an AMQP publish's bytes do (Broker.received)."""
        self.broker.memoryHighWatermark = 1000
        monitor = self.broker.memoryMonitor
        monitor.probe = lambda: 2000
        self.put("/api/queues/%2F/q")
        payload = "x" * monitor.step
        r = self.post("/api/exchanges/%2F/amq.default/publish",
                      {"properties": {}, "routing_key": "q", "payload": payload, "payload_encoding": "string"})
        self.assertEqual(r.code, 200)
        self.assertIn("memory", self.broker.alarms.active)

class VHostLimitTests(WebTestCase):
    """/api/vhost-limits and their enforcement on AMQP (checked on RabbitMQ 3.10)."""

    def limit(self, name, value, vhost="%2F", **kw):
        return self.put("/api/vhost-limits/%s/%s" % (vhost, name), {"value": value}, **kw)

    def client(self, vhost="/"):
        """An in-memory AMQP connection to ``vhost`` as guest, and its connection.close replies."""
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), handshake=False)
        closes = [(m.reply_code, m.reply_text) for _, m, _ in c.handshake(vhost)
                  if isinstance(m, spec.ConnectionClose)]
        return c, closes

    def test_putListDelete(self):
        """PUT sets (204), both lists show the value, DELETE leaves an empty set listed as []."""
        self.assertEqual(self.limit("max-queues", 5).code, 204)
        self.assertEqual(self.limit("max-connections", -1).code, 204)
        expected = [{"vhost": "/", "value": {"max-queues": 5, "max-connections": -1}}]
        self.assertEqual(self.get("/api/vhost-limits").json(), expected)
        self.assertEqual(self.get("/api/vhost-limits/%2F").json(), expected)
        self.assertEqual(self.delete("/api/vhost-limits/%2F/max-queues").code, 204)
        self.assertEqual(self.delete("/api/vhost-limits/%2F/max-connections").code, 204)
        self.assertEqual(self.get("/api/vhost-limits/%2F").json(), [])
        self.assertEqual(self.get("/api/vhost-limits").json(), [{"vhost": "/", "value": []}])

    def test_noLimits(self):
        """Without limits both lists are empty; a missing vhost is 404."""
        self.assertEqual(self.get("/api/vhost-limits").json(), [])
        self.assertEqual(self.get("/api/vhost-limits/%2F").json(), [])
        self.assertError(self.get("/api/vhost-limits/nope"), 404, "Object Not Found", "Not Found")
        self.assertError(self.limit("max-queues", 1, vhost="nope"), 404, "not_found", "vhost_not_found")

    def test_validation(self):
        """Bad values and names answer 400 with RabbitMQ's texts."""
        for given, shown in (("x", '<<"x">>'), (1.5, "1.5"), (True, "true")):
            self.assertError(self.limit("max-queues", given), 400, "bad_request",
                             "Validation failed\n\nmax-queues should be a number, actually was %s\n" % (shown,))
        self.assertError(self.limit("foo", 1), 400, "bad_request",
                         'Validation failed\n\nUnrecognised terms [{<<"foo">>,1}] in limits\n')
        self.assertError(self.put("/api/vhost-limits/%2F/max-queues", {}), 400, "bad_request",
                         "[{key_missing,value}]")
        self.assertIsNone(self.vh.limits)

    def test_adminOnly(self):
        """PUT needs the administrator tag: 401 Not administrator user."""
        self.broker.addUser("mgmt", "pw", ["management"])
        self.broker.setPermissions("mgmt", "/")
        self.assertEqual(self.limit("max-queues", 1, auth=("mgmt", "pw")).code, 401)
        self.assertIsNone(self.vh.limits)

    def test_visibleVHosts(self):
        """Reads follow is_authorized_vhost_visible: monitoring sees every vhost, management only its own."""
        self.broker.addVHost("other")
        self.limit("max-queues", 1, vhost="other")
        self.limit("max-queues", 2)
        for name, tag in (("mgmt", "management"), ("mon", "monitoring")):
            self.broker.addUser(name, "pw", [tag])
            self.broker.setPermissions(name, "/")
        self.assertEqual([e["vhost"] for e in self.get("/api/vhost-limits", auth=("mgmt", "pw")).json()], ["/"])
        self.assertEqual([e["vhost"] for e in self.get("/api/vhost-limits", auth=("mon", "pw")).json()],
                         ["/", "other"])
        self.assertError(self.get("/api/vhost-limits/other", auth=("mgmt", "pw")), 401, "not_authorised",
                         "User not authorised to access virtual host")
        self.assertEqual(self.get("/api/vhost-limits/other", auth=("mon", "pw")).json(),
                         [{"vhost": "other", "value": {"max-queues": 1}}])

    def test_queueLimitHTTP(self):
        """An HTTP queue PUT over max-queues is 400 with RabbitMQ's text; redeclaring an existing queue passes."""
        self.put("/api/queues/%2F/q1")
        self.limit("max-queues", 1)
        self.assertError(self.put("/api/queues/%2F/q2"), 400, "bad_request",
                         "cannot declare queue 'q2': queue limit in vhost '/' (1) is reached")
        self.assertEqual(self.put("/api/queues/%2F/q1").code, 204)
        self.limit("max-queues", -1)
        self.assertEqual(self.put("/api/queues/%2F/q2").code, 201)

    def test_queueLimitAMQP(self):
        """queue.declare over max-queues closes the channel with 406 PRECONDITION_FAILED."""
        self.limit("max-queues", 0)
        c, _ = self.client()
        c.send(1, spec.ChannelOpen())
        c.send(1, spec.QueueDeclare(queue="q"))
        closes = [(m.reply_code, m.reply_text) for m in c.methods() if isinstance(m, spec.ChannelClose)]
        self.assertEqual(closes, [(406, "PRECONDITION_FAILED - cannot declare queue 'q': "
                                        "queue limit in vhost '/' (0) is reached")])
        self.assertNotIn("q", self.vh.queues)

    def test_connectionLimit(self):
        """connection.open over max-connections is 530 NOT_ALLOWED with RabbitMQ's text."""
        self.limit("max-connections", 1)
        self.assertEqual(self.client()[1], [])
        self.assertEqual(self.client()[1], [(530, "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
                                        "connection limit (1) is reached")])


class HealthCheckTests(WebTestCase):
    """/api/health/checks/* and /api/healthchecks/node[/{node}] as RabbitMQ 3.10 answers them."""

    def setUp(self):
        import os

        from twisted.test import __file__ as twistedTests

        WebTestCase.setUp(self)
        self.pem = os.path.join(os.path.dirname(twistedTests), "server.pem")
        self.mgmt.listeners = [
            {"protocol": "amqp", "ip_address": "127.0.0.1", "port": 5672, "certfile": None, "cacertfile": None},
            {"protocol": "amqp/ssl", "ip_address": "0.0.0.0", "port": 5671, "certfile": self.pem,
             "cacertfile": None},
            {"protocol": "http", "ip_address": "127.0.0.1", "port": 15672, "certfile": None, "cacertfile": None},
        ]

    def check(self, path):
        reply = self.get("/api/" + path)
        return reply.code, reply.json()

    def test_trailingSlash(self):
        """Every check answers the same with and without a trailing slash."""
        self.clock.advance(1700000000)
        for path in ("healthchecks/node", "health/checks/alarms", "health/checks/local-alarms",
                     "health/checks/virtual-hosts", "health/checks/node-is-quorum-critical",
                     "health/checks/node-is-mirror-sync-critical", "health/checks/port-listener/5672",
                     "health/checks/protocol-listener/amqp", "health/checks/certificate-expiration/1/days",
                     "healthchecks/node/otter_tx@localhost"):
            self.assertEqual(self.check(path), self.check(path + "/"), path)
            self.assertEqual(self.check(path)[0], 200, path)

    def test_nodeByName(self):
        """/api/healthchecks/node/{node} answers for this node and 404 for another."""
        self.assertEqual(self.check("healthchecks/node/otter_tx@localhost"), (200, {"status": "ok"}))
        self.assertEqual(self.check("healthchecks/node/rabbit@elsewhere"),
                         (404, {"error": "Object Not Found", "reason": "Not Found"}))

    def test_singleNode(self):
        """virtual-hosts is ok; the critical checks say single node cluster."""
        self.assertEqual(self.check("health/checks/virtual-hosts"), (200, {"status": "ok"}))
        for name in ("node-is-mirror-sync-critical", "node-is-quorum-critical"):
            self.assertEqual(self.check("health/checks/" + name),
                             (200, {"status": "ok", "reason": "single node cluster"}))

    def test_portListener(self):
        """A bound port is ok with the port; another is 503 listing the ports; a non-number is 400."""
        self.assertEqual(self.check("health/checks/port-listener/5671"), (200, {"status": "ok", "port": 5671}))
        self.assertEqual(self.check("health/checks/port-listener/5673"), (503, {
            "status": "failed", "reason": "No active listener", "missing": 5673, "ports": [5671, 5672, 15672]}))
        self.assertEqual(self.check("health/checks/port-listener/abc"),
                         (400, {"error": "bad_request", "reason": "Invalid port"}))

    def test_protocolListener(self):
        """RabbitMQ's aliases name the protocol; a missing one is 503 listing the protocols."""
        for alias, name in (("amqp091", "amqp"), ("AMQP0-9-1", "amqp"), ("amqps", "amqp/ssl"),
                            ("management", "http")):
            self.assertEqual(self.check("health/checks/protocol-listener/" + alias),
                             (200, {"status": "ok", "protocol": name}))
        self.assertEqual(self.check("health/checks/protocol-listener/mqtt"), (503, {
            "status": "failed", "reason": "No active listener", "missing": "mqtt",
            "protocols": ["amqp", "amqp/ssl", "http"]}))

    def test_certificateExpiration(self):
        """A TLS listener's certificate expiring within the time is 503 with its expiry date; bad arguments are 400."""
        self.clock.advance(1700000000)  # 2023-11-14; the certificate runs to 2123-05-21 13:40:28 UTC
        self.assertEqual(self.check("health/checks/certificate-expiration/1/years"), (200, {"status": "ok"}))
        self.assertEqual(self.check("health/checks/certificate-expiration/100/YEARS"), (503, {
            "status": "failed", "reason": "Certificates expiring", "expired": [{
                "node": "otter_tx@localhost", "protocol": "amqp/ssl", "interface": "0.0.0.0", "port": 5671,
                "certfile": self.pem, "cacertfile": None,
                "certfile_expires_on": ["2123-05-21 13:40:28"], "cacertfile_expires_on": []}]}))
        self.assertEqual(self.check("health/checks/certificate-expiration/x/days"),
                         (400, {"error": "bad_request", "reason": "Invalid expiration value."}))
        self.assertEqual(self.check("health/checks/certificate-expiration/1/fortnights"), (400, {
            "error": "bad_request",
            "reason": "Time unit not recognised. Supported units: days, weeks, months, years."}))

    def test_certificateNotYetValid(self):
        """A certificate whose validity has not begun is reported as an error entry."""
        code, body = self.check("health/checks/certificate-expiration/1/days")
        self.assertEqual((code, body["expired"][0]["certfile_expires_on"]),
                         (503, [{"error": "Certificate is not yet valid"}]))

    def test_overviewListenersAndContexts(self):
        """The overview lists the listeners and one context per management listener, port as a string."""
        overview = self.get("/api/overview").json()
        self.assertEqual([(l["protocol"], l["port"]) for l in overview["listeners"]],
                         [("amqp", 5672), ("amqp/ssl", 5671), ("http", 15672)])
        self.assertEqual(overview["contexts"], [{
            "ssl_opts": [], "node": "otter_tx@localhost", "description": "RabbitMQ Management", "path": "/",
            "cowboy_opts": "[{sendfile,false}]", "ip": "127.0.0.1", "port": "15672"}])


class ParameterTests(WebTestCase):
    """/api/global-parameters and /api/parameters as RabbitMQ 3.10 without plugins answers them."""

    def test_globalParameters(self):
        """PUT creates (201) and replaces (204), GET lists and reads, DELETE removes (204, then 404)."""
        self.assertEqual(self.get("/api/global-parameters").json(), [])
        self.assertEqual(self.put("/api/global-parameters/g", {"value": {"a": 1}}).code, 201)
        self.assertEqual(self.put("/api/global-parameters/g", {"value": {"a": 2}}).code, 204)
        self.assertEqual(self.get("/api/global-parameters/g").json(), {"value": {"a": 2}, "name": "g"})
        self.assertEqual(self.get("/api/global-parameters").json(), [{"name": "g", "value": {"a": 2}}])
        self.assertError(self.put("/api/global-parameters/h", {}), 400, "bad_request", "[{key_missing,value}]")
        self.assertEqual(self.delete("/api/global-parameters/g").code, 204)
        self.assertError(self.delete("/api/global-parameters/g"), 404, "Object Not Found", "Not Found")
        self.assertError(self.get("/api/global-parameters/g"), 404, "Object Not Found", "Not Found")

    def test_clusterName(self):
        """The cluster_name global parameter is the overview's cluster_name."""
        self.put("/api/global-parameters/cluster_name", {"value": "blue"})
        self.assertEqual(self.get("/api/overview").json()["cluster_name"], "blue")

    def test_globalParametersAuthorisation(self):
        """Policymakers may use global parameters; management and monitoring users get 401."""
        for name, tag in (("pol", "policymaker"), ("mgmt", "management"), ("mon", "monitoring")):
            self.broker.addUser(name, "pw", [tag])
        self.assertEqual(self.put("/api/global-parameters/g", {"value": 1}, auth=("pol", "pw")).code, 201)
        for name in ("mgmt", "mon"):
            self.assertError(self.get("/api/global-parameters", auth=(name, "pw")), 401, "not_authorised",
                             "User not authorised to access object")

    def test_unknownComponent(self):
        """PUT of an unknown component is 400 component not found; GET lists nothing, one is 404."""
        self.assertError(self.put("/api/parameters/foo/%2F/x", {"value": 1}), 400, "bad_request",
                         "Validation failed\n\ncomponent foo not found\n")
        self.assertError(self.put("/api/parameters/foo/nope/x", {"value": 1}), 404, "not_found",
                         "vhost_not_found")
        self.assertEqual(self.get("/api/parameters/foo").json(), [])
        self.assertEqual(self.get("/api/parameters/foo/%2F").json(), [])
        self.assertError(self.get("/api/parameters/foo/%2F/x"), 404, "Object Not Found", "Not Found")
        self.assertError(self.delete("/api/parameters/foo/%2F/x"), 404, "Object Not Found", "Not Found")

    def test_vhostLimitsComponent(self):
        """Vhost limits are the vhost-limits/{v}/limits parameter: listed, set and deleted through it."""
        self.put("/api/vhost-limits/%2F/max-queues", {"value": 4})
        entry = {"value": {"max-queues": 4}, "vhost": "/", "component": "vhost-limits", "name": "limits"}
        self.assertEqual(self.get("/api/parameters").json(), [entry])
        self.assertEqual(self.get("/api/parameters/vhost-limits/%2F").json(), [entry])
        self.assertEqual(self.get("/api/parameters/vhost-limits/%2F/limits").json(), entry)
        self.assertEqual(self.put("/api/parameters/vhost-limits/%2F/limits",
                                  {"value": {"max-connections": 2}}).code, 204)
        self.assertEqual(self.vh.limits, {"max-connections": 2})
        self.assertError(self.put("/api/parameters/vhost-limits/%2F/limits", {"value": {"max-queues": "x"}}),
                         400, "bad_request",
                         'Validation failed\n\nmax-queues should be a number, actually was &lt;&lt;"x"&gt;&gt;\n')
        self.assertEqual(self.delete("/api/parameters/vhost-limits/%2F/limits").code, 204)
        self.assertEqual((self.vh.limits, self.get("/api/vhost-limits").json()), (None, []))

    def test_parametersAuthorisation(self):
        """Parameters need a policymaker with the vhost (is_authorized_policies); others get 401."""
        self.put("/api/vhost-limits/%2F/max-queues", {"value": 4})
        for name, tag in (("pol", "policymaker"), ("mgmt", "management")):
            self.broker.addUser(name, "pw", [tag])
            self.broker.setPermissions(name, "/")
        self.assertEqual(len(self.get("/api/parameters/vhost-limits/%2F", auth=("pol", "pw")).json()), 1)
        self.assertError(self.get("/api/parameters/vhost-limits/%2F", auth=("mgmt", "pw")), 401,
                         "not_authorised", "User not authorised to access object")


class UserBulkDeleteTests(WebTestCase):
    """POST /api/users/bulk-delete as RabbitMQ 3.10."""

    def test_deletesInOrder(self):
        """Listed users go (204) with their permissions."""
        for name in ("a", "b", "c"):
            self.broker.addUser(name, "pw")
            self.broker.setPermissions(name, "/")
        self.assertEqual(self.post("/api/users/bulk-delete", {"users": ["a", "b"]}).code, 204)
        self.assertEqual(sorted(self.broker.users), ["c", "guest"])
        self.assertNotIn(("a", "/"), self.broker.permissions)

    def test_stopsAtMissing(self):
        """The first missing user is 400 ["no_such_user", name]; users before it are deleted, after it kept."""
        for name in ("a", "b"):
            self.broker.addUser(name, "pw")
        self.assertError(self.post("/api/users/bulk-delete", {"users": ["a", "nobody", "b"]}), 400,
                         "bad_request", ["no_such_user", "nobody"])
        self.assertEqual(sorted(self.broker.users), ["b", "guest"])

    def test_validation(self):
        """No users key is 400 key_missing; non-administrators get 401."""
        self.assertError(self.post("/api/users/bulk-delete", {}), 400, "bad_request", "[{key_missing,users}]")
        self.broker.addUser("mgmt", "pw", ["management"])
        self.assertError(self.post("/api/users/bulk-delete", {"users": []}, auth=("mgmt", "pw")), 401,
                         "not_authorised", "Not administrator user")


class UserLimitTests(WebTestCase):
    """/api/user-limits and their enforcement on AMQP (checked on RabbitMQ 3.10)."""

    def setUp(self):
        WebTestCase.setUp(self)
        self.broker.addUser("u", "pw")
        self.broker.setPermissions("u", "/")

    def limit(self, name, value, user="u"):
        return self.put("/api/user-limits/%s/%s" % (user, name), {"value": value})

    def handshake(self):
        """An in-memory AMQP connection as u, and the connection.close replies of its handshake."""
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), handshake=False)
        return c, [(m.reply_code, m.reply_text) for _, m, _ in c.handshake(user="u", password="pw")
                   if isinstance(m, spec.ConnectionClose)]

    def test_putListDelete(self):
        """PUT sets (204), the lists and the user show it, DELETE removes it."""
        self.assertEqual(self.limit("max-channels", 3).code, 204)
        self.assertEqual(self.limit("max-connections", 1).code, 204)
        expected = [{"user": "u", "value": {"max-channels": 3, "max-connections": 1}}]
        self.assertEqual(self.get("/api/user-limits").json(), expected)
        self.assertEqual(self.get("/api/user-limits/u").json(), expected)
        self.assertEqual(self.get("/api/users/u").json()["limits"], {"max-channels": 3, "max-connections": 1})
        self.assertEqual(self.delete("/api/user-limits/u/max-channels").code, 204)
        self.delete("/api/user-limits/u/max-connections")
        self.assertEqual(self.get("/api/user-limits/u").json(), [])
        self.assertError(self.get("/api/user-limits/nobody"), 404, "Object Not Found", "Not Found")

    def test_validation(self):
        """Bad values, names and users answer 400 with RabbitMQ's texts."""
        self.assertError(self.limit("max-channels", "x"), 400, "bad_request",
                         'max-channels should be a number, actually was <<"x">>')
        self.assertError(self.limit("foo", 1), 400, "bad_request",
                         'Unrecognised terms [{<<"foo">>,1}] in user-limits')
        self.assertError(self.limit("max-channels", 1, user="nobody"), 400, "bad_request",
                         ["no_such_user", "nobody"])
        self.assertEqual(self.broker.userLimits, {})

    def test_deletedWithUser(self):
        """Deleting the user drops its limits."""
        self.limit("max-channels", 3)
        self.delete("/api/users/u")
        self.assertEqual(self.broker.userLimits, {})

    def test_connectionLimit(self):
        """A connection over the user's max-connections is 530 with RabbitMQ's text."""
        self.limit("max-connections", 1)
        self.assertEqual(self.handshake()[1], [])
        self.assertEqual(self.handshake()[1], [(530, "NOT_ALLOWED - connection refused for user 'u': "
                                                     "user connection limit (1) is reached")])

    def test_channelLimit(self):
        """channel.open over the user's max-channels (across its connections) closes the connection with 530."""
        self.limit("max-channels", 1)
        first, _ = self.handshake()
        first.openChannel(1)
        second, _ = self.handshake()
        closes = [(m.reply_code, m.reply_text) for _, m, _ in second.openChannel(1)
                  if isinstance(m, spec.ConnectionClose)]
        self.assertEqual(closes, [(530, "NOT_ALLOWED - number of channels opened for user 'u' has reached "
                                        "the maximum allowed user limit of (1)")])


class OperatorPolicyTests(WebTestCase):
    """/api/operator-policies and RabbitMQ's merge with user policies (checked on 3.10)."""

    def test_createListDelete(self):
        """PUT 201 then 204, listed and read as policies are, DELETE 204 then 404."""
        body = {"pattern": "^q", "definition": {"max-length": 10}, "apply-to": "queues", "priority": 0}
        self.assertEqual(self.put("/api/operator-policies/%2F/op", body).code, 201)
        self.assertEqual(self.put("/api/operator-policies/%2F/op", body).code, 204)
        expected = {"vhost": "/", "name": "op", "pattern": "^q", "apply-to": "queues",
                    "definition": {"max-length": 10}, "priority": 0}
        self.assertEqual(self.get("/api/operator-policies").json(), [expected])
        self.assertEqual(self.get("/api/operator-policies/%2F").json(), [expected])
        self.assertEqual(self.get("/api/operator-policies/%2F/op").json(), expected)
        self.assertEqual(self.delete("/api/operator-policies/%2F/op").code, 204)
        self.assertError(self.delete("/api/operator-policies/%2F/op"), 404, "Object Not Found", "Not Found")

    def test_onlyOperatorKeys(self):
        """A key operator policies cannot set is 400 not recognised, not HTML-escaped; non-administrators get 401."""
        self.assertError(self.put("/api/operator-policies/%2F/op", {"pattern": "^q", "definition": {
            "dead-letter-exchange": "x"}}), 400, "bad_request",
            'Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings\n')
        self.broker.addUser("pol", "pw", ["policymaker"])
        self.broker.setPermissions("pol", "/")
        self.assertEqual(self.get("/api/operator-policies", auth=("pol", "pw")).code, 401)

    def test_mergedWithPolicy(self):
        """A queue gets both definitions, the lower value for a key both set, as RabbitMQ merges them."""
        self.put("/api/operator-policies/%2F/op", {"pattern": "^q", "definition": {
            "max-length": 10, "message-ttl": 5000}, "apply-to": "queues"})
        self.put("/api/policies/%2F/p", {"pattern": "^q", "definition": {
            "max-length": 5, "message-ttl": 9000, "expires": 100000}})
        self.put("/api/queues/%2F/q1")
        q = self.get("/api/queues/%2F/q1").json()
        self.assertEqual((q["policy"], q["operator_policy"], q["effective_policy_definition"]), (
            "p", "op", {"expires": 100000, "max-length": 5, "message-ttl": 5000}))
        settings = self.vh.queues["q1"].settings
        self.assertEqual((settings.maxLength, settings.messageTtl, settings.expires), (5, 5000, 100000))

    def test_aloneApplies(self):
        """Without a user policy the operator policy's values apply; deleting it lifts them."""
        self.put("/api/queues/%2F/q1")
        self.put("/api/operator-policies/%2F/op", {"pattern": "^q", "definition": {"max-length": 2}})
        self.assertEqual(self.vh.queues["q1"].settings.maxLength, 2)
        self.delete("/api/operator-policies/%2F/op")
        self.assertIsNone(self.vh.queues["q1"].settings.maxLength)
        self.assertIsNone(self.get("/api/queues/%2F/q1").json()["operator_policy"])
