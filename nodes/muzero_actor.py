"""MuZero actor: plays its envs by search in the learned model and sends the positions,
with their unroll targets, to a replay.

The actor's ``envs`` are split over ``lanes``; a lane is one
:class:`zmqrl.parts.muzero.selfplay.LatentLane` (a vector env and a tree per env,
searched in lockstep). Each search round is one query per env, answered by
``args.policy``:

* ``remote``: the round goes to the inference broker as one ``step``/``latent_search``;
  the broker keeps every tree's latents and answers the rounds of all connections
  waiting in one forward pass (``zmqrl.parts.muzero.acting``). Each lane has its own
  connection and request in flight, so this process searches one lane while the broker
  evaluates another. No reply within ``request_timeout_s``, or a broker that no longer
  holds the latents (it restarted): a fresh socket, and the move searched again from
  its roots.
* ``local``: a copy of the model in this process answers every lane's round in one
  forward pass, following the learner's ``params``.

Positions go out on ``experience`` as ``insert``/``search_targets`` under the replay's
credit; while more than ``max_waiting_positions`` wait, the lanes pause, so a slow
replay or learner slows acting instead of growing memory. The search's settings are the
``muzero`` algorithm's.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zmqrl.bus import messages, roles, wire
from zmqrl.bus.metrics import EpisodeStats, LatencyReservoir
from zmqrl.bus.node import Link, Node, Outbox
from zmqrl.parts.acting.remote import RETRY_S
from zmqrl.run.topology import NodeSpec, Topology

POLICIES = ("remote", "local")
ITEMS = "search_targets"  # what it ships (zmqrl.parts.muzero.messages)


@dataclass
class _Lane:
    play: Any  # zmqrl.parts.muzero.selfplay.LatentLane
    socket: str = ""  # remote: its connection to the broker
    query: dict[str, np.ndarray] | None = None  # sent, awaiting its answer
    seq: int = 0
    sent_at: float = 0.0
    sizes: list[int] = field(default_factory=list)


class MuZeroActor(Node):
    role = roles.ACTS
    shows = {"sims_per_s": "sum"}
    links = {
        "policy": Link("dealer", required=False),
        "experience": Link("dealer", required=False, immediate=True),
        "params": Link("sub", required=False, hwm=4),
    }
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        envs: int = 32  # envs searched side by side, split over the lanes
        lanes: int = 2  # remote: requests in flight (search one lane while another waits)
        policy: str = "remote"  # remote | local
        request_timeout_s: float = 10.0
        max_outbox: int = 2  # inserts waiting for the replay's credit
        # An insert carries at most this many positions: what a replay's rate limiter
        # must fit.
        max_insert_positions: int = 256
        max_waiting_positions: int = 4096  # positions held before the lanes pause
        device: str = "cpu"  # policy: local
        precision: str = "float32"  # policy: local (as the inference broker's)

    @classmethod
    def largest_insert(cls, spec: NodeSpec, topo: Topology) -> int | None:
        try:
            return int(spec.args.get("max_insert_positions", cls.Args.max_insert_positions))
        except (TypeError, ValueError):  # bad args: their own checks say
            return None

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        args, where = spec.args, ("nodes", spec.name)
        errors = []
        for name in ("envs", "lanes", "max_insert_positions"):
            value = args.get(name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                errors.append(((*where, "args", name), f"{value!r}: must be an int >= 1"))
        envs, lanes = args.get("envs", cls.Args.envs), args.get("lanes", cls.Args.lanes)
        if isinstance(envs, int) and isinstance(lanes, int) and envs < lanes:
            errors.append(((*where, "args", "envs"), f"{envs}: fewer envs than lanes "
                                                     f"({lanes})"))
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
        except (TypeError, ValueError):
            return errors  # the algo section's own errors are reported with it
        if getattr(cfg, "items", None) != ITEMS:
            errors.append((("algo", "kind"), f"a muzero_actor ships {ITEMS}: algo "
                                             f"'{cfg.kind}' trains on {cfg.items}"))
        return errors

    def setup(self) -> None:
        from zmqrl.parts.acting.envs import EpisodeTracker
        from zmqrl.parts.envs import env_spec, make_vector_env
        from zmqrl.parts.muzero.search import SearchParams
        from zmqrl.parts.muzero.selfplay import LatentLane

        topo, a = self.ctx.topo, self.args
        self.spec = env_spec(topo.env)
        if self.spec.num_actions is None:
            raise ValueError(f"muzero needs discrete actions; {topo.env['id']} has none")
        cfg = self.cfg = topo.algo_config
        self.check = messages.Context.from_env(self.spec)
        self.reply_spec = messages.spec(wire.ACT, "latent_search")
        params = SearchParams.of(cfg)
        seed = topo.seed + 10_000 * (self.ctx.replica + 1)
        self.returns = EpisodeStats(window=100)
        self.envs: list[Any] = []
        self.lanes = []
        sizes = [a.envs // a.lanes + (i < a.envs % a.lanes) for i in range(a.lanes)]
        for i, size in enumerate(sizes):
            env = make_vector_env(topo.env, size, seed + 1000 * i)
            self.envs.append(env)
            obs, _ = env.reset(seed=seed + 1000 * i)
            step = self._env_stepper(env, EpisodeTracker(size))
            self.lanes.append(_Lane(LatentLane(
                obs.astype(self.spec.obs_dtype, copy=False), step, self.spec.num_actions,
                params, cfg.unroll_steps, cfg.td_steps, seed + 1000 * i + 1,
                reanalyse=cfg.reanalyse, priority_eps=cfg.priority_eps,
                unroll_obs=cfg.unroll_observations)))
        self.outbox = Outbox(self, "experience", a.max_outbox) \
            if "experience" in self.sockets else None
        self.waiting: deque[dict[str, np.ndarray]] = deque()  # items waiting for credit
        self.waiting_positions = 0
        self.version = 0
        self.env_steps = self.positions_sent = 0
        self.latency = LatencyReservoir()
        self._rate_mark = (time.monotonic(), 0)
        self.local = None
        if a.policy == "local":
            self._local_model()
        else:
            for i, lane in enumerate(self.lanes):
                lane.socket = "policy" if i == 0 else self.open_link("policy", f"policy_{i}")
                self.set_handler(lane.socket,
                                 lambda _envelope, msg, lane=lane: self._on_act(lane, msg))
                self._send_query(lane)
        self.log.info("%s, %d envs in %d lanes, %d simulations a move, %s inference",
                      topo.env["id"], a.envs, a.lanes, params.num_simulations, a.policy)

    def _env_stepper(self, env: Any, episodes: Any) -> Any:
        def step(action: np.ndarray) -> tuple[np.ndarray, ...]:
            obs, reward, terminated, truncated, _info = env.step(action)
            reward = reward.astype(np.float32, copy=False)
            self.env_steps += len(action)
            returns, lengths = episodes.step(reward, terminated | truncated)
            if len(returns):
                self.returns.add(returns, lengths)
                self.episode_log.extend(returns.tolist())  # the run's return
            return obs.astype(self.spec.obs_dtype, copy=False), reward, terminated, truncated
        return step

    def _local_model(self) -> None:
        import torch

        from zmqrl.parts.acting import ActingSetup
        from zmqrl.parts.acting.params import ParamsFollower
        from zmqrl.parts.devices import resolve_precision
        from zmqrl.parts.models import build_model
        from zmqrl.parts.muzero.acting import LatentSearchBehaviour

        torch.set_num_threads(1)
        topo, a = self.ctx.topo, self.args
        self.model = build_model(topo.model, self.spec, topo.seed,
                                 algo=topo.algo_config).to(a.device)
        self.model.eval()
        self.params = ParamsFollower(self.model, self)
        setup = ActingSetup(self.spec, self.model, self.cfg, precision=resolve_precision(
            a.precision, torch.device(a.device)))
        self.local = [LatentSearchBehaviour(setup, lane.play.n) for lane in self.lanes]

    # ----- local inference ----------------------------------------------------------------
    def _answer_locally(self) -> None:
        """One round of every lane, answered in one forward pass."""
        from zmqrl.parts.acting import act_batched

        for lane, behaviour in zip(self.lanes, self.local, strict=True):
            behaviour.observe_step(wire.Message(wire.STEP, {}, lane.play.query()))
        actions = act_batched(self.model, self.local, self.version)
        for lane, behaviour, action in zip(self.lanes, self.local, actions, strict=True):
            out = behaviour.reply(action)
            lane.play.answer(out["logits"], out["value"], out["reward"])
            self._collect(lane)

    # ----- remote inference ---------------------------------------------------------------
    def _send_query(self, lane: _Lane) -> None:
        lane.query = lane.play.query()
        self._send(lane)

    def _send(self, lane: _Lane) -> None:
        lane.seq += 1
        self.send(lane.socket, wire.encode(wire.STEP, lane.query, seq=lane.seq))
        lane.sent_at = time.perf_counter()
        lane.sizes.append(len(lane.query["root"]))

    def _on_act(self, lane: _Lane, msg: wire.Message) -> None:
        if msg.type == wire.ERROR:
            if msg.fields.get("retry") is True:
                # the broker is full for now: ask again in a second
                self.log_rejection(lane.socket,
                                   f"the inference broker: {msg.fields.get('error')}")
                lane.sent_at = time.perf_counter() - self.args.request_timeout_s + RETRY_S
                return
            from zmqrl.parts.muzero.acting import SEARCH_AGAIN

            if SEARCH_AGAIN in str(msg.fields.get("error")):
                self.log.warning("the broker lost this lane's latents (it restarted); "
                                 "searching the move again from its roots")
                self._restart(lane)
                return
        self.expect_reply(msg, wire.ACT, "the inference broker")
        if lane.query is None or msg.fields.get("seq") != lane.seq:
            return  # a late reply to a request we gave up on
        n = messages.check(msg, self.reply_spec, self.check)["n"]
        if n != len(lane.query["root"]):
            raise wire.ProtocolError(f"act answers {n} queries, we sent "
                                     f"{len(lane.query['root'])}")
        self.latency.add(time.perf_counter() - lane.sent_at)
        lane.query = None
        lane.play.answer(msg["logits"], msg["value"], msg["reward"])
        self._collect(lane)
        if not self._held():
            self._send_query(lane)

    def _restart(self, lane: _Lane) -> None:
        """Search the lane's moves again from their roots, on a fresh socket."""
        lane.play.restart_search()
        self.reopen(lane.socket)
        self._send_query(lane)

    # ----- positions ----------------------------------------------------------------------
    def _collect(self, lane: _Lane) -> None:
        items = lane.play.targets.take()
        if items is not None:
            self.waiting.append(items)
            self.waiting_positions += len(items["obs"])
        self._ship()

    def _ship(self) -> None:
        """Waiting items go out together (up to ``max_insert_positions``) as one insert
        when the replay has credit for it."""
        if self.outbox is None:
            self.waiting.clear()  # nothing linked to take them (benchmarks)
            self.waiting_positions = 0
            return
        if not self.waiting or len(self.outbox):
            return  # one insert waits at most; the positions gather meanwhile
        cap, parts, count = self.args.max_insert_positions, [], 0
        while self.waiting and count < cap:
            part = self.waiting.popleft()
            take = min(len(part["obs"]), cap - count)
            if take < len(part["obs"]):  # the rest waits for the next insert
                self.waiting.appendleft({k: v[take:] for k, v in part.items()})
                part = {k: v[:take] for k, v in part.items()}
            parts.append(part)
            count += take
        arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        # (a remote actor does not know the broker's parameter version: it says none)
        extra = {"version": self.version} if self.local is not None else {}
        self.outbox.push(wire.encode(wire.INSERT, arrays, **extra))
        self.positions_sent += count
        self.waiting_positions -= count

    def _held(self) -> bool:
        return self.waiting_positions > self.args.max_waiting_positions

    # ----- the runtime's hooks ------------------------------------------------------------
    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        if self.local is not None and self.params.offer(msg):
            self.version = self.params.version

    def on_peer_silent(self, name: str) -> None:
        for lane in self.lanes:
            if lane.socket == name and lane.query is not None:
                self.log.warning("the broker went silent; reconnecting and searching the "
                                 "move again from its roots")
                self._restart(lane)

    def poll_timeout_ms(self) -> int:
        if self.local is not None and not self._held():
            return 0  # local: keep searching; just look for params and credit
        return 100

    def after_poll(self) -> None:
        if self.outbox is not None:
            self.outbox.flush()
        self._ship()
        if self._held():
            return
        if self.local is not None:
            self._answer_locally()
            return
        now = time.perf_counter()
        for lane in self.lanes:
            if lane.query is None:  # paused after its last reply: go on
                self._send_query(lane)
            elif now - lane.sent_at > self.args.request_timeout_s:
                self.log.warning("no reply in %.1fs; reconnecting to the broker and "
                                 "searching the move again from its roots",
                                 self.args.request_timeout_s)
                self._restart(lane)

    def teardown(self) -> None:
        for env in self.envs:
            env.close()

    def metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        sims = sum(lane.play.simulations for lane in self.lanes)
        t0, sims0 = self._rate_mark
        self._rate_mark = (now, sims)
        sizes = [s for lane in self.lanes for s in lane.sizes]
        for lane in self.lanes:
            lane.sizes.clear()
        p50, p99 = self.latency.percentiles_ms()
        row = {"env_steps": self.env_steps, "simulations": sims,
               "sims_per_s": round((sims - sims0) / max(now - t0, 1e-9), 1),
               "positions_sent": self.positions_sent,
               "positions_waiting": self.waiting_positions,
               "search_restarts": sum(lane.play.restarts for lane in self.lanes),
               "param_version": self.version,
               "queries_per_request": round(float(np.mean(sizes)), 2) if sizes else 0,
               "latency_p50_ms": p50, "latency_p99_ms": p99,
               "outbox": len(self.outbox) if self.outbox is not None else 0}
        if self.returns.count:
            row.update(episodes=self.returns.count,
                       return_mean_100=round(self.returns.mean_return(), 2),
                       length_mean_100=round(self.returns.mean_length(), 1))
        return row
