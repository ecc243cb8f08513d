"""Actor: owns a vector of environments and steps them, one message per vector.

The node is a shell: envs, parameters and metrics. What it does with each step is one
of two drivers (``args.policy``):

* ``remote`` (SEED RL, A2C): :class:`zmqrl.parts.acting.remote.RemoteLanes` sends one
  ``step`` per vector of envs to the inference broker and applies the ``act`` reply;
  it never runs a model.
* ``local`` (IMPALA, A3C, Ape-X, Gorila, R2D2): :class:`zmqrl.parts.acting.local.LocalActing`
  acts with a local copy of the model, refreshed from the ``params`` link, through the
  behaviour the topology's parts name (``zmqrl.parts.acting.behaviour_for``) with one
  connection, and ships its items: to ``experience`` (a learner or replay) or, as
  gradients, to a ``param_server`` (A3C).

Box (continuous) actions are clipped to the bounds before the env sees them; what is
recorded is the policy's own sample (see ``zmqrl.parts.envs.env_action``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.bus import roles, wire
from zmqrl.bus.metrics import EpisodeStats
from zmqrl.bus.node import Link, Node
from zmqrl.parts.acting import EpisodeTracker, RewardScaler, apex_epsilon
from zmqrl.parts.acting.envs import behaviour_args
from zmqrl.parts.envs import env_action, env_spec, make_vector_env
from zmqrl.run.topology import NodeSpec, Topology


class Actor(Node):
    role = roles.ACTS
    links = {
        "policy": Link("dealer", required=False),
        "experience": Link("dealer", required=False, immediate=True),
        "params": Link("sub", required=False, hwm=4),
        "param_server": Link("dealer", required=False),
    }
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        envs: int = 8
        policy: str = "remote"  # remote | local
        request_timeout_s: float = 10.0
        epsilon: float | None = None  # Q-learning: fixed ε; default Ape-X's schedule over replicas
        epsilon_base: float = 0.4
        epsilon_alpha: float = 7.0
        # Arguments for the behaviour, by name: numbers or per-replica schedules
        # (zmqrl.parts.acting.envs.behaviour_args); each behaviour reads those it knows.
        behaviour_args: dict | None = None
        max_outbox: int = 2
        # Replay actors: transitions held back until this many go in one insert message
        # (Ape-X's local buffer): fewer, larger messages for the actor and the replay.
        insert_batch: int = 1
        # remote: split the envs into this many lanes, each with its own request in
        # flight, so stepping one lane overlaps the broker's inference for another.
        lanes: int = 1
        # ε-greedy actors whose ε is above this do not count their episodes toward the
        # run's return (the supervisor's mean of the last 100 episodes, --target-return):
        # Ape-X's high-ε actors would measure their exploration noise, not the policy.
        # None: every actor counts.
        report_max_epsilon: float | None = None
        # Scale rewards by a running std of the discounted return (MuJoCo PPO); the
        # reported episode returns stay raw.
        normalize_reward: bool = False

    @classmethod
    def largest_insert(cls, spec: NodeSpec, topo: Topology) -> int | None:
        """What its inserts gather: up to ``insert_batch - 1`` items held back, and one
        step's items of all its envs more (a local policy inserts them itself)."""
        try:
            args = cls.Args(**spec.args)
        except TypeError:
            return None  # its args' own errors are reported with them
        return max(0, int(args.insert_batch) - 1) + \
            int(args.envs) * topo.algo_config.items_per_env_step()

    @classmethod
    def runs_torch(cls, spec: NodeSpec) -> bool:
        return spec.args.get("policy", "remote") == "local"  # remote: the broker acts

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        """Which links a driver needs (checked by ``zmqrl validate``)."""
        try:
            behaviour_args(spec.args.get("behaviour_args"), 0, spec.replicas)
        except ValueError as exc:
            return [(("nodes", spec.name, "args", "behaviour_args"), str(exc))]
        policy = spec.args.get("policy", "remote")
        where = ("nodes", spec.name, "links")
        if spec.args.get("envs", 8) < 1:
            return [(("nodes", spec.name, "args", "envs"), "must be >= 1")]
        if spec.args.get("insert_batch", 1) < 1:
            return [(("nodes", spec.name, "args", "insert_batch"), "must be >= 1")]
        if not 1 <= spec.args.get("lanes", 1) <= spec.args.get("envs", 8):
            return [(("nodes", spec.name, "args", "lanes"), "must be between 1 and envs")]
        if policy not in _DRIVERS:
            return [(("nodes", spec.name, "args", "policy"),
                     f"'{policy}' is not {' or '.join(_DRIVERS)}")]
        if policy == "remote":
            return [] if "policy" in spec.links else [(where, "policy: remote needs a 'policy' "
                                                              "link (to an inference broker)")]
        if "experience" not in spec.links and "param_server" not in spec.links:
            return [(where, "policy: local needs an 'experience' link (learner or replay) or "
                            "a 'param_server' link (A3C worker)")]
        try:
            gradients = topo.parts_config.gradient_behaviour
        except (TypeError, ValueError):
            return []  # the algo section's own errors are reported with it
        if "param_server" in spec.links and gradients is None:
            return [(where, f"a 'param_server' worker needs an algo whose actors can ship "
                            f"gradients (a gradient_behaviour), not '{topo.algo_config.kind}'")]
        return []

    def setup(self) -> None:
        self.seed = self.ctx.topo.seed + 10_000 * (self.ctx.replica + 1)
        self.spec = env_spec(self.ctx.topo.env)
        self.env_steps = 0
        self.env_seconds = 0.0  # inside the envs' step (for env_cores)
        self._env_seconds_at = (0.0, time.monotonic())  # at the last metrics row
        self.version = 0
        self.returns = EpisodeStats(window=100)
        self.reports_returns = True
        self.reward_scalers: dict[int, RewardScaler] = {}  # per vector env
        self.envs: list[Any] = []
        self.driver = _DRIVERS[self.args.policy](self)

    def make_envs(self, n: int, seed: int) -> tuple[Any, np.ndarray, EpisodeTracker]:
        env = make_vector_env(self.ctx.topo.env, n, seed)
        self.envs.append(env)
        if self.args.normalize_reward:
            self.reward_scalers[id(env)] = RewardScaler(n, self.ctx.topo.algo_config.discount)
        obs, _ = env.reset(seed=seed)
        return env, obs.astype(self.spec.obs_dtype, copy=False), EpisodeTracker(n)

    def env_step(self, env: Any, episodes: EpisodeTracker,
                 action: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step ``env``: (obs, reward, terminated, truncated, info, returns, lengths),
        rewards scaled if asked, finished episodes counted and reported."""
        started = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(env_action(action, self.spec))
        self.env_seconds += time.perf_counter() - started
        self.env_steps += len(action)
        reward = reward.astype(np.float32, copy=False)
        returns, lengths = episodes.step(reward, terminated | truncated)
        if len(returns):  # this actor's own metrics; the run's return: see the drivers
            self.returns.add(returns, lengths)
        scaler = self.reward_scalers.get(id(env))
        if scaler is not None:
            reward = scaler(reward, terminated | truncated)
        return obs.astype(self.spec.obs_dtype, copy=False), reward, terminated, truncated, \
            info, returns, lengths

    def behaviour_args(self) -> dict[str, float]:
        """This replica's behaviour arguments (logged once)."""
        args = behaviour_args(self.args.behaviour_args, self.ctx.replica,
                              self.ctx.spec.replicas)
        if args:
            self.log.info("behaviour args %s", ", ".join(f"{k} {v:.4g}" for k, v in args.items()))
        return args

    def epsilon(self) -> float:
        """This actor's ε: ``epsilon`` if set, else Ape-X's schedule over the replicas;
        logged, and whether its episodes count toward the run's return is decided."""
        epsilon = self.args.epsilon
        if epsilon is None:
            epsilon = apex_epsilon(self.ctx.replica, self.ctx.spec.replicas,
                                   self.args.epsilon_base, self.args.epsilon_alpha)
        cap = self.args.report_max_epsilon
        self.reports_returns = cap is None or epsilon <= cap
        self.log.info("epsilon %.4f%s", epsilon,
                      "" if self.reports_returns else " (exploring: returns not reported)")
        return epsilon

    # ----- the runtime's hooks, handed to the driver -----------------------------------
    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        self.driver.load_params(msg)

    def on_param_server(self, _envelope: list, msg: wire.Message) -> None:
        self.driver.on_param_server(msg)

    def on_peer_silent(self, name: str) -> None:
        self.driver.on_peer_silent(name)

    def poll_timeout_ms(self) -> int:
        return self.driver.poll_timeout_ms()

    def after_poll(self) -> None:
        self.driver.after_poll()

    def teardown(self) -> None:
        for env in self.envs:
            env.close()

    def metrics(self) -> dict[str, Any]:
        # Seconds inside the envs' step per second: the share of cpu_cores that stepping
        # the envs takes (the rest is acting, messaging, and the I/O thread).
        (seconds, at), now = self._env_seconds_at, time.monotonic()
        env_cores = (self.env_seconds - seconds) / max(now - at, 1e-9)
        self._env_seconds_at = (self.env_seconds, now)
        return {"env_steps": self.env_steps, "param_version": self.version,
                "episodes": self.returns.count,
                "return_mean_100": round(self.returns.mean_return(), 2),
                "env_cores": round(env_cores, 3), **self.driver.metrics()}


def _remote(actor: Actor) -> Any:
    from zmqrl.parts.acting.remote import RemoteLanes  # no torch: a remote actor runs no model

    return RemoteLanes(actor)


def _local(actor: Actor) -> Any:
    from zmqrl.parts.acting.local import LocalActing

    return LocalActing(actor)


_DRIVERS = {"remote": _remote, "local": _local}
