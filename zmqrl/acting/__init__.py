"""Acting: the behaviours that architectures are made of, and the core that batches them.

:mod:`zmqrl.acting.behaviour` defines the per-connection interface and
:func:`act_batched`; one module per behaviour implements it. Which behaviour a topology
acts with follows from its algorithm's family (``zmqrl.algo_config``) and, for A3C, from
the actor shipping to a parameter server: :data:`BEHAVIOURS` is the one table of it, so
a new architecture adds a module and a row here, not a branch in a node.
"""

from __future__ import annotations

from zmqrl.acting.actor_critic import ActorCriticBehaviour
from zmqrl.acting.behaviour import (
    ActingSetup,
    Behaviour,
    EpisodeLog,
    Item,
    act_batched,
)
from zmqrl.acting.envs import EpisodeTracker, RewardScaler, apex_epsilon, final_obs
from zmqrl.acting.gradients import GradientBehaviour
from zmqrl.acting.q_learning import EpsilonGreedyBehaviour
from zmqrl.acting.recurrent_q import RecurrentQBehaviour
from zmqrl.algo_config import REPLAY, SEQUENCE, UNROLL

# (algorithm family, what the items go to) -> behaviour. "experience": a learner or a
# replay takes the items; "param_server": they become gradients for a parameter server.
BEHAVIOURS: dict[tuple[str, str], type[Behaviour]] = {
    (UNROLL, "experience"): ActorCriticBehaviour,
    (UNROLL, "param_server"): GradientBehaviour,
    (REPLAY, "experience"): EpsilonGreedyBehaviour,
    (SEQUENCE, "experience"): RecurrentQBehaviour,
}


def behaviour_for(family: str, destination: str = "experience") -> type[Behaviour]:
    """The behaviour class of an algorithm family shipping to ``destination``."""
    try:
        return BEHAVIOURS[(family, destination)]
    except KeyError:
        raise ValueError(f"no behaviour for a '{family}' algorithm shipping to "
                         f"'{destination}'") from None


__all__ = ["BEHAVIOURS", "ActingSetup", "ActorCriticBehaviour", "Behaviour", "EpisodeLog",
           "EpisodeTracker", "EpsilonGreedyBehaviour", "GradientBehaviour", "Item",
           "RecurrentQBehaviour", "RewardScaler", "act_batched", "apex_epsilon",
           "behaviour_for", "final_obs"]
