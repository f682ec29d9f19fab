"""
Unit tests: deterministic, no real sockets between client and broker and no
child processes.  The wire engine on byte vectors without Twisted, the
Session and the broker core on a ``task.Clock`` (publish, access, routing,
dead-lettering, queues, expiry, paging, alarms), the store contract, the
management HTTP API on in-memory requests, option parsing.  These modules
import without any AMQP client library installed (``test_layers`` checks it).
"""
