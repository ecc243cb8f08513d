"""What an actor does around its envs, whatever the architecture: episode returns,
reward scaling, Ape-X's per-actor ε, a behaviour's per-actor arguments, and the final
observations of ended episodes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def apex_epsilon(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's per-actor exploration: ε_i = base^(1 + alpha·i/(n−1)) (one actor: base)."""
    return base ** (1 + alpha * i / (n - 1)) if n > 1 else base


def behaviour_args(given: dict[str, Any] | None, replica: int, replicas: int
                   ) -> dict[str, float]:
    """An actor's behaviour arguments (its ``behaviour_args``) for replica ``replica`` of
    ``replicas``: each value a number, or a per-replica schedule:

    * ``{per_replica: [v0, v1, ...]}``: one value per replica (as many as replicas);
    * ``{apex: {base: b, alpha: a}}``: Ape-X's b^(1 + a·i/(N−1)) (ε, a noise scale);
    * ``{linear: [first, last]}``: evenly spaced from the first replica to the last.

    ValueError names the argument; every value comes out a finite float."""
    out: dict[str, float] = {}
    for name, value in (given or {}).items():
        if isinstance(value, dict) and len(value) == 1:
            (schedule, spec), = value.items()
            if schedule == "per_replica" and isinstance(spec, list) and len(spec) == replicas:
                value = spec[replica]
            elif schedule == "apex" and isinstance(spec, dict) and set(spec) <= {"base",
                                                                                 "alpha"}:
                value = apex_epsilon(replica, replicas, **spec)
            elif schedule == "linear" and isinstance(spec, list) and len(spec) == 2:
                first, last = spec
                value = first + (last - first) * (replica / (replicas - 1) if replicas > 1
                                                  else 0.0)
            else:
                raise ValueError(f"behaviour_args.{name}: {value!r} is no schedule "
                                 f"(per_replica: [{replicas} values], apex: {{base, alpha}}, "
                                 "or linear: [first, last])")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"behaviour_args.{name}: {value!r} is not a finite number")
        out[name] = float(value)
    return out


class EpisodeTracker:
    """Running returns and lengths of a vector of envs; reports finished episodes."""

    def __init__(self, n: int):
        self.ret = np.zeros(n, np.float64)
        self.length = np.zeros(n, np.int64)

    def step(self, reward: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.ret += reward
        self.length += 1
        if not done.any():
            return np.empty(0, np.float32), np.empty(0, np.int32)
        ended = np.flatnonzero(done)
        out = self.ret[ended].astype(np.float32), self.length[ended].astype(np.int32)
        self.ret[ended] = 0.0
        self.length[ended] = 0
        return out


class RewardScaler:
    """Divides rewards by a running std of each env's discounted return (gymnasium's
    NormalizeReward, which CleanRL's MuJoCo PPO uses), then clips them. It runs where
    the envs are, so the episode returns that actors report stay in raw units."""

    def __init__(self, n: int, discount: float, clip: float = 10.0, eps: float = 1e-8):
        self.discount, self.clip, self.eps = discount, clip, eps
        self.returns = np.zeros(n, np.float64)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.discount + reward
        self._update(self.returns)
        self.returns[done] = 0.0
        scaled = reward / np.sqrt(self.var + self.eps)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def _update(self, x: np.ndarray) -> None:  # Chan et al.'s parallel variance merge
        batch_mean, batch_var, n = float(x.mean()), float(x.var()), len(x)
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + batch_var * n
                    + delta**2 * self.count * n / total) / total
        self.count = total


def final_obs(info: dict, mask: np.ndarray, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The final observations of the envs in ``mask`` (SAME_STEP autoreset puts them in
    ``info["final_obs"]``, since the returned observation already starts a new episode)."""
    rows = [info["final_obs"][i] for i in np.flatnonzero(mask)]
    return np.asarray(rows, dtype).reshape(len(rows), *shape)
