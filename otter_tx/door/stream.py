"""
The stream door: RabbitMQ's stream protocol (rabbitmq_stream plugin, port
5552) on Twisted. Bytes go through otter_tx.stream.wire's FrameReader and
decoders; the commands act on a streams backend (otter_tx.door.streambackend
describes what it needs) and on the broker's users and permissions
(otter_tx.broker.access), as RabbitMQ's rabbit_stream_reader.erl does.

Flow control: the door is the transport's IPushProducer. While the transport
is paused no chunk is read or written; each turn writes at most
:data:`CHUNKS_PER_TURN` chunks and then yields to the reactor, so a slow or
fast consumer never makes the door buffer unbounded output or block the
reactor. A subscription only gets chunks while it has credit (one credit =
one chunk, as RabbitMQ).
"""

import os

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from zope.interface import implementer

from otter_tx.broker.access import CONFIGURE, READ, WRITE, login, permits
from otter_tx.broker.stream import FileRange
from otter_tx.door.writev import WRITEV
from otter_tx.resources.sockets import MAX_PARTS, directSocket, readInto, sendRun
from otter_tx.store.log.segments import crc32
from otter_tx.store.rawio import makeCompact
from otter_tx.stream import chunk as _chunk
from otter_tx.stream import wire

log = Logger()

#: PyPy: a publish frame's entries are moved together in the receive buffer and written to the
#: log from there (docs/performance.md, "The stream protocol's publish path on PyPy"); None on
#: CPython, where taking them out with struct is as fast
COMPACT = makeCompact(crc32) if WRITEV is not None else None

#: largest frame an open connection may send.  RabbitMQ 3.10 does not hold an open connection to
#: the tuned frame_max (checked on the peer: a 22 MB publish frame with 1 MiB tuned is taken, and
#: rstream's Producer sends all it buffered as one frame, 1.5 MB for 100,000 small messages); this
#: bound only keeps one frame's receive buffer finite
OPEN_FRAME_MAX = 256 * 1024 * 1024

#: most chunks, and about most messages, a turn writes before yielding to the reactor
CHUNKS_PER_TURN = 16
MESSAGES_PER_TURN = 4096
MAX_PUBLISHERS = 256
#: seconds between looks at a resource alarm that blocks a publishing connection
ALARM_CHECK = 0.5
MAX_SUBSCRIPTIONS = 256
MAX_REFERENCE = 256

#: bytes a deliver frame adds to its chunk's data (frame size, key, version,
#: subscription id, chunk header): counted in ``sendOct``
_DELIVER_BYTES = 4 + 2 + 2 + 1 + _chunk.HEADER_SIZE


def _asBytes(p):
    t = type(p)
    if t is bytes:
        return p
    if t is FileRange:
        return p.read()
    return bytes(p)


def writeDirect(transport, parts):
    """
    Write ``parts`` (bytes-like, or :class:`~otter_tx.broker.stream.FileRange`
    s: bytes of a segment file) to ``transport`` in order: straight to its
    socket when :func:`~otter_tx.resources.sockets.directSocket` allows (Twisted's own write joins what it
    buffers into one string and sends 128 KiB a reactor turn; a stream chunk is
    up to half a MiB), buffers with one ``sendmsg``, file ranges with
    ``sendfile``; the rest (all of it when the socket is not writable or not
    available) through the transport's buffer, read into bytes. Returns True
    when everything went out now.
    """
    sock = directSocket(transport)
    i = 0
    sent = 0
    if sock is not None:
        n = len(parts)
        while i < n:
            # the buffers up to the next file range: one sendmsg
            j = i
            while j < n and type(parts[j]) is not FileRange and j - i < MAX_PARTS:
                j += 1
            if j > i:
                # (PyPy: libc's writev for views, as its sendmsg copies buffers that are not bytes;
                # cffi.from_buffer of young bytes costs more than its sendmsg of them)
                i, sent = sendRun(sock, parts, i, j, WRITEV)
                if i < j:
                    break
                sent = 0
                continue
            r = parts[i]
            try:
                fd = r.f.fileno()
                while sent < r.size:
                    k = os.sendfile(sock.fileno(), fd, r.pos + sent, r.size - sent)
                    if not k:
                        break
                    sent += k
            except (BlockingIOError, InterruptedError):
                pass
            except (OSError, ValueError):
                pass
            if sent < r.size:
                break
            i += 1
            sent = 0
        if i == n:
            return True
    rest = parts[i:]
    if sent:
        p = rest[0]
        rest[0] = p.read(sent) if type(p) is FileRange else memoryview(p)[sent:]
    transport.writeSequence([_asBytes(p) for p in rest])
    return False


_PRE_AUTH = {wire.PEER_PROPERTIES, wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE, wire.TUNE,
             wire.OPEN, wire.HEARTBEAT, wire.CLOSE, wire.CLOSE | wire.RESPONSE_FLAG}


class _Publisher:
    __slots__ = ("pid", "stream", "reference", "published", "confirmed", "errored")

    def __init__(self, pid, stream, reference):
        self.pid = pid
        self.stream = stream
        self.reference = reference
        # what the management API shows (rabbitmq_stream_management): messages published
        # (each publish frame's count), publishing ids confirmed and errored
        self.published = 0
        self.confirmed = 0
        self.errored = 0


class _Subscription:
    __slots__ = ("sid", "stream", "offset", "credit", "props", "active", "group", "listener",
                 "name", "superStream", "awaiting", "consumed", "chunk")

    def __init__(self, sid, stream, offset, credit, props):
        self.sid = sid
        self.stream = stream
        self.offset = offset
        self.credit = credit
        self.props = props
        self.active = True
        # activated by a consumer_update the client has not answered yet: nothing is sent
        self.awaiting = False
        self.group = None
        self.listener = None
        self.name = props.get("name")
        self.superStream = props.get("super-stream")
        # what the management API shows: messages delivered (each chunk's count), and the
        # first offset of the last chunk delivered (RabbitMQ's consumer "offset": 0 before one)
        self.consumed = 0
        self.chunk = 0


class ConsumerGroups:
    """
    Single active consumer for streams (RabbitMQ 3.11+): per ``(vhost,
    stream, name)``, the consumers in subscription order. Without a super
    stream the first one is active; in a super stream's partition the active
    one is the consumer at ``partitionIndex % len(consumers)``, as
    rabbit_stream_sac_coordinator. A change calls ``activate`` /
    ``deactivate`` on the doors holding the consumers.
    """

    def __init__(self):
        self.groups = {}

    def join(self, key, door, sub, partitionIndex):
        members = self.groups.setdefault(key, [])
        members.append((door, sub))
        self._rebalance(key, partitionIndex)

    def leave(self, key, door, sub, partitionIndex):
        members = self.groups.get(key)
        if not members:
            return
        members[:] = [(d, s) for d, s in members if s is not sub]
        if not members:
            del self.groups[key]
            return
        self._rebalance(key, partitionIndex)

    def _rebalance(self, key, partitionIndex):
        members = self.groups[key]
        idx = 0 if partitionIndex < 0 else partitionIndex % len(members)
        want = members[idx]
        for d, s in members:
            if s is not want[1] and s.active:
                s.active = False
                d.consumerUpdate(s, False)
        d, s = want
        if not s.active or s.group is None:
            s.active = True
            s.group = key
            d.consumerUpdate(s, True)
        for _, s2 in members:
            s2.group = key


@implementer(IPushProducer)
class StreamServerProtocol(Protocol):
    """One stream-protocol connection."""

    def __init__(self):
        self.reader = wire.ReceiveBuffer(wire.INITIAL_FRAME_MAX, pool=wire.SHARED_POOL)
        self.state = "start"
        self.user = None
        self.vhost = None
        self.clientProperties = {}
        self.frameMax = wire.DEFAULT_FRAME_MAX
        self.heartbeat = wire.DEFAULT_HEARTBEAT
        self.publishers = {}
        self.publisherRefs = {}
        self.subscriptions = {}
        self.paused = False
        self.closed = False
        self._out = None
        self._pumpCall = None
        self._hbCall = None
        self._lastReceived = 0
        self._lastSent = 0
        self._corr = 0
        self._pendingUpdates = {}
        self.mechanism = None
        # what the management API shows of the connection (otter_tx.web._format.streamConnectionDict):
        # bytes and socket reads / writes (counted per read, per write and per chunk)
        self.recvOct = self.recvCnt = self.sendOct = self.sendCnt = 0
        self.connectedAt = 0.0
        self.name = ""
        self.peer = self.local = None
        #: reading is paused while a resource alarm blocks publishers (a timer looks again)
        self.blocked = False
        self._blockCall = None

    # --- connection

    def connectionMade(self):
        f = self.factory
        self.broker = f.broker
        self.backend = f.backend
        self.clock = f.clock
        self.frameMax = f.frameMax
        self.heartbeat = f.heartbeat
        self.transport.registerProducer(self, True)
        # a plain TCP connection reads into the reader's buffer (bytesReceived); others call dataReceived
        readInto(self.transport, self.reader.space, self.bytesReceived)
        self._lastReceived = self._lastSent = self.clock.seconds()
        peer = self.transport.getPeer()
        self.peerHost = getattr(peer, "host", None)
        self.connectedAt = self.clock.seconds()
        self.peer = peer
        self.local = local = self.transport.getHost()
        # RabbitMQ's connection name, as the management API lists it
        self.name = "%s:%s -> %s:%s" % (getattr(peer, "host", "?"), getattr(peer, "port", 0),
                                        getattr(local, "host", "?"), getattr(local, "port", 0))
        f.connections.add(self)
        self.broker.streamCounters.connections.add(self)
        self._handshakeTimer = self.clock.callLater(f.handshakeTimeout, self._handshakeTimeout)

    def connectionLost(self, reason=None):
        self.closed = True
        self.broker.counters.connectionsClosed += 1
        self.factory.connections.discard(self)
        self.broker.streamCounters.connections.discard(self)
        for call in (self._pumpCall, self._hbCall, self._handshakeTimer, self._blockCall):
            if call is not None and call.active():
                call.cancel()
        for sub in list(self.subscriptions.values()):
            self._dropSubscription(sub)
        self.subscriptions.clear()

    def _handshakeTimeout(self):
        self._handshakeTimer = None
        if self.state != "open":
            self.transport.abortConnection()

    def send(self, data):
        self.sendOct += len(data)
        if self._out is not None:
            self._out.append(data)
        elif not self.closed:
            self.transport.write(data)
            self.sendCnt += 1
            self._lastSent = self.clock.seconds()

    def closeConnection(self):
        """Close the connection as the management API's DELETE does (RabbitMQ 3.10 sends no close frame)."""
        if not self.closed:
            self.closed = True
            self.state = "closing"
            self.transport.loseConnection()

    def dataReceived(self, data):
        self._received(len(data), self.reader.feed, data)

    def bytesReceived(self, n):
        """``n`` bytes were read into ``self.reader.space()`` (:func:`~otter_tx.resources.sockets.readInto`)."""
        self._received(n, self.reader.filled, n)

    def _received(self, n, split, arg):
        self._lastReceived = self.clock.seconds()
        self.recvOct += n
        self.recvCnt += 1
        self.broker.received(n)
        try:
            frames = split(arg)
        except wire.FrameTooLarge as e:
            log.warn("stream connection: frame of {size} bytes exceeds frame_max {max}",
                     size=e.size, max=e.frameMax)
            if self.state == "open":
                self.send(wire.closeRequest(self._nextCorr(), self._counted(wire.FRAME_TOO_LARGE), "frame too large"))
            self.transport.loseConnection()
            self.closed = True
            return
        if not frames:
            return
        self._out = out = []
        try:
            for body in frames:
                if self.closed:
                    break
                try:
                    key, version, corr, args = wire.decodeFrame(body)
                except wire.FrameError:
                    self._unknownFrame()
                    break
                self._dispatch(key, version, corr, args)
        finally:
            self._out = None
            if out and not self.closed:
                self.transport.writeSequence(out)
                self.sendCnt += 1
                self._lastSent = self.clock.seconds()

    def _unknownFrame(self):
        if self.state == "open":
            self.send(wire.closeRequest(self._nextCorr(), self._counted(wire.UNKNOWN_FRAME), "unknown frame"))
            self._closeSoon()
        else:
            self.transport.loseConnection()
            self.closed = True

    def _counted(self, code):
        """
        ``code`` (a response code), counted in ``rabbitmq_global_stream_error_*``
        when it is an error, as RabbitMQ's stream reader counts each error
        response it sends after the connection opened (NO_OFFSET is no error).
        """
        if code != wire.OK and code != wire.NO_OFFSET:
            self.broker.streamCounters.error(code)
        return code

    def _closeSoon(self):
        """Close once what was written is out (the client reads the refusal first)."""
        self.state = "closing"
        if self._out:
            self.transport.writeSequence(self._out)
            self._out = []
        self.closed = True
        self.transport.loseConnection()

    def _nextCorr(self):
        self._corr = (self._corr + 1) & 0xFFFFFFFF
        return self._corr

    def _dispatch(self, key, version, corr, args):
        if self.state != "open" and key not in _PRE_AUTH:
            log.warn("stream connection: command {key} before open, closing", key=key)
            self.transport.loseConnection()
            self.closed = True
            return
        handler = _HANDLERS.get(key)
        if handler is None:
            if key & wire.RESPONSE_FLAG:
                return  # a response we do not wait for
            self._unknownFrame()
            return
        handler(self, corr, version, *args)

    # --- handshake

    def _peerProperties(self, corr, version, props):
        self.clientProperties = props
        self.send(wire.peerPropertiesResponse(corr, self.factory.serverProperties()))
        self.state = "peer"

    def _saslHandshake(self, corr, version):
        self.send(wire.saslHandshakeResponse(corr, ["PLAIN"]))
        self.state = "auth"

    def _saslAuthenticate(self, corr, version, mechanism, data):
        if mechanism != "PLAIN":
            self.send(wire.saslAuthenticateResponse(corr, wire.SASL_MECHANISM_NOT_SUPPORTED))
            return
        parts = data.split(b"\x00")
        if len(parts) != 3:
            self.send(wire.saslAuthenticateResponse(corr, wire.SASL_ERROR))
            self._closeSoon()
            return
        try:
            username = parts[1].decode("utf-8")
            password = parts[2].decode("utf-8")
        except UnicodeDecodeError:
            self.send(wire.saslAuthenticateResponse(corr, wire.SASL_ERROR))
            self._closeSoon()
            return
        user, refusal = login(self.broker.users, username, password, self.peerHost,
                              self.broker.loopbackUsers)
        if user is None:
            if refusal == "can only connect via localhost":
                code = wire.SASL_AUTHENTICATION_FAILURE_LOOPBACK
            else:
                code = wire.AUTHENTICATION_FAILURE
            log.warn("stream connection: user '{u}' refused: {r}", u=username, r=refusal)
            self.send(wire.saslAuthenticateResponse(corr, code))
            self._closeSoon()
            return
        self.user = user
        self.mechanism = mechanism
        self.send(wire.saslAuthenticateResponse(corr, wire.OK))
        self.send(wire.tune(self.frameMax, self.heartbeat))
        self.state = "tuning"

    def _tune(self, corr, version, frameMax, heartbeat):
        if frameMax == 0:
            frameMax = self.frameMax
        elif self.frameMax:
            frameMax = min(frameMax, self.frameMax)
        self.frameMax = frameMax
        self.heartbeat = heartbeat
        if self.state == "tuning":
            self.state = "tuned"

    def _open(self, corr, version, vhostName):
        if self.user is None:
            self.transport.loseConnection()
            self.closed = True
            return
        vhost = self.broker.vhosts.get(vhostName)
        if vhost is None or not self.broker.canAccess(self.user, vhostName):
            self.send(wire.openResponse(corr, wire.VHOST_ACCESS_FAILURE))
            self._closeSoon()
            return
        self.vhost = vhostName
        host, port = self.factory.advertised(self.transport)
        self.send(wire.openResponse(corr, wire.OK, {"advertised_host": host,
                                                     "advertised_port": str(port)}))
        self.state = "open"
        # RabbitMQ 3.10 counts a stream connection opened once it opens a vhost, and closed
        # whenever it goes (one that never opened too): rabbitmq_connections_*_total, churn
        self.broker.counters.connectionsOpened += 1
        # from now on frames above the tuned frame_max are taken, as RabbitMQ 3.10 takes them
        self.reader.frameMax = OPEN_FRAME_MAX
        if self._handshakeTimer is not None and self._handshakeTimer.active():
            self._handshakeTimer.cancel()
        self._handshakeTimer = None
        self._scheduleHeartbeat()
        log.info("stream connection: user '{user}' granted access to vhost '{vhost}'",
                 user=self.user.name, vhost=vhostName)

    def _close(self, corr, version, code, reason):
        self.send(wire.response(wire.CLOSE, corr, wire.OK))
        self.state = "closing"
        self.closed = True
        if self._out:
            self.transport.writeSequence(self._out)
            self._out = []
        self.transport.loseConnection()

    def _closeResponse(self, corr, version, code):
        self.transport.loseConnection()
        self.closed = True

    def _heartbeatFrame(self, corr, version):
        pass

    def _scheduleHeartbeat(self):
        if self.heartbeat and not self.closed:
            self._hbCall = self.clock.callLater(self.heartbeat, self._heartbeatTick)

    def _heartbeatTick(self):
        self._hbCall = None
        if self.closed:
            return
        now = self.clock.seconds()
        if self.blocked:
            # not reading: the client's heartbeats wait in the socket (RabbitMQ pauses its monitor)
            self._lastReceived = now
        if now - self._lastReceived > 2 * self.heartbeat:
            log.info("stream connection: missed heartbeats, closing")
            self.transport.abortConnection()
            self.closed = True
            return
        if now - self._lastSent >= self.heartbeat - 0.5:
            self.send(wire.heartbeat())
        self._scheduleHeartbeat()

    # --- permissions

    def _allowed(self, perm, name):
        return self.broker.canAccess(self.user, self.vhost) and self._permits(perm, name)

    def _permits(self, perm, name):
        return permits(self.broker.permissions, self.user.name, self.vhost, perm, "queue", name)

    # --- streams

    def _create(self, corr, version, name, arguments):
        if not _validName(name):
            self.send(wire.response(wire.CREATE_STREAM, corr, self._counted(wire.PRECONDITION_FAILED)))
            return
        if not self._permits(CONFIGURE, name):
            self.send(wire.response(wire.CREATE_STREAM, corr, self._counted(wire.ACCESS_REFUSED)))
            return
        if self.backend.exists(self.vhost, name):
            self.send(wire.response(wire.CREATE_STREAM, corr, self._counted(wire.STREAM_ALREADY_EXISTS)))
            return
        code = self.backend.create(self.vhost, name, arguments)
        if isinstance(code, Deferred):
            # a cluster's: the stream is created at its home node (docs/streams.md, "In a cluster")
            code.addCallback(lambda c: self.send(wire.response(wire.CREATE_STREAM, corr, c)))
            return
        self.send(wire.response(wire.CREATE_STREAM, corr, self._counted(code)))

    def _delete(self, corr, version, name):
        if not self._permits(CONFIGURE, name):
            self.send(wire.response(wire.DELETE_STREAM, corr, self._counted(wire.ACCESS_REFUSED)))
            return
        code = self.backend.delete(self.vhost, name)
        if isinstance(code, Deferred):
            # a stream on another node of the cluster: deleted there
            code.addCallback(lambda c: self.send(wire.response(wire.DELETE_STREAM, corr, c)))
            return
        self.send(wire.response(wire.DELETE_STREAM, corr, self._counted(code)))
        if code == wire.OK:
            self.factory.streamDeleted(self.vhost, name)

    def streamGone(self, name):
        """The stream ``name`` was deleted: drop its publishers and subscriptions, tell the client."""
        gone = False
        for pid, p in list(self.publishers.items()):
            if p.stream == name:
                self._dropPublisher(p)
                gone = True
        for sid, s in list(self.subscriptions.items()):
            if s.stream == name:
                self._dropSubscription(s)
                del self.subscriptions[sid]
                gone = True
        if gone:
            self.send(wire.metadataUpdate(self._counted(wire.STREAM_NOT_AVAILABLE), name))

    def _metadata(self, corr, version, streams):
        here = self.factory.advertised(self.transport)
        brokers = []  # those a stream names (RabbitMQ 3.10 lists no other), else this node
        out = []
        def replicaIndexes(name):
            out = []
            for r in self._replicas(name):
                if r not in brokers:
                    brokers.append(r)
                out.append(brokers.index(r))
            return out

        for name in streams:
            if self.backend.exists(self.vhost, name):
                if here not in brokers:
                    brokers.append(here)
                out.append((name, wire.OK, brokers.index(here), replicaIndexes(name)))
                continue
            # in a cluster, a stream on another node: its leader is that node's stream
            # listener; its replicas the in-sync followers' (docs/streams.md, "In a cluster")
            where = self._elsewhere(name)
            if where is None:
                out.append((name, wire.STREAM_DOES_NOT_EXIST, 0, []))
            elif where is False:
                out.append((name, wire.STREAM_NOT_AVAILABLE, 0, []))
            else:
                if where not in brokers:
                    brokers.append(where)
                out.append((name, wire.OK, brokers.index(where), replicaIndexes(name)))
        self.send(wire.metadataResponse(corr, brokers or [here], out))

    def _readable(self, name):
        """The stream can be read here: held here, or (in a cluster) a replica here."""
        readable = getattr(self.backend, "readable", None)
        return readable(self.vhost, name) if readable is not None else self.backend.exists(self.vhost, name)

    def _replicas(self, name):
        """``(host, port)`` of the stream's in-sync replicas' stream listeners (a cluster's), else []."""
        replicas = getattr(self.backend, "replicas", None)
        return replicas(self.vhost, name) if replicas is not None else []

    def _elsewhere(self, name):
        """The backend's ``elsewhere`` (a cluster's stream on another node), when it has one."""
        elsewhere = getattr(self.backend, "elsewhere", None)
        return elsewhere(self.vhost, name) if elsewhere is not None else None

    def _askHome(self, stream, op, args, answer):
        """
        A cluster's stream led by another node: ``answer(result)`` with what
        its leader answers ``op`` (the backend's askHome: a dict with
        ``code``, STREAM_NOT_AVAILABLE when the leader's node is down or
        silent); False when no other node has such a stream.
        """
        ask = getattr(self.backend, "askHome", None)
        d = ask(self.vhost, stream, op, args) if ask is not None else None
        if d is None:
            return False
        d.addCallback(lambda r: None if self.closed else answer(r))
        return True

    def _streamStats(self, corr, version, name):
        if not self._permits(READ, name):
            self.send(wire.streamStatsResponse(corr, self._counted(wire.ACCESS_REFUSED), {}))
        elif not self.backend.exists(self.vhost, name):
            # led by another node of the cluster: its leader answers (docs/streams.md, "In a cluster")
            if not self._askHome(name, "stream.stats", {}, lambda r: self.send(
                    wire.streamStatsResponse(corr, self._counted(r["code"]), r.get("stats") or {}))):
                self.send(wire.streamStatsResponse(corr, self._counted(wire.STREAM_DOES_NOT_EXIST), {}))
        else:
            self.send(wire.streamStatsResponse(corr, wire.OK, self.backend.stats(self.vhost, name)))

    def _commandVersions(self, corr, version, versions):
        self.send(wire.commandVersionsResponse(corr))

    # --- publishers

    def _declarePublisher(self, corr, version, pid, reference, stream):
        reply = lambda code: self.send(wire.response(wire.DECLARE_PUBLISHER, corr, self._counted(code)))  # noqa: E731
        if len(self.publishers) >= MAX_PUBLISHERS:
            return reply(wire.PRECONDITION_FAILED)
        if reference is not None and len(reference.encode("utf-8")) > MAX_REFERENCE:
            return reply(wire.PRECONDITION_FAILED if self._permits(WRITE, stream) else wire.ACCESS_REFUSED)
        if not self._permits(WRITE, stream):
            return reply(wire.ACCESS_REFUSED)
        ref = reference or None
        if pid in self.publishers or (ref is not None and (stream, ref) in self.publisherRefs):
            return reply(wire.PRECONDITION_FAILED)
        if not self.backend.exists(self.vhost, stream):
            # a stream led by another node of the cluster: its publishes are forwarded there,
            # as RabbitMQ 3.10 writes to the leader; with a reference, the leader de-duplicates
            # them (it keeps the sequence): docs/streams.md, "In a cluster"
            where = self._elsewhere(stream)
            if where is None:
                return reply(wire.STREAM_DOES_NOT_EXIST)
            if where is False:
                return reply(wire.STREAM_NOT_AVAILABLE)
        self.publishers[pid] = _Publisher(pid, stream, ref)
        if ref is not None:
            self.publisherRefs[(stream, ref)] = pid
        reply(wire.OK)

    def _dropPublisher(self, p):
        self.publishers.pop(p.pid, None)
        if p.reference is not None:
            self.publisherRefs.pop((p.stream, p.reference), None)

    def _deletePublisher(self, corr, version, pid):
        p = self.publishers.get(pid)
        if p is None:
            self.send(wire.response(wire.DELETE_PUBLISHER, corr, self._counted(wire.PUBLISHER_DOES_NOT_EXIST)))
            return
        self._dropPublisher(p)
        self.send(wire.response(wire.DELETE_PUBLISHER, corr, wire.OK))

    def _publish(self, corr, version, pid, count, body, pos):
        p = self.publishers.get(pid)
        try:
            batch = wire.publishBatch(body, pos, count, version, COMPACT) if p is not None else None
            entries = None if batch is not None else wire.publishedMessages(body, pos, count, version)
        except wire.FrameError:
            self._unknownFrame()
            return
        if p is None:
            code = self._counted(wire.PUBLISHER_DOES_NOT_EXIST)
            self.send(wire.publishError(pid, [(i, code) for i, _ in entries]))
            return
        self.broker.streamCounters.received += count
        p.published += count
        if self.broker.alarmed and not self.blocked:
            # as RabbitMQ: a publishing connection stops being read during a memory or disk alarm
            self.blocked = True
            self.transport.pauseProducing()
            self._blockCall = self.clock.callLater(ALARM_CHECK, self._checkAlarm)
        if batch is not None:
            # the fast path: the frame's entries are the chunk's, as they came
            ids, data, crc = batch
            if not self.backend.exists(self.vhost, p.stream):
                self._remoteWrite(p, ids, data, count)
                return
            # (PyPy: data is a view of the receive buffer, written to the log from there: its
            # bytes stay until the write is durable, or failed)
            token = self.reader.lend() if type(data) is memoryview else None
            confirmed, d = self.backend.append(self.vhost, p.stream, p.reference, ids, data, count, crc)
            if token is not None:
                if d is None:
                    token.release()
                else:
                    d.addBoth(token.release)
            self._confirm(pid, confirmed, d)
            return
        flat = []
        rejected = []
        for i, (pubId, m) in enumerate(entries):
            if isinstance(m, wire.SubBatch):
                try:
                    msgs = m.messages()
                except wire.FrameError:
                    rejected = [e[0] for e in entries[i:]]
                    break
                # one publishing id for the whole batch: its messages are stored, one confirm
                flat.append((pubId, msgs))
            else:
                flat.append((pubId, m))
        if rejected:
            code = self._counted(wire.PRECONDITION_FAILED)
            p.errored += len(rejected)
            self.send(wire.publishError(pid, [(i, code) for i in rejected]))
        if flat:
            self._write(p, flat)

    def _write(self, p, entries):
        backend = self.backend
        if not backend.exists(self.vhost, p.stream):
            msgs = [bytes(x) for _, m in entries for x in (m if isinstance(m, list) else [m])]
            # (a sub-entry batch: one publishing id for its messages, de-duplicated together)
            groups = [(i, len(m) if isinstance(m, list) else 1) for i, m in entries]
            self._remoteWrite(p, [i for i, _ in entries], _chunk.entries(msgs), len(msgs), groups)
            return
        if any(isinstance(m, list) for _, m in entries):
            # a sub-entry batch has one publishing id for all its messages: the first carries
            # it (de-duplication), the others follow it unless it was a duplicate
            confirmed = []
            d = None
            for pubId, m in entries:
                if not isinstance(m, list):
                    m = [m]
                seq = backend.sequence(self.vhost, p.stream, p.reference) if p.reference else -1
                c, d1 = backend.publish(self.vhost, p.stream, p.reference, [(pubId, m[0])])
                if pubId > seq and len(m) > 1:
                    c2, d1 = backend.publish(self.vhost, p.stream, None, [(pubId, x) for x in m[1:]])
                confirmed.append(pubId)
                d = d1 or d
        else:
            confirmed, d = backend.publish(self.vhost, p.stream, p.reference, entries)
        self._confirm(p.pid, confirmed, d)

    def _remoteWrite(self, p, ids, data, count, groups=None):
        """
        A cluster's stream led by another node: the publish forwarded there
        (with the publisher's reference: de-duplicated there); a publish
        error when it cannot be (the stream is gone, or its leader's node is
        down: STREAM_NOT_AVAILABLE).
        """
        remote = getattr(self.backend, "remoteAppend", None)
        r = None
        if remote is not None:
            if p.reference is not None:
                r = remote(self.vhost, p.stream, ids, data, count, p.reference, groups)
            else:
                r = remote(self.vhost, p.stream, ids, data, count)
        if r is None:
            code = self._counted(wire.STREAM_DOES_NOT_EXIST if self._elsewhere(p.stream) is None
                                 else wire.STREAM_NOT_AVAILABLE)
            p.errored += len(ids)
            self.send(wire.publishError(p.pid, [(i, code) for i in ids]))
            return
        self._confirm(p.pid, *r)

    def _confirm(self, pid, ids, d):
        """publish_confirm for ``ids`` now, or once ``d`` fires; a failed write is a publish_error."""
        if d is None:
            self._confirmed(pid, ids)
            return

        def failed(f):
            log.failure("stream publish failed", f)
            code = self._counted(wire.INTERNAL_ERROR)
            p = self.publishers.get(pid)
            if p is not None:
                p.errored += len(ids)
            self.send(wire.publishError(pid, [(i, code) for i in ids]))

        d.addCallbacks(lambda _: self._confirmed(pid, ids), failed)

    def _confirmed(self, pid, ids):
        self.broker.streamCounters.confirmed += len(ids)
        p = self.publishers.get(pid)
        if p is not None:
            p.confirmed += len(ids)
        self.send(wire.publishConfirm(pid, ids))

    def _querySequence(self, corr, version, reference, stream):
        if not self._permits(READ, stream):
            self.send(wire.querySequenceResponse(corr, self._counted(wire.ACCESS_REFUSED), 0))
        elif not self.backend.exists(self.vhost, stream):
            if not self._askHome(stream, "stream.sequence", {"reference": reference}, lambda r: self.send(
                    wire.querySequenceResponse(corr, self._counted(r["code"]), r.get("sequence", 0)))):
                self.send(wire.querySequenceResponse(corr, self._counted(wire.STREAM_DOES_NOT_EXIST), 0))
        else:
            self.send(wire.querySequenceResponse(
                corr, wire.OK, self.backend.sequence(self.vhost, stream, reference)))

    # --- offsets

    def _storeOffset(self, corr, version, reference, stream, offset):
        if not reference or len(reference.encode("utf-8")) > MAX_REFERENCE:
            return
        if not self._permits(READ, stream):
            return
        if not self.backend.exists(self.vhost, stream):
            # led by another node: stored there (no answer; this node's questions to it go in order)
            self._askHome(stream, "stream.storeOffset", {"reference": reference, "offset": offset},
                          lambda r: None)
            return
        self.backend.storeOffset(self.vhost, stream, reference, offset)

    def _queryOffset(self, corr, version, reference, stream):
        if not reference or len(reference.encode("utf-8")) > MAX_REFERENCE:
            self.send(wire.queryOffsetResponse(corr, self._counted(wire.PRECONDITION_FAILED), 0))
        elif not self._permits(READ, stream):
            self.send(wire.queryOffsetResponse(corr, self._counted(wire.ACCESS_REFUSED), 0))
        elif not self.backend.exists(self.vhost, stream):
            if not self._askHome(stream, "stream.queryOffset", {"reference": reference}, lambda r: self.send(
                    wire.queryOffsetResponse(corr, self._counted(r["code"]), r.get("offset", 0)))):
                self.send(wire.queryOffsetResponse(corr, self._counted(wire.STREAM_DOES_NOT_EXIST), 0))
        else:
            off = self.backend.queryOffset(self.vhost, stream, reference)
            if off is None:
                self.send(wire.queryOffsetResponse(corr, wire.NO_OFFSET, 0))
            else:
                self.send(wire.queryOffsetResponse(corr, wire.OK, off))

    def _resolve(self, stream, spec):
        resolve = getattr(self.backend, "resolve", None)
        if resolve is not None:
            return resolve(self.vhost, stream, spec)
        kind, value = spec
        first, nxt = self.backend.bounds(self.vhost, stream)
        if kind == wire.OFFSET_FIRST:
            return first
        if kind == wire.OFFSET_LAST:
            # the start of the last chunk, as RabbitMQ
            last = self.backend.chunks(self.vhost, stream, nxt - 1, 1) if nxt > first else []
            return last[0].first if last else nxt
        if kind == wire.OFFSET_NEXT:
            return nxt
        if kind == wire.OFFSET_OFFSET:
            return min(max(value, first), nxt)
        if kind == wire.OFFSET_TIMESTAMP:
            return self.backend.offsetAt(self.vhost, stream, value)
        return nxt

    def _resolveOffsetSpec(self, corr, version, stream, spec, props):
        if not self._permits(READ, stream):
            self.send(wire.resolveOffsetSpecResponse(corr, self._counted(wire.ACCESS_REFUSED), 0))
        elif not self._readable(stream):
            self.send(wire.resolveOffsetSpecResponse(corr, self._counted(wire.STREAM_DOES_NOT_EXIST), 0))
        else:
            self.send(wire.resolveOffsetSpecResponse(corr, wire.OK, self._resolve(stream, spec)))

    # --- subscriptions

    def _subscribe(self, corr, version, sid, stream, spec, credit, props):
        reply = lambda code: self.send(wire.response(wire.SUBSCRIBE, corr, self._counted(code)))  # noqa: E731
        if not self._permits(READ, stream):
            return reply(wire.ACCESS_REFUSED)
        if not self._readable(stream):
            # a stream without a member on this node of the cluster: RabbitMQ 3.10's answer
            return reply(wire.STREAM_DOES_NOT_EXIST if self._elsewhere(stream) is None
                         else wire.STREAM_NOT_AVAILABLE)
        if sid in self.subscriptions:
            return reply(wire.SUBSCRIPTION_ID_ALREADY_EXISTS)
        sac = props.get("single-active-consumer") == "true"
        if sac and not props.get("name"):
            return reply(wire.PRECONDITION_FAILED)
        sub = _Subscription(sid, stream, self._resolve(stream, spec), credit, props)
        self.subscriptions[sid] = sub
        sub.listener = lambda: self._streamChanged(sub.stream)
        self.backend.listen(self.vhost, stream, sub.listener)
        reply(wire.OK)
        if sac:
            sub.active = False
            index = -1
            if sub.superStream:
                parts = self.backend.partitions(self.vhost, sub.superStream) or []
                index = parts.index(stream) if stream in parts else -1
            sub.group = (self.vhost, stream, sub.name)
            self.factory.groups.join(sub.group, self, sub, index)
        else:
            self._schedulePump()

    def _checkAlarm(self):
        self._blockCall = None
        if self.closed:
            return
        if self.broker.alarmed:
            self._blockCall = self.clock.callLater(ALARM_CHECK, self._checkAlarm)
            return
        self.blocked = False
        self._lastReceived = self.clock.seconds()
        self.transport.resumeProducing()

    def _streamChanged(self, stream):
        """The core's listen callback: new data, or the stream was deleted (by any protocol)."""
        if self.closed:
            return
        if not self._readable(stream):
            self.streamGone(stream)
        else:
            self._schedulePump()

    def consumerUpdate(self, sub, active):
        """Called by ConsumerGroups: ask the client, deliver when it answers (active)."""
        if self.closed:
            return
        corr = self._nextCorr()
        sub.awaiting = active
        self._pendingUpdates[corr] = (sub, active)
        self.send(wire.consumerUpdateRequest(corr, sub.sid, active))

    def _consumerUpdateResponse(self, corr, version, code, spec):
        pending = self._pendingUpdates.pop(corr, None)
        if pending is None:
            return
        sub, active = pending
        sub.awaiting = False
        if active and sub.sid in self.subscriptions and spec[0] != wire.OFFSET_NONE:
            sub.offset = self._resolve(sub.stream, spec)
        if active:
            self._schedulePump()

    def _dropSubscription(self, sub):
        if sub.listener is not None:
            self.backend.unlisten(self.vhost, sub.stream, sub.listener)
            sub.listener = None
        if sub.group is not None:
            index = -1
            if sub.superStream:
                parts = self.backend.partitions(self.vhost, sub.superStream) or []
                index = parts.index(sub.stream) if sub.stream in parts else -1
            self.factory.groups.leave(sub.group, self, sub, index)
            sub.group = None

    def _unsubscribe(self, corr, version, sid):
        sub = self.subscriptions.pop(sid, None)
        if sub is None:
            self.send(wire.response(wire.UNSUBSCRIBE, corr, self._counted(wire.SUBSCRIPTION_ID_DOES_NOT_EXIST)))
            return
        sub.active = False
        self._dropSubscription(sub)
        self.send(wire.response(wire.UNSUBSCRIBE, corr, wire.OK))

    def _credit(self, corr, version, sid, credit):
        sub = self.subscriptions.get(sid)
        if sub is None:
            self.send(wire.creditResponse(self._counted(wire.SUBSCRIPTION_ID_DOES_NOT_EXIST), sid))
            return
        sub.credit = min(sub.credit + max(credit, 0), 0xFFFF)
        self._schedulePump()

    def _schedulePump(self):
        if self._pumpCall is None and not self.closed and not self.paused:
            self._pumpCall = self.clock.callLater(0, self._pump)

    def _pump(self):
        """Write up to CHUNKS_PER_TURN chunks to the subscriptions with credit."""
        self._pumpCall = None
        if self.closed or self.paused:
            return
        budget = CHUNKS_PER_TURN
        more = False
        out = []
        backend = self.backend
        vhost = self.vhost
        deliverHeader = wire.deliverHeader
        chunkHeader = _chunk.header
        messages = MESSAGES_PER_TURN
        # a chunk the backend builds stays within the client's frame_max (the AMQP 1.0
        # conversion adds ~40 bytes a message over what the read counts)
        maxBytes = max(self.frameMax // 2, 4096) if self.frameMax else None
        transport = self.transport
        # each chunk goes straight to the socket while it takes them (writeDirect); once it
        # does not, the rest waits in the transport's buffer and the turn ends
        direct = directSocket(transport) is not None
        counters = self.broker.streamCounters
        for sub in list(self.subscriptions.values()):
            while sub.credit > 0 and sub.active and not sub.awaiting and budget > 0 and messages > 0:
                chunks = backend.chunks(vhost, sub.stream, sub.offset, 1, maxBytes)
                if not chunks:
                    break
                c = chunks[0]
                size = c.size
                out.append(deliverHeader(sub.sid, _chunk.HEADER_SIZE + size))
                out.append(chunkHeader(c.first, c.count, c.timestamp, None, c.crc, size=size))
                if direct:
                    out.extend(c.parts)
                else:
                    # file ranges are read now: the transport's buffer holds bytes
                    out.extend([_asBytes(p) if type(p) is FileRange else p for p in c.parts])
                sub.offset = c.first + c.count
                counters.delivered += c.count
                self._delivered(sub, c)
                sub.credit -= 1
                budget -= 1
                messages -= c.count
                if direct:
                    full = not writeDirect(transport, out)
                    out = []
                    self._lastSent = self.clock.seconds()
                    if full:
                        # the socket is full: wait until the transport has written the rest
                        # (it resumes a paused streaming producer once its buffer drains)
                        if not self.paused and transport.producer is self:
                            transport.producerPaused = True
                            self.pauseProducing()
                        budget = 0
                        break
            if budget <= 0 or messages <= 0:
                more = True
                break
        if out:
            transport.writeSequence([_asBytes(p) for p in out])
            self._lastSent = self.clock.seconds()
        if more:
            self._schedulePump()

    def _delivered(self, sub, c):
        """Chunk ``c`` went to ``sub``: the management API's counts (once a chunk)."""
        sub.consumed += c.count
        sub.chunk = c.first
        self.sendOct += _DELIVER_BYTES + c.size
        self.sendCnt += 1

    # --- super streams

    def _route(self, corr, version, key, superStream):
        parts = self.backend.partitions(self.vhost, superStream)
        if not self._permits(READ, superStream) and parts is not None:
            self.send(wire.streamsResponse(wire.ROUTE, corr, self._counted(wire.ACCESS_REFUSED), []))
        elif parts is None:
            self.send(wire.streamsResponse(wire.ROUTE, corr, self._counted(wire.STREAM_DOES_NOT_EXIST), []))
        else:
            self.send(wire.streamsResponse(wire.ROUTE, corr, wire.OK,
                                           self.backend.route(self.vhost, superStream, key)))

    def _partitions(self, corr, version, superStream):
        parts = self.backend.partitions(self.vhost, superStream)
        if parts is None:
            self.send(wire.streamsResponse(wire.PARTITIONS, corr, self._counted(wire.STREAM_DOES_NOT_EXIST), []))
        else:
            self.send(wire.streamsResponse(wire.PARTITIONS, corr, wire.OK, parts))

    def _createSuperStream(self, corr, version, name, partitions, keys, arguments):
        reply = lambda code: self.send(wire.response(wire.CREATE_SUPER_STREAM, corr, self._counted(code)))  # noqa: E731
        if not partitions or len(partitions) != len(keys) or not _validName(name) or \
                not all(_validName(p) for p in partitions):
            return reply(wire.PRECONDITION_FAILED)
        if not all(self._permits(CONFIGURE, p) for p in [name] + partitions):
            return reply(wire.ACCESS_REFUSED)
        reply(self.backend.createSuperStream(self.vhost, name, partitions, keys, arguments))

    def _deleteSuperStream(self, corr, version, name):
        if not self._permits(CONFIGURE, name):
            self.send(wire.response(wire.DELETE_SUPER_STREAM, corr, self._counted(wire.ACCESS_REFUSED)))
            return
        parts = self.backend.partitions(self.vhost, name) or []
        code = self.backend.deleteSuperStream(self.vhost, name)
        self.send(wire.response(wire.DELETE_SUPER_STREAM, corr, self._counted(code)))
        for p in parts:
            self.factory.streamDeleted(self.vhost, p)

    # --- IPushProducer

    def pauseProducing(self):
        self.paused = True
        if self._pumpCall is not None and self._pumpCall.active():
            self._pumpCall.cancel()
        self._pumpCall = None

    def resumeProducing(self):
        self.paused = False
        self._schedulePump()

    def stopProducing(self):
        self.closed = True


def _validName(name):
    return bool(name) and len(name.encode("utf-8")) <= 255 and not name.startswith("amq.")


_HANDLERS = {
    wire.PEER_PROPERTIES: StreamServerProtocol._peerProperties,
    wire.SASL_HANDSHAKE: StreamServerProtocol._saslHandshake,
    wire.SASL_AUTHENTICATE: StreamServerProtocol._saslAuthenticate,
    wire.TUNE: StreamServerProtocol._tune,
    wire.OPEN: StreamServerProtocol._open,
    wire.CLOSE: StreamServerProtocol._close,
    wire.CLOSE | wire.RESPONSE_FLAG: StreamServerProtocol._closeResponse,
    wire.HEARTBEAT: StreamServerProtocol._heartbeatFrame,
    wire.CREATE_STREAM: StreamServerProtocol._create,
    wire.DELETE_STREAM: StreamServerProtocol._delete,
    wire.METADATA: StreamServerProtocol._metadata,
    wire.STREAM_STATS: StreamServerProtocol._streamStats,
    wire.EXCHANGE_COMMAND_VERSIONS: StreamServerProtocol._commandVersions,
    wire.DECLARE_PUBLISHER: StreamServerProtocol._declarePublisher,
    wire.DELETE_PUBLISHER: StreamServerProtocol._deletePublisher,
    wire.PUBLISH: StreamServerProtocol._publish,
    wire.QUERY_PUBLISHER_SEQUENCE: StreamServerProtocol._querySequence,
    wire.STORE_OFFSET: StreamServerProtocol._storeOffset,
    wire.QUERY_OFFSET: StreamServerProtocol._queryOffset,
    wire.RESOLVE_OFFSET_SPEC: StreamServerProtocol._resolveOffsetSpec,
    wire.SUBSCRIBE: StreamServerProtocol._subscribe,
    wire.UNSUBSCRIBE: StreamServerProtocol._unsubscribe,
    wire.CREDIT: StreamServerProtocol._credit,
    wire.CONSUMER_UPDATE | wire.RESPONSE_FLAG: StreamServerProtocol._consumerUpdateResponse,
    wire.ROUTE: StreamServerProtocol._route,
    wire.PARTITIONS: StreamServerProtocol._partitions,
    wire.CREATE_SUPER_STREAM: StreamServerProtocol._createSuperStream,
    wire.DELETE_SUPER_STREAM: StreamServerProtocol._deleteSuperStream,
}


class StreamServerFactory(Factory):
    """
    The stream listener's factory: the broker (users, permissions, vhosts),
    the streams backend, the clock; ``advertisedHost``/``advertisedPort``
    answer metadata and open (default: the listening address); ``frameMax``
    (bytes) and ``heartbeat`` (seconds) are what the server proposes in
    tune; ``handshakeTimeout``: seconds a client may take to log in and open.
    """

    protocol = StreamServerProtocol

    def __init__(self, broker, backend, clock, advertisedHost=None, advertisedPort=None,
                 frameMax=wire.DEFAULT_FRAME_MAX, heartbeat=wire.DEFAULT_HEARTBEAT,
                 handshakeTimeout=10, serverProperties=None):
        self.broker = broker
        #: the configured server properties (``--server-property``), as connection.start's
        self.extraProperties = dict(serverProperties or {})
        self.backend = backend
        self.clock = clock
        self.advertisedHost = advertisedHost
        self.advertisedPort = advertisedPort
        self.frameMax = frameMax
        self.heartbeat = heartbeat
        self.handshakeTimeout = handshakeTimeout
        self.connections = set()
        self.groups = ConsumerGroups()

    def serverProperties(self):
        """
        peer_properties' answer, as RabbitMQ 3.10's rabbit_stream_reader makes it: the configured
        server properties (``--server-property``, RabbitMQ's ``server_properties``) merged under
        the built-in product, version, cluster_name, platform, copyright and information, which
        win (``maps:merge(Config, BuiltIn)``): ``product=RabbitMQ`` renames connection.start's
        product, not this one, on RabbitMQ too; other keys are added.
        """
        import otter_tx
        from otter_tx.door.protocol import COPYRIGHT, INFORMATION

        props = {k: v for k, v in self.extraProperties.items() if isinstance(v, str)}
        props.update({"product": "otter_tx", "version": getattr(otter_tx, "__version__", "0"),
                      "cluster_name": getattr(self.broker, "clusterName", "otter_tx") or "otter_tx",
                      "platform": "Python/Twisted", "copyright": COPYRIGHT, "information": INFORMATION})
        return props

    def advertised(self, transport):
        host = self.advertisedHost
        port = self.advertisedPort
        if host is None or port is None:
            h = transport.getHost()
            if host is None:
                host = getattr(h, "host", "localhost") or "localhost"
                if host in ("0.0.0.0", "::"):
                    host = "localhost"
            if port is None:
                port = getattr(h, "port", 5552)
        return host, port

    def streamDeleted(self, vhost, name):
        for c in list(self.connections):
            if c.vhost == vhost:
                c.streamGone(name)


class TrackingService(Service):
    """Writes the stream backend's pending offsets and sequences when the service stops."""

    def __init__(self, backend):
        self.backend = backend

    def stopService(self):
        Service.stopService(self)
        tracking = getattr(self.backend, "tracking", None)
        if tracking is not None:
            tracking.stop()


def streamsBackend(broker, clock, directory=None):
    """
    The streams the door serves: the broker's stream queues when the core
    (otter_tx.broker.stream) is there (BrokerStreams; publisher sequences and
    consumer offsets in ``directory``), else in-memory streams
    (MemoryStreams), one per broker.
    """
    try:
        from otter_tx.broker import stream as core
    except ImportError:
        core = None
    if core is not None and hasattr(core, "StreamLog") and hasattr(getattr(broker, "streams", None), "open"):
        from otter_tx.door.streambackend import BrokerStreams
        return BrokerStreams(broker, clock, directory)
    backend = getattr(broker, "_memoryStreams", None)
    if backend is None:
        from otter_tx.door.streambackend import MemoryStreams
        backend = broker._memoryStreams = MemoryStreams(clock)
    return backend
