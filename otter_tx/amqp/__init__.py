"""AMQP 0-9-1 wire level: spec constants and method classes, codec, errors (no Twisted)."""
