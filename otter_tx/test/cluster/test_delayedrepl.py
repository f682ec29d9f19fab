"""
Replicated delayed messages (otter_tx/cluster/delayedrepl.py) on three
in-process nodes (test_inprocess.ClusterCase: whole brokers, real TCP
links, the in-memory metadata store), driven by pika and the management API.
"""

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pika
from twisted.internet.defer import inlineCallbacks

from otter_tx.test.cluster.test_inprocess import ClusterCase
from otter_tx.test.interop.support import waitOnReactor

DX = {"x-delayed-type": "direct"}


class DelayedCase(ClusterCase):
    """Three nodes with their management apps, and helpers."""

    management = True

    def kill(self, i):
        """Node ``i``'s links drop at once and its timers stop, as when its process is SIGKILLed."""
        n = self.cluster[i]
        n.running = False
        for vh in self.fixtures[i].broker.vhosts.values():
            for ex in vh.exchanges.values():
                if ex.delayed:
                    ex.stopTimers()
        for link in list(n.links.values()):
            link.transport.abortConnection()

    def copies(self, i, leader, exchange="dx"):
        return len(self.cluster[i].delayed.copies.get(leader, {}).get(("/", exchange), {}))

    def api(self, i, method, path):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.fixtures[i].managementPort, path),
                                     method=method)
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data = r.read()
                return r.status, json.loads(data) if data else None
        except urllib.error.HTTPError as e:
            return e.code, None

    def setUpExchange(self, queueNode=1):
        """A durable delayed exchange ``dx`` (declared on node 1) bound to durable queue ``later`` on ``queueNode``."""
        def run():
            ch = self.conn(queueNode).channel()
            ch.queue_declare("later", durable=True)
            ch1 = self.conn(0).channel()
            ch1.exchange_declare("dx", "x-delayed-message", durable=True, arguments=DX)
            ch1.queue_bind("later", "dx", "k")
            return True

        return self.inThread(run)

    @inlineCallbacks
    def waitExchangeEverywhere(self):
        yield waitOnReactor(lambda: all("dx" in f.broker.vhosts["/"].exchanges
                                        and f.broker.vhosts["/"].exchanges["dx"].routing.bindings()
                                        for f in self.fixtures), 5)

    def publish(self, i, bodies, delayMs, confirm=True):
        def run():
            ch = self.conn(i).channel()
            if confirm:
                ch.confirm_delivery()
            started = time.time()
            for body in bodies:
                ch.basic_publish("dx", "k", body, pika.BasicProperties(
                    delivery_mode=2, message_id=body.decode(), headers={"x-delay": delayMs}))
            return started, time.time() - started

        return self.inThread(run)

    def consume(self, i, count, seconds):
        def run():
            ch = self.conn(i).channel()
            got = []
            deadline = time.time() + seconds
            while len(got) < count and time.time() < deadline:
                method, props, body = ch.basic_get("later", auto_ack=True)
                if method is None:
                    time.sleep(0.02)
                    continue
                got.append((body, props.headers.get("x-delayed-id"), method.redelivered, time.time()))
            return got

        return self.inThread(run)



class ReplicatedDelayedTests(DelayedCase):

    @inlineCallbacks
    def test_confirmWaitsForFollowers(self):
        """
        A confirmed delayed publish on node 1 is held by both other nodes
        already (their store has it); a fire drops the copies.
        """
        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        yield self.publish(0, [b"a", b"b", b"c"], 400)
        self.assertEqual((self.copies(1, "n1"), self.copies(2, "n1")), (3, 3))
        ex = self.fixtures[0].broker.vhosts["/"].exchanges["dx"]
        self.assertEqual(sorted(ex.heldPage(1, 10)["items"][i]["id"] for i in range(3)), ["n1:1", "n1:2", "n1:3"])
        got = yield self.consume(2, 3, 5)
        self.assertEqual([(g[0], g[1]) for g in got], [(b"a", "n1:1"), (b"b", "n1:2"), (b"c", "n1:3")])
        yield waitOnReactor(lambda: self.copies(1, "n1") == 0 and self.copies(2, "n1") == 0, 5)

    @inlineCallbacks
    def test_leaderKilledDeliveredOnTime(self):
        """
        Node 1 holds 20 confirmed delayed messages and dies: one survivor
        wins the claim (``delayed/n1``) and every message is delivered once,
        when due, with its ``x-delayed-id``.
        """
        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        bodies = [b"m%d" % k for k in range(20)]
        started, _ = yield self.publish(0, bodies, 1500)
        self.kill(0)
        yield waitOnReactor(lambda: "delayed/n1" in self.meta.data, 5)
        adopter = self.meta.data["delayed/n1"]["adopter"]
        self.assertIn(adopter, ("n2", "n3"))
        got = yield self.consume(1, 20, 10)
        self.assertEqual(sorted(g[0] for g in got), sorted(bodies))
        self.assertEqual(sorted(g[1] for g in got), sorted("n1:%d" % k for k in range(1, 21)))
        self.assertGreaterEqual(min(g[3] for g in got) - started, 1.45)
        self.assertLess(max(g[3] for g in got) - started, 4)
        # the other survivor dropped its copies; nothing more fires
        yield waitOnReactor(lambda: self.copies(1, "n1") == 0 and self.copies(2, "n1") == 0, 5)
        more = yield self.consume(1, 1, 0.5)
        self.assertEqual(more, [])

    @inlineCallbacks
    def test_adopterLostToo(self):
        """The adopter dies before the messages are due: the last node adopts them from it and fires them."""
        def declare():
            self.conn(0).channel().exchange_declare("dx", "x-delayed-message", durable=True, arguments=DX)
            return True

        yield self.inThread(declare)
        yield waitOnReactor(lambda: all("dx" in f.broker.vhosts["/"].exchanges for f in self.fixtures), 5)
        yield self.publish(0, [b"x", b"y"], 2500)
        self.kill(0)
        yield waitOnReactor(lambda: "delayed/n1" in self.meta.data, 5)
        adopter = int(self.meta.data["delayed/n1"]["adopter"][1:]) - 1
        last = 1 if adopter == 2 else 2

        def bind():
            ch = self.conn(last).channel()
            ch.queue_declare("later", durable=True)
            ch.queue_bind("later", "dx", "k")
            return True

        yield self.inThread(bind)
        yield waitOnReactor(lambda: self.copies(last, "n%d" % (adopter + 1)) == 2, 5)
        yield waitOnReactor(lambda: self.fixtures[adopter].broker.vhosts["/"].exchanges["dx"].routing.bindings(), 5)
        self.kill(adopter)
        yield waitOnReactor(lambda: "delayed/n%d" % (adopter + 1) in self.meta.data, 5)
        got = yield self.consume(last, 2, 10)
        self.assertEqual(sorted((g[0], g[1]) for g in got), [(b"x", "n1:1"), (b"y", "n1:2")])

    @inlineCallbacks
    def test_listAndCancelFromAnyNode(self):
        """
        The management API of node 3 lists the held messages of nodes 1 and
        2 in due order, cancels one of node 1's by id and one of node 2's by
        message_id; after node 1's death node 2 lists and cancels its
        adopted ones.
        """
        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        yield self.publish(0, [b"a1", b"a2", b"a3"], 60000)
        yield self.publish(1, [b"b1", b"b2"], 30000)
        status, page = yield self.inThread(self.api, 2, "GET", "/api/exchanges/%2F/dx/delayed?page_size=10")
        self.assertEqual(status, 200)
        self.assertEqual(page["total_count"], 5)
        self.assertEqual([i["message_id"] for i in page["items"]], ["b1", "b2", "a1", "a2", "a3"])
        status, page2 = yield self.inThread(self.api, 2, "GET", "/api/exchanges/%2F/dx/delayed?page=2&page_size=2")
        self.assertEqual([i["message_id"] for i in page2["items"]], ["a1", "a2"])
        ids = {i["message_id"]: i["id"] for i in page["items"]}
        status, _ = yield self.inThread(self.api, 2, "DELETE", "/api/exchanges/%2F/dx/delayed/" + ids["a2"])
        self.assertEqual(status, 204)
        status, _ = yield self.inThread(self.api, 0, "DELETE", "/api/exchanges/%2F/dx/delayed/by-message-id/b1")
        self.assertEqual(status, 204)
        status, _ = yield self.inThread(self.api, 2, "DELETE", "/api/exchanges/%2F/dx/delayed/n1:99")
        self.assertEqual(status, 404)
        # a bare number is no id in a cluster (it would name message 1 of every node)
        status, _ = yield self.inThread(self.api, 2, "DELETE", "/api/exchanges/%2F/dx/delayed/1")
        self.assertEqual(status, 404)
        self.assertEqual((self.copies(1, "n1"), self.copies(2, "n1"), self.copies(0, "n2")), (2, 2, 1))
        self.kill(0)
        yield waitOnReactor(lambda: "delayed/n1" in self.meta.data, 5)
        yield waitOnReactor(lambda: self.copies(1, "n1") + self.copies(2, "n1") == 0, 5)
        status, page = yield self.inThread(self.api, 1, "GET", "/api/exchanges/%2F/dx/delayed")
        self.assertEqual([i["message_id"] for i in page["items"]], ["b2", "a1", "a3"])
        self.assertEqual([i["id"] for i in page["items"]][1:], [ids["a1"], ids["a3"]])
        status, _ = yield self.inThread(self.api, 1, "DELETE", "/api/exchanges/%2F/dx/delayed/" + ids["a3"])
        self.assertEqual(status, 204)
        status, _ = yield self.inThread(self.api, 2, "DELETE", "/api/exchanges/%2F/dx/delayed")
        self.assertEqual(status, 204)
        status, page = yield self.inThread(self.api, 1, "GET", "/api/exchanges/%2F/dx/delayed")
        self.assertEqual(page["total_count"], 0)

    @inlineCallbacks
    def test_returningNodeDropsAdopted(self):
        """
        A node whose messages were adopted while it was cut off drops the
        ones held before (the claim check on its return) and deletes the
        claim; one published after its links went down stays.
        """
        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        yield self.publish(0, [b"old"], 60000)
        n1 = self.cluster[0]
        n1.delayed.nodeDown("n2")  # (the marks, as when its links went down)
        ex = self.fixtures[0].broker.vhosts["/"].exchanges["dx"]
        yield self.publish(0, [b"new"], 60000)
        self.meta._put("delayed/n1", {"node": "n1", "adopter": "n2"}, None)
        yield n1.delayed._checkClaim()
        self.assertEqual([i["message_id"] for i in ex.heldPage(1, 10)["items"]], ["new"])
        self.assertTrue(self.meta.data["delayed/n1"]["done"])

    @inlineCallbacks
    def test_confirmWaitsForSlowFollower(self):
        """A follower whose store takes 0.5 s to sync holds back the confirm of a delayed publish."""
        from twisted.internet import reactor, task

        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        journal = self.fixtures[2].broker.journal
        fast = journal.sync

        def slow():
            return task.deferLater(reactor, 0.5, lambda: None).addCallback(lambda _: fast())

        self.patch(journal, "sync", slow)
        _, took = yield self.publish(0, [b"slow"], 60000)
        self.assertGreaterEqual(took, 0.45)
        self.assertEqual(self.copies(2, "n1"), 1)

    @inlineCallbacks
    def test_deletedExchangeDropsCopies(self):
        """Deleting the exchange drops the followers' copies: one made again with the name adopts nothing."""
        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        yield self.publish(0, [b"gone"], 60000)
        self.assertEqual(self.copies(2, "n1"), 1)

        def delete():
            self.conn(0).channel().exchange_delete("dx")
            return True

        yield self.inThread(delete)
        yield waitOnReactor(lambda: all("dx" not in f.broker.vhosts["/"].exchanges for f in self.fixtures), 5)
        self.assertEqual((self.copies(1, "n1"), self.copies(2, "n1")), (0, 0))

    @inlineCallbacks
    def test_amqpCommandsOnEveryNode(self):
        """The x-delayed-command list / cancel / purge published on node 3 act on nodes 1 and 2's held messages."""
        import uuid

        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        yield self.publish(0, [b"a1", b"a2"], 60000)
        yield self.publish(1, [b"b1"], 30000)

        def run():
            ch = self.conn(2).channel()
            replies = {}
            ch.basic_consume("amq.rabbitmq.reply-to",
                             lambda _c, _m, p, b: replies.__setitem__(p.correlation_id, (p, b)), auto_ack=True)

            def rpc(command, args):
                cid = uuid.uuid4().hex
                ch.basic_publish("dx", "k", json.dumps(args).encode(), pika.BasicProperties(
                    headers={"x-delayed-command": command}, reply_to="amq.rabbitmq.reply-to", correlation_id=cid))
                deadline = time.monotonic() + 5
                while cid not in replies and time.monotonic() < deadline:
                    ch.connection.process_data_events(0.01)
                props, body = replies.pop(cid)
                return props.headers["x-delayed-status"], json.loads(body)

            out = [rpc("list", {})]
            out.append(rpc("cancel", {"id": "n1:2"}))
            out.append(rpc("cancel", {"message_id": "b1"}))
            out.append(rpc("cancel", {"id": "n1:2"}))
            out.append(rpc("list", {}))
            out.append(rpc("purge", {}))
            out.append(rpc("list", {}))
            return out

        out = yield self.inThread(run)
        self.assertEqual((out[0][0], [i["id"] for i in out[0][1]["items"]]), (200, ["n2:1", "n1:1", "n1:2"]))
        self.assertEqual([o[0] for o in out[1:4]], [204, 204, 404])
        self.assertEqual([i["id"] for i in out[4][1]["items"]], ["n1:1"])
        self.assertEqual(out[5], (204, {"purged": 1}))
        self.assertEqual(out[6][1]["total_count"], 0)
        self.assertEqual((self.copies(1, "n1"), self.copies(2, "n1")), (0, 0))

    @inlineCallbacks
    def test_joiningNodeMirrorsBindingsToOtherNodesQueues(self):
        """
        A node joining after a binding from ``dx`` to a queue on node 2 was
        made routes through it at once (node.start mirrors bindings after the
        queues: a node restarted to fire adopted messages needs them).
        """
        from twisted.internet import reactor

        from otter_tx.cluster.link import LinkFactory
        from otter_tx.cluster.node import ClusterNode
        from otter_tx.testing import startBroker

        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        f = yield startBroker(reactor)
        self.addCleanup(f.stop)
        node = ClusterNode(f.broker, "n4", self.meta, reactor)
        port = reactor.listenTCP(0, LinkFactory(node), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.addCleanup(node.stop)
        yield node.start(port.getHost().port)
        ex = f.broker.vhosts["/"].exchanges["dx"]
        self.assertEqual([q.name for q in f.broker.vhosts["/"].route(ex, _probe(), ["k"])], ["later"])



class FiveNodeTests(DelayedCase):
    """Five nodes: each node's messages have two followers, the next two in name order."""

    nodes = 5

    @inlineCallbacks
    def test_twoFollowersOfFour(self):
        """Node 4's messages are copied to nodes 5 and 1 only; killed, one of those two fires them."""
        yield self.setUpExchange()
        yield self.waitExchangeEverywhere()
        yield self.publish(3, [b"f1", b"f2"], 1000)
        self.assertEqual([self.copies(i, "n4") for i in range(5)], [2, 0, 0, 0, 2])
        self.kill(3)
        yield waitOnReactor(lambda: "delayed/n4" in self.meta.data, 5)
        self.assertIn(self.meta.data["delayed/n4"]["adopter"], ("n1", "n5"))
        got = yield self.consume(1, 2, 10)
        self.assertEqual(sorted((g[0], g[1]) for g in got), [(b"f1", "n4:1"), (b"f2", "n4:2")])

def _probe():
    from otter_tx.amqp.codec import encodeProperties
    from otter_tx.broker.message import Message

    return Message("dx", "k", encodeProperties({}), b"")
