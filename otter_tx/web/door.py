"""
The HTTP app's door onto a :class:`~otter_tx.broker.session.Session`: a
per-request stand-in for a client connection, so that the management API's
publish, get, purge, declares, deletes and bindings run as the
authenticated user with exactly the AMQP channel's rules, as RabbitMQ's
management plugin runs them over a channel
(``rabbit_mgmt_util:with_channel`` / ``amqp_request``).

Nothing is ever delivered through it: it has no consumers, never publishes
mandatory and never selects confirms, so the outbound calls do nothing.
"""

from twisted.internet.defer import succeed
from zope.interface import implementer

from otter_tx.broker.interfaces import IClientConnection
from otter_tx.broker.session import Session


@implementer(IClientConnection)
class HTTPRequestConnection:
    """
    One management request as a client connection: ``user`` (User),
    ``vhost`` (VHost); never paused or blocked.
    """

    paused = False
    flowState = "running"
    heldCancels = None
    capabilities = {}
    # the management views' attributes (IClientConnection); a request is never listed
    peer = None
    local = None
    ssl = False
    authMechanism = None
    peerCertificateInfo = {"peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None}
    channels = {}
    clientProperties = {}
    connectedAt = 0.0
    channelMax = 0
    frameMax = 0
    heartbeat = 0
    bytesIn = 0
    bytesOut = 0
    recvCount = 0
    sendCount = 0

    def __init__(self, broker, user, vhost):
        self.broker = broker
        self.user = user
        self.vhost = vhost
        self.name = "HTTP request of user '%s'" % (user.name,)
        self.exclusiveQueues = set()

    def close(self, code, text):
        """Nothing to close: the request ends by itself."""

    def checkAckTimeout(self, limitSeconds, timeoutMs):
        """Nothing is held unacknowledged past the request."""

    def alarmChanged(self, alarmed):
        """Alarms do not concern a single request."""

    def whenClosed(self):
        """Already as good as closed: a fired Deferred."""
        return succeed(None)

    def sendMethod(self, number, method):
        """No asynchronous methods reach an HTTP request."""

    def sendDeliver(self, number, consumerTagBytes, deliveryTag, redelivered, message):
        """No consumers: never called."""

    def sendReturn(self, number, replyCode, replyText, message):
        """Publishes are never mandatory: never called."""

    def sendConfirms(self, number, confirms):
        """No confirm mode: never called."""

    def noteConfirms(self, session):
        """No confirm mode: never called."""

    def closeChannel(self, number, error):
        """No deliveries, so no acknowledgement timeout."""


def requestSession(broker, user, vhost):
    """A :class:`Session` for one HTTP request of ``user`` in ``vhost`` (VHost)."""
    return Session(broker, HTTPRequestConnection(broker, user, vhost), vhost, user,
                   stats=vhost.channelStats)
