"""AlphaZero's learner (Silver et al. 2017, 2018): fit the policy-value network to what
self-play search found.

A batch holds positions from a replay (``batch``/``positions``): the observation seen
by the player to move, the search's visit distribution ``pi`` over the moves and the
game's final outcome ``z`` for that player. The loss is AlphaZero's

    l = -sum_a pi(a) log p(a | s)  +  value_cost * (z - v(s))^2  +  l2 * sum ||w||^2

(the policy cross-entropy to the visit counts, the value's squared error to the
outcome, and an L2 penalty on the weights, biases excluded), minimised with Adam and a
global gradient-norm clip; the lr optionally falls linearly to ``lr_final`` over
``anneal_updates`` updates. The reported ``policy_kl`` is the cross-entropy minus the
targets' entropy: 0 when the network reproduces the search.
"""

from __future__ import annotations

from typing import Any

import torch

from zmqrl.parts.algos import gradients
from zmqrl.parts.algos.optim import linear_lr, make_adam
from zmqrl.parts.alphazero.config import AlphaZeroConfig
from zmqrl.parts.devices import autocast


def alphazero_loss(logits: torch.Tensor, value: torch.Tensor, policy: torch.Tensor,
                   outcome: torch.Tensor, weights: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position policy cross-entropy [B] and value squared error [B] (each times
    ``weights``, the replay batch's importance weights ``weight``, when given)."""
    cross_entropy = -(policy * torch.log_softmax(logits, dim=-1)).sum(-1)
    squared = (outcome - value) ** 2
    if weights is not None:
        cross_entropy, squared = cross_entropy * weights, squared * weights
    return cross_entropy, squared


class AlphaZeroLearner:
    """One Adam step on the AlphaZero loss per batch."""

    def __init__(self, cfg: AlphaZeroConfig, model: torch.nn.Module,
                 precision: str = "float32"):
        self.cfg = cfg
        self.model = model
        # the model's forward pass in this arithmetic (autocast); the loss in float32
        self.precision = precision
        self.params = [p for p in model.parameters() if p.requires_grad]
        # the L2 penalty covers weights, not biases (AlphaZero's weight decay does too)
        self.weights = [p for p in self.params if p.dim() > 1]
        self.optimizer = make_adam(self.params, cfg.lr, 1e-8, cfg.light_adam)
        self.updates = 0  # drives lr annealing; restored with the checkpoint

    def lr(self) -> float:
        """The lr of the next update: ``lr`` annealed linearly to ``lr_final``."""
        cfg = self.cfg
        return linear_lr(cfg.lr, cfg.lr_final, self.updates, cfg.anneal_updates)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg = self.cfg
        policy, outcome = batch["policy"].float(), batch["outcome"].float()
        with autocast(batch["obs"].device, self.precision):
            logits, value = self.model(batch["obs"])
        logits, value = logits.float(), value.float()
        cross_entropy, squared = alphazero_loss(logits, value, policy, outcome,
                                                batch.get("weight"))
        policy_loss, value_loss = cross_entropy.mean(), squared.mean()
        l2 = sum((w ** 2).sum() for w in self.weights)
        loss = policy_loss + cfg.value_cost * value_loss + cfg.l2 * l2
        lr = self.lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = gradients.clip_and_step(self.params, self.optimizer, cfg.max_grad_norm)
        self.updates += 1
        with torch.no_grad():
            entropy = -(policy * torch.log(policy.clamp_min(1e-12))).sum(-1).mean()
        return {"loss": loss.item(), "policy_loss": policy_loss.item(),
                "policy_kl": (policy_loss - entropy).item(), "value_loss": value_loss.item(),
                "l2": l2.item(), "value_mean": value.detach().mean().item(),
                "grad_norm": grad_norm, "lr": lr}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
