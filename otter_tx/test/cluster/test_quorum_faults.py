"""
Replicated quorum queues under faults (issue 22): a real 3-member etcd and
three ``twistd ottermq`` processes (:class:`~otter_tx.cluster.local.LocalCluster`),
driven by pika in threads.  Nodes are killed (SIGKILL) and paused (SIGSTOP);
every wait is bounded; the randomized test prints its seed
(``OTTER_FAULT_SEED`` repeats a run).  The invariant: every message a
publisher confirm acknowledged is received at least once.
"""

import base64
import json
import os
import random
import signal
import threading
import time
import urllib.request

import pika
import pika.exceptions
from twisted.internet import defer, reactor, task, threads
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from otter_tx.test.cluster.test_processes import params, startCluster

QUORUM = {"x-queue-type": "quorum"}


def queueJSON(node, name):
    """The queue's management JSON from ``node`` (a LocalNode), or None."""
    req = urllib.request.Request("http://127.0.0.1:%d/api/queues/%%2F/%s" % (node.managementPort, name))
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except Exception:
        return None


def waitFor(predicate, seconds, step=0.05):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


def getAll(port, name, count, seconds):
    """
    basic.get (auto-ack) from queue ``name`` through the node on ``port``
    until ``count`` distinct integer bodies came or ``seconds`` passed
    (connections that fail are made again); the set of bodies.
    """
    got = set()
    deadline = time.monotonic() + seconds
    while len(got) < count and time.monotonic() < deadline:
        try:
            c = pika.BlockingConnection(params(port))
            ch = c.channel()
            while True:
                m = ch.basic_get(name, auto_ack=True)
                if m[0] is None:
                    break
                got.add(int(m[2]))
            c.close()
        except (pika.exceptions.AMQPError, OSError):
            pass
        time.sleep(0.1)
    return got


class _Load:
    """
    A confirmed publisher and an acking consumer, each in a thread, each on
    a node ``pick()`` chooses (again whenever its connection fails; a
    ``pick()`` that raises counts as a failed connection).  Also
    bench/quorum_faults.py's load.
    """

    def __init__(self, name, pickPublisher, pickConsumer, prefetch=50):
        self.name = name
        self.prefetch = prefetch
        self.pickPublisher = pickPublisher
        self.pickConsumer = pickConsumer
        self.confirmed = []
        self.nacked = 0
        self.received = []
        self.failures = []
        self.stopPublishing = threading.Event()
        self.stopConsuming = threading.Event()

    def stop(self):
        """Both threads end (a test's cleanup: a failed test must not leave them running)."""
        self.stopPublishing.set()
        self.stopConsuming.set()

    def publisher(self):
        n = 0
        while not self.stopPublishing.is_set():
            try:
                c = pika.BlockingConnection(params(self.pickPublisher()))
            except Exception as e:
                self.failures.append(repr(e))
                time.sleep(0.1)
                continue
            try:
                ch = c.channel()
                ch.confirm_delivery()
                while not self.stopPublishing.is_set():
                    n += 1
                    try:
                        ch.basic_publish("", self.name, b"%d" % n, pika.BasicProperties(delivery_mode=2))
                    except pika.exceptions.NackError:
                        self.nacked += 1
                        continue
                    self.confirmed.append(n)
            except Exception as e:  # its node went, or the channel closed
                self.failures.append(repr(e))
            finally:
                try:
                    if c.is_open:
                        c.close()
                except Exception:
                    pass

    def consumer(self):
        while not self.stopConsuming.is_set():
            try:
                c = pika.BlockingConnection(params(self.pickConsumer()))
            except Exception as e:
                self.failures.append(repr(e))
                time.sleep(0.1)
                continue
            try:
                ch = c.channel()
                ch.basic_qos(prefetch_count=self.prefetch)
                for method, _, body in ch.consume(self.name, inactivity_timeout=0.2):
                    if self.stopConsuming.is_set():
                        break
                    if method is None:
                        continue
                    self.received.append(int(body))
                    ch.basic_ack(method.delivery_tag)
            except Exception as e:
                self.failures.append(repr(e))
                time.sleep(0.1)
            finally:
                try:
                    if c.is_open:
                        c.close()
                except Exception:
                    pass


class ProcessClusterCase(TestCase):
    """
    Fault tests on a real cluster (``self.cluster``: 3 twistd nodes and
    etcd) around one replicated queue or stream named :attr:`queueName`.
    """

    timeout = 300
    queueName = "rq"

    @inlineCallbacks
    def startReplicated(self, arguments, etcdMembers=1, wait=10):
        """The cluster, and the queue declared on node 1 with all three members in sync: its JSON."""
        self.cluster = cluster = yield startCluster(self, 3, etcdMembers=etcdMembers)
        name = self.queueName

        def declare():
            c = pika.BlockingConnection(params(cluster.nodes[0].amqpPort))
            c.channel().queue_declare(name, durable=True, arguments=arguments)
            c.close()
            return waitFor(lambda: (lambda q: q and len(q.get("online", ())) == 3 and q)(
                queueJSON(cluster.nodes[0], name)), wait)

        q = yield threads.deferToThread(declare)
        self.assertTrue(q, "the followers did not join within %d s\n%s" % (
            wait, (yield threads.deferToThread(self.clusterLog))))
        self.assertEqual(sorted(q["members"]), ["otter1", "otter2", "otter3"])
        return q

    def clusterLog(self):
        """Each node's ``cluster:`` log lines and its view of the queue (printed when a wait fails)."""
        name = self.queueName
        out = []
        for n in self.cluster.nodes:
            try:
                with open(n.dataDir + ".log", "rb") as f:
                    lines = [line for line in f.read().decode("utf-8", "replace").splitlines()
                             if "cluster:" in line or "Traceback" in line or "Error" in line]
            except OSError:
                lines = []
            q = queueJSON(n, name)
            out.append("== %s: %s\n%s" % (n.name, q and {k: q.get(k) for k in ("leader", "members", "online", "state")},
                                          "\n".join(lines[-15:])))
        return "\n".join(out)

    def index(self, nodeName):
        return int(nodeName[len("otter"):]) - 1

    def leaderSeenBy(self, i, name=None):
        q = queueJSON(self.cluster.nodes[i], name or self.queueName)
        return q.get("leader") if q else None

    def seed(self, test):
        """A random seed (``OTTER_FAULT_SEED`` repeats one), printed: ``(seed, random.Random)``."""
        seed = int(os.environ.get("OTTER_FAULT_SEED") or random.SystemRandom().randrange(2 ** 32))
        print("%s.%s seed %d (OTTER_FAULT_SEED=%d repeats it)" % (type(self).__name__, test, seed, seed))
        return seed, random.Random(seed)

    @inlineCallbacks
    def drained(self, load, con):
        """
        Publishing stopped: wait (30 s at most) until the consumer ``con``
        (``load.consumer``'s thread) received every confirmed message, stop
        it; the confirmed messages it never received (sorted list).
        """
        confirmed = set(load.confirmed)
        yield threads.deferToThread(waitFor, lambda: confirmed <= set(load.received), 30)
        load.stopConsuming.set()
        yield con
        return sorted(confirmed - set(load.received))

    @inlineCallbacks
    def killLeader(self, seed, victim, wait):
        """SIGKILL node ``victim`` (the leader): the new leader's name, seen by a survivor within ``wait`` s."""
        yield self.cluster.nodes[victim].kill(signal.SIGKILL)
        survivor = (victim + 1) % 3
        newLeader = yield threads.deferToThread(
            waitFor, lambda: (lambda n: n if n and self.index(n) != victim else None)(
                self.leaderSeenBy(survivor)), wait)
        self.assertIsNotNone(newLeader, "no new leader within %d s (seed %d)\n%s" % (
            wait, seed, (yield threads.deferToThread(self.clusterLog))))
        return newLeader


class QuorumFaultTests(ProcessClusterCase):

    def startQuorum(self, etcdMembers=1):
        return self.startReplicated(QUORUM, etcdMembers)

    @inlineCallbacks
    def test_leaderKilledUnderLoad(self):
        """
        The leader's node is SIGKILLed twice (chosen at a random moment, the
        seed printed) under confirmed publishing and an acking consumer on the
        other nodes, and restarted: a follower takes over each time and every
        confirmed message is received at least once (duplicates counted).
        """
        seed, rng = self.seed("test_leaderKilledUnderLoad")
        yield self.startQuorum()
        nodes = self.cluster.nodes
        state = {"leader": 0}

        def others(k):
            return [n.amqpPort for i, n in enumerate(nodes) if i != state["leader"]][k]

        load = _Load("rq", lambda: others(0), lambda: others(1))

        self.addCleanup(load.stop)
        pub = threads.deferToThread(load.publisher)
        con = threads.deferToThread(load.consumer)
        failovers = []
        try:
            for _ in range(2):
                yield task.deferLater(reactor, rng.uniform(1.0, 2.5), lambda: None)
                victim = state["leader"]
                before = len(load.confirmed)
                killed = time.monotonic()
                newLeader = yield self.killLeader(seed, victim, 15)
                state["leader"] = self.index(newLeader)
                confirmedAgain = yield threads.deferToThread(
                    waitFor, lambda: len(load.confirmed) > before + 10, 15)
                failovers.append((victim + 1, newLeader, round(time.monotonic() - killed, 2)))
                self.assertTrue(confirmedAgain, "no confirm after the kill (seed %d)" % (seed,))
                yield nodes[victim].start()
            yield task.deferLater(reactor, 1.0, lambda: None)
        finally:
            load.stopPublishing.set()
            yield pub
        confirmed = set(load.confirmed)
        lost = yield self.drained(load, con)
        duplicates = len(load.received) - len(set(load.received))
        print("failovers (killed node, new leader, s to the next confirms): %s; %d confirmed, %d nacked, "
              "%d received, %d duplicates, %d client failures" % (
                  failovers, len(confirmed), load.nacked, len(load.received), duplicates, len(load.failures)))
        self.assertGreater(len(confirmed), 50, "too little load to mean anything (seed %d)" % (seed,))
        self.assertEqual(lost, [], "seed %d: confirmed messages lost" % (seed,))

    @inlineCallbacks
    def test_pausedLeaderFenced(self):
        """
        SIGSTOP of the leader's node: when its lease lapses a follower takes
        over and confirms resume; resumed, the old leader follows the new one
        (its queue JSON names the new leader) and nothing confirmed is lost.
        """
        yield self.startQuorum()
        nodes = self.cluster.nodes
        load = _Load("rq", lambda: nodes[1].amqpPort, lambda: nodes[2].amqpPort)
        self.addCleanup(load.stop)
        pub = threads.deferToThread(load.publisher)
        con = threads.deferToThread(load.consumer)
        try:
            yield task.deferLater(reactor, 1.0, lambda: None)
            yield nodes[0].kill(signal.SIGSTOP)
            try:
                before = len(load.confirmed)
                newLeader = yield threads.deferToThread(
                    waitFor, lambda: (lambda n: n if n and n != "otter1" else None)(self.leaderSeenBy(1)), 20)
                self.assertIsNotNone(newLeader, "no new leader within 20 s of the pause")
                resumed = yield threads.deferToThread(waitFor, lambda: len(load.confirmed) > before + 10, 15)
                self.assertTrue(resumed, "no confirms after the takeover")
            finally:
                yield nodes[0].kill(signal.SIGCONT)
            seen = yield threads.deferToThread(
                waitFor, lambda: (lambda n: n if n and n != "otter1" else None)(self.leaderSeenBy(0)), 20)
            self.assertEqual(seen, newLeader)
            yield task.deferLater(reactor, 1.0, lambda: None)
        finally:
            load.stopPublishing.set()
            yield pub
        lost = yield self.drained(load, con)
        self.assertEqual(lost, [])

    @inlineCallbacks
    def test_followerCatchesUp(self):
        """
        A follower killed, 2,000 confirmed publishes without it (two of three
        members hold them), restarted: it is in sync again within 20 s, and
        after the leader is killed the messages are all there.
        """
        yield self.startQuorum()
        nodes = self.cluster.nodes
        yield nodes[2].kill(signal.SIGKILL)

        def publish():
            c = pika.BlockingConnection(params(nodes[1].amqpPort))
            ch = c.channel()
            ch.confirm_delivery()
            for k in range(2000):
                ch.basic_publish("", "rq", b"%d" % k, pika.BasicProperties(delivery_mode=2))
            c.close()

        yield threads.deferToThread(publish)
        restarted = time.monotonic()
        yield nodes[2].start()
        q = yield threads.deferToThread(
            waitFor, lambda: (lambda q: q if q and "otter3" in q.get("online", ()) else None)(
                queueJSON(nodes[0], "rq")), 20)
        self.assertTrue(q, "the restarted follower is not in sync within 20 s")
        print("follower back in sync %.2f s after its restart" % (time.monotonic() - restarted,))
        yield nodes[0].kill(signal.SIGKILL)

        def drain():
            waitFor(lambda: (lambda n: n and n != "otter1")(self.leaderSeenBy(1)), 15)
            got = getAll(nodes[1].amqpPort, "rq", 2000, 20)
            return got

        got = yield threads.deferToThread(drain)
        self.assertEqual(len(got), 2000)

    @inlineCallbacks
    def test_noMajorityThenBack(self):
        """
        Both followers killed: a publish to the leader is not confirmed (nack
        after 10 s); one follower restarted: confirms come again once it
        joined.
        """
        yield self.startQuorum()
        nodes = self.cluster.nodes
        yield nodes[1].kill(signal.SIGKILL)
        yield nodes[2].kill(signal.SIGKILL)

        def publishOne():
            c = pika.BlockingConnection(params(nodes[0].amqpPort))
            ch = c.channel()
            ch.confirm_delivery()
            started = time.monotonic()
            try:
                ch.basic_publish("", "rq", b"x", pika.BasicProperties(delivery_mode=2))
                outcome = "confirmed"
            except pika.exceptions.NackError:
                outcome = "nacked"
            finally:
                c.close()
            return outcome, time.monotonic() - started

        outcome, took = yield threads.deferToThread(publishOne)
        self.assertEqual(outcome, "nacked")
        self.assertGreater(took, 5)
        yield nodes[1].start()
        yield threads.deferToThread(
            waitFor, lambda: (lambda q: q and "otter2" in q.get("online", ()))(queueJSON(nodes[0], "rq")), 20)
        outcome, took = yield threads.deferToThread(publishOne)
        self.assertEqual(outcome, "confirmed")

    @inlineCallbacks
    def test_etcdMemberKilled(self):
        """One of three etcd members killed: confirmed publishing and a failover go on."""
        yield self.startQuorum(etcdMembers=3)
        nodes = self.cluster.nodes
        self.cluster.etcd.kill(0)
        load = _Load("rq", lambda: nodes[1].amqpPort, lambda: nodes[2].amqpPort)
        self.addCleanup(load.stop)
        pub = threads.deferToThread(load.publisher)
        con = threads.deferToThread(load.consumer)
        try:
            yield task.deferLater(reactor, 1.0, lambda: None)
            yield nodes[0].kill(signal.SIGKILL)
            before = len(load.confirmed)
            newLeader = yield threads.deferToThread(
                waitFor, lambda: (lambda n: n if n and n != "otter1" else None)(self.leaderSeenBy(1)), 15)
            self.assertIsNotNone(newLeader)
            resumed = yield threads.deferToThread(waitFor, lambda: len(load.confirmed) > before + 10, 15)
            self.assertTrue(resumed)
        finally:
            load.stopPublishing.set()
            yield pub
        lost = yield self.drained(load, con)
        self.assertEqual(lost, [])

    @inlineCallbacks
    def test_everyNodeDownLeaderNeverBack(self):
        """
        Every node SIGKILLed at once (a power cut), and the leader's node never
        comes back: the two followers start again, one takes the queue over
        from what its store kept, and every confirmed message is there.
        """
        yield self.startQuorum()
        nodes = self.cluster.nodes

        def publish():
            c = pika.BlockingConnection(params(nodes[0].amqpPort))
            ch = c.channel()
            ch.confirm_delivery()
            for k in range(500):
                ch.basic_publish("", "rq", b"%d" % k, pika.BasicProperties(delivery_mode=2))
            c.close()

        yield threads.deferToThread(publish)
        # (the signals go out together: a follower may or may not take over in between; both
        # ways, the queue must be there after the restart)
        yield defer.gatherResults([n.kill(signal.SIGKILL) for n in nodes])
        yield nodes[1].start()
        yield nodes[2].start()

        def drain():
            leader = waitFor(lambda: (lambda n: n if n and n != "otter1" else None)(self.leaderSeenBy(1)), 20)
            got = getAll(nodes[1].amqpPort, "rq", 500, 20) if leader else set()
            return leader, got

        leader, got = yield threads.deferToThread(drain)
        self.assertIsNotNone(leader, "no follower took over\n%s" % ((yield threads.deferToThread(self.clusterLog)),))
        self.assertEqual(len(got), 500)
