"""
libc's ``writev``, ``pwritev`` and ``memmove`` (and zlib-ng's ``crc32``) through cffi, for PyPy, where
Python's own I/O and slicing copy, and every large string costs the garbage
collector (a major collection marks the whole heap, 60-80 MB in a running
broker, each time about its size was allocated again; docs/performance.md,
"The stream protocol's publish path on PyPy"):

- PyPy's ``socket.sendmsg`` and ``send`` copy each buffer that is not
  ``bytes`` first (a memoryview of a mapped segment file: 0.35-0.42 s a GB
  against 0.16-0.19 through :func:`makeWritev`, and CPython's ``sendmsg``
  0.15, in a socketpair test; docs/performance.md, "Stored CRCs and mapped
  records");
- PyPy 3.9 has no ``os.pwritev``: a commit of many parts is joined into one
  new string before its ``pwrite`` unless :func:`makePwritev` writes it;
- the stream door moves a publish frame's entries together in its receive
  buffer (:func:`makeCompact`), so the log writes them from where they were
  received: no copy, no string.

``cffi.FFI.from_buffer`` hands the C function the buffers' own memory; on
PyPy it copies a ``bytes`` first, and the first time a ``bytearray``'s
(moving it out of the garbage collector's way), so these are for buffers
that live a while: a receive buffer, a mapped file.  Each name is None where
cffi is not built in (CPython, whose ``sendmsg`` and ``os.pwritev`` do not
copy).
"""

import functools
import os
import sys

_CDEF = """
struct iovec { void *iov_base; size_t iov_len; };
ssize_t writev(int fd, const struct iovec *iov, int iovcnt);
ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, long offset);
unsigned long zng_crc32_z(unsigned long crc, const unsigned char *buf, size_t len);
"""


@functools.lru_cache(maxsize=None)
def _ffi():
    """``(ffi, libc)``: one FFI for every function here (its declarations parsed once), or (None, None)."""
    try:
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        lib = ffi.dlopen(None)
    except Exception:
        return None, None
    return ffi, lib


def _iovecs(ffi, buffers):
    """
    ``(iovec array, the cdata keeping the buffers' memory)`` for ``buffers``;
    :func:`_release` the cdata after the call (an export of a memoryview left
    to the garbage collector can meet it in a cycle: CPython then crashes).
    """
    n = len(buffers)
    iov = ffi.new("struct iovec[]", n)
    keep = [ffi.from_buffer(b) for b in buffers]
    for i in range(n):
        iov[i].iov_base = keep[i]
        iov[i].iov_len = len(keep[i])
    return iov, keep


def _release(ffi, keep):
    for k in keep:
        ffi.release(k)


def _raise(ffi):
    e = ffi.errno
    # (OSError picks the subclass: EAGAIN is BlockingIOError, EINTR InterruptedError)
    raise OSError(e, os.strerror(e))


def makeWritev():
    """``writev(fd, buffers)``: the bytes written (int), OSError (BlockingIOError...) on failure; None without cffi."""
    ffi, lib = _ffi()
    if ffi is None:
        return None
    call = lib.writev

    def writev(fd, buffers):
        iov, keep = _iovecs(ffi, buffers)
        try:
            written = call(fd, iov, len(buffers))
            if written < 0:
                _raise(ffi)
        finally:
            _release(ffi, keep)
        return written

    return writev


def makePwritev():
    """
    ``pwritev(fd, buffers, offset)`` as ``os.pwritev`` (at most IOV_MAX, 1024,
    buffers): the bytes written (int), OSError on failure; None without cffi.
    """
    ffi, lib = _ffi()
    if ffi is None:
        return None
    call = lib.pwritev

    def pwritev(fd, buffers, offset):
        iov, keep = _iovecs(ffi, buffers)
        try:
            written = call(fd, iov, len(buffers), offset)
            if written < 0:
                _raise(ffi)
        finally:
            _release(ffi, keep)
        return written

    return pwritev


def makeCompact(crc32):
    """
    ``compact(buf, runs, size)``: the runs ``buf[a:b]`` for each ``(a, b)`` of
    ``runs`` (a flat list ``[a0, b0, a1, b1, ...]``, ascending, apart) moved
    down with ``memmove`` to lie one after another from ``a0`` (``buf``, a
    writable memoryview, is changed), then ``(a memoryview of those size
    bytes of buf, their crc32)`` (``size``: the runs' total length).  A publish frame's
    entries without their publishing ids, not copied out.  None without cffi.
    """
    ffi, lib = _ffi()
    if ffi is None:
        return None
    fromBuffer = ffi.from_buffer
    memmove = ffi.memmove

    def compact(buf, runs, size):
        with fromBuffer(buf) as p:
            o = runs[0]
            for i in range(0, len(runs), 2):
                a = runs[i]
                k = runs[i + 1] - a
                if a != o:
                    memmove(p + o, p + a, k)
                o += k
        view = buf[runs[0]:o]
        return view, crc32(view)

    return compact


def makeCrc32(library):
    """
    ``crc32(data, value=0)`` as ``zlib.crc32``, by zlib-ng's ``zng_crc32_z``
    in the shared object ``library`` (the ``zlib_ng`` package's extension
    module exports it) through cffi; None without cffi or that function.
    PyPy's: calling the extension module's own ``crc32`` with a memoryview
    goes through cpyext, which keeps the memory of the object viewed for
    good (a 1 MiB bytearray's each call, in a loop here: the broker's memory
    grew by every byte published).
    """
    ffi, lib = _ffi()
    if ffi is None:
        return None
    try:
        call = ffi.dlopen(library).zng_crc32_z
    except Exception:
        return None
    fromBuffer = ffi.from_buffer

    def crc32(data, value=0):
        with fromBuffer(data) as p:
            return call(value, p, len(p))

    return crc32


_PYPY = sys.implementation.name == "pypy"
WRITEV = makeWritev() if _PYPY else None
PWRITEV = makePwritev() if _PYPY else None

