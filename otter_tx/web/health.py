"""
The node's listeners as the management API reports them, and the pieces of
RabbitMQ 3.10's ``/api/health/checks/*`` that need more than a lookup:
protocol names (``rabbit_mgmt_wm_health_check_protocol_listener``) and
certificate expiry (``rabbit_mgmt_wm_health_check_certificate_expiration``).

A listener record is a dict: ``protocol`` (``amqp``, ``amqp/ssl``,
``http``, ``https``), ``ip_address`` (str), ``port`` (int), ``certfile``
and ``cacertfile`` (PEM paths of a TLS listener, else None).  The service
hands them to the management app once everything listens
(:meth:`otter_tx.service.OtterService` ``_logReady``).
"""

import datetime
import re

DAY = 86400
#: seconds per unit of ``certificate-expiration/{within}/{unit}`` (a month is 365/12 days)
UNITS = {"days": DAY, "weeks": DAY * 7, "months": DAY * (365 / 12), "years": DAY * 365}

_ALIASES = {
    "amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp",
    "amqp10": "amqp", "amqp1.0": "amqp", "amqp1-0": "amqp", "amqp1_0": "amqp",
    "amqps": "amqp/ssl",
    "http1": "http", "http1.1": "http", "http_api": "http", "management": "http",
    "management_ui": "http", "ui": "http",
    "cli": "clustering", "distribution": "clustering",
}


def normalizeProtocol(name):
    """RabbitMQ's protocol name for a ``protocol-listener/{name}`` alias (lowercased; others as given)."""
    lowered = name.lower()
    return _ALIASES.get(lowered, lowered)


def endpointFiles(description):
    """
    ``(certfile, cacertfile)`` of a TLS endpoint string (``ssl:`` or
    ``ottertls:``: ``certKey``, else ``privateKey``; ``caCerts``), or
    ``(None, None)``.
    """
    if not isinstance(description, str):
        return None, None
    args = {}
    for part in re.split(r"(?<!\\):", description)[1:]:
        if "=" in part:
            k, v = part.split("=", 1)
            args[k.strip()] = v.replace("\\:", ":")
    return args.get("certKey") or args.get("privateKey"), args.get("caCerts")


def parseWithin(within, unit):
    """
    Seconds for ``within`` ``unit``; ValueError with RabbitMQ's 400 text
    (``Invalid expiration value.`` / ``Time unit not recognised. Supported
    units: days, weeks, months, years.``).
    """
    if not re.match(r"^[+-]?[0-9]+$", within):
        raise ValueError("Invalid expiration value.")
    seconds = UNITS.get(unit.lower())
    if seconds is None:
        raise ValueError("Time unit not recognised. Supported units: days, weeks, months, years.")
    return int(within) * seconds


def _stamp(dt):
    """``2027-01-05 3:04:05`` (Erlang's ``~w-~2.2.0w-~2.2.0w ~w:~2.2.0w:~2.2.0w``)."""
    return "%d-%02d-%02d %d:%02d:%02d" % (dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second)


def expiringIn(path, now, deadline):
    """
    The certificates of PEM file ``path`` that expire before ``deadline``
    (POSIX seconds), as RabbitMQ lists them: ``[]`` for none or no file,
    a list of expiry stamps, or ``{"error": text}`` when the file cannot be
    read or holds no certificate; a certificate not yet valid at ``now``
    (POSIX seconds) counts as ``{"error": "Certificate is not yet valid"}``.
    """
    if path is None:
        return []
    from cryptography import x509

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return {"error": e.strerror or str(e)}
    blocks = list(re.finditer(rb"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----", data, re.S))
    if not blocks:
        return {"error": "The certificate file provided does not contain any PEM entry."}
    out = []
    for m in blocks:
        if m.group(1) != b"CERTIFICATE":
            continue  # RabbitMQ reports other entries as an error; keys next to certs are common here
        cert = x509.load_pem_x509_certificate(m.group(0))
        notBefore = _utc(getattr(cert, "not_valid_before_utc", None) or cert.not_valid_before)
        notAfter = _utc(getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after)
        if notBefore.timestamp() > now:
            out.append({"error": "Certificate is not yet valid"})
        elif notAfter.timestamp() < deadline:
            out.append(_stamp(notAfter))
    return out


def _utc(dt):
    """A naive datetime (cryptography < 42) as UTC."""
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=datetime.timezone.utc)
