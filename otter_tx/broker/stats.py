"""
Message rates: the per-channel message counters, and the sampler that turns
every object's counters and queue lengths into RabbitMQ 3.10's ``*_details``
(``rate``, and for a requested range ``samples``, ``avg``, ``avg_rate``),
as ``rabbit_mgmt_stats:format_range`` computes them
(deps/rabbitmq_management/src/rabbit_mgmt_stats.erl, and
``rabbit_mgmt_util:range/3`` for the query parameters).

- :class:`MessageCounts`: one channel's (Session's) message counters, plain
  ints incremented where the event happens; a vhost keeps the counts of its
  closed channels (and of HTTP requests) in one more, so vhost and overview
  totals never drop when a channel closes (RabbitMQ keeps them too).
- :class:`Series`: one object's history of counter tuples.
- :class:`Sampler`: a ``LoopingCall`` on the injected clock that records,
  every ``collect_statistics_interval`` ms, a snapshot of every queue,
  exchange, channel, connection, vhost and of the node.
- :func:`statsDict`: ``{key: value, key_details: {...}}`` from a series.

Nothing here touches the hot path: the sampler reads counters the broker
keeps anyway.
"""

from collections import deque

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

log = Logger()

#: RabbitMQ's default ``collect_statistics_interval`` (ms)
DEFAULT_INTERVAL_MS = 5000

#: seconds of history kept per object at the collection interval: the
#: first tier of RabbitMQ 3.10's ``basic`` retention policy
RETENTION_S = 600

#: its second tier: seconds kept, at one point a minute (ms), for older samples
COARSE_RETENTION_S = 3600
COARSE_MS = 60000

#: RabbitMQ's ``?MAX_RANGE``: at most this many increments per requested range
MAX_RANGE = 500

#: the overview's ``sample_retention_policies`` (seconds), as RabbitMQ 3.10's defaults
SAMPLE_RETENTION_POLICIES = {
    "global": [600, 3600, 28800, 86400],
    "basic": [600, 3600],
    "detailed": [600],
}


class MessageCounts:
    """
    Message counters of one channel (or the sum of several), all ints,
    never reset; names as RabbitMQ's ``channel_stats_fine_stats`` and
    ``channel_stats_deliver_stats``:

    :ivar publish: messages published (routed or not; at ``tx.commit`` in a transaction).
    :ivar publishConfirm: of those, published in confirm mode (the global counter ``received_confirm``).
    :ivar confirm: messages confirmed with ``basic.ack`` (nacks not counted, as RabbitMQ).
    :ivar returnUnroutable: mandatory messages returned (312 NO_ROUTE).
    :ivar dropUnroutable: non-mandatory messages that reached no queue.
    :ivar deliver: ``basic.deliver`` in manual acknowledgement mode.
    :ivar deliverNoAck: ``basic.deliver`` to no-ack consumers.
    :ivar get: ``basic.get-ok`` in manual mode.  :ivar getNoAck: with no-ack.
    :ivar getEmpty: ``basic.get-empty`` answers.
    :ivar ack: deliveries acknowledged by ``basic.ack``.
    :ivar redeliver: deliveries (consume or get) with the redelivered flag.
    """

    __slots__ = ("publish", "publishConfirm", "confirm", "returnUnroutable", "dropUnroutable",
                 "deliver", "deliverNoAck", "get", "getNoAck", "getEmpty", "ack", "redeliver")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def add(self, other):
        """Add ``other``'s counts (a MessageCounts) to these."""
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @classmethod
    def total(cls, parts):
        """A new MessageCounts, the sum of ``parts`` (iterable of MessageCounts)."""
        out = cls()
        for p in parts:
            out.add(p)
        return out


#: RabbitMQ's ``message_stats`` keys of a channel, in the order 3.10 lists them
CHANNEL_KEYS = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver",
                "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack", "redeliver",
                "deliver_get")

#: otter_tx's own ``message_stats`` keys, where RabbitMQ has none
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")
DEAD_LETTER_KEYS = tuple("dead_lettered_" + r for r in DEAD_LETTER_REASONS)

#: a queue's ``message_stats`` keys (what left that queue, and what arrived)
QUEUE_KEYS = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack",
              "redeliver", "deliver_get", "expired") + DEAD_LETTER_KEYS

#: a vhost's and the overview's ``message_stats`` keys
VHOST_KEYS = CHANNEL_KEYS + ("expired",) + DEAD_LETTER_KEYS + ("delayed",)

#: an exchange's (``delayed`` only on x-delayed-message exchanges)
EXCHANGE_KEYS = ("publish_in", "publish_out")
DELAYED_EXCHANGE_KEYS = EXCHANGE_KEYS + ("delayed",)

#: queue lengths (``lengths_age``/``lengths_incr``)
LENGTH_KEYS = ("messages", "messages_ready", "messages_unacknowledged")

#: bytes (``data_rates_age``/``data_rates_incr``)
DATA_KEYS = ("recv_oct", "send_oct")

#: the overview's ``churn_rates`` keys (``connection_churn_rates``)
CHURN_KEYS = ("connection_created", "connection_closed", "channel_created", "channel_closed",
              "queue_declared", "queue_created", "queue_deleted")


def channelValues(c):
    """``CHANNEL_KEYS`` values of MessageCounts ``c`` (tuple of ints)."""
    return (c.publish, c.confirm, c.returnUnroutable, c.dropUnroutable, c.deliver, c.deliverNoAck,
            c.get, c.getNoAck, c.getEmpty, c.ack, c.redeliver,
            c.deliver + c.deliverNoAck + c.get + c.getNoAck)


def queueValues(q):
    """``QUEUE_KEYS`` values of a queue (tuple of ints)."""
    noAck = q.noAckCount
    gets = q.getCount
    getsNoAck = q.getNoAckCount
    left = q.leftBy
    dl = q.deadLetteredBy
    return ((q.publishedCount, q.deliveredCount - noAck - gets, noAck - getsNoAck, gets, getsNoAck,
             q.getEmptyCount, q.ackCount, q.redeliverCount, q.deliveredCount, left.get("expired", 0))
            + tuple(dl.get(r, 0) for r in DEAD_LETTER_REASONS))


def lengthValues(queues):
    """``LENGTH_KEYS`` values summed over ``queues`` (tuple of ints)."""
    ready = unacked = 0
    for q in queues:
        ready += q.readyCount
        unacked += q.unackedCount
    return (ready + unacked, ready, unacked)


def vhostMessageCounts(vh):
    """All of vhost ``vh``'s channel counts: closed channels, HTTP requests and the open ones."""
    return MessageCounts.total([vh.channelStats] + [s.stats for s in vh.sessions])


def vhostValues(vh):
    """``VHOST_KEYS`` values of vhost ``vh`` (tuple of ints)."""
    left = vh.leftBy
    return (channelValues(vhostMessageCounts(vh)) + (left.get("expired", 0),)
            + tuple(vh.deadLettered.get(r, 0) for r in DEAD_LETTER_REASONS) + (vh.delayedCount,))


def exchangeValues(ex):
    """``EXCHANGE_KEYS`` (or ``DELAYED_EXCHANGE_KEYS``) values of an exchange."""
    if ex.delayed:
        return (ex.publishIn, ex.publishOut, ex.delayedCount)
    return (ex.publishIn, ex.publishOut)


def churnValues(counters):
    """``CHURN_KEYS`` values of the broker's GlobalCounters."""
    c = counters
    return (c.connectionsOpened, c.connectionsClosed, c.channelsOpened, c.channelsClosed,
            c.queuesDeclared, c.queuesCreated, c.queuesDeleted)


def sumValues(rows, width):
    """Column sums of ``rows`` (tuples of ``width`` ints)."""
    out = [0] * width
    for r in rows:
        for i, v in enumerate(r):
            out[i] += v
    return tuple(out)


class Series:
    """
    One object's history in RabbitMQ 3.10's two ``basic`` tiers:
    ``points``, a deque of ``(timestamp ms, values tuple)`` for the last
    :data:`RETENTION_S` seconds, and ``coarse``, the same at most one a
    minute for the last :data:`COARSE_RETENTION_S`; a point is appended
    only when the values changed, so an idle object costs one point in
    each whatever its age.  ``lastTs``/``prevTs`` are the times of the
    last two snapshots (changed or not).

    Bound: at most ``RETENTION_S * 1000 / interval + 2`` points (122 at the
    default 5 s) plus ``COARSE_RETENTION_S / 60 + 2`` (62), the oldest
    dropped once a newer one is older than its tier's retention.  Memory:
    8 bytes per counter per point, plus 28 per value above 256, plus about
    100 bytes of tuples; measured (tracemalloc), a busy queue's 121 fine
    points take about 50 KB (its coarse ones a half of that), an idle
    object two points (under 1 KB).
    """

    __slots__ = ("points", "coarse", "lastTs", "prevTs")

    def __init__(self):
        self.points = deque()
        self.coarse = deque()
        self.lastTs = None
        self.prevTs = None

    def record(self, ts, values, horizon, coarseHorizon=None):
        """
        Snapshot ``values`` (tuple) at ``ts`` (ms); forget fine points older
        than ``horizon`` and coarse ones older than ``coarseHorizon`` (ms;
        default: the coarse retention before ``ts``).
        """
        pts = self.points
        if not pts or pts[-1][1] != values:
            pts.append((ts, values))
        self.prevTs, self.lastTs = self.lastTs, ts
        while len(pts) > 1 and pts[1][0] <= horizon:
            pts.popleft()
        c = self.coarse
        if not c or (c[-1][1] != values and c[-1][0] // COARSE_MS != ts // COARSE_MS):
            c.append((ts, values))
        if coarseHorizon is None:
            coarseHorizon = ts - COARSE_RETENTION_S * 1000
        while len(c) > 1 and c[1][0] <= coarseHorizon:
            c.popleft()

    def _tier(self, ts):
        """The points that answer for time ``ts``: the fine ones from their first on, else the coarse."""
        pts = self.points
        return pts if pts and ts >= pts[0][0] else self.coarse

    def valueAt(self, ts):
        """The values tuple in force at ``ts`` (ms), or None before the first snapshot."""
        for pts, values in reversed(self._tier(ts)):
            if pts <= ts:
                return values
        return None


def lastTwo(series, nowMs, intervalMs):
    """
    ``(newest values, previous values, ms between)`` of the last two
    snapshots, or None when there are not two or the last is older than
    the previous interval (``rabbit_mgmt_stats:format_no_range``: the rate
    is then 0.0).
    """
    if series is None or series.prevTs is None:
        return None
    rangePoint = (nowMs // intervalMs) * intervalMs - intervalMs
    if series.lastTs < rangePoint:
        return None
    a = series.valueAt(series.lastTs)
    b = series.valueAt(series.prevTs)
    if a is None or b is None:
        return None
    return a, b, series.lastTs - series.prevTs


def rateOf(series, index, nowMs, intervalMs, last=False):
    """
    The instant ``rate`` (per second, float) of column ``index``: the
    difference of the last two snapshots over their distance (``last``:
    :func:`lastTwo` when the caller has it).
    """
    if last is False:
        last = lastTwo(series, nowMs, intervalMs)
    if last is None:
        return 0.0
    a, b, dt = last
    return (a[index] - b[index]) * 1000.0 / dt


def rangeGrid(nowMs, ageS, incrS, ceil=False):
    """
    The sample timestamps (ms, newest first) of a range of ``ageS`` seconds
    in steps of ``incrS`` seconds ending now rounded down to the step (up
    for queue lengths, ``ceil``), as ``rabbit_mgmt_util:range/3``.
    """
    incr = incrS * 1000
    last = (nowMs // incr) * incr
    if ceil and last != nowMs:
        last += incr
    first = last - ageS * 1000
    return list(range(last, first - 1, -incr))


def valuesAt(series, grid):
    """
    The values tuple in force at each timestamp of ``grid`` (newest first),
    None before the series' first point: one pass over the fine points,
    then over the coarse ones for what is older.
    """
    out = []
    if series is None:
        return [None] * len(grid)
    fine = series.points
    start = fine[0][0] if fine else None
    tiers = [reversed(fine), reversed(series.coarse)]
    points = tiers.pop(0)
    point = next(points, None)
    coarse = False
    for ts in grid:
        if not coarse and (start is None or ts < start):
            coarse = True
            points = tiers.pop(0)
            point = next(points, None)
        while point is not None and point[0] > ts:
            point = next(points, None)
        out.append(point[1] if point is not None else None)
    return out


def rangeDetails(series, index, nowMs, ageS, incrS, ceil=False, rows=None):
    """
    ``{"rate", "samples", "avg_rate", "avg"}`` of column ``index`` over
    the range (:func:`rangeGrid`), as ``rabbit_mgmt_stats:format_range``:
    ``samples`` newest first, a sample being the value in force at its
    timestamp (0 before the object had any); ``rate`` from the two newest
    samples; ``avg_rate`` from the newest and the oldest; ``avg`` the mean
    of the samples.  ``rows``: ``(grid, valuesAt(series, grid))`` when the
    caller computed them once for several columns.
    """
    if rows is None:
        grid = rangeGrid(nowMs, ageS, incrS, ceil)
        rows = (grid, valuesAt(series, grid))
    grid, values = rows
    samples = [{"sample": v[index] if v is not None else 0, "timestamp": ts} for ts, v in zip(grid, values)]
    d = {"rate": 0.0, "samples": samples}
    if len(samples) >= 2:
        s0, s1 = samples[0], samples[1]
        d["rate"] = (s0["sample"] - s1["sample"]) * 1000.0 / (s0["timestamp"] - s1["timestamp"])
        newest, oldest = samples[0], samples[-1]
        d["avg_rate"] = ((newest["sample"] - oldest["sample"]) * 1000.0
                         / (newest["timestamp"] - oldest["timestamp"]))
        d["avg"] = sum(s["sample"] for s in samples) / float(len(samples))
    return d


class Range:
    """
    A requested range (``?<prefix>_age=A&<prefix>_incr=I``, seconds),
    or None when the request has none.  :ivar age: int, seconds.  :ivar incr:
    int, seconds.
    """

    __slots__ = ("age", "incr")

    def __init__(self, age, incr):
        self.age = age
        self.incr = incr


class InvalidRange(ValueError):
    """Age or increment not positive, or more than :data:`MAX_RANGE` steps (HTTP 400)."""


def parseRange(age, incr):
    """
    A :class:`Range` from the query strings ``age`` and ``incr`` (seconds,
    str or None), as ``rabbit_mgmt_util:range/3``: None when either is missing or
    not an integer; :class:`InvalidRange` (``Invalid range parameters: age
    A, incr I``) when either is not positive or ``age // incr > 500``.
    """
    try:
        a = int(age)
        i = int(incr)
    except (TypeError, ValueError):
        return None
    if a <= 0 or i <= 0 or a // i > MAX_RANGE:
        raise InvalidRange("Invalid range parameters: age %d, incr %d" % (a, i))
    return Range(a, i)


class Sampler:
    """
    Samples every object of ``broker`` every ``intervalMs`` ms on
    ``clock`` (``LoopingCall(clock=)``); what was deleted is forgotten at
    the next sample.

    Kinds and their key tuples (``keys(kind)``): ``"queue"`` (QUEUE_KEYS),
    ``"queue-lengths"`` (LENGTH_KEYS), ``"exchange"``, ``"channel"``
    (CHANNEL_KEYS, keyed by the Session), ``"connection"`` (DATA_KEYS),
    ``"vhost"``, ``"vhost-lengths"``, ``"vhost-data"``, ``"overview"``,
    ``"overview-lengths"``, ``"churn"``.

    :ivar intervalMs: the collection interval (int, ms).
    """

    def __init__(self, broker, clock, intervalMs=DEFAULT_INTERVAL_MS):
        self.broker = broker
        self.clock = clock
        self.intervalMs = intervalMs
        self._series = {}
        self._loop = None

    def nowMs(self):
        """The clock's time in ms (int)."""
        return int(self.clock.seconds() * 1000)

    def start(self):
        """Sample now and every interval after."""
        if self._loop is None:
            self._loop = LoopingCall(self._tick)
            self._loop.clock = self.clock
            self._loop.start(self.intervalMs / 1000.0, now=True)

    def stop(self):
        """Stop sampling (idempotent)."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _tick(self):
        try:
            self.sample()
        except Exception:
            log.failure("statistics sampling failed")

    def series(self, kind, obj):
        """The :class:`Series` of ``obj`` (``kind`` as above), or None before its first sample."""
        return self._series.get((kind, obj))

    def sample(self):
        """Record one snapshot of every object now."""
        now = self.nowMs()
        horizon = now - RETENTION_S * 1000
        old = self._series
        new = {}

        def put(kind, obj, values):
            key = (kind, obj)
            s = old.get(key)
            if s is None:
                s = Series()
            s.record(now, values, horizon)
            new[key] = s

        broker = self.broker
        vhostRows = []
        lengthRows = []
        data = vhostBytes(broker)
        for vh in list(broker.vhosts.values()):
            queues = list(vh.queues.values())
            for q in queues:
                put("queue", q, queueValues(q))
                put("queue-lengths", q, lengthValues((q,)))
            for ex in list(vh.exchanges.values()):
                put("exchange", ex, exchangeValues(ex))
            for s in list(vh.sessions):
                put("channel", s, channelValues(s.stats))
            values = vhostValues(vh)
            put("vhost", vh, values)
            vhostRows.append(values)
            lengths = lengthValues(queues)
            put("vhost-lengths", vh, lengths)
            lengthRows.append(lengths)
            put("vhost-data", vh, data[vh])
        for conn in list(broker.connections):
            # IClientConnection's byte counts
            put("connection", conn, (conn.bytesIn, conn.bytesOut))
        for conn in list(getattr(getattr(broker, "streamCounters", None), "connections", ())):
            # the stream door's (otter_tx.door.stream)
            put("connection", conn, (conn.recvOct, conn.sendOct))
        put("overview", broker, sumValues(vhostRows, len(VHOST_KEYS)))
        put("overview-lengths", broker, sumValues(lengthRows, len(LENGTH_KEYS)))
        put("churn", broker, churnValues(broker.counters))
        self._series = new


def vhostBytes(broker):
    """
    ``DATA_KEYS`` values of every vhost of ``broker``: ``{vhost: (recv,
    send)}``, the bytes of its connections, open and closed, in one pass
    over the connections.
    """
    out = {vh: tuple(vh.closedBytes) for vh in broker.vhosts.values()}
    for conn in broker.connections:
        b = out.get(conn.vhost)
        if b is not None:
            out[conn.vhost] = (b[0] + conn.bytesIn, b[1] + conn.bytesOut)
    return out


def statsDict(keys, values, series, nowMs, intervalMs, rng=None, ceil=False):
    """``{key: value, key_details: {...}}`` for every key of ``keys`` (values: a tuple in that order)."""
    out = {}
    rows = None
    if rng is not None:
        grid = rangeGrid(nowMs, rng.age, rng.incr, ceil)
        rows = (grid, valuesAt(series, grid))
    else:
        last = lastTwo(series, nowMs, intervalMs)
    for i, k in enumerate(keys):
        out[k] = values[i]
        if rows is None:
            out[k + "_details"] = {"rate": rateOf(series, i, nowMs, intervalMs, last)}
        else:
            out[k + "_details"] = rangeDetails(series, i, nowMs, rng.age, rng.incr, ceil, rows)
    return out
