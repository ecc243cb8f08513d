"""Typed algorithm configs: a topology's ``algo`` section, parsed once, defaults here only.

Each algorithm's hyperparameters are one dataclass (CleanRL style). ``zmqrl.run.topology``
parses the ``algo`` section into it when the topology loads (``Topology.algo_config``),
so every node reads the same values, defaults included: no node repeats a default.
Each numeric field declares its range next to its default (``ranged(0.99, ge=0, le=1)``,
:mod:`zmqrl.parts.bounds`): :func:`errors` (what ``zmqrl validate`` reports) names a field
out of range, a config built with one raises, and PBT perturbs within it.

Besides its hyperparameters each config declares, as class attributes (:class:`AlgoConfig`),
the parts it is built of by default — its learner class, the item kind it trains on, the
behaviour that acts for it, its data source, the model interface it needs, whether it
may run data-parallel or in reduced precision — each a registered name or an import path
(:mod:`zmqrl.plugins`), and each but the capabilities overridable in a topology's
``parts:`` section (:class:`Parts`). An algorithm is registered like any part: an entry
point in the ``zmqrl.algos`` group naming its config class (zmqrl's own are in its
pyproject.toml), or ``algo.kind: module:ConfigClass``.

``family`` describes what the algorithm learns from (``docs/extending.md``); nothing
branches on it to find a part:

* ``unroll``: time-major unrolls of the current policy (actor-critic: V-trace, A2C, PPO);
* ``replay``: n-step transitions sampled from a replay (DQN: Ape-X, Gorila);
* ``sequence``: fixed-length sequences with their stored recurrent state, from a replay
  (R2D2);
* ``search``: positions of games played by search, (observation, visit distribution,
  outcome), from a replay (AlphaZero).

This module imports no torch: nodes that run no model (a remote actor, the replay) read
their config without loading it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from zmqrl import plugins
from zmqrl.parts import bounds
from zmqrl.parts.bounds import ranged

UNROLL, REPLAY, SEQUENCE, SEARCH = "unroll", "replay", "sequence", "search"
DEFAULT_KIND = "vtrace"
# The item kind of unrolls of the current policy (``unroll`` messages to a learner's
# ``experience`` port); every other item kind is an ``insert``/``batch`` variant that a
# replay holds (``zmqrl.bus.messages``: transitions, sequences, positions, ...).
UNROLLS = "unrolls"
# False while :func:`parse` builds a topology's config: see there.
_CHECKED = contextvars.ContextVar("algo_config_checked", default=True)


class AlgoConfig:
    """What an algorithm's config declares besides its hyperparameters (class
    attributes, so not fields of the ``algo`` section). Part names are registered short
    names or ``module:Name`` import paths (:mod:`zmqrl.plugins`)."""

    kind: str
    family: ClassVar[str] = ""  # a description (docs): nothing is chosen by it
    # The learner class (config, model, **options) -> object with the Learner
    # protocol (zmqrl.parts.algos.protocol): an import path, loaded only where a model trains.
    learner: ClassVar[str] = ""
    items: ClassVar[str] = UNROLLS  # what it trains on: unrolls, or a replay item kind
    behaviour: ClassVar[str] = "actor_critic"  # how actors act for it
    # How actors act when they ship gradients to a parameter server (A3C); None: never
    gradient_behaviour: ClassVar[str | None] = None
    source: ClassVar[str] = "unrolls"  # where the learner's batches come from
    model_interface: ClassVar[str | None] = None  # what the model must provide
    data_parallel: ClassVar[bool] = False  # its learner may average gradients over replicas
    reduced_precision: ClassVar[bool] = False  # its learner may train in bfloat16/float16
    # The fields a running learner applies when PBT changes them (zmqrl/run/population.py):
    # read at every update, or applied by its ``apply_hyperparameters`` (learning rates:
    # to the optimizer's groups). A population over any other field (read only when the
    # learner is built, or the actors') is refused at validation: it would never take
    # effect. A plug-in's config declares its own.
    live_fields: ClassVar[frozenset[str]] = frozenset({"lr"})
    # The message sets (zmqrl.messages entry-point names or module:NAME paths) its items
    # and acting use beyond the core protocol: a process loads only the sets its
    # topology's algorithm names (zmqrl.bus.messages.use).
    messages: ClassVar[tuple[str, ...]] = ()

    def items_per_env_step(self) -> int:
        """The most items one env's step can complete (n-step transitions: ``n_step``
        flushed when an episode ends); what sizes a replay's largest insert."""
        return max(1, int(getattr(self, "n_step", 1)))

    def message_dims(self) -> dict[str, int]:
        """Shape symbols of its messages that its hyperparameters fix (MuZero's ``K``,
        ``unroll_steps``): every port that checks them binds these before the first
        message, so one peer's insert cannot set the layout for everyone else's."""
        return {}

    def optional_arrays(self) -> dict[str, bool]:
        """Optional arrays of its messages that its hyperparameters make required
        (True) or refused (False): MuZero's reanalyse arrays with ``reanalyse``."""
        return {}

    def __post_init__(self) -> None:
        # A config built directly (a test, a learner, PBT's dataclasses.replace) is held
        # to the same ranges as a topology's algo section: a bad value raises here.
        problems = config_errors(type(self), dataclasses.asdict(self)) if _CHECKED.get() else []
        if problems:
            raise ValueError("; ".join(f"algo.{key}: {msg}" for key, msg in problems))

    @classmethod
    def field_errors(cls, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(field, message) for each value of ``values`` (an ``algo`` section; missing
        fields take defaults) out of its declared range or inconsistent with another."""
        return config_errors(cls, values)

    @classmethod
    def cross_field_errors(cls, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(field, message) for values that are each in range but do not fit together
        (R2D2: burn-in < sequence length). ``values``: every field, defaults filled in;
        a value may still be of the wrong type (the type check reports it): skip it."""
        return []


@dataclass
class VTraceConfig(AlgoConfig):
    """Hyperparameters of the V-trace learner (the topology's ``algo`` section).

    The defaults are V-trace and the IMPALA loss as in the paper; the knobs after
    ``adam_eps`` are optional extras (each off by default).
    """

    kind: str = "vtrace"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "discount", "baseline_cost", "entropy_cost", "clip_rho", "clip_c",
        "clip_pg_rho", "max_grad_norm", "epochs", "minibatches", "normalize_advantages",
        "reward_scale", "ppo_clip"})
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.algos.vtrace:VTraceLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    unroll: int = ranged(20, ge=1)  # steps per unroll; the broker assembles unrolls this long
    batch_size: int = ranged(32, ge=1)  # env columns (unrolls) per update
    lr: float = ranged(6e-4, gt=0)
    discount: float = ranged(0.99, ge=0, le=1)
    baseline_cost: float = ranged(0.5, ge=0)
    entropy_cost: float = ranged(0.01, ge=0)
    clip_rho: float | None = ranged(1.0, gt=0)  # None: importance weights not clipped
    clip_c: float | None = ranged(1.0, gt=0)
    clip_pg_rho: float | None = ranged(1.0, gt=0)
    max_grad_norm: float = ranged(40.0, gt=0)
    epochs: int = ranged(1, ge=1)  # SGD passes over each batch (V-trace corrects the drift)
    minibatches: int = ranged(1, ge=1)  # column splits per pass
    normalize_advantages: bool = False
    adam_eps: float = ranged(1e-5, gt=0)
    # Rewards are multiplied by this before V-trace (values learn the scaled return).
    reward_scale: float = ranged(1.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False
    # Clipped surrogate (PPO/IMPACT style) in place of the IMPALA policy term: with
    # epsilon set, the policy loss is -min(r A, clip(r, 1-eps, 1+eps) A), r = pi/mu,
    # A = r_s + gamma_s v_{s+1} - V(x_s) from the V-trace targets (rho not applied, r
    # carries it). A trust region that makes several epochs per batch safe.
    ppo_clip: float | None = ranged(None, gt=0)

@dataclass
class A2CConfig(AlgoConfig):
    """Hyperparameters of the A2C learner (the topology's ``algo`` section)."""

    kind: str = "a2c"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "discount", "baseline_cost", "entropy_cost", "normalize_advantages",
        "max_grad_norm"})
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.algos.a2c:A2CLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    unroll: int = ranged(5, ge=1)  # steps per unroll
    batch_size: int = ranged(32, ge=1)  # env columns (unrolls) per update
    lr: float = ranged(7e-4, gt=0)
    discount: float = ranged(0.99, ge=0, le=1)
    baseline_cost: float = ranged(0.5, ge=0)
    entropy_cost: float = ranged(0.01, ge=0)
    max_grad_norm: float = ranged(0.5, gt=0)
    adam_eps: float = ranged(1e-5, gt=0)
    normalize_advantages: bool = False

@dataclass
class PPOConfig(AlgoConfig):
    """Hyperparameters of the PPO learner (the topology's ``algo`` section). Defaults are
    CleanRL's ``ppo_continuous_action.py`` (MuJoCo)."""

    kind: str = "ppo"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "discount", "gae_lambda", "reward_scale", "clip", "clip_value",
        "value_cost", "entropy_cost", "normalize_advantages", "epochs", "minibatches",
        "max_grad_norm"})
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.algos.ppo:PPOLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    data_parallel: ClassVar[bool] = True
    unroll: int = ranged(128, ge=1)  # steps per unroll (T); the broker assembles unrolls this long
    # Env columns per update, summed over all learner ranks (each rank takes its share:
    # batch_size / ranks columns, the same on every rank).
    batch_size: int = ranged(16, ge=1)
    lr: float = ranged(3e-4, gt=0)  # Adam step size (the start value when annealed)
    anneal_lr: bool = False  # decay lr linearly to 0 ...
    anneal_updates: int = ranged(0, ge=0)  # ... over this many updates (required with anneal_lr)
    discount: float = ranged(0.99, ge=0, le=1)  # gamma
    # GAE lambda (1: Monte Carlo returns, 0: one-step TD)
    gae_lambda: float = ranged(0.95, ge=0, le=1)
    epochs: int = ranged(10, ge=1)  # passes over each batch
    # Minibatches per pass, over the rank's T x B local samples; with a recurrent model
    # (lstm_ac), over its B local env columns, each a whole sequence (recurrent_ppo.py).
    minibatches: int = ranged(32, ge=1)
    clip: float = ranged(0.2, gt=0)  # surrogate clip: ratio kept within [1 - clip, 1 + clip]
    clip_value: bool = True  # clip the value change around the old value by `clip` too
    value_cost: float = ranged(0.5, ge=0)  # weight of the value loss (0.5 * squared error)
    entropy_cost: float = ranged(0.0, ge=0)  # weight of the entropy bonus
    # global gradient-norm clip (after averaging across ranks)
    max_grad_norm: float = ranged(0.5, gt=0)
    normalize_advantages: bool = True  # per minibatch, as CleanRL
    adam_eps: float = ranged(1e-5, gt=0)
    # Rewards are multiplied by this before GAE (values learn the scaled return).
    reward_scale: float = ranged(1.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up.
    light_adam: bool = False

@dataclass
class DQNConfig(AlgoConfig):
    """Hyperparameters of the DQN learner (the topology's ``algo`` section)."""

    kind: str = "dqn"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "batch_size", "double", "huber_delta", "max_grad_norm",
        "target_update_every"})
    family: ClassVar[str] = REPLAY
    learner: ClassVar[str] = "zmqrl.parts.algos.dqn:DQNLearner"
    items: ClassVar[str] = "transitions"
    behaviour: ClassVar[str] = "epsilon_greedy"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "q"
    batch_size: int = ranged(64, ge=1)  # transitions sampled from replay per update
    lr: float = ranged(2.5e-4, gt=0)  # Adam
    discount: float = ranged(0.99, ge=0, le=1)
    # used by actors (NStepAccumulator); the learner reads batch["discount"]
    n_step: int = ranged(3, ge=1)
    target_update_every: int = ranged(100, ge=1)  # updates between hard copies online -> target
    max_grad_norm: float = ranged(10.0, gt=0)
    huber_delta: float = ranged(1.0, gt=0)
    double: bool = True  # double DQN targets; False: max_a Q_target(s', a)
    adam_eps: float = ranged(1.5e-4, gt=0)

@dataclass
class R2D2Config(AlgoConfig):
    """Hyperparameters of R2D2 (the topology's ``algo`` section)."""

    kind: str = "r2d2"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "batch_size", "max_grad_norm", "target_update_every"})
    family: ClassVar[str] = SEQUENCE
    learner: ClassVar[str] = "zmqrl.parts.algos.r2d2:R2D2Learner"
    items: ClassVar[str] = "sequences"
    behaviour: ClassVar[str] = "recurrent_q"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "recurrent_q"
    # L: transitions per replayed sequence (each item also holds obs L to bootstrap).
    sequence_length: int = ranged(40, ge=1)
    # Leading steps of a sequence that only warm the recurrent state up from the stored
    # state (no loss, no priority, no gradient). With overlap >= burn_in every step is
    # in the learning part of some sequence. (< sequence_length: cross_field_errors)
    burn_in: int = ranged(10, ge=0)
    # Steps shared by consecutive sequences of an env: a sequence starts every
    # sequence_length - overlap steps. (< sequence_length: cross_field_errors)
    overlap: int = ranged(20, ge=0)
    batch_size: int = ranged(32, ge=1)  # sequences sampled from replay per update
    lr: float = ranged(1e-3, gt=0)  # Adam
    adam_eps: float = ranged(1e-3, gt=0)
    discount: float = ranged(0.99, ge=0, le=1)
    # rewards summed before bootstrapping (fewer at a sequence's end)
    n_step: int = ranged(5, ge=1)
    # priority = eta * max |td| + (1 - eta) * mean |td| over a sequence
    eta: float = ranged(0.9, ge=0, le=1)
    # the eps of the value rescaling h
    rescale_eps: float = ranged(1e-3, gt=0,
                                why="the inverse of the value rescaling divides by it")
    target_update_every: int = ranged(200, ge=1)  # updates between hard copies online -> target
    max_grad_norm: float = ranged(40.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False

    def items_per_env_step(self) -> int:
        return 1  # at most one sequence per env completes in a step

    @classmethod
    def cross_field_errors(cls, v: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Burn-in and overlap must leave room in a sequence."""
        if not all(bounds.is_number(v[k]) for k in ("sequence_length", "burn_in", "overlap")):
            return []
        length = v["sequence_length"]
        errors = []
        if v["burn_in"] >= length >= 1:
            errors.append(("burn_in", f"{v['burn_in']!r}: must be >= 0 and < sequence_length "
                                      f"({length}): at least one step of each sequence must "
                                      "be learned on"))
        if v["overlap"] >= length >= 1:
            errors.append(("overlap", f"{v['overlap']!r}: must be >= 0 and < sequence_length "
                                      f"({length}): a sequence starts every sequence_length "
                                      "- overlap steps"))
        return errors


@dataclass
class AlphaZeroConfig(AlgoConfig):
    """Hyperparameters of AlphaZero (the topology's ``algo`` section): the search the
    actors run (``zmqrl.parts.search``) and the learner's loss (``zmqrl.parts.algos.alphazero``).
    The search defaults suit small board games (tic-tac-toe, connect four)."""

    kind: str = "alphazero"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "lr_final", "anneal_updates", "batch_size", "value_cost", "l2",
        "max_grad_norm"})
    family: ClassVar[str] = SEARCH
    learner: ClassVar[str] = "zmqrl.parts.algos.alphazero:AlphaZeroLearner"
    items: ClassVar[str] = "positions"
    behaviour: ClassVar[str] = "evaluate"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "policy_value"
    reduced_precision: ClassVar[bool] = True
    num_simulations: int = ranged(50, ge=1)  # MCTS simulations per move
    c_puct: float = ranged(1.5, gt=0)  # exploration weight of the PUCT rule
    dirichlet_alpha: float = ranged(1.0, gt=0)  # root noise Dir(alpha) over the legal moves ...
    # ... mixed into the root priors with this weight
    dirichlet_fraction: float = ranged(0.25, ge=0, le=1)
    # The first moves of each game are sampled in proportion to the root's visit counts
    # (temperature 1); later ones take the most visited move.
    temperature_moves: int = ranged(4, ge=0)
    # A position's value target: the game's outcome z for the player to move, or
    # (1 - mix) z + mix q with q the search's value of the position (its root), which
    # is less noisy than one game's result (what Oracle's connect-four AlphaZero found).
    value_target_mix: float = ranged(0.0, ge=0, le=1)
    # Each finished game goes to the replay mirrored left-right as well (games whose
    # rules are symmetric: tic-tac-toe, connect four), twice the positions per game.
    mirror_games: bool = False
    # Playout cap randomization (KataGo, Wu 2019): this fraction of moves, drawn at random,
    # is searched with num_simulations (root noise on) and recorded; the others with
    # fast_simulations, no noise, not recorded. More games for the same search: more
    # independent outcomes for the value target. 1: every move searched fully.
    full_search_fraction: float = ranged(1.0, gt=0, le=1)
    fast_simulations: int = ranged(20, ge=1)  # <= num_simulations: cross_field_errors
    # Each move's search starts from the subtree of the move just played, whose visits
    # count towards its simulations (instead of a fresh tree).
    reuse_trees: bool = False
    batch_size: int = ranged(128, ge=1)  # positions per update
    lr: float = ranged(1e-3, gt=0)  # Adam (the start value when annealed)
    # With anneal_updates > 0 the lr falls linearly from lr to lr_final over that many
    # updates and then stays at lr_final (AlphaZero lowered its lr in steps); 0: constant.
    anneal_updates: int = ranged(0, ge=0)
    lr_final: float = ranged(1e-4, ge=0)
    # weight of the value MSE (the policy cross-entropy has 1)
    value_cost: float = ranged(1.0, ge=0)
    l2: float = ranged(1e-4, ge=0)  # weight of the sum of squared weights (biases excluded)
    max_grad_norm: float = ranged(10.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False

    @classmethod
    def cross_field_errors(cls, v: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A fast search is the cheaper one (when fast searches are on at all)."""
        fast, full = v["fast_simulations"], v["num_simulations"]
        if v["full_search_fraction"] != 1.0 and \
                all(isinstance(x, int) and not isinstance(x, bool) for x in (fast, full)) \
                and fast > full:
            return [("fast_simulations", f"{fast!r}: must be <= num_simulations ({full})"
                                         " when full_search_fraction < 1")]
        return []


# The registered algorithms (``zmqrl.algos`` entry points) -> config class, read-only.
CONFIGS: Mapping[str, type] = plugins.Registered("algo")



def config_type(kind: str) -> type:
    """The config dataclass of ``algo.kind`` (a short name or ``module:Class``);
    ValueError naming the known kinds."""
    try:
        cls = plugins.resolve("algo", kind)
    except plugins.PluginError as exc:
        raise ValueError(f"algo.kind: {exc}") from None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"algo.kind: '{kind}' is not a config dataclass ({cls!r})")
    return cls


def learner_type(cfg: AlgoConfig | type) -> type:
    """The learner class an algorithm's config names (imports it: torch)."""
    try:
        return plugins.load_path(cfg.learner, part=f"algo {cfg.kind!s} learner")
    except plugins.PluginError as exc:
        raise ValueError(str(exc)) from None


def parse(algo: Mapping[str, Any]) -> AlgoConfig:
    """The typed config of a topology's ``algo`` section (already validated by
    :func:`errors`): unknown keys are an error there, so none are dropped silently here.

    Built without the range checks a config makes when constructed: a topology that
    loads has passed :func:`errors`, and while ``zmqrl validate`` is still checking one,
    node checks read its config too: a value out of range is then reported once, naming
    its field, rather than also failing every check that reads the config."""
    token = _CHECKED.set(False)
    try:
        return config_type(algo.get("kind", DEFAULT_KIND))(**dict(algo))
    finally:
        _CHECKED.reset(token)


def errors(algo: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for every unknown key, mistyped value and out-of-range value of
    a topology's ``algo`` section."""
    kind = algo.get("kind", DEFAULT_KIND)
    try:
        cls = config_type(kind)
    except ValueError as exc:
        return [("kind", str(exc).removeprefix("algo.kind: "))]
    found = field_type_errors(cls, algo, kind)
    return found or config_errors(cls, algo)


def config_errors(cls: type, values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each value of ``values`` outside its field's declared range
    (:func:`zmqrl.parts.bounds.ranged`), then what the config's ``cross_field_errors``
    finds, if it has one. Any config dataclass, a plug-in's included: ranges declared
    with ``ranged`` are checked with nothing else to write."""
    found = bounds.range_errors(cls, values)
    cross = getattr(cls, "cross_field_errors", None)
    if cross is not None:
        defaults = {f.name: f.default for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING}
        known = {k: v for k, v in values.items() if k in {f.name for f in
                                                          dataclasses.fields(cls)}}
        found += cross({**defaults, **known})
    return found


def field_value(algo: Mapping[str, Any], name: str) -> Any:
    """The value of field ``name`` that a topology's ``algo`` section gives, or its
    config's default; None where the kind or the field is unknown (reported with the
    algo section)."""
    if name in algo:
        return algo[name]
    try:
        cls = config_type(algo.get("kind", DEFAULT_KIND))
    except ValueError:
        return None
    default = {f.name: f.default for f in dataclasses.fields(cls)}.get(name)
    return None if default is dataclasses.MISSING else default


@dataclass(frozen=True)
class Parts:
    """The parts a topology's architecture is made of: its algorithm's defaults, each
    replaced by the topology's ``parts:`` section where it names one. Names are
    registered short names or import paths (:mod:`zmqrl.plugins`)."""

    behaviour: str  # how actors (and the broker, per connection) act
    gradient_behaviour: str | None  # how actors act that ship gradients (A3C)
    items: str  # what the learner trains on ("unrolls" or a replay item kind)
    source: str  # the learner's data source
    updater: str | None  # the learner's updater; None: by its links and replicas

    FIELDS: ClassVar[tuple[str, ...]] = ("behaviour", "gradient_behaviour", "items",
                                         "source", "updater")

    @classmethod
    def of(cls, cfg: AlgoConfig, overrides: Mapping[str, Any] | None = None) -> Parts:
        given = dict(overrides or {})
        return cls(**{name: given.get(name, getattr(cfg, name, None))
                      for name in cls.FIELDS})

    @property
    def unrolls(self) -> bool:
        """Whether the learner takes unrolls on its ``experience`` port (else it samples
        a replay)."""
        return self.items == UNROLLS


def field_type_errors(dataclass_type: type | None, values: Mapping[str, Any],
                      owner: str) -> list[tuple[str, str]]:
    """Unknown keys and mistyped values of ``values`` against a dataclass's fields."""
    if dataclass_type is None:
        return []
    hints = typing.get_type_hints(dataclass_type)
    names = [f.name for f in dataclasses.fields(dataclass_type)]
    found = []
    for key, value in values.items():
        if key not in names:
            found.append((key, f"unknown for {owner} (known: {', '.join(names) or 'none'})"))
        elif not type_ok(value, hints[key]):
            hint = ""
            if isinstance(value, str) and type_ok(1.0, hints[key]):
                try:
                    float(value)
                    hint = f" (YAML reads {value} as text: write it with a dot, e.g. 1.0e-3)"
                except ValueError:
                    pass
            found.append((key, f"{value!r} is not {type_name(hints[key])}{hint}"))
    return found


def type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict)
    if hint is Any:
        return True
    return isinstance(value, hint)


def type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
