"""Endpoint string plugin: ``otterreuse:`` TCP server endpoints with SO_REUSEPORT (otter_tx.door.reuseport)."""
from otter_tx.door.reuseport import ReusePortParser

otterreuse = ReusePortParser()
