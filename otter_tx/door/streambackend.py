"""
What the stream door (otter_tx.door.stream) needs of the broker's streams,
and an in-memory implementation of it.

The door speaks only to an object with these methods (``vhost`` is a vhost
name; messages are the AMQP 1.0 bytes stream clients publish):

- ``exists(vhost, name)`` -> bool (a stream queue of that name)
- ``create(vhost, name, arguments)`` -> response code (wire.OK,
  STREAM_ALREADY_EXISTS, PRECONDITION_FAILED)
- ``delete(vhost, name)`` -> response code
- ``append(vhost, name, reference, ids, data, count)`` -> ``(confirmedIds,
  d)``: ``count`` messages as a chunk holds them (``data``: size-prefixed
  entries, otter_tx.stream.chunk) with their publishing ``ids``; with a
  ``reference``, the ids not above the reference's sequence are confirmed
  without a write (de-duplication); ``d`` is None when all is safe now, else
  a Deferred firing when the written entries are durable
- ``publish(vhost, name, reference, entries)``: the same for a list of
  ``(publishingId, bytes)``
- ``sequence(vhost, name, reference)`` -> int (0 when none)
- ``bounds(vhost, name)`` -> ``(first, next)`` offsets
- ``chunks(vhost, name, offset, maxChunks)`` -> up to ``maxChunks``
  :class:`Chunk` from the one holding ``offset`` (committed ones only); a
  reader starting inside a chunk gets all of it, as from RabbitMQ
- ``offsetAt(vhost, name, timestampMs)`` -> where a timestamp reader
  starts: the chunk holding the timestamp, the last written at or before it
  (the first when none), as RabbitMQ 3.10 does
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
import zlib

from otter_tx.stream import chunk as _chunk
from otter_tx.stream import wire


class Chunk:
    """
    What one write appended: ``count`` messages from offset ``first``, stamped
    ``timestamp`` (ms), their entries ``data``; ``crc`` is computed once, on
    first delivery.
    """

    __slots__ = ("first", "timestamp", "count", "data", "_crc")

    def __init__(self, first, timestamp, count, data):
        self.first = first
        self.timestamp = timestamp
        self.count = count
        self.data = data
        self._crc = None

    @property
    def crc(self):
        c = self._crc
        if c is None:
            c = self._crc = zlib.crc32(self.data)
        return c


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

    def append(self, vhost, name, reference, ids, data, count):
        s = self._get(vhost, name)
        if s is None:
            return [], None
        if reference:
            seq = s.sequences.get(reference, 0)
            if min(ids) <= seq:
                # de-duplication: keep the entries above the sequence
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
                s.sequences[reference] = max(ids)
        self._write(s, data, count)
        return ids, None

    def publish(self, vhost, name, reference, entries):
        return self.append(vhost, name, reference, [e[0] for e in entries],
                           _chunk.entries([e[1] for e in entries]), len(entries))

    def _write(self, s, data, count):
        ts = int(self.clock.seconds() * 1000)
        s.chunks.append(Chunk(s.next, ts, count, data))
        s.firsts.append(s.next)
        s.next += count
        for cb in list(s.listeners):
            cb()

    def sequence(self, vhost, name, reference):
        s = self._get(vhost, name)
        return s.sequences.get(reference, 0) if s else 0

    def bounds(self, vhost, name):
        s = self._get(vhost, name)
        return s.first, s.next

    def chunks(self, vhost, name, offset, maxChunks):
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
        RabbitMQ 3.10 (checked on the peer) attaches a timestamp reader at the chunk holding the
        timestamp: the last one written at or before it (the first when none).
        """
        s = self._get(vhost, name)
        found = s.first
        for c in s.chunks:
            if c.timestamp > ts:
                break
            found = c.first
        return found

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
        last = s.chunks[-1].first if s.chunks else 0
        return {"first_chunk_id": s.first, "committed_chunk_id": last}
