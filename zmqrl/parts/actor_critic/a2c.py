"""Synchronous advantage actor-critic (A2C), and the pieces A3C needs.

Reference: Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning".
On-policy: the behaviour ``logp`` in a batch is ignored (no off-policy correction).

All tensors are time-major: shape [T, B] (``bootstrap_value`` is [B]).
``discounts`` is ``gamma * (1 - done)`` per step, so an episode end cuts the bootstrap.

A3C: workers call ``A2CLearner.gradients(batch)`` on their local copy of the model and
ship the gradients; the parameter server calls ``apply_gradients(grads)``, which clips
and steps its optimizer. ``update(batch)`` is exactly ``apply_gradients(gradients(batch))``.
"""

from __future__ import annotations

from typing import Any

import torch

from zmqrl.parts.actor_critic.config import A2CConfig
from zmqrl.parts.actor_critic.learner import actor_critic_loss, evaluate_unrolls
from zmqrl.parts.algos import gradients


def nstep_returns(rewards: torch.Tensor, discounts: torch.Tensor,
                  bootstrap_value: torch.Tensor) -> torch.Tensor:
    """Bootstrapped returns G_t = r_t + discount_t * G_{t+1}, with G_T = bootstrap_value."""
    acc = bootstrap_value
    returns = torch.empty_like(rewards)
    for t in reversed(range(rewards.shape[0])):
        acc = rewards[t] + discounts[t] * acc
        returns[t] = acc
    return returns


def a2c_loss(
    target_logp: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    baseline_cost: float = 0.5,
    entropy_cost: float = 0.01,
    normalize_advantages: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy gradient with advantage ``returns - values`` (detached for the policy term),
    value regression toward ``returns`` (treated as constants), and an entropy bonus."""
    returns = returns.detach()
    advantages = returns - values
    pg_adv = advantages.detach()
    if normalize_advantages:
        pg_adv = (pg_adv - pg_adv.mean()) / (pg_adv.std() + 1e-8)

    loss_policy = -(pg_adv * target_logp).mean()
    return actor_critic_loss(loss_policy, advantages, entropy, baseline_cost, entropy_cost)




class A2CLearner:
    """One A2C update per call over a time-major batch of unrolls (ActorCritic model)."""

    def __init__(self, cfg: A2CConfig, model: torch.nn.Module):
        self.cfg = cfg
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=cfg.adam_eps)
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the model: optimizer and update counter."""
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])

    def _loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``batch``: obs [T+1, B, ...], action/reward/done [T, B] (logp is unused)."""
        cfg = self.cfg
        T = batch["action"].shape[0]
        target_logp, entropy, values = evaluate_unrolls(self.model, batch)
        discounts = cfg.discount * (~batch["done"].bool()).float()
        returns = nstep_returns(batch["reward"].float(), discounts, values[T].detach())
        loss, terms = a2c_loss(target_logp, entropy, values[:T], returns, cfg.baseline_cost,
                               cfg.entropy_cost, cfg.normalize_advantages)
        terms["entropy"] = float(entropy.detach().mean())
        return loss, terms

    def gradients(self, batch: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor],
                                                                 dict[str, float]]:
        """Loss gradients (unclipped, one per parameter) without stepping the optimizer."""
        loss, terms = self._loss(batch)
        return gradients.compute(loss, self.params), terms

    def apply_gradients(self, grads: list[torch.Tensor]) -> dict[str, float]:
        """Set ``.grad`` from ``grads`` (tensors or arrays), clip and take one optimizer
        step. Returns {"grad_norm": norm before clipping}."""
        grad_norm = gradients.apply(self.params, self.optimizer, grads, self.cfg.max_grad_norm)
        self.updates += 1
        return {"grad_norm": grad_norm}  # not finite: the step was skipped

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """``batch``: obs [T+1, B, ...], action/logp/reward/done [T, B]."""
        grads, terms = self.gradients(batch)
        terms.update(self.apply_gradients(grads))
        terms["lr"] = self.optimizer.param_groups[0]["lr"]
        return terms
