"""What the node fuzz (tests/test_fuzz_nodes.py) fuzzes, found rather than listed.

* **Targets**: every node kind registered in the ``zmqrl.nodes`` entry-point group
  (``zmqrl.plugins``), each ROUTER port its class ``binds``, the message types the port
  ``accepts``. A kind that binds no ROUTER port (an actor, the league: they only connect)
  has nothing to fuzz and is listed as skipped.
* **Every configuration of each kind**, with no table here: a kind runs once under each
  distinct part configuration the shipped topologies (``topologies/*.yaml``) give it (the
  algorithm, its parts, the optional arrays its hyperparameters fix: MuZero's broker
  searches latents, its replay with a reanalyse node serves revisions), in the first
  topology that gives it (those without pixels first), shrunk (tiny model, cpu, small
  capacities, the fuzz's message cap). The first configuration of a kind is its home
  (``replay``), the others are named after their topology (``replay@muzero_reanalyse``).
  A kind no shipped topology runs stands in for a node with exactly its ``binds`` (the
  sink, a learner stand-in by design, takes the learner's place in a2c.yaml, as ``zmqrl
  bench`` does); a kind with neither fails with a message telling its author to ship a
  topology that runs it.
* **Messages**: every declaration of ``zmqrl.bus.messages`` (``MESSAGES``), generated
  from its fields, arrays, shape symbols, rules and constraints in the port's context
  (env shapes, the algorithm's dimensions, the model's tensors): benign values (which a
  correct node takes), hostile values (NaN, inf, huge-but-finite numbers, ints at the
  int64 limits, wrong dtypes) and oversized counts (one count symbol as large as the
  message cap allows), so a new message type or field is fuzzed with no test edit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hypothesis import strategies as st

from zmqrl import plugins
from zmqrl.bus import messages, wire

REPO = Path(__file__).resolve().parent.parent
LIMIT = 1 << 20  # the fuzzed nodes' message limit (network.max_message_bytes)
# Shrinking a shipped configuration: node args by name, wherever a kind's Args has one.
SHRUNK_ARGS: dict[str, Any] = {"device": "cpu", "precision": "float32", "capacity": 256,
                               "min_size": 16, "checkpoint_every": 0,
                               "checkpoint_every_s": 0}
SMALL = 8  # model widths at most this
# algo.batch_size at most this (within the shrunk replay's capacity; not smaller: a learner
# handed an oversized unroll trains it a batch at a time, and the fuzz waits for that)
SMALL_BATCH = 32
# Fields that name a peer: what identity spoofing forges.
IDENTITY_FIELDS = ("client", "member", "label", "node", "donor", "request")
# The legitimate peer's name, by field type: the learner's label, member 0.
LEGIT_NAMES: dict[str, Any] = {"str": "learner", "int": 0}
HUGE_FLOATS = (3e38, -3e38, 1e30, -1e30)
# Array rules whose rows a benign message makes distributions (a search's policy).
_ROWS_SUM_TO_ONE = ("unit", "distribution")


class FuzzSetupError(AssertionError):
    """A registered kind the fuzz cannot place: the message says what to add."""


# ----- targets ------------------------------------------------------------------------
@dataclass
class Home:
    """Where a kind is fuzzed under one configuration: a shrunk shipped topology and the
    node that runs it."""

    kind: str
    cls: type
    source: Path  # the shipped topology it came from
    node: str  # the node of that kind in it
    raw: dict[str, Any]  # the shrunk topology
    stand_in_for: str | None = None  # the kind it replaced, if no topology runs it
    first: bool = True  # the kind's first configuration (the others get fewer examples)

    @property
    def router_ports(self) -> list[str]:
        return [p for p, t in self.cls.binds.items() if t == "router"]

    @property
    def pub_ports(self) -> list[str]:
        return [p for p, t in self.cls.binds.items() if t == "pub"]


def registered_kinds() -> dict[str, type]:
    return {name: plugins.resolve("node", name) for name in plugins.names("node")}


def skipped_kinds() -> dict[str, str]:
    """Registered kinds with no ROUTER port, and why they are not fuzzed here."""
    return {name: "binds no ROUTER port (it only connects): nothing to fuzz here"
            for name, cls in registered_kinds().items()
            if not any(t == "router" for t in getattr(cls, "binds", {}).values())}


def shipped_topologies() -> list[Path]:
    return sorted((REPO / "topologies").glob("*.yaml"))


def part_configuration(topo: Any) -> tuple:
    """What makes a node of a topology run another way than in the next: the algorithm,
    its parts and the optional arrays its hyperparameters fix."""
    cfg = topo.algo_config
    parts = topo.parts_config
    return (cfg.kind, *(getattr(parts, f) for f in parts.FIELDS),
            tuple(sorted(cfg.optional_arrays().items())))


def _expanded_kinds(path: Path) -> tuple[dict[str, str], tuple, set[str]]:
    """Node name -> kind of a shipped topology as it runs (a population expanded), its
    part configuration, and the nodes it runs in several replicas (one replica of a
    data-parallel learner alone waits for its peers: no home for the fuzz)."""
    from zmqrl.run.topology import load

    topo = load(path)
    return ({name: spec.kind for name, spec in topo.nodes.items() if spec.kind},
            part_configuration(topo),
            {name for name, spec in topo.nodes.items() if spec.replicas > 1})


def _pixels(path: Path) -> bool:
    """An Atari topology: its unrolls of frames do not fit the fuzz's message cap
    (LIMIT), so a benign message of its could not reach the node."""
    env = (yaml.safe_load(path.read_text()).get("env") or {}).get("id", "")
    return "Atari" in env and "MinAtar" not in env


def placeable(path: Path, replicas: int) -> bool:
    """Whether a node of the topology at ``path`` can be a fuzz home: run alone (one
    replica of a data-parallel learner waits for its peers) and with messages that fit
    the fuzz's cap."""
    return replicas == 1 and not _pixels(path)


def _cheap_first(path: Path) -> tuple[bool, str]:
    """Topologies without pixel envs first (their envs and models start fastest)."""
    return (_pixels(path), path.name)


def homes() -> dict[str, Home]:
    """Every registered kind with a ROUTER port, under every part configuration the
    shipped topologies give it -> where it is fuzzed (``kind``, ``kind@topology``)."""
    kinds = registered_kinds()
    wanted = {k for k in kinds if k not in skipped_kinds()}
    found: dict[str, Home] = {}
    configs: set[tuple] = set()
    runs: list[tuple[Path, dict[str, str]]] = []
    for path in sorted(shipped_topologies(), key=_cheap_first):
        names, config, replicated = _expanded_kinds(path)
        runs.append((path, names))
        for name, kind in names.items():
            if kind not in wanted or (kind, config) in configs or \
                    not placeable(path, 2 if name in replicated else 1):
                continue
            configs.add((kind, config))
            home = kind if kind not in found else f"{kind}@{path.stem}"
            found[home] = Home(kind, kinds[kind], path, name, shrink(path),
                               first=home == kind)
    for kind in sorted(wanted - found.keys()):
        cls = kinds[kind]
        place = next(((path, name, other) for path, names in runs
                      for name, other in names.items()
                      if other != kind and kinds[other].binds == cls.binds), None)
        if place is None:
            raise FuzzSetupError(
                f"node kind '{kind}' ({cls.__module__}:{cls.__name__}) binds "
                f"{dict(cls.binds)} but no shipped topology (topologies/*.yaml) runs it, "
                "and no shipped node binds the same ports for it to stand in for: add a "
                f"topology that runs a '{kind}' node, so tests/test_fuzz_nodes.py can "
                "fuzz its ports")
        path, name, other = place
        raw = shrink(path)
        old = raw["nodes"][name]
        raw["nodes"][name] = {"kind": kind, "args": _shrunk_args(cls, {}),
                              **({"links": {k: v for k, v in old.get("links", {}).items()
                                            if k in getattr(cls, "links", {})}}
                                 if getattr(cls, "links", {}) else {})}
        found[kind] = Home(kind, cls, path, name, raw, stand_in_for=other)
    return found


def _shrunk_args(cls: type, args: dict[str, Any]) -> dict[str, Any]:
    out = dict(args)
    fields = {f.name for f in dataclasses.fields(cls.Args)} \
        if dataclasses.is_dataclass(cls.Args) else set()
    for name, value in SHRUNK_ARGS.items():
        if name in fields and (name not in out or name != "min_size"
                               or out[name] > value):
            out[name] = value
    return out


def _small(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value > SMALL:
        return SMALL
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [min(v, SMALL) for v in value[:1]]
    return value


def shrink(path: Path) -> dict[str, Any]:
    """The shipped topology at ``path``, shrunk so that ``node`` (and what its links
    need) starts in a second or two and stays small."""
    raw = yaml.safe_load(path.read_text())
    raw.pop("expect", None)
    raw["name"] = f"fuzz-{path.stem}"
    raw.setdefault("network", {})["max_message_bytes"] = LIMIT
    raw["model"] = {k: (v if k == "kind" else _small(v)) for k, v in raw.get("model", {}).items()}
    algo = raw.get("algo", {})
    if isinstance(algo.get("batch_size"), int):
        algo["batch_size"] = min(algo["batch_size"], SMALL_BATCH)
    kinds = registered_kinds()
    # (a node an expansion makes, the pbt controller, keeps the args it is made with)
    for spec in raw.get("nodes", {}).values():
        if spec.get("kind") in kinds:
            spec["args"] = _shrunk_args(kinds[spec["kind"]], spec.get("args") or {})
    return raw


def needed_nodes(raw_path: Path, node: str) -> list[str]:
    """``node`` and the nodes its links reach (transitively): what must run with it."""
    from zmqrl.run.topology import load

    topo = load(raw_path)
    out, todo = [], [node]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.append(name)
        todo += [target.split(".")[0] for target in topo.nodes[name].all_targets()]
    return out


def port_context(raw_path: Path) -> messages.Context:
    """What the nodes of a topology check messages against: its env's spaces, the
    algorithm's dimensions and its model's tensors."""
    from zmqrl.parts.models import build_model
    from zmqrl.run.topology import load

    topo = load(raw_path)
    env = topo.env_spec()
    model = build_model(topo.model, env, algo=topo.algo_config)
    algo = topo.algo_config
    return messages.Context.from_env(
        env, unroll=getattr(algo, "unroll", None),
        sequence_length=getattr(algo, "sequence_length", None),
        state_size=int(getattr(model, "state_size", 0) or 0), model=model, algo=algo)


# Every declaration, the core's and the registered plug-ins' (MuZero's among them): the
# set of messages is as open as the set of parts.
DECLARED: tuple[messages.MessageSpec, ...] = tuple(messages.registered(every=True).values())


def declarations(msg_type: str) -> list[messages.MessageSpec]:
    """Every declared variant of ``msg_type``."""
    return [s for s in DECLARED if s.type == msg_type]


def keeps_some_declaration(msg: wire.Message, ctx: messages.Context) -> str | None:
    """None if ``msg`` keeps one of its type's declarations; else why not."""
    problems = []
    for spec in declarations(msg.type):
        try:
            messages.check(msg, spec, ctx)
            return None
        except wire.ProtocolError as exc:
            problems.append(str(exc))
    return "; ".join(problems) or f"'{msg.type}' has no declaration"


# ----- values -------------------------------------------------------------------------
@st.composite
def hostile_array(draw: st.DrawFn, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array of the right dtype and shape whose values may be hostile: NaN, inf,
    huge-but-finite (±3e38, ±1e30), ints at their dtype's limits, negatives."""
    kind = draw(st.sampled_from(["normal", "zero", "nan", "inf", "huge", "extreme",
                                 "negative"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if kind in ("extreme", "huge"):
            near = np.array([info.min, info.max, info.max - 1, info.min + 1], dt)
            return rng.choice(near, size=shape)
        low = max(info.min, -3 if kind == "negative" else 0)
        return rng.integers(low, min(info.max, 3), size=shape, endpoint=True).astype(dt)
    values = rng.normal(size=shape)
    if kind == "huge":
        mask = rng.random(shape) < 0.5
        values[mask] = rng.choice(HUGE_FLOATS, size=int(mask.sum()))
    else:
        special = {"zero": 0.0, "nan": np.nan, "inf": np.inf, "extreme": 3e38,
                   "negative": -1e6}.get(kind)
        if special is not None:
            values[rng.random(shape) < 0.5] = special
    with np.errstate(over="ignore"):  # 3e38 as float16 is inf: one more hostile value
        return values.astype(dt)


def _benign_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...],
                  rules: tuple[str, ...], ctx: messages.Context) -> np.ndarray:
    """Values every rule of the declarations admits (and a correct node takes)."""
    if dtype.kind == "b":
        return rng.random(shape) < 0.3
    if "action" in rules and dtype.kind in "iu":
        return rng.integers(0, ctx.num_actions or 2, size=shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 3, size=shape).astype(dtype)
    values = rng.random(shape)  # in [0, 1): inside "finite", "unit", "sign", "bounded"
    if any(r in _ROWS_SUM_TO_ONE for r in rules) and len(shape) >= 2 and shape[-1]:
        values = values / values.sum(axis=-1, keepdims=True)  # rows: distributions
    return values.astype(dtype)


def _field_value(draw: st.DrawFn, f: messages.Field, hostile: bool, names: dict) -> Any:
    if f.name in names:
        return names[f.name]
    if hostile and draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from({
            "int": [-1, 2**63 - 1, -(2**63), 2**64 - 1, 2**62],
            "number": [*HUGE_FLOATS, math.nan, math.inf, 2**63 - 1],
            "str": ["", "x" * 4096, "learner", "\x00"],
            "bool": [1, 0],
            "map": [{"lr": 3e38}, {"x": b"raw"}, {str(i): i for i in range(200)}],
            "list": [[3e38] * 3, [math.nan], list(range(50_000))],
        }[f.type]))
    if f.type == "int":
        return draw(st.integers(1 if f.rule == "positive" else 0, 3))
    if f.type == "number":
        # in [0, 1] where the rule bars negatives, else [-1, 1]: inside every other rule
        return draw(st.floats(0, 1)) if f.rule in ("unit", "nonneg") else \
            draw(st.floats(1, 3)) if f.rule == "positive" else draw(st.floats(-1, 1))
    if f.type == "str":
        return draw(st.sampled_from(["learner", "fuzz", "0"]))
    if f.type == "bool":
        return draw(st.booleans())
    if f.type == "map":
        return {"x": 1.0} if f.rule == "row" else {"m0": 1000.0} if f.rule == "ratings" else {}
    if f.rule == "names":  # enough for the benign index arrays (0..3) to name a player
        return ["m0", "m1", "m2", "m3"]
    return [0.5] if f.rule == "numbers" else []


@st.composite
def declared_message(draw: st.DrawFn, spec: messages.MessageSpec, ctx: messages.Context,
                     values: str = "benign", oversize: bool = False,
                     names: dict[str, Any] | None = None) -> list:
    """One message of ``spec`` built from its declaration in ``ctx``: ``values``
    "benign" (inside every rule), "huge" (benign but for one array or field at
    huge-but-finite values) or "hostile" (anything); ``oversize``: one count symbol (``n``,
    ``B``, ``k``, ``m``, ``S``) as large as the message cap allows (``LIMIT``), far
    beyond what any node takes in one message. ``names``: fields to set (a peer's
    name, for spoofing)."""
    hostile = values == "hostile"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # "huge": benign but for one array (or field) at huge-but-finite values, so that it
    # gets past a check that asks only for finite numbers, into the node's work
    huge_at = draw(st.integers(0, 63)) if values == "huge" else None
    bound: dict[str, Any] = dict(ctx.dims)
    if ctx.num_actions is not None:
        bound["A"] = ctx.num_actions
    bound["*obs"] = tuple(ctx.obs_shape) if ctx.obs_shape is not None else (4,)
    bound["*action"] = tuple(ctx.action_shape) if ctx.action_shape is not None else ()
    for sym, (_, least) in messages.symbols_of(spec).items():
        if sym not in bound:
            bound[sym] = draw(st.integers(max(least, 1 if sym != "k" else 0), 3))
    # optional arrays the run's configuration sends (or never sends) are not drawn
    fixed = ctx.arrays
    chosen = [a for a in spec.arrays if a.required or fixed.get(a.name) is True]
    groups = [c.names for c in spec.constraints if isinstance(c, messages.Together)]
    grouped = {n for g in groups for n in g}
    for g in groups:
        if not any(n in fixed for n in g) and draw(st.booleans()):
            chosen += [a for a in spec.arrays if a.name in g]
    chosen += [a for a in spec.arrays if not a.required and a.name not in grouped
               and a.name not in fixed and draw(st.booleans())]
    chosen.sort(key=spec.arrays.index)

    def dtype_of(a: messages.Array) -> np.dtype:
        if a.dtype == "obs":
            return np.dtype(ctx.obs_dtype)
        if a.dtype == "action":
            return np.dtype(ctx.action_dtype or "int64")
        return np.dtype("float32" if a.dtype == "float" else a.dtype)

    def shape_of(a: messages.Array) -> tuple[int, ...]:
        out: list[int] = []
        for part in a.shape:
            if isinstance(part, int):
                out.append(part)
            elif part in messages.STAR:
                out.extend(bound[part])
            else:
                sym, _, off = part.partition("+")
                out.append(bound[sym] + int(off or 0))
        return tuple(out)

    # Oversized, a message with a list of names its int arrays index (``games``) names
    # many made-up players at once (up to the declared most), so that over a few
    # examples a node that keeps every name it is told of fills up
    many_names: list[str] | None = None
    if oversize and any(f.rule == "names" for f in spec.fields):
        tag = draw(st.integers(0, 2**32 - 1))
        # nearly all a node may hold at once, or a power-of-two share of it
        count = messages.MAX_PLAYERS - draw(st.integers(0, 64)) if draw(st.booleans()) \
            else messages.MAX_PLAYERS >> draw(st.integers(1, 12))
        many_names = [f"x{tag:x}-{i}" for i in range(count)]
        for a in chosen:
            for part in a.shape:
                if isinstance(part, str) and part not in messages.STAR and \
                        part not in ctx.dims:
                    bound[part.partition("+")[0]] = count  # a game per name
        oversize = False
    if oversize:
        counts = sorted({p.partition("+")[0] for a in chosen for p in a.shape
                         if isinstance(p, str) and p.partition("+")[0] in ("n", "B", "k",
                                                                           "m", "S")}
                        - set(ctx.dims))
        if counts:
            sym = draw(st.sampled_from(counts))
            bound[sym] = 1
            per_unit = sum(dtype_of(a).itemsize * max(1, math.prod(shape_of(a)))
                           for a in chosen if any(isinstance(p, str) and p.startswith(sym)
                                                  for p in a.shape))
            bound[sym] = max(2, int(0.8 * LIMIT) // max(1, per_unit))
    arrays: dict[str, np.ndarray] = {}
    rows_of = {c.rows: c.mask for c in spec.constraints if isinstance(c, messages.RowsPerTrue)}
    numeric = [a.name for a in chosen if dtype_of(a).kind in "iuf"]
    huge_array = numeric[huge_at % len(numeric)] if huge_at is not None and numeric else None
    for a in chosen:
        if a.name in rows_of and rows_of[a.name] in arrays:
            bound["m"] = int(np.count_nonzero(arrays[rows_of[a.name]]))
        shape, dtype = shape_of(a), dtype_of(a)
        if hostile and draw(st.integers(0, 2)) == 0:
            arrays[a.name] = draw(hostile_array(dtype.name, shape))
        elif many_names is not None and dtype.kind in "iu" and "nonneg" in a.rules:
            # indices into the names, each array shifted by one: every name is played
            shift = sum(1 for b in arrays.values() if b.dtype.kind in "iu")
            arrays[a.name] = ((np.arange(math.prod(shape)) + shift) % len(many_names)
                              ).reshape(shape).astype(dtype)
        else:
            arrays[a.name] = _benign_array(rng, dtype, shape, a.rules, ctx)
        if a.name == huge_array and arrays[a.name].size:
            arrays[a.name] = _huge(rng, arrays[a.name])
    for c in spec.constraints:
        if isinstance(c, messages.Implies) and c.a in arrays and c.b in arrays \
                and arrays[c.a].shape == arrays[c.b].shape:
            arrays[c.a] &= arrays[c.b]
    for a_name, mask in rows_of.items():  # the mask may have changed: rows follow it
        if a_name in arrays and mask in arrays:
            want = int(np.count_nonzero(arrays[mask]))
            old = arrays[a_name]
            arrays[a_name] = np.resize(old, (want, *old.shape[1:])).astype(old.dtype)
    if spec.tensors is not None:
        shapes = getattr(ctx, spec.tensors.of) or {"w": (2, 2)}
        dtype = "float32" if spec.tensors.dtype == "float" else spec.tensors.dtype
        for name, shape in shapes.items():
            arrays[name] = draw(hostile_array(dtype, shape)) if hostile and \
                draw(st.integers(0, 3)) == 0 else rng.normal(size=shape).astype(dtype) * 0.01
    fields = {}
    for f in spec.fields:
        if f.required or huge_at is not None or draw(st.booleans()) \
                or (names and f.name in names):
            fields[f.name] = _field_value(draw, f, hostile, names or {})
        if many_names is not None and f.rule == "names":
            fields[f.name] = many_names
    numbers = [f.name for f in spec.fields if f.type in ("int", "number")
               and f.name in fields and f.name not in (names or {})]
    if huge_at is not None and numbers and (huge_array is None or huge_at % 2):
        name = numbers[huge_at % len(numbers)]
        fields[name] = 2**63 - 1 if type(fields[name]) is int else HUGE_FLOATS[huge_at % 4]
    return wire.encode(spec.type, arrays, **fields)


def _huge(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    """``a`` with some entries at huge-but-finite values of its dtype (±3e38, ±1e30 for
    floats that hold them; ints near their limits)."""
    out = a.copy()
    mask = rng.random(a.shape) < 0.5
    mask.flat[0] = True
    if a.dtype.kind == "f":
        big = np.array(HUGE_FLOATS) if np.finfo(a.dtype).max >= 3e38 else \
            np.array([np.finfo(a.dtype).max, np.finfo(a.dtype).min])
    else:
        info = np.iinfo(a.dtype)
        big = np.array([info.max, info.max - 1] + ([info.min] if info.min else []))
    out[mask] = rng.choice(big, size=int(mask.sum())).astype(a.dtype)
    return out


def spoofable(spec: messages.MessageSpec) -> list[str]:
    """The fields of ``spec`` that name a peer."""
    return [f.name for f in spec.fields if f.name in IDENTITY_FIELDS]


@dataclass
class PortPlan:
    """What one port is fuzzed with: its accepted declarations, first, then every other."""

    accepted: list[messages.MessageSpec] = field(default_factory=list)
    others: list[messages.MessageSpec] = field(default_factory=list)


def port_plan(cls: type, port: str) -> PortPlan:
    takes = set(getattr(cls, "accepts", {}).get(port, ()))
    return PortPlan([s for s in DECLARED if s.type in takes],
                    [s for s in DECLARED if s.type not in takes])


def undeclared_accepts() -> list[str]:
    """``kind.port: type`` for every accepted type with no declaration."""
    return [f"{kind}.{port}: {t}" for kind, cls in registered_kinds().items()
            for port, types in getattr(cls, "accepts", {}).items() for t in types
            if not declarations(t)]


def with_fresh_names(frames: list, spec: messages.MessageSpec, k: int) -> list:
    """``frames`` (a message of ``spec``) with the names of its ``names``-rule fields
    past the first two made new (``m0@v<k>``: snapshots a node has not seen yet), so
    that an honest message, sent again, still asks the node to take someone new."""
    msg = wire.decode(frames)
    fields = dict(msg.fields)
    for f in spec.fields:
        if f.rule == "names" and isinstance(fields.get(f.name), list):
            fields[f.name] = [n if i < 2 else f"m{i}@v{k}"
                              for i, n in enumerate(fields[f.name])]
    return wire.encode(msg.type, dict(msg.arrays), **fields)
