"""
The stream protocol room: rabbitmq_stream_management's routes
(``rabbit_stream_connections_mgmt``, ``_connection_mgmt``,
``_connection_publishers_mgmt``, ``_connection_consumers_mgmt``,
``_publishers_mgmt``, ``_consumers_mgmt``), over the stream door's
connections (:mod:`otter_tx.door.stream`, ``Broker.streamCounters.connections``):

- ``GET /api/stream/connections``, ``/api/stream/connections/{vhost}``;
- ``GET``/``DELETE /api/stream/connections/{vhost}/{name}``, and its
  ``/publishers`` and ``/consumers``;
- ``GET /api/stream/publishers``, ``/{vhost}``, ``/{vhost}/{stream}``;
- ``GET /api/stream/consumers``, ``/{vhost}``.

Filtered as RabbitMQ 3.10 filters them (checked on the peer): monitoring
users and administrators see every connection, the others their own; the
``{vhost}`` routes need access to the vhost (401 ``User not authorised to
access virtual host``); a missing vhost, stream or connection is 404
``Object Not Found``.  In a cluster the lists hold every node's (asked as
:class:`~otter_tx.web.management.connections.ConnectionsRoom` asks for
connections), and a connection on another node is shown and closed from any.
"""

from twisted.internet.defer import Deferred

from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import VHOST
from otter_tx.web.management.connections import RANGE_ARGS
from otter_tx.web.management.http import Response, notAuthorisedObject, notFound, queryArg


def _itemKey(d):
    """Where a publisher or consumer sorts: its connection, then its id."""
    return (d["connection_details"]["name"], d.get("publisher_id", d.get("subscription_id", 0)))


def lastChunk(conn, stream):
    """The first offset of stream ``stream``'s last chunk as ``conn`` reads it (None: none, or not readable here)."""
    backend = conn.backend
    try:
        readable = getattr(backend, "readable", None)
        ok = readable(conn.vhost, stream) if readable is not None else backend.exists(conn.vhost, stream)
        if not ok:
            return None
        last = backend.stats(conn.vhost, stream).get("committed_chunk_id")
        return None if last is None or last < 0 else last
    except Exception:
        return None


def publishers(conns, stream=None):
    """The publishers of stream connections ``conns`` (to ``stream`` when given), as the API lists them."""
    return [fmt.streamPublisherDict(c, p) for c in conns for _, p in sorted(c.publishers.items())
            if stream is None or p.stream == stream]


def consumers(conns):
    """The subscriptions of stream connections ``conns``, as the API lists them."""
    out = []
    for c in conns:
        lasts = {}
        for _, sub in sorted(c.subscriptions.items()):
            if sub.stream not in lasts:
                lasts[sub.stream] = lastChunk(c, sub.stream)
            out.append(fmt.streamConsumerDict(c, sub, lasts[sub.stream]))
    return out


class StreamsRoom(Room):
    """``/api/stream/...``: stream connections, publishers and consumers."""

    app = roomApp()

    def __init__(self, root):
        Room.__init__(self, root)
        # what the other nodes of a cluster ask this one
        self.broker.addClusterHandler("mgmt.streamItems", self._answerItems)

    # --- this node's, and the cluster's ------------------------------------------

    def _owner(self, user):
        """Whose connections ``user`` sees: None (everyone's) for monitoring users and administrators."""
        return None if self._isMonitor(user) else user.name

    def _answerItems(self, args):
        """This node's ``kind`` (publishers, consumers) of the connections ``args`` selects."""
        conns = fmt.streamConnections(self.broker, args.get("owner"), args.get("vhost"))
        if args.get("name") is not None:
            conns = [c for c in conns if c.name == args["name"]]
        if args["kind"] == "publishers":
            return publishers(conns, args.get("stream"))
        return consumers(conns)

    def _connections(self, request, user, vhost=None):
        view = self._rateView(request)
        owner = self._owner(user)
        local = [fmt.streamConnectionDict(c, view) for c in fmt.streamConnections(self.broker, owner, vhost)]
        if self.broker.cluster is None:
            return local
        args = {"owner": owner, "ranges": [queryArg(request, a) for a in RANGE_ARGS]}
        if vhost is not None:
            args["vhost"] = vhost

        def streamsOnly(items):
            return [d for d in items if d.get("protocol") == "stream"]

        return self._merged(local, "mgmt.connections", args, lambda d: d["name"]).addCallback(streamsOnly)

    def _items(self, user, kind, vhost=None, stream=None, name=None, owner=False):
        args = {"kind": kind, "owner": self._owner(user) if owner is False else owner, "vhost": vhost,
                "stream": stream, "name": name}
        return self._merged(self._answerItems(args), "mgmt.streamItems", args, _itemKey)

    def _connection(self, request, user, vhost, name):
        """
        Stream connection ``name`` of ``vhost`` (a Deferred in a cluster when
        it is on another node): this node's protocol object, or its JSON
        there; 404 when there is none, 401 when ``user`` may not act on it
        (GET: monitoring or its owner; DELETE: administrator or its owner).
        """
        allowed = self._isAdmin(user) if request.method == b"DELETE" else self._isMonitor(user)
        for conn in fmt.streamConnections(self.broker, None, vhost):
            if conn.name == name:
                if not (allowed or self._owns(user, conn)):
                    raise notAuthorisedObject()
                return conn
        if self.broker.cluster is None:
            raise notFound()
        args = {"name": name, "ranges": [queryArg(request, a) for a in RANGE_ARGS], "channels": False}

        def found(answers):
            for _, d in sorted(answers.items()):
                if (isinstance(d, dict) and d.get("connection", {}).get("protocol") == "stream"
                        and d["connection"].get("vhost") == vhost):
                    d = d["connection"]
                    if not (allowed or d.get("user") == user.name):
                        raise notAuthorisedObject()
                    return d
            raise notFound()

        return self.broker.cluster.askAll("mgmt.connection", args).addCallback(found)

    # --- the routes --------------------------------------------------------------

    @app.route("/api/stream/connections", methods=["GET", "OPTIONS"])
    @endpoint()
    def connections(self, request, user):
        """``GET /api/stream/connections``: all for monitoring users and administrators, else the user's own."""
        return self._connections(request, user)

    @app.route("/api/stream/connections/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def vhostConnections(self, request, user, vhost):
        """``GET /api/stream/connections/{vhost}``, filtered as ``/api/stream/connections``."""
        return self._connections(request, user, self._vhost(vhost).name)

    @app.route("/api/stream/connections/<vhost>/<name>", methods=["GET", "DELETE", "OPTIONS"])
    @endpoint(VHOST)
    def connection(self, request, user, vhost, name):
        """
        ``GET`` one stream connection (as ``GET /api/connections/{name}``);
        ``DELETE`` closes it (204; RabbitMQ closes the socket, no close frame).
        """
        self._vhost(vhost)
        view = self._rateView(request)
        found = self._connection(request, user, vhost, name)
        if isinstance(found, Deferred):
            # on another node
            if request.method == b"GET":
                return found
            return found.addCallback(lambda d: self._remoteClose(d, request))
        if request.method == b"GET":
            return fmt.streamConnectionDict(found, view, detail=True)
        found.closeConnection()
        return Response(204)

    def _remoteClose(self, d, request):
        reason = request.getHeader(b"x-reason")
        args = {"name": d["name"], "owner": None,
                "reason": reason.decode("utf-8", "replace") if reason else "Closed via management plugin"}

        def closed(answers):
            if "closed" in set(answers.values()):
                return Response(204)
            raise notFound()

        return self.broker.cluster.askAll("mgmt.closeConnection", args).addCallback(closed)

    def _connectionItems(self, request, user, vhost, name, kind):
        self._vhost(vhost)
        found = self._connection(request, user, vhost, name)
        if isinstance(found, Deferred):
            return found.addCallback(lambda d: self._items(user, kind, vhost, None, name, owner=None))
        return self._items(user, kind, vhost, None, name, owner=None)

    @app.route("/api/stream/connections/<vhost>/<name>/publishers", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def connectionPublishers(self, request, user, vhost, name):
        """``GET /api/stream/connections/{vhost}/{name}/publishers`` (who may: as GET of the connection)."""
        return self._connectionItems(request, user, vhost, name, "publishers")

    @app.route("/api/stream/connections/<vhost>/<name>/consumers", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def connectionConsumers(self, request, user, vhost, name):
        """``GET /api/stream/connections/{vhost}/{name}/consumers`` (who may: as GET of the connection)."""
        return self._connectionItems(request, user, vhost, name, "consumers")

    @app.route("/api/stream/publishers", methods=["GET", "OPTIONS"])
    @endpoint()
    def publishers(self, request, user):
        """``GET /api/stream/publishers``: of the connections the user sees."""
        return self._items(user, "publishers")

    @app.route("/api/stream/publishers/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def vhostPublishers(self, request, user, vhost):
        """``GET /api/stream/publishers/{vhost}``."""
        return self._items(user, "publishers", self._vhost(vhost).name)

    @app.route("/api/stream/publishers/<vhost>/<stream>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def streamPublishers(self, request, user, vhost, stream):
        """``GET /api/stream/publishers/{vhost}/{stream}``: 404 when there is no such stream."""
        q = self._vhost(vhost).findQueue(stream)
        if q is None or getattr(q, "queueType", None) != "stream":
            memory = getattr(self.broker, "_memoryStreams", None)  # the door's streams without the core
            if memory is None or not memory.exists(vhost, stream):
                raise notFound()
        return self._items(user, "publishers", vhost, stream)

    @app.route("/api/stream/consumers", methods=["GET", "OPTIONS"])
    @endpoint()
    def consumers(self, request, user):
        """``GET /api/stream/consumers``: of the connections the user sees."""
        return self._items(user, "consumers")

    @app.route("/api/stream/consumers/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def vhostConsumers(self, request, user, vhost):
        """``GET /api/stream/consumers/{vhost}``."""
        return self._items(user, "consumers", self._vhost(vhost).name)
