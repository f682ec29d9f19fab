"""
Public test helpers: start a real otter_tx broker in-process on ``tcp:0``.
"""

import tempfile

from twisted.internet.defer import Deferred, inlineCallbacks, returnValue
from zope.interface import implementer

from otter_tx.broker.interfaces import IClientConnection
from otter_tx.service import OtterService


class BrokerFixture:
    """
    A running broker: ``amqpPort`` (int, the first AMQP listener's port),
    ``amqpPorts`` (list of int, one per AMQP listener in the order given to
    :func:`startBroker`), ``service`` (OtterService), ``broker`` (Broker);
    ``stop()`` returns a Deferred.
    """

    def __init__(self, service, amqpPort, managementPort=None, amqpPorts=None):
        self.service = service
        self.broker = service.broker
        self.amqpPort = amqpPort
        self.managementPort = managementPort
        self.amqpPorts = list(amqpPorts) if amqpPorts is not None else [amqpPort]

    def stop(self):
        """Stop the broker; a Deferred that fires once the store is closed."""
        return self.service.stopService()


@inlineCallbacks
def startBroker(reactor, management=False, dataDir=None, amqp=None, **options):
    """
    Start OtterService on 127.0.0.1 port 0; fires with a :class:`BrokerFixture`.
    ``options`` are OtterService keyword arguments (heartbeat, frameMax,
    channelMax, handshakeTimeout, memoryHighWatermark, defaultUser,
    defaultPass, policies ...).

    ``amqp`` replaces the default AMQP listener (``tcp:0:interface=127.0.0.1``):
    a list whose items are Twisted endpoint strings (``ssl:0:interface=
    127.0.0.1:privateKey=...``, given to OtterService as ``--amqp`` would) or
    ``IStreamServerEndpoint`` objects (for example an ``SSL4ServerEndpoint``
    with ``CertificateOptions`` that require client certificates, which no
    endpoint string can say; docs/tls.md).  An object is served by the
    service's AMQP factory from a ``StreamServerEndpointService`` added to the
    service, as an embedder would do it.  The fixture's ``amqpPorts`` follow
    the order of ``amqp``.
    """
    from twisted.application.internet import StreamServerEndpointService

    if dataDir is None:
        dataDir = tempfile.mkdtemp(prefix="ottermq-test-")
    if amqp is None:
        amqp = ["tcp:0:interface=127.0.0.1"]
    svc = OtterService(
        amqp=[a for a in amqp if isinstance(a, str)],
        management=["tcp:0:interface=127.0.0.1"] if management else [],
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
    amqpPorts = [p.getHost().port for p in ports]
    returnValue(BrokerFixture(svc, amqpPorts[0] if amqpPorts else None, mport, amqpPorts))


class FakeClient:
    """
    Drive one :class:`~otter_tx.protocol.AMQPServerProtocol` in memory
    (``StringTransport`` + ``task.Clock``) for deterministic unit tests.

    ``send(channel, method)`` / ``publish(...)`` feed frames in;
    ``received()`` decodes everything the server wrote since the last call
    into ``(channel, method, message)`` tuples (``message`` is a
    ``(propsDict, body)`` pair for content-bearing methods, else None).
    """

    def __init__(self, factory, handshake=True, peerHost="127.0.0.1", vhost="/",
                 user="guest", password="guest", capabilities=None):
        from twisted.internet.address import IPv4Address
        from twisted.internet.testing import StringTransport

        from otter_tx.amqp import spec

        self.spec = spec
        self.factory = factory
        self.transport = StringTransport(
            peerAddress=IPv4Address("TCP", peerHost, 40000),
        )
        self.protocol = factory.buildProtocol(None)
        self.protocol.makeConnection(self.transport)
        self._pending = b""
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
        from otter_tx.protocol import methodFrame

        self.feed(methodFrame(channel, method))

    def publish(self, channel, exchange, routingKey, body=b"", props=None, mandatory=False,
                frameMax=131072):
        """Send basic.publish with a content header and body frames."""
        import struct

        from otter_tx.amqp.codec import encodeProperties
        from otter_tx.protocol import frame, methodFrame

        spec = self.spec
        data = [methodFrame(channel, spec.BasicPublish(0, exchange, routingKey, mandatory, False))]
        header = struct.pack("!HHQ", 60, 0, len(body)) + encodeProperties(props or {})
        data.append(frame(2, channel, header))
        chunk = frameMax - 8
        for i in range(0, len(body), chunk):
            data.append(frame(3, channel, body[i : i + chunk]))
        self.feed(b"".join(data))

    def openChannel(self, channel=1):
        """channel.open; returns what came back."""
        self.send(channel, self.spec.ChannelOpen(""))
        return self.received()

    def received(self):
        """Decode and return the frames written since the last call."""
        import struct

        from otter_tx.amqp.codec import decodeProperties

        spec = self.spec
        data = self._pending + self.transport.value()
        self.transport.clear()
        out = []
        off = 0
        current = None
        if data.startswith(b"AMQP"):
            out.append((None, "header", data[:8]))
            off = 8
        while len(data) - off >= 8:
            ftype, ch, size = struct.unpack_from("!BHI", data, off)
            if len(data) - off < size + 8:
                break
            payload = data[off + 7 : off + 7 + size]
            off += size + 8
            if ftype == 1:
                cid, mid = struct.unpack_from("!HH", payload, 0)
                m = spec.METHODS[(cid, mid)].decode(payload, 4)
                if m.CONTENT:
                    current = [ch, m, None, b"", 0]
                else:
                    out.append((ch, m, None))
            elif ftype == 2:
                size_ = struct.unpack_from("!Q", payload, 4)[0]
                current[2] = decodeProperties(payload, 12)
                current[4] = size_
                if size_ == 0:
                    out.append((current[0], current[1], (current[2], b"")))
                    current = None
            elif ftype == 3:
                current[3] += payload
                if len(current[3]) >= current[4]:
                    out.append((current[0], current[1], (current[2], current[3])))
                    current = None
            elif ftype == 8:
                out.append((ch, "heartbeat", None))
        self._pending = data[off:]
        return out

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


@implementer(IClientConnection)
class FakeConnection:
    """
    A client connection as the broker core sees it
    (:class:`~otter_tx.broker.interfaces.IClientConnection`), recording what
    the core asks of it: ``closes`` (list of ``(code, text)``), ``alarms``
    (list of bool), ``ackTimeoutChecks`` (list of ``(limitSeconds,
    timeoutMs)``).  Set ``paused`` to back its output up.  Put it in
    ``broker.connections`` to stand in for a protocol.
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
        self._closed = Deferred()

    def close(self, code, text):
        """Record the close; :meth:`whenClosed` fires."""
        self.closes.append((code, text))
        if not self._closed.called:
            self._closed.callback(None)

    def alarmChanged(self, alarmed):
        """Record the alarm state; ``flowState`` follows (``blocking`` while alarmed)."""
        self.alarms.append(alarmed)
        self.flowState = "blocking" if alarmed else "running"

    def whenClosed(self):
        """A Deferred that fires once :meth:`close` was called."""
        d = Deferred()
        self._closed.addBoth(lambda r: d.callback(None) or r)
        return d

    def checkAckTimeout(self, limitSeconds, timeoutMs):
        """Record the check (a fake has no channels to close)."""
        self.ackTimeoutChecks.append((limitSeconds, timeoutMs))
