"""
Tests for otter_tx.tap (twistd options, config file), the twistd plugin and
OtterService embedded in another service tree.
"""

import os
import sys

from twisted.application.service import IServiceMaker
from twisted.internet import reactor, threads
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase, TestCase

from otter_tx import tap
from otter_tx.service import OtterService


class OptionsTests(SynchronousTestCase):
    """twistd ottermq option parsing."""

    def parse(self, *argv):
        o = tap.Options()
        o.parseOptions(list(argv))
        return o.settings

    def test_defaults(self):
        """Without options the broker listens on tcp:5672 with RabbitMQ's defaults."""
        s = self.parse()
        self.assertEqual(s["amqp"], ["tcp:5672"])
        self.assertEqual(s["management"], ["tcp:15672"])
        self.assertEqual(s["data-dir"], "./ottermq-data")
        self.assertEqual((s["heartbeat"], s["frame-max"], s["channel-max"]), (60, 131072, 2047))
        self.assertEqual(s["loopback-users"], ["guest"])

    def test_repeatableEndpoints(self):
        """--amqp may be given several times."""
        s = self.parse("--amqp", "tcp:0", "--amqp", "tcp:5673")
        self.assertEqual(s["amqp"], ["tcp:0", "tcp:5673"])

    def test_configFile(self):
        """A TOML config file supplies settings and policies; the command line wins."""
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(
                'amqp = ["tcp:6000"]\nheartbeat = 5\nloopback_users = ""\n'
                '[[policies]]\nname = "ttl"\npattern = "^t"\ndefinition = {message-ttl = 100}\n'
            )
        s = self.parse("--config", path, "--heartbeat", "7")
        self.assertEqual(s["amqp"], ["tcp:6000"])
        self.assertEqual(s["heartbeat"], 7)
        self.assertEqual(s["loopback-users"], [])
        self.assertEqual(s["policies"][0]["definition"], {"message-ttl": 100})

    def test_badConfig(self):
        """Unknown settings and invalid TOML are usage errors naming the file."""
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("nope = 1\n")
        e = self.assertRaises(usage.UsageError, self.parse, "--config", path)
        self.assertIn(path, str(e))
        with open(path, "w") as f:
            f.write("= broken")
        self.assertRaises(usage.UsageError, self.parse, "--config", path)

    def test_makeService(self):
        """makeService builds an OtterService with the policies installed."""
        path = self.mktemp()
        with open(path, "w") as f:
            f.write('[[policies]]\nname = "ttl"\npattern = "^t"\ndefinition = {message-ttl = 100}\n')
        o = tap.Options()
        o.parseOptions(["--config", path, "--amqp", "tcp:0", "--management", "tcp:0",
                        "--data-dir", self.mktemp()])
        svc = tap.makeService(o, reactor=reactor)
        self.assertIsInstance(svc, OtterService)
        self.assertIn("ttl", svc.broker.vhosts["/"].policies)

    def test_plugin(self):
        """The twistd plugin 'ottermq' is discoverable and points at otter_tx.tap."""
        from twisted import plugins

        makers = [p for p in getPlugins(IServiceMaker, plugins) if p.tapname == "ottermq"]
        self.assertEqual(len(makers), 1)
        self.assertIs(makers[0].options, tap.Options)


class EmbeddingTests(TestCase):
    """OtterService runs inside another program's service tree."""

    timeout = 30

    def test_embeddedExample(self):
        """docs/examples/embedded.py starts a working broker in its own MultiService."""
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sys.path.insert(0, os.path.join(here, "docs", "examples"))
        self.addCleanup(sys.path.remove, os.path.join(here, "docs", "examples"))
        import embedded

        root, otter = embedded.build("tcp:0:interface=127.0.0.1", reactor, dataDir=self.mktemp())
        root.startService()
        self.addCleanup(root.stopService)

        def talk(ports):
            import pika

            port = ports[0].getHost().port

            def run():
                c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
                ch = c.channel()
                ch.basic_publish("", "jobs", b"job-1")
                ok = ch.queue_declare("jobs", passive=True).method.message_count
                c.close()
                return ok

            return threads.deferToThread(run)

        d = otter.listeningPorts(otter.amqpServices).addCallback(talk)
        return d.addCallback(self.assertEqual, 1)
