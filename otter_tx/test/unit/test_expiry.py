"""
Tests for otter_tx.broker.expiry.ExpiryIndex on a task.Clock.
"""

import random

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.broker.expiry import ExpiryIndex


class ExpiryIndexTests(SynchronousTestCase):
    """One timer drives many deadlines."""

    def setUp(self):
        self.clock = Clock()
        self.expired = []
        self.index = ExpiryIndex(self.clock, lambda keys: self.expired.append((self.clock.seconds(), keys)))

    def test_singleTimer(self):
        """Thousands of keys use one DelayedCall."""
        for i in range(5000):
            self.index.add(i, 1000 + i)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_firesAtDeadline(self):
        """A key expires exactly at its deadline, not before."""
        self.index.add("a", 500)
        self.clock.advance(0.499)
        self.assertEqual(self.expired, [])
        self.clock.advance(0.001)
        self.assertEqual(self.expired, [(0.5, ["a"])])

    def test_earlierKeyReschedules(self):
        """Adding an earlier deadline moves the timer forward."""
        self.index.add("late", 10000)
        self.index.add("early", 100)
        self.clock.advance(0.1)
        self.assertEqual(self.expired, [(0.1, ["early"])])
        self.assertEqual(len(self.index), 1)

    def test_removeCancels(self):
        """A removed key never expires and an empty index holds no timer."""
        self.index.add("a", 100)
        self.index.remove("a")
        self.clock.advance(1)
        self.assertEqual(self.expired, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_removedHeadDoesNotDelayOthers(self):
        """Removing the earliest key leaves later keys on time."""
        self.index.add("a", 100)
        self.index.add("b", 200)
        self.index.remove("a")
        self.clock.advance(0.2)
        self.assertEqual(self.expired, [(0.2, ["b"])])

    def test_manyRandomOnTime(self):
        """Random deadlines all fire on time, in order, each once."""
        rnd = random.Random(7)
        deadlines = {i: rnd.randint(1, 5000) for i in range(20000)}
        for k, d in deadlines.items():
            self.index.add(k, d)
        for _ in range(5000):
            self.clock.advance(0.001)
        seen = {}
        for t, keys in self.expired:
            for k in keys:
                self.assertNotIn(k, seen)
                seen[k] = t
        self.assertEqual(len(seen), len(deadlines))
        for k, t in seen.items():
            self.assertAlmostEqual(t * 1000, deadlines[k], delta=1e-6)
