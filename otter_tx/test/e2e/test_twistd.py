"""
Real ``twistd -n ottermq`` / ``python -m twisted ottermq`` processes as a
newcomer runs them: bad options and config files (one line, exit 64),
``--help``, a port in use, the ready line with the real ports and the
``--server-property`` values a client sees.  Option parsing itself is tested
in ``otter_tx.test.unit.test_tap``.
"""

import os
import re
import socket
import sys

from twisted.internet import defer, error, protocol, reactor
from twisted.trial.unittest import TestCase

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class _Process(protocol.ProcessProtocol):
    """
    Collects output; ``ended`` fires with the exit status (minus the signal
    number if a signal ended it); ``seen(regex)`` waits for a match.
    """

    def __init__(self):
        self.output = b""
        self.ended = defer.Deferred()
        self._watch = []

    def outReceived(self, data):
        self.output += data
        for regex, d in list(self._watch):
            m = regex.search(self.output)
            if m:
                self._watch.remove((regex, d))
                d.callback(m)

    errReceived = outReceived

    def seen(self, pattern):
        d = defer.Deferred()
        self._watch.append((re.compile(pattern), d))
        self.outReceived(b"")
        return d

    def processEnded(self, reason):
        for _, d in self._watch:
            d.errback(RuntimeError("process ended before the line:\n" + self.text()))
        self._watch = []
        # the exit status, or minus the signal that ended the process
        code = getattr(reason.value, "exitCode", None)
        if code is None:
            code = -(getattr(reason.value, "signal", None) or 0)
        self.ended.callback(code)

    def text(self):
        return self.output.decode("utf-8", "replace")


class ProcessTests(TestCase):
    """``twistd -n ottermq`` / ``python -m twisted ottermq`` as a newcomer runs them."""

    timeout = 60

    def spawn(self, *args, how="twistd"):
        proc = _Process()
        env = dict(os.environ)
        env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["COLUMNS"] = "80"
        if how == "twistd":
            argv = [sys.executable, "-c", "import sys; sys.argv[0] = 'twistd'; "
                    "from twisted.scripts.twistd import run; run()", "--nodaemon", "--pidfile="]
        else:
            argv = [sys.executable, "-m", "twisted"]
        cwd = self.mktemp()
        os.makedirs(cwd)
        transport = reactor.spawnProcess(proc, sys.executable, argv + list(args), env=env, path=cwd)

        def kill():
            if proc.ended.called:
                return
            try:
                transport.signalProcess("KILL")
            except error.ProcessExitedAlready:
                pass
            return proc.ended

        self.addCleanup(kill)
        # never hang: a broker that should have exited is killed after 30 s
        guard = reactor.callLater(30, kill)
        proc.ended.addBoth(lambda r: (guard.active() and guard.cancel(), r)[1])
        return proc

    def assertOneLineExit(self, proc, code, expected):
        """The process exited with ``code`` and printed exactly the line ``expected``."""

        def check(status):
            self.assertEqual((status, proc.text()), (code, expected + "\n"))

        return proc.ended.addCallback(check)

    def test_badOptionTwistd(self):
        """twistd -n ottermq --heartbeat -5 exits 64 with one line, no usage text, no traceback."""
        proc = self.spawn("ottermq", "--heartbeat", "-5")
        return self.assertOneLineExit(proc, 64, "ottermq: --heartbeat: must be an integer from 0 to 65535, got '-5'")

    def test_badConfigPythonMTwisted(self):
        """python -m twisted ottermq --config with heartbeat = "abc" exits 64 with one line."""
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write('heartbeat = "abc"\n')
        proc = self.spawn("ottermq", "--config", path, how="python")
        return self.assertOneLineExit(
            proc, 64, "ottermq: config file %s: heartbeat: must be an integer from 0 to 65535, got 'abc'" % (path,))

    def test_help(self):
        """twistd ottermq --help starts with a natural usage line and lists --server-property."""
        proc = self.spawn("ottermq", "--help")

        def check(status):
            self.assertEqual(status, 0)
            lines = proc.text().splitlines()
            self.assertEqual(lines[0], "Usage: twistd [options] ottermq [options]")
            self.assertIn("--server-property=", proc.text())

        return proc.ended.addCallback(check)

    @defer.inlineCallbacks
    def test_portInUse(self):
        """An AMQP port in use: exit status 1, one error line naming the endpoint and the reason."""
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        endpoint = "tcp:%d:interface=127.0.0.1" % (port,)
        proc = self.spawn("ottermq", "--amqp", endpoint, "--management", "tcp:0:interface=127.0.0.1",
                          "--prometheus", "none", "--stream", "none",
                          "--data-dir", os.path.abspath(self.mktemp()))
        status = yield proc.ended
        text = proc.text()
        self.assertEqual(status, 1, text)
        self.assertNotIn("Traceback", text)
        errors = [line for line in text.splitlines() if "#error" in line or "#critical" in line]
        self.assertEqual(len(errors), 1, text)
        self.assertIn("otter_tx cannot start: cannot listen on AMQP endpoint %r: Address already in use" % (endpoint,),
                      errors[0])
        self.assertNotIn("otter_tx ready", text)

    @defer.inlineCallbacks
    def test_readyLineAndServerProperties(self):
        """One 'otter_tx ready' line gives the real ports; a client sees --server-property values; /metrics answers."""
        import treq

        proc = self.spawn("ottermq", "--amqp", "tcp:0:interface=127.0.0.1",
                          "--management", "tcp:0:interface=127.0.0.1",
                          "--prometheus", "tcp:0:interface=127.0.0.1", "--stream", "none",
                          "--data-dir", os.path.abspath(self.mktemp()),
                          "--server-property", "product=RabbitMQ", "--server-property", "version=3.10.8")
        m = yield proc.seen(rb"otter_tx ready: AMQP amqp://127\.0\.0\.1:(\d+); management http://127\.0\.0\.1:(\d+)/; "
                            rb"prometheus http://127\.0\.0\.1:(\d+)/metrics\n")
        amqpPort, httpPort, promPort = int(m.group(1)), int(m.group(2)), int(m.group(3))
        self.assertNotEqual(amqpPort, 0)
        self.assertNotEqual(httpPort, 0)
        self.assertNotEqual(promPort, 0)
        self.assertEqual(proc.text().count("otter_tx ready"), 1)
        props = yield _serverProperties(amqpPort)
        self.assertEqual((props["product"], props["version"], props["platform"]),
                         ("RabbitMQ", "3.10.8", "Python/Twisted"))
        r = yield treq.get("http://127.0.0.1:%d/metrics" % (promPort,), persistent=False)
        body = yield r.text()
        self.assertEqual(r.code, 200)
        self.assertIn("\nrabbitmq_connections_opened_total 1.0\n", body)
        os.kill(proc.transport.pid, 15)
        status = yield proc.ended
        # twistd ends itself with the signal it got, so the status says "SIGTERM"
        self.assertIn(status, (0, -15), proc.text())
        self.assertNotIn("Traceback", proc.text())


def _serverProperties(port):
    """Connect, send the AMQP header, and decode connection.start's server properties."""
    from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

    from otter_tx.amqp import spec

    class Start(protocol.Protocol):
        def __init__(self):
            self.buf = b""
            self.done = defer.Deferred()

        def connectionMade(self):
            self.transport.write(spec.PROTOCOL_HEADER)

        def dataReceived(self, data):
            import struct

            self.buf += data
            if len(self.buf) >= 7:
                size = struct.unpack_from("!I", self.buf, 3)[0]
                if len(self.buf) >= size + 8 and not self.done.called:
                    m = spec.ConnectionStart.decode(self.buf[7:7 + size], 4)
                    self.transport.loseConnection()
                    self.done.callback(m.server_properties)

    p = Start()
    return connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), p).addCallback(lambda _: p.done)
