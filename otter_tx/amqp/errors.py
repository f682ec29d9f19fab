"""
AMQP errors raised by the broker core and turned into channel.close or
connection.close by the protocol.

Channel-level (soft) codes 311-313 and 403-406 close only the channel;
every other code closes the connection (AMQP 0-9-1 spec section 1.2,
RabbitMQ ``rabbit_channel.erl``).  Reply texts follow RabbitMQ:
``"<CONSTANT_NAME> - <text>"``.
"""

from otter_tx.amqp import spec


class AMQPError(Exception):
    """
    A protocol error to report to the peer.

    :ivar code: the AMQP reply code (int).
    :ivar text: the full reply text, ``"NOT_FOUND - no queue 'q' in vhost '/'"``.
    :ivar method: the method class that caused it, or ``None``.
    """

    #: the channel number of the frame that caused it (0: the connection),
    #: set by the wire engine
    channel = 0
    #: a short str for the log line only (what the decoder found wrong), or None
    detail = None

    def __init__(self, code, text, method=None):
        Exception.__init__(self, code, text)
        self.code = code
        self.text = "%s - %s" % (spec.REPLY_NAMES.get(code, "ERROR"), text)
        self.method = method

    @classmethod
    def fromReplyText(cls, code, replyText, method=None):
        """
        An error whose full reply text ``replyText`` (str, with its
        ``NOT_FOUND - `` prefix already) is given as is, e.g. one the
        broker already built for a connection.close.
        """
        error = cls.__new__(cls)
        Exception.__init__(error, code, replyText)
        error.code = code
        error.text = replyText
        error.method = method
        return error

    @property
    def channelLevel(self):
        """
        True when RabbitMQ closes only the channel for this code.
        """
        return self.code in spec.CHANNEL_LEVEL_CODES

    def __str__(self):
        return "%d %s" % (self.code, self.text)


def notFound(text):
    """404 NOT_FOUND (channel)."""
    return AMQPError(spec.NOT_FOUND, text)


def accessRefused(text):
    """403 ACCESS_REFUSED (channel, or connection during the handshake)."""
    return AMQPError(spec.ACCESS_REFUSED, text)


def resourceAccessRefused(kind, name, vhost, user):
    """
    403 ACCESS_REFUSED ``access to queue 'q' in vhost '/' refused for user
    'u'`` (``rabbit_access_control:check_resource_access``); the default
    exchange ``""`` is named ``amq.default``, as RabbitMQ shows it.
    """
    shown = "amq.default" if kind == "exchange" and name == "" else name
    return accessRefused("access to %s refused for user '%s'" % (resourceText(kind, shown, vhost), user))


def resourceLocked(text):
    """405 RESOURCE_LOCKED (channel)."""
    return AMQPError(spec.RESOURCE_LOCKED, text)


def preconditionFailed(text):
    """406 PRECONDITION_FAILED (channel)."""
    return AMQPError(spec.PRECONDITION_FAILED, text)


def notAllowed(text):
    """530 NOT_ALLOWED (connection)."""
    return AMQPError(spec.NOT_ALLOWED, text)


def notImplemented(text):
    """540 NOT_IMPLEMENTED (connection)."""
    return AMQPError(spec.NOT_IMPLEMENTED, text)


def commandInvalid(text):
    """503 COMMAND_INVALID (connection)."""
    return AMQPError(spec.COMMAND_INVALID, text)


def channelError(text):
    """504 CHANNEL_ERROR (connection)."""
    return AMQPError(spec.CHANNEL_ERROR, text)


def unexpectedFrame(text):
    """505 UNEXPECTED_FRAME (connection)."""
    return AMQPError(spec.UNEXPECTED_FRAME, text)


def frameError(text):
    """501 FRAME_ERROR (connection)."""
    return AMQPError(spec.FRAME_ERROR, text)


def syntaxError(text):
    """502 SYNTAX_ERROR (connection)."""
    return AMQPError(spec.SYNTAX_ERROR, text)


def internalError(text):
    """541 INTERNAL_ERROR (connection)."""
    return AMQPError(spec.INTERNAL_ERROR, text)


def resourceText(kind, name, vhost):
    """
    Render a resource as RabbitMQ names it in reply texts (its
    ``rabbit_misc:rs/1``): ``resourceText("queue", "q", "/")`` is
    ``queue 'q' in vhost '/'``.

    :param kind: ``"queue"`` or ``"exchange"`` (str).
    :param name: the resource's name (str).
    :param vhost: the virtual host's name (str).
    :return: str.
    """
    return "%s '%s' in vhost '%s'" % (kind, name, vhost)


def erlBinary(data, limit=300):
    """
    Render bytes as Erlang's ``~p`` prints a binary: ``<<"abc">>`` when
    printable, else ``<<0,20,0,10>>`` (RabbitMQ puts these in frame errors).

    :param limit: octets rendered at most (int); a longer ``data`` renders
        its first ``limit`` octets followed by ``...``, already more than a
        reply text can carry (:func:`replyText` cuts it), so a 100 KB frame
        never becomes a 400 KB string.
    """
    data = bytes(data[:limit + 1]) if len(data) > limit else bytes(data)
    if len(data) > limit:
        return "<<%s...>>" % ",".join(str(b) for b in data[:limit])
    if data and all(32 <= b < 127 for b in data):
        return '<<"%s">>' % data.decode("ascii").replace("\\", "\\\\").replace('"', '\\"')
    return "<<%s>>" % ",".join(str(b) for b in data)


#: octets of a frame RabbitMQ shows in a frame error (rabbit_reader:payload_snippet/1)
SNIPPET_OCTETS = 16

#: longest reply text on the wire: a short string (AMQP 0-9-1 section 4.2.5.3)
MAX_REPLY_TEXT = 255


def octetsSnippet(prefix, payload):
    """
    RabbitMQ's rendering of a bad frame's payload after ``prefix`` (the
    text on the same line, e.g. ``"type 2, "``): ``all octets = <<...>>``
    for up to 16 octets, else ``first 16 octets = <<...>>`` (rabbit_reader
    ``payload_snippet/1``), laid out as Erlang's ``~p`` does, which breaks
    a binary that would pass column 80 onto lines indented under its first
    element.

    :param prefix: str, the reply text before the snippet (without the
        ``FRAME_ERROR - `` name).
    :param payload: bytes of the frame payload.
    :return: ``prefix`` followed by the snippet (str).
    """
    if len(payload) <= SNIPPET_OCTETS:
        return "%sall octets = %s" % (prefix, erlBinary(payload))
    head = "%sfirst %d octets = " % (prefix, SNIPPET_OCTETS)
    data = bytes(payload[:SNIPPET_OCTETS])
    if all(32 <= b < 127 for b in data):
        return head + erlBinary(data)
    indent = len(head) + 2
    lines = []
    line = "<<"
    col = indent
    items = [str(b) for b in data]
    for i, item in enumerate(items):
        token = item + (">>" if i == len(items) - 1 else ",")
        if col + len(token) > 80 and line not in ("<<", ""):
            lines.append(line)
            line = ""
            col = indent
        line += token
        col += len(token)
    lines.append(line)
    return head + ("\n" + " " * indent).join(lines)


def replyText(text):
    """
    ``text`` cut as RabbitMQ cuts a reply text longer than a short string
    allows (``rabbit_binary_generator:amqp_exception_explanation/2``): the
    first 252 octets and ``...``.  Also bounds what a log line repeats.

    :param text: str, the full reply text.
    :return: str of at most 255 UTF-8 octets.
    """
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_REPLY_TEXT:
        return text
    return raw[: MAX_REPLY_TEXT - 3].decode("utf-8", "ignore") + "..."


def loggable(text):
    """
    ``text`` with undecodable bytes (kept as surrogates) shown as escapes,
    safe for log files.
    """
    if isinstance(text, str):
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
