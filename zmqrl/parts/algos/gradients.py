"""Gradients as data: compute them on one copy of a model, apply them on another.

Used where gradients cross a socket (A3C workers and Gorila learners push them to a
parameter server), so that computing and applying stay one definition for every
algorithm; and :func:`clip_and_step`, every learner's optimizer step, which never
applies a non-finite gradient.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def compute(loss: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """d loss / d params, unclipped; zeros for parameters the loss does not touch."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


def apply(params: list[torch.Tensor], optimizer: torch.optim.Optimizer,
          grads: list[torch.Tensor | np.ndarray], max_grad_norm: float) -> float:
    """Set ``.grad`` from ``grads``, clip to ``max_grad_norm``, step. Returns the norm
    before clipping."""
    if len(grads) != len(params):
        raise ValueError(f"expected {len(params)} gradients, got {len(grads)}")
    for p, g in zip(params, grads, strict=True):
        g = torch.from_numpy(np.array(g)) if not isinstance(g, torch.Tensor) else g  # copies
        p.grad = g.to(dtype=p.dtype, device=p.device).reshape(p.shape).clone()
    grad_norm = clip_and_step(params, optimizer, max_grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def clip_and_step(params: Any,
                  optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
    """Clip the gradients of ``params`` to ``max_grad_norm`` and step ``optimizer``;
    returns the norm before clipping. A non-finite norm (a loss that overflowed, one
    bad sample) steps nothing: clipping would scale inf by 0 into NaN and every
    parameter would follow. Every learner reports the norm as its ``grad_norm`` term,
    and the learner node counts updates whose norm is not finite (``updates_skipped``)."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return grad_norm
    optimizer.step()
    return grad_norm
