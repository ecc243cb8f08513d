"""Expected SARSA under the Boltzmann policy: the target of (s, a) is the n-step reward
plus the discounted expectation of Q_target(s', .) under softmax(Q_target(s') / T)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from zmqrl.parts.algos.target_q import TargetQLearner


class ExpectedSarsaLearner(TargetQLearner):
    def __init__(self, cfg: Any, model: torch.nn.Module, **_: Any):  # options: unused
        super().__init__(cfg, model)
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr)

    def loss(self, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        action = batch["action"].long()
        reward, discount = batch["reward"].float(), batch["discount"].float()
        q = self.model(batch["obs"]).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_q = self.target_model(batch["next_obs"])
            policy = torch.softmax(next_q / self.cfg.temperature, dim=-1)
            targets = reward + discount * (policy * next_q).sum(-1)
        weights = batch.get("weight")
        huber = F.huber_loss(q, targets, reduction="none")
        loss = (huber if weights is None else weights.float() * huber).mean()
        priorities = (targets - q).detach().abs().float().cpu()
        return loss, {"loss": loss.item(), "q_mean": q.detach().mean().item()}, priorities
