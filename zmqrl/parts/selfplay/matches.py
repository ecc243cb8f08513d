"""Games between players of a league, many at once, a slice of time at a time.

A player is the policy (any actor-critic's ``act``: it samples its move as it does in
self-play), uniformly random play, or OpenSpiel's MCTS bot with random rollouts
(``open_spiel.python.algorithms.mcts``). An :class:`Evaluation` holds every game of
a set of matches (each ``games`` long, the two players swapping seats game by game) and
:meth:`Evaluation.advance` plays them for at most a given time: the policy's moves in
all games where it is to move go through one forward pass, the bots move game by game.
So the league node plays a whole evaluation without blocking its loop for more than a
slice. An illegal move loses the game for whoever made it, as in ``zmqrl.parts.games.GameEnv``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from zmqrl.parts.games import Game
from zmqrl.parts.selfplay.elo import Record


class Player:
    """Chooses moves for states where it is to play. ``batched``: one call for many."""

    name: str = ""
    batched: bool = False

    def moves(self, game: Game, states: list[Any], players: np.ndarray) -> list[int]:
        raise NotImplementedError


class RandomPlayer(Player):
    def __init__(self, seed: int, name: str = "random"):
        self.name, self.rng = name, np.random.default_rng(seed)
        self.batched = True

    def moves(self, game: Game, states: list[Any], players: np.ndarray) -> list[int]:
        out = []
        for state in states:
            legal = state.legal_actions()
            out.append(int(legal[self.rng.integers(len(legal))]))
        return out


class MCTSPlayer(Player):
    """OpenSpiel's MCTS bot: UCT with ``simulations`` random-rollout simulations a move."""

    def __init__(self, game: Game, simulations: int, seed: int, name: str = "mcts"):
        from open_spiel.python.algorithms import mcts

        rng = np.random.RandomState(seed)
        self.name = name
        self.bot = mcts.MCTSBot(game.game, 2.0, simulations,
                                mcts.RandomRolloutEvaluator(1, rng), random_state=rng)

    def moves(self, game: Game, states: list[Any], players: np.ndarray) -> list[int]:
        return [int(self.bot.step(state)) for state in states]


class PolicyPlayer(Player):
    """An actor-critic network playing by sampling its policy (no legal-move mask: it
    plays as it does in self-play)."""

    def __init__(self, name: str, model: torch.nn.Module, version: int = -1):
        self.name, self.model = name, model
        self.version = version  # the parameter version it plays with (-1: not said)
        self.batched = True

    def moves(self, game: Game, states: list[Any], players: np.ndarray) -> list[int]:
        obs = torch.from_numpy(game.observations(states, players))
        device = next(self.model.parameters()).device
        action, _ = self.model.act(obs.to(device))
        return action.cpu().numpy().astype(int).tolist()


@dataclass
class _Game:
    state: Any
    seats: tuple[Player, Player]  # who plays player 0 and player 1
    match: int
    first_is_a: bool  # the match's first player holds seat 0
    outcome: float | None = None  # for the match's first player: 1, 0 or -1


@dataclass
class Match:
    a: Player
    b: Player
    games: int

    @property
    def key(self) -> tuple[str, str]:
        return self.a.name, self.b.name


@dataclass
class Evaluation:
    """Every game of ``matches``, played a slice of time at a time."""

    game: Game
    matches: list[Match]
    games: list[_Game] = field(default_factory=list)
    moves: int = 0

    def __post_init__(self) -> None:
        for m, match in enumerate(self.matches):
            for g in range(match.games):
                first = g % 2 == 0  # seats alternate: half the games each way round
                seats = (match.a, match.b) if first else (match.b, match.a)
                self.games.append(_Game(self.game.new_state(), seats, m, first))

    @property
    def done(self) -> bool:
        return all(g.outcome is not None for g in self.games)

    def advance(self, seconds: float) -> bool:
        """Play for about ``seconds`` (at least one move); True when every game is over."""
        deadline = time.perf_counter() + seconds
        while not self.done:
            waiting: dict[int, list[_Game]] = {}
            players: dict[int, Player] = {}
            for g in self.games:
                if g.outcome is None:
                    player = g.seats[g.state.current_player()]
                    waiting.setdefault(id(player), []).append(g)
                    players[id(player)] = player
            for key, games in waiting.items():
                player = players[key]
                chunk = len(games) if player.batched else 1
                for start in range(0, len(games), chunk):
                    self._move(player, games[start:start + chunk])
                    if time.perf_counter() > deadline:
                        return self.done
        return True

    def _move(self, player: Player, games: list[_Game]) -> None:
        movers = np.array([g.state.current_player() for g in games])
        actions = player.moves(self.game, [g.state for g in games], movers)
        for g, mover, action in zip(games, movers.tolist(), actions, strict=True):
            self.moves += 1
            if action not in g.state.legal_actions():
                lost = -1.0 if (mover == 0) == g.first_is_a else 1.0
                g.outcome = lost  # the match's first player lost (or won) by forfeit
                continue
            g.state.apply_action(action)
            if g.state.is_terminal():
                g.outcome = float(g.state.returns()[0 if g.first_is_a else 1])

    def results(self) -> dict[tuple[str, str], Record]:
        """Per match (first player's name, second's): the first player's wins, draws,
        losses."""
        out: dict[tuple[str, str], list[float]] = {}
        for g in self.games:
            if g.outcome is None:
                continue
            record = out.setdefault(self.matches[g.match].key, [0.0, 0.0, 0.0])
            record[0 if g.outcome > 0 else 1 if g.outcome == 0 else 2] += 1
        return {k: (w, d, lost) for k, (w, d, lost) in out.items()}
