"""
The service assembly: what puts the broker, its doors and its store together.

- :mod:`otter_tx.service.assembly`: :class:`OtterService`, the embeddable ``MultiService``
  (docs/embedding.md).
- :mod:`otter_tx.service.tap`: ``twistd ottermq``'s options, the TOML ``--config`` and
  ``makeService``.

``from otter_tx.service import OtterService`` is the documented import path and stays so.
"""
from otter_tx.service.assembly import OtterService

__all__ = ["OtterService"]
