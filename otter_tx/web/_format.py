"""
Broker objects rendered in the JSON shapes of RabbitMQ 3.10's management
API (``rabbit_mgmt_format``; ../shared/reference/rabbitmq-semantics.md
section 8.3).  Plain functions of broker state: no HTTP here.

Fields RabbitMQ fills from its Erlang runtime (``memory``, ``reductions``,
``garbage_collection``) or from its rate sampler (``*_details``) are not
invented; rates are reported as ``{"rate": 0.0}`` where exporters require
the key.
"""

import base64
import hashlib
from decimal import Decimal
from urllib.parse import quote

from twisted.internet.interfaces import ISSLTransport

from otter_tx.amqp.codec import ByteArray, TaggedFloat
from otter_tx.broker.queue import Queue

#: the value of ``node`` everywhere (otter_tx is a single node)
NODE = "otter_tx@localhost"


def jsonable(v):
    """
    An AMQP field value (codec types, bytes, Decimal, nested tables and
    arrays) as a JSON-serialisable value, as RabbitMQ renders field tables:
    integers and timestamps as numbers, byte strings as text.
    """
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, (float, TaggedFloat)):
        return float(v)
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (bytes, bytearray, ByteArray)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return str(v)


def rate():
    """A ``*_details`` object (no rate sampling in otter_tx)."""
    return {"rate": 0.0}


def connectionName(conn):
    """
    RabbitMQ's connection name ``"PEERHOST:PEERPORT -> HOST:PORT"``.
    """
    peer = conn.peer
    host = None
    transport = getattr(conn, "transport", None)
    if transport is not None:
        try:
            host = transport.getHost()
        except Exception:
            host = None
    left = "%s:%s" % (getattr(peer, "host", "?"), getattr(peer, "port", 0))
    right = "%s:%s" % (getattr(host, "host", "?"), getattr(host, "port", 0))
    return "%s -> %s" % (left, right)


def channelName(ch):
    """``"<connection name> (N)"``."""
    return "%s (%d)" % (connectionName(ch.connection), ch.number)


def channelDetails(ch):
    """The ``channel_details`` object of a consumer."""
    conn = ch.connection
    return {
        "name": channelName(ch),
        "number": ch.number,
        "connection_name": connectionName(conn),
        "peer_host": getattr(conn.peer, "host", None),
        "peer_port": getattr(conn.peer, "port", None),
        "user": conn.user.name if conn.user is not None else None,
        "node": NODE,
    }


def consumerDict(q, c):
    """One entry of ``consumer_details`` / ``GET /api/consumers``."""
    active = True
    if q.singleActive:
        active = bool(q.consumers) and q.consumers[0] is c
    return {
        "consumer_tag": c.tag,
        "ack_required": not c.noAck,
        "exclusive": c.exclusive,
        "prefetch_count": c.prefetch,
        "active": active,
        "activity_status": ("single_active" if active else "waiting") if q.singleActive else "up",
        "arguments": jsonable(c.arguments or {}),
        "channel_details": channelDetails(c.channel),
        "queue": {"name": q.name, "vhost": q.vhost.name},
    }


def unackedBytes(broker):
    """``{queue: body bytes delivered and not yet acknowledged}`` over every channel."""
    out = {}
    for conn in list(broker.connections):
        for ch in list(conn.channels.values()):
            for rec in list(getattr(ch, "unacked", {}).values()):
                q, entry = rec[0], rec[1]
                out[q] = out.get(q, 0) + entry.message.size
    return out


def queueDict(q, unacked=None, detail=False):
    """
    A queue as ``GET /api/queues/{vhost}/{name}`` shows it.  ``unacked``
    is :func:`unackedBytes` (computed once per request).
    """
    ready = q.readyCount
    una = q.unackedCount
    ubytes = (unacked or {}).get(q, 0)
    head = None
    for entry in q.readyEntries():
        ts = entry.message.props.get("timestamp")
        head = int(ts) if ts is not None else None
        break
    policy = q.policy
    sac = None
    if q.singleActive and q.consumers:
        sac = q.consumers[0].tag
    d = {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": q.autoDelete,
        "exclusive": q.exclusive,
        "arguments": jsonable(q.arguments),
        "node": NODE,
        "type": q.queueType,
        "state": "running",
        "policy": policy.name if policy is not None else None,
        "operator_policy": q.operatorPolicy.name if q.operatorPolicy is not None else None,
        "effective_policy_definition": dict(q.effectiveDefinition),
        "consumers": len(q.consumers),
        "consumer_capacity": 1.0 if q.consumers else 0,
        "consumer_utilisation": 1.0 if q.consumers else 0,
        "exclusive_consumer_tag": q.exclusiveConsumer.tag if q.exclusiveConsumer is not None else None,
        "single_active_consumer_tag": sac,
        "messages": ready + una,
        "messages_details": rate(),
        "messages_ready": ready,
        "messages_ready_details": rate(),
        "messages_unacknowledged": una,
        "messages_unacknowledged_details": rate(),
        "messages_ram": ready - q.pagedCount + una,
        "messages_ready_ram": ready - q.pagedCount,
        "messages_unacknowledged_ram": una,
        "messages_paged_out": q.pagedCount,
        "message_bytes": q.readyBytes + ubytes,
        "message_bytes_ready": q.readyBytes,
        "message_bytes_unacknowledged": ubytes,
        "message_bytes_ram": q.readyBytes - q.pagedBytes + ubytes,
        "message_bytes_paged_out": q.pagedBytes,
        "head_message_timestamp": head,
        "message_stats": {
            "publish": q.publishedCount,
            "publish_details": rate(),
            "deliver_get": q.deliveredCount,
            "deliver_get_details": rate(),
        },
    }
    if q.quorum:
        # RabbitMQ 3.10's quorum keys; one node: it leads, the only member
        # (replication needs a cluster; docs/quorum.md)
        d["leader"] = NODE
        d["members"] = [NODE]
        d["online"] = [NODE]
        # at-least-once dead letters waiting for a queue to take them
        d["messages_dlx"] = len(q.dlxHeld or ())
        d["message_bytes_dlx"] = q.dlxHeldBytes
    if detail:
        d["messages_persistent"], d["message_bytes_persistent"] = q.readyPersistent()
        d["consumer_details"] = [consumerDict(q, c) for c in q.consumers]
        d["deliveries"] = []
        d["incoming"] = []
    return d


def exchangeDict(ex):
    """An exchange as ``GET /api/exchanges/{vhost}/{name}`` shows it."""
    d = {
        "name": ex.name,
        "vhost": ex.vhost.name,
        "type": ex.type,
        "durable": ex.durable,
        "auto_delete": ex.autoDelete,
        "internal": ex.internal,
        "arguments": jsonable(ex.arguments),
        "user_who_performed_action": "rmq-internal" if ex.name == "" or ex.name.startswith("amq.") else "",
        "message_stats": {
            "publish_in": ex.publishIn,
            "publish_in_details": rate(),
            "publish_out": ex.publishOut,
            "publish_out_details": rate(),
        },
    }
    if ex.delayed:
        d["messages_delayed"] = ex.held
    return d


def propertiesKey(routingKey, arguments):
    """
    RabbitMQ's binding ``properties_key`` (``rabbit_mgmt_format:
    pack_binding_props``): ``~`` for an empty key without arguments, else
    the routing key percent-encoded (``~`` as ``%7E``), followed by
    ``~<hash>`` when there are arguments.  The hash is otter_tx's own (a
    stable digest of the arguments); RabbitMQ's differs, so clients must
    read it from a listing, as rabbitmqadmin does.
    """
    if not routingKey and not arguments:
        return "~"
    key = quote(routingKey, safe="").replace("~", "%7E")
    if arguments:
        digest = hashlib.md5(repr(sorted((k, repr(v)) for k, v in arguments.items())).encode()).digest()
        key += "~" + base64.urlsafe_b64encode(digest).decode().rstrip("=")
    return key


def bindingDict(vhostName, source, dest, routingKey, arguments):
    """A binding as ``GET /api/bindings`` shows it."""
    return {
        "source": source,
        "vhost": vhostName,
        "destination": dest.name,
        "destination_type": "queue" if isinstance(dest, Queue) else "exchange",
        "routing_key": routingKey,
        "arguments": jsonable(arguments or {}),
        "properties_key": propertiesKey(routingKey, arguments),
    }


def vhostBindings(vh, includeDefault=True):
    """
    Every binding of vhost ``vh``: the implicit default-exchange binding of
    each queue first (``source: ""``), then the declared ones.
    """
    out = []
    if includeDefault:
        for q in vh.queues.values():
            out.append(bindingDict(vh.name, "", q, q.name, {}))
    for ex in vh.exchanges.values():
        if ex.name == "":
            continue
        for dest, key, args in ex.routing.bindings():
            out.append(bindingDict(vh.name, ex.name, dest, key, args))
    return out


def passwordHash(user):
    """
    RabbitMQ's ``password_hash``: base64 of the 4-byte salt followed by
    DIGEST(salt + password); ``""`` for a user without a password.
    """
    return user.exportHash()


def userDict(user, limits=None):
    """A user as ``GET /api/users/{name}`` shows it (``limits``: its user limits, a dict)."""
    return {
        "name": user.name,
        "password_hash": passwordHash(user),
        "hashing_algorithm": user.hashingAlgorithm,
        "tags": list(user.tags),
        "limits": dict(limits or {}),
    }


def connectionDict(conn):
    """A connection as ``GET /api/connections/{name}`` shows it."""
    host = None
    transport = getattr(conn, "transport", None)
    if transport is not None:
        try:
            host = transport.getHost()
        except Exception:
            host = None
    return {
        "name": connectionName(conn),
        "node": NODE,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": conn.user.name if conn.user is not None else None,
        "user_who_performed_action": conn.user.name if conn.user is not None else None,
        "state": getattr(conn, "flowState", "running"),
        "protocol": "AMQP 0-9-1",
        "type": "network",
        "auth_mechanism": "PLAIN",
        "channels": len(conn.channels),
        "channel_max": getattr(conn, "channelMax", 0),
        "frame_max": getattr(conn, "frameMax", 0),
        "timeout": getattr(conn, "heartbeat", 0),
        "host": getattr(host, "host", None),
        "port": getattr(host, "port", None),
        "peer_host": getattr(conn.peer, "host", None),
        "peer_port": getattr(conn.peer, "port", None),
        "ssl": ISSLTransport.providedBy(transport),
        "client_properties": jsonable(conn.clientProperties or {}),
        "connected_at": int(conn.connectedAt * 1000),
        "recv_oct": conn.bytesIn,
        "recv_oct_details": rate(),
        "send_oct": conn.bytesOut,
        "send_oct_details": rate(),
        "send_pend": 0,
    }


def channelDict(ch):
    """A channel as ``GET /api/channels`` shows it."""
    conn = ch.connection
    return {
        "name": channelName(ch),
        "number": ch.number,
        "node": NODE,
        "connection_details": {
            "name": connectionName(conn),
            "peer_host": getattr(conn.peer, "host", None),
            "peer_port": getattr(conn.peer, "port", None),
        },
        "user": conn.user.name if conn.user is not None else None,
        "user_who_performed_action": conn.user.name if conn.user is not None else None,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "state": "running",
        "confirm": bool(getattr(ch, "confirmMode", False)),
        "transactional": bool(getattr(ch, "txMode", False)),
        "prefetch_count": getattr(ch, "prefetchCount", 0),
        "global_prefetch_count": getattr(ch, "globalPrefetch", 0),
        "consumer_count": len(getattr(ch, "consumers", {})),
        "messages_unacknowledged": getattr(ch, "unackedCount", 0),
        "messages_unconfirmed": 0,
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
        "pending_raft_commands": 0,
    }
