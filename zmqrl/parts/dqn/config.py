"""DQN's hyperparameters (a topology's ``algo`` section) and the parts it is made of
(Ape-X DQN, Gorila: n-step transitions from a prioritized replay). No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zmqrl.parts.algo_config import REPLAY, AlgoConfig
from zmqrl.parts.bounds import ranged


@dataclass
class DQNConfig(AlgoConfig):
    """Hyperparameters of the DQN learner (the topology's ``algo`` section)."""

    kind: str = "dqn"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "batch_size", "double", "huber_delta", "max_grad_norm",
        "target_update_every"})
    family: ClassVar[str] = REPLAY
    learner: ClassVar[str] = "zmqrl.parts.dqn.learner:DQNLearner"
    items: ClassVar[str] = "transitions"
    behaviour: ClassVar[str] = "epsilon_greedy"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "q"
    batch_size: int = ranged(64, ge=1)  # transitions sampled from replay per update
    lr: float = ranged(2.5e-4, gt=0)  # Adam
    discount: float = ranged(0.99, ge=0, le=1)
    # used by actors (NStepAccumulator); the learner reads batch["discount"]
    n_step: int = ranged(3, ge=1)
    target_update_every: int = ranged(100, ge=1)  # updates between hard copies online -> target
    max_grad_norm: float = ranged(10.0, gt=0)
    huber_delta: float = ranged(1.0, gt=0)
    double: bool = True  # double DQN targets; False: max_a Q_target(s', a)
    adam_eps: float = ranged(1.5e-4, gt=0)
