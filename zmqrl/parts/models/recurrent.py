"""Recurrent networks: an LSTM core that resets at episode starts, and the R2D2
Q-network and the recurrent actor-critic (V-trace/A2C unrolls) built on it, each over
any torso (``LSTMQNetwork``, ``LSTMActorCritic``; the MLP ones here, conv ones in
``zmqrl.parts.models.conv``).

Time-major throughout: inputs are [T, B, ...] with ``first`` [T, B] marking the
observations that start an episode, and the recurrent state is a pair (h, c) of
[B, size] tensors carried between calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.feedforward import (
    HALF_LOG_2PI,
    discrete_actions,
    dueling_q,
    init_dueling,
    relu_torso,
    sample_categorical,
)

State = tuple[torch.Tensor, torch.Tensor]


def reset_state(state: State, first: torch.Tensor) -> State:
    """``state`` (h, c) [N, H] zeroed where ``first`` [N]: the state an observation that
    starts an episode is acted on with (new tensors; the input is left alone)."""
    keep = (~first.bool()).unsqueeze(-1).to(state[0].dtype)
    return state[0] * keep, state[1] * keep


class LSTMCore(nn.Module):
    """One LSTM layer over [T, B, F] that zeroes its state where an episode starts.

    Generic: any head (a policy, a value, a Q-function) can sit on its output. The
    state is reset *before* step t wherever ``first[t]``, so a sequence may cross
    episode ends (SAME_STEP autoreset) and still never carry memory from one episode
    into the next.
    """

    def __init__(self, in_features: int, size: int):
        super().__init__()
        self.size = size
        # An LSTMCell looped over T: the reset between steps is what nn.LSTM cannot
        # do, and T is short (a replayed sequence, or 1 while acting).
        self.cell = nn.LSTMCell(in_features, size)

    def initial_state(self, n: int, device: torch.device | str | None = None) -> State:
        zeros = torch.zeros(n, self.size, device=device)
        return zeros, zeros.clone()

    def forward(self, x: torch.Tensor, first: torch.Tensor, state: State
                ) -> tuple[torch.Tensor, State]:
        """Outputs [T, B, size] and the state after the last step."""
        h, c = state
        keep = (~first.bool()).unsqueeze(-1).to(x.dtype)  # [T, B, 1]: 0 where reset
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h * keep[t], c * keep[t]))
            outs.append(h)
        return torch.stack(outs), (h, c)


class LSTMQNetwork(nn.Module):
    """R2D2's Q-network over any torso: the torso's features per observation, an
    :class:`LSTMCore`, then a dueling head Q = V + A - mean_a A (Wang et al. 2016).
    Discrete actions only. Subclasses build the torso (an MLP here, a conv net in
    ``zmqrl.parts.models.conv``) and say in :meth:`encode` how it reads observations."""

    interface = "recurrent_q"  # what it provides (zmqrl.parts.models: algo configs need one)

    recurrent = True  # nodes and learners check getattr(model, "recurrent", False)

    def __init__(self, spec: EnvSpec, kind: str, torso: nn.Module, features: int, lstm: int):
        super().__init__()
        num_actions = discrete_actions(spec, kind)
        self.torso = torso
        self.core = LSTMCore(features, lstm)
        self.value = nn.Linear(lstm, 1)
        self.advantage = nn.Linear(lstm, num_actions)
        self.state_size = lstm
        init_dueling(self.torso, self.value, self.advantage)  # the LSTM keeps torch's

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Torso features [N, F] of observations [N, ...] (in the env's dtype)."""
        return self.torso(obs)

    def initial_state(self, n: int, device: torch.device | str | None = None) -> State:
        return self.core.initial_state(n, device)

    def forward(self, obs: torch.Tensor, first: torch.Tensor, state: State
                ) -> tuple[torch.Tensor, State]:
        """Q-values [T, B, A] for observations [T, B, ...], and the final state."""
        T, B = obs.shape[:2]
        x = self.encode(obs.reshape(T * B, *obs.shape[2:])).reshape(T, B, -1)  # one pass
        out, state = self.core(x, first, state)
        return dueling_q(out, self.value, self.advantage), state

    @torch.inference_mode()
    def step(self, obs: torch.Tensor, first: torch.Tensor, state: State
             ) -> tuple[torch.Tensor, State]:
        """One acting step: Q-values [B, A] for observations [B, ...] and the next state."""
        q, state = self(obs.unsqueeze(0), first.unsqueeze(0), state)
        return q[0], state


class RecurrentQNetwork(LSTMQNetwork):
    """R2D2's Q-network (model kind ``lstm_q``): a ReLU MLP torso over the flat
    observation (``hidden`` may be empty), the LSTM core and the dueling head."""

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (64,), lstm: int = 64):
        torso, features = relu_torso(spec, hidden)
        super().__init__(spec, "lstm_q", torso, features, lstm)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.torso(obs.reshape(obs.shape[0], -1).float())


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
