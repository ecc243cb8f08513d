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
updates, and to every new subscriber as soon as it subscribes (the port is bound as an
XPUB, so a broker or actor that joins late need not wait for the next update). With a
``param_server`` link (Gorila) the learner does not step its own optimizer: it sends its
gradients there and continues from the parameters it gets back.

Checkpoint and resume: ``checkpoints/<label>.pt`` in the run directory holds the model,
the algorithm's state (optimizer, target network, its counters: ``algo.state_dict()``),
the update and env-step counters, the episode statistics and the RNG states. It is
written every ``checkpoint_every`` updates and at exit, crash-safely
(``zmqrl.checkpoint.atomic_write``). A learner that finds its checkpoint when it starts
(a restart after a crash, or ``zmqrl up --resume``) restores it and publishes the
restored parameters with the restored update count as their version.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import zmq

from zmqrl import distributed, wire
from zmqrl.algos import REPLAY_ALGOS, SEQUENCE_ALGOS, UNROLL_ALGOS, make_algo
from zmqrl.checkpoint import atomic_write, checkpoint_dir
from zmqrl.envs import env_spec
from zmqrl.metrics import EpisodeStats
from zmqrl.models import build_model, load_state_arrays, pick_device, state_arrays
from zmqrl.node import Link, Node
from zmqrl.topology import NodeSpec, Topology

_UNROLL_KEYS = ("obs", "action", "logp", "reward", "done")
_STATE_KEYS = ("state_h", "state_c")  # unrolls of a recurrent policy (lstm_ac)
_TRANSITION_KEYS = ("obs", "action", "reward", "discount", "next_obs")
_SEQUENCE_KEYS = ("obs", "action", "reward", "done", "state_h", "state_c")
# Algorithms whose learner can average gradients over data-parallel replicas.
_DATA_PARALLEL_ALGOS = frozenset({"ppo"})
# Data-parallel replicas report a digest of their parameters every this many updates
# (metrics ``digest_updates``, ``params_digest``): equal digests at equal update counts
# show that the replicas hold bitwise identical parameters.
_DIGEST_EVERY = 2
_CHECKPOINT_FORMAT = 1
# An XPUB hands us b"\x01<topic>" for each new subscription (b"\x00..." when one goes).
_SUBSCRIBE = 1


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
    xpub_ports = frozenset({"params"})  # each new subscriber gets the current params at once
    links = {"replay": Link("dealer", required=False),
             "param_server": Link("dealer", required=False)}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        device: str = "auto"
        publish_every: int = 1  # updates between parameter broadcasts
        # updates between checkpoints (0: only at exit); a crash loses at most this many
        checkpoint_every: int = 200
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
        recurrent_policy = getattr(self.model, "recurrent", False) and self.kind in UNROLL_ALGOS
        self.state_size = self.model.state_size if recurrent_policy else 0
        self.unroll_keys = _UNROLL_KEYS + (_STATE_KEYS if self.state_size else ())
        self.updates = 0
        self.env_steps = 0
        self.episodes = EpisodeStats(window=100)
        self.last_terms: dict[str, float] = {}
        self.lags: list[int] = []
        self._rate_mark = (time.monotonic(), 0)
        self.checkpoint_path = checkpoint_dir(self.ctx.run_dir) / f"{self.ctx.label}.pt"
        # unroll path
        self.queue: list[wire.Message] = []
        self.queued_columns = 0
        # replay path
        self.batches: deque[wire.Message] = deque()
        self.in_flight = 0
        self.pending_grads = 0  # gradients sent to the parameter server, not yet answered
        self.last_reply = time.monotonic()
        if self.checkpoint_path.exists():
            self._restore()
        if "replay" in self.sockets:
            for _ in range(self.args.prefetch):
                self._request_sample()
        self._publish()  # the restored parameters, if any, with their version
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
        missing = [k for k in self.unroll_keys if k not in msg.arrays]
        if missing:
            raise wire.ProtocolError(f"unroll lacks {', '.join(missing)}")
        T = self.cfg.unroll
        n = msg["action"].shape[1] if msg["action"].ndim >= 2 else -1
        want = {
            "obs": (T + 1, n, *self.spec.obs_shape),
            "action": (T, n, *self.spec.action_shape),
            "logp": (T, n), "reward": (T, n), "done": (T, n),
        }
        if self.state_size:  # a recurrent policy's unrolls carry the state they began with
            want["state_h"] = want["state_c"] = (1, n, self.state_size)
        for key, shape in want.items():
            if n < 1 or msg[key].shape != shape:
                raise wire.ProtocolError(
                    f"unroll '{key}' has shape {list(msg[key].shape)}, expected {list(shape)}"
                )
        if ("ep_return" in msg.arrays) != ("ep_length" in msg.arrays):
            raise wire.ProtocolError("'ep_return' and 'ep_length' must come together")
        floats = ("obs", "logp", "reward") + (_STATE_KEYS if self.state_size else ())
        check_values(msg, floats, self.spec)

    def _train_unrolls(self) -> None:
        while self.queued_columns >= self.local_batch:
            taken, columns = [], 0
            while columns < self.local_batch:
                taken.append(self.queue.pop(0))
                columns += taken[-1]["action"].shape[1]
            self.queued_columns -= columns
            batch = {k: torch.from_numpy(np.concatenate([m[k] for m in taken], axis=1))
                     .to(self.device) for k in self.unroll_keys}
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

    def on_peer_silent(self, name: str) -> None:
        if name in ("replay", "param_server"):  # dead or restarted: our requests are lost
            self._reconnect_servers()

    def _reconnect_servers(self) -> None:
        """A restarted replay or parameter server lost our requests: reconnect (a new
        identity, so late replies to the old ones cannot arrive) and ask again."""
        for name in ("replay", "param_server"):
            if name in self.sockets:
                self.reopen(name)
        self.in_flight, self.pending_grads = 0, 0
        self.last_reply = time.monotonic()

    def _train_replay(self) -> None:
        if (self.in_flight or self.pending_grads) and \
                time.monotonic() - self.last_reply > self.args.request_timeout_s:
            self.log.warning("no reply in %.0fs; reconnecting", self.args.request_timeout_s)
            self._reconnect_servers()
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
        self._answer_new_subscribers()  # before training: they get the version we have now
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
                                        version=self.updates, source=self.incarnation))

    def _answer_new_subscribers(self) -> None:
        """Publish the current parameters once if anyone subscribed since the last turn.

        Subscriptions are coalesced, so a peer that keeps resubscribing costs at most
        one publish per loop turn; the others ignore a version they already hold."""
        sock = self.sockets["params"]
        joined = False
        for _ in range(1000):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            joined |= frame[:1] == bytes([_SUBSCRIBE])
        if joined:
            self._publish()

    def save_checkpoint(self) -> None:
        """Everything :meth:`_restore` needs, written crash-safely (temp file, fsync,
        rename): a kill at any moment leaves the previous checkpoint or this one."""
        state = {
            "format": _CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "algo": self.algo.state_dict(),
            "updates": self.updates,
            "env_steps": self.env_steps,
            "episodes": {"returns": list(self.episodes.returns),
                         "lengths": list(self.episodes.lengths),
                         "count": self.episodes.count},
            "rng": _rng_state(),
        }
        atomic_write(self.checkpoint_path, lambda f: torch.save(state, f))

    def _restore(self) -> None:
        path = self.checkpoint_path
        # Plain tensors and containers only (weights_only): loading runs no pickled code.
        # On the CPU first: RNG states must stay there; load_state_dict moves the rest.
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        if "algo" in state:
            self.algo.load_state_dict(state["algo"])
        else:  # a checkpoint from before algorithms had state_dict
            self.algo.optimizer.load_state_dict(state["optimizer"])
            self.log.warning("%s has no algorithm state; target network and counters "
                             "start afresh", path)
        self.updates = int(state["updates"])
        self.env_steps = int(state["env_steps"])
        episodes = state.get("episodes")
        if episodes:
            self.episodes.returns.extend(episodes["returns"])
            self.episodes.lengths.extend(episodes["lengths"])
            self.episodes.count = int(episodes["count"])
        if "rng" in state:
            _set_rng_state(state["rng"])
        self._rate_mark = (time.monotonic(), self.env_steps)
        self.log.info("resumed from %s at update %d", path, self.updates)

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


def _rng_state() -> dict[str, Any]:
    """torch's, numpy's global and Python's RNG states, as tensors and plain values (so
    the checkpoint loads with ``weights_only``)."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_values(msg: wire.Message, float_keys: tuple[str, ...], spec: Any) -> None:
    """Experience a learner can train on: finite floats (one NaN would poison every
    parameter, and the learner would publish them) and, for discrete actions, action
    indices the model has. Shapes are checked by the caller."""
    for key in float_keys:
        if msg[key].dtype.kind != "f" or not np.isfinite(msg[key]).all():
            raise wire.ProtocolError(f"'{key}' must be finite floats")
    action = msg["action"]
    if spec.num_actions is None:
        if action.dtype.kind != "f" or not np.isfinite(action).all():
            raise wire.ProtocolError("'action' must be finite floats (continuous actions)")
    elif action.dtype.kind not in "iu" or (action.size and (
            action.min() < 0 or action.max() >= spec.num_actions)):
        raise wire.ProtocolError(f"'action' must be integers in [0, {spec.num_actions})")
