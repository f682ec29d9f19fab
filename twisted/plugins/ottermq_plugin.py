"""twistd plugin: ``twistd ottermq`` (options and makeService live in otter_tx.service.tap)."""
from twisted.application.service import ServiceMaker

ottermq = ServiceMaker(
    "otter_tx AMQP broker", "otter_tx.service.tap", "A RabbitMQ-compatible AMQP 0-9-1 broker.", "ottermq"
)
