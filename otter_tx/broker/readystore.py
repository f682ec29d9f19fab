"""
A queue's ready messages: priority levels, paging beyond the memory budget,
and the expiry index of what is in memory.

:class:`ReadyStore` (:class:`~otter_tx.broker.interfaces.IReadyStore`) keeps
the READY :class:`QueueEntry` s of one queue in delivery order: one deque per
priority level (``x-max-priority``; highest level first), each level's tail
beyond the queue's memory budget paged to segment files by a
:class:`~otter_tx.broker.paging.Pager` and paged back in order, and one
:class:`~otter_tx.broker.expiry.ExpiryIndex` of the in-memory entries'
deadlines (plus one of the paged segments' earliest deadlines), so an expired
message is reaped wherever it sits (docs/ttl.md).  ``readyCount`` and
``readyBytes`` include paged messages, ``pagedCount`` and ``pagedBytes``
count those alone.

The store decides nothing about consumers, limits or dead-lettering: what
expires in it is marked GONE and handed to ``onExpired(entries)`` (the
queue removes them from the durable store and dead-letters them with
reason ``expired``).  It does not touch the durable store either.

Hot path: :meth:`ReadyStore.append` and :meth:`ReadyStore.popLive` are one
call each per message taken through the queue (the queue binds the store
to a local); ``popLive`` pops from the only level of a queue without
priorities or paging with one more call (``_popFrom``).

All times are milliseconds on the injected clock (``clock.seconds() * 1000``).
"""

import heapq
from collections import deque

from zope.interface import implementer

from otter_tx.broker.expiry import _EPSILON_MS, ExpiryIndex, nowMs
from otter_tx.broker.interfaces import IReadyStore
from otter_tx.broker.paging import ENTRY_OVERHEAD, Pager, dropSegmentFile

#: a paging queue looks whether a segment fits back in memory every this many messages taken
REFILL_EVERY = 64
#: holes (expired entries left in a level's deque) beyond which the levels are compacted,
#: when there are also more holes than ready entries
COMPACT_HOLES = 1024

READY = 0
UNACKED = 1
GONE = 2


class QueueEntry:
    """
    A message's place in one queue.

    :ivar message: the :class:`~otter_tx.broker.message.Message`.
    :ivar seq: enqueue order within the queue (int).
    :ivar expiresAt: absolute expiry in ms, or ``None``.
    :ivar redelivered: True once delivered and requeued.
    :ivar state: READY, UNACKED or GONE.
    :ivar level: the priority level (int, 0 without ``x-max-priority``).
    :ivar deliveredAt: clock seconds of the last delivery (float), or None.
    :ivar returns: how many times it came back unsettled (nack/reject with
        requeue, recover, its channel closing): the quorum queue's delivery
        count, ``x-delivery-count`` (int).
    """

    __slots__ = ("message", "seq", "expiresAt", "redelivered", "state", "level", "deliveredAt",
                 "returns")

    def __init__(self, message, seq, expiresAt, level):
        self.message = message
        self.seq = seq
        self.expiresAt = expiresAt
        self.redelivered = False
        self.state = READY
        self.level = level
        self.deliveredAt = None
        self.returns = 0


@implementer(IReadyStore)
class ReadyStore:
    """
    The ready messages of one queue (see the module docstring).

    :param clock: the injected ``IReactorTime``.
    :param maxPriority: ``x-max-priority`` (int) or None: levels 0..maxPriority.
    :param memoryBudget: bytes of ready messages kept in memory (bodies +
        :data:`~otter_tx.broker.paging.ENTRY_OVERHEAD` each); the rest is paged.
    :param paging: the broker's :class:`~otter_tx.broker.paging.PagingDirectory`.
    :param freer: the broker's :class:`~otter_tx.broker.paging.IncrementalFree`
        (cleared entries and segment files are freed a slice per turn).
    :param lateness: the reaping-lateness recorder of message expiries, or None.
    :param onExpired: called with a list of entries that expired (now GONE,
        already out of the counts).
    """

    def __init__(self, clock, maxPriority, memoryBudget, paging, freer, lateness, onExpired):
        self.clock = clock
        self.maxPriority = maxPriority
        self.memoryBudget = memoryBudget
        self._paging = paging
        self._freer = freer
        self._lateness = lateness
        self._onExpired = onExpired
        self._levels = [deque() for _ in range((maxPriority or 0) + 1)]
        #: GONE entries still in the levels' deques (expired in place)
        self._holes = 0
        self._expiry = ExpiryIndex(clock, self._expired, lateness)
        self._pagers = None  # one Pager per priority level once paging starts
        self._pageExpiry = None  # ExpiryIndex of paged segments by earliest expiry
        self._refillTick = 0
        self._frozen = False
        self.readyCount = 0
        self.readyBytes = 0
        self.pagedCount = 0
        self.pagedBytes = 0

    def levelOf(self, message):
        """The priority level (int) of ``message`` in this store."""
        maxPriority = self.maxPriority
        return min(message.priority, maxPriority) if maxPriority else 0

    def makeEntry(self, message, seq, expiresAt, redelivered):
        """
        A READY :class:`QueueEntry` for a message read back from a segment
        file or the durable store, expiring at ``expiresAt`` (clock ms,
        float, or None: no TTL); a redelivered one counts as returned once
        (the delivery count is not stored, docs/quorum.md).
        """
        entry = QueueEntry(message, seq, expiresAt, self.levelOf(message))
        entry.redelivered = redelivered
        entry.returns = 1 if redelivered else 0
        return entry

    # --- adding -------------------------------------------------------------

    def append(self, entry):
        """
        Put the new READY ``entry`` at the tail of its level (paged when
        its level already pages, or memory is over budget and the level has
        something in memory to deliver first) and index its expiry.
        """
        size = entry.message.size
        if (
            self.pagedCount
            or self.readyBytes + (self.readyCount + 1) * ENTRY_OVERHEAD + size > self.memoryBudget
        ) and self._shouldPage(entry.level, size):
            self._page(entry)
        else:
            self._levels[entry.level].append(entry)
            if entry.expiresAt is not None:
                self._expiry.add(entry, entry.expiresAt)
        self.readyCount += 1
        self.readyBytes += size

    def reinsert(self, entries):
        """
        Make ``entries`` (READY, in descending seq order) ready again at
        their seq positions, in memory.  Entries before a level's head or
        after its tail are placed in O(1) each; the others are merged into
        the level in one pass (O(level + k log k)).
        """
        middle = None
        levels = self._levels
        expiry = self._expiry
        for entry in entries:
            dq = levels[entry.level]
            if not dq or entry.seq < dq[0].seq:
                dq.appendleft(entry)
            elif entry.seq > dq[-1].seq:
                dq.append(entry)
            else:
                if middle is None:
                    middle = {}
                middle.setdefault(entry.level, []).append(entry)
            self.readyCount += 1
            self.readyBytes += entry.message.size
            if entry.expiresAt is not None:
                expiry.add(entry, entry.expiresAt)
        if middle:
            for level, mids in middle.items():
                mids.reverse()  # ascending seq
                levels[level] = deque(heapq.merge(levels[level], mids, key=_bySeq))

    # --- taking -------------------------------------------------------------

    def popHead(self):
        """
        Remove and return the first READY entry (highest priority first),
        or None.  Does not check expiry.
        """
        if self.pagedCount:
            return self._popHeadPaged()
        for dq in reversed(self._levels):
            if dq:
                entry = self._popFrom(dq)
                if entry is not None:
                    return entry
        return None

    def popLive(self):
        """
        Remove and return the first READY entry that has not expired, or
        None; expired ones met on the way are marked GONE and handed to
        ``onExpired`` (RabbitMQ: never deliver an expired message).
        """
        levels = self._levels
        if len(levels) == 1 and not self.pagedCount:
            # the common case: one level, nothing paged
            entry = self._popFrom(levels[0])
        else:
            entry = self.popHead()
        if entry is not None and entry.expiresAt is not None and entry.expiresAt <= nowMs(self.clock):
            return self._popLiveExpired(entry)
        return entry

    def _popLiveExpired(self, entry):
        """:meth:`popLive` met the expired ``entry`` (taken out): go on past every expired one."""
        expired = []
        now = nowMs(self.clock)
        while entry is not None and entry.expiresAt is not None and entry.expiresAt <= now:
            entry.state = GONE
            expired.append(entry)
            entry = self.popHead()
        self._onExpired(expired)
        return entry

    def _popFrom(self, dq):
        """Remove and return the first READY entry of deque ``dq`` (skipping holes), or None."""
        while dq:
            entry = dq.popleft()
            if entry.state == READY:
                self.readyCount -= 1
                self.readyBytes -= entry.message.size
                if entry.expiresAt is not None:
                    self._expiry.remove(entry)
                return entry
            self._holes -= 1
        return None

    def _popHeadPaged(self):
        """:meth:`popHead` while some level pages: refill ahead of need."""
        levels = self._levels
        for level in range(len(levels) - 1, -1, -1):
            dq = levels[level]
            while True:
                entry = self._popFrom(dq)
                if entry is not None:
                    if self.pagedCount and self._pagers[level]:
                        # refill ahead of need: look every REFILL_EVERY
                        # messages (the budget check costs a few calls), at
                        # once when the head is empty
                        if not dq:
                            self._pageIn(level, True)
                        else:
                            self._refillTick += 1
                            if self._refillTick >= REFILL_EVERY:
                                self._refillTick = 0
                                self._pageIn(level, False)
                    return entry
                if not (self.pagedCount and self._pageIn(level, True)):
                    break
        return None

    # --- paging -------------------------------------------------------------

    def _memoryCost(self):
        """Bytes the in-memory ready messages cost, as the budget counts them."""
        return (self.readyBytes - self.pagedBytes) + (self.readyCount - self.pagedCount) * ENTRY_OVERHEAD

    def _shouldPage(self, level, size):
        """
        True when a new ready message of ``level`` must be paged: its level
        already pages (order), or memory is over budget and the level has
        something in memory to deliver first.
        """
        pagers = self._pagers
        if pagers is not None and pagers[level]:
            return True
        return (self._memoryCost() + ENTRY_OVERHEAD + size > self.memoryBudget
                and bool(self._levels[level]))

    def _page(self, entry):
        """Put READY ``entry`` at the tail of its level's pager (counts are the caller's)."""
        pagers = self._pagers
        if pagers is None:
            pagers = self._pagers = [None] * len(self._levels)
        p = pagers[entry.level]
        if p is None:
            p = pagers[entry.level] = Pager(self._paging, entry.level)
        seg = p.append(entry)
        self.pagedCount += 1
        self.pagedBytes += entry.message.size
        if entry.expiresAt is not None and seg.minExpiresAt == entry.expiresAt:
            if self._pageExpiry is None:
                self._pageExpiry = ExpiryIndex(self.clock, self._pagedExpired, self._lateness)
                if self._frozen:
                    self._pageExpiry.freeze()
            self._pageExpiry.add(seg, seg.minExpiresAt)

    def pagesFrom(self):
        """True when level 0 of a store without priorities pages (new messages go to its tail)."""
        return not self.maxPriority and self._pagers is not None and bool(self._pagers[0])

    def appendStored(self, run):
        """
        Page at the tail a run of READY messages kept by the durable store
        (:class:`~otter_tx.broker.paging.StoredRun`; recovery of a deep
        queue without priorities), counted and indexed by expiry without
        reading them.
        """
        pagers = self._pagers
        if pagers is None:
            pagers = self._pagers = [None] * len(self._levels)
        p = pagers[0]
        if p is None:
            p = pagers[0] = Pager(self._paging, 0)
        seg = p.appendStored(run)
        self.readyCount += seg.count
        self.readyBytes += seg.bytes
        self.pagedCount += seg.count
        self.pagedBytes += seg.bytes
        if seg.minExpiresAt is not None:
            if self._pageExpiry is None:
                self._pageExpiry = ExpiryIndex(self.clock, self._pagedExpired, self._lateness)
                if self._frozen:
                    self._pageExpiry.freeze()
            self._pageExpiry.add(seg, seg.minExpiresAt)

    def _pageIn(self, level, force):
        """
        Move the oldest segment of ``level``'s pager back into memory if it
        fits the budget, or anyway when ``force``.  One segment per call
        bounds the time taken (called after each message taken, so the
        in-memory head is refilled ahead of need).  Returns True if one was
        loaded.
        """
        p = self._pagers[level]
        if not p:
            return False
        dq = self._levels[level]
        if not force and self._memoryCost() + p.head().cost > self.memoryBudget:
            return False
        seg, entries = p.popHead(self.makeEntry)
        if self._pageExpiry is not None:
            self._pageExpiry.remove(seg)
        self.pagedCount -= seg.count
        self.pagedBytes -= seg.bytes
        dq.extend(entries)
        expiry = self._expiry
        for e in entries:
            if e.expiresAt is not None:
                expiry.add(e, e.expiresAt)
        return True

    # --- expiry -------------------------------------------------------------

    def _expired(self, entries):
        """The expiry index fired for in-memory ``entries``: holes now, compacted when many."""
        gone = []
        for entry in entries:
            if entry.state == READY:
                entry.state = GONE
                self.readyCount -= 1
                self.readyBytes -= entry.message.size
                self._holes += 1
                gone.append(entry)
        if self._holes > COMPACT_HOLES and self._holes > self.readyCount:
            self._levels = [deque(e for e in dq if e.state == READY) for dq in self._levels]
            self._holes = 0
        if gone:
            self._onExpired(gone)

    def _pagedExpired(self, segments):
        """
        Paged segments whose earliest expiry passed: read each, hand its
        expired messages to ``onExpired`` and keep the rest paged.
        """
        now = nowMs(self.clock) + _EPSILON_MS
        dead = []
        for seg in segments:
            p = self._pagers[seg.level] if self._pagers is not None else None
            if p is None:
                continue
            keep = []
            for e in p.read(seg, self.makeEntry):
                if e.expiresAt is not None and e.expiresAt <= now:
                    e.state = GONE
                    dead.append(e)
                else:
                    keep.append(e)
            n, b = seg.count, seg.bytes
            left = p.replace(seg, keep)
            n2, b2 = (left.count, left.bytes) if left is not None else (0, 0)
            self.pagedCount -= n - n2
            self.pagedBytes -= b - b2
            self.readyCount -= n - n2
            self.readyBytes -= b - b2
            if left is not None and left.minExpiresAt is not None:
                self._pageExpiry.add(left, left.minExpiresAt)
        if dead:
            self._onExpired(dead)

    def freeze(self):
        """Stop the expiry timers for good (broker shutdown); the entries stay."""
        self._frozen = True
        self._expiry.freeze()
        if self._pageExpiry is not None:
            self._pageExpiry.freeze()

    # --- bulk removal ---------------------------------------------------------

    def clear(self):
        """
        Forget every ready entry at once (purge, delete): the entries are
        marked GONE and the segment files removed a slice per reactor turn
        afterwards (``freer``); the counts are zero and the expiry timers
        cancelled at once (an index keeps its timer after its last entry
        is taken, until then).
        """
        levels = self._levels
        self._levels = [deque() for _ in levels]
        freer = self._freer
        for dq in levels:
            freer.add(dq, markGone)
        if self._pagers is not None:
            for p in self._pagers:
                if p is not None:
                    freer.addPaths(p.detach())
            self._pagers = None
        if self._pageExpiry is not None:
            self._pageExpiry.clear()
        self.pagedCount = 0
        self.pagedBytes = 0
        self.readyCount = 0
        self.readyBytes = 0
        self._holes = 0
        self._expiry.clear()

    def detachHead(self, maxLength, maxBytes, work):
        """
        Take head messages out until at most ``maxLength`` messages and
        ``maxBytes`` body bytes are left (either may be None), so the counts
        respect a lowered limit at once; what was taken is appended to
        ``work`` (a deque) as ``[segmentRef, entries, 0]`` items in order:
        ``entries`` a list or a detached deque of entries (still READY, out
        of every index; a detached deque may hold holes), or ``segmentRef``
        a whole paged segment taken unread (read it with
        :meth:`readDetached`).
        """
        dropped = []
        work.append([None, dropped, 0])
        levels = self._levels
        pageExpiry = self._pageExpiry
        for level in range(len(levels) - 1, -1, -1):
            p = self._pagers[level] if self._pagers is not None else None
            while self.readyCount and (
                (maxLength is not None and self.readyCount > maxLength)
                or (maxBytes is not None and self.readyBytes > maxBytes)
            ):
                dq = self._levels[level]
                if dq:
                    if len(levels) == 1 and self._dropsAllInMemory(maxLength, maxBytes):
                        # detach the whole deque: O(1) however many a
                        # requeue left in memory (holes are skipped later)
                        self._levels = levels = [deque()]
                        self.readyCount = self.pagedCount
                        self.readyBytes = self.pagedBytes
                        self._holes = 0
                        self._expiry.clear()
                        work.append([None, dq, 0])
                        dropped = []
                        work.append([None, dropped, 0])
                        continue
                    entry = self._popFrom(dq)
                    if entry is not None:
                        dropped.append(entry)
                    continue
                if not p:
                    break
                seg = p.head()
                if ((maxLength is not None and self.readyCount - seg.count >= maxLength)
                        or (maxBytes is not None and self.readyBytes - seg.bytes > maxBytes)):
                    # every message of the segment goes: detach it unread
                    p.segments.popleft()
                    p._uncount(seg)
                    if pageExpiry is not None:
                        pageExpiry.remove(seg)
                    self.pagedCount -= seg.count
                    self.pagedBytes -= seg.bytes
                    self.readyCount -= seg.count
                    self.readyBytes -= seg.bytes
                    dropped = []
                    work.append([(p, seg), None, 0])
                    work.append([None, dropped, 0])
                else:
                    self._pageIn(level, True)

    def _dropsAllInMemory(self, maxLength, maxBytes):
        """True if every in-memory ready message is to be dropped (the paged rest is at or over the limit)."""
        return ((maxLength is not None and self.pagedCount >= maxLength)
                or (maxBytes is not None and self.pagedBytes > maxBytes))

    def readDetached(self, segmentRef):
        """
        The entries (list) of a segment taken by :meth:`detachHead`; its
        file is removed.  Empty if its pager was cleared meanwhile.
        """
        p, seg = segmentRef
        try:
            entries = p.read(seg, self.makeEntry)
        except OSError:
            entries = []  # its pager was cleared (purge, delete) meanwhile
        if seg.file is not None:
            dropSegmentFile(seg.file)
        return entries

    # --- reading --------------------------------------------------------------

    def entries(self):
        """
        Iterate the ready entries in delivery order, paged ones included
        (read from their files: management and the durable store only).
        """
        levels = self._levels
        pagers = self._pagers
        for level in range(len(levels) - 1, -1, -1):
            for entry in levels[level]:
                if entry.state == READY:
                    yield entry
            p = pagers[level] if pagers is not None else None
            if p:
                for entry in p.iterEntries(self.makeEntry):
                    yield entry

    def expiries(self):
        """
        The ready messages' expiry times without reading any file:
        ``(expiresAt, count, exact)`` triples, ``expiresAt`` in ms on the
        clock's time base or None (no TTL).  In-memory messages come one by
        one (``exact`` True); a paged-out segment comes as one triple with
        its earliest expiry and its message count (``exact`` False), so the
        cost is O(in-memory messages + segments).
        """
        for dq in self._levels:
            for entry in dq:
                if entry.state == READY:
                    yield entry.expiresAt, 1, True
        for p in self._pagers or ():
            if p:
                for seg in p.segments:
                    if seg.count:
                        yield seg.minExpiresAt, seg.count, False

    def persistent(self):
        """
        ``(count, bytes)`` of persistent ready messages, paged ones included
        (from the segments' counters: no file is read).
        """
        n = b = 0
        for dq in self._levels:
            for entry in dq:
                if entry.state == READY and entry.message.persistent:
                    n += 1
                    b += entry.message.size
        for p in self._pagers or ():
            if p is not None:
                n += p.persistent
                b += p.persistentBytes
        return n, b


def _bySeq(entry):
    return entry.seq


def markGone(entry):
    """Mark ``entry`` GONE (for ``IncrementalFree.add``)."""
    entry.state = GONE
