"""
Validation and equivalence of queue and exchange declare arguments, with
RabbitMQ 3.10's exact reply texts (``rabbit_amqqueue:declare_args/0``,
``rabbit_misc:assert_args_equivalence/4``; see
docs/compatibility.md and ../shared/reference sections 1.1, 2.1, 3.1, 4.1,
4.3, 6.4, 6.6).

Every error is a channel-level 406 PRECONDITION_FAILED
(:func:`otter_tx.amqp.errors.preconditionFailed`).
"""

import re

from otter_tx.amqp.codec import TaggedInt, fieldTypeName
from otter_tx.amqp.errors import AMQPError, preconditionFailed, resourceText
from otter_tx.broker.message import MAX_EXPIRY_MS

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")

#: arguments of other queue types that a classic queue refuses
#: (``x-delivery-limit`` is not one of them: otter_tx honours it on classic
#: queues too, an extension; docs/quorum.md)
_OTHER_TYPE_ARGS = frozenset(
    [
        "x-dead-letter-strategy",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-quorum-initial-group-size",
        "x-quorum-target-group-size",
        "x-initial-cluster-size",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-stream-filter-size-bytes",
    ]
)

#: arguments a quorum queue refuses (RabbitMQ 3.10, checked on the peer):
#: 406 ``invalid arg 'K' for queue 'Q' in vhost '/' of queue type rabbit_quorum_queue``
_QUORUM_UNSUPPORTED_ARGS = frozenset(
    [
        "x-max-priority",
        "x-queue-mode",
        "x-queue-master-locator",
        "x-queue-version",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-stream-filter-size-bytes",
    ]
)

#: arguments a stream queue accepts (RabbitMQ 3.10, checked on the peer); every
#: other argument that some queue type takes is refused with 406 ``invalid arg
#: 'K' for queue 'Q' in vhost '/' of queue type rabbit_stream_queue``
_STREAM_ARGS = frozenset(
    [
        "x-queue-type",
        "x-max-length-bytes",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
        "x-stream-filter-size-bytes",
    ]
)

#: every queue argument some queue type knows (the ones a stream refuses are
#: these minus :data:`_STREAM_ARGS`)
_KNOWN_QUEUE_ARGS = _OTHER_TYPE_ARGS | _QUORUM_UNSUPPORTED_ARGS | frozenset(
    [
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
        "x-max-length", "x-max-length-bytes", "x-overflow", "x-single-active-consumer",
        "x-delivery-limit", "x-queue-type", "x-queue-leader-locator",
    ]
)

#: values of ``x-dead-letter-strategy`` (quorum queues)
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")

QUORUM = "quorum"
STREAM = "stream"


def queueType(arguments):
    """
    The type of a queue declared with ``arguments`` (dict): ``"quorum"`` for
    ``x-queue-type: quorum``, ``"stream"`` for ``x-queue-type: stream``
    (docs/streams.md), else ``"classic"``.
    """
    t = arguments.get("x-queue-type")
    if t == QUORUM or t == STREAM:
        return t
    return "classic"


def validateQuorumDeclare(qname, vhost, durable, exclusive, autoDelete):
    """
    The declare-time rules of a quorum queue beyond its arguments
    (``rabbit_quorum_queue:declare/2``, same order): 406 ``invalid property
    'auto-delete'`` / ``'exclusive-owner'`` / ``'non-durable'`` ``for queue
    'Q' in vhost 'V'``.  ``durable``, ``exclusive``, ``autoDelete``: the
    declare's flags (bool).
    """
    for bad, prop in ((autoDelete, "auto-delete"), (exclusive, "exclusive-owner"),
                      (not durable, "non-durable")):
        if bad:
            raise preconditionFailed("invalid property '%s' for %s" % (prop, resourceText("queue", qname, vhost)))


def frozenArguments(arguments):
    """
    A hashable key for a binding's ``arguments`` (dict or None): a sorted
    tuple of ``(name, repr(value))``; ``()`` for none.  Two bindings that
    differ only in argument order share the key.
    """
    if not arguments:
        return ()
    return tuple(sorted((k, repr(v)) for k, v in arguments.items()))


#: arguments compared on redeclare (rabbit_classic_queue capabilities, 3.10)
EQUIVALENCE_ARGS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
)

#: arguments compared on redeclare of a quorum queue (rabbit_quorum_queue
#: capabilities, 3.10; checked on the peer: the classic-only ones such as
#: x-max-priority are not compared, a redeclare with them succeeds)
QUORUM_EQUIVALENCE_ARGS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-overflow",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
)


def isInteger(v):
    """True for AMQP integer field values (not bool)."""
    t = type(v)
    return t is int or t is TaggedInt


def _invalid(key, qname, vhost, term):
    return preconditionFailed(
        "invalid arg '%s' for %s: %s" % (key, resourceText("queue", qname, vhost), term)
    )


def _expectInt(key, v, qname, vhost):
    if not isInteger(v):
        raise _invalid(key, qname, vhost, '"expected integer, got %s"' % (fieldTypeName(v),))
    return int(v)


def validateQueueArguments(args, qname, vhost):
    """
    Check a new queue's ``x-`` arguments; raise 406 with RabbitMQ's text
    for the first invalid one.  Unknown ``x-`` arguments are accepted.
    A quorum queue (``x-queue-type: quorum``) refuses the arguments of
    :data:`_QUORUM_UNSUPPORTED_ARGS` and accepts its own (``x-delivery-limit``
    of any type, as 3.10 does; a non-integer one is no limit).
    """
    qtype = queueType(args)
    if qtype == STREAM:
        _validateStreamArguments(args, qname, vhost)
        return
    quorum = qtype == QUORUM
    for key, v in args.items():
        if quorum and key in _QUORUM_UNSUPPORTED_ARGS:
            raise preconditionFailed(
                "invalid arg '%s' for %s of queue type rabbit_quorum_queue"
                % (key, resourceText("queue", qname, vhost))
            )
        if key in ("x-message-ttl",):
            n = _expectInt(key, v, qname, vhost)
            if n < 0:
                raise _invalid(key, qname, vhost, "{value_negative,%d}" % n)
            if n > MAX_EXPIRY_MS:
                raise _invalid(key, qname, vhost, "{value_too_large,%d}" % n)
        elif key == "x-expires":
            n = _expectInt(key, v, qname, vhost)
            if n == 0:
                raise _invalid(key, qname, vhost, "{value_zero,0}")
            if n < 0:
                raise _invalid(key, qname, vhost, "{value_negative,%d}" % n)
            if n > MAX_EXPIRY_MS:
                raise _invalid(key, qname, vhost, "{value_too_large,%d}" % n)
        elif key in ("x-max-length", "x-max-length-bytes"):
            n = _expectInt(key, v, qname, vhost)
            if n < 0:
                raise _invalid(key, qname, vhost, "{value_negative,%d}" % n)
        elif key == "x-max-priority":
            n = _expectInt(key, v, qname, vhost)
            if n < 0:
                raise _invalid(key, qname, vhost, "{value_negative,%d}" % n)
            if n > 255:
                raise _invalid(key, qname, vhost, "{max_value_exceeded,%d}" % n)
        elif key == "x-overflow":
            if not isinstance(v, str):
                raise _invalid(key, qname, vhost, "{unacceptable_type,%s}" % fieldTypeName(v))
            if v not in OVERFLOW_MODES:
                raise _invalid(key, qname, vhost, "invalid_overflow")
        elif key == "x-dead-letter-exchange":
            if not isinstance(v, str):
                raise preconditionFailed(
                    "invalid type '%s' for arg '%s' in %s"
                    % (fieldTypeName(v), key, resourceText("queue", qname, vhost))
                )
        elif key == "x-dead-letter-routing-key":
            if not isinstance(v, str):
                raise preconditionFailed(
                    "invalid type '%s' for arg '%s' in %s"
                    % (fieldTypeName(v), key, resourceText("queue", qname, vhost))
                )
            if "x-dead-letter-exchange" not in args:
                raise _invalid(key, qname, vhost, "routing_key_but_no_dlx_defined")
        elif key == "x-single-active-consumer":
            if type(v) is not bool:
                raise _invalid(key, qname, vhost, "{unacceptable_type,%s}" % fieldTypeName(v))
        elif key == "x-queue-type":
            if not isinstance(v, str):
                raise _invalid(key, qname, vhost, "{unacceptable_type,%s}" % fieldTypeName(v))
            if v not in ("classic", QUORUM, STREAM):
                raise _invalid(key, qname, vhost, "\"unsupported queue type '%s'\"" % (v,))
        elif key == "x-dead-letter-strategy" and quorum:
            if v not in DEAD_LETTER_STRATEGIES:
                raise _invalid(key, qname, vhost, "invalid_dlx_strategy")
        elif key == "x-queue-mode":
            if v not in ("default", "lazy"):
                raise _invalid(key, qname, vhost, "\"unsupported queue mode '%s'\"" % (v,))
        elif key in _OTHER_TYPE_ARGS and not quorum:
            raise preconditionFailed(
                "invalid arg '%s' for %s of queue type rabbit_classic_queue"
                % (key, resourceText("queue", qname, vhost))
            )


def _validateStreamArguments(args, qname, vhost):
    """
    A stream's arguments, as RabbitMQ 3.10 checks them (on the peer): the
    other types' arguments refused (``of queue type rabbit_stream_queue``),
    ``x-max-length-bytes`` and ``x-stream-max-segment-size-bytes`` integers
    >= 0, ``x-initial-cluster-size`` an integer > 0, ``x-max-age`` a
    duration (:func:`otter_tx.broker.stream.parseMaxAge`'s rules).
    """
    for key, v in args.items():
        if key in _KNOWN_QUEUE_ARGS and key not in _STREAM_ARGS:
            raise preconditionFailed(
                "invalid arg '%s' for %s of queue type rabbit_stream_queue"
                % (key, resourceText("queue", qname, vhost)))
        if key in ("x-max-length-bytes", "x-stream-max-segment-size-bytes"):
            n = _expectInt(key, v, qname, vhost)
            if n < 0:
                raise _invalid(key, qname, vhost, "{value_negative,%d}" % n)
        elif key == "x-initial-cluster-size":
            n = _expectInt(key, v, qname, vhost)
            if n == 0:
                raise _invalid(key, qname, vhost, "{value_zero,0}")
            if n < 0:
                raise _invalid(key, qname, vhost, "{value_negative,%d}" % n)
        elif key == "x-max-age":
            parseMaxAge(v, qname, vhost)


_UNIT_SECONDS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"^([0-9]*)(.*)$", re.S)


class _Crash(Exception):
    """Where RabbitMQ 3.10 crashes (541 INTERNAL_ERROR) on a malformed value."""


def _duration(text):
    """Seconds (int) of a duration string ``<n><unit>``; None for a bad unit; _Crash without digits."""
    m = _DURATION.match(text)
    digits, unit = m.group(1), m.group(2)
    if not digits:
        raise _Crash(text)
    factor = _UNIT_SECONDS.get(unit)
    if factor is None:
        return None
    return int(digits) * factor


def parseMaxAge(value, qname, vhost):
    """
    ``x-max-age`` (a string such as ``7D``, ``10m``, ``30s``; units Y M D h
    m s as ``rabbit_amqqueue:check_max_age``) in seconds (int), or raise as
    RabbitMQ 3.10 answers (checked on the peer): 406 ``{unacceptable_type,
    signedint}`` for a non-string, 406 ``invalid_max_age`` for an unknown
    unit or zero, 541 INTERNAL_ERROR (connection) when no digits lead.
    """
    where = resourceText("queue", qname, vhost)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise preconditionFailed("invalid arg 'x-max-age' for %s: {unacceptable_type,%s}"
                                 % (where, fieldTypeName(value)))
    try:
        seconds = _duration(value)
    except _Crash:
        raise AMQPError.fromReplyText(541, "INTERNAL_ERROR")
    if not seconds:
        raise preconditionFailed("invalid arg 'x-max-age' for %s: invalid_max_age" % (where,))
    return seconds



def validateStreamDeclare(qname, vhost, durable, exclusive, autoDelete):
    """A stream's flags: the quorum queue's rules and texts (checked on the peer)."""
    validateQuorumDeclare(qname, vhost, durable, exclusive, autoDelete)


#: arguments compared on redeclare of a stream (rabbit_stream_queue, 3.10)
STREAM_EQUIVALENCE_ARGS = (
    "x-max-length-bytes",
    "x-queue-type",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
)


def _render(v):
    if type(v) is bool:
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _equivalent(a, b):
    if isInteger(a) and isInteger(b):
        return int(a) == int(b)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return type(a) is type(b) and a == b


def assertFlagEquivalence(kind, name, vhost, flag, received, current):
    """
    406 ``inequivalent arg 'durable' for queue 'Q' in vhost '/': received
    'true' but current is 'false'`` when a redeclare's flag differs.
    """
    if bool(received) != bool(current):
        raise preconditionFailed(
            "inequivalent arg '%s' for %s: received '%s' but current is '%s'"
            % (flag, resourceText(kind, name, vhost), _render(bool(received)), _render(bool(current)))
        )


def assertArgsEquivalence(kind, name, vhost, received, current, keys):
    """
    Compare the known arguments ``keys`` of a redeclare with the current
    ones; raise 406 with RabbitMQ's wording (rabbit_misc:assert_args_equivalence).
    ``x-queue-type`` absent is the same as ``classic`` (not as ``quorum``:
    ``received none but current is the value 'quorum' of type 'longstr'``).
    """
    for key in keys:
        r = received.get(key)
        c = current.get(key)
        if key == "x-queue-type" and (r is None or c is None) and "classic" in (r, c):
            continue
        if r is None and c is None:
            continue
        if r is not None and c is not None and _equivalent(r, c):
            continue
        where = resourceText(kind, name, vhost)
        if r is None:
            text = "received none but current is the value '%s' of type '%s'" % (
                _render(c),
                fieldTypeName(c),
            )
        elif c is None:
            text = "received the value '%s' of type '%s' but current is none" % (
                _render(r),
                fieldTypeName(r),
            )
        else:
            text = "received '%s' but current is '%s'" % (_render(r), _render(c))
        raise preconditionFailed("inequivalent arg '%s' for %s: %s" % (key, where, text))
