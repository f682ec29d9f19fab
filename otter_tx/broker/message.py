"""
Messages as the broker holds them.

A :class:`Message` keeps the publisher's content-header property bytes
(``propsRaw``: the 16-bit flags word and the property list) so delivery
forwards them untouched; properties are decoded once at publish only when
the flags word is non-zero, and re-encoded only when the broker must change
a property (dead-lettering).
"""

from otter_tx.amqp import codec
from otter_tx.amqp.errors import preconditionFailed

#: RabbitMQ's cap on TTLs and expiries: 10 years in ms (rabbit_misc:check_expiry)
MAX_EXPIRY_MS = 315360000000

_EMPTY_PROPS = b"\x00\x00"


class Message:
    """
    One published message.

    :ivar exchange: the exchange name it was published to (str).
    :ivar routingKey: the publish routing key (str).
    :ivar propsRaw: content-header flags + property list (bytes).
    :ivar body: the body (bytes).
    :ivar props: decoded properties (dict; empty when none were sent).
    :ivar ttl: per-message TTL in ms from ``expiration`` (int) or ``None``.
    :ivar priority: the ``priority`` property or 0.
    :ivar persistent: True for delivery-mode 2.
    :ivar storeId: a broker-wide id (int), assigned by the vhost when the
        message is first routed; the durable store's key for it (not the
        ``message_id`` property, which is the publisher's).
    :ivar addressCache: the exchange and routing key as two AMQP short
        strings (bytes) once :meth:`addressBytes` computed them or the
        publish frame supplied them, else ``None``.
    :ivar commandUser: set only on a message carrying an
        ``x-delayed-command`` header: the authenticated publisher's name
        (str), recorded by :func:`~otter_tx.broker.publish.prepareMessage`
        for :meth:`~otter_tx.broker.delayed.DelayedExchange.runCommand`
        (unset otherwise: read it with ``getattr(m, "commandUser", None)``).
    """

    __slots__ = (
        "exchange",
        "routingKey",
        "propsRaw",
        "body",
        "props",
        "ttl",
        "priority",
        "persistent",
        "storeId",
        "size",
        "extraKeys",
        "stored",
        "addressCache",
        "commandUser",
        "forwarded",
    )

    def __init__(self, exchange, routingKey, propsRaw, body, props=None):
        self.exchange = exchange
        self.routingKey = routingKey
        self.body = body
        self.size = len(body)
        self.storeId = 0
        self.stored = False
        #: [(link, forward number)] once forwarded to queues on other nodes (its
        #: confirm waits for their answers; otter_tx.cluster.link), else None
        self.forwarded = None
        self.addressCache = None
        if props is None:
            props = codec.decodeProperties(propsRaw) if propsRaw[:2] != _EMPTY_PROPS else {}
        self.propsRaw = propsRaw
        self.props = props
        self.extraKeys = None
        if props:
            exp = props.get("expiration")
            self.ttl = parseExpiration(exp) if exp is not None else None
            self.priority = props.get("priority", 0) or 0
            self.persistent = props.get("delivery_mode") == 2
        else:
            self.ttl = None
            self.priority = 0
            self.persistent = False

    @property
    def headers(self):
        """
        The ``headers`` property (dict) or ``None``.
        """
        return self.props.get("headers")

    def routingKeys(self):
        """
        The publish routing key plus CC and BCC keys (RabbitMQ's
        sender-selected distribution).
        """
        if self.extraKeys:
            return [self.routingKey] + self.extraKeys
        return [self.routingKey]

    def addressBytes(self):
        """
        Exchange and routing key as two AMQP short strings, as basic.deliver,
        basic.get-ok and basic.return carry them (cached; taken straight from
        the publish frame when possible).
        """
        a = self.addressCache
        if a is None:
            ex = self.exchange.encode("utf-8", "surrogateescape")
            rk = self.routingKey.encode("utf-8", "surrogateescape")
            a = self.addressCache = bytes((len(ex),)) + ex + bytes((len(rk),)) + rk
        return a

    def withHeaders(self, headers):
        """
        A copy of this message whose ``headers`` property is ``headers``
        (dict), its properties re-encoded; exchange, routing key, body,
        CC/BCC keys (``extraKeys``) and ``ttl`` kept.  The copy has no store
        id yet.
        """
        props = dict(self.props)
        props["headers"] = headers
        out = Message(self.exchange, self.routingKey, codec.encodeProperties(props), self.body, props)
        out.extraKeys = self.extraKeys
        out.ttl = self.ttl
        return out

    def contentHeader(self):
        """
        The content-header frame payload: class 60, weight 0, body size,
        then the publisher's property bytes.
        """
        return codec._pack_H(60) + b"\x00\x00" + codec._pack_Q(self.size) + self.propsRaw


def parseExpiration(value):
    """
    Parse the ``expiration`` property as RabbitMQ does (Erlang
    ``string:to_integer``: optional sign, leading zeros, no whitespace, no
    trailing characters) and return the TTL in ms (int).

    Raises 406 PRECONDITION_FAILED with RabbitMQ's text, e.g.
    ``invalid expiration 'abc': no_integer`` (rabbit_basic:parse_expiration).
    """
    s = value
    i = 0
    if s[:1] in ("+", "-"):
        i = 1
    j = i
    while j < len(s) and "0" <= s[j] <= "9":
        j += 1
    if j == i:
        raise preconditionFailed("invalid expiration '%s': no_integer" % (value,))
    n = int(s[:j])
    if j != len(s):
        raise preconditionFailed(
            "invalid expiration '%s': {leftover_string,\"%s\"}" % (value, s[j:])
        )
    if n < 0:
        raise preconditionFailed("invalid expiration '%s': {value_negative,%d}" % (value, n))
    if n > MAX_EXPIRY_MS:
        raise preconditionFailed("invalid expiration '%s': {value_too_large,%d}" % (value, n))
    return n
