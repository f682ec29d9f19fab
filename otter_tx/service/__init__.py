"""
The service assembly: what puts the broker, its doors and its store together.

- :mod:`otter_tx.service.assembly`: :class:`OtterService`, the embeddable ``MultiService``
  (docs/embedding.md).
- :mod:`otter_tx.service.tap`: ``twistd ottermq``'s options, the TOML ``--config`` and
  ``makeService``.

``from otter_tx.service import OtterService`` is the documented import path and stays so, with the
start errors (``ListenFailed``, ``DataDirInUse``, ``StartError``) and ``raiseFileLimit`` that
docs/embedding.md names under ``otter_tx.service``.
"""
from otter_tx.service.assembly import (
    DataDirInUse,
    ListenFailed,
    OtterService,
    StartError,
    raiseFileLimit,
)

__all__ = ["DataDirInUse", "ListenFailed", "OtterService", "StartError", "raiseFileLimit"]
