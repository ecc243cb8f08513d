"""What the TD3 and SAC learners share: twin critics regressed on a target with
importance weights, new priorities from their TD errors, Polyak-averaged targets, one
optimizer whose parameter groups step separately, and the checkpoint state
(``TargetCheckpoint``, as the Q-learners').

One Adam with a group per network (critics, policy, SAC's temperature): PBT sets a
learner's ``optimizer``'s learning rates as one, and each step below gives gradients
to one group only, so ``optimizer.step()`` moves that group alone (Adam skips
parameters without a gradient).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from zmqrl.parts.algos import gradients
from zmqrl.parts.algos.target_q import TargetCheckpoint


def polyak(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """target <- (1 - tau) target + tau online, in place."""
    with torch.no_grad():
        torch._foreach_lerp_(target, online, tau)


def as_batch(batch: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """(obs, action, reward, discount, next_obs, weights) of a sampled batch, the
    weights 1 where the replay sent none."""
    reward = batch["reward"].float()
    weights = batch.get("weight")
    weights = torch.ones_like(reward) if weights is None else weights.float()
    return (batch["obs"], batch["action"].float(), reward, batch["discount"].float(),
            batch["next_obs"], weights)


class TwinQLearner(TargetCheckpoint):
    """A subclass defines :meth:`targets` (the critics' regression target, no grad) and
    :meth:`policy_step` (its policy's update, every ``policy_delay`` critic updates)."""

    def __init__(self, cfg: Any, model: torch.nn.Module):
        self.cfg = cfg
        self.model = model
        self.target_model = copy.deepcopy(model).eval()
        self.target_model.requires_grad_(False)
        self.critic_params = model.critic_parameters()
        self.policy_params = model.policy_parameters()
        self.optimizer = torch.optim.Adam(
            [{"params": self.critic_params, "lr": cfg.critic_lr},
             {"params": self.policy_params, "lr": cfg.actor_lr}, *self.extra_groups()],
            eps=cfg.adam_eps)
        self.updates = 0  # critic updates

    def extra_groups(self) -> list[dict[str, Any]]:
        return []

    def group_rates(self) -> list[str]:
        """The config field that sets each optimizer group's lr, in group order."""
        return ["critic_lr", "actor_lr"]

    def apply_hyperparameters(self, changed: dict[str, Any]) -> None:
        """PBT changed ``changed`` (self.cfg holds them already): each group's rate."""
        for group, field in zip(self.optimizer.param_groups, self.group_rates(), strict=True):
            if field in changed:
                group["lr"] = float(changed[field])

    def targets(self, reward: torch.Tensor, discount: torch.Tensor,
                next_obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def policy_step(self, obs: torch.Tensor) -> dict[str, float]:
        raise NotImplementedError

    def step(self, loss: torch.Tensor, params: list[torch.Tensor]) -> float:
        """Gradients of ``loss`` for ``params`` only, clipped and applied; the norm
        before clipping (not finite: nothing was applied)."""
        for p, g in zip(params, gradients.compute(loss, params), strict=True):
            p.grad = g
        norm = gradients.clip_and_step(params, self.optimizer, self.cfg.max_grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def update(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """One critic update, and a policy update every ``policy_delay``. Returns the
        loss terms and the batch's new priorities [B] (float32, CPU)."""
        obs, action, reward, discount, next_obs, weights = as_batch(batch)
        with torch.no_grad():
            target = self.targets(reward, discount, next_obs)
        q1, q2 = self.model.q(obs, action)
        td1, td2 = target - q1, target - q2
        critic_loss = (weights * (td1.pow(2) + td2.pow(2))).mean()
        terms = {"critic_loss": critic_loss.item(), "q_mean": q1.detach().mean().item(),
                 "grad_norm": self.step(critic_loss, self.critic_params)}
        self.updates += 1
        if self.updates % self.cfg.policy_delay == 0:
            terms.update(self.policy_step(obs))
            polyak(self.target_params(), self.online_params(), self.cfg.tau)
        priorities = ((td1.detach().abs() + td2.detach().abs()) / 2 + self.cfg.priority_eps)
        terms["td_abs_mean"] = priorities.mean().item()
        return terms, priorities.float().cpu()

    def online_params(self) -> list[torch.Tensor]:
        """What the targets follow (TD3: policy and critics; SAC: the critics)."""
        return self.critic_params

    def target_params(self) -> list[torch.Tensor]:
        return self.target_model.critic_parameters()


@torch.no_grad()
def acting_priorities(model: torch.nn.Module, items: dict[str, np.ndarray],
                      target: Callable[..., torch.Tensor]) -> np.ndarray:
    """Initial priorities [B] of n-step transitions ``items`` with the acting network as
    its own target (Ape-X: actors have no target network): the twin critics' mean |δ|
    against ``target(reward, discount, next_obs)``."""
    device = next(model.parameters()).device

    def tensor(name: str) -> torch.Tensor:
        return torch.as_tensor(items[name], device=device)

    q1, q2 = model.q(tensor("obs"), tensor("action"))
    y = target(tensor("reward").float(), tensor("discount").float(), tensor("next_obs"))
    return ((y - q1).abs() + (y - q2).abs()).div(2).float().cpu().numpy()
