"""
End-to-end tests of the broker as a whole on the real reactor: restarts of
the in-process broker on a real data dir, a damaged store, a full disk,
``twistd ottermq`` processes (SIGKILL, bad options, the ready line), the
SQLite store killed mid-write, the service embedded on ``tcp:0``.
"""
