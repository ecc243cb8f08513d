"""MuZero's learner (Schrittwieser et al. 2020, Appendix G): unroll the learned model
``unroll_steps`` (K) steps along the actions actually taken and fit, at every step, the
policy to the search's visit distribution, the value to the n-step value target and
(from the second step on) the reward to the reward observed.

A batch (``search_targets`` items from a replay, batch-major tensors):

* ``obs [B, *obs]``: the observation at position t;
* ``action [B, K]`` int64: the actions taken at t..t+K-1 (anything past the episode's end);
* ``reward [B, K]``: the reward of action t+k;
* ``value [B, K+1]``: the n-step value targets z_{t+k} (0 past the end: absorbing);
* ``policy [B, K+1, A]``: the search's visit distributions (uniform past the end);
* ``mask [B, K+1]`` bool: t+k lies inside the episode (``mask[:, 0]`` is true);
* ``weight [B]`` (optional): the replay's importance weights;
* ``obs_unroll [B, K, *obs]`` (with ``consistency_cost``; any run that sends it): the
  observations at t+1..t+K (zeros past the episode's end).

The loss of an item is, with CE the cross-entropy to the two-hot categorical of h(target)
(:mod:`zmqrl.parts.muzero.support`),

    sum_{k=0..K} c_k [ mask_k CE(pi_k, p_k) + value_cost CE(z_k, v_k)
                       + (k >= 1) mask_{k-1} CE(u_k, r_k) ],   c_0 = 1, c_k = 1/K,

the latent's gradient halved at the start of each dynamics step after the first
(``scale_gradient``, after the previous step's predictions, as the paper's pseudocode
places it). The value
is not masked: past the end the state is absorbing, with value target 0. The batch's loss
is the importance-weighted mean over items plus ``weight_decay`` times the sum of squared
weights (biases excluded: an explicit L2 penalty, as the paper's, not Adam's decoupled
decay), minimised by Adam with a global gradient-norm clip. New priorities are the
first step's |v - z| plus ``priority_eps``.

With ``consistency_cost`` (EfficientZero's self-supervised consistency, Ye et al. 2021;
not the paper's MuZero) each unrolled step also adds ``consistency_cost`` times minus the
cosine similarity of the dynamics' latent and the representation of ``obs_unroll`` at
that step (gradient stopped; masked past the episode's end), scaled by 1/K like the
step's other terms. EfficientZero compares them through projection and prediction
heads (SimSiam); here the min-max scaled latents are compared directly, which needs no
new parameters in the model.

With ``target_update_every`` N > 0 (LightZero's and EfficientZero's target network, not
the paper's MuZero) the batch's ``value`` is replaced before the loss: each target is
recomputed as ``partial_return + bootstrap_discount * v'(obs_bootstrap)`` with v' the
value of a copy of the network refreshed every N updates (:func:`bootstrapped_values`).
The stored targets bootstrap from the actors' search values, as old as the item; these
are at most N updates old, and the copy keeps the learner from chasing its own latest
step.

The paper scales each unrolled step's loss with ``scale_gradient`` (the gradient only);
here the step's loss itself is multiplied by 1/K: the same gradient, and the reported
``loss`` is then what is minimised.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from zmqrl.parts.algos import gradients
from zmqrl.parts.algos.optim import linear_lr
from zmqrl.parts.devices import autocast
from zmqrl.parts.muzero.config import MuZeroConfig
from zmqrl.parts.muzero.support import scalar_to_support, support_to_scalar


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` forward; ``scale`` times the gradient backward."""
    return x * scale + x.detach() * (1 - scale)


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -(target * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


def muzero_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], value_cost: float,
                precision: str = "float32", consistency_cost: float = 0.0
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """The unrolled loss of each item (no importance weights, no L2); with
    ``consistency_cost``, plus that times each unrolled step's negative cosine similarity
    of the dynamics' latent and the represented ``obs_unroll`` (gradient stopped).

    Returns ``(loss [B], terms, value [B])``: ``terms`` holds the per-step means of the
    cross-entropies (``value_loss`` over all K+1 steps; ``policy_loss`` and
    ``reward_loss`` over the steps their masks keep), detached; ``value`` is the first
    step's predicted value as a scalar (detached), for priorities. The model's forward
    passes run in ``precision`` (autocast), the loss in float32."""
    action, mask = batch["action"], batch["mask"].bool()
    steps = action.shape[1]
    size = model.support_size
    with torch.no_grad():
        value_target = scalar_to_support(batch["value"].float(), size)  # [B, K+1, bins]
        reward_target = scalar_to_support(batch["reward"].float(), size)  # [B, K, bins]
    policy_target = batch["policy"].float()
    policy_mask, reward_mask = mask.float(), mask[:, :steps].float()
    obs = batch["obs"]
    consistency = consistency_cost > 0
    if consistency:  # what each unrolled latent should be: the observation it reached
        with torch.no_grad(), autocast(obs.device, precision):
            seen = batch["obs_unroll"]
            reached = model.represent(seen.flatten(0, 1)).float().unflatten(0, seen.shape[:2])
        similarity = []
    with autocast(obs.device, precision):
        latent = model.represent(obs)
        policy_logits, value_logits = model.predict(latent)
        first_value = value_logits
        value_ce = [_cross_entropy(value_logits, value_target[:, 0])]
        policy_ce = [_cross_entropy(policy_logits, policy_target[:, 0])]
        reward_ce = []
        for k in range(1, steps + 1):
            latent, reward_logits = model.dynamics(latent, action[:, k - 1])
            if consistency:
                similarity.append(F.cosine_similarity(latent.float(), reached[:, k - 1], -1))
            policy_logits, value_logits = model.predict(latent)
            value_ce.append(_cross_entropy(value_logits, value_target[:, k]))
            policy_ce.append(_cross_entropy(policy_logits, policy_target[:, k]))
            reward_ce.append(_cross_entropy(reward_logits, reward_target[:, k - 1]))
            # MuZero halves the gradient at the start of each next dynamics step, after
            # this step's predictions (the paper's pseudocode, update_weights): step k's
            # losses reach the representation with 0.5^(k-1), so the dynamics' share of
            # the gradient stays bounded however far it unrolls
            latent = scale_gradient(latent, 0.5)
    values = torch.stack(value_ce, 1)  # [B, K+1]
    policies = torch.stack(policy_ce, 1) * policy_mask  # [B, K+1]
    rewards = torch.stack(reward_ce, 1) * reward_mask  # [B, K]
    # the first step counts fully, each unrolled one 1/K
    scale = torch.full((steps + 1,), 1.0 / steps, device=values.device)
    scale[0] = 1.0
    per_step = value_cost * values + policies
    loss = (per_step * scale).sum(1) + (rewards * scale[1:]).sum(1)
    with torch.no_grad():
        terms = {"value_loss": values.mean(),
                 "policy_loss": policies.sum() / policy_mask.sum().clamp_min(1),
                 "reward_loss": rewards.sum() / reward_mask.sum().clamp_min(1)}
        value = support_to_scalar(first_value.detach(), size)
    if consistency:  # past the episode's end nothing was reached: masked
        dissimilar = -torch.stack(similarity, 1) * policy_mask[:, 1:]  # [B, K]
        loss = loss + consistency_cost * (dissimilar * scale[1:]).sum(1)
        terms["consistency_loss"] = dissimilar.detach().sum() / \
            policy_mask[:, 1:].sum().clamp_min(1)
    return loss, terms, value


def bootstrapped_values(target: torch.nn.Module, batch: dict[str, torch.Tensor],
                        precision: str = "float32") -> torch.Tensor:
    """The n-step value targets [B, K+1] recomputed with ``target``'s value of each
    bootstrap observation: ``partial_return + bootstrap_discount * v(obs_bootstrap)``
    (where the discount is 0, no bootstrap: past a terminal state, or the sum reached
    the episode's end)."""
    discount = batch["bootstrap_discount"].float()
    value = batch["partial_return"].float().clone()
    boot = discount > 0
    if bool(boot.any()):
        obs = batch["obs_bootstrap"][boot]
        with torch.no_grad(), autocast(obs.device, precision):
            _, logits = target.predict(target.represent(obs))
        value[boot] += discount[boot] * support_to_scalar(logits.float(), target.support_size)
    return value


class MuZeroLearner:
    """One Adam step on MuZero's unrolled loss per batch; returns the new priorities."""

    def __init__(self, cfg: MuZeroConfig, model: torch.nn.Module,
                 precision: str = "float32", **_: Any):
        self.cfg = cfg
        self.model = model
        # the model's forward passes in this arithmetic (autocast); the loss in float32
        self.precision = precision
        self.params = [p for p in model.parameters() if p.requires_grad]
        # the L2 penalty covers weights, not biases
        self.weights = [p for p in self.params if p.dim() > 1]
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr)
        self.updates = 0  # drives lr annealing; restored with the checkpoint
        # the value targets' network (target_update_every > 0), refreshed every N updates
        self.target: torch.nn.Module | None = None
        if cfg.target_update_every > 0:
            self.target = copy.deepcopy(model).requires_grad_(False)

    def update(self, batch: dict[str, torch.Tensor]
               ) -> tuple[dict[str, float], torch.Tensor]:
        """One step; ``(terms, priorities [B])``, the priorities detached, float32."""
        cfg = self.cfg
        if self.target is not None:
            if self.updates % cfg.target_update_every == 0:
                self.target.load_state_dict(self.model.state_dict())
            batch = {**batch, "value": bootstrapped_values(self.target, batch,
                                                           self.precision)}
        per_item, terms, value = muzero_loss(self.model, batch, cfg.value_cost, self.precision,
                                             cfg.consistency_cost)
        weights = batch.get("weight")
        if weights is not None:
            per_item = per_item * weights.float()
        l2 = sum((w.float() ** 2).sum() for w in self.weights)
        loss = per_item.mean() + cfg.weight_decay * l2
        for group in self.optimizer.param_groups:
            group["lr"] = linear_lr(cfg.lr, cfg.lr_final, self.updates, cfg.anneal_updates)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = gradients.clip_and_step(self.params, self.optimizer, cfg.max_grad_norm)
        self.updates += 1
        # on the host: the replay client sends them as a numpy array
        priorities = ((value - batch["value"][:, 0].float()).abs()
                      + cfg.priority_eps).float().cpu()
        report = {"loss": loss.item(), **{k: v.item() for k, v in terms.items()},
                  "value_mean": value.mean().item(), "grad_norm": grad_norm,
                  "lr": self.optimizer.param_groups[0]["lr"]}
        return report, priorities

    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict(), "updates": self.updates}
        if self.target is not None:
            state["target"] = self.target.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        if self.target is not None:  # a checkpoint from before the target: the model's
            self.target.load_state_dict(state.get("target", self.model.state_dict()))
