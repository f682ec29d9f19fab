"""
Access control, the one place for it: users and their password hashes,
the configure / write / read permission regexes with a per-session cache,
and the loopback-only login rule.  The AMQP connection and the HTTP app
both ask this module (https://www.rabbitmq.com/docs/access-control).
"""

import base64
import hashlib
import hmac
import ipaddress
import os
import re

from otter_tx.amqp.errors import resourceAccessRefused

#: RabbitMQ's permission kinds, as indexes into a ``(configure, write, read)``
#: permissions tuple
CONFIGURE, WRITE, READ = 0, 1, 2


#: RabbitMQ's password hashing modules (``hashing_algorithm`` in users and
#: definitions) and their digests: ``password_hash`` is base64 of a 4-octet
#: salt followed by DIGEST(salt + UTF-8 password)
HASHING_ALGORITHMS = {
    "rabbit_password_hashing_sha256": hashlib.sha256,
    "rabbit_password_hashing_sha512": hashlib.sha512,
    "rabbit_password_hashing_md5": hashlib.md5,
}

#: the algorithm of users created with a password (RabbitMQ 3.10's default)
DEFAULT_HASHING = "rabbit_password_hashing_sha256"


def hashPassword(password, salt=None, algorithm=DEFAULT_HASHING):
    """
    ``(salt, hash)`` as base64 text: DIGEST over salt + UTF-8 password,
    like RabbitMQ's ``rabbit_password_hashing_sha256`` (or the ``_sha512``
    / ``_md5`` ``algorithm``).  ``salt`` (base64 text) or None for 4 fresh
    random octets.
    """
    if salt is None:
        salt = os.urandom(4)
    else:
        salt = base64.b64decode(salt)
    digest = HASHING_ALGORITHMS[algorithm](salt + password.encode("utf-8", "surrogateescape")).digest()
    return base64.b64encode(salt).decode(), base64.b64encode(digest).decode()


class PasswordHashError(ValueError):
    """An unusable ``password_hash`` / ``hashing_algorithm``; the message says why."""


class User:
    """
    A broker user: ``name``, ``password`` (str, stored as a salted hash; None
    for no password), ``tags`` (list of str).  ``salt`` and
    ``passwordHash`` are base64 text (salt and digest apart, as the journal
    keeps them), ``hashingAlgorithm`` one of :data:`HASHING_ALGORITHMS`.
    Whether the user may log in only from loopback is no property of the
    user: the broker's ``loopbackUsers`` setting names them (see
    :func:`login`).
    """

    def __init__(self, name, password, tags=()):
        self.name = name
        self.tags = list(tags)
        self.salt = self.passwordHash = None
        self.hashingAlgorithm = DEFAULT_HASHING
        if password is not None:
            self.salt, self.passwordHash = hashPassword(password)

    def checkPassword(self, password):
        """True if ``password`` (str) matches the stored salted digest."""
        if self.passwordHash is None or password is None:
            return False
        computed = hashPassword(password, self.salt, self.hashingAlgorithm)[1]
        return hmac.compare_digest(computed, self.passwordHash)

    def setPasswordHash(self, passwordHash, algorithm=DEFAULT_HASHING):
        """
        Install RabbitMQ's ``password_hash`` (base64 of the 4-octet salt and
        the digest; ``""`` for no password, so no password login) made with
        ``algorithm`` (a :data:`HASHING_ALGORITHMS` name; None for the
        default).  Raises :class:`PasswordHashError`.
        """
        algorithm = algorithm or DEFAULT_HASHING
        digest = HASHING_ALGORITHMS.get(algorithm)
        if digest is None:
            raise PasswordHashError("unknown hashing_algorithm %s" % (algorithm,))
        if not isinstance(passwordHash, str):
            raise PasswordHashError("invalid password_hash")
        try:
            raw = base64.b64decode(passwordHash, validate=True)
        except ValueError:
            raise PasswordHashError("invalid password_hash")
        if raw and len(raw) != 4 + digest().digest_size:
            raise PasswordHashError("invalid password_hash")
        self.hashingAlgorithm = algorithm
        if raw:
            self.salt = base64.b64encode(raw[:4]).decode()
            self.passwordHash = base64.b64encode(raw[4:]).decode()
        else:
            self.salt = self.passwordHash = None

    def exportHash(self):
        """RabbitMQ's ``password_hash`` text of this user (``""`` without a password)."""
        if self.passwordHash is None:
            return ""
        return base64.b64encode(base64.b64decode(self.salt) + base64.b64decode(self.passwordHash)).decode()


def isLoopback(host):
    """
    True when a peer address ``host`` (str, as ``IAddress.host``; None or
    ``""`` for a non-IP transport such as a UNIX socket) is loopback:
    127.0.0.0/8, ``::1``, an IPv4-mapped ``::ffff:127.x.y.z``, or the name
    ``localhost``.  The one rule for ``loopback_users`` over AMQP and
    HTTP (RabbitMQ's ``rabbit_net:is_loopback/1``).
    """
    if not host or host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


#: :func:`login` refusals (the reason, for the log line)
INVALID_CREDENTIALS = "invalid credentials"
LOOPBACK_ONLY = "can only connect via localhost"


def login(users, username, password, host, loopbackUsers=()):
    """
    The login rule of both doors (AMQP connection.start-ok, HTTP Basic
    auth): ``(user, None)`` for the :class:`User` of ``users`` (dict name ->
    User) named ``username`` (str or None) whose password is ``password``,
    connecting from ``host`` (see :func:`isLoopback`); else ``(None,
    reason)`` with :data:`INVALID_CREDENTIALS`, or :data:`LOOPBACK_ONLY`
    when the name is in ``loopbackUsers`` (a container of str, the broker's
    ``loopback_users`` setting, ``{"guest"}`` by default) and ``host`` is
    not loopback.  As RabbitMQ, the rule goes BY NAME, whatever the user's
    tags or how it was created or re-created, and only after the password
    was checked (``rabbit_access_control:check_user_loopback/2``, called
    once the backend accepted the credentials; docs "access-control",
    "Loopback Connections").  Each door answers with its own refusal (AMQP
    403 ``ACCESS_REFUSED - Login was refused ...``, HTTP 401).
    """
    return _login(users, username, password, host, loopbackUsers)


def certificateLogin(users, username, host, loopbackUsers=()):
    """
    The login rule for SASL ``EXTERNAL``: ``username`` (str, or None when
    the certificate has no name of the configured kind) comes from a client
    certificate the TLS handshake verified, so no password is checked;
    RabbitMQ's ``rabbitmq_auth_mechanism_ssl`` then asks its backends for
    that user (``rabbit_access_control:check_user_login(Name, [])``, which
    the internal backend answers from its users) and applies the loopback
    rule.  Answers as :func:`login`: ``(user, None)``, or ``(None,
    INVALID_CREDENTIALS)`` for an unknown user or no name, ``(None,
    LOOPBACK_ONLY)``.
    """
    return _login(users, username, _CERTIFICATE, host, loopbackUsers)


#: the password of a :func:`certificateLogin`: the verified certificate stands for it
_CERTIFICATE = object()


def _login(users, username, password, host, loopbackUsers):
    """:func:`login`, or :func:`certificateLogin` when ``password`` is :data:`_CERTIFICATE`."""
    user = users.get(username) if username is not None else None
    if user is None or password is not _CERTIFICATE and not user.checkPassword(password):
        return None, INVALID_CREDENTIALS
    if user.name in loopbackUsers and not isLoopback(host):
        return None, LOOPBACK_ONLY
    return user, None


def permits(permissions, userName, vhost, perm, kind, name):
    """
    True when user ``userName``'s ``perm`` regex (:data:`CONFIGURE`,
    :data:`WRITE` or :data:`READ`) on ``vhost`` (str) matches resource
    ``name`` of ``kind`` (``"queue"`` or ``"exchange"``; the default exchange
    is matched as ``amq.default``).  ``permissions`` maps ``(user, vhost)``
    to the three regexes.  No permissions on the vhost, an empty regex or
    an invalid one permit nothing
    (``rabbit_auth_backend_internal:check_resource_access``).
    """
    perms = permissions.get((userName, vhost))
    pattern = perms[perm] if perms is not None else ""
    checked = "amq.default" if kind == "exchange" and name == "" else name
    try:
        return bool(pattern) and re.search(pattern, checked) is not None
    except re.error:
        return False


class Access:
    """
    One user's permission checks in one vhost, cached: each ``(perm, kind,
    name)`` is matched once until the broker's permissions change
    (``broker.permissionsVersion`` moves).  One per AMQP channel and per
    HTTP request.

    :param broker: the Broker (``permissions``, ``permissionsVersion``).
    :param userName: str.  :param vhostName: str.
    """

    __slots__ = ("broker", "userName", "vhostName", "_cache", "_version")

    def __init__(self, broker, userName, vhostName):
        self.broker = broker
        self.userName = userName
        self.vhostName = vhostName
        self._cache = {}
        self._version = -1

    def allows(self, perm, kind, name):
        """True when the user's ``perm`` regex matches resource ``name`` of ``kind``."""
        broker = self.broker
        if self._version != broker.permissionsVersion:
            self._cache = {}
            self._version = broker.permissionsVersion
        key = (perm, kind, name)
        ok = self._cache.get(key)
        if ok is None:
            ok = self._cache[key] = permits(
                broker.permissions, self.userName, self.vhostName, perm, kind, name
            )
        return ok

    def check(self, perm, kind, name):
        """
        Raise 403 ACCESS_REFUSED ``access to queue 'Q' in vhost '/' refused
        for user 'U'`` unless :meth:`allows`.
        """
        # hot path (every basic.publish): a cached yes, without a call
        if self._version == self.broker.permissionsVersion and self._cache.get((perm, kind, name)):
            return
        if not self.allows(perm, kind, name):
            raise resourceAccessRefused(kind, name, self.vhostName, self.userName)

    def checkAll(self, checks):
        """:meth:`check` each ``(perm, kind, name)`` of ``checks`` in order."""
        for perm, kind, name in checks:
            self.check(perm, kind, name)


def queueDeclareChecks(name, arguments):
    """
    The permission checks a (non-passive) declare of queue ``name`` with
    ``arguments`` (dict) needs, as ``(perm, kind, resource)`` tuples:
    configure on the queue and, with an ``x-dead-letter-exchange``, read on
    the queue and write on that exchange (``rabbit_channel``'s
    ``queue.declare``; checked on the 3.10 peer, over AMQP and HTTP alike).
    """
    checks = [(CONFIGURE, "queue", name)]
    dlx = arguments.get("x-dead-letter-exchange")
    if isinstance(dlx, str):
        checks += [(READ, "queue", name), (WRITE, "exchange", dlx)]
    return checks


def exchangeDeclareChecks(name, arguments):
    """
    The permission checks a (non-passive) declare of exchange ``name`` with
    ``arguments`` needs, as for :func:`queueDeclareChecks`: configure on the
    exchange and, with an ``alternate-exchange``, read on the exchange and
    write on the alternate (``rabbit_channel``'s ``exchange.declare``;
    checked on the 3.10 peer).
    """
    checks = [(CONFIGURE, "exchange", name)]
    alternate = arguments.get("alternate-exchange")
    if isinstance(alternate, str):
        checks += [(READ, "exchange", name), (WRITE, "exchange", alternate)]
    return checks


def bindChecks(destinationKind, destination, source):
    """
    ``queue.bind`` / ``exchange.bind`` (and unbind) checks: write on the
    destination (``destinationKind`` ``"queue"`` or ``"exchange"``), read
    on the ``source`` exchange.
    """
    return [(WRITE, destinationKind, destination), (READ, "exchange", source)]
