"""Endpoint string plugin: ``ottertls:`` TLS server endpoints with client certificates (otter_tx.tls)."""
from otter_tx.tls import TLSServerParser

ottertls = TLSServerParser()
