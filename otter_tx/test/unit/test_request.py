"""
Unit tests for otter_tx.web.request: the management Site checks credentials
and the body size on the headers, before a body byte is stored; the
Prometheus listener's Site never stores a body.  A real
twisted.web HTTPChannel runs over a StringTransport, on a task.Clock.
"""

import base64
import json
from io import BytesIO

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.broker.broker import Broker
from otter_tx.web.management import ManagementApp
from otter_tx.web.metrics import PrometheusResource
from otter_tx.web.request import DEFAULT_MAX_BODY_SIZE, BodyGuardRequest, BodyGuardSite, NoBodyRequest, NoBodySite

CAP = 1000


def basic(name, password):
    """An ``Authorization: Basic`` header line."""
    return b"Authorization: Basic " + base64.b64encode(("%s:%s" % (name, password)).encode()) + b"\r\n"


def head(method, path, *lines):
    """A request head: the request line, ``Host`` and ``lines`` (bytes, each ending in CRLF)."""
    return b"%s %s HTTP/1.1\r\nHost: localhost\r\n%s\r\n" % (method, path, b"".join(lines))


class _Answer:
    """An HTTP/1.1 answer parsed from the transport's bytes."""

    def __init__(self, raw):
        top, _, self.body = raw.partition(b"\r\n\r\n")
        lines = top.split(b"\r\n")
        self.status = int(lines[0].split(b" ")[1])
        self.headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            self.headers[k.strip().lower()] = v.strip()

    def json(self):
        return json.loads(self.body)


class BodyGuardTests(SynchronousTestCase):
    """A BodyGuardSite over the management app of a broker on a Clock."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.app = ManagementApp(self.broker, self.clock)
        self.site = BodyGuardSite(self.app.app.resource(), self.app.authenticateRequest, CAP,
                                  reactor=self.clock)
        self.made = []

        def recording(*args):
            self.made.append(BodyGuardRequest(*args))
            return self.made[-1]

        self.site.requestFactory = recording

    def connect(self, host="127.0.0.1"):
        """A channel of the site, connected from ``host``; returns ``(channel, transport)``."""
        peer = IPv4Address("TCP", host, 40000)
        channel = self.site.buildProtocol(peer)
        transport = StringTransport(peerAddress=peer, hostAddress=IPv4Address("TCP", "127.0.0.1", 15672))
        channel.makeConnection(transport)
        self.addCleanup(channel.connectionLost, None)
        return channel, transport

    def request(self, data, host="127.0.0.1"):
        """Send ``data`` on a new connection; ``(answer or None, transport, the request)``."""
        channel, transport = self.connect(host)
        channel.dataReceived(data)
        request = self.made[-1] if self.made else None
        raw = transport.value()
        return (_Answer(raw) if raw else None), transport, request

    def assertRefused(self, answer, transport, request, status):
        """``request`` got ``status`` with Connection: close, its connection closes, no body was stored."""
        self.assertEqual(answer.status, status)
        self.assertEqual(answer.headers[b"connection"], b"close")
        self.assertEqual(int(answer.headers[b"content-length"]), len(answer.body))
        self.assertTrue(transport.disconnecting)
        self.assertIsInstance(request, BodyGuardRequest)
        self.assertEqual(request.refused, status)
        self.assertIsInstance(request.content, BytesIO)
        self.assertEqual(request.content.getvalue(), b"")

    def test_defaultCap(self):
        """The default cap is RabbitMQ's management.http.max_body_size default, 20 MiB."""
        self.assertEqual(DEFAULT_MAX_BODY_SIZE, 20 * 1024 * 1024)
        site = BodyGuardSite(self.app.app.resource(), self.app.authenticateRequest, reactor=self.clock)
        self.assertEqual(site.maxBodySize, DEFAULT_MAX_BODY_SIZE)

    def test_noCredentialsHugeBody(self):
        """Headers announcing 1 GiB without credentials get the app's empty 401 at once; body bytes are dropped."""
        answer, transport, request = self.request(
            head(b"POST", b"/api/definitions", b"Content-Length: 1073741824\r\n") + b"{\"users\":")
        self.assertRefused(answer, transport, request, 401)
        self.assertEqual(answer.body, b"")
        self.assertEqual(answer.headers[b"www-authenticate"], b'Basic realm="RabbitMQ Management"')
        before = transport.value()
        request.channel.dataReceived(b"x" * 100000)
        self.assertEqual(request.content.getvalue(), b"")
        self.assertEqual(request.bodyBytes, 100000 + len(b"{\"users\":"))
        self.assertEqual(transport.value(), before)

    def assertRefusedWith(self, data, reason, error="not_authorized", host="127.0.0.1"):
        """Sending ``data`` gets a 401 with RabbitMQ's JSON ``error`` and ``reason`` before any body byte."""
        answer, transport, request = self.request(data, host=host)
        self.assertRefused(answer, transport, request, 401)
        self.assertEqual(answer.json(), {"error": error, "reason": reason})

    def test_wrongPassword(self):
        """A wrong password gets RabbitMQ's 401 Login failed before the body."""
        self.assertRefusedWith(
            head(b"PUT", b"/api/vhosts/x", basic("guest", "nope"), b"Content-Length: 500000\r\n"), "Login failed")

    def test_malformedAuthorization(self):
        """An Authorization header that is not Basic gets the empty 401 challenge."""
        answer, transport, request = self.request(
            head(b"PUT", b"/api/vhosts/x", b"Authorization: Bearer abc\r\n", b"Content-Length: 10\r\n"))
        self.assertRefused(answer, transport, request, 401)
        self.assertEqual(answer.body, b"")

    def test_loopbackRule(self):
        """guest from a non-loopback address is refused as the routes refuse it, before the body."""
        self.assertRefusedWith(
            head(b"POST", b"/api/definitions", basic("guest", "guest"), b"Content-Length: 50\r\n"),
            "User can only log in via localhost", host="192.0.2.7")

    def test_notManagementUser(self):
        """A user without a management tag is refused before the body, with the routes' reason."""
        self.broker.addUser("app", "pw")
        self.assertRefusedWith(head(b"POST", b"/api/definitions", basic("app", "pw"), b"Content-Length: 50\r\n"),
                               "Not management user", error="not_authorised")

    def test_chunkedWithoutCredentials(self):
        """A chunked body without credentials is refused at its headers too."""
        answer, transport, request = self.request(
            head(b"POST", b"/api/definitions", b"Transfer-Encoding: chunked\r\n") + b"5\r\nhello\r\n")
        self.assertRefused(answer, transport, request, 401)

    def test_expectContinueRefused(self):
        """A refused request that asked for 100-continue gets the 401 and no 100 Continue."""
        answer, transport, request = self.request(
            head(b"POST", b"/api/definitions", b"Expect: 100-continue\r\n", b"Content-Length: 99999999\r\n"))
        self.assertRefused(answer, transport, request, 401)
        self.assertNotIn(b"100 Continue", transport.value())

    def test_oversizeContentLength(self):
        """An authenticated Content-Length above the cap gets RabbitMQ's 400 before any body byte is stored."""
        answer, transport, request = self.request(
            head(b"POST", b"/api/definitions", basic("guest", "guest"), b"Content-Length: %d\r\n" % (CAP + 1,))
            + b"{")
        self.assertRefused(answer, transport, request, 400)
        self.assertEqual(answer.json(), {"error": "bad_request", "reason": "Exceeded HTTP request body size limit"})
        self.assertEqual(answer.headers[b"content-type"], b"application/json")

    def test_oversizeChunked(self):
        """An authenticated chunked body gets the 400 as soon as it passes the cap, having stored at most the cap."""
        channel, transport = self.connect()
        channel.dataReceived(head(b"POST", b"/api/definitions", basic("guest", "guest"),
                                  b"Transfer-Encoding: chunked\r\n"))
        request = self.made[-1]
        self.assertEqual(transport.value(), b"")
        chunk = b"%x\r\n%s\r\n" % (400, b" " * 400)
        channel.dataReceived(chunk * 2)
        self.assertEqual(transport.value(), b"")
        channel.dataReceived(chunk)
        answer = _Answer(transport.value())
        self.assertEqual(answer.status, 400)
        self.assertEqual(answer.json()["reason"], "Exceeded HTTP request body size limit")
        self.assertTrue(transport.disconnecting)
        self.assertEqual(request.refused, 400)
        self.assertLessEqual(request.content.tell(), CAP)
        stored = request.content.tell()
        channel.dataReceived(chunk * 3 + b"0\r\n\r\n")
        self.assertEqual(request.content.tell(), stored)
        self.assertEqual(_Answer(transport.value()).body, answer.body)

    def test_bodyWithinCap(self):
        """An authenticated body at the cap is read and handled by its route as before."""
        body = json.dumps({"tracing": False}).encode()
        body += b" " * (CAP - len(body))
        answer, transport, request = self.request(
            head(b"PUT", b"/api/vhosts/guarded", basic("guest", "guest"), b"Content-Type: application/json\r\n",
                 b"Content-Length: %d\r\n" % (len(body),)) + body)
        self.assertEqual(answer.status, 201)
        self.assertIn("guarded", self.broker.vhosts)
        self.assertIsNone(request.refused)
        self.assertFalse(transport.disconnecting)

    def countLogins(self):
        """Count the broker logins the management app makes; returns the list of logged-in names."""
        from otter_tx.web.management import authz

        names = []
        real = authz.login

        def counting(users, name, *args):
            names.append(name)
            return real(users, name, *args)

        self.patch(authz, "login", counting)
        return names

    def test_oneLoginPerRequestWithBody(self):
        """The route reuses the user the guard logged in (one login), and still makes its own access check."""
        logins = self.countLogins()
        body = b'{"tracing": false}'
        answer, _, request = self.request(
            head(b"PUT", b"/api/vhosts/once", basic("guest", "guest"), b"Content-Type: application/json\r\n",
                 b"Content-Length: %d\r\n" % (len(body),)) + body)
        self.assertEqual(answer.status, 201)
        self.assertEqual(logins, ["guest"])
        self.assertEqual(request.authenticatedUser.name, "guest")
        del logins[:]
        self.broker.addUser("watcher", "pw", tags=["monitoring"])
        answer, _, _ = self.request(
            head(b"PUT", b"/api/vhosts/no", basic("watcher", "pw"), b"Content-Type: application/json\r\n",
                 b"Content-Length: %d\r\n" % (len(body),)) + body)
        self.assertEqual(answer.status, 401)
        self.assertIn(b'"reason": "Not administrator user"', answer.body)
        self.assertEqual(logins, ["watcher"])
        del logins[:]
        answer, _, request = self.request(head(b"GET", b"/api/overview", basic("guest", "guest")))
        self.assertEqual((answer.status, logins, request.authenticatedUser), (200, ["guest"], None))

    def test_noBodyLeftToRoutes(self):
        """Requests without a body are answered by the routes as before: 200 for /, 401, 404."""
        answer, transport, _ = self.request(head(b"GET", b"/"))
        self.assertEqual(answer.status, 200)
        self.assertFalse(transport.disconnecting)
        answer, _, _ = self.request(head(b"GET", b"/api/overview"))
        self.assertEqual((answer.status, answer.headers.get(b"connection")), (401, None))
        answer, _, _ = self.request(head(b"POST", b"/no/such/path", b"Content-Length: 0\r\n"))
        self.assertEqual(answer.status, 404)


class NoBodyTests(SynchronousTestCase):
    """
    The Prometheus listener (a NoBodySite over PrometheusResource): no
    credentials there, so a request that announces a body is answered by
    the resource's rule at its headers and closed, and a GET it serves has
    its body dropped (before, a POST /metrics of any size went to a
    temporary file in full before its 405).
    """

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.site = NoBodySite(PrometheusResource(self.broker, self.clock), reactor=self.clock)
        self.made = []

        def recording(*args):
            self.made.append(NoBodyRequest(*args))
            return self.made[-1]

        self.site.requestFactory = recording

    def request(self, data):
        """Send ``data`` on a new connection; ``(answer or None, transport, channel, the request)``."""
        peer = IPv4Address("TCP", "192.0.2.9", 40000)
        channel = self.site.buildProtocol(peer)
        transport = StringTransport(peerAddress=peer, hostAddress=IPv4Address("TCP", "127.0.0.1", 15692))
        channel.makeConnection(transport)
        self.addCleanup(channel.connectionLost, None)
        channel.dataReceived(data)
        raw = transport.value()
        return (_Answer(raw) if raw else None), transport, channel, self.made[-1]

    def assertRefused(self, answer, transport, request, status):
        """``request`` got ``status`` with Connection: close before its body; its connection closes."""
        self.assertEqual(answer.status, status)
        self.assertEqual(answer.headers[b"connection"], b"close")
        self.assertEqual(int(answer.headers[b"content-length"]), len(answer.body))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(request.refused, status)
        self.assertEqual(request.content.getvalue(), b"")

    def test_hugePostRefusedAtHeaders(self):
        """POST /metrics announcing 1 GiB: 405 (Allow: GET, HEAD) at once; the body bytes are dropped."""
        answer, transport, channel, request = self.request(
            head(b"POST", b"/metrics", b"Content-Length: 1073741824\r\n") + b"x" * 10)
        self.assertRefused(answer, transport, request, 405)
        self.assertEqual(answer.headers[b"allow"], b"GET, HEAD")
        before = transport.value()
        channel.dataReceived(b"x" * 200000)
        self.assertEqual((request.bodyBytes, request.content.getvalue()), (200010, b""))
        self.assertEqual(transport.value(), before)

    def test_unknownPathChunked(self):
        """A chunked body to an unknown path: the resource's 404, at the headers."""
        answer, transport, _, request = self.request(
            head(b"PUT", b"/api/definitions", b"Transfer-Encoding: chunked\r\n") + b"5\r\nhello\r\n")
        self.assertRefused(answer, transport, request, 404)
        self.assertEqual(answer.body, b"Not Found\n")

    def test_expectContinue(self):
        """A refused request that asked for 100-continue gets its answer and no 100 Continue."""
        answer, transport, _, request = self.request(
            head(b"POST", b"/metrics/per-object?x=1", b"Expect: 100-continue\r\n", b"Content-Length: 99999999\r\n"))
        self.assertRefused(answer, transport, request, 405)
        self.assertNotIn(b"100 Continue", transport.value())

    def test_getWithBodyServedBodyDropped(self):
        """A GET of /metrics with a body is served; its body is never stored."""
        answer, transport, _, request = self.request(
            head(b"GET", b"/metrics", b"Content-Length: 300000\r\n") + b"y" * 300000)
        self.assertEqual(answer.status, 200)
        self.assertIn(b"rabbitmq_identity_info", answer.body)
        self.assertIsNone(request.refused)
        self.assertEqual(request.bodyBytes, 300000)
        self.assertIn(request.content, (None, b""))  # twisted.web drops it once the answer is written

    def test_getWithBodyNothingStored(self):
        """While a served GET's body arrives, nothing of it is stored (no temporary file for a large one)."""
        peer = IPv4Address("TCP", "192.0.2.9", 40000)
        channel = self.site.buildProtocol(peer)
        channel.makeConnection(StringTransport(peerAddress=peer))
        self.addCleanup(channel.connectionLost, None)
        channel.dataReceived(head(b"GET", b"/metrics", b"Content-Length: 300000\r\n") + b"y" * 299999)
        request = self.made[-1]
        self.assertIsInstance(request.content, BytesIO)
        self.assertEqual((request.bodyBytes, request.content.getvalue()), (299999, b""))

    def test_withoutBody(self):
        """Requests without a body answer as the resource does: 200, 404, 405."""
        for method, path, status in ((b"GET", b"/metrics", 200), (b"GET", b"/nope", 404),
                                     (b"DELETE", b"/metrics", 405)):
            answer, transport, _, request = self.request(head(method, path))
            self.assertEqual(answer.status, status, path)
            self.assertIsNone(request.refused)
            self.assertFalse(transport.disconnecting)


class TwistedRequestLineTests(SynchronousTestCase):
    """
    The installed Twisted's HTTPChannel still keeps the request line in
    ``_command``, ``_path`` and ``_version`` when ``Request.gotLength`` runs,
    which ``otter_tx.web.request._requestLine`` reads (no public way exists).
    """

    def test_privateRequestLine(self):
        """At gotLength time the channel's _command, _path and _version hold the request line."""
        from twisted.web.http import HTTPChannel, Request

        seen = []

        class Recording(Request):
            def gotLength(self, length):
                channel = self.channel
                seen.append((channel._command, channel._path, channel._version, self.method, length))
                Request.gotLength(self, length)

        channel = HTTPChannel()
        channel.requestFactory = Recording
        channel.makeConnection(StringTransport())
        self.addCleanup(channel.connectionLost, None)
        channel.dataReceived(b"PUT /api/queues/%2F/q?x=1 HTTP/1.0\r\nContent-Length: 2\r\n\r\n")
        [(command, path, version, method, length)] = seen
        self.assertEqual((command, path, version, length), (b"PUT", b"/api/queues/%2F/q?x=1", b"HTTP/1.0", 2))
        # no public way yet: should this fail, Twisted sets Request.method
        # before gotLength, and _requestLine can use the public attributes
        self.assertNotEqual(method, b"PUT")
