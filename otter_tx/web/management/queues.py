"""
The queues room: ``/api/queues...`` (``rabbit_mgmt_wm_queues``,
``_queue``, ``_queue_purge``, ``_queue_get``, ``_queue_actions``), and
otter_tx's queue insight: ``/browse``, ``/expiry``, ``/dead-letter``
(docs/management.md).  Reads go through a Session acting as the user, as
RabbitMQ's plugin opens a channel.
"""

import base64
import itertools

from twisted.internet.defer import Deferred, inlineCallbacks

from otter_tx.amqp.errors import AMQPError
from otter_tx.broker import stats
from otter_tx.broker.expiry import nowMs
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import VHOST
from otter_tx.web.management.http import (
    Response, badRequest, checkEncoding, getRefusal, jsonFlag, notFound, queryFlag,
)


_ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


#: what a queue list keeps with ``?disable_stats=true`` (RabbitMQ 3.10's
#: basic queue fields; ``enable_queue_totals=true`` adds the three lengths)
_BASIC_QUEUE_KEYS = ("arguments", "auto_delete", "durable", "exclusive", "name", "node", "policy",
                     "state", "type", "vhost", "leader", "members", "online")


_QUEUE_TOTAL_KEYS = ("messages", "messages_ready", "messages_unacknowledged")


def _queueList(request, queues):
    """
    A queue list (dicts) as ``?disable_stats=true`` (and
    ``enable_queue_totals=true``) asks: only the basic fields (and the
    lengths); unchanged without it.
    """
    if not queryFlag(request, "disable_stats"):
        return queues
    keep = _BASIC_QUEUE_KEYS
    if queryFlag(request, "enable_queue_totals"):
        keep = keep + _QUEUE_TOTAL_KEYS
    return [{k: q[k] for k in keep if k in q} for q in queues]


def _allQueues(vh):
    """The vhost's queues, this node's and (in a cluster) those of other nodes, by name."""
    if not vh.remoteQueues:
        return [q for _, q in sorted(vh.queues.items())]
    return [vh.findQueue(n) for n in sorted(set(vh.queues) | set(vh.remoteQueues))]


def _then(result, answer):
    """``answer`` now, or once ``result`` (a Deferred: a cluster's) fires."""
    if isinstance(result, Deferred):
        return result.addCallback(lambda _: answer)
    return answer


class QueuesRoom(Room):
    """The queues of the user's vhosts, one queue, its contents, bindings, ``/get`` and the insight views."""

    app = roomApp()

    def __init__(self, root):
        Room.__init__(self, root)
        # in a cluster this node sends its queues' message_stats to the others once a second
        broker = self.broker
        self.broker.describeQueueStats = lambda q: fmt.defaultView(broker).messageStats(
            "queue", q, stats.QUEUE_KEYS, stats.queueValues(q))
        # and its stream protocol subscriptions as consumers of their streams (their queue JSON
        # counts and lists every node's)
        self.broker.describeStreamSubscriptions = lambda: fmt.streamSubscriptionsByStream(broker)

    @app.route("/api/queues", methods=["GET", "OPTIONS"])
    @endpoint()
    def queuesAll(self, request, user):
        """``GET /api/queues``: the queues of the user's vhosts (RabbitMQ's list fields)."""
        unacked = fmt.unackedBytes(self.broker)
        view = self._rateView(request)
        return _queueList(request, [
            fmt.queueDict(q, unacked, view=view)
            for vh in self._loginVHosts(user)
            for q in _allQueues(vh)
        ])

    @app.route("/api/queues/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def queuesVHost(self, request, user, vhost):
        """``GET /api/queues/{vhost}``."""
        vh = self._vhost(vhost)
        unacked = fmt.unackedBytes(self.broker)
        view = self._rateView(request)
        return _queueList(request, [fmt.queueDict(q, unacked, view=view) for q in _allQueues(vh)])

    @app.route("/api/queues/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(VHOST)
    def queue(self, request, user, vhost, name):
        """
        ``GET`` one queue (with ``consumer_details``); ``PUT`` declares
        (body ``{"durable", "auto_delete", "arguments"}``; 201 created, 204
        equivalent, 400 inequivalent or invalid arguments); ``DELETE``
        (``?if-unused=true&if-empty=true``; 204, 404, 400 in use / not
        empty).  PUT and DELETE need configure permission on the queue, PUT
        with a dead-letter exchange also read on the queue and write on
        that exchange (:func:`~otter_tx.broker.access.queueDeclareChecks`; 401 ``Access refused.``).
        """
        vh = self._vhost(vhost)
        if request.method == b"PUT":
            session = self._session(user, vh)
            session.checkQueueDeclare(name)  # a refused request's body is never parsed
            body = self._body(request)
            args = body.get("arguments") or {}
            if not isinstance(args, dict):
                raise badRequest("arguments must be an object")
            existed = vh.findQueue(name) is not None
            declared = session.declareQueue(name, durable=jsonFlag(body.get("durable")),
                                            autoDelete=jsonFlag(body.get("auto_delete")), arguments=args)
            return _then(declared, Response(204 if existed else 201))
        q = self._queue(vh, name)
        if request.method == b"DELETE":
            deleted = self._session(user, vh).deleteQueue(
                name, ifUnused=queryFlag(request, "if-unused"), ifEmpty=queryFlag(request, "if-empty"))
            return _then(deleted, Response(204))
        if q.down:
            # RabbitMQ 3.10 lists a queue of a stopped node, and answers 404 for it alone
            raise notFound()
        return fmt.queueDict(q, fmt.unackedBytes(self.broker), detail=True, view=self._rateView(request))

    @app.route("/api/queues/<vhost>/<name>/contents", methods=["DELETE", "OPTIONS"])
    @endpoint(VHOST)
    def queueContents(self, request, user, vhost, name):
        """
        ``DELETE /api/queues/{vhost}/{name}/contents``: purge (204, 404);
        needs read permission on the queue, as ``queue.purge`` (401
        ``Access refused.``).
        """
        vh = self._vhost(vhost)
        self._queue(vh, name)  # 404 when missing
        return _then(self._session(user, vh).purgeQueue(name), Response(204))

    @app.route("/api/queues/<vhost>/<name>/bindings", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def queueBindings(self, request, user, vhost, name):
        """``GET /api/queues/{vhost}/{name}/bindings``, the default-exchange binding first."""
        vh = self._vhost(vhost)
        self._queue(vh, name)  # 404 when missing
        return [b for b in fmt.vhostBindings(vh) if b["destination_type"] == "queue" and b["destination"] == name]

    @app.route("/api/queues/<vhost>/<name>/get", methods=["POST", "OPTIONS"])
    @endpoint(VHOST)
    def queueGet(self, request, user, vhost, name):
        """
        ``POST /api/queues/{vhost}/{name}/get`` with ``{"count", "ackmode",
        "encoding", "truncate"}``: fetch up to ``count`` messages and
        requeue, ack or reject them per ``ackmode``; returns RabbitMQ's
        message objects (``"properties": []`` when there are none, as
        3.10 renders it).  A bad ``ackmode`` is 400 (RabbitMQ 3.10: 500).
        Needs read permission on the queue, checked before it is looked up
        as ``basic.get`` does: 401 with the full ``ACCESS_REFUSED - ...``
        text (:func:`channelRefusal`).
        """
        vh = self._vhost(vhost)
        session = self._readingSession(user, vh, name)
        body = self._body(request)
        self._require(body, "count", "ackmode", "encoding")
        count, ackmode, encoding = body["count"], body["ackmode"], body["encoding"]
        truncate = body.get("truncate")
        checkEncoding(encoding)
        if ackmode not in _ACKMODES:
            raise badRequest("Invalid ackmode %s" % (ackmode,))
        try:
            count = int(count)
            truncate = int(truncate) if truncate not in (None, "") else None
        except (TypeError, ValueError):
            raise badRequest("count and truncate must be integers")
        out = []
        remote = None
        try:
            q = session.readableQueue(name)
            # ack_requeue_false is a no-ack basic.get, as the plugin's (its get_no_ack count)
            noAck = ackmode == "ack_requeue_false"
            if q.remote:
                # a queue on another node: each get is answered there (it closes the session)
                remote = self._remoteGet(session, name, count, ackmode, noAck, encoding, truncate)
                return remote
            for _ in range(max(0, count)):
                got = session.get(name, noAck=noAck)
                if got is None:
                    break
                out.append(self._fetchedJson(got, encoding, truncate))
            if out:
                self._settleFetched(session, ackmode, noAck)
        except AMQPError as e:
            raise getRefusal(e)
        finally:
            if remote is None:
                session.close()
        return out

    def _fetchedJson(self, got, encoding, truncate):
        """One ``/get`` answer from a Session's ``get`` result; a quorum queue's carries x-delivery-count."""
        _, entry, q = got
        return self._messageJson(q.deliveredMessage(entry, get=True), entry.redelivered, q.readyCount,
                                 encoding, truncate)

    @staticmethod
    def _settleFetched(session, ackmode, noAck):
        """The fetched messages are settled together, as the plugin's channel does."""
        if ackmode in ("ack_requeue_true", "reject_requeue_true"):
            session.nack(0, multiple=True, requeue=True)
        elif not noAck:
            session.nack(0, multiple=True, requeue=False)

    @inlineCallbacks
    def _remoteGet(self, session, name, count, ackmode, noAck, encoding, truncate):
        """:meth:`queueGet` of a queue on another node (the same rules, each get a request there)."""
        out = []
        try:
            for _ in range(max(0, count)):
                got = yield session.get(name, noAck=noAck)
                if got is None:
                    break
                out.append(self._fetchedJson(got, encoding, truncate))
            if out:
                self._settleFetched(session, ackmode, noAck)
        except AMQPError as e:
            raise getRefusal(e)
        finally:
            session.close()
        return out

    def _readingSession(self, user, vh, name):
        """
        The Session of ``/get`` and ``/browse`` once ``user`` may read queue
        ``name``, checked before the request body is parsed (a refused
        request never has its body read): 401 as :func:`getRefusal`.
        """
        session = self._session(user, vh)
        try:
            session.checkQueueRead(name)
        except AMQPError as e:
            raise getRefusal(e)
        return session

    @staticmethod
    def _messageJson(m, redelivered, remaining, encoding, truncate):
        payload = m.body if truncate is None else m.body[:truncate]
        if encoding == "auto":
            try:
                text, enc = payload.decode("utf-8"), "string"
            except UnicodeDecodeError:
                text, enc = base64.b64encode(payload).decode(), "base64"
        else:
            text, enc = base64.b64encode(payload).decode(), "base64"
        return {
            "payload_bytes": m.size,
            "redelivered": redelivered,
            "exchange": m.exchange,
            "routing_key": m.routingKey,
            "message_count": remaining,
            "properties": fmt.jsonable(m.props) if m.props else [],
            "payload": text,
            "payload_encoding": enc,
        }

    @app.route("/api/queues/<vhost>/<name>/browse", methods=["POST", "OPTIONS"])
    @endpoint(VHOST)
    def queueBrowse(self, request, user, vhost, name):
        """
        ``POST /api/queues/{vhost}/{name}/browse`` with ``{"count": N,
        "offset": 0, "encoding": "auto"|"base64", "truncate": bytes}``
        (otter_tx only; ``count`` required, the rest optional): up to
        ``count`` ready messages after the first ``offset``, in delivery
        order (paged-out ones read from their files), in ``/get``'s message
        shape (``message_count``: ready messages after this one).  Nothing
        is taken, requeued or marked redelivered.  Needs read permission on
        the queue, as ``/get`` (401 with the AMQP refusal text); 400 for a
        bad encoding or non-integer numbers; 404 ``not_found`` for no queue.
        """
        vh = self._vhost(vhost)
        session = self._readingSession(user, vh, name)
        body = self._body(request)
        self._require(body, "count")
        encoding = body.get("encoding", "auto")
        checkEncoding(encoding)
        try:
            count = max(0, int(body["count"]))
            offset = max(0, int(body.get("offset") or 0))
            truncate = body.get("truncate")
            truncate = int(truncate) if truncate not in (None, "") else None
        except (TypeError, ValueError):
            raise badRequest("count, offset and truncate must be integers")
        try:
            q = session.readableQueue(name)
        except AMQPError as e:  # as /get answers them
            raise getRefusal(e)
        finally:
            session.close()
        now = nowMs(self.clock)
        live = (e for e in q.readyEntries() if e.expiresAt is None or e.expiresAt > now)
        ready = q.readyCount
        return [
            self._messageJson(e.message, e.redelivered, max(0, ready - offset - i - 1), encoding, truncate)
            for i, e in enumerate(itertools.islice(live, offset, offset + count))
        ]

    #: the time-to-expiry buckets of ``/expiry``: (key, upper bound in ms)
    _EXPIRY_BUCKETS = (("within_1s", 1000.0), ("within_10s", 10000.0), ("within_1min", 60000.0))

    @app.route("/api/queues/<vhost>/<name>/expiry", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def queueExpiry(self, request, user, vhost, name):
        """
        ``GET /api/queues/{vhost}/{name}/expiry`` (otter_tx only): the ready
        messages by time to expiry, ``{"within_1s", "within_10s",
        "within_1min", "later", "never"}`` (counts; each bucket excludes the
        earlier ones; ``never``: no TTL), and the queue's ``x-expires``
        lease: ``"x_expires"`` (ms or null) and ``"expires_at"`` (epoch ms
        when the queue is deleted if unused, or null: no ``x-expires``, or
        the queue has consumers), and ``"estimated"``: how many of the
        counted messages are paged out and were placed by their segment's
        earliest expiry (no file is read: O(in-memory messages + paged
        segments), :meth:`ReadyStore.expiries <otter_tx.broker.readystore.ReadyStore.expiries>`).
        404 for no queue.
        """
        vh = self._vhost(vhost)
        q = self._queue(vh, name)
        now = nowMs(self.clock)
        counts = dict.fromkeys(("within_1s", "within_10s", "within_1min", "later", "never"), 0)
        buckets = self._EXPIRY_BUCKETS
        estimated = 0
        for at, n, exact in q.ready.expiries():
            if not exact:
                estimated += n
            if at is None:
                counts["never"] += n
                continue
            left = at - now
            for key, bound in buckets:
                if left <= bound:
                    counts[key] += n
                    break
            else:
                counts["later"] += n
        counts["estimated"] = estimated
        deadline = q.leaseDeadline()
        counts["expires_at"] = int(deadline) if deadline is not None else None
        counts["x_expires"] = q.settings.expires
        return counts

    @app.route("/api/queues/<vhost>/<name>/dead-letter", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def queueDeadLetter(self, request, user, vhost, name):
        """
        ``GET /api/queues/{vhost}/{name}/dead-letter`` (otter_tx only): where
        the queue dead-letters to, from its arguments and policy:
        ``{"exchange": str or null, "routing_key": str or null, "strategy":
        "at-most-once"|"at-least-once"|null, "queues": [{"vhost", "name",
        "routing_key"}]}``.  ``queues`` are those a dead letter reaches now
        (following exchange-to-exchange bindings and alternate exchanges,
        nothing counted or held): with a dead-letter routing key, routed
        with it (a headers exchange sees a message without headers of its
        own); without one the message keeps its own routing keys, so every
        queue bound to the exchange is listed with its binding key.  Empty
        when the exchange does not exist.  404 for no queue.
        """
        vh = self._vhost(vhost)
        q = self._queue(vh, name)
        s = q.settings
        if s.dlx is None:
            return {"exchange": None, "routing_key": None, "strategy": None, "queues": []}
        return {
            "exchange": s.dlx,
            "routing_key": s.dlrk,
            "strategy": s.dlStrategy,  # the one the broker applies (deadletter.py), not the one asked for
            "queues": [{"vhost": vh.name, "name": n, "routing_key": k}
                       for n, k in sorted(vh.reachableQueues(s.dlx, s.dlrk).items())],
        }
