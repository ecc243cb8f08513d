"""Typed algorithm configs: a topology's ``algo`` section, parsed once, defaults here only.

Each algorithm's hyperparameters are one dataclass (CleanRL style). ``zmqrl.run.topology``
parses the ``algo`` section into it when the topology loads (``Topology.algo_config``),
so every node reads the same values, defaults included: no node repeats a default.

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

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from zmqrl import plugins

UNROLL, REPLAY, SEQUENCE, SEARCH = "unroll", "replay", "sequence", "search"
DEFAULT_KIND = "vtrace"
# The item kind of unrolls of the current policy (``unroll`` messages to a learner's
# ``experience`` port); every other item kind is an ``insert``/``batch`` variant that a
# replay holds (``zmqrl.bus.messages``: transitions, sequences, positions, ...).
UNROLLS = "unrolls"


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

    def items_per_env_step(self) -> int:
        """The most items one env's step can complete (n-step transitions: ``n_step``
        flushed when an episode ends); what sizes a replay's largest insert."""
        return max(1, int(getattr(self, "n_step", 1)))


@dataclass
class VTraceConfig(AlgoConfig):
    """Hyperparameters of the V-trace learner (the topology's ``algo`` section).

    The defaults are V-trace and the IMPALA loss as in the paper; the knobs after
    ``adam_eps`` are optional extras (each off by default).
    """

    kind: str = "vtrace"
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.algos.vtrace:VTraceLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    unroll: int = 20  # steps per unroll; the broker assembles unrolls this long
    batch_size: int = 32  # env columns (unrolls) per update
    lr: float = 6e-4
    discount: float = 0.99
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    clip_rho: float | None = 1.0
    clip_c: float | None = 1.0
    clip_pg_rho: float | None = 1.0
    max_grad_norm: float = 40.0
    epochs: int = 1  # SGD passes over each batch (V-trace corrects the drift)
    minibatches: int = 1  # column splits per pass
    normalize_advantages: bool = False
    adam_eps: float = 1e-5
    # Rewards are multiplied by this before V-trace (values learn the scaled return).
    reward_scale: float = 1.0
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False
    # Clipped surrogate (PPO/IMPACT style) in place of the IMPALA policy term: with
    # epsilon set, the policy loss is -min(r A, clip(r, 1-eps, 1+eps) A), r = pi/mu,
    # A = r_s + gamma_s v_{s+1} - V(x_s) from the V-trace targets (rho not applied, r
    # carries it). A trust region that makes several epochs per batch safe.
    ppo_clip: float | None = None

@dataclass
class A2CConfig(AlgoConfig):
    """Hyperparameters of the A2C learner (the topology's ``algo`` section)."""

    kind: str = "a2c"
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.algos.a2c:A2CLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    unroll: int = 5  # steps per unroll
    batch_size: int = 32  # env columns (unrolls) per update
    lr: float = 7e-4
    discount: float = 0.99
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5
    normalize_advantages: bool = False

@dataclass
class PPOConfig(AlgoConfig):
    """Hyperparameters of the PPO learner (the topology's ``algo`` section). Defaults are
    CleanRL's ``ppo_continuous_action.py`` (MuJoCo)."""

    kind: str = "ppo"
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.algos.ppo:PPOLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    data_parallel: ClassVar[bool] = True
    unroll: int = 128  # steps per unroll (T); the broker assembles unrolls this long
    # Env columns per update, summed over all learner ranks (each rank takes its share:
    # batch_size / ranks columns, the same on every rank).
    batch_size: int = 16
    lr: float = 3e-4  # Adam step size (the start value when annealed)
    anneal_lr: bool = False  # decay lr linearly to 0 ...
    anneal_updates: int = 0  # ... over this many updates (required with anneal_lr)
    discount: float = 0.99  # gamma
    gae_lambda: float = 0.95  # GAE lambda (1: Monte Carlo returns, 0: one-step TD)
    epochs: int = 10  # passes over each batch
    # Minibatches per pass, over the rank's T x B local samples; with a recurrent model
    # (lstm_ac), over its B local env columns, each a whole sequence (recurrent_ppo.py).
    minibatches: int = 32
    clip: float = 0.2  # surrogate clip: ratio kept within [1 - clip, 1 + clip]
    clip_value: bool = True  # clip the value change around the old value by `clip` too
    value_cost: float = 0.5  # weight of the value loss (0.5 * squared error)
    entropy_cost: float = 0.0  # weight of the entropy bonus
    max_grad_norm: float = 0.5  # global gradient-norm clip (after averaging across ranks)
    normalize_advantages: bool = True  # per minibatch, as CleanRL
    adam_eps: float = 1e-5
    # Rewards are multiplied by this before GAE (values learn the scaled return).
    reward_scale: float = 1.0
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up.
    light_adam: bool = False

@dataclass
class DQNConfig(AlgoConfig):
    """Hyperparameters of the DQN learner (the topology's ``algo`` section)."""

    kind: str = "dqn"
    family: ClassVar[str] = REPLAY
    learner: ClassVar[str] = "zmqrl.parts.algos.dqn:DQNLearner"
    items: ClassVar[str] = "transitions"
    behaviour: ClassVar[str] = "epsilon_greedy"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "q"
    batch_size: int = 64  # transitions sampled from replay per update
    lr: float = 2.5e-4  # Adam
    discount: float = 0.99
    n_step: int = 3  # used by actors (NStepAccumulator); the learner reads batch["discount"]
    target_update_every: int = 100  # updates between hard copies online -> target
    max_grad_norm: float = 10.0
    huber_delta: float = 1.0
    double: bool = True  # double DQN targets; False: max_a Q_target(s', a)
    adam_eps: float = 1.5e-4

@dataclass
class R2D2Config(AlgoConfig):
    """Hyperparameters of R2D2 (the topology's ``algo`` section)."""

    kind: str = "r2d2"
    family: ClassVar[str] = SEQUENCE
    learner: ClassVar[str] = "zmqrl.parts.algos.r2d2:R2D2Learner"
    items: ClassVar[str] = "sequences"
    behaviour: ClassVar[str] = "recurrent_q"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "recurrent_q"
    # L: transitions per replayed sequence (each item also holds obs L to bootstrap).
    sequence_length: int = 40
    # Leading steps of a sequence that only warm the recurrent state up from the stored
    # state (no loss, no priority, no gradient). With overlap >= burn_in every step is
    # in the learning part of some sequence.
    burn_in: int = 10
    # Steps shared by consecutive sequences of an env: a sequence starts every
    # sequence_length - overlap steps.
    overlap: int = 20
    batch_size: int = 32  # sequences sampled from replay per update
    lr: float = 1e-3  # Adam
    adam_eps: float = 1e-3
    discount: float = 0.99
    n_step: int = 5  # rewards summed before bootstrapping (fewer at a sequence's end)
    eta: float = 0.9  # priority = eta * max |td| + (1 - eta) * mean |td| over a sequence
    rescale_eps: float = 1e-3  # the eps of the value rescaling h (must be > 0)
    target_update_every: int = 200  # updates between hard copies online -> target
    max_grad_norm: float = 40.0
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False

    def items_per_env_step(self) -> int:
        return 1  # at most one sequence per env completes in a step

    def __post_init__(self) -> None:
        errors = self.field_errors(dataclasses.asdict(self))
        if errors:
            raise ValueError("; ".join(f"algo.{key}: {msg}" for key, msg in errors))

    @classmethod
    def field_errors(cls, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(field, message) for each value out of range, or inconsistent with another,
        in ``values`` (a topology's ``algo`` section; missing fields take defaults).
        Values of the wrong type are skipped: the topology's type check reports them."""
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        v = {**defaults, **{k: x for k, x in values.items() if k in defaults}}

        def number(key: str) -> bool:
            return isinstance(v[key], (int, float)) and not isinstance(v[key], bool)

        rules = [
            ("sequence_length", lambda: v["sequence_length"] >= 1, "must be >= 1"),
            ("burn_in", lambda: 0 <= v["burn_in"] < v["sequence_length"],
             f"must be >= 0 and < sequence_length ({v['sequence_length']}): at least one "
             "step of each sequence must be learned on"),
            ("overlap", lambda: 0 <= v["overlap"] < v["sequence_length"],
             f"must be >= 0 and < sequence_length ({v['sequence_length']}): a sequence "
             "starts every sequence_length - overlap steps"),
            ("batch_size", lambda: v["batch_size"] >= 1, "must be >= 1"),
            ("n_step", lambda: v["n_step"] >= 1, "must be >= 1"),
            ("lr", lambda: v["lr"] > 0, "must be > 0"),
            ("adam_eps", lambda: v["adam_eps"] > 0, "must be > 0"),
            ("discount", lambda: 0 <= v["discount"] <= 1, "must be in [0, 1]"),
            ("eta", lambda: 0 <= v["eta"] <= 1, "must be in [0, 1]"),
            ("rescale_eps", lambda: v["rescale_eps"] > 0,
             "must be > 0 (the inverse of the value rescaling divides by it)"),
            ("target_update_every", lambda: v["target_update_every"] >= 1, "must be >= 1"),
            ("max_grad_norm", lambda: v["max_grad_norm"] > 0, "must be > 0"),
        ]
        others = {"burn_in": ["sequence_length"], "overlap": ["sequence_length"]}
        errors = []
        for key, ok, message in rules:
            if all(number(k) for k in [key, *others.get(key, [])]) and not ok():
                errors.append((key, f"{v[key]!r}: {message}"))
        return errors


@dataclass
class AlphaZeroConfig(AlgoConfig):
    """Hyperparameters of AlphaZero (the topology's ``algo`` section): the search the
    actors run (``zmqrl.parts.search``) and the learner's loss (``zmqrl.parts.algos.alphazero``).
    The search defaults suit small board games (tic-tac-toe, connect four)."""

    kind: str = "alphazero"
    family: ClassVar[str] = SEARCH
    learner: ClassVar[str] = "zmqrl.parts.algos.alphazero:AlphaZeroLearner"
    items: ClassVar[str] = "positions"
    behaviour: ClassVar[str] = "evaluate"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "policy_value"
    reduced_precision: ClassVar[bool] = True
    num_simulations: int = 50  # MCTS simulations per move
    c_puct: float = 1.5  # exploration weight of the PUCT rule
    dirichlet_alpha: float = 1.0  # root noise Dir(alpha) over the legal moves ...
    dirichlet_fraction: float = 0.25  # ... mixed into the root priors with this weight
    # The first moves of each game are sampled in proportion to the root's visit counts
    # (temperature 1); later ones take the most visited move.
    temperature_moves: int = 4
    # A position's value target: the game's outcome z for the player to move, or
    # (1 - mix) z + mix q with q the search's value of the position (its root), which
    # is less noisy than one game's result (what Oracle's connect-four AlphaZero found).
    value_target_mix: float = 0.0
    # Each finished game goes to the replay mirrored left-right as well (games whose
    # rules are symmetric: tic-tac-toe, connect four), twice the positions per game.
    mirror_games: bool = False
    # Playout cap randomization (KataGo, Wu 2019): this fraction of moves, drawn at random,
    # is searched with num_simulations (root noise on) and recorded; the others with
    # fast_simulations, no noise, not recorded. More games for the same search: more
    # independent outcomes for the value target. 1: every move searched fully.
    full_search_fraction: float = 1.0
    fast_simulations: int = 20
    # Each move's search starts from the subtree of the move just played, whose visits
    # count towards its simulations (instead of a fresh tree).
    reuse_trees: bool = False
    batch_size: int = 128  # positions per update
    lr: float = 1e-3  # Adam (the start value when annealed)
    # With anneal_updates > 0 the lr falls linearly from lr to lr_final over that many
    # updates and then stays at lr_final (AlphaZero lowered its lr in steps); 0: constant.
    anneal_updates: int = 0
    lr_final: float = 1e-4
    value_cost: float = 1.0  # weight of the value MSE (the policy cross-entropy has 1)
    l2: float = 1e-4  # weight of the sum of squared weights (biases excluded)
    max_grad_norm: float = 10.0
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False

    @classmethod
    def field_errors(cls, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(field, message) for each value out of range (wrong types: see R2D2Config)."""
        rules = {"num_simulations": (lambda x: x >= 1, "must be >= 1"),
                 "c_puct": (lambda x: x > 0, "must be > 0"),
                 "dirichlet_alpha": (lambda x: x > 0, "must be > 0"),
                 "dirichlet_fraction": (lambda x: 0 <= x <= 1, "must be in [0, 1]"),
                 "temperature_moves": (lambda x: x >= 0, "must be >= 0"),
                 "value_target_mix": (lambda x: 0 <= x <= 1, "must be in [0, 1]"),
                 "full_search_fraction": (lambda x: 0 < x <= 1, "must be in (0, 1]"),
                 "fast_simulations": (lambda x: x >= 1, "must be >= 1"),
                 "batch_size": (lambda x: x >= 1, "must be >= 1"),
                 "lr": (lambda x: x > 0, "must be > 0"),
                 "anneal_updates": (lambda x: x >= 0, "must be >= 0"),
                 "lr_final": (lambda x: x >= 0, "must be >= 0"),
                 "value_cost": (lambda x: x >= 0, "must be >= 0"),
                 "l2": (lambda x: x >= 0, "must be >= 0"),
                 "max_grad_norm": (lambda x: x > 0, "must be > 0")}
        errors = [(key, f"{values[key]!r}: {message}") for key, (ok, message) in rules.items()
                  if isinstance(values.get(key), (int, float))
                  and not isinstance(values[key], bool) and not ok(values[key])]
        # a fast search is the cheaper one (when fast searches are on at all)
        fast = values.get("fast_simulations", cls.fast_simulations)
        full = values.get("num_simulations", cls.num_simulations)
        if values.get("full_search_fraction", 1.0) != 1.0 and \
                all(isinstance(x, int) and not isinstance(x, bool) for x in (fast, full)) \
                and fast > full:
            errors.append(("fast_simulations", f"{fast!r}: must be <= num_simulations ({full})"
                           " when full_search_fraction < 1"))
        return errors


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
    :func:`errors`): unknown keys are an error there, so none are dropped silently here."""
    return config_type(algo.get("kind", DEFAULT_KIND))(**dict(algo))


def errors(algo: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for every unknown key, mistyped value and out-of-range value of
    a topology's ``algo`` section."""
    kind = algo.get("kind", DEFAULT_KIND)
    try:
        cls = config_type(kind)
    except ValueError as exc:
        return [("kind", str(exc).removeprefix("algo.kind: "))]
    found = field_type_errors(cls, algo, kind)
    # Cross-field checks a config may define (R2D2: burn-in < sequence length, ...).
    if not found and hasattr(cls, "field_errors"):
        found += cls.field_errors(algo)
    return found


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
