"""A remote actor's driver (SEED RL, A2C): step the envs, let the inference broker act.

The envs are split into ``lanes``, each with its own connection to the broker and one
request in flight, so stepping one lane overlaps the broker's inference for another.
Each ``step`` carries the observations, the rewards and episode ends the previous
actions produced, the final observations of episodes a time limit cut, and the
returns/lengths of episodes that just finished (and, in a Q-learning topology, this
actor's ε). If no reply comes within ``request_timeout_s`` it reopens its socket (a new
identity, so the broker drops the old half-built trajectory) and resends: the ZeroMQ
Guide's Lazy Pirate.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from zmqrl.bus import wire
from zmqrl.bus.metrics import LatencyReservoir
from zmqrl.parts.acting.envs import EpisodeTracker, final_obs

# Seconds before asking again when the broker answers error with retry (it is full).
RETRY_S = 1.0


class Lane:
    """One group of a remote actor's envs with its own connection and request."""

    def __init__(self, socket: str, env: Any, episodes: EpisodeTracker, obs: np.ndarray,
                 spec: Any):
        self.socket, self.env, self.episodes, self.obs = socket, env, episodes, obs
        self.n = n = len(obs)
        self.reward = np.zeros(n, np.float32)
        self.done = np.zeros(n, np.bool_)
        self.truncated = np.zeros(n, np.bool_)
        self.final_obs = np.zeros((0, *spec.obs_shape), spec.obs_dtype)
        self.finished = [np.empty(0, np.float32), np.empty(0, np.int32)]
        self.seq = 0
        self.sent_at = time.perf_counter()


class RemoteLanes:
    def __init__(self, actor: Any):
        self.actor = actor
        self.latency = LatencyReservoir()
        # The broker explores with our ε, as a local actor of ours would. Sent whatever
        # the behaviour (a remote actor runs no model and does not import one): a
        # behaviour that does not explore by ε ignores it.
        self.step_fields: dict[str, Any] = {"epsilon": actor.epsilon()}
        args = actor.behaviour_args()
        if args:  # the broker's behaviour for our connection reads them (observe)
            self.step_fields["args"] = args
        self.lanes: list[Lane] = []
        sizes = np.array_split(np.arange(actor.args.envs), actor.args.lanes)
        for i, envs in enumerate(sizes):
            # Lane 0 uses the 'policy' socket; each further lane gets its own connection,
            # which the broker sees as one more actor.
            socket = "policy" if i == 0 else actor.open_link("policy", f"policy_{i}")
            env, obs, episodes = actor.make_envs(len(envs), actor.seed + 1000 * i)
            lane = Lane(socket, env, episodes, obs, actor.spec)
            self.lanes.append(lane)
            actor.set_handler(socket, lambda _envelope, msg, lane=lane: self._on_act(lane, msg))
        for lane in self.lanes:
            self._send_step(lane)

    def _send_step(self, lane: Lane) -> None:
        lane.seq += 1
        arrays = {"obs": lane.obs, "reward": lane.reward, "done": lane.done}
        # The optional arrays only when they say something: each costs encode/decode time.
        if lane.truncated.any():
            arrays["truncated"], arrays["final_obs"] = lane.truncated, lane.final_obs
        # Finished episodes count toward the run's return through the broker (it sees
        # every actor's); an exploring actor's do not count (report_max_epsilon).
        if len(lane.finished[0]) and self.actor.reports_returns:
            arrays["ep_return"], arrays["ep_length"] = lane.finished
        frames = wire.encode(wire.STEP, arrays, seq=lane.seq, **self.step_fields)
        lane.sent_at = time.perf_counter()
        self.actor.send(lane.socket, frames)

    def _resend(self, lane: Lane) -> None:
        """Lazy Pirate: a fresh socket (a new identity: the broker drops our half-built
        trajectory) and the current observations again, with zero rewards (the lost
        step's outcome has no trajectory to go to) and the episode stats still pending."""
        self.actor.reopen(lane.socket)
        lane.reward[:] = 0.0
        lane.done[:] = False
        lane.truncated[:] = False
        self._send_step(lane)

    def _on_act(self, lane: Lane, msg: wire.Message) -> None:
        if msg.type == wire.ERROR and msg.fields.get("retry") is True:
            # The broker is full for now (its connections cap): ask again in a second,
            # as the request timeout would, rather than end the actor.
            self.actor.log_rejection(lane.socket, f"the policy: {msg.fields.get('error')}")
            lane.sent_at = time.perf_counter() - self.actor.args.request_timeout_s + RETRY_S
            return
        self.actor.expect_reply(msg, wire.ACT, "the policy")
        if msg.fields.get("seq") != lane.seq:
            return  # a late reply to a request we already gave up on
        self.latency.add(time.perf_counter() - lane.sent_at)
        actions = msg.arrays.get("action")
        if actions is None or actions.shape[:1] != (lane.n,):
            raise wire.ProtocolError(f"act needs 'action' for {lane.n} envs")
        lane.obs, lane.reward, terminated, truncated, info, *lane.finished = \
            self.actor.env_step(lane.env, lane.episodes, actions)
        lane.done = terminated | truncated
        lane.truncated = truncated & ~terminated
        spec = self.actor.spec
        lane.final_obs = final_obs(info, lane.truncated, spec.obs_shape, spec.obs_dtype)
        self._send_step(lane)

    # ----- the node's hooks -------------------------------------------------------------
    def load_params(self, msg: wire.Message) -> None:
        pass  # a remote actor holds no model

    def on_param_server(self, msg: wire.Message) -> None:
        raise wire.ProtocolError("a remote actor has no parameter server")

    def on_peer_silent(self, name: str) -> None:
        """The broker stopped answering even pings: reconnect and resend now rather than
        at the request timeout."""
        for lane in self.lanes:
            if lane.socket == name:
                self._resend(lane)

    def poll_timeout_ms(self) -> int:
        return 100

    def after_poll(self) -> None:
        timeout = self.actor.args.request_timeout_s
        for lane in self.lanes:
            if time.perf_counter() - lane.sent_at > timeout:
                self.actor.log.warning("no reply in %.1fs; reconnecting and resending", timeout)
                self._resend(lane)

    def metrics(self) -> dict[str, Any]:
        p50, p99 = self.latency.percentiles_ms()
        return {"latency_p50_ms": p50, "latency_p99_ms": p99}
