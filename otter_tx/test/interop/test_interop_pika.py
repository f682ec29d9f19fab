"""
Interop tests for issue 2's Protocol section, driven by pika's
``BlockingConnection``.

Every test states one behaviour of RabbitMQ 3.10 (the reference peer) that
otter_tx reproduces.  Reply codes and texts are exact; they come from
``rabbitmq-semantics.md`` (sections cited in the class docstrings) or were
observed on the 3.10.8 peer while writing these tests.

A few frames pika's public API will not send are put on the wire with pika's
own encoder through ``channel._impl._send_method`` (``immediate=true``, a
reused consumer tag), and the frame-max test overrides pika's body-frame size
after negotiation; a few assertions read pika's negotiated parameters,
server properties and heartbeat counters from ``connection._impl``.  What
only py-amqp can send (an empty consumer tag, a cancel of an unknown tag,
AMQPLAIN, recover-async, every errata field type) lives in
``test_interop_kombu``.

Blocking code runs in a worker thread (``runPika``); all waiting polls with a
deadline, and every named entity is deleted by a cleanup, so the module can
run against the shared RabbitMQ peer::

    OTTER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5682/ \\
        .venv/bin/trial otter_tx.test.interop.test_interop_pika
"""

import datetime
import decimal
import re
import time

import pika
import pika.compat
import pika.exceptions
import pika.spec

from otter_tx.test.interop.support import InteropTestCase, messageCount, waitCount, waitUntil

NO_ROUTE = 312

CAPABILITIES = [
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
]


def lockedText(queue):
    """
    The 405 RESOURCE_LOCKED reply text for exclusive queue ``queue``
    (rabbitmq-semantics §6.3).
    """
    return (
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
        "'%s' in vhost '/'. It could be originally declared on another "
        "connection or the exclusive property value does not match that of "
        "the original declaration." % (queue,)
    )


def invalidArg(arg, queue, term):
    """
    The 406 reply text for an invalid queue argument (rabbitmq-semantics
    §6.6).
    """
    return "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/': %s" % (
        arg,
        queue,
        term,
    )


def roundTrip(channel):
    """
    Make one synchronous request on ``channel`` so that an asynchronous
    error (after publish, ack, ...) is raised here.
    """
    channel.exchange_declare("amq.direct", passive=True)


def drain(channel, queue):
    """
    Fetch every ready message of ``queue`` with auto-ack; return the bodies.
    """
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def declareOk(channel, queue):
    """
    Passive-declare ``queue``; return the ``Queue.DeclareOk`` method.
    """
    return channel.queue_declare(queue, passive=True).method


def publisher(connection):
    """
    A new channel in confirm mode: each ``basic_publish`` returns once the
    broker has routed and enqueued the message.
    """
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def publishMany(channel, queue, bodies, **properties):
    """
    Publish each of ``bodies`` to ``queue`` through the default exchange.
    """
    props = pika.BasicProperties(**properties) if properties else None
    for body in bodies:
        channel.basic_publish("", queue, body, props)


def queueExists(connection, queue):
    """
    True if a passive declare of ``queue`` on a fresh channel succeeds or
    gets 405 (another connection's exclusive queue); False on 404.
    """
    channel = connection.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == 405:
            return True
        if e.reply_code != 404:
            raise
        return False
    channel.close()
    return True


def exchangeExists(connection, exchange):
    """
    True if a passive declare of ``exchange`` succeeds on a fresh channel.
    """
    channel = connection.channel()
    try:
        channel.exchange_declare(exchange, passive=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code != 404:
            raise
        return False
    channel.close()
    return True


class PikaTestCase(InteropTestCase):
    """
    Helpers for pika tests: connections opened through ``runPika`` are
    closed afterwards, names from ``tempQueue``/``tempExchange`` are deleted
    by a cleanup, and the ``assert*Error`` helpers check exact reply codes
    and texts.
    """

    def runPika(self, body):
        """
        Run ``body(connect)`` in a worker thread; ``connect(**params)``
        opens a pika ``BlockingConnection`` that is closed when ``body``
        returns.  Return a Deferred with ``body``'s result.
        """

        def run():
            connections = []

            def connect(**params):
                connection = self.pikaConnection(**params)
                connections.append(connection)
                return connection

            try:
                return body(connect)
            finally:
                for connection in connections:
                    if connection.is_open:
                        try:
                            connection.close()
                        except Exception:
                            pass

        return self.inThread(run)

    def _deleteLater(self, kind, name):
        def cleanup():
            connection = self.pikaConnection()
            try:
                channel = connection.channel()
                if kind == "queue":
                    channel.queue_delete(name)
                else:
                    channel.exchange_delete(name)
            except pika.exceptions.ChannelClosedByBroker:
                pass
            finally:
                if connection.is_open:
                    connection.close()

        self.addCleanup(self.inThread, cleanup)

    def tempQueue(self, base="q"):
        """
        A unique queue name that is deleted after the test.
        """
        name = self.name(base)
        self._deleteLater("queue", name)
        return name

    def tempExchange(self, base="x"):
        """
        A unique exchange name that is deleted after the test.
        """
        name = self.name(base)
        self._deleteLater("exchange", name)
        return name

    def assertChannelError(self, code, text, f, *a, **kw):
        """
        Assert that ``f(*a, **kw)`` raises ``ChannelClosedByBroker`` with
        exactly ``code`` and ``text``.
        """
        e = self.assertRaises(pika.exceptions.ChannelClosedByBroker, f, *a, **kw)
        self.assertEqual((e.reply_code, e.reply_text), (code, text))
        return e

    def assertConnectionError(self, connection, code, text, f, *a, **kw):
        """
        Assert that ``f(*a, **kw)`` raises ``ConnectionClosedByBroker`` with
        exactly ``code`` and ``text`` (``text=None`` skips the text) and
        that ``connection`` is closed.
        """
        e = self.assertRaises(pika.exceptions.ConnectionClosedByBroker, f, *a, **kw)
        self.assertEqual(e.reply_code, code)
        if text is not None:
            self.assertEqual(e.reply_text, text)
        self.assertTrue(connection.is_closed)
        return e

    def exclusiveQueue(self, channel, **kw):
        """
        Declare a server-named exclusive queue on ``channel``; return its name.
        """
        return channel.queue_declare("", exclusive=True, **kw).method.queue


class ConnectionTests(PikaTestCase):
    """
    connection.start/tune/open/close (issue 2 Protocol; rabbitmq-semantics
    §6.1).
    """

    def test_plainLogin(self):
        """
        A PLAIN login opens a usable connection that closes cleanly.
        """

        def body(connect):
            connection = connect()
            self.assertTrue(connection.is_open)
            roundTrip(connection.channel())
            connection.close()
            self.assertTrue(connection.is_closed)

        return self.runPika(body)

    def test_serverProperties(self):
        """
        connection.start carries product and version strings and RabbitMQ's
        capability names, each true.
        """

        def body(connect):
            props = connect()._impl.server_properties
            self.assertTrue(props["product"])
            self.assertTrue(props["version"])
            caps = props["capabilities"]
            for name in CAPABILITIES:
                self.assertIs(caps.get(name), True, name)

        return self.runPika(body)

    def test_unknownVhost(self):
        """
        connection.open of a vhost that does not exist is closed with 530
        NOT_ALLOWED - vhost V not found.
        """
        vhost = self.name("no-such-vhost")

        def body(connect):
            e = self.assertRaises(
                pika.exceptions.ProbableAccessDeniedError, connect, virtual_host=vhost
            )
            self.assertEqual(
                e.args[0],
                "ConnectionClosedByBroker: (530) %r"
                % ("NOT_ALLOWED - vhost %s not found" % (vhost,),),
            )

        return self.runPika(body)

    def test_wrongPassword(self):
        """
        A wrong PLAIN password gets connection.close 403 ACCESS_REFUSED
        (authentication_failure_close) and no connection.
        """

        def body(connect):
            user = self.pikaParams().credentials.username
            e = self.assertRaises(
                pika.exceptions.ProbableAuthenticationError,
                connect,
                credentials=pika.PlainCredentials(user, "not-the-password"),
            )
            self.assertEqual(
                e.args[0],
                "ConnectionClosedByBroker: (403) %r"
                % (
                    "ACCESS_REFUSED - Login was refused using authentication "
                    "mechanism PLAIN. For details see the broker logfile.",
                ),
            )

        return self.runPika(body)

    def test_defaultTune(self):
        """
        With pika's defaults the negotiated limits are the broker's
        connection.tune: frame_max 131072, channel_max 2047, heartbeat 60.
        """

        def body(connect):
            params = connect()._impl.params
            self.assertEqual(
                (params.frame_max, params.channel_max, params.heartbeat),
                (131072, 2047, 60),
            )

        return self.runPika(body)

    def test_negotiateSmallerLimits(self):
        """
        Smaller frame_max, channel_max and heartbeat proposed in tune-ok are
        accepted and the connection works with them.
        """

        def body(connect):
            connection = connect(frame_max=4096, channel_max=16, heartbeat=7)
            params = connection._impl.params
            self.assertEqual(
                (params.frame_max, params.channel_max, params.heartbeat),
                (4096, 16, 7),
            )
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            channel.basic_publish("", queue, b"z" * 10000)
            self.assertEqual(waitCount(channel, queue, 1), 1)
            self.assertEqual(channel.basic_get(queue, auto_ack=True)[2], b"z" * 10000)

        return self.runPika(body)

    def test_heartbeatDisabled(self):
        """
        A client proposing heartbeat 0 gets a connection without heartbeats.
        """

        def body(connect):
            connection = connect(heartbeat=0)
            self.assertEqual(connection._impl.params.heartbeat, 0)
            roundTrip(connection.channel())

        return self.runPika(body)

    def test_serverSendsHeartbeats(self):
        """
        With heartbeat 1 s the broker sends heartbeat frames to an idle
        client and the connection stays open.
        """

        def body(connect):
            connection = connect(heartbeat=1)
            checker = connection._impl._heartbeat_checker
            waitUntil(lambda: checker._heartbeat_frames_received >= 2, timeout=10, connection=connection)
            self.assertTrue(connection.is_open)
            self.assertGreaterEqual(checker._heartbeat_frames_received, 2)
            roundTrip(connection.channel())

        return self.runPika(body)

    def test_silentClientDropped(self):
        """
        A client that sends nothing for more than two heartbeat intervals
        (1 s) is disconnected.
        """

        def body(connect):
            connection = connect(heartbeat=1)
            channel = connection.channel()
            # Without I/O processing pika sends no heartbeats.
            time.sleep(4)
            self.assertRaises(pika.exceptions.AMQPConnectionError, roundTrip, channel)
            self.assertTrue(connection.is_closed)

        return self.runPika(body)

    def test_channelMaxEnforced(self):
        """
        Opening a channel beyond the negotiated channel_max closes the
        connection with 530 NOT_ALLOWED.
        """

        def body(connect):
            connection = connect(channel_max=2)
            connection.channel()
            connection.channel()
            self.assertConnectionError(
                connection,
                530,
                "NOT_ALLOWED - number of channels opened (2) has reached the "
                "negotiated channel_max (2)",
                connection.channel,
                channel_number=3,
            )

        return self.runPika(body)

    def test_frameMaxEnforced(self):
        """
        A body frame larger than the negotiated frame_max closes the
        connection with 501 FRAME_ERROR.
        """

        def body(connect):
            connection = connect(frame_max=4096)
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            # Make pika ignore the negotiated limit for body frames.
            connection._impl._body_max_length = 20000
            channel.basic_publish("", queue, b"y" * 10000)
            e = self.assertConnectionError(
                connection, 501, None, roundTrip, channel
            )
            self.assertTrue(e.reply_text.startswith("FRAME_ERROR - "), e.reply_text)

        return self.runPika(body)

    def test_closeDeletesExclusiveQueues(self):
        """
        Closing a connection deletes the exclusive queues it declared.
        """

        def body(connect):
            first = connect()
            queue = self.exclusiveQueue(first.channel())
            other = connect()
            self.assertTrue(queueExists(other, queue))
            first.close()
            self.assertTrue(waitUntil(lambda: not queueExists(other, queue)))

        return self.runPika(body)


class ChannelTests(PikaTestCase):
    """
    channel.open/close/flow (issue 2 Protocol; rabbitmq-semantics §6.11).
    """

    def test_openClose(self):
        """
        A channel opens and closes while the connection and other channels
        stay usable.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            self.assertTrue(channel.is_open)
            channel.close()
            self.assertTrue(channel.is_closed)
            self.assertTrue(connection.is_open)
            roundTrip(connection.channel())

        return self.runPika(body)

    def test_manyChannels(self):
        """
        One connection opens 100 channels at once and each of them works.
        """

        def body(connect):
            connection = connect()
            channels = [connection.channel() for _ in range(100)]
            numbers = set(c.channel_number for c in channels)
            self.assertEqual(len(numbers), 100)
            for channel in channels:
                roundTrip(channel)
            for channel in channels:
                channel.close()
            self.assertTrue(connection.is_open)

        return self.runPika(body)

    def test_channelErrorIsolated(self):
        """
        A channel error (404) closes only that channel; another channel of
        the connection keeps working.
        """

        def body(connect):
            connection = connect()
            good = connection.channel()
            bad = connection.channel()
            self.assertChannelError(
                404,
                "NOT_FOUND - no queue 'missing-q' in vhost '/'",
                bad.queue_declare,
                "missing-q",
                passive=True,
            )
            self.assertTrue(bad.is_closed)
            self.assertTrue(connection.is_open)
            roundTrip(good)

        return self.runPika(body)

    def test_flowActive(self):
        """
        channel.flow active=true is answered with flow-ok active=true.
        """

        def body(connect):
            self.assertIs(connect().channel().flow(True), True)

        return self.runPika(body)

    def test_flowInactiveNotImplemented(self):
        """
        channel.flow active=false closes the connection with 540
        NOT_IMPLEMENTED - active=false.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            self.assertConnectionError(
                connection,
                540,
                "NOT_IMPLEMENTED - active=false",
                channel.flow,
                False,
            )

        return self.runPika(body)


class ExchangeTests(PikaTestCase):
    """
    exchange.declare/delete/bind/unbind (rabbitmq-semantics §6.4, §6.5).
    """

    def test_declareEachType(self):
        """
        direct, fanout, topic and headers exchanges can be declared and then
        passively declared.
        """
        names = dict((t, self.tempExchange(t)) for t in ["direct", "fanout", "topic", "headers"])

        def body(connect):
            channel = connect().channel()
            for kind, name in names.items():
                channel.exchange_declare(name, kind)
                channel.exchange_declare(name, kind)
                channel.exchange_declare(name, passive=True)

        return self.runPika(body)

    def test_passiveMissing(self):
        """
        A passive declare of a missing exchange gets 404 NOT_FOUND - no
        exchange.
        """
        name = self.name("missing")

        def body(connect):
            self.assertChannelError(
                404,
                "NOT_FOUND - no exchange '%s' in vhost '/'" % (name,),
                connect().channel().exchange_declare,
                name,
                passive=True,
            )

        return self.runPika(body)

    def test_passiveIgnoresTypeAndFlags(self):
        """
        A passive declare succeeds whatever type and flags it carries.
        """
        name = self.tempExchange()

        def body(connect):
            channel = connect().channel()
            channel.exchange_declare(name, "direct")
            channel.exchange_declare(name, "fanout", passive=True, durable=True)

        return self.runPika(body)

    def test_inequivalentType(self):
        """
        Redeclaring an exchange with another type gets 406 inequivalent arg
        'type'.
        """
        name = self.tempExchange()

        def body(connect):
            channel = connect().channel()
            channel.exchange_declare(name, "direct")
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - inequivalent arg 'type' for exchange '%s' "
                "in vhost '/': received 'fanout' but current is 'direct'" % (name,),
                channel.exchange_declare,
                name,
                "fanout",
            )

        return self.runPika(body)

    def test_inequivalentFlags(self):
        """
        Redeclaring an exchange with other durable, auto_delete, internal or
        arguments gets 406 naming that field.
        """
        name = self.tempExchange()
        prefix = (
            "PRECONDITION_FAILED - inequivalent arg '%s' for exchange '" + name + "' in vhost '/': "
        )
        cases = [
            (dict(durable=True), prefix % "durable" + "received 'true' but current is 'false'"),
            (
                dict(auto_delete=True),
                prefix % "auto_delete" + "received 'true' but current is 'false'",
            ),
            (dict(internal=True), prefix % "internal" + "received 'true' but current is 'false'"),
            (
                dict(arguments={"alternate-exchange": "ae"}),
                prefix % "alternate-exchange"
                + "received the value 'ae' of type 'longstr' but current is none",
            ),
        ]

        def body(connect):
            connection = connect()
            connection.channel().exchange_declare(name, "direct")
            for kw, text in cases:
                self.assertChannelError(
                    406, text, connection.channel().exchange_declare, name, "direct", **kw
                )

        return self.runPika(body)

    def test_durable(self):
        """
        A durable exchange redeclares as durable and refuses a non-durable
        redeclare with 406.
        """
        name = self.tempExchange()

        def body(connect):
            channel = connect().channel()
            channel.exchange_declare(name, "topic", durable=True)
            channel.exchange_declare(name, "topic", durable=True)
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '%s' "
                "in vhost '/': received 'false' but current is 'true'" % (name,),
                channel.exchange_declare,
                name,
                "topic",
            )

        return self.runPika(body)

    def test_reservedPrefix(self):
        """
        Declaring an exchange named amq.* gets 403; a passive declare of a
        missing amq.* name gets 404.
        """
        name = "amq." + self.name("x")

        def body(connect):
            connection = connect()
            self.assertChannelError(
                403,
                "ACCESS_REFUSED - exchange name '%s' contains reserved prefix 'amq.*'" % (name,),
                connection.channel().exchange_declare,
                name,
                "direct",
            )
            self.assertChannelError(
                404,
                "NOT_FOUND - no exchange '%s' in vhost '/'" % (name,),
                connection.channel().exchange_declare,
                name,
                passive=True,
            )

        return self.runPika(body)

    def test_unknownType(self):
        """
        Declaring an exchange of an unknown type closes the connection with
        503 COMMAND_INVALID (RabbitMQ 3.10).
        """
        name = self.tempExchange()
        # A fresh type name.  RabbitMQ says "invalid exchange type" instead
        # for names that happen to be existing Erlang atoms (such as 'foo').
        kind = self.name("no-such-type")

        def body(connect):
            connection = connect()
            self.assertConnectionError(
                connection,
                503,
                "COMMAND_INVALID - unknown exchange type '%s'" % (kind,),
                connection.channel().exchange_declare,
                name,
                kind,
            )

        return self.runPika(body)

    def test_autoDeleteAfterLastQueueBinding(self):
        """
        An auto-delete exchange survives until its last queue binding is
        removed, then disappears.
        """
        name = self.tempExchange()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(name, "fanout", auto_delete=True)
            q1 = self.exclusiveQueue(channel)
            q2 = self.exclusiveQueue(channel)
            channel.queue_bind(q1, name)
            channel.queue_bind(q2, name)
            channel.queue_unbind(q1, name)
            self.assertTrue(exchangeExists(connection, name))
            channel.queue_delete(q2)
            self.assertTrue(waitUntil(lambda: not exchangeExists(connection, name)))

        return self.runPika(body)

    def test_autoDeleteNeverBoundStays(self):
        """
        An auto-delete exchange that never had a binding is not deleted.
        """
        name = self.tempExchange()

        def body(connect):
            connection = connect()
            connection.channel().exchange_declare(name, "direct", auto_delete=True)
            # auto-delete acts when a binding goes, not on a timer: declare-ok is the barrier
            self.assertTrue(exchangeExists(connection, name))

        return self.runPika(body)

    def test_autoDeleteAfterLastExchangeBinding(self):
        """
        An auto-delete exchange used as the source of an exchange-to-exchange
        binding is deleted when that binding is removed.
        """
        name = self.tempExchange()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(name, "fanout", auto_delete=True)
            channel.exchange_bind("amq.fanout", name)
            channel.exchange_unbind("amq.fanout", name)
            self.assertTrue(waitUntil(lambda: not exchangeExists(connection, name)))

        return self.runPika(body)

    def test_internalRefusesPublish(self):
        """
        Publishing to an internal exchange closes the channel with 403.
        """
        name = self.tempExchange()

        def body(connect):
            channel = connect().channel()
            channel.exchange_declare(name, "direct", internal=True)
            channel.basic_publish(name, "k", b"x")
            self.assertChannelError(
                403,
                "ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'" % (name,),
                roundTrip,
                channel,
            )

        return self.runPika(body)

    def test_internalReachableThroughExchangeBinding(self):
        """
        An internal exchange routes messages that reach it through an
        exchange-to-exchange binding.
        """
        front = self.tempExchange("front")
        inner = self.tempExchange("inner")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(front, "direct")
            channel.exchange_declare(inner, "fanout", internal=True)
            channel.exchange_bind(inner, front, "k")
            queue = self.exclusiveQueue(channel)
            channel.queue_bind(queue, inner)
            publisher(connection).basic_publish(front, "k", b"via-e2e")
            self.assertEqual(drain(channel, queue), [b"via-e2e"])

        return self.runPika(body)

    def test_deleteIfUnused(self):
        """
        exchange.delete if-unused of a bound exchange gets 406 in use; once
        unbound it is deleted.
        """
        name = self.tempExchange()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(name, "direct")
            queue = self.exclusiveQueue(channel)
            channel.queue_bind(queue, name, "k")
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - exchange '%s' in vhost '/' in use" % (name,),
                channel.exchange_delete,
                name,
                if_unused=True,
            )
            channel = connection.channel()
            channel.queue_unbind(queue, name, "k")
            channel.exchange_delete(name, if_unused=True)
            self.assertFalse(exchangeExists(connection, name))

        return self.runPika(body)

    def test_deleteMissing(self):
        """
        Deleting a missing exchange succeeds.
        """

        def body(connect):
            channel = connect().channel()
            channel.exchange_delete(self.name("missing"))
            self.assertTrue(channel.is_open)

        return self.runPika(body)

    def test_defaultExchangeProtected(self):
        """
        Declaring, deleting or binding to the default exchange gets 403
        operation not permitted on the default exchange.
        """
        text = "ACCESS_REFUSED - operation not permitted on the default exchange"

        def body(connect):
            connection = connect()
            self.assertChannelError(403, text, connection.channel().exchange_delete, "")
            self.assertChannelError(
                403, text, connection.channel().exchange_declare, "", "direct", durable=True
            )
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            self.assertChannelError(403, text, channel.queue_bind, queue, "", "k")

        return self.runPika(body)

    def test_deleteSystemExchange(self):
        """
        Deleting a predeclared amq.* exchange gets 403.
        """

        def body(connect):
            self.assertChannelError(
                403,
                "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' "
                "not allowed",
                connect().channel().exchange_delete,
                "amq.direct",
            )

        return self.runPika(body)

    def test_predeclared(self):
        """
        amq.direct, amq.fanout, amq.topic, amq.headers and amq.match exist,
        are durable and have the expected types.
        """
        expected = [
            ("amq.direct", "direct", "fanout"),
            ("amq.fanout", "fanout", "direct"),
            ("amq.topic", "topic", "direct"),
            ("amq.headers", "headers", "direct"),
            ("amq.match", "headers", "direct"),
        ]

        def body(connect):
            connection = connect()
            for name, kind, other in expected:
                channel = connection.channel()
                channel.exchange_declare(name, passive=True)
                channel.exchange_declare(name, kind, durable=True)
                self.assertChannelError(
                    406,
                    "PRECONDITION_FAILED - inequivalent arg 'type' for exchange '%s' in "
                    "vhost '/': received '%s' but current is '%s'" % (name, other, kind),
                    channel.exchange_declare,
                    name,
                    other,
                    durable=True,
                )

        return self.runPika(body)

    def test_defaultExchangeRoutesByQueueName(self):
        """
        The default exchange delivers to the queue named by the routing key.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            pub = publisher(connection)
            pub.basic_publish("", queue, b"direct-to-queue")
            pub.basic_publish("", queue + "-nope", b"lost")
            self.assertEqual(drain(channel, queue), [b"direct-to-queue"])

        return self.runPika(body)

    def test_directAndFanout(self):
        """
        A direct exchange routes by exact key (once per queue even with two
        matching bindings); a fanout ignores the key.
        """
        direct = self.tempExchange("d")
        fanout = self.tempExchange("f")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(direct, "direct")
            channel.exchange_declare(fanout, "fanout")
            qa = self.exclusiveQueue(channel)
            qb = self.exclusiveQueue(channel)
            channel.queue_bind(qa, direct, "a")
            channel.queue_bind(qa, direct, "both")
            channel.queue_bind(qb, direct, "both")
            channel.queue_bind(qb, fanout, "ignored")
            pub = publisher(connection)
            for key in ["a", "b", "both", "A"]:
                pub.basic_publish(direct, key, key.encode())
            pub.basic_publish(fanout, "whatever", b"fan")
            self.assertEqual(drain(channel, qa), [b"a", b"both"])
            self.assertEqual(drain(channel, qb), [b"both", b"fan"])

        return self.runPika(body)

    def test_exchangeToExchange(self):
        """
        exchange.bind makes the destination receive the source's matching
        messages, once per queue; exchange.unbind stops it.
        """
        source = self.tempExchange("src")
        destination = self.tempExchange("dst")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(source, "topic")
            channel.exchange_declare(destination, "fanout")
            channel.exchange_bind(destination, source, "a.*")
            queue = self.exclusiveQueue(channel)
            channel.queue_bind(queue, destination)
            channel.queue_bind(queue, source, "a.b")
            pub = publisher(connection)
            pub.basic_publish(source, "a.b", b"1")
            pub.basic_publish(source, "a.c", b"2")
            pub.basic_publish(source, "b.c", b"3")
            self.assertEqual(drain(channel, queue), [b"1", b"2"])
            channel.exchange_unbind(destination, source, "a.*")
            pub.basic_publish(source, "a.c", b"4")
            pub.basic_publish(source, "a.b", b"5")
            self.assertEqual(drain(channel, queue), [b"5"])
            channel.exchange_unbind(destination, source, "no-such-binding")

        return self.runPika(body)

    def test_exchangeBindMissing(self):
        """
        exchange.bind with a missing source or destination gets 404.
        """
        name = self.name("missing")

        def body(connect):
            connection = connect()
            text = "NOT_FOUND - no exchange '%s' in vhost '/'" % (name,)
            self.assertChannelError(
                404, text, connection.channel().exchange_bind, "amq.fanout", name, "k"
            )
            self.assertChannelError(
                404, text, connection.channel().exchange_bind, name, "amq.fanout", "k"
            )

        return self.runPika(body)

    def test_alternateExchange(self):
        """
        Messages the exchange cannot route go to its alternate-exchange,
        routed ones do not, and mandatory gets no return when the AE routes.
        """
        main = self.tempExchange("main")
        alternate = self.tempExchange("ae")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(alternate, "fanout")
            channel.exchange_declare(main, "direct", arguments={"alternate-exchange": alternate})
            routed = self.exclusiveQueue(channel)
            unrouted = self.exclusiveQueue(channel)
            channel.queue_bind(routed, main, "k")
            channel.queue_bind(unrouted, alternate)
            pub = publisher(connection)
            pub.basic_publish(main, "k", b"routed")
            pub.basic_publish(main, "other", b"to-ae")
            # Would raise UnroutableError on a basic.return.
            pub.basic_publish(main, "other2", b"mandatory", mandatory=True)
            self.assertEqual(drain(channel, routed), [b"routed"])
            self.assertEqual(drain(channel, unrouted), [b"to-ae", b"mandatory"])

        return self.runPika(body)

    def test_alternateExchangeMissing(self):
        """
        An alternate-exchange that does not exist routes nothing, so a
        mandatory message is returned.
        """
        main = self.tempExchange("main")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(
                main, "direct", arguments={"alternate-exchange": self.name("absent")}
            )
            pub = publisher(connection)
            self.assertRaises(
                pika.exceptions.UnroutableError,
                pub.basic_publish,
                main,
                "k",
                b"x",
                mandatory=True,
            )

        return self.runPika(body)


class TopicRoutingTests(PikaTestCase):
    """
    Topic exchange pattern matching, as observed on RabbitMQ 3.10: words are
    split on '.', the empty routing key has no words, '.' has two empty
    words.
    """

    KEYS = ["", "a", "b", "a.b", "a.x.b", "a.x.y.b", "a.b.c", "x.a", "a..b", ".", "a.", ".a"]

    def route(self, patterns):
        """
        Bind one queue per pattern to a fresh topic exchange, publish every
        key of ``KEYS`` and return {pattern: [keys received]}.
        """
        exchange = self.tempExchange("topic")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(exchange, "topic")
            queues = {}
            for pattern in patterns:
                queues[pattern] = self.exclusiveQueue(channel)
                channel.queue_bind(queues[pattern], exchange, pattern)
            pub = publisher(connection)
            for key in self.KEYS:
                pub.basic_publish(exchange, key, key.encode())
            return dict(
                (p, [b.decode() for b in drain(channel, q)]) for p, q in queues.items()
            )

        return self.runPika(body)

    def check(self, expected):
        """
        Assert that routing gives ``expected`` ({pattern: [keys]}).
        """
        return self.route(list(expected)).addCallback(self.assertEqual, expected)

    def test_hashAlone(self):
        """
        '#' (and '#.#') matches every key, including the empty key.
        """
        return self.check({"#": self.KEYS, "#.#": self.KEYS})

    def test_star(self):
        """
        '*' matches exactly one word, which may be empty, and never the empty
        key.
        """
        return self.check(
            {
                "*": ["a", "b"],
                "a.*": ["a.b", "a."],
                "*.*": ["a.b", "x.a", ".", "a.", ".a"],
            }
        )

    def test_hashPrefixSuffix(self):
        """
        'a.#' and '#.a' match zero or more words after or before 'a'.
        """
        return self.check(
            {
                "a.#": ["a", "a.b", "a.x.b", "a.x.y.b", "a.b.c", "a..b", "a."],
                "#.a": ["a", "x.a", ".a"],
            }
        )

    def test_hashInMiddle(self):
        """
        'a.#.b' (and 'a.#.#.b') match 'a' and 'b' with any words between.
        """
        keys = ["a.b", "a.x.b", "a.x.y.b", "a..b"]
        return self.check(
            {
                "a.#.b": keys,
                "a.#.#.b": keys,
                "#.b.#": ["b", "a.b", "a.x.b", "a.x.y.b", "a.b.c", "a..b"],
            }
        )

    def test_starWithHash(self):
        """
        '*.#' and '#.*' match every key with at least one word.
        """
        return self.check({"*.#": self.KEYS[1:], "#.*": self.KEYS[1:]})

    def test_emptyWordsAndEmptyKey(self):
        """
        Empty words are words: 'a..b' matches only itself, 'a.*.b' matches
        'a..b', and the empty pattern matches only the empty key.
        """
        return self.check({"a..b": ["a..b"], "a.*.b": ["a.x.b", "a..b"], "": [""]})


class HeadersRoutingTests(PikaTestCase):
    """
    Headers exchange matching: x-match all (default), any, all-with-x,
    any-with-x (rabbitmq-semantics, issue 2 Protocol).
    """

    MESSAGES = [
        ("ab", {"a": 1, "b": "two"}),
        ("a", {"a": 1}),
        ("b", {"b": "two"}),
        ("abx", {"a": 1, "b": "two", "x-k": "v"}),
        ("x", {"x-k": "v"}),
        ("none", None),
        ("a-str", {"a": "1"}),
        ("a2", {"a": 2}),
        ("a-void", {"a": None}),
    ]

    def route(self, bindings):
        """
        Bind one queue per {label: arguments} to a fresh headers exchange,
        publish ``MESSAGES`` and return {label: [message labels]}.
        """
        exchange = self.tempExchange("headers")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(exchange, "headers")
            queues = {}
            for label, arguments in bindings.items():
                queues[label] = self.exclusiveQueue(channel)
                channel.queue_bind(queues[label], exchange, "ignored", arguments=arguments)
            pub = publisher(connection)
            for label, headers in self.MESSAGES:
                pub.basic_publish(
                    exchange, "rk", label.encode(), pika.BasicProperties(headers=headers)
                )
            return dict(
                (label, [b.decode() for b in drain(channel, q)]) for label, q in queues.items()
            )

        return self.runPika(body)

    def check(self, bindings, expected):
        """
        Assert that routing through ``bindings`` gives ``expected``.
        """
        return self.route(bindings).addCallback(self.assertEqual, expected)

    def test_all(self):
        """
        x-match all (also the default) needs every non-x- binding header with
        an equal value of the same type class.
        """
        return self.check(
            {"all": {"x-match": "all", "a": 1, "b": "two"}, "default": {"a": 1, "b": "two"}},
            {"all": ["ab", "abx"], "default": ["ab", "abx"]},
        )

    def test_any(self):
        """
        x-match any needs one non-x- binding header with an equal value.
        """
        return self.check(
            {"any": {"x-match": "any", "a": 1, "b": "two"}, "str": {"x-match": "any", "a": "1"}},
            {"any": ["ab", "a", "b", "abx"], "str": ["a-str"]},
        )

    def test_xHeadersIgnored(self):
        """
        all/any ignore x- binding arguments: with only x- arguments, all
        matches everything and any matches nothing; an empty binding matches
        everything.
        """
        everything = [label for label, _ in self.MESSAGES]
        return self.check(
            {
                "all": {"x-match": "all", "x-k": "v"},
                "any": {"x-match": "any", "x-k": "v"},
                "empty": {},
            },
            {"all": everything, "any": [], "empty": everything},
        )

    def test_withX(self):
        """
        all-with-x and any-with-x also compare x- headers.
        """
        return self.check(
            {
                "allx": {"x-match": "all-with-x", "a": 1, "x-k": "v"},
                "anyx": {"x-match": "any-with-x", "x-k": "v"},
            },
            {"allx": ["abx"], "anyx": ["abx", "x"]},
        )

    def test_voidMatchesPresence(self):
        """
        A binding argument with a void value matches any message that has the
        header, whatever its value.
        """
        return self.check(
            {"void": {"a": None}},
            {"void": ["ab", "a", "abx", "a-str", "a2", "a-void"]},
        )

    def test_invalidXMatch(self):
        """
        Binding with an unknown x-match value gets 406.
        """
        exchange = self.tempExchange("headers")

        def body(connect):
            channel = connect().channel()
            channel.exchange_declare(exchange, "headers")
            queue = self.exclusiveQueue(channel)
            self.assertChannelError(
                406,
                'PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; '
                "expected all, any, all-with-x, or any-with-x",
                channel.queue_bind,
                queue,
                exchange,
                "",
                arguments={"x-match": "foo"},
            )

        return self.runPika(body)


class QueueTests(PikaTestCase):
    """
    queue.declare/bind/unbind/purge/delete (rabbitmq-semantics §6.2-§6.5).
    """

    def test_serverNamed(self):
        """
        An empty queue name gets a unique server name amq.gen- plus 22
        base64url characters and zero counts.
        """

        def body(connect):
            channel = connect().channel()
            first = channel.queue_declare("", exclusive=True).method
            second = channel.queue_declare("", exclusive=True).method
            for ok in [first, second]:
                self.assertTrue(re.match(r"^amq\.gen-[A-Za-z0-9_-]{22}$", ok.queue), ok.queue)
                self.assertEqual((ok.message_count, ok.consumer_count), (0, 0))
            self.assertNotEqual(first.queue, second.queue)

        return self.runPika(body)

    def test_passiveMissing(self):
        """
        A passive declare of a missing queue gets 404 NOT_FOUND - no queue.
        """
        name = self.name("missing")

        def body(connect):
            self.assertChannelError(
                404,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (name,),
                connect().channel().queue_declare,
                name,
                passive=True,
            )

        return self.runPika(body)

    def test_passiveCounts(self):
        """
        A passive declare reports ready messages and consumers and ignores
        the flags and arguments it carries.
        """
        name = self.tempQueue()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.queue_declare(name)
            publishMany(publisher(connection), name, [b"1", b"2", b"3"])
            channel.basic_get(name)
            ok = channel.queue_declare(
                name, passive=True, durable=True, arguments={"x-max-priority": 5}
            ).method
            self.assertEqual((ok.queue, ok.message_count, ok.consumer_count), (name, 2, 0))
            other = connection.channel()
            other.basic_consume(name, lambda *a: None)
            ok = declareOk(channel, name)
            self.assertEqual(ok.consumer_count, 1)

        return self.runPika(body)

    def test_reservedPrefix(self):
        """
        Declaring a queue named amq.* gets 403; a passive declare of it gets
        404.
        """
        name = "amq." + self.name("q")

        def body(connect):
            connection = connect()
            self.assertChannelError(
                403,
                "ACCESS_REFUSED - queue name '%s' contains reserved prefix 'amq.*'" % (name,),
                connection.channel().queue_declare,
                name,
            )
            self.assertChannelError(
                404,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (name,),
                connection.channel().queue_declare,
                name,
                passive=True,
            )

        return self.runPika(body)

    def test_exclusiveLockedForOtherConnections(self):
        """
        Every operation on another connection's exclusive queue gets 405
        RESOURCE_LOCKED with RabbitMQ's full text.
        """

        queue = self.name("excl")

        def body(connect):
            owner = connect()
            owner.channel().queue_declare(queue, exclusive=True)
            other = connect()
            text = lockedText(queue)
            operations = [
                lambda ch: ch.queue_declare(queue, exclusive=True),
                lambda ch: ch.queue_declare(queue, passive=True),
                lambda ch: ch.basic_get(queue),
                lambda ch: ch.basic_consume(queue, lambda *a: None),
                lambda ch: ch.queue_purge(queue),
                lambda ch: ch.queue_delete(queue),
                lambda ch: ch.queue_bind(queue, "amq.direct", "k"),
            ]
            for operation in operations:
                self.assertChannelError(405, text, operation, other.channel())
            self.assertTrue(queueExists(owner, queue))

        return self.runPika(body)

    def test_exclusiveRedeclaredNonExclusive(self):
        """
        Redeclaring one's own exclusive queue with exclusive=false gets 405.
        """

        queue = self.name("excl")

        def body(connect):
            connection = connect()
            connection.channel().queue_declare(queue, exclusive=True)
            self.assertChannelError(
                405, lockedText(queue), connection.channel().queue_declare, queue
            )

        return self.runPika(body)

    def test_exclusiveDurableIsTransient(self):
        """
        durable=true with exclusive=true makes a non-durable queue, so a
        non-durable redeclare is equivalent.
        """

        def body(connect):
            channel = connect().channel()
            ok = channel.queue_declare(self.name("ed"), durable=True, exclusive=True)
            queue = ok.method.queue
            channel.queue_declare(queue, durable=False, exclusive=True)

        return self.runPika(body)

    def test_autoDeleteAfterLastConsumer(self):
        """
        An auto-delete queue stays while a consumer remains and is deleted
        when the last consumer cancels.
        """
        name = self.tempQueue()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.queue_declare(name, auto_delete=True)
            first = channel.basic_consume(name, lambda *a: None)
            second = channel.basic_consume(name, lambda *a: None)
            channel.basic_cancel(first)
            self.assertTrue(queueExists(connection, name))
            channel.basic_cancel(second)
            self.assertTrue(waitUntil(lambda: not queueExists(connection, name)))

        return self.runPika(body)

    def test_autoDeleteOnConsumerChannelClose(self):
        """
        Closing the channel of an auto-delete queue's only consumer deletes
        the queue.
        """
        name = self.tempQueue()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.queue_declare(name, auto_delete=True)
            channel.basic_consume(name, lambda *a: None)
            channel.close()
            self.assertTrue(waitUntil(lambda: not queueExists(connection, name)))

        return self.runPika(body)

    def test_autoDeleteNeverConsumedStays(self):
        """
        An auto-delete queue that never had a consumer is not deleted.
        """
        name = self.tempQueue()

        def body(connect):
            connection = connect()
            connection.channel().queue_declare(name, auto_delete=True)
            # auto-delete acts when a consumer goes, not on a timer: declare-ok is the barrier
            self.assertTrue(queueExists(connection, name))

        return self.runPika(body)

    def test_durable(self):
        """
        A durable queue redeclares as durable; non-durable or auto-delete
        redeclares get 406 with RabbitMQ's texts.
        """
        name = self.tempQueue()
        prefix = (
            "PRECONDITION_FAILED - inequivalent arg '%s' for queue '" + name + "' in vhost '/': "
        )

        def body(connect):
            connection = connect()
            connection.channel().queue_declare(name, durable=True)
            connection.channel().queue_declare(name, durable=True)
            self.assertChannelError(
                406,
                prefix % "durable" + "received 'false' but current is 'true'",
                connection.channel().queue_declare,
                name,
            )
            self.assertChannelError(
                406,
                prefix % "auto_delete" + "received 'true' but current is 'false'",
                connection.channel().queue_declare,
                name,
                durable=True,
                auto_delete=True,
            )

        return self.runPika(body)

    def test_bindUnbind(self):
        """
        queue.bind routes matching messages to the queue; queue.unbind stops
        it; unbinding a missing binding succeeds.
        """
        exchange = self.tempExchange()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(exchange, "direct")
            queue = self.exclusiveQueue(channel)
            channel.queue_bind(queue, exchange, "k")
            channel.queue_bind(queue, exchange, "k")
            pub = publisher(connection)
            pub.basic_publish(exchange, "k", b"1")
            self.assertEqual(drain(channel, queue), [b"1"])
            channel.queue_unbind(queue, exchange, "k")
            pub.basic_publish(exchange, "k", b"2")
            self.assertEqual(drain(channel, queue), [])
            channel.queue_unbind(queue, exchange, "never-bound")
            channel.queue_unbind(queue, self.name("missing-x"), "k")

        return self.runPika(body)

    def test_bindMissing(self):
        """
        Binding a missing queue or to a missing exchange gets 404.
        """
        missing = self.name("missing")

        def body(connect):
            connection = connect()
            self.assertChannelError(
                404,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (missing,),
                connection.channel().queue_bind,
                missing,
                "amq.direct",
                "k",
            )
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            self.assertChannelError(
                404,
                "NOT_FOUND - no exchange '%s' in vhost '/'" % (missing,),
                channel.queue_bind,
                queue,
                missing,
                "k",
            )

        return self.runPika(body)

    def test_purge(self):
        """
        queue.purge removes ready messages and reports how many; purging a
        missing queue gets 404.
        """
        missing = self.name("missing")

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, [b"1", b"2", b"3"])
            self.assertEqual(channel.queue_purge(queue).method.message_count, 3)
            self.assertEqual(declareOk(channel, queue).message_count, 0)
            self.assertEqual(channel.queue_purge(queue).method.message_count, 0)
            self.assertChannelError(
                404,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (missing,),
                channel.queue_purge,
                missing,
            )

        return self.runPika(body)

    def test_delete(self):
        """
        queue.delete reports the ready count and removes the queue; deleting
        a missing queue returns delete-ok with 0.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, [b"1", b"2"])
            self.assertEqual(channel.queue_delete(queue).method.message_count, 2)
            self.assertFalse(queueExists(connection, queue))
            self.assertEqual(channel.queue_delete(queue).method.message_count, 0)

        return self.runPika(body)

    def test_deleteIfUnused(self):
        """
        queue.delete if-unused of a queue with a consumer gets 406 in use.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            channel.basic_consume(queue, lambda *a: None)
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - queue '%s' in vhost '/' in use" % (queue,),
                connection.channel().queue_delete,
                queue,
                if_unused=True,
            )
            self.assertTrue(queueExists(connection, queue))

        return self.runPika(body)

    def test_deleteIfEmpty(self):
        """
        queue.delete if-empty of a queue holding messages gets 406 not empty;
        an empty one is deleted.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publisher(connection).basic_publish("", queue, b"1")
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - queue '%s' in vhost '/' not empty" % (queue,),
                channel.queue_delete,
                queue,
                if_empty=True,
            )
            channel = connection.channel()
            channel.queue_purge(queue)
            channel.queue_delete(queue, if_empty=True, if_unused=True)
            self.assertFalse(queueExists(connection, queue))

        return self.runPika(body)


class QueueArgumentTests(PikaTestCase):
    """
    Queue argument equivalence (§6.4) and validation (§6.6, §1.1, §2.1,
    §3.1, §4.1, §4.3).
    """

    def assertInvalid(self, arguments, text):
        """
        Assert that declaring a new queue with ``arguments`` gets 406
        ``text % queueName``.
        """
        name = self.tempQueue("v")

        def body(connect):
            self.assertChannelError(
                406,
                text % (name,),
                connect().channel().queue_declare,
                name,
                exclusive=True,
                arguments=arguments,
            )

        return self.runPika(body)

    def redeclare(self, first, second, text=None):
        """
        Declare a queue with ``first`` arguments, then redeclare it with
        ``second``; expect success, or 406 ``text % queueName``.
        """
        name = self.tempQueue("eq")

        def body(connect):
            connection = connect()
            connection.channel().queue_declare(name, exclusive=True, arguments=first)
            channel = connection.channel()
            if text is None:
                channel.queue_declare(name, exclusive=True, arguments=second)
            else:
                self.assertChannelError(
                    406,
                    text % (name,),
                    channel.queue_declare,
                    name,
                    exclusive=True,
                    arguments=second,
                )

        return self.runPika(body)

    def test_inequivalentValue(self):
        """
        A different x-message-ttl gets 406 received '2000' but current is
        '1000'.
        """
        return self.redeclare(
            {"x-message-ttl": 1000},
            {"x-message-ttl": 2000},
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' in "
            "vhost '/': received '2000' but current is '1000'",
        )

    def test_inequivalentMissing(self):
        """
        Omitting a known argument the queue has gets 406 received none but
        current is the value.
        """
        return self.redeclare(
            {"x-message-ttl": 1000},
            None,
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' in "
            "vhost '/': received none but current is the value '1000' of type 'signedint'",
        )

    def test_inequivalentAdded(self):
        """
        Adding a known argument the queue lacks gets 406 received the value
        but current is none.
        """
        return self.redeclare(
            None,
            {"x-max-priority": 1},
            "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue '%s' in "
            "vhost '/': received the value '1' of type 'signedint' but current is none",
        )

    def test_inequivalentTypeClass(self):
        """
        A string where the queue has an integer is inequivalent even with the
        same digits.
        """
        return self.redeclare(
            {"x-message-ttl": 1000},
            {"x-message-ttl": "1000"},
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' in "
            "vhost '/': received '1000' but current is '1000'",
        )

    def test_integerTypesEquivalent(self):
        """
        An 'I' and an 'l' integer of equal value are equivalent.
        """
        return self.redeclare({"x-message-ttl": 1000}, {"x-message-ttl": pika.compat.long(1000)})

    def test_queueTypeClassicIsDefault(self):
        """
        x-queue-type 'classic' is equivalent to no x-queue-type.
        """
        return self.redeclare(None, {"x-queue-type": "classic"})

    def test_unknownArgumentsIgnored(self):
        """
        Unknown x- arguments are accepted at create and ignored on redeclare.
        """
        return self.redeclare({"x-foo-bar": "x"}, {"x-other": 1})

    def test_validationOnlyForNewQueues(self):
        """
        An invalid argument on a redeclare is reported as inequivalent, not
        invalid (§1.2).
        """
        return self.redeclare(
            None,
            {"x-message-ttl": "abc"},
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' in "
            "vhost '/': received the value 'abc' of type 'longstr' but current is none",
        )

    def test_maxPriorityTooLarge(self):
        """
        x-max-priority 256 gets {max_value_exceeded,256}.
        """
        return self.assertInvalid(
            {"x-max-priority": 256}, invalidArg("x-max-priority", "%s", "{max_value_exceeded,256}")
        )

    def test_maxPriorityNegative(self):
        """
        x-max-priority -1 gets {value_negative,-1}.
        """
        return self.assertInvalid(
            {"x-max-priority": -1}, invalidArg("x-max-priority", "%s", "{value_negative,-1}")
        )

    def test_maxPriorityString(self):
        """
        A string x-max-priority gets "expected integer, got longstr".
        """
        return self.assertInvalid(
            {"x-max-priority": "5"},
            invalidArg("x-max-priority", "%s", '"expected integer, got longstr"'),
        )

    def test_maxPriorityZeroAccepted(self):
        """
        x-max-priority 0 is accepted.
        """
        name = self.tempQueue()

        def body(connect):
            connect().channel().queue_declare(name, exclusive=True, arguments={"x-max-priority": 0})

        return self.runPika(body)

    def test_singleActiveConsumerType(self):
        """
        A string x-single-active-consumer gets {unacceptable_type,longstr}.
        """
        return self.assertInvalid(
            {"x-single-active-consumer": "yes"},
            invalidArg("x-single-active-consumer", "%s", "{unacceptable_type,longstr}"),
        )

    def test_queueType(self):
        """
        An unknown x-queue-type gets "unsupported queue type 'foo'".
        """
        return self.assertInvalid(
            {"x-queue-type": "foo"},
            invalidArg("x-queue-type", "%s", "\"unsupported queue type 'foo'\""),
        )

    def test_queueMode(self):
        """
        An unknown x-queue-mode gets "unsupported queue mode 'foo'".
        """
        return self.assertInvalid(
            {"x-queue-mode": "foo"},
            invalidArg("x-queue-mode", "%s", "\"unsupported queue mode 'foo'\""),
        )

    def test_messageTtl(self):
        """
        A negative x-message-ttl gets {value_negative,-1}.
        """
        return self.assertInvalid(
            {"x-message-ttl": -1}, invalidArg("x-message-ttl", "%s", "{value_negative,-1}")
        )

    def test_expiresZero(self):
        """
        x-expires 0 gets {value_zero,0}.
        """
        return self.assertInvalid({"x-expires": 0}, invalidArg("x-expires", "%s", "{value_zero,0}"))

    def test_maxLength(self):
        """
        A negative x-max-length gets {value_negative,-1}.
        """
        return self.assertInvalid(
            {"x-max-length": -1}, invalidArg("x-max-length", "%s", "{value_negative,-1}")
        )

    def test_overflow(self):
        """
        An unknown x-overflow gets invalid_overflow.
        """
        return self.assertInvalid(
            {"x-overflow": "foo"}, invalidArg("x-overflow", "%s", "invalid_overflow")
        )

    def test_deadLetterRoutingKeyWithoutExchange(self):
        """
        x-dead-letter-routing-key without x-dead-letter-exchange gets
        routing_key_but_no_dlx_defined.
        """
        return self.assertInvalid(
            {"x-dead-letter-routing-key": "k"},
            invalidArg("x-dead-letter-routing-key", "%s", "routing_key_but_no_dlx_defined"),
        )

    def test_deadLetterExchangeType(self):
        """
        An integer x-dead-letter-exchange gets RabbitMQ's invalid type text.
        """
        return self.assertInvalid(
            {"x-dead-letter-exchange": 5},
            "PRECONDITION_FAILED - invalid type 'signedint' for arg "
            "'x-dead-letter-exchange' in queue '%s' in vhost '/'",
        )

    def test_quorumOnlyArgument(self):
        """
        A quorum-only argument on a classic queue gets 406 of queue type
        rabbit_classic_queue.
        """
        return self.assertInvalid(
            {"x-dead-letter-strategy": "at-least-once"},
            "PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue '%s' in "
            "vhost '/' of queue type rabbit_classic_queue",
        )


class QosTests(PikaTestCase):
    """
    basic.qos per-consumer and global prefetch (rabbitmq-semantics §6.8).
    """

    def consumeCounts(self, setup, total, ackFirstOf=None):
        """
        Fill two exclusive queues with 5 messages each, run
        ``setup(channel, q1, q2, deliveries)`` to start consumers, wait for
        ``total`` deliveries, and return a list of per-queue counts
        ``(len(q1 deliveries), len(q2 deliveries))``; if ``ackFirstOf`` is
        an index, ack that queue's first delivery (or the other queue's if
        it has none) and append the counts after that.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queues = [self.exclusiveQueue(channel), self.exclusiveQueue(channel)]
            pub = publisher(connection)
            for queue in queues:
                publishMany(pub, queue, [b"%d" % i for i in range(5)])
            deliveries = {queues[0]: [], queues[1]: []}
            setup(channel, queues[0], queues[1], deliveries)

            def counts():
                return tuple(len(deliveries[q]) for q in queues)

            def allArrived():
                # every delivery the broker made (what left the queues' ready
                # counts) has reached the client: nothing more is coming
                return 10 - sum(messageCount(channel, q) for q in queues) == sum(counts())

            waitUntil(lambda: sum(counts()) >= total, connection=connection)
            waitUntil(allArrived, connection=connection)
            result = [counts()]
            if ackFirstOf is not None:
                held = deliveries[queues[ackFirstOf]] or deliveries[queues[1 - ackFirstOf]]
                channel.basic_ack(held[0].delivery_tag)
                waitUntil(lambda: sum(counts()) >= total + 1, connection=connection)
                waitUntil(allArrived, connection=connection)
                result.append(counts())
            return result

        return self.runPika(body)

    @staticmethod
    def collector(deliveries, queue):
        """
        A pika consumer callback appending each delivery's method to
        ``deliveries[queue]``.
        """
        return lambda ch, method, props, body: deliveries[queue].append(method)

    def test_perConsumer(self):
        """
        prefetch_count with global=false limits each consumer separately; an
        ack lets exactly one more through.
        """

        def setup(channel, q1, q2, deliveries):
            channel.basic_qos(prefetch_count=2)
            channel.basic_consume(q1, self.collector(deliveries, q1))
            channel.basic_consume(q2, self.collector(deliveries, q2))

        d = self.consumeCounts(setup, 4, ackFirstOf=0)
        return d.addCallback(self.assertEqual, [(2, 2), (3, 2)])

    def test_global(self):
        """
        prefetch_count with global=true limits all consumers of the channel
        together.
        """

        def setup(channel, q1, q2, deliveries):
            channel.basic_qos(prefetch_count=3, global_qos=True)
            channel.basic_consume(q1, self.collector(deliveries, q1))
            channel.basic_consume(q2, self.collector(deliveries, q2))

        d = self.consumeCounts(setup, 3, ackFirstOf=0)

        def check(result):
            self.assertEqual([sum(c) for c in result], [3, 4])

        return d.addCallback(check)

    def test_globalAndPerConsumer(self):
        """
        A global and a per-consumer limit on one channel are both enforced.
        """

        def setup(channel, q1, q2, deliveries):
            channel.basic_qos(prefetch_count=2)
            channel.basic_qos(prefetch_count=3, global_qos=True)
            channel.basic_consume(q1, self.collector(deliveries, q1))
            channel.basic_consume(q2, self.collector(deliveries, q2))

        d = self.consumeCounts(setup, 3)

        def check(result):
            self.assertEqual(sum(result[0]), 3)
            self.assertLessEqual(max(result[0]), 2)

        return d.addCallback(check)

    def test_appliesToLaterConsumers(self):
        """
        Changing prefetch_count affects consumers created afterwards, not
        existing ones.
        """

        def setup(channel, q1, q2, deliveries):
            channel.basic_qos(prefetch_count=1)
            channel.basic_consume(q1, self.collector(deliveries, q1))
            channel.basic_qos(prefetch_count=3)
            channel.basic_consume(q2, self.collector(deliveries, q2))

        return self.consumeCounts(setup, 4).addCallback(self.assertEqual, [(1, 3)])

    def test_zeroIsUnlimited(self):
        """
        prefetch_count 0 means unlimited.
        """

        def setup(channel, q1, q2, deliveries):
            channel.basic_qos(prefetch_count=1)
            channel.basic_qos(prefetch_count=0)
            channel.basic_consume(q1, self.collector(deliveries, q1))
            channel.basic_consume(q2, self.collector(deliveries, q2))

        return self.consumeCounts(setup, 10).addCallback(self.assertEqual, [(5, 5)])

    def test_noAckIgnoresPrefetch(self):
        """
        An auto-ack consumer is not limited by prefetch_count.
        """

        def setup(channel, q1, q2, deliveries):
            channel.basic_qos(prefetch_count=1)
            channel.basic_consume(q1, self.collector(deliveries, q1), auto_ack=True)
            channel.basic_consume(q2, self.collector(deliveries, q2))

        return self.consumeCounts(setup, 6).addCallback(self.assertEqual, [(5, 1)])

    def test_prefetchSizeNotImplemented(self):
        """
        prefetch_size != 0 closes the connection with 540 NOT_IMPLEMENTED.
        """

        def body(connect):
            connection = connect()
            self.assertConnectionError(
                connection,
                540,
                "NOT_IMPLEMENTED - prefetch_size!=0 (10)",
                connection.channel().basic_qos,
                prefetch_size=10,
            )

        return self.runPika(body)


class ConsumeTests(PikaTestCase):
    """
    basic.consume/cancel and server-sent cancel (rabbitmq-semantics §6.9,
    §6.10).
    """

    def test_noAck(self):
        """
        An auto-ack consumer receives every message and leaves nothing
        unacked behind when its channel closes.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, [b"1", b"2", b"3"])
            consumer = connection.channel()
            got = []
            consumer.basic_consume(queue, lambda ch, m, p, b: got.append(b), auto_ack=True)
            waitUntil(lambda: len(got) == 3, connection=connection)
            consumer.close()
            self.assertEqual(got, [b"1", b"2", b"3"])

            def counts():
                ok = declareOk(channel, queue)
                return (ok.message_count, ok.consumer_count)

            self.assertTrue(waitUntil(lambda: counts() == (0, 0)))

        return self.runPika(body)

    def test_unackedRequeuedOnClose(self):
        """
        Unacked deliveries return to the queue, marked redelivered, when the
        consumer's channel closes.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, [b"1", b"2"])
            consumer = connection.channel()
            got = []
            tag = consumer.basic_consume(queue, lambda ch, m, p, b: got.append((m, b)))
            waitUntil(lambda: len(got) == 2, connection=connection)
            self.assertEqual([(m.consumer_tag, m.redelivered, b) for m, b in got],
                             [(tag, False, b"1"), (tag, False, b"2")])
            consumer.close()
            self.assertEqual(waitCount(channel, queue, 2), 2)
            method, _, body_ = channel.basic_get(queue, auto_ack=True)
            self.assertEqual((method.redelivered, body_), (True, b"1"))

        return self.runPika(body)

    def test_roundRobin(self):
        """
        Two consumers of equal priority share a queue's messages evenly.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            got = {"a": [], "b": []}
            channel.basic_consume(queue, lambda ch, m, p, b: got["a"].append(b), auto_ack=True)
            channel.basic_consume(queue, lambda ch, m, p, b: got["b"].append(b), auto_ack=True)
            publishMany(publisher(connection), queue, [b"%d" % i for i in range(6)])
            waitUntil(lambda: len(got["a"]) + len(got["b"]) == 6, connection=connection)
            self.assertEqual((len(got["a"]), len(got["b"])), (3, 3))

        return self.runPika(body)

    def test_exclusiveConsumerRefusedWhenOthers(self):
        """
        An exclusive consume on a queue that has consumers gets 403 in
        exclusive use.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            channel.basic_consume(queue, lambda *a: None)
            self.assertChannelError(
                403,
                "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % (queue,),
                connection.channel().basic_consume,
                queue,
                lambda *a: None,
                exclusive=True,
            )

        return self.runPika(body)

    def test_consumeRefusedWhileExclusiveConsumer(self):
        """
        Any consume on a queue with an exclusive consumer gets 403 in
        exclusive use.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            channel.basic_consume(queue, lambda *a: None, exclusive=True)
            self.assertChannelError(
                403,
                "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % (queue,),
                connection.channel().basic_consume,
                queue,
                lambda *a: None,
            )

        return self.runPika(body)

    def test_consumerTagReuse(self):
        """
        Reusing a consumer tag on the same channel closes the connection with
        530 NOT_ALLOWED.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            channel.basic_consume(queue, lambda *a: None, consumer_tag="t1")
            # pika refuses a duplicate tag locally; send the frame directly.
            channel._impl._send_method(pika.spec.Basic.Consume(queue=queue, consumer_tag="t1"))
            self.assertConnectionError(
                connection,
                530,
                "NOT_ALLOWED - attempt to reuse consumer tag 't1'",
                roundTrip,
                channel,
            )

        return self.runPika(body)

    def test_cancel(self):
        """
        After basic.cancel a consumer gets nothing more and the queue keeps
        new messages.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            got = []
            tag = channel.basic_consume(queue, lambda ch, m, p, b: got.append(b), auto_ack=True)
            self.assertEqual(declareOk(channel, queue).consumer_count, 1)
            self.assertEqual(channel.basic_cancel(tag), [])
            publisher(connection).basic_publish("", queue, b"after-cancel")
            # it waits in the queue: not delivered to the cancelled consumer
            self.assertEqual(waitCount(channel, queue, 1), 1)
            connection.process_data_events(time_limit=0)
            self.assertEqual(got, [])
            ok = declareOk(channel, queue)
            self.assertEqual((ok.message_count, ok.consumer_count), (1, 0))

        return self.runPika(body)

    def test_consumeMissingQueue(self):
        """
        Consuming from a missing queue gets 404.
        """
        name = self.name("missing")

        def body(connect):
            self.assertChannelError(
                404,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (name,),
                connect().channel().basic_consume,
                name,
                lambda *a: None,
            )

        return self.runPika(body)

    def test_consumerPriorityType(self):
        """
        A non-integer x-priority consumer argument gets 406.
        """

        def body(connect):
            channel = connect().channel()
            queue = self.exclusiveQueue(channel)
            self.assertChannelError(
                406,
                invalidArg("x-priority", queue, '"expected integer, got longstr"'),
                channel.basic_consume,
                queue,
                lambda *a: None,
                arguments={"x-priority": "high"},
            )

        return self.runPika(body)

    def test_cancelNotificationOnQueueDelete(self):
        """
        Deleting a queue from another connection sends its consumer a
        server basic.cancel (pika's on_cancel callback).
        """
        name = self.tempQueue()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.queue_declare(name)
            cancelled = []
            channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
            tag = channel.basic_consume(name, lambda *a: None)
            connect().channel().queue_delete(name)
            waitUntil(lambda: cancelled, connection=connection)
            self.assertEqual([m.consumer_tag for m in cancelled], [tag])
            self.assertTrue(channel.is_open)
            roundTrip(channel)

        return self.runPika(body)


class PublishTests(PikaTestCase):
    """
    basic.publish, mandatory/return, immediate, CC/BCC (rabbitmq-semantics
    §6.5, §6.11, §6.13, §6.18).
    """

    def test_mandatoryReturn(self):
        """
        A mandatory message no queue takes comes back in basic.return 312
        NO_ROUTE with its body and properties.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            returned = []
            channel.add_on_return_callback(
                lambda ch, method, props, body_: returned.append((method, props, body_))
            )
            key = self.name("unbound")
            channel.basic_publish(
                "amq.direct", key, b"back", pika.BasicProperties(message_id="m1"), mandatory=True
            )
            waitUntil(lambda: returned, connection=connection)
            [(method, props, body_)] = returned
            self.assertEqual(
                (method.reply_code, method.reply_text, method.exchange, method.routing_key),
                (NO_ROUTE, "NO_ROUTE", "amq.direct", key),
            )
            self.assertEqual((props.message_id, body_), ("m1", b"back"))
            self.assertTrue(channel.is_open)

        return self.runPika(body)

    def test_mandatoryRoutedNotReturned(self):
        """
        A mandatory message that reaches a queue is not returned.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            returned = []
            channel.add_on_return_callback(lambda *a: returned.append(a))
            channel.basic_publish("", queue, b"kept", mandatory=True)
            self.assertEqual(waitCount(channel, queue, 1), 1)
            # a basic.return would come before the reply to a later method on the channel
            roundTrip(channel)
            connection.process_data_events(time_limit=0)
            self.assertEqual(returned, [])

        return self.runPika(body)

    def test_unroutableDropped(self):
        """
        A non-mandatory unroutable message is dropped silently.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            returned = []
            channel.add_on_return_callback(lambda *a: returned.append(a))
            channel.basic_publish("amq.direct", self.name("unbound"), b"x")
            # a basic.return would come before the reply to a later method on the channel
            roundTrip(channel)
            connection.process_data_events(time_limit=0)
            self.assertEqual(returned, [])

        return self.runPika(body)

    def test_immediateNotImplemented(self):
        """
        basic.publish immediate=true closes the connection with 540
        NOT_IMPLEMENTED - immediate=true.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            # pika's API has no immediate flag; send the frame with pika's encoder.
            channel._impl._send_method(
                pika.spec.Basic.Publish(exchange="", routing_key=queue, immediate=True),
                (pika.BasicProperties(), b"x"),
            )
            self.assertConnectionError(
                connection, 540, "NOT_IMPLEMENTED - immediate=true", roundTrip, channel
            )

        return self.runPika(body)

    def test_missingExchange(self):
        """
        Publishing to a missing exchange closes the channel with 404.
        """
        name = self.name("missing")

        def body(connect):
            channel = connect().channel()
            channel.basic_publish(name, "k", b"x")
            self.assertChannelError(
                404, "NOT_FOUND - no exchange '%s' in vhost '/'" % (name,), roundTrip, channel
            )

        return self.runPika(body)

    def test_amqDefaultIsNotAnAlias(self):
        """
        'amq.default' is not an alias of the default exchange over AMQP: 404.
        """

        def body(connect):
            channel = connect().channel()
            channel.basic_publish("amq.default", "k", b"x")
            self.assertChannelError(
                404, "NOT_FOUND - no exchange 'amq.default' in vhost '/'", roundTrip, channel
            )

        return self.runPika(body)

    def test_userIdMustMatch(self):
        """
        A user_id property other than the authenticated user gets 406.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            user = self.pikaParams().credentials.username
            channel.basic_publish("", queue, b"x", pika.BasicProperties(user_id="not-" + user))
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - user_id property set to 'not-%s' but authenticated "
                "user was '%s'" % (user, user),
                roundTrip,
                channel,
            )

        return self.runPika(body)

    def test_ccAndBcc(self):
        """
        CC and BCC headers add routing keys; BCC is stripped before delivery
        and the other headers keep their types.
        """
        exchange = self.tempExchange()

        def body(connect):
            connection = connect()
            channel = connection.channel()
            channel.exchange_declare(exchange, "direct")
            queues = {}
            for key in ["main", "cc", "bcc", "other"]:
                queues[key] = self.exclusiveQueue(channel)
                channel.queue_bind(queues[key], exchange, key)
            headers = {
                "CC": ["cc"],
                "BCC": ["bcc"],
                "big": 1 << 40,
                "dec": decimal.Decimal("1.5"),
                "s": "v",
            }
            publisher(connection).basic_publish(
                exchange, "main", b"ssd", pika.BasicProperties(headers=headers)
            )
            for key in ["main", "cc", "bcc"]:
                method, props, body_ = channel.basic_get(queues[key], auto_ack=True)
                self.assertEqual((method.routing_key, body_), ("main", b"ssd"), key)
                self.assertEqual(
                    props.headers,
                    {"CC": ["cc"], "big": 1 << 40, "dec": decimal.Decimal("1.5"), "s": "v"},
                )
            self.assertEqual(drain(channel, queues["other"]), [])

        return self.runPika(body)

    def test_ccOnDefaultExchange(self):
        """
        CC keys on the default exchange name further queues.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            first = self.exclusiveQueue(channel)
            second = self.exclusiveQueue(channel)
            publisher(connection).basic_publish(
                "", first, b"both", pika.BasicProperties(headers={"CC": [second]})
            )
            self.assertEqual(drain(channel, first), [b"both"])
            self.assertEqual(drain(channel, second), [b"both"])

        return self.runPika(body)


class GetAckTests(PikaTestCase):
    """
    basic.get, ack/nack/reject, recover (rabbitmq-semantics §6.11).
    """

    def withMessages(self, f, bodies=(b"1", b"2", b"3")):
        """
        Run ``f(connection, channel, queue)`` with ``bodies`` ready in a
        fresh exclusive queue.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, list(bodies))
            return f(connection, channel, queue)

        return self.runPika(body)

    def test_getEmpty(self):
        """
        basic.get on an empty queue answers get-empty.
        """

        def body(connect):
            channel = connect().channel()
            queue = self.exclusiveQueue(channel)
            self.assertEqual(channel.basic_get(queue), (None, None, None))

        return self.runPika(body)

    def test_getOk(self):
        """
        get-ok carries increasing delivery tags, redelivered=false, the
        exchange, the routing key and the remaining ready count.
        """

        def f(connection, channel, queue):
            first, _, b1 = channel.basic_get(queue)
            second, _, b2 = channel.basic_get(queue)
            self.assertEqual(
                [(m.delivery_tag, m.redelivered, m.exchange, m.routing_key, m.message_count)
                 for m in [first, second]],
                [(1, False, "", queue, 2), (2, False, "", queue, 1)],
            )
            self.assertEqual((b1, b2), (b"1", b"2"))

        return self.withMessages(f)

    def test_getMissingQueue(self):
        """
        basic.get on a missing queue gets 404.
        """
        name = self.name("missing")

        def body(connect):
            self.assertChannelError(
                404,
                "NOT_FOUND - no queue '%s' in vhost '/'" % (name,),
                connect().channel().basic_get,
                name,
            )

        return self.runPika(body)

    def test_deliveryTagsPerChannel(self):
        """
        Delivery tags are numbered per channel, each starting at 1.
        """

        def f(connection, channel, queue):
            other = connection.channel()
            self.assertEqual(channel.basic_get(queue)[0].delivery_tag, 1)
            self.assertEqual(other.basic_get(queue)[0].delivery_tag, 1)
            self.assertEqual(channel.basic_get(queue)[0].delivery_tag, 2)

        return self.withMessages(f)

    def test_getNoAck(self):
        """
        A no-ack get removes the message at once; closing the channel
        requeues nothing.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            self.assertEqual(getter.basic_get(queue, auto_ack=True)[2], b"1")
            getter.close()
            self.assertEqual(waitCount(channel, queue, 2), 2)
            self.assertEqual(drain(channel, queue), [b"2", b"3"])

        return self.withMessages(f)

    def test_ackSingle(self):
        """
        basic.ack removes exactly that delivery; the others return on close.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            tags = [getter.basic_get(queue)[0].delivery_tag for _ in range(3)]
            getter.basic_ack(tags[1])
            getter.close()
            self.assertEqual(waitCount(channel, queue, 2), 2)
            self.assertEqual(drain(channel, queue), [b"1", b"3"])

        return self.withMessages(f)

    def test_ackMultiple(self):
        """
        basic.ack multiple=true acknowledges every delivery up to the tag.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            tags = [getter.basic_get(queue)[0].delivery_tag for _ in range(3)]
            getter.basic_ack(tags[1], multiple=True)
            getter.close()
            self.assertEqual(waitCount(channel, queue, 1), 1)
            self.assertEqual(drain(channel, queue), [b"3"])

        return self.withMessages(f)

    def test_ackMultipleZero(self):
        """
        basic.ack tag 0 multiple=true acknowledges every outstanding
        delivery.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            for _ in range(3):
                getter.basic_get(queue)
            getter.basic_ack(0, multiple=True)
            roundTrip(getter)
            getter.close()
            self.assertEqual(waitCount(channel, queue, 0), 0)

        return self.withMessages(f)

    def test_nackMultipleRequeue(self):
        """
        basic.nack multiple=true requeue=true returns every delivery up to
        the tag, in order and redelivered.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            tags = [getter.basic_get(queue)[0].delivery_tag for _ in range(3)]
            getter.basic_nack(tags[1], multiple=True, requeue=True)
            self.assertEqual(waitCount(channel, queue, 2), 2)
            got = [channel.basic_get(queue, auto_ack=True) for _ in range(2)]
            self.assertEqual([(m.redelivered, b) for m, _, b in got], [(True, b"1"), (True, b"2")])

        return self.withMessages(f)

    def test_nackDiscard(self):
        """
        basic.nack requeue=false discards the delivery.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            tag = getter.basic_get(queue)[0].delivery_tag
            getter.basic_nack(tag, requeue=False)
            getter.close()
            self.assertEqual(waitCount(channel, queue, 2), 2)
            self.assertEqual(drain(channel, queue), [b"2", b"3"])

        return self.withMessages(f)

    def test_reject(self):
        """
        basic.reject requeue=true returns the message; requeue=false
        discards it.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            first = getter.basic_get(queue)[0].delivery_tag
            second = getter.basic_get(queue)[0].delivery_tag
            getter.basic_reject(first, requeue=True)
            getter.basic_reject(second, requeue=False)
            roundTrip(getter)
            getter.close()
            self.assertEqual(waitCount(channel, queue, 2), 2)
            self.assertEqual(drain(channel, queue), [b"1", b"3"])

        return self.withMessages(f)

    def test_requeueKeepsPosition(self):
        """
        Requeued messages go back to their original position and come back
        with redelivered=true.
        """

        def f(connection, channel, queue):
            getter = connection.channel()
            a = getter.basic_get(queue)[0].delivery_tag
            b = getter.basic_get(queue)[0].delivery_tag
            getter.basic_reject(b, requeue=True)
            getter.basic_reject(a, requeue=True)
            self.assertEqual(waitCount(channel, queue, 3), 3)
            got = [channel.basic_get(queue, auto_ack=True) for _ in range(3)]
            self.assertEqual(
                [(m.redelivered, body_) for m, _, body_ in got],
                [(True, b"1"), (True, b"2"), (False, b"3")],
            )

        return self.withMessages(f)

    def test_unknownDeliveryTag(self):
        """
        Acking a delivery tag never issued closes the channel with 406
        unknown delivery tag.
        """

        def f(connection, channel, queue):
            channel.basic_get(queue)
            channel.basic_ack(99)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - unknown delivery tag 99", roundTrip, channel
            )

        return self.withMessages(f)

    def test_doubleAck(self):
        """
        Acking the same delivery twice gets 406 unknown delivery tag.
        """

        def f(connection, channel, queue):
            tag = channel.basic_get(queue)[0].delivery_tag
            channel.basic_ack(tag)
            channel.basic_ack(tag)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - unknown delivery tag %d" % (tag,), roundTrip, channel
            )

        return self.withMessages(f)

    def test_ackOfNoAckDelivery(self):
        """
        Acking a no-ack delivery gets 406 unknown delivery tag.
        """

        def f(connection, channel, queue):
            tag = channel.basic_get(queue, auto_ack=True)[0].delivery_tag
            channel.basic_ack(tag)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - unknown delivery tag %d" % (tag,), roundTrip, channel
            )

        return self.withMessages(f)

    def test_nackAndRejectUnknown(self):
        """
        nack and reject of unknown delivery tags get 406 unknown delivery
        tag.
        """

        def f(connection, channel, queue):
            nacker = connection.channel()
            nacker.basic_nack(5)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - unknown delivery tag 5", roundTrip, nacker
            )
            rejecter = connection.channel()
            rejecter.basic_reject(7)
            self.assertChannelError(
                406, "PRECONDITION_FAILED - unknown delivery tag 7", roundTrip, rejecter
            )

        return self.withMessages(f)

    def test_recoverRequeue(self):
        """
        basic.recover requeue=true redelivers a consumer's unacked messages
        with redelivered=true.
        """

        def f(connection, channel, queue):
            got = []
            channel.basic_consume(queue, lambda ch, m, p, b: got.append((m.redelivered, b)))
            waitUntil(lambda: len(got) == 3, connection=connection)
            channel.basic_recover(requeue=True)
            waitUntil(lambda: len(got) == 6, connection=connection)
            self.assertEqual(got[:3], [(False, b"1"), (False, b"2"), (False, b"3")])
            self.assertEqual(sorted(got[3:]), [(True, b"1"), (True, b"2"), (True, b"3")])

        return self.withMessages(f)

    def test_recoverNoRequeueNotImplemented(self):
        """
        basic.recover requeue=false closes the connection with 540
        NOT_IMPLEMENTED - requeue=false.
        """

        def body(connect):
            connection = connect()
            self.assertConnectionError(
                connection,
                540,
                "NOT_IMPLEMENTED - requeue=false",
                connection.channel().basic_recover,
                requeue=False,
            )

        return self.runPika(body)


class PriorityTests(PikaTestCase):
    """
    Priority queues, consumer priorities and single active consumer
    (rabbitmq-semantics §6.15-§6.17).
    """

    def test_priorityQueueOrder(self):
        """
        A priority queue delivers highest priority first, FIFO within a
        level, with no priority as 0 and priorities above max as max.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel, arguments={"x-max-priority": 3})
            pub = publisher(connection)
            for label, priority in [
                ("a", None), ("b", 1), ("c", 5), ("d", 3), ("e", 0), ("f", 2), ("g", 3)
            ]:
                pub.basic_publish(
                    "", queue, label.encode(), pika.BasicProperties(priority=priority)
                )
            self.assertEqual(drain(channel, queue), [b"c", b"d", b"g", b"f", b"b", b"a", b"e"])

        return self.runPika(body)

    def test_consumerPriority(self):
        """
        The highest-priority consumer gets messages until its prefetch is
        full; only then does a lower one get any.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            got = {"hi": [], "lo": []}
            channel.basic_qos(prefetch_count=10)
            channel.basic_consume(
                queue, lambda ch, m, p, b: got["lo"].append(b), arguments={"x-priority": 1}
            )
            channel.basic_qos(prefetch_count=2)
            channel.basic_consume(
                queue, lambda ch, m, p, b: got["hi"].append(b), arguments={"x-priority": 10}
            )
            publishMany(connect().channel(), queue, [b"m%d" % i for i in range(6)])
            waitUntil(lambda: len(got["hi"]) + len(got["lo"]) == 6, connection=connection)
            self.assertEqual(got, {"hi": [b"m0", b"m1"], "lo": [b"m2", b"m3", b"m4", b"m5"]})

        return self.runPika(body)

    def test_singleActiveConsumer(self):
        """
        With x-single-active-consumer only the first consumer gets messages;
        when it cancels, the next one takes over.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel, arguments={"x-single-active-consumer": True})
            got = {"first": [], "second": []}
            first = channel.basic_consume(
                queue, lambda ch, m, p, b: got["first"].append(b), auto_ack=True
            )
            channel.basic_consume(
                queue, lambda ch, m, p, b: got["second"].append(b), auto_ack=True
            )
            pub = publisher(connection)
            publishMany(pub, queue, [b"1", b"2", b"3"])
            waitUntil(lambda: len(got["first"]) == 3, connection=connection)
            # all three left the queue, to the first consumer: none is left for the second
            self.assertEqual(waitCount(channel, queue, 0), 0)
            connection.process_data_events(time_limit=0)
            self.assertEqual(got, {"first": [b"1", b"2", b"3"], "second": []})
            channel.basic_cancel(first)
            publishMany(pub, queue, [b"4", b"5"])
            waitUntil(lambda: len(got["second"]) == 2, connection=connection)
            self.assertEqual(got, {"first": [b"1", b"2", b"3"], "second": [b"4", b"5"]})

        return self.runPika(body)

    def test_singleActiveConsumerRefusesExclusive(self):
        """
        An exclusive consume on a single-active-consumer queue gets 403.
        """

        def body(connect):
            channel = connect().channel()
            queue = self.exclusiveQueue(channel, arguments={"x-single-active-consumer": True})
            self.assertChannelError(
                403,
                "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % (queue,),
                channel.basic_consume,
                queue,
                lambda *a: None,
                exclusive=True,
            )

        return self.runPika(body)


class TxTests(PikaTestCase):
    """
    tx.select/commit/rollback (rabbitmq-semantics §6.12).
    """

    def test_commitPublishes(self):
        """
        Transactional publishes reach the queue only at tx.commit.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            tx = connection.channel()
            tx.tx_select()
            publishMany(tx, queue, [b"1", b"2"])
            # the publishes were handled before the round trip's reply: held by the transaction
            roundTrip(tx)
            self.assertEqual(declareOk(channel, queue).message_count, 0)
            tx.tx_commit()
            self.assertEqual(waitCount(channel, queue, 2), 2)
            self.assertEqual(drain(channel, queue), [b"1", b"2"])

        return self.runPika(body)

    def test_rollbackDiscardsPublishes(self):
        """
        tx.rollback discards the uncommitted publishes; the channel stays
        transactional.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            tx = connection.channel()
            tx.tx_select()
            publishMany(tx, queue, [b"1", b"2"])
            tx.tx_rollback()
            tx.basic_publish("", queue, b"3")
            tx.tx_commit()
            self.assertEqual(waitCount(channel, queue, 1), 1)
            self.assertEqual(drain(channel, queue), [b"3"])

        return self.runPika(body)

    def test_commitAcks(self):
        """
        Transactional acks take effect at tx.commit.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, [b"1"])
            tx = connection.channel()
            tx.tx_select()
            tag = tx.basic_get(queue)[0].delivery_tag
            tx.basic_ack(tag)
            tx.tx_commit()
            tx.close()
            self.assertEqual(waitCount(channel, queue, 0), 0)

        return self.runPika(body)

    def test_rollbackUndoesAcks(self):
        """
        tx.rollback undoes acks: the message stays unacked and returns to
        the queue when the channel closes.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, [b"1"])
            tx = connection.channel()
            tx.tx_select()
            tag = tx.basic_get(queue)[0].delivery_tag
            tx.basic_ack(tag)
            tx.tx_rollback()
            tx.close()
            self.assertEqual(waitCount(channel, queue, 1), 1)
            method, _, body_ = channel.basic_get(queue, auto_ack=True)
            self.assertEqual((method.redelivered, body_), (True, b"1"))

        return self.runPika(body)

    def test_notTransactional(self):
        """
        tx.commit or tx.rollback without tx.select gets 406 channel is not
        transactional.
        """

        def body(connect):
            connection = connect()
            text = "PRECONDITION_FAILED - channel is not transactional"
            self.assertChannelError(406, text, connection.channel().tx_commit)
            self.assertChannelError(406, text, connection.channel().tx_rollback)

        return self.runPika(body)

    def test_txToConfirm(self):
        """
        confirm.select on a transactional channel gets 406.
        """

        def body(connect):
            channel = connect().channel()
            channel.tx_select()
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
                channel.confirm_delivery,
            )

        return self.runPika(body)

    def test_confirmToTx(self):
        """
        tx.select on a channel in confirm mode gets 406.
        """

        def body(connect):
            channel = connect().channel()
            channel.confirm_delivery()
            self.assertChannelError(
                406,
                "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
                channel.tx_select,
            )

        return self.runPika(body)


class ConfirmTests(PikaTestCase):
    """
    confirm.select and publisher acks (rabbitmq-semantics §6.12).
    """

    def test_confirmSelect(self):
        """
        In confirm mode routed and unroutable non-mandatory publishes are
        both acked.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            channel.confirm_delivery()
            channel.basic_publish("", queue, b"routed")
            channel.basic_publish("amq.direct", self.name("unbound"), b"dropped")
            self.assertEqual(drain(channel, queue), [b"routed"])

        return self.runPika(body)

    def test_mandatoryUnroutable(self):
        """
        A mandatory unroutable publish in confirm mode is returned (312)
        before its ack.
        """

        def body(connect):
            channel = connect().channel()
            channel.confirm_delivery()
            e = self.assertRaises(
                pika.exceptions.UnroutableError,
                channel.basic_publish,
                "amq.direct",
                self.name("unbound"),
                b"back",
                mandatory=True,
            )
            [message] = e.messages
            self.assertEqual(
                (message.method.reply_code, message.method.reply_text, message.body),
                (NO_ROUTE, "NO_ROUTE", b"back"),
            )

        return self.runPika(body)

    def test_acksCoverEveryPublish(self):
        """
        Acks (single or multiple) for 200 pipelined publishes confirm each
        sequence number 1..200 exactly once and never nack.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            frames = []
            selected = []
            # Drive pika's asynchronous channel so publishes are pipelined.
            channel._impl.confirm_delivery(
                ack_nack_callback=lambda frame: frames.append(frame.method),
                callback=lambda frame: selected.append(frame),
            )
            waitUntil(lambda: selected, connection=connection)
            total = 200
            for i in range(total):
                channel._impl.basic_publish("", queue, b"%d" % (i,))
            confirmed = set()

            def apply():
                while frames:
                    method = frames.pop(0)
                    self.assertIsInstance(method, pika.spec.Basic.Ack)
                    if method.multiple:
                        tags = set(range(1, method.delivery_tag + 1)) - confirmed
                    else:
                        self.assertNotIn(method.delivery_tag, confirmed)
                        tags = {method.delivery_tag}
                    confirmed.update(tags)
                return len(confirmed) == total

            waitUntil(apply, timeout=10, connection=connection)
            self.assertEqual(confirmed, set(range(1, total + 1)))
            self.assertEqual(waitCount(channel, queue, total), total)

        return self.runPika(body)


class ContentTests(PikaTestCase):
    """
    Content header and body frames: large and empty bodies, properties and
    field tables (rabbitmq-semantics §6.19).
    """

    def roundTripBodies(self, bodies, **params):
        """
        Publish each of ``bodies`` to an exclusive queue over a connection
        made with ``params`` and return what basic.get gives back.
        """

        def body(connect):
            connection = connect(**params)
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publishMany(publisher(connection), queue, bodies)
            return drain(channel, queue)

        return self.runPika(body)

    def test_largeBody(self):
        """
        A 1 MiB body split over many frames (frame_max 131072) arrives
        intact.
        """
        data = bytes(range(256)) * 4096
        return self.roundTripBodies([data]).addCallback(self.assertEqual, [data])

    def test_largeBodySmallFrames(self):
        """
        A 1 MiB body over a connection negotiated to frame_max 4096 arrives
        intact.
        """
        data = bytes(reversed(range(256))) * 4096
        return self.roundTripBodies([data], frame_max=4096).addCallback(self.assertEqual, [data])

    def test_frameBoundaries(self):
        """
        Bodies of exactly one, one plus one byte, and two full body frames
        (frame_max 4096 leaves 4088 bytes per frame) arrive intact.
        """
        bodies = [b"a" * 4087, b"b" * 4088, b"c" * 4089, b"d" * 8176, b"e" * 8177]
        return self.roundTripBodies(bodies, frame_max=4096).addCallback(self.assertEqual, bodies)

    def test_emptyBody(self):
        """
        A message with an empty body (no body frame) is delivered with an
        empty body, to a consumer and to basic.get.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            pub = publisher(connection)
            publishMany(pub, queue, [b"", b""], content_type="text/plain")
            method, props, body_ = channel.basic_get(queue, auto_ack=True)
            self.assertEqual((body_, props.content_type), (b"", "text/plain"))
            got = []
            channel.basic_consume(queue, lambda ch, m, p, b: got.append(b), auto_ack=True)
            waitUntil(lambda: got, connection=connection)
            self.assertEqual(got, [b""])

        return self.runPika(body)

    def test_allProperties(self):
        """
        All fourteen basic properties are delivered unchanged.
        """

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            user = self.pikaParams().credentials.username
            props = pika.BasicProperties(
                content_type="application/json",
                content_encoding="utf-8",
                headers={"h": "v"},
                delivery_mode=2,
                priority=7,
                correlation_id="corr-1",
                reply_to="reply-q",
                expiration="60000",
                message_id="msg-1",
                timestamp=1700000000,
                type="kind",
                user_id=user,
                app_id="app-1",
                cluster_id="cluster-1",
            )
            publisher(connection).basic_publish("", queue, b"{}", props)
            _, got, _ = channel.basic_get(queue, auto_ack=True)
            names = [
                "content_type", "content_encoding", "headers", "delivery_mode", "priority",
                "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                "user_id", "app_id", "cluster_id",
            ]
            self.assertEqual(
                dict((n, getattr(got, n)) for n in names),
                dict((n, getattr(props, n)) for n in names),
            )

        return self.runPika(body)

    def test_headerFieldTypes(self):
        """
        Every field-table type pika sends (S, x, t, I, l, D, T, F, A, V and
        nesting) survives the broker unchanged.
        """
        headers = {
            "str": "text",
            "unicode": "h\u00e9llo \u2713",
            "empty-str": "",
            "bytes": b"\x00\x01\xfe\xff",
            "true": True,
            "false": False,
            "int": 42,
            "negative": -2147483648,
            "int64": 1 << 40,
            "negative-int64": -(1 << 62),
            "long-small": pika.compat.long(7),
            "decimal": decimal.Decimal("3.14"),
            "decimal-int": decimal.Decimal("12"),
            "timestamp": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
            "void": None,
            "table": {"inner": {"deep": 1, "s": "x"}, "flag": True},
            "empty-table": {},
            "array": [1, "two", True, None, [3, [4]], {"k": "v"}, b"\x00", 1 << 33],
            "empty-array": [],
        }

        def body(connect):
            connection = connect()
            channel = connection.channel()
            queue = self.exclusiveQueue(channel)
            publisher(connection).basic_publish(
                "", queue, b"x", pika.BasicProperties(headers=headers)
            )
            _, props, _ = channel.basic_get(queue, auto_ack=True)
            self.assertEqual(props.headers, headers)
            self.assertIsInstance(props.headers["bytes"], bytes)

        return self.runPika(body)
