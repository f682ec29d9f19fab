"""
Public test helpers: start a real otter_tx broker in-process on ``tcp:0``.
"""

import tempfile

from twisted.internet.defer import Deferred, inlineCallbacks, returnValue
from zope.interface import implementer

from otter_tx.broker.interfaces import IClientConnection, IConnectionInfo, ISessionClient
from otter_tx.door.tls import certificateInfo
from otter_tx.service.assembly import OtterService


class BrokerFixture:
    """
    A running broker: ``amqpPort`` (int, the first AMQP listener's port),
    ``amqpPorts`` (list of int, one per AMQP listener in the order given to
    :func:`startBroker`), ``service`` (OtterService), ``broker`` (Broker);
    ``managementPort`` / ``prometheusPort`` / ``streamPort`` (int, or None
    without that listener); ``stop()`` returns a Deferred.
    """

    streamPort = None

    def __init__(self, service, amqpPort, managementPort=None, amqpPorts=None, prometheusPort=None):
        self.service = service
        self.broker = service.broker
        self.amqpPort = amqpPort
        self.managementPort = managementPort
        self.prometheusPort = prometheusPort
        self.amqpPorts = list(amqpPorts) if amqpPorts is not None else [amqpPort]

    def stop(self):
        """Stop the broker; a Deferred that fires once the store is closed."""
        return self.service.stopService()


@inlineCallbacks
def startBroker(reactor, management=False, dataDir=None, amqp=None, prometheus=False, stream=False,
                **options):
    """
    Start OtterService on 127.0.0.1 port 0; fires with a :class:`BrokerFixture`.
    ``options`` are OtterService keyword arguments (heartbeat (seconds), frameMax,
    channelMax, handshakeTimeout (seconds), consumerTimeout (ms),
    memoryHighWatermark, defaultUser, defaultPass, policies ...).

    ``amqp`` replaces the default AMQP listener (``tcp:0:interface=127.0.0.1``):
    a list whose items are Twisted endpoint strings (``ssl:0:interface=
    127.0.0.1:privateKey=...``, given to OtterService as ``--amqp`` would) or
    ``IStreamServerEndpoint`` objects (for example an ``SSL4ServerEndpoint``
    with ``CertificateOptions`` that require client certificates, which no
    endpoint string can say; docs/tls.md).  An object is served by the
    service's AMQP factory from a ``StreamServerEndpointService`` added to the
    service, as an embedder would do it.  The fixture's ``amqpPorts`` follow
    the order of ``amqp``.

    ``prometheus=True`` adds the Prometheus listener on
    ``tcp:0:interface=127.0.0.1``; its port is the fixture's ``prometheusPort``.
    ``stream=True`` adds the stream protocol listener likewise (``streamPort``);
    a list of endpoint strings (``ottertls:0:...``) listens there instead,
    ``streamPort`` the first one's.
    """
    from twisted.application.internet import StreamServerEndpointService

    if dataDir is None:
        dataDir = tempfile.mkdtemp(prefix="ottermq-test-")
    if amqp is None:
        amqp = ["tcp:0:interface=127.0.0.1"]
    svc = OtterService(
        amqp=[a for a in amqp if isinstance(a, str)],
        management=["tcp:0:interface=127.0.0.1"] if management else [],
        prometheus=["tcp:0:interface=127.0.0.1"] if prometheus else [],
        stream=list(stream) if isinstance(stream, (list, tuple)) else ["tcp:0:interface=127.0.0.1"] if stream else [],
        reactor=reactor,
        dataDir=dataDir,
        **options
    )
    named = iter(svc.amqpServices)
    listeners = []
    for a in amqp:
        if isinstance(a, str):
            listeners.append(next(named))
        else:
            extra = StreamServerEndpointService(a, svc.factory)
            extra.setServiceParent(svc)
            listeners.append(extra)
    svc.startService()
    ports = yield svc.listeningPorts(listeners)
    mport = None
    if management:
        mports = yield svc.listeningPorts(svc.managementServices)
        mport = mports[0].getHost().port
    pport = None
    if prometheus:
        pports = yield svc.listeningPorts(svc.prometheusServices)
        pport = pports[0].getHost().port
    amqpPorts = [p.getHost().port for p in ports]
    fixture = BrokerFixture(svc, amqpPorts[0] if amqpPorts else None, mport, amqpPorts, pport)
    if stream:
        sports = yield svc.listeningPorts(svc.streamServices)
        fixture.streamPort = sports[0].getHost().port
    returnValue(fixture)


class FakeClient:
    """
    Drive one :class:`~otter_tx.door.protocol.AMQPServerProtocol` in memory
    (``StringTransport`` + ``task.Clock``) for deterministic unit tests.

    ``send(channel, method)`` / ``publish(...)`` feed frames in;
    ``received()`` decodes everything the server wrote since the last call
    into ``(channel, method, message)`` tuples (``message`` is a
    ``(propsDict, body)`` pair for content-bearing methods, else None).
    Decoding is the wire engine in the client role
    (:class:`otter_tx.amqp.engine.ConnectionEngine`), the same code the
    server runs.
    """

    def __init__(self, factory, handshake=True, peerHost="127.0.0.1", vhost="/",
                 user="guest", password="guest", capabilities=None):
        from twisted.internet.address import IPv4Address
        from twisted.internet.testing import StringTransport

        from otter_tx.amqp import spec
        from otter_tx.amqp.engine import CLIENT, ConnectionEngine

        self.spec = spec
        self.factory = factory
        # accepts whatever the server sends (frame_max is the server's to enforce)
        self.engine = ConnectionEngine(CLIENT, frameMax=2 ** 32 - 1)
        self.transport = StringTransport(
            peerAddress=IPv4Address("TCP", peerHost, 40000),
        )
        self.protocol = factory.buildProtocol(None)
        self.protocol.makeConnection(self.transport)
        if handshake:
            self.handshake(vhost, user, password, capabilities)

    def handshake(self, vhost="/", user="guest", password="guest", capabilities=None):
        """Header, start-ok (PLAIN), tune-ok (no heartbeat), open; returns what came back."""
        spec = self.spec
        caps = capabilities if capabilities is not None else {
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "publisher_confirms": True,
        }
        self.feed(spec.PROTOCOL_HEADER)
        self.send(0, spec.ConnectionStartOk({"capabilities": caps}, "PLAIN",
                                           b"\0" + user.encode() + b"\0" + password.encode(), "en_US"))
        self.send(0, spec.ConnectionTuneOk(2047, 131072, 0))
        self.send(0, spec.ConnectionOpen(vhost, "", False))
        return self.received()

    def feed(self, data):
        """Hand raw bytes to the protocol."""
        self.protocol.dataReceived(data)

    def send(self, channel, method):
        """Send one method frame."""
        self.feed(self.engine.method(channel, method))

    def publish(self, channel, exchange, routingKey, body=b"", props=None, mandatory=False,
                frameMax=131072):
        """Send basic.publish with a content header and body frames (split by ``frameMax``)."""
        from otter_tx.amqp.codec import encodeProperties

        engine = self.engine
        engine.frameMax = frameMax
        self.feed(engine.publish(channel, exchange, routingKey, encodeProperties(props or {}), body, mandatory))

    def openChannel(self, channel=1):
        """channel.open; returns what came back."""
        self.send(channel, self.spec.ChannelOpen(""))
        return self.received()

    def received(self):
        """Decode and return the frames written since the last call."""
        from otter_tx.amqp import engine as wire
        from otter_tx.amqp.codec import decodeProperties

        engine = self.engine
        engine.receiveData(self.transport.value())
        self.transport.clear()
        out = []
        while True:
            event = engine.nextEvent()
            if event is None:
                return out
            kind = event[0]
            if kind is wire.METHOD:
                out.append((event[1], event[2], None))
            elif kind is wire.CONTENT:
                out.append((event[1], event[2], (decodeProperties(event[3], 0), event[4])))
            elif kind is wire.HEARTBEAT:
                out.append((event[1], "heartbeat", None))
            elif kind is wire.PROTOCOL_HEADER:
                out.append((None, "header", event[1]))

    def methods(self):
        """Just the method objects received since the last call."""
        return [m for _, m, _ in self.received()]


def journaledBroker(store, clock, **brokerOptions):
    """
    A Broker rebuilt from ``store`` (which must open synchronously, like
    ``MemoryStore``) with its durability journal attached, as
    ``OtterService.startService`` does it: a deterministic restart for tests.
    ``brokerOptions`` go to :class:`~otter_tx.broker.broker.Broker`
    (``queueMemoryBudget``, ``pagingDirectory``, ...).
    """
    from otter_tx.broker.broker import Broker

    broker = Broker(clock, **brokerOptions)
    result = []
    store.open().addCallback(result.append)
    if not result:
        raise RuntimeError("journaledBroker needs a store that opens synchronously")
    broker.attachJournal(store, result[0])
    return broker


@implementer(IClientConnection, IConnectionInfo, ISessionClient)
class FakeConnection:
    """
    A client connection as the broker core sees it, recording what the core
    asks of it:

    - as an :class:`~otter_tx.broker.interfaces.IClientConnection`:
      ``closes`` (list of ``(code, text)``), ``alarms`` (list of bool),
      ``ackTimeoutChecks`` (list of ``(limitSeconds, timeoutMs)``); put it in
      ``broker.connections`` to stand in for a protocol;
    - as an :class:`~otter_tx.broker.interfaces.IConnectionInfo`: what the
      management views list (plain attributes, set them as needed);
    - as a Session's :class:`~otter_tx.broker.interfaces.ISessionClient`:
      ``outcomes``, a list of ``(call, number, ...)`` tuples in call order:
      ``("delivered", number, consumerTag, deliveryTag, redelivered,
      message)``, ``("returned", number, replyCode, replyText, message)``,
      ``("confirmed", number, confirms)``, ``("consumerCancelled", number,
      consumerTag)``, ``("channelFailed", number, error)``,
      ``("connectionFailed", code, text)``; ``noted`` lists the sessions
      that had confirms pending (call their ``flushConfirms()`` to send
      them).  Set ``paused`` to back its output up.
    """

    def __init__(self, name="127.0.0.1:50000 -> 127.0.0.1:5672", user=None, vhost=None):
        self.name = name
        self.user = user
        self.vhost = vhost
        self.paused = False
        self.flowState = "running"
        self.exclusiveQueues = set()
        self.closes = []
        self.alarms = []
        self.ackTimeoutChecks = []
        self.outcomes = []
        self.noted = []
        self._closed = Deferred()
        # what the management views read
        self.peer = None
        self.local = None
        self.ssl = False
        self.authMechanism = "PLAIN"
        self.peerCertificateInfo = certificateInfo(None)
        self.channels = {}
        self.clientProperties = {}
        self.connectedAt = 0.0
        self.channelMax = 2047
        self.frameMax = 131072
        self.heartbeat = 0
        self.flows = []
        self.bytesIn = 0
        self.bytesOut = 0
        self.recvCount = 0
        self.sendCount = 0

    # --- IClientConnection ---------------------------------------------------

    def close(self, code, text):
        """Record the close; :meth:`whenClosed` fires."""
        self.closes.append((code, text))
        if not self._closed.called:
            self._closed.callback(None)

    def alarmChanged(self, alarmed):
        """Record the alarm state; ``flowState`` follows (``blocking`` while alarmed)."""
        self.alarms.append(alarmed)
        self.flowState = "blocking" if alarmed else "running"

    def flowChanged(self, flowing):
        """Record the cluster link flow state; ``flowState`` follows (``flow`` while on)."""
        self.flows.append(flowing)
        self.flowState = "flow" if flowing else "running"

    def whenClosed(self):
        """A Deferred that fires once :meth:`close` was called."""
        d = Deferred()
        self._closed.addBoth(lambda r: d.callback(None) or r)
        return d

    def checkAckTimeout(self, limitSeconds, timeoutMs):
        """Record the check (a fake has no channels to close)."""
        self.ackTimeoutChecks.append((limitSeconds, timeoutMs))

    # --- ISessionClient ------------------------------------------------------

    def delivered(self, number, consumer, deliveryTag, redelivered, message):
        """Record the delivery (with the consumer's tag)."""
        self.outcomes.append(("delivered", number, consumer.tag, deliveryTag, redelivered, message))

    def returned(self, number, replyCode, replyText, message):
        """Record the return."""
        self.outcomes.append(("returned", number, replyCode, replyText, message))

    def confirmed(self, number, confirms):
        """Record the confirms (a list of ``(seq, ok)``)."""
        self.outcomes.append(("confirmed", number, list(confirms)))

    def noteConfirms(self, session):
        """Record the session with confirms pending (nothing is flushed)."""
        self.noted.append(session)

    def consumerCancelled(self, number, consumerTag):
        """Record the cancel."""
        self.outcomes.append(("consumerCancelled", number, consumerTag))

    def channelFailed(self, number, error):
        """Record the failure (the session is not closed: a test does it if it needs to)."""
        self.outcomes.append(("channelFailed", number, error))

    def connectionFailed(self, code, text):
        """Record the failure, and close as :meth:`close` does."""
        self.outcomes.append(("connectionFailed", code, text))
        self.close(code, text)
