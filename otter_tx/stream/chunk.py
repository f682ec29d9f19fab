"""
The OSIRIS chunk format a Deliver frame carries (osiris_log.erl, the chunk
header's 48 bytes, then the entries, no bloom filter, no trailer):

    Magic:4 Version:4  ChunkType:8  NumEntries:16  NumRecords:32
    Timestamp:64 (ms)  Epoch:64  ChunkFirstOffset:64  ChunkCrc:32 (crc32 of the data)
    DataLength:32  TrailerLength:32  BloomSize:8  Reserved:24
    entries: 0:1 Size:31 Data   (a simple entry; sub-entry batches are not written)

Pure: no Twisted, no broker.
"""

import struct
import zlib

MAGIC_VERSION = 0x50  # magic 5, version 0
CHUNK_USER = 0
HEADER = struct.Struct(">BBHIqQQIIIBBH")
HEADER_SIZE = HEADER.size  # 48
_I = struct.Struct(">I")


def entries(messages):
    """The data section for ``messages`` (bytes each): size-prefixed simple entries."""
    pack = _I.pack
    return b"".join([pack(len(m)) + m for m in messages])


def header(firstOffset, count, timestamp, data, crc=None, epoch=1, size=None):
    """
    The 48-byte header of a user chunk of ``count`` simple entries ``data``
    (with ``crc`` and ``size`` given, ``data`` is not needed).
    """
    if crc is None:
        crc = zlib.crc32(data)
    return HEADER.pack(MAGIC_VERSION, CHUNK_USER, count, count, timestamp, epoch, firstOffset,
                       crc, len(data) if size is None else size, 0, 0, 0, 0)


def split(data, count):
    """The messages of ``count`` simple entries ``data`` (list of bytes)."""
    out = []
    p = 0
    unpack = _I.unpack_from
    for _ in range(count):
        (size,) = unpack(data, p)
        out.append(data[p + 4:p + 4 + size])
        p += 4 + size
    return out


def chunk(firstOffset, messages, timestamp, epoch=1):
    """One user chunk of ``messages`` (list of bytes) starting at ``firstOffset``."""
    data = entries(messages)
    n = len(messages)
    header = HEADER.pack(MAGIC_VERSION, CHUNK_USER, n, n, timestamp, epoch, firstOffset,
                         zlib.crc32(data), len(data), 0, 0, 0, 0)
    return header + data


def parse(data):
    """
    ``(firstOffset, timestamp, messages)`` of one chunk (tests, benchmarks);
    simple entries only. Raises ValueError on a bad CRC.
    """
    (mv, ctype, nEntries, nRecords, ts, epoch, first, crc, dlen, tlen, bloom, _r1, _r2) = \
        HEADER.unpack_from(data, 0)
    body = data[HEADER_SIZE + bloom:HEADER_SIZE + bloom + dlen]
    if zlib.crc32(body) != crc:
        raise ValueError("chunk crc")
    out = []
    p = 0
    for _ in range(nEntries):
        (size,) = _I.unpack_from(body, p)
        if size & 0x80000000:
            raise ValueError("sub-entry batch")
        out.append(bytes(body[p + 4:p + 4 + size]))
        p += 4 + size
    return first, ts, out
