"""
The inter-node link's codec cost per forwarded message, for the choice of
its protocol (docs/cluster.md, "The link"): our frames
(otter_tx.cluster.wire) against Twisted AMP boxes (encode, serialize,
parse, decode arguments), for 12 B and 1 KiB messages.  CPU only, one process, no sockets.

    .venv-test/bin/python bench/link_codec.py
"""

import time

from twisted.protocols import amp

from otter_tx.broker.message import Message
from otter_tx.cluster import wire

N = 200000


def ours(message):
    data = b"".join(wire.forward("/", "q-1", False, message) for _ in range(100))
    t = time.perf_counter()
    for _ in range(N // 100):
        out, _ = wire.splitFrames(data)
        for kind, payload in out:
            r = wire.Reader(payload)
            r.string(), r.string(), r.u8(), r.message()
        data = b"".join(wire.forward("/", "q-1", False, message) for _ in range(100))
    return (time.perf_counter() - t) / N * 1e6


class Forward(amp.Command):
    arguments = [(b"vhost", amp.Unicode()), (b"queue", amp.Unicode()), (b"exchange", amp.Unicode()),
                 (b"routing_key", amp.Unicode()), (b"props", amp.String()), (b"body", amp.String())]
    requiresAnswer = False


def withAmp(message):
    t = time.perf_counter()
    for _ in range(N // 100):
        boxes = []
        for _ in range(100):
            box = Forward.makeArguments({"vhost": "/", "queue": "q-1", "exchange": message.exchange,
                                         "routing_key": message.routingKey, "props": message.propsRaw,
                                         "body": message.body}, None)
            boxes.append(amp.AmpBox(box).serialize())
        data = b"".join(boxes)
        got = []
        parser = amp.BinaryBoxProtocol(_Receiver(got))
        parser.makeConnection(_Null())
        parser.dataReceived(data)
        for b in got:
            Forward.parseArguments(b, None)
    return (time.perf_counter() - t) / N * 1e6


class _Receiver:
    def __init__(self, got):
        self.ampBoxReceived = got.append

    def startReceivingBoxes(self, sender):
        pass

    def stopReceivingBoxes(self, reason):
        pass


class _Null:
    def write(self, d):
        pass

    def getPeer(self):
        return None

    def getHost(self):
        return None


def main():
    for size in (12, 1024):
        m = Message("", "q-1", b"\x00\x00", b"x" * size)
        print("%5d B  ours %.2f us  AMP %.2f us" % (size, ours(m), withAmp(m)))


if __name__ == "__main__":
    main()
