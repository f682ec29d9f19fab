"""
The management API's authorisation, tag by tag and endpoint by endpoint, over
real HTTP (treq) and real AMQP clients (pika in worker threads).

By default otter_tx runs in-process (``startBroker(management=True)``).  With
``OTTER_TEST_MGMT_URL`` (and ``OTTER_TEST_AMQP_URL`` for the connection
tests) the same tables run against RabbitMQ 3.10's management plugin, whose
``rabbit_mgmt_wm_*:is_authorized/2`` clauses and per-resource AMQP checks
the expectations were taken from (docs/management.md, "Access model").

Every test makes two vhosts with a unique prefix: ``V``, on which one user
per tag has configure ``^c-``, write ``^w-`` and read ``^r-``, and ``V2``, on
which they have nothing; objects are made as guest (which gets full
permissions on the vhosts it creates, on both brokers).  The cleanups delete
the users and vhosts.  RabbitMQ lists connections and consumers a few
seconds after they open, so :meth:`_poll` waits for them (up to 30 s).
"""

import json
import os
from urllib.parse import quote, urlparse

from twisted.internet.defer import inlineCallbacks, returnValue
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest

from otter_tx.test.interop.support import waitUntilDeferred
from otter_tx.test.interop.test_interop_http import EXTERNAL_MGMT, ManagementHTTPCase

EXTERNAL_AMQP = os.environ.get("OTTER_TEST_AMQP_URL")

#: the tags under test; "none" is a user without tags
TAGS = ("none", "management", "policymaker", "monitoring", "administrator")
MGMT_TAGS = TAGS[1:]

OK = "2xx"  # any success status
NOT_ADMIN = (401, "Not administrator user")
NOT_VHOST = (401, "User not authorised to access virtual host")
NOT_OBJECT = (401, "User not authorised to access object")
REFUSED = (401, "Access refused.")
NOT_FOUND = (404, "Not Found")


def expect(default, **byTag):
    """``{tag: expectation}`` for the four management tags: ``default`` unless overridden."""
    return {tag: byTag.get(tag, default) for tag in MGMT_TAGS}


def adminOnly(other):
    """Administrators succeed; every other management tag gets ``other``."""
    return expect(other, administrator=OK)


def deniedText(kind, name):
    """The AMQP refusal text RabbitMQ sends, with ``{user}`` and ``{v}`` filled in per row."""
    return "ACCESS_REFUSED - access to %s '%s' in vhost '{v}' refused for user '{user}'" % (kind, name)


_GET = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
_PUBLISH = {"routing_key": "", "properties": {}, "payload": "x", "payload_encoding": "string"}

#: (method, path, body, {tag: expectation}); expectation is OK, a status,
#: or (status, reason).  ``{v}``/``{v2}`` are the vhosts, ``{tag}`` the tag
#: (for objects each user makes or deletes once), ``{user}`` the user name.
#: The "none" user is checked on every row: 401 Not management user.
ROWS = [
    # is_authorized: any management user
    ("GET", "/api/overview", None, expect(OK)),
    ("GET", "/api/whoami", None, expect(OK)),
    ("GET", "/api/vhosts", None, expect(OK)),
    ("GET", "/api/queues", None, expect(OK)),
    ("GET", "/api/connections", None, expect(OK)),
    ("GET", "/api/consumers/{v2}", None, expect(OK)),
    # is_authorized_admin
    ("GET", "/api/users", None, adminOnly(NOT_ADMIN)),
    ("GET", "/api/users/{user}", None, adminOnly(NOT_ADMIN)),
    ("GET", "/api/permissions", None, adminOnly(NOT_ADMIN)),
    ("GET", "/api/definitions", None, adminOnly(NOT_ADMIN)),
    ("GET", "/api/vhosts/{v}", None, adminOnly(NOT_ADMIN)),
    ("GET", "/api/vhosts/{v}/permissions", None, adminOnly(NOT_ADMIN)),
    ("DELETE", "/api/vhosts/{v}-nosuch", None, expect(NOT_ADMIN, administrator=NOT_FOUND)),
    ("PUT", "/api/users/{user}-new", {"password": "x", "tags": ""}, adminOnly(NOT_ADMIN)),
    # is_authorized_vhost: administrators, or users with permissions on the vhost
    ("GET", "/api/queues/{v}", None, expect(OK)),
    ("GET", "/api/queues/{v}/w-q", None, expect(OK)),
    ("GET", "/api/queues/{v}/w-q/bindings", None, expect(OK)),
    ("GET", "/api/exchanges/{v}/c-x", None, expect(OK)),
    ("GET", "/api/policies/{v}", None, expect(OK)),
    ("GET", "/api/vhosts/{v}/connections", None, expect(OK)),
    ("GET", "/api/queues/{v2}", None, adminOnly(NOT_VHOST)),
    ("GET", "/api/queues/{v2}/q2", None, adminOnly(NOT_VHOST)),
    ("GET", "/api/exchanges/{v2}", None, adminOnly(NOT_VHOST)),
    ("GET", "/api/exchanges/{v2}/amq.direct/bindings/source", None, adminOnly(NOT_VHOST)),
    ("GET", "/api/bindings/{v2}", None, adminOnly(NOT_VHOST)),
    ("GET", "/api/policies/{v2}", None, adminOnly(NOT_VHOST)),
    ("GET", "/api/vhosts/{v2}/connections", None, adminOnly(NOT_VHOST)),
    ("PUT", "/api/queues/{v2}/c-z", {}, expect(NOT_VHOST, administrator=REFUSED)),
    ("GET", "/api/queues/{v}-nosuch", None, expect(NOT_FOUND)),
    ("GET", "/api/queues/{v}-nosuch/q", None, expect(NOT_FOUND)),
    # is_authorized_policies: administrators, or policymakers with permissions on the vhost
    ("GET", "/api/policies/{v}/pol", None, expect(NOT_OBJECT, policymaker=OK, administrator=OK)),
    ("PUT", "/api/policies/{v}/p-{tag}", {"pattern": "^zz", "definition": {"max-length": 3}},
     expect(NOT_OBJECT, policymaker=OK, administrator=OK)),
    ("PUT", "/api/policies/{v2}/p-{tag}", {"pattern": "^zz", "definition": {"max-length": 3}},
     adminOnly(NOT_OBJECT)),
    ("DELETE", "/api/policies/{v}/nosuch", None, expect(NOT_OBJECT, policymaker=NOT_FOUND, administrator=NOT_FOUND)),
    # configure permission: declare and delete (401 Access refused., as direct_request answers)
    ("PUT", "/api/queues/{v}/c-new-{tag}", {}, expect(OK)),
    ("PUT", "/api/queues/{v}/w-new", {}, expect(REFUSED)),
    ("PUT", "/api/queues/{v}/c-dlq", {"arguments": {"x-dead-letter-exchange": "w-x"}}, expect(REFUSED)),
    ("DELETE", "/api/queues/{v}/c-del-{tag}", None, expect(OK)),
    ("DELETE", "/api/queues/{v}/w-q", None, expect(REFUSED)),
    ("DELETE", "/api/queues/{v}/w-nosuch", None, expect(NOT_FOUND)),
    ("PUT", "/api/exchanges/{v}/c-newx-{tag}", {"type": "direct"}, expect(OK)),
    ("PUT", "/api/exchanges/{v}/w-newx", {"type": "direct"}, expect(REFUSED)),
    ("PUT", "/api/exchanges/{v}/c-ae", {"type": "fanout", "arguments": {"alternate-exchange": "w-x"}},
     expect(REFUSED)),
    ("DELETE", "/api/exchanges/{v}/w-x", None, expect(REFUSED)),
    # read permission: purge and get
    ("DELETE", "/api/queues/{v}/r-q/contents", None, expect(OK)),
    ("DELETE", "/api/queues/{v}/c-q/contents", None, expect(REFUSED)),
    ("DELETE", "/api/queues/{v2}/q2/contents", None, expect(NOT_VHOST, administrator=REFUSED)),
    ("POST", "/api/queues/{v}/r-q/get", _GET, expect(OK)),
    ("POST", "/api/queues/{v}/c-q/get", _GET, expect((401, deniedText("queue", "c-q")))),
    ("POST", "/api/queues/{v}/c-nosuch/get", _GET, expect((401, deniedText("queue", "c-nosuch")))),
    ("POST", "/api/queues/{v2}/q2/get", _GET, expect(NOT_VHOST, administrator=REFUSED)),
    # write permission: publish (400 with the AMQP reply, as 3.10 answers)
    ("POST", "/api/exchanges/{v}/w-x/publish", _PUBLISH, expect(OK)),
    ("POST", "/api/exchanges/{v}/r-x/publish", _PUBLISH, expect((400, "403 " + deniedText("exchange", "r-x")))),
    ("POST", "/api/exchanges/{v}/amq.default/publish", dict(_PUBLISH, routing_key="w-q"),
     expect((400, "403 " + deniedText("exchange", "amq.default")))),
    ("POST", "/api/exchanges/{v2}/amq.direct/publish", _PUBLISH, expect(NOT_VHOST, administrator=REFUSED)),
    # bindings: write on the destination, read on the source
    ("POST", "/api/bindings/{v}/e/r-x/q/w-q", {"routing_key": "k-{tag}"}, expect(OK)),
    ("POST", "/api/bindings/{v}/e/r-x/e/w-x", {"routing_key": "k-{tag}"}, expect(OK)),
    ("POST", "/api/bindings/{v}/e/w-x/q/r-q", {"routing_key": "k"}, expect(REFUSED)),
    ("POST", "/api/bindings/{v}/e/w-x/q/r-nosuch", {"routing_key": "k"}, expect(REFUSED)),
    ("DELETE", "/api/bindings/{v}/e/w-x/q/r-q/k", None, expect(REFUSED)),
    ("DELETE", "/api/bindings/{v}/e/r-x/q/w-q/guest-k", None, expect(OK, monitoring=NOT_FOUND,
                                                                       policymaker=NOT_FOUND,
                                                                       administrator=NOT_FOUND)),
    # the aliveness test runs with the user's permissions
    ("GET", "/api/aliveness-test/{v}", None, expect((401, deniedText("queue", "aliveness-test")))),
    ("GET", "/api/aliveness-test/{v2}", None, expect(NOT_VHOST, administrator=REFUSED)),
]

#: list endpoints: which of the two vhosts each tag's list shows
LISTS = [
    ("/api/queues?columns=vhost", "vhost", expect({"v"}, administrator={"v", "v2"})),
    ("/api/exchanges?columns=vhost", "vhost", expect({"v"}, administrator={"v", "v2"})),
    ("/api/bindings?columns=vhost", "vhost", expect({"v"}, administrator={"v", "v2"})),
    ("/api/policies?columns=vhost", "vhost", expect({"v"}, administrator={"v", "v2"})),
    ("/api/vhosts?columns=name", "name", expect({"v"}, monitoring={"v", "v2"}, administrator={"v", "v2"})),
]


class _ManagementFixture(ManagementHTTPCase):
    """Two vhosts, a user per tag and a few objects, on otter_tx or the external peer."""

    timeout = 120

    @inlineCallbacks
    def setUp(self):
        yield ManagementHTTPCase.setUp(self)
        prefix = self.name("authz")
        self.v, self.v2 = prefix + "-v", prefix + "-v2"
        self.users = {tag: "%s-%s" % (prefix, tag) for tag in TAGS}
        # deleted last first: the vhosts, then the users
        self.cleanups += ["/api/users/" + u + suffix for u in self.users.values() for suffix in ("", "-new")]
        self.cleanups += ["/api/vhosts/" + quote(self.v, safe=""), "/api/vhosts/" + quote(self.v2, safe="")]
        for vh in (self.v, self.v2):
            yield self.ok("PUT", "/api/vhosts/%s" % (quote(vh, safe=""),), {})
        for tag, user in self.users.items():
            yield self.ok("PUT", "/api/users/" + user, {"password": "pw", "tags": "" if tag == "none" else tag})
            yield self.ok("PUT", "/api/permissions/%s/%s" % (quote(self.v, safe=""), user),
                          {"configure": "^c-", "write": "^w-", "read": "^r-"})
        v, v2 = quote(self.v, safe=""), quote(self.v2, safe="")
        for q in ["c-q", "w-q", "r-q"] + ["c-del-" + t for t in TAGS]:
            yield self.ok("PUT", "/api/queues/%s/%s" % (v, q), {})
        yield self.ok("PUT", "/api/queues/%s/q2" % (v2,), {})
        for x in ("c-x", "w-x", "r-x"):
            yield self.ok("PUT", "/api/exchanges/%s/%s" % (v, x), {"type": "fanout"})
        yield self.ok("POST", "/api/bindings/%s/e/w-x/q/r-q" % (v,), {"routing_key": "k"})
        yield self.ok("POST", "/api/bindings/%s/e/r-x/q/w-q" % (v,), {"routing_key": "guest-k"})
        for vh in (v, v2):
            yield self.ok("PUT", "/api/policies/%s/pol" % (vh,), {"pattern": "^zz", "definition": {"max-length": 3}})

    @inlineCallbacks
    def ok(self, method, path, body=None):
        """A guest request that must succeed."""
        code, data, _ = yield self.call(method, path, body)
        self.assertTrue(200 <= code < 300, (method, path, code, data))

    def auth(self, tag):
        return (self.users[tag], "pw")

    @inlineCallbacks
    def _poll(self, check, what, deadline=30.0):
        """Call ``check()`` (a Deferred of a bool) until it is true, every 0.2 s for up to ``deadline`` s."""
        done = yield waitUntilDeferred(check, timeout=deadline)
        if not done:
            self.fail("timed out waiting for %s" % (what,))


class EndpointAuthorisationTests(_ManagementFixture):
    """Every endpoint family, for each tag, as RabbitMQ 3.10 authorises it."""

    def _fill(self, text, tag):
        return text.replace("{v}", self.v).replace("{v2}", self.v2).replace("{tag}", tag).replace(
            "{user}", self.users[tag])

    @inlineCallbacks
    def test_table(self):
        """Each row's status and reason match, for every tag, and a user without tags always gets 401."""
        failures = []
        for method, template, body, expected in ROWS:
            for tag in TAGS:
                path = template.replace("{v}", quote(self.v, safe="")).replace(
                    "{v2}", quote(self.v2, safe="")).replace("{tag}", tag).replace("{user}", self.users[tag])
                b = json.loads(self._fill(json.dumps(body), tag)) if body is not None else None
                code, data, _ = yield self.call(method, path, b, auth=self.auth(tag))
                want = (401, "Not management user") if tag == "none" else expected[tag]
                if want == OK:
                    good = 200 <= code < 300
                elif isinstance(want, int):
                    good = code == want
                else:
                    reason = data.get("reason") if isinstance(data, dict) else data
                    good = (code, reason) == (want[0], self._fill(want[1], tag))
                if not good:
                    failures.append("%s %s as %s: got %s %r, want %r" % (method, template, tag, code, data, want))
        self.assertEqual(failures, [])

    @inlineCallbacks
    def test_lists(self):
        """Object lists show the vhosts the user has permissions on (all for administrators; vhosts for monitoring too)."""
        names = {self.v: "v", self.v2: "v2"}
        for path, field, expected in LISTS:
            for tag in MGMT_TAGS:
                code, data, _ = yield self.call("GET", path, auth=self.auth(tag))
                self.assertEqual(code, 200)
                seen = {names[i[field]] for i in data if i.get(field) in names}
                self.assertEqual(seen, expected[tag], (path, tag))

    @inlineCallbacks
    def test_nonAdminCannotCreateUsersOrVhosts(self):
        """Only administrators create users and vhosts; the refused requests leave nothing behind."""
        for tag in ("management", "policymaker", "monitoring"):
            code, data, _ = yield self.call("PUT", "/api/vhosts/%s-%s" % (quote(self.v, safe=""), tag), {},
                                         auth=self.auth(tag))
            self.assertEqual((code, data["reason"]), NOT_ADMIN)
            code, _, _ = yield self.call("GET", "/api/vhosts/%s-%s" % (quote(self.v, safe=""), tag))
            self.assertEqual(code, 404)


class ConnectionAuthorisationTests(_ManagementFixture):
    """Connections, channels and consumers: who sees and who closes what (is_authorized_user)."""

    @inlineCallbacks
    def setUp(self):
        if EXTERNAL_MGMT and not EXTERNAL_AMQP:
            raise SkipTest("against an external broker these need OTTER_TEST_AMQP_URL as well")
        try:
            import pika  # noqa: F401
        except ImportError:
            raise SkipTest("pika is not installed")
        yield _ManagementFixture.setUp(self)
        if self.fixture is not None:
            self.amqpHost, self.amqpPort = "127.0.0.1", self.fixture.amqpPort
        else:
            u = urlparse(EXTERNAL_AMQP)
            self.amqpHost, self.amqpPort = u.hostname or "127.0.0.1", u.port or 5672
        self.conns = {}
        self.addCleanup(self._closeAll)
        for tag in MGMT_TAGS:
            self.conns[tag] = yield deferToThread(self._open, tag)
        self.names = {}
        yield self._poll(self._named, "the management API to list the test connections")

    @inlineCallbacks
    def _closeAll(self):
        """Close the test's AMQP connections (before the users and vhosts go)."""
        for conn, _ in self.conns.values():
            yield deferToThread(self._close, conn)

    def _open(self, tag):
        """(BlockingConnection, channel) for ``tag``'s user on vhost V, consuming from r-q."""
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters(
            self.amqpHost, self.amqpPort, self.v, pika.PlainCredentials(self.users[tag], "pw"),
            heartbeat=0, blocked_connection_timeout=None))
        ch = conn.channel()
        ch.basic_consume("r-q", lambda *a: None, consumer_tag="ctag-" + tag)
        return conn, ch

    @staticmethod
    def _close(conn):
        try:
            if conn.is_open:
                conn.close()
        except Exception:
            pass

    @inlineCallbacks
    def _named(self):
        code, data, _ = yield self.call("GET", "/api/connections")
        owners = {u: tag for tag, u in self.users.items()}
        self.names = {owners[c["user"]]: c["name"] for c in data if c.get("user") in owners}
        code, consumers, _ = yield self.call("GET", "/api/consumers")
        tags = {c["consumer_tag"] for c in consumers if c["queue"]["vhost"] == self.v}
        returnValue(len(self.names) == len(MGMT_TAGS) and len(tags) == len(MGMT_TAGS))

    def path(self, owner, suffix=""):
        return "/api/connections/" + quote(self.names[owner], safe="") + suffix

    @staticmethod
    def _roundTrip(conn, ch):
        """True when ``conn`` still answers (a passive declare round trip); False when the broker closed it."""
        try:
            ch.queue_declare("r-q", passive=True)
            return True
        except Exception:
            return False

    @staticmethod
    def _closedBy(conn, deadline=10.0):
        """The broker's close reply code once ``conn`` is closed, or None after ``deadline`` seconds."""
        import time

        import pika

        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                conn.process_data_events(time_limit=0.1)
            except pika.exceptions.ConnectionClosedByBroker as e:
                return e.reply_code
            except pika.exceptions.AMQPConnectionError:
                return -1
            if conn.is_closed:
                return -1
        return None

    @inlineCallbacks
    def test_visibility(self):
        """management and policymaker users list only their own connections, channels and consumers; monitoring and administrator all."""
        for tag in MGMT_TAGS:
            seesAll = tag in ("monitoring", "administrator")
            want = set(MGMT_TAGS) if seesAll else {tag}
            owners = {u: t for t, u in self.users.items()}
            for path in ("/api/connections", "/api/channels", "/api/vhosts/%s/connections" % quote(self.v, safe="")):
                code, data, _ = yield self.call("GET", path, auth=self.auth(tag))
                self.assertEqual(code, 200)
                self.assertEqual({owners[c["user"]] for c in data if c.get("user") in owners}, want, (path, tag))
            for path in ("/api/consumers", "/api/consumers/" + quote(self.v, safe="")):
                code, data, _ = yield self.call("GET", path, auth=self.auth(tag))
                self.assertEqual(code, 200)
                seen = {c["consumer_tag"][5:] for c in data if c["queue"]["vhost"] == self.v}
                self.assertEqual(seen, want, (path, tag))

    @inlineCallbacks
    def test_getOneConnection(self):
        """GET of another user's connection (and its channels) is 401 unless the caller is monitoring or administrator."""
        for tag in MGMT_TAGS:
            for owner in ("management", "monitoring"):
                for suffix in ("", "/channels"):
                    code, data, _ = yield self.call("GET", self.path(owner, suffix), auth=self.auth(tag))
                    if tag == owner or tag in ("monitoring", "administrator"):
                        self.assertEqual(code, 200, (tag, owner, suffix))
                    else:
                        self.assertEqual((code, data["reason"]), NOT_OBJECT, (tag, owner, suffix))

    @inlineCallbacks
    def test_monitoringClosesOnlyItsOwn(self):
        """A monitoring user's DELETE of another user's connection is 401 and leaves it open; DELETE of its own closes it."""
        code, data, _ = yield self.call("DELETE", self.path("management"), auth=self.auth("monitoring"))
        self.assertEqual((code, data["reason"]), NOT_OBJECT)
        alive = yield deferToThread(self._roundTrip, *self.conns["management"])
        self.assertTrue(alive)
        code, _, _ = yield self.call("DELETE", self.path("monitoring"), auth=self.auth("monitoring"))
        self.assertEqual(code, 204)
        closed = yield deferToThread(self._closedBy, self.conns["monitoring"][0])
        self.assertEqual(closed, 320)

    @inlineCallbacks
    def test_deleteConnection(self):
        """management and policymaker users may close only their own connections; an administrator closes anyone's."""
        for caller, owner in (("management", "policymaker"), ("policymaker", "management")):
            code, data, _ = yield self.call("DELETE", self.path(owner), auth=self.auth(caller))
            self.assertEqual((code, data["reason"]), NOT_OBJECT)
        for tag in ("management", "policymaker"):
            alive = yield deferToThread(self._roundTrip, *self.conns[tag])
            self.assertTrue(alive, tag)
        code, _, _ = yield self.call("DELETE", self.path("management"), auth=self.auth("management"))
        self.assertEqual(code, 204)
        code, _, _ = yield self.call("DELETE", self.path("policymaker"), auth=self.auth("administrator"))
        self.assertEqual(code, 204)
        for tag in ("management", "policymaker"):
            closed = yield deferToThread(self._closedBy, self.conns[tag][0])
            self.assertEqual(closed, 320, tag)
