"""
The nodes and health room: ``/api/nodes...``, ``/api/healthchecks/node...``,
``/api/health/checks/...`` and ``/api/aliveness-test/{v}``
(``rabbit_mgmt_wm_nodes``, ``_node``, ``_node_memory``, ``_healthchecks``,
``_health_check_*``, ``_aliveness_test``).  This node is the only one.
"""

import re

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater

from otter_tx.amqp.errors import AMQPError
from otter_tx.broker.access import CONFIGURE, READ, WRITE
from otter_tx.web.health import expiringIn, normalizeProtocol, parseWithin
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import MONITOR, VHOST
from otter_tx.web.management.http import (
    EXCHANGE_TYPE_DESCRIPTIONS, Response, badRequest, channelRefusal, notFound, queryFlag,
)
from otter_tx.web.nodes import memoryBreakdown, memUsed, nodeDict, relativeMemory


class NodesRoom(Room):
    """This node, its memory, the health checks and the aliveness test."""

    app = roomApp()

    def __init__(self, root):
        Room.__init__(self, root)
        # in a cluster this node sends its /api/nodes object to the others once a second
        self.broker.describeNode = self._nodeDict

    @app.route("/api/healthchecks/node", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthcheck(self, request, user):
        """
        ``GET /api/healthchecks/node``: ``{"status":"ok"}``, or 503
        ``{"status":"failed","reason":"resource alarm(s) in effect:[...]"}``
        while any alarm is in effect (RabbitMQ 3.10's text, one
        ``{resource_limit,disk|memory,Node}`` per alarm; the store's as
        ``{message_store_unavailable,Node}`` followed by why).
        """
        return self._nodeHealth()

    def _nodeHealth(self):
        alarms = self.broker.alarms
        cluster = self.broker.cluster
        lost = cluster.health() if cluster is not None else None
        if lost is not None:
            # a cluster node that lost etcd (docs/cluster.md, "Failures")
            return Response(503, {"status": "failed", "reason": "cluster metadata store unreachable: %s" % (lost,)})
        if not alarms.active:
            return {"status": "ok"}
        node = alarms.nodeName
        terms = ["{resource_limit,%s,%s}" % (r, node) for r in sorted(alarms.active) if r != "store"]
        if "store" in alarms.active:
            terms.append("{message_store_unavailable,%s}" % (node,))
        reason = "resource alarm(s) in effect:[%s]" % (",".join(terms),)
        if "store" in alarms.active:
            reason += "; message store unavailable: %s" % (alarms.active["store"],)
        return Response(503, {"status": "failed", "reason": reason})

    def _alarmsHealth(self, where):
        alarms = self.broker.alarms.describe()
        if not alarms:
            return {"status": "ok"}
        return Response(503, {"status": "failed", "reason": "There are alarms in effect " + where,
                              "alarms": alarms})

    @app.route("/api/health/checks/alarms", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthAlarms(self, request, user):
        """
        ``GET /api/health/checks/alarms``: ``{"status":"ok"}``, or 503 with
        ``{"status":"failed","reason":"There are alarms in effect in the
        cluster","alarms":[{"node","resource"}]}`` as RabbitMQ 3.10
        (resources ``"disk space"``, ``"memory"``; ours ``"message store"``
        with a ``"reason"`` while the store cannot write).
        """
        return self._alarmsHealth("in the cluster")

    @app.route("/api/health/checks/local-alarms", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthLocalAlarms(self, request, user):
        """``GET /api/health/checks/local-alarms``: as ``alarms``, "...in effect on the node"."""
        return self._alarmsHealth("on the node")

    @app.route("/api/healthchecks/node/<node>", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthcheckNode(self, request, user, node):
        """``GET /api/healthchecks/node/{node}``: as ``/api/healthchecks/node`` for this node, else 404."""
        if node != self.broker.alarms.nodeName:
            raise notFound()
        return self._nodeHealth()

    @staticmethod
    def _healthFailed(body):
        """503 with ``{"status":"failed", ...body}``."""
        return Response(503, dict({"status": "failed"}, **body))

    @app.route("/api/health/checks/certificate-expiration/<within>/<unit>", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthCertificates(self, request, user, within, unit):
        """
        ``GET /api/health/checks/certificate-expiration/{within}/{unit}``
        (unit ``days``, ``weeks``, ``months``, ``years``): 200
        ``{"status":"ok"}``, or 503 ``{"status":"failed","reason":
        "Certificates expiring","expired":[{"node","protocol","interface",
        "port","certfile","cacertfile","certfile_expires_on":
        ["2027-01-05 3:04:05"],"cacertfile_expires_on":[]}]}`` for the TLS
        listeners whose certificate or CA file has a certificate expiring
        within that time (by the app's clock); 400 ``Invalid expiration
        value.`` / ``Time unit not recognised. Supported units: days,
        weeks, months, years.``.  Reads the PEM files on each request.
        """
        try:
            seconds = parseWithin(within, unit)
        except ValueError as e:
            raise badRequest(str(e))
        now = self.clock.seconds()
        expired = []
        for listener in self.root.listeners:
            cert = expiringIn(listener.get("certfile"), now, now + seconds)
            ca = expiringIn(listener.get("cacertfile"), now, now + seconds)
            if cert or ca:
                expired.append({
                    "node": self.broker.alarms.nodeName, "protocol": listener["protocol"],
                    "interface": listener["ip_address"], "port": listener["port"],
                    "certfile": listener.get("certfile"), "cacertfile": listener.get("cacertfile"),
                    "certfile_expires_on": cert, "cacertfile_expires_on": ca,
                })
        if expired:
            return self._healthFailed({"reason": "Certificates expiring", "expired": expired})
        return {"status": "ok"}

    @app.route("/api/health/checks/port-listener/<port>", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthPort(self, request, user, port):
        """
        ``GET /api/health/checks/port-listener/{port}``: 200
        ``{"status":"ok","port":N}`` when a listener of this node is bound
        to it, else 503 ``{"status":"failed","reason":"No active
        listener","missing":N,"ports":[...]}``; 400 ``Invalid port``.
        """
        if not re.match(r"^[+-]?[0-9]+$", port):
            raise badRequest("Invalid port")
        number = int(port)
        ports = sorted(listener["port"] for listener in self.root.listeners)
        if number in ports:
            return {"status": "ok", "port": number}
        return self._healthFailed({"reason": "No active listener", "missing": number, "ports": ports})

    @app.route("/api/health/checks/protocol-listener/<protocol>", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthProtocol(self, request, user, protocol):
        """
        ``GET /api/health/checks/protocol-listener/{protocol}``: 200
        ``{"status":"ok","protocol":"amqp"}`` when this node listens for it
        (RabbitMQ's aliases: ``amqp091``, ``amqp0-9-1``... are ``amqp``,
        ``amqps`` is ``amqp/ssl``, ``management`` is ``http``), else 503
        ``{"status":"failed","reason":"No active listener","missing":
        "amqp/ssl","protocols":["amqp","http"]}``.
        """
        name = normalizeProtocol(protocol)
        protocols = [listener["protocol"] for listener in self.root.listeners]
        if name in protocols:
            return {"status": "ok", "protocol": name}
        return self._healthFailed({"reason": "No active listener", "missing": name, "protocols": protocols})

    @app.route("/api/health/checks/virtual-hosts", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthVHosts(self, request, user):
        """``GET /api/health/checks/virtual-hosts``: 200 ``{"status":"ok"}`` (every vhost runs in the one process)."""
        return {"status": "ok"}

    @app.route("/api/health/checks/node-is-mirror-sync-critical", methods=["GET", "OPTIONS"])
    @app.route("/api/health/checks/node-is-quorum-critical", methods=["GET", "OPTIONS"])
    @endpoint()
    def healthCritical(self, request, user):
        """
        ``GET /api/health/checks/node-is-mirror-sync-critical`` and
        ``.../node-is-quorum-critical``: 200 ``{"status":"ok","reason":
        "single node cluster"}``, as RabbitMQ 3.10 answers on one node.
        """
        return {"status": "ok", "reason": "single node cluster"}

    #: the RabbitMQ plugins whose function is built in and on (``enabled_plugins``)
    ENABLED_PLUGINS = ("rabbitmq_delayed_message_exchange", "rabbitmq_management", "rabbitmq_prometheus")

    def _nodeDict(self, request=None):
        """
        This node as :func:`otter_tx.web.nodes.nodeDict` builds it, with
        ``memory`` / ``binary`` when the query asks (``?memory=true``,
        ``?binary=true``).
        """
        contexts = [{k: v for k, v in c.items() if k not in ("node", "ssl_opts")} for c in self.root.contexts()]
        return nodeDict(
            self.broker, self.clock, int((self.clock.seconds() - self.root.startedAt) * 1000), contexts,
            [{"name": n, "description": d, "enabled": True} for n, d in EXCHANGE_TYPE_DESCRIPTIONS],
            dataDir=self.root.dataDir, configFiles=self.root.configFiles, logFiles=self.root.logFiles,
            enabledPlugins=self.ENABLED_PLUGINS,
            memory=request is not None and queryFlag(request, "memory"),
            binary=request is not None and queryFlag(request, "binary"),
        )

    def _thisNode(self, name):
        """404 unless ``name`` is this node's name (RabbitMQ 3.10 answers 500 for an unknown node)."""
        if name != self.broker.alarms.nodeName:
            raise notFound()

    @app.route("/api/nodes", methods=["GET", "OPTIONS"])
    @endpoint(MONITOR)
    def nodes(self, request, user):
        """
        ``GET /api/nodes``: ``[node]``, this node with RabbitMQ 3.10's keys
        (:func:`otter_tx.web.nodes.nodeDict`): ``mem_used`` (RSS, bytes),
        ``mem_limit`` (the high watermark, bytes), ``mem_alarm``,
        ``disk_free`` (bytes free on the data directory's filesystem at the
        last check), ``disk_free_limit``, ``disk_free_alarm``, ``fd_used`` /
        ``fd_total``, ``uptime`` (ms), ...; ``?memory=true`` and
        ``?binary=true`` add the breakdowns.  401 "Not monitor user" below
        the ``monitoring`` tag.
        """
        return [self._nodeDict(request)] + self._otherNodes()

    def _otherNodes(self):
        """
        In a cluster, the other nodes as each last described itself over its
        link (once a second), ``running`` false while it is unreachable (a
        stopped node stays listed, as a RabbitMQ cluster member does).
        """
        cluster = self.broker.cluster
        if cluster is None:
            return []
        out = []
        for name in sorted(cluster.known - {cluster.name}):
            running = name in cluster.links and name in cluster.nodes
            described = cluster.figures.get(name, {}).get("node")
            # a stopped member (or one not described yet) as RabbitMQ 3.10 shows a stopped one
            d = dict(described) if running and described else {"type": "disc", "cluster_links": []}
            d["name"] = name
            d["running"] = running
            out.append(d)
        return out

    @app.route("/api/nodes/<name>", methods=["GET", "OPTIONS"])
    @endpoint(MONITOR)
    def node(self, request, user, name):
        """
        ``GET /api/nodes/{name}``: this node as in ``/api/nodes``; another
        node of the cluster as it last described itself; 404 for a name not
        in the cluster.
        """
        cluster = self.broker.cluster
        if cluster is not None and name != self.broker.alarms.nodeName:
            for d in self._otherNodes():
                if d["name"] == name:
                    return d
        self._thisNode(name)
        return self._nodeDict(request)

    @app.route("/api/nodes/<name>/memory", methods=["GET", "OPTIONS"])
    @endpoint(MONITOR)
    def nodeMemory(self, request, user, name):
        """
        ``GET /api/nodes/{name}/memory``: ``{"memory": breakdown}`` (bytes,
        :func:`otter_tx.web.nodes.memoryBreakdown`); 404 for another name.
        """
        self._thisNode(name)
        return {"memory": memoryBreakdown(self.broker, memUsed(self.broker))}

    @app.route("/api/nodes/<name>/memory/relative", methods=["GET", "OPTIONS"])
    @endpoint(MONITOR)
    def nodeMemoryRelative(self, request, user, name):
        """
        ``GET /api/nodes/{name}/memory/relative``: ``{"memory": {"total":
        100, key: percent}}`` (whole percentages of RSS); 404 for another name.
        """
        self._thisNode(name)
        return {"memory": relativeMemory(memoryBreakdown(self.broker, memUsed(self.broker)))}

    @app.route("/api/aliveness-test/<vhost>", methods=["GET", "OPTIONS"])
    @endpoint(VHOST)
    def aliveness(self, request, user, vhost):
        """
        ``GET /api/aliveness-test/{vhost}``: declares queue
        ``aliveness-test``, publishes ``test_message`` to it and gets it
        back, as RabbitMQ 3.10 does; ``{"status":"ok"}``.  Runs with the
        user's permissions (configure and read on ``aliveness-test``, write
        on ``amq.default``): 401 with the full ``ACCESS_REFUSED`` text.
        """
        vh = self._vhost(vhost)
        session = self._session(user, vh)
        try:
            session.access.checkAll([
                (CONFIGURE, "queue", "aliveness-test"), (WRITE, "exchange", ""), (READ, "queue", "aliveness-test"),
            ])
        except AMQPError as e:
            raise channelRefusal(e)
        declared = session.declareQueue("aliveness-test")
        if isinstance(declared, Deferred):
            # a cluster: the queue is new, or lives on another node
            return self._alivenessLater(session, declared)
        routed, _ = session.publish(session.publishTarget(""), "aliveness-test", False, b"\x00\x00",
                                    b"test_message", props={})
        got = session.get("aliveness-test")
        if got is not None:
            session.ack(got[0])
        if not routed or got is None:
            return Response(503, {"status": "failed", "reason": "aliveness test failed"})
        return {"status": "ok"}

    @inlineCallbacks
    def _alivenessLater(self, session, declared):
        """The aliveness test when the queue's declare or get is answered later (a cluster)."""
        yield declared
        routed, _ = session.publish(session.publishTarget(""), "aliveness-test", False, b"\x00\x00",
                                    b"test_message", props={})
        got = None
        for _ in range(50):
            got = yield session.get("aliveness-test")
            if got is not None or not routed:
                break
            yield deferLater(self.clock, 0.01, lambda: None)
        if got is not None:
            session.ack(got[0])
        if not routed or got is None:
            return Response(503, {"status": "failed", "reason": "aliveness test failed"})
        return {"status": "ok"}
