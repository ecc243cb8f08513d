"""Monte-Carlo tree search as AlphaZero runs it, over many games at once.

One :class:`BatchedMCTS` holds a tree for each of ``slots`` games, as arrays with the
games as their first axis, so that the search of every game advances in one set of
numpy operations: each round, every game descends from its root by the PUCT rule

    a = argmax_a  Q(s, a) + c_puct * P(s, a) * sqrt(1 + N(s)) / (1 + N(s, a))

(Q the mean value of the move for the player choosing it, 0 while unvisited; P the
network's prior; N(s) the visits of s) to a leaf. A leaf that ends the game is backed up
at once with the game's returns; the others wait, one per game, for their evaluation,
which the caller gets with :meth:`SelfPlay.leaves` (their observations, [L, *obs]) and
answers with :meth:`SelfPlay.feed` (policy logits [L, A] and values [L] for the player
to move). Whoever evaluates: the model in this process, one leaf or all of them at a
time, or the inference broker, batching the leaves of many actors into one forward pass
(``nodes/mcts_actor.py``).

An evaluated leaf is expanded with the softmax of its logits over the legal moves (at a
root, mixed with Dirichlet noise: ``P = (1 - f) P + f Dir(alpha)``) and its value is
backed up the path, each edge adding it for the player who chose that edge (+v for
the leaf's player to move, -v for the other: two-player zero-sum).

:class:`SelfPlay` plays games with it: once a root has ``num_simulations`` visits the
move is chosen from the visit counts (sampled in proportion to them for the first
``temperature_moves`` moves of a game, the most visited after), the position is recorded
as (observation, visit distribution, player to move), and the next search starts from
the next position: a fresh tree, or (``reuse_trees``) the subtree of the move played,
whose visits count towards the next search's simulations. A finished game becomes a
:class:`GameRecord`: its positions with the final outcome for the player to move at each.

With ``full_search_fraction`` below 1 (KataGo's playout cap randomization, Wu 2019) only
that fraction of moves, drawn at random, gets the full search (with root noise) and is
recorded; the others get ``fast_simulations`` without root noise, are played and not
recorded. Games then cost fewer simulations each, so more of them are played for the
same search: more independent outcomes for the value target, whose positions within one
game are correlated, at the price of fewer positions a game.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.parts.games import Game

# (observations [L, *obs]) -> (policy logits [L, A], values [L] for the player to move)
Evaluator = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class SearchParams:
    """What the search and self-play need of ``algo``
    (``zmqrl.parts.alphazero.config.AlphaZeroConfig``)."""

    num_simulations: int = 50
    c_puct: float = 1.5
    dirichlet_alpha: float = 1.0
    dirichlet_fraction: float = 0.25  # 0: no root noise (evaluation games)
    temperature_moves: int = 4
    # a position's value target: (1 - mix) * the game's outcome + mix * the root's value
    value_target_mix: float = 0.0
    mirror_games: bool = False  # each finished game goes out mirrored too (Game.mirror)
    # playout cap randomization: the fraction of moves searched fully and recorded; the
    # others are searched with fast_simulations, without noise, and not recorded
    full_search_fraction: float = 1.0
    fast_simulations: int = 20
    reuse_trees: bool = False  # the next search starts from the subtree of the move played

    @classmethod
    def of(cls, cfg: Any, **overrides: Any) -> SearchParams:
        names = cls.__dataclass_fields__
        return cls(**{**{k: getattr(cfg, k) for k in names if hasattr(cfg, k)}, **overrides})


@dataclass
class GameRecord:
    """A finished game: one row per move searched."""

    obs: np.ndarray  # [T, *obs] float32, each seen by the player to move
    policy: np.ndarray  # [T, A] float32: the root's visit distribution
    # [T] float32: the value target of the player to move, the game's final return
    # (mixed with the root's value by ``value_target_mix``)
    outcome: np.ndarray
    returns: tuple[float, float]  # of players 0 and 1
    moves: int  # the game's length (>= its rows: fast-searched moves are not recorded)

    def with_mirror(self, game: Game) -> GameRecord:
        """This game's positions followed by their mirror images (twice as many rows)."""
        obs, policy = game.mirror(self.obs, self.policy)
        return GameRecord(np.concatenate([self.obs, obs]),
                          np.concatenate([self.policy, policy]),
                          np.concatenate([self.outcome, self.outcome]), self.returns,
                          self.moves)


class BatchedMCTS:
    """The trees of ``slots`` games (see the module docstring)."""

    def __init__(self, game: Game, slots: int, params: SearchParams,
                 rng: np.random.Generator):
        self.game, self.params, self.rng = game, params, rng
        self.slots = slots
        a = game.num_actions
        # Each simulation adds at most one node; the root is one more. (A kept subtree
        # holds at most one node per visit through it, which the next search counts.)
        m = max(params.num_simulations, params.fast_simulations) + 2
        self.child = np.full((slots, m, a), -1, np.int64)
        self.visits = np.zeros((slots, m, a), np.float32)
        self.value_sum = np.zeros((slots, m, a), np.float32)  # for the node's player
        self.prior = np.zeros((slots, m, a), np.float32)
        self.legal = np.zeros((slots, m, a), np.bool_)
        self.expanded = np.zeros((slots, m), np.bool_)
        self.terminal = np.zeros((slots, m), np.bool_)
        self.player = np.zeros((slots, m), np.int64)  # to move
        self.returns = np.zeros((slots, m, 2), np.float32)  # of a terminal node
        self.size = np.zeros(slots, np.int64)
        self.states: list[list[Any]] = [[None] * m for _ in range(slots)]
        depth = game.max_length + 1
        self.path_node = np.zeros((slots, depth), np.int64)
        self.path_action = np.zeros((slots, depth), np.int64)
        self.path_len = np.zeros(slots, np.int64)
        self.leaf = np.full(slots, -1, np.int64)  # node waiting for its evaluation
        self.noise = np.ones(slots, np.bool_)  # Dirichlet noise at the root (if fraction > 0)
        self.simulations = 0  # backed-up simulations, all games (evaluated or terminal)

    # ----- trees ------------------------------------------------------------------------
    def reset(self, slot: int, state: Any, noise: bool = True) -> None:
        """A fresh tree in ``slot`` whose root is ``state`` (not terminal); ``noise``:
        whether its root priors get Dirichlet noise (``params.dirichlet_fraction``)."""
        used = int(self.size[slot])
        self.child[slot, :used] = -1
        for array in (self.visits, self.value_sum, self.prior):
            array[slot, :used] = 0.0
        self.legal[slot, :used] = False
        self.expanded[slot, :used] = False
        self.terminal[slot, :used] = False
        states = self.states[slot]
        for i in range(used):
            states[i] = None
        self._nodes(np.array([slot]), np.array([0]), [state])
        self.size[slot] = 1
        self.leaf[slot] = -1
        self.noise[slot] = noise

    def advance(self, slot: int, action: int, state: Any, noise: bool = True) -> None:
        """The next search in ``slot``, from ``state``, the root's state after ``action``:
        that child's subtree becomes the tree (its nodes moved to the front, in
        breadth-first order), or a fresh tree where the child was never evaluated. A kept
        root is expanded already, so its noise, if any, is mixed in here."""
        old = int(self.child[slot, 0, action])
        if old < 0 or not self.expanded[slot, old]:
            self.reset(slot, state, noise)
            return
        child = self.child[slot]
        level, levels = np.array([old]), []
        while len(level):  # one numpy step per depth, not per node
            levels.append(level)
            level = child[level].ravel()
            level = level[level >= 0]
        keep = np.concatenate(levels)
        order, used, k = keep.tolist(), int(self.size[slot]), len(keep)
        remap = np.full(used, -1, np.int64)
        remap[keep] = np.arange(k)
        kids = self.child[slot, keep]
        self.child[slot, :k] = np.where(kids >= 0, remap[np.maximum(kids, 0)], -1)
        self.child[slot, k:used] = -1
        for array in (self.visits, self.value_sum, self.prior, self.legal, self.expanded,
                      self.terminal, self.player, self.returns):
            array[slot, :k] = array[slot, keep]  # (fancy indexing copies first)
            array[slot, k:used] = 0
        states = self.states[slot]
        kept = [states[j] for j in order]
        states[:used] = kept + [None] * (used - k)
        self.size[slot] = k
        self.leaf[slot] = -1
        self.noise[slot] = noise
        if noise and self.params.dirichlet_fraction > 0:
            self._mix_noise(self.prior[slot, 0], self.legal[slot, 0])

    def _mix_noise(self, prior: np.ndarray, legal: np.ndarray) -> None:
        """Dirichlet noise into one root's ``prior`` [A] (in place) over its legal moves."""
        p = self.params
        moves = np.flatnonzero(legal)
        noise = self.rng.dirichlet(np.full(len(moves), p.dirichlet_alpha))
        prior[moves] = (1 - p.dirichlet_fraction) * prior[moves] + p.dirichlet_fraction * noise

    def _nodes(self, slots: np.ndarray, index: np.ndarray, states: list[Any]) -> None:
        """Nodes ``index`` of ``slots`` for ``states`` (one numpy write per array: the
        per-state work is pyspiel's)."""
        ends = [state.is_terminal() for state in states]
        for slot, i, state in zip(slots.tolist(), index.tolist(), states, strict=True):
            self.states[slot][i] = state
        if any(ends):
            end = np.array(ends)
            self.terminal[slots[end], index[end]] = True
            self.returns[slots[end], index[end]] = [s.returns() for s, e in
                                                    zip(states, ends, strict=True) if e]
            if end.all():
                return
            slots, index = slots[~end], index[~end]
            states = [s for s, e in zip(states, ends, strict=True) if not e]
        self.player[slots, index] = [state.current_player() for state in states]
        self.legal[slots, index] = [state.legal_actions_mask() for state in states]

    def root_state(self, slot: int) -> Any:
        return self.states[slot][0]

    def root_visits(self, slots: np.ndarray) -> np.ndarray:
        """Simulations through each root so far, [len(slots)]."""
        return self.visits[slots, 0].sum(-1)

    # ----- one simulation per slot --------------------------------------------------------
    def select(self, slots: np.ndarray) -> np.ndarray:
        """Descend from the roots of ``slots`` (none waiting for an evaluation) to a leaf
        each, creating the leaf's node. Leaves that end the game are backed up here;
        the others wait in ``self.leaf``. Returns the slots whose leaf ended the game
        (they may select again)."""
        p = self.params
        count = len(slots)
        node = np.zeros(count, np.int64)
        leaf = np.zeros(count, np.int64)
        self.path_len[slots] = 0
        active = np.arange(count)
        for depth in range(self.path_node.shape[1]):
            g, n = slots[active], node[active]
            descend = self.expanded[g, n] & ~self.terminal[g, n]
            stopped = active[~descend]
            leaf[stopped] = node[stopped]
            active = active[descend]
            if not len(active):
                break
            g, n = slots[active], node[active]
            visits = self.visits[g, n]
            q = self.value_sum[g, n] / np.maximum(visits, 1.0)
            total = visits.sum(-1, keepdims=True)
            score = q + p.c_puct * self.prior[g, n] * np.sqrt(total + 1.0) / (1.0 + visits)
            action = np.where(self.legal[g, n], score, -np.inf).argmax(-1)
            self.path_node[g, depth] = n
            self.path_action[g, depth] = action
            self.path_len[g] = depth + 1
            nxt = self.child[g, n, action]
            new = nxt < 0
            if new.any():  # the leaves: a node for the state each reaches
                ng, parent, move = g[new], n[new], action[new]
                index = self.size[ng]
                self.size[ng] = index + 1
                self.child[ng, parent, move] = index
                states = []
                for slot, i, a in zip(ng.tolist(), parent.tolist(), move.tolist(),
                                      strict=True):
                    state = self.states[slot][i].clone()
                    state.apply_action(a)
                    states.append(state)
                self._nodes(ng, index, states)
                nxt[new] = index
            node[active] = nxt
            leaf[active[new]] = nxt[new]
            active = active[~new]
        ended = self.terminal[slots, leaf]
        done = slots[ended]
        if len(done):
            self._backup(done, self.returns[done, leaf[ended]])
        self.leaf[slots[~ended]] = leaf[~ended]
        return done

    def expand(self, slots: np.ndarray, logits: np.ndarray, values: np.ndarray) -> None:
        """Evaluations of the leaves of ``slots``: priors from ``logits`` [len, A] over
        the legal moves (with root noise where the leaf is a root) and ``values`` [len]
        (for the leaf's player to move) backed up."""
        p = self.params
        leaf = self.leaf[slots]
        legal = self.legal[slots, leaf]
        logits = np.where(legal, logits.astype(np.float32, copy=False), -np.inf)
        prior = np.exp(logits - logits.max(-1, keepdims=True))
        prior /= prior.sum(-1, keepdims=True)
        if p.dirichlet_fraction > 0:
            for i in np.flatnonzero((leaf == 0) & self.noise[slots]):
                self._mix_noise(prior[i], legal[i])
        self.prior[slots, leaf] = prior
        self.expanded[slots, leaf] = True
        values = np.clip(values.astype(np.float32, copy=False), -1.0, 1.0)
        player = self.player[slots, leaf]
        both = np.empty((len(slots), 2), np.float32)
        rows = np.arange(len(slots))
        both[rows, player] = values
        both[rows, 1 - player] = -values
        self._backup(slots, both)
        self.leaf[slots] = -1

    def _backup(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Add ``values`` [len, 2] (per player) along each slot's path."""
        self.simulations += len(slots)
        length = self.path_len[slots]
        for depth in range(int(length.max(initial=0))):
            on = length > depth
            g = slots[on]
            n, a = self.path_node[g, depth], self.path_action[g, depth]
            self.visits[g, n, a] += 1.0
            v = values[on]
            self.value_sum[g, n, a] += v[np.arange(len(g)), self.player[g, n]]

    def leaf_observations(self, slots: np.ndarray) -> np.ndarray:
        leaf = self.leaf[slots]
        states = self.states
        return self.game.observations([states[g][i] for g, i in
                                       zip(slots.tolist(), leaf.tolist(), strict=True)],
                                      self.player[slots, leaf])


class SelfPlay:
    """``games`` games of self-play searched side by side (see the module docstring).

    Per round: ``obs = leaves()``, evaluate them, ``feed(logits, values)``; finished
    games gather in :attr:`finished`."""

    def __init__(self, game: Game, games: int, params: SearchParams, seed: int = 0):
        self.game, self.params = game, params
        self.rng = np.random.default_rng(seed)
        self.mcts = BatchedMCTS(game, games, params, self.rng)
        if params.mirror_games and not game.mirrors:
            raise ValueError(f"mirror_games: {game.name} has no known mirror symmetry")
        # per game: (observation, visit distribution, player to move, root value)
        self.history: list[list[tuple[np.ndarray, np.ndarray, int, float]]] = \
            [[] for _ in range(games)]
        self.finished: list[GameRecord] = []
        self.moves = 0
        self.games_played = 0
        self.pending = np.arange(0)
        self.move_number = np.zeros(games, np.int64)  # of the game in each slot
        # per slot: whether this move's search is a full one (recorded), and its budget
        self.full = np.ones(games, np.bool_)
        self.budget = np.full(games, params.num_simulations, np.int64)
        for slot in range(games):
            self._search(slot, game.new_state())

    @property
    def simulations(self) -> int:
        return self.mcts.simulations

    def leaves(self) -> np.ndarray:
        """The observations of the leaves to evaluate next, [L, *obs], at most one per
        game: a game whose simulation this round ended in a finished game (backed up
        already) selects again next round, so that each round is one descent of all
        games together rather than many of a few."""
        mcts = self.mcts
        while True:
            self._decide(mcts.select(np.flatnonzero(mcts.leaf < 0)))
            self.pending = np.flatnonzero(mcts.leaf >= 0)
            if len(self.pending):
                return mcts.leaf_observations(self.pending)

    def feed(self, logits: np.ndarray, values: np.ndarray) -> None:
        """The evaluations of the last :meth:`leaves`, in their order."""
        self.mcts.expand(self.pending, logits, values)
        self._decide(self.pending)
        self.pending = self.pending[:0]

    def take_finished(self) -> list[GameRecord]:
        finished, self.finished = self.finished, []
        return finished

    def _search(self, slot: int, state: Any, action: int = -1) -> None:
        """Start the search of the move from ``state`` (reached by the root's ``action``;
        -1: a new game): full or fast (see the module docstring; the random draw only
        when fast searches are on, so that without them the games are the same as before
        they existed), in a fresh tree or the kept subtree."""
        p = self.params
        full = p.full_search_fraction >= 1.0 or self.rng.random() < p.full_search_fraction
        self.full[slot] = full
        self.budget[slot] = p.num_simulations if full else p.fast_simulations
        if p.reuse_trees and action >= 0:
            self.mcts.advance(slot, action, state, noise=full)
        else:
            self.mcts.reset(slot, state, noise=full)

    def _decide(self, slots: np.ndarray) -> None:
        """Move in the games of ``slots`` whose root has had its simulations (again
        where a kept subtree already has them)."""
        mcts = self.mcts
        while len(slots):
            ready = slots[mcts.root_visits(slots) >= self.budget[slots]]
            for slot in ready.tolist():
                self._move(slot)
            slots = ready if self.params.reuse_trees else ready[:0]

    def _move(self, slot: int) -> None:
        """Play the move the finished search in ``slot`` chose; record it if full."""
        mcts, game = self.mcts, self.game
        root = mcts.root_state(slot)
        visits = mcts.visits[slot, 0]
        policy = visits / visits.sum()
        if self.move_number[slot] < self.params.temperature_moves:
            action = int(self.rng.choice(len(policy), p=policy))
        else:
            best = np.flatnonzero(visits == visits.max())
            action = int(best[self.rng.integers(len(best))])
        if self.full[slot]:
            # the search's value of the root for its player to move
            root_value = float(mcts.value_sum[slot, 0].sum() / visits.sum())
            self.history[slot].append((game.observation(root), policy.astype(np.float32),
                                       root.current_player(), root_value))
        state = root.clone()
        state.apply_action(action)
        self.moves += 1
        self.move_number[slot] += 1
        if state.is_terminal():
            self._finish(slot, state.returns())
            state, action = game.new_state(), -1
        self._search(slot, state, action)

    def _finish(self, slot: int, returns: list[float]) -> None:
        moves = int(self.move_number[slot])
        self.move_number[slot] = 0
        self.games_played += 1
        history, mix = self.history[slot], self.params.value_target_mix
        self.history[slot] = []
        if not history:
            return  # every move of it searched fast: nothing to learn from
        outcome = np.array([returns[h[2]] for h in history], np.float32)
        if mix:
            outcome = (1 - mix) * outcome + mix * np.array([h[3] for h in history],
                                                           np.float32)
        record = GameRecord(obs=np.stack([h[0] for h in history]),
                            policy=np.stack([h[1] for h in history]), outcome=outcome,
                            returns=(float(returns[0]), float(returns[1])), moves=moves)
        self.finished.append(record.with_mirror(self.game) if self.params.mirror_games
                             else record)


def search(game: Game, states: list[Any], evaluate: Evaluator, params: SearchParams,
           seed: int = 0) -> np.ndarray:
    """The root visit counts [len(states), A] after ``params.num_simulations``
    simulations from each of ``states`` (not terminal), searched side by side."""
    rng = np.random.default_rng(seed)
    mcts = BatchedMCTS(game, len(states), params, rng)
    for slot, state in enumerate(states):
        mcts.reset(slot, state.clone())
    slots = np.arange(len(states))
    while True:
        todo = slots[(mcts.leaf < 0) & (mcts.root_visits(slots) < params.num_simulations)]
        if not len(todo):
            return mcts.visits[:, 0].copy()
        mcts.select(todo)
        waiting = np.flatnonzero(mcts.leaf >= 0)
        if len(waiting):
            mcts.expand(waiting, *evaluate(mcts.leaf_observations(waiting)))


# ----- evaluators ---------------------------------------------------------------------
def uniform_for(game: Game) -> Evaluator:
    """Equal priors and a value of 0 everywhere: plain PUCT search, no network."""
    a = game.num_actions

    def evaluate(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((len(obs), a), np.float32), np.zeros(len(obs), np.float32)
    return evaluate


def model_evaluator(model: Any, one_by_one: bool = False,
                    precision: str = "float32") -> Evaluator:
    """The policy-value ``model`` (``zmqrl.parts.alphazero.models``) in this process: all
    leaves in one forward pass, or (``one_by_one``) a forward pass per leaf, as a
    search that does not batch evaluates them; in ``precision`` (as the inference
    broker's arg of that name)."""
    import torch

    from zmqrl.parts.devices import autocast

    device = next(model.parameters()).device

    def forward(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with autocast(device, precision):
            logits, value = model.predict(torch.from_numpy(obs).to(device))
        return logits.float().cpu().numpy(), value.float().cpu().numpy()

    def evaluate(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not one_by_one:
            return forward(obs)
        outs = [forward(obs[i:i + 1]) for i in range(len(obs))]
        return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])
    return evaluate
