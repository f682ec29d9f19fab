"""
An expiry index: many deadlines, one timer.

Each queue keeps one :class:`ExpiryIndex` of its ready messages' expiry
deadlines.  The index is a binary heap (``heapq``) of ``(deadline, seq,
key)`` with lazy deletion, plus a dict of the live keys, and it keeps exactly
one ``IDelayedCall`` on the injected clock, set for the earliest live
deadline.  Adding or removing a key is O(log n) amortised; 1,000,000 keys
cost one DelayedCall, not 1,000,000.

This is how otter_tx reaps expired messages wherever they sit in a queue,
not only at the head as RabbitMQ classic queues do
(https://www.rabbitmq.com/docs/ttl, "Caveats").

Time base: deadlines are milliseconds on the clock's time base, that is
``clock.seconds() * 1000``.
"""

import heapq
from bisect import bisect_left
from itertools import count

from otter_tx.broker.lateness import BUCKETS_MS

#: tolerance for float rounding between a deadline and the clock, in ms
_EPSILON_MS = 1e-3


def nowMs(clock):
    """
    The clock's current time in milliseconds (float).
    """
    return clock.seconds() * 1000.0


class OneTimer:
    """
    One ``IDelayedCall`` on ``self._clock`` for the earliest deadline of a
    set (:class:`ExpiryIndex`, :class:`otter_tx.broker.delayed.HeldSet`):
    ``_schedule(deadline)`` sets or moves it (ms on the clock's time base),
    ``_cancel()`` drops it, :meth:`freeze` stops it for good.  Subclasses set
    ``_clock`` and define ``_fire()``, called when it goes off.
    """

    _timer = None
    _timerAt = None
    _frozen = False

    def _cancel(self):
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
            self._timerAt = None

    def freeze(self):
        """Cancel the timer and never set one again (broker shutdown)."""
        self._frozen = True
        self._cancel()

    def _schedule(self, deadline):
        if self._frozen:
            return
        now = nowMs(self._clock)
        delay = max(0.0, (deadline - now - _EPSILON_MS / 2) / 1000.0)
        if self._timer is not None and self._timer.active():
            self._timer.reset(delay)
        else:
            self._timer = self._clock.callLater(delay, self._fire)
        self._timerAt = deadline


class ExpiryIndex(OneTimer):
    """
    Deadlines for hashable keys with one timer.

    :param clock: an ``IReactorTime`` (a ``task.Clock`` in tests).
    :param onExpire: called as ``onExpire(keys)`` with the list of keys whose
        deadline has passed, in deadline order; each key is removed from the
        index before the call.
    :param lateness: a :class:`~otter_tx.broker.lateness.LatenessHistogram`
        that observes, per expired key, how many ms after its deadline it was
        reaped; None to measure nothing.
    """

    def __init__(self, clock, onExpire, lateness=None):
        self._clock = clock
        self._onExpire = onExpire
        self._lateness = lateness
        self._heap = []
        self._live = {}
        self._seq = count()
        self._timer = None
        self._timerAt = None

    def __len__(self):
        return len(self._live)

    def __contains__(self, key):
        return key in self._live

    def deadline(self, key):
        """
        The deadline of ``key`` in ms, or ``None``.
        """
        return self._live.get(key)

    def add(self, key, deadline):
        """
        Add (or move) ``key`` with ``deadline`` in ms on the clock's time base.
        """
        self._live[key] = deadline
        heapq.heappush(self._heap, (deadline, next(self._seq), key))
        if self._timerAt is None or deadline < self._timerAt:
            self._schedule(deadline)

    def remove(self, key):
        """
        Forget ``key`` (no error if absent).  The heap slot is dropped lazily.
        """
        if self._live.pop(key, None) is not None:
            heap = self._heap
            if len(heap) > 1024 and len(heap) > 3 * len(self._live):
                self._compact()

    def clear(self):
        """
        Forget every key and cancel the timer.
        """
        self._live.clear()
        self._heap = []
        self._cancel()

    def _compact(self):
        live = self._live
        self._heap = [item for item in self._heap if live.get(item[2]) == item[0]]
        heapq.heapify(self._heap)

    def _fire(self):
        self._timer = None
        self._timerAt = None
        self.reap()

    def reap(self):
        """
        Expire every key whose deadline has passed now; re-arm the timer.
        Returns the number of keys expired.
        """
        exact = nowMs(self._clock)
        now = exact + _EPSILON_MS
        heap = self._heap
        live = self._live
        due = []
        heappop = heapq.heappop
        lateness = self._lateness
        if lateness is None:
            while heap and heap[0][0] <= now:
                deadline, _, key = heappop(heap)
                if live.get(key) == deadline:
                    del live[key]
                    due.append(key)
        else:
            # per key: one subtraction and one bucket increment (LatenessHistogram.observe, inlined)
            counts, lateSum = lateness.counts, 0.0
            while heap and heap[0][0] <= now:
                deadline, _, key = heappop(heap)
                if live.get(key) == deadline:
                    del live[key]
                    due.append(key)
                    late = exact - deadline
                    if late <= 1.0:
                        counts[0] += 1  # on time, the common case: no bucket search
                    else:
                        counts[bisect_left(BUCKETS_MS, late)] += 1
                    lateSum += late
            # a key reaped a hair before its deadline (within _EPSILON_MS) adds a tiny negative
            lateness.sumMs = max(0.0, lateness.sumMs + lateSum)
        # drop stale tops so the timer is set for a live deadline
        while heap and live.get(heap[0][2]) != heap[0][0]:
            heappop(heap)
        if heap:
            if self._timerAt is None or heap[0][0] < self._timerAt:
                self._schedule(heap[0][0])
        else:
            self._cancel()
        if due:
            self._onExpire(due)
        return len(due)
