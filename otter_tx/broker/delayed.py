"""
The ``x-delayed-message`` exchange type, compatible with RabbitMQ's
rabbitmq-delayed-message-exchange plugin (its README and
``rabbit_exchange_type_delayed_message.erl``; ../shared/reference section 5a),
plus scheduled messages you can see and cancel (issue 11; docs/delayed.md).

A message published with a header ``x-delay`` of 1 to 4294967295 ms is held
by the exchange and routed, with the routing rules of ``x-delayed-type``,
when the delay is over. Until then it has no route: a mandatory publish gets
``basic.return`` at once, a confirm is an ack at once, and an
``alternate-exchange`` receives it at once. Those are the plugin's documented
limitations, and they are reproduced here. At fire time the header is
replaced by its negation, so a second delayed exchange does not delay the
message again.

otter_tx additions:

- ``x-delay-until``: an absolute due time (an AMQP timestamp, or epoch
  milliseconds as an integer or a numeric string), as Service Bus's
  scheduled enqueue (:func:`messageDue`);
- every held message has a broker id (the exchange's sequence number, as a
  decimal string, stable across restarts), delivered in the header
  ``x-delayed-id``;
- the held set of an exchange (:class:`HeldSet`) is kept in due order, so a
  page of it can be listed without copying or sorting the set, and one
  message can be cancelled by id or by ``message_id``, or all purged; these
  are written to the store when the exchange is durable;
- the same operations over AMQP: a message with the header
  ``x-delayed-command`` published to the exchange is a command, answered to
  its ``reply_to`` (:meth:`DelayedExchange.runCommand`); the ``schedule``
  command holds the message itself and answers its broker id.

Held messages are written to the store when the exchange is durable, with
their absolute fire time, so downtime counts.

After an unclean stop (a crash, ``kill -9``), a held message that was due
before the broker came back may already have fired: the store records a
fire (the held entry's removal) in the same group commit as the copies it
enqueued, but a consumer can get a copy before that commit, and a crash in
between leaves the message held.  Such a message fires again at boot marked
redelivered, as a queue marks its recovered messages (AMQP 0-9-1
``basic.deliver`` ``redelivered``: the message may have been delivered
before), with the same ``x-delayed-id`` (:meth:`DelayedExchange.restore`).
"""

import json
from bisect import bisect_left, insort
from decimal import Decimal

from otter_tx.amqp.codec import Timestamp, TaggedFloat, encodeProperties, jsonable
from otter_tx.amqp.errors import AMQPError, commandInvalid, preconditionFailed
from otter_tx.broker.access import READ, WRITE, Access
from otter_tx.broker.exchange import EXCHANGE_TYPES, Exchange
from otter_tx.broker.expiry import _EPSILON_MS, OneTimer, nowMs
from otter_tx.broker.message import Message
from otter_tx.store.keys import delayedKey

DELAYED_TYPE = "x-delayed-message"

#: the plugin's cap: Erlang timers take at most 2^32 - 1 ms
MAX_DELAY_MS = 4294967295

#: header with an absolute due time (AMQP timestamp, or epoch ms)
DELAY_UNTIL = "x-delay-until"

#: header naming a command (``list``, ``cancel``, ``purge``) to the exchange
COMMAND = "x-delayed-command"

#: header carrying a held message's broker id when it is delivered
ID_HEADER = "x-delayed-id"

#: header of a command's reply: the HTTP-like status (200, 204, 400, 403, 404)
STATUS_HEADER = "x-delayed-status"

#: broker ids a durable exchange reserves in the store at a time: after a
#: restart its ids go on after the reserved ones, so an id is never given to
#: two messages of one exchange (:meth:`DelayedExchange.idsReserved`)
ID_BLOCK = 1000

#: paging of held-message lists (RabbitMQ's management API page sizes)
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500


def validateDelayedArguments(arguments):
    """
    Check ``x-delayed-type``: 406 when it is missing, not a string, or
    ``x-delayed-message`` itself; 503 for an unknown type (RabbitMQ 3.10's
    ``check_type``).
    """
    t = arguments.get("x-delayed-type")
    if not isinstance(t, str):
        raise preconditionFailed("Invalid argument, 'x-delayed-type' must be an existing exchange type")
    if t == DELAYED_TYPE:
        raise preconditionFailed("Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
    if t not in EXCHANGE_TYPES:
        raise commandInvalid("unknown exchange type '%s'" % (t,))


def _integer(v):
    """
    A header value as an int: integers as they are, strings parsed as
    integers, floats and decimals truncated; None for anything else
    (booleans, NaN, infinity, unparsable strings, tables...).
    """
    if v is None or type(v) is bool:
        return None
    if isinstance(v, int):
        return int(v)
    if isinstance(v, (float, TaggedFloat, Decimal)):
        try:
            return int(v)
        except (ValueError, OverflowError):
            # NaN or infinity from a publisher
            return None
    if isinstance(v, (str, bytes)):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def messageDelay(message):
    """
    The delay in ms that ``message``'s ``x-delay`` header asks for, or None
    when it must be routed at once.

    Integers are used as they are, strings are parsed as integers, and
    floats and decimals are truncated. Anything else, a missing header, an
    unparsable string (the plugin crashes on one), NaN or infinity, or a
    value outside 1..4294967295 means no delay.  Never raises: a malformed
    ``x-delay`` from one publisher affects only its own message.
    """
    headers = message.headers
    if not headers:
        return None
    d = _integer(headers.get("x-delay"))
    if d is not None and 0 < d <= MAX_DELAY_MS:
        return d
    return None


def delayUntil(message):
    """
    The absolute due time in epoch ms of ``message``'s ``x-delay-until``
    header, or None when it has no usable one.

    An AMQP timestamp (type ``T``, whole seconds) counts in seconds; an
    integer, a numeric string, or a float or decimal (truncated) counts in
    epoch milliseconds.  Zero, negative and malformed values are not
    usable.  Never raises.
    """
    headers = message.headers
    if not headers:
        return None
    v = headers.get(DELAY_UNTIL)
    if isinstance(v, Timestamp):
        return int(v) * 1000 if v > 0 else None
    until = _integer(v)
    if until is None or until <= 0:
        return None
    return until


def messageDue(message, now):
    """
    When ``message`` is due, in ms on the clock's time base (epoch ms on
    the real reactor), or None when it must be routed at once; ``now`` is
    the clock's time in ms.

    A usable ``x-delay-until`` (:func:`delayUntil`) takes precedence over
    ``x-delay``; an instant not after ``now``, or more than 4294967295 ms
    after it (``x-delay``'s cap), routes the message at once.  A malformed
    ``x-delay-until`` is ignored, so ``x-delay`` applies.  Never raises.
    """
    until = delayUntil(message)
    if until is not None:
        if now < until <= now + MAX_DELAY_MS:
            return until
        return None
    d = messageDelay(message)
    if d is None:
        return None
    return now + d


class HeldSet(OneTimer):
    """
    Held messages in due order, with one timer.

    Entries are ``(due, seq, message)`` tuples (``due`` in ms on the clock's
    time base, ``seq`` the broker id, unique per exchange) in a list of
    sorted chunks of at most ``2 * LOAD`` entries (as the ``sortedcontainers``
    package does): inserting or removing one is O(log n + LOAD), and a page
    at any offset is found by walking the chunk lengths (n / LOAD steps),
    never by copying or sorting the whole set.  ``byId`` maps seq to its
    entry and ``byMessageId`` a ``message_id`` to the seq (int) or the set of
    seqs holding it.  One ``IDelayedCall`` is kept for the earliest due time
    (:class:`~otter_tx.broker.expiry.OneTimer`).

    :param clock: an ``IReactorTime``.
    :param onDue: called as ``onDue(entries)`` with the due entries, in due
        order, after they were removed from the set.
    :param lateness: a :class:`~otter_tx.broker.lateness.LatenessHistogram`
        that observes how many ms after its due time each entry was released;
        None to measure nothing.
    """

    LOAD = 500

    def __init__(self, clock, onDue, lateness=None):
        self._clock = clock
        self._onDue = onDue
        self._lateness = lateness
        self._chunks = []
        self._maxes = []
        self.byId = {}
        self.byMessageId = {}

    def __len__(self):
        return len(self.byId)

    def add(self, seq, message, due):
        """Hold ``message`` as ``seq`` until ``due`` (ms)."""
        entry = (due, seq, message)
        self.byId[seq] = entry
        mid = message.props.get("message_id") if message.props else None
        if mid is not None:
            have = self.byMessageId.get(mid)
            if have is None:
                self.byMessageId[mid] = seq
            elif type(have) is set:
                have.add(seq)
            else:
                self.byMessageId[mid] = {have, seq}
        chunks, maxes = self._chunks, self._maxes
        if not chunks:
            chunks.append([entry])
            maxes.append(entry)
        else:
            i = bisect_left(maxes, entry)
            if i == len(maxes):
                i -= 1
                chunks[i].append(entry)
                maxes[i] = entry
            else:
                insort(chunks[i], entry)
            chunk = chunks[i]
            if len(chunk) > 2 * self.LOAD:
                chunks[i:i + 1] = [chunk[:self.LOAD], chunk[self.LOAD:]]
                maxes[i:i + 1] = [chunk[self.LOAD - 1], chunk[-1]]
        if self._timerAt is None or due < self._timerAt:
            self._schedule(due)

    def remove(self, seq):
        """Forget held message ``seq``; its entry, or None when it is not held."""
        entry = self.byId.pop(seq, None)
        if entry is None:
            return None
        self._forgetMessageId(entry)
        chunks, maxes = self._chunks, self._maxes
        i = bisect_left(maxes, entry)
        chunk = chunks[i]
        del chunk[bisect_left(chunk, entry)]
        if not chunk:
            del chunks[i]
            del maxes[i]
        else:
            maxes[i] = chunk[-1]
        if not chunks:
            self._cancel()
        return entry

    def _forgetMessageId(self, entry):
        props = entry[2].props
        mid = props.get("message_id") if props else None
        if mid is None:
            return
        have = self.byMessageId.get(mid)
        if type(have) is set:
            have.discard(entry[1])
            if len(have) == 1:
                self.byMessageId[mid] = have.pop()
        elif have == entry[1]:
            del self.byMessageId[mid]

    def withMessageId(self, messageId):
        """The seqs (list of int) of the held messages whose ``message_id`` is ``messageId``."""
        have = self.byMessageId.get(messageId)
        if have is None:
            return []
        if type(have) is set:
            return sorted(have)
        return [have]

    def page(self, offset, count):
        """Up to ``count`` entries from position ``offset`` in due order (a list)."""
        out = []
        for chunk in self._chunks:
            if offset >= len(chunk):
                offset -= len(chunk)
                continue
            out.extend(chunk[offset:offset + count - len(out)])
            offset = 0
            if len(out) >= count:
                break
        return out

    def rank(self, due):
        """How many entries are due before ``due`` (ms): the position of the first due at or after it."""
        n = 0
        for chunk in self._chunks:
            if chunk[-1][0] < due:
                n += len(chunk)
                continue
            return n + bisect_left(chunk, (due,))
        return n

    def clear(self):
        """Forget everything and cancel the timer; returns how many were held."""
        n = len(self.byId)
        self._chunks = []
        self._maxes = []
        self.byId = {}
        self.byMessageId = {}
        self._cancel()
        return n

    def _fire(self):
        self._timer = None
        self._timerAt = None
        self.release()

    def release(self):
        """Fire every entry due now and re-arm the timer; returns how many fired."""
        exact = nowMs(self._clock)
        now = exact + _EPSILON_MS
        chunks, maxes = self._chunks, self._maxes
        due = []
        while chunks:
            chunk = chunks[0]
            if chunk[-1][0] <= now:
                due.extend(chunk)
                del chunks[0]
                del maxes[0]
                continue
            k = bisect_left(chunk, (now, float("inf")))
            due.extend(chunk[:k])
            del chunk[:k]
            break
        byId = self.byId
        for entry in due:
            del byId[entry[1]]
            if self.byMessageId:
                self._forgetMessageId(entry)
        lateness = self._lateness
        if lateness is not None:
            for entry in due:
                lateness.observe(exact - entry[0])
        if chunks:
            self._schedule(chunks[0][0][0])
        else:
            self._cancel()
        if due:
            self._onDue(due)
        return len(due)


def pageParameters(page, pageSize):
    """
    ``(page, page_size)`` as ints from query or JSON values (``None``: 1
    and 100), or raise :class:`ValueError` with RabbitMQ's text ``Invalid
    pagination parameters: page number P, page size S`` (page >= 1, page
    size 1..500, as ``rabbit_mgmt_util``).
    """
    p = 1 if page is None else page
    s = DEFAULT_PAGE_SIZE if pageSize is None else pageSize
    try:
        if type(p) is bool or type(s) is bool or isinstance(p, float) or isinstance(s, float):
            raise ValueError
        pn, sn = int(p), int(s)
    except (TypeError, ValueError):
        pn = sn = None
    if pn is None or pn < 1 or sn < 1 or sn > MAX_PAGE_SIZE:
        raise ValueError("Invalid pagination parameters: page number %s, page size %s" % (p, s))
    return pn, sn


class DelayedExchange(Exchange):
    """
    An ``x-delayed-message`` exchange. Bindings use the routing table of
    its ``x-delayed-type``.

    :ivar held: how many messages are waiting (RabbitMQ's ``messages_delayed``).
    """

    delayed = True
    #: messages taken into hold since the exchange was declared (message rates)
    delayedCount = 0
    #: before the broker id in ``x-delayed-id`` and lists: in a cluster ``"NODE:"``, so ids
    #: are unique across nodes (otter_tx/cluster/delayedrepl.py); empty on a single node
    idPrefix = ""
    #: in a cluster, what runs ``list``, ``cancel`` and ``purge`` on every node (Deferreds;
    #: :class:`~otter_tx.cluster.delayedrepl.DelayedReplication`), else None
    cluster = None

    def __init__(self, vhost, name, type, durable, autoDelete, internal, arguments):
        Exchange.__init__(self, vhost, name, arguments["x-delayed-type"], durable, autoDelete,
                          internal, arguments)
        self.type = DELAYED_TYPE
        self.delayedType = arguments["x-delayed-type"]
        self._set = HeldSet(vhost.clock, self._fire, vhost.broker.reapingLateness.delayed)
        self._seq = 0
        #: broker ids up to this one (int) are reserved in the store (durable exchanges)
        self.idsReserved = 0
        self.journal = None
        #: seqs of restored held messages that may have fired before an
        #: unclean stop: they fire marked redelivered (:meth:`restore`)
        self._mayHaveFired = set()

    @property
    def held(self):
        """Messages waiting for their due time (int)."""
        return len(self._set)

    def storeKey(self):
        """The store's pseudo-queue key for this exchange's held messages."""
        return delayedKey(self.vhost.name, self.name)

    def accept(self, message):
        """
        Routing step of a message published to (or reaching) this exchange:
        True when the exchange took it (held until due, or run or dropped as
        a command), False when it must be routed now.
        """
        headers = message.headers
        if headers and COMMAND in headers:
            self.runCommand(message)
            return True
        now = nowMs(self.vhost.clock)
        due = messageDue(message, now)
        if due is None:
            return False
        if not message.storeId:
            self.vhost.broker.nextMessageId(message)
        self._add(message, due, now)
        return True

    def _add(self, message, fireAt, now=None):
        """Hold a newly published ``message`` until ``fireAt`` (ms), counted in the ``delayed`` rate."""
        self.delayedCount += 1
        self.vhost.delayedCount += 1
        self._seq += 1
        self._set.add(self._seq, message, fireAt)
        if self.journal is not None:
            if self._seq > self.idsReserved:
                # written before the message: it is in the same or an earlier group commit
                self.idsReserved = self._seq + ID_BLOCK - 1
                self.journal.idsReserved(self)
            self.journal.held(self, message, self._seq, fireAt, now)

    def restoreIds(self, reserved):
        """
        Boot: broker ids up to ``reserved`` (int, from the store) may have
        been given before the stop, to messages held then and maybe fired
        since; new messages get ids above them.
        """
        self.idsReserved = max(self.idsReserved, reserved)
        self._seq = max(self._seq, reserved)

    def restore(self, message, seq, fireAt, redelivered=False):
        """
        Put back a held message read from the store (boot only): ``seq``
        (int) is its broker id, ``fireAt`` its due time (ms).

        ``redelivered`` is the store's flag for the entry, which the
        durable store sets on every entry after an unclean stop
        (:mod:`otter_tx.store.sqlite`, "Clean stop").  When it is set and
        the message was due by now (so it may have fired before the stop,
        its removal not yet committed), it fires marked redelivered
        (:meth:`Queue.enqueue <otter_tx.broker.queue.Queue.enqueue>`), with
        the same ``x-delayed-id``.  One due later cannot have fired: the
        broker was down until now.
        """
        self._seq = max(self._seq, seq)
        self._set.add(seq, message, fireAt)
        if redelivered and fireAt <= nowMs(self.vhost.clock) + _EPSILON_MS:
            self._mayHaveFired.add(seq)

    def _fire(self, entries):
        vhost = self.vhost
        mayHaveFired = self._mayHaveFired
        for _, seq, message in entries:
            if self.journal is not None:
                self.journal.released(self, message)
            again = False
            if mayHaveFired and seq in mayHaveFired:
                mayHaveFired.discard(seq)
                again = True
            if self.deleted:
                continue
            out = _swapDelay(message, self.idPrefix + str(seq) if self.idPrefix else seq)
            vhost.broker.nextMessageId(out)
            for q in vhost.route(self, out, out.routingKeys()):
                q.enqueue(out, None, again)

    # --- the held set: list, cancel, purge (HTTP and AMQP) -----------------------

    def heldPage(self, page, pageSize, dueFrom=None):
        """
        One page (1-based) of the held messages in due order, as
        ``{"items": [item...], "total_count", "page", "page_size"}`` with
        :func:`heldItem`'s items; with ``dueFrom`` (epoch ms) instead the
        page holding the first message due at or after it (the last page
        when none is), ``page`` saying which.
        """
        if dueFrom is not None:
            page = min(self._set.rank(dueFrom), max(0, len(self._set) - 1)) // pageSize + 1
        entries = self._set.page((page - 1) * pageSize, pageSize)
        items = [heldItem(*e) for e in entries]
        if self.idPrefix:
            for item in items:
                item["id"] = self.idPrefix + item["id"]
        return {"items": items, "total_count": len(self._set),
                "page": page, "page_size": pageSize}

    def cancel(self, heldId):
        """
        Drop held message ``heldId`` (its broker id: an int, or a string of
        ASCII digits); True when it was held.  Written to the store
        (durable exchanges).
        """
        if self.idPrefix and isinstance(heldId, str) and heldId.startswith(self.idPrefix):
            heldId = heldId[len(self.idPrefix):]
        if isinstance(heldId, str) and heldId.isascii() and heldId.isdigit():
            seq = int(heldId)
        elif type(heldId) is int:
            seq = heldId
        else:
            return False
        entry = self._set.remove(seq)
        if entry is None:
            return False
        self._mayHaveFired.discard(seq)
        if self.journal is not None:
            self.journal.released(self, entry[2])
        return True

    def cancelMessageId(self, messageId):
        """Drop every held message whose ``message_id`` is ``messageId``; returns how many."""
        seqs = self._set.withMessageId(messageId)
        for seq in seqs:
            self.cancel(seq)
        return len(seqs)

    def purgeHeld(self):
        """Drop every held message (one store call); returns how many there were."""
        n = self._set.clear()
        self._mayHaveFired.clear()
        if self.journal is not None:
            self.journal.heldPurged(self)
        return n

    def stopTimers(self):
        """Broker shutdown: no more firing."""
        self._set.freeze()

    def discardHeld(self):
        """
        The exchange was deleted: its held messages are dropped (the
        store drops them with the exchange's pseudo-queue entity), so an
        exchange re-created with the same name starts empty.
        """
        self._set.clear()
        self._mayHaveFired.clear()

    # --- commands over AMQP -----------------------------------------------------------

    def runCommand(self, message):
        """
        Run the ``x-delayed-command`` of ``message`` and answer it to its
        ``reply_to`` through the default exchange.

        A command runs only when a client published it straight to this
        exchange (AMQP or the HTTP publish, both of which record the
        authenticated user on the message); one reaching the exchange any
        other way (an exchange-to-exchange binding, an alternate exchange)
        is dropped unanswered.  The command runs as the publisher with the
        HTTP API's permission rule (:func:`checkHeldAccess`).  The reply has
        ``content_type`` ``application/json``, the request's
        ``correlation_id``, a header ``x-delayed-status`` (200, 201, 204,
        400, 403 or 404, as the HTTP API answers; 500 when the store failed
        to sync a durable exchange's change) and a JSON body: ``list`` ->
        the page object of ``GET .../delayed``; ``cancel`` ->
        ``{"cancelled": n}``; ``purge`` -> ``{"purged": n}``; ``schedule``
        -> ``{"id", "due"}`` (:meth:`_schedule`); an error ->
        ``{"error": ..., "reason": ...}``.  Never raises: a bad command is
        answered, the channel stays open.  A durable exchange answers after
        the store synced the change.
        """
        user = getattr(message, "commandUser", None)
        if user is None or message.exchange != self.name or self.deleted:
            return
        command = message.headers.get(COMMAND)
        if isinstance(command, bytes):
            command = command.decode("utf-8", "replace")
        status, body = self._command(user, command, message)
        replyTo = message.props.get("reply_to")
        if status is None:
            # run on every node of the cluster: ``body`` is a Deferred of (status, body), answered
            # once each node's store synced it
            body.addErrback(lambda f: (500, {"error": "internal_error", "reason": f.getErrorMessage()}))
            if replyTo:
                body.addCallback(lambda answer: self._reply(message, replyTo, *answer))
            return
        if not replyTo:
            return
        self._reply(message, replyTo, status, body)

    def _reply(self, message, replyTo, status, body):
        correlationId = message.props.get("correlation_id")

        def reply(status, body):
            props = {"content_type": "application/json", "headers": {STATUS_HEADER: status}}
            if correlationId is not None:
                props["correlation_id"] = correlationId
            vhost = self.vhost
            out = Message("", replyTo, encodeProperties(props), json.dumps(body).encode("utf-8"), props)
            vhost.publish(vhost.exchanges[""], out)

        if status in (201, 204) and self.journal is not None:
            self.journal.sync().addCallbacks(
                lambda _: reply(status, body),
                lambda f: reply(500, {"error": "internal_error",
                                      "reason": "store sync failed: %s" % (f.getErrorMessage(),)}))
        else:
            reply(status, body)

    def _command(self, userName, command, message):
        """``(status, body)`` of one command (see :meth:`runCommand`)."""
        if command not in ("list", "cancel", "purge", "schedule"):
            return 400, {"error": "bad_request",
                         "reason": "unknown x-delayed-command %r: use list, cancel, purge or schedule" % (command,)}
        if command == "schedule":
            return self._schedule(userName, message)
        body = message.body
        try:
            args = json.loads(body.decode("utf-8")) if body.strip() else {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            args = None
        if not isinstance(args, dict):
            return 400, {"error": "bad_request", "reason": "the body must be a JSON object or empty"}
        access = Access(self.vhost.broker, userName, self.vhost.name)
        try:
            checkHeldAccess(access, self.name, command)
        except AMQPError as e:
            return 403, {"error": "access_refused", "reason": e.text}
        if command == "list":
            try:
                page, size = pageParameters(args.get("page"), args.get("page_size"))
            except ValueError as e:
                return 400, {"error": "invalid_pagination_parameters", "reason": str(e)}
            if self.cluster is not None:
                return None, self.cluster.page(self, page, size).addCallback(lambda body: (200, body))
            return 200, self.heldPage(page, size)
        if command == "purge":
            if self.cluster is not None:
                return None, self.cluster.purge(self).addCallback(lambda n: (204, {"purged": n}))
            return 204, {"purged": self.purgeHeld()}
        if self.cluster is not None and (type(args.get("id")) in (str, int) or isinstance(args.get("message_id"), str)):
            if type(args.get("id")) in (str, int):
                d = self.cluster.cancel(self, heldId=args["id"])
            else:
                d = self.cluster.cancel(self, messageId=args["message_id"])
            return None, d.addCallback(lambda n: (204, {"cancelled": n}) if n else (
                404, {"error": "Object Not Found", "reason": "Not Found"}))
        if type(args.get("id")) in (str, int):
            n = 1 if self.cancel(args["id"]) else 0
        elif isinstance(args.get("message_id"), str):
            n = self.cancelMessageId(args["message_id"])
        else:
            return 400, {"error": "bad_request",
                         "reason": "cancel needs \"id\" (a string or an integer) or \"message_id\" (a string)"}
        if not n:
            return 404, {"error": "Object Not Found", "reason": "Not Found"}
        return 204, {"cancelled": n}

    def _schedule(self, userName, message):
        """
        The ``schedule`` command: hold ``message`` itself (body and
        properties, without the ``x-delayed-command`` header) until the due
        time of its ``x-delay`` / ``x-delay-until``, and answer 201 ``{"id":
        broker id, "due": epoch ms}``, as Service Bus's ScheduleMessage
        returns a sequence number; 400 when it has no due time in the
        future.  Needs write permission on the exchange.
        """
        try:
            checkHeldAccess(Access(self.vhost.broker, userName, self.vhost.name), self.name, "schedule")
        except AMQPError as e:
            return 403, {"error": "access_refused", "reason": e.text}
        now = nowMs(self.vhost.clock)
        due = messageDue(message, now)
        if due is None:
            return 400, {"error": "bad_request",
                         "reason": "schedule needs an x-delay or x-delay-until header that delays the message"}
        held = _withoutCommand(message)
        self.vhost.broker.nextMessageId(held)
        self._add(held, due, now)
        return 201, {"id": self.idPrefix + str(self._seq), "due": int(due)}


def _withoutCommand(message):
    """A copy of ``message`` without its ``x-delayed-command`` header (the message a ``schedule`` holds)."""
    headers = dict(message.headers)
    del headers[COMMAND]
    return message.withHeaders(headers)


def checkHeldAccess(access, exchangeName, operation):
    """
    The permission rule for an exchange's held messages (HTTP and AMQP),
    with RabbitMQ's model: ``list`` reads messages, so it needs **read** on
    the exchange (as binding a queue to it, which lets one see what it
    routes); ``cancel``, ``purge`` and ``schedule`` change what the exchange
    will publish, so they need **write** on it (as publishing to it).  Raises 403
    ACCESS_REFUSED ``access to exchange 'X' in vhost 'V' refused for user
    'U'``.
    """
    access.check(READ if operation == "list" else WRITE, "exchange", exchangeName)


def heldItem(due, seq, message):
    """
    One held message as JSON: ``{"id": str, "message_id": str or None,
    "due": epoch ms (int), "routing_key": str, "properties": {...},
    "payload_bytes": int}``.
    """

    props = message.props
    return {
        "id": str(seq),
        "message_id": props.get("message_id") if props else None,
        "due": int(due),
        "routing_key": message.routingKey,
        "properties": jsonable(props) if props else {},
        "payload_bytes": message.size,
    }


def _swapDelay(message, seq):
    """
    A copy of ``message`` to route at fire time: ``x-delay`` (when present)
    negated (type ``I``), and the broker id in ``x-delayed-id`` (str).
    """
    headers = dict(message.headers)
    if "x-delay" in headers:
        headers["x-delay"] = -(messageDelay(message) or 0)
    headers[ID_HEADER] = str(seq)
    return message.withHeaders(headers)
