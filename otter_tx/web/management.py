"""
The management HTTP app (Klein).  A placeholder until the management issue:
``GET /api/overview`` and ``GET /api/queues`` in RabbitMQ's JSON shape.
"""

import json

from klein import Klein

from otter_tx import __version__


class ManagementApp:
    """
    Klein app over a broker; ``app`` is a class attribute, state is per instance.
    """

    app = Klein()

    def __init__(self, broker, clock):
        self.broker = broker
        self.clock = clock

    @app.route("/api/overview", methods=["GET"])
    def overview(self, request):
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {
                "product_name": "otter_tx",
                "product_version": __version__,
                "management_version": __version__,
                "object_totals": {
                    "connections": len(self.broker.connections),
                    "queues": sum(len(v.queues) for v in self.broker.vhosts.values()),
                    "exchanges": sum(len(v.exchanges) for v in self.broker.vhosts.values()),
                },
            }
        )

    @app.route("/api/queues", methods=["GET"])
    def queues(self, request):
        request.setHeader(b"content-type", b"application/json")
        out = []
        for vh in self.broker.vhosts.values():
            for q in vh.queues.values():
                out.append(
                    {
                        "name": q.name,
                        "vhost": vh.name,
                        "durable": q.durable,
                        "auto_delete": q.autoDelete,
                        "exclusive": q.exclusive,
                        "messages": q.readyCount + q.unackedCount,
                        "messages_ready": q.readyCount,
                        "messages_unacknowledged": q.unackedCount,
                        "consumers": q.consumerCount,
                    }
                )
        return json.dumps(out)
