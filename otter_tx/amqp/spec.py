"""
AMQP 0-9-1 constants and method classes.

Each method is a small class (``ConnectionStart``, ``BasicPublish`` ...) with
``CLASS_ID``, ``METHOD_ID``, ``PREFIX`` (the two as the first four octets
of its method frame payload), ``NAME`` (``"basic.publish"``), ``FIELDS`` and
the wire type letters ``TYPES`` (see :mod:`otter_tx.amqp.codec`), plus
attributes named after the spec's fields (``reserved_1`` for the reserved
ones).  Source: the AMQP 0-9-1 XML spec (amqp0-9-1.extended.xml as shipped
by RabbitMQ), including RabbitMQ's extensions (exchange.bind/unbind,
basic.nack, confirm, connection.blocked/unblocked/update-secret).
"""

from otter_tx.amqp import codec

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_MIN_SIZE = 4096

#: class ids (AMQP 0-9-1 section 1.3 onwards)
CLASS_CONNECTION = 10
CLASS_CHANNEL = 20
CLASS_BASIC = 60

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
#: the 0-9 header (txAMQP and other old clients); RabbitMQ accepts it too
PROTOCOL_HEADER_0_9 = b"AMQP\x01\x01\x00\x09"
PROTOCOL_HEADER_0_9_ALT = b"AMQP\x01\x01\x09\x01"

# reply codes (AMQP 0-9-1 spec section 1.2 constants)
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    200: "REPLY_SUCCESS",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}

#: soft (channel-level) reply codes; every other error code closes the connection
CHANNEL_LEVEL_CODES = frozenset([311, 312, 313, 403, 404, 405, 406])


class Method:
    """
    Base class of the generated method classes.
    """

    __slots__ = ()
    CLASS_ID = 0
    METHOD_ID = 0
    #: the four octets (class id, method id) that open its method frame payload
    PREFIX = b"\x00\x00\x00\x00"
    NAME = ""
    FIELDS = ()
    TYPES = ""
    DEFAULTS = ()
    CONTENT = False

    def __init__(self, *args, **kw):
        n = len(args)
        for i, name in enumerate(self.FIELDS):
            if i < n:
                v = args[i]
            else:
                v = kw.pop(name, self.DEFAULTS[i])
                if v is None and self.TYPES[i] == "T":
                    v = {}
            object.__setattr__(self, name, v)
        if kw:
            raise TypeError("unknown fields for %s: %s" % (self.NAME, ", ".join(kw)))

    def encode(self):
        """
        The method frame payload: class id, method id and arguments.
        """
        return (
            codec._pack_H(self.CLASS_ID)
            + codec._pack_H(self.METHOD_ID)
            + codec.encodeArgs(self.TYPES, [getattr(self, f) for f in self.FIELDS])
        )

    @classmethod
    def decode(cls, data, off):
        """
        Build an instance from the argument bytes at ``data[off:]``.
        """
        self = cls.__new__(cls)
        for name, v in zip(cls.FIELDS, codec.decodeArgs(cls.TYPES, data, off)):
            object.__setattr__(self, name, v)
        return self

    def __eq__(self, other):
        return type(self) is type(other) and all(
            getattr(self, f) == getattr(other, f) for f in self.FIELDS
        )

    def __repr__(self):
        return "<%s %s>" % (
            self.NAME,
            " ".join("%s=%r" % (f, getattr(self, f)) for f in self.FIELDS),
        )


_DEFAULT_FOR = {"o": 0, "h": 0, "l": 0, "q": 0, "t": 0, "s": "", "S": b"", "b": False, "T": None}

#: (class id, method id) -> method class
METHODS = {}


def _method(pyname, name, classId, methodId, fields, content=False):
    names = []
    types = []
    for f in fields.split():
        n, t = f.split(":")
        names.append(n)
        types.append(t)
    cls = type(
        pyname,
        (Method,),
        {
            "__slots__": tuple(names),
            "CLASS_ID": classId,
            "METHOD_ID": methodId,
            "PREFIX": codec._pack_H(classId) + codec._pack_H(methodId),
            "NAME": name,
            "FIELDS": tuple(names),
            "TYPES": "".join(types),
            "DEFAULTS": tuple(_DEFAULT_FOR[t] for t in types),
            "CONTENT": content,
            "__doc__": "AMQP 0-9-1 ``%s`` (class %d, method %d)." % (name, classId, methodId),
        },
    )
    METHODS[(classId, methodId)] = cls
    return cls


_CLOSE = "reply_code:h reply_text:s class_id:h method_id:h"

ConnectionStart = _method(
    "ConnectionStart",
    "connection.start",
    10,
    10,
    "version_major:o version_minor:o server_properties:T mechanisms:S locales:S",
)
ConnectionStartOk = _method(
    "ConnectionStartOk",
    "connection.start-ok",
    10,
    11,
    "client_properties:T mechanism:s response:S locale:s",
)
ConnectionSecure = _method("ConnectionSecure", "connection.secure", 10, 20, "challenge:S")
ConnectionSecureOk = _method("ConnectionSecureOk", "connection.secure-ok", 10, 21, "response:S")
ConnectionTune = _method(
    "ConnectionTune", "connection.tune", 10, 30, "channel_max:h frame_max:l heartbeat:h"
)
ConnectionTuneOk = _method(
    "ConnectionTuneOk", "connection.tune-ok", 10, 31, "channel_max:h frame_max:l heartbeat:h"
)
ConnectionOpen = _method(
    "ConnectionOpen", "connection.open", 10, 40, "virtual_host:s reserved_1:s reserved_2:b"
)
ConnectionOpenOk = _method("ConnectionOpenOk", "connection.open-ok", 10, 41, "reserved_1:s")
ConnectionClose = _method("ConnectionClose", "connection.close", 10, 50, _CLOSE)
ConnectionCloseOk = _method("ConnectionCloseOk", "connection.close-ok", 10, 51, "")
ConnectionBlocked = _method("ConnectionBlocked", "connection.blocked", 10, 60, "reason:s")
ConnectionUnblocked = _method("ConnectionUnblocked", "connection.unblocked", 10, 61, "")
ConnectionUpdateSecret = _method(
    "ConnectionUpdateSecret", "connection.update-secret", 10, 70, "new_secret:S reason:s"
)
ConnectionUpdateSecretOk = _method(
    "ConnectionUpdateSecretOk", "connection.update-secret-ok", 10, 71, ""
)

ChannelOpen = _method("ChannelOpen", "channel.open", 20, 10, "reserved_1:s")
ChannelOpenOk = _method("ChannelOpenOk", "channel.open-ok", 20, 11, "reserved_1:S")
ChannelFlow = _method("ChannelFlow", "channel.flow", 20, 20, "active:b")
ChannelFlowOk = _method("ChannelFlowOk", "channel.flow-ok", 20, 21, "active:b")
ChannelClose = _method("ChannelClose", "channel.close", 20, 40, _CLOSE)
ChannelCloseOk = _method("ChannelCloseOk", "channel.close-ok", 20, 41, "")

ExchangeDeclare = _method(
    "ExchangeDeclare",
    "exchange.declare",
    40,
    10,
    "reserved_1:h exchange:s type:s passive:b durable:b auto_delete:b internal:b nowait:b "
    "arguments:T",
)
ExchangeDeclareOk = _method("ExchangeDeclareOk", "exchange.declare-ok", 40, 11, "")
ExchangeDelete = _method(
    "ExchangeDelete", "exchange.delete", 40, 20, "reserved_1:h exchange:s if_unused:b nowait:b"
)
ExchangeDeleteOk = _method("ExchangeDeleteOk", "exchange.delete-ok", 40, 21, "")
ExchangeBind = _method(
    "ExchangeBind",
    "exchange.bind",
    40,
    30,
    "reserved_1:h destination:s source:s routing_key:s nowait:b arguments:T",
)
ExchangeBindOk = _method("ExchangeBindOk", "exchange.bind-ok", 40, 31, "")
ExchangeUnbind = _method(
    "ExchangeUnbind",
    "exchange.unbind",
    40,
    40,
    "reserved_1:h destination:s source:s routing_key:s nowait:b arguments:T",
)
ExchangeUnbindOk = _method("ExchangeUnbindOk", "exchange.unbind-ok", 40, 51, "")

QueueDeclare = _method(
    "QueueDeclare",
    "queue.declare",
    50,
    10,
    "reserved_1:h queue:s passive:b durable:b exclusive:b auto_delete:b nowait:b arguments:T",
)
QueueDeclareOk = _method(
    "QueueDeclareOk", "queue.declare-ok", 50, 11, "queue:s message_count:l consumer_count:l"
)
QueueBind = _method(
    "QueueBind",
    "queue.bind",
    50,
    20,
    "reserved_1:h queue:s exchange:s routing_key:s nowait:b arguments:T",
)
QueueBindOk = _method("QueueBindOk", "queue.bind-ok", 50, 21, "")
QueuePurge = _method("QueuePurge", "queue.purge", 50, 30, "reserved_1:h queue:s nowait:b")
QueuePurgeOk = _method("QueuePurgeOk", "queue.purge-ok", 50, 31, "message_count:l")
QueueDelete = _method(
    "QueueDelete",
    "queue.delete",
    50,
    40,
    "reserved_1:h queue:s if_unused:b if_empty:b nowait:b",
)
QueueDeleteOk = _method("QueueDeleteOk", "queue.delete-ok", 50, 41, "message_count:l")
QueueUnbind = _method(
    "QueueUnbind",
    "queue.unbind",
    50,
    50,
    "reserved_1:h queue:s exchange:s routing_key:s arguments:T",
)
QueueUnbindOk = _method("QueueUnbindOk", "queue.unbind-ok", 50, 51, "")

BasicQos = _method(
    "BasicQos", "basic.qos", 60, 10, "prefetch_size:l prefetch_count:h global_:b"
)
BasicQosOk = _method("BasicQosOk", "basic.qos-ok", 60, 11, "")
BasicConsume = _method(
    "BasicConsume",
    "basic.consume",
    60,
    20,
    "reserved_1:h queue:s consumer_tag:s no_local:b no_ack:b exclusive:b nowait:b arguments:T",
)
BasicConsumeOk = _method("BasicConsumeOk", "basic.consume-ok", 60, 21, "consumer_tag:s")
BasicCancel = _method("BasicCancel", "basic.cancel", 60, 30, "consumer_tag:s nowait:b")
BasicCancelOk = _method("BasicCancelOk", "basic.cancel-ok", 60, 31, "consumer_tag:s")
BasicPublish = _method(
    "BasicPublish",
    "basic.publish",
    60,
    40,
    "reserved_1:h exchange:s routing_key:s mandatory:b immediate:b",
    content=True,
)
BasicReturn = _method(
    "BasicReturn",
    "basic.return",
    60,
    50,
    "reply_code:h reply_text:s exchange:s routing_key:s",
    content=True,
)
BasicDeliver = _method(
    "BasicDeliver",
    "basic.deliver",
    60,
    60,
    "consumer_tag:s delivery_tag:q redelivered:b exchange:s routing_key:s",
    content=True,
)
BasicGet = _method("BasicGet", "basic.get", 60, 70, "reserved_1:h queue:s no_ack:b")
BasicGetOk = _method(
    "BasicGetOk",
    "basic.get-ok",
    60,
    71,
    "delivery_tag:q redelivered:b exchange:s routing_key:s message_count:l",
    content=True,
)
BasicGetEmpty = _method("BasicGetEmpty", "basic.get-empty", 60, 72, "reserved_1:s")
BasicAck = _method("BasicAck", "basic.ack", 60, 80, "delivery_tag:q multiple:b")
BasicReject = _method("BasicReject", "basic.reject", 60, 90, "delivery_tag:q requeue:b")
BasicRecoverAsync = _method("BasicRecoverAsync", "basic.recover-async", 60, 100, "requeue:b")
BasicRecover = _method("BasicRecover", "basic.recover", 60, 110, "requeue:b")
BasicRecoverOk = _method("BasicRecoverOk", "basic.recover-ok", 60, 111, "")
BasicNack = _method(
    "BasicNack", "basic.nack", 60, 120, "delivery_tag:q multiple:b requeue:b"
)

TxSelect = _method("TxSelect", "tx.select", 90, 10, "")
TxSelectOk = _method("TxSelectOk", "tx.select-ok", 90, 11, "")
TxCommit = _method("TxCommit", "tx.commit", 90, 20, "")
TxCommitOk = _method("TxCommitOk", "tx.commit-ok", 90, 21, "")
TxRollback = _method("TxRollback", "tx.rollback", 90, 30, "")
TxRollbackOk = _method("TxRollbackOk", "tx.rollback-ok", 90, 31, "")

ConfirmSelect = _method("ConfirmSelect", "confirm.select", 85, 10, "nowait:b")
ConfirmSelectOk = _method("ConfirmSelectOk", "confirm.select-ok", 85, 11, "")
