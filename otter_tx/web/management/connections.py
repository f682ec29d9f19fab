"""
The connections and channels room: ``/api/connections...``,
``/api/vhosts/{v}/connections``, ``/api/channels...`` and
``/api/consumers...`` (``rabbit_mgmt_wm_connections``, ``_connection``,
``_channels``, ``_channel``, ``_consumers``), filtered as
``rabbit_mgmt_util:filter_conn_ch_list`` (:mod:`.authz`).

Connections are AMQP 0-9-1's (``Broker.connections``) and, as RabbitMQ
lists them with ``"protocol": "stream"``, the stream protocol's
(``Broker.streamCounters.connections``; :mod:`.streams` serves
rabbitmq_stream_management's ``/api/stream/...`` routes).
"""

from otter_tx.broker import stats
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import VHOST
from otter_tx.web.management.http import Response, notAuthorisedObject, notFound, queryArg

#: the query arguments of a request's rate view, passed to the other nodes of a cluster
RANGE_ARGS = ("msg_rates_age", "msg_rates_incr", "lengths_age", "lengths_incr", "data_rates_age", "data_rates_incr")


def isStream(conn):
    """Whether ``conn`` is a stream protocol connection (not an AMQP one)."""
    return not hasattr(conn, "channels")


def _connectionDict(conn, view):
    """``conn`` (AMQP or stream) as ``/api/connections/{name}`` shows it."""
    if isStream(conn):
        return fmt.streamConnectionDict(conn, view, detail=True)
    return fmt.connectionDict(conn, view)


def _channelKey(d):
    """Where a channel sorts in a list: its connection's name, then its number."""
    return (d.get("connection_details", {}).get("name") or "", d.get("number") or 0)


def _consumerKey(d):
    """Where a consumer sorts in a list: its queue's vhost and name, then its tag."""
    return (d["queue"]["vhost"], d["queue"]["name"], d["consumer_tag"])


class ConnectionsRoom(Room):
    """
    Connections, channels and consumers.  In a cluster the lists also hold
    the other nodes' (asked over the links with :meth:`ClusterNode.askAll
    <otter_tx.cluster.node.ClusterNode.askAll>`; a node that does not answer
    in the link's ask timeout is left out), and a connection on another
    node can be shown and closed from any node, as on RabbitMQ.
    """

    app = roomApp()

    def __init__(self, root):
        Room.__init__(self, root)
        broker = self.broker
        # what the other nodes of a cluster ask this one (their lists include this node's)
        broker.addClusterHandler("mgmt.connections", self._answerConnections)
        broker.addClusterHandler("mgmt.channels", self._answerChannels)
        broker.addClusterHandler("mgmt.connection", self._answerConnection)
        broker.addClusterHandler("mgmt.closeConnection", self._answerClose)
        broker.addClusterHandler("mgmt.consumers", self._answerConsumers)
        broker.addClusterHandler("mgmt.channel", self._answerChannel)

    # --- the cluster: asking the other nodes, and answering them -----------------

    @staticmethod
    def _ranges(request):
        return [queryArg(request, a) for a in RANGE_ARGS]

    def _viewOf(self, ranges):
        """The rate view another node's request asked for (its query arguments, validated there)."""
        parsed = []
        for i in range(0, 6, 2):
            try:
                parsed.append(stats.parseRange(ranges[i], ranges[i + 1]))
            except stats.InvalidRange:
                parsed.append(None)
        return fmt.RateView(self.broker.sampler, *parsed)

    def _argsFor(self, request, user, **more):
        """What another node needs to list for ``user``: whose connections (None: all) and the rate ranges."""
        args = {"owner": None if self._isMonitor(user) else user.name, "ranges": self._ranges(request)}
        args.update(more)
        return args

    def _localConnections(self, owner, vhost):
        conns = sorted(self.broker.connections, key=fmt.connectionName)
        return [c for c in conns
                if (owner is None or (c.user is not None and c.user.name == owner))
                and (vhost is None or (c.vhost is not None and c.vhost.name == vhost))]

    def _answerConnections(self, args):
        view = self._viewOf(args["ranges"])
        found = [fmt.connectionDict(c, view) for c in self._localConnections(args["owner"], args.get("vhost"))]
        found += [fmt.streamConnectionDict(c, view)
                  for c in fmt.streamConnections(self.broker, args["owner"], args.get("vhost"))]
        return found

    def _answerChannels(self, args):
        view = self._viewOf(args["ranges"])
        return [fmt.channelDict(ch, view) for c in self._localConnections(args["owner"], None)
                for _, ch in sorted(c.channels.items())]

    def _findLocal(self, name):
        """This node's connection ``name``: AMQP's, else a stream connection; None when it has none."""
        for conn in self.broker.connections:
            if fmt.connectionName(conn) == name:
                return conn
        for conn in fmt.streamConnections(self.broker):
            if conn.name == name:
                return conn
        return None

    def _answerConnection(self, args):
        """Connection ``name`` of this node (None when it has none), with its channels when asked."""
        conn = self._findLocal(args["name"])
        if conn is None:
            return None
        view = self._viewOf(args["ranges"])
        d = {"connection": _connectionDict(conn, view)}
        if args.get("channels"):
            d["channels"] = [] if isStream(conn) else [fmt.channelDict(ch, view)
                                                       for _, ch in sorted(conn.channels.items())]
        return d

    def _answerClose(self, args):
        """Close connection ``name`` of this node if ``owner`` (None: anyone) owns it: closed, forbidden or None."""
        conn = self._findLocal(args["name"])
        if conn is None:
            return None
        owner = args.get("owner")
        if owner is not None and not (conn.user is not None and conn.user.name == owner):
            return "forbidden"
        self._close(conn, args["reason"])
        return "closed"

    @staticmethod
    def _close(conn, reason):
        """
        Close ``conn`` as DELETE does: an AMQP connection with 320
        ``CONNECTION_FORCED - <reason>``; a stream connection's socket is
        closed (RabbitMQ 3.10 sends its client no close frame, checked on the peer).
        """
        if isStream(conn):
            conn.closeConnection()
        else:
            conn.close(320, "CONNECTION_FORCED - " + reason)

    def _remoteConnection(self, request, user, name, channels=False):
        """
        Connection ``name`` on another node (a Deferred of its answer, with
        ``channels`` when asked): 404 when no node has it, 401 as
        :meth:`_authoriseUser` when the user may not see it.
        """
        args = {"name": name, "ranges": self._ranges(request), "channels": channels}

        def found(answers):
            for _, d in sorted(answers.items()):
                if isinstance(d, dict) and "connection" in d:
                    break
            else:
                raise notFound()
            if not (self._isMonitor(user) or d["connection"].get("user") == user.name):
                raise notAuthorisedObject()
            return d

        return self.broker.cluster.askAll("mgmt.connection", args).addCallback(found)

    def _remoteClose(self, user, name, reason):
        """Close connection ``name`` on whichever other node has it (204; 404; 401 as :meth:`_authoriseUser`)."""
        args = {"name": name, "reason": reason, "owner": None if self._isAdmin(user) else user.name}

        def closed(answers):
            results = set(answers.values())
            if "closed" in results:
                return Response(204)
            if "forbidden" in results:
                raise notAuthorisedObject()
            raise notFound()

        return self.broker.cluster.askAll("mgmt.closeConnection", args).addCallback(closed)

    @app.route("/api/connections", methods=["GET", "OPTIONS"])
    @endpoint()
    def connections(self, request, user):
        """``GET /api/connections``: all for monitoring users and administrators, else the user's own."""
        view = self._rateView(request)
        local = [fmt.connectionDict(c, view) for c in self._visibleConnections(user)]
        local += [fmt.streamConnectionDict(c, view) for c in self._visibleStreamConnections(user)]
        if self.broker.cluster is None:
            local.sort(key=lambda d: d["name"])
            return local
        return self._merged(local, "mgmt.connections", self._argsFor(request, user), lambda d: d["name"])

    @app.route("/api/vhosts/<vhost>/connections", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def vhostConnections(self, request, user, vhost):
        """``GET /api/vhosts/{vhost}/connections``, filtered as ``/api/connections``."""
        vh = self._vhost(vhost)
        view = self._rateView(request)
        local = [fmt.connectionDict(c, view) for c in self._visibleConnections(user) if c.vhost is vh]
        local += [fmt.streamConnectionDict(c, view) for c in self._visibleStreamConnections(user, vh.name)]
        if self.broker.cluster is None:
            local.sort(key=lambda d: d["name"])
            return local
        return self._merged(local, "mgmt.connections", self._argsFor(request, user, vhost=vh.name),
                            lambda d: d["name"])

    def _visibleStreamConnections(self, user, vhost=None):
        """The stream connections ``user`` sees (as :meth:`_visibleConnections`), of ``vhost`` (a name) when given."""
        return fmt.streamConnections(self.broker, None if self._isMonitor(user) else user.name, vhost)

    def _authoriseUser(self, request, user, name):
        """
        The connection named ``name`` (404 when there is none) if ``user``
        may act on it, as ``rabbit_mgmt_util:is_authorized_user``: its
        owner may always; otherwise GET needs a monitoring or administrator
        tag and DELETE the administrator tag; else 401 ``User not
        authorised to access object``.  (RabbitMQ answers DELETE of a
        missing connection with 500; this is 404.)
        """
        conn = self._findLocal(name)
        if conn is None:
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
        if self.broker.cluster is not None and self._findLocal(name) is None:
            # on another node (or none)
            if request.method == b"GET":
                self._rateView(request)  # 400 for bad ranges, as here
                return self._remoteConnection(request, user, name).addCallback(lambda d: d["connection"])
            return self._remoteClose(user, name, self._reason(request))
        conn = self._authoriseUser(request, user, name)
        if request.method == b"GET":
            return _connectionDict(conn, self._rateView(request))
        self._close(conn, self._reason(request))
        return Response(204)

    @staticmethod
    def _reason(request):
        """Why DELETE closes a connection: the X-Reason header, or ``Closed via management plugin``."""
        reason = request.getHeader(b"x-reason")
        return reason.decode("utf-8", "replace") if reason else "Closed via management plugin"

    @app.route("/api/connections/<name>/channels", methods=["GET", "OPTIONS"])
    @endpoint()
    def connectionChannels(self, request, user, name):
        """``GET /api/connections/{name}/channels`` (authorised as :meth:`_authoriseUser`)."""
        if self.broker.cluster is not None and self._findLocal(name) is None:
            self._rateView(request)
            return self._remoteConnection(request, user, name, channels=True).addCallback(lambda d: d["channels"])
        conn = self._authoriseUser(request, user, name)
        view = self._rateView(request)
        if isStream(conn):
            return []
        return [fmt.channelDict(ch, view) for _, ch in sorted(conn.channels.items())]

    @app.route("/api/channels", methods=["GET", "OPTIONS"])
    @endpoint()
    def channels(self, request, user):
        """``GET /api/channels``: the channels of the connections the user sees."""
        view = self._rateView(request)
        local = [
            fmt.channelDict(ch, view)
            for c in self._visibleConnections(user)
            for _, ch in sorted(c.channels.items())
        ]
        if self.broker.cluster is None:
            return local
        return self._merged(local, "mgmt.channels", self._argsFor(request, user), _channelKey)

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
        found = self._findLocalChannel(name)
        if found is None:
            if self.broker.cluster is None:
                raise notFound()
            # on another node (or none)
            self._rateView(request)

            def answered(answers):
                for _, d in sorted(answers.items()):
                    if isinstance(d, dict):
                        break
                else:
                    raise notFound()
                if not (self._isMonitor(user) or d.get("user") == user.name):
                    raise notAuthorisedObject()
                return d

            args = {"name": name, "ranges": self._ranges(request)}
            return self.broker.cluster.askAll("mgmt.channel", args).addCallback(answered)
        conn, ch = found
        if not (self._isMonitor(user) or self._owns(user, conn)):
            raise notAuthorisedObject()
        return self._channelDetail(ch, self._rateView(request))

    def _findLocalChannel(self, name):
        """(connection, channel) of this node for channel ``name``, or None."""
        for conn in self.broker.connections:
            found = [ch for ch in conn.channels.values() if fmt.channelName(ch) == name]
            if found:
                return conn, found[0]
        return None

    @staticmethod
    def _channelDetail(ch, view):
        d = fmt.channelDict(ch, view)
        d["consumer_details"] = [fmt.consumerDict(c.queue, c) for _, c in sorted(ch.session.consumers.items())
                                 if c.queue.vhost.findQueue(c.queue.name) is c.queue]
        d["deliveries"] = []
        d["publishes"] = []
        return d

    def _answerChannel(self, args):
        """Channel ``name`` of this node as ``GET /api/channels/{name}`` shows it, or None."""
        found = self._findLocalChannel(args["name"])
        if found is None:
            return None
        return self._channelDetail(found[1], self._viewOf(args["ranges"]))

    def _consumers(self, user, vhosts):
        """Consumers on ``vhosts`` whose connection the user sees (``filter_conn_ch_list``)."""
        seesAll = self._isMonitor(user)
        if self.broker.cluster is None:
            found = [
                fmt.consumerDict(q, c) for vh in vhosts for _, q in sorted(vh.queues.items()) for c in q.consumers
                if seesAll or self._owns(user, c.session.client)
            ]
            streams = self._streamConsumers(None if seesAll else user.name, {vh.name for vh in vhosts})
            if streams:
                found += streams
                found.sort(key=_consumerKey)
            return found
        # a cluster: this node's consumers (of its queues and of queues on other nodes;
        # a queue here also holds other nodes' consumers: they list those), and theirs
        args = {"owner": None if seesAll else user.name, "vhosts": [vh.name for vh in vhosts]}
        return self._merged(self._answerConsumers(args), "mgmt.consumers", args, _consumerKey)

    def _answerConsumers(self, args):
        """This node's consumers on vhosts ``vhosts`` (names) of connections ``owner`` (None: anyone) owns."""
        wanted = set(args["vhosts"])
        owner = args["owner"]
        found = []
        for conn in list(self.broker.connections):
            if owner is not None and not (conn.user is not None and conn.user.name == owner):
                continue
            for ch in list(getattr(conn, "channels", {}).values()):
                for c in ch.session.consumers.values():
                    q = c.queue
                    vh = getattr(q, "vhost", None)
                    if vh is None or vh.name not in wanted or vh.findQueue(q.name) is not q:
                        continue
                    found.append(fmt.consumerDict(q, c))
        found += self._streamConsumers(owner, wanted)
        found.sort(key=_consumerKey)
        return found

    def _streamConsumers(self, owner, vhosts):
        """The stream protocol subscriptions of this node on ``vhosts`` (names) of ``owner``'s (None: anyone's)."""
        return [fmt.streamSubscriptionDict(conn, sub) for conn, sub in fmt.streamSubscriptions(self.broker)
                if conn.vhost in vhosts and (owner is None or (conn.user is not None and conn.user.name == owner))]

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
