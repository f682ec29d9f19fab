"""
The ``x-delayed-message`` exchange type, compatible with RabbitMQ's
rabbitmq-delayed-message-exchange plugin (its README and
``rabbit_exchange_type_delayed_message.erl``; ../shared/reference section 5a).

A message published with a header ``x-delay`` of 1 to 4294967295 ms is held
by the exchange and routed, with the routing rules of ``x-delayed-type``,
when the delay is over. Until then it has no route: a mandatory publish gets
``basic.return`` at once, a confirm is an ack at once, and an
``alternate-exchange`` receives it at once. Those are the plugin's documented
limitations, and they are reproduced here. At fire time the header is
replaced by its negation, so a second delayed exchange does not delay the
message again.

Unlike the plugin, held messages sit in one :class:`ExpiryIndex` per
exchange (a heap and one timer), so 100k+ held messages cost O(log n) each.
They are written to the store when the exchange is durable, with their
absolute fire time, so downtime counts.
"""

from decimal import Decimal

from otter_tx.amqp.codec import TaggedFloat, encodeProperties
from otter_tx.amqp.errors import commandInvalid, preconditionFailed
from otter_tx.broker.exchange import EXCHANGE_TYPES, Exchange
from otter_tx.broker.expiry import ExpiryIndex, nowMs
from otter_tx.broker.message import Message

DELAYED_TYPE = "x-delayed-message"

#: the plugin's cap: Erlang timers take at most 2^32 - 1 ms
MAX_DELAY_MS = 4294967295


def validateDelayedArguments(arguments):
    """
    Check ``x-delayed-type``: 406 when it is missing, not a string, or
    ``x-delayed-message`` itself; 503 for an unknown type (RabbitMQ 3.10's
    ``check_type``).
    """
    t = arguments.get("x-delayed-type")
    if not isinstance(t, str):
        raise preconditionFailed("Invalid argument, 'x-delayed-type' must be an existing exchange type")
    if t == DELAYED_TYPE:
        raise preconditionFailed("Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
    if t not in EXCHANGE_TYPES:
        raise commandInvalid("unknown exchange type '%s'" % (t,))


def messageDelay(message):
    """
    The delay in ms that ``message`` asks for, or None when it must be
    routed at once.

    Integers are used as they are, strings are parsed as integers, and
    floats and decimals are truncated. Anything else, a missing header, an
    unparsable string (the plugin crashes on one), NaN or infinity, or a
    value outside 1..4294967295 means no delay.  Never raises: a malformed
    ``x-delay`` from one publisher affects only its own message.
    """
    headers = message.headers
    if not headers:
        return None
    v = headers.get("x-delay")
    if v is None or type(v) is bool:
        return None
    if isinstance(v, int):
        d = int(v)
    elif isinstance(v, (float, TaggedFloat, Decimal)):
        try:
            d = int(v)
        except (ValueError, OverflowError):
            # NaN or infinity from a publisher
            return None
    elif isinstance(v, (str, bytes)):
        try:
            d = int(v)
        except ValueError:
            return None
    else:
        return None
    if 0 < d <= MAX_DELAY_MS:
        return d
    return None


class DelayedExchange(Exchange):
    """
    An ``x-delayed-message`` exchange. Bindings use the routing table of
    its ``x-delayed-type``.

    :ivar held: how many messages are waiting (RabbitMQ's ``messages_delayed``).
    """

    delayed = True
    #: messages taken into hold since the exchange was declared (message rates)
    delayedCount = 0

    def __init__(self, vhost, name, type, durable, autoDelete, internal, arguments):
        Exchange.__init__(self, vhost, name, arguments["x-delayed-type"], durable, autoDelete,
                          internal, arguments)
        self.type = DELAYED_TYPE
        self.delayedType = arguments["x-delayed-type"]
        self._index = ExpiryIndex(vhost.clock, self._fire, vhost.broker.reapingLateness.delayed)
        self._seq = 0
        self.journal = None

    @property
    def held(self):
        """Messages waiting for their delay (int)."""
        return len(self._index)

    def storeKey(self):
        """The store's pseudo-queue key for this exchange's held messages."""
        return "\x01delayed\x00" + self.vhost.name + "\x00" + self.name

    def hold(self, message, delay):
        """Keep ``message`` until ``delay`` ms from now."""
        now = nowMs(self.vhost.clock)
        self.delayedCount += 1
        self.vhost.delayedCount += 1
        self._add(message, now + delay, now)

    def _add(self, message, fireAt, now=None):
        self._seq += 1
        key = (self._seq, message)
        self._index.add(key, fireAt)
        if self.journal is not None:
            self.journal.held(self, message, self._seq, fireAt, now)

    def restore(self, message, seq, fireAt):
        """Put back a held message read from the store (boot only)."""
        self._seq = max(self._seq, seq)
        self._index.add((seq, message), fireAt)

    def _fire(self, keys):
        vhost = self.vhost
        for seq, message in keys:
            if self.journal is not None:
                self.journal.released(self, message)
            if self.deleted:
                continue
            out = _swapDelay(message)
            vhost.broker.nextMessageId(out)
            for q in vhost.route(self, out, out.routingKeys()):
                q.enqueue(out)

    def stopTimers(self):
        """Broker shutdown: no more firing."""
        self._index.freeze()

    def discardHeld(self):
        """The exchange was deleted: its held messages are lost, as with the plugin."""
        self._index.clear()


def _swapDelay(message):
    """A copy of ``message`` whose ``x-delay`` header is negated (type ``I``)."""
    props = dict(message.props)
    headers = dict(props["headers"])
    d = messageDelay(message) or 0
    headers["x-delay"] = -d
    props["headers"] = headers
    out = Message(message.exchange, message.routingKey, encodeProperties(props), message.body, props)
    out.extraKeys = message.extraKeys
    out.ttl = message.ttl
    return out
