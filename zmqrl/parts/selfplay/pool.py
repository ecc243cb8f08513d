"""The opponent pool of self-play: past snapshots of the policy and who plays whom.

The pool follows the parameter version of the model it snapshots (the learner's update
count, which the broker's model carries): whenever the version reaches the next multiple
of ``snapshot_every`` it keeps a copy, the newest ``pool_size`` of them. Per episode
:meth:`OpponentPool.sample` draws the opponent: the latest policy with probability
``latest_fraction`` (OpenAI Five used 0.8), else a past snapshot, uniformly. The result
of every game against a snapshot (win, draw or loss of the latest policy) is counted per
snapshot: :meth:`OpponentPool.table` is the win-rate table.

What a snapshot is (a copy of a torch module) is the caller's: the pool holds whatever
``make`` returns, so it imports no torch.

Persistence: :class:`SavedPool` is the pool as a checkpoint Saveable
(``zmqrl.parts.checkpoint``, TORCH format; the inference broker's
``checkpoints/<label>.pool.pt``). Format 1, a plain dict::

    {"format": 1, "next_at": 60, "ids": 3, "taken": 3,
     "snapshots": [{"id": 1, "version": 20, "results": [5, 1, 2],  # oldest first
                    "model": <state dict>}, ...]}

``results`` are the latest policy's wins, draws and losses against that snapshot. The
version last seen is not kept: a restored pool counts from the version it next sees.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zmqrl.parts.selfplay.config import SelfPlayConfig

log = logging.getLogger(__name__)

LATEST = -1  # the opponent id of the latest policy


@dataclass
class Snapshot:
    id: int  # unique in this pool (versions may repeat after a learner restart)
    version: int  # the parameter version it was taken at
    model: Any
    results: list[int] = field(default_factory=lambda: [0, 0, 0])  # latest's wins, draws, losses

    @property
    def name(self) -> str:
        return f"v{self.version}"


class OpponentPool:
    def __init__(self, config: SelfPlayConfig):
        self.config = config
        self.snapshots: dict[int, Snapshot] = {}  # id -> snapshot, oldest first
        self.next_at = 0  # the version that triggers the next snapshot (0: the initial policy)
        self.last_version = -1
        self._ids = 0
        self.taken = 0

    def maybe_snapshot(self, version: int, make: Callable[[], Any]) -> Snapshot | None:
        """Keep ``make()`` as a snapshot if ``version`` reached the next multiple of
        ``snapshot_every``; the new snapshot, or None."""
        every = self.config.snapshot_every
        if version < self.last_version:  # a restarted learner: count from where it is
            self.next_at = (version // every + 1) * every
        self.last_version = version
        if version < self.next_at:
            return None
        snap = Snapshot(self._ids, version, make())
        self._ids += 1
        self.taken += 1
        self.snapshots[snap.id] = snap
        while len(self.snapshots) > self.config.pool_size:
            del self.snapshots[next(iter(self.snapshots))]
        self.next_at = (version // every + 1) * every
        log.info("pool: snapshot %s taken (%d held); latest against the pool: %s",
                 snap.name, len(self.snapshots), self.summary())
        return snap

    def sample(self, rng: np.random.Generator) -> int:
        """An episode's opponent: :data:`LATEST` or a snapshot's id."""
        if not self.snapshots or rng.random() < self.config.latest_fraction:
            return LATEST
        ids = list(self.snapshots)
        return ids[int(rng.integers(len(ids)))]

    def model(self, opponent: int) -> Any | None:
        """The model of snapshot ``opponent`` (None: evicted since it was drawn)."""
        snap = self.snapshots.get(opponent)
        return None if snap is None else snap.model

    def record(self, opponent: int, outcome: float) -> None:
        """A finished game of the latest policy against ``opponent``: its outcome for the
        latest policy (> 0 win, 0 draw, < 0 loss). Games against the latest itself and
        against evicted snapshots are not counted."""
        snap = self.snapshots.get(opponent)
        if snap is not None:
            snap.results[0 if outcome > 0 else 1 if outcome == 0 else 2] += 1

    def table(self) -> dict[str, dict[str, float]]:
        """Per snapshot (oldest first): the latest policy's wins, draws, losses against
        it and its win rate (draws count half)."""
        out = {}
        for snap in self.snapshots.values():
            wins, draws, losses = snap.results
            games = wins + draws + losses
            out[snap.name] = {"wins": wins, "draws": draws, "losses": losses,
                              "win_rate": round((wins + 0.5 * draws) / games, 3) if games
                              else float("nan")}
        return out

    def summary(self) -> str:
        """The table on one line: ``v20 0.71 (35), v40 0.55 (31)`` (win rate, games)."""
        parts = [f"{name} {row['win_rate']:.2f} ({row['wins'] + row['draws'] + row['losses']:.0f})"
                 for name, row in self.table().items()
                 if row["wins"] + row["draws"] + row["losses"]]
        return ", ".join(parts) or "no games yet"


POOL_FORMAT = 1


class SavedPool:
    """``pool`` as a checkpoint Saveable: each snapshot's model is saved as its
    ``state_dict()`` and restored by ``load(state_dict)`` (the caller's: a frozen copy of
    its model holding those weights)."""

    def __init__(self, pool: OpponentPool, load: Callable[[Any], Any]):
        self.pool, self.load = pool, load

    def state(self) -> dict[str, Any]:
        pool = self.pool
        return {"format": POOL_FORMAT, "next_at": int(pool.next_at), "ids": int(pool._ids),
                "taken": int(pool.taken),
                "snapshots": [{"id": s.id, "version": s.version, "results": list(s.results),
                               "model": s.model.state_dict()}
                              for s in pool.snapshots.values()]}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("format") != POOL_FORMAT:
            raise ValueError(f"opponent pool checkpoint format {state.get('format')!r}, "
                             f"expected {POOL_FORMAT}")
        try:
            saved = [(int(s["id"]), int(s["version"]), [int(x) for x in s["results"]],
                      s["model"]) for s in state["snapshots"]]
            next_at, ids, taken = int(state["next_at"]), int(state["ids"]), int(state["taken"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"opponent pool checkpoint: missing or mistyped {exc}") from exc
        if any(len(results) != 3 for _, _, results, _ in saved):
            raise ValueError("opponent pool checkpoint: results must be [wins, draws, losses]")
        # the newest pool_size (the section may hold a smaller pool than the saved run)
        saved = saved[max(0, len(saved) - self.pool.config.pool_size):]
        snapshots = {i: Snapshot(i, version, self.load(model), results)
                     for i, version, results, model in saved}
        pool = self.pool
        pool.snapshots, pool.next_at, pool.taken = snapshots, next_at, taken
        pool._ids = max([ids, *(i + 1 for i in snapshots)])
        pool.last_version = -1
