"""Sink: a learner stand-in that takes unrolls and counts them (benchmarks, tests).

What it takes is checked as a learner checks it (``zmqrl.bus.messages``, in the run's env
and unroll length): a stand-in must not teach producers that a bad unroll is fine.
"""

from __future__ import annotations

from typing import Any

from zmqrl.bus import messages, wire
from zmqrl.bus.node import Node


class Sink(Node):
    binds = {"experience": "router", "params": "pub"}
    accepts = {"experience": (wire.UNROLL,)}
    metrics_interval_s = 1.0

    @classmethod
    def runs_torch(cls, spec: Any) -> bool:
        return False

    def setup(self) -> None:
        self.unrolls = 0
        self.env_steps = 0
        topo = self.ctx.topo
        self.check = messages.Context.from_env(
            topo.env_spec(), unroll=getattr(topo.algo_config, "unroll", None))

    def on_experience(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.UNROLL:
            raise wire.ProtocolError(f"experience port takes unrolls, not '{msg.type}'")
        variant = "recurrent" if "state_h" in msg.arrays else ""  # a recurrent model's
        messages.check(msg, messages.spec(wire.UNROLL, variant), self.check)
        self.grant_credit("experience", envelope)
        self.unrolls += 1
        self.env_steps += int(msg["action"].shape[0] * msg["action"].shape[1])

    def metrics(self) -> dict:
        return {"unrolls": self.unrolls, "env_steps": self.env_steps}
