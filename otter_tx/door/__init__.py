"""
The AMQP door: the Twisted glue between sockets and the broker core.

- :mod:`otter_tx.door.protocol`: ``AMQPServerProtocol``/``AMQPServerFactory``, transport bytes into
  the wire engine (:mod:`otter_tx.amqp.engine`), engine events to the channel doors, outcomes back
  as frames; back-pressure, fairness, write batching, timers on the injected clock.
- :mod:`otter_tx.door.channel`: ``Channel``, the door of one open channel onto its
  :class:`~otter_tx.broker.session.Session`.
- :mod:`otter_tx.door.tls`: the ``ottertls:`` endpoint (TLS that can require client certificates).

The HTTP door is :mod:`otter_tx.web.door`.  See docs/architecture.md.
"""
