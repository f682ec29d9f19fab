"""The broker core: vhosts, exchanges, queues, TTL/expiry, dead-lettering, policies, durability journal."""
