"""
Tests for otter_tx.service on a MemoryReactorClock: OtterService's start
(listen failures, the ready line, exit on failure), server properties,
declarations made before ``startService``, alarm wiring.  Option parsing is
tested in test_tap; the service on the real reactor (the embedding example,
a real port in use) in ``otter_tx.test.e2e.test_embedding``.
"""

import errno
import os

from twisted.internet.address import IPv4Address
from twisted.internet.error import CannotListenError
from twisted.internet.testing import MemoryReactorClock, _FakePort
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SkipTest, SynchronousTestCase
from zope.interface import implementer

from otter_tx.service import assembly as service_module
from otter_tx.service.assembly import ListenFailed, OtterService, StartError
from otter_tx.store.interface import IMessageStore
from otter_tx.store.memory import MemoryStore
from otter_tx.testing import FakeClient

class _Reactor(MemoryReactorClock):
    """
    A MemoryReactorClock whose listenTCP gives ``tcp:0`` a port number and
    refuses the ports in ``refuse`` (port -> errno) like the kernel would.
    """

    def __init__(self, refuse=None):
        MemoryReactorClock.__init__(self)
        # Twisted 25.5 (the newest for Python 3.9, hence PyPy) starts a
        # MemoryReactor with hasRun/hasStopped already True
        self.hasRun = self.hasStopped = self.hasCrashed = False
        self.refuse = refuse or {}
        self.stopped = []
        self._next = 40000

    def callWhenRunning(self, callable, *args, **kw):
        # as a real reactor, and Twisted 26's MemoryReactor: at once once running
        # (Twisted 25.5's only queues the call)
        if self.running or self.hasRun:
            callable(*args, **kw)
        else:
            MemoryReactorClock.callWhenRunning(self, callable, *args, **kw)

    def listenTCP(self, port, factory, backlog=50, interface=""):
        if port in self.refuse:
            code = self.refuse[port]
            raise CannotListenError(interface, port, OSError(code, os.strerror(code)))
        if port == 0:
            self._next += 1
            port = self._next
        self.tcpServers.append((port, factory, backlog, interface))
        reactor = self

        class Port(_FakePort):
            def stopListening(self):
                reactor.stopped.append(self.getHost().port)

        return Port(IPv4Address("TCP", interface or "0.0.0.0", port))

    def listenSSL(self, port, factory, contextFactory, backlog=50, interface=""):
        return self.listenTCP(port, factory, backlog, interface)


class _Logged:
    """Collects log events of otter_tx.service while a test runs."""

    def captureLog(self):
        events = []

        def observer(event):
            if event.get("log_namespace") == "otter_tx.service.assembly":
                events.append(event)

        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        return events

    @staticmethod
    def text(event):
        from twisted.logger import formatEvent

        return formatEvent(event)


def _service(reactor, **kw):
    kw.setdefault("store", MemoryStore())
    kw.setdefault("amqp", [])
    svc = OtterService(reactor=reactor, **kw)
    svc.gcFullInterval = None
    svc.raiseFileLimitAtStart = False
    return svc


class _FakeRLimit:
    """``getrlimit``/``setrlimit`` for RLIMIT_NOFILE without touching the process."""

    def __init__(self, soft, hard, refuse=None):
        self.limit = (soft, hard)
        self.refuse = refuse
        self.calls = []

    def getrlimit(self, which):
        assert which == service_module.resource.RLIMIT_NOFILE
        return self.limit

    def setrlimit(self, which, limit):
        assert which == service_module.resource.RLIMIT_NOFILE
        self.calls.append(limit)
        if self.refuse is not None:
            raise self.refuse
        self.limit = limit


class FileLimitTests(_Logged, SynchronousTestCase):
    """The soft RLIMIT_NOFILE is raised to the hard limit at start, and both are logged in one line."""

    def fake(self, soft, hard, refuse=None):
        fake = _FakeRLimit(soft, hard, refuse)
        self.patch(service_module.resource, "getrlimit", fake.getrlimit)
        self.patch(service_module.resource, "setrlimit", fake.setrlimit)
        return fake

    def lines(self, events):
        return [self.text(e) for e in events if "RLIMIT_NOFILE" in self.text(e)]

    def test_raisedAtStart(self):
        """startService raises soft 1024 to hard 524288 and logs one line naming both."""
        fake = self.fake(1024, 524288)
        events = self.captureLog()
        svc = _service(_Reactor())
        svc.raiseFileLimitAtStart = True
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertEqual(fake.calls, [(524288, 524288)])
        self.assertEqual(self.lines(events), [
            "file descriptor limit (RLIMIT_NOFILE): soft 1024 raised to 524288, hard 524288"])
        svc.stopService()

    def test_alreadyAtHard(self):
        """When soft equals hard nothing is set, and the line says so."""
        fake = self.fake(65536, 65536)
        events = self.captureLog()
        self.assertEqual(service_module.raiseFileLimit(), (65536, 65536))
        self.assertEqual(fake.calls, [])
        self.assertEqual(self.lines(events), [
            "file descriptor limit (RLIMIT_NOFILE): soft 65536, hard 65536 (already at the hard limit)"])

    def test_unlimitedHard(self):
        """An unlimited hard limit is asked for and shown as 'unlimited'."""
        inf = service_module.resource.RLIM_INFINITY
        fake = self.fake(1024, inf)
        events = self.captureLog()
        self.assertEqual(service_module.raiseFileLimit(), (inf, inf))
        self.assertEqual(fake.calls, [(inf, inf)])
        self.assertEqual(self.lines(events), [
            "file descriptor limit (RLIMIT_NOFILE): soft 1024 raised to unlimited, hard unlimited"])

    def test_refused(self):
        """A refused raise is one warning with both values and the reason; the start goes on."""
        self.fake(256, service_module.resource.RLIM_INFINITY, refuse=ValueError("not allowed"))
        events = self.captureLog()
        svc = _service(_Reactor())
        svc.raiseFileLimitAtStart = True
        svc.startService()
        self.successResultOf(svc.whenReady())
        [line] = [e for e in events if "RLIMIT_NOFILE" in self.text(e)]
        self.assertEqual(line["log_level"].name, "warn")
        self.assertEqual(self.text(line), "file descriptor limit (RLIMIT_NOFILE): soft 256, hard unlimited; "
                         "cannot raise the soft limit to the hard one: not allowed")
        svc.stopService()

    def test_embedderMayOptOut(self):
        """With raiseFileLimitAtStart false the limit is left alone."""
        fake = self.fake(1024, 4096)
        svc = _service(_Reactor())
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertEqual(fake.calls, [])
        svc.stopService()


class _GCWithoutThresholds:
    """PyPy's ``gc`` module as far as _tuneGC can tell: collect, but no thresholds."""

    def __init__(self):
        self.collected = 0

    def collect(self, *generation):
        self.collected += 1
        return 0


class GCTests(SynchronousTestCase):
    """The full-collection timer on CPython, nothing on PyPy, and the memory releaser on both."""

    def test_cpythonThresholds(self):
        """With gc thresholds, full collections move to a timer and the thresholds come back at stop."""
        import gc

        if not hasattr(gc, "get_threshold"):
            raise SkipTest("this runtime's gc has no thresholds (PyPy); test_noThresholds covers it")
        before = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *before)
        svc = _service(_Reactor())
        svc.gcFullInterval = 300.0
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertEqual(gc.get_threshold(), before[:2] + (1000000,))
        self.assertTrue(svc._gcTimer.running)
        svc.stopService()
        self.assertEqual(gc.get_threshold(), before)
        self.assertIsNone(svc._gcTimer)

    def test_freezeAfterBoot(self):
        """
        With the full-collection timer (CPython), boot's objects are collected
        once and frozen after recovery, before any port listens, and unfrozen
        at stop; without the timer nothing is frozen.
        """
        calls = []

        class FakeGC(_GCWithoutThresholds):
            def get_threshold(self):
                return (700, 10, 10)

            def set_threshold(self, *t):
                calls.append(("set_threshold",) + t)

            def collect(self, *generation):
                calls.append(("collect",))
                return 0

            def freeze(self):
                calls.append(("freeze", len(r.tcpServers)))

            def unfreeze(self):
                calls.append(("unfreeze",))

        self.patch(service_module, "gc", FakeGC())
        r = _Reactor()
        svc = _service(r, amqp=["tcp:0"])
        svc.gcFullInterval = 300.0
        svc.startService()
        self.successResultOf(svc.whenReady())
        # collected, then frozen while nothing listened yet
        self.assertEqual(calls[1:], [("collect",), ("freeze", 0)])
        self.assertEqual(len(r.tcpServers), 1)
        del calls[:]
        svc.stopService()
        self.assertIn(("unfreeze",), calls)

        del calls[:]
        svc = _service(_Reactor())
        svc.startService()
        self.successResultOf(svc.whenReady())
        svc.stopService()
        self.assertEqual(calls, [])

    def test_pypyNurseryHint(self):
        """On PyPy an unset PYPY_GC_NURSERY is pointed out once at start; a set one is left alone."""
        self.assertIn("PYPY_GC_NURSERY=16MB", service_module.pypyNurseryHint({}))
        self.assertIsNone(service_module.pypyNurseryHint({"PYPY_GC_NURSERY": "4MB"}))

    def test_noThresholds(self):
        """A gc without get_threshold (PyPy) starts fine, changes nothing and runs no timed collection."""
        fake = _GCWithoutThresholds()
        self.patch(service_module, "gc", fake)
        r = _Reactor()
        svc = _service(r)
        svc.gcFullInterval = 300.0
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertIsNone(svc._gcTimer)
        r.advance(3600)
        self.assertEqual(fake.collected, 0)
        svc.stopService()

    def test_releaserRuns(self):
        """The memory releaser looks every memoryReleaseInterval seconds on the injected clock, until stop."""
        r = _Reactor()
        svc = _service(r)
        svc.memoryReleaseInterval = 2.0
        svc.startService()
        self.successResultOf(svc.whenReady())
        releaser = svc._releaser
        looks = []
        releaser.amounts = lambda: looks.append(r.seconds()) or (0, 0)
        r.advance(2)
        r.advance(2)
        self.assertEqual(looks, [2, 4])
        svc.stopService()
        self.assertIsNone(svc._releaser)
        r.advance(10)
        self.assertEqual(len(looks), 2)

    def test_releaserOff(self):
        """memoryReleaseInterval None starts no releaser."""
        svc = _service(_Reactor())
        svc.memoryReleaseInterval = None
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertIsNone(svc._releaser)
        svc.stopService()


class ServerPropertiesTests(SynchronousTestCase):
    """serverProperties reach connection.start, merged over our defaults."""

    def test_connectionStart(self):
        """A client sees product and version overridden; our other properties stay."""
        svc = _service(_Reactor(), serverProperties={"product": "RabbitMQ", "version": "3.10.8"})
        self.assertEqual(svc.factory.serverProperties, {"product": "RabbitMQ", "version": "3.10.8"})
        client = FakeClient(svc.factory, handshake=False)
        client.feed(client.spec.PROTOCOL_HEADER)
        [(_, start, _)] = client.received()
        props = start.server_properties
        self.assertEqual((props["product"], props["version"]), ("RabbitMQ", "3.10.8"))
        self.assertEqual(props["platform"], "Python/Twisted")
        self.assertIn("publisher_confirms", props["capabilities"])

    def test_defaultProduct(self):
        """Without serverProperties the product is ours."""
        svc = _service(_Reactor())
        client = FakeClient(svc.factory, handshake=False)
        client.feed(client.spec.PROTOCOL_HEADER)
        [(_, start, _)] = client.received()
        self.assertEqual(start.server_properties["product"], "otter_tx")

    def test_invalid(self):
        """Non-string values, empty keys and 'capabilities' are refused with ValueError."""
        for props in ({"version": 3}, {"": "x"}, {"capabilities": "none"}):
            self.assertRaises(ValueError, _service, _Reactor(), serverProperties=props)

    def test_managementBodyGuard(self):
        """The management listeners serve a BodyGuardSite with the given cap (20 MiB by default); below 1: ValueError."""
        from otter_tx.web.request import BodyGuardSite

        site = _service(_Reactor(), management=["tcp:15672"]).managementServices[0].factory
        self.assertIsInstance(site, BodyGuardSite)
        self.assertEqual(site.maxBodySize, 20971520)
        svc = _service(_Reactor(), management=["tcp:15672"], managementMaxBodySize=100)
        self.assertEqual(svc.managementServices[0].factory.maxBodySize, 100)
        for bad in (0, -1, "20MB", True):
            self.assertRaises(ValueError, _service, _Reactor(), managementMaxBodySize=bad)

    def test_badEndpoint(self):
        """An endpoint string Twisted cannot parse is a ValueError naming it."""
        e = self.assertRaises(ValueError, _service, _Reactor(), amqp=["tcp:abc"])
        self.assertIn("'tcp:abc'", str(e))

    def test_singleEndpointString(self):
        """amqp='tcp:5672' is taken as one endpoint, not as a list of characters."""
        svc = _service(_Reactor(), amqp="tcp:5672")
        self.assertEqual([s.description for s in svc.amqpServices], ["tcp:5672"])

    def test_noDataDirMeansMemory(self):
        """Without dataDir and store, the store is a MemoryStore: nothing is written to disk."""
        svc = OtterService(amqp=[], reactor=_Reactor())
        self.assertIsInstance(svc.store, MemoryStore)


class ListenTests(_Logged, SynchronousTestCase):
    """Listeners bind after recovery; any failure ends the start cleanly."""

    def test_readyLine(self):
        """Once all listeners are bound, one info line gives the URLs with the real ports."""
        events = self.captureLog()
        r = _Reactor()
        svc = _service(r, amqp=["tcp:0:interface=127.0.0.1", "tcp:5672"], management=["tcp:15672"])
        svc.startService()
        self.assertIs(self.successResultOf(svc.whenReady()), svc)
        ready = [self.text(e) for e in events if "otter_tx ready" in self.text(e)]
        self.assertEqual(ready, [
            "otter_tx ready: AMQP amqp://127.0.0.1:40001, amqp://127.0.0.1:5672 (all interfaces); "
            "management http://127.0.0.1:15672/ (all interfaces)"
        ])
        self.assertEqual(svc.amqpURLs, ["amqp://127.0.0.1:40001", "amqp://127.0.0.1:5672 (all interfaces)"])
        ports = self.successResultOf(svc.listeningPorts(svc.amqpServices))
        self.assertEqual([p.getHost().port for p in ports], [40001, 5672])
        self.successResultOf(svc.stopService())
        self.assertEqual(sorted(r.stopped), [5672, 15672, 40001])

    def test_tlsURL(self):
        """An ssl: endpoint is announced as amqps:// (https:// for management)."""
        from twisted.test import __file__ as here

        pem = os.path.join(os.path.dirname(here), "server.pem").replace(":", "\\:")
        events = self.captureLog()
        svc = _service(_Reactor(), amqp=["ssl:5671:interface=127.0.0.1:privateKey=%s" % pem],
                       management=["ssl:15671:interface=127.0.0.1:privateKey=%s" % pem])
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertIn("otter_tx ready: AMQP amqps://127.0.0.1:5671; management https://127.0.0.1:15671/",
                      [self.text(e) for e in events])
        svc.stopService()

    def test_otterTLSURL(self):
        """An ottertls: endpoint (client certificates, TLS floor) is announced as amqps:// too."""
        from twisted.test import __file__ as here

        pem = os.path.join(os.path.dirname(here), "server.pem").replace(":", "\\:")
        events = self.captureLog()
        svc = _service(_Reactor(), amqp=["ottertls:5671:interface=127.0.0.1:privateKey=%s" % pem])
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertIn("otter_tx ready: AMQP amqps://127.0.0.1:5671", [self.text(e) for e in events])
        svc.stopService()

    def test_listenerRecords(self):
        """Once bound, the management app knows each listener's protocol, address, port and TLS files."""
        from twisted.test import __file__ as here

        pem = os.path.join(os.path.dirname(here), "server.pem")
        escaped = pem.replace(":", "\\:")
        svc = _service(_Reactor(), amqp=["tcp:5672:interface=127.0.0.1",
                                         "ssl:5671:interface=127.0.0.1:privateKey=%s" % escaped],
                       management=["tcp:15672:interface=127.0.0.1"])
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertEqual(svc.management.listeners, [
            {"protocol": "amqp", "ip_address": "127.0.0.1", "port": 5672, "certfile": None, "cacertfile": None},
            {"protocol": "amqp/ssl", "ip_address": "127.0.0.1", "port": 5671, "certfile": pem,
             "cacertfile": None},
            {"protocol": "http", "ip_address": "127.0.0.1", "port": 15672, "certfile": None, "cacertfile": None},
        ])
        svc.stopService()

    def test_listenFailure(self):
        """A port in use fails whenReady with ListenFailed; the ports that did bind are closed."""
        events = self.captureLog()
        r = _Reactor(refuse={5672: errno.EADDRINUSE})
        svc = _service(r, amqp=["tcp:5672"], management=["tcp:15672"])
        svc.startService()
        f = self.failureResultOf(svc.whenReady(), ListenFailed)
        self.assertEqual((f.value.kind, f.value.endpoint), ("AMQP", "tcp:5672"))
        self.assertEqual(str(f.value), "cannot listen on AMQP endpoint 'tcp:5672': Address already in use (errno %d)"
                         % (errno.EADDRINUSE,))
        self.assertEqual(r.stopped, [15672])
        errors = [self.text(e) for e in events if e["log_level"].name in ("error", "critical")]
        self.assertEqual(errors, ["otter_tx cannot start: " + str(f.value)])
        self.assertFalse([e for e in events if "log_failure" in e], "a traceback was logged")
        self.assertFalse([e for e in events if "otter_tx ready" in self.text(e)])
        self.successResultOf(svc.stopService())

    def test_permissionDenied(self):
        """Permission denied is reported with the management endpoint's name."""
        r = _Reactor(refuse={80: errno.EACCES})
        svc = _service(r, amqp=["tcp:5672"], management=["tcp:80"])
        svc.startService()
        f = self.failureResultOf(svc.whenReady(), ListenFailed)
        self.assertEqual(str(f.value), "cannot listen on management endpoint 'tcp:80': Permission denied (errno %d)"
                         % (errno.EACCES,))
        self.assertEqual(r.stopped, [5672])
        svc.stopService()

    def test_foreignEndpointChild(self):
        """A StreamServerEndpointService added by the embedder is listened on and announced too."""
        from twisted.application.internet import StreamServerEndpointService
        from twisted.internet.endpoints import TCP4ServerEndpoint

        events = self.captureLog()
        r = _Reactor()
        svc = _service(r, amqp=["tcp:5672"])
        extra = StreamServerEndpointService(TCP4ServerEndpoint(r, 5999), svc.factory)
        extra.setServiceParent(svc)
        svc.startService()
        ports = self.successResultOf(svc.listeningPorts([extra]))
        self.assertEqual(ports[0].getHost().port, 5999)
        self.assertIn("otter_tx ready: AMQP amqp://127.0.0.1:5672 (all interfaces), "
                      "amqp://127.0.0.1:5999 (all interfaces)", [self.text(e) for e in events])
        self.successResultOf(svc.stopService())
        self.assertEqual(sorted(r.stopped), [5672, 5999])

    def test_foreignEndpointChildFails(self):
        """A failing StreamServerEndpointService child fails the start like our own listeners."""
        from twisted.application.internet import StreamServerEndpointService
        from twisted.internet.endpoints import TCP4ServerEndpoint

        r = _Reactor(refuse={5999: errno.EADDRINUSE})
        svc = _service(r, amqp=["tcp:5672"])
        StreamServerEndpointService(TCP4ServerEndpoint(r, 5999), svc.factory).setServiceParent(svc)
        svc.startService()
        f = self.failureResultOf(svc.whenReady(), ListenFailed)
        self.assertIn("TCP4ServerEndpoint(port=5999)", str(f.value))
        self.assertEqual(r.stopped, [5672])
        self.successResultOf(svc.stopService())

    def test_exitOnFailure(self):
        """With exitOnFailure (twistd) a listen failure stops the reactor and exits with status 1 after shutdown."""
        self.captureLog()
        r = _Reactor(refuse={5672: errno.EADDRINUSE})
        r.running = True
        svc = _service(r, amqp=["tcp:5672"])
        svc.exitOnFailure = True
        svc.startService()
        self.failureResultOf(svc.whenReady(), ListenFailed)
        self.assertTrue(r.hasStopped)
        self.assertEqual(r.triggers["after"]["shutdown"], [(service_module._exitProcess, (1,), {})])
        svc.stopService()

    def test_exitOnFailureBeforeRun(self):
        """A failure before the reactor runs (twistd starts services first) exits once it runs."""
        self.captureLog()
        r = _Reactor(refuse={5672: errno.EADDRINUSE})
        svc = _service(r, amqp=["tcp:5672"])
        svc.exitOnFailure = True
        svc.startService()
        self.failureResultOf(svc.whenReady(), ListenFailed)
        self.assertFalse(r.hasStopped)
        r.run()
        self.assertEqual(r.triggers["after"]["shutdown"], [(service_module._exitProcess, (1,), {})])
        svc.stopService()

    def test_embedderKeepsRunning(self):
        """Without exitOnFailure (embedding) the reactor is left alone."""
        self.captureLog()
        r = _Reactor(refuse={5672: errno.EADDRINUSE})
        r.running = True
        svc = _service(r, amqp=["tcp:5672"])
        svc.startService()
        self.failureResultOf(svc.whenReady(), ListenFailed)
        self.assertFalse(r.hasStopped)
        svc.stopService()


class PreStartTests(SynchronousTestCase):
    """What the Python API declares before startService is stored like what is declared after."""

    def setUp(self):
        self.store = MemoryStore()
        self.reactor = _Reactor()

    def boot(self, before=None, **kw):
        """Build a service on the shared store, run ``before(service)``, start it; returns it."""
        svc = _service(self.reactor, store=self.store, **kw)
        if before is not None:
            before(svc)
        svc.startService()
        self.successResultOf(svc.whenReady())
        return svc

    def stop(self, svc):
        self.successResultOf(svc.stopService())

    def publish(self, svc, routingKey, body, exchange=""):
        client = FakeClient(svc.factory)
        client.openChannel()
        client.publish(1, exchange, routingKey, body, props={"delivery_mode": 2})
        client.received()

    def test_declaredBeforeStartSurvives(self):
        """A durable queue, exchange, binding, vhost, user, permission and policy declared before start survive a restart."""

        def declare(svc):
            b = svc.broker
            vh = b.vhosts["/"]
            q = vh.declareQueue("jobs", None, durable=True)
            ex = vh.declareExchange("work", "direct", durable=True)
            vh.bind(ex, q, "job", {})
            other = b.addVHost("tenant")
            other.declareQueue("inbox", None, durable=True)
            b.addUser("app", "secret", tags=["management"])
            b.setPermissions("app", "tenant", "^inbox", ".*", ".*")
            b.setPolicy("/", "cap", "^jobs$", {"max-length": 100}, applyTo="queues")

        svc = self.boot(declare)
        self.publish(svc, "job", b"one", exchange="work")
        self.assertEqual(svc.broker.vhosts["/"].queues["jobs"].readyCount, 1)
        self.stop(svc)

        svc = self.boot()
        b = svc.broker
        q = b.vhosts["/"].queues["jobs"]
        self.assertEqual(q.readyCount, 1)
        self.assertTrue(q.durable)
        self.assertEqual(q.policy.name, "cap")
        self.assertEqual({(src.name, key) for (src, key, _) in q.bindings}, {("work", "job")})
        self.assertIn("inbox", b.vhosts["tenant"].queues)
        self.assertTrue(b.users["app"].checkPassword("secret"))
        self.assertEqual(b.permissions[("app", "tenant")], ("^inbox", ".*", ".*"))
        self.publish(svc, "job", b"two", exchange="work")
        self.assertEqual(q.readyCount, 2)
        self.stop(svc)

    def test_redeclaredBeforeStartKeepsMessages(self):
        """A program that declares its exchange, queue and binding before every start gets the stored messages in that same queue."""
        declared = []

        def declare(svc):
            vh = svc.broker.vhosts["/"]
            q = vh.declareQueue("jobs", None, durable=True, arguments={"x-max-length": 10})
            ex = vh.declareExchange("work", "topic", durable=True)
            vh.bind(ex, q, "job.#", {})
            declared.append((ex, q))

        svc = self.boot(declare)
        self.publish(svc, "job.a", b"one", exchange="work")
        self.stop(svc)
        svc = self.boot(declare)
        ex, q = declared[-1]
        self.assertIs(svc.broker.vhosts["/"].queues["jobs"], q)
        self.assertIs(svc.broker.vhosts["/"].exchanges["work"], ex)
        self.assertEqual(q.readyCount, 1)
        self.publish(svc, "job.b", b"two", exchange="work")
        self.assertEqual(q.readyCount, 2)
        self.stop(svc)
        svc = self.boot(declare)
        self.assertEqual(declared[-1][1].readyCount, 2)
        self.assertEqual(len(self.store._entities["binding"]), 1)
        self.stop(svc)

    def test_mergesWithStore(self):
        """Recovery keeps the stored users, vhosts and queues and adds the ones declared before start."""
        svc = self.boot()
        svc.broker.addUser("bob", "pw")
        svc.broker.addVHost("old")
        svc.broker.vhosts["/"].declareQueue("old-q", None, durable=True)
        self.publish(svc, "old-q", b"kept")
        self.stop(svc)

        def declare(svc):
            svc.broker.addUser("alice", "pw")
            svc.broker.addVHost("new")
            svc.broker.vhosts["new"].declareQueue("new-q", None, durable=True)

        svc = self.boot(declare)
        for s in (svc, None):
            if s is None:
                self.stop(svc)
                svc = self.boot()
            b = svc.broker
            self.assertEqual(set(b.users), {"guest", "bob", "alice"})
            self.assertEqual(set(b.vhosts), {"/", "old", "new"})
            self.assertEqual(b.vhosts["/"].queues["old-q"].readyCount, 1)
            self.assertIn("new-q", b.vhosts["new"].queues)
        self.stop(svc)

    def test_deletedBeforeStart(self):
        """Deleting the default user before start deletes the stored one, as a later delete would."""
        self.stop(self.boot())

        def declare(svc):
            svc.broker.addUser("admin", "pw", tags=["administrator"])
            svc.broker.setPermissions("admin", "/")
            svc.broker.deleteUser("guest")

        self.stop(self.boot(declare))
        svc = self.boot()
        self.assertEqual(set(svc.broker.users), {"admin"})
        self.assertEqual(set(svc.broker.permissions), {("admin", "/")})
        self.stop(svc)

    def test_newArgumentsWin(self):
        """A queue declared before start with other arguments than the stored one keeps the new ones (and its messages)."""

        def declare(length):
            return lambda svc: svc.broker.vhosts["/"].declareQueue(
                "q", None, durable=True, arguments={"x-max-length": length})

        svc = self.boot(declare(5))
        self.publish(svc, "q", b"m")
        self.stop(svc)
        self.stop(self.boot(declare(10)))
        svc = self.boot()
        q = svc.broker.vhosts["/"].queues["q"]
        self.assertEqual((q.arguments["x-max-length"], q.readyCount), (10, 1))
        self.stop(svc)

    def test_policyForStoredVHost(self):
        """A configured policy for a vhost that only the store knows is installed after recovery and stored."""
        svc = self.boot()
        svc.broker.addVHost("v")
        self.stop(svc)
        policy = {"vhost": "v", "name": "ttl", "pattern": ".*", "definition": {"message-ttl": 5}}
        self.stop(self.boot(policies=[policy]))
        svc = self.boot()
        self.assertIn("ttl", svc.broker.vhosts["v"].policies)
        self.stop(svc)

    def test_policyForMissingVHost(self):
        """A configured policy for a vhost that exists nowhere fails the start with StartError."""
        svc = _service(self.reactor, store=self.store,
                       policies=[{"vhost": "nope", "name": "p", "pattern": ".*", "definition": {}}])
        svc.startService()
        f = self.failureResultOf(svc.whenReady(), StartError)
        self.assertEqual(str(f.value), "policy 'p' is for vhost 'nope', which does not exist")
        svc.stopService()


class AlarmWiringTests(SynchronousTestCase):
    """The service starts and stops the alarm monitors on its clock and follows the store's health."""

    def test_diskMonitorRuns(self):
        """With a dataDir the disk monitor checks it from start to stop; low space blocks, space back unblocks."""
        r = _Reactor()
        dataDir = self.mktemp()
        os.makedirs(dataDir)
        svc = _service(r, dataDir=dataDir, diskFreeLimit=1000)
        free = [10 ** 9]
        paths = []
        svc.diskMonitor.probe = lambda path: paths.append(path) or free[0]
        svc.startService()
        self.successResultOf(svc.whenReady())
        self.assertEqual(paths, [dataDir])
        free[0] = 999
        r.advance(2.5)
        self.assertEqual(svc.broker.alarms.active.keys(), {"disk"})
        free[0] = 10 ** 9
        r.advance(0.25)
        self.assertEqual(svc.broker.alarms.active, {})
        svc.stopService()
        count = len(paths)
        r.advance(60)
        self.assertEqual(len(paths), count)

    def test_diskMonitorCountsStorePending(self):
        """The disk monitor counts what the store is about to write when the store can say (SQLiteStore)."""
        from otter_tx.store.sqlite import SQLiteStore

        dataDir = self.mktemp()
        svc = _service(_Reactor(), dataDir=dataDir, store=SQLiteStore(dataDir, _Reactor()))
        self.assertEqual(svc.diskMonitor.pending, svc.store.pendingWriteBytes)
        svc = _service(_Reactor(), dataDir=self.mktemp())
        self.assertIsNone(svc.diskMonitor.pending)

    def test_noDataDirNoDiskMonitor(self):
        """Without a dataDir nothing is written to disk, so no disk is watched."""
        svc = _service(_Reactor())
        self.assertIsNone(svc.diskMonitor)

    def test_relativeLimit(self):
        """diskFreeLimit ("relative", x) is x times RAM."""
        from otter_tx.resources.alarms import totalMemoryBytes

        if totalMemoryBytes() is None:
            raise SkipTest("the RAM size is unknown here")
        svc = _service(_Reactor(), dataDir=self.mktemp(), diskFreeLimit=("relative", 0.5))
        self.assertEqual(svc.diskMonitor.limit, int(totalMemoryBytes() * 0.5))

    def test_storeHealthWatched(self):
        """A store reporting itself unhealthy raises the store alarm; healthy again clears it."""
        from otter_tx.test.unit.test_alarms import FakeStore

        store = FakeStore()
        svc = _service(_Reactor(), store=_HealthStore(MemoryStore(), store))
        store.setHealthy(False, "disk I/O error")
        self.assertEqual(svc.broker.alarms.active, {"store": "disk I/O error"})
        store.setHealthy(True)
        self.assertEqual(svc.broker.alarms.active, {})


@implementer(IMessageStore)
class _HealthStore:
    """A MemoryStore with the health contract of a fake (until every store has it)."""

    def __init__(self, store, health):
        self._store = store
        self._health = health

    def __getattr__(self, name):
        if name in ("healthy", "addHealthObserver"):
            return getattr(self._health, name)
        return getattr(self._store, name)
