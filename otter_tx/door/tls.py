"""
The ``ottertls:`` server endpoint string: TLS with client-certificate
verification and a TLS version floor, for ``--amqp``, ``--management`` and
the TOML ``amqp``/``management`` keys (docs/tls.md).

Twisted's ``ssl:`` server string cannot ask for client certificates or
raise the minimum TLS version, and Twisted 26's own ``tls:`` server string
(a directory of PEM files chosen by SNI) cannot either; that prefix is
taken, hence ``ottertls``.  The syntax::

    ottertls:PORT:privateKey=KEY:certKey=CERT[:extraCertChain=CHAIN]
        [:caCerts=CA][:verify=require|optional|none][:minTLS=1.2|1.3]
        [:interface=ADDRESS][:backlog=N]

- ``privateKey`` (required): PEM private key, not encrypted.
- ``certKey``: PEM certificate (default: the ``privateKey`` file, for a
  combined PEM).  Certificates after the first one in it are sent as the
  chain, so a ``fullchain.pem`` works here.
- ``extraCertChain``: PEM file of intermediate certificates sent after
  ``certKey``'s (Twisted's ``ssl:`` argument of the same name).
- ``caCerts``: PEM file with one or more CA certificates that client
  certificates must chain to (RabbitMQ's ``ssl_options.cacertfile``).
- ``verify``: ``require`` (the default when ``caCerts`` is given; RabbitMQ's
  ``verify = verify_peer`` + ``fail_if_no_peer_cert = true``), ``optional``
  (a certificate is verified when the client sends one;
  ``fail_if_no_peer_cert = false``) or ``none`` (the default without
  ``caCerts``: no certificate is asked for, as with ``ssl:``).
- ``minTLS``: ``1.2`` (the default, Twisted's) or ``1.3`` (RabbitMQ's
  ``ssl_options.versions.1 = tlsv1.3``).  ``tlsv1.3`` is accepted too.
- ``interface`` (default: all IPv4 addresses) and ``backlog`` (default 50),
  as for ``ssl:``.

Everything is read and checked when the string is parsed (when the service
is built, before anything listens): a bad argument raises ``ValueError``
whose message names it, e.g. ``ottertls: caCerts=/etc/ca.pem: cannot read
it: No such file or directory``.  The result is an ``SSL4ServerEndpoint``
with a ``CertificateOptions`` (Twisted's ciphers, session tickets off).

The plugin object lives in ``twisted/plugins/ottermq_tls.py``; Twisted's
``serverFromString`` finds it by its ``prefix``.
"""

from twisted.internet.interfaces import IStreamServerEndpointStringParser
from twisted.plugin import IPlugin
from zope.interface import implementer

#: the endpoint string prefix
PREFIX = "ottertls"

#: ``verify=`` values
VERIFY_VALUES = ("require", "optional", "none")

_KNOWN = (
    "privateKey", "certKey", "extraCertChain", "caCerts", "verify", "minTLS",
    "interface", "backlog",
)


def _fail(message):
    return ValueError("%s: %s" % (PREFIX, message))


def _read(name, path):
    """The bytes of file ``path``, given as argument ``name=``."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise _fail("%s=%s: cannot read it: %s" % (name, path, e.strerror or e))


def _certificates(name, path, note=""):
    """
    Every PEM certificate in file ``path`` (argument ``name=``), as a list
    of ``cryptography`` certificates; at least one.  ``note`` goes after
    the argument in the error message.
    """
    from cryptography import x509

    data = _read(name, path)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise _fail("%s=%s%s: no PEM certificate (-----BEGIN CERTIFICATE-----) in it" % (name, path, note))
    return certs


def _privateKey(path):
    """The ``cryptography`` private key in PEM file ``path`` (``privateKey=``)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    data = _read("privateKey", path)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise _fail(
            "privateKey=%s: the key is encrypted, and there is no password option; "
            "decrypt it (openssl pkey -in ENCRYPTED -out KEY)" % (path,)
        )
    except (ValueError, UnsupportedAlgorithm) as e:
        raise _fail("privateKey=%s: no usable PEM private key in it (%s)" % (path, e))


def _publicBytes(publicKey):
    from cryptography.hazmat.primitives import serialization

    return publicKey.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _minimumVersion(minTLS):
    from twisted.internet.ssl import TLSVersion

    value = minTLS.lower()
    if value.startswith("tlsv"):
        value = value[len("tlsv"):]
    versions = {"1.2": TLSVersion.TLSv1_2, "1.3": TLSVersion.TLSv1_3}
    if value not in versions:
        raise _fail("minTLS=%s: must be 1.2 or 1.3 (TLS 1.0 and 1.1 are never allowed)" % (minTLS,))
    return versions[value]


def certificateOptions(privateKey=None, certKey=None, extraCertChain=None, caCerts=None,
                       verify=None, minTLS=None):
    """
    Build the server's ``twisted.internet.ssl.CertificateOptions`` from
    file paths and the ``ottertls:`` argument strings (module docstring).

    With ``caCerts`` and ``verify`` other than ``none``, the CA names are
    also sent in the TLS CertificateRequest, as RabbitMQ does, so clients
    holding several certificates pick the right one.

    :raise ValueError: for a missing or unreadable file, a file without the
        expected PEM object, an encrypted key, a key that does not match the
        certificate, or an unknown ``verify``/``minTLS`` value; the message
        names the argument.
    """
    from OpenSSL import crypto
    from twisted.internet.ssl import CertificateOptions

    if privateKey is None:
        raise _fail("privateKey= is required (the server's PEM private key)")
    if verify is None:
        verify = "require" if caCerts is not None else "none"
    if verify.lower() not in VERIFY_VALUES:
        raise _fail("verify=%s: must be one of %s" % (verify, ", ".join(VERIFY_VALUES)))
    verify = verify.lower()
    if verify != "none" and caCerts is None:
        raise _fail("verify=%s needs caCerts= (the CA certificates client certificates must chain to)" % (verify,))
    if verify == "none" and caCerts is not None:
        raise _fail(
            "verify=none with caCerts= would ignore the CA; leave out verify= "
            "(it then means require) or caCerts="
        )
    kw = {}
    if minTLS is not None:
        kw["raiseMinimumTo"] = _minimumVersion(minTLS)

    key = _privateKey(privateKey)
    if certKey is None:
        certs = _certificates("privateKey", privateKey, " (read for the certificate: no certKey= given)")
    else:
        certs = _certificates("certKey", certKey)
    if _publicBytes(certs[0].public_key()) != _publicBytes(key.public_key()):
        raise _fail("certKey=%s: its certificate does not match privateKey=%s" % (certKey or privateKey, privateKey))
    chain = certs[1:]
    if extraCertChain is not None:
        chain += _certificates("extraCertChain", extraCertChain)

    authorities = []
    if caCerts is not None:
        authorities = _certificates("caCerts", caCerts)
        kw.update(verify=True, caCerts=[crypto.X509.from_cryptography(c) for c in authorities],
                  requireCertificate=(verify == "require"))
    try:
        pkey = crypto.PKey.from_cryptography_key(key)
    except TypeError as e:
        raise _fail("privateKey=%s: unsupported key type (%s)" % (privateKey, e))
    options = CertificateOptions(
        privateKey=pkey,
        certificate=crypto.X509.from_cryptography(certs[0]),
        extraCertChain=[crypto.X509.from_cryptography(c) for c in chain] or None,
        **kw
    )
    # CertificateOptions builds one context and reuses it for every connection
    # (getContext caches it), so what is added here reaches every handshake.
    # Building it now also surfaces OpenSSL's own complaints at parse time.
    context = options.getContext()
    for authority in authorities:
        try:
            context.add_client_ca(authority)
        except TypeError:  # older pyOpenSSL takes its own X509 only
            context.add_client_ca(crypto.X509.from_cryptography(authority))
    return options


def serverEndpoint(reactor, *args, **kwargs):
    """
    Parse the arguments of an ``ottertls:`` string (after the prefix, as
    Twisted's ``serverFromString`` splits them) into an
    ``SSL4ServerEndpoint`` on ``reactor``.

    :raise ValueError: naming the bad argument; see :func:`certificateOptions`.
    """
    from twisted.internet.endpoints import SSL4ServerEndpoint

    if not args:
        raise _fail("the port comes first (%s:5671:privateKey=...:certKey=...)" % (PREFIX,))
    if len(args) > 1:
        raise _fail("unexpected argument %r: arguments after the port are name=value" % (args[1],))
    unknown = sorted(set(kwargs) - set(_KNOWN))
    if unknown:
        raise _fail("unknown argument%s %s (known: %s)" % (
            "s" if len(unknown) > 1 else "", ", ".join(u + "=" for u in unknown),
            ", ".join(k + "=" for k in _KNOWN),
        ))
    port = _integer("port", args[0])
    if not 0 <= port <= 65535:
        raise _fail("port %s: must be 0 to 65535" % (args[0],))
    backlog = _integer("backlog", kwargs.pop("backlog", "50"))
    interface = kwargs.pop("interface", "")
    options = certificateOptions(**kwargs)
    return SSL4ServerEndpoint(reactor, port, options, backlog=backlog, interface=interface)


def _integer(name, value):
    try:
        return int(value)
    except ValueError:
        raise _fail("%s %r: not a number" % (name, value))


@implementer(IPlugin, IStreamServerEndpointStringParser)
class TLSServerParser:
    """
    The ``ottertls:`` server endpoint string parser
    (``IStreamServerEndpointStringParser``), registered as a Twisted plugin
    by ``twisted/plugins/ottermq_tls.py``.
    """

    prefix = PREFIX

    def parseStreamServer(self, reactor, *args, **kwargs):
        """An ``SSL4ServerEndpoint``; see :func:`serverEndpoint`."""
        return serverEndpoint(reactor, *args, **kwargs)
