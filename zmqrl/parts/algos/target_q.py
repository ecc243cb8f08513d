"""What the Q-learning learners (DQN, R2D2) share: a target network, the update
counter that times its syncs, checkpoint state, and the split of an update into
gradients and their application (so a Gorila learner can ship the gradients to a
parameter server instead). A subclass builds ``self.optimizer`` and defines ``loss``."""

from __future__ import annotations

import copy
from typing import Any

import torch

from zmqrl.parts.algos import gradients


class TargetCheckpoint:
    """The checkpoint state of a learner with an ``optimizer``, a ``target_model`` and
    an ``updates`` counter (the Q-learners here; TD3 and SAC, zmqrl.parts.continuous)."""

    optimizer: Any
    target_model: torch.nn.Module
    updates: int

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the model: optimizer, the target network and
        the update counter that times its next sync."""
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "target_model": self.target_model.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.target_model.load_state_dict(state["target_model"])
        self.updates = int(state["updates"])


class TargetQLearner(TargetCheckpoint):
    def __init__(self, cfg: Any, model: torch.nn.Module):
        self.cfg = cfg
        self.model = model
        self.target_model = copy.deepcopy(model).eval()
        self.target_model.requires_grad_(False)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer: Any = None  # the subclass's
        self.updates = 0

    def loss(self, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """(loss, loss terms, new priorities [B] as float32 CPU)."""
        raise NotImplementedError

    def sync_target(self) -> None:
        self.target_model.load_state_dict(self.model.state_dict())

    def gradients(self, batch: dict[str, torch.Tensor]
                  ) -> tuple[list[torch.Tensor], dict[str, float], torch.Tensor]:
        """(gradients, loss terms, priorities) without stepping: for Gorila learners."""
        loss, terms, priorities = self.loss(batch)
        return gradients.compute(loss, self.params), terms, priorities

    def apply_gradients(self, grads: list[torch.Tensor]) -> dict[str, float]:
        """Clip and apply ``grads`` (for the parameter server); counts an update."""
        grad_norm = gradients.apply(self.params, self.optimizer, grads, self.cfg.max_grad_norm)
        self.after_update()
        return {"grad_norm": grad_norm}  # not finite: the step was skipped

    def after_update(self) -> None:
        """Count an update of the online network and sync the target when due."""
        self.updates += 1
        if self.updates % self.cfg.target_update_every == 0:
            self.sync_target()

    def update(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """One update. Returns (loss terms, new priorities [B] as float32 CPU), the
        priorities from the TD errors before the step."""
        grads, terms, priorities = self.gradients(batch)
        terms.update(self.apply_gradients(grads))
        return terms, priorities
