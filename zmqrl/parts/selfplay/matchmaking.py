"""Matchmaking: whom a population member plays next, by rating.

A matchmaker is a part, swapped in YAML like any other (the population broker's
``matchmaker: {kind: close, latest_fraction: 0.5}``): ``kind`` is a short name of the
``zmqrl.matchmakers`` entry-point group or an import path ``module:Name``, the other
keys are the class's fields. It is handed the member whose seat trains (the
``learner``) and every player it may face — every member's current policy (its own
included: plain self-play) and the frozen snapshots of them — each with its rating, and
returns the index of the opponent. It holds no state: the ratings (kept by the league,
updated from every finished game: :mod:`zmqrl.parts.selfplay.ratings`) are its memory,
so a restarted broker matches as well as the one it replaces.

The built-ins share one shape, OpenAI Five's: a ``latest_fraction`` of games against a
current policy, the rest against a past snapshot (when there is none, a current policy;
and the other way round); within the group they differ:

* ``uniform``: uniformly;
* ``close``: weight ``(p (1 - p))^sharpness``, with ``p`` the learner's expected score
  against the candidate (AlphaStar's prioritized fictitious self-play, "variance"
  weighting: even matches teach the most; a hopeless or a won match little);
* ``openai_five``: the current group uniformly, past snapshots weighted by quality, here
  their Bradley-Terry strength ``10^(rating/400)`` (OpenAI Five learned a quality score
  per past version that rose when it beat the latest policy: a stronger version is
  played more often).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from zmqrl.parts.selfplay.elo import expected_score


@dataclass(frozen=True)
class Candidate:
    name: str  # the rating's key: "m2" (current) or "m2@v140" (a snapshot)
    rating: float
    current: bool  # a member's current policy (else a frozen snapshot)


@runtime_checkable
class Matchmaker(Protocol):
    """Picks the opponent of ``learner`` among ``candidates`` (a non-empty sequence):
    the index of the chosen one."""

    def choose(self, learner: Candidate, candidates: Sequence[Candidate],
               rng: np.random.Generator) -> int: ...


@dataclass(frozen=True)
class _Grouped:
    """A ``latest_fraction`` of games against current policies, the rest against
    snapshots; :meth:`weights` ranks within the group drawn."""

    latest_fraction: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.latest_fraction <= 1.0:
            raise ValueError(f"matchmaker: latest_fraction {self.latest_fraction!r} "
                             "must be in [0, 1]")

    def choose(self, learner: Candidate, candidates: Sequence[Candidate],
               rng: np.random.Generator) -> int:
        if not candidates:
            raise ValueError("matchmaker: no candidates to choose from")
        current = [i for i, c in enumerate(candidates) if c.current]
        past = [i for i, c in enumerate(candidates) if not c.current]
        group = current if rng.random() < self.latest_fraction else past
        group = group or current or past
        w = np.asarray(self.weights(learner, [candidates[i] for i in group]), np.float64)
        if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
            w = np.ones(len(group))  # degenerate weights: every one alike
        return group[int(rng.choice(len(group), p=w / w.sum()))]

    def weights(self, learner: Candidate, group: Sequence[Candidate]) -> Sequence[float]:
        return [1.0] * len(group)


@dataclass(frozen=True)
class UniformMatchmaker(_Grouped):
    """Uniformly within the group drawn."""


@dataclass(frozen=True)
class CloseMatchmaker(_Grouped):
    """Close matches first: weight ``(p (1 - p))^sharpness`` (a floor keeps every
    candidate possible, so a rating gone wrong can be corrected)."""

    sharpness: float = 1.0
    floor: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sharpness < 0 or not 0 <= self.floor < 1:
            raise ValueError(f"matchmaker: sharpness {self.sharpness!r} must be >= 0 and "
                             f"floor {self.floor!r} in [0, 1)")

    def weights(self, learner: Candidate, group: Sequence[Candidate]) -> Sequence[float]:
        out = []
        for c in group:
            p = expected_score(learner.rating, c.rating)
            out.append(max(self.floor, (4.0 * p * (1.0 - p)) ** self.sharpness))
        return out


@dataclass(frozen=True)
class OpenAIFiveMatchmaker(_Grouped):
    """Mostly the latest policies; past snapshots weighted by quality (strength)."""

    latest_fraction: float = 0.8

    def weights(self, learner: Candidate, group: Sequence[Candidate]) -> Sequence[float]:
        if all(c.current for c in group):
            return [1.0] * len(group)
        top = max(c.rating for c in group)  # relative: no overflow
        return [10.0 ** ((c.rating - top) / 400.0) for c in group]


DEFAULT = {"kind": "close"}


def make(spec: Mapping[str, Any] | None, import_paths: Sequence[str] = ()) -> Matchmaker:
    """The matchmaker ``spec`` names (``{kind: ..., **fields}``; None: :data:`DEFAULT`);
    ValueError naming the bad key or value."""
    from zmqrl import plugins
    from zmqrl.parts import algo_config

    spec = dict(DEFAULT if spec is None else spec)
    kind = spec.pop("kind", DEFAULT["kind"])
    cls = plugins.resolve("matchmaker", kind, import_paths)
    if dataclasses.is_dataclass(cls):
        problems = algo_config.field_type_errors(cls, spec, f"matchmaker '{kind}'")
        if problems:
            raise ValueError("; ".join(f"matchmaker.{key}: {msg}" for key, msg in problems))
    try:
        made = cls(**spec)
    except TypeError as exc:
        raise ValueError(f"matchmaker '{kind}': {exc}") from None
    if not isinstance(made, Matchmaker):
        raise ValueError(f"matchmaker '{kind}' ({type(made).__name__}) has no "
                         "choose(learner, candidates, rng)")
    return made
