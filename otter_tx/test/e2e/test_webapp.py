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
import re
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


def apiCall(base, method, path, body=None, user="guest", password="guest"):
    """
    One management API request (``base``: the management URL, with or
    without its final ``/``; ``path``: ``/api/...``): the decoded JSON
    answer, or None for an empty one; HTTPError for a 4xx/5xx.
    """
    auth = base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
    req = urllib.request.Request(base.rstrip("/") + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "authorization": "Basic " + auth})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


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
            seen["published"] = apiCall(url, "POST", "/api/exchanges/%2F/web-delayed/publish", {
                "routing_key": "<b>k</b>", "payload": "hello", "payload_encoding": "string",
                "properties": {"message_id": "m-1", "headers": {"x-delay": 90000}}})
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
        drawn, legend = yield threads.deferToThread(self.samplesCharts, url)
        self.assertEqual(drawn, {"Queued messages": 1, "Message rates": 1,
                                 "Expired, dead-lettered by reason, delayed": 0})
        # the current values (as the page's numbers) from the first draw, and again when the cursor leaves the chart
        self.assertEqual(legend, [["9", "1", "10"], ["9", "1", "10"]])

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
                                        messages_unacknowledged_details=samples([1, 1, 1]),
                                        messages=10, messages_ready=9, messages_unacknowledged=1)
            body["message_stats"] = {"publish": 30, "publish_details": samples([30, 20, 10])}
            route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

        legend = "Array.from(document.querySelectorAll('.chart')[0].querySelectorAll('.u-series'))" \
                 ".slice(1).map((s) => s.querySelector('.u-value').textContent)"
        with browser() as page:
            page.route(re.compile(r".*/api/overview\?.*"), fake)
            login(page, url)
            page.locator(".chart canvas").first.wait_for()
            drawn = page.evaluate(
                "Object.fromEntries(Array.from(document.querySelectorAll('.chart')).map((c) =>"
                " [c.previousSibling.textContent, c.querySelectorAll('.uplot').length]))")
            legends = [page.evaluate(legend)]
            over = page.locator(".chart .u-over").first
            over.hover(position={"x": 20, "y": 20})
            page.mouse.move(5, 5)
            legends.append(page.evaluate(legend))
            return drawn, legends

    @defer.inlineCallbacks
    def test_delayedPagesJumpAndDelivered(self):
        """
        197 held messages: paged, a jump to a due time, a cancel after delivery says so, the x-delay
        quick key; a plain exchange shows no delayed section.
        """
        svc, url = yield startBroker(self)
        vh = svc.broker.vhosts["/"]
        ex = vh.declareExchange("web-held", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        seen = yield threads.deferToThread(self.delayedPages, url)
        self.assertEqual(seen["first"], ("197 held; showing 1-100 in due order", "Page 1 of 2", 100))
        self.assertEqual(seen["next"], ("Page 2 of 2", 97, "m-100"))
        # m-i is due i + 1 minutes after it was published: the first due at or after "in 150 min" is m-150
        self.assertEqual(seen["jump"], ("Page 8 of 10", "m-150"))
        self.assertEqual(seen["gone"], "Message m-140 is no longer held: it was already delivered (or cancelled).")
        self.assertEqual(seen["published"], "Message published, but not routed.")
        self.assertEqual(seen["plain"], False)
        self.assertEqual(ex.held, 197)  # 197 - m-140 + the one published from the page

    def delayedPages(self, url):
        """The browser half of test_delayedPagesJumpAndDelivered."""
        seen = {}
        for i in range(197):
            apiCall(url, "POST", "/api/exchanges/%2F/web-held/publish", {
                "routing_key": "k", "payload": "p", "payload_encoding": "string",
                "properties": {"message_id": "m-%d" % i, "headers": {"x-delay": 60000 * (i + 1)}}})
        with browser() as page:
            login(page, url)
            page.goto(url + "#/exchanges/%2F/web-held")
            rows = page.locator(".delayed tbody tr")
            page.locator(".delayed [data-page]").wait_for()
            seen["first"] = (page.locator(".delayed [data-held]").inner_text(),
                             page.locator(".delayed [data-page]").inner_text(), rows.count())
            page.click(".delayed button >> text=Next")
            page.locator(".delayed [data-page=\"2\"]").wait_for()
            seen["next"] = (page.locator(".delayed [data-page]").inner_text(), rows.count(),
                            rows.first.locator("td").nth(3).inner_text())
            page.locator(".delayed select[name=page_size]").select_option("20")
            page.locator(".delayed [data-page=\"1\"]").wait_for()
            jump = page.locator("form", has=page.locator("button", has_text="Jump"))
            jump.locator("input[name=due_from]").fill("in 150 min")
            jump.locator("button[type=submit]").click()
            page.locator(".delayed tr.mark").wait_for()
            seen["jump"] = (page.locator(".delayed [data-page]").inner_text(),
                            page.locator(".delayed tr.mark td").nth(3).inner_text())
            # m-140 (on the same page) goes elsewhere, as a message that fires, while the page still lists it
            row = page.locator(".delayed tr", has=page.locator("td", has_text="m-140"))
            held = apiCall(url, "GET", "/api/exchanges/%2F/web-held/delayed?page=8&page_size=20")["items"]
            m140 = next(m for m in held if m["message_id"] == "m-140")
            apiCall(url, "DELETE", "/api/exchanges/%2F/web-held/delayed/" + m140["id"])
            row.locator("button", has_text="Cancel").click()
            seen["gone"] = page.get_by_role("alert").filter(has_text="no longer held").first.inner_text()
            # the publish form offers the delay headers
            publish = page.locator("form", has=page.locator("button", has_text="Publish message"))
            publish.locator(".quick button", has_text="x-delay-until").wait_for()
            publish.locator(".quick button", has_text="x-delay").first.click()
            publish.locator(".args[data-args=headers] .row").nth(0).locator("[data-v]").fill("600000")
            publish.locator("button[type=submit]").click()
            seen["published"] = page.get_by_role("status").filter(has_text="Message published").first.inner_text()
            # a plain exchange: no delayed-messages section
            page.goto(url + "#/exchanges/%2F/amq.direct")
            page.locator("dd", has_text="direct").first.wait_for()
            seen["plain"] = page.locator("h2", has_text="Delayed messages").is_visible()
        return seen

    @defer.inlineCallbacks
    def test_goneQueueAndExchange(self):
        """A queue deleted under its page, or one the user may not see: one notice, no toasts, no more requests."""
        svc, url = yield startBroker(self)
        vh = svc.broker.vhosts["/"]
        vh.declareQueue("web-gone", None)
        vh.declareExchange("web-gone-x", "fanout")
        svc.broker.addVHost("private")
        svc.broker.addUser("web-outsider", "pw", ["management"])
        svc.broker.setPermissions("web-outsider", "/")
        seen = yield threads.deferToThread(self.goneQueue, url)
        self.assertEqual(seen["queue"], ("404", "Queue web-gone in virtual host / does not exist (any more): "
                                                "it was deleted or closed."))
        self.assertEqual(seen["exchange"], "404")
        self.assertEqual(seen["private"], ("401", "You may not see queue anything in virtual host private: "
                                                  "User not authorised to access virtual host"))
        self.assertEqual(seen["toasts"], 0)
        self.assertEqual(seen["requestsAfter"], [])
        self.assertEqual(seen["forms"], 0)

    def goneQueue(self, url):
        """The browser half of test_goneQueueAndExchange."""
        seen = {"requests": []}
        with browser() as page:
            page.on("request", lambda r: seen["requests"].append(r.url) if "/api/" in r.url else None)
            login(page, url)
            page.goto(url + "#/queues/%2F/web-gone")
            page.locator("[data-count=ready]").wait_for()
            apiCall(url, "DELETE", "/api/queues/%2F/web-gone")
            page.click("header button >> text=Refresh now")
            gone = page.locator("p.gone")
            gone.wait_for()
            seen["queue"] = (gone.get_attribute("data-gone"), gone.inner_text())
            seen["forms"] = page.locator("main form").count()
            del seen["requests"][:]
            page.click("header button >> text=Refresh now")
            page.click("header button >> text=Refresh now")
            seen["requestsAfter"] = list(seen["requests"])
            seen["toasts"] = page.get_by_role("alert").count()
            page.goto(url + "#/exchanges/%2F/web-gone-x")
            page.locator("main h2", has_text="Bindings from this exchange").wait_for()
            apiCall(url, "DELETE", "/api/exchanges/%2F/web-gone-x")
            page.click("header button >> text=Refresh now")
            seen["exchange"] = page.locator("p.gone").get_attribute("data-gone")
            page.click("#logout")
            login(page, url, "web-outsider", "pw")
            page.goto(url + "#/queues/private/anything")
            seen["private"] = (page.locator("p.gone").get_attribute("data-gone"), page.locator("p.gone").inner_text())
        return seen

    @defer.inlineCallbacks
    def test_headersAndPolicyKeys(self):
        """Get shows headers as nested tables, x-death as rows with UTC times; policy forms offer the server's keys."""
        svc, url = yield startBroker(self)
        svc.broker.vhosts["/"].declareQueue("web-h", None)
        seen = yield threads.deferToThread(self.headersAndPolicies, url)
        self.assertEqual(seen["attempt"], "3")
        self.assertEqual(seen["tenant"], "eu-west")
        self.assertEqual(seen["death"], ["2", "expired", "work", "2023-11-14 22:13:20 UTC", "", "work"])
        self.assertEqual(seen["timestamp"], "2023-11-14 22:13:20 UTC")
        self.assertEqual(seen["browsedTenant"], "eu-west")
        self.assertEqual(seen["browsedDeath"], seen["death"])
        self.assertEqual(seen["policyKeys"], ["dead-letter-exchange", "dead-letter-routing-key", "delivery-limit",
                                              "expires", "max-age", "max-length", "max-length-bytes", "message-ttl",
                                              "overflow", "queue-leader-locator", "stream-max-segment-size-bytes"])
        self.assertEqual(seen["operatorKeys"], ["expires", "message-ttl", "max-length", "max-length-bytes",
                                                "delivery-limit"])
        self.assertEqual(svc.broker.vhosts["/"].operatorPolicies["web-op"].definition, {"delivery-limit": 5})

    def headersAndPolicies(self, url):
        """The browser half of test_headersAndPolicyKeys."""
        seen = {}
        apiCall(url, "POST", "/api/exchanges/%2F/amq.default/publish", {
            "routing_key": "web-h", "payload": "x", "payload_encoding": "string",
            "properties": {"timestamp": 1700000000, "headers": {
                "attempt": 3, "tenant": {"id": 42, "region": "eu-west"},
                "x-death": [{"count": 2, "reason": "expired", "queue": "work", "time": 1700000000,
                             "exchange": "", "routing-keys": ["work"]}]}}})
        with browser() as page:
            login(page, url)
            page.goto(url + "#/queues/%2F/web-h")
            get = page.locator("form", has=page.locator("button", has_text="Get message(s)"))
            get.locator("button[type=submit]").click()
            headers = page.locator("#got table[data-table=headers]")
            headers.wait_for()
            seen["attempt"] = headers.locator("tr[data-key=attempt] > td").first.inner_text()
            seen["tenant"] = headers.locator("table[data-table=tenant] tr[data-key=region] > td").inner_text()
            seen["death"] = headers.locator("table[data-list=x-death] tbody tr").first.locator("td").all_inner_texts()
            seen["timestamp"] = page.locator("#got tr[data-key=timestamp] > td").inner_text()
            # Browse (the message was requeued by Get's default ack mode) shows the same tables
            page.locator("form", has=page.locator("button", has_text="Browse")).locator("button[type=submit]").click()
            browsed = page.locator("#browsed table[data-table=headers]")
            browsed.wait_for()
            seen["browsedTenant"] = browsed.locator("table[data-table=tenant] tr[data-key=region] > td").inner_text()
            seen["browsedDeath"] = browsed.locator("table[data-list=x-death] tbody tr").first.locator("td").all_inner_texts()
            quick = "Array.from(document.querySelectorAll('form .quick button')).map((b) => b.textContent)" \
                    ".filter((t) => t !== '+ row')"
            page.click("nav a[data-nav=policies]")
            # the policies page itself, not the queue page's quick buttons still shown
            page.locator("h1", has_text=re.compile("^Policies$")).wait_for()
            page.locator("form .quick button").first.wait_for()
            seen["policyKeys"] = page.evaluate(quick)
            page.click("nav a[data-nav=operator-policies]")
            page.locator("h1", has_text="Operator policies").wait_for()
            seen["operatorKeys"] = page.evaluate(quick)
            pol = page.locator("form", has=page.locator("button", has_text="Add / update policy"))
            pol.locator("input[name=name]").fill("web-op")
            pol.locator("input[name=pattern]").fill(".*")
            pol.locator(".quick button", has_text="delivery-limit").click()
            pol.locator(".args .row").nth(0).locator("[data-v]").fill("5")
            pol.locator("button[type=submit]").click()
            page.locator("main table td", has_text="web-op").wait_for()
        return seen

    @defer.inlineCallbacks
    def test_listsChannelsAndQueueType(self):
        """The queue list filters (substring, regex) and pages; Type makes a quorum queue; a channel has a page."""
        svc, url = yield startBroker(self)
        vh = svc.broker.vhosts["/"]
        for i in range(120):
            vh.declareQueue("q-%03d" % (i,), None)
        amqpPort = [s.port.getHost().port for s in svc.amqpServices][0]
        seen = yield threads.deferToThread(self.listsAndChannels, url, amqpPort)
        self.assertEqual(seen["all"], ("Page 1 of 2", "120 items", 100))
        self.assertEqual(seen["page2"], ("Page 2 of 2", 20, "q-100"))
        self.assertEqual(seen["substring"], ("10 items (filtered from 120)", 10))
        self.assertEqual(seen["regex"], ["q-110", "q-111", "q-112"])
        self.assertEqual(seen["badRegex"], (3, 0))
        self.assertEqual(vh.queues["web-quorum"].arguments, {"x-queue-type": "quorum"})
        self.assertEqual(seen["channel"]["prefetch"], "7")
        self.assertTrue(seen["channel"]["chart"])
        self.assertEqual(seen["channel"]["consumer"], "q-000")

    def listsAndChannels(self, url, amqpPort):
        """The browser half of test_listsChannelsAndQueueType."""
        import pika

        seen = {}
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqpPort))
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=7)
            ch.basic_consume("q-000", lambda *a: None)
            with browser() as page:
                login(page, url)
                page.click("nav a[data-nav=queues]")
                pages = page.locator(".filter [data-page]")
                pages.wait_for()
                rows = page.locator("main table").first.locator("tbody tr")
                seen["all"] = (pages.inner_text(), page.locator(".filter [data-shown]").inner_text(), rows.count())
                page.click(".filter button >> text=Next")
                page.locator(".filter [data-page=\"2\"]").wait_for()
                # (the page number shows before the table is filled again: wait for its rows, or
                # read what is there after 10 s)
                try:
                    page.wait_for_function("() => (document.querySelector('main table tbody tr td a') || {})"
                                           ".textContent === 'q-100'", timeout=10000)
                except Exception:
                    pass
                seen["page2"] = (pages.inner_text(), rows.count(), rows.first.locator("td a").inner_text())
                page.fill(".filter input[name=filter]", "Q-01")
                page.locator(".filter [data-shown=\"10\"]").wait_for()  # q-010..q-019, ignoring case
                seen["substring"] = (page.locator(".filter [data-shown]").inner_text(), rows.count())
                page.check(".filter input[name=regex]")
                page.fill(".filter input[name=filter]", "^q-11[0-2]$")
                page.locator(".filter [data-shown=\"3\"]").wait_for()
                seen["regex"] = rows.locator("td a").all_inner_texts()
                page.fill(".filter input[name=filter]", "^q-(")  # does not compile: marked, not sent
                page.locator(".filter input.invalid").wait_for()
                page.click("header button >> text=Refresh now")
                seen["badRegex"] = (rows.count(), page.get_by_role("alert").count())
                form = page.locator("form", has=page.locator("button", has_text="Add queue"))
                form.locator("select[name=type]").select_option("quorum")
                form.locator("input[name=name]").fill("web-quorum")
                form.locator("button[type=submit]").click()
                page.get_by_role("status").filter(has_text="Queue declared.").first.wait_for()
                page.click("nav a[data-nav=channels]")
                page.locator("main table a").first.click()
                page.locator("main h1", has_text="Channel ").wait_for()
                page.locator("dd", has_text="running").wait_for()
                info = page.locator("dl.kv")
                seen["channel"] = {
                    "prefetch": info.locator("dt:text-is('Prefetch count') + dd").inner_text(),
                    "chart": page.locator("h3", has_text="Message rates").is_visible(),
                    "consumer": page.locator("main table td a").first.inner_text(),
                }
        finally:
            conn.close()
        return seen

    @defer.inlineCallbacks
    def test_connectionChannelExchangeLists(self):
        """
        The exchange, connection and channel lists filter (substring ignoring case, regex) and page as the
        queue list does; with a virtual host chosen, the channel list filters and pages its own channels.
        """
        svc, url = yield startBroker(self)
        vh = svc.broker.vhosts["/"]
        for i in range(25):
            vh.declareExchange("ex-%02d" % (i,), "direct")
        svc.broker.addVHost("other")
        svc.broker.setPermissions("guest", "other")
        amqpPort = [s.port.getHost().port for s in svc.amqpServices][0]
        seen = yield threads.deferToThread(self.otherLists, url, amqpPort)
        # 25 + the default exchange and 6 amq.* in "/", 7 in "other"
        self.assertEqual(seen["exchanges"], ("Page 1 of 2", "39 items", 20))
        self.assertEqual(seen["exchanges2"], ("Page 2 of 2", 19))
        self.assertEqual(seen["exchangesFiltered"], ("5 items (filtered from 39)",
                                                     ["ex-20", "ex-21", "ex-22", "ex-23", "ex-24"]))
        self.assertEqual(seen["connections"], ("4 items", 4))
        self.assertEqual(seen["connectionsFiltered"], ("1 item (filtered from 4)", [seen["oneConnection"]]))
        self.assertEqual(seen["channels"], ("8 items", 8))
        self.assertEqual(seen["channelsRegex"], ("4 items (filtered from 8)", 4))
        self.assertTrue(all(n.endswith(" (2)") for n in seen["channelsRegexNames"]), seen["channelsRegexNames"])
        self.assertEqual(seen["channelsOther"], ("1 item (filtered from 2)", [seen["otherChannel"]]))

    def otherLists(self, url, amqpPort):
        """The browser half of test_connectionChannelExchangeLists."""
        import pika

        seen = {}
        conns = []
        try:
            for vhost in ("/", "/", "/", "other"):
                c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqpPort, vhost))
                conns.append(c)
                c.channel()
                c.channel()
            names = [c["name"] for c in apiCall(url, "GET", "/api/connections")]
            with browser() as page:
                login(page, url)
                pages = page.locator(".filter [data-page]")
                shown = page.locator(".filter [data-shown]")
                rows = page.locator("main table").first.locator("tbody tr")
                # exchanges: 20 a page, then a filter
                page.click("nav a[data-nav=exchanges]")
                page.locator("main h1", has_text="Exchanges").wait_for()
                page.locator(".filter select[name=page_size]").select_option("20")
                pages.wait_for()
                seen["exchanges"] = (pages.inner_text(), shown.inner_text(), rows.count())
                page.click(".filter button >> text=Next")
                page.locator(".filter [data-page=\"2\"]").wait_for()
                seen["exchanges2"] = (pages.inner_text(), rows.count())
                page.fill(".filter input[name=filter]", "EX-2")
                page.locator(".filter [data-shown=\"5\"]").wait_for()
                seen["exchangesFiltered"] = (shown.inner_text(), rows.locator("td a").all_inner_texts())
                # connections: one by its client port
                page.click("nav a[data-nav=connections]")
                page.locator("main h1", has_text="Connections").wait_for()
                page.locator(".filter [data-shown=\"4\"]").wait_for()
                seen["connections"] = (shown.inner_text(), rows.count())
                one = names[2]
                seen["oneConnection"] = one
                page.fill(".filter input[name=filter]", one.split(" -> ")[0].split(":")[1] + " ->")
                page.locator(".filter [data-shown=\"1\"]").wait_for()
                seen["connectionsFiltered"] = (shown.inner_text(), rows.locator("td a").all_inner_texts())
                # channels: every second channel by a regular expression, then one virtual host's
                page.click("nav a[data-nav=channels]")
                page.locator("main h1", has_text="Channels").wait_for()
                page.locator(".filter [data-shown=\"8\"]").wait_for()
                seen["channels"] = (shown.inner_text(), rows.count())
                page.check(".filter input[name=regex]")
                page.fill(".filter input[name=filter]", r"\(2\)$")
                page.locator(".filter [data-shown=\"4\"]").wait_for()
                seen["channelsRegex"] = (shown.inner_text(), rows.count())
                seen["channelsRegexNames"] = rows.locator("td a").all_inner_texts()
                page.select_option("#vhost-select", "other")
                page.locator(".filter [data-shown=\"1\"]").wait_for()
                seen["channelsOther"] = (shown.inner_text(), rows.locator("td a").all_inner_texts())
                seen["otherChannel"] = names[3] + " (2)"
        finally:
            for c in conns:
                c.close()
        return seen

    @defer.inlineCallbacks
    def test_timesAndExpiryRanges(self):
        """
        Times read one way (UTC, "YYYY-MM-DD HH:MM:SS UTC"), durations another ("1 min 30 s", never
        "90 s"), and the time-to-expiry buckets as ranges that exclude each other, counted as such.
        """
        svc, url = yield startBroker(self)
        vh = svc.broker.vhosts["/"]
        # x-expires one second under the hour: its lease reads "59 min S s" however soon the page loads
        # (durations round up: a lease of 3,600,000 ms read in its first second is "1 h 0 min")
        vh.declareQueue("web-ttl", None, arguments={"x-message-ttl": 120000, "x-expires": 3599000})
        vh.declareExchange("web-later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        seen = yield threads.deferToThread(self.timesAndRanges, url)
        # one message in each range (none under 1 s: it would expire before the page shows it)
        self.assertEqual(seen["buckets"], [["Under 1 s", "0"], ["1 s to 10 s", "1"], ["10 s to 1 min", "1"],
                                           ["Over 1 min", "1"], ["Never (no TTL)", "0"]])
        self.assertEqual(seen["xExpires"], "59 min 59 s (3,599,000 ms)")
        self.assertRegex(seen["lease"], r"^59 min [0-9]{1,2} s \(at 20[0-9]{2}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} UTC\)$")
        [due90, due2h] = seen["delayed"]
        self.assertRegex(due90[0], r"^20[0-9]{2}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} UTC$")
        # (read as the page loads: up to 10 s later on a busy machine; a helper session saw "1 min 28 s")
        self.assertRegex(due90[1], r"^1 min (2[0-9]|30) s$")
        self.assertRegex(due2h[1], r"^(1 h 59 min|2 h 0 min)$")

    def timesAndRanges(self, url):
        """The browser half of test_timesAndExpiryRanges."""
        seen = {}
        for expiration in ("9500", "50000", None):  # None: the queue's 2 min TTL
            props = {} if expiration is None else {"expiration": expiration}
            apiCall(url, "POST", "/api/exchanges/%2F/amq.default/publish", {
                "routing_key": "web-ttl", "payload": "x", "payload_encoding": "string", "properties": props})
        for delay in (90000, 7200000):
            apiCall(url, "POST", "/api/exchanges/%2F/web-later/publish", {
                "routing_key": "k", "payload": "p", "payload_encoding": "string",
                "properties": {"headers": {"x-delay": delay}}})
        with browser() as page:
            login(page, url)
            page.goto(url + "#/queues/%2F/web-ttl")
            page.locator(".hist [data-bucket=never]").wait_for()
            seen["buckets"] = page.evaluate(
                "Array.from(document.querySelectorAll('.hist > span:not(.num)')).map((e) =>"
                " [e.textContent, e.nextElementSibling.nextElementSibling.textContent])")
            seen["xExpires"] = page.locator("dt:text-is('x-expires') + dd").inner_text()
            seen["lease"] = page.locator("dt:text-is('Deleted if unused in') + dd").inner_text()
            page.goto(url + "#/exchanges/%2F/web-later")
            rows = page.locator(".delayed tbody tr")
            rows.nth(1).wait_for()
            seen["delayed"] = [rows.nth(i).locator("td").all_inner_texts()[:2] for i in range(2)]
        return seen


class StreamPageTests(TestCase):
    """The queue page of a stream shows its offsets, segments and readers (docs/streams.md)."""

    timeout = 150

    def setUp(self):
        skipUnlessBrowser()

    @defer.inlineCallbacks
    def test_streamSection(self):
        svc, url = yield startBroker(self)
        vh = svc.broker.vhosts["/"]
        q = vh.declareQueue("web-stream", None, durable=True, arguments={
            "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096})
        from otter_tx.broker.message import Message
        for i in range(200):
            q.enqueue(Message("", "web-stream", b"\x00\x00", b"event-%03d" % i))
        yield q.stream.sync()
        seen = yield threads.deferToThread(self.streamPage, url)
        self.assertEqual(seen["committed"], "200")
        self.assertEqual(seen["first"], "0")
        self.assertGreater(seen["segments"], 1)
        self.assertEqual(seen["readers"], "No readers")

    def streamPage(self, url):
        with browser() as page:
            login(page, url)
            page.goto(url + "#/queues/%2F/web-stream")
            page.locator("#stream h2", has_text="Stream").wait_for()
            box = page.locator("#stream")

            def value(label):
                return box.locator("dt", has_text=label).first.evaluate("(e) => e.nextElementSibling.textContent")

            return {"committed": value("Committed (next) offset"), "first": value("First offset"),
                    "segments": box.locator("table").first.locator("tbody tr").count(),
                    "readers": box.locator("p.empty").last.inner_text().strip()}
