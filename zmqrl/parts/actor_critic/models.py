"""The actor-critic networks (model interface ``actor_critic``): a policy and a value
over a flat observation (``mlp``), over pixels (``nature_cnn``, ``impala_cnn``) and with
an LSTM core between torso and heads (``lstm_ac``, ``nature_cnn_lstm``,
``impala_cnn_lstm``). The torsos and the LSTM core are shared pieces
(``zmqrl.parts.models``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.conv import make_torso, on_torso, orthogonal_init
from zmqrl.parts.models.feedforward import (
    HALF_LOG_2PI,
    LOG_2,
    LOG_STD_MAX,
    LOG_STD_MIN,
    TANH_EPS,
    as_float,
    init_orthogonal,
    mlp,
    sample_categorical,
)
from zmqrl.parts.models.normalization import RunningNorm
from zmqrl.parts.models.recurrent import LSTMCore, State


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
            init_orthogonal(self.policy, 0.01)
            init_orthogonal(self.value, 1.0)
            return

        self.action_dim = int(np.prod(spec.action_shape)) if spec.action_shape else 1
        self.action_shape = tuple(spec.action_shape)
        self.learned_std = log_std == "learned"
        self.squash = squash
        outputs = 2 * self.action_dim if self.learned_std else self.action_dim
        self.policy = mlp([obs_dim, *hidden, outputs])
        self.value = mlp([obs_dim, *hidden, 1])
        init_orthogonal(self.policy, 0.01)
        init_orthogonal(self.value, 1.0)
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

    def surgery_chains(self) -> list:
        """How surgery carries trained parameters into a changed ActorCritic
        (zmqrl.parts.surgery): the policy and value MLPs, tanh between layers."""
        from zmqrl.parts.surgery.net2net import mlp_chains

        return mlp_chains(self, {"policy": "logits" if self.discrete else "features",
                                 "value": "value"}, "tanh")

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


class LSTMActorCritic(nn.Module):
    """A recurrent actor-critic over any torso: the torso's features per observation, an
    :class:`LSTMCore`, then a policy head and a value head on the LSTM output.
    Subclasses build the torso (an MLP here, a conv net in ``zmqrl.parts.models.conv``) and
    say in :meth:`encode` how it reads observations.

    Discrete actions (``spec.num_actions`` set): the policy head outputs logits
    (``log_std_init`` is ignored). Box actions: a diagonal Gaussian whose mean the
    policy head outputs, with a state-independent learned log-std (initialised to
    ``log_std_init``). The action is the raw Gaussian sample, as ``ActorCritic``'s
    ``squash: clip``: whoever steps the env clips it to the bounds.

    API: ``initial_state`` and ``step`` / ``step_values`` (acting, one step of N envs,
    under inference mode) and ``unroll`` (learner: a time-major unroll from its stored
    initial state, with autograd). ``recurrent = True`` tells nodes and
    ``evaluate_unrolls`` to carry the state; there is no ``act``/``evaluate``/
    ``state_values``, so a stateless caller fails loudly rather than silently acting
    without memory.
    """

    interface = "actor_critic"  # what it provides (zmqrl.parts.models: algo configs need one)

    recurrent = True

    def __init__(self, spec: EnvSpec, torso: nn.Module, features: int, lstm: int,
                 log_std_init: float = 0.0):
        super().__init__()
        self.torso = torso
        self.core = LSTMCore(features, lstm)
        self.state_size = lstm
        self.discrete = spec.num_actions is not None
        if self.discrete:
            outputs = spec.num_actions
        else:
            self.action_shape = tuple(spec.action_shape)
            self.action_dim = int(np.prod(spec.action_shape)) if spec.action_shape else 1
            outputs = self.action_dim
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(log_std_init)))
        self.policy = nn.Linear(lstm, outputs)
        self.value = nn.Linear(lstm, 1)
        # As ActorCritic: orthogonal init and a small policy layer, so the first policy
        # is close to uniform (or to a zero-mean Gaussian); the LSTM keeps torch's default.
        for layer in self.torso.modules():
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(layer.weight, 2**0.5)
                nn.init.zeros_(layer.bias)
        for head, gain in ((self.policy, 0.01), (self.value, 1.0)):
            nn.init.orthogonal_(head.weight, gain)
            nn.init.zeros_(head.bias)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Torso features [N, F] of observations [N, ...] (in the env's dtype)."""
        return self.torso(obs)

    def initial_state(self, n: int, device: torch.device | str | None = None) -> State:
        return self.core.initial_state(n, device)

    def forward(self, obs: torch.Tensor, first: torch.Tensor, state: State
                ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """Logits (discrete) or Gaussian means (Box) [T, B, A], values [T, B] for
        observations [T, B, ...] with ``first`` [T, B], and the state after the last
        step."""
        T, B = obs.shape[:2]
        x = self.encode(obs.reshape(T * B, *obs.shape[2:])).reshape(T, B, -1)  # one pass
        out, state = self.core(x, first, state)
        return self.policy(out), self.value(out).squeeze(-1), state

    def _logp_entropy(self, head: torch.Tensor, action: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(action) and the entropy, [...] for head outputs [..., A] and actions
        [...] (discrete) or [..., *action_shape] (Box). Written out rather than through
        torch.distributions, whose argument validation costs ~30 us per call."""
        if self.discrete:
            logp_all = torch.log_softmax(head, dim=-1)
            logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            return logp, -(logp_all.exp() * logp_all).sum(-1)
        lead = head.shape[:-1]
        action = action.reshape(*lead, self.action_dim).to(head.dtype)
        log_std = self.log_std.expand_as(head)
        z = (action - head) * torch.exp(-log_std)
        logp = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)
        return logp, (0.5 + HALF_LOG_2PI + log_std).sum(-1)

    @torch.inference_mode()
    def step(self, obs: torch.Tensor, first: torch.Tensor, state: State
             ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One acting step of N envs: sampled actions, int64 [N] (discrete) or float32
        [N, *action_shape] (Box), their log-probs [N] float32, and the state after
        ``obs`` [N, ...]. The state is zeroed where ``first`` [N] before the step."""
        head, _, state = self(obs.unsqueeze(0), first.unsqueeze(0), state)
        head = head[0]
        if self.discrete:
            # Direct sampling: torch.distributions costs ~30 us of argument checks per call.
            logp_all = torch.log_softmax(head, dim=-1)
            action = sample_categorical(logp_all)
            return action.squeeze(-1), logp_all.gather(-1, action).squeeze(-1).float(), state
        u = head + torch.exp(self.log_std) * torch.randn_like(head)
        logp, _ = self._logp_entropy(head, u)
        return u.float().reshape(-1, *self.action_shape), logp.float(), state

    @torch.inference_mode()
    def step_values(self, obs: torch.Tensor, first: torch.Tensor, state: State
                    ) -> torch.Tensor:
        """V(obs) [N] from ``state`` (zeroed where ``first``), e.g. a truncated episode's
        final observation with the state after its last step and ``first`` all False.
        The caller's state is not changed (the next state is dropped)."""
        _, values, _ = self(obs.unsqueeze(0), first.unsqueeze(0), state)
        return values[0]

    def unroll(self, obs: torch.Tensor, first: torch.Tensor, state: State,
               action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The current policy along an unroll, with autograd: obs [T+1, B, ...] and
        ``first`` [T+1, B] (state zeroed before step t where set), the state (h, c)
        [B, H] to use with obs[0], actions [T, B] or [T, B, *action_shape]. Returns
        log-probs of the actions [T, B], policy entropy [T, B] and values [T+1, B]; as in
        ``evaluate_unrolls``, the last row (the bootstrap) is a constant (detached)."""
        T = action.shape[0]
        head, values, _ = self(obs, first, state)
        logp, entropy = self._logp_entropy(head[:T], action)
        values = torch.cat([values[:T], values[T:].detach()])
        return logp, entropy, values


class RecurrentActorCritic(LSTMActorCritic):
    """Recurrent actor-critic (model kind ``lstm_ac``): a tanh MLP torso over the flat
    observation (``hidden`` may be empty: the LSTM reads the observation), the LSTM core
    and the heads of :class:`LSTMActorCritic`. ``log_std`` takes only
    ``"state_independent"``; the option is there so that configs read as ``mlp``'s."""

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (64,), lstm: int = 64,
                 log_std: str = "state_independent", log_std_init: float = 0.0):
        if log_std != "state_independent":
            raise ValueError(f"model lstm_ac: log_std must be 'state_independent', "
                             f"not {log_std!r}")
        obs_dim = int(np.prod(spec.obs_shape)) if spec.obs_shape else 1
        layers: list[nn.Module] = []
        sizes = [obs_dim, *hidden]
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(n_in, n_out), nn.Tanh()]
        super().__init__(spec, nn.Sequential(*layers), sizes[-1], lstm, log_std_init)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.torso(obs.reshape(obs.shape[0], -1).float())

    def surgery_chains(self) -> list:
        """How surgery carries trained parameters into a changed lstm_ac
        (zmqrl.parts.surgery): the tanh torso, then the heads on the LSTM (kept as it is)."""
        from zmqrl.parts.surgery.net2net import recurrent_chains

        return recurrent_chains(self, {"policy": "logits" if self.discrete else "features",
                                       "value": "value"}, "tanh")


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
        self.torso = make_torso(torso, spec, kind, options)
        self.policy = nn.Linear(self.torso.features, spec.num_actions)
        self.value = nn.Linear(self.torso.features, 1)
        # CleanRL's Atari init: orthogonal, sqrt(2) in the torso, a near-uniform policy.
        orthogonal_init(self.torso, 2**0.5)
        orthogonal_init(self.policy, 0.01)
        orthogonal_init(self.value, 1.0)

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


class ConvLSTMActorCritic(LSTMActorCritic):
    """Kinds ``nature_cnn_lstm``, ``impala_cnn_lstm``: conv torso -> LSTM -> policy and
    value (the recurrent actor-critic API: ``step``, ``step_values``, ``unroll``)."""

    def __init__(self, spec: EnvSpec, torso: str = "nature", lstm: int = 256,
                 log_std_init: float = 0.0, **options):
        body = make_torso(torso, spec, f"{torso}_cnn_lstm", options)
        super().__init__(spec, body, body.features, lstm, log_std_init)


# The model kinds on each torso: entry points of zmqrl's pyproject.toml (group zmqrl.models).
nature_cnn = on_torso(ConvActorCritic, "nature", "actor_critic")


impala_cnn = on_torso(ConvActorCritic, "impala", "actor_critic")


nature_cnn_lstm = on_torso(ConvLSTMActorCritic, "nature", "actor_critic")


impala_cnn_lstm = on_torso(ConvLSTMActorCritic, "impala", "actor_critic")
