"""ε-greedy acting on a Q-network (the ``replay`` family: Ape-X, Gorila actors): n-step
transitions with initial priorities |δ| computed where they are made, for a replay.

Priorities cost two forward passes per step (online and bootstrap values of the new
transitions), more than acting itself: they are computed only when the replay samples
by them (``replay_samples_by_priority``; Gorila's uniform replay does not). Transitions
go out ``insert_batch`` at a time at least (the actor's ``insert_batch``).

An env whose episode ended contributes its transition with the final observation as
``next_obs`` where a time limit cut it (the target bootstraps from it) and with the
next observation otherwise (a terminal transition's target does not look at it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zmqrl import plugins
from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, Item, host, take_all
from zmqrl.parts.algos.dqn import NStepAccumulator, td_priorities


class EpsilonGreedyBehaviour(Behaviour):
    ships = wire.INSERT
    explores_by_epsilon = True

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self.epsilon = setup.epsilon
        self.num_actions = self.spec.num_actions
        self.rng = np.random.default_rng(setup.seed)
        self.nstep = NStepAccumulator(n, setup.cfg.n_step, setup.cfg.discount)
        self.pending: list[dict[str, np.ndarray]] = []
        self._last: tuple | None = None  # (obs, action) of the step awaiting its outcome
        self._result: tuple | None = None  # (reward, done, truncated, final_obs)
        self.version = 0  # of the parameters that acted last

    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        if fields and "epsilon" in fields:
            self.epsilon = float(fields["epsilon"])
        if self._result is not None:  # the transition is complete with its next obs
            (last_obs, action), (reward, done, truncated, final_obs) = self._last, self._result
            next_obs = obs
            if truncated.any():
                next_obs = np.array(obs)
                next_obs[truncated] = final_obs
            finished = self.nstep.push(last_obs, action, reward, done & ~truncated, next_obs,
                                       truncated)
            if finished is not None:
                self.pending.append(finished)
            self._result = None
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

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        self._result = (reward, done, truncated, final_obs)

    def take(self) -> list[Item]:
        if sum(len(p["action"]) for p in self.pending) < self.setup.insert_batch:
            return []
        items = take_all(self.pending)
        if items is None:
            return []
        if self.setup.priorities:
            items["priority"] = td_priorities(self.model, items["obs"], items["action"],
                                              items["reward"], items["discount"],
                                              items["next_obs"]).astype(np.float32)
        return [Item(wire.INSERT, items, {"version": self.version})]


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
