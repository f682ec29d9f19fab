"""
Interop tests for scheduled messages you can see and cancel (issue 11,
docs/delayed.md): ``x-delay-until``, the ``x-delayed-command`` RPC with pika
and amqplib over direct reply-to, and the management API's ``/delayed``
endpoints over real HTTP.

RabbitMQ's delayed-message plugin has none of this (and Debian's RabbitMQ
3.10 ships without the plugin), so every test is otter-only.
"""

import json
import os
import time
import uuid

import pika
from otter_tx.test.interop import test_interop_amqplib
from otter_tx.test.interop.support import InteropTestCase, ManagementMixin, onlyOtter

OTTER_ONLY = "listing, cancelling and purging held messages and x-delay-until are otter_tx features"
NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")


class PikaScheduledTests(InteropTestCase):
    """pika: absolute due times and the command RPC on the exchange."""

    def open(self, ex, xtype="fanout"):
        """
        ``(connection, channel, queue, replies)``: a pika channel with an
        auto-delete delayed exchange ``ex`` of ``xtype``, an exclusive queue
        bound to it with key ``job``, and a direct reply-to consumer filling
        ``replies`` (correlation id -> (properties, body)).
        """
        c = self.pikaConnection()
        ch = c.channel()
        ch.exchange_declare(ex, "x-delayed-message", auto_delete=True, arguments={"x-delayed-type": xtype})
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, ex, "job")
        replies = {}
        ch.basic_consume("amq.rabbitmq.reply-to",
                         lambda _c, _m, p, b: replies.__setitem__(p.correlation_id, (p, b)), auto_ack=True)
        return c, ch, q, replies

    def rpc(self, ch, exchange, replies, command, args=None, body=None, **headers):
        """One command over direct reply-to; returns ``(status, JSON body)``."""
        cid = uuid.uuid4().hex
        headers["x-delayed-command"] = command
        ch.basic_publish(exchange, "job", json.dumps(args or {}).encode() if body is None else body,
                         pika.BasicProperties(headers=headers, reply_to="amq.rabbitmq.reply-to", correlation_id=cid))
        deadline = time.monotonic() + 5
        while cid not in replies and time.monotonic() < deadline:
            ch.connection.process_data_events(0.01)
        props, body = replies.pop(cid)
        return props.headers["x-delayed-status"], json.loads(body)

    def getOne(self, ch, q):
        """The first message of ``q`` as ``(ms since the epoch at arrival, headers, body)``, waiting up to 5 s."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = ch.basic_get(q, auto_ack=True)
            if m[0] is not None:
                return time.time() * 1000, m[1].headers, m[2]
            ch.connection.process_data_events(0.005)
        return None

    @onlyOtter(OTTER_ONLY)
    def test_listCancelPurge(self):
        """pika lists held messages in due order, cancels by id and by message_id, and purges."""
        ex = self.name("sched")

        def run():
            c, ch, _, replies = self.open(ex, "direct")
            for delay, mid in ((60000, "order-1"), (30000, None), (90000, "order-1"), (45000, "order-2")):
                ch.basic_publish(ex, "job", b"x", pika.BasicProperties(headers={"x-delay": delay}, message_id=mid))
            out = {"list": self.rpc(ch, ex, replies, "list", {"page": 1, "page_size": 3})}
            out["byId"] = self.rpc(ch, ex, replies, "cancel", {"id": "2"})
            out["byMessageId"] = self.rpc(ch, ex, replies, "cancel", {"message_id": "order-1"})
            out["again"] = self.rpc(ch, ex, replies, "cancel", {"id": "2"})
            out["bad"] = self.rpc(ch, ex, replies, "rewind")
            out["left"] = self.rpc(ch, ex, replies, "list")
            out["purge"] = self.rpc(ch, ex, replies, "purge")
            out["open"] = ch.is_open
            ch.exchange_delete(ex)
            c.close()
            return out

        def check(out):
            status, page = out["list"]
            self.assertEqual((status, [i["id"] for i in page["items"]], page["total_count"]),
                             (200, ["2", "4", "1"], 4))
            self.assertEqual(page["items"][2]["message_id"], "order-1")
            self.assertEqual(out["byId"], (204, {"cancelled": 1}))
            self.assertEqual(out["byMessageId"], (204, {"cancelled": 2}))
            self.assertEqual(out["again"][0], 404)
            self.assertEqual(out["bad"][0], 400)
            self.assertEqual([i["id"] for i in out["left"][1]["items"]], ["4"])
            self.assertEqual(out["purge"], (204, {"purged": 1}))
            self.assertTrue(out["open"])

        return self.inThread(run).addCallback(check)

    @onlyOtter(OTTER_ONLY)
    def test_scheduleAnswersId(self):
        """The schedule command answers the broker id, and the message arrives later carrying it."""
        ex = self.name("sched")

        def run():
            c, ch, q, replies = self.open(ex)
            answer = self.rpc(ch, ex, replies, "schedule", body=b"later", **{"x-delay": 300})
            got = self.getOne(ch, q)
            ch.exchange_delete(ex)
            c.close()
            return answer, got

        def check(out):
            (status, answer), (_, headers, body) = out
            self.assertEqual((status, sorted(answer)), (201, ["due", "id"]))
            self.assertEqual((headers.get("x-delayed-id"), body), (answer["id"], b"later"))
            self.assertNotIn("x-delayed-command", headers)

        return self.inThread(run).addCallback(check)

    @onlyOtter(OTTER_ONLY)
    def test_delayUntil(self):
        """A message with x-delay-until (epoch ms) arrives at that instant carrying its broker id."""
        ex = self.name("sched")

        def run():
            c, ch, q, _ = self.open(ex)
            due = int(time.time() * 1000) + 500
            ch.basic_publish(ex, "", b"at", pika.BasicProperties(headers={"x-delay-until": due}))
            arrived, headers, body = self.getOne(ch, q)
            ch.exchange_delete(ex)
            c.close()
            return arrived - due, headers["x-delayed-id"], body

        def check(got):
            late, heldId, body = got
            self.assertEqual((heldId, body), ("1", b"at"))
            self.assertGreaterEqual(late, -5)
            self.assertLess(late, 1000)

        return self.inThread(run).addCallback(check)


class AmqplibScheduledTests(InteropTestCase):
    """amqplib (Node.js): the docs/delayed.md example, run as node/scheduled.js."""

    #: skips without node or amqplib, naming what to install, as the amqplib module does
    setUp = test_interop_amqplib.AmqplibTests.setUp

    @onlyOtter(OTTER_ONLY)
    def test_amqplib(self):
        """amqplib lists, cancels by id and message_id over direct reply-to, and gets the message left when due."""
        d = self.runProcess(self.node, [os.path.join(NODE_DIR, "scheduled.js")], path=NODE_DIR)

        def check(outcome):
            out, err, code = outcome
            lines = out.decode("utf-8", "replace").strip().splitlines()
            report = json.loads(lines[-1]) if lines else {}
            if code != 0 or not report.get("ok"):
                self.fail("scheduled.js failed (exit %r)\nstdout: %s\nstderr: %s"
                          % (code, out.decode(errors="replace"), err.decode(errors="replace")))
            r = report["result"]
            self.assertEqual((r["before"], r["beforeStatus"], r["total"], r["cancelled"]),
                             (["3", "2", "1"], 200, 3, "2"))
            self.assertEqual(r["byId"], {"status": 204, "body": {"cancelled": 1}})
            self.assertEqual(r["byMessageId"], {"status": 204, "body": {"cancelled": 1}})
            self.assertEqual(r["missing"]["status"], 404)
            self.assertEqual(r["after"], ["3"])
            self.assertEqual(r["fired"], {"body": "c", "id": "3"})
            self.assertEqual(r["purge"], {"status": 204, "body": {"purged": 0}})

        return d.addCallback(check)


class HTTPScheduledTests(ManagementMixin, InteropTestCase):
    """The /delayed endpoints over real HTTP, with pika publishing."""

    @onlyOtter(OTTER_ONLY)
    def test_httpListCancelPurge(self):
        """HTTP lists held messages, cancels one (204, then 404), purges, and 404s a plain exchange."""
        ex = self.name("sched")
        path = "/api/exchanges/%2F/" + ex + "/delayed"

        def run():
            c = self.pikaConnection()
            ch = c.channel()
            ch.exchange_declare(ex, "x-delayed-message", arguments={"x-delayed-type": "direct"})
            for delay in (20000, 10000, 30000):
                ch.basic_publish(ex, "k", b"x", pika.BasicProperties(headers={"x-delay": delay}))
            c.close()
            out = {"list": self.mgmtCall("GET", path + "?page=1&page_size=2")}
            out["cancel"] = self.mgmtCall("DELETE", path + "/2")
            out["again"] = self.mgmtCall("DELETE", path + "/2")
            out["exchange"] = self.mgmtCall("GET", "/api/exchanges/%2F/" + ex)[1]["messages_delayed"]
            out["purge"] = self.mgmtCall("DELETE", path)
            out["after"] = self.mgmtCall("GET", path)[1]["total_count"]
            out["plain"] = self.mgmtCall("GET", "/api/exchanges/%2F/amq.direct/delayed")
            out["badPage"] = self.mgmtCall("GET", path + "?page=0")[0]
            self.mgmtCall("DELETE", "/api/exchanges/%2F/" + ex)
            return out

        def check(out):
            status, page = out["list"]
            self.assertEqual((status, [i["id"] for i in page["items"]], page["total_count"], page["page_size"]),
                             (200, ["2", "1"], 3, 2))
            self.assertEqual(out["cancel"], (204, None))
            self.assertEqual(out["again"], (404, {"error": "Object Not Found", "reason": "Not Found"}))
            self.assertEqual(out["exchange"], 2)
            self.assertEqual((out["purge"], out["after"]), ((204, None), 0))
            self.assertEqual(out["plain"], (404, {"error": "Object Not Found", "reason": "Not Found"}))
            self.assertEqual(out["badPage"], 400)

        return self.inThread(run).addCallback(check)
