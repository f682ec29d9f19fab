"""
The inter-node link's frames (docs/cluster.md, "The link"): plain code, no
Twisted, no broker imports.

A frame is ``u32 length`` (of what follows) + ``u8 kind`` + the kind's
fields.  Strings are ``u16 length`` + UTF-8; byte strings ``u32 length`` +
bytes; integers big-endian.  One link joins each pair of nodes; both ends
speak the same frames (either may forward, consume or ask).
"""

import json
import struct

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_Q = struct.Struct(">Q")

#: the kinds (u8)
HELLO = 1          # name: the dialling node's name
FORWARD = 2        # vhost, queue, flags, message: enqueue there
SYNC = 3           # u64 n: answer SYNCED n once everything before is taken (and fsync'd)
SYNCED = 4         # u64 n, u32 count, u64 refused forward numbers
CONSUME = 5        # u32 cid, vhost, queue, u8 flags(noAck, exclusive), i32 priority, u32 credit[, arguments]
CONSUME_ERR = 6    # u32 cid, u16 code, text
CREDIT = 7         # u32 cid, u32 n
CANCEL = 8         # u32 cid: the consumer went (its unacked stay out until settled)
CANCELLED = 9      # u32 cid: the queue cancelled it (deleted)
DELIVER = 10       # u32 cid, u64 eid, u8 flags(redelivered), message
SETTLE = 11        # u8 how (ACK, REJECT, REQUEUE), u32 count, u64 eid...
REQUEST = 12       # u32 rid, op, json arguments
REPLY = 13         # u32 rid, u16 code (0 ok), json result or error text
STATS = 14         # json: the sender's queue figures and node figures
STREAM_APPEND = 15  # vhost, queue, u32 count, entries: a stream protocol publish to a stream there
REPLICATE = 16     # vhost, queue, u64 epoch, u8 op, op fields: a quorum queue leader's log (replication.py)
FENCED = 17        # vhost, queue, u64 epoch: a follower refused a REPLICATE of an older epoch
REPL_FAILED = 18   # (nothing): the follower's store failed; the SYNCED after it does not hold its replicas
DELAYED = 19       # vhost, exchange, u8 op, op fields: a node's held delayed messages (delayedrepl.py)
STREAM_DEDUP = 20  # vhost, queue, reference, u32 groups, (u64 publishing id, u32 messages) each, entries:
                   # a stream protocol publish with a publisher reference, de-duplicated at the stream's leader

ACK, REJECT, REQUEUE = 0, 1, 2


def string(s):
    b = s.encode("utf-8")
    return _U16.pack(len(b)) + b


def blob(b):
    return _U32.pack(len(b)) + b


def frame(kind, payload):
    """One frame: length, kind, ``payload`` (bytes)."""
    return _U32.pack(len(payload) + 1) + bytes((kind,)) + payload


def messagePart(message):
    """exchange, routing key, the publisher's property bytes, body."""
    return (string(message.exchange) + string(message.routingKey) + blob(message.propsRaw)
            + blob(message.body))


def forward(vhost, queue, redelivered, message):
    return forwardNamed(string(vhost) + string(queue), redelivered, message)


def forwardNamed(names, redelivered, message, writer=None):
    """
    FORWARD with the vhost and queue already encoded (``names``: ``string(vhost) + string(queue)``);
    ``writer``: ``(writer id, sequence)`` of a publish to a replicated stream (flag 2: the id and a
    u64 follow the message), by which a new leader drops one the old leader had taken.
    """
    if writer is None:
        return frame(FORWARD, names + (b"\x01" if redelivered else b"\x00") + messagePart(message))
    return frame(FORWARD, names + (b"\x03" if redelivered else b"\x02") + messagePart(message)
                 + string(writer[0]) + _Q.pack(writer[1]))


def streamAppend(names, count, entries):
    """
    STREAM_APPEND with the vhost and stream already encoded (``names``):
    ``count`` messages as a stream chunk holds them (``entries``: each one's
    u32 size then its bytes, as the stream client published them).
    """
    return frame(STREAM_APPEND, names + _U32.pack(count) + blob(entries))


_GROUP = struct.Struct(">QI")


def streamDedup(names, reference, groups, entries):
    """
    STREAM_DEDUP with the vhost and stream already encoded (``names``): a
    publish of a publisher with ``reference`` (str); ``groups``: ``[(publishing
    id, messages)]`` in order (a sub-entry batch is one id for several
    messages), ``entries``: every message's u32 size then its bytes.
    """
    return frame(STREAM_DEDUP, names + string(reference) + _U32.pack(len(groups))
                 + b"".join(_GROUP.pack(pid, n) for pid, n in groups) + blob(entries))


def readStreamDedup(r):
    """``(vhost, stream, reference, groups, entries)`` of a STREAM_DEDUP, from Reader ``r``."""
    vhost, queue, reference = r.string(), r.string(), r.string()
    buf = r.buf
    groups = []
    for _ in range(r.u32()):
        groups.append(_GROUP.unpack_from(buf, r.pos))
        r.pos += _GROUP.size
    return vhost, queue, reference, groups, r.blob()


def deliver(cid, eid, redelivered, message):
    return frame(DELIVER, _U32.pack(cid) + _Q.pack(eid) + bytes((1 if redelivered else 0,))
                 + messagePart(message))


def consume(cid, vhost, queue, noAck, exclusive, priority, credit, arguments=b""):
    """
    CONSUME; ``arguments`` (bytes): the consumer's basic.consume arguments as
    an AMQP field table (with its length prefix), or empty for none: a
    stream's home makes the reader from them (``x-stream-offset``).  A frame
    without them (an older sender of this build) reads as no arguments.
    """
    flags = (1 if noAck else 0) | (2 if exclusive else 0)
    return frame(CONSUME, _U32.pack(cid) + string(vhost) + string(queue) + bytes((flags,))
                 + struct.pack(">iI", priority, credit) + (blob(arguments) if arguments else b""))


def settle(how, eids):
    return frame(SETTLE, bytes((how,)) + _U32.pack(len(eids)) + b"".join(_Q.pack(e) for e in eids))


def synced(n, refused):
    """SYNCED: u64 n, u32 count, u64 forward numbers refused (reject-publish)."""
    return frame(SYNCED, _Q.pack(n) + _U32.pack(len(refused)) + b"".join(_Q.pack(x) for x in refused))


#: REPLICATE ops (otter_tx/cluster/replication.py)
R_ENQ = 1      # u64 seq, f64 expiresAt (-1: none), u32 returns, u8 redelivered, message
R_DEL = 2      # u32 count, u64 seq...
R_RET = 3      # u64 seq, u32 returns: requeued (delivery count)
R_PURGE = 4    # u32 count, u64 seq kept...
R_RESET = 5    # the snapshot that follows replaces the replica
R_DLV = 6      # u64 seq: delivered (comes back redelivered after a leader change)
R_HOLD = 7     # reason, message: held in the at-least-once dead-letter buffer
R_UNHOLD = 8   # the buffer's messages are being dead-lettered again (those not taken come back as R_HOLD)
#: REPLICATE ops of a stream's leader (otter_tx/cluster/streamrepl.py)
R_SAPPEND = 9  # u32 count, records: u8 kind (0 ENQ, 1 BATCH), u64 first offset, f64 timestamp (ms),
               # u32 messages, blob (an ENQ record as the log holds it, or a BATCH record's entries)
R_STRACK = 10  # json {"sequences", "offsets", "writers", "upTo"}: tracking and forwarded writers (streamrepl.py)

_D = struct.Struct(">d")

#: DELAYED ops (otter_tx/cluster/delayedrepl.py); the leader is the sending node
D_HOLD = 1     # id, f64 due (epoch ms), message: held by the sender
D_DROP = 2     # u32 count, ids: fired or cancelled
D_PURGE = 3    # every message the sender holds for this exchange dropped
D_FORGET = 4   # (vhost and exchange empty) node name: drop every copy held for that node's messages;
               # the node's own name: every copy of the sender's (it sends its snapshot next)


def delayed(vhost, exchange, op, fields=b""):
    return frame(DELAYED, string(vhost) + string(exchange) + bytes((op,)) + fields)


def delayedHold(vhost, exchange, heldId, due, message):
    return frame(DELAYED, string(vhost) + string(exchange) + bytes((D_HOLD,)) + string(heldId) + _D.pack(due)
                 + messagePart(message))


def strings(values):
    """u32 count, a string each."""
    return _U32.pack(len(values)) + b"".join(string(v) for v in values)


def replicate(names, epoch, op, fields=b""):
    """REPLICATE with the vhost and queue already encoded (``names``)."""
    return frame(REPLICATE, names + _Q.pack(epoch) + bytes((op,)) + fields)


def replicateEnqueue(names, epoch, seq, expiresAt, returns, redelivered, message):
    return frame(REPLICATE, names + _Q.pack(epoch) + bytes((R_ENQ,)) + _Q.pack(seq)
                 + _D.pack(-1.0 if expiresAt is None else expiresAt) + _U32.pack(returns)
                 + (b"\x01" if redelivered else b"\x00") + messagePart(message))


def streamRecords(names, epoch, items):
    """REPLICATE R_SAPPEND of ``items``: ``[(kind, first offset, timestamp ms, messages, bytes)]``."""
    return b"".join(streamRecordParts(names, epoch, items))


def streamRecordParts(names, epoch, items):
    """
    :func:`streamRecords` as a list of parts (bytes-like; the records'
    bytes as they are, not copied): for ``LinkProtocol.sendParts``.
    """
    head = [names, _Q.pack(epoch), bytes((R_SAPPEND,)), _U32.pack(len(items))]
    parts = []
    size = 1 + sum(len(p) for p in head)
    pack = _REC.pack
    for kind, first, ts, count, data in items:
        n = len(data)
        head.append(pack(kind, first, ts, count, n))
        parts.append(b"".join(head))
        parts.append(data)
        size += _REC.size + n
        head = []
    if not parts:
        parts.append(b"".join(head))
    parts[0] = _U32.pack(size) + bytes((REPLICATE,)) + parts[0]
    return parts


_REC = struct.Struct(">BQdII")


def readStreamRecords(r):
    """
    The items of an R_SAPPEND (after its op byte), from Reader ``r``: each
    record's bytes a view of the frame's (bytes; not copied: they are
    written to the follower's log as they are).
    """
    out = []
    buf = r.buf
    view = memoryview(buf) if type(buf) is bytes else None
    for _ in range(r.u32()):
        kind, first, ts, count, n = _REC.unpack_from(buf, r.pos)
        r.pos += _REC.size
        out.append((kind, first, ts, count, view[r.pos:r.pos + n] if view is not None
                    else bytes(buf[r.pos:r.pos + n])))
        r.pos += n
    return out


def seqs(values):
    """u32 count, u64 each."""
    return _U32.pack(len(values)) + b"".join(_Q.pack(v) for v in values)


def request(rid, op, args):
    return frame(REQUEST, _U32.pack(rid) + string(op) + blob(json.dumps(args).encode()))


def reply(rid, code, result):
    return frame(REPLY, _U32.pack(rid) + _U16.pack(code) + blob(json.dumps(result).encode()))


def u32frame(kind, *values):
    return frame(kind, b"".join(_U32.pack(v) for v in values))


def u64frame(kind, value):
    return frame(kind, _Q.pack(value))


def jsonframe(kind, obj):
    return frame(kind, blob(json.dumps(obj).encode()))


class Reader:
    """Field reader over one frame's payload (``buf`` bytes from ``pos``)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf, pos=0):
        self.buf = buf
        self.pos = pos

    def u8(self):
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def u16(self):
        v = _U16.unpack_from(self.buf, self.pos)[0]
        self.pos += 2
        return v

    def u32(self):
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def i32(self):
        v = struct.unpack_from(">i", self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self):
        v = _Q.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def f64(self):
        v = _D.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def seqs(self):
        return [self.u64() for _ in range(self.u32())]

    def strings(self):
        return [self.string() for _ in range(self.u32())]

    def string(self):
        n = self.u16()
        p = self.pos
        self.pos = p + n
        return self.buf[p:p + n].decode("utf-8")

    def blob(self):
        n = self.u32()
        p = self.pos
        self.pos = p + n
        return bytes(self.buf[p:p + n])

    def json(self):
        return json.loads(self.blob())

    def more(self):
        """True when the payload has bytes past the fields read so far (an optional trailing field)."""
        return self.pos < len(self.buf)

    def message(self):
        """(exchange, routingKey, propsRaw, body)"""
        return self.string(), self.string(), self.blob(), self.blob()


def splitFrames(buf, limit=None):
    """
    Complete frames at the front of ``buf`` (bytes or bytearray), at most
    ``limit`` (int, None for all): a list of ``(kind, payload)`` and how
    many bytes they took.
    """
    out = []
    pos = 0
    n = len(buf)
    if limit is None:
        limit = n
    # (slices of a view: one copy a frame; a bytearray's slice, then bytes(), made two)
    view = memoryview(buf)
    while n - pos >= 4 and len(out) < limit:
        size = _U32.unpack_from(buf, pos)[0]
        if n - pos - 4 < size:
            break
        start = pos + 4
        out.append((buf[start], bytes(view[start + 1:start + size])))
        pos = start + size
    view.release()
    return out, pos
