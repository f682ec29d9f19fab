"""
otter_tx's tests, in three layers: ``unit`` (deterministic, no client
library needed), ``interop`` (real clients, also run against RabbitMQ) and
``e2e`` (the broker as a whole on the real reactor: restarts, SIGKILL,
processes).
"""
