"""
What the stream door (otter_tx.door.stream) needs of the broker's streams,
and an in-memory implementation of it.

The door speaks only to an object with these methods (``vhost`` is a vhost
name; messages are the AMQP 1.0 bytes stream clients publish):

- ``exists(vhost, name)`` -> bool (a stream queue of that name)
- ``create(vhost, name, arguments)`` -> response code (wire.OK,
  STREAM_ALREADY_EXISTS, PRECONDITION_FAILED)
- ``delete(vhost, name)`` -> response code
- ``append(vhost, name, reference, ids, data, count, crc=None)`` ->
  ``(confirmedIds, d)``: ``count`` messages as a chunk holds them (``data``:
  size-prefixed entries, otter_tx.stream.chunk; ``crc``: their CRC-32 when
  the door has it) with their publishing ``ids``; with a
  ``reference``, the ids not above the reference's sequence are confirmed
  without a write (de-duplication); ``d`` is None when all is safe now, else
  a Deferred firing when the written entries are durable
- ``publish(vhost, name, reference, entries)``: the same for a list of
  ``(publishingId, bytes)``
- ``sequence(vhost, name, reference, unknown=0)`` -> int (``unknown`` when the
  reference wrote nothing: 0 as query_publisher_sequence answers, or NO_SEQUENCE)
- ``bounds(vhost, name)`` -> ``(first, next)`` offsets
- ``chunks(vhost, name, offset, maxChunks, maxBytes=None)`` -> up to ``maxChunks``
  :class:`Chunk` from the one holding ``offset`` (committed ones only); a
  reader starting inside a chunk gets all of it, as from RabbitMQ
- ``offsetAt(vhost, name, timestampMs)`` -> where a timestamp reader
  starts: the first chunk written at or after the timestamp, ``next`` when
  none, as osiris (RabbitMQ 3.10 to 4.x)
- ``listen(vhost, name, callback)`` / ``unlisten(...)``: ``callback()`` when
  entries were appended
- ``storeOffset(vhost, name, reference, offset)``,
  ``queryOffset(vhost, name, reference)`` -> int or None
- ``partitions(vhost, superStream)`` -> list of stream names or None (no
  such super stream); ``route(vhost, superStream, routingKey)`` -> list
- ``stats(vhost, name)`` -> dict

:class:`MemoryStreams` keeps all of it in memory (tests, and the door's
fallback when no broker streams are wired in).
"""

import bisect

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from otter_tx.store.log.segments import crc32 as _crc32
from otter_tx.store.log.segments import crc32_combine as _crc32_combine
from otter_tx.broker.message import Message
from otter_tx.broker.stream import MAPPED, RANGES, FileRange, declareStream, deleteStream, findStream, isMapped
from otter_tx.broker import streamconvert as _convert
from otter_tx.door.writev import WRITEV
from otter_tx.stream import chunk as _chunk
from otter_tx.stream import wire

_log = Logger()


def _aboveInOrder(ids, seq):
    """
    True when a de-duplicating publisher's publishing ``ids`` (a list) need no
    de-duplication: each above ``seq`` and above the one before it.  RabbitMQ
    (osiris' writer) de-duplicates message by message, so a frame's own
    repeats ([1, 2, 3, 1, 2, 3]) and ids below an earlier one of the frame
    ([3, 1, 2]) are dropped too: such frames take the per-message path.
    """
    n = len(ids)
    if not n:
        return True
    first = ids[0]
    if first <= seq:
        return False
    if n == 1:
        return True
    if ids[-1] - first == n - 1:
        # the usual frame: consecutive ids (one C-speed comparison)
        return ids == list(range(first, first + n))
    return all(a < b for a, b in zip(ids, ids[1:]))


class Chunk:
    """
    What one write appended: ``count`` messages from offset ``first``, stamped
    ``timestamp`` (ms), their entries: ``data`` (bytes), or ``parts`` (bytes-like
    pieces that ``data`` joins when asked; the door writes them as they are);
    ``size`` their length; ``crc`` is given (made of the records' stored CRCs) or
    computed once, on first delivery. A part may be a
    :class:`~otter_tx.broker.stream.FileRange` (bytes left in a segment file: the
    door sends them with ``sendfile``).
    """

    __slots__ = ("first", "timestamp", "count", "_data", "parts", "size", "_crc")

    def __init__(self, first, timestamp, count, data=None, parts=None, crc=None):
        self.first = first
        self.timestamp = timestamp
        self.count = count
        if parts is None:
            parts = [data]
        self.parts = parts
        self._data = data
        self.size = len(data) if data is not None else sum(len(p) for p in parts)
        self._crc = crc

    @property
    def data(self):
        d = self._data
        if d is None:
            d = self._data = b"".join([p.read() if type(p) is FileRange else p for p in self.parts])
        return d

    @property
    def crc(self):
        c = self._crc
        if c is None:
            c = 0
            for p in self.parts:
                if type(p) is FileRange:
                    c = p.crc32(c)
                else:
                    c = _crc32(p, c)
            self._crc = c
        return c

    @property
    def transient(self):
        """True when parts are FileRanges or mapped views of a reader's file: written at once, not kept."""
        return any(type(p) is FileRange or isMapped(p) for p in self.parts)


class _Stream:
    __slots__ = ("name", "arguments", "chunks", "firsts", "first", "next", "sequences", "offsets",
                 "listeners")

    def __init__(self, name, arguments):
        self.name = name
        self.arguments = arguments
        self.chunks = []
        self.firsts = []
        self.first = 0
        self.next = 0
        self.sequences = {}
        self.offsets = {}
        self.listeners = []


class MemoryStreams:
    """The backend interface above, in memory. ``clock`` gives ``seconds()``."""

    def __init__(self, clock):
        self.clock = clock
        self.streams = {}
        self.superStreams = {}  # (vhost, name) -> [(partition, bindingKey)]

    def _get(self, vhost, name):
        return self.streams.get((vhost, name))

    def exists(self, vhost, name):
        return (vhost, name) in self.streams

    def create(self, vhost, name, arguments):
        if (vhost, name) in self.streams:
            return wire.STREAM_ALREADY_EXISTS
        self.streams[(vhost, name)] = _Stream(name, dict(arguments))
        return wire.OK

    def delete(self, vhost, name):
        s = self.streams.pop((vhost, name), None)
        if s is None:
            return wire.STREAM_DOES_NOT_EXIST
        for cb in list(s.listeners):
            cb()
        return wire.OK

    def append(self, vhost, name, reference, ids, data, count, crc=None):
        s = self._get(vhost, name)
        if s is None:
            return [], None
        if reference:
            seq = s.sequences.get(reference, NO_SEQUENCE)
            if not _aboveInOrder(ids, seq):
                # de-duplication, message by message: keep each entry above the sequence so far
                keep = []
                for pid, m in zip(ids, _chunk.split(data, count)):
                    if pid > seq:
                        keep.append(m)
                        seq = pid
                s.sequences[reference] = seq
                if not keep:
                    return ids, None
                data = _chunk.entries(keep)
                count = len(keep)
            else:
                s.sequences[reference] = ids[-1]
        self._write(s, data, count)
        return ids, None

    def publish(self, vhost, name, reference, entries):
        return self.append(vhost, name, reference, [e[0] for e in entries],
                           _chunk.entries([e[1] for e in entries]), len(entries))

    def _write(self, s, data, count):
        ts = int(self.clock.seconds() * 1000)
        s.chunks.append(Chunk(s.next, ts, count, bytes(data)))
        s.firsts.append(s.next)
        s.next += count
        for cb in list(s.listeners):
            cb()

    def sequence(self, vhost, name, reference, unknown=0):
        s = self._get(vhost, name)
        return s.sequences.get(reference, unknown) if s else unknown

    def bounds(self, vhost, name):
        s = self._get(vhost, name)
        return s.first, s.next

    def chunks(self, vhost, name, offset, maxChunks, maxBytes=None):
        s = self._get(vhost, name)
        if s is None or offset >= s.next:
            return []
        i = max(bisect.bisect_right(s.firsts, offset) - 1, 0)
        return s.chunks[i:i + maxChunks]

    def messages(self, vhost, name):
        """Every ``(offset, bytes)`` (tests)."""
        out = []
        for c in self._get(vhost, name).chunks:
            out.extend(zip(range(c.first, c.first + c.count), _chunk.split(c.data, c.count)))
        return out

    def offsetAt(self, vhost, name, ts):
        """
        Where a timestamp reader attaches: the first chunk written at or after the timestamp,
        ``next`` when there is none (osiris' timestamp search, RabbitMQ 3.10 to 4.x).
        """
        s = self._get(vhost, name)
        for c in s.chunks:
            if c.timestamp >= ts:
                return c.first
        return s.next

    def listen(self, vhost, name, cb):
        s = self._get(vhost, name)
        if s is not None:
            s.listeners.append(cb)

    def unlisten(self, vhost, name, cb):
        s = self._get(vhost, name)
        if s is not None and cb in s.listeners:
            s.listeners.remove(cb)

    def storeOffset(self, vhost, name, reference, offset):
        s = self._get(vhost, name)
        if s is not None:
            s.offsets[reference] = offset

    def queryOffset(self, vhost, name, reference):
        s = self._get(vhost, name)
        return s.offsets.get(reference) if s else None

    def createSuperStream(self, vhost, name, partitions, keys, arguments):
        if (vhost, name) in self.superStreams:
            return wire.STREAM_ALREADY_EXISTS
        for p in partitions:
            if (vhost, p) in self.streams:
                return wire.STREAM_ALREADY_EXISTS
        for p in partitions:
            self.create(vhost, p, arguments)
        self.superStreams[(vhost, name)] = list(zip(partitions, keys))
        return wire.OK

    def deleteSuperStream(self, vhost, name):
        parts = self.superStreams.pop((vhost, name), None)
        if parts is None:
            return wire.STREAM_DOES_NOT_EXIST
        for p, _ in parts:
            self.delete(vhost, p)
        return wire.OK

    def partitions(self, vhost, superStream):
        parts = self.superStreams.get((vhost, superStream))
        return None if parts is None else [p for p, _ in parts]

    def route(self, vhost, superStream, key):
        parts = self.superStreams.get((vhost, superStream))
        return None if parts is None else [p for p, k in parts if k == key]

    def stats(self, vhost, name):
        s = self._get(vhost, name)
        if not s.chunks:
            return dict(EMPTY_STATS)
        last = s.chunks[-1].first
        return {"first_chunk_id": s.first, "committed_chunk_id": last, "last_chunk_id": last}


# --- the broker's stream queues (otter_tx.broker.stream, the stream core)

#: the stream protocol's create arguments and the queue arguments they become
#: (rabbit_stream_manager:stream_queue_arguments): integers for the sizes
_CREATE_ARGUMENTS = {
    "max-length-bytes": ("x-max-length-bytes", int),
    "max-age": ("x-max-age", str),
    "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
    "initial-cluster-size": ("x-initial-cluster-size", int),
    "queue-leader-locator": ("x-queue-leader-locator", str),
}


def queueArguments(arguments):
    """
    The queue arguments of a stream protocol create: RabbitMQ's five keys
    with their types, the others ignored (as RabbitMQ). Raises ValueError on
    a size that is not an integer (RabbitMQ's reader crashes there and drops
    the connection; the door answers PRECONDITION_FAILED).
    """
    out = {}
    for key, value in arguments.items():
        conv = _CREATE_ARGUMENTS.get(key)
        if conv is not None:
            out[conv[0]] = conv[1](value)
    return out


#: the sequence of a publisher reference that wrote nothing yet, below every publishing id: its
#: first publish is kept whatever its id (0 too), as osiris_writer's is_duplicate ({error,
#: not_found} -> not a duplicate); query_publisher_sequence answers 0 for it, as RabbitMQ
NO_SEQUENCE = -1

#: stream_stats of a stream with no message (osiris_log_shared's initial -1s)
EMPTY_STATS = {"first_chunk_id": -1, "committed_chunk_id": -1, "last_chunk_id": -1}


class Tracking:
    """
    Publisher sequences (de-duplication) and consumer offsets per stream,
    kept in memory and, with a ``directory``, written to one small JSON file
    per stream a moment after they change (``delay`` seconds, float;
    RabbitMQ keeps them in the stream's own log; the core does not, yet).

    A stream's ``sequences`` move as publishes are appended (the next frames
    are de-duplicated against them at once); the file holds only the durable
    ones (``durable``, :meth:`durableSequence`), written in the reactor turn
    that confirms them, before the confirms reach the socket: after a crash
    a publisher that sends its last confirmed publishes again is
    de-duplicated, and one that sends its unconfirmed ones again is not.
    """

    def __init__(self, clock, directory=None, delay=0.2):
        self.clock = clock
        self.directory = directory
        self.delay = delay
        self.data = {}
        self._dirty = set()
        self._call = None
        #: the pending write is in this turn (callLater(0)), not ``delay`` seconds away
        self._soon = False

    def _path(self, vhost, name):
        import hashlib
        import os
        h = hashlib.sha1(("%s\x00%s" % (vhost, name)).encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self.directory, h + ".json")

    def get(self, vhost, name):
        key = (vhost, name)
        t = self.data.get(key)
        if t is None:
            t = {"sequences": {}, "offsets": {}}
            if self.directory is not None:
                import json
                try:
                    with open(self._path(vhost, name)) as f:
                        t = json.load(f)
                except (OSError, ValueError):
                    pass
            self.data[key] = t
        return t

    def changed(self, vhost, name, soon=False):
        """
        What ``vhost``/``name`` holds changed: written ``delay`` seconds from
        now, or with ``soon`` before this reactor turn's writes reach their
        sockets (a ``callLater(0)``: the reactor runs it before it polls).
        """
        if self.directory is None:
            return
        self._dirty.add((vhost, name))
        if soon and not self._soon:
            if self._call is not None and self._call.active():
                self._call.cancel()
            self._call = self.clock.callLater(0, self.flush)
            self._soon = True
        elif self._call is None:
            self._call = self.clock.callLater(self.delay, self.flush)

    def durableSequence(self, vhost, name, reference, sequence):
        """
        The publishes of ``reference`` up to ``sequence`` (int) are durable:
        the file takes it, written before their confirms go out.
        """
        t = self.get(vhost, name)
        durable = t.setdefault("durable", {})
        if sequence > durable.get(reference, NO_SEQUENCE):
            durable[reference] = sequence
        if sequence > t["sequences"].get(reference, NO_SEQUENCE):
            t["sequences"][reference] = sequence
        self.changed(vhost, name, soon=True)

    def flush(self):
        import json
        import os
        self._call = None
        self._soon = False
        os.makedirs(self.directory, exist_ok=True)
        for vhost, name in self._dirty:
            t = self.data.get((vhost, name))
            path = self._path(vhost, name)
            if t is None:
                try:
                    os.unlink(path)
                except OSError:
                    pass
                continue
            # the durable sequences of the publishers seen here, the others as shipped by a leader
            sequences = dict(t["sequences"])
            sequences.update(t.get("durable", {}))
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"sequences": sequences, "offsets": t["offsets"], "vhost": vhost, "stream": name}, f)
            os.replace(tmp, path)
        self._dirty.clear()

    def stop(self):
        """Write what changed now (service stop)."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        if self._dirty:
            self.flush()
        self._call = None
        self._soon = False

    def forget(self, vhost, name):
        self.data.pop((vhost, name), None)
        self.changed(vhost, name)


#: what another node's stream door asks a stream's leader (BrokerStreams.askHome / answerHome)
OP_QUERY_OFFSET = "stream.queryOffset"
OP_STORE_OFFSET = "stream.storeOffset"
OP_SEQUENCE = "stream.sequence"
OP_STATS = "stream.stats"
HOME_OPS = (OP_QUERY_OFFSET, OP_STORE_OFFSET, OP_SEQUENCE, OP_STATS)


class _Written:
    """
    A write another node's publish made here (STREAM_DEDUP), as the link's
    SYNC waits for it: ``sync()`` fires once the write's Deferred fired
    (fails when it failed: the forward is refused, a publish error there).
    """

    def __init__(self, d):
        self._result = None
        self._waiters = []
        d.addBoth(self._done)

    def _done(self, result):
        if isinstance(result, Failure):
            _log.failure("stream write forwarded by another node", result)
        self._result = result if isinstance(result, Failure) else True
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            self._fire(w)
        return None

    def _fire(self, d):
        if self._result is True:
            d.callback(None)
        else:
            d.errback(self._result)

    def sync(self):
        d = defer.Deferred()
        if self._result is None:
            self._waiters.append(d)
        else:
            self._fire(d)
        return d


class BrokerStreams:
    """
    The backend interface on the broker's stream queues (docs:
    /work STREAM_API, ``otter_tx.broker.stream``): a stream is a queue with
    ``x-queue-type: stream`` whatever protocol made it, so AMQP 0-9-1 and the
    stream protocol read and write the same log.

    Messages: what a stream client publishes (AMQP 1.0) is stored as the
    broker Message RabbitMQ 3.10's to_amqp091 makes of it; what a stream
    client reads is from_amqp091 of the stored Message (x-exchange and
    x-routing-key annotations first), byte for byte what RabbitMQ 3.10 sends
    for a message published over AMQP 0-9-1. A chunk the door delivers is
    what one read of the core returned.
    """

    #: most AMQP 0-9-1 messages one chunk holds (each costs ~10 us to convert)
    chunkMessages = 512
    #: most messages one chunk holds when they are stream protocol publishes (kept as
    #: published: a chunk joins their records, nothing a message)
    rawChunkMessages = 4096
    #: chunks kept per stream for readers in step (at most this many times chunkBytes)
    cacheChunks = 16
    chunkBytes = 512 * 1024
    #: large records are left in the segment file (FileRange parts, sent with sendfile; a chunk
    #: with them is written at once and not cached): on PyPy without cffi
    ranges = RANGES and WRITEV is None
    #: large records are views of the segment file mapped (sent with sendmsg, or PyPy's writev
    #: through cffi: no pread; a chunk with them is written at once and not cached either)
    mapped = MAPPED or WRITEV is not None

    def __init__(self, broker, clock, directory=None):
        self.broker = broker
        self.clock = clock
        self.tracking = Tracking(clock, directory)
        self._readers = {}
        self._cache = {}
        # (a cluster node's stream replicas keep the tracking their leader ships: trackingChanged)
        broker.streamBackend = self
        # other nodes' stream doors ask this node, their streams' leader, for its tracking
        # (askHome); their de-duplicating publishes come as STREAM_DEDUP (appendForwarded)
        add = getattr(broker, "addClusterHandler", None)
        if add is not None:
            for op in HOME_OPS:
                add(op, lambda args, op=op: self.answerHome(op, args))

    def _log(self, vhost, name):
        log = findStream(self.broker, vhost, name)
        if log is None or getattr(log, "deleted", False):
            return None
        return log

    def _readLog(self, vhost, name):
        """The log to read stream ``name`` from: the stream here, or this cluster node's replica of it."""
        log = self._log(vhost, name)
        if log is None and self.broker.cluster is not None:
            replica = self.broker.cluster.replication.replicas.get((vhost, name))
            log = getattr(replica, "stream", None)
            if log is not None and log.deleted:
                return None
        return log

    def readable(self, vhost, name):
        """True when stream ``name`` can be read on this node (held here, or a replica here)."""
        return self._readLog(vhost, name) is not None

    def replicas(self, vhost, name):
        """
        ``[(host, port)]``: the stream listeners of a cluster's stream's
        in-sync followers (the stream protocol's metadata names them as
        replicas, as RabbitMQ's); [] on one node.
        """
        cluster = self.broker.cluster
        if cluster is None:
            return []
        record = cluster.replication.records.get((vhost, name))
        if record is None:
            return []
        online = record.get("online") or ()
        rep = cluster.replication.leading.get((vhost, name))
        if rep is not None and not rep.fenced:
            # this node leads: its replicator's in-sync set is the live one (the record kept
            # here is the one of the declare, with no follower in sync yet)
            online = rep.online
        out = []
        for member in online:
            if member == record.get("node") or member == cluster.name and rep is not None:
                continue
            if member == cluster.name:
                info = dict(cluster.info, host=cluster.advertise)
            elif member in cluster.links:
                info = cluster.nodes.get(member)
            else:
                continue
            if not info or not info.get("stream_port"):
                continue
            out.append((info.get("stream_host") or info["host"], info["stream_port"]))
        return out

    def trackingChanged(self, vhost, name, change):
        """What a stream's leader shipped of its tracking (``{"sequences": {...}, "offsets": {...}}``)."""
        t = self.tracking.get(vhost, name)
        durable = t.get("durable", {})
        for kind in ("sequences", "offsets"):
            for ref, value in (change.get(kind) or {}).items():
                if kind == "offsets" or value > t[kind].get(ref, NO_SEQUENCE):
                    t[kind][ref] = value
                if kind == "sequences" and ref in durable and value > durable[ref]:
                    # (this node led the stream before: what its new leader holds counts now)
                    durable[ref] = value
        self.tracking.changed(vhost, name)

    def _shipTracking(self, log, change):
        rep = getattr(log, "replicator", None)
        if rep is not None:
            rep.tracked(change)

    def exists(self, vhost, name):
        return self._log(vhost, name) is not None

    def _remoteStream(self, vhost, name):
        """The RemoteQueue of a cluster's stream led by another node, or None."""
        if self.broker.cluster is None:
            return None
        v = self.broker.vhosts.get(vhost)
        rq = v.remoteQueues.get(name) if v is not None else None
        if rq is None or not getattr(rq, "isStream", False):
            return None
        return rq

    def elsewhere(self, vhost, name):
        """
        A cluster's stream ``name`` on another node: ``(host, port)`` of that
        node's stream listener (its leader), False while that node is down or
        serves no stream protocol, None when no other node has such a stream.
        """
        rq = self._remoteStream(vhost, name)
        if rq is None:
            return None
        record = self.broker.cluster.nodes.get(rq.home)
        if rq.down or record is None or not record.get("stream_port"):
            return False
        return (record.get("stream_host") or record["host"], record["stream_port"])

    def remoteAppend(self, vhost, name, ids, data, count, reference=None, groups=None):
        """
        A publish to a cluster's stream on another node, forwarded to its
        leader: ``(ids, Deferred)`` firing once durable there, or None when
        there is no such stream or its node is down.  With a publisher
        ``reference`` the leader de-duplicates (``groups``: ``[(publishing id,
        messages)]``, default one message per id; the ids at or below the
        reference's sequence there are confirmed and not written).
        """
        rq = self._remoteStream(vhost, name)
        if rq is None:
            return None
        if reference and groups is None:
            groups = [(i, 1) for i in ids]
        d = rq.appendStream(count, bytes(data), reference or None, groups)
        return None if d is None else (ids, d)

    #: seconds a question to a stream's leader may take (the link's own ask times out later)
    homeTimeout = 5.0

    def askHome(self, vhost, name, op, args):
        """
        Ask the leader of a cluster's stream led by another node (``op``, one
        of :data:`HOME_OPS`): a Deferred firing with its answer (a dict with
        ``code``, a stream protocol response code), ``{"code":
        STREAM_NOT_AVAILABLE}`` when its node is down, the link is lost or
        it does not answer within :attr:`homeTimeout`; None when no other
        node has such a stream.  Questions of one node go in order over its
        link (a store_offset, then a query_offset, sees the store).
        """
        rq = self._remoteStream(vhost, name)
        if rq is None:
            return None
        unavailable = {"code": wire.STREAM_NOT_AVAILABLE}
        d = rq.askStream(op, args)
        if d is None:
            return defer.succeed(unavailable)
        out = defer.Deferred()

        def done(result):
            if timer.active():
                timer.cancel()
            if not out.called:
                ok = isinstance(result, dict) and isinstance(result.get("code"), int)
                out.callback(result if ok else unavailable)

        def failed(f):
            done(None)

        def late():
            if not out.called:
                out.callback(unavailable)

        timer = self.clock.callLater(self.homeTimeout, late)
        d.addCallbacks(done, failed)
        return out

    def answerHome(self, op, args):
        """Another node's :meth:`askHome`, answered here (its leader)."""
        vhost, name = args["vhost"], args["name"]
        if self._log(vhost, name) is None:
            # not (or no longer) led here: a new leader, or deleted
            gone = self.elsewhere(vhost, name) is None and not self.readable(vhost, name)
            return {"code": wire.STREAM_DOES_NOT_EXIST if gone else wire.STREAM_NOT_AVAILABLE}
        if op == OP_QUERY_OFFSET:
            offset = self.queryOffset(vhost, name, args["reference"])
            if offset is None:
                return {"code": wire.NO_OFFSET}
            return {"code": wire.OK, "offset": offset}
        if op == OP_STORE_OFFSET:
            self.storeOffset(vhost, name, args["reference"], args["offset"])
            return {"code": wire.OK}
        if op == OP_SEQUENCE:
            return {"code": wire.OK, "sequence": self.sequence(vhost, name, args["reference"])}
        if op == OP_STATS:
            return {"code": wire.OK, "stats": self.stats(vhost, name)}
        return {"code": wire.INTERNAL_ERROR}

    def appendForwarded(self, vhost, name, reference, groups, entries):
        """
        A STREAM_DEDUP at the stream's leader: another node's publish of a
        publisher with ``reference``, ``groups`` ``[(publishing id,
        messages)]`` over ``entries``, de-duplicated as this node's own
        (:meth:`append`, :meth:`publish`: a group at or below the
        reference's sequence is not written).  None when nothing is left to
        write, False when the stream is not here (refused), else an object
        whose ``sync()`` fires once the write is durable (and on the
        in-sync followers): the link's SYNCED waits for it.
        """
        log = self._log(vhost, name)
        if log is None:
            return False
        count = sum(n for _, n in groups)
        if all(n == 1 for _, n in groups):
            _, d = self.append(vhost, name, reference, [pid for pid, _ in groups], entries, count)
        else:
            # sub-entry batches: one publishing id for several messages, kept or dropped together
            seq = self.tracking.get(vhost, name)["sequences"].get(reference, NO_SEQUENCE)
            msgs = _chunk.split(entries, count)
            keep = []
            last = None
            i = 0
            for pid, n in groups:
                if pid > seq:
                    keep.extend(bytes(m) for m in msgs[i:i + n])
                    seq = last = pid
                i += n
            d = None
            if keep:
                d = self._append(log, vhost, name, reference, last, _chunk.entries(keep), len(keep))
        return None if d is None else _Written(d)

    def create(self, vhost, name, arguments):
        from otter_tx.amqp.errors import AMQPError

        if self._log(vhost, name) is not None:
            return wire.STREAM_ALREADY_EXISTS
        v = self.broker.vhosts.get(vhost)
        if v is not None and name in v.queues:
            return wire.PRECONDITION_FAILED
        if v is not None and name in v.remoteQueues:
            return wire.STREAM_ALREADY_EXISTS if self.elsewhere(vhost, name) is not None else wire.PRECONDITION_FAILED
        try:
            d = declareStream(self.broker, vhost, name, queueArguments(arguments))
        except (AMQPError, ValueError, TypeError):
            return wire.PRECONDITION_FAILED
        if isinstance(d, defer.Deferred):
            # a cluster's: created at its home node
            return d.addCallbacks(lambda _: wire.OK, lambda f: wire.PRECONDITION_FAILED)
        return wire.OK

    def delete(self, vhost, name):
        if self._log(vhost, name) is None:
            if self.elsewhere(vhost, name) is not None:
                # a cluster's stream on another node: deleted there (a Deferred firing with the code)
                v = self.broker.vhosts[vhost]
                return defer.maybeDeferred(v.deleteQueue, v.remoteQueues[name]).addCallbacks(
                    lambda _: wire.OK, lambda f: wire.STREAM_NOT_AVAILABLE)
            return wire.STREAM_DOES_NOT_EXIST
        deleteStream(self.broker, vhost, name)
        self.tracking.forget(vhost, name)
        self._dropReaders(vhost, name)
        return wire.OK

    def append(self, vhost, name, reference, ids, data, count, crc=None):
        log = self._log(vhost, name)
        if log is None:
            return ids, None
        if reference:
            t = self.tracking.get(vhost, name)
            seq = t["sequences"].get(reference, NO_SEQUENCE)
            if not _aboveInOrder(ids, seq):
                # de-duplication, message by message: keep each entry above the sequence so far
                return self.publish(vhost, name, reference, list(zip(ids, _chunk.split(data, count))))
            return ids, self._append(log, vhost, name, reference, ids[-1], data, count, crc)
        return ids, self._append(log, vhost, name, None, None, data, count, crc)

    def publish(self, vhost, name, reference, entries):
        log = self._log(vhost, name)
        ids = [e[0] for e in entries]
        if log is None:
            return ids, None
        last = None
        if reference:
            t = self.tracking.get(vhost, name)
            seq = t["sequences"].get(reference, NO_SEQUENCE)
            keep = []
            for pid, m in entries:
                if pid > seq:
                    keep.append((pid, m))
                    seq = pid
            entries = keep
            if entries:
                last = entries[-1][0]
        if not entries:
            return ids, None
        return ids, self._append(log, vhost, name, reference, last,
                                 _chunk.entries([bytes(m) for _, m in entries]), len(entries))

    def _append(self, log, vhost, name, reference, last, data, count, crc=None):
        """
        The entries as one record of the log (kept as published); a Deferred
        firing once durable.  ``crc``: their CRC-32 when known, else None.
        """
        if type(data) is not memoryview:
            # (a memoryview is the door's receive buffer on PyPy, lent: kept as it is)
            data = bytes(data)
        d = log.appendEntries(data, count, crc=crc)
        if reference:
            def durable(result):
                # (written before the confirm that follows reaches the socket: a crash after it
                # keeps the sequence, and the publisher's resent publishes are de-duplicated)
                self.tracking.durableSequence(vhost, name, reference, last)
                return result

            d.addCallback(durable)
            # to a cluster's followers at once, with where the record ends: a follower takes the
            # sequence once its log holds the record, so a new leader knows the sequence of every
            # record it has (a publisher resending an unconfirmed batch is de-duplicated there)
            self._shipTracking(log, {"sequences": {reference: last}, "upTo": log.next})
            # the sequence moves at once for the next frames; durable() persists it
            seqs = self.tracking.get(vhost, name)["sequences"]
            seqs[reference] = max(last, seqs.get(reference, NO_SEQUENCE))
        return d

    def sequence(self, vhost, name, reference, unknown=0):
        return self.tracking.get(vhost, name)["sequences"].get(reference, unknown)

    def bounds(self, vhost, name):
        log = self._readLog(vhost, name)
        return log.first, log.committed

    def resolve(self, vhost, name, spec):
        """The offset an offset specification starts at, as the core's readers start."""
        kind, value = spec
        log = self._readLog(vhost, name)
        core = {wire.OFFSET_FIRST: "first", wire.OFFSET_LAST: "last", wire.OFFSET_NEXT: "next",
                wire.OFFSET_OFFSET: value, wire.OFFSET_TIMESTAMP: ("timestamp", value)}.get(kind, "next")
        # a timestamp: the first chunk written at or after it, next when none, as osiris' search
        # (RabbitMQ 3.10 to 4.x; checked on the 3.10 peer: a time between two chunks attaches at
        # the later one, a time after the last at next)
        off = log.startOffset(core)
        if kind == wire.OFFSET_LAST:
            # the last record reaches a reader as chunks of at most chunkMessages messages (one
            # publish frame of 4,999 messages is ten): last is its last chunk, not all of it, as
            # RabbitMQ's writer cuts such a frame into several chunks (rstream's
            # test_offset_type_last)
            off = max(off, log.committed - self.chunkMessages)
        return off

    def offsetAt(self, vhost, name, ts):
        return self.resolve(vhost, name, (wire.OFFSET_TIMESTAMP, ts))

    def _reader(self, log, vhost, name, offset):
        readers = self._readers.setdefault((vhost, name), [])
        # readers of an older stream of the same name (deleted by any protocol) go
        stale = [r for r in readers if getattr(r, "stream", log) is not log]
        for r in stale:
            readers.remove(r)
            r.close()
        for i, r in enumerate(readers):
            if r.offset == offset:
                return readers.pop(i)
        return log.reader(offset)

    def _dropReaders(self, vhost, name):
        self._cache.pop((vhost, name), None)
        for r in self._readers.pop((vhost, name), []):
            r.close()

    def chunks(self, vhost, name, offset, maxChunks, maxBytes=None):
        log = self._readLog(vhost, name)
        if log is None or offset >= log.committed:
            return []
        limit = min(self.chunkBytes, maxBytes or self.chunkBytes)
        # readers in step (fan-out) share the chunks built from the log: a small cache per
        # stream, by first offset (a chunk's bytes never change; retention is checked)
        held = self._cache.get((vhost, name))
        # the same name may be a newer stream: the cache belongs to one log
        cache = held[1] if held is not None and held[0] is log else None
        out = []
        if cache is not None:
            while len(out) < maxChunks and offset >= log.first:
                c = cache.get(offset)
                if c is None or c.size > limit:
                    break
                out.append(c)
                offset = c.first + c.count
            if len(out) == maxChunks or offset >= log.committed:
                return out
        r = self._reader(log, vhost, name, offset)
        if cache is None:
            cache = {}
            self._cache[(vhost, name)] = (log, cache)
        while len(out) < maxChunks:
            # BATCH entries as views of what the reader read: a chunk is the list of them (no copy
            # until the door writes it)
            # whole BATCH_CRC records' stored CRCs (offset -> CRC): the chunk's CRC is made of them
            crcs = {}
            items = r.readRaw(self.chunkMessages, limit, views=True, ranges=self.ranges, crcs=crcs,
                              mapped=self.mapped)
            if not items:
                break
            count = sum(i[1] for i in items)
            while count + self.chunkMessages <= self.rawChunkMessages and all(i[4] for i in items):
                # records as published: join more of them (a chunk's count costs nothing)
                size = sum(len(b) for i in items for b in i[3])
                if size >= limit:
                    break
                # whole records (a read splits one only when it can take nothing else)
                more = r.readRaw(self.chunkMessages, limit - size, split=False, views=True, ranges=self.ranges,
                                 crcs=crcs, mapped=self.mapped)
                if not more:
                    break
                items += more
                count += sum(i[1] for i in more)
            c = _chunkOf(items, crcs)
            out.append(c)
            if c.transient:
                # bytes left in the reader's file: the caller writes them now, nobody keeps them
                break
            cache[c.first] = c
            while len(cache) > self.cacheChunks:
                del cache[next(iter(cache))]
        readers = self._readers.setdefault((vhost, name), [])
        readers.append(r)
        while len(readers) > 64:
            readers.pop(0).close()
        return out

    def messages(self, vhost, name):
        """Every ``(offset, bytes)`` as a stream client reads it (tests)."""
        log = self._readLog(vhost, name)
        r = log.reader("first")
        out = []
        try:
            while True:
                items = r.readRaw(256, views=True)
                if not items:
                    return out
                c = _chunkOf(items)
                out.extend(zip(range(c.first, c.first + c.count), _chunk.split(c.data, c.count)))
        finally:
            r.close()

    def listen(self, vhost, name, cb):
        log = self._readLog(vhost, name)
        if log is not None:
            log.listen(cb)

    def unlisten(self, vhost, name, cb):
        log = findStream(self.broker, vhost, name) or self._readLog(vhost, name)
        if log is not None:
            log.unlisten(cb)

    def storeOffset(self, vhost, name, reference, offset):
        self.tracking.get(vhost, name)["offsets"][reference] = offset
        self.tracking.changed(vhost, name)
        log = self._log(vhost, name)
        if log is not None:
            self._shipTracking(log, {"offsets": {reference: offset}})

    def queryOffset(self, vhost, name, reference):
        return self.tracking.get(vhost, name)["offsets"].get(reference)

    # super streams: a direct exchange with x-super-stream, its partitions bound with their keys
    # and x-stream-partition-order (RabbitMQ 3.11's rabbit_stream_manager)

    def _partitionBindings(self, vhost, superStream):
        v = self.broker.vhosts.get(vhost)
        if v is None or superStream not in v.exchanges:
            return None
        out = []
        for q in list(v.queues.values()):
            for (src, key, _), args in list(q.bindings.items()):
                if src.name == superStream:
                    out.append(((args or {}).get("x-stream-partition-order", 0), q.name, key))
        out.sort(key=lambda e: e[0])
        return out

    def partitions(self, vhost, superStream):
        b = self._partitionBindings(vhost, superStream)
        return None if b is None else [q for _, q, _ in b]

    def route(self, vhost, superStream, key):
        b = self._partitionBindings(vhost, superStream)
        return None if b is None else [q for _, q, k in b if k == key]

    def createSuperStream(self, vhost, name, partitions, keys, arguments):
        from otter_tx.amqp.errors import AMQPError

        v = self.broker.vhosts.get(vhost)
        if v is None:
            return wire.PRECONDITION_FAILED
        if name in v.exchanges or any(p in v.queues for p in partitions):
            return wire.STREAM_ALREADY_EXISTS
        try:
            args = queueArguments(arguments)
            ex = v.declareExchange(name, "direct", durable=True, arguments={"x-super-stream": True})
            for i, (p, k) in enumerate(zip(partitions, keys)):
                declareStream(self.broker, vhost, p, dict(args))
                v.bind(ex, v.queues[p], k, {"x-stream-partition-order": i})
        except (AMQPError, ValueError, TypeError):
            return wire.PRECONDITION_FAILED
        return wire.OK

    def deleteSuperStream(self, vhost, name):
        parts = self.partitions(vhost, name)
        if parts is None:
            return wire.STREAM_DOES_NOT_EXIST
        for p in parts:
            self.delete(vhost, p)
        self.broker.vhosts[vhost].deleteExchange(name)
        return wire.OK

    def stats(self, vhost, name):
        """
        ``stream_stats``' figures (dict of str -> int), as osiris'
        ``get_stats``: ``first_chunk_id``, the first offset kept;
        ``committed_chunk_id`` and ``last_chunk_id``, the first offset of the
        last committed chunk (one and the same here: a chunk is readable once
        committed; osiris added ``last_chunk_id`` in 1.10); all three -1 for a
        stream with no message (RabbitMQ's clients read -1 as "no offset").
        """
        log = self._readLog(vhost, name)
        last = log.last
        if last is None:
            return dict(EMPTY_STATS)
        return {"first_chunk_id": log.first, "committed_chunk_id": last, "last_chunk_id": last}


#: a chunk whose parts are smaller than this on average is joined into one string
_SMALL_PART = 16 * 1024


def _chunkOf(items, crcs=None):
    """
    One :class:`Chunk` of what a reader read (StreamReader.readRaw with ``views``): the
    entries of BATCH records as stored (the parts of the chunk when that is all
    it holds), each AMQP 0-9-1 message converted. ``crcs`` (offset -> CRC-32, readRaw's)
    has the stored CRCs of the items that are whole BATCH_CRC records: the chunk's CRC
    combines them (:func:`_entriesCrc`).
    """
    first, n, ts, payload, isBatch = items[0]
    if all(i[4] for i in items):
        # records as published: their entries are the chunk's, as they are (small ones joined:
        # many small buffers cost more a buffer than a copy, in sendmsg and crc32 on PyPy)
        parts = [b for i in items for b in i[3]]
        count = sum(i[1] for i in items)
        if len(parts) > 1 and not any(type(b) is FileRange for b in parts) and \
                sum(len(b) for b in parts) < _SMALL_PART * len(parts):
            return Chunk(first, int(ts), count, b"".join(parts))
        return Chunk(first, int(ts), count, parts=parts, crc=_entriesCrc(items, crcs) if crcs else None)
    parts = []
    count = 0
    pack = _chunk._I.pack
    for _, n, _, payload, isBatch in items:
        if isBatch:
            parts.extend(payload)
        else:
            m = payload
            data = _fromMessage(Message(m[5].decode("utf-8", "surrogateescape"),
                                        m[6].decode("utf-8", "surrogateescape"), bytes(m[7]), bytes(m[8])))
            parts.append(pack(len(data)))
            parts.append(data)
        count += n
    return Chunk(first, int(ts), count, b"".join(parts))


#: an item (a whole record's entries) of at least this many bytes takes its stored CRC
#: (crc32_combine, ~0.3 us); a smaller one is hashed (in memory: as cheap)
_COMBINE_BYTES = 16 * 1024


def _entriesCrc(items, crcs):
    """
    The CRC-32 of the entries of ``items`` (readRaw's, with ``views``) one after another:
    an item with a stored CRC in ``crcs`` is combined (``crc32_combine``, no read), the
    rest hashed (a :class:`~otter_tx.broker.stream.FileRange` read through scratch buffers).
    """
    c = 0
    for i in items:
        k = crcs.get(i[0])
        if k is not None:
            size = sum(len(b) for b in i[3])
            if size >= _COMBINE_BYTES or type(i[3][-1]) is FileRange:
                c = _crc32_combine(c, k, size)
                continue
        for p in i[3]:
            c = p.crc32(c) if type(p) is FileRange else _crc32(p, c)
    return c


# the conversions (kept here under their old names)
_toMessage = _convert.toMessage
_fromMessage = _convert.fromMessage
