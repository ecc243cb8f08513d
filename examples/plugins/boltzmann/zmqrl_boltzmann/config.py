"""The ``boltzmann_q`` algorithm: its hyperparameters and its parts. Imports no torch:
every node reads the config, and nodes that run no model must not load torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zmqrl.parts.algo_config import AlgoConfig


@dataclass
class BoltzmannQConfig(AlgoConfig):
    """Expected SARSA with a Boltzmann policy (the topology's ``algo`` section)."""

    kind: str = "boltzmann_q"
    family: ClassVar[str] = "replay"
    # The parts, by registered name or import path: this plug-in's learner, behaviour
    # and model interface; zmqrl's replay and its n-step transitions.
    learner: ClassVar[str] = "zmqrl_boltzmann.learner:ExpectedSarsaLearner"
    items: ClassVar[str] = "transitions"
    behaviour: ClassVar[str] = "boltzmann"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "q"

    batch_size: int = 64
    lr: float = 1e-3
    discount: float = 0.99
    n_step: int = 3
    temperature: float = 0.1  # of the acting policy and of the targets' expectation
    target_update_every: int = 100
    max_grad_norm: float = 10.0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"algo.temperature: {self.temperature!r}: must be > 0")
