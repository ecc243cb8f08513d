"""The part every actor-critic loss shares: baseline regression and entropy bonus added
to a policy term, with the terms reported under the same names (IMPALA, A2C, IMPACT)."""

from __future__ import annotations

import torch


def actor_critic_loss(loss_policy: torch.Tensor, value_error: torch.Tensor,
                      entropy: torch.Tensor, baseline_cost: float, entropy_cost: float
                      ) -> tuple[torch.Tensor, dict[str, float]]:
    """``loss_policy + baseline_cost * 0.5 * mean(value_error^2) - entropy_cost * mean(H)``."""
    loss_baseline = baseline_cost * 0.5 * (value_error**2).mean()
    loss_entropy = -entropy_cost * entropy.mean()
    loss = loss_policy + loss_baseline + loss_entropy
    terms = {
        "loss_policy": loss_policy.item(),
        "loss_baseline": loss_baseline.item(),
        "loss_entropy": loss_entropy.item(),
        "loss_total": loss.item(),
    }
    return loss, terms
