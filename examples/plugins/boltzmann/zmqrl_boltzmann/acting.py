"""``boltzmann``: act by sampling softmax(Q / temperature); ship n-step transitions.

zmqrl's ε-greedy behaviour already cuts n-step transitions and batches its inserts;
this one only chooses actions differently. The temperature is the algorithm's, and an
actor's behaviour argument ``temperature`` overrides it (each actor its own, as Ape-X
gives each actor its own ε).
"""

from __future__ import annotations

import numpy as np

from zmqrl.parts.acting.behaviour import ActingSetup
from zmqrl.parts.dqn.acting import EpsilonGreedyBehaviour


class BoltzmannBehaviour(EpsilonGreedyBehaviour):
    explores_by_epsilon = False

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self.temperature = float(setup.args.get("temperature", setup.cfg.temperature))

    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        args = (fields or {}).get("args") or {}
        if "temperature" in args:
            self.temperature = float(args["temperature"])
        super().observe(obs, fields)

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        logits = outputs["q"] / self.temperature
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        # inverse-CDF sampling, one uniform per env
        u = self.rng.random((self.n, 1))
        action = (probs.cumsum(-1) < u).sum(-1).clip(max=probs.shape[-1] - 1)
        action = action.astype(self.spec.action_dtype)
        self._last = (self.obs, action)
        self.version = version
        return action
