"""
``twistd ottermq``: command-line options and ``makeService``.

Every option can also come from ``--config FILE``, a TOML file whose keys
are the long option names with ``-`` or ``_`` (``amqp = ["tcp:5672"]``,
``heartbeat = 30``) plus ``[[policies]]`` tables (``vhost``, ``name``,
``pattern``, ``definition``, ``priority``, ``apply-to``).  Command-line
options win over the file.
"""

import os
import tomllib

from twisted.python import usage

_DEFAULTS = {
    "amqp": ["tcp:5672"],
    "management": ["tcp:15672"],
    "data-dir": "./ottermq-data",
    "default-user": "guest",
    "default-pass": "guest",
    "loopback-users": "guest",
    "heartbeat": 60,
    "frame-max": 131072,
    "channel-max": 2047,
    "handshake-timeout": 10.0,
    "memory-high-watermark": None,
    "consumer-timeout": 1800000,
}


class Options(usage.Options):
    """
    Options for ``twistd ottermq``.
    """

    synopsis = "[twistd options] ottermq [options]"
    longdesc = (
        "Run otter_tx, a RabbitMQ-compatible AMQP 0-9-1 broker. Endpoints are Twisted "
        "endpoint strings (tcp:5672, tcp:5672:interface=127.0.0.1, ssl:5671:privateKey=...)."
    )

    optParameters = [
        ["data-dir", "d", None, "Directory for durable state [default: ./ottermq-data]."],
        ["config", "c", None, "TOML file with the same settings (and [[policies]])."],
        ["default-user", None, None, "Name of the user created at start [default: guest]."],
        ["default-pass", None, None, "Password of that user [default: guest]."],
        ["loopback-users", None, None,
         "Comma-separated users that may only connect from loopback, like RabbitMQ's "
         "loopback_users; empty for none [default: guest]."],
        ["heartbeat", None, None, "Heartbeat interval proposed to clients, seconds; 0 disables [default: 60].", int],
        ["frame-max", None, None, "Largest frame in bytes [default: 131072].", int],
        ["channel-max", None, None, "Most channels open at once per connection [default: 2047].", int],
        ["handshake-timeout", None, None, "Seconds a client may take to open its connection [default: 10].", float],
        ["consumer-timeout", None, None,
         "Delivery acknowledgement timeout in ms, like RabbitMQ's consumer_timeout; 0 disables "
         "[default: 1800000].", int],
        ["memory-high-watermark", None, None,
         "Bytes of queued message bodies above which publishers are blocked "
         "(connection.blocked) [default: 40% of RAM].", int],
    ]

    def __init__(self):
        usage.Options.__init__(self)
        self["amqp"] = []
        self["management"] = []

    def opt_amqp(self, endpoint):
        """AMQP listening endpoint (repeatable) [default: tcp:5672]."""
        self["amqp"].append(endpoint)

    def opt_management(self, endpoint):
        """Management HTTP endpoint (repeatable) [default: tcp:15672]."""
        self["management"].append(endpoint)

    def postOptions(self):
        """Merge defaults, --config and the command line into ``self.settings``."""
        self.settings = resolveSettings(self)


def _fromConfig(path):
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise usage.UsageError("cannot read config file %s: %s" % (path, e))
    except tomllib.TOMLDecodeError as e:
        raise usage.UsageError("config file %s is not valid TOML: %s" % (path, e))
    return {k.replace("_", "-"): v for k, v in data.items()}


def resolveSettings(options):
    """
    Merge defaults, the config file and the command line into one dict.
    """
    settings = dict(_DEFAULTS)
    settings["policies"] = []
    if options.get("config"):
        conf = _fromConfig(options["config"])
        unknown = set(conf) - set(_DEFAULTS) - {"policies"}
        if unknown:
            raise usage.UsageError("unknown settings in %s: %s" % (options["config"], ", ".join(sorted(unknown))))
        settings.update(conf)
    for key in _DEFAULTS:
        if key in ("amqp", "management"):
            if options[key]:
                settings[key] = list(options[key])
        elif options.get(key) is not None:
            settings[key] = options[key]
    for key in ("amqp", "management"):
        if isinstance(settings[key], str):
            settings[key] = [settings[key]]
    from otter_tx.broker.policy import Policy, PolicyError

    for p in settings["policies"]:
        try:
            Policy(p["name"], p["pattern"], p["definition"], p.get("priority", 0),
                   p.get("apply-to", "all"), p.get("vhost", "/"))
        except KeyError as e:
            raise usage.UsageError("policy %r in %s lacks %s" % (p.get("name"), options.get("config"), e))
        except PolicyError as e:
            raise usage.UsageError("invalid policy %r in %s: %s" % (p.get("name"), options.get("config"), e))
    lb = settings["loopback-users"]
    if isinstance(lb, str):
        lb = [u for u in lb.split(",") if u]
    settings["loopback-users"] = list(lb)
    return settings


def makeService(options, reactor=None):
    """
    Build the :class:`~otter_tx.service.OtterService` for twistd.
    """
    from otter_tx.service import OtterService

    s = options.settings if hasattr(options, "settings") else resolveSettings(options)
    dataDir = os.path.abspath(s["data-dir"])
    os.makedirs(dataDir, exist_ok=True)
    svc = OtterService(
        amqp=s["amqp"],
        management=s["management"],
        reactor=reactor,
        dataDir=dataDir,
        heartbeat=s["heartbeat"],
        frameMax=s["frame-max"],
        channelMax=s["channel-max"],
        handshakeTimeout=s["handshake-timeout"],
        memoryHighWatermark=s["memory-high-watermark"],
        defaultUser=s["default-user"],
        defaultPass=s["default-pass"],
        loopbackUsers=tuple(s["loopback-users"]),
        policies=s["policies"],
        consumerTimeout=s["consumer-timeout"],
    )
    svc.exitOnFailure = True
    return svc
