"""
Requeues of delivered messages, large ones a slice per reactor turn.

A requeue (``basic.nack``/``basic.reject`` with requeue, ``basic.recover``,
a channel closing with unacked deliveries) puts UNACKED entries back in their
original positions (by seq) with ``redelivered`` set.  On the way back, an
entry whose expiry passed while it was held expires now (RabbitMQ ttl.html:
requeued messages keep their expiry), and an entry returned more often than
the queue's delivery limit is dead-lettered with reason ``delivery_limit``
(RabbitMQ's ``rabbit_fifo``; docs/quorum.md).

A requeue of more than :data:`REQUEUE_SLICE` entries (a channel closing with
a million unacked messages) reinserts :data:`REQUEUE_SLICE` entries per turn,
newest first.  Each entry counts as unacked until its slice is reinserted,
then as ready (``readyCount + unackedCount`` is right at every moment).
While a requeue is pending the queue delivers nothing: dispatch resumes when
the last slice is in, so no consumer gets a later message before an earlier
requeued one; a ``basic.get`` meanwhile finishes the requeue first
(RabbitMQ's queue process also answers it only after the whole requeue).
Length limits are enforced once the requeue is complete.  Requeued entries
go back in memory (they were held there while unacked).
"""

from otter_tx.broker.expiry import nowMs
from otter_tx.broker.readystore import GONE, READY, UNACKED, markGone

#: most entries a large requeue reinserts per reactor turn (a few ms)
REQUEUE_SLICE = 16384


class Requeuer:
    """
    The requeues of one :class:`~otter_tx.broker.queue.Queue` (see the
    module docstring).

    :ivar pending: UNACKED entries of a large requeue not reinserted yet
        (list), or None when no requeue is pending; the queue delivers
        nothing while it is not None.
    :ivar feeders: feeders still handing entries over (:meth:`hold`), in
        hold order.
    """

    def __init__(self, queue):
        self._queue = queue
        self.pending = None
        self._call = None
        self.feeders = []

    def requeue(self, entries, dispatch=True):
        """
        Put UNACKED ``entries`` (list) back; up to :data:`REQUEUE_SLICE` at
        once, more that many per reactor turn.  ``dispatch``: deliver
        afterwards (a small requeue only; a sliced one always does at its end).
        """
        q = self._queue
        if q.deleted:
            for entry in entries:
                entry.state = GONE
            return
        pending = self.pending
        if pending is None and len(entries) <= REQUEUE_SLICE:
            self._reinsert(entries)
            q.limits.enforce()
            if dispatch:
                q.dispatch()
            return
        if pending is None:
            self.pending = list(entries)
        else:
            pending.extend(entries)
        if self._call is None and not q.stopped:
            self._call = q.clock.callLater(0, self._turn)

    def _turn(self):
        """Reinsert the next :data:`REQUEUE_SLICE` entries (newest first); finish or reschedule."""
        self._call = None
        pending = self.pending
        if pending is None:
            return
        q = self._queue
        if q.deleted:
            self.pending = None
            q.vhost.broker.freer.add(pending, markGone)
            return
        chunk = pending[-REQUEUE_SLICE:]
        del pending[-REQUEUE_SLICE:]
        self._reinsert(chunk)
        if pending:
            if not q.stopped:
                self._call = q.clock.callLater(0, self._turn)
            return
        if self.feeders:
            return  # more to come: release finishes
        self.pending = None
        q.limits.enforce()
        q.dispatch()

    def hold(self, feeder):
        """
        A requeue of entries not handed over yet begins (a channel feeding
        its unacked records a slice per turn): the queue delivers nothing
        until :meth:`release`.  ``feeder.finish()`` must hand over
        everything at once (called by a ``basic.get`` or a broker stop).
        """
        if self._queue.deleted:
            return
        self.feeders.append(feeder)
        if self.pending is None:
            self.pending = []

    def release(self, feeder):
        """``feeder`` handed over its last entries (see :meth:`hold`)."""
        try:
            self.feeders.remove(feeder)
        except ValueError:
            return
        if not self.feeders and self.pending is not None and not self.pending and self._call is None:
            self.pending = None
            q = self._queue
            if not q.deleted:
                q.limits.enforce()
                q.dispatch()

    def finish(self):
        """Reinsert everything still pending now (basic.get, broker stop), then enforce the limits."""
        for feeder in list(self.feeders):
            feeder.finish()
        self.feeders = []
        self._cancel()
        pending, self.pending = self.pending, None
        if pending:
            self._reinsert(pending)
        self._queue.limits.enforce()

    def discard(self):
        """The queue is deleted: forget what is pending (it goes with the queue)."""
        if self.pending is not None:
            # still UNACKED
            self._cancel()
            pending, self.pending = self.pending, None
            self._queue.vhost.broker.freer.add(pending, markGone)
        self.feeders = []

    def _cancel(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _reinsert(self, entries):
        """
        Make the UNACKED ones of ``entries`` (any order) READY again at
        their seq positions, counting the return; expired ones and those
        over the delivery limit are dead-lettered.
        """
        q = self._queue
        now = nowMs(q.clock)
        expired = []
        overLimit = []
        back = []
        limit = q.settings.deliveryLimit
        removed = q.forget
        journal = q.journal
        quorum = q.quorum
        for entry in sorted(entries, key=_bySeqDesc):
            if entry.state != UNACKED:
                continue
            q.unackedCount -= 1
            entry.returns += 1
            if entry.expiresAt is not None and entry.expiresAt <= now:
                entry.state = GONE
                removed(entry)
                expired.append(entry.message)
                continue
            if limit is not None and entry.returns > limit:
                # RabbitMQ rabbit_fifo: a return beyond the limit dead-letters
                entry.state = GONE
                removed(entry)
                overLimit.append(entry.message)
                continue
            entry.state = READY
            entry.redelivered = True
            if journal is not None and (entry.message.persistent or quorum):
                journal.requeued(q, entry)
            back.append(entry)
        q.ready.reinsert(back)
        if expired:
            q.vhost.deadLetterer.deadLetter(q, expired, "expired")
        if overLimit:
            q.vhost.deadLetterer.deadLetter(q, overLimit, "delivery_limit")


def _bySeqDesc(entry):
    return -entry.seq
