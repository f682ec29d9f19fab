"""
The management app's HTTP plumbing, shared by every room: RabbitMQ's error
bodies and the AMQP-to-HTTP error mapping, responses, JSON bodies and
query arguments, and the list parameters (sorting, pagination, columns,
``disable_stats``).

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

Sources: ``rabbit_mgmt_util.erl`` (RabbitMQ 3.10.8) and the reference peer
(../shared/reference/rabbitmq-semantics.md section 8).
"""

import json
import re

from otter_tx.broker.delayed import DELAYED_TYPE, pageParameters

#: the RabbitMQ version whose API this app reproduces (reported as
#: ``rabbitmq_version``; ``product_name`` / ``product_version`` say otter_tx)
RABBITMQ_COMPAT_VERSION = "3.10.8"

#: the exchange types the overview and ``/api/nodes`` list: ``(name, description)``
EXCHANGE_TYPE_DESCRIPTIONS = (
    ("direct", "AMQP direct exchange, as per the AMQP specification"),
    ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
    ("headers", "AMQP headers exchange, as per the AMQP specification"),
    ("topic", "AMQP topic exchange, as per the AMQP specification"),
    (DELAYED_TYPE, "Delayed Message Exchange."),
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


def jsonFlag(value, default=False):
    """A JSON boolean (or ``"true"``/``"false"``) as bool."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def queryFlag(request, name):
    """Whether query argument ``name`` (str) is ``true`` (any case)."""
    return request.args.get(name.encode(), [b""])[0].lower() == b"true"


def queryArg(request, name, default=None):
    """Query argument ``name`` (str) as text (its first value), or ``default``."""
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
    paginated wrapper object; ``name`` matches ignoring case, as
    RabbitMQ's) and ``columns`` (dotted paths allowed).
    An empty ``sort=`` is accepted and ignored.
    """
    sort = queryArg(request, "sort")
    if sort:
        items = sorted(items, key=lambda i: _sortKey(_dotted(i, sort)))
    if queryFlag(request, "sort_reverse"):
        items = list(reversed(items))
    columns = queryArg(request, "columns")
    page = queryArg(request, "page")
    if page is not None:
        try:
            pageN, sizeN = pageParameters(page, queryArg(request, "page_size"))
        except ValueError as e:
            raise HTTPError(400, "invalid_pagination_parameters", str(e))
        total = len(items)
        name = queryArg(request, "name")
        if name:
            if queryFlag(request, "use_regex"):
                try:
                    rx = re.compile(name, re.IGNORECASE)
                except re.error:
                    raise badRequest("invalid regex")
                items = [i for i in items if rx.search(str(i.get("name", "")))]
            else:
                name = name.casefold()
                items = [i for i in items if name in str(i.get("name", "")).casefold()]
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


#: the 400 reason for a body over a cap (RabbitMQ 3.12+'s text)
TOO_LARGE_REASON = "Exceeded HTTP request body size limit"

#: bytes of JSON a request body other than a publish's (and a definitions import's,
#: parsed on its own) may hold: a declare, a policy or a ``/get`` is a few hundred
#: bytes; parsing 20 MiB (the body cap) of ``[{}, ...]`` costs about 540 MiB and a
#: 0.4 s stall, so a body beyond this is refused unparsed (400, as the body cap)
MAX_JSON_BODY = 1 << 20


def jsonBody(request, limit=MAX_JSON_BODY):
    """
    The JSON request body as a dict (``{}`` when empty); 400 ``not_json``
    when it is not a JSON object (or nests too deep to parse); 400
    ``Exceeded HTTP request body size limit`` before parsing when it holds
    more than ``limit`` bytes (int; None: only the listener's body cap).
    """
    raw = request.content.read() if request.content is not None else b""
    if limit is not None and len(raw) > limit:
        raise badRequest(TOO_LARGE_REASON)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep to parse
        raise badRequest("not_json")
    if not isinstance(body, dict):
        raise badRequest("not_json")
    return body


def requireKeys(body, *keys):
    """400 ``[{key_missing,K}]`` for the first of ``keys`` not in ``body`` (dict)."""
    for k in keys:
        if k not in body:
            raise badRequest("[{key_missing,%s}]" % (k,))


def render(request, result):
    """
    Write a handler's ``result`` to ``request``: bytes as they are, a
    :class:`Response` with its code and headers, a list through
    :func:`listQuery`, anything else as JSON (``?disable_stats=true``
    through :func:`withoutStats`).  Returns the body (bytes).
    """
    if isinstance(result, bytes):
        return result
    if isinstance(result, Response):
        return _writeJSON(request, result.code, result.headers, result.body)
    if isinstance(result, list):
        try:
            result = listQuery(request, result)
        except HTTPError as e:
            return renderError(request, e)
    if queryFlag(request, "disable_stats"):
        result = withoutStats(result)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-cache")
    return json.dumps(result).encode()


def renderError(request, e):
    """Write :class:`HTTPError` ``e`` to ``request``: its code, headers and RabbitMQ's JSON body (or none)."""
    return _writeJSON(request, e.code, e.headers, None if e.reason is None else {"error": e.error, "reason": e.reason})


def _writeJSON(request, code, headers, body):
    """
    Set status ``code`` (int) and ``headers`` (``[(bytes, bytes)]``) on
    ``request``; return ``body`` as JSON (bytes, with its content type), or
    ``b""`` and no content type when ``body`` is None.
    """
    request.setResponseCode(code)
    for k, v in headers:
        request.setHeader(k, v)
    if body is None:
        request.defaultContentType = None
        return b""
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(body).encode()
