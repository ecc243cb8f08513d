"""Time-major unrolls for a vector of envs: what actors and the inference broker ship.

An unroll of length T holds ``obs`` [T+1, n, ...] (the last observation is for
bootstrapping and is also the first of the next unroll), ``action`` [T, n, ...],
behaviour ``logp`` [T, n], ``reward`` [T, n] and ``done`` [T, n] (the episode ended
after that action; the next observation is then the first of a new episode).
"""

from __future__ import annotations

import numpy as np

from zmqrl.envs import EnvSpec


class UnrollBuilder:
    """Collects one vector of envs' steps and cuts an unroll every ``length`` steps.

    Per step: ``outcome(reward, done)`` for the previous action (if any), then
    ``observe(obs)`` (which returns a finished unroll when one is complete), then
    ``act(action, logp, version)``.
    """

    def __init__(self, spec: EnvSpec, length: int, n: int):
        self.length = length
        self.n = n
        self.obs = np.zeros((length + 1, n, *spec.obs_shape), spec.obs_dtype)
        self.action = np.zeros((length, n, *spec.action_shape), spec.action_dtype)
        self.logp = np.zeros((length, n), np.float32)
        self.reward = np.zeros((length, n), np.float32)
        self.done = np.zeros((length, n), np.bool_)
        self.t = 0  # completed transitions in the current unroll
        self.pending = False  # an action was taken and its outcome not yet recorded
        self.version = 0  # parameter version that took the current unroll's first action

    def outcome(self, reward: np.ndarray, done: np.ndarray) -> None:
        if self.pending:
            self.reward[self.t] = reward
            self.done[self.t] = done
            self.t += 1
            self.pending = False

    def observe(self, obs: np.ndarray) -> tuple[dict[str, np.ndarray], int] | None:
        """Record the current observation; return a finished unroll (copies) and the
        parameter version that took its first action, if one is complete."""
        self.obs[self.t] = obs
        if self.t < self.length:
            return None
        unroll = {"obs": self.obs.copy(), "action": self.action.copy(), "logp": self.logp.copy(),
                  "reward": self.reward.copy(), "done": self.done.copy()}
        self.obs[0] = obs
        self.t = 0
        return unroll, self.version

    def act(self, action: np.ndarray, logp: np.ndarray, version: int) -> None:
        if self.t == 0:
            self.version = version  # the unroll's policy lag is measured from here
        self.action[self.t] = action
        self.logp[self.t] = logp
        self.pending = True
