"""Population-based training: the topology's ``population`` section and PBT's decisions.

``expand(raw)`` turns a topology with a ``population: {size: K, ...}`` section into an
ordinary one: every node (but the ``pbt`` controller and the section's ``shared`` nodes)
is copied once per member with the suffix ``_m<i>``, its links renamed to its own
member's nodes, and each member's learner gets ``args.member`` and
``args.hyperparameters`` (drawn from the section's distributions with the topology's
seed) plus a ``pbt`` link to the controller. A shared node's link to a copied node
becomes the list of every member's copy, in member order (``learner.params`` ->
``[learner_m0.params, learner_m1.params, ...]``: a many-link, zmqrl.bus.node.Link); a
member's links to shared nodes stay as written. Nodes therefore see plain nodes; only
:mod:`nodes.pbt` knows about members.

``decide`` is PBT's exploit/explore step (Jaderberg et al. 2017) as a pure function:
truncation selection (a member in the bottom fraction copies one of the top fraction,
among the members that have a checkpoint), then perturbation (x0.8 / x1.2) or, with
``resample_probability``, a fresh draw; ranked by rating, a donor may have to be
clearly stronger (``min_donor_win_probability``), ranked by return it may have to be
ahead beyond the noise of its episodes (``min_donor_confidence``, a t-test) and by a
lead that matters (``min_donor_lead``, in return units). A
perturbed value stays within bounds: its distribution's (``uniform``/``loguniform``
clipped to their interval, a ``choice`` steps to the neighbouring choice), an int at
least 1 that moves by at least one when the factor says so, and the algorithm field's
declared range (:mod:`zmqrl.parts.bounds`); the result passes the algorithm config's
own checks, or that value is copied unchanged. ``Settings.errors`` refuses, at
validation, a hyperparameter the algorithm has no field for or a distribution that
reaches outside the field's range.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from zmqrl.bus.metrics import RETURN_WINDOW
from zmqrl.parts import algo_config, bounds
from zmqrl.parts.selfplay.elo import expected_score
from zmqrl.run.significance import welch_confidence

CONTROLLER = "pbt"  # the controller node's name in an expanded topology
_NUMBER = {"type": "number"}
_PAIR = {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2}
# One draw distribution per hyperparameter; ``explore`` (uniform/loguniform only): the
# interval exploits may perturb it within, wider than the draws' (default: theirs), so
# that a population whose draws are all bad can climb out of them.
_DIST = {
    "type": "object", "additionalProperties": False,
    "properties": {"loguniform": _PAIR, "uniform": _PAIR,
                   "choice": {"type": "array", "minItems": 1}, "explore": _PAIR},
    "oneOf": [{"required": [k]} for k in ("loguniform", "uniform", "choice")],
}
DRAWS = ("loguniform", "uniform", "choice")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["size", "hyperparameters"],
    "additionalProperties": False,
    "properties": {
        "size": {"type": "integer", "minimum": 2},
        "hyperparameters": {"type": "object", "minProperties": 1,
                            "additionalProperties": _DIST},
        "ready_after_steps": {"type": "integer", "minimum": 1},
        "ready_after_updates": {"type": "integer", "minimum": 1},
        "truncation": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
        "perturb": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0},
                    "minItems": 2, "maxItems": 2},
        "resample_probability": {"type": "number", "minimum": 0, "maximum": 1},
        "shared": {"type": "array", "items": {"type": "string"}},  # nodes not copied
        # what ranks the members: their mean episode return (reported by each learner),
        # or their rating (published by a league on the controller's `ratings` link:
        # self-play, where a return says nothing of strength)
        "rank_by": {"enum": ["mean_return", "rating"]},
        # rank_by: rating only: a bottom member copies a top one only when the top one's
        # expected score against it, by their ratings, is at least this (the Capture the
        # Flag population's exploit rule used 0.7); members rated alike keep their own
        # weights, so that a population of near-equals is not reshuffled by rating noise
        # (null: off, as when absent)
        "min_donor_win_probability": {"type": ["number", "null"], "minimum": 0.5,
                                      "exclusiveMaximum": 1},
        # rank_by: mean_return only: a bottom member copies a top one only when the top
        # one's mean return is above its own with at least this confidence, by Welch's
        # one-sided t-test over the episodes each reported (the PBT paper's t-test
        # selection); members whose returns differ by noise keep their own weights
        # (null: off, as when absent)
        "min_donor_confidence": {"type": ["number", "null"], "minimum": 0.5,
                                 "exclusiveMaximum": 1},
        # rank_by: mean_return only: a bottom member copies a top one only when the top
        # one's mean return leads its own by at least this much, in the env's return
        # units: a lead too small to matter, even where the t-test is sure of it (at
        # chance, in a game scoring 0-2, a test at 95 % still passes on noise about one
        # comparison in twenty, and a run makes dozens) (null: off, as when absent)
        "min_donor_lead": {"type": ["number", "null"], "minimum": 0},
        # rank_by: mean_return only: how many of its latest episodes (finished since its
        # last load) a member's reported mean return and spread are over. More reads a
        # member's level with less noise (the mean's spread falls as 1/sqrt(n)) and
        # follows a change more slowly; at most what a learner keeps (RETURN_WINDOW)
        "ranked_episodes": {"type": "integer", "minimum": 2, "maximum": RETURN_WINDOW},
    },
}


@dataclass(frozen=True)
class Settings:
    """The ``population`` section with its defaults (what the controller reads)."""

    size: int
    hyperparameters: dict[str, dict[str, Any]]
    # A member's ready points: every this many of its env steps, or (when set) every
    # this many of its updates instead.
    ready_after_steps: int = 20_000
    ready_after_updates: int | None = None
    truncation: float = 0.25
    perturb: tuple[float, float] = (0.8, 1.2)
    resample_probability: float = 0.25
    shared: tuple[str, ...] = ()
    rank_by: str = "mean_return"
    min_donor_win_probability: float | None = None
    min_donor_confidence: float | None = None
    min_donor_lead: float | None = None
    ranked_episodes: int | None = None  # None: the learner's own (20)
    # The topology's algo section the members start from: whose fields the
    # hyperparameters are, and whose ranges bound them. None: not known (no field checks).
    algo: Mapping[str, Any] | None = None

    @classmethod
    def parse(cls, section: dict[str, Any], algo: Mapping[str, Any] | None = None
              ) -> Settings:
        jsonschema.validate(section, SCHEMA)
        s = dict(section)
        s["perturb"] = tuple(s.get("perturb", (0.8, 1.2)))
        s["shared"] = tuple(s.get("shared", ()))
        return cls(**s, algo=dict(algo) if isinstance(algo, Mapping) else None)

    def config_type(self) -> type | None:
        """The algorithm's config class, or None (no algo known, or a bad kind: the
        algo section's own check reports that)."""
        if self.algo is None:
            return None
        try:
            return algo_config.config_type(self.algo.get("kind", algo_config.DEFAULT_KIND))
        except ValueError:
            return None

    def errors(self) -> list[str]:
        """What is wrong with the hyperparameters' distributions: one that cannot be
        drawn from, a name the algorithm has no field for, values of the wrong type or
        outside the field's declared range."""
        cls = self.config_type()
        fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
        hints = typing.get_type_hints(cls) if cls else {}
        found = []
        if self.min_donor_win_probability is not None and self.rank_by != "rating":
            found.append(f"min_donor_win_probability: {self.min_donor_win_probability} "
                         "compares ratings: it needs rank_by: rating (here "
                         f"{self.rank_by!r})")
        if self.min_donor_confidence is not None and self.rank_by != "mean_return":
            found.append(f"min_donor_confidence: {self.min_donor_confidence} tests mean "
                         f"returns: it needs rank_by: mean_return (here {self.rank_by!r})")
        if self.min_donor_lead is not None and self.rank_by != "mean_return":
            found.append(f"min_donor_lead: {self.min_donor_lead} compares mean returns: it "
                         f"needs rank_by: mean_return (here {self.rank_by!r})")
        if self.ranked_episodes is not None and self.rank_by != "mean_return":
            found.append(f"ranked_episodes: {self.ranked_episodes} sets what a mean return "
                         f"is over: it needs rank_by: mean_return (here {self.rank_by!r})")
        for name, distribution in sorted(self.hyperparameters.items()):
            where = f"hyperparameters.{name}"
            kind, spec = draw_of(distribution)
            explore = distribution.get("explore")
            if explore is not None:
                problem = _explore_error(kind, spec, explore)
                if problem:
                    found.append(f"{where}: explore {explore}: {problem}")
                    continue
            if cls is not None and (name not in fields or name == "kind"):
                known = ", ".join(n for n in fields if n != "kind")
                found.append(f"{where}: {cls.__name__} has no field '{name}' (known: {known})")
                continue
            if cls is not None and name not in cls.live_fields:
                # (read only when the learner is built, or by the actors: an exploit
                # would record a change that never takes effect)
                found.append(f"{where}: algo.{name} does not take effect while "
                             f"{cls.__name__}'s learner runs (its live_fields: "
                             f"{', '.join(sorted(cls.live_fields))})")
                continue
            if kind in ("uniform", "loguniform"):
                low, high = spec
                if low > high:
                    found.append(f"{where}: {kind} [{low}, {high}]: the low end is above "
                                 "the high end")
                    continue
                if kind == "loguniform" and low <= 0:
                    found.append(f"{where}: loguniform [{low}, {high}]: both ends must be > 0")
                    continue
                values = [low, high]
            else:
                values = list(spec)
            if cls is None:
                continue
            hint = hints[name]
            if kind != "choice" and not algo_config.type_ok(0.5, hint):
                found.append(f"{where}: algo.{name} is {algo_config.type_name(hint)}: give "
                             f"its values as choice: [...], not {kind}")
                continue
            bad_type = [v for v in values if not algo_config.type_ok(v, hint)]
            if bad_type:
                found.append(f"{where}: {bad_type[0]!r} is not "
                             f"{algo_config.type_name(hint)} (algo.{name})")
                continue
            declared = bounds.range_of(cls, name)
            outside = [v for v in values + list(explore or ())
                       if declared is not None and declared.check(v)]
            if outside:
                what = f"{kind} {spec}" + (f" explore {explore}" if explore else "")
                found.append(f"{where}: {what} reaches outside algo.{name}'s range: "
                             f"{declared.check(outside[0])}")
        return found


def draw_of(distribution: Mapping[str, Any]) -> tuple[str, Any]:
    """The draw of a hyperparameter's distribution: (kind, its values)."""
    kind = next(k for k in DRAWS if k in distribution)
    return kind, distribution[kind]


def explore_interval(distribution: Mapping[str, Any]) -> tuple[float, float] | None:
    """Where exploits may move a uniform/loguniform hyperparameter: its ``explore``
    interval, else its draw interval; None for a choice."""
    kind, spec = draw_of(distribution)
    if kind == "choice":
        return None
    low, high = distribution.get("explore", spec)
    return min(low, high), max(low, high)


def _explore_error(kind: str, spec: Any, explore: list) -> str | None:
    if kind == "choice":
        return "only a uniform or loguniform hyperparameter explores an interval"
    low, high = explore
    if low > high:
        return "the low end is above the high end"
    if kind == "loguniform" and low <= 0:
        return "both ends must be > 0 (loguniform)"
    if not low <= min(spec) <= max(spec) <= high:
        return f"must hold the draw interval {spec}"
    return None


def member_name(node: str, member: int) -> str:
    return f"{node}_m{member}"


def sample(distribution: dict[str, Any], rng: random.Random) -> Any:
    """One draw from ``{loguniform: [a, b]}``, ``{uniform: [a, b]}`` or ``{choice: [...]}``."""
    kind, spec = draw_of(distribution)
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
    algo = out.get("algo", {})  # a malformed one: the schema reports it
    try:
        settings = Settings.parse(section, algo if isinstance(algo, dict) else None)
    except (jsonschema.ValidationError, TypeError) as exc:
        where = "".join(f".{p}" for p in getattr(exc, "absolute_path", ()))
        raise ValueError(f"population{where}: {getattr(exc, 'message', exc)}") from None
    problems = settings.errors()
    if problems:
        raise ValueError("population: " + "; ".join(problems))
    nodes = out.get("nodes")
    if not isinstance(nodes, dict):
        return out
    rng = random.Random(out.get("seed", 0))
    shared = set(settings.shared) | {CONTROLLER}
    copied = [name for name in nodes if name not in shared]
    expanded: dict[str, Any] = {n: b for n, b in nodes.items() if n in shared}
    expanded.setdefault(CONTROLLER, {"kind": "pbt"})
    for body in expanded.values():
        links = body.get("links") if isinstance(body, dict) else None
        for link, given in list(links.items() if isinstance(links, dict) else ()):
            # one node serves every member: it links to each member's copy
            targets = _renamed(given, copied, range(settings.size))
            if targets is not None:
                links[link] = targets
    for member in range(settings.size):
        hyper = sample_all(settings, rng)
        for name in copied:
            body = copy.deepcopy(nodes[name])
            links = body.get("links", {})
            for link, given in list(links.items()):
                targets = _renamed(given, copied, [member])
                if targets is not None:  # to its own member's copy
                    links[link] = targets[0] if isinstance(given, str) else targets
            if _learns(body):
                if body.get("replicas", 1) != 1:  # a load would reach one replica only
                    raise ValueError(f"population: node '{name}': a member's learner must "
                                     "have one replica (data-parallel members: not yet)")
                args = body.setdefault("args", {})
                args["member"] = member
                args["hyperparameters"] = hyper
                if settings.ranked_episodes is not None:
                    args["ranked_episodes"] = settings.ranked_episodes
                body.setdefault("links", {})["pbt"] = f"{CONTROLLER}.members"
            expanded[member_name(name, member)] = body
    out["nodes"] = expanded
    # The controller reads its settings from its args: the section lives on there.
    ctl = expanded[CONTROLLER]
    ctl.setdefault("args", {})["population"] = section
    return out


def _renamed(given: Any, copied: list[str], members: Any) -> list[str] | None:
    """A link's targets (a "node.port" or a list of them) with each that names a copied
    node replaced by its copies of ``members``, in order; None where none does (or the
    value is malformed: the schema reports it)."""
    given_list = [given] if isinstance(given, str) else given
    if not isinstance(given_list, list) or not all(isinstance(t, str) for t in given_list):
        return None
    out, renamed = [], False
    for target in given_list:
        node, _, port = target.partition(".")
        if node in copied:
            out += [f"{member_name(node, m)}.{port}" for m in members]
            renamed = True
        else:
            out.append(target)
    return out if renamed else None


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
    return_std: float | None = None  # of the returns the mean is of ...
    episodes: int = 0  # ... and how many (min_donor_confidence's t-test)
    rating: float | None = None  # the league's, when members are ranked by rating
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    checkpointed: bool = False
    last_ready: int = 0  # steps (or updates: ready_after_updates) at its last ready point
    updates: int = 0


@dataclass(frozen=True)
class Decision:
    recipient: int
    donor: int
    hyperparameters: dict[str, Any]
    how: dict[str, str]  # hyperparameter -> "perturb x0.8" / "resample"
    recipient_return: float | None = None  # their mean returns when it was decided
    donor_return: float | None = None
    recipient_score: float | None = None  # what ranked them (settings.rank_by)
    donor_score: float | None = None


def decide(member: int, members: dict[int, Member], settings: Settings,
           rng: random.Random) -> Decision | None:
    """At ``member``'s ready point: None if it stays as it is (not in the bottom
    fraction, or no donor), else whom it copies and its new hyperparameters.

    Ranking (by ``settings.rank_by``: mean return or rating) counts only members that
    have one; donors must have a checkpoint
    (a member that never checkpointed is never copied, ray#27170) and, with
    ``min_donor_win_probability``, expect at least that score against the recipient;
    with ``min_donor_confidence``, have a mean return above the recipient's with at
    least that confidence (Welch's t-test; a member without a spread reported is
    neither judged nor a donor); with ``min_donor_lead``, a mean return at least that
    much above the recipient's."""
    def score(i: int) -> float | None:
        return getattr(members[i], settings.rank_by)

    ranked = sorted((i for i in members if score(i) is not None), key=score)  # worst first
    if member not in ranked or len(ranked) < 2:
        return None
    cut = max(1, math.floor(len(ranked) * settings.truncation))
    if member not in ranked[:cut]:
        return None
    donors = [i for i in ranked[-cut:] if members[i].checkpointed and i != member]
    threshold = settings.min_donor_win_probability
    if threshold is not None:
        mine = members[member].rating
        donors = [i for i in donors if mine is not None and members[i].rating is not None
                  and expected_score(members[i].rating, mine) >= threshold]
    confidence = settings.min_donor_confidence
    if confidence is not None:
        donors = [i for i in donors if _confidence(members[i], members[member]) >= confidence]
    lead = settings.min_donor_lead
    if lead is not None:
        mine = members[member].mean_return
        donors = [i for i in donors if mine is not None
                  and members[i].mean_return is not None
                  and members[i].mean_return - mine >= lead]
    if not donors:
        return None
    donor = rng.choice(donors)
    given = members[donor].hyperparameters
    cls = settings.config_type()
    hyper, how = {}, {}
    for name, value in given.items():
        distribution = settings.hyperparameters.get(name)
        declared = bounds.range_of(cls, name) if cls is not None else None
        if distribution is not None and rng.random() < settings.resample_probability:
            hyper[name], how[name] = sample(distribution, rng), "resample"
        elif bounds.is_number(value):
            factor = rng.choice(settings.perturb)
            hyper[name] = perturb(value, factor, distribution)
            how[name] = f"perturb x{factor}"
        else:
            hyper[name], how[name] = value, "copy"
        if declared is not None and bounds.is_number(hyper[name]):
            hyper[name] = declared.clip(hyper[name])
    if cls is not None:  # the config's own checks (cross-field ones too) on the result
        for name, problem in algo_config.errors({**(settings.algo or {}), **hyper}):
            if name in hyper and hyper[name] != given.get(name):
                hyper[name], how[name] = given[name], f"copy ({how[name]} gave {problem})"
    return Decision(member, donor, hyper, how, members[member].mean_return,
                    members[donor].mean_return, score(member), score(donor))


def _confidence(donor: Member, recipient: Member) -> float:
    """How sure the donor's mean return is above the recipient's (0: not known)."""
    if None in (donor.mean_return, donor.return_std, recipient.mean_return,
                recipient.return_std):
        return 0.0
    return welch_confidence(donor.mean_return, donor.return_std, donor.episodes,
                            recipient.mean_return, recipient.return_std, recipient.episodes)


def perturb(value: float, factor: float, distribution: Mapping[str, Any] | None) -> float:
    """``value`` scaled by ``factor`` within its distribution's bounds: a ``choice``
    steps to the neighbouring choice in the factor's direction, ``uniform`` and
    ``loguniform`` values are clipped to their explore interval (by default the draw
    interval: :func:`explore_interval`). An int moves by at least one when the factor
    is not 1 and one at 1 or more stays at 1 or more (int 1 x 0.8 is 1, not 0)."""
    kind, spec = draw_of(distribution) if distribution else ("", None)
    if kind == "choice" and all(bounds.is_number(c) for c in spec):
        above = sorted(c for c in set(spec) if c > value)
        below = sorted(c for c in set(spec) if c < value)
        if factor > 1 and above:
            return above[0]
        if factor < 1 and below:
            return below[-1]
        return value
    integer = isinstance(value, int)
    new: float = value * factor
    if integer:
        new = round(new)
        if factor > 1 and new <= value:
            new = value + 1
        elif factor < 1 and new >= value:
            new = value - 1
        if value >= 1:
            new = max(new, 1)
    if kind in ("uniform", "loguniform"):
        low, high = explore_interval(distribution)  # type: ignore[arg-type, misc]
        new = min(max(new, low), high)
        if integer:  # an int inside the interval (validation refuses int uniform ranges)
            new = max(math.ceil(low), min(math.floor(high), round(new)))
    return int(new) if integer else float(new)


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
                  hyperparameters: dict[str, Any], checkpointed: bool,
                  updates: int = 0, return_std: float | None = None,
                  episodes: int = 0) -> Decision | None:
        """Take a member's report; the decision to carry out if this is its ready point
        (every ``ready_after_updates`` of its updates when that is set, else every
        ``ready_after_steps`` of its env steps)."""
        m = self.members.setdefault(member, Member())
        m.steps, m.mean_return, m.checkpointed = steps, mean_return, checkpointed
        m.updates, m.return_std, m.episodes = updates, return_std, episodes
        if member not in self.pending:  # while loading, its report may predate the load
            m.hyperparameters = dict(hyperparameters)
        by_updates = self.settings.ready_after_updates
        count, every = (updates, by_updates) if by_updates else \
            (steps, self.settings.ready_after_steps)
        if member in self.pending or count - m.last_ready < every:
            return None
        m.last_ready = count
        decision = decide(member, self.members, self.settings, self.rng)
        if decision is not None:
            self.pending[member] = decision
        return decision

    def on_loaded(self, member: int) -> Decision | None:
        """The recipient loaded its donor's state: the exploit is done."""
        decision = self.pending.pop(member, None)
        if decision is not None:
            recipient = self.members[member]
            recipient.hyperparameters = dict(decision.hyperparameters)
            # it is the donor's policy now (the league, told, rates it so too)
            recipient.rating = self.members[decision.donor].rating
            self.exploits += 1
        return decision

    def abandon(self, member: int) -> None:
        self.pending.pop(member, None)

    def on_rating(self, member: int, rating: float) -> None:
        """The league's rating of ``member``'s current policy (``rank_by: rating``)."""
        self.members.setdefault(member, Member()).rating = float(rating)

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


# ----- who speaks for a member --------------------------------------------------------
Identity = tuple[bytes, ...]  # a ROUTER envelope: the peer's connection, as ZeroMQ names it


class Bindings:
    """Which peer speaks for each member: the ZeroMQ identity (ROUTER envelope) whose
    report first named it. A report for a member bound to another peer is refused, so a
    stranger cannot take over a member's reports, its state requests or its loads.

    A binding passes to a new peer only when its peer has gone: ``gone(identity)`` says
    ZeroMQ no longer has that connection (the learner exited; its restart connects
    anew, under a new identity), or nothing came from it for ``idle_s`` (a peer that
    hangs, or a host that vanished without closing its connection). ZeroMQ makes up
    identities per connection and a restarted controller has all new connections, so
    bindings are not persisted: after a controller restart the first report per member
    binds again. One peer speaks for one member."""

    def __init__(self, idle_s: float = 30.0) -> None:
        self.idle_s = idle_s
        self.peers: dict[int, Identity] = {}
        self.members: dict[Identity, int] = {}
        self.heard: dict[int, float] = {}

    def claim(self, member: int, identity: Identity, now: float,
              gone: Callable[[Identity], bool]) -> str | None:
        """Bind ``member`` to ``identity`` (or keep it bound); what is wrong, or None."""
        held = self.peers.get(member)
        if held == identity:
            self.heard[member] = now
            return None
        other = self.members.get(identity)
        if other is not None:
            return f"this peer reports as member {other}, not {member}"
        if held is not None and now - self.heard[member] < self.idle_s and not gone(held):
            return (f"member {member} reports from another peer; a report is taken only "
                    "from the connection that first reported as it")
        if held is not None:
            del self.members[held]
        self.peers[member], self.members[identity], self.heard[member] = identity, member, now
        return None

    def member_of(self, identity: Identity) -> int | None:
        return self.members.get(identity)


def population_size(topo: Any) -> int | None:
    """K of the population an expanded topology holds (its controller's section), or
    None where it has none: what a shared node (the league) counts as members."""
    controller = getattr(topo, "nodes", {}).get(CONTROLLER)
    section = (controller.args.get("population") if controller is not None else None) or {}
    size = section.get("size") if isinstance(section, dict) else None
    return size if type(size) is int else None
