"""Population league: rates every player of a population's games and publishes the Elo.

Brokers that play a population's games (members ``m0..m<K-1>``, their frozen snapshots
``m<k>@v<n>``) send every finished game to our ``games`` port (``games``: the players'
names, then per game the seats' indices and seat 0's score). Each game updates both
players' ratings at once (:class:`zmqrl.parts.selfplay.ratings.Ratings`: a current
policy keeps a constant K, a snapshot's K settles with its games). A player is rated
from the first game that names it: a snapshot (any name with ``@``) is frozen and starts
at its member's rating at that moment (the member as the snapshot was taken is about as
strong), any other player at ``initial``. A message is checked whole before any of it
is applied: a bad one is refused with an ``error`` reply and changes nothing.

Every ``publish_every_s``, and at once when someone subscribes, the ``ratings`` port
(PUB) publishes every player's rating (brokers match players by it, the PBT controller
ranks members by it). A player no game named for ``forget_after_s`` is dropped
(brokers evict old snapshots from their pools), unless it is a member's current policy.
The members are the population's K current policies ``m0..m<K-1>`` (``members``, by
default the topology's ``population.size``), not whatever matches the pattern: any
other name is a non-member, forgotten when idle. At most ``MAX_RATED`` players are
rated at once, room for the K members always kept (:mod:`zmqrl.parts.selfplay.room`): a
message that names more new players than there is room for first evicts the least
recently seen non-members (not those it names), then rates the part of its games whose
players fit and skips the rest (``games_skipped``, logged). So a peer that names
thousands of made-up players can neither freeze the ratings nor keep them out of the
checkpoint for good: the next honest games evict them in turn.

Files in the run directory: ``league/ratings.jsonl``, one line every ``history_every_s``
with the members' ratings (for plots; none while no game was rated since the last), and
the checkpoint ``checkpoints/<label>.json`` (the ratings and how long each player has
been idle), written every ``checkpoint_every_s`` and at exit (0: only at exit), restored at start.
Metrics: ``games_rated``, ``players``, ``population/elo_m<k>`` per member and
``population/elo_best`` (the best member's, in the progress line).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.bus import messages, wire
from zmqrl.bus.node import Node
from zmqrl.bus.spec import NodeSpec, TopologySpec
from zmqrl.parts.checkpoint import JSON, Checkpointer, node_checkpoint
from zmqrl.parts.selfplay import room
from zmqrl.parts.selfplay.ratings import MAX_RATING, Ratings
from zmqrl.run.population import population_size

FORMAT = 1  # of the checkpoint: {"format", "ratings": Ratings.state(), "idle_s"}
MAX_NAME = 64  # characters of a player's name
# Players rated at once: what one ratings message carries (~75 bytes a player, far under
# the header's 1 MiB). A population of K members with pools of P snapshots needs ~K * P.
MAX_RATED = messages.MAX_PLAYERS
# Games in one message: the node applies a message in one go (~5 us a game measured on
# a loaded 2-core machine: 0.7 s for the largest), so a larger one would stall it. Above
# the backlog a population broker sends at once after our restart (its
# MAX_UNSENT_GAMES, 100 000). It also bounds a message's frames (port_frame_cap):
# 512 KiB per array, the header under its own 1 MiB cap.
MAX_GAMES = 1 << 17
_CONTEXT = messages.Context()  # games name no env or model shapes


class PopulationLeague(Node):
    binds = {"games": "router", "ratings": "pub"}
    accepts = {"games": (wire.GAMES, wire.EXPLOITED)}
    xpub_ports = frozenset({"ratings"})  # a new subscriber gets the ratings at once
    port_hwm = {"ratings": 4}  # a subscriber that falls behind gets fresh ratings, not old
    shows = {"population/elo_best": "last"}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        k: float = 16.0  # a current policy's K (Ratings)
        k_min: float = 2.0  # the least K a snapshot settles to
        settle: float = 50.0  # a snapshot's K is k / (1 + games / settle)
        initial: float = 1000.0  # a new member's rating
        publish_every_s: float = 1.0
        checkpoint_every_s: float = 10.0
        forget_after_s: float = 600.0  # a snapshot idle this long is no longer rated
        history_every_s: float = 10.0
        # the population's K (its members m0..m<K-1)); None: the topology's population.size
        members: int | None = None

    @classmethod
    def members_of(cls, args: Args, topo: TopologySpec) -> int | None:
        return args.members if args.members is not None else population_size(topo)

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: TopologySpec) -> list[tuple[tuple, str]]:
        a = cls.Args(**spec.args)  # (the args' types are checked before this)

        def where(name: str) -> tuple:
            return ("nodes", spec.name, "args", name)

        errors = [(where(name), "must be finite and > 0") for name in (
            "k", "settle", "publish_every_s", "forget_after_s", "history_every_s")
            if not (math.isfinite(getattr(a, name)) and getattr(a, name) > 0)]
        if not (math.isfinite(a.checkpoint_every_s) and a.checkpoint_every_s >= 0):
            errors.append((where("checkpoint_every_s"), "must be finite and >= 0 (0: only "
                                                        "at exit)"))
        if not (0 < a.k_min <= a.k):
            errors.append((where("k_min"), f"must be in (0, k] (k is {a.k:g})"))
        members = cls.members_of(a, topo)
        if members is None:
            errors.append((where("members"), "the league rates a population's members: set "
                                             "it, or run the league in a topology with a "
                                             "population section"))
        elif not 1 <= members <= MAX_RATED // 2:
            errors.append((where("members"), f"must be in [1, {MAX_RATED // 2}]"))
        if not (math.isfinite(a.initial) and abs(a.initial) <= MAX_RATING):
            errors.append((where("initial"), f"must be finite, of magnitude at most "
                                             f"{MAX_RATING:g}"))
        return errors

    def port_frame_cap(self, port: str) -> int | None:
        # An honest games message is a header and three arrays of at most MAX_GAMES
        # 4-byte entries: ZeroMQ drops a peer announcing a larger frame unbuffered.
        return wire.MAX_HEADER_BYTES if port == "games" else None

    def setup(self) -> None:
        a = self.args
        members = self.members_of(a, self.ctx.topo)
        assert members is not None  # (check_spec)
        self.member_names = frozenset(f"m{k}" for k in range(members))
        self.games_skipped = 0  # games naming a new player there was no room for
        self.exploits_told = 0  # PBT exploits that moved a rating (exploited messages)
        self.ratings = Ratings(a.k, a.k_min, a.settle, a.initial)
        # player -> when a game last named it (monotonic): snapshots idle too long go
        self.last_played: dict[str, float] = {}
        self.history = self.ctx.run_dir / "league" / "ratings.jsonl"
        self.history.parent.mkdir(parents=True, exist_ok=True)
        self.checkpointer = Checkpointer(
            node_checkpoint(self.ctx.run_dir, self.ctx.label, JSON.suffix), self,
            every_s=a.checkpoint_every_s, format=JSON, log=self.log)
        if self.checkpointer.restore_if_present():
            self.log.info("resumed: %d players, %d games rated; best member %s",
                          len(self.ratings.players), self.ratings.games,
                          self._best() or "none")
        # games rated when the last history line was written (a resumed run's are in it)
        self.history_games = self.ratings.games
        self.every(a.publish_every_s, self._publish)
        self.every(a.history_every_s, self._write_history)

    # ----- games in -----------------------------------------------------------------
    def on_games(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type == wire.EXPLOITED:
            self._exploited(msg)
            return
        messages.check(msg, messages.spec(wire.GAMES), _CONTEXT)  # (refuses other types too)
        players = msg.fields["players"]
        first, second, score = msg["first"], msg["second"], msg["score"]
        # Everything checked before anything is applied: a refused message changes nothing.
        if len(players) > messages.MAX_PLAYERS:
            raise wire.ProtocolError(f"games: 'players' names {len(players)} players, at "
                                     f"most {messages.MAX_PLAYERS}")
        for i, name in enumerate(players):
            if type(name) is not str or not 0 < len(name) <= MAX_NAME:
                raise wire.ProtocolError(f"games: players[{i}] must be a name of 1 to "
                                         f"{MAX_NAME} characters, got {name!r:.40}")
        if len(score) > MAX_GAMES:
            raise wire.ProtocolError(f"games: {len(score)} games in one message, at most "
                                     f"{MAX_GAMES}")
        for seat, index in (("first", first), ("second", second)):
            if len(index) and int(index.max()) >= len(players):
                raise wire.ProtocolError(f"games: '{seat}' holds index {int(index.max())}, "
                                         f"but 'players' names {len(players)}")
        named = [players[i] for i in np.unique(np.concatenate([first, second])).tolist()]
        evicted, refused = room.make_room(named, self.ratings.players, self.member_names,
                                          self.last_played, MAX_RATED)
        self._drop(evicted, "to make room")
        ratings = self.ratings
        now = time.monotonic()
        skipped = 0
        for i, j, s in zip(first.tolist(), second.tolist(), score.tolist(), strict=True):
            a, b = players[i], players[j]
            if a in refused or b in refused:
                skipped += 1
                continue
            for name in (a, b):
                if name not in ratings.players:  # first seen: where it starts, as of now
                    self._add(name)
                self.last_played[name] = now
            ratings.update(a, b, s)
        if skipped:
            self.games_skipped += skipped
            self.log_rejection("games", f"games: skipped {skipped} game(s) naming {len(refused)} "
                                        f"new player(s) beyond the {MAX_RATED} rated at once")

    def _exploited(self, msg: wire.Message) -> None:
        """PBT's word that a member copied another's weights: the recipient is now the
        donor's policy, so it takes the donor's rating (its games count stays its own)."""
        messages.check(msg, messages.spec(wire.EXPLOITED), _CONTEXT)
        recipient, donor = (f"m{msg.fields[k]}" for k in ("recipient", "donor"))
        for name in (recipient, donor):
            if name not in self.member_names:
                raise wire.ProtocolError(f"exploited: {name} is not a member of this "
                                         f"population ({len(self.member_names)} members)")
        if not self.ratings.take_rating(recipient, donor):
            return  # the donor is unrated: the recipient keeps what it has
        self.last_played[recipient] = time.monotonic()
        self.exploits_told += 1
        self.log.info("%s copied %s: rated %.0f", recipient, donor,
                      self.ratings.rating(recipient))

    def _drop(self, gone: list[str], why: str) -> None:
        if not gone:
            return
        self.ratings.forget(set(self.ratings.players) - set(gone))
        for name in gone:
            self.last_played.pop(name, None)
        self.log.info("forgot %d player(s) %s: %s", len(gone), why, ", ".join(gone[:8])
                      + (", ..." if len(gone) > 8 else ""))

    def _add(self, name: str) -> None:
        """A new player: a snapshot starts where its member is now (if rated)."""
        member, at, _ = name.partition("@")
        start = None
        if at and member in self.member_names and member in self.ratings.players:
            start = self.ratings.rating(member)
        self.ratings.add(name, start, frozen=bool(at))

    # ----- ratings out --------------------------------------------------------------
    def on_subscribe(self, port: str) -> None:
        self._publish()

    def _publish(self) -> None:
        self._forget()  # (never publish a player already dropped)
        self.send("ratings", wire.encode(wire.RATINGS, ratings=self.ratings.table(),
                                         games=self.ratings.games, source=self.incarnation))

    def _forget(self) -> None:
        """Drop every player but the members that no game named for forget_after_s."""
        since = time.monotonic() - self.args.forget_after_s
        self._drop(room.idle(self.ratings.players, self.member_names, self.last_played,
                             since), "idle")

    def _members(self) -> dict[str, float]:
        """The members' current policies' ratings, by member index."""
        found = [(int(name[1:]), name, p.rating) for name, p in self.ratings.players.items()
                 if name in self.member_names]
        return {name: round(rating, 1) for _, name, rating in sorted(found)}

    def _best(self) -> str | None:
        members = self._members()
        return max(members, key=members.__getitem__) if members else None

    def _write_history(self) -> None:
        if self.ratings.games == self.history_games:
            return  # nothing new to plot
        self.history_games = self.ratings.games
        row = {"time": time.time(), "games": self.ratings.games, "ratings": self._members()}
        with self.history.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def metrics(self) -> dict[str, Any]:
        row: dict[str, Any] = {"games_rated": self.ratings.games,
                               "players": len(self.ratings.players),
                               "games_skipped": self.games_skipped,
                               "exploits_told": self.exploits_told}
        members = self._members()
        row.update({f"population/elo_{name}": r for name, r in members.items()})
        if members:
            row["population/elo_best"] = max(members.values())
        return row

    # ----- persistence (zmqrl.parts.checkpoint.Saveable) ------------------------------
    def state(self) -> dict[str, Any]:
        # Idle times, not clock readings: the time a run is stopped counts for nobody
        # (its brokers were stopped too, with the same snapshots in their pools).
        now = time.monotonic()
        return {"format": FORMAT, "ratings": self.ratings.state(),
                "idle_s": {name: round(now - t, 3) for name, t in self.last_played.items()
                           if name in self.ratings.players}}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("format") != FORMAT:
            raise ValueError(f"population league checkpoint format {state.get('format')!r}, "
                             f"expected {FORMAT}")
        ratings = Ratings(self.args.k, self.args.k_min, self.args.settle, self.args.initial)
        ratings.restore(state["ratings"])
        now = time.monotonic()
        idle = dict(state.get("idle_s") or {})
        # a player with no idle time saved counts as just seen
        self.last_played = {name: now - max(0.0, float(idle.get(name, 0.0)))
                            for name in ratings.players}
        self.ratings = ratings

    def after_poll(self) -> None:
        self.checkpointer.maybe_save()

    def teardown(self) -> None:
        self._write_history()
        self.checkpointer.save()
