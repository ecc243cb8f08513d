"""MuZero actor: plays its envs by search in the learned model and sends the positions,
with their unroll targets, to a replay.

A search actor (:mod:`zmqrl.parts.search.actor`: lanes, remote or local answers, the
replay's credit): the actor's ``envs`` are split over ``lanes``; a lane is one
:class:`zmqrl.parts.muzero.selfplay.LatentLane` (a vector env and a tree per env,
searched in lockstep), and each search round is one query per env:

* ``remote``: the round goes to the inference broker as one ``step``/``latent_search``;
  the broker keeps every tree's latents and answers the rounds of all connections
  waiting in one forward pass (``zmqrl.parts.muzero.acting``). No reply within
  ``request_timeout_s``, or a broker that no longer holds the latents (it restarted): a
  fresh socket, and the move searched again from its roots.
* ``local``: a copy of the model in this process answers every lane's round in one
  forward pass, following the learner's ``params``.

Positions go out on ``experience`` as ``insert``/``search_targets`` (at most
``max_insert_positions`` each). The search's settings are the ``muzero`` algorithm's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.bus import wire
from zmqrl.bus.metrics import EpisodeStats
from zmqrl.parts.search.actor import Lane, SearchActor
from zmqrl.run.topology import NodeSpec, Topology

ITEMS = "search_targets"  # what it ships (zmqrl.parts.muzero.messages)


class MuZeroActor(SearchActor):
    shows = {"sims_per_s": "sum"}
    reply_variant = "latent_search"
    request_unit = "queries"

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
        errors += cls.check_policy(spec)
        try:
            cfg = topo.algo_config
        except (TypeError, ValueError):
            return errors  # the algo section's own errors are reported with it
        if getattr(cfg, "items", None) != ITEMS:
            errors.append((("algo", "kind"), f"a muzero_actor ships {ITEMS}: algo "
                                             f"'{cfg.kind}' trains on {cfg.items}"))
        return errors

    def setup(self) -> None:
        from zmqrl.parts.envs import env_spec
        from zmqrl.parts.muzero.search import SearchParams

        topo, a = self.ctx.topo, self.args
        self.spec = env_spec(topo.env)
        if self.spec.num_actions is None:
            raise ValueError(f"muzero needs discrete actions; {topo.env['id']} has none")
        self.cfg = topo.algo_config
        self.search = SearchParams.of(self.cfg)
        self.returns = EpisodeStats(window=100)
        self.envs: list[Any] = []
        self.env_steps = 0
        self.start_lanes(self.spec)
        self.log.info("%s, %d envs in %d lanes, %d simulations a move, %s inference",
                      topo.env["id"], a.envs, a.lanes, self.search.num_simulations, a.policy)

    def make_lanes(self) -> list[Lane]:
        from zmqrl.parts.acting.envs import EpisodeTracker
        from zmqrl.parts.envs import make_vector_env
        from zmqrl.parts.muzero.selfplay import LatentLane

        topo, a, cfg = self.ctx.topo, self.args, self.cfg
        seed = topo.seed + 10_000 * (self.ctx.replica + 1)
        lanes = []
        sizes = [a.envs // a.lanes + (i < a.envs % a.lanes) for i in range(a.lanes)]
        for i, size in enumerate(sizes):
            env = make_vector_env(topo.env, size, seed + 1000 * i)
            self.envs.append(env)
            obs, _ = env.reset(seed=seed + 1000 * i)
            step = self._env_stepper(env, EpisodeTracker(size))
            lanes.append(Lane(LatentLane(
                obs.astype(self.spec.obs_dtype, copy=False), step, self.spec.num_actions,
                self.search, cfg.unroll_steps, cfg.td_steps, seed + 1000 * i + 1,
                reanalyse=cfg.reanalyse, priority_eps=cfg.priority_eps,
                unroll_obs=cfg.unroll_observations, bootstrap=cfg.bootstrap_arrays)))
        return lanes

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

    # ----- local inference ----------------------------------------------------------------
    def local_model(self) -> None:
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
        self.behaviours = [LatentSearchBehaviour(setup, lane.play.n) for lane in self.lanes]

    def answer_locally(self) -> None:
        """One round of every lane, answered in one forward pass."""
        from zmqrl.parts.acting import act_batched

        for lane, behaviour in zip(self.lanes, self.behaviours, strict=True):
            behaviour.observe_step(wire.Message(wire.STEP, {}, lane.play.query()))
        actions = act_batched(self.model, self.behaviours, self.version)
        for lane, behaviour, action in zip(self.lanes, self.behaviours, actions, strict=True):
            out = behaviour.reply(action)
            lane.play.answer(out["logits"], out["value"], out["reward"])
            self.collect(lane)
            self.ship()

    # ----- remote inference ---------------------------------------------------------------
    def next_request(self, lane: Lane) -> dict[str, np.ndarray]:
        return lane.play.query()

    def answer(self, lane: Lane, msg: wire.Message) -> None:
        lane.play.answer(msg["logits"], msg["value"], msg["reward"])

    def on_error(self, lane: Lane, msg: wire.Message) -> bool:
        from zmqrl.parts.muzero.acting import SEARCH_AGAIN

        if SEARCH_AGAIN not in str(msg.fields.get("error")):
            return False
        self.recover(lane, "the broker lost this lane's latents (it restarted)")
        return True

    def recover(self, lane: Lane, why: str) -> None:
        """Search the lane's moves again from their roots, on a fresh socket: the latents
        of the request in flight may be gone with the broker."""
        self.log.warning("%s; searching the move again from its roots", why)
        lane.play.restart_search()
        self.reopen(lane.socket)
        self.send_request(lane)

    # ----- positions ----------------------------------------------------------------------
    def collect(self, lane: Lane) -> None:
        items = lane.play.targets.take()
        if items is not None:
            self.waiting.append(items)
            self.waiting_positions += len(items["obs"])

    def pack(self) -> tuple[dict[str, np.ndarray], int]:
        """Waiting items together, up to ``max_insert_positions`` (the rest of an item
        waits for the next insert)."""
        cap, parts, count = self.args.max_insert_positions, [], 0
        while self.waiting and count < cap:
            part = self.waiting.popleft()
            take = min(len(part["obs"]), cap - count)
            if take < len(part["obs"]):
                self.waiting.appendleft({k: v[take:] for k, v in part.items()})
                part = {k: v[:take] for k, v in part.items()}
            parts.append(part)
            count += take
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, count

    # ----- the runtime's hooks ------------------------------------------------------------
    def teardown(self) -> None:
        for env in self.envs:
            env.close()

    def metrics(self) -> dict[str, Any]:
        row = {"env_steps": self.env_steps, **self.search_metrics(),
               "search_restarts": sum(lane.play.restarts for lane in self.lanes)}
        if self.returns.count:
            row.update(episodes=self.returns.count,
                       return_mean_100=round(self.returns.mean_return(), 2),
                       length_mean_100=round(self.returns.mean_length(), 1))
        return row
