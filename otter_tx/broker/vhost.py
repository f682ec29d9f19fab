"""
A virtual host: its exchanges, queues, bindings and policies, and routing;
dead-lettering is :mod:`otter_tx.broker.deadletter`.

Operations raise :class:`~otter_tx.amqp.errors.AMQPError` with RabbitMQ's
reply codes and texts (../shared/reference/rabbitmq-semantics.md section 6;
https://www.rabbitmq.com/docs/dlx for dead-lettering).  Nothing here does
I/O; time comes from the injected clock.
"""

import base64
import os

from otter_tx.amqp.errors import (
    accessRefused,
    erlBinary,
    notFound,
    notImplemented,
    notAllowed,
    preconditionFailed,
    resourceLocked,
    resourceText,
)
from otter_tx.broker.arguments import (
    EQUIVALENCE_ARGS,
    QUORUM,
    QUORUM_EQUIVALENCE_ARGS,
    STREAM,
    STREAM_EQUIVALENCE_ARGS,
    assertArgsEquivalence,
    assertFlagEquivalence,
    frozenArguments,
    queueType,
    validateQueueArguments,
    validateQuorumDeclare,
    validateStreamDeclare,
)
from otter_tx.broker.deadletter import DeadLetterer
from otter_tx.broker.delayed import (
    DELAYED_TYPE,
    DelayedExchange,
    validateDelayedArguments,
)
from otter_tx.broker.exchange import EXCHANGE_TYPES, Exchange, isExchange
from otter_tx.broker.message import Message
from otter_tx.broker.policy import effectiveSettings, matchPolicy, mergeOperatorPolicy
from otter_tx.broker.queue import Queue
from otter_tx.broker.replyto import REPLY_PREFIX, REPLY_TO
from otter_tx.broker.stats import MessageCounts
from otter_tx.broker.stream import StreamQueue

PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

#: the firehose tracer's exchange every RabbitMQ vhost has (durable, internal,
#: topic; ``rabbit_vhost:do_add``); otter_tx has no tracer, so nothing is ever
#: published to it, but it is listed as RabbitMQ lists it
#: (https://www.rabbitmq.com/docs/firehose)
TRACE_EXCHANGE = "amq.rabbitmq.trace"

#: the vhost limits RabbitMQ 3.10 knows (``rabbit_vhost_limit``); values
#: are integers, a negative one means no limit
LIMIT_NAMES = ("max-connections", "max-queues")
#: the user limits RabbitMQ 3.10 knows (``rabbit_auth_backend_internal``)
USER_LIMIT_NAMES = ("max-connections", "max-channels")


class LimitError(ValueError):
    """A vhost limit RabbitMQ rejects; ``str()`` is its validation text."""


def enforcedLimit(limits, name):
    """
    The enforced value of limit ``name`` in ``limits`` (a dict or None): an
    int >= 0, or None when it is unset or negative (RabbitMQ's "no limit"),
    for vhost and user limits alike.
    """
    value = (limits or {}).get(name)
    return None if value is None or value < 0 else value


def validateLimit(name, value, names=LIMIT_NAMES, what="limits"):
    """
    Check one vhost limit as ``rabbit_vhost_limit`` does: an unknown
    ``name`` -> ``Unrecognised terms [{<<"foo">>,1}] in limits``; a value
    that is not an integer -> ``max-queues should be a number, actually
    was <<"x">>`` (strings), ``... was 1.5`` / ``true`` (others).  Raises
    :class:`LimitError`.  User limits pass ``names=USER_LIMIT_NAMES,
    what="user-limits"``.
    """
    if name not in names:
        raise LimitError('Unrecognised terms [{<<"%s">>,%s}] in %s' % (name, _erlTerm(value), what))
    if not isinstance(value, int) or isinstance(value, bool):
        raise LimitError("%s should be a number, actually was %s" % (name, _erlTerm(value)))


def _erlTerm(value):
    """``value`` as RabbitMQ prints the JSON value it decoded."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '<<"%s">>' % (value,)
    if value is None:
        return "null"
    return str(value)


def _lockedText(qname, vhost):
    return (
        "cannot obtain exclusive access to locked %s. It could be originally declared on "
        "another connection or the exclusive property value does not match that of the "
        "original declaration." % (resourceText("queue", qname, vhost),)
    )


#: the exchange classes a binding's destination may be; any other
#: destination is a queue (an IQueue), whatever its class: the test of
#: :func:`~otter_tx.broker.exchange.isExchange` as a frozenset lookup, which
#: the publish path (:meth:`VHost.route`) can afford
_EXCHANGE_CLASSES = frozenset([Exchange, DelayedExchange])


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
        #: name -> a queue on another node of the cluster (otter_tx.cluster.remote.RemoteQueue)
        self.remoteQueues = {}
        self.policies = {}
        #: name -> :class:`~otter_tx.broker.policy.OperatorPolicy`
        self.operatorPolicies = {}
        #: limit name -> int (:data:`LIMIT_NAMES`), None until one was set
        #: (RabbitMQ keeps an emptied ``limits`` parameter: listed as ``[]``)
        self.limits = None
        #: direct reply-to token -> ReplyToQueue
        self.replyTo = {}
        #: messages dead-lettered, by reason (``expired``, ``rejected``, ``maxlen``, ``delivery_limit``)
        self.deadLettered = {"expired": 0, "rejected": 0, "maxlen": 0, "delivery_limit": 0}
        #: messages that left a queue without a dead-letter exchange, by reason (dropped)
        self.deadLetterDisabled = {"expired": 0, "rejected": 0, "maxlen": 0, "delivery_limit": 0}
        #: messages dropped because their queue's dead-letter exchange is missing
        self.deadLetterDropped = 0
        #: republishes dead-lettered messages (:mod:`otter_tx.broker.deadletter`)
        self.deadLetterer = DeadLetterer(self)
        #: message rates (:mod:`otter_tx.broker.stats`): the open Sessions (AMQP
        #: channels), and the counts of closed ones and of HTTP requests
        self.sessions = set()
        self.channelStats = MessageCounts()
        #: messages that left a queue, by dead-letter reason, whatever became of them
        self.leftBy = {}
        #: messages taken into hold by x-delayed-message exchanges
        self.delayedCount = 0
        #: ``[received, sent]`` bytes of its closed connections (recv_oct / send_oct)
        self.closedBytes = [0, 0]
        self._declareDefaults()

    def _declareDefaults(self):
        self.exchanges[""] = Exchange(self, "", "direct", True, False, False, {})
        for name, type in PREDECLARED:
            self.exchanges[name] = Exchange(self, name, type, True, False, False, {})
        self.exchanges[TRACE_EXCHANGE] = Exchange(self, TRACE_EXCHANGE, "topic", True, False, True, {})

    # --- exchanges ----------------------------------------------------------

    def getExchange(self, name):
        """
        The exchange ``name`` or 404 ``no exchange 'X' in vhost '/'``.
        """
        ex = self.exchanges.get(name)
        if ex is None:
            raise notFound("no %s" % (resourceText("exchange", name, self.name),))
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
                    % (resourceText("exchange", name, self.name), type, ex.type)
                )
            assertFlagEquivalence("exchange", name, self.name, "durable", durable, ex.durable)
            assertFlagEquivalence(
                "exchange", name, self.name, "auto_delete", autoDelete, ex.autoDelete
            )
            assertFlagEquivalence("exchange", name, self.name, "internal", internal, ex.internal)
            assertArgsEquivalence(
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
            if durable:
                ex.journal = self.broker.journal
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
                "deletion of system %s not allowed" % (resourceText("exchange", name, self.name),)
            )
        if ifUnused and ex.hasBindings():
            raise preconditionFailed("%s in use" % (resourceText("exchange", name, self.name),))
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
            q = self.remoteQueues.get(name)
            if q is None:
                raise notFound("no %s" % (resourceText("queue", name, self.name),))
            if q.down:
                raise notFound(q.downText)
        if q.owner is not None and q.owner is not connection:
            raise resourceLocked(_lockedText(name, self.name))
        return q

    def findQueue(self, name):
        """The queue ``name`` of this node or of another node of the cluster, or None."""
        q = self.queues.get(name)
        return q if q is not None else self.remoteQueues.get(name)

    def declareQueue(self, name, connection, passive=False, durable=False, exclusive=False,
                     autoDelete=False, arguments=None, serverNamed=False):
        """
        queue.declare; returns the :class:`Queue`.  ``name == ""`` gets a
        server-generated ``amq.gen-`` name.  Errors: 404 (passive), 405
        (exclusive elsewhere), 403 (``amq.`` prefix), 406 (invalid or
        inequivalent arguments).  Renews the x-expires lease (but a passive
        declare of a quorum queue does not, as on RabbitMQ 3.10).
        """
        arguments = arguments or {}
        if passive:
            if name == REPLY_TO or (name.startswith(REPLY_PREFIX) and name[len(REPLY_PREFIX):] in self.replyTo):
                return _ReplyToDeclared(name)
            q = self.getQueue(name, connection)
            # a quorum queue's lease is not renewed by a passive declare (3.10);
            # a queue on another node answers with its counts from there (a Deferred)
            return q.declared(renew=not q.quorum)
        qtype = queueType(arguments)
        quorum = qtype == QUORUM
        if qtype != "classic" and (name == "" or serverNamed):
            raise preconditionFailed("Cannot declare a server-named queue for type rabbit_%s_queue" % (qtype,))
        if name == "":
            name = serverNamedQueue()
        elif name.startswith("amq.") and not serverNamed:
            raise accessRefused("queue name '%s' contains reserved prefix 'amq.*'" % (name,))
        q = self.queues.get(name)
        if q is None:
            q = self.remoteQueues.get(name)
            if q is not None and q.down:
                raise notFound(q.downText)
        if q is not None:
            if q.owner is not None and (q.owner is not connection or not exclusive):
                raise resourceLocked(_lockedText(name, self.name))
            if q.owner is None and exclusive:
                raise resourceLocked(_lockedText(name, self.name))
            assertFlagEquivalence("queue", name, self.name, "durable", durable and not exclusive, q.durable)
            assertFlagEquivalence("queue", name, self.name, "auto_delete", autoDelete, q.autoDelete)
            assertArgsEquivalence(
                "queue", name, self.name, arguments, q.arguments,
                _EQUIVALENCE.get(q.queueType, EQUIVALENCE_ARGS),
            )
            return q.declared(renew=True)
        validateQueueArguments(arguments, name, self.name)
        if quorum:
            validateQuorumDeclare(name, self.name, durable, exclusive, autoDelete)
        elif qtype == STREAM:
            validateStreamDeclare(name, self.name, durable, exclusive, autoDelete)
        cluster = self.broker.cluster
        limit = self.limit("max-queues")
        if (limit is not None and len(self.queues) + len(self.remoteQueues) >= limit
                and (cluster is None or not cluster.applying)):
            # a cluster's vhost counts its queues on every node, as RabbitMQ's does; the
            # declaring node checked before a record another node applies
            raise preconditionFailed(
                "cannot declare queue '%s': queue limit in vhost '%s' (%d) is reached"
                % (name, self.name, limit))
        if cluster is not None and not cluster.applying:
            # a new queue of a cluster: its record first (otter_tx.cluster.node)
            return cluster.declareQueue(self, name, connection, durable, exclusive, autoDelete, arguments,
                                        serverNamed)
        q = _QUEUE_KINDS.get(qtype, Queue)(
            self,
            name,
            durable and not exclusive,
            autoDelete,
            connection if exclusive else None,
            arguments,
        )
        self.queues[name] = q
        if q.durable:
            q.journal = self.broker.journal
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
        dead-lettered.  A quorum queue refuses ``ifUnused`` / ``ifEmpty``:
        540 (connection) ``cannot delete queue 'Q' in vhost '/'. queue.delete
        operations with if-unused flag set are not supported by quorum queues``.
        """
        if q.deleted:
            return 0
        cluster = self.broker.cluster
        if cluster is not None and not cluster.applying and q.remote:
            # a queue on another node (IDeclaredQueue.remote; one leaves remoteQueues only when
            # dropped, which marks it deleted): deleted there, a Deferred firing with its count
            return cluster.deleteRemote(self, q, ifUnused, ifEmpty)
        if q.quorum and (ifUnused or ifEmpty):
            # RabbitMQ 3.10's quorum queues (a connection error, checked on the peer)
            raise notImplemented(
                "cannot delete %s. queue.delete operations with %s flag set are not supported by quorum queues"
                % (resourceText("queue", q.name, self.name), "if-unused" if ifUnused else "if-empty"))
        ifUnused, ifEmpty = q.deleteConditions(ifUnused, ifEmpty)
        if ifUnused and q.consumers:
            raise preconditionFailed("%s in use" % (resourceText("queue", q.name, self.name),))
        if ifEmpty and q.readyCount:
            raise preconditionFailed("%s not empty" % (resourceText("queue", q.name, self.name),))
        if self.queues.get(q.name) is q:
            del self.queues[q.name]
        if q.owner is not None:
            q.owner.exclusiveQueues.discard(q)
        for (ex, key, _), args in list(q.bindings.items()):
            self._unbind(ex, q, key, args)
        n = q.shutdown()
        self.broker.counters.queuesDeleted += 1
        self.broker.entityChanged("queue", self, q, deleted=True)
        return n

    # --- bindings ---------------------------------------------------------------

    def bind(self, source, destination, routingKey, arguments):
        """
        Bind ``destination`` (Queue or Exchange) to exchange ``source``.
        403 for the default exchange.
        """
        if source.name == "" or (isExchange(destination) and destination.name == ""):
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
            if not isExchange(destination):
                destination.bindings[(source, routingKey, frozenArguments(arguments))] = arguments
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
            if not isExchange(destination):
                destination.bindings.pop((source, routingKey, frozenArguments(args)), None)
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
                if q is None:
                    if keys[0].startswith(REPLY_PREFIX):
                        q = self.replyTo.get(keys[0][len(REPLY_PREFIX):])
                    else:
                        q = self.remoteQueues.get(keys[0])
                return (q,) if q is not None else ()
            remote = self.remoteQueues
            return {queues[k] if k in queues else remote[k] for k in keys if k in queues or k in remote}
        found = set()
        self._routeOne(exchange, message, keys, found)
        if not found and exchange.alternate is None:
            # unroutable: still published into the exchange (RabbitMQ's publish_in)
            exchange.publishIn += 1
            return found
        queues = set()
        visited = {exchange}
        pending = [(exchange, found)]
        while pending:
            ex, dests = pending.pop()
            ex.publishIn += 1
            routedHere = False
            for d in dests:
                if d.__class__ not in _EXCHANGE_CLASSES:
                    # a queue (any IQueue)
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

    def reachableQueues(self, exchangeName, routingKey=None, headers=None):
        """
        The queues a message published now to exchange ``exchangeName``
        (str) with ``routingKey`` (str) and ``headers`` (dict or None) would
        reach, walked as :meth:`route` walks (exchange-to-exchange bindings,
        then the alternate exchange of one that routes nowhere; each exchange
        once), but counting nothing, holding nothing (an x-delayed-message
        exchange routes as if the message were due) and enqueueing nothing.
        The walk's rules are :meth:`route`'s, written a second time so that
        the publish path keeps its own loop: an exchange whose destinations
        hold no queue and no exchange not yet visited passes the message to
        its alternate exchange (``ReachableQueuesTests`` compares the two
        over exchange-to-exchange cycles and alternate exchanges).
        With ``routingKey`` None the message keeps routing keys of its own
        (a dead letter without ``x-dead-letter-routing-key``), so every
        destination bound to an exchange on the walk counts, under its
        binding key.  Not on the publish path: :meth:`route` stays as it is.

        :returns: ``{queue name: routing key}`` (``{}`` for a missing
            exchange); the key is ``routingKey``, or the binding key (the
            queue's name for the default exchange) when it is None.
        """
        start = self.exchanges.get(exchangeName)
        if start is None:
            return {}
        if start.name == "":
            if routingKey is None:
                return {n: n for n in self.queues}
            return {routingKey: routingKey} if routingKey in self.queues else {}
        probe = Message(exchangeName, routingKey or "", b"\x00\x00", b"", {"headers": headers} if headers else {})
        found = {}
        visited = {start}
        pending = [start]
        while pending:
            ex = pending.pop()
            if routingKey is not None:
                dests = set()
                ex.routing.route(probe, [routingKey], dests)
                pairs = [(d, routingKey) for d in dests]
            else:
                pairs = [(d, k) for d, k, _ in ex.routing.bindings()]
            # route's rules, with route's exchange test: a queue or a new
            # exchange routes here; otherwise the alternate exchange is tried
            routedHere = False
            for d, key in pairs:
                if d.__class__ not in _EXCHANGE_CLASSES:
                    found.setdefault(d.name, key)
                    routedHere = True
                elif d not in visited:
                    visited.add(d)
                    pending.append(d)
                    routedHere = True
            if not routedHere and ex.alternate is not None:
                ae = self.exchanges.get(ex.alternate)
                if ae is not None and ae not in visited:
                    visited.add(ae)
                    pending.append(ae)
        return found

    def _routeOne(self, exchange, message, keys, out):
        """
        One exchange's destinations for ``message``; an x-delayed-message
        exchange holds a delayed message, or runs a command, instead (no
        destinations now; :meth:`DelayedExchange.accept
        <otter_tx.broker.delayed.DelayedExchange.accept>`).
        """
        if exchange.delayed and exchange.accept(message):
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
        unrouted = 0
        for q in queues:
            # any IConsumerSource: a queue, or a direct reply-to consumer
            taken = q.enqueue(message)
            if not taken:
                if taken is None:
                    # a queue whose node is down: unroutable, as on RabbitMQ 3.10
                    unrouted += 1
                else:
                    rejected = True
        return len(queues) - unrouted, rejected

    # --- limits ---------------------------------------------------------------

    def limit(self, name):
        """The enforced limit ``name`` (an int >= 0), or None (unset or negative)."""
        return enforcedLimit(self.limits, name)

    def setLimit(self, name, value):
        """
        Set limit ``name`` to ``value`` (checked by :func:`validateLimit`,
        :class:`LimitError`); stored with the vhost.
        """
        validateLimit(name, value)
        self.limits = dict(self.limits or {}, **{name: value})
        self.broker.entityChanged("vhost", self, self)

    def setLimits(self, limits):
        """
        Replace every limit (a dict, each checked by :func:`validateLimit`),
        or drop them all with None (the ``vhost-limits`` runtime parameter).
        """
        if limits is not None:
            for name, value in limits.items():
                validateLimit(name, value)
            limits = dict(limits)
        self.limits = limits
        self.broker.entityChanged("vhost", self, self)

    def clearLimit(self, name):
        """Remove limit ``name`` (no error if unset)."""
        if self.limits is not None:
            self.limits = {k: v for k, v in self.limits.items() if k != name}
            self.broker.entityChanged("vhost", self, self)

    def checkConnectionLimit(self, user):
        """
        Before connection.open-ok: 530 ``access to vhost 'V' refused for
        user 'U': connection limit (N) is reached`` when the vhost's open
        connections reach ``max-connections`` (``rabbit_reader``, checked
        on RabbitMQ 3.10).
        """
        limit = self.limit("max-connections")
        if limit is None:
            return
        opened = sum(1 for c in self.broker.connections if getattr(c, "vhost", None) is self)
        if opened >= limit:
            raise notAllowed(
                "access to vhost '%s' refused for user '%s': connection limit (%d) is reached"
                % (self.name, user, limit))

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

    def setOperatorPolicy(self, policy):
        """Add or replace an :class:`~otter_tx.broker.policy.OperatorPolicy` and re-apply; stored durably."""
        self.operatorPolicies[policy.name] = policy
        self._reapplyPolicies()
        self.broker.entityChanged("operator_policy", self, policy)

    def clearOperatorPolicy(self, name):
        """Remove an operator policy (no error if missing) and re-apply."""
        p = self.operatorPolicies.pop(name, None)
        if p is not None:
            self._reapplyPolicies()
            self.broker.entityChanged("operator_policy", self, p, deleted=True)

    def effectivePolicy(self, name):
        """
        ``(policy, operator policy, effective)`` for queue ``name`` (str): the
        policy and operator policy that match it (or None) and their merge (a
        policy or None), as RabbitMQ's "Policies" page describes.
        """
        policy = matchPolicy(self.policies.values(), name, "queues")
        operator = matchPolicy(self.operatorPolicies.values(), name, "queues")
        return policy, operator, mergeOperatorPolicy(policy, operator)

    def _applyPolicy(self, q):
        policy, operator, effective = self.effectivePolicy(q.name)
        q.operatorPolicy = operator
        q.effectiveDefinition = dict(effective.definition) if effective is not None else {}
        q.applySettings(effectiveSettings(q.arguments, effective, self.broker.defaultDeliveryLimit), policy)

    # --- connection cleanup -----------------------------------------------------

    def connectionClosed(self, connection):
        """
        Delete the exclusive queues of a closed connection.
        """
        for q in list(connection.exclusiveQueues):
            if q.vhost is self:
                self.deleteQueue(q, reason="exclusive_owner_down")


#: the queue kind of each x-queue-type (classic and quorum are both Queue)
_QUEUE_KINDS = {STREAM: StreamQueue}
#: the arguments a redeclare compares, per queue type
_EQUIVALENCE = {QUORUM: QUORUM_EQUIVALENCE_ARGS, STREAM: STREAM_EQUIVALENCE_ARGS}


class _ReplyToDeclared:
    """What a passive queue.declare of the reply-to pseudo-queue reports (as RabbitMQ 3.10: 0 messages, 1 consumer)."""

    readyCount = 0
    consumerCount = 1

    def __init__(self, name):
        self.name = name
