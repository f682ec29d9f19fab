"""
The definitions room: ``/api/definitions`` and ``/api/definitions/{v}``
(``rabbit_mgmt_wm_definitions``): the export in RabbitMQ 3.10's format and
the import (:func:`otter_tx.broker.definitions.importDefinitions`, which
validates policies as the policies room does).  Administrators only.
"""

import json

from twisted.internet.defer import Deferred

from otter_tx import __version__
from otter_tx.broker.definitions import DefinitionsError, importDefinitions
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import ADMIN
from otter_tx.web.management.http import RABBITMQ_COMPAT_VERSION, HTTPError, Response, badRequest, queryArg
from otter_tx.web.management.policies import parameterList, policyList
from otter_tx.web.management.users import permissionList


class DefinitionsRoom(Room):
    """The definitions export and import."""

    app = roomApp()

    @app.route("/api/definitions", methods=["GET", "POST", "OPTIONS"])
    @endpoint(ADMIN)
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
    @endpoint(ADMIN)
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

        def answer(problems):
            if problems:
                raise badRequest("; ".join(problems))
            return Response(204)

        if isinstance(problems, Deferred):
            # a cluster: new queues are declared through etcd first
            return problems.addCallback(answer)
        return answer(problems)

    def _exportDefinitions(self, request, vhost):
        """
        The export document: the whole broker (``vhost`` None) or one
        vhost's objects in the per-vhost form (no ``vhost`` fields);
        ``?download=NAME`` sets ``Content-Disposition: attachment``.
        """
        download = queryArg(request, "download")
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
                "permissions": permissionList(self.broker),
                "topic_permissions": [],
                "parameters": parameterList([vh for _, vh in sorted(b.vhosts.items())]),
                "global_parameters": [{"name": n, "value": b.globalParameters[n]}
                                      for n in sorted(b.globalParameters)],
            }
            vhosts = sorted(b.vhosts.items())
        else:
            out = {"rabbit_version": RABBITMQ_COMPAT_VERSION, "parameters": parameterList([b.vhosts[vhost]])}
            vhosts = [(vhost, b.vhosts[vhost])]
        # operator policies are runtime parameters of component operator_policy
        # in RabbitMQ 3.10's export (checked on the peer), not a key of their own
        out["parameters"].extend(
            {"value": {k: v for k, v in d.items() if k not in ("vhost", "name")}, "vhost": d["vhost"],
             "component": "operator_policy", "name": d["name"]}
            for d in policyList([vh for _, vh in vhosts], operator=True)
        )
        out.update({"policies": policyList([vh for _, vh in vhosts]), "queues": [], "exchanges": [],
                    "bindings": []})
        for vname, vh in vhosts:
            exported = set()
            for qname in sorted(set(vh.queues) | set(vh.remoteQueues)):
                q = vh.findQueue(qname)
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
