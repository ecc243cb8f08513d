"""MCTS actor (AlphaZero on the bus): plays many games of self-play at once by search, and
sends the finished games to a replay.

A search actor (:mod:`zmqrl.parts.search.actor`: lanes, remote or local answers, the
replay's credit): the actor's games are split into ``lanes`` of ``games`` each; a lane is
one :class:`zmqrl.parts.search.mcts.SelfPlay` (one tree per game, advanced together).
Each round a lane collects one leaf per game and has them evaluated:

* ``remote``: the leaves go to the inference broker as one ``step`` (their observations;
  zero rewards and dones), which batches them with the leaves of every other actor into
  one forward pass (its ``EvaluateBehaviour``) and answers ``act`` with the policy logits
  and values (``act``/``evaluation``). No reply within ``request_timeout_s``: a fresh
  socket and the same leaves again (Lazy Pirate).
* ``local``: a copy of the network in this process evaluates each lane's leaves in one
  forward pass, following the learner's ``params``.

Finished games go out on ``experience`` as one ``insert`` (``positions``: observation,
visit distribution, outcome) of whole games. The game is the topology's env, an OpenSpiel
id of ``zmqrl.parts.games``; the search's settings are the ``alphazero`` algorithm's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.bus import wire
from zmqrl.parts.search.actor import Lane, SearchActor
from zmqrl.run.topology import NodeSpec, Topology


class MCTSActor(SearchActor):
    shows = {"games": "sum", "sims_per_s": "sum"}
    reply_variant = "evaluation"
    request_unit = "leaves"

    @dataclass
    class Args:
        games: int = 32  # games searched side by side per lane
        lanes: int = 2  # remote: requests in flight (search one lane while another waits)
        policy: str = "remote"  # remote | local
        request_timeout_s: float = 10.0
        max_outbox: int = 2  # inserts waiting for the replay's credit
        # An insert carries whole games, up to this many positions (and one game more):
        # what a replay's rate limiter must fit (its error_buffer) with one sample.
        max_insert_positions: int = 256
        max_waiting_positions: int = 4096  # finished positions held before the lanes pause
        device: str = "cpu"  # policy: local
        precision: str = "float32"  # policy: local (as the inference broker's)

    @classmethod
    def largest_insert(cls, spec: NodeSpec, topo: Topology) -> int | None:
        """Whole games up to ``max_insert_positions``: that many less one, and the
        longest game more (twice its moves with ``mirror_games``)."""
        from zmqrl.parts.games import Game, game_name

        try:
            cap = int(spec.args.get("max_insert_positions", cls.Args.max_insert_positions))
            longest = Game(game_name(topo.env), search=False).max_length
            mirrored = 2 if getattr(topo.algo_config, "mirror_games", False) else 1
        except Exception:  # noqa: BLE001  (no game, or bad args: their own checks say)
            return None
        return max(0, cap - 1) + longest * mirrored

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        from zmqrl.parts.games import game_name, has_mirror

        args, where = spec.args, ("nodes", spec.name)
        errors = []
        for name in ("games", "lanes", "max_insert_positions"):
            if args.get(name, 1) < 1:
                errors.append(((*where, "args", name), "must be >= 1"))
        errors += cls.check_policy(spec)
        try:
            cfg = topo.algo_config
            if cfg.items != "positions":  # it ships games' positions
                errors.append((("algo", "kind"), f"an mcts_actor searches with algo "
                                                 f"'alphazero', not '{cfg.kind}'"))
        except (TypeError, ValueError):
            cfg = None  # the algo section's own errors are reported with it
        try:
            game = game_name(topo.env)
        except ValueError as exc:
            errors.append((("env", "id"), str(exc)))
        else:
            if getattr(cfg, "mirror_games", False) and not has_mirror(game):
                errors.append((("algo", "mirror_games"),
                               f"{game} has no known mirror symmetry"))
        return errors

    def setup(self) -> None:
        from zmqrl.parts.envs import env_spec
        from zmqrl.parts.games import Game, game_name
        from zmqrl.parts.search.mcts import SearchParams

        topo, a = self.ctx.topo, self.args
        self.game = Game(game_name(topo.env))
        self.spec = env_spec(topo.env)
        self.search = SearchParams.of(topo.algo_config)
        self.games = self.moves = 0
        self.results: deque[tuple[float, float, int]] = deque(maxlen=100)
        self.start_lanes(self.spec)
        params = self.search
        self.log.info("%s, %d lanes of %d games, %d simulations a move (%s), %s evaluation",
                      self.game.name, a.lanes, a.games, params.num_simulations,
                      f"{params.fast_simulations} on {1 - params.full_search_fraction:.0%} "
                      "of moves, not recorded" if params.full_search_fraction < 1 else
                      "every move recorded", a.policy)

    def make_lanes(self) -> list[Lane]:
        from zmqrl.parts.search.mcts import SelfPlay

        seed = self.ctx.topo.seed + 10_000 * (self.ctx.replica + 1)
        return [Lane(SelfPlay(self.game, self.args.games, self.search, seed + 1000 * i))
                for i in range(self.args.lanes)]

    # ----- local evaluation ---------------------------------------------------------------
    def local_model(self) -> None:
        import torch

        from zmqrl.parts.acting.params import ParamsFollower
        from zmqrl.parts.devices import resolve_precision
        from zmqrl.parts.models import build_model
        from zmqrl.parts.search.mcts import model_evaluator

        torch.set_num_threads(1)
        topo = self.ctx.topo
        self.model = build_model(topo.model, self.spec, topo.seed,
                                 algo=topo.algo_config).to(self.args.device)
        self.model.eval()
        self.params = ParamsFollower(self.model, self)
        self.evaluate = model_evaluator(self.model, precision=resolve_precision(
            self.args.precision, torch.device(self.args.device)))

    def answer_locally(self) -> None:
        for lane in self.lanes:
            lane.play.feed(*self.evaluate(lane.play.leaves()))
            self.collect(lane)
            self.ship()

    # ----- remote evaluation --------------------------------------------------------------
    def next_request(self, lane: Lane) -> dict[str, np.ndarray]:
        obs = lane.play.leaves()
        zeros = np.zeros(len(obs), np.float32)
        return {"obs": obs, "reward": zeros, "done": zeros.astype(np.bool_)}

    def answer(self, lane: Lane, msg: wire.Message) -> None:
        lane.play.feed(msg["logits"], msg["value"])

    # ----- finished games -----------------------------------------------------------------
    def collect(self, lane: Lane) -> None:
        for record in lane.play.take_finished():
            self.waiting.append(record)
            self.waiting_positions += len(record.outcome)
            self.results.append((*record.returns, record.moves))
        # (a game whose every move was searched fast has no record, and still counts)
        self.games = sum(la.play.games_played for la in self.lanes)
        self.moves = sum(la.play.moves for la in self.lanes)

    def pack(self) -> tuple[dict[str, np.ndarray], int]:
        """Whole games, until ``max_insert_positions`` is reached."""
        records, count = [], 0
        while self.waiting and count < self.args.max_insert_positions:
            records.append(self.waiting.popleft())
            count += len(records[-1].outcome)
        return {"obs": np.concatenate([r.obs for r in records]),
                "policy": np.concatenate([r.policy for r in records]),
                "outcome": np.concatenate([r.outcome for r in records])}, count

    def metrics(self) -> dict[str, Any]:
        row = {"env_steps": self.moves, "games": self.games, "moves": self.moves,
               **self.search_metrics()}
        results = np.array(self.results, np.float32).reshape(-1, 3)
        if len(results):  # the last 100 games: how self-play ends
            row.update(draw_rate_100=round(float((results[:, 0] == 0).mean()), 3),
                       first_player_wins_100=round(float((results[:, 0] > 0).mean()), 3),
                       game_length_100=round(float(results[:, 2].mean()), 2))
        return row
