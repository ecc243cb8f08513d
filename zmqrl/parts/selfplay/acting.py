"""Self-play acting (the topology's ``self_play`` section): every env is a game of the
learner's policy against an opponent from a pool of its past snapshots.

The envs are two-player games stepped by whoever is to move (``zmqrl.parts.games.GameEnv``
with ``opponent: self``: the observation is from the mover's side, the reward goes to
the mover). Per env and episode this behaviour draws the learner's seat and the
opponent (:class:`zmqrl.parts.selfplay.pool.OpponentPool`: the latest policy, or a snapshot),
and tracks whose move it is: the games alternate strictly, which every step checks
against the board (in the games' canonical planes [own, opponent's, empty], the first
player is to move exactly when both have as many pieces).

The forward pass runs the latest model on every row, then each snapshot that is to move
somewhere on its own rows: one pass per snapshot present in the batch, over all the
connections of the broker at once. The pool belongs to the model the behaviours share
(the broker's, or a local actor's), found through a registry keyed by that model.

Only the learner's moves are trained on. Each env keeps a queue of the learner's
transitions: the reward of a move is its own reward, minus the opponent's when the
opponent's reply ends the game (zero-sum), and ``done`` is set by whichever move ended
it. When every env holds ``unroll`` finished transitions and the observation after them,
they are cut into one time-major unroll with the arrays of ``zmqrl.parts.unroll`` (so the
V-trace/PPO learner trains on it unchanged), carrying the learner's finished games as
``ep_return`` (+1 win, 0 draw, -1 loss) and ``ep_length`` (its moves).

Envs whose queue runs far ahead of the slowest (a random walk: seats give 4 or 5 moves
of a tic-tac-toe game) drop their oldest ``unroll`` transitions rather than hold ever
staler ones; ``dropped`` counts them.
"""

from __future__ import annotations

import copy
import logging
import weakref
from typing import ClassVar

import numpy as np
import torch

from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, EpisodeLog, Item, host
from zmqrl.parts.selfplay.config import SelfPlayConfig
from zmqrl.parts.selfplay.pool import LATEST, OpponentPool, SavedPool

log = logging.getLogger(__name__)

# model -> its pool: every behaviour acting with one model shares one pool, and the static
# forward pass finds the snapshots from the model it is given.
_POOLS: weakref.WeakKeyDictionary[torch.nn.Module, OpponentPool] = weakref.WeakKeyDictionary()
QUEUE_UNROLLS = 4  # an env's queue holds at most this many unrolls' worth of transitions


def pool_for(model: torch.nn.Module, config: SelfPlayConfig) -> OpponentPool:
    """The opponent pool of ``model`` (made on first use)."""
    pool = _POOLS.get(model)
    if pool is None:
        pool = _POOLS[model] = OpponentPool(config)
    return pool


def saved_pool(model: torch.nn.Module, config: SelfPlayConfig) -> SavedPool:
    """The opponent pool of ``model`` as a checkpoint Saveable (snapshots come back as
    frozen copies of ``model`` holding their saved weights)."""
    def load(state_dict: dict) -> torch.nn.Module:
        snapshot = frozen_copy(model)
        snapshot.load_state_dict(state_dict)
        return snapshot

    return SavedPool(pool_for(model, config), load)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A snapshot: the model's copy on the same device, out of autograd."""
    snap = copy.deepcopy(model).eval()
    for p in snap.parameters():
        p.requires_grad_(False)
    return snap


def player_to_move(obs: np.ndarray) -> np.ndarray | None:
    """int [n]: whose move each canonical board [own, opponent's, empty] is (0: the first
    player), or None for observations without that layout."""
    if obs.ndim < 3 or obs.shape[1] != 3:
        return None
    own = obs[:, 0].reshape(len(obs), -1).sum(1)
    other = obs[:, 1].reshape(len(obs), -1).sum(1)
    return (own != other).astype(np.int64)


class SelfPlayBehaviour(Behaviour):
    ships = wire.UNROLL
    # Set by zmqrl.parts.acting.behaviour_for from the topology's section (a subclass per config).
    config: ClassVar[SelfPlayConfig] = SelfPlayConfig()

    def __init__(self, setup: ActingSetup, n: int, unroll: int | None = None):
        super().__init__(setup, n)
        if getattr(self.model, "recurrent", False):
            raise ValueError("self-play acts with a feed-forward policy (not lstm_ac)")
        self.length = unroll or setup.cfg.unroll
        self.pool = pool_for(self.model, self.config)
        self.rng = np.random.default_rng(setup.seed)
        self.seat = self.rng.integers(2, size=n)  # the learner's player this episode
        self.opponent = np.array([self.pool.sample(self.rng) for _ in range(n)], np.int64)
        self.to_move: np.ndarray | None = None  # learned from the first observation
        self.moved = np.zeros(n, np.int64)  # who made the last actions
        self.open = np.zeros(n, np.bool_)  # the learner's last move awaits the reply
        self.ep_return = np.zeros(n, np.float32)  # the learner's, this episode
        self.ep_length = np.zeros(n, np.int32)  # the learner's moves, this episode
        self.episodes = EpisodeLog()
        self.mismatches = 0  # steps whose board disagreed with the tracked mover
        self.dropped = 0  # transitions dropped from queues that ran ahead
        # Per-env queues of the learner's transitions: entry k of env i is its k-th
        # pending move (the last one may await its outcome).
        spec, cap = self.spec, QUEUE_UNROLLS * self.length + 1
        self.count = np.zeros(n, np.int64)
        self.q_obs = np.zeros((n, cap, *spec.obs_shape), spec.obs_dtype)
        self.q_action = np.zeros((n, cap, *spec.action_shape), spec.action_dtype)
        self.q_logp = np.zeros((n, cap), np.float32)
        self.q_reward = np.zeros((n, cap), np.float32)
        self.q_done = np.zeros((n, cap), np.bool_)
        self.q_version = np.zeros((n, cap), np.int64)

    # ----- per step -----------------------------------------------------------------
    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        super().observe(obs, fields)
        board = player_to_move(obs)
        if self.to_move is None:  # a first look (maybe mid-game: a reconnected actor)
            self.to_move = board if board is not None else np.zeros(self.n, np.int64)
        elif board is not None and (board != self.to_move).any():
            wrong = board != self.to_move
            if not self.mismatches:
                log.warning("self-play: %d envs' boards show another player to move than "
                            "the strict alternation tracked; following the boards",
                            int(wrong.sum()))
            self.mismatches += int(wrong.sum())
            self.to_move = board

    def learner_moves(self) -> np.ndarray:
        """bool [n]: where the learner's policy is to move now."""
        return self.to_move == self.seat

    def inputs(self) -> dict[str, np.ndarray]:
        who = np.where(self.learner_moves(), LATEST, self.opponent)
        return {"obs": self.obs, "opponent": who}

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        obs = inputs["obs"]
        pool = _POOLS.get(model)
        who = inputs["opponent"].cpu().numpy()
        with torch.inference_mode():  # (act's outputs are inference tensors: written here)
            action, logp = model.act(obs)
            for opponent in np.unique(who[who != LATEST]).tolist():
                snapshot = pool.model(opponent) if pool is not None else None
                if snapshot is None:
                    continue  # evicted mid-game: the latest policy finishes it
                rows = torch.from_numpy(np.flatnonzero(who == opponent)).to(obs.device)
                action[rows], logp[rows] = snapshot.act(obs[rows])
        return {"action": action.cpu().numpy(), "logp": host(logp)}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        self.pool.maybe_snapshot(version, lambda: frozen_copy(self.model))
        action = outputs["action"].astype(self.spec.action_dtype, copy=False)
        self.moved = self.to_move.copy()
        rows = np.flatnonzero(self.learner_moves())
        full = rows[self.count[rows] == self.q_logp.shape[1]]
        if len(full):
            self._drop_oldest(full, self.length)
            self.dropped += len(full) * self.length
        k = self.count[rows]
        self.q_obs[rows, k] = self.obs[rows]
        self.q_action[rows, k] = action[rows]
        self.q_logp[rows, k] = outputs["logp"][rows]
        self.q_reward[rows, k] = 0.0
        self.q_done[rows, k] = False
        self.q_version[rows, k] = version
        self.count[rows] += 1
        self.open[rows] = True
        return action

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        # Games have no time limit; a cut episode would simply end here, unbootstrapped.
        done = np.asarray(done, np.bool_) | np.asarray(truncated, np.bool_)
        learner = self.moved == self.seat
        # The learner's reward: its own move's, or minus the opponent's (zero-sum).
        mine = np.where(learner, reward, -np.asarray(reward, np.float32))
        rows = np.flatnonzero(self.open)
        last = self.count[rows] - 1
        self.q_reward[rows, last] += mine[rows]
        self.q_done[rows, last] |= done[rows]
        # The move stays open after the learner's own move until the opponent replies.
        self.open &= learner & ~done
        self.ep_return += mine
        self.ep_length += learner
        self.to_move = np.where(done, 0, 1 - self.moved)
        if done.any():
            self._end_episodes(np.flatnonzero(done))

    def _end_episodes(self, ended: np.ndarray) -> None:
        self.episodes.add(self.ep_return[ended], self.ep_length[ended])
        for i in ended.tolist():
            self.pool.record(int(self.opponent[i]), float(self.ep_return[i]))
            self.seat[i] = self.rng.integers(2)
            self.opponent[i] = self.pool.sample(self.rng)
        self.ep_return[ended] = 0.0
        self.ep_length[ended] = 0

    def take(self) -> list[Item]:
        t = self.length
        while self.count.min() > t:  # T finished transitions and the observation after
            unroll = {"obs": self.q_obs[:, :t + 1].swapaxes(0, 1).copy(),
                      "action": self.q_action[:, :t].swapaxes(0, 1).copy(),
                      "logp": self.q_logp[:, :t].T.copy(),
                      "reward": self.q_reward[:, :t].T.copy(),
                      "done": self.q_done[:, :t].T.copy()}
            self.episodes.attach(unroll)
            # Always the learner's episodes, none if none ended: the actors' per-env
            # returns (the last mover's reward) must not stand in for them.
            unroll.setdefault("ep_return", np.zeros(0, np.float32))
            unroll.setdefault("ep_length", np.zeros(0, np.int32))
            version = int(self.q_version[:, 0].min())
            self._drop_oldest(np.arange(self.n), t)
            self._ready.append(Item(wire.UNROLL, unroll, {"version": version}))
        return super().take()

    def _drop_oldest(self, rows: np.ndarray, k: int) -> None:
        """Forget the oldest ``k`` transitions of the envs in ``rows`` (the next becomes
        their first); what lies past an env's count is never read, so all shift alike."""
        cap = self.q_logp.shape[1]
        for q in (self.q_obs, self.q_action, self.q_logp, self.q_reward, self.q_done,
                  self.q_version):
            q[rows, :cap - k] = q[rows, k:]
        self.count[rows] -= k
