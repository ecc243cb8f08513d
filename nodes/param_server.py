"""Parameter server (Gorila, A3C): applies pushed gradients and serves the parameters.

``grads`` (ROUTER) takes a ``grads`` request — one array per trainable parameter, named
as in ``model.named_parameters()`` — applies it with the algorithm's optimizer
(``algo.kind``: the same clipping and Adam settings a learner would use), and replies
with the new parameters and their version. ``get_params`` is answered the same way
without an update. Every ``publish_every`` updates the parameters also go out on
``params`` (PUB), which actors subscribe to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zmqrl import wire
from zmqrl.algos import ALGOS, make_algo
from zmqrl.envs import env_spec
from zmqrl.models import build_model, pick_device, state_arrays
from zmqrl.node import Node
from zmqrl.topology import NodeSpec, Topology


class ParamServer(Node):
    binds = {"grads": "router", "params": "pub"}
    port_hwm = {"params": 4}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        device: str = "cpu"
        publish_every: int = 1

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        kind = topo.algo.get("kind", "vtrace")
        if kind in ALGOS and not hasattr(ALGOS[kind][1], "apply_gradients"):
            usable = [k for k, (_, learner) in ALGOS.items() if hasattr(learner, "apply_gradients")]
            return [(("algo", "kind"), f"a parameter server cannot apply '{kind}' gradients "
                                       f"(use one of: {', '.join(usable)})")]
        return []

    def setup(self) -> None:
        torch.set_num_threads(1)
        topo = self.ctx.topo
        spec = env_spec(topo.env)
        self.device = pick_device(self.args.device)
        self.model = build_model(topo.model, spec, topo.seed).to(self.device)
        self.algo = make_algo(topo.algo, self.model)
        self.shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()
                       if p.requires_grad}
        self.version = 0
        self.env_steps = 0
        self.grad_norm = float("nan")
        self._publish()

    def on_grads(self, envelope: list, msg: wire.Message) -> None:
        if msg.type == wire.GET_PARAMS:
            self._reply(envelope)
            return
        if msg.type != wire.GRADS:
            raise wire.ProtocolError(f"grads port takes '{wire.GRADS}' or '{wire.GET_PARAMS}', "
                                     f"not '{msg.type}'")
        if set(msg.arrays) != set(self.shapes):
            raise wire.ProtocolError(f"grads must name exactly the parameters "
                                     f"{sorted(self.shapes)}")
        for name, shape in self.shapes.items():
            if msg[name].shape != shape or msg[name].dtype.kind != "f":
                raise wire.ProtocolError(f"grads '{name}': want float {list(shape)}, got "
                                         f"{msg[name].dtype} {list(msg[name].shape)}")
            if not np.isfinite(msg[name]).all():  # one NaN would poison every parameter
                raise wire.ProtocolError(f"grads '{name}' holds NaN or infinite values")
        grads = [msg[name] for name in self.shapes]
        terms = self.algo.apply_gradients(grads)
        self.grad_norm = terms["grad_norm"]
        self.version += 1
        env_steps = msg.fields.get("env_steps", 0)
        self.env_steps += env_steps if type(env_steps) is int else 0
        self._reply(envelope)
        if self.version % self.args.publish_every == 0:
            self._publish()

    def _params_message(self) -> list:
        return wire.encode(wire.PARAMS, state_arrays(self.model), version=self.version,
                           source=self.incarnation)

    def _reply(self, envelope: list) -> None:
        self.send("grads", self._params_message(), envelope)

    def _publish(self) -> None:
        self.send("params", self._params_message())

    def metrics(self) -> dict[str, Any]:
        return {"updates": self.version, "env_steps": self.env_steps,
                "grad_norm": round(self.grad_norm, 5)}
