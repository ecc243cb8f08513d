"""What every actor-critic learner shares: evaluating the current policy and values on
a time-major unroll batch, and the baseline + entropy terms added to a policy term,
reported under the same names (IMPALA, A2C, IMPACT)."""

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


def evaluate_unrolls(model: torch.nn.Module, batch: dict[str, torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The current policy on an unroll batch (obs [T+1, B, ...], action [T, B]):
    log-probs of the taken actions [T, B], policy entropy [T, B], values [T+1, B]
    (the last row is the bootstrap)."""
    T, B = batch["action"].shape[:2]
    obs = batch["obs"].float()
    logits, values = model(obs.reshape((T + 1) * B, *obs.shape[2:]))
    logp_all = torch.log_softmax(logits.reshape(T + 1, B, -1)[:T], dim=-1)
    target_logp = logp_all.gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return target_logp, entropy, values.reshape(T + 1, B)
