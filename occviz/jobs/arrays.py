"""PostgreSQL arrays in the binary wire format, built without a Python call per element.

The event recorder sends each batch as one array per column. As text, every number
costs a str() call (about 270 ns here); in the binary format an integer array is the
values packed by `array` and laid out with strided copies, about 50 ns an element.

Binary format of a one-dimensional array: five int32 (dimensions, has-nulls flag,
element type OID, length, lower bound), then each element as an int32 byte length
followed by its bytes, all big-endian. Elements here are never NULL: a nullable column
travels with NONE in place of NULL, and the INSERT puts NULL back (`array_replace`).
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Iterable, Sequence

# Stands for NULL in transit: no counter value, version or time reaches it.
NONE = -(2**63)

# element type OIDs, and the array typecode of the same width
INT4, INT8, TEXT = 23, 20, 25
_TYPECODES = {INT4: "i", INT8: "q"}
# the OIDs of the array types themselves, for the statement's parameter types
ARRAY_OIDS = {INT4: 1007, INT8: 1016, TEXT: 1009}

_HEADER = struct.Struct(">iiiii")
_LENGTH = struct.Struct(">i")


def with_none(values: Iterable[int | None]) -> list[int]:
    """`values` with NONE for each None."""
    return [NONE if value is None else value for value in values]


def int_array(values: Sequence[int], element_oid: int) -> bytes:
    """An int4[] or int8[] parameter (no NULL elements: see `with_none`)."""
    packed = array.array(_TYPECODES[element_oid], values)
    if sys.byteorder == "little":
        packed.byteswap()
    raw = packed.tobytes()
    size, count = packed.itemsize, len(packed)
    slot = 4 + size  # the element's length, then the element
    body = bytearray(slot * count)
    body[3::slot] = bytes([size]) * count  # lengths: 0, 0, 0, size
    for byte in range(size):
        body[4 + byte :: slot] = raw[byte::size]
    return _HEADER.pack(1, 0, element_oid, count, 1) + body


def text_array(values: Sequence[str], encoded: dict[str, bytes]) -> bytes:
    """A text[] parameter of words from a small vocabulary; `encoded` caches each word's length and bytes."""
    for word in set(values) - encoded.keys():
        data = word.encode()
        encoded[word] = _LENGTH.pack(len(data)) + data
    return _HEADER.pack(1, 0, TEXT, len(values), 1) + b"".join(map(encoded.__getitem__, values))
