"""
End-to-end tests of the management HTTP API with real treq over TCP.

By default they start otter_tx in-process with management on a free port
(``otter_tx.testing.startBroker(reactor, management=True)``).  When
``OTTER_TEST_MGMT_URL`` is set (for example ``http://127.0.0.1:15682`` for
the RabbitMQ 3.10.8 peer, guest/guest) they run against that management
instance instead, so shapes and status codes are checked against the real
thing.  Every test deletes what it creates; names carry a unique suffix.
RabbitMQ refreshes queue statistics every few seconds, so these tests read
messages back with ``/get`` rather than counters.
"""

import json
import os
import uuid
from urllib.parse import quote

import treq
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks, returnValue
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

EXTERNAL_MGMT = os.environ.get("OTTER_TEST_MGMT_URL")
GUEST = ("guest", "guest")


class ManagementHTTPCase(TestCase):
    """
    Base for tests over real HTTP: ``self.base`` is otter_tx's management
    URL (in-process broker in ``self.fixture``) or ``OTTER_TEST_MGMT_URL``;
    paths in ``self.cleanups`` are DELETEd as guest when the test ends
    (also when a subclass's setUp fails half-way), last first.
    """

    timeout = 30

    @inlineCallbacks
    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.cleanups = []
        self.fixture = None
        self.addCleanup(self._finish)  # cleanups run last-added first: this one runs last
        if EXTERNAL_MGMT:
            self.base = EXTERNAL_MGMT.rstrip("/")
        else:
            from otter_tx.testing import startBroker

            self.fixture = yield startBroker(reactor, management=True)
            self.base = "http://127.0.0.1:%d" % (self.fixture.managementPort,)

    @inlineCallbacks
    def _finish(self):
        """Delete ``self.cleanups`` (last first), close the pool, stop the in-process broker."""
        for path in reversed(self.cleanups):
            try:
                yield self.call("DELETE", path)
            except Exception:
                pass
        yield self.pool.closeCachedConnections()
        if self.fixture is not None:
            yield self.fixture.stop()

    def name(self, base):
        """A unique entity name."""
        return "%s-%s" % (base, uuid.uuid4().hex[:10])

    @inlineCallbacks
    def call(self, method, path, body=None, auth=GUEST, headers=None):
        """``(status, decoded JSON or None, response)`` for one request."""
        kw = {"pool": self.pool}
        if auth is not None:
            kw["auth"] = auth
        if body is not None:
            kw["json"] = body
        if headers:
            kw["headers"] = headers
        resp = yield treq.request(method, self.base + path, **kw)
        raw = yield resp.content()
        data = None
        if raw:
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError):  # not JSON, or another test's deeply nested arguments
                data = raw
        returnValue((resp.code, data, resp))


class ManagementInteropTests(ManagementHTTPCase):
    """The management API over real HTTP (otter_tx, or RabbitMQ with OTTER_TEST_MGMT_URL)."""

    @inlineCallbacks
    def test_authFailures(self):
        """Missing credentials are 401 without a body; wrong ones 401 not_authorized Login failed."""
        code, data, resp = yield self.call("GET", "/api/overview", auth=None)
        self.assertEqual((code, data), (401, None))
        self.assertTrue(resp.headers.hasHeader(b"www-authenticate"))
        code, data, _ = yield self.call("GET", "/api/overview", auth=("guest", "wrong"))
        self.assertEqual((code, data), (401, {"error": "not_authorized", "reason": "Login failed"}))

    @inlineCallbacks
    def test_nonManagementUser(self):
        """A user without tags gets 401 not_authorised Not management user; a management user 401 on /api/users."""
        plain, mgmt = self.name("plain"), self.name("mgmt")
        for user, tags in ((plain, ""), (mgmt, "management")):
            code, _, _ = yield self.call("PUT", "/api/users/" + user, {"password": "pw", "tags": tags})
            self.assertEqual(code, 201)
            self.cleanups.append("/api/users/" + user)
        code, data, _ = yield self.call("GET", "/api/overview", auth=(plain, "pw"))
        self.assertEqual((code, data), (401, {"error": "not_authorised", "reason": "Not management user"}))
        code, data, _ = yield self.call("GET", "/api/users", auth=(mgmt, "pw"))
        self.assertEqual((code, data), (401, {"error": "not_authorised", "reason": "Not administrator user"}))
        code, data, _ = yield self.call("GET", "/api/whoami", auth=(mgmt, "pw"))
        self.assertEqual((code, data), (200, {"name": mgmt, "tags": ["management"]}))

    @inlineCallbacks
    def test_policyLifecycle(self):
        """Policy PUT 201, PUT 204, GET shape, DELETE 204, GET 404."""
        p = self.name("pol")
        path = "/api/policies/%2F/" + p
        self.cleanups.append(path)
        body = {"pattern": "^" + p, "definition": {"message-ttl": 5000, "max-length": 10}, "priority": 2,
                "apply-to": "queues"}
        code, _, _ = yield self.call("PUT", path, body)
        self.assertEqual(code, 201)
        code, _, _ = yield self.call("PUT", path, body)
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("GET", path)
        self.assertEqual((code, data), (200, {"vhost": "/", "name": p, "pattern": "^" + p, "apply-to": "queues",
                                              "definition": {"message-ttl": 5000, "max-length": 10},
                                              "priority": 2}))
        code, data, _ = yield self.call("GET", "/api/policies/%2F")
        self.assertIn(p, [x["name"] for x in data])
        code, _, _ = yield self.call("DELETE", path)
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("GET", path)
        self.assertEqual((code, data), (404, {"error": "Object Not Found", "reason": "Not Found"}))

    @inlineCallbacks
    def test_policyValidation(self):
        """Invalid policies are 400 bad_request with RabbitMQ's Validation failed texts."""
        path = "/api/policies/%2F/" + self.name("pol")
        self.cleanups.append(path)
        cases = [
            ({"pattern": ".*", "definition": {"message-ttl": -5}},
             "Validation failed\n\n-5 is not a valid message TTL\n"),
            ({"pattern": ".*", "definition": {"expires": 0}}, "Validation failed\n\n0 is not a valid queue expiry\n"),
            ({"pattern": "x", "definition": {"x-message-ttl": 5}},
             'Validation failed\n\n[{&lt;&lt;"x-message-ttl"&gt;&gt;,5}] are not recognised policy settings\n'),
            ({"pattern": "x", "definition": {}}, "Validation failed\n\nno policy provided\n"),
            ({"definition": {"message-ttl": 5}}, "[{key_missing,pattern}]"),
        ]
        for body, reason in cases:
            code, data, _ = yield self.call("PUT", path, body)
            self.assertEqual((code, data), (400, {"error": "bad_request", "reason": reason}))

    @inlineCallbacks
    def test_policyApplyTo(self):
        """
        RabbitMQ 3.10 accepts apply-to queues, exchanges and all only: 3.12's classic_queues, quorum_queues
        and streams are 400 on PUT, and a definitions import with one is 400 and creates nothing.
        """
        p = self.name("pol")
        path = "/api/policies/%2F/" + p
        self.cleanups.append(path)
        for applyTo in ("classic_queues", "quorum_queues", "streams"):
            code, data, _ = yield self.call("PUT", path, {"pattern": "^" + p, "definition": {"message-ttl": 5},
                                                          "apply-to": applyTo})
            self.assertEqual((code, data), (400, {"error": "bad_request", "reason":
                                                  "Validation failed\n\napply-to '%s' unrecognised; should be "
                                                  "'queues', 'exchanges' or 'all'\n" % (applyTo,)}))
        defs = {"policies": [{"vhost": "/", "name": p, "pattern": "^" + p, "apply-to": "classic_queues",
                              "definition": {"message-ttl": 5}, "priority": 0}]}
        code, data, _ = yield self.call("POST", "/api/definitions", defs)
        self.assertEqual(code, 400)
        self.assertIn("apply-to 'classic_queues' unrecognised", data["reason"])
        code, _, _ = yield self.call("GET", path)
        self.assertEqual(code, 404)
        for applyTo in ("queues", "exchanges", "all"):
            code, _, _ = yield self.call("PUT", path, {"pattern": "^" + p, "definition": {"message-ttl": 5},
                                                       "apply-to": applyTo})
            self.assertIn(code, (201, 204))

    @inlineCallbacks
    def test_noMetricsOnManagementPort(self):
        """The management port serves no Prometheus metrics: /metrics and its sub-paths are 404, as on 15672."""
        for path in ("/metrics", "/metrics/per-object", "/metrics/detailed"):
            for auth in (None, GUEST):
                code, data, _ = yield self.call("GET", path, auth=auth)
                self.assertEqual((code, data), (404, {"error": "Object Not Found", "reason": "Not Found"}), path)

    @inlineCallbacks
    def test_queueLifecycle(self):
        """Queue PUT 201/204, inequivalent 400, GET fields, publish + get, purge, DELETE 204 then 404."""
        q = self.name("q")
        path = "/api/queues/%2F/" + q
        self.cleanups.append(path)
        body = {"durable": False, "auto_delete": False, "arguments": {"x-message-ttl": 60000}}
        code, _, _ = yield self.call("PUT", path, body)
        self.assertEqual(code, 201)
        code, _, _ = yield self.call("PUT", path, body)
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("PUT", path, dict(body, arguments={"x-message-ttl": 1000}))
        self.assertEqual((code, data), (400, {"error": "bad_request", "reason":
                                              "inequivalent arg 'x-message-ttl' for queue '%s' in vhost '/': "
                                              "received '1000' but current is '60000'" % (q,)}))
        code, data, _ = yield self.call("GET", path)
        self.assertEqual({k: data[k] for k in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments",
                                               "type")},
                         {"name": q, "vhost": "/", "durable": False, "auto_delete": False, "exclusive": False,
                          "arguments": {"x-message-ttl": 60000}, "type": "classic"})
        pub = {"properties": {}, "routing_key": q, "payload": "hello", "payload_encoding": "string"}
        code, data, _ = yield self.call("POST", "/api/exchanges/%2F/amq.default/publish", pub)
        self.assertEqual((code, data), (200, {"routed": True}))
        get = {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 50000}
        code, data, _ = yield self.call("POST", path + "/get", get)
        self.assertEqual((code, data), (200, [{"payload_bytes": 5, "redelivered": False, "exchange": "",
                                               "routing_key": q, "message_count": 0, "properties": [],
                                               "payload": "hello", "payload_encoding": "string"}]))
        code, data, _ = yield self.call("DELETE", path + "?if-empty=true")
        self.assertEqual((code, data), (400, {"error": "bad_request",
                                              "reason": "queue '%s' in vhost '/' not empty" % (q,)}))
        code, _, _ = yield self.call("DELETE", path + "/contents")
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("POST", path + "/get", get)
        self.assertEqual((code, data), (200, []))
        code, _, _ = yield self.call("DELETE", path)
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("GET", path)
        self.assertEqual((code, data), (404, {"error": "Object Not Found", "reason": "Not Found"}))

    @inlineCallbacks
    def test_trailingSlash(self):
        """
        One trailing slash names the same resource, for every method (cowboy's router):
        rabbitmq-stream-js-client's own suite lists ``/api/stream/consumers/%2F/``.
        """
        q = self.name("q")
        path = "/api/queues/%2F/" + q
        self.cleanups.append(path)
        code, _, _ = yield self.call("PUT", path + "/", {"durable": False})
        self.assertEqual(code, 201)
        code, data, _ = yield self.call("GET", path + "/")
        self.assertEqual((code, data["name"]), (200, q))
        code, data, _ = yield self.call("GET", "/api/queues/%2F/")
        self.assertEqual(code, 200)
        self.assertIn(q, [x["name"] for x in data])
        for listing in ("/api/overview/", "/api/exchanges/", "/api/consumers/%2F/", "/api/stream/consumers/%2F/",
                        "/api/stream/publishers/%2F/", "/api/stream/connections/%2F/"):
            code, data, _ = yield self.call("GET", listing)
            self.assertEqual(code, 200, listing)
        code, _, _ = yield self.call("DELETE", path + "/")
        self.assertEqual(code, 204)
        code, _, _ = yield self.call("GET", path)
        self.assertEqual(code, 404)

    @inlineCallbacks
    def test_queueErrors(self):
        """Reserved names are 401 Access refused; invalid arguments 400 invalid arg; bad get encoding 400."""
        code, data, _ = yield self.call("PUT", "/api/queues/%2F/amq." + self.name("q"), {})
        self.assertEqual((code, data), (401, {"error": "not_authorised", "reason": "Access refused."}))
        q = self.name("q")
        self.cleanups.append("/api/queues/%2F/" + q)
        code, data, _ = yield self.call("PUT", "/api/queues/%2F/" + q, {"arguments": {"x-message-ttl": -1}})
        self.assertEqual((code, data), (400, {"error": "bad_request", "reason":
                                              "invalid arg 'x-message-ttl' for queue '%s' in vhost '/': "
                                              "{value_negative,-1}" % (q,)}))
        yield self.call("PUT", "/api/queues/%2F/" + q, {})
        code, data, _ = yield self.call("POST", "/api/queues/%%2F/%s/get" % (q,),
                                        {"count": 1, "ackmode": "ack_requeue_true", "encoding": "zz"})
        self.assertEqual((code, data), (400, {"error": "bad_request",
                                              "reason": "Unsupported encoding. Please use auto or base64."}))

    @inlineCallbacks
    def test_publishErrors(self):
        """Publish: bad expiration and missing exchange are 400 with the AMQP code and text."""
        pub = {"properties": {"expiration": "abc"}, "routing_key": "x", "payload": "p",
               "payload_encoding": "string"}
        code, data, _ = yield self.call("POST", "/api/exchanges/%2F/amq.default/publish", pub)
        self.assertEqual((code, data), (400, {"error": "bad_request", "reason":
                                              "406 PRECONDITION_FAILED - invalid expiration 'abc': no_integer"}))
        x = self.name("nosuchx")
        code, data, _ = yield self.call("POST", "/api/exchanges/%%2F/%s/publish" % (x,),
                                        dict(pub, properties={}))
        self.assertEqual((code, data), (400, {"error": "bad_request", "reason":
                                              "404 NOT_FOUND - no exchange '%s' in vhost '/'" % (x,)}))
        code, data, _ = yield self.call("POST", "/api/exchanges/%2F/amq.direct/publish",
                                        dict(pub, properties={}, routing_key=self.name("none")))
        self.assertEqual((code, data), (200, {"routed": False}))

    @inlineCallbacks
    def test_exchangeAndBindings(self):
        """Exchange PUT 201/204, type mismatch 400, binding POST 201 + Location, GET/DELETE by properties_key."""
        x, q = self.name("x"), self.name("q")
        self.cleanups.append("/api/queues/%2F/" + q)
        self.cleanups.append("/api/exchanges/%2F/" + x)
        code, _, _ = yield self.call("PUT", "/api/exchanges/%2F/" + x, {"type": "topic", "durable": False})
        self.assertEqual(code, 201)
        code, _, _ = yield self.call("PUT", "/api/exchanges/%2F/" + x, {"type": "topic", "durable": False})
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("PUT", "/api/exchanges/%2F/" + x, {"type": "direct", "durable": False})
        self.assertEqual((code, data), (400, {"error": "bad_request", "reason":
                                              "inequivalent arg 'type' for exchange '%s' in vhost '/': received "
                                              "'direct' but current is 'topic'" % (x,)}))
        code, data, _ = yield self.call("GET", "/api/exchanges/%2F/" + x)
        self.assertEqual({k: data[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal",
                                               "arguments")},
                         {"name": x, "vhost": "/", "type": "topic", "durable": False, "auto_delete": False,
                          "internal": False, "arguments": {}})
        yield self.call("PUT", "/api/queues/%2F/" + q, {})
        code, _, resp = yield self.call("POST", "/api/bindings/%%2F/e/%s/q/%s" % (x, q),
                                        {"routing_key": "a.*", "arguments": {}})
        self.assertEqual((code, resp.headers.getRawHeaders(b"location")), (201, [("%s/a.%%252A" % (q,)).encode()]))
        code, data, _ = yield self.call("GET", "/api/bindings/%%2F/e/%s/q/%s" % (x, q))
        self.assertEqual(data, [{"source": x, "vhost": "/", "destination": q, "destination_type": "queue",
                                 "routing_key": "a.*", "arguments": {}, "properties_key": "a.%2A"}])
        code, data, _ = yield self.call("DELETE", "/api/exchanges/%%2F/%s?if-unused=true" % (x,))
        self.assertEqual((code, data), (400, {"error": "bad_request",
                                              "reason": "exchange '%s' in vhost '/' in use" % (x,)}))
        pub = {"properties": {}, "routing_key": "a.b", "payload": "p", "payload_encoding": "string"}
        code, data, _ = yield self.call("POST", "/api/exchanges/%%2F/%s/publish" % (x,), pub)
        self.assertEqual(data, {"routed": True})
        code, _, _ = yield self.call("DELETE", "/api/bindings/%%2F/e/%s/q/%s/%s" % (x, q, quote("a.%2A", safe="")))
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("GET", "/api/bindings/%%2F/e/%s/q/%s" % (x, q))
        self.assertEqual((code, data), (200, []))
        code, _, _ = yield self.call("DELETE", "/api/exchanges/%2F/" + x)
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("DELETE", "/api/exchanges/%2F/" + x)
        self.assertEqual((code, data), (404, {"error": "Object Not Found", "reason": "Not Found"}))

    @inlineCallbacks
    def test_reservedExchanges(self):
        """Declaring amq.* and deleting amq.direct are 401 Access refused; bogus types 400."""
        code, data, _ = yield self.call("PUT", "/api/exchanges/%2F/amq." + self.name("x"), {"type": "direct"})
        self.assertEqual((code, data), (401, {"error": "not_authorised", "reason": "Access refused."}))
        code, data, _ = yield self.call("DELETE", "/api/exchanges/%2F/amq.direct")
        self.assertEqual((code, data), (401, {"error": "not_authorised", "reason": "Access refused."}))
        x = self.name("x")
        self.cleanups.append("/api/exchanges/%2F/" + x)
        # a never-seen type name: RabbitMQ says "invalid" only for names that happen to be
        # existing Erlang atoms, "unknown" otherwise (otter_tx always says "unknown")
        bogus = "bogus-" + uuid.uuid4().hex
        code, data, _ = yield self.call("PUT", "/api/exchanges/%2F/" + x, {"type": bogus})
        self.assertEqual((code, data), (400, {"error": "bad_request", "reason": "unknown exchange type '%s'" % bogus}))

    @inlineCallbacks
    def test_overviewAndLists(self):
        """overview has the documented keys; vhosts, users, permissions, whoami and health answer."""
        code, data, _ = yield self.call("GET", "/api/overview")
        self.assertEqual(code, 200)
        for key in ("product_name", "product_version", "rabbitmq_version", "management_version",
                    "exchange_types", "object_totals", "queue_totals", "node"):
            self.assertIn(key, data)
        self.assertEqual(sorted(data["object_totals"]), ["channels", "connections", "consumers", "exchanges",
                                                         "queues"])
        code, data, _ = yield self.call("GET", "/api/vhosts")
        self.assertIn("/", [v["name"] for v in data])
        code, data, _ = yield self.call("GET", "/api/users")
        guest = [u for u in data if u["name"] == "guest"][0]
        self.assertEqual((guest["tags"], guest["hashing_algorithm"]), (["administrator"],
                                                                       "rabbit_password_hashing_sha256"))
        code, data, _ = yield self.call("GET", "/api/permissions")
        self.assertIn({"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}, data)
        code, data, _ = yield self.call("GET", "/api/whoami")
        self.assertEqual(data, {"name": "guest", "tags": ["administrator"]})
        code, data, _ = yield self.call("GET", "/api/healthchecks/node")
        self.assertEqual((code, data), (200, {"status": "ok"}))
        code, data, _ = yield self.call("GET", "/api/queues?page=1&page_size=501")
        self.assertEqual((code, data), (400, {"error": "invalid_pagination_parameters", "reason":
                                              "Invalid pagination parameters: page number 1, page size 501"}))

    @inlineCallbacks
    def test_listNameFilterIgnoresCase(self):
        """A list's name filter ignores case, as a substring and with use_regex=true."""
        n = self.name("Filter")
        for suffix in ("-Alpha", "-alpha-2", "-beta"):
            self.cleanups.append("/api/queues/%2F/" + n + suffix)
            yield self.call("PUT", "/api/queues/%2F/" + n + suffix, {})
        found = {}
        for q in ("name=" + n.upper() + "-ALPHA", "name=%5E" + n.lower() + "-ALPHA%24&use_regex=true"):
            code, data, _ = yield self.call("GET", "/api/queues/%2F?page=1&page_size=100&columns=name&" + q)
            found[q.split("&")[-1]] = (code, sorted(i["name"] for i in data["items"]))
        self.assertEqual(found, {"name=" + n.upper() + "-ALPHA": (200, [n + "-Alpha", n + "-alpha-2"]),
                                 "use_regex=true": (200, [n + "-Alpha"])})

    @inlineCallbacks
    def test_vhostAndPermissions(self):
        """vhost PUT 201/204 grants the creator permissions (PUT again 204); DELETE 204/404; missing user 400."""
        v = self.name("vh")
        self.cleanups.append("/api/vhosts/" + v)
        code, _, _ = yield self.call("PUT", "/api/vhosts/" + v, {})
        self.assertEqual(code, 201)
        code, _, _ = yield self.call("PUT", "/api/vhosts/" + v, {})
        self.assertEqual(code, 204)
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        code, data, _ = yield self.call("GET", "/api/permissions/%s/guest" % (v,))
        self.assertEqual((code, data), (200, dict(perms, user="guest", vhost=v)))
        code, _, _ = yield self.call("PUT", "/api/permissions/%s/guest" % (v,), perms)
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("PUT", "/api/permissions/%s/%s" % (v, self.name("nobody")), perms)
        self.assertEqual((code, data), (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"}))
        code, _, _ = yield self.call("DELETE", "/api/vhosts/" + v)
        self.assertEqual(code, 204)
        code, data, _ = yield self.call("DELETE", "/api/vhosts/" + v)
        self.assertEqual((code, data), (404, {"error": "Object Not Found", "reason": "Not Found"}))

    @inlineCallbacks
    def test_methodNotAllowed(self):
        """POST on a policy is 405 with an allow header."""
        code, _, resp = yield self.call("POST", "/api/policies/%2F/" + self.name("p"), {})
        self.assertEqual(code, 405)
        self.assertIn(b"PUT", resp.headers.getRawHeaders(b"allow")[0])


EXTERNAL_AMQP = os.environ.get("OTTER_TEST_AMQP_URL")

_LOCKED = ("cannot obtain exclusive access to locked queue '%s' in vhost '/'. It could be originally "
           "declared on another connection or the exclusive property value does not match that of the "
           "original declaration.")


class ExclusiveQueueTests(ManagementHTTPCase):
    """
    Another connection's exclusive queue over HTTP: every operation is
    refused with AMQP's 405 RESOURCE_LOCKED text, as RabbitMQ's management
    plugin runs them over a channel of its own (the HTTP door goes through a
    Session with the AMQP rules).
    """

    @inlineCallbacks
    def setUp(self):
        from twisted.internet.threads import deferToThread
        from twisted.trial.unittest import SkipTest

        if EXTERNAL_MGMT and not EXTERNAL_AMQP:
            raise SkipTest("against an external broker this needs OTTER_TEST_AMQP_URL as well")
        try:
            import pika  # noqa: F401
        except ImportError:
            raise SkipTest("pika is not installed")
        yield ManagementHTTPCase.setUp(self)
        self.queue = self.name("exclusive")
        self.conn = yield deferToThread(self._declare)
        self.addCleanup(deferToThread, self.conn.close)

    def _declare(self):
        """A pika connection owning the exclusive queue, bound to amq.direct with ``k2``, one message in it."""
        import pika

        if self.fixture is not None:
            params = pika.ConnectionParameters("127.0.0.1", self.fixture.amqpPort, heartbeat=0)
        else:
            params = pika.URLParameters(EXTERNAL_AMQP)
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare(self.queue, exclusive=True)
        ch.queue_bind(self.queue, "amq.direct", "k2")
        ch.basic_publish("", self.queue, b"mine")
        ch.queue_declare(self.queue, passive=True)  # a round trip: the publish is in
        return conn

    @inlineCallbacks
    def test_operationsRefused(self):
        """get, purge, bind, unbind, declare and delete on it answer 400 with RabbitMQ's texts."""
        q = quote(self.queue, safe="")
        locked = _LOCKED % (self.queue,)
        cases = [
            ("POST", "/api/queues/%2F/" + q + "/get",
             {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}, "405 RESOURCE_LOCKED - " + locked),
            ("DELETE", "/api/queues/%2F/" + q + "/contents", None, locked),
            ("POST", "/api/bindings/%2F/e/amq.direct/q/" + q, {"routing_key": "k"}, locked),
            ("DELETE", "/api/bindings/%2F/e/amq.direct/q/" + q + "/k2", None, locked),
            ("PUT", "/api/queues/%2F/" + q, {"durable": False}, locked),
            ("DELETE", "/api/queues/%2F/" + q, None, locked),
        ]
        for method, path, body, reason in cases:
            code, data, _ = yield self.call(method, path, body)
            self.assertEqual((code, data), (400, {"error": "bad_request", "reason": reason}), (method, path))
