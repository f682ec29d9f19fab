"""
Interop tests for what the admin web app reads over real HTTP, with pika
publishing and getting: the otter-only queue-insight endpoints (``/browse``,
``/expiry``, ``/dead-letter``; RabbitMQ has none, so those tests run against
otter_tx only) and the page at ``/``, which both brokers serve.
"""

import urllib.request

from otter_tx.test.interop.support import InteropTestCase, ManagementMixin, onlyOtter


class WebAppInteropTests(ManagementMixin, InteropTestCase):
    """The app's page and the queue-insight endpoints, with a real client on the other side."""

    def test_pageAtRoot(self):
        """GET / answers an HTML page without credentials, on otter_tx as on RabbitMQ."""
        def run():
            with urllib.request.urlopen(self.mgmtBase() + "/", timeout=10) as r:
                return r.status, r.headers.get("content-type"), r.read()

        def check(r):
            status, ctype, body = r
            self.assertEqual(status, 200)
            self.assertTrue(ctype.startswith("text/html"), ctype)
            self.assertIn(b"<html", body.lower())

        return self.inThread(run).addCallback(check)

    @onlyOtter("/browse, /expiry and /dead-letter are otter_tx's own endpoints")
    def test_browseExpiryDeadLetter(self):
        """pika's messages browse in order without being marked redelivered; expiry and DLX target are right."""
        import pika

        q, dlq, dlx = self.name("webapp-q"), self.name("webapp-dlq"), self.name("webapp-dlx")
        base = "/api/queues/%2F/" + q

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            try:
                ch.exchange_declare(dlx, "direct")
                ch.queue_declare(dlq)
                ch.queue_bind(dlq, dlx, "dead")
                ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead",
                                               "x-expires": 600000})
                ch.basic_publish("", q, b"one", pika.BasicProperties(expiration="60000", message_id="m1"))
                ch.basic_publish("", q, b"two")
                ch.basic_publish("", q, b"\xff\xfe")
                browsed = self.mgmtCall("POST", base + "/browse", {"count": 5, "encoding": "auto"})
                again = self.mgmtCall("POST", base + "/browse", {"count": 1, "offset": 1, "encoding": "auto"})
                expiry = self.mgmtCall("GET", base + "/expiry")
                target = self.mgmtCall("GET", base + "/dead-letter")
                method, _, body = ch.basic_get(q, auto_ack=True)
                return browsed, again, expiry, target, (method.redelivered, body, method.message_count)
            finally:
                for name in (q, dlq):
                    ch.queue_delete(name)
                ch.exchange_delete(dlx)
                c.close()

        def check(r):
            browsed, again, expiry, target, got = r
            self.assertEqual(browsed[0], 200)
            self.assertEqual([(m["payload"], m["payload_encoding"], m["redelivered"], m["message_count"])
                              for m in browsed[1]],
                             [("one", "string", False, 2), ("two", "string", False, 1), ("//4=", "base64", False, 0)])
            self.assertEqual(browsed[1][0]["properties"], {"expiration": "60000", "message_id": "m1"})
            self.assertEqual([m["payload"] for m in again[1]], ["two"])
            status, x = expiry
            self.assertEqual((status, x["within_1min"], x["never"], x["x_expires"]), (200, 1, 2, 600000))
            self.assertIsInstance(x["expires_at"], int)
            self.assertEqual(target, (200, {"exchange": dlx, "routing_key": "dead", "strategy": "at-most-once",
                                            "queues": [{"vhost": "/", "name": dlq, "routing_key": "dead"}]}))
            self.assertEqual(got, (False, b"one", 2))

        return self.inThread(run).addCallback(check)
