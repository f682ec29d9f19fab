"""
Definitions import in RabbitMQ 3.10's format (``POST /api/definitions``,
``rabbitmqctl import_definitions``): users (with their RabbitMQ password
hashes and ``limits``), vhosts, permissions, ``vhost-limits`` parameters,
global parameters, policies, operator policies, queues, exchanges and
bindings, applied in RabbitMQ's order through the broker's normal
operations (the ones the HTTP API uses), so declares and limits get their
validation and redeclares are no-ops (a second import of the same file
changes nothing).

What otter_tx lacks is not imported and is reported, never silently
dropped: each such item gives one text in the list :func:`importDefinitions`
returns and one log line.  As RabbitMQ 3.10 does for a failing item, the
other items are still applied.  Quorum queues and streams are imported
(docs/quorum.md, docs/streams.md).  Reported: queues with an ``x-queue-type`` other than
``classic``, ``quorum`` or ``stream``, topic permissions, runtime
parameters of components other than ``vhost-limits`` (shovels,
federation...), and any item the broker refuses (invalid arguments or
limits, inequivalent redeclare, missing vhost, user or binding end).  The
global parameter ``internal_cluster_id`` (the node's identity) is skipped
with an info log line, not reported.  ``ha-*`` policy keys are
accepted with a warning: on a single node they have no effect, as on a
single RabbitMQ node.
"""

from twisted.logger import Logger

from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.access import PasswordHashError, User
from otter_tx.broker.policy import OperatorPolicy, Policy, PolicyError, haKeys
from otter_tx.broker.vhost import LimitError

log = Logger()

#: global parameters that describe the node exported from, not applied
NODE_GLOBAL_PARAMETERS = frozenset({"internal_cluster_id"})


class DefinitionsError(ValueError):
    """The document is not a definitions object (the whole import is refused)."""


def _flag(v):
    return v is True or v == "true"


def _tags(v):
    if isinstance(v, str):
        return [t.strip() for t in v.split(",") if t.strip()]
    if isinstance(v, list):
        return [str(t) for t in v]
    return []


def _list(doc, key):
    items = doc.get(key) or []
    if not isinstance(items, list):
        raise DefinitionsError("%s must be a list" % (key,))
    return [i for i in items if isinstance(i, dict)]


class _Import:
    """One import: the broker, the target vhost (None: the whole broker), the reports."""

    def __init__(self, broker, vhost):
        self.broker = broker
        self.vhost = vhost
        self.problems = []

    def report(self, kind, name, reason):
        """Record and log one item not imported."""
        text = "%s %s not imported: %s" % (kind, name, reason)
        self.problems.append(text)
        log.warn("definitions import: {text}", text=text)

    def vhostName(self, item):
        """The name of the vhost an item goes to: the import's, else its ``vhost`` field."""
        return self.vhost if self.vhost is not None else item.get("vhost", "/")

    def target(self, kind, item):
        """
        ``(vhost, label)`` for a named item of ``kind`` (policy, queue,
        exchange); ``(None, label)`` after reporting a missing vhost or name.
        """
        vname = self.vhostName(item)
        label = "'%s' in vhost '%s'" % (item.get("name"), vname)
        vh = self.broker.vhosts.get(vname)
        if vh is None:
            self.report(kind, label, "vhost_not_found")
        elif not isinstance(item.get("name"), str):
            self.report(kind, label, "no name")
            vh = None
        return vh, label

    # --- the sections, in RabbitMQ's order --------------------------------------

    def users(self, items):
        broker = self.broker
        for item in items:
            name = item.get("name")
            if not isinstance(name, str):
                self.report("user", repr(name), "no name")
                continue
            u = User(name, None, _tags(item.get("tags")))
            old = broker.users.get(name)
            try:
                if "password" in item and "password_hash" not in item:
                    u = User(name, str(item["password"]), u.tags)
                else:
                    u.setPasswordHash(item.get("password_hash", ""), item.get("hashing_algorithm"))
            except PasswordHashError as e:
                self.report("user", "'%s'" % (name,), str(e))
                continue
            if old is None or (old.salt, old.passwordHash, old.hashingAlgorithm, old.tags) != (
                    u.salt, u.passwordHash, u.hashingAlgorithm, u.tags):
                broker.putUser(u)
            self.userLimits(name, item.get("limits"))

    def userLimits(self, name, limits):
        """Set each of ``limits`` (a user's ``limits`` field) that differs, through Broker.setUserLimit."""
        if limits in (None, [], {}):
            return
        if not isinstance(limits, dict):
            self.report("user limits of", "'%s'" % (name,), "limits must be an object")
            return
        current = self.broker.userLimits.get(name, {})
        for limit, value in sorted(limits.items()):
            if limit in current and current[limit] == value and type(current[limit]) is type(value):
                continue
            try:
                self.broker.setUserLimit(name, limit, value)
            except LimitError as e:
                self.report("user limit %s of" % (limit,), "'%s'" % (name,), str(e))

    def vhosts(self, items):
        for item in items:
            name = item.get("name")
            if not isinstance(name, str) or not name:
                self.report("vhost", repr(name), "no name")
                continue
            self.broker.addVHost(name)

    def permissions(self, items):
        broker = self.broker
        for item in items:
            user, vhost = item.get("user"), item.get("vhost")
            label = "of user '%s' in vhost '%s'" % (user, vhost)
            if vhost not in broker.vhosts or user not in broker.users:
                self.report("permissions", label, "vhost_or_user_not_found")
                continue
            perms = tuple(str(item.get(k, "")) for k in ("configure", "write", "read"))
            if broker.permissions.get((user, vhost)) != perms:
                broker.setPermissions(user, vhost, *perms)

    def topicPermissions(self, items):
        for item in items:
            self.report("topic permissions", "of user '%s' in vhost '%s' on exchange '%s'"
                        % (item.get("user"), item.get("vhost"), item.get("exchange")),
                        "topic permissions are not supported")

    def parameters(self, items):
        for item in items:
            component, name, vname = item.get("component"), item.get("name"), self.vhostName(item)
            label = "%s/%s in vhost '%s'" % (component, name, vname)
            if component == "operator_policy" and isinstance(item.get("value"), dict):
                # RabbitMQ 3.10 exports operator policies as parameters of this component
                value = item["value"]
                self.policies([dict(value, vhost=vname, name=name)], operator=True)
                continue
            if component != "vhost-limits":
                self.report("parameter", label, "component %s is not supported" % (component,))
                continue
            vh = self.broker.vhosts.get(vname)
            if vh is None:
                self.report("parameter", label, "vhost_not_found")
                continue
            if name != "limits":
                self.report("parameter", label, "vhost-limits parameters are named limits, not %s" % (name,))
                continue
            value = item.get("value")
            if value == []:  # an emptied limits parameter, as RabbitMQ exports it
                value = {}
            if not isinstance(value, dict):
                self.report("parameter", label, "limits should be an object")
                continue
            if vh.limits is not None and vh.limits == value and all(
                    type(vh.limits[k]) is type(v) for k, v in value.items()):
                continue
            try:
                vh.setLimits(value)
            except LimitError as e:
                self.report("parameter", label, str(e))

    def globalParameters(self, items):
        for item in items:
            name = item.get("name")
            if name in NODE_GLOBAL_PARAMETERS:
                log.info("definitions import: global parameter {name} skipped (node identity)", name=name)
                continue
            if not isinstance(name, str) or not name:
                self.report("global parameter", repr(name), "no name")
                continue
            if "value" not in item:
                self.report("global parameter", "'%s'" % (name,), "no value")
                continue
            value = item["value"]
            params = self.broker.globalParameters
            if name in params and params[name] == value and type(params[name]) is type(value):
                continue
            self.broker.setGlobalParameter(name, value)

    def policies(self, items, operator=False):
        kind = "operator policy" if operator else "policy"
        for item in items:
            vh, label = self.target(kind, item)
            if vh is None:
                continue
            definition = item.get("definition") or {}
            if not isinstance(definition, dict):
                self.report(kind, label, "definition must be an object")
                continue
            ha = haKeys(definition)
            if ha and not operator:
                log.warn("definitions import: policy {policy} keys {keys} accepted without effect "
                         "(no mirroring on a single node)", policy=label, keys=ha)
            applyTo = item.get("apply-to", "all")
            priority = item.get("priority", 0)
            old = (vh.operatorPolicies if operator else vh.policies).get(item.get("name"))
            if old is not None and (old.pattern, old.definition, old.priority, old.applyTo) == (
                    item.get("pattern"), definition, priority, applyTo):
                continue
            try:
                cls = OperatorPolicy if operator else Policy
                policy = cls(item.get("name"), item.get("pattern"), definition, priority, applyTo, vh.name)
            except (PolicyError, TypeError) as e:
                self.report(kind, label, str(e))
                continue
            if operator:
                vh.setOperatorPolicy(policy)
            else:
                vh.setPolicy(policy)

    def queues(self, items):
        for item in items:
            vh, label = self.target("queue", item)
            if vh is None:
                continue
            args = item.get("arguments") or {}
            qtype = args.get("x-queue-type", "classic") if isinstance(args, dict) else "classic"
            if qtype not in ("classic", "quorum", "stream"):
                self.report("queue", label, "%s queues are not supported" % (qtype,))
                continue
            try:
                vh.declareQueue(item.get("name"), None, durable=_flag(item.get("durable")),
                                autoDelete=_flag(item.get("auto_delete")), arguments=args)
            except AMQPError as e:
                self.report("queue", label, e.text)

    def exchanges(self, items):
        for item in items:
            vh, label = self.target("exchange", item)
            if vh is None:
                continue
            try:
                vh.declareExchange(item.get("name"), item.get("type", "direct"),
                                   durable=_flag(item.get("durable")),
                                   autoDelete=_flag(item.get("auto_delete")),
                                   internal=_flag(item.get("internal")),
                                   arguments=item.get("arguments") or {})
            except AMQPError as e:
                self.report("exchange", label, e.text)

    def bindings(self, items):
        for item in items:
            vname = self.vhostName(item)
            label = "from '%s' to %s '%s' with key '%s' in vhost '%s'" % (
                item.get("source"), item.get("destination_type"), item.get("destination"),
                item.get("routing_key"), vname)
            vh = self.broker.vhosts.get(vname)
            if vh is None:
                self.report("binding", label, "vhost_not_found")
                continue
            source = vh.exchanges.get(item.get("source"))
            kind = item.get("destination_type")
            table = vh.queues if kind == "queue" else vh.exchanges if kind == "exchange" else {}
            dest = table.get(item.get("destination"))
            if source is None or dest is None:
                self.report("binding", label, "source or destination not found")
                continue
            try:
                vh.bind(source, dest, item.get("routing_key", ""), item.get("arguments") or {})
            except AMQPError as e:
                self.report("binding", label, e.text)


def importDefinitions(broker, doc, vhost=None):
    """
    Apply definitions ``doc`` (the dict of a RabbitMQ 3.10 export) to
    ``broker``: the whole-broker form, or with ``vhost`` (str, an existing
    vhost) the per-vhost form (``GET /api/definitions/{vhost}``: policies,
    parameters, queues, exchanges and bindings, their ``vhost`` fields
    ignored; users, vhosts, permissions, global parameters and operator
    policies there are reported, as RabbitMQ 3.10 ignores them).  Returns the list of texts naming each item not
    imported (empty when all were); each is also logged.  Raises
    :class:`DefinitionsError` when ``doc`` is not a definitions object.
    """
    if not isinstance(doc, dict):
        raise DefinitionsError("definitions must be a JSON object")
    imp = _Import(broker, vhost)
    if vhost is None:
        imp.users(_list(doc, "users"))
        imp.vhosts(_list(doc, "vhosts"))
        imp.permissions(_list(doc, "permissions"))
        imp.topicPermissions(_list(doc, "topic_permissions"))
        imp.parameters(_list(doc, "parameters"))
        imp.globalParameters(_list(doc, "global_parameters"))
    else:
        for key in ("users", "vhosts", "permissions", "topic_permissions", "global_parameters"):
            if _list(doc, key):
                imp.report(key, "(%d)" % (len(_list(doc, key)),), "not part of a per-vhost import")
        imp.parameters(_list(doc, "parameters"))
    imp.policies(_list(doc, "policies"))
    imp.queues(_list(doc, "queues"))
    imp.exchanges(_list(doc, "exchanges"))
    imp.bindings(_list(doc, "bindings"))
    return imp.problems
