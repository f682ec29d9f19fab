"""
The message log: persistent messages in per-queue append-only segment
files (:mod:`~otter_tx.store.log.segments`), durable entities in SQLite
(:class:`~otter_tx.store.log.store.LogStore`).  See ``docs/storage.md``.
"""

from otter_tx.store.log.store import LogStore

__all__ = ["LogStore"]
