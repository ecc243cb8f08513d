"""MuZero's value and reward transform (Appendix F): scalars squashed by
``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018) and represented as
a two-hot categorical over the integers ``-size..size`` (``2 size + 1`` bins).

The network outputs logits over those bins; the scalar they stand for is
``h_inverse(sum_i softmax(logits)_i * i)``. A target scalar becomes the two-hot of
``clip(h(x), -size, size)``: the two bins around it share the mass so that their
expectation is exactly ``h(x)``.
"""

from __future__ import annotations

import torch

EPS = 1e-3


def h(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``sign(x) (sqrt(|x| + 1) - 1) + eps x``: compresses large returns, invertible."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def h_inverse(y: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The exact inverse of :func:`h`.

    The closed form is ``sign(y) (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)``;
    ``sqrt(1 + a) - 1`` is written ``a / (sqrt(1 + a) + 1)`` so nothing cancels in
    float32 (the plain form loses ~1e-3 absolute at |x| ~ 100) and eps = 0 works too."""
    a = 4 * eps * (y.abs() + 1 + eps)
    root = 2 * (y.abs() + 1 + eps) / (torch.sqrt(1 + a) + 1)  # sqrt(|x| + 1)
    return torch.sign(y) * (root * root - 1)


def scalar_to_support(x: torch.Tensor, size: int) -> torch.Tensor:
    """``[...]`` scalars -> ``[..., 2 size + 1]`` two-hot of ``clip(h(x), -size, size)``:
    at most two adjacent bins hold mass, summing to 1, with expectation ``h(x)``."""
    y = h(x.float()).clamp(-size, size)
    low = y.floor()
    upper = y - low  # mass of the bin above
    index = (low + size).long()
    out = torch.zeros(*x.shape, 2 * size + 1, dtype=y.dtype, device=x.device)
    out.scatter_(-1, index.unsqueeze(-1), (1 - upper).unsqueeze(-1))
    # at y == size the bin above does not exist, and its mass is 0: add it to the top bin
    above = (index + 1).clamp(max=2 * size).unsqueeze(-1)
    out.scatter_add_(-1, above, upper.unsqueeze(-1))
    return out


def support_to_scalar(logits: torch.Tensor, size: int) -> torch.Tensor:
    """``[..., 2 size + 1]`` logits -> ``[...]``: ``h_inverse`` of the softmax's mean bin
    (computed in float32 whatever the logits' dtype)."""
    probs = torch.softmax(logits.float(), dim=-1)
    bins = torch.arange(-size, size + 1, dtype=probs.dtype, device=probs.device)
    return h_inverse((probs * bins).sum(-1))
