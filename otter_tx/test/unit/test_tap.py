"""
Tests for otter_tx.service.tap: option parsing, the TOML config file, validation
with one-line errors, the twistd plugin.  Real ``twistd -n ottermq`` /
``python -m twisted ottermq`` processes (bad options, a port in use, the
ready line) are in ``otter_tx.test.e2e.test_twistd``.
"""

import io
import os
import sys

from twisted.application.service import IServiceMaker
from twisted.internet.testing import MemoryReactorClock
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.service import tap
from otter_tx.service.assembly import OtterService, defaultHighWatermark


class _Parsing:
    """Helpers: parse argv, write a config file."""

    def parse(self, *argv):
        o = tap.Options()
        o.parseOptions(list(argv))
        return o.settings

    def config(self, text):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(text)
        return path

    def refused(self, *argv):
        """The UsageError text for ``argv``; asserts it is one line."""
        e = self.assertRaises(usage.UsageError, self.parse, *argv)
        text = str(e)
        self.assertNotIn("\n", text)
        return text


class OptionsTests(_Parsing, SynchronousTestCase):
    """twistd ottermq option parsing."""

    def test_defaults(self):
        """Without options the broker listens on tcp:5672 with RabbitMQ's defaults."""
        s = self.parse()
        self.assertEqual(s["amqp"], ["tcp:5672"])
        self.assertEqual(s["management"], ["tcp:15672"])
        self.assertEqual(s["data-dir"], "./ottermq-data")
        self.assertEqual((s["heartbeat"], s["frame-max"], s["channel-max"]), (60, 131072, 2047))
        self.assertEqual((s["handshake-timeout"], s["consumer-timeout"]), (10.0, 1800000))
        self.assertEqual(s["loopback-users"], ["guest"])
        self.assertEqual(s["server-properties"], {})
        self.assertIsNone(s["memory-high-watermark"])

    def test_prometheus(self):
        """--prometheus defaults to tcp:15692; 'none' or '' (option or file) disables it; bad ones name it."""
        self.assertEqual(self.parse()["prometheus"], ["tcp:15692"])
        self.assertEqual(self.parse("--prometheus", "tcp:0", "--prometheus", "tcp:9419")["prometheus"],
                         ["tcp:0", "tcp:9419"])
        self.assertEqual(self.parse("--prometheus", "none")["prometheus"], [])
        self.assertEqual(self.parse("--prometheus", "")["prometheus"], [])
        for text in ('prometheus = ""\n', 'prometheus = "none"\n', "prometheus = []\n"):
            self.assertEqual(self.parse("--config", self.config(text))["prometheus"], [], text)
        self.assertEqual(self.parse("--config", self.config('prometheus = "tcp:9419"\n'))["prometheus"],
                         ["tcp:9419"])
        self.assertEqual(self.refused("--prometheus", "tcp:abc"),
                         "--prometheus: invalid endpoint 'tcp:abc': invalid literal for int() with base 10: 'abc'")
        path = self.config("prometheus = 15692\n")
        self.assertIn("prometheus: must be an endpoint string like 'tcp:5672', got 15692",
                      self.refused("--config", path))
        o = tap.Options()
        o.parseOptions(["--amqp", "tcp:0", "--management", "tcp:0", "--prometheus", "tcp:0",
                        "--data-dir", self.mktemp()])
        svc = tap.makeService(o, reactor=MemoryReactorClock())
        self.assertEqual([l.description for l in svc.prometheusServices], ["tcp:0"])

    def test_repeatableEndpoints(self):
        """--amqp may be given several times."""
        s = self.parse("--amqp", "tcp:0", "--amqp", "tcp:5673")
        self.assertEqual(s["amqp"], ["tcp:0", "tcp:5673"])

    def test_numbers(self):
        """Numeric options are converted: heartbeat, frame-max, channel-max (int), handshake-timeout (float)."""
        s = self.parse("--heartbeat", "0", "--frame-max", "4096", "--channel-max", "0",
                       "--handshake-timeout", "2.5", "--consumer-timeout", "0")
        self.assertEqual((s["heartbeat"], s["frame-max"], s["channel-max"]), (0, 4096, 0))
        self.assertEqual((s["handshake-timeout"], s["consumer-timeout"]), (2.5, 0))

    def test_configFile(self):
        """A TOML config file supplies settings and policies; the command line wins."""
        path = self.config(
            'amqp = ["tcp:6000"]\nheartbeat = 5\nloopback_users = ""\n'
            '[[policies]]\nname = "ttl"\npattern = "^t"\ndefinition = {message-ttl = 100}\n'
        )
        s = self.parse("--config", path, "--heartbeat", "7")
        self.assertEqual(s["amqp"], ["tcp:6000"])
        self.assertEqual(s["heartbeat"], 7)
        self.assertEqual(s["loopback-users"], [])
        self.assertEqual(s["policies"][0]["definition"], {"message-ttl": 100})

    def test_configFileTypes(self):
        """Config values take their TOML types: a string endpoint, a list of users, a float timeout."""
        path = self.config(
            'amqp = "tcp:6001"\nmanagement = []\nloopback-users = ["a", "b"]\n'
            'handshake-timeout = 2.5\nconsumer_timeout = 1000\nframe-max = 8192\n'
        )
        s = self.parse("--config", path)
        self.assertEqual(s["amqp"], ["tcp:6001"])
        self.assertEqual(s["management"], [])
        self.assertEqual(s["loopback-users"], ["a", "b"])
        self.assertEqual((s["handshake-timeout"], s["consumer-timeout"], s["frame-max"]), (2.5, 1000, 8192))

    def test_badConfig(self):
        """Unknown settings and invalid TOML are usage errors naming the file."""
        path = self.config("nope = 1\n")
        text = self.refused("--config", path)
        self.assertIn(path, text)
        self.assertIn("'nope'", text)
        path = self.config("= broken")
        self.assertIn(path, self.refused("--config", path))

    def test_unknownConfigKeySuggests(self):
        """A misspelt config key names the close match."""
        text = self.refused("--config", self.config("hearbeat = 5\n"))
        self.assertIn("unknown setting 'hearbeat' (did you mean 'heartbeat'?)", text)

    def test_missingConfigFile(self):
        """A config file that cannot be read is an error naming --config and the path."""
        text = self.refused("--config", "/nonexistent/ottermq.toml")
        self.assertIn("--config: cannot read /nonexistent/ottermq.toml", text)

    def test_plugin(self):
        """The twistd plugin 'ottermq' is discoverable and points at otter_tx.service.tap."""
        from twisted import plugins

        makers = [p for p in getPlugins(IServiceMaker, plugins) if p.tapname == "ottermq"]
        self.assertEqual(len(makers), 1)
        self.assertIs(makers[0].options, tap.Options)

    def test_makeService(self):
        """makeService builds an OtterService with policies, server properties and the watermark."""
        path = self.config('[[policies]]\nname = "ttl"\npattern = "^t"\ndefinition = {message-ttl = 100}\n')
        o = tap.Options()
        o.parseOptions(["--config", path, "--amqp", "tcp:0", "--management", "tcp:0",
                        "--data-dir", self.mktemp(), "--server-property", "product=RabbitMQ",
                        "--memory-high-watermark", "1GB"])
        svc = tap.makeService(o, reactor=MemoryReactorClock())
        self.assertIsInstance(svc, OtterService)
        self.assertTrue(svc.exitOnFailure)
        self.assertIn("ttl", svc.broker.vhosts["/"].policies)
        self.assertEqual(svc.factory.serverProperties, {"product": "RabbitMQ"})
        self.assertEqual(svc.broker.memoryHighWatermark, 1000 ** 3)


class ServerPropertyTests(_Parsing, SynchronousTestCase):
    """--server-property, server-property = [...] and [server-properties]."""

    def test_commandLine(self):
        """--server-property KEY=VALUE is repeatable; the value may hold '=' or be empty."""
        s = self.parse("--server-property", "product=RabbitMQ", "--server-property", "version=3.10.8",
                       "--server-property", "information=a=b", "--server-property", "platform=")
        self.assertEqual(s["server-properties"],
                         {"product": "RabbitMQ", "version": "3.10.8", "information": "a=b", "platform": ""})

    def test_configList(self):
        """server-property = ["k=v", ...] in the config file."""
        path = self.config('server-property = ["product=RabbitMQ", "version=3.10.8"]\n')
        self.assertEqual(self.parse("--config", path)["server-properties"],
                         {"product": "RabbitMQ", "version": "3.10.8"})

    def test_configTable(self):
        """A [server-properties] table in the config file; the command line wins per key."""
        path = self.config('[server-properties]\nproduct = "RabbitMQ"\nversion = "3.10.8"\n')
        s = self.parse("--config", path, "--server-property", "version=3.12.0")
        self.assertEqual(s["server-properties"], {"product": "RabbitMQ", "version": "3.12.0"})

    def test_malformed(self):
        """No '=', an empty key, or 'capabilities' is an error naming the option."""
        self.assertEqual(self.refused("--server-property", "product"),
                         "--server-property: must be KEY=VALUE, got 'product'")
        self.assertIn("--server-property: must be KEY=VALUE with a non-empty KEY",
                      self.refused("--server-property", "=RabbitMQ"))
        self.assertIn("--server-property: 'capabilities' cannot be replaced",
                      self.refused("--server-property", "capabilities=x"))

    def test_malformedInConfig(self):
        """Bad server properties in the file name the file and the key."""
        path = self.config('server-property = ["product"]\n')
        self.assertIn("config file %s: server-property: must be KEY=VALUE" % (path,),
                      self.refused("--config", path))
        path = self.config('[server-properties]\nversion = 3\n')
        self.assertIn("config file %s: server-properties: version must be a string, got 3" % (path,),
                      self.refused("--config", path))
        path = self.config('server-properties = "product=x"\n')
        self.assertIn("server-properties: must be a table", self.refused("--config", path))


class ValidationTests(_Parsing, SynchronousTestCase):
    """Every option is checked before anything starts, with one line naming it."""

    def test_queueMemoryBudget(self):
        """--queue-memory-budget takes bytes with units (8 MiB default), in the file too; junk is refused."""
        self.assertEqual(self.parse()["queue-memory-budget"], 8 * 1024 * 1024)
        self.assertEqual(self.parse("--queue-memory-budget", "64MB")["queue-memory-budget"], 64000000)
        self.assertEqual(self.parse("--queue-memory-budget", "0")["queue-memory-budget"], 0)
        path = self.config('queue-memory-budget = "2MiB"\n')
        self.assertEqual(self.parse("--config", path)["queue-memory-budget"], 2 * 1024 * 1024)
        self.assertEqual(self.refused("--queue-memory-budget", "1.5GB"),
                         "--queue-memory-budget: must be an amount of bytes like 8388608, 8MiB or 64MB, "
                         "got '1.5GB'")
        self.refused("--queue-memory-budget", "-1")
        o = tap.Options()
        o.parseOptions(["--amqp", "tcp:0", "--management", "tcp:0", "--data-dir", self.mktemp(),
                        "--queue-memory-budget", "1MiB"])
        self.assertEqual(tap.makeService(o, reactor=MemoryReactorClock()).broker.queueMemoryBudget, 1024 * 1024)

    def test_managementMaxBodySize(self):
        """--management-max-body-size takes bytes with units (20 MiB default), in the file too; 0 and junk are refused."""
        self.assertEqual(self.parse()["management-max-body-size"], 20971520)
        self.assertEqual(self.parse("--management-max-body-size", "64MB")["management-max-body-size"], 64000000)
        path = self.config("management_max_body_size = 1000000\n")
        self.assertEqual(self.parse("--config", path)["management-max-body-size"], 1000000)
        wanted = "must be a number of bytes of at least 1, optionally with a unit (20971520, 20MiB, 64MB), got "
        self.assertEqual(self.refused("--management-max-body-size", "0"),
                         "--management-max-body-size: " + wanted + "'0'")
        self.assertEqual(self.refused("--management-max-body-size", "big"),
                         "--management-max-body-size: " + wanted + "'big'")
        path = self.config("management-max-body-size = -1\n")
        self.assertEqual(self.refused("--config", path),
                         "config file %s: management-max-body-size: %s-1" % (path, wanted))
        o = tap.Options()
        o.parseOptions(["--amqp", "tcp:0", "--management", "tcp:0", "--data-dir", self.mktemp(),
                        "--management-max-body-size", "1MiB"])
        svc = tap.makeService(o, reactor=MemoryReactorClock())
        site = svc.managementServices[0].factory
        self.assertEqual(site.maxBodySize, 1024 * 1024)

    def test_heartbeat(self):
        """--heartbeat -5 / abc / 70000 are refused; heartbeat = "abc" in the file too."""
        self.assertEqual(self.refused("--heartbeat", "-5"),
                         "--heartbeat: must be an integer from 0 to 65535, got '-5'")
        self.assertEqual(self.refused("--heartbeat", "abc"),
                         "--heartbeat: must be an integer from 0 to 65535, got 'abc'")
        self.refused("--heartbeat", "70000")
        path = self.config('heartbeat = "abc"\n')
        self.assertEqual(self.refused("--config", path),
                         "config file %s: heartbeat: must be an integer from 0 to 65535, got 'abc'" % (path,))

    def test_configTypesAreStrict(self):
        """A quoted number, a bool or a float where an integer belongs is refused in the file."""
        for text in ('heartbeat = "30"\n', "heartbeat = true\n", "channel-max = 1.5\n",
                     'handshake-timeout = "10"\n', "default-user = 5\n", "data-dir = 5\n",
                     "loopback-users = 5\n"):
            path = self.config(text)
            key = text.split("=")[0].strip()
            self.assertIn("config file %s: %s: must be" % (path, key), self.refused("--config", path))

    def test_ranges(self):
        """frame-max, channel-max, handshake-timeout and consumer-timeout ranges."""
        self.assertEqual(self.refused("--frame-max", "4095"),
                         "--frame-max: must be an integer from 4096 to 4294967295, got '4095'")
        self.assertIn("--channel-max: must be an integer from 0 to 65535", self.refused("--channel-max", "65536"))
        self.assertEqual(self.refused("--handshake-timeout", "-1"),
                         "--handshake-timeout: must be a non-negative number of seconds, got '-1'")
        self.assertIn("--handshake-timeout", self.refused("--handshake-timeout", "nan"))
        self.assertEqual(self.refused("--consumer-timeout", "-1"),
                         "--consumer-timeout: must be a non-negative integer, got '-1'")
        path = self.config("frame-max = 0\n")
        self.assertIn("frame-max: must be an integer from 4096", self.refused("--config", path))

    def test_amqpNotAString(self):
        """amqp = 5672 in the file is refused: endpoints are strings."""
        path = self.config("amqp = 5672\n")
        self.assertIn("config file %s: amqp: must be an endpoint string or a list of them" % (path,),
                      self.refused("--config", path))
        path = self.config("management = [15672]\n")
        self.assertIn("management: must be an endpoint string like 'tcp:5672', got 15672",
                      self.refused("--config", path))

    def test_badEndpoints(self):
        """Endpoint strings are parsed (not listened on) at once; the error names the string."""
        self.assertEqual(self.refused("--amqp", "tcp:abc"),
                         "--amqp: invalid endpoint 'tcp:abc': invalid literal for int() with base 10: 'abc'")
        self.assertIn("Unknown endpoint type: 'nope'", self.refused("--amqp", "nope:5672"))
        self.assertIn("port must be from 0 to 65535, got 70000", self.refused("--management", "tcp:70000"))
        self.assertIn("unknown parameter 'colour'", self.refused("--amqp", "tcp:5672:colour=blue"))
        text = self.refused("--amqp", "ssl:5671:privateKey=/nonexistent/key.pem")
        self.assertTrue(text.startswith("--amqp: invalid endpoint 'ssl:5671:privateKey=/nonexistent/key.pem'"), text)
        self.assertIn("--amqp: must be an endpoint string", self.refused("--amqp", ""))

    def test_goodEndpoints(self):
        """Valid endpoint strings pass unchanged."""
        s = self.parse("--amqp", "tcp:5672:interface=127.0.0.1", "--amqp", "tcp6:5672:interface=\\:\\:1",
                       "--management", "unix:/tmp/otter.sock")
        self.assertEqual(s["amqp"], ["tcp:5672:interface=127.0.0.1", "tcp6:5672:interface=\\:\\:1"])

    def test_dataDir(self):
        """A data dir that is a file, or under a file, is refused naming --data-dir."""
        path = self.config("")
        self.assertEqual(self.refused("--data-dir", path), "--data-dir: %r is not a directory" % (path,))
        self.assertIn("--data-dir: cannot create", self.refused("--data-dir", os.path.join(path, "sub")))
        self.assertEqual(self.parse("--data-dir", self.mktemp())["data-dir"].count("temp"), 1)

    def test_policies(self):
        """Bad [[policies]] entries are refused naming the file and the policy."""
        path = self.config('[[policies]]\nname = "p"\npattern = "^x"\ndefinition = {max-priority = 5}\n')
        self.assertIn("config file %s: policies: invalid policy 'p':" % (path,), self.refused("--config", path))
        path = self.config('[[policies]]\nname = "p"\npattern = "^x"\n')
        self.assertIn("policy 'p' lacks 'definition'", self.refused("--config", path))
        path = self.config('[[policies]]\nname = "p"\npattern = "^x"\ndefinition = {}\npriority = "1"\n')
        self.assertIn("policy 'p': priority must be an integer, got '1'", self.refused("--config", path))
        path = self.config('[[policies]]\nname = "p"\npattern = "^x"\ndefinition = {}\ncolour = 1\n')
        self.assertIn("policy 'p': unknown key 'colour'", self.refused("--config", path))
        path = self.config('policies = "p"\n')
        self.assertIn("policies: must be [[policies]] tables", self.refused("--config", path))

    def test_sameKeyTwice(self):
        """frame-max and frame_max in one file is an error, not a silent pick."""
        path = self.config("frame-max = 8192\nframe_max = 4096\n")
        self.assertIn("frame-max is given twice", self.refused("--config", path))


class MemoryHighWatermarkTests(_Parsing, SynchronousTestCase):
    """memory-high-watermark takes RabbitMQ's relative and absolute forms."""

    def test_units(self):
        """k/K/KiB, M/MiB, G/GiB are powers of 1024; kB/KB, MB, GB powers of 1000 (RabbitMQ's rule)."""
        cases = {
            "1073741824": 1073741824, "0": 0, "1k": 1024, "1K": 1024, "1KiB": 1024, "2kiB": 2048,
            "1kB": 1000, "1KB": 1000, "1M": 1024 ** 2, "1MiB": 1024 ** 2, "1MB": 1000 ** 2,
            "1mb": 1000 ** 2, "1G": 1024 ** 3, "1GiB": 1024 ** 3, "1GB": 1000 ** 3, "2gb": 2 * 1000 ** 3,
            "512MiB": 512 * 1024 ** 2,
        }
        for text, expected in cases.items():
            self.assertEqual(tap.parseMemoryHighWatermark(text), ("absolute", expected), text)
            self.assertEqual(self.parse("--memory-high-watermark", text)["memory-high-watermark"], expected)

    def test_fraction(self):
        """0.4 or "0.4" is a fraction of RAM, like vm_memory_high_watermark.relative."""
        self.assertEqual(tap.parseMemoryHighWatermark("0.4"), ("relative", 0.4))
        self.assertEqual(tap.parseMemoryHighWatermark(0.4), ("relative", 0.4))
        self.assertEqual(tap.parseMemoryHighWatermark("1.0"), ("relative", 1.0))
        ram = defaultHighWatermark(1.0)
        if ram is None:
            self.skipTest("the RAM size is unknown here")
        self.assertEqual(self.parse("--memory-high-watermark", "0.5")["memory-high-watermark"],
                         defaultHighWatermark(0.5))

    def test_config(self):
        """In the file: an integer is bytes, a float a fraction, a string any form."""
        self.assertEqual(self.parse("--config", self.config("memory-high-watermark = 1_073_741_824\n"))
                         ["memory-high-watermark"], 1073741824)
        self.assertEqual(self.parse("--config", self.config('memory_high_watermark = "1GB"\n'))
                         ["memory-high-watermark"], 1000 ** 3)

    def test_invalid(self):
        """'lots', 1.5, -1, '1.5GB', '1 GB' and true are refused naming the option."""
        for text in ("lots", "1.5", "-1", "1.5GB", "1 GB", "1TB", ""):
            self.assertTrue(self.refused("--memory-high-watermark", text).startswith(
                "--memory-high-watermark: must be a fraction of RAM from 0 to 1 (0.4), a number of bytes"), text)
        for value in ("1.5", "-1", "true", '"lots"'):
            path = self.config("memory-high-watermark = %s\n" % (value,))
            self.assertIn("config file %s: memory-high-watermark: must be" % (path,), self.refused("--config", path))


class _FakeTwistd(usage.Options):
    """A parent like twistd's ServerOptions, with ottermq as its only subcommand."""

    synopsis = "Usage: twistd [options]"
    subCommands = [["ottermq", None, tap.Options, "otter_tx"]]


class SubcommandTests(SynchronousTestCase):
    """Run as twistd's subcommand, errors are one line on stderr and exit status 64."""

    def setUp(self):
        self.stderr = io.StringIO()
        self.patch(sys, "stderr", self.stderr)

    def test_oneLineError(self):
        """A bad value prints 'ottermq: --heartbeat: ...' and nothing else; SystemExit(64)."""
        e = self.assertRaises(SystemExit, _FakeTwistd().parseOptions, ["ottermq", "--heartbeat", "-5"])
        self.assertEqual(e.code, tap.EX_USAGE)
        self.assertEqual(self.stderr.getvalue(),
                         "ottermq: --heartbeat: must be an integer from 0 to 65535, got '-5'\n")

    def test_unknownOption(self):
        """An unknown option is named with the close match and where to look."""
        e = self.assertRaises(SystemExit, _FakeTwistd().parseOptions, ["ottermq", "--hartbeat", "5"])
        self.assertEqual(e.code, tap.EX_USAGE)
        self.assertEqual(self.stderr.getvalue(),
                         "ottermq: --hartbeat: no such option (did you mean --heartbeat?); "
                         "'twistd ottermq --help' lists them\n")

    def test_twistdOptionAfterOttermq(self):
        """twistd's own option after 'ottermq' says that twistd's options go before it."""
        from twisted.scripts.twistd import ServerOptions

        for argv, name in ((["ottermq", "-n"], "-n"), (["ottermq", "--pidfile", "x.pid"], "--pidfile"),
                           (["ottermq", "--nodaemon"], "--nodaemon")):
            self.stderr.truncate(0)
            self.stderr.seek(0)
            e = self.assertRaises(SystemExit, ServerOptions().parseOptions, argv)
            self.assertEqual(e.code, tap.EX_USAGE)
            self.assertEqual(self.stderr.getvalue(),
                             "ottermq: %s: no such option of ottermq; twistd's own options go before "
                             "'ottermq' (twistd %s ottermq ...)\n" % (name, name))

    def test_version(self):
        """'twistd -n ottermq --version' prints otter_tx's version, not Twisted's, and exits 0."""
        from twisted.scripts.twistd import ServerOptions

        from otter_tx import __version__

        stdout = io.StringIO()
        self.patch(sys, "stdout", stdout)
        e = self.assertRaises(SystemExit, ServerOptions().parseOptions, ["-n", "ottermq", "--version"])
        self.assertEqual(e.code, 0)
        self.assertTrue(stdout.getvalue().startswith("otter_tx %s (Twisted " % (__version__,)),
                        stdout.getvalue())

    def test_synopsis(self):
        """The usage line reads 'Usage: twistd [options] ottermq [options]'."""
        parent = _FakeTwistd()
        parent.parseOptions(["ottermq", "--amqp", "tcp:0"])
        self.assertEqual(parent.subOptions.getSynopsis(), "Usage: twistd [options] ottermq [options]")

    def test_realTwistdSynopsis(self):
        """With twistd's own ServerOptions the --help text starts with one natural usage line."""
        from twisted.scripts.twistd import ServerOptions

        stdout = io.StringIO()
        self.patch(sys, "stdout", stdout)
        self.patch(sys, "argv", ["twistd"])
        e = self.assertRaises(SystemExit, ServerOptions().parseOptions, ["ottermq", "--help"])
        self.assertEqual(e.code, 0)
        first = stdout.getvalue().splitlines()[0]
        self.assertEqual(first, "Usage: twistd [options] ottermq [options]")


class CertificateLoginOptionTests(_Parsing, SynchronousTestCase):
    """ssl-cert-login-from / -san-type / -san-index, RabbitMQ's ssl_cert_login_* keys, CLI and TOML."""

    def test_defaults(self):
        """RabbitMQ's defaults: the distinguished name; SAN type dns, index 0."""
        s = self.parse()
        self.assertEqual((s["ssl-cert-login-from"], s["ssl-cert-login-san-type"], s["ssl-cert-login-san-index"]),
                         ("distinguished_name", "dns", 0))

    def test_values(self):
        """The command line and the TOML file's RabbitMQ spellings reach the service's factory."""
        s = self.parse("--ssl-cert-login-from", "subject_alternative_name", "--ssl-cert-login-san-type", "email",
                       "--ssl-cert-login-san-index", "2")
        self.assertEqual((s["ssl-cert-login-from"], s["ssl-cert-login-san-type"], s["ssl-cert-login-san-index"]),
                         ("subject_alternative_name", "email", 2))
        path = self.config('ssl_cert_login_from = "common_name"\n')
        o = tap.Options()
        o.parseOptions(["--config", path, "--amqp", "tcp:0", "--management", "tcp:0", "--prometheus", "none",
                        "--data-dir", self.mktemp()])
        svc = tap.makeService(o, MemoryReactorClock())
        self.assertEqual(svc.factory.certificateLogin.loginFrom, "common_name")

    def test_bad(self):
        """A bad value is one line naming the option or the file's key."""
        self.assertEqual(self.refused("--ssl-cert-login-from", "cn"),
                         "--ssl-cert-login-from: must be one of distinguished_name, common_name, "
                         "subject_alternative_name, subject_alt_name, got 'cn'")
        self.assertIn("--ssl-cert-login-san-index: must be a non-negative integer",
                      self.refused("--ssl-cert-login-san-index", "-1"))
        path = self.config('ssl_cert_login_san_type = "dn"\n')
        self.assertEqual(self.refused("--config", path),
                         "config file %s: ssl-cert-login-san-type: must be one of dns, ip, email, uri, "
                         "other_name, got 'dn'" % (path,))


class DiskFreeLimitTests(_Parsing, SynchronousTestCase):
    """disk-free-limit takes RabbitMQ's absolute and relative forms (disk_free_limit)."""

    def test_default(self):
        """Without the option the limit is RabbitMQ's 50 MB."""
        self.assertEqual(self.parse()["disk-free-limit"], 50000000)

    def test_units(self):
        """Amounts use RabbitMQ's units: 50MB is 50000000 bytes, 1GiB 1073741824."""
        for text, expected in {"50MB": 50 * 1000 ** 2, "2GB": 2 * 1000 ** 3, "1GiB": 1024 ** 3,
                               "123": 123, "0": 0, "512M": 512 * 1024 ** 2}.items():
            self.assertEqual(tap.parseDiskFreeLimit(text), ("absolute", expected), text)
            self.assertEqual(self.parse("--disk-free-limit", text)["disk-free-limit"], expected)

    def test_relative(self):
        """mem_relative:1.5 (and {mem_relative, 1.5}) is 1.5 times RAM, like disk_free_limit.relative."""
        for text in ("mem_relative:1.5", "relative:1.5", "{mem_relative, 1.5}", "mem_relative=1.5"):
            self.assertEqual(tap.parseDiskFreeLimit(text), ("relative", 1.5), text)
        ram = defaultHighWatermark(1.0)
        if ram is None:
            self.skipTest("the RAM size is unknown here")
        self.assertEqual(self.parse("--disk-free-limit", "mem_relative:2")["disk-free-limit"], 2 * ram)

    def test_config(self):
        """In the file: an integer is bytes, a string any form, {relative = x} / {absolute = y} the conf keys."""
        cases = {"disk-free-limit = 1_000_000\n": 1000000, 'disk_free_limit = "2GB"\n': 2 * 1000 ** 3,
                 'disk-free-limit = {absolute = "1GiB"}\n': 1024 ** 3}
        for text, expected in cases.items():
            self.assertEqual(self.parse("--config", self.config(text))["disk-free-limit"], expected, text)
        ram = defaultHighWatermark(1.0)
        if ram is not None:
            self.assertEqual(self.parse("--config", self.config("disk-free-limit = {relative = 1.0}\n"))
                             ["disk-free-limit"], ram)

    def test_invalid(self):
        """Bad values are refused naming the option: 'lots', -1, 2.5GB, 1TB, a float, a bad table."""
        for text in ("lots", "-1", "2.5GB", "1TB", "", "mem_relative:", "mem_relative:x"):
            self.assertTrue(self.refused("--disk-free-limit", text).startswith(
                "--disk-free-limit: must be an amount of bytes (50000000, 50MB, 2GB, 1GiB) or a multiple of RAM"),
                text)
        for value in ("1.5", "-1", "true", '{relative = "x"}', "{relative = 1, absolute = 2}"):
            path = self.config("disk-free-limit = %s\n" % (value,))
            self.assertIn("config file %s: disk-free-limit: must be" % (path,), self.refused("--config", path))

    def test_makeService(self):
        """makeService watches the data directory's filesystem with the limit."""
        o = tap.Options()
        dataDir = self.mktemp()
        o.parseOptions(["--amqp", "tcp:0", "--data-dir", dataDir, "--disk-free-limit", "2GB"])
        svc = tap.makeService(o, reactor=MemoryReactorClock())
        self.assertEqual(svc.diskMonitor.limit, 2 * 1000 ** 3)
        self.assertEqual(svc.diskMonitor.path, os.path.abspath(dataDir))
        self.assertIs(svc.broker.alarms.monitors["disk"], svc.diskMonitor)
