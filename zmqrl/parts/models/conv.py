"""Convolutional networks over pixel observations [C, H, W] (Atari, MinAtar).

Two torsos, each followed by ReLU fully connected layers, ``hidden`` (a width or a list
of widths, as the MLP kinds' ``hidden``; empty: the flat conv output):

* ``nature``: the DQN Nature paper's convs (Mnih et al. 2015), 32x8/4, 64x4/2, 64x3/1,
  then 512 units. ``convs`` ([[channels, kernel, stride], ...]) replaces the stack:
  MinAtar's 10x10 frames are too small for the 8x8/4 kernel, and MinAtar's own network
  is ``convs: [[16, 3, 1]], hidden: 128``. A stack that does not fit the observation is
  refused when the model is built (``zmqrl validate`` reports it).
* ``impala``: IMPALA's deep ResNet (Espeholt et al. 2018): per section a 3x3 conv, a
  3x3/2 max-pool and ``blocks`` residual blocks, channels (16, 32, 32), then 256 units.
  The pools halve the frame, so it fits any size (84x84 -> 11x11, 10x10 -> 2x2).

The torso's first step turns the observation into float32 divided by ``scale`` (255:
pixel values) on the model's device, so frames stay uint8 until then — on the wire, in
unrolls, in replay and in the learner's batches. It divides whatever the dtype: a model
is given pixel values; ``scale: 1`` for observations already in [0, 1].

Heads on either torso (model kinds: the ``zmqrl.models`` entry points at the end):

=========================  =========================================  ==================
kind                       network                                    algorithms
=========================  =========================================  ==================
``nature_cnn``             torso -> policy logits, value              vtrace, a2c, ppo
``impala_cnn``
``nature_cnn_lstm``        torso -> LSTM -> policy, value             vtrace, a2c
``impala_cnn_lstm``        (``zmqrl.parts.models.recurrent.LSTMActorCritic``)
``dueling_nature_cnn``     torso -> dueling Q                         dqn
``dueling_impala_cnn``
``nature_cnn_lstm_q``      torso -> LSTM -> dueling Q (R2D2)          r2d2
``impala_cnn_lstm_q``
=========================  =========================================  ==================

Options: the torso's (above, and ``hidden``, ``scale``) and, for the LSTM kinds,
``lstm`` (the core's size, 256 by default as in IMPALA and R2D2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.feedforward import (
    discrete_actions,
    dueling_q,
    init_dueling,
    sample_categorical,
)
from zmqrl.parts.models.recurrent import LSTMActorCritic, LSTMQNetwork

NATURE_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
IMPALA_CHANNELS = (16, 32, 32)


class PixelTorso(nn.Module):
    """Pixels [N, C, H, W] (uint8, or any dtype holding 0..``scale``) -> features
    [N, features]: ``convs`` (ending in a flatten), then ReLU fully connected layers of
    ``hidden`` widths."""

    def __init__(self, convs: nn.Sequential, obs_shape: tuple[int, ...],
                 hidden: int | Sequence[int], scale: float, kind: str):
        super().__init__()
        self.convs = convs
        self.scale = float(scale)
        try:
            with torch.no_grad():
                flat = convs(torch.zeros(1, *obs_shape)).shape[1]
        except RuntimeError as exc:  # a kernel larger than what is left of the frame
            raise ValueError(f"model {kind}: the convs do not fit observations "
                             f"{list(obs_shape)} ({exc}); give smaller ones with `convs`") \
                from None
        sizes = [flat, *([hidden] if isinstance(hidden, int) else hidden)]
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(n_in, int(n_out)), nn.ReLU()]
        self.fc = nn.Sequential(*layers)
        self.features = int(sizes[-1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # One float copy, made where the model runs: frames travel as uint8. A float
        # input is divided out of place (never the caller's tensor).
        x = obs / self.scale if obs.is_floating_point() else obs.float().mul_(1 / self.scale)
        return self.fc(self.convs(x))


def _pixel_shape(spec: EnvSpec, kind: str) -> tuple[int, int, int]:
    if len(spec.obs_shape) != 3:
        raise ValueError(f"model {kind} needs image observations [C, H, W], not "
                         f"{list(spec.obs_shape)} (pixel envs: zmqrl/Atari-*, zmqrl/MinAtar-*)")
    return tuple(spec.obs_shape)


def nature_torso(spec: EnvSpec, kind: str, convs: Sequence[Sequence[int]] = NATURE_CONVS,
                 hidden: int | Sequence[int] = 512, scale: float = 255.0) -> PixelTorso:
    shape = _pixel_shape(spec, kind)
    layers: list[nn.Module] = []
    channels = shape[0]
    for conv in convs:
        if len(conv) != 3:
            raise ValueError(f"model {kind}: each of `convs` is [channels, kernel, stride], "
                             f"not {list(conv)}")
        out, kernel, stride = (int(v) for v in conv)
        layers += [nn.Conv2d(channels, out, kernel, stride), nn.ReLU()]
        channels = out
    return PixelTorso(nn.Sequential(*layers, nn.Flatten()), shape, hidden, scale, kind)


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convs keeping the size (IMPALA's block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def impala_torso(spec: EnvSpec, kind: str, channels: Sequence[int] = IMPALA_CHANNELS,
                 blocks: int = 2, hidden: int | Sequence[int] = 256, scale: float = 255.0
                 ) -> PixelTorso:
    shape = _pixel_shape(spec, kind)
    layers: list[nn.Module] = []
    n_in = shape[0]
    for out in channels:
        layers += [nn.Conv2d(n_in, int(out), 3, padding=1),
                   nn.MaxPool2d(3, stride=2, padding=1),
                   *(ResidualBlock(int(out)) for _ in range(blocks))]
        n_in = int(out)
    convs = nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
    return PixelTorso(convs, shape, hidden, scale, kind)


TORSOS = {"nature": nature_torso, "impala": impala_torso}


def _torso(name: str, spec: EnvSpec, kind: str, options: dict) -> PixelTorso:
    if name not in TORSOS:
        raise ValueError(f"model {kind}: unknown torso {name!r} (known: {', '.join(TORSOS)})")
    return TORSOS[name](spec, kind, **options)


def _orthogonal(module: nn.Module, gain: float) -> None:
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


class ConvActorCritic(nn.Module):
    """Kinds ``nature_cnn``, ``impala_cnn``: a shared conv torso, a policy head (logits)
    and a value head. Discrete actions. The API of ``ActorCritic``: ``forward``,
    ``evaluate`` (learner), ``act`` (behaviour), ``state_values`` (bootstraps)."""

    interface = "actor_critic"  # what it provides (zmqrl.parts.models: algo configs need one)

    def __init__(self, spec: EnvSpec, torso: str = "nature", **options):
        super().__init__()
        kind = f"{torso}_cnn"
        if spec.num_actions is None:
            raise ValueError(f"model {kind} needs a discrete action space")
        self.torso = _torso(torso, spec, kind, options)
        self.policy = nn.Linear(self.torso.features, spec.num_actions)
        self.value = nn.Linear(self.torso.features, 1)
        # CleanRL's Atari init: orthogonal, sqrt(2) in the torso, a near-uniform policy.
        _orthogonal(self.torso, 2**0.5)
        _orthogonal(self.policy, 0.01)
        _orthogonal(self.value, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [N, A] and values [N] for observations [N, C, H, W]."""
        h = self.torso(obs)
        return self.policy(h), self.value(h).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(action | obs) [N], policy entropy [N] and V(obs) [N], with autograd."""
        logits, values = self(obs)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return logp, -(logp_all.exp() * logp_all).sum(-1), values

    @torch.inference_mode()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled actions int64 [N] and their log-probabilities [N]."""
        logp_all = torch.log_softmax(self.policy(self.torso(obs)), dim=-1)
        action = sample_categorical(logp_all)  # torch.distributions: ~30 us slower
        return action.squeeze(-1), logp_all.gather(-1, action).squeeze(-1)

    @torch.inference_mode()
    def state_values(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) [N]: what a time-limit truncation bootstraps from."""
        return self.value(self.torso(obs)).squeeze(-1)


class ConvDuelingQNetwork(nn.Module):
    """Kinds ``dueling_nature_cnn``, ``dueling_impala_cnn``: a conv torso and a dueling
    head, Q = V + A - mean_a A (Wang et al. 2016). The API of ``DuelingQNetwork``."""

    interface = "q"  # what it provides (zmqrl.parts.models: algo configs need one)

    def __init__(self, spec: EnvSpec, torso: str = "nature", **options):
        super().__init__()
        kind = f"dueling_{torso}_cnn"
        num_actions = discrete_actions(spec, kind)
        self.torso = _torso(torso, spec, kind, options)
        self.value = nn.Linear(self.torso.features, 1)
        self.advantage = nn.Linear(self.torso.features, num_actions)
        init_dueling(self.torso, self.value, self.advantage)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [N, A] for observations [N, C, H, W]."""
        return dueling_q(self.torso(obs), self.value, self.advantage)

    @torch.inference_mode()
    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


class ConvLSTMActorCritic(LSTMActorCritic):
    """Kinds ``nature_cnn_lstm``, ``impala_cnn_lstm``: conv torso -> LSTM -> policy and
    value (the recurrent actor-critic API: ``step``, ``step_values``, ``unroll``)."""

    def __init__(self, spec: EnvSpec, torso: str = "nature", lstm: int = 256,
                 log_std_init: float = 0.0, **options):
        body = _torso(torso, spec, f"{torso}_cnn_lstm", options)
        super().__init__(spec, body, body.features, lstm, log_std_init)


class ConvLSTMQNetwork(LSTMQNetwork):
    """Kinds ``nature_cnn_lstm_q``, ``impala_cnn_lstm_q``: R2D2's network on pixels,
    conv torso -> LSTM -> dueling Q."""

    def __init__(self, spec: EnvSpec, torso: str = "nature", lstm: int = 256, **options):
        kind = f"{torso}_cnn_lstm_q"
        body = _torso(torso, spec, kind, options)
        super().__init__(spec, kind, body, body.features, lstm)



def _on_torso(cls: type[nn.Module], torso: str, interface: str) -> Callable[..., nn.Module]:
    """``cls`` with its torso fixed by the kind's name (not an option of the YAML)."""
    def make(spec: EnvSpec, **options: Any) -> nn.Module:
        if "torso" in options:
            raise ValueError("the torso is part of the kind (nature_cnn, impala_cnn, ...); "
                             "drop the option 'torso'")
        return cls(spec, torso=torso, **options)
    make.interface = interface  # type: ignore[attr-defined]  (see zmqrl.parts.models)
    return make


# The model kinds on each torso: entry points of zmqrl's pyproject.toml (group zmqrl.models).
nature_cnn = _on_torso(ConvActorCritic, "nature", "actor_critic")
impala_cnn = _on_torso(ConvActorCritic, "impala", "actor_critic")
nature_cnn_lstm = _on_torso(ConvLSTMActorCritic, "nature", "actor_critic")
impala_cnn_lstm = _on_torso(ConvLSTMActorCritic, "impala", "actor_critic")
dueling_nature_cnn = _on_torso(ConvDuelingQNetwork, "nature", "q")
dueling_impala_cnn = _on_torso(ConvDuelingQNetwork, "impala", "q")
nature_cnn_lstm_q = _on_torso(ConvLSTMQNetwork, "nature", "recurrent_q")
impala_cnn_lstm_q = _on_torso(ConvLSTMQNetwork, "impala", "recurrent_q")
