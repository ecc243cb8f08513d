"""Networks for off-policy continuous control: a policy and twin Q-networks in one
module, so one ``params`` message carries what an actor acts and prioritizes with.

* ``td3_mlp`` (:class:`DeterministicActorTwinQ`, interface
  ``deterministic_actor_twin_q``): ``act(obs)``, the policy's action;
* ``sac_mlp`` (:class:`GaussianActorTwinQ`, interface ``stochastic_actor_twin_q``):
  ``mean_log_std(obs)`` and ``sample(obs)`` of a tanh-squashed Gaussian, and the
  entropy temperature ``log_alpha`` (a parameter, so it travels and is checkpointed with
  the rest).

Both give ``q(obs, action)`` -> (Q1, Q2). Actions are in the env's units everywhere
(what the replay stores): the policy's tanh output is scaled into the Box's bounds,
and the critics see actions scaled back into [-1, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.feedforward import HALF_LOG_2PI, LOG_STD_MAX, LOG_STD_MIN, as_float, mlp


def _bounds(spec: EnvSpec, kind: str) -> tuple[np.ndarray, np.ndarray]:
    low, high = spec.action_low, spec.action_high
    if low is None or high is None:
        raise ValueError(f"{kind} needs a Box action space (continuous actions); this env's "
                         "actions are discrete")
    if not (np.isfinite(low).all() and np.isfinite(high).all()) or (high <= low).any():
        raise ValueError(f"{kind} needs finite Box bounds with low < high, not "
                         f"[{low}, {high}]")
    return low, high


class TwinQ(nn.Module):
    """Two independent Q(s, a) MLPs over the observation and the action in [-1, 1]."""

    def __init__(self, obs_size: int, action_size: int, hidden: Sequence[int]):
        super().__init__()
        sizes = [obs_size + action_size, *hidden, 1]
        self.q1 = mlp(sizes, nn.ReLU)
        self.q2 = mlp(sizes, nn.ReLU)

    def forward(self, obs: torch.Tensor, unit_action: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, unit_action], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class _ActorTwinQ(nn.Module):
    """The policy MLP (``policy``, ``policy_outputs`` wide), the critics and the action
    scaling, shared by both models."""

    interface = ""

    def __init__(self, spec: EnvSpec, hidden: Sequence[int], critic_hidden: Sequence[int] | None,
                 policy_outputs: int):
        super().__init__()
        low, high = _bounds(spec, type(self).__name__)
        self.action_size = int(np.prod(spec.action_shape))
        self.action_shape = tuple(spec.action_shape)
        obs_size = int(np.prod(spec.obs_shape))
        # Not persistent: the bounds come from the env, not from parameters that travel.
        self.register_buffer("action_center",
                             torch.as_tensor((high + low) / 2, dtype=torch.float32)
                             .reshape(-1), persistent=False)
        self.register_buffer("action_half",
                             torch.as_tensor((high - low) / 2, dtype=torch.float32)
                             .reshape(-1), persistent=False)
        self.policy = mlp([obs_size, *hidden, policy_outputs * self.action_size], nn.ReLU)
        self.critic = TwinQ(obs_size, self.action_size,
                            hidden if critic_hidden is None else critic_hidden)

    @staticmethod
    def flat(obs: torch.Tensor) -> torch.Tensor:
        return as_float(obs).flatten(1)

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        """[-1, 1] -> the env's action units, in the env's action shape."""
        return (self.action_center + self.action_half * unit).reshape(-1, *self.action_shape)

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        return (action.reshape(len(action), -1) - self.action_center) / self.action_half

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Twin Q-values [B] of env-unit ``action`` in ``obs``."""
        return self.critic(self.flat(obs), self.to_unit(action.float()))

    def policy_parameters(self) -> list[nn.Parameter]:
        return list(self.policy.parameters())

    def critic_parameters(self) -> list[nn.Parameter]:
        return list(self.critic.parameters())


class DeterministicActorTwinQ(_ActorTwinQ):
    """TD3's networks: a deterministic policy tanh-squashed into the bounds, twin Qs.
    ``hidden``: both MLPs' layers (256, 256 as TD3); ``critic_hidden`` the critics' if
    they differ."""

    interface = "deterministic_actor_twin_q"

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (256, 256),
                 critic_hidden: Sequence[int] | None = None):
        super().__init__(spec, hidden, critic_hidden, 1)

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.to_env(self.unit_act(obs))

    def unit_act(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's action in [-1, 1] [B, A]."""
        return torch.tanh(self.policy(self.flat(obs)))


class GaussianActorTwinQ(_ActorTwinQ):
    """SAC's networks: a tanh-squashed diagonal Gaussian policy (mean and state-dependent
    log-std, clamped to [-20, 2]), twin Qs, and ``log_alpha`` (``init_alpha``: SB3's 1.0)."""

    interface = "stochastic_actor_twin_q"

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (256, 256),
                 critic_hidden: Sequence[int] | None = None, init_alpha: float = 1.0):
        if not (isinstance(init_alpha, (int, float)) and 0 < init_alpha < 1e6):
            raise ValueError(f"init_alpha {init_alpha!r}: must be a number in (0, 1e6)")
        super().__init__(spec, hidden, critic_hidden, 2)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)))

    def mean_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.policy(self.flat(obs)).chunk(2, -1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized sample: (env-unit action [B, *action], its log-prob [B])."""
        mean, log_std = self.mean_log_std(obs)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        return self.to_env(torch.tanh(u)), squashed_log_prob(noise, log_std, u)


def squashed_log_prob(noise: torch.Tensor | np.ndarray, log_std: torch.Tensor | np.ndarray,
                      u: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """log π(a) [B] of a = tanh(u), u = mean + std·noise: the Gaussian's log-density
    minus log |da/du| = log(1 - tanh²u), written as 2(log 2 - u - softplus(-2u)) (stable
    where tanh saturates). The scaling into the bounds is a constant shift, left out as
    SAC's target entropy assumes. Torch tensors or numpy arrays alike."""
    if isinstance(u, torch.Tensor):
        gauss = -0.5 * noise.pow(2) - log_std - HALF_LOG_2PI
        jac = 2 * (math.log(2.0) - u - nn.functional.softplus(-2 * u))
        return (gauss - jac).sum(-1)
    gauss = -0.5 * np.square(noise) - log_std - HALF_LOG_2PI
    jac = 2 * (math.log(2.0) - u - np.logaddexp(0.0, -2 * u))
    return (gauss - jac).sum(-1)
