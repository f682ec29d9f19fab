"""
Unit tests for the admin web app's server side: the static files
(otter_tx.web.webapp, ``GET /`` and ``/static/...``) and the otter-only
queue-insight endpoints it reads (``/browse``, ``/expiry``, ``/dead-letter``
in otter_tx.web.management), through StubTreq over a Broker on a task.Clock.
The page itself runs in a real browser in otter_tx.test.e2e.test_webapp.
"""

import os
import re

from twisted.internet.task import Clock

from otter_tx.amqp import spec
from otter_tx.broker import paging
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.test.unit.test_web import WebTestCase
from otter_tx.testing import FakeClient
from otter_tx.web import webapp
from otter_tx.web.management import ManagementApp


def _static(name):
    with open(os.path.join(webapp.STATIC_DIR, name), encoding="utf-8") as f:
        return f.read()


class StaticFileTests(WebTestCase):
    """GET / and /static/...: the page, its files, their types and caching."""

    def test_indexNeedsNoCredentials(self):
        """GET / answers the app's HTML page without credentials (the page asks for them)."""
        r = self.get("/", auth=None)
        self.assertEqual(r.code, 200)
        self.assertEqual(r.header("content-type"), "text/html; charset=utf-8")
        self.assertIn('<script type="module" src="/static/app.js"></script>', r.body)
        self.assertEqual(r.header("x-frame-options"), "DENY")
        self.assertIn("script-src 'self';", r.header("content-security-policy"))

    def test_contentTypes(self):
        """Each kind of file is served with its content type."""
        for path, ctype in [("app.js", "text/javascript; charset=utf-8"), ("app.css", "text/css; charset=utf-8"),
                            ("vendor/uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
                            ("vendor/uplot/LICENSE", "text/plain; charset=utf-8")]:
            r = self.get("/static/" + path, auth=None)
            self.assertEqual((path, r.code, r.header("content-type")), (path, 200, ctype))
            self.assertEqual(r.header("x-content-type-options"), "nosniff")

    def test_cacheHeaders(self):
        """The app's files are revalidated (no-cache + ETag, 304 when unchanged); vendored ones cached a day."""
        r = self.get("/static/app.js", auth=None)
        self.assertEqual(r.header("cache-control"), "no-cache")
        etag = r.header("etag")
        self.assertTrue(etag.startswith('"'))
        again = self.get("/static/app.js", auth=None, headers={"If-None-Match": etag})
        self.assertEqual((again.code, again.body), (304, ""))
        self.assertEqual(self.get("/static/vendor/uplot/uPlot.min.css", auth=None).header("cache-control"),
                         "public, max-age=86400")

    def test_outsideTheStaticDirectory(self):
        """Paths leaving the static directory, hidden or unknown files are 404 Object Not Found."""
        for path in ["/static/../webapp.py", "/static/%2e%2e/webapp.py", "/static/%2E%2E%2Fwebapp.py",
                     "/static/vendor/../../management.py", "/static/.gitignore", "/static/nope.js",
                     "/static/vendor", "/static/", "/static/vendor//uplot/LICENSE", "/static/app.js%00.css"]:
            r = self.get(path, auth=None)
            self.assertEqual((path, r.code), (path, 404))
            self.assertEqual(r.json(), {"error": "Object Not Found", "reason": "Not Found"})

    def test_staticFileRefusesTraversal(self):
        """staticFile() returns None for any path with an empty, dot or backslash segment."""
        for rel in ["", "..", "../x.js", "a/../app.js", "/app.js", ".hidden.js", "vendor\\x.js", "app.js/"]:
            self.assertIsNone(webapp.staticFile(rel), rel)
        self.assertEqual(webapp.staticFile("app.js")[1], b"text/javascript; charset=utf-8")

    def test_noHTMLSinksInTheApp(self):
        """app.js never writes HTML from strings (innerHTML and friends): every value goes in as text."""
        js = _static("app.js")
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            self.assertNotIn(sink, js)

    def test_nothingFetchedFromElsewhere(self):
        """The page and app reference only their own paths: no CDN, no absolute URL."""
        html = _static("index.html")
        self.assertEqual(re.findall(r'(?:src|href)="([^"]*)"', html),
                         ["data:,", "/static/vendor/uplot/uPlot.min.css", "/static/app.css",
                          "/static/vendor/uplot/uPlot.iife.min.js", "/static/app.js"])
        self.assertEqual(re.findall(r"https?://", _static("app.js") + _static("app.css")), [])

    def test_vendoredLibraryHasItsLicence(self):
        """uPlot ships with its MIT licence and a note of the released version it is."""
        self.assertIn("MIT License", _static("vendor/uplot/LICENSE"))
        self.assertIn("uPlot 1.6.32", _static("vendor/uplot/README"))


class BrowseTests(WebTestCase):
    """POST /api/queues/{vhost}/{name}/browse: read ready messages without taking them."""

    def setUp(self):
        WebTestCase.setUp(self)
        self.put("/api/queues/%2F/q1")
        for i in range(5):
            self.publish("q1", b"m%d" % i, {"message_id": "id%d" % i})

    def browse(self, body, **kw):
        return self.post("/api/queues/%2F/q1/browse", body, **kw)

    def test_browseLeavesTheQueueAlone(self):
        """Browsing answers /get's shape and leaves count, order and redelivered flags as they were."""
        r = self.browse({"count": 2, "encoding": "auto"})
        self.assertEqual(r.code, 200)
        self.assertEqual(r.json(), [
            {"payload_bytes": 2, "redelivered": False, "exchange": "", "routing_key": "q1", "message_count": 4,
             "properties": {"message_id": "id0"}, "payload": "m0", "payload_encoding": "string"},
            {"payload_bytes": 2, "redelivered": False, "exchange": "", "routing_key": "q1", "message_count": 3,
             "properties": {"message_id": "id1"}, "payload": "m1", "payload_encoding": "string"},
        ])
        self.browse({"count": 10})
        q = self.vh.queues["q1"]
        self.assertEqual((q.readyCount, q.unackedCount), (5, 0))
        got = self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        self.assertEqual([(m["payload"], m["redelivered"]) for m in got.json()], [("m0", False)])

    def test_offsetCountEncodingTruncate(self):
        """offset skips, count bounds, base64 and truncate behave as in /get."""
        r = self.browse({"count": 2, "offset": 3, "encoding": "base64", "truncate": 1})
        self.assertEqual([(m["payload"], m["payload_encoding"], m["payload_bytes"], m["message_count"])
                          for m in r.json()], [("bQ==", "base64", 2, 1), ("bQ==", "base64", 2, 0)])
        self.assertEqual(self.browse({"count": 3, "offset": 9}).json(), [])
        self.assertEqual(self.browse({"count": 0}).json(), [])
        self.assertEqual([m["payload"] for m in self.browse({"count": 1, "offset": "4"}).json()], ["m4"])

    def test_redeliveredShownAsItIs(self):
        """A message requeued by /get shows redelivered true in a browse, which does not change it."""
        self.post("/api/queues/%2F/q1/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        self.assertEqual([m["redelivered"] for m in self.browse({"count": 2}).json()], [True, False])
        self.assertEqual([m["redelivered"] for m in self.browse({"count": 2}).json()], [True, False])

    def test_badInput(self):
        """Missing count, a bad encoding or a non-integer is 400; a missing queue 404; not JSON 400."""
        self.assertError(self.browse({}), 400, "bad_request", "[{key_missing,count}]")
        self.assertError(self.browse({"count": 1, "encoding": "hex"}), 400, "bad_request",
                         "Unsupported encoding. Please use auto or base64.")
        self.assertError(self.browse({"count": "x"}), 400, "bad_request",
                         "count, offset and truncate must be integers")
        self.assertError(self.browse({"count": 1, "offset": [1]}), 400, "bad_request",
                         "count, offset and truncate must be integers")
        self.assertError(self.request("POST", "/api/queues/%2F/q1/browse", raw=b"{"), 400, "bad_request", "not_json")
        self.assertError(self.post("/api/queues/%2F/nope/browse", {"count": 1}), 404, "not_found",
                         "NOT_FOUND - no queue 'nope' in vhost '/'")
        self.assertError(self.post("/api/queues/nope/q1/browse", {"count": 1}), 404, "Object Not Found", "Not Found")

    def test_needsRead(self):
        """Browsing needs read permission on the queue: 401 with the AMQP refusal text, as /get."""
        self.broker.addUser("w", "pw", ["management"])
        self.broker.setPermissions("w", "/", ".*", ".*", "^nothing$")
        self.assertError(self.browse({"count": 1}, auth=("w", "pw")), 401, "not_authorised",
                         "ACCESS_REFUSED - access to queue 'q1' in vhost '/' refused for user 'w'")

    def test_expiredNotShown(self):
        """A message whose TTL has passed is not browsed even before it is reaped."""
        self.put("/api/queues/%2F/ttl", {"arguments": {"x-message-ttl": 1000}})
        self.publish("ttl", b"old")
        self.clock.advance(0.5)
        self.publish("ttl", b"new")
        self.clock.rightNow = 1.2  # time passes, but the reaper's call has not run yet
        self.assertEqual(self.vh.queues["ttl"].readyCount, 2)
        self.assertEqual([m["payload"] for m in self.post("/api/queues/%2F/ttl/browse", {"count": 5}).json()],
                         ["new"])


class BrowsePagedTests(WebTestCase):
    """Browsing a queue whose messages are partly paged out to disk."""

    def setUp(self):
        self.patch(paging, "SEGMENT_COUNT", 4)
        self.patch(paging.PagingDirectory, "threaded", False)
        self.clock = Clock()
        self.broker = Broker(self.clock, queueMemoryBudget=4 * (16 + paging.ENTRY_OVERHEAD),
                             pagingDirectory=self.mktemp())
        self.vh = self.broker.vhosts["/"]
        self.mgmt = ManagementApp(self.broker, self.clock)
        from treq.testing import StubTreq

        self.http = StubTreq(self.mgmt.app.resource())

    def test_pagedMessagesBrowsedInOrderAndStayPaged(self):
        """Paged-out messages are read in delivery order and stay paged (nothing paged in for good)."""
        self.put("/api/queues/%2F/deep")
        for i in range(20):
            self.publish("deep", b"%016d" % i)
        q = self.vh.queues["deep"]
        paged = q.pagedCount
        self.assertTrue(paged > 0)
        r = self.post("/api/queues/%2F/deep/browse", {"count": 20, "offset": 2})
        self.assertEqual([m["payload"] for m in r.json()], ["%016d" % i for i in range(2, 20)])
        self.assertEqual((q.pagedCount, q.readyCount), (paged, 20))

    def test_pagedMessagesInTheExpiryHistogramByTheirSegment(self):
        """The expiry histogram reads no file: a paged segment counts in the bucket of its earliest expiry."""
        self.put("/api/queues/%2F/deep", {"arguments": {"x-message-ttl": 30000}})
        for i in range(20):
            self.publish("deep", b"%016d" % i)
        q = self.vh.queues["deep"]
        paged = q.pagedCount
        self.assertTrue(paged > 0)
        self.patch(paging.Pager, "read", lambda *a: self.fail("a file was read"))
        x = self.get("/api/queues/%2F/deep/expiry").json()
        self.assertEqual((x["within_1min"], x["estimated"], x["later"], x["never"]), (20, paged, 0, 0))


class ExpiryTests(WebTestCase):
    """GET /api/queues/{vhost}/{name}/expiry: the time-to-expiry histogram and the x-expires lease."""

    def test_histogram(self):
        """Ready messages fall in the first bucket their time to expiry fits; no TTL is never."""
        self.put("/api/queues/%2F/h", {"arguments": {"x-message-ttl": 120000}})
        for ms in ("500", "1000", "5000", "30000", "60000"):
            self.publish("h", b"x", {"expiration": ms})
        self.publish("h", b"x")  # the queue's 120 s
        self.put("/api/queues/%2F/plain")
        self.publish("plain", b"x")
        r = self.get("/api/queues/%2F/h/expiry")
        self.assertEqual(r.json(), {"within_1s": 2, "within_10s": 1, "within_1min": 2, "later": 1, "never": 0,
                                    "estimated": 0, "expires_at": None, "x_expires": None})
        self.clock.advance(50)  # the first four are reaped; 10 s and 70 s left
        self.assertEqual(self.get("/api/queues/%2F/h/expiry").json(), {
            "within_1s": 0, "within_10s": 1, "within_1min": 0, "later": 1, "never": 0,
            "estimated": 0, "expires_at": None, "x_expires": None})
        self.assertEqual(self.get("/api/queues/%2F/plain/expiry").json()["never"], 1)

    def test_lease(self):
        """x-expires shows its ms and the deadline (epoch ms), renewed by use, null while a consumer holds it."""
        self.clock.advance(1000)
        self.put("/api/queues/%2F/lease", {"arguments": {"x-expires": 30000}})
        self.assertEqual(self.get("/api/queues/%2F/lease/expiry").json()["expires_at"], 1030000)
        self.assertEqual(self.get("/api/queues/%2F/lease/expiry").json()["x_expires"], 30000)
        self.clock.advance(10)
        self.put("/api/queues/%2F/lease", {"arguments": {"x-expires": 30000}})  # a declare renews it
        self.assertEqual(self.get("/api/queues/%2F/lease/expiry").json()["expires_at"], 1040000)
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0))
        c.openChannel(1)
        c.send(1, spec.BasicConsume(0, "lease", "t", False, False, False, False, {}))
        c.received()
        self.assertIsNone(self.get("/api/queues/%2F/lease/expiry").json()["expires_at"])

    def test_missing(self):
        """An unknown queue is 404; a vhost the user may not use is 401."""
        self.assertError(self.get("/api/queues/%2F/nope/expiry"), 404, "Object Not Found", "Not Found")
        self.broker.addUser("m", "pw", ["management"])
        self.assertError(self.get("/api/queues/%2F/nope/expiry", auth=("m", "pw")), 401, "not_authorised",
                         "User not authorised to access virtual host")


class DeadLetterTargetTests(WebTestCase):
    """GET /api/queues/{vhost}/{name}/dead-letter: where a queue's dead letters go now."""

    def setUp(self):
        WebTestCase.setUp(self)
        self.put("/api/exchanges/%2F/dlx", {"type": "direct"})
        for name in ("dlq-a", "dlq-b"):
            self.put("/api/queues/%2F/" + name)
        self.post("/api/bindings/%2F/e/dlx/q/dlq-a", {"routing_key": "a"})
        self.post("/api/bindings/%2F/e/dlx/q/dlq-b", {"routing_key": "b"})

    def target(self, name):
        return self.get("/api/queues/%2F/" + name + "/dead-letter").json()

    def test_noDeadLetterExchange(self):
        """A queue without one answers nulls and no queues."""
        self.put("/api/queues/%2F/plain")
        self.assertEqual(self.target("plain"),
                         {"exchange": None, "routing_key": None, "strategy": None, "queues": []})

    def test_strategyTheBrokerApplies(self):
        """The strategy shown is the one dead-lettering applies: at-least-once only with x-overflow reject-publish."""
        dl = {"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once", "x-queue-type": "quorum"}
        self.put("/api/queues/%2F/qq-drop", {"durable": True, "arguments": dl})
        self.put("/api/queues/%2F/qq-alo", {"durable": True, "arguments": dict(dl, **{"x-overflow": "reject-publish"})})
        self.assertEqual([self.target(n)["strategy"] for n in ("qq-drop", "qq-alo")], ["at-most-once", "at-least-once"])

    def test_withRoutingKey(self):
        """With a dead-letter routing key, the queues that key reaches; nothing is counted on the exchange."""
        self.put("/api/queues/%2F/src", {"arguments": {"x-dead-letter-exchange": "dlx",
                                                       "x-dead-letter-routing-key": "b"}})
        self.assertEqual(self.target("src"), {"exchange": "dlx", "routing_key": "b", "strategy": "at-most-once",
                                              "queues": [{"vhost": "/", "name": "dlq-b", "routing_key": "b"}]})
        self.assertEqual(self.vh.exchanges["dlx"].publishIn, 0)

    def test_withoutRoutingKey(self):
        """Without one, every queue bound to the exchange, with its binding key."""
        self.put("/api/queues/%2F/src", {"arguments": {"x-dead-letter-exchange": "dlx"}})
        self.assertEqual(self.target("src")["queues"], [{"vhost": "/", "name": "dlq-a", "routing_key": "a"},
                                                        {"vhost": "/", "name": "dlq-b", "routing_key": "b"}])
        self.assertIsNone(self.target("src")["routing_key"])

    def test_followsExchangeBindingsAndAlternate(self):
        """Exchange-to-exchange bindings are followed, and an alternate exchange when nothing matches."""
        self.put("/api/exchanges/%2F/ae", {"type": "fanout"})
        self.put("/api/queues/%2F/unrouted")
        self.post("/api/bindings/%2F/e/ae/q/unrouted", {"routing_key": ""})
        self.put("/api/exchanges/%2F/front", {"type": "topic", "arguments": {"alternate-exchange": "ae"}})
        self.post("/api/bindings/%2F/e/front/e/dlx", {"routing_key": "#"})
        self.put("/api/queues/%2F/src", {"arguments": {"x-dead-letter-exchange": "front",
                                                       "x-dead-letter-routing-key": "a"}})
        self.assertEqual([q["name"] for q in self.target("src")["queues"]], ["dlq-a"])
        self.put("/api/queues/%2F/src2", {"arguments": {"x-dead-letter-exchange": "front",
                                                        "x-dead-letter-routing-key": "zzz"}})
        self.assertEqual([q["name"] for q in self.target("src2")["queues"]], [])
        self.delete("/api/bindings/%2F/e/front/e/dlx/%23")
        self.assertEqual([q["name"] for q in self.target("src2")["queues"]], ["unrouted"])

    def test_defaultExchangeAndMissingExchange(self):
        """The default exchange reaches the queue named by the key; a missing exchange reaches nothing."""
        self.put("/api/queues/%2F/viadefault", {"arguments": {"x-dead-letter-exchange": "",
                                                              "x-dead-letter-routing-key": "dlq-a"}})
        self.assertEqual(self.target("viadefault")["queues"], [{"vhost": "/", "name": "dlq-a", "routing_key": "dlq-a"}])
        self.put("/api/queues/%2F/lost", {"arguments": {"x-dead-letter-exchange": "gone"}})
        self.assertEqual(self.target("lost"), {"exchange": "gone", "routing_key": None, "strategy": "at-most-once",
                                               "queues": []})

    def test_fromPolicy(self):
        """A policy's dead-letter-exchange and -routing-key count, as the queue applies them."""
        self.put("/api/queues/%2F/pol")
        self.put("/api/policies/%2F/dl", {"pattern": "^pol$", "definition": {
            "dead-letter-exchange": "dlx", "dead-letter-routing-key": "a"}})
        self.assertEqual(self.target("pol")["queues"], [{"vhost": "/", "name": "dlq-a", "routing_key": "a"}])

    def test_missingQueue(self):
        """An unknown queue is 404."""
        self.assertError(self.get("/api/queues/%2F/nope/dead-letter"), 404, "Object Not Found", "Not Found")
