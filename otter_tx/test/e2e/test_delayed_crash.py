"""
Delayed messages across SIGKILL: a message that fired (and reached a
consumer) before the kill, but whose fire the store had not committed yet,
fires again at boot; it must then arrive marked ``redelivered``, with the
``x-delayed-id`` it had the first time (docs/delayed.md, "Durability and
deletion").

The broker runs as ``twistd -n ottermq`` on a data dir; pika holds
messages on a durable x-delayed-message exchange, due in bursts over a few
seconds, a consumer takes them as they fire, and the broker is killed as a
random delivery arrives (the seed is printed), so within a fire the store
may not have committed yet; after the restart the consumer takes the rest.
Checked over every message: none is lost, and every copy after the first
says redelivered and carries the same id.
"""

import os
import random
import signal
import threading
import time
import uuid

import pika
from twisted.internet import defer, threads
from twisted.trial.unittest import TestCase

from otter_tx.test.e2e import test_crash

EX = "delayed-crash"
QUEUE = "delayed-crash"
COUNT = 2000
#: due times (x-delay-until): bursts every 100 ms, from 2.5 s to 5.5 s after the publish starts
DUE_MS = range(2500, 5501, 100)


def _declare(ch):
    ch.exchange_declare(EX, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_bind(QUEUE, EX, "k")


def _schedule(ch, body, until):
    """Hold ``body`` with the ``schedule`` command; returns its status once the store synced it."""
    got = {}
    cid = uuid.uuid4().hex
    tag = ch.basic_consume("amq.rabbitmq.reply-to",
                           lambda _c, _m, p, b: got.update({p.correlation_id: p}), auto_ack=True)
    ch.basic_publish(EX, "k", body, pika.BasicProperties(
        headers={"x-delayed-command": "schedule", "x-delay-until": until}, delivery_mode=2,
        reply_to="amq.rabbitmq.reply-to", correlation_id=cid))
    while cid not in got:
        ch.connection.process_data_events(0.05)
    ch.basic_cancel(tag)
    return got[cid].headers["x-delayed-status"]


def _publish(port, rng):
    """Hold messages 0..COUNT-1 (body = index), due at DUE_MS; durable once this returns."""
    start = int(time.time() * 1000)
    c = pika.BlockingConnection(test_crash._params(port))
    ch = c.channel()
    _declare(ch)
    for i in range(COUNT - 1):
        ch.basic_publish(EX, "k", b"%d" % i, pika.BasicProperties(
            headers={"x-delay-until": start + rng.choice(DUE_MS)}, delivery_mode=2))
    # the last one as a schedule command: answered once the store synced it, and so all before it
    status = _schedule(ch, b"%d" % (COUNT - 1), start + DUE_MS[-1])
    c.close()
    return status


def _consume(port, got, until, killAt=None, pid=None):
    """
    Append ``(index, redelivered, x-delayed-id)`` per delivery (acked once
    recorded: an auto-ack delivery still in the broker's socket buffer at the
    kill would be lost by design, at most once) until ``until()`` or the
    broker dies; SIGKILL process ``pid`` as delivery ``j`` of burst ``n``
    arrives, ``killAt = (n, j)`` (deliveries are not held back for the store,
    so that burst's fire may not be committed yet).
    """
    bursts = [0, 0.0, 0]  # bursts seen, time of the last delivery, deliveries in this burst
    try:
        c = pika.BlockingConnection(test_crash._params(port))
        ch = c.channel()
        ch.queue_declare(QUEUE, durable=True)

        def onMessage(_ch, method, props, body):
            got.append((int(body), method.redelivered, (props.headers or {}).get("x-delayed-id")))
            now = time.monotonic()
            if now - bursts[1] > 0.05:
                bursts[0] += 1
                bursts[2] = 0
            bursts[1] = now
            bursts[2] += 1
            if (bursts[0], bursts[2]) == killAt:
                os.kill(pid, signal.SIGKILL)
                return
            _ch.basic_ack(method.delivery_tag)

        ch.basic_consume(QUEUE, onMessage, auto_ack=False)
        while not until():
            c.process_data_events(0.05)
        c.close()
    except Exception:
        pass  # the broker was killed


class DelayedCrashTests(TestCase):
    """A delayed message fired again after kill -9 says redelivered, with its id."""

    timeout = 120

    @defer.inlineCallbacks
    def test_refiredAfterKill9AreRedelivered(self):
        """Every copy of a message after its first is redelivered with the same x-delayed-id; none is lost."""
        seed = int(os.environ.get("OTTER_TEST_SEED") or random.randrange(2 ** 32))
        print("test_refiredAfterKill9AreRedelivered seed=%d (OTTER_TEST_SEED repeats it)" % (seed,))
        rng = random.Random(seed)
        dataDir = os.path.abspath(self.mktemp())
        proc, transport = test_crash._startBroker(dataDir)
        port = yield proc.port
        try:
            status = yield threads.deferToThread(_publish, port, rng)
            self.assertEqual(status, 201)
        except BaseException:
            transport.signalProcess(signal.SIGKILL)
            yield proc.ended
            raise
        got = []
        killAt = (rng.randrange(3, len(DUE_MS) - 3), rng.randrange(1, 40))
        deadline = time.monotonic() + 30
        consumer = threading.Thread(target=_consume, args=(
            port, got, lambda: time.monotonic() > deadline, killAt, transport.pid))
        consumer.start()
        yield threads.deferToThread(consumer.join, 40)
        if not proc.ended.called:  # no burst seen: kill now
            transport.signalProcess(signal.SIGKILL)
        yield proc.ended
        before = len(got)

        proc, transport = test_crash._startBroker(dataDir)
        port = yield proc.port
        try:
            yield threads.deferToThread(
                _consume, port, got,
                lambda: len({i for i, _, _ in got}) >= COUNT or time.monotonic() > deadline)
        finally:
            transport.signalProcess(signal.SIGKILL)
            yield proc.ended

        copies = {}
        for i, redelivered, heldId in got:
            copies.setdefault(i, []).append((redelivered, heldId))
        twice = {i: c for i, c in copies.items() if len(c) > 1}
        print("seed=%d: %d deliveries before the kill, %d after; %d messages delivered twice"
              % (seed, before, len(got) - before, len(twice)))
        self.assertEqual(sorted(copies), list(range(COUNT)), "seed=%d: messages lost" % (seed,))
        for i, c in twice.items():
            self.assertEqual({heldId for _, heldId in c}, {c[0][1]}, "seed=%d: message %d" % (seed, i))
            self.assertEqual([r for r, _ in c[1:]], [True] * (len(c) - 1), "seed=%d: message %d" % (seed, i))
