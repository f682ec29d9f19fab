"""
bench/quorum_cluster.py's pure parts (issue 22): node matching by index
across RabbitMQ's and otter_tx's names, amqp-perf's SUMMARY line, the
argument parser (both brokers) and the report table, including the
otter_tx shape of a result (no Raft probe).  Nothing here starts a broker.
"""

import importlib.util
import io
import os
import sys

from twisted.trial.unittest import SkipTest, SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "bench", "quorum_cluster.py")


def load():
    if not os.path.exists(SCRIPT):
        raise SkipTest("no bench/quorum_cluster.py (not a source checkout)")
    spec = importlib.util.spec_from_file_location("quorum_cluster_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeCluster:
    def __init__(self, names):
        self.names = names

    def name(self, i):
        return self.names[i]


class QuorumClusterBenchTests(SynchronousTestCase):
    def setUp(self):
        self.qc = load()

    def test_nodeIndexRabbit(self):
        """RabbitMQ's node names map to their index; unknown or empty names to None."""
        c = FakeCluster(["c1@localhost", "c2@localhost", "c3@localhost"])
        self.assertEqual([self.qc.nodeIndex(c, n) for n in ("c2@localhost", "c3@localhost", "c9@x", "", None)],
                         [1, 2, None, None, None])

    def test_nodeIndexOtter(self):
        """otter_tx's names match exactly (otter1 is not otter10's prefix match)."""
        c = FakeCluster(["otter1", "otter2", "otter3"])
        self.assertEqual([self.qc.nodeIndex(c, n) for n in ("otter3", "otter1", "otter10")], [2, 0, None])

    def test_onlineIndexes(self):
        """The online list as sorted indexes; a missing list or JSON is empty."""
        c = FakeCluster(["otter1", "otter2", "otter3"])
        self.assertEqual(self.qc.onlineIndexes(c, {"online": ["otter3", "otter1"]}), [0, 2])
        self.assertEqual(self.qc.onlineIndexes(c, {}), [])
        self.assertEqual(self.qc.onlineIndexes(c, None), [])

    def test_perfSummary(self):
        """amqp-perf's SUMMARY line becomes a dict; no such line, None."""
        out = "interval 1\nSUMMARY status=ok sent=10 confirm_rate=123.5 lat_p50_us=900\n"
        self.assertEqual(self.qc.perfSummary(out),
                         {"status": "ok", "sent": "10", "confirm_rate": "123.5", "lat_p50_us": "900"})
        self.assertIsNone(self.qc.perfSummary("nothing\n"))

    def test_parseArgs(self):
        """Both brokers parse; otter_tx node arguments repeat; an unknown part is refused."""
        a = self.qc.parseArgs(["--broker", "otter", "--node-arg=--queue-leader-locator", "--node-arg=client-local",
                               "--rounds", "5", "--catchup-messages", "300000"])
        self.assertEqual((a.broker, a.node_arg, a.rounds, a.catchup_messages, a.etcd_members),
                         ("otter", ["--queue-leader-locator", "client-local"], 5, 300000, 3))
        self.assertEqual(self.qc.parseArgs(["--broker", "rabbitmq"]).parts, "throughput,failover,catchup")
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        self.assertRaises(SystemExit, self.qc.parseArgs, ["--broker", "rabbitmq", "--parts", "bogus"])
        self.assertIn("unknown --parts: bogus", err.getvalue())

    def test_tableOtterShape(self):
        """The table of an otter_tx-shaped result: no Raft probe (raft_up_s absent), a missing value as '-'."""
        a = self.qc.parseArgs(["--broker", "otter"])
        rnd = dict(round=1, killed="otter1", new_leader=None, confirm_ms=120.0, any_confirm_ms=1.0, deliver_ms=None,
                   any_deliver_ms=2.0, leader_ms=130.5, max_confirm_latency_ms=125.0, nacked=0, unconfirmed=3,
                   restart_online_s=1.5, warmup_stalls=["publisher on otter2 ..."], publish_errors=["ChannelClosed()"],
                   publish_error_count=7, consumer_errors=[], consumer_cancels_ms=[101.5])
        cround = dict(round=1, leader="otter1", follower="otter3", publish_rate=1000.0, boot_s=0.5, online_s=2.0,
                      sync_s=2.0, sync_how="in the queue's online list (defined as in sync)")
        summary = {
            "broker": "otter", "version": "otter_tx 0.1.0", "args": vars(a), "loadavg_before": (1.0, 1.0, 1.0),
            "loadavg_after": (2.0, 2.0, 2.0),
            "throughput": {label: dict(node="otter1", confirm_rate=1.0, recv_rate=1.0, lat_p50_ms=None,
                                       lat_p95_ms=None, lat_p99_ms=None, lat_max_ms=None)
                           for label in ("leader", "non-leader")},
            "failover": dict(rnd, deliver_ms=None, rounds=[rnd]),
            "catchup": dict(messages=1000, publish_rate=1000.0, boot_s=0.5, online_s=2.0, raft_up_s=None, sync_s=2.0,
                            sync_how=cround["sync_how"], rounds=[cround]),
        }
        text = self.qc.table(summary)
        self.assertIn("otter3", text)
        self.assertIn("clients moved: publisher on otter2", text)
        self.assertIn("median", text)
        self.assertIn("7 publishes failed", text)
        self.assertIn("cancelled the consumer at [101.5] ms", text)
