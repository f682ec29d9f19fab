"""
A randomized fault run against a replicated quorum queue (issue 22, docs/cluster.md "Replicated
quorum queues"): a local 3-node otter_tx cluster on a 3-member etcd, one 3-member quorum queue, a
publisher with confirms and an acking consumer (pika, in threads, each on a node that is up, moving
on when its connection fails), and for ``--seconds`` a fault every 1-3 s chosen by the seed: SIGKILL a
node and start it again 0.2-3 s later, or SIGSTOP a node for 1-8 s (past its 5 s lease or not).  At
most one node is faulty at a time.  At the end every message a confirm acknowledged must have been
received at least once; duplicates are counted.  The seed is printed; ``--seed`` repeats a run.

    .venv-test/bin/python bench/quorum_faults.py --seconds 120 [--seed N]

Prints one line per fault and a summary (and ``--json FILE``); exits 1 when a confirmed message was lost.
"""

import argparse
import base64
import json
import random
import signal
import sys
import time
import urllib.request

import pika
import pika.exceptions
from twisted.internet import defer, reactor, task, threads

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(
    __file__))))

from otter_tx.cluster.local import LocalCluster  # noqa: E402
from otter_tx.test.cluster.test_quorum_faults import _Load  # noqa: E402

QUEUE = "faults-qq"


def params(port):
    return pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5, connection_attempts=1,
                                     blocked_connection_timeout=10, heartbeat=0)


def queueJSON(node):
    req = urllib.request.Request("http://127.0.0.1:%d/api/queues/%%2F/%s" % (node.managementPort, QUEUE))
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except Exception:
        return None


@defer.inlineCallbacks
def run(args):
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    print("quorum_faults seed %d (--seed %d repeats it)" % (seed, seed), flush=True)
    rng = random.Random(seed)
    cluster = LocalCluster(reactor, nodes=3, etcdMembers=args.etcd_members)
    yield cluster.start()
    nodes = cluster.nodes
    faulty = set()
    result = {"seed": seed, "faults": []}
    load = None
    try:
        def declare():
            c = pika.BlockingConnection(params(nodes[0].amqpPort))
            c.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
            c.close()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                q = queueJSON(nodes[0])
                if q and len(q.get("online", ())) == 3:
                    return True
                time.sleep(0.05)
            return False

        if not (yield threads.deferToThread(declare)):
            raise RuntimeError("the queue's followers did not join")
        # (any node that is up, chosen again at each reconnection)
        loadRng = random.Random(rng.random())

        def pick():
            return loadRng.choice([n.amqpPort for i, n in enumerate(nodes) if i not in faulty])

        load = _Load(QUEUE, pick, pick, prefetch=100)
        pub = threads.deferToThread(load.publisher)
        con = threads.deferToThread(load.consumer)
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            yield task.deferLater(reactor, rng.uniform(1.0, 3.0), lambda: None)
            victim = rng.randrange(3)
            at = round(time.monotonic() - started, 1)
            if rng.random() < 0.5:
                down = rng.uniform(0.2, 3.0)
                print("%6.1f s  SIGKILL otter%d, start again after %.1f s (%d confirmed)" % (
                    at, victim + 1, down, len(load.confirmed)), flush=True)
                faulty.add(victim)
                yield nodes[victim].kill(signal.SIGKILL)
                yield task.deferLater(reactor, down, lambda: None)
                yield nodes[victim].start()
                faulty.discard(victim)
                result["faults"].append(["kill", victim + 1, at, round(down, 1)])
            else:
                paused = rng.uniform(1.0, 8.0)
                print("%6.1f s  SIGSTOP otter%d for %.1f s (%d confirmed)" % (
                    at, victim + 1, paused, len(load.confirmed)), flush=True)
                faulty.add(victim)
                yield nodes[victim].kill(signal.SIGSTOP)
                yield task.deferLater(reactor, paused, lambda: None)
                yield nodes[victim].kill(signal.SIGCONT)
                yield task.deferLater(reactor, 1.0, lambda: None)
                faulty.discard(victim)
                result["faults"].append(["pause", victim + 1, at, round(paused, 1)])
        yield task.deferLater(reactor, 2.0, lambda: None)
        load.stopPublishing.set()
        yield pub
        confirmed = set(load.confirmed)

        def drained():
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline and not confirmed <= set(load.received):
                time.sleep(0.1)

        yield threads.deferToThread(drained)
        load.stopConsuming.set()
        yield con
        lost = sorted(confirmed - set(load.received))
        result.update({"seconds": args.seconds, "confirmed": len(confirmed), "nacked": load.nacked,
                       "received": len(load.received), "distinct_received": len(set(load.received)),
                       "duplicates": len(load.received) - len(set(load.received)), "lost": len(lost),
                       "lost_sample": lost[:20], "client_failures": len(load.failures)})
        print("summary: %d faults; %d confirmed, %d nacked, %d received (%d duplicates), %d confirmed lost %s"
              % (len(result["faults"]), len(confirmed), load.nacked, len(load.received), result["duplicates"],
                 len(lost), lost[:20]), flush=True)
    finally:
        if load is not None:
            load.stopPublishing.set()
            load.stopConsuming.set()
        for n in nodes:
            try:
                yield n.kill(signal.SIGCONT)
            except Exception:
                pass
        yield cluster.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long faults are made (s)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--etcd-members", type=int, default=3)
    p.add_argument("--drain", type=float, default=60.0, help="s to wait for the consumer at the end")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    outcome = {}

    def done(result):
        outcome["result"] = result
        reactor.stop()

    def failed(f):
        outcome["error"] = f
        f.printTraceback()
        reactor.stop()

    reactor.callWhenRunning(lambda: run(args).addCallbacks(done, failed))
    reactor.run()
    result = outcome.get("result")
    sys.exit(0 if result is not None and result.get("lost") == 0 else 1)


if __name__ == "__main__":
    main()
