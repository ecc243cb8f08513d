"""Feed-forward networks over a flat observation: the actor-critic MLP and the dueling
Q-network."""

from __future__ import annotations

import torch
from torch import nn

from zmqrl.envs import EnvSpec


def mlp(sizes: list[int], activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


def _init(module: nn.Module, last_gain: float) -> None:
    # Orthogonal init (as in most PPO/IMPALA references) and a small last layer, so the
    # first policy is close to uniform.
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        gain = last_gain if i == len(linears) - 1 else 2**0.5
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs over a flat observation; discrete actions."""

    def __init__(self, spec: EnvSpec, hidden: list[int] = (64, 64)):
        hidden = list(hidden)
        super().__init__()
        if spec.num_actions is None:
            raise ValueError("continuous actions are not supported by this model yet")
        obs_dim = int(torch.tensor(spec.obs_shape).prod()) if spec.obs_shape else 1
        self.policy = mlp([obs_dim, *hidden, spec.num_actions])
        self.value = mlp([obs_dim, *hidden, 1])
        _init(self.policy, 0.01)
        _init(self.value, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [N, A] and values [N] for observations [N, ...]."""
        flat = obs.reshape(obs.shape[0], -1)
        return self.policy(flat), self.value(flat).squeeze(-1)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions and their log-probabilities (what a behaviour policy needs)."""
        # Direct sampling: torch.distributions costs ~30 us of argument checks per call.
        logp_all = torch.log_softmax(self.policy(obs.reshape(obs.shape[0], -1)), dim=-1)
        action = torch.multinomial(logp_all.exp(), 1)
        return action.squeeze(-1), logp_all.gather(-1, action).squeeze(-1)


    @torch.inference_mode()
    def state_values(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) [N]: what a time-limit truncation bootstraps from."""
        return self.value(obs.reshape(obs.shape[0], -1)).squeeze(-1)


class DuelingQNetwork(nn.Module):
    """Dueling Q-network (Wang et al. 2016) over a flat observation; discrete actions.

    A shared ReLU MLP torso feeds a value stream V(s) [N] and an advantage stream
    A(s, a) [N, A]; Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).
    """

    def __init__(self, spec: EnvSpec, hidden: list[int] = (64, 64)):
        hidden = list(hidden)
        super().__init__()
        if spec.num_actions is None:
            raise ValueError("continuous actions are not supported by this model")
        obs_dim = int(torch.tensor(spec.obs_shape).prod()) if spec.obs_shape else 1
        layers: list[nn.Module] = []
        for n_in, n_out in zip([obs_dim, *hidden[:-1]], hidden, strict=True):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.torso = nn.Sequential(*layers)
        features = hidden[-1] if hidden else obs_dim
        self.value = nn.Linear(features, 1)
        self.advantage = nn.Linear(features, spec.num_actions)
        for layer in self.torso:
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, 2**0.5)
                nn.init.zeros_(layer.bias)
        for head in (self.value, self.advantage):
            nn.init.orthogonal_(head.weight, 1.0)
            nn.init.zeros_(head.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [N, A] for observations [N, ...]."""
        h = self.torso(obs.reshape(obs.shape[0], -1))
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)

    @torch.inference_mode()
    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)
