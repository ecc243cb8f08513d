"""Soft actor-critic (Haarnoja et al. 2018, with the learned temperature of the second
paper) over a prioritized replay.

Twin critics regress on ``r + γ^m (min(Q1', Q2')(s', a') − α log π(a'|s'))``, a' drawn
from the current policy (the targets: Polyak-averaged critics); the policy minimises
``α log π(a|s) − min(Q1, Q2)(s, a)`` by reparameterization; ``log α`` descends
``−log α · (log π + target_entropy)``. With n-step transitions the entropy bonus of
the steps in between is not added (Ape-X's n-step returns are of rewards alone).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zmqrl.parts.continuous.config import SACConfig
from zmqrl.parts.continuous.twin_q import TwinQLearner, acting_priorities


def sac_target(policy: torch.nn.Module, critics: torch.nn.Module, reward: torch.Tensor,
               discount: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """``reward + discount * (min(Q1, Q2) − α log π)`` at a' ~ π(next_obs) [B]: the
    action and α of ``policy``, the Q-values of ``critics``."""
    action, logp = policy.sample(next_obs)
    q1, q2 = critics.q(next_obs, action)
    return reward + discount * (torch.minimum(q1, q2) - policy.log_alpha.exp() * logp)


def initial_priorities(model: torch.nn.Module, items: dict[str, np.ndarray]) -> np.ndarray:
    """An actor's priorities for its transitions, its network as target."""
    return acting_priorities(model, items, lambda r, d, s: sac_target(model, model, r, d, s))


class SACLearner(TwinQLearner):
    cfg: SACConfig

    def __init__(self, cfg: SACConfig, model: torch.nn.Module):
        self.target_entropy = float(-np.prod(model.action_shape)
                                    if cfg.target_entropy is None else cfg.target_entropy)
        super().__init__(cfg, model)

    def extra_groups(self) -> list[dict[str, Any]]:
        return [{"params": [self.model.log_alpha], "lr": self.cfg.alpha_lr}]

    def group_rates(self) -> list[str]:
        return [*super().group_rates(), "alpha_lr"]

    def targets(self, reward: torch.Tensor, discount: torch.Tensor,
                next_obs: torch.Tensor) -> torch.Tensor:
        return sac_target(self.model, self.target_model, reward, discount, next_obs)

    def policy_step(self, obs: torch.Tensor) -> dict[str, float]:
        action, logp = self.model.sample(obs)
        q1, q2 = self.model.q(obs, action)
        alpha = self.model.log_alpha.exp().detach()
        loss = (alpha * logp - torch.minimum(q1, q2)).mean()
        terms = {"policy_loss": loss.item(), "entropy": -logp.detach().mean().item(),
                 "alpha": alpha.item(),
                 "policy_grad_norm": self.step(loss, self.policy_params)}
        if self.cfg.learn_alpha:
            alpha_loss = -(self.model.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.step(alpha_loss, [self.model.log_alpha])
        return terms
