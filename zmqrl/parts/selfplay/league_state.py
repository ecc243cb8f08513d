"""What a league keeps across a restart or ``zmqrl up --resume``: its members (frozen
snapshots of the policy), every pair's results, the Elo ratings fitted to them and its
counters, as one checkpoint (``zmqrl.parts.checkpoint``, :data:`~zmqrl.parts.checkpoint.TORCH`
format: ``checkpoints/<label>.league.pt`` in the run directory).

The checkpoint is a plain dict (format 1), loadable with ``torch.load(weights_only=True)``::

    {"format": 1,
     "members": [{"name": "v20", "version": 20, "model": <state dict>}, ...],  # oldest first
     "results": [{"a": "v40", "b": "v20", "wins": 3.0, "draws": 0.0, "losses": 1.0}, ...],
     "ratings": {"random": 0.0, "v20": 112.5, ...},  # the last fit (informational)
     "next_snapshot": 60,        # the parameter version that admits the next member
     "evaluations": 7,           # evaluations finished so far
     "evaluated_version": 52}    # the parameter version the last one evaluated

``results`` are the first player's wins, draws and losses against the second; the
ratings are refitted from them (``zmqrl.parts.selfplay.elo``), so they are kept only to
say what the league last reported. A member's weights are its model's ``state_dict()``
(tensors: saved efficiently, never as JSON lists). This is the self-play league's
(``nodes/league.py``); the population league keeps its ratings apart
(:mod:`zmqrl.parts.selfplay.ratings`, a JSON checkpoint).

No torch here: a state dict is whatever the caller's models give and take.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zmqrl.parts.selfplay.elo import Record

FORMAT = 1


@dataclass
class Member:
    name: str
    version: int  # the parameter version it was taken at
    model: Any  # its state dict


@dataclass
class LeagueState:
    members: list[Member] = field(default_factory=list)  # oldest first
    results: dict[tuple[str, str], Record] = field(default_factory=dict)
    ratings: dict[str, float] = field(default_factory=dict)
    next_snapshot: int = 0
    evaluations: int = 0
    evaluated_version: int = -1

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint (the format in the module docstring)."""
        return {
            "format": FORMAT,
            "members": [{"name": m.name, "version": int(m.version), "model": m.model}
                        for m in self.members],
            "results": [{"a": a, "b": b, "wins": float(w), "draws": float(d),
                         "losses": float(lost)}
                        for (a, b), (w, d, lost) in self.results.items()],
            "ratings": {k: float(v) for k, v in self.ratings.items()},
            "next_snapshot": int(self.next_snapshot),
            "evaluations": int(self.evaluations),
            "evaluated_version": int(self.evaluated_version),
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LeagueState:
        """A checkpoint back; ValueError naming what is wrong with one it cannot take."""
        if state.get("format") != FORMAT:
            raise ValueError(f"league checkpoint format {state.get('format')!r}, "
                             f"expected {FORMAT}")
        try:
            members = [Member(str(m["name"]), int(m["version"]), m["model"])
                       for m in state["members"]]
            results = {(str(r["a"]), str(r["b"])):
                       (float(r["wins"]), float(r["draws"]), float(r["losses"]))
                       for r in state["results"]}
            ratings = {str(k): float(v) for k, v in dict(state.get("ratings") or {}).items()}
            counters = {k: int(state[k]) for k in
                        ("next_snapshot", "evaluations", "evaluated_version")}
        except (KeyError, TypeError) as exc:
            raise ValueError(f"league checkpoint: missing or mistyped {exc}") from exc
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"league checkpoint: members named twice in {names}")
        return cls(members, results, ratings, **counters)
