"""
Vhosts, users, permissions, policies, operator policies, vhost limits and
global parameters in the cluster's metadata (docs/cluster.md, "Metadata"):
a change on any node is written under ``entities/<kind>/<key>`` in the
journal's own record format (:meth:`Journal.entityChanged
<otter_tx.broker.durability.Journal.entityChanged>`), and every node
applies what its watch reports.  The first node of a cluster publishes
what it has, all in one write; a node joining later takes the cluster's.
"""

from urllib.parse import quote, unquote

from otter_tx.broker.access import DEFAULT_HASHING
from otter_tx.broker.durability import Journal
from otter_tx.broker.policy import OperatorPolicy
from otter_tx.store import keys

KINDS = ("vhost", "user", "permission", "global_parameter", "policy", "operator_policy")
PREFIX = "entities/"


def entityKey(kind, key):
    return "%s%s/%s" % (PREFIX, kind, quote(key, safe=""))


class _Capture:
    """The store side of a Journal that writes entity records to the metadata store."""

    def __init__(self, node, onError, records):
        self.node = node
        self.onError = onError
        # Entities.records: this node's own writes are what the cluster holds too (their watch
        # echoes are dropped, OrderedWrites), so a later delete from another node finds them
        self.records = records
        #: a list while Entities.collect gathers the records instead of writing them
        self.collected = None

    def putEntity(self, kind, key, value):
        k = entityKey(kind, key)
        m = self.node.metadata
        self.records[k] = value
        if self.collected is not None:
            self.collected.append((k, value))
            return
        self.node.writes.write(k, lambda: m.put(k, value)).addErrback(self.onError, k)

    def deleteEntity(self, kind, key):
        k = entityKey(kind, key)
        m = self.node.metadata
        self.records.pop(k, None)
        self.node.writes.write(k, lambda: m.delete(k)).addErrback(self.onError, k)


class Entities:
    """The definitions-level records of one node's broker, kept in step with the cluster's."""

    def __init__(self, node, onError):
        self.node = node
        self.broker = node.broker
        self.records = {}   # full key -> value, what the cluster holds
        self.capture = _Capture(node, onError, self.records)
        self.journal = Journal(self.broker, self.capture)

    def changed(self, kind, vhost, obj, deleted):
        """A local change (not one being applied from the cluster)."""
        if kind in KINDS:
            self.journal.entityChanged(kind, vhost, obj, deleted)

    def collect(self):
        """
        The first node's records, every local one, as a list of ``(key,
        value)`` for :meth:`MemoryMetadata.seed
        <otter_tx.cluster.metadata.MemoryMetadata.seed>` (one write: a
        node killed half-way must not leave the cluster a vhost without
        its users).
        """
        self.capture.collected = out = []
        try:
            self.publishAll()
        finally:
            self.capture.collected = None
        return out

    def publishAll(self):
        """Every local record goes to the cluster (one write each)."""
        b = self.broker
        for vh in list(b.vhosts.values()):
            self.changed("vhost", vh, vh, False)
            for p in list(vh.policies.values()):
                self.changed("policy", vh, p, False)
            for p in list(vh.operatorPolicies.values()):
                self.changed("operator_policy", vh, p, False)
        for u in list(b.users.values()):
            self.changed("user", None, u, False)
        for pair in list(b.permissions):
            self.changed("permission", None, pair, False)
        for name in list(b.globalParameters):
            self.changed("global_parameter", None, name, False)

    def adopt(self, items):
        """A joining node: the cluster's records replace the local ones."""
        present = {}
        for key, value in items:
            kind, _, rest = key[len(PREFIX):].partition("/")
            present.setdefault(kind, set()).add(unquote(rest))
            self.apply(key, value)
        b = self.broker
        for name in list(b.vhosts):
            if name not in present.get("vhost", ()):
                b.deleteVHost(name)
        for name in list(b.users):
            if name not in present.get("user", ()):
                b.deleteUser(name)
        for user, vh in list(b.permissions):
            if keys.permissionKey(user, vh) not in present.get("permission", ()):
                b.clearPermissions(user, vh)

    def apply(self, key, value):
        """One record from the cluster (``value`` None: deleted)."""
        kind, _, rest = key[len(PREFIX):].partition("/")
        name = unquote(rest)
        b = self.broker
        if value is None:
            old = self.records.pop(key, None)
        else:
            self.records[key] = value
        if kind == "vhost":
            if value is None:
                if name in b.vhosts:
                    b.deleteVHost(name)
            else:
                vh = b.vhosts.get(name) or b.addVHost(name)
                vh.limits = value.get("limits")
        elif kind == "user":
            if value is None:
                b.deleteUser(name)
            else:
                u = b.users.get(name)
                if u is None:
                    u = b.addUser(name, None, value.get("tags", ()))
                u.tags = value.get("tags", u.tags)
                u.salt, u.passwordHash = value["salt"], value["hash"]
                u.hashingAlgorithm = value.get("algorithm", DEFAULT_HASHING)
                if value.get("limits"):
                    b.userLimits[name] = dict(value["limits"])
                else:
                    b.userLimits.pop(name, None)
        elif kind == "permission":
            rec = value if value is not None else old
            if rec is None:
                return
            user, vh = keys.names(name, rec, 2)
            if value is None:
                b.permissions.pop((user, vh), None)
            else:
                b.permissions[(user, vh)] = (value["configure"], value["write"], value["read"])
        elif kind == "global_parameter":
            if value is None:
                b.globalParameters.pop(name, None)
            else:
                b.globalParameters[name] = value["value"]
        elif kind in ("policy", "operator_policy"):
            rec = value if value is not None else old
            if rec is None:
                return
            vh = b.vhosts.get(keys.vhostOf(name, rec) if kind == "policy" else rec.get("vhost"))
            if vh is None:
                return
            if kind == "policy":
                if value is None:
                    b.clearPolicy(vh.name, rec["name"])
                else:
                    b.setPolicy(vh.name, rec["name"], rec["pattern"], rec["definition"],
                                rec.get("priority", 0), rec.get("apply-to", "all"))
            elif value is None:
                vh.clearOperatorPolicy(rec["name"])
            else:
                vh.setOperatorPolicy(OperatorPolicy(rec["name"], rec["pattern"], rec["definition"],
                                                    rec.get("priority", 0), rec.get("apply-to", "all"), vh.name))
