"""Which wire a client speaks, told from the first frame it sends on a connection.

Wire v0 is JSON text on both channels (the JS SDK, our page and our Python client);
wire v1 is binary protobuf (the official Python SDK). Neither says which it is: a
connection's first inbound frame, on either channel, decides for the life of that
connection (a reconnect is a new connection and is told afresh). Text, or bytes that
begin like a JSON document, is v0; any other bytes are v1. Until the first frame the
server speaks v0, which every client that speaks first ignores or reads.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["Wire", "sniff"]

# What a JSON document may begin with once leading whitespace is skipped: a client
# that sends its JSON as a binary frame still speaks v0.
_JSON_OPENERS = (ord("{"), ord("["))
# JSON's own whitespace (RFC 8259): protobuf frames often begin with 0x0a (field 1,
# length-delimited), so only these four are skipped, not every ASCII space byte.
_JSON_SPACE = b" \t\r\n"


class Wire(enum.Enum):
    V0 = "v0"
    V1 = "v1"


def sniff(raw: Any) -> Wire:
    """The wire of a connection whose first inbound frame is `raw`."""
    if isinstance(raw, str):
        return Wire.V0
    if isinstance(raw, (bytes, bytearray, memoryview)):
        head = bytes(raw[:64]).lstrip(_JSON_SPACE)
        if head and head[0] in _JSON_OPENERS:
            return Wire.V0
        return Wire.V1
    return Wire.V0
