"""Population-based training: the topology's ``population`` section and PBT's decisions.

``expand(raw)`` turns a topology with a ``population: {size: K, ...}`` section into an
ordinary one: every node (but the ``pbt`` controller) is copied once per member with
the suffix ``_m<i>``, its links renamed to its own member's nodes, and each member's
learner gets ``args.member`` and ``args.hyperparameters`` (drawn from the section's
distributions with the topology's seed) plus a ``pbt`` link to the controller. Nodes
therefore see plain nodes; only :mod:`nodes.pbt` knows about members.

``decide`` is PBT's exploit/explore step (Jaderberg et al. 2017) as a pure function:
truncation selection (a member in the bottom fraction copies one of the top fraction,
among the members that have a checkpoint), then perturbation (x0.8 / x1.2) or, with
``resample_probability``, a fresh draw.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any

import jsonschema

CONTROLLER = "pbt"  # the controller node's name in an expanded topology
_NUMBER = {"type": "number"}
_PAIR = {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2}
_DIST = {
    "type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": False,
    "properties": {"loguniform": _PAIR, "uniform": _PAIR,
                   "choice": {"type": "array", "minItems": 1}},
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["size", "hyperparameters"],
    "additionalProperties": False,
    "properties": {
        "size": {"type": "integer", "minimum": 2},
        "hyperparameters": {"type": "object", "minProperties": 1,
                            "additionalProperties": _DIST},
        "ready_after_steps": {"type": "integer", "minimum": 1},
        "truncation": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
        "perturb": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0},
                    "minItems": 2, "maxItems": 2},
        "resample_probability": {"type": "number", "minimum": 0, "maximum": 1},
        "shared": {"type": "array", "items": {"type": "string"}},  # nodes not copied
    },
}


@dataclass(frozen=True)
class Settings:
    """The ``population`` section with its defaults (what the controller reads)."""

    size: int
    hyperparameters: dict[str, dict[str, Any]]
    ready_after_steps: int = 20_000
    truncation: float = 0.25
    perturb: tuple[float, float] = (0.8, 1.2)
    resample_probability: float = 0.25
    shared: tuple[str, ...] = ()

    @classmethod
    def parse(cls, section: dict[str, Any]) -> Settings:
        jsonschema.validate(section, SCHEMA)
        s = dict(section)
        s["perturb"] = tuple(s.get("perturb", (0.8, 1.2)))
        s["shared"] = tuple(s.get("shared", ()))
        return cls(**s)


def member_name(node: str, member: int) -> str:
    return f"{node}_m{member}"


def sample(distribution: dict[str, Any], rng: random.Random) -> Any:
    """One draw from ``{loguniform: [a, b]}``, ``{uniform: [a, b]}`` or ``{choice: [...]}``."""
    (kind, spec), = distribution.items()
    if kind == "loguniform":
        return math.exp(rng.uniform(math.log(spec[0]), math.log(spec[1])))
    if kind == "uniform":
        return rng.uniform(spec[0], spec[1])
    return rng.choice(spec)


def sample_all(settings: Settings, rng: random.Random) -> dict[str, Any]:
    return {name: sample(d, rng) for name, d in sorted(settings.hyperparameters.items())}


def expand(raw: Any) -> Any:
    """``raw`` with its ``population`` section replaced by K members' nodes (a copy);
    anything malformed is left for the schema checks to report."""
    if not isinstance(raw, dict) or "population" not in raw:
        return raw
    out = copy.deepcopy(raw)
    section = out.pop("population")
    try:
        settings = Settings.parse(section)
    except (jsonschema.ValidationError, TypeError) as exc:
        raise ValueError(f"population: {getattr(exc, 'message', exc)}") from None
    nodes = out.get("nodes")
    if not isinstance(nodes, dict):
        return out
    rng = random.Random(out.get("seed", 0))
    shared = set(settings.shared) | {CONTROLLER}
    copied = [name for name in nodes if name not in shared]
    expanded: dict[str, Any] = {n: b for n, b in nodes.items() if n in shared}
    expanded.setdefault(CONTROLLER, {"kind": "pbt"})
    for member in range(settings.size):
        hyper = sample_all(settings, rng)
        for name in copied:
            body = copy.deepcopy(nodes[name])
            links = body.get("links", {})
            for link, target in list(links.items()):
                node, _, port = str(target).partition(".")
                if node in copied:
                    links[link] = f"{member_name(node, member)}.{port}"
            if _learns(body):
                if body.get("replicas", 1) != 1:  # a load would reach one replica only
                    raise ValueError(f"population: node '{name}': a member's learner must "
                                     "have one replica (data-parallel members: not yet)")
                args = body.setdefault("args", {})
                args["member"] = member
                args["hyperparameters"] = hyper
                body.setdefault("links", {})["pbt"] = f"{CONTROLLER}.members"
            expanded[member_name(name, member)] = body
    out["nodes"] = expanded
    # The controller reads its settings from its args: the section lives on there.
    ctl = expanded[CONTROLLER]
    ctl.setdefault("args", {})["population"] = section
    return out


def _learns(body: dict[str, Any]) -> bool:
    """Whether a node's class learns (its role, zmqrl.bus.roles): a subclass of the built-in
    learner under ``impl:`` is a member's learner too. A node whose class cannot be
    loaded is not; the topology check reports it."""
    from zmqrl import plugins
    from zmqrl.bus import roles
    if not isinstance(body, dict):
        return False
    kind, impl = body.get("kind"), body.get("impl")
    target = impl if isinstance(impl, str) else \
        plugins.import_path("node", kind) if isinstance(kind, str) else None
    if target is None:
        return False
    try:
        return getattr(plugins.load_path(target, part="node"), "role", None) == roles.LEARNS
    except plugins.PluginError:
        return False


MAX_HYPERPARAMETERS = 64


def reported_hyperparameters_error(values: Any) -> str | None:
    """What is wrong with a member report's hyperparameters, or None: they must be what
    the lineage and the controller's checkpoint can hold (JSON), names to finite
    numbers, short strings or booleans."""
    if values is None:
        return None
    if not isinstance(values, dict) or len(values) > MAX_HYPERPARAMETERS:
        return f"hyperparameters must map at most {MAX_HYPERPARAMETERS} names to values"
    for name, value in values.items():
        ok = isinstance(name, str) and len(name) <= 64 and (
            isinstance(value, bool) or (isinstance(value, str) and len(value) <= 256)
            or (isinstance(value, int | float) and math.isfinite(value)))
        if not ok:
            return (f"hyperparameter {name!r:.40}: {value!r:.40} is not a finite number, "
                    "a short string or a boolean")
    return None


# ----- exploit / explore --------------------------------------------------------------
@dataclass
class Member:
    """What the controller knows of one member (from its last report)."""

    steps: int = 0
    mean_return: float | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    checkpointed: bool = False
    last_ready: int = 0  # steps at its last ready point


@dataclass(frozen=True)
class Decision:
    recipient: int
    donor: int
    hyperparameters: dict[str, Any]
    how: dict[str, str]  # hyperparameter -> "perturb x0.8" / "resample"
    recipient_return: float | None = None  # their mean returns when it was decided
    donor_return: float | None = None


def decide(member: int, members: dict[int, Member], settings: Settings,
           rng: random.Random) -> Decision | None:
    """At ``member``'s ready point: None if it stays as it is (not in the bottom
    fraction, or no donor), else whom it copies and its new hyperparameters.

    Ranking counts only members with a mean return; donors must have a checkpoint
    (a member that never checkpointed is never copied, ray#27170)."""
    ranked = sorted((i for i, m in members.items() if m.mean_return is not None),
                    key=lambda i: members[i].mean_return)  # worst first
    if member not in ranked or len(ranked) < 2:
        return None
    cut = max(1, math.floor(len(ranked) * settings.truncation))
    if member not in ranked[:cut]:
        return None
    donors = [i for i in ranked[-cut:] if members[i].checkpointed and i != member]
    if not donors:
        return None
    donor = rng.choice(donors)
    hyper, how = {}, {}
    for name, value in members[donor].hyperparameters.items():
        if name in settings.hyperparameters and rng.random() < settings.resample_probability:
            hyper[name], how[name] = sample(settings.hyperparameters[name], rng), "resample"
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            factor = rng.choice(settings.perturb)
            hyper[name], how[name] = type(value)(value * factor), f"perturb x{factor}"
        else:
            hyper[name], how[name] = value, "copy"
    return Decision(member, donor, hyper, how, members[member].mean_return,
                    members[donor].mean_return)


class Population:
    """The controller's state: what each member last reported, its ready points, the
    exploits under way and done, and the RNG; :meth:`state`/:meth:`restore` make it
    JSON (the controller's checkpoint), so a restarted controller keeps the
    hyperparameters it gave at exploit time (ray#62173) and its ready points."""

    def __init__(self, settings: Settings, seed: int = 0):
        self.settings = settings
        self.members: dict[int, Member] = {}
        self.rng = random.Random(seed)
        self.pending: dict[int, Decision] = {}  # recipient -> decision being carried out
        self.exploits = 0

    def on_report(self, member: int, steps: int, mean_return: float | None,
                  hyperparameters: dict[str, Any], checkpointed: bool) -> Decision | None:
        """Take a member's report; the decision to carry out if this is its ready point."""
        m = self.members.setdefault(member, Member())
        m.steps, m.mean_return, m.checkpointed = steps, mean_return, checkpointed
        if member not in self.pending:  # while loading, its report may predate the load
            m.hyperparameters = dict(hyperparameters)
        if member in self.pending or steps - m.last_ready < self.settings.ready_after_steps:
            return None
        m.last_ready = steps
        decision = decide(member, self.members, self.settings, self.rng)
        if decision is not None:
            self.pending[member] = decision
        return decision

    def on_loaded(self, member: int) -> Decision | None:
        """The recipient loaded its donor's state: the exploit is done."""
        decision = self.pending.pop(member, None)
        if decision is not None:
            self.members[member].hyperparameters = dict(decision.hyperparameters)
            self.exploits += 1
        return decision

    def abandon(self, member: int) -> None:
        self.pending.pop(member, None)

    def state(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"members": {str(i): dataclasses.asdict(m) for i, m in self.members.items()},
                "exploits": self.exploits, "rng": [version, list(internal), gauss]}

    def restore(self, state: dict[str, Any]) -> None:
        self.members = {int(i): Member(**m) for i, m in state["members"].items()}
        self.exploits = int(state["exploits"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.pending = {}  # an exploit cut off by the restart is simply not done
