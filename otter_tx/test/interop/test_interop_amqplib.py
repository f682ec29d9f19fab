"""
Interop tests with amqplib, the Node.js AMQP 0-9-1 client (a non-Python
client, as issue 2 asks).

The client side lives in ``otter_tx/test/interop/node``: ``package.json`` pins
amqplib and ``scenario.js NAME`` runs one scenario against
``OTTER_TEST_AMQP_URL``, printing one JSON line
``{"ok": true, "scenario": NAME, "result": {...}}`` (exit 0) or
``{"ok": false, ..., "error": "..."}`` (exit 1).  The scenarios only record
what they observe; the assertions are here.

Setup: ``npm ci --prefix otter_tx/test/interop/node`` (node_modules is git-ignored).
The tests are skipped when ``node`` or the installed amqplib is missing.
"""

import json
import os
import shutil

from twisted.trial.unittest import SkipTest

from otter_tx.test.interop.support import InteropTestCase

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
SCRIPT = os.path.join(NODE_DIR, "scenario.js")

RESOURCE_LOCKED = (
    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in "
    "vhost '/'. It could be originally declared on another connection or the "
    "exclusive property value does not match that of the original "
    "declaration."
)


def requireAmqplib():
    """
    The path of ``node``, or SkipTest naming what to install: Node.js, or
    amqplib's node_modules (missing when npm is absent or ``npm ci`` could not
    reach its registry; the README's test command then goes on without them).
    """
    node = shutil.which("node")
    if node is None:
        raise SkipTest("Node.js is not installed: apt-get install nodejs npm, then "
                       "npm ci --prefix otter_tx/test/interop/node")
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "amqplib")):
        raise SkipTest("amqplib is not installed: run npm ci --prefix otter_tx/test/interop/node "
                       "(it downloads amqplib from npm's registry, so it needs network access to it)")
    return node


class AmqplibTests(InteropTestCase):
    """
    amqplib (Node.js) scenarios against the broker.
    """

    def setUp(self):
        self.node = requireAmqplib()
        return InteropTestCase.setUp(self)

    def scenario(self, name):
        """
        Run ``scenario.js name``; return a Deferred firing with its result
        object, or failing with the script's output when it did not succeed.
        """
        d = self.runProcess(self.node, [SCRIPT, name], path=NODE_DIR)

        def parsed(outcome):
            out, err, code = outcome
            lines = out.decode("utf-8", "replace").strip().splitlines()
            report = None
            if lines:
                try:
                    report = json.loads(lines[-1])
                except ValueError:
                    pass
            if code != 0 or not report or not report.get("ok"):
                self.fail("node scenario %s failed (exit %r)\nstdout: %s\n"
                          "stderr: %s" % (name, code, out.decode(errors="replace"),
                                          err.decode(errors="replace")))
            self.assertEqual(report["scenario"], name)
            return report["result"]

        return d.addCallback(parsed)

    def test_connect(self):
        """
        amqplib connects, sees RabbitMQ's capabilities and tune values, and
        declares a server-named queue.
        """
        def check(r):
            for cap in ("publisher_confirms", "exchange_exchange_bindings",
                        "basic.nack", "consumer_cancel_notify",
                        "connection.blocked", "consumer_priorities",
                        "authentication_failure_close", "per_consumer_qos"):
                self.assertIs(r["capabilities"].get(cap), True, cap)
            self.assertTrue(r["hasProduct"])
            self.assertTrue(r["hasVersion"])
            self.assertEqual(r["frameMax"], 131072)
            self.assertEqual(r["channelMax"], 2047)
            self.assertEqual(r["heartbeat"], 60)
            self.assertEqual(r["queuePrefix"], "amq.gen-")

        return self.scenario("connect").addCallback(check)

    def test_declarePublishConsume(self):
        """
        A direct exchange routes three messages to a bound queue whose
        consumer gets them in order with delivery tags 1-3, then acks them.
        """
        def check(r):
            got = r["got"]
            self.assertEqual([g["body"] for g in got], ["m0", "m1", "m2"])
            self.assertEqual([g["deliveryTag"] for g in got], [1, 2, 3])
            for g in got:
                self.assertIs(g["redelivered"], False)
                self.assertEqual(g["exchange"], r["exchange"])
                self.assertEqual(g["routingKey"], "rk")
                self.assertEqual(g["consumerTag"], r["consumerTag"])
            self.assertTrue(r["consumerTag"].startswith("amq.ctag-"))
            self.assertEqual(r["after"]["messageCount"], 0)
            self.assertEqual(r["after"]["consumerCount"], 0)

        return self.scenario("declarePublishConsume").addCallback(check)

    def test_topicRouting(self):
        """
        Topic bindings 'a.*', 'a.#', '#.c', '*.b.*' and '#' match RabbitMQ's
        word semantics.
        """
        def check(r):
            self.assertEqual(r["routed"], {
                "a.*": ["a.b"],
                "a.#": ["a", "a.b", "a.b.c"],
                "#.c": ["a.b.c", "c"],
                "*.b.*": ["a.b.c", "x.b.y"],
                "#": ["a", "a.b", "a.b.c", "x.b.y", "c", "b.a"],
            })

        return self.scenario("topicRouting").addCallback(check)

    def test_headersExchange(self):
        """
        A headers exchange honours x-match all and any.
        """
        def check(r):
            self.assertEqual(r["all"], ["both"])
            self.assertEqual(r["any"], ["both", "one"])

        return self.scenario("headersExchange").addCallback(check)

    def test_prefetch(self):
        """
        With prefetch 2 the consumer holds two messages until an ack, then
        one more per ack; all five arrive in order.
        """
        def check(r):
            self.assertEqual(r["beforeAck"], 2)
            self.assertEqual(r["afterOneAck"], 3)
            self.assertEqual(r["bodies"], ["p0", "p1", "p2", "p3", "p4"])

        return self.scenario("prefetch").addCallback(check)

    def test_ackNackReject(self):
        """
        nack with requeue redelivers (redelivered=true); reject without
        requeue drops; get-ok reports the remaining message count.
        """
        def check(r):
            self.assertEqual(r["first"], {
                "body": "one", "redelivered": False, "messageCount": 1})
            self.assertEqual(r["again"], {"body": "two", "redelivered": True})
            self.assertIs(r["empty"], False)
            self.assertEqual(r["messageCount"], 0)

        return self.scenario("ackNackReject").addCallback(check)

    def test_get(self):
        """
        basic.get answers get-empty on an empty queue and get-ok with the
        message, properties and remaining count otherwise.
        """
        def check(r):
            self.assertIs(r["empty"], False)
            self.assertEqual(r["body"], "g1")
            self.assertEqual(r["messageCount"], 1)
            self.assertEqual(r["deliveryTag"], 1)
            self.assertEqual(r["exchange"], "")
            self.assertTrue(r["routingKey"].startswith("amq.gen-"))
            self.assertEqual(r["contentType"], "text/plain")

        return self.scenario("get").addCallback(check)

    def test_confirmChannel(self):
        """
        A confirm channel gets an ack for each of 51 publishes (one
        unroutable) and waitForConfirms resolves.
        """
        def check(r):
            self.assertEqual(r["confirmed"], 51)
            self.assertEqual(r["errors"], [])
            self.assertEqual(r["messageCount"], 50)

        return self.scenario("confirmChannel").addCallback(check)

    def test_mandatoryReturn(self):
        """
        An unroutable mandatory publish is returned (312 NO_ROUTE, with body
        and headers) before it is acked.
        """
        def check(r):
            self.assertEqual(r["events"], [
                {"event": "return", "replyCode": 312, "replyText": "NO_ROUTE",
                 "exchange": "", "routingKey": r["key"], "body": "bounce",
                 "headers": {"h": "v"}},
                {"event": "ack"},
            ])

        return self.scenario("mandatoryReturn").addCallback(check)

    def test_queueDeleteCancel(self):
        """
        Deleting a consumed queue calls the consumer callback with null (a
        server basic.cancel) and leaves the channel usable.
        """
        def check(r):
            self.assertEqual(r["calls"], [None])
            self.assertEqual(r["deletedMessageCount"], 0)
            self.assertIs(r["channelUsable"], True)

        return self.scenario("queueDeleteCancel").addCallback(check)

    def test_errors(self):
        """
        Channel errors carry RabbitMQ's codes, failing method ids and texts:
        404 (queue, exchange, publish), 406 (inequivalent, unknown delivery
        tag) and 405 (exclusive queue of another connection).
        """
        def check(r):
            def err(code, classMethod, text):
                return {"code": code, "classId": classMethod[0],
                        "methodId": classMethod[1], "text": text}

            def strip(e):
                return {k: e[k] for k in ("code", "classId", "methodId",
                                          "text")}

            missing = r["missing"]
            self.assertEqual(strip(r["notFoundQueue"]), err(
                404, (50, 10),
                "NOT_FOUND - no queue '%s' in vhost '/'" % (missing,)))
            self.assertEqual(strip(r["notFoundExchange"]), err(
                404, (40, 10),
                "NOT_FOUND - no exchange '%s' in vhost '/'" % (missing,)))
            self.assertEqual(strip(r["publishMissing"]), err(
                404, (60, 40),
                "NOT_FOUND - no exchange '%s' in vhost '/'" % (missing,)))
            self.assertEqual(strip(r["inequivalentExchange"]), err(
                406, (40, 10),
                "PRECONDITION_FAILED - inequivalent arg 'type' for exchange "
                "'%s' in vhost '/': received 'fanout' but current is 'direct'"
                % (r["ineqExchange"],)))
            self.assertEqual(strip(r["inequivalentQueue"]), err(
                406, (50, 10),
                "PRECONDITION_FAILED - inequivalent arg 'durable' for queue "
                "'%s' in vhost '/': received 'true' but current is 'false'"
                % (r["ineqQueue"],)))
            self.assertEqual(strip(r["locked"]), err(
                405, (50, 10), RESOURCE_LOCKED % (r["exclusiveQueue"],)))
            self.assertEqual(strip(r["unknownTag"]), err(
                406, (60, 80),
                "PRECONDITION_FAILED - unknown delivery tag 99"))

        return self.scenario("errors").addCallback(check)

    def test_largeMessage(self):
        """
        A 2 MiB message (split over many frames) arrives byte for byte.
        """
        def check(r):
            self.assertEqual(r, {"sentLength": 2097152,
                                 "receivedLength": 2097152, "same": True})

        return self.scenario("largeMessage").addCallback(check)

    def test_headers(self):
        """
        Headers of several field types and every basic property round trip.
        """
        def check(r):
            self.assertEqual(r["properties"], {
                "contentType": "application/json",
                "contentEncoding": "utf-8",
                "headers": {
                    "str": "text \u00e9", "int": 42, "neg": -7, "float": 1.5,
                    "bool": True, "nested": {"a": "b", "n": 1},
                    "list": [1, "two", False],
                },
                "deliveryMode": 2,
                "priority": 3,
                "correlationId": "corr-1",
                "replyTo": "reply-q",
                "expiration": "60000",
                "messageId": "mid-1",
                "timestamp": 1700000000,
                "type": "kind",
                "userId": "guest",
                "appId": "node-tests",
            })

        return self.scenario("headers").addCallback(check)
