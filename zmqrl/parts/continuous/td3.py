"""TD3 (Fujimoto et al. 2018) over a prioritized replay: Ape-X DPG's learner.

Twin critics regress on ``r + γ^m min(Q1', Q2')(s', clip(π'(s') + ε))`` with ε the
target-policy smoothing noise (the targets' networks, Polyak-averaged); the policy
climbs Q1 every ``policy_delay`` critic updates, when the targets move too.
"""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.parts.continuous.config import TD3Config
from zmqrl.parts.continuous.twin_q import TwinQLearner, acting_priorities


def td3_target(net: torch.nn.Module, reward: torch.Tensor, discount: torch.Tensor,
               next_obs: torch.Tensor, noise: float = 0.0, noise_clip: float = 0.0
               ) -> torch.Tensor:
    """``reward + discount * min(Q1, Q2)(next_obs, π(next_obs) + clipped noise)`` [B],
    all of ``net`` (the target networks; an actor's own network for priorities). Noise
    and clip are fractions of the half-range: the policy acts in [-1, 1] before scaling."""
    unit = net.unit_act(next_obs)
    if noise > 0:
        eps = (torch.randn_like(unit) * noise).clamp(-noise_clip, noise_clip)
        unit = (unit + eps).clamp(-1.0, 1.0)
    q1, q2 = net.q(next_obs, net.to_env(unit))
    return reward + discount * torch.minimum(q1, q2)


def initial_priorities(model: torch.nn.Module, items: dict[str, np.ndarray]) -> np.ndarray:
    """An actor's priorities for its transitions: no smoothing, its network as target."""
    return acting_priorities(model, items, lambda r, d, s: td3_target(model, r, d, s))


class TD3Learner(TwinQLearner):
    cfg: TD3Config

    def targets(self, reward: torch.Tensor, discount: torch.Tensor,
                next_obs: torch.Tensor) -> torch.Tensor:
        return td3_target(self.target_model, reward, discount, next_obs,
                          self.cfg.target_noise, self.cfg.target_noise_clip)

    def policy_step(self, obs: torch.Tensor) -> dict[str, float]:
        q1, _ = self.model.q(obs, self.model.act(obs))
        loss = -q1.mean()
        return {"policy_loss": loss.item(), "policy_grad_norm": self.step(loss, self.policy_params)}

    def online_params(self) -> list[torch.Tensor]:
        return self.critic_params + self.policy_params

    def target_params(self) -> list[torch.Tensor]:
        return self.target_model.critic_parameters() + self.target_model.policy_parameters()
