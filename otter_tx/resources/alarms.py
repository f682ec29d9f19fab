"""
Resource alarms as RabbitMQ's (https://www.rabbitmq.com/docs/alarms): one
set of active alarms for the node; while any is active, a connection that
publishes is told ``connection.blocked`` and no longer read until they all
clear (``AMQPServerProtocol.alarmChanged``), and the health checks answer 503.

- :class:`Alarms` is the set.  Resources are ``"memory"`` and ``"disk"``, as
  RabbitMQ's ``{resource_limit, memory | disk, Node}``, plus ``"store"``
  (ours: the message store cannot write, see
  :meth:`Alarms.watchStore`).  The ``connection.blocked`` reason is
  RabbitMQ's: ``"low on memory"``, ``"low on disk"``, ``"low on disk &
  memory"`` (checked on RabbitMQ 3.10); the store adds ``"message store
  unavailable"``.
- :class:`DiskMonitor` checks the free space of the filesystem holding the
  data directory against ``disk_free_limit``
  (https://www.rabbitmq.com/docs/disk-alarms), less what the store is about
  to write, at an interval that shrinks with the headroom as RabbitMQ's
  ``rabbit_disk_monitor`` does (from 2.5 s down to 0.1 s).
- :class:`MemoryMonitor` compares the process's resident set size (RSS)
  with ``vm_memory_high_watermark`` (https://www.rabbitmq.com/docs/memory;
  RabbitMQ's default strategy is ``rss`` too).  RSS is read every 0.25 s
  and, on the hot path, every time the connections have received another
  1/128 of the watermark in bytes (:meth:`MemoryMonitor.received`): under
  a flood of small messages a queued message costs about 4x its bytes on
  the wire, so the broker reacts before it overshoots by more than a few
  per cent.  The alarm clears below :data:`CLEAR_FRACTION` of the
  watermark (hysteresis: a flapping alarm would resume and stop every
  publisher at each check).

Time comes from an injected ``IReactorTime``; probes (free space, RSS) are
injectable for tests.  Log lines are RabbitMQ's wording.
"""

import os

from twisted.logger import Logger

from otter_tx.resources.process_memory import rssBytes

log = Logger()

#: RabbitMQ's default disk_free_limit: 50 MB (bytes)
DEFAULT_DISK_FREE_LIMIT = 50 * 1000 * 1000
#: the memory alarm clears when RSS falls below this fraction of the watermark
CLEAR_FRACTION = 0.9
#: above this fraction of the watermark while alarmed, freed memory is released every second
OVERSHOOT_FRACTION = 1.05

#: resource -> the name the health checks show (RabbitMQ 3.10's JSON)
RESOURCE_NAMES = {"disk": "disk space", "memory": "memory", "store": "message store"}


class Alarms:
    """
    The node's active resource alarms.

    :param broker: the :class:`~otter_tx.broker.broker.Broker`; every
        connection in ``broker.connections`` is told of changes through its
        ``alarmChanged(alarmed)`` (bool).

    :ivar active: dict resource (str: ``"disk"``, ``"memory"``, ``"store"``)
        -> detail (str, for logs and health checks).
    :ivar monitors: dict resource -> its monitor (:class:`DiskMonitor`,
        :class:`MemoryMonitor`), for the nodes API.
    """

    def __init__(self, broker):
        self.broker = broker
        self.active = {}
        self.monitors = {}

    def __bool__(self):
        return bool(self.active)

    def set(self, resource, detail=""):
        """Raise the alarm for ``resource`` (str); no-op if already raised."""
        if resource in self.active:
            self.active[resource] = detail
            return
        was = bool(self.active)
        self.active[resource] = detail
        log.warn("{resource} resource limit alarm set on node {node}.\n"
                 "*** Publishers will be blocked until this alarm clears ***",
                 resource=resource, node=self.nodeName)
        self._notify(was)

    def clear(self, resource):
        """Clear the alarm for ``resource`` (str); no-op if not raised."""
        if resource not in self.active:
            return
        del self.active[resource]
        log.warn("{resource} resource limit alarm cleared on node {node}",
                 resource=resource, node=self.nodeName)
        self._notify(True)

    @property
    def nodeName(self):
        """The node name the alarms are reported under (str)."""
        return getattr(self.broker, "nodeName", "otter_tx@localhost")

    def _notify(self, was):
        # a connection already blocked stays blocked when the set changes
        # (RabbitMQ sends connection.blocked once, with the reasons of that moment)
        now = bool(self.active)
        if now != was:
            for conn in list(self.broker.connections):
                # read again each time: unblocking one connection runs its
                # buffered publishes, which may raise an alarm again
                conn.alarmChanged(bool(self.active))

    def reason(self):
        """
        The ``connection.blocked`` reason (str): RabbitMQ's ``"low on " +
        " & ".join(resources)`` (``"low on disk & memory"``), with
        ``"message store unavailable"`` for the store; ``""`` without alarms.
        """
        parts = []
        resources = sorted(r for r in self.active if r in ("disk", "memory"))
        if resources:
            parts.append("low on " + " & ".join(resources))
        if "store" in self.active:
            parts.append("message store unavailable")
        return "; ".join(parts)

    def describe(self):
        """
        The active alarms as the health checks list them: a list of dicts
        ``{"node", "resource"}`` (RabbitMQ's ``"disk space"``,
        ``"memory"``; ours ``"message store"`` with a ``"reason"``).
        """
        out = []
        for resource in sorted(self.active):
            d = {"node": self.nodeName, "resource": RESOURCE_NAMES.get(resource, resource)}
            if resource == "store":
                d["reason"] = self.active[resource] or "the message store cannot write"
            out.append(d)
        return out

    def watchStore(self, store):
        """
        Follow ``store``'s health: while ``store.healthy`` is false the
        ``"store"`` alarm is raised (publishers blocked, health checks 503).
        Uses the store's ``addHealthObserver(callback(healthy, reason))``
        when it has one; a store without it is taken as always healthy.
        """
        add = getattr(store, "addHealthObserver", None)
        if add is None:
            return
        add(self.storeHealthChanged)
        if not getattr(store, "healthy", True):
            self.storeHealthChanged(False, None)

    def storeHealthChanged(self, healthy, reason):
        """The store's health changed (the observer callback)."""
        if healthy:
            self.clear("store")
        else:
            self.set("store", reason or "the message store cannot write")


def diskFreeBytes(path):
    """
    Bytes available to the broker on the filesystem holding ``path`` (int;
    ``f_bavail * f_frsize``, the "Available" column of ``df`` that
    RabbitMQ reads), or None if it cannot be found.
    """
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def totalMemoryBytes():
    """Physical memory of the machine in bytes (int), or None if unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def diskFreeLimitBytes(limit, totalMemory=None):
    """
    The disk free limit in bytes for a parsed ``disk_free_limit``.

    :param limit: ``("absolute", bytes)`` or ``("relative", factor)`` (a
        multiple of RAM, as ``disk_free_limit.relative``), or an int of bytes.
    :param totalMemory: RAM in bytes (default: this machine's).
    :raise ValueError: for a relative limit when RAM cannot be found.
    """
    if isinstance(limit, int):
        return limit
    form, amount = limit
    if form == "absolute":
        return amount
    if totalMemory is None:
        totalMemory = totalMemoryBytes()
    if totalMemory is None:
        raise ValueError("cannot find this machine's RAM size for a relative disk free limit")
    return int(totalMemory * amount)


class _Monitor:
    """A periodic check on the clock (start/stop)."""

    _timer = None
    _running = False

    def _tick(self):
        self._timer = None
        try:
            self.check()
        except Exception:
            log.failure("{name} check failed", name=type(self).__name__)
        if self._running:  # (a check may have stopped it)
            self._timer = self.clock.callLater(self.nextInterval(), self._tick)

    def start(self):
        """Check now and then periodically on the clock (no-op if running)."""
        if not self._running:
            self._running = True
            self._tick()

    def stop(self):
        """Stop checking (no-op if not running)."""
        self._running = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


class DiskMonitor(_Monitor):
    """
    RabbitMQ's disk alarm (https://www.rabbitmq.com/docs/disk-alarms):
    raises ``"disk"`` in ``alarms`` while the free space of the filesystem
    holding ``path``, less the bytes the store is about to write
    (``pending``), is below ``limit`` bytes; clears it when space returns.

    The interval between checks follows ``rabbit_disk_monitor:interval/1``:
    the time the disk would take to fill twice the headroom (free space
    above the limit) at :attr:`fastRate` (RabbitMQ's ``FAST_RATE``, 250
    MB/s), between :attr:`minInterval` (0.1 s, RabbitMQ's
    ``min_check_interval``) and ``interval`` (2.5 s by default; RabbitMQ's
    ``max_check_interval`` is 10 s).  So a disk with 1 GB of headroom is
    read every 2.5 s, one with 100 MB every 0.8 s, one with 12.5 MB or less
    every 0.1 s.  While the alarm is raised (publishers blocked) it is read
    every :attr:`alarmedInterval` (0.25 s; RabbitMQ waits its maximum), so
    the alarm clears soon after space returns.

    :param alarms: the :class:`Alarms`.
    :param clock: ``IReactorTime``.
    :param path: a directory (str) on the watched filesystem (the data dir).
    :param limit: bytes (int); RabbitMQ's default is 50 MB.
    :param probe: ``probe(path)`` -> free bytes (int) or None (default
        :func:`diskFreeBytes`).
    :param interval: the longest time between checks, seconds (float,
        default 2.5).
    :param pending: ``pending()`` -> bytes (int) the store has accepted and
        not yet written (``SQLiteStore.pendingWriteBytes``), counted as
        used: a large batch raises the alarm before it reaches the disk.
        None (default): nothing is counted.
    """

    #: RabbitMQ's FAST_RATE: the rate a disk is assumed to fill at, bytes/s (250 MB/s)
    fastRate = 250 * 1000 * 1000
    #: the shortest time between checks, seconds (RabbitMQ's min_check_interval, 100 ms)
    minInterval = 0.1
    #: time between checks while the alarm is raised, seconds
    alarmedInterval = 0.25

    def __init__(self, alarms, clock, path, limit=DEFAULT_DISK_FREE_LIMIT, probe=None, interval=2.5,
                 pending=None):
        self.alarms = alarms
        self.clock = clock
        self.path = path
        self.limit = limit
        self.probe = probe if probe is not None else diskFreeBytes
        self.interval = interval
        self.pending = pending
        #: free bytes at the last check (int, as ``df`` says), None before it or if unknown
        self.free = None
        #: bytes the store was about to write at the last check (int)
        self.pendingBytes = 0
        alarms.monitors["disk"] = self

    @property
    def alarmed(self):
        """True while the disk alarm is raised."""
        return "disk" in self.alarms.active

    def check(self):
        """Read the free space (and the store's pending bytes) once; raise or clear the alarm."""
        free = self.probe(self.path)
        self.free = free
        if free is None:
            return
        pending = self.pendingBytes = self.pending() if self.pending is not None else 0
        available = free - pending
        if available < self.limit:
            if not self.alarmed:
                log.info("Free disk space is insufficient. Free bytes: {free}. Limit: {limit}",
                         free=available, limit=self.limit)
            detail = "free %d bytes, limit %d" % (available, self.limit)
            if pending:
                detail += " (%d bytes about to be written counted as used)" % (pending,)
            self.alarms.set("disk", detail)
        elif self.alarmed:
            log.info("Free disk space is sufficient. Free bytes: {free}. Limit: {limit}",
                     free=available, limit=self.limit)
            self.alarms.clear("disk")

    def setLimit(self, limit):
        """Change the limit (bytes, int) and check at once."""
        self.limit = limit
        log.info("Disk free limit set to {mb}MB", mb=limit // 1000000)
        self.check()

    def nextInterval(self):
        """
        Seconds until the next check (float): ``2 * headroom /
        fastRate``, from :attr:`minInterval` to ``interval``
        (``rabbit_disk_monitor:interval/1``); :attr:`alarmedInterval`
        while alarmed; ``interval`` while the free space is unknown.
        """
        if self.free is None:
            return self.interval
        if self.alarmed:
            return min(self.interval, self.alarmedInterval)
        headroom = self.free - self.pendingBytes - self.limit
        return max(self.minInterval, min(self.interval, 2.0 * headroom / self.fastRate))


class MemoryMonitor(_Monitor):
    """
    RabbitMQ's memory alarm (https://www.rabbitmq.com/docs/memory) on the
    process's RSS: raises ``"memory"`` in ``alarms`` when RSS exceeds
    ``watermark`` bytes; clears it when RSS falls below
    :data:`CLEAR_FRACTION` of it.

    RSS is read every ``interval`` seconds and whenever the connections
    have received :attr:`step` more bytes (:meth:`received`, called by the
    protocol per chunk read: one addition and one comparison).  While the
    alarm is raised and RSS stays above the clear level, it calls
    ``release`` (``malloc_trim``; a collection on PyPy) when the broker's
    queued-message estimate has fallen by 1/16 of the watermark from its
    highest since the alarm or the last release (looked at every
    :attr:`lookInterval` seconds), at most
    every :attr:`releaseInterval` seconds: freed memory the allocator keeps
    would otherwise hold the alarm for ever.  Above :data:`OVERSHOOT_FRACTION`
    of the watermark it releases every :attr:`lookInterval` seconds whatever
    the estimate says: with publishers blocked, memory that still grows is
    garbage (PyPy collects only when its heap has grown 1.82x: draining a
    backlog took RSS from 1.01x to 1.25x of the watermark without this,
    1.06x-1.14x with it, bench/memory_flood.py) or memory the allocator
    keeps.

    :param alarms: the :class:`Alarms`.
    :param clock: ``IReactorTime``.
    :param watermark: bytes (int).
    :param probe: ``probe()`` -> RSS bytes (int) or None (default
        :func:`otter_tx.resources.process_memory.rssBytes`); where it answers None the
        estimate (queued body bytes plus ``MESSAGE_BYTES`` per message) is
        used instead.
    :param estimate: ``estimate()`` -> estimated bytes of queued messages (int).
    :param release: ``release()`` (default ``otter_tx.resources.process_memory.releaseMemory``).
    :param interval: seconds between timed checks (float, default 0.25).
    """

    #: seconds between two releases at least (float)
    releaseInterval = 5.0
    #: seconds between two looks at the queued-message estimate while alarmed (float)
    lookInterval = 1.0

    def __init__(self, alarms, clock, watermark, probe=None, estimate=None, release=None, interval=0.25):
        from otter_tx.resources.process_memory import releaseMemory

        self.alarms = alarms
        self.clock = clock
        self.probe = probe if probe is not None else rssBytes
        self.estimate = estimate if estimate is not None else (lambda: 0)
        self.release = release if release is not None else releaseMemory
        self.interval = interval
        #: bytes received since the last check (int)
        self.pending = 0
        #: RSS (or estimate) at the last check (int)
        self.used = 0
        #: number of checks made (int)
        self.checks = 0
        self._lastRelease = None
        self._lastLook = None
        #: the highest queued-message estimate seen since the alarm or the last release
        self._estimatePeak = 0
        self.setWatermark(watermark)
        alarms.monitors["memory"] = self

    def setWatermark(self, watermark):
        """Change the watermark (bytes, int); the next check uses it."""
        self.watermark = watermark
        #: received bytes between hot-path checks: 1/128 of the watermark, 64 KiB to 8 MiB
        self.step = max(65536, min(8 * 1024 * 1024, watermark // 128))

    @property
    def alarmed(self):
        """True while the memory alarm is raised."""
        return "memory" in self.alarms.active

    def received(self, nbytes):
        """
        ``nbytes`` (int) arrived from a client: read RSS every :attr:`step`
        bytes.  From here the alarm is only raised: clearing it (which runs
        the blocked publishers' buffered bytes) and releasing memory wait
        for the timer, outside any connection's ``dataReceived``.
        """
        self.pending += nbytes
        if self.pending >= self.step:
            self.check(raiseOnly=True)

    def _read(self):
        used = self.probe()
        if used is None:
            used = self.estimate()
        return used

    def check(self, raiseOnly=False):
        """Read RSS once; raise or (unless ``raiseOnly``) clear the alarm."""
        self.pending = 0
        self.checks += 1
        used = self.used = self._read()
        if raiseOnly and self.alarmed:
            return
        if not self.alarmed:
            if used > self.watermark:
                log.info("vm_memory_high_watermark set. Memory used:{used} allowed:{allowed}",
                         used=used, allowed=self.watermark)
                self._lastRelease = self._lastLook = None
                self._estimatePeak = self.estimate()
                self.alarms.set("memory", "used %d bytes, allowed %d" % (used, self.watermark))
            return
        if used >= self.watermark * CLEAR_FRACTION:
            used = self._maybeRelease(used)
        if used < self.watermark * CLEAR_FRACTION:
            log.info("vm_memory_high_watermark clear. Memory used:{used} allowed:{allowed}",
                     used=used, allowed=self.watermark)
            self.alarms.clear("memory")

    def _maybeRelease(self, used):
        now = self.clock.seconds()
        # still growing with publishers blocked: garbage (PyPy frees nothing
        # before a major collection) or memory the allocator kept
        over = used > self.watermark * OVERSHOOT_FRACTION
        interval = self.lookInterval if over else self.releaseInterval
        if self._lastRelease is not None and now - self._lastRelease < interval:
            return used
        if not over:
            if self._lastLook is not None and now - self._lastLook < self.lookInterval:
                return used
            # the estimate walks every queue: at most once per lookInterval
            self._lastLook = now
            estimate = self.estimate()
            self._estimatePeak = max(self._estimatePeak, estimate)
            if self._estimatePeak - estimate < self.watermark // 16:
                return used
        else:
            estimate = self.estimate()
        self._lastRelease = now
        self._estimatePeak = estimate
        try:
            self.release()
        except Exception:
            log.failure("releasing memory failed")
            return used
        before, used = used, self._read()
        self.used = used
        log.info("memory alarm: freed memory released to the system, RSS {before} -> {after} MiB",
                 before=before >> 20, after=used >> 20)
        return used

    def nextInterval(self):
        """Seconds until the next timed check (float)."""
        return self.interval
