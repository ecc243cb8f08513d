"""A local actor's driver (IMPALA, A3C, Ape-X, Gorila, R2D2): act with a local model.

The actor's envs are one connection of the behaviour the topology's parts name
(``topo.parts_config``, ``zmqrl.parts.acting.behaviour_for``), stepped through the same
:func:`act_batched` the inference broker uses. Items go out as the behaviour says:
unrolls and replay inserts on ``experience`` under the consumer's credit (an outbox;
while it is full the actor stops stepping, so a slow consumer slows the actors instead
of growing memory), and
A3C's gradients to the ``param_server``, one request at a time: the reply carries the
parameters to continue with.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from zmqrl.bus import wire
from zmqrl.bus.node import Outbox
from zmqrl.parts.acting import ActingSetup, EpisodeLog, act_batched, behaviour_for, final_obs
from zmqrl.parts.acting.params import ParamsFollower
from zmqrl.parts.dqn.acting import replay_samples_by_priority
from zmqrl.parts.models import build_model


class LocalActing:
    def __init__(self, actor: Any):
        torch.set_num_threads(1)
        self.actor = actor
        topo, n = actor.ctx.topo, actor.args.envs
        cfg = topo.algo_config
        self.env, self.obs, self.episodes = actor.make_envs(n, actor.seed)
        self.model = build_model(topo.model, actor.spec, topo.seed, algo=topo.algo_config)
        self.model.eval()
        self.params = ParamsFollower(self.model, actor)
        destination = "param_server" if "param_server" in actor.sockets else "experience"
        cls = behaviour_for(topo.parts_config, destination, topo.acting)
        epsilon = actor.epsilon() if cls.explores_by_epsilon else 0.0
        link = (actor.ctx.spec.targets("experience") or [""])[0]  # a plain link: one
        self.behaviour = cls(ActingSetup(
            actor.spec, self.model, cfg, epsilon, actor.seed,
            args=actor.behaviour_args(),
            priorities=replay_samples_by_priority(topo, link),
            insert_batch=actor.args.insert_batch), n)
        self.behaviour.observe(self.obs)
        actor.outbox = self.outbox = Outbox(actor, "experience", actor.args.max_outbox) \
            if "experience" in actor.sockets else None
        self.pooled_episodes = EpisodeLog(keep=cls.ships == wire.UNROLL)
        self.awaiting_params = False
        self.sent_at = 0.0

    # ----- the loop -----------------------------------------------------------------
    def _blocked(self) -> bool:
        return self.awaiting_params or (self.outbox is not None and self.outbox.full)

    def poll_timeout_ms(self) -> int:
        return 100 if self._blocked() else 0  # else keep stepping; just look for params

    def after_poll(self) -> None:
        if self.outbox is not None:
            self.outbox.flush()
        timeout = self.actor.args.request_timeout_s
        if self.awaiting_params and time.perf_counter() - self.sent_at > timeout:
            self.actor.log.warning("no reply from the parameter server in %.1fs; "
                                   "reconnecting", timeout)
            self._lost_gradient()
        if not self._blocked():
            self._step()

    def _step(self) -> None:
        actor, b, spec = self.actor, self.behaviour, self.actor.spec
        (action,) = act_batched(self.model, [b], actor.version)
        obs, reward, terminated, truncated, info, returns, lengths = \
            actor.env_step(self.env, self.episodes, action)
        self.pooled_episodes.add(returns, lengths)
        if actor.reports_returns:  # the run's return (--target-return): see report_max_epsilon
            actor.episode_log.extend(returns.tolist())
        cut = truncated & ~terminated
        b.outcome(reward, terminated | truncated, cut,
                  final_obs(info, cut, spec.obs_shape, spec.obs_dtype))
        b.observe(obs)
        for item in b.take():
            self._ship(item)

    def _ship(self, item: Any) -> None:
        if item.type == wire.UNROLL:
            self.pooled_episodes.attach(item.arrays)
        frames = wire.encode(item.type, item.arrays, **item.fields)
        if item.type == wire.GRADS:
            self.actor.send("param_server", frames)
            self.sent_at = time.perf_counter()
            self.awaiting_params = True
        else:
            self.outbox.push(frames)

    # ----- parameters -----------------------------------------------------------------
    def load_params(self, msg: wire.Message) -> None:
        if self.params.offer(msg):
            self.actor.version = self.params.version

    def on_param_server(self, msg: wire.Message) -> None:
        self.actor.expect_reply(msg, wire.PARAMS, "the parameter server")
        self.load_params(msg)
        self.awaiting_params = False

    def on_peer_silent(self, name: str) -> None:
        if name == "param_server" and self.awaiting_params:
            self._lost_gradient()

    def _lost_gradient(self) -> None:
        self.actor.reopen("param_server")
        self.awaiting_params = False  # that gradient is lost; the next one goes out

    def metrics(self) -> dict[str, Any]:
        return {"outbox": len(self.outbox) if self.outbox is not None else 0}

