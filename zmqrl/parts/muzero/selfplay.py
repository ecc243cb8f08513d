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
With ``reanalyse`` it also carries what recomputing its targets takes (the observations
of the unroll and of each value target's bootstrap, the reward sums and discounts); with
``unroll_obs`` the unroll's observations alone (the consistency loss's targets), with
``bootstrap`` the value targets' parts alone (the learner's target network).
An episode cut by a time limit bootstraps from the value of its last searched
position (the final observation is never searched; that value counts the last reward
already), and past its end the value target is that value, not the 0 of a terminal
state. Its priority is |ν_t - z_t| + ``priority_eps``: never 0 (a time-limit-cut
episode's last position has z_t = ν_t, and one zero priority held by a prioritized
replay would set the scale of every importance weight, :mod:`zmqrl.parts.replay.table`).
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


def _expand(mask: np.ndarray, dims: int) -> np.ndarray:
    """``mask`` with ``dims`` trailing axes of size 1 (to select whole observations)."""
    return mask.reshape(*mask.shape, *(1,) * dims)


class Targets:
    """Positions of ``n`` envs' episodes → ``search_targets`` items (module docstring)."""

    def __init__(self, n: int, num_actions: int, unroll_steps: int, td_steps: int,
                 discount: float, reanalyse: bool = False, priority_eps: float = 1e-3,
                 unroll_obs: bool | None = None, bootstrap: bool | None = None):
        self.k, self.td, self.discount = unroll_steps, td_steps, discount
        # the observations at t+1..t+K: for a reanalyse node, or the consistency loss
        self.unroll_obs = reanalyse if unroll_obs is None else unroll_obs or reanalyse
        # each value target's parts: for a reanalyse node, or the learner's target network
        self.bootstrap = reanalyse if bootstrap is None else bootstrap or reanalyse
        if not priority_eps > 0:
            raise ValueError(f"priority_eps must be > 0, got {priority_eps}")
        self.priority_eps = priority_eps
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
        partial, boot, boot_row = self._value_targets(rewards, ended and not truncated)
        z = partial + boot * values[boot_row]
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
        # Past the end: 0 after a terminal state (absorbing); after a time limit the
        # episode would have gone on, so the last row's value stands in (the learner
        # trains the value there too: 0 would teach it that time runs out)
        cut = ended and truncated
        value = np.where(mask, z[idx], values[-1] if cut else 0.0).astype(np.float32)
        item = {"obs": np.stack(ep.obs[first:first + count]),
                "action": actions, "reward": step_rewards, "value": value,
                "policy": policy.astype(np.float32), "mask": mask,
                "priority": (np.abs(values[first:first + count] - z[first:first + count])
                             + self.priority_eps).astype(np.float32)}
        if self.unroll_obs:  # the consistency loss's targets, or a reanalyse node's roots
            obs = np.stack(ep.obs)
            item["obs_unroll"] = np.where(_expand(mask[:, 1:], obs.ndim - 1),
                                          obs[idx[:, 1:]], 0).astype(obs.dtype)
        if self.bootstrap:  # what recomputing the value targets takes
            obs = np.stack(ep.obs)
            # past a time limit's end the last row's value stands in (as above)
            disc = np.where(mask, boot[idx], 1.0 if cut else 0.0)
            row = np.where(mask, boot_row[idx], length - 1)
            item["obs_bootstrap"] = np.where(_expand(disc > 0, obs.ndim - 1),
                                             obs[row], 0).astype(obs.dtype)
            item["partial_return"] = np.where(mask, partial[idx], 0).astype(np.float32)
            item["bootstrap_discount"] = disc.astype(np.float32)
        self.ready.append(item)
        ep.shipped = stop
        # forget the rows no later position needs (a position needs nothing before it)
        drop = ep.shipped - ep.start
        if drop > 0 and not ended:
            for name in ("obs", "action", "reward", "policy", "value"):
                del getattr(ep, name)[:drop]
            ep.start = ep.shipped

    def _value_targets(self, rewards: np.ndarray, terminal: bool
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every row held: the reward sum of its n-step value target, the discount
        of its bootstrap (0: none) and the row bootstrapped from, so that
        z = partial + discount * ν[row]. Past the last row: nothing after a terminal
        state; else the last row's value (a time limit cut the episode)."""
        length, n, g = len(rewards), self.td, self.discount
        partial = np.zeros(length)
        discount = np.zeros(length)
        row = np.zeros(length, np.int64)
        for s in range(length):
            if s + n < length:
                partial[s] = sum(g ** (i - s) * rewards[i] for i in range(s, s + n))
                discount[s], row[s] = g ** n, s + n
            elif terminal:
                partial[s] = sum(g ** (i - s) * rewards[i] for i in range(s, length))
            else:  # ν of the last row already counts its reward: sum up to the row before
                partial[s] = sum(g ** (i - s) * rewards[i] for i in range(s, length - 1))
                discount[s], row[s] = g ** (length - 1 - s), length - 1
        return partial, discount, row


class LatentLane:
    """``n`` envs played by search in the learned model (module docstring).

    ``step_env(actions) -> (obs, reward, terminated, truncated)`` steps the lane's
    vector env (SAME_STEP autoreset: ``obs`` already starts the next episode where one
    ended)."""

    def __init__(self, obs: np.ndarray, step_env: Any, num_actions: int,
                 params: SearchParams, unroll_steps: int, td_steps: int, seed: int = 0,
                 reanalyse: bool = False, priority_eps: float = 1e-3,
                 unroll_obs: bool | None = None, bootstrap: bool | None = None):
        self.n = len(obs)
        self.obs = obs
        self.step_env = step_env
        self.params = params
        self.rng = np.random.default_rng(seed)
        self.mcts = LatentMCTS(self.n, num_actions, params, self.rng)
        self.targets = Targets(self.n, num_actions, unroll_steps, td_steps, params.discount,
                               reanalyse, priority_eps, unroll_obs, bootstrap)
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
