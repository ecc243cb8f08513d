"""Evaluating search leaves (the ``search`` family: AlphaZero's actors on the bus).

A search actor (``nodes/mcts_actor.py``) sends the leaves of all its games as one
``step``: their observations in ``obs``, zero rewards and dones (a leaf has no
outcome). The inference broker keeps one :class:`EvaluateBehaviour` per connection
like any other behaviour, so the leaves of every actor that has a request in go
through one forward pass of the policy-value network (SEED's central inference
applied to search). The ``act`` reply (``act``/``evaluation`` in ``zmqrl.bus.messages``)
carries the policy logits and values beside the greedy move. Nothing is shipped: the
actor itself sends the finished games to the replay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, host

if TYPE_CHECKING:
    import torch


class EvaluateBehaviour(Behaviour):
    ships = ""  # nothing: positions go from the actor to the replay
    steps_envs = False  # leaves of a search, not env steps: the actor counts its moves

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self._outputs: dict[str, np.ndarray] = {}

    def inputs(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs}

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        logits, value = model.predict(inputs["obs"])
        return {"logits": host(logits), "value": host(value)}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        self._outputs = outputs
        return outputs["logits"].argmax(-1).astype(self.spec.action_dtype)

    def reply(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        return {"action": actions, "logits": self._outputs["logits"],
                "value": self._outputs["value"]}

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        pass  # leaves have no outcome
