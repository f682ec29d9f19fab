"""
The embedded durable store on one SQLite file (docs/storage.md).

:class:`SQLiteStore` (in :mod:`~otter_tx.store.sqlite.writer`: the writer
thread, retry and health) is the store; it keeps its changes in a pending
:mod:`~otter_tx.store.sqlite.batch` (plain code, no I/O), opens, migrates
and recovers the file with :mod:`~otter_tx.store.sqlite.schema` (which also
streams the recovered messages), and applies batches and cleans up with
:mod:`~otter_tx.store.sqlite.tables`.
"""

from otter_tx.store.sqlite.schema import STORE_FILENAME, resolvePath
from otter_tx.store.sqlite.writer import RETRY_DELAYS, SQLiteStore

__all__ = ["RETRY_DELAYS", "STORE_FILENAME", "SQLiteStore", "resolvePath"]
