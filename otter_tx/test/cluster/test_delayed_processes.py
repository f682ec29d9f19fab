"""
Replicated delayed messages on a real cluster: a real etcd and three
``twistd ottermq`` nodes (:class:`otter_tx.cluster.local.LocalCluster`),
SIGKILL of the node holding them; every wait is bounded.
"""

import signal
import time

import pika
import pika.exceptions
from twisted.internet import threads
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from otter_tx.test.cluster.test_processes import params, startCluster


class DelayedProcessTests(TestCase):
    timeout = 120

    @inlineCallbacks
    def setUp(self):
        self.cluster = yield startCluster(self, 3)

    def bindingEverywhere(self, exchange, seconds=10):
        """
        Wait (in a thread) until every node's management API lists a binding
        from ``exchange``: a survivor that adopts a message fires it through
        its own copy of the binding (a fixed sleep was too short on a loaded
        PyPy run, and the adopted messages were unroutable).
        """
        import base64
        import json
        import urllib.request

        deadline = time.monotonic() + seconds
        for n in self.cluster.nodes:
            while time.monotonic() < deadline:
                req = urllib.request.Request("http://127.0.0.1:%d/api/exchanges/%%2F/%s/bindings/source"
                                             % (n.managementPort, exchange))
                req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
                try:
                    with urllib.request.urlopen(req, timeout=5) as r:
                        if json.loads(r.read()):
                            break
                except Exception:
                    pass
                time.sleep(0.05)
            else:
                raise AssertionError("node %s has no binding from %s after %d s" % (n.name, exchange, seconds))

    def port(self, i):
        return self.cluster.nodes[i].amqpPort

    @inlineCallbacks
    def test_killedLeaderMessagesDeliveredOnce(self):
        """
        30 confirmed delayed messages (3 s) published on node 1, which is
        SIGKILLed at once: a survivor adopts them and every one is delivered
        to the queue on node 2 when due, with its ``x-delayed-id``.  Node 1
        restarted afterwards does not fire them again (it finds the claim).
        """
        def setup():
            c2 = pika.BlockingConnection(params(self.port(1)))
            c2.channel().queue_declare("dq", durable=True)
            c2.close()
            c1 = pika.BlockingConnection(params(self.port(0)))
            ch = c1.channel()
            ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
            ch.queue_bind("dq", "dx", "k")
            self.bindingEverywhere("dx")  # (the binding reaches the other nodes through etcd)
            ch.confirm_delivery()
            started = time.time()
            for i in range(30):
                ch.basic_publish("dx", "k", b"d%d" % i, pika.BasicProperties(
                    delivery_mode=2, headers={"x-delay": 3000}))
            c1.close()
            return started

        started = yield threads.deferToThread(setup)
        yield self.cluster.nodes[0].kill(signal.SIGKILL)

        def drain(seconds, want):
            c = pika.BlockingConnection(params(self.port(1)))
            ch = c.channel()
            out = []
            deadline = time.monotonic() + seconds
            while len(out) < want and time.monotonic() < deadline:
                m = ch.basic_get("dq", auto_ack=True)
                if m[0] is None:
                    time.sleep(0.05)
                    continue
                out.append((m[2], m[1].headers.get("x-delayed-id"), time.time()))
            c.close()
            return out

        out = yield threads.deferToThread(drain, 15, 30)
        self.assertEqual(sorted(b for b, _, _ in out), sorted(b"d%d" % i for i in range(30)))
        self.assertEqual(sorted(i for _, i, _ in out), sorted("otter1:%d" % k for k in range(1, 31)))
        self.assertGreaterEqual(min(t for _, _, t in out) - started, 2.9)
        self.assertLess(max(t for _, _, t in out) - started, 8)
        yield self.cluster.nodes[0].start()
        again = yield threads.deferToThread(drain, 3, 1)
        self.assertEqual(again, [])
        with open(self.cluster.nodes[0].dataDir + ".log", "rb") as f:
            self.assertRegex(f.read().decode("utf-8", "replace"),
                             r"otter1's 30 held delayed messages were adopted by otter[23]: dropped here")

    @inlineCallbacks
    def test_wholeClusterRestart(self):
        """
        Node 1 (holding 20 delayed messages) is SIGKILLed, then the two others
        stop one after the other (SIGTERM) before the messages are due, and
        all three start again: every message is delivered (late), none lost;
        duplicates, if any, carry the same ``x-delayed-id``.
        """
        def setup():
            c = pika.BlockingConnection(params(self.port(0)))
            ch = c.channel()
            ch.queue_declare("rq", durable=True)
            ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
            ch.queue_bind("rq", "dx", "k")
            self.bindingEverywhere("dx")
            ch.confirm_delivery()
            for i in range(20):
                ch.basic_publish("dx", "k", b"r%d" % i, pika.BasicProperties(
                    delivery_mode=2, headers={"x-delay": 4000}))
            c.close()

        yield threads.deferToThread(setup)
        nodes = self.cluster.nodes
        yield nodes[0].kill(signal.SIGKILL)
        yield threads.deferToThread(time.sleep, 0.5)
        yield nodes[1].stop()
        yield threads.deferToThread(time.sleep, 0.5)
        yield nodes[2].stop()
        yield threads.deferToThread(time.sleep, 4)
        for n in nodes:
            yield n.start()

        def drain():
            c = pika.BlockingConnection(params(self.port(0)))
            ch = c.channel()
            out = []
            deadline = time.monotonic() + 15
            while len({b for b, _ in out}) < 20 and time.monotonic() < deadline:
                try:
                    m = ch.basic_get("rq", auto_ack=True)
                except pika.exceptions.ChannelClosedByBroker:
                    ch = c.channel()
                    time.sleep(0.1)
                    continue
                if m[0] is None:
                    time.sleep(0.05)
                    continue
                out.append((m[2], m[1].headers.get("x-delayed-id")))
            time.sleep(1)
            while True:
                m = ch.basic_get("rq", auto_ack=True)
                if m[0] is None:
                    break
                out.append((m[2], m[1].headers.get("x-delayed-id")))
            c.close()
            return out

        out = yield threads.deferToThread(drain)
        self.assertEqual(sorted({b for b, _ in out}), sorted(b"r%d" % i for i in range(20)))
        self.assertEqual(len({(b, i) for b, i in out}), 20)

    @inlineCallbacks
    def test_pausedLeader(self):
        """
        SIGSTOP of the node holding 10 delayed messages (due 3 s later): when
        its lease lapses (5 s) a survivor adopts and fires them (overdue,
        marked redelivered); resumed, the paused node may fire its own copies
        once more before it sees the claim (same ``x-delayed-id``), then holds
        none.  Every message arrives at least once.
        """
        def setup():
            c2 = pika.BlockingConnection(params(self.port(1)))
            c2.channel().queue_declare("sq", durable=True)
            c2.close()
            c = pika.BlockingConnection(params(self.port(0)))
            ch = c.channel()
            ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
            ch.queue_bind("sq", "dx", "k")
            self.bindingEverywhere("dx")
            ch.confirm_delivery()
            for i in range(10):
                ch.basic_publish("dx", "k", b"s%d" % i, pika.BasicProperties(
                    delivery_mode=2, headers={"x-delay": 3000}))
            c.close()

        yield threads.deferToThread(setup)
        node = self.cluster.nodes[0]
        yield node.kill(signal.SIGSTOP)
        try:
            def adopted():
                c = pika.BlockingConnection(params(self.port(1)))
                ch = c.channel()
                out = []
                deadline = time.monotonic() + 15
                while len(out) < 10 and time.monotonic() < deadline:
                    m = ch.basic_get("sq", auto_ack=True)
                    if m[0] is None:
                        time.sleep(0.05)
                        continue
                    out.append((m[2], m[1].headers.get("x-delayed-id"), m[0].redelivered))
                c.close()
                return out

            first = yield threads.deferToThread(adopted)
        finally:
            yield node.kill(signal.SIGCONT)
        self.assertEqual(sorted(b for b, _, _ in first), sorted(b"s%d" % i for i in range(10)))
        self.assertEqual({r for _, _, r in first}, {True})

        def after():
            time.sleep(5)
            c = pika.BlockingConnection(params(self.port(1)))
            ch = c.channel()
            out = []
            while True:
                m = ch.basic_get("sq", auto_ack=True)
                if m[0] is None:
                    break
                out.append((m[2], m[1].headers.get("x-delayed-id")))
            c.close()
            return out

        again = yield threads.deferToThread(after)
        ids = {b: i for b, i, _ in first}
        # duplicates, if any, are the same messages with the same ids
        self.assertLessEqual({(b, i) for b, i in again}, set(ids.items()))

        def held():
            import base64
            import json
            import urllib.request

            req = urllib.request.Request("http://127.0.0.1:%d/api/exchanges/%%2F/dx/delayed"
                                         % self.cluster.nodes[2].managementPort)
            req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())["total_count"]

        self.assertEqual((yield threads.deferToThread(held)), 0)
