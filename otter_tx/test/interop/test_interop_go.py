"""
Interop tests with rabbitmq/amqp091-go (Debian's golang-github-rabbitmq-amqp091-go-dev,
built with Debian's Go in GOPATH mode): the Go snippets of the OtterMQ TTL
note (seeds), confirms, returns and errors.  The scenarios live in
``otter_tx/test/interop/go/scenario.go`` and print JSON.
"""

import json
import os
import shutil
import tempfile

from twisted.internet import defer, utils
from twisted.trial.unittest import SkipTest

from otter_tx.test.interop.support import InteropTestCase

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go")
GOPATH = "/usr/share/gocode"
_binary = None


def goMissing():
    """None when Debian's Go and amqp091-go are installed, else the skip reason naming the packages."""
    if shutil.which("go") is None:
        return "Go is not installed: apt-get install golang-go golang-github-rabbitmq-amqp091-go-dev"
    if not os.path.isdir(os.path.join(GOPATH, "src/github.com/rabbitmq/amqp091-go")):
        return "amqp091-go is not installed: apt-get install golang-github-rabbitmq-amqp091-go-dev"
    return None


@defer.inlineCallbacks
def _build():
    """Build the scenario binary once per test process."""
    global _binary
    if _binary is not None:
        return _binary
    reason = goMissing()
    if reason is not None:
        raise SkipTest(reason)
    go = shutil.which("go")
    out = tempfile.mkdtemp(prefix="otter-go-")
    env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH, GOCACHE=os.path.join(out, "cache"),
               HOME=out)
    stdout, stderr, code = yield utils.getProcessOutputAndValue(
        go, ["build", "-o", os.path.join(out, "scenario"), "scenario.go"], env=env, path=HERE)
    if code != 0:
        raise RuntimeError("go build failed:\n" + stderr.decode())
    _binary = os.path.join(out, "scenario")
    return _binary


class Amqp091GoTests(InteropTestCase):
    """amqp091-go scenarios."""

    timeout = 120

    def setUp(self):
        reason = goMissing()
        if reason is not None:
            raise SkipTest(reason)
        return InteropTestCase.setUp(self)

    @defer.inlineCallbacks
    def scenario(self, name):
        binary = yield _build()
        stdout, stderr, code = yield self.runProcess(binary, [name])
        self.assertEqual(code, 0, stdout + stderr)
        return json.loads(stdout.decode().strip().splitlines()[-1])

    @defer.inlineCallbacks
    def test_seedDeadLetterExample(self):
        """The seed's TTL + DLX Go example: the expired message reaches the DLQ with RabbitMQ's x-death types."""
        r = yield self.scenario("seed-dead-letter")
        self.assertEqual(r["body"], "Will expire and go to DLQ")
        self.assertEqual((r["reason"], r["queue"], r["count"]), ("expired", True, 1))
        self.assertTrue(r["countIsInt64"])
        self.assertTrue(r["timeIsTimestamp"])
        self.assertEqual(len(r["routingKeys"]), 1)
        self.assertTrue(r["routingKeys"][0].startswith("my-queue-go-"))
        self.assertEqual((r["exchange"], r["routingKey"], r["firstDeathReason"]), (True, "expired", "expired"))

    @defer.inlineCallbacks
    def test_perMessageExpiration(self):
        """The seed's Expiration example: the message with Expiration expires, the other stays."""
        r = yield self.scenario("per-message-ttl")
        self.assertEqual(r, {"first": "stays", "got": True, "more": False})

    @defer.inlineCallbacks
    def test_queueTTLInt32Argument(self):
        """x-message-ttl sent as int32 (the seed's queue TTL example) expires messages."""
        r = yield self.scenario("queue-ttl-argument")
        self.assertEqual(r, {"messages": 0})

    @defer.inlineCallbacks
    def test_confirmsAndReturns(self):
        """Confirms ack in order, a mandatory unroutable publish returns 312 NO_ROUTE, headers round-trip."""
        r = yield self.scenario("confirms-returns")
        self.assertEqual(r["acks"], [True, True])
        self.assertEqual(r["tags"], [1, 2])
        self.assertEqual((r["returnCode"], r["returnText"], r["returned"]), (312, "NO_ROUTE", "bounce"))
        self.assertEqual((r["body"], r["deliveryMode"]), ("hello", 2))
        self.assertEqual(r["headers"], {"b": True, "f": 1.5, "i": 7, "s": "str"})

    @defer.inlineCallbacks
    def test_passiveDeclareNotFound(self):
        """A passive declare of a missing queue is a server-sent 404 with RabbitMQ's text."""
        r = yield self.scenario("not-found")
        self.assertEqual(r, {"code": 404, "reason": True, "server": True})
