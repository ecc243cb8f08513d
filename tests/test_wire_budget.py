"""What a header may cost to decode (issue 29, Low 6): msgpack's per-container limits
alone let 1 MiB of empty maps become ~72 MiB of Python objects; decoding counts the
lists and maps it builds and refuses a header past the budget, so the worst 1 MiB
header stays within a bound while every legitimate header decodes as before."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from zmqrl.bus import wire

MIB = 1 << 20


def _header_of(item: bytes) -> bytes:
    """A ~1 MiB msgpack array of arrays of 65,535 copies of ``item``."""
    per = 65535
    inner = b"\xdc" + per.to_bytes(2, "big") + item * per
    count = (wire.MAX_HEADER_BYTES - 16) // len(inner)
    return b"\xdc" + count.to_bytes(2, "big") + inner * count


@pytest.mark.parametrize("item", [b"\x80", b"\x90", b"\xe0", b"\xa2ab"],
                         ids=["empty maps", "empty lists", "small ints", "short strings"])
def test_a_header_of_tiny_objects_is_refused_within_a_memory_bound(item):
    raw = _header_of(item)
    assert len(raw) <= wire.MAX_HEADER_BYTES
    tracemalloc.start()
    try:
        with pytest.raises(wire.ProtocolError, match="list and map entries"):
            wire.decode([raw])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MIB, f"{peak / MIB:.1f} MiB"  # unbounded: 40-72 MiB


def test_legitimate_headers_decode_as_before():
    state = {f"layer{i}.weight": np.zeros((4, 4), np.float32) for i in range(2000)}
    msg = wire.decode(wire.encode(wire.PARAMS, state, version=3))
    assert len(msg.arrays) == 2000 and msg.fields["version"] == 3
    row = {f"metric_{i}": float(i) for i in range(4000)}
    assert wire.decode(wire.encode(wire.METRICS, row=row)).fields["row"] == row
