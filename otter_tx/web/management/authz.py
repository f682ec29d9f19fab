"""
The management-tag authorisation model of RabbitMQ 3.10's management
plugin, endpoint by endpoint (docs/management.md has the table): who may
log in over HTTP, which vhosts and connections a user sees, and the
Session a request acts through.

Each route names the check its ``rabbit_mgmt_wm_*.erl`` module's
``is_authorized/2`` makes (:data:`ANY` is ``is_authorized``, :data:`ADMIN`
``is_authorized_admin``, :data:`MONITOR` ``is_authorized_monitor``,
:data:`VHOST` ``is_authorized_vhost``, :data:`POLICIES`
``is_authorized_policies``; connections use ``is_authorized_user``, see
:meth:`~otter_tx.web.management.connections.ConnectionsRoom._authoriseUser`),
and the operations RabbitMQ performs over an AMQP channel check the user's
configure / write / read regexes per resource, as a channel does: each runs
through a :class:`~otter_tx.broker.session.Session` acting as the user
(:func:`session`), so the rules live once, in ``broker/``.
"""

import base64

from otter_tx.broker.access import LOOPBACK_ONLY, login
from otter_tx.web._format import connectionName
from otter_tx.web.door import requestSession
from otter_tx.web.management.http import HTTPError, notAuthorised, notAuthorisedObject

#: tags that may use the management API at all (is_mgmt_user)
MANAGEMENT_TAGS = frozenset(("management", "policymaker", "monitoring", "administrator"))
#: tags that see every connection, channel and consumer (is_monitor)
MONITOR_TAGS = frozenset(("monitoring", "administrator"))
#: tags that may read and change policies (is_policymaker)
POLICYMAKER_TAGS = frozenset(("policymaker", "administrator"))

#: access levels for endpoints, named after rabbit_mgmt_util's checks
ANY = "is_authorized"  # any management user
ADMIN = "is_authorized_admin"  # administrator; else 401 "Not administrator user"
MONITOR = "is_authorized_monitor"  # monitoring or administrator; else 401 "Not monitor user"
#: administrator, or a user with permissions on the path's ``vhost`` (a
#: missing vhost passes, the handler answers 404); else 401 "User not
#: authorised to access virtual host"
VHOST = "is_authorized_vhost"
#: as VHOST, but ``monitoring`` users see every vhost (``list_visible_vhosts``)
VHOST_VISIBLE = "is_authorized_vhost_visible"
#: administrator, or policymaker as for VHOST; else 401 "User not authorised to access object"
POLICIES = "is_authorized_policies"
#: administrator or policymaker (any vhost); else 401 "User not authorised to access object"
GLOBAL_PARAMETERS = "is_authorized_global_parameters"
NONE = "none"  # no authentication (the admin web app's files)


def authenticate(broker, request, access, vhost=None):
    """
    The broker :class:`~otter_tx.broker.access.User` for the request's
    Basic credentials, authorised for ``access`` (one of :data:`ANY`...) on
    the path's ``vhost`` (str or None), or an :class:`HTTPError` (401) as
    RabbitMQ answers (``rabbit_web_dispatch_access_control:is_authorized``).

    A request whose credentials the body guard already checked (its
    ``authenticatedUser``, set by :meth:`ManagementApp.authenticateRequest
    <otter_tx.web.management.ManagementApp.authenticateRequest>` before the
    body was read) is not logged in again; the checks of ``access`` still run.
    """
    user = getattr(request, "authenticatedUser", None)
    if user is None:
        user = _login(broker, request)
    tags = set(user.tags)
    if not tags & MANAGEMENT_TAGS:
        raise notAuthorised("Not management user")
    if access == ADMIN and "administrator" not in tags:
        raise notAuthorised("Not administrator user")
    if access == MONITOR and not tags & MONITOR_TAGS:
        raise notAuthorised("Not monitor user")
    if access == VHOST and not matchesVHost(broker, user, vhost):
        raise notAuthorised("User not authorised to access virtual host")
    if access == VHOST_VISIBLE and not (tags & MONITOR_TAGS or matchesVHost(broker, user, vhost)):
        raise notAuthorised("User not authorised to access virtual host")
    if access == GLOBAL_PARAMETERS and not tags & POLICYMAKER_TAGS:
        raise notAuthorisedObject()
    if access == POLICIES and not (
        isAdmin(user) or tags & POLICYMAKER_TAGS and matchesVHost(broker, user, vhost)
    ):
        raise notAuthorisedObject()
    return user


def _login(broker, request):
    """
    The broker User for the request's Basic credentials (``login``), or
    RabbitMQ's 401 with its ``www-authenticate`` challenge.
    """
    challenge = [(b"www-authenticate", b'Basic realm="RabbitMQ Management"')]
    header = request.getHeader(b"authorization")
    if not header or not header[:6].lower() == b"basic ":
        raise HTTPError(401, "not_authorized", None, challenge)
    try:
        raw = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        name, password = raw.split(":", 1)
    except Exception:
        raise HTTPError(401, "not_authorized", "Login failed", challenge)
    user, refusal = login(broker.users, name, password, getattr(request.getClientAddress(), "host", None),
                          broker.loopbackUsers)
    if refusal == LOOPBACK_ONLY:
        raise HTTPError(401, "not_authorized", "User can only log in via localhost", challenge)
    if user is None:
        raise HTTPError(401, "not_authorized", "Login failed", challenge)
    return user


def matchesVHost(broker, user, vhost):
    """
    ``is_admin orelse user_matches_vhost``: an administrator, no vhost
    in the path, a vhost that does not exist (the handler answers 404),
    or one the user has permissions on (may log in to).
    """
    return (
        isAdmin(user) or vhost is None or vhost not in broker.vhosts
        or broker.canAccess(user, vhost)
    )


def isAdmin(user):
    """Whether ``user`` has the ``administrator`` tag."""
    return "administrator" in user.tags


def isMonitor(user):
    """Whether ``user`` has the ``monitoring`` or ``administrator`` tag (``is_monitor``)."""
    return bool(set(user.tags) & MONITOR_TAGS)


def owns(user, conn):
    """Whether connection ``conn`` is ``user``'s own."""
    return conn.user is not None and conn.user.name == user.name


def loginVHosts(broker, user):
    """
    The vhosts an object list shows (``rabbit_mgmt_util:filter_vhost``):
    every vhost for an administrator, else those the user has
    permissions on (monitoring users too).
    """
    return [
        vh for name, vh in sorted(broker.vhosts.items())
        if isAdmin(user) or broker.canAccess(user, name)
    ]


def visibleVHosts(broker, user):
    """
    The vhosts ``/api/vhosts`` and the overview show
    (``list_visible_vhosts``): every vhost for administrators and
    monitoring users, else those the user has permissions on.
    """
    return [
        vh for name, vh in sorted(broker.vhosts.items())
        if isMonitor(user) or broker.canAccess(user, name)
    ]


def visibleConnections(broker, user):
    """
    The connections a user sees (``rabbit_mgmt_util:filter_conn_ch_list``):
    all for monitoring users and administrators, else its own.
    """
    conns = sorted(broker.connections, key=connectionName)
    if isMonitor(user):
        return conns
    return [c for c in conns if owns(user, c)]


def session(broker, user, vh):
    """
    A :class:`~otter_tx.broker.session.Session` acting as ``user`` in
    ``vh`` for this request, as RabbitMQ opens a channel for the
    operation: 401 ``Access refused.`` when the user has no permissions
    on the vhost (the connection is refused).
    """
    if not broker.canAccess(user, vh.name):
        raise notAuthorised("Access refused.")
    return requestSession(broker, user, vh)
