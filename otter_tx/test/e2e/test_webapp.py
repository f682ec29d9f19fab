"""
The admin web app in a real browser: Debian's ``chromium`` driven by
Playwright (its sync API, in a thread, so the reactor keeps serving the
broker), against an OtterService on ``tcp:0`` (AMQP + management).  The
issue's scenario with real clicks and typing: log in as guest, declare a
dead-letter exchange, its queue and binding and a queue with
``x-message-ttl`` and ``x-dead-letter-exchange``, publish from the page,
watch the message appear, then expire into the dead-letter queue, browse it
(it stays), purge, set a policy, delete the queue.

Skips: on PyPy (Playwright has no PyPy build), and when
``/usr/bin/chromium`` is missing (CI installs it, and fails on the skip
line).  Never hangs: every wait has a timeout, the page's default is
:data:`STEP_TIMEOUT_MS`, the test's :attr:`~WebAppBrowserTests.timeout`
bounds the whole run.  ``docs/screenshots.py`` reuses :func:`browser`.
"""

import base64
import contextlib
import json
import os
import platform
import shutil
import tempfile
import time
import urllib.request

from twisted.internet import defer, reactor, threads
from twisted.trial.unittest import SkipTest, TestCase

from otter_tx.service.assembly import OtterService

#: Debian's chromium (``apt-get install chromium``); Playwright's own browsers are never downloaded
CHROMIUM = "/usr/bin/chromium"
#: flags for a headless, quiet, offline-friendly chromium in a container
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
#: the longest one browser step (a click, a wait for text) may take, ms
STEP_TIMEOUT_MS = 20000


def skipUnlessBrowser():
    """Raise SkipTest, with the reason, when this interpreter or host cannot run the browser."""
    if platform.python_implementation() != "CPython":
        raise SkipTest("the browser test runs on CPython only: Playwright has no %s build"
                       % (platform.python_implementation(),))
    if not os.path.exists(CHROMIUM):
        raise SkipTest("chromium is not installed (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        raise SkipTest("playwright is not installed (pip install playwright)")


@contextlib.contextmanager
def browser(width=1280, height=800):
    """
    A Playwright page (sync API) in Debian's chromium with a fresh
    user-data-dir, removed afterwards; dialogs (confirm) are accepted.
    Call from a thread that is not the reactor's.
    """
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="otter-chromium-")
    try:
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                viewport={"width": width, "height": height})
            try:
                page = ctx.pages[0] if ctx.pages else ctx.new_page()
                page.set_default_timeout(STEP_TIMEOUT_MS)
                page.on("dialog", lambda d: d.accept())
                yield page
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@defer.inlineCallbacks
def startBroker(testCase):
    """An OtterService on tcp:0 (AMQP and management); fires with ``(service, management URL)``."""
    svc = OtterService(amqp=["tcp:0:interface=127.0.0.1"], management=["tcp:0:interface=127.0.0.1"],
                       reactor=reactor)
    svc.startService()
    testCase.addCleanup(svc.stopService)
    [port] = yield svc.listeningPorts(svc.managementServices)
    return svc, "http://127.0.0.1:%d/" % (port.getHost().port,)


def login(page, url, user="guest", password="guest"):
    """Open the app at ``url`` and log in through its form."""
    page.goto(url)
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("form.login button[type=submit]")
    page.wait_for_selector("#who")


def declareQueue(page, name, args=()):
    """Declare queue ``name`` on the Queues page; ``args``: (quick-add key, value) pairs."""
    page.click("nav a[data-nav=queues]")
    form = page.locator("form", has=page.locator("button", has_text="Add queue"))
    form.locator("input[name=name]").fill(name)
    for i, (key, value) in enumerate(args):
        form.locator(".quick button", has_text=key).first.click()
        form.locator(".args .row").nth(i).locator("[data-v]").fill(value)
    form.locator("button[type=submit]").click()
    page.locator("main table a", has_text=name).first.wait_for()


def queueCount(page, which):
    """The queue page's ready / unacked / total count (int)."""
    return int(page.locator("[data-count=%s]" % (which,)).inner_text().replace(",", ""))


def waitCount(page, which, expected):
    """Wait (auto-refresh, at most STEP_TIMEOUT_MS) until the queue page shows ``expected``."""
    page.wait_for_function(
        "([w, n]) => { const e = document.querySelector('[data-count=' + w + ']');"
        " return e && e.textContent === String(n); }", arg=[which, expected])


class WebAppBrowserTests(TestCase):
    """The issue's scenario, clicked through in chromium."""

    timeout = 150

    def setUp(self):
        skipUnlessBrowser()

    @defer.inlineCallbacks
    def test_scenario(self):
        """Log in, declare a TTL queue with a DLX, publish, watch it dead-letter, browse, purge, policy, delete."""
        svc, url = yield startBroker(self)
        shots = os.path.abspath(self.mktemp())
        os.makedirs(shots)
        seen = yield threads.deferToThread(self.scenario, url, shots)
        vh = svc.broker.vhosts["/"]
        self.assertNotIn("web-q", vh.queues)
        self.assertEqual(vh.queues["web-dlq"].readyCount, 0)
        self.assertEqual(vh.policies["web-pol"].definition, {"max-length": 1000})
        self.assertEqual(seen["browsed"], ["ttl-me"])
        self.assertTrue(seen["target"])

    def scenario(self, url, shots):
        """The browser half (in a thread): returns what it saw, for the reactor-side checks."""
        seen = {}
        with browser() as page:
            try:
                self.steps(page, url, seen)
            except Exception:
                page.screenshot(path=os.path.join(shots, "failure.png"))
                raise
        return seen

    def steps(self, page, url, seen):
        login(page, url)
        assert page.locator("#who").inner_text() == "guest"
        # the dead-letter exchange, its queue and the binding
        page.click("nav a[data-nav=exchanges]")
        form = page.locator("form", has=page.locator("button", has_text="Add exchange"))
        form.locator("input[name=name]").fill("web-dlx")
        form.locator("select[name=type]").select_option("fanout")
        form.locator("button[type=submit]").click()
        page.locator("main table a", has_text="web-dlx").wait_for()
        declareQueue(page, "web-dlq")
        declareQueue(page, "web-q", [("x-message-ttl", "3000"), ("x-dead-letter-exchange", "web-dlx")])
        page.click("main table a >> text=web-dlq")
        bind = page.locator("form", has=page.locator("button", has_text="Bind"))
        bind.locator("input[name=source]").fill("web-dlx")
        bind.locator("button[type=submit]").click()
        page.locator("main table a", has_text="web-dlx").first.wait_for()
        # the TTL queue: its dead-letter target, then a message published from the page
        page.click("nav a[data-nav=queues]")
        page.click("main table a >> text=web-q")
        page.locator("td a", has_text="web-dlq").wait_for()  # the dead-letter target table
        seen["target"] = True
        publish = page.locator("form", has=page.locator("button", has_text="Publish message"))
        publish.locator("textarea[name=payload]").fill("ttl-me")
        publish.locator("button[type=submit]").click()
        page.get_by_role("status").filter(has_text="Message published.").first.wait_for()
        waitCount(page, "ready", 1)
        waitCount(page, "ready", 0)  # expired (3 s) and dead-lettered
        # the dead-letter queue has it: browse leaves it there
        page.click("nav a[data-nav=queues]")
        page.click("main table a >> text=web-dlq")
        waitCount(page, "ready", 1)
        page.locator("form", has=page.locator("button", has_text="Browse")).locator("button[type=submit]").click()
        page.locator("#browsed pre.payload").first.wait_for()
        seen["browsed"] = page.locator("#browsed pre.payload").all_inner_texts()
        page.click("header button >> text=Refresh now")
        assert queueCount(page, "ready") == 1
        page.click("button >> text=Purge messages")
        waitCount(page, "ready", 0)
        # a policy
        page.click("nav a[data-nav=policies]")
        pol = page.locator("form", has=page.locator("button", has_text="Add / update policy"))
        pol.locator("input[name=name]").fill("web-pol")
        pol.locator("input[name=pattern]").fill("^web-")
        pol.locator(".quick button", has_text="max-length").first.click()
        pol.locator(".args .row").nth(0).locator("[data-v]").fill("1000")
        pol.locator("button[type=submit]").click()
        page.locator("main table td", has_text="web-pol").wait_for()
        page.locator("tr", has_text="web-pol").locator("button", has_text="Edit").click()  # back into the form
        assert pol.locator("input[name=name]").input_value() == "web-pol"
        assert pol.locator(".args .row").nth(0).locator("[data-v]").input_value() == "1000"
        # delete the TTL queue: back on the list, without it
        page.click("nav a[data-nav=queues]")
        page.click("main table a >> text=web-q")
        page.locator("dd", has_text="web-pol").wait_for()  # the policy applies to it
        page.click("button >> text=Delete queue")
        page.wait_for_function("() => location.hash === '#/queues'")
        page.locator("main table a", has_text="web-dlq").wait_for()
        assert page.locator("main table a", has_text="web-q").count() == 0

    @defer.inlineCallbacks
    def test_tagsLoginAndDelayedList(self):
        """Tags decide the tabs, a bad password says so, and a delayed exchange lists its held message and cancels it."""
        svc, url = yield startBroker(self)
        svc.broker.addUser("web-mgmt", "pw", ["management"])
        svc.broker.setPermissions("web-mgmt", "/")
        svc.broker.vhosts["/"].declareExchange("web-delayed", "x-delayed-message", durable=False,
                                               arguments={"x-delayed-type": "direct"})
        seen = yield threads.deferToThread(self.tagsAndDelayed, url)
        self.assertEqual(seen["tabs"], ["overview", "connections", "channels", "exchanges", "queues"])
        self.assertEqual(seen["failed"], "Login failed")
        self.assertEqual(seen["adminTabs"][-1], "definitions")
        self.assertEqual(seen["published"], {"routed": False})  # held: no route yet (the plugin's rule)
        self.assertEqual(seen["delayedRow"], ["<b>k</b>", "m-1"])
        ex = svc.broker.vhosts["/"].exchanges["web-delayed"]
        self.assertEqual(seen["cancelled"], ["DELETE /api/exchanges/%2F/web-delayed/delayed/1"])
        self.assertEqual(ex.held, 0)

    def tagsAndDelayed(self, url):
        """The browser half of test_tagsLoginAndDelayedList; returns what it saw."""
        seen = {"cancelled": []}
        tabs = "Array.from(document.querySelectorAll('nav a')).map((a) => a.dataset.nav)"
        with browser() as page:
            login(page, url, "web-mgmt", "pw")
            seen["tabs"] = page.evaluate(tabs)
            page.click("#logout")
            page.fill("input[name=username]", "guest")
            page.fill("input[name=password]", "wrong")
            page.click("form.login button[type=submit]")
            page.locator("form.login .error", has_text="Login failed").wait_for()
            seen["failed"] = page.locator("form.login .error").inner_text()
            login(page, url)
            seen["adminTabs"] = page.evaluate(tabs)
            # a message held for 90 s, published through the real API (a routing key that looks like HTML)
            req = urllib.request.Request(
                url + "api/exchanges/%2F/web-delayed/publish", method="POST",
                data=json.dumps({"routing_key": "<b>k</b>", "payload": "hello", "payload_encoding": "string",
                                 "properties": {"message_id": "m-1", "headers": {"x-delay": 90000}}}).encode(),
                headers={"content-type": "application/json",
                         "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
            with urllib.request.urlopen(req, timeout=10) as r:
                seen["published"] = json.loads(r.read())
            page.on("request", lambda r: seen["cancelled"].append(
                "DELETE " + r.url.split(url.rstrip("/"), 1)[1]) if r.method == "DELETE" else None)
            page.goto(url + "#/exchanges/%2F/web-delayed")
            row = page.locator("tr", has=page.locator("button", has_text="Cancel")).first
            row.wait_for()
            seen["delayedRow"] = [row.locator("td").nth(2).inner_text(), row.locator("td").nth(3).inner_text()]
            row.locator("button", has_text="Cancel").click()
            page.get_by_role("status").filter(has_text="Delayed message cancelled.").first.wait_for()
        return seen

    @defer.inlineCallbacks
    def test_chartsFromSamples(self):
        """With the API's *_details.samples (a faked overview) the charts plot them instead of saying "no data yet"."""
        svc, url = yield startBroker(self)
        drawn = yield threads.deferToThread(self.samplesCharts, url)
        self.assertEqual(drawn, {"Queued messages": 1, "Message rates": 1,
                                 "Expired, dead-lettered by reason, delayed": 0})

    def samplesCharts(self, url):
        """The browser half of test_chartsFromSamples: the number of plots under each chart title."""
        import re

        now = int(time.time() * 1000)

        def samples(values):
            # newest first, every 5 s, as RabbitMQ sends them
            return {"rate": 1.0, "samples": [{"sample": v, "timestamp": now - 5000 * i} for i, v in enumerate(values)]}

        def fake(route):
            body = json.loads(route.fetch().text())
            body["queue_totals"].update(messages_details=samples([9, 6, 3]), messages_ready_details=samples([8, 5, 2]),
                                        messages_unacknowledged_details=samples([1, 1, 1]))
            body["message_stats"] = {"publish": 30, "publish_details": samples([30, 20, 10])}
            route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

        with browser() as page:
            page.route(re.compile(r".*/api/overview\?.*"), fake)
            login(page, url)
            page.locator(".chart canvas").first.wait_for()
            return page.evaluate(
                "Object.fromEntries(Array.from(document.querySelectorAll('.chart')).map((c) =>"
                " [c.previousSibling.textContent, c.querySelectorAll('.uplot').length]))")
