"""
Messages between the stream protocol's AMQP 1.0 bytes and the broker's
AMQP 0-9-1 :class:`~otter_tx.broker.message.Message`, as RabbitMQ 3.10
converts them (rabbit_msg_record to_amqp091 / from_amqp091).

A stream keeps each message as it was published: a stream client's bytes
(AMQP 1.0, or opaque) or an AMQP 0-9-1 message; these run only when the
other protocol reads it.
"""

import struct

from otter_tx.amqp.codec import encodeProperties
from otter_tx.broker.message import Message
from otter_tx.stream import amqp10

_EMPTY_PROPS = b"\x00\x00"


def toMessage(stream, data):
    """A stream client's AMQP 1.0 message as the broker Message (to_amqp091); opaque bytes as a body."""
    if data[:1] != b"\x00":
        # not an AMQP 1.0 section: opaque bytes
        return Message("", stream, _EMPTY_PROPS, bytes(data), {})
    body = amqp10.onlyData(data)
    if body is not None:
        return Message("", stream, _EMPTY_PROPS, body, {})
    try:
        props, body = amqp10.toAmqp091(data)
    except (amqp10.DecodeError, ValueError, struct.error, IndexError):
        props, body = {}, bytes(data)
    return Message("", stream, encodeProperties(props) if props else _EMPTY_PROPS, body, props)


_DATA8 = b"\x00\x53\x75\xa0"
_DATA32 = b"\x00\x53\x75\xb0"
_annotations = amqp10._addressAnnotations


def fromMessage(m):
    """The AMQP 1.0 bytes a stream client reads for the broker Message ``m`` (from_amqp091)."""
    if not m.props:
        # the common case, inline: cached annotations, one data section
        body = m.body
        n = len(body)
        head = _DATA8 + bytes((n,)) if n < 256 else _DATA32 + struct.pack(">I", n)
        return _annotations(m.exchange, m.routingKey) + head + body
    return amqp10.fromAmqp091(m.props, m.body, m.exchange, m.routingKey)
