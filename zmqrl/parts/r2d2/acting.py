"""ε-greedy acting on a recurrent Q-network (the ``sequence`` family: R2D2 actors, and
SEED's R2D2 in the inference broker): the recurrent state per env, reset at episode
ends, and overlapping fixed-length sequences with the state they started from and
R2D2's mixed max/mean priorities (the bookkeeping is ``zmqrl.parts.sequences.RecurrentEnvs``).
"""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, Item, host
from zmqrl.parts.sequences import RecurrentEnvs


class RecurrentQBehaviour(Behaviour):
    ships = wire.INSERT
    explores_by_epsilon = True

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self.envs = RecurrentEnvs(self.spec, setup.cfg, n, self.model.state_size,
                                  setup.epsilon, setup.seed)

    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        if fields and "epsilon" in fields:
            self.envs.epsilon = float(fields["epsilon"])
        super().observe(obs, fields)

    def inputs(self) -> dict[str, np.ndarray]:
        first, h, c = self.envs.inputs()
        return {"obs": self.obs, "first": first, "h": h, "c": c}

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        q, (h, c) = model.step(inputs["obs"], inputs["first"], (inputs["h"], inputs["c"]))
        return {"q": host(q), "h": host(h), "c": host(c)}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        self.version = version
        return self.envs.record(self.obs, outputs["q"], outputs["h"], outputs["c"])

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        reward = self.envs.bootstrap_truncated(self.model, reward, truncated, final_obs)
        sequences = self.envs.outcome(reward, done)
        if sequences is not None:
            self._ready.append(Item(wire.INSERT, sequences, {"version": self.version}))
