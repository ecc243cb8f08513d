"""``q_mlp``: a plain MLP Q-network (interface ``q``: ``forward`` and ``q_values``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec


class QMLP(nn.Module):
    interface = "q"

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (64, 64)):
        super().__init__()
        if spec.num_actions is None:
            raise ValueError("model q_mlp needs a discrete action space")
        sizes = [int(torch.tensor(spec.obs_shape).prod()), *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes, sizes[1:], strict=False):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(nn.Flatten(), *layers, nn.Linear(sizes[-1], spec.num_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [N, A]."""
        return self.net(obs.float())

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)
