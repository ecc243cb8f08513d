"""What every behaviour that feeds a replay n-step transitions shares, whatever picks
its actions: cutting the stream of steps into n-step transitions, holding them back
until ``insert_batch`` can go in one insert, and their initial priorities.

A subclass chooses the actions (``inputs``/``forward``/``record``, remembering
``self._last = (obs, action)`` and ``self.version``) and says how an insert's initial
priorities |δ| are computed with the acting network (:meth:`priorities`): ε-greedy
Q-learning (``q_learning.py``) and the continuous-control behaviours
(``zmqrl.parts.continuous.acting``) are such subclasses.

An env whose episode ended contributes its transition with the final observation as
``next_obs`` where a time limit cut it (the target bootstraps from it) and with the
next observation otherwise (a terminal transition's target does not look at it).
"""

from __future__ import annotations

import numpy as np

from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, Item, take_all
from zmqrl.parts.dqn.learner import NStepAccumulator


class NStepTransitionBehaviour(Behaviour):
    ships = wire.INSERT

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self.rng = np.random.default_rng(setup.seed)
        self.nstep = NStepAccumulator(n, setup.cfg.n_step, setup.cfg.discount)
        self.pending: list[dict[str, np.ndarray]] = []
        self._last: tuple | None = None  # (obs, action) of the step awaiting its outcome
        self._result: tuple | None = None  # (reward, done, truncated, final_obs)
        self.version = 0  # of the parameters that acted last

    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        if self._result is not None:  # the transition is complete with its next obs
            (last_obs, action), (reward, done, truncated, final_obs) = self._last, self._result
            next_obs = obs
            if truncated.any():
                next_obs = np.array(obs)
                next_obs[truncated] = final_obs
            finished = self.nstep.push(last_obs, action, reward, done & ~truncated, next_obs,
                                       truncated)
            if finished is not None:
                self.pending.append(finished)
            self._result = None
        super().observe(obs, fields)

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        self._result = (reward, done, truncated, final_obs)

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        """Initial priorities |δ| [B] of the transitions ``items`` (obs, action, reward,
        discount, next_obs), with the acting network."""
        raise NotImplementedError

    def take(self) -> list[Item]:
        if sum(len(p["action"]) for p in self.pending) < self.setup.insert_batch:
            return []
        items = take_all(self.pending)
        if items is None:
            return []
        if self.setup.priorities:
            items["priority"] = np.asarray(self.priorities(items), np.float32)
        return [Item(wire.INSERT, items, {"version": self.version})]
