"""
Stream protocol throughput: publish with confirms, then consume, against
otter_tx's stream door and RabbitMQ's rabbitmq_stream (the 3.10 peer on 5562),
interleaved on the same machine.

    .venv-test/bin/python bench/stream_protocol.py                # otter_tx (started here) and the peer
    .venv-test/bin/python bench/stream_protocol.py --targets otter --messages 200000
    .venv-test/bin/python bench/stream_protocol.py --otter-port 5552 --targets otter  # a running otter_tx
    .venv-test/bin/python bench/stream_protocol.py --otter-backend memory   # the door alone, no disk
    .venv-test/bin/python bench/stream_protocol.py --otter-python /path/to/pypy-venv/bin/python  # otter_tx on PyPy

Each run creates a fresh stream, starts ``--publishers`` processes (one
connection and publisher each, the same stream), each publishing its share of
``--messages`` messages of ``--size`` bytes in publish frames of ``--batch``
messages with at most ``--window`` messages unconfirmed; the publish rate is
messages / time until the last confirm. Then one consumer reads the stream
from the first offset (credit 10, one credit back per chunk) until it has them
all: the consume rate (with ``--consumes N``, N consumers one after another,
the median). The stream is deleted. Scenarios x targets are
interleaved ``--rounds`` times and the medians printed.

The load generator is a raw client (pre-encoded frames, counts taken from the
confirm and chunk headers) so it costs little per message; with a 2-core
machine it still shares the CPU with the broker, so compare the two brokers,
not absolute numbers. The messages are opaque bytes (neither broker decodes
them on the way through).
"""

import argparse
import multiprocessing
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from otter_tx.stream import wire  # noqa: E402

PEER_PORT = 5562


class Conn:
    """A raw stream connection with a bytearray receive buffer."""

    def __init__(self, port, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.corr = 0
        self.pending = []

    def frames(self):
        """Block for data; return the complete frame bodies."""
        if self.pending:
            out, self.pending = self.pending, []
            return out
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError
            self.buf += data
            out = []
            pos = 0
            n = len(self.buf)
            while n - pos >= 4:
                (size,) = struct.unpack_from(">I", self.buf, pos)
                if pos + 4 + size > n:
                    break
                out.append(bytes(self.buf[pos + 4:pos + 4 + size]))
                pos += 4 + size
            del self.buf[:pos]
            if out:
                return out

    def call(self, key, payload=b""):
        """A request; its response's code."""
        return struct.unpack_from(">H", self.callBody(key, payload), 8)[0]

    def callBody(self, key, payload=b""):
        """A request; its response's whole body (answering a server's tune meanwhile)."""
        self.corr += 1
        self.sock.sendall(wire.request(key, self.corr, payload))
        while True:
            frames = self.frames()
            for i, body in enumerate(frames):
                k, = struct.unpack_from(">H", body)
                if k == key | wire.RESPONSE_FLAG:
                    self.pending = frames[i + 1:]
                    return body
                if k == wire.TUNE:
                    self.sock.sendall(struct.pack(">I", len(body)) + struct.pack(">H", wire.TUNE | 0x8000)
                                      + body[2:])

    def handshake(self):
        self.call(wire.PEER_PROPERTIES, wire.encodeStringMap({"product": "bench"}))
        self.call(wire.SASL_HANDSHAKE)
        sasl = b"\x00guest\x00guest"
        self.corr += 1
        self.sock.sendall(wire.request(wire.SASL_AUTHENTICATE, self.corr,
                                       wire.encodeString("PLAIN") + struct.pack(">I", len(sasl)) + sasl))
        got = False
        while not got:
            for body in self.frames():
                if struct.unpack_from(">H", body)[0] == wire.TUNE:
                    frameMax, hb = struct.unpack_from(">II", body, 4)
                    self.sock.sendall(struct.pack(">IHHII", 12, wire.TUNE | 0x8000, 1, frameMax, 0))
                    got = True
        assert self.call(wire.OPEN, wire.encodeString("/")) == wire.OK


def publisher(port, stream, count, size, batch, window, pid, ready, go, result):
    c = Conn(port)
    c.handshake()
    assert c.call(wire.DECLARE_PUBLISHER, bytes((pid,)) + wire.encodeString("") + wire.encodeString(stream)) == 1
    payload = os.urandom(size)
    entry = struct.Struct(">QI")
    # a frame template per batch size; publishing ids are packed in place
    def template(n):
        body = struct.pack(">HHBI", wire.PUBLISH, 1, pid, n) + (b"\x00" * 12 + payload) * n
        return bytearray(struct.pack(">I", len(body)) + body)
    full = template(batch)
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    sent = confirmed = 0
    nextId = 1
    while confirmed < count:
        while sent < count and sent - confirmed < window:
            n = min(batch, count - sent)
            frame = full if n == batch else template(n)
            pos = 4 + 9
            for _ in range(n):
                entry.pack_into(frame, pos, nextId, size)
                nextId += 1
                pos += 12 + size
            c.sock.sendall(frame)
            sent += n
        for body in c.frames():
            if body[1] == wire.PUBLISH_CONFIRM and body[0] == 0:
                confirmed += struct.unpack_from(">I", body, 5)[0]
            elif body[1] == wire.PUBLISH_ERROR and body[0] == 0:
                raise RuntimeError("publish error")
    result.put(time.perf_counter() - t0)
    c.sock.close()


def consume(port, stream, total):
    c = Conn(port)
    c.handshake()
    t0 = time.perf_counter()
    code = c.call(wire.SUBSCRIBE, b"\x01" + wire.encodeString(stream) + wire.offsetSpec(wire.OFFSET_FIRST)
                  + struct.pack(">H", 10) + struct.pack(">I", 0))
    assert code == wire.OK, code
    got = 0
    credit = struct.pack(">IHHBH", 7, wire.CREDIT, 1, 1, 1)
    n = 0
    for body in c.pending:
        if body[1] == wire.DELIVER and body[0] == 0:
            # key, version, subscription id, magic, chunk type, NumEntries (u16), NumRecords (u32)
            got += struct.unpack_from(">I", body, 9)[0]
            n += 1
    c.pending = []
    if n:
        c.sock.sendall(credit * n)
    # the rest read into one buffer, the chunks' bodies skipped where they are (no copy of them:
    # the load generator's cost is one kernel copy a byte, what any client pays)
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    have = len(c.buf)
    buf[:have] = c.buf
    skip = 0
    unpack = struct.unpack_from
    while got < total:
        k = c.sock.recv_into(view[have:])
        if not k:
            raise EOFError
        have += k
        pos = min(skip, have)
        skip -= pos
        n = 0
        while not skip and have - pos >= 4:
            (size,) = unpack(">I", buf, pos)
            if size >= 13:
                if have - pos < 17:
                    break
                if buf[pos + 4] == 0 and buf[pos + 5] == wire.DELIVER:
                    got += unpack(">I", buf, pos + 13)[0]
                    n += 1
            elif have - pos < 4 + size:
                break
            end = pos + 4 + size
            if end > have:
                skip = end - have
                end = have
            pos = end
        rest = have - pos
        buf[:rest] = buf[pos:have]
        have = rest
        if n:
            c.sock.sendall(credit * n)
    elapsed = time.perf_counter() - t0
    c.sock.close()
    return elapsed


def publishAll(port, stream, messages, size, publishers, batch, window):
    """
    ``publishers`` processes publish ``messages`` (shared) to ``stream`` at
    ``port`` at once: ``(messages published, seconds until the last confirm)``.
    """
    ctx = multiprocessing.get_context("fork")
    ready = [ctx.Event() for _ in range(publishers)]
    go = ctx.Event()
    result = ctx.Queue()
    share = messages // publishers
    procs = [ctx.Process(target=publisher, args=(port, stream, share, size, batch, window, i, ready[i], go, result))
             for i in range(publishers)]
    for p in procs:
        p.start()
    for r in ready:
        r.wait(60)
    t0 = time.perf_counter()
    go.set()
    for _ in procs:
        result.get(timeout=600)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    return share * publishers, elapsed


def run(port, messages, size, publishers, batch, window, consumes=1):
    stream = "bench-%d-%d" % (os.getpid(), time.monotonic_ns())
    admin = Conn(port)
    admin.handshake()
    assert admin.call(wire.CREATE_STREAM, wire.encodeString(stream) + struct.pack(">I", 0)) == wire.OK
    total, pubElapsed = publishAll(port, stream, messages, size, publishers, batch, window)
    # a consume of a small stream takes a fraction of a second: several, the median
    conElapsed = statistics.median(consume(port, stream, total) for _ in range(consumes))
    admin.call(wire.DELETE_STREAM, wire.encodeString(stream))
    admin.sock.close()
    return total / pubElapsed, total / conElapsed


#: the door alone: a broker whose streams are otter_tx.door.streambackend.MemoryStreams
#: (no disk, no durability), to see what the protocol layer costs
MEMORY_SERVER = """
import sys
from twisted.internet import reactor
from twisted.internet.endpoints import serverFromString
from otter_tx.broker.broker import Broker
from otter_tx.door.stream import StreamServerFactory
from otter_tx.door.streambackend import MemoryStreams
broker = Broker(reactor, memoryHighWatermark=None)
f = StreamServerFactory(broker, MemoryStreams(reactor), reactor)
serverFromString(reactor, "tcp:%s:interface=127.0.0.1" % sys.argv[1]).listen(f)
reactor.run()
"""


def startOtter(port, backend="broker", python=None, cwd=ROOT):
    """otter_tx (``python``, from the checkout ``cwd``) with its stream port on ``port``: (process, data dir)."""
    data = tempfile.mkdtemp(prefix="otter-stream-bench-")
    log = open(os.path.join(data, "broker.log"), "w")
    python = python or sys.executable
    if backend == "memory":
        args = [python, "-c", MEMORY_SERVER, str(port)]
    else:
        args = [python, "-m", "twisted", "ottermq", "--amqp", "tcp:0:interface=127.0.0.1",
                "--management", "tcp:0:interface=127.0.0.1", "--prometheus", "none",
                "--stream", "tcp:%d:interface=127.0.0.1" % port, "--data-dir", os.path.join(data, "d")]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, data
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("otter_tx did not start; see %s" % log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="otter,peer")
    ap.add_argument("--otter-port", type=int, default=None, help="a running otter_tx (else one is started)")
    ap.add_argument("--peer-port", type=int, default=PEER_PORT)
    ap.add_argument("--otter-backend", choices=("broker", "memory"), default="broker",
                    help="memory: the door on in-memory streams (no durability), the protocol layer's cost")
    ap.add_argument("--otter-python", default=None,
                    help="the interpreter that runs otter_tx (for example a PyPy venv's python; default: this one)")
    ap.add_argument("--messages", type=int, default=500000)
    ap.add_argument("--sizes", default="12,1024")
    ap.add_argument("--publishers", default="1,3")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--window", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--consumes", type=int, default=1,
                    help="consume each stream this many times (one after another) and take the median")
    args = ap.parse_args()
    proc = data = None
    ports = {}
    targets = args.targets.split(",")
    if "otter" in targets:
        if args.otter_port is None:
            port = 15599
            proc, data = startOtter(port, args.otter_backend, args.otter_python)
            ports["otter"] = port
        else:
            ports["otter"] = args.otter_port
    if "peer" in targets:
        ports["peer"] = args.peer_port
    results = {}
    try:
        for rnd in range(args.rounds):
            for size in [int(s) for s in args.sizes.split(",")]:
                for pubs in [int(p) for p in args.publishers.split(",")]:
                    messages = args.messages if size < 1000 else max(args.messages // 5, 1000)
                    for t in targets:
                        pub, con = run(ports[t], messages, size, pubs, args.batch, args.window, args.consumes)
                        results.setdefault((size, pubs, t), []).append((pub, con))
                        print("round %d size %5d publishers %d %-5s publish %9.0f msg/s  consume %9.0f msg/s"
                              % (rnd + 1, size, pubs, t, pub, con), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(data, ignore_errors=True)
    print("\nmedians (msg/s)")
    print("%6s %10s %-6s %12s %12s" % ("size", "publishers", "target", "publish", "consume"))
    for (size, pubs, t), rs in sorted(results.items()):
        print("%6d %10d %-6s %12.0f %12.0f" % (size, pubs, t, statistics.median(r[0] for r in rs),
                                               statistics.median(r[1] for r in rs)))


if __name__ == "__main__":
    main()
