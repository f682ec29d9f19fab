"""
The broker: vhosts, users, the resource alarms (otter_tx.resources.alarms), and the hook through which
durable changes reach a store.

:class:`Broker` takes an injected ``IReactorTime``; it never imports the
global reactor.
"""

from twisted.logger import Logger

from otter_tx.resources.alarms import Alarms, MemoryMonitor
from otter_tx.amqp.errors import notAllowed
from otter_tx.broker.access import User
from otter_tx.broker.arguments import QUORUM, STREAM
from otter_tx.broker.counters import GlobalCounters, StreamCounters
from otter_tx.broker.stats import MessageCounts, Sampler, vhostMessageCounts
from otter_tx.broker.durability import Journal
from otter_tx.broker.lateness import ReapingLateness
from otter_tx.broker.stream import StreamRegistry
from otter_tx.broker.paging import DEFAULT_BUDGET, IncrementalFree, PagingDirectory
from otter_tx.broker.policy import Policy
from otter_tx.broker.vhost import USER_LIMIT_NAMES, VHost, enforcedLimit, validateLimit

log = Logger()


class Broker:
    """
    The whole broker state.

    :param clock: ``IReactorTime`` for every timer (TTL, expiry, heartbeats).
    :param loopbackUsers: names (iterable of str) that may log in only from
        loopback, RabbitMQ's ``loopback_users`` (default ``("guest",)``);
        kept as ``loopbackUsers`` and applied by name at every login.
    :param memoryHighWatermark: bytes of process memory (RSS) above which
        publishing connections are blocked (``connection.blocked``, "low on
        memory"); None for no limit.  See ``otter_tx.resources.alarms.MemoryMonitor``.
    :param memoryProbe: ``probe()`` -> the process's memory in bytes (int)
        for the memory alarm (default: RSS, ``otter_tx.resources.process_memory.rssBytes``).
    :param queueMemoryBudget: bytes of ready messages (bodies plus
        :data:`~otter_tx.broker.paging.ENTRY_OVERHEAD` each) a queue keeps
        in memory; the rest is paged to ``pagingDirectory``
        (:mod:`otter_tx.broker.paging`).  None for the default
        (:data:`~otter_tx.broker.paging.DEFAULT_BUDGET`).
    :param pagingDirectory: directory (str) for paged messages, or None for
        a temporary directory made on first use.
    :param streamDirectory: directory (str) for the stream queues' logs
        (docs/streams.md), or None for a temporary directory made on first use.
    :param defaultDeliveryLimit: delivery limit of quorum queues declared
        without one (int), None for none (RabbitMQ 3.10; 4.x uses 20).
    :param consumerTimeout: the delivery acknowledgement timeout in
        milliseconds (int, RabbitMQ's ``consumer_timeout``; default 1800000,
        30 min); 0 disables it.
    """

    def __init__(self, clock, memoryHighWatermark=None, defaultUser="guest",
                 defaultPass="guest", loopbackUsers=("guest",), consumerTimeout=1800000,
                 memoryProbe=None, queueMemoryBudget=None, pagingDirectory=None,
                 defaultDeliveryLimit=None, streamDirectory=None):
        self.clock = clock
        #: per-queue memory budget for ready messages, bytes (see otter_tx.broker.paging)
        self.queueMemoryBudget = DEFAULT_BUDGET if queueMemoryBudget is None else queueMemoryBudget
        #: delivery limit of quorum queues without one (int), None for none (docs/quorum.md)
        self.defaultDeliveryLimit = defaultDeliveryLimit
        #: where queues page their overflow (a PagingDirectory)
        self.paging = PagingDirectory(pagingDirectory)
        #: where stream queues keep their logs (otter_tx.broker.stream; a temporary
        #: directory when ``streamDirectory`` is None)
        self.streams = StreamRegistry(streamDirectory)
        #: frees purged and deleted messages a slice per reactor turn
        self.freer = IncrementalFree(clock)
        #: delivery acknowledgement timeout in ms (RabbitMQ 3.10 default 30 min); 0 disables
        self.consumerTimeout = consumerTimeout
        self._ackTimer = None
        #: how late expiries were reaped (otter_tx.broker.lateness), for /metrics
        self.reapingLateness = ReapingLateness()
        self.vhosts = {}
        self.users = {}
        self.permissions = {}  # (user, vhost) -> (configure, write, read) regexes
        #: bumped on every permission change (channels cache their checks)
        self.permissionsVersion = 0
        self.connections = set()
        self._storeId = 0
        #: the node's resource alarms (otter_tx.resources.alarms.Alarms)
        self.alarms = Alarms(self)
        #: totals since start for the Prometheus endpoint (otter_tx.broker.counters)
        self.counters = GlobalCounters(self.messageTotals)
        #: channel message counts of deleted vhosts (they stay in the broker's totals)
        self.deletedVHostStats = MessageCounts()
        #: of the channels' counts, those of quorum queues' and streams' deliveries, gets and
        #: acks (``"quorum"``, ``"stream"`` -> MessageCounts; a classic queue's are the rest):
        #: RabbitMQ's ``queue_type`` label of the ``rabbitmq_global_*`` counters
        self.typeCounts = {QUORUM: MessageCounts(), STREAM: MessageCounts()}
        #: the stream protocol's totals (``protocol="stream"``; otter_tx.door.stream counts them)
        self.streamCounters = StreamCounters()
        #: dead-lettered messages since start: (queue type, strategy, reason) -> int, the strategy
        #: ``disabled`` (no DLX), ``at_most_once`` or ``at_least_once``, the reason ``expired``,
        #: ``rejected``, ``maxlen``, ``delivery_limit`` or ``confirmed`` (otter_tx.broker.deadletter)
        self.deadLetterCounts = {}
        #: message rates: samples every object's counters (started by the service,
        #: :meth:`startStatistics`; ``sampler.intervalMs`` is the setting)
        self.sampler = Sampler(self, clock)
        #: the memory alarm's monitor, None without a watermark
        self.memoryMonitor = None
        self._memoryProbe = memoryProbe
        self.memoryHighWatermark = memoryHighWatermark
        self.listeners = []  # callables(kind, vhost, obj, deleted)
        #: requests other cluster nodes may make of this one, registered by upper layers
        #: (the management app's cluster-wide lists): op -> callable(args); copied into
        #: the cluster node's ``handlers`` when it is set (:attr:`cluster`)
        self.clusterHandlers = {}
        self._cluster = None
        #: True while a cluster link to another node is backed up (RabbitMQ's credit
        #: flow): publishing AMQP connections are not read (``IClientConnection.flowChanged``)
        self.linkFlow = False
        #: global runtime parameters, name -> JSON value (``/api/global-parameters``;
        #: ``cluster_name`` names the cluster in the overview); stored durably
        self.globalParameters = {}
        #: user name -> {limit name: int} (``/api/user-limits``), stored with the user
        self.userLimits = {}
        #: the durability Journal once the store is open (:meth:`attachJournal`), else None
        self.journal = None
        self.addVHost("/")
        #: names that may log in only from loopback (RabbitMQ's ``loopback_users``),
        #: applied by name at login (:func:`otter_tx.broker.access.login`)
        self.loopbackUsers = frozenset(loopbackUsers)
        self.addUser(defaultUser, defaultPass, tags=["administrator"])
        self.setPermissions(defaultUser, "/")

    # --- vhosts / users ----------------------------------------------------


    @property
    def cluster(self):
        """The cluster node (otter_tx.cluster.node.ClusterNode) when this broker is one node of a cluster, else None."""
        return self._cluster

    @cluster.setter
    def cluster(self, node):
        self._cluster = node
        handlers = getattr(node, "handlers", None)
        if handlers is not None:
            handlers.update(self.clusterHandlers)

    def addClusterHandler(self, op, handler):
        """Answer request ``op`` of other cluster nodes with ``handler(args)`` (now, or once in a cluster)."""
        self.clusterHandlers[op] = handler
        handlers = getattr(self._cluster, "handlers", None)
        if handlers is not None:
            handlers[op] = handler

    def addVHost(self, name):
        """Create vhost ``name`` (no error if it exists); return it."""
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(self, name)
            self.entityChanged("vhost", vh, vh)
        return vh

    def deleteVHost(self, name):
        """
        Delete vhost ``name`` and everything in it; its connections get
        connection.close 320 ``CONNECTION_FORCED - vhost 'V' is deleted``.
        Returns the list of connections closed (empty if no such vhost).
        """
        vh = self.vhosts.pop(name, None)
        closed = []
        if vh is not None:
            for q in list(vh.queues.values()):
                vh.deleteQueue(q)
            # the exchanges go too: a delayed exchange's held messages are
            # dropped (docs/delayed.md) and durable ones leave the store
            for xname in [x for x in vh.exchanges if x and not x.startswith("amq.")]:
                vh.deleteExchange(xname)
            for conn in list(self.connections):
                if conn.vhost is vh:
                    conn.close(320, "CONNECTION_FORCED - vhost '%s' is deleted" % name)
                    closed.append(conn)
            for key in [k for k in self.permissions if k[1] == name]:
                self.clearPermissions(*key)
            self.entityChanged("vhost", vh, vh, deleted=True)
            self.deletedVHostStats.add(vhostMessageCounts(vh))
        return closed

    def messageTotals(self):
        """Every channel's message counts since start, summed (a new MessageCounts)."""
        total = MessageCounts.total(vhostMessageCounts(vh) for vh in self.vhosts.values())
        total.add(self.deletedVHostStats)
        return total

    def setGlobalParameter(self, name, value):
        """Set global parameter ``name`` to the JSON ``value``; True when it is new."""
        new = name not in self.globalParameters
        self.globalParameters[name] = value
        self.entityChanged("global_parameter", None, name)
        return new

    def clearGlobalParameter(self, name):
        """Delete global parameter ``name``; False when there was none."""
        if name not in self.globalParameters:
            return False
        del self.globalParameters[name]
        self.entityChanged("global_parameter", None, name, deleted=True)
        return True

    def setUserLimit(self, name, limit, value):
        """
        Set user limit ``limit`` (``max-connections``, ``max-channels``) of
        existing user ``name``; :class:`~otter_tx.broker.vhost.LimitError`
        with RabbitMQ's text for a bad name or value.
        """
        validateLimit(limit, value, USER_LIMIT_NAMES, "user-limits")
        self.userLimits[name] = dict(self.userLimits.get(name, {}), **{limit: value})
        self.entityChanged("user", None, self.users[name])

    def clearUserLimit(self, name, limit):
        """Remove user limit ``limit`` of user ``name`` (no error if unset)."""
        limits = self.userLimits.get(name)
        if limits is not None and limit in limits:
            del limits[limit]
            if not limits:
                del self.userLimits[name]
            if name in self.users:
                self.entityChanged("user", None, self.users[name])

    def userLimit(self, name, limit):
        """The enforced user limit (an int >= 0), or None (unset or negative)."""
        return enforcedLimit(self.userLimits.get(name), limit)

    def _userConnections(self, name):
        """The open (past connection.open) connections of user ``name``, a list."""
        return [c for c in self.connections
                if c.vhost is not None and c.user is not None and c.user.name == name]

    def checkUserConnectionLimit(self, name):
        """
        At connection.open: 530 NOT_ALLOWED ``connection refused for user
        'U': user connection limit (N) is reached`` when user ``name``'s
        open connections reach its ``max-connections`` (RabbitMQ 3.10's text).
        """
        value = self.userLimit(name, "max-connections")
        if value is not None and len(self._userConnections(name)) >= value:
            raise notAllowed("connection refused for user '%s': user connection limit (%d) is reached"
                             % (name, value))

    def checkUserChannelLimit(self, name):
        """
        At channel.open: 530 NOT_ALLOWED ``number of channels opened for user
        'U' has reached the maximum allowed user limit of (N)`` when user
        ``name``'s open channels reach its ``max-channels`` (RabbitMQ 3.10's text).
        """
        value = self.userLimit(name, "max-channels")
        if value is not None and sum(len(c.channels) for c in self._userConnections(name)) >= value:
            raise notAllowed("number of channels opened for user '%s' has reached the maximum allowed "
                             "user limit of (%d)" % (name, value))

    def addUser(self, name, password, tags=()):
        """Create or replace a user; return it."""
        u = self.users[name] = User(name, password, tags)
        self.entityChanged("user", None, u)
        return u

    def deleteUser(self, name):
        """Delete user ``name`` and its permissions (no error if missing)."""
        u = self.users.pop(name, None)
        self.userLimits.pop(name, None)
        for key in [k for k in self.permissions if k[0] == name]:
            self.clearPermissions(*key)
        if u is not None:
            self.entityChanged("user", None, u, deleted=True)

    def setUserTags(self, name, tags):
        """Replace the tags (list of str) of user ``name``."""
        u = self.users[name]
        u.tags = list(tags)
        self.entityChanged("user", None, u)

    def putUser(self, user):
        """Install a prepared :class:`User` (for example with an imported password hash)."""
        self.users[user.name] = user
        self.entityChanged("user", None, user)

    def clearPermissions(self, user, vhost):
        """Remove ``user``'s permissions on ``vhost`` (no error if none)."""
        if self.permissions.pop((user, vhost), None) is not None:
            self.permissionsVersion += 1
            self.entityChanged("permission", None, (user, vhost), deleted=True)

    def setPermissions(self, user, vhost, configure=".*", write=".*", read=".*"):
        """
        Grant ``user`` access to ``vhost`` with RabbitMQ's configure / write /
        read regexes (an empty string grants nothing); channels enforce them
        per resource (https://www.rabbitmq.com/docs/access-control).
        """
        self.permissions[(user, vhost)] = (configure, write, read)
        self.permissionsVersion += 1
        self.entityChanged("permission", None, (user, vhost))

    def canAccess(self, user, vhost):
        """True when ``user`` has permissions on ``vhost``."""
        return (user.name, vhost) in self.permissions

    def setPolicy(self, vhost, name, pattern, definition, priority=0, applyTo="all"):
        """
        Python API for policies: create or replace policy ``name`` in
        ``vhost``.  Raises :class:`~otter_tx.broker.policy.PolicyError`.
        """
        vh = self.vhosts[vhost]
        p = Policy(name, pattern, definition, priority, applyTo, vhost)
        vh.setPolicy(p)
        return p

    def clearPolicy(self, vhost, name):
        """Remove policy ``name`` from ``vhost``."""
        self.vhosts[vhost].clearPolicy(name)

    # --- messages ------------------------------------------------------------

    def nextMessageId(self, message):
        """Assign a broker-wide id to ``message``."""
        self._storeId += 1
        message.storeId = self._storeId

    def reserveMessageIds(self, above):
        """
        Make every future message id larger than ``above`` and than any id
        used before a restart (ids start from the clock in microseconds).
        """
        self._storeId = max(self._storeId, above, int(self.clock.seconds() * 1e6))

    def queuedBytes(self):
        """Body bytes of ready messages held in memory (paged ones excluded)."""
        return sum(q.readyBytes - q.pagedBytes for vh in self.vhosts.values() for q in vh.queues.values())

    # --- resource alarms --------------------------------------------------

    def messageBytesEstimate(self):
        """
        Estimated bytes held in memory by queued and unacknowledged messages
        (int): ready body bytes plus ``otter_tx.resources.process_memory.MESSAGE_BYTES`` per
        ready or unacknowledged message, over every queue; paged messages
        (``Queue.pagedCount``/``pagedBytes``) are on disk and not counted.
        """
        from otter_tx.resources.process_memory import MESSAGE_BYTES

        total = 0
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                total += (q.readyBytes - q.pagedBytes
                          + (q.readyCount - q.pagedCount + q.unackedCount) * MESSAGE_BYTES)
        return total

    @property
    def memoryHighWatermark(self):
        """The memory high-watermark in bytes (int), None for no limit."""
        return None if self.memoryMonitor is None else self.memoryMonitor.watermark

    @memoryHighWatermark.setter
    def memoryHighWatermark(self, watermark):
        if watermark is None:
            if self.memoryMonitor is not None:
                self.memoryMonitor.stop()
                self.memoryMonitor = None
            self.alarms.monitors.pop("memory", None)
            self.alarms.clear("memory")
        elif self.memoryMonitor is None:
            self.memoryMonitor = MemoryMonitor(self.alarms, self.clock, watermark, probe=self._memoryProbe,
                                               estimate=self.messageBytesEstimate)
        else:
            self.memoryMonitor.setWatermark(watermark)

    @property
    def alarmed(self):
        """True while any resource alarm (memory, disk, store) is in effect."""
        return bool(self.alarms.active)

    def received(self, nbytes):
        """
        ``nbytes`` (int) arrived from a client, through either door: the
        AMQP door's frames, an HTTP API publish's body.  The one rule for
        both: the memory alarm reads RSS every so many received bytes
        (:meth:`MemoryMonitor.received
        <otter_tx.resources.alarms.MemoryMonitor.received>`: only raises it;
        clearing waits for its timer).  What an alarm then blocks is
        RabbitMQ's rule too: AMQP connections that publish
        (``IClientConnection.alarmChanged``), not a publish through the HTTP
        API, which RabbitMQ 3.10 accepts and routes during a memory or disk
        alarm (checked on the peer: 200 ``{"routed": true}``).
        """
        meter = self.memoryMonitor
        if meter is not None:
            meter.received(nbytes)

    def startAlarmChecks(self):
        """Check the memory watermark periodically on the clock (no-op without one)."""
        if self.memoryMonitor is not None:
            self.memoryMonitor.start()

    def startAckTimeoutChecks(self):
        """
        Check every channel's oldest unacknowledged delivery against
        :attr:`consumerTimeout` (every min(60 s, timeout / 2)); an overdue
        channel is closed with 406 as RabbitMQ does
        (https://www.rabbitmq.com/docs/consumers#acknowledgement-timeout).
        """
        from twisted.internet.task import LoopingCall

        if not self.consumerTimeout or self._ackTimer is not None:
            return
        self._ackTimer = LoopingCall(self.checkAckTimeouts)
        self._ackTimer.clock = self.clock
        self._ackTimer.start(min(60.0, self.consumerTimeout / 2000.0), now=False)

    def startStatistics(self):
        """Start sampling message rates every ``sampler.intervalMs`` ms (:mod:`otter_tx.broker.stats`)."""
        self.sampler.start()

    def checkAckTimeouts(self):
        """
        Ask every connection (:class:`~otter_tx.broker.interfaces.IClientConnection`)
        to close its channels whose oldest unacked delivery is older than
        :attr:`consumerTimeout`.
        """
        if not self.consumerTimeout:
            return
        limit = self.clock.seconds() - self.consumerTimeout / 1000.0
        for conn in list(self.connections):
            conn.checkAckTimeout(limit, self.consumerTimeout)

    def stop(self):
        """
        Stop every timer (memory checks, ack timeouts, message expiry, queue
        expiry): the broker is shutting down and its state must not change.
        """
        if self.memoryMonitor is not None:
            self.memoryMonitor.stop()
        self.sampler.stop()
        if self._ackTimer is not None and self._ackTimer.running:
            self._ackTimer.stop()
        self._ackTimer = None
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                q.stopTimers()
            for ex in vh.exchanges.values():
                if ex.delayed:
                    ex.stopTimers()

    # --- durability hook ---------------------------------------------------

    def attachJournal(self, store, state):
        """
        Make this broker durable through ``store`` (an opened
        :class:`~otter_tx.store.interface.IMessageStore`), the one place
        where a :class:`~otter_tx.broker.durability.Journal` is attached
        (``OtterService`` at start, ``otter_tx.testing.journaledBroker``):
        rebuild the broker from ``state`` (the ``RecoveredState`` the store's
        ``open()`` gave), set :attr:`journal`, attach it to every durable
        queue and durable x-delayed-message exchange already present (ones
        declared later get it from their vhost), listen for entity changes,
        and on a first boot (no stored vhost) write the configured vhosts,
        users, permissions and policies.  Returns the Journal.
        """
        journal = Journal(self, store)
        self.journal = journal
        firstBoot = journal.recover(state)
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.durable:
                    q.journal = journal
            for ex in vh.exchanges.values():
                if ex.delayed and ex.durable:
                    ex.journal = journal
        self.listeners.append(journal.entityChanged)
        if firstBoot:
            journal.writeAll()
        return journal

    def sync(self, links=None):
        """
        A Deferred that fires once everything taken so far is safe: the
        journal's ``sync()`` and, in a cluster, the answers of the other
        nodes for what was forwarded to them (``links``: the links some
        publishes went over, which must all answer; None for every link that
        forwarded since its last barrier).  A failure of either fails it, as
        :meth:`Journal.sync <otter_tx.broker.durability.Journal.sync>` does
        (:class:`~otter_tx.cluster.remote.LinkLost` for a lost link).
        """
        d = self.journal.sync()
        if self.cluster is None:
            return d
        ds = self.cluster.syncs(links)
        if not ds:
            return d
        from twisted.internet.defer import gatherResults

        return gatherResults([d] + ds, consumeErrors=True).addErrback(lambda f: f.value.subFailure)

    def entityChanged(self, kind, vhost, obj, deleted=False):
        """
        Tell listeners (the store) that an entity changed.  ``kind`` is
        ``vhost``, ``user``, ``permission``, ``policy``, ``exchange``,
        ``queue`` or ``binding``.
        """
        for listener in self.listeners:
            listener(kind, vhost, obj, deleted)
