"""
The AMQP door's write path on plain TCP: bytes go straight to the socket
while the transport holds none of ours, through Twisted's public API only.

Twisted's ``transport.write`` buffers and registers the socket for
writability, so every reply costs a second reactor turn and an
``epoll_ctl`` pair; at low message rates that was a large part of the
broker's CPU per message (docs/performance.md, "CPU per message at low
rates").  :class:`EagerWriter` sends on the connection's socket
(``transport.getHandle()``, Twisted's ``ISystemHandle``) while nothing it
handed the transport is still buffered there, and hands the transport
only what the socket did not take, so bytes keep their order.

It knows when the transport has written everything it was handed because
it is the transport's pull producer (``IPullProducer``): a transport asks
its pull producer for more (``resumeProducing``) each time it runs out of
data to write (``IConsumer.registerProducer``).  Back-pressure to the
connection (an ``IPushProducer``) is done here the way Twisted does it for
a streaming producer: ``pauseProducing`` once more than
:data:`TRANSPORT_HIGH_WATER` bytes wait in the transport, ``resumeProducing``
when it has written them all.

A transport closes only once its producer is unregistered
(``FileDescriptor.loseConnection``): close through
:meth:`EagerWriter.loseConnection`.  TLS transports do not take this path
(the socket carries ciphertext); the connection writes through
``transport.write`` and is their streaming producer itself.
"""

from twisted.internet.interfaces import IPullProducer
from zope.interface import implementer

#: bytes waiting in the transport above which the connection is paused:
#: Twisted's ``FileDescriptor.bufferSize`` (64 KiB), where it pauses a
#: streaming producer
TRANSPORT_HIGH_WATER = 64 * 1024


@implementer(IPullProducer)
class EagerWriter:
    """
    Writes for one plain TCP connection (a ``twisted.internet.tcp``
    transport), registered as its transport's pull producer.

    :param transport: the connection's TCP transport (``ITCPTransport`` and
        ``ISystemHandle``: ``getHandle()`` is its socket).
    :param producer: the connection, an ``IPushProducer``: paused while more
        than :data:`TRANSPORT_HIGH_WATER` bytes wait in the transport,
        resumed once the transport has written them, stopped when the
        transport goes.
    """

    def __init__(self, transport, producer):
        self._transport = transport
        self._socket = transport.getHandle()
        self._producer = producer
        #: bytes handed to the transport since it last ran out of data
        self._queued = 0
        self._paused = False
        self._closing = False
        transport.registerProducer(self, False)

    def write(self, data):
        """
        Write ``data`` (bytes): on the socket at once when the transport
        holds nothing of ours (the usual case), the rest (what the socket
        did not take, or everything while the transport holds data)
        through ``transport.write``.  A socket error leaves the data to the
        transport, which reports the lost connection.
        """
        if not self._queued and not self._closing:
            try:
                n = self._socket.send(data)
            except OSError:
                # EAGAIN / ENOBUFS: the socket takes nothing now; a reset
                # connection: the transport finds out on its next turn
                n = 0
            if n == len(data):
                return
            if n:
                data = data[n:]
        self._transport.write(data)
        self._queued += len(data)
        if self._queued > TRANSPORT_HIGH_WATER and not self._paused:
            self._paused = True
            self._producer.pauseProducing()

    def loseConnection(self):
        """Close the connection once the transport has written what it holds (then no more eager writes)."""
        self._closing = True
        self._transport.unregisterProducer()
        self._transport.loseConnection()

    # --- IPullProducer: the transport ran out of data to write ------------------

    def resumeProducing(self):
        """The transport has written all it was handed: write eagerly again, resume the connection."""
        self._queued = 0
        if self._paused:
            self._paused = False
            self._producer.resumeProducing()

    def stopProducing(self):
        """The transport is going away: stop the connection."""
        self._producer.stopProducing()
