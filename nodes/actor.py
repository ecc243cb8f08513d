"""Actor: owns a vector of environments and steps them with actions from its policy link.

In ``remote`` mode (SEED RL) it sends one ``step`` message per vector of envs to the
inference broker and applies the ``act`` reply; it never runs a model. Each step
message carries the rewards and episode ends that the previous actions produced, and
the returns and lengths of episodes that just finished.

If a reply does not come within ``request_timeout_s`` the actor assumes the request or
the broker was lost, reopens its socket (a new identity, so the broker drops the old
half-built unroll) and resends: the Lazy Pirate pattern of the ZeroMQ Guide.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from zmqrl import wire
from zmqrl.envs import env_spec, make_vector_env
from zmqrl.metrics import LatencyReservoir
from zmqrl.node import Link, Node


class Actor(Node):
    links = {"policy": Link("dealer")}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        envs: int = 8
        policy: str = "remote"
        request_timeout_s: float = 10.0

    def setup(self) -> None:
        if self.args.policy != "remote":
            raise ValueError(f"actor policy '{self.args.policy}' is not supported (use remote)")
        if self.args.envs < 1:
            raise ValueError(f"actor envs must be >= 1, got {self.args.envs}")
        n = self.args.envs
        seed = self.ctx.topo.seed + 10_000 * (self.ctx.replica + 1)
        self.spec = env_spec(self.ctx.topo.env)
        self.env = make_vector_env(self.ctx.topo.env, n, seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.reward = np.zeros(n, np.float32)
        self.done = np.zeros(n, np.bool_)
        self.ep_return = np.zeros(n, np.float64)
        self.ep_length = np.zeros(n, np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.seq = 0
        self.env_steps = 0
        self.latency = LatencyReservoir()
        self._send_step()

    def _send_step(self) -> None:
        self.seq += 1
        frames = wire.encode(
            wire.STEP,
            {
                "obs": self.obs.astype(self.spec.obs_dtype, copy=False),
                "reward": self.reward,
                "done": self.done,
                "ep_return": np.asarray(self.finished_returns, np.float32),
                "ep_length": np.asarray(self.finished_lengths, np.int32),
            },
            seq=self.seq,
        )
        self.finished_returns.clear()
        self.finished_lengths.clear()
        self._last_frames = frames
        self.sent_at = time.perf_counter()
        self.send("policy", frames)

    def on_policy(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type == wire.ERROR:
            raise RuntimeError(f"policy rejected our step: {msg.fields.get('error')}")
        if msg.type != wire.ACT:
            raise wire.ProtocolError(f"expected '{wire.ACT}', got '{msg.type}'")
        if msg.fields.get("seq") != self.seq:
            return  # a late reply to a request we already gave up on
        self.latency.add(time.perf_counter() - self.sent_at)
        actions = msg["action"]
        if actions.shape[0] != self.args.envs:
            raise wire.ProtocolError(f"got {actions.shape[0]} actions for {self.args.envs} envs")
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        self.env_steps += self.args.envs
        self.obs = obs
        self.reward = reward.astype(np.float32, copy=False)
        self.done = terminated | truncated
        self.ep_return += reward
        self.ep_length += 1
        if self.done.any():
            ended = np.flatnonzero(self.done)
            self.finished_returns.extend(self.ep_return[ended].tolist())
            self.finished_lengths.extend(self.ep_length[ended].tolist())
            self.episode_log.extend(self.ep_return[ended].tolist())
            self.ep_return[ended] = 0.0
            self.ep_length[ended] = 0
        self._send_step()

    def after_poll(self) -> None:
        if time.perf_counter() - self.sent_at > self.args.request_timeout_s:
            self.log.warning("no reply in %.1fs; reconnecting and resending",
                             self.args.request_timeout_s)
            self.reopen("policy")
            # Rewards of the lost step would be credited to the wrong unroll: start clean.
            self.reward[:] = 0.0
            self._send_step()

    def metrics(self) -> dict:
        p50, p99 = self.latency.percentiles_ms()
        return {"env_steps": self.env_steps, "latency_p50_ms": p50, "latency_p99_ms": p99}

    def teardown(self) -> None:
        self.env.close()
