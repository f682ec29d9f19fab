"""
Interop tests for vhost limits (https://www.rabbitmq.com/docs/vhosts#limits):
set through the management API over real HTTP, enforced on AMQP with pika.
Each test makes its own vhost (``ep-limits-...``) and deletes it.  Against
RabbitMQ they need ``OTTER_TEST_MGMT_URL``.
"""

import base64
import json
import urllib.error
import urllib.request
import uuid
from urllib.parse import quote

import pika

from otter_tx.test.interop.support import InteropTestCase, ManagementMixin


class VHostLimitTests(ManagementMixin, InteropTestCase):
    """max-connections and max-queues answer as RabbitMQ 3.10 does, over HTTP and AMQP."""

    def setUp(self):
        d = ManagementMixin.setUp(self)
        self.vhost = "ep-limits-" + uuid.uuid4().hex[:8]

        def made(_):
            return self.inThread(self._makeVHost)

        return made(None) if d is None else d.addCallback(made)

    def _makeVHost(self):
        self.http("PUT", "/api/vhosts/" + quote(self.vhost, safe=""))
        self.addCleanup(self.inThread, self.http, "DELETE", "/api/vhosts/" + quote(self.vhost, safe=""))
        self.http("PUT", "/api/permissions/%s/guest" % (quote(self.vhost, safe=""),),
                  {"configure": ".*", "write": ".*", "read": ".*"})

    # --- helpers (worker thread) ------------------------------------------------

    def http(self, method, path, body=None):
        """``(status, JSON or None)`` of one request as guest."""
        req = urllib.request.Request(
            self.mgmtBase() + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"content-type": "application/json",
                     "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def setLimit(self, name, value):
        return self.http("PUT", "/api/vhost-limits/%s/%s" % (quote(self.vhost, safe=""), name),
                         {"value": value})

    def connect(self):
        return pika.BlockingConnection(self.pikaParams(virtual_host=self.vhost))

    # --- tests ------------------------------------------------------------------

    def test_routes(self):
        """PUT answers 204, the vhost's list shows the value, a bad value is 400 Validation failed."""
        def run():
            put = self.setLimit("max-queues", 7)
            listed = self.http("GET", "/api/vhost-limits/" + quote(self.vhost, safe=""))
            bad = self.setLimit("max-queues", "x")
            unknown = self.setLimit("foo", 1)
            deleted = self.http("DELETE", "/api/vhost-limits/%s/max-queues" % (quote(self.vhost, safe=""),))
            empty = self.http("GET", "/api/vhost-limits/" + quote(self.vhost, safe=""))
            return put[0], listed, bad, unknown, deleted[0], empty

        def check(r):
            put, listed, bad, unknown, deleted, empty = r
            self.assertEqual((put, deleted), (204, 204))
            self.assertEqual(listed, (200, [{"vhost": self.vhost, "value": {"max-queues": 7}}]))
            self.assertEqual(bad, (400, {"error": "bad_request", "reason":
                                         'Validation failed\n\nmax-queues should be a number, actually was <<"x">>\n'}))
            self.assertEqual(unknown, (400, {"error": "bad_request", "reason":
                                             'Validation failed\n\nUnrecognised terms [{<<"foo">>,1}] in limits\n'}))
            self.assertEqual(empty, (200, []))

        return self.inThread(run).addCallback(check)

    def test_maxConnections(self):
        """A connection over max-connections is refused with 530 NOT_ALLOWED naming the limit."""
        def run():
            self.setLimit("max-connections", 1)
            first = self.connect()
            try:
                try:
                    self.connect().close()
                except pika.exceptions.AMQPConnectionError as e:
                    return str(e)
                return None
            finally:
                first.close()

        expected = ("(530) \"NOT_ALLOWED - access to vhost '%s' refused for user 'guest': "
                    "connection limit (1) is reached\"" % (self.vhost,))
        return self.inThread(run).addCallback(lambda text: self.assertIn(expected, text or ""))

    def test_maxQueues(self):
        """queue.declare over max-queues is 406 naming the limit; redeclaring an existing queue passes."""
        def run():
            self.setLimit("max-queues", 1)
            c = self.connect()
            try:
                ch = c.channel()
                ch.queue_declare("q1")
                try:
                    ch.queue_declare("q2")
                    refused = None
                except pika.exceptions.ChannelClosedByBroker as e:
                    refused = (e.reply_code, e.reply_text)
                ch = c.channel()
                ch.queue_declare("q1")
                http = self.http("PUT", "/api/queues/%s/q3" % (quote(self.vhost, safe=""),), {})
                return refused, http
            finally:
                c.close()

        def check(r):
            refused, http = r
            text = "cannot declare queue '%s': queue limit in vhost '%s' (1) is reached"
            self.assertEqual(refused, (406, "PRECONDITION_FAILED - " + text % ("q2", self.vhost)))
            self.assertEqual(http, (400, {"error": "bad_request", "reason": text % ("q3", self.vhost)}))

        return self.inThread(run).addCallback(check)
