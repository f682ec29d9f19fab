"""
Probe what the management API shows of a stream connection as it works
(run against the RabbitMQ 3.10 peer or otter_tx): raw stream frames
(bench/stream_protocol.py's Conn), then GET /api/stream/* between steps.

    python bench/stream_mgmt_probe.py STREAM_PORT MGMT_PORT
"""

import base64
import json
import os
import socket
import struct
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stream_protocol import Conn  # noqa: E402

from otter_tx.stream import wire  # noqa: E402


def api(mgmt, path, method="GET", user="guest", password="guest"):
    req = urllib.request.Request("http://127.0.0.1:%d/api/%s" % (mgmt, path), method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body else None


def drain(c, wait=0.3):
    """Read what arrives within ``wait`` seconds: [(key, body)]."""
    c.sock.settimeout(wait)
    got = []
    try:
        while True:
            for body in c.frames():
                got.append((struct.unpack_from(">H", body)[0], body))
    except (socket.timeout, TimeoutError):
        pass
    except EOFError:
        got.append(("EOF", b""))
    finally:
        c.sock.settimeout(60)
    return got


def show(mgmt, what):
    status, body = api(mgmt, what)
    for d in body if isinstance(body, list) else [body]:
        if isinstance(d, dict):
            d = {k: v for k, v in d.items() if k not in ("connection_details",)}
        print("  ", what, status, json.dumps(d, sort_keys=True))


def main():
    port, mgmt = int(sys.argv[1]), int(sys.argv[2])
    stream = "mgmt-probe"
    c = Conn(port)
    c.handshake()
    c.call(wire.DELETE_STREAM, wire.encodeString(stream))
    c.call(wire.CREATE_STREAM, wire.encodeString(stream) + wire.encodeStringMap({}))
    declare = bytes((1,)) + wire.encodeString("ref1") + wire.encodeString(stream)
    print("declare", c.call(wire.DECLARE_PUBLISHER, declare))
    c.sock.sendall(wire.publishFrame(1, [(1, b"hello"), (2, b"world")]))
    print("1 frame of 2:", [k for k, _ in drain(c)])
    time.sleep(6)
    show(mgmt, "stream/publishers")
    print("subscribe", c.call(wire.SUBSCRIBE, bytes((3,)) + wire.encodeString(stream)
                              + wire.offsetSpec(wire.OFFSET_FIRST, None) + struct.pack(">H", 1)
                              + wire.encodeStringMap({"name": "cons1"})))
    print("deliver:", [k for k, _ in drain(c)])
    for i in range(3, 6):
        c.sock.sendall(wire.publishFrame(1, [(i, b"m%d" % i)]))
        print("publish", i, [k for k, _ in drain(c)])
    c.sock.sendall(wire.publishFrame(1, [(2, b"dup")]))
    print("dup publish", [k for k, _ in drain(c)])
    c.sock.sendall(wire.publishFrame(9, [(7, b"nopub")]))
    print("unknown publisher", [k for k, _ in drain(c)])
    time.sleep(6)
    show(mgmt, "stream/publishers")
    show(mgmt, "stream/consumers")
    c.sock.sendall(struct.pack(">IHHBH", 7, wire.CREDIT, 1, 3, 2))
    print("credit 2:", [k for k, _ in drain(c)])
    time.sleep(6)
    show(mgmt, "stream/consumers")
    c.sock.sendall(struct.pack(">IHHBH", 7, wire.CREDIT, 1, 3, 5))
    print("credit 5:", [k for k, _ in drain(c)])
    time.sleep(6)
    show(mgmt, "stream/consumers")
    show(mgmt, "stream/connections")
    status, conns = api(mgmt, "stream/connections")
    name = conns[0]["name"]
    from urllib.parse import quote
    print("DELETE", api(mgmt, "connections/" + quote(name, safe=""), "DELETE"))
    got = drain(c, 2)
    for k, body in got:
        print("after delete:", k, body)


if __name__ == "__main__":
    main()
