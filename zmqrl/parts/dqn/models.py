"""DQN's networks (model interface ``q``): the dueling Q-network (Wang et al. 2016) over
a flat observation (``dueling_mlp``) and over pixels (``dueling_nature_cnn``,
``dueling_impala_cnn``). R2D2's recurrent Q-networks reuse its dueling head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.conv import make_torso, on_torso
from zmqrl.parts.models.feedforward import as_float, discrete_actions, relu_torso


def init_dueling(torso: nn.Module, value: nn.Linear, advantage: nn.Linear) -> None:
    """Orthogonal init: gain sqrt(2) for the ReLU torso (an MLP or a conv net), 1 for the
    two heads."""
    for layer in torso.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(layer.weight, 2**0.5)
            nn.init.zeros_(layer.bias)
    for head in (value, advantage):
        nn.init.orthogonal_(head.weight, 1.0)
        nn.init.zeros_(head.bias)


def dueling_q(features: torch.Tensor, value: nn.Linear, advantage: nn.Linear) -> torch.Tensor:
    """Q = V + A - mean_a A (Wang et al. 2016)."""
    adv = advantage(features)
    return value(features) + adv - adv.mean(dim=-1, keepdim=True)


class DuelingQNetwork(nn.Module):
    """Dueling Q-network (Wang et al. 2016) over a flat observation; discrete actions.

    A shared ReLU MLP torso feeds a value stream V(s) [N] and an advantage stream
    A(s, a) [N, A]; Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).
    """

    interface = "q"  # what it provides (zmqrl.parts.models: algo configs need one)

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (64, 64)):
        super().__init__()
        num_actions = discrete_actions(spec, "dueling_mlp")
        self.torso, features = relu_torso(spec, hidden)
        self.value = nn.Linear(features, 1)
        self.advantage = nn.Linear(features, num_actions)
        init_dueling(self.torso, self.value, self.advantage)

    def surgery_chains(self) -> list:
        """How surgery carries trained parameters into a changed network
        (zmqrl.parts.surgery): the ReLU torso, then the value and the advantage heads."""
        from zmqrl.parts.surgery.net2net import mlp_chains

        return mlp_chains(self, {"value": "value", "advantage": "advantage"}, "relu")

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [N, A] for observations [N, ...]."""
        flat = as_float(obs.reshape(obs.shape[0], -1))
        return dueling_q(self.torso(flat), self.value, self.advantage)

    @torch.inference_mode()
    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


class ConvDuelingQNetwork(nn.Module):
    """Kinds ``dueling_nature_cnn``, ``dueling_impala_cnn``: a conv torso and a dueling
    head, Q = V + A - mean_a A (Wang et al. 2016). The API of ``DuelingQNetwork``."""

    interface = "q"  # what it provides (zmqrl.parts.models: algo configs need one)

    def __init__(self, spec: EnvSpec, torso: str = "nature", **options):
        super().__init__()
        kind = f"dueling_{torso}_cnn"
        num_actions = discrete_actions(spec, kind)
        self.torso = make_torso(torso, spec, kind, options)
        self.value = nn.Linear(self.torso.features, 1)
        self.advantage = nn.Linear(self.torso.features, num_actions)
        init_dueling(self.torso, self.value, self.advantage)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [N, A] for observations [N, C, H, W]."""
        return dueling_q(self.torso(obs), self.value, self.advantage)

    @torch.inference_mode()
    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


dueling_nature_cnn = on_torso(ConvDuelingQNetwork, "nature", "q")


dueling_impala_cnn = on_torso(ConvDuelingQNetwork, "impala", "q")
