"""Learner: trains the model on experience and hands the parameters on.

The algorithm is the topology's ``algo.kind`` (``zmqrl.algos.ALGOS``), and it decides
where the data comes from:

* unroll algorithms (vtrace, a2c): unrolls arrive on the ``experience`` port, from an
  inference broker (SEED, A2C) or from local-policy actors (IMPALA). Each loop turn
  stacks ``batch_size`` env columns into a batch and updates; at most one batch waits
  here, the rest waits in the producers' outboxes (backpressure, nothing dropped).
* replay algorithms (dqn; r2d2 with sequences and their stored recurrent state): the
  learner asks the ``replay`` link for batches (keeping ``prefetch`` requests in flight
  so the replay works while we train) and sends the new priorities back.

Data-parallel (PPO, OpenAI Five style): a learner node with ``replicas > 1`` forms a
gloo process group (``zmqrl.distributed``). Producers spread unrolls over the replicas
(a DEALER round-robins), each replica trains on ``batch_size / replicas`` columns and
the gradients are averaged every step, so all replicas hold identical parameters.

The updated parameters go out on the ``params`` port (PUB) every ``publish_every``
updates. With a ``param_server`` link (Gorila) the learner does not step its own
optimizer: it sends its gradients there and continues from the parameters it gets back.
Checkpoints are written atomically (write, then rename).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zmqrl import distributed, wire
from zmqrl.algos import REPLAY_ALGOS, SEQUENCE_ALGOS, UNROLL_ALGOS, make_algo
from zmqrl.envs import env_spec
from zmqrl.metrics import EpisodeStats
from zmqrl.models import build_model, load_state_arrays, pick_device, state_arrays
from zmqrl.node import Link, Node
from zmqrl.topology import NodeSpec, Topology

_UNROLL_KEYS = ("obs", "action", "logp", "reward", "done")
_TRANSITION_KEYS = ("obs", "action", "reward", "discount", "next_obs")
_SEQUENCE_KEYS = ("obs", "action", "reward", "done", "state_h", "state_c")
# Algorithms whose learner can average gradients over data-parallel replicas.
_DATA_PARALLEL_ALGOS = frozenset({"ppo"})
# Data-parallel replicas report a digest of their parameters every this many updates
# (metrics ``digest_updates``, ``params_digest``): equal digests at equal update counts
# show that the replicas hold bitwise identical parameters.
_DIGEST_EVERY = 2


def params_digest(model: torch.nn.Module) -> str:
    """A short hash of every parameter and buffer, bit for bit."""
    sha = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        sha.update(name.encode())
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()[:16]


class Learner(Node):
    binds = {"experience": "router", "params": "pub"}
    port_hwm = {"params": 4}  # a subscriber that falls behind gets fresh params, not old
    links = {"replay": Link("dealer", required=False),
             "param_server": Link("dealer", required=False)}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        device: str = "auto"
        publish_every: int = 1  # updates between parameter broadcasts
        checkpoint_every: int = 200  # updates between checkpoints (0: only at exit)
        prefetch: int = 2  # replay sample requests kept in flight
        request_timeout_s: float = 10.0  # replay / parameter server silent this long: resend
        # Gorila: gradients in flight to the parameter server. 1 waits for fresh parameters
        # after each push; 2 computes the next gradient meanwhile, one update stale, as
        # Gorila's asynchronous learners do.
        max_pending_grads: int = 1

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        kind = topo.algo.get("kind", "vtrace")
        where = ("nodes", spec.name, "links")
        if kind in REPLAY_ALGOS and "replay" not in spec.links:
            return [(where, f"algo '{kind}' learns from a replay: add a 'replay' link")]
        if kind in UNROLL_ALGOS and "replay" in spec.links:
            return [(where, f"algo '{kind}' learns from unrolls on the 'experience' port; "
                            "remove the 'replay' link")]
        if kind not in REPLAY_ALGOS and "param_server" in spec.links:
            return [(where, f"a 'param_server' link needs a replay algorithm, not '{kind}'")]
        data_parallel = spec.replicas > 1 and "param_server" not in spec.links
        if data_parallel and kind not in _DATA_PARALLEL_ALGOS:
            return [(("nodes", spec.name, "replicas"),
                     f"data-parallel learner replicas need algo "
                     f"{' or '.join(sorted(_DATA_PARALLEL_ALGOS))}, not '{kind}'")]
        batch = topo.algo.get("batch_size")
        if data_parallel and isinstance(batch, int) and batch % spec.replicas:
            return [(("algo", "batch_size"), f"{batch} does not split evenly over "
                                             f"{spec.replicas} learner replicas")]
        return []

    def setup(self) -> None:
        torch.set_num_threads(1)
        topo = self.ctx.topo
        self.kind = topo.algo.get("kind", "vtrace")
        self.spec = env_spec(topo.env)
        self.device = pick_device(self.args.device)
        self.model = build_model(topo.model, self.spec, topo.seed).to(self.device)
        # Replicas with a parameter server (Gorila) are independent learners; without
        # one they are data-parallel and form a process group.
        self.world = 1 if "param_server" in self.ctx.spec.links else self.ctx.spec.replicas
        extra = {}
        if self.world > 1:
            distributed.init_group(
                distributed.rendezvous_address(topo, self.ctx.spec, self.ctx.run_dir),
                self.ctx.replica, self.world)
            extra["allreduce"] = distributed.mean_allreduce(self.world)
        self.algo = make_algo(topo.algo, self.model, **extra)
        self.cfg = self.algo.cfg
        self.local_batch = self.cfg.batch_size // self.world  # columns this replica trains on
        self.digest: tuple[int, str] | None = None
        self.batch_keys = _SEQUENCE_KEYS if self.kind in SEQUENCE_ALGOS else _TRANSITION_KEYS
        self.updates = 0
        self.env_steps = 0
        self.episodes = EpisodeStats(window=100)
        self.last_terms: dict[str, float] = {}
        self.lags: list[int] = []
        self._rate_mark = (time.monotonic(), 0)
        self.checkpoint_path = self.ctx.run_dir / "checkpoints" / f"{self.ctx.label}.pt"
        # unroll path
        self.queue: list[wire.Message] = []
        self.queued_columns = 0
        # replay path
        self.batches: deque[wire.Message] = deque()
        self.in_flight = 0
        self.pending_grads = 0  # gradients sent to the parameter server, not yet answered
        self.last_reply = time.monotonic()
        if "replay" in self.sockets:
            for _ in range(self.args.prefetch):
                self._request_sample()
        self._publish()
        self.log.info("%s on %s, batch %d", self.kind, self.device, self.cfg.batch_size)

    # ----- unroll path ----------------------------------------------------------------
    def on_experience(self, envelope: list, msg: wire.Message) -> None:
        if self.kind not in UNROLL_ALGOS:
            raise wire.ProtocolError(f"this learner ({self.kind}) takes no unrolls")
        if msg.type != wire.UNROLL:
            raise wire.ProtocolError(f"experience port takes '{wire.UNROLL}', not '{msg.type}'")
        self._check_unroll(msg)
        n = msg["action"].shape[1]
        self.env_steps += msg["action"].shape[0] * n
        if "ep_return" in msg.arrays:
            self.episodes.add(msg["ep_return"], msg["ep_length"])
        self.queue.append(msg)
        self.queued_columns += n
        # Credit on receipt (not when trained on): a producer may then have its credit's
        # worth in flight while we train, and a batch that needs more messages than one
        # producer's credit can still fill.
        self.grant_credit("experience", envelope)

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

    def _train_unrolls(self) -> None:
        while self.queued_columns >= self.local_batch:
            taken, columns = [], 0
            while columns < self.local_batch:
                taken.append(self.queue.pop(0))
                columns += taken[-1]["action"].shape[1]
            self.queued_columns -= columns
            batch = {k: torch.from_numpy(np.concatenate([m[k] for m in taken], axis=1))
                     .to(self.device) for k in _UNROLL_KEYS}
            self.lags.extend(self.updates - int(m.fields.get("version", 0)) for m in taken)
            self.last_terms = self.algo.update(batch)
            self._after_update()

    # ----- replay path ----------------------------------------------------------------
    def _request_sample(self) -> None:
        self.send("replay", wire.encode(wire.SAMPLE, batch_size=self.cfg.batch_size))
        self.in_flight += 1

    def on_replay(self, _envelope: list, msg: wire.Message) -> None:
        self.expect_reply(msg, wire.BATCH, "the replay")
        missing = [k for k in (*self.batch_keys, "key", "weight") if k not in msg.arrays]
        if missing:
            raise wire.ProtocolError(f"batch lacks {', '.join(missing)}")
        self.in_flight = max(0, self.in_flight - 1)
        self.last_reply = time.monotonic()
        self.batches.append(msg)

    def _train_replay(self) -> None:
        if (self.in_flight or self.pending_grads) and \
                time.monotonic() - self.last_reply > self.args.request_timeout_s:
            # A restarted replay or parameter server lost our requests: ask again.
            self.log.warning("no reply in %.0fs; reconnecting", self.args.request_timeout_s)
            for name in ("replay", "param_server"):
                if name in self.sockets:
                    self.reopen(name)
            self.in_flight, self.pending_grads = 0, 0
            self.last_reply = time.monotonic()
        while self.batches and self.pending_grads < self.args.max_pending_grads:
            msg = self.batches.popleft()
            batch = {k: torch.from_numpy(np.array(msg[k])).to(self.device)
                     for k in self.batch_keys}
            batch["weights"] = torch.from_numpy(np.array(msg["weight"])).to(self.device)
            if "param_server" in self.sockets:
                grads, terms, priorities = self.algo.gradients(batch)
                names = [n for n, p in self.model.named_parameters() if p.requires_grad]
                self.send("param_server", wire.encode(
                    wire.GRADS, {n: g.cpu().numpy() for n, g in zip(names, grads, strict=True)},
                    version=self.updates))
                self.pending_grads += 1
            else:
                terms, priorities = self.algo.update(batch)
                self._after_update()
            self.last_terms = terms
            self.send("replay", wire.encode(wire.PRIORITIES, {
                "key": msg["key"], "priority": priorities.numpy().astype(np.float32)}))
        while self.in_flight < self.args.prefetch:
            self._request_sample()

    def on_param_server(self, _envelope: list, msg: wire.Message) -> None:
        self.expect_reply(msg, wire.PARAMS, "the parameter server")
        load_state_arrays(self.model, msg.arrays)
        self.pending_grads = 0  # gradients sent to the parameter server, not yet answered
        self.last_reply = time.monotonic()
        self.algo.after_update()  # our step counter and target network follow the server's
        self.updates += 1

    # ----- both -----------------------------------------------------------------------
    def after_poll(self) -> None:
        if self.kind in UNROLL_ALGOS:
            self._train_unrolls()
        else:
            self._train_replay()

    def _after_update(self) -> None:
        self.updates += 1
        if self.world > 1 and self.updates % _DIGEST_EVERY == 0:
            self.digest = (self.updates, params_digest(self.model))
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

    def metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        t0, steps0 = self._rate_mark
        self._rate_mark = (now, self.env_steps)
        row: dict[str, Any] = {"updates": self.updates}
        if self.kind in UNROLL_ALGOS:
            row.update({
                "env_steps": self.env_steps,
                "steps_per_s": round((self.env_steps - steps0) / max(now - t0, 1e-9), 1),
                "episodes": self.episodes.count,
                "return_mean_20": round(self.episodes.mean_return(20), 2),
                "return_mean_100": round(self.episodes.mean_return(), 2),
                "length_mean_100": round(self.episodes.mean_length(), 1),
                "policy_lag": round(float(np.mean(self.lags)), 2) if self.lags else math.nan,
                "queue": len(self.queue),
            })
        else:
            row["batches_waiting"] = len(self.batches)
        row.update({k: round(v, 5) for k, v in self.last_terms.items()})
        if self.digest is not None:
            row["digest_updates"], row["params_digest"] = self.digest
        self.lags = []
        return row

    def teardown(self) -> None:
        self.save_checkpoint()
        distributed.leave_group()
