"""
Run otter_tx inside your own Twisted program, beside your own services.

    python docs/examples/embedded.py                          # data in a new temporary directory
    python docs/examples/embedded.py --data-dir /tmp/otter-demo   # keep the data across runs
    python docs/examples/embedded.py --amqp tcp:5673:interface=127.0.0.1

AMQP listens on 127.0.0.1:5673 by default; Ctrl-C stops it.  The program
declares a durable queue ``jobs`` through the Python API *before* starting
the broker (it is stored like a queue a client declares), publishes
nothing itself, and prints the queue depth every 5 seconds.  Publish
persistent messages to ``jobs`` (for example with pika), stop, start again
with the same ``--data-dir``: they are still there.

The broker keeps its durable state in ``--data-dir``.  Without it a new
temporary directory is made (its path is printed), so nothing is ever
written into the current directory.
"""

import argparse
import sys
import tempfile

from twisted.application.service import MultiService
from twisted.internet import task
from twisted.logger import globalLogBeginner, textFileLogObserver

from otter_tx.service import OtterService


def build(endpoint="tcp:5673:interface=127.0.0.1", reactor=None, dataDir=None):
    """
    Your application's service tree: the broker plus one service of your own.

    :param endpoint: the AMQP endpoint string.
    :param reactor: the reactor (default: the global one).
    :param dataDir: directory for the broker's durable state (str); None
        makes a new temporary directory.
    :return: ``(root, otter)``: the root MultiService and the OtterService.
    """
    if dataDir is None:
        dataDir = tempfile.mkdtemp(prefix="otter-embedded-")
    root = MultiService()
    otter = OtterService(amqp=[endpoint], reactor=reactor, dataDir=dataDir)
    otter.setServiceParent(root)
    # the broker's state is plain Python: declare through the vhost API.  Declared
    # before start, the durable queue is merged with what the store recovers and
    # written to it, so its messages survive a restart.
    otter.broker.vhosts["/"].declareQueue("jobs", None, durable=True)
    return root, otter


def main(argv=None):
    """Parse ``argv``, start the tree, run the reactor until Ctrl-C."""
    from twisted.internet import reactor

    parser = argparse.ArgumentParser(description="otter_tx embedded in a Twisted program")
    parser.add_argument("--data-dir", default=None,
                        help="directory for durable state (default: a new temporary directory)")
    parser.add_argument("--amqp", default="tcp:5673:interface=127.0.0.1", help="AMQP endpoint string")
    args = parser.parse_args(argv)

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stdout)])
    root, otter = build(args.amqp, reactor, args.data_dir)
    print("otter_tx data directory:", otter.dataDir)
    depth = task.LoopingCall(
        lambda: print("jobs ready:", otter.broker.vhosts["/"].queues["jobs"].readyCount)
    )

    def ready(_):
        depth.start(5)

    def failed(f):
        print("the broker did not start:", f.getErrorMessage())
        reactor.stop()

    otter.whenReady().addCallbacks(ready, failed)
    root.startService()
    reactor.addSystemEventTrigger("before", "shutdown", root.stopService)
    reactor.run()


if __name__ == "__main__":
    main()
