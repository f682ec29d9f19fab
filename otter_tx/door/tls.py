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


# --- client-certificate login (SASL EXTERNAL) ----------------------------------

#: ``ssl_cert_login_from`` values (RabbitMQ's ``rabbit.ssl_cert_login_from``;
#: ``subject_alt_name`` is its alias of ``subject_alternative_name``)
LOGIN_FROM_VALUES = ("distinguished_name", "common_name", "subject_alternative_name", "subject_alt_name")

#: ``ssl_cert_login_san_type`` values (RabbitMQ's ``otp_san_type``)
SAN_TYPES = ("dns", "ip", "email", "uri", "other_name")

#: RabbitMQ's defaults of ``ssl_cert_login_from``, ``ssl_cert_login_san_type``
#: and ``ssl_cert_login_san_index`` (a 0-based index)
DEFAULT_LOGIN_FROM = "distinguished_name"
DEFAULT_SAN_TYPE = "dns"
DEFAULT_SAN_INDEX = 0

#: attribute short names in a distinguished name, as RabbitMQ writes them
#: (``rabbit_cert_info:format_rdn``); other attributes as dotted OIDs
_DN_NAMES = {
    "2.5.4.4": "SN", "2.5.4.42": "GIVENNAME", "2.5.4.43": "INITIALS", "2.5.4.44": "GENERATIONQUALIFIER",
    "2.5.4.3": "CN", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O", "2.5.4.11": "OU",
    "2.5.4.12": "TITLE", "2.5.4.6": "C", "2.5.4.5": "SERIALNUMBER", "2.5.4.65": "PSEUDONYM",
    "0.9.2342.19200300.100.1.25": "DC", "1.2.840.113549.1.9.1": "EMAILADDRESS", "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.1": "UID",
}

_CN = "2.5.4.3"


def _attributeText(value):
    """An attribute's value as text (``bytes`` values as their hex form)."""
    return value if isinstance(value, str) else value.hex()


def _escapeValue(text):
    """
    Escape an attribute value as RabbitMQ does (``escape_rdn_value``, RFC
    4514): a leading space or ``#`` and a trailing space get a backslash, so
    do ``" + , ; < > \\``; every byte of the UTF-8 form below 32 or from 126
    up is written ``\\XX`` (upper-case hex), so non-ASCII text shows as its
    escaped UTF-8 bytes.
    """
    data = text.encode("utf-8")
    out = []
    last = len(data) - 1
    for i, byte in enumerate(data):
        c = chr(byte)
        if i == 0 and c in " #":
            out.append("\\" + c)
        elif i == last and c == " ":
            out.append("\\ ")
        elif c in '"+,;<>\\':
            out.append("\\" + c)
        elif byte < 32 or byte >= 126:
            out.append("\\%02X" % (byte,))
        else:
            out.append(c)
    return "".join(out)


def distinguishedName(name):
    """
    A ``cryptography`` ``x509.Name`` as the string RabbitMQ makes of a
    certificate's subject or issuer (``rabbit_cert_info:subject/1``, like
    ``openssl x509 -nameopt RFC2253``): the last RDN first, RDNs joined by
    ``,`` without spaces, the attributes of a multi-valued RDN by ``+``,
    ``CN=app1,O=Example,C=GB``.
    """
    rdns = []
    for rdn in reversed(list(name.rdns)):
        parts = []
        for attr in rdn:
            oid = attr.oid.dotted_string
            parts.append("%s=%s" % (_DN_NAMES.get(oid, oid), _escapeValue(_attributeText(attr.value))))
        rdns.append("+".join(parts))
    return ",".join(rdns)


def _utc(cert, which):
    value = getattr(cert, which + "_utc", None)  # cryptography >= 42
    if value is None:
        value = getattr(cert, which)
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


#: the keys of :func:`certificateInfo`
PEER_CERT_KEYS = ("peer_cert_subject", "peer_cert_issuer", "peer_cert_validity")


def certificateInfo(cert):
    """
    What ``/api/connections`` shows of a client certificate (``cryptography``
    ``x509.Certificate``, or None: each value None), as RabbitMQ's ``peer_cert_subject``,
    ``peer_cert_issuer`` and ``peer_cert_validity``: ``{"peer_cert_subject":
    "CN=app1,O=Example", "peer_cert_issuer": "CN=Example CA",
    "peer_cert_validity": "2026-01-01T00:00:00Z - 2027-01-01T00:00:00Z"}``.
    """
    if cert is None:
        return dict.fromkeys(PEER_CERT_KEYS)
    return {
        "peer_cert_subject": distinguishedName(cert.subject),
        "peer_cert_issuer": distinguishedName(cert.issuer),
        "peer_cert_validity": "%s - %s" % (_utc(cert, "not_valid_before"), _utc(cert, "not_valid_after")),
    }


def _otherNameText(der):
    """
    The text in an ``otherName`` SAN's DER value: the content of a UTF8String,
    IA5String or PrintableString of a short-form length (RabbitMQ strips the
    same header, ``sanitize_other_name``); else the bytes as Latin-1.
    """
    if len(der) >= 2 and der[0] in (0x0C, 0x16, 0x13) and der[1] == len(der) - 2:
        return der[2:].decode("utf-8", "replace")
    return der.decode("latin-1")


class CertificateLogin:
    """
    The user name a verified client certificate logs in as with SASL
    ``EXTERNAL``, as RabbitMQ's ``rabbitmq_auth_mechanism_ssl`` takes it
    (``rabbit_ssl:peer_cert_auth_name/2``, https://www.rabbitmq.com/docs/ssl
    "Using Client Certificates for Authentication"):

    :param loginFrom: ``ssl_cert_login_from``: ``distinguished_name`` (the
        default: the subject as :func:`distinguishedName` writes it),
        ``common_name`` (the subject's CN; several CNs joined by ``,``) or
        ``subject_alternative_name`` (alias ``subject_alt_name``).
    :param sanType: ``ssl_cert_login_san_type``: which SANs count, ``dns``
        (default), ``ip`` (its text form, ``127.0.0.1``), ``email``, ``uri``
        or ``other_name``.
    :param sanIndex: ``ssl_cert_login_san_index``: which of the SANs of that
        type, from 0 (default), in the certificate's order.
    :raise ValueError: for a value not listed above, naming it.
    """

    def __init__(self, loginFrom=DEFAULT_LOGIN_FROM, sanType=DEFAULT_SAN_TYPE, sanIndex=DEFAULT_SAN_INDEX):
        if loginFrom not in LOGIN_FROM_VALUES:
            raise ValueError("ssl_cert_login_from: must be one of %s, got %r"
                             % (", ".join(LOGIN_FROM_VALUES), loginFrom))
        if sanType not in SAN_TYPES:
            raise ValueError("ssl_cert_login_san_type: must be one of %s, got %r" % (", ".join(SAN_TYPES), sanType))
        if not (isinstance(sanIndex, int) and not isinstance(sanIndex, bool) and sanIndex >= 0):
            raise ValueError("ssl_cert_login_san_index: must be a non-negative integer, got %r" % (sanIndex,))
        self.loginFrom = "subject_alternative_name" if loginFrom == "subject_alt_name" else loginFrom
        self.sanType = sanType
        self.sanIndex = sanIndex

    def userName(self, cert):
        """
        The user name (str) for ``cert`` (a ``cryptography``
        ``x509.Certificate``), or None when it has none of the kind asked
        for (no CN, too few SANs of the type): RabbitMQ then refuses the
        login ("no name found").
        """
        if self.loginFrom == "distinguished_name":
            return distinguishedName(cert.subject)
        if self.loginFrom == "common_name":
            names = [_attributeText(a.value) for a in cert.subject if a.oid.dotted_string == _CN]
            return ",".join(names) if names else None
        return self._san(cert)

    def _san(self, cert):
        from cryptography import x509

        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return None
        kind = {"dns": x509.DNSName, "ip": x509.IPAddress, "email": x509.RFC822Name,
                "uri": x509.UniformResourceIdentifier, "other_name": x509.OtherName}[self.sanType]
        ofType = [n for n in sans if isinstance(n, kind)]
        if self.sanIndex >= len(ofType):
            return None
        value = ofType[self.sanIndex].value
        if self.sanType == "other_name":
            return _otherNameText(value)
        return str(value)


def peerCertificate(transport):
    """
    The client certificate of a TLS ``transport`` as a ``cryptography``
    ``x509.Certificate``, or None (not TLS, no certificate, the handshake
    not done).  The server only asks for one when it verifies it
    (``ottertls:`` with ``caCerts=``, or ``CertificateOptions(verify=True)``
    / ``trustRoot=``), and OpenSSL fails the handshake when it does not
    verify, so a certificate here is a verified one.
    """
    get = getattr(transport, "getPeerCertificate", None)
    if get is None:
        return None
    cert = get()
    if cert is None:
        return None
    return cert.to_cryptography()
