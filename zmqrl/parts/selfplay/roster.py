"""The players a population's broker holds: every member's current policy and frozen
snapshots of them, with the ratings the league last published.

Players have small integer ids, the rows' tags in a forward pass: member ``k``'s current
policy is id ``k`` (named ``m<k>``), snapshots get ids from ``K`` up (named
``m<k>@v<version>``, never reused). A member's snapshot is taken whenever its parameter
version reaches the next multiple of ``snapshot_every``; each member keeps its newest
``pool_size``. A game whose snapshot was evicted mid-game is finished by that member's
current policy (:meth:`Roster.model`), and its result is not rated (it was neither player's
alone): :meth:`Roster.intact`.

The finished games wait in :attr:`Roster.games` for the broker to send to the league
(``games`` messages), as ``(seat 0's name, seat 1's name, seat 0's score)``.

What a model is belongs to the caller (the broker's torch modules): nothing here
imports torch. Persistence: :meth:`state`/:meth:`restore` keep the snapshots (their
state dicts, through ``load``) so a restarted broker plays the same opponents the
league has rated.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zmqrl.parts.selfplay.matchmaking import Candidate

FORMAT = 1
MAX_RETIRED = 1024  # evicted snapshots remembered by name (for the games still playing them)


def current_name(member: int) -> str:
    return f"m{member}"


def snapshot_name(member: int, version: int) -> str:
    return f"m{member}@v{version}"


@dataclass
class Snapshot:
    id: int
    member: int
    version: int
    model: Any

    @property
    def name(self) -> str:
        return snapshot_name(self.member, self.version)


class Roster:
    def __init__(self, members: list[Any], snapshot_every: int, pool_size: int,
                 initial_rating: float = 1000.0):
        if not members:
            raise ValueError("a population has at least one member")
        self.members = list(members)  # member k's current model
        self.snapshot_every, self.pool_size = snapshot_every, pool_size
        self.initial_rating = initial_rating
        self.versions = [0] * len(members)
        self.next_at = [0] * len(members)  # the version that takes the next snapshot
        self.snapshots: dict[int, Snapshot] = {}
        self.by_member: list[deque[int]] = [deque() for _ in members]
        self._next_id = len(members)
        self.ratings: dict[str, float] = {}  # the league's, as last published
        self.games: list[tuple[str, str, float]] = []  # finished, not yet sent
        self.keep_games = True  # False: no league to send them to (only counted)
        self.finished = 0  # games finished for the league to rate, ever
        self.unrated = 0  # games not rated: a player evicted or joined mid-game
        # evicted snapshots: id -> (name, member), the newest MAX_RETIRED (games in play)
        self.retired: dict[int, tuple[str, int]] = {}

    @property
    def size(self) -> int:
        return len(self.members)

    def name(self, player: int) -> str:
        if player < self.size:
            return current_name(player)
        snap = self.snapshots.get(player)
        if snap is not None:
            return snap.name
        return self.retired.get(player, (f"evicted#{player}", -1))[0]

    def member_of(self, player: int) -> int:
        """Whose policy ``player`` is (-1: an id this roster never gave out)."""
        if player < self.size:
            return player
        snap = self.snapshots.get(player)
        if snap is not None:
            return snap.member
        return self.retired.get(player, ("", -1))[1]

    def intact(self, player: int) -> bool:
        """Whether ``player`` is still held (a current policy, or a snapshot not evicted)."""
        return player < self.size or player in self.snapshots

    def model(self, player: int) -> Any:
        """The model playing as ``player``: an evicted snapshot's member's current one."""
        if player < self.size:
            return self.members[player]
        snap = self.snapshots.get(player)
        return snap.model if snap is not None else None

    def on_version(self, member: int, version: int, make: Callable[[], Any]) -> Snapshot | None:
        """Member ``member``'s current model is at ``version`` now; keep ``make()`` as a
        snapshot if that reached its next snapshot point."""
        every = self.snapshot_every
        if version < self.versions[member]:  # a restarted learner: count from where it is
            self.next_at[member] = (version // every + 1) * every
        self.versions[member] = version
        if version < self.next_at[member]:
            return None
        return self._add(member, version, make())

    def _add(self, member: int, version: int, model: Any) -> Snapshot:
        snap = Snapshot(self._next_id, member, version, model)
        self._next_id += 1
        self.snapshots[snap.id] = snap
        held = self.by_member[member]
        held.append(snap.id)
        while len(held) > self.pool_size:
            self._retire(held.popleft())
        self.next_at[member] = (version // self.snapshot_every + 1) * self.snapshot_every
        return snap

    def _retire(self, player: int) -> None:
        snap = self.snapshots.pop(player, None)
        if snap is not None:
            self.retired[player] = (snap.name, snap.member)
            while len(self.retired) > MAX_RETIRED:
                del self.retired[next(iter(self.retired))]

    # ----- matchmaking --------------------------------------------------------------
    def rating(self, player: int) -> float:
        """The league's rating of ``player``; one not rated yet: its member's."""
        name = self.name(player)
        if name in self.ratings:
            return self.ratings[name]
        member = self.member_of(player)
        return self.ratings.get(current_name(member), self.initial_rating) \
            if member >= 0 else self.initial_rating

    def candidates(self) -> tuple[list[int], list[Candidate]]:
        """Every player (ids) and its :class:`Candidate` for a matchmaker."""
        ids = [*range(self.size), *self.snapshots]
        return ids, [Candidate(self.name(i), self.rating(i), i < self.size) for i in ids]

    def finish(self, first: str, second: str, score: float) -> None:
        """A game ended: ``first`` (seat 0) scored ``score`` against ``second``."""
        self.finished += 1
        if self.keep_games:
            self.games.append((first, second, score))

    def take_games(self) -> list[tuple[str, str, float]]:
        games, self.games = self.games, []
        return games

    # ----- persistence (a checkpoint Saveable's halves, with the caller's models) ---------
    def state(self, weights: Callable[[Any], Any]) -> dict[str, Any]:
        return {"format": FORMAT, "next_id": self._next_id, "next_at": list(self.next_at),
                "snapshots": [{"id": s.id, "member": s.member, "version": s.version,
                               "model": weights(s.model)} for s in self.snapshots.values()]}

    def restore(self, state: dict[str, Any], load: Callable[[Any], Any]) -> None:
        if state.get("format") != FORMAT:
            raise ValueError(f"roster checkpoint format {state.get('format')!r}, "
                             f"expected {FORMAT}")
        try:
            saved = [(int(s["id"]), int(s["member"]), int(s["version"]), s["model"])
                     for s in state["snapshots"]]
            next_at = [int(v) for v in state["next_at"]]
            next_id = int(state["next_id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"roster checkpoint: missing or mistyped {exc}") from exc
        if len(next_at) != self.size or any(not 0 <= m < self.size for _, m, _, _ in saved):
            raise ValueError(f"roster checkpoint: saved for another population size "
                             f"(this one has {self.size} members)")
        self.snapshots.clear()
        for held in self.by_member:
            held.clear()
        for i, member, version, weights in saved:
            snap = Snapshot(i, member, version, load(weights))
            self.snapshots[i] = snap
            self.by_member[member].append(i)
        for held in self.by_member:  # a smaller pool_size than the run that saved it
            while len(held) > self.pool_size:
                self.snapshots.pop(held.popleft(), None)
        self.next_at = next_at
        self._next_id = max([next_id, *(i + 1 for i in self.snapshots)])
