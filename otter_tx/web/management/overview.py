"""
The overview room: ``/api/overview``, ``/api/whoami``, and the admin web
app's files at ``/`` and ``/static/`` (:mod:`otter_tx.web.webapp`).  It
also answers every path no other room claims: 404 ``Object Not Found``.
"""

from otter_tx import __version__
from otter_tx.broker import stats
from otter_tx.broker.policy import OPERATOR_POLICY_KEYS, POLICY_KEYS
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import NONE
from otter_tx.web.management.http import (
    EXCHANGE_TYPE_DESCRIPTIONS, RABBITMQ_COMPAT_VERSION, notFound, queryFlag,
)
from otter_tx.web.webapp import CONTENT_SECURITY_POLICY, serveFile


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


class OverviewRoom(Room):
    """The overview, whoami and the admin web app."""

    app = roomApp()

    def __init__(self, root):
        Room.__init__(self, root)
        broker = self.broker
        # in a cluster this node sends its connection and channel counts to the others once a second
        broker.describeOverview = self._ownFigures

    def _ownFigures(self):
        """
        What this node sends the others once a second in a cluster: its
        connection and channel counts and its own ``message_stats`` (counts
        and current rates, every vhost), which their overviews add to theirs.
        """
        broker = self.broker
        vhosts = list(broker.vhosts.values())
        values = stats.sumValues([stats.vhostValues(vh) for vh in vhosts], len(stats.VHOST_KEYS))
        own = fmt.RateView(broker.sampler).messageStats("overview", broker, stats.VHOST_KEYS, values)
        return {
            "connections": len(broker.connections) + len(fmt.streamConnections(broker)),
            "channels": sum(len(c.channels) for c in broker.connections),
            "message_stats": {k: ({"rate": v.get("rate", 0.0)} if k.endswith("_details") else v)
                              for k, v in own.items()},
        }

    @app.route("/api/overview", methods=["GET", "OPTIONS"])
    @endpoint()
    def overview(self, request, user):
        """
        ``GET /api/overview``.  ``product_name``/``product_version`` are
        otter_tx's; ``rabbitmq_version``/``management_version`` report the
        RabbitMQ release whose API is reproduced (:data:`RABBITMQ_COMPAT_VERSION`),
        which tools such as rabbitmqadmin and exporters parse.  Otter-only:
        ``policy_keys``, ``{"policies": [key...], "operator-policies":
        [key...]}``, the definition keys each kind accepts.
        """
        vhosts = self._visibleVHosts(user)
        queues = [q for vh in vhosts for q in vh.queues.values()]
        conns = [c for c in self._visibleConnections(user) if c.vhost in vhosts or c.vhost is None]
        # stream protocol connections and their subscriptions count too (as on the 3.10 peer)
        names = {vh.name for vh in vhosts}
        streamConns = [c for c in fmt.streamConnections(self.broker,
                                                    None if self._isMonitor(user) else user.name)
                       if c.vhost in names]
        view = self._rateView(request)
        broker = self.broker
        if len(vhosts) == len(broker.vhosts):
            # the node's own series (what the sampler recorded for every vhost)
            values = stats.sumValues([stats.vhostValues(vh) for vh in vhosts], len(stats.VHOST_KEYS))
            messageStats = view.messageStats("overview", broker, stats.VHOST_KEYS, values)
            queueTotals = view.lengthStats("overview-lengths", broker, stats.lengthValues(queues))
        else:
            # a user who sees some vhosts: the sum of theirs, rates included
            messageStats = _sumStats([view.messageStats("vhost", vh, stats.VHOST_KEYS, stats.vhostValues(vh))
                                      for vh in vhosts])
            queueTotals = _sumStats([view.lengthStats("vhost-lengths", vh, stats.lengthValues(vh.queues.values()))
                                     for vh in vhosts])
        # a down node's queues are not counted (as RabbitMQ 3.10's totals)
        remote = [q for vh in vhosts for q in vh.remoteQueues.values() if not q.down]
        if remote:
            # a cluster: the lengths of the queues of other nodes, from their last figures
            for q in remote:
                f = q.figures
                ready, unacked = f.get("messages_ready", 0), f.get("messages_unacknowledged", 0)
                for key, n in (("messages", ready + unacked), ("messages_ready", ready),
                               ("messages_unacknowledged", unacked)):
                    queueTotals[key] = queueTotals.get(key, 0) + n
        objectTotals = {
            "channels": sum(len(c.channels) for c in conns),
            "connections": len(conns) + len(streamConns),
            "consumers": (sum(len(q.consumers) for q in queues) + sum(q.figures.get("consumers", 0) for q in remote)
                          + sum(len(c.subscriptions) for c in streamConns)),
            "exchanges": sum(len(vh.exchanges) for vh in vhosts),
            "queues": len(queues) + len(remote),
        }
        cluster = broker.cluster
        if cluster is not None and len(vhosts) == len(broker.vhosts):
            # the connections and channels of the other nodes, as each last counted them,
            # and their message counts and rates (their samples stay theirs)
            others = [cluster.figures.get(name, {}).get("overview") or {} for name in cluster.links]
            for counts in others:
                objectTotals["connections"] += counts.get("connections", 0)
                objectTotals["channels"] += counts.get("channels", 0)
            messageStats = _sumStats([messageStats] + [c.get("message_stats") or {} for c in others])
        return {
            "product_name": "otter_tx",
            "product_version": __version__,
            "rabbitmq_version": RABBITMQ_COMPAT_VERSION,
            "management_version": RABBITMQ_COMPAT_VERSION,
            "rates_mode": "basic",
            "sample_retention_policies": stats.SAMPLE_RETENTION_POLICIES,
            "cluster_name": self.broker.globalParameters.get("cluster_name", fmt.NODE),
            "node": fmt.nodeName(broker),
            "erlang_version": None,
            "erlang_full_version": None,
            "disable_stats": queryFlag(request, "disable_stats"),
            "enable_queue_totals": queryFlag(request, "enable_queue_totals"),
            "exchange_types": [
                {"name": n, "description": d, "enabled": True} for n, d in EXCHANGE_TYPE_DESCRIPTIONS
            ],
            # otter-only: the definition keys policies and operator policies accept (the web app's forms)
            "policy_keys": {"policies": sorted(POLICY_KEYS), "operator-policies": list(OPERATOR_POLICY_KEYS)},
            "message_stats": messageStats,
            "churn_rates": view.messageStats("churn", broker, stats.CHURN_KEYS, stats.churnValues(broker.counters)),
            "queue_totals": queueTotals,
            "object_totals": objectTotals,
            "statistics_db_event_queue": 0,
            "listeners": self.root.listenersList(),
            "contexts": self.root.contexts(),
        }

    @app.route("/api/whoami", methods=["GET", "OPTIONS"])
    @endpoint()
    def whoami(self, request, user):
        """``GET /api/whoami``: ``{name, tags}`` (tags a list, as 3.10)."""
        return {"name": user.name, "tags": list(user.tags)}

    @app.route("/", methods=["GET"])
    @endpoint(NONE)
    def index(self, request, user):
        """
        ``GET /``: the admin web app's page (:mod:`otter_tx.web.webapp`); it
        asks for credentials itself and uses the JSON API with them.
        """
        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"content-security-policy", CONTENT_SECURITY_POLICY)
        return serveFile(request, "index.html")

    @app.route("/static/<path:path>", methods=["GET"])
    @endpoint(NONE)
    def staticFile(self, request, user, path):
        """``GET /static/{path}``: the app's files with their content types; 404 for anything else."""
        body = serveFile(request, path)
        if body is None:
            raise notFound()
        return body
