"""
Three otter_tx nodes in this process, each a whole OtterService on tcp:0,
joined through a shared :class:`~otter_tx.cluster.metadata.MemoryMetadata`
(the etcd stand-in) and real TCP links, driven by pika: what a client sees
when its queue lives on another node (docs/cluster.md).
"""

import time
import urllib.parse
import urllib.request

import pika
import pika.exceptions
from twisted.internet import defer, reactor, task
from twisted.internet.defer import inlineCallbacks

from otter_tx.amqp.errors import AMQPError
from otter_tx.cluster.link import LinkFactory
from otter_tx.cluster.metadata import MemoryMetadata
from otter_tx.cluster.node import ClusterNode
from otter_tx.test.interop.support import waitOnReactor
from otter_tx.testing import startBroker
from twisted.internet import threads
from twisted.trial.unittest import TestCase


class ClusterCase(TestCase):
    timeout = 60
    nodes = 3
    management = False
    #: with the stream protocol listener (its port in the node record, as the service does)
    stream = False

    @inlineCallbacks
    def setUp(self):
        self.meta = MemoryMetadata(reactor)
        self.ports = []
        self.fixtures = []
        self.cluster = []
        for i in range(self.nodes):
            f = yield startBroker(reactor, management=self.management, stream=self.stream)
            self.addCleanup(f.stop)
            f.broker.nodeName = "n%d" % (i + 1,)
            node = ClusterNode(f.broker, "n%d" % (i + 1,), self.meta, reactor)
            if self.stream:
                # as OtterService._joinCluster wires it
                node.remoteStreamGone.append(f.service.streamFactory.streamDeleted)
            port = reactor.listenTCP(0, LinkFactory(node), interface="127.0.0.1")
            self.addCleanup(port.stopListening)
            self.ports.append(port)
            self.addCleanup(node.stop)
            yield node.start(port.getHost().port,
                             {"stream_host": "127.0.0.1", "stream_port": f.streamPort} if self.stream else None)
            self.fixtures.append(f)
            self.cluster.append(node)
        yield waitOnReactor(lambda: all(len(n.links) == self.nodes - 1 for n in self.cluster), 10)

    def conn(self, i):
        c = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.fixtures[i].amqpPort, credentials=pika.PlainCredentials("guest", "guest")))
        self.addCleanup(lambda: threads.deferToThread(lambda: c.is_open and c.close()))
        return c

    def inThread(self, f, *a):
        return threads.deferToThread(f, *a)

    def publishConfirmed(self, i, name, arguments, count, start=0):
        """Declare durable queue ``name`` on node ``i`` and publish ``count`` persistent messages ``m<k>`` with confirms."""
        def run():
            ch = self.conn(i).channel()
            ch.queue_declare(name, durable=True, arguments=arguments)
            ch.confirm_delivery()
            for k in range(start, start + count):
                ch.basic_publish("", name, b"m%d" % k, pika.BasicProperties(delivery_mode=2))
            return True

        return self.inThread(run)

    def publishOutcome(self, i, name, body=b"alone"):
        """One persistent publish with confirms to queue ``name`` on node ``i``: ``"confirmed"`` or ``"nack"``."""
        def run():
            ch = self.conn(i).channel()
            ch.confirm_delivery()
            try:
                ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
            except pika.exceptions.NackError:
                return "nack"
            return "confirmed"

        return self.inThread(run)

    def ackingConsumers(self, nodes, name, state, prefetch=None):
        """
        (In a thread.) A consumer of queue ``name`` on each of ``nodes``
        (tags ``c<i>``) that acks each delivery: bodies go to
        ``state["got"]``, basic.cancel tags to ``state["cancelled"]``; the
        connections (list), for :meth:`pump`.
        """
        conns = []
        for i in nodes:
            c = self.conn(i)
            ch = c.channel()
            if prefetch is not None:
                ch.basic_qos(prefetch_count=prefetch)
            ch.add_on_cancel_callback(lambda frame: state["cancelled"].append(frame.method.consumer_tag))

            def onMessage(ch, method, props, body):
                state["got"].append(body)
                ch.basic_ack(method.delivery_tag)

            ch.basic_consume(name, onMessage, consumer_tag="c%d" % i)
            conns.append(c)
        return conns

    @staticmethod
    def pump(conns, seconds, until):
        """(In a thread.) Process ``conns``' events until ``until()`` or ``seconds`` passed."""
        deadline = time.time() + seconds
        while time.time() < deadline and not until():
            for c in conns:
                c.process_data_events(0.05)
        return True

    def kill(self, i):
        """Node ``i``'s links drop at once, as when its process is SIGKILLed."""
        n = self.cluster[i]
        n.running = False
        for link in list(n.links.values()):
            link.transport.abortConnection()


class RStreamClusterCase(ClusterCase):
    """A cluster with stream listeners, driven by rstream (CPython only: it needs mmh3)."""

    stream = True
    #: seconds an asyncio client run may take
    asyncTimeout = 30

    def setUp(self):
        import platform

        from twisted.trial.unittest import SkipTest

        from otter_tx.test.interop.support import requireModule

        if platform.python_implementation() != "CPython":
            raise SkipTest("rstream needs mmh3, which does not build on PyPy")
        self.rs = requireModule("rstream")
        return ClusterCase.setUp(self)

    def inAsyncio(self, f):
        import asyncio

        return self.inThread(lambda: asyncio.run(asyncio.wait_for(f(), self.asyncTimeout)))


class AcrossNodesTests(ClusterCase):

    @inlineCallbacks
    def test_publishConsumeAcrossThreeNodes(self):
        """A queue declared on node 2, published to on node 1, consumed on node 3, with confirms."""
        def run():
            c2 = self.conn(1)
            ch2 = c2.channel()
            ch2.queue_declare("q1", durable=True)
            c1 = self.conn(0)
            ch1 = c1.channel()
            ch1.confirm_delivery()
            for i in range(50):
                ch1.basic_publish("", "q1", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
            c3 = self.conn(2)
            ch3 = c3.channel()
            ch3.basic_qos(prefetch_count=5)
            got = []

            def onMessage(ch, method, props, body):
                got.append((body, method.redelivered, method.exchange, method.routing_key))
                ch.basic_ack(method.delivery_tag)
                if len(got) == 50:
                    ch.stop_consuming()

            ch3.basic_consume("q1", onMessage)
            deadline = time.time() + 20
            while len(got) < 50 and time.time() < deadline:
                c3.process_data_events(0.2)
            return got

        got = yield self.inThread(run)
        self.assertEqual([g[0] for g in got], [b"m%d" % i for i in range(50)])
        self.assertEqual({(g[1], g[2], g[3]) for g in got}, {(False, "", "q1")})
        home = self.fixtures[1].broker.vhosts["/"].queues["q1"]
        yield waitOnReactor(lambda: home.readyCount == 0 and home.unackedCount == 0, 5)
        self.assertIn("q1", self.fixtures[0].broker.vhosts["/"].remoteQueues)

    @inlineCallbacks
    def test_bindingsRouteToRemoteQueue(self):
        """A topic binding made on node 1 to a queue on node 2 routes publishes made on node 3."""
        def run():
            ch2 = self.conn(1).channel()
            ch2.exchange_declare("tx", "topic")
            ch2.queue_declare("tq")
            ch1 = self.conn(0).channel()
            ch1.queue_bind("tq", "tx", "a.*")
            return True

        yield self.inThread(run)
        yield waitOnReactor(lambda: "tx" in self.fixtures[2].broker.vhosts["/"].exchanges
                        and self.fixtures[2].broker.vhosts["/"].exchanges["tx"].routing.bindings(), 5)

        def publish():
            ch3 = self.conn(2).channel()
            ch3.confirm_delivery()
            ch3.basic_publish("tx", "a.b", b"hello", mandatory=True)
            try:
                ch3.basic_publish("tx", "b.b", b"lost", mandatory=True)
            except pika.exceptions.UnroutableError:
                pass
            else:
                raise AssertionError("not returned")
            ch2 = self.conn(1).channel()
            deadline = time.time() + 5
            while time.time() < deadline:
                m = ch2.basic_get("tq", auto_ack=True)
                if m[0] is not None:
                    return m[2]
                time.sleep(0.05)

        body = yield self.inThread(publish)
        self.assertEqual(body, b"hello")

    @inlineCallbacks
    def test_getPurgeDeleteRemote(self):
        """basic.get, queue.purge and queue.delete from a node other than the queue's home."""
        def run():
            ch1 = self.conn(0).channel()
            ch1.queue_declare("gq", arguments={"x-queue-leader-locator": "balanced"})
            home = [i for i, f in enumerate(self.fixtures) if "gq" in f.broker.vhosts["/"].queues]
            other = (home[0] + 1) % 3
            ch = self.conn(other).channel()
            ch.confirm_delivery()
            for i in range(5):
                ch.basic_publish("", "gq", b"g%d" % i)
            m = ch.basic_get("gq", auto_ack=False)
            ch.basic_ack(m[0].delivery_tag)
            n = ch.queue_purge("gq").method.message_count
            ch.basic_publish("", "gq", b"x")
            d = ch.queue_delete("gq").method.message_count
            return home, m[2], n, d

        home, body, purged, deleted = yield self.inThread(run)
        self.assertEqual(len(home), 1)
        self.assertEqual((body, purged, deleted), (b"g0", 4, 1))
        yield waitOnReactor(lambda: all("gq" not in f.broker.vhosts["/"].remoteQueues
                                    and "gq" not in f.broker.vhosts["/"].queues for f in self.fixtures), 5)

    @inlineCallbacks
    def test_concurrentDeclare(self):
        """The same name declared on two nodes with different arguments: one wins, the other gets 406."""
        def declare(i, args):
            ch = self.conn(i).channel()
            try:
                ch.queue_declare("cq", durable=True, arguments=args)
                return "ok"
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code

        a = self.inThread(declare, 0, {"x-max-length": 10})
        b = self.inThread(declare, 2, {"x-max-length": 20})
        ra = yield a
        rb = yield b
        self.assertEqual(sorted([ra, rb], key=str), sorted(["ok", 406], key=str))
        homes = [f for f in self.fixtures if "cq" in f.broker.vhosts["/"].queues]
        self.assertEqual(len(homes), 1)

    @inlineCallbacks
    def test_nodeDown(self):
        """
        The home node's link drops: the consumer elsewhere gets basic.cancel, the durable
        queue answers 404 "home node ... is down", the exclusive one is gone.
        """
        def setup():
            ch2 = self.conn(1).channel()
            ch2.queue_declare("dq", durable=True)
            c = self.conn(0)
            ch1 = c.channel()
            cancelled = []
            ch1.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
            ch1.basic_consume("dq", lambda *a: None, consumer_tag="ctag1")
            return c, ch1, cancelled

        c, ch1, cancelled = yield self.inThread(setup)
        # cut node 2 off: its links drop, as when its process dies
        n2 = self.cluster[1]
        n2.running = False
        for link in list(n2.links.values()):
            link.transport.abortConnection()
        yield waitOnReactor(lambda: self.fixtures[0].broker.vhosts["/"].remoteQueues["dq"].down, 5)

        def after():
            deadline = time.time() + 5
            while not cancelled and time.time() < deadline:
                c.process_data_events(0.1)
            ch = self.conn(2).channel()
            try:
                ch.queue_declare("dq", passive=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                return cancelled, e.reply_code, e.reply_text
            return cancelled, None, None

        cancelled, code, text = yield self.inThread(after)
        self.assertEqual(cancelled, ["ctag1"])
        self.assertEqual(code, 404)
        self.assertEqual(
            text, "NOT_FOUND - home node 'n2' of durable queue 'dq' in vhost '/' is down or inaccessible")


class SetupOnly(ClusterCase):
    def test_links(self):
        self.assertEqual(sorted(self.cluster[0].links), ["n2", "n3"])

    def test_requestWaitsForTheRevisionItFollows(self):
        """A request that follows another node's metadata writes is answered once this mirror applied them."""
        node = self.cluster[1]
        ahead = node.appliedRevision + 1000
        answered = node.answer(None, "consumable", {"vhost": "/", "name": "nope", "exclusive": False,
                                                    "revision": ahead})
        self.assertFalse(answered.called)
        node._caughtUp(ahead)
        # answered now, from the mirror as it is (no such queue here: 404)
        self.failureResultOf(answered, AMQPError)

    @inlineCallbacks
    def test_askAll(self):
        """askAll asks every linked node's registered handler; a failing one is left out."""
        self.cluster[1].handlers["hello"] = lambda args: {"from": "n2", "x": args["x"]}

        def broken(args):
            raise RuntimeError("no")

        self.cluster[2].handlers["hello"] = broken
        got = yield self.cluster[0].askAll("hello", {"x": 7})
        self.assertEqual(got, {"n2": {"from": "n2", "x": 7}})
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    @inlineCallbacks
    def test_declare(self):
        def run():
            ch = self.conn(0).channel()
            ch.queue_declare("x1")
            return "ok"
        r = yield self.inThread(run)
        self.assertEqual(r, "ok")


class OverflowAndCountsTests(ClusterCase):

    @inlineCallbacks
    def test_rejectPublishAcrossNodes(self):
        """A queue on node 2 with reject-publish: publishes confirmed on node 1 are nacked once it is full."""
        def run():
            ch2 = self.conn(1).channel()
            ch2.queue_declare("rq", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
            ch1 = self.conn(0).channel()
            ch1.confirm_delivery()
            out = []
            for i in range(4):
                try:
                    ch1.basic_publish("", "rq", b"r%d" % i)
                    out.append("ack")
                except pika.exceptions.NackError:
                    out.append("nack")
            n = ch1.queue_declare("rq", passive=True).method.message_count
            return out, n

        out, n = yield self.inThread(run)
        self.assertEqual(out, ["ack", "ack", "nack", "nack"])
        self.assertEqual(n, 2)


class DefinitionsTests(ClusterCase):

    @inlineCallbacks
    def test_vhostUserPermissionPolicyEverywhere(self):
        """A vhost, a user, its permissions and a policy made on node 1 reach nodes 2 and 3 within 1 s."""
        b1 = self.fixtures[0].broker
        b1.addVHost("v2")
        b1.addUser("alice", "secret", ["management"])
        b1.setPermissions("alice", "v2", ".*", ".*", ".*")
        b1.setPolicy("v2", "lim", "^lim", {"max-length": 3}, 0, "queues")
        others = [f.broker for f in self.fixtures[1:]]
        yield waitOnReactor(lambda: all("v2" in b.vhosts and "alice" in b.users
                                    and ("alice", "v2") in b.permissions
                                    and "lim" in b.vhosts["v2"].policies for b in others), 1)
        b3 = others[1]
        self.assertEqual(b3.users["alice"].passwordHash, b1.users["alice"].passwordHash)
        b3.clearPolicy("v2", "lim")
        b3.deleteVHost("v2")
        yield waitOnReactor(lambda: "v2" not in b1.vhosts and "v2" not in others[0].vhosts, 1)

    @inlineCallbacks
    def test_deletedOnAnotherNodeGoneEverywhere(self):
        """
        A policy, an operator policy and a user made on node 1 and deleted on node 3 are gone
        from node 1 too (a node's own records are part of what it knows the cluster holds).
        """
        from otter_tx.broker.policy import OperatorPolicy

        b1, b2, b3 = (f.broker for f in self.fixtures)
        b1.setPolicy("/", "gone", "^gone", {"max-length": 3}, 0, "queues")
        b1.vhosts["/"].setOperatorPolicy(OperatorPolicy("opgone", "^gone", {"max-length": 5}, 0, "queues", "/"))
        b1.addUser("bob", "secret", [])
        yield waitOnReactor(lambda: all("gone" in b.vhosts["/"].policies and "opgone" in b.vhosts["/"].operatorPolicies
                                    and "bob" in b.users for b in (b2, b3)), 2)
        b3.clearPolicy("/", "gone")
        b3.vhosts["/"].clearOperatorPolicy("opgone")
        b3.deleteUser("bob")
        yield waitOnReactor(lambda: all("gone" not in b.vhosts["/"].policies
                                    and "opgone" not in b.vhosts["/"].operatorPolicies
                                    and "bob" not in b.users for b in (b1, b2, b3)), 2)

    @inlineCallbacks
    def test_policyAppliesToQueueOnOtherNode(self):
        """A max-length policy set on node 1 limits a queue whose home is node 2."""
        def declare():
            self.conn(1).channel().queue_declare("plq")

        yield self.inThread(declare)
        self.fixtures[0].broker.setPolicy("/", "pl", "^plq$", {"max-length": 1}, 0, "queues")
        home = self.fixtures[1].broker.vhosts["/"]
        yield waitOnReactor(lambda: "pl" in home.policies, 1)

        def publish():
            ch = self.conn(2).channel()
            ch.confirm_delivery()
            for i in range(3):
                ch.basic_publish("", "plq", b"p%d" % i)

        yield self.inThread(publish)
        self.assertEqual(home.queues["plq"].readyCount, 1)


class FirstNodesTests(TestCase):
    timeout = 60

    @inlineCallbacks
    def test_twoFirstNodesAtOnce(self):
        """
        Two nodes joining an empty cluster at once, each with its own user: one
        node's definitions are the cluster's, whole, and the other adopts them
        (before, each published its records one write at a time, and a node
        killed half-way left a vhost without its users for the next to adopt).
        """
        meta = MemoryMetadata(reactor)
        load = meta.load
        # both load the empty store before either writes
        self.patch(meta, "load", lambda *a: load(*a).addCallback(
            lambda r: task.deferLater(reactor, 0.05, lambda: r)))
        nodes, brokers = [], []
        for name in ("n1", "n2"):
            f = yield startBroker(reactor)
            self.addCleanup(f.stop)
            f.broker.nodeName = name
            f.broker.addUser("only-" + name, "secret", [])
            node = ClusterNode(f.broker, name, meta, reactor)
            port = reactor.listenTCP(0, LinkFactory(node), interface="127.0.0.1")
            self.addCleanup(port.stopListening)
            self.addCleanup(node.stop)
            nodes.append((node, port.getHost().port))
            brokers.append(f.broker)
        yield defer.gatherResults([n.start(p) for n, p in nodes])
        users = [sorted(b.users) for b in brokers]
        self.assertEqual(users[0], users[1])
        self.assertIn(users[0], (["guest", "only-n1"], ["guest", "only-n2"]))
        stored, _ = yield meta.load("entities/user/")
        self.assertEqual(sorted(k.rpartition("/")[2] for k, _ in stored), users[0])
        # a change after the start still reaches the other node
        brokers[1].addUser("later", "secret", [])
        yield waitOnReactor(lambda: "later" in brokers[0].users, 2)


class ExpiryAndDeadLetterTests(ClusterCase):

    @inlineCallbacks
    def test_ttlDeadLettersToQueueOnOtherNode(self):
        """
        A queue on node 1 with x-message-ttl and a dead-letter exchange whose queue lives on
        node 3: expired messages arrive there with x-death; published from node 2.
        """
        def run():
            ch3 = self.conn(2).channel()
            ch3.exchange_declare("dlx", "fanout")
            ch3.queue_declare("dead")
            ch3.queue_bind("dead", "dlx")
            ch1 = self.conn(0).channel()
            ch1.queue_declare("ttlq", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "dlx"})
            ch2 = self.conn(1).channel()
            ch2.confirm_delivery()
            ch2.basic_publish("", "ttlq", b"soon")
            deadline = time.time() + 5
            while time.time() < deadline:
                m = ch3.basic_get("dead", auto_ack=True)
                if m[0] is not None:
                    return m[1].headers["x-death"][0], m[2]
                time.sleep(0.02)

        death, body = yield self.inThread(run)
        self.assertEqual(body, b"soon")
        self.assertEqual((death["reason"], death["queue"], death["count"]), ("expired", "ttlq", 1))

    @inlineCallbacks
    def test_rejectedDeadLetteredAcrossNodes(self):
        """A message rejected by a consumer on node 2 of a queue on node 1 is dead-lettered to node 3's queue."""
        def run():
            ch3 = self.conn(2).channel()
            ch3.queue_declare("rejected")
            ch1 = self.conn(0).channel()
            ch1.queue_declare("src", arguments={"x-dead-letter-exchange": "",
                                                "x-dead-letter-routing-key": "rejected"})
            ch2 = self.conn(1).channel()
            ch2.basic_publish("", "src", b"no")
            deadline = time.time() + 5
            while time.time() < deadline:
                m = ch2.basic_get("src", auto_ack=False)
                if m[0] is not None:
                    ch2.basic_reject(m[0].delivery_tag, requeue=False)
                    break
                time.sleep(0.02)
            while time.time() < deadline:
                m = ch3.basic_get("rejected", auto_ack=True)
                if m[0] is not None:
                    return m[1].headers["x-death"][0]["reason"], m[2]
                time.sleep(0.02)

        reason, body = yield self.inThread(run)
        self.assertEqual((reason, body), ("rejected", b"no"))

    @inlineCallbacks
    def test_delayedExchangeToQueueOnOtherNode(self):
        """An x-delayed-message exchange declared on node 1 delivers, when due, to a queue on node 2."""
        def run():
            ch2 = self.conn(1).channel()
            ch2.queue_declare("later")
            ch1 = self.conn(0).channel()
            ch1.exchange_declare("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
            ch1.queue_bind("later", "dx", "k")
            ch3 = self.conn(2).channel()
            ch3.confirm_delivery()
            sent = time.time()
            ch3.basic_publish("dx", "k", b"tick", pika.BasicProperties(headers={"x-delay": 200}))
            deadline = time.time() + 5
            while time.time() < deadline:
                m = ch2.basic_get("later", auto_ack=True)
                if m[0] is not None:
                    return m[2], time.time() - sent
                time.sleep(0.01)

        body, after = yield self.inThread(run)
        self.assertEqual(body, b"tick")
        self.assertGreaterEqual(after, 0.19)

    @inlineCallbacks
    def test_prefetchAcrossTheLink(self):
        """A consumer on node 2 with prefetch 3 of a queue on node 1 holds at most 3 unacked."""
        def run():
            ch1 = self.conn(0).channel()
            ch1.queue_declare("pq")
            for i in range(20):
                ch1.basic_publish("", "pq", b"%d" % i)
            c2 = self.conn(1)
            ch2 = c2.channel()
            ch2.basic_qos(prefetch_count=3)
            got = []
            ch2.basic_consume("pq", lambda ch, m, p, b: got.append(m.delivery_tag))
            deadline = time.time() + 1
            while time.time() < deadline:
                c2.process_data_events(0.05)
            held = len(got)
            ch2.basic_ack(got[-1], multiple=True)
            deadline = time.time() + 1
            while time.time() < deadline and len(got) < 6:
                c2.process_data_events(0.05)
            return held, len(got)

        held, after = yield self.inThread(run)
        self.assertEqual((held, after), (3, 6))
        q = self.fixtures[0].broker.vhosts["/"].queues["pq"]
        self.assertEqual((q.readyCount, q.unackedCount), (14, 3))


class OwnEchoTests(ClusterCase):

    @inlineCallbacks
    def test_declareDeleteCheck(self):
        """An exchange declared and deleted at once stays deleted (the declare's echo is not applied)."""
        def run():
            ch = self.conn(0).channel()
            out = []
            for i in range(20):
                ch.exchange_declare("ee%d" % i, "fanout")
                ch.exchange_delete("ee%d" % i)
            time.sleep(0.2)
            for i in range(20):
                try:
                    ch.exchange_declare("ee%d" % i, "fanout", passive=True)
                    out.append(i)
                except pika.exceptions.ChannelClosedByBroker:
                    ch = self.conn(0).channel()
            return out

        alive = yield self.inThread(run)
        self.assertEqual(alive, [])
        for f in self.fixtures:
            self.assertFalse([n for n in f.broker.vhosts["/"].exchanges if n.startswith("ee")])


class NoPrefetchTests(ClusterCase):

    @inlineCallbacks
    def test_unackedBeyondTheWindow(self):
        """A consumer without prefetch that acks nothing gets every message of a queue elsewhere (1500 > the window)."""
        def run():
            ch1 = self.conn(0).channel()
            ch1.queue_declare("np")
            for i in range(1500):
                ch1.basic_publish("", "np", b"%d" % i)
            c2 = self.conn(1)
            ch2 = c2.channel()
            got = []
            ch2.basic_consume("np", lambda ch, m, p, b: got.append(b))
            deadline = time.time() + 10
            while len(got) < 1500 and time.time() < deadline:
                c2.process_data_events(0.05)
            return len(got)

        n = yield self.inThread(run)
        self.assertEqual(n, 1500)


class ManagementTests(ClusterCase):
    """Any node's management API answers for the cluster (three nodes with their management apps)."""

    management = True

    def api(self, i, method, path, body=None):
        import base64
        import json
        import urllib.request

        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.fixtures[i].managementPort, path),
                                     method=method, data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        req.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data = r.read()
                return r.status, json.loads(data) if data else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    @inlineCallbacks
    def test_queuesAndNodes(self):
        """
        A queue declared over HTTP on node 1 with the balanced locator lands elsewhere; every
        node lists it with its home node; get, purge and delete over HTTP on node 1 work;
        /api/nodes lists the three nodes running.
        """
        def run():
            # node 1 holds one queue, so balanced puts the next one on node 2
            self.api(0, "PUT", "/api/queues/%2F/filler", {"durable": False})
            code, _ = self.api(0, "PUT", "/api/queues/%2F/hq", {"durable": True, "arguments": {
                "x-queue-leader-locator": "balanced"}})
            assert code == 201, code
            homes = {q["node"] for i in range(3) for q in self.api(i, "GET", "/api/queues")[1]
                     if q["name"] == "hq"}
            code, _ = self.api(0, "POST", "/api/exchanges/%2F/amq.default/publish", {
                "properties": {}, "routing_key": "hq", "payload": "p1", "payload_encoding": "string"})
            got = self.api(0, "POST", "/api/queues/%2F/hq/get", {
                "count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
            purged = self.api(0, "DELETE", "/api/queues/%2F/hq/contents")[0]
            deleted = self.api(0, "DELETE", "/api/queues/%2F/hq")[0]
            return homes, got, purged, deleted

        yield waitOnReactor(lambda: all(len(n.figures) == 2 for n in self.cluster), 5)
        homes, got, purged, deleted = yield self.inThread(run)
        self.assertEqual(homes, {"n2"})
        self.assertEqual((got[0], [m["payload"] for m in got[1]]), (200, ["p1"]))
        self.assertEqual((purged, deleted), (204, 204))
        code, nodes = yield self.inThread(self.api, 1, "GET", "/api/nodes")
        self.assertEqual(sorted((n["name"], n["running"]) for n in nodes),
                         [("n1", True), ("n2", True), ("n3", True)])

    @inlineCallbacks
    def test_downNodeInLists(self):
        """Node 2's links drop: node 1 lists it running false and its durable queue with state down."""
        def declare():
            self.conn(1).channel().queue_declare("dq2", durable=True)

        yield self.inThread(declare)
        yield waitOnReactor(lambda: "dq2" in self.fixtures[0].broker.vhosts["/"].remoteQueues, 5)
        n2 = self.cluster[1]
        n2.running = False
        yield self.ports[1].stopListening()
        for link in list(n2.links.values()):
            link.transport.abortConnection()
        yield waitOnReactor(lambda: "n2" not in self.cluster[0].links, 5)
        code, nodes = yield self.inThread(self.api, 0, "GET", "/api/nodes")
        self.assertEqual(sorted((n["name"], n["running"]) for n in nodes),
                         [("n1", True), ("n2", False), ("n3", True)])
        code, qs = yield self.inThread(self.api, 0, "GET", "/api/queues")
        # RabbitMQ 3.10 on a 3-node cluster with one node killed: the record's fields only
        self.assertEqual([q for q in qs if q["name"] == "dq2"], [{
            "arguments": {}, "auto_delete": False, "durable": True, "exclusive": False, "name": "dq2",
            "node": "n2", "state": "down", "type": "classic", "vhost": "/"}])
        self.assertEqual([n for n in nodes if n["name"] == "n2"],
                         [{"name": "n2", "type": "disc", "running": False, "cluster_links": []}])
        # the queue alone is 404, and the overview does not count it (as RabbitMQ)
        code, q = yield self.inThread(self.api, 0, "GET", "/api/queues/%2F/dq2")
        self.assertEqual(code, 404)
        code, ov = yield self.inThread(self.api, 0, "GET", "/api/overview")
        self.assertEqual(ov["object_totals"]["queues"], 0)
        code, page = yield self.inThread(self.api, 2, "GET", "/api/queues/%2F?page=1&page_size=10")
        self.assertEqual(([q["name"] for q in page["items"]], page["total_count"]), (["dq2"], 1))
        code, doc = yield self.inThread(self.api, 0, "GET", "/api/definitions")
        self.assertEqual([q["name"] for q in doc["queues"]], ["dq2"])
        # the vhost's cluster_state leaves the stopped node out, as RabbitMQ 3.10
        code, vh = yield self.inThread(self.api, 0, "GET", "/api/vhosts/%2F")
        self.assertEqual(vh["cluster_state"], {"n1": "running", "n3": "running"})

    def apiAs(self, i, method, path, user, password):
        import base64
        import json
        import urllib.request

        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.fixtures[i].managementPort, path),
                                     method=method)
        req.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data = r.read()
                return r.status, json.loads(data) if data else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    @inlineCallbacks
    def test_connectionsOfOtherNodes(self):
        """
        A connection on node 1 is listed by node 3 with node "n1", with its channels (also
        per vhost, and paginated over the merged list); node 3 shows it and its channels by
        name, and DELETE on node 3 closes it with 320 CONNECTION_FORCED.
        """
        c1 = yield self.inThread(self.conn, 0)
        yield self.inThread(lambda: (c1.channel(), c1.channel()))
        c2 = yield self.inThread(self.conn, 1)
        yield self.inThread(c2.channel)

        def lists():
            conns = self.api(2, "GET", "/api/connections")[1]
            chans = self.api(2, "GET", "/api/channels")[1]
            vconns = self.api(2, "GET", "/api/vhosts/%2F/connections")[1]
            page = self.api(2, "GET", "/api/connections?page=2&page_size=1&columns=name,node")[1]
            pageDesc = self.api(2, "GET", "/api/channels?sort=number&sort_reverse=true&page=1&page_size=2")[1]
            return conns, chans, vconns, page, pageDesc

        conns, chans, vconns, page, pageDesc = yield self.inThread(lists)
        self.assertEqual(sorted(c["node"] for c in conns), ["n1", "n2"])
        self.assertEqual([c["name"] for c in conns], sorted(c["name"] for c in conns))
        self.assertEqual(vconns, conns)
        name1 = [c["name"] for c in conns if c["node"] == "n1"][0]
        self.assertEqual(sorted((ch["node"], ch["number"]) for ch in chans), [("n1", 1), ("n1", 2), ("n2", 1)])
        self.assertEqual((page["total_count"], page["item_count"], page["page_count"]), (2, 1, 2))
        self.assertEqual(page["items"], [{"name": conns[1]["name"], "node": conns[1]["node"]}])
        self.assertEqual([ch["number"] for ch in pageDesc["items"]], [2, 1])
        self.assertEqual(pageDesc["total_count"], 3)

        quoted = urllib.parse.quote(name1, safe="")

        def one():
            return (self.api(2, "GET", "/api/connections/" + quoted),
                    self.api(2, "GET", "/api/connections/%s/channels" % (quoted,)),
                    self.api(2, "GET", "/api/connections/nosuch"),
                    self.api(2, "DELETE", "/api/connections/nosuch")[0],
                    self.api(2, "GET", "/api/channels/" + urllib.parse.quote(name1 + " (2)", safe="")),
                    self.api(2, "GET", "/api/channels/nosuch")[0])

        (code, got), (ccode, cchans), missing, delMissing, (chCode, ch), chMissing = yield self.inThread(one)
        self.assertEqual((chCode, ch["node"], ch["number"], ch["consumer_details"], chMissing), (200, "n1", 2, [], 404))
        self.assertEqual((code, got["name"], got["node"], got["user"]), (200, name1, "n1", "guest"))
        self.assertEqual((ccode, [ch["number"] for ch in cchans]), (200, [1, 2]))
        self.assertEqual((missing[0], delMissing), (404, 404))

        def close():
            code = self.api(2, "DELETE", "/api/connections/" + quoted)[0]
            deadline = time.time() + 5
            while time.time() < deadline:
                try:
                    c1.process_data_events(0.1)
                except pika.exceptions.ConnectionClosedByBroker as e:
                    return code, e.reply_code, e.reply_text
            return code, None, None

        code, replyCode, replyText = yield self.inThread(close)
        self.assertEqual((code, replyCode, replyText),
                         (204, 320, "CONNECTION_FORCED - Closed via management plugin"))
        yield waitOnReactor(lambda: not self.fixtures[0].broker.connections, 5)
        conns = (yield self.inThread(self.api, 2, "GET", "/api/connections"))[1]
        self.assertEqual([c["node"] for c in conns], ["n2"])

    @inlineCallbacks
    def test_connectionsOfOtherNodesOwnOnly(self):
        """
        A user without the monitoring tag sees only its own connections on other nodes too,
        may not see or close another user's there, and may close its own.
        """
        b1 = self.fixtures[0].broker
        b1.addUser("alice", "secret", ["management"])
        b1.setPermissions("alice", "/", ".*", ".*", ".*")
        yield waitOnReactor(lambda: all(("alice", "/") in f.broker.permissions for f in self.fixtures), 2)

        def connect(user, password):
            c = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", self.fixtures[0].amqpPort, credentials=pika.PlainCredentials(user, password)))
            self.addCleanup(lambda: threads.deferToThread(lambda: c.is_open and c.close()))
            c.channel()
            return c

        alice = yield self.inThread(connect, "alice", "secret")
        yield self.inThread(connect, "guest", "guest")

        def run():
            mine = self.apiAs(2, "GET", "/api/connections", "alice", "secret")[1]
            chans = self.apiAs(2, "GET", "/api/channels", "alice", "secret")[1]
            every = self.api(2, "GET", "/api/connections")[1]
            guests = [c["name"] for c in every if c["user"] == "guest"]
            q = urllib.parse.quote(guests[0], safe="")
            other = self.apiAs(2, "GET", "/api/connections/" + q, "alice", "secret")[0]
            otherCh = self.apiAs(2, "GET", "/api/channels/" + urllib.parse.quote(guests[0] + " (1)", safe=""),
                                 "alice", "secret")[0]
            otherDel = self.apiAs(2, "DELETE", "/api/connections/" + q, "alice", "secret")[0]
            ownDel = self.apiAs(2, "DELETE", "/api/connections/" + urllib.parse.quote(mine[0]["name"], safe=""),
                                "alice", "secret")[0]
            deadline = time.time() + 5
            while time.time() < deadline:
                try:
                    alice.process_data_events(0.1)
                except pika.exceptions.ConnectionClosedByBroker as e:
                    return mine, chans, every, other, otherCh, otherDel, (ownDel, e.reply_code)
            return mine, chans, every, other, otherCh, otherDel, (ownDel, None)

        mine, chans, every, other, otherCh, otherDel, ownDel = yield self.inThread(run)
        self.assertEqual([(c["user"], c["node"]) for c in mine], [("alice", "n1")])
        self.assertEqual([ch["user"] for ch in chans], ["alice"])
        self.assertEqual(sorted(c["user"] for c in every), ["alice", "guest"])
        self.assertEqual((other, otherCh, otherDel, ownDel), (401, 401, 401, (204, 320)))
        yield waitOnReactor(lambda: [c.user.name for c in b1.connections] == ["guest"], 5)

    @inlineCallbacks
    def test_consumersOfOtherNodes(self):
        """Node 3's /api/consumers lists a consumer on node 1 (its queue on node 2) and one on node 3."""
        def setup():
            self.conn(1).channel().queue_declare("cq")
            ch1 = self.conn(0).channel()
            ch1.basic_consume("cq", lambda *a: None, consumer_tag="t1")
            ch3 = self.conn(2).channel()
            ch3.basic_consume("cq", lambda *a: None, consumer_tag="t3")
            # the queue's own JSON at its home, where both consumers are LinkConsumers (it was a 500)
            status, home = self.api(1, "GET", "/api/queues/%2F/cq")
            self.assertEqual((status, home["consumers"], home["consumer_details"]), (200, 2, []))
            return (self.api(2, "GET", "/api/consumers")[1], self.api(0, "GET", "/api/consumers/%2F")[1],
                    self.api(1, "GET", "/api/consumers?columns=consumer_tag&page=2&page_size=1")[1])

        every, perVHost, page = yield self.inThread(setup)
        self.assertEqual([(c["consumer_tag"], c["channel_details"]["node"]) for c in every],
                         [("t1", "n1"), ("t3", "n3")])
        self.assertEqual(perVHost, every)
        self.assertEqual((page["items"], page["total_count"]), ([{"consumer_tag": "t3"}], 2))

    @inlineCallbacks
    def test_silentNodeLeftOut(self):
        """A node that does not answer in the link's ask timeout is left out of the lists (not a 500)."""
        from twisted.internet.defer import Deferred

        from otter_tx.cluster import link

        self.patch(link, "ASK_TIMEOUT", 1)
        self.cluster[1].handlers["mgmt.connections"] = lambda args: Deferred()
        self.cluster[1].handlers["mgmt.channels"] = lambda args: 1 / 0
        yield self.inThread(self.conn, 0)
        yield self.inThread(self.conn, 1)
        code, conns = yield self.inThread(self.api, 2, "GET", "/api/connections")
        self.assertEqual((code, [c["node"] for c in conns]), (200, ["n1"]))
        code, chans = yield self.inThread(self.api, 2, "GET", "/api/channels")
        self.assertEqual((code, chans), (200, []))
        self.flushLoggedErrors(ZeroDivisionError)

    @inlineCallbacks
    def test_definitionsRoundTrip(self):
        """
        Export a vhost whose queues live on other nodes, delete the vhost, import the export
        through another node: every queue and binding is back (records of a deleted vhost go
        with it; the re-declares wait for that).
        """
        def run():
            assert self.api(0, "PUT", "/api/vhosts/dv")[0] == 201
            self.api(0, "PUT", "/api/permissions/dv/guest", {"configure": ".*", "write": ".*", "read": ".*"})
            for i in range(4):
                self.api(0, "PUT", "/api/queues/dv/dq%d" % i, {"durable": True, "arguments": {
                    "x-queue-leader-locator": "balanced"}})
                self.api(0, "POST", "/api/bindings/dv/e/amq.direct/q/dq%d" % i, {"routing_key": "k%d" % i})
            code, doc = self.api(1, "GET", "/api/definitions/dv")
            homes = {q["name"]: q["node"] for q in self.api(2, "GET", "/api/queues/dv")[1]}
            assert self.api(1, "DELETE", "/api/vhosts/dv")[0] == 204
            assert self.api(1, "PUT", "/api/vhosts/dv")[0] == 201
            self.api(1, "PUT", "/api/permissions/dv/guest", {"configure": ".*", "write": ".*", "read": ".*"})
            imported = self.api(1, "POST", "/api/definitions/dv", doc)
            time.sleep(0.3)
            after = sorted(q["name"] for q in self.api(0, "GET", "/api/queues/dv")[1])
            bindings = sorted(b["destination"] for b in self.api(2, "GET", "/api/bindings/dv")[1]
                              if b["source"] == "amq.direct")
            return homes, imported, after, bindings

        homes, imported, after, bindings = yield self.inThread(run)
        self.assertEqual(len(set(homes.values())), 3, homes)
        self.assertEqual(imported[0], 204, imported)
        self.assertEqual(after, ["dq0", "dq1", "dq2", "dq3"])
        self.assertEqual(bindings, ["dq0", "dq1", "dq2", "dq3"])

    @inlineCallbacks
    def test_overviewAggregates(self):
        """
        Node 1's overview counts node 2's queue, its messages and consumer, and node 3's
        connection; ``node`` is node 1's name.  Node 3's definitions export lists the queue.
        """
        def setup():
            ch2 = self.conn(1).channel()
            ch2.queue_declare("oq", durable=True)
            ch2.confirm_delivery()
            for i in range(3):
                ch2.basic_publish("", "oq", b"m")
            ch2.queue_declare("oq2")
            ch2.basic_consume("oq2", lambda *a: None)
            self.conn(2).channel()

        yield self.inThread(setup)
        b1 = self.fixtures[0].broker

        def seen():
            remote = b1.vhosts["/"].remoteQueues
            figures = self.cluster[0].figures
            return ("oq" in remote and remote["oq"].figures.get("messages_ready") == 3
                    and "oq2" in remote and remote["oq2"].figures.get("consumers") == 1
                    and figures.get("n3", {}).get("overview", {}).get("connections") == 1)

        yield waitOnReactor(seen, 5)
        code, ov = yield self.inThread(self.api, 0, "GET", "/api/overview")
        self.assertEqual(code, 200)
        self.assertEqual(ov["node"], "n1")
        totals = ov["object_totals"]
        self.assertEqual((totals["queues"], totals["consumers"], totals["connections"], totals["channels"]),
                         (2, 1, 2, 2))
        self.assertEqual((ov["queue_totals"]["messages"], ov["queue_totals"]["messages_ready"]), (3, 3))
        code, vh = yield self.inThread(self.api, 0, "GET", "/api/vhosts/%2F")
        self.assertEqual((vh["messages"], vh["cluster_state"]), (3, {"n1": "running", "n2": "running",
                                                                     "n3": "running"}))
        code, doc = yield self.inThread(self.api, 2, "GET", "/api/definitions")
        self.assertEqual(sorted(q["name"] for q in doc["queues"]), ["oq", "oq2"])

    def test_prometheusIdentity(self):
        """Each node's metrics carry its own name (rabbitmq_identity_info's rabbitmq_node) and the cluster's."""
        from otter_tx.web.metrics import BrokerCollector

        b2 = self.fixtures[1].broker
        b2.globalParameters["cluster_name"] = "otters"
        family = next(f for f in BrokerCollector(b2, lambda: 1.0).collect() if f.name == "rabbitmq_identity_info")
        self.assertEqual(family.samples[0].labels, {"rabbitmq_node": "n2", "rabbitmq_cluster": "otters"})

    @inlineCallbacks
    def test_bindingToRemoteQueueOverHTTP(self):
        """
        A binding made over HTTP on node 1 (exchange declared on node 3) to a queue whose home is
        node 2 routes an HTTP publish made on node 3; the aliveness test answers on every node.
        """
        def declare():
            self.conn(1).channel().queue_declare("bq", durable=True)
            assert self.api(2, "PUT", "/api/exchanges/%2F/hx", {"type": "direct", "durable": True})[0] == 201

        yield self.inThread(declare)
        yield waitOnReactor(lambda: "bq" in self.fixtures[0].broker.vhosts["/"].remoteQueues
                        and "hx" in self.fixtures[0].broker.vhosts["/"].exchanges, 5)
        code, _ = yield self.inThread(self.api, 0, "POST", "/api/bindings/%2F/e/hx/q/bq", {"routing_key": "k"})
        self.assertEqual(code, 201)
        yield waitOnReactor(lambda: self.fixtures[2].broker.vhosts["/"].exchanges["hx"].routing.bindings(), 5)

        def publishAndGet():
            code, routed = self.api(2, "POST", "/api/exchanges/%2F/hx/publish", {
                "properties": {}, "routing_key": "k", "payload": "via-http", "payload_encoding": "string"})
            got = []
            deadline = time.time() + 5
            while not got and time.time() < deadline:
                got = self.api(0, "POST", "/api/queues/%2F/bq/get", {
                    "count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})[1]
                time.sleep(0.05)
            bindings = self.api(1, "GET", "/api/queues/%2F/bq/bindings")[1]
            alive = [self.api(i, "GET", "/api/aliveness-test/%2F") for i in range(3)]
            return routed, got, bindings, alive

        routed, got, bindings, alive = yield self.inThread(publishAndGet)
        self.assertEqual(routed, {"routed": True})
        self.assertEqual([m["payload"] for m in got], ["via-http"])
        self.assertIn(("hx", "k"), [(b["source"], b["routing_key"]) for b in bindings])
        self.assertEqual(alive, [(200, {"status": "ok"})] * 3)


class LocatorTests(ClusterCase):

    @inlineCallbacks
    def test_policyLocator(self):
        """A queue-leader-locator: balanced policy spreads the queues it matches over the nodes."""
        self.fixtures[0].broker.setPolicy("/", "spread", "^sp-", {"queue-leader-locator": "balanced"}, 0, "queues")

        def run():
            ch = self.conn(0).channel()
            for i in range(6):
                ch.queue_declare("sp-%d" % i)
            ch.queue_declare("local-one")

        yield self.inThread(run)
        homes = [sum(1 for n in f.broker.vhosts["/"].queues if n.startswith("sp-")) for f in self.fixtures]
        self.assertEqual(homes, [2, 2, 2])
        self.assertIn("local-one", self.fixtures[0].broker.vhosts["/"].queues)

    @inlineCallbacks
    def test_maxQueuesCountsEveryNode(self):
        """max-queues counts the vhost's queues on every node: with the first queue placed on another
        node, the second declare is still 406, and a record applied from another node is not refused."""
        self.fixtures[0].broker.setPolicy("/", "spread", "^mq-", {"queue-leader-locator": "balanced"}, 0, "queues")
        # set on node 1, the limit reaches every node through the vhost's record
        self.fixtures[0].broker.vhosts["/"].setLimit("max-queues", 2)
        yield waitOnReactor(lambda: all(f.broker.vhosts["/"].limit("max-queues") == 2 for f in self.fixtures), 1)

        def run():
            ch = self.conn(0).channel()
            ch.queue_declare("mq-a")
            ch.queue_declare("mq-b")
            try:
                ch.queue_declare("mq-c")
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code, e.reply_text

        refused = yield self.inThread(run)
        self.assertEqual(refused, (406, "PRECONDITION_FAILED - cannot declare queue 'mq-c': "
                                        "queue limit in vhost '/' (2) is reached"))
        homes = [sorted(n for n in f.broker.vhosts["/"].queues if n.startswith("mq-")) for f in self.fixtures]
        self.assertEqual(sorted(sum(homes, [])), ["mq-a", "mq-b"])
        self.assertEqual(sum(1 for h in homes if h), 2)


class StreamManagementTests(ClusterCase):
    """Stream protocol connections of every node in any node's management API."""

    nodes = 2
    management = True
    stream = True
    api = ManagementTests.api

    @inlineCallbacks
    def test_streamConnectionsOfOtherNodes(self):
        """
        A stream connection on node 1, its publisher and its subscription are
        listed by node 2 (/api/connections, /api/stream/...), shown by name,
        and DELETE on node 2 closes its socket.
        """
        from otter_tx.test.interop.stream_raw import RawStreamClient
        from otter_tx.stream import wire

        def work():
            c = RawStreamClient("127.0.0.1", self.fixtures[0].streamPort)
            self.addCleanup(c.close)
            assert c.handshake() == wire.OK
            assert c.create("cs") == wire.OK
            assert c.declarePublisher(1, "ref1", "cs") == wire.OK
            c.publish(1, [(1, b"a"), (2, b"b")])
            assert c.confirms() == (1, [1, 2])
            assert c.subscribe(3, "cs", props={"name": "cons1"}) == wire.OK
            c.deliver()
            return c

        c = yield self.inThread(work)

        def lists():
            return {p: self.api(1, "GET", p) for p in (
                "/api/connections", "/api/vhosts/%2F/connections", "/api/stream/connections",
                "/api/stream/connections/%2F", "/api/stream/publishers", "/api/stream/publishers/%2F/cs",
                "/api/stream/consumers", "/api/stream/consumers/%2F")}

        got = yield self.inThread(lists)
        for p, (code, items) in got.items():
            self.assertEqual((code, len(items)), (200, 1), p)
        conn = got["/api/connections"][1][0]
        self.assertEqual((conn["node"], conn["protocol"], conn["user"]), ("n1", "stream", "guest"))
        pub = got["/api/stream/publishers"][1][0]
        self.assertEqual((pub["connection_details"]["node"], pub["reference"], pub["published"], pub["confirmed"]),
                         ("n1", "ref1", 2, 2))
        cons = got["/api/stream/consumers"][1][0]
        self.assertEqual((cons["subscription_id"], cons["consumed"], cons["properties"]), (3, 2, {"name": "cons1"}))
        quoted = urllib.parse.quote(conn["name"], safe="")

        def one():
            return (self.api(1, "GET", "/api/connections/" + quoted),
                    self.api(1, "GET", "/api/stream/connections/%2F/" + quoted),
                    self.api(1, "GET", "/api/stream/connections/%2F/" + quoted + "/publishers"),
                    self.api(1, "GET", "/api/stream/connections/%2F/" + quoted + "/consumers"),
                    self.api(1, "GET", "/api/stream/connections/%2F/nosuch")[0])

        (c1, d1), (c2, d2), (c3, pubs), (c4, subs), missing = yield self.inThread(one)
        self.assertEqual((c1, c2, c3, c4, missing), (200, 200, 200, 200, 404))
        self.assertEqual((d1["name"], d2["name"], d2["node"]), (conn["name"], conn["name"], "n1"))
        self.assertEqual(([p["publisher_id"] for p in pubs], [s["subscription_id"] for s in subs]), ([1], [3]))

        def close():
            code = self.api(1, "DELETE", "/api/stream/connections/%2F/" + quoted)[0]
            try:
                while True:
                    c.frame()
            except EOFError:
                return code, "closed"
            except OSError as e:
                return code, repr(e)

        self.assertEqual((yield self.inThread(close)), (204, "closed"))
        conns = (yield self.inThread(self.api, 1, "GET", "/api/stream/connections"))[1]
        self.assertEqual(conns, [])


class OverviewTests(ClusterCase):
    """The overview counts the cluster."""

    management = True
    api = ManagementTests.api

    @inlineCallbacks
    def test_overviewCountsTheCluster(self):
        """The overview on node 3 counts a queue on node 2 and its message, node 1's connection and publish."""
        def run():
            c = self.conn(0)
            ch = c.channel()
            ch.queue_declare("ovq", arguments={"x-queue-leader-locator": "balanced"})
            ch.confirm_delivery()
            ch.basic_publish("", "ovq", b"one")
            return c

        yield self.inThread(run)
        yield waitOnReactor(lambda: all(len(n.figures) == 2 for n in self.cluster), 5)
        yield task.deferLater(reactor, 1.2, lambda: None)  # the figures of a second later
        code, o = yield self.inThread(self.api, 2, "GET", "/api/overview")
        self.assertEqual((o["node"], o["object_totals"]["queues"], o["queue_totals"]["messages"]), ("n3", 1, 1))
        self.assertGreaterEqual(o["object_totals"]["connections"], 1)
        # node 1's publish is in node 3's message_stats, with a rate
        self.assertEqual(o["message_stats"].get("publish"), 1)
        self.assertIn("rate", o["message_stats"]["publish_details"])


class LinkFlowTests(ClusterCase):
    """A link whose write buffer backs up puts the publishers of its node in flow, and nothing is lost."""

    nodes = 2

    def setUp(self):
        from otter_tx.cluster import link
        self.patch(link, "LINK_HIGH_WATER", 2048)
        return ClusterCase.setUp(self)

    @inlineCallbacks
    def test_backedUpLinkHoldsPublishers(self):
        """2,000 unconfirmed 1 KiB publishes on node 1 to a queue on node 2 through a 2 KiB link buffer:
        the link pauses, node 1's publisher is in flow meanwhile, and all 2,000 arrive in order."""
        node1 = self.cluster[0]
        link = node1.links["n2"]
        pauses = []
        original = node1.linkPaused

        def paused(l):
            original(l)
            pauses.append([c.flowState for c in self.fixtures[0].broker.connections])

        self.patch(node1, "linkPaused", paused)

        def declare():
            self.conn(1).channel().queue_declare("flowq")

        yield self.inThread(declare)

        def publish():
            c = self.conn(0)
            ch = c.channel()
            for i in range(2000):
                ch.basic_publish("", "flowq", b"%04d" % i + b"x" * 1020)
            c.close()

        yield self.inThread(publish)
        home = self.fixtures[1].broker.vhosts["/"].queues["flowq"]
        yield waitOnReactor(lambda: home.readyCount == 2000, 20)
        self.assertTrue(pauses, "the link never backed up")
        self.assertIn(["flow"], pauses)
        self.assertFalse(link.paused)
        self.assertFalse(self.fixtures[0].broker.linkFlow)

        def drain():
            ch = self.conn(1).channel()
            return [ch.basic_get("flowq", auto_ack=True)[2][:4] for _ in range(2000)]

        bodies = yield self.inThread(drain)
        self.assertEqual(bodies, [b"%04d" % i for i in range(2000)])


class ConfirmsAcrossLostLinkTests(ClusterCase):
    """A confirmed publisher keeps getting answers while the link to its queue's node drops."""

    @inlineCallbacks
    def test_publisherNotStuck(self):
        """
        Persistent, mandatory publishes with confirms on node 1 to a durable queue on node 2:
        node 2's links are cut mid-stream.  Every publish is answered (confirmed, returned or
        nacked) within 5 s, and every one confirmed and not returned before the cut is in the
        queue.
        """
        import threading

        def declare():
            self.conn(1).channel().queue_declare("cq", durable=True)

        yield self.inThread(declare)
        taken, outcomes = [], []
        stop = threading.Event()

        def publish():
            c = self.conn(0)
            ch = c.channel()
            ch.confirm_delivery()
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    ch.basic_publish("", "cq", b"%d" % n, pika.BasicProperties(delivery_mode=2), mandatory=True)
                    taken.append(n)
                    outcomes.append("ack")
                except pika.exceptions.UnroutableError:
                    outcomes.append("returned")
                except pika.exceptions.NackError:
                    outcomes.append("nack")
                    ch = c.channel()
                    ch.confirm_delivery()

        done = self.inThread(publish)
        yield waitOnReactor(lambda: len(outcomes) >= 200, 10)
        n2 = self.cluster[1]
        for link in list(n2.links.values()):
            link.transport.abortConnection()
        cut = len(outcomes)
        yield waitOnReactor(lambda: len(outcomes) >= cut + 200, 5)
        stop.set()
        yield done
        home = self.fixtures[1].broker.vhosts["/"].queues["cq"]
        # what is there, and what reaches it still (forwards after the link came back)
        yield waitOnReactor(lambda: home.readyCount >= len(taken), 5)

        def bodies():
            ch = self.conn(1).channel()
            out = set()
            while True:
                m = ch.basic_get("cq", auto_ack=True)
                if m[0] is None:
                    return out
                out.add(int(m[2]))

        found = yield self.inThread(bodies)
        self.assertEqual(sorted(set(taken) - found), [])


class ExclusiveConsumeAcrossNodesTests(ClusterCase):
    """basic.consume's 403 "in exclusive use" holds across nodes, as on one RabbitMQ node."""

    @inlineCallbacks
    def test_exclusiveUseAcrossNodes(self):
        """
        An exclusive consumer on node 1 of a queue on node 2: a consume on node 3 and one on node 2
        are 403; with a plain consumer on node 3, an exclusive one asked on node 1 is 403; after it
        is cancelled, the exclusive consume on node 1 succeeds.
        """
        def run():
            out = []
            self.conn(1).channel().queue_declare("xq")
            c1 = self.conn(0)
            ch1 = c1.channel()
            ch1.basic_consume("xq", lambda *a: None, exclusive=True, consumer_tag="x1")
            for i in (2, 1):
                try:
                    self.conn(i).channel().basic_consume("xq", lambda *a: None)
                    out.append(None)
                except pika.exceptions.ChannelClosedByBroker as e:
                    out.append((e.reply_code, e.reply_text))
            ch1.basic_cancel("x1")
            c3 = self.conn(2)
            ch3 = c3.channel()
            ch3.basic_consume("xq", lambda *a: None, consumer_tag="plain")
            try:
                c1.channel().basic_consume("xq", lambda *a: None, exclusive=True)
                out.append(None)
            except pika.exceptions.ChannelClosedByBroker as e:
                out.append((e.reply_code, e.reply_text))
            ch3.basic_cancel("plain")
            c1.channel().basic_consume("xq", lambda *a: None, exclusive=True, consumer_tag="x2")
            out.append("x2")
            return out

        out = yield self.inThread(run)
        refused = (403, "ACCESS_REFUSED - queue 'xq' in vhost '/' in exclusive use")
        self.assertEqual(out, [refused, refused, refused, "x2"])


class SettleOrderTests(ClusterCase):
    """What a channel does to a queue on another node reaches it in the channel's order."""

    nodes = 2

    @inlineCallbacks
    def test_requeueThenGet(self):
        """basic.get, basic.reject with requeue, basic.get at once: the second get finds the message
        (kombu's test_requeue against a queue on another node)."""
        def run():
            self.conn(1).channel().queue_declare("rg")
            ch = self.conn(0).channel()
            ch.basic_publish("", "rg", b"again")
            out = []
            for _ in range(20):
                m = ch.basic_get("rg")
                ch.basic_reject(m[0].delivery_tag, requeue=True)
                m2 = ch.basic_get("rg")
                out.append((m2[2], m2[0].redelivered) if m2[0] is not None else None)
                if m2[0] is not None:
                    ch.basic_reject(m2[0].delivery_tag, requeue=True)
            return out

        out = yield self.inThread(run)
        self.assertEqual(out, [(b"again", True)] * 20)


class RecordOrderTests(ClusterCase):

    @inlineCallbacks
    def test_bindingRecordBeforeItsExchange(self):
        """
        A binding's record applied before its exchange's (two keys another
        node wrote at once commit in either order) is made once the exchange
        is: it routes.
        """
        from otter_tx.cluster import metadata as md

        def declare():
            self.conn(1).channel().queue_declare("ordq")
            return True

        yield self.inThread(declare)
        record = {"source": "ordx", "destination_type": "queue", "destination": "ordq", "routing_key": "k",
                  "arguments": {}}
        self.meta._put(md.bindingKey("/", "ordx", "queue", "ordq", "k", {}), record, None)
        self.meta._put(md.exchangeKey("/", "ordx"), {"type": "direct", "durable": False, "auto_delete": False,
                                                      "internal": False, "arguments": {}}, None)
        vh = self.fixtures[2].broker.vhosts["/"]
        yield waitOnReactor(lambda: "ordx" in vh.exchanges, 5)

        def publish():
            ch = self.conn(2).channel()
            ch.confirm_delivery()
            try:
                ch.basic_publish("ordx", "k", b"routed", mandatory=True)
            except pika.exceptions.UnroutableError:
                return "unroutable"
            return "routed"

        self.assertEqual((yield self.inThread(publish)), "routed")
