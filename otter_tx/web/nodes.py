"""
The node objects of ``GET /api/nodes`` and ``/api/nodes/{name}``, in
RabbitMQ 3.10's shape (``rabbit_mgmt_wm_nodes``, ``rabbit_mgmt_wm_node``,
``rabbit_mgmt_wm_node_memory``; https://www.rabbitmq.com/docs/management,
"HTTP API"), for the one node otter_tx is.

What an Erlang node reports and a Python process has no counterpart for is
answered as honestly as we can (docs/management.md, "Nodes"):

* ``proc_used`` / ``proc_total``: Erlang processes there are none of; we give
  the OS threads of the broker process (``/proc/self/task``) and the
  process's thread limit (the soft ``RLIMIT_NPROC``, else the kernel's
  ``threads-max``, else ``proc_used``).
* ``run_queue``: the reactor's timed calls already due and not yet run (work
  waiting for the one thread), where Erlang counts runnable processes.
* ``sockets_used``: open AMQP connections; ``sockets_total`` the file
  descriptor limit (there is no separate socket budget).
* ``net_ticktime``: RabbitMQ's default (60 s); there is no Erlang
  distribution to tick.
* ``?memory=true``: RabbitMQ's breakdown keys, with what we can attribute
  (queued message bytes under ``queue_procs``, connections under
  ``connection_other``, the rest of RSS under ``other_proc``) and 0 for the
  Erlang-only categories; ``?binary=true`` likewise, message bodies under
  ``queue_procs``.

No function here touches a transport; everything is read from the broker,
its alarm monitors and the process (``/proc``, ``resource``).
"""

import os
import platform

from otter_tx import __version__
from otter_tx.resources.alarms import totalMemoryBytes
from otter_tx.resources.process_memory import CONNECTION_BYTES, rssBytes
from otter_tx.web import _format as fmt
from otter_tx.web.metrics import distVersion, maxFds, openFds

#: connection.start's SASL mechanisms with RabbitMQ 3.10's descriptions
AUTH_MECHANISMS = (
    ("PLAIN", "SASL PLAIN authentication mechanism"),
    ("AMQPLAIN", "QPid AMQPLAIN mechanism"),
    # offered on TLS connections with a verified client certificate (docs/tls.md)
    ("EXTERNAL", "TLS peer verification-based authentication plugin. Used in combination with the "
                 "EXTERNAL SASL mechanism."),
)

#: RabbitMQ's memory breakdown keys (``rabbit_vm:memory/0``), in its order
MEMORY_KEYS = (
    "connection_readers", "connection_writers", "connection_channels", "connection_other",
    "queue_procs", "queue_slave_procs", "quorum_queue_procs", "quorum_queue_dlx_procs",
    "stream_queue_procs", "stream_queue_replica_reader_procs", "stream_queue_coordinator_procs",
    "plugins", "other_proc", "metrics", "mgmt_db", "mnesia", "quorum_ets", "other_ets", "binary",
    "msg_index", "code", "atom", "other_system", "allocated_unused", "reserved_unallocated",
)

#: RabbitMQ's binary breakdown keys (``rabbit_vm:binary/0``), in its order
BINARY_KEYS = (
    "connection_readers", "connection_writers", "connection_channels", "connection_other",
    "queue_procs", "queue_slave_procs", "quorum_queue_procs", "quorum_queue_dlx_procs",
    "stream_queue_procs", "stream_queue_replica_reader_procs", "stream_queue_coordinator_procs",
    "plugins", "mgmt_db", "msg_index", "other",
)

#: the distributions whose versions ``applications`` lists (otter_tx first)
_APPLICATIONS = (
    ("twisted", "Twisted", "An asynchronous networking framework written in Python"),
    ("klein", "klein", "The management HTTP app's router"),
    ("prometheus_client", "prometheus_client", "Prometheus exposition format"),
    ("zope.interface", "zope.interface", "Interfaces for Python"),
)


def applications():
    """
    ``applications``: ``[{"name", "description", "version"}]``, otter_tx
    itself, the Python runtime and the libraries it runs on, sorted by name
    as RabbitMQ sorts its OTP applications.
    """
    apps = [{"name": "otter_tx", "description": "otter_tx AMQP 0-9-1 broker", "version": __version__},
            {"name": platform.python_implementation().lower(),
             "description": "%s %s" % (platform.python_implementation(), platform.python_version()),
             "version": platform.python_version()}]
    for name, dist, description in _APPLICATIONS:
        apps.append({"name": name, "description": description, "version": distVersion(dist)})
    return sorted(apps, key=lambda a: a["name"])


def threadsUsed():
    """OS threads of this process (int): ``/proc/self/task`` entries, else ``threading.active_count()``."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def threadsTotal(used):
    """
    The process's thread limit (int): the soft ``RLIMIT_NPROC``, else the
    kernel's ``/proc/sys/kernel/threads-max``, else ``used``.
    """
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and soft > 0:
            return soft
    except (ImportError, AttributeError, OSError, ValueError):
        pass
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return used


def runQueue(clock):
    """The clock's timed calls already due and not yet run (int; 0 when the clock cannot tell)."""
    getDelayedCalls = getattr(clock, "getDelayedCalls", None)
    if getDelayedCalls is None:
        return 0
    now = clock.seconds()
    return sum(1 for call in getDelayedCalls() if call.active() and call.getTime() <= now)


def memUsed(broker):
    """``mem_used``: the process's RSS (int, bytes), else the broker's message-bytes estimate (no ``/proc``)."""
    used = rssBytes()
    return broker.messageBytesEstimate() if used is None else used


def memoryBreakdown(broker, rss):
    """
    ``memory`` (``?memory=true`` and ``/api/nodes/{name}/memory``): RabbitMQ's
    keys (:data:`MEMORY_KEYS`, bytes), queued messages under
    ``queue_procs``, the connections' estimate under ``connection_other``,
    the rest of ``rss`` under ``other_proc``, 0 elsewhere; ``strategy``
    ``"rss"`` and ``total`` ``{"erlang", "rss", "allocated"}`` (all RSS:
    Python has one heap).
    """
    messages = broker.messageBytesEstimate()
    connections = len(broker.connections) * CONNECTION_BYTES
    out = dict.fromkeys(MEMORY_KEYS, 0)
    out["queue_procs"] = messages
    out["connection_other"] = connections
    out["other_proc"] = max(0, rss - messages - connections)
    out["strategy"] = "rss"
    out["total"] = {"erlang": rss, "rss": rss, "allocated": rss}
    return out


def relativeMemory(breakdown):
    """
    ``/api/nodes/{name}/memory/relative``: ``{"total": 100, key: percent}``
    with each :data:`MEMORY_KEYS` value as a whole percentage of the RSS
    total, as ``rabbit_mgmt_wm_node_memory`` rounds them.
    """
    total = breakdown["total"]["rss"] or 1
    out = {"total": 100}
    for key in MEMORY_KEYS:
        out[key] = int(round(100.0 * breakdown[key] / total))
    return out


def binaryBreakdown(broker):
    """
    ``binary`` (``?binary=true``): :data:`BINARY_KEYS`, the ready message bodies (bytes) under
    ``queue_procs``, 0 elsewhere.
    """
    out = dict.fromkeys(BINARY_KEYS, 0)
    out["queue_procs"] = broker.queuedBytes()
    return out


def nodeDict(broker, clock, uptimeMs, contexts, exchangeTypes, ratesMode="basic", dataDir=None,
             configFiles=(), logFiles=(), enabledPlugins=(), memory=False, binary=False):
    """
    One node object as RabbitMQ 3.10's ``/api/nodes`` (see the module
    docstring for the keys an Erlang node alone has).

    :param broker: the Broker (its ``alarms`` and their monitors).
    :param clock: ``IReactorTime`` (for ``run_queue``).
    :param uptimeMs: int, ms since the management app started.
    :param contexts: the node's HTTP contexts (list of dicts).
    :param exchangeTypes: ``[{"name","description","enabled"}]``.
    :param dataDir: ``db_dir`` (str or None for no durable state: ``""``).
    :param configFiles: ``config_files`` (paths, str).
    :param logFiles: ``log_files`` (paths, or ``"<stdout>"``).
    :param enabledPlugins: ``enabled_plugins`` (the RabbitMQ plugin names
        whose function is on).
    :param memory: add ``memory`` (:func:`memoryBreakdown`).
    :param binary: add ``binary`` (:func:`binaryBreakdown`).
    """
    alarms = broker.alarms
    disk = alarms.monitors.get("disk")
    mem = alarms.monitors.get("memory")
    used = memUsed(broker)
    fds = openFds()
    fdTotal = maxFds()
    if fds is None:
        fds = 0
    if fdTotal is None:
        fdTotal = fds
    procUsed = threadsUsed()
    node = {
        "name": alarms.nodeName,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "os_pid": str(os.getpid()),
        "uptime": uptimeMs,
        "run_queue": runQueue(clock),
        "processors": os.cpu_count() or 1,
        "rates_mode": ratesMode,
        "partitions": [],
        "mem_used": used,
        "mem_used_details": fmt.rate(),
        "mem_limit": mem.watermark if mem is not None else totalMemoryBytes(),
        "mem_alarm": "memory" in alarms.active,
        "mem_calculation_strategy": "rss",
        "disk_free": disk.free if disk is not None and disk.free is not None else 0,
        "disk_free_details": fmt.rate(),
        "disk_free_limit": disk.limit if disk is not None else 0,
        "disk_free_alarm": "disk" in alarms.active,
        "fd_used": fds,
        "fd_used_details": fmt.rate(),
        "fd_total": fdTotal,
        "sockets_used": len(broker.connections),
        "sockets_used_details": fmt.rate(),
        "sockets_total": fdTotal,
        "proc_used": procUsed,
        "proc_used_details": fmt.rate(),
        "proc_total": threadsTotal(procUsed),
        "exchange_types": list(exchangeTypes),
        "auth_mechanisms": [{"name": n, "description": d, "enabled": True} for n, d in AUTH_MECHANISMS],
        "applications": applications(),
        "contexts": list(contexts),
        "log_files": list(logFiles),
        "config_files": list(configFiles),
        "db_dir": dataDir or "",
        "enabled_plugins": list(enabledPlugins),
        "net_ticktime": 60,
        "cluster_links": [],
    }
    if memory:
        node["memory"] = memoryBreakdown(broker, used)
    if binary:
        node["binary"] = binaryBreakdown(broker)
    return node
