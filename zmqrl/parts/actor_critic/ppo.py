"""Proximal Policy Optimization with GAE, and synchronous data-parallel gradient averaging.

Reference: Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; GAE:
Schulman et al. 2016. The update follows CleanRL's ``ppo_continuous_action.py``: values
and GAE once per batch with the pre-update parameters, then ``epochs`` passes of
``minibatches`` shuffled minibatches over the flattened T x B samples, each step with
the clipped surrogate, the clipped value loss, per-minibatch advantage normalisation,
global gradient-norm clipping and Adam. The "old" log-probs are the behaviour log-probs
shipped with the unrolls (on-policy they equal the pre-update policy's).

Recurrent models (``model.recurrent``, e.g. ``lstm_ac``): a minibatch is a set of whole
env columns of the unroll, each evaluated in time order from the LSTM state it started
with, not a set of shuffled steps (``zmqrl.parts.actor_critic.recurrent_ppo``); ``minibatches`` then
splits the rank's env columns.

Data parallelism: several learner ranks each hold a different part of the batch and the
same parameters; an ``allreduce`` hook averages the gradients of every step, so every
rank takes the identical optimizer step and the parameters stay identical. Observation
normalisation statistics are merged across ranks the same way.

All tensors are time-major: shape [T, B] (``bootstrap_value`` is [B]); ``discounts`` is
``gamma * (1 - done)`` per step, so an episode end cuts the bootstrap and the trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from zmqrl.parts.actor_critic.config import PPOConfig
from zmqrl.parts.actor_critic.learner import evaluate_unrolls
from zmqrl.parts.actor_critic.recurrent_ppo import evaluate_sequences, sequence_samples
from zmqrl.parts.algos import gradients
from zmqrl.parts.algos.optim import make_adam

AllReduce = Callable[[list[torch.Tensor]], None]


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, bootstrap_value: torch.Tensor,
        discounts: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and returns (``advantages + values``), [T, B]:
    ``A_t = delta_t + discount_t * lam * A_{t+1}``,
    ``delta_t = r_t + discount_t * V_{t+1} - V_t``, with ``V_T = bootstrap_value``."""
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = rewards + discounts * next_values - values
    advantages = torch.empty_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * lam * acc
        advantages[t] = acc
    return advantages, advantages + values




def ppo_loss(cfg: PPOConfig, new_logp: torch.Tensor, old_logp: torch.Tensor,
             advantages: torch.Tensor, new_values: torch.Tensor, old_values: torch.Tensor,
             returns: torch.Tensor, entropy: torch.Tensor
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss over flat samples [N] (old_*, advantages and returns are constants):
    ``loss_policy + value_cost * loss_value - entropy_cost * entropy``, with
    ``loss_policy = mean(max(-A r, -A clip(r, 1-eps, 1+eps)))``, ``r = exp(new - old)``
    and ``loss_value = 0.5 * mean(max((V - R)^2, (V_clipped - R)^2))`` (unclipped
    without ``clip_value``). The statistics come back as detached 0-d tensors (no
    device sync per step): loss_policy, loss_value, entropy, approx_kl, clip_frac."""
    advantages = advantages.detach()
    if cfg.normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = new_logp - old_logp.detach()
    ratio = log_ratio.exp()
    pg_loss = torch.max(-advantages * ratio,
                        -advantages * torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip)).mean()

    returns, old_values = returns.detach(), old_values.detach()
    v_loss_unclipped = (new_values - returns) ** 2
    if cfg.clip_value:
        v_clipped = old_values + torch.clamp(new_values - old_values, -cfg.clip, cfg.clip)
        v_loss = 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * v_loss_unclipped.mean()

    entropy_mean = entropy.mean()
    loss = pg_loss + cfg.value_cost * v_loss - cfg.entropy_cost * entropy_mean
    with torch.no_grad():
        stats = {
            "loss_policy": pg_loss.detach(),
            "loss_value": v_loss.detach(),
            "entropy": entropy_mean.detach(),
            # The low-variance KL(old || new) estimator (http://joschu.net/blog/kl-approx.html).
            "approx_kl": ((ratio - 1) - log_ratio).mean(),
            "clip_frac": ((ratio - 1).abs() > cfg.clip).float().mean(),
            "loss_total": loss.detach(),
        }
    return loss, stats


class PPOLearner:
    """One PPO update (epochs x minibatches optimizer steps) per call over a time-major
    batch of unrolls; an ActorCritic-style model (``evaluate``, ``state_values``).

    ``allreduce``: optional callable taking a list of tensors and averaging them in
    place across the data-parallel learner ranks (the learner node builds it from
    torch.distributed). With it, every step's gradients are averaged (one flat buffer,
    one call per step) before clipping and the optimizer step, and the observation
    statistics are merged across ranks, so all ranks keep identical parameters. Every
    rank must then take the same number of steps, in lockstep: each rank's local batch
    must have the same shape [T, B_local] (and T * B_local >= minibatches; with a
    recurrent model, B_local >= minibatches: minibatches are env columns).
    """

    def __init__(self, cfg: PPOConfig, model: torch.nn.Module,
                 allreduce: AllReduce | None = None):
        if cfg.anneal_lr and cfg.anneal_updates <= 0:
            raise ValueError("algo.anneal_lr needs algo.anneal_updates > 0")
        self.cfg = cfg
        self.model = model
        self.allreduce = allreduce
        # A recurrent policy trains on whole sequences: minibatches split env columns.
        self.sequences = bool(getattr(model, "recurrent", False))
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_adam(self.params, cfg.lr, cfg.adam_eps, cfg.light_adam)
        self.updates = 0  # drives lr annealing; restored with the checkpoint

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the model (observation statistics are model
        buffers): the optimizer, and the update count that drives lr annealing."""
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])

    def _sum_reduce(self, tensor: torch.Tensor) -> None:
        # The hook averages; RunningNorm.update only depends on ratios of the reduced
        # moments, so an average serves as well as a sum (see there).
        assert self.allreduce is not None
        self.allreduce([tensor])

    def prepare(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Flat samples [T * B, ...] of ``batch`` with the pre-update parameters' values
        and GAE: obs, action, logp (behaviour), value, advantage, return. A recurrent
        model's are sequences instead, [B, T, ...] with their initial state
        (``recurrent_ppo.sequence_samples``): either way a minibatch indexes axis 0."""
        cfg = self.cfg
        T, B = batch["action"].shape[:2]
        with torch.no_grad():
            _, _, values = evaluate_unrolls(self.model, batch)
            rewards = batch["reward"].float()
            if cfg.reward_scale != 1.0:
                rewards = rewards * cfg.reward_scale
            discounts = cfg.discount * (~batch["done"].bool()).float()
            advantages, returns = gae(rewards, values[:T], values[T], discounts,
                                      cfg.gae_lambda)
        if self.sequences:
            return sequence_samples(batch, values, advantages, returns)
        obs = batch["obs"][:T]  # the env's dtype: the model converts
        action = batch["action"]
        return {
            "obs": obs.reshape(T * B, *obs.shape[2:]),
            "action": action.reshape(T * B, *action.shape[2:]),
            "logp": batch["logp"].float().reshape(T * B),
            "value": values[:T].reshape(T * B),
            "advantage": advantages.reshape(T * B),
            "return": returns.reshape(T * B),
        }

    def loss(self, samples: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The PPO loss of the current parameters on (a minibatch of) ``prepare``'s
        samples."""
        if self.sequences:
            old, new_logp, entropy, new_values = evaluate_sequences(self.model, samples)
        else:
            old = samples
            new_logp, entropy, new_values = self.model.evaluate(samples["obs"],
                                                                samples["action"])
        return ppo_loss(self.cfg, new_logp, old["logp"], old["advantage"],
                        new_values, old["value"], old["return"], entropy)

    def _average_gradients(self) -> None:
        """Average every parameter's gradient across ranks in one allreduce call."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.allreduce([flat])
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p)
            offset += n

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """``batch``: obs [T+1, B, ...], action [T, B] or [T, B, *action_shape],
        logp/reward/done [T, B]. Returns the means over all steps of loss_policy,
        loss_value (0.5 * squared error, before value_cost), entropy, approx_kl,
        clip_frac, loss_total and grad_norm (before clipping), and the lr used."""
        cfg = self.cfg
        T, B = batch["action"].shape[:2]
        n = B if self.sequences else T * B  # what a minibatch is made of
        if n < cfg.minibatches:
            what = "env columns (recurrent model: whole sequences)" if self.sequences \
                else "samples"
            raise ValueError(f"ppo: {n} {what} cannot make {cfg.minibatches} minibatches")
        lr = cfg.lr
        if cfg.anneal_lr:  # CleanRL: the first update uses the full lr
            lr = cfg.lr * max(0.0, 1.0 - self.updates / cfg.anneal_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        samples = self.prepare(batch)
        device = samples["logp"].device
        totals: dict[str, torch.Tensor] = {}
        steps = 0
        for _ in range(cfg.epochs):
            # Each rank shuffles its own samples (or columns); only the step count must
            # agree.
            for idx in torch.randperm(n, device=device).tensor_split(cfg.minibatches):
                loss, stats = self.loss({k: v[idx] for k, v in samples.items()})
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if self.allreduce is not None:
                    self._average_gradients()
                # (after averaging every rank sees the same norm: all skip, or none; a
                # skipped step makes the update's mean grad_norm non-finite)
                stats["grad_norm"] = torch.tensor(gradients.clip_and_step(
                    self.params, self.optimizer, cfg.max_grad_norm))
                for k, v in stats.items():
                    totals[k] = totals[k] + v.detach() if k in totals else v.detach()
                steps += 1
        # Observation statistics move after the update, not before: the actors acted
        # with the statistics we just trained under, so the ratios above start at 1;
        # the new ones go out with the next parameters.
        obs_norm = getattr(self.model, "obs_norm", None)
        if obs_norm is not None:  # the unroll steps only: the bootstrap row comes again
            obs_norm.update(batch["obs"][:T],
                            reduce=self._sum_reduce if self.allreduce is not None else None)
        self.updates += 1
        terms = {k: float(v) / steps for k, v in totals.items()}
        terms["lr"] = lr
        return terms
