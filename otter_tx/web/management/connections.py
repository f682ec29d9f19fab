"""
The connections and channels room: ``/api/connections...``,
``/api/vhosts/{v}/connections``, ``/api/channels...`` and
``/api/consumers...`` (``rabbit_mgmt_wm_connections``, ``_connection``,
``_channels``, ``_channel``, ``_consumers``), filtered as
``rabbit_mgmt_util:filter_conn_ch_list`` (:mod:`.authz`).
"""

from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import VHOST
from otter_tx.web.management.http import Response, notAuthorisedObject, notFound


class ConnectionsRoom(Room):
    """Connections, channels and consumers."""

    app = roomApp()

    @app.route("/api/connections", methods=["GET", "OPTIONS"])
    @endpoint()
    def connections(self, request, user):
        """``GET /api/connections``: all for monitoring users and administrators, else the user's own."""
        view = self._rateView(request)
        return [fmt.connectionDict(c, view) for c in self._visibleConnections(user)]

    @app.route("/api/vhosts/<vhost>/connections", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def vhostConnections(self, request, user, vhost):
        """``GET /api/vhosts/{vhost}/connections``, filtered as ``/api/connections``."""
        vh = self._vhost(vhost)
        view = self._rateView(request)
        return [fmt.connectionDict(c, view) for c in self._visibleConnections(user) if c.vhost is vh]

    def _authoriseUser(self, request, user, name):
        """
        The connection named ``name`` (404 when there is none) if ``user``
        may act on it, as ``rabbit_mgmt_util:is_authorized_user``: its
        owner may always; otherwise GET needs a monitoring or administrator
        tag and DELETE the administrator tag; else 401 ``User not
        authorised to access object``.  (RabbitMQ answers DELETE of a
        missing connection with 500; this is 404.)
        """
        for conn in self.broker.connections:
            if fmt.connectionName(conn) == name:
                break
        else:
            raise notFound()
        allowed = self._isAdmin(user) if request.method == b"DELETE" else self._isMonitor(user)
        if not (allowed or self._owns(user, conn)):
            raise notAuthorisedObject()
        return conn

    @app.route("/api/connections/<name>", methods=["GET", "DELETE", "OPTIONS"])
    @endpoint()
    def connection(self, request, user, name):
        """
        ``GET`` one connection; ``DELETE`` closes it with 320
        ``CONNECTION_FORCED - <X-Reason header or "Closed via management
        plugin">`` (204).  Who may do which: :meth:`_authoriseUser` (a
        monitoring user sees every connection but closes only its own).
        """
        conn = self._authoriseUser(request, user, name)
        if request.method == b"GET":
            return fmt.connectionDict(conn, self._rateView(request))
        reason = request.getHeader(b"x-reason")
        reason = reason.decode("utf-8", "replace") if reason else "Closed via management plugin"
        conn.close(320, "CONNECTION_FORCED - " + reason)
        return Response(204)

    @app.route("/api/connections/<name>/channels", methods=["GET", "OPTIONS"])
    @endpoint()
    def connectionChannels(self, request, user, name):
        """``GET /api/connections/{name}/channels`` (authorised as :meth:`_authoriseUser`)."""
        conn = self._authoriseUser(request, user, name)
        view = self._rateView(request)
        return [fmt.channelDict(ch, view) for _, ch in sorted(conn.channels.items())]

    @app.route("/api/channels", methods=["GET", "OPTIONS"])
    @endpoint()
    def channels(self, request, user):
        """``GET /api/channels``: the channels of the connections the user sees."""
        view = self._rateView(request)
        return [
            fmt.channelDict(ch, view)
            for c in self._visibleConnections(user)
            for _, ch in sorted(c.channels.items())
        ]

    @app.route("/api/channels/<name>", methods=["GET", "OPTIONS"])
    @endpoint()
    def channel(self, request, user, name):
        """
        ``GET /api/channels/{name}`` (``"<connection name> (N)"``): the
        channel as listed, plus ``consumer_details`` and RabbitMQ's
        ``deliveries`` / ``publishes`` (empty: otter_tx keeps no per-queue
        or per-exchange breakdown of a channel's counts).  404 when there is
        no such channel; 401 ``User not authorised to access object`` for a
        user who neither owns it nor has the monitoring tag.
        """
        for conn in self.broker.connections:
            found = [ch for ch in conn.channels.values() if fmt.channelName(ch) == name]
            if found:
                break
        else:
            raise notFound()
        if not (self._isMonitor(user) or self._owns(user, conn)):
            raise notAuthorisedObject()
        ch = found[0]
        d = fmt.channelDict(ch, self._rateView(request))
        d["consumer_details"] = [fmt.consumerDict(c.queue, c) for _, c in sorted(ch.session.consumers.items())
                                 if c.queue.vhost.findQueue(c.queue.name) is c.queue]
        d["deliveries"] = []
        d["publishes"] = []
        return d

    def _consumers(self, user, vhosts):
        """Consumers on ``vhosts`` whose connection the user sees (``filter_conn_ch_list``)."""
        seesAll = self._isMonitor(user)
        if self.broker.cluster is None:
            return [
                fmt.consumerDict(q, c) for vh in vhosts for _, q in sorted(vh.queues.items()) for c in q.consumers
                if seesAll or self._owns(user, c.session.client)
            ]
        # a cluster: this node's consumers, of its queues and of queues on other nodes
        # (a queue here also holds other nodes' consumers: they list those)
        wanted = {id(vh) for vh in vhosts}
        found = []
        for conn in list(self.broker.connections):
            for ch in list(getattr(conn, "channels", {}).values()):
                for c in ch.session.consumers.values():
                    q = c.queue
                    vh = getattr(q, "vhost", None)
                    if vh is None or id(vh) not in wanted or vh.findQueue(q.name) is not q:
                        continue
                    if seesAll or self._owns(user, c.session.client):
                        found.append((vh.name, q.name, c.tag, q, c))
        return [fmt.consumerDict(q, c) for _, _, _, q, c in sorted(found, key=lambda t: t[:3])]

    @app.route("/api/consumers", methods=["GET", "OPTIONS"])
    @endpoint()
    def consumers(self, request, user):
        """``GET /api/consumers``: every consumer for monitoring users and administrators, else the user's own."""
        return self._consumers(user, [vh for _, vh in sorted(self.broker.vhosts.items())])

    @app.route("/api/consumers/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint()
    def consumersVHost(self, request, user, vhost):
        """
        ``GET /api/consumers/{vhost}``, filtered as ``/api/consumers`` (no
        vhost permission needed, as in 3.10).
        """
        return self._consumers(user, [self._vhost(vhost)])
