"""The zmqrl wire protocol: the only place messages are encoded and decoded.

A message is a ZeroMQ multipart message ``[header, buf_0, buf_1, ...]``:

* ``header`` is a msgpack map with ``v`` (protocol version), ``t`` (message type), any
  scalar fields of that type, and ``arrays``: a list of ``[name, dtype, shape]`` or
  ``[name, dtype, shape, bytes]`` entries. Arrays of the 4-element form ride inside
  the header (small arrays: one frame is cheaper than several); the others are sent,
  in order, as the raw little-endian C-order bytes of one trailing frame each.
* A ROUTER socket prepends the peer identity; that is the socket layer's business
  (:mod:`zmqrl.bus.sockets`), not this module's.

``docs/protocol.md`` is the normative description; keep the two in step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# Arrays up to this many bytes are packed into the header; larger ones travel as their
# own frame, zero-copy. The design sketch measured that for small arrays one frame with
# the bytes inside the header beats extra zero-copy frames, and that zero-copy pays off
# from tens of KiB; 16 KiB sits below that (not re-measured separately here).
INLINE_MAX_BYTES = 16 * 1024

# Default cap for one message (all frames). Sockets also set ZMQ_MAXMSGSIZE per frame.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# Cap for a frame on a port that takes only control messages (ping, describe): ample for
# their headers. A port that takes nothing else gets it as its ZMQ_MAXMSGSIZE
# (Node.port_frame_cap), so a larger frame never gets buffered.
CONTROL_FRAME_BYTES = 64 * 1024

# Cap for the header frame, and for what msgpack may build from it. A header holds the
# fields and the inline arrays (each at most INLINE_MAX_BYTES), so 1 MiB leaves room for
# dozens of inline arrays (a model's state dict). Per-container limits alone do not
# bound the objects: measured (tracemalloc), 1 MiB of empty maps became 72 MiB of
# Python objects, of empty lists 64 MiB, of small negative ints 40 MiB. So decoding also
# counts every list and map and their entries (_ObjectBudget, MAX_HEADER_OBJECTS) and
# stops past the budget: the worst 1 MiB header then peaks at ~11 MiB (2-byte strings;
# empty maps 5 MiB); headers under 32 KiB cannot reach the budget and are not counted
# (tests/test_wire_budget.py).
MAX_HEADER_BYTES = 1024 * 1024
# Lists, maps and their entries in one header: a legitimate one holds a few per array
# (its entry and shape) and per field, and a metrics report's returns are numpy arrays.
MAX_HEADER_OBJECTS = 1 << 17
# A byte of msgpack adds at most about two to the count (an empty map inside a list:
# itself and its list entry), so a header shorter than this cannot exceed the budget
# and is decoded without counting (every step and act: the hooks cost ~2 us a message).
_BUDGET_FROM_BYTES = MAX_HEADER_OBJECTS // 4
# msgpack nesting depth: the deepest legitimate header is a metrics row (map in map).
_UNPACK_LIMITS = {
    # inline array data: a sender may inline any array (receivers must accept either
    # form), so the header cap is the only bound; bytes cost bytes, not objects
    "max_bin_len": MAX_HEADER_BYTES,
    "max_str_len": 64 * 1024,
    "max_array_len": 1 << 16,  # array entries, shapes, episode returns of one report
    "max_map_len": 4096,  # header fields, a metrics row
    "max_ext_len": 0,
}
_MAX_DEPTH = 8

# Most dimensions an array may have: numpy 1.x's limit (2.x allows 64), so that every
# receiver built on numpy can represent what it accepts.
MAX_DIMS = 32

# Message types. Requests (ping, step, sample, grads, get_params) get exactly one reply
# (pong, act, batch, params, params) or ``error``; docs/protocol.md pairs them.
HELLO = "hello"  # node -> supervisor: I started (kind, name, replica, incarnation, pid)
HEARTBEAT = "heartbeat"  # node -> supervisor: still alive
METRICS = "metrics"  # node -> supervisor: one row of metrics (``row`` field)
PING = "ping"  # anyone -> any bound ROUTER port; reply ``pong``
PONG = "pong"
STEP = "step"  # actor -> inference: observations (+ rewards/dones of the last actions)
ACT = "act"  # inference -> actor: actions for those observations
UNROLL = "unroll"  # experience producer -> learner: time-major trajectory block
PARAMS = "params"  # learner -> inference (PUB): model parameters with a version
INSERT = "insert"  # actor -> replay: batch-major items (+ optional ``priority`` array)
SAMPLE = "sample"  # learner -> replay: request ``batch_size`` items; reply ``batch``
BATCH = "batch"  # replay -> learner: ``key``, ``weight`` and the items' arrays
PRIORITIES = "priorities"  # learner -> replay: ``key`` and new ``priority`` arrays
REVISE = "revise"  # reviser (reanalyse) -> replay: ``key`` and fresh arrays of held items
GRADS = "grads"  # worker/learner -> parameter server: one array per parameter; reply params
GET_PARAMS = "get_params"  # anyone -> parameter server: reply ``params``
CREDIT = "credit"  # consumer -> producer of experience: ``n`` more messages may be sent
ERROR = "error"  # reply to a rejected message: ``error`` field says why
DESCRIBE = "describe"  # anyone -> any bound ROUTER port; reply ``description``
DESCRIPTION = "description"  # protocol version, message types taken, env and spaces
# PBT (nodes/pbt.py, zmqrl/parts/learning/pbt_member.py)
PBT_REPORT = "pbt_report"  # member learner -> pbt: steps, mean return, hyperparameters
PBT_GET_STATE = "pbt_get_state"  # pbt -> donor learner: reply pbt_state
PBT_STATE = "pbt_state"  # donor learner -> pbt: weights + optimizer state (``state`` bytes)
PBT_LOAD = "pbt_load"  # pbt -> recipient learner: a donor's state and new hyperparameters
PBT_LOADED = "pbt_loaded"  # recipient learner -> pbt: loaded (its new parameter version)
# A population's games (nodes/population_broker.py, nodes/population_league.py)
GAMES = "games"  # whoever plays -> league ``games``: finished games (players, scores)
RATINGS = "ratings"  # league -> subscribers (PUB): every player's rating
EXPLOITED = "exploited"  # pbt -> league ``games``: a member now plays with another's weights

MESSAGE_TYPES = frozenset({HELLO, HEARTBEAT, METRICS, PING, PONG, STEP, ACT, UNROLL, PARAMS,
                           INSERT, SAMPLE, BATCH, PRIORITIES, REVISE, GRADS, GET_PARAMS, CREDIT,
                           ERROR, DESCRIBE, DESCRIPTION, PBT_REPORT, PBT_GET_STATE,
                           PBT_STATE, PBT_LOAD, PBT_LOADED, GAMES, RATINGS, EXPLOITED})

_ALLOWED_DTYPES = frozenset(
    f"{k}{n}" for k, sizes in (("int", (8, 16, 32, 64)), ("uint", (8, 16, 32, 64)),
                                ("float", (16, 32, 64))) for n in sizes
) | {"bool"}
_RESERVED = frozenset({"v", "t", "arrays"})
# The dtypes a message may carry, made once, and their wire names: numpy builds
# ``dtype.name`` anew on every access (~3 us), and np.frombuffer given a name parses it.
_DTYPES = {name: np.dtype(name) for name in _ALLOWED_DTYPES}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class ProtocolError(ValueError):
    """A message that cannot be trusted. The text says what was wrong with it."""


@dataclass(slots=True)
class Message:
    type: str
    fields: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]


def _msgpack_default(obj: Any) -> Any:
    # numpy scalars show up in metric rows and counters; msgpack knows only Python types.
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} in a message header")


_packer = msgpack.Packer(default=_msgpack_default, use_bin_type=True)


def encode(msg_type: str, arrays: dict[str, np.ndarray] | None = None, **fields: Any) -> list:
    """Build the frames of one message. Returned buffers may alias ``arrays``."""
    reserved = _RESERVED.intersection(fields)
    if reserved:
        raise ValueError(f"header fields {sorted(reserved)} are reserved by the protocol")
    specs: list[list] = []
    frames: list = [b""]
    for name, arr in (arrays or {}).items():
        arr = np.asarray(arr)
        if arr.dtype.byteorder == ">":  # the wire is little-endian
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # (this would turn a 0-d array into 1-d)
        dtype = _DTYPE_NAMES.get(arr.dtype)
        if dtype is None:
            raise ProtocolError(f"array {name!r}: dtype {arr.dtype} cannot be sent")
        if arr.nbytes <= INLINE_MAX_BYTES:
            specs.append([name, dtype, list(arr.shape), arr.tobytes()])
        else:
            specs.append([name, dtype, list(arr.shape)])
            frames.append(arr.data.cast("B"))  # zero-copy view of the array
    header = {"v": PROTOCOL_VERSION, "t": msg_type, **fields, "arrays": specs}
    frames[0] = _packer.pack(header)
    if len(frames[0]) > MAX_HEADER_BYTES:  # no receiver would take it
        raise ProtocolError(f"header of {len(frames[0])} bytes exceeds the limit of "
                            f"{MAX_HEADER_BYTES} (too many fields or inline arrays)")
    return frames


class _ObjectBudget:
    """Counts the lists and maps msgpack builds, with their entries (its hooks run as
    each is complete), and stops a header that would build more than
    MAX_HEADER_OBJECTS."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_HEADER_OBJECTS

    def take(self, container: Any) -> Any:
        self.left -= len(container) + 1
        if self.left < 0:
            raise ProtocolError(f"header holds more than {MAX_HEADER_OBJECTS} "
                                "list and map entries")
        return container


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack ext type {code} is not allowed in a header")


def _depth(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests containers no deeper than ``limit``."""
    if not isinstance(obj, dict | list):
        return True
    if limit <= 0:
        return False
    # Recurse into containers only: a header is mostly scalars (every shape entry, every
    # field), and a call per scalar was a third of decode's time on the hot path.
    for value in obj.values() if isinstance(obj, dict) else obj:
        if isinstance(value, dict | list) and not _depth(value, limit - 1):
            return False
    return True


def _buffer(frame: Any) -> memoryview | bytes:
    # Frames arrive as bytes (copy=True) or zmq.Frame (copy=False), or straight from
    # encode() as memoryviews; as a byte view, len() is the size in bytes for all three.
    if isinstance(frame, bytes):
        return frame
    return memoryview(frame.buffer if hasattr(frame, "buffer") else frame).cast("B")


def decode(frames: list, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Parse and check one message; raise :class:`ProtocolError` on anything untrusted.

    This runs once per message on every port (the inference broker's hot path): the
    checks are written out inline, and each one is needed (tests/test_wire.py)."""
    if not frames:
        raise ProtocolError("empty message")
    buffers = [_buffer(f) for f in frames]
    raw_header = buffers[0]
    total = sum(map(len, buffers))
    if total > max_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {max_bytes}")
    if len(raw_header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw_header)} bytes exceeds the limit of "
                            f"{MAX_HEADER_BYTES}")
    try:
        if len(raw_header) < _BUDGET_FROM_BYTES:  # cannot build past the budget: no hooks
            header = msgpack.unpackb(raw_header, raw=False, strict_map_key=True,
                                     ext_hook=_no_ext, **_UNPACK_LIMITS)
        else:
            budget = _ObjectBudget()
            header = msgpack.unpackb(raw_header, raw=False, strict_map_key=True,
                                     ext_hook=_no_ext, list_hook=budget.take,
                                     object_hook=budget.take, **_UNPACK_LIMITS)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"header is not msgpack ({type(exc).__name__}: "
                            f"{str(exc)[:80]})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header is a msgpack {type(header).__name__}, not a map")
    for key, value in header.items():
        # msgpack's strict_map_key still lets bin keys through; the protocol wants str.
        if type(key) is not str:
            raise ProtocolError(f"header keys must be strings, got {key!r:.40}")
        # 'arrays' is bounded by its entries' checks below (list of [str, str, list of
        # ints(, bytes)]), so only the other fields can nest deeper.
        if isinstance(value, dict | list) and key != "arrays" and \
                not _depth(value, _MAX_DEPTH - 1):
            raise ProtocolError(f"header nests containers deeper than {_MAX_DEPTH}")
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version!r} not supported (expected {PROTOCOL_VERSION})"
        )
    msg_type = header.get("t")
    if not isinstance(msg_type, str) or msg_type not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {msg_type!r}")
    specs = header.get("arrays", [])
    if not isinstance(specs, list):
        raise ProtocolError("'arrays' must be a list")
    n_frames = sum(1 for s in specs if isinstance(s, list) and len(s) == 3)
    if n_frames != len(frames) - 1:
        raise ProtocolError(
            f"header announces {n_frames} array frame(s) but {len(frames) - 1} arrived"
        )
    arrays: dict[str, np.ndarray] = {}
    next_frame = 1
    for spec in specs:
        name, dtype, shape, data = _check_spec(spec)
        if data is None:
            data = buffers[next_frame]
            next_frame += 1
        itemsize = dtype.itemsize
        size = math.prod(shape)
        if (size or math.prod(d for d in shape if d)) * itemsize >= 2**63:
            # an empty array's byte count (0) would check out; no such array can exist
            raise ProtocolError(f"array {name!r}: shape {shape!r:.80} is too large")
        if len(data) != size * itemsize:
            raise ProtocolError(f"array {name!r}: {len(data)} bytes but "
                                f"{dtype}{tuple(shape)} needs {size * itemsize}")
        if name in arrays:
            raise ProtocolError(f"array {name!r} appears twice")
        try:
            arrays[name] = np.frombuffer(data, dtype=dtype).reshape(shape)
        except (ValueError, OverflowError) as exc:  # whatever else numpy cannot build
            raise ProtocolError(f"array {name!r}: shape {shape!r:.80} is not "
                                f"representable ({exc})") from None
    fields = {k: v for k, v in header.items() if k not in _RESERVED}
    return Message(msg_type, fields, arrays)


def _check_spec(spec: Any) -> tuple[str, np.dtype, list[int], bytes | None]:
    if not isinstance(spec, list) or len(spec) not in (3, 4):
        raise ProtocolError(f"bad array entry {spec!r:.80}: want [name, dtype, shape(, bytes)]")
    name, dtype, shape = spec[0], spec[1], spec[2]
    if len(spec) == 4 and not isinstance(spec[3], bytes):
        # nil here would make the entry claim a frame that the frame count did not
        # announce (decode counts 3-element entries)
        raise ProtocolError(f"array {name!r:.40}: inline data is not msgpack bin")
    data = spec[3] if len(spec) == 4 else None
    if not isinstance(name, str):
        raise ProtocolError(f"array name {name!r:.40} is not a string")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise ProtocolError(f"array {name!r}: dtype {dtype!r:.40} not allowed")
    if not isinstance(shape, list):
        raise ProtocolError(f"array {name!r}: shape {shape!r:.80} is not a list of sizes")
    for d in shape:
        if type(d) is not int or d < 0:
            raise ProtocolError(f"array {name!r}: shape {shape!r:.80} is not a list of sizes")
    if len(shape) > MAX_DIMS:
        raise ProtocolError(f"array {name!r}: {len(shape)} dimensions, at most {MAX_DIMS}")
    return name, _DTYPES[dtype], shape, data


def error_reply(reason: str) -> list:
    return encode(ERROR, error=reason)
