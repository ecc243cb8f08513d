"""What a search actor is, whatever it searches: the node base of ``nodes/mcts_actor.py``
(AlphaZero: leaves of a game tree) and ``nodes/muzero_actor.py`` (MuZero: queries on
latents the broker keeps).

A search actor plays its games in **lanes**, each a search advanced in lockstep over many
games. Each round a lane has one request answered, by ``args.policy``:

* ``remote``: the request goes to the inference broker as one ``step`` on the lane's own
  connection (so this process searches one lane while the broker answers another), with
  a ``seq`` the ``act`` reply echoes; a late reply to a request given up on is dropped. An
  ``error`` with ``retry`` (the broker is full) is asked again a second later; no reply
  within ``request_timeout_s``, or a broker gone silent: the subclass's :meth:`recover`
  (a fresh socket, and the request again or the search restarted);
* ``local``: a copy of the model in this process answers (:meth:`answer_locally`),
  following the learner's ``params``.

What the games produce waits here for the replay's credit and goes out on ``experience``
as one ``insert`` at a time (:meth:`pack`); while more than ``max_waiting_positions``
wait, the lanes pause, so a slow replay or learner slows acting instead of growing
memory. A subclass says what a lane is and what its requests, answers and items are.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from zmqrl.bus import messages, roles, wire
from zmqrl.bus.metrics import LatencyReservoir
from zmqrl.bus.node import Link, Node, Outbox
from zmqrl.parts.acting.remote import RETRY_S

POLICIES = ("remote", "local")


@dataclass
class Lane:
    play: Any  # the subclass's search over this lane's games
    socket: str = ""  # remote: its connection to the broker
    request: dict[str, np.ndarray] | None = None  # sent, awaiting its answer
    seq: int = 0
    sent_at: float = 0.0
    sizes: list[int] = field(default_factory=list)  # requests' sizes since the last metrics


class SearchActor(Node):
    role = roles.ACTS  # its moves are the run's env steps (the broker's leaves are not)
    links = {
        "policy": Link("dealer", required=False),
        "experience": Link("dealer", required=False, immediate=True),
        "params": Link("sub", required=False, hwm=4),
    }
    metrics_interval_s = 1.0
    reply_variant: ClassVar[str]  # the ``act`` variant its broker answers with
    request_unit: ClassVar[str]  # what a request holds, per game ("leaves", "queries")

    # ----- what a subclass defines --------------------------------------------------
    def make_lanes(self) -> list[Lane]:
        raise NotImplementedError

    def next_request(self, lane: Lane) -> dict[str, np.ndarray]:
        """The arrays of the lane's next ``step`` (one entry per game)."""
        raise NotImplementedError

    def answer(self, lane: Lane, msg: wire.Message) -> None:
        """Feed a checked ``act`` to the lane's search."""
        raise NotImplementedError

    def answer_locally(self) -> None:
        """policy local: one round of every lane, answered by ``self.model``."""
        raise NotImplementedError

    def local_model(self) -> None:
        """policy local: build ``self.model`` and ``self.params`` (a ParamsFollower)."""
        raise NotImplementedError

    def collect(self, lane: Lane) -> None:
        """Take what the lane finished into ``self.waiting`` (counting
        ``self.waiting_positions``)."""
        raise NotImplementedError

    def pack(self) -> tuple[dict[str, np.ndarray], int]:
        """The next insert from ``self.waiting`` (non-empty), and its positions."""
        raise NotImplementedError

    def recover(self, lane: Lane, why: str) -> None:
        """No answer will come for the lane's request: a fresh socket, and the request
        again (the default) or the search restarted."""
        self.log.warning("%s; reconnecting and resending", why)
        self.reopen(lane.socket)
        self._send(lane)

    def on_error(self, lane: Lane, msg: wire.Message) -> bool:
        """An ``error`` other than "retry" from the broker: True if handled."""
        return False

    # ----- setting up ---------------------------------------------------------------
    @classmethod
    def check_policy(cls, spec: Any) -> list[tuple[tuple, str]]:
        """The checks of ``policy``, its link and ``precision`` every search actor has."""
        args, where = spec.args, ("nodes", spec.name)
        errors = []
        policy = args.get("policy", "remote")
        if policy not in POLICIES:
            errors.append(((*where, "args", "policy"), f"'{policy}' is not remote or local"))
        elif policy == "remote" and "policy" not in spec.links:
            errors.append(((*where, "links"), "policy: remote needs a 'policy' link (to an "
                                              "inference broker)"))
        from zmqrl.parts.precision import check_precision

        problem = check_precision(args.get("precision", "float32"), args.get("device", "cpu"))
        if problem:
            errors.append(((*where, "args", "precision"), problem))
        return errors

    def start_lanes(self, spec: Any) -> None:
        """After the subclass's own setup: the lanes, the outbox, and the first request
        of each lane (remote) or the local model."""
        a = self.args
        self.check = messages.Context.from_env(spec)
        self.reply_spec = messages.spec(wire.ACT, self.reply_variant)
        self.lanes = self.make_lanes()
        self.outbox = Outbox(self, "experience", a.max_outbox) \
            if "experience" in self.sockets else None
        self.waiting: deque[Any] = deque()  # items waiting for credit
        self.waiting_positions = 0
        self.version = 0
        self.positions_sent = 0
        self.latency = LatencyReservoir()
        self._rate_mark = (time.monotonic(), 0)
        self.local = a.policy == "local"
        if self.local:
            self.local_model()
            return
        for i, lane in enumerate(self.lanes):
            lane.socket = "policy" if i == 0 else self.open_link("policy", f"policy_{i}")
            self.set_handler(lane.socket,
                             lambda _envelope, msg, lane=lane: self._on_act(lane, msg))
            self.send_request(lane)

    # ----- remote answers -----------------------------------------------------------
    def send_request(self, lane: Lane) -> None:
        lane.request = self.next_request(lane)
        self._send(lane)

    def _send(self, lane: Lane) -> None:
        assert lane.request is not None
        lane.seq += 1
        self.send(lane.socket, wire.encode(wire.STEP, lane.request, seq=lane.seq))
        lane.sent_at = time.perf_counter()
        lane.sizes.append(len(next(iter(lane.request.values()))))

    def _on_act(self, lane: Lane, msg: wire.Message) -> None:
        if msg.type == wire.ERROR:
            if msg.fields.get("retry") is True:
                # the broker is full for now: ask again in a second (zmqrl.parts.acting.remote)
                self.log_rejection(lane.socket,
                                   f"the inference broker: {msg.fields.get('error')}")
                lane.sent_at = time.perf_counter() - self.args.request_timeout_s + RETRY_S
                return
            if self.on_error(lane, msg):
                return
        self.expect_reply(msg, wire.ACT, "the inference broker")
        if lane.request is None or msg.fields.get("seq") != lane.seq:
            return  # a late reply to a request we gave up on
        n = messages.check(msg, self.reply_spec, self.check)["n"]
        sent = len(next(iter(lane.request.values())))
        if n != sent:
            raise wire.ProtocolError(f"act answers {n} {self.request_unit}, we sent {sent}")
        self.latency.add(time.perf_counter() - lane.sent_at)
        lane.request = None
        self.answer(lane, msg)
        self.collect(lane)
        self.ship()
        if not self.held():
            self.send_request(lane)

    # ----- positions out ------------------------------------------------------------
    def ship(self) -> None:
        """What waits goes out as one insert when the replay has credit for it."""
        if self.outbox is None:
            self.waiting.clear()  # nothing linked to take them (benchmarks)
            self.waiting_positions = 0
            return
        if not self.waiting or len(self.outbox):
            return  # one insert waits at most; the positions gather meanwhile
        arrays, count = self.pack()
        # (a remote actor does not know the broker's parameter version: it says none)
        extra = {"version": self.version} if self.local else {}
        self.outbox.push(wire.encode(wire.INSERT, arrays, **extra))
        self.positions_sent += count
        self.waiting_positions -= count

    def held(self) -> bool:
        return self.waiting_positions > self.args.max_waiting_positions

    # ----- the runtime's hooks ------------------------------------------------------
    def on_params(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.PARAMS:
            raise wire.ProtocolError(f"params link takes '{wire.PARAMS}', not '{msg.type}'")
        if self.local and self.params.offer(msg):
            self.version = self.params.version

    def on_peer_silent(self, name: str) -> None:
        for lane in self.lanes:
            if lane.socket == name and lane.request is not None:
                self.recover(lane, "the broker went silent")

    def poll_timeout_ms(self) -> int:
        if self.local and not self.held():
            return 0  # local: keep searching; just look for params and credit
        return 100

    def after_poll(self) -> None:
        if self.outbox is not None:
            self.outbox.flush()
        self.ship()
        if self.held():
            return
        if self.local:
            self.answer_locally()
            return
        now = time.perf_counter()
        for lane in self.lanes:
            if lane.request is None:  # paused after its last reply: go on
                self.send_request(lane)
            elif now - lane.sent_at > self.args.request_timeout_s:
                self.recover(lane, f"no reply in {self.args.request_timeout_s:.1f}s")

    def search_metrics(self) -> dict[str, Any]:
        """The rows both kinds report: simulations, requests, positions, latency."""
        now = time.monotonic()
        sims = sum(lane.play.simulations for lane in self.lanes)
        t0, sims0 = self._rate_mark
        self._rate_mark = (now, sims)
        sizes = [s for lane in self.lanes for s in lane.sizes]
        for lane in self.lanes:
            lane.sizes.clear()
        p50, p99 = self.latency.percentiles_ms()
        return {"simulations": sims,
                "sims_per_s": round((sims - sims0) / max(now - t0, 1e-9), 1),
                "positions_sent": self.positions_sent,
                "positions_waiting": self.waiting_positions,
                "param_version": self.version,
                f"{self.request_unit}_per_request":
                    round(float(np.mean(sizes)), 2) if sizes else 0,
                "latency_p50_ms": p50, "latency_p99_ms": p99,
                "outbox": len(self.outbox) if self.outbox is not None else 0}
