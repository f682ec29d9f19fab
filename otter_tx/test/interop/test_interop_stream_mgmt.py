"""
Stream protocol connections in the management API, with a real stream client
(rstream) and a raw one: ``/api/connections`` and rabbitmq_stream_management's
``/api/stream/...`` routes list them, their publishers and consumers with
their counts, and DELETE closes one.  In the reference run
(``OTTER_TEST_STREAM_PORT`` and ``OTTER_TEST_MGMT_URL`` for the RabbitMQ 3.10
peer with rabbitmq_stream_management) the same test runs against RabbitMQ;
the peer refreshes these figures every 5 seconds, so each look polls.
"""

import asyncio
import time
import urllib.parse

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from otter_tx.stream import wire
from otter_tx.test.interop.support import EXTERNAL, EXTERNAL_MGMT_URL, EXTERNAL_OTTER
from otter_tx.test.interop.test_interop_stream_protocol import StreamInteropTestCase, collect
# (the keys RabbitMQ 3.10 and otter_tx list for a stream connection)
from otter_tx.test.unit.test_web_streams import CONNECTION_KEYS

PUBLISHER_KEYS = {"confirmed", "connection_details", "errored", "published", "publisher_id", "queue", "reference"}
CONSUMER_KEYS = {"connection_details", "consumed", "credits", "offset", "offset_lag", "properties", "queue",
                 "subscription_id"}
DETAILS_KEYS = {"name", "node", "peer_host", "peer_port", "user"}
class StreamManagementTests(StreamInteropTestCase):
    brokerOptions = {"stream": True, "management": True}

    def setUp(self):
        if EXTERNAL and not EXTERNAL_MGMT_URL:
            raise SkipTest("set OTTER_TEST_MGMT_URL for the external broker's management API")
        return StreamInteropTestCase.setUp(self)

    def mgmtBase(self):
        if EXTERNAL:
            return EXTERNAL_MGMT_URL.rstrip("/")
        return "http://127.0.0.1:%d" % (self.fixture.managementPort,)

    def mgmt(self, method, path):
        """``(status, JSON)`` of one request as guest (blocking: call it in a thread)."""
        from otter_tx.test.interop.support import ManagementMixin

        return ManagementMixin.mgmtCall(self, method, path)

    def poll(self, path, ready, seconds=20):
        """(Blocking.) ``GET path`` until ``ready(json)`` is true (its answer), or fail after ``seconds``."""
        deadline = time.time() + seconds
        while True:
            status, body = self.mgmt("GET", path)
            if status == 200 and ready(body):
                return body
            if time.time() > deadline:
                raise AssertionError("%s: %r" % (path, body))
            time.sleep(0.2)

    @inlineCallbacks
    def test_publishersAndConsumers(self):
        """
        An rstream producer (reference ``ref``) and consumer (``name``
        property) are listed with their connections: 3 published, confirmed,
        consumed; the connections are ``"protocol": "stream"`` in
        ``/api/connections`` too.
        """
        rstream = self.rstream()
        name = self.name("mgmt")
        self.deleteLater(name)
        quoted = urllib.parse.quote(name, safe="")

        def have(items, pred):
            mine = [d for d in items if d["queue"]["name"] == name]
            return mine if mine and all(pred(d) for d in mine) else None

        async def run():
            loop = asyncio.get_running_loop()

            def look(path, pred, seconds=20):
                """The items of ``path`` on this test's stream (other tests' may be listed too)."""
                return loop.run_in_executor(
                    None, lambda: have(self.poll(path, lambda b: have(b, pred), seconds), pred))

            async with self.producer(rstream) as p:
                await p.create_stream(name)
                for i in range(3):
                    await p.send_wait(name, rstream.AMQPMessage(body=b"m%d" % i), publisher_name="ref")
                async with self.consumer(rstream) as c:
                    got = await collect(c, name, rstream, 3, properties={"name": "cons1"})
                    pubs = await look("/api/stream/publishers", lambda d: d["confirmed"] == 3)
                    subs = await look("/api/stream/consumers", lambda d: d["consumed"] == 3)
                    byStream = await look("/api/stream/publishers/%2F/" + quoted, lambda d: True)
                    asConsumers = await look("/api/consumers", lambda d: True)
                    queue = await loop.run_in_executor(None, lambda: (200, self.poll(
                        "/api/queues/%2F/" + quoted, lambda d: d.get("consumers") == 1)))
                    names = {pubs[0]["connection_details"]["name"], subs[0]["connection_details"]["name"]}
                    # (the peer lists a connection's figures once it has emitted them)
                    conns = await loop.run_in_executor(None, lambda: self.poll(
                        "/api/connections", lambda b: len([d for d in b if d["name"] in names
                                                           and CONNECTION_KEYS <= set(d)]) == len(names)))
                    streamConns = await loop.run_in_executor(
                        None, lambda: self.mgmt("GET", "/api/stream/connections/%2F")[1])
                    connName = pubs[0]["connection_details"]["name"]
                    q = urllib.parse.quote(connName, safe="")
                    one = await loop.run_in_executor(
                        None, lambda: self.mgmt("GET", "/api/stream/connections/%2F/" + q))
                    connPubs = await loop.run_in_executor(
                        None, lambda: self.mgmt("GET", "/api/stream/connections/%2F/" + q + "/publishers"))
                    missing = await loop.run_in_executor(
                        None, lambda: self.mgmt("GET", "/api/stream/publishers/%2F/" + quoted + "-none")[0])
            return got, pubs, subs, byStream, conns, streamConns, one, connPubs, missing, asConsumers, queue

        got, pubs, subs, byStream, conns, streamConns, one, connPubs, missing, asConsumers, queue = \
            yield self.inAsyncio(run)
        self.assertEqual(len(got), 3)
        [pub] = pubs
        self.assertEqual(set(pub), PUBLISHER_KEYS)
        self.assertEqual(set(pub["connection_details"]), DETAILS_KEYS)
        self.assertEqual((pub["reference"], pub["published"], pub["confirmed"], pub["errored"], pub["queue"]),
                         ("ref", 3, 3, 0, {"name": name, "vhost": "/"}))
        [sub] = subs
        self.assertEqual(set(sub), CONSUMER_KEYS)
        self.assertEqual((sub["consumed"], sub["properties"].get("name"), sub["queue"]),
                         (3, "cons1", {"name": name, "vhost": "/"}))
        self.assertEqual(sub["offset_lag"], 0)
        self.assertEqual([d["publisher_id"] for d in byStream], [pub["publisher_id"]])
        self.assertEqual(missing, 404)
        # a subscription is a consumer of the stream queue too
        [cons] = asConsumers
        self.assertEqual((cons["consumer_tag"], cons["ack_required"], cons["prefetch_count"], cons["arguments"].get("name"),
                          cons["channel_details"]["name"], cons["channel_details"]["number"],
                          cons["channel_details"]["connection_name"]),
                         ("stream.subid-%d" % sub["subscription_id"], False, 0, "cons1", "", 0,
                          sub["connection_details"]["name"]))
        self.assertEqual((queue[0], queue[1]["consumers"], [d["consumer_tag"] for d in queue[1]["consumer_details"]]),
                         (200, 1, [cons["consumer_tag"]]))
        names = {pub["connection_details"]["name"], sub["connection_details"]["name"]}
        listed = {d["name"]: d for d in conns if d["name"] in names}
        self.assertEqual(set(listed), names)
        for d in listed.values():
            self.assertTrue(CONNECTION_KEYS <= set(d), CONNECTION_KEYS - set(d))
            self.assertEqual((d["protocol"], d["user"], d["vhost"], d["state"], d["ssl"], d["channels"],
                              d["auth_mechanism"]), ("stream", "guest", "/", "running", False, 0, "PLAIN"))
            if not EXTERNAL_OTTER:
                # (in a cluster rstream connects where the metadata says: the leader's or a replica's node)
                self.assertEqual(d["port"], self.streamPort)
        self.assertTrue(names <= {d["name"] for d in streamConns})
        self.assertEqual((one[0], one[1]["name"], one[1]["protocol"]), (200, pub["connection_details"]["name"],
                                                                        "stream"))
        self.assertEqual((connPubs[0], [d["publisher_id"] for d in connPubs[1]]), (200, [pub["publisher_id"]]))

    @inlineCallbacks
    def test_delete(self):
        """DELETE /api/connections/{name} of a stream connection: 204, the client's socket closes with no frame."""
        def run():
            c = self.raw()
            self.assertEqual(c.handshake(), wire.OK)
            port = c.sock.getsockname()[1]
            conns = self.poll("/api/connections", lambda b: [d for d in b if d["peer_port"] == port
                                                              and d.get("protocol") == "stream"])
            [d] = [d for d in conns if d["peer_port"] == port]
            status, _ = self.mgmt("DELETE", "/api/connections/" + urllib.parse.quote(d["name"], safe=""))
            frames = []
            try:
                while True:
                    frames.append(c.frame())
            except EOFError:
                pass
            gone = self.poll("/api/connections", lambda b: not [x for x in b if x["peer_port"] == port] or None)
            return status, frames, gone is not None

        status, frames, gone = yield self.inThread(run)
        self.assertEqual((status, frames, gone), (204, [], True))
