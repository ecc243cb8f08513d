"""Optimizers. ``LightAdam`` is torch.optim.Adam's update without torch.optim.

Constructing any torch.optim optimizer imports torch._dynamo: ~1 s of CPU (measured:
`python -X importtime`, torch 2.13, this 2-core machine). A learner pays it at start-up
while the actors already act with the initial policy, on a run whose whole budget is
a few seconds. LightAdam is the same update (betas 0.9/0.999, bias correction, no
weight decay, no amsgrad) in public tensor ops; a test checks it against torch.optim.Adam.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class LightAdam:
    """Adam with the surface the learners use: ``step``, ``zero_grad``,
    ``param_groups`` (for the learning rate) and ``state_dict``/``load_state_dict``."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8,
                 betas: tuple[float, float] = (0.9, 0.999)):
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"params": self.params, "lr": lr, "eps": eps, "betas": betas}]
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, eps, (beta1, beta2) = group["lr"], group["eps"], group["betas"]
        self.step_count += 1
        bias1 = 1 - beta1**self.step_count
        bias2_sqrt = (1 - beta2**self.step_count) ** 0.5
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
            if p.grad is None:
                continue
            m.lerp_(p.grad, 1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            p.addcdiv_(m, (v.sqrt() / bias2_sqrt).add_(eps), value=-lr / bias1)

    def state_dict(self) -> dict:
        return {"step": self.step_count, "exp_avg": [m.clone() for m in self.exp_avg],
                "exp_avg_sq": [v.clone() for v in self.exp_avg_sq],
                "param_groups": [{k: v for k, v in g.items() if k != "params"}
                                 for g in self.param_groups]}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step"])
        saved = state["exp_avg"] + state["exp_avg_sq"]
        for dst, src in zip(self.exp_avg + self.exp_avg_sq, saved, strict=True):
            dst.copy_(src)
        self.param_groups[0].update(state["param_groups"][0])


def make_adam(params: Iterable[torch.Tensor], lr: float, eps: float,
              light: bool) -> LightAdam | torch.optim.Adam:
    if light:
        return LightAdam(params, lr=lr, eps=eps)
    return torch.optim.Adam(params, lr=lr, eps=eps)


def linear_lr(start: float, final: float, updates: int, anneal_updates: int) -> float:
    """The lr of the next update: ``start`` falling linearly to ``final`` over
    ``anneal_updates`` updates, then ``final``; ``start`` throughout when that is 0."""
    if anneal_updates <= 0:
        return start
    done = min(1.0, updates / anneal_updates)
    return start + (final - start) * done
