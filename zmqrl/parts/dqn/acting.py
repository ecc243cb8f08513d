"""ε-greedy acting on a Q-network (the ``replay`` family: Ape-X, Gorila actors): n-step
transitions (``transitions.py``) with initial priorities |δ| computed where they are
made, for a replay.

Priorities cost two forward passes per step (online and bootstrap values of the new
transitions), more than acting itself: they are computed only when the replay samples
by them (``replay_samples_by_priority``; Gorila's uniform replay does not). Transitions
go out ``insert_batch`` at a time at least (the actor's ``insert_batch``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zmqrl import plugins
from zmqrl.parts.acting.behaviour import ActingSetup, host
from zmqrl.parts.acting.transitions import NStepTransitionBehaviour
from zmqrl.parts.dqn.learner import td_priorities


class EpsilonGreedyBehaviour(NStepTransitionBehaviour):
    explores_by_epsilon = True

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self.epsilon = setup.epsilon
        self.num_actions = self.spec.num_actions

    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        if fields and "epsilon" in fields:
            self.epsilon = float(fields["epsilon"])
        super().observe(obs, fields)

    def inputs(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs}

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        return {"q": host(model.q_values(inputs["obs"]))}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        greedy = outputs["q"].argmax(-1)
        explore = self.rng.random(self.n) < self.epsilon
        random_actions = self.rng.integers(self.num_actions, size=self.n)
        action = np.where(explore, random_actions, greedy).astype(self.spec.action_dtype)
        self._last = (self.obs, action)
        self.version = version
        return action

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        return td_priorities(self.model, items["obs"], items["action"], items["reward"],
                             items["discount"], items["next_obs"])


def replay_samples_by_priority(topo: Any, link: str) -> bool:
    """Whether the replay behind ``link`` ("node.port") of ``topo`` (a loaded
    ``zmqrl.run.topology.Topology``, not imported here: it imports the acting parts) samples
    by priority, so that inserts should carry |δ|: its class says
    (``samples_by_priority``). A node we cannot see into (a ``command``, a class that
    does not say) gets them: sending priorities is never wrong, only work."""
    spec = topo.nodes.get(link.partition(".")[0])
    if spec is None or spec.target is None:
        return True
    try:
        samples_by_priority = getattr(plugins.load_path(spec.target, part="node"),
                                      "samples_by_priority", None)
    except plugins.PluginError:
        return True
    return True if samples_by_priority is None else bool(samples_by_priority(spec))
