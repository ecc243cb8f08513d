"""R2D2's hyperparameters (a topology's ``algo`` section) and the parts it is made of
(recurrent Q-learning on stored sequences). No torch here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from zmqrl.parts import bounds
from zmqrl.parts.algo_config import SEQUENCE, AlgoConfig
from zmqrl.parts.bounds import ranged


@dataclass
class R2D2Config(AlgoConfig):
    """Hyperparameters of R2D2 (the topology's ``algo`` section)."""

    kind: str = "r2d2"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "batch_size", "max_grad_norm", "target_update_every"})
    family: ClassVar[str] = SEQUENCE
    learner: ClassVar[str] = "zmqrl.parts.r2d2.learner:R2D2Learner"
    items: ClassVar[str] = "sequences"
    behaviour: ClassVar[str] = "recurrent_q"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "recurrent_q"
    # L: transitions per replayed sequence (each item also holds obs L to bootstrap).
    sequence_length: int = ranged(40, ge=1)
    # Leading steps of a sequence that only warm the recurrent state up from the stored
    # state (no loss, no priority, no gradient). With overlap >= burn_in every step is
    # in the learning part of some sequence. (< sequence_length: cross_field_errors)
    burn_in: int = ranged(10, ge=0)
    # Steps shared by consecutive sequences of an env: a sequence starts every
    # sequence_length - overlap steps. (< sequence_length: cross_field_errors)
    overlap: int = ranged(20, ge=0)
    batch_size: int = ranged(32, ge=1)  # sequences sampled from replay per update
    lr: float = ranged(1e-3, gt=0)  # Adam
    adam_eps: float = ranged(1e-3, gt=0)
    discount: float = ranged(0.99, ge=0, le=1)
    # rewards summed before bootstrapping (fewer at a sequence's end)
    n_step: int = ranged(5, ge=1)
    # priority = eta * max |td| + (1 - eta) * mean |td| over a sequence
    eta: float = ranged(0.9, ge=0, le=1)
    # the eps of the value rescaling h
    rescale_eps: float = ranged(1e-3, gt=0,
                                why="the inverse of the value rescaling divides by it")
    target_update_every: int = ranged(200, ge=1)  # updates between hard copies online -> target
    max_grad_norm: float = ranged(40.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False

    def items_per_env_step(self) -> int:
        return 1  # at most one sequence per env completes in a step

    @classmethod
    def cross_field_errors(cls, v: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Burn-in and overlap must leave room in a sequence."""
        if not all(bounds.is_number(v[k]) for k in ("sequence_length", "burn_in", "overlap")):
            return []
        length = v["sequence_length"]
        errors = []
        if v["burn_in"] >= length >= 1:
            errors.append(("burn_in", f"{v['burn_in']!r}: must be >= 0 and < sequence_length "
                                      f"({length}): at least one step of each sequence must "
                                      "be learned on"))
        if v["overlap"] >= length >= 1:
            errors.append(("overlap", f"{v['overlap']!r}: must be >= 0 and < sequence_length "
                                      f"({length}): a sequence starts every sequence_length "
                                      "- overlap steps"))
        return errors
