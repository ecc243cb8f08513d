"""How actors act for TD3 and SAC: n-step transitions (``NStepTransitionBehaviour``)
whose initial priorities come from the acting network's own critics, as Ape-X's do.

* ``gaussian_noise`` (:class:`GaussianNoiseBehaviour`, TD3 / Ape-X DPG): the
  deterministic policy's action plus N(0, σ²) per dimension, σ = ``noise`` × the
  dimension's half-range, clipped to the bounds. ``noise`` is the algorithm's
  ``exploration_noise`` unless the actor's behaviour argument ``noise`` gives its own
  (a per-replica schedule: Ape-X gives each actor its own ε, Ape-X DPG its own noise).
* ``squashed_gaussian`` (:class:`SquashedGaussianBehaviour`, SAC): a sample of the
  tanh-squashed Gaussian the policy outputs; behaviour argument ``noise`` (if given)
  scales its standard deviation (1: SAC's own policy).

Both take the behaviour argument ``random_steps`` (default 0): the first that many
actions of each behaviour (an actor's envs together) are drawn uniformly within the
bounds instead — TD3's ``start_timesteps``, SB3's ``learning_starts``: the replay first
holds the whole action space rather than one initial policy's neighbourhood. Counted
per behaviour from its start, so a resumed run's actors draw them again.

Each acts in a local actor (one connection) and in the inference broker (every
connection in one forward pass); a remote actor's arguments arrive in its step
header's ``args``. Sampling happens here, in numpy, from the behaviour's own stream:
the forward pass returns the policy's parameters only.
"""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.parts.acting.behaviour import ActingSetup, host
from zmqrl.parts.acting.transitions import NStepTransitionBehaviour
from zmqrl.parts.continuous import sac, td3


class _BoxBehaviour(NStepTransitionBehaviour):
    """Actions in a Box: the bounds, and the behaviour argument ``noise``."""

    default_noise = 1.0

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        low, high = self.spec.action_low, self.spec.action_high
        if low is None or high is None:
            raise ValueError(f"{type(self).__name__} acts in a Box action space; this env's "
                             "actions are discrete")
        self.low, self.high = low.astype(np.float32), high.astype(np.float32)
        self.half = (self.high - self.low) / 2
        self.noise = float(setup.args.get("noise", self.default_noise))
        self.random_steps = _count(setup.args.get("random_steps", 0))
        self.uniform_acted = 0  # env steps acted (each of the n envs' actions counts)

    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        args = (fields or {}).get("args") or {}
        if "noise" in args:  # a remote actor's own (zmqrl.parts.acting.envs.behaviour_args)
            self.noise = float(args["noise"])
        if "random_steps" in args:
            self.random_steps = _count(args["random_steps"])
        super().observe(obs, fields)

    def _uniform(self, shape: tuple[int, ...]) -> np.ndarray | None:
        """Uniform actions within the bounds while the first ``random_steps`` last."""
        if self.uniform_acted >= self.random_steps:
            return None
        self.uniform_acted += self.n
        return self.rng.uniform(self.low, self.high, (self.n, *self.low.shape)
                                ).astype(np.float32).reshape(shape)

    def inputs(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs}

    def _act(self, action: np.ndarray, version: int) -> np.ndarray:
        action = np.clip(action, self.low, self.high).astype(self.spec.action_dtype)
        self._last = (self.obs, action)
        self.version = version
        return action


class GaussianNoiseBehaviour(_BoxBehaviour):
    def __init__(self, setup: ActingSetup, n: int):
        self.default_noise = float(setup.cfg.exploration_noise)
        super().__init__(setup, n)

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        return {"action": host(model.act(inputs["obs"]))}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        action = outputs["action"]
        uniform = self._uniform(action.shape)
        if uniform is not None:
            return self._act(uniform, version)
        if self.noise > 0:
            action = action + self.rng.standard_normal(action.shape, np.float32) * \
                (self.noise * self.half)
        return self._act(action, version)

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        return td3.initial_priorities(self.model, items)


class SquashedGaussianBehaviour(_BoxBehaviour):
    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        mean, log_std = model.mean_log_std(inputs["obs"])
        return {"mean": host(mean), "log_std": host(log_std)}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        mean, std = outputs["mean"], np.exp(outputs["log_std"]) * self.noise
        uniform = self._uniform((self.n, *self.spec.action_shape))
        if uniform is not None:
            return self._act(uniform, version)
        u = mean + std * self.rng.standard_normal(mean.shape, np.float32)
        unit = np.tanh(u).reshape(self.n, *self.spec.action_shape)
        return self._act(self.low + (unit + 1) * self.half, version)

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        return sac.initial_priorities(self.model, items)


def _count(value: float) -> int:
    """``random_steps`` as a count (behaviour arguments arrive as floats)."""
    if value < 0 or value != int(value):
        raise ValueError(f"behaviour_args.random_steps: {value!r} is not a count of steps")
    return int(value)
