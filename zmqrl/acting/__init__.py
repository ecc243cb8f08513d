"""Acting: the behaviours that architectures are made of, and the core that batches them.

:mod:`zmqrl.acting.behaviour` defines the per-connection interface and
:func:`act_batched`; one module per behaviour implements it. Which behaviour a topology
acts with follows from its algorithm's family (``zmqrl.algo_config``) and, for A3C, from
the actor shipping to a parameter server: :data:`BEHAVIOURS` is the one table of it, so
a new architecture adds a module and a row here, not a branch in a node.

Importing this package loads no torch: the behaviour modules (which do) are imported
when :func:`behaviour_for` first names them. A remote actor, which runs no model, only
asks :func:`explores_by_epsilon` (whether to send its ε with each step) and so starts
without torch; the broker and local actors load it with their behaviour.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zmqrl.acting.behaviour import (
    ActingSetup,
    Behaviour,
    EpisodeLog,
    Item,
    act_batched,
)
from zmqrl.acting.envs import EpisodeTracker, RewardScaler, apex_epsilon, final_obs
from zmqrl.algo_config import REPLAY, SEARCH, SEQUENCE, UNROLL

if TYPE_CHECKING:  # for type checkers only: importing them loads torch
    from zmqrl.acting.actor_critic import ActorCriticBehaviour
    from zmqrl.acting.gradients import GradientBehaviour
    from zmqrl.acting.q_learning import EpsilonGreedyBehaviour
    from zmqrl.acting.recurrent_q import RecurrentQBehaviour

# (algorithm family, what the items go to) -> the behaviour, as "module:Class".
# "experience": a learner or a replay takes the items; "param_server": they become
# gradients for a parameter server.
BEHAVIOURS: dict[tuple[str, str], str] = {
    (UNROLL, "experience"): "zmqrl.acting.actor_critic:ActorCriticBehaviour",
    (UNROLL, "param_server"): "zmqrl.acting.gradients:GradientBehaviour",
    (REPLAY, "experience"): "zmqrl.acting.q_learning:EpsilonGreedyBehaviour",
    (SEQUENCE, "experience"): "zmqrl.acting.recurrent_q:RecurrentQBehaviour",
    (SEARCH, "experience"): "zmqrl.acting.evaluate:EvaluateBehaviour",
}
# The families whose behaviours explore ε-greedily with each actor's ε (Q-learning): a
# remote actor sends its ε in every step. Kept here, beside the table, so the remote
# actor need not import the behaviour to know; behaviour_for checks the two agree.
EPSILON_FAMILIES = frozenset({REPLAY, SEQUENCE})


def behaviour_for(family: str, destination: str = "experience",
                  acting: Any = None) -> type[Behaviour]:
    """The behaviour class of an algorithm family shipping to ``destination``.

    ``acting``: the topology's acting choice (``Topology.acting``: a parsed section such
    as ``self_play``, or None). It names its behaviour (``acting.behaviour``, for the
    family ``acting.family``); the class returned is a subclass of it whose ``config``
    is ``acting``, so every connection's behaviour reads its knobs from its class."""
    if acting is not None:
        if (family, destination) != (acting.family, "experience"):
            raise ValueError(f"{type(acting).__name__} acts for a '{acting.family}' algorithm "
                             f"shipping to 'experience', not '{family}' to '{destination}'")
        target = acting.behaviour
    else:
        try:
            target = BEHAVIOURS[(family, destination)]
        except KeyError:
            raise ValueError(f"no behaviour for a '{family}' algorithm shipping to "
                             f"'{destination}'") from None
    module, _, name = target.partition(":")
    cls: type[Behaviour] = getattr(importlib.import_module(module), name)
    if acting is not None:
        cls = type(cls.__name__, (cls,), {"config": acting, "__module__": cls.__module__})
    if cls.explores_by_epsilon != (family in EPSILON_FAMILIES):
        raise TypeError(f"{target}.explores_by_epsilon is {cls.explores_by_epsilon}, but "
                        f"EPSILON_FAMILIES {'lacks' if cls.explores_by_epsilon else 'has'} "
                        f"'{family}': make them agree")
    return cls


def explores_by_epsilon(family: str) -> bool:
    """Whether acting for ``family`` takes an actor's ε (without importing the behaviour)."""
    return family in EPSILON_FAMILIES


def __getattr__(name: str) -> Any:
    """The behaviour classes by name (``from zmqrl.acting import ActorCriticBehaviour``),
    imported on first use."""
    for key, target in BEHAVIOURS.items():
        if target.endswith(f":{name}"):
            return behaviour_for(*key)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BEHAVIOURS", "EPSILON_FAMILIES", "ActingSetup", "ActorCriticBehaviour",
           "Behaviour", "EpisodeLog", "EpisodeTracker", "EpsilonGreedyBehaviour",
           "GradientBehaviour", "Item", "RecurrentQBehaviour", "RewardScaler", "act_batched",
           "apex_epsilon", "behaviour_for", "explores_by_epsilon", "final_obs"]
