"""
A virtual host: its exchanges, queues, bindings and policies, routing, and
dead-lettering.

Operations raise :class:`~otter_tx.amqp.errors.AMQPError` with RabbitMQ's
reply codes and texts (../shared/reference/rabbitmq-semantics.md section 6;
https://www.rabbitmq.com/docs/dlx for dead-lettering).  Nothing here does
I/O; time comes from the injected clock.
"""

import base64
import os

from twisted.logger import Logger

from otter_tx.amqp.codec import TaggedInt, Timestamp
from otter_tx.amqp.errors import (
    accessRefused,
    erlBinary,
    loggable,
    notFound,
    preconditionFailed,
    resourceLocked,
    rs,
)
from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker import arguments as A
from otter_tx.broker.delayed import (
    DELAYED_TYPE,
    DelayedExchange,
    messageDelay,
    validateDelayedArguments,
)
from otter_tx.broker.exchange import EXCHANGE_TYPES, Exchange
from otter_tx.broker.message import Message
from otter_tx.broker.policy import effectiveSettings, matchPolicy
from otter_tx.broker.queue import Queue
from otter_tx.broker.replyto import REPLY_PREFIX, REPLY_TO, ReplyToQueue

log = Logger()

PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


def _lockedText(qname, vhost):
    return (
        "cannot obtain exclusive access to locked %s. It could be originally declared on "
        "another connection or the exclusive property value does not match that of the "
        "original declaration." % (rs("queue", qname, vhost),)
    )


def serverNamedQueue():
    """
    ``amq.gen-`` + 22 base64url characters, as RabbitMQ names queues.
    """
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode()[:22]


class VHost:
    """
    One vhost.

    :ivar name: str.  :ivar clock: IReactorTime.
    :ivar exchanges: name -> :class:`Exchange`.
    :ivar queues: name -> :class:`Queue`.
    :ivar policies: name -> :class:`~otter_tx.broker.policy.Policy`.
    """

    def __init__(self, broker, name):
        self.broker = broker
        self.name = name
        self.clock = broker.clock
        self.exchanges = {}
        self.queues = {}
        self.policies = {}
        #: direct reply-to token -> ReplyToQueue
        self.replyTo = {}
        self._missingDlxLogged = set()
        self.deadLettered = {"expired": 0, "rejected": 0, "maxlen": 0}
        self.deadLetterDropped = 0
        self._declareDefaults()

    def _declareDefaults(self):
        self.exchanges[""] = Exchange(self, "", "direct", True, False, False, {})
        for name, type in PREDECLARED:
            self.exchanges[name] = Exchange(self, name, type, True, False, False, {})

    # --- exchanges ----------------------------------------------------------

    def getExchange(self, name):
        """
        The exchange ``name`` or 404 ``no exchange 'X' in vhost '/'``.
        """
        ex = self.exchanges.get(name)
        if ex is None:
            raise notFound("no %s" % (rs("exchange", name, self.name),))
        return ex

    def declareExchange(self, name, type, passive=False, durable=False, autoDelete=False,
                        internal=False, arguments=None):
        """
        exchange.declare.  Errors: 404 (passive, missing), 403 (``amq.``
        prefix, default exchange), 406 (inequivalent), 503 COMMAND_INVALID
        (unknown type, connection-level as in RabbitMQ).
        """
        arguments = arguments or {}
        if passive:
            if name == "":
                # rabbit_channel: check_not_default_exchange precedes the lookup
                raise accessRefused("operation not permitted on the default exchange")
            return self.getExchange(name)
        if type != DELAYED_TYPE and type not in EXCHANGE_TYPES:
            # rabbit_exchange:check_type runs first (connection-level 503)
            from otter_tx.amqp.errors import commandInvalid

            raise commandInvalid("unknown exchange type '%s'" % (type,))
        if name == "":
            raise accessRefused("operation not permitted on the default exchange")
        ex = self.exchanges.get(name)
        if ex is not None:
            if ex.type != type:
                raise preconditionFailed(
                    "inequivalent arg 'type' for %s: received '%s' but current is '%s'"
                    % (rs("exchange", name, self.name), type, ex.type)
                )
            A.assertFlagEquivalence("exchange", name, self.name, "durable", durable, ex.durable)
            A.assertFlagEquivalence(
                "exchange", name, self.name, "auto_delete", autoDelete, ex.autoDelete
            )
            A.assertFlagEquivalence("exchange", name, self.name, "internal", internal, ex.internal)
            A.assertArgsEquivalence(
                "exchange", name, self.name, arguments, ex.arguments, ("alternate-exchange",)
            )
            return ex
        if name.startswith("amq."):
            raise accessRefused(
                "exchange name '%s' contains reserved prefix 'amq.*'" % (name,)
            )
        if type == DELAYED_TYPE:
            validateDelayedArguments(arguments)
            ex = DelayedExchange(self, name, type, durable, autoDelete, internal, arguments)
            self.exchanges[name] = ex
            self.broker.entityChanged("exchange", self, ex)
            return ex
        ex = Exchange(self, name, type, durable, autoDelete, internal, arguments)
        self.exchanges[name] = ex
        self.broker.entityChanged("exchange", self, ex)
        return ex

    def deleteExchange(self, name, ifUnused=False):
        """
        exchange.delete; a missing exchange is not an error.  403 for the
        default exchange, 406 ``exchange 'X' in vhost '/' in use`` with
        if-unused.
        """
        if name == "":
            raise accessRefused("operation not permitted on the default exchange")
        ex = self.exchanges.get(name)
        if ex is None:
            return
        if name.startswith("amq."):
            raise accessRefused(
                "deletion of system %s not allowed" % (rs("exchange", name, self.name),)
            )
        if ifUnused and ex.hasBindings():
            raise preconditionFailed("%s in use" % (rs("exchange", name, self.name),))
        self._removeExchange(ex)

    def _removeExchange(self, ex):
        ex.deleted = True
        if ex.delayed:
            ex.discardHeld()
        del self.exchanges[ex.name]
        for dest, key, args in list(ex.routing.bindings()):
            self._unbind(ex, dest, key, args)
        # bindings where ex is the destination
        for other in list(self.exchanges.values()):
            if other.routing.removeDestination(ex):
                self._maybeAutoDeleteExchange(other)
        self.broker.entityChanged("exchange", self, ex, deleted=True)

    def _maybeAutoDeleteExchange(self, ex):
        if ex.autoDelete and not ex.hasBindings() and not ex.deleted and ex.name in self.exchanges:
            self._removeExchange(ex)

    # --- queues ---------------------------------------------------------------

    def getQueue(self, name, connection=None):
        """
        The queue ``name`` or 404 ``no queue 'Q' in vhost '/'``; 405 when it
        is exclusive to another connection.
        """
        q = self.queues.get(name)
        if q is None:
            raise notFound("no %s" % (rs("queue", name, self.name),))
        if q.owner is not None and q.owner is not connection:
            raise resourceLocked(_lockedText(name, self.name))
        return q

    def declareQueue(self, name, connection, passive=False, durable=False, exclusive=False,
                     autoDelete=False, arguments=None, serverNamed=False):
        """
        queue.declare; returns the :class:`Queue`.  ``name == ""`` gets a
        server-generated ``amq.gen-`` name.  Errors: 404 (passive), 405
        (exclusive elsewhere), 403 (``amq.`` prefix), 406 (invalid or
        inequivalent arguments).  Renews the x-expires lease.
        """
        arguments = arguments or {}
        if passive:
            if name == REPLY_TO or (name.startswith(REPLY_PREFIX) and name[len(REPLY_PREFIX):] in self.replyTo):
                return _ReplyToDeclared(name)
            q = self.getQueue(name, connection)
            q.touch()
            return q
        if name == "":
            name = serverNamedQueue()
        elif name.startswith("amq.") and not serverNamed:
            raise accessRefused("queue name '%s' contains reserved prefix 'amq.*'" % (name,))
        q = self.queues.get(name)
        if q is not None:
            if q.owner is not None and (q.owner is not connection or not exclusive):
                raise resourceLocked(_lockedText(name, self.name))
            if q.owner is None and exclusive:
                raise resourceLocked(_lockedText(name, self.name))
            A.assertFlagEquivalence("queue", name, self.name, "durable", durable and not exclusive, q.durable)
            A.assertFlagEquivalence("queue", name, self.name, "auto_delete", autoDelete, q.autoDelete)
            A.assertArgsEquivalence(
                "queue", name, self.name, arguments, q.arguments, A.EQUIVALENCE_ARGS
            )
            q.touch()
            return q
        A.validateQueueArguments(arguments, name, self.name)
        q = Queue(
            self,
            name,
            durable and not exclusive,
            autoDelete,
            connection if exclusive else None,
            arguments,
        )
        self.queues[name] = q
        self._applyPolicy(q)
        if connection is not None and exclusive:
            connection.exclusiveQueues.add(q)
        self.broker.entityChanged("queue", self, q)
        return q

    def deleteQueue(self, q, ifUnused=False, ifEmpty=False, reason="deleted"):
        """
        Delete queue ``q`` (a Queue); returns its ready message count.  406
        ``queue 'Q' in vhost '/' in use`` / ``... not empty``.  Its consumers
        get basic.cancel (consumer cancel notification); nothing is
        dead-lettered.
        """
        if q.deleted:
            return 0
        if ifUnused and q.consumers:
            raise preconditionFailed("%s in use" % (rs("queue", q.name, self.name),))
        if ifEmpty and q.readyCount:
            raise preconditionFailed("%s not empty" % (rs("queue", q.name, self.name),))
        if self.queues.get(q.name) is q:
            del self.queues[q.name]
        if q.owner is not None:
            q.owner.exclusiveQueues.discard(q)
        for (ex, key, _), args in list(q.bindings.items()):
            self._unbind(ex, q, key, args)
        n = q.shutdown()
        self.broker.entityChanged("queue", self, q, deleted=True)
        return n

    # --- bindings ---------------------------------------------------------------

    def bind(self, source, destination, routingKey, arguments):
        """
        Bind ``destination`` (Queue or Exchange) to exchange ``source``.
        403 for the default exchange.
        """
        if source.name == "" or (isinstance(destination, Exchange) and destination.name == ""):
            raise accessRefused(
                "operation not permitted on the default exchange"
            )
        if source.type == "headers":
            xmatch = (arguments or {}).get("x-match", "all")
            if xmatch not in ("all", "any", "all-with-x", "any-with-x"):
                raise preconditionFailed(
                    "Invalid x-match field value %s; expected all, any, all-with-x, or any-with-x"
                    % (erlBinary(xmatch.encode() if isinstance(xmatch, str) else str(xmatch).encode()),)
                )
        if source.routing.add(destination, routingKey, arguments):
            if isinstance(destination, Queue):
                destination.bindings[(source, routingKey, A.frozenArguments(arguments))] = arguments
            else:
                destination.inboundCount += 1
            self.broker.entityChanged("binding", self, (source, destination, routingKey, arguments))

    def unbind(self, source, destination, routingKey, arguments):
        """
        Remove a binding; a missing binding is not an error.
        """
        if source.name == "":
            raise accessRefused("operation not permitted on the default exchange")
        self._unbind(source, destination, routingKey, arguments)

    def _unbind(self, source, destination, routingKey, arguments):
        args = arguments
        if source.routing.remove(destination, routingKey, args):
            if isinstance(destination, Queue):
                destination.bindings.pop((source, routingKey, A.frozenArguments(args)), None)
            else:
                destination.inboundCount -= 1
            self.broker.entityChanged(
                "binding", self, (source, destination, routingKey, args), deleted=True
            )
            self._maybeAutoDeleteExchange(source)

    # --- routing ----------------------------------------------------------------

    def route(self, exchange, message, keys):
        """
        The set of queues ``message`` reaches from ``exchange`` with routing
        ``keys``, following exchange-to-exchange bindings and alternate
        exchanges (each exchange visited once).
        """
        if exchange.name == "":
            queues = self.queues
            if len(keys) == 1:
                q = queues.get(keys[0])
                if q is None and keys[0].startswith(REPLY_PREFIX):
                    q = self.replyTo.get(keys[0][len(REPLY_PREFIX):])
                return (q,) if q is not None else ()
            return {queues[k] for k in keys if k in queues}
        found = set()
        self._routeOne(exchange, message, keys, found)
        if not found and exchange.alternate is None:
            return found
        queues = set()
        visited = {exchange}
        pending = [(exchange, found)]
        while pending:
            ex, dests = pending.pop()
            ex.publishIn += 1
            routedHere = False
            for d in dests:
                if type(d) is Queue:
                    queues.add(d)
                    routedHere = True
                elif d not in visited:
                    visited.add(d)
                    sub = set()
                    self._routeOne(d, message, keys, sub)
                    pending.append((d, sub))
                    routedHere = True
            if routedHere:
                ex.publishOut += 1
            elif ex.alternate is not None:
                ae = self.exchanges.get(ex.alternate)
                if ae is not None and ae not in visited:
                    visited.add(ae)
                    sub = set()
                    self._routeOne(ae, message, keys, sub)
                    pending.append((ae, sub))
        return queues

    def _routeOne(self, exchange, message, keys, out):
        """
        One exchange's destinations for ``message``; an x-delayed-message
        exchange holds a delayed message instead (no destinations now).
        """
        if exchange.delayed:
            delay = messageDelay(message)
            if delay is not None:
                if not message.storeId:
                    self.broker.nextMessageId(message)
                exchange.hold(message, delay)
                return
        exchange.routing.route(message, keys, out)

    def publish(self, exchange, message):
        """
        Route and enqueue ``message``.  Returns ``(routed, rejected)``: how
        many queues it reached and whether any refused it (overflow
        ``reject-publish``).
        """
        queues = self.route(exchange, message, message.routingKeys())
        if not queues:
            return 0, False
        self.broker.nextMessageId(message)
        rejected = False
        for q in queues:
            if type(q) is ReplyToQueue:
                q.deliver(message)
            elif not q.enqueue(message):
                rejected = True
        return len(queues), rejected

    # --- dead-lettering ------------------------------------------------------

    def deadLetter(self, queue, messages, reason):
        """
        Dead-letter ``messages`` (list of Message) that left ``queue`` for
        ``reason`` (``expired``, ``rejected`` or ``maxlen``): republish a copy
        with x-death headers to the queue's dead-letter exchange.  A missing
        DLX drops them (logged once per queue and exchange); a fully
        automatic cycle is dropped (RabbitMQ dlx.html, rabbit_dead_letter).
        """
        s = queue.settings
        if s.dlx is None:
            return
        ex = self.exchanges.get(s.dlx)
        if ex is None:
            key = (queue.name, s.dlx)
            if key not in self._missingDlxLogged:
                self._missingDlxLogged.add(key)
                log.warn(
                    "Dead-letter exchange {dlx!r} of queue {queue!r} in vhost {vhost!r} does not "
                    "exist; dead-lettered messages are dropped",
                    dlx=loggable(s.dlx),
                    queue=loggable(queue.name),
                    vhost=loggable(self.name),
                )
            self.deadLetterDropped += len(messages)
            return
        self.deadLettered[reason] = self.deadLettered.get(reason, 0) + len(messages)
        for m in messages:
            try:
                self._deadLetterOne(ex, queue, m, reason)
            except Exception:
                # a bug of ours: lose this one copy, not the rest of the
                # batch, and never fail the operation (a publish pushing
                # the message out of a full queue) that caused it
                log.failure("dead-lettering a message from queue {queue!r} failed",
                            queue=loggable(queue.name))

    def _deadLetterOne(self, ex, queue, m, reason):
        """Republish one dead-lettered ``m`` through ``ex`` (see :meth:`deadLetter`)."""
        dlrk = queue.settings.dlrk
        try:
            copy, deaths = self._deadLetterCopy(m, queue, reason, dlrk)
        except Exception:
            # an x-death shape _deadLetterCopy did not foresee: dead-letter
            # the message with a fresh x-death rather than lose it
            log.failure("dead-lettering a message from queue {queue!r}: its x-death is ignored",
                        queue=loggable(queue.name))
            copy, deaths = self._deadLetterCopy(m, queue, reason, dlrk, ignoreDeaths=True)
        keys = [dlrk] if dlrk is not None else m.routingKeys()
        copy.extraKeys = None if dlrk is not None else m.extraKeys
        targets = self.route(ex, copy, keys)
        if not targets:
            return
        self.broker.nextMessageId(copy)
        for q in list(targets):
            if reason != "rejected" and _isCycle(q.name, deaths):
                log.warn(
                    "Message dropped. Dead-letter queues cycle detected: {queue!r}",
                    queue=loggable(q.name),
                )
                continue
            q.enqueue(copy)

    def _deadLetterCopy(self, m, queue, reason, dlrk, ignoreDeaths=False):
        """
        The dead-lettered copy of ``m`` and its new x-death list (newest
        first).  A malformed ``x-death`` from a publisher never raises
        (docs/dead-lettering.md): a value that is not an array is replaced,
        entries that are not tables are dropped, and a matching entry whose
        ``count`` is not a non-negative integer counts from 0 again.
        """
        props = dict(m.props)
        headers = dict(props.get("headers") or {})
        expiration = props.pop("expiration", None)
        routingKeys = [m.routingKey]
        cc = headers.get("CC")
        if isinstance(cc, list):
            routingKeys.extend(k for k in cc if isinstance(k, str))
            if dlrk is not None:
                del headers["CC"]
        deaths = None if ignoreDeaths else headers.get("x-death")
        deaths = [d for d in deaths if isinstance(d, dict)] if isinstance(deaths, list) else []
        found = None
        for i, d in enumerate(deaths):
            if d.get("queue") == queue.name and d.get("reason") == reason:
                found = i
                break
        if found is not None:
            d = dict(deaths.pop(found))
            d["count"] = TaggedInt(_deathCount(d.get("count")) + 1, "l")
            deaths.insert(0, d)
        else:
            d = {
                "count": TaggedInt(1, "l"),
                "reason": reason,
                "queue": queue.name,
                "time": Timestamp(int(self.clock.seconds())),
                "exchange": m.exchange,
                "routing-keys": routingKeys,
            }
            if expiration is not None:
                d["original-expiration"] = expiration
            deaths.insert(0, d)
        if "x-first-death-reason" not in headers:
            headers["x-first-death-reason"] = reason
            headers["x-first-death-queue"] = queue.name
            headers["x-first-death-exchange"] = m.exchange
        headers["x-last-death-reason"] = reason
        headers["x-last-death-queue"] = queue.name
        headers["x-last-death-exchange"] = m.exchange
        headers["x-death"] = deaths
        props["headers"] = headers
        copy = Message(
            queue.settings.dlx,
            dlrk if dlrk is not None else m.routingKey,
            encodeProperties(props),
            m.body,
            props,
        )
        return copy, deaths

    # --- policies -------------------------------------------------------------

    def setPolicy(self, policy):
        """
        Add or replace a :class:`~otter_tx.broker.policy.Policy` and apply it
        to existing queues at once.
        """
        self.policies[policy.name] = policy
        self._reapplyPolicies()
        self.broker.entityChanged("policy", self, policy)

    def clearPolicy(self, name):
        """
        Remove a policy (no error if missing) and re-apply.
        """
        p = self.policies.pop(name, None)
        if p is not None:
            self._reapplyPolicies()
            self.broker.entityChanged("policy", self, p, deleted=True)

    def _reapplyPolicies(self):
        for q in list(self.queues.values()):
            self._applyPolicy(q)

    def _applyPolicy(self, q):
        policy = matchPolicy(self.policies.values(), q.name, "queues")
        q.applySettings(effectiveSettings(q.arguments, policy), policy)

    # --- connection cleanup -----------------------------------------------------

    def connectionClosed(self, connection):
        """
        Delete the exclusive queues of a closed connection.
        """
        for q in list(connection.exclusiveQueues):
            if q.vhost is self:
                self.deleteQueue(q, reason="exclusive_owner_down")


class _ReplyToDeclared:
    """What a passive queue.declare of the reply-to pseudo-queue reports (as RabbitMQ 3.10: 0 messages, 1 consumer)."""

    readyCount = 0
    consumerCount = 1

    def __init__(self, name):
        self.name = name


#: largest x-death count kept (int64, the type RabbitMQ writes it as)
_MAX_DEATH_COUNT = 2 ** 63 - 2


def _deathCount(value):
    """
    An x-death entry's ``count`` as a non-negative int: 0 for anything a
    publisher may have put there that is not one (``"abc"``, a float, a
    table, a negative or out-of-range number, a boolean).
    """
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_DEATH_COUNT:
        return int(value)
    return 0


def _isCycle(qname, deaths):
    """
    RabbitMQ's ``is_cycle/2``: walking x-death newest first up to the first
    entry for ``qname``, a cycle is fully automatic when no entry on the way
    (including the match) has reason ``rejected``.
    """
    for d in deaths:
        if not isinstance(d, dict):
            return False
        if d.get("reason") == "rejected":
            return False
        if d.get("queue") == qname:
            return True
    return False
