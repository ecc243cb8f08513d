"""Inference broker (SEED RL): batches every actor connection's envs through one model.

The broker is a batching core over behaviours (``zmqrl.parts.acting``): it keeps one
behaviour per actor connection, the one the topology's parts name, and each loop
turn takes every ``step`` that has arrived (never waiting for more unless
``max_wait_ms`` says so: waiting was the slowest policy measured), runs the model once
per batch of up to ``max_batch`` envs over all those connections
(:func:`zmqrl.parts.acting.act_batched`), and replies ``act`` to each. What the behaviours
ship — unrolls for the learner, sequences for a replay (SEED's R2D2) — goes out on the
``experience`` link under the consumer's credit; the broker loads the newest
parameters the learner publishes.

``mode: sync`` (A2C / Accel RL): wait until every actor linked to us has a request in
(or ``sync_timeout_ms`` passed), and once every connection in the batch has shipped a
rollout since the parameters it holds, act again only with the parameters trained on
those rollouts. Connections whose rollouts end at different steps (an actor that
started late or restarted) are not made to wait for parameters the learner cannot make
yet: the early one acts on, at most one unroll behind, until the rest have shipped.

Backpressure: if the consumer stops taking items, they wait in a small outbox; once
that holds ``max_outbox`` the broker stops reading actor requests, so actors block
instead of memory growing.

Memory is bounded per connection and per broker: a connection keeps its behaviour's
buffers (an unroll's ``(T+1)·n`` observations) until it has been silent
``client_timeout_s``, so a ``step`` of more than ``max_envs_per_connection`` envs gets
an ``error`` reply naming the count and the cap, and nothing is kept for it. A new
connection while ``max_connections`` are held takes the place of one idle for
``reclaim_idle_s`` (no step waiting here), or else gets an ``error`` with ``retry``: an actor that
restarted or reconnected waits and asks again rather than crash. What a behaviour holds
beyond that (``Behaviour.held_bytes_per_env``: MuZero's latents, a tree's worth per
game) is bounded in all by ``max_held_mib``, in the same way. ``zmqrl validate``
refuses a topology whose linked actors' connections (``envs`` split over ``lanes``; an
MCTS actor's ``games`` per lane) exceed the first cap, or whose number exceeds half the
second (the other half is room for reconnects while old connections expire).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from zmqrl.bus import messages, roles, wire
from zmqrl.bus.metrics import LatencyReservoir
from zmqrl.bus.node import Link, Node, Outbox, Outgoing
from zmqrl.parts.acting import ActingSetup, Behaviour, EpisodeLog, act_batched, behaviour_for
from zmqrl.parts.acting.params import ParamsFollower
from zmqrl.parts.checkpoint import TORCH, Checkpointer, node_checkpoint
from zmqrl.parts.envs import env_spec
from zmqrl.run.topology import NodeSpec, Topology, load_class


class InferenceBroker(Node):
    binds = {"policy": "router"}
    accepts = {"policy": (wire.STEP,)}
    role = roles.SERVES
    # Items go out under the consumer's credit (see Outbox); IMMEDIATE keeps them here,
    # not in a ZeroMQ queue, while no consumer is connected.
    links = {"params": Link("sub", required=False, hwm=4),
             "experience": Link("dealer", required=False, immediate=True)}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        max_batch: int = 1024  # envs per forward pass
        max_wait_ms: float = 0.0  # >0: wait this long for a fuller batch
        mode: str = "dynamic"  # dynamic | sync (see the module docstring)
        sync_timeout_ms: float = 1000.0
        device: str = "auto"
        max_outbox: int = 2  # items waiting for credit before the actors are paused
        client_timeout_s: float = 60.0  # forget a silent actor's half-built trajectory
        epsilon: float = 0.01  # ε-greedy behaviours: for actors whose steps carry none
        # The forward pass's arithmetic: float32, bfloat16 (torch.autocast; the
        # parameters stay float32), float16 on CUDA, or auto (bfloat16 where the device
        # computes it natively, else float32). A conv net's leaves evaluate in about
        # half the time in bfloat16 on a CPU with AVX-512 BF16; an MLP as small as
        # SEED's CartPole one is bound by per-call overhead and gains nothing.
        precision: str = "float32"
        # self-play: seconds between checkpoints of the opponent pool (also at exit; 0: only then)
        checkpoint_every_s: float = 30.0
        # What one connection, and all of them, may hold (see the module docstring): a
        # step wider than this, or a connection beyond that many, gets an error reply.
        max_envs_per_connection: int = 1024  # a learner's max_unroll_envs too
        max_connections: int = 256
        # What all connections' behaviours may hold besides that (a search's latents:
        # MuZero's, 6.8 MB for 1,024 games of 25 simulations of a 64-wide latent).
        max_held_mib: float = 256.0
        # At max_connections, a connection with no step waiting here that said nothing
        # for this long is forgotten to make room for a new one (an actor steps again
        # within milliseconds of its reply).
        reclaim_idle_s: float = 1.0

    @classmethod
    def largest_insert(cls, spec: NodeSpec, topo: Topology) -> int | None:
        """One connection's worth: the most envs a node linked to our ``policy`` port
        steps (its ``envs`` argument) times the items one env's step completes; None
        when no client is linked, or a ``command:`` client says no ``envs``."""
        served = []
        for other in topo.nodes.values():
            if not other.links_to("policy", f"{spec.name}.policy"):
                continue
            if other.target is None:  # a command: client says its envs in its args, or
                envs = other.args.get("envs")  # we cannot tell
                if type(envs) is not int:
                    return None
                served.append(envs)
                continue
            try:
                served.append(int(load_class(other.target).Args(**other.args).envs))
            except (ImportError, AttributeError, TypeError, ValueError):
                continue  # no envs argument to read (or its own errors, reported there)
        if not served:
            return None  # no client linked in this topology: nothing to tell by
        return max(served) * topo.algo_config.items_per_env_step()

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        mode = spec.args.get("mode", "dynamic")
        if mode not in ("dynamic", "sync"):
            return [(("nodes", spec.name, "args", "mode"), f"'{mode}' is not dynamic or sync")]
        caps = cls._cap_errors(spec, topo)
        if caps:
            return caps
        from zmqrl.parts.precision import check_precision

        problem = check_precision(spec.args.get("precision", "float32"),
                                  spec.args.get("device", "auto"))
        return [(("nodes", spec.name, "args", "precision"), problem)] if problem else []

    @classmethod
    def _cap_errors(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        """The caps are >= 1, and the nodes linked to our ``policy`` port fit them."""
        where = ("nodes", spec.name, "args")
        try:
            args = cls.Args(**spec.args)
        except TypeError:
            return []  # its args' own errors are reported with them
        for name in ("max_envs_per_connection", "max_connections"):
            if getattr(args, name) < 1:
                return [((*where, name), "must be >= 1")]
        if not args.max_held_mib > 0:
            return [((*where, "max_held_mib"), "must be > 0")]
        widths = {name: found for name, found in _connections(spec, topo).items() if found[0]}
        errors = [((*where, "max_envs_per_connection"),
                   f"node '{name}' steps {width} envs per connection, more than this "
                   f"broker's max_envs_per_connection {args.max_envs_per_connection}")
                  for name, (width, _) in sorted(widths.items())
                  if width > args.max_envs_per_connection]
        total = sum(count for _, count in widths.values())
        if 2 * total > args.max_connections:  # half is room for reconnects
            errors.append(((*where, "max_connections"),
                           f"the nodes linked to this broker open {total} connections "
                           f"(replicas x lanes), more than half its max_connections "
                           f"{args.max_connections} (the other half is room for actors "
                           "that reconnect while their old connections expire)"))
        return errors

    def setup(self) -> None:
        # Here, not at the top: every node of a topology imports this class (for its
        # ports), and a node that runs no model must not load torch.
        import torch

        from zmqrl.parts.devices import resolve_precision
        from zmqrl.parts.dqn.acting import replay_samples_by_priority
        from zmqrl.parts.models import build_model, pick_device

        torch.set_num_threads(1)
        topo = self.ctx.topo
        self.spec = env_spec(topo.env)
        self.device = pick_device(self.args.device)
        self.precision = resolve_precision(self.args.precision, self.device)
        self.model = build_model(topo.model, self.spec, topo.seed,
                                 algo=topo.algo_config).to(self.device)
        self.model.eval()
        cfg = topo.algo_config
        self.behaviour_type = self.acting_behaviour()
        self.cfg = cfg
        self.unroll = getattr(cfg, "unroll", 0)  # (for the log line and tests)
        self.step_check = messages.Context.from_env(self.spec)
        # the step its behaviour's requesters send (a plug-in's behaviour may declare its own)
        self.step_spec = messages.spec(wire.STEP, self.behaviour_type.step_variant)
        # Inserts carry priorities only for a replay that samples by them (two more
        # forward passes per step otherwise spent for nothing).
        self.priorities = any(replay_samples_by_priority(topo, target)
                              for target in self.ctx.spec.targets("experience") or [""])
        self.behaviours: dict[bytes, Behaviour] = {}  # per actor connection
        self.last_seen: dict[bytes, float] = {}
        self.sync = self.args.mode == "sync"
        # Sync mode: connections that shipped a rollout the learner has not answered yet
        # (cleared by each new parameter version, or given up after sync_timeout_ms).
        self.unanswered: set[bytes] = set()
        self.expected_actors = self._expected_actors()
        self.params = ParamsFollower(self.model, self)
        self._latest_params: wire.Message | None = None
        self.pending: list[tuple[list, wire.Message, Behaviour]] = []
        self.pending_keys: set[bytes] = set()  # connections with a step in self.pending
        self.pending_envs = 0
        self.first_pending_at = 0.0
        self.outbox = self.experience_outbox()
        self.ship = "experience" in self.sockets
        self.pooled_episodes = EpisodeLog(keep=self.ship and
                                          self.behaviour_type.ships == wire.UNROLL)
        self._blocked = False
        self.pauses = 0  # times the consumer's backpressure paused the actors
        self.refused = 0  # steps refused by max_envs_per_connection / max_connections
        self.env_steps = 0
        self.evaluations = 0
        self.batches = 0
        self.batch_envs = 0
        self.latency = LatencyReservoir()
        self.every(5.0, self._forget_silent_actors)
        self.state_checkpointer = self.acting_state()
        # what each env of a connection holds beyond the caps (max_held_mib bounds it)
        self.held_bytes_per_env = self.behaviour_type.held_bytes_per_env(self._setup_for(b""))
        self.log.info("model on %s in %s, %s per connection%s", self.device,
                      self.precision, self.behaviour_type.__name__,
                      f", unroll {self.unroll}" if self.unroll else "")

    # ----- requests -----------------------------------------------------------------
    def on_policy(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.STEP:
            raise wire.ProtocolError(f"policy port takes '{wire.STEP}', not '{msg.type}'")
        n = messages.check(msg, self.step_spec, self.step_check)["n"]
        key = b"".join(bytes(f) for f in envelope)
        if key in self.pending_keys:
            raise wire.ProtocolError("a step is already outstanding on this connection "
                                     "(at most one at a time)")
        # Refused before anything is kept for the connection: memory stays bounded.
        if n > self.args.max_envs_per_connection:
            self.refused += 1
            raise wire.ProtocolError(f"a step of {n} envs exceeds this broker's "
                                     f"max_envs_per_connection {self.args.max_envs_per_connection}")
        if key not in self.behaviours and len(self.behaviours) >= self.args.max_connections \
                and not self._forget_an_idle_connection():
            # Told to ask again (an actor that restarted or reconnected is the usual
            # newcomer here, and must not crash-loop while its old connections expire).
            self.refused += 1
            self.send("policy", wire.encode(wire.ERROR, retry=True, error=(
                f"a new connection would make {len(self.behaviours) + 1}, more than this "
                f"broker's max_connections {self.args.max_connections}; ask again")), envelope)
            return
        behaviour = self.behaviours.get(key)
        if behaviour is None or behaviour.n != n:  # a new connection starts afresh
            problem = self._room_for(key, n)
            if problem is not None:
                self.refused += 1
                self.send("policy", wire.encode(wire.ERROR, retry=True, error=problem),
                          envelope)
                return
            behaviour = self.behaviours[key] = self.behaviour_type(self._setup_for(key), n)
        self.last_seen[key] = time.monotonic()
        # Outcomes are recorded on arrival, so an unroll this request completes ships
        # before we act on it (in sync mode: before we wait for new params).
        behaviour.observe_step(msg)
        if "ep_return" in msg.arrays:
            # For the learner's metrics and the run's return (the supervisor's), whoever
            # started the actor: the broker is the one node that sees every connection.
            self.pooled_episodes.add(msg["ep_return"], msg["ep_length"])
            self.episode_log.extend(msg["ep_return"].tolist())
        self._ship(behaviour.take(), key)
        if not self.pending:
            self.first_pending_at = time.perf_counter()
        self.pending.append((envelope, msg, behaviour))
        self.pending_keys.add(key)
        self.pending_envs += n

    def _room_for(self, key: bytes, n: int) -> str | None:
        """Why connection ``key`` cannot hold a behaviour of ``n`` envs within
        ``max_held_mib`` (idle connections forgotten first to make room), or None."""
        if not self.held_bytes_per_env:
            return None
        cap = self.args.max_held_mib * (1 << 20)
        need = n * self.held_bytes_per_env

        def held() -> int:
            return self.held_bytes_per_env * sum(b.n for k, b in self.behaviours.items()
                                                 if k != key)

        while held() + need > cap and self._forget_an_idle_connection():
            pass
        if held() + need <= cap:
            return None
        return (f"{n} envs of this connection would hold {need / (1 << 20):.1f} MiB beside "
                f"the {held() / (1 << 20):.1f} MiB the others hold, more than this broker's "
                f"max_held_mib {self.args.max_held_mib:g}; ask again")

    def _setup_for(self, key: bytes) -> ActingSetup:
        """Each connection explores with its own random stream."""
        seed = self.ctx.topo.seed + len(self.behaviours) + 1
        return ActingSetup(self.spec, self.model, self.cfg, self.args.epsilon, seed,
                           priorities=self.priorities, precision=self.precision)

    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        self._latest_params = msg  # only the newest is loaded, once per loop turn

    # ----- batching -----------------------------------------------------------------
    def _expected_actors(self) -> int:
        """Actor processes whose policy link points at our port (sync mode)."""
        target = f"{self.ctx.spec.name}.policy"
        linked = sum(s.replicas for s in self.ctx.topo.nodes.values()
                     if target in s.all_targets())
        return max(1, linked // self.ctx.spec.replicas)

    def _wait_budget_ms(self) -> float:
        return self.args.sync_timeout_ms if self.sync else self.args.max_wait_ms

    def _batch_ready(self) -> bool:
        if self.sync:
            return len(self.pending) >= self.expected_actors and not self._stale_params()
        return self.pending_envs >= self.args.max_batch

    def _stale_params(self) -> bool:
        """Sync mode: once every connection waiting here has shipped a rollout since
        the parameters it holds, act again only with the parameters the learner makes
        from them (strictly on-policy A2C). Waiting for fewer would stall whenever
        rollouts end at different steps: the learner needs all of them for its batch,
        and the rest cannot ship while we wait, so each update would cost
        ``sync_timeout_ms`` (seen in CI: an actor slow to start put 1 s on every update).
        A learner that never answers costs ``sync_timeout_ms`` per rollout."""
        return bool(self.unanswered) and self.pending_keys <= self.unanswered

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
        if self.sync and self._stale_params():
            self.unanswered.clear()  # given up on (timed out): the next rollouts wait anew
        while self.pending:
            batch, envs = [], 0
            while self.pending and (not batch or envs + self.pending[0][2].n
                                    <= self.args.max_batch):
                batch.append(self.pending.pop(0))
                envs += batch[-1][2].n
            self._serve(batch, envs)
        self.pending_envs = 0
        self.pending_keys.clear()

    def _serve(self, batch: list[tuple[list, wire.Message, Behaviour]], envs: int) -> None:
        actions = act_batched(self.model, [b for _, _, b in batch], self.version)
        now = time.perf_counter()
        for (envelope, msg, behaviour), action in zip(batch, actions, strict=True):
            self.send("policy", wire.encode(wire.ACT, behaviour.reply(action),
                                            seq=msg.fields["seq"]), envelope)
            self.latency.add(now - self.first_pending_at)
        if self.behaviour_type.steps_envs:
            self.env_steps += envs
        else:
            self.evaluations += envs  # a search's leaves (EvaluateBehaviour)
        self.batches += 1
        self.batch_envs += envs

    # ----- shipping -----------------------------------------------------------------
    def _ship(self, items: list, key: bytes) -> None:
        if not self.ship:
            return  # nothing linked to take them (e.g. acting-only benchmarks)
        for item in items:
            if item.type == wire.UNROLL:
                self.pooled_episodes.attach(item.arrays)
            self.outbox.push(wire.encode(item.type, item.arrays, **item.fields))
            if self.sync and "params" in self.sockets:
                self.unanswered.add(key)
        if items:
            self._update_backpressure()

    def _update_backpressure(self) -> None:
        blocked = self.outbox.full
        if blocked != self._blocked:
            self._blocked = blocked
            self.set_polling("policy", not blocked)
            self.pauses += blocked  # normal flow control, so a metric rather than a log line

    def _load_params(self) -> None:
        msg, self._latest_params = self._latest_params, None
        if msg is not None and self.params.offer(msg):
            # The answer to the rollouts shipped so far (or a restarted learner's first
            # parameters: it lost those rollouts, so waiting on them would be in vain).
            self.unanswered.clear()

    @property
    def version(self) -> int:
        return self.params.version

    # ----- what a subclass replaces (the population broker: zmqrl/parts/selfplay) ------
    # setup() asks each of these once, in this order; the answer is the broker's.
    def acting_behaviour(self) -> type[Behaviour]:
        """The behaviour class every actor connection is served by (``self.model`` is
        built): the topology's."""
        topo = self.ctx.topo
        return behaviour_for(topo.parts_config, acting=topo.acting)

    def experience_outbox(self) -> Outgoing:
        """Where finished items wait for credit (the loop flushes it and pauses the
        actors while it is full): one outbox on the ``experience`` link, which
        :meth:`_ship` pushes to."""
        return Outbox(self, "experience", self.args.max_outbox)

    def acting_state(self) -> Checkpointer | None:
        """What the acting keeps beyond the model, as a checkpointer: restored here,
        saved on a timer and at exit. Self-play: the opponent pool
        (``checkpoints/<label>.pool.pt``)."""
        from zmqrl.parts.selfplay.acting import SelfPlayBehaviour, saved_pool

        if not issubclass(self.behaviour_type, SelfPlayBehaviour):
            return None
        saveable = saved_pool(self.model, self.behaviour_type.config)
        checkpointer = Checkpointer(
            node_checkpoint(self.ctx.run_dir, self.ctx.label, ".pool" + TORCH.suffix),
            saveable, format=TORCH, log=self.log)
        if checkpointer.restore_if_present():
            self.log.info("resumed the opponent pool: %d snapshots; %s",
                          len(saveable.pool.snapshots), saveable.pool.summary())
        if self.args.checkpoint_every_s > 0:
            self.every(self.args.checkpoint_every_s, checkpointer.save)
        return checkpointer

    def teardown(self) -> None:
        if self.state_checkpointer is not None:
            self.state_checkpointer.save()

    def _forget_an_idle_connection(self) -> bool:
        """Make room for a new connection: forget the one heard from least recently
        that has no step waiting here and has said nothing for ``reclaim_idle_s`` (an
        actor steps again within milliseconds of its reply; a broker holding an actor
        back holds its step, so that one is not idle). False if none is."""
        cutoff = time.monotonic() - self.args.reclaim_idle_s
        idle = [(seen, k) for k, seen in self.last_seen.items()
                if seen < cutoff and k not in self.pending_keys]
        if not idle:
            return False
        self._forget(min(idle)[1])
        return True

    def _forget_silent_actors(self) -> None:
        cutoff = time.monotonic() - self.args.client_timeout_s
        for key in [k for k, seen in self.last_seen.items() if seen < cutoff]:
            self._forget(key)

    def _forget(self, key: bytes) -> None:
        self.behaviours.pop(key, None)
        self.unanswered.discard(key)
        del self.last_seen[key]

    def metrics(self) -> dict:
        p50, p99 = self.latency.percentiles_ms()
        row = {
            "env_steps": self.env_steps,
            "evaluations": self.evaluations,
            "param_version": self.version,
            "batches": self.batches,
            "batch_envs_mean": round(self.batch_envs / self.batches, 2) if self.batches else 0,
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "outbox": len(self.outbox),
            "backpressure_pauses": self.pauses,
            "actors": len(self.behaviours),
            "held_mib": round(self.held_bytes_per_env
                              * sum(b.n for b in self.behaviours.values()) / (1 << 20), 2),
            "refused_steps": self.refused,
        }
        self.batch_envs = self.batches = 0
        return row


def _connections(spec: NodeSpec, topo: Topology) -> dict[str, tuple[int, int]]:
    """Per node linked to ``spec``'s ``policy`` port: (the most envs one of its
    connections steps, its connections: replicas x lanes). An actor splits ``envs`` over
    ``lanes``; an MCTS actor evaluates up to ``games`` leaves per lane. (0, 0) for a
    node whose arguments say neither (a ``command:`` node; or its own errors)."""
    found = {}
    for other in topo.nodes.values():
        if not other.links_to("policy", f"{spec.name}.policy"):
            continue
        try:
            args = load_class(other.target).Args(**other.args) if other.target else None
        except (ImportError, AttributeError, TypeError, ValueError):
            args = None  # its own errors are reported with it
        lanes = getattr(args, "lanes", 1)
        if isinstance(getattr(args, "envs", None), int) and isinstance(lanes, int) and lanes >= 1:
            found[other.name] = (-(-args.envs // lanes), other.replicas * lanes)
        elif isinstance(getattr(args, "games", None), int) and isinstance(lanes, int):
            found[other.name] = (args.games, other.replicas * max(lanes, 1))
        else:
            found[other.name] = (0, 0)
    return found
