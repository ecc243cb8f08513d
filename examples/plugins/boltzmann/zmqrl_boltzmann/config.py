"""The ``boltzmann_q`` algorithm: its hyperparameters and its parts. Imports no torch:
every node reads the config, and nodes that run no model must not load torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zmqrl.parts.algo_config import AlgoConfig
from zmqrl.parts.bounds import ranged


@dataclass
class BoltzmannQConfig(AlgoConfig):
    """Expected SARSA with a Boltzmann policy (the topology's ``algo`` section)."""

    kind: str = "boltzmann_q"
    # The parts, by registered name or import path: this plug-in's learner, behaviour
    # and model interface; zmqrl's replay and its n-step transitions.
    learner: ClassVar[str] = "zmqrl_boltzmann.learner:ExpectedSarsaLearner"
    items: ClassVar[str] = "transitions"
    behaviour: ClassVar[str] = "boltzmann"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "q"

    # Each number's range next to its default: `zmqrl validate` names a field out of it,
    # a config built with one raises, and PBT perturbs within it (zmqrl.parts.bounds).
    batch_size: int = ranged(64, ge=1)
    lr: float = ranged(1e-3, gt=0)
    discount: float = ranged(0.99, ge=0, le=1)
    n_step: int = ranged(3, ge=1)
    # of the acting policy and of the targets' expectation
    temperature: float = ranged(0.1, gt=0, why="the policy divides Q by it")
    target_update_every: int = ranged(100, ge=1)
    max_grad_norm: float = ranged(10.0, gt=0)
