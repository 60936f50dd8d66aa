"""A connection's first frame tells its wire."""

import pytest

from reactor_serve.protocol.wire_version import Wire, sniff


@pytest.mark.parametrize("raw, wire", [
    ('{"scope":"runtime"}', Wire.V0),
    ("not json at all", Wire.V0),
    (b'{"scope":"runtime"}', Wire.V0),
    (b'  \n[1]', Wire.V0),
    (b"\x0a\x06data_1\x10\x01", Wire.V1),
    (b"\x52\x00", Wire.V1),
    (b"", Wire.V1),
    (b"\x00\xff", Wire.V1),
])
def test_sniff(raw, wire):
    assert sniff(raw) is wire
