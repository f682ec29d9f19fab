"""
Dead-lettering: the x-death copy, the cycle rule and the republish of
messages that left a queue rejected, expired or pushed out by a length limit.

Semantics follow RabbitMQ 3.10 classic queues (https://www.rabbitmq.com/docs/dlx,
``rabbit_dead_letter``) plus 3.13's ``x-last-death-*`` headers; the rules,
including the repair of a malformed ``x-death`` a publisher may send, are
written down in docs/dead-lettering.md.

- :func:`deadLetterCopy`: the republished copy and its new x-death list (pure).
- :func:`isCycle`: RabbitMQ's ``is_cycle/2`` (pure).
- :func:`deathCount`: an x-death ``count`` read defensively (pure).
- :class:`DeadLetterer`: one per vhost; routes copies through the queue's
  dead-letter exchange and keeps the vhost's dead-letter counters.
- :class:`HeldDeadLetters`: one per queue; the at-least-once dead letters no
  queue took yet, tried again every :data:`DLX_RETRY_MS`.

Nothing here does I/O; time comes from the vhost's injected clock.
"""

from itertools import groupby
from operator import itemgetter

from twisted.logger import Logger

from otter_tx.amqp.codec import TaggedInt, Timestamp, encodeProperties
from otter_tx.amqp.errors import loggable
from otter_tx.broker.message import Message

log = Logger()

#: how long a quorum queue with ``x-dead-letter-strategy: at-least-once``
#: waits before it tries again to dead-letter the messages no queue took,
#: ms (RabbitMQ's ``dead_letter_worker_publisher_confirm_timeout``, 180000;
#: a new binding alone does not send them sooner, as on RabbitMQ)
DLX_RETRY_MS = 180000

#: largest x-death count kept (int64, the type RabbitMQ writes it as)
MAX_DEATH_COUNT = 2 ** 63 - 2


def deathCount(value):
    """
    An x-death entry's ``count`` as a non-negative int: 0 for anything a
    publisher may have put there that is not one (``"abc"``, a float, a
    table, a negative or out-of-range number, a boolean).
    """
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DEATH_COUNT:
        return int(value)
    return 0


def isCycle(qname, deaths):
    """
    RabbitMQ's ``is_cycle/2``: walking ``deaths`` (the x-death list, newest
    first) up to the first entry for queue ``qname`` (str), a cycle is fully
    automatic when no entry on the way (including the match) has reason
    ``rejected``.  Returns bool; a fully automatic cycle is dropped.
    """
    for d in deaths:
        if not isinstance(d, dict):
            return False
        if d.get("reason") == "rejected":
            return False
        if d.get("queue") == qname:
            return True
    return False


def deadLetterCopy(message, queueName, dlx, reason, dlrk, nowSeconds, ignoreDeaths=False):
    """
    The dead-lettered copy of ``message`` and its new x-death list.

    :param message: the :class:`~otter_tx.broker.message.Message` that left
        queue ``queueName`` (str) for ``reason`` (``"expired"``,
        ``"rejected"`` or ``"maxlen"``).
    :param dlx: the dead-letter exchange name (str), the copy's exchange.
    :param dlrk: the dead-letter routing key (str) or ``None`` to keep the
        original keys.
    :param nowSeconds: the clock's time in seconds (x-death ``time`` of a
        first death).
    :param ignoreDeaths: start a fresh x-death list, whatever the message
        carries.
    :return: ``(copy, deaths)``: the new Message and its x-death list (list
        of dicts, newest first).

    A malformed ``x-death`` from a publisher never raises
    (docs/dead-lettering.md): a value that is not an array is replaced,
    entries that are not tables are dropped, and a matching entry whose
    ``count`` is not a non-negative integer counts from 0 again.
    """
    props = dict(message.props)
    headers = dict(props.get("headers") or {})
    expiration = props.pop("expiration", None)
    routingKeys = [message.routingKey]
    cc = headers.get("CC")
    if isinstance(cc, list):
        routingKeys.extend(k for k in cc if isinstance(k, str))
        if dlrk is not None:
            del headers["CC"]
    deaths = None if ignoreDeaths else headers.get("x-death")
    deaths = [d for d in deaths if isinstance(d, dict)] if isinstance(deaths, list) else []
    found = None
    for i, d in enumerate(deaths):
        if d.get("queue") == queueName and d.get("reason") == reason:
            found = i
            break
    if found is not None:
        d = dict(deaths.pop(found))
        d["count"] = TaggedInt(deathCount(d.get("count")) + 1, "l")
        deaths.insert(0, d)
    else:
        d = {
            "count": TaggedInt(1, "l"),
            "reason": reason,
            "queue": queueName,
            "time": Timestamp(int(nowSeconds)),
            "exchange": message.exchange,
            "routing-keys": routingKeys,
        }
        if expiration is not None:
            d["original-expiration"] = expiration
        deaths.insert(0, d)
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queueName
        headers["x-first-death-exchange"] = message.exchange
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queueName
    headers["x-last-death-exchange"] = message.exchange
    headers["x-death"] = deaths
    props["headers"] = headers
    copy = Message(
        dlx,
        dlrk if dlrk is not None else message.routingKey,
        encodeProperties(props),
        message.body,
        props,
    )
    return copy, deaths


def _countGlobal(vhost, queue, strategy, reason, n):
    """
    The broker-wide ``rabbitmq_global_messages_dead_lettered_<reason>_total``
    count of ``queue``'s type and ``strategy`` (``Broker.deadLetterCounts``).
    """
    counts = getattr(vhost.broker, "deadLetterCounts", None)
    if counts is not None:
        key = (queue.queueType, strategy, reason)
        counts[key] = counts.get(key, 0) + n


class DeadLetterer:
    """
    The dead-lettering of one vhost: republishes copies through a queue's
    dead-letter exchange with :meth:`VHost.route
    <otter_tx.broker.vhost.VHost.route>` and counts them in the vhost's
    ``deadLettered`` (reason -> int) and ``deadLetterDropped`` (int).

    :param vhost: the :class:`~otter_tx.broker.vhost.VHost`.
    """

    def __init__(self, vhost):
        self.vhost = vhost
        self._missingDlxLogged = set()

    def deadLetter(self, queue, messages, reason, retry=False):
        """
        Dead-letter ``messages`` (list of Message) that left ``queue`` for
        ``reason`` (``expired``, ``rejected``, ``maxlen`` or
        ``delivery_limit``): republish a copy with x-death headers to the
        queue's dead-letter exchange.  A queue without one drops them; a
        missing DLX drops them (logged once per queue and exchange); a fully
        automatic cycle is dropped (RabbitMQ dlx.html, rabbit_dead_letter).
        A quorum queue with ``x-dead-letter-strategy: at-least-once`` keeps
        instead the messages no queue took (:meth:`_atLeastOnce`); ``retry``
        is True when those are tried again (they are not counted as leaving
        the queue twice).  Never raises.
        """
        s = queue.settings
        vhost = self.vhost
        n = len(messages)
        if not retry:
            # message rates (otter_tx.broker.stats): what left, by reason
            # (a held at-least-once dead letter tried again left only once)
            queue.leftBy[reason] = queue.leftBy.get(reason, 0) + n
            vhost.leftBy[reason] = vhost.leftBy.get(reason, 0) + n
        if s.dlx is not None and s.dlStrategy == "at-least-once":
            self._atLeastOnce(queue, messages, reason)
            return
        if s.dlx is None:
            # RabbitMQ's dead_letter_strategy="disabled" counters
            counts = vhost.deadLetterDisabled
            counts[reason] = counts.get(reason, 0) + len(messages)
            _countGlobal(vhost, queue, "disabled", reason, len(messages))
            return
        ex = vhost.exchanges.get(s.dlx)
        if ex is None:
            key = (queue.name, s.dlx)
            if key not in self._missingDlxLogged:
                self._missingDlxLogged.add(key)
                log.warn(
                    "Dead-letter exchange {dlx!r} of queue {queue!r} in vhost {vhost!r} does not "
                    "exist; dead-lettered messages are dropped",
                    dlx=loggable(s.dlx),
                    queue=loggable(queue.name),
                    vhost=loggable(vhost.name),
                )
            vhost.deadLetterDropped += len(messages)
            return
        vhost.deadLettered[reason] = vhost.deadLettered.get(reason, 0) + n
        queue.deadLetteredBy[reason] = queue.deadLetteredBy.get(reason, 0) + n
        _countGlobal(vhost, queue, "at_most_once", reason, n)
        for m in messages:
            try:
                self._deadLetterOne(ex, queue, m, reason)
            except Exception:
                # a bug of ours: lose this one copy, not the rest of the
                # batch, and never fail the operation (a publish pushing
                # the message out of a full queue) that caused it
                log.failure("dead-lettering a message from queue {queue!r} failed",
                            queue=loggable(queue.name))

    def _atLeastOnce(self, queue, messages, reason):
        """
        RabbitMQ 3.10's at-least-once dead-lettering on one node: a message
        that reaches no queue (its DLX is missing or routes nowhere) stays
        with ``queue`` (its :class:`HeldDeadLetters`, ``messages_dlx`` in
        its JSON), tried again every :data:`DLX_RETRY_MS`.
        """
        vhost = self.vhost
        ex = vhost.exchanges.get(queue.settings.dlx)
        held = []
        for m in messages:
            try:
                routed = ex is not None and self._deadLetterOne(ex, queue, m, reason)
            except Exception:
                log.failure("dead-lettering a message from queue {queue!r} failed",
                            queue=loggable(queue.name))
                routed = True  # a bug of ours: do not retry it forever
            if not routed:
                held.append(m)
        done = len(messages) - len(held)
        if done:
            vhost.deadLettered[reason] = vhost.deadLettered.get(reason, 0) + done
            queue.deadLetteredBy[reason] = queue.deadLetteredBy.get(reason, 0) + done
            _countGlobal(vhost, queue, "at_least_once", reason, done)
            # (routed to a queue: RabbitMQ's dead_lettered_confirmed once the target confirms)
            _countGlobal(vhost, queue, "at_least_once", "confirmed", done)
        if held:
            queue.heldDeadLetters.hold(held, reason)

    def _deadLetterOne(self, ex, queue, m, reason):
        """
        Republish one dead-lettered ``m`` through ``ex`` (see
        :meth:`deadLetter`); False when no queue took it, else True.
        """
        vhost = self.vhost
        s = queue.settings
        dlrk = s.dlrk
        now = vhost.clock.seconds()
        try:
            copy, deaths = deadLetterCopy(m, queue.name, s.dlx, reason, dlrk, now)
        except Exception:
            # an x-death shape deadLetterCopy did not foresee: dead-letter
            # the message with a fresh x-death rather than lose it
            log.failure("dead-lettering a message from queue {queue!r}: its x-death is ignored",
                        queue=loggable(queue.name))
            copy, deaths = deadLetterCopy(m, queue.name, s.dlx, reason, dlrk, now, ignoreDeaths=True)
        keys = [dlrk] if dlrk is not None else m.routingKeys()
        copy.extraKeys = None if dlrk is not None else m.extraKeys
        targets = vhost.route(ex, copy, keys)
        if not targets:
            return False
        vhost.broker.nextMessageId(copy)
        for q in list(targets):
            if reason != "rejected" and isCycle(q.name, deaths):
                log.warn(
                    "Message dropped. Dead-letter queues cycle detected: {queue!r}",
                    queue=loggable(q.name),
                )
                continue
            q.enqueue(copy)
        return True


class HeldDeadLetters:
    """
    The dead letters of one quorum queue with ``x-dead-letter-strategy:
    at-least-once`` that no queue took yet (see
    :meth:`DeadLetterer._atLeastOnce`), tried again every
    :data:`DLX_RETRY_MS`.  They are not ready messages: RabbitMQ counts
    them as ``messages_dlx`` / ``message_bytes_dlx``.  Held in memory (on
    a replicated quorum queue's followers too: docs/cluster.md).

    :param queue: the :class:`~otter_tx.broker.queue.Queue` (its ``clock``,
        ``deleted``, ``stopped`` and its vhost's ``deadLetterer``).
    :ivar messages: ``(Message, reason)`` pairs in order (list), or None.
    :ivar bytes: their body bytes (int).
    """

    def __init__(self, queue):
        self._queue = queue
        self.messages = None
        self.bytes = 0
        self._retry = None

    def hold(self, messages, reason):
        """
        Keep ``messages`` (list of Message) dead-lettered for ``reason``
        (str) and try them again in :data:`DLX_RETRY_MS`; nothing once the
        queue is deleted.
        """
        q = self._queue
        if q.deleted:
            return
        held = self.messages
        if held is None:
            held = self.messages = []
        for m in messages:
            held.append((m, reason))
            self.bytes += m.size
        # a replicated quorum queue's followers hold them too (otter_tx/cluster/replication.py)
        replicate = getattr(q.journal, "dlxHeld", None)
        if replicate is not None:
            replicate(q, messages, reason)
        if self._retry is None and not q.stopped:
            self._retry = q.clock.callLater(DLX_RETRY_MS / 1000.0, self._retryAll)

    def _retryAll(self):
        """Dead-letter the held messages again, in order, a run of one reason at a time."""
        self._retry = None
        held, self.messages = self.messages or [], None
        self.bytes = 0
        q = self._queue
        replicate = getattr(q.journal, "dlxRetried", None)
        if replicate is not None and held:
            replicate(q)
        for reason, run in groupby(held, key=itemgetter(1)):
            q.vhost.deadLetterer.deadLetter(q, [m for m, _ in run], reason, retry=True)

    def stop(self):
        """Cancel the retry timer (broker stop); the messages stay counted."""
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None

    def drop(self):
        """Forget the held messages and the retry timer (queue deleted)."""
        self.stop()
        self.messages = None
        self.bytes = 0
