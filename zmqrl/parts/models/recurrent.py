"""The LSTM core that resets at episode starts, shared by the recurrent networks built
on it: R2D2's Q-network (``zmqrl.parts.r2d2.models``) and the recurrent actor-critic
(``zmqrl.parts.actor_critic.models``), each over any torso.

Time-major throughout: inputs are [T, B, ...] with ``first`` [T, B] marking the
observations that start an episode, and the recurrent state is a pair (h, c) of
[B, size] tensors carried between calls.
"""

from __future__ import annotations

import torch
from torch import nn

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

