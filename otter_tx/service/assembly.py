"""
otter_tx as a Twisted service: add :class:`OtterService` to any service tree.

Example (see docs/embedding.md)::

    from twisted.application.service import Application
    from otter_tx.service import OtterService
    application = Application("my app")
    OtterService(amqp=["tcp:5672"], management=["tcp:15672"]).setServiceParent(application)

Start-up order: lock the data directory, open the store, rebuild durable
state (merging in what was declared through the Python API before
``startService``), then listen on every endpoint at once.  Only when every
listener is bound does the service log one ``otter_tx ready: ...`` line with
the URLs and fire :meth:`OtterService.whenReady`; if anything fails, no port
stays open and ``whenReady`` fails (under twistd, the process exits with
status 1 after one log line saying why).
"""

import gc
import os
import re
import sys

try:
    import resource
except ImportError:  # not POSIX
    resource = None

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredList, fail, maybeDeferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from otter_tx.resources.alarms import DEFAULT_DISK_FREE_LIMIT, DiskMonitor, diskFreeLimitBytes, totalMemoryBytes
from otter_tx.broker.broker import Broker
from otter_tx.broker.prestart import PreStartRecorder
from otter_tx.broker.stats import DEFAULT_INTERVAL_MS
from otter_tx.door.protocol import MAX_MESSAGE_SIZE_LIMIT, AMQPServerFactory
from otter_tx.door.tls import DEFAULT_LOGIN_FROM, DEFAULT_SAN_INDEX, DEFAULT_SAN_TYPE, CertificateLogin
from otter_tx.web.request import DEFAULT_MAX_BODY_SIZE

log = Logger()


def defaultHighWatermark(fraction=0.4):
    """
    ``fraction`` (float, 0..1) of physical memory in bytes (int); RabbitMQ's
    default memory high-watermark is 0.4 of RAM.  None when the RAM size
    cannot be found.
    """
    total = totalMemoryBytes()
    return None if total is None else int(total * fraction)


def raiseFileLimit():
    """
    Raise this process's soft ``RLIMIT_NOFILE`` (open file descriptors,
    hence connections) to its hard limit, and log both in one line.  Every
    connection holds one descriptor; under the common ``ulimit -n 1024`` the
    broker would refuse connections past about 1,000.  The hard limit
    itself can only be raised by root or the service manager (see
    docs/configuration.md, "File descriptors").

    :return: ``(soft, hard)`` in force afterwards (ints; ``resource.RLIM_INFINITY``
        for unlimited), or None where the ``resource`` module is missing.
        A refused raise (macOS caps the soft limit below an unlimited hard
        one) is logged as a warning and leaves the limit as it was.
    """
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def show(n):
        return "unlimited" if n == resource.RLIM_INFINITY else str(n)

    if soft == hard:
        log.info("file descriptor limit (RLIMIT_NOFILE): soft {soft}, hard {hard} (already at the hard limit)",
                 soft=show(soft), hard=show(hard))
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as e:
        log.warn("file descriptor limit (RLIMIT_NOFILE): soft {soft}, hard {hard}; cannot raise the soft "
                 "limit to the hard one: {reason}", soft=show(soft), hard=show(hard), reason=e)
        return soft, hard
    log.info("file descriptor limit (RLIMIT_NOFILE): soft {old} raised to {soft}, hard {hard}",
             old=show(soft), soft=show(hard), hard=show(hard))
    return hard, hard


def pypyNurseryHint(environ=None):
    """
    On PyPy, log once at start when ``PYPY_GC_NURSERY`` is not set.  PyPy
    sizes its nursery from the CPU's L2 cache (1 MB on the project's VM),
    and reads the variable only when the process starts; with 4 MB otter_tx
    received 60k persistent confirmed msg/s instead of 39k, and 944k instead
    of 669k autoack 16 B msg/s, and with 16 MB (issue 20, the message log)
    another 1.35x persistent and 1.2x autoack over 4 MB
    (docs/performance.md).  Returns the logged text, or None when the
    variable is set.
    """
    environ = os.environ if environ is None else environ
    if "PYPY_GC_NURSERY" in environ:
        return None
    text = ("PYPY_GC_NURSERY is not set: start the broker with PYPY_GC_NURSERY=16MB for about "
            "2x the throughput (docs/performance.md)")
    log.info(text)
    return text


class DataDirInUse(Exception):
    """Another broker holds the data directory's lock."""


class ListenFailed(Exception):
    """
    A listener could not bind (port in use, permission denied, ...).

    :ivar kind: ``"AMQP"``, ``"management"`` or ``"Prometheus"``.
    :ivar endpoint: the endpoint string (str), e.g. ``"tcp:5672"``.
    :ivar reason: the operating system's reason (str), e.g.
        ``"Address already in use"``.
    """

    def __init__(self, kind, endpoint, reason):
        self.kind = kind
        self.endpoint = endpoint
        self.reason = reason
        Exception.__init__(self, "cannot listen on %s endpoint %r: %s" % (kind, endpoint, reason))


class StartError(Exception):
    """The service cannot start for a reason given in its text (one line)."""


def _listenReason(e):
    """The short reason a listen failed: ``Address already in use``."""
    socketError = getattr(e, "socketError", None)
    if isinstance(socketError, OSError) and socketError.strerror:
        return "%s (errno %s)" % (socketError.strerror, socketError.errno)
    if isinstance(e, OSError) and e.strerror:
        return "%s (errno %s)" % (e.strerror, e.errno)
    return str(e) or e.__class__.__name__


def _exitProcess(status):
    """Flush stdio and end the process with ``status`` (twistd's exit path)."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(status)


class Listener(Service):
    """
    One listening endpoint of an :class:`OtterService`.  The OtterService
    makes it listen (:meth:`listen`) after recovery; it is not meant to be
    started on its own.

    :ivar kind: ``"AMQP"``, ``"management"`` or ``"Prometheus"``.
    :ivar description: the endpoint string (str).
    :ivar endpoint: the ``IStreamServerEndpoint``.
    :ivar factory: the protocol factory it serves.
    :ivar port: the ``IListeningPort`` while listening, else None.
    """

    def __init__(self, kind, description, endpoint, factory):
        self.kind = kind
        self.description = description
        self.endpoint = endpoint
        self.factory = factory
        self.port = None

    def listen(self):
        """
        Listen now: a Deferred firing with the ``IListeningPort``, or
        failing with :class:`ListenFailed`.
        """

        def listening(port):
            self.port = port
            return port

        def failed(f):
            raise ListenFailed(self.kind, self.description, _listenReason(f.value))

        return maybeDeferred(self.endpoint.listen, self.factory).addCallbacks(listening, failed)

    @property
    def _waitingForPort(self):
        # what OtterService.listeningPorts used to read (StreamServerEndpointService's name)
        return succeed(self.port)

    def stopService(self):
        """Stop listening (a Deferred; no error if not listening)."""
        Service.stopService(self)
        port, self.port = self.port, None
        if port is None:
            return succeed(None)
        return maybeDeferred(port.stopListening)


def _hostURL(scheme, address, path=""):
    """``amqp://127.0.0.1:5672`` for an IPv4/IPv6 address; wildcards shown as loopback."""
    host = getattr(address, "host", None)
    port = getattr(address, "port", None)
    if host is None or port is None:
        name = getattr(address, "name", None)
        return "%s (%s)" % (scheme, name if name is not None else address)
    note = ""
    if host in ("0.0.0.0", ""):
        host, note = "127.0.0.1", " (all interfaces)"
    elif host == "::":
        host, note = "::1", " (all interfaces)"
    if ":" in host:
        host = "[%s]" % (host,)
    return "%s://%s:%d%s%s" % (scheme, host, port, path, note)


def _isTLS(endpoint, description=None):
    """
    True when ``endpoint`` serves TLS: an ``SSL4ServerEndpoint`` (what
    ``ssl:`` and our ``ottertls:`` build, and what embedders pass) or
    Twisted's own ``tls:`` string (a wrapper around a TCP endpoint).
    """
    from twisted.internet.endpoints import SSL4ServerEndpoint

    if isinstance(endpoint, SSL4ServerEndpoint):
        return True
    return description is not None and description.split(":", 1)[0].strip().lower() == "tls"


def _describe(endpoint):
    """A foreign endpoint object as text for error messages."""
    port = getattr(endpoint, "_port", None)
    iface = getattr(endpoint, "_interface", "")
    if port is not None:
        return "%s(port=%s%s)" % (endpoint.__class__.__name__, port, ", interface=%r" % iface if iface else "")
    return repr(endpoint)


class OtterService(MultiService):
    """
    The broker with its AMQP listeners (and the management app when
    ``management`` endpoints are given).  Every keyword is optional.

    :param amqp: AMQP endpoint strings, a list of str (``["tcp:5672"]``; a
        single str is taken as a one-item list).  ``ssl:`` endpoints serve
        amqps.  Default ``("tcp:5672",)``.
    :param management: endpoint strings (list of str) for the HTTP management
        app; default none.
    :param prometheus: endpoint strings (list of str) for the Prometheus
        listener (``/metrics``, ``/metrics/per-object``,
        ``/metrics/detailed``; no authentication, as RabbitMQ's
        ``rabbitmq_prometheus`` on 15692; :mod:`otter_tx.web.metrics`);
        default none.
    :param reactor: the reactor (default: the global one, imported lazily).
    :param dataDir: directory for durable state (str); created if missing.
        Without ``dataDir`` and without ``store`` nothing is stored: the
        broker uses a ``MemoryStore`` and forgets everything when the
        process ends.
    :param store: an ``IMessageStore`` to use instead of the one ``dataDir``
        implies (``SQLiteStore(dataDir)``, or ``MemoryStore()`` without a
        dataDir).
    :param heartbeat: heartbeat proposed in ``connection.tune``, seconds
        (int, 0-65535; 0 disables).  Default 60.
    :param frameMax: largest frame, bytes (int, at least 4096).  Default 131072.
    :param channelMax: most open channels per connection (int, 0-65535; 0
        means 65535).  Default 2047.
    :param handshakeTimeout: seconds a client may take from connect to
        ``connection.open`` (float; 0 disables).  Default 10.
    :param memoryHighWatermark: bytes of process memory (RSS, int) above
        which publishers get ``connection.blocked`` ("low on memory"; cleared
        below 0.9 of it); None (default) for 40% of RAM, as RabbitMQ's
        ``vm_memory_high_watermark``.  ``otter_tx.service.tap.memoryHighWatermarkBytes("1GB")``
        turns RabbitMQ's forms (a fraction, units) into bytes.  See
        ``otter_tx.resources.alarms.MemoryMonitor``.
    :param diskFreeLimit: RabbitMQ's ``disk_free_limit``: bytes (int) of
        free space on the filesystem holding ``dataDir`` below which
        publishers get ``connection.blocked`` ("low on disk"), or
        ``("relative", factor)`` for a multiple of RAM; default 50 MB
        (50000000).  ``otter_tx.service.tap.parseDiskFreeLimit("2GB")`` reads
        RabbitMQ's forms.  Without ``dataDir`` no disk is watched.  See
        ``otter_tx.resources.alarms.DiskMonitor`` (https://www.rabbitmq.com/docs/disk-alarms).
    :param consumerTimeout: delivery acknowledgement timeout in ms (RabbitMQ
        3.10's ``consumer_timeout``, default 1800000); 0 disables.
    :param queueMemoryBudget: bytes of ready messages a queue keeps in
        memory before paging the rest to ``<dataDir>/paging`` (a temporary
        directory without ``dataDir``); default 8 MiB
        (:mod:`otter_tx.broker.paging`).
    :param defaultUser: name of the administrator created at first start
        (str, default ``guest``); once the store holds users, it is not
        re-created.
    :param defaultPass: its password (str, default ``guest``).
    :param loopbackUsers: names of the users that may log in only from
        loopback (iterable of str; default ``("guest",)``), like RabbitMQ's
        ``loopback_users``: applied by name at each login, AMQP and HTTP.
    :param policies: list of dicts ``{"vhost", "name", "pattern",
        "definition", "priority", "apply-to"}`` (as in the config file) to
        install; a policy for a vhost that exists neither now nor in the
        store makes the start fail.
    :param serverProperties: dict str -> str merged over the
        ``connection.start`` server properties, like RabbitMQ's
        ``server_properties`` (``{"product": "RabbitMQ"}``); our own product
        name stays the default.  ``capabilities`` cannot be replaced.
    :param maxMessageSize: largest message body, bytes (int, 1 to 536870912 =
        512 MiB), like RabbitMQ's ``max_message_size``; a content header
        announcing more gets 406 PRECONDITION_FAILED ``message size N is
        larger than configured max size M`` on its channel.  Default
        134217728 (128 MiB).
    :param collectStatisticsInterval: ms between two samples of the message
        rates (RabbitMQ's ``collect_statistics_interval``, a positive int,
        default 5000; :mod:`otter_tx.broker.stats`).
    :param configFiles: the configuration files read (paths, str), which
        ``/api/nodes`` reports as ``config_files``.
    :param logFiles: where the log goes (paths, ``"<stdout>"`` for standard
        output), which ``/api/nodes`` reports as ``log_files``.
    :param defaultDeliveryLimit: delivery limit of a quorum queue that has
        neither ``x-delivery-limit`` nor a ``delivery-limit`` policy (int
        >= 0), or None for none (RabbitMQ 3.10; 4.x uses 20); docs/quorum.md.
    :param sslCertLoginFrom: where a SASL ``EXTERNAL`` login takes the user
        name from the verified client certificate, RabbitMQ's
        ``ssl_cert_login_from``: ``distinguished_name`` (default),
        ``common_name`` or ``subject_alternative_name``; with the last,
        ``sslCertLoginSanType`` (``dns`` default, ``ip``, ``email``, ``uri``,
        ``other_name``) and ``sslCertLoginSanIndex`` (int from 0) pick the SAN,
        as ``ssl_cert_login_san_type`` / ``_index`` (docs/tls.md,
        :class:`otter_tx.door.tls.CertificateLogin`).
    :param managementMaxBodySize: largest management HTTP request body,
        bytes (int, at least 1), like RabbitMQ's
        ``management.http.max_body_size`` (default 20971520, 20 MiB).
        Credentials and the size are checked on the headers, before any
        body byte is stored (:mod:`otter_tx.web.request`); a larger body
        gets 400 ``Exceeded HTTP request body size limit``.
    :raise ValueError: for an endpoint string Twisted cannot parse, a bad
        ``sslCertLogin*`` value, a bad
        ``serverProperties`` entry, a ``maxMessageSize`` out of range, a
        ``managementMaxBodySize`` that is not a positive int or a
        ``collectStatisticsInterval`` that is not a positive int.

    Anything declared through ``service.broker`` before ``startService``
    (vhosts, users, permissions, policies, durable exchanges, queues and
    bindings) is merged with the recovered state at start and written to
    the store, exactly as if it had been declared afterwards.
    """

    def __init__(self, amqp=("tcp:5672",), management=(), prometheus=(), reactor=None, dataDir=None,
                 stream=(), streamAdvertisedHost=None, streamAdvertisedPort=None,
                 heartbeat=60, frameMax=131072, channelMax=2047, handshakeTimeout=10.0,
                 memoryHighWatermark=None, defaultUser="guest", defaultPass="guest",
                 loopbackUsers=("guest",), policies=(), store=None, consumerTimeout=1800000,
                 serverProperties=None, maxMessageSize=134217728, diskFreeLimit=DEFAULT_DISK_FREE_LIMIT,
                 queueMemoryBudget=None, collectStatisticsInterval=DEFAULT_INTERVAL_MS,
                 configFiles=(), logFiles=(), defaultDeliveryLimit=None,
                 sslCertLoginFrom=DEFAULT_LOGIN_FROM, sslCertLoginSanType=DEFAULT_SAN_TYPE,
                 sslCertLoginSanIndex=DEFAULT_SAN_INDEX,
                 managementMaxBodySize=DEFAULT_MAX_BODY_SIZE, cluster=None):
        MultiService.__init__(self)
        #: the cluster settings (dict: ``nodeName``, ``etcd`` (list of URLs) or
        #: ``metadata`` (a metadata store object), ``link`` (endpoint string),
        #: ``advertise`` (host), ``locator``), or None for a single node
        self.clusterSettings = dict(cluster) if cluster else None
        #: the ClusterNode once joined
        self.clusterNode = None
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        self.dataDir = dataDir
        if isinstance(amqp, str):
            amqp = [amqp]
        if isinstance(management, str):
            management = [management]
        if isinstance(prometheus, str):
            prometheus = [prometheus]
        if isinstance(stream, str):
            stream = [stream]
        if not (isinstance(maxMessageSize, int) and 0 < maxMessageSize <= MAX_MESSAGE_SIZE_LIMIT):
            raise ValueError("maxMessageSize: must be from 1 to %d bytes, got %r"
                             % (MAX_MESSAGE_SIZE_LIMIT, maxMessageSize))
        if not (isinstance(managementMaxBodySize, int) and not isinstance(managementMaxBodySize, bool)
                and managementMaxBodySize > 0):
            raise ValueError("managementMaxBodySize: must be a positive number of bytes, got %r"
                             % (managementMaxBodySize,))
        if not (isinstance(collectStatisticsInterval, int) and not isinstance(collectStatisticsInterval, bool)
                and collectStatisticsInterval > 0):
            raise ValueError("collectStatisticsInterval: must be a positive number of ms, got %r"
                             % (collectStatisticsInterval,))
        serverProperties = dict(serverProperties or {})
        for key, value in serverProperties.items():
            if not isinstance(key, str) or not key:
                raise ValueError("serverProperties: keys must be non-empty strings, got %r" % (key,))
            if key == "capabilities":
                raise ValueError("serverProperties: 'capabilities' cannot be replaced")
            if not isinstance(value, str):
                raise ValueError("serverProperties: %s must be a string, got %r" % (key, value))
        if store is None:
            if dataDir is None:
                from otter_tx.store.memory import MemoryStore

                store = MemoryStore()
            else:
                from otter_tx.store.log import LogStore

                os.makedirs(dataDir, exist_ok=True)
                store = LogStore(dataDir, reactor)
        #: the IMessageStore (SQLite under dataDir by default; memory without one)
        self.store = store
        self._ready = None  # None until started, then True or a Failure
        #: stop the process (exit status 1) if the service cannot start; twistd sets it
        self.exitOnFailure = False
        self._readyWaiters = []
        #: after ready: the URLs served (lists of str), as in the ready log line
        self.amqpURLs = []
        self.managementURLs = []
        self.prometheusURLs = []
        self._foreignPorts = {}
        if memoryHighWatermark is None:
            memoryHighWatermark = defaultHighWatermark()
        self.broker = Broker(
            reactor,
            memoryHighWatermark=memoryHighWatermark,
            defaultUser=defaultUser,
            defaultPass=defaultPass,
            loopbackUsers=loopbackUsers,
            consumerTimeout=consumerTimeout,
            queueMemoryBudget=queueMemoryBudget,
            defaultDeliveryLimit=defaultDeliveryLimit,
            pagingDirectory=os.path.join(dataDir, "paging") if dataDir is not None else None,
            streamDirectory=os.path.join(dataDir, "streams") if dataDir is not None else None,
        )
        # stream group commits are written on the reactor's thread pool (docs/streams.md)
        self.broker.streams.runInThread = lambda f: deferToThreadPool(reactor, reactor.getThreadPool(), f)
        self.broker.sampler.intervalMs = collectStatisticsInterval
        #: the disk alarm's monitor (otter_tx.resources.alarms.DiskMonitor), None without a dataDir
        self.diskMonitor = None
        if dataDir is not None:
            # what the store is about to write counts as used (SQLiteStore.pendingWriteBytes)
            self.diskMonitor = DiskMonitor(self.broker.alarms, reactor, dataDir,
                                           limit=diskFreeLimitBytes(diskFreeLimit),
                                           pending=getattr(store, "pendingWriteBytes", None))
        # publishers are blocked while the store cannot write (otter_tx.resources.alarms.Alarms.watchStore)
        self.broker.alarms.watchStore(store)
        # everything declared from here until recovery is merged and written then
        self._preStart = PreStartRecorder(self.broker)
        self._pendingPolicies = []
        for p in policies:
            if p.get("vhost", "/") in self.broker.vhosts:
                self._setPolicy(p)
            else:
                self._pendingPolicies.append(p)
        self.factory = AMQPServerFactory(
            self.broker,
            reactor,
            heartbeat=heartbeat,
            frameMax=frameMax,
            channelMax=channelMax,
            handshakeTimeout=handshakeTimeout,
            serverProperties=serverProperties,
            maxMessageSize=maxMessageSize,
            certificateLogin=CertificateLogin(sslCertLoginFrom, sslCertLoginSanType, sslCertLoginSanIndex),
        )
        self.amqpServices = []
        for desc in amqp:
            svc = Listener("AMQP", desc, self._endpoint("amqp", desc), self.factory)
            svc.setServiceParent(self)
            self.amqpServices.append(svc)
        self.managementServices = []
        if management:
            from otter_tx.web.management import ManagementApp
            from otter_tx.web.request import BodyGuardSite

            self.management = ManagementApp(self.broker, reactor)
            self.management.dataDir = dataDir
            self.management.configFiles = list(configFiles)
            self.management.logFiles = list(logFiles)
            site = BodyGuardSite(self.management.app.resource(), self.management.authenticateRequest,
                                 managementMaxBodySize)
            site.noisy = False
            for desc in management:
                svc = Listener("management", desc, self._endpoint("management", desc), site)
                svc.setServiceParent(self)
                self.managementServices.append(svc)
        self.prometheusServices = []
        if prometheus:
            self._listenPrometheus(prometheus)
        self.streamServices = []
        if stream:
            self._listenStream(stream, streamAdvertisedHost, streamAdvertisedPort)

    def _listenStream(self, endpoints, host, port):
        """The RabbitMQ stream protocol listeners (:mod:`otter_tx.door.stream`)."""
        from otter_tx.door.stream import StreamServerFactory, TrackingService, streamsBackend

        tracking = os.path.join(self.dataDir, "stream-tracking") if self.dataDir is not None else None
        self.streamFactory = StreamServerFactory(self.broker, streamsBackend(self.broker, self.reactor, tracking),
                                                 self.reactor, advertisedHost=host, advertisedPort=port,
                                                 serverProperties=self.factory.serverProperties)
        TrackingService(self.streamFactory.backend).setServiceParent(self)
        for desc in endpoints:
            svc = Listener("stream", desc, self._endpoint("stream", desc), self.streamFactory)
            svc.setServiceParent(self)
            self.streamServices.append(svc)

    def _advertiseStream(self):
        """
        In a cluster, this node's stream listener goes into its record once
        listening (the node joins before its listeners open): other nodes'
        stream metadata names it as the leader of the streams led here.
        """
        extra = self._streamAdvertised()
        if self.clusterNode is None or not extra or all(self.clusterNode.info.get(k) == v for k, v in extra.items()):
            return None
        return self.clusterNode.updateInfo(extra)

    def _streamAdvertised(self):
        """
        ``stream_host`` / ``stream_port`` for this node's cluster record: where
        other nodes' stream metadata sends clients for the streams led here
        (the advertised host and port, else the first stream listener's);
        empty without a stream listener.
        """
        factory = getattr(self, "streamFactory", None)
        if factory is None:
            return {}
        out = {}
        if factory.advertisedHost is not None:
            out["stream_host"] = factory.advertisedHost
        port = factory.advertisedPort
        if port is None:
            for svc in self.streamServices:
                p = getattr(svc, "port", None)
                if p is not None:
                    port = p.getHost().port
                    break
                # not listening yet (the node joins first): a fixed port is known already
                m = re.match(r"(?:tcp|ssl|ottertls):(?:port=)?([1-9][0-9]*)(?::|$)", svc.description or "")
                if m:
                    port = int(m.group(1))
                    break
        if port is not None:
            out["stream_port"] = port
        return out

    def _listenPrometheus(self, endpoints):
        """The Prometheus listeners (:class:`otter_tx.web.metrics.PrometheusResource`)."""
        from otter_tx.web.metrics import PrometheusResource
        from otter_tx.web.request import NoBodySite

        # no request body is ever stored: anyone who can reach this port may send one
        site = NoBodySite(PrometheusResource(self.broker, self.reactor, self.diskMonitor))
        site.noisy = False
        for desc in endpoints:
            svc = Listener("Prometheus", desc, self._endpoint("prometheus", desc), site)
            svc.setServiceParent(self)
            self.prometheusServices.append(svc)

    def _endpoint(self, option, desc):
        if not isinstance(desc, str):
            raise ValueError("%s: endpoints must be strings like 'tcp:5672', got %r" % (option, desc))
        try:
            return serverFromString(self.reactor, desc)
        except Exception as e:
            raise ValueError("%s: invalid endpoint %r: %s" % (option, desc, e)) from e

    def _setPolicy(self, p):
        self.broker.setPolicy(
            p.get("vhost", "/"), p["name"], p["pattern"], p["definition"],
            p.get("priority", 0), p.get("apply-to", "all"),
        )

    def privilegedStartService(self):
        """
        Do not listen yet: the AMQP and HTTP ports open only once the store
        is recovered (startService), so no client sees a half-loaded broker.
        (Ports below 1024 therefore need twistd to keep its privileges.)
        """
        Service.privilegedStartService(self)

    def startService(self):
        """
        Lock the data directory, open the store, rebuild durable state
        (merged with anything declared before start), then listen on every
        endpoint.  Returns a Deferred like :meth:`whenReady`.

        Failures (data directory in use, a corrupt store, a listener that
        cannot bind) are logged as one line (``otter_tx cannot start:
        ...``); no port stays open; :meth:`whenReady` fails with the error
        (:class:`DataDirInUse`, ``StoreCorruptError``, :class:`ListenFailed`
        ...).  With :attr:`exitOnFailure` (twistd) the reactor is stopped
        and the process exits with status 1.  Call :meth:`stopService` to
        close the store afterwards.
        """
        Service.startService(self)
        if self.raiseFileLimitAtStart:
            raiseFileLimit()
        self._tuneGC()
        try:
            self._lockDataDir()
        except DataDirInUse:
            d = fail()
        else:
            # paged messages of an earlier run are discarded (persistent
            # ones come back from the store)
            self.broker.paging.reset()
            d = self.store.open()

        storeFailed = []

        def openFailed(f):
            storeFailed.append(True)
            return f

        d.addErrback(openFailed)
        d.addCallback(self._recovered)
        d.addCallback(lambda _: self._joinCluster())
        d.addCallback(lambda _: self._freezeBoot())
        d.addCallback(lambda _: self._listen())
        d.addCallback(lambda _: self._advertiseStream())

        def started(_):
            self._logReady()
            self._fireReady(True)
            return self

        def failed(f):
            if f.check(DataDirInUse, ListenFailed, StartError) or _isStoreError(f):
                log.error("otter_tx cannot start: {reason}", reason=f.getErrorMessage())
            else:
                log.failure("otter_tx cannot start: {reason}", f, reason=f.getErrorMessage())
            if storeFailed:
                # nothing was opened: release at once (stopService would too)
                self._untuneGC()
                self._unlockDataDir()
            self._fireReady(f)
            if self.exitOnFailure:
                self.reactor.callWhenRunning(self._exit, 1)

        d.addCallbacks(started, failed)
        return d

    def _exit(self, status):
        """Stop the reactor; exit with ``status`` once it is down (twistd)."""
        self.reactor.addSystemEventTrigger("after", "shutdown", _exitProcess, status)
        self.reactor.stop()

    # --- recovery ------------------------------------------------------------------

    def _recovered(self, state):
        """Rebuild the broker from ``state`` merged with the pre-start declarations."""
        self.journal = self._preStart.attachJournal(self.store, state)
        for p in self._pendingPolicies:
            vhost = p.get("vhost", "/")
            if vhost not in self.broker.vhosts:
                raise StartError("policy %r is for vhost %r, which does not exist" % (p["name"], vhost))
            self._setPolicy(p)
        self.broker.startAlarmChecks()
        if self.diskMonitor is not None:
            self.diskMonitor.start()
        self.broker.startAckTimeoutChecks()
        self.broker.startStatistics()

    # --- the cluster -----------------------------------------------------------------

    def _joinCluster(self):
        """
        With cluster settings: listen for links from other nodes, then join
        (:class:`otter_tx.cluster.node.ClusterNode`): the metadata store's
        records are mirrored before any client port opens.  A metadata store
        that cannot be reached stops the start (``StartError``).
        """
        settings = self.clusterSettings
        if not settings:
            return None
        from twisted.internet.endpoints import serverFromString

        from otter_tx.cluster.link import LinkFactory
        from otter_tx.cluster.node import ClusterNode

        metadata = settings.get("metadata")
        if metadata is None:
            from otter_tx.cluster.etcdmeta import EtcdMetadata

            metadata = EtcdMetadata(settings["etcd"], self.reactor, settings.get("prefix", "/otter/"))
        self.broker.nodeName = settings["nodeName"]
        node = ClusterNode(self.broker, settings["nodeName"], metadata, self.reactor,
                           locator=settings.get("locator", "client-local"),
                           leaseTTL=settings.get("leaseTTL", 5),
                           advertise=settings.get("advertise", "127.0.0.1"))
        self.clusterNode = node
        node.batchers.append(self.factory)
        if getattr(self, "streamFactory", None) is not None:
            # publishers here of a stream on another node learn it is gone (metadata_update)
            node.remoteStreamGone.append(self.streamFactory.streamDeleted)
        endpoint = serverFromString(self.reactor, settings.get("link", "tcp:0:interface=127.0.0.1"))

        def listening(port):
            self._linkPort = port
            info = {"amqp": [], "pid": os.getpid()}
            info.update(self._streamAdvertised())
            return node.start(port.getHost().port, info)

        def failed(f):
            if f.check(StartError):
                return f
            raise StartError("cluster: cannot join through %s: %s" % (
                ", ".join(settings.get("etcd") or ["the metadata store"]), f.getErrorMessage()))

        return endpoint.listen(LinkFactory(node)).addCallback(listening).addErrback(failed)

    _linkPort = None

    # --- listening -----------------------------------------------------------------

    def _listen(self):
        """
        Listen on every endpoint at once (our listeners and any
        ``StreamServerEndpointService`` an embedder added as a child); start
        other children.  Fires when all are bound; if any fails, the others
        are closed again and the first :class:`ListenFailed` is raised.
        """
        attempts = []
        for child in self:
            if isinstance(child, Listener):
                Service.startService(child)
                attempts.append((child, child.listen()))
            elif isinstance(child, StreamServerEndpointService):
                attempts.append((child, self._listenForeign(child)))
            else:
                child.startService()
        results = DeferredList([d for _, d in attempts], consumeErrors=True)

        def done(results):
            failures = [r for ok, r in results if not ok]
            if not failures:
                return None
            stops = [maybeDeferred(child.stopService)
                     for (child, _), (ok, _) in zip(attempts, results) if ok]
            return DeferredList(stops, consumeErrors=True).addCallback(lambda _: failures[0])

        return results.addCallback(done)

    def _listenForeign(self, child):
        """
        Listen for a ``StreamServerEndpointService`` child the way it would
        itself, but report a failure instead of only logging it.
        """
        d = maybeDeferred(child.endpoint.listen, child.factory)
        kind = "AMQP" if child.factory is self.factory else "extra"

        def listening(port):
            self._foreignPorts[child] = port
            child._waitingForPort = succeed(port)
            Service.startService(child)
            return port

        def failed(f):
            child._waitingForPort = succeed(None)
            Service.startService(child)
            raise ListenFailed(kind, _describe(child.endpoint), _listenReason(f.value))

        return d.addCallbacks(listening, failed)

    def _logReady(self):
        """One line: ``otter_tx ready: AMQP amqp://127.0.0.1:5672; management http://127.0.0.1:15672/``."""
        amqp, management, prometheus, stream = [], [], [], []
        for child in self:
            if isinstance(child, Listener) and child.port is not None:
                tls = _isTLS(child.endpoint, child.description)
                if child.kind == "AMQP":
                    amqp.append(_hostURL("amqps" if tls else "amqp", child.port.getHost()))
                elif child.kind == "Prometheus":
                    prometheus.append(_hostURL("https" if tls else "http", child.port.getHost(), "/metrics"))
                elif child.kind == "stream":
                    stream.append(_hostURL("rabbitmq-stream", child.port.getHost()))
                else:
                    management.append(_hostURL("https" if tls else "http", child.port.getHost(), "/"))
            elif child in self._foreignPorts and child.factory is self.factory:
                tls = _isTLS(child.endpoint)
                amqp.append(_hostURL("amqps" if tls else "amqp", self._foreignPorts[child].getHost()))
        self.amqpURLs, self.managementURLs, self.prometheusURLs = amqp, management, prometheus
        if getattr(self, "management", None) is not None:
            self.management.listeners = self._listenerRecords()
        parts = []
        if amqp:
            parts.append("AMQP " + ", ".join(amqp))
        if management:
            parts.append("management " + ", ".join(management))
        if prometheus:
            parts.append("prometheus " + ", ".join(prometheus))
        if stream:
            parts.append("stream " + ", ".join(stream))
        self.streamURLs = stream
        log.info("otter_tx ready: {urls}", urls="; ".join(parts) or "no listeners",
                 amqpURLs=amqp, managementURLs=management, prometheusURLs=prometheus)

    def _listenerRecords(self):
        """
        The bound AMQP, management and Prometheus listeners as
        :mod:`otter_tx.web.health` records (``protocol`` ``amqp``/``amqp/ssl``/
        ``http``/``https``/``http/prometheus``/``https/prometheus``,
        ``ip_address``, ``port``, the TLS ``certfile``/``cacertfile``), for
        the health checks and the overview's ``listeners``.
        """
        from otter_tx.web.health import endpointFiles

        records = []
        for child in self:
            if isinstance(child, Listener) and child.port is not None:
                endpoint, description, port = child.endpoint, child.description, child.port
                plain = {"AMQP": "amqp", "Prometheus": "http/prometheus",
                         "stream": "stream"}.get(child.kind, "http")
            elif child in self._foreignPorts and child.factory is self.factory:
                endpoint, description, port = child.endpoint, None, self._foreignPorts[child]
                plain = "amqp"
            else:
                continue
            host = port.getHost()
            if getattr(host, "port", None) is None:
                continue
            tls = _isTLS(endpoint, description)
            certfile, cacertfile = endpointFiles(description) if tls else (None, None)
            records.append({
                "protocol": ((plain + "/ssl" if plain in ("amqp", "stream") else "https" + plain[4:]) if tls
                             else plain),
                "ip_address": host.host, "port": host.port,
                "certfile": certfile, "cacertfile": cacertfile,
            })
        return records

    #: raise the soft RLIMIT_NOFILE to the hard limit at start (see raiseFileLimit)
    raiseFileLimitAtStart = True

    #: seconds between full (generation 2) garbage collections on CPython; see _tuneGC
    gcFullInterval = 300.0

    #: seconds between looks of the MemoryReleaser (None: never give memory back)
    memoryReleaseInterval = 1.0

    def _tuneGC(self):
        """
        CPython's automatic full collections scan every live object; with a
        million queued messages that is a pause of hundreds of ms, which
        makes TTL reaping late (bench/reaping_real.py: p99 233 ms with the
        default thresholds, 4 ms with this).  Messages and queue entries form
        no reference cycles, so young-generation collections (default
        thresholds) find the cyclic garbage that matters; full collections run
        on a timer instead of on allocation counts.

        PyPy has no thresholds (no ``gc.get_threshold``) and needs none: its
        major collections are incremental, done in small steps between
        allocations, so they cause no such pause (bench/reaping_real.py
        --default-gc on PyPy: see docs/performance.md, "PyPy: memory"), and
        a timed ``gc.collect()`` would be a full, non-incremental collection:
        a pause of its own.  Nothing is changed there.

        On both, a :class:`~otter_tx.resources.process_memory.MemoryReleaser` gives memory
        back to the system after large drops (``memoryReleaseInterval``).
        """
        from twisted.internet.task import LoopingCall

        from otter_tx.resources.process_memory import MemoryReleaser

        if self.memoryReleaseInterval is not None and self._releaser is None:
            self._releaser = MemoryReleaser(self.broker, self.reactor, interval=self.memoryReleaseInterval)
            self._releaser.start()
        if not hasattr(gc, "get_threshold"):
            pypyNurseryHint()
            return
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
    _releaser = None
    _frozen = False

    def _freezeBoot(self):
        """
        On CPython with the full-collection timer (see :meth:`_tuneGC`): once
        the store is recovered, before listening, collect once and
        ``gc.freeze()`` what is alive, so the timed full collections (every
        :attr:`gcFullInterval` s) no longer scan the modules, classes, Twisted
        and otter_tx objects and recovered messages that boot left behind.
        A booted broker tracks about 68,000 objects and a full collection of
        them took 40 ms, a stall every 5 minutes that every delivery in
        flight waits for (issue 20's 20k msg/s p99 tail; docs/performance.md,
        "Latency tails").  Frozen objects are still freed by reference
        counting (messages are acked and go as before); only a reference
        cycle among them that becomes garbage later (a recovered queue that
        is deleted) stays until stop (``gc.unfreeze`` in :meth:`_untuneGC`).
        """
        if self._gcThresholds is None or not hasattr(gc, "freeze"):
            return
        gc.collect()
        gc.freeze()
        self._frozen = True

    def _untuneGC(self):
        if self._releaser is not None:
            self._releaser.stop()
            self._releaser = None
        if self._gcTimer is not None and self._gcTimer.running:
            self._gcTimer.stop()
        self._gcTimer = None
        if self._gcThresholds is not None:
            gc.set_threshold(*self._gcThresholds)
            self._gcThresholds = None
        if self._frozen:
            gc.unfreeze()
            self._frozen = False

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
        every listener is bound; or failing with the reason the start failed
        (:class:`DataDirInUse`, ``StoreCorruptError``, :class:`ListenFailed`,
        :class:`StartError`).
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
        Service.stopService(self)
        clusterStop = []
        if self.clusterNode is not None:
            clusterStop.append(self.clusterNode.stop())
            if self._linkPort is not None:
                clusterStop.append(maybeDeferred(self._linkPort.stopListening))
                self._linkPort = None
        self.broker.stop()
        if self.diskMonitor is not None:
            self.diskMonitor.stop()
        self._untuneGC()
        for conn in list(self.broker.connections):
            conn.close(320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")
        stops = [maybeDeferred(child.stopService) for child in reversed(list(self)) if child.running]
        stops.extend(clusterStop)
        d = DeferredList(stops, consumeErrors=True)

        def logFailures(results):
            for ok, result in results:
                if not ok:
                    log.failure("while stopping a listener", result)

        d.addCallback(logFailures)
        d.addBoth(lambda _: self.broker.streams.drain())
        d.addBoth(lambda _: self.broker.streams.close())
        d.addBoth(lambda _: self.store.close())

        def unlock(result):
            self.broker.freer.flush()
            self.broker.paging.reset()
            self._unlockDataDir()
            return result

        return d.addBoth(unlock)

    def listeningPorts(self, services):
        """
        Deferred list of ``IListeningPort`` for ``services`` (items of
        :attr:`amqpServices`, :attr:`managementServices`, or
        ``StreamServerEndpointService`` children added by the embedder),
        once :meth:`whenReady` fires.
        """

        def ports(_):
            out = []
            for s in services:
                if isinstance(s, Listener):
                    out.append(s.port)
                else:
                    out.append(self._foreignPorts.get(s))
            return out

        return self.whenReady().addCallback(ports)


def _isStoreError(f):
    from otter_tx.store.interface import StoreError

    return f.check(StoreError) is not None
