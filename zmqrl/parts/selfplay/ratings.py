"""Elo ratings of a population's players, updated game by game.

A player is a member's current policy (``m0``: it keeps learning, so its rating must keep
moving) or a frozen snapshot of one (``m0@v120``). Every finished game updates both
ratings at once (sequential Elo): ``r_a += K_a (s - E)``, ``r_b -= K_b (s - E)``, with
``s`` the first player's score (1 win, 1/2 draw, 0 loss) and ``E`` the score it expected
(:func:`zmqrl.parts.selfplay.elo.expected_score`). A current policy keeps a constant
``k``; a snapshot's K shrinks with its games, ``k / (1 + games / settle)`` down to
``k_min``, so a fixed player's rating settles instead of wandering with the noise of
single games. A new player starts at the rating it is given (a snapshot at its member's
rating when it was taken), else at ``initial``.

This differs from the league's Bradley-Terry fit (:mod:`zmqrl.parts.selfplay.elo`), which
refits every pair's record: a population's current policies change while they are rated,
so old results must fade, and thousands of games a minute must each cost O(1).

:meth:`Ratings.state` / :meth:`Ratings.restore` are a checkpoint Saveable's halves
(JSON-able)::

    {"format": 1, "games": 5120,
     "players": {"m0": {"rating": 1032.5, "games": 812, "frozen": false}, ...}}

No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from zmqrl.bus.messages import MAX_RATING  # what a `ratings` message may carry
from zmqrl.parts.selfplay.elo import expected_score

FORMAT = 1


@dataclass
class Player:
    rating: float
    games: int = 0
    frozen: bool = False  # a snapshot: its K settles with its games


class Ratings:
    """Every player's Elo, updated per game (module docstring)."""

    def __init__(self, k: float = 16.0, k_min: float = 2.0, settle: float = 50.0,
                 initial: float = 1000.0):
        if not (k > 0 and 0 < k_min <= k and settle > 0):
            raise ValueError(f"ratings: need k > 0, 0 < k_min <= k, settle > 0 "
                             f"(got k={k}, k_min={k_min}, settle={settle})")
        self.k, self.k_min, self.settle, self.initial = k, k_min, settle, initial
        self.players: dict[str, Player] = {}
        self.games = 0  # games rated

    def add(self, name: str, rating: float | None = None, frozen: bool = False) -> Player:
        """The player ``name``, added at ``rating`` (else ``initial``) if it is new."""
        player = self.players.get(name)
        if player is None:
            player = self.players[name] = Player(
                self.initial if rating is None else _bounded(rating), 0, frozen)
        return player

    def rating(self, name: str) -> float:
        player = self.players.get(name)
        return self.initial if player is None else player.rating

    def _k(self, player: Player) -> float:
        if not player.frozen:
            return self.k
        return max(self.k_min, self.k / (1.0 + player.games / self.settle))

    def update(self, a: str, b: str, score: float) -> None:
        """One game of ``a`` against ``b``; ``score`` is ``a``'s (1, 1/2 or 0)."""
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"a game's score is in [0, 1], not {score!r}")
        if a == b:
            return  # a policy against itself says nothing of its strength
        pa, pb = self.add(a), self.add(b)
        surprise = score - expected_score(pa.rating, pb.rating)
        ka, kb = self._k(pa), self._k(pb)
        pa.rating = _bounded(pa.rating + ka * surprise)
        pb.rating = _bounded(pb.rating - kb * surprise)
        pa.games += 1
        pb.games += 1
        self.games += 1

    def update_all(self, games: Iterable[tuple[str, str, float]]) -> int:
        """Every ``(a, b, score)`` in order; how many."""
        n = 0
        for a, b, score in games:
            self.update(a, b, score)
            n += 1
        return n

    def take_rating(self, recipient: str, donor: str) -> bool:
        """``recipient`` now plays as ``donor`` does (a PBT exploit copied the donor's
        weights): it takes the donor's rating, keeping its own games. False (nothing
        changed) if the donor is unrated."""
        if donor not in self.players:
            return False
        self.add(recipient).rating = self.players[donor].rating
        return True

    def forget(self, keep: Iterable[str]) -> None:
        """Drop every player not in ``keep`` (snapshots evicted from every pool)."""
        kept = set(keep)
        self.players = {n: p for n, p in self.players.items() if n in kept}

    def table(self) -> dict[str, float]:
        """name -> rating, best first, rounded for reports."""
        return {n: round(p.rating, 1)
                for n, p in sorted(self.players.items(), key=lambda kv: -kv[1].rating)}

    # ----- persistence ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"format": FORMAT, "games": self.games,
                "players": {n: {"rating": p.rating, "games": p.games, "frozen": p.frozen}
                            for n, p in self.players.items()}}

    def restore(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != FORMAT:
            raise ValueError(f"ratings checkpoint format {state.get('format')!r}, "
                             f"expected {FORMAT}")
        try:
            players = {str(n): Player(_bounded(float(p["rating"])), int(p["games"]),
                                      bool(p["frozen"]))
                       for n, p in dict(state["players"]).items()}
            games = int(state["games"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"ratings checkpoint: missing or mistyped {exc}") from exc
        self.players, self.games = players, games


def _bounded(rating: float) -> float:
    if rating != rating:  # NaN
        raise ValueError("a rating is not a number")
    return min(MAX_RATING, max(-MAX_RATING, float(rating)))
