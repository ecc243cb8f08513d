"""Actor: owns a vector of environments and steps them, one message per vector.

``policy: remote`` (SEED RL, A2C): sends one ``step`` message per vector of envs to the
inference broker on its ``policy`` link and applies the ``act`` reply; it never runs a
model. Each step carries the rewards and episode ends that the previous actions
produced, and the returns/lengths of episodes that just finished. If no reply comes
within ``request_timeout_s`` it reopens its socket (a new identity, so the broker drops
the old half-built unroll) and resends: the ZeroMQ Guide's Lazy Pirate.

``policy: local`` runs a local copy of the model (``zmqrl.acting``), refreshed from the
``params`` link, and ships what ``algo.kind`` learns from:

* actor-critic algorithms (vtrace, a2c): unrolls on ``experience`` (IMPALA); or, with a
  ``param_server`` link instead, the A3C worker: the gradients of each unroll go to the
  parameter server, whose reply carries fresh parameters.
* Q-learning (dqn): n-step transitions with initial priorities on ``experience`` (a
  replay node), ε-greedy with Ape-X's per-actor ε unless ``epsilon`` is set.
* recurrent Q-learning (r2d2): the same with a recurrent Q-network whose state is kept
  per env and reset at episode ends; fixed-length overlapping sequences with the state
  they started from and R2D2's mixed max/mean priorities go to the replay.

With a remote policy in a Q-learning topology (SEED's R2D2), the actor's ε (the same
schedule) travels in each ``step`` header, so the broker explores as this actor should.

Box (continuous) actions are clipped to the bounds before the env sees them; what is
recorded is the policy's own sample (see ``zmqrl.envs.env_action``).

A local actor stops stepping while its outbox is full: a slow consumer slows the actors
instead of growing memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zmqrl import wire
from zmqrl.acting import (
    ActorCriticBehaviour,
    EpisodeTracker,
    EpsilonGreedyBehaviour,
    RecurrentEpsilonGreedyBehaviour,
    RewardScaler,
    apex_epsilon,
)
from zmqrl.algos import REPLAY_ALGOS, SEQUENCE_ALGOS, UNROLL_ALGOS, make_algo, make_algo_config
from zmqrl.envs import env_action, env_spec, make_vector_env
from zmqrl.metrics import EpisodeStats, LatencyReservoir
from zmqrl.models import build_model, load_state_arrays, wants_params
from zmqrl.node import Link, Node, Outbox
from zmqrl.topology import NodeSpec, Topology


class Actor(Node):
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
        epsilon: float | None = None  # dqn: fixed ε; default Ape-X's schedule over replicas
        epsilon_base: float = 0.4
        epsilon_alpha: float = 7.0
        max_outbox: int = 2
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
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        """Which links a mode needs (checked by ``zmqrl validate``)."""
        policy = spec.args.get("policy", "remote")
        where = ("nodes", spec.name, "links")
        if spec.args.get("envs", 8) < 1:
            return [(("nodes", spec.name, "args", "envs"), "must be >= 1")]
        if not 1 <= spec.args.get("lanes", 1) <= spec.args.get("envs", 8):
            return [(("nodes", spec.name, "args", "lanes"), "must be between 1 and envs")]
        kind = topo.algo.get("kind", "vtrace")
        if policy == "remote":
            return [] if "policy" in spec.links else [(where, "policy: remote needs a 'policy' "
                                                              "link (to an inference broker)")]
        if policy != "local":
            return [(("nodes", spec.name, "args", "policy"),
                     f"'{policy}' is not remote or local")]
        if "experience" not in spec.links and "param_server" not in spec.links:
            return [(where, "policy: local needs an 'experience' link (learner or replay) or "
                            "a 'param_server' link (A3C worker)")]
        if "param_server" in spec.links and kind not in UNROLL_ALGOS:
            return [(where, f"a 'param_server' worker needs an actor-critic algo, not '{kind}'")]
        return []

    def setup(self) -> None:
        torch.set_num_threads(1)
        topo = self.ctx.topo
        self.seed = topo.seed + 10_000 * (self.ctx.replica + 1)
        self.spec = env_spec(topo.env)
        self.env_steps = 0
        self.version = 0
        self.params_source: Any = None  # incarnation of the publisher of our parameters
        self.returns = EpisodeStats(window=100)
        self.reports_returns = True
        self.reward_scalers: dict[int, RewardScaler] = {}  # per vector env
        if self.args.policy == "remote":
            self._setup_remote()
        elif self.args.policy == "local":
            self._setup_local()
        else:
            raise ValueError(f"actor policy '{self.args.policy}' is not supported "
                             "(use remote or local)")

    def _make_envs(self, n: int, seed: int) -> tuple[Any, np.ndarray, EpisodeTracker]:
        env = make_vector_env(self.ctx.topo.env, n, seed)
        if self.args.normalize_reward:
            self.reward_scalers[id(env)] = RewardScaler(
                n, float(self.ctx.topo.algo.get("discount", 0.99)))
        obs, _ = env.reset(seed=seed)
        return env, obs.astype(self.spec.obs_dtype, copy=False), EpisodeTracker(n)

    def teardown(self) -> None:
        for env in self.envs:
            env.close()

    def metrics(self) -> dict[str, Any]:
        row: dict[str, Any] = {"env_steps": self.env_steps, "param_version": self.version,
                               "episodes": self.returns.count,
                               "return_mean_100": round(self.returns.mean_return(), 2)}
        if self.args.policy == "remote":
            row["latency_p50_ms"], row["latency_p99_ms"] = self.latency.percentiles_ms()
        else:
            row["outbox"] = len(self.outbox) if self.outbox else 0
        return row

    def _env_step(self, env: Any, episodes: EpisodeTracker,
                  action: np.ndarray) -> tuple[np.ndarray, ...]:
        obs, reward, terminated, truncated, info = env.step(env_action(action, self.spec))
        self.env_steps += len(action)
        reward = reward.astype(np.float32, copy=False)
        returns, lengths = episodes.step(reward, terminated | truncated)
        if len(returns):
            self.returns.add(returns, lengths)
            if self.reports_returns:
                self.episode_log.extend(returns.tolist())
        scaler = self.reward_scalers.get(id(env))
        if scaler is not None:
            reward = scaler(reward, terminated | truncated)
        return obs.astype(self.spec.obs_dtype, copy=False), reward, terminated, truncated, \
            info, returns, lengths

    # ----- remote policy (SEED) -----------------------------------------------------
    def _epsilon(self) -> float:
        """This actor's ε: ``epsilon`` if set, else Ape-X's schedule over the replicas."""
        if self.args.epsilon is not None:
            return self.args.epsilon
        return apex_epsilon(self.ctx.replica, self.ctx.spec.replicas,
                            self.args.epsilon_base, self.args.epsilon_alpha)

    def _explores(self, epsilon: float) -> None:
        cap = self.args.report_max_epsilon
        self.reports_returns = cap is None or epsilon <= cap
        self.log.info("epsilon %.4f%s", epsilon,
                      "" if self.reports_returns else " (exploring: returns not reported)")

    def _setup_remote(self) -> None:
        self.latency = LatencyReservoir()
        self.step_fields: dict[str, Any] = {}
        if self.ctx.topo.algo.get("kind", "vtrace") in REPLAY_ALGOS:
            self.step_fields["epsilon"] = self._epsilon()
            self._explores(self.step_fields["epsilon"])
        self.lanes = []
        sizes = np.array_split(np.arange(self.args.envs), self.args.lanes)
        for i, envs in enumerate(sizes):
            # Lane 0 uses the 'policy' socket; each further lane gets its own connection,
            # which the broker sees as one more actor.
            socket = "policy" if i == 0 else self.open_link("policy", f"policy_{i}")
            env, obs, episodes = self._make_envs(len(envs), self.seed + 1000 * i)
            lane = _Lane(socket, env, episodes, obs, len(envs), self.spec)
            self.lanes.append(lane)
            self.set_handler(socket, lambda envelope, msg, lane=lane: self._on_act(lane, msg))
        self.envs = [lane.env for lane in self.lanes]
        for lane in self.lanes:
            self._send_step(lane)

    def _send_step(self, lane: _Lane) -> None:
        lane.seq += 1
        arrays = {"obs": lane.obs, "reward": lane.reward, "done": lane.done}
        # The optional arrays only when they say something: each costs encode/decode time.
        if lane.truncated.any():
            arrays["truncated"], arrays["final_obs"] = lane.truncated, lane.final_obs
        if len(lane.finished[0]):
            arrays["ep_return"], arrays["ep_length"] = lane.finished
        frames = wire.encode(wire.STEP, arrays, seq=lane.seq, **self.step_fields)
        lane.sent_at = time.perf_counter()
        self.send(lane.socket, frames)

    def _resend(self, lane: _Lane) -> None:
        """Lazy Pirate: a fresh socket (a new identity: the broker drops our half-built
        trajectory) and the current observations again."""
        self.reopen(lane.socket)
        lane.reward[:] = 0.0  # the lost step's outcome has no unroll to go to
        self._send_step(lane)

    def on_peer_silent(self, name: str) -> None:
        """The broker or parameter server stopped answering even pings: reconnect and
        resend now rather than at the request timeout."""
        if self.args.policy == "remote":
            for lane in self.lanes:
                if lane.socket == name:
                    self._resend(lane)
        elif name == "param_server" and self.awaiting_params:
            self.reopen(name)
            self.awaiting_params = False  # that gradient is lost; the next one goes out

    def _on_act(self, lane: _Lane, msg: wire.Message) -> None:
        self.expect_reply(msg, wire.ACT, "the policy")
        if msg.fields.get("seq") != lane.seq:
            return  # a late reply to a request we already gave up on
        self.latency.add(time.perf_counter() - lane.sent_at)
        actions = msg.arrays.get("action")
        if actions is None or actions.shape[:1] != (lane.n,):
            raise wire.ProtocolError(f"act needs 'action' for {lane.n} envs")
        lane.obs, lane.reward, terminated, truncated, info, *lane.finished = \
            self._env_step(lane.env, lane.episodes, actions)
        lane.done = terminated | truncated
        lane.truncated = truncated & ~terminated
        lane.final_obs = _final_obs(info, lane.truncated, self.spec.obs_shape,
                                    self.spec.obs_dtype)
        self._send_step(lane)

    # ----- local policy (IMPALA, A3C, Ape-X, Gorila) --------------------------------
    def _setup_local(self) -> None:
        topo, n = self.ctx.topo, self.args.envs
        self.env, self.obs, self.episodes = self._make_envs(n, self.seed)
        self.envs = [self.env]
        kind = topo.algo.get("kind", "vtrace")
        self.model = build_model(topo.model, self.spec, topo.seed)
        self.model.eval()
        self.outbox = Outbox(self, "experience", self.args.max_outbox) \
            if "experience" in self.sockets else None
        self.awaiting_params = False
        self.pending_returns: list[np.ndarray] = []
        self.pending_lengths: list[np.ndarray] = []
        if kind in UNROLL_ALGOS:
            cfg = topo.algo_config
            self.behaviour: Any = ActorCriticBehaviour(
                self.spec, self.model, cfg.unroll, n, cfg.discount, cfg.reward_scale)
            if "param_server" in self.sockets:  # A3C worker: gradients, not experience
                self.worker = make_algo(topo.algo, self.model)
        elif kind in SEQUENCE_ALGOS:
            epsilon = self._epsilon()
            self.behaviour = RecurrentEpsilonGreedyBehaviour(
                self.spec, self.model, epsilon, make_algo_config(topo.algo), n, self.seed)
            self._explores(epsilon)
        elif kind in REPLAY_ALGOS:
            epsilon = self._epsilon()
            self.behaviour = EpsilonGreedyBehaviour(
                self.spec, self.model, epsilon, int(topo.algo.get("n_step", 3)),
                float(topo.algo.get("discount", 0.99)), n, self.seed)
            self._explores(epsilon)
        else:
            raise ValueError(f"no local behaviour for algo.kind '{kind}'")
        self.ships_items = kind in REPLAY_ALGOS  # replay inserts rather than unrolls

    def poll_timeout_ms(self) -> int:
        if self.args.policy == "local" and not self._blocked():
            return 0  # keep stepping; just look for parameter updates on the way
        return 100

    def _blocked(self) -> bool:
        return self.awaiting_params or (self.outbox is not None and self.outbox.full)

    on_experience = Node.on_producer_reply

    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        self._load_params(msg)

    def on_param_server(self, _envelope: list, msg: wire.Message) -> None:
        self.expect_reply(msg, wire.PARAMS, "the parameter server")
        self._load_params(msg)
        self.awaiting_params = False

    def _load_params(self, msg: wire.Message) -> None:
        version, source = msg.fields.get("version"), msg.fields.get("source")
        if type(version) is not int or not wants_params(version, source, self.version,
                                                        self.params_source):
            return
        try:
            load_state_arrays(self.model, msg.arrays)
        except (RuntimeError, KeyError, ValueError) as exc:  # keep acting with what we have
            self.bad_messages += 1
            self.log.error("rejected params version %d: %s", version, exc)
            return
        self.version, self.params_source = version, source

    def after_poll(self) -> None:
        if self.args.policy == "remote":
            for lane in self.lanes:
                if time.perf_counter() - lane.sent_at > self.args.request_timeout_s:
                    self.log.warning("no reply in %.1fs; reconnecting and resending",
                                     self.args.request_timeout_s)
                    self._resend(lane)
            return
        if self.outbox is not None:
            self.outbox.flush()
        if self.awaiting_params and time.perf_counter() - self.sent_at > \
                self.args.request_timeout_s:
            self.log.warning("no reply from the parameter server in %.1fs; reconnecting",
                             self.args.request_timeout_s)
            self.reopen("param_server")
            self.awaiting_params = False  # that gradient is lost; the next one goes out
        if not self._blocked():
            self._local_step()

    def _local_step(self) -> None:
        obs = self.obs
        action, unroll = self.behaviour.act(obs, self.version)
        if unroll is not None:
            self._ship_unroll(unroll)
        next_obs, reward, terminated, truncated, info, returns, lengths = \
            self._env_step(self.env, self.episodes, action)
        if len(returns):
            self.pending_returns.append(returns)
            self.pending_lengths.append(lengths)
        final_next = next_obs
        ended = terminated | truncated
        if ended.any():  # transitions that ended bootstrap from the final observation
            final_next = next_obs.copy()
            final_next[ended] = _final_obs(info, ended, self.spec.obs_shape,
                                           self.spec.obs_dtype)
        self.behaviour.outcome(obs, action, reward, terminated, truncated, final_next)
        self.obs = next_obs
        if self.ships_items:
            items = self.behaviour.take()
            if items is not None:
                self.outbox.push(wire.encode(wire.INSERT, items, version=self.version))

    def _ship_unroll(self, unroll: dict[str, Any]) -> None:
        version = unroll.pop("version")
        if self.pending_returns:
            unroll["ep_return"] = np.concatenate(self.pending_returns)
            unroll["ep_length"] = np.concatenate(self.pending_lengths)
            self.pending_returns, self.pending_lengths = [], []
        if self.outbox is not None:
            self.outbox.push(wire.encode(wire.UNROLL, unroll, version=version))
            return
        # (an lstm_ac worker's unrolls also carry state_h/state_c)
        batch = {k: torch.from_numpy(v) for k, v in unroll.items()
                 if k not in ("ep_return", "ep_length")}
        grads, _ = self.worker.gradients(batch)
        names = [name for name, p in self.model.named_parameters() if p.requires_grad]
        arrays = {name: g.numpy() for name, g in zip(names, grads, strict=True)}
        env_steps = int(unroll["action"].shape[0] * unroll["action"].shape[1])
        self.send("param_server", wire.encode(wire.GRADS, arrays, version=self.version,
                                              env_steps=env_steps))
        self.sent_at = time.perf_counter()
        self.awaiting_params = True


def _final_obs(info: dict, mask: np.ndarray, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The final observations of the envs in ``mask`` (SAME_STEP autoreset puts them in
    ``info["final_obs"]``, since the returned observation already starts a new episode)."""
    rows = [info["final_obs"][i] for i in np.flatnonzero(mask)]
    return np.asarray(rows, dtype).reshape(len(rows), *shape)


class _Lane:
    """One group of a remote actor's envs with its own connection and request."""

    def __init__(self, socket: str, env: Any, episodes: EpisodeTracker, obs: np.ndarray,
                 n: int, spec: Any):
        self.socket, self.env, self.episodes, self.obs, self.n = socket, env, episodes, obs, n
        self.reward = np.zeros(n, np.float32)
        self.done = np.zeros(n, np.bool_)
        self.truncated = np.zeros(n, np.bool_)
        self.final_obs = np.zeros((0, *spec.obs_shape), spec.obs_dtype)
        self.finished = [np.empty(0, np.float32), np.empty(0, np.int32)]
        self.seq = 0
        self.sent_at = time.perf_counter()
