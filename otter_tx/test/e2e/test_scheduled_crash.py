"""
Scheduled messages across SIGKILL (issue 11): the broker runs as ``twistd -n
ottermq`` on a data dir (the SQLite store); pika holds messages on a durable
x-delayed-message exchange and cancels and purges them over the
``x-delayed-command`` RPC.  A command is answered only once the store synced
it, so after ``kill -9`` and a restart a cancelled message stays cancelled, a
purge stays purged, the others keep their broker ids, and an exchange
deleted and re-created before the kill starts empty.
"""

import json
import os
import signal
import uuid

import pika
from twisted.internet import defer, threads
from twisted.trial.unittest import TestCase

from otter_tx.test.e2e import test_crash

EX = "sched-crash"


def _rpc(ch, command, args=None):
    """One x-delayed-command over direct reply-to: ``(status, JSON body)``."""
    got = {}
    cid = uuid.uuid4().hex
    tag = ch.basic_consume("amq.rabbitmq.reply-to",
                           lambda _c, _m, p, b: got.update({p.correlation_id: (p, b)}), auto_ack=True)
    ch.basic_publish(EX, "", json.dumps(args or {}).encode(), pika.BasicProperties(
        headers={"x-delayed-command": command}, reply_to="amq.rabbitmq.reply-to", correlation_id=cid))
    while cid not in got:
        ch.connection.process_data_events(0.05)
    ch.basic_cancel(tag)
    props, body = got[cid]
    return props.headers["x-delayed-status"], json.loads(body)


def _session(port, f):
    """Run ``f(channel)`` on a fresh pika connection to ``port``; returns its result."""
    c = pika.BlockingConnection(test_crash._params(port))
    try:
        return f(c.channel())
    finally:
        c.close()


def _declare(ch):
    ch.exchange_declare(EX, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})


def _listIds(ch):
    status, page = _rpc(ch, "list")
    return [(i["id"], i["message_id"]) for i in page["items"]]


class ScheduledCrashTests(TestCase):
    """Cancel, purge and delete of held messages survive kill -9."""

    timeout = 120

    @defer.inlineCallbacks
    def boot(self, dataDir):
        """Start twistd on ``dataDir``; returns ``(process, transport, port)``."""
        proc, transport = test_crash._startBroker(dataDir)
        port = yield proc.port
        return proc, transport, port

    @defer.inlineCallbacks
    def kill(self, proc, transport):
        """SIGKILL the broker and wait for it to end."""
        transport.signalProcess(signal.SIGKILL)
        yield proc.ended

    @defer.inlineCallbacks
    def test_cancelPurgeDeleteSurviveKill9(self):
        """Cancelled and purged messages stay gone after kill -9; a re-created exchange starts empty."""
        dataDir = os.path.abspath(self.mktemp())
        proc, transport, port = yield self.boot(dataDir)

        def first(ch):
            _declare(ch)
            for i, mid in enumerate(("a", "b", "a", "c")):
                ch.basic_publish(EX, "k", b"%d" % i, pika.BasicProperties(
                    headers={"x-delay": 600000 + i}, message_id=mid))
            return _rpc(ch, "cancel", {"id": "2"}), _rpc(ch, "cancel", {"message_id": "a"})

        answers = yield threads.deferToThread(_session, port, first)
        self.assertEqual(answers, ((204, {"cancelled": 1}), (204, {"cancelled": 2})))
        yield self.kill(proc, transport)

        proc, transport, port = yield self.boot(dataDir)

        def second(ch):
            ids = _listIds(ch)
            purged = _rpc(ch, "purge")
            # a held message of a durable exchange is stored: its confirm waits for the store's sync
            ch.confirm_delivery()
            ch.basic_publish(EX, "k", b"late", pika.BasicProperties(headers={"x-delay": 600000}))
            return ids, purged, _listIds(ch)

        ids, purged, after = yield threads.deferToThread(_session, port, second)
        self.assertEqual(ids, [("4", "c")])
        self.assertEqual(purged, (204, {"purged": 1}))
        # ids 1..1000 were reserved before the kill: the new message's id comes after them
        self.assertEqual(after, [("1001", None)])
        yield self.kill(proc, transport)

        proc, transport, port = yield self.boot(dataDir)

        def third(ch):
            ids = _listIds(ch)
            ch.exchange_delete(EX)
            _declare(ch)
            # an empty purge is answered after a store sync: a barrier for the delete and declare
            return ids, _rpc(ch, "purge")

        ids, barrier = yield threads.deferToThread(_session, port, third)
        self.assertEqual((ids, barrier), ([("1001", None)], (204, {"purged": 0})))
        yield self.kill(proc, transport)

        proc, transport, port = yield self.boot(dataDir)
        ids = yield threads.deferToThread(_session, port, _listIds)
        self.assertEqual(ids, [])
        yield self.kill(proc, transport)
