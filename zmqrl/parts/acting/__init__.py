"""Acting: the behaviours that architectures are made of, and the core that batches them.

:mod:`zmqrl.parts.acting.behaviour` defines the per-connection interface and
:func:`act_batched`; one module per behaviour implements it. A behaviour is a part like
any other (:mod:`zmqrl.plugins`): a short name in the ``zmqrl.behaviours`` entry-point
group (zmqrl's own are in its pyproject.toml) or an import path ``module:Class``. Which
one a topology acts with is its algorithm's default (``Config.behaviour``, and
``Config.gradient_behaviour`` for actors that ship gradients to a parameter server),
unless its ``parts:`` section or its ``self_play:`` section names another.

Importing this package loads no torch: a behaviour's module (which does) is imported
when :func:`behaviour_for` first names it. A remote actor, which runs no model, never
asks; the broker and local actors load it with their behaviour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zmqrl import plugins
from zmqrl.parts.acting.behaviour import (
    ActingSetup,
    Behaviour,
    EpisodeLog,
    Item,
    act_batched,
)
from zmqrl.parts.acting.envs import EpisodeTracker, RewardScaler, apex_epsilon, final_obs
from zmqrl.parts.algo_config import CONFIGS, AlgoConfig, Parts

if TYPE_CHECKING:  # for type checkers only: importing them loads torch
    from zmqrl.parts.actor_critic.a3c import GradientBehaviour
    from zmqrl.parts.actor_critic.acting import ActorCriticBehaviour
    from zmqrl.parts.dqn.acting import EpsilonGreedyBehaviour
    from zmqrl.parts.r2d2.acting import RecurrentQBehaviour

DESTINATIONS = ("experience", "param_server")


def behaviour_type(name: str, import_paths: Any = ()) -> type[Behaviour]:
    """The behaviour class ``name`` stands for (short name or ``module:Class``)."""
    cls = plugins.resolve("behaviour", name, import_paths)
    if not (isinstance(cls, type) and issubclass(cls, Behaviour)):
        raise plugins.PluginError(f"behaviour '{name}' is not a zmqrl.parts.acting.Behaviour "
                                  f"subclass ({cls!r})")
    return cls


def behaviour_for(parts: Parts | AlgoConfig | type | str, destination: str = "experience",
                  acting: Any = None) -> type[Behaviour]:
    """The behaviour class acting for ``parts`` (a topology's :class:`Parts`, or an
    algorithm's config, whose defaults are used) when its items go to ``destination``:
    ``experience`` (a learner or a replay) or ``param_server`` (they become gradients).

    ``parts`` may also be an algorithm family's name (``unroll``, ``replay``, ...): the
    behaviour the registered algorithms of that family share (a shorthand for tests).

    ``acting``: the topology's acting choice (``Topology.acting``: a parsed section such
    as ``self_play``, or None). It names its behaviour (``acting.behaviour``, for the
    family ``acting.family``); the class returned is a subclass of it whose ``config``
    is ``acting``, so every connection's behaviour reads its knobs from its class."""
    if acting is not None:
        family = acting.family if isinstance(parts, Parts) else \
            parts if isinstance(parts, str) else parts.family
        if (family, destination) != (acting.family, "experience"):
            raise ValueError(f"{type(acting).__name__} acts for a '{acting.family}' algorithm "
                             f"shipping to 'experience', not '{family}' to '{destination}'")
        cls = behaviour_type(acting.behaviour)
        return type(cls.__name__, (cls,), {"config": acting, "__module__": cls.__module__})
    if isinstance(parts, str):
        parts = _family_parts(parts)
    elif not isinstance(parts, Parts):
        parts = Parts.of(parts)  # type: ignore[arg-type]
    if destination not in DESTINATIONS:
        raise ValueError(f"no behaviour ships to '{destination}' (one of "
                         f"{', '.join(DESTINATIONS)})")
    name = parts.behaviour if destination == "experience" else parts.gradient_behaviour
    if name is None:
        raise ValueError(f"no behaviour for a '{parts.items}' algorithm shipping to "
                         f"'{destination}'")
    return behaviour_type(name)


def _family_parts(family: str) -> Parts:
    found = {(c.behaviour, c.gradient_behaviour): c for c in CONFIGS.values()
             if c.family == family}
    if len(found) != 1:
        raise ValueError(f"the registered algorithms of family '{family}' do not name one "
                         f"behaviour ({len(found)} choices): name the algorithm")
    return Parts.of(next(iter(found.values())))


def __getattr__(name: str) -> Any:
    """The built-in behaviour classes by class name (``from zmqrl.parts.acting import
    ActorCriticBehaviour``), imported on first use."""
    for short in plugins.names("behaviour"):
        cls = plugins.resolve("behaviour", short)
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ActingSetup", "ActorCriticBehaviour",
           "Behaviour", "EpisodeLog", "EpisodeTracker", "EpsilonGreedyBehaviour",
           "GradientBehaviour", "Item", "RecurrentQBehaviour", "RewardScaler", "act_batched",
           "apex_epsilon", "behaviour_for", "behaviour_type", "final_obs"]
