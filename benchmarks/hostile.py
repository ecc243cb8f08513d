"""Hostile peers for the soak (benchmarks/soak.py): find a running run's ports, send them
valid-looking hostile messages at a bounded rate, and count what came back.

    python benchmarks/hostile.py --plan PLAN.json --seed 1 --out stats.json [--rate 50]
    python benchmarks/hostile.py --run-dir RUN_DIR     # print the plan of a running run

**The plan** (:func:`discover`, run once by the soak, in its own process: it imports the
node classes, so torch) is every bound port of the run, found as the nodes find them:
the run's resolved ``topology.yaml``, each node class's ``binds`` and ``accepts``
(``zmqrl.plugins`` / ``load_class``), ``Endpoints(topo, run_dir).bind_address`` per
replica, and the supervisor's socket; plus what a forger needs (the env's shapes, the
algorithm's unroll, the labels, which labels sample a replay, the PBT members and their
hyperparameters). A peer reads it as JSON and imports no torch.

**A peer** (:func:`peer_main`, one process each) holds a few DEALER connections per
ROUTER port, each with an identity of its own (one is replaced now and then: identity
churn), and a SUB per PUB port that subscribes anew now and then and never reads. Each
message is built from the declarations in ``zmqrl.bus.messages`` with
``zmqrl.bus.wire.encode``: the right type for the port (or, one time in seven, a type
the port does not take) and one hostile property a correct node must refuse or bound:

* ``huge``: float entries of ±3e38 (finite, so "finite" checks pass them); number
  fields too (a PBT ``mean_return`` of 3e38);
* ``nonfinite``: NaN, inf, -inf entries and fields;
* ``out_of_range``: actions outside the action space, ``unit`` values of 1.5 or -0.2,
  negative ``nonneg`` values, outcomes of ±3, member indices, versions and batch sizes
  far beyond anything real;
* ``policy_rows``: visit-distribution rows of values in [0, 1] not summing to 1;
* ``oversized``: the message's count (envs of a step or an unroll, items of an insert,
  keys of priorities) raised to fill 0.25-1 MiB, every value plausible (drawn 0.3 times
  as often as each other kind); for a report
  without arrays, its lists and maps (60,000 episode returns, 4,000 row fields);
* ``forged``: identity fields naming someone real: a ``sample`` whose ``client`` is the
  learner's label, PBT messages naming a real member, a supervisor ``hello`` naming a
  real label with that node's real pid (read from ``status/_supervisor.json``), reports
  under a real label;
* ``wrong_port``: a well-formed message of a type the port does not take.

Episode returns are never plausible: a node believes a well-formed return (by design,
docs/reliability.md), so a peer sends them only poisoned (3e38, NaN) or, in reports
under a forged label, below anything CartPole gives (0-5): what a correct run accepts
from the peers never moves the return the soak compares.

Every peer also pings every ROUTER port every 2 s and times the ``pong``: a port that
stops answering shows there. Rates are bounded (``--rate`` messages/s and
``--bytes-rate`` bytes/s, token buckets), so the soak measures robustness, not a flood.
The stats file counts, per port, what was sent (by type and kind), what came back (by
type, with the first distinct ``error`` texts), sends refused at the high-water mark and
pong round trips.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.bus import messages, wire
from zmqrl.bus.messages import Array, MessageSpec
from zmqrl.bus.status import pid_alive

HUGE = 3e38  # below float32's largest (3.4e38): finite, and poison once squared
KINDS = ("huge", "nonfinite", "out_of_range", "policy_rows", "oversized", "forged",
         "wrong_port")
IDENTITY_FIELDS = ("client", "member", "request", "donor", "label", "pid", "node")
COUNT_SYMBOLS = ("n", "B", "m")  # what "oversized" raises
# Episode statistics (arrays over "k") that a node accepted would count in the run's
# return: a peer sends them only poisoned, so that what it sends never moves the very
# return the soak compares (a plausible return from a foreign peer is believed by design:
# docs/reliability.md, "Not guaranteed").
EPISODE_SYMBOL = "k"
WRONG_PORT_P = 1 / 7
# "oversized" is drawn this much less often than the other kinds, and fills 0.25-1 MiB:
# so that --rate (messages), not --bytes-rate, is what usually binds (~35 KB a message).
OVERSIZED_WEIGHT = 0.3
OVERSIZED_MIB = (0.25, 1.0)
PING_EVERY_S = 2.0
CHURN_P = 0.02  # per message: replace one of the connection's identities
SUPERVISOR = "supervisor"


# ----- the plan: every bound port of a running run ---------------------------------------
def discover(run_dir: str | Path) -> dict[str, Any]:
    """The plan of the run in ``run_dir`` (its ``topology.yaml`` must exist): imports the
    node classes (torch), so the soak calls it once per run, never a peer."""
    from zmqrl.bus.endpoints import Endpoints, supervisor_address
    from zmqrl.bus.labels import label as make_label
    from zmqrl.bus.spec import load_class, ports_of
    from zmqrl.run.topology import load

    run_dir = Path(run_dir)
    topo = load(run_dir / "topology.yaml")
    endpoints = Endpoints(topo, run_dir)
    env = topo.env_spec()
    algo = topo.algo_config
    parts = topo.parts_config
    items = "transitions" if parts.unrolls else parts.items
    recurrent = "lstm" in str(topo.model.get("kind", ""))
    variants = {wire.INSERT: items, wire.BATCH: items,
                wire.UNROLL: "recurrent" if recurrent else ""}
    targets, labels, samplers, members = [], {}, [], {}
    for name in sorted(topo.nodes):
        spec = topo.nodes[name]
        cls = load_class(spec.target, topo.import_paths) if spec.command is None else None
        accepts = dict(getattr(cls, "accepts", {}) or {})
        for replica in range(spec.replicas):
            label = make_label(name, replica, spec.replicas)
            labels[label] = {"node": name, "replica": replica,
                             "kind": spec.kind or spec.impl or "command",
                             "role": getattr(cls, "role", "") or ""}
            for port, kind in sorted(ports_of(spec).items()):
                targets.append({
                    "label": label, "node": name, "port": port, "socket": kind,
                    "address": endpoints.bind_address(name, port, replica),
                    # a ROUTER port that declares nothing: every type is worth a try
                    "accepts": [] if kind != "router" else
                    list(accepts.get(port, sorted({s.type for s in messages.MESSAGES})))})
        for link in spec.links:
            if link == "replay" and any(t.split(".")[-1] == "sample"
                                        for t in spec.targets(link)):
                samplers += [make_label(name, r, spec.replicas) for r in range(spec.replicas)]
        member = spec.args.get("member", -1)
        if isinstance(member, int) and member >= 0:
            members[str(member)] = {"label": make_label(name, 0, spec.replicas),
                                    "hyperparameters": spec.args.get("hyperparameters") or {}}
    targets.append({"label": SUPERVISOR, "node": SUPERVISOR, "port": "reports",
                    "socket": "router", "address": supervisor_address(run_dir),
                    "accepts": [wire.HELLO, wire.HEARTBEAT, wire.METRICS]})
    dims = {k: v for k, v in (("T", getattr(algo, "unroll", None)),
                              ("L", getattr(algo, "sequence_length", None))) if v}
    return {
        "run_dir": str(run_dir.resolve()), "targets": targets, "labels": labels,
        "samplers": samplers, "members": members, "variants": variants,
        "context": {"obs_shape": list(env.obs_shape),
                    "obs_dtype": np.dtype(env.obs_dtype).name,
                    "action_shape": list(env.action_shape),
                    "action_dtype": np.dtype(env.action_dtype).name,
                    "num_actions": env.num_actions, "dims": dims},
    }


# ----- the forger ------------------------------------------------------------------------
def _token(t: int | str) -> tuple[str | None, int]:
    """A shape entry as (symbol, offset); (None, size) for a fixed size."""
    if isinstance(t, int):
        return None, t
    sym, _, off = t.partition("+")
    return sym, int(off or 0)


class Forger:
    """Hostile messages for the ports of one plan, from the message declarations."""

    def __init__(self, plan: dict[str, Any], rng: random.Random):
        self.plan = plan
        self.rng = rng
        self.np = np.random.default_rng(rng.getrandbits(32))
        c = plan["context"]
        self.obs_shape = tuple(c["obs_shape"])
        self.obs_dtype = np.dtype(c["obs_dtype"])
        self.action_shape = tuple(c["action_shape"])
        self.action_dtype = np.dtype(c["action_dtype"])
        self.num_actions = c["num_actions"]
        self.dims = dict(c["dims"])
        self.labels = list(plan["labels"])
        self.members = {int(k): v for k, v in plan["members"].items()}
        self.status_path = Path(plan["run_dir"]) / "status" / "_supervisor.json"
        self._pids: tuple[float, dict[str, int]] = (0.0, {})
        self.seq = 0

    # -- choosing -------------------------------------------------------------------------
    def spec_for(self, msg_type: str) -> MessageSpec:
        variant = self.plan["variants"].get(msg_type)
        choices = [s for s in messages.MESSAGES if s.type == msg_type]
        exact = [s for s in choices if s.variant == variant]
        return exact[0] if exact else self.rng.choice(choices)

    def kinds_for(self, spec: MessageSpec) -> list[str]:
        """The hostile kinds that can apply to ``spec`` (``wrong_port`` is chosen by type)."""
        floats = [a for a in spec.arrays if self._dtype(a).kind == "f"] or spec.tensors
        numbers = [f for f in spec.fields if f.type == "number"]
        out = []
        if floats or numbers:
            out += ["huge", "nonfinite"]
        if any(set(a.rules) & {"action", "unit", "nonneg"} for a in spec.arrays) or any(
                f.rule in ("nonneg", "positive", "unit") for f in spec.fields):
            out.append("out_of_range")
        if any("unit" in a.rules and len(a.shape) == 2 for a in spec.arrays):
            out.append("policy_rows")
        if any(_token(t)[0] in COUNT_SYMBOLS for a in spec.arrays for t in a.shape) or \
                any(f.type in ("list", "map") for f in spec.fields):
            out.append("oversized")
        if any(f.name in IDENTITY_FIELDS for f in spec.fields):
            out.append("forged")
        return out or ["forged"]

    # -- building -------------------------------------------------------------------------
    def build(self, msg_type: str, kind: str, size: int = 0) -> list:
        """The frames of one ``msg_type`` message with the hostile property ``kind``
        (``oversized``: about ``size`` bytes)."""
        spec = self.spec_for(msg_type)
        if kind == "oversized":
            return self._oversized(spec, size)
        episodes = kind in ("huge", "nonfinite") and self.rng.random() < 0.5
        arrays, fields = self._plausible(spec, {}, episodes=episodes)
        if kind == "huge":
            self._poison(spec, arrays, fields, [HUGE, -HUGE], episodes)
        elif kind == "nonfinite":
            self._poison(spec, arrays, fields, [np.nan, np.inf, -np.inf], episodes)
        elif kind == "out_of_range":
            self._out_of_range(spec, arrays, fields)
        elif kind == "policy_rows":
            for a in spec.arrays:
                if "unit" in a.rules and len(a.shape) == 2 and a.name in arrays:
                    rows = arrays[a.name]
                    rows[:] = self.np.uniform(0.3, 1.0, rows.shape)  # each in [0, 1]
        elif kind == "forged":
            self._forge(spec, fields)
        return wire.encode(spec.type, arrays, **fields)

    def _dtype(self, a: Array) -> np.dtype:
        if a.dtype == "obs":
            return self.obs_dtype
        if a.dtype == "action":
            return self.action_dtype
        return np.dtype("float32" if a.dtype == "float" else a.dtype)

    def _free_dims(self, spec: MessageSpec, fixed: dict[str, int]) -> dict[str, int]:
        r = self.rng
        dims = {"n": r.randint(1, 8), "B": r.randint(1, 32), "k": r.randint(1, 4),
                "m": r.randint(1, 8), "A": self.num_actions or r.randint(2, 9),
                "S": r.randint(64, 512), "T": r.randint(2, 8), "L": r.randint(2, 8),
                "H": r.randint(4, 16)}
        dims.update(self.dims)
        dims.update(fixed)
        return dims

    def _shape(self, a: Array, dims: dict[str, int]) -> tuple[int, ...]:
        shape: list[int] = []
        for t in a.shape:
            if t == "*obs":
                shape += self.obs_shape
            elif t == "*action":
                shape += self.action_shape
            else:
                sym, off = _token(t)
                shape.append(off if sym is None else dims[sym] + off)
        return tuple(shape)

    def _values(self, a: Array, shape: tuple[int, ...]) -> np.ndarray:
        """Plausible values for one array, by its rules and (for a few) its name."""
        g, dtype = self.np, self._dtype(a)
        if a.name == "policy":
            return g.dirichlet(np.ones(shape[-1]), shape[:-1]).astype(dtype)
        if a.name == "outcome":
            return g.choice([-1.0, 0.0, 1.0], shape).astype(dtype)
        if a.name in ("done", "truncated"):
            return g.random(shape) < 0.05
        if a.name == "ep_length":
            return g.integers(10, 200, shape).astype(dtype)
        if a.name == "ep_return":
            return g.uniform(10, 200, shape).astype(dtype)
        if "action" in a.rules and self.num_actions:
            return g.integers(0, self.num_actions, shape).astype(dtype)
        if dtype == np.bool_:
            return g.random(shape) < 0.5
        if dtype.kind in "iu":
            return g.integers(0, 255 if dtype.itemsize == 1 else 10_000, shape).astype(dtype)
        if "unit" in a.rules:
            return g.uniform(0, 1, shape).astype(dtype)
        if "nonneg" in a.rules:
            return g.uniform(0, 2, shape).astype(dtype)
        return g.normal(0, 1, shape).astype(dtype)

    def _plausible(self, spec: MessageSpec, fixed: dict[str, int], skip_optional: bool = False,
                   episodes: bool = False) -> tuple[dict, dict]:
        """A message of ``spec`` that its declaration would pass; with episode statistics
        only if ``episodes`` (see :data:`EPISODE_SYMBOL`)."""
        dims = self._free_dims(spec, fixed)
        together = {n: c.names for c in spec.constraints
                    if isinstance(c, messages.Together) for n in c.names}
        take = {a.name for a in spec.arrays if a.required}
        if not skip_optional:
            for a in spec.arrays:
                if not a.required and a.name not in take and self.rng.random() < 0.5:
                    take.update(together.get(a.name, (a.name,)))
        k_arrays = {a.name for a in spec.arrays
                    if any(_token(t)[0] == EPISODE_SYMBOL for t in a.shape)}
        take = take - k_arrays | (k_arrays if episodes else set())
        arrays: dict[str, np.ndarray] = {}
        for a in spec.arrays:
            if a.name in take:
                arrays[a.name] = self._values(a, self._shape(a, dims))
        for c in spec.constraints:
            if isinstance(c, messages.Implies) and {c.a, c.b} <= arrays.keys():
                arrays[c.b] = arrays[c.b] | arrays[c.a]
            elif isinstance(c, messages.RowsPerTrue) and {c.rows, c.mask} <= arrays.keys():
                rows = arrays[c.rows]
                want = int(np.count_nonzero(arrays[c.mask]))
                arrays[c.rows] = np.resize(rows, (want, *rows.shape[1:])).astype(rows.dtype)
        if spec.tensors is not None:  # params/grads: a small model's worth, named plainly
            arrays.update({"fc.weight": self.np.normal(0, 1, (8, 4)).astype(np.float32),
                           "fc.bias": np.zeros(8, np.float32)})
        fields = {f.name: self._field(spec, f) for f in spec.fields
                  if f.required or self.rng.random() < 0.5}
        return arrays, {k: v for k, v in fields.items() if v is not None}

    def _member(self) -> int:
        return self.rng.choice(list(self.members)) if self.members else 0

    def _field(self, spec: MessageSpec, f: messages.Field) -> Any:
        r, name = self.rng, f.name
        if name == "seq":
            self.seq += 1
            return self.seq
        if name == "label" or name == "node":
            return r.choice(self.labels)
        if name == "client":
            return f"peer-{os.getpid()}"
        if name in ("member", "request", "donor"):
            return self._member()
        if name == "hyperparameters":
            member = self.members.get(self._member())
            return dict(member["hyperparameters"]) if member else {}
        if name == "pid":
            return os.getpid()
        if name == "replica":
            return 0
        if name == "incarnation":
            return os.urandom(8).hex()
        if name == "kind":
            return self.plan["labels"].get(r.choice(self.labels), {}).get("kind", "actor")
        if name == "role":
            return ""
        if name == "row":
            return {"time_s": 1.0, "env_steps": r.randint(0, 10_000), "bad_messages": 0,
                    "dropped": 0, "cpu_cores": 1.0}
        if name == "episodes":
            return [r.uniform(0, 5) for _ in range(r.randint(0, 4))]  # none this low
        if name == "batch_size":
            return r.randint(1, 32)
        if name in ("shows", "args"):
            return {}
        if f.rule == "unit":
            return r.random()
        if f.type == "int":
            return r.randint(1 if f.rule == "positive" else 0, 1000)
        if f.type == "number":
            return r.uniform(0, 100)
        if f.type == "bool":
            return r.random() < 0.5
        if f.type == "str":
            return "x"
        if f.type == "map":
            return {}
        if f.type == "list":
            return []
        return None

    # -- the hostile properties -----------------------------------------------------------
    def _poison(self, spec: MessageSpec, arrays: dict, fields: dict, values: list,
                episodes: bool = False) -> None:
        floats = [k for k, v in arrays.items() if v.dtype.kind == "f" and v.size]
        if floats:
            hit = self.rng.sample(floats, self.rng.randint(1, len(floats)))
            if episodes:  # never plausible returns: "ep_return" is always among them
                hit = sorted(set(hit) | {"ep_return"} & set(floats))
            for name in hit:
                flat = arrays[name].reshape(-1)
                idx = self.np.integers(0, flat.size, max(1, flat.size // 4))
                flat[idx] = self.rng.choice(values)
        numbers = [f.name for f in spec.fields if f.type == "number"]
        if numbers and (not floats or self.rng.random() < 0.5):
            fields[self.rng.choice(numbers)] = float(self.rng.choice(values))
        if "hyperparameters" in fields and self.rng.random() < 0.5:
            fields["hyperparameters"] = {k: float(self.rng.choice(values))
                                         for k in (fields["hyperparameters"] or {"lr": 0})}

    def _out_of_range(self, spec: MessageSpec, arrays: dict, fields: dict) -> None:
        r = self.rng
        hit = False
        for a in spec.arrays:
            arr = arrays.get(a.name)
            if arr is None or not arr.size:
                continue
            flat = arr.reshape(-1)
            i = int(self.np.integers(0, flat.size))
            if "action" in a.rules:
                flat[i] = r.choice([self.num_actions or 10**6, -1, 2**31 - 1]) \
                    if arr.dtype.kind in "iu" else 1e6
            elif "unit" in a.rules:
                flat[i] = r.choice([1.5, -0.2])
            elif "nonneg" in a.rules:
                flat[i] = -1
            elif a.name == "outcome":
                flat[i] = r.choice([3.0, -3.0])
            else:
                continue
            hit = True
        beyond = {"member": 10**6, "request": 10**6, "donor": 10**6, "version": 2**62,
                  "batch_size": 10**9, "seq": 2**62, "steps": 2**62, "n": 2**31,
                  "replica": 10**6, "updates": 2**62}
        wrong = {f.name: beyond[f.name] for f in spec.fields if f.name in beyond}
        wrong.update({f.name: r.choice([1.5, -0.2]) if f.rule == "unit" else -1
                      for f in spec.fields if f.rule in ("nonneg", "positive", "unit")})
        if wrong and (not hit or r.random() < 0.5):
            name = r.choice(sorted(wrong))
            fields[name] = wrong[name]

    def _real_pids(self) -> dict[str, int]:
        """Each node's pid as the supervisor wrote it (refreshed every 2 s)."""
        at, pids = self._pids
        if time.monotonic() - at > 2.0:
            try:
                nodes = json.loads(self.status_path.read_text())["nodes"]
                pids = {k: v["pid"] for k, v in nodes.items() if v.get("pid")}
            except (OSError, ValueError, KeyError, TypeError):
                pass
            self._pids = (time.monotonic(), pids)
        return pids

    def _forge(self, spec: MessageSpec, fields: dict) -> None:
        r = self.rng
        if "client" in fields or "batch_size" in fields:
            samplers = self.plan["samplers"] or self.labels
            fields["client"] = r.choice(samplers)
        if "label" in fields:
            label = r.choice(self.labels)
            fields["label"] = label
            info = self.plan["labels"][label]
            if "pid" in fields:  # a hello naming a real node and its real pid
                pid = self._real_pids().get(label)
                fields.update(pid=pid or os.getpid(), node=info["node"],
                              replica=info["replica"], kind=info["kind"], role=info["role"])
            if "row" in fields:  # believed, it would move the run's counts
                fields["episodes"] = [r.uniform(0, 5) for _ in range(10)]
        for name in ("member", "request", "donor"):
            if name in fields:
                fields[name] = self._member()
        if any(f.name == "mean_return" for f in spec.fields):
            fields["mean_return"] = 1e4  # the best member by far: a donor-to-be

    def _oversized(self, spec: MessageSpec, size: int) -> list:
        syms = sorted({_token(t)[0] for a in spec.arrays for t in a.shape} &
                      set(COUNT_SYMBOLS))
        if not syms:  # lists and maps of the header instead (bounded by its 1 MiB cap)
            arrays, fields = self._plausible(spec, {})
            for f in spec.fields:
                if f.type == "list":  # returns no real episode had (CartPole's are >= 8)
                    fields[f.name] = [self.rng.uniform(0, 5) for _ in range(60_000)]
                elif f.type == "map":
                    fields[f.name] = {f"k{i}": float(i) for i in range(4000)}
            self._forge(spec, fields)  # a report must name a real label to be read at all
            try:
                return wire.encode(spec.type, arrays, **fields)
            except wire.ProtocolError:  # over the header cap: the most a sender can send
                for f in spec.fields:
                    if f.type == "list":
                        fields[f.name] = fields[f.name][:20_000]
                return wire.encode(spec.type, arrays, **fields)
        sym = self.rng.choice(syms)
        one = self._plausible(spec, {sym: 1}, skip_optional=True)[0]
        two = self._plausible(spec, {sym: 2}, skip_optional=True)[0]
        per = max(1, sum(v.nbytes for v in two.values()) - sum(v.nbytes for v in one.values()))
        count = max(2, size // per)
        arrays, fields = self._plausible(spec, {sym: count}, skip_optional=True)
        return wire.encode(spec.type, arrays, **fields)


# ----- a peer ----------------------------------------------------------------------------
class _Bucket:
    """A token bucket: ``rate`` per second, up to one second's worth saved."""

    def __init__(self, rate: float):
        self.rate, self.tokens, self.at = rate, rate, time.monotonic()

    def wait_s(self, cost: float) -> float:
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return 0.0 if self.tokens >= min(cost, self.rate) else \
            (min(cost, self.rate) - self.tokens) / self.rate

    def take(self, cost: float) -> None:
        self.tokens -= cost


def _identity() -> bytes:
    return b"\x01" + os.urandom(7)  # a routing id must not start with a zero byte


class Peer:
    """One hostile process: connections to every port, the send loop, its counts."""

    def __init__(self, plan: dict[str, Any], seed: int, rate: float, bytes_rate: float,
                 identities: int, kinds: tuple[str, ...] = KINDS):
        self.plan = plan
        self.kinds = kinds
        self.rng = random.Random(seed)
        self.forger = Forger(plan, self.rng)
        self.ctx = zmq.Context()
        self.identities = identities
        self.msgs, self.bytes = _Bucket(rate), _Bucket(bytes_rate)
        self.poller = zmq.Poller()
        self.socks: dict[int, list[zmq.Socket]] = {}
        self.owner: dict[zmq.Socket, int] = {}
        self.targets = plan["targets"]
        self.stats: dict[str, dict] = {}
        self.pings: dict[int, tuple[int, float]] = {}  # seq -> (target, sent at)
        self.ping_seq = 0
        for i, t in enumerate(self.targets):
            self.stats[self._key(t)] = {"sent": Counter(), "bytes": 0, "blocked": 0,
                                        "replies": Counter(), "errors": {}, "pong_ms": []}
            self.socks[i] = [self._open(i) for _ in range(identities)]

    @staticmethod
    def _key(t: dict) -> str:
        return f"{t['label']}.{t['port']}"

    def _open(self, i: int) -> zmq.Socket:
        t = self.targets[i]
        if t["socket"] == "pub":
            sock = self.ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.RCVHWM, 1)  # never read: the publisher's queue to us fills
            sock.setsockopt(zmq.SUBSCRIBE, b"")
        else:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.ROUTING_ID, _identity())
            sock.setsockopt(zmq.SNDHWM, 64)
            self.poller.register(sock, zmq.POLLIN)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(t["address"])
        self.owner[sock] = i
        return sock

    def _churn(self, i: int) -> None:
        socks = self.socks[i]
        # the first connection of a ROUTER port stays: it carries the pings
        first = 1 if self.targets[i]["socket"] != "pub" and len(socks) > 1 else 0
        if first >= len(socks):
            return
        j = self.rng.randrange(first, len(socks))
        old = socks[j]
        if old in self.owner and self.targets[i]["socket"] != "pub":
            self.poller.unregister(old)
        self.owner.pop(old, None)
        old.close(linger=0)
        socks[j] = self._open(i)

    def _drain(self, timeout_ms: int) -> None:
        for sock, _ in self.poller.poll(timeout_ms):
            for _ in range(100):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._reply(self.owner.get(sock), frames)

    def _reply(self, i: int | None, frames: list) -> None:
        if i is None:
            return
        s = self.stats[self._key(self.targets[i])]
        try:
            msg = wire.decode(frames)
        except wire.ProtocolError:
            s["replies"]["undecodable"] += 1
            return
        s["replies"][msg.type] += 1
        if msg.type == wire.ERROR:
            text = str(msg.fields.get("error", ""))[:120]
            if len(s["errors"]) < 12 or text in s["errors"]:
                s["errors"][text] = s["errors"].get(text, 0) + 1
        elif msg.type == wire.PONG:
            sent = self.pings.pop(msg.fields.get("seq", -1), None)
            if sent is not None:
                s["pong_ms"].append(round((time.monotonic() - sent[1]) * 1000, 1))

    def _ping_all(self) -> None:
        for i, t in enumerate(self.targets):
            if t["socket"] != "router" or t["label"] == SUPERVISOR:
                continue
            self.ping_seq += 1
            try:
                self.socks[i][0].send_multipart(wire.encode(wire.PING, seq=self.ping_seq),
                                                zmq.NOBLOCK)
                self.pings[self.ping_seq] = (i, time.monotonic())
            except zmq.Again:
                self.stats[self._key(t)]["blocked"] += 1

    def _next(self) -> tuple[int, str, str, list | None]:
        """(target, type, kind, frames): one hostile message (None for a resubscribe)."""
        i = self.rng.randrange(len(self.targets))
        t = self.targets[i]
        if t["socket"] == "pub":
            return i, "subscribe", "resubscribe", None
        accepts = [a for a in t["accepts"] if a != wire.ERROR] or t["accepts"]
        usable = [a for a in accepts if set(self.kinds) & set(
            self.forger.kinds_for(self.forger.spec_for(a)))]
        if "wrong_port" in self.kinds and (self.rng.random() < WRONG_PORT_P or not usable):
            others = sorted({s.type for s in messages.MESSAGES} - set(t["accepts"]))
            msg_type, kind = self.rng.choice(others), "wrong_port"
            spec = self.forger.spec_for(msg_type)
            arrays, fields = self.forger._plausible(spec, {})
            return i, msg_type, kind, wire.encode(spec.type, arrays, **fields)
        msg_type = self.rng.choice(usable or accepts)
        kinds = [k for k in self.forger.kinds_for(self.forger.spec_for(msg_type))
                 if k in self.kinds] or ["forged"]
        kind = self.rng.choices(kinds, [OVERSIZED_WEIGHT if k == "oversized" else 1.0
                                        for k in kinds])[0]
        size = int(self.rng.uniform(*OVERSIZED_MIB) * 2**20)
        return i, msg_type, kind, self.forger.build(msg_type, kind, size)

    def run(self, seconds: float, out: Path, watch_pid: int | None) -> None:
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
        end = time.monotonic() + seconds
        next_ping = next_save = next_alive = time.monotonic()
        while not stop["now"] and time.monotonic() < end:
            now = time.monotonic()
            if now >= next_alive:
                next_alive = now + 1.0
                if watch_pid and not pid_alive(watch_pid):
                    break
            if now >= next_ping:
                next_ping = now + PING_EVERY_S
                self._ping_all()
            if now >= next_save:
                next_save = now + 5.0
                self.save(out)
            i, msg_type, kind, frames = self._next()
            cost = sum(memoryview(f).nbytes for f in frames) if frames else 0
            while not stop["now"]:
                wait = max(self.msgs.wait_s(1), self.bytes.wait_s(cost))
                if wait <= 0:
                    break
                self._drain(int(wait * 1000) + 1)
            self.msgs.take(1)
            self.bytes.take(cost)
            t = self.targets[i]
            s = self.stats[self._key(t)]
            s["sent"][f"{msg_type}/{kind}"] += 1
            s["bytes"] += cost
            if frames is None:  # a SUB: leave and join again (the node hears a new subscriber)
                self._churn(i)
            else:
                try:
                    self.rng.choice(self.socks[i]).send_multipart(frames, zmq.NOBLOCK,
                                                                  copy=False)
                except zmq.Again:
                    s["blocked"] += 1
                if self.rng.random() < CHURN_P:
                    self._churn(i)
            self._drain(0)
        self.save(out)
        for socks in self.socks.values():
            for sock in socks:
                sock.close(linger=0)
        self.ctx.term()

    def save(self, out: Path) -> None:
        data = {"pid": os.getpid(), "ports": {
            k: {"sent": dict(v["sent"]), "bytes": v["bytes"], "blocked": v["blocked"],
                "replies": dict(v["replies"]), "errors": v["errors"],
                "pongs": len(v["pong_ms"]),
                "pong_ms_max": max(v["pong_ms"], default=None),
                "pong_ms_median": sorted(v["pong_ms"])[len(v["pong_ms"]) // 2]
                if v["pong_ms"] else None}
            for k, v in self.stats.items()}}
        now = time.monotonic()
        for i, sent in self.pings.values():  # a ping unanswered for 10 s: the port hangs
            if now - sent > 10.0:
                port = data["ports"][self._key(self.targets[i])]
                port["unanswered_pings"] = port.get("unanswered_pings", 0) + 1
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(out)


def peer_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", type=Path, help="a plan written by the soak")
    parser.add_argument("--run-dir", type=Path, help="print the plan of this running run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("hostile-stats.json"))
    parser.add_argument("--rate", type=float, default=50.0, help="messages/s")
    parser.add_argument("--bytes-rate", type=float, default=2 * 2**20, help="bytes/s")
    parser.add_argument("--identities", type=int, default=3, help="connections per port")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--watch-pid", type=int, help="stop when this process is gone")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="the hostile kinds to send (default: all)")
    args = parser.parse_args(argv)
    if args.run_dir is not None:
        print(json.dumps(discover(args.run_dir), indent=1))
        return
    if args.plan is None:
        parser.error("give --plan (or --run-dir to print one)")
    plan = json.loads(args.plan.read_text())
    Peer(plan, args.seed, args.rate, args.bytes_rate, args.identities, tuple(args.kinds)).run(
        args.seconds, args.out, args.watch_pid)


if __name__ == "__main__":
    peer_main()
