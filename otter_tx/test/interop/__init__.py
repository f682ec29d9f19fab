"""
Interop tests: real AMQP clients (pika, aio-pika, kombu, amqplib in ``node/``,
amqp091-go in ``go/``, raw sockets) against a broker, by default otter_tx
started in-process on ``tcp:0``, or the broker named by
``OTTER_TEST_AMQP_URL`` (CI runs this whole package against RabbitMQ too, so
the tests encode real RabbitMQ behaviour).  ``support`` is the shared harness.
The module names keep their ``test_interop_`` prefix.
"""
