"""Sink: a learner stand-in that takes unrolls and counts them (benchmarks, tests)."""

from __future__ import annotations

from zmqrl.bus import wire
from zmqrl.bus.node import Node


class Sink(Node):
    binds = {"experience": "router", "params": "pub"}
    accepts = {"experience": (wire.UNROLL,)}
    metrics_interval_s = 1.0

    def setup(self) -> None:
        self.unrolls = 0
        self.env_steps = 0

    def on_experience(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.UNROLL or "action" not in msg.arrays:
            raise wire.ProtocolError(f"experience port takes unrolls, not '{msg.type}'")
        self.grant_credit("experience", envelope)
        self.unrolls += 1
        self.env_steps += int(msg["action"].shape[0] * msg["action"].shape[1])

    def metrics(self) -> dict:
        return {"unrolls": self.unrolls, "env_steps": self.env_steps}
