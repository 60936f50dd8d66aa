"""`guard_sctp_packets`: a packet aiortc would read for ever never reaches it; one that
breaks its read is dropped; the transport's own end still ends it."""

import asyncio
import random
import struct
import subprocess
import sys

import pytest
from aiortc.rtcsctptransport import crc32c

from reactor_serve.rtc.sctp_guard import guard_sctp_packets, sctp_packets_dropped


def sctp(*chunks):
    body = b"".join(struct.pack("!BBH", t, 0, 4 + len(v)) + v + bytes(-len(v) % 4) for t, v in chunks)
    header = struct.pack("!HHL", 5000, 5000, 0)
    return header + struct.pack("<L", crc32c(header + b"\0\0\0\0" + body)) + body


class Transport:
    """Stands in for aiortc's RTCSctpTransport: the packet read the guard wraps."""

    def __init__(self, fail_with=None):
        self.fail_with = fail_with
        self.handled = []

    async def _handle_data(self, data):
        self.handled.append(data)
        if self.fail_with is not None:
            raise self.fail_with


ZERO = struct.pack("!HH", 1, 0) + bytes(4)


@pytest.mark.parametrize("packet", [
    sctp((6, ZERO)),  # ABORT
    sctp((9, ZERO)),  # ERROR
    sctp((4, ZERO)),  # HEARTBEAT
    sctp((5, ZERO)),  # HEARTBEAT ACK
    sctp((130, ZERO)),  # RE-CONFIG
    sctp((1, bytes(16) + ZERO)),  # INIT, after its fixed fields
    sctp((2, bytes(16) + ZERO)),  # INIT ACK
    sctp((0, bytes(12)), (6, struct.pack("!HH", 1, 8) + bytes(4) + ZERO)),  # a second chunk's second cause
    sctp((6, struct.pack("!HH", 1, 3))),  # shorter than its own header
    sctp((6, struct.pack("!HH", 1, 64))),  # past its chunk
])
def test_a_parameter_aiortc_would_loop_on_or_overrun_never_reaches_it(packet):
    transport = Transport()
    guard_sctp_packets(transport)
    asyncio.run(transport._handle_data(packet))
    assert transport.handled == []
    assert sctp_packets_dropped(transport) == 1


def test_well_formed_packets_pass_and_broken_reads_are_dropped():
    transport = Transport()
    guard_sctp_packets(transport)
    good = [sctp((6, struct.pack("!HH", 1, 8) + bytes(4))), sctp((0, bytes(12))), sctp((4, struct.pack("!HH", 1, 6) + b"ab"))]
    for packet in good:
        asyncio.run(transport._handle_data(packet))
    assert transport.handled == good and sctp_packets_dropped(transport) == 0

    failing = Transport(fail_with=struct.error("unpack_from requires a buffer"))
    guard_sctp_packets(failing)
    asyncio.run(failing._handle_data(good[0]))
    assert sctp_packets_dropped(failing) == 1

    closing = Transport(fail_with=ConnectionError("gone"))
    guard_sctp_packets(closing)
    with pytest.raises(ConnectionError):
        asyncio.run(closing._handle_data(good[0]))


# Reads each packet (hex, one a line) with aiortc's own parse, under a memory cap: a
# parameter list it loops on appends until the cap, so the child fails instead of the
# test process.
_PARSE_ALL = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from aiortc.rtcsctptransport import parse_packet
for line in sys.stdin:
    try:
        parse_packet(bytes.fromhex(line.strip()))
    except MemoryError:
        raise
    except Exception:
        pass  # refused or broken: the guard drops those after the fact
print("parsed")
"""


def test_whatever_the_guard_lets_through_aiortc_parses_to_an_end():
    rng = random.Random(34)
    passed = []
    for _ in range(3000):
        chunks = []
        for _ in range(rng.randrange(1, 4)):
            kind = rng.choice([0, 1, 2, 3, 4, 5, 6, 9, 130, 192, rng.randrange(256)])
            value = b"".join(
                struct.pack("!HH", rng.randrange(8), rng.choice([0, 1, 4, 6, 8, rng.randrange(40)]))
                + rng.randbytes(rng.randrange(8))
                for _ in range(rng.randrange(0, 4))
            )
            chunks.append((kind, (bytes(16) if kind in (1, 2) else b"") + value))
        packet = sctp(*chunks)
        transport = Transport()
        guard_sctp_packets(transport)
        asyncio.run(transport._handle_data(packet))
        if transport.handled:
            passed.append(packet.hex())
    assert len(passed) > 100
    child = subprocess.run(
        [sys.executable, "-c", _PARSE_ALL], input="\n".join(passed), capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 0 and child.stdout.strip() == "parsed", child.stderr[-2000:]
