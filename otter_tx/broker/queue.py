"""
Classic queues: ready messages, consumers, prefetch-aware dispatch, message
TTL with prompt reaping, length limits and queue expiry.

Semantics follow RabbitMQ 3.10 classic queues (https://www.rabbitmq.com/docs/
ttl, /dlx, /maxlength, /priority, /consumer-priority, /consumers#single-active-
consumer) except where otter_tx is deliberately better: an expired message is
reaped wherever it sits (one :class:`~otter_tx.broker.expiry.ExpiryIndex` per
queue), so counts never include expired messages.

All times are milliseconds on the injected clock (``clock.seconds() * 1000``).
"""

from collections import deque

from otter_tx.broker.expiry import ExpiryIndex, nowMs

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
    """

    __slots__ = ("message", "seq", "expiresAt", "redelivered", "state", "level", "deliveredAt")

    def __init__(self, message, seq, expiresAt, level):
        self.message = message
        self.seq = seq
        self.expiresAt = expiresAt
        self.redelivered = False
        self.state = READY
        self.level = level
        self.deliveredAt = None


class QueueSettings:
    """
    The effective limits of a queue, from its arguments and policy.

    :ivar messageTtl: ms or None.  :ivar expires: ms or None.
    :ivar dlx: dead-letter exchange name or None.  :ivar dlrk: routing key or None.
    :ivar maxLength: messages or None.  :ivar maxLengthBytes: body bytes or None.
    :ivar overflow: ``drop-head``, ``reject-publish`` or ``reject-publish-dlx``.
    """

    __slots__ = ("messageTtl", "expires", "dlx", "dlrk", "maxLength", "maxLengthBytes", "overflow")

    def __init__(self):
        self.messageTtl = None
        self.expires = None
        self.dlx = None
        self.dlrk = None
        self.maxLength = None
        self.maxLengthBytes = None
        self.overflow = "drop-head"


class Queue:
    """
    One classic queue in a vhost.

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
        self.readyCount = 0
        self.readyBytes = 0
        self.unackedCount = 0
        self._holes = 0
        self._seq = 0
        self.consumers = []
        self.hadConsumers = False
        self.deleted = False
        self.exclusiveConsumer = None
        self.bindings = {}  # (exchange, routingKey, argsKey) -> arguments, for cleanup
        self.settings = QueueSettings()
        self.policy = None
        self._expiry = ExpiryIndex(self.clock, self._expired)
        #: the durability journal for a durable queue (set by the journal), else None
        self.journal = None
        #: the journal's key for this queue (``Journal.queueKey``), once computed
        self.journalKey = None
        self._idleTimer = None
        self._stopped = False
        self._dispatching = False
        # counters (management / metrics)
        self.publishedCount = 0
        self.deliveredCount = 0

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
        self._idleTimer = None
        if not self.consumers and not self.deleted:
            self.vhost.deleteQueue(self, reason="expired")

    # --- counts -----------------------------------------------------------

    @property
    def messageCount(self):
        """Ready messages (int); never includes expired ones."""
        return self.readyCount

    @property
    def consumerCount(self):
        """Consumers (int)."""
        return len(self.consumers)

    # --- enqueue ----------------------------------------------------------

    def enqueue(self, message, now=None):
        """
        Offer ``message`` to this queue (basic.publish routed here).

        Returns True if accepted, False if refused by ``reject-publish`` /
        ``reject-publish-dlx`` overflow (the publisher gets basic.nack when
        confirms are on; https://www.rabbitmq.com/docs/maxlength).
        """
        s = self.settings
        if now is None:
            now = nowMs(self.clock)
        if s.overflow != "drop-head" and (
            (s.maxLength is not None and self.readyCount + 1 > s.maxLength)
            or (s.maxLengthBytes is not None and self.readyBytes + message.size > s.maxLengthBytes)
        ):
            if s.overflow == "reject-publish-dlx":
                self.vhost.deadLetter(self, [message], "maxlen")
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
        self.publishedCount += 1
        journal = self.journal if message.persistent else None
        if not self.readyCount and self.consumers:
            consumer = self._pickConsumer()
            if consumer is not None:
                if journal is not None and not consumer.noAck:
                    journal.enqueued(self, entry)
                self._deliver(consumer, entry)
                return True
        if ttl is not None and ttl <= 0:
            # TTL 0: deliverable only to a consumer that can take it at once
            self.vhost.deadLetter(self, [message], "expired")
            return True
        self._levels[level].append(entry)
        self.readyCount += 1
        self.readyBytes += message.size
        if journal is not None:
            journal.enqueued(self, entry)
        if ttl is not None:
            self._expiry.add(entry, entry.expiresAt)
        if s.maxLength is not None or s.maxLengthBytes is not None:
            self._enforceLimits()
        return True

    def _enforceLimits(self):
        s = self.settings
        if s.maxLength is None and s.maxLengthBytes is None:
            return
        dropped = []
        while self.readyCount and (
            (s.maxLength is not None and self.readyCount > s.maxLength)
            or (s.maxLengthBytes is not None and self.readyBytes > s.maxLengthBytes)
        ):
            entry = self._popHead()
            if entry is None:
                break
            entry.state = GONE
            self._removed(entry)
            dropped.append(entry.message)
        if dropped:
            self.vhost.deadLetter(self, dropped, "maxlen")

    # --- taking messages out ----------------------------------------------

    def _popHead(self):
        """
        Remove and return the first live ready entry (highest priority
        first), or None.  Does not check expiry.
        """
        for dq in reversed(self._levels):
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
            self.vhost.deadLetter(self, expired, "expired")
        return entry

    def basicGet(self, noAck):
        """
        basic.get: return the next live entry (now UNACKED unless ``noAck``)
        or None.  Renews the x-expires lease.
        """
        self.touch()
        entry = self._popLive()
        if entry is None:
            return None
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
            self.vhost.deadLetter(self, messages, "expired")

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
        self.hadConsumers = True
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

    def activeConsumer(self):
        """
        The single active consumer, or None (single-active-consumer queues).
        """
        return self.consumers[0] if self.singleActive and self.consumers else None

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
            entry.state = GONE
            if entry.message.stored:
                self._removed(entry)
        else:
            entry.state = UNACKED
            entry.deliveredAt = self.clock.seconds()
            self.unackedCount += 1
            if self.journal is not None and entry.message.persistent:
                self.journal.delivered(self, entry)

    def _deliver(self, consumer, entry):
        self._take(entry, consumer.noAck)
        consumer.deliver(self, entry)

    def _removed(self, entry):
        """``entry`` left the queue for good: drop it from the store."""
        if self.journal is not None and entry.message.persistent:
            self.journal.removed(self, entry)

    def restore(self, message, seq, expiresAt, redelivered):
        """
        Put a message recovered from the store back at position ``seq``
        (boot only; entries arrive in seq order).  An expiry already past
        fires on the next clock turn.
        """
        level = min(message.priority, self.maxPriority) if self.maxPriority else 0
        entry = QueueEntry(message, seq, expiresAt, level)
        entry.redelivered = redelivered
        self._levels[level].append(entry)
        self._seq = max(self._seq, seq)
        self.readyCount += 1
        self.readyBytes += message.size
        if expiresAt is not None:
            self._expiry.add(entry, expiresAt)

    def dispatch(self):
        """
        Hand ready messages to consumers with prefetch room until one side
        runs out.  Re-entrant calls are ignored.
        """
        if self._dispatching or self.deleted:
            return
        self._dispatching = True
        try:
            while self.readyCount and self.consumers:
                consumer = self._pickConsumer()
                if consumer is None:
                    break
                entry = self._popLive()
                if entry is None:
                    break
                self._deliver(consumer, entry)
        finally:
            self._dispatching = False

    # --- settling -----------------------------------------------------------

    def settle(self, entry):
        """
        basic.ack of an UNACKED entry: the message leaves the queue.
        """
        if entry.state == UNACKED:
            entry.state = GONE
            self.unackedCount -= 1
            self._removed(entry)

    def discard(self, entries, deadLetter=True):
        """
        basic.reject / basic.nack with requeue=false: the messages leave the
        queue and are dead-lettered with reason ``rejected`` if a DLX is set.
        """
        messages = []
        for entry in entries:
            if entry.state == UNACKED:
                entry.state = GONE
                self.unackedCount -= 1
                self._removed(entry)
                messages.append(entry.message)
        if messages and deadLetter and not self.deleted:
            self.vhost.deadLetter(self, messages, "rejected")

    def requeue(self, entries, dispatch=True):
        """
        Put UNACKED entries back in their original positions with
        ``redelivered`` set; an entry whose expiry passed while it was held
        expires now (RabbitMQ ttl.html: requeued messages keep their expiry).
        """
        if self.deleted:
            for entry in entries:
                entry.state = GONE
            return
        now = nowMs(self.clock)
        expired = []
        for entry in sorted(entries, key=_bySeqDesc):
            if entry.state != UNACKED:
                continue
            self.unackedCount -= 1
            if entry.expiresAt is not None and entry.expiresAt <= now:
                entry.state = GONE
                self._removed(entry)
                expired.append(entry.message)
                continue
            entry.state = READY
            entry.redelivered = True
            dq = self._levels[entry.level]
            if not dq or entry.seq < dq[0].seq:
                dq.appendleft(entry)
            elif entry.seq > dq[-1].seq:
                dq.append(entry)
            else:
                items = list(dq)
                lo, hi = 0, len(items)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if items[mid].seq < entry.seq:
                        lo = mid + 1
                    else:
                        hi = mid
                items.insert(lo, entry)
                self._levels[entry.level] = deque(items)
            self.readyCount += 1
            self.readyBytes += entry.message.size
            if entry.expiresAt is not None:
                self._expiry.add(entry, entry.expiresAt)
        if expired:
            self.vhost.deadLetter(self, expired, "expired")
        self._enforceLimits()
        if dispatch:
            self.dispatch()

    # --- purge / delete -------------------------------------------------------

    def purge(self):
        """
        queue.purge: drop every ready message (not dead-lettered); returns
        how many were dropped.
        """
        n = self.readyCount
        journal = None if self.deleted else self.journal
        for dq in self._levels:
            for entry in dq:
                if journal is not None and entry.state == READY and entry.message.persistent:
                    journal.removed(self, entry)
                entry.state = GONE
            dq.clear()
        self.readyCount = 0
        self.readyBytes = 0
        self._holes = 0
        self._expiry.clear()
        return n

    def readyEntries(self):
        """
        Iterate the ready entries in delivery order (for management and
        the store).
        """
        for dq in reversed(self._levels):
            for entry in dq:
                if entry.state == READY:
                    yield entry

    def stopTimers(self):
        """Cancel the expiry timers (broker shutdown); state is kept."""
        if self._idleTimer is not None and self._idleTimer.active():
            self._idleTimer.cancel()
        self._idleTimer = None
        self._expiry.freeze()
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
        consumers, self.consumers = self.consumers, []
        for c in consumers:
            c.cancelledByBroker(self)
        n = self.purge()
        return n


def _bySeqDesc(entry):
    return -entry.seq
