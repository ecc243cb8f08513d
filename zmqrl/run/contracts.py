"""The contracts between parts, as code: what each part must provide, checked when a
topology loads (``zmqrl up``, ``zmqrl validate``).

Every part a topology names (:mod:`zmqrl.plugins`) is resolved here and held to its
protocol, so a plug-in that lacks a method is a ``validate`` error naming the part and
the method, not a traceback in a node minutes into a run:

* an algorithm: its config is a dataclass (:class:`zmqrl.parts.algo_config.AlgoConfig`'s
  attributes) whose ``learner`` class has :class:`Learner`'s methods;
* a model: its ``interface`` is the one the algorithm's config needs;
* a behaviour: a :class:`zmqrl.parts.acting.Behaviour` subclass that defines each of
  :data:`BEHAVIOUR_METHODS`;
* a data source and an updater: :class:`zmqrl.parts.learning.sources.Source` and
  :class:`zmqrl.parts.learning.updaters.Updater`;
* the item kind: an ``insert``/``batch`` variant declared in :mod:`zmqrl.bus.messages`;
* a node: a :class:`zmqrl.bus.node.Node` subclass whose ``role`` is one of
  :data:`zmqrl.bus.roles.ROLES` and whose ``shows`` pools each field by ``sum`` or ``last``.

This imports the torch-side parts: only the full check (not a node's own start) runs it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol

from zmqrl import plugins
from zmqrl.bus import messages, roles, wire
from zmqrl.parts import algo_config

Errors = list[tuple[tuple, str]]


class Topology(Protocol):
    """What the checks read of a loaded topology (``zmqrl.run.topology.Topology``, whose
    loading runs them: a protocol here, so that this module imports no topology)."""

    model: dict[str, Any]
    nodes: dict[str, Any]
    import_paths: list[str]
    algo_config: Any
    parts_config: algo_config.Parts
    acting: Any


class Learner(Protocol):
    """What an algorithm's learner object provides (built as ``Learner(cfg, model,
    **options)``). ``update`` trains on one batch and returns its loss terms (a dict of
    floats), or (terms, new priorities) when it learns from a prioritized replay.
    Optional: ``optimizer`` (PBT sets its learning rate), ``apply_hyperparameters
    (changed)`` (PBT: what the new config alone does not reach), ``gradients(batch)`` and
    ``apply_gradients(grads)`` (Gorila learners, A3C workers, the parameter server)."""

    def update(self, batch: Mapping[str, Any]) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# What every behaviour defines (zmqrl.parts.acting.behaviour): the rest has defaults there.
BEHAVIOUR_METHODS = ("inputs", "forward", "record", "_outcome")
SOURCE_METHODS = ("for_learner", "on_message", "next_batch", "done", "poll", "lost",
                  "close", "metrics", "state", "restore")
UPDATER_METHODS = ("for_learner", "bind", "ready", "step", "poll", "lost", "metrics",
                   "close")
SURGERY_METHODS = ("carry", "check")  # zmqrl.parts.surgery.Surgery


def _missing(cls: type, names: tuple[str, ...], base: type | None = None) -> list[str]:
    """The methods of ``names`` that ``cls`` lacks (or inherits unchanged from ``base``,
    whose versions only raise NotImplementedError)."""
    return [n for n in names if not callable(getattr(cls, n, None))
            or (base is not None and getattr(cls, n) is getattr(base, n, None))]


LEARNER_METHODS = ("update", "state_dict", "load_state_dict")  # Learner's, checked by name


def errors(topo: Topology) -> Errors:
    """Every part of ``topo`` resolved and held to its contract."""
    found: Errors = []
    try:
        cfg = topo.algo_config
    except (TypeError, ValueError):
        return []  # the algo section's own errors are reported with it
    parts = topo.parts_config
    where_algo = ("algo", "kind")

    try:
        learner = algo_config.learner_type(cfg)
    except ValueError as exc:
        found.append((where_algo, str(exc)))
    else:
        if not inspect.isclass(learner):
            found.append((where_algo, f"{cfg.learner} is not a class"))
        else:
            found += [(where_algo, f"learner {cfg.learner} lacks the method '{name}' "
                                   "(zmqrl.run.contracts.Learner)")
                      for name in _missing(learner, LEARNER_METHODS)]

    from zmqrl.parts.acting import Behaviour, behaviour_type

    try:
        acting = topo.acting
    except (TypeError, ValueError):
        acting = None  # the self_play section's own errors are reported with it
    behaviours = [("behaviour", acting.behaviour if acting is not None else parts.behaviour)]
    if parts.gradient_behaviour is not None:
        behaviours.append(("gradient_behaviour", parts.gradient_behaviour))
    for field, name in behaviours:
        where = ("parts", field)
        try:
            cls = behaviour_type(name)
        except plugins.PluginError as exc:
            found.append((where, str(exc)))
            continue
        found += [(where, f"behaviour '{name}' does not define '{method}' "
                          "(zmqrl.parts.acting.Behaviour)")
                  for method in _missing(cls, BEHAVIOUR_METHODS, Behaviour)]

    for field, methods in (("source", SOURCE_METHODS), ("updater", UPDATER_METHODS),
                           ("surgery", SURGERY_METHODS)):
        name = getattr(parts, field)
        if name is None:
            continue  # the updater: chosen by the learner's links and replicas
        try:
            cls = plugins.resolve(field, name)
        except plugins.PluginError as exc:
            found.append((("parts", field), str(exc)))
            continue
        found += [(("parts", field), f"{field} '{name}' lacks the method '{method}'")
                  for method in _missing(cls, methods)]

    if not parts.unrolls:
        try:
            messages.spec(wire.INSERT, parts.items)
            messages.spec(wire.BATCH, parts.items)
        except (KeyError, ValueError):
            found.append((("parts", "items"), f"'{parts.items}' is no item kind declared "
                                              "(insert and batch variants, in zmqrl.bus."
                                              "messages or a plug-in's MessageSet)"))
    found += _model_errors(topo, cfg)
    return found + _node_errors(topo)


# What the node runtime reads of a node class (zmqrl.bus.node.Node has each). Checked by
# name: zmqrl.bus.node imports the topology module, which imports this one.
NODE_ATTRIBUTES = ("binds", "links", "accepts", "Args", "role", "shows", "check_spec",
                   "largest_insert", "setup", "run")


def _node_errors(topo: Topology) -> Errors:
    found: Errors = []
    for spec in topo.nodes.values():
        if spec.target is None:
            continue  # a command node says its role in its hello
        try:
            cls = plugins.load_path(spec.target, topo.import_paths, "node")
        except plugins.PluginError:
            continue  # reported by the topology check
        where = ("nodes", spec.name, "impl" if spec.impl else "kind")
        lacks = [name for name in NODE_ATTRIBUTES if not hasattr(cls, name)]
        if not inspect.isclass(cls) or lacks:
            found.append((where, f"{spec.target} is not a zmqrl.bus.node.Node subclass (it "
                                 f"lacks {', '.join(lacks) or 'a class'})"))
            continue
        if cls.role not in roles.ROLES:
            found.append((where, f"{spec.target}.role is {cls.role!r}, not one of "
                                 f"{', '.join(repr(r) for r in roles.ROLES)}"))
        bad = {k: v for k, v in cls.shows.items() if v not in roles.POOLING}
        if bad or len(cls.shows) > roles.MAX_SHOWN:
            found.append((where, f"{spec.target}.shows must map at most {roles.MAX_SHOWN} "
                                 f"fields to {' or '.join(roles.POOLING)} (got {bad or 'more'})"))
    return found


def _model_errors(topo: Topology, cfg: Any) -> Errors:
    from zmqrl.parts.models import DEFAULT_MODEL, model_interface, model_type

    kind = topo.model.get("kind", DEFAULT_MODEL)
    try:
        make = model_type(kind)
    except ValueError:
        return []  # reported when the model is built
    need, has = getattr(cfg, "model_interface", None), model_interface(make)
    if need is None or has == need:
        return []
    serves = [name for name in plugins.names("algo") if has is not None and
              getattr(plugins.resolve("algo", name), "model_interface", None) == has]
    return [(("model", "kind"), f"model '{kind}' cannot serve algo '{cfg.kind}' (it serves: "
                                f"{', '.join(serves) or 'no registered algorithm'}): it "
                                f"provides {has or 'no interface'!s}, the algorithm needs "
                                f"{need}")]
