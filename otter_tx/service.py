"""
otter_tx as a Twisted service: add :class:`OtterService` to any service tree.

Example (see docs/embedding.md)::

    from twisted.application.service import Application
    from otter_tx.service import OtterService
    application = Application("my app")
    OtterService(amqp=["tcp:5672"], management=["tcp:15672"]).setServiceParent(application)
"""

import gc
import os

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger

from otter_tx.broker.broker import Broker
from otter_tx.protocol import AMQPServerFactory

log = Logger()


def defaultHighWatermark(fraction=0.4):
    """
    RabbitMQ's default memory high-watermark: 40% of physical memory, in
    bytes (applied here to queued message bodies).
    """
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * fraction)
    except (ValueError, OSError, AttributeError):
        return None


class DataDirInUse(Exception):
    """Another broker holds the data directory's lock."""


class OtterService(MultiService):
    """
    The broker with its AMQP listeners (and the management app when
    ``management`` endpoints are given).

    :param amqp: list of endpoint strings (``["tcp:5672"]``).
    :param management: list of endpoint strings for the HTTP management app.
    :param reactor: the reactor (default: the global one, imported lazily).
    :param dataDir: directory for durable state (str).
    :param heartbeat: seconds.  :param frameMax: bytes.  :param channelMax: int.
    :param handshakeTimeout: seconds.
    :param memoryHighWatermark: bytes of queued bodies before publishers are
        blocked (None: 40% of RAM).
    :param consumerTimeout: delivery acknowledgement timeout in ms (RabbitMQ
        3.10's ``consumer_timeout``, default 1800000); 0 disables.
    :param policies: list of dicts ``{"vhost", "name", "pattern",
        "definition", "priority", "apply-to"}`` to install at start.
    """

    def __init__(self, amqp=("tcp:5672",), management=(), reactor=None, dataDir=None,
                 heartbeat=60, frameMax=131072, channelMax=2047, handshakeTimeout=10.0,
                 memoryHighWatermark=None, defaultUser="guest", defaultPass="guest",
                 loopbackUsers=("guest",), policies=(), store=None, consumerTimeout=1800000):
        MultiService.__init__(self)
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        self.dataDir = dataDir
        if store is None:
            if dataDir is None:
                from otter_tx.store.memory import MemoryStore

                store = MemoryStore()
            else:
                from otter_tx.store.sqlite import SQLiteStore

                os.makedirs(dataDir, exist_ok=True)
                store = SQLiteStore(dataDir, reactor)
        #: the IMessageStore (SQLite under dataDir by default; memory without one)
        self.store = store
        self._ready = None  # None until started, then True or a Failure
        #: stop the process (exit status 1) if the store cannot open; twistd sets it
        self.exitOnFailure = False
        self._readyWaiters = []
        if memoryHighWatermark is None:
            memoryHighWatermark = defaultHighWatermark()
        self.broker = Broker(
            reactor,
            memoryHighWatermark=memoryHighWatermark,
            defaultUser=defaultUser,
            defaultPass=defaultPass,
            loopbackUsers=loopbackUsers,
            consumerTimeout=consumerTimeout,
        )
        for p in policies:
            self.broker.setPolicy(
                p.get("vhost", "/"), p["name"], p["pattern"], p["definition"],
                p.get("priority", 0), p.get("apply-to", "all"),
            )
        self.factory = AMQPServerFactory(
            self.broker,
            reactor,
            heartbeat=heartbeat,
            frameMax=frameMax,
            channelMax=channelMax,
            handshakeTimeout=handshakeTimeout,
        )
        self.amqpServices = []
        for desc in amqp:
            svc = StreamServerEndpointService(serverFromString(reactor, desc), self.factory)
            svc.setServiceParent(self)
            self.amqpServices.append(svc)
        self.managementServices = []
        if management:
            from twisted.web.server import Site

            from otter_tx.web.management import ManagementApp

            self.management = ManagementApp(self.broker, reactor)
            site = Site(self.management.app.resource())
            site.noisy = False
            for desc in management:
                svc = StreamServerEndpointService(serverFromString(reactor, desc), site)
                svc.setServiceParent(self)
                self.managementServices.append(svc)

    def privilegedStartService(self):
        """
        Do not listen yet: the AMQP and HTTP ports open only once the store
        is recovered (startService), so no client sees a half-loaded broker.
        (Ports below 1024 therefore need twistd to keep its privileges.)
        """
        Service.privilegedStartService(self)

    def startService(self):
        """
        Open the store, rebuild durable state, then start listening.  A
        store that cannot be opened (corrupt file) is logged with its path
        and what to do, and the reactor is stopped: no partial start.
        """
        from otter_tx.broker.durability import Journal

        Service.startService(self)
        self._tuneGC()
        try:
            self._lockDataDir()
        except DataDirInUse:
            d = fail()
        else:
            d = self.store.open()

        def recovered(state):
            journal = Journal(self.broker, self.store)
            firstBoot = journal.recover(state)
            self.journal = journal
            self.broker.journal = journal
            self.broker.listeners.append(journal.entityChanged)
            if firstBoot:
                journal.writeAll()
            self.broker.startAlarmChecks()
            self.broker.startAckTimeoutChecks()
            for svc in self:
                svc.startService()
            return self

        def failed(f):
            log.failure("cannot start: {msg}", f, msg=f.getErrorMessage())
            self._untuneGC()
            self._unlockDataDir()
            self._fireReady(f)
            if self.exitOnFailure and self.reactor.running:
                # twistd: stop, and exit non-zero once the reactor is down
                self.reactor.addSystemEventTrigger("after", "shutdown", os._exit, 1)
                self.reactor.stop()

        d.addCallback(recovered)
        d.addCallbacks(lambda _: self._fireReady(True), failed)
        return d

    #: seconds between full (generation 2) garbage collections; see _tuneGC
    gcFullInterval = 300.0

    def _tuneGC(self):
        """
        CPython's automatic full collections scan every live object; with a
        million queued messages that is a pause of hundreds of ms, which
        makes TTL reaping late (bench/reaping_real.py: p99 233 ms with the
        default thresholds, 4 ms with this).  Messages and queue entries form
        no reference cycles, so young-generation collections (default
        thresholds) find the cyclic garbage that matters; full collections run
        on a timer instead of on allocation counts.
        """
        from twisted.internet.task import LoopingCall

        if self.gcFullInterval is None:
            return
        self._gcThresholds = gc.get_threshold()
        gen0, gen1, _ = self._gcThresholds
        gc.set_threshold(gen0, gen1, 1000000)
        self._gcTimer = LoopingCall(gc.collect)
        self._gcTimer.clock = self.reactor
        self._gcTimer.start(self.gcFullInterval, now=False)

    _gcTimer = None
    _gcThresholds = None

    def _untuneGC(self):
        if self._gcTimer is not None and self._gcTimer.running:
            self._gcTimer.stop()
        self._gcTimer = None
        if self._gcThresholds is not None:
            gc.set_threshold(*self._gcThresholds)
            self._gcThresholds = None

    _lockFile = None

    def _lockDataDir(self):
        """
        Take an exclusive lock on ``<dataDir>/.lock`` so two brokers never
        share one store.  Raises :class:`DataDirInUse`.  The lock dies with
        the process, so a SIGKILLed broker does not leave it behind.
        """
        if self.dataDir is None:
            return
        import fcntl

        path = os.path.join(self.dataDir, ".lock")
        f = open(path, "a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise DataDirInUse(
                "data directory %s is in use by another otter_tx broker (lock on %s); "
                "stop that broker or choose another --data-dir" % (self.dataDir, path)
            )
        self._lockFile = f

    def _unlockDataDir(self):
        if self._lockFile is not None:
            self._lockFile.close()
            self._lockFile = None

    def _fireReady(self, result):
        self._ready = result
        waiters, self._readyWaiters = self._readyWaiters, []
        for w in waiters:
            if result is True:
                w.callback(self)
            else:
                w.errback(result)

    def whenReady(self):
        """
        A Deferred firing with this service once the store is recovered and
        the listeners are starting (or failing if the store cannot open).
        """
        if self._ready is True:
            return succeed(self)
        if self._ready is not None:
            return fail(self._ready)
        d = Deferred()
        self._readyWaiters.append(d)
        return d

    def stopService(self):
        """
        Stop listening, close client connections, then finish pending store
        writes (the Deferred fires once everything is fsync'd).
        """
        self.broker.stop()
        self._untuneGC()
        for conn in list(self.broker.connections):
            conn.forceClose(320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")
        d = MultiService.stopService(self)
        d.addBoth(lambda _: self.store.close())

        def unlock(result):
            self._unlockDataDir()
            return result

        return d.addBoth(unlock)

    def listeningPorts(self, services):
        """Deferred list of IListeningPort for ``services`` (after start)."""
        from twisted.internet.defer import gatherResults

        return self.whenReady().addCallback(
            lambda _: gatherResults([s._waitingForPort for s in services])
        )
