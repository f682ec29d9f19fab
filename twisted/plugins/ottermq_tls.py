"""Endpoint string plugin: ``ottertls:`` TLS server endpoints with client certificates (otter_tx.door.tls)."""
from otter_tx.door.tls import TLSServerParser

ottertls = TLSServerParser()
