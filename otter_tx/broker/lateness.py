"""
Reaping lateness: how long after its due time an expiry was carried out.

An expired message (message TTL or per-message ``expiration``), an expired
queue (``x-expires``) and a delayed message whose delay is over are each
due at a known time on the injected clock; the timer that reaps them fires
at or after it (reactor busy, a long turn, a paused process).  Where the
reaping happens (:class:`~otter_tx.broker.expiry.ExpiryIndex` for messages
and delayed messages, the queue's lease timer for ``x-expires``) the
lateness is one subtraction and one bucket increment, per reaped item.

The broker keeps one :class:`ReapingLateness` (``Broker.reapingLateness``);
``/metrics`` exposes it as the histogram ``otter_reaping_lateness_seconds``
with a ``kind`` label (``message``, ``queue``, ``delayed``) and the
:data:`BUCKETS_MS` bounds, in seconds (otter_tx.web.metrics).
"""

from bisect import bisect_left

#: upper bounds of the buckets, in ms (1 ms to 10 s); a last bucket takes the rest (+Inf)
BUCKETS_MS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)

#: the ``kind`` label values, in exposition order
KINDS = ("message", "queue", "delayed")


class LatenessHistogram:
    """
    A cumulative-at-exposition histogram of lateness in ms.

    :ivar counts: list of ints, one per :data:`BUCKETS_MS` bound plus one
        for larger values (not cumulative: each observation counts once).
    :ivar sumMs: float, the sum of the observed lateness in ms.
    """

    __slots__ = ("counts", "sumMs")

    def __init__(self):
        self.counts = [0] * (len(BUCKETS_MS) + 1)
        self.sumMs = 0.0

    def observe(self, lateMs):
        """Count one reaping ``lateMs`` ms (float) after its due time (a negative value counts as 0)."""
        if lateMs < 0.0:
            lateMs = 0.0
        self.counts[bisect_left(BUCKETS_MS, lateMs)] += 1
        self.sumMs += lateMs

    @property
    def count(self):
        """Observations so far (int)."""
        return sum(self.counts)


class ReapingLateness:
    """
    The broker's three histograms: ``message`` (message TTL, per-message
    expiration; a paged segment counts once, for its earliest message),
    ``queue`` (``x-expires``) and ``delayed`` (x-delayed-message holds).
    """

    def __init__(self):
        self.message = LatenessHistogram()
        self.queue = LatenessHistogram()
        self.delayed = LatenessHistogram()

    def byKind(self):
        """``[(kind, LatenessHistogram)]`` in :data:`KINDS` order."""
        return [(kind, getattr(self, kind)) for kind in KINDS]
