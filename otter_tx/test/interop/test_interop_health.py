"""
Interop tests for the health checks (``/api/health/checks/*``,
``/api/healthchecks/node``) and the overview's ``contexts`` over real HTTP,
against the in-process broker or, with ``OTTER_TEST_AMQP_URL`` and
``OTTER_TEST_MGMT_URL``, RabbitMQ.  Nothing is created; the broker must be
free of alarms.
"""

import time
from urllib.parse import urlparse

from otter_tx.test.interop.support import InteropTestCase, ManagementMixin


class HealthCheckTests(ManagementMixin, InteropTestCase):
    """The checks answer with RabbitMQ 3.10's statuses and bodies."""

    def http(self, path):
        """``(status, JSON)`` of ``GET path`` as guest."""
        return self.mgmtCall("GET", path)

    def test_listeners(self):
        """The AMQP port and protocol pass (with and without a slash); a missing protocol is 503 naming it."""
        def run():
            return [self.http(p) for p in (
                "/api/health/checks/port-listener/%d" % (self.port,),
                "/api/health/checks/port-listener/%d/" % (self.port,),
                "/api/health/checks/protocol-listener/amqp091",
                "/api/health/checks/protocol-listener/amqp0-9-1/",
                "/api/health/checks/protocol-listener/stomp",
                "/api/health/checks/port-listener/abc",
            )]

        def check(r):
            port, portSlash, amqp, amqpSlash, stomp, bad = r
            self.assertEqual(port, (200, {"status": "ok", "port": self.port}))
            self.assertEqual(portSlash, port)
            self.assertEqual(amqp, (200, {"status": "ok", "protocol": "amqp"}))
            self.assertEqual(amqpSlash, amqp)
            self.assertEqual(stomp[0], 503)
            self.assertEqual({k: stomp[1][k] for k in ("status", "reason", "missing")},
                             {"status": "failed", "reason": "No active listener", "missing": "stomp"})
            self.assertIn("amqp", stomp[1]["protocols"])
            self.assertEqual(bad, (400, {"error": "bad_request", "reason": "Invalid port"}))

        return self.inThread(run).addCallback(check)

    def test_nodeChecks(self):
        """The node, vhost and single-node checks pass; certificate-expiration checks its arguments."""
        def run():
            return [self.http(p) for p in (
                "/api/healthchecks/node",
                "/api/healthchecks/node/",
                "/api/health/checks/virtual-hosts",
                "/api/health/checks/node-is-quorum-critical",
                "/api/health/checks/node-is-mirror-sync-critical/",
                "/api/health/checks/certificate-expiration/1/days",
                "/api/health/checks/certificate-expiration/1/fortnights",
                "/api/health/checks/certificate-expiration/soon/days",
            )]

        def check(r):
            ok = (200, {"status": "ok"})
            single = (200, {"status": "ok", "reason": "single node cluster"})
            self.assertEqual(r[:5], [ok, ok, ok, single, single])
            self.assertEqual(r[5], ok)
            self.assertEqual(r[6], (400, {"error": "bad_request", "reason":
                                          "Time unit not recognised. Supported units: days, weeks, months, years."}))
            self.assertEqual(r[7], (400, {"error": "bad_request", "reason": "Invalid expiration value."}))

        return self.inThread(run).addCallback(check)

    def test_overviewContexts(self):
        """The overview has one management context on the API's port (a string), and an amqp listener."""
        def check(r):
            code, overview = r
            self.assertEqual(code, 200)
            port = str(urlparse(self.mgmtBase()).port)
            [ctx] = [c for c in overview["contexts"] if c["port"] == port]
            self.assertEqual({k: ctx[k] for k in ("description", "path", "ssl_opts")},
                             {"description": "RabbitMQ Management", "path": "/", "ssl_opts": []})
            self.assertIn(("amqp", self.port),
                          [(l["protocol"], l["port"]) for l in overview["listeners"]])

        def run():
            # RabbitMQ lists a node's contexts from its periodic node stats
            # (rabbit_mgmt_external_stats, every 5 s), so right after the
            # node starts they may not be there yet: ask again, bounded.
            for _ in range(60):
                code, overview = self.http("/api/overview")
                if code != 200 or overview.get("contexts"):
                    break
                time.sleep(0.5)
            return code, overview

        return self.inThread(run).addCallback(check)
