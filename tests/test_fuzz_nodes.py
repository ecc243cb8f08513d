"""Hostile input against every bound port of every registered node kind, by hypothesis.

Nothing here names a node, a port or a message type: ``tests/fuzzing.py`` finds them.
Every node kind registered in ``zmqrl.nodes`` runs as its own process (``zmqrl node``,
ipc) under every part configuration the shipped topologies give it (``replay``,
``replay@muzero``, ``inference_broker@muzero``: MuZero's latent search, its revisions),
shrunk (tiny model, cpu, small capacities, a 1 MiB message cap), with only the nodes its
links need beside it; a kind
that binds no ROUTER port is listed as skipped, and one no shipped topology can place
fails with a message saying what to add. Every ROUTER port gets batches of random frames,
garbled msgpack headers, structural and byte-level mutations, and messages of every
declared type (``zmqrl.bus.messages``) generated from their declarations: benign values,
hostile ones (NaN, inf, wrong dtypes, huge-but-finite ±3e38 and ±1e30, ints at the int64
limits), oversized counts (an env or item count as large as the cap allows), and identity
spoofing (a second DEALER, the legitimate peer, names itself in a ``client``/``member``
field, then the fuzzer sends messages naming it). After each batch a ``ping`` on the
port, from both identities, must get its ``pong`` within a deadline (no crash, no hang,
the port still read), and the honest peer is still served: a benign message the node
took from it before the fuzz, sent again, is taken again (no ``error``; a league frozen
by made-up players or a replay whose layout one insert fixed would refuse it); every
reply the node sends, and everything it publishes on its ``pub`` ports, must keep its own
declaration; at the end every node must have counted (``bad_messages``) and logged its
rejections, with no traceback in its log.

Shrinking is off: a node that died stays dead, so every smaller example would fail
too. A failure reports the batch that did it and the node's log with its traceback.

What this fuzz found in ``nodes/`` (now fixed, each pinned by a test at the end): a
step with NaN or inf observations crashed the broker's model; two pipelined steps of
different sizes on one connection crashed its unroll assembly; an out-of-range action
in an unroll crashed the learner; a NaN reward silently made every parameter NaN.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import yaml
import zmq
from hypothesis import HealthCheck, Phase, example, given, reject, settings
from hypothesis import strategies as st

from zmqrl.bus import messages, wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.bus.node import NodeContext
from zmqrl.run.topology import from_dict, load, load_class

import fuzzing
from conftest import Processes, machine, read_csv, stop_all, wait_for

LIMIT = fuzzing.LIMIT
PONG_DEADLINE_S = 15.0  # a node that takes longer to answer a ping after a batch hangs
KNOWN_DEADLINE_S = 8.0  # the same for a known defect's xfail (a stalled node stays so)
EXAMPLES_PER_PORT = 40
VIOLATIONS_PER_PORT = 20
# a kind's further configurations: the same strategies, fewer examples (the node's
# message handling is shared; what differs is the part behind it)
EXTRA_EXAMPLES_PER_PORT = 12
EXTRA_VIOLATIONS_PER_PORT = 8

try:
    HOMES = fuzzing.homes()
    SETUP_ERROR = None
except fuzzing.FuzzSetupError as exc:  # reported by the first test, not at collection
    HOMES, SETUP_ERROR = {}, str(exc)
PORTS = [(kind, port) for kind, home in sorted(HOMES.items()) for port in home.router_ports]
IDS = [f"{kind}.{port}" for kind, port in PORTS]
PUBS = [(kind, port) for kind, home in sorted(HOMES.items()) for port in home.pub_ports]

# Known defects, by port and strategy (a name of ``strategies``; "violations" for
# test_bad_values_and_dtypes_get_an_error_reply, "published" for
# test_what_nodes_publish_keeps_its_declaration), with the defect. The fuzz leaves such
# a strategy out (a stalled or dead node would fail every later test on it) and
# test_known_defects_still_reproduce, at the end of the module, runs it alone as an
# xfail; "violations" and "published" make those tests xfails on the port. The lead
# removes an entry once its fix is integrated; empty, everything runs everywhere.
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}


# ----- the running nodes ------------------------------------------------------------
@dataclass
class Target:
    kind: str
    node: str
    port: str
    address: str
    proc: Any
    log: Path
    run_dir: Path
    ctx: messages.Context  # what the node checks messages against
    sock: zmq.Socket  # the fuzzer
    legit: zmq.Socket  # a legitimate peer: another identity, whose names get spoofed
    bad_replies: list[str] = field(default_factory=list)
    # A benign message the node took from the legitimate peer before any fuzz: sent
    # again after every hostile batch, it must still be taken (None: not looked for
    # yet; []: the port took none of the benign messages tried, so nothing to check)
    honest: tuple[messages.MessageSpec, list] | tuple[()] | None = None

    def log_tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else "(no log)"


@dataclass
class Subscription:
    kind: str
    port: str
    ctx: messages.Context
    sock: zmq.Socket


def _start(tmp: Path, procs: Processes) -> tuple[dict, list]:
    """Every home's shrunk topology written once, its node and what it needs started."""
    groups: dict[str, tuple[Path, Path, set[str]]] = {}  # raw -> (topology, run dir, nodes)
    of_kind: dict[str, str] = {}
    for kind, home in sorted(HOMES.items()):
        key = json.dumps(home.raw, sort_keys=True)
        if key not in groups:
            name = f"{home.source.stem}-{kind}" if home.stand_in_for else home.source.stem
            path = tmp / f"{name}.yaml"
            path.write_text(yaml.safe_dump(home.raw))
            groups[key] = (path, tmp / name, set())
        groups[key][2].update(fuzzing.needed_nodes(groups[key][0], home.node))
        of_kind[kind] = key
    started, contexts = {}, {}
    for key, (path, run_dir, nodes) in groups.items():
        contexts[key] = fuzzing.port_context(path)
        for node in sorted(nodes):
            log = run_dir.parent / f"{run_dir.name}-{node}.log"
            started[(key, node)] = (procs.zmqrl("node", str(path), node, "--run-dir",
                                                str(run_dir), log=log), log)
    zctx = zmq.Context.instance()
    targets: dict[tuple[str, str], Target] = {}
    subs: list[Subscription] = []
    for kind, home in sorted(HOMES.items()):
        key = of_kind[kind]
        path, run_dir, _ = groups[key]
        endpoints = Endpoints(load(path), run_dir)
        proc, log = started[(key, home.node)]
        for port in home.router_ports:
            address = endpoints.bind_address(home.node, port, 0)
            socks = []
            for who in (b"fuzz", b"legit"):
                sock = zctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.IDENTITY, who + b"-" + random.randbytes(6).hex().encode())
                sock.connect(address)
                socks.append(sock)
            targets[(kind, port)] = Target(kind, home.node, port, address, proc, log, run_dir,
                                           contexts[key], *socks)
        for port in home.pub_ports:
            sock = zctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(endpoints.bind_address(home.node, port, 0))
            subs.append(Subscription(kind, port, contexts[key], sock))
    return targets, subs


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> Any:
    if SETUP_ERROR:
        pytest.fail(SETUP_ERROR)
    procs = Processes()
    found: dict = {}
    subs: list = []
    try:
        with machine(tmp_path_factory):  # no exclusive test beside its start
            found, subs = _start(tmp_path_factory.mktemp("fuzz"), procs)
            for target in found.values():  # every node up: the first pong may take a while
                assert_pong(target, timeout=90.0)
        yield found, subs
    finally:
        for target in found.values():
            target.sock.close()
            target.legit.close()
        for sub in subs:
            sub.sock.close()
        stop_all(procs.procs)


# The fuzz itself sends pings (a retyped header, a random one), each answered by a pong
# of its own, so a test's ping carries a seq no fuzz draws and waits for that pong.
_PING_SEQ = itertools.count(random.getrandbits(62) | 1 << 62)
# Replies that say something about the sender rather than carry data of a declaration.
_NOT_CHECKED = {wire.PONG, wire.ERROR}


def ping_and_read(target: Target, timeout: float = PONG_DEADLINE_S,
                  sock: zmq.Socket | None = None,
                  refusals: list[str] | None = None) -> list[str]:
    """Send a ping with a fresh seq; return the types of the replies that came before
    its pong (the replies to what was sent before it), the pong last. Every reply must
    keep its declaration (a node must never send what it would itself refuse).
    ``refusals`` collects the text of each ``error`` that does not say "ask again"."""
    sock = sock if sock is not None else target.sock
    assert target.proc.poll() is None, (
        f"{target.node} died (exit {target.proc.returncode}):\n{target.log_tail()}")
    seq = next(_PING_SEQ)
    sock.send_multipart(wire.encode(wire.PING, seq=seq))
    deadline = time.monotonic() + timeout
    replies: list[str] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(int(left * 1000)):
            state = "alive" if target.proc.poll() is None else \
                f"dead, exit {target.proc.returncode}"
            raise AssertionError(f"no pong from {target.kind}.{target.port} within "
                                 f"{timeout:.0f}s ({state}):\n{target.log_tail()}")
        frames = sock.recv_multipart()
        if frames and frames[0] == b"":
            frames = frames[1:]  # the reply to a message that began with an empty frame
        try:
            reply = wire.decode(frames)
        except wire.ProtocolError as exc:
            raise AssertionError(f"{target.kind}.{target.port} sent a reply that does not "
                                 f"decode: {exc}") from None
        replies.append(reply.type)
        if refusals is not None and reply.type == wire.ERROR and \
                reply.fields.get("retry") is not True:
            refusals.append(str(reply.fields.get("error")))
        if reply.type not in _NOT_CHECKED:
            problem = fuzzing.keeps_some_declaration(reply, target.ctx)
            assert problem is None, (f"{target.kind}.{target.port} replied '{reply.type}' "
                                     f"breaking its declaration: {problem}")
        if reply.type == wire.PONG and reply.fields.get("seq") == seq:
            return replies


def assert_pong(target: Target, timeout: float = PONG_DEADLINE_S) -> None:
    """Send a good ping; read replies (to the batch before it) until its own pong."""
    ping_and_read(target, timeout)


# ----- strategies -------------------------------------------------------------------
DTYPES = sorted(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float16", "float32", "float64"])
MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=8,
)


def _to_frames(header: dict, frames: list) -> list:
    """Move every inline array into its own trailing frame (the large-array form)."""
    old = iter(frames[1:])
    specs, body = [], []
    for spec in header["arrays"]:
        if isinstance(spec, list) and len(spec) == 4 and isinstance(spec[3], bytes):
            specs.append(spec[:3])
            body.append(spec[3])
        else:  # already a frame entry, or mutated beyond recognition: keep its frame
            specs.append(spec)
            if isinstance(spec, list) and len(spec) == 3:
                body.append(next(old, b""))
    header["arrays"] = specs
    return body + list(old)


# Every field name the declarations know, and the header's own keys.
_KEYS = sorted({"v", "t", "arrays", *(f.name for s in fuzzing.DECLARED for f in s.fields)})


@st.composite
def mutated(draw: st.DrawFn, specs: list[messages.MessageSpec],
            ctx: messages.Context) -> list:
    """A declared message (the port's, or any type's), then a few structural and
    byte-level mutations of it."""
    spec = draw(st.sampled_from(specs) | st.sampled_from(list(fuzzing.DECLARED))) if specs \
        else draw(st.sampled_from(list(fuzzing.DECLARED)))
    frames = [bytes(f) for f in draw(fuzzing.declared_message(spec, ctx, "hostile"))]
    header = msgpack.unpackb(frames[0], raw=False)
    body = frames[1:]
    for op in draw(st.lists(st.sampled_from([
            "to_frames", "set_field", "del_key", "bin_key", "spec_part", "empty_array",
            "drop_spec", "dup_spec", "retype"]), min_size=1, max_size=3)):
        specs = header.get("arrays")
        if op == "to_frames" and isinstance(specs, list):
            body = _to_frames(header, [b""] + body)
        elif op == "set_field":
            key = draw(st.sampled_from(sorted({*header, *_KEYS}, key=repr)))
            header[key] = draw(MSGPACK_VALUES)
        elif op == "del_key" and header:
            del header[draw(st.sampled_from(sorted(header, key=repr)))]
        elif op == "bin_key":  # msgpack bin, not str: "v" and b"v" are different keys
            header[draw(st.sampled_from([b"v", b"t", b"arrays", b"seq"]) | st.binary())] = \
                draw(MSGPACK_VALUES)
        elif op == "spec_part" and isinstance(specs, list) and specs:
            spec = specs[draw(st.integers(0, len(specs) - 1))]
            if isinstance(spec, list) and spec:
                part = draw(st.integers(0, len(spec) - 1))
                spec[part] = draw(st.one_of(
                    MSGPACK_VALUES,
                    st.sampled_from(DTYPES),  # another allowed dtype, same bytes
                    st.lists(st.integers(0, 5), max_size=4),  # another shape
                    st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40),
                    st.binary(max_size=64)))
        elif op == "empty_array" and isinstance(specs, list) and specs:
            # No bytes, so the size check passes for any shape with a 0 in it: what is
            # left to check is whether such an array can exist at all.
            at = draw(st.integers(0, len(specs) - 1))
            specs[at] = [draw(st.text(max_size=6)), draw(st.sampled_from(DTYPES)),
                         draw(st.lists(st.sampled_from([0, 1, 2**31, 2**62, 2**63 - 1, 2**63,
                                                        2**64 - 1]), max_size=70)), b""]
            specs.pop(draw(st.integers(0, len(specs) - 1)))
        elif op == "dup_spec" and isinstance(specs, list) and specs:
            specs.append(specs[draw(st.integers(0, len(specs) - 1))])
        elif op == "retype":
            header["t"] = draw(st.sampled_from(sorted(wire.MESSAGE_TYPES)))
    frames = [msgpack.packb(header, use_bin_type=True), *body]
    for op in draw(st.lists(st.sampled_from([
            "truncate", "flip", "insert", "drop_frame", "add_frame", "resize_frame"]),
            max_size=2)):
        if op == "truncate":
            frames[0] = frames[0][:draw(st.integers(0, max(0, len(frames[0]) - 1)))]
        elif op == "flip" and frames[0]:
            raw = bytearray(frames[0])
            for _ in range(draw(st.integers(1, 4))):
                raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
            frames[0] = bytes(raw)
        elif op == "insert":
            at = draw(st.integers(0, len(frames[0])))
            frames[0] = frames[0][:at] + draw(st.binary(min_size=1, max_size=8)) + frames[0][at:]
        elif op == "drop_frame" and len(frames) > 1:
            frames.pop(draw(st.integers(1, len(frames) - 1)))
        elif op == "add_frame":
            frames.insert(draw(st.integers(1, len(frames))), draw(st.binary(max_size=64)))
        elif op == "resize_frame" and len(frames) > 1:
            i = draw(st.integers(1, len(frames) - 1))
            frames[i] = frames[i][:draw(st.integers(0, len(frames[i])))] \
                + draw(st.binary(max_size=8))
    return frames


def random_frames() -> st.SearchStrategy[list]:
    return st.lists(st.binary(max_size=256), min_size=1, max_size=4)


def random_header() -> st.SearchStrategy[list]:
    """Headers that are msgpack maps with known keys but values of any type."""
    return st.builds(
        lambda h, frames: [msgpack.packb(h, use_bin_type=True), *frames],
        st.fixed_dictionaries({}, optional={"v": st.just(1) | MSGPACK_VALUES,
                                            "t": st.sampled_from(sorted(wire.MESSAGE_TYPES))
                                            | MSGPACK_VALUES,
                                            "arrays": MSGPACK_VALUES}),
        st.lists(st.binary(max_size=32), max_size=2))


def accepted(target: Target) -> list[messages.MessageSpec]:
    """The declarations of what the port takes (every declaration if it names none)."""
    cls = HOMES[target.kind].cls
    return fuzzing.port_plan(cls, target.port).accepted or list(fuzzing.DECLARED)


def describe(frames: list) -> str:
    """One message in a line: its type, fields and arrays (dtype, shape, extremes)."""
    try:
        msg = wire.decode([bytes(f) for f in frames], LIMIT)
    except wire.ProtocolError as exc:
        return f"<{sum(len(f) for f in frames)} bytes in {len(frames)} frames: {exc}>"
    parts = [f"{k}={v!r:.40}" for k, v in msg.fields.items()]
    for name, a in msg.arrays.items():
        extremes = ""
        if a.size and a.dtype.kind in "iuf":
            with np.errstate(invalid="ignore"):
                extremes = f" in [{a.min():.3g}, {a.max():.3g}]"
        parts.append(f"{name}:{a.dtype}{list(a.shape)}{extremes}")
    return f"{msg.type}({', '.join(parts)})"


class Frames(list):
    """One message's frames, printed as :func:`describe` says."""

    def __repr__(self) -> str:
        return describe(self)


class Batch(list):
    """[(who, frames)], printed one message a line (hypothesis prints a failing batch)."""

    def __repr__(self) -> str:
        return "Batch[\n" + "".join(f"  {who}: {describe(frames)}\n"
                                    for who, frames in self) + "]"


def declared(specs: list[messages.MessageSpec], ctx: messages.Context,
             **how: Any) -> st.SearchStrategy[list]:
    return st.sampled_from(specs).flatmap(lambda s: fuzzing.declared_message(s, ctx, **how))


def spoofs(specs: list[messages.MessageSpec], ctx: messages.Context,
           oversize: bool) -> st.SearchStrategy[list[tuple[str, list]]] | None:
    """The legitimate peer sends a benign message naming itself (``client``,
    ``member``, ...); the fuzzer then sends messages naming the same peer."""
    named = [s for s in specs if fuzzing.spoofable(s)]
    if not named:
        return None

    @st.composite
    def pair(draw: st.DrawFn) -> list[tuple[str, list]]:
        spec = draw(st.sampled_from(named))
        names = {f.name: fuzzing.LEGIT_NAMES[f.type] for f in spec.fields
                 if f.name in fuzzing.IDENTITY_FIELDS}
        out = [("legit", draw(fuzzing.declared_message(spec, ctx, "benign", names=names)))]
        for _ in range(draw(st.integers(1, 3))):
            forged = draw(st.sampled_from(named))
            out.append(("fuzz", draw(fuzzing.declared_message(
                forged, ctx, draw(st.sampled_from(["benign", "hostile"])),
                oversize=oversize and draw(st.integers(0, 5)) == 0, names=names))))
        return out

    return pair()


# The strategies of a batch, by name (KNOWN_DEFECTS leaves one out for one port).
def strategies(target: Target, skip_known: bool = True) -> dict[str, st.SearchStrategy]:
    specs, ctx = accepted(target), target.ctx
    excluded = {s for (port, s) in KNOWN_DEFECTS
                if skip_known and port == f"{target.kind}.{target.port}"}
    out = {
        "random_frames": random_frames(), "random_header": random_header(),
        "mutated": mutated(specs, ctx),
        "benign": declared(specs, ctx, values="benign"),
        "hostile": declared(specs, ctx, values="hostile"),
        "huge": declared(specs, ctx, values="huge"),
        "oversize": declared(specs, ctx, values="benign", oversize=True)
        | declared(specs, ctx, values="hostile", oversize=True),
        "any_type": declared(list(fuzzing.DECLARED), ctx, values="hostile"),
    }
    out = {name: s.map(lambda frames: [("fuzz", frames)]) for name, s in out.items()}
    spoof = spoofs(specs, ctx, oversize="oversize" not in excluded)
    if spoof is not None:
        out["spoof"] = spoof
    return {name: s for name, s in out.items() if name not in excluded}


def batches(target: Target, only: str | None = None) -> st.SearchStrategy[Batch]:
    """One to four draws of the port's strategies (or of ``only``), in one batch."""
    pool = strategies(target) if only is None else \
        {only: strategies(target, skip_known=False)[only]}
    item = st.one_of(*pool.values())

    @st.composite
    def batch(draw: st.DrawFn) -> Batch:
        return Batch(m for x in draw(st.lists(item, min_size=1, max_size=4)) for m in x)

    return batch()


SETTINGS = dict(deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                report_multiple_bugs=False, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def examples(target: Target, first: int, extra: int) -> settings:
    return settings(max_examples=first if HOMES[target.kind].first else extra, **SETTINGS)


# ----- the tests --------------------------------------------------------------------
def test_every_registered_kind_is_fuzzed_or_listed_as_skipped():
    """The registry decides what is fuzzed: every registered node kind with a ROUTER
    port has a home (a shrunk shipped topology) and all those ports are fuzzed; the
    others (actors, the league: they bind nothing) are listed, by name, as skipped."""
    assert SETUP_ERROR is None, SETUP_ERROR
    kinds = fuzzing.registered_kinds()
    skipped = fuzzing.skipped_kinds()
    print("skipped (no ROUTER port):", ", ".join(sorted(skipped)))
    print("fuzzed:", ", ".join(IDS))
    fuzzed = {home.kind for home in HOMES.values()}
    assert fuzzed | set(skipped) == set(kinds)
    assert not fuzzed & set(skipped)
    for kind, home in HOMES.items():
        assert {(kind, p) for p in home.router_ports} <= set(PORTS)


def test_every_part_configuration_a_topology_gives_a_kind_is_fuzzed():
    """A kind runs under each part configuration the shipped topologies give it, not
    only the first: the fuzz once never reached MuZero's latent search at the broker or
    the revisions at its replay, which only muzero.yaml and muzero_reanalyse.yaml give."""
    assert SETUP_ERROR is None, SETUP_ERROR
    from zmqrl.run.topology import load

    configs = {(home.kind, fuzzing.part_configuration(load(home.source)))
               for home in HOMES.values() if not home.stand_in_for}
    for path in fuzzing.shipped_topologies():
        topo = load(path)
        for name, spec in topo.nodes.items():
            # (fuzzing.placeable: not one replica of a data-parallel learner, not Atari's
            # frames, which exceed the fuzz's message cap)
            if spec.kind in fuzzing.registered_kinds() and \
                    fuzzing.placeable(path, spec.replicas) and \
                    spec.kind not in fuzzing.skipped_kinds():
                config = fuzzing.part_configuration(topo)
                assert (spec.kind, config) in configs, (path.name, name, config)
    behaviours = {HOMES[k].raw["algo"]["kind"] for k in HOMES if HOMES[k].kind ==
                  "inference_broker"}
    assert "muzero" in behaviours
    assert any("reanalyse" in HOMES[k].raw["nodes"] for k in HOMES
               if HOMES[k].kind == "replay")


def test_every_accepted_message_type_is_declared():
    """A port that takes a type with no declaration could not be fuzzed (or checked)."""
    assert fuzzing.undeclared_accepts() == []


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(frames=st.one_of(random_frames(), random_header(),
                        mutated(list(fuzzing.DECLARED), messages.Context())))
# What this test found in wire.decode (fixed there): an empty array whose shape numpy
# cannot represent raised ValueError, msgpack bin keys got into the fields, and an
# array entry with nil inline data made decode read a frame that was not there.
@example(frames=[msgpack.packb({"v": 1, "t": "step",
                                "arrays": [["obs", "float32", [0, 2**64 - 1], b""]]})])
@example(frames=[msgpack.packb({"v": 1, "t": "step", "arrays": [["x", "int8", [0] * 70, b""]]})])
@example(frames=[msgpack.packb({"v": 1, "t": "ping", b"seq": 1}, use_bin_type=True)])
# ... and (found in CI's derandomized run, killing the broker with an IndexError) an
# array entry with nil where inline bytes go, which claimed a frame nobody announced.
@example(frames=[msgpack.packb({"v": 1, "t": "step",
                                "arrays": [["obs", "float32", [2, 4], None]]})])
def test_decode_rejects_anything_it_cannot_trust_with_protocol_error(frames):
    """The generic path every node shares: whatever arrives, decode returns a message
    that keeps the protocol's promises or raises ProtocolError, which the node turns
    into a logged ``error`` reply; any other exception would end the node."""
    try:
        msg = wire.decode(frames, LIMIT)
    except wire.ProtocolError:
        return
    assert msg.type in wire.MESSAGE_TYPES
    assert all(isinstance(key, str) for key in msg.fields), msg.fields
    for name, array in msg.arrays.items():
        assert isinstance(name, str) and array.dtype.name in DTYPES


def _taken(target: Target, frames: list) -> bool:
    """Send ``frames``; whether the node took it (no ``error`` before the second pong:
    the first may come before the node's after_poll has run on it)."""
    target.sock.send_multipart(frames)
    return wire.ERROR not in ping_and_read(target) + ping_and_read(target)


@pytest.mark.parametrize("kind,port", PORTS, ids=IDS)
def test_benign_messages_from_the_declarations_get_into_the_node(targets, kind, port):
    """The generator's benign messages keep every rule, so a port takes at least one of
    its declarations: the fuzz reaches the node's real work, not only its checks. (At
    a kind's first home: a further configuration may leave a port unused, as a
    replay-fed learner's ``experience``, or take only messages that name state the node
    holds, as MuZero's search queries name latents.)"""
    if not HOMES[kind].first:
        pytest.skip("checked at the kind's first home; this configuration may leave "
                    "the port unused or take only messages that name state it holds")
    target = targets[0][(kind, port)]
    specs = [s for s in accepted(target) if s.type != wire.ERROR]
    outcome: dict[str, list[bool]] = {s.key: [] for s in specs}

    @settings(max_examples=2, **SETTINGS)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        for spec in specs:
            frames = data.draw(fuzzing.declared_message(spec, target.ctx, "benign"))
            outcome[spec.key].append(_taken(target, frames))

    run()
    assert any(any(v) for v in outcome.values()), (
        f"{kind}.{port} refused every benign message of its declarations {outcome}:\n"
        f"{target.log_tail()}")


_HONEST_SEQ = itertools.count(1)


def _refused(target: Target, frames: list, sock: zmq.Socket,
             deadline: float = PONG_DEADLINE_S) -> list[str]:
    """Send ``frames`` from ``sock``; the errors (not "ask again") before the second
    pong (the first may come before the node's after_poll has run on it)."""
    sock.send_multipart(frames)
    refusals: list[str] = []
    ping_and_read(target, deadline, sock, refusals)
    ping_and_read(target, deadline, sock, refusals)
    return refusals


@contextlib.contextmanager
def honest_peer(target: Target) -> Iterator[zmq.Socket]:
    """A new connection to the port, closed after use."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # (os.urandom: hypothesis seeds the random module, which would repeat the name)
    sock.setsockopt(zmq.IDENTITY, b"honest-" + os.urandom(6).hex().encode())
    sock.connect(target.address)
    try:
        yield sock
    finally:
        sock.close()


def honest_message(target: Target) -> tuple[messages.MessageSpec, list] | tuple[()]:
    """A benign message of the port's declarations (its spec and frames) that an honest
    peer sends and the node takes, found once per target before its fuzz (() where
    none is)."""
    if target.honest is None:
        specs = [s for s in accepted(target) if s.type != wire.ERROR]
        found: list = []

        @settings(max_examples=4, **SETTINGS)
        @given(data=st.data())
        def find(data: st.DataObject) -> None:
            for spec in specs:  # (every spec drawn each time: the draws never depend
                # on what the node answered, as hypothesis requires)
                frames = data.draw(fuzzing.declared_message(spec, target.ctx, "benign"))
                if not found:
                    with honest_peer(target) as sock:
                        if not _refused(target, frames, sock):
                            found.append((spec, frames))

        find()
        target.honest = found[0] if found else ()
    return target.honest


def _fuzz_port(target: Target, only: str | None = None,
               deadline: float = PONG_DEADLINE_S) -> None:
    honest = honest_message(target)

    @examples(target, EXAMPLES_PER_PORT, EXTRA_EXAMPLES_PER_PORT)
    @given(batch=batches(target, only))
    def run(batch: Batch) -> None:
        for who, frames in batch:
            (target.legit if who == "legit" else target.sock).send_multipart(frames)
        # The first pong is sent while the batch is being read, before the node's
        # after_poll (batching, training) has run on it; the second comes only after
        # that, so a crash there is blamed on this batch, not on the next one.
        assert_pong(target, deadline)
        assert_pong(target, deadline)
        ping_and_read(target, deadline, target.legit)  # the spoofed peer is served too
        if honest:
            # The oracle: what an honest peer sent and the node took before the fuzz,
            # a new honest peer sends and it still takes. (A node a hostile batch froze,
            # as a league full of made-up players or a replay whose layout one insert
            # fixed, answers with an error. A new connection: the legitimate one may
            # still wait on its own request, which flow control may rightly hold.)
            spec, frames = honest
            # A new connection each try, until the deadline: a node that binds a name
            # to the peer that first used it (the pbt controller's members) learns that
            # the last honest peer's connection closed only once ZeroMQ's I/O thread has
            # taken the close, which on a loaded machine can come after the next peer's
            # message (CI, 2026-12-07). A node a batch froze refuses every try.
            until = time.monotonic() + deadline
            while True:
                # (someone new to take, where the message names players: a league that
                # keeps every name it hears of refuses the new ones once it is full)
                fresh = fuzzing.with_fresh_names(frames, spec, next(_HONEST_SEQ))
                with honest_peer(target) as sock:
                    refused = _refused(target, fresh, sock, deadline)
                if not refused or time.monotonic() > until:
                    break
                time.sleep(0.2)  # the poll's interval
            assert not refused, (f"{target.kind}.{target.port}: after this batch the "
                                 f"honest peer's message, taken before the fuzz, is "
                                 f"refused: {refused[0]}\n{target.log_tail()}")

    run()


@pytest.mark.parametrize("kind,port", PORTS, ids=IDS)
def test_hostile_frames_never_stop_a_port(targets, kind, port):
    _fuzz_port(targets[0][(kind, port)])


# ZMTP 3.0 as a DEALER with the NULL mechanism: greeting, then the READY command.
ZMTP_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") \
    + b"\x00" * 32
ZMTP_READY = b"\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER"


def _hung_up(raw: socket.socket, deadline: float) -> bool:
    """Whether the peer closes the connection before ``deadline`` (reading what it sends)."""
    while time.monotonic() < deadline:
        raw.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not raw.recv(4096):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True  # reset
    return False


@pytest.mark.parametrize("kind,port", PORTS, ids=IDS)
def test_garbage_below_the_protocol_only_costs_the_connection(targets, kind, port):
    """Straight into the Unix socket: a frame announced at 2^62 bytes after a proper
    handshake makes the node hang up at once (``MAXMSGSIZE``: nothing is buffered);
    bytes that are not ZMTP at all, left hanging on open connections, do not keep the
    port from serving others."""
    target = targets[0][(kind, port)]
    path = target.address.removeprefix("ipc://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(path)
        raw.sendall(ZMTP_GREETING + ZMTP_READY + b"\x02" + (1 << 62).to_bytes(8, "big"))
        assert _hung_up(raw, time.monotonic() + 10), f"{kind} kept a 2^62-byte frame coming"
    rng = np.random.default_rng()
    garbage = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    try:
        for raw in garbage:
            raw.connect(path)
            try:
                raw.sendall(rng.bytes(int(rng.integers(1, 512))))
            except OSError:
                pass  # it may hang up mid-way; that is fine too
        assert_pong(target)
    finally:
        for raw in garbage:
            raw.close()


# ----- well-formed messages with bad values or dtypes, generated from the declarations --
OTHER_DTYPE = {"float32": "float64", "float64": "float32", "bool": "uint8", "int64": "int32",
               "int32": "int64", "float16": "int8", "uint8": "int8"}


@st.composite
def violation(draw: st.DrawFn, spec: messages.MessageSpec, ctx: messages.Context) -> list:
    """A benign message of ``spec`` with one value, dtype, array or field broken, such
    that it keeps no declaration of its type (so the port must refuse it)."""
    frames = draw(fuzzing.declared_message(spec, ctx, "benign"))
    msg = wire.decode([bytes(f) for f in frames])
    arrays = {k: np.array(v) for k, v in msg.arrays.items()}
    fields = dict(msg.fields)
    how = draw(st.sampled_from(["dtype", "field", "nan", "action", "drop", "drop_field"]))
    floats = sorted(k for k, a in arrays.items() if a.dtype.kind == "f" and a.size)
    if how == "dtype" and arrays:
        name = draw(st.sampled_from(sorted(arrays)))
        arrays[name] = arrays[name].astype(OTHER_DTYPE.get(arrays[name].dtype.name, "float64"))
    elif how == "field" and spec.fields:
        f = draw(st.sampled_from(spec.fields))
        fields[f.name] = draw(st.sampled_from(["7", 1.5, True, [1], -1, {"a": 1}]))
    elif how == "nan" and floats:
        name = draw(st.sampled_from(floats))
        arrays[name].flat[draw(st.integers(0, arrays[name].size - 1))] = \
            draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    elif how == "action" and "action" in arrays and arrays["action"].size:
        arrays["action"].flat[0] = draw(st.sampled_from([-1, ctx.num_actions or 2, 2**40]))
    elif how == "drop" and arrays:
        arrays.pop(draw(st.sampled_from(sorted(arrays))))
    elif how == "drop_field" and fields:
        fields.pop(draw(st.sampled_from(sorted(fields))))
    bad = wire.encode(spec.type, arrays, **fields)
    if fuzzing.keeps_some_declaration(wire.decode([bytes(f) for f in bad]), ctx) is None:
        reject()  # the mutation happened to keep the rules (say, another valid action)
    return Frames(bad)


@pytest.mark.parametrize("kind,port", [
    pytest.param(k, p, id=f"{k}.{p}", marks=[pytest.mark.xfail(
        strict=False, reason=KNOWN_DEFECTS[(f"{k}.{p}", "violations")])]
        if (f"{k}.{p}", "violations") in KNOWN_DEFECTS else []) for k, p in PORTS])
def test_bad_values_and_dtypes_get_an_error_reply(targets, kind, port):
    """Every port checks values and dtypes against the declarations (zmqrl.bus.messages):
    a message that breaks one is answered ``error`` and does not reach the node's work.
    (``error`` itself is never answered with an error.)"""
    target = targets[0][(kind, port)]
    specs = [s for s in accepted(target) if s.type != wire.ERROR]

    @examples(target, VIOLATIONS_PER_PORT, EXTRA_VIOLATIONS_PER_PORT)
    @given(frames=st.sampled_from(specs).flatmap(lambda s: violation(s, target.ctx)))
    def run(frames: list) -> None:
        target.sock.send_multipart(frames)
        replies = ping_and_read(target)
        assert wire.ERROR in replies, (
            f"{kind}.{port} took a message that breaks its declaration: {describe(frames)} "
            f"({fuzzing.keeps_some_declaration(wire.decode(frames), target.ctx)})")

    run()


@pytest.mark.parametrize("kind,port", [
    pytest.param(k, p, id=f"{k}.{p}", marks=[pytest.mark.xfail(
        strict=False, reason=KNOWN_DEFECTS[(f"{k}.{p}", "published")])]
        if (f"{k}.{p}", "published") in KNOWN_DEFECTS else []) for k, p in PUBS])
def test_what_nodes_publish_keeps_its_declaration(targets, kind, port):
    """Everything a fuzzed node published on its ``pub`` ports while it was fuzzed
    (the learner's and parameter server's parameters) keeps its declaration: finite
    tensors of the model's shapes, whatever the fuzz fed it."""
    sub = next(s for s in targets[1] if (s.kind, s.port) == (kind, port))
    seen = 0
    while sub.sock.poll(0):
        msg = wire.decode(sub.sock.recv_multipart())
        problem = fuzzing.keeps_some_declaration(msg, sub.ctx)
        assert problem is None, (f"{kind}.{port} published '{msg.type}' (version "
                                 f"{msg.fields.get('version')}) breaking its declaration: "
                                 f"{problem}")
        seen += 1
    print(f"{kind}.{port}: {seen} messages checked")


def test_every_node_counted_and_logged_its_rejections(targets):
    by_kind: dict[str, Target] = {}
    for target in targets[0].values():
        by_kind.setdefault(target.kind, target)
    for kind, target in by_kind.items():
        assert target.proc.poll() is None, f"{kind} died:\n{target.log_tail()}"
        # The last batch's rejections may show only in the next metrics row (one a
        # second or two).
        metrics = target.run_dir / "metrics" / f"{target.node}.csv"
        rows = wait_for(lambda metrics=metrics: [
            r for r in read_csv(metrics) if int(r["bad_messages"]) > 0], 10,
            f"{kind}'s metrics to count rejected messages")
        assert int(rows[-1]["bad_messages"]) > 0
        text = target.log.read_text()
        assert "rejected message on '" in text, kind
        assert "Traceback" not in text, f"{kind} logged a traceback:\n{target.log_tail()}"


@pytest.mark.parametrize("port_id,strategy", [
    pytest.param(p, s, marks=pytest.mark.xfail(strict=False, reason=why), id=f"{p}-{s}")
    for (p, s), why in KNOWN_DEFECTS.items() if s not in ("violations", "published")])
def test_known_defects_still_reproduce(targets, port_id, strategy):
    """Each strategy the fuzz leaves out (KNOWN_DEFECTS), alone on its port and last (it
    may stall or kill the node): an xfail until its fix is in, then an XPASS, which says
    that the entry can go."""
    kind, port = port_id.split(".")
    _fuzz_port(targets[0][(kind, port)], only=strategy, deadline=KNOWN_DEADLINE_S)


# ----- crashes this fuzz found in nodes/, fixed there: one test each -----------------
UNROLL = 4  # algo.unroll
OBS = 4  # CartPole's observation size
TOPOLOGY = {
    "name": "fuzz",
    "env": {"id": "CartPole-v1"},
    "model": {"kind": "mlp", "hidden": [8]},
    "algo": {"kind": "a2c", "unroll": UNROLL, "batch_size": 4},
    "network": {"max_message_bytes": LIMIT},
    "nodes": {
        "learner": {"kind": "learner", "args": {"device": "cpu", "checkpoint_every": 0}},
        "broker": {"kind": "inference_broker", "args": {"device": "cpu"},
                   "links": {"experience": "learner.experience", "params": "learner.params"}},
    },
}


def in_process(name: str, tmp_path: Path) -> Any:
    """Node ``name`` of the fuzz topology, set up in this process (sockets on ipc)."""
    topo = from_dict(TOPOLOGY)
    spec = topo.nodes[name]
    node = load_class(spec.target)(NodeContext(topo, spec, 0, tmp_path, Endpoints(topo, tmp_path)))
    node._open_sockets()
    node.setup()
    return node


def close(node: Any) -> None:
    for sock in node.sockets.values():
        sock.close(linger=0)


def unroll(**arrays: np.ndarray) -> wire.Message:
    n = 4
    a = {"obs": np.zeros((UNROLL + 1, n, OBS), np.float32),
         "action": np.zeros((UNROLL, n), np.int64), "logp": np.zeros((UNROLL, n), np.float32),
         "reward": np.zeros((UNROLL, n), np.float32), "done": np.zeros((UNROLL, n), bool)}
    return wire.decode(wire.encode(wire.UNROLL, {**a, **arrays}, version=0))


def test_broker_rejects_non_finite_observations(tmp_path):
    broker = in_process("broker", tmp_path)
    try:
        step = wire.encode(wire.STEP, {"obs": np.full((2, OBS), np.nan, np.float32),
                                       "reward": np.zeros(2, np.float32),
                                       "done": np.zeros(2, bool)}, seq=1)
        with pytest.raises(wire.ProtocolError):
            broker.on_policy([b"peer"], wire.decode(step))
        broker.after_poll()  # what the node does next must not raise: that would kill it
        assert not broker.pending, "the rejected step was queued for the model"
    finally:
        close(broker)


def test_broker_survives_pipelined_steps_of_different_sizes(tmp_path):
    broker = in_process("broker", tmp_path)
    try:
        for n in (2, 3):  # one connection, two requests in flight (no reply in between)
            step = wire.decode(wire.encode(wire.STEP, {
                "obs": np.zeros((n, OBS), np.float32), "reward": np.zeros(n, np.float32),
                "done": np.zeros(n, bool)}, seq=n))
            if n == 2:
                broker.on_policy([b"peer"], step)
            else:  # the protocol allows one outstanding step per connection
                with pytest.raises(wire.ProtocolError, match="already outstanding"):
                    broker.on_policy([b"peer"], step)
        broker.after_poll()  # serves the first
    finally:
        close(broker)


def test_learner_rejects_out_of_range_actions(tmp_path):
    learner = in_process("learner", tmp_path)
    try:
        with pytest.raises(wire.ProtocolError):
            learner.on_experience([b"peer"], unroll(action=np.full((UNROLL, 4), 3, np.int64)))
        learner.after_poll()  # batch_size 4 = this unroll's columns: nothing to train on
        assert learner.updates == 0
    finally:
        close(learner)


def test_learner_keeps_finite_parameters(tmp_path):
    import torch

    learner = in_process("learner", tmp_path)
    try:
        with pytest.raises(wire.ProtocolError):
            learner.on_experience([b"peer"], unroll(reward=np.full((UNROLL, 4), np.nan,
                                                                   np.float32)))
        learner.after_poll()
        assert learner.updates == 0, "it trained on the rejected unroll"
        # ... and it still trains on good data, which stays finite.
        learner.on_experience([b"peer"], unroll(reward=np.ones((UNROLL, 4), np.float32),
                                                action=np.ones((UNROLL, 4), np.int64)))
        learner.after_poll()
        assert learner.updates == 1
        assert all(torch.isfinite(p).all() for p in learner.model.parameters())
    finally:
        close(learner)


