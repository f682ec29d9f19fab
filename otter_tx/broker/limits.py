"""
Queue length limits: ``x-max-length`` and ``x-max-length-bytes`` with every
``x-overflow`` behaviour (https://www.rabbitmq.com/docs/maxlength).

- ``drop-head`` (the default): head messages beyond the limit leave the
  queue, dead-lettered with reason ``maxlen``.
- ``reject-publish`` / ``reject-publish-dlx``: a classic queue refuses the
  message that would go over the limit (the publisher gets basic.nack with
  confirms on); ``-dlx`` dead-letters the refused message too.
- A quorum queue's ``reject-publish`` (RabbitMQ 3.10's ``rabbit_fifo``) is a
  soft limit: the queue accepts the message that crosses the limit, then
  refuses every publish until at most 80 % of the limit is left.

A limit lowered far below the depth (a policy's ``max-length``): the counts
respect the new limit at once, as in RabbitMQ; the head messages beyond it
are taken out at once (whole paged segments without reading them,
:meth:`IReadyStore.detachHead
<otter_tx.broker.interfaces.IReadyStore.detachHead>`), and removing them from
the store and dead-lettering them goes on :data:`DROP_SLICE` messages per
reactor turn.

Hot path: :class:`~otter_tx.broker.queue.Queue` calls in here only when the
queue has a limit (its enqueue tests the settings first).
"""

from collections import deque

from otter_tx.broker.readystore import GONE, READY

#: most messages dropped by a length limit that are dead-lettered (and
#: removed from the store) per reactor turn; dead-lettering costs tens of
#: microseconds a message
DROP_SLICE = 256
#: the part of a quorum queue's limit it must be back under before it accepts publishes again
QUORUM_RESUME = 0.8


class LengthLimits:
    """
    The length limits of one :class:`~otter_tx.broker.queue.Queue` (its
    ``settings``: ``maxLength`` messages, ``maxLengthBytes`` body bytes,
    ``overflow``), enforced on its ready messages.

    :ivar rejecting: a quorum queue over its ``reject-publish`` limit
        refuses publishes (bool).
    """

    def __init__(self, queue):
        self._queue = queue
        self.rejecting = False
        #: dropped by a limit, still to dead-letter: deque of [segmentRef, entries, start]
        self._dropPending = None
        self._dropCall = None

    @property
    def dropping(self):
        """True while dropped messages are still being dead-lettered a slice per turn."""
        return self._dropPending is not None

    def refuses(self, size):
        """
        True when a new message of ``size`` body bytes is refused by a
        ``reject-publish`` limit: a classic queue refuses the message that
        would go over the limit; a quorum queue refuses everything while
        :attr:`rejecting`, until it is back under 80 % of the limit.
        """
        q = self._queue
        s = q.settings
        ready = q.ready
        if q.quorum:
            if self.rejecting:
                if ((s.maxLength is not None and ready.readyCount > int(s.maxLength * QUORUM_RESUME))
                        or (s.maxLengthBytes is not None
                            and ready.readyBytes > int(s.maxLengthBytes * QUORUM_RESUME))):
                    return True
                self.rejecting = False
            return False
        return ((s.maxLength is not None and ready.readyCount + 1 > s.maxLength)
                or (s.maxLengthBytes is not None and ready.readyBytes + size > s.maxLengthBytes))

    def enforce(self):
        """
        Drop head messages while over ``x-max-length`` / ``-bytes``
        (drop-head), dead-lettered with reason ``maxlen``.  Up to
        :data:`DROP_SLICE` at once; beyond, the rest is taken out at once
        and dead-lettered a slice per turn.  Waits while a requeue is
        pending (it runs when the requeue is complete).  A quorum queue's
        ``reject-publish`` limit drops nothing: it sets :attr:`rejecting`.
        """
        q = self._queue
        s = q.settings
        maxLen, maxBytes = s.maxLength, s.maxLengthBytes
        if (maxLen is None and maxBytes is None) or q.requeuer.pending is not None:
            return
        ready = q.ready
        if q.quorum and s.overflow == "reject-publish":
            if ((maxLen is not None and ready.readyCount > maxLen)
                    or (maxBytes is not None and ready.readyBytes > maxBytes)):
                self.rejecting = True
            return
        dropped = []
        while ready.readyCount and (
            (maxLen is not None and ready.readyCount > maxLen)
            or (maxBytes is not None and ready.readyBytes > maxBytes)
        ):
            if len(dropped) >= DROP_SLICE:
                self._dropBulk(dropped)
                return
            entry = ready.popHead()
            if entry is None:
                break
            dropped.append(entry)
        if dropped:
            if self._dropPending is not None:
                # keep the dead-letter order behind a bulk drop in progress
                self._dropPending.append([None, dropped, 0])
                return
            for entry in dropped:
                entry.state = GONE
                q.forget(entry)
            q.vhost.deadLetterer.deadLetter(q, [e.message for e in dropped], "maxlen")

    def _dropBulk(self, dropped):
        """
        The rest of a big drop: ``dropped`` (entries already taken) and the
        head beyond the limit, taken out now, are removed from the store
        and dead-lettered :data:`DROP_SLICE` messages per turn
        (:meth:`_dropTurn`).
        """
        q = self._queue
        s = q.settings
        work = self._dropPending
        if work is None:
            work = self._dropPending = deque()
        work.append([None, dropped, 0])
        q.ready.detachHead(s.maxLength, s.maxLengthBytes, work)
        if self._dropCall is None and not q.stopped:
            self._dropCall = q.clock.callLater(0, self._dropTurn)

    def _dropTurn(self, limit=None):
        """
        Dead-letter (and forget in the store) up to ``limit`` dropped
        messages (default :data:`DROP_SLICE`); reschedule if more.
        """
        if limit is None:
            limit = DROP_SLICE
        self._dropCall = None
        q = self._queue
        work = self._dropPending
        messages = []
        removed = q.forget if not q.deleted else None
        while work and len(messages) < limit:
            item = work[0]
            if item[0] is not None:
                item[1] = q.ready.readDetached(item[0])
                item[0] = None
            entries, start = item[1], item[2]
            if isinstance(entries, deque):
                # a detached level: popleft (indexing a deque is O(n))
                n = min(len(entries), limit - len(messages))
                pop = entries.popleft
                batch = [pop() for _ in range(n)]
                start = 0
            else:
                batch = entries
                n = min(len(entries), start + limit - len(messages)) - start
            for i in range(start, start + n):
                entry = batch[i]
                if entry.state != READY:
                    continue  # a hole of a detached deque
                entry.state = GONE
                if removed is not None:
                    removed(entry)
                messages.append(entry.message)
            if isinstance(entries, deque):
                if not entries:
                    work.popleft()
            elif start + n == len(entries):
                work.popleft()
            else:
                item[2] = start + n
        if work:
            if not q.stopped:
                self._dropCall = q.clock.callLater(0, self._dropTurn)
        else:
            self._dropPending = None
        if messages:
            q.vhost.deadLetterer.deadLetter(q, messages, "maxlen")

    def finish(self):
        """Dead-letter everything still pending now (broker stop)."""
        if self._dropPending is not None:
            if self._dropCall is not None and self._dropCall.active():
                self._dropCall.cancel()
            self._dropTurn(limit=float("inf"))
