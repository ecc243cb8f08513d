"""Inference broker (SEED RL): batches every actor's observations through one model.

Each loop turn it takes every ``step`` request that has arrived (never waiting for more
unless ``max_wait_ms`` says so: waiting was the slowest policy measured), runs the
model once per batch of up to ``max_batch`` envs, and replies ``act`` to each actor.
It also keeps, per actor connection, the trajectory of its envs and ships every
``unroll`` steps a time-major block (observations, actions, behaviour log-probs,
rewards, dones, and the episodes that finished) to the learner, and loads the newest
parameters the learner publishes.

Recurrent Q-learning (``algo.kind: r2d2``, SEED's R2D2): the broker keeps each actor
connection's recurrent state per env, resets it at episode ends, acts ε-greedy with
the ε the actor sends in its ``step`` header (``epsilon`` arg when it sends none) and
ships overlapping sequences with their stored state and initial priorities as
``insert`` messages to a replay on the ``experience`` link, instead of unrolls.

Backpressure: if the learner stops taking unrolls, they wait in a small outbox; once
that holds ``max_outbox`` unrolls the broker stops reading actor requests, so actors
block instead of memory growing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from zmqrl import wire
from zmqrl.algos import SEQUENCE_ALGOS, make_algo_config
from zmqrl.envs import env_spec
from zmqrl.metrics import LatencyReservoir
from zmqrl.models import (
    bootstrap_truncated,
    build_model,
    load_state_arrays,
    pick_device,
    wants_params,
)
from zmqrl.node import Link, Node, Outbox
from zmqrl.sequences import RecurrentEnvs
from zmqrl.topology import NodeSpec, Topology
from zmqrl.unroll import PolicyState, UnrollBuilder, act_recurrent


class InferenceBroker(Node):
    binds = {"policy": "router"}
    # Unrolls go out under the learner's credit (see Outbox); IMMEDIATE keeps them here,
    # not in a ZeroMQ queue, while no learner is connected.
    links = {"params": Link("sub", required=False, hwm=4),
             "experience": Link("dealer", required=False, immediate=True)}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        max_batch: int = 1024  # envs per forward pass
        max_wait_ms: float = 0.0  # >0: wait this long for a fuller batch
        # sync (A2C / Accel RL): wait until every actor linked to us has a request in,
        # or ``sync_timeout_ms`` passed (a dead actor must not stall the others).
        mode: str = "dynamic"  # dynamic | sync
        sync_timeout_ms: float = 1000.0
        device: str = "auto"
        unroll: int | None = None  # default: algo.unroll
        max_outbox: int = 2  # unrolls waiting for credit before the actors are paused
        client_timeout_s: float = 60.0  # forget a silent actor's half-built unroll
        epsilon: float = 0.01  # r2d2: ε for actors whose steps carry none

    def setup(self) -> None:
        torch.set_num_threads(1)
        self.spec = env_spec(self.ctx.topo.env)
        self.device = pick_device(self.args.device)
        self.model = build_model(self.ctx.topo.model, self.spec, self.ctx.topo.seed).to(self.device)
        self.model.eval()
        cfg = self.ctx.topo.algo_config
        self.unroll = self.args.unroll or getattr(cfg, "unroll", 0)
        self.discount = cfg.discount
        self.reward_scale = getattr(cfg, "reward_scale", 1.0)
        self.sync = self.args.mode == "sync"
        self.awaiting_version = 0
        self.expected_actors = self._expected_actors()
        self.version = 0
        self.params_source: object = None  # incarnation of the publisher of our parameters
        self._latest_params: wire.Message | None = None
        self.pending: list[tuple[list, wire.Message]] = []
        self.pending_keys: set[bytes] = set()  # connections with a step in self.pending
        self.pending_envs = 0
        self.first_pending_at = 0.0
        self.unrolls: dict[bytes, UnrollBuilder] = {}  # per actor connection
        # r2d2: recurrent Q acting and sequences for a replay, instead of unrolls
        self.q_sequences = self.ctx.topo.algo.get("kind", "vtrace") in SEQUENCE_ALGOS
        # a recurrent actor-critic (lstm_ac): an LSTM state per env, carried by unrolls
        self.recurrent_policy = getattr(self.model, "recurrent", False) and not self.q_sequences
        self.policy_states: dict[bytes, PolicyState] = {}  # per actor connection
        if self.q_sequences:
            self.r2d2 = make_algo_config(self.ctx.topo.algo)
        self.groups: dict[bytes, RecurrentEnvs] = {}  # r2d2: per actor connection
        self.last_seen: dict[bytes, float] = {}
        self.outbox = Outbox(self, "experience", self.args.max_outbox)
        self._blocked = False
        self.pauses = 0  # times the learner's backpressure paused the actors
        self.episodes_returns: list[np.ndarray] = []
        self.episodes_lengths: list[np.ndarray] = []
        self.ship = "experience" in self.sockets
        self.env_steps = 0
        self.batches = 0
        self.batch_envs = 0
        self.latency = LatencyReservoir()
        self.every(5.0, self._forget_silent_actors)
        self.log.info("model on %s, unroll %d", self.device, self.unroll)

    # ----- requests -----------------------------------------------------------------
    def on_policy(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.STEP:
            raise wire.ProtocolError(f"policy port takes '{wire.STEP}', not '{msg.type}'")
        obs = msg.arrays.get("obs")
        if obs is None or obs.shape[1:] != self.spec.obs_shape or obs.shape[0] < 1:
            shape = None if obs is None else obs.shape
            raise wire.ProtocolError(
                f"step needs 'obs' of shape [n, {', '.join(map(str, self.spec.obs_shape))}], "
                f"got {shape}"
            )
        if obs.dtype != self.spec.obs_dtype:
            raise wire.ProtocolError(f"step 'obs' must be {self.spec.obs_dtype}, got {obs.dtype}")
        n = obs.shape[0]
        for key in ("reward", "done"):
            if key not in msg.arrays or msg.arrays[key].shape != (n,):
                raise wire.ProtocolError(f"step needs '{key}' of shape [{n}]")
        # NaN or inf would break the model for every actor in the batch, and poison the
        # learner through the unroll.
        if not (np.isfinite(obs).all() and np.isfinite(msg["reward"]).all()):
            raise wire.ProtocolError("step 'obs' and 'reward' must be finite")
        key = self._key(envelope)
        if key in self.pending_keys:
            raise wire.ProtocolError("a step is already outstanding on this connection "
                                     "(at most one at a time)")
        truncated, final_obs = msg.arrays.get("truncated"), msg.arrays.get("final_obs")
        if (truncated is None) != (final_obs is None) or truncated is not None and (
                truncated.shape != (n,) or truncated.dtype != np.bool_
                or final_obs.shape != (int(truncated.sum()), *self.spec.obs_shape)
                or final_obs.dtype != self.spec.obs_dtype
                or not np.isfinite(final_obs).all()):
            raise wire.ProtocolError("'truncated' (bool [n]) and 'final_obs' (one finite "
                                     f"{self.spec.obs_dtype} observation per truncated env) "
                                     "must come together")
        returns, lengths = msg.arrays.get("ep_return"), msg.arrays.get("ep_length")
        if (returns is None) != (lengths is None) or (
                returns is not None and (returns.ndim != 1 or returns.shape != lengths.shape)):
            raise wire.ProtocolError("'ep_return' and 'ep_length' must come together, same length")
        if self.q_sequences:
            self._record_sequence_outcome(envelope, msg)
        elif self.ship:
            # Outcomes are recorded on arrival, so a rollout that this request completes
            # ships before we act on it (in sync mode: before we wait for new params).
            self._record_outcome(envelope, msg)
        elif self.recurrent_policy:  # nothing to ship, but memories still end with episodes
            self._policy_state(envelope, n).end_episodes(msg["done"])
        if not self.pending:
            self.first_pending_at = time.perf_counter()
        self.pending.append((envelope, msg))
        self.pending_keys.add(key)
        self.pending_envs += n

    on_experience = Node.on_producer_reply

    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        self._latest_params = msg  # only the newest is loaded, once per loop turn

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        mode = spec.args.get("mode", "dynamic")
        if mode not in ("dynamic", "sync"):
            return [(("nodes", spec.name, "args", "mode"), f"'{mode}' is not dynamic or sync")]
        return []

    def _expected_actors(self) -> int:
        """Actor processes whose policy link points at our port (sync mode)."""
        target = f"{self.ctx.spec.name}.policy"
        linked = sum(s.replicas for s in self.ctx.topo.nodes.values()
                     if target in s.links.values())
        return max(1, linked // self.ctx.spec.replicas)

    def _wait_budget_ms(self) -> float:
        return self.args.sync_timeout_ms if self.sync else self.args.max_wait_ms

    def _batch_ready(self) -> bool:
        if self.sync:
            return len(self.pending) >= self.expected_actors and not self._stale_params()
        return self.pending_envs >= self.args.max_batch

    def _stale_params(self) -> bool:
        """Sync mode: after shipping a rollout, act again only with the parameters the
        learner made from it (strictly on-policy A2C). A learner that never answers
        costs ``sync_timeout_ms`` per step, not a deadlock."""
        return self.version < self.awaiting_version

    def poll_timeout_ms(self) -> int:
        if self.pending and self._wait_budget_ms() > 0:
            waited = (time.perf_counter() - self.first_pending_at) * 1e3
            return max(0, int(self._wait_budget_ms() - waited))
        return 100

    def after_poll(self) -> None:
        self._load_params()
        self.outbox.flush()
        self._update_backpressure()
        if not self.pending:
            return
        waited_ms = (time.perf_counter() - self.first_pending_at) * 1e3
        if not self._batch_ready() and waited_ms < self._wait_budget_ms():
            return
        while self.pending:
            batch, envs = [], 0
            while self.pending and (not batch or envs + self.pending[0][1]["obs"].shape[0]
                                    <= self.args.max_batch):
                batch.append(self.pending.pop(0))
                envs += batch[-1][1]["obs"].shape[0]
            self._serve(batch, envs)
        self.pending_envs = 0
        self.pending_keys.clear()

    def _serve(self, batch: list[tuple[list, wire.Message]], envs: int) -> None:
        # One copy either way: frames are read-only and torch wants writable memory.
        if len(batch) > 1:
            obs = np.concatenate([m["obs"] for _, m in batch])
        else:
            obs = batch[0][1]["obs"].copy()
        used_states: list = [None] * len(batch)
        if self.q_sequences:
            action = self._act_recurrent(batch, obs)
            logp = np.zeros(len(action), np.float32)
        elif self.recurrent_policy:
            states = [self._policy_state(envelope, m["obs"].shape[0]) for envelope, m in batch]
            action, logp, used_states = act_recurrent(self.model, obs, states)
            action = action.astype(self.spec.action_dtype, copy=False)
        else:
            action, logp = self.model.act(torch.from_numpy(obs).to(self.device))
            action = action.cpu().numpy().astype(self.spec.action_dtype, copy=False)
            logp = logp.cpu().numpy()
        now = time.perf_counter()
        start = 0
        for (envelope, msg), used in zip(batch, used_states, strict=True):
            n = msg["obs"].shape[0]
            a, lp = action[start:start + n], logp[start:start + n]
            start += n
            self.send("policy", wire.encode(wire.ACT, {"action": a}, seq=msg.fields.get("seq")),
                      envelope)
            self.latency.add(now - self.first_pending_at)
            if self.ship and not self.q_sequences:
                self._record_action(envelope, a, lp, used)
        self.env_steps += envs
        self.batches += 1
        self.batch_envs += envs

    # ----- unroll assembly ----------------------------------------------------------
    @staticmethod
    def _key(envelope: list) -> bytes:
        return b"".join(bytes(f) for f in envelope)

    def _record_outcome(self, envelope: list, msg: wire.Message) -> None:
        key = self._key(envelope)
        n = msg["obs"].shape[0]
        builder = self.unrolls.get(key)
        if builder is None or builder.n != n:
            state_size = self.model.state_size if self.recurrent_policy else 0
            builder = self.unrolls[key] = UnrollBuilder(self.spec, self.unroll, n, state_size)
        self.last_seen[key] = time.monotonic()
        reward = msg["reward"]
        truncated, final_obs = msg.arrays.get("truncated"), msg.arrays.get("final_obs")
        state = self._policy_state(envelope, n) if self.recurrent_policy else None
        if truncated is not None and final_obs is not None and truncated.any():
            if state is None:
                reward = bootstrap_truncated(reward, truncated, final_obs, self.model,
                                             self.discount, self.reward_scale)
            else:  # V(final obs) continues the env's memory
                reward = np.array(reward, np.float32)
                reward[truncated] += self.discount * state.values_after(
                    self.model, final_obs, truncated) / self.reward_scale
        if state is not None:
            state.end_episodes(msg["done"])
        builder.outcome(reward, msg["done"])
        returns = msg.arrays.get("ep_return")
        if returns is not None and returns.size:
            self.episodes_returns.append(returns.astype(np.float32))
            self.episodes_lengths.append(msg["ep_length"].astype(np.int32))
        finished = builder.observe(msg["obs"])
        if finished is not None:
            self._ship(*finished)

    def _record_action(self, envelope: list, action: np.ndarray, logp: np.ndarray,
                       state: tuple | None = None) -> None:
        builder = self.unrolls.get(self._key(envelope))
        if builder is not None:  # None: forgotten as silent meanwhile
            builder.act(action, logp, self.version, state)

    def _policy_state(self, envelope: list, n: int) -> PolicyState:
        key = self._key(envelope)
        state = self.policy_states.get(key)
        if state is None or state.n != n:  # a new connection starts from zero states
            state = self.policy_states[key] = PolicyState(n, self.model.state_size)
        return state

    def _ship(self, unroll: dict[str, np.ndarray], version: int) -> None:
        if self.episodes_returns:
            unroll["ep_return"] = np.concatenate(self.episodes_returns)
            unroll["ep_length"] = np.concatenate(self.episodes_lengths)
            self.episodes_returns, self.episodes_lengths = [], []
        self.outbox.push(wire.encode(wire.UNROLL, unroll, version=version))
        self._update_backpressure()
        if self.sync and "params" in self.sockets:
            self.awaiting_version = self.version + 1

    def _update_backpressure(self) -> None:
        blocked = self.outbox.full
        if blocked != self._blocked:
            self._blocked = blocked
            self.set_polling("policy", not blocked)
            self.pauses += blocked  # normal flow control, so a metric rather than a log line

    def _load_params(self) -> None:
        msg, self._latest_params = self._latest_params, None
        if msg is None:
            return
        version = msg.fields.get("version")
        if type(version) is not int:
            self.bad_messages += 1
            self.log.error("rejected params: version %r is not an integer", version)
            return
        source = msg.fields.get("source")
        if not wants_params(version, source, self.version, self.params_source):
            return
        try:
            load_state_arrays(self.model, msg.arrays)
        except (RuntimeError, KeyError) as exc:
            self.bad_messages += 1
            self.log.error("rejected params version %d: %s", version, exc)
            return
        if version < self.version:  # a restarted learner: do not wait for versions it lost
            self.awaiting_version = min(self.awaiting_version, version)
        self.version, self.params_source = version, source

    def _forget_silent_actors(self) -> None:
        cutoff = time.monotonic() - self.args.client_timeout_s
        for key in [k for k, seen in self.last_seen.items() if seen < cutoff]:
            self.unrolls.pop(key, None)
            self.groups.pop(key, None)
            self.policy_states.pop(key, None)
            del self.last_seen[key]

    # ----- recurrent state and sequences (r2d2) ---------------------------------------
    def _record_sequence_outcome(self, envelope: list, msg: wire.Message) -> None:
        key = self._key(envelope)
        n = msg["obs"].shape[0]
        epsilon = msg.fields.get("epsilon", self.args.epsilon)
        if type(epsilon) not in (int, float) or not 0.0 <= epsilon <= 1.0:
            raise wire.ProtocolError(f"step 'epsilon' must be a number in [0, 1], "
                                     f"got {epsilon!r}")
        self.last_seen[key] = time.monotonic()
        group = self.groups.get(key)
        if group is None or group.n != n:
            # A new connection: its first step has no earlier action to record.
            self.groups[key] = RecurrentEnvs(self.spec, self.r2d2, n, self.model.state_size,
                                             epsilon, self.ctx.topo.seed + len(self.groups))
            return
        group.epsilon = epsilon
        reward = msg["reward"]
        truncated = msg.arrays.get("truncated")
        if truncated is not None:
            reward = group.bootstrap_truncated(self.model, reward, truncated, msg["final_obs"])
        sequences = group.outcome(reward, msg["done"])
        if sequences is not None and self.ship:
            self.outbox.push(wire.encode(wire.INSERT, sequences, version=self.version))
            self._update_backpressure()

    def _act_recurrent(self, batch: list[tuple[list, wire.Message]],
                       obs: np.ndarray) -> np.ndarray:
        """One forward pass for every connection's envs, each from its own state."""
        groups = [self.groups[self._key(envelope)] for envelope, _ in batch]
        first, h, c = (torch.from_numpy(np.concatenate(parts)).to(self.device)
                       for parts in zip(*(g.inputs() for g in groups), strict=True))
        q, (h2, c2) = self.model.step(torch.from_numpy(obs).to(self.device), first, (h, c))
        q, h2, c2 = q.cpu().numpy(), h2.cpu().numpy(), c2.cpu().numpy()
        actions, start = [], 0
        for group, (_, msg) in zip(groups, batch, strict=True):
            end = start + group.n
            actions.append(group.record(msg["obs"], q[start:end], h2[start:end],
                                        c2[start:end]))
            start = end
        return np.concatenate(actions)

    def metrics(self) -> dict:
        p50, p99 = self.latency.percentiles_ms()
        row = {
            "env_steps": self.env_steps,
            "param_version": self.version,
            "batches": self.batches,
            "batch_envs_mean": round(self.batch_envs / self.batches, 2) if self.batches else 0,
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "outbox": len(self.outbox),
            "backpressure_pauses": self.pauses,
            "actors": len(self.groups if self.q_sequences else self.unrolls),
        }
        self.batch_envs = self.batches = 0
        return row
