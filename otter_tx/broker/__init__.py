"""
The broker core: the front door for clients (Session, the publish pipeline, access control), the
declared seams (interfaces), vhosts, exchanges, queues, TTL/expiry, dead-lettering, policies and the
durability journal.  Time comes from an injected clock; never the global reactor.
"""
