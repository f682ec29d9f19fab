"""
A small etcd v3 client for Twisted, over treq and etcd's JSON gateway.

Why our own: no maintained Twisted etcd client exists (txaioetcd speaks the ``v3alpha`` API that etcd
3.4 no longer serves), and the gateway needs only HTTP/1.1 POSTs of JSON, which treq does well. The
shape follows LavinMQ's ``src/lavinmq/etcd.cr``.

Source for every request and response shape: etcd's API reference
(https://etcd.io/docs/v3.4/dev-guide/api_reference_v3/) and its gateway page
(https://etcd.io/docs/v3.4/dev-guide/api_grpc_gateway/). On the wire, keys and values are base64
strings and int64 fields (revisions, versions, lease ids, TTLs) are decimal strings; fields equal to
their zero value are left out of responses. This module takes and returns ``bytes`` keys and values
(a ``str`` argument is encoded as UTF-8) and ``int`` numbers.

Used endpoints: ``/v3/kv/range``, ``/v3/kv/put``, ``/v3/kv/deleterange``, ``/v3/kv/txn``,
``/v3/kv/compaction``, ``/v3/lease/grant``, ``/v3/lease/keepalive``, ``/v3/lease/revoke``,
``/v3/watch`` (a streaming POST: one JSON object per line) and ``/v3/maintenance/status``.

Errors: :class:`EtcdError` carries the gateway's ``message`` and gRPC ``code``;
:class:`EtcdUnavailable` (a subclass) means no endpoint answered; :class:`EtcdTimeout` (a subclass of
that) means a write was sent but its answer did not arrive in time, so it may or may not have been
applied. Reads are retried on the next endpoint after a timeout or a lost connection; writes only
when the request never left (connection refused). Requests share a pool of keep-alive connections,
so a write that races a member's death (sent on its pooled connection in the same reactor turn as
the kill) fails as :class:`EtcdTimeout` although the member never read it.

Times are in seconds everywhere (request timeouts, lease TTLs, backoff).
"""

import base64
import json
from collections import namedtuple

import treq
from treq.client import HTTPClient
from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.error import ConnectError
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.web.client import Agent, HTTPConnectionPool, RequestTransmissionFailed, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

_log = Logger()

#: gRPC status codes the gateway returns in ``code`` (https://grpc.github.io/grpc/core/md_doc_statuscodes.html)
NOT_FOUND = 5
UNAVAILABLE = 14

#: a key-value pair of a range (get/getPrefix/txn) answer: key and value bytes, modRevision and version ints
KeyValue = namedtuple("KeyValue", "key value modRevision version")

#: one key read by :meth:`EtcdClient.get`: value bytes, modRevision and version ints
Value = namedtuple("Value", "value modRevision version")

#: a watch event: type ``"PUT"`` or ``"DELETE"``, key and value bytes (``b""`` for a delete), and the
#: revision of the change (for a delete, the revision that deleted the key)
Event = namedtuple("Event", "type key value modRevision")

#: one decoded response of a transaction: kind ``"range"``, ``"put"`` or ``"delete"``; ``kvs`` the list
#: of :class:`KeyValue` of a range (else ``[]``); ``deleted`` the number of keys a delete removed (else 0)
OpResponse = namedtuple("OpResponse", "kind kvs deleted")

#: one decoded message of a watch stream: ``created`` and ``canceled`` flags, ``compactRevision`` (int,
#: 0 when absent), ``revision`` (the header's store revision), ``events`` (list of :class:`Event`),
#: ``cancelReason`` (str) and ``error`` (the message of a gateway error object, else ``None``)
WatchMessage = namedtuple("WatchMessage", "created canceled compactRevision revision events cancelReason error")


class EtcdError(Exception):
    """
    etcd (or its gateway) answered with an error.

    :ivar message: the gateway's ``message`` (str)
    :ivar code: the gRPC status code (int; 5 NOT_FOUND for an unknown lease, 3 INVALID_ARGUMENT,
        9 FAILED_PRECONDITION, 11 OUT_OF_RANGE for a compacted revision, 14 UNAVAILABLE), or ``None``
    :ivar status: the HTTP status (int) or ``None``
    """

    def __init__(self, message, code=None, status=None):
        Exception.__init__(self, message, code, status)
        self.message = message
        self.code = code
        self.status = status

    def __str__(self):
        return "%s (code %s)" % (self.message, self.code)


class EtcdUnavailable(EtcdError):
    """
    No endpoint answered: every one refused, timed out or dropped the connection.

    :ivar failures: list of ``(endpoint, exception)``, one per endpoint tried
    """

    def __init__(self, message, failures=()):
        EtcdError.__init__(self, message, UNAVAILABLE)
        self.failures = list(failures)


class EtcdTimeout(EtcdUnavailable):
    """
    A write was sent but no answer came in time (or the connection dropped after sending): it may or
    may not have been applied. Read the key back before acting on it.
    """


def _bytes(s):
    """A key, value or prefix as bytes (str encoded as UTF-8)."""
    if isinstance(s, str):
        return s.encode("utf-8")
    return bytes(s)


def encodeBytes(b):
    """bytes (or str) -> the gateway's base64 str."""
    return base64.b64encode(_bytes(b)).decode("ascii")


def decodeBytes(s):
    """The gateway's base64 str (or ``None``/absent) -> bytes."""
    if not s:
        return b""
    return base64.b64decode(s)


def prefixRangeEnd(prefix):
    """
    The ``range_end`` that makes a range cover every key starting with ``prefix`` (bytes -> bytes):
    the prefix with its last byte below 0xff incremented and what follows dropped; ``b"\\0"`` (every
    key) for an empty or all-0xff prefix, as etcd's ``clientv3.GetPrefixRangeEnd``.
    """
    p = bytearray(_bytes(prefix))
    for i in range(len(p) - 1, -1, -1):
        if p[i] < 0xFF:
            p[i] += 1
            return bytes(p[: i + 1])
    return b"\0"


def _int(d, name):
    """An int64 field of a gateway object (a decimal string, absent when zero) as int."""
    v = d.get(name)
    return int(v) if v else 0


def decodeKeyValue(kv):
    """A gateway ``mvccpbKeyValue`` dict -> :class:`KeyValue`."""
    return KeyValue(decodeBytes(kv.get("key")), decodeBytes(kv.get("value")),
                    _int(kv, "mod_revision"), _int(kv, "version"))


def headerRevision(obj):
    """The store revision (int) of a response's ``header``."""
    return _int(obj.get("header") or {}, "revision")


def _range(key, prefix):
    body = {"key": encodeBytes(key)}
    if prefix:
        body["range_end"] = encodeBytes(prefixRangeEnd(key))
    return body


_OPS = {"=": "EQUAL", "==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}


class Compare:
    """
    One condition of a transaction (``etcdserverpbCompare``). Build them with the class methods;
    ``op`` is one of ``"="``, ``"!="``, ``"<"``, ``">"``. The JSON is in ``.json``.
    """

    def __init__(self, key, target, op, field, value):
        if op not in _OPS:
            raise ValueError("compare operator must be one of =, !=, <, >: %r" % (op,))
        self.json = {"key": encodeBytes(key), "target": target, "result": _OPS[op], field: value}

    @classmethod
    def version(cls, key, op, version, prefix=False):
        """
        Compare the key's version (int; 0 when the key does not exist); with
        ``prefix``, of every key starting with ``key`` (``version(p, "=", 0,
        prefix=True)``: no key under ``p``; etcd 3.3+).
        """
        c = cls(key, "VERSION", op, "version", str(int(version)))
        if prefix:
            c.json["range_end"] = encodeBytes(prefixRangeEnd(key))
        return c

    @classmethod
    def createRevision(cls, key, op, revision):
        """Compare the revision that created the key (int; 0 when the key does not exist)."""
        return cls(key, "CREATE", op, "create_revision", str(int(revision)))

    @classmethod
    def modRevision(cls, key, op, revision):
        """Compare the revision of the key's last change (int; 0 when the key does not exist)."""
        return cls(key, "MOD", op, "mod_revision", str(int(revision)))

    @classmethod
    def value(cls, key, op, value):
        """Compare the key's value (bytes or str)."""
        return cls(key, "VALUE", op, "value", encodeBytes(value))

    @classmethod
    def lease(cls, key, op, leaseId):
        """Compare the lease the key is attached to (int; 0 for none)."""
        return cls(key, "LEASE", op, "lease", str(int(leaseId)))


class Op:
    """
    One request of a transaction branch (``etcdserverpbRequestOp``), built with the static methods.
    The JSON is in ``.json``.
    """

    def __init__(self, json):
        self.json = json

    @staticmethod
    def put(key, value, lease=None):
        """Put ``value`` (bytes or str) at ``key``, attached to lease id ``lease`` (int) if given."""
        body = {"key": encodeBytes(key), "value": encodeBytes(value)}
        if lease:
            body["lease"] = str(int(lease))
        return Op({"request_put": body})

    @staticmethod
    def delete(key, prefix=False):
        """Delete ``key`` (or every key starting with it when ``prefix``)."""
        return Op({"request_delete_range": _range(key, prefix)})

    @staticmethod
    def get(key, prefix=False):
        """Read ``key`` (or every key starting with it when ``prefix``)."""
        return Op({"request_range": _range(key, prefix)})


def decodeTxn(obj):
    """A ``/v3/kv/txn`` answer -> ``(succeeded bool, [OpResponse], revision int)``."""
    out = []
    for r in obj.get("responses") or ():
        if "response_range" in r:
            kvs = [decodeKeyValue(kv) for kv in r["response_range"].get("kvs") or ()]
            out.append(OpResponse("range", kvs, 0))
        elif "response_put" in r:
            out.append(OpResponse("put", [], 0))
        elif "response_delete_range" in r:
            out.append(OpResponse("delete", [], _int(r["response_delete_range"], "deleted")))
        else:
            out.append(OpResponse("unknown", [], 0))
    return bool(obj.get("succeeded")), out, headerRevision(obj)


def decodeEvent(ev):
    """A gateway ``mvccpbEvent`` dict -> :class:`Event` (``type`` absent means PUT)."""
    kv = ev.get("kv") or {}
    kind = ev.get("type") or "PUT"
    return Event(kind, decodeBytes(kv.get("key")), decodeBytes(kv.get("value")), _int(kv, "mod_revision"))


def decodeWatchMessage(obj):
    """One JSON object of the watch stream -> :class:`WatchMessage`."""
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return WatchMessage(False, False, 0, 0, [], "", msg or "watch error")
    r = obj.get("result") or obj
    return WatchMessage(
        bool(r.get("created")), bool(r.get("canceled")), _int(r, "compact_revision"), headerRevision(r),
        [decodeEvent(e) for e in r.get("events") or ()], r.get("cancel_reason") or "", None)


def decodeResponse(status, body):
    """
    An HTTP status (int) and body (bytes) of the gateway -> the JSON object (dict), or raise
    :class:`EtcdError` for an error answer (a ``code``/``message`` body or a non-200 status).
    """
    try:
        obj = json.loads(body) if body else {}
    except ValueError:
        raise EtcdError(body[:200].decode("utf-8", "replace").strip() or "HTTP %d" % (status,), None, status)
    if isinstance(obj, dict) and "error" in obj and isinstance(obj["error"], dict):
        obj = obj["error"]  # the shape of an error in a streaming endpoint
    if isinstance(obj, dict) and obj.get("code") and ("message" in obj or "error" in obj):
        raise EtcdError(obj.get("message") or obj.get("error"), obj.get("code"), status)
    if status != 200:
        raise EtcdError("HTTP %d" % (status,), None, status)
    return obj


class WatchStreamParser:
    """
    Splits the watch stream's bytes into JSON objects: the gateway writes one object per line.
    ``feed(data)`` takes any slice of the stream and returns the complete objects (list of dict)
    it finishes; partial lines wait for the rest. Buffers a list of chunks, joined once a line ends.
    """

    def __init__(self):
        self._pending = []

    def feed(self, data):
        out = []
        while data:
            i = data.find(b"\n")
            if i < 0:
                self._pending.append(data)
                break
            self._pending.append(data[:i])
            line = b"".join(self._pending).strip()
            self._pending = []
            data = data[i + 1:]
            if line:
                out.append(json.loads(line))
        return out


class EtcdClient:
    """
    An etcd v3 client over its JSON gateway.

    :param endpoints: list of ``"http://host:port"`` client URLs of the cluster's members. Requests go to
        the one that last worked and fail over to the next on connection errors.
    :param reactor: provides ``IReactorTCP`` and ``IReactorTime`` (default: the global reactor)
    :param timeout: seconds for each request on one endpoint (connect included)

    Every method returns a Deferred. Call :meth:`close` when done (it closes pooled connections).
    Requests in flight at once travel on separate pooled connections and may be applied in any order:
    wait for one before sending the next, or put them in one :meth:`txn`, when order matters.
    """

    def __init__(self, endpoints, reactor=None, timeout=5.0):
        if reactor is None:
            from twisted.internet import reactor
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        if not self.endpoints:
            raise ValueError("no etcd endpoint")
        self.timeout = timeout
        self._reactor = reactor
        self._current = 0
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = 16
        endpoints = _EndpointCache(reactor, timeout)
        self._agent = Agent.usingEndpointFactory(reactor, endpoints, pool=self._pool)
        # the watch's streaming POSTs: treq's unbuffered responses, on connections of their own
        self._streamPool = HTTPConnectionPool(reactor, persistent=False)
        self._stream = HTTPClient(Agent.usingEndpointFactory(reactor, endpoints, pool=self._streamPool))
        self._urls = {}
        self._watches = set()

    @property
    def endpoint(self):
        """The endpoint (str) requests go to first: the last one that answered."""
        return self.endpoints[self._current]

    # -- plumbing --------------------------------------------------------------------------------

    def _attempt(self, url, payload, timeout):
        """
        One POST of ``payload`` (bytes) to ``url`` (str): fires with ``(status int, body bytes)``, fails
        after ``timeout`` seconds (``defer.TimeoutError``) or with Twisted's HTTP client errors.
        """
        # Twisted's Agent (what treq wraps) with a bytes URL and cached endpoints: treq's URL parsing
        # (hyperlink, idna) and Agent's endpoint per request cost about 130 µs of CPU per request
        # (docs/cluster.md). Writes use the pooled connections too: a fresh connection per write would
        # let a refused connect prove that a write was never sent, but costs about 400 µs of CPU per
        # write; on a pooled connection to a member that died in this very reactor turn, a write fails
        # as EtcdTimeout (unclear).
        urlBytes = self._urls.get(url)
        if urlBytes is None:
            urlBytes = self._urls[url] = url.encode("ascii")
        d = self._agent.request(b"POST", urlBytes, Headers({b"Content-Type": [b"application/json"]}), _Body(payload))
        d.addCallback(lambda r: readBody(r).addCallback(lambda body: (r.code, body)))
        d.addTimeout(timeout, self._reactor)
        return d

    def _call(self, path, body, idempotent, timeout=None):
        return defer.Deferred.fromCoroutine(self._request(path, body, idempotent, timeout or self.timeout))

    async def _request(self, path, body, idempotent, timeout):
        payload = json.dumps(body).encode("utf-8")
        n = len(self.endpoints)
        failures = []
        start = self._current
        for i in range(n):
            idx = (start + i) % n
            endpoint = self.endpoints[idx]
            try:
                status, data = await self._attempt(endpoint + path, payload, timeout)
            except (ConnectError, RequestTransmissionFailed) as e:
                failures.append((endpoint, e))  # never sent: safe to send elsewhere
                continue
            except defer.CancelledError:
                raise
            except Exception as e:  # timeout, ResponseFailed, ResponseNeverReceived: maybe applied
                failures.append((endpoint, e))
                if idempotent:
                    continue
                raise EtcdTimeout("no answer from %s for %s within %ss: %s" % (endpoint, path, timeout, e),
                                  failures)
            obj = decodeResponse(status, data)  # raises EtcdError
            self._current = idx
            return obj
        raise EtcdUnavailable("no etcd endpoint answered %s: %s" % (
            path, "; ".join("%s: %s" % (ep, e.__class__.__name__) for ep, e in failures)), failures)

    # -- kv --------------------------------------------------------------------------------------

    def get(self, key, serializable=False):
        """
        Read one key. Fires with ``(value bytes, modRevision int, version int)`` (a :class:`Value`), or
        ``None`` when the key does not exist. A linearizable read by default (a round to the leader);
        ``serializable=True`` reads the answering member's copy, which may lag. (``/v3/kv/range``)
        """
        body = {"key": encodeBytes(key)}
        if serializable:
            body["serializable"] = True
        d = self._call("/v3/kv/range", body, True)

        def got(obj):
            kvs = obj.get("kvs")
            if not kvs:
                return None
            kv = decodeKeyValue(kvs[0])
            return Value(kv.value, kv.modRevision, kv.version)
        return d.addCallback(got)

    def getPrefix(self, prefix, serializable=False):
        """
        Read every key starting with ``prefix``, sorted by key. Fires with ``(kvs, revision)``: a list
        of :class:`KeyValue` ``(key, value, modRevision, version)`` and the store revision (int) the
        read saw (watch from ``revision + 1`` to follow on). ``serializable`` as for :meth:`get`: the
        answer is a consistent snapshot at ``revision`` either way. (``/v3/kv/range``)
        """
        body = _range(prefix, True)
        if serializable:
            body["serializable"] = True
        d = self._call("/v3/kv/range", body, True)
        return d.addCallback(lambda obj: ([decodeKeyValue(kv) for kv in obj.get("kvs") or ()], headerRevision(obj)))

    def put(self, key, value, lease=None):
        """
        Write ``value`` at ``key``, attached to lease id ``lease`` (int) when given (an unknown lease:
        :class:`EtcdError` code 5). Fires with the new store revision (int). (``/v3/kv/put``)
        """
        body = {"key": encodeBytes(key), "value": encodeBytes(value)}
        if lease:
            body["lease"] = str(int(lease))
        return self._call("/v3/kv/put", body, False).addCallback(headerRevision)

    def delete(self, key):
        """Delete one key. Fires with the number of keys deleted (0 or 1). (``/v3/kv/deleterange``)"""
        return self._call("/v3/kv/deleterange", _range(key, False), False).addCallback(_int, "deleted")

    def deletePrefix(self, prefix):
        """Delete every key starting with ``prefix``. Fires with the number deleted (int)."""
        return self._call("/v3/kv/deleterange", _range(prefix, True), False).addCallback(_int, "deleted")

    def txn(self, compares, success, failure=()):
        """
        An atomic transaction: if every :class:`Compare` in ``compares`` holds, run the :class:`Op`
        list ``success``, else ``failure``. Fires with ``(succeeded bool, [OpResponse], revision int)``,
        one :class:`OpResponse` per op of the branch that ran. (``/v3/kv/txn``)
        """
        body = {"compare": [c.json for c in compares], "success": [o.json for o in success],
                "failure": [o.json for o in failure]}
        return self._call("/v3/kv/txn", body, False).addCallback(decodeTxn)

    def compact(self, revision, physical=False):
        """
        Compact the key-value history up to ``revision`` (int): watches from before it are cancelled
        with ``compact_revision``. Fires with the store revision (int). (``/v3/kv/compaction``)
        """
        body = {"revision": str(int(revision)), "physical": bool(physical)}
        return self._call("/v3/kv/compaction", body, False).addCallback(headerRevision)

    # -- leases ----------------------------------------------------------------------------------

    def grantLease(self, ttl):
        """Grant a lease of ``ttl`` seconds (int). Fires with the lease id (int). (``/v3/lease/grant``)"""
        d = self._call("/v3/lease/grant", {"TTL": str(int(ttl))}, False)

        def granted(obj):
            if obj.get("error"):
                raise EtcdError(obj["error"])
            return _int(obj, "ID")
        return d.addCallback(granted)

    def keepAlive(self, leaseId, timeout=None):
        """
        Refresh lease ``leaseId`` (int) once. Fires with its remaining TTL in seconds (int); 0 means the
        lease no longer exists (expired or revoked). ``timeout``: seconds per endpoint tried (default
        the client's). (``/v3/lease/keepalive``, one message of the stream)
        """
        d = self._call("/v3/lease/keepalive", {"ID": str(int(leaseId))}, True, timeout)
        return d.addCallback(lambda obj: _int(obj.get("result") or obj, "TTL"))

    def revokeLease(self, leaseId):
        """
        Revoke lease ``leaseId`` (int): every key attached to it is deleted. An unknown lease fails with
        :class:`EtcdError` code 5 (NOT_FOUND). Fires with the store revision (int). (``/v3/lease/revoke``)
        """
        return self._call("/v3/lease/revoke", {"ID": str(int(leaseId))}, False).addCallback(headerRevision)

    # -- maintenance -----------------------------------------------------------------------------

    def status(self):
        """
        The answering member's status (``/v3/maintenance/status``): fires with a dict of ``version``
        (str), ``dbSize`` (int, bytes), ``leader`` and ``memberId`` (int ids; leader 0 when it has
        none), ``raftTerm``, ``raftIndex`` and ``revision`` (int), and ``endpoint`` (str).
        """
        def done(obj):
            header = obj.get("header") or {}
            return {"version": obj.get("version", ""), "dbSize": _int(obj, "dbSize"), "leader": _int(obj, "leader"),
                    "memberId": _int(header, "member_id"), "raftTerm": _int(obj, "raftTerm"),
                    "raftIndex": _int(obj, "raftIndex"), "revision": _int(header, "revision"),
                    "endpoint": self.endpoint}
        return self._call("/v3/maintenance/status", {}, True).addCallback(done)

    # -- watch -----------------------------------------------------------------------------------

    def watchPrefix(self, prefix, startRevision, onEvents, onCompacted=None, onStateChange=None,
                    maxBackoff=2.0):
        """
        Follow every change to keys starting with ``prefix``. Returns a :class:`Watch` (already started).

        :param startRevision: the first revision (int) to report, usually the ``getPrefix`` revision + 1;
            ``None`` for changes from now on
        :param onEvents: called with a list of :class:`Event` per message, in revision order, never twice
            for a revision, across reconnects
        :param onCompacted: called with the compaction revision (int) when etcd compacted past the next
            revision to report; the watch has then stopped (reload and watch again)
        :param onStateChange: called with ``True`` when the stream is established and ``False`` when it
            drops or cannot be established (only on changes)
        :param maxBackoff: the longest wait in seconds between reconnect attempts (doubling from 0.05)
        """
        w = Watch(self, prefix, startRevision, onEvents, onCompacted, onStateChange, maxBackoff)
        self._watches.add(w)
        w._start()
        return w

    def close(self):
        """Stop every watch and close pooled connections. Fires once they are closed."""
        ds = [w.stop() for w in list(self._watches)]
        ds.append(self._pool.closeCachedConnections())
        ds.append(self._streamPool.closeCachedConnections())
        return defer.gatherResults(ds).addCallback(lambda _: None)


@implementer(IAgentEndpointFactory)
class _EndpointCache:
    """
    One client endpoint per (host, port), made once: Agent's default factory makes a HostnameEndpoint
    per request, which runs the host through idna each time (about 60 µs of CPU).
    """

    def __init__(self, reactor, connectTimeout):
        self._reactor = reactor
        self._timeout = connectTimeout
        self._endpoints = {}

    def endpointForURI(self, uri):
        key = (uri.scheme, uri.host, uri.port)
        ep = self._endpoints.get(key)
        if ep is None:
            if uri.scheme != b"http":
                raise ValueError("etcd endpoints are http:// URLs here, not %r" % (uri.scheme,))
            ep = self._endpoints[key] = HostnameEndpoint(self._reactor, uri.host, uri.port, timeout=self._timeout)
        return ep


@implementer(IBodyProducer)
class _Body:
    """A request body written at once (``FileBodyProducer`` would go through a cooperator)."""

    def __init__(self, data):
        self._data = data
        self.length = len(data) if data is not None else UNKNOWN_LENGTH

    def startProducing(self, consumer):
        consumer.write(self._data)
        return defer.succeed(None)

    def pauseProducing(self):
        pass

    def resumeProducing(self):
        pass

    def stopProducing(self):
        pass


class _WatchStream(Protocol):
    """Receives one watch response body and feeds its messages to the Watch."""

    def __init__(self, watch):
        self._watch = watch
        self._parser = WatchStreamParser()
        self.closed = defer.Deferred()

    def dataReceived(self, data):
        try:
            messages = self._parser.feed(data)
        except ValueError as e:
            _log.warn("etcd watch: bad JSON in the stream: {e}", e=e)
            self.transport.stopProducing()
            return
        for m in messages:
            if not self._watch._message(self, decodeWatchMessage(m)):
                self.transport.stopProducing()
                return

    def connectionLost(self, reason):
        self._watch._streamLost(self, reason)
        self.closed.callback(None)


class Watch:
    """
    A running watch on a key prefix (made by :meth:`EtcdClient.watchPrefix`). One streaming POST of
    ``/v3/watch``; when it drops it is made again, on the next endpoint, from the last reported
    revision + 1, after a bounded backoff.

    :ivar lastRevision: the last revision (int) reported to ``onEvents`` (or known to be passed)
    :ivar connected: whether the stream is established (bool)
    """

    def __init__(self, client, prefix, startRevision, onEvents, onCompacted, onStateChange, maxBackoff):
        self._client = client
        self._prefix = _bytes(prefix)
        self._fromNow = startRevision is None
        self.lastRevision = 0 if startRevision is None else int(startRevision) - 1
        self._onEvents = onEvents
        self._onCompacted = onCompacted
        self._onStateChange = onStateChange
        self._maxBackoff = maxBackoff
        self._backoff = 0.05
        self._endpoint = client._current
        self._stream = None
        self._pending = None
        self._timer = None
        self._stopped = False
        self.connected = None

    def _setConnected(self, connected):
        if self.connected is not connected:
            self.connected = connected
            if self._onStateChange is not None:
                self._onStateChange(connected)

    def _start(self):
        self._timer = None
        if self._stopped:
            return
        req = _range(self._prefix, True)
        if not (self._fromNow and self.lastRevision == 0):
            req["start_revision"] = str(self.lastRevision + 1)
        url = self._client.endpoints[self._endpoint] + "/v3/watch"
        d = self._client._stream.post(
            url, data=json.dumps({"create_request": req}).encode("utf-8"), unbuffered=True,
            headers={b"Content-Type": [b"application/json"],
                     # etcd cancels the watch when its member loses the leader (clientv3.WithRequireLeader)
                     b"Grpc-Metadata-hasleader": [b"true"]})
        d.addTimeout(self._client.timeout, self._client._reactor)
        self._pending = d
        d.addCallbacks(self._responded, self._failed)

    def _responded(self, response):
        self._pending = None
        if self._stopped:
            response.deliverBody(_Discard())
            return
        if response.code != 200:
            d = treq.content(response)
            d.addCallback(lambda body: self._retry("HTTP %d: %r" % (response.code, body[:200])))
            d.addErrback(self._failed)
            return
        self._stream = _WatchStream(self)
        response.deliverBody(self._stream)

    def _failed(self, failure):
        self._pending = None
        if self._stopped:
            return
        self._retry(failure.getErrorMessage())

    def _retry(self, why):
        if self._stopped:
            return
        _log.info("etcd watch on {endpoint} lost ({why}); again in {backoff}s",
                  endpoint=self._client.endpoints[self._endpoint], why=why, backoff=self._backoff)
        self._setConnected(False)
        self._endpoint = (self._endpoint + 1) % len(self._client.endpoints)
        self._timer = self._client._reactor.callLater(self._backoff, self._start)
        self._backoff = min(self._backoff * 2, self._maxBackoff)

    def _message(self, stream, m):
        """One message of the stream; returns False to drop the stream."""
        if self._stopped or stream is not self._stream:
            return False
        if m.error is not None:
            _log.info("etcd watch error: {error}", error=m.error)
            return False
        if m.canceled:
            if m.compactRevision:
                self._stop()
                if self._onCompacted is not None:
                    self._onCompacted(m.compactRevision)
            return False
        if m.created:
            self._backoff = 0.05
            if self._fromNow and self.lastRevision == 0:
                self.lastRevision = m.revision
            self._setConnected(True)
            return True
        events = [e for e in m.events if e.modRevision > self.lastRevision]
        if events:
            self.lastRevision = events[-1].modRevision
            self._onEvents(events)
        elif not m.events and m.revision > self.lastRevision:
            self.lastRevision = m.revision  # a progress notification
        return True

    def _streamLost(self, stream, reason):
        if stream is not self._stream:
            return
        self._stream = None
        if not self._stopped:
            self._retry(reason.getErrorMessage())

    def _stop(self):
        self._stopped = True
        self._client._watches.discard(self)
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def reconnect(self):
        """
        Drop the stream and make it again on the next endpoint (from the last revision + 1), as after a
        failure. For an owner that has reason to think the member went quiet (a paused or partitioned
        member keeps the stream open and silent; etcd cancels it only when the member knows it lost
        its leader).
        """
        if self._stopped:
            return
        if self._pending is not None:
            self._pending.cancel()  # its errback retries
        elif self._stream is not None and self._stream.transport is not None:
            self._stream.transport.stopProducing()  # connectionLost retries

    def stop(self):
        """Stop watching. Fires once the stream's connection is closed. No callback runs after this."""
        self._stop()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        stream = self._stream
        if stream is not None:
            self._stream = None
            if stream.transport is not None:
                stream.transport.stopProducing()
            return stream.closed
        return defer.succeed(None)


class _Discard(Protocol):
    def dataReceived(self, data):
        self.transport.stopProducing()


class LeaseKeeper:
    """
    Holds one etcd lease: grants it, refreshes it every ``ttl / 3`` seconds on ``clock``, and calls
    ``onLost(reason str)`` once when it is lost: etcd said its TTL is 0 (expired or revoked), or no
    refresh succeeded before the lease would have expired (counted from when the last successful
    refresh was sent). A node stops serving what it cannot route safely then.

    :param client: an :class:`EtcdClient`
    :param ttl: the lease's time to live in seconds (int, at least 2)
    :param clock: an ``IReactorTime`` (a ``task.Clock`` in tests)
    :param onLost: called with a reason (str) when the lease is lost
    :ivar leaseId: the lease id (int) while held, else ``None``
    """

    def __init__(self, client, ttl, clock, onLost=None):
        self._client = client
        self.ttl = int(ttl)
        self._clock = clock
        self._onLost = onLost
        self.leaseId = None
        self._tick = None
        self._expiry = None
        self._expiresAt = None
        self._running = False
        self._inFlight = False

    def start(self):
        """Grant the lease. Fires with its id (int); fails as :meth:`EtcdClient.grantLease`."""
        self._running = True
        sent = self._clock.seconds()
        d = self._client.grantLease(self.ttl)

        def granted(leaseId):
            if not self._running:
                return leaseId
            self.leaseId = leaseId
            self._extend(sent + self.ttl)
            self._schedule()
            return leaseId

        def failed(f):
            self._running = False
            return f
        return d.addCallbacks(granted, failed)

    def _extend(self, at):
        self._expiresAt = at
        if self._expiry is not None and self._expiry.active():
            self._expiry.cancel()
        self._expiry = self._clock.callLater(max(0, at - self._clock.seconds()), self._lost,
                                             "no keepalive answered within the lease's %ds" % (self.ttl,))

    def _schedule(self):
        self._tick = self._clock.callLater(self.ttl / 3.0, self._refresh)

    def _refresh(self):
        self._tick = None
        if not self._running or self._inFlight:
            return
        self._inFlight = True
        sent = self._clock.seconds()
        leaseId = self.leaseId

        def answered(ttl):
            self._inFlight = False
            if not self._running or leaseId != self.leaseId:
                return
            if ttl <= 0:
                self._lost("etcd says lease %d is gone" % (leaseId,))
                return
            self._extend(sent + ttl)
            self._schedule()

        def failed(f):
            self._inFlight = False
            if not self._running or leaseId != self.leaseId:
                return
            _log.info("etcd lease keepalive failed: {e}", e=f.getErrorMessage())
            self._schedule()  # try again; the expiry timer decides when it is lost
        # a member that does not answer is left after a quarter of the TTL, so that the other endpoints
        # are tried before the lease runs out
        self._client.keepAlive(leaseId, timeout=self.ttl / 4.0).addCallbacks(answered, failed)

    def _cancelTimers(self):
        for call in (self._tick, self._expiry):
            if call is not None and call.active():
                call.cancel()
        self._tick = self._expiry = None

    def _lost(self, reason):
        if not self._running:
            return
        self._running = False
        self._cancelTimers()
        self.leaseId = None
        if self._onLost is not None:
            self._onLost(reason)

    def stop(self, revoke=True):
        """
        Stop refreshing (``onLost`` is not called). With ``revoke``, revoke the lease so its keys go at
        once; fires when done (a failed revoke is logged, not raised: the lease expires anyway).
        """
        self._running = False
        self._cancelTimers()
        leaseId, self.leaseId = self.leaseId, None
        if not revoke or leaseId is None:
            return defer.succeed(None)
        d = self._client.revokeLease(leaseId)
        d.addErrback(lambda f: _log.info("etcd lease revoke failed: {e}", e=f.getErrorMessage()))
        return d.addCallback(lambda _: None)
