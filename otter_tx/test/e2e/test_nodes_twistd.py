"""
``/api/nodes`` of a real ``twistd -n ottermq`` process: what the tap tells
the management app (``db_dir``, ``config_files``, ``log_files``) and the
process facts (``os_pid``) are the running broker's.
"""

import base64
import json
import os

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from otter_tx.test.e2e import test_twistd


class NodesTwistdTests(TestCase):
    """/api/nodes of a twistd process."""

    timeout = 60
    spawn = test_twistd.ProcessTests.spawn

    @defer.inlineCallbacks
    def test_nodeFacts(self):
        """db_dir is --data-dir, config_files the --config file, log_files <stdout> under -n, os_pid the process's."""
        import treq

        config = os.path.abspath(self.mktemp())
        with open(config, "w") as f:
            f.write("heartbeat = 30\n")
        dataDir = os.path.abspath(self.mktemp())
        proc = self.spawn("ottermq", "--config", config, "--amqp", "tcp:0:interface=127.0.0.1",
                          "--management", "tcp:0:interface=127.0.0.1", "--prometheus", "", "--stream", "none",
                          "--data-dir", dataDir)
        m = yield proc.seen(rb"management http://127\.0\.0\.1:(\d+)/")
        auth = {b"authorization": [b"Basic " + base64.b64encode(b"guest:guest")]}
        r = yield treq.get("http://127.0.0.1:%d/api/nodes" % (int(m.group(1)),), headers=auth, persistent=False)
        [node] = json.loads((yield r.text()))
        self.assertEqual((node["db_dir"], node["config_files"], node["log_files"], node["os_pid"]),
                         (dataDir, [config], ["<stdout>"], str(proc.transport.pid)))
        self.assertEqual(node["contexts"][0]["port"], m.group(1).decode())
        os.kill(proc.transport.pid, 15)
        yield proc.ended
