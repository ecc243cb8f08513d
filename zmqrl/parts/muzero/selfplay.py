"""MuZero's acting side: a lane of envs played by search in the learned model, and the
training items their episodes become.

A :class:`LatentLane` steps ``n`` envs (one gymnasium vector env) in lockstep with
their searches. Every round is one query per env (:meth:`LatentLane.query`): first the
root (the env's observation), then ``num_simulations`` recurrent queries, each the leaf
one simulation of :class:`~zmqrl.parts.muzero.search.LatentMCTS` reached. Whoever holds
the model answers (:meth:`LatentLane.answer`): the inference broker for a remote actor,
batching the rounds of all its connections, or a model in this process. After the last
simulation the lane plays the move (sampled from the root's visit counts at
``temperature``) in every env and records the position: observation, action, reward,
visit distribution and the search's root value.

:class:`Targets` turns each env's recorded positions into ``search_targets`` items
(:mod:`zmqrl.parts.muzero.messages`): position t gets the actions and rewards of
t..t+K-1, the visit distributions of t..t+K and the n-step value targets

    z_s = r_s + γ r_{s+1} + ... + γ^{n-1} r_{s+n-1} + γ^n ν_{s+n}

(ν the search's root value; the sum stops at a terminal state). It is shipped once
t+K+n has been searched, or the episode ended: as soon as its targets are final.
An episode cut by a time limit bootstraps from the value of its last searched
position (the final observation is never searched). Its priority is |ν_t - z_t|.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zmqrl.parts.muzero.search import LatentMCTS, SearchParams, choose_action


@dataclass
class _Episode:
    """One env's positions since the oldest one not yet shipped (``start`` is the
    episode index of row 0)."""

    obs: list[np.ndarray] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    policy: list[np.ndarray] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    start: int = 0  # episode index of row 0
    shipped: int = 0  # episode index of the first position not yet shipped


class Targets:
    """Positions of ``n`` envs' episodes → ``search_targets`` items (module docstring)."""

    def __init__(self, n: int, num_actions: int, unroll_steps: int, td_steps: int,
                 discount: float):
        self.k, self.td, self.discount = unroll_steps, td_steps, discount
        self.num_actions = num_actions
        self.episodes = [_Episode() for _ in range(n)]
        self.ready: list[dict[str, np.ndarray]] = []

    def add(self, env: int, obs: np.ndarray, action: int, reward: float, policy: np.ndarray,
            value: float) -> None:
        ep = self.episodes[env]
        ep.obs.append(obs)
        ep.action.append(action)
        ep.reward.append(reward)
        ep.policy.append(policy)
        ep.value.append(value)
        # position t is final once t + K + n has been searched (its value is known)
        known = ep.start + len(ep.obs)
        last = known - 1 - self.k - self.td
        if last >= ep.shipped:
            self._ship(ep, last + 1, ended=False, truncated=False)

    def end(self, env: int, truncated: bool) -> None:
        """The episode of ``env`` ended (after its last :meth:`add`)."""
        ep = self.episodes[env]
        self._ship(ep, ep.start + len(ep.obs), ended=True, truncated=truncated)
        self.episodes[env] = _Episode()

    def take(self) -> dict[str, np.ndarray] | None:
        """The items made since the last call, joined (batch-major), or None."""
        if not self.ready:
            return None
        items = {k: np.concatenate([r[k] for r in self.ready]) for k in self.ready[0]}
        self.ready.clear()
        return items

    def _ship(self, ep: _Episode, stop: int, ended: bool, truncated: bool) -> None:
        """Items for positions ``ep.shipped`` .. ``stop - 1`` (episode indices)."""
        first = ep.shipped - ep.start
        count = stop - ep.shipped
        if count <= 0:
            return
        k, a = self.k, self.num_actions
        rewards = np.asarray(ep.reward, np.float64)
        values = np.asarray(ep.value, np.float64)
        length = len(rewards)  # rows held
        z = self._value_targets(rewards, values, ended and not truncated)
        rows = np.arange(first, first + count)[:, None] + np.arange(k + 1)  # [count, K+1]
        mask = rows < length
        if not ended:
            assert mask.all()  # (only complete positions are shipped before the end)
        idx = np.minimum(rows, length - 1)
        policy = np.stack(ep.policy)[idx]
        policy[~mask] = 1.0 / a
        actions = np.asarray(ep.action, np.int64)[idx[:, :k]]
        step_rewards = rewards[idx[:, :k]].astype(np.float32)
        step_rewards[~mask[:, :k]] = 0.0
        value = np.where(mask, z[idx], 0.0).astype(np.float32)
        self.ready.append({
            "obs": np.stack(ep.obs[first:first + count]),
            "action": actions, "reward": step_rewards, "value": value,
            "policy": policy.astype(np.float32), "mask": mask,
            "priority": np.abs(values[first:first + count] - z[first:first + count]
                               ).astype(np.float32)})
        ep.shipped = stop
        # forget the rows no later position needs (a position needs nothing before it)
        drop = ep.shipped - ep.start
        if drop > 0 and not ended:
            for name in ("obs", "action", "reward", "policy", "value"):
                del getattr(ep, name)[:drop]
            ep.start = ep.shipped

    def _value_targets(self, rewards: np.ndarray, values: np.ndarray,
                       terminal: bool) -> np.ndarray:
        """z for every row held: n-step returns bootstrapped from the root value n rows
        later; past the last row, 0 after a terminal state, else the last row's value
        (the episode goes on, or a time limit cut it)."""
        length, n, g = len(rewards), self.td, self.discount
        tail = 0.0 if terminal else float(values[-1])
        # bootstrap values ν_{s+n} (beyond the rows: the tail value, γ-discounted from
        # where the rows end)
        z = np.zeros(length)
        for s in range(length):
            end = min(s + n, length)
            ret = sum(g ** (i - s) * rewards[i] for i in range(s, end))
            if s + n < length:
                ret += g ** n * values[s + n]
            else:
                ret += g ** (end - s) * tail
            z[s] = ret
        return z


class LatentLane:
    """``n`` envs played by search in the learned model (module docstring).

    ``step_env(actions) -> (obs, reward, terminated, truncated)`` steps the lane's
    vector env (SAME_STEP autoreset: ``obs`` already starts the next episode where one
    ended)."""

    def __init__(self, obs: np.ndarray, step_env: Any, num_actions: int,
                 params: SearchParams, unroll_steps: int, td_steps: int, seed: int = 0):
        self.n = len(obs)
        self.obs = obs
        self.step_env = step_env
        self.params = params
        self.rng = np.random.default_rng(seed)
        self.mcts = LatentMCTS(self.n, num_actions, params, self.rng)
        self.targets = Targets(self.n, num_actions, unroll_steps, td_steps, params.discount)
        self.at_root = True  # the next query is the roots' initial inference
        self.moves = 0
        self.searches = 0
        self.restarts = 0

    @property
    def simulations(self) -> int:
        return int(self.mcts.simulations)

    def query(self) -> dict[str, np.ndarray]:
        """This round's queries (the arrays of a ``step``/``latent_search``)."""
        n = self.n
        if self.at_root:
            zeros = np.zeros(n, np.int32)
            return {"root": np.ones(n, np.bool_), "obs": self.obs, "parent": zeros,
                    "action": np.zeros(n, np.int64), "node": zeros}
        parent, action, node = self.mcts.select()
        return {"root": np.zeros(n, np.bool_), "obs": self.obs[:0],
                "parent": parent.astype(np.int32), "action": action.astype(np.int64),
                "node": node.astype(np.int32)}

    def answer(self, logits: np.ndarray, value: np.ndarray, reward: np.ndarray) -> None:
        """The model's answers to the last :meth:`query`, in game order."""
        if self.at_root:
            self.mcts.set_roots(logits, value, noise=True)
            self.at_root = False
        else:
            self.mcts.expand(reward, logits, value)
        if self.mcts.done:
            self._move()

    def restart_search(self) -> None:
        """Search the current move again from the roots (the latents were lost: the
        broker restarted). Nothing recorded is lost; the simulations done are."""
        self.at_root = True
        self.restarts += 1

    def _move(self) -> None:
        visits = np.asarray(self.mcts.root_visits(), np.float64)
        policy = (visits / visits.sum(-1, keepdims=True)).astype(np.float32)
        root_value = np.asarray(self.mcts.root_value(), np.float64)
        action = choose_action(visits, self.params.temperature, self.rng)
        obs = self.obs
        next_obs, reward, terminated, truncated = self.step_env(action)
        for i in range(self.n):
            self.targets.add(i, obs[i], int(action[i]), float(reward[i]), policy[i],
                             float(root_value[i]))
            if terminated[i] or truncated[i]:
                self.targets.end(i, truncated=bool(truncated[i] and not terminated[i]))
        self.obs = next_obs
        self.moves += self.n
        self.searches += self.n
        self.at_root = True
