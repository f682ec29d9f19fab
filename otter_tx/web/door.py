"""
The HTTP app's door onto a :class:`~otter_tx.broker.session.Session`: a
per-request stand-in for a client, so that the management API's publish,
get, purge, declares, deletes and bindings run as the authenticated user
with exactly the AMQP channel's rules, as RabbitMQ's management plugin runs
them over a channel (``rabbit_mgmt_util:with_channel`` / ``amqp_request``).

A request is a Session's client (:class:`~otter_tx.broker.interfaces.ISessionClient`)
and nothing more: it is not in ``Broker.connections``, so the core never
closes, alarms or times it out (``IClientConnection``), and the management
views never list it (``IConnectionInfo``).  Its answers come from the
Session's return values (routed, the message got, the count purged) and
its errors; the outbound calls a request cannot cause (it never consumes,
never publishes mandatory, never selects confirms or tx) raise
:class:`UnexpectedOutcome`, a bug of ours that the app answers with 500.
"""

from zope.interface import implementer

from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.interfaces import ISessionClient
from otter_tx.broker.session import Session


class UnexpectedOutcome(RuntimeError):
    """A Session sent a request an outcome no request can cause (a bug)."""


def _unexpected(what):
    raise UnexpectedOutcome("an HTTP request's session %s" % (what,))


@implementer(ISessionClient)
class HTTPRequestConnection:
    """
    One management request as a Session's client: ``user`` (User),
    ``vhost`` (VHost), ``name`` (str, for log lines); never paused.
    """

    #: flow: a request's output is never backed up
    paused = False

    def __init__(self, broker, user, vhost):
        self.broker = broker
        self.user = user
        self.vhost = vhost
        self.name = "HTTP request of user '%s'" % (user.name,)
        #: the exclusive queues it owns: always empty (the HTTP API declares
        #: no exclusive queues), kept for the vhost's bookkeeping
        self.exclusiveQueues = set()

    def channelFailed(self, number, error):
        """The request's channel failed: the request answers with ``error`` (raised)."""
        raise error

    def connectionFailed(self, code, text):
        """
        The broker failed under the request: an :class:`AMQPError` with
        ``code`` and the full reply ``text`` is raised for its answer.
        """
        raise AMQPError.fromReplyText(code, text)

    def delivered(self, number, consumer, deliveryTag, redelivered, message):
        """A request has no consumers: never called."""
        _unexpected("delivered to a consumer")

    def returned(self, number, replyCode, replyText, message):
        """A request never publishes mandatory: never called."""
        _unexpected("returned a message")

    def confirmed(self, number, confirms):
        """A request never selects confirms: never called."""
        _unexpected("confirmed publishes")

    def noteConfirms(self, session):
        """A request never selects confirms: never called."""
        _unexpected("had confirms pending")

    def consumerCancelled(self, number, consumerTag):
        """A request has no consumers: never called."""
        _unexpected("had a consumer cancelled")


def requestSession(broker, user, vhost):
    """A :class:`Session` for one HTTP request of ``user`` in ``vhost`` (VHost)."""
    return Session(broker, HTTPRequestConnection(broker, user, vhost), vhost, user,
                   stats=vhost.channelStats)
