"""
libc's ``writev`` through cffi, for PyPy: its ``socket.sendmsg`` and ``send`` copy
each buffer that is not ``bytes`` first (a memoryview of a mapped segment file:
0.35-0.42 s a GB against 0.16-0.19 this way, and CPython's ``sendmsg`` 0.15, in a
socketpair test; docs/performance.md, "Stored CRCs and mapped records").
``cffi.FFI.from_buffer`` hands the kernel the buffers' own memory.

:data:`WRITEV` is the function on PyPy (cffi is built in), None elsewhere
(CPython's ``sendmsg`` does not copy).
"""

import os
import sys

_CDEF = """
struct iovec { void *iov_base; size_t iov_len; };
ssize_t writev(int fd, const struct iovec *iov, int iovcnt);
"""


def makeWritev():
    """``writev(fd, buffers)``: the bytes written (int), OSError (BlockingIOError...) on failure; None without cffi."""
    try:
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        lib = ffi.dlopen(None)
    except Exception:
        return None
    new = ffi.new
    fromBuffer = ffi.from_buffer
    call = lib.writev

    def writev(fd, buffers):
        n = len(buffers)
        iov = new("struct iovec[]", n)
        # the cdata objects keep the buffers' memory while the call runs
        keep = [fromBuffer(b) for b in buffers]
        for i in range(n):
            iov[i].iov_base = keep[i]
            iov[i].iov_len = len(keep[i])
        written = call(fd, iov, n)
        if written < 0:
            e = ffi.errno
            # (OSError picks the subclass: EAGAIN is BlockingIOError, EINTR InterruptedError)
            raise OSError(e, os.strerror(e))
        return written

    return writev


WRITEV = makeWritev() if sys.implementation.name == "pypy" else None
