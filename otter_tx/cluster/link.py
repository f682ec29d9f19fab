"""
The link between two nodes (docs/cluster.md, "The link"): one TCP
connection per pair of nodes (the node whose name sorts first dials), the
frames of :mod:`otter_tx.cluster.wire`, written once per reactor turn.

Either end forwards publishes to the other's queues, consumes from them,
settles what it received and asks (basic.get, purge, delete, create).  A
``SYNC n`` frame asks the other end to answer ``SYNCED n`` once everything
it received before is taken, and fsync'd for persistent messages (its
journal's ``sync()``): publisher confirms wait for it.
"""

import base64

from twisted.internet import defer, protocol
from twisted.logger import Logger

from otter_tx.amqp.codec import decodeTable
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.arguments import STREAM
from otter_tx.broker.message import Message
from otter_tx.cluster import wire
from otter_tx.cluster.remote import LinkConsumer, LinkLost, RemoteEntry
from otter_tx.resources.sockets import MAX_PARTS, directSocket, sendRun

log = Logger()

#: bytes of unsent output past which consumers on the link stop taking
HIGH_WATER = 4 * 1024 * 1024

#: seconds a request to another node may take before it fails (a paused node)
ASK_TIMEOUT = 10.0
#: bytes waiting in a link's socket buffer above which its node's publishers
#: are in flow (1 MiB: a few thousand small messages, milliseconds at link speed)
LINK_HIGH_WATER = 1 << 20
#: frames a link handles per reactor turn (as the AMQP door's FRAMES_PER_SLICE)
FRAMES_PER_SLICE = 300
#: a frame at least this large (bytes) that is not complete is gathered from the reads as they come
#: and joined once (a replicated stream's commit of 1 KiB messages is a frame of a MiB or more):
#: appended to the receive buffer, then copied out of it, each byte was copied twice
BIG_FRAME = 256 * 1024


def _sendParts(sock, parts):
    """
    ``sock.sendmsg`` of ``parts`` (a list) as far as the socket takes them;
    returns what it did not take (a list, its first part maybe a view of
    the rest of one), empty when it took everything.
    """
    i = 0
    n = len(parts)
    while i < n:
        j = min(n, i + MAX_PARTS)
        i, sent = sendRun(sock, parts, i, j)
        if i < j:
            rest = parts[i:]
            if sent:
                rest[0] = memoryview(rest[0])[sent:]
            return rest
    return []


def writeParts(transport, parts, hold=False):
    """
    Write ``parts`` (bytes-like) to ``transport`` in order: straight to its
    socket with ``sendmsg`` when :func:`~otter_tx.resources.sockets.directSocket` allows (Twisted's own
    write joins what a turn wrote into one string, then sends it 128 KiB a
    reactor turn: a replicated stream's records went through two more copies
    on their way out), what the socket does not take through the transport,
    or, with ``hold``, returned (a list; None when the socket could not be
    used and everything went through the transport).
    """
    sock = directSocket(transport)
    rest = parts
    if sock is not None:
        rest = _sendParts(sock, parts)
        if hold or not rest:
            return rest
    transport.writeSequence([p if type(p) is bytes else bytes(p) for p in rest])
    return None


def messageJSON(message, **extra):
    d = {
        "exchange": message.exchange,
        "routing_key": message.routingKey,
        "props": base64.b64encode(message.propsRaw).decode(),
        "body": base64.b64encode(message.body).decode(),
    }
    d.update(extra)
    return d


def messageFromJSON(d):
    return Message(d["exchange"], d["routing_key"], base64.b64decode(d["props"]), base64.b64decode(d["body"]))


def _consumeArguments(table):
    """A CONSUME frame's arguments (an AMQP field table with its length prefix) -> dict."""
    if len(table) < 4:
        return None
    return decodeTable(table, 4, 4 + int.from_bytes(table[:4], "big"))


def _requeue(q, entries):
    """
    Deliveries the other node gave back (its consumer went, or the link):
    requeued in queue order; a stream's only return their credit (nothing
    is requeued in a stream, and that is no basic.nack).
    """
    if q.queueType == STREAM:
        q.requeue(entries, dispatch=False)
    else:
        q.requeue(sorted(entries, key=lambda e: e.seq))


class LinkProtocol(protocol.Protocol):
    """
    One end of a link.  :ivar peer: the other node's name (after HELLO).
    :ivar paused: True while the transport asked us to stop writing.
    """

    peer = None
    paused = False
    _direct = False

    def __init__(self, node, dialled=None):
        self.node = node
        self.clock = node.clock
        self.dialled = dialled
        self._buf = bytearray()
        self._ready = []
        self._out = []
        self._flushCall = None
        self._rid = 0
        self._asks = {}
        self._syncSeq = 0
        self._syncWaiters = {}
        self._pendingSync = None
        self._forwarded = False
        self._eid = 0
        self._outstanding = {}   # eid -> (queue, entry): delivered to the other node, unsettled
        self._consumers = {}     # cid -> LinkConsumer (the other node's consumers of our queues)
        self._credits = {}       # cid -> credit to return (batched)
        self._settles = {}       # how -> [eid]
        self.connected = False
        self._fwdOut = 0         # forwards sent
        self._fwdIn = 0          # forwards received
        self._refusedIn = []     # numbers of forwards received that our queue refused, since the last SYNC
        self._replicatedIn = []  # (number, [(Replicator, 0)]) of forwards taken by replicated queues, since then
        self._fwdAtSync = 0      # the last forward number covered by a SYNC answered
        self._replicaOpsIn = False  # REPLICATE frames received since the last SYNC
        self._refused = set()    # numbers of our forwards the other node said were refused

    # --- connection ----------------------------------------------------------

    def connectionMade(self):
        self.connected = True
        # writes are gathered per reactor turn already: Nagle would only add delayed-ACK stalls
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        # Twisted pauses a registered producer above the transport's bufferSize
        # (64 KiB by default): a link carries bursts of many connections
        if hasattr(self.transport, "bufferSize"):
            self.transport.bufferSize = LINK_HIGH_WATER
        self.transport.registerProducer(self, True)
        if self.dialled is not None:
            self.peer = self.dialled
            self.send(wire.frame(wire.HELLO, wire.string(self.node.name)))
            self.node.linkUp(self)

    def connectionLost(self, reason=None):
        self.connected = False
        self._held = None
        if self._flushCall is not None and self._flushCall.active():
            self._flushCall.cancel()
        self._flushCall = None
        asks, self._asks = self._asks, {}
        for d in asks.values():
            d.errback(LinkLost("link to node '%s' lost" % (self.peer,)))
        waiters, self._syncWaiters = self._syncWaiters, {}
        for ds in waiters.values():
            for d in ds:
                d.errback(LinkLost("link to node '%s' lost" % (self.peer,)))
        # the other node's consumers are gone: their unsettled deliveries come back
        consumers, self._consumers = self._consumers, {}
        for c in consumers.values():
            c.queue.removeConsumer(c)
        outstanding, self._outstanding = self._outstanding, {}
        byQueue = {}
        for q, e in outstanding.values():
            byQueue.setdefault(q, []).append(e)
        for q, entries in byQueue.items():
            if not q.deleted:
                _requeue(q, entries)
        if self.peer is not None:
            self.node.linkDown(self)

    def pauseProducing(self):
        """The transport's write buffer is over :data:`LINK_HIGH_WATER`: consumers and publishers wait."""
        self.paused = True
        if self.peer is not None:
            self.node.linkPaused(self)

    def resumeProducing(self):
        """The write buffer drained: deliveries to the other node's consumers and publishes go on."""
        self.paused = False
        self.node.linkResumed(self)
        for c in list(self._consumers.values()):
            c.queue.dispatch()

    def stopProducing(self):
        pass

    # --- output ---------------------------------------------------------------

    def send(self, data):
        self._out.append(data)
        if self._flushCall is None:
            self._flushCall = self.clock.callLater(0, self.flush)

    def sendParts(self, parts):
        """
        One frame as its parts (bytes-like: a replicated stream's records, not
        joined); the turn's output then goes straight to the socket when it
        can (:func:`writeParts`).  (The other frames go through the transport's
        buffer, whose high water mark puts this node's publishers in flow.)
        """
        self._out.extend(parts)
        self._direct = True
        if self._flushCall is None:
            self._flushCall = self.clock.callLater(0, self.flush)

    def _drainBatched(self):
        """The credits and settles gathered so far go out now, after what was sent before them."""
        if self._credits:
            credits, self._credits = self._credits, {}
            for cid, n in credits.items():
                self._out.append(wire.u32frame(wire.CREDIT, cid, n))
        if self._settles:
            settles, self._settles = self._settles, {}
            for how, eids in settles.items():
                self._out.append(wire.settle(how, eids))

    def flush(self):
        self._flushCall = None
        self._drainBatched()
        if self._pendingSync is not None:
            self._out.append(wire.u64frame(wire.SYNC, self._pendingSync))
            self._pendingSync = None
        direct, self._direct = self._direct, False
        if self._out and self.connected:
            out, self._out = self._out, []
            if self._held is not None:
                # after what the socket has not taken yet
                self._hold(out)
            elif direct:
                rest = writeParts(self.transport, out, hold=True)
                if rest:
                    self._hold(rest)
            else:
                self.transport.writeSequence(out)
        else:
            self._out = []

    #: output the socket did not take (a list of bytes-like, oldest first), written as it becomes
    #: writable (:meth:`_writeHeld`) instead of through the transport's buffer, which joins it,
    #: copies what remains into each new write and sends 128 KiB a reactor turn; None when empty
    _held = None
    _heldBytes = 0
    _heldPaused = False

    def _hold(self, parts):
        t = self.transport
        if self._held is None:
            self._held = []
            self._heldBytes = 0
            # the reactor calls the transport's doWrite when its socket is writable: ours first
            t.doWrite = self._writeHeld
            t.startWriting()
        self._held.extend(parts)
        self._heldBytes += sum(len(p) for p in parts)
        if self._heldBytes > LINK_HIGH_WATER and not self.paused:
            # as the transport's high water mark would: this node's publishers are in flow
            self._heldPaused = True
            self.pauseProducing()

    def _writeHeld(self):
        """The socket is writable: what it takes of the held output; the transport's own write once empty."""
        t = self.transport
        held = self._held
        if held:
            rest = _sendParts(t.socket, held)
            self._heldBytes -= sum(len(p) for p in held) - sum(len(p) for p in rest)
            if rest:
                self._held = rest
                return None
        self._held = None
        self._heldBytes = 0
        del t.doWrite
        if self._heldPaused:
            self._heldPaused = False
            if self.paused:
                self.resumeProducing()
        # (stops writing when the transport holds nothing, else writes what it holds)
        return t.doWrite()

    def _kick(self):
        if self._flushCall is None:
            self._flushCall = self.clock.callLater(0, self.flush)

    def forward(self, names, redelivered, message, writer=None):
        """
        Forward ``message`` to a queue there (``names``: its vhost and name,
        encoded once by the RemoteQueue; ``writer``: a replicated stream's
        ``(writer id, sequence)``); its forward number (int).
        """
        self._forwarded = True
        self._fwdOut += 1
        self.send(wire.forwardNamed(names, redelivered, message, writer))
        return self._fwdOut

    def streamAppend(self, names, count, entries):
        """A stream protocol publish to a stream there (STREAM_APPEND); its forward number (int)."""
        self._forwarded = True
        self._fwdOut += 1
        self.send(wire.streamAppend(names, count, entries))
        return self._fwdOut

    def streamDedup(self, names, reference, groups, entries):
        """
        A stream protocol publish with a publisher reference to a stream
        there (STREAM_DEDUP: de-duplicated by its leader); its forward number.
        """
        self._forwarded = True
        self._fwdOut += 1
        self.send(wire.streamDedup(names, reference, groups, entries))
        return self._fwdOut

    def refused(self, n):
        """True when the other node's queue refused forward ``n`` (reject-publish; asked once)."""
        if n in self._refused:
            self._refused.discard(n)
            return True
        return False

    def credit(self, cid, n):
        self._credits[cid] = self._credits.get(cid, 0) + n
        self._kick()

    def settle(self, how, eids):
        self._settles.setdefault(how, []).extend(eids)
        self._kick()

    def sync(self):
        """
        A Deferred that fires once the other node has taken (and fsync'd)
        everything forwarded so far; fails with :class:`LinkLost`.
        """
        if not self.connected:
            return defer.fail(LinkLost("link to node '%s' lost" % (self.peer,)))
        if self._pendingSync is None:
            self._syncSeq += 1
            self._pendingSync = self._syncSeq
            self._syncWaiters[self._syncSeq] = []
            self._kick()
        self._forwarded = False
        d = defer.Deferred()
        self._syncWaiters[self._pendingSync].append(d)
        return d

    def ask(self, op, args):
        """Send a request; a Deferred firing with its result (dict) or an AMQPError."""
        if not self.connected:
            return defer.fail(LinkLost("link to node '%s' lost" % (self.peer,)))
        self._rid += 1
        rid = self._rid
        d = self._asks[rid] = defer.Deferred()
        # a request sees the settles made before it (a requeue, then basic.get)
        self._drainBatched()
        self.send(wire.request(rid, op, args))

        def late():
            if self._asks.pop(rid, None) is d:
                d.errback(LinkLost("node '%s' did not answer %s in %d s" % (self.peer, op, ASK_TIMEOUT)))

        timer = self.clock.callLater(ASK_TIMEOUT, late)

        def answered(result):
            if timer.active():
                timer.cancel()
            return result

        return d.addBoth(answered)

    def outstanding(self, queue, entry):
        self._eid += 1
        self._outstanding[self._eid] = (queue, entry)
        return self._eid

    def consumerCancelled(self, consumer):
        if self._consumers.pop(consumer.cid, None) is not None:
            self.send(wire.u32frame(wire.CANCELLED, consumer.cid))

    # --- input ----------------------------------------------------------------

    def dataReceived(self, data):
        big = self._big
        if big is not None:
            # the rest of a large frame: gathered, joined once complete
            need = self._bigNeed - self._bigHave
            if len(data) < need:
                big.append(data)
                self._bigHave += len(data)
                return
            view = memoryview(data)
            big.append(view[:need])
            self._big = None
            self._ready.append((self._bigKind, b"".join(big)))
            self._buf += view[need:]
            view.release()
        else:
            self._buf += data
        if not self._sliced:
            self._take()

    def _take(self):
        """
        Handle at most :data:`FRAMES_PER_SLICE` frames; with more waiting,
        stop reading the socket until the next reactor turn, so this node's
        clients are served between slices and a busy node reads its links no
        faster than it handles them (the other node's write buffer then
        fills, and its publishers go into flow).
        """
        buf = self._buf
        ready = self._ready
        if ready:
            # (a large frame completed by the last read comes before what followed it)
            self._ready = []
            frames, used = wire.splitFrames(buf, FRAMES_PER_SLICE - len(ready))
            frames = ready + frames
        else:
            frames, used = wire.splitFrames(buf, FRAMES_PER_SLICE)
        if used:
            del buf[:used]
        if len(frames) == FRAMES_PER_SLICE and len(buf) >= 4 and self.connected:
            if not self._sliced:
                self._sliced = True
                self.transport.pauseProducing()
            self.clock.callLater(0, self._nextSlice)
        else:
            if self._sliced:
                self._sliced = False
                self.transport.resumeProducing()
            if len(buf) >= 5:
                size = wire._U32.unpack_from(buf, 0)[0]
                if size >= BIG_FRAME and len(buf) < 4 + size:
                    # an incomplete large frame: its payload so far out of the buffer, the
                    # rest gathered as it comes (dataReceived)
                    self._bigKind = buf[4]
                    self._bigNeed = size - 1
                    self._bigHave = len(buf) - 5
                    self._big = [bytes(memoryview(buf)[5:])]
                    del buf[:]
        self._handle(frames)

    _sliced = False
    #: the payload of an incomplete large frame so far (a list of bytes-like), or None
    _big = None
    _bigKind = _bigNeed = _bigHave = 0
    #: frames completed by a read and not handled yet
    _ready = ()

    def _nextSlice(self):
        if self.connected:
            self._take()

    def _handle(self, frames):
        # deliveries to this node's clients caused by these frames are written
        # once per connection at the end, not once per message
        batchers = self.node.batchers
        for b in batchers:
            b.beginBatch()
        try:
            for kind, payload in frames:
                try:
                    self._frame(kind, wire.Reader(payload))
                except Exception:
                    log.failure("link frame {kind} from node {peer}", kind=kind, peer=self.peer)
        finally:
            for b in batchers:
                b.endBatch()

    def _frame(self, kind, r):
        node = self.node
        if kind == wire.FORWARD:
            vhost, queue, flags = r.string(), r.string(), r.u8()
            ex, rk, props, body = r.message()
            writer = (r.string(), r.u64()) if flags & 2 else None
            self._fwdIn += 1
            m = Message(ex, rk, props, body)
            if node.forwarded(self, vhost, queue, bool(flags & 1), m, writer) is False:
                self._refusedIn.append(self._fwdIn)
            elif m.forwarded:
                # taken by a replicated quorum queue here: its SYNCED waits for the followers
                self._replicatedIn.append((self._fwdIn, m.forwarded))
        elif kind == wire.DELIVER:
            cid, eid, flags = r.u32(), r.u64(), r.u8()
            ex, rk, props, body = r.message()
            found = node.consumerFor(cid)
            if found is None:
                if eid:
                    self.settle(wire.REQUEUE, [eid])
                return
            rq, consumer = found
            rq.delivered(cid, consumer, RemoteEntry(Message(ex, rk, props, body), bool(flags & 1), eid, cid, None,
                                                      self))
        elif kind == wire.SETTLE:
            how, n = r.u8(), r.u32()
            self._settled(how, [r.u64() for _ in range(n)])
        elif kind == wire.CREDIT:
            cid, n = r.u32(), r.u32()
            c = self._consumers.get(cid)
            if c is not None:
                c.credit += n
                c.queue.dispatch()
        elif kind == wire.SYNC:
            n = r.u64()
            refused, self._refusedIn = self._refusedIn, []
            replicated, self._replicatedIn = self._replicatedIn, []
            first, self._fwdAtSync = self._fwdAtSync + 1, self._fwdIn
            replicaOps, self._replicaOpsIn = self._replicaOpsIn, False
            d = node.broker.journal.sync()

            def storeFailed(f, first=first, last=self._fwdIn, replicaOps=replicaOps):
                # not on disk here: the forwards since the last SYNC are refused (nacks), and a
                # leader replicating to this node drops it from the in-sync set first
                log.error("cluster: the store failed under a link SYNC from {peer}: {why}", peer=self.peer,
                          why=f.getErrorMessage())
                refused.extend(k for k in range(first, last + 1) if k not in refused)
                if replicaOps:
                    self.send(wire.frame(wire.REPL_FAILED, b""))
                    node.replication.storeFailed(self.peer)
                return None

            d.addErrback(storeFailed)
            if replicated:
                d = self._replicatedSync(d, replicated, refused)
            if self._syncChain is not None and not self._syncChain.called:
                # SYNCED answers go in order: one covers every SYNC before it
                prev = self._syncChain
                d = defer.gatherResults([prev, d.addErrback(lambda f: None)])
            d.addBoth(lambda _: self.send(wire.synced(n, refused)))
            self._syncChain = d
        elif kind == wire.SYNCED:
            n = r.u64()
            for _ in range(r.u32()):
                self._refused.add(r.u64())
            for k in sorted(k for k in self._syncWaiters if k <= n):
                for d in self._syncWaiters.pop(k):
                    d.callback(None)
        elif kind == wire.CONSUME:
            cid, vhost, queue, flags = r.u32(), r.string(), r.string(), r.u8()
            priority, credit = r.i32(), r.u32()
            arguments = _consumeArguments(r.blob()) if r.more() else None
            self._consume(cid, vhost, queue, bool(flags & 1), bool(flags & 2), priority, credit, arguments)
        elif kind == wire.CANCEL:
            c = self._consumers.pop(r.u32(), None)
            if c is not None:
                c.queue.removeConsumer(c)
        elif kind == wire.CANCELLED:
            node.cancelledByHome(r.u32())
        elif kind == wire.CONSUME_ERR:
            node.cancelledByHome(r.u32())
        elif kind == wire.REQUEST:
            rid, op, args = r.u32(), r.string(), r.json()
            self._request(rid, op, args)
        elif kind == wire.REPLY:
            rid, code, result = r.u32(), r.u16(), r.json()
            d = self._asks.pop(rid, None)
            if d is not None:
                if code:
                    d.errback(AMQPError.fromReplyText(code, result))
                else:
                    d.callback(result)
        elif kind == wire.STREAM_APPEND:
            vhost, queue, count = r.string(), r.string(), r.u32()
            # (numbered as a forward: the sender learns from SYNCED whether it was taken)
            self._fwdIn += 1
            rep = node.streamAppended(vhost, queue, count, r.blob())
            if rep is False:
                self._refusedIn.append(self._fwdIn)
            elif rep is not None:
                # a replicated stream: its SYNCED waits for the followers in sync
                self._replicatedIn.append((self._fwdIn, [(rep, 0)]))
        elif kind == wire.STREAM_DEDUP:
            vhost, queue, reference, groups, entries = wire.readStreamDedup(r)
            self._fwdIn += 1
            # the stream door's backend de-duplicates as for its own publishers (door/streambackend.py)
            backend = getattr(node.broker, "streamBackend", None)
            taken = backend.appendForwarded(vhost, queue, reference, groups, entries) if backend else False
            if taken is False:
                self._refusedIn.append(self._fwdIn)
            elif taken is not None:
                # its SYNCED waits for the write to be durable (and on the followers in sync)
                self._replicatedIn.append((self._fwdIn, [(taken, 0)]))
        elif kind == wire.REPLICATE:
            self._replicaOpsIn = True
            node.replication.replicated(self, r)
        elif kind == wire.REPL_FAILED:
            node.replication.followerFailed(self.peer)
        elif kind == wire.FENCED:
            node.replication.fencedBy(self, r)
        elif kind == wire.DELAYED:
            node.delayed.frame(self, r)
        elif kind == wire.STATS:
            node.figuresFrom(self.peer, r.json())
        elif kind == wire.HELLO:
            self.peer = r.string()
            node.linkUp(self)

    _syncChain = None

    def _replicatedSync(self, d, replicated, refused):
        """
        ``d`` (the journal's sync), then the sync of every replicated quorum
        queue the forwards in ``replicated`` went to: the forwards of one
        that failed (no majority, fenced) are answered as refused (nacks).
        """
        reps = []
        for _, fwds in replicated:
            for rep, _ in fwds:
                if rep not in reps:
                    reps.append(rep)
        failed = set()

        def one(rep):
            return rep.sync().addErrback(lambda f: failed.add(rep))

        def done(_):
            if failed:
                refused.extend(k for k, fwds in replicated if any(rep in failed for rep, _ in fwds))

        ds = [d.addErrback(lambda f: None)] + [one(rep) for rep in reps]
        return defer.gatherResults(ds).addCallback(done)

    def _consume(self, cid, vhost, queue, noAck, exclusive, priority, credit, arguments=None):
        q = self.node.localQueue(vhost, queue)
        if q is None or q.deleted or q.refusesConsumer(exclusive):
            self.send(wire.u32frame(wire.CONSUME_ERR, cid))
            return
        c = LinkConsumer(self, cid, q, "link-%s-%d" % (self.peer, cid), noAck, priority, credit, arguments)
        self._consumers[cid] = c
        q.addConsumer(c, exclusive)

    def _settled(self, how, eids):
        byQueue = {}
        outstanding = self._outstanding
        for eid in eids:
            found = outstanding.pop(eid, None)
            if found is not None:
                byQueue.setdefault(found[0], []).append(found[1])
        for q, entries in byQueue.items():
            if how == wire.ACK:
                for e in entries:
                    q.settle(e)
            elif how == wire.REJECT:
                q.reject(entries)
            else:
                _requeue(q, entries)

    def _request(self, rid, op, args):
        def ok(result):
            self.send(wire.reply(rid, 0, result))

        def failed(f):
            if f.check(AMQPError):
                self.send(wire.reply(rid, f.value.code, f.value.text))
            else:
                log.failure("link request {op}", f, op=op)
                self.send(wire.reply(rid, 541, "INTERNAL_ERROR - internal error"))

        d = defer.maybeDeferred(self.node.answer, self, op, args)
        d.addCallbacks(ok, failed)


class LinkFactory(protocol.Factory):
    """Accepts links from other nodes (they say who they are with HELLO)."""

    def __init__(self, node):
        self.node = node

    def buildProtocol(self, addr):
        p = LinkProtocol(self.node)
        p.factory = self
        return p
