"""
The admin HTML page (``GET /``): plain server-rendered tables of queues,
exchanges, connections and policies.  No JavaScript, no framework; every
value is HTML-escaped.  Changes are made through the JSON API (or
rabbitmqadmin), not from this page.
"""

from html import escape

from otter_tx import __version__
from otter_tx.web import _format as fmt

_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1.5em}"
    "th,td{border:1px solid #bbb;padding:.25em .6em;text-align:left}th{background:#eee}"
)


def _table(title, headers, rows):
    out = ["<h2>%s</h2>" % escape(title)]
    if not rows:
        out.append("<p>(none)</p>")
        return "".join(out)
    out.append("<table><tr>%s</tr>" % "".join("<th>%s</th>" % escape(h) for h in headers))
    for row in rows:
        out.append("<tr>%s</tr>" % "".join("<td>%s</td>" % escape(str(v)) for v in row))
    out.append("</table>")
    return "".join(out)


def renderIndex(vhosts, connections):
    """
    The page (str) showing the objects of ``vhosts`` (list of VHost) and
    ``connections`` (the connections the user may see, as
    ``/api/connections`` lists them).
    """
    queues = [q for vh in vhosts for _, q in sorted(vh.queues.items())]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>otter_tx management</title>",
        "<style>%s</style></head><body>" % _STYLE,
        "<h1>otter_tx %s</h1>" % escape(__version__),
        "<p>Management HTTP API at <code>/api</code> (RabbitMQ 3.10 compatible); "
        "Prometheus metrics at <code>/metrics</code>.</p>",
    ]
    parts.append(_table(
        "Queues",
        ["vhost", "name", "durable", "auto-delete", "exclusive", "ready", "unacked", "consumers", "policy",
         "arguments"],
        [(q.vhost.name, q.name, q.durable, q.autoDelete, q.exclusive, q.readyCount, q.unackedCount,
          len(q.consumers), q.policy.name if q.policy else "", fmt.jsonable(q.arguments) or "")
         for q in queues],
    ))
    parts.append(_table(
        "Exchanges",
        ["vhost", "name", "type", "durable", "auto-delete", "internal", "delayed messages"],
        [(vh.name, ex.name or "(AMQP default)", ex.type, ex.durable, ex.autoDelete, ex.internal,
          ex.held if ex.delayed else "")
         for vh in vhosts for _, ex in sorted(vh.exchanges.items())],
    ))
    parts.append(_table(
        "Connections",
        ["name", "user", "vhost", "channels", "client"],
        [(fmt.connectionName(c), c.user.name if c.user else "", c.vhost.name if c.vhost else "",
          len(c.channels), fmt.jsonable((c.clientProperties or {}).get("product", "")))
         for c in connections],
    ))
    parts.append(_table(
        "Policies",
        ["vhost", "name", "pattern", "apply-to", "priority", "definition"],
        [(p.vhost, p.name, p.pattern, p.applyTo, p.priority, p.definition)
         for vh in vhosts for p in sorted(vh.policies.values(), key=lambda p: p.name)],
    ))
    parts.append("</body></html>")
    return "".join(parts)
