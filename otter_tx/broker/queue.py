"""
Classic and quorum queues: consumers, prefetch-aware dispatch, settling,
message TTL, the ``x-expires`` lease.

Semantics follow RabbitMQ 3.10 classic queues (https://www.rabbitmq.com/docs/
ttl, /dlx, /maxlength, /priority, /consumer-priority, /consumers#single-active-
consumer) except where otter_tx is deliberately better: an expired message is
reaped wherever it sits, so counts never include expired messages.  A quorum
queue is this queue with RabbitMQ 3.10's quorum rules (docs/quorum.md).

:class:`Queue` keeps its consumers and the dispatch to them; its parts are
collaborators it drives:

- ``ready``: the ready messages (priority levels, paging beyond the memory
  budget, the expiry index) behind :class:`~otter_tx.broker.interfaces.IReadyStore`
  (:class:`~otter_tx.broker.readystore.ReadyStore`);
- ``limits``: ``x-max-length`` / ``x-max-length-bytes`` and every
  ``x-overflow`` (:class:`~otter_tx.broker.limits.LengthLimits`), large
  drops a slice per reactor turn;
- ``requeuer``: requeues, large ones a slice per reactor turn, with the
  delivery limit (:class:`~otter_tx.broker.requeue.Requeuer`);
- ``heldDeadLetters``: at-least-once dead letters no queue took yet
  (:class:`~otter_tx.broker.deadletter.HeldDeadLetters`).

The hot path (enqueue, dispatch to a consumer, settle) stays here, written
out in :meth:`Queue.enqueue`, :meth:`Queue.dispatch`, :meth:`Queue._deliver`
and :meth:`Queue.settle`: one call into the ready store per message queued
(``append``) and per message taken (``popLive``), none into the other
collaborators unless the queue has a length limit or an ``x-overflow`` other
than ``drop-head`` (a pending requeue is one attribute test).

All times are milliseconds on the injected clock (``clock.seconds() * 1000``).

Dispatch is bounded per reactor turn (:data:`DISPATCH_MESSAGES` messages or
:data:`DISPATCH_BYTES` body bytes per call, then it continues on a later
turn through the clock), so one deep queue with an eager consumer cannot
hold the reactor; purge and delete answer at once and free the dropped
messages a slice per turn (``Broker.freer``).
"""

from zope.interface import implementer

from otter_tx.amqp.codec import TaggedInt
from otter_tx.broker.arguments import QUORUM, queueType
from otter_tx.broker.deadletter import HeldDeadLetters
from otter_tx.broker.expiry import nowMs
from otter_tx.broker.interfaces import IDeclaredQueue, IQueue
from otter_tx.broker.limits import DROP_SLICE, LengthLimits
from otter_tx.broker.readystore import GONE, READY, UNACKED, QueueEntry, ReadyStore
from otter_tx.broker.requeue import REQUEUE_SLICE, Requeuer

# QueueEntry and its states, REQUEUE_SLICE and DROP_SLICE stay importable from here
__all__ = ["Queue", "QueueSettings", "QueueEntry", "READY", "UNACKED", "GONE", "DISPATCH_MESSAGES",
           "DISPATCH_BYTES", "REQUEUE_SLICE", "DROP_SLICE"]

#: most messages one dispatch call hands out before yielding the reactor
DISPATCH_MESSAGES = 256
#: most body bytes one dispatch call hands out before yielding the reactor
DISPATCH_BYTES = 1024 * 1024


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


@implementer(IQueue, IDeclaredQueue)
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

    # IDeclaredQueue: a local queue is never down and not remote; a stream sets ``stream``
    down = False
    downText = None
    remote = False
    stream = None


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
        self.singleActive = bool(arguments.get("x-single-active-consumer"))
        #: ``"quorum"`` or ``"classic"`` (``x-queue-type``)
        self.queueType = queueType(arguments)
        self.quorum = self.queueType == QUORUM
        #: the broker's counts of this queue type's deliveries and acks
        #: (``Broker.typeCounts``; None for a classic queue: the channel totals less the others)
        self.typeCounts = getattr(vhost.broker, "typeCounts", {}).get(self.queueType)
        self.unackedCount = 0
        self._seq = 0
        self.consumers = []
        self.deleted = False
        #: True once the broker stopped (stopTimers): no timer is set any more
        self.stopped = False
        self.exclusiveConsumer = None
        self.bindings = {}  # (exchange, routingKey, argsKey) -> arguments, for cleanup
        self.settings = QueueSettings()
        self.policy = None
        #: the matching OperatorPolicy, and the merged definition in effect (vhost._applyPolicy)
        self.operatorPolicy = None
        self.effectiveDefinition = {}
        broker = vhost.broker
        #: the ready messages (IReadyStore)
        self.ready = ReadyStore(self.clock, self.maxPriority or None, broker.queueMemoryBudget,
                                broker.paging, broker.freer, broker.reapingLateness.message,
                                self._expired)
        #: x-max-length / x-max-length-bytes / x-overflow
        self.limits = LengthLimits(self)
        #: requeues, large ones sliced
        self.requeuer = Requeuer(self)
        #: at-least-once dead letters no queue took yet
        self.heldDeadLetters = HeldDeadLetters(self)
        #: the durability journal for a durable queue (set by the journal), else None
        self.journal = None
        #: the journal's key for this queue (``Journal.queueKey``), once computed
        self.journalKey = None
        self._idleTimer = None
        self._dispatching = False
        self._dispatchCall = None
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
        self.limits.enforce()

    # --- queue expiry (x-expires) ------------------------------------------

    def declared(self, renew):
        """
        A declare of this queue (passive, or an equivalent redeclare): the
        ``x-expires`` lease renewed when ``renew`` (bool); returns the queue
        (a queue on another node returns a Deferred of it, with its counts).
        """
        if renew:
            self.touch()
        return self

    def touch(self):
        """
        Renew the ``x-expires`` lease: declare, passive declare and
        basic.get count as use; publishing does not (RabbitMQ ttl.html
        "Queue TTL").
        """
        if self.stopped:
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

    @property
    def readyCount(self):
        """Messages ready for delivery, paged ones included (int)."""
        return self.ready.readyCount

    @property
    def readyBytes(self):
        """Their body bytes (int)."""
        return self.ready.readyBytes

    @property
    def pagedCount(self):
        """Ready messages paged out to disk (int)."""
        return self.ready.pagedCount

    @property
    def pagedBytes(self):
        """Their body bytes (int)."""
        return self.ready.pagedBytes

    # --- enqueue ----------------------------------------------------------

    def enqueue(self, message, now=None, redelivered=False):
        """
        Offer ``message`` to this queue (basic.publish routed here).

        ``now``: the clock's time in ms (float), or None to read the clock;
        the message's TTL (ms) counts from it.
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
        if s.overflow != "drop-head" and self.limits.refuses(message.size):
            if s.overflow == "reject-publish-dlx":
                self.vhost.deadLetterer.deadLetter(self, [message], "maxlen")
            return False
        ttl = message.ttl
        qttl = s.messageTtl
        if qttl is not None and (ttl is None or qttl < ttl):
            ttl = qttl
        self._seq += 1
        # ReadyStore.levelOf, written inline: the hot path
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
        ready = self.ready
        if not ready.readyCount and self.consumers and self.requeuer.pending is None:
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
        ready.append(entry)
        if journal is not None:
            journal.enqueued(self, entry)
        if s.maxLength is not None or s.maxLengthBytes is not None:
            self.limits.enforce()
        return True

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

    def restore(self, message, seq, expiresAt, redelivered):
        """
        Put a message recovered from the store back at position ``seq``
        (boot only; entries arrive in seq order), expiring at ``expiresAt``
        (clock ms, float, or None: no TTL).  An expiry already past
        fires on the next clock turn.  Beyond the memory budget the message
        is paged, so recovering a huge queue costs bounded memory.  The
        delivery count is not stored: a message delivered before the
        restart counts as returned once (docs/quorum.md).
        """
        self._seq = max(self._seq, seq)
        self.ready.append(self.ready.makeEntry(message, seq, expiresAt, redelivered))

    def restoreStored(self, run):
        """
        Page a run of recovered messages that the durable store keeps
        (:class:`~otter_tx.broker.paging.StoredRun`, boot only, after the
        ones given to :meth:`restore`, in seq order): they are read from
        the store when paged in, never copied.
        """
        self._seq = max(self._seq, run.range.lastSeq)
        self.ready.appendStored(run)

    # --- dispatch -----------------------------------------------------------

    def dispatch(self):
        """
        Hand ready messages to consumers with prefetch room until one side
        runs out, at most :data:`DISPATCH_MESSAGES` messages or
        :data:`DISPATCH_BYTES` body bytes per call; the rest goes on a later
        reactor turn (``clock.callLater(0)``), so other queues and
        connections get their turn.  Re-entrant calls are ignored, and so
        are calls while a requeue is pending.
        """
        if self._dispatching or self.deleted or self.requeuer.pending is not None:
            return
        self._dispatching = True
        ready = self.ready
        n = 0
        size = 0
        try:
            while ready.readyCount and self.consumers:
                if n >= DISPATCH_MESSAGES or size >= DISPATCH_BYTES:
                    if self._dispatchCall is None and not self.stopped:
                        self._dispatchCall = self.clock.callLater(0, self._dispatchTurn)
                    break
                consumer = self._pickConsumer()
                if consumer is None:
                    break
                entry = ready.popLive()
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

    def basicGet(self, noAck):
        """
        basic.get: return the next live entry (now UNACKED unless ``noAck``)
        or None.  Renews the x-expires lease; finishes a pending requeue first.
        """
        self.touch()
        if self.requeuer.pending is not None:
            self.requeuer.finish()
        entry = self.ready.popLive()
        if entry is None:
            self.getEmptyCount += 1
            return None
        if noAck:
            self.getNoAckCount += 1
        else:
            self.getCount += 1
        self._take(entry, noAck)
        return entry

    def _take(self, entry, noAck):
        """
        ``entry`` is handed out: gone at once with no-ack, else UNACKED
        (and marked delivered in the store, for ``redelivered`` after a restart).
        """
        self.deliveredCount += 1
        if entry.redelivered:
            self.redeliverCount += 1
        if noAck:
            self.noAckCount += 1
            entry.state = GONE
            if entry.message.stored:
                self.forget(entry)
        else:
            entry.state = UNACKED
            entry.deliveredAt = self.clock.seconds()
            self.unackedCount += 1
            if self.journal is not None and (entry.message.persistent or self.quorum):
                self.journal.delivered(self, entry)

    def _deliver(self, consumer, entry):
        self._take(entry, consumer.noAck)
        consumer.deliver(self, entry)

    def forget(self, entry):
        """``entry`` left the queue for good: the durable store forgets it."""
        if self.journal is not None and (entry.message.persistent or self.quorum):
            self.journal.removed(self, entry)

    def _expired(self, entries):
        """The ready store's ``onExpired``: ``entries`` expired, dead-letter them (reason ``expired``)."""
        for entry in entries:
            self.forget(entry)
        self.vhost.deadLetterer.deadLetter(self, [e.message for e in entries], "expired")

    # --- consumers ----------------------------------------------------------

    def deleteConditions(self, ifUnused, ifEmpty):
        """
        queue.delete's ``if-unused`` / ``if-empty`` (bools) as this kind
        applies them: the pair :meth:`VHost.deleteQueue
        <otter_tx.broker.vhost.VHost.deleteQueue>` checks.  A classic or
        quorum queue keeps both (the vhost refuses them on a quorum queue).
        """
        return ifUnused, ifEmpty

    def checkConsume(self, noAck, prefetch, arguments):
        """A classic or quorum queue has no consume rules of its own (IQueue.checkConsume)."""

    def refusesConsumer(self, exclusive):
        """
        True when a new consumer (``exclusive``: basic.consume's flag) is
        refused: this queue has an exclusive consumer, or an exclusive one
        is asked while it has consumers or is single-active-consumer (the
        Session answers 403 ``in exclusive use``).
        """
        return self.exclusiveConsumer is not None or bool(exclusive and (self.consumers or self.singleActive))

    def addConsumer(self, consumer, exclusive=False):
        """
        Register ``consumer`` (an :class:`~otter_tx.broker.interfaces.IConsumer`),
        keeping consumers ordered by x-priority (highest first, registration
        order within a priority).  For a single-active-consumer queue the
        first registered one is active.  An ``exclusive`` consumer keeps
        every other off until it goes (:meth:`refusesConsumer`).
        """
        if exclusive:
            self.exclusiveConsumer = consumer
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

    # --- settling -----------------------------------------------------------

    def settle(self, entry):
        """
        basic.ack of an UNACKED entry: the message leaves the queue.
        """
        if entry.state == UNACKED:
            entry.state = GONE
            self.unackedCount -= 1
            self.ackCount += 1
            self.forget(entry)

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
                self.forget(entry)
                messages.append(entry.message)
        if messages and not self.deleted:
            self.vhost.deadLetterer.deadLetter(self, messages, "rejected")

    def requeue(self, entries, dispatch=True):
        """
        Put UNACKED ``entries`` (list) back in their original positions (by
        seq) with ``redelivered`` set; more than
        :data:`~otter_tx.broker.requeue.REQUEUE_SLICE` go back a slice per
        reactor turn and the queue delivers nothing meanwhile
        (:mod:`otter_tx.broker.requeue`).  ``dispatch``: deliver afterwards.
        """
        self.requeuer.requeue(entries, dispatch)

    def holdRequeue(self, feeder):
        """
        A requeue of entries not handed over yet begins (a channel feeding
        its unacked records a slice per turn): the queue delivers nothing
        until :meth:`releaseRequeue`.  ``feeder.finish()`` must hand over
        everything at once (called by a ``basic.get`` or a broker stop).
        """
        self.requeuer.hold(feeder)

    def releaseRequeue(self, feeder):
        """``feeder`` handed over its last entries (see :meth:`holdRequeue`)."""
        self.requeuer.release(feeder)

    # --- purge / delete -------------------------------------------------------

    def purge(self):
        """
        queue.purge: drop every ready message (not dead-lettered); returns
        how many were dropped (int), at once.  The store forgets the
        persistent ones now; the dropped entries and paged files are freed
        a slice per reactor turn afterwards (``Broker.freer``).
        """
        n = self.ready.readyCount
        if not n:
            return 0
        journal = None if self.deleted else self.journal
        if journal is not None:
            # one store call: the queue's ready entries, not its unacked ones
            journal.purged(self)
        self.ready.clear()
        return n

    def readyEntries(self):
        """
        Iterate the ready entries in delivery order (for management and
        the store), paged ones included (read from their files).
        """
        return self.ready.entries()

    def stopTimers(self):
        """
        Cancel the expiry timers (broker shutdown); state is kept: a
        pending requeue or length-limit drop is finished now.
        """
        if self.requeuer.pending is not None:
            self.requeuer.finish()
        self.limits.finish()
        if self._idleTimer is not None and self._idleTimer.active():
            self._idleTimer.cancel()
        self._idleTimer = None
        self.ready.freeze()
        self._cancelDispatch()
        self.heldDeadLetters.stop()
        self.stopped = True

    def shutdown(self):
        """
        Mark deleted; cancel timers; tell consumers (consumer cancel
        notification).  Called by the vhost.  Returns how many ready
        messages went with the queue (int).
        """
        self.deleted = True
        if self._idleTimer is not None and self._idleTimer.active():
            self._idleTimer.cancel()
        self._idleTimer = None
        self._cancelDispatch()
        self.heldDeadLetters.drop()
        self.requeuer.discard()
        consumers, self.consumers = self.consumers, []
        for c in consumers:
            c.cancelledByBroker(self)
        # the ready messages go with the queue (the journal forgets the
        # queue as a whole), and the expiry timers with them
        n = self.ready.readyCount
        self.ready.clear()
        return n
