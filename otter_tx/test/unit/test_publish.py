"""
Unit tests for otter_tx.broker.publish, the one publish pipeline: the
exchange checks, the property rules and routing, on a Broker with a
task.Clock.
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp.codec import encodeProperties
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker import publish
from otter_tx.broker.access import Access
from otter_tx.broker.broker import Broker
from otter_tx.broker.message import Message
from otter_tx.broker.replyto import ReplyToQueue


def _message(props, key="q"):
    return Message("", key, encodeProperties(props), b"body", props)


class TargetTests(SynchronousTestCase):
    """publishTarget: write permission, 404, internal 403."""

    def setUp(self):
        self.broker = Broker(Clock())
        self.vh = self.broker.vhosts["/"]
        self.broker.addUser("u", "pw")
        self.broker.setPermissions("u", "/", "", "^(amq\\.default|ix)$", "")
        self.access = Access(self.broker, "u", "/")

    def error(self, name):
        e = self.assertRaises(AMQPError, publish.publishTarget, self.vh, self.access, name)
        return e.code, e.text

    def test_checks(self):
        """Write permission first, then the exchange must exist and not be internal."""
        self.assertIs(publish.publishTarget(self.vh, self.access, ""), self.vh.exchanges[""])
        self.assertEqual(self.error("amq.direct"),
                         (403, "ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'u'"))
        self.assertEqual(self.error("ix"), (404, "NOT_FOUND - no exchange 'ix' in vhost '/'"))
        self.vh.declareExchange("ix", "fanout", internal=True)
        self.assertEqual(self.error("ix"),
                         (403, "ACCESS_REFUSED - cannot publish to internal exchange 'ix' in vhost '/'"))


class PrepareTests(SynchronousTestCase):
    """prepareMessage: user_id, CC/BCC, reply-to."""

    def test_userId(self):
        """A user_id naming another user is 406; the user's own name passes."""
        publish.prepareMessage(_message({"user_id": "u"}), "u")
        e = self.assertRaises(AMQPError, publish.prepareMessage, _message({"user_id": "x"}), "u")
        self.assertEqual((e.code, e.text), (406, "PRECONDITION_FAILED - user_id property set to 'x' but "
                                                 "authenticated user was 'u'"))

    def test_senderSelected(self):
        """CC and BCC add routing keys (strings only); BCC leaves the headers and the encoded properties."""
        m = _message({"headers": {"CC": ["a", 1], "BCC": ["b"], "h": "v"}})
        publish.prepareMessage(m, "u")
        self.assertEqual(m.extraKeys, ["a", "b"])
        self.assertEqual(m.props["headers"], {"CC": ["a", 1], "h": "v"})
        self.assertEqual(m.propsRaw, encodeProperties(m.props))

    def test_replyTo(self):
        """reply_to amq.rabbitmq.reply-to needs a reply consumer (406) and becomes its address."""
        e = self.assertRaises(AMQPError, publish.prepareMessage, _message({"reply_to": "amq.rabbitmq.reply-to"}),
                              "u")
        self.assertEqual((e.code, e.text), (406, "PRECONDITION_FAILED - fast reply consumer does not exist"))
        pseudo = ReplyToQueue(Broker(Clock()).vhosts["/"])
        pseudo.consumer = object()
        m = _message({"reply_to": "amq.rabbitmq.reply-to"})
        publish.prepareMessage(m, "u", pseudo)
        self.assertEqual(m.props["reply_to"], pseudo.address)


class RouteTests(SynchronousTestCase):
    """route: the outcome."""

    def test_outcome(self):
        """Routed count, 0 when unroutable, and rejected for a reject-publish queue at its limit."""
        broker = Broker(Clock())
        vh = broker.vhosts["/"]
        vh.declareQueue("q", None)
        vh.declareQueue("full", None, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
        ex = vh.exchanges[""]
        self.assertEqual(vh.publish(ex, _message({}, "q"))[0], 1)
        self.assertEqual(vh.publish(ex, _message({}, "nowhere"))[0], 0)
        self.assertTrue(vh.publish(ex, _message({}, "full"))[1])
