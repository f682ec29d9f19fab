"""
A queue on another node, as this node's Sessions use it (:class:`RemoteQueue`,
an :class:`~otter_tx.broker.interfaces.IQueue`), and the home node's side of
a consumer on another node (:class:`LinkConsumer`, an
:class:`~otter_tx.broker.interfaces.IConsumer`).  docs/cluster.md, "Queues
on other nodes".

Everything travels over the link to the queue's home node
(:mod:`otter_tx.cluster.link`): publishes are forwarded, deliveries come
back with credit that follows the consumer's prefetch, and settlements
(ack, reject, requeue) go home by delivery id.  What needs an answer
(basic.get, purge, delete) is a request whose reply fires a Deferred.
"""

import os
from collections import deque

from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface import implementer

from otter_tx.amqp.codec import TaggedInt, decodeProperties, encodeTable
from otter_tx.amqp.errors import AMQPError, notFound
from otter_tx.broker.arguments import QUORUM, STREAM, queueType
from otter_tx.broker.interfaces import IConsumer, IDeclaredQueue, IQueue
from otter_tx.broker.stream import StreamQueue
from otter_tx.cluster import wire
from otter_tx.store.interface import StoreFailedError

#: credit a consumer without a prefetch gets (deliveries in flight on the link)
DEFAULT_WINDOW = 1000


def downText(node, name, vhost):
    """RabbitMQ 3.10's text for an operation on a durable queue whose node is down."""
    return "home node '%s' of durable queue '%s' in vhost '%s' is down or inaccessible" % (
        node, name, vhost)


class LinkLost(StoreFailedError):
    """
    The link to a node went away, or the node did not answer in time
    (confirms become nacks).  ``LinkLost(text)``: ``text`` (str) says which
    node and why; :attr:`path` is None.
    """

    def __init__(self, text):
        self.path = None
        self.reason = text
        Exception.__init__(self, text)


class RemoteOwner:
    """The owner of an exclusive queue declared on another node (405 here)."""

    exclusiveQueues = frozenset()


REMOTE_OWNER = RemoteOwner()


class RemoteEntry:
    """
    A delivery from a queue on another node, as the Session's ledger holds
    it: ``message``, ``redelivered``, ``returns`` (0: the home node already
    put ``x-delivery-count`` in the message), ``deliveredAt``, the home
    node's delivery id ``eid`` and consumer id ``cid``, and the ``link`` it
    came over (a settle goes back over that link only: a replicated quorum
    queue's new leader does not know the old one's delivery ids).
    """

    __slots__ = ("message", "redelivered", "returns", "deliveredAt", "eid", "cid", "state", "link")

    def __init__(self, message, redelivered, eid, cid, deliveredAt, link=None):
        self.message = message
        self.redelivered = redelivered
        self.returns = 0
        self.deliveredAt = deliveredAt
        self.eid = eid
        self.cid = cid
        self.state = 1
        self.link = link


@implementer(IQueue, IDeclaredQueue)
class RemoteQueue:
    """
    The queue ``name`` of ``vhost`` whose home is ``record["node"]``.

    :ivar home: the home node's name (str).  :ivar down: True while the
        home node is unreachable: every operation answers 404
        (:func:`downText`), a publish routed only here is unroutable.
    :ivar figures: the home node's last reported figures (dict:
        ``messages``, ``messages_ready``, ``messages_unacknowledged``,
        ``consumers``), refreshed every second over the link.
    """

    # IDeclaredQueue: a queue on another node (never a local stream log here)
    remote = True
    stream = None


    def __init__(self, node, vhost, name, record):
        self.node = node
        self.vhost = vhost
        self.name = name
        self.clock = vhost.clock
        self.bindings = {}
        self.consumers = []
        self.deleted = False
        self.down = False
        self.figures = {}
        self._names = wire.string(vhost.name) + wire.string(name)
        self.update(record)
        self._cids = {}          # Consumer -> cid
        self._backlog = {}       # cid -> deque of RemoteEntry not handed to the consumer yet
        self._resume = {}        # a stream's Consumer -> the offset after the last one handed to it
        self._writerSeqs = {}    # id(message) -> (message, (writer id, sequence)): a stream's forwards unanswered
        self._onHand = set()     # cids whose credit comes back when handed over (no prefetch)
        self._exclusive = None   # this node's exclusive consumer, if any
        self._holds = set()      # requeue feeders holding deliveries (holdRequeue)
        self._heldRequeues = []  # entries whose requeue waits for the holds to end

    def update(self, record):
        self.record = record
        self.home = record["node"]
        self.durable = record["durable"]
        self.autoDelete = record["auto_delete"]
        self.exclusive = record["exclusive"]
        self.owner = REMOTE_OWNER if self.exclusive else None
        self.arguments = record["arguments"]
        self.queueType = queueType(self.arguments)
        self.singleActive = bool(self.arguments.get("x-single-active-consumer"))
        self.quorum = self.queueType == QUORUM
        #: a stream (one member, at its home: docs/streams.md): its consumer rules apply here
        self.isStream = self.queueType == STREAM
        #: this node's counts of the queue type's deliveries and acks (Queue.typeCounts)
        self.typeCounts = getattr(self.vhost.broker, "typeCounts", {}).get(self.queueType)
        #: a replicated quorum queue (its consumers here follow its leader: reattach)
        self.replicated = len(record.get("members") or ()) > 1

    def __repr__(self):
        return "<RemoteQueue %r in %r on %r>" % (self.name, self.vhost.name, self.home)

    # --- figures --------------------------------------------------------------

    @property
    def readyCount(self):
        """Ready at home (its last figures) and here, delivered but not handed to a consumer yet."""
        return self.figures.get("messages_ready", 0) + sum(len(b) for b in self._backlog.values())

    @property
    def consumerCount(self):
        """The home's last count, or this node's consumers when it has more (the count is a second old)."""
        return max(self.figures.get("consumers", 0), len(self.consumers))

    @property
    def downText(self):
        """The 404 text while the home node is down."""
        return downText(self.home, self.name, self.vhost.name)

    def _ask(self, op, args):
        """A request to the home node; a link lost or a home that does not answer is its 404."""
        def lost(f):
            f.trap(LinkLost)
            raise notFound(downText(self.home, self.name, self.vhost.name))

        return self._link().ask(op, args).addErrback(lost)

    def _link(self):
        link = self.node.links.get(self.home)
        if link is None or self.down:
            raise notFound(downText(self.home, self.name, self.vhost.name))
        return link

    def declared(self, renew):
        """
        A declare of this queue here: its counts from the home node (and its
        x-expires lease renewed there when ``renew``); a Deferred firing with
        this queue.
        """
        def counted(r):
            self.figures = dict(self.figures, messages_ready=r["messages"], consumers=r["consumers"])
            return self

        return self._ask("declare", {"vhost": self.vhost.name, "name": self.name,
                                     "renew": renew}).addCallback(counted)

    def touch(self):
        """A declare renews the home queue's x-expires lease (no answer awaited)."""
        link = self.node.links.get(self.home)
        if link is not None:
            link.ask("touch", {"vhost": self.vhost.name, "name": self.name}).addErrback(lambda f: None)

    # --- publish ---------------------------------------------------------------

    #: the publishes parked while a replicated quorum queue has no leader (:class:`Parked`)
    parked = None

    def enqueue(self, message, now=None, redelivered=False):
        """
        Forward ``message`` home; None (not routed) while the home node is
        down, but a replicated quorum queue's publishes wait for its next
        leader (:class:`Parked`), as RabbitMQ's are confirmed late, not lost.
        """
        link = self.node.links.get(self.home)
        if link is None or self.down or self.deleted:
            if self.replicated and not self.deleted:
                parked = self.parked
                if parked is None or parked.flushed:
                    parked = self.parked = Parked(self)
                if parked.park(message, redelivered):
                    return True
            return None
        if self.replicated and self.isStream:
            n = link.forward(self._names, redelivered, message, self._writerFor(message))
        else:
            n = link.forward(self._names, redelivered, message)
        via = link
        if self.replicated:
            # kept until the leader answers: if it dies first, the publish goes to the next one
            inflight = self._inflight
            if inflight is None or inflight.link is not link:
                inflight = self._inflight = InFlight(self, link)
            inflight.messages.append((message, redelivered))
            inflight.added()
            via = inflight
        if message.forwarded is None:
            message.forwarded = [(via, n)]
        else:
            message.forwarded.append((via, n))
        return True

    _inflight = None
    _writer = None
    _writerSeq = 0

    def _writerFor(self, message):
        """
        A publish forwarded to a replicated stream's leader: ``(writer id,
        sequence)``, kept until its leader answered, so that one sent again
        to a next leader is taken once (RabbitMQ's osiris drops such by the
        channel's writer id and sequence).
        """
        if self._writer is None:
            self._writer = "%s:%s" % (self.node.name, os.urandom(6).hex())
        self._writerSeq += 1
        w = (self._writer, self._writerSeq)
        self._writerSeqs[id(message)] = (message, w)
        return w

    def writerOf(self, message):
        """The ``(writer id, sequence)`` a publish was forwarded with, or None."""
        found = self._writerSeqs.get(id(message))
        return found[1] if found is not None and found[0] is message else None

    def writerAnswered(self, messages):
        """``messages`` (``[(message, redelivered)]``) were answered by a leader: their sequences go."""
        seqs = self._writerSeqs
        if seqs:
            for m, _ in messages:
                seqs.pop(id(m), None)

    def park(self, messages):
        """``messages`` (``[(message, redelivered)]``) wait for the next leader (:class:`Parked`)."""
        parked = self.parked
        if parked is None or parked.flushed:
            parked = self.parked = Parked(self)
        for message, redelivered in messages:
            parked.messages.append((message, redelivered))
        self.unpark()
        return parked

    def appendStream(self, count, entries, reference=None, groups=None):
        """
        A stream protocol publish to this stream (its home's log): ``count``
        messages as a stream chunk holds them; a Deferred firing once durable
        there (the link's SYNC), or None while the home node is down.  With a
        publisher ``reference`` (de-duplication) ``groups`` are ``[(publishing
        id, messages)]`` and the home de-duplicates them (STREAM_DEDUP).
        """
        link = self.node.links.get(self.home)
        if link is None or self.down or self.deleted:
            return None
        if reference:
            n = link.streamDedup(self._names, reference, groups, entries)
        else:
            n = link.streamAppend(self._names, count, entries)

        def answered(_):
            if link.refused(n):
                # the stream is gone there, or its followers could not hold it (no majority)
                raise StoreFailedError(None, "stream '%s' did not take the publish" % (self.name,))

        return link.sync().addCallback(answered)

    def askStream(self, op, args):
        """
        A stream door request to this stream's home (its leader): ``args``
        with the vhost and stream name; a Deferred of the answer (it fails
        when the link is lost or the home does not answer in time), or None
        while the home node is down.
        """
        link = self.node.links.get(self.home)
        if link is None or self.down or self.deleted:
            return None
        return link.ask(op, dict(args, vhost=self.vhost.name, name=self.name))

    # --- consumers -------------------------------------------------------------

    def deleteConditions(self, ifUnused, ifEmpty):
        """As the home queue's kind: a stream ignores both (StreamQueue.deleteConditions)."""
        if self.isStream:
            return False, False
        return ifUnused, ifEmpty

    def checkConsume(self, noAck, prefetch, arguments):
        """A stream's consumer rules, checked here as at home (StreamQueue.checkConsume); else none."""
        if self.isStream:
            StreamQueue.checkConsume(self, noAck, prefetch, arguments)

    def refusesConsumer(self, exclusive):
        """
        True when this node's own consumers refuse it (an exclusive one, or an
        exclusive one asked beside others); else a Deferred firing with the
        home node's answer for the consumers of every node (its 403 rule).
        A consumer the home still refuses when it arrives there (a race with
        another node's) is cancelled (basic.cancel).  404 while the home is down.
        """
        self._link()
        if self._exclusive is not None or (exclusive and self.consumers):
            return True
        return self._ask("consumable", {"vhost": self.vhost.name, "name": self.name,
                                        "exclusive": bool(exclusive)}).addCallback(lambda r: r["refused"])

    def addConsumer(self, consumer, exclusive=False):
        link = self._link()
        cid = self.node.newConsumerId(self, consumer)
        if exclusive:
            self._exclusive = consumer
        self._cids[consumer] = cid
        self._backlog[cid] = deque()
        self.consumers.append(consumer)
        prefetch = consumer.prefetch
        window = prefetch or DEFAULT_WINDOW
        if not prefetch:
            # no prefetch: the window only bounds what is in flight on the link;
            # credit comes back as deliveries are handed to the client
            self._onHand.add(cid)
        arguments = consumer.arguments
        resume = self._resume.get(consumer) if self.isStream else None
        if resume is not None:
            # a stream consumer subscribing again at a new leader: on from the offset after the
            # last one it was handed (not from its x-stream-offset again)
            arguments = dict(arguments or {}, **{"x-stream-offset": TaggedInt(resume, "l")})
        link.send(wire.consume(cid, self.vhost.name, self.name, consumer.noAck, exclusive,
                               consumer.priority, window, encodeTable(arguments) if arguments else b""))

    def removeConsumer(self, consumer):
        self._resume.pop(consumer, None)
        cid = self._cids.pop(consumer, None)
        if cid is None:
            return
        self._onHand.discard(cid)
        if self._exclusive is consumer:
            self._exclusive = None
        self.consumers.remove(consumer)
        self.node.consumerGone(cid)
        backlog = self._backlog.pop(cid, ())
        link = self.node.links.get(self.home)
        if link is not None and not self.down:
            link.send(wire.u32frame(wire.CANCEL, cid))
            if backlog and not consumer.noAck:
                link.settle(wire.REQUEUE, [e.eid for e in backlog])

    def delivered(self, cid, consumer, entry):
        """A DELIVER from home for ``consumer``: hand it over now, or when it has room."""
        backlog = self._backlog.get(cid)
        if backlog is None:
            return
        if not backlog and not self._holds and consumer.canTake():
            self._hand(consumer, entry)
        else:
            backlog.append(entry)

    def _hand(self, consumer, entry):
        entry.deliveredAt = self.clock.seconds()
        if self.isStream:
            offset = _streamOffset(entry.message)
            if offset is not None:
                self._resume[consumer] = offset + 1
        consumer.deliver(self, entry)
        if consumer.noAck or entry.cid in self._onHand:
            link = self.node.links.get(self.home)
            if link is not None:
                link.credit(entry.cid, 1)

    def cancelledByHome(self, cid):
        """The home queue cancelled the consumer ``cid`` (deleted, or refused it)."""
        for consumer, c in list(self._cids.items()):
            if c == cid:
                del self._cids[consumer]
                self._backlog.pop(cid, None)
                self.consumers.remove(consumer)
                self.node.consumerGone(cid)
                consumer.cancelledByBroker(self)

    def dispatch(self):
        if self._holds:
            return
        for consumer, cid in list(self._cids.items()):
            backlog = self._backlog.get(cid)
            while backlog and consumer.canTake():
                self._hand(consumer, backlog.popleft())

    def deliveredMessage(self, entry, get=False):
        return entry.message

    # --- settling --------------------------------------------------------------

    def _settle(self, how, entries):
        link = self.node.links.get(self.home)
        if link is None or self.down:
            return
        if self.replicated:
            # deliveries of an earlier leader: it is gone, they come back from the new one
            entries = [e for e in entries if e.link is link or e.link is None]
            if not entries:
                return
        link.settle(how, [e.eid for e in entries])
        credits = {}
        onHand = self._onHand
        for e in entries:
            if e.cid and e.cid not in onHand:
                credits[e.cid] = credits.get(e.cid, 0) + 1
        for cid, n in credits.items():
            if self.node.consumerQueue(cid) is self:
                link.credit(cid, n)

    def settle(self, entry):
        self._settle(wire.ACK, (entry,))

    def reject(self, entries):
        if self.isStream:
            # credit back at home; basic.reject/nack is refused for a stream (540)
            self._settle(wire.REQUEUE, entries)
            raise StreamQueue._noNack(self)
        self._settle(wire.REJECT, entries)

    def requeue(self, entries, dispatch=True):
        if self.isStream:
            # a channel closing (dispatch False) only returns credit; nack/recover is 540
            self._settle(wire.REQUEUE, entries)
            if dispatch:
                raise StreamQueue._noNack(self)
            return
        if self._holds:
            self._heldRequeues.extend(entries)
            return
        self._settle(wire.REQUEUE, entries)

    def holdRequeue(self, feeder):
        """Deliveries here wait, and requeues are kept here, until :meth:`releaseRequeue`."""
        self._holds.add(feeder)

    def releaseRequeue(self, feeder):
        self._holds.discard(feeder)
        if not self._holds:
            held, self._heldRequeues = self._heldRequeues, []
            if held:
                self._settle(wire.REQUEUE, held)
            self.dispatch()

    # --- requests ------------------------------------------------------------

    def basicGet(self, noAck):
        """basic.get at home: a Deferred firing with a RemoteEntry or None.  A stream's is 540 here."""
        if self.isStream:
            return StreamQueue.basicGet(self, noAck)
        link = self.node.links.get(self.home)

        def got(result):
            if result is None:
                return None
            message = self.node.messageFromJSON(result)
            entry = RemoteEntry(message, result["redelivered"], result["eid"], 0, self.clock.seconds(), link)
            self.figures["messages_ready"] = result["remaining"]
            return entry

        return self._ask("get", {"vhost": self.vhost.name, "name": self.name, "noAck": noAck}).addCallback(got)

    def purge(self):
        """queue.purge at home: a Deferred firing with the number purged.  A stream's is 540 here."""
        if self.isStream:
            return StreamQueue.purge(self)
        return self._ask("purge", {"vhost": self.vhost.name, "name": self.name}).addCallback(
            lambda r: r["messages"])

    def remoteDelete(self, ifUnused, ifEmpty):
        """queue.delete at home: a Deferred firing with the number of ready messages deleted."""
        return self._ask(
            "delete", {"vhost": self.vhost.name, "name": self.name, "ifUnused": ifUnused, "ifEmpty": ifEmpty}
        ).addCallback(lambda r: r["messages"])

    # --- the home node --------------------------------------------------------

    def _cancelAll(self):
        """Every consumer here is gone (basic.cancel), with what this queue kept for them."""
        consumers, self.consumers = self.consumers, []
        cids, self._cids = self._cids, {}
        self._backlog = {}
        self._onHand = set()
        self._exclusive = None
        for consumer in consumers:
            self.node.consumerGone(cids.get(consumer))
            consumer.cancelledByBroker(self)

    def homeDown(self):
        """
        The home node went away: consumers here are cancelled (basic.cancel),
        but those of a replicated quorum queue wait for its next leader
        (:meth:`reattach`), as RabbitMQ's quorum queue consumers do.
        """
        self.down = True
        if self.replicated:
            self.detach()
            return
        self._cancelAll()

    def homeUp(self):
        self.down = False
        if self._detached:
            self.reattach()
        self.unpark()

    def inflightLost(self, inflight):
        """The link of ``inflight`` went: False when its publishes cannot wait for a next leader."""
        if self._inflight is inflight:
            self._inflight = None
        return not self.deleted

    def unpark(self):
        """The publishes parked while there was no leader go to the one there is now."""
        parked = self.parked
        if parked is None or parked.flushed:
            return
        link = self.node.links.get(self.home)
        if link is None or self.down or not link.connected:
            # (a link closing: its LinkLost errbacks run before the node hears of it)
            return
        self.parked = None
        messages = parked.messages
        for message, redelivered in messages:
            link.forward(self._names, redelivered, message, self.writerOf(message))
        answer = link.sync()
        answer.addBoth(lambda r: (self.writerAnswered(messages), r)[1])
        parked.flush(answer)

    _detached = False

    def detach(self):
        """The consumers here lose their home's subscriptions (what they were sent stays theirs)."""
        self._detached = True
        for consumer, cid in list(self._cids.items()):
            self.node.consumerGone(cid)
        self._backlog = {cid: deque() for cid in self._cids.values()}

    def reattach(self):
        """
        The consumers here subscribe again at the home node (a replicated
        quorum queue's new leader): basic.cancel for one that cannot.
        """
        self._detached = False
        old = list(self._cids.items())
        self._cids = {}
        self._backlog = {}
        self._onHand = set()
        self.consumers = []
        exclusive = self._exclusive
        self._exclusive = None
        for consumer, cid in old:
            self.node.consumerGone(cid)
            try:
                self.addConsumer(consumer, consumer is exclusive)
            except AMQPError:
                consumer.cancelledByBroker(self)

    def shutdown(self):
        """The queue was deleted (anywhere): cancel the consumers here."""
        self.deleted = True
        self._cancelAll()
        return self.readyCount


def _streamOffset(message):
    """The ``x-stream-offset`` header of a stream delivery (int), or None."""
    try:
        headers = decodeProperties(message.propsRaw).get("headers") or {}
        value = headers.get("x-stream-offset")
        return int(value) if value is not None else None
    except Exception:
        return None


#: seconds a publish to a replicated quorum queue waits for a leader before its nack
PARK_WAIT = 30.0
#: publishes one queue parks at most (then they are unroutable, as for a down queue)
PARK_LIMIT = 100000


class Parked:
    """
    Publishes to a replicated quorum queue made while it has no leader (its
    leader's node is gone, a follower not yet promoted): they go to the next
    leader (:meth:`RemoteQueue.unpark`, or the queue this node promotes), and
    their confirms wait for it; after :data:`PARK_WAIT` seconds without one
    they are dropped and nacked.  In ``message.forwarded`` it stands as a
    link does (``sync()``, ``refused(n)``).
    """

    def __init__(self, rq):
        self.rq = rq
        self.clock = rq.clock
        self.messages = []
        self.flushed = False
        self._waiters = []
        self._timer = self.clock.callLater(PARK_WAIT, self._expired)

    def park(self, message, redelivered):
        if len(self.messages) >= PARK_LIMIT:
            return False
        self.messages.append((message, redelivered))
        if message.forwarded is None:
            message.forwarded = [(self, 0)]
        else:
            message.forwarded.append((self, 0))
        return True

    def refused(self, n):
        return False

    def sync(self):
        outcome = self._outcome
        if outcome is True:
            return defer.succeed(None)
        if outcome is not None:
            return defer.fail(outcome)
        d = defer.Deferred()
        self._waiters.append(d)
        return d

    _outcome = None

    def flush(self, answer):
        """The parked publishes were handed to the new leader; ``answer``: a Deferred of its taking them."""
        self.flushed = True
        if self._timer.active():
            self._timer.cancel()
        self.messages = []

        def settled(r):
            self._outcome = r if isinstance(r, Failure) else True
            waiters, self._waiters = self._waiters, []
            for d in waiters:
                if isinstance(r, Failure):
                    d.errback(r)
                else:
                    d.callback(None)

        answer.addBoth(settled)

    def _expired(self):
        if self.flushed:
            return
        if self.rq.parked is self:
            self.rq.parked = None
        self.flush(defer.fail(LinkLost("no leader for quorum queue '%s' in vhost '%s' within %d s" % (
            self.rq.name, self.rq.vhost.name, PARK_WAIT))))


class InFlight:
    """
    The publishes forwarded over ``link`` to a replicated quorum queue's
    leader and not answered yet (its SYNCED): a publisher's confirm waits
    for :meth:`sync` as for the link's; when the link is lost first they
    are parked for the next leader (:meth:`RemoteQueue.park`) and the
    confirm waits for it (at least once: the old leader may have taken
    some), instead of their nacks.
    """

    def __init__(self, rq, link):
        self.rq = rq
        self.link = link
        self.messages = []
        self.base = 0           # how many messages before ``messages`` were answered
        self.reparked = None    # the Parked they went to, once the link was lost

    def refused(self, n):
        return self.reparked is None and self.link.refused(n)

    _trimming = False

    def added(self):
        """
        A publish was forwarded: what the leader answered is let go at its
        next SYNCED, confirms or not (one barrier per reactor turn at most).
        """
        if not self._trimming:
            self._trimming = True
            self.sync().addBoth(self._trimmed)

    def _trimmed(self, result):
        self._trimming = False
        return None

    def sync(self):
        if self.reparked is not None:
            return self.reparked.sync()
        upto = self.base + len(self.messages)

        def answered(_):
            drop = upto - self.base
            if drop > 0:
                self.rq.writerAnswered(self.messages[:drop])
                del self.messages[:drop]
                self.base = upto
            return None

        def lost(f):
            f.trap(LinkLost)
            if self.reparked is None:
                messages, self.messages = self.messages, []
                if not self.rq.inflightLost(self):
                    return f
                self.reparked = self.rq.park(messages)
            return self.reparked.sync()

        return self.link.sync().addCallbacks(answered, lost)


@implementer(IConsumer)
class LinkConsumer:
    """
    A consumer on another node, registered on a queue of this node: it takes
    deliveries while it has credit (the consumer's prefetch, returned by
    CREDIT frames) and the link is not backed up.
    """

    def __init__(self, link, cid, queue, tag, noAck, priority, credit, arguments=None):
        self.link = link
        self.cid = cid
        self.queue = queue
        self.tag = tag
        self.noAck = noAck
        self.priority = priority
        self.credit = credit
        self.prefetch = credit
        #: (IConsumer) the consumer's basic.consume arguments (a stream reads from its x-stream-offset)
        self.arguments = arguments

    def canTake(self):
        return self.credit > 0 and not self.link.paused

    def deliver(self, queue, entry):
        self.credit -= 1
        message = entry.message if not entry.returns else queue.deliveredMessage(entry)
        eid = 0 if self.noAck else self.link.outstanding(queue, entry)
        self.link.send(wire.deliver(self.cid, eid, entry.redelivered, message))

    def cancelledByBroker(self, queue):
        self.link.consumerCancelled(self)
