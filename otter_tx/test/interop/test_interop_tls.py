"""
Interop tests for AMQP over TLS (docs/tls.md), driven by pika's
``BlockingConnection`` with an ``ssl.SSLContext``.

Each test starts the real broker in-process with a TLS listener on
127.0.0.1 port 0 and certificates made at test time with the
``cryptography`` package: a test CA, a server certificate for
``localhost`` and ``127.0.0.1`` (subjectAltName), a client certificate
signed by that CA, and a client certificate from a second, untrusted CA.

Three ways of listening are covered, the three docs/tls.md describes:

- the endpoint string ``ssl:0:interface=127.0.0.1:privateKey=...:certKey=...``
  (what ``--amqp`` and the TOML ``amqp`` key take): server TLS only;
- otter_tx's own ``ottertls:0:...:caCerts=...:verify=...:minTLS=...``
  string (``otter_tx.door.tls``, a Twisted endpoint plugin): client
  certificates required or optional, a TLS 1.3 floor, from ``--amqp`` or
  TOML; its argument errors are unit-tested here too;
- an ``SSL4ServerEndpoint`` with ``CertificateOptions(trustRoot=CA)`` added
  by an embedder: client certificates required and verified against the
  CA, which no ``ssl:`` endpoint string can ask for.

The management API's ``ssl`` field and the broker's log line for a failed
TLS handshake are checked over real TLS connections.

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
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from otter_tx.test.interop.support import InteropTestCase, inProcessOnly

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
            "caKey": ("ca.key", _keyPEM(ca.key)),
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

    def otterString(self, **args):
        """
        The ``--amqp`` string for otter_tx's ``ottertls:`` endpoint on
        127.0.0.1, any free port, with the server key and certificate;
        ``args`` are more ``name=value`` arguments (``caCerts=self.ca``,
        ``verify="optional"``, ``minTLS="1.3"``), escaped here.
        """
        parts = ["ottertls:0", "interface=127.0.0.1",
                 "privateKey=" + _escape(self.serverKey), "certKey=" + _escape(self.serverCert)]
        parts += ["%s=%s" % (k, _escape(v)) for k, v in args.items()]
        return ":".join(parts)

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

    def test_externalLoginNeedsTheUser(self):
        """
        SASL EXTERNAL is offered to a client with a verified certificate; by
        default (ssl_cert_login_from = distinguished_name) it logs in as the
        subject's DN, ``CN=app1``: refused (403) while no such user exists,
        accepted once it does, without a password (RabbitMQ's
        rabbitmq_auth_mechanism_ssl).
        """

        def external():
            params = self.tlsParams(self.goodClient())
            params.credentials = pika.credentials.ExternalCredentials()
            return params

        def refusedFirst():
            e = self.refused(external())
            self.assertIsInstance(e, pika.exceptions.ProbableAuthenticationError)
            self.assertIn("ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL", repr(e))

        def addUser(_):
            broker = self.fixture.broker
            broker.addUser("CN=app1", None)
            broker.setPermissions("CN=app1", "/")

        d = self.inThread(refusedFirst)
        d.addCallback(addUser)
        d.addCallback(lambda _: self.inThread(self.roundTrip, external()))
        return d.addCallback(lambda _: self.connectionsGone())

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
class StreamExternalTests(TLSTestCase):
    """
    The stream protocol on ``ottertls:`` with client certificates required: SASL EXTERNAL from
    rabbitmq-stream-js-client (its own suite logs in so), as RabbitMQ's rabbitmq_auth_mechanism_ssl.
    """

    @property
    def brokerOptions(self):
        return {"stream": [self.certs.otterString(caCerts=self.certs.ca)]}

    def test_nodeClientExternal(self):
        """Refused while the certificate's user ``CN=app1`` does not exist; logged in, no password, once it does."""
        import json
        import shutil

        node = shutil.which("node")
        nodeDir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
        if node is None:
            raise SkipTest("node is not installed")
        if not os.path.isdir(os.path.join(nodeDir, "node_modules", "rabbitmq-stream-js-client")):
            raise SkipTest("rabbitmq-stream-js-client is not installed (npm ci --prefix %s)" % nodeDir)

        def run(_=None):
            args = [os.path.join(nodeDir, "stream_external.js"), "127.0.0.1", str(self.fixture.streamPort),
                    "ext-%d" % time.time_ns()] + [os.path.abspath(p) for p in
                                                   (self.certs.ca, self.certs.clientCert, self.certs.clientKey)]
            return self.runProcess(node, args, path=nodeDir)

        def refused(outcome):
            # AUTHENTICATION_FAILURE (8); the client throws it from its socket handler
            out, err, code = outcome
            self.assertIn(b"Unable Authenticate -> 8", err, (out, err, code))
            broker = self.fixture.broker
            broker.addUser("CN=app1", None)
            broker.setPermissions("CN=app1", "/")

        def accepted(outcome):
            out, err, code = outcome
            self.assertEqual(code, 0, (out, err))
            self.assertEqual(json.loads(out.decode().strip().splitlines()[-1]), {"created": True})

        d = run()
        d.addCallback(refused)
        d.addCallback(run)
        d.addCallback(accepted)
        return d

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
        from otter_tx.service import tap

        self.certs = Certificates(self.mktemp())
        config = os.path.join(os.path.dirname(self.certs.ca), "ottermq.toml")
        with open(config, "w") as f:
            f.write(
                "amqp = ['tcp:0:interface=127.0.0.1', '%s']\n"
                "management = []\n"
                "prometheus = []\n"
                "data-dir = '%s'\n"
                % (self.tomlListener(), os.path.join(os.path.dirname(config), "data"))
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

    def tomlListener(self):
        """The TLS endpoint string written into the TOML ``amqp`` list."""
        return self.certs.endpointString()

    def test_tomlListeners(self):
        """The TLS listener from the config file serves amqps://, the tcp one plain AMQP."""

        def run():
            self.roundTrip(self.tlsParams())
            self.roundTrip(pika.ConnectionParameters(
                host="127.0.0.1", port=self.plainPort, socket_timeout=10, connection_attempts=1,
            ))

        return self.inThread(run)


# --- ottertls: (otter_tx.door.tls) ----------------------------------------------------


class HandshakeLog:
    """
    Collects the broker's ``closing AMQP connection ...`` warnings while a
    test runs (``events``: the formatted lines).
    """

    def __init__(self, testCase):
        from twisted.logger import globalLogPublisher

        self.events = []
        globalLogPublisher.addObserver(self)
        testCase.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event):
        from twisted.logger import formatEvent

        if event.get("log_format", "").startswith("closing AMQP connection"):
            self.events.append(formatEvent(event))

    def tlsFailures(self):
        """The lines for failed TLS handshakes."""
        return [e for e in self.events if "TLS handshake failed" in e]


@inProcessOnly(IN_PROCESS_ONLY)
class OtterTLSRequiredTests(TLSTestCase):
    """
    ``--amqp ottertls:PORT:...:caCerts=CA:verify=require`` (RabbitMQ's
    ``verify_peer`` + ``fail_if_no_peer_cert = true``): client certificates
    are required and verified against the CA.  A second listener gives
    ``caCerts=`` without ``verify=``, which means the same.
    """

    def listeners(self, certs):
        return [certs.otterString(caCerts=certs.ca, verify="require"), certs.otterString(caCerts=certs.ca)]

    def goodClient(self):
        return self.clientContext(certfile=self.certs.clientCert, keyfile=self.certs.clientKey)

    def test_caSignedClientAccepted(self):
        """A client presenting a certificate signed by the CA connects and round-trips, on both listeners."""

        def run():
            self.roundTrip(self.tlsParams(self.goodClient()))
            self.roundTrip(self.tlsParams(self.goodClient(), port=self.fixture.amqpPorts[1]))

        return self.inThread(run)

    def test_noClientCertificateRefused(self):
        """
        A client without a certificate is refused by the handshake (TLS 1.3
        and 1.2), on both listeners; the broker logs ``TLS handshake
        failed``, releases the connections and goes on serving.
        """
        log = HandshakeLog(self)

        def run():
            for port in self.fixture.amqpPorts:
                e = self.refused(self.tlsParams(port=port))
                self.assertIn("TLSV13_ALERT_CERTIFICATE_REQUIRED", repr(e))
            tls12 = self.clientContext()
            tls12.maximum_version = ssl.TLSVersion.TLSv1_2
            e = self.refused(self.tlsParams(tls12))
            self.assertIn("SSLV3_ALERT_HANDSHAKE_FAILURE", repr(e))

        def logged(_):
            self.assertEqual(len(log.tlsFailures()), 3, log.events)
            self.assertEqual([e for e in log.events if "unexpectedly closed" in e], [])

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(logged)
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams(self.goodClient())))
        return d

    def test_wrongCAClientRefused(self):
        """
        A client whose certificate comes from another CA is refused (alert
        ``unknown ca``), the broker logs why, and certified clients still
        connect.
        """
        log = HandshakeLog(self)

        def run():
            stranger = self.clientContext(certfile=self.certs.strangerCert, keyfile=self.certs.strangerKey)
            e = self.refused(self.tlsParams(stranger))
            self.assertIn("TLSV1_ALERT_UNKNOWN_CA", repr(e))

        def logged(_):
            [line] = log.tlsFailures()
            self.assertIn("certificate verify failed", line)

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(logged)
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams(self.goodClient())))
        return d

    def test_plaintextClientRefused(self):
        """A plain amqp:// client fails promptly, is logged as a failed TLS handshake, and the broker goes on."""
        log = HandshakeLog(self)

        def run():
            self.refused(pika.ConnectionParameters(
                host="127.0.0.1", port=self.tlsPort, socket_timeout=10, connection_attempts=1,
            ))

        d = self.inThread(run)
        d.addCallback(lambda _: self.connectionsGone())
        d.addCallback(lambda _: self.assertEqual(len(log.tlsFailures()), 1, log.events))
        d.addCallback(lambda _: self.inThread(self.roundTrip, self.tlsParams(self.goodClient())))
        return d


@inProcessOnly(IN_PROCESS_ONLY)
class OtterTLSOptionalTests(TLSTestCase):
    """
    ``ottertls:...:caCerts=CA:verify=optional`` (RabbitMQ's ``verify_peer``
    + ``fail_if_no_peer_cert = false``): a certificate is verified when the
    client sends one, and none is needed.
    """

    def listeners(self, certs):
        return [certs.otterString(caCerts=certs.ca, verify="optional")]

    def test_optional(self):
        """No certificate or a CA-signed one: accepted; one from another CA: refused, and the broker goes on."""

        def run():
            self.roundTrip(self.tlsParams())
            self.roundTrip(self.tlsParams(self.clientContext(
                certfile=self.certs.clientCert, keyfile=self.certs.clientKey)))
            e = self.refused(self.tlsParams(self.clientContext(
                certfile=self.certs.strangerCert, keyfile=self.certs.strangerKey)))
            self.assertIn("TLSV1_ALERT_UNKNOWN_CA", repr(e))
            self.roundTrip(self.tlsParams())

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())


@inProcessOnly(IN_PROCESS_ONLY)
class OtterTLSFloorTests(TLS13FloorTests):
    """
    ``ottertls:...:minTLS=1.3`` without ``caCerts`` (RabbitMQ's
    ``ssl_options.versions.1 = tlsv1.3``, ``verify_none``): TLS 1.2 clients
    are refused, and client certificates are not asked for.
    """

    def listeners(self, certs):
        return [certs.otterString(minTLS="1.3")]

    def test_noClientCertificateNeeded(self):
        """Without ``caCerts`` no certificate is asked for: a client presenting one from any CA connects."""

        def run():
            ctx = self.clientContext(certfile=self.certs.strangerCert, keyfile=self.certs.strangerKey)
            self.roundTrip(self.tlsParams(ctx))
            self.roundTrip(self.tlsParams())

        return self.inThread(run)


@inProcessOnly(IN_PROCESS_ONLY)
class OtterTLSConfigFileTests(ConfigFileTests):
    """
    The TOML form: ``amqp = [..., 'ottertls:...:caCerts=...']`` in a
    ``--config`` file, through ``twistd ottermq``'s Options and makeService.
    """

    def tomlListener(self):
        return self.certs.otterString(caCerts=self.certs.ca)

    def test_tomlListeners(self):
        """The ottertls listener from the config file requires a CA-signed client certificate; tcp serves plain AMQP."""

        def run():
            e = self.refused(self.tlsParams())
            self.assertIn("TLSV13_ALERT_CERTIFICATE_REQUIRED", repr(e))
            self.roundTrip(self.tlsParams(self.clientContext(
                certfile=self.certs.clientCert, keyfile=self.certs.clientKey)))
            self.roundTrip(pika.ConnectionParameters(
                host="127.0.0.1", port=self.plainPort, socket_timeout=10, connection_attempts=1,
            ))

        return self.inThread(run)


@inProcessOnly(IN_PROCESS_ONLY)
class ManagementSSLFieldTests(TLSTestCase):
    """
    ``GET /api/connections`` says ``"ssl": true`` for AMQP connections that
    came over TLS (``ssl:`` or ``ottertls:``) and false for plain ones, as
    RabbitMQ's management API does.
    """

    brokerOptions = {"management": True}

    def listeners(self, certs):
        return [certs.endpointString(), certs.otterString(caCerts=certs.ca), "tcp:0:interface=127.0.0.1"]

    def apiConnections(self):
        """The decoded ``/api/connections`` list (call from a worker thread)."""
        import base64
        import json
        import urllib.request

        request = urllib.request.Request(
            "http://127.0.0.1:%d/api/connections" % (self.fixture.managementPort,),
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def test_sslField(self):
        """One connection per listener: ``ssl`` is true for both TLS listeners, false for tcp."""
        sslPort, otterPort, plainPort = self.fixture.amqpPorts

        def run():
            client = self.clientContext(certfile=self.certs.clientCert, keyfile=self.certs.clientKey)
            conns = [
                pika.BlockingConnection(self.tlsParams()),
                pika.BlockingConnection(self.tlsParams(client, port=otterPort)),
                pika.BlockingConnection(pika.ConnectionParameters(
                    host="127.0.0.1", port=plainPort, socket_timeout=10, connection_attempts=1,
                )),
            ]
            try:
                listed = self.apiConnections()
            finally:
                for c in conns:
                    c.close()
            self.assertEqual(
                sorted((c["port"], c["ssl"]) for c in listed),
                sorted([(sslPort, True), (otterPort, True), (plainPort, False)]),
            )

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())


@inProcessOnly(IN_PROCESS_ONLY)
class ExternalLoginTests(TLSTestCase):
    """
    SASL EXTERNAL over ``ottertls:`` with ``caCerts=`` (RabbitMQ's
    rabbitmq_auth_mechanism_ssl): the user name comes from the verified
    client certificate as ``ssl_cert_login_from`` says, and
    ``/api/connections`` shows ``auth_mechanism`` and the certificate's
    ``peer_cert_subject`` / ``_issuer`` / ``_validity`` in RabbitMQ's formats.
    """

    brokerOptions = {"management": True, "sslCertLoginFrom": "common_name"}

    def listeners(self, certs):
        return [certs.otterString(caCerts=certs.ca), certs.endpointString()]

    def setUp(self):
        d = TLSTestCase.setUp(self)

        def users(_):
            for name in ("app1", "svc.example.com", "second.example.com", "ops@example.com"):
                self.fixture.broker.addUser(name, None)
                self.fixture.broker.setPermissions(name, "/")

        return d.addCallback(users)

    def external(self, certfile, keyfile, port=None):
        """pika parameters logging in with EXTERNAL and the given client certificate."""
        params = self.tlsParams(self.clientContext(certfile=certfile, keyfile=keyfile), port=port)
        params.credentials = pika.credentials.ExternalCredentials()
        return params

    def sanClient(self):
        """A client certificate (CN=ignored, O=Otter, Tests) with SANs: two DNS names, an email; its files."""
        ca = CA.__new__(CA)
        with open(self.certs.ca, "rb") as f:
            ca.cert = x509.load_pem_x509_certificate(f.read())
        with open(self.certs.caKey, "rb") as f:
            ca.key = serialization.load_pem_private_key(f.read(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Otter, Tests"),
                             x509.NameAttribute(NameOID.COMMON_NAME, "ignored")])
        cert = (
            _builder(subject, ca.cert.subject, key.public_key())
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("svc.example.com"), x509.RFC822Name("ops@example.com"),
                x509.DNSName("second.example.com")]), critical=False)
            .sign(ca.key, hashes.SHA256())
        )
        base = os.path.join(os.path.dirname(self.certs.ca), "san")
        with open(base + ".pem", "wb") as f:
            f.write(_certPEM(cert))
        with open(base + ".key", "wb") as f:
            f.write(_keyPEM(key))
        return base + ".pem", base + ".key"

    def whoAmI(self, params):
        """Connect with ``params``; return this connection's ``/api/connections`` entry (worker thread)."""
        conn = pika.BlockingConnection(params)
        try:
            port = conn._impl._transport._sock.getsockname()[1]
            listed = ManagementSSLFieldTests.apiConnections(self)
            return [c for c in listed if c["peer_port"] == port][0]
        finally:
            conn.close()

    def test_commonName(self):
        """ssl_cert_login_from = common_name: the certificate CN=app1 logs in as app1; the API shows it."""

        def run():
            c = self.whoAmI(self.external(self.certs.clientCert, self.certs.clientKey))
            self.assertEqual((c["user"], c["auth_mechanism"], c["ssl"]), ("app1", "EXTERNAL", True))
            self.assertEqual(c["peer_cert_subject"], "CN=app1")
            self.assertEqual(c["peer_cert_issuer"], "CN=otter_tx test CA")
            self.assertRegex(c["peer_cert_validity"],
                             r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ - \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
            # a password login on the same listener shows PLAIN and the certificate too
            plain = self.whoAmI(self.tlsParams(self.clientContext(
                certfile=self.certs.clientCert, keyfile=self.certs.clientKey)))
            self.assertEqual((plain["user"], plain["auth_mechanism"], plain["peer_cert_subject"]),
                             ("guest", "PLAIN", "CN=app1"))

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())

    def test_subjectAlternativeName(self):
        """
        ssl_cert_login_from = subject_alternative_name picks the SAN of
        ssl_cert_login_san_type at ssl_cert_login_san_index; the subject DN
        is written as RabbitMQ writes it (last RDN first, ``,`` escaped).
        """
        certfile, keyfile = self.sanClient()
        factory = self.fixture.service.factory
        from otter_tx.door.tls import CertificateLogin

        def run():
            got = []
            for login in (CertificateLogin("subject_alternative_name"),
                          CertificateLogin("subject_alternative_name", "dns", 1),
                          CertificateLogin("subject_alt_name", "email")):
                factory.certificateLogin = login
                c = self.whoAmI(self.external(certfile, keyfile))
                got.append(c["user"])
            self.assertEqual(got, ["svc.example.com", "second.example.com", "ops@example.com"])
            self.assertEqual(c["peer_cert_subject"], "CN=ignored,O=Otter\\, Tests")
            # no third DNS name: no name found, refused
            factory.certificateLogin = CertificateLogin("subject_alternative_name", "dns", 2)
            e = self.refused(self.external(certfile, keyfile))
            self.assertIsInstance(e, pika.exceptions.ProbableAuthenticationError)

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())

    def test_notOfferedWithoutClientCertificate(self):
        """On a TLS listener that asks for no client certificate (ssl:), EXTERNAL is not offered."""
        sslPort = self.fixture.amqpPorts[1]

        def run():
            params = self.tlsParams(port=sslPort)
            params.credentials = pika.credentials.ExternalCredentials()
            e = self.refused(params)
            self.assertIsInstance(e, pika.exceptions.AuthenticationError)
            c = self.whoAmI(self.tlsParams(port=sslPort))
            self.assertEqual((c["auth_mechanism"], c["peer_cert_subject"], c["peer_cert_issuer"],
                              c["peer_cert_validity"]), ("PLAIN", None, None, None))

        return self.inThread(run).addCallback(lambda _: self.connectionsGone())


def _handshake(serverContext, clientContext):
    """
    A TLS handshake in memory between an OpenSSL server and client context;
    returns ``(client, server, error)`` (the pyOpenSSL connections and the
    ``OpenSSL.SSL.Error`` the server raised, or None).
    """
    from OpenSSL import SSL

    server = SSL.Connection(serverContext, None)
    server.set_accept_state()
    client = SSL.Connection(clientContext, None)
    client.set_connect_state()
    error = None
    for _ in range(10):
        for conn in (client, server):
            try:
                conn.do_handshake()
            except SSL.WantReadError:
                pass
            except SSL.Error as e:
                if conn is server:
                    error = e
        moved = False
        for a, b in ((client, server), (server, client)):
            try:
                data = a.bio_read(65536)
            except SSL.WantReadError:
                data = b""
            if data:
                b.bio_write(data)
                moved = True
        if not moved:
            break
    return client, server, error


class OtterTLSParserTests(SynchronousTestCase):
    """
    ``otter_tx.door.tls``: the ``ottertls:`` string found through Twisted's
    plugins by ``serverFromString``, what it builds, and a ``ValueError``
    naming the argument for each bad one.
    """

    def setUp(self):
        if x509 is None:
            raise SkipTest("the cryptography package is not installed (it makes the test certificates)")
        self.certs = Certificates(self.mktemp())
        self.dir = os.path.dirname(self.certs.ca)

    def file(self, name, data):
        """Write ``data`` (bytes) to ``name`` in the test's directory; return the path."""
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def parse(self, description):
        """``serverFromString`` on a ``MemoryReactor``."""
        from twisted.internet.endpoints import serverFromString
        from twisted.internet.testing import MemoryReactor

        return serverFromString(MemoryReactor(), description)

    def listen(self, description):
        """
        Listen with ``description`` on a ``MemoryReactor``; return what
        reached ``listenSSL``: ``(port, options, backlog, interface)``.
        """
        from twisted.internet.endpoints import serverFromString
        from twisted.internet.protocol import Factory
        from twisted.internet.testing import MemoryReactor

        memory = MemoryReactor()
        serverFromString(memory, description).listen(Factory())
        [(port, _, options, backlog, interface)] = memory.sslServers
        return port, options, backlog, interface

    def options(self, **args):
        """The ``CertificateOptions`` built from :meth:`Certificates.otterString` with ``args``."""
        port, options, backlog, interface = self.listen(self.certs.otterString(**args))
        self.assertEqual((port, backlog, interface), (0, 50, "127.0.0.1"))
        return options

    def assertBad(self, description, *fragments):
        """``description`` raises a ValueError whose message holds every fragment."""
        e = self.assertRaises(ValueError, self.parse, description)
        for fragment in fragments:
            self.assertIn(fragment, str(e))
        self.assertTrue(str(e).startswith("ottertls: "), str(e))
        return e

    def clientContext(self, certfile=None, keyfile=None, maximum=None):
        """A pyOpenSSL client context, with a client certificate when given."""
        from OpenSSL import SSL

        ctx = SSL.Context(SSL.TLS_METHOD)
        if certfile is not None:
            ctx.use_certificate_file(certfile)
            ctx.use_privatekey_file(keyfile)
        if maximum is not None:
            ctx.set_max_proto_version(maximum)
        return ctx

    def test_plugin(self):
        """The plugin provides the parser and plugin interfaces and ``serverFromString`` finds it by its prefix."""
        from twisted.internet.endpoints import SSL4ServerEndpoint
        from twisted.internet.interfaces import IStreamServerEndpointStringParser
        from twisted.plugin import IPlugin, getPlugins
        from zope.interface.verify import verifyObject

        from otter_tx.door.tls import TLSServerParser

        [plugin] = [p for p in getPlugins(IStreamServerEndpointStringParser) if p.prefix == "ottertls"]
        self.assertIsInstance(plugin, TLSServerParser)
        verifyObject(IStreamServerEndpointStringParser, plugin)
        verifyObject(IPlugin, plugin)
        self.assertIsInstance(self.parse(self.certs.otterString()), SSL4ServerEndpoint)

    def test_interfaceAndBacklog(self):
        """``interface=`` and ``backlog=`` reach the listening port; the defaults are all IPv4 addresses and 50."""
        key, cert = _escape(self.certs.serverKey), _escape(self.certs.serverCert)
        port, _, backlog, interface = self.listen("ottertls:5671:privateKey=%s:certKey=%s" % (key, cert))
        self.assertEqual((port, backlog, interface), (5671, 50, ""))
        port, _, backlog, interface = self.listen(
            "ottertls:5672:privateKey=%s:certKey=%s:interface=\\:\\:1:backlog=7" % (key, cert))
        self.assertEqual((port, backlog, interface), (5672, 7, "::1"))

    def test_verifyModes(self):
        """No ``caCerts``: nothing asked; ``caCerts``: required unless ``verify=optional``; ``verify`` ignores case."""
        none = self.options()
        self.assertFalse(none.verify)
        for args in ({"caCerts": self.certs.ca}, {"caCerts": self.certs.ca, "verify": "REQUIRE"}):
            options = self.options(**args)
            self.assertTrue(options.verify)
            self.assertTrue(options.requireCertificate)
        optional = self.options(caCerts=self.certs.ca, verify="optional")
        self.assertTrue(optional.verify)
        self.assertFalse(optional.requireCertificate)

    def test_handshakes(self):
        """
        In memory: a required certificate must chain to ``caCerts``, whose
        CA names the server sends in its certificate request; ``minTLS=1.3``
        refuses a TLS 1.2 client.
        """
        from OpenSSL import SSL

        context = self.options(caCerts=self.certs.ca).getContext()
        client, server, error = _handshake(context, self.clientContext(self.certs.clientCert, self.certs.clientKey))
        self.assertIsNone(error)
        self.assertEqual([n.CN for n in client.get_client_ca_list()], ["otter_tx test CA"])
        self.assertEqual(server.get_peer_certificate().to_cryptography().subject, _name("app1"))
        _, _, error = _handshake(context, self.clientContext())
        self.assertIsInstance(error, SSL.Error)
        _, _, error = _handshake(context, self.clientContext(self.certs.strangerCert, self.certs.strangerKey))
        self.assertIsInstance(error, SSL.Error)

        floor = self.options(minTLS="1.3").getContext()
        _, _, error = _handshake(floor, self.clientContext(maximum=SSL.TLS1_2_VERSION))
        self.assertIsInstance(error, SSL.Error)
        client, _, error = _handshake(floor, self.clientContext())
        self.assertIsNone(error)
        self.assertEqual(client.get_protocol_version_name(), "TLSv1.3")
        client, _, error = _handshake(self.options(minTLS="TLSv1.2").getContext(),
                                      self.clientContext(maximum=SSL.TLS1_2_VERSION))
        self.assertIsNone(error)
        self.assertEqual(client.get_protocol_version_name(), "TLSv1.2")

    def test_chain(self):
        """Certificates after the first in ``certKey`` and those in ``extraCertChain`` are sent as the chain."""
        with open(self.certs.serverCert, "rb") as c:
            full = self.file("fullchain.pem", c.read() + self.certs.caPEM)
        _, options, _, _ = self.listen("ottertls:0:privateKey=%s:certKey=%s:extraCertChain=%s" % (
            _escape(self.certs.serverKey), _escape(full), _escape(self.certs.otherCA)))
        self.assertEqual(len(options.extraCertChain), 2)
        self.assertEqual(self.options().extraCertChain, [])

    def test_combinedPEM(self):
        """Without ``certKey`` the certificate is read from the ``privateKey`` file, as with ``ssl:``."""
        with open(self.certs.serverCert, "rb") as c, open(self.certs.serverKey, "rb") as k:
            combined = self.file("combined.pem", c.read() + k.read())
        self.parse("ottertls:0:privateKey=%s" % (_escape(combined),))
        self.assertBad("ottertls:0:privateKey=%s" % (_escape(self.certs.serverKey),),
                       "privateKey=", "no certKey= given", "no PEM certificate")

    def test_missingFiles(self):
        """A file that cannot be read is named with its argument."""
        missing = os.path.join(self.dir, "missing.pem")
        for name in ("privateKey", "certKey", "extraCertChain", "caCerts"):
            args = {"privateKey": self.certs.serverKey, "certKey": self.certs.serverCert, name: missing}
            description = "ottertls:0:" + ":".join("%s=%s" % (k, _escape(v)) for k, v in args.items())
            self.assertBad(description, "%s=%s: cannot read it" % (name, missing), "No such file")

    def test_unreadablePEM(self):
        """Files without the PEM object expected are refused, naming the argument."""
        garbage = _escape(self.file("garbage.pem", b"not PEM at all\n"))
        base = self.certs.otterString()
        self.assertBad(base + ":caCerts=" + garbage, "caCerts=", "no PEM certificate")
        self.assertBad(base + ":extraCertChain=" + garbage, "extraCertChain=", "no PEM certificate")
        self.assertBad(base + ":caCerts=" + _escape(self.certs.serverKey), "caCerts=", "no PEM certificate")
        self.assertBad("ottertls:0:privateKey=%s:certKey=%s" % (garbage, _escape(self.certs.serverCert)),
                       "privateKey=", "no usable PEM private key")
        self.assertBad("ottertls:0:privateKey=%s:certKey=%s" % (_escape(self.certs.serverKey), garbage),
                       "certKey=", "no PEM certificate")

    def test_encryptedKey(self):
        """An encrypted private key is refused (there is no password option) rather than prompting for one."""
        with open(self.certs.serverKey, "rb") as k:
            key = serialization.load_pem_private_key(k.read(), None)
        encrypted = self.file("encrypted.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        ))
        self.assertBad("ottertls:0:privateKey=%s:certKey=%s" % (_escape(encrypted), _escape(self.certs.serverCert)),
                       "privateKey=", "encrypted")

    def test_keyMismatch(self):
        """A certificate that is not the private key's is refused, naming both."""
        self.assertBad("ottertls:0:privateKey=%s:certKey=%s" % (
            _escape(self.certs.serverKey), _escape(self.certs.clientCert)),
            "certKey=%s" % (self.certs.clientCert,), "does not match privateKey=")

    def test_badValues(self):
        """Unknown ``verify``/``minTLS`` values and contradictory combinations are refused, naming the argument."""
        base = self.certs.otterString()
        ca = ":caCerts=" + _escape(self.certs.ca)
        self.assertBad(base + ca + ":verify=maybe", "verify=maybe", "require, optional, none")
        self.assertBad(base + ":verify=require", "verify=require needs caCerts=")
        self.assertBad(base + ":verify=optional", "verify=optional needs caCerts=")
        self.assertBad(base + ca + ":verify=none", "verify=none with caCerts=")
        self.assertBad(base + ":minTLS=1.1", "minTLS=1.1", "1.2 or 1.3")
        self.assertBad(base + ":minTLS=1.4", "minTLS=1.4")

    def test_badShape(self):
        """A missing port or key, a bad number, a stray positional or unknown argument are refused, named."""
        key = "privateKey=" + _escape(self.certs.serverKey)
        self.assertBad("ottertls:" + key, "the port comes first")
        self.assertBad("ottertls:5671", "privateKey= is required")
        self.assertBad("ottertls:tls:" + key, "port 'tls': not a number")
        self.assertBad("ottertls:70000:" + key, "port 70000")
        self.assertBad("ottertls:0:" + key + ":backlog=many", "backlog 'many': not a number")
        self.assertBad("ottertls:0:server.key:" + key, "unexpected argument 'server.key'")
        self.assertBad(self.certs.otterString(caCertsDir=self.dir, sslmethod="x"),
                       "unknown arguments caCertsDir=, sslmethod=", "known: privateKey=")


class CertificateNameTests(SynchronousTestCase):
    """
    The strings RabbitMQ makes of a certificate (rabbit_cert_info) and the
    user name ssl_cert_login_from picks (rabbit_ssl:peer_cert_auth_name).
    """

    def setUp(self):
        if x509 is None:
            raise SkipTest("the cryptography package is not installed (it makes the test certificates)")

    def cert(self, subject, sans=()):
        ca = CA("Name CA")
        key = ec.generate_private_key(ec.SECP256R1())
        b = _builder(subject, ca.cert.subject, key.public_key())
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return b.sign(ca.key, hashes.SHA256())

    def test_distinguishedName(self):
        """Last RDN first, joined by ',', multi-valued RDNs by '+', RabbitMQ's short names and escapes."""
        from otter_tx.door.tls import distinguishedName

        A = x509.NameAttribute
        name = x509.Name([
            x509.RelativeDistinguishedName([A(NameOID.COUNTRY_NAME, "GB")]),
            x509.RelativeDistinguishedName([A(NameOID.ORGANIZATION_NAME, "Acme, Inc; <x>")]),
            x509.RelativeDistinguishedName([A(NameOID.ORGANIZATIONAL_UNIT_NAME, "ops"),
                                            A(NameOID.USER_ID, "u1")]),
            x509.RelativeDistinguishedName([A(NameOID.COMMON_NAME, " #lead trail ")]),
            x509.RelativeDistinguishedName([A(NameOID.DOMAIN_COMPONENT, "example")]),
            x509.RelativeDistinguishedName([A(NameOID.EMAIL_ADDRESS, "a@b.c")]),
            x509.RelativeDistinguishedName([A(x509.ObjectIdentifier("1.2.3.4"), "λ~")]),
        ])
        rdnOU = "+".join("%s" % p for p in
                         [{"2.5.4.11": "OU=ops", "0.9.2342.19200300.100.1.1": "UID=u1"}[a.oid.dotted_string]
                          for a in name.rdns[2]])
        self.assertEqual(
            distinguishedName(name),
            "1.2.3.4=\\CE\\BB\\7E,EMAILADDRESS=a@b.c,DC=example,CN=\\ #lead trail\\ ,%s,"
            "O=Acme\\, Inc\\; \\<x\\>,C=GB" % (rdnOU,))

    def test_loginNames(self):
        """Each ssl_cert_login_from source, SAN type and index; None when there is no such name."""
        from otter_tx.door.tls import CertificateLogin

        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Otter"),
                             x509.NameAttribute(NameOID.COMMON_NAME, "a"),
                             x509.NameAttribute(NameOID.COMMON_NAME, "b")])
        cert = self.cert(subject, [
            x509.DNSName("one.example"), x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
            x509.UniformResourceIdentifier("spiffe://example/app"), x509.DNSName("two.example"),
            x509.OtherName(x509.ObjectIdentifier("1.3.6.1.4.1.311.20.2.3"), b"\x0c\x0aupn@domain"),
        ])
        cases = [
            (("distinguished_name",), "CN=b,CN=a,O=Otter"),
            (("common_name",), "a,b"),
            (("subject_alternative_name",), "one.example"),
            (("subject_alternative_name", "dns", 1), "two.example"),
            (("subject_alternative_name", "dns", 2), None),
            (("subject_alt_name", "ip"), "10.0.0.1"),
            (("subject_alternative_name", "uri"), "spiffe://example/app"),
            (("subject_alternative_name", "other_name"), "upn@domain"),
            (("subject_alternative_name", "email"), None),
        ]
        for args, expected in cases:
            self.assertEqual(CertificateLogin(*args).userName(cert), expected, args)
        self.assertIsNone(CertificateLogin("common_name").userName(
            self.cert(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "no CN")]))))
        self.assertIsNone(CertificateLogin("subject_alternative_name").userName(self.cert(subject)))

    def test_badValues(self):
        """A value RabbitMQ does not know is a ValueError naming its key."""
        from otter_tx.door.tls import CertificateLogin

        for args, key in ((("cn",), "ssl_cert_login_from"), (("common_name", "dn"), "ssl_cert_login_san_type"),
                          (("common_name", "dns", -1), "ssl_cert_login_san_index")):
            e = self.assertRaises(ValueError, CertificateLogin, *args)
            self.assertIn(key, str(e))
