"""MCTS actor (AlphaZero on the bus): plays many games of self-play at once by search, and
sends the finished games to a replay.

The actor's games are split into ``lanes`` of ``games`` each; a lane is one
:class:`zmqrl.parts.search.mcts.SelfPlay` (one tree per game, advanced together). Each round
a lane collects one leaf per game and has them evaluated, by ``args.policy``:

* ``remote``: the leaves go to the inference broker as one ``step`` (their observations;
  zero rewards and dones), which batches them with the leaves of every other actor into
  one forward pass (its ``EvaluateBehaviour``) and answers ``act`` with the policy logits
  and values (``act``/``evaluation``). Each lane has its own connection and request in
  flight, so this process searches one lane while the broker evaluates another. No reply
  within ``request_timeout_s``: a fresh socket and the same leaves again (Lazy Pirate).
* ``local``: a copy of the network in this process evaluates each lane's leaves in one
  forward pass, following the learner's ``params``.

Finished games go out on ``experience`` as one ``insert`` (``positions``: observation,
visit distribution, outcome) under the replay's credit; while positions wait for credit
beyond ``max_waiting_positions``, the lanes pause, so a slow replay or learner slows
self-play instead of growing memory. The game is the topology's env, an OpenSpiel id of
``zmqrl.parts.games``; the search's settings are the ``alphazero`` algorithm's.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zmqrl.bus import messages, roles, wire
from zmqrl.bus.metrics import LatencyReservoir
from zmqrl.bus.node import Link, Node, Outbox
from zmqrl.parts.acting.remote import RETRY_S
from zmqrl.run.topology import NodeSpec, Topology

POLICIES = ("remote", "local")


@dataclass
class _Lane:
    play: Any  # zmqrl.parts.search.mcts.SelfPlay
    socket: str = ""  # remote: its connection to the broker
    obs: np.ndarray | None = None  # leaves sent, awaiting their evaluation
    seq: int = 0
    sent_at: float = 0.0
    sizes: list[int] = field(default_factory=list)


class MCTSActor(Node):
    role = roles.ACTS  # its moves are the run's env steps (the broker's leaves are not)
    shows = {"games": "sum", "sims_per_s": "sum"}
    links = {
        "policy": Link("dealer", required=False),
        "experience": Link("dealer", required=False, immediate=True),
        "params": Link("sub", required=False, hwm=4),
    }
    metrics_interval_s = 1.0

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
        policy = args.get("policy", "remote")
        if policy not in POLICIES:
            errors.append(((*where, "args", "policy"), f"'{policy}' is not remote or local"))
        elif policy == "remote" and "policy" not in spec.links:
            errors.append(((*where, "links"), "policy: remote needs a 'policy' link (to an "
                                              "inference broker)"))
        from zmqrl.parts.precision import check_precision

        problem = check_precision(args.get("precision", "float32"), args.get("device", "cpu"))
        if problem:
            errors.append(((*where, "args", "precision"), problem))
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
        from zmqrl.parts.search.mcts import SearchParams, SelfPlay

        topo, a = self.ctx.topo, self.args
        self.game = Game(game_name(topo.env))
        self.spec = env_spec(topo.env)
        self.check = messages.Context.from_env(self.spec)
        self.reply_spec = messages.spec(wire.ACT, "evaluation")
        params = SearchParams.of(topo.algo_config)
        seed = topo.seed + 10_000 * (self.ctx.replica + 1)
        self.lanes = [_Lane(SelfPlay(self.game, a.games, params, seed + 1000 * i))
                      for i in range(a.lanes)]
        self.outbox = Outbox(self, "experience", a.max_outbox) \
            if "experience" in self.sockets else None
        self.finished: deque[Any] = deque()  # GameRecords waiting for credit
        self.waiting_positions = 0
        self.version = 0
        self.games = self.moves = self.positions_sent = 0
        self.results: deque[tuple[float, float, int]] = deque(maxlen=100)
        self.latency = LatencyReservoir()
        self._rate_mark = (time.monotonic(), 0)
        self.evaluate = None
        if a.policy == "local":
            self._local_model()
        else:
            for i, lane in enumerate(self.lanes):
                lane.socket = "policy" if i == 0 else self.open_link("policy", f"policy_{i}")
                self.set_handler(lane.socket,
                                 lambda _envelope, msg, lane=lane: self._on_act(lane, msg))
                self._send_leaves(lane)
        self.log.info("%s, %d lanes of %d games, %d simulations a move (%s), %s evaluation",
                      self.game.name, a.lanes, a.games, params.num_simulations,
                      f"{params.fast_simulations} on {1 - params.full_search_fraction:.0%} "
                      "of moves, not recorded" if params.full_search_fraction < 1 else
                      "every move recorded", a.policy)

    def _local_model(self) -> None:
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

    # ----- remote evaluation --------------------------------------------------------------
    def _send_leaves(self, lane: _Lane) -> None:
        lane.obs = lane.play.leaves()
        self._send(lane)

    def _send(self, lane: _Lane) -> None:
        n = len(lane.obs)
        lane.seq += 1
        zeros = np.zeros(n, np.float32)
        self.send(lane.socket, wire.encode(wire.STEP, {
            "obs": lane.obs, "reward": zeros, "done": zeros.astype(np.bool_)}, seq=lane.seq))
        lane.sent_at = time.perf_counter()
        lane.sizes.append(n)

    def _on_act(self, lane: _Lane, msg: wire.Message) -> None:
        if msg.type == wire.ERROR and msg.fields.get("retry") is True:
            # the broker is full for now: ask again in a second (zmqrl.parts.acting.remote)
            self.log_rejection(lane.socket, f"the inference broker: {msg.fields.get('error')}")
            lane.sent_at = time.perf_counter() - self.args.request_timeout_s + RETRY_S
            return
        self.expect_reply(msg, wire.ACT, "the inference broker")
        if lane.obs is None or msg.fields.get("seq") != lane.seq:
            return  # a late reply to a request we gave up on
        n = messages.check(msg, self.reply_spec, self.check)["n"]
        if n != len(lane.obs):
            raise wire.ProtocolError(f"act evaluates {n} leaves, we sent {len(lane.obs)}")
        self.latency.add(time.perf_counter() - lane.sent_at)
        lane.obs = None
        lane.play.feed(msg["logits"], msg["value"])
        self._collect(lane)
        if not self._held():
            self._send_leaves(lane)

    # ----- finished games -----------------------------------------------------------------
    def _collect(self, lane: _Lane) -> None:
        for record in lane.play.take_finished():
            self.finished.append(record)
            self.waiting_positions += len(record.outcome)
            self.results.append((*record.returns, record.moves))
        # (a game whose every move was searched fast has no record, and still counts)
        self.games = sum(la.play.games_played for la in self.lanes)
        self.moves = sum(la.play.moves for la in self.lanes)
        self._ship()

    def _ship(self) -> None:
        """Finished games go out together (up to ``max_insert_positions``) as one insert
        when the replay has credit for it; meanwhile they gather here."""
        if self.outbox is None:
            self.finished.clear()  # nothing linked to take them (benchmarks)
            self.waiting_positions = 0
            return
        if not self.finished or len(self.outbox):
            return  # one insert waits at most; the positions gather meanwhile
        records, count = [], 0
        while self.finished and count < self.args.max_insert_positions:
            records.append(self.finished.popleft())
            count += len(records[-1].outcome)
        arrays = {"obs": np.concatenate([r.obs for r in records]),
                  "policy": np.concatenate([r.policy for r in records]),
                  "outcome": np.concatenate([r.outcome for r in records])}
        extra = {"version": self.version} if self.evaluate is not None else {}
        self.outbox.push(wire.encode(wire.INSERT, arrays, **extra))
        self.positions_sent += count
        self.waiting_positions -= count

    def _held(self) -> bool:
        return self.waiting_positions > self.args.max_waiting_positions

    # ----- the runtime's hooks ----------------------------------------------------------
    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        if self.evaluate is not None and self.params.offer(msg):
            self.version = self.params.version

    def on_peer_silent(self, name: str) -> None:
        for lane in self.lanes:
            if lane.socket == name and lane.obs is not None:
                self._resend(lane)

    def _resend(self, lane: _Lane) -> None:
        self.reopen(lane.socket)
        self._send(lane)

    def poll_timeout_ms(self) -> int:
        if self.evaluate is not None and not self._held():
            return 0  # local: keep searching; just look for params and credit
        return 100

    def after_poll(self) -> None:
        if self.outbox is not None:
            self.outbox.flush()
        self._ship()
        if self._held():
            return
        if self.evaluate is not None:
            for lane in self.lanes:
                lane.play.feed(*self.evaluate(lane.play.leaves()))
                self._collect(lane)
            return
        now = time.perf_counter()
        for lane in self.lanes:
            if lane.obs is None:  # paused after its last reply: go on
                self._send_leaves(lane)
            elif now - lane.sent_at > self.args.request_timeout_s:
                self.log.warning("no reply in %.1fs; reconnecting and resending",
                                 self.args.request_timeout_s)
                self._resend(lane)

    def metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        sims = sum(lane.play.simulations for lane in self.lanes)
        t0, sims0 = self._rate_mark
        self._rate_mark = (now, sims)
        sizes = [s for lane in self.lanes for s in lane.sizes]
        for lane in self.lanes:
            lane.sizes.clear()
        results = np.array(self.results, np.float32).reshape(-1, 3)
        p50, p99 = self.latency.percentiles_ms()
        row = {"env_steps": self.moves, "games": self.games, "moves": self.moves,
               "simulations": sims,
               "sims_per_s": round((sims - sims0) / max(now - t0, 1e-9), 1),
               "positions_sent": self.positions_sent,
               "positions_waiting": self.waiting_positions,
               "param_version": self.version,
               "leaves_per_request": round(float(np.mean(sizes)), 2) if sizes else 0,
               "latency_p50_ms": p50, "latency_p99_ms": p99,
               "outbox": len(self.outbox) if self.outbox is not None else 0}
        if len(results):  # the last 100 games: how self-play ends
            row.update(draw_rate_100=round(float((results[:, 0] == 0).mean()), 3),
                       first_player_wins_100=round(float((results[:, 0] > 0).mean()), 3),
                       game_length_100=round(float(results[:, 2].mean()), 2))
        return row
