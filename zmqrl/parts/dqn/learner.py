"""n-step double DQN with a dueling network and prioritized replay (Ape-X style).

References: Mnih et al. 2015 (DQN), van Hasselt et al. 2016 (double DQN), Wang et al.
2016 (dueling networks), Horgan et al. 2018 (Ape-X: actors compute n-step transitions
and their initial priorities with their local network).

One definition of an n-step transition starting at step t is used throughout:

    m        = n, or fewer steps if the episode ends (done) at step t+m-1 < t+n-1
    reward   = sum_{k<m} discount^k * r_{t+k}
    discount = 0 if the episode ended within those m steps, else discount^m
    next_obs = obs_{t+m} (the observation to bootstrap from)
    target   = reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a))

``done`` always means terminal (no bootstrap). The stored ``discount`` already holds
gamma^m (or 0), so the learner never needs to know n.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from zmqrl.parts.algos.target_q import TargetQLearner
from zmqrl.parts.dqn.config import DQNConfig

# ------------------------------------------------------------------ n-step transitions


class NStepAccumulator:
    """Turns a stream of one-step transitions from ``num_envs`` envs into n-step ones.

    Pure numpy. Each env has at most ``n`` pending transitions (those still collecting
    rewards), kept in a ring of ``n`` slots shared by all envs: the slot written at push
    ``t`` is ``t % n``, and the transition in it completes (n rewards) at push ``t+n-1``
    at the latest, so it is always free again when push ``t+n`` needs it.

    Assumes SAME_STEP autoreset: when ``done[i]`` (or ``truncated[i]``) is true,
    ``next_obs[i]`` is the *final* observation of the episode and the next push for env
    ``i`` starts a new episode. An episode end flushes all of that env's pending
    transitions: with discount 0 for ``done`` (terminal), with discount^m and
    ``next_obs[i]`` as bootstrap for ``truncated`` (time limit; not terminal).
    """

    def __init__(self, num_envs: int, n: int, discount: float):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.num_envs = num_envs
        self.n = n
        self.discount = float(discount)
        self.steps = 0  # pushes so far
        self._valid = np.zeros((n, num_envs), dtype=bool)  # slot holds a pending transition
        self._start = np.zeros((n, num_envs), dtype=np.int64)  # push index it started at
        self._return = np.zeros((n, num_envs), dtype=np.float64)  # discounted reward sum
        self._length = np.zeros((n, num_envs), dtype=np.int64)  # rewards summed so far (m)
        self._obs: np.ndarray | None = None  # [n, num_envs, *obs_shape], on first push
        self._action: np.ndarray | None = None  # [n, num_envs, *action_shape]
        self._last_next_obs: np.ndarray | None = None  # for flush()

    @property
    def pending(self) -> np.ndarray:
        """Pending (not yet emitted) transitions per env, [num_envs]."""
        return self._valid.sum(axis=0)

    def push(self, obs, action, reward, done, next_obs,
             truncated=None) -> dict[str, np.ndarray] | None:
        """Add one step of every env; return the transitions completed by it, or None.

        Inputs are batch-major over envs: obs/next_obs [E, ...], action [E, ...],
        reward/done/truncated [E]. The result has keys obs, action, reward, discount,
        next_obs (batch-major, ordered by env, then oldest first).
        """
        obs, action, next_obs = np.asarray(obs), np.asarray(action), np.asarray(next_obs)
        reward = np.asarray(reward, dtype=np.float64)
        done = np.asarray(done, dtype=bool)
        ended = done if truncated is None else done | np.asarray(truncated, dtype=bool)
        if self._obs is None:
            self._obs = np.zeros((self.n, *obs.shape), dtype=obs.dtype)
            self._action = np.zeros((self.n, *action.shape), dtype=action.dtype)

        # 1. The new transition starts in this push's slot (free: see class docstring).
        slot = self.steps % self.n
        self._obs[slot] = obs
        self._action[slot] = action
        self._valid[slot] = True
        self._start[slot] = self.steps
        self._return[slot] = 0.0
        self._length[slot] = 0
        self.steps += 1

        # 2. Every pending transition collects this reward, discounted by its age.
        valid = self._valid
        self._return += np.where(valid, self.discount**self._length * reward, 0.0)
        self._length += valid

        # 3. Emit those with n rewards, and all of an env whose episode just ended.
        complete = valid & ((self._length == self.n) | ended[None, :])
        bootstrap = np.broadcast_to(~done[None, :], complete.shape)
        self._last_next_obs = next_obs.copy()
        return self._emit(complete, bootstrap, next_obs)

    def flush(self) -> dict[str, np.ndarray] | None:
        """Emit every pending transition, truncated where it is: m < n rewards, discount^m,
        bootstrapping from the last ``next_obs`` pushed (like ``n_step_returns`` at the
        end of a block). Use when the stream stops for good."""
        if self._last_next_obs is None:
            return None
        complete = self._valid.copy()
        return self._emit(complete, np.ones_like(complete), self._last_next_obs)

    def _emit(self, mask: np.ndarray, bootstrap: np.ndarray,
              next_obs: np.ndarray) -> dict[str, np.ndarray] | None:
        slots, envs = np.nonzero(mask)
        if len(envs) == 0:
            return None
        order = np.lexsort((self._start[slots, envs], envs))  # by env, then oldest first
        slots, envs = slots[order], envs[order]
        length = self._length[slots, envs]
        discount = np.where(bootstrap[slots, envs], self.discount**length, 0.0)
        out = {
            "obs": self._obs[slots, envs],
            "action": self._action[slots, envs],
            "reward": self._return[slots, envs].astype(np.float32),
            "discount": discount.astype(np.float32),
            "next_obs": next_obs[envs],
        }
        self._valid[slots, envs] = False
        return out


def n_step_returns(rewards, dones, discount: float, n: int):
    """n-step discounted rewards and bootstrap discounts for a whole block [T, B].

    ``returns[t] = sum_{k<m} discount^k * rewards[t+k]`` and ``discounts[t]`` is 0 if
    the episode ended (``dones[t+k]`` true for some k < m), else ``discount^m``; the
    bootstrap observation of step t is obs_{t+m}. m is n, cut short by an episode end
    (m includes the done step) and by the block end: with fewer than n steps left and
    no episode end, the transition is truncated at the block end (m = T - t steps used,
    discount^m, bootstrap from the observation after the block).

    Accepts numpy arrays (returns float64 numpy) or torch tensors (returns tensors of
    ``rewards``' dtype and device).
    """
    if isinstance(rewards, torch.Tensor):
        ret, disc = n_step_returns(rewards.detach().cpu().numpy(),
                                   torch.as_tensor(dones).cpu().numpy(), discount, n)
        to = dict(dtype=rewards.dtype, device=rewards.device)
        return torch.as_tensor(ret, **to), torch.as_tensor(disc, **to)
    rewards = np.asarray(rewards, dtype=np.float64)
    dones = np.asarray(dones, dtype=bool)
    T = rewards.shape[0]
    returns = np.zeros_like(rewards)
    discounts = np.ones_like(rewards)
    running = np.ones(rewards.shape, dtype=bool)  # no episode end in t .. t+k-1
    for k in range(min(n, T)):
        r_k = np.zeros_like(rewards)  # r_k[t] = rewards[t+k] (inside the block)
        d_k = np.zeros_like(dones)
        r_k[: T - k], d_k[: T - k] = rewards[k:], dones[k:]
        inside = running.copy()
        inside[T - k:] = False  # t+k is past the block end
        returns += np.where(inside, discount**k * r_k, 0.0)
        discounts = np.where(inside, discounts * discount, discounts)
        discounts = np.where(inside & d_k, 0.0, discounts)
        running &= inside & ~d_k
    return returns, discounts


# ------------------------------------------------------------------ losses


def double_dqn_targets(q_next_online: torch.Tensor, q_next_target: torch.Tensor,
                       rewards: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
    """``r + discount * Q_target(s', argmax_a Q_online(s', a))``, shape [B]."""
    best = q_next_online.argmax(dim=-1, keepdim=True)
    return rewards + discounts * q_next_target.gather(-1, best).squeeze(-1)


def _targets(model: torch.nn.Module, target_model: torch.nn.Module, reward: torch.Tensor,
             discount: torch.Tensor, next_obs: torch.Tensor, double: bool) -> torch.Tensor:
    with torch.no_grad():
        q_next_target = target_model(next_obs)
        if not double:
            return reward + discount * q_next_target.max(dim=-1).values
        q_next_online = q_next_target if target_model is model else model(next_obs)
        return double_dqn_targets(q_next_online, q_next_target, reward, discount)


@torch.no_grad()
def td_priorities(model: torch.nn.Module, obs, action, reward, discount, next_obs,
                  target_model: torch.nn.Module | None = None) -> np.ndarray:
    """Initial replay priorities |td| [B] of n-step transitions, with the actor's local
    network (double DQN targets; ``target_model`` defaults to ``model`` itself)."""
    device = next(model.parameters()).device

    def as_tensor(x, dtype=torch.float32):
        t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x,
                            device=device)
        return t if dtype is None else t.to(dtype)

    # Observations keep the env's dtype (uint8 frames): the model converts them.
    obs, next_obs = as_tensor(obs, None), as_tensor(next_obs, None)
    action = as_tensor(action, torch.int64)
    q = model(obs).gather(-1, action.unsqueeze(-1)).squeeze(-1)
    targets = _targets(model, target_model if target_model is not None else model,
                       as_tensor(reward), as_tensor(discount), next_obs, double=True)
    return (targets - q).abs().float().cpu().numpy()


# ------------------------------------------------------------------ learner




class DQNLearner(TargetQLearner):
    """One prioritized n-step (double) DQN update per call; keeps a target network."""

    def __init__(self, cfg: DQNConfig, model: torch.nn.Module):
        self.cfg = cfg
        super().__init__(cfg, model)
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=cfg.adam_eps)

    def loss(self, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """``batch``: obs/next_obs [B, ...], action [B], reward [B] (n-step sum),
        discount [B] (gamma^m or 0), weights [B] (importance weights; optional).
        Returns (loss, loss terms, new priorities |td| [B] as float32 CPU)."""
        cfg = self.cfg
        obs, next_obs = batch["obs"], batch["next_obs"]  # the env's dtype: models convert
        reward, discount = batch["reward"].float(), batch["discount"].float()
        action = batch["action"].long()
        weights = batch.get("weight")
        weights = torch.ones_like(reward) if weights is None else weights.float()

        q = self.model(obs).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        targets = _targets(self.model, self.target_model, reward, discount, next_obs,
                           cfg.double)
        td = targets - q
        huber = F.huber_loss(q, targets, reduction="none", delta=cfg.huber_delta)
        loss = (weights * huber).mean()
        priorities = td.detach().abs().float().cpu()
        terms = {
            "loss": loss.item(),
            "q_mean": q.detach().mean().item(),
            "td_abs_mean": priorities.mean().item(),
        }
        return loss, terms, priorities
