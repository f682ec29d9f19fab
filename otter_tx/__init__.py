"""otter_tx: a RabbitMQ-compatible AMQP 0-9-1 message broker on Twisted."""
__version__ = "0.1.0"
