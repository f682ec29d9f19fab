"""
Request bodies on the management port, over a real TCP socket: credentials
and the size are checked on the headers, so a body that is refused is
never stored (otter_tx.web.request, docs/management.md "Request bodies").

The client is a raw protocol that sends request heads and body bytes as it
likes.  Against ``OTTER_TEST_MGMT_URL`` (the RabbitMQ peer) the credential
test runs too: RabbitMQ also answers 401 before it reads the body.
"""

import base64
import os
from urllib.parse import urlparse

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.trial.unittest import TestCase
from twisted.web import http

EXTERNAL_MGMT = os.environ.get("OTTER_TEST_MGMT_URL")


def _inProcessOnly(reason):
    def deco(f):
        if EXTERNAL_MGMT:
            f.skip = "needs the in-process broker: " + reason
        return f

    return deco


def basic(name, password):
    """An ``Authorization: Basic`` header line."""
    return b"Authorization: Basic " + base64.b64encode(("%s:%s" % (name, password)).encode()) + b"\r\n"


class RawHTTP(Protocol):
    """
    Sends ``head`` on connect; ``answered`` fires with the status (int) once
    the answer's head is in; ``closed`` fires when the server closes.
    """

    def __init__(self, head):
        self.head = head
        self.data = b""
        self.answered = Deferred()
        self.closed = Deferred()

    def connectionMade(self):
        self.transport.write(self.head)

    def dataReceived(self, data):
        self.data += data
        if self.answered is not None and b"\r\n\r\n" in self.data:
            d, self.answered = self.answered, None
            d.callback(int(self.data.split(b" ", 2)[1]))

    def connectionLost(self, reason):
        if self.answered is not None:
            d, self.answered = self.answered, None
            d.errback(reason)
        self.closed.callback(None)

    @property
    def body(self):
        return self.data.partition(b"\r\n\r\n")[2]


class BodyGuardTests(TestCase):
    """The management port checks credentials and size before it reads a body."""

    timeout = 30
    maxBodySize = 100000

    @inlineCallbacks
    def setUp(self):
        self.fixture = None
        self.contentFiles = []
        if EXTERNAL_MGMT:
            url = urlparse(EXTERNAL_MGMT)
            self.host, self.port = url.hostname, url.port
        else:
            from otter_tx.testing import startBroker

            original = http._getContentFile

            def recording(length):
                self.contentFiles.append(length)
                return original(length)

            self.patch(http, "_getContentFile", recording)
            self.fixture = yield startBroker(reactor, management=True, managementMaxBodySize=self.maxBodySize)
            self.addCleanup(self.fixture.stop)
            self.host, self.port = "127.0.0.1", self.fixture.managementPort

    @inlineCallbacks
    def send(self, head):
        """Connect and send ``head``; returns the connected :class:`RawHTTP`."""
        proto = RawHTTP(head)
        yield connectProtocol(TCP4ClientEndpoint(reactor, self.host, self.port), proto)
        return proto

    @inlineCallbacks
    def test_noCredentialsHugeBody(self):
        """Headers announcing 1 GiB without credentials, then a few bytes, get 401 at once; nothing is stored."""
        proto = yield self.send(
            b"POST /api/definitions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1073741824\r\n\r\n")
        proto.transport.write(b'{"users": [')
        status = yield proto.answered
        self.assertEqual(status, 401)
        self.assertIn(b"www-authenticate", proto.data.lower())
        if self.fixture is not None:
            self.assertEqual(self.contentFiles, [])
            yield proto.closed
        else:
            proto.transport.loseConnection()
            yield proto.closed

    @_inProcessOnly("RabbitMQ 3.10 has no body cap (management.http.max_body_size came in 3.11.24/3.12.7)")
    @inlineCallbacks
    def test_oversizeAuthenticated(self):
        """An authenticated Content-Length over the cap gets 400 before any body byte is read; the connection closes."""
        proto = yield self.send(
            b"POST /api/definitions HTTP/1.1\r\nHost: localhost\r\n" + basic("guest", "guest")
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (self.maxBodySize + 1,))
        proto.transport.write(b"{")
        status = yield proto.answered
        yield proto.closed
        self.assertEqual(status, 400)
        self.assertIn(b'"Exceeded HTTP request body size limit"', proto.body)
        self.assertEqual(self.contentFiles, [])

    @_inProcessOnly("RabbitMQ 3.10 has no body cap")
    @inlineCallbacks
    def test_oversizeChunked(self):
        """An authenticated chunked body gets 400 once it passes the cap, and no more of it is stored."""
        proto = yield self.send(
            b"POST /api/definitions HTTP/1.1\r\nHost: localhost\r\n" + basic("guest", "guest")
            + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (30000, b" " * 30000)
        for _ in range(5):
            proto.transport.write(chunk)
        status = yield proto.answered
        yield proto.closed
        self.assertEqual(status, 400)
        self.assertEqual(self.contentFiles, [None])

    @_inProcessOnly("the cap is this broker's setting")
    @inlineCallbacks
    def test_bodyWithinCap(self):
        """An authenticated definitions import under the cap is read and applied."""
        body = b'{"vhosts": [{"name": "body-guard-ok"}]}'
        proto = yield self.send(
            b"POST /api/definitions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + basic("guest", "guest")
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        status = yield proto.answered
        yield proto.closed
        self.assertIn(status, (201, 204))
        self.assertIn("body-guard-ok", self.fixture.service.broker.vhosts)


class PrometheusBodyTests(TestCase):
    """
    The Prometheus listener (no credentials, as rabbitmq_prometheus) never
    stores a request body: a POST is answered 405 at its headers, a GET's
    body is dropped.  The peer's suite has no Prometheus URL, so in-process only.
    """

    timeout = 30

    @inlineCallbacks
    def setUp(self):
        if EXTERNAL_MGMT:
            self.skipTest("needs the in-process broker: the suite knows no rabbitmq_prometheus URL of the peer")
        from otter_tx.testing import startBroker

        self.contentFiles = []
        original = http._getContentFile

        def recording(length):
            self.contentFiles.append(length)
            return original(length)

        self.patch(http, "_getContentFile", recording)
        self.fixture = yield startBroker(reactor, prometheus=True)
        self.addCleanup(self.fixture.stop)

    @inlineCallbacks
    def send(self, head):
        proto = RawHTTP(head)
        yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.fixture.prometheusPort), proto)
        return proto

    @inlineCallbacks
    def test_hugePost(self):
        """POST /metrics announcing 1 GiB, then a few bytes: 405 at once, the connection closes, nothing stored."""
        proto = yield self.send(b"POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1073741824\r\n\r\n")
        proto.transport.write(b"x" * 70000)
        status = yield proto.answered
        yield proto.closed
        self.assertEqual(status, 405)
        self.assertIn(b"allow: GET, HEAD", proto.data.replace(b"Allow", b"allow"))
        self.assertEqual(self.contentFiles, [])

    @inlineCallbacks
    def test_getWithBody(self):
        """A GET of /metrics with a 200 kB body is served, and its body never stored."""
        proto = yield self.send(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                                b"Content-Length: 200000\r\n\r\n" + b"y" * 200000)
        status = yield proto.answered
        yield proto.closed
        self.assertEqual(status, 200)
        self.assertIn(b"rabbitmq_identity_info", proto.body)
        self.assertEqual(self.contentFiles, [])
