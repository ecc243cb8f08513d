"""Unit tests of zmqrl.bus.wire: what docs/protocol.md sections 3, 4 and 10 promise."""

from __future__ import annotations

import re
import uuid
import zlib

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmqrl.bus import sockets, wire

SMALL = 8  # elements: inline
LARGE = 8192  # elements: at least 16 KiB for every dtype but the 1-byte ones
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]


def sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{shape}".encode()))
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def as_received(frames: list) -> list[bytes]:
    """What a peer gets with recv_multipart(copy=True): plain bytes, one per frame."""
    return [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f for f in frames]


def roundtrip(msg_type: str, arrays: dict, **fields) -> wire.Message:
    return wire.decode(as_received(wire.encode(msg_type, arrays, **fields)))


def header(**overrides) -> bytes:
    return msgpack.packb({"v": 1, "t": "step", "arrays": [], **overrides})


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# ----- encoding and decoding ---------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(SMALL,), (3, 5), (LARGE,), (64, 128, 2), (0,), (4, 0, 3)])
def test_roundtrip_every_dtype_and_size(dtype, shape):
    arr = sample(dtype, shape)
    msg = roundtrip(wire.STEP, {"x": arr})
    assert msg.type == wire.STEP
    assert_same(msg["x"], arr)


def test_small_arrays_ride_inline_and_large_ones_in_frames():
    small = np.zeros(wire.INLINE_MAX_BYTES // 4, np.float32)  # exactly the threshold
    large = np.zeros(wire.INLINE_MAX_BYTES // 4 + 1, np.float32)
    frames = wire.encode(wire.UNROLL, {"a": large, "b": small, "c": large * 2})
    specs = msgpack.unpackb(frames[0])["arrays"]
    assert [len(s) for s in specs] == [3, 4, 3]
    assert len(frames) == 3
    msg = wire.decode(as_received(frames))
    assert list(msg.arrays) == ["a", "b", "c"]
    assert_same(msg["b"], small)
    assert_same(msg["c"], large * 2)


def test_fields_and_type_are_preserved():
    fields = {"seq": 123456789012, "version": 0, "error": "ünïcode ok", "ratio": 0.25,
              "flag": True, "nothing": None, "row": {"a": 1, "b": [1.5, "x"]},
              "blob": b"\x00\xff"}
    msg = roundtrip(wire.METRICS, {}, **fields)
    assert msg.type == wire.METRICS
    assert msg.fields == fields
    assert msg.arrays == {}


def test_numpy_scalars_in_fields_become_python_numbers():
    msg = roundtrip(wire.METRICS, {}, row={"steps": np.int64(5), "loss": np.float32(0.5)})
    assert msg.fields["row"] == {"steps": 5, "loss": 0.5}


def test_non_contiguous_arrays_are_sent_in_c_order():
    arr = np.arange(12, dtype=np.int32).reshape(3, 4)
    big = np.arange(2 * LARGE, dtype=np.float32).reshape(2, LARGE)
    msg = roundtrip(wire.STEP, {"t": arr.T, "s": arr[:, ::2], "big": big.T})
    assert_same(msg["t"], np.ascontiguousarray(arr.T))
    assert_same(msg["s"], arr[:, ::2].copy())
    assert_same(msg["big"], big.T.copy())


def test_encode_rejects_dtypes_outside_the_protocol():
    for arr in (np.array(["a"]), np.array([object()]), np.zeros(2, np.complex64)):
        with pytest.raises(wire.ProtocolError, match="cannot be sent"):
            wire.encode(wire.STEP, {"x": arr})


def test_zero_dimensional_arrays_keep_their_shape():
    msg = roundtrip(wire.STEP, {"x": np.array(2.5, np.float32), "b": np.array(True)})
    assert_same(msg["x"], np.array(2.5, np.float32))
    assert_same(msg["b"], np.array(True))


def test_zero_dimensional_arrays_from_a_conforming_sender_decode():
    frames = [header(arrays=[["x", "float32", [], np.float32(2.5).tobytes()]])]
    assert_same(wire.decode(frames)["x"], np.array(2.5, np.float32))


def test_decode_reads_little_endian():
    frames = [header(arrays=[["x", "int32", [2], b"\x01\x00\x00\x00\x00\x01\x00\x00"]])]
    assert wire.decode(frames)["x"].tolist() == [1, 256]


def test_big_endian_arrays_are_sent_little_endian():
    arr = np.arange(3, dtype=">f4")
    big = np.arange(LARGE, dtype=">i4")
    msg = roundtrip(wire.STEP, {"x": arr, "big": big})
    assert msg["x"].tolist() == [0.0, 1.0, 2.0]
    assert msg["big"].tolist() == list(range(LARGE))


def test_decode_accepts_encode_output_directly():
    arr = np.arange(LARGE, dtype=np.float32)
    assert_same(wire.decode(wire.encode(wire.STEP, {"x": arr}))["x"], arr)


@pytest.mark.parametrize("copy", [True, False], ids=["bytes", "zmq.Frame"])
def test_decode_over_a_real_socket(copy):
    """Frames from recv_multipart are bytes (copy=True) or zmq.Frame (copy=False)."""
    ctx = zmq.Context.instance()
    address = f"inproc://wire-{uuid.uuid4().hex}"
    opts = sockets.SocketOptions()
    router = sockets.bind(ctx, "router", address, opts)
    dealer = sockets.connect(ctx, "dealer", [address], opts)
    try:
        arrays = {
            "obs": sample("float32", (4, 4)),  # inline
            "big": sample("float64", (LARGE, 2)),  # 128 KiB frame: sent zero-copy
            "mid": sample("int16", (LARGE + 1,)),  # 16 KiB frame: copied
            "done": sample("bool", (4,)),
            "empty": np.zeros((0, 4), np.float32),
        }
        sockets.send(dealer, wire.encode(wire.STEP, arrays, seq=9))
        assert router.poll(5000)
        frames = router.recv_multipart(copy=copy)
        assert all(isinstance(f, bytes if copy else zmq.Frame) for f in frames)
        envelope, body = frames[:1], frames[1:]  # a DEALER peer sends no delimiter
        msg = wire.decode(body)
        assert msg.type == wire.STEP and msg.fields == {"seq": 9}
        for name, arr in arrays.items():
            assert_same(msg[name], arr)
        # ... and the reply back through the envelope
        sockets.send(router, wire.encode(wire.ACT, {"action": np.arange(4)}, seq=9), envelope)
        assert dealer.poll(5000)
        reply = wire.decode(dealer.recv_multipart(copy=copy))
        assert reply.type == wire.ACT and reply.fields["seq"] == 9
        assert_same(reply["action"], np.arange(4))
    finally:
        dealer.close(linger=0)
        router.close(linger=0)


def test_error_reply_carries_the_reason():
    msg = wire.decode(wire.error_reply("bad obs"))
    assert msg.type == wire.ERROR and msg.fields == {"error": "bad obs"}


# ----- rejections --------------------------------------------------------------------
OBS_FRAME = [["obs", "float32", [3, 4]]]
REJECTIONS = {
    "empty message": ([], "empty message"),
    "garbage bytes": ([b"\xc1\xc1 not msgpack"], "header is not msgpack"),
    "truncated msgpack": ([header()[:-3]], "header is not msgpack"),
    "trailing bytes": ([header() + b"\x00"], "header is not msgpack"),
    "empty header frame": ([b""], "header is not msgpack"),
    "msgpack list": ([msgpack.packb([1, 2, 3])], "header is a msgpack list, not a map"),
    "msgpack int": ([msgpack.packb(7)], "header is a msgpack int, not a map"),
    "non-string keys": ([msgpack.packb({1: 1})], "header is not msgpack"),
    "no version": ([msgpack.packb({"t": "step"})], "protocol version None not supported"),
    "wrong version": ([header(v=2)], "protocol version 2 not supported (expected 1)"),
    "string version": ([header(v="1")], "protocol version '1' not supported"),
    "unknown type": ([header(t="launch")], "unknown message type 'launch'"),
    "missing type": ([msgpack.packb({"v": 1})], "unknown message type None"),
    "arrays not a list": ([header(arrays={"obs": 1})], "'arrays' must be a list"),
    "missing frame": ([header(arrays=OBS_FRAME)], "announces 1 array frame(s) but 0 arrived"),
    "extra frame": ([header(), b"\x00" * 8], "announces 0 array frame(s) but 1 arrived"),
    "short frame": ([header(arrays=OBS_FRAME), b"\x00" * 47],
                    "array 'obs': 47 bytes but float32(3, 4) needs 48"),
    "long frame": ([header(arrays=OBS_FRAME), b"\x00" * 49],
                   "array 'obs': 49 bytes but float32(3, 4) needs 48"),
    "short inline": ([header(arrays=[["r", "float64", [2], b"\x00" * 15]])],
                     "array 'r': 15 bytes but float64(2,) needs 16"),
    "long inline": ([header(arrays=[["r", "float64", [], b"\x00" * 9]])],
                    "array 'r': 9 bytes but float64() needs 8"),
    "object dtype": ([header(arrays=[["obs", "object", [1], b"x"]])],
                     "array 'obs': dtype 'object' not allowed"),
    "complex dtype": ([header(arrays=[["z", "complex64", [1], b"\x00" * 8]])],
                      "dtype 'complex64' not allowed"),
    "byte-order dtype": ([header(arrays=[["z", ">f4", [1], b"\x00" * 4]])],
                         "dtype '>f4' not allowed"),
    "negative dim": ([header(arrays=[["obs", "uint8", [-1], b""]])],
                     "array 'obs': shape [-1] is not a list of sizes"),
    "float dim": ([header(arrays=[["obs", "uint8", [1.0], b"x"]])], "is not a list of sizes"),
    "shape not a list": ([header(arrays=[["obs", "uint8", 3, b"xxx"]])],
                         "is not a list of sizes"),
    "short entry": ([header(arrays=[["obs", "uint8"]])], "bad array entry"),
    "long entry": ([header(arrays=[["obs", "uint8", [1], b"x", 0]])], "bad array entry"),
    "entry not a list": ([header(arrays=["obs"])], "bad array entry"),
    "name not a string": ([header(arrays=[[5, "uint8", [1], b"x"]])],
                          "array name 5 is not a string"),
    "inline str data": ([header(arrays=[["obs", "uint8", [1], "x"]])],
                        "array 'obs': inline data is not msgpack bin"),
}


@pytest.mark.parametrize("frames,reason", REJECTIONS.values(), ids=REJECTIONS.keys())
def test_rejections_raise_protocol_error_saying_why(frames, reason):
    with pytest.raises(wire.ProtocolError, match=re.escape(reason)):
        wire.decode(frames)


def test_protocol_error_is_a_value_error():
    assert issubclass(wire.ProtocolError, ValueError)


def test_oversize_is_rejected_before_parsing():
    frames = as_received(wire.encode(wire.UNROLL, {"x": np.zeros(LARGE, np.float32)}))
    total = sum(len(f) for f in frames)
    assert wire.decode(frames, max_bytes=total)["x"].shape == (LARGE,)
    with pytest.raises(wire.ProtocolError, match=f"{total} bytes exceeds the limit of {total - 1}"):
        wire.decode(frames, max_bytes=total - 1)
    with pytest.raises(wire.ProtocolError, match="exceeds the limit of 10"):
        wire.decode([b"\xc1" * 11], max_bytes=10)  # garbage: size is checked first


# Values of the wrong type where a hashable one belongs: each once made decode raise
# TypeError, which zmqrl.bus.node does not catch (one such message killed a node).
UNHASHABLE = {
    "list as type": [msgpack.packb({"v": 1, "t": [], "arrays": []})],
    "map as type": [msgpack.packb({"v": 1, "t": {}, "arrays": []})],
    "list as dtype": [header(arrays=[["x", ["uint8"], [1], b"x"]])],
    "map as dtype": [header(arrays=[["x", {"a": 1}, [1], b"x"]])],
    "bool in shape": [header(arrays=[["x", "uint8", [True], b"x"]])],
}


@pytest.mark.parametrize("frames", UNHASHABLE.values(), ids=UNHASHABLE.keys())
def test_malformed_types_are_protocol_errors(frames):
    with pytest.raises(wire.ProtocolError):
        wire.decode(frames)


# ----- header limits: a header costs memory in proportion to the cap, not the message --
RSS_PROBE = """
import resource, sys
import msgpack
from zmqrl.bus import wire
def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

kind, size = sys.argv[1], int(sys.argv[2])
# 0x90 is an empty msgpack array: one byte on the wire, a Python list in memory.
filler = [[[]] * 60000 for _ in range(size // 60000)]
frame = msgpack.packb({"v": 1, "t": "ping", "pad": filler})
before = peak_mib()
try:
    msg = wire.decode([frame], max_bytes=1 << 30)
    outcome = "decoded " + msg.type
except wire.ProtocolError as exc:
    outcome = "rejected: " + str(exc)
print(len(frame), peak_mib() - before, outcome)
"""


def rss_growth(size: int) -> tuple[int, float, str]:
    """Decode a ``ping`` whose header is ``size`` bytes of empty lists, in a fresh
    process: (header bytes, peak RSS growth in MiB, outcome)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", RSS_PROBE, "pad", str(size)], check=True,
                         capture_output=True, text=True, timeout=120).stdout.split(maxsplit=2)
    return int(out[0]), float(out[1]), out[2].strip()


def test_a_big_header_is_rejected_before_msgpack_builds_it():
    """The issue: a 4 MB header of empty lists decoded as a valid ping and raised peak
    RSS by 276 MiB; at the 256 MiB message cap that would be ~18 GiB from one message."""
    size, grown, outcome = rss_growth(4 * 1024 * 1024)
    assert grown < 16, f"rejecting a {size}-byte header cost {grown:.0f} MiB ({outcome})"
    assert outcome.startswith("rejected: header of"), outcome


def test_a_header_at_the_cap_costs_bounded_memory():
    """The worst a header under the cap can do: bounded by the cap, whatever the
    message limit; and (issue 29, Low 6) by the count of lists and maps it holds, which
    stops this one early (it cost ~64 MiB decoded in full)."""
    size, grown, outcome = rss_growth(wire.MAX_HEADER_BYTES - 4096)
    assert size <= wire.MAX_HEADER_BYTES
    assert outcome.startswith("rejected: header holds more than"), outcome
    assert grown < 32, f"a {size}-byte header cost {grown:.0f} MiB"


def test_encode_refuses_a_header_no_receiver_would_take():
    many = {f"a{i}": np.zeros(wire.INLINE_MAX_BYTES // 4, np.float32) for i in range(70)}
    with pytest.raises(wire.ProtocolError, match="exceeds the limit of"):
        wire.encode(wire.PARAMS, many, version=0)
    assert len(wire.encode(wire.PARAMS, dict(list(many.items())[:60]), version=0)) == 1


@pytest.mark.parametrize("packed", [
    msgpack.packb({"v": 1, "t": "ping", "x": msgpack.ExtType(1, b"abc")}),
    msgpack.packb({"v": 1, "t": "ping", "x": msgpack.ExtType(7, b"")}),
    msgpack.packb({"v": 1, "t": "ping", "x": msgpack.Timestamp(1, 0)}),  # ext -1
], ids=["ext", "empty ext", "timestamp"])
def test_ext_types_are_rejected(packed):
    with pytest.raises(wire.ProtocolError, match="ext"):
        wire.decode([packed])


@pytest.mark.parametrize("depth", [9, 100_000])
def test_deep_nesting_is_rejected(depth):
    # {"v": 1, "t": "ping", "x": [[[...[]...]]]}, written byte by byte: msgpack's own
    # packer will not nest this deep.
    raw = b"\x83\xa1v\x01\xa1t\xa4ping\xa1x" + b"\x91" * depth + b"\x90"
    with pytest.raises(wire.ProtocolError, match="deeper than|not msgpack"):
        wire.decode([raw])


@pytest.mark.parametrize("depth", [9, 100_000])
def test_deep_nesting_inside_arrays_is_rejected(depth):
    # decode's depth walk leaves 'arrays' to the entries' own checks: they must catch it
    raw = b"\x83\xa1v\x01\xa1t\xa4ping\xa6arrays" + b"\x91" * depth + b"\x90"
    with pytest.raises(wire.ProtocolError, match="bad array entry|not msgpack"):
        wire.decode([raw])
    entry = b"\x93\xa1x\xa7float32" + b"\x91" * depth + b"\x90"  # a nested shape
    raw = b"\x83\xa1v\x01\xa1t\xa4ping\xa6arrays\x91" + entry
    with pytest.raises(wire.ProtocolError, match="not a list of sizes|not msgpack"):
        wire.decode([raw, b""])  # (the frame its 3-element entry announces)


def test_nesting_within_the_limit_decodes():
    row = {"a": {"b": [[1, 2], {"c": [3]}]}}
    assert roundtrip(wire.METRICS, {}, row=row).fields["row"] == row


def test_long_strings_are_rejected():
    value = "x" * (64 * 1024 + 1)
    with pytest.raises(wire.ProtocolError, match="exceeds max"):
        wire.decode([msgpack.packb({"v": 1, "t": "ping", "x": value})])


def test_arrays_inlined_beyond_the_threshold_are_accepted():
    """Inline or frame is the sender's choice (a plain client may inline everything)."""
    obs = np.arange(2048 * 4, dtype=np.float32)  # 32 KiB
    frames = [header(arrays=[["obs", "float32", [2048, 4], obs.tobytes()]])]
    assert_same(wire.decode(frames)["obs"], obs.reshape(2048, 4))


# ----- the ROUTER envelope -----------------------------------------------------------
@pytest.mark.parametrize("sent,want", [
    ([b""], 1),  # a lone empty frame: the body, not a delimiter
    ([b"", b""], 2),  # a delimiter and an empty body: the delimiter comes back
    ([b"", b"\xc1"], 2),
    ([b"\xc1"], 1),
])
def test_a_reply_mirrors_the_envelope_that_was_sent(sent, want):
    ctx = zmq.Context.instance()
    address = f"inproc://envelope-{uuid.uuid4().hex}"
    opts = sockets.SocketOptions()
    router = sockets.bind(ctx, "router", address, opts)
    dealer = sockets.connect(ctx, "dealer", [address], opts)
    try:
        dealer.send_multipart(sent)
        assert router.poll(5000)
        envelope, body = sockets.split_envelope(router.recv_multipart())
        with pytest.raises(wire.ProtocolError):
            wire.decode(body)
        sockets.send(router, wire.error_reply("bad"), envelope)
        assert dealer.poll(5000)
        reply = dealer.recv_multipart()
        assert len(reply) == want, reply
        assert wire.decode(reply[want - 1:]).type == wire.ERROR
    finally:
        dealer.close(linger=0)
        router.close(linger=0)


# ----- property tests ----------------------------------------------------------------
def decode_or_protocol_error(frames: list) -> None:
    try:
        wire.decode(frames)
    except wire.ProtocolError:
        pass  # anything else propagates and fails the test


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=256), max_size=4))
def test_random_frames_only_ever_raise_protocol_error(frames):
    decode_or_protocol_error(frames)


# msgpack values for places where a specific type belongs: any of them, containers too,
# in every position (the type, dtypes, shape entries), including those that once raised
# TypeError (test_malformed_types_are_protocol_errors).
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=True), st.text(max_size=8), st.binary(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
dims = st.integers(-2, 2**64 - 1) | st.sampled_from([0, 1, 2, 3]) | st.booleans() | values
specs = st.lists(st.one_of(
    st.tuples(st.text(max_size=4), st.sampled_from(DTYPES) | values, st.lists(dims, max_size=3)),
    st.tuples(st.text(max_size=4), st.sampled_from(DTYPES) | values, st.lists(dims, max_size=3),
              st.binary(max_size=24) | values),
    values,
).map(lambda s: list(s) if isinstance(s, tuple) else s), max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.just(1) | scalars,
    msg_type=st.sampled_from(sorted(wire.MESSAGE_TYPES)) | values,
    arrays=specs | values,
    fields=st.dictionaries(st.text(max_size=6), values, max_size=3),
    trailing=st.lists(st.binary(max_size=48), max_size=3),
)
def test_random_headers_only_ever_raise_protocol_error(version, msg_type, arrays, fields,
                                                       trailing):
    head = {**fields, "v": version, "t": msg_type, "arrays": arrays}
    decode_or_protocol_error([msgpack.packb(head), *trailing])
