"""
The store keys the broker's journal writes, defined once: which entity
lives under which key (:meth:`IMessageStore.putEntity
<otter_tx.store.interface.IMessageStore.putEntity>`) and which queue key
the message methods take.  Used by the journal
(:mod:`otter_tx.broker.durability`), the pre-start merge
(:mod:`otter_tx.broker.prestart`) and the delayed exchange
(:mod:`otter_tx.broker.delayed`).  The stores themselves treat keys as
opaque ``str``; changing a format here changes what an existing data
directory means.

Keys are names joined with NUL (:data:`SEP`).  Names may contain NUL (AMQP
short strings and RabbitMQ allow it), so records also carry the names they
were made from (``names``, or ``vhost`` for bindings) and recovery reads
those (:func:`names`).

==================  =================================================  ==================
kind                key                                                ``names``
==================  =================================================  ==================
vhost, user,        the name                                           (none)
global_parameter
permission          user NUL vhost                                     [user, vhost]
policy,             vhost NUL name                                     (the record has
operator_policy                                                        ``vhost``, ``name``)
exchange            vhost NUL name                                     [vhost, name]
queue               vhost NUL name                                     [vhost, name]
queue (delayed)     ``\\x01delayed`` NUL vhost NUL name: the held       ["", vhost, name]
                    messages of a durable x-delayed-message exchange
binding             vhost NUL source NUL ``queue``/``exchange`` NUL    (the record has
                    destination NUL routing key NUL arguments          ``vhost``)
==================  =================================================  ==================

A message is stored once under its ``storeId`` (``int``, the broker's
message id) and entered in queues by (queue key, storeId).
"""

#: the separator of the names joined in a key
SEP = "\x00"

#: first part of the pseudo-queue key of a delayed exchange's held messages
DELAYED_PREFIX = "\x01delayed"


def permissionKey(user, vhost):
    """The key of ``user``'s permissions in ``vhost`` (both ``str``)."""
    return user + SEP + vhost


def queueKey(vhost, name):
    """
    The key of queue ``name`` in ``vhost`` (both ``str``): ``vhost NUL
    name``; the ``queueKey`` of its messages too.  Exchanges and (operator)
    policies use the same form (:data:`exchangeKey`, :data:`policyKey`).
    """
    return vhost + SEP + name


#: ``exchangeKey(vhost, name)``: the key of a durable exchange (the form of :func:`queueKey`)
exchangeKey = queueKey

#: ``policyKey(vhost, name)``: the key of a policy or operator policy (the form of :func:`queueKey`)
policyKey = queueKey


def delayedKey(vhost, name):
    """
    The pseudo-queue key under which durable x-delayed-message exchange
    ``name`` of ``vhost`` keeps its held messages (its ``'queue'`` entity
    has ``{"delayedExchange": True}``).
    """
    return DELAYED_PREFIX + SEP + vhost + SEP + name


def delayedNames(vhost, name):
    """The ``names`` of a delayed pseudo-queue's record (one per part of :func:`delayedKey`)."""
    return ["", vhost, name]


def bindingKey(vhost, source, destinationKind, destination, routingKey, argumentsText):
    """
    The key of a binding: ``destinationKind`` is ``"queue"`` or
    ``"exchange"``; ``argumentsText`` the binding arguments as
    :func:`~otter_tx.broker.durability.tableToText` gives them.
    """
    return SEP.join((vhost, source, destinationKind, destination, routingKey, argumentsText))


def names(key, record, count):
    """
    The ``count`` names a store key was joined from: the record's
    ``names`` (written since names may contain NUL, which AMQP short strings
    and RabbitMQ allow), else the key split at its first ``count - 1`` NULs
    (records written before).
    """
    found = record.get("names")
    if isinstance(found, list) and len(found) == count:
        return found
    return key.split(SEP, count - 1)


def vhostOf(key, record):
    """The vhost of a policy or binding record: its ``vhost``, else the key's first part."""
    return record.get("vhost", key.split(SEP, 1)[0])
