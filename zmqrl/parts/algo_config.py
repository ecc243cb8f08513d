"""What every algorithm's config is: a topology's ``algo`` section, parsed once, typed.

Each algorithm's hyperparameters are one dataclass (CleanRL style), a subclass of
:class:`AlgoConfig` in its family's folder (``zmqrl.parts.dqn.config``, ...), defaults
there only. ``zmqrl.run.topology``
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
    # protocol (zmqrl.run.contracts): an import path, loaded only where a model trains.
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
    # how a resumed run's model is carried into a changed one (zmqrl.parts.surgery)
    surgery: str = "net2net"

    FIELDS: ClassVar[tuple[str, ...]] = ("behaviour", "gradient_behaviour", "items",
                                         "source", "updater", "surgery")

    @classmethod
    def of(cls, cfg: AlgoConfig, overrides: Mapping[str, Any] | None = None) -> Parts:
        given = dict(overrides or {})
        found = {name: given.get(name, getattr(cfg, name, None)) for name in cls.FIELDS}
        if found["surgery"] is None:
            del found["surgery"]  # the default
        return cls(**found)

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
