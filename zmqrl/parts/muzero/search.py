"""Monte-Carlo tree search in a learned model, as MuZero runs it, over many games at once.

MuZero (Schrittwieser et al. 2020, Appendix B and its pseudocode) searches without the
game's rules: a node is a latent state of the model, its children the latents that the
model's dynamics gives for each action, with the reward of that transition. Single
player, discounted. One :class:`LatentMCTS` holds a tree for each of ``slots`` games as
arrays with the games as their first axis (like ``zmqrl.parts.search.mcts.BatchedMCTS``):
per node and action the child's index, the visits N(s, a), the sum of the backed-up
returns of the edge and the prior P(s, a); per node the reward of the edge into it. Each
simulation adds one node, so a tree has ``num_simulations + 1`` nodes, node 0 the root.

Lockstep rounds: every slot starts its search together (:meth:`LatentMCTS.set_roots`,
with the evaluations of the roots) and each round does one simulation in every slot:
:meth:`~LatentMCTS.select` descends each tree from its root to an edge never taken and
returns (parent node, action, new node); whoever evaluates runs the model's dynamics and
prediction on (latent of parent, action) and answers with :meth:`~LatentMCTS.expand`
(reward, policy logits, value of the new node, one row per slot). The tree itself holds
no latents: they live with whoever evaluates, stored by node index: the inference broker
on the bus, which batches the leaves of many actors into one forward pass, or
:func:`search` in this process.

The descent picks, at each node s, by pUCT

    a = argmax_a  Qn(s, a) + P(s, a) * sqrt(N(s)) / (1 + N(s, a))
                             * (pb_c_init + log((N(s) + pb_c_base + 1) / pb_c_base))

with N(s) the visits of node s (the root's: its simulations so far, at least 1; any
other node's first visit is its own evaluation) and Q(s, a) = r(s, a) + discount *
V(child), the mean return of the edge. Rewards and values are in the units of the
environment, not [-1, 1] as in a board game, so Q is normalized per tree by the
smallest and largest of the root's value and the Qs seen so far in it,
Qn = (Q - min) / (max - min), which keeps the exploration term in scale with it
(while max <= min, Q stays as it is; an unvisited edge counts 0). Ties go to the lowest
action.

The new node's value v is backed up its path, deepest edge first: the edge into a node
adds G = r + discount * G', G' what the edge below added (v for the new node's own
edge), counts a visit, and widens the tree's min-max with its mean Q. The root's value
is the mean of what its edges added (MuZero's ``root.value()``).

At the roots the priors may be mixed with Dirichlet noise, P = (1 - f) P + f Dir(alpha),
for exploration in self-play (not in evaluation games). The move is chosen from the
root's visits by :func:`choose_action`: in proportion to N^(1/T), the most visited at
T = 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# (observations [m, *obs]) -> (latents [m, L], policy logits [m, A], values [m])
Initial = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
# (latents [m, L], actions [m]) -> (latents [m, L], rewards [m], logits [m, A], values [m])
Recurrent = Callable[[np.ndarray, np.ndarray],
                     tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class SearchParams:
    """What the search needs of ``algo`` (``zmqrl.parts.muzero.config.MuZeroConfig``)."""

    num_simulations: int = 25
    discount: float = 0.997
    pb_c_base: float = 19652.0
    pb_c_init: float = 1.25
    dirichlet_alpha: float = 0.25
    dirichlet_fraction: float = 0.25  # 0: no root noise (evaluation games)
    temperature: float = 1.0  # of choose_action: moves drawn ∝ N^(1/T); 0: the most visited

    @classmethod
    def of(cls, cfg: Any, **overrides: Any) -> SearchParams:
        """The fields of ``cfg`` of the same names, then ``overrides``."""
        names = cls.__dataclass_fields__
        return cls(**{**{k: getattr(cfg, k) for k in names if hasattr(cfg, k)}, **overrides})


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in float64."""
    x = np.asarray(logits, np.float64)
    x = np.exp(x - x.max(-1, keepdims=True))
    return x / x.sum(-1, keepdims=True)


class LatentMCTS:
    """The trees of ``slots`` games searched in lockstep (see the module docstring)."""

    def __init__(self, slots: int, num_actions: int, params: SearchParams,
                 rng: np.random.Generator):
        self.slots, self.num_actions = slots, num_actions
        self.params, self.rng = params, rng
        m = params.num_simulations + 1  # one node per simulation, and the root
        shape = (slots, m, num_actions)
        self.child = np.full(shape, -1, np.int64)
        self.visits = np.zeros(shape, np.float64)  # N(s, a)
        self.value_sum = np.zeros(shape, np.float64)  # sum of r + discount * G, per edge
        self.prior = np.zeros(shape, np.float64)
        self.reward = np.zeros((slots, m), np.float64)  # of the edge into each node
        self.root_estimate = np.zeros(slots, np.float64)  # the model's value of the root
        self.q_min = np.full(slots, np.inf)
        self.q_max = np.full(slots, -np.inf)
        # the last descent: nodes and actions from the root, and the node made at its end
        self.path_node = np.zeros((slots, m), np.int64)
        self.path_action = np.zeros((slots, m), np.int64)
        self.path_len = np.zeros(slots, np.int64)
        self.pending = np.full(slots, -1, np.int64)
        self.rows = np.arange(slots)
        self.count = 0  # simulations of each slot in this search (lockstep: all alike)
        self.simulations = 0  # simulations done, all slots and searches together
        self.started = False

    @property
    def done(self) -> bool:
        """Every slot has had its ``num_simulations`` simulations."""
        return self.count >= self.params.num_simulations

    def set_roots(self, logits: np.ndarray, value: np.ndarray, noise: bool = True) -> None:
        """Fresh trees, each root expanded with ``softmax(logits)`` [slots, A] (mixed with
        Dirichlet noise when ``noise`` and ``params.dirichlet_fraction`` > 0) and the
        model's ``value`` [slots] of it (the root's value until a simulation is done)."""
        logits = np.asarray(logits)
        if logits.shape != (self.slots, self.num_actions):
            raise ValueError(f"root logits of shape {logits.shape}, expected "
                             f"{(self.slots, self.num_actions)}")
        self.child.fill(-1)
        for array in (self.visits, self.value_sum, self.prior, self.reward):
            array.fill(0.0)
        # The min-max range starts at the root's value (as mctx's bounds include the
        # parent's value): with the first Q alone the range would be empty, Q would stay
        # raw (tens on CartPole) and outweigh every prior until a second Q is seen.
        self.q_min[:] = self.q_max[:] = np.asarray(value, np.float64).reshape(self.slots)
        self.path_len.fill(0)
        self.pending.fill(-1)
        self.count = 0
        self.started = True
        prior = softmax(logits)
        p = self.params
        if noise and p.dirichlet_fraction > 0:
            dirichlet = self.rng.dirichlet(np.full(self.num_actions, p.dirichlet_alpha),
                                           size=self.slots)
            prior = (1 - p.dirichlet_fraction) * prior + p.dirichlet_fraction * dirichlet
        self.prior[:, 0] = prior
        self.root_estimate[:] = np.asarray(value, np.float64).reshape(self.slots)

    def select(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One descent per slot by pUCT to an edge never taken, whose node it makes.
        Returns (parent node [slots], action [slots], new node [slots]): the evaluation
        :meth:`expand` wants is the dynamics of (latent of parent, action), stored at the
        new node."""
        if not self.started:
            raise RuntimeError("select() before set_roots()")
        if self.done:
            raise RuntimeError("select() after the search's last simulation")
        if (self.pending >= 0).any():
            raise RuntimeError("select() twice without expand()")
        p = self.params
        node = np.zeros(self.slots, np.int64)
        parent = np.zeros(self.slots, np.int64)
        action = np.zeros(self.slots, np.int64)
        active = self.rows  # slots still descending
        lo, hi = self.q_min[:, None], self.q_max[:, None]
        for depth in range(self.count + 1):  # a tree of count + 1 nodes is no deeper
            g, n = active, node[active]
            visits = self.visits[g, n]
            q = self.value_sum[g, n] / np.maximum(visits, 1.0)
            spread = hi[g] - lo[g]
            q = np.where(spread > 0, (q - lo[g]) / np.where(spread > 0, spread, 1.0), q)
            q = np.where(visits > 0, q, 0.0)
            # N(s); at least 1, so that a root's first descent follows its priors (with
            # sqrt(0) every score is 0 and the first action would always win the tie)
            total = np.maximum(visits.sum(-1, keepdims=True) + (n != 0)[:, None], 1.0)
            c = p.pb_c_init + np.log((total + p.pb_c_base + 1.0) / p.pb_c_base)
            score = q + self.prior[g, n] * np.sqrt(total) / (1.0 + visits) * c
            a = score.argmax(-1)
            self.path_node[g, depth] = n
            self.path_action[g, depth] = a
            self.path_len[g] = depth + 1
            nxt = self.child[g, n, a]
            new = nxt < 0
            parent[g[new]], action[g[new]] = n[new], a[new]
            node[g] = nxt
            active = g[~new]
            if not len(active):
                break
        index = self.count + 1  # lockstep: every tree makes its node number count + 1
        self.child[self.rows, parent, action] = index
        self.pending[:] = index
        return parent, action, self.pending.copy()

    def expand(self, reward: np.ndarray, logits: np.ndarray, value: np.ndarray) -> None:
        """The evaluations of the nodes :meth:`select` just made, one row per slot: the
        ``reward`` [slots] of the edge into each, its policy ``logits`` [slots, A] (the
        node's priors; no noise below a root) and ``value`` [slots], backed up."""
        if (self.pending < 0).any():
            raise RuntimeError("expand() without select()")
        rows, leaf, d = self.rows, self.pending, self.params.discount
        self.reward[rows, leaf] = np.asarray(reward, np.float64).reshape(self.slots)
        self.prior[rows, leaf] = softmax(logits)
        g_ret = np.asarray(value, np.float64).reshape(self.slots).copy()  # G, per slot
        length = self.path_len
        for depth in range(int(length.max()) - 1, -1, -1):  # deepest edges first
            on = np.flatnonzero(length > depth)
            n, a = self.path_node[on, depth], self.path_action[on, depth]
            ret = self.reward[on, self.child[on, n, a]] + d * g_ret[on]
            g_ret[on] = ret
            self.value_sum[on, n, a] += ret
            self.visits[on, n, a] += 1.0
            q = self.value_sum[on, n, a] / self.visits[on, n, a]
            self.q_min[on] = np.minimum(self.q_min[on], q)
            self.q_max[on] = np.maximum(self.q_max[on], q)
        self.pending.fill(-1)
        self.count += 1
        self.simulations += self.slots

    def root_visits(self) -> np.ndarray:
        """The visits of each root's edges, [slots, A] (a copy)."""
        return self.visits[:, 0].copy()

    def root_value(self) -> np.ndarray:
        """The search's value of each root, [slots]: the mean return of its simulations
        (the model's value of the root before any)."""
        visits = self.visits[:, 0].sum(-1)
        mean = self.value_sum[:, 0].sum(-1) / np.maximum(visits, 1.0)
        return np.where(visits > 0, mean, self.root_estimate)


def choose_action(visits: np.ndarray, temperature: float,
                  rng: np.random.Generator) -> np.ndarray:
    """An action per row of root ``visits`` [n, A], drawn with probabilities ∝ N^(1/T);
    at ``temperature`` 0 the most visited, ties broken at random. (A row without visits
    draws uniformly.)"""
    visits = np.asarray(visits, np.float64)
    n, num_actions = visits.shape
    if temperature == 0:
        best = visits == visits.max(-1, keepdims=True)
        return np.where(best, rng.random((n, num_actions)), -1.0).argmax(-1)
    with np.errstate(divide="ignore"):
        logs = np.log(visits) / temperature  # in logs: N^(1/T) overflows for small T
    logs = np.where(np.isfinite(logs.max(-1, keepdims=True)), logs, 0.0)  # no visits
    weights = np.exp(logs - logs.max(-1, keepdims=True))
    cumulative = np.cumsum(weights, -1)
    draw = rng.random((n, 1)) * cumulative[:, -1:]
    # the first action whose cumulative weight passes the draw (a zero weight never does)
    return np.minimum((cumulative <= draw).sum(-1), num_actions - 1).astype(np.int64)


def search(initial: Initial, recurrent: Recurrent, obs: np.ndarray, params: SearchParams,
           rng: np.random.Generator, one_by_one: bool = False
           ) -> tuple[np.ndarray, np.ndarray]:
    """Search from each of the observations ``obs`` [n, *obs] in this process: the root
    visits [n, A] and root values [n] after ``params.num_simulations`` simulations.
    ``initial`` and ``recurrent`` are the model's (numpy in and out; see ``Initial`` and
    ``Recurrent``); the latents are kept here, [n, nodes, L]. ``one_by_one``: each call
    of them takes one row, as a search that does not batch evaluates (for comparison)."""
    count = len(obs)

    def call(fn: Callable[..., tuple[np.ndarray, ...]], *args: np.ndarray
             ) -> tuple[np.ndarray, ...]:
        if not one_by_one:
            return tuple(np.asarray(x) for x in fn(*args))
        outs = [fn(*(x[i:i + 1] for x in args)) for i in range(count)]
        return tuple(np.concatenate([np.asarray(o[k]) for o in outs])
                     for k in range(len(outs[0])))

    latent, logits, value = call(initial, np.asarray(obs))
    mcts = LatentMCTS(count, logits.shape[-1], params, rng)
    mcts.set_roots(logits, value)
    latents = np.empty((count, params.num_simulations + 1, *latent.shape[1:]), latent.dtype)
    latents[:, 0] = latent
    rows = np.arange(count)
    while not mcts.done:
        parent, action, node = mcts.select()
        latent, reward, logits, value = call(recurrent, latents[rows, parent], action)
        latents[rows, node] = latent
        mcts.expand(reward, logits, value)
    return mcts.root_visits(), mcts.root_value()
