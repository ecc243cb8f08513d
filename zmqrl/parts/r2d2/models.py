"""R2D2's networks (model interface ``recurrent_q``): torso -> LSTM -> dueling Q, over a
flat observation (``lstm_q``) and over pixels (``nature_cnn_lstm_q``,
``impala_cnn_lstm_q``). The LSTM core and the torsos are shared pieces
(``zmqrl.parts.models``), the dueling head is DQN's."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zmqrl.parts.dqn.models import dueling_q, init_dueling
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models.conv import make_torso, on_torso
from zmqrl.parts.models.feedforward import discrete_actions, relu_torso
from zmqrl.parts.models.recurrent import LSTMCore, State


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

    def surgery_chains(self) -> list:
        """How surgery carries trained parameters into a changed lstm_q
        (zmqrl.parts.surgery): the ReLU torso, then the dueling heads on the LSTM (kept
        as it is)."""
        from zmqrl.parts.surgery.net2net import recurrent_chains

        return recurrent_chains(self, {"value": "value", "advantage": "advantage"}, "relu")


class ConvLSTMQNetwork(LSTMQNetwork):
    """Kinds ``nature_cnn_lstm_q``, ``impala_cnn_lstm_q``: R2D2's network on pixels,
    conv torso -> LSTM -> dueling Q."""

    def __init__(self, spec: EnvSpec, torso: str = "nature", lstm: int = 256, **options):
        kind = f"{torso}_cnn_lstm_q"
        body = make_torso(torso, spec, kind, options)
        super().__init__(spec, kind, body, body.features, lstm)


nature_cnn_lstm_q = on_torso(ConvLSTMQNetwork, "nature", "recurrent_q")


impala_cnn_lstm_q = on_torso(ConvLSTMQNetwork, "impala", "recurrent_q")
