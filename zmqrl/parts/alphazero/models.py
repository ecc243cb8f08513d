"""Policy-value networks for search (AlphaZero): one torso, a policy head of logits over
every move and a value head in [-1, 1] (tanh) for the player to move.

* :class:`PolicyValueMLP` (``pv_mlp``): an MLP over the flattened observation; enough
  for tic-tac-toe and a fair start on connect four.
* :class:`PolicyValueConv` (``pv_conv``): a small residual conv net over [C, H, W]
  board planes (AlphaZero's shape, scaled down: ``blocks`` residual blocks of
  ``channels`` 3x3 filters, no batch norm so a batch of one evaluates as a batch of
  many).

``forward(obs)`` returns ``(logits [B, A], value [B])`` (the learner's), ``predict`` the
same under ``torch.inference_mode`` (acting's). Illegal moves are not the network's
business: the searcher masks them, and the learner's targets put no mass on them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.feedforward import as_float


def _actions(spec: EnvSpec) -> int:
    if spec.num_actions is None:
        raise ValueError("a policy-value network needs a discrete action space")
    return int(spec.num_actions)


class PolicyValue(nn.Module):
    interface = "policy_value"  # what it provides (zmqrl.parts.models: algo configs need one)

    @torch.inference_mode()
    def predict(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self(obs)


class PolicyValueMLP(PolicyValue):
    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (128, 128)):
        super().__init__()
        obs_dim = int(torch.tensor(spec.obs_shape).prod()) if spec.obs_shape else 1
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [nn.Linear(obs_dim, size), nn.ReLU()]
            obs_dim = size
        self.torso = nn.Sequential(*layers)
        self.policy = nn.Linear(obs_dim, _actions(spec))
        self.value = nn.Linear(obs_dim, 1)
        # a near-uniform first policy and a value near 0
        nn.init.normal_(self.policy.weight, std=0.01)
        nn.init.zeros_(self.policy.bias)
        nn.init.normal_(self.value.weight, std=0.01)
        nn.init.zeros_(self.value.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(as_float(obs).flatten(1))
        return self.policy(h), torch.tanh(self.value(h)).squeeze(-1)


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))


class PolicyValueConv(PolicyValue):
    def __init__(self, spec: EnvSpec, channels: int = 32, blocks: int = 2, hidden: int = 64):
        super().__init__()
        if len(spec.obs_shape) != 3:
            raise ValueError(f"pv_conv needs [C, H, W] observations, not {spec.obs_shape}")
        c, h, w = spec.obs_shape
        self.stem = nn.Sequential(nn.Conv2d(c, channels, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(*(_Residual(channels) for _ in range(blocks)))
        self.policy = nn.Sequential(nn.Conv2d(channels, 2, 1), nn.ReLU(), nn.Flatten(),
                                    nn.Linear(2 * h * w, _actions(spec)))
        self.value = nn.Sequential(nn.Conv2d(channels, 1, 1), nn.ReLU(), nn.Flatten(),
                                   nn.Linear(h * w, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        nn.init.normal_(self.policy[-1].weight, std=0.01)
        nn.init.zeros_(self.policy[-1].bias)
        nn.init.normal_(self.value[-1].weight, std=0.01)
        nn.init.zeros_(self.value[-1].bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Channels-last activations (the weights keep their layout, so the parameters
        # published and checkpointed stay plain contiguous arrays): on one CPU thread
        # the forward pass takes ~0.9 and a training step ~0.7 of the time NCHW takes,
        # with the same outputs (benchmarks/conv_layout.py).
        x = as_float(obs).contiguous(memory_format=torch.channels_last)
        x = self.blocks(self.stem(x))
        return self.policy(x), torch.tanh(self.value(x)).squeeze(-1)
