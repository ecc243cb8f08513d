"""Recurrent networks: an LSTM core that resets at episode starts, and the R2D2
Q-network built on it.

Time-major throughout: inputs are [T, B, ...] with ``first`` [T, B] marking the
observations that start an episode, and the recurrent state is a pair (h, c) of
[B, size] tensors carried between calls.
"""

from __future__ import annotations

import torch
from torch import nn

from zmqrl.envs import EnvSpec

State = tuple[torch.Tensor, torch.Tensor]


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


class RecurrentQNetwork(nn.Module):
    """R2D2's Q-network (model kind ``lstm_q``): a ReLU MLP torso over the flat
    observation, an :class:`LSTMCore`, then a dueling head
    Q = V + A - mean_a A (Wang et al. 2016). Discrete actions only."""

    def __init__(self, spec: EnvSpec, hidden: list[int] = (64,), lstm: int = 64):
        hidden = list(hidden)
        super().__init__()
        if spec.num_actions is None:
            raise ValueError("model lstm_q: needs a discrete action space "
                             "(this env's actions are continuous)")
        obs_dim = int(torch.tensor(spec.obs_shape).prod()) if spec.obs_shape else 1
        layers: list[nn.Module] = []
        sizes = [obs_dim, *hidden]  # hidden may be empty: the LSTM reads the obs
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.torso = nn.Sequential(*layers)
        self.core = LSTMCore(hidden[-1] if hidden else obs_dim, lstm)
        self.value = nn.Linear(lstm, 1)
        self.advantage = nn.Linear(lstm, spec.num_actions)
        self.state_size = lstm
        # Same initialisation as DuelingQNetwork; the LSTM keeps torch's default.
        for layer in self.torso:
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, 2**0.5)
                nn.init.zeros_(layer.bias)
        for head in (self.value, self.advantage):
            nn.init.orthogonal_(head.weight, 1.0)
            nn.init.zeros_(head.bias)

    def initial_state(self, n: int, device: torch.device | str | None = None) -> State:
        return self.core.initial_state(n, device)

    def forward(self, obs: torch.Tensor, first: torch.Tensor, state: State
                ) -> tuple[torch.Tensor, State]:
        """Q-values [T, B, A] for observations [T, B, ...], and the final state."""
        T, B = obs.shape[:2]
        x = self.torso(obs.reshape(T * B, -1).float()).reshape(T, B, -1)  # one pass
        out, state = self.core(x, first, state)
        adv = self.advantage(out)
        return self.value(out) + adv - adv.mean(dim=-1, keepdim=True), state

    @torch.inference_mode()
    def step(self, obs: torch.Tensor, first: torch.Tensor, state: State
             ) -> tuple[torch.Tensor, State]:
        """One acting step: Q-values [B, A] for observations [B, ...] and the next state."""
        q, state = self(obs.unsqueeze(0), first.unsqueeze(0), state)
        return q[0], state
