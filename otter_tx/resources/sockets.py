"""
Writing straight to a connection's socket, past Twisted's write buffer
(which joins what a turn wrote into one string and sends it 128 KiB a
reactor turn): the stream door's chunks (:func:`otter_tx.door.stream.writeDirect`)
and a cluster link's replicated records (:func:`otter_tx.cluster.link.writeParts`)
go out with one ``sendmsg`` (or ``writev``) of their parts.  And reading
straight into a protocol's own buffer (:func:`readInto`: the stream door's
publish frames), past Twisted's ``recv``, which makes a new string a read.
"""

from errno import EWOULDBLOCK

from twisted.internet import main, tcp

#: most buffers one direct write hands the kernel (IOV_MAX is 1024 on Linux)
MAX_PARTS = 512


def directSocket(transport):
    """
    The socket of ``transport`` to write to directly, or None: only a plain
    TCP connection (not TLS, not a test transport), still open, that holds
    nothing in its own buffers (what was written through it goes first).
    """
    if not isinstance(transport, tcp.Connection) or getattr(transport, "TLS", False):
        return None
    if not transport.connected or transport.disconnecting or getattr(transport, "_writeDisconnected", True):
        return None
    if getattr(transport, "_tempDataBuffer", True) or len(transport.dataBuffer) != transport.offset:
        return None
    return transport.socket


def sendRun(sock, parts, i, j, writev=None):
    """
    One system call for ``parts[i:j]`` (bytes-like; at most :data:`MAX_PARTS`):
    ``sendmsg``, or ``writev(fd, parts)`` when given and a part is not
    ``bytes`` (PyPy's ``sendmsg`` copies such buffers).  Returns ``(k, sent)``:
    the first part not wholly taken (``j`` when all were) and how many of its
    bytes were.  A socket that takes nothing now (or fails: the transport's
    own next write meets the error) took 0.
    """
    run = parts[i:j]
    try:
        if writev is None or all(type(p) is bytes for p in run):
            sent = sock.sendmsg(run)
        else:
            sent = writev(sock.fileno(), run)
    except OSError:  # (BlockingIOError, InterruptedError too)
        sent = 0
    while i < j and sent >= len(parts[i]):
        sent -= len(parts[i])
        i += 1
    return i, sent


def readInto(transport, space, filled):
    """
    Make ``transport`` (a plain TCP connection; False, nothing changed, for
    any other) read with ``recv_into(space())`` and hand the count to
    ``filled(n)`` instead of a new string to its protocol's ``dataReceived``;
    the end of the connection and errors end it as Twisted's ``doRead`` does
    (``CONNECTION_DONE``, ``CONNECTION_LOST``).  Pausing and resuming the
    transport work as before (the reactor calls this ``doRead``).
    """
    if not isinstance(transport, tcp.Connection) or getattr(transport, "TLS", False):
        return False
    sock = transport.socket

    def doRead():
        try:
            n = sock.recv_into(space())
        except OSError as se:
            if se.args[0] == EWOULDBLOCK:
                return None
            return main.CONNECTION_LOST
        if not n:
            return main.CONNECTION_DONE
        return filled(n)

    transport.doRead = doRead
    return True
