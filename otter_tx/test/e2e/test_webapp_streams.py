"""
The admin web app shows stream protocol connections, in chromium (as
test_webapp): the connections page lists a raw stream client's connection
with protocol ``stream``; its page shows its publisher and its consumer
(rabbitmq_stream_management's lists) instead of channels.  With
``OTTER_SCREENSHOTS=dir`` the pages are saved there.
"""

import os

from twisted.internet import defer, reactor, threads
from twisted.trial.unittest import TestCase

from otter_tx.service.assembly import OtterService
from otter_tx.stream import wire
from otter_tx.test.e2e.test_webapp import browser, login, skipUnlessBrowser

SHOT_DIR = os.environ.get("OTTER_SCREENSHOTS")


class StreamConnectionPagesTests(TestCase):
    timeout = 120

    def setUp(self):
        skipUnlessBrowser()

    @defer.inlineCallbacks
    def test_connectionPages(self):
        svc = OtterService(amqp=["tcp:0:interface=127.0.0.1"], management=["tcp:0:interface=127.0.0.1"],
                           stream=["tcp:0:interface=127.0.0.1"], reactor=reactor,
                           dataDir=os.path.abspath(self.mktemp()))
        svc.startService()
        self.addCleanup(svc.stopService)
        [mport] = yield svc.listeningPorts(svc.managementServices)
        [sport] = yield svc.listeningPorts(svc.streamServices)
        url = "http://127.0.0.1:%d/" % (mport.getHost().port,)
        client = yield threads.deferToThread(self.streamClient, sport.getHost().port)
        self.addCleanup(client.close)
        seen = yield threads.deferToThread(self.pages, url)
        self.assertEqual(seen["protocol"], "stream")
        self.assertEqual(seen["publishers"], [["1", "web-s", "ref1", "2", "2", "0"]])
        self.assertEqual(seen["consumers"][0][:2], ["3", "web-s"])
        self.assertIn("name=cons1", seen["consumers"][0][2])
        self.assertEqual(seen["consumers"][0][4], "2")
        self.assertFalse(seen["channelsShown"])

    def streamClient(self, port):
        """(In a thread.) A raw client with stream web-s, publisher 1 (ref1, 2 messages), subscription 3 (cons1)."""
        from otter_tx.test.interop.stream_raw import RawStreamClient

        c = RawStreamClient("127.0.0.1", port)
        assert c.handshake() == wire.OK
        assert c.create("web-s") == wire.OK
        assert c.declarePublisher(1, "ref1", "web-s") == wire.OK
        c.publish(1, [(1, b"hello"), (2, b"world")])
        assert c.confirms() == (1, [1, 2])
        assert c.subscribe(3, "web-s", props={"name": "cons1"}) == wire.OK
        c.deliver()
        return c

    def pages(self, url):
        seen = {}
        with browser() as page:
            login(page, url)
            page.click("nav a[data-nav=connections]")
            row = page.locator("main table tbody tr").first
            row.wait_for()
            seen["protocol"] = row.locator("td").nth(4).inner_text().strip()
            if SHOT_DIR:
                page.screenshot(path=os.path.join(SHOT_DIR, "stream-connections.png"))
            row.locator("a").first.click()
            page.locator("main h2", has_text="Publishers").wait_for()
            page.locator("main table", has=page.locator("th", has_text="Reference")).wait_for()

            def rows(header):
                t = page.locator("main table", has=page.locator("th", has_text=header))
                return [[td.inner_text().strip() for td in r.locator("td").all()]
                        for r in t.locator("tbody tr").all()]

            seen["publishers"] = rows("Reference")
            seen["consumers"] = rows("Offset lag")
            seen["channelsShown"] = page.locator("main h2", has_text="Channels").is_visible()
            if SHOT_DIR:
                page.screenshot(path=os.path.join(SHOT_DIR, "stream-connection.png"), full_page=True)
        return seen
