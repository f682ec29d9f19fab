"""
Interop tests for global parameters and runtime parameters over real HTTP,
against the in-process broker or RabbitMQ (``OTTER_TEST_MGMT_URL``).  Names
carry a unique suffix (``ep-...``) and are deleted again.
"""

import uuid
from urllib.parse import quote

from twisted.internet.defer import inlineCallbacks

from otter_tx.test.interop.test_interop_http import ManagementHTTPCase


class ParameterTests(ManagementHTTPCase):
    """Shapes and statuses of /api/global-parameters and /api/parameters."""

    @inlineCallbacks
    def test_globalParameter(self):
        """PUT 201 then 204, GET {"value","name"}, listed, DELETE 204 then 404."""
        name = "ep-g-" + uuid.uuid4().hex[:8]
        path = "/api/global-parameters/" + name
        self.cleanups.append(path)
        created = yield self.call("PUT", path, {"value": {"a": 1}})
        replaced = yield self.call("PUT", path, {"value": {"a": 2}})
        one = yield self.call("GET", path)
        listed = yield self.call("GET", "/api/global-parameters")
        deleted = yield self.call("DELETE", path)
        missing = yield self.call("GET", path)
        self.assertEqual((created[0], replaced[0], deleted[0], missing[0]), (201, 204, 204, 404))
        self.assertEqual(one[:2], (200, {"value": {"a": 2}, "name": name}))
        self.assertIn({"name": name, "value": {"a": 2}}, listed[1])

    @inlineCallbacks
    def test_unknownComponent(self):
        """A parameter of a component no plugin defines is 400 component not found; reads find nothing."""
        name = "ep-p-" + uuid.uuid4().hex[:8]
        put = yield self.call("PUT", "/api/parameters/ep-nothing/%2F/" + quote(name), {"value": 1})
        listed = yield self.call("GET", "/api/parameters/ep-nothing")
        one = yield self.call("GET", "/api/parameters/ep-nothing/%2F/" + quote(name))
        self.assertEqual(put[:2], (400, {"error": "bad_request",
                                         "reason": "Validation failed\n\ncomponent ep-nothing not found\n"}))
        self.assertEqual((listed[:2], one[0]), ((200, []), 404))


class OperatorPolicyTests(ManagementHTTPCase):
    """Shapes and statuses of /api/operator-policies."""

    @inlineCallbacks
    def test_createReadDelete(self):
        """PUT 201 then 204, GET the policy shape, a dead-letter key is 400, DELETE 204 then 404."""
        name = "ep-op-" + uuid.uuid4().hex[:8]
        path = "/api/operator-policies/%2F/" + name
        self.cleanups.append(path)
        body = {"pattern": "^ep-op-none$", "definition": {"max-length": 10}, "apply-to": "queues", "priority": 0}
        created = yield self.call("PUT", path, body)
        replaced = yield self.call("PUT", path, body)
        one = yield self.call("GET", path)
        bad = yield self.call("PUT", path, dict(body, definition={"dead-letter-exchange": "x"}))
        deleted = yield self.call("DELETE", path)
        missing = yield self.call("GET", path)
        self.assertEqual((created[0], replaced[0], deleted[0], missing[0]), (201, 204, 204, 404))
        self.assertEqual(one[:2], (200, {"vhost": "/", "name": name, "pattern": "^ep-op-none$",
                                         "apply-to": "queues", "definition": {"max-length": 10}, "priority": 0}))
        self.assertEqual(bad[:2], (400, {"error": "bad_request", "reason":
                                         'Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] '
                                         'are not recognised policy settings\n'}))
