"""
The admin web app's queue list in a cluster, for docs/management.md ("In a cluster").

Three otter_tx nodes in this process on a shared MemoryMetadata (as
otter_tx/test/cluster/test_inprocess.py), four queues placed with the
balanced locator through node 1's HTTP API, then node 3's links drop; the
queue list of node 1 is saved as OUTPUT_DIR/queues-cluster.png.

    .venv-test/bin/python docs/screenshots_cluster.py [OUTPUT_DIR]
"""

import os
import sys
import time

from twisted.internet import reactor, task, threads
from twisted.internet.defer import inlineCallbacks

from otter_tx.cluster.link import LinkFactory
from otter_tx.cluster.metadata import MemoryMetadata
from otter_tx.cluster.node import ClusterNode
from otter_tx.test.e2e.test_webapp import apiCall as call, browser, login
from otter_tx.testing import startBroker

HERE = os.path.dirname(os.path.abspath(__file__))


def shoot(base, nodes, ports, outDir):
    """Queues on the three nodes, node 3 down, then the PNG (in a worker thread)."""
    for i in range(4):
        call(base, "PUT", "/api/queues/%2F/orders." + str(i),
             {"durable": True, "arguments": {"x-queue-leader-locator": "balanced"}})
    for i in range(3):
        call(base, "POST", "/api/exchanges/%2F/amq.default/publish", {
            "properties": {}, "routing_key": "orders.1", "payload": "x", "payload_encoding": "string"})
    time.sleep(2)  # the figures of every node
    down = nodes[2]
    down.running = False
    reactor.callFromThread(ports[2].stopListening)
    for link in list(down.links.values()):
        reactor.callFromThread(link.transport.abortConnection)
    time.sleep(1.5)
    with browser() as page:
        login(page, base + "/")
        page.goto(base + "/#/queues")
        page.wait_for_timeout(1500)
        page.set_viewport_size({"width": 1280, "height": 340})
        page.screenshot(path=os.path.join(outDir, "queues-cluster.png"))


@inlineCallbacks
def run(outDir):
    meta = MemoryMetadata(reactor)
    fixtures, nodes, ports = [], [], []
    try:
        for i in range(3):
            f = yield startBroker(reactor, management=True)
            fixtures.append(f)
            f.broker.nodeName = "n%d" % (i + 1,)
            node = ClusterNode(f.broker, f.broker.nodeName, meta, reactor)
            port = reactor.listenTCP(0, LinkFactory(node), interface="127.0.0.1")
            ports.append(port)
            yield node.start(port.getHost().port)
            nodes.append(node)
        deadline = time.monotonic() + 10
        while not all(len(n.links) == 2 for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not link")
            yield task.deferLater(reactor, 0.05, lambda: None)
        yield threads.deferToThread(shoot, "http://127.0.0.1:%d" % (fixtures[0].managementPort,), nodes, ports,
                                    outDir)
    finally:
        for n in nodes:
            yield n.stop()
        for f in fixtures:
            yield f.stop()


def main(outDir):
    os.makedirs(outDir, exist_ok=True)
    result = {}

    def go():
        d = run(outDir)
        d.addErrback(lambda f: result.setdefault("failure", f))
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(go)
    reactor.run()
    if "failure" in result:
        print(result["failure"].getTraceback(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "images")))
