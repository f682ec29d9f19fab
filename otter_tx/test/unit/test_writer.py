"""
Tests for otter_tx.door.writer.EagerWriter over a StringTransport and a fake
socket.  The same path on real sockets (batching, back-pressure, large
writes, slow consumers) is covered by the interop suite
(test_interop_raw, test_interop_closing, test_interop_wire, ...).
"""

from twisted.internet.interfaces import IPullProducer
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from otter_tx.door.writer import TRANSPORT_HIGH_WATER, EagerWriter


class FakeSocket:
    """``send`` takes up to ``room`` octets (or raises ``error``)."""

    def __init__(self, room=1 << 30):
        self.room = room
        self.sent = []
        self.error = None

    def send(self, data):
        if self.error is not None:
            raise self.error
        n = min(len(data), self.room)
        self.room -= n
        if n:
            self.sent.append(bytes(data[:n]))
        return n


class SocketTransport(StringTransport):
    """A StringTransport whose ``getHandle()`` is a :class:`FakeSocket`."""

    def __init__(self, socket):
        StringTransport.__init__(self)
        self.socket = socket

    def getHandle(self):
        return self.socket


class FakeConnection:
    """The connection side: records pause / resume / stop calls."""

    def __init__(self):
        self.calls = []

    def pauseProducing(self):
        self.calls.append("pause")

    def resumeProducing(self):
        self.calls.append("resume")

    def stopProducing(self):
        self.calls.append("stop")


class EagerWriterTests(SynchronousTestCase):
    """Eager socket writes through public Twisted API, with the transport's back-pressure."""

    def setUp(self):
        self.socket = FakeSocket()
        self.transport = SocketTransport(self.socket)
        self.connection = FakeConnection()
        self.writer = EagerWriter(self.transport, self.connection)

    def test_pullProducer(self):
        """The writer is registered as the transport's pull producer."""
        verifyObject(IPullProducer, self.writer)
        self.assertIs(self.transport.producer, self.writer)
        self.assertFalse(self.transport.streaming)

    def test_emptyTransportWritesToSocket(self):
        """With nothing queued in the transport, bytes go straight to the socket."""
        self.writer.write(b"abc")
        self.writer.write(b"def")
        self.assertEqual(self.socket.sent, [b"abc", b"def"])
        self.assertEqual(self.transport.value(), b"")

    def test_restQueuedInOrder(self):
        """
        What the socket does not take goes to the transport, and so does every
        later write until the transport has written it all.
        """
        self.socket.room = 2
        self.writer.write(b"abcd")
        self.socket.room = 100
        self.writer.write(b"ef")
        self.assertEqual(self.socket.sent, [b"ab"])
        self.assertEqual(self.transport.value(), b"cdef")
        # the transport ran out of data: the socket again
        self.writer.resumeProducing()
        self.writer.write(b"gh")
        self.assertEqual(self.socket.sent, [b"ab", b"gh"])

    def test_socketErrorLeavesDataToTransport(self):
        """EAGAIN (or a reset connection) hands everything to the transport."""
        self.socket.error = BlockingIOError()
        self.writer.write(b"abc")
        self.assertEqual(self.transport.value(), b"abc")
        self.socket.error = ConnectionResetError()
        self.writer.resumeProducing()
        self.writer.write(b"d")
        self.assertEqual(self.transport.value(), b"abcd")

    def test_pausedAboveHighWater(self):
        """
        More than TRANSPORT_HIGH_WATER octets queued pause the connection
        (once); the transport's drain resumes it.
        """
        self.socket.room = 0
        self.writer.write(b"x" * TRANSPORT_HIGH_WATER)
        self.assertEqual(self.connection.calls, [])
        self.writer.write(b"y")
        self.writer.write(b"z")
        self.assertEqual(self.connection.calls, ["pause"])
        self.writer.resumeProducing()
        self.assertEqual(self.connection.calls, ["pause", "resume"])
        self.writer.resumeProducing()
        self.assertEqual(self.connection.calls, ["pause", "resume"])

    def test_loseConnectionUnregisters(self):
        """
        loseConnection unregisters the producer first (a transport with one
        never closes) and writes nothing eagerly after it.
        """
        self.writer.loseConnection()
        self.assertIsNone(self.transport.producer)
        self.assertTrue(self.transport.disconnecting)
        self.writer.write(b"late")
        self.assertEqual(self.socket.sent, [])
        self.assertEqual(self.transport.value(), b"late")

    def test_stopProducing(self):
        """The transport going away stops the connection."""
        self.writer.stopProducing()
        self.assertEqual(self.connection.calls, ["stop"])
