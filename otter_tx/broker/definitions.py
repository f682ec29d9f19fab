"""
Definitions import in RabbitMQ 3.10's format (``POST /api/definitions``,
``rabbitmqctl import_definitions``): users (with their RabbitMQ password
hashes), vhosts, permissions, policies, queues, exchanges and bindings,
applied in RabbitMQ's order through the broker's normal operations, so
declares get their argument validation and redeclares are no-ops (a second
import of the same file changes nothing).

What otter_tx lacks is not imported and is reported, never silently
dropped: each such item gives one text in the list :func:`importDefinitions`
returns and one log line.  As RabbitMQ 3.10 does for a failing item, the
other items are still applied.  Reported: queues with an ``x-queue-type``
other than ``classic`` (quorum, stream), topic permissions, user limits,
runtime parameters (``vhost-limits``, shovels, federation...) and global
parameters other than ``internal_cluster_id`` (the node's identity, left
alone), and any item the broker refuses (invalid arguments, inequivalent
redeclare, missing vhost, user or binding end).  ``ha-*`` policy keys are
accepted with a warning: on a single node they have no effect, as on a
single RabbitMQ node.
"""

from twisted.logger import Logger

from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.access import PasswordHashError, User
from otter_tx.broker.policy import PolicyError, haKeys

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
            if old is not None:
                u.loopbackOnly = old.loopbackOnly
            try:
                if "password" in item and "password_hash" not in item:
                    u = User(name, str(item["password"]), u.tags, u.loopbackOnly)
                else:
                    u.setPasswordHash(item.get("password_hash", ""), item.get("hashing_algorithm"))
            except PasswordHashError as e:
                self.report("user", "'%s'" % (name,), str(e))
                continue
            if old is None or (old.salt, old.passwordHash, old.hashingAlgorithm, old.tags) != (
                    u.salt, u.passwordHash, u.hashingAlgorithm, u.tags):
                broker.putUser(u)
            if item.get("limits"):
                self.report("user limits of", "'%s'" % (name,), "user limits are not supported")

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
            self.report("parameter", "%s/%s in vhost '%s'"
                        % (item.get("component"), item.get("name"), self.vhostName(item)),
                        "component %s is not supported" % (item.get("component"),))

    def globalParameters(self, items):
        for item in items:
            name = item.get("name")
            if name in NODE_GLOBAL_PARAMETERS:
                log.info("definitions import: global parameter {name} skipped (node identity)", name=name)
                continue
            self.report("global parameter", "'%s'" % (name,), "global parameters are not supported")

    def policies(self, items):
        broker = self.broker
        for item in items:
            vh, label = self.target("policy", item)
            if vh is None:
                continue
            definition = item.get("definition") or {}
            if not isinstance(definition, dict):
                self.report("policy", label, "definition must be an object")
                continue
            ha = haKeys(definition)
            if ha:
                log.warn("definitions import: policy {policy} keys {keys} accepted without effect "
                         "(no mirroring on a single node)", policy=label, keys=ha)
            applyTo = item.get("apply-to", "all")
            priority = item.get("priority", 0)
            old = vh.policies.get(item.get("name"))
            if old is not None and (old.pattern, old.definition, old.priority, old.applyTo) == (
                    item.get("pattern"), definition, priority, applyTo):
                continue
            try:
                broker.setPolicy(vh.name, item.get("name"), item.get("pattern"), definition,
                                 priority, applyTo)
            except (PolicyError, TypeError) as e:
                self.report("policy", label, str(e))

    def queues(self, items):
        for item in items:
            vh, label = self.target("queue", item)
            if vh is None:
                continue
            args = item.get("arguments") or {}
            qtype = args.get("x-queue-type", "classic") if isinstance(args, dict) else "classic"
            if qtype != "classic":
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
    ignored; users, vhosts, permissions and global parameters there are
    reported, as RabbitMQ 3.10 ignores them).  Returns the list of texts naming each item not imported
    (empty when all were); each is also logged.  Raises
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
