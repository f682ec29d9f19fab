"""Cluster tests: several nodes in one process on a shared metadata stand-in, and real etcd with real processes."""
