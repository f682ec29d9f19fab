"""
``twistd ottermq``: command-line options, the TOML ``--config`` file, their
validation, and ``makeService``.

Every option can also come from ``--config FILE``, a TOML file whose keys
are the long option names with ``-`` or ``_`` (``amqp = ["tcp:5672"]``,
``heartbeat = 30``) plus ``[[policies]]`` tables (``vhost``, ``name``,
``pattern``, ``definition``, ``priority``, ``apply-to``) and a
``[server-properties]`` table.  Command-line options win over the file.

Everything is checked while the options are parsed, before the broker is
built: a wrong value is a :class:`~twisted.python.usage.UsageError` whose
text is one line naming the option (``--heartbeat: must be an integer from 0
to 65535, got '-5'``) or the file and key (``config file ottermq.toml:
heartbeat: must be an integer from 0 to 65535, got 'abc'``).  Run under
twistd (or ``python -m twisted``), that line is printed as ``ottermq: ...``
on stderr and the process exits with status 64 (EX_USAGE), instead of
twistd's habit of printing the whole ``--help`` text.
"""

import difflib
import os
import re
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11 (PyPy 3.9): the same parser, as tomli
    import tomli as tomllib

from twisted.python import usage

from otter_tx.door.tls import (
    DEFAULT_LOGIN_FROM,
    DEFAULT_SAN_INDEX,
    DEFAULT_SAN_TYPE,
    LOGIN_FROM_VALUES,
    SAN_TYPES,
)
from otter_tx.web.request import DEFAULT_MAX_BODY_SIZE

#: exit status for a usage or configuration error (sysexits.h EX_USAGE)
EX_USAGE = 64

_DEFAULTS = {
    "amqp": ["tcp:5672"],
    "management": ["tcp:15672"],
    "prometheus": ["tcp:15692"],
    "stream": ["tcp:5552"],
    "stream-advertised-host": None,
    "stream-advertised-port": None,
    "data-dir": "./ottermq-data",
    "default-user": "guest",
    "default-pass": "guest",
    "loopback-users": "guest",
    "heartbeat": 60,
    "frame-max": 131072,
    "channel-max": 2047,
    "handshake-timeout": 10.0,
    "memory-high-watermark": None,
    "disk-free-limit": 50000000,
    "queue-memory-budget": 8 * 1024 * 1024,
    "consumer-timeout": 1800000,
    "max-message-size": 134217728,
    "management-max-body-size": DEFAULT_MAX_BODY_SIZE,
    "collect-statistics-interval": 5000,
    "server-property": [],
    "default-delivery-limit": None,
    "ssl-cert-login-from": DEFAULT_LOGIN_FROM,
    "ssl-cert-login-san-type": DEFAULT_SAN_TYPE,
    "ssl-cert-login-san-index": DEFAULT_SAN_INDEX,
    "cluster-etcd": None,
    "node-name": None,
    "cluster-link": "tcp:0:interface=127.0.0.1",
    "cluster-advertise": "127.0.0.1",
    "queue-leader-locator": "client-local",
}

#: keys a config file may hold besides the options of _DEFAULTS
_CONFIG_ONLY = ("policies", "server-properties")

#: RabbitMQ's information units (rabbit_resource_monitor_misc:parse_information_unit,
#: the rule behind vm_memory_high_watermark.absolute): k/K/kiB/KiB/KIB/kib, m/M/MiB/...,
#: g/G/GiB/... are powers of 1024; kB/KB/kb/Kb, MB/mb/Mb, GB/gb/Gb powers of 1000.
_UNITS = {}
for _names, _factor in (
    (("k", "K", "kiB", "KiB", "KIB", "kib"), 1024),
    (("m", "M", "MiB", "MIB", "mib"), 1024 ** 2),
    (("g", "G", "GiB", "GIB", "gib"), 1024 ** 3),
    (("kB", "KB", "kb", "Kb"), 1000),
    (("MB", "mb", "Mb"), 1000 ** 2),
    (("GB", "gb", "Gb"), 1000 ** 3),
):
    for _n in _names:
        _UNITS[_n] = _factor
_AMOUNT = re.compile(r"^([0-9]+)(%s)?$" % "|".join(sorted(_UNITS, key=len, reverse=True)))
_FRACTION = re.compile(r"^[0-9]*\.[0-9]+$|^[0-9]+\.[0-9]*$")


class _Invalid(ValueError):
    """A value is wrong; the text says how, without naming the option."""


def _shown(value):
    """A value as the user wrote it, quoted when it is a string."""
    return repr(value)


def _isInt(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(low, high=None):
    """A validator for an integer in ``[low, high]`` (``high`` None: no upper bound)."""
    if high is None:
        wanted = "a non-negative integer" if low == 0 else "an integer of at least %d" % (low,)
    else:
        wanted = "an integer from %d to %d" % (low, high)

    def check(value, cli=False):
        if isinstance(value, str) and cli:
            try:
                number = int(value.strip(), 10)
            except ValueError:
                raise _Invalid("must be %s, got %s" % (wanted, _shown(value)))
        elif _isInt(value):
            number = value
        else:
            raise _Invalid("must be %s, got %s" % (wanted, _shown(value)))
        if number < low or (high is not None and number > high):
            raise _Invalid("must be %s, got %s" % (wanted, _shown(value)))
        return number

    return check


def _deliveryLimit(value, cli=False):
    """
    ``unlimited`` (None, RabbitMQ 3.10's default) or a non-negative integer
    (RabbitMQ 4.x's quorum queues default to 20).
    """
    if value is None or value == "unlimited":
        return None
    try:
        return _integer(0)(value, cli)
    except _Invalid:
        raise _Invalid('must be a non-negative integer or "unlimited", got %s' % (_shown(value),))


def _seconds(value, cli=False):
    """A non-negative number of seconds (int or float)."""
    wanted = "a non-negative number of seconds"
    if isinstance(value, str) and cli:
        try:
            number = float(value.strip())
        except ValueError:
            raise _Invalid("must be %s, got %s" % (wanted, _shown(value)))
    elif _isInt(value) or isinstance(value, float):
        number = float(value)
    else:
        raise _Invalid("must be %s, got %s" % (wanted, _shown(value)))
    if not number >= 0 or number == float("inf"):
        raise _Invalid("must be %s, got %s" % (wanted, _shown(value)))
    return number


def _choice(values):
    """A validator for one of ``values`` (str)."""

    def check(value, cli=False):
        if value not in values:
            raise _Invalid("must be one of %s, got %s" % (", ".join(values), _shown(value)))
        return value

    return check


def _string(nonEmpty=True):
    def check(value, cli=False):
        if not isinstance(value, str):
            raise _Invalid("must be a string, got %s" % (_shown(value),))
        if nonEmpty and not value:
            raise _Invalid("must not be empty")
        return value

    return check


def parseMemoryHighWatermark(value):
    """
    Parse a memory high-watermark the way RabbitMQ's
    ``vm_memory_high_watermark`` settings read it
    (https://www.rabbitmq.com/docs/memory).

    :param value: a fraction of the machine's RAM, like
        ``vm_memory_high_watermark.relative`` (a float such as ``0.4``, or a
        string with a decimal point, ``"0.4"``; from 0 to 1); or an absolute
        amount in bytes like ``vm_memory_high_watermark.absolute``: an int
        (``1073741824``), a string of digits, or digits with one of RabbitMQ's
        units: ``k``/``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB`` are powers of
        1024; ``kB``/``KB``, ``MB``, ``GB`` powers of 1000 (``"1GB"`` is
        1000000000 bytes, ``"1GiB"`` 1073741824).
    :return: ``("relative", float)`` or ``("absolute", int)``.
    :raise ValueError: for anything else (``"lots"``, ``1.5``, ``-1``, ``"1.5GB"``).
    """
    wanted = ("must be a fraction of RAM from 0 to 1 (0.4), a number of bytes (1073741824) "
              "or an amount with a unit (512MiB, 1GB), got %s" % (_shown(value),))
    if isinstance(value, float):
        if 0 <= value <= 1:
            return ("relative", value)
        raise _Invalid(wanted)
    text = _amountText(value, wanted)
    if not isinstance(text, str):
        return text
    if _FRACTION.match(text):
        fraction = float(text)
        if 0 <= fraction <= 1:
            return ("relative", fraction)
        raise _Invalid(wanted)
    return _absolute(text, wanted)


def _amountText(value, wanted):
    """An int of bytes as ``("absolute", n)``; a string stripped; anything else refused."""
    if _isInt(value):
        if value >= 0:
            return ("absolute", value)
        raise _Invalid(wanted)
    if not isinstance(value, str):
        raise _Invalid(wanted)
    return value.strip()


def _absolute(text, wanted):
    """``("absolute", bytes)`` for digits with an optional RabbitMQ unit."""
    m = _AMOUNT.match(text)
    if m is None:
        raise _Invalid(wanted)
    return ("absolute", int(m.group(1)) * _UNITS.get(m.group(2), 1))


def memoryHighWatermarkBytes(value):
    """
    The high-watermark in bytes for a value :func:`parseMemoryHighWatermark`
    accepts (a fraction is of the machine's physical RAM).

    :raise ValueError: when the value is invalid, or is a fraction and the
        RAM size cannot be found.
    """
    from otter_tx.service.assembly import defaultHighWatermark

    form, amount = parseMemoryHighWatermark(value)
    if form == "absolute":
        return amount
    limit = defaultHighWatermark(amount)
    if limit is None:
        raise _Invalid("cannot find this machine's RAM size for the fraction %s; give an amount "
                       "in bytes instead (1GB, 512MiB)" % (_shown(value),))
    return limit


def _memory(value, cli=False):
    return memoryHighWatermarkBytes(value)


def parseMaxMessageSize(value):
    """
    Parse a maximum message size the way RabbitMQ reads
    ``max_message_size`` (https://www.rabbitmq.com/docs/configure): a
    number of bytes, as an int or a string of digits, optionally with one
    of RabbitMQ's information units (``128MiB``, ``100MB``; see
    :func:`parseMemoryHighWatermark` for the units).

    :return: bytes (int), from 1 to 536870912 (512 MiB, RabbitMQ's
        ``?MAX_MSG_SIZE``; RabbitMQ silently caps a larger setting, we
        refuse it).
    :raise ValueError: for anything else (``"big"``, ``0``, ``"1GiB"``).
    """
    from otter_tx.door.protocol import MAX_MESSAGE_SIZE_LIMIT

    wanted = ("must be a number of bytes from 1 to %d (512MiB), optionally with a unit "
              "(128MiB, 100MB), got %s" % (MAX_MESSAGE_SIZE_LIMIT, _shown(value)))
    if _isInt(value):
        amount = value
    elif isinstance(value, str) and _AMOUNT.match(value.strip()):
        m = _AMOUNT.match(value.strip())
        amount = int(m.group(1)) * _UNITS.get(m.group(2), 1)
    else:
        raise _Invalid(wanted)
    if not 0 < amount <= MAX_MESSAGE_SIZE_LIMIT:
        raise _Invalid(wanted)
    return amount


def _maxMessageSize(value, cli=False):
    return parseMaxMessageSize(value)


_RELATIVE = re.compile(r"^(?:mem_relative|relative)\s*[:=]\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)$"
                       r"|^\{\s*mem_relative\s*,\s*([0-9]+(?:\.[0-9]*)?)\s*\}$")


def parseDiskFreeLimit(value):
    """
    Parse a disk free limit the way RabbitMQ's ``disk_free_limit`` reads it
    (https://www.rabbitmq.com/docs/disk-alarms).

    :param value: an absolute amount like ``disk_free_limit.absolute``: an
        int of bytes, a string of digits, or digits with one of RabbitMQ's
        units (``50MB`` is 50000000 bytes, ``1GiB`` 1073741824; see
        :func:`parseMemoryHighWatermark`); or a multiple of the machine's
        RAM like ``disk_free_limit.relative = 1.5`` (the classic config's
        ``{mem_relative, 1.5}``): the string ``"mem_relative:1.5"`` (also
        ``"relative:1.5"`` or ``"{mem_relative, 1.5}"``), or in the TOML
        file the table ``{relative = 1.5}``; ``{absolute = "2GB"}`` is the
        absolute form as a table.
    :return: ``("absolute", int)`` or ``("relative", float)``.
    :raise ValueError: for anything else (``"lots"``, ``-1``, ``1.5``, ``"2.5GB"``).
    """
    wanted = ("must be an amount of bytes (50000000, 50MB, 2GB, 1GiB) or a multiple of RAM "
              "(mem_relative:1.5), got %s" % (_shown(value),))
    if isinstance(value, dict) and len(value) == 1:
        (key, inner), = value.items()
        if key == "relative" and (_isInt(inner) or isinstance(inner, float)) and inner >= 0:
            return ("relative", float(inner))
        if key == "absolute" and (_isInt(inner) or isinstance(inner, str)):
            return parseDiskFreeLimit(inner)
        raise _Invalid(wanted)
    text = _amountText(value, wanted)
    if not isinstance(text, str):
        return text
    m = _RELATIVE.match(text)
    if m is not None:
        return ("relative", float(m.group(1) or m.group(2)))
    return _absolute(text, wanted)


def _diskFree(value, cli=False):
    from otter_tx.resources.alarms import diskFreeLimitBytes

    try:
        return diskFreeLimitBytes(parseDiskFreeLimit(value))
    except _Invalid:
        raise
    except ValueError as e:
        raise _Invalid("%s; give an amount in bytes instead (2GB)" % (e,))
def _amount(value, cli=False):
    """Bytes: an integer, or digits with a unit of :data:`_UNITS` (``8MiB``, ``64MB``)."""
    if _isInt(value) and value >= 0:
        return value
    if isinstance(value, str):
        m = _AMOUNT.match(value.strip())
        if m:
            return int(m.group(1)) * _UNITS.get(m.group(2), 1)
    raise _Invalid("must be an amount of bytes like 8388608, 8MiB or 64MB, got %s" % (_shown(value),))


def _bodySize(value, cli=False):
    """Bytes, at least 1: an integer, or digits with a unit (``20971520``, ``20MiB``, ``64MB``)."""
    try:
        amount = _amount(value)
    except _Invalid:
        amount = 0
    if amount < 1:
        raise _Invalid("must be a number of bytes of at least 1, optionally with a unit "
                       "(20971520, 20MiB, 64MB), got %s" % (_shown(value),))
    return amount


def checkEndpoint(description):
    """
    Parse a Twisted server endpoint string without listening (against a
    ``MemoryReactor``), so that a typo stops startup at once.

    :param description: str, for example ``"tcp:5672:interface=127.0.0.1"``.
    :return: ``description``.
    :raise ValueError: with Twisted's reason (unknown endpoint type, a port
        that is not a number or is outside 0..65535, a missing certificate
        file for ``ssl:``).
    """
    from twisted.internet.endpoints import serverFromString
    from twisted.internet.testing import MemoryReactor

    if not isinstance(description, str):
        raise _Invalid("must be an endpoint string like 'tcp:5672', got %s" % (_shown(description),))
    if not description.strip():
        raise _Invalid("must be an endpoint string like 'tcp:5672', got ''")
    try:
        endpoint = serverFromString(MemoryReactor(), description)
    except Exception as e:  # Twisted raises ValueError, TypeError, OSError, SSL errors ...
        raise _Invalid("invalid endpoint %s: %s" % (_shown(description), _errorText(e)))
    port = getattr(endpoint, "_port", None)
    if _isInt(port) and not 0 <= port <= 65535:
        raise _Invalid("invalid endpoint %s: port must be from 0 to 65535, got %d" % (_shown(description), port))
    return description


def _errorText(e):
    text = str(e) or e.__class__.__name__
    if isinstance(e, TypeError) and "unexpected keyword argument" in text:
        # _parseTCP() got an unexpected keyword argument 'foo'
        text = "unknown parameter " + text.split("unexpected keyword argument", 1)[1].strip()
    return text.splitlines()[0] if text.splitlines() else text


def _optionalEndpoints(value, cli=False):
    """
    Like :func:`_endpoints`, but ``"none"`` and ``""`` (any case) mean no
    listener: ``--prometheus none``, ``prometheus = ""`` or ``[]`` give an
    empty list.
    """
    items = value if isinstance(value, list) else [value]
    kept = [v for v in items if not (isinstance(v, str) and v.strip().lower() in ("", "none"))]
    if not kept:
        return []
    return _endpoints(kept, cli)


def _endpoints(value, cli=False):
    """A string or a list of strings, each a valid endpoint."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise _Invalid("must be an endpoint string or a list of them (\"tcp:5672\" or "
                       "[\"tcp:5672\", \"ssl:5671:...\"]), got %s" % (_shown(value),))
    return [checkEndpoint(v) for v in value]


def _etcdURLs(value, cli=False):
    """etcd client URLs: a comma-separated string or a list of ``http://host:port``."""
    if isinstance(value, str):
        value = [u.strip() for u in value.split(",") if u.strip()]
    if not isinstance(value, list) or not value:
        raise _Invalid("must be etcd client URLs (http://127.0.0.1:2379[,http://...]), got %s" % (_shown(value),))
    for u in value:
        if not isinstance(u, str) or not re.match(r"^https?://[^/:]+(:\d+)?/?$", u):
            raise _Invalid("not an etcd client URL (http://host:port): %s" % (_shown(u),))
    return value


def _users(value, cli=False):
    """Comma-separated string or list of strings -> list of str."""
    if isinstance(value, str):
        return [u.strip() for u in value.split(",") if u.strip()]
    if isinstance(value, list) and all(isinstance(u, str) for u in value):
        return [u for u in value if u]
    raise _Invalid("must be a comma-separated string or a list of strings, got %s" % (_shown(value),))


def parseServerProperty(text):
    """
    ``"KEY=VALUE"`` -> ``(key, value)`` (split at the first ``=``; the value
    may be empty).  Raises ValueError for a missing ``=``, an empty key, or
    ``capabilities`` (RabbitMQ never lets configuration replace that table).
    """
    if not isinstance(text, str):
        raise _Invalid("must be KEY=VALUE strings, got %s" % (_shown(text),))
    if "=" not in text:
        raise _Invalid("must be KEY=VALUE, got %s" % (_shown(text),))
    key, value = text.split("=", 1)
    key = key.strip()
    _checkPropertyKey(key, text)
    return key, value


def _checkPropertyKey(key, shown):
    if not key:
        raise _Invalid("must be KEY=VALUE with a non-empty KEY, got %s" % (_shown(shown),))
    if key == "capabilities":
        raise _Invalid("'capabilities' cannot be replaced (clients read it to know what the "
                       "broker supports)")


def _serverPropertyList(value, cli=False):
    """A list of ``KEY=VALUE`` strings (or one string) -> dict."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise _Invalid("must be a list of \"KEY=VALUE\" strings, got %s" % (_shown(value),))
    return dict(parseServerProperty(v) for v in value)


def _serverPropertyTable(value, cli=False):
    """A TOML table ``{key = "value"}`` -> dict str -> str."""
    if not isinstance(value, dict):
        raise _Invalid("must be a table of strings ([server-properties] product = \"RabbitMQ\"), "
                       "got %s" % (_shown(value),))
    out = {}
    for key, v in value.items():
        _checkPropertyKey(key.strip(), key)
        if not isinstance(v, str):
            raise _Invalid("%s must be a string, got %s" % (key, _shown(v)))
        out[key.strip()] = v
    return out


_POLICY_KEYS = ("name", "pattern", "definition", "priority", "apply-to", "vhost")


def _policies(value, cli=False):
    """A list of ``[[policies]]`` tables -> list of dicts with ``-`` keys, each checked by Policy."""
    from otter_tx.broker.policy import Policy, PolicyError

    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise _Invalid("must be [[policies]] tables, got %s" % (_shown(value),))
    out = []
    for i, raw in enumerate(value, 1):
        p = {k.replace("_", "-"): v for k, v in raw.items()}
        label = "policy %s" % (_shown(p["name"]),) if isinstance(p.get("name"), str) else "policy #%d" % (i,)
        unknown = sorted(set(p) - set(_POLICY_KEYS))
        if unknown:
            raise _Invalid("%s: unknown key %s (expected %s)" % (label, ", ".join(map(repr, unknown)),
                                                                  ", ".join(_POLICY_KEYS)))
        for key in ("name", "pattern", "definition"):
            if key not in p:
                raise _Invalid("%s lacks %r" % (label, key))
        for key, kind, test in (
            ("name", "a non-empty string", lambda v: isinstance(v, str) and v),
            ("pattern", "a string", lambda v: isinstance(v, str)),
            ("definition", "a table", lambda v: isinstance(v, dict)),
            ("priority", "an integer", _isInt),
            ("apply-to", "a string", lambda v: isinstance(v, str)),
            ("vhost", "a non-empty string", lambda v: isinstance(v, str) and v),
        ):
            if key in p and not test(p[key]):
                raise _Invalid("%s: %s must be %s, got %s" % (label, key, kind, _shown(p[key])))
        try:
            Policy(p["name"], p["pattern"], p["definition"], p.get("priority", 0),
                   p.get("apply-to", "all"), p.get("vhost", "/"))
        except PolicyError as e:
            raise _Invalid("invalid %s: %s" % (label, e))
        out.append(p)
    return out


def _dataDir(value, cli=False):
    """A directory that exists and is writable, or that can be created."""
    _string()(value)
    path = os.path.abspath(value)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise _Invalid("%s is not a directory" % (_shown(value),))
        if not os.access(path, os.W_OK | os.X_OK):
            raise _Invalid("directory %s is not writable" % (_shown(value),))
        return value
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise _Invalid("cannot create %s: %s is not a directory" % (_shown(value), parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _Invalid("cannot create %s: %s is not writable" % (_shown(value), parent))
    return value


#: option -> validator (value from the command line as str, or from TOML as any type)
_VALIDATORS = {
    "amqp": _endpoints,
    "management": _endpoints,
    "prometheus": _optionalEndpoints,
    "stream": _optionalEndpoints,
    "stream-advertised-host": _string(),
    "stream-advertised-port": _integer(1, 65535),
    "data-dir": _dataDir,
    "default-user": _string(),
    "default-pass": _string(nonEmpty=False),
    "loopback-users": _users,
    "heartbeat": _integer(0, 65535),
    "frame-max": _integer(4096, 2 ** 32 - 1),
    "channel-max": _integer(0, 65535),
    "handshake-timeout": _seconds,
    "consumer-timeout": _integer(0),
    "memory-high-watermark": _memory,
    "max-message-size": _maxMessageSize,
    "management-max-body-size": _bodySize,
    "disk-free-limit": _diskFree,
    "queue-memory-budget": _amount,
    "collect-statistics-interval": _integer(1),
    "server-property": _serverPropertyList,
    "server-properties": _serverPropertyTable,
    "policies": _policies,
    "default-delivery-limit": _deliveryLimit,
    "ssl-cert-login-from": _choice(LOGIN_FROM_VALUES),
    "ssl-cert-login-san-type": _choice(SAN_TYPES),
    "ssl-cert-login-san-index": _integer(0),
    "cluster-etcd": _etcdURLs,
    "node-name": _string(),
    "cluster-link": lambda v, cli=False: checkEndpoint(v) if isinstance(v, str) else _endpoints(v)[0],
    "cluster-advertise": _string(),
    "queue-leader-locator": _choice(("client-local", "balanced")),
}


class Options(usage.Options):
    """
    Options for ``twistd ottermq`` (and ``python -m twisted ottermq``).

    After ``parseOptions``, ``self.settings`` holds the merged, checked
    settings (see :func:`resolveSettings`).
    """

    longdesc = (
        "Run otter_tx, a RabbitMQ-compatible AMQP 0-9-1 broker. Endpoints are Twisted "
        "endpoint strings (tcp:5672, tcp:5672:interface=127.0.0.1, ssl:5671:privateKey=...). "
        "twistd's own options (-n, --pidfile, --logfile) go before 'ottermq'. "
        "See docs/configuration.md."
    )

    optParameters = [
        ["data-dir", "d", None, "Directory for durable state [default: ./ottermq-data]."],
        ["config", "c", None, "TOML file with the same settings (and [[policies]], [server-properties])."],
        ["default-user", None, None, "Name of the user created at first start [default: guest]."],
        ["default-pass", None, None, "Password of that user [default: guest]."],
        ["loopback-users", None, None,
         "Comma-separated users that may only connect from loopback, like RabbitMQ's "
         "loopback_users; empty for none [default: guest]."],
        ["heartbeat", None, None, "Heartbeat interval proposed to clients, seconds, 0-65535; 0 disables "
         "[default: 60]."],
        ["frame-max", None, None, "Largest frame in bytes, at least 4096 [default: 131072]."],
        ["stream-advertised-host", None, None,
         "Host the stream protocol's metadata and open name (RabbitMQ's stream.advertised_host) "
         "[default: the listening address]."],
        ["stream-advertised-port", None, None,
         "Port the stream protocol's metadata and open name [default: the listening port]."],
        ["channel-max", None, None, "Most channels open at once per connection, 0-65535; 0 means 65535 "
         "[default: 2047]."],
        ["handshake-timeout", None, None, "Seconds a client may take to open its connection; 0 disables "
         "[default: 10]."],
        ["consumer-timeout", None, None,
         "Delivery acknowledgement timeout in ms, like RabbitMQ's consumer_timeout; 0 disables "
         "[default: 1800000]."],
        ["memory-high-watermark", None, None,
         "Process memory (RSS) above which publishers are blocked (connection.blocked), like "
         "RabbitMQ's vm_memory_high_watermark: a fraction of RAM (0.4) or an amount (1073741824, "
         "512MiB, 1GB) [default: 0.4]."],
        ["max-message-size", None, None,
         "Largest message body in bytes, like RabbitMQ's max_message_size; units as 128MiB "
         "or 100MB; at most 512MiB [default: 134217728]."],
        ["management-max-body-size", None, None,
         "Largest management HTTP request body in bytes, like RabbitMQ's management.http.max_body_size "
         "(20MiB, 64MB); a larger one gets 400 before it is read [default: 20971520]."],
        ["disk-free-limit", None, None,
         "Free space on the --data-dir filesystem below which publishers are blocked, like "
         "RabbitMQ's disk_free_limit: an amount (50MB, 2GB, 1GiB) or a multiple of RAM "
         "(mem_relative:1.5) [default: 50MB]."],
        ["queue-memory-budget", None, None,
         "Bytes of ready messages each queue keeps in memory (bodies plus about 350 bytes each); "
         "the rest is paged to <data-dir>/paging (8MiB, 64MB, 0 pages all but one) [default: 8MiB]."],
        ["collect-statistics-interval", None, None,
         "Milliseconds between two samples of the message rates, like RabbitMQ's "
         "collect_statistics_interval; a positive integer [default: 5000]."],
        ["ssl-cert-login-from", None, None,
         "Where a SASL EXTERNAL login (a verified TLS client certificate) takes the user name, like "
         "RabbitMQ's ssl_cert_login_from: distinguished_name, common_name or subject_alternative_name "
         "[default: distinguished_name]."],
        ["ssl-cert-login-san-type", None, None,
         "With subject_alternative_name: the SAN type, like ssl_cert_login_san_type: dns, ip, email, "
         "uri or other_name [default: dns]."],
        ["ssl-cert-login-san-index", None, None,
         "With subject_alternative_name: which SAN of that type, from 0, like "
         "ssl_cert_login_san_index [default: 0]."],
        ["cluster-etcd", None, None, "Join a cluster whose metadata lives in etcd at these client URLs "
         "(comma-separated, http://127.0.0.1:2379); needs --node-name (docs/cluster.md)."],
        ["node-name", None, None, "This node's name in the cluster (unique; shown as the queues' node)."],
        ["cluster-link", None, None, "Endpoint other nodes' links connect to [default: tcp:0:interface=127.0.0.1]."],
        ["cluster-advertise", None, None, "Host other nodes dial for the link [default: 127.0.0.1]."],
        ["queue-leader-locator", None, None, "Where new queues live: client-local or balanced "
         "[default: client-local]."],
        ["default-delivery-limit", None, None,
         "Delivery limit of quorum queues declared without x-delivery-limit or a delivery-limit "
         "policy: a number (RabbitMQ 4.x uses 20) or unlimited (RabbitMQ 3.10) [default: unlimited]."],
    ]

    def __init__(self):
        usage.Options.__init__(self)
        self["amqp"] = []
        self["management"] = []
        self["prometheus"] = []
        self["stream"] = []
        self["server-property"] = []

    def getSynopsis(self):
        """
        ``Usage: twistd [options] ottermq [options]`` (Twisted would repeat
        the parent's synopsis and then ours).
        """
        if self.parent is None:
            return "Usage: ottermq [options]"
        parent = self.parent.getSynopsis()
        # python -m twisted says "... [options] plugin [plugin_options]"
        parent = parent.replace(" plugin [plugin_options]", "")
        return "%s %s [options]" % (parent, self.parent.subCommand)

    def opt_amqp(self, endpoint):
        """AMQP listening endpoint (repeatable) [default: tcp:5672]."""
        self["amqp"].append(endpoint)

    def opt_management(self, endpoint):
        """Management HTTP endpoint (repeatable) [default: tcp:15672]."""
        self["management"].append(endpoint)

    def opt_prometheus(self, endpoint):
        """
        Prometheus metrics endpoint (repeatable; 'none' or '' disables it) [default: tcp:15692].
        """
        self["prometheus"].append(endpoint)

    def opt_stream(self, endpoint):
        """
        RabbitMQ stream protocol endpoint (repeatable; 'none' or '' disables it) [default: tcp:5552].
        """
        self["stream"].append(endpoint)

    def opt_server_property(self, keyValue):
        """
        KEY=VALUE for connection.start's server properties, like RabbitMQ's
        server_properties (repeatable; e.g. product=RabbitMQ).
        """
        self["server-property"].append(keyValue)

    def opt_version(self):
        """
        Print otter_tx's version (with Twisted's and Python's) and exit;
        twistd --version, before ottermq, prints twistd's.
        """
        from twisted import copyright

        from otter_tx import __version__

        print("otter_tx %s (Twisted %s, %s %s)" % (
            __version__, copyright.version, sys.implementation.name, ".".join(map(str, sys.version_info[:3]))))
        sys.exit(0)

    def parseOptions(self, options=None):
        """
        Parse and check ``options``.  Standalone (no parent) a problem raises
        UsageError; as twistd's subcommand it prints one line
        (``ottermq: --heartbeat: ...``) to stderr and exits with
        :data:`EX_USAGE`, without twistd's full usage text.  An option of
        twistd's own given after ``ottermq`` (``twistd ottermq -n``) is named
        as twistd's, with where it goes.
        """
        try:
            usage.Options.parseOptions(self, options)
        except usage.UsageError as e:
            if self.parent is None:
                raise
            _usageExit(_cliErrorText(str(e), [o.rstrip("=") for o in self.longOpt],
                                     getattr(self.parent, "synonyms", {})))

    def postOptions(self):
        """Merge defaults, --config and the command line into ``self.settings``."""
        self.settings = resolveSettings(self)


def _cliErrorText(text, known=(), parentOptions=()):
    """
    Reword getopt's complaints about unknown options: ``--hartbeat: no such
    option ...``; an option in ``parentOptions`` (twistd's own, as its
    ``synonyms`` names them: ``n``, ``nodaemon``, ``pidfile``) gets ``-n:
    no such option of ottermq; twistd's own options go before 'ottermq'
    (twistd -n ottermq ...)``.
    """
    m = re.match(r"No such option '(.*)'$", text) or re.match(r"option -+(\S+) not recognized$", text)
    if m:
        name = m.group(1)
        dashes = "-" if len(name) == 1 else "--"
        if name in parentOptions:
            return ("%s%s: no such option of ottermq; twistd's own options go before 'ottermq' "
                    "(twistd %s%s ottermq ...)" % (dashes, name, dashes, name))
        close = difflib.get_close_matches(name, known, n=1)
        hint = " (did you mean --%s?)" % (close[0],) if close else ""
        return "%s%s: no such option%s; 'twistd ottermq --help' lists them" % (dashes, name, hint)
    return text


def _usageExit(text):
    """Print ``ottermq: text`` on stderr and exit with EX_USAGE."""
    sys.stderr.write("ottermq: %s\n" % (text,))
    sys.stderr.flush()
    raise SystemExit(EX_USAGE)


def _readConfig(path):
    """
    Read and check a TOML config file; returns ``{option: value}`` with
    checked values (``server-property`` and ``[server-properties]`` merged
    into ``server-properties``).
    """
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise usage.UsageError("--config: cannot read %s: %s" % (path, e.strerror or e))
    except tomllib.TOMLDecodeError as e:
        raise usage.UsageError("config file %s is not valid TOML: %s" % (path, e))
    known = [k for k in _DEFAULTS] + list(_CONFIG_ONLY)
    conf = {}
    unknown = []
    for rawKey, value in data.items():
        key = rawKey.replace("_", "-")
        if key not in known:
            unknown.append(rawKey)
            continue
        if key in conf:
            raise usage.UsageError("config file %s: %s is given twice (as - and _ spellings)" % (path, key))
        conf[key] = value
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k.replace("_", "-"), known, n=1)
            hints.append("%r%s" % (k, " (did you mean %r?)" % (close[0],) if close else ""))
        raise usage.UsageError("config file %s: unknown setting%s %s; known: %s" % (
            path, "s" if len(unknown) > 1 else "", ", ".join(hints), ", ".join(known)))
    out = {}
    for key, value in conf.items():
        try:
            out[key] = _VALIDATORS[key](value)
        except _Invalid as e:
            raise usage.UsageError("config file %s: %s: %s" % (path, key, e))
    props = dict(out.pop("server-properties", {}))
    props.update(out.pop("server-property", {}))
    out["server-properties"] = props
    return out


def resolveSettings(options):
    """
    Merge defaults, the config file and the command line into one dict of
    checked values, keyed by long option name: ``amqp``/``management``/
    ``prometheus`` (list of endpoint strings; ``prometheus`` empty when
    disabled), ``data-dir`` (str), ``heartbeat`` (s, int),
    ``frame-max`` (bytes), ``channel-max``, ``handshake-timeout`` (s,
    float), ``consumer-timeout`` (ms), ``max-message-size`` (bytes),
    ``management-max-body-size`` (bytes),
    ``memory-high-watermark`` (bytes, or None for 40% of RAM),
    ``disk-free-limit`` (bytes), ``queue-memory-budget`` (bytes),
    ``collect-statistics-interval`` (ms),
    ``loopback-users`` (list of str), ``default-delivery-limit`` (int or
    None for unlimited),
    ``server-properties`` (dict str -> str), ``policies`` (list of dicts).

    :raise usage.UsageError: one line naming the option (or the file and key).
    """
    settings = {k: v for k, v in _DEFAULTS.items() if k != "server-property"}
    settings["loopback-users"] = _users(settings["loopback-users"])
    settings["policies"] = []
    settings["server-properties"] = {}
    if options.get("config"):
        conf = _readConfig(options["config"])
        settings.update({k: v for k, v in conf.items() if k != "server-properties"})
        settings["server-properties"].update(conf["server-properties"])
    for key in _DEFAULTS:
        given = options.get(key)
        if key in ("amqp", "management", "prometheus", "stream", "server-property"):
            if not given:
                continue
        elif given is None:
            continue
        try:
            value = _VALIDATORS[key](given, cli=True)
        except _Invalid as e:
            raise usage.UsageError("--%s: %s" % (key, e))
        if key == "server-property":
            settings["server-properties"].update(value)
        else:
            settings[key] = value
    if settings["cluster-etcd"] and not settings["node-name"]:
        raise usage.UsageError("--node-name: required with --cluster-etcd")
    if settings["node-name"] and not settings["cluster-etcd"]:
        raise usage.UsageError("--cluster-etcd: required with --node-name")
    return settings


def _logFiles(options):
    """
    Where twistd sends the log, for ``/api/nodes``' ``log_files``: its
    ``--logfile`` (an absolute path; ``-`` is ``<stdout>``), else
    ``<stdout>`` with ``--nodaemon`` and ``twistd.log`` in the working
    directory without; ``[]`` outside twistd.
    """
    parent = getattr(options, "parent", None)
    if parent is None:
        return []
    logfile = parent.get("logfile")
    if logfile == "-" or (not logfile and parent.get("nodaemon")):
        return ["<stdout>"]
    return [os.path.abspath(logfile or "twistd.log")]


def makeService(options, reactor=None):
    """
    Build the :class:`~otter_tx.service.OtterService` for twistd from
    checked ``options`` (an :class:`Options` after ``parseOptions``).  The
    service exits the process with status 1 if it cannot start (store,
    data-directory lock, a listener that cannot bind).
    """
    from otter_tx.service.assembly import OtterService

    s = options.settings if hasattr(options, "settings") else resolveSettings(options)
    dataDir = os.path.abspath(s["data-dir"])
    try:
        os.makedirs(dataDir, exist_ok=True)
    except OSError as e:
        if getattr(options, "parent", None) is None:
            raise usage.UsageError("--data-dir: cannot create %s: %s" % (dataDir, e.strerror or e))
        _usageExit("--data-dir: cannot create %s: %s" % (dataDir, e.strerror or e))
    svc = OtterService(
        amqp=s["amqp"],
        management=s["management"],
        prometheus=s["prometheus"],
        stream=s["stream"],
        streamAdvertisedHost=s["stream-advertised-host"],
        streamAdvertisedPort=s["stream-advertised-port"],
        reactor=reactor,
        dataDir=dataDir,
        heartbeat=s["heartbeat"],
        frameMax=s["frame-max"],
        channelMax=s["channel-max"],
        handshakeTimeout=s["handshake-timeout"],
        memoryHighWatermark=s["memory-high-watermark"],
        diskFreeLimit=s["disk-free-limit"],
        queueMemoryBudget=s["queue-memory-budget"],
        defaultUser=s["default-user"],
        defaultPass=s["default-pass"],
        loopbackUsers=tuple(s["loopback-users"]),
        policies=s["policies"],
        consumerTimeout=s["consumer-timeout"],
        serverProperties=s["server-properties"],
        maxMessageSize=s["max-message-size"],
        managementMaxBodySize=s["management-max-body-size"],
        collectStatisticsInterval=s["collect-statistics-interval"],
        configFiles=[os.path.abspath(options["config"])] if options.get("config") else [],
        logFiles=_logFiles(options),
        defaultDeliveryLimit=s["default-delivery-limit"],
        sslCertLoginFrom=s["ssl-cert-login-from"],
        sslCertLoginSanType=s["ssl-cert-login-san-type"],
        sslCertLoginSanIndex=s["ssl-cert-login-san-index"],
        cluster=_clusterSettings(s),
    )
    svc.exitOnFailure = True
    return svc


def _clusterSettings(s):
    """OtterService's ``cluster`` dict from the settings, or None for a single node."""
    if not s["cluster-etcd"]:
        return None
    return {"etcd": s["cluster-etcd"], "nodeName": s["node-name"], "link": s["cluster-link"],
            "advertise": s["cluster-advertise"], "locator": s["queue-leader-locator"]}
