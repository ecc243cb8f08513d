"""League: measures a self-play run as it goes (win rates against fixed players, Elo).

The node follows the learner's parameters (a ``params`` SUB link, like the broker) and
keeps its own snapshots of the policy: one every ``snapshot_every`` parameter versions
(the ``self_play`` section's unless given), the newest ``pool_size`` of them. Every
``eval_every_s`` it plays an evaluation (``zmqrl.parts.selfplay.matches``), ``games`` games
per opponent with the seats alternating, of the latest policy (as it is when the
evaluation starts) against:

* a uniformly random player, and OpenSpiel's MCTS bot with ``mcts_simulations``
  random-rollout simulations a move: ``eval/win_rate_random``, ``eval/win_rate_mcts``
  (wins / games) and ``eval/score_*`` (draws counting half);
* every snapshot, ``round_robin_games`` games each; a new snapshot also plays every
  other one and the random player once. Elo ratings are fitted to all of these results
  (``zmqrl.parts.selfplay.elo``, the random player anchored at 0): ``population/elo_latest``.

The results go into the node's metrics (CSV and TensorBoard under those tags), into
``league.json`` in the run directory (win rates, ratings, the pairwise table; rewritten
after each evaluation) and into one log line. Games are played a slice at a time
(``slice_ms`` per loop turn), so the node stays responsive while it evaluates.

Persistence: the league as of its last finished evaluation (members' weights, every
pair's results, ratings, counters: ``zmqrl.parts.selfplay.league_state``) is a
checkpoint, ``checkpoints/<label>.league.pt``, written after every evaluation and at
exit and restored when the node starts (a supervisor restart, ``zmqrl up --resume``).
A restored league waits for the learner's parameters before its next evaluation (rather
than rating its untrained initial model), then carries on: the same members, results and
counters, so ``league.json`` keeps its earlier entries. A member is admitted when the
evaluation it first plays in finishes, so an evaluation cut short by a stop is played
again, whole, after the restart.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from zmqrl.bus import wire
from zmqrl.bus.node import Link, Node
from zmqrl.parts.checkpoint import TORCH, Checkpointer, node_checkpoint
from zmqrl.run.topology import NodeSpec, Topology

RANDOM = "random"


class League(Node):
    links = {"params": Link("sub", hwm=4)}
    # the run's evaluation, in the progress line (self-play has no return to show)
    shows = {"eval/win_rate_mcts": "last", "population/elo_latest": "last"}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        eval_every_s: float = 30.0  # from the end of one evaluation to the next
        games: int = 40  # per fixed opponent (random, MCTS), half in each seat
        mcts_simulations: int = 25  # the MCTS bot's random-rollout simulations a move
        round_robin_games: int = 4  # per pair of league players, half in each seat
        snapshot_every: int | None = None  # versions; None: the self_play section's
        pool_size: int = 8
        slice_ms: float = 50.0  # playing time per loop turn
        device: str = "cpu"

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        from zmqrl.parts.games import game_name

        errors = []
        for name in ("games", "round_robin_games", "mcts_simulations", "pool_size"):
            if spec.args.get(name, 1) < 1:
                errors.append((("nodes", spec.name, "args", name), "must be >= 1"))
        if spec.args.get("snapshot_every") is not None and spec.args["snapshot_every"] < 1:
            errors.append((("nodes", spec.name, "args", "snapshot_every"), "must be >= 1"))
        try:
            game_name(topo.env)
        except ValueError as exc:
            errors.append((("env", "id"), f"a league plays games: {exc}"))
        return errors

    def setup(self) -> None:
        import torch

        from zmqrl.parts.acting.params import ParamsFollower
        from zmqrl.parts.envs import env_spec
        from zmqrl.parts.games import Game, game_name
        from zmqrl.parts.models import build_model, pick_device
        from zmqrl.parts.selfplay.matches import MCTSPlayer, RandomPlayer

        torch.set_num_threads(1)
        topo, a = self.ctx.topo, self.args
        self.game = Game(game_name(topo.env))
        self.model = build_model(topo.model, env_spec(topo.env), topo.seed,
                                 algo=topo.algo_config)
        self.model.to(pick_device(a.device)).eval()
        self.params = ParamsFollower(self.model, self)
        self.every_versions = a.snapshot_every or (topo.acting.snapshot_every
                                                   if topo.acting is not None else 20)
        seed = topo.seed + 777
        self.random = RandomPlayer(seed, RANDOM)
        self.mcts = MCTSPlayer(self.game, a.mcts_simulations, seed + 1)
        self.members: dict[str, Any] = {}  # name -> PolicyPlayer, oldest first
        self.results: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.ratings: dict[str, float] = {}
        self.next_snapshot = 0
        self.evaluation: Any = None
        self.candidate: Any = None  # the member this evaluation admits when it finishes
        self.evaluated_version = -1
        self.evaluations = 0
        self.next_eval_at = time.monotonic()
        self.row: dict[str, Any] = {}
        self.path = self.ctx.run_dir / "league.json"
        self.checkpointer = Checkpointer(
            node_checkpoint(self.ctx.run_dir, self.ctx.label, ".league" + TORCH.suffix),
            self, format=TORCH, log=self.log)
        self.heard_params = False  # any parameters that fit the model, even a version we hold
        self.resumed = self.checkpointer.restore_if_present()
        if self.resumed:
            self.log.info("resumed: %d evaluations, members %s, %d results", self.evaluations,
                          ", ".join(self.members) or "none", len(self.results))
        else:
            # The baseline: the untrained policy, taken before the first poll can apply a
            # learner's parameters (a league that starts late would else never see it).
            self._start()

    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        rejected = self.bad_messages
        self.params.offer(msg)
        self.heard_params |= self.bad_messages == rejected

    def poll_timeout_ms(self) -> int:
        return 0 if self.evaluation is not None else 100

    def after_poll(self) -> None:
        if self.resumed and not self.heard_params:
            return  # resumed: the next evaluation is of the learner's policy, not a fresh one
        if self.evaluation is None and time.monotonic() >= self.next_eval_at:
            self._start()
        if self.evaluation is not None and self.evaluation.advance(self.args.slice_ms / 1e3):
            self._finish()

    # ----- an evaluation ------------------------------------------------------------
    def _start(self) -> None:
        from zmqrl.parts.selfplay.acting import frozen_copy
        from zmqrl.parts.selfplay.matches import Evaluation, Match, PolicyPlayer

        a, version = self.args, self.params.version
        latest = PolicyPlayer(f"latest@v{version}", frozen_copy(self.model))
        matches = [Match(latest, self.random, a.games), Match(latest, self.mcts, a.games)]
        self.candidate = None
        if version >= self.next_snapshot and f"v{version}" not in self.members:
            # A new member plays every other one (and the anchor) once; it stays fixed.
            # It joins when this evaluation finishes (what a checkpoint holds is whole).
            self.candidate = PolicyPlayer(f"v{version}", latest.model, version)
            matches += [Match(self.candidate, other, a.round_robin_games)
                        for other in [self.random, *self.members.values()]]
        matches += [Match(latest, m, a.round_robin_games) for m in self.members.values()]
        self.evaluation = Evaluation(self.game, matches)
        self.latest_name = latest.name
        self.evaluating_version = version
        self.started_at = time.monotonic()

    def _finish(self) -> None:
        from zmqrl.parts.selfplay import elo

        evaluation, self.evaluation = self.evaluation, None
        latest, self.evaluated_version = self.latest_name, self.evaluating_version
        results = evaluation.results()
        # The latest of this evaluation replaces the last one's in the ratings.
        self.results = {k: v for k, v in self.results.items() if not k[0].startswith("latest@")}
        self.results.update({k: v for k, v in results.items() if k[1] != self.mcts.name})
        if self.candidate is not None:
            member, self.candidate = self.candidate, None
            self.members[member.name] = member
            self._trim()
            self.next_snapshot = (member.version // self.every_versions + 1) \
                * self.every_versions
        ratings = self.ratings = elo.fit(self.results, anchor=RANDOM)
        vs_random = results[(latest, RANDOM)]
        vs_mcts = results[(latest, self.mcts.name)]
        self.evaluations += 1
        seconds = time.monotonic() - self.started_at
        self.row = {
            "eval/win_rate_random": _rate(vs_random), "eval/score_random": _score(vs_random),
            "eval/win_rate_mcts": _rate(vs_mcts), "eval/score_mcts": _score(vs_mcts),
            "eval/param_version": self.evaluated_version, "eval/evaluations": self.evaluations,
            "eval/seconds": round(seconds, 2),
            "population/elo_latest": ratings[latest],
            "population/members": len(self.members),
        }
        self._write(latest, vs_random, vs_mcts, ratings)
        self.checkpointer.save(self.evaluations)
        self.log.info("v%d wins %.0f %% against random, %.0f %% against MCTS-%d; "
                      "Elo %.0f (random 0; members %s) [%.1f s]", self.evaluated_version,
                      100 * _rate(vs_random), 100 * _rate(vs_mcts), self.args.mcts_simulations,
                      ratings[latest], ", ".join(f"{m} {ratings[m]:.0f}" for m in self.members),
                      seconds)
        self.next_eval_at = time.monotonic() + self.args.eval_every_s

    def _write(self, latest: str, vs_random: tuple, vs_mcts: tuple,
               ratings: dict[str, float]) -> None:
        doc = {
            "time": time.time(), "param_version": self.evaluated_version,
            "evaluations": self.evaluations, "games": self.args.games,
            "mcts_simulations": self.args.mcts_simulations,
            "latest": latest,
            "win_rate_random": _rate(vs_random), "score_random": _score(vs_random),
            "win_rate_mcts": _rate(vs_mcts), "score_mcts": _score(vs_mcts),
            "vs_random": _wdl(vs_random), "vs_mcts": _wdl(vs_mcts),
            "elo": dict(sorted(ratings.items(), key=lambda kv: -kv[1])),
            "table": [{"a": a, "b": b, **_wdl(r)} for (a, b), r in sorted(self.results.items())],
        }
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)  # readers see the last complete table

    def metrics(self) -> dict[str, Any]:
        return {"param_version": self.params.version, **self.row}

    # ----- persistence (zmqrl.parts.checkpoint.Saveable) ------------------------------
    def state(self) -> dict[str, Any]:
        """The league as of its last finished evaluation (zmqrl.parts.selfplay.league_state)."""
        from zmqrl.parts.selfplay.league_state import LeagueState, Member

        return LeagueState(
            members=[Member(m.name, m.version, m.model.state_dict())
                     for m in self.members.values()],
            results=dict(self.results), ratings=dict(self.ratings),
            next_snapshot=self.next_snapshot, evaluations=self.evaluations,
            evaluated_version=self.evaluated_version).to_dict()

    def restore(self, state: dict[str, Any]) -> None:
        from zmqrl.parts.selfplay.acting import frozen_copy
        from zmqrl.parts.selfplay.league_state import LeagueState
        from zmqrl.parts.selfplay.matches import PolicyPlayer

        saved = LeagueState.from_dict(state)
        members = {}
        for m in saved.members:  # (load_state_dict names a member that does not fit)
            model = frozen_copy(self.model)
            model.load_state_dict(m.model)
            members[m.name] = PolicyPlayer(m.name, model, m.version)
        self.members, self.results, self.ratings = members, saved.results, saved.ratings
        self.next_snapshot, self.evaluations = saved.next_snapshot, saved.evaluations
        self.evaluated_version = saved.evaluated_version
        self._trim()  # (a smaller pool_size than the run that saved it)

    def _trim(self) -> None:
        """Keep the newest ``pool_size`` members, and only their results."""
        while len(self.members) > self.args.pool_size:
            gone = self.members.pop(next(iter(self.members)))
            self.results = {k: v for k, v in self.results.items() if gone.name not in k}

    def teardown(self) -> None:
        self.checkpointer.save(self.evaluations)


def _rate(record: tuple[float, float, float]) -> float:
    return round(record[0] / max(sum(record), 1), 3)


def _score(record: tuple[float, float, float]) -> float:
    return round((record[0] + 0.5 * record[1]) / max(sum(record), 1), 3)


def _wdl(record: tuple[float, float, float]) -> dict[str, float]:
    return {"wins": record[0], "draws": record[1], "losses": record[2]}
