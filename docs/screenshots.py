"""
Screenshots of the admin web app for docs/management.md.

Starts an in-memory broker on free ports, fills it with a few objects and
messages (pika for the AMQP side, the HTTP API for the rest), opens each
page in Debian's chromium through Playwright (the browser test's
:func:`~otter_tx.test.e2e.test_webapp.browser`) and saves 1280x800 PNGs in
docs/images/ (run ``optipng -o2`` on them afterwards when it is installed).

    .venv-test/bin/python docs/screenshots.py [OUTPUT_DIR]
"""

import json
import os
import subprocess
import sys
import threading
import urllib.parse

from twisted.internet import reactor, threads

from otter_tx.service import OtterService
from otter_tx.test.e2e.test_webapp import apiCall as call, browser, login

HERE = os.path.dirname(os.path.abspath(__file__))


def populate(base, amqpPort, stop):
    """Objects and messages to show; a publisher and a consumer keep running until ``stop`` is set."""
    import pika

    call(base, "PUT", "/api/vhosts/staging", {})
    call(base, "PUT", "/api/users/monitor", {"password": "monitor", "tags": "monitoring"})
    call(base, "PUT", "/api/permissions/staging/monitor", {"configure": "", "write": "", "read": ".*"})
    call(base, "PUT", "/api/exchanges/%2F/orders", {"type": "topic", "durable": True})
    call(base, "PUT", "/api/exchanges/%2F/orders.dlx", {"type": "fanout", "durable": True})
    call(base, "PUT", "/api/exchanges/%2F/reminders", {"type": "x-delayed-message", "durable": True,
                                                        "arguments": {"x-delayed-type": "direct"}})
    queues = {
        "orders.created": {"x-message-ttl": 90000, "x-dead-letter-exchange": "orders.dlx",
                           "x-dead-letter-routing-key": "expired-orders", "x-expires": 3600000},
        "orders.dead": {},
        "orders.audit": {"x-expires": 1800000, "x-max-length": 5000},
        "reminders.due": {},
        "work": {"x-max-priority": 5},
    }
    for name, args in queues.items():
        call(base, "PUT", "/api/queues/%2F/" + name, {"durable": True, "arguments": args})
    call(base, "PUT", "/api/queues/staging/staging.inbox", {"durable": True})
    call(base, "POST", "/api/bindings/%2F/e/orders/q/orders.created", {"routing_key": "order.created.*"})
    call(base, "POST", "/api/bindings/%2F/e/orders/q/orders.audit", {"routing_key": "#"})
    call(base, "POST", "/api/bindings/%2F/e/orders.dlx/q/orders.dead", {"routing_key": ""})
    call(base, "POST", "/api/bindings/%2F/e/reminders/q/reminders.due", {"routing_key": "due"})
    call(base, "PUT", "/api/policies/%2F/orders-limits", {"pattern": "^orders\\.", "apply-to": "queues",
                                                           "definition": {"max-length-bytes": 10485760},
                                                           "priority": 1})
    call(base, "PUT", "/api/vhost-limits/staging/max-connections", {"value": 50})

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqpPort))
    ch = conn.channel()
    # 197 held reminders, one every 20 s from a minute on: two pages of the delayed list
    for i in range(197):
        ch.basic_publish("reminders", "due", b"remind %d" % i,
                         pika.BasicProperties(headers={"x-delay": 60000 + 20000 * i, "attempt": 3,
                                                       "tenant": {"id": 42, "region": "eu-west"}},
                                              message_id="reminder-%d" % i))
    consumerConn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqpPort,
                                                                     client_properties={"product": "billing-worker"}))
    cch = consumerConn.channel()
    cch.basic_qos(prefetch_count=10)
    cch.basic_consume("work", lambda c, m, p, b: c.basic_ack(m.delivery_tag))

    def publisher():
        n = 0
        while not stop.is_set():
            ch.basic_publish("", "work", b"job %d" % n)
            n += 1
            conn.process_data_events(0.05)
            consumerConn.process_data_events(0.05)
        cch.close()
        consumerConn.close()
        conn.close()

    return publisher


def orders(base):
    """Orders with several times to expiry (per-message expiration or the queue's 90 s), published now."""
    for i, ttl in enumerate(["900", "6000", "8000", "25000", "50000", None, None, "200000", "3000"]):
        props = {"content_type": "application/json", "message_id": "order-%d" % i, "delivery_mode": 2}
        if ttl is not None:
            props["expiration"] = ttl
        call(base, "POST", "/api/exchanges/%2F/orders/publish", {
            "routing_key": "order.created.eu", "properties": props, "payload_encoding": "string",
            "payload": json.dumps({"order": 1000 + i, "total": 12.5 * i})})


def shoot(base, amqpPort, outDir):
    """Populate, then one PNG per page (in a worker thread: the reactor serves the broker)."""
    stop = threading.Event()
    publisher = populate(base, amqpPort, stop)
    orders(base)
    t = threading.Thread(target=publisher, daemon=True)
    t.start()
    url = base + "/"
    try:
        with browser() as page:
            page.goto(url)
            page.fill("input[name=username]", "guest")
            page.screenshot(path=os.path.join(outDir, "login.png"))
            login(page, url)
            page.select_option("#refresh-select", "5")

            def scroll(selector, above=60):
                top = page.locator(selector).first.evaluate("(e) => e.getBoundingClientRect().top + window.scrollY")
                page.evaluate("(y) => window.scrollTo(0, y)", max(0, top - above))
                page.wait_for_timeout(200)

            def snap(name, hashPath, settle=1.5, scrollTo=None):
                page.goto(url + hashPath)
                page.wait_for_timeout(int(settle * 1000))
                if scrollTo:
                    scroll(scrollTo, above=10)
                page.screenshot(path=os.path.join(outDir, name + ".png"))

            snap("overview", "#/overview", settle=16)  # a few refreshes for the client-side chart history
            snap("connections", "#/connections")
            snap("channels", "#/channels")
            # the consumer's channel (its row has a consumer)
            worker = page.locator("main tbody tr", has=page.locator("td:nth-child(9)", has_text="1")).first \
                .locator("a").inner_text()
            snap("channel", "#/channels/" + urllib.parse.quote(worker, safe=""), settle=11)
            snap("exchanges", "#/exchanges")
            snap("exchange-delayed", "#/exchanges/%2F/reminders", scrollTo="h2:text('Delayed messages')")
            page.locator(".delayed select[name=page_size]").select_option("20")
            page.locator(".delayed [data-page=\"1\"]").wait_for()
            jump = page.locator("form", has=page.locator("button", has_text="Jump"))
            jump.locator("input[name=due_from]").fill("in 40 min")
            jump.locator("button[type=submit]").click()
            page.locator("tr.mark").wait_for()
            scroll("h2:text('Delayed messages')", above=10)
            page.screenshot(path=os.path.join(outDir, "exchange-delayed-paged.png"))
            snap("queues", "#/queues")
            orders(base)
            snap("queue", "#/queues/%2F/orders.created", settle=11)
            orders(base)
            page.click("header button >> text=Refresh now")
            page.wait_for_timeout(500)
            scroll("h3:text('Expired and dead-lettered by reason')", above=10)
            page.screenshot(path=os.path.join(outDir, "queue-insight.png"))
            browse = page.locator("form", has=page.locator("button", has_text="Browse"))
            browse.locator("input[name=count]").fill("2")
            browse.locator("button[type=submit]").click()
            page.locator("#browsed pre.payload").first.wait_for()
            scroll("h2:text('Browse messages')", above=10)
            page.screenshot(path=os.path.join(outDir, "queue-browse.png"))
            # dead letters: their x-death headers as rows, times readable
            page.goto(url + "#/queues/%2F/orders.dead")
            browse = page.locator("form", has=page.locator("button", has_text="Browse"))
            browse.locator("input[name=count]").fill("1")
            browse.locator("button[type=submit]").click()
            page.locator("#browsed table[data-list=x-death]").first.wait_for()
            scroll("#browsed", above=10)
            page.screenshot(path=os.path.join(outDir, "queue-headers.png"))
            # a queue x-expires deleted while its page was open
            call(base, "PUT", "/api/queues/%2F/session.tmp", {"durable": False, "arguments": {"x-expires": 4000}})
            snap("queue-gone", "#/queues/%2F/session.tmp", settle=8)
            snap("policies", "#/policies")
            snap("users", "#/users")
            snap("vhosts", "#/vhosts")
            snap("limits", "#/limits")
            snap("definitions", "#/definitions")
    finally:
        stop.set()
        t.join(5)


def main(outDir):
    os.makedirs(outDir, exist_ok=True)
    svc = OtterService(amqp=["tcp:0:interface=127.0.0.1"], management=["tcp:0:interface=127.0.0.1"], reactor=reactor)
    result = {}

    def started(_):
        amqp = [s.port.getHost().port for s in svc.amqpServices][0]
        http = [s.port.getHost().port for s in svc.managementServices][0]
        return threads.deferToThread(shoot, "http://127.0.0.1:%d" % (http,), amqp, outDir)

    def done(r):
        result["failure"] = r if hasattr(r, "getTraceback") else None
        reactor.stop()

    def start():
        svc.startService()
        svc.whenReady().addCallback(started).addBoth(done)

    reactor.callWhenRunning(start)
    reactor.run()
    if result.get("failure") is not None:
        print(result["failure"].getTraceback(), file=sys.stderr)
        return 1
    for name in sorted(os.listdir(outDir)):
        path = os.path.join(outDir, name)
        if name.endswith(".png"):
            try:
                subprocess.run(["optipng", "-quiet", "-o2", path], check=False)
            except OSError:
                pass
            print("%-24s %6d bytes" % (name, os.path.getsize(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "images")))
