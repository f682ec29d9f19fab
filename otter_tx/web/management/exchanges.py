"""
The exchanges and bindings room: ``/api/exchanges...`` (declare, delete,
publish, otter_tx's held delayed messages) and ``/api/bindings...``
(``rabbit_mgmt_wm_exchange``, ``_exchange_publish``, ``_bindings``,
``_binding``).  Declares, publishes and binds run through a Session acting
as the user.
"""

import base64
import json
from urllib.parse import quote, unquote

from otter_tx.amqp.codec import Timestamp, encodeProperties
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.delayed import DELAYED_TYPE, checkHeldAccess, pageParameters
from otter_tx.broker.exchange import EXCHANGE_TYPES
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import VHOST
from otter_tx.web.management.http import (
    HTTPError, Response, badRequest, jsonFlag, notFound, queryArg, queryFlag,
)


_SHORTSTR_PROPS = (
    "content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
    "message_id", "type", "user_id", "app_id", "cluster_id",
)


class ExchangesRoom(Room):
    """Exchanges (with publish and the delayed messages they hold) and bindings."""

    app = roomApp()

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
    @endpoint(VHOST)
    def exchangesVHost(self, request, user, vhost):
        """``GET /api/exchanges/{vhost}``."""
        vh = self._vhost(vhost)
        view = self._rateView(request)
        return [fmt.exchangeDict(ex, view) for _, ex in sorted(vh.exchanges.items())]

    @app.route("/api/exchanges/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(VHOST)
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
            session = self._session(user, vh)
            session.checkExchangeDeclare(xname)  # a refused request's body is never parsed
            body = self._body(request)
            xtype = body.get("type", "direct")
            if xtype != DELAYED_TYPE and xtype not in EXCHANGE_TYPES:
                raise badRequest("unknown exchange type '%s'" % (xtype,))
            args = body.get("arguments") or {}
            if not isinstance(args, dict):
                raise badRequest("arguments must be an object")
            existed = xname in vh.exchanges
            session.declareExchange(
                xname, xtype, durable=jsonFlag(body.get("durable")),
                autoDelete=jsonFlag(body.get("auto_delete")), internal=jsonFlag(body.get("internal")),
                arguments=args,
            )
            return Response(204 if existed else 201)
        ex = vh.exchanges.get(xname)
        if ex is None:
            raise notFound()
        if request.method == b"DELETE":
            self._session(user, vh).deleteExchange(xname, ifUnused=queryFlag(request, "if-unused"))
            return Response(204)
        d = fmt.exchangeDict(ex, self._rateView(request))
        d["incoming"] = []
        d["outgoing"] = []
        return d

    @app.route("/api/exchanges/<vhost>/<name>/bindings/<any(source,destination):side>",
               methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
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
    @endpoint(VHOST)
    def exchangePublish(self, request, user, vhost, name):
        """
        ``POST /api/exchanges/{vhost}/{name}/publish`` with ``{"properties",
        "routing_key", "payload", "payload_encoding"}`` -> ``{"routed":
        bool}``.  AMQP errors are 400 with the full reply, e.g. ``406
        PRECONDITION_FAILED - invalid expiration 'abc': no_integer``.
        Needs write permission on the exchange, checked before the exchange
        is looked up, as ``basic.publish`` does: 400 ``403 ACCESS_REFUSED -
        access to exchange 'x' in vhost '/' refused for user 'u'``.  A
        resource alarm does not refuse it: RabbitMQ 3.10 accepts and routes
        it (:meth:`~otter_tx.broker.broker.Broker.received`).
        """
        vh = self._vhost(vhost)
        xname = self._exchangeName(name)
        session = self._session(user, vh)
        try:
            session.checkPublish(xname)  # a refused request's body is never parsed
        except AMQPError as e:
            raise badRequest(str(e))
        body = self._body(request, None)  # a message may be as large as the body cap allows
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
        # the body's bytes count toward the memory check as an AMQP publish's do; an alarm
        # does not refuse an HTTP publish, as in RabbitMQ (Broker.received)
        self.broker.received(len(data))
        try:
            ex = session.checkedPublishTarget(xname)
            props = self._properties(body["properties"])
            routed, _ = session.publish(ex, str(body["routing_key"]), False, encodeProperties(props), data,
                                        props=props)
        except AMQPError as e:
            raise badRequest(str(e))
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
    @endpoint(VHOST)
    def exchangeDelayed(self, request, user, vhost, name):
        """
        ``GET /api/exchanges/{vhost}/{name}/delayed?page=P&page_size=S``: the
        held messages in due order, ``{"items": [{"id", "message_id",
        "due" (epoch ms), "routing_key", "properties", "payload_bytes"}],
        "total_count", "page", "page_size"}`` (page from 1, size 1..500,
        default 100; else 400 ``invalid_pagination_parameters``);
        ``due_from=T`` (epoch ms, otter-only) answers instead the page
        holding the first message due at or after T.  Needs read
        permission on the exchange.  ``DELETE``: purge them all (204); needs
        write permission.  404 for a missing or non-delayed exchange.
        """
        cluster = self._delayedCluster()
        if request.method == b"DELETE":
            _, ex = self._delayedExchange(user, vhost, name, "purge")
            if cluster is not None:
                # every node's held messages (otter_tx/cluster/delayedrepl.py)
                return cluster.purge(ex).addCallback(lambda _: Response(204))
            ex.purgeHeld()
            return self._afterSync(ex, Response(204))
        _, ex = self._delayedExchange(user, vhost, name, "list")
        try:
            page, size = pageParameters(queryArg(request, "page"), queryArg(request, "page_size"))
            dueFrom = queryArg(request, "due_from")
            dueFrom = None if dueFrom is None else int(dueFrom)
        except ValueError as e:
            raise HTTPError(400, "invalid_pagination_parameters", str(e))
        if cluster is not None:
            return cluster.page(ex, page, size, dueFrom)
        return ex.heldPage(page, size, dueFrom)

    def _delayedCluster(self):
        """In a cluster, its :class:`~otter_tx.cluster.delayedrepl.DelayedReplication` (acts on every node)."""
        return getattr(self.broker.cluster, "delayed", None)

    def _cancelled(self, ex, found):
        """204 once cancelled (and synced), else 404; ``found``: a count, or a Deferred of one."""
        def answer(n):
            if not n:
                raise notFound()
            return Response(204)

        if isinstance(found, int):
            if not found:
                raise notFound()
            return self._afterSync(ex, Response(204))
        return found.addCallback(answer)

    @app.route("/api/exchanges/<vhost>/<name>/delayed/<held>", methods=["DELETE", "OPTIONS"])
    @endpoint(VHOST)
    def exchangeDelayedOne(self, request, user, vhost, name, held):
        """
        ``DELETE /api/exchanges/{vhost}/{name}/delayed/{id}``: cancel the held
        message with broker id ``id`` (204; 404 when no such held message).
        Needs write permission on the exchange.
        """
        _, ex = self._delayedExchange(user, vhost, name, "cancel")
        cluster = self._delayedCluster()
        if cluster is not None:
            return self._cancelled(ex, cluster.cancel(ex, heldId=held))
        return self._cancelled(ex, 1 if ex.cancel(held) else 0)

    @app.route("/api/exchanges/<vhost>/<name>/delayed/by-message-id/<messageId>",
               methods=["DELETE", "OPTIONS"])
    @endpoint(VHOST)
    def exchangeDelayedByMessageId(self, request, user, vhost, name, messageId):
        """
        ``DELETE /api/exchanges/{vhost}/{name}/delayed/by-message-id/{message_id}``:
        cancel every held message whose ``message_id`` property is
        ``message_id`` (204; 404 when there is none).  Needs write
        permission on the exchange.
        """
        _, ex = self._delayedExchange(user, vhost, name, "cancel")
        cluster = self._delayedCluster()
        if cluster is not None:
            return self._cancelled(ex, cluster.cancel(ex, messageId=messageId))
        return self._cancelled(ex, ex.cancelMessageId(messageId))

    @app.route("/api/bindings", methods=["GET", "OPTIONS"])
    @endpoint()
    def bindingsAll(self, request, user):
        """``GET /api/bindings``."""
        return [b for vh in self._loginVHosts(user) for b in fmt.vhostBindings(vh)]

    @app.route("/api/bindings/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
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
        session.checkBind(kind, dname, self._exchangeName(source))
        return session

    def _bindingEnds(self, vh, source, dtype, dest):
        """The source Exchange and destination (Queue or Exchange) or 404 ``not_found``."""
        src = vh.getExchange(self._exchangeName(source))
        if dtype == "q":
            dst = vh.findQueue(dest)
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
    @endpoint(VHOST)
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
        session = self._checkBinding(user, vh, source, dtype, dest)  # a refused request's body is never parsed
        body = self._body(request)
        key = body.get("routing_key", "")
        args = body.get("arguments") or {}
        if not isinstance(key, str) or not isinstance(args, dict):
            raise badRequest("routing_key must be a string and arguments an object")
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
    @endpoint(VHOST)
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
