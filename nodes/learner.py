"""Learner: takes unrolls from its ``experience`` port, trains, publishes parameters.

The algorithm is chosen by the topology's ``algo.kind`` (see ``zmqrl.algos.ALGOS``); this
node only moves data: it stacks ``batch_size`` env columns of incoming unrolls into a
batch, runs the algorithm's update, publishes parameters on its ``params`` port, logs
metrics and writes checkpoints atomically.

Backpressure: every loop turn trains until fewer than ``batch_size`` columns are left,
so at most one batch waits here; while we train, unrolls wait in the experience port's
small ZeroMQ queue (``port_hwm``) and then in the producers' outboxes, which stop their
actors. Nothing is dropped and nothing grows.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from zmqrl import wire
from zmqrl.algos import make_algo
from zmqrl.envs import env_spec
from zmqrl.metrics import EpisodeStats
from zmqrl.models import build_model, pick_device, state_arrays
from zmqrl.node import Node

_UNROLL_KEYS = ("obs", "action", "logp", "reward", "done")


class Learner(Node):
    binds = {"experience": "router", "params": "pub"}
    port_hwm = {"experience": 8, "params": 4}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        device: str = "auto"
        publish_every: int = 1  # updates between parameter broadcasts
        checkpoint_every: int = 200  # updates between checkpoints (0: only at exit)

    def setup(self) -> None:
        torch.set_num_threads(1)
        self.spec = env_spec(self.ctx.topo.env)
        self.device = pick_device(self.args.device)
        self.model = build_model(self.ctx.topo.model, self.spec, self.ctx.topo.seed).to(self.device)
        self.algo = make_algo(self.ctx.topo.algo, self.model)
        self.cfg = self.algo.cfg
        self.queue: list[wire.Message] = []
        self.queued_columns = 0
        self.updates = 0
        self.env_steps = 0
        self.episodes = EpisodeStats(window=100)
        self.last_terms: dict[str, float] = {}
        self.lags: list[int] = []
        self._rate_mark = (time.monotonic(), 0)
        self.checkpoint_path = self.ctx.run_dir / "checkpoints" / f"{self.ctx.label}.pt"
        self._publish()
        self.log.info("%s on %s, batch %d x unroll %d", self.cfg.kind, self.device,
                      self.cfg.batch_size, self.cfg.unroll)

    def on_experience(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.UNROLL:
            raise wire.ProtocolError(f"experience port takes '{wire.UNROLL}', not '{msg.type}'")
        self._check_unroll(msg)
        n = msg["action"].shape[1]
        self.env_steps += self.cfg.unroll * n
        if "ep_return" in msg.arrays:
            self.episodes.add(msg["ep_return"], msg["ep_length"])
        self.queue.append(msg)
        self.queued_columns += n

    def _check_unroll(self, msg: wire.Message) -> None:
        missing = [k for k in _UNROLL_KEYS if k not in msg.arrays]
        if missing:
            raise wire.ProtocolError(f"unroll lacks {', '.join(missing)}")
        T = self.cfg.unroll
        n = msg["action"].shape[1] if msg["action"].ndim >= 2 else -1
        want = {
            "obs": (T + 1, n, *self.spec.obs_shape),
            "action": (T, n, *self.spec.action_shape),
            "logp": (T, n), "reward": (T, n), "done": (T, n),
        }
        for key, shape in want.items():
            if n < 1 or msg[key].shape != shape:
                raise wire.ProtocolError(
                    f"unroll '{key}' has shape {list(msg[key].shape)}, expected {list(shape)}"
                )
        if ("ep_return" in msg.arrays) != ("ep_length" in msg.arrays):
            raise wire.ProtocolError("'ep_return' and 'ep_length' must come together")

    def after_poll(self) -> None:
        while self.queued_columns >= self.cfg.batch_size:
            taken, columns = [], 0
            while columns < self.cfg.batch_size:
                taken.append(self.queue.pop(0))
                columns += taken[-1]["action"].shape[1]
            self.queued_columns -= columns
            self._train(taken)

    def _train(self, msgs: list[wire.Message]) -> None:
        batch = {k: torch.from_numpy(np.concatenate([m[k] for m in msgs], axis=1)).to(self.device)
                 for k in _UNROLL_KEYS}
        self.lags.extend(self.updates - int(m.fields.get("version", 0)) for m in msgs)
        self.last_terms = self.algo.update(batch)
        self.updates += 1
        if self.updates % self.args.publish_every == 0:
            self._publish()
        if self.args.checkpoint_every and self.updates % self.args.checkpoint_every == 0:
            self.save_checkpoint()

    def _publish(self) -> None:
        self.send("params", wire.encode(wire.PARAMS, state_arrays(self.model),
                                        version=self.updates))

    def save_checkpoint(self) -> None:
        """Write then rename, so a crash mid-write never leaves a corrupt checkpoint."""
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(),
                    "optimizer": self.algo.optimizer.state_dict(),
                    "updates": self.updates, "env_steps": self.env_steps,
                    "torch_rng": torch.get_rng_state()}, tmp)
        os.replace(tmp, self.checkpoint_path)

    def metrics(self) -> dict:
        now = time.monotonic()
        t0, steps0 = self._rate_mark
        self._rate_mark = (now, self.env_steps)
        row = {
            "env_steps": self.env_steps,
            "steps_per_s": round((self.env_steps - steps0) / max(now - t0, 1e-9), 1),
            "updates": self.updates,
            "episodes": self.episodes.count,
            "return_mean_20": round(self.episodes.mean_return(20), 2),
            "return_mean_100": round(self.episodes.mean_return(), 2),
            "length_mean_100": round(self.episodes.mean_length(), 1),
            "policy_lag": round(float(np.mean(self.lags)), 2) if self.lags else float("nan"),
            "queue": len(self.queue),
        }
        row.update({k: round(v, 5) for k, v in self.last_terms.items()})
        self.lags = []
        return row

    def teardown(self) -> None:
        self.save_checkpoint()
