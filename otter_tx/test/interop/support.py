"""
Shared harness for the interop tests (``test_interop_*.py``).

Each test gets a fresh broker: by default the real otter_tx service started
in-process on ``tcp:0`` (loopback), or, when the environment variable
``OTTER_TEST_AMQP_URL`` is set (for example
``amqp://guest:guest@127.0.0.1:5682/`` for the RabbitMQ peer), that external
broker.  Blocking clients (pika, kombu) run in a worker thread through
:meth:`InteropTestCase.inThread`; aio-pika runs its own asyncio loop in a
worker thread through :meth:`InteropTestCase.inAsyncio`; non-Python clients
run as child processes through :meth:`InteropTestCase.runProcess`.

Against an external broker every test must clean up the entities it
creates; names get a per-test unique suffix from :meth:`InteropTestCase.name`.

Waiting is polling for a condition with a deadline (:func:`waitUntil`,
:func:`pollGet`, :func:`waitCount` and their asyncio forms; on the reactor
thread :func:`waitOnReactor` and :func:`waitUntilDeferred`), never a fixed
sleep: a loaded machine makes a test slower, not red.
"""

import asyncio
import inspect
import os
import sys
import time
import uuid
from urllib.parse import urlparse

from twisted.internet import reactor, task, threads, utils
from twisted.internet.defer import inlineCallbacks, returnValue
from twisted.trial.unittest import SkipTest, TestCase

EXTERNAL_URL = os.environ.get("OTTER_TEST_AMQP_URL")

#: True when the suite is pointed at an external broker (RabbitMQ).
EXTERNAL = bool(EXTERNAL_URL)

#: True when that external broker is a node of an otter_tx cluster, not RabbitMQ
#: (``OTTER_TEST_EXTERNAL_KIND=otter-cluster``: CI runs the suite against one node
#: of a 3-node cluster, docs/cluster.md)
EXTERNAL_OTTER = EXTERNAL and os.environ.get("OTTER_TEST_EXTERNAL_KIND") == "otter-cluster"


def rabbitOnly(reason):
    """
    Decorator for external-broker tests that need RabbitMQ itself (its
    rabbitmqctl, its product name): skipped when the external broker is an
    otter_tx cluster node.  ``reason`` says what they need.
    """

    def deco(f):
        if EXTERNAL_OTTER:
            f.skip = "needs RabbitMQ as the external broker: " + reason
        return f

    return deco


def onlyOtter(reason):
    """
    Decorator for tests of deliberate differences from RabbitMQ (for example
    prompt TTL reaping): they run against otter_tx only.  ``reason`` must say
    what differs; docs/compatibility.md lists each one.
    """

    def deco(f):
        if EXTERNAL:
            f.skip = "otter_tx-only behaviour: " + reason
        return f

    return deco


def inProcessOnly(reason):
    """
    Decorator for tests that need a broker setting a test cannot change on
    an external broker (for example a tiny memory high-watermark).  Not a
    behaviour difference: ``reason`` says what cannot be set.
    """

    def deco(f):
        if EXTERNAL:
            f.skip = "needs the in-process broker: " + reason
        return f

    return deco


class InteropTestCase(TestCase):
    """
    Base class: ``self.url`` (AMQP URL), ``self.host``, ``self.port`` and
    ``self.fixture`` (the in-process broker fixture, or ``None`` against an
    external broker) are set in ``setUp``.
    """

    timeout = 60

    #: keyword arguments for otter_tx.testing.startBroker (ignored when external)
    brokerOptions = {}

    def setUp(self):
        if EXTERNAL:
            self.fixture = None
            self.url = EXTERNAL_URL
            self._setAddress()
            return None
        from otter_tx.testing import startBroker

        d = startBroker(reactor, **self.brokerOptions)

        def started(fixture):
            self.fixture = fixture
            self.addCleanup(fixture.stop)
            self.url = "amqp://guest:guest@127.0.0.1:%d/" % (fixture.amqpPort,)
            self._setAddress()

        return d.addCallback(started)

    def _setAddress(self):
        u = urlparse(self.url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 5672

    def name(self, base):
        """
        Return ``base`` with a unique suffix, for queue/exchange names.
        """
        return "%s-%s" % (base, uuid.uuid4().hex[:10])

    def inThread(self, f, *a, **kw):
        """
        Run blocking client code ``f(*a, **kw)`` in a worker thread; return a
        Deferred with its result (or failure).
        """
        return threads.deferToThread(f, *a, **kw)

    def inAsyncio(self, coroFunction, *a, **kw):
        """
        Run ``coroFunction(*a, **kw)`` on a fresh asyncio loop in a worker
        thread (for aio-pika); return a Deferred with its result.
        """
        return threads.deferToThread(lambda: asyncio.run(coroFunction(*a, **kw)))

    def runProcess(self, executable, args, env=None, path=None):
        """
        Run a child process; return a Deferred firing with
        ``(stdout, stderr, exitCode)``.  ``OTTER_TEST_AMQP_URL`` is set in its
        environment to this test's broker URL.
        """
        e = dict(os.environ)
        e.update(env or {})
        e["OTTER_TEST_AMQP_URL"] = self.url
        return utils.getProcessOutputAndValue(
            executable, args, env=e, path=path, reactor=reactor
        )

    def pikaParams(self, **kw):
        """
        pika ``URLParameters`` for this broker with short timeouts.
        """
        import pika

        p = pika.URLParameters(self.url)
        p.socket_timeout = 10
        p.blocked_connection_timeout = 20
        p.connection_attempts = 1
        for k, v in kw.items():
            setattr(p, k, v)
        return p

    def pikaConnection(self, **kw):
        """
        A new pika ``BlockingConnection`` (call from a worker thread).
        """
        import pika

        return pika.BlockingConnection(self.pikaParams(**kw))


#: the external broker's management URL (``http://127.0.0.1:15682``), if any
EXTERNAL_MGMT_URL = os.environ.get("OTTER_TEST_MGMT_URL")


class ManagementMixin:
    """
    For an :class:`InteropTestCase` that also calls the management API: the
    in-process broker starts with management on a free port; against an
    external broker ``OTTER_TEST_MGMT_URL`` is required (else the test is
    skipped, naming it).  :meth:`mgmtBase` is the base URL either way.
    """

    brokerOptions = {"management": True}

    def setUp(self):
        if EXTERNAL and not EXTERNAL_MGMT_URL:
            raise SkipTest("set OTTER_TEST_MGMT_URL for the external broker's management API")
        return InteropTestCase.setUp(self)

    def mgmtBase(self):
        """The management API's base URL, without a trailing slash (str)."""
        if EXTERNAL:
            return EXTERNAL_MGMT_URL.rstrip("/")
        return "http://127.0.0.1:%d" % (self.fixture.managementPort,)

    def mgmtCall(self, method, path, body=None):
        """
        ``(status, decoded JSON or None)`` of one blocking request as guest
        (call it in a worker thread); ``body`` is sent as JSON.
        """
        import base64
        import json
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            self.mgmtBase() + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"content-type": "application/json",
                     "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


def requireModule(name):
    """
    Import and return module ``name`` or raise SkipTest naming what is missing.
    """
    try:
        return __import__(name)
    except ImportError:
        raise SkipTest("%s is not installed" % (name,))


def pamqpInt(value):
    """
    ``value`` (an int) as a field-table integer that this pamqp can send.
    pamqp before 4.0 (3.3.0 is the newest for Python 3.9, hence PyPy) encodes
    -128..-1 as the signed-byte tag ``b`` but packs it unsigned and raises
    ``struct.error``; there ``value - 200`` is returned instead, a negative
    number it sends as the 16-bit ``s``.  Either way the broker sees a
    negative integer, so the rule under test is the same.
    """
    import struct

    import pamqp.encode

    try:
        pamqp.encode.table_integer(value)
    except struct.error:
        return value - 200
    return value


PYTHON = sys.executable


# --- waiting: poll a condition until a deadline ---------------------------------


def waitUntil(predicate, timeout=5.0, interval=0.01, connection=None):
    """
    Call ``predicate()`` until it returns something true or ``timeout``
    seconds pass; return its last result.  Between calls the worker thread
    sleeps ``interval`` seconds or, given a pika ``BlockingConnection`` as
    ``connection``, processes that connection's I/O for as long (so that
    its consumer and return callbacks run).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result or time.monotonic() > deadline:
            return result
        if connection is None:
            time.sleep(interval)
        else:
            connection.process_data_events(time_limit=interval)


def pollGet(channel, queue, timeout=5.0, interval=0.01, autoAck=True):
    """
    pika ``basic.get`` from ``queue`` until a message arrives or ``timeout``
    seconds pass: ``(method, properties, body)`` or None.
    """

    def get():
        method, properties, body = channel.basic_get(queue, auto_ack=autoAck)
        return None if method is None else (method, properties, body)

    return waitUntil(get, timeout, interval)


def messageCount(channel, queue):
    """Ready-message count (int) of ``queue`` from a pika passive ``queue.declare``."""
    return channel.queue_declare(queue, passive=True).method.message_count


def waitCount(channel, queue, expected, timeout=5.0):
    """
    Poll the ready count of ``queue`` (pika) until it equals ``expected`` or
    ``timeout`` seconds pass (declare-ok counts lag publishes in RabbitMQ);
    return the last count.
    """
    counts = []

    def reached():
        counts.append(messageCount(channel, queue))
        return counts[-1] == expected

    waitUntil(reached, timeout, 0.02)
    return counts[-1]


async def waitUntilAsync(predicate, timeout=5.0, interval=0.01):
    """
    Call ``predicate()`` (a plain or a coroutine function: its result is
    awaited when awaitable) until its result is true or ``timeout`` seconds
    pass; return its last result.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(interval)


async def pollGetAsync(queue, timeout=5.0, interval=0.01, noAck=True):
    """
    aio-pika ``basic.get`` from ``queue`` until a message arrives or
    ``timeout`` seconds pass; return the message or None.
    """

    async def get():
        return await queue.get(no_ack=noAck, fail=False)

    return await waitUntilAsync(get, timeout, interval)


async def messageCountAsync(channel, name):
    """Ready-message count (int) of queue ``name`` from an aio-pika passive declare."""
    queue = await channel.declare_queue(name, passive=True)
    return queue.declaration_result.message_count


@inlineCallbacks
def waitUntilDeferred(produce, ready=bool, timeout=15.0, interval=0.2):
    """
    On the reactor thread: call ``produce()`` (returning a Deferred) until
    ``ready(result)`` or ``timeout`` seconds pass, ``interval`` seconds
    apart on the reactor; a Deferred firing with the last result.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = yield produce()
        if ready(result) or time.monotonic() > deadline:
            returnValue(result)
        yield task.deferLater(reactor, interval, lambda: None)


@inlineCallbacks
def waitOnReactor(predicate, timeout=5.0, interval=0.01, what="condition"):
    """
    On the reactor thread (an in-process broker's own objects, a cluster's
    nodes, the etcd client): call ``predicate()`` every ``interval`` seconds
    of the reactor until it returns something true; a Deferred firing with
    that result, or failing with AssertionError (naming ``what``) after
    ``timeout`` seconds.  Awaitable in an ``async def`` test.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            returnValue(result)
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        yield task.deferLater(reactor, interval, lambda: None)
