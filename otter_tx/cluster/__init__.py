"""
The cluster: what lets several otter_tx nodes act as one broker (issue 21, docs/cluster.md).

Metadata and membership live in etcd, reached through :mod:`otter_tx.cluster.etcd`, a small client
over treq and etcd's v3 JSON gateway. :mod:`otter_tx.cluster.etcdtest` starts real ``etcd`` processes
on loopback ports for the tests and for a local cluster launcher.

The package sits over ``broker/`` in the floors of docs/architecture.md; for now its modules import
only the standard library, Twisted, treq and each other (``otter_tx/test/unit/test_layers.py``).
"""
