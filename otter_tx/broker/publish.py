"""
The publish pipeline, the one way a message enters the broker from a
client (an AMQP ``basic.publish`` or the HTTP app's ``/publish``):

1. :func:`publishTarget`: write permission on the exchange (403), the
   exchange exists (404), it is not internal (403);
2. :func:`prepareMessage`: the ``user_id`` property equals the user (406),
   sender-selected routing (``CC`` / ``BCC`` headers, ``BCC`` removed), the
   direct reply-to rewrite of ``reply_to`` (406 ``fast reply consumer does
   not exist`` without one);
3. routing: :meth:`VHost.publish <otter_tx.broker.vhost.VHost.publish>`
   routes it to the exchange's queues and returns the outcome, ``(routed,
   rejected)``: the number of queues it reached (0: unroutable, a mandatory
   publish is returned 312 NO_ROUTE) and whether a queue at its
   ``reject-publish`` limit refused it (a confirm is then basic.nack);
   the Session calls it directly, on the hot path.

Errors are :class:`~otter_tx.amqp.errors.AMQPError` with RabbitMQ's
reply codes and texts (``rabbit_channel``'s ``basic.publish``); the caller
sets the method and maps them to its door (channel.close, HTTP status).
"""

from otter_tx.amqp import codec, spec
from otter_tx.amqp.errors import AMQPError, resourceText
from otter_tx.broker.access import WRITE
from otter_tx.broker.delayed import COMMAND
from otter_tx.broker.replyto import REPLY_TO


def checkPublish(access, exchangeName):
    """
    The check of a publish to ``exchangeName`` (str) that needs neither
    the exchange nor the message: 403 ``access to exchange 'X' in vhost 'V'
    refused for user 'U'`` unless the user of ``access`` (an
    :class:`~otter_tx.broker.access.Access`) has write permission on it.
    A door that reads the message later (the HTTP ``/publish``) runs it
    first, then :func:`checkedPublishTarget`.
    """
    access.check(WRITE, "exchange", exchangeName)


def publishTarget(vhost, access, exchangeName):
    """
    The Exchange ``exchangeName`` (str) of ``vhost`` that the user of
    ``access`` (an :class:`~otter_tx.broker.access.Access`) may publish to:
    :func:`checkPublish`, then :func:`checkedPublishTarget`, written inline
    (the publish hot path).

    Errors: 403 ``access to exchange 'X' in vhost 'V' refused for user 'U'``;
    404 ``no exchange 'X' in vhost 'V'``; 403 ``cannot publish to internal
    exchange 'X' in vhost 'V'``.
    """
    access.check(WRITE, "exchange", exchangeName)
    ex = vhost.exchanges.get(exchangeName)
    if ex is None or ex.internal:
        _refuseTarget(vhost, exchangeName, ex)
    return ex


def checkedPublishTarget(vhost, exchangeName):
    """
    :func:`publishTarget` once :func:`checkPublish` has passed: the
    Exchange ``exchangeName`` (str) of ``vhost``; 404 ``no exchange 'X' in
    vhost 'V'``; 403 ``cannot publish to internal exchange 'X' in vhost 'V'``.
    """
    ex = vhost.exchanges.get(exchangeName)
    if ex is None or ex.internal:
        _refuseTarget(vhost, exchangeName, ex)
    return ex


def _refuseTarget(vhost, exchangeName, ex):
    """Raise the refusal of a publish to ``ex`` (None: missing, else internal)."""
    if ex is None:
        raise AMQPError(spec.NOT_FOUND, "no %s" % (resourceText("exchange", exchangeName, vhost.name),))
    raise AMQPError(
        spec.ACCESS_REFUSED,
        "cannot publish to internal %s" % (resourceText("exchange", exchangeName, vhost.name),),
    )


def prepareMessage(message, userName, replyTo=None):
    """
    Apply the property rules to ``message`` (a broker Message), in place.

    :param userName: the authenticated user's name (str); a ``user_id``
        property naming anyone else is 406 ``user_id property set to 'X' but
        authenticated user was 'U'``.
    :param replyTo: the publisher's direct reply-to pseudo-queue
        (:class:`~otter_tx.broker.replyto.ReplyToQueue`) or None; a
        ``reply_to`` of ``amq.rabbitmq.reply-to`` is rewritten to its
        address, and is 406 ``fast reply consumer does not exist`` when
        there is no reply consumer.

    A message with an ``x-delayed-command`` header records ``userName``
    as its ``commandUser`` (:meth:`DelayedExchange.runCommand
    <otter_tx.broker.delayed.DelayedExchange.runCommand>`).

    ``CC`` and ``BCC`` headers (lists of str) add routing keys
    (``message.extraKeys``); ``BCC`` is removed from the delivered headers
    (https://www.rabbitmq.com/docs/sender-selected).
    """
    props = message.props
    if not props:
        return
    uid = props.get("user_id")
    if uid is not None and uid != userName:
        raise AMQPError(
            spec.PRECONDITION_FAILED,
            "user_id property set to '%s' but authenticated user was '%s'" % (uid, userName),
        )
    headers = props.get("headers")
    if headers and ("CC" in headers or "BCC" in headers):
        _senderSelected(message, headers)
    if headers and COMMAND in headers:
        # the user a delayed exchange runs the command as (docs/delayed.md)
        message.commandUser = userName
    if props.get("reply_to") == REPLY_TO:
        if replyTo is None or replyTo.consumer is None:
            raise AMQPError(spec.PRECONDITION_FAILED, "fast reply consumer does not exist")
        props = dict(message.props)
        props["reply_to"] = replyTo.address
        message.props = props
        message.propsRaw = codec.encodeProperties(props)


def _senderSelected(message, headers):
    extra = []
    for key in ("CC", "BCC"):
        v = headers.get(key)
        if isinstance(v, list):
            extra.extend(k for k in v if isinstance(k, str))
    message.extraKeys = extra or None
    if "BCC" in headers:
        props = dict(message.props)
        h = dict(headers)
        del h["BCC"]
        props["headers"] = h
        message.props = props
        message.propsRaw = codec.encodeProperties(props)

