"""
The store side of replicated delayed messages (otter_tx/cluster/delayedrepl.py)
on a MemoryStore with a task.Clock: a follower's copies and the messages it
adopted survive its restart, with their held ids (the cluster itself is
tested in otter_tx/test/cluster/test_delayedrepl.py).
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.message import Message
from otter_tx.cluster import metadata as md
from otter_tx.cluster import wire
from otter_tx.cluster.delayedrepl import DelayedReplication, adoptedKey, copyKey
from otter_tx.store.memory import MemoryStore
from otter_tx.testing import journaledBroker


class FakeNode:
    """What DelayedReplication uses of a ClusterNode: one node, no links."""

    def __init__(self, broker, clock, metadata):
        self.broker = broker
        self.name = "n2"
        self.clock = clock
        self.handlers = {}
        self.links = {}
        self.nodes = {}
        self.running = True
        self.metadata = metadata
        self.writes = md.OrderedWrites(metadata, lambda events: None)

    def _later(self, seconds, f, *a):
        self.clock.callLater(seconds, f, *a)


class FakeLink:
    peer = "n1"


class StoreTests(SynchronousTestCase):

    def boot(self, store, clock, metadata):
        broker = journaledBroker(store, clock)
        vh = broker.vhosts["/"]
        if "dx" not in vh.exchanges:
            vh.declareExchange("dx", "x-delayed-message", False, True, False, False, {"x-delayed-type": "direct"})
            q = vh.declareQueue("out", None, durable=True)
            vh.bind(vh.exchanges["dx"], q, "k", {})
        node = FakeNode(broker, clock, metadata)
        repl = DelayedReplication(node)
        return broker, node, repl

    def restart(self, store, clock, metadata, broker):
        broker.stop()
        self.successResultOf(store.close())
        return self.boot(store, clock, metadata)

    def hold(self, repl, heldId, due, body):
        m = Message("dx", "k", encodeProperties({"delivery_mode": 2, "headers": {"x-delay": 5000}}), body)
        payload = wire.delayedHold("/", "dx", heldId, due, m)[5:]
        repl.frame(FakeLink(), wire.Reader(payload))

    def test_copiesAndAdoptedSurviveARestart(self):
        """
        Two copies of node 1's messages survive node 2's restart with their
        ids; adopted, they survive another restart (and nothing is fired
        twice), and fire when due with node 1's ``x-delayed-id``.
        """
        clock = Clock()
        clock.advance(1000)
        store = MemoryStore()
        metadata = md.MemoryMetadata(clock)
        broker, node, repl = self.boot(store, clock, metadata)
        self.hold(repl, "n1:1", 1000 * 1000.0 + 5000, b"one")
        self.hold(repl, "n1:2", 1000 * 1000.0 + 9000, b"two")
        self.assertEqual(len(repl.copies["n1"][("/", "dx")]), 2)
        broker, node, repl = self.restart(store, clock, metadata, broker)
        copies = repl.copies["n1"][("/", "dx")]
        self.assertEqual(sorted(copies), ["n1:1", "n1:2"])
        self.assertEqual(copies["n1:1"][1].body, b"one")
        self.successResultOf(repl._claim("n1"))
        self.assertEqual(metadata.data["delayed/n1"]["adopter"], "n2")
        self.assertEqual(len(repl.adopted[("/", "dx")].set), 2)
        self.assertNotIn("n1", repl.copies)
        broker, node, repl = self.restart(store, clock, metadata, broker)
        self.assertNotIn("n1", repl.copies)
        self.assertEqual(len(repl.adopted[("/", "dx")].set), 2)
        self.assertIn(adoptedKey("/", "dx"), repl._entities)
        self.assertNotIn(copyKey("/", "dx", "n1"), repl._entities)
        self.successResultOf(repl.start())
        q = broker.vhosts["/"].queues["out"]
        clock.advance(5)
        self.assertEqual(q.readyCount, 1)
        clock.advance(4)
        self.assertEqual(q.readyCount, 2)
        got = [q.basicGet(True) for _ in range(2)]
        self.assertEqual([(e.message.body, e.message.headers["x-delayed-id"], e.redelivered) for e in got],
                         [(b"one", "n1:1", False), (b"two", "n1:2", False)])
        # fired: gone from the store
        broker, node, repl = self.restart(store, clock, metadata, broker)
        adopted = repl.adopted.get(("/", "dx"))
        self.assertEqual(len(adopted.set) if adopted is not None else 0, 0)

    def test_claimedNodeDropsItsOwnAtStart(self):
        """A node whose claim record names an adopter drops its restored held messages at start, then marks it done."""
        clock = Clock()
        clock.advance(1000)
        store = MemoryStore()
        metadata = md.MemoryMetadata(clock)
        broker, node, repl = self.boot(store, clock, metadata)
        ex = broker.vhosts["/"].exchanges["dx"]
        m = Message("dx", "k", encodeProperties({"delivery_mode": 2, "headers": {"x-delay": 100}}), b"mine")
        self.assertTrue(ex.accept(m))
        broker, node, repl = self.restart(store, clock, metadata, broker)
        ex = broker.vhosts["/"].exchanges["dx"]
        self.assertEqual(ex.held, 1)
        metadata._put("delayed/n2", {"node": "n2", "adopter": "n3", "at": 1}, None)
        clock.advance(1)  # (due now: frozen until the claim check)
        self.assertEqual(broker.vhosts["/"].queues["out"].readyCount, 0)
        self.successResultOf(repl.start())
        self.assertEqual((ex.held, broker.vhosts["/"].queues["out"].readyCount), (0, 0))
        self.assertTrue(metadata.data["delayed/n2"]["done"])
