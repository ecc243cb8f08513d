"""Parameter server (Gorila, A3C): applies pushed gradients and serves the parameters.

``grads`` (ROUTER) takes a ``grads`` request — one array per trainable parameter, named
as in ``model.named_parameters()`` — applies it with the algorithm's optimizer
(``algo.kind``: the same clipping and Adam settings a learner would use), and replies
with the new parameters and their version. ``get_params`` is answered the same way
without an update. Every ``publish_every`` updates the parameters also go out on
``params`` (PUB), which actors subscribe to.

Checkpoint and resume: ``checkpoints/<label>.pt`` in the run directory holds the model,
the algorithm's state (optimizer, update counter, target network) and the version and
env-step counters, written every ``checkpoint_every`` updates and at exit, crash-safely
(:class:`zmqrl.parts.checkpoint.Checkpointer`). A parameter server that finds it when it
starts (a restart after a crash, or ``zmqrl up --resume``) restores it and publishes the
restored parameters with the restored version, so versions continue from there instead
of starting again from 0 with initial parameters. Gradients applied after the last
checkpoint are lost with a crash (at most ``checkpoint_every - 1`` updates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from zmqrl.bus import messages, roles, wire
from zmqrl.bus.node import Node
from zmqrl.parts.algo_config import config_type, learner_type
from zmqrl.parts.checkpoint import TORCH, Checkpointer, node_checkpoint
from zmqrl.parts.envs import env_spec
from zmqrl.run.topology import NodeSpec, Topology

_CHECKPOINT_FORMAT = 1
_GRADS = messages.spec(wire.GRADS)


class ParamServer(Node):
    binds = {"grads": "router", "params": "pub"}
    accepts = {"grads": (wire.GRADS, wire.GET_PARAMS)}
    role = roles.APPLIES
    port_hwm = {"params": 4}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        device: str = "cpu"
        publish_every: int = 1
        # updates between checkpoints (0: only at exit); a crash loses at most this many
        checkpoint_every: int = 100

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        from zmqrl.parts.algos import ALGOS  # torch: only `up`, `validate` and this node check it

        kind = topo.algo.get("kind", "vtrace")
        try:
            learner = learner_type(config_type(kind))
        except ValueError:
            learner = None  # reported with the algo section
        if learner is not None and not hasattr(learner, "apply_gradients"):
            usable = [k for k, (_, learner) in ALGOS.items() if hasattr(learner, "apply_gradients")]
            return [(("algo", "kind"), f"a parameter server cannot apply '{kind}' gradients "
                                       f"(use one of: {', '.join(usable)})")]
        if cls.Args(**spec.args).checkpoint_every < 0:
            return [(("nodes", spec.name, "args", "checkpoint_every"),
                     "must be >= 0 (0: only at exit)")]
        return []

    def setup(self) -> None:
        # Here, not at the top: every node of a topology imports this class (for its
        # ports), and a node that runs no model must not load torch.
        import torch

        from zmqrl.parts.algos import make_algo
        from zmqrl.parts.models import build_model, pick_device

        torch.set_num_threads(1)
        topo = self.ctx.topo
        spec = env_spec(topo.env)
        self.device = pick_device(self.args.device)
        self.model = build_model(topo.model, spec, topo.seed, algo=topo.algo_config).to(self.device)
        self.algo = make_algo(topo.algo, self.model)
        self.shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()
                       if p.requires_grad}
        self.check = messages.Context(parameters=self.shapes)
        self.version = 0
        self.env_steps = 0
        self.updates_skipped = 0  # gradients applied as no step: a non-finite norm
        self.grad_norm = float("nan")
        self.checkpointer = Checkpointer(
            node_checkpoint(self.ctx.run_dir, self.ctx.label, TORCH.suffix), self,
            every=self.args.checkpoint_every, format=TORCH, log=self.log)
        if self.checkpointer.restore_if_present():
            self.log.info("resumed from %s at version %d", self.checkpointer.path,
                          self.version)
        self._publish()  # the restored parameters, if any, with their version

    # ----- persistence (zmqrl.parts.checkpoint.Saveable) -------------------------------------
    def state(self) -> dict[str, Any]:
        return {"format": _CHECKPOINT_FORMAT, "model": self.model.state_dict(),
                "algo": self.algo.state_dict(), "version": self.version,
                "env_steps": self.env_steps}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("format") != _CHECKPOINT_FORMAT:
            raise ValueError(f"not a parameter server checkpoint of format "
                             f"{_CHECKPOINT_FORMAT} (format {state.get('format')!r})")
        self.model.load_state_dict(state["model"])
        self.algo.load_state_dict(state["algo"])
        self.version = int(state["version"])
        self.env_steps = int(state["env_steps"])

    def on_grads(self, envelope: list, msg: wire.Message) -> None:
        if msg.type == wire.GET_PARAMS:
            self._reply(envelope)
            return
        if msg.type != wire.GRADS:
            raise wire.ProtocolError(f"grads port takes '{wire.GRADS}' or '{wire.GET_PARAMS}', "
                                     f"not '{msg.type}'")
        # The declaration (zmqrl.bus.messages): exactly the trainable parameters, float,
        # finite (one NaN would poison every parameter), integer counters.
        messages.check(msg, _GRADS, self.check)
        grads = [msg[name] for name in self.shapes]
        terms = self.algo.apply_gradients(grads)
        self.grad_norm = terms["grad_norm"]
        # a non-finite norm stepped nothing (zmqrl.parts.algos.gradients.clip_and_step)
        self.updates_skipped += not math.isfinite(self.grad_norm)
        self.version += 1
        self.env_steps += msg.fields.get("env_steps", 0)
        self._reply(envelope)
        if self.version % self.args.publish_every == 0:
            self._publish()
        self.checkpointer.maybe_save(self.version)

    def _params_message(self) -> list:
        from zmqrl.parts.models import state_arrays  # loaded by setup

        return wire.encode(wire.PARAMS, state_arrays(self.model), version=self.version,
                           source=self.incarnation)

    def _reply(self, envelope: list) -> None:
        self.send("grads", self._params_message(), envelope)

    def _publish(self) -> None:
        self.send("params", self._params_message())

    def metrics(self) -> dict[str, Any]:
        return {"updates": self.version, "env_steps": self.env_steps,
                "grad_norm": round(self.grad_norm, 5), "updates_skipped": self.updates_skipped}

    def teardown(self) -> None:
        self.checkpointer.save(self.version)
