"""
Exchanges and their routing: direct, fanout, topic, headers (AMQP 0-9-1
spec section 3.1.3; RabbitMQ's x-match any/all/any-with-x/all-with-x from
https://www.rabbitmq.com/tutorials/amqp-concepts#exchange-headers).

A binding destination is a :class:`~otter_tx.broker.queue.Queue` or an
:class:`Exchange` (exchange-to-exchange bindings, a RabbitMQ extension).
``route(message)`` returns the destinations one exchange selects; the vhost
follows exchange destinations and alternate exchanges.
"""

import re

from zope.interface import implementer

from otter_tx.broker.arguments import frozenArguments
from otter_tx.broker.interfaces import IExchangeType


class _BindingSet:
    """
    Common binding bookkeeping: ``{(destination, key, argsKey): arguments}``.
    """

    def __init__(self):
        self._all = {}

    def bindings(self):
        for (d, k, _), args in list(self._all.items()):
            yield d, k, args

    def __len__(self):
        return len(self._all)

    def _addRecord(self, destination, routingKey, arguments):
        rec = (destination, routingKey, frozenArguments(arguments))
        if rec in self._all:
            return None
        self._all[rec] = arguments or {}
        return rec

    def _removeRecord(self, destination, routingKey, arguments):
        rec = (destination, routingKey, frozenArguments(arguments))
        if rec not in self._all:
            return None
        del self._all[rec]
        return rec

    def removeDestination(self, destination):
        n = 0
        for d, k, args in list(self.bindings()):
            if d is destination:
                self.remove(d, k, args)
                n += 1
        return n


@implementer(IExchangeType)
class DirectRouting(_BindingSet):
    """
    ``direct``: exact routing-key match; a dict lookup per key.
    """

    name = "direct"

    def __init__(self):
        _BindingSet.__init__(self)
        self._byKey = {}

    def add(self, destination, routingKey, arguments):
        if self._addRecord(destination, routingKey, arguments) is None:
            return False
        d = self._byKey.setdefault(routingKey, {})
        d[destination] = d.get(destination, 0) + 1
        return True

    def remove(self, destination, routingKey, arguments):
        if self._removeRecord(destination, routingKey, arguments) is None:
            return False
        d = self._byKey[routingKey]
        d[destination] -= 1
        if not d[destination]:
            del d[destination]
        if not d:
            del self._byKey[routingKey]
        return True

    def route(self, message, keys, out):
        byKey = self._byKey
        for k in keys:
            d = byKey.get(k)
            if d:
                out.update(d)


@implementer(IExchangeType)
class FanoutRouting(_BindingSet):
    """
    ``fanout``: every bound destination, keys ignored.
    """

    name = "fanout"

    def __init__(self):
        _BindingSet.__init__(self)
        self._dests = {}

    def add(self, destination, routingKey, arguments):
        if self._addRecord(destination, routingKey, arguments) is None:
            return False
        self._dests[destination] = self._dests.get(destination, 0) + 1
        return True

    def remove(self, destination, routingKey, arguments):
        if self._removeRecord(destination, routingKey, arguments) is None:
            return False
        self._dests[destination] -= 1
        if not self._dests[destination]:
            del self._dests[destination]
        return True

    def route(self, message, keys, out):
        out.update(self._dests)


def topicMatches(pattern, key):
    """
    AMQP topic match: words split on ``.``; ``*`` matches exactly one word,
    ``#`` zero or more (RabbitMQ ``rabbit_exchange_type_topic``).
    """
    return _topicRegex(pattern).fullmatch(_topicKey(key)) is not None


_regexCache = {}


def _topicRegex(pattern):
    """
    Compile a topic pattern to a regex over ``"." + key`` (``""`` for the
    empty key, which has no words, as in RabbitMQ).
    """
    r = _regexCache.get(pattern)
    if r is None:
        words = pattern.split(".") if pattern else []
        segs = []
        for w in words:
            if w == "#":
                if segs and segs[-1] is None:
                    continue  # '#.#' is '#'
                segs.append(None)
            elif w == "*":
                segs.append(r"\.[^.]*")
            else:
                segs.append(r"\." + re.escape(w))
        r = re.compile("".join(r"(?:\.[^.]*)*" if s is None else s for s in segs), re.S)
        if len(_regexCache) > 10000:
            _regexCache.clear()
        _regexCache[pattern] = r
    return r


def _topicKey(key):
    return "." + key if key else ""


class _TopicNode:
    """One word position of the topic trie."""

    __slots__ = ("children", "star", "hash", "dests")

    def __init__(self):
        self.children = {}
        self.star = None
        self.hash = None
        self.dests = None  # {pattern: {destination: count}} of patterns ending here


def _patternWords(pattern):
    words = pattern.split(".") if pattern else []
    out = []
    for w in words:
        if w == "#" and out and out[-1] == "#":
            continue  # '#.#' matches what '#' matches
        out.append(w)
    return out


@implementer(IExchangeType)
class TopicRouting(_BindingSet):
    """
    ``topic``: pattern bindings with ``*`` (one word) and ``#`` (zero or
    more words).  Exact patterns are a dict lookup; wildcard patterns live
    in a trie of words, as in RabbitMQ's ``rabbit_exchange_type_topic``, so
    routing costs grow with the key's words, not with the number of bindings.
    """

    name = "topic"

    def __init__(self):
        _BindingSet.__init__(self)
        self._exact = {}
        self._wild = {}  # pattern -> {dest: n}
        self._root = _TopicNode()

    def add(self, destination, routingKey, arguments):
        if self._addRecord(destination, routingKey, arguments) is None:
            return False
        words = routingKey.split(".")
        if "*" in words or "#" in words:
            d = self._wild.get(routingKey)
            if d is None:
                d = self._wild[routingKey] = {}
                node = self._node(routingKey, create=True)
                if node.dests is None:
                    node.dests = {}
                node.dests[routingKey] = d
        else:
            d = self._exact.setdefault(routingKey, {})
        d[destination] = d.get(destination, 0) + 1
        return True

    def _node(self, pattern, create=False):
        node = self._root
        for w in _patternWords(pattern):
            if w == "*":
                nxt = node.star
                if nxt is None and create:
                    nxt = node.star = _TopicNode()
            elif w == "#":
                nxt = node.hash
                if nxt is None and create:
                    nxt = node.hash = _TopicNode()
            else:
                nxt = node.children.get(w)
                if nxt is None and create:
                    nxt = node.children[w] = _TopicNode()
            if nxt is None:
                return None
            node = nxt
        return node

    def remove(self, destination, routingKey, arguments):
        if self._removeRecord(destination, routingKey, arguments) is None:
            return False
        wild = routingKey in self._wild
        table = self._wild if wild else self._exact
        d = table[routingKey]
        d[destination] -= 1
        if not d[destination]:
            del d[destination]
        if not d:
            del table[routingKey]
            if wild:
                node = self._node(routingKey)
                del node.dests[routingKey]
                if not node.dests:
                    node.dests = None
                    self._prune()
        return True

    def _prune(self):
        def empty(node):
            for k, child in list(node.children.items()):
                if empty(child):
                    del node.children[k]
            if node.star is not None and empty(node.star):
                node.star = None
            if node.hash is not None and empty(node.hash):
                node.hash = None
            return not node.children and node.star is None and node.hash is None and not node.dests

        empty(self._root)

    def route(self, message, keys, out):
        for k in keys:
            d = self._exact.get(k)
            if d:
                out.update(d)
            if self._wild:
                words = k.split(".") if k else []
                found = []
                self._match(self._root, words, 0, found, set())
                for dests in found:
                    out.update(dests)

    def _match(self, node, words, i, found, seen):
        key = (id(node), i)
        if key in seen:
            return
        seen.add(key)
        n = len(words)
        if i == n:
            if node.dests:
                found.extend(node.dests.values())
        else:
            child = node.children.get(words[i])
            if child is not None:
                self._match(child, words, i + 1, found, seen)
            if node.star is not None:
                self._match(node.star, words, i + 1, found, seen)
        h = node.hash
        if h is not None:
            # '#' swallows zero or more words
            for j in range(i, n + 1):
                self._match(h, words, j, found, seen)


def headersMatch(bindingArgs, headers):
    """
    Headers-exchange match of binding arguments against message headers.
    ``x-match`` is ``all`` (default), ``any``, ``all-with-x`` or
    ``any-with-x``; keys starting ``x-`` are ignored unless ``-with-x``.
    A binding value of void (None) matches on presence alone.
    """
    xmatch = bindingArgs.get("x-match", "all")
    if isinstance(xmatch, bytes):
        xmatch = xmatch.decode()
    withX = xmatch.endswith("-with-x")
    anyMode = xmatch.startswith("any")
    headers = headers or {}
    matched = False
    for k, v in bindingArgs.items():
        if k == "x-match" or (not withX and k.startswith("x-")):
            continue
        if k in headers and (v is None or _valueEq(headers[k], v)):
            if anyMode:
                return True
            matched = True
        elif not anyMode:
            return False
    return matched if anyMode else True


def _valueEq(a, b):
    if isinstance(a, bytes):
        a = a.decode("utf-8", "surrogateescape")
    if isinstance(b, bytes):
        b = b.decode("utf-8", "surrogateescape")
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return a == b


@implementer(IExchangeType)
class HeadersRouting(_BindingSet):
    """
    ``headers``: matches message headers against binding arguments.
    """

    name = "headers"

    def add(self, destination, routingKey, arguments):
        return self._addRecord(destination, routingKey, arguments) is not None

    def remove(self, destination, routingKey, arguments):
        return self._removeRecord(destination, routingKey, arguments) is not None

    def route(self, message, keys, out):
        headers = message.headers
        for (dest, _, _), args in self._all.items():
            if dest not in out and headersMatch(args, headers):
                out.add(dest)


#: exchange type name -> routing table factory
EXCHANGE_TYPES = {
    "direct": DirectRouting,
    "fanout": FanoutRouting,
    "topic": TopicRouting,
    "headers": HeadersRouting,
}


class Exchange:
    """
    One exchange.

    :ivar name: str (``""`` is the default exchange).
    :ivar type: the type name (str).
    :ivar routing: the :class:`IExchangeType` table.
    :ivar alternate: the ``alternate-exchange`` argument (str) or None.
    """

    #: True for x-delayed-message exchanges (otter_tx.broker.delayed)
    delayed = False

    def __init__(self, vhost, name, type, durable, autoDelete, internal, arguments):
        self.vhost = vhost
        self.name = name
        self.type = type
        self.durable = durable
        self.autoDelete = autoDelete
        self.internal = internal
        self.arguments = arguments or {}
        self.routing = EXCHANGE_TYPES[type]()
        ae = self.arguments.get("alternate-exchange")
        self.alternate = ae if isinstance(ae, str) and ae else None
        self.deleted = False
        self.inboundCount = 0  # bindings where this exchange is the destination
        #: messages that reached this exchange and were routed somewhere or
        #: offered to its alternate exchange (a message unroutable from the
        #: published-to exchange with no alternate is not counted)
        self.publishIn = 0
        #: messages this exchange routed onwards to at least one queue or exchange
        #: (RabbitMQ's ``message_stats.publish_out``)
        self.publishOut = 0

    def __repr__(self):
        return "<Exchange %r %s>" % (self.name, self.type)

    def hasBindings(self):
        """True if this exchange is the source of any binding."""
        return len(self.routing) > 0


def isExchange(destination):
    """
    Whether a binding ``destination`` is an exchange (an :class:`Exchange`
    or a subclass, such as the x-delayed-message exchange); any other
    destination is a queue (any ``IQueue``).  The one test of a
    destination's kind: :meth:`VHost.route
    <otter_tx.broker.vhost.VHost.route>` writes it as a frozenset lookup
    for speed.
    """
    return isinstance(destination, Exchange)


def destinationKind(destination):
    """
    A binding destination's kind as the store keys and records and
    ``GET /api/bindings``'s ``destination_type`` name it: ``"queue"`` or
    ``"exchange"`` (:func:`isExchange`).
    """
    return "exchange" if isExchange(destination) else "queue"
