"""Replay sequences for recurrent Q-learning (R2D2), cut while acting: what a local
recurrent actor and the inference broker ship. No model calls in here: the broker
batches many groups' envs into one forward pass, so the model call stays outside the
bookkeeping (:meth:`RecurrentEnvs.act` is the one-group convenience).

A sequence dict is batch-major over the group's n envs (L = sequence_length):

    obs      [n, L+1, *obs_shape]     obs_dtype  (obs L bootstraps the last steps)
    action   [n, L, *action_shape]    action_dtype (int64 for discrete actions)
    reward   [n, L]                   float32
    done     [n, L]                   bool   (episode ended after action t)
    state_h  [n, H]                   float32  the recurrent state used with obs 0
    state_c  [n, H]                   float32  (zeros if obs 0 starts an episode)
    priority [n]                      float32  (from RecurrentEnvs only)

A sequence starts every L - overlap steps, so consecutive ones share ``overlap``
steps; sequences run across episode ends (SAME_STEP autoreset), the network resets
its state after each done.
"""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.r2d2.learner import R2D2Config, actor_priorities, h_inv


class SequenceBuilder:
    """Collects the lockstep steps of n envs and cuts overlapping sequences.

    Per step: ``record(obs, h, c, action, q)`` with the state used for ``obs``, then
    ``outcome(reward, done)``, which returns ``(sequence, q)`` when the observation
    just recorded completes one (it is then obs L of that sequence), else None.
    ``q`` [n, L+1, A] holds the recorded Q-values of the sequence's observations (for
    initial priorities; not shipped). Pure numpy; the steps live in a ring of L+1 slots
    (the oldest is overwritten only after the sequence that needs it was cut).
    """

    def __init__(self, spec: EnvSpec, length: int, overlap: int, n: int, state_size: int):
        if not 0 <= overlap < length:
            raise ValueError(f"overlap must be in [0, {length}), got {overlap}")
        self.length = length
        self.stride = length - overlap
        self.n = n
        size = length + 1
        num_actions = spec.num_actions or 0
        self.obs = np.zeros((size, n, *spec.obs_shape), spec.obs_dtype)
        self.action = np.zeros((size, n, *spec.action_shape), spec.action_dtype)
        self.reward = np.zeros((size, n), np.float32)
        self.done = np.zeros((size, n), np.bool_)
        self.h = np.zeros((size, n, state_size), np.float32)
        self.c = np.zeros((size, n, state_size), np.float32)
        self.q = np.zeros((size, n, num_actions), np.float32)
        self.t = 0  # index of the step being recorded (= steps completed so far)

    def record(self, obs: np.ndarray, h: np.ndarray, c: np.ndarray, action: np.ndarray,
               q: np.ndarray | None = None) -> None:
        slot = self.t % (self.length + 1)
        self.obs[slot] = obs
        self.h[slot] = h
        self.c[slot] = c
        self.action[slot] = action
        if q is not None:
            self.q[slot] = q

    def outcome(self, reward: np.ndarray, done: np.ndarray
                ) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        slot = self.t % (self.length + 1)
        self.reward[slot] = reward
        self.done[slot] = done
        start = self.t - self.length  # the sequence whose obs L is this step's obs
        self.t += 1
        if start < 0 or start % self.stride:
            return None
        idx = (start + np.arange(self.length + 1)) % (self.length + 1)
        steps = idx[:-1]

        def batch_major(x: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(x.swapaxes(0, 1))  # fancy indexing copied already

        first = start % (self.length + 1)
        sequence = {
            "obs": batch_major(self.obs[idx]),
            "action": batch_major(self.action[steps]),
            "reward": batch_major(self.reward[steps]),
            "done": batch_major(self.done[steps]),
            "state_h": self.h[first].copy(),
            "state_c": self.c[first].copy(),
        }
        return sequence, batch_major(self.q[idx])


def truncation_bootstrap(q_final: np.ndarray, discount: float, eps: float = 1e-3) -> np.ndarray:
    """``discount * max_a Q(final_obs, a)`` unrescaled, [k]: add it to the reward of a
    step whose episode was cut by a time limit (done stays true; see
    RecurrentEnvs.bootstrap_truncated)."""
    values = h_inv(torch.from_numpy(np.asarray(q_final, np.float32)).max(-1).values, eps)
    return discount * values.numpy()


class RecurrentEnvs:
    """The acting bookkeeping of one group of n lockstep envs under a recurrent
    Q-network: the recurrent state (h, c), the episode-start flags, ε-greedy with a
    per-env ε, and the sequences with their initial priorities.

    Per step::

        first, h, c = envs.inputs()
        q, (h2, c2) = model.step(obs, first, (h, c))    # possibly batched with others
        action = envs.record(obs, q, h2, c2)
        ... step the envs ...
        sequence = envs.outcome(reward, terminated | truncated)   # dict or None
    """

    def __init__(self, spec: EnvSpec, cfg: R2D2Config, n: int, state_size: int,
                 epsilon: float | np.ndarray, seed: int):
        if spec.num_actions is None:
            raise ValueError("recurrent Q acting needs a discrete action space")
        self.cfg = cfg
        self.n = n
        self.num_actions = spec.num_actions
        self.epsilon = epsilon  # float, or [n]: one ε per env (Ape-X style)
        self.rng = np.random.default_rng(seed)
        self.builder = SequenceBuilder(spec, cfg.sequence_length, cfg.overlap, n, state_size)
        self.h = np.zeros((n, state_size), np.float32)
        self.c = np.zeros((n, state_size), np.float32)
        self.first = np.ones(n, np.bool_)  # the first observation starts an episode

    def inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first [n] bool, h [n, H], c [n, H]) for the current observations; the state
        is already zeroed where ``first``."""
        return self.first, self.h, self.c

    def record(self, obs: np.ndarray, q: np.ndarray, new_h: np.ndarray,
               new_c: np.ndarray) -> np.ndarray:
        """ε-greedy actions [n] int64 on ``q`` [n, A]; remembers the step (obs, the state
        used, q, action) and keeps (new_h, new_c), the state after ``obs``."""
        q = np.asarray(q, np.float32)
        action = q.argmax(-1)
        explore = self.rng.random(self.n) < self.epsilon
        if explore.any():
            random_actions = self.rng.integers(self.num_actions, size=self.n)
            action = np.where(explore, random_actions, action)
        action = action.astype(np.int64)
        self.builder.record(obs, self.h, self.c, action, q)
        self.h = np.array(new_h, np.float32)  # own copies: outcome() zeroes them in place
        self.c = np.array(new_c, np.float32)
        return action

    def outcome(self, reward: np.ndarray, done: np.ndarray) -> dict[str, np.ndarray] | None:
        """Record the result of the last actions; ``done`` [n] ends the episode (the
        next observation starts a new one, with a zero state). Returns the sequences
        completed by the observation recorded last (see the module docstring), with
        ``priority`` [n], or None."""
        done = np.asarray(done, np.bool_)
        finished = self.builder.outcome(reward, done)
        self.first = done.copy()
        self.h[done] = 0.0
        self.c[done] = 0.0
        if finished is None:
            return None
        sequence, q = finished
        sequence["priority"] = actor_priorities(q, sequence["action"], sequence["reward"],
                                                sequence["done"], self.cfg)
        return sequence

    def act(self, model: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
        """inputs -> model.step -> record, for a local actor with its own model."""
        device = next(model.parameters()).device
        first, h, c = (torch.from_numpy(x).to(device) for x in self.inputs())
        q, (h2, c2) = model.step(torch.from_numpy(np.asarray(obs)).to(device), first, (h, c))
        return self.record(obs, q.cpu().numpy(), h2.cpu().numpy(), c2.cpu().numpy())

    def bootstrap_truncated(self, model: torch.nn.Module, reward: np.ndarray,
                            truncated: np.ndarray, final_obs: np.ndarray) -> np.ndarray:
        """Rewards with ``discount * max_a Q(final_obs, a)`` added where an episode was
        cut by a time limit (call between ``record`` and ``outcome``, then pass
        ``done = terminated | truncated``): the cut stays an episode end for the state
        and the n-step sums, and the target still sees the value past the cut.
        ``final_obs`` holds the truncated envs' final observations, in order."""
        truncated = np.asarray(truncated, np.bool_)
        if not truncated.any():
            return reward
        device = next(model.parameters()).device
        k = int(truncated.sum())
        state = (torch.from_numpy(self.h[truncated]).to(device),
                 torch.from_numpy(self.c[truncated]).to(device))
        q, _ = model.step(torch.from_numpy(np.asarray(final_obs)).to(device),
                          torch.zeros(k, dtype=torch.bool, device=device), state)
        out = np.array(reward, np.float32)
        out[truncated] += truncation_bootstrap(q.cpu().numpy(), self.cfg.discount,
                                               self.cfg.rescale_eps)
        return out
