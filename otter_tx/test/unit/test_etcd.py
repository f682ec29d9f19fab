"""
otter_tx.cluster.etcd without etcd: the gateway's JSON both ways, the watch stream parser, the
endpoint fail-over rules, the watch's reconnect bookkeeping and LeaseKeeper on a task.Clock.
The same client against real etcd: otter_tx.test.interop.test_etcd.
"""

import base64
import json

from twisted.internet import defer, task
from twisted.internet.error import ConnectionRefusedError
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseFailed

from otter_tx.cluster.etcd import (
    Compare, EtcdClient, EtcdError, EtcdTimeout, EtcdUnavailable, Event, KeyValue, LeaseKeeper, Op,
    WatchStreamParser, decodeResponse, decodeTxn, decodeWatchMessage, prefixRangeEnd,
)


def b64(s):
    return base64.b64encode(s).decode("ascii")


class EncodingTests(SynchronousTestCase):
    """Requests as the gateway reads them."""

    def test_prefixRangeEnd(self):
        """The range end of a prefix increments its last byte below 0xff; an empty or all-0xff prefix means every key."""
        self.assertEqual(prefixRangeEnd(b"/q/"), b"/q0")
        self.assertEqual(prefixRangeEnd("a\xff".encode("latin-1")), b"b")
        self.assertEqual(prefixRangeEnd(b"a\xff\xff"), b"b")
        self.assertEqual(prefixRangeEnd(b""), b"\0")
        self.assertEqual(prefixRangeEnd(b"\xff"), b"\0")

    def test_compare(self):
        """Compare builders name the target, the result and the field, int64s as strings and values in base64."""
        self.assertEqual(Compare.version("k", "=", 0).json,
                         {"key": b64(b"k"), "target": "VERSION", "result": "EQUAL", "version": "0"})
        self.assertEqual(Compare.modRevision(b"k", "<", 7).json,
                         {"key": b64(b"k"), "target": "MOD", "result": "LESS", "mod_revision": "7"})
        self.assertEqual(Compare.createRevision(b"k", ">", 2).json["create_revision"], "2")
        self.assertEqual(Compare.value("k", "!=", b"\x00v").json,
                         {"key": b64(b"k"), "target": "VALUE", "result": "NOT_EQUAL", "value": b64(b"\x00v")})
        self.assertEqual(Compare.lease("k", "=", 12).json["lease"], "12")
        self.assertRaises(ValueError, Compare.version, "k", "<=", 1)

    def test_ops(self):
        """Op builders: put with an optional lease, delete and get of one key or a prefix."""
        self.assertEqual(Op.put("k", "v").json, {"request_put": {"key": b64(b"k"), "value": b64(b"v")}})
        self.assertEqual(Op.put("k", "v", lease=2 ** 62).json["request_put"]["lease"], str(2 ** 62))
        self.assertEqual(Op.delete("k").json, {"request_delete_range": {"key": b64(b"k")}})
        self.assertEqual(Op.get("/p/", prefix=True).json,
                         {"request_range": {"key": b64(b"/p/"), "range_end": b64(b"/p0")}})
        self.assertEqual(Op.delete("/p/", prefix=True).json["request_delete_range"]["range_end"], b64(b"/p0"))


class DecodingTests(SynchronousTestCase):
    """Answers of the gateway as the client returns them."""

    def test_errorAnswer(self):
        """An error body becomes EtcdError with its message, gRPC code and HTTP status."""
        body = b'{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}'
        e = self.assertRaises(EtcdError, decodeResponse, 404, body)
        self.assertEqual((e.message, e.code, e.status), ("etcdserver: requested lease not found", 5, 404))

    def test_nonJSONAnswer(self):
        """A non-JSON answer (an unknown path) becomes EtcdError with the text and the status."""
        e = self.assertRaises(EtcdError, decodeResponse, 404, b"Not Found\n")
        self.assertEqual((e.message, e.code, e.status), ("Not Found", None, 404))

    def test_okAnswer(self):
        """A 200 JSON answer is returned as a dict."""
        self.assertEqual(decodeResponse(200, b'{"header":{"revision":"3"}}'), {"header": {"revision": "3"}})

    def test_txn(self):
        """A txn answer decodes to succeeded, one OpResponse per op, and the revision; absent zero fields read as 0."""
        obj = {"header": {"revision": "9"}, "succeeded": True, "responses": [
            {"response_put": {"header": {"revision": "9"}}},
            {"response_range": {"header": {"revision": "9"}, "kvs": [
                {"key": b64(b"k"), "create_revision": "9", "mod_revision": "9", "version": "1"}], "count": "1"}},
            {"response_delete_range": {"header": {"revision": "9"}, "deleted": "2"}},
            {"response_range": {"header": {"revision": "9"}}}]}
        ok, responses, rev = decodeTxn(obj)
        self.assertEqual((ok, rev), (True, 9))
        self.assertEqual([r.kind for r in responses], ["put", "range", "delete", "range"])
        self.assertEqual(responses[1].kvs, [KeyValue(b"k", b"", 9, 1)])
        self.assertEqual(responses[2].deleted, 2)
        self.assertEqual(responses[3].kvs, [])
        self.assertEqual(decodeTxn({"header": {"revision": "4"}})[0], False)

    def test_watchMessages(self):
        """Watch messages: created, events (PUT when type is absent), compaction, and an error object."""
        created = decodeWatchMessage({"result": {"header": {"revision": "3"}, "created": True}})
        self.assertEqual((created.created, created.revision, created.events), (True, 3, []))
        events = decodeWatchMessage({"result": {"header": {"revision": "5"}, "events": [
            {"kv": {"key": b64(b"a"), "mod_revision": "4", "version": "1", "value": b64(b"x")}},
            {"type": "DELETE", "kv": {"key": b64(b"a"), "mod_revision": "5"}}]}})
        self.assertEqual(events.events, [Event("PUT", b"a", b"x", 4), Event("DELETE", b"a", b"", 5)])
        compacted = decodeWatchMessage({"result": {"header": {"revision": "3"}, "canceled": True,
                                                   "compact_revision": "3"}})
        self.assertEqual((compacted.canceled, compacted.compactRevision), (True, 3))
        err = decodeWatchMessage({"error": {"grpc_code": 14, "message": "etcdserver: no leader"}})
        self.assertEqual(err.error, "etcdserver: no leader")


class WatchStreamParserTests(SynchronousTestCase):
    """The watch stream split into JSON objects whatever the chunking."""

    STREAM = (b'{"result":{"header":{"revision":"3"},"created":true}}\n'
              b'{"result":{"header":{"revision":"4"},"events":[{"kv":{"key":"YQ==","mod_revision":"4"}}]}}\n'
              b'\n{"result":{"header":{"revision":"5"},"events":[{"type":"DELETE","kv":{"key":"YQ=="}}]}}\n')

    def test_whole(self):
        """The whole stream in one chunk gives every object in order."""
        objs = WatchStreamParser().feed(self.STREAM)
        self.assertEqual([decodeWatchMessage(o).revision for o in objs], [3, 4, 5])

    def test_everySplit(self):
        """Every split of the stream into two and into single bytes gives the same objects."""
        whole = WatchStreamParser().feed(self.STREAM)
        for i in range(len(self.STREAM) + 1):
            p = WatchStreamParser()
            self.assertEqual(p.feed(self.STREAM[:i]) + p.feed(self.STREAM[i:]), whole)
        p = WatchStreamParser()
        got = []
        for i in range(len(self.STREAM)):
            got.extend(p.feed(self.STREAM[i:i + 1]))
        self.assertEqual(got, whole)

    def test_partialWaits(self):
        """An unfinished line gives nothing until its newline arrives."""
        p = WatchStreamParser()
        self.assertEqual(p.feed(b'{"result":'), [])
        self.assertEqual(p.feed(b'{}}'), [])
        self.assertEqual(p.feed(b'\n'), [{"result": {}}])


class _ScriptedClient(EtcdClient):
    """An EtcdClient whose HTTP attempts are answered by a script: endpoint -> callable(path, payload)."""

    def __init__(self, endpoints, script, clock):
        EtcdClient.__init__(self, endpoints, clock, timeout=1.0)
        self.script = script
        self.calls = []

    def _attempt(self, url, payload, timeout):
        endpoint = [e for e in self.endpoints if url.startswith(e)][0]
        self.calls.append((endpoint, url[len(endpoint):]))
        try:
            return defer.succeed(self.script[endpoint](url[len(endpoint):], json.loads(payload)))
        except Exception:
            return defer.fail()


def _refused(path, body):
    raise ConnectionRefusedError()


def _dropped(path, body):
    raise ResponseFailed([Failure(Exception("lost"))])


def _ok(path, body):
    return 200, b'{"header":{"revision":"7"},"kvs":[{"key":"aw==","value":"dg==","mod_revision":"6","version":"2"}]}'


class FailOverTests(SynchronousTestCase):
    """Which failures send a request to the next endpoint."""

    def client(self, script):
        return _ScriptedClient(["http://a", "http://b", "http://c"], script, task.Clock())

    def test_refusedGoesToNext(self):
        """A refused connection sends reads and writes to the next endpoint, which is remembered."""
        c = self.client({"http://a": _refused, "http://b": _ok, "http://c": _ok})
        self.assertEqual(self.successResultOf(c.get("k")), (b"v", 6, 2))
        self.assertEqual(self.successResultOf(c.put("k", "v")), 7)
        self.assertEqual(c.endpoint, "http://b")
        self.assertEqual([ep for ep, _ in c.calls], ["http://a", "http://b", "http://b"])

    def test_droppedWriteIsNotRetried(self):
        """A write whose connection dropped after sending fails with EtcdTimeout; a read goes on to the next endpoint."""
        c = self.client({"http://a": _dropped, "http://b": _ok, "http://c": _ok})
        self.failureResultOf(c.put("k", "v"), EtcdTimeout)
        self.assertEqual(self.successResultOf(c.get("k")).value, b"v")

    def test_allRefused(self):
        """Every endpoint refused: EtcdUnavailable listing each endpoint once."""
        c = self.client({"http://a": _refused, "http://b": _refused, "http://c": _refused})
        f = self.failureResultOf(c.get("k"), EtcdUnavailable)
        self.assertEqual([ep for ep, _ in f.value.failures], ["http://a", "http://b", "http://c"])

    def test_etcdErrorIsNotRetried(self):
        """An error answer of etcd is raised as it is, not tried elsewhere."""
        c = self.client({"http://a": lambda p, b: (400, b'{"message":"bad","code":3}'), "http://b": _ok,
                         "http://c": _ok})
        f = self.failureResultOf(c.get("k"), EtcdError)
        self.assertEqual(f.value.code, 3)
        self.assertEqual(len(c.calls), 1)

    def test_requestShapes(self):
        """get, getPrefix (serializable too), put with a lease, deletePrefix and keepAlive send the documented JSON."""
        seen = []
        c = self.client({"http://a": lambda p, b: seen.append((p, b)) or (200, b'{"result":{"TTL":"4"}}')})
        c.get("k")
        c.getPrefix("/p/")
        c.put("k", b"v", lease=5)
        c.deletePrefix("/p/")
        c.getPrefix("/p/", serializable=True)
        self.assertEqual(self.successResultOf(c.keepAlive(5)), 4)
        self.assertEqual(seen, [
            ("/v3/kv/range", {"key": b64(b"k")}),
            ("/v3/kv/range", {"key": b64(b"/p/"), "range_end": b64(b"/p0")}),
            ("/v3/kv/put", {"key": b64(b"k"), "value": b64(b"v"), "lease": "5"}),
            ("/v3/kv/deleterange", {"key": b64(b"/p/"), "range_end": b64(b"/p0")}),
            ("/v3/kv/range", {"key": b64(b"/p/"), "range_end": b64(b"/p0"), "serializable": True}),
            ("/v3/lease/keepalive", {"ID": "5"})])


class _FakeTransport:
    def __init__(self, protocol):
        self.protocol = protocol
        self.stopped = False

    def stopProducing(self):
        if not self.stopped:
            self.stopped = True
            self.protocol.connectionLost(Failure(Exception("closed")))


class _FakeResponse:
    code = 200

    def __init__(self, owner):
        self.owner = owner

    def deliverBody(self, protocol):
        protocol.makeConnection(_FakeTransport(protocol))
        self.owner.streams.append(protocol)


class _FakeStreamHTTP:
    """Stands for the client's streaming HTTPClient: records each watch request, answered by the test."""

    def __init__(self):
        self.requests = []
        self.streams = []

    def post(self, url, data, **kw):
        d = defer.Deferred()
        self.requests.append((url, json.loads(data), d))
        return d

    def answer(self):
        self.requests[-1][2].callback(_FakeResponse(self))
        return self.streams[-1]


def _line(obj):
    return json.dumps(obj).encode() + b"\n"


def _created(rev):
    return _line({"result": {"header": {"revision": str(rev)}, "created": True}})


def _put(key, rev):
    return {"kv": {"key": b64(key), "value": b64(b"%d" % rev), "mod_revision": str(rev)}}


class WatchTests(SynchronousTestCase):
    """The watch's reconnect and revision bookkeeping, with the HTTP stream faked."""

    def setUp(self):
        self.clock = task.Clock()
        self.client = EtcdClient(["http://a", "http://b"], self.clock, timeout=1.0)
        self.http = self.client._stream = _FakeStreamHTTP()
        self.events, self.states, self.compacted = [], [], []

    def watch(self, start):
        return self.client.watchPrefix("/p/", start, self.events.extend, onCompacted=self.compacted.append,
                                       onStateChange=self.states.append, maxBackoff=0.4)

    def test_reconnectFromLastRevision(self):
        """A dropped stream is made again on the next endpoint from the last reported revision + 1, after a backoff."""
        w = self.watch(None)
        url, req, _ = self.http.requests[0]
        self.assertEqual(url, "http://a/v3/watch")
        self.assertNotIn("start_revision", req["create_request"])
        s = self.http.answer()
        s.dataReceived(_created(10))
        s.dataReceived(_line({"result": {"header": {"revision": "12"}, "events": [_put(b"/p/a", 11), _put(b"/p/b", 12)]}}))
        self.assertEqual([e.modRevision for e in self.events], [11, 12])
        s.transport.stopProducing()
        self.assertEqual(self.states, [True, False])
        self.assertEqual(len(self.http.requests), 1)
        self.clock.advance(0.05)
        url, req, _ = self.http.requests[1]
        self.assertEqual((url, req["create_request"]["start_revision"]), ("http://b/v3/watch", "13"))
        s = self.http.answer()
        s.dataReceived(_created(14))
        # a repeated revision is not reported twice
        s.dataReceived(_line({"result": {"events": [_put(b"/p/b", 12), _put(b"/p/c", 13)]}}))
        self.assertEqual([e.modRevision for e in self.events], [11, 12, 13])
        self.assertEqual(self.states, [True, False, True])
        self.assertEqual(w.lastRevision, 13)
        self.successResultOf(w.stop())

    def test_createdRevisionWhenFromNow(self):
        """Watching from now, a drop before any event resumes after the revision the stream was created at."""
        self.watch(None)
        s = self.http.answer()
        s.dataReceived(_created(20))
        s.transport.stopProducing()
        self.clock.advance(0.05)
        self.assertEqual(self.http.requests[1][1]["create_request"]["start_revision"], "21")

    def test_backoffBoundedAndReset(self):
        """Failed connects back off 0.05, 0.1, 0.2, 0.4, 0.4 s, alternating endpoints; a created stream resets it."""
        self.watch(5)
        delays = []
        for _ in range(5):
            self.http.requests[-1][2].errback(Failure(ConnectionRefusedError()))
            call = self.clock.getDelayedCalls()[0]
            delays.append(round(call.getTime() - self.clock.seconds(), 3))
            self.clock.advance(delays[-1])
        self.assertEqual(delays, [0.05, 0.1, 0.2, 0.4, 0.4])
        self.assertEqual([r[0] for r in self.http.requests], ["http://a/v3/watch", "http://b/v3/watch"] * 3)
        self.assertEqual(self.states, [False])
        s = self.http.answer()
        s.dataReceived(_created(5))
        s.transport.stopProducing()
        self.assertAlmostEqual(self.clock.getDelayedCalls()[0].getTime() - self.clock.seconds(), 0.05)
        self.assertEqual(self.http.requests[-1][1]["create_request"]["start_revision"], "5")

    def test_compactionStops(self):
        """A compaction cancel is reported once and the watch does not reconnect."""
        w = self.watch(3)
        s = self.http.answer()
        s.dataReceived(_line({"result": {"header": {"revision": "9"}, "created": True}})
                       + _line({"result": {"header": {"revision": "9"}, "canceled": True, "compact_revision": "7"}}))
        self.assertEqual(self.compacted, [7])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(len(self.http.requests), 1)
        self.successResultOf(w.stop())

    def test_stopCancelsEverything(self):
        """stop() during a backoff leaves no timer and makes no further request; no callback runs after it."""
        w = self.watch(3)
        self.http.requests[-1][2].errback(Failure(ConnectionRefusedError()))
        self.successResultOf(w.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.states, [False])

    def test_reconnect(self):
        """reconnect() drops a live stream and makes it again on the next endpoint from the next revision."""
        w = self.watch(3)
        s = self.http.answer()
        s.dataReceived(_created(3) + _line({"result": {"events": [_put(b"/p/a", 4)]}}))
        w.reconnect()
        self.assertTrue(s.transport.stopped)
        self.clock.advance(0.05)
        self.assertEqual(self.http.requests[-1][0], "http://b/v3/watch")
        self.assertEqual(self.http.requests[-1][1]["create_request"]["start_revision"], "5")
        w.reconnect()  # while connecting: the attempt is cancelled and made again
        self.clock.advance(0.1)
        self.assertEqual(len(self.http.requests), 3)

    def test_errorObjectDropsStream(self):
        """An error object in the stream (no leader) drops the stream and reconnects."""
        self.watch(3)
        s = self.http.answer()
        s.dataReceived(_created(3) + _line({"error": {"grpc_code": 14, "message": "etcdserver: no leader"}}))
        self.assertTrue(s.transport.stopped)
        self.assertEqual(self.states, [True, False])
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)


class _LeaseClient:
    """A fake client for LeaseKeeper: records keepalives; the test answers them."""

    def __init__(self):
        self.keepalives = []
        self.revoked = []

    def grantLease(self, ttl):
        return defer.succeed(42)

    def keepAlive(self, leaseId, timeout=None):
        self.timeout = timeout
        d = defer.Deferred()
        self.keepalives.append(d)
        return d

    def revokeLease(self, leaseId):
        self.revoked.append(leaseId)
        return defer.succeed(1)


class LeaseKeeperTests(SynchronousTestCase):
    """LeaseKeeper on a task.Clock."""

    def setUp(self):
        self.clock = task.Clock()
        self.client = _LeaseClient()
        self.lost = []
        self.keeper = LeaseKeeper(self.client, 6, self.clock, onLost=self.lost.append)
        self.assertEqual(self.successResultOf(self.keeper.start()), 42)

    def test_refreshEveryThird(self):
        """A keepalive goes every ttl/3 seconds while answers come; the lease is kept."""
        for i in range(1, 6):
            self.clock.advance(2)
            self.assertEqual(len(self.client.keepalives), i)
            self.client.keepalives[-1].callback(6)
        self.assertEqual((self.lost, self.keeper.leaseId), ([], 42))

    def test_keepaliveTimeout(self):
        """Keepalives give up on a member after a quarter of the TTL, so the others are tried in time."""
        self.clock.advance(2)
        self.assertEqual(self.client.timeout, 1.5)

    def test_ttlZeroIsLost(self):
        """A keepalive answered with TTL 0 reports the loss at once."""
        self.clock.advance(2)
        self.client.keepalives[-1].callback(0)
        self.assertEqual(len(self.lost), 1)
        self.assertIsNone(self.keeper.leaseId)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_unreachableUntilExpiry(self):
        """Failing keepalives are retried; the loss is reported when the lease would have expired, not before."""
        self.clock.advance(2)
        self.client.keepalives[-1].callback(6)  # sent at t=2: the lease now lasts until t=8
        self.clock.advance(2)
        self.client.keepalives[-1].errback(EtcdUnavailable("down"))
        self.clock.advance(2)
        self.client.keepalives[-1].errback(EtcdUnavailable("down"))
        self.clock.advance(1.9)
        self.assertEqual(self.lost, [])
        self.clock.advance(0.1)
        self.assertEqual(len(self.lost), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_hangingKeepalive(self):
        """A keepalive that never answers does not stack more requests, and the loss comes at the expiry."""
        self.clock.advance(2)
        self.clock.advance(2)
        self.clock.advance(1.9)
        self.assertEqual(len(self.client.keepalives), 1)
        self.assertEqual(self.lost, [])
        self.clock.advance(0.1)
        self.assertEqual(len(self.lost), 1)

    def test_stopRevokes(self):
        """stop() revokes the lease, leaves no timer and reports no loss."""
        self.successResultOf(self.keeper.stop())
        self.assertEqual((self.client.revoked, self.lost, self.clock.getDelayedCalls()), ([42], [], []))

