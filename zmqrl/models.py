"""Torch networks. ``build_model`` turns a topology's ``model`` section into a module."""

from __future__ import annotations

from typing import Any

import numpy as np
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

    def __init__(self, spec: EnvSpec, hidden: list[int]):
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


def bootstrap_truncated(reward: np.ndarray, truncated: np.ndarray, final_obs: np.ndarray,
                        model: nn.Module, discount: float, reward_scale: float = 1.0
                        ) -> np.ndarray:
    """Rewards with ``discount * V(final_obs)`` added where an episode was cut by a time
    limit rather than ended (SB3 does the same). The episode end still cuts the trace
    (done stays true), so the learner needs no special case; ``final_obs`` holds the
    final observations of the truncated envs, in order. V predicts returns in the
    learner's scaled units, so it is divided by ``reward_scale`` here."""
    if not truncated.any():
        return reward
    device = next(model.parameters()).device
    values = model.state_values(torch.from_numpy(np.array(final_obs)).to(device))
    out = np.array(reward, np.float32)
    out[truncated] += discount * values.float().cpu().numpy() / reward_scale
    return out


MODEL_KINDS = {"mlp": ActorCritic}


def build_model(model_cfg: dict[str, Any], spec: EnvSpec, seed: int = 0) -> nn.Module:
    kind = model_cfg.get("kind", "mlp")
    if kind not in MODEL_KINDS:
        raise ValueError(f"model.kind: unknown model '{kind}' (known: {', '.join(MODEL_KINDS)})")
    torch.manual_seed(seed)  # every process builds the same initial parameters
    return MODEL_KINDS[kind](spec, list(model_cfg.get("hidden", [64, 64])))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def state_arrays(model: nn.Module) -> dict:
    """Parameters as numpy arrays, ready to be message frames."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def load_state_arrays(model: nn.Module, arrays: dict) -> None:
    state = {k: torch.tensor(v) for k, v in arrays.items()}  # frames are read-only: copy
    model.load_state_dict(state, strict=True)


class DuelingQNetwork(nn.Module):
    """Dueling Q-network (Wang et al. 2016) over a flat observation; discrete actions.

    A shared ReLU MLP torso feeds a value stream V(s) [N] and an advantage stream
    A(s, a) [N, A]; Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).
    """

    def __init__(self, spec: EnvSpec, hidden: list[int]):
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


MODEL_KINDS["dueling_mlp"] = DuelingQNetwork
