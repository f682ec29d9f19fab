"""
Interop tests for per-resource permissions (configure / write / read regexes,
https://www.rabbitmq.com/docs/access-control) with pika.  Users are created
through the broker's Python API in-process, or through RabbitMQ's management
API when OTTER_TEST_MGMT_URL is set.
"""

import base64
import json
import os
import urllib.request
import uuid

import pika

from otter_tx.test.interop.support import EXTERNAL, InteropTestCase

MGMT = os.environ.get("OTTER_TEST_MGMT_URL")


def _http(method, path, body=None):
    req = urllib.request.Request(
        MGMT.rstrip("/") + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"content-type": "application/json",
                 "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    urllib.request.urlopen(req, timeout=10).read()


class PermissionTests(InteropTestCase):
    """A user limited to resources named lim-* may use only those."""

    def setUp(self):
        d = InteropTestCase.setUp(self)
        self.user = "limited-" + uuid.uuid4().hex[:8]
        if d is None:
            return self._addUser()
        return d.addCallback(lambda _: self._addUser())

    def _addUser(self):
        perms = {"configure": "^lim-", "write": "^lim-", "read": "^(lim-|amq\\.direct$)"}
        if EXTERNAL:
            if not MGMT:
                self.skipTest("needs OTTER_TEST_MGMT_URL to create a user on the external broker")
            return self.inThread(self._addExternal, perms)
        b = self.fixture.broker
        b.addUser(self.user, "pw")
        b.setPermissions(self.user, "/", perms["configure"], perms["write"], perms["read"])

    def _addExternal(self, perms):
        _http("PUT", "/api/users/" + self.user, {"password": "pw", "tags": ""})
        _http("PUT", "/api/permissions/%2F/" + self.user, perms)
        self.addCleanup(self.inThread, _http, "DELETE", "/api/users/" + self.user)

    def connect(self):
        p = self.pikaParams()
        p.credentials = pika.PlainCredentials(self.user, "pw")
        return pika.BlockingConnection(p)

    def refused(self, f):
        """Run f(channel) on a fresh channel; return (code, text) of the channel close or None."""
        c = self.connect()
        try:
            ch = c.channel()
            try:
                f(ch)
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code, e.reply_text
            return None
        finally:
            if c.is_open:
                c.close()

    def test_allowedResources(self):
        """Declaring, publishing to, binding and consuming lim-* resources works."""
        q = "lim-" + uuid.uuid4().hex[:8]

        def run():
            c = self.connect()
            ch = c.channel()
            ch.confirm_delivery()
            ch.queue_declare(q)
            ch.exchange_declare(q + "-x", "fanout")
            ch.queue_bind(q, q + "-x")
            ch.basic_publish(q + "-x", "", b"ok")
            m = ch.basic_get(q, auto_ack=True)
            ch.queue_delete(q)
            ch.exchange_delete(q + "-x")
            c.close()
            return m[2]

        return self.inThread(run).addCallback(self.assertEqual, b"ok")

    def test_configureRefused(self):
        """Declaring a queue outside the configure pattern is a 403 naming the queue and user."""
        q = "other-" + uuid.uuid4().hex[:8]
        d = self.inThread(self.refused, lambda ch: ch.queue_declare(q))
        return d.addCallback(
            self.assertEqual,
            (403, "ACCESS_REFUSED - access to queue '%s' in vhost '/' refused for user '%s'" % (q, self.user)),
        )

    def test_alternateExchangeNeedsWrite(self):
        """Declaring an exchange with an alternate-exchange needs write on the alternate: a 403 naming it."""
        x = "lim-ae-" + uuid.uuid4().hex[:8]
        d = self.inThread(self.refused, lambda ch: ch.exchange_declare(
            x, "fanout", arguments={"alternate-exchange": "other-ae"}))
        return d.addCallback(
            self.assertEqual,
            (403, "ACCESS_REFUSED - access to exchange 'other-ae' in vhost '/' refused for user '%s'" % (self.user,)),
        )

    def test_writeToDefaultExchangeRefused(self):
        """Publishing to the default exchange needs write on amq.default."""
        d = self.inThread(self.refused, lambda ch: (ch.basic_publish("", "lim-x", b"x"), ch.basic_qos(prefetch_count=1)))
        return d.addCallback(
            self.assertEqual,
            (403, "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user '%s'" % (self.user,)),
        )

    def test_readRefused(self):
        """basic.get on a queue outside the read pattern is a 403."""
        q = "lim-" + uuid.uuid4().hex[:8]

        def run():
            # the guest user creates a queue the limited user may configure but not read
            g = self.pikaConnection()
            gch = g.channel()
            gch.queue_declare("nr-" + q, auto_delete=True)
            try:
                return self.refused(lambda ch: ch.basic_get("nr-" + q))
            finally:
                gch.queue_delete("nr-" + q)
                g.close()

        return self.inThread(run).addCallback(
            self.assertEqual,
            (403, "ACCESS_REFUSED - access to queue 'nr-%s' in vhost '/' refused for user '%s'" % (q, self.user)),
        )
