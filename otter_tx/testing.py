"""
Public test helpers: start a real otter_tx broker in-process on ``tcp:0``.
"""

import tempfile

from twisted.internet.defer import Deferred, inlineCallbacks, returnValue

from otter_tx.service import OtterService


class BrokerFixture:
    """
    A running broker: ``amqpPort`` (int), ``service`` (OtterService),
    ``broker`` (Broker); ``stop()`` returns a Deferred.
    """

    def __init__(self, service, amqpPort, managementPort=None):
        self.service = service
        self.broker = service.broker
        self.amqpPort = amqpPort
        self.managementPort = managementPort

    def stop(self):
        return self.service.stopService()


@inlineCallbacks
def startBroker(reactor, management=False, dataDir=None, **options):
    """
    Start OtterService on 127.0.0.1 port 0; fires with a :class:`BrokerFixture`.
    ``options`` are OtterService keyword arguments (heartbeat, frameMax,
    channelMax, handshakeTimeout, memoryHighWatermark, defaultUser,
    defaultPass, policies ...).
    """
    if dataDir is None:
        dataDir = tempfile.mkdtemp(prefix="ottermq-test-")
    svc = OtterService(
        amqp=["tcp:0:interface=127.0.0.1"],
        management=["tcp:0:interface=127.0.0.1"] if management else [],
        reactor=reactor,
        dataDir=dataDir,
        **options
    )
    svc.startService()
    ports = yield svc.listeningPorts(svc.amqpServices)
    mport = None
    if management:
        mports = yield svc.listeningPorts(svc.managementServices)
        mport = mports[0].getHost().port
    returnValue(BrokerFixture(svc, ports[0].getHost().port, mport))
