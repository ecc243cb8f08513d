"""What an actor does with a local model: the behaviours of the local-policy actors.

The actor node (``nodes/actor.py``) owns the envs and the sockets; a behaviour owns the
local model and turns each vector step into what the topology wants shipped:

* :class:`ActorCriticBehaviour` (IMPALA actors, A3C workers): samples from the local
  policy and cuts time-major unrolls with behaviour log-probs.
* :class:`EpsilonGreedyBehaviour` (Ape-X, Gorila actors): ε-greedy on a local Q-network,
  n-step transitions with initial priorities |δ| computed on the actor.
* :class:`RecurrentEpsilonGreedyBehaviour` (R2D2 actors): the same on a recurrent
  Q-network whose state is kept per env; ships overlapping sequences with their stored
  state (``zmqrl.sequences``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zmqrl.algos.dqn import NStepAccumulator, td_priorities
from zmqrl.envs import EnvSpec
from zmqrl.models import bootstrap_truncated
from zmqrl.sequences import RecurrentEnvs
from zmqrl.unroll import PolicyState, UnrollBuilder, act_recurrent


def apex_epsilon(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's per-actor exploration: ε_i = base^(1 + alpha·i/(n−1)) (one actor: base)."""
    return base ** (1 + alpha * i / (n - 1)) if n > 1 else base


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


class ActorCriticBehaviour:
    """Samples from the local policy and cuts unrolls; with a recurrent policy
    (``lstm_ac``) it keeps each env's LSTM state and the unrolls carry the state they
    started from."""

    def __init__(self, spec: EnvSpec, model: torch.nn.Module, unroll: int, n: int,
                 discount: float, reward_scale: float = 1.0):
        self.model = model
        recurrent = getattr(model, "recurrent", False)
        self.state = PolicyState(n, model.state_size) if recurrent else None
        self.builder = UnrollBuilder(spec, unroll, n, model.state_size if recurrent else 0)
        self.discount = discount
        self.reward_scale = reward_scale

    def act(self, obs: np.ndarray, version: int) -> tuple[np.ndarray, dict | None]:
        """Actions for ``obs``, and a finished unroll (with its version) if one is due."""
        finished = self.builder.observe(obs)
        if self.state is None:
            action, logp = (x.numpy() for x in self.model.act(torch.from_numpy(obs)))
            self.builder.act(action, logp, version)
        else:
            action, logp, (used,) = act_recurrent(self.model, obs, [self.state])
            self.builder.act(action, logp, version, used)
        if finished is None:
            return action, None
        unroll, started_with = finished
        unroll["version"] = started_with
        return action, unroll

    def outcome(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray, next_obs: np.ndarray) -> None:
        cut = truncated & ~terminated
        if self.state is None:
            reward = bootstrap_truncated(reward, cut, next_obs[cut], self.model, self.discount,
                                         self.reward_scale)
        else:
            if cut.any():  # V(final obs) continues the env's memory
                reward = np.array(reward, np.float32)
                reward[cut] += self.discount * self.state.values_after(
                    self.model, next_obs[cut], cut) / self.reward_scale
            self.state.end_episodes(terminated | truncated)
        self.builder.outcome(reward, terminated | truncated)


class EpsilonGreedyBehaviour:
    def __init__(self, spec: EnvSpec, model: torch.nn.Module, epsilon: float, n_step: int,
                 discount: float, n: int, seed: int):
        self.model = model
        self.epsilon = epsilon
        self.num_actions = spec.num_actions
        self.rng = np.random.default_rng(seed)
        self.nstep = NStepAccumulator(n, n_step, discount)
        self.pending: list[dict[str, np.ndarray]] = []

    def act(self, obs: np.ndarray, version: int) -> tuple[np.ndarray, None]:
        greedy = self.model.q_values(torch.from_numpy(obs)).argmax(-1).numpy()
        explore = self.rng.random(len(obs)) < self.epsilon
        random_actions = self.rng.integers(self.num_actions, size=len(obs))
        return np.where(explore, random_actions, greedy), None

    def outcome(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray, next_obs: np.ndarray) -> None:
        """``next_obs`` holds the final observation where an episode ended."""
        done = self.nstep.push(obs, action, reward, terminated, next_obs, truncated)
        if done is not None:
            self.pending.append(done)

    def take(self) -> dict[str, np.ndarray] | None:
        """The transitions gathered so far, with initial priorities, or None."""
        items = _take_all(self.pending)
        if items is None:
            return None
        items["priority"] = td_priorities(self.model, items["obs"], items["action"],
                                          items["reward"], items["discount"],
                                          items["next_obs"]).astype(np.float32)
        return items


class RecurrentEpsilonGreedyBehaviour:
    def __init__(self, spec: EnvSpec, model: torch.nn.Module, epsilon: float, cfg: Any,
                 n: int, seed: int):
        self.model = model
        self.envs = RecurrentEnvs(spec, cfg, n, model.state_size, epsilon, seed)
        self.pending: list[dict[str, np.ndarray]] = []

    def act(self, obs: np.ndarray, version: int) -> tuple[np.ndarray, None]:
        return self.envs.act(self.model, obs), None

    def outcome(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray, next_obs: np.ndarray) -> None:
        """``next_obs`` holds the final observation where an episode ended."""
        cut = truncated & ~terminated
        reward = self.envs.bootstrap_truncated(self.model, reward, cut, next_obs[cut])
        sequences = self.envs.outcome(reward, terminated | truncated)
        if sequences is not None:
            self.pending.append(sequences)

    def take(self) -> dict[str, np.ndarray] | None:
        """The sequences (with initial priorities) cut so far, or None."""
        return _take_all(self.pending)


def _take_all(pending: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """The batches in ``pending`` joined into one (batch-major), emptying it; None if
    there are none."""
    if not pending:
        return None
    items = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
    pending.clear()
    return items
