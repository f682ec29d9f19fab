"""
Direct reply-to (https://www.rabbitmq.com/docs/direct-reply-to): RPC
clients consume from the pseudo-queue ``amq.rabbitmq.reply-to`` with no-ack,
publish requests with ``reply_to = "amq.rabbitmq.reply-to"`` (rewritten by
the broker to ``amq.rabbitmq.reply-to.<token>``), and the server's reply,
published to the default exchange with that routing key, goes straight to
the consumer without a queue.
"""

import base64
import os

from zope.interface import implementer

from otter_tx.broker.interfaces import IConsumerSource
from otter_tx.broker.queue import QueueEntry

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_TO + "."


@implementer(IConsumerSource)
class ReplyToQueue:
    """
    The pseudo-queue one direct reply-to consumer reads; it has the small
    part of the Queue interface a channel uses for its consumers
    (:class:`~otter_tx.broker.interfaces.IConsumerSource`).
    """

    #: message rates: deliveries flagged redelivered (never, here)
    redeliverCount = 0

    def __init__(self, vhost):
        self.vhost = vhost
        self.name = REPLY_TO
        self.token = base64.urlsafe_b64encode(os.urandom(18)).decode()
        self.consumer = None

    @property
    def address(self):
        """The routing key replies use: ``amq.rabbitmq.reply-to.<token>``."""
        return REPLY_PREFIX + self.token

    def addConsumer(self, consumer):
        """Register the reply consumer under this token."""
        self.consumer = consumer
        self.vhost.replyTo[self.token] = self

    def removeConsumer(self, consumer):
        """Forget the token: later replies are unroutable."""
        if self.vhost.replyTo.get(self.token) is self:
            del self.vhost.replyTo[self.token]
        self.consumer = None

    def dispatch(self):
        """Nothing is ever queued here."""
        pass

    def requeue(self, entries, dispatch=True):
        """Replies are no-ack: nothing to requeue."""
        pass

    def deliver(self, message):
        """Hand a reply straight to the consumer; False if it is gone."""
        c = self.consumer
        if c is None:
            return False
        c.deliver(self, QueueEntry(message, 0, None, 0))
        return True
