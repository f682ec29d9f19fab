"""
The management HTTP app: a RabbitMQ 3.10-compatible subset of the
management HTTP API (``/api/...``) and the admin web app (``/``).
Prometheus metrics are served on their own listener only
(:mod:`otter_tx.web.metrics`), as ``rabbitmq_prometheus`` does: here
``/metrics`` is 404 like any unknown path, as on RabbitMQ's port 15672.

Shapes, status codes and error bodies follow RabbitMQ 3.10.8 as observed on
the reference peer (../shared/reference/rabbitmq-semantics.md section 8;
``rabbit_mgmt_dispatcher.erl``, ``rabbit_mgmt_util.erl``); docs/management.md
lists the endpoints and every known difference.

Rooms, as RabbitMQ's plugin has one ``rabbit_mgmt_wm_*`` module per
resource: one Klein app per resource family, each a class over the broker
(:class:`~otter_tx.web.management._room.Room`), mounted by the thin root
:class:`ManagementApp`, which picks the room from the path's family
segment (:data:`ROOMS`) and owns what the rooms share (the broker, the
clock, the node's listeners):

- :mod:`.queues` (queues, ``/get``, the queue insight views),
  :mod:`.exchanges` (exchanges, publish, delayed messages, bindings),
  :mod:`.policies` (policies, operator policies, parameters),
  :mod:`.users` (users, permissions, user limits), :mod:`.vhosts`
  (vhosts, vhost limits), :mod:`.connections` (connections, channels,
  consumers; stream protocol connections too), :mod:`.streams`
  (rabbitmq_stream_management's ``/api/stream/...``), :mod:`.definitions`, :mod:`.members` (quorum queue members,
  rebalance), :mod:`.nodes` (nodes, health checks,
  aliveness) and :mod:`.overview` (overview, whoami, the admin web app,
  and every unknown path);
- :mod:`.http`: errors, responses, JSON bodies, pagination;
- :mod:`.authz`: the management-tag authorisation model.

Why a table and not Klein's ``route(..., branch=True)``: a branch hands the
room the rest of the path, so its routes would be relative and its
trailing-slash redirects and 404/405 answers would differ from one app's;
families also do not follow prefixes (``/api/vhosts/{v}/connections`` is
the connections room's).  Each room keeps its routes' full paths, so one
room answers exactly as the single app did (``test_web.RoomsTests`` checks
that every route reaches its room through the root).

No broker rule is derived here: every operation runs through a
:class:`~otter_tx.broker.session.Session` acting as the user
(:func:`.authz.session`), policies are validated by
:func:`otter_tx.broker.policy.checkPolicy`, and the dead-letter target
walk is :meth:`otter_tx.broker.vhost.VHost.reachableQueues`.

The app is an instance (each room's ``app = Klein()`` is a class
attribute): built from the broker and the clock; it never imports the
global reactor.
"""

from twisted.web.resource import Resource

from otter_tx.web.management.authz import (  # noqa: F401 (the public names of the access model)
    ADMIN, ANY, MANAGEMENT_TAGS, MONITOR, MONITOR_TAGS, POLICYMAKER_TAGS, VHOST, authenticate,
)
from otter_tx.web.management.connections import ConnectionsRoom
from otter_tx.web.management.definitions import DefinitionsRoom
from otter_tx.web.management.exchanges import ExchangesRoom
from otter_tx.web.management.http import RABBITMQ_COMPAT_VERSION, HTTPError, Response, renderError  # noqa: F401
from otter_tx.web.management.members import MembersRoom
from otter_tx.web.management.nodes import NodesRoom
from otter_tx.web.management.overview import OverviewRoom
from otter_tx.web.management.policies import PoliciesRoom
from otter_tx.web.management.queues import QueuesRoom
from otter_tx.web.management.streams import StreamsRoom
from otter_tx.web.management.users import UsersRoom
from otter_tx.web.management.vhosts import VHostsRoom

#: the room of each ``/api/{family}`` segment; anything else goes to the overview room
ROOMS = {
    b"queues": QueuesRoom,
    b"exchanges": ExchangesRoom,
    b"bindings": ExchangesRoom,
    b"policies": PoliciesRoom,
    b"operator-policies": PoliciesRoom,
    b"parameters": PoliciesRoom,
    b"global-parameters": PoliciesRoom,
    b"users": UsersRoom,
    b"permissions": UsersRoom,
    b"user-limits": UsersRoom,
    b"vhosts": VHostsRoom,
    b"vhost-limits": VHostsRoom,
    b"connections": ConnectionsRoom,
    b"channels": ConnectionsRoom,
    b"consumers": ConnectionsRoom,
    b"definitions": DefinitionsRoom,
    b"nodes": NodesRoom,
    b"healthchecks": NodesRoom,
    b"health": NodesRoom,
    b"aliveness-test": NodesRoom,
    b"rebalance": MembersRoom,
    b"stream": StreamsRoom,
}

#: ``/api/vhosts/{v}/{part}``: the room of a vhost's sub-resource
VHOST_PARTS = {b"connections": ConnectionsRoom, b"permissions": UsersRoom}


def roomFor(segments):
    """
    The room class that serves a request path's ``segments`` (bytes, still
    percent-encoded, without the leading empty one): :data:`ROOMS` by the
    segment after ``api``, :data:`VHOST_PARTS` under ``/api/vhosts/{v}/``,
    else :class:`~otter_tx.web.management.overview.OverviewRoom`.
    """
    if len(segments) >= 2 and segments[0] == b"api":
        if segments[1] == b"vhosts" and len(segments) >= 4 and segments[3] in VHOST_PARTS:
            return VHOST_PARTS[segments[3]]
        if segments[1] == b"queues" and len(segments) == 7 and (
                segments[2] == b"quorum" or (segments[2] == b"stream" and segments[5] == b"replicas")):
            # /api/queues/quorum/{v}/{q}/replicas/add|delete, /api/queues/quorum/replicas/on/{node}/grow|shrink,
            # /api/queues/stream/{v}/{q}/replicas/add|delete
            return MembersRoom
        return ROOMS.get(segments[1], OverviewRoom)
    return OverviewRoom


class _Mount(Resource):
    """
    The site root: hands the request to the room its path belongs to
    (:func:`roomFor`), with the path segments still percent-encoded.

    Twisted decodes ``postpath`` segments, and Klein joins them with ``/``,
    so a vhost ``%2F`` would become a path separator; route handlers decode
    each matched segment themselves (:func:`~otter_tx.web.management._room.endpoint`).
    """

    isLeaf = True

    def __init__(self, rooms):
        Resource.__init__(self)
        self._rooms = rooms

    def render(self, request):
        segments = request.path.split(b"/")[1:]
        if len(segments) > 2 and segments[0] == b"api" and segments[-1] == b"" and segments[-2] != b"":
            # one trailing slash names the same resource (cowboy's router: GET /api/queues/%2F/,
            # PUT /api/queues/%2F/q/; rabbitmq-stream-js-client's suite lists /api/stream/consumers/%2F/)
            del segments[-1]
        request.postpath = segments[len(request.prepath):]
        return self._rooms[roomFor(request.postpath)].render(request)


class _Root:
    """``ManagementApp.app``: ``resource()`` is the site root (:class:`_Mount`) over the rooms."""

    def __init__(self, rooms):
        self._rooms = rooms

    def resource(self):
        """The ``IResource`` to serve (``Site(app.resource())``)."""
        return _Mount({cls: room.app.resource() for cls, room in self._rooms.items()})


class ManagementApp:
    """
    The management app over a broker: the rooms, mounted at one root
    (``app.resource()``), and the state they share.

    :param broker: the :class:`~otter_tx.broker.broker.Broker`.
    :param clock: ``IReactorTime`` (only read: uptime, certificate expiry,
        queue expiry views).
    """

    def __init__(self, broker, clock):
        self.broker = broker
        self.clock = clock
        #: clock seconds when the app was built (float): ``uptime`` counts from it
        self.startedAt = clock.seconds()
        #: the node's listeners (:mod:`otter_tx.web.health` records), set by
        #: the service once they are bound; empty for an app built alone
        self.listeners = []
        #: what ``/api/nodes`` reports as ``db_dir``, ``config_files`` and
        #: ``log_files`` (set by the service; None / empty for an app built alone)
        self.dataDir = None
        self.configFiles = []
        self.logFiles = []
        #: room class -> its instance over this app
        self.rooms = {cls: cls(self) for cls in set(ROOMS.values()) | set(VHOST_PARTS.values()) | {OverviewRoom}}
        #: what the site serves: ``app.resource()``
        self.app = _Root(self.rooms)

    def authenticateRequest(self, request):
        """
        The check every authenticated route makes first
        (:func:`~otter_tx.web.management.authz.authenticate` at
        ``is_authorized``: Basic credentials of a broker user, the loopback
        rule, a management tag), on ``request``'s headers alone:
        :mod:`otter_tx.web.request` makes it before a body is read.

        :return: None when it passes, the user it logged in then kept as
            ``request.authenticatedUser`` (the route's check reuses it
            instead of logging in again); else the 401 answer's body
            (bytes), with its status and headers set on ``request`` as the
            route would set them.
        """
        try:
            request.authenticatedUser = authenticate(self.broker, request, ANY)
        except HTTPError as e:
            return renderError(request, e)
        return None

    def listenersList(self):
        """
        The overview's ``listeners``: ``[{"node","protocol","ip_address",
        "port","socket_opts"}]`` (``socket_opts`` ``{}``: Twisted's defaults).
        """
        node = self.broker.alarms.nodeName
        return [
            {"node": node, "protocol": listener["protocol"], "ip_address": listener["ip_address"],
             "port": listener["port"], "socket_opts": {}}
            for listener in self.listeners
        ]

    def contexts(self):
        """
        The overview's ``contexts``, one per management listener as 3.10:
        ``{"ssl_opts":[],"node","description":"RabbitMQ Management",
        "path":"/","cowboy_opts":"[{sendfile,false}]","ip","port":"15672"}``
        (``port`` a string; ``ip`` only for a listener on one address).
        """
        node = self.broker.alarms.nodeName
        out = []
        for listener in self.listeners:
            if listener["protocol"] not in ("http", "https"):
                continue
            ctx = {"ssl_opts": [], "node": node, "description": "RabbitMQ Management", "path": "/",
                   "cowboy_opts": "[{sendfile,false}]"}
            if listener["ip_address"] not in ("0.0.0.0", "::", ""):
                ctx["ip"] = listener["ip_address"]
            ctx["port"] = str(listener["port"])
            out.append(ctx)
        return out
