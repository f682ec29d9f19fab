"""
A local otter_tx cluster on one machine (docs/cluster.md, "One machine, all
cores"): a local etcd and N ``twistd ottermq`` nodes, each its own process
(so each has a core), with its own data directory and ports.

From a shell (runs until Ctrl-C; prints each node's AMQP and management
ports)::

    python -m otter_tx.cluster.local --nodes 2 [--amqp-base 5672] [--shared-port 5672]

``--shared-port P`` makes every node listen on the same AMQP port with
``SO_REUSEPORT`` so the kernel spreads connections over the nodes.  From
tests and benchmarks: :class:`LocalCluster`.
"""

import os
import re
import shutil
import signal
import sys
import tempfile

from twisted.internet import defer, protocol

from otter_tx.cluster.etcdtest import freePort, startEtcd

_PORT_LINE = re.compile(rb"otter_tx ready: .*?amqp://[^:]+:(\d+)")
_MGMT_LINE = re.compile(rb"management http://[^:]+:(\d+)")


class _NodeProcess(protocol.ProcessProtocol):
    def __init__(self, name, echo=False, logPath=None):
        self.name = name
        self.echo = echo
        # the node's log, also kept in a file beside its data directory
        self.log = open(logPath, "ab") if logPath else None
        self.output = b""
        self.ready = defer.Deferred()
        self.ended = defer.Deferred()
        self.exited = False

    def outReceived(self, data):
        self.output += data
        if self.log is not None:
            self.log.write(data)
            self.log.flush()
        if len(self.output) > 1 << 20:
            self.output = self.output[-(1 << 19):]
        if self.echo:
            sys.stdout.write(data.decode("utf-8", "replace"))
        if not self.ready.called and b"otter_tx ready" in self.output:
            self.ready.callback(None)
        elif not self.ready.called and b"otter_tx cannot start" in self.output:
            self.ready.errback(RuntimeError("node %s cannot start:\n%s" % (
                self.name, self.output.decode("utf-8", "replace")[-3000:])))

    errReceived = outReceived

    def processEnded(self, reason):
        self.exited = True
        if self.log is not None:
            self.log.close()
            self.log = None
        if not self.ready.called:
            self.ready.errback(RuntimeError("node %s exited:\n%s" % (
                self.name, self.output.decode("utf-8", "replace")[-3000:])))
        self.ended.callback(None)


class LocalNode:
    """One node: ``name``, ``amqpPort``, ``managementPort``, ``dataDir``, ``pid``."""

    def __init__(self, cluster, name, amqpPort, managementPort, dataDir):
        self.cluster = cluster
        self.name = name
        self.amqpPort = amqpPort
        self.managementPort = managementPort
        #: the node's stream protocol port (docs/streams.md, "In a cluster")
        self.streamPort = freePort()
        #: its link port, chosen here too: a link on tcp:0 could be given a port picked above
        #: before that listener opens
        self.linkPort = freePort()
        self.dataDir = dataDir
        self.process = None
        self.transport = None

    @property
    def pid(self):
        return self.transport.pid if self.transport is not None else None

    def start(self):
        c = self.cluster
        amqp = "tcp:%d:interface=127.0.0.1" % (self.amqpPort,)
        if c.sharedPort:
            amqp = "otterreuse:%d:interface=127.0.0.1" % (c.sharedPort,)
        args = [c.python, "-c", "from twisted.scripts.twistd import run; run()",
                "--nodaemon", "--pidfile=", "ottermq",
                "--amqp", amqp, "--management", "tcp:%d:interface=127.0.0.1" % (self.managementPort,),
                "--prometheus", "none", "--stream", "tcp:%d:interface=127.0.0.1" % (self.streamPort,),
                "--data-dir", self.dataDir,
                "--cluster-etcd", ",".join(c.etcd.endpoints), "--node-name", self.name,
                "--cluster-link", "tcp:%d:interface=127.0.0.1" % (self.linkPort,)]
        args += c.extraArgs
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        env.update(c.env)
        self.process = _NodeProcess(self.name, c.echo, self.dataDir + ".log")
        self.transport = c.reactor.spawnProcess(self.process, c.python, args, env=env, path=root)
        return self.process.ready

    def kill(self, sig=signal.SIGKILL):
        """Send ``sig`` (SIGKILL by default); a Deferred firing once it exited (not for SIGSTOP)."""
        if self.process is None or self.process.exited:
            return defer.succeed(None)
        os.kill(self.transport.pid, sig)
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            return defer.succeed(None)
        return self.process.ended

    def stop(self):
        return self.kill(signal.SIGTERM)


class LocalCluster:
    """
    A local etcd (``etcdMembers`` members) and ``nodes`` otter_tx nodes
    ``otter1``..``otterN``.  :meth:`start` fires when every node said
    ready; :meth:`stop` ends every process and removes the directories.
    """

    def __init__(self, reactor, nodes=3, etcdMembers=1, dataDir=None, sharedPort=None, extraArgs=(),
                 python=None, env=None, echo=False):
        self.reactor = reactor
        self.count = nodes
        self.etcdMembers = etcdMembers
        self.top = tempfile.mkdtemp(prefix="otter-cluster-", dir=dataDir)
        self.sharedPort = sharedPort
        self.extraArgs = list(extraArgs)
        self.python = python or sys.executable
        self.env = dict(env or {})
        self.echo = echo
        self.etcd = None
        self.nodes = []

    @defer.inlineCallbacks
    def start(self):
        self.etcd = yield startEtcd(self.etcdMembers, reactor=self.reactor)
        for i in range(self.count):
            name = "otter%d" % (i + 1,)
            self.nodes.append(LocalNode(self, name, freePort(), freePort(), os.path.join(self.top, name)))
        # one at a time: each start is quick, and the first creates the defaults
        for n in self.nodes:
            for attempt in range(3):
                try:
                    yield n.start()
                    break
                except RuntimeError as e:
                    # a port picked free was taken meanwhile (another process's outgoing
                    # connection): the same node on fresh ports
                    if "Address already in use" not in str(e) or attempt == 2:
                        raise
                    yield n.kill()
                    n.amqpPort, n.managementPort = freePort(), freePort()
                    n.streamPort, n.linkPort = freePort(), freePort()
        return self

    @defer.inlineCallbacks
    def stop(self):
        for n in self.nodes:
            if n.process is not None and not n.process.exited:
                try:
                    os.kill(n.transport.pid, signal.SIGCONT)
                    os.kill(n.transport.pid, signal.SIGKILL)
                except OSError:
                    pass
                yield n.process.ended
        if self.etcd is not None:
            self.etcd.stop()
        if not os.environ.get("OTTER_KEEP_CLUSTER"):
            # (OTTER_KEEP_CLUSTER=1 keeps the data directories and the nodes' logs, to read)
            shutil.rmtree(self.top, ignore_errors=True)


def main(argv=None):
    import argparse

    from twisted.internet import reactor

    p = argparse.ArgumentParser(prog="python -m otter_tx.cluster.local",
                                description="Run a local etcd and N otter_tx nodes until Ctrl-C.")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--etcd-members", type=int, default=1)
    p.add_argument("--shared-port", type=int, default=None,
                   help="every node listens on this AMQP port (SO_REUSEPORT)")
    p.add_argument("--dir", default=None, help="where the data directories go (default: a temp dir)")
    p.add_argument("--locator", default="client-local", choices=("client-local", "balanced"),
                   help="the nodes' queue leader locator")
    p.add_argument("--python", default=None, help="the interpreter the nodes run on (default: this one)")
    p.add_argument("node_args", nargs="*", help="after --: more twistd ottermq options for every node")
    a = p.parse_args(argv)
    cluster = LocalCluster(reactor, a.nodes, a.etcd_members, a.dir, a.shared_port,
                           extraArgs=["--queue-leader-locator", a.locator] + a.node_args, python=a.python)

    def started(c):
        print("etcd: %s" % (",".join(c.etcd.endpoints),))
        print("logs: %s/<node>.log" % (c.top,))
        for n in c.nodes:
            print("%s: amqp 127.0.0.1:%d  stream 127.0.0.1:%d  management http://127.0.0.1:%d  pid %d" % (
                n.name, c.sharedPort or n.amqpPort, n.streamPort, n.managementPort, n.pid))
        sys.stdout.flush()

    def failed(f):
        print(f.getErrorMessage())
        reactor.stop()

    reactor.callWhenRunning(lambda: cluster.start().addCallbacks(started, failed))
    reactor.addSystemEventTrigger("before", "shutdown", cluster.stop)
    # started in the background by a shell, SIGINT arrives ignored, and Twisted then leaves it
    # so: Ctrl-C or a SIGINT from a script must stop the nodes and etcd, and this process
    signal.signal(signal.SIGINT, signal.default_int_handler)
    reactor.run()


if __name__ == "__main__":
    main()
