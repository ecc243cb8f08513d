"""Running observation normalization that lives inside a model.

The statistics are registered buffers, so they are part of ``state_dict()``: they travel
with the parameters the learner publishes (``zmqrl.parts.models.state_arrays``), and every
process that loads them (inference broker, actors, evaluation) normalises with the
learner's statistics. Only learners call ``update``; everyone else just runs ``forward``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class RunningNorm(nn.Module):
    """``clip((obs - mean) / sqrt(var + eps), -clip, clip)`` with running statistics.

    Buffers (float64, so that long runs do not lose precision when a small batch is
    merged into a large count): ``mean`` and ``var`` of ``shape``, and the sample
    ``count`` (a scalar). Before the first update the map is the identity (mean 0,
    var 1), clipped.

    The learner's statistics are buffers and therefore in ``state_dict``: they are
    published with the parameters, so the inference side (inference broker, actors)
    normalises with exactly the statistics the learner trained with.
    """

    def __init__(self, shape: int | tuple[int, ...], clip: float | None = 10.0,
                 eps: float = 1e-8):
        super().__init__()
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Normalised ``obs`` [..., *shape], in ``obs``'s dtype."""
        mean = self.mean.to(obs.dtype)
        std = torch.sqrt(self.var + self.eps).to(obs.dtype)
        out = (obs - mean) / std
        return out if self.clip is None else out.clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs_batch: torch.Tensor,
               reduce: Callable[[torch.Tensor], None] | None = None) -> None:
        """Merge the moments of ``obs_batch`` [..., *shape] into the running statistics
        (the parallel-variance merge of Chan et al. 1979).

        ``reduce``: optional callable that sums a 1-D float64 tensor across processes in
        place (data-parallel learners): then the moments of ALL ranks' batches are
        merged and every rank ends with identical statistics. A reduce that averages
        instead of summing gives the same mean and var (the merge depends only on
        ratios of counts); ``count`` then counts samples per rank.
        """
        x = obs_batch.detach().reshape(-1, *self.shape).to(self.mean.device, torch.float64)
        # Moments about the current running mean (identical on every rank): one reduce
        # call, and the shifted sums do not cancel catastrophically as raw sums would.
        d = x - self.mean
        pack = torch.cat([torch.tensor([float(x.shape[0])], dtype=torch.float64,
                                       device=x.device),
                          d.sum(0).reshape(-1), (d * d).sum(0).reshape(-1)])
        if reduce is not None:
            reduce(pack)
        n = pack[0]
        if float(n) <= 0:
            return
        size = self.mean.numel()
        delta = pack[1:1 + size].reshape(self.shape) / n  # batch mean - running mean
        batch_var = (pack[1 + size:].reshape(self.shape) / n - delta * delta).clamp_min(0.0)
        total = self.count + n
        m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, clip={self.clip}"
