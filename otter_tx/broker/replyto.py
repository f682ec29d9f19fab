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
    The pseudo-queue one direct reply-to consumer reads.  It holds nothing,
    so it is an :class:`~otter_tx.broker.interfaces.IConsumerSource` only,
    not an ``IQueue``: a reply routed here (``VHost.route`` finds it by the
    token of ``amq.rabbitmq.reply-to.<token>``) goes straight to the
    consumer, whose deliveries are no-ack.
    """

    #: (Queue.typeCounts: counted with the classic queues, as RabbitMQ's direct reply-to)
    typeCounts = None

    def __init__(self, vhost):
        self.vhost = vhost
        self.name = REPLY_TO
        self.token = base64.urlsafe_b64encode(os.urandom(18)).decode()
        self.consumer = None

    @property
    def address(self):
        """The routing key replies use: ``amq.rabbitmq.reply-to.<token>``."""
        return REPLY_PREFIX + self.token

    def addConsumer(self, consumer, exclusive=False):
        """Register the reply consumer under this token (the only one, so ``exclusive`` changes nothing)."""
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

    def deliveredMessage(self, entry, get=False):
        """A reply goes out as it was published."""
        return entry.message

    def enqueue(self, message, now=None, redelivered=False):
        """
        Hand a reply straight to the consumer (``redelivered``: marked so;
        ``now``, the clock's time in ms, is not needed: a reply never expires
        here).
        Always True: a reply is never refused; with the consumer gone it is
        dropped, as RabbitMQ drops it.
        """
        c = self.consumer
        if c is not None:
            entry = QueueEntry(message, 0, None, 0)
            entry.redelivered = redelivered
            c.deliver(self, entry)
        return True
