"""
Interop tests for AMQP over TLS (docs/tls.md), driven by pika's
``BlockingConnection`` with an ``ssl.SSLContext``.

Each test starts the real broker in-process with a TLS listener on
127.0.0.1 port 0 and certificates made at test time with the
``cryptography`` package: a test CA, a server certificate for
``localhost`` and ``127.0.0.1`` (subjectAltName), a client certificate
signed by that CA, and a client certificate from a second, untrusted CA.

Two ways of listening are covered, the two docs/tls.md describes:

- the endpoint string ``ssl:0:interface=127.0.0.1:privateKey=...:certKey=...``
  (what ``--amqp`` and the TOML ``amqp`` key take): server TLS only;
- an ``SSL4ServerEndpoint`` with ``CertificateOptions(trustRoot=CA)`` added
  by an embedder: client certificates required and verified against the
  CA, which no ``ssl:`` endpoint string can ask for.

Clients that are refused fail within pika's ``socket_timeout`` and the
broker keeps serving; trial fails a test if the broker logs an error.
"""

import datetime
import ipaddress
import os
import socket
import ssl
import time

from twisted.internet import reactor, task
from twisted.trial.unittest import SkipTest

from otter_tx.test.interop import InteropTestCase, inProcessOnly

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:
    x509 = None

try:
    import pika
    import pika.credentials
    import pika.exceptions
except ImportError:
    pika = None

IN_PROCESS_ONLY = (
    "the broker under test must listen with TLS on certificates made by the "
    "test; the external RabbitMQ peer has no TLS listener"
)


# --- certificates ----------------------------------------------------------


def _name(commonName):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, commonName)])


def _builder(subject, issuer, publicKey):
    """A certificate builder valid from yesterday until tomorrow."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(publicKey)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(publicKey), critical=False)
    )


class CA:
    """
    A throwaway certificate authority (EC P-256): ``key``, ``cert``, and
    :meth:`issue` for leaf certificates.
    """

    def __init__(self, commonName):
        self.key = ec.generate_private_key(ec.SECP256R1())
        pub = self.key.public_key()
        self.cert = (
            _builder(_name(commonName), _name(commonName), pub)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(self, commonName, usage, dnsNames=(), ipAddresses=()):
        """
        A new key and certificate signed by this CA; ``usage`` is
        ``ExtendedKeyUsageOID.SERVER_AUTH`` or ``CLIENT_AUTH``.  Returns
        ``(key, cert)``.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            _builder(_name(commonName), self.cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        names = [x509.DNSName(n) for n in dnsNames]
        names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ipAddresses]
        if names:
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return key, b.sign(self.key, hashes.SHA256())


def _keyPEM(key):
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certPEM(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


class Certificates:
    """
    The PEM files of one test, in directory ``path``: ``ca.pem``,
    ``server.key``/``server.pem`` (CN=localhost, SAN DNS:localhost and
    IP:127.0.0.1), ``client.key``/``client.pem`` (signed by the CA),
    ``other-ca.pem`` and ``stranger.key``/``stranger.pem`` (a client
    certificate from that other CA).  Attributes hold the file paths.
    """

    def __init__(self, path):
        os.makedirs(path)
        ca = CA("otter_tx test CA")
        other = CA("some other CA")
        serverKey, serverCert = ca.issue(
            "localhost", ExtendedKeyUsageOID.SERVER_AUTH,
            dnsNames=["localhost"], ipAddresses=["127.0.0.1"],
        )
        clientKey, clientCert = ca.issue("app1", ExtendedKeyUsageOID.CLIENT_AUTH)
        strangerKey, strangerCert = other.issue("app1", ExtendedKeyUsageOID.CLIENT_AUTH)
        self.caPEM = _certPEM(ca.cert)
        files = {
            "ca": ("ca.pem", self.caPEM),
            "otherCA": ("other-ca.pem", _certPEM(other.cert)),
            "serverKey": ("server.key", _keyPEM(serverKey)),
            "serverCert": ("server.pem", _certPEM(serverCert)),
            "clientKey": ("client.key", _keyPEM(clientKey)),
            "clientCert": ("client.pem", _certPEM(clientCert)),
            "strangerKey": ("stranger.key", _keyPEM(strangerKey)),
            "strangerCert": ("stranger.pem", _certPEM(strangerCert)),
        }
        for attr, (filename, data) in files.items():
            full = os.path.join(path, filename)
            with open(full, "wb") as f:
                f.write(data)
            setattr(self, attr, full)

    def endpointString(self):
        """The ``--amqp`` string for server TLS on 127.0.0.1, any free port."""
        return "ssl:0:interface=127.0.0.1:privateKey=%s:certKey=%s" % (
            _escape(self.serverKey), _escape(self.serverCert),
        )

    def serverEndpoint(self, clientCertificates=None, **kw):
        """
        What an embedder adds instead of an endpoint string (docs/tls.md,
        "Client certificates"): an ``SSL4ServerEndpoint`` on 127.0.0.1, any
        free port, with the server certificate.  ``clientCertificates``:

        - ``None``: not asked for (as the ``ssl:`` string);
        - ``"required"``: ``CertificateOptions(trustRoot=<the test CA>)``,
          which makes Twisted verify client certificates and require one;
        - ``"optional"``: ``verify=True, caCerts=[<the test CA>],
          requireCertificate=False``: a certificate is verified if sent.

        ``kw`` goes to ``CertificateOptions`` (``raiseMinimumTo=...``).
        """
        from twisted.internet import ssl as tssl
        from twisted.internet.endpoints import SSL4ServerEndpoint

        with open(self.serverCert, "rb") as c, open(self.serverKey, "rb") as k:
            server = tssl.PrivateCertificate.loadPEM(c.read() + k.read())
        ca = tssl.Certificate.loadPEM(self.caPEM)
        if clientCertificates == "required":
            kw["trustRoot"] = tssl.trustRootFromCertificates([ca])
        elif clientCertificates == "optional":
            kw.update(verify=True, caCerts=[ca.original], requireCertificate=False)
        options = tssl.CertificateOptions(
            privateKey=server.privateKey.original, certificate=server.original, **kw
        )
        return SSL4ServerEndpoint(reactor, 0, options, interface="127.0.0.1")


def _escape(path):
    """Escape ``:`` and ``\\`` in a path for a Twisted endpoint string."""
    return path.replace("\\", "\\\\").replace(":", "\\:")


# --- the tests -----------------------------------------------------------------


class TLSTestCase(InteropTestCase):
    """
    Base class: ``self.certs`` (:class:`Certificates`) and a broker whose
    AMQP listeners are ``self.listeners(certs)`` (a list for
    ``startBroker(amqp=...)``); ``self.tlsPort`` is the first one's port.
    """

    def listeners(self, certs):
        return [certs.endpointString()]

    def setUp(self):
        if x509 is None:
            raise SkipTest("the cryptography package is not installed (it makes the test certificates)")
        if pika is None:
            raise SkipTest("pika is not installed")
        from otter_tx.testing import startBroker

        self.certs = Certificates(self.mktemp())
        d = startBroker(reactor, amqp=self.listeners(self.certs), **self.brokerOptions)

        def started(fixture):
            self.fixture = fixture
            self.addCleanup(fixture.stop)
            self.tlsPort = fixture.amqpPort
            self.host = "127.0.0.1"
            self.port = self.tlsPort
            self.url = "amqps://guest:guest@127.0.0.1:%d/" % (self.tlsPort,)

        return d.addCallback(started)

    def clientContext(self, cafile=None, certfile=None, keyfile=None):
        """
        An ``ssl.SSLContext`` verifying the server against ``cafile``
        (default: the test CA) with hostname checking; with ``certfile``, it
        presents that client certificate.
        """
        ctx = ssl.create_default_context(cafile=cafile or self.certs.ca)
        if certfile is not None:
            ctx.load_cert_chain(certfile, keyfile)
        return ctx

    def tlsParams(self, context=None, serverHostname="localhost", port=None):
        """
        pika parameters for the TLS listener: ``context`` (default
        :meth:`clientContext`), SNI and hostname check against
        ``serverHostname`` (``None``: the host, 127.0.0.1).
        """
        return pika.ConnectionParameters(
            host="127.0.0.1",
            port=port or self.tlsPort,
            credentials=pika.PlainCredentials("guest", "guest"),
            ssl_options=pika.SSLOptions(context or self.clientContext(), serverHostname),
            socket_timeout=10,
            blocked_connection_timeout=20,
            connection_attempts=1,
        )

    def roundTrip(self, params):
        """
        Connect with ``params``, publish one message to a fresh exclusive
        queue and get it back; return its body (call from a worker thread).
        """
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            q = ch.queue_declare("", exclusive=True).method.queue
            body = b"over TLS " + os.urandom(8).hex().encode()
            ch.basic_publish("", q, body)
            method, _, got = ch.basic_get(q, auto_ack=True)
            self.assertIsNotNone(method)
            self.assertEqual(got, body)
            return got
        finally:
            conn.close()

    def refused(self, params):
        """
        Connect with ``params`` and expect pika to give up promptly; return
        the exception: the ``ssl.SSLError`` when the client's own handshake
        fails (pika raises it as is), else pika's ``AMQPConnectionError``
        (call from a worker thread).
        """
        start = time.monotonic()
        with self.assertRaises((ssl.SSLError, pika.exceptions.AMQPConnectionError)) as cm:
            pika.BlockingConnection(params).close()
        # refused promptly, not by pika's socket_timeout running out
        self.assertLess(time.monotonic() - start, 5)
        return cm.exception

    def connectionsGone(self, timeout=5.0):
        """
        A Deferred firing once the broker holds no connection (the refused
        ones are released), failing the test after ``timeout`` seconds.
        """
        deadline = reactor.seconds() + timeout

        def check():
            if not self.fixture.broker.connections:
                return None
            if reactor.seconds() > deadline:
                self.fail("broker still holds %d connection(s)" % (len(self.fixture.broker.connections),))
            return task.deferLater(reactor, 0.02, check)

        return task.deferLater(reactor, 0, check)


@inProcessOnly(IN_PROCESS_ONLY)
class ServerTLSTests(TLSTestCase):
    """
    ``--amqp ssl:PORT:privateKey=KEY:certKey=CERT``: server TLS, any client
    that trusts the CA may connect (docs/tls.md, "Server TLS").
    """

    def test_roundTrip(self):
        """A message published over amqps:// is consumed back over amqps://."""
        return self.inThread(self.roundTrip, self.tlsParams())

    def test_consumeOverTLS(self):
        """basic.consume delivers over TLS, with a body bigger than one TLS record."""

        def run():
            conn = pika.BlockingConnection(self.tlsParams())
            try:
                ch = conn.channel()
                q = ch.queue_declare("", exclusive=True).method.queue
                bodies = [os.urandom(n) for n in (0, 1, 20000, 300000)]
                for b in bodies:
                    ch.basic_publish("", q, b)
                got = []
                for method, _, body in ch.consume(q, auto_ack=True, inactivity_timeout=5):
                    if method is None:
                        break
                    got.append(body)
                    if len(got) == len(bodies):
                        break
                ch.cancel()
                self.assertEqual(got, bodies)
            finally:
                conn.close()

        return self.inThread(run)

    def test_serverIdentity(self):
        """
        The broker presents the configured certificate: it verifies against
        the test CA for both names in its subjectAltName, and not against
        another CA or for another name.
        """

        def run():
            self.roundTrip(self.tlsParams(serverHostname="localhost"))
            self.roundTrip(self.tlsParams(serverHostname=None))  # IP:127.0.0.1
            raw = socket.create_connection(("127.0.0.1", self.tlsPort), timeout=10)
            with self.clientContext().wrap_socket(raw, server_hostname="localhost") as s:
                peer = s.getpeercert()
                self.assertEqual(dict(x[0] for x in peer["subject"]), {"commonName": "localhost"})
                self.assertEqual(dict(x[0] for x in peer["issuer"]), {"commonName": "otter_tx test CA"})
            e = self.refused(self.tlsParams(self.clientContext(cafile=self.certs.otherCA)))
            self.assertIn("CERTIFICATE_VERIFY_FAILED", repr(e))
            e = self.refused(self.tlsParams(serverHostname="otter.invalid"))
            self.assertIn("CERTIFICATE_VERIFY_FAILED", repr(e))

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())

    def test_plaintextClientRefused(self):
        """
        A plain amqp:// client on the TLS port fails promptly (its protocol
        header is not a TLS ClientHello); the connection is released and the
        broker goes on serving TLS clients.
        """

        def run():
            plain = pika.ConnectionParameters(
                host="127.0.0.1", port=self.tlsPort, socket_timeout=10, connection_attempts=1,
            )
            self.refused(plain)
            self.refused(plain)

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams()))
        return d

    def test_silentClientTimesOut(self):
        """
        The broker's handshake timeout (``--handshake-timeout``) runs from
        the TCP accept, so it also covers the TLS handshake: a client that
        connects and says nothing is disconnected.
        """
        self.fixture.service.factory.handshakeTimeout = 0.3

        def run():
            with socket.create_connection(("127.0.0.1", self.tlsPort), timeout=10) as raw:
                start = time.monotonic()
                try:
                    data = raw.recv(1)
                except ConnectionResetError:
                    data = b""
                self.assertEqual(data, b"")
                elapsed = time.monotonic() - start
                self.assertGreater(elapsed, 0.2)  # closed by the timer, not at once
                self.assertLess(elapsed, 5)

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams()))
        return d

    def test_oldTLSVersionsRefused(self):
        """
        Twisted's default floor is TLS 1.2: a client that offers at most TLS
        1.1 gets the server's ``protocol version`` alert; TLS 1.2 and TLS 1.3
        clients connect.
        """

        def run():
            old = self.clientContext()
            # let this client offer TLS 1.1 at all (OpenSSL 3 forbids it at
            # its default security level)
            old.set_ciphers("DEFAULT:@SECLEVEL=0")
            old.minimum_version = ssl.TLSVersion.TLSv1_1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
            e = self.refused(self.tlsParams(old))
            if "NO_PROTOCOLS_AVAILABLE" in repr(e) or "NO_CIPHERS_AVAILABLE" in repr(e):
                raise SkipTest("this OpenSSL cannot offer TLS 1.1 at all: %r" % (e,))
            self.assertIn("TLSV1_ALERT_PROTOCOL_VERSION", repr(e))
            for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
                ctx = self.clientContext()
                ctx.minimum_version = ctx.maximum_version = version
                self.roundTrip(self.tlsParams(ctx))

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())

    def test_noClientCertificateNeeded(self):
        """
        The string endpoint does not ask for client certificates: a client
        that presents one (from any CA) is accepted like one that does not.
        """

        def run():
            ctx = self.clientContext(certfile=self.certs.strangerCert, keyfile=self.certs.strangerKey)
            self.roundTrip(self.tlsParams(ctx))

        return self.inThread(run)


@inProcessOnly(IN_PROCESS_ONLY)
class PlainAndTLSListenerTests(TLSTestCase):
    """
    ``--amqp tcp:5672 --amqp ssl:5671:...``: one broker, both listeners,
    one set of queues.
    """

    def listeners(self, certs):
        return [certs.endpointString(), "tcp:0:interface=127.0.0.1"]

    def test_sameBrokerOnBothListeners(self):
        """A message published over TLS is fetched by a plain-TCP client."""

        def run():
            tls = pika.BlockingConnection(self.tlsParams())
            plain = pika.BlockingConnection(pika.ConnectionParameters(
                host="127.0.0.1", port=self.fixture.amqpPorts[1], socket_timeout=10,
                connection_attempts=1,
            ))
            try:
                q = self.name("tls-to-plain")
                ch = tls.channel()
                ch.confirm_delivery()
                ch.queue_declare(q, auto_delete=False)
                ch.basic_publish("", q, b"crossing over")
                method, _, body = plain.channel().basic_get(q, auto_ack=True)
                self.assertEqual(body, b"crossing over")
                ch.queue_delete(q)
            finally:
                tls.close()
                plain.close()

        return self.inThread(run)


@inProcessOnly(IN_PROCESS_ONLY)
class ClientCertificateTests(TLSTestCase):
    """
    An embedder's ``SSL4ServerEndpoint`` with
    ``CertificateOptions(trustRoot=<CA>)``: client certificates are required
    and verified against the CA (RabbitMQ's ``verify_peer`` with
    ``fail_if_no_peer_cert = true``; docs/tls.md, "Client certificates").
    """

    def listeners(self, certs):
        return [certs.serverEndpoint(clientCertificates="required")]

    def goodClient(self):
        return self.clientContext(certfile=self.certs.clientCert, keyfile=self.certs.clientKey)

    def test_caSignedClientAccepted(self):
        """A client presenting a certificate signed by the CA connects and round-trips."""
        return self.inThread(self.roundTrip, self.tlsParams(self.goodClient()))

    def test_noClientCertificateRefused(self):
        """
        A client without a certificate is refused by the TLS handshake (TLS
        1.3 alert ``certificate required``, TLS 1.2 ``handshake failure``),
        the connection is released, and certified clients still connect.
        """

        def run():
            e = self.refused(self.tlsParams())
            self.assertIn("TLSV13_ALERT_CERTIFICATE_REQUIRED", repr(e))
            tls12 = self.clientContext()
            tls12.maximum_version = ssl.TLSVersion.TLSv1_2
            e = self.refused(self.tlsParams(tls12))
            self.assertIn("SSLV3_ALERT_HANDSHAKE_FAILURE", repr(e))

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams(self.goodClient())))
        return d

    def test_wrongCAClientRefused(self):
        """
        A client whose certificate comes from another CA is refused by the
        TLS handshake (alert ``unknown ca``), the connection is released,
        and certified clients still connect.
        """

        def run():
            stranger = self.clientContext(certfile=self.certs.strangerCert, keyfile=self.certs.strangerKey)
            e = self.refused(self.tlsParams(stranger))
            self.assertIn("TLSV1_ALERT_UNKNOWN_CA", repr(e))

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams(self.goodClient())))
        return d

    def test_externalMechanismNotOffered(self):
        """
        The certificate is not an identity: the broker offers PLAIN and
        AMQPLAIN only, so a client asking for EXTERNAL (RabbitMQ's
        rabbitmq_auth_mechanism_ssl) is refused even with a CA-signed
        certificate, and the same client logs in with a password.
        """

        def run():
            params = self.tlsParams(self.goodClient())
            params.credentials = pika.credentials.ExternalCredentials()
            e = self.refused(params)
            self.assertIsInstance(e, pika.exceptions.AuthenticationError)
            self.assertIn("EXTERNAL", repr(e))
            self.roundTrip(self.tlsParams(self.goodClient()))

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())

    def test_plaintextClientRefused(self):
        """A plain amqp:// client on a client-certificate port fails promptly, and the broker goes on."""

        def run():
            self.refused(pika.ConnectionParameters(
                host="127.0.0.1", port=self.tlsPort, socket_timeout=10, connection_attempts=1,
            ))

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams(self.goodClient())))
        return d


@inProcessOnly(IN_PROCESS_ONLY)
class OptionalClientCertificateTests(TLSTestCase):
    """
    ``CertificateOptions(verify=True, caCerts=[CA], requireCertificate=False)``
    (RabbitMQ's ``verify_peer`` with ``fail_if_no_peer_cert = false``): a
    certificate is checked when one is sent, but none is needed.
    """

    def listeners(self, certs):
        return [certs.serverEndpoint(clientCertificates="optional")]

    def test_optional(self):
        """No certificate or a CA-signed one: accepted; one from another CA: refused."""

        def run():
            self.roundTrip(self.tlsParams())
            self.roundTrip(self.tlsParams(self.clientContext(
                certfile=self.certs.clientCert, keyfile=self.certs.clientKey)))
            e = self.refused(self.tlsParams(self.clientContext(
                certfile=self.certs.strangerCert, keyfile=self.certs.strangerKey)))
            self.assertIn("TLSV1_ALERT_UNKNOWN_CA", repr(e))

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())


@inProcessOnly(IN_PROCESS_ONLY)
class TLS13FloorTests(TLSTestCase):
    """
    ``CertificateOptions(raiseMinimumTo=TLSVersion.TLSv1_3)`` (embedders
    only; RabbitMQ's ``ssl_options.versions.1 = tlsv1.3``): TLS 1.2 clients
    are refused.
    """

    def listeners(self, certs):
        from twisted.internet.ssl import TLSVersion

        return [certs.serverEndpoint(raiseMinimumTo=TLSVersion.TLSv1_3)]

    def test_tls12Refused(self):
        """A TLS 1.2-only client is refused; a TLS 1.3 client connects."""

        def run():
            ctx = self.clientContext()
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            e = self.refused(self.tlsParams(ctx))
            self.assertIn("TLSV1_ALERT_PROTOCOL_VERSION", repr(e))
            ctx = self.clientContext()
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            self.roundTrip(self.tlsParams(ctx))

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())


@inProcessOnly(IN_PROCESS_ONLY)
class ConfigFileTests(TLSTestCase):
    """
    The TOML form of docs/tls.md: ``amqp = [..., 'ssl:...']`` in a
    ``--config`` file, through ``twistd ottermq``'s own Options and
    makeService.
    """

    def setUp(self):
        if x509 is None:
            raise SkipTest("the cryptography package is not installed (it makes the test certificates)")
        if pika is None:
            raise SkipTest("pika is not installed")
        from otter_tx import tap

        self.certs = Certificates(self.mktemp())
        config = os.path.join(os.path.dirname(self.certs.ca), "ottermq.toml")
        with open(config, "w") as f:
            f.write(
                "amqp = ['tcp:0:interface=127.0.0.1', '%s']\n"
                "management = []\n"
                "data-dir = '%s'\n"
                % (self.certs.endpointString(), os.path.join(os.path.dirname(config), "data"))
            )
        options = tap.Options()
        options.parseOptions(["--config", config])
        svc = tap.makeService(options, reactor=reactor)
        svc.exitOnFailure = False
        svc.startService()
        self.addCleanup(svc.stopService)
        self.service = svc

        def listening(ports):
            self.tlsPort = ports[1].getHost().port
            self.plainPort = ports[0].getHost().port

        return svc.listeningPorts(svc.amqpServices).addCallback(listening)

    def test_tomlListeners(self):
        """The TLS listener from the config file serves amqps://, the tcp one plain AMQP."""

        def run():
            self.roundTrip(self.tlsParams())
            self.roundTrip(pika.ConnectionParameters(
                host="127.0.0.1", port=self.plainPort, socket_timeout=10, connection_attempts=1,
            ))

        return self.inThread(run)
