"""
The policies room: ``/api/policies...``, ``/api/operator-policies...``,
``/api/parameters...`` and ``/api/global-parameters...``
(``rabbit_mgmt_wm_policies``, ``_policy``, ``_operator_policy``,
``_parameters``, ``_parameter``, ``_global_parameter``).  A policy is
validated once, by :func:`otter_tx.broker.policy.checkPolicy`, as a
definitions import validates it.
"""

from otter_tx.broker.policy import OperatorPolicy, Policy, PolicyError, checkOperatorKeys
from otter_tx.broker.vhost import LimitError
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import ADMIN, GLOBAL_PARAMETERS, POLICIES, VHOST
from otter_tx.web.management.http import HTTPError, Response, badRequest, notFound


def policyList(vhosts, operator=False):
    """
    The policies of ``vhosts`` (their operator policies with ``operator``)
    as RabbitMQ shows them: per vhost in order, by name (list of dicts).
    """
    return [
        p.asDict() for vh in vhosts
        for p in sorted((vh.operatorPolicies if operator else vh.policies).values(), key=lambda p: p.name)
    ]


def parameterList(vhosts, component=None):
    """
    The runtime parameters of ``vhosts`` (list of dicts): RabbitMQ 3.10
    without plugins has only the ``vhost-limits`` component, one ``limits``
    parameter per vhost that has limits.
    """
    if component not in (None, "vhost-limits"):
        return []
    return [
        {"value": dict(vh.limits) if vh.limits else [], "vhost": vh.name,
         "component": "vhost-limits", "name": "limits"}
        for vh in vhosts if vh.limits is not None
    ]


class PoliciesRoom(Room):
    """Policies, operator policies, runtime and global parameters."""

    app = roomApp()

    @app.route("/api/policies", methods=["GET", "OPTIONS"])
    @endpoint()
    def policiesAll(self, request, user):
        """
        ``GET /api/policies``: the policies of every vhost the user has
        permissions on (every user tag sees the list, as in 3.10).
        """
        return policyList(self._loginVHosts(user))

    @app.route("/api/policies/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def policiesVHost(self, request, user, vhost):
        """``GET /api/policies/{vhost}``."""
        return policyList([self._vhost(vhost)])

    @app.route("/api/policies/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(POLICIES)
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
    def _validatePolicy(vhost, name, body, cls=Policy):
        """
        A :class:`Policy` (or ``cls``) from a PUT body, or 400 with
        RabbitMQ's ``Validation failed`` texts
        (:func:`~otter_tx.broker.policy.checkPolicy`, the one validation the
        definitions import uses too; the policies endpoint HTML-escapes
        ``<`` and ``>`` in them, as RabbitMQ 3.10 does).
        """
        try:
            return cls(name, body["pattern"], body["definition"], body.get("priority", 0),
                       body.get("apply-to", "all"), vhost)
        except PolicyError as e:
            text = str(e).replace("<", "&lt;").replace(">", "&gt;")
            raise badRequest("Validation failed\n\n%s\n" % (text,))

    @app.route("/api/operator-policies", methods=["GET", "OPTIONS"])
    @endpoint(ADMIN)
    def operatorPoliciesAll(self, request, user):
        """``GET /api/operator-policies``: every vhost's operator policies, as policies are shown (administrators)."""
        return policyList([vh for _, vh in sorted(self.broker.vhosts.items())], operator=True)

    @app.route("/api/operator-policies/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(ADMIN)
    def operatorPoliciesVHost(self, request, user, vhost):
        """``GET /api/operator-policies/{vhost}`` (404 for a missing vhost)."""
        return policyList([self._vhost(vhost)], operator=True)

    @app.route("/api/operator-policies/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(ADMIN)
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
        policy = self._validatePolicy(vhost, name, body, OperatorPolicy)
        existed = name in vh.operatorPolicies
        vh.setOperatorPolicy(policy)
        return Response(204 if existed else 201)

    @app.route("/api/global-parameters", methods=["GET", "OPTIONS"])
    @endpoint(GLOBAL_PARAMETERS)
    def globalParameters(self, request, user):
        """``GET /api/global-parameters``: ``[{"name","value"}]`` (administrators and policymakers)."""
        params = self.broker.globalParameters
        return [{"name": name, "value": params[name]} for name in sorted(params)]

    @app.route("/api/global-parameters/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(GLOBAL_PARAMETERS)
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

    @app.route("/api/parameters", methods=["GET", "OPTIONS"])
    @endpoint(POLICIES)
    def parametersAll(self, request, user):
        """
        ``GET /api/parameters``: ``[{"value","vhost","component","name"}]``
        of the vhosts the user has (``vhost-limits`` only: no plugin here
        defines other components).  Administrators and policymakers.
        """
        return parameterList(self._loginVHosts(user))

    @app.route("/api/parameters/<component>", methods=["GET", "OPTIONS"])
    @endpoint(POLICIES)
    def parametersComponent(self, request, user, component):
        """``GET /api/parameters/{component}``: as the list, one component (``[]`` for an unknown one)."""
        return parameterList(self._loginVHosts(user), component)

    @app.route("/api/parameters/<component>/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(POLICIES)
    def parametersVHost(self, request, user, component, vhost):
        """``GET /api/parameters/{component}/{vhost}``: one component in one vhost (404 for a missing vhost)."""
        return parameterList([self._vhost(vhost)], component)

    @app.route("/api/parameters/<component>/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(POLICIES)
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
        return parameterList([vh])[0]

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
