"""
A quorum queue's members on the admin web app's queue page, in chromium
(test_webapp's :func:`browser`), against three in-process nodes
(test_inprocess.ClusterCase with their management apps): the leader,
members and in-sync ones are shown; an administrator deletes a member and
adds it back with the page's buttons.  Skips as test_webapp does.
"""

import os

from twisted.internet.defer import inlineCallbacks

from otter_tx.cluster import metadata as md
from otter_tx.test.cluster.test_inprocess import ClusterCase
from otter_tx.test.e2e.test_webapp import apiCall, browser, login, skipUnlessBrowser
from otter_tx.test.interop.support import waitOnReactor

#: set to a directory to keep the page's screenshot (docs/images/queue-members.png is made so)
SHOT_DIR = os.environ.get("OTTER_SCREENSHOTS")


class QueueMembersPageTests(ClusterCase):

    management = True
    timeout = 120

    def setUp(self):
        skipUnlessBrowser()
        return ClusterCase.setUp(self)

    def record(self):
        return self.meta.data.get(md.queueKey("/", "orders"))

    @inlineCallbacks
    def test_deleteAndAddMember(self):
        base = "http://127.0.0.1:%d" % (self.fixtures[0].managementPort,)
        yield self.inThread(apiCall, base, "PUT", "/api/queues/%2F/orders",
                            {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        yield waitOnReactor(lambda: len(self.record()["online"]) == 3, 5)

        def run():
            with browser() as page:
                login(page, base + "/")
                page.goto(base + "/#/queues/%2F/orders")
                page.wait_for_selector("#members:not([hidden]) [data-member-leader]")
                text = page.locator("#members").inner_text()
                assert "n1" in text and "n2" in text and "n3" in text, text
                page.locator("button[data-delete-member=n3]").click()
                page.wait_for_function("() => !document.querySelector('button[data-delete-member=n3]')")
                page.wait_for_function("() => [...document.querySelectorAll('#members select option')]"
                                       ".some((o) => o.value === 'n3')")
                page.locator("#members select").select_option("n3")
                page.locator("#members button[type=submit]").click()
                page.wait_for_selector("button[data-delete-member=n3]")
                # the auto-refresh shows it in sync once it joined
                page.wait_for_function("() => /Online \\(in sync\\)\\s*n1, n\\d, n\\d/.test("
                                       "document.querySelector('#members').innerText)")
                if SHOT_DIR:
                    page.locator("#members").scroll_into_view_if_needed()
                    page.screenshot(path=os.path.join(SHOT_DIR, "queue-members.png"), full_page=False)
                return page.locator("#members").inner_text()

        text = yield self.inThread(run)
        self.assertEqual(sorted(self.record()["members"]), ["n1", "n2", "n3"])
        self.assertIn("Leader", text)

    @inlineCallbacks
    def test_replicatedStreamMembers(self):
        """
        A replicated stream's page shows its leader, members and in-sync ones; an administrator
        deletes a follower's member and adds it back (rabbitmq-streams delete_replica / add_replica).
        """
        base = "http://127.0.0.1:%d" % (self.fixtures[1].managementPort,)
        yield self.inThread(apiCall, base, "PUT", "/api/queues/%2F/events",
                            {"durable": True, "arguments": {"x-queue-type": "stream"}})
        key = md.queueKey("/", "events")
        yield waitOnReactor(lambda: len((self.meta.data.get(key) or {}).get("online") or ()) == 3, 5)
        follower = [m for m in self.meta.data[key]["members"] if m != self.meta.data[key]["node"]][-1]

        def run():
            with browser() as page:
                login(page, base + "/")
                page.goto(base + "/#/queues/%2F/events")
                page.wait_for_selector("#members:not([hidden]) [data-member-leader]")
                page.wait_for_function("() => /Online \\(in sync\\)\\s*n\\d, n\\d, n\\d/.test("
                                       "document.querySelector('#members').innerText)")
                first = page.locator("#members").inner_text()
                page.locator("button[data-delete-member=%s]" % follower).click()
                page.wait_for_function("() => !document.querySelector('button[data-delete-member=%s]')" % follower)
                page.wait_for_function("() => [...document.querySelectorAll('#members select option')]"
                                       ".some((o) => o.value === '%s')" % follower)
                page.locator("#members select").select_option(follower)
                page.locator("#members button[type=submit]").click()
                page.wait_for_selector("button[data-delete-member=%s]" % follower)
                page.wait_for_function("() => /Online \\(in sync\\)\\s*n\\d, n\\d, n\\d/.test("
                                       "document.querySelector('#members').innerText)")
                if SHOT_DIR:
                    page.locator("#members").scroll_into_view_if_needed()
                    page.screenshot(path=os.path.join(SHOT_DIR, "stream-members.png"), full_page=False)
                return first

        text = yield self.inThread(run)
        self.assertIn("Leader", text)
        for n in ("n1", "n2", "n3"):
            self.assertIn(n, text)
        self.assertEqual(sorted(self.meta.data[key]["members"]), ["n1", "n2", "n3"])
        self.assertIn(follower, self.meta.data[key]["online"])
