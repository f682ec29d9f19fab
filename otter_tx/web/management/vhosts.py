"""
The vhosts room: ``/api/vhosts``, ``/api/vhosts/{v}`` and
``/api/vhost-limits...`` (``rabbit_mgmt_wm_vhosts``, ``_vhost``,
``_limits``, ``_limit``).
"""

from otter_tx.broker import stats
from otter_tx.broker.vhost import LimitError
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import ADMIN, VHOST_VISIBLE
from otter_tx.web.management.http import HTTPError, Response, badRequest, notFound


class VHostsRoom(Room):
    """Vhosts and their limits."""

    app = roomApp()

    def _clusterState(self):
        """
        ``{node: "running"}`` for this node and (in a cluster) each node it
        has a link to, as RabbitMQ 3.10 (a stopped node is left out).
        """
        state = {fmt.nodeName(self.broker): "running"}
        cluster = self.broker.cluster
        if cluster is not None:
            state.update((name, "running") for name in cluster.links)
        return state

    def _vhostDict(self, vh, view, vhostBytes=None):
        """
        A vhost as ``GET /api/vhosts/{name}`` shows it: queue lengths,
        ``message_stats`` (:data:`~otter_tx.broker.stats.VHOST_KEYS`, closed
        channels included) and ``recv_oct``/``send_oct`` of its connections
        (closed ones included), each with details as ``view`` asks
        (``vhostBytes``: :func:`~otter_tx.broker.stats.vhostBytes` when the
        caller lists several vhosts).
        """
        if vhostBytes is None:
            vhostBytes = stats.vhostBytes(self.broker)
        queues = list(vh.queues.values())
        d = {
            "name": vh.name,
            "description": "Default virtual host" if vh.name == "/" else "",
            "tags": [],
            "metadata": {"description": "Default virtual host" if vh.name == "/" else "", "tags": []},
            "default_queue_type": "undefined",
            "tracing": False,
            "cluster_state": self._clusterState(),
            "message_stats": view.messageStats("vhost", vh, stats.VHOST_KEYS, stats.vhostValues(vh)),
        }
        d.update(view.lengthStats("vhost-lengths", vh, stats.lengthValues(queues)))
        for q in vh.remoteQueues.values():
            # a cluster: the running queues of other nodes, from their figures (no samples)
            if not q.down:
                ready, unacked = q.figures.get("messages_ready", 0), q.figures.get("messages_unacknowledged", 0)
                d["messages"] = d.get("messages", 0) + ready + unacked
                d["messages_ready"] = d.get("messages_ready", 0) + ready
                d["messages_unacknowledged"] = d.get("messages_unacknowledged", 0) + unacked
        d.update(view.dataStats("vhost-data", vh, vhostBytes[vh]))
        return d

    @app.route("/api/vhosts", methods=["GET", "OPTIONS"])
    @endpoint()
    def vhosts(self, request, user):
        """``GET /api/vhosts``."""
        view = self._rateView(request)
        vhostBytes = stats.vhostBytes(self.broker)
        return [self._vhostDict(vh, view, vhostBytes) for vh in self._visibleVHosts(user)]

    @app.route("/api/vhosts/<vhost>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def vhost(self, request, user, vhost):
        """
        ``GET``; ``PUT`` (201 / 204; the creating user gets full
        permissions on a new vhost, as in RabbitMQ; the body's description
        and tags are not stored); ``DELETE`` (204 / 404; sends its
        connections connection.close 320 and answers without waiting for
        their close-ok, as RabbitMQ does).  Administrators only, every method, as 3.10's
        ``rabbit_mgmt_wm_vhost`` (``is_authorized_admin``).
        """
        if request.method == b"GET":
            return self._vhostDict(self._vhost(vhost), self._rateView(request))
        if request.method == b"PUT":
            self._body(request)
            existed = vhost in self.broker.vhosts
            self.broker.addVHost(vhost)
            if not existed:
                # RabbitMQ grants the creating user full permissions on a new vhost
                self.broker.setPermissions(user.name, vhost)
            return Response(204 if existed else 201)
        if vhost not in self.broker.vhosts:
            raise notFound()
        # RabbitMQ answers at once: the connections were sent connection.close
        # 320 and are not waited for (a client may take its time with close-ok)
        self.broker.deleteVHost(vhost)
        return Response(204)

    @staticmethod
    def _vhostLimits(vhosts):
        """``[{"vhost", "value": {name: int}}]`` (an emptied set shows ``[]``)."""
        return [
            {"vhost": vh.name, "value": dict(vh.limits) if vh.limits else []}
            for vh in vhosts if vh.limits is not None
        ]

    @app.route("/api/vhost-limits", methods=["GET", "OPTIONS"])
    @endpoint(VHOST_VISIBLE)
    def vhostLimitsAll(self, request, user):
        """
        ``GET /api/vhost-limits``: ``[{"vhost": "v", "value":
        {"max-connections": 10, "max-queues": 5}}]`` for every vhost the
        user sees that ever had a limit (``value`` is ``[]`` once all were
        deleted, as RabbitMQ 3.10 lists it).
        """
        return self._vhostLimits(self._visibleVHosts(user))

    @app.route("/api/vhost-limits/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST_VISIBLE)
    def vhostLimits(self, request, user, vhost):
        """
        ``GET /api/vhost-limits/{vhost}``: as the list, for one vhost
        (``[]`` without limits; 404 for a missing vhost).
        """
        vh = self._vhost(vhost)
        return self._vhostLimits([vh]) if vh.limits else []

    @app.route("/api/vhost-limits/<vhost>/<name>", methods=["PUT", "DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def vhostLimit(self, request, user, vhost, name):
        """
        ``PUT /api/vhost-limits/{vhost}/{name}`` with ``{"value": N}`` (an
        integer; negative means no limit) and ``DELETE``: 204; administrators
        only.  ``name`` is ``max-connections`` or ``max-queues``; 400
        ``Validation failed`` with RabbitMQ's texts otherwise, 400
        ``[{key_missing,value}]`` without ``value``, 404 ``vhost_not_found``
        for a missing vhost.
        """
        vh = self.broker.vhosts.get(vhost)
        if vh is None:
            raise HTTPError(404, "not_found", "vhost_not_found")
        if request.method == b"DELETE":
            vh.clearLimit(name)
            return Response(204)
        body = self._body(request)
        self._require(body, "value")
        try:
            vh.setLimit(name, body["value"])
        except LimitError as e:
            raise badRequest("Validation failed\n\n%s\n" % (e,))
        return Response(204)
