"""
Interop tests for vhost limits (https://www.rabbitmq.com/docs/vhosts#limits):
set through the management API over real HTTP, enforced on AMQP with pika.
Each test makes its own vhost (``ep-limits-...``) and deletes it.  Against
RabbitMQ they need ``OTTER_TEST_MGMT_URL``.
"""

import uuid
from urllib.parse import quote

import pika

from otter_tx.test.interop.support import InteropTestCase, ManagementMixin


def secondConnectionRefusal(connect):
    """
    Open one connection with ``connect()``, then try a second: the text of
    the second's AMQPConnectionError, or None when it opened (worker thread).
    """
    first = connect()
    try:
        try:
            connect().close()
        except pika.exceptions.AMQPConnectionError as e:
            return str(e)
        return None
    finally:
        first.close()


class VHostLimitTests(ManagementMixin, InteropTestCase):
    """max-connections and max-queues answer as RabbitMQ 3.10 does, over HTTP and AMQP."""

    def setUp(self):
        d = ManagementMixin.setUp(self)
        self.vhost = "ep-limits-" + uuid.uuid4().hex[:8]

        def made(_):
            return self.inThread(self._makeVHost)

        return made(None) if d is None else d.addCallback(made)

    def _makeVHost(self):
        self.mgmtCall("PUT", "/api/vhosts/" + quote(self.vhost, safe=""))
        self.addCleanup(self.inThread, self.mgmtCall, "DELETE", "/api/vhosts/" + quote(self.vhost, safe=""))
        self.mgmtCall("PUT", "/api/permissions/%s/guest" % (quote(self.vhost, safe=""),),
                  {"configure": ".*", "write": ".*", "read": ".*"})

    # --- helpers (worker thread) ------------------------------------------------

    def setLimit(self, name, value):
        return self.mgmtCall("PUT", "/api/vhost-limits/%s/%s" % (quote(self.vhost, safe=""), name),
                         {"value": value})

    def connect(self):
        return pika.BlockingConnection(self.pikaParams(virtual_host=self.vhost))

    # --- tests ------------------------------------------------------------------

    def test_routes(self):
        """PUT answers 204, the vhost's list shows the value, a bad value is 400 Validation failed."""
        def run():
            put = self.setLimit("max-queues", 7)
            listed = self.mgmtCall("GET", "/api/vhost-limits/" + quote(self.vhost, safe=""))
            bad = self.setLimit("max-queues", "x")
            unknown = self.setLimit("foo", 1)
            deleted = self.mgmtCall("DELETE", "/api/vhost-limits/%s/max-queues" % (quote(self.vhost, safe=""),))
            empty = self.mgmtCall("GET", "/api/vhost-limits/" + quote(self.vhost, safe=""))
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
            return secondConnectionRefusal(self.connect)

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
                http = self.mgmtCall("PUT", "/api/queues/%s/q3" % (quote(self.vhost, safe=""),), {})
                return refused, http
            finally:
                c.close()

        def check(r):
            refused, http = r
            text = "cannot declare queue '%s': queue limit in vhost '%s' (1) is reached"
            self.assertEqual(refused, (406, "PRECONDITION_FAILED - " + text % ("q2", self.vhost)))
            self.assertEqual(http, (400, {"error": "bad_request", "reason": text % ("q3", self.vhost)}))

        return self.inThread(run).addCallback(check)


class UserLimitTests(ManagementMixin, InteropTestCase):
    """max-connections and max-channels per user answer as RabbitMQ 3.10 does."""

    def setUp(self):
        d = ManagementMixin.setUp(self)
        self.user = "ep-limited-" + uuid.uuid4().hex[:8]

        def made(_):
            return self.inThread(self._makeUser)

        return made(None) if d is None else d.addCallback(made)

    def _makeUser(self):
        self.mgmtCall("PUT", "/api/users/" + self.user, {"password": "pw", "tags": ""})
        self.addCleanup(self.inThread, self.mgmtCall, "DELETE", "/api/users/" + self.user)
        self.mgmtCall("PUT", "/api/permissions/%2F/" + self.user, {"configure": ".*", "write": ".*", "read": ".*"})

    def setLimit(self, name, value):
        return self.mgmtCall("PUT", "/api/user-limits/%s/%s" % (self.user, name), {"value": value})

    def connect(self):
        p = self.pikaParams()
        p.credentials = pika.PlainCredentials(self.user, "pw")
        return pika.BlockingConnection(p)

    def test_routes(self):
        """PUT 204, listed for the user and in the user, bad values 400 without a Validation failed prefix."""
        def run():
            return (self.setLimit("max-channels", 9)[0], self.mgmtCall("GET", "/api/user-limits/" + self.user),
                    self.mgmtCall("GET", "/api/users/" + self.user)[1]["limits"], self.setLimit("max-channels", "x"))

        def check(r):
            put, listed, shown, bad = r
            self.assertEqual(put, 204)
            self.assertEqual(listed, (200, [{"user": self.user, "value": {"max-channels": 9}}]))
            self.assertEqual(shown, {"max-channels": 9})
            self.assertEqual(bad, (400, {"error": "bad_request",
                                         "reason": 'max-channels should be a number, actually was <<"x">>'}))

        return self.inThread(run).addCallback(check)

    def test_maxConnections(self):
        """A second connection over the user's max-connections is refused with 530."""
        def run():
            self.setLimit("max-connections", 1)
            return secondConnectionRefusal(self.connect)

        expected = ("(530) \"NOT_ALLOWED - connection refused for user '%s': user connection limit (1) "
                    "is reached\"" % (self.user,))
        return self.inThread(run).addCallback(lambda text: self.assertIn(expected, text or ""))

    def test_maxChannels(self):
        """channel.open over the user's max-channels closes the connection with 530."""
        def run():
            self.setLimit("max-channels", 1)
            c = self.connect()
            c.channel()
            try:
                c.channel()
            except pika.exceptions.ConnectionClosedByBroker as e:
                return e.reply_code, e.reply_text
            finally:
                if c.is_open:
                    c.close()

        return self.inThread(run).addCallback(self.assertEqual, (
            530, "NOT_ALLOWED - number of channels opened for user '%s' has reached the maximum allowed "
                 "user limit of (1)" % (self.user,)))
