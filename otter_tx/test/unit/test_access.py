"""
Unit tests for otter_tx.broker.access: password hashing, the permission
regexes and their per-session cache, and the one loopback rule both doors
(AMQP login, HTTP login) use.
"""

import base64
import json

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import spec
from otter_tx.amqp.errors import AMQPError
from otter_tx.broker import access
from otter_tx.broker.broker import Broker
from otter_tx.door.protocol import AMQPServerFactory
from otter_tx.testing import FakeClient
from otter_tx.web.management import ManagementApp
from otter_tx.web.management.authz import ANY, authenticate
from otter_tx.web.management.http import HTTPError

#: (peer host, loopback?) as RabbitMQ's rabbit_net:is_loopback/1 decides
LOOPBACK_TABLE = [
    ("127.0.0.1", True),
    ("127.1.2.3", True),
    ("::1", True),
    ("::ffff:127.0.0.1", True),
    ("::ffff:127.9.8.7", True),
    ("localhost", True),
    ("", True),
    (None, True),
    ("10.0.0.1", False),
    ("128.0.0.1", False),
    ("::2", False),
    ("::ffff:10.0.0.1", False),
    ("fe80::1%eth0", False),
    ("not-an-address", False),
]


class ConstantsTests(SynchronousTestCase):
    """The permission kinds."""

    def test_kinds(self):
        """CONFIGURE, WRITE and READ index a (configure, write, read) permissions tuple."""
        self.assertEqual((access.CONFIGURE, access.WRITE, access.READ), (0, 1, 2))


class PasswordTests(SynchronousTestCase):
    """Salted SHA-256 password hashes."""

    def test_hashIsSaltedSha256(self):
        """The hash is SHA-256 over the 4-octet salt and the UTF-8 password, both base64."""
        import hashlib

        salt, digest = access.hashPassword("pw", base64.b64encode(b"salt").decode())
        self.assertEqual(base64.b64decode(digest), hashlib.sha256(b"saltpw").digest())
        self.assertEqual(len(base64.b64decode(access.hashPassword("pw")[0])), 4)

    def test_checkPassword(self):
        """A user accepts its password only; a user without one accepts nothing."""
        u = access.User("u", "secret")
        self.assertTrue(u.checkPassword("secret"))
        self.assertFalse(u.checkPassword("Secret"))
        self.assertFalse(u.checkPassword(None))
        self.assertFalse(access.User("n", None).checkPassword(""))


class PermitsTests(SynchronousTestCase):
    """The regex rule and the per-session cache."""

    def setUp(self):
        self.broker = Broker(Clock())
        self.broker.addUser("u", "pw")
        self.broker.setPermissions("u", "/", "^c-", "^w-", "^r-")

    def test_rule(self):
        """Each kind matches its own regex; the default exchange is checked as amq.default; bad or empty regexes permit nothing."""
        p = self.broker.permissions
        self.assertTrue(access.permits(p, "u", "/", access.CONFIGURE, "queue", "c-q"))
        self.assertFalse(access.permits(p, "u", "/", access.WRITE, "queue", "c-q"))
        self.assertTrue(access.permits(p, "u", "/", access.READ, "exchange", "r-x"))
        self.assertFalse(access.permits(p, "u", "other", access.READ, "exchange", "r-x"))
        self.assertTrue(access.permits({("u", "/"): ("", "^amq\\.default$", "")}, "u", "/", access.WRITE,
                                       "exchange", ""))
        self.assertFalse(access.permits({("u", "/"): ("(", "", "")}, "u", "/", access.CONFIGURE, "queue", "x"))

    def test_checkRaises403(self):
        """check raises RabbitMQ's 403 text naming the resource, vhost and user."""
        a = access.Access(self.broker, "u", "/")
        a.check(access.WRITE, "exchange", "w-x")
        e = self.assertRaises(AMQPError, a.check, access.WRITE, "exchange", "")
        self.assertEqual((e.code, e.text), (403, "ACCESS_REFUSED - access to exchange 'amq.default' in "
                                                 "vhost '/' refused for user 'u'"))

    def test_cacheInvalidatedOnChange(self):
        """A cached answer is dropped when permissions are set or cleared."""
        a = access.Access(self.broker, "u", "/")
        self.assertFalse(a.allows(access.READ, "queue", "q"))
        self.broker.setPermissions("u", "/", "", "", ".*")
        self.assertTrue(a.allows(access.READ, "queue", "q"))
        self.broker.clearPermissions("u", "/")
        self.assertFalse(a.allows(access.READ, "queue", "q"))

    def test_cacheHit(self):
        """An unchanged permission set is matched once per resource."""
        calls = []
        self.patch(access, "permits", lambda *a: calls.append(a) or True)
        a = access.Access(self.broker, "u", "/")
        a.allows(access.READ, "queue", "q")
        a.allows(access.READ, "queue", "q")
        self.assertEqual(len(calls), 1)

    def test_declareChecks(self):
        """A dead-letter exchange or an alternate exchange adds read on the object and write on the other exchange."""
        self.assertEqual(access.queueDeclareChecks("q", {"x-dead-letter-exchange": "dlx"}),
                         [(0, "queue", "q"), (2, "queue", "q"), (1, "exchange", "dlx")])
        self.assertEqual(access.exchangeDeclareChecks("x", {}), [(0, "exchange", "x")])
        self.assertEqual(access.bindChecks("queue", "q", "x"), [(1, "queue", "q"), (2, "exchange", "x")])


class LoopbackTests(SynchronousTestCase):
    """The loopback rule, and the two doors that use it."""

    def setUp(self):
        self.clock = Clock()
        self.broker = Broker(self.clock)

    def test_table(self):
        """isLoopback accepts 127.0.0.0/8, ::1, ::ffff:127.x and localhost, nothing else."""
        for host, expected in LOOPBACK_TABLE:
            self.assertEqual(access.isLoopback(host), expected, host)

    def _amqpLogin(self, address, name="guest"):
        c = FakeClient(AMQPServerFactory(self.broker, self.clock, heartbeat=0), handshake=False)
        c.protocol.peer = address
        return not any(isinstance(m, spec.ConnectionClose) for _, m, _ in c.handshake(user=name))

    def _checkDoor(self, login):
        """``login(address)`` is True exactly for the table's loopback addresses (the IP ones)."""
        for host, expected in LOOPBACK_TABLE:
            if host in (None, "", "localhost"):
                continue
            cls = IPv6Address if ":" in host else IPv4Address
            self.assertEqual(login(cls("TCP", host, 40000)), expected, host)

    def test_amqpDoor(self):
        """guest (loopback-only) logs in over AMQP exactly from the loopback addresses of the table (::ffff:127.0.0.1 too)."""
        self._checkDoor(self._amqpLogin)

    def _httpLogin(self, address, name="guest"):
        mgmt = ManagementApp(self.broker, self.clock)

        class Req:
            def getHeader(self, header):
                return b"Basic " + base64.b64encode(name.encode() + b":guest")

            def getClientAddress(self):
                return address

        try:
            return authenticate(mgmt.broker, Req(), ANY).name == name
        except HTTPError as e:
            self.assertEqual((e.code, json.dumps(e.reason)), (401, '"User can only log in via localhost"'))
            return False

    def test_httpDoor(self):
        """guest logs in over HTTP exactly from the loopback addresses of the table (::ffff:127.0.0.1 too)."""
        self._checkDoor(self._httpLogin)

    def _recreateGuest(self):
        """Re-create guest through the HTTP door (PUT /api/users/guest), as RabbitMQ's default user can be."""
        from treq.testing import StubTreq

        mgmt = ManagementApp(self.broker, self.clock)
        treq = StubTreq(mgmt.app.resource())
        auth = ("guest", "guest")
        r = self.successResultOf(treq.put("http://localhost/api/users/guest", auth=auth,
                                          data=json.dumps({"password": "guest", "tags": "administrator"})))
        self.assertEqual(r.code, 204)

    def test_recreatedGuestStaysLoopbackOnly(self):
        """guest re-created with PUT /api/users/guest is still refused from elsewhere on both doors: the rule goes by name."""
        self._recreateGuest()
        self._checkDoor(self._amqpLogin)
        self._checkDoor(self._httpLogin)

    def test_emptyLoopbackUsers(self):
        """With loopbackUsers empty, guest logs in from any address on both doors."""
        self.broker = Broker(self.clock, loopbackUsers=())
        for door in (self._amqpLogin, self._httpLogin):
            for host in ("10.0.0.1", "::2"):
                cls = IPv6Address if ":" in host else IPv4Address
                self.assertTrue(door(cls("TCP", host, 40000)), host)

    def test_otherNameListed(self):
        """A listed user created later (alice) is refused from elsewhere on both doors; guest, unlisted, is not."""
        self.broker = Broker(self.clock, loopbackUsers=("alice",))
        self.broker.addUser("alice", "guest", tags=["administrator"])
        self.broker.setPermissions("alice", "/")
        outside = IPv4Address("TCP", "10.0.0.1", 40000)
        for door in (self._amqpLogin, self._httpLogin):
            self.assertTrue(door(outside))
            self.assertFalse(door(outside, "alice"))
            self.assertTrue(door(IPv4Address("TCP", "127.0.0.1", 40000), "alice"))


class LoginTests(SynchronousTestCase):
    """access.login, the one login rule of both doors."""

    def setUp(self):
        self.broker = Broker(Clock())

    def test_goodPasswordFromLoopback(self):
        """The right password from a loopback address logs in."""
        user, refusal = access.login(self.broker.users, "guest", "guest", "127.0.0.1")
        self.assertEqual((user.name, refusal), ("guest", None))

    def test_refusals(self):
        """A wrong password, an unknown or unreadable user are invalid credentials; a loopback-only user from elsewhere is refused as such."""
        cases = [
            (("guest", "wrong", "127.0.0.1"), access.INVALID_CREDENTIALS),
            (("nobody", "guest", "127.0.0.1"), access.INVALID_CREDENTIALS),
            ((None, None, "127.0.0.1"), access.INVALID_CREDENTIALS),
            (("guest", "guest", "10.0.0.1"), access.LOOPBACK_ONLY),
            (("guest", "wrong", "10.0.0.1"), access.INVALID_CREDENTIALS),
        ]
        for args, reason in cases:
            self.assertEqual(access.login(self.broker.users, *args + (self.broker.loopbackUsers,)),
                             (None, reason), args)

    def test_byName(self):
        """The loopback rule goes by the name in loopbackUsers, not by the user: alice listed is refused, guest unlisted is let in."""
        self.broker.addUser("alice", "secret")
        self.assertEqual(access.login(self.broker.users, "alice", "secret", "10.0.0.1", {"alice"}),
                         (None, access.LOOPBACK_ONLY))
        user, refusal = access.login(self.broker.users, "guest", "guest", "10.0.0.1", {"alice"})
        self.assertEqual((user.name, refusal), ("guest", None))
        user, refusal = access.login(self.broker.users, "guest", "guest", "10.0.0.1", ())
        self.assertEqual((user.name, refusal), ("guest", None))

    def test_otherUsersFromAnywhere(self):
        """A user that is not loopback-only logs in from any address."""
        self.broker.addUser("alice", "secret")
        user, refusal = access.login(self.broker.users, "alice", "secret", "10.0.0.1")
        self.assertEqual((user.name, refusal), ("alice", None))

    def test_certificateLogin(self):
        """SASL EXTERNAL's rule: no password, the user must exist, the loopback rule by name still applies."""
        self.broker.addUser("CN=app1", None)
        user, refusal = access.certificateLogin(self.broker.users, "CN=app1", "10.0.0.1", {"guest"})
        self.assertEqual((user.name, refusal), ("CN=app1", None))
        for args, reason in (((None, "127.0.0.1"), access.INVALID_CREDENTIALS),
                             (("CN=nobody", "127.0.0.1"), access.INVALID_CREDENTIALS),
                             (("guest", "10.0.0.1"), access.LOOPBACK_ONLY)):
            self.assertEqual(access.certificateLogin(self.broker.users, *args + ({"guest"},)), (None, reason), args)
        # a user without a password cannot log in with one
        self.assertEqual(access.login(self.broker.users, "CN=app1", "", "127.0.0.1"),
                         (None, access.INVALID_CREDENTIALS))
