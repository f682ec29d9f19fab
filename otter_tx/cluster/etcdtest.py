"""
Real etcd members on loopback ports, for tests and for a local cluster launcher.

:func:`startEtcd` starts ``members`` ``/usr/bin/etcd`` processes (Debian's ``etcd-server``) on free
127.0.0.1 client and peer ports, each with its own data directory, and fires once every member
answers ``/v3/maintenance/status`` and knows a leader. The data lives on tmpfs (``/dev/shm``) when
it exists, so starts are fast and fsync is cheap: this is for tests and benchmarks, not for data you
keep. The processes die with their parent (``PR_SET_PDEATHSIG`` on Linux) and at interpreter exit.
"""

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid

from twisted.internet import defer, task

from otter_tx.cluster.etcd import EtcdClient, EtcdError

#: where Debian's etcd-server package puts the server
ETCD = "/usr/bin/etcd"

_alive = set()


def _killAll():
    for proc in list(_alive):
        try:
            proc.kill()
            proc.wait(5)
        except Exception:
            pass


atexit.register(_killAll)


def etcdAvailable():
    """Whether the etcd server binary is installed (bool)."""
    return os.access(ETCD, os.X_OK)


def freePort():
    """A TCP port (int) free on 127.0.0.1 right now (the kernel's pick)."""
    return freePorts(1)[0]


def freePorts(n):
    """
    ``n`` distinct TCP ports (list of int) free on 127.0.0.1 right now: all
    bound at once, so the kernel cannot hand the same one out twice (one at a
    time it can, once the first socket closed).
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _dieWithParent():
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass


class EtcdMember:
    """One member: ``name``, ``clientURL``, ``peerURL``, ``dataDir``, ``logPath``, ``proc`` (Popen or None)."""

    def __init__(self, name, clientPort, peerPort, dataDir):
        self.name = name
        self.clientURL = "http://127.0.0.1:%d" % (clientPort,)
        self.peerURL = "http://127.0.0.1:%d" % (peerPort,)
        self.dataDir = dataDir
        self.logPath = dataDir + ".log"
        self.proc = None

    def args(self, initialCluster, token):
        return [ETCD, "--name", self.name, "--data-dir", self.dataDir,
                "--listen-client-urls", self.clientURL, "--advertise-client-urls", self.clientURL,
                "--listen-peer-urls", self.peerURL, "--initial-advertise-peer-urls", self.peerURL,
                "--initial-cluster", initialCluster, "--initial-cluster-token", token,
                "--initial-cluster-state", "new", "--heartbeat-interval", "100", "--election-timeout", "1000"]

    def logTail(self, n=2000):
        try:
            with open(self.logPath, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


class EtcdCluster:
    """
    A running etcd cluster made by :func:`startEtcd`.

    :ivar endpoints: list of the members' client URLs (``"http://127.0.0.1:PORT"``), member order
    :ivar members: list of :class:`EtcdMember`
    :ivar dataDir: the directory holding every member's data and log (removed by :meth:`stop`)

    ``timeout``: seconds :meth:`waitHealthy` waits by default (:func:`startEtcd`'s).
    """

    def __init__(self, members, dataDir, token, reactor, timeout):
        self.members = members
        self.endpoints = [m.clientURL for m in members]
        self.dataDir = dataDir
        self._token = token
        self._initialCluster = ",".join("%s=%s" % (m.name, m.peerURL) for m in members)
        self._reactor = reactor
        self._timeout = timeout

    def _spawn(self, i):
        m = self.members[i]
        log = open(m.logPath, "ab")
        try:
            m.proc = subprocess.Popen(m.args(self._initialCluster, self._token), stdout=log, stderr=log,
                                      stdin=subprocess.DEVNULL, preexec_fn=_dieWithParent)
        finally:
            log.close()
        _alive.add(m.proc)

    def _reap(self, i, sig):
        proc = self.members[i].proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
        if sig == signal.SIGKILL:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            _alive.discard(proc)
            self.members[i].proc = None

    def kill(self, i):
        """SIGKILL member ``i`` (int) and reap it."""
        self._reap(i, signal.SIGCONT)
        self._reap(i, signal.SIGKILL)

    def pause(self, i):
        """SIGSTOP member ``i``: its sockets stay open but it answers nothing."""
        self._reap(i, signal.SIGSTOP)

    def resume(self, i):
        """SIGCONT member ``i``."""
        self._reap(i, signal.SIGCONT)

    def restart(self, i):
        """SIGKILL member ``i`` if running and start it again on its data. Fires once it is healthy."""
        self.kill(i)
        self._spawn(i)
        return self.waitHealthy([i])

    def waitHealthy(self, indexes=None, timeout=None):
        """
        Fire once every member in ``indexes`` (default all) answers its status with a leader; fail with
        :class:`RuntimeError` (with the log's tail) after ``timeout`` seconds (default the start timeout)
        or when a member's process exits.
        """
        indexes = list(range(len(self.members))) if indexes is None else list(indexes)
        return defer.Deferred.fromCoroutine(self._waitHealthy(indexes, timeout or self._timeout))

    async def _waitHealthy(self, indexes, timeout):
        deadline = self._reactor.seconds() + timeout
        pending = set(indexes)
        while pending:
            for i in sorted(pending):
                m = self.members[i]
                if m.proc is None or m.proc.poll() is not None:
                    raise RuntimeError("etcd member %s exited: %s" % (m.name, m.logTail()))
                client = EtcdClient([m.clientURL], self._reactor, timeout=1.0)
                try:
                    st = await client.status()
                    if st["leader"]:
                        # our member, not another test's etcd that took the port first (ours then
                        # exits a moment later): its member list names our peer URL
                        listed = await client._call("/v3/cluster/member/list", {}, True)
                        peers = {u for mem in listed.get("members") or () for u in mem.get("peerURLs") or ()}
                        if m.peerURL not in peers:
                            raise PortTaken("etcd member %s: %s answers for another etcd" % (m.name, m.clientURL))
                        pending.discard(i)
                except EtcdError:
                    pass
                finally:
                    await client.close()
            if not pending:
                return
            if self._reactor.seconds() > deadline:
                raise RuntimeError("etcd members %s not healthy after %ss: %s" % (
                    [self.members[i].name for i in sorted(pending)], timeout,
                    self.members[min(pending)].logTail()))
            await task.deferLater(self._reactor, 0.05, lambda: None)

    def stop(self):
        """Kill every member (paused ones too) and remove the data directory. Safe to call twice."""
        for i in range(len(self.members)):
            self.kill(i)
        shutil.rmtree(self.dataDir, ignore_errors=True)


def _defaultParent():
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


class PortTaken(RuntimeError):
    """A member's client port answers for another etcd (taken between its pick and the start)."""


def startEtcd(members=1, dataDir=None, reactor=None, timeout=15.0):
    """
    Start an etcd cluster of ``members`` processes on free loopback ports.

    :param members: how many members (int, 1 or more)
    :param dataDir: a directory to create the cluster's directory in (default: ``/dev/shm`` when
        writable, else the system temp dir)
    :param reactor: the reactor (default: the global one)
    :param timeout: seconds to wait for every member to be healthy (float)
    :return: a Deferred firing with an :class:`EtcdCluster`; on failure every started process is
        killed and the directory removed. Call its ``stop()`` when done (``addCleanup`` in tests).
    """
    if reactor is None:
        from twisted.internet import reactor
    if not etcdAvailable():
        raise RuntimeError("%s is missing (Debian's etcd-server package)" % (ETCD,))
    def attempt(tries):
        top = tempfile.mkdtemp(prefix="otter-etcd-", dir=dataDir or _defaultParent())
        ports = freePorts(2 * members)
        ms = [EtcdMember("m%d" % (i,), ports[2 * i], ports[2 * i + 1], os.path.join(top, "m%d" % (i,)))
              for i in range(members)]
        cluster = EtcdCluster(ms, top, "otter-" + uuid.uuid4().hex[:12], reactor, timeout)
        try:
            for i in range(members):
                cluster._spawn(i)
        except Exception:
            cluster.stop()
            raise
        d = cluster.waitHealthy()

        def failed(f):
            cluster.stop()
            if f.check(PortTaken) and tries > 1:
                # a port picked free was taken meanwhile by another process: fresh ones
                return attempt(tries - 1)
            return f
        return d.addCallbacks(lambda _: cluster, failed)

    return attempt(3)
