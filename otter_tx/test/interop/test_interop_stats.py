"""
Message rates over real HTTP and AMQP: pika publishes at a steady rate in a
worker thread and the management API's ``publish_details.rate`` reads it
back within 20 % on the queue and the overview.  Runs against otter_tx
in-process (collecting every 5000 ms, RabbitMQ's default) or, with
``OTTER_TEST_AMQP_URL`` and ``OTTER_TEST_MGMT_URL`` set, against RabbitMQ
3.10.

The rate is the difference of the last two samples (``rabbit_mgmt_stats``),
so it is read while the publisher still runs, late enough that the last two
samples of a 5 s interval both fall inside the publishing: at 10.5 s of an
11 s run.  Against a shared external broker the overview's rate may include
other clients' publishes, so only its lower bound is checked there.
"""

import time
from urllib.parse import quote

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from otter_tx.test.interop.support import EXTERNAL_URL
from otter_tx.test.interop.test_interop_http import EXTERNAL_MGMT, ManagementHTTPCase

#: messages per second, seconds of publishing, when the rates are read
RATE = 100
SECONDS = 11.0
READ_AT = 10.5


class PublishRateTests(ManagementHTTPCase):
    """A known publish rate read back from the management API."""

    timeout = 40

    def amqpURL(self):
        """The AMQP URL of the broker behind ``self.base``."""
        if EXTERNAL_MGMT:
            return EXTERNAL_URL or "amqp://guest:guest@127.0.0.1:5682/"
        return "amqp://guest:guest@127.0.0.1:%d/" % (self.fixture.amqpPort,)

    def publishSteadily(self, queue, stop):
        """Publish RATE messages a second to ``queue`` until ``stop`` (monotonic time); the count."""
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.amqpURL()))
        try:
            ch = conn.channel()
            start = time.monotonic()
            n = 0
            while True:
                due = start + n / float(RATE)
                if due >= stop:
                    break
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                ch.basic_publish("", queue, b"rate")
                n += 1
            return n
        finally:
            conn.close()

    @inlineCallbacks
    def test_publishRate(self):
        """100 msg/s published by pika read back as 100 msg/s (within 20 %) on the queue and the overview."""
        q = self.name("rates-q")
        path = "/api/queues/%2F/" + quote(q, safe="")
        status, _, _ = yield self.call("PUT", path, {"durable": False, "auto_delete": False})
        self.assertIn(status, (201, 204))
        self.cleanups.append(path)
        stop = time.monotonic() + SECONDS
        publishing = deferToThread(self.publishSteadily, q, stop)
        yield deferLater(reactor, READ_AT, lambda: None)
        _, queue, _ = yield self.call("GET", path)
        _, overview, _ = yield self.call("GET", "/api/overview")
        n = yield publishing
        self.assertGreater(n, RATE * (SECONDS - 1))
        qRate = queue["message_stats"]["publish_details"]["rate"]
        oRate = overview["message_stats"]["publish_details"]["rate"]
        self.assertTrue(RATE * 0.8 <= qRate <= RATE * 1.2, (qRate, oRate))
        # a shared external broker's overview also counts other clients' publishes
        oHigh = float("inf") if EXTERNAL_MGMT else RATE * 1.2
        self.assertTrue(RATE * 0.8 <= oRate <= oHigh, (qRate, oRate))


class RangeShapeTests(ManagementHTTPCase):
    """The shape of sampled details and the range errors, as RabbitMQ 3.10 answers them."""

    @inlineCallbacks
    def test_overviewSamples(self):
        """msg_rates and lengths ranges give 13 samples 5 s apart, newest first, with rate, avg and avg_rate."""
        status, o, _ = yield self.call(
            "GET", "/api/overview?msg_rates_age=60&msg_rates_incr=5&lengths_age=60&lengths_incr=5")
        self.assertEqual(status, 200)
        details = [v for k, v in sorted(o["churn_rates"].items()) if k.endswith("_details")]
        if not EXTERNAL_MGMT or "messages_details" in o["queue_totals"]:
            # RabbitMQ 3.10 shows no queue_totals details while it has no queue
            details.insert(0, o["queue_totals"]["messages_details"])
        for d in details:
            self.assertEqual(sorted(d), ["avg", "avg_rate", "rate", "samples"])
            stamps = [s["timestamp"] for s in d["samples"]]
            if EXTERNAL_MGMT:
                # RabbitMQ 3.10 gives 12 while its newest 5 s bucket is still filling
                self.assertIn(len(stamps), (12, 13))
            else:
                self.assertEqual(len(stamps), 13)
            self.assertEqual(stamps, sorted(stamps, reverse=True))
            self.assertEqual({a - b for a, b in zip(stamps, stamps[1:])}, {5000})
            self.assertEqual(stamps[0] % 5000, 0)

    @inlineCallbacks
    def test_invalidRange(self):
        """An age of 0, or more than 500 increments, is 400 bad_request with RabbitMQ's reason."""
        for query, reason in (("msg_rates_age=0&msg_rates_incr=1", "Invalid range parameters: age 0, incr 1"),
                              ("lengths_age=600&lengths_incr=1", "Invalid range parameters: age 600, incr 1")):
            status, body, _ = yield self.call("GET", "/api/overview?" + query)
            self.assertEqual((status, body), (400, {"error": "bad_request", "reason": reason}))

    @inlineCallbacks
    def test_disableStats(self):
        """disable_stats=true drops the statistics from the overview and keeps object_totals."""
        status, o, _ = yield self.call("GET", "/api/overview?disable_stats=true")
        self.assertEqual(status, 200)
        self.assertTrue(o["disable_stats"])
        for key in ("message_stats", "churn_rates", "queue_totals"):
            self.assertNotIn(key, o)
        self.assertIn("object_totals", o)
