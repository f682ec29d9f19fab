"""
The management HTTP app: a RabbitMQ 3.10-compatible subset of the
management HTTP API (``/api/...``), Prometheus metrics (``/metrics``) and a
small HTML admin page (``/``).

Shapes, status codes and error bodies follow RabbitMQ 3.10.8 as observed on
the reference peer (../shared/reference/rabbitmq-semantics.md section 8;
``rabbit_mgmt_dispatcher.erl``, ``rabbit_mgmt_util.erl``); docs/management.md
lists the endpoints and every known difference.

Error bodies (all ``application/json``):

- no credentials: 401, empty body, ``WWW-Authenticate: Basic``;
- bad credentials: 401 ``{"error":"not_authorized","reason":"Login failed"}``
  (RabbitMQ spells this one with a *z*);
- a user without a management tag: 401 ``{"error":"not_authorised",
  "reason":"Not management user"}``; admin-only endpoints: ``"Not
  administrator user"``; a vhost the user has no permissions on: ``"User not
  authorised to access virtual host"``; an AMQP 403 (``amq.`` names, the
  default exchange): ``"Access refused."``;
- missing object: 404 ``{"error":"Object Not Found","reason":"Not Found"}``;
- invalid input: 400 ``{"error":"bad_request","reason":...}`` where the
  reason is the AMQP reply text without its ``PRECONDITION_FAILED -``
  prefix, or RabbitMQ's validation text.

Access model: RabbitMQ 3.10's, endpoint by endpoint (docs/management.md
has the table).  Each route names the check its ``rabbit_mgmt_wm_*.erl``
module's ``is_authorized/2`` makes (:data:`_ANY` is ``is_authorized``,
:data:`_ADMIN` ``is_authorized_admin``, :data:`_MONITOR`
``is_authorized_monitor``, :data:`_VHOST` ``is_authorized_vhost``,
:data:`_POLICIES` ``is_authorized_policies``; connections use
``is_authorized_user``, see :meth:`ManagementApp._authoriseUser`), and the
operations RabbitMQ performs over an AMQP channel check the user's
configure / write / read regexes per resource, as a channel does
(each runs through a :class:`~otter_tx.broker.session.Session` acting as the
user, :meth:`ManagementApp._session`).

The app is an instance (``app = Klein()`` is a class attribute): built from
the broker and the clock; it never imports the global reactor.
"""

import base64
import functools
import itertools
import json
import re
from urllib.parse import quote, unquote

from klein import Klein
from werkzeug.exceptions import MethodNotAllowed, NotFound
from twisted.internet.defer import Deferred, gatherResults
from twisted.web.resource import Resource

from otter_tx import __version__
from otter_tx.amqp.codec import Timestamp, encodeProperties
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.access import (
    CONFIGURE, LOOPBACK_ONLY, READ, WRITE, PasswordHashError, User, bindChecks, login,
)
from otter_tx.broker import stats as S
from otter_tx.broker.delayed import DELAYED_TYPE, checkHeldAccess, pageParameters
from otter_tx.broker.exchange import EXCHANGE_TYPES
from otter_tx.broker.expiry import nowMs
from otter_tx.broker.message import Message
from otter_tx.web.nodes import memoryBreakdown, memUsed, nodeDict, relativeMemory
from otter_tx.broker.policy import OperatorPolicy, Policy, PolicyError, checkOperatorKeys
from otter_tx.broker.queue import Queue
from otter_tx.broker.vhost import LimitError
from otter_tx.web import _format as fmt
from otter_tx.web.door import requestSession

#: the RabbitMQ version whose API this app reproduces (reported as
#: ``rabbitmq_version``; ``product_name`` / ``product_version`` say otter_tx)
RABBITMQ_COMPAT_VERSION = "3.10.8"

#: tags that may use the management API at all (is_mgmt_user)
MANAGEMENT_TAGS = frozenset(("management", "policymaker", "monitoring", "administrator"))
#: tags that see every connection, channel and consumer (is_monitor)
MONITOR_TAGS = frozenset(("monitoring", "administrator"))
#: tags that may read and change policies (is_policymaker)
POLICYMAKER_TAGS = frozenset(("policymaker", "administrator"))

#: access levels for endpoints, named after rabbit_mgmt_util's checks
_ANY = "is_authorized"  # any management user
_ADMIN = "is_authorized_admin"  # administrator; else 401 "Not administrator user"
_MONITOR = "is_authorized_monitor"  # monitoring or administrator; else 401 "Not monitor user"
#: administrator, or a user with permissions on the path's ``vhost`` (a
#: missing vhost passes, the handler answers 404); else 401 "User not
#: authorised to access virtual host"
_VHOST = "is_authorized_vhost"
#: as _VHOST, but ``monitoring`` users see every vhost (``list_visible_vhosts``)
_VHOST_VISIBLE = "is_authorized_vhost_visible"
#: administrator, or policymaker as for _VHOST; else 401 "User not authorised to access object"
_POLICIES = "is_authorized_policies"
#: administrator or policymaker (any vhost); else 401 "User not authorised to access object"
_GLOBAL_PARAMETERS = "is_authorized_global_parameters"
_NONE = "none"  # no authentication (metrics, like rabbitmq_prometheus)

_EXCHANGE_TYPE_DESCRIPTIONS = (
    ("direct", "AMQP direct exchange, as per the AMQP specification"),
    ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
    ("headers", "AMQP headers exchange, as per the AMQP specification"),
    ("topic", "AMQP topic exchange, as per the AMQP specification"),
    (DELAYED_TYPE, "Delayed Message Exchange."),
)

_ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")

_SHORTSTR_PROPS = (
    "content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
    "message_id", "type", "user_id", "app_id", "cluster_id",
)


class HTTPError(Exception):
    """
    An HTTP error with RabbitMQ's JSON body ``{"error": ..., "reason": ...}``.

    :param code: HTTP status (int).  :param error: the ``error`` string.
    :param reason: the ``reason`` (str, or a list as RabbitMQ sometimes sends);
        ``None`` for an empty body.
    """

    def __init__(self, code, error, reason, headers=()):
        Exception.__init__(self, code, error, reason)
        self.code = code
        self.error = error
        self.reason = reason
        self.headers = list(headers)


def notFound():
    """404 ``{"error":"Object Not Found","reason":"Not Found"}``."""
    return HTTPError(404, "Object Not Found", "Not Found")


def badRequest(reason):
    """400 ``{"error":"bad_request","reason": reason}``."""
    return HTTPError(400, "bad_request", reason)


def notAuthorised(reason):
    """401 ``{"error":"not_authorised","reason": reason}``."""
    return HTTPError(401, "not_authorised", reason)


def notAuthorisedObject():
    """401 ``User not authorised to access object`` (is_authorized_user / _policies)."""
    return notAuthorised("User not authorised to access object")


def channelRefusal(e):
    """
    An AMQP 403 from an operation RabbitMQ runs over an AMQP channel
    (``rabbit_mgmt_util:with_channel``: ``/get``, the aliveness test) as
    401 with the full reply text, ``ACCESS_REFUSED - access to queue 'q' in
    vhost '/' refused for user 'u'``; any other code as 400 with the code
    and the full reply text, ``405 RESOURCE_LOCKED - cannot obtain exclusive
    access to locked queue ...`` (checked on RabbitMQ 3.10 for ``/get`` on
    another connection's exclusive queue).
    """
    if e.code == 403:
        return notAuthorised(e.text)
    return badRequest(str(e))


def getRefusal(e):
    """
    An AMQPError from reading a queue over the HTTP API (``/get``, and our
    ``/browse`` which answers as it): 404 ``not_found`` with the reply
    text, else :func:`channelRefusal`.
    """
    if e.code == 404:
        return HTTPError(404, "not_found", e.text)
    return channelRefusal(e)


def checkEncoding(encoding):
    """400 ``Unsupported encoding...`` unless ``encoding`` is ``auto`` or ``base64`` (``/get``, ``/browse``)."""
    if encoding not in ("auto", "base64"):
        raise badRequest("Unsupported encoding. Please use auto or base64.")


def amqpHTTPError(e):
    """
    Map an :class:`AMQPError` from a broker operation to RabbitMQ's HTTP
    answer (``rabbit_mgmt_util:direct_request``: declares, deletes, purge,
    bindings): 403 -> 401 ``Access refused.``; 404 -> 404 ``not_found`` with
    the text; anything else -> 400 with the text without its
    ``CONSTANT -`` prefix.
    """
    text = e.text.split(" - ", 1)[1] if " - " in e.text else e.text
    if e.code == 403:
        return notAuthorised("Access refused.")
    if e.code == 404:
        return HTTPError(404, "not_found", text)
    return badRequest(text)


class Response:
    """A status with an optional JSON body and extra headers."""

    def __init__(self, code, body=None, headers=()):
        self.code = code
        self.body = body
        self.headers = list(headers)


def _flag(value, default=False):
    """A JSON boolean (or ``"true"``/``"false"``) as bool."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def _queryFlag(request, name):
    return request.args.get(name.encode(), [b""])[0].lower() == b"true"


def _query(request, name, default=None):
    v = request.args.get(name.encode())
    if not v:
        return default
    return v[0].decode("utf-8", "replace")


def _dotted(obj, path):
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _sortKey(v):
    if v is None:
        return (0, "")
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, (int, float)):
        return (1, v)
    return (2, str(v))


def _selectColumns(item, columns):
    out = {}
    for col in columns:
        v = _dotted(item, col)
        if v is None and _dotted(item, col.split(".")[0]) is None and col.split(".")[0] not in item:
            continue
        parts = col.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


def listQuery(request, items):
    """
    Apply RabbitMQ's list parameters (section 8.1): ``sort``,
    ``sort_reverse``, ``page``/``page_size``/``name``/``use_regex`` (the
    paginated wrapper object) and ``columns`` (dotted paths allowed).
    An empty ``sort=`` is accepted and ignored.
    """
    sort = _query(request, "sort")
    if sort:
        items = sorted(items, key=lambda i: _sortKey(_dotted(i, sort)))
    if _queryFlag(request, "sort_reverse"):
        items = list(reversed(items))
    columns = _query(request, "columns")
    page = _query(request, "page")
    if page is not None:
        try:
            pageN, sizeN = pageParameters(page, _query(request, "page_size"))
        except ValueError as e:
            raise HTTPError(400, "invalid_pagination_parameters", str(e))
        total = len(items)
        name = _query(request, "name")
        if name:
            if _queryFlag(request, "use_regex"):
                try:
                    rx = re.compile(name)
                except re.error:
                    raise badRequest("invalid regex")
                items = [i for i in items if rx.search(str(i.get("name", "")))]
            else:
                items = [i for i in items if name in str(i.get("name", ""))]
        filtered = len(items)
        pageItems = items[(pageN - 1) * sizeN : pageN * sizeN]
        if columns:
            pageItems = [_selectColumns(i, columns.split(",")) for i in pageItems]
        return {
            "filtered_count": filtered,
            "item_count": len(pageItems),
            "items": pageItems,
            "page": pageN,
            "page_count": max(1, -(-filtered // sizeN)),
            "page_size": sizeN,
            "total_count": total,
        }
    if columns:
        items = [_selectColumns(i, columns.split(",")) for i in items]
    return items


#: what a queue list keeps with ``?disable_stats=true`` (RabbitMQ 3.10's
#: basic queue fields; ``enable_queue_totals=true`` adds the three lengths)
_BASIC_QUEUE_KEYS = ("arguments", "auto_delete", "durable", "exclusive", "name", "node", "policy",
                     "state", "type", "vhost", "leader", "members", "online")
_QUEUE_TOTAL_KEYS = ("messages", "messages_ready", "messages_unacknowledged")

#: overview keys RabbitMQ leaves out with ``?disable_stats=true``
_OVERVIEW_STATS_KEYS = ("message_stats", "churn_rates", "queue_totals", "statistics_db_event_queue",
                        "listeners", "contexts")


def withoutStats(result):
    """
    ``result`` (a JSON-able value) as ``?disable_stats=true`` shows it:
    without ``message_stats``, any ``*_details`` and the overview's
    statistics (RabbitMQ's ``rabbit_mgmt_util:disable_stats``).
    """
    if isinstance(result, list):
        return [withoutStats(i) for i in result]
    if isinstance(result, dict):
        out = {}
        overview = "rates_mode" in result
        for k, v in result.items():
            if k == "message_stats" or k.endswith("_details") or (overview and k in _OVERVIEW_STATS_KEYS):
                continue
            out[k] = withoutStats(v) if isinstance(v, (list, dict)) and k == "items" else v
        return out
    return result


def _queueList(request, queues):
    """
    A queue list (dicts) as ``?disable_stats=true`` (and
    ``enable_queue_totals=true``) asks: only the basic fields (and the
    lengths); unchanged without it.
    """
    if not _queryFlag(request, "disable_stats"):
        return queues
    keep = _BASIC_QUEUE_KEYS
    if _queryFlag(request, "enable_queue_totals"):
        keep = keep + _QUEUE_TOTAL_KEYS
    return [{k: q[k] for k in keep if k in q} for q in queues]


def _sumStats(parts):
    """
    The sum of several stats objects of the same keys (``{key: int,
    key_details: {...}}``): values, rates, samples, ``avg`` and
    ``avg_rate`` added up (the overview of a user who sees some vhosts).
    """
    out = {}
    for part in parts:
        for k, v in part.items():
            if not k.endswith("_details"):
                out[k] = out.get(k, 0) + v
                continue
            d = out.get(k)
            if d is None:
                out[k] = {x: ([dict(s) for s in y] if x == "samples" else y) for x, y in v.items()}
                continue
            for x, y in v.items():
                if x == "samples":
                    for mine, theirs in zip(d["samples"], y):
                        mine["sample"] += theirs["sample"]
                else:
                    d[x] = d.get(x, 0.0) + y
    return out


def endpoint(access=_ANY):
    """
    Wrap a route handler ``f(self, request, user, **pathArgs)``: Basic auth
    and tag checks, percent-decoding of path segments, JSON rendering of
    the result (a list goes through :func:`listQuery`), and
    :class:`HTTPError` / :class:`AMQPError` to RabbitMQ's error bodies.
    """

    def deco(f):
        @functools.wraps(f)
        def wrapper(self, request, **kw):
            return self._handle(f, access, request, kw)

        return wrapper

    return deco


class _RawPathResource(Resource):
    """
    Hand Klein the request path with its segments still percent-encoded.

    Twisted decodes ``postpath`` segments, and Klein joins them with ``/``,
    so a vhost ``%2F`` would become a path separator.  Route handlers
    decode each matched segment themselves (:func:`endpoint`).
    """

    isLeaf = True

    def __init__(self, inner):
        Resource.__init__(self)
        self._inner = inner

    def render(self, request):
        segments = request.path.split(b"/")[1:]
        request.postpath = segments[len(request.prepath):]
        return self._inner.render(request)


class _Klein(Klein):
    """Klein whose resource keeps percent-encoded path segments (RabbitMQ's ``%2F``)."""

    def resource(self):
        return _RawPathResource(Klein.resource(self))


class ManagementApp:
    """
    Klein app over a broker; ``app`` is a class attribute, state is per
    instance.

    :param broker: the :class:`~otter_tx.broker.broker.Broker`.
    :param clock: ``IReactorTime`` (only read, for ``/metrics`` uptime).
    """

    app = _Klein()

    def __init__(self, broker, clock):
        self.broker = broker
        self.clock = clock
        self.startedAt = clock.seconds()
        #: the node's listeners (:mod:`otter_tx.web.health` records), set by
        #: the service once they are bound; empty for an app built alone
        self.listeners = []
        #: what ``/api/nodes`` reports as ``db_dir``, ``config_files`` and
        #: ``log_files`` (set by the service; None / empty for an app built alone)
        self.dataDir = None
        self.configFiles = []
        self.logFiles = []

    # --- plumbing -------------------------------------------------------------

    def _handle(self, f, access, request, kw):
        kw = {k: unquote(v) if isinstance(v, str) else v for k, v in kw.items()}
        try:
            if request.method == b"OPTIONS":
                request.setResponseCode(200)
                return b""
            user = None if access == _NONE else self._authenticate(request, access, kw.get("vhost"))
            result = f(self, request, user, **kw)
        except HTTPError as e:
            return self._renderError(request, e)
        except AMQPError as e:
            return self._renderError(request, amqpHTTPError(e))
        if isinstance(result, Deferred):
            return result.addCallback(lambda r: self._render(request, r))
        return self._render(request, result)

    def _render(self, request, result):
        """Write a handler's ``result`` (bytes, Response, list or JSON-able) to ``request``."""
        if isinstance(result, bytes):
            return result
        if isinstance(result, Response):
            request.setResponseCode(result.code)
            for k, v in result.headers:
                request.setHeader(k, v)
            if result.body is None:
                request.defaultContentType = None
                return b""
            request.setHeader(b"content-type", b"application/json")
            return json.dumps(result.body).encode()
        if isinstance(result, list):
            try:
                result = listQuery(request, result)
            except HTTPError as e:
                return self._renderError(request, e)
        if _queryFlag(request, "disable_stats"):
            result = withoutStats(result)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-cache")
        return json.dumps(result).encode()

    def _renderError(self, request, e):
        request.setResponseCode(e.code)
        for k, v in e.headers:
            request.setHeader(k, v)
        if e.reason is None:
            request.defaultContentType = None
            return b""
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"error": e.error, "reason": e.reason}).encode()

    def _authenticate(self, request, access, vhost=None):
        """
        The broker :class:`User` for the request's Basic credentials,
        authorised for ``access`` (one of the ``_ANY``... levels) on the
        path's ``vhost`` (str or None), or an :class:`HTTPError` (401) as
        RabbitMQ answers (``rabbit_web_dispatch_access_control:is_authorized``).
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
        user, refusal = login(self.broker.users, name, password, getattr(request.getClientAddress(), "host", None),
                              self.broker.loopbackUsers)
        if refusal == LOOPBACK_ONLY:
            raise HTTPError(401, "not_authorized", "User can only log in via localhost", challenge)
        if user is None:
            raise HTTPError(401, "not_authorized", "Login failed", challenge)
        tags = set(user.tags)
        if not tags & MANAGEMENT_TAGS:
            raise notAuthorised("Not management user")
        if access == _ADMIN and "administrator" not in tags:
            raise notAuthorised("Not administrator user")
        if access == _MONITOR and not tags & MONITOR_TAGS:
            raise notAuthorised("Not monitor user")
        if access == _VHOST and not self._matchesVHost(user, vhost):
            raise notAuthorised("User not authorised to access virtual host")
        if access == _VHOST_VISIBLE and not (tags & MONITOR_TAGS or self._matchesVHost(user, vhost)):
            raise notAuthorised("User not authorised to access virtual host")
        if access == _GLOBAL_PARAMETERS and not tags & POLICYMAKER_TAGS:
            raise notAuthorisedObject()
        if access == _POLICIES and not (
            self._isAdmin(user) or tags & POLICYMAKER_TAGS and self._matchesVHost(user, vhost)
        ):
            raise notAuthorisedObject()
        return user

    def authenticateRequest(self, request):
        """
        The check every authenticated route makes first (:meth:`_authenticate`
        at ``is_authorized``: Basic credentials of a broker user, the
        loopback rule, a management tag), on ``request``'s headers alone:
        :mod:`otter_tx.web.request` makes it before a body is read.

        :return: None when it passes; else the 401 answer's body (bytes),
            with its status and headers set on ``request`` as the route
            would set them.
        """
        try:
            self._authenticate(request, _ANY)
        except HTTPError as e:
            return self._renderError(request, e)
        return None

    def _matchesVHost(self, user, vhost):
        """
        ``is_admin orelse user_matches_vhost``: an administrator, no vhost
        in the path, a vhost that does not exist (the handler answers 404),
        or one the user has permissions on (may log in to).
        """
        return (
            self._isAdmin(user) or vhost is None or vhost not in self.broker.vhosts
            or self.broker.canAccess(user, vhost)
        )

    @staticmethod
    def _isAdmin(user):
        return "administrator" in user.tags

    @staticmethod
    def _isMonitor(user):
        return bool(set(user.tags) & MONITOR_TAGS)

    def _loginVHosts(self, user):
        """
        The vhosts an object list shows (``rabbit_mgmt_util:filter_vhost``):
        every vhost for an administrator, else those the user has
        permissions on (monitoring users too).
        """
        return [
            vh for name, vh in sorted(self.broker.vhosts.items())
            if self._isAdmin(user) or self.broker.canAccess(user, name)
        ]

    def _visibleVHosts(self, user):
        """
        The vhosts ``/api/vhosts`` and the overview show
        (``list_visible_vhosts``): every vhost for administrators and
        monitoring users, else those the user has permissions on.
        """
        return [
            vh for name, vh in sorted(self.broker.vhosts.items())
            if self._isMonitor(user) or self.broker.canAccess(user, name)
        ]

    def _vhost(self, name):
        """VHost ``name``, or 404 when missing (the endpoint has authorised the user)."""
        vh = self.broker.vhosts.get(name)
        if vh is None:
            raise notFound()
        return vh

    def _queue(self, vh, name):
        """Queue ``name`` of vhost ``vh``, or 404 when missing."""
        q = vh.queues.get(name)
        if q is None:
            raise notFound()
        return q

    def _session(self, user, vh):
        """
        A :class:`~otter_tx.broker.session.Session` acting as ``user`` in
        ``vh`` for this request, as RabbitMQ opens a channel for the
        operation: 401 ``Access refused.`` when the user has no permissions
        on the vhost (the connection is refused).
        """
        if not self.broker.canAccess(user, vh.name):
            raise notAuthorised("Access refused.")
        return requestSession(self.broker, user, vh)

    def _rateView(self, request):
        """
        The request's :class:`~otter_tx.web._format.RateView`: the ranges of
        ``msg_rates_age``/``_incr``, ``lengths_age``/``_incr`` and
        ``data_rates_age``/``_incr`` (seconds; ignored unless both are
        integers, as RabbitMQ); 400 ``bad_request`` ``Invalid range
        parameters: age A, incr I`` when one is not positive or asks for
        more than 500 samples.
        """
        ranges = []
        for prefix in ("msg_rates", "lengths", "data_rates"):
            try:
                ranges.append(S.parseRange(_query(request, prefix + "_age"), _query(request, prefix + "_incr")))
            except S.InvalidRange as e:
                raise badRequest(str(e))
        return fmt.RateView(self.broker.sampler, *ranges)

    @staticmethod
    def _body(request):
        """The JSON request body as a dict ({} when empty); 400 ``not_json``."""
        raw = request.content.read() if request.content is not None else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise badRequest("not_json")
        if not isinstance(body, dict):
            raise badRequest("not_json")
        return body

    @staticmethod
    def _require(body, *keys):
        for k in keys:
            if k not in body:
                raise badRequest("[{key_missing,%s}]" % (k,))

    @staticmethod
    def _exchangeName(name):
        return "" if name == "amq.default" else name

    @app.handle_errors(NotFound)
    def _unknownPath(self, request, failure):
        """An unknown path: 404 ``Object Not Found`` (JSON), as RabbitMQ."""
        return self._renderError(request, notFound())

    @app.handle_errors(MethodNotAllowed)
    def _badMethod(self, request, failure):
        """An unsupported method: 405 with an ``allow`` header and no body."""
        allowed = failure.value.valid_methods or []
        request.setHeader(b"allow", ", ".join(allowed).encode("ascii"))
        return self._renderError(request, HTTPError(405, None, None))

    # --- policies -------------------------------------------------------------

    @staticmethod
    def _policies(vhosts, operator=False):
        """
        The policies of ``vhosts`` (their operator policies with
        ``operator``) as RabbitMQ shows them: per vhost in order, by name.
        """
        return [
            p.asDict() for vh in vhosts
            for p in sorted((vh.operatorPolicies if operator else vh.policies).values(), key=lambda p: p.name)
        ]

    @app.route("/api/policies", methods=["GET", "OPTIONS"])
    @endpoint()
    def policiesAll(self, request, user):
        """
        ``GET /api/policies``: the policies of every vhost the user has
        permissions on (every user tag sees the list, as in 3.10).
        """
        return self._policies(self._loginVHosts(user))

    @app.route("/api/policies/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
    def policiesVHost(self, request, user, vhost):
        """``GET /api/policies/{vhost}``."""
        return self._policies([self._vhost(vhost)])

    @app.route("/api/policies/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_POLICIES)
    def policy(self, request, user, vhost, name):
        """
        ``GET|PUT|DELETE /api/policies/{vhost}/{name}``.  PUT body
        ``{"pattern", "definition", "priority", "apply-to"}``: 201 created,
        204 updated, 400 ``Validation failed\\n\\n<text>\\n``.  DELETE: 204,
        404 when missing.  Administrators, and policymakers with
        permissions on the vhost, only (``is_authorized_policies``).
        """
        vh = self.broker.vhosts.get(vhost)
        if vh is None:
            if request.method == b"PUT":
                raise HTTPError(404, "not_found", "vhost_not_found")
            raise notFound()
        if request.method == b"GET":
            p = vh.policies.get(name)
            if p is None:
                raise notFound()
            return p.asDict()
        if request.method == b"DELETE":
            if name not in vh.policies:
                raise notFound()
            self.broker.clearPolicy(vhost, name)
            return Response(204)
        body = self._body(request)
        self._require(body, "pattern", "definition")
        policy = self._validatePolicy(vhost, name, body)
        existed = name in vh.policies
        vh.setPolicy(policy)
        return Response(204 if existed else 201)

    @staticmethod
    def _validatePolicy(vhost, name, body):
        """
        A :class:`Policy` from a PUT body, or 400 with RabbitMQ's
        ``Validation failed`` texts (the policies endpoint HTML-escapes
        ``<`` and ``>`` in them, as RabbitMQ 3.10 does).
        """

        def failed(text):
            text = text.replace("<", "&lt;").replace(">", "&gt;")
            return badRequest("Validation failed\n\n%s\n" % (text,))

        pattern = body["pattern"]
        definition = body["definition"]
        priority = body.get("priority", 0)
        applyTo = body.get("apply-to", "all")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise failed('priority should be a number, actually was <<"%s">>' % (priority,))
        if applyTo not in ("queues", "exchanges", "all"):
            raise failed("apply-to '%s' unrecognised; should be 'queues', 'exchanges' or 'all'" % (applyTo,))
        if not isinstance(pattern, str):
            raise failed("pattern should be a string")
        try:
            re.compile(pattern)
        except re.error as e:
            raise failed('pattern should be regular expression but is invalid: {"%s",%s}' % (e.msg, e.pos or 0))
        if not isinstance(definition, dict):
            raise failed("no policy provided")
        try:
            return Policy(name, pattern, definition, priority, applyTo, vhost)
        except PolicyError as e:
            raise failed(str(e))

    # --- operator policies ----------------------------------------------------

    @app.route("/api/operator-policies", methods=["GET", "OPTIONS"])
    @endpoint(_ADMIN)
    def operatorPoliciesAll(self, request, user):
        """``GET /api/operator-policies``: every vhost's operator policies, as policies are shown (administrators)."""
        return self._policies([vh for _, vh in sorted(self.broker.vhosts.items())], operator=True)

    @app.route("/api/operator-policies/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_ADMIN)
    def operatorPoliciesVHost(self, request, user, vhost):
        """``GET /api/operator-policies/{vhost}`` (404 for a missing vhost)."""
        return self._policies([self._vhost(vhost)], operator=True)

    @app.route("/api/operator-policies/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_ADMIN)
    def operatorPolicy(self, request, user, vhost, name):
        """
        ``GET|PUT|DELETE /api/operator-policies/{vhost}/{name}``: as
        ``/api/policies``, administrators only.  Definition keys:
        ``expires``, ``message-ttl``, ``max-length``, ``max-length-bytes``;
        others are 400 ``Validation failed\n\n[{<<"k">>,v}] are not
        recognised policy settings\n`` (not HTML-escaped, as 3.10).  A queue
        matched by a policy and an operator policy gets both definitions,
        the lower value for a key both set (``operator_policy`` and
        ``effective_policy_definition`` in the queue's JSON).
        """
        vh = self.broker.vhosts.get(vhost)
        if request.method != b"PUT":
            p = vh.operatorPolicies.get(name) if vh is not None else None
            if p is None:
                raise notFound()
            if request.method == b"DELETE":
                vh.clearOperatorPolicy(name)
                return Response(204)
            return p.asDict()
        if vh is None:
            raise HTTPError(404, "not_found", "vhost_not_found")
        body = self._body(request)
        self._require(body, "pattern", "definition")
        if isinstance(body["definition"], dict):
            try:
                checkOperatorKeys(body["definition"])
            except PolicyError as e:
                raise badRequest("Validation failed\n\n%s\n" % (e,))
        generic = self._validatePolicy(vhost, name, body)
        policy = OperatorPolicy(name, generic.pattern, generic.definition, generic.priority,
                                generic.applyTo, vhost)
        existed = name in vh.operatorPolicies
        vh.setOperatorPolicy(policy)
        return Response(204 if existed else 201)

    # --- vhost limits ---------------------------------------------------------

    @staticmethod
    def _vhostLimits(vhosts):
        """``[{"vhost", "value": {name: int}}]`` (an emptied set shows ``[]``)."""
        return [
            {"vhost": vh.name, "value": dict(vh.limits) if vh.limits else []}
            for vh in vhosts if vh.limits is not None
        ]

    @app.route("/api/vhost-limits", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST_VISIBLE)
    def vhostLimitsAll(self, request, user):
        """
        ``GET /api/vhost-limits``: ``[{"vhost": "v", "value":
        {"max-connections": 10, "max-queues": 5}}]`` for every vhost the
        user sees that ever had a limit (``value`` is ``[]`` once all were
        deleted, as RabbitMQ 3.10 lists it).
        """
        return self._vhostLimits(self._visibleVHosts(user))

    @app.route("/api/vhost-limits/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST_VISIBLE)
    def vhostLimits(self, request, user, vhost):
        """
        ``GET /api/vhost-limits/{vhost}``: as the list, for one vhost
        (``[]`` without limits; 404 for a missing vhost).
        """
        vh = self._vhost(vhost)
        return self._vhostLimits([vh]) if vh.limits else []

    @app.route("/api/vhost-limits/<vhost>/<name>", methods=["PUT", "DELETE", "OPTIONS"])
    @endpoint(_ADMIN)
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

    # --- user limits ----------------------------------------------------------

    def _userLimits(self, user, names):
        """``[{"user","value"}]`` for ``names`` with limits; a non-administrator sees only itself."""
        limits = self.broker.userLimits
        return [
            {"user": name, "value": dict(limits[name])}
            for name in sorted(names)
            if name in limits and (self._isAdmin(user) or name == user.name)
        ]

    @app.route("/api/user-limits", methods=["GET", "OPTIONS"])
    @endpoint(_ANY)
    def userLimitsAll(self, request, user):
        """
        ``GET /api/user-limits``: ``[{"user": "u", "value":
        {"max-connections": N, "max-channels": N}}]`` of the users with limits
        (a non-administrator sees only its own).
        """
        return self._userLimits(user, self.broker.userLimits)

    @app.route("/api/user-limits/<name>", methods=["GET", "OPTIONS"])
    @endpoint(_ANY)
    def userLimits(self, request, user, name):
        """``GET /api/user-limits/{user}``: as the list for one user (``[]`` without limits; 404 for no such user)."""
        if name not in self.broker.users:
            raise notFound()
        return self._userLimits(user, [name])

    @app.route("/api/user-limits/<name>/<limit>", methods=["PUT", "DELETE", "OPTIONS"])
    @endpoint(_ADMIN)
    def userLimit(self, request, user, name, limit):
        """
        ``PUT /api/user-limits/{user}/{limit}`` with ``{"value": N}`` and
        ``DELETE``: 204; administrators only.  ``max-connections`` and
        ``max-channels`` (negative: no limit), enforced on AMQP with 530
        NOT_ALLOWED as RabbitMQ 3.10.  400 ``max-channels should be a
        number, actually was <<"x">>`` / ``Unrecognised terms
        [{<<"foo">>,1}] in user-limits`` (no ``Validation failed`` prefix,
        as 3.10), 400 ``[{key_missing,value}]``, 400 ``["no_such_user","u"]``
        for a PUT to a missing user (404 for DELETE).  Stored with the user.
        """
        if name not in self.broker.users:
            if request.method == b"DELETE":
                raise notFound()
            raise badRequest(["no_such_user", name])
        if request.method == b"DELETE":
            self.broker.clearUserLimit(name, limit)
            return Response(204)
        body = self._body(request)
        self._require(body, "value")
        try:
            self.broker.setUserLimit(name, limit, body["value"])
        except LimitError as e:
            raise badRequest(str(e))
        return Response(204)

    # --- global parameters and parameters --------------------------------------

    @app.route("/api/global-parameters", methods=["GET", "OPTIONS"])
    @endpoint(_GLOBAL_PARAMETERS)
    def globalParameters(self, request, user):
        """``GET /api/global-parameters``: ``[{"name","value"}]`` (administrators and policymakers)."""
        params = self.broker.globalParameters
        return [{"name": name, "value": params[name]} for name in sorted(params)]

    @app.route("/api/global-parameters/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_GLOBAL_PARAMETERS)
    def globalParameter(self, request, user, name):
        """
        ``GET /api/global-parameters/{name}`` (``{"value","name"}``, 404),
        ``PUT`` with ``{"value": any JSON}`` (201 new, 204 replaced; 400
        ``[{key_missing,value}]``), ``DELETE`` (204, 404).  Stored durably;
        ``cluster_name`` is the overview's ``cluster_name``.
        Administrators and policymakers (``is_authorized_global_parameters``).
        """
        params = self.broker.globalParameters
        if request.method == b"GET":
            if name not in params:
                raise notFound()
            return {"value": params[name], "name": name}
        if request.method == b"DELETE":
            if not self.broker.clearGlobalParameter(name):
                raise notFound()
            return Response(204)
        body = self._body(request)
        self._require(body, "value")
        return Response(201 if self.broker.setGlobalParameter(name, body["value"]) else 204)

    @staticmethod
    def _parameters(vhosts, component=None):
        """
        The runtime parameters of ``vhosts``: RabbitMQ 3.10 without plugins
        has only the ``vhost-limits`` component, one ``limits`` parameter
        per vhost that has limits.
        """
        if component not in (None, "vhost-limits"):
            return []
        return [
            {"value": dict(vh.limits) if vh.limits else [], "vhost": vh.name,
             "component": "vhost-limits", "name": "limits"}
            for vh in vhosts if vh.limits is not None
        ]

    @app.route("/api/parameters", methods=["GET", "OPTIONS"])
    @endpoint(_POLICIES)
    def parametersAll(self, request, user):
        """
        ``GET /api/parameters``: ``[{"value","vhost","component","name"}]``
        of the vhosts the user has (``vhost-limits`` only: no plugin here
        defines other components).  Administrators and policymakers.
        """
        return self._parameters(self._loginVHosts(user))

    @app.route("/api/parameters/<component>", methods=["GET", "OPTIONS"])
    @endpoint(_POLICIES)
    def parametersComponent(self, request, user, component):
        """``GET /api/parameters/{component}``: as the list, one component (``[]`` for an unknown one)."""
        return self._parameters(self._loginVHosts(user), component)

    @app.route("/api/parameters/<component>/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_POLICIES)
    def parametersVHost(self, request, user, component, vhost):
        """``GET /api/parameters/{component}/{vhost}``: one component in one vhost (404 for a missing vhost)."""
        return self._parameters([self._vhost(vhost)], component)

    @app.route("/api/parameters/<component>/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_POLICIES)
    def parameter(self, request, user, component, vhost, name):
        """
        ``GET|PUT|DELETE /api/parameters/{component}/{vhost}/{name}``.
        ``vhost-limits``/``{v}``/``limits`` is the vhost's limits: PUT
        ``{"value": {"max-queues": N, ...}}`` replaces them all (201 new, 204
        replaced; 400 ``Validation failed`` with ``<``/``>`` HTML-escaped as
        3.10 does), DELETE drops them (204).  Any other component is 400
        ``Validation failed\n\ncomponent foo not found\n`` on PUT, 404 on
        GET and DELETE, as RabbitMQ 3.10 without plugins; 404
        ``vhost_not_found`` for a PUT to a missing vhost.
        """
        vh = self.broker.vhosts.get(vhost)
        if request.method == b"PUT":
            if vh is None:
                raise HTTPError(404, "not_found", "vhost_not_found")
            body = self._body(request)
            self._require(body, "value")
            return self._putLimitsParameter(vh, component, name, body["value"])
        found = vh is not None and component == "vhost-limits" and name == "limits" and vh.limits is not None
        if not found:
            raise notFound()
        if request.method == b"DELETE":
            vh.setLimits(None)
            return Response(204)
        return self._parameters([vh])[0]

    @staticmethod
    def _putLimitsParameter(vh, component, name, value):
        def failed(text):
            text = text.replace("<", "&lt;").replace(">", "&gt;")
            return badRequest("Validation failed\n\n%s\n" % (text,))

        if component != "vhost-limits":
            raise failed("component %s not found" % (component,))
        if name != "limits":
            # RabbitMQ 3.10 stores it under that name and answers 500
            raise failed("vhost-limits parameters are named limits, not %s" % (name,))
        if not isinstance(value, dict):
            raise failed("limits should be an object")
        new = vh.limits is None
        try:
            vh.setLimits(value)
        except LimitError as e:
            raise failed(str(e))
        return Response(201 if new else 204)

    # --- queues -------------------------------------------------------------

    @app.route("/api/queues", methods=["GET", "OPTIONS"])
    @endpoint()
    def queuesAll(self, request, user):
        """``GET /api/queues``: the queues of the user's vhosts (RabbitMQ's list fields)."""
        unacked = fmt.unackedBytes(self.broker)
        view = self._rateView(request)
        return _queueList(request, [
            fmt.queueDict(q, unacked, view=view)
            for vh in self._loginVHosts(user)
            for _, q in sorted(vh.queues.items())
        ])

    @app.route("/api/queues/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
    def queuesVHost(self, request, user, vhost):
        """``GET /api/queues/{vhost}``."""
        vh = self._vhost(vhost)
        unacked = fmt.unackedBytes(self.broker)
        view = self._rateView(request)
        return _queueList(request, [fmt.queueDict(q, unacked, view=view) for _, q in sorted(vh.queues.items())])

    @app.route("/api/queues/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_VHOST)
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
            body = self._body(request)
            args = body.get("arguments") or {}
            if not isinstance(args, dict):
                raise badRequest("arguments must be an object")
            session = self._session(user, vh)
            existed = name in vh.queues
            session.declareQueue(name, durable=_flag(body.get("durable")),
                                 autoDelete=_flag(body.get("auto_delete")), arguments=args)
            return Response(204 if existed else 201)
        q = self._queue(vh, name)
        if request.method == b"DELETE":
            self._session(user, vh).deleteQueue(
                name, ifUnused=_queryFlag(request, "if-unused"), ifEmpty=_queryFlag(request, "if-empty"))
            return Response(204)
        return fmt.queueDict(q, fmt.unackedBytes(self.broker), detail=True, view=self._rateView(request))

    @app.route("/api/queues/<vhost>/<name>/contents", methods=["DELETE", "OPTIONS"])
    @endpoint(_VHOST)
    def queueContents(self, request, user, vhost, name):
        """
        ``DELETE /api/queues/{vhost}/{name}/contents``: purge (204, 404);
        needs read permission on the queue, as ``queue.purge`` (401
        ``Access refused.``).
        """
        vh = self._vhost(vhost)
        self._queue(vh, name)  # 404 when missing
        self._session(user, vh).purgeQueue(name)
        return Response(204)

    @app.route("/api/queues/<vhost>/<name>/bindings", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
    def queueBindings(self, request, user, vhost, name):
        """``GET /api/queues/{vhost}/{name}/bindings``, the default-exchange binding first."""
        vh = self._vhost(vhost)
        self._queue(vh, name)  # 404 when missing
        return [b for b in fmt.vhostBindings(vh) if b["destination_type"] == "queue" and b["destination"] == name]

    @app.route("/api/queues/<vhost>/<name>/get", methods=["POST", "OPTIONS"])
    @endpoint(_VHOST)
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
        session = self._session(user, vh)
        out = []
        try:
            session.readableQueue(name)
            # ack_requeue_false is a no-ack basic.get, as the plugin's (its get_no_ack count)
            noAck = ackmode == "ack_requeue_false"
            for _ in range(max(0, count)):
                got = session.get(name, noAck=noAck)
                if got is None:
                    break
                _, entry, q = got
                # a quorum queue's answer carries x-delivery-count, as basic.get's
                out.append(self._messageJson(q.deliveredMessage(entry, get=True), entry.redelivered,
                                             q.readyCount, encoding, truncate))
            if out:
                # the fetched messages are settled together, as the plugin's channel does
                if ackmode in ("ack_requeue_true", "reject_requeue_true"):
                    session.nack(0, multiple=True, requeue=True)
                elif noAck:
                    pass
                else:
                    session.nack(0, multiple=True, requeue=False)
        except AMQPError as e:
            raise getRefusal(e)
        finally:
            session.closed()
        return out

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

    # --- queue insight: browse, expiry, dead-letter target (otter-only) -------

    @app.route("/api/queues/<vhost>/<name>/browse", methods=["POST", "OPTIONS"])
    @endpoint(_VHOST)
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
        session = self._session(user, vh)
        try:
            q = session.readableQueue(name)
        except AMQPError as e:  # as /get answers them
            raise getRefusal(e)
        finally:
            session.closed()
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
    @endpoint(_VHOST)
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
        segments), :meth:`~otter_tx.broker.queue.Queue.readyExpiries`).
        404 for no queue.
        """
        vh = self._vhost(vhost)
        q = self._queue(vh, name)
        now = nowMs(self.clock)
        counts = dict.fromkeys(("within_1s", "within_10s", "within_1min", "later", "never"), 0)
        buckets = self._EXPIRY_BUCKETS
        estimated = 0
        for at, n, exact in q.readyExpiries():
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
    @endpoint(_VHOST)
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
            "queues": self._deadLetterQueues(vh, s.dlx, s.dlrk),
        }

    @staticmethod
    def _deadLetterQueues(vh, dlx, dlrk):
        """The queues of :meth:`queueDeadLetter` (sorted by name, each once)."""
        start = vh.exchanges.get(dlx)
        if start is None:
            return []
        found = {}
        if start.name == "":
            q = vh.queues.get(dlrk) if dlrk is not None else None
            if q is not None:
                found[q.name] = dlrk
            elif dlrk is None:
                found.update((n, n) for n in vh.queues)
            return [{"vhost": vh.name, "name": n, "routing_key": k} for n, k in sorted(found.items())]
        probe = Message(dlx, dlrk or "", b"\x00\x00", b"", {})
        visited = {start}
        pending = [start]
        while pending:
            ex = pending.pop()
            if dlrk is not None:
                dests = set()
                ex.routing.route(probe, [dlrk], dests)
                pairs = [(d, dlrk) for d in dests]
            else:
                pairs = [(d, k) for d, k, _ in ex.routing.bindings()]
            for d, key in pairs:
                if isinstance(d, Queue):
                    found.setdefault(d.name, key)
                elif d not in visited:
                    visited.add(d)
                    pending.append(d)
            if not pairs and ex.alternate is not None:
                ae = vh.exchanges.get(ex.alternate)
                if ae is not None and ae not in visited:
                    visited.add(ae)
                    pending.append(ae)
        return [{"vhost": vh.name, "name": n, "routing_key": k} for n, k in sorted(found.items())]

    # --- exchanges ------------------------------------------------------------

    @app.route("/api/exchanges", methods=["GET", "OPTIONS"])
    @endpoint()
    def exchangesAll(self, request, user):
        """``GET /api/exchanges``."""
        view = self._rateView(request)
        return [
            fmt.exchangeDict(ex, view)
            for vh in self._loginVHosts(user)
            for _, ex in sorted(vh.exchanges.items())
        ]

    @app.route("/api/exchanges/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
    def exchangesVHost(self, request, user, vhost):
        """``GET /api/exchanges/{vhost}``."""
        vh = self._vhost(vhost)
        view = self._rateView(request)
        return [fmt.exchangeDict(ex, view) for _, ex in sorted(vh.exchanges.items())]

    @app.route("/api/exchanges/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_VHOST)
    def exchange(self, request, user, vhost, name):
        """
        ``GET`` one exchange (``messages_delayed`` for x-delayed-message);
        ``PUT`` declares (body ``{"type", "durable", "auto_delete",
        "internal", "arguments"}``; 201, 204, 400 inequivalent or ``invalid
        exchange type 'T'``, 401 ``Access refused.`` for ``amq.*``);
        ``DELETE`` (``?if-unused=true``; 204, 404, 400 in use).
        ``amq.default`` names the default exchange.  PUT and DELETE need
        configure permission on the exchange, PUT with an alternate exchange
        also read on it and write on the alternate
        (:func:`~otter_tx.broker.access.exchangeDeclareChecks`; 401 ``Access refused.``).
        """
        vh = self._vhost(vhost)
        xname = self._exchangeName(name)
        if request.method == b"PUT":
            body = self._body(request)
            xtype = body.get("type", "direct")
            if xtype != DELAYED_TYPE and xtype not in EXCHANGE_TYPES:
                raise badRequest("unknown exchange type '%s'" % (xtype,))
            args = body.get("arguments") or {}
            if not isinstance(args, dict):
                raise badRequest("arguments must be an object")
            session = self._session(user, vh)
            existed = xname in vh.exchanges
            session.declareExchange(
                xname, xtype, durable=_flag(body.get("durable")),
                autoDelete=_flag(body.get("auto_delete")), internal=_flag(body.get("internal")),
                arguments=args,
            )
            return Response(204 if existed else 201)
        ex = vh.exchanges.get(xname)
        if ex is None:
            raise notFound()
        if request.method == b"DELETE":
            self._session(user, vh).deleteExchange(xname, ifUnused=_queryFlag(request, "if-unused"))
            return Response(204)
        d = fmt.exchangeDict(ex, self._rateView(request))
        d["incoming"] = []
        d["outgoing"] = []
        return d

    @app.route("/api/exchanges/<vhost>/<name>/bindings/<any(source,destination):side>",
               methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
    def exchangeBindings(self, request, user, vhost, name, side):
        """``GET /api/exchanges/{vhost}/{name}/bindings/source|destination``."""
        vh = self._vhost(vhost)
        xname = self._exchangeName(name)
        if xname not in vh.exchanges:
            raise notFound()
        if side == "source":
            return [b for b in fmt.vhostBindings(vh) if b["source"] == xname]
        return [
            b for b in fmt.vhostBindings(vh, includeDefault=False)
            if b["destination_type"] == "exchange" and b["destination"] == xname
        ]

    @app.route("/api/exchanges/<vhost>/<name>/publish", methods=["POST", "OPTIONS"])
    @endpoint(_VHOST)
    def exchangePublish(self, request, user, vhost, name):
        """
        ``POST /api/exchanges/{vhost}/{name}/publish`` with ``{"properties",
        "routing_key", "payload", "payload_encoding"}`` -> ``{"routed":
        bool}``.  AMQP errors are 400 with the full reply, e.g. ``406
        PRECONDITION_FAILED - invalid expiration 'abc': no_integer``.
        Needs write permission on the exchange, checked before the exchange
        is looked up, as ``basic.publish`` does: 400 ``403 ACCESS_REFUSED -
        access to exchange 'x' in vhost '/' refused for user 'u'``.
        """
        vh = self._vhost(vhost)
        body = self._body(request)
        self._require(body, "routing_key", "properties", "payload", "payload_encoding")
        enc = body["payload_encoding"]
        payload = body["payload"]
        if enc == "string":
            data = str(payload).encode("utf-8")
        elif enc == "base64":
            try:
                data = base64.b64decode(str(payload), validate=True)
            except ValueError:
                raise badRequest(["not_base64", payload])
        else:
            raise badRequest(["unsupported_encoding", enc])
        xname = self._exchangeName(name)
        session = self._session(user, vh)
        try:
            ex = session.publishTarget(xname)
            props = self._properties(body["properties"])
            routed, _ = session.publish(ex, str(body["routing_key"]), False, encodeProperties(props), data,
                                        props=props)
        except AMQPError as e:
            raise badRequest(str(e))
        self.broker.checkMemory()
        return {"routed": routed > 0}

    @staticmethod
    def _properties(props):
        """JSON message properties to the broker's property dict (AMQP types)."""
        if not isinstance(props, dict):
            raise badRequest("properties must be an object")
        out = {}
        for k, v in props.items():
            if v is None:
                continue
            if k in _SHORTSTR_PROPS:
                out[k] = v if isinstance(v, str) else json.dumps(v)
            elif k in ("delivery_mode", "priority"):
                try:
                    out[k] = int(v)
                except (TypeError, ValueError):
                    raise badRequest("%s must be an integer" % (k,))
            elif k == "timestamp":
                try:
                    out[k] = Timestamp(int(v))
                except (TypeError, ValueError):
                    raise badRequest("timestamp must be an integer")
            elif k == "headers":
                if not isinstance(v, dict):
                    raise badRequest("headers must be an object")
                out[k] = v
        return out

    # --- delayed (scheduled) messages: otter-only, docs/delayed.md ---------------

    def _delayedExchange(self, user, vhost, name, operation):
        """
        ``(session, exchange)`` for an operation on the held messages of
        x-delayed-message exchange ``name``: 404 ``Object Not Found`` when
        the vhost or exchange is missing or the exchange is not delayed;
        401 ``Access refused.`` without permissions on the vhost or without
        the operation's permission on the exchange
        (:func:`~otter_tx.broker.delayed.checkHeldAccess`: read to list,
        write to cancel and purge).
        """
        vh = self._vhost(vhost)
        ex = vh.exchanges.get(self._exchangeName(name))
        if ex is None or not ex.delayed:
            raise notFound()
        session = self._session(user, vh)
        checkHeldAccess(session.access, ex.name, operation)
        return session, ex

    @staticmethod
    def _afterSync(ex, response):
        """
        ``response``, once the store synced a durable exchange's change (a
        Deferred then); 500 ``internal_error`` when the sync failed.
        """
        if ex.journal is None:
            return response
        return ex.journal.sync().addCallbacks(
            lambda _: response,
            lambda f: Response(500, {"error": "internal_error",
                                     "reason": "store sync failed: %s" % (f.getErrorMessage(),)}))

    @app.route("/api/exchanges/<vhost>/<name>/delayed", methods=["GET", "DELETE", "OPTIONS"])
    @endpoint(_VHOST)
    def exchangeDelayed(self, request, user, vhost, name):
        """
        ``GET /api/exchanges/{vhost}/{name}/delayed?page=P&page_size=S``: the
        held messages in due order, ``{"items": [{"id", "message_id",
        "due" (epoch ms), "routing_key", "properties", "payload_bytes"}],
        "total_count", "page", "page_size"}`` (page from 1, size 1..500,
        default 100; else 400 ``invalid_pagination_parameters``); needs read
        permission on the exchange.  ``DELETE``: purge them all (204); needs
        write permission.  404 for a missing or non-delayed exchange.
        """
        if request.method == b"DELETE":
            _, ex = self._delayedExchange(user, vhost, name, "purge")
            ex.purgeHeld()
            return self._afterSync(ex, Response(204))
        _, ex = self._delayedExchange(user, vhost, name, "list")
        try:
            page, size = pageParameters(_query(request, "page"), _query(request, "page_size"))
        except ValueError as e:
            raise HTTPError(400, "invalid_pagination_parameters", str(e))
        return ex.heldPage(page, size)

    @app.route("/api/exchanges/<vhost>/<name>/delayed/<held>", methods=["DELETE", "OPTIONS"])
    @endpoint(_VHOST)
    def exchangeDelayedOne(self, request, user, vhost, name, held):
        """
        ``DELETE /api/exchanges/{vhost}/{name}/delayed/{id}``: cancel the held
        message with broker id ``id`` (204; 404 when no such held message).
        Needs write permission on the exchange.
        """
        _, ex = self._delayedExchange(user, vhost, name, "cancel")
        if not ex.cancel(held):
            raise notFound()
        return self._afterSync(ex, Response(204))

    @app.route("/api/exchanges/<vhost>/<name>/delayed/by-message-id/<messageId>",
               methods=["DELETE", "OPTIONS"])
    @endpoint(_VHOST)
    def exchangeDelayedByMessageId(self, request, user, vhost, name, messageId):
        """
        ``DELETE /api/exchanges/{vhost}/{name}/delayed/by-message-id/{message_id}``:
        cancel every held message whose ``message_id`` property is
        ``message_id`` (204; 404 when there is none).  Needs write
        permission on the exchange.
        """
        _, ex = self._delayedExchange(user, vhost, name, "cancel")
        if not ex.cancelMessageId(messageId):
            raise notFound()
        return self._afterSync(ex, Response(204))

    # --- bindings -------------------------------------------------------------

    @app.route("/api/bindings", methods=["GET", "OPTIONS"])
    @endpoint()
    def bindingsAll(self, request, user):
        """``GET /api/bindings``."""
        return [b for vh in self._loginVHosts(user) for b in fmt.vhostBindings(vh)]

    @app.route("/api/bindings/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
    def bindingsVHost(self, request, user, vhost):
        """``GET /api/bindings/{vhost}``."""
        return fmt.vhostBindings(self._vhost(vhost))

    def _checkBinding(self, user, vh, source, dtype, dest):
        """
        A Session for ``user`` after the ``queue.bind`` / ``exchange.bind``
        permissions (also for unbind): write on the destination, read on the
        source exchange; 401 ``Access refused.``.
        """
        kind = "queue" if dtype == "q" else "exchange"
        dname = dest if dtype == "q" else self._exchangeName(dest)
        session = self._session(user, vh)
        session.access.checkAll(bindChecks(kind, dname, self._exchangeName(source)))
        return session

    def _bindingEnds(self, vh, source, dtype, dest):
        """The source Exchange and destination (Queue or Exchange) or 404 ``not_found``."""
        src = vh.getExchange(self._exchangeName(source))
        if dtype == "q":
            dst = vh.queues.get(dest)
            if dst is None:
                raise HTTPError(404, "not_found", "no queue '%s' in vhost '%s'" % (dest, vh.name))
        else:
            dst = vh.getExchange(self._exchangeName(dest))
        return src, dst

    def _bindingsBetween(self, vh, source, dtype, dest):
        xname = self._exchangeName(source)
        dname = dest if dtype == "q" else self._exchangeName(dest)
        kind = "queue" if dtype == "q" else "exchange"
        return [
            b for b in fmt.vhostBindings(vh)
            if b["source"] == xname and b["destination"] == dname and b["destination_type"] == kind
        ]

    @app.route("/api/bindings/<vhost>/e/<source>/<any(q,e):dtype>/<dest>", methods=["GET", "POST", "OPTIONS"])
    @endpoint(_VHOST)
    def bindingsBetween(self, request, user, vhost, source, dtype, dest):
        """
        ``GET`` the bindings from exchange ``source`` to queue (``q``) or
        exchange (``e``) ``dest``; ``POST {"routing_key", "arguments"}``
        binds: 201 with ``Location: <dest>/<properties_key>``; 404
        ``not_found`` for a missing end; the permissions of
        :meth:`_checkBinding` are checked first, as RabbitMQ does.
        """
        vh = self._vhost(vhost)
        if request.method == b"GET":
            return self._bindingsBetween(vh, source, dtype, dest)
        body = self._body(request)
        key = body.get("routing_key", "")
        args = body.get("arguments") or {}
        if not isinstance(key, str) or not isinstance(args, dict):
            raise badRequest("routing_key must be a string and arguments an object")
        session = self._checkBinding(user, vh, source, dtype, dest)
        src, dst = self._bindingEnds(vh, source, dtype, dest)
        if dtype == "q":
            session.bindQueue(dst.name, src.name, key, args)
        else:
            session.bindExchange(dst.name, src.name, key, args)
        # the Location segment is the properties_key percent-encoded once more, as RabbitMQ sends it
        location = "%s/%s" % (quote(dest, safe=""), quote(fmt.propertiesKey(key, args), safe="~"))
        return Response(201, headers=[(b"location", location.encode("utf-8"))])

    @app.route("/api/bindings/<vhost>/e/<source>/<any(q,e):dtype>/<dest>/<props>",
               methods=["GET", "DELETE", "OPTIONS"])
    @endpoint(_VHOST)
    def binding(self, request, user, vhost, source, dtype, dest, props):
        """
        ``GET`` or ``DELETE`` one binding by its ``properties_key`` (204 /
        404; DELETE needs the permissions of :meth:`_checkBinding`).
        """
        vh = self._vhost(vhost)
        for b in self._bindingsBetween(vh, source, dtype, dest):
            if props in (b["properties_key"], unquote(b["properties_key"])):
                break
        else:
            raise notFound()
        if request.method == b"GET":
            return b
        session = self._checkBinding(user, vh, source, dtype, dest)
        src, dst = self._bindingEnds(vh, source, dtype, dest)
        unbind = session.unbindQueue if dtype == "q" else session.unbindExchange
        for d, k, a in list(src.routing.bindings()):
            if d is dst and k == b["routing_key"] and fmt.propertiesKey(k, a) == b["properties_key"]:
                unbind(dst.name, src.name, k, a)
        return Response(204)

    # --- overview, vhosts, users, permissions ----------------------------------

    @app.route("/api/overview", methods=["GET", "OPTIONS"])
    @endpoint()
    def overview(self, request, user):
        """
        ``GET /api/overview``.  ``product_name``/``product_version`` are
        otter_tx's; ``rabbitmq_version``/``management_version`` report the
        RabbitMQ release whose API is reproduced (:data:`RABBITMQ_COMPAT_VERSION`),
        which tools such as rabbitmqadmin and exporters parse.
        """
        vhosts = self._visibleVHosts(user)
        queues = [q for vh in vhosts for q in vh.queues.values()]
        conns = [c for c in self._visibleConnections(user) if c.vhost in vhosts or c.vhost is None]
        view = self._rateView(request)
        broker = self.broker
        if len(vhosts) == len(broker.vhosts):
            # the node's own series (what the sampler recorded for every vhost)
            values = S.sumValues([S.vhostValues(vh) for vh in vhosts], len(S.VHOST_KEYS))
            messageStats = view.messageStats("overview", broker, S.VHOST_KEYS, values)
            queueTotals = view.lengthStats("overview-lengths", broker, S.lengthValues(queues))
        else:
            # a user who sees some vhosts: the sum of theirs, rates included
            messageStats = _sumStats([view.messageStats("vhost", vh, S.VHOST_KEYS, S.vhostValues(vh))
                                      for vh in vhosts])
            queueTotals = _sumStats([view.lengthStats("vhost-lengths", vh, S.lengthValues(vh.queues.values()))
                                     for vh in vhosts])
        return {
            "product_name": "otter_tx",
            "product_version": __version__,
            "rabbitmq_version": RABBITMQ_COMPAT_VERSION,
            "management_version": RABBITMQ_COMPAT_VERSION,
            "rates_mode": "basic",
            "sample_retention_policies": S.SAMPLE_RETENTION_POLICIES,
            "cluster_name": self.broker.globalParameters.get("cluster_name", fmt.NODE),
            "node": fmt.NODE,
            "erlang_version": None,
            "erlang_full_version": None,
            "disable_stats": _queryFlag(request, "disable_stats"),
            "enable_queue_totals": _queryFlag(request, "enable_queue_totals"),
            "exchange_types": [
                {"name": n, "description": d, "enabled": True} for n, d in _EXCHANGE_TYPE_DESCRIPTIONS
            ],
            "message_stats": messageStats,
            "churn_rates": view.messageStats("churn", broker, S.CHURN_KEYS, S.churnValues(broker.counters)),
            "queue_totals": queueTotals,
            "object_totals": {
                "channels": sum(len(c.channels) for c in conns),
                "connections": len(conns),
                "consumers": sum(len(q.consumers) for q in queues),
                "exchanges": sum(len(vh.exchanges) for vh in vhosts),
                "queues": len(queues),
            },
            "statistics_db_event_queue": 0,
            "listeners": self._listenersList(),
            "contexts": self._contexts(),
        }

    def _listenersList(self):
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

    def _contexts(self):
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
            vhostBytes = S.vhostBytes(self.broker)
        queues = list(vh.queues.values())
        d = {
            "name": vh.name,
            "description": "Default virtual host" if vh.name == "/" else "",
            "tags": [],
            "metadata": {"description": "Default virtual host" if vh.name == "/" else "", "tags": []},
            "default_queue_type": "undefined",
            "tracing": False,
            "cluster_state": {fmt.NODE: "running"},
            "message_stats": view.messageStats("vhost", vh, S.VHOST_KEYS, S.vhostValues(vh)),
        }
        d.update(view.lengthStats("vhost-lengths", vh, S.lengthValues(queues)))
        d.update(view.dataStats("vhost-data", vh, vhostBytes[vh]))
        return d

    @app.route("/api/vhosts", methods=["GET", "OPTIONS"])
    @endpoint()
    def vhosts(self, request, user):
        """``GET /api/vhosts``."""
        view = self._rateView(request)
        vhostBytes = S.vhostBytes(self.broker)
        return [self._vhostDict(vh, view, vhostBytes) for vh in self._visibleVHosts(user)]

    @app.route("/api/vhosts/<vhost>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_ADMIN)
    def vhost(self, request, user, vhost):
        """
        ``GET``; ``PUT`` (201 / 204; the creating user gets full
        permissions on a new vhost, as in RabbitMQ; the body's description
        and tags are not stored); ``DELETE`` (204 / 404; closes its
        connections).  Administrators only, every method, as 3.10's
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
        closed = self.broker.deleteVHost(vhost)
        return self._afterClosing(closed, Response(204))

    #: seconds an HTTP answer waits for the connections it closed to go
    closeWait = 1.0

    def _afterClosing(self, connections, response):
        """
        A Deferred firing with ``response`` once ``connections`` (closed by
        the request with connection.close) have gone, or after
        :attr:`closeWait` seconds: RabbitMQ answers a vhost deletion only
        after its connections are closed, so a client that sees the 204 also
        sees its connection.close.
        """
        d = gatherResults([c.whenClosed() for c in connections], consumeErrors=True)
        d.addTimeout(self.closeWait, self.clock)
        d.addErrback(lambda f: None)  # timed out (the waits are cancelled): answer anyway
        return d.addCallback(lambda _: response)

    @app.route("/api/vhosts/<vhost>/permissions", methods=["GET", "OPTIONS"])
    @endpoint(_ADMIN)
    def vhostPermissions(self, request, user, vhost):
        """``GET /api/vhosts/{vhost}/permissions``."""
        self._vhost(vhost)
        return [p for p in self._permissionList() if p["vhost"] == vhost]

    @app.route("/api/whoami", methods=["GET", "OPTIONS"])
    @endpoint()
    def whoami(self, request, user):
        """``GET /api/whoami``: ``{name, tags}`` (tags a list, as 3.10)."""
        return {"name": user.name, "tags": list(user.tags)}

    @app.route("/api/users", methods=["GET", "OPTIONS"])
    @endpoint(_ADMIN)
    def users(self, request, user):
        """``GET /api/users``."""
        return [fmt.userDict(u, self.broker.userLimits.get(u.name)) for _, u in sorted(self.broker.users.items())]

    @app.route("/api/users/bulk-delete", methods=["POST", "OPTIONS"])
    @endpoint(_ADMIN)
    def usersBulkDelete(self, request, user):
        """
        ``POST /api/users/bulk-delete`` with ``{"users": ["a", "b"]}``: deletes
        them in order (permissions too), 204.  At the first missing one it
        stops with 400 ``{"error":"bad_request","reason":["no_such_user",
        "x"]}`` (the ones before it are gone), as RabbitMQ 3.10; 400
        ``[{key_missing,users}]`` without ``users``.  Administrators only.
        """
        body = self._body(request)
        self._require(body, "users")
        names = body["users"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise badRequest("users must be a list of names")  # RabbitMQ 3.10 answers 500
        for name in names:
            if name not in self.broker.users:
                raise badRequest(["no_such_user", name])
            self.broker.deleteUser(name)
        return Response(204)

    @app.route("/api/users/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_ADMIN)
    def user(self, request, user, name):
        """
        ``GET``; ``PUT {"password" | "password_hash", "tags"}`` (tags a
        list or a comma-separated string; 201 / 204; an existing user keeps
        its password when neither is given); ``DELETE`` (204 / 404; its
        permissions go too).
        """
        broker = self.broker
        existing = broker.users.get(name)
        if request.method == b"GET":
            if existing is None:
                raise notFound()
            return fmt.userDict(existing, self.broker.userLimits.get(name))
        if request.method == b"DELETE":
            if existing is None:
                raise notFound()
            broker.deleteUser(name)
            return Response(204)
        body = self._body(request)
        tags = body.get("tags", [])
        if isinstance(tags, str):
            tags = [t.strip() for t in tags.split(",") if t.strip()]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise badRequest("tags must be a list or a comma-separated string")
        password = body.get("password")
        phash = body.get("password_hash")
        if password is not None:
            broker.addUser(name, str(password), tags)
        elif phash is not None:
            self._replaceUser(name, tags, phash, body.get("hashing_algorithm"))
        elif existing is not None:
            broker.setUserTags(name, tags)
        else:
            self._replaceUser(name, tags, "", None)
        return Response(204 if existing is not None else 201)

    def _replaceUser(self, name, tags, passwordHash, algorithm):
        """
        Install user ``name`` with a RabbitMQ ``password_hash`` made with
        ``hashing_algorithm`` (sha256 when None; ``""``: no password); 400
        ``invalid password_hash`` / ``unknown hashing_algorithm ...``.
        """
        u = User(name, None, tags)
        try:
            u.setPasswordHash(passwordHash, algorithm)
        except PasswordHashError as e:
            raise badRequest(str(e))
        self.broker.putUser(u)

    def _permissionList(self):
        return [
            {"user": u, "vhost": v, "configure": p[0], "write": p[1], "read": p[2]}
            for (u, v), p in sorted(self.broker.permissions.items())
        ]

    @app.route("/api/permissions", methods=["GET", "OPTIONS"])
    @endpoint(_ADMIN)
    def permissions(self, request, user):
        """``GET /api/permissions``."""
        return self._permissionList()

    @app.route("/api/users/<name>/permissions", methods=["GET", "OPTIONS"])
    @endpoint(_ADMIN)
    def userPermissions(self, request, user, name):
        """``GET /api/users/{name}/permissions``."""
        if name not in self.broker.users:
            raise notFound()
        return [p for p in self._permissionList() if p["user"] == name]

    @app.route("/api/permissions/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(_ADMIN)
    def permission(self, request, user, vhost, name):
        """
        ``GET``; ``PUT {"configure", "write", "read"}`` (201 / 204; 400
        ``vhost_or_user_not_found``); ``DELETE`` (204 / 404).
        """
        key = (name, vhost)
        perms = self.broker.permissions.get(key)
        if request.method == b"GET":
            if perms is None:
                raise notFound()
            return {"user": name, "vhost": vhost, "configure": perms[0], "write": perms[1], "read": perms[2]}
        if request.method == b"DELETE":
            if perms is None:
                raise notFound()
            self.broker.clearPermissions(name, vhost)
            return Response(204)
        body = self._body(request)
        self._require(body, "configure", "write", "read")
        if vhost not in self.broker.vhosts or name not in self.broker.users:
            raise badRequest("vhost_or_user_not_found")
        self.broker.setPermissions(name, vhost, str(body["configure"]), str(body["write"]), str(body["read"]))
        return Response(204 if perms is not None else 201)

    # --- connections, channels, consumers --------------------------------------

    def _visibleConnections(self, user):
        """
        The connections a user sees (``rabbit_mgmt_util:filter_conn_ch_list``):
        all for monitoring users and administrators, else its own.
        """
        conns = sorted(self.broker.connections, key=fmt.connectionName)
        if self._isMonitor(user):
            return conns
        return [c for c in conns if self._owns(user, c)]

    @staticmethod
    def _owns(user, conn):
        return conn.user is not None and conn.user.name == user.name

    @app.route("/api/connections", methods=["GET", "OPTIONS"])
    @endpoint()
    def connections(self, request, user):
        """``GET /api/connections``: all for monitoring users and administrators, else the user's own."""
        view = self._rateView(request)
        return [fmt.connectionDict(c, view) for c in self._visibleConnections(user)]

    @app.route("/api/vhosts/<vhost>/connections", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
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
                                 if c.queue.vhost.queues.get(c.queue.name) is c.queue]
        d["deliveries"] = []
        d["publishes"] = []
        return d

    def _consumers(self, user, vhosts):
        """Consumers on ``vhosts`` whose connection the user sees (``filter_conn_ch_list``)."""
        seesAll = self._isMonitor(user)
        return [
            fmt.consumerDict(q, c) for vh in vhosts for _, q in sorted(vh.queues.items()) for c in q.consumers
            if seesAll or self._owns(user, c.session.connection)
        ]

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

    # --- health, definitions ---------------------------------------------------

    @app.route("/api/healthchecks/node", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthcheck(self, request, user):
        """
        ``GET /api/healthchecks/node``: ``{"status":"ok"}``, or 503
        ``{"status":"failed","reason":"resource alarm(s) in effect:[...]"}``
        while any alarm is in effect (RabbitMQ 3.10's text, one
        ``{resource_limit,disk|memory,Node}`` per alarm; the store's as
        ``{message_store_unavailable,Node}`` followed by why).
        """
        return self._nodeHealth()

    def _nodeHealth(self):
        alarms = self.broker.alarms
        if not alarms.active:
            return {"status": "ok"}
        node = alarms.nodeName
        terms = ["{resource_limit,%s,%s}" % (r, node) for r in sorted(alarms.active) if r != "store"]
        if "store" in alarms.active:
            terms.append("{message_store_unavailable,%s}" % (node,))
        reason = "resource alarm(s) in effect:[%s]" % (",".join(terms),)
        if "store" in alarms.active:
            reason += "; message store unavailable: %s" % (alarms.active["store"],)
        return Response(503, {"status": "failed", "reason": reason})

    def _alarmsHealth(self, where):
        alarms = self.broker.alarms.describe()
        if not alarms:
            return {"status": "ok"}
        return Response(503, {"status": "failed", "reason": "There are alarms in effect " + where,
                              "alarms": alarms})

    @app.route("/api/health/checks/alarms", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthAlarms(self, request, user):
        """
        ``GET /api/health/checks/alarms``: ``{"status":"ok"}``, or 503 with
        ``{"status":"failed","reason":"There are alarms in effect in the
        cluster","alarms":[{"node","resource"}]}`` as RabbitMQ 3.10
        (resources ``"disk space"``, ``"memory"``; ours ``"message store"``
        with a ``"reason"`` while the store cannot write).
        """
        return self._alarmsHealth("in the cluster")

    @app.route("/api/health/checks/local-alarms", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthLocalAlarms(self, request, user):
        """``GET /api/health/checks/local-alarms``: as ``alarms``, "...in effect on the node"."""
        return self._alarmsHealth("on the node")

    @app.route("/api/healthchecks/node/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthcheckSlash(self, request, user):
        """``GET /api/healthchecks/node/``: as without the slash."""
        return self._nodeHealth()

    @app.route("/api/healthchecks/node/<node>", methods=["GET", "OPTIONS"])
    @app.route("/api/healthchecks/node/<node>/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthcheckNode(self, request, user, node):
        """``GET /api/healthchecks/node/{node}``: as ``/api/healthchecks/node`` for this node, else 404."""
        if node != self.broker.alarms.nodeName:
            raise notFound()
        return self._nodeHealth()

    @app.route("/api/health/checks/alarms/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthAlarmsSlash(self, request, user):
        """``GET /api/health/checks/alarms/``: as without the slash."""
        return self._alarmsHealth("in the cluster")

    @app.route("/api/health/checks/local-alarms/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthLocalAlarmsSlash(self, request, user):
        """``GET /api/health/checks/local-alarms/``: as without the slash."""
        return self._alarmsHealth("on the node")

    @staticmethod
    def _healthFailed(body):
        """503 with ``{"status":"failed", ...body}``."""
        return Response(503, dict({"status": "failed"}, **body))

    @app.route("/api/health/checks/certificate-expiration/<within>/<unit>", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/certificate-expiration/<within>/<unit>/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthCertificates(self, request, user, within, unit):
        """
        ``GET /api/health/checks/certificate-expiration/{within}/{unit}``
        (unit ``days``, ``weeks``, ``months``, ``years``): 200
        ``{"status":"ok"}``, or 503 ``{"status":"failed","reason":
        "Certificates expiring","expired":[{"node","protocol","interface",
        "port","certfile","cacertfile","certfile_expires_on":
        ["2027-01-05 3:04:05"],"cacertfile_expires_on":[]}]}`` for the TLS
        listeners whose certificate or CA file has a certificate expiring
        within that time (by the app's clock); 400 ``Invalid expiration
        value.`` / ``Time unit not recognised. Supported units: days,
        weeks, months, years.``.  Reads the PEM files on each request.
        """
        from otter_tx.web.health import expiringIn, parseWithin

        try:
            seconds = parseWithin(within, unit)
        except ValueError as e:
            raise badRequest(str(e))
        now = self.clock.seconds()
        expired = []
        for listener in self.listeners:
            cert = expiringIn(listener.get("certfile"), now, now + seconds)
            ca = expiringIn(listener.get("cacertfile"), now, now + seconds)
            if cert or ca:
                expired.append({
                    "node": self.broker.alarms.nodeName, "protocol": listener["protocol"],
                    "interface": listener["ip_address"], "port": listener["port"],
                    "certfile": listener.get("certfile"), "cacertfile": listener.get("cacertfile"),
                    "certfile_expires_on": cert, "cacertfile_expires_on": ca,
                })
        if expired:
            return self._healthFailed({"reason": "Certificates expiring", "expired": expired})
        return {"status": "ok"}

    @app.route("/api/health/checks/port-listener/<port>", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/port-listener/<port>/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthPort(self, request, user, port):
        """
        ``GET /api/health/checks/port-listener/{port}``: 200
        ``{"status":"ok","port":N}`` when a listener of this node is bound
        to it, else 503 ``{"status":"failed","reason":"No active
        listener","missing":N,"ports":[...]}``; 400 ``Invalid port``.
        """
        if not re.match(r"^[+-]?[0-9]+$", port):
            raise badRequest("Invalid port")
        number = int(port)
        ports = sorted(listener["port"] for listener in self.listeners)
        if number in ports:
            return {"status": "ok", "port": number}
        return self._healthFailed({"reason": "No active listener", "missing": number, "ports": ports})

    @app.route("/api/health/checks/protocol-listener/<protocol>", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/protocol-listener/<protocol>/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthProtocol(self, request, user, protocol):
        """
        ``GET /api/health/checks/protocol-listener/{protocol}``: 200
        ``{"status":"ok","protocol":"amqp"}`` when this node listens for it
        (RabbitMQ's aliases: ``amqp091``, ``amqp0-9-1``... are ``amqp``,
        ``amqps`` is ``amqp/ssl``, ``management`` is ``http``), else 503
        ``{"status":"failed","reason":"No active listener","missing":
        "amqp/ssl","protocols":["amqp","http"]}``.
        """
        from otter_tx.web.health import normalizeProtocol

        name = normalizeProtocol(protocol)
        protocols = [listener["protocol"] for listener in self.listeners]
        if name in protocols:
            return {"status": "ok", "protocol": name}
        return self._healthFailed({"reason": "No active listener", "missing": name, "protocols": protocols})

    @app.route("/api/health/checks/virtual-hosts", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/virtual-hosts/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthVHosts(self, request, user):
        """``GET /api/health/checks/virtual-hosts``: 200 ``{"status":"ok"}`` (every vhost runs in the one process)."""
        return {"status": "ok"}

    @app.route("/api/health/checks/node-is-mirror-sync-critical", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/node-is-mirror-sync-critical/", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/node-is-quorum-critical", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/node-is-quorum-critical/", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthCritical(self, request, user):
        """
        ``GET /api/health/checks/node-is-mirror-sync-critical`` and
        ``.../node-is-quorum-critical``: 200 ``{"status":"ok","reason":
        "single node cluster"}``, as RabbitMQ 3.10 answers on one node.
        """
        return {"status": "ok", "reason": "single node cluster"}

    # --- nodes ----------------------------------------------------------------

    #: the RabbitMQ plugins whose function is built in and on (``enabled_plugins``)
    ENABLED_PLUGINS = ("rabbitmq_delayed_message_exchange", "rabbitmq_management", "rabbitmq_prometheus")

    def _nodeDict(self, request=None):
        """
        This node as :func:`otter_tx.web.nodes.nodeDict` builds it, with
        ``memory`` / ``binary`` when the query asks (``?memory=true``,
        ``?binary=true``).
        """
        contexts = [{k: v for k, v in c.items() if k not in ("node", "ssl_opts")} for c in self._contexts()]
        return nodeDict(
            self.broker, self.clock, int((self.clock.seconds() - self.startedAt) * 1000), contexts,
            [{"name": n, "description": d, "enabled": True} for n, d in _EXCHANGE_TYPE_DESCRIPTIONS],
            dataDir=self.dataDir, configFiles=self.configFiles, logFiles=self.logFiles,
            enabledPlugins=self.ENABLED_PLUGINS,
            memory=request is not None and _queryFlag(request, "memory"),
            binary=request is not None and _queryFlag(request, "binary"),
        )

    def _thisNode(self, name):
        """404 unless ``name`` is this node's name (RabbitMQ 3.10 answers 500 for an unknown node)."""
        if name != self.broker.alarms.nodeName:
            raise notFound()

    @app.route("/api/nodes", methods=["GET", "OPTIONS"])
    @endpoint(_MONITOR)
    def nodes(self, request, user):
        """
        ``GET /api/nodes``: ``[node]``, this node with RabbitMQ 3.10's keys
        (:func:`otter_tx.web.nodes.nodeDict`): ``mem_used`` (RSS, bytes),
        ``mem_limit`` (the high watermark, bytes), ``mem_alarm``,
        ``disk_free`` (bytes free on the data directory's filesystem at the
        last check), ``disk_free_limit``, ``disk_free_alarm``, ``fd_used`` /
        ``fd_total``, ``uptime`` (ms), ...; ``?memory=true`` and
        ``?binary=true`` add the breakdowns.  401 "Not monitor user" below
        the ``monitoring`` tag.
        """
        return [self._nodeDict(request)]

    @app.route("/api/nodes/<name>", methods=["GET", "OPTIONS"])
    @endpoint(_MONITOR)
    def node(self, request, user, name):
        """``GET /api/nodes/{name}``: this node as in ``/api/nodes``; 404 for another name."""
        self._thisNode(name)
        return self._nodeDict(request)

    @app.route("/api/nodes/<name>/memory", methods=["GET", "OPTIONS"])
    @endpoint(_MONITOR)
    def nodeMemory(self, request, user, name):
        """
        ``GET /api/nodes/{name}/memory``: ``{"memory": breakdown}`` (bytes,
        :func:`otter_tx.web.nodes.memoryBreakdown`); 404 for another name.
        """
        self._thisNode(name)
        return {"memory": memoryBreakdown(self.broker, memUsed(self.broker))}

    @app.route("/api/nodes/<name>/memory/relative", methods=["GET", "OPTIONS"])
    @endpoint(_MONITOR)
    def nodeMemoryRelative(self, request, user, name):
        """
        ``GET /api/nodes/{name}/memory/relative``: ``{"memory": {"total":
        100, key: percent}}`` (whole percentages of RSS); 404 for another name.
        """
        self._thisNode(name)
        return {"memory": relativeMemory(memoryBreakdown(self.broker, memUsed(self.broker)))}

    # --- aliveness, definitions --------------------------------------------------

    @app.route("/api/aliveness-test/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(_VHOST)
    def aliveness(self, request, user, vhost):
        """
        ``GET /api/aliveness-test/{vhost}``: declares queue
        ``aliveness-test``, publishes ``test_message`` to it and gets it
        back, as RabbitMQ 3.10 does; ``{"status":"ok"}``.  Runs with the
        user's permissions (configure and read on ``aliveness-test``, write
        on ``amq.default``): 401 with the full ``ACCESS_REFUSED`` text.
        """
        vh = self._vhost(vhost)
        session = self._session(user, vh)
        try:
            session.access.checkAll([
                (CONFIGURE, "queue", "aliveness-test"), (WRITE, "exchange", ""), (READ, "queue", "aliveness-test"),
            ])
        except AMQPError as e:
            raise channelRefusal(e)
        session.declareQueue("aliveness-test")
        routed, _ = session.publish(session.publishTarget(""), "aliveness-test", False, b"\x00\x00",
                                    b"test_message", props={})
        got = session.get("aliveness-test")
        if got is not None:
            session.ack(got[0])
        if not routed or got is None:
            return Response(503, {"status": "failed", "reason": "aliveness test failed"})
        return {"status": "ok"}

    @app.route("/api/definitions", methods=["GET", "POST", "OPTIONS"])
    @endpoint(_ADMIN)
    def definitions(self, request, user):
        """
        ``GET /api/definitions``: the export in RabbitMQ 3.10's format
        (``?download=NAME`` as an attachment): non-exclusive queues,
        exchanges except ``""`` and ``amq.*``, bindings whose source is not
        ``""`` and whose destination queue is exported; users with their
        ``password_hash``, ``hashing_algorithm`` and ``limits``, which
        RabbitMQ imports; ``vhost-limits`` parameters, global parameters
        with operator policies as parameters of component ``operator_policy``.
        ``POST``: import (:func:`~otter_tx.broker.definitions.importDefinitions`),
        a JSON body or the ``file`` field of a ``multipart/form-data`` upload
        (RabbitMQ's UI, rabbitmqadmin): 204; 400 ``failed_to_parse_json``;
        400 ``bad_request`` naming every item not imported (the others are
        applied, as RabbitMQ 3.10 does).
        """
        if request.method == b"POST":
            return self._importDefinitions(request, None)
        return self._exportDefinitions(request, None)

    @app.route("/api/definitions/<vhost>", methods=["GET", "POST", "OPTIONS"])
    @endpoint(_ADMIN)
    def definitionsVHost(self, request, user, vhost):
        """
        ``GET /api/definitions/{vhost}``: the per-vhost export
        (``rabbit_version``, ``parameters``, ``policies``, ``queues``,
        ``exchanges``, ``bindings``, without ``vhost`` fields); ``POST``
        imports that form into ``vhost`` as ``POST /api/definitions``.  404
        ``vhost_not_found`` for a missing vhost (RabbitMQ 3.10's answer).
        """
        if vhost not in self.broker.vhosts:
            raise HTTPError(404, "not_found", "vhost_not_found")
        if request.method == b"POST":
            return self._importDefinitions(request, vhost)
        return self._exportDefinitions(request, vhost)

    def _importDefinitions(self, request, vhost):
        """The import behind both POST routes: 204, or 400 with the items not imported."""
        from otter_tx.broker.definitions import DefinitionsError, importDefinitions

        ctype = (request.getHeader(b"content-type") or b"").lower()
        if ctype.startswith(b"multipart/form-data"):
            raw = (request.args.get(b"file") or [b""])[0]
        else:
            raw = request.content.read() if request.content is not None else b""
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise badRequest("failed_to_parse_json")
        try:
            problems = importDefinitions(self.broker, doc, vhost)
        except DefinitionsError as e:
            raise badRequest(str(e))
        if problems:
            raise badRequest("; ".join(problems))
        return Response(204)

    def _exportDefinitions(self, request, vhost):
        """
        The export document: the whole broker (``vhost`` None) or one
        vhost's objects in the per-vhost form (no ``vhost`` fields);
        ``?download=NAME`` sets ``Content-Disposition: attachment``.
        """
        download = _query(request, "download")
        if download:
            request.setHeader(
                b"content-disposition", ('attachment; filename="%s"' % (download,)).encode("utf-8")
            )
        b = self.broker
        if vhost is None:
            out = {
                "rabbit_version": RABBITMQ_COMPAT_VERSION,
                "rabbitmq_version": RABBITMQ_COMPAT_VERSION,
                "product_name": "otter_tx",
                "product_version": __version__,
                "users": [fmt.userDict(u, b.userLimits.get(u.name)) for _, u in sorted(b.users.items())],
                "vhosts": [{"name": n} for n in sorted(b.vhosts)],
                "permissions": self._permissionList(),
                "topic_permissions": [],
                "parameters": self._parameters([vh for _, vh in sorted(b.vhosts.items())]),
                "global_parameters": [{"name": n, "value": b.globalParameters[n]}
                                      for n in sorted(b.globalParameters)],
            }
            vhosts = sorted(b.vhosts.items())
        else:
            out = {"rabbit_version": RABBITMQ_COMPAT_VERSION, "parameters": self._parameters([b.vhosts[vhost]])}
            vhosts = [(vhost, b.vhosts[vhost])]
        # operator policies are runtime parameters of component operator_policy
        # in RabbitMQ 3.10's export (checked on the peer), not a key of their own
        out["parameters"].extend(
            {"value": {k: v for k, v in d.items() if k not in ("vhost", "name")}, "vhost": d["vhost"],
             "component": "operator_policy", "name": d["name"]}
            for d in self._policies([vh for _, vh in vhosts], operator=True)
        )
        out.update({"policies": self._policies([vh for _, vh in vhosts]), "queues": [], "exchanges": [],
                    "bindings": []})
        for vname, vh in vhosts:
            exported = set()
            for qname, q in sorted(vh.queues.items()):
                if q.exclusive:
                    continue
                exported.add(qname)
                out["queues"].append({
                    "name": qname, "vhost": vname, "durable": q.durable,
                    "auto_delete": q.autoDelete, "arguments": fmt.jsonable(q.arguments),
                })
            for xname, ex in sorted(vh.exchanges.items()):
                if xname == "" or xname.startswith("amq."):
                    continue
                out["exchanges"].append({
                    "name": xname, "vhost": vname, "type": ex.type, "durable": ex.durable,
                    "auto_delete": ex.autoDelete, "internal": ex.internal,
                    "arguments": fmt.jsonable(ex.arguments),
                })
            for bd in fmt.vhostBindings(vh, includeDefault=False):
                if bd["destination_type"] == "queue" and bd["destination"] not in exported:
                    continue
                bd = dict(bd)
                del bd["properties_key"]
                out["bindings"].append(bd)
        if vhost is not None:
            for key in ("queues", "exchanges", "bindings"):
                for item in out[key]:
                    del item["vhost"]
        return out

    # --- Prometheus and the HTML page --------------------------------------------

    @app.route("/metrics", methods=["GET"])
    @endpoint(_NONE)
    def metrics(self, request, user):
        """
        ``GET /metrics``: Prometheus text format (version 0.0.4) with
        rabbitmq_prometheus names; unauthenticated like RabbitMQ's port
        15692.  The same text as the Prometheus listener's (``--prometheus``);
        see :mod:`otter_tx.web.metrics`.
        """
        from otter_tx.web.metrics import CONTENT_TYPE, renderMetrics

        request.setHeader(b"content-type", CONTENT_TYPE)
        perObject = _queryFlag(request, "per_object")
        return renderMetrics(self.broker, self.clock.seconds() - self.startedAt, perObject)

    @app.route("/metrics/per-object", methods=["GET"])
    @endpoint(_NONE)
    def metricsPerObject(self, request, user):
        """``GET /metrics/per-object``: the queue and connection metrics with labels."""
        from otter_tx.web.metrics import CONTENT_TYPE, renderMetrics

        request.setHeader(b"content-type", CONTENT_TYPE)
        return renderMetrics(self.broker, self.clock.seconds() - self.startedAt, True)

    @app.route("/", methods=["GET"])
    @endpoint(_NONE)
    def index(self, request, user):
        """
        ``GET /``: the admin web app's page (:mod:`otter_tx.web.webapp`); it
        asks for credentials itself and uses the JSON API with them.
        """
        from otter_tx.web.webapp import CONTENT_SECURITY_POLICY, serveFile

        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"content-security-policy", CONTENT_SECURITY_POLICY)
        return serveFile(request, "index.html")

    @app.route("/static/<path:path>", methods=["GET"])
    @endpoint(_NONE)
    def staticFile(self, request, user, path):
        """``GET /static/{path}``: the app's files with their content types; 404 for anything else."""
        from otter_tx.web.webapp import serveFile

        body = serveFile(request, path)
        if body is None:
            raise notFound()
        return body
