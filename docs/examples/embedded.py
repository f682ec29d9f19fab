"""
Run otter_tx inside your own Twisted program, beside your own services.

    python docs/examples/embedded.py            # AMQP on 127.0.0.1:5673, Ctrl-C to stop

It starts the broker service, declares a queue through the Python API,
publishes nothing itself, and prints the queue depth every 5 seconds.
"""

import sys

from twisted.application.service import MultiService
from twisted.internet import reactor, task
from twisted.logger import globalLogBeginner, textFileLogObserver

from otter_tx.service import OtterService


def build(endpoint="tcp:5673:interface=127.0.0.1", reactor=reactor, dataDir="./embedded-data"):
    """
    Your application's service tree: the broker plus one service of your own.
    Returns ``(root, otter)``.
    """
    root = MultiService()
    otter = OtterService(amqp=[endpoint], reactor=reactor, dataDir=dataDir)
    otter.setServiceParent(root)
    # the broker's state is plain Python: declare through the vhost API
    otter.broker.vhosts["/"].declareQueue("jobs", None, durable=True)
    return root, otter


def main():
    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stdout)])
    root, otter = build()
    depth = task.LoopingCall(
        lambda: print("jobs ready:", otter.broker.vhosts["/"].queues["jobs"].messageCount)
    )
    depth.start(5)
    root.startService()
    reactor.addSystemEventTrigger("before", "shutdown", root.stopService)
    reactor.run()


if __name__ == "__main__":
    main()
