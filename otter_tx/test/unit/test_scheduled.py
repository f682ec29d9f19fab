"""
Deterministic tests (task.Clock) for scheduled messages you can see and
cancel (issue 11, docs/delayed.md): ``x-delay-until``, broker ids, listing,
cancelling and purging held messages in the broker, over the management API
(StubTreq) and over AMQP (``x-delayed-command``, FakeClient), and their
durability through the journal (MemoryStore restarts).
"""

import json
import random

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.amqp.codec import Timestamp, encodeProperties
from otter_tx.broker.broker import Broker
from otter_tx.broker.delayed import (
    HeldSet,
    delayUntil,
    messageDue,
    pageParameters,
)
from otter_tx.broker.message import Message
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.store.memory import MemoryStore
from otter_tx.test.unit import test_metrics, test_web
from otter_tx.testing import FakeClient, journaledBroker

#: a clock start in epoch seconds, so x-delay-until values look real
T0 = 1_800_000_000.0
T0_MS = int(T0 * 1000)


def msg(headers=None, rk="k", body=b"m", exchange="dx", **props):
    """A broker Message with ``headers`` and other properties."""
    if headers is not None:
        props["headers"] = headers
    return Message(exchange, rk, encodeProperties(props), body)


class DueTimeTests(SynchronousTestCase):
    """x-delay-until parsing and its precedence over x-delay."""

    def test_delayUntilValues(self):
        """Epoch ms as int, numeric string or truncated float, and AMQP timestamps in seconds, are read."""
        self.assertEqual(delayUntil(msg({"x-delay-until": T0_MS + 5})), T0_MS + 5)
        self.assertEqual(delayUntil(msg({"x-delay-until": str(T0_MS)})), T0_MS)
        self.assertEqual(delayUntil(msg({"x-delay-until": T0_MS + 0.9})), T0_MS)
        self.assertEqual(delayUntil(msg({"x-delay-until": Timestamp(1_800_000_001)})), 1_800_000_001_000)
        for bad in ("soon", True, 0, -5, [1], {"a": 1}, float("nan"), float("inf"), Timestamp(0)):
            self.assertIsNone(delayUntil(msg({"x-delay-until": bad})), bad)
        self.assertIsNone(delayUntil(msg()))

    def test_precedenceAndCap(self):
        """A usable x-delay-until wins; a malformed one leaves x-delay; past or beyond 2^32-1 ms routes now."""
        now = float(T0_MS)
        self.assertEqual(messageDue(msg({"x-delay-until": T0_MS + 900, "x-delay": 5}), now), T0_MS + 900)
        self.assertEqual(messageDue(msg({"x-delay-until": "garbage", "x-delay": 5}), now), now + 5)
        self.assertIsNone(messageDue(msg({"x-delay-until": T0_MS - 1, "x-delay": 5}), now))
        self.assertIsNone(messageDue(msg({"x-delay-until": T0_MS}), now))
        self.assertEqual(messageDue(msg({"x-delay-until": T0_MS + 4294967295}), now), T0_MS + 4294967295)
        self.assertIsNone(messageDue(msg({"x-delay-until": T0_MS + 4294967296}), now))
        self.assertEqual(messageDue(msg({"x-delay": 7}), now), now + 7)
        self.assertIsNone(messageDue(msg({"x-delay": 0}), now))

    def test_pageParameters(self):
        """Pages count from 1 and sizes are 1..500 (default 100); anything else is RabbitMQ's 400 text."""
        self.assertEqual(pageParameters(None, None), (1, 100))
        self.assertEqual(pageParameters("3", "500"), (3, 500))
        for page, size in ((0, 10), ("x", 10), (1, 0), (1, 501), (1.5, 10), (True, 10), (1, "x")):
            e = self.assertRaises(ValueError, pageParameters, page, size)
            self.assertIn("Invalid pagination parameters: page number", str(e))


class ExchangeTestCase(SynchronousTestCase):
    """A broker on a clock at T0 with x-delayed-message exchange ``dx`` (direct) bound to queue ``q``."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(T0)
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.ex = self.vh.declareExchange("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        self.q = self.vh.declareQueue("q", None)
        self.vh.bind(self.ex, self.q, "k", {})

    def bodies(self):
        """The bodies ready in ``q``."""
        return [e.message.body for e in self.q.readyEntries()]

    def ids(self, page=1, size=100):
        """The broker ids of one page of held messages."""
        return [i["id"] for i in self.ex.heldPage(page, size)["items"]]


class HeldSetTests(ExchangeTestCase):
    """Holding until an absolute instant, ids, listing, cancelling and purging."""

    def test_absoluteDueTime(self):
        """A message with x-delay-until is routed at that instant with its broker id in x-delayed-id."""
        self.assertEqual(self.vh.publish(self.ex, msg({"x-delay-until": T0_MS + 1500})), (0, False))
        self.clock.advance(1.499)
        self.assertEqual(self.q.readyCount, 0)
        self.clock.advance(0.001)
        (e,) = self.q.readyEntries()
        self.assertEqual(e.message.headers, {"x-delay-until": T0_MS + 1500, "x-delayed-id": "1"})

    def test_pastDueRoutesNow(self):
        """An x-delay-until in the past routes the message at once, even with an x-delay."""
        self.assertEqual(self.vh.publish(self.ex, msg({"x-delay-until": T0_MS - 10, "x-delay": 100})), (1, False))

    def test_listInDueOrderAcrossChunks(self):
        """Pages list held messages in due order (ties by id) however they were published, chunk splits included."""
        rnd = random.Random(11)
        n = 3 * HeldSet.LOAD + 7
        dues = [rnd.randrange(1, 5000) for _ in range(n)]
        for i, d in enumerate(dues):
            self.vh.publish(self.ex, msg({"x-delay": d}, body=b"%d" % i))
        expected = [str(i + 1) for i in sorted(range(n), key=lambda i: (dues[i], i))]
        got = []
        page = 1
        while True:
            p = self.ex.heldPage(page, 97)
            self.assertEqual((p["total_count"], p["page"], p["page_size"]), (n, page, 97))
            if not p["items"]:
                break
            got.extend(i["id"] for i in p["items"])
            page += 1
        self.assertEqual(got, expected)
        first = self.ex.heldPage(1, 1)["items"][0]
        self.assertEqual(first["due"], T0_MS + min(dues))

    def test_itemShape(self):
        """A listed item has id, message_id, due (epoch ms), routing_key, properties and payload_bytes."""
        self.vh.publish(self.ex, msg({"x-delay": 250}, rk="k", body=b"hello", message_id="m-1", priority=3))
        self.assertEqual(self.ex.heldPage(1, 10), {
            "items": [{"id": "1", "message_id": "m-1", "due": T0_MS + 250, "routing_key": "k",
                       "properties": {"headers": {"x-delay": 250}, "message_id": "m-1", "priority": 3},
                       "payload_bytes": 5}],
            "total_count": 1, "page": 1, "page_size": 10,
        })

    def test_cancelById(self):
        """A cancelled message never fires; unknown and malformed ids cancel nothing."""
        for d in (100, 200, 300):
            self.vh.publish(self.ex, msg({"x-delay": d}, body=b"%d" % d))
        self.assertTrue(self.ex.cancel("2"))
        self.assertFalse(self.ex.cancel("2"))
        self.assertFalse(self.ex.cancel("99"))
        self.assertFalse(self.ex.cancel("two"))
        self.assertFalse(self.ex.cancel(None))
        for bad in (True, 1.0, " 1", "1_0", "-1", "\u00b9", [1]):
            self.assertFalse(self.ex.cancel(bad), bad)
        self.assertEqual((self.ex.held, self.ids()), (2, ["1", "3"]))
        self.clock.advance(0.3)
        self.assertEqual(self.bodies(), [b"100", b"300"])

    def test_cancelFirstRearmsTimer(self):
        """Cancelling the earliest message leaves one timer, and the next message still fires on time."""
        self.vh.publish(self.ex, msg({"x-delay": 100}, body=b"a"))
        self.vh.publish(self.ex, msg({"x-delay": 200}, body=b"b"))
        self.ex.cancel("1")
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(0.1)
        self.assertEqual(self.bodies(), [])
        self.clock.advance(0.1)
        self.assertEqual(self.bodies(), [b"b"])
        self.ex.cancel("2")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_cancelByMessageId(self):
        """Cancelling by message_id drops every held message with it and no other; fired ones are forgotten."""
        self.vh.publish(self.ex, msg({"x-delay": 100}, message_id="a", body=b"a1"))
        self.vh.publish(self.ex, msg({"x-delay": 200}, message_id="b", body=b"b"))
        self.vh.publish(self.ex, msg({"x-delay": 300}, message_id="a", body=b"a2"))
        self.vh.publish(self.ex, msg({"x-delay": 50}, message_id="c", body=b"c"))
        self.assertEqual(self.ex.cancelMessageId("a"), 2)
        self.assertEqual(self.ex.cancelMessageId("a"), 0)
        self.clock.advance(0.1)
        self.assertEqual(self.ex.cancelMessageId("c"), 0)
        self.assertEqual(self.ex._set.byMessageId, {"b": 2})
        self.clock.advance(0.2)
        self.assertEqual(self.bodies(), [b"c", b"b"])

    def test_purge(self):
        """A purge drops every held message and the timer; later publishes are held again."""
        for d in (100, 200):
            self.vh.publish(self.ex, msg({"x-delay": d}, message_id="x"))
        self.assertEqual(self.ex.purgeHeld(), 2)
        self.assertEqual((self.ex.held, self.clock.getDelayedCalls(), self.ex._set.byMessageId), (0, [], {}))
        self.vh.publish(self.ex, msg({"x-delay": 100}, body=b"again"))
        self.clock.advance(1)
        self.assertEqual(self.bodies(), [b"again"])

    def test_deleteAndRecreateStartsEmpty(self):
        """A re-created exchange holds nothing of the deleted one's messages."""
        self.vh.publish(self.ex, msg({"x-delay": 100}))
        self.vh.deleteExchange("dx")
        ex = self.vh.declareExchange("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        self.vh.bind(ex, self.q, "k", {})
        self.assertEqual(ex.held, 0)
        self.clock.advance(1)
        self.assertEqual(self.q.readyCount, 0)

    def test_manyHeldOperations(self):
        """The bench's operations on 20,000 held messages: pages first, middle and last, cancel by id and by message_id."""
        n = 20000
        for i in range(n):
            self.vh.publish(self.ex, msg({"x-delay": 1 + (i * 7919) % 600000}, message_id="m%d" % i))
        pages = -(-n // 100)
        self.assertEqual(len(self.ids(1)), 100)
        self.assertEqual(len(self.ids(pages // 2)), 100)
        last = self.ex.heldPage(pages, 100)["items"]
        self.assertEqual(len(last), n - (pages - 1) * 100)
        self.assertEqual(last[-1]["due"], max(i["due"] for i in self.ex.heldPage(pages - 1, 100)["items"] + last))
        middle = self.ids(pages // 2)[50]
        self.assertTrue(self.ex.cancel(middle))
        self.assertEqual(self.ex.cancelMessageId("m12345"), 1)
        self.assertEqual(self.ex.held, n - 2)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(600)
        self.assertEqual(self.q.readyCount, n - 2)


class DurabilityTests(SynchronousTestCase):
    """Cancel, purge, delete and ids survive a restart (journal and MemoryStore)."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(T0)
        self.store = MemoryStore()
        self.boot()
        self.vh.declareExchange("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        self.vh.declareQueue("q", None, durable=True)
        self.vh.bind(self.vh.exchanges["dx"], self.vh.queues["q"], "k", {})

    def boot(self):
        """Start (or restart) the broker on the store."""
        self.broker = journaledBroker(self.store, self.clock)
        self.vh = self.broker.vhosts["/"]

    def restart(self):
        """Stop, close the store, boot again."""
        self.broker.stop()
        self.successResultOf(self.store.close())
        self.boot()

    def publish(self, delay, **props):
        """Publish to dx with x-delay ``delay``."""
        self.vh.publish(self.vh.exchanges["dx"], msg({"x-delay": delay}, **props))

    def test_cancelSurvivesRestart(self):
        """A cancelled message (by id and by message_id) stays cancelled; the others keep their ids."""
        for i in range(5):
            self.publish(1000 * (i + 1), message_id="m%d" % i, body=b"%d" % i)
        ex = self.vh.exchanges["dx"]
        self.assertTrue(ex.cancel("2"))
        self.assertEqual(ex.cancelMessageId("m3"), 1)
        self.restart()
        ex = self.vh.exchanges["dx"]
        self.assertEqual([i["id"] for i in ex.heldPage(1, 10)["items"]], ["1", "3", "5"])
        self.assertEqual(ex.cancelMessageId("m4"), 1)
        self.publish(100, body=b"new")
        # ids 1..1000 were reserved in the store before the restart: new ones come after them
        self.assertEqual(ex.heldPage(1, 1)["items"][0]["id"], "1001")
        self.clock.advance(10)
        self.assertEqual([e.message.body for e in self.vh.queues["q"].readyEntries()], [b"new", b"0", b"2"])

    def test_idsNeverGivenTwice(self):
        """Every message held finds its id unused: after restarts with nothing held, and past a reserved block."""
        ex = self.vh.exchanges["dx"]
        self.publish(100)
        self.clock.advance(1)
        self.restart()
        ex = self.vh.exchanges["dx"]
        self.publish(100)
        self.assertEqual(ex.heldPage(1, 1)["items"][0]["id"], "1001")
        for _ in range(1000):
            self.publish(100)
        self.restart()
        ex = self.vh.exchanges["dx"]
        self.publish(100)
        # 1001..2001 took the block 1001..2000 and the next one; the restart skips the rest of it
        self.assertEqual(ex.heldPage(1, 2000)["items"][-1]["id"], "3001")
        self.assertEqual(ex.idsReserved, 4000)
        # a re-created exchange starts again from 1 (its record went with the old one)
        self.vh.deleteExchange("dx")
        self.vh.declareExchange("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        self.restart()
        self.publish(100)
        self.assertEqual(self.vh.exchanges["dx"].heldPage(1, 1)["items"][0]["id"], "1")

    def test_purgeSurvivesRestart(self):
        """A purge is durable; messages held after it are kept."""
        self.publish(1000)
        self.publish(2000)
        self.vh.exchanges["dx"].purgeHeld()
        self.publish(3000, body=b"after")
        self.restart()
        ex = self.vh.exchanges["dx"]
        self.assertEqual([i["payload_bytes"] for i in ex.heldPage(1, 10)["items"]], [5])

    def test_deleteRecreateRestart(self):
        """Deleting drops the held messages from the store: re-created and restarted, the exchange is empty."""
        self.publish(1000)
        self.vh.deleteExchange("dx")
        self.vh.declareExchange("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        self.restart()
        self.assertEqual(self.vh.exchanges["dx"].held, 0)
        self.clock.advance(5)
        self.assertEqual(self.vh.queues["q"].readyCount, 0)

    def test_vhostDeleteDropsHeld(self):
        """Deleting the vhost stops its delayed exchange's messages and drops them from the store."""
        self.broker.addVHost("v")
        vh = self.broker.vhosts["v"]
        ex = vh.declareExchange("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        q = vh.declareQueue("q", None, durable=True)
        vh.bind(ex, q, "k", {})
        vh.publish(ex, msg({"x-delay": 1000}))
        self.broker.deleteVHost("v")
        self.assertEqual((ex.held, ex.deleted), (0, True))
        self.broker.addVHost("v")
        self.restart()
        self.assertEqual(self.broker.vhosts["v"].exchanges.get("dx"), None)
        self.assertEqual([k for k in self.store._queues if "\x01delayed" in k], [])

    def test_absoluteDueSurvivesRestart(self):
        """An x-delay-until message fires at its instant after a restart in between."""
        self.vh.publish(self.vh.exchanges["dx"], msg({"x-delay-until": T0_MS + 3000}, body=b"at"))
        self.restart()
        self.clock.advance(2.999)
        self.assertEqual(self.vh.queues["q"].readyCount, 0)
        self.clock.advance(0.001)
        self.assertEqual(self.vh.queues["q"].readyCount, 1)


class MetricsTests(test_metrics.MetricsTestCase):
    """otter_delayed_messages follows cancel, purge and delete."""

    def test_heldGauge(self):
        """The gauge drops after a cancel and a purge, and the family loses the deleted exchange."""
        c = self.client()
        c.send(1, spec.ExchangeDeclare(0, "d", "x-delayed-message", False, False, False, False, False,
                                       {"x-delayed-type": "direct"}))
        for _ in range(3):
            c.publish(1, "d", "k", b"x", props={"headers": {"x-delay": 5000}})
        c.received()
        ex = self.broker.vhosts["/"].exchanges["d"]
        ex.cancel("1")
        self.assertEqual(test_metrics.value(self.metrics(), "otter_delayed_messages", vhost="/", exchange="d"), 2)
        ex.purgeHeld()
        self.assertEqual(test_metrics.value(self.metrics(), "otter_delayed_messages", vhost="/", exchange="d"), 0)
        self.broker.vhosts["/"].deleteExchange("d")
        self.assertRaises(KeyError, test_metrics.value, self.metrics(), "otter_delayed_messages",
                          vhost="/", exchange="d")


class HTTPTests(test_web.WebTestCase):
    """The management API's delayed endpoints (contract 3 of the issue 10/11 brief)."""

    def setUp(self):
        test_web.WebTestCase.setUp(self)
        self.clock.advance(T0)
        self.ex = self.vh.declareExchange("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        self.vh.declareExchange("plain", "direct")
        for i, d in enumerate((300, 100, 200)):
            self.vh.publish(self.ex, msg({"x-delay": d}, message_id="m%d" % i, body=b"%d" % i))

    def test_list(self):
        """GET lists in due order with paging fields; exchange JSON keeps messages_delayed."""
        r = self.get("/api/exchanges/%2F/dx/delayed?page=1&page_size=2")
        self.assertEqual(r.code, 200)
        body = r.json()
        self.assertEqual(([i["id"] for i in body["items"]], body["total_count"], body["page"], body["page_size"]),
                         (["2", "3"], 3, 1, 2))
        self.assertEqual(body["items"][0]["due"], T0_MS + 100)
        self.assertEqual([i["id"] for i in self.get("/api/exchanges/%2F/dx/delayed").json()["items"]],
                         ["2", "3", "1"])
        self.assertEqual(self.get("/api/exchanges/%2F/dx").json()["messages_delayed"], 3)

    def test_dueFrom(self):
        """due_from=T (epoch ms): the page holding the first message due at or after T; past the end, the last."""
        pages = {}
        for t in (0, T0_MS + 100, T0_MS + 150, T0_MS + 300, T0_MS + 999):
            body = self.get("/api/exchanges/%%2F/dx/delayed?page_size=1&due_from=%d" % (t,)).json()
            pages[t] = (body["page"], [i["id"] for i in body["items"]])
        self.assertEqual(pages, {0: (1, ["2"]), T0_MS + 100: (1, ["2"]), T0_MS + 150: (2, ["3"]),
                                 T0_MS + 300: (3, ["1"]), T0_MS + 999: (3, ["1"])})
        body = self.get("/api/exchanges/%2F/dx/delayed?page_size=2&due_from=" + str(T0_MS + 300)).json()
        self.assertEqual((body["page"], [i["id"] for i in body["items"]]), (2, ["1"]))
        self.ex.purgeHeld()
        body = self.get("/api/exchanges/%2F/dx/delayed?due_from=5").json()
        self.assertEqual((body["page"], body["items"]), (1, []))
        r = self.get("/api/exchanges/%2F/dx/delayed?due_from=soon")
        self.assertEqual((r.code, r.json()["error"]), (400, "invalid_pagination_parameters"))

    def test_badPaging(self):
        """Bad page or page_size is 400 invalid_pagination_parameters."""
        for q in ("page=0", "page=x", "page_size=501", "page_size=0", "page=1&page_size=-1"):
            r = self.get("/api/exchanges/%2F/dx/delayed?" + q)
            self.assertEqual((r.code, r.json()["error"]), (400, "invalid_pagination_parameters"), q)

    def test_notFound(self):
        """An unknown vhost, unknown exchange or non-delayed exchange is 404 Object Not Found."""
        for path in ("/api/exchanges/nope/dx/delayed", "/api/exchanges/%2F/nope/delayed",
                     "/api/exchanges/%2F/plain/delayed", "/api/exchanges/%2F/amq.default/delayed"):
            r = self.get(path)
            self.assertEqual((r.code, r.json()), (404, {"error": "Object Not Found", "reason": "Not Found"}), path)
        r = self.request("DELETE", "/api/exchanges/%2F/plain/delayed/1")
        self.assertEqual(r.code, 404)

    def test_cancelOne(self):
        """DELETE of a held id is 204 and it is gone; a second time, or an unknown id, is 404."""
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed/3").code, 204)
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed/3").code, 404)
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed/abc").code, 404)
        self.assertEqual(self.ex.held, 2)

    def test_cancelByMessageId(self):
        """DELETE by-message-id cancels the held messages with that message_id (204), else 404."""
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed/by-message-id/m0").code, 204)
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed/by-message-id/m0").code, 404)
        self.assertEqual([i["message_id"] for i in self.get("/api/exchanges/%2F/dx/delayed").json()["items"]],
                         ["m1", "m2"])

    def test_purge(self):
        """DELETE of the collection purges every held message (204)."""
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed").code, 204)
        self.assertEqual(self.get("/api/exchanges/%2F/dx/delayed").json()["total_count"], 0)
        self.assertEqual(self.get("/api/exchanges/%2F/dx").json()["messages_delayed"], 0)

    def test_permissions(self):
        """Listing needs read on the exchange, cancel and purge need write: else 401 Access refused."""
        self.broker.addUser("w", "pw", ["management"])
        self.broker.setPermissions("w", "/", "", "^dx$", "")
        self.broker.addUser("r", "pw", ["management"])
        self.broker.setPermissions("r", "/", "", "", "^dx$")
        refused = (401, {"error": "not_authorised", "reason": "Access refused."})
        r = self.get("/api/exchanges/%2F/dx/delayed", auth=("w", "pw"))
        self.assertEqual((r.code, r.json()), refused)
        self.assertEqual(self.get("/api/exchanges/%2F/dx/delayed", auth=("r", "pw")).code, 200)
        for path in ("/api/exchanges/%2F/dx/delayed/1", "/api/exchanges/%2F/dx/delayed",
                     "/api/exchanges/%2F/dx/delayed/by-message-id/m0"):
            r = self.request("DELETE", path, auth=("r", "pw"))
            self.assertEqual((r.code, r.json()), refused, path)
        self.assertEqual(self.ex.held, 3)
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed/1", auth=("w", "pw")).code, 204)


class DurableHTTPTests(test_web.WebTestCase):
    """HTTP changes to a durable exchange are answered once the store synced them."""

    def setUp(self):
        test_web.WebTestCase.setUp(self)
        self.store = MemoryStore()
        self.broker = journaledBroker(self.store, self.clock)
        self.mgmt = test_web.ManagementApp(self.broker, self.clock)
        self.http = test_web.StubTreq(self.mgmt.app.resource())
        self.vh = self.broker.vhosts["/"]

    def test_cancelThenRestart(self):
        """A message cancelled over HTTP is not held after a restart."""
        ex = self.vh.declareExchange("dx", "x-delayed-message", durable=True,
                                     arguments={"x-delayed-type": "direct"})
        self.vh.publish(ex, msg({"x-delay": 5000}))
        self.vh.publish(ex, msg({"x-delay": 6000}))
        self.assertEqual(self.request("DELETE", "/api/exchanges/%2F/dx/delayed/1").code, 204)
        self.broker.stop()
        self.successResultOf(self.store.close())
        b = journaledBroker(self.store, self.clock)
        self.assertEqual([i["id"] for i in b.vhosts["/"].exchanges["dx"].heldPage(1, 10)["items"]], ["2"])

    def test_syncFailure(self):
        """When the store cannot sync the cancel, the answer is 500 internal_error, not 204."""
        ex = self.vh.declareExchange("dx", "x-delayed-message", durable=True,
                                     arguments={"x-delayed-type": "direct"})
        self.vh.publish(ex, msg({"x-delay": 5000}))
        self.store.failWrites("disk full")
        r = self.request("DELETE", "/api/exchanges/%2F/dx/delayed")
        self.assertEqual((r.code, r.json()["error"]), (500, "internal_error"))
        self.assertIn("disk full", r.json()["reason"])


class AMQPCommandTests(SynchronousTestCase):
    """The x-delayed-command RPC on the exchange itself (FakeClient)."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(T0)
        self.broker = Broker(self.clock)
        self.vh = self.broker.vhosts["/"]
        self.c = self.client()
        self.c.send(1, spec.ExchangeDeclare(0, "dx", "x-delayed-message", arguments={"x-delayed-type": "direct"}))
        self.c.send(1, spec.QueueDeclare(0, "q"))
        self.c.send(1, spec.QueueBind(0, "q", "dx", "k"))
        self.c.send(1, spec.QueueDeclare(0, "replies"))
        for d, mid in ((300, "a"), (100, "b"), (200, "a")):
            self.c.publish(1, "dx", "k", b"x", props={"headers": {"x-delay": d}, "message_id": mid})
        self.c.received()
        self.ex = self.vh.exchanges["dx"]

    def client(self, user="guest", password="guest"):
        """A FakeClient of ``user`` with channel 1 open."""
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), user=user, password=password)
        c.openChannel(1)
        c.received()
        return c

    def command(self, command, body=b"", client=None, rk="", **props):
        """Publish a command to dx with reply_to ``replies``; returns ``(status, JSON body, props)`` or None."""
        c = client or self.c
        props.setdefault("reply_to", "replies")
        props["headers"] = dict(props.get("headers", {}), **{"x-delayed-command": command})
        c.publish(1, "dx", rk, body, props=props)
        out = c.received()
        self.assertEqual([m for _, m, _ in out if isinstance(m, spec.ChannelClose)], [])
        c.send(1, spec.BasicGet(0, "replies", True))
        got = c.received()
        if isinstance(got[0][1], spec.BasicGetEmpty):
            return None
        ((_, _, (p, b)),) = got
        return p["headers"]["x-delayed-status"], json.loads(b), p

    def test_list(self):
        """list answers the page object, with the request's correlation_id, as JSON."""
        status, body, props = self.command("list", b'{"page": 1, "page_size": 2}', correlation_id="c1")
        self.assertEqual((status, props["correlation_id"], props["content_type"]), (200, "c1", "application/json"))
        self.assertEqual(([i["id"] for i in body["items"]], body["total_count"]), (["2", "3"], 3))
        self.assertEqual(self.ex.held, 3)
        self.assertEqual(self.vh.queues["q"].readyCount, 0)

    def test_cancelAndPurge(self):
        """cancel by id and by message_id, then purge, answer 204 with counts; a miss is 404."""
        self.assertEqual(self.command("cancel", b'{"id": "2"}')[:2], (204, {"cancelled": 1}))
        self.assertEqual(self.command("cancel", b'{"id": "2"}')[:2],
                         (404, {"error": "Object Not Found", "reason": "Not Found"}))
        self.assertEqual(self.command("cancel", b'{"message_id": "a"}')[:2], (204, {"cancelled": 2}))
        self.c.publish(1, "dx", "k", b"x", props={"headers": {"x-delay": 100}})
        self.assertEqual(self.command("purge")[:2], (204, {"purged": 1}))
        self.clock.advance(1)
        self.assertEqual(self.vh.queues["q"].readyCount, 0)

    def test_schedule(self):
        """schedule holds the command message itself, without the command header, and answers its id and due time."""
        status, answer, props = self.command("schedule", b"payload", correlation_id="c9",
                                             headers={"x-delay-until": T0_MS + 700}, message_id="inv-1")
        self.assertEqual((status, answer, props["correlation_id"]), (201, {"id": "4", "due": T0_MS + 700}, "c9"))
        self.assertEqual(self.ex.heldPage(1, 1)["items"][0]["id"], "2")
        self.assertEqual(self.ex.cancelMessageId("inv-1"), 1)
        status, answer, _ = self.command("schedule", b"again", rk="k", headers={"x-delay": 500})
        self.assertEqual((status, answer["id"]), (201, "5"))
        self.clock.advance(0.5)
        entries = list(self.vh.queues["q"].readyEntries())
        self.assertEqual([(e.message.body, e.message.routingKey) for e in entries][-1:], [(b"again", "k")])
        self.assertEqual(entries[-1].message.headers, {"x-delay": -500, "x-delayed-id": "5"})

    def test_scheduleCountsAsDelayed(self):
        """A message held by the schedule command counts in the exchange's and the vhost's delayed rate, as a delayed publish does."""
        before = (self.ex.delayedCount, self.vh.delayedCount)
        status, _, _ = self.command("schedule", b"x", headers={"x-delay": 500})
        self.assertEqual(status, 201)
        self.assertEqual((self.ex.delayedCount, self.vh.delayedCount), (before[0] + 1, before[1] + 1))

    def test_scheduleWithoutDueTime(self):
        """schedule without a usable due time is a 400 answer and holds nothing."""
        status, answer, _ = self.command("schedule", b"x", headers={"x-delay-until": T0_MS - 1})
        self.assertEqual((status, answer["error"], self.ex.held), (400, "bad_request", 3))

    def test_errorsAnswered(self):
        """An unknown command, a bad body, bad paging or a cancel without a key is a 400 answer; the channel stays open."""
        for command, body in (("frobnicate", b""), ("list", b"not json"), ("list", b"[1]"),
                              ("list", b"[" * 100000 + b"]" * 100000), ("cancel", b'{"id": true}'),
                              ("list", b'{"page": 0}'), ("cancel", b"{}"), ("cancel", b'{"message_id": 5}')):
            status, answer, _ = self.command(command, body)
            self.assertEqual(status, 400, (command, body))
            self.assertIn("reason", answer)
        self.assertEqual(self.ex.held, 3)

    def test_permissionAnswered(self):
        """A publisher without read on the exchange gets a 403 answer to list, and may still cancel."""
        self.broker.addUser("w", "pw", [])
        self.broker.setPermissions("w", "/", "", "^(dx|replies)$", "^replies$")
        c = self.client("w", "pw")
        status, answer, _ = self.command("list", client=c)
        self.assertEqual((status, answer["reason"]),
                         (403, "ACCESS_REFUSED - access to exchange 'dx' in vhost '/' refused for user 'w'"))
        self.assertEqual(self.command("cancel", b'{"id": "1"}', client=c)[0], 204)

    def test_syncFailureAnswered(self):
        """On a durable exchange whose store cannot sync, a cancel is answered 500 instead of 204."""
        store = MemoryStore()
        self.broker = journaledBroker(store, self.clock)
        self.vh = self.broker.vhosts["/"]
        c = self.client()
        c.send(1, spec.ExchangeDeclare(0, "dx", "x-delayed-message", durable=True,
                                       arguments={"x-delayed-type": "direct"}))
        c.send(1, spec.QueueDeclare(0, "replies"))
        c.publish(1, "dx", "k", b"x", props={"headers": {"x-delay": 5000}})
        c.received()
        store.failWrites("disk full")
        status, answer, _ = self.command("purge", client=c)
        self.assertEqual((status, answer["error"]), (500, "internal_error"))

    def test_noReplyTo(self):
        """A command without reply_to still runs, unanswered."""
        self.c.publish(1, "dx", "", b"", props={"headers": {"x-delayed-command": "purge"}})
        self.assertEqual(self.c.received(), [])
        self.assertEqual(self.ex.held, 0)

    def test_directReplyTo(self):
        """The answer reaches a direct reply-to consumer."""
        self.c.send(1, spec.BasicConsume(0, "amq.rabbitmq.reply-to", "rt", False, True, False, False, {}))
        self.c.received()
        self.c.publish(1, "dx", "", b"", props={"headers": {"x-delayed-command": "list"},
                                                 "reply_to": "amq.rabbitmq.reply-to"})
        ((_, deliver, (props, body)),) = self.c.received()
        self.assertIsInstance(deliver, spec.BasicDeliver)
        self.assertEqual((props["headers"]["x-delayed-status"], json.loads(body)["total_count"]), (200, 3))

    def test_confirmedNotHeldNotRouted(self):
        """A command is confirmed, never held and never routed, even with x-delay and a matching binding."""
        self.c.send(1, spec.ConfirmSelect(False))
        self.c.received()
        self.c.publish(1, "dx", "k", b"", props={"headers": {"x-delayed-command": "list", "x-delay": 10}})
        self.assertEqual([type(m) for _, m, _ in self.c.received()], [spec.BasicAck])
        self.assertEqual(self.ex.held, 3)
        self.clock.advance(1)
        self.assertEqual((self.ex.held, self.vh.queues["q"].readyCount), (0, 3))

    def test_indirectCommandDropped(self):
        """A command reaching the delayed exchange through an exchange-to-exchange binding is dropped unrun."""
        self.c.send(1, spec.ExchangeDeclare(0, "front", "fanout"))
        self.c.send(1, spec.ExchangeBind(0, "dx", "front", ""))
        self.c.received()
        self.c.publish(1, "front", "k", b"", props={"headers": {"x-delayed-command": "purge"},
                                                    "reply_to": "replies"})
        self.c.received()
        self.assertEqual(self.ex.held, 3)
        self.assertEqual(self.vh.queues["replies"].readyCount, 0)

    def test_commandInTransactionRunsAtCommit(self):
        """In a transaction the command runs when it is committed."""
        self.c.send(1, spec.TxSelect())
        self.c.received()
        self.c.publish(1, "dx", "", b"", props={"headers": {"x-delayed-command": "purge"}})
        self.assertEqual(self.ex.held, 3)
        self.c.send(1, spec.TxCommit())
        self.c.received()
        self.assertEqual(self.ex.held, 0)

