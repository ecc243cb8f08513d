"""The convolutional torsos over pixel observations [C, H, W] (Atari, MinAtar).

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

The heads on either torso are each algorithm family's (model kinds registered in the
``zmqrl.models`` entry points): ``nature_cnn``, ``impala_cnn`` and their ``_lstm`` kinds in
``zmqrl.parts.actor_critic.models``; ``dueling_nature_cnn``, ``dueling_impala_cnn`` in
``zmqrl.parts.dqn.models``; ``nature_cnn_lstm_q``, ``impala_cnn_lstm_q`` in
``zmqrl.parts.r2d2.models``. Each builds its torso with :func:`make_torso` and its
kinds with :func:`on_torso`, as a plug-in's pixel model can.

Options: the torso's (above, and ``hidden``, ``scale``) and, for the LSTM kinds,
``lstm`` (the core's size, 256 by default as in IMPALA and R2D2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec

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


def make_torso(name: str, spec: EnvSpec, kind: str, options: dict) -> PixelTorso:
    if name not in TORSOS:
        raise ValueError(f"model {kind}: unknown torso {name!r} (known: {', '.join(TORSOS)})")
    return TORSOS[name](spec, kind, **options)


def orthogonal_init(module: nn.Module, gain: float) -> None:
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


def on_torso(cls: type[nn.Module], torso: str, interface: str) -> Callable[..., nn.Module]:
    """``cls`` with its torso fixed by the kind's name (not an option of the YAML)."""
    def make(spec: EnvSpec, **options: Any) -> nn.Module:
        if "torso" in options:
            raise ValueError("the torso is part of the kind (nature_cnn, impala_cnn, ...); "
                             "drop the option 'torso'")
        return cls(spec, torso=torso, **options)
    make.interface = interface  # type: ignore[attr-defined]  (see zmqrl.parts.models)
    return make

