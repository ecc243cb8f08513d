"""Reanalyse (MuZero Reanalyse; Schrittwieser et al. 2021, EfficientZero): recompute the
targets of stored positions with the latest parameters and write them back to the
replay.

Added or left out in YAML: a ``reanalyse`` node links ``replay`` to a replay's ``sample``
port and ``params`` to the learner, and the algorithm sets ``reanalyse: true`` so that
the actors' items carry what recomputing their targets takes
(``zmqrl.parts.muzero.messages``). Its loop, one request in flight:

1. ask the replay for ``batch_size`` held items (``sample`` with ``revise: true``: drawn
   uniformly at once, outside the rate limiter, so the learner's replay ratio stays its
   own);
2. search again, with the latest parameters and no root noise, from every position of
   each item's unroll (t..t+K, as far as its episode goes): the new visit distributions
   are the policy targets;
3. value each target's bootstrap observation with the latest network:
   ``z = partial_return + bootstrap_discount * v``;
4. send ``revise`` (keys, values, policies, the batch's ``source``): the replay
   overwrites the items it still holds.

It keeps nothing between rounds: killed and restarted it loses nothing, and the replay
never waits for it. It revises only once it holds the learner's parameters (the
initial network's targets would be worse than the actors'). A replay that answers
nothing within ``request_timeout_s`` gets a fresh socket and the request again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.bus import messages, roles, wire
from zmqrl.bus.node import Link, Node
from zmqrl.run.topology import NodeSpec, Topology


class Reanalyse(Node):
    role = roles.NONE  # it takes no env steps and trains nothing: the run counts neither
    shows = {"revised_per_s": "sum"}
    links = {
        "replay": Link("dealer"),
        "params": Link("sub", required=False, hwm=4),
    }
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        batch_size: int = 32  # items revised per round (each: K + 1 searches)
        request_timeout_s: float = 30.0
        retry_s: float = 1.0  # after the replay said it holds too few items
        device: str = "cpu"

    @classmethod
    def revise_batch(cls, spec: NodeSpec, topo: Topology) -> int | None:
        size = spec.args.get("batch_size", cls.Args.batch_size)
        return size if type(size) is int and size >= 1 else None

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        args, where = spec.args, ("nodes", spec.name)
        errors = []
        size = args.get("batch_size", 1)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            errors.append(((*where, "args", "batch_size"), f"{size!r}: must be an int >= 1"))
        try:
            cfg = topo.algo_config
        except (TypeError, ValueError):
            return errors  # the algo section's own errors are reported with it
        try:
            messages.spec(wire.REVISE, cfg.items)
        except KeyError:
            errors.append((("algo", "kind"), f"algo '{cfg.kind}' trains on {cfg.items}, "
                                             "which declare no 'revise': nothing to reanalyse"))
            return errors
        if getattr(cfg, "reanalyse", None) is not True:
            errors.append((("algo", "reanalyse"), "a reanalyse node needs 'reanalyse: true' "
                                                  "(the items then carry what it recomputes "
                                                  "their targets from)"))
        return errors

    def setup(self) -> None:
        import torch

        from zmqrl.parts.acting.params import ParamsFollower
        from zmqrl.parts.envs import env_spec
        from zmqrl.parts.models import build_model
        from zmqrl.parts.muzero.models import numpy_inference
        from zmqrl.parts.muzero.search import SearchParams

        torch.set_num_threads(1)
        topo, a = self.ctx.topo, self.args
        self.cfg = cfg = topo.algo_config
        self.spec = env_spec(topo.env)
        self.model = build_model(topo.model, self.spec, topo.seed, algo=cfg).to(a.device)
        self.model.eval()
        self.params = ParamsFollower(self.model, self)
        self.initial, self.recurrent = numpy_inference(self.model)
        # The best estimate, not exploration: no root noise.
        self.search_params = SearchParams.of(cfg, dirichlet_fraction=0.0)
        self.rng = np.random.default_rng(topo.seed + 20_000 + self.ctx.replica)
        # K and the reanalyse arrays as the configuration fixes them: a batch without
        # them is refused by the check, not a crash in the search
        self.check = messages.Context.from_env(self.spec, algo=cfg)
        self.batch_spec = messages.spec(wire.BATCH, cfg.items)
        self.in_flight = False
        self.sent_at = 0.0
        self.not_before = 0.0
        self.revised = self.rounds = self.retries = 0
        self.search_s = 0.0
        self._mark = (time.monotonic(), 0)
        self.log.info("reanalysing %d items a round, %d simulations a position",
                      a.batch_size, self.search_params.num_simulations)

    # ----- the loop -------------------------------------------------------------------------
    def poll_timeout_ms(self) -> int:
        return 100

    def after_poll(self) -> None:
        now = time.monotonic()
        if self.in_flight:
            if now - self.sent_at > self.args.request_timeout_s:
                self.log.warning("no reply from the replay in %.0fs; reconnecting and "
                                 "asking again", self.args.request_timeout_s)
                self.reopen("replay")
                self.in_flight = False
            return
        if self.params.version == 0 or now < self.not_before:
            return  # no parameters from the learner yet, or told to wait
        self.send("replay", wire.encode(wire.SAMPLE, batch_size=self.args.batch_size,
                                        client=self.ctx.label, revise=True))
        self.in_flight, self.sent_at = True, now

    def on_replay(self, _envelope: list, msg: wire.Message) -> None:
        self.in_flight = False
        if msg.type == wire.ERROR and msg.fields.get("retry") is True:
            self.retries += 1  # too few items held yet
            self.not_before = time.monotonic() + self.args.retry_s
            return
        self.expect_reply(msg, wire.BATCH, "the replay")
        messages.check(msg, self.batch_spec, self.check)
        started = time.perf_counter()
        value, policy = self._targets(msg)
        self.search_s += time.perf_counter() - started
        self.send("replay", wire.encode(wire.REVISE, {
            "key": msg["key"], "value": value, "policy": policy},
            source=msg.fields.get("source", "")))
        self.revised += len(msg["key"])
        self.rounds += 1

    def _targets(self, msg: wire.Message) -> tuple[np.ndarray, np.ndarray]:
        """New value and policy targets [B, K+1] and [B, K+1, A] of a batch."""
        from zmqrl.parts.muzero.search import search

        mask = msg["mask"]
        roots = np.concatenate([msg["obs"][:, None], msg["obs_unroll"]], axis=1)
        visits, _ = search(self.initial, self.recurrent, roots[mask], self.search_params,
                           self.rng)
        policy = np.array(msg["policy"], np.float32)  # past the end: kept (uniform)
        policy[mask] = visits / visits.sum(-1, keepdims=True)
        discount = msg["bootstrap_discount"]
        value = np.array(msg["partial_return"], np.float32)
        boot = discount > 0
        if boot.any():
            _, _, v = self.initial(msg["obs_bootstrap"][boot])
            value[boot] += discount[boot] * v
        return value, policy.astype(np.float32)

    # ----- the runtime's hooks --------------------------------------------------------------
    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        self.params.offer(msg)

    def metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        t0, revised0 = self._mark
        self._mark = (now, self.revised)
        return {"revised": self.revised, "rounds": self.rounds,
                "revised_per_s": round((self.revised - revised0) / max(now - t0, 1e-9), 1),
                "search_s": round(self.search_s, 2), "waits": self.retries,
                "param_version": self.params.version}
