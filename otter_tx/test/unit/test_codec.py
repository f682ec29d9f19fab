"""
Tests for otter_tx.amqp.codec and spec: field tables with RabbitMQ's errata
tags, method arguments and content-header properties.
"""

from decimal import Decimal

from twisted.trial.unittest import SynchronousTestCase

from otter_tx.amqp import codec, spec
from otter_tx.amqp.codec import ByteArray, FrameSyntaxError, TaggedFloat, TaggedInt, Timestamp


class FieldTableTests(SynchronousTestCase):
    """Field tables decode and re-encode losslessly."""

    def roundTrip(self, table):
        data = codec.encodeTable(table)
        (n,) = codec._unpack_I(data, 0)
        self.assertEqual(n, len(data) - 4)
        return codec.decodeTable(data, 4, 4 + n)

    def test_allTypesRoundTrip(self):
        """Every supported field type survives encode/decode with its type."""
        table = {
            "bool": True,
            "int8": TaggedInt(-5, "b"),
            "uint8": TaggedInt(200, "B"),
            "int16": TaggedInt(-300, "s"),
            "uint16": TaggedInt(60000, "u"),
            "int32": 123456,
            "uint32": TaggedInt(4000000000, "i"),
            "int64": 2**40,
            "float": TaggedFloat(1.5),
            "double": 2.25,
            "decimal": Decimal("3.14"),
            "str": "héllo",
            "bytes": ByteArray(b"\x00\x01"),
            "ts": Timestamp(1700000000),
            "table": {"x": 1},
            "array": [1, "a", [2]],
            "void": None,
        }
        out = self.roundTrip(table)
        self.assertEqual(out, table)
        for k, v in table.items():
            self.assertIs(type(out[k]), type(v), k)
        self.assertEqual(out["int16"].tag, "s")

    def test_shortIsSigned16(self):
        """The 's' tag is a signed 16-bit integer (RabbitMQ errata), not a short string."""
        data = b"\x01ks\xff\xfe"
        self.assertEqual(codec.decodeTable(data, 0, len(data)), {"k": -2})

    def test_uint64DecodesSigned(self):
        """'L' decodes as a signed 64-bit value, as RabbitMQ does."""
        data = b"\x01kL" + b"\xff" * 8
        self.assertEqual(codec.decodeTable(data, 0, len(data))["k"], -1)

    def test_unknownTagIsSyntaxError(self):
        """An unknown type tag raises FrameSyntaxError."""
        data = b"\x01kZ\x00"
        self.assertRaises(FrameSyntaxError, codec.decodeTable, data, 0, len(data))

    def test_truncatedIsSyntaxError(self):
        """A table claiming more bytes than present raises FrameSyntaxError."""
        data = b"\x01kS\x00\x00\x00\x10ab"
        self.assertRaises(FrameSyntaxError, codec.decodeTable, data, 0, len(data))

    def test_fieldTypeNames(self):
        """RabbitMQ's type names are used in error texts."""
        self.assertEqual(codec.fieldTypeName(1), "signedint")
        self.assertEqual(codec.fieldTypeName("a"), "longstr")
        self.assertEqual(codec.fieldTypeName(2**40), "long")
        self.assertEqual(codec.fieldTypeName(True), "bool")
        self.assertEqual(codec.fieldTypeName(1.0), "double")


class MethodTests(SynchronousTestCase):
    """Method classes encode and decode their arguments."""

    def test_bitsPacked(self):
        """Consecutive bit fields share one octet."""
        m = spec.QueueDeclare(0, "q", False, True, True, False, True, {})
        payload = m.encode()
        back = spec.QueueDeclare.decode(payload, 4)
        self.assertEqual(back, m)
        # reserved short, shortstr 'q', one bit octet, empty table
        self.assertEqual(len(payload), 4 + 2 + 2 + 1 + 4)

    def test_allMethodsRoundTrip(self):
        """Every method class round-trips with default values."""
        for cls in spec.METHODS.values():
            m = cls()
            self.assertEqual(cls.decode(m.encode(), 4), m, cls.NAME)

    def test_truncatedArgs(self):
        """Truncated method arguments raise FrameSyntaxError."""
        self.assertRaises(FrameSyntaxError, spec.BasicPublish.decode, b"\x00\x3c\x00\x28\x00", 4)


class PropertiesTests(SynchronousTestCase):
    """Basic content-header properties."""

    def test_roundTrip(self):
        """All fourteen basic properties survive encode/decode."""
        props = {
            "content_type": "text/plain",
            "content_encoding": "gzip",
            "headers": {"a": 1},
            "delivery_mode": 2,
            "priority": 5,
            "correlation_id": "c",
            "reply_to": "r",
            "expiration": "100",
            "message_id": "m",
            "timestamp": 1700000000,
            "type": "t",
            "user_id": "guest",
            "app_id": "app",
            "cluster_id": "cl",
        }
        self.assertEqual(codec.decodeProperties(codec.encodeProperties(props)), props)

    def test_empty(self):
        """No properties encode as a zero flags word."""
        self.assertEqual(codec.encodeProperties({}), b"\x00\x00")
        self.assertEqual(codec.decodeProperties(b"\x00\x00"), {})
