"""
A blocking raw stream-protocol client for the interop tests (every read has
a timeout): handshake, requests, and the frames the server sends, decoded
loosely so both otter_tx's and RabbitMQ's answers can be compared.
"""

import socket
import struct

from otter_tx.stream import wire


class RawStreamClient:
    def __init__(self, host, port, timeout=5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.reader = wire.FrameReader(0)
        self.pending = []
        self.skipped = []
        self.corr = 0

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def sendRaw(self, data):
        self.sock.sendall(data)

    def request(self, key, payload=b""):
        self.corr += 1
        self.sock.sendall(wire.request(key, self.corr, payload))
        return self.corr

    def frame(self):
        """The next frame body (bytes); raises socket.timeout or EOFError."""
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("closed")
            self.pending.extend(self.reader.feed(data))
        return bytes(self.pending.pop(0))

    def response(self, key):
        """The next response to ``key``: ``(code, rest bytes)``, other frames kept for later."""
        while True:
            body = self.frame()
            k, v = struct.unpack_from(">HH", body)
            if k != key | wire.RESPONSE_FLAG:
                self.skipped.append(body)
            else:
                if key == wire.CREDIT:
                    return struct.unpack_from(">H", body, 4)[0], body[6:]
                return struct.unpack_from(">H", body, 8)[0], body[10:]

    def frames(self, key):
        """The next frame with ``key`` (a server command): the body after key and version."""
        while True:
            body = self.skipped.pop(0) if self.skipped else self.frame()
            k, v = struct.unpack_from(">HH", body)
            if k == key:
                return v, body[4:]

    def call(self, key, payload=b""):
        self.request(key, payload)
        return self.response(key)

    def handshake(self, user="guest", password="guest", vhost="/"):
        """Peer properties, SASL PLAIN, tune, open: the open response code."""
        self.call(wire.PEER_PROPERTIES, wire.encodeStringMap({"product": "raw"}))
        self.call(wire.SASL_HANDSHAKE)
        sasl = b"\x00" + user.encode() + b"\x00" + password.encode()
        code, _ = self.call(wire.SASL_AUTHENTICATE,
                            wire.encodeString("PLAIN") + struct.pack(">I", len(sasl)) + sasl)
        if code != wire.OK:
            return code
        v, body = self.frames(wire.TUNE)
        frameMax, hb = struct.unpack(">II", body)
        self.sock.sendall(struct.pack(">IHHII", 12, wire.TUNE | wire.RESPONSE_FLAG, 1, frameMax, hb))
        code, _ = self.call(wire.OPEN, wire.encodeString(vhost))
        return code

    # conveniences

    def create(self, name, args=None):
        return self.call(wire.CREATE_STREAM, wire.encodeString(name) + wire.encodeStringMap(args or {}))[0]

    def delete(self, name):
        return self.call(wire.DELETE_STREAM, wire.encodeString(name))[0]

    def declarePublisher(self, pid, ref, stream):
        return self.call(wire.DECLARE_PUBLISHER,
                         bytes((pid,)) + wire.encodeString(ref) + wire.encodeString(stream))[0]

    def publish(self, pid, messages):
        self.sock.sendall(wire.publishFrame(pid, messages))

    def confirms(self):
        """``(publisherId, [ids])`` of the next publish confirm or ``("error", ...)``."""
        while True:
            body = self.skipped.pop(0) if self.skipped else self.frame()
            k, v = struct.unpack_from(">HH", body)
            if k == wire.PUBLISH_CONFIRM:
                pid = body[4]
                (n,) = struct.unpack_from(">I", body, 5)
                return pid, list(struct.unpack_from(">%dQ" % n, body, 9))
            if k == wire.PUBLISH_ERROR:
                pid = body[4]
                (n,) = struct.unpack_from(">I", body, 5)
                errs = [struct.unpack_from(">QH", body, 9 + 10 * i) for i in range(n)]
                return "error", pid, errs

    def subscribe(self, sid, stream, spec=(wire.OFFSET_FIRST, None), credit=10, props=None):
        payload = (bytes((sid,)) + wire.encodeString(stream) + wire.offsetSpec(*spec)
                   + struct.pack(">H", credit) + wire.encodeStringMap(props or {}))
        return self.call(wire.SUBSCRIBE, payload)[0]

    def deliver(self):
        """``(subscriptionId, chunkBytes)`` of the next deliver."""
        v, body = self.frames(wire.DELIVER)
        if v == 2:
            return body[0], body[9:]
        return body[0], body[1:]

    def credit(self, sid, n):
        self.sock.sendall(struct.pack(">IHHBH", 7, wire.CREDIT, 1, sid, n))
