"""
The RabbitMQ stream protocol's wire (no Twisted, no broker imports; checked
by test_layers): frames, commands, response codes (wire.py), the OSIRIS chunk
format (chunk.py) and the AMQP 1.0 message encoding stream messages use
(amqp10.py). The Twisted door is otter_tx.door.stream.
"""
