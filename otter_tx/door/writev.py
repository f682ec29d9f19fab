"""
libc's ``writev`` through cffi, for PyPy's socket writes
(:mod:`otter_tx.store.rawio`, where it lives with ``pwritev``).

:data:`WRITEV` is the function on PyPy (cffi is built in), None elsewhere
(CPython's ``sendmsg`` does not copy).
"""

from otter_tx.store.rawio import WRITEV, makeWritev

__all__ = ["WRITEV", "makeWritev"]
