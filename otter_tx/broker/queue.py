"""
Classic queues: ready messages, consumers, prefetch-aware dispatch, message
TTL with prompt reaping, length limits and queue expiry.

Semantics follow RabbitMQ 3.10 classic queues (https://www.rabbitmq.com/docs/
ttl, /dlx, /maxlength, /priority, /consumer-priority, /consumers#single-active-
consumer) except where otter_tx is deliberately better: an expired message is
reaped wherever it sits (one :class:`~otter_tx.broker.expiry.ExpiryIndex` per
queue), so counts never include expired messages.

All times are milliseconds on the injected clock (``clock.seconds() * 1000``).

Beyond the broker's per-queue memory budget, ready messages are paged to
segment files (:mod:`otter_tx.broker.paging`) per priority level and paged
back in order; ``readyCount`` and ``readyBytes`` include paged messages,
``pagedCount`` and ``pagedBytes`` count those alone.

Dispatch is bounded per reactor turn (:data:`DISPATCH_MESSAGES` messages or
:data:`DISPATCH_BYTES` body bytes per call, then it continues on a later
turn through the clock), so one deep queue with an eager consumer cannot
hold the reactor; purge and delete answer at once and free the dropped
messages a slice per turn (``Broker.freer``).

Two more operations are bounded per turn the same way:

* A requeue of more than :data:`REQUEUE_SLICE` entries (a channel closing
  with a million unacked messages, ``basic.recover``, ``basic.nack``
  multiple) reinserts :data:`REQUEUE_SLICE` entries per turn, newest
  first.  Each entry counts as unacked until its slice is reinserted, then
  as ready (``readyCount + unackedCount`` is right at every moment).  While
  a requeue is pending the queue delivers nothing: dispatch resumes when
  the last slice is in, so no consumer gets a later message before an
  earlier requeued one; a ``basic.get`` meanwhile finishes the requeue
  first (RabbitMQ's queue process also answers it only after the whole
  requeue).  Length limits are enforced once the requeue is complete.
  Requeued entries go back in memory (they were held there while unacked).
* A length limit lowered far below the depth (a policy's ``max-length``):
  the counts respect the new limit at once, as in RabbitMQ; the head
  messages beyond it are taken out at once (whole paged segments without
  reading them), and removing them from the store and dead-lettering them
  (reason ``maxlen``) goes on :data:`DROP_SLICE` messages per turn.
"""

import heapq
from collections import deque
from itertools import groupby
from operator import itemgetter

from zope.interface import implementer

from otter_tx.amqp.codec import TaggedInt
from otter_tx.broker.arguments import QUORUM, queueType
from otter_tx.broker.deadletter import DLX_RETRY_MS
from otter_tx.broker.expiry import _EPSILON_MS, ExpiryIndex, nowMs
from otter_tx.broker.interfaces import IQueue
from otter_tx.broker.paging import ENTRY_OVERHEAD, Pager, dropSegmentFile

#: most messages one dispatch call hands out before yielding the reactor
DISPATCH_MESSAGES = 256
#: most body bytes one dispatch call hands out before yielding the reactor
DISPATCH_BYTES = 1024 * 1024
#: a paging queue looks whether a segment fits back in memory every this many messages taken
REFILL_EVERY = 64
#: most entries a large requeue reinserts per reactor turn (a few ms)
REQUEUE_SLICE = 16384
#: most messages dropped by a length limit that are dead-lettered (and
#: removed from the store) per reactor turn; dead-lettering costs tens of
#: microseconds a message
DROP_SLICE = 256

READY = 0
UNACKED = 1
GONE = 2


class QueueEntry:
    """
    A message's place in one queue.

    :ivar message: the :class:`~otter_tx.broker.message.Message`.
    :ivar seq: enqueue order within the queue (int).
    :ivar expiresAt: absolute expiry in ms, or ``None``.
    :ivar redelivered: True once delivered and requeued.
    :ivar state: READY, UNACKED or GONE.
    :ivar returns: how many times it came back unsettled (nack/reject with
        requeue, recover, its channel closing): the quorum queue's delivery
        count, ``x-delivery-count`` (int).
    """

    __slots__ = ("message", "seq", "expiresAt", "redelivered", "state", "level", "deliveredAt",
                 "returns")

    def __init__(self, message, seq, expiresAt, level):
        self.message = message
        self.seq = seq
        self.expiresAt = expiresAt
        self.redelivered = False
        self.state = READY
        self.level = level
        self.deliveredAt = None
        self.returns = 0


class QueueSettings:
    """
    The effective limits of a queue, from its arguments and policy.

    :ivar messageTtl: ms or None.  :ivar expires: ms or None.
    :ivar dlx: dead-letter exchange name or None.  :ivar dlrk: routing key or None.
    :ivar maxLength: messages or None.  :ivar maxLengthBytes: body bytes or None.
    :ivar overflow: ``drop-head``, ``reject-publish`` or ``reject-publish-dlx``.
    :ivar deliveryLimit: returns allowed before a message is dead-lettered
        with reason ``delivery_limit`` (``x-delivery-limit`` / the
        ``delivery-limit`` policy; int) or None for no limit.
    :ivar dlStrategy: ``x-dead-letter-strategy`` in effect (quorum queues):
        ``at-most-once`` or ``at-least-once``.
    """

    __slots__ = ("messageTtl", "expires", "dlx", "dlrk", "maxLength", "maxLengthBytes", "overflow",
                 "deliveryLimit", "dlStrategy")

    def __init__(self):
        self.messageTtl = None
        self.expires = None
        self.dlx = None
        self.dlrk = None
        self.maxLength = None
        self.maxLengthBytes = None
        self.overflow = "drop-head"
        self.deliveryLimit = None
        self.dlStrategy = "at-most-once"


@implementer(IQueue)
class Queue:
    """
    One classic or quorum queue in a vhost (docs/quorum.md: a quorum queue
    is this queue with RabbitMQ 3.10's quorum rules: delivery count and
    limit, soft ``reject-publish``, no priorities).

    :param vhost: the owning :class:`~otter_tx.broker.vhost.VHost`.
    :param name: str.  :param durable: bool.  :param autoDelete: bool.
    :param owner: the exclusive owner connection or ``None``.
    :param arguments: the declare arguments (dict), already validated.
    """

    def __init__(self, vhost, name, durable, autoDelete, owner, arguments):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.autoDelete = autoDelete
        self.owner = owner
        self.exclusive = owner is not None
        self.arguments = arguments
        self.clock = vhost.clock
        self.maxPriority = arguments.get("x-max-priority")
        levels = (self.maxPriority or 0) + 1 if self.maxPriority else 1
        self._levels = [deque() for _ in range(levels)]
        self.singleActive = bool(arguments.get("x-single-active-consumer"))
        #: ``"quorum"`` or ``"classic"`` (``x-queue-type``)
        self.queueType = queueType(arguments)
        self.quorum = self.queueType == QUORUM
        self.readyCount = 0
        self.readyBytes = 0
        self.unackedCount = 0
        self._holes = 0
        self._seq = 0
        self.consumers = []
        self.deleted = False
        self.exclusiveConsumer = None
        self.bindings = {}  # (exchange, routingKey, argsKey) -> arguments, for cleanup
        self.settings = QueueSettings()
        self.policy = None
        #: the matching OperatorPolicy, and the merged definition in effect (vhost._applyPolicy)
        self.operatorPolicy = None
        self.effectiveDefinition = {}
        self._expiry = ExpiryIndex(self.clock, self._expired, vhost.broker.reapingLateness.message)
        #: the durability journal for a durable queue (set by the journal), else None
        self.journal = None
        #: the journal's key for this queue (``Journal.queueKey``), once computed
        self.journalKey = None
        self._idleTimer = None
        self._stopped = False
        self._dispatching = False
        self._dispatchCall = None
        broker = vhost.broker
        #: memory budget for ready messages in bytes (bodies + ENTRY_OVERHEAD each)
        self.memoryBudget = broker.queueMemoryBudget
        self._pagers = None  # one Pager per priority level once paging starts
        self._pageExpiry = None  # ExpiryIndex of paged segments by earliest expiry
        self._refillTick = 0
        #: ready messages (and their body bytes) paged out to disk
        self.pagedCount = 0
        self.pagedBytes = 0
        #: UNACKED entries of a large requeue not reinserted yet (list), or None
        self._requeuePending = None
        self._requeueCall = None
        #: feeders still handing entries to a requeue (holdRequeue), in hold order
        self._requeueFeeders = []
        #: dropped by a length limit, still to dead-letter: entries and paged segments
        self._dropPending = None
        self._dropCall = None
        #: at-least-once dead letters no queue took yet: (Message, reason) in
        #: order, their body bytes, and the retry timer (holdDeadLetters)
        self.dlxHeld = None
        self.dlxHeldBytes = 0
        self._dlxRetry = None
        #: a quorum queue over its reject-publish limit refuses publishes (_overLimit)
        self._rejecting = False
        # counters (management / metrics; message rates, otter_tx.broker.stats)
        self.publishedCount = 0
        #: every delivery, consume or get (deliver_get)
        self.deliveredCount = 0
        #: of those, no-ack ones (consume or get), and the gets by mode
        self.noAckCount = 0
        self.getCount = 0
        self.getNoAckCount = 0
        self.getEmptyCount = 0
        self.ackCount = 0
        self.redeliverCount = 0
        #: messages that left by dead-letter reason (str -> int), whatever became of
        #: them, and of those the ones republished to a dead-letter exchange
        self.leftBy = {}
        self.deadLetteredBy = {}

    def __repr__(self):
        return "<Queue %r in %r>" % (self.name, self.vhost.name)

    # --- settings ---------------------------------------------------------

    def applySettings(self, settings, policy=None):
        """
        Install effective :class:`QueueSettings` (from arguments and policy);
        re-arms the idle timer and enforces a lowered length limit at once
        (RabbitMQ ``init_max_length``).
        """
        old = self.settings
        self.settings = settings
        self.policy = policy
        if old.expires != settings.expires or self._idleTimer is None:
            # re-arm the lease only when the expiry changed (RabbitMQ
            # re-inits the timer on a policy change of that key)
            self.touch()
        self._enforceLimits()

    # --- queue expiry (x-expires) ------------------------------------------

    def touch(self):
        """
        Renew the ``x-expires`` lease: declare, passive declare and
        basic.get count as use; publishing does not (RabbitMQ ttl.html
        "Queue TTL").
        """
        if self._stopped:
            return
        expires = self.settings.expires
        if self._idleTimer is not None and self._idleTimer.active():
            self._idleTimer.cancel()
        self._idleTimer = None
        if expires is not None and not self.consumers and not self.deleted:
            self._idleTimer = self.clock.callLater(expires / 1000.0, self._idleExpired)

    def _idleExpired(self):
        timer, self._idleTimer = self._idleTimer, None
        if not self.consumers and not self.deleted:
            self.vhost.broker.reapingLateness.queue.observe((self.clock.seconds() - timer.getTime()) * 1000.0)
            self.vhost.deleteQueue(self, reason="expired")

    def leaseDeadline(self):
        """
        When the ``x-expires`` lease runs out (epoch ms on the clock), or
        None: no ``x-expires``, or the queue is in use (has consumers) so
        the lease is not running.  Read-only (management's ``/expiry``).
        """
        timer = self._idleTimer
        return timer.getTime() * 1000.0 if timer is not None and timer.active() else None

    # --- counts -----------------------------------------------------------

    @property
    def consumerCount(self):
        """Consumers (int)."""
        return len(self.consumers)

    # --- enqueue ----------------------------------------------------------

    def enqueue(self, message, now=None, redelivered=False):
        """
        Offer ``message`` to this queue (basic.publish routed here).

        ``redelivered``: the message may have been delivered before (a
        delayed exchange firing again what it may have fired before an
        unclean stop, :meth:`DelayedExchange.restore
        <otter_tx.broker.delayed.DelayedExchange.restore>`): its entry is
        marked redelivered, as :meth:`restore` marks one.

        Returns True if accepted, False if refused by ``reject-publish`` /
        ``reject-publish-dlx`` overflow (the publisher gets basic.nack when
        confirms are on; https://www.rabbitmq.com/docs/maxlength).
        """
        s = self.settings
        if now is None:
            now = nowMs(self.clock)
        if s.overflow != "drop-head" and self._overLimit(s, message.size):
            if s.overflow == "reject-publish-dlx":
                self.vhost.deadLetterer.deadLetter(self, [message], "maxlen")
            return False
        ttl = message.ttl
        qttl = s.messageTtl
        if qttl is not None and (ttl is None or qttl < ttl):
            ttl = qttl
        self._seq += 1
        level = 0
        if self.maxPriority:
            level = min(message.priority, self.maxPriority)
        entry = QueueEntry(message, self._seq, None if ttl is None else now + ttl, level)
        if redelivered:
            entry.redelivered = True
            entry.returns = 1
        self.publishedCount += 1
        # a quorum queue stores every message, as RabbitMQ's Raft log does
        journal = self.journal if (message.persistent or self.quorum) else None
        if not self.readyCount and self.consumers and self._requeuePending is None:
            consumer = self._pickConsumer()
            if consumer is not None:
                if journal is not None and not consumer.noAck:
                    journal.enqueued(self, entry)
                self._deliver(consumer, entry)
                return True
        if ttl is not None and ttl <= 0:
            # TTL 0: deliverable only to a consumer that can take it at once
            self.vhost.deadLetterer.deadLetter(self, [message], "expired")
            return True
        if (
            self.pagedCount
            or self.readyBytes + (self.readyCount + 1) * ENTRY_OVERHEAD + message.size > self.memoryBudget
        ) and self._shouldPage(level, message.size):
            self._page(entry)
        else:
            self._levels[level].append(entry)
            if ttl is not None:
                self._expiry.add(entry, entry.expiresAt)
        self.readyCount += 1
        self.readyBytes += message.size
        if journal is not None:
            journal.enqueued(self, entry)
        if s.maxLength is not None or s.maxLengthBytes is not None:
            self._enforceLimits()
        return True

    def _overLimit(self, s, size):
        """
        True when a new message of ``size`` bytes is refused by a
        ``reject-publish`` limit: a classic queue refuses the message that
        would go over the limit.  A quorum queue (RabbitMQ 3.10's
        ``rabbit_fifo``) accepts the message that crosses it, then refuses
        every publish until at most 80 % of the limit is left
        (``_rejecting``, set by :meth:`_enforceLimits`).
        """
        if self.quorum:
            if self._rejecting:
                if ((s.maxLength is not None and self.readyCount > int(s.maxLength * 0.8))
                        or (s.maxLengthBytes is not None and self.readyBytes > int(s.maxLengthBytes * 0.8))):
                    return True
                self._rejecting = False
            return False
        return ((s.maxLength is not None and self.readyCount + 1 > s.maxLength)
                or (s.maxLengthBytes is not None and self.readyBytes + size > s.maxLengthBytes))

    def deliveredMessage(self, entry, get=False):
        """
        The message to send for ``entry``: its own, or a copy carrying
        ``x-delivery-count`` (the entry's returns) when this queue counts
        deliveries: a quorum queue, or a classic one with a delivery limit.
        As RabbitMQ 3.10 does, a quorum queue's consumer deliveries carry
        the header from the first return on, its ``basic.get`` answers
        always (0 the first time).  The caller checks ``entry.returns`` (or
        ``get``) first, so a plain delivery costs one attribute test.
        """
        m = entry.message
        if not (self.quorum or self.settings.deliveryLimit is not None):
            return m
        if not (entry.returns or (get and self.quorum)):
            return m
        headers = dict(m.headers or {})
        headers["x-delivery-count"] = TaggedInt(entry.returns, "l")
        return m.withHeaders(headers)

    def holdDeadLetters(self, messages, reason):
        """
        Keep ``messages`` (list of Message) dead-lettered for ``reason``
        that no queue took (at-least-once, see
        :meth:`DeadLetterer._atLeastOnce
        <otter_tx.broker.deadletter.DeadLetterer._atLeastOnce>`) and try
        them again in :data:`~otter_tx.broker.deadletter.DLX_RETRY_MS`.
        They are not ready messages: RabbitMQ counts them as
        ``messages_dlx`` / ``message_bytes_dlx``.  Held in memory only.
        """
        if self.deleted:
            return
        held = self.dlxHeld
        if held is None:
            held = self.dlxHeld = []
        for m in messages:
            held.append((m, reason))
            self.dlxHeldBytes += m.size
        if self._dlxRetry is None and not self._stopped:
            self._dlxRetry = self.clock.callLater(DLX_RETRY_MS / 1000.0, self._retryDeadLetters)

    def _retryDeadLetters(self):
        """Dead-letter the held messages again, in order, a run of one reason at a time."""
        self._dlxRetry = None
        held, self.dlxHeld = self.dlxHeld or [], None
        self.dlxHeldBytes = 0
        for reason, run in groupby(held, key=itemgetter(1)):
            self.vhost.deadLetterer.deadLetter(self, [m for m, _ in run], reason, retry=True)

    def _dropDeadLetters(self):
        """Forget the held dead letters and their timer (delete, stop)."""
        if self._dlxRetry is not None and self._dlxRetry.active():
            self._dlxRetry.cancel()
        self._dlxRetry = None

    # --- paging -------------------------------------------------------------

    def _memoryCost(self):
        """Bytes the in-memory ready messages cost, as the budget counts them."""
        return (self.readyBytes - self.pagedBytes) + (self.readyCount - self.pagedCount) * ENTRY_OVERHEAD

    def _shouldPage(self, level, size):
        """
        True when a new ready message of ``level`` must be paged: its level
        already pages (order), or memory is over budget and the level has
        something in memory to deliver first.
        """
        pagers = self._pagers
        if pagers is not None and pagers[level]:
            return True
        return (self._memoryCost() + ENTRY_OVERHEAD + size > self.memoryBudget
                and bool(self._levels[level]))

    def _page(self, entry):
        """Put READY ``entry`` at the tail of its level's pager (counts are the caller's)."""
        pagers = self._pagers
        if pagers is None:
            pagers = self._pagers = [None] * len(self._levels)
        p = pagers[entry.level]
        if p is None:
            p = pagers[entry.level] = Pager(self.vhost.broker.paging, entry.level)
        seg = p.append(entry)
        self.pagedCount += 1
        self.pagedBytes += entry.message.size
        if entry.expiresAt is not None and seg.minExpiresAt == entry.expiresAt:
            if self._pageExpiry is None:
                self._pageExpiry = ExpiryIndex(self.clock, self._pagedExpired,
                                               self.vhost.broker.reapingLateness.message)
                if self._stopped:
                    self._pageExpiry.freeze()
            self._pageExpiry.add(seg, seg.minExpiresAt)

    def _makeEntry(self, message, seq, expiresAt, redelivered):
        level = min(message.priority, self.maxPriority) if self.maxPriority else 0
        entry = QueueEntry(message, seq, expiresAt, level)
        entry.redelivered = redelivered
        entry.returns = 1 if redelivered else 0
        return entry

    def _pageIn(self, level, force):
        """
        Move the oldest segment of ``level``'s pager back into memory if it
        fits the budget, or anyway when ``force``.  One segment per call
        bounds the time taken (called after each message taken, so the
        in-memory head is refilled ahead of need).  Returns True if one was
        loaded.
        """
        p = self._pagers[level]
        if not p:
            return False
        dq = self._levels[level]
        if not force and self._memoryCost() + p.head().cost > self.memoryBudget:
            return False
        seg, entries = p.popHead(self._makeEntry)
        if self._pageExpiry is not None:
            self._pageExpiry.remove(seg)
        self.pagedCount -= seg.count
        self.pagedBytes -= seg.bytes
        dq.extend(entries)
        expiry = self._expiry
        for e in entries:
            if e.expiresAt is not None:
                expiry.add(e, e.expiresAt)
        return True

    def _popHeadPaged(self):
        """:meth:`_popHead` while some level pages: refill ahead of need."""
        levels = self._levels
        for level in range(len(levels) - 1, -1, -1):
            dq = levels[level]
            while True:
                entry = self._popFrom(dq)
                if entry is not None:
                    if self.pagedCount and self._pagers[level]:
                        # refill ahead of need: look every REFILL_EVERY
                        # messages (the budget check costs a few calls), at
                        # once when the head is empty
                        if not dq:
                            self._pageIn(level, True)
                        else:
                            self._refillTick += 1
                            if self._refillTick >= REFILL_EVERY:
                                self._refillTick = 0
                                self._pageIn(level, False)
                    return entry
                if not (self.pagedCount and self._pageIn(level, True)):
                    break
        return None

    def _pagedExpired(self, segments):
        """
        Paged segments whose earliest expiry passed: read each, dead-letter
        its expired messages (reason ``expired``) and keep the rest paged.
        """
        now = nowMs(self.clock) + _EPSILON_MS
        dead = []
        for seg in segments:
            p = self._pagers[seg.level] if self._pagers is not None else None
            if p is None:
                continue
            keep = []
            for e in p.read(seg, self._makeEntry):
                if e.expiresAt is not None and e.expiresAt <= now:
                    e.state = GONE
                    self._removed(e)
                    dead.append(e.message)
                else:
                    keep.append(e)
            n, b = seg.count, seg.bytes
            left = p.replace(seg, keep)
            n2, b2 = (left.count, left.bytes) if left is not None else (0, 0)
            self.pagedCount -= n - n2
            self.pagedBytes -= b - b2
            self.readyCount -= n - n2
            self.readyBytes -= b - b2
            if left is not None and left.minExpiresAt is not None:
                self._pageExpiry.add(left, left.minExpiresAt)
        if dead:
            self.vhost.deadLetterer.deadLetter(self, dead, "expired")

    def _enforceLimits(self):
        """
        Drop head messages while over ``x-max-length`` / ``-bytes``
        (drop-head; https://www.rabbitmq.com/docs/maxlength), dead-lettered
        with reason ``maxlen``.  Up to :data:`DROP_SLICE` at once; beyond,
        :meth:`_dropBulk`.  Waits while a requeue is pending (it runs when
        the requeue is complete).
        """
        s = self.settings
        maxLen, maxBytes = s.maxLength, s.maxLengthBytes
        if (maxLen is None and maxBytes is None) or self._requeuePending is not None:
            return
        if self.quorum and s.overflow == "reject-publish":
            # a quorum queue's limit refuses publishes (_overLimit), it drops nothing
            if ((maxLen is not None and self.readyCount > maxLen)
                    or (maxBytes is not None and self.readyBytes > maxBytes)):
                self._rejecting = True
            return
        dropped = []
        while self.readyCount and (
            (maxLen is not None and self.readyCount > maxLen)
            or (maxBytes is not None and self.readyBytes > maxBytes)
        ):
            if len(dropped) >= DROP_SLICE:
                self._dropBulk(dropped)
                return
            entry = self._popHead()
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
                self._removed(entry)
            self.vhost.deadLetterer.deadLetter(self, [e.message for e in dropped], "maxlen")

    def _dropBulk(self, dropped):
        """
        The rest of a big drop: take the head out now so the counts
        respect the limit at once (whole paged segments are detached by
        their counters, unread, and so is the whole in-memory part of a
        queue without priorities); ``dropped`` (entries already taken) and
        the rest are removed from the store and dead-lettered
        :data:`DROP_SLICE` messages per turn (:meth:`_dropTurn`).  Taken
        entries stay READY, out of every index, until then.
        """
        s = self.settings
        maxLen, maxBytes = s.maxLength, s.maxLengthBytes
        work = self._dropPending
        if work is None:
            work = self._dropPending = deque()
        work.append([None, dropped, 0])
        levels = self._levels
        pageExpiry = self._pageExpiry
        for level in range(len(levels) - 1, -1, -1):
            p = self._pagers[level] if self._pagers is not None else None
            while self.readyCount and (
                (maxLen is not None and self.readyCount > maxLen)
                or (maxBytes is not None and self.readyBytes > maxBytes)
            ):
                dq = self._levels[level]
                if dq:
                    if len(levels) == 1 and self._dropsAllInMemory(maxLen, maxBytes):
                        # detach the whole deque: O(1) however many a
                        # requeue left in memory (holes are skipped later)
                        self._levels = levels = [deque()]
                        self.readyCount = self.pagedCount
                        self.readyBytes = self.pagedBytes
                        self._holes = 0
                        self._expiry.clear()
                        work.append([None, dq, 0])
                        dropped = []
                        work.append([None, dropped, 0])
                        continue
                    entry = self._popFrom(dq)
                    if entry is not None:
                        dropped.append(entry)
                    continue
                if not p:
                    break
                seg = p.head()
                if ((maxLen is not None and self.readyCount - seg.count >= maxLen)
                        or (maxBytes is not None and self.readyBytes - seg.bytes > maxBytes)):
                    # every message of the segment goes: detach it unread
                    p.segments.popleft()
                    p._uncount(seg)
                    if pageExpiry is not None:
                        pageExpiry.remove(seg)
                    self.pagedCount -= seg.count
                    self.pagedBytes -= seg.bytes
                    self.readyCount -= seg.count
                    self.readyBytes -= seg.bytes
                    dropped = []
                    work.append([(p, seg), None, 0])
                    work.append([None, dropped, 0])
                else:
                    self._pageIn(level, True)
        if self._dropCall is None and not self._stopped:
            self._dropCall = self.clock.callLater(0, self._dropTurn)

    def _dropsAllInMemory(self, maxLen, maxBytes):
        """True if every in-memory ready message is to be dropped (the paged rest is at or over the limit)."""
        return ((maxLen is not None and self.pagedCount >= maxLen)
                or (maxBytes is not None and self.pagedBytes > maxBytes))

    def _dropTurn(self, limit=None):
        """
        Dead-letter (and forget in the store) up to ``limit`` dropped
        messages (default :data:`DROP_SLICE`); reschedule if more.
        """
        if limit is None:
            limit = DROP_SLICE
        self._dropCall = None
        work = self._dropPending
        messages = []
        removed = self._removed if not self.deleted else None
        while work and len(messages) < limit:
            item = work[0]
            if item[0] is not None:
                p, seg = item[0]
                try:
                    item[1] = p.read(seg, self._makeEntry)
                except OSError:
                    item[1] = []  # its pager was purged or deleted meanwhile
                if seg.file is not None:
                    dropSegmentFile(seg.file)
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
            if not self._stopped:
                self._dropCall = self.clock.callLater(0, self._dropTurn)
        else:
            self._dropPending = None
        if messages:
            self.vhost.deadLetterer.deadLetter(self, messages, "maxlen")

    # --- taking messages out ----------------------------------------------

    def _popHead(self):
        """
        Remove and return the first live ready entry (highest priority
        first), or None.  Does not check expiry.
        """
        if self.pagedCount:
            return self._popHeadPaged()
        for dq in reversed(self._levels):
            if dq:
                entry = self._popFrom(dq)
                if entry is not None:
                    return entry
        return None

    def _popFrom(self, dq):
        """Remove and return the first READY entry of deque ``dq`` (skipping holes), or None."""
        while dq:
            entry = dq.popleft()
            if entry.state == READY:
                self.readyCount -= 1
                self.readyBytes -= entry.message.size
                if entry.expiresAt is not None:
                    self._expiry.remove(entry)
                return entry
            self._holes -= 1
        return None

    def _popLive(self):
        """
        Remove and return the first ready entry that has not expired;
        expired ones met on the way are dead-lettered (RabbitMQ §1.9: never
        deliver an expired message).
        """
        expired = None
        now = None
        while True:
            entry = self._popHead()
            if entry is None:
                break
            if entry.expiresAt is not None:
                if now is None:
                    now = nowMs(self.clock)
                if entry.expiresAt <= now:
                    entry.state = GONE
                    self._removed(entry)
                    if expired is None:
                        expired = []
                    expired.append(entry.message)
                    continue
            break
        if expired:
            self.vhost.deadLetterer.deadLetter(self, expired, "expired")
        return entry

    def basicGet(self, noAck):
        """
        basic.get: return the next live entry (now UNACKED unless ``noAck``)
        or None.  Renews the x-expires lease.
        """
        self.touch()
        if self._requeuePending is not None:
            self._finishRequeue()
        entry = self._popLive()
        if entry is None:
            self.getEmptyCount += 1
            return None
        if noAck:
            self.getNoAckCount += 1
        else:
            self.getCount += 1
        self._take(entry, noAck)
        return entry

    def _expired(self, entries):
        messages = []
        for entry in entries:
            if entry.state == READY:
                entry.state = GONE
                self.readyCount -= 1
                self.readyBytes -= entry.message.size
                self._holes += 1
                self._removed(entry)
                messages.append(entry.message)
        if self._holes > 1024 and self._holes > self.readyCount:
            self._compact()
        if messages:
            self.vhost.deadLetterer.deadLetter(self, messages, "expired")

    def _compact(self):
        self._levels = [deque(e for e in dq if e.state == READY) for dq in self._levels]
        self._holes = 0

    # --- consumers ----------------------------------------------------------

    def addConsumer(self, consumer):
        """
        Register ``consumer`` (an object with ``priority``, ``canTake()`` and
        ``deliver(queue, entry)``), keeping consumers ordered by x-priority
        (highest first, registration order within a priority).  For a
        single-active-consumer queue the first registered one is active.
        """
        cs = self.consumers
        if self.singleActive:
            cs.append(consumer)
        else:
            i = len(cs)
            while i > 0 and cs[i - 1].priority < consumer.priority:
                i -= 1
            cs.insert(i, consumer)
        if self._idleTimer is not None:
            self.touch()
        self.dispatch()

    def removeConsumer(self, consumer):
        """
        Unregister ``consumer``; deletes an auto-delete queue after its last
        consumer goes, and restarts the x-expires lease.
        """
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self.exclusiveConsumer is consumer:
            self.exclusiveConsumer = None
        if not self.consumers:
            if self.autoDelete and not self.deleted:
                self.vhost.deleteQueue(self, reason="auto_delete")
                return
            self.touch()
        elif self.singleActive:
            self.dispatch()

    def _pickConsumer(self):
        cs = self.consumers
        if self.singleActive:
            c = cs[0]
            return c if c.canTake() else None
        n = len(cs)
        for i in range(n):
            c = cs[i]
            if c.canTake():
                if n > 1:
                    # round-robin among consumers of equal priority
                    p = c.priority
                    j = i
                    while j + 1 < n and cs[j + 1].priority == p:
                        j += 1
                    if j != i:
                        cs.insert(j, cs.pop(i))
                return c
        return None

    def _take(self, entry, noAck):
        """
        ``entry`` is handed out: gone at once with no-ack, else UNACKED
        (and marked delivered in the store, for ``redelivered`` after a restart).
        """
        self.deliveredCount += 1
        if noAck:
            self.noAckCount += 1
            entry.state = GONE
            if entry.message.stored:
                self._removed(entry)
        else:
            entry.state = UNACKED
            entry.deliveredAt = self.clock.seconds()
            self.unackedCount += 1
            if self.journal is not None and (entry.message.persistent or self.quorum):
                self.journal.delivered(self, entry)

    def _deliver(self, consumer, entry):
        self._take(entry, consumer.noAck)
        consumer.deliver(self, entry)

    def _removed(self, entry):
        """``entry`` left the queue for good: drop it from the store."""
        if self.journal is not None and (entry.message.persistent or self.quorum):
            self.journal.removed(self, entry)

    def restore(self, message, seq, expiresAt, redelivered):
        """
        Put a message recovered from the store back at position ``seq``
        (boot only; entries arrive in seq order).  An expiry already past
        fires on the next clock turn.  Beyond the memory budget the message
        is paged, so recovering a huge queue costs bounded memory.
        """
        level = min(message.priority, self.maxPriority) if self.maxPriority else 0
        entry = QueueEntry(message, seq, expiresAt, level)
        entry.redelivered = redelivered
        # the delivery count is not stored: a message delivered before the
        # restart counts as returned once (docs/quorum.md)
        entry.returns = 1 if redelivered else 0
        self._seq = max(self._seq, seq)
        if self._shouldPage(level, message.size):
            # a huge recovered queue is paged as it is read back
            self._page(entry)
        else:
            self._levels[level].append(entry)
            if expiresAt is not None:
                self._expiry.add(entry, expiresAt)
        self.readyCount += 1
        self.readyBytes += message.size

    def dispatch(self):
        """
        Hand ready messages to consumers with prefetch room until one side
        runs out, at most :data:`DISPATCH_MESSAGES` messages or
        :data:`DISPATCH_BYTES` body bytes per call; the rest goes on a later
        reactor turn (``clock.callLater(0)``), so other queues and
        connections get their turn.  Re-entrant calls are ignored.
        """
        if self._dispatching or self.deleted or self._requeuePending is not None:
            return
        self._dispatching = True
        n = 0
        size = 0
        try:
            while self.readyCount and self.consumers:
                if n >= DISPATCH_MESSAGES or size >= DISPATCH_BYTES:
                    if self._dispatchCall is None and not self._stopped:
                        self._dispatchCall = self.clock.callLater(0, self._dispatchTurn)
                    break
                consumer = self._pickConsumer()
                if consumer is None:
                    break
                entry = self._popLive()
                if entry is None:
                    break
                self._deliver(consumer, entry)
                n += 1
                size += entry.message.size
        finally:
            self._dispatching = False

    def _dispatchTurn(self):
        self._dispatchCall = None
        self.dispatch()

    def _cancelDispatch(self):
        if self._dispatchCall is not None and self._dispatchCall.active():
            self._dispatchCall.cancel()
        self._dispatchCall = None

    # --- settling -----------------------------------------------------------

    def settle(self, entry):
        """
        basic.ack of an UNACKED entry: the message leaves the queue.
        """
        if entry.state == UNACKED:
            entry.state = GONE
            self.unackedCount -= 1
            self.ackCount += 1
            self._removed(entry)

    def reject(self, entries):
        """
        basic.reject / basic.nack with requeue=false of UNACKED ``entries``
        (list): the messages leave the queue and are dead-lettered with reason
        ``rejected`` if a DLX is set, else dropped
        (https://www.rabbitmq.com/docs/dlx).
        """
        messages = []
        for entry in entries:
            if entry.state == UNACKED:
                entry.state = GONE
                self.unackedCount -= 1
                self._removed(entry)
                messages.append(entry.message)
        if messages and not self.deleted:
            self.vhost.deadLetterer.deadLetter(self, messages, "rejected")

    def requeue(self, entries, dispatch=True):
        """
        Put UNACKED entries back in their original positions (by seq) with
        ``redelivered`` set; an entry whose expiry passed while it was held
        expires now (RabbitMQ ttl.html: requeued messages keep their expiry).

        Up to :data:`REQUEUE_SLICE` entries are reinserted at once; more
        are reinserted that many per reactor turn (see the module
        docstring: counts move from unacked to ready slice by slice and the
        queue delivers nothing until the last slice is in).
        """
        if self.deleted:
            for entry in entries:
                entry.state = GONE
            return
        pending = self._requeuePending
        if pending is None and len(entries) <= REQUEUE_SLICE:
            self._reinsert(entries)
            self._enforceLimits()
            if dispatch:
                self.dispatch()
            return
        if pending is None:
            self._requeuePending = list(entries)
        else:
            pending.extend(entries)
        if self._requeueCall is None and not self._stopped:
            self._requeueCall = self.clock.callLater(0, self._requeueTurn)

    def _requeueTurn(self):
        """Reinsert the next :data:`REQUEUE_SLICE` entries (newest first); finish or reschedule."""
        self._requeueCall = None
        pending = self._requeuePending
        if pending is None:
            return
        if self.deleted:
            self._requeuePending = None
            self.vhost.broker.freer.add(pending, _markGone)
            return
        chunk = pending[-REQUEUE_SLICE:]
        del pending[-REQUEUE_SLICE:]
        self._reinsert(chunk)
        if pending:
            if not self._stopped:
                self._requeueCall = self.clock.callLater(0, self._requeueTurn)
            return
        if self._requeueFeeders:
            return  # more to come: releaseRequeue finishes
        self._requeuePending = None
        self._enforceLimits()
        self.dispatch()

    def holdRequeue(self, feeder):
        """
        A requeue of entries not handed over yet begins (a channel feeding
        its unacked records a slice per turn): the queue delivers nothing
        until :meth:`releaseRequeue`.  ``feeder.finish()`` must hand over
        everything at once (called by a ``basic.get`` or a broker stop).
        """
        if self.deleted:
            return
        self._requeueFeeders.append(feeder)
        if self._requeuePending is None:
            self._requeuePending = []

    def releaseRequeue(self, feeder):
        """``feeder`` handed over its last entries (see :meth:`holdRequeue`)."""
        try:
            self._requeueFeeders.remove(feeder)
        except ValueError:
            return
        if (not self._requeueFeeders and self._requeuePending is not None
                and not self._requeuePending and self._requeueCall is None):
            self._requeuePending = None
            if not self.deleted:
                self._enforceLimits()
                self.dispatch()

    def _finishRequeue(self):
        """Reinsert everything still pending now (basic.get, broker stop)."""
        for feeder in list(self._requeueFeeders):
            feeder.finish()
        self._requeueFeeders = []
        if self._requeueCall is not None and self._requeueCall.active():
            self._requeueCall.cancel()
        self._requeueCall = None
        pending, self._requeuePending = self._requeuePending, None
        if pending:
            self._reinsert(pending)
        self._enforceLimits()

    def _reinsert(self, entries):
        """
        Make the UNACKED ones of ``entries`` (any order) READY again at
        their seq positions.  Entries before a level's head or after its
        tail are appended (O(1) each); the others are merged into the level
        in one pass (O(level + k log k)).
        """
        now = nowMs(self.clock)
        expired = []
        overLimit = []
        limit = self.settings.deliveryLimit
        middle = None
        levels = self._levels
        expiry = self._expiry
        for entry in sorted(entries, key=_bySeqDesc):
            if entry.state != UNACKED:
                continue
            self.unackedCount -= 1
            entry.returns += 1
            if entry.expiresAt is not None and entry.expiresAt <= now:
                entry.state = GONE
                self._removed(entry)
                expired.append(entry.message)
                continue
            if limit is not None and entry.returns > limit:
                # RabbitMQ rabbit_fifo: a return beyond the limit dead-letters
                entry.state = GONE
                self._removed(entry)
                overLimit.append(entry.message)
                continue
            entry.state = READY
            entry.redelivered = True
            dq = levels[entry.level]
            if not dq or entry.seq < dq[0].seq:
                dq.appendleft(entry)
            elif entry.seq > dq[-1].seq:
                dq.append(entry)
            else:
                if middle is None:
                    middle = {}
                middle.setdefault(entry.level, []).append(entry)
            self.readyCount += 1
            self.readyBytes += entry.message.size
            if entry.expiresAt is not None:
                expiry.add(entry, entry.expiresAt)
        if middle:
            for level, mids in middle.items():
                mids.reverse()  # ascending seq
                levels[level] = deque(heapq.merge(levels[level], mids, key=_bySeq))
        if expired:
            self.vhost.deadLetterer.deadLetter(self, expired, "expired")
        if overLimit:
            self.vhost.deadLetterer.deadLetter(self, overLimit, "delivery_limit")

    # --- purge / delete -------------------------------------------------------

    def purge(self):
        """
        queue.purge: drop every ready message (not dead-lettered); returns
        how many were dropped (int), at once.  The store forgets the
        persistent ones now; the dropped entries and paged files are freed
        a slice per reactor turn afterwards (``Broker.freer``).
        """
        n = self.readyCount
        if not n:
            return 0
        journal = None if self.deleted else self.journal
        if journal is not None:
            # one store call: the queue's ready entries, not its unacked ones
            journal.purged(self)
        levels = self._levels
        self._levels = [deque() for _ in levels]
        freer = self.vhost.broker.freer
        for dq in levels:
            freer.add(dq, _markGone)
        if self._pagers is not None:
            for p in self._pagers:
                if p is not None:
                    freer.addPaths(p.detach())
            self._pagers = None
        if self._pageExpiry is not None:
            self._pageExpiry.clear()
        self.pagedCount = 0
        self.pagedBytes = 0
        self.readyCount = 0
        self.readyBytes = 0
        self._holes = 0
        self._expiry.clear()
        return n

    def readyEntries(self):
        """
        Iterate the ready entries in delivery order (for management and
        the store), paged ones included (read from their files).
        """
        levels = self._levels
        pagers = self._pagers
        for level in range(len(levels) - 1, -1, -1):
            for entry in levels[level]:
                if entry.state == READY:
                    yield entry
            p = pagers[level] if pagers is not None else None
            if p:
                for entry in p.iterEntries(self._makeEntry):
                    yield entry

    def readyExpiries(self):
        """
        The ready messages' expiry times without reading any file:
        ``(expiresAt, count, exact)`` triples, ``expiresAt`` in ms on the
        clock's time base or None (no TTL).  In-memory messages come one by
        one (``exact`` True); a paged-out segment comes as one triple with
        its earliest expiry and its message count (``exact`` False), so the
        cost is O(in-memory messages + segments) (management's expiry
        histogram, refreshed every few seconds).
        """
        for dq in self._levels:
            for entry in dq:
                if entry.state == READY:
                    yield entry.expiresAt, 1, True
        for p in self._pagers or ():
            if p:
                for seg in p.segments:
                    if seg.count:
                        yield seg.minExpiresAt, seg.count, False

    def readyPersistent(self):
        """
        ``(count, bytes)`` of persistent ready messages, paged ones included
        (from the segments' counters: no file is read).
        """
        n = b = 0
        for dq in self._levels:
            for entry in dq:
                if entry.state == READY and entry.message.persistent:
                    n += 1
                    b += entry.message.size
        for p in self._pagers or ():
            if p is not None:
                n += p.persistent
                b += p.persistentBytes
        return n, b

    def stopTimers(self):
        """
        Cancel the expiry timers (broker shutdown); state is kept: a
        pending requeue or length-limit drop is finished now.
        """
        if self._requeuePending is not None:
            self._finishRequeue()
        if self._dropPending is not None:
            if self._dropCall is not None and self._dropCall.active():
                self._dropCall.cancel()
            self._dropTurn(limit=float("inf"))
        if self._idleTimer is not None and self._idleTimer.active():
            self._idleTimer.cancel()
        self._idleTimer = None
        self._expiry.freeze()
        if self._pageExpiry is not None:
            self._pageExpiry.freeze()
        self._cancelDispatch()
        self._dropDeadLetters()
        self._stopped = True

    def shutdown(self):
        """
        Mark deleted; cancel timers; tell consumers (consumer cancel
        notification).  Called by the vhost.
        """
        self.deleted = True
        if self._idleTimer is not None and self._idleTimer.active():
            self._idleTimer.cancel()
        self._idleTimer = None
        self._expiry.clear()
        self._cancelDispatch()
        self._dropDeadLetters()
        self.dlxHeld = None
        self.dlxHeldBytes = 0
        if self._requeuePending is not None:
            # still UNACKED: they go with the queue
            if self._requeueCall is not None and self._requeueCall.active():
                self._requeueCall.cancel()
            self._requeueCall = None
            pending, self._requeuePending = self._requeuePending, None
            self.vhost.broker.freer.add(pending, _markGone)
        self._requeueFeeders = []
        consumers, self.consumers = self.consumers, []
        for c in consumers:
            c.cancelledByBroker(self)
        n = self.purge()
        return n


def _bySeqDesc(entry):
    return -entry.seq


def _bySeq(entry):
    return entry.seq


def _markGone(entry):
    entry.state = GONE
