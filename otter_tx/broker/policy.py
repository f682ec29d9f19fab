"""
Policies: named, pattern-matched settings for queues (RabbitMQ
https://www.rabbitmq.com/docs/parameters#policies).

Supported definition keys: ``message-ttl`` (ms), ``expires`` (ms),
``dead-letter-exchange``, ``dead-letter-routing-key``, ``max-length``,
``max-length-bytes``, ``overflow``, ``delivery-limit`` (quorum queues only:
docs/quorum.md), ``max-age`` and ``stream-max-segment-size-bytes`` (streams:
docs/streams.md, with ``max-length-bytes``); the ``ha-*`` mirroring keys are accepted
without effect (:data:`HA_KEYS`).  The highest-priority policy whose
``pattern`` (a regular expression) matches the queue name applies.  Queue
arguments beat the policy for the dead-letter keys and ``overflow``;
numeric keys (``delivery-limit`` too) take the lower of argument and policy (RabbitMQ
``rabbit_amqqueue_process:process_args_policy``, ``res_arg`` / ``res_min``).
"""

import re

from otter_tx.broker.arguments import OVERFLOW_MODES, QUORUM, _Crash, _duration, isInteger, queueType
from otter_tx.broker.queue import QueueSettings

POLICY_KEYS = {
    "message-ttl",
    "expires",
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "max-length",
    "max-length-bytes",
    "overflow",
    "delivery-limit",
    # streams (docs/streams.md)
    "max-age",
    "stream-max-segment-size-bytes",
    # where a new queue of a cluster lives (docs/cluster.md)
    "queue-leader-locator",
}

#: RabbitMQ 3.10's queue-leader-locator values (random and least-leaders are its older names of balanced)
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")


#: classic mirroring keys: accepted and without effect, as on a single
#: RabbitMQ node (there is nothing to mirror to)
HA_KEYS = frozenset({
    "ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size",
    "ha-promote-on-shutdown", "ha-promote-on-failure",
})


def haKeys(definition):
    """The :data:`HA_KEYS` in policy ``definition`` (dict), sorted."""
    return sorted(k for k in definition if k in HA_KEYS)


class PolicyError(ValueError):
    """
    An invalid policy; the message is RabbitMQ's validation text.
    """


#: the ``apply-to`` values RabbitMQ 3.10 accepts (``classic_queues``,
#: ``quorum_queues`` and ``streams`` came with 3.12; 3.10 refuses them,
#: checked on the peer)
APPLY_TO = ("queues", "exchanges", "all")


def checkPolicy(pattern, definition, priority=0, applyTo="all"):
    """
    The one validation of a policy, for the HTTP API, a definitions import
    and ``--config``: :class:`PolicyError` with RabbitMQ 3.10's text
    (``rabbit_policy:validate``; the HTTP API shows it after ``Validation
    failed``), checked in RabbitMQ's order: priority, apply-to, pattern,
    definition (:func:`validateDefinition`).

    :param pattern: a regular expression (str).  :param definition: dict.
    :param priority: int.  :param applyTo: one of :data:`APPLY_TO`.
    :returns: the compiled pattern.
    """
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PolicyError('priority should be a number, actually was <<"%s">>' % (priority,))
    if applyTo not in APPLY_TO:
        raise PolicyError("apply-to '%s' unrecognised; should be 'queues', 'exchanges' or 'all'" % (applyTo,))
    if not isinstance(pattern, str):
        raise PolicyError("pattern should be a string")
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise PolicyError('pattern should be regular expression but is invalid: {"%s",%s}' % (e.msg, e.pos or 0))
    if not isinstance(definition, dict):
        raise PolicyError("no policy provided")
    validateDefinition(definition)
    return regex


class Policy:
    """
    :param name: str.  :param pattern: regex (str) matched against names.
    :param definition: dict of policy keys.  :param priority: int.
    :param applyTo: ``queues``, ``exchanges`` or ``all``.
    :raises PolicyError: for unknown keys or invalid values
        (:func:`checkPolicy`).
    """

    def __init__(self, name, pattern, definition, priority=0, applyTo="all", vhost="/"):
        self.regex = checkPolicy(pattern, definition, priority, applyTo)
        self.name = name
        self.pattern = pattern
        self.definition = dict(definition)
        self.priority = priority
        self.applyTo = applyTo
        self.vhost = vhost

    def asDict(self):
        """The RabbitMQ HTTP API shape of this policy."""
        return {
            "vhost": self.vhost,
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.applyTo,
            "definition": self.definition,
            "priority": self.priority,
        }


def validateDefinition(d):
    """
    Check policy definition keys and values with RabbitMQ's texts
    (rabbit_policies:validate_policy0).
    """
    if not d:
        raise PolicyError("no policy provided")
    for k, v in d.items():
        if k in HA_KEYS:
            continue
        if k not in POLICY_KEYS:
            raise PolicyError("[{<<\"%s\">>,%r}] are not recognised policy settings" % (k, v))
        if k == "message-ttl" and not (isInteger(v) and v >= 0):
            raise PolicyError("%s is not a valid message TTL" % (v,))
        if k == "expires" and not (isInteger(v) and v >= 1):
            raise PolicyError("%s is not a valid queue expiry" % (v,))
        if k == "max-length" and not (isInteger(v) and v >= 0):
            raise PolicyError("%s is not a valid maximum length" % (v,))
        if k == "max-length-bytes" and not (isInteger(v) and v >= 0):
            raise PolicyError("%s is not a valid maximum length in bytes" % (v,))
        if k in ("dead-letter-exchange", "dead-letter-routing-key") and not isinstance(v, str):
            raise PolicyError("%s is not a valid %s" % (v, k.replace("-", " ")))
        if k == "delivery-limit" and not (isInteger(v) and v >= 0):
            raise PolicyError("%s is not a valid delivery limit"
                              % ('<<"%s">>' % (v,) if isinstance(v, str) else v,))
        if k == "max-age" and not (isinstance(v, str) and _validAge(v)):
            raise PolicyError("%s is not a valid max age" % (_erl(v),))
        if k == "stream-max-segment-size-bytes" and not (isInteger(v) and v >= 0):
            raise PolicyError("%s is not a valid segment size" % (_erl(v),))
        if k == "queue-leader-locator" and v not in LEADER_LOCATORS:
            raise PolicyError("%s is not a valid queue leader locator value" % (_erl(v),))
        if k == "overflow" and v not in OVERFLOW_MODES:
            raise PolicyError('"%s" is not a valid overflow value' % (v,))


def _erl(v):
    """A policy value as RabbitMQ prints it in a validation text (strings as ``<<"v">>``)."""
    return '<<"%s">>' % (v,) if isinstance(v, str) else v


def _validAge(text):
    try:
        return bool(_duration(text))
    except _Crash:
        return False


#: the keys an operator policy may set (RabbitMQ 3.10's, but
#: ``max-in-memory-*``, which have no effect on one node)
OPERATOR_POLICY_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit")


class OperatorPolicy(Policy):
    """
    An operator policy (``/api/operator-policies``): as :class:`Policy`, but
    only :data:`OPERATOR_POLICY_KEYS`, and merged with the user policy by
    :func:`mergeOperatorPolicy` instead of replacing it.
    """

    def __init__(self, name, pattern, definition, priority=0, applyTo="all", vhost="/"):
        if isinstance(definition, dict):  # else checkPolicy's "no policy provided"
            checkOperatorKeys(definition)
        Policy.__init__(self, name, pattern, definition, priority, applyTo, vhost)


def checkOperatorKeys(definition):
    """
    PolicyError ``[{<<"k">>,v}] are not recognised policy settings`` for a key not in
    :data:`OPERATOR_POLICY_KEYS`.
    """
    for k, v in dict(definition).items():
        if k not in OPERATOR_POLICY_KEYS:
            raise PolicyError("[{<<\"%s\">>,%s}] are not recognised policy settings"
                              % (k, '<<"%s">>' % (v,) if isinstance(v, str) else v))


class _Merged:
    """The definition a queue gets from its policy and operator policy together."""

    def __init__(self, definition):
        self.definition = definition


def mergeOperatorPolicy(policy, operatorPolicy):
    """
    The effective definition holder (``.definition``) of ``policy`` and
    ``operatorPolicy`` (either None), as RabbitMQ's
    ``rabbit_policy:merge_policy_value``: for a key both set the lower
    value wins, otherwise whichever sets it.  None when neither applies.
    """
    if operatorPolicy is None:
        return policy
    merged = dict(policy.definition) if policy is not None else {}
    for k, v in operatorPolicy.definition.items():
        merged[k] = min(merged[k], v) if k in merged else v
    return _Merged(merged)


def matchPolicy(policies, name, kind):
    """
    The highest-priority policy in ``policies`` matching ``name`` for
    ``kind`` (``queues`` or ``exchanges``), or None.  Names starting with
    ``amq.`` are matched too, as in RabbitMQ.
    """
    best = None
    for p in policies:
        if p.applyTo not in ("all", kind):
            continue
        if p.regex.search(name) is None:
            continue
        if best is None or p.priority > best.priority:
            best = p
    return best


def _min(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def effectiveSettings(arguments, policy, defaultDeliveryLimit=None):
    """
    Combine queue ``arguments`` and ``policy`` (or None) into QueueSettings.
    For a quorum queue (RabbitMQ 3.10 ``rabbit_quorum_queue``):
    ``reject-publish-dlx`` acts as ``drop-head``,
    ``x-dead-letter-strategy: at-least-once`` holds only with
    ``reject-publish`` overflow (else at-most-once), and with neither
    argument nor policy the delivery limit is ``defaultDeliveryLimit``
    (int or None: the broker's ``--default-delivery-limit``; RabbitMQ 4.x
    gives 20, 3.10 none).  A non-integer ``x-delivery-limit`` is no limit,
    as on 3.10.
    """
    s = QueueSettings()
    d = policy.definition if policy is not None else {}

    def argInt(key):
        v = arguments.get(key)
        return int(v) if isInteger(v) else None

    s.messageTtl = _min(argInt("x-message-ttl"), d.get("message-ttl"))
    s.expires = _min(argInt("x-expires"), d.get("expires"))
    s.maxLength = _min(argInt("x-max-length"), d.get("max-length"))
    s.maxLengthBytes = _min(argInt("x-max-length-bytes"), d.get("max-length-bytes"))
    dlx = arguments.get("x-dead-letter-exchange")
    if isinstance(dlx, str):
        s.dlx = dlx
        dlrk = arguments.get("x-dead-letter-routing-key")
        s.dlrk = dlrk if isinstance(dlrk, str) else d.get("dead-letter-routing-key")
    else:
        s.dlx = d.get("dead-letter-exchange")
        dlrk = arguments.get("x-dead-letter-routing-key")
        s.dlrk = dlrk if isinstance(dlrk, str) else d.get("dead-letter-routing-key")
    ov = arguments.get("x-overflow")
    s.overflow = ov if isinstance(ov, str) else d.get("overflow", "drop-head")
    s.deliveryLimit = argInt("x-delivery-limit")
    if queueType(arguments) == QUORUM:
        # the policy key is for quorum queues (RabbitMQ's); a classic queue
        # takes a limit from its own argument only (our extension), so a
        # policy written for quorum queues does not change classic ones
        s.deliveryLimit = _min(s.deliveryLimit, d.get("delivery-limit"))
        if s.deliveryLimit is None:
            s.deliveryLimit = defaultDeliveryLimit
        if s.overflow == "reject-publish-dlx":
            s.overflow = "drop-head"
        if arguments.get("x-dead-letter-strategy") == "at-least-once" and s.overflow == "reject-publish":
            s.dlStrategy = "at-least-once"
    return s
