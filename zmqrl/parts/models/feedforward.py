"""Feed-forward networks over a flat observation: the actor-critic MLP (discrete or
Gaussian policy) and the dueling Q-network."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.normalization import RunningNorm

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # range of a learned (state-dependent) log-std
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
LOG_2 = math.log(2.0)
# tanh squash: actions are mapped back into [-1 + eps, 1 - eps] before atanh. 1e-6 is
# representable next to 1 in float32 (spacing 6e-8) and keeps |u| <= 7.25.
TANH_EPS = 1e-6


def as_float(obs: torch.Tensor) -> torch.Tensor:
    """Observations come in the env's dtype: integer ones (uint8) become float32, floats
    stay as they are (a float64 model keeps its precision)."""
    return obs if obs.is_floating_point() else obs.float()


def sample_categorical(logp_all: torch.Tensor) -> torch.Tensor:
    """One action per row of log-probabilities [N, A], as int64 [N, 1]: Gumbel-max,
    argmax(logp - log E) with E ~ Exp(1). The same distribution as ``torch.multinomial``
    at under half its cost on an acting batch (8 against 19 us for [64, 2] here), which
    every inference step pays. E stays above 0: log 0 would turn a masked (-inf) logit
    into NaN, and argmax would pick it."""
    e = torch.empty_like(logp_all).exponential_().clamp_(min=torch.finfo(logp_all.dtype).tiny)
    return (logp_all - e.log()).argmax(-1, keepdim=True)


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
    """Separate policy and value MLPs over a flat observation.

    Discrete actions (``spec.num_actions`` set): the policy MLP outputs logits
    (``log_std``, ``log_std_init`` and ``squash`` are ignored).

    Box actions: a diagonal Gaussian whose mean the policy MLP outputs. ``log_std``:
    ``"state_independent"`` (one learned parameter per action dimension, initialised to
    ``log_std_init``, as in CleanRL/PPO) or ``"learned"`` (the policy's last layer has
    2A outputs, mean and log-std; the log-std half starts at ``log_std_init`` and is
    clamped to [-20, 2]). ``squash``:

    * ``"clip"``: the action is the raw Gaussian sample u and its log-prob is the
      Gaussian's; whoever steps the env clips it to the bounds (the learner must see the
      unclipped sample, or the log-probs would be wrong).
    * ``"tanh"``: the action is ``low + (tanh(u) + 1) / 2 * (high - low)``, always inside
      the bounds; its log-prob is the Gaussian's minus log |da/du| (change of variables).

    ``obs_norm``: a :class:`RunningNorm` in front of both MLPs (attribute ``obs_norm``,
    None when off); learners update it, its statistics travel in ``state_dict``.

    The API every actor-critic algorithm and node uses: ``act`` (behaviour),
    ``evaluate`` (learner), ``state_values`` (bootstrap of truncated episodes), and
    ``forward`` (logits or Gaussian mean, and values).
    """

    interface = "actor_critic"  # what it provides (zmqrl.parts.models: algo configs need one)

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (64, 64),
                 log_std: str = "state_independent", log_std_init: float = 0.0,
                 squash: str = "clip", obs_norm: bool = False):
        hidden = list(hidden)
        super().__init__()
        if log_std not in ("state_independent", "learned"):
            raise ValueError(f"log_std must be 'state_independent' or 'learned', not {log_std!r}")
        if squash not in ("clip", "tanh"):
            raise ValueError(f"squash must be 'clip' or 'tanh', not {squash!r}")
        obs_dim = int(torch.tensor(spec.obs_shape).prod()) if spec.obs_shape else 1
        # No parameters and no random draws: discrete models stay bit-for-bit as before.
        self.obs_norm = RunningNorm(obs_dim) if obs_norm else None
        self.discrete = spec.num_actions is not None
        if self.discrete:
            self.policy = mlp([obs_dim, *hidden, spec.num_actions])
            self.value = mlp([obs_dim, *hidden, 1])
            _init(self.policy, 0.01)
            _init(self.value, 1.0)
            return

        self.action_dim = int(np.prod(spec.action_shape)) if spec.action_shape else 1
        self.action_shape = tuple(spec.action_shape)
        self.learned_std = log_std == "learned"
        self.squash = squash
        outputs = 2 * self.action_dim if self.learned_std else self.action_dim
        self.policy = mlp([obs_dim, *hidden, outputs])
        self.value = mlp([obs_dim, *hidden, 1])
        _init(self.policy, 0.01)
        _init(self.value, 1.0)
        if self.learned_std:
            with torch.no_grad():
                self.policy[-1].bias[self.action_dim:] = log_std_init
        else:
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(log_std_init)))
        if squash == "tanh":
            low = np.asarray(spec.action_low, np.float32).reshape(-1)
            high = np.asarray(spec.action_high, np.float32).reshape(-1)
            if not (np.isfinite(low).all() and np.isfinite(high).all()) or (high <= low).any():
                raise ValueError("squash 'tanh' needs finite action bounds with low < high")
            # Not persistent: derived from the env spec on every side, not parameters
            # to ship; buffers so that .to(device) moves them.
            self.register_buffer("action_low", torch.from_numpy(low), persistent=False)
            self.register_buffer("action_high", torch.from_numpy(high), persistent=False)
            self.register_buffer("action_center", torch.from_numpy((high + low) / 2),
                                 persistent=False)
            self.register_buffer("action_half", torch.from_numpy((high - low) / 2),
                                 persistent=False)

    # ----- shared pieces ---------------------------------------------------------------
    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        flat = as_float(obs.reshape(obs.shape[0], -1))
        return flat if self.obs_norm is None else self.obs_norm(flat)

    def _logits(self, obs: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Discrete policy logits [N, A] (a subclass may mask them by the observation)."""
        return self.policy(features)

    def _gaussian(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-std [N, A]."""
        out = self.policy(features)
        if self.learned_std:
            mean, log_std = out.split(self.action_dim, dim=-1)
            return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        return out, self.log_std.expand_as(out)

    def _action_logp(self, action: torch.Tensor, mean: torch.Tensor,
                     log_std: torch.Tensor) -> torch.Tensor:
        """log pi(action) [N] for flat actions [N, A]. Written out rather than through
        torch.distributions, whose argument validation costs ~30 us per call."""
        if self.squash == "tanh":
            # Invert the squash; clamp strictly inside (-1, 1) so atanh stays finite for
            # actions on (or rounded onto) the bounds.
            y = ((action - self.action_center) / self.action_half).clamp(-1 + TANH_EPS,
                                                                        1 - TANH_EPS)
            u = torch.atanh(y)
        else:
            u = action
        z = (u - mean) * torch.exp(-log_std)
        logp = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)
        if self.squash == "tanh":
            # log |da/du| = log(half) + log(1 - tanh(u)^2), the latter in the stable form
            # 2 (log 2 - u - softplus(-2u)) (as torch's TanhTransform).
            log_det = torch.log(self.action_half) + 2 * (LOG_2 - u - F.softplus(-2 * u))
            logp = logp - log_det.sum(-1)
        return logp

    # ----- API -------------------------------------------------------------------------
    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [N, A] (discrete) or the Gaussian mean [N, A] (Box), and values [N],
        for observations [N, ...]."""
        features = self._features(obs)
        values = self.value(features).squeeze(-1)
        if self.discrete:
            return self._logits(obs, features), values
        return self._gaussian(features)[0], values

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(action | obs) [N], policy entropy [N] and V(obs) [N] for observations
        [N, ...] and actions [N] (discrete) or [N, *action_shape] (Box), with autograd."""
        features = self._features(obs)
        values = self.value(features).squeeze(-1)
        if self.discrete:
            logp_all = torch.log_softmax(self._logits(obs, features), dim=-1)
            logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            return logp, entropy, values
        mean, log_std = self._gaussian(features)
        action = action.reshape(action.shape[0], self.action_dim).to(mean.dtype)
        logp = self._action_logp(action, mean, log_std)
        # For tanh squash this is the entropy of the base Gaussian: the squashed
        # distribution's entropy has no closed form. It still rises and falls with the
        # spread, which is what an entropy bonus needs.
        entropy = (0.5 + HALF_LOG_2PI + log_std).sum(-1)
        return logp, entropy, values

    @torch.inference_mode()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions and their log-probabilities (what a behaviour policy needs):
        int64 [N] (discrete) or float32 [N, *action_shape] (Box), and logp [N]."""
        features = self._features(obs)
        if self.discrete:
            # Direct sampling: torch.distributions costs ~30 us of argument checks per call.
            logp_all = torch.log_softmax(self._logits(obs, features), dim=-1)
            action = sample_categorical(logp_all)
            return action.squeeze(-1), logp_all.gather(-1, action).squeeze(-1)
        mean, log_std = self._gaussian(features)
        u = mean + torch.exp(log_std) * torch.randn_like(mean)
        if self.squash == "tanh":
            action = torch.tanh(u) * self.action_half + self.action_center
            action = torch.clamp(action, self.action_low, self.action_high)  # rounding
            # The log-prob of the action as shipped, by the same inversion the learner's
            # evaluate uses: on-policy ratios are then exactly 1 even where tanh saturates.
            logp = self._action_logp(action, mean, log_std)
        else:
            action = u  # raw sample: the env side clips it to the bounds
            logp = self._action_logp(u, mean, log_std)
        return action.float().reshape(-1, *self.action_shape), logp.float()

    @torch.inference_mode()
    def state_values(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) [N]: what a time-limit truncation bootstraps from."""
        return self.value(self._features(obs)).squeeze(-1)


def discrete_actions(spec: EnvSpec, kind: str) -> int:
    """The action count of a Q-network's env; a clear error for Box actions."""
    if spec.num_actions is None:
        raise ValueError(f"model {kind} needs a discrete action space (Q-learning picks "
                         "among actions); use an actor-critic algo for Box actions")
    return spec.num_actions


def relu_torso(spec: EnvSpec, hidden: Sequence[int]) -> tuple[nn.Sequential, int]:
    """A ReLU MLP over the flat observation and its output width (the observation's
    size when ``hidden`` is empty)."""
    obs_dim = int(np.prod(spec.obs_shape)) if spec.obs_shape else 1
    sizes = [obs_dim, *hidden]
    layers: list[nn.Module] = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    return nn.Sequential(*layers), sizes[-1]


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

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [N, A] for observations [N, ...]."""
        flat = as_float(obs.reshape(obs.shape[0], -1))
        return dueling_q(self.torso(flat), self.value, self.advantage)

    @torch.inference_mode()
    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)
