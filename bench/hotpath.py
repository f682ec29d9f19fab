"""
In-process microbenchmark of the broker hot path (basic.publish in, basic.deliver
out, basic.ack in), without sockets: two protocols on null transports, a
task.Clock, frames fed in 64 KiB chunks as the reactor would.

    .venv/bin/python bench/hotpath.py [--messages N] [--size B] [--ack] [--persistent]
                                      [--repeat K] [--profile]

Prints publish+deliver msg/s, wall and CPU (process time: less disturbed by
other processes on a shared machine) microseconds per message.  Use it to compare
hot-path changes (commit before/after); socket-level numbers come from run.py.

--persistent: delivery-mode 2 into a durable queue with the durability
journal on a MemoryStore (every store call made, nothing written, ``sync()``
fires at once), publisher confirms, manual ack with prefetch 100: the broker's
own share of the persistent-with-confirms path, without the SQLite writer.
--repeat K runs the measurement K times on the same broker (PyPy's JIT warms
up over the first ones) and prints each.
"""

import argparse
import cProfile
import pstats
import struct
import time

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock

from otter_tx.amqp import spec
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory, frame, methodFrame


class NullTransport:
    """Counts bytes written; never pauses."""

    disconnecting = False

    def __init__(self):
        self.written = 0
        self.chunks = []
        self.keep = False

    def write(self, data):
        self.written += len(data)
        if self.keep:
            self.chunks.append(data)

    def writeSequence(self, seq):
        for d in seq:
            self.write(d)

    def getPeer(self):
        return IPv4Address("TCP", "127.0.0.1", 1)

    def getHost(self):
        return IPv4Address("TCP", "127.0.0.1", 5672)

    def registerProducer(self, p, streaming):
        pass

    def pauseProducing(self):
        pass

    def resumeProducing(self):
        pass

    def loseConnection(self):
        self.disconnecting = True

    abortConnection = loseConnection

    def setTcpNoDelay(self, flag):
        pass


def connect(factory):
    t = NullTransport()
    p = factory.buildProtocol(None)
    p.makeConnection(t)
    p.dataReceived(spec.PROTOCOL_HEADER)
    p.dataReceived(
        methodFrame(0, spec.ConnectionStartOk({"capabilities": {}}, "PLAIN", b"\0guest\0guest", "en_US"))
        + methodFrame(0, spec.ConnectionTuneOk(2047, 131072, 0))
        + methodFrame(0, spec.ConnectionOpen("/", "", False))
        + methodFrame(1, spec.ChannelOpen(""))
    )
    return p, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--ack", action="store_true", help="manual ack, prefetch 100 (acks fed back)")
    ap.add_argument("--persistent", action="store_true",
                    help="persistent messages, durable queue on a MemoryStore journal, confirms, "
                    "manual ack with prefetch 100")
    ap.add_argument("--repeat", type=int, default=1, help="measure K times (JIT warm-up)")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    if a.persistent:
        a.ack = True
    clock = Clock()
    broker = Broker(clock)
    if a.persistent:
        from otter_tx.store.memory import MemoryStore

        store = MemoryStore()
        broker.attachJournal(store, store.open().result)
    factory = AMQPServerFactory(broker, clock, heartbeat=0)
    pub, pt = connect(factory)
    con, ct = connect(factory)
    pub.dataReceived(methodFrame(1, spec.QueueDeclare(0, "bench", durable=a.persistent)))
    if a.persistent:
        pub.dataReceived(methodFrame(1, spec.ConfirmSelect(False)))
    if a.ack:
        con.dataReceived(methodFrame(1, spec.BasicQos(0, 100, False)))
    con.dataReceived(methodFrame(1, spec.BasicConsume(0, "bench", "c", no_ack=not a.ack)))
    body = b"x" * a.size
    # delivery-mode 2: flags bit 12, then the octet
    props = b"\x10\x00\x02" if a.persistent else b"\x00\x00"
    one = (
        methodFrame(1, spec.BasicPublish(0, "", "bench", False, False))
        + frame(2, 1, struct.pack("!HHQ", 60, 0, len(body)) + props)
        + frame(3, 1, body)
    )
    per = max(1, 65536 // len(one))
    chunk = one * per
    total = a.messages * a.repeat
    if a.ack:
        acks = [methodFrame(1, spec.BasicAck(t, False)) for t in range(1, total + per * a.repeat + 2)]
    state = {"tag": 0}

    def run():
        sent = 0
        tag = state["tag"]
        while sent < a.messages:
            pub.dataReceived(chunk)
            clock.advance(0)  # run the fairness continuations
            sent += per
            if a.ack:
                # the consumer acks everything delivered so far, until the
                # backlog is drained (each ack batch releases 100 more)
                ch = con.channels[1]
                while ch.deliveryTag > tag:
                    last = ch.deliveryTag
                    con.dataReceived(b"".join(acks[tag:last]))
                    tag = last
        state["tag"] = tag
        return sent

    prof = cProfile.Profile() if a.profile else None
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        c0 = time.process_time()
        if prof is not None:
            sent = prof.runcall(run)
        else:
            sent = run()
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        q = broker.vhosts["/"].queues["bench"]
        print(
            "messages=%d size=%d ack=%s persistent=%s: %.0f msg/s, %.2f us/msg, %.2f CPU us/msg "
            "(ready left %d, delivered %d, confirms %s)"
            % (sent, a.size, a.ack, a.persistent, sent / dt, dt / sent * 1e6, cpu / sent * 1e6,
               q.readyCount,
               con.channels[1].deliveryTag, pub.channels[1].publishSeq if a.persistent else "-"),
            flush=True,
        )
        pt.written = 0
    if a.profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
