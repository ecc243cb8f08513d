"""MuZero's networks (the ``muzero`` model interface): representation, dynamics and
prediction functions over a flat latent state.

* ``represent(obs) -> latent [B, L]``;
* ``dynamics(latent, action [B] int64) -> (next latent [B, L], reward logits [B, 2S+1])``,
  the action entering one-hot, concatenated to the latent;
* ``predict(latent) -> (policy logits [B, A], value logits [B, 2S+1])``.

Rewards and values are categorical over ``2 support_size + 1`` bins of ``h`` (see
:mod:`zmqrl.parts.muzero.support`). Every latent is min-max scaled per row to [0, 1]
(MuZero, Appendix G), which keeps the unrolled states on one scale as the dynamics is
applied again and again. The last layers of the policy, value and reward heads start at
zero: the first policy is uniform, the first value and reward 0.

:class:`MuZeroMLP` (``muzero_mlp``) encodes a flat observation with an MLP;
:class:`MuZeroConv` (``muzero_conv``) encodes [C, H, W] planes (MinAtar) with a small conv
torso and a linear layer. Both share the MLP dynamics and prediction, sized for a CPU:
a few hundred thousand parameters at the defaults.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.feedforward import as_float
from zmqrl.parts.muzero.support import support_to_scalar

# The smallest range a latent row is divided by: a row with all values equal becomes
# zeros, not NaN.
MIN_SCALE = 1e-5


def scale_latent(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` [B, L] min-max scaled to [0, 1]."""
    low = x.min(-1, keepdim=True).values
    high = x.max(-1, keepdim=True).values
    return (x - low) / (high - low).clamp_min(MIN_SCALE)


def _actions(spec: EnvSpec, kind: str) -> int:
    if spec.num_actions is None:
        raise ValueError(f"{kind} needs a discrete action space (MuZero searches over a "
                         f"finite set of actions); this env's actions are "
                         f"continuous, shape {spec.action_shape}")
    return int(spec.num_actions)


def _zero(layer: nn.Linear) -> nn.Linear:
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


class MuZeroNet(nn.Module):
    """What both models share: dynamics and prediction over a latent of ``latent_size``;
    a subclass sets ``self.encoder`` (obs -> unscaled latent [B, L])."""

    interface = "muzero"  # what it provides (zmqrl.parts.models: algo configs need one)
    encoder: nn.Module

    def __init__(self, num_actions: int, latent_size: int, hidden: int, support_size: int):
        super().__init__()
        if latent_size < 2:
            raise ValueError(f"latent_size {latent_size}: min-max scaling needs >= 2")
        self.num_actions = num_actions
        self.latent_size = latent_size
        self.support_size = support_size
        bins = 2 * support_size + 1
        self.dynamics_torso = nn.Sequential(
            nn.Linear(latent_size + num_actions, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU())
        self.next_latent = nn.Linear(hidden, latent_size)
        self.reward = _zero(nn.Linear(hidden, bins))
        self.prediction_torso = nn.Sequential(nn.Linear(latent_size, hidden), nn.ReLU(),
                                              nn.Linear(hidden, hidden), nn.ReLU())
        self.policy = _zero(nn.Linear(hidden, num_actions))
        self.value = _zero(nn.Linear(hidden, bins))

    def represent(self, obs: torch.Tensor) -> torch.Tensor:
        return scale_latent(self.encoder(as_float(obs)))

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        one_hot = F.one_hot(action.long(), self.num_actions).to(latent.dtype)
        x = self.dynamics_torso(torch.cat([latent, one_hot], dim=-1))
        return scale_latent(self.next_latent(x)), self.reward(x)

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.prediction_torso(latent)
        return self.policy(x), self.value(x)

    # Acting's view (not part of the interface's contract; a convenience for the
    # search's callables): scalars instead of value and reward logits, no autograd.

    @torch.inference_mode()
    def initial_inference(self, obs: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(latent [B, L], policy logits [B, A], value [B])`` of observations."""
        latent = self.represent(obs)
        logits, value = self.predict(latent)
        return latent, logits, support_to_scalar(value, self.support_size)

    @torch.inference_mode()
    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(next latent [B, L], reward [B], policy logits [B, A], value [B])``."""
        latent, reward = self.dynamics(latent, action)
        logits, value = self.predict(latent)
        return (latent, support_to_scalar(reward, self.support_size), logits,
                support_to_scalar(value, self.support_size))


class MuZeroMLP(MuZeroNet):
    """MuZero over a flat observation (CartPole): an MLP encoder."""

    def __init__(self, spec: EnvSpec, latent_size: int = 64, hidden: int = 128,
                 support_size: int = 10):
        super().__init__(_actions(spec, "muzero_mlp"), latent_size, hidden, support_size)
        obs_dim = 1
        for size in spec.obs_shape:
            obs_dim *= int(size)
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(obs_dim, hidden), nn.ReLU(),
                                     nn.Linear(hidden, latent_size))


class MuZeroConv(MuZeroNet):
    """MuZero over [C, H, W] planes (MinAtar): two 3x3 convolutions, then a linear layer
    to the flat latent."""

    def __init__(self, spec: EnvSpec, channels: int = 32, latent_size: int = 64,
                 hidden: int = 128, support_size: int = 10):
        if len(spec.obs_shape) != 3:
            raise ValueError(f"muzero_conv needs [C, H, W] observations, not shape "
                             f"{tuple(spec.obs_shape)} (muzero_mlp takes flat ones)")
        super().__init__(_actions(spec, "muzero_conv"), latent_size, hidden, support_size)
        c, height, width = (int(s) for s in spec.obs_shape)
        self.encoder = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(channels * height * width, latent_size))


def numpy_inference(model: MuZeroNet) -> tuple[Any, Any]:
    """The model's initial and recurrent inference as numpy functions
    (``zmqrl.parts.muzero.search.Initial``/``Recurrent``): a search in this process
    (``search.search``: the reanalyse node, benchmarks) calls them."""
    device = next(model.parameters()).device

    def initial(obs: np.ndarray) -> tuple[np.ndarray, ...]:
        out = model.initial_inference(torch.as_tensor(obs, device=device))
        return tuple(t.float().cpu().numpy() for t in out)

    def recurrent(latent: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, ...]:
        out = model.recurrent_inference(torch.as_tensor(latent, device=device),
                                        torch.as_tensor(action, device=device))
        return tuple(t.float().cpu().numpy() for t in out)

    return initial, recurrent
