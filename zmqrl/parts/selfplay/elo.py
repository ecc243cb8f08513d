"""Elo ratings from game results: a Bradley-Terry fit over every pair's record.

Ratings are on Elo's scale (a 400-point lead: 10:1 odds) and anchored: the ``anchor``
player (the league's uniform-random player) is 0. A draw counts half a win each way.
The fit is the minorization-maximization of Hunter (2004) on strengths 10^(r/400); each
player also gets one virtual draw against the anchor, so a player that won (or lost)
every game still gets a finite rating. Unlike sequential Elo updates, the result does
not depend on the order the games were played in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

Record = tuple[float, float, float]  # the first player's wins, draws, losses


def fit(results: Mapping[tuple[str, str], Record], anchor: str,
        iterations: int = 500) -> dict[str, float]:
    """Elo ratings of every player named in ``results`` (and the anchor, at 0)."""
    players = sorted({p for pair in results for p in pair} | {anchor})
    wins = {p: 0.0 for p in players}  # draws as halves
    games: dict[tuple[str, str], float] = {}

    def add(a: str, b: str, a_wins: float, b_wins: float) -> None:
        wins[a] += a_wins
        wins[b] += b_wins
        key = (a, b) if a < b else (b, a)
        games[key] = games.get(key, 0.0) + a_wins + b_wins

    for (a, b), (w, d, lost) in results.items():
        if a != b:
            add(a, b, w + 0.5 * d, lost + 0.5 * d)
    for p in players:
        if p != anchor:
            add(p, anchor, 0.5, 0.5)  # the prior: one virtual draw with the anchor
    strength = {p: 1.0 for p in players}
    for _ in range(iterations):
        new = {}
        for p in players:
            denominator = sum(n / (strength[a] + strength[b]) for (a, b), n in games.items()
                              if p in (a, b))
            new[p] = wins[p] / denominator if denominator > 0 else strength[p]
        scale = new[anchor]
        strength = {p: max(s / scale, 1e-12) for p, s in new.items()}
    return {p: round(400.0 * math.log10(s), 1) for p, s in strength.items()}


def expected_score(a: float, b: float) -> float:
    """The score (win = 1, draw = 1/2) a player rated ``a`` expects against ``b``."""
    return 1.0 / (1.0 + 10.0 ** ((b - a) / 400.0))
