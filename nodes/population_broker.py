"""Population broker: one inference broker for a whole population of self-play learners.

It is the inference broker (``nodes/inference_broker.py``: batching every actor
connection's envs, credit-based shipping, backpressure, connection caps), holding every
member's current model instead of one: its ``params`` link subscribes to every member's
learner and its ``experience`` link reaches each member's learner on a socket of its
own (many-links: a population's shared node gets the member list from
``zmqrl/run/population.py``). Its behaviour is population play
(``zmqrl.parts.selfplay.population_acting``): every game is two players of the population,
the opponent drawn by a matchmaker (a part named in ``args.matchmaker``) by the ratings
the league publishes (``ratings`` link), every seat a current policy plays trains that
member, and every finished game goes to the league (``games`` link) to be rated.

The snapshots (``snapshot_every`` versions of each member, the newest ``pool_size``
each) persist in ``checkpoints/<label>.roster.pt``, saved on a timer and at exit and
restored at start, so a restarted broker plays the players the league has rated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import zmq

from nodes.inference_broker import InferenceBroker
from zmqrl.bus import messages, wire
from zmqrl.bus.node import Link, Outbox
from zmqrl.parts.checkpoint import TORCH, Checkpointer, node_checkpoint
from zmqrl.run.topology import NodeSpec, Topology

_RATINGS_CONTEXT = messages.Context()
MAX_UNSENT_GAMES = 100_000  # held while the league is away; older ones are dropped


class _Outboxes:
    """Each member's outbox, seen by the inference broker's loop as one: flushed
    together, full (the actors paused) when any is full — a member's learner that stops
    taking unrolls holds every game back rather than lose its member's seats."""

    def __init__(self, boxes: list[Outbox]):
        self.boxes = boxes

    def flush(self) -> None:
        for box in self.boxes:
            box.flush()

    @property
    def full(self) -> bool:
        return any(box.full for box in self.boxes)

    def __len__(self) -> int:
        return sum(len(box) for box in self.boxes)


class PopulationBroker(InferenceBroker):
    links = {"params": Link("sub", hwm=4, many=True),
             "experience": Link("dealer", immediate=True, many=True),
             "games": Link("dealer", required=False),
             "ratings": Link("sub", required=False, hwm=4)}

    @dataclass
    class Args(InferenceBroker.Args):
        # whom a member plays: a zmqrl.matchmakers part ({kind: ..., its fields})
        matchmaker: dict[str, Any] = field(default_factory=lambda: {"kind": "close"})
        snapshot_every: int = 20  # a member's parameter versions between its snapshots
        pool_size: int = 8  # snapshots kept per member (the newest)
        columns: int | None = None  # columns of a member's unroll (None: envs / 2)
        games_every_s: float = 0.5  # finished games go to the league this often

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        from zmqrl.parts.selfplay import config as self_play
        from zmqrl.parts.selfplay.matchmaking import make

        where = ("nodes", spec.name, "args")
        errors = []
        if spec.args.get("mode", "dynamic") != "dynamic":
            errors.append(((*where, "mode"), "a population broker acts in dynamic mode"))
        params, experience = spec.targets("params"), spec.targets("experience")
        if [t.partition(".")[0] for t in params] != [t.partition(".")[0] for t in experience]:
            errors.append((("nodes", spec.name, "links"),
                           f"params {params} and experience {experience} must name the same "
                           "learners in the same order (member k's model trains on what "
                           "goes to member k)"))
        if topo.self_play is not None:
            errors.append((("self_play",), "a population broker plays the population's "
                                           "games: its args say how, not a self_play section"))
        for name, least in (("snapshot_every", 1), ("pool_size", 1), ("columns", 1)):
            value = spec.args.get(name)
            if isinstance(value, int) and value < least:
                errors.append(((*where, name), f"must be >= {least}"))
        try:
            make(spec.args.get("matchmaker"), topo.import_paths)
        except ValueError as exc:
            errors.append(((*where, "matchmaker"), str(exc)))
        # the games it plays are self-play's: a strictly alternating board game, acting
        # for an unroll algorithm
        errors += self_play.errors({}, topo.env, topo.algo_config.family)
        return errors + super().check_spec(spec, topo)

    @classmethod
    def largest_insert(cls, spec: NodeSpec, topo: Topology) -> int | None:
        """A member's unroll is ``columns`` wide (default: half a connection's envs)."""
        envs = super().largest_insert(spec, topo)
        columns = spec.args.get("columns")
        if isinstance(columns, int):
            return columns
        return None if envs is None else max(1, envs // 2)

    # The inference broker's setup asks these hooks, in this order, for its behaviour,
    # its outbox and the acting state it persists; a population's are these.
    def acting_behaviour(self) -> type:
        """Population play over a roster of every member's model (the broker's own is
        member 0's), its matchmaker and its packer width."""
        from zmqrl.parts.selfplay.acting import frozen_copy
        from zmqrl.parts.selfplay.matchmaking import make
        from zmqrl.parts.selfplay.population_acting import bind
        from zmqrl.parts.selfplay.roster import Roster

        a = self.args
        n = len(self.link_sockets("params"))
        models = [self.model] + [frozen_copy(self.model) for _ in range(n - 1)]
        self.roster = Roster(models, a.snapshot_every, a.pool_size)
        self.frozen_copy = frozen_copy
        return bind(self.roster, make(a.matchmaker, self.ctx.topo.import_paths), a.columns)

    def experience_outbox(self) -> _Outboxes:
        """One outbox per member's learner; the loop sees them as one."""
        self.member_outboxes = [Outbox(self, name, self.args.max_outbox)
                                for name in self.link_sockets("experience")]
        return _Outboxes(self.member_outboxes)

    def acting_state(self) -> Checkpointer:
        """The roster's snapshots (``checkpoints/<label>.roster.pt``)."""
        checkpointer = Checkpointer(
            node_checkpoint(self.ctx.run_dir, self.ctx.label, ".roster" + TORCH.suffix),
            self._Saved(self), format=TORCH, log=self.log)
        if checkpointer.restore_if_present():
            self.log.info("resumed the roster: %s", ", ".join(
                s.name for s in self.roster.snapshots.values()) or "no snapshots")
        if self.args.checkpoint_every_s > 0:
            self.every(self.args.checkpoint_every_s, checkpointer.save)
        return checkpointer

    def setup(self) -> None:
        super().setup()
        from zmqrl.parts.acting.params import ParamsFollower

        a = self.args
        # member k's parameters arrive on params link k: the broker's own follower
        # loads member 0's, one more per other member
        self.followers = [self.params] + [ParamsFollower(m, self)
                                          for m in self.roster.members[1:]]
        self._latest: dict[int, wire.Message] = {}
        self.ship = bool(self.member_outboxes)
        self.games_sent = self.games_refused = 0
        self.unsent: list[tuple[str, str, float]] = []
        self.roster.keep_games = "games" in self.sockets  # else only counted
        if self.roster.keep_games:
            self.every(a.games_every_s, self._send_games)
        self.log.info("population of %d: matchmaker %s", len(self.roster.members),
                      a.matchmaker)

    # ----- inputs -------------------------------------------------------------------
    def on_policy(self, envelope: list, msg: wire.Message) -> None:
        # An actor's per-env returns are the last mover's reward: meaningless where both
        # seats are the population's. The run's figure is the league's ratings (the
        # progress line shows no return where no node reports episodes).
        if msg.type == wire.STEP and ("ep_return" in msg.arrays or "ep_length" in msg.arrays):
            messages.check(msg, self.step_spec, self.step_check)  # as sent, before the pop
            msg.arrays.pop("ep_return", None)
            msg.arrays.pop("ep_length", None)
        super().on_policy(envelope, msg)

    def on_params(self, index: int, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        self._latest[index] = msg  # only each member's newest is loaded, once per loop turn

    def _load_params(self) -> None:
        latest, self._latest = self._latest, {}
        for member, msg in latest.items():
            if self.followers[member].offer(msg):
                model = self.roster.members[member]
                self.roster.on_version(member, self.followers[member].version,
                                       lambda m=model: self.frozen_copy(m))

    def on_games(self, _envelope: list, msg: wire.Message) -> None:
        """What the league says back on our ``games`` link: only ``error`` (a batch it
        refused: its games are not rated, and say why in our log)."""
        if msg.type != wire.ERROR:
            raise wire.ProtocolError(f"games link takes '{wire.ERROR}', not '{msg.type}'")
        self.games_refused += 1
        self.log_rejection("games", f"the league refused our games: "
                                    f"{msg.fields.get('error')}")

    def on_ratings(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.RATINGS:
            raise wire.ProtocolError(f"ratings link takes '{wire.RATINGS}', not '{msg.type}'")
        messages.check(msg, messages.spec(wire.RATINGS), _RATINGS_CONTEXT)  # names, bounds
        self.roster.ratings = {k: float(v) for k, v in msg.fields["ratings"].items()}

    # ----- outputs ------------------------------------------------------------------
    def _ship(self, items: list, key: bytes) -> None:
        for item in items:
            member = item.fields.pop("member")
            if self.ship:
                self.member_outboxes[member].push(
                    wire.encode(item.type, item.arrays, **item.fields))
        if items:
            self._update_backpressure()

    def _send_games(self) -> None:
        """Every finished game to the league, in messages of at most MAX_PLAYERS names.
        While the league is away (restarting) they wait here, the newest
        ``MAX_UNSENT_GAMES``, and go when it is back."""
        import numpy as np

        self.unsent.extend(self.roster.take_games())
        if len(self.unsent) > MAX_UNSENT_GAMES:
            del self.unsent[:len(self.unsent) - MAX_UNSENT_GAMES]
        while self.unsent:
            names: list[str] = []
            index: dict[str, int] = {}
            taken = 0
            for a, b, _ in self.unsent:
                if len(index) + 2 > messages.MAX_PLAYERS:
                    break
                for name in (a, b):
                    if name not in index:
                        index[name] = len(names)
                        names.append(name)
                taken += 1
            batch = self.unsent[:taken]
            arrays = {"first": np.array([index[a] for a, _, _ in batch], np.int32),
                      "second": np.array([index[b] for _, b, _ in batch], np.int32),
                      "score": np.array([s for _, _, s in batch], np.float32)}
            if not self.send("games", wire.encode(wire.GAMES, arrays, players=names,
                                                  source=self.ctx.label), flags=zmq.NOBLOCK):
                return  # no league connected, or its queue is full: next time
            del self.unsent[:taken]
            self.games_sent += taken

    def metrics(self) -> dict:
        row = super().metrics()
        row.update(games_played=self.roster.finished, games_sent=self.games_sent,
                   games_unrated=self.roster.unrated, games_refused=self.games_refused,
                   snapshots=len(self.roster.snapshots),
                   member_versions=min(self.roster.versions))
        return row

    class _Saved:
        """The roster's snapshots as a checkpoint Saveable (state dicts; restored into
        frozen copies of the broker's model)."""

        def __init__(self, broker: PopulationBroker):
            self.broker = broker

        def state(self) -> dict[str, Any]:
            return self.broker.roster.state(lambda model: model.state_dict())

        def restore(self, state: dict[str, Any]) -> None:
            broker = self.broker

            def load(weights: Any) -> Any:
                model = broker.frozen_copy(broker.model)
                model.load_state_dict(weights)
                return model

            broker.roster.restore(state, load)

