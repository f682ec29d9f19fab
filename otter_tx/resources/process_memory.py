"""
Giving freed memory back to the operating system, on CPython and PyPy.

When a purge, a queue delete or closing connections frees many objects,
the two runtimes differ in what happens next:

- CPython frees each object at once (reference counting).  Its small-object
  allocator returns an arena when it is wholly empty; what glibc's
  ``malloc`` holds on its heap (the ``deque`` blocks of a queue, larger
  bodies) stays mapped until ``malloc_trim``.
- PyPy frees nothing until its next major collection, which it starts only
  when the heap has grown by ``PYPY_GC_MAJOR_COLLECT`` (1.82x) since the
  last one.  An idle broker therefore keeps a purged queue's memory for
  ever.  ``gc.collect()`` runs that collection; the arenas it empties go
  back to glibc, and ``malloc_trim`` returns them to the system.

:func:`releaseMemory` does both, as far as the runtime allows;
:class:`MemoryReleaser` calls it on the reactor a little after the queued
bytes, the queued messages or the connections dropped by a large amount.
docs/performance.md ("PyPy: memory") has the numbers and commands
(bench/memory_release.py).
"""

import ctypes
import ctypes.util
import gc
import os
import platform

from twisted.logger import Logger

log = Logger()

#: True on PyPy (its GC frees nothing before a major collection)
PYPY = platform.python_implementation() == "PyPy"

_trim = False  # not looked up yet; None when the C library has no malloc_trim


def _mallocTrim():
    """glibc's ``malloc_trim`` as a ctypes function, or None (musl, macOS ...)."""
    global _trim
    if _trim is False:
        _trim = None
        trim = None
        # glibc's name first: find_library runs ldconfig in a subprocess
        for name in ("libc.so.6", None):
            if name is None:
                name = ctypes.util.find_library("c")
            try:
                trim = ctypes.CDLL(name).malloc_trim
                break
            except (OSError, AttributeError, TypeError):
                continue
        if trim is not None:
            trim.argtypes = [ctypes.c_size_t]
            trim.restype = ctypes.c_int
            _trim = trim
    return _trim


def releaseMemory(collect=False):
    """
    Return freed memory to the operating system as far as the runtime
    allows: a full collection (``gc.collect()``) on PyPy, or on CPython when
    ``collect`` is true, then ``malloc_trim(0)`` where the C library has it
    (glibc).

    On PyPy the collection is what frees a purged queue at all.  CPython
    has already freed queued messages by reference counting (they form no
    cycles); a closed connection's objects do form cycles (protocol,
    transport, channels), which without a full collection stay until the
    next timed one (``OtterService.gcFullInterval``, 300 s), so pass
    ``collect=True`` after many connections closed.

    Blocking, on the calling thread.  Cost: a full collection takes time
    proportional to the live heap (PyPy: about 180 ms after 1,000,000
    messages were purged, bench/memory_release.py); ``malloc_trim`` a few ms.

    :param collect: also collect on CPython (bool).
    :return: True if ``malloc_trim`` reported memory released (bool).
    """
    if PYPY or collect:
        gc.collect()
    trim = _mallocTrim()
    if trim is None:
        return False
    return bool(trim(0))


#: estimated bytes per queued or unacknowledged message besides its body
#: (bench/memory_release.py: about 376 on CPython 3.11 and 297 on PyPy 7.3 for 16 B bodies)
MESSAGE_BYTES = 300
#: estimated bytes per open connection with a channel (about 12 KB on CPython, 9 KB on PyPy)
CONNECTION_BYTES = 10000


class MemoryReleaser:
    """
    Calls :func:`releaseMemory` on the reactor soon after the broker's
    estimated memory use has dropped by a large amount: after a purge, a
    queue delete, a drained backlog or many closed connections.

    Every ``interval`` seconds (one pass over the queues) it estimates two
    amounts (bytes, int):
    messages (ready body bytes plus :data:`MESSAGE_BYTES` per ready or
    unacknowledged message, over every queue) and connections
    (:data:`CONNECTION_BYTES` each), and remembers the peak of each since
    the last release.  When either has fallen ``threshold`` bytes below its
    peak, it releases (with a full collection on CPython only when the
    connections fell that much, see :func:`releaseMemory`), logs one line
    with the RSS before and after, and takes the current amounts as the new
    peaks.  Steady traffic never triggers it.  A rise and fall that both
    happen between two looks is not seen; the runtime's own collections
    free that memory later, glibc may keep it until the next release.

    :param broker: the :class:`~otter_tx.broker.broker.Broker`.
    :param clock: ``IReactorTime`` for the timer.
    :param interval: seconds between looks (float, default 1).
    :param threshold: bytes (int) of drop that trigger a release (default 64 MiB).
    :param release: the function to call, ``release(collect=bool)``
        (default :func:`releaseMemory`).
    """

    def __init__(self, broker, clock, interval=1.0, threshold=64 * 1024 * 1024, release=None):
        self.broker = broker
        self.clock = clock
        self.interval = interval
        self.threshold = threshold
        self.release = release if release is not None else releaseMemory
        #: releases done so far (int)
        self.releases = 0
        self._peakMessages = 0
        self._peakConnections = 0
        self._timer = None

    def amounts(self):
        """``(messages, connections)``: the two estimates in bytes (ints)."""
        return self.broker.messageBytesEstimate(), len(self.broker.connections) * CONNECTION_BYTES

    def check(self):
        """Look once; release if either amount fell ``threshold`` below its peak."""
        messages, connections = self.amounts()
        self._peakMessages = max(self._peakMessages, messages)
        self._peakConnections = max(self._peakConnections, connections)
        connectionsFell = self._peakConnections - connections >= self.threshold
        if connectionsFell or self._peakMessages - messages >= self.threshold:
            before = rssBytes()
            try:
                released = self.release(collect=connectionsFell)
            except Exception:
                log.failure("releasing memory failed")
            else:
                after = rssBytes()
                log.info("memory released (messages fell by about {messages} MiB, connections by about "
                         "{connections} MiB): RSS {before} -> {after} MiB{trimmed}",
                         messages=(self._peakMessages - messages) >> 20,
                         connections=(self._peakConnections - connections) >> 20,
                         before="?" if before is None else before >> 20,
                         after="?" if after is None else after >> 20,
                         trimmed="" if released else " (malloc_trim released nothing)")
            self.releases += 1
            self._peakMessages, self._peakConnections = messages, connections

    def start(self):
        """Look every ``interval`` seconds on the clock (no-op if running)."""
        from twisted.internet.task import LoopingCall

        if self._timer is not None:
            return
        self._timer = LoopingCall(self.check)
        self._timer.clock = self.clock
        self._timer.start(self.interval, now=False)

    def stop(self):
        """Stop looking (no-op if not running)."""
        if self._timer is not None and self._timer.running:
            self._timer.stop()
        self._timer = None


def rssBytes():
    """
    The process's resident set size now (int, bytes), from
    ``/proc/self/statm``; None where there is no ``/proc`` (not Linux).
    """
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
