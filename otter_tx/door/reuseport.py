"""
The ``otterreuse:`` server endpoint: TCP with ``SO_REUSEPORT`` (Linux 3.9+),
so several otter_tx nodes on one host listen on one AMQP port and the kernel
spreads new connections over them (docs/cluster.md, "One machine, all
cores").  Arguments as ``tcp:``: ``otterreuse:5672:interface=127.0.0.1:backlog=50``.
"""

import socket

from twisted.internet import tcp
from twisted.internet.defer import execute
from twisted.internet.interfaces import IStreamServerEndpoint, IStreamServerEndpointStringParser
from twisted.plugin import IPlugin
from zope.interface import implementer

PREFIX = "otterreuse"


class ReusePort(tcp.Port):
    """A listening TCP port whose socket has ``SO_REUSEPORT`` set before bind."""

    def createInternetSocket(self):
        s = tcp.Port.createInternetSocket(self)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        return s


@implementer(IStreamServerEndpoint)
class ReusePortEndpoint:
    """:param port: int.  :param backlog: int.  :param interface: str."""

    def __init__(self, reactor, port, backlog=50, interface=""):
        self.reactor = reactor
        self.port = port
        self.backlog = backlog
        self.interface = interface

    def listen(self, factory):
        def start():
            p = ReusePort(self.port, factory, self.backlog, self.interface, self.reactor)
            p.startListening()
            return p

        return execute(start)


@implementer(IPlugin, IStreamServerEndpointStringParser)
class ReusePortParser:
    """The ``otterreuse:`` parser, registered by ``twisted/plugins/ottermq_reuse.py``."""

    prefix = PREFIX

    def parseStreamServer(self, reactor, port, backlog=50, interface=""):
        if not hasattr(socket, "SO_REUSEPORT"):
            raise ValueError("otterreuse: SO_REUSEPORT is not available on this system")
        return ReusePortEndpoint(reactor, int(port), int(backlog), interface)
