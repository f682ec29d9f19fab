"""
What the stream door (otter_tx.door.stream) needs of the broker's streams,
and an in-memory implementation of it.

The door speaks only to an object with these methods (``vhost`` is a vhost
name; messages are the AMQP 1.0 bytes stream clients publish):

- ``exists(vhost, name)`` -> bool (a stream queue of that name)
- ``create(vhost, name, arguments)`` -> response code (wire.OK,
  STREAM_ALREADY_EXISTS, PRECONDITION_FAILED)
- ``delete(vhost, name)`` -> response code
- ``publish(vhost, name, reference, entries)`` -> ``(confirmedIds, d)``:
  ``entries`` are ``(publishingId, bytes)``; de-duplicated ones (publishing
  id not above the reference's sequence) are confirmed without a write; ``d``
  is None when all is safe now, else a Deferred firing when the written
  entries are durable.
- ``sequence(vhost, name, reference)`` -> int (0 when none)
- ``bounds(vhost, name)`` -> ``(first, next)`` offsets
- ``read(vhost, name, offset, maxMessages, maxBytes)`` -> list of
  ``(offset, timestampMs, bytes)`` from ``offset`` (committed entries only)
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

from otter_tx.stream import wire


class _Stream:
    __slots__ = ("name", "arguments", "messages", "first", "sequences", "offsets", "listeners", "batches")

    def __init__(self, name, arguments):
        self.name = name
        self.arguments = arguments
        self.messages = []  # (offset, ts, bytes), offset = first + index
        self.first = 0
        self.sequences = {}
        self.offsets = {}
        self.listeners = []
        self.batches = []  # (first offset, ts) of each publish call


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
            s = self.streams[(vhost, name)]
            return wire.OK if s.arguments == arguments else wire.STREAM_ALREADY_EXISTS
        self.streams[(vhost, name)] = _Stream(name, dict(arguments))
        return wire.OK

    def delete(self, vhost, name):
        s = self.streams.pop((vhost, name), None)
        if s is None:
            return wire.STREAM_DOES_NOT_EXIST
        for cb in list(s.listeners):
            cb()
        return wire.OK

    def publish(self, vhost, name, reference, entries):
        s = self._get(vhost, name)
        ids = []
        if s is None:
            return ids, None
        ts = int(self.clock.seconds() * 1000)
        seq = s.sequences.get(reference, 0) if reference else None
        nxt = s.first + len(s.messages)
        start = nxt
        added = False
        for pid, data in entries:
            ids.append(pid)
            if seq is not None:
                if pid <= seq:
                    continue
                seq = pid
            s.messages.append((nxt, ts, data))
            nxt += 1
            added = True
        if seq is not None:
            s.sequences[reference] = seq
        if added:
            s.batches.append((start, ts))
            for cb in list(s.listeners):
                cb()
        return ids, None

    def sequence(self, vhost, name, reference):
        s = self._get(vhost, name)
        return s.sequences.get(reference, 0) if s else 0

    def bounds(self, vhost, name):
        s = self._get(vhost, name)
        return s.first, s.first + len(s.messages)

    def read(self, vhost, name, offset, maxMessages, maxBytes):
        s = self._get(vhost, name)
        if s is None:
            return []
        i = max(0, offset - s.first)
        out = []
        size = 0
        msgs = s.messages
        while i < len(msgs) and len(out) < maxMessages:
            e = msgs[i]
            size += len(e[2])
            if out and size > maxBytes:
                break
            out.append(e)
            i += 1
        return out

    def offsetAt(self, vhost, name, ts):
        """
        RabbitMQ 3.10 (checked on the peer) attaches a timestamp reader at the chunk holding the
        timestamp: the last one written at or before it (the first when none). A chunk here is
        what one publish call wrote.
        """
        s = self._get(vhost, name)
        found = s.first
        for off, t in s.batches:
            if t > ts:
                break
            found = off
        return max(found, s.first)

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
        first, nxt = self.bounds(vhost, name)
        return {"first_chunk_id": first, "committed_chunk_id": max(first, nxt - 1)}
