"""V-trace off-policy correction and the IMPALA actor-critic loss.

Reference: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with
Importance Weighted Actor-Learner Architectures", section 4.

All tensors are time-major: shape [T, B] (``bootstrap_value`` is [B]).
``discounts`` is ``gamma * (1 - done)`` per step, so an episode end cuts
both the bootstrap and the product of trace coefficients.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from zmqrl.parts.actor_critic.config import VTraceConfig
from zmqrl.parts.actor_critic.learner import actor_critic_loss, evaluate_unrolls
from zmqrl.parts.algos import gradients
from zmqrl.parts.algos.optim import make_adam


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # [T, B] V-trace value targets
    pg_advantages: torch.Tensor  # [T, B] clipped-rho policy-gradient advantages


def _clip(x: torch.Tensor, threshold: float | None) -> torch.Tensor:
    return x if threshold is None else torch.clamp(x, max=threshold)


@torch.no_grad()
def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor,
    clip_rho: float | None = 1.0,
    clip_c: float | None = 1.0,
    clip_pg_rho: float | None = 1.0,
) -> VTraceReturns:
    """V-trace targets via the backward recursion
    ``vs_s - V(x_s) = delta_s + discount_s * c_s * (vs_{s+1} - V(x_{s+1}))``
    with ``delta_s = rho_s * (r_s + discount_s * V(x_{s+1}) - V(x_s))``.
    A threshold of None disables that clipping.
    """
    ratios = torch.exp(target_logp - behaviour_logp)
    rhos = _clip(ratios, clip_rho)
    cs = _clip(ratios, clip_c)

    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = rhos * (rewards + discounts * next_values - values)

    acc = torch.zeros_like(bootstrap_value)  # vs_{s+1} - V(x_{s+1}); zero past T
    vs_minus_v = torch.empty_like(values)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v

    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_rhos = _clip(ratios, clip_pg_rho)
    pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def impala_loss(
    target_logp: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    vtrace_returns: VTraceReturns,
    baseline_cost: float = 0.5,
    entropy_cost: float = 0.01,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IMPALA actor-critic loss: policy gradient + value regression - entropy bonus."""
    pg_adv = vtrace_returns.pg_advantages.detach()
    vs = vtrace_returns.vs.detach()

    loss_policy = -(pg_adv * target_logp).mean()
    return actor_critic_loss(loss_policy, vs - values, entropy, baseline_cost, entropy_cost)




class VTraceLearner:
    """One V-trace actor-critic update per call over a time-major batch of unrolls."""

    def __init__(self, cfg: VTraceConfig, model: torch.nn.Module):
        self.cfg = cfg
        self.model = model
        self.optimizer = make_adam(model.parameters(), cfg.lr, cfg.adam_eps, cfg.light_adam)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the model: the optimizer's moments."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """``batch``: obs [T+1, B, ...], action/logp/reward/done [T, B]."""
        cfg = self.cfg
        T, columns = batch["action"].shape[:2]
        terms: dict[str, float] = {}
        for _ in range(cfg.epochs):
            order = torch.randperm(columns, device=batch["action"].device)
            for idx in order.chunk(cfg.minibatches):
                terms = self._step({k: v[:, idx] for k, v in batch.items()})
        # After the update (as PPO): the statistics the batch was acted with stay put
        # while we train on it; the new ones travel with the next parameters.
        obs_norm = getattr(self.model, "obs_norm", None)
        if obs_norm is not None:  # the unroll steps only: the bootstrap row comes again
            obs_norm.update(batch["obs"][:T])
        return terms

    def _clipped_loss(self, behaviour_logp, target_logp, entropy, values, returns):
        cfg = self.cfg
        adv = returns.pg_advantages.detach()
        ratio = torch.exp(target_logp - behaviour_logp)
        surrogate = torch.min(ratio * adv,
                              torch.clamp(ratio, 1 - cfg.ppo_clip, 1 + cfg.ppo_clip) * adv)
        loss, terms = actor_critic_loss(-surrogate.mean(), returns.vs.detach() - values,
                                        entropy, cfg.baseline_cost, cfg.entropy_cost)
        terms["clip_frac"] = ((ratio - 1).abs() > cfg.ppo_clip).float().mean().item()
        return loss, terms

    def _step(self, mb: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg = self.cfg
        T = mb["action"].shape[0]
        target_logp, entropy, values = evaluate_unrolls(self.model, mb)
        discounts = cfg.discount * (~mb["done"].bool()).float()
        rewards = mb["reward"].float()
        if cfg.reward_scale != 1.0:
            rewards = rewards * cfg.reward_scale
        returns = vtrace(mb["logp"], target_logp.detach(), rewards, values[:T].detach(),
                         values[T].detach(), discounts, cfg.clip_rho, cfg.clip_c, cfg.clip_pg_rho)
        if cfg.ppo_clip is not None:  # the surrogate's ratio replaces the rho weight
            next_vs = torch.cat([returns.vs[1:], values[T].detach().unsqueeze(0)], dim=0)
            returns = returns._replace(
                pg_advantages=rewards + discounts * next_vs - values[:T].detach())
        if cfg.normalize_advantages:
            adv = returns.pg_advantages
            returns = returns._replace(pg_advantages=(adv - adv.mean()) / (adv.std() + 1e-8))
        if cfg.ppo_clip is not None:
            loss, terms = self._clipped_loss(mb["logp"], target_logp, entropy, values[:T],
                                             returns)
        else:
            loss, terms = impala_loss(target_logp, entropy, values[:T], returns,
                                      cfg.baseline_cost, cfg.entropy_cost)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = gradients.clip_and_step(list(self.model.parameters()), self.optimizer,
                                            cfg.max_grad_norm)
        terms["grad_norm"] = grad_norm  # not finite: the step was skipped
        terms["entropy"] = float(entropy.detach().mean())
        return terms
