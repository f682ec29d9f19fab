"""
OtterService embedded in another program's service tree on the real reactor:
docs/examples/embedded.py started on ``tcp:0`` and talked to with pika, a
real port in use, the ready line with the port it got.  The service's unit
tests (on a MemoryReactorClock) are in ``otter_tx.test.unit.test_service``.
"""

import os
import socket
import sys

from twisted.application.service import MultiService
from twisted.internet import defer, reactor, threads
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from otter_tx.service.assembly import ListenFailed, OtterService

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class EmbeddingTests(TestCase):
    """OtterService runs inside another program's service tree."""

    timeout = 30

    def example(self):
        sys.path.insert(0, os.path.join(_ROOT, "docs", "examples"))
        self.addCleanup(sys.path.remove, os.path.join(_ROOT, "docs", "examples"))
        import embedded

        return embedded

    def talk(self, port, publish):
        import pika

        def run():
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
            ch = c.channel()
            if publish:
                ch.basic_publish("", "jobs", publish, pika.BasicProperties(delivery_mode=2))
            n = ch.queue_declare("jobs", durable=True, passive=True).method.message_count
            c.close()
            return n

        return threads.deferToThread(run)

    @defer.inlineCallbacks
    def test_embeddedExample(self):
        """docs/examples/embedded.py starts a working broker in its own MultiService."""
        embedded = self.example()
        root, otter = embedded.build("tcp:0:interface=127.0.0.1", reactor, dataDir=self.mktemp())
        self.assertIsInstance(root, MultiService)
        root.startService()
        self.addCleanup(root.stopService)
        ports = yield otter.listeningPorts(otter.amqpServices)
        n = yield self.talk(ports[0].getHost().port, b"job-1")
        self.assertEqual(n, 1)

    @defer.inlineCallbacks
    def test_embeddedExampleRestart(self):
        """The example's queue is declared before start, so its persistent messages survive a restart."""
        embedded = self.example()
        dataDir = os.path.abspath(self.mktemp())
        for expected in (1, 2):
            root, otter = embedded.build("tcp:0:interface=127.0.0.1", reactor, dataDir=dataDir)
            root.startService()
            try:
                ports = yield otter.listeningPorts(otter.amqpServices)
                n = yield self.talk(ports[0].getHost().port, b"job-%d" % expected)
            finally:
                yield root.stopService()
            self.assertEqual(n, expected)

    def test_exampleDefaultDataDir(self):
        """Without a data dir the example uses a new temporary directory, never the current one."""
        import tempfile

        embedded = self.example()
        root, otter = embedded.build("tcp:0:interface=127.0.0.1", reactor)
        self.addCleanup(__import__("shutil").rmtree, otter.dataDir, True)
        self.assertTrue(otter.dataDir.startswith(tempfile.gettempdir()), otter.dataDir)

    @defer.inlineCallbacks
    def test_portInUse(self):
        """A real port in use fails whenReady with ListenFailed naming the endpoint; nothing stays open."""
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        endpoint = "tcp:%d:interface=127.0.0.1" % (busy.getsockname()[1],)
        svc = OtterService(amqp=[endpoint], management=["tcp:0:interface=127.0.0.1"], reactor=reactor,
                           dataDir=self.mktemp())
        svc.startService()
        try:
            e = yield self.assertFailure(svc.whenReady(), ListenFailed)
            self.assertEqual(e.endpoint, endpoint)
            self.assertIn("Address already in use", e.reason)
            self.assertIsNone(svc.managementServices[0].port)
        finally:
            yield svc.stopService()

    @defer.inlineCallbacks
    def test_realReadyLine(self):
        """On a real reactor tcp:0 is announced with the port it got."""
        events = []

        def observer(event):
            if event.get("log_namespace") == "otter_tx.service.assembly":
                events.append(event)

        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        svc = OtterService(amqp=["tcp:0:interface=127.0.0.1"], reactor=reactor, dataDir=self.mktemp())
        svc.startService()
        try:
            yield svc.whenReady()
            [port] = yield svc.listeningPorts(svc.amqpServices)
            number = port.getHost().port
        finally:
            yield svc.stopService()
        self.assertNotEqual(number, 0)
        self.assertEqual(svc.amqpURLs, ["amqp://127.0.0.1:%d" % (number,)])
        self.assertEqual(len([e for e in events if "otter_tx ready" in e.get("log_format", "")]), 1)
