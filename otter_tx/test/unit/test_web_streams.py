"""
Stream protocol connections in the management API (otter_tx.web.management
.connections and .streams, otter_tx.web._format's stream shapes): stream
door connections on StringTransport (test_stream_door's Client) over the
broker's stream queues, the management app through StubTreq (test_web's
WebTestCase), all on one task.Clock.  The shapes, the filtering and the
404s are the RabbitMQ 3.10 peer's with rabbitmq_stream_management
(bench/stream_mgmt_probe.py shows them).
"""

import struct
from urllib.parse import quote

from otter_tx.door import stream as door
from otter_tx.door.streambackend import BrokerStreams
from otter_tx.stream import wire
from otter_tx.test.unit.test_metrics import families, value
from otter_tx.test.unit.test_stream_door import Client
from otter_tx.test.unit.test_web import WebTestCase
from otter_tx.web.metrics import PrometheusResource

#: the keys RabbitMQ 3.10 lists for a stream connection (less its Erlang
#: process figures: garbage_collection, reductions)
CONNECTION_KEYS = {
    "auth_mechanism", "channel_max", "channels", "client_properties", "connected_at", "frame_max", "host",
    "name", "node", "peer_cert_issuer", "peer_cert_subject", "peer_cert_validity", "peer_host", "peer_port",
    "port", "protocol", "recv_cnt", "recv_oct", "recv_oct_details", "send_cnt", "send_oct", "send_oct_details",
    "send_pend", "ssl", "ssl_cipher", "ssl_hash", "ssl_key_exchange", "ssl_protocol", "state", "timeout", "user",
    "user_who_performed_action", "vhost",
}


class StreamClient(Client):
    """test_stream_door's Client from its own port (each connection has its own name)."""

    def __init__(self, factory, clock, port):
        from twisted.internet.testing import StringTransport

        from otter_tx.test.unit.test_stream_door import _Addr

        self.clock = clock
        self.proto = factory.buildProtocol(None)
        self.transport = StringTransport(peerAddress=_Addr("127.0.0.1", port),
                                         hostAddress=_Addr("127.0.0.1", 5552))
        self.proto.makeConnection(self.transport)
        self.reader = wire.FrameReader(0)
        self.frames = []
        self.corr = 0

    @property
    def name(self):
        return "127.0.0.1:%d -> 127.0.0.1:5552" % (self.transport.getPeer().port,)


class StreamMgmtTestCase(WebTestCase):
    def setUp(self):
        WebTestCase.setUp(self)
        self.backend = BrokerStreams(self.broker, self.clock)
        self.factory = door.StreamServerFactory(self.broker, self.backend, self.clock, heartbeat=0)
        self.addCleanup(self.broker.streams.close)
        self.port = 40000

    def settle(self):
        for _ in range(5):
            self.clock.advance(0)

    def client(self, user="guest", password="guest", vhost="/"):
        self.port += 1
        c = StreamClient(self.factory, self.clock, self.port)
        self.assertEqual(c.handshake(user=user, password=password, vhost=vhost), wire.OK)
        return c

    def addUser(self, name, tags, vhost="/"):
        self.assertEqual(self.put("/api/users/" + name, {"password": "pw", "tags": tags}).code, 201)
        self.assertEqual(self.put("/api/permissions/%s/%s" % (quote(vhost, safe=""), name),
                                  {"configure": ".*", "write": ".*", "read": ".*"}).code, 201)

    def metrics(self, path):
        from treq.testing import StubTreq

        http = StubTreq(PrometheusResource(self.broker, self.clock))
        d = http.get("http://localhost:15692" + path)
        http.flush()
        d2 = self.successResultOf(d).content()
        http.flush()
        return families(self.successResultOf(d2))

    def working(self):
        """A guest connection with stream s, publisher 1 (ref1, 2 messages confirmed) and subscription 3."""
        c = self.client()
        self.assertEqual(c.create("s"), wire.OK)
        self.assertEqual(c.declarePublisher(1, "ref1", "s"), wire.OK)
        c.feed(wire.publishFrame(1, [(1, b"hello"), (2, b"world")]))
        self.settle()
        self.assertEqual(c.subscribe(3, "s", credit=10, props={"name": "cons1"}), wire.OK)
        self.settle()
        self.assertEqual(len(c.deliveries()), 1)
        return c


class ConnectionsTests(StreamMgmtTestCase):
    def test_listed(self):
        """/api/connections lists a stream connection with RabbitMQ 3.10's keys and values."""
        c = self.working()
        r = self.get("/api/connections")
        self.assertEqual(r.code, 200)
        [d] = r.json()
        self.assertEqual(set(d), CONNECTION_KEYS)
        self.assertEqual({k: d[k] for k in ("name", "protocol", "user", "vhost", "state", "ssl", "auth_mechanism",
                                            "channels", "channel_max", "frame_max", "timeout", "host", "port",
                                            "peer_host", "peer_port", "client_properties", "connected_at",
                                            "node")},
                         {"name": c.name, "protocol": "stream", "user": "guest", "vhost": "/", "state": "running",
                          "ssl": False, "auth_mechanism": "PLAIN", "channels": 0, "channel_max": 0,
                          "frame_max": 1048576, "timeout": 0, "host": "127.0.0.1", "port": 5552,
                          "peer_host": "127.0.0.1", "peer_port": self.port, "client_properties": {"product": "test"},
                          "connected_at": 0, "node": d["node"]})
        self.assertIsNone(d["ssl_cipher"])
        self.assertIsNone(d["peer_cert_subject"])
        self.assertEqual(d["recv_oct"], c.proto.recvOct)
        self.assertGreater(d["recv_oct"], 100)
        self.assertGreater(d["recv_cnt"], 5)
        # the replies, the confirm and the chunk (its 48-byte header and deliver frame head)
        self.assertGreater(d["send_oct"], 48 + 9 + 10)
        self.assertGreater(d["send_cnt"], 5)
        self.assertEqual(self.get("/api/vhosts/%2F/connections").json(), [d])
        self.assertEqual(self.get("/api/stream/connections").json(), [d])
        self.assertEqual(self.get("/api/stream/connections/%2F").json(), [d])
        # one connection: its TLS keys are "" (the 3.10 peer's), not null
        one = dict(d, **{k: "" for k in ("ssl_cipher", "ssl_hash", "ssl_key_exchange", "ssl_protocol",
                                         "peer_cert_issuer", "peer_cert_subject", "peer_cert_validity")})
        self.assertEqual(self.get("/api/connections/" + quote(c.name, safe="")).json(), one)
        self.assertEqual(self.get("/api/connections/" + quote(c.name, safe="") + "/channels").json(), [])
        self.assertEqual(self.get("/api/stream/connections/%2F/" + quote(c.name, safe="")).json(), one)

    def test_notOpenNotListed(self):
        """A connection that has not opened a vhost yet is not listed (RabbitMQ lists it once it has)."""
        self.port += 1
        StreamClient(self.factory, self.clock, self.port)
        self.assertEqual(self.get("/api/connections").json(), [])
        self.assertEqual(self.get("/api/stream/connections").json(), [])

    def test_counts(self):
        """recv_oct counts every byte read, send_oct every byte written (chunks too)."""
        c = self.working()
        d = self.get("/api/stream/connections").json()[0]
        self.assertEqual(d["send_oct"], c.proto.sendOct)
        sent = len(c.transport.value())  # read() cleared what came before: count again from here
        before = c.proto.sendOct
        c.feed(wire.publishFrame(1, [(3, b"again")]))
        self.settle()
        written = len(c.transport.value()) - sent
        self.assertEqual(c.proto.sendOct - before, written)

    def test_delete(self):
        """DELETE /api/connections/{name} closes a stream connection's socket, with no close frame (as 3.10)."""
        c = self.working()
        c.read()
        r = self.delete("/api/connections/" + quote(c.name, safe=""))
        self.assertEqual(r.code, 204)
        self.assertTrue(c.transport.disconnecting)
        self.assertEqual(c.read(), [])
        c.proto.connectionLost(None)
        self.assertEqual(self.get("/api/connections").json(), [])

    def test_deleteStreamRoute(self):
        """DELETE /api/stream/connections/{vhost}/{name} too; another vhost's is 404."""
        c = self.working()
        self.put("/api/vhosts/other")
        path = "/api/stream/connections/{}/" + quote(c.name, safe="")
        self.assertError(self.delete(path.format("other")), 404, "Object Not Found", "Not Found")
        self.assertError(self.delete(path.format("nov")), 404, "Object Not Found", "Not Found")
        self.assertEqual(self.delete(path.format("%2F")).code, 204)
        self.assertTrue(c.transport.disconnecting)

    def test_ownConnectionsOnly(self):
        """A management user sees and closes only its own; monitoring sees all; no tag: 401."""
        self.addUser("mg", "management")
        self.addUser("mon", "monitoring")
        self.addUser("nt", "")
        g = self.working()
        m = self.client("mg", "pw")
        self.assertEqual(m.declarePublisher(2, "", "s"), wire.OK)
        self.assertEqual(m.subscribe(4, "s", spec=(wire.OFFSET_NEXT, None), credit=0), wire.OK)
        mg = ("mg", "pw")
        for path in ("/api/connections", "/api/stream/connections", "/api/stream/connections/%2F"):
            self.assertEqual([d["name"] for d in self.get(path, auth=mg).json()], [m.name], path)
            self.assertEqual([d["name"] for d in self.get(path, auth=("mon", "pw")).json()],
                             sorted([m.name, g.name]), path)
            self.assertError(self.get(path, auth=("nt", "pw")), 401, "not_authorised", "Not management user")
        for path in ("/api/stream/publishers", "/api/stream/publishers/%2F", "/api/stream/publishers/%2F/s",
                     "/api/stream/consumers", "/api/stream/consumers/%2F"):
            self.assertEqual([d["connection_details"]["user"] for d in self.get(path, auth=mg).json()], ["mg"], path)
        gpath = quote(g.name, safe="")
        for path in ("/api/connections/" + gpath, "/api/stream/connections/%2F/" + gpath,
                     "/api/stream/connections/%2F/" + gpath + "/publishers"):
            self.assertError(self.get(path, auth=mg), 401, "not_authorised", "User not authorised to access object")
        self.assertEqual(self.get("/api/stream/connections/%2F/" + gpath, auth=("mon", "pw")).code, 200)
        self.assertError(self.delete("/api/stream/connections/%2F/" + gpath, auth=("mon", "pw")), 401,
                         "not_authorised", "User not authorised to access object")
        self.assertEqual(self.get("/api/stream/connections/%2F/" + quote(m.name, safe="") + "/consumers",
                                  auth=mg).json()[0]["subscription_id"], 4)
        self.assertEqual(self.delete("/api/stream/connections/%2F/" + quote(m.name, safe=""), auth=mg).code, 204)
        self.assertTrue(m.transport.disconnecting)

    def test_vhostAccess(self):
        """The {vhost} routes need access to the vhost (401); a missing vhost is 404."""
        self.addUser("mg", "management")
        self.put("/api/vhosts/other")
        self.working()
        for path in ("/api/stream/connections/other", "/api/stream/publishers/other",
                     "/api/stream/consumers/other"):
            self.assertError(self.get(path, auth=("mg", "pw")), 401, "not_authorised",
                             "User not authorised to access virtual host")
            self.assertEqual(self.get(path).json(), [])
        for path in ("/api/stream/connections/nov", "/api/stream/publishers/nov", "/api/stream/consumers/nov",
                     "/api/stream/publishers/nov/s", "/api/stream/publishers/%2F/nope",
                     "/api/stream/connections/%2F/nope", "/api/stream/connections/%2F/nope/publishers",
                     "/api/stream/connections/%2F/nope/consumers"):
            self.assertError(self.get(path), 404, "Object Not Found", "Not Found")

    def test_overviewAndPrometheus(self):
        """
        The overview's object totals, rabbitmq_connections, rabbitmq_consumers, the queue's consumers
        and the connections' bytes count stream connections and subscriptions (3.10 does).
        """
        c = self.working()
        totals = self.get("/api/overview").json()["object_totals"]
        self.assertEqual((totals["connections"], totals["consumers"]), (1, 1))
        fams = self.metrics("/metrics")
        self.assertEqual((value(fams, "rabbitmq_connections"), value(fams, "rabbitmq_consumers"),
                          value(fams, "rabbitmq_queue_consumers"), value(fams, "rabbitmq_process_open_tcp_sockets")),
                         (1, 1, 1, 1))
        self.assertEqual(value(fams, "rabbitmq_connection_incoming_bytes_total"), c.proto.recvOct)
        fams = self.metrics("/metrics/per-object")
        self.assertEqual(value(fams, "rabbitmq_queue_consumers", vhost="/", queue="s"), 1)
        self.assertEqual(value(fams, "rabbitmq_connection_outgoing_bytes_total", vhost="/", connection=c.name),
                         c.proto.sendOct)
        self.assertEqual(value(fams, "rabbitmq_connection_channels", vhost="/", connection=c.name), 0)


class PublishersConsumersTests(StreamMgmtTestCase):
    def test_publisher(self):
        """A publisher's counts: published (each frame's count), confirmed, errored; a duplicate is confirmed."""
        c = self.working()
        c.feed(wire.publishFrame(1, [(2, b"dup")]))
        self.settle()
        [d] = self.get("/api/stream/publishers").json()
        self.assertEqual(d, {
            "connection_details": {"name": c.name, "node": d["connection_details"]["node"],
                                   "peer_host": "127.0.0.1", "peer_port": self.port, "user": "guest"},
            "publisher_id": 1, "queue": {"name": "s", "vhost": "/"}, "reference": "ref1",
            "published": 3, "confirmed": 3, "errored": 0,
        })
        for path in ("/api/stream/publishers/%2F", "/api/stream/publishers/%2F/s",
                     "/api/stream/connections/%2F/" + quote(c.name, safe="") + "/publishers"):
            self.assertEqual(self.get(path).json(), [d], path)
        self.assertEqual(c.create("t"), wire.OK)
        self.assertEqual(self.get("/api/stream/publishers/%2F/t").json(), [])

    def test_errored(self):
        """Publishing ids answered with a publish error count as errored."""
        c = self.working()
        c.proto._remoteWrite(c.proto.publishers[1], [7, 8], b"", 2)
        d = self.get("/api/stream/publishers").json()[0]
        self.assertEqual((d["published"], d["confirmed"], d["errored"]), (2, 2, 2))

    def test_consumer(self):
        """
        A consumer's offset is the first offset of the last chunk delivered;
        offset_lag how far the stream's last chunk starts past it; consumed
        counts messages; credits what is left (as the 3.10 peer shows them).
        """
        c = self.working()
        [d] = self.get("/api/stream/consumers").json()
        self.assertEqual(d, {
            "connection_details": {"name": c.name, "node": d["connection_details"]["node"],
                                   "peer_host": "127.0.0.1", "peer_port": self.port, "user": "guest"},
            "subscription_id": 3, "queue": {"name": "s", "vhost": "/"}, "properties": {"name": "cons1"},
            "credits": 9, "consumed": 2, "offset": 0, "offset_lag": 0,
        })
        # no credit: later chunks wait, the lag grows
        c.proto.subscriptions[3].credit = 0
        for i in (3, 4):
            c.feed(wire.publishFrame(1, [(i, b"m%d" % i)]))
            self.settle()
        d = self.get("/api/stream/consumers").json()[0]
        last = self.backend.stats("/", "s")["committed_chunk_id"]
        self.assertEqual((d["consumed"], d["offset"], d["offset_lag"], d["credits"]), (2, 0, last, 0))
        c.feed(struct.pack(">IHHBH", 7, wire.CREDIT, 1, 3, 5))
        self.settle()
        c.deliveries()
        d = self.get("/api/stream/consumers").json()[0]
        self.assertEqual((d["consumed"], d["offset_lag"]), (4, 0))
        self.assertLessEqual(d["offset"], last)
        self.assertGreater(d["offset"], 0)
        for path in ("/api/stream/consumers/%2F", "/api/stream/connections/%2F/" + quote(c.name, safe="")
                     + "/consumers"):
            self.assertEqual(self.get(path).json(), [d], path)

    def test_beforeDelivery(self):
        """Before a chunk is delivered, a consumer's offset is 0 wherever it starts (as the 3.10 peer)."""
        c = self.working()
        c.feed(wire.publishFrame(1, [(3, b"c")]))
        self.settle()
        last = self.backend.stats("/", "s")["committed_chunk_id"]
        self.assertEqual(last, 2)
        for sid, spec in ((5, (wire.OFFSET_NEXT, None)), (6, (wire.OFFSET_OFFSET, 1))):
            self.assertEqual(c.subscribe(sid, "s", spec=spec, credit=0), wire.OK)
            d = [x for x in self.get("/api/stream/consumers").json() if x["subscription_id"] == sid][0]
            self.assertEqual((d["offset"], d["consumed"], d["offset_lag"]), (0, 0, 2))


class AsConsumersTests(StreamMgmtTestCase):
    def test_consumersList(self):
        """A subscription is in /api/consumers and its stream queue's consumers, as 3.10 lists it."""
        self.addUser("mg", "management")
        c = self.working()
        expected = {
            "consumer_tag": "stream.subid-3", "ack_required": False, "exclusive": False, "prefetch_count": 0,
            "active": True, "activity_status": "up", "arguments": {"name": "cons1"},
            "channel_details": {"name": "", "number": 0, "connection_name": c.name, "peer_host": "127.0.0.1",
                                "peer_port": self.port, "user": "guest",
                                "node": self.get("/api/overview").json()["node"]},
            "queue": {"name": "s", "vhost": "/"},
        }
        self.assertEqual(self.get("/api/consumers").json(), [expected])
        self.assertEqual(self.get("/api/consumers/%2F").json(), [expected])
        self.assertEqual(self.get("/api/consumers", auth=("mg", "pw")).json(), [])
        q = self.get("/api/queues/%2F/s").json()
        self.assertEqual((q["consumers"], q["consumer_details"]), (1, [expected]))
        self.assertEqual(self.get("/api/queues").json()[0]["consumers"], 1)


class ChurnTests(StreamMgmtTestCase):
    def test_openedAndClosed(self):
        """
        As the 3.10 peer counts them: a stream connection is opened once it opens a vhost, closed
        when it goes, also one that never opened (rabbitmq_connections_opened/closed_total).
        """
        c = self.client()
        counters = self.broker.counters
        self.assertEqual((counters.connectionsOpened, counters.connectionsClosed), (1, 0))
        c.proto.connectionLost(None)
        self.port += 1
        bare = StreamClient(self.factory, self.clock, self.port)
        bare.proto.connectionLost(None)
        self.assertEqual((counters.connectionsOpened, counters.connectionsClosed), (1, 2))
        fams = self.metrics("/metrics")
        self.assertEqual((value(fams, "rabbitmq_connections_opened_total"),
                          value(fams, "rabbitmq_connections_closed_total")), (1, 2))
