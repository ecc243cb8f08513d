"""A perfect player for small games (tic-tac-toe): exhaustive negamax over every position
reachable from the start, memoised by position (tic-tac-toe has 5,478). What an
AlphaZero agent is measured against: a perfect player never loses, so an agent that
never loses to it plays perfectly too.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Minimax:
    def __init__(self) -> None:
        self._values: dict[str, float] = {}

    def value(self, state: Any) -> float:
        """The game's value for the player to move, under perfect play by both."""
        if state.is_terminal():
            raise ValueError("a finished game has no player to move")
        key = str(state)  # the board: positions reached by different move orders agree
        value = self._values.get(key)
        if value is None:
            value = max(self._after(state, action) for action in state.legal_actions())
            self._values[key] = value
        return value

    def _after(self, state: Any, action: int) -> float:
        """The value of ``action`` for the player making it."""
        child = state.clone()
        child.apply_action(action)
        if child.is_terminal():
            return float(child.returns()[state.current_player()])
        # alternating moves: the opponent's value, negated
        return -self.value(child)

    def best_actions(self, state: Any) -> list[int]:
        """Every move that keeps the game's value."""
        values = {a: self._after(state, a) for a in state.legal_actions()}
        best = max(values.values())
        return [a for a, v in values.items() if v == best]

    def act(self, state: Any, rng: np.random.Generator) -> int:
        """One of the best moves, drawn uniformly (so that games vary)."""
        best = self.best_actions(state)
        return int(best[rng.integers(len(best))])
