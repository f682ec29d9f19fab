"""
The quorum queue membership room: RabbitMQ 3.13/4.x's replica operations
(``rabbit_mgmt_wm_quorum_queue_replicas_add_member``, ``_delete_member``,
``_grow``, ``_shrink``) and ``rabbit_mgmt_wm_rebalance_queues``, over
:mod:`otter_tx.cluster.membership` (docs/management.md, docs/cluster.md
"Membership").  Every route needs the administrator tag.

- ``POST /api/queues/quorum/{vhost}/{name}/replicas/add`` ``{"node": N}``:
  204 (also when N is a member already: idempotent, as RabbitMQ);
- ``DELETE /api/queues/quorum/{vhost}/{name}/replicas/delete``
  ``{"node": N}``: 202 (also when N is not a member);
- ``POST /api/queues/quorum/replicas/on/{node}/grow`` ``{"strategy":
  "all"|"even", "vhost_pattern", "queue_pattern"}``: 204;
- ``DELETE /api/queues/quorum/replicas/on/{node}/shrink``: 202;
- ``POST /api/rebalance/queues``: 204 (quorum queues and streams, as
  RabbitMQ's ``rabbit_amqqueue:rebalance(all, ...)``).

A replicated stream's members change as with ``rabbitmq-streams
add_replica`` / ``delete_replica`` (RabbitMQ has no HTTP route for them;
these are otter_tx's, shaped as the quorum queue ones):

- ``POST /api/queues/stream/{vhost}/{name}/replicas/add`` ``{"node": N}``:
  204 (N joins the leader and reads the log it lacks, then is in sync);
- ``DELETE /api/queues/stream/{vhost}/{name}/replicas/delete``
  ``{"node": N}``: 202 (N's copy of the log is deleted there).

Their refusals are ``rabbit_stream_queue``'s reasons: 503
``classic_queue_not_supported`` / ``quorum_queue_not_supported`` for a queue
of another type, ``node_not_running``, ``last_stream_member``.

Errors as RabbitMQ's: a missing body key 400 ``[{key_missing,node}]``; a
missing queue 404; a refused change 503 ``{"error":
"service_unavailable", "reason": R}`` with RabbitMQ's reasons
(``node_not_running``: N is not a running cluster node, also on a node
without a cluster; ``last_node``; ``classic_queue_not_supported``) or
otter_tx's (``no_in_sync_follower``, ``leader_down``).  Where RabbitMQ
differs: grow to a node that is not running is 404 (RabbitMQ's
``resource_exists`` is false, yet a POST goes on and does nothing: 204),
and add on a missing queue is 404 (RabbitMQ: 503 ``not_found``).
"""

from twisted.internet.defer import inlineCallbacks

from otter_tx.broker.arguments import QUORUM, STREAM, queueType
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import ADMIN
from otter_tx.web.management.http import HTTPError, Response, badRequest, notFound

#: grow's strategies, as :data:`otter_tx.cluster.membership.STRATEGIES` (the web does not import the cluster)
STRATEGIES = ("all", "even")


def unavailable(reason):
    """503 ``{"error":"service_unavailable","reason": reason}`` (``rabbit_mgmt_util:service_unavailable``)."""
    return HTTPError(503, "service_unavailable", reason)


def _httpError(e):
    if e.reason == "not_found":
        return notFound()
    if e.reason == "bad_request":
        return badRequest(e.text)
    return unavailable(e.reason)


class MembersRoom(Room):
    """Add and delete quorum queue and stream members, grow, shrink, rebalance."""

    app = roomApp()

    def _membership(self):
        """The node's :class:`~otter_tx.cluster.membership.Membership`, or None without a cluster."""
        cluster = getattr(self.broker, "cluster", None)
        return getattr(cluster, "membership", None)

    def _me(self):
        return fmt.nodeName(self.broker)

    def _nodeArg(self, request):
        body = self._body(request)
        self._require(body, "node")
        node = body["node"]
        if not isinstance(node, str) or not node:
            raise badRequest("node must be a node name")
        return node

    def _quorumQueue(self, request, vhost, name):
        """
        The node the body names, after 404 for a missing vhost or queue,
        400 for a missing ``node`` and 503 ``classic_queue_not_supported``
        for a queue of another type (RabbitMQ's order).
        """
        q = self._queue(self._vhost(vhost), name)
        node = self._nodeArg(request)
        if queueType(q.arguments) != QUORUM:
            raise unavailable("classic_queue_not_supported")
        return node

    @inlineCallbacks
    def _run(self, membership, d, answer):
        try:
            yield d
        except membership.Error as e:
            raise _httpError(e)
        return answer

    @app.route("/api/queues/quorum/<vhost>/<name>/replicas/add", methods=["POST", "OPTIONS"])
    @endpoint(ADMIN)
    def addMember(self, request, user, vhost, name):
        """``POST {"node": N}``: N becomes a member of the quorum queue (it joins and syncs); 204."""
        return self._add(self._quorumQueue(request, vhost, name), vhost, name, QUORUM)

    def _add(self, node, vhost, name, kind):
        """``node`` joins queue ``name`` (``kind``: quorum or stream): 204, or 503 ``node_not_running``."""
        membership = self._membership()
        if membership is None:
            if node == self._me():
                return Response(204)
            raise unavailable("node_not_running")
        return self._run(membership, membership.addMember(vhost, name, node, kind), Response(204))

    def _delete(self, node, vhost, name, kind, last):
        """``node`` leaves queue ``name``: 202, or 503 ``last`` for this single node's own member."""
        membership = self._membership()
        if membership is None:
            if node == self._me():
                raise unavailable(last)
            return Response(202)
        return self._run(membership, membership.deleteMember(vhost, name, node, kind), Response(202))

    @app.route("/api/queues/quorum/<vhost>/<name>/replicas/delete", methods=["DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def deleteMember(self, request, user, vhost, name):
        """
        ``DELETE {"node": N}``: N is no longer a member (the leader's own
        member: the leadership goes to an in-sync follower first); 202.
        """
        return self._delete(self._quorumQueue(request, vhost, name), vhost, name, QUORUM, "last_node")

    def _stream(self, request, vhost, name):
        """The node the body names, after 404 for a missing vhost or queue, 400, and 503 for another type."""
        q = self._queue(self._vhost(vhost), name)
        node = self._nodeArg(request)
        kind = queueType(q.arguments)
        if kind != STREAM:
            raise unavailable("quorum_queue_not_supported" if kind == QUORUM else "classic_queue_not_supported")
        return node

    @app.route("/api/queues/stream/<vhost>/<name>/replicas/add", methods=["POST", "OPTIONS"])
    @endpoint(ADMIN)
    def addReplica(self, request, user, vhost, name):
        """
        ``POST {"node": N}``: N becomes a member of the stream (``rabbitmq-streams
        add_replica``): it joins the leader, reads what it lacks and is in sync; 204.
        """
        return self._add(self._stream(request, vhost, name), vhost, name, STREAM)

    @app.route("/api/queues/stream/<vhost>/<name>/replicas/delete", methods=["DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def deleteReplica(self, request, user, vhost, name):
        """
        ``DELETE {"node": N}``: N is no longer a member of the stream
        (``rabbitmq-streams delete_replica``; the leader's own member: the
        leadership goes to an in-sync follower first); 202.
        """
        return self._delete(self._stream(request, vhost, name), vhost, name, STREAM, "last_stream_member")

    @app.route("/api/queues/quorum/replicas/on/<node>/grow", methods=["POST", "OPTIONS"])
    @endpoint(ADMIN)
    def grow(self, request, user, node):
        """
        ``POST {"strategy": "all"|"even", "vhost_pattern", "queue_pattern"}``:
        ``node`` becomes a member of every matching quorum queue (``even``:
        of those with an even number of members); 204.
        """
        body = self._body(request)
        self._require(body, "vhost_pattern", "queue_pattern", "strategy")
        strategy = body["strategy"]
        if strategy not in STRATEGIES:
            raise badRequest("strategy must be one of %s" % (", ".join(STRATEGIES),))
        for k in ("vhost_pattern", "queue_pattern"):
            if not isinstance(body[k], str):
                raise badRequest("%s must be a string" % (k,))
        membership = self._membership()
        if membership is None:
            if node == self._me():
                return Response(204)  # every quorum queue has this node, its only member
            raise notFound()
        if node not in membership.running():
            raise notFound()
        return self._run(membership, membership.grow(node, strategy, body["vhost_pattern"], body["queue_pattern"]),
                         Response(204))

    @app.route("/api/queues/quorum/replicas/on/<node>/shrink", methods=["DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def shrink(self, request, user, node):
        """``DELETE``: ``node``'s member goes from every quorum queue where it is not the only one; 202."""
        membership = self._membership()
        if membership is None:
            return Response(202)
        return self._run(membership, membership.shrink(node), Response(202))

    @app.route("/api/rebalance/queues", methods=["POST", "OPTIONS"])
    @endpoint(ADMIN)
    def rebalance(self, request, user):
        """``POST``: move quorum queue and stream leaderships so each running node leads about as many; 204."""
        membership = self._membership()
        if membership is None:
            return Response(204)
        return self._run(membership, membership.rebalance(), Response(204))
