"""Population play: every env is a game between two players of a population — members'
current policies or frozen snapshots of them — and every seat a current policy plays
trains that member.

The envs are two-player games stepped by whoever is to move (``zmqrl.parts.games.GameEnv``
with ``opponent: self``), as in self-play (:mod:`zmqrl.parts.selfplay.acting`, whose
whose-move tracking this shares). Per env and game this behaviour draws the *trainee*
(a member, uniformly), its opponent (the :class:`~zmqrl.parts.selfplay.matchmaking.Matchmaker`
over every player of the :class:`~zmqrl.parts.selfplay.roster.Roster`, by rating) and
the seats.

The forward pass tags each row with the player to move and runs every player present
on its rows: one pass per player over all the broker's connections at once.

Each seat's moves are kept until its game ends (a reward is its own move's, minus the
opponent's when the opponent's reply ends the game: zero-sum). Then the seat's whole
game goes to its member's packer if a current policy played it (a snapshot learns
nothing); the packer appends it to its shortest column and, whenever every column holds
``unroll`` transitions and the observation after them, cuts one time-major unroll of
``zmqrl.parts.unroll``'s arrays (games back to back in a column, ``done`` between them:
the V-trace/PPO learner trains on it unchanged). The unroll carries that member's seats'
games as ``ep_return`` (+1 win, 0 draw, -1 loss) and ``ep_length``; its item's ``member``
field tells the broker whose learner it goes to. Every finished game's result waits in
the roster for the league (:attr:`Roster.games`), but for a game this connection joined
mid-way (a reconnect) or whose snapshot was evicted while it played (its member finished
it): neither says how those two players compare.

The broker (``nodes/population_broker.py``) makes a subclass per run whose class
attributes are the roster, the matchmaker and the packer width (:func:`bind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, EpisodeLog, Item, host
from zmqrl.parts.selfplay.acting import player_to_move
from zmqrl.parts.selfplay.matchmaking import Matchmaker
from zmqrl.parts.selfplay.roster import Roster

MAX_PLIES = 128  # a seat's moves in one game (board games here: connect four has 21)


def bind(roster: Roster, matchmaker: Matchmaker,
         columns: int | None = None) -> type[PopulationPlayBehaviour]:
    """The behaviour class a broker acts with: its roster (whose member 0 is the
    broker's model), matchmaker and packer width (columns per member's unroll; None:
    half a connection's envs), class attributes its forward pass reads."""
    return type("PopulationPlayBehaviour", (PopulationPlayBehaviour,),
                {"roster": roster, "matchmaker": matchmaker, "columns": columns,
                 "__module__": __name__})


class _Packer:
    """One member's finished games, packed back to back into ``width`` columns."""

    def __init__(self, width: int):
        self.cols: list[list[tuple]] = [[] for _ in range(width)]  # rows, oldest first
        self.episodes = EpisodeLog()

    def add(self, rows: list[tuple], ep_return: float) -> None:
        min(self.cols, key=len).extend(rows)
        self.episodes.add(np.array([ep_return], np.float32), np.array([len(rows)], np.int32))

    def cut(self, t: int) -> dict[str, np.ndarray] | None:
        if min(len(c) for c in self.cols) <= t:
            return None
        head = [c[:t + 1] for c in self.cols]  # per column: t moves and the next obs
        for c in self.cols:
            del c[:t]

        def field(j: int, steps: int) -> np.ndarray:  # [steps, columns, ...]
            return np.stack([np.stack([np.asarray(row[j]) for row in h[:steps]])
                             for h in head], axis=1)

        unroll = {"obs": field(0, t + 1), "action": field(1, t),
                  "logp": field(2, t).astype(np.float32),
                  "reward": field(3, t).astype(np.float32),
                  "done": field(4, t).astype(np.bool_), "_version": field(5, t)}
        self.episodes.attach(unroll)
        unroll.setdefault("ep_return", np.zeros(0, np.float32))
        unroll.setdefault("ep_length", np.zeros(0, np.int32))
        return unroll


class PopulationPlayBehaviour(Behaviour):
    ships = wire.UNROLL
    roster: ClassVar[Roster]
    matchmaker: ClassVar[Matchmaker]
    columns: ClassVar[int | None] = None

    def __init__(self, setup: ActingSetup, n: int, unroll: int | None = None):
        super().__init__(setup, n)
        if getattr(self.model, "recurrent", False):
            raise ValueError("population play acts with feed-forward policies (not lstm_ac)")
        self.length = unroll or setup.cfg.unroll
        self.rng = np.random.default_rng(setup.seed)
        k = self.roster.size
        width = self.columns or max(1, n // 2)
        self.packers = [_Packer(width) for _ in range(k)]
        self.players = np.zeros((n, 2), np.int64)  # the player id in each seat
        self.to_move: np.ndarray | None = None
        self.moved = np.zeros(n, np.int64)
        self.ep_return = np.zeros((n, 2), np.float32)
        # per env and seat: this game's moves so far (obs, action, logp, reward, done, version)
        self.moves: list[list[list[Any]]] = [[[], []] for _ in range(n)]
        # games this connection joined mid-way (a reconnect, a restarted broker): trained
        # on, not rated (their results say nothing of the players drawn for them)
        self.joined = np.zeros(n, np.bool_)
        self.mismatches = 0
        self.dropped = 0  # games longer than MAX_PLIES a seat (never, in these games)
        for i in range(n):
            self._new_game(i)

    def _new_game(self, i: int) -> None:
        roster = self.roster
        trainee = int(self.rng.integers(roster.size))
        ids, candidates = roster.candidates()
        opponent = ids[self.matchmaker.choose(candidates[trainee], candidates, self.rng)]
        seat = int(self.rng.integers(2))
        self.players[i, seat], self.players[i, 1 - seat] = trainee, opponent
        self.ep_return[i] = 0.0
        self.moves[i] = [[], []]

    # ----- per step -----------------------------------------------------------------
    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        super().observe(obs, fields)
        board = player_to_move(obs)
        if self.to_move is None:
            self.to_move = board if board is not None else np.zeros(self.n, np.int64)
            if obs.ndim >= 3 and obs.shape[1] == 3:  # a canonical board: any pieces on it?
                self.joined = obs[:, :2].reshape(self.n, -1).any(axis=1)
        elif board is not None and (board != self.to_move).any():
            self.mismatches += int((board != self.to_move).sum())
            self.to_move = board

    def inputs(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs, "player": self.players[np.arange(self.n), self.to_move]}

    @classmethod
    def forward(cls, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        # every player's model is the roster's (``model`` is its member 0)
        roster = cls.roster
        obs = inputs["obs"]
        who = inputs["player"].cpu().numpy()
        action = torch.zeros(len(who), dtype=torch.int64, device=obs.device)
        logp = torch.zeros(len(who), dtype=torch.float32, device=obs.device)
        for player in np.unique(who).tolist():
            net = roster.model(player)
            if net is None:  # a snapshot evicted mid-game: its member finishes the game
                net = roster.members[roster.member_of(player)]
            rows = torch.from_numpy(np.flatnonzero(who == player)).to(obs.device)
            a, lp = net.act(obs[rows])
            action[rows], logp[rows] = a.to(torch.int64), lp.float()
        return {"action": action.cpu().numpy(), "logp": host(logp)}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        action = outputs["action"].astype(self.spec.action_dtype, copy=False)
        self.moved = self.to_move.copy()
        versions = self.roster.versions
        for i in range(self.n):
            seat = int(self.moved[i])
            player = int(self.players[i, seat])
            kept = self.moves[i][seat]
            if len(kept) >= MAX_PLIES:
                self.dropped += 1
                continue
            member = player if player < self.roster.size else -1
            kept.append([self.obs[i].copy(), action[i], float(outputs["logp"][i]), 0.0, False,
                         versions[member] if member >= 0 else 0])
        return action

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        done = np.asarray(done, np.bool_) | np.asarray(truncated, np.bool_)
        reward = np.asarray(reward, np.float32)
        for i in range(self.n):
            seat = int(self.moved[i])
            for s, r in ((seat, reward[i]), (1 - seat, -reward[i])):  # zero-sum
                kept = self.moves[i][s]
                if kept and r:
                    kept[-1][3] += float(r)
                self.ep_return[i, s] += r
            if done[i]:
                self._end_game(i)
        self.to_move = np.where(done, 0, 1 - self.moved)

    def _end_game(self, i: int) -> None:
        roster = self.roster
        outcome = float(self.ep_return[i, 0])
        score = 1.0 if outcome > 0 else 0.0 if outcome < 0 else 0.5
        first, second = int(self.players[i, 0]), int(self.players[i, 1])
        if self.joined[i] or not (roster.intact(first) and roster.intact(second)):
            roster.unrated += 1  # joined mid-way, or a snapshot evicted mid-game
            self.joined[i] = False
        else:
            roster.finish(roster.name(first), roster.name(second), score)
        for s in (0, 1):
            player, kept = int(self.players[i, s]), self.moves[i][s]
            if player < roster.size and kept:  # a current policy's seat trains it
                kept[-1][4] = True
                self.packers[player].add([tuple(row) for row in kept],
                                         float(np.sign(self.ep_return[i, s])))
        self._new_game(i)

    def take(self) -> list[Item]:
        for member, packer in enumerate(self.packers):
            while (unroll := packer.cut(self.length)) is not None:
                version = int(unroll.pop("_version").min())
                self._ready.append(Item(wire.UNROLL, unroll,
                                        {"version": version, "member": member}))
        return super().take()


def members_of(items: Sequence[Item]) -> list[int]:
    """Whose learner each item goes to (the broker routes by it)."""
    return [int(item.fields["member"]) for item in items]
