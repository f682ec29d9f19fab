"""
Broker objects rendered in the JSON shapes of RabbitMQ 3.10's management
API (``rabbit_mgmt_format``; ../shared/reference/rabbitmq-semantics.md
section 8.3).  Plain functions of broker state: no HTTP here.

Fields RabbitMQ fills from its Erlang runtime (``memory``, ``reductions``,
``garbage_collection``) are not invented.  ``message_stats`` and every
``*_details`` come from the broker's sampler (:mod:`otter_tx.broker.stats`)
through a :class:`RateView`, which carries the request's ranges
(``msg_rates_age``/``_incr``, ``lengths_age``/``_incr``,
``data_rates_age``/``_incr``).
"""

import base64
import hashlib
from urllib.parse import quote

from otter_tx.amqp.codec import jsonable  # noqa: F401 (re-exported: the JSON shapes use it)
from otter_tx.broker import stats
from otter_tx.broker.exchange import destinationKind

#: the value of ``node`` everywhere (otter_tx is a single node)
NODE = "otter_tx@localhost"


def nodeName(broker):
    """This node's name: ``--node-name`` in a cluster, else :data:`NODE`."""
    return getattr(broker, "nodeName", NODE)


def rate():
    """A ``*_details`` object of a figure otter_tx does not sample: ``{"rate": 0.0}``."""
    return {"rate": 0.0}


class RateView:
    """
    How one request sees the rates: the broker's
    :class:`~otter_tx.broker.stats.Sampler`, the time of the request, and
    the requested ranges (:class:`~otter_tx.broker.stats.Range` or None):
    ``msg`` for ``message_stats`` and churn, ``lengths`` for queue lengths,
    ``data`` for ``recv_oct``/``send_oct``.
    """

    def __init__(self, sampler, msg=None, lengths=None, data=None):
        self.sampler = sampler
        self.nowMs = sampler.nowMs()
        self.msg = msg
        self.lengths = lengths
        self.data = data

    def stats(self, kind, obj, keys, values, rng, ceil=False):
        """``{key: value, key_details: {...}}`` of ``obj``'s series ``kind``."""
        sampler = self.sampler
        return stats.statsDict(keys, values, sampler.series(kind, obj), self.nowMs,
                           sampler.intervalMs, rng, ceil)

    def messageStats(self, kind, obj, keys, values):
        """A ``message_stats`` object (``msg_rates`` range)."""
        return self.stats(kind, obj, keys, values, self.msg)

    def lengthStats(self, kind, obj, values):
        """``messages``, ``messages_ready``, ``messages_unacknowledged`` with details (``lengths``)."""
        return self.stats(kind, obj, stats.LENGTH_KEYS, values, self.lengths, ceil=True)

    def dataStats(self, kind, obj, values):
        """``recv_oct``/``send_oct`` with details (``data_rates`` range)."""
        return self.stats(kind, obj, stats.DATA_KEYS, values, self.data)


def defaultView(broker):
    """A :class:`RateView` of ``broker``'s sampler without ranges."""
    return RateView(broker.sampler)


def connectionName(conn):
    """
    RabbitMQ's connection name ``"PEERHOST:PEERPORT -> HOST:PORT"``
    (``IConnectionInfo.name``).
    """
    return conn.name


def channelName(ch):
    """``"<connection name> (N)"`` of a Channel."""
    return "%s (%d)" % (connectionName(ch.connection), ch.number)


def channelDetails(session):
    """The ``channel_details`` object of a consumer, from its Session."""
    conn = session.client
    return {
        "name": "%s (%d)" % (connectionName(conn), session.number),
        "number": session.number,
        "connection_name": connectionName(conn),
        "peer_host": getattr(conn.peer, "host", None),
        "peer_port": getattr(conn.peer, "port", None),
        "user": conn.user.name if conn.user is not None else None,
        "node": nodeName(session.broker),
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
        "channel_details": channelDetails(c.session),
        "queue": {"name": q.name, "vhost": q.vhost.name},
    }


def streamConnections(broker, owner=None, vhost=None):
    """
    The open stream protocol connections of this node, by name, of user
    ``owner`` (a name; None: anyone's) on vhost ``vhost`` (a name; None:
    any); only those that opened (logged in to a vhost).
    """
    conns = getattr(getattr(broker, "streamCounters", None), "connections", ())
    return sorted((c for c in conns
                   if c.vhost is not None and not c.closed
                   and (owner is None or (c.user is not None and c.user.name == owner))
                   and (vhost is None or c.vhost == vhost)), key=lambda c: c.name)


def streamSubscriptions(broker, vhost=None, stream=None):
    """
    ``[(connection, subscription)]`` of the stream protocol door's open
    connections (:mod:`otter_tx.door.stream`), on vhost ``vhost`` and stream
    ``stream`` (names; None: any).
    """
    out = []
    for conn in streamConnections(broker, vhost=vhost):
        for _, sub in sorted(conn.subscriptions.items()):
            if stream is None or sub.stream == stream:
                out.append((conn, sub))
    return out


def streamSubscriptionsByStream(broker):
    """
    This node's stream protocol subscriptions as consumers
    (:func:`streamSubscriptionDict`), by ``"vhost\\x00stream"``: what a
    cluster node sends the others every second (``ClusterNode._sendFigures``).
    """
    out = {}
    for conn, sub in streamSubscriptions(broker):
        out.setdefault("%s\x00%s" % (conn.vhost, sub.stream), []).append(streamSubscriptionDict(conn, sub))
    return out


def peerStreamSubscriptions(broker, vhost, stream, skip=None):
    """
    The stream protocol subscriptions to ``stream`` (in vhost ``vhost``) of
    the other nodes of a cluster, as consumers (list of dicts), from the
    figures they send every second (``ClusterNode.figures``); node ``skip``
    left out (a stream's home node counts its own in its queue's
    ``consumers``); ``[]`` without a cluster.
    """
    cluster = getattr(broker, "cluster", None)
    if cluster is None:
        return []
    key = "%s\x00%s" % (vhost, stream)
    out = []
    for peer, f in sorted(list(getattr(cluster, "figures", {}).items())):
        if peer != skip:
            out.extend((f.get("streamSubscriptions") or {}).get(key) or ())
    return out


def streamSubscriptionDict(conn, sub):
    """
    A stream protocol subscription as RabbitMQ 3.10 lists it among the
    consumers (``GET /api/consumers``, a stream queue's ``consumer_details``):
    tag ``stream.subid-<id>``, its properties as ``arguments``, no ack, no
    prefetch, and ``channel_details`` with channel 0 and an empty name.
    """
    sac = sub.group is not None
    return {
        "consumer_tag": "stream.subid-%d" % (sub.sid,),
        "ack_required": False,
        "exclusive": False,
        "prefetch_count": 0,
        "active": bool(sub.active),
        "activity_status": ("single_active" if sub.active else "waiting") if sac else "up",
        "arguments": jsonable(sub.props or {}),
        "channel_details": {
            "name": "",
            "number": 0,
            "connection_name": conn.name,
            "peer_host": getattr(conn.peer, "host", None),
            "peer_port": getattr(conn.peer, "port", None),
            "user": conn.user.name if conn.user is not None else None,
            "node": nodeName(conn.broker),
        },
        "queue": {"name": sub.stream, "vhost": conn.vhost},
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


def queueDict(q, unacked=None, detail=False, view=None):
    """
    A queue as ``GET /api/queues/{vhost}/{name}`` shows it.  ``unacked``
    is :func:`unackedBytes` (computed once per request); ``view`` a
    :class:`RateView` (default: no ranges).  ``message_stats``: what
    arrived and what left this queue (:data:`~otter_tx.broker.stats.QUEUE_KEYS`).
    """
    if view is None:
        view = defaultView(q.vhost.broker)
    if q.remote:
        return remoteQueueDict(q, detail)
    node = nodeName(q.vhost.broker)
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
    d = _queueRecord(q, node, "running")
    d.update({
        "policy": policy.name if policy is not None else None,
        "operator_policy": q.operatorPolicy.name if q.operatorPolicy is not None else None,
        "effective_policy_definition": dict(q.effectiveDefinition),
        "consumers": len(q.consumers),
        "consumer_capacity": 1.0 if q.consumers else 0,
        "consumer_utilisation": 1.0 if q.consumers else 0,
        "exclusive_consumer_tag": q.exclusiveConsumer.tag if q.exclusiveConsumer is not None else None,
        "single_active_consumer_tag": sac,
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
        "message_stats": view.messageStats("queue", q, stats.QUEUE_KEYS, stats.queueValues(q)),
    })
    d.update(view.lengthStats("queue-lengths", q, (ready + una, ready, una)))
    if q.quorum:
        # RabbitMQ 3.10's quorum keys: one node leads, the only member; in a cluster the
        # replicated queue's members and the in-sync ones (docs/cluster.md)
        replicated = getattr(q.journal, "info", None)
        if replicated is not None:
            d.update(replicated())
        else:
            _quorumMembers(d, node, online=True)
        # at-least-once dead letters waiting for a queue to take them
        d["messages_dlx"] = len(q.heldDeadLetters.messages or ())
        d["message_bytes_dlx"] = q.heldDeadLetters.bytes
    stream = q.stream
    subs = elsewhere = ()
    if stream is not None:
        # the stream protocol's subscriptions are consumers too (as 3.10 counts them)
        subs = streamSubscriptions(q.vhost.broker, q.vhost.name, q.name)
        # (and in a cluster the other nodes' subscriptions, on their replicas)
        elsewhere = peerStreamSubscriptions(q.vhost.broker, q.vhost.name, q.name)
        if subs or elsewhere:
            d["consumers"] += len(subs) + len(elsewhere)
            d["consumer_capacity"] = d["consumer_utilisation"] = 1.0
        # RabbitMQ 3.10's stream keys (one node, the only member; the peer shows
        # ``readers`` {node: 1} with or without consumers and no ``leader``), and
        # otter_tx's own ``stream`` object (docs/management.md, docs/streams.md)
        d["members"] = [NODE]
        d["online"] = [NODE]
        d["readers"] = {NODE: 1}
        rep = stream.replicator
        if rep is not None:
            # a cluster's replicated stream: its members, the in-sync ones, its leader (this node)
            d.update(rep.info())
            d["readers"] = {n: 1 for n in d["online"]}
        d["stream"] = {
            "first_offset": stream.first,
            "last_offset": stream.last,
            "committed_offset": stream.committed,
            "bytes": stream.bytes,
            "max_length_bytes": stream.maxBytes,
            "max_age_seconds": stream.maxAgeSeconds,
            "segment_bytes": stream.log.segmentBytes,
            "segments": [{"first_offset": s["first"], "next_offset": s["next"], "bytes": s["bytes"]}
                         for s in stream.segmentsInfo()],
            "readers": [{"consumer_tag": tag, "offset": offset} for tag, offset in q.readerOffsets()],
        }
    if detail:
        d["messages_persistent"], d["message_bytes_persistent"] = q.ready.persistent()
        # (the consumers of this node's channels: a LinkConsumer stands for a consumer on
        # another node of the cluster, which lists it in its /api/consumers)
        d["consumer_details"] = [consumerDict(q, c) for c in q.consumers if getattr(c, "session", None) is not None]
        d["consumer_details"] += [streamSubscriptionDict(conn, sub) for conn, sub in subs] + list(elsewhere)
        d["deliveries"] = []
        d["incoming"] = []
    return d


def _queueRecord(q, node, state):
    """The fields every queue listing starts with: its declared record, its ``node`` and ``state``."""
    return {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": q.autoDelete,
        "exclusive": q.exclusive,
        "arguments": jsonable(q.arguments),
        "node": node,
        "type": q.queueType,
        "state": state,
    }


def _quorumMembers(d, leader, online, record=None):
    """
    RabbitMQ 3.10's quorum keys for a queue of one member, ``leader``
    (online or not), or those of ``record`` (a replicated quorum queue's
    cluster record: its ``members``, and ``online``, the in-sync ones, but
    not the leader's node while it is down).
    """
    d["leader"] = leader
    if record is not None and len(record.get("members") or ()) > 1:
        d["members"] = list(record["members"])
        d["online"] = [n for n in record.get("online") or () if online or n != leader]
        return
    d["members"] = [leader]
    d["online"] = [leader] if online else []


def _isReplicatedStream(q):
    return getattr(q, "isStream", False) and len((q.record or {}).get("members") or ()) > 1


def remoteQueueDict(q, detail=False):
    """
    A queue whose home is another node of the cluster
    (:class:`~otter_tx.cluster.remote.RemoteQueue`), from its record and the
    figures its home node sends every second: ``node`` is the home node,
    ``state`` ``"down"`` while that node is unreachable, as RabbitMQ 3.10
    lists a durable queue of a stopped node.
    """
    if q.down:
        # only the record's fields, as RabbitMQ 3.10 lists a durable queue of a stopped node
        d = dict(sorted(_queueRecord(q, q.home, "down").items()))
        if q.quorum or _isReplicatedStream(q):
            _quorumMembers(d, q.home, online=False, record=q.record)
        return d
    f = q.figures
    ready = f.get("messages_ready", 0)
    una = f.get("messages_unacknowledged", 0)
    d = _queueRecord(q, q.home, "running")
    d.update({
        "policy": f.get("policy"),
        "operator_policy": f.get("operator_policy"),
        "effective_policy_definition": f.get("effective_policy_definition", {}),
        "consumers": f.get("consumers", 0),
        "messages": ready + una,
        "messages_ready": ready,
        "messages_unacknowledged": una,
        "message_bytes": f.get("message_bytes", 0),
        "message_stats": f.get("message_stats", {}),
    })
    if q.quorum:
        _quorumMembers(d, q.home, online=True, record=q.record)
    elif _isReplicatedStream(q):
        _quorumMembers(d, q.home, online=True, record=q.record)
        d["readers"] = {n: 1 for n in d["online"]}
    if getattr(q, "isStream", False):
        # the home node's consumers count its stream protocol subscriptions; this node's and
        # the other nodes' (on their replicas) are added here
        subs = [streamSubscriptionDict(c, s) for c, s in streamSubscriptions(q.vhost.broker, q.vhost.name, q.name)]
        home = (getattr(q.vhost.broker, "cluster", None) and q.vhost.broker.cluster.figures.get(q.home)) or {}
        homeSubs = (home.get("streamSubscriptions") or {}).get("%s\x00%s" % (q.vhost.name, q.name)) or []
        subs += peerStreamSubscriptions(q.vhost.broker, q.vhost.name, q.name, skip=q.home)
        d["consumers"] += len(subs)
    else:
        subs = homeSubs = []
    if detail:
        # (the home node's AMQP consumers are not sent; its subscriptions and the others' are)
        d["consumer_details"] = homeSubs + subs
        d["deliveries"] = []
        d["incoming"] = []
    return d


def exchangeDict(ex, view):
    """
    An exchange as ``GET /api/exchanges/{vhost}/{name}`` shows it;
    ``message_stats``: ``publish_in``, ``publish_out`` and on an
    x-delayed-message exchange ``delayed`` (messages taken into hold),
    with details as ``view`` (a :class:`RateView`) asks.
    """
    keys = stats.DELAYED_EXCHANGE_KEYS if ex.delayed else stats.EXCHANGE_KEYS
    d = {
        "name": ex.name,
        "vhost": ex.vhost.name,
        "type": ex.type,
        "durable": ex.durable,
        "auto_delete": ex.autoDelete,
        "internal": ex.internal,
        "arguments": jsonable(ex.arguments),
        "user_who_performed_action": "rmq-internal" if ex.name == "" or ex.name.startswith("amq.") else "",
        "message_stats": view.messageStats("exchange", ex, keys, stats.exchangeValues(ex)),
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
        "destination_type": destinationKind(dest),
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
        for q in vh.remoteQueues.values():
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


def connectionDict(conn, view):
    """
    A connection as ``GET /api/connections/{name}`` shows it; ``recv_oct``
    / ``send_oct`` (bytes) with their rates (``data_rates`` range of
    ``view``), ``recv_cnt`` / ``send_cnt`` (socket reads and writes).
    """
    host = conn.local
    d = {
        "name": connectionName(conn),
        "node": nodeName(conn.vhost.broker) if conn.vhost is not None else NODE,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": conn.user.name if conn.user is not None else None,
        "user_who_performed_action": conn.user.name if conn.user is not None else None,
        "state": conn.flowState,
        "protocol": "AMQP 0-9-1",
        "type": "network",
        "auth_mechanism": conn.authMechanism or "PLAIN",
        "channels": len(conn.channels),
        "channel_max": conn.channelMax,
        "frame_max": conn.frameMax,
        "timeout": conn.heartbeat,
        "host": getattr(host, "host", None),
        "port": getattr(host, "port", None),
        "peer_host": getattr(conn.peer, "host", None),
        "peer_port": getattr(conn.peer, "port", None),
        "ssl": conn.ssl,
        "client_properties": jsonable(conn.clientProperties or {}),
        "connected_at": int(conn.connectedAt * 1000),
        "recv_cnt": conn.recvCount,
        "send_cnt": conn.sendCount,
        "send_pend": 0,
    }
    d.update(conn.peerCertificateInfo)
    d.update(view.dataStats("connection", conn, (conn.bytesIn, conn.bytesOut)))
    return d


#: the TLS keys a stream connection lists, None without TLS (as RabbitMQ 3.10's stream plugin)
_STREAM_TLS_KEYS = ("peer_cert_issuer", "peer_cert_subject", "peer_cert_validity",
                    "ssl_cipher", "ssl_hash", "ssl_key_exchange", "ssl_protocol")


def streamConnectionDict(conn, view, detail=False):
    """
    A stream protocol connection (an :class:`otter_tx.door.stream.StreamServerProtocol`)
    as RabbitMQ 3.10's ``GET /api/connections`` and ``/api/stream/connections``
    show it: ``"protocol": "stream"``, the peer properties as
    ``client_properties``, the tuned ``frame_max`` and heartbeat
    (``timeout``), ``channels`` 0, ``recv_oct`` / ``send_oct`` with their
    rates (``data_rates`` range of ``view``), ``recv_cnt`` / ``send_cnt``.
    The TLS keys are null in a list, ``""`` when one connection is shown
    (``detail``), as the 3.10 peer shows them without TLS.
    """
    broker = conn.broker
    user = conn.user.name if conn.user is not None else None
    d = {
        "name": conn.name,
        "node": nodeName(broker),
        "vhost": conn.vhost,
        "user": user,
        "user_who_performed_action": user,
        "state": "running",
        "protocol": "stream",
        "auth_mechanism": conn.mechanism or "PLAIN",
        "channels": 0,
        "channel_max": 0,
        "frame_max": conn.frameMax,
        "timeout": conn.heartbeat,
        "host": getattr(conn.local, "host", None),
        "port": getattr(conn.local, "port", None),
        "peer_host": getattr(conn.peer, "host", None),
        "peer_port": getattr(conn.peer, "port", None),
        "ssl": bool(getattr(conn.transport, "TLS", False)),
        "client_properties": jsonable(conn.clientProperties or {}),
        "connected_at": int(conn.connectedAt * 1000),
        "recv_cnt": conn.recvCnt,
        "send_cnt": conn.sendCnt,
        "send_pend": 0,
    }
    d.update(dict.fromkeys(_STREAM_TLS_KEYS, "" if detail else None))
    d.update(view.dataStats("connection", conn, (conn.recvOct, conn.sendOct)))
    return d


def streamConnectionDetails(conn):
    """The ``connection_details`` of a stream publisher or consumer."""
    return {
        "name": conn.name,
        "node": nodeName(conn.broker),
        "peer_host": getattr(conn.peer, "host", None),
        "peer_port": getattr(conn.peer, "port", None),
        "user": conn.user.name if conn.user is not None else None,
    }


def streamPublisherDict(conn, p):
    """A stream publisher as ``GET /api/stream/publishers`` shows it (rabbitmq_stream_management)."""
    return {
        "connection_details": streamConnectionDetails(conn),
        "publisher_id": p.pid,
        "queue": {"name": p.stream, "vhost": conn.vhost},
        "reference": p.reference or "",
        "published": p.published,
        "confirmed": p.confirmed,
        "errored": p.errored,
    }


def streamConsumerDict(conn, sub, last):
    """
    A stream subscription as ``GET /api/stream/consumers`` shows it:
    ``offset`` is the first offset of the last chunk delivered (0 before
    one is, wherever the subscription starts), ``offset_lag`` how far the
    stream's last chunk (its first offset, ``last``; None for an empty
    stream) is past it, as 3.10 counts them (0 once the subscription read
    into the last chunk: a chunk otter_tx delivers may join several written
    ones); ``credits`` what the subscription has left.
    """
    lag = 0 if last is None or (sub.consumed and sub.offset > last) else max(last - sub.chunk, 0)
    return {
        "connection_details": streamConnectionDetails(conn),
        "subscription_id": sub.sid,
        "queue": {"name": sub.stream, "vhost": conn.vhost},
        "properties": jsonable(sub.props or {}),
        "credits": sub.credit,
        "consumed": sub.consumed,
        "offset": sub.chunk,
        "offset_lag": lag,
    }


def channelDict(ch, view):
    """
    A channel as ``GET /api/channels`` shows it, with ``message_stats``
    (:data:`~otter_tx.broker.stats.CHANNEL_KEYS`, ``msg_rates`` range of
    ``view``) and ``messages_unconfirmed`` / ``_uncommitted`` /
    ``acks_uncommitted``.
    """
    conn = ch.connection
    session = ch.session
    unconfirmed, uncommitted, acksUncommitted = session.pendingCounts()
    return {
        "name": channelName(ch),
        "number": ch.number,
        "node": nodeName(session.broker),
        "connection_details": {
            "name": connectionName(conn),
            "peer_host": getattr(conn.peer, "host", None),
            "peer_port": getattr(conn.peer, "port", None),
        },
        "user": conn.user.name if conn.user is not None else None,
        "user_who_performed_action": conn.user.name if conn.user is not None else None,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "state": "running",
        "confirm": session.confirmMode,
        "transactional": session.txMode,
        "prefetch_count": session.prefetchCount,
        "global_prefetch_count": session.globalPrefetch,
        "consumer_count": len(session.consumers),
        "messages_unacknowledged": session.unackedCount,
        "messages_unconfirmed": unconfirmed,
        "messages_uncommitted": uncommitted,
        "acks_uncommitted": acksUncommitted,
        "pending_raft_commands": 0,
        "message_stats": view.messageStats("channel", session, stats.CHANNEL_KEYS,
                                           stats.channelValues(session.stats)),
    }
