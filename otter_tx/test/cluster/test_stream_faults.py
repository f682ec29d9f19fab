"""
Replicated streams under faults (issue 23, otter_tx/cluster/streamrepl.py):
a real etcd and three ``twistd ottermq`` processes
(:class:`~otter_tx.cluster.local.LocalCluster`), driven by pika (and rstream
for the stream protocol) in threads, as test_quorum_faults.py drives the
quorum queues.  The leader's node is SIGKILLed at a random moment (the seed
is printed; ``OTTER_FAULT_SEED`` repeats a run); every wait is bounded.
The invariants: every message a publisher confirm acknowledged is in the
stream, read from the first offset through a surviving node, in publishing
order, at offsets without gaps; the new leader's record is of epoch 2; the
killed node started again catches up as a follower.
"""

import asyncio
import base64
import json
import platform
import time
import urllib.request

import pika
import pika.exceptions
from twisted.internet import reactor, task, threads
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from otter_tx.cluster import metadata as md
from otter_tx.test.cluster.test_processes import params
from otter_tx.test.cluster.test_quorum_faults import ProcessClusterCase, _Load, queueJSON, waitFor

STREAM = {"x-queue-type": "stream"}
NAME = "rs"
#: messages per stream protocol publish (one batch outstanding)
STREAM_BATCH = 20


def etcdRecord(cluster, name=NAME):
    """The queue's record in etcd (the cluster's first endpoint, a linearizable read), or None."""
    key = ("/otter/" + md.queueKey("/", name)).encode()
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    for endpoint in cluster.etcd.endpoints:
        try:
            req = urllib.request.Request(endpoint + "/v3/kv/range", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as r:
                kvs = json.loads(r.read()).get("kvs") or []
            return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None
        except Exception:
            continue
    return None


def readStream(port, name, want, seconds, idle=1.0):
    """
    Consume stream ``name`` from ``x-stream-offset: first`` through the node
    on ``port`` (prefetch 100, manual acks) until every body in ``want`` came
    and nothing more for ``idle`` s, or ``seconds`` passed (a failed
    connection is made again, from the first offset): the list of
    ``(offset, int body)`` in delivery order.
    """
    deadline = time.monotonic() + seconds
    got = []
    while time.monotonic() < deadline:
        got = []
        try:
            c = pika.BlockingConnection(params(port))
            try:
                ch = c.channel()
                ch.basic_qos(prefetch_count=100)
                quietSince = time.monotonic()
                for method, props, body in ch.consume(name, arguments={"x-stream-offset": "first"},
                                                      inactivity_timeout=0.1):
                    now = time.monotonic()
                    if method is None:
                        if now > deadline or (now - quietSince > idle and want <= {b for _, b in got}):
                            break
                        continue
                    quietSince = now
                    got.append((props.headers["x-stream-offset"], int(body)))
                    ch.basic_ack(method.delivery_tag)
                    if now > deadline:
                        break
            finally:
                if c.is_open:
                    c.close()
            return got
        except (pika.exceptions.AMQPError, OSError):
            time.sleep(0.2)
    return got


def readReplica(port, name, upTo, seconds):
    """
    Subscribe with the stream protocol (rstream's client, a raw subscription
    that does not follow the metadata: it reads the log of the node on
    ``port``) from the first offset until offset ``upTo - 1`` came or
    ``seconds`` passed: the list of ``(offset, body)``.
    """
    import rstream
    from rstream import constants, schema
    from rstream.client import Client

    async def run():
        got = []
        done = asyncio.Event()
        c = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
        await c.start()
        await c.authenticate("/", "guest", "guest")

        async def onDeliver(frame):
            offset = frame.chunk_first_offset
            for message in frame.get_messages():
                got.append((offset, bytes(rstream.amqp_decoder(message).body)))
                offset += 1
            await c.credit(1, 1)
            if got and got[-1][0] >= upTo - 1:
                done.set()

        # (rstream queues Deliver frames per subscription: the handler is named by its id)
        await c.run_queue_listener_task(1, onDeliver)
        c.add_handler(schema.Deliver, onDeliver, name="1")
        try:
            r = await c.sync_request(
                schema.Subscribe(c._corr_id_seq.next(), subscription_id=1, stream=name,
                                 offset_spec=schema.OffsetSpec(constants.OffsetType.FIRST), credit=10,
                                 properties=[]),
                resp_schema=schema.SubscribeResponse, raise_exception=False)
            if r.response_code != 1:
                raise AssertionError("subscribe on port %d: response code %d" % (port, r.response_code))
            try:
                await asyncio.wait_for(done.wait(), seconds)
            except asyncio.TimeoutError:
                pass
        finally:
            await asyncio.wait_for(c.close(), 5)
        return got

    return asyncio.run(asyncio.wait_for(run(), seconds + 20))


class StreamFaultTests(ProcessClusterCase):
    queueName = NAME

    @inlineCallbacks
    def startStream(self):
        q = yield self.startReplicated(STREAM, wait=30)
        self.assertEqual(q["type"], "stream")
        return q

    def clusterLog(self):
        return "etcd record: %s\n%s" % (etcdRecord(self.cluster, NAME), ProcessClusterCase.clusterLog(self))

    @inlineCallbacks
    def killLeaderUnderLoad(self, seed, rng, load, publisher, victim):
        """
        ``publisher`` (a thread's function) publishes with confirms into
        ``load.confirmed`` on a node that does not lead the stream; the
        leader's node (``victim``) is SIGKILLed after a random 1-3 s:
        (victim, the new leader's index).  Publishing goes on until confirms came again.
        """
        self.addCleanup(load.stop)
        pub = threads.deferToThread(publisher)
        try:
            yield task.deferLater(reactor, rng.uniform(1.0, 3.0), lambda: None)
            self.assertGreater(len(load.confirmed), 0, "no confirm before the kill (seed %d): %s" % (
                seed, load.failures[:3]))
            before = len(load.confirmed)
            killed = time.monotonic()
            newLeader = yield self.killLeader(seed, victim, 30)
            again = yield threads.deferToThread(waitFor, lambda: len(load.confirmed) > before + 10, 30)
            self.assertTrue(again, "no confirms within 30 s of the kill (seed %d): %s\n%s" % (
                seed, load.failures[-3:], (yield threads.deferToThread(self.clusterLog))))
            print("leader otter%d killed: new leader %s, confirms again %.2f s after the kill" % (
                victim + 1, newLeader, time.monotonic() - killed))
            yield task.deferLater(reactor, 0.5, lambda: None)
        finally:
            load.stopPublishing.set()
            yield pub
        return victim, self.index(newLeader)

    @inlineCallbacks
    def checkEverythingConfirmedIsThere(self, seed, load, victim, newLeader, maxResent):
        """
        Every confirmed message read from the first offset through each
        surviving node, in publishing order at offsets 0, 1, 2...; the
        record names the new leader in epoch 2: the list read.

        No message is in the stream twice (``maxResent`` 0): an AMQP 0-9-1
        publish in flight through a node that does not lead the stream is
        sent again by that node to the new leader with its writer id and
        sequence, and one the old leader had written and shipped is not
        taken again (as RabbitMQ's osiris by the channel's writer id).
        """
        rec = yield threads.deferToThread(etcdRecord, self.cluster)
        self.assertEqual((rec["node"], rec["epoch"]), ("otter%d" % (newLeader + 1,), 2),
                         "seed %d: record %s" % (seed, rec))
        self.assertEqual(rec["stream_epochs"][0], [1, 0])
        self.assertEqual([e for e, _ in rec["stream_epochs"]], [1, 2])
        confirmed = set(load.confirmed)
        self.assertGreater(len(confirmed), 50, "too little load to mean anything (seed %d)" % (seed,))
        reads = []
        for i in range(3):
            if i == victim:
                continue
            got = yield threads.deferToThread(readStream, self.cluster.nodes[i].amqpPort, NAME, confirmed, 60)
            offsets = [o for o, _ in got]
            bodies = [b for _, b in got]
            self.assertEqual(offsets, list(range(len(got))), "seed %d: offsets read through otter%d have gaps" % (
                seed, i + 1))
            lost = sorted(confirmed - set(bodies))
            self.assertEqual(lost, [], "seed %d: confirmed messages missing through otter%d" % (seed, i + 1))
            firstSeen = {}
            for o, b in got:
                firstSeen.setdefault(b, o)
            inStream = sorted((o, b) for b, o in firstSeen.items() if b in confirmed)
            self.assertEqual([b for _, b in inStream], sorted(confirmed),
                             "seed %d: confirmed messages out of order" % (seed,))
            reads.append(got)
        self.assertEqual(reads[0], reads[1], "seed %d: the two survivors read differently" % (seed,))
        got = reads[0]
        epoch2 = rec["stream_epochs"][1][1]
        where = {}
        for o, b in got:
            where.setdefault(b, []).append(o)
        twice = {b: os_ for b, os_ in where.items() if len(os_) > 1}
        for b, os_ in twice.items():
            self.assertTrue(len(os_) == 2 and os_[0] < epoch2 <= os_[1],
                            "seed %d: message %d at offsets %s (epoch 2 from %d)" % (seed, b, os_, epoch2))
        self.assertLessEqual(len(twice), maxResent, "seed %d: %d messages twice" % (seed, len(twice)))
        print("%d confirmed, %d nacked, %d in the stream (%d unconfirmed ones kept, %d written again by the new "
              "leader%s), epochs %s, %d client failures" % (
                  len(confirmed), load.nacked, len(got), len(where) - len(confirmed), len(twice),
                  ": %d..%d" % (min(twice), max(twice)) if twice else "", rec["stream_epochs"],
                  len(load.failures)))
        return got

    @inlineCallbacks
    def checkRejoins(self, seed, victim, newLeader, expected):
        """
        The killed node started again: it follows the new leader (its queue
        JSON says so), is in sync (``online``), and its log holds what the
        stream held (``expected``, read earlier) and what was confirmed since.
        """
        nodes = self.cluster.nodes
        restarted = time.monotonic()
        yield nodes[victim].start()
        q = yield threads.deferToThread(
            waitFor, lambda: (lambda q: q if q and "otter%d" % (victim + 1,) in q.get("online", ()) else None)(
                queueJSON(nodes[newLeader], NAME)), 60)
        self.assertTrue(q, "seed %d: otter%d not in sync within 60 s of its restart\n%s" % (
            seed, victim + 1, (yield threads.deferToThread(self.clusterLog))))
        print("otter%d back in sync %.2f s after its start" % (victim + 1, time.monotonic() - restarted))
        self.assertEqual(q["leader"], "otter%d" % (newLeader + 1,))
        seen = yield threads.deferToThread(waitFor, lambda: self.leaderSeenBy(victim) == q["leader"], 30)
        self.assertTrue(seen, "seed %d: otter%d does not name the new leader" % (seed, victim + 1))
        rec = yield threads.deferToThread(etcdRecord, self.cluster)
        self.assertEqual((rec["epoch"], sorted(rec["online"])), (2, ["otter1", "otter2", "otter3"]))

        # 20 more, confirmed on the restarted node (three members in sync now)
        def publish():
            c = pika.BlockingConnection(params(nodes[victim].amqpPort))
            try:
                ch = c.channel()
                ch.confirm_delivery()
                for k in range(20):
                    ch.basic_publish("", NAME, b"%d" % (10 ** 9 + k,), pika.BasicProperties(delivery_mode=2))
            finally:
                c.close()

        yield threads.deferToThread(publish)
        leaderQ = yield threads.deferToThread(queueJSON, nodes[newLeader], NAME)
        committed = leaderQ["stream"]["committed_offset"]
        self.assertEqual(committed, len(expected) + 20)
        want = expected + [(len(expected) + k, 10 ** 9 + k) for k in range(20)]
        if platform.python_implementation() == "CPython":
            try:
                import rstream  # noqa: F401
            except ImportError:
                rstream = None
            if rstream is not None:
                # its own log, through the stream protocol (a subscription on a replica reads it)
                got = yield threads.deferToThread(readReplica, nodes[victim].streamPort, NAME, committed, 60)
                self.assertEqual([(o, int(b)) for o, b in got], want,
                                 "seed %d: the restarted replica's log differs" % (seed,))
        got = yield threads.deferToThread(readStream, nodes[victim].amqpPort, NAME, {b for _, b in want}, 60)
        self.assertEqual(got, want)

    @inlineCallbacks
    def test_leaderKilledUnderAMQPPublishing(self):
        """
        (a) A 3-member stream, a pika publisher with confirms on a node that
        does not lead it; the leader's node SIGKILLed at a random moment:
        a follower takes over in epoch 2 and every confirmed message is
        read through both survivors, in order, offsets without gaps.
        (b) The killed node started again rejoins as a follower and catches
        up: in ``online``, its log as the leader's.
        """
        seed, rng = self.seed("test_leaderKilledUnderAMQPPublishing")
        q = yield self.startStream()
        leader = self.index(q["leader"])
        others = [i for i in range(3) if i != leader]
        pubNode = others[rng.randrange(2)]
        load = _Load(NAME, lambda: self.cluster.nodes[pubNode].amqpPort, None)
        victim, newLeader = yield self.killLeaderUnderLoad(seed, rng, load, load.publisher, leader)
        self.assertEqual(victim, leader)
        got = yield self.checkEverythingConfirmedIsThere(seed, load, victim, newLeader, 0)
        yield self.checkRejoins(seed, victim, newLeader, got)

    @inlineCallbacks
    def test_leaderKilledUnderStreamProtocolPublishing(self):
        """
        (c) The same with a stream protocol publisher (rstream's client,
        publishing ids and confirms) on a node that does not lead the
        stream at first, which (as rstream's Producer) publishes at the
        leader the metadata names and goes to the new leader after the
        kill: every confirmed publishing id is in the stream, in order,
        once (de-duplicated by publisher reference across reconnections).
        """
        if platform.python_implementation() != "CPython":
            raise SkipTest("rstream needs mmh3, which does not build on PyPy")
        try:
            import rstream  # noqa: F401
        except ImportError:
            raise SkipTest("rstream is not installed")
        seed, rng = self.seed("test_leaderKilledUnderStreamProtocolPublishing")
        q = yield self.startStream()
        leader = self.index(q["leader"])
        others = [i for i in range(3) if i != leader]
        rng.shuffle(others)
        load = _Load(NAME, None, None)
        ports = [self.cluster.nodes[i].streamPort for i in others]
        victim, newLeader = yield self.killLeaderUnderLoad(
            seed, rng, load, lambda: streamPublisher(load, ports), leader)
        self.assertEqual(victim, leader)
        # (the batch resent after the failover is de-duplicated by the new leader: none twice)
        got = yield self.checkEverythingConfirmedIsThere(seed, load, victim, newLeader, 0)
        yield self.checkRejoins(seed, victim, newLeader, got)


def streamPublisher(load, ports, batch=None):
    """
    Publish with the stream protocol to ``load.name`` as rstream's Producer
    does: ask a node (``ports``, tried in turn) for the stream's metadata,
    connect to its leader, declare a publisher with a reference, and publish
    until ``load.stopPublishing``: batches of ``batch`` messages (body = the
    publishing id), one batch outstanding at a time, confirms into
    ``load.confirmed``.  A failed connection is made again to the leader the
    metadata names then, the reference's sequence asked for, and what the
    broker lacks of the unconfirmed batch sent again (so each id is in the
    stream once).
    """
    import rstream
    from rstream import schema
    from rstream.client import Client

    batch = batch or STREAM_BATCH
    state = {"next": 1, "try": 0}

    async def connect(port):
        c = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
        await asyncio.wait_for(c.start(), 10)
        await asyncio.wait_for(c.authenticate("/", "guest", "guest"), 10)
        return c

    async def session():
        port = ports[state["try"] % len(ports)]
        state["try"] += 1
        locator = await connect(port)
        try:
            leader, _ = await asyncio.wait_for(locator.query_leader_and_replicas(load.name), 10)
        finally:
            await asyncio.wait_for(locator.close(), 5)
        c = await connect(leader.port)
        pending = {}
        drained = asyncio.Event()

        def onConfirm(frame):
            for pid in frame.publishing_ids:
                if pending.pop(pid, None) is not None:
                    load.confirmed.append(pid)
            if not pending:
                drained.set()

        def onError(frame):
            for e in frame.publishing_errors:
                if pending.pop(e.publishing_id, None) is not None:
                    load.nacked += 1
            if not pending:
                drained.set()

        c.add_handler(schema.PublishConfirm, onConfirm)
        c.add_handler(schema.PublishError, onError)
        try:
            await asyncio.wait_for(c.declare_publisher(load.name, "fault-publisher", 1), 10)
            # (after a reconnection: what the leader has of the reference is not sent again)
            last = await asyncio.wait_for(c.query_publisher_sequence(load.name, "fault-publisher"), 10)
            while not load.stopPublishing.is_set():
                first = max(state["next"], last + 1)
                ids = list(range(first, first + batch))
                for pid in ids:
                    pending[pid] = True
                drained.clear()
                await c.publish([schema.Message(publishing_id=pid, data=bytes(rstream.AMQPMessage(body=b"%d" % pid)),
                                                filter_value=None) for pid in ids], 1)
                deadline = time.monotonic() + 15
                while not drained.is_set():
                    if not c.is_connection_alive():
                        raise ConnectionError("the connection to the leader closed")
                    if time.monotonic() > deadline:
                        raise TimeoutError("no confirm in 15 s")
                    await asyncio.sleep(0.01)
                state["next"] = ids[-1] + 1
                last = ids[-1]
        finally:
            try:
                await asyncio.wait_for(c.close(), 5)
            except Exception:
                pass

    while not load.stopPublishing.is_set():
        try:
            asyncio.run(session())
        except Exception as e:  # the leader went, or a timeout
            load.failures.append(repr(e))
            time.sleep(0.2)


class StreamCopiesSweptTests(ProcessClusterCase):

    queueName = NAME

    @inlineCallbacks
    def test_deletedWhileDownIsSweptAtStart(self):
        """
        A node SIGKILLed while one of its streams is deleted and its member
        of another is deleted: started again, it deletes both copies (it is
        no longer a member) and keeps and syncs the stream it still follows.
        """
        import os
        import signal

        from otter_tx.broker.stream import _dirName

        yield self.startReplicated(STREAM, wait=30)
        nodes = self.cluster.nodes

        def declare():
            c = pika.BlockingConnection(params(nodes[0].amqpPort))
            ch = c.channel()
            for name in ("gone", "left"):
                ch.queue_declare(name, durable=True, arguments=STREAM)
            c.close()
            return waitFor(lambda: all(len((queueJSON(nodes[0], n) or {}).get("online", ())) == 3
                                       for n in ("gone", "left")), 30)

        self.assertTrue((yield threads.deferToThread(declare)))
        victim = [i for i in range(3) if i != self.index(queueJSON(nodes[0], "left")["leader"])][-1]
        root = os.path.join(nodes[victim].dataDir, "streams")
        paths = {n: os.path.join(root, _dirName("/", n)) for n in ("gone", "left", NAME)}
        self.assertTrue(all(os.path.isdir(p) for p in paths.values()), os.listdir(root))
        yield nodes[victim].kill(signal.SIGKILL)
        survivor = (victim + 1) % 3

        def change():
            c = pika.BlockingConnection(params(nodes[survivor].amqpPort))
            c.channel().queue_delete("gone")
            c.close()
            req = urllib.request.Request(
                "http://127.0.0.1:%d/api/queues/stream/%%2F/left/replicas/delete" % (nodes[survivor].managementPort,),
                data=json.dumps({"node": "otter%d" % (victim + 1,)}).encode(), method="DELETE",
                headers={"content-type": "application/json",
                         "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
            return urllib.request.urlopen(req, timeout=10).status

        self.assertEqual((yield threads.deferToThread(change)), 202)
        yield nodes[victim].start()
        synced = yield threads.deferToThread(
            waitFor, lambda: "otter%d" % (victim + 1,) in (queueJSON(nodes[survivor], NAME) or {}).get("online", ()), 60)
        self.assertTrue(synced, (yield threads.deferToThread(self.clusterLog)))
        self.assertEqual(sorted(os.listdir(root)), [os.path.basename(paths[NAME])])
