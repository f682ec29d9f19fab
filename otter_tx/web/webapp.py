"""
The admin web app's static files (``otter_tx/web/static/``): a single-page
app in plain JavaScript (``index.html``, ``app.js``, ``app.css``) and the
vendored uPlot chart library (``vendor/uplot/``, its released files and
LICENSE).  No build step and nothing fetched at run time: the files ship in
the package (``package_data`` in setup.cfg) and the management app serves
them at ``GET /`` and ``GET /static/{path}``; the page then talks to the
JSON API (``/api/...``) with HTTP Basic credentials.  docs/management.md
("The admin web app") describes the pages.

Caching: every answer carries an ``ETag`` (the file's size and mtime) and
``cache-control: no-cache`` (the browser revalidates, a ``304`` when
unchanged), except ``vendor/`` (released files that change only with a
new package version: ``max-age=86400``).
"""

import os

#: the static files' directory inside the package
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")

#: the page's Content-Security-Policy: its own scripts only, no inline or
#: foreign code, the API on its own origin; inline styles for the
#: histogram bars and the chart library
CONTENT_SECURITY_POLICY = (
    b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

#: content types by file extension (anything else: 404)
CONTENT_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".png": b"image/png",
    ".svg": b"image/svg+xml",
    ".ico": b"image/x-icon",
    ".json": b"application/json",
    "": b"text/plain; charset=utf-8",  # LICENSE, README
}


def staticFile(relative):
    """
    ``(path, content type)`` of the static file ``relative`` (a str like
    ``"app.js"`` or ``"vendor/uplot/LICENSE"``, ``/``-separated), or None
    when there is no such file or the path leaves the static directory
    (``..``, absolute, hidden or empty segments, an unknown extension).
    """
    parts = relative.split("/")
    if not relative or any(not p or p.startswith(".") or "\\" in p or "\x00" in p for p in parts):
        return None
    path = os.path.join(STATIC_DIR, *parts)
    ctype = CONTENT_TYPES.get(os.path.splitext(parts[-1])[1])
    if ctype is None or not os.path.isfile(path):
        return None
    return path, ctype


def serveFile(request, relative):
    """
    Write static file ``relative`` to ``request``: its bytes (200), an
    empty ``304`` when ``If-None-Match`` names the current ``ETag``, or
    None when there is no such file (the caller answers 404).
    """
    found = staticFile(relative)
    if found is None:
        return None
    path, ctype = found
    st = os.stat(path)
    etag = ('"%x-%x"' % (st.st_size, int(st.st_mtime))).encode("ascii")
    request.setHeader(b"etag", etag)
    request.setHeader(b"cache-control",
                      b"public, max-age=86400" if relative.startswith("vendor/") else b"no-cache")
    request.setHeader(b"x-content-type-options", b"nosniff")
    if request.getHeader(b"if-none-match") == etag:
        request.setResponseCode(304)
        return b""
    request.setHeader(b"content-type", ctype)
    with open(path, "rb") as f:
        return f.read()
