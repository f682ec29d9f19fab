"""
What every room of the management app shares: :class:`Room` (one resource
family's Klein app over the broker), :func:`endpoint` (authentication,
path decoding, rendering and RabbitMQ's error bodies around a handler) and
:func:`roomApp` (a Klein app with RabbitMQ's 404 and 405 answers).
"""

import functools
from urllib.parse import unquote

from klein import Klein
from twisted.internet.defer import Deferred
from werkzeug.exceptions import MethodNotAllowed, NotFound

from otter_tx.amqp.errors import AMQPError
from otter_tx.broker import stats
from otter_tx.web import _format as fmt
from otter_tx.web.management import authz
from otter_tx.web.management.http import (
    HTTPError, amqpHTTPError, badRequest, jsonBody, notFound, queryArg, render, renderError, requireKeys,
)


def endpoint(access=authz.ANY):
    """
    Wrap a route handler ``f(self, request, user, **pathArgs)``: Basic auth
    and tag checks (:func:`~otter_tx.web.management.authz.authenticate` for
    ``access``), percent-decoding of path segments, rendering of the result
    (:func:`~otter_tx.web.management.http.render`; a list goes through
    ``listQuery``), and :class:`HTTPError` / :class:`AMQPError` to
    RabbitMQ's error bodies.
    """

    def deco(f):
        @functools.wraps(f)
        def wrapper(self, request, **kw):
            return self._handle(f, access, request, kw)

        return wrapper

    return deco


def _unknownPath(room, request, failure):
    """An unknown path: 404 ``Object Not Found`` (JSON), as RabbitMQ."""
    return renderError(request, notFound())


def _badMethod(room, request, failure):
    """An unsupported method: 405 with an ``allow`` header and no body."""
    allowed = failure.value.valid_methods or []
    request.setHeader(b"allow", ", ".join(allowed).encode("ascii"))
    return renderError(request, HTTPError(405, None, None))


def roomApp():
    """A new Klein app for a room's class attribute ``app``, answering 404 and 405 as RabbitMQ."""
    app = Klein()
    app.handle_errors(NotFound)(_unknownPath)
    app.handle_errors(MethodNotAllowed)(_badMethod)
    return app


class Room:
    """
    One resource family of the management API: a Klein app (``app``, a
    class attribute made by :func:`roomApp`, routes with their full paths)
    over the broker, mounted by :class:`~otter_tx.web.management.ManagementApp`,
    whose state (``broker``, ``clock``, listeners) it reads.

    :param root: the :class:`~otter_tx.web.management.ManagementApp`.
    """

    def __init__(self, root):
        self.root = root
        self.broker = root.broker
        self.clock = root.clock

    def _merged(self, local, op, args, key):
        """
        ``local`` (a list of dicts) with what the other nodes of the cluster
        answer request ``op`` (``ClusterNode.askAll`` with ``args``), sorted by
        ``key``: a Deferred of the list; without a cluster the sorted list.
        """
        cluster = self.broker.cluster
        if cluster is None:
            return sorted(local, key=key)

        def merge(answers):
            items = list(local)
            for _, theirs in sorted(answers.items()):
                if isinstance(theirs, list):
                    items.extend(theirs)
            items.sort(key=key)
            return items

        return cluster.askAll(op, args).addCallback(merge)

    def _handle(self, f, access, request, kw):
        kw = {k: unquote(v) if isinstance(v, str) else v for k, v in kw.items()}
        try:
            if request.method == b"OPTIONS":
                request.setResponseCode(200)
                return b""
            user = None if access == authz.NONE else authz.authenticate(self.broker, request, access,
                                                                          kw.get("vhost"))
            result = f(self, request, user, **kw)
        except HTTPError as e:
            return renderError(request, e)
        except AMQPError as e:
            return renderError(request, amqpHTTPError(e))
        if isinstance(result, Deferred):
            # answered later (a cluster: etcd, or another node)
            def failed(f):
                if f.check(HTTPError):
                    return renderError(request, f.value)
                if f.check(AMQPError):
                    return renderError(request, amqpHTTPError(f.value))
                return f

            return result.addCallbacks(lambda r: render(request, r), failed)
        return render(request, result)

    # --- the authorisation model, for the handlers (authz) --------------------

    _isAdmin = staticmethod(authz.isAdmin)
    _isMonitor = staticmethod(authz.isMonitor)
    _owns = staticmethod(authz.owns)

    def _loginVHosts(self, user):
        return authz.loginVHosts(self.broker, user)

    def _visibleVHosts(self, user):
        return authz.visibleVHosts(self.broker, user)

    def _visibleConnections(self, user):
        return authz.visibleConnections(self.broker, user)

    def _session(self, user, vh):
        return authz.session(self.broker, user, vh)

    # --- lookups and request parts ----------------------------------------------

    def _vhost(self, name):
        """VHost ``name``, or 404 when missing (the endpoint has authorised the user)."""
        vh = self.broker.vhosts.get(name)
        if vh is None:
            raise notFound()
        return vh

    @staticmethod
    def _queue(vh, name):
        """Queue ``name`` of vhost ``vh``, or 404 when missing."""
        q = vh.findQueue(name)
        if q is None:
            raise notFound()
        return q

    @staticmethod
    def _exchangeName(name):
        """The exchange a path names: ``amq.default`` is the default exchange ``""``."""
        return "" if name == "amq.default" else name

    _body = staticmethod(jsonBody)
    _require = staticmethod(requireKeys)

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
                ranges.append(stats.parseRange(queryArg(request, prefix + "_age"), queryArg(request, prefix + "_incr")))
            except stats.InvalidRange as e:
                raise badRequest(str(e))
        return fmt.RateView(self.broker.sampler, *ranges)
