"""
HTTP requests whose body is checked before it is read: the management
listeners' :class:`~twisted.web.server.Site`.

twisted.web's :class:`~twisted.web.http.Request` stores a whole body (in
memory below 100 000 bytes, else in a temporary file) before anything
renders, so without this module anyone who can reach the management port
could write a body of any size to disk before its 401.  A
:class:`BodyGuardRequest` decides as soon as the headers are complete
(:meth:`~BodyGuardRequest.gotLength`), for a request that announces a body
(``Content-Length`` above 0, or ``Transfer-Encoding: chunked``):

- credentials first, by the management app's own check (Basic against the
  broker's users, the loopback rule, a management tag: what every
  authenticated route checks first, :meth:`ManagementApp.authenticateRequest
  <otter_tx.web.management.ManagementApp.authenticateRequest>`); a request
  that fails gets that check's 401 at once;
- then the size: a ``Content-Length`` above the cap (``maxBodySize``
  bytes, RabbitMQ's ``management.http.max_body_size``, 20 MiB by default)
  gets 400 ``{"error":"bad_request","reason":"Exceeded HTTP request body
  size limit"}`` (RabbitMQ 3.12+'s answer, ``rabbit_mgmt_util``) at once,
  and a chunked body the moment its decoded bytes pass the cap.

A refused request's body is never stored: the answer carries
``Connection: close``, the connection is closed once it is written, and
whatever body bytes still arrive are dropped.  Requests without a body
(``GET``, a ``DELETE`` or ``POST`` with ``Content-Length: 0``) are left to
the routes, which answer as before (404 and the ``OPTIONS`` pre-flight need
no credentials).  https://www.rabbitmq.com/docs/management#http-body-size-limit

The request line.  The credentials check needs the method and the path
(the loopback rule and RabbitMQ's answers depend on them), but at
``gotLength`` time twisted.web's :class:`~twisted.web.http.Request` has
neither: :class:`~twisted.web.http.HTTPChannel` keeps the request line in
``_command``, ``_path`` and ``_version`` until the body is complete and only
then calls ``requestReceived``; Twisted offers no public way to them.  So
:func:`_requestLine` reads those three private attributes, with no
fallback: if a Twisted release renames them, every request with a body
fails with ``AttributeError`` instead of being checked as ``GET /``, and
``test_request.TwistedRequestLineTests`` fails on that release.

The Prometheus listener.  It takes no credentials (as
``rabbitmq_prometheus``) and serves only ``GET``, so there a body is never
stored at all: :class:`NoBodySite` answers a request that announces one as
soon as its headers are complete, by its resource's own rule (404 for an
unknown path, 405 for another method; ``PrometheusResource.refusal``), with
``Connection: close``; a ``GET`` it serves has its body dropped as it
arrives.  Without it a ``POST /metrics`` of any size was written in full to
a temporary file before its 405.
"""

from io import BytesIO

from twisted.web.http import HTTPChannel
from twisted.web.server import Request, Site

from otter_tx.web.management.http import TOO_LARGE_REASON, badRequest, renderError

#: RabbitMQ's default ``management.http.max_body_size``: 20 MiB, in bytes
DEFAULT_MAX_BODY_SIZE = 20971520

#: RabbitMQ's ``reason`` for a body over the cap (``rabbit_mgmt_util:bad_request``)


def _requestLine(channel):
    """
    ``(method, uri, version)`` (bytes) of the request whose headers
    ``channel`` has just read.  Private Twisted attributes of
    :class:`~twisted.web.http.HTTPChannel`, read on purpose; see the module
    docstring ("The request line").  An HTTP/2 ``H2Stream`` (only with the
    optional ``h2`` package) names them publicly.
    """
    if isinstance(channel, HTTPChannel):
        return channel._command, channel._path, channel._version
    return channel.command, channel.path, b"HTTP/2"


class _EarlyAnswerRequest(Request):
    """
    A :class:`~twisted.web.server.Request` that may be answered as soon as
    its headers are complete, before its body: :meth:`_refuse` writes the
    answer and closes the connection, and the body bytes that still arrive
    are counted and dropped.

    :ivar bodyBytes: body bytes received so far (int), refused or not.
    :ivar refused: the status (int) this request was answered with before
        its body was read, or None.
    """

    bodyBytes = 0
    refused = None

    def requestReceived(self, command, path, version):
        """Render as usual, unless the request was already answered."""
        if self.refused is None:
            Request.requestReceived(self, command, path, version)

    def _headersRead(self):
        """Take the request line from the channel (it is not set on the request before the body)."""
        self.method, self.uri, self.clientproto = _requestLine(self.channel)
        self.content = BytesIO()  # stays empty if refused; replaced by the caller if not

    def _refuse(self, body):
        """Answer with the status and headers set on this request and ``body`` (bytes), then close."""
        self.refused = self.code
        # no "100 Continue" after the answer (HTTPChannel sends one after gotLength)
        self.requestHeaders.removeHeader(b"expect")
        self.setHeader(b"content-length", b"%d" % (len(body),))
        self.setHeader(b"connection", b"close")
        self.write(body)
        self.channel.loseConnection()


class BodyGuardRequest(_EarlyAnswerRequest):
    """
    A :class:`~twisted.web.server.Request` that refuses a body before
    storing it: no credentials (401) or too large (400), as the module
    docstring says.  Its :class:`BodyGuardSite` (``self.channel.site``)
    supplies the check and the cap.

    :ivar authenticatedUser: the broker :class:`~otter_tx.broker.access.User`
        the site's check logged in before the body was read (set by that
        check), or None; the route's own check
        (:func:`otter_tx.web.management.authz.authenticate`) reuses it
        rather than logging in twice.
    """

    authenticatedUser = None

    def gotLength(self, length):
        """
        Called by the channel once the headers are complete; ``length`` is
        the ``Content-Length`` (int) or None for a chunked body.  Check the
        credentials and the announced size before any body byte is stored.
        """
        if length == 0:
            Request.gotLength(self, length)
            return
        site = self.channel.site
        self._headersRead()
        body = site.authenticate(self)
        if body is not None:
            self._refuse(body)
        elif length is not None and length > site.maxBodySize:
            self._refuseTooLarge()
        else:
            Request.gotLength(self, length)

    def handleContentChunk(self, data):
        """Store ``data`` (bytes of body) unless refused; refuse once the body passes the cap."""
        self.bodyBytes += len(data)
        if self.refused is not None:
            return
        if self.bodyBytes > self.channel.site.maxBodySize:
            self._refuseTooLarge()
            return
        Request.handleContentChunk(self, data)

    def _refuseTooLarge(self):
        self._refuse(renderError(self, badRequest(TOO_LARGE_REASON)))


class BodyGuardSite(Site):
    """
    The management listeners' :class:`~twisted.web.server.Site`: every
    request is a :class:`BodyGuardRequest`.

    :param resource: the root resource (the management app's).
    :param authenticate: ``authenticate(request) -> None | bytes``: None
        when the request's headers carry acceptable credentials (it then
        sets ``request.authenticatedUser``), else the
        answer's body, with its status and headers already set on
        ``request`` (:meth:`ManagementApp.authenticateRequest
        <otter_tx.web.management.ManagementApp.authenticateRequest>`).
    :param maxBodySize: largest request body, bytes (int, at least 1);
        RabbitMQ's ``management.http.max_body_size``, default
        :data:`DEFAULT_MAX_BODY_SIZE`.
    """

    requestFactory = BodyGuardRequest

    def __init__(self, resource, authenticate, maxBodySize=DEFAULT_MAX_BODY_SIZE, **kwargs):
        Site.__init__(self, resource, requestFactory=BodyGuardRequest, **kwargs)
        self.authenticate = authenticate
        self.maxBodySize = maxBodySize


class NoBodyRequest(_EarlyAnswerRequest):
    """
    A request of a listener whose routes take no body (:class:`NoBodySite`):
    one that announces a body is answered at once by the site's resource's
    ``refusal(method, path)`` (404, 405) and closed, or, when the resource
    would serve it (a ``GET`` with a body), served with its body dropped as
    it arrives.  No body byte is ever stored.
    """

    def gotLength(self, length):
        """The headers are complete (``length``: the Content-Length, None for chunked); decide before the body."""
        if length == 0:
            Request.gotLength(self, length)
            return
        self._headersRead()
        refused = self.channel.site.resource.refusal(self.method, self.uri.split(b"?", 1)[0])
        if refused is not None:
            code, headers, body = refused
            self.setResponseCode(code)
            for name, value in headers:
                self.setHeader(name, value)
            self._refuse(body)

    def handleContentChunk(self, data):
        """Count ``data`` (bytes of body) and drop it."""
        self.bodyBytes += len(data)


class NoBodySite(Site):
    """
    The Prometheus listener's :class:`~twisted.web.server.Site`: every
    request is a :class:`NoBodyRequest`.

    :param resource: the root resource; it has ``refusal(method, path)``
        -> ``(code, [(header, value)], body)`` or None, the answer it gives
        whatever the body (:meth:`PrometheusResource.refusal
        <otter_tx.web.metrics.PrometheusResource.refusal>`).
    """

    requestFactory = NoBodyRequest

    def __init__(self, resource, **kwargs):
        Site.__init__(self, resource, requestFactory=NoBodyRequest, **kwargs)
