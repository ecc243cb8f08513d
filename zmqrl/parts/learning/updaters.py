"""Updaters of a learner: what training on one batch does to the parameters.

* :class:`LocalStep`: the algorithm's own optimizer step, here (``algo.update``).
* :class:`AllReduce`: data-parallel replicas (OpenAI Five's synchronous optimizers):
  the replicas form a gloo group (``zmqrl.parts.distributed``) and the algorithm averages its
  gradients through the ``allreduce`` hook it is built with, so every replica takes the
  same step and all hold identical parameters.
* :class:`GradientPush` (Gorila): gradients go to a parameter server, which applies
  them; its replies carry the new parameters. Up to ``max_pending`` gradients are in
  flight: the learner keeps computing on parameters a few updates stale instead of a
  round trip per update, as Gorila's asynchronous learners do.

An updater says when it can take a batch (``ready``), trains on one (``step``: loss
terms and, for Q-learning, new priorities) and calls back ``on_update`` once per update
of the parameters it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from zmqrl.bus import messages, wire
from zmqrl.parts import distributed
from zmqrl.parts.learning.checks import check_params
from zmqrl.parts.learning.connection import DisconnectWatch
from zmqrl.parts.models import load_state_arrays

Terms = dict[str, float]


class Updater(Protocol):
    """Where a learner's gradients go (a part: ``zmqrl.updaters`` entry points, or
    ``parts.updater: module:Class``). ``for_learner`` builds it for a learner node."""

    algo_options: dict[str, Any]  # extra arguments for make_algo (hooks)
    # True: the learner's replicas are one data-parallel learner (each trains on its
    # share of every batch); False: each replica learns on its own.
    data_parallel: bool

    @classmethod
    def for_learner(cls, learner: Any) -> Updater: ...

    def bind(self, algo: Any, on_update: Callable[[], None]) -> None: ...

    def ready(self) -> bool: ...

    def step(self, batch: dict[str, torch.Tensor]) -> tuple[Terms, torch.Tensor | None]: ...

    def poll(self) -> None: ...

    def peers(self) -> frozenset[str]:
        """The links whose peer this updater waits on: when one falls silent, ``lost()``."""
        ...

    def lost(self) -> None: ...

    def metrics(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _split(out: Any) -> tuple[Terms, torch.Tensor | None]:
    """Q-learning algorithms return (terms, priorities), actor-critic ones terms."""
    return out if isinstance(out, tuple) else (out, None)


class LocalStep:
    """One optimizer step here per batch."""

    algo_options: dict[str, Any] = {}
    data_parallel = False

    @classmethod
    def for_learner(cls, learner: Any) -> LocalStep:
        return cls()

    def bind(self, algo: Any, on_update: Callable[[], None]) -> None:
        self.algo, self.on_update = algo, on_update

    def ready(self) -> bool:
        return True

    def step(self, batch: dict[str, torch.Tensor]) -> tuple[Terms, torch.Tensor | None]:
        terms, priorities = _split(self.algo.update(batch))
        self.on_update()
        return terms, priorities

    def poll(self) -> None:
        pass

    def peers(self) -> frozenset[str]:
        return frozenset()  # (AllReduce's replicas: the process group notices them)

    def lost(self) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class AllReduce(LocalStep):
    """Data-parallel: this replica joins the group of its ``world`` replicas (at
    ``address``, as rank ``rank``; NCCL when the model is on CUDA, else gloo); the
    algorithm averages gradients through the hook."""

    data_parallel = True

    def __init__(self, address: str, rank: int, world: int,
                 device: str | torch.device = "cpu"):
        cuda = torch.device(device).type == "cuda"
        distributed.init_group(address, rank, world, backend="nccl" if cuda else "gloo")
        self.algo_options = {"allreduce": distributed.mean_allreduce(world)}

    @classmethod
    def for_learner(cls, learner: Any) -> AllReduce:
        """Rank ``replica`` of the learner node's replicas."""
        spec = learner.ctx.spec
        return cls(distributed.rendezvous_address(learner.ctx.topo, spec, learner.ctx.run_dir),
                   learner.ctx.replica, spec.replicas, learner.device)

    def close(self) -> None:
        distributed.leave_group()


class GradientPush:
    """Gorila: gradients to the parameter server behind DEALER link ``link`` of
    ``node``, parameters back.

    Each reply answers one gradient (``pending`` counts down by one, whatever order
    the server's replies come in) and carries the server's newest parameters; only the
    newest reply is loaded, before the next gradient is computed. The target network
    follows the server's version (a copy every ``target_update_every`` server updates,
    as in Gorila), not this learner's share of the updates.
    """

    algo_options: dict[str, Any] = {}
    data_parallel = False

    def __init__(self, node: Any, check: messages.Context, max_pending: int,
                 link: str = "param_server"):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.node = node
        self.check = check  # knows the model's tensors: what a reply must carry
        self.link = link
        self.max_pending = max_pending
        self.pending = 0  # gradients sent, not yet answered
        self.server_version = 0  # of the parameters we hold
        self.reconnects = 0
        self._latest: wire.Message | None = None  # newest reply, not loaded yet
        self._answered = 0  # replies not yet counted as updates
        self.watch = DisconnectWatch(node.sockets[link])

    @classmethod
    def for_learner(cls, learner: Any) -> GradientPush:
        """To the learner's ``param_server`` link."""
        return cls(learner, learner.check, learner.args.max_pending_grads)

    def bind(self, algo: Any, on_update: Callable[[], None]) -> None:
        self.algo, self.on_update = algo, on_update
        self.model: torch.nn.Module = algo.model
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]

    def ready(self) -> bool:
        self.poll()
        return self.pending < self.max_pending

    def step(self, batch: dict[str, torch.Tensor]) -> tuple[Terms, torch.Tensor | None]:
        grads, terms, priorities = self.algo.gradients(batch)
        self.node.send(self.link, wire.encode(
            wire.GRADS, {n: g.cpu().numpy() for n, g in zip(self.names, grads, strict=True)},
            version=self.server_version))
        self.pending += 1
        return terms, priorities

    def on_reply(self, msg: wire.Message) -> None:
        self.node.expect_reply(msg, wire.PARAMS, "the parameter server")
        self.pending = max(0, self.pending - 1)  # it answers one gradient, not all
        check_params(msg, self.check)
        self._latest = msg
        self._answered += 1

    def poll(self) -> None:
        if self.watch.dropped():
            self.node.log.warning("connection to the parameter server dropped")
            self.lost()
        if self._latest is not None:
            msg, self._latest = self._latest, None
            load_state_arrays(self.model, msg.arrays)
            self._follow(msg.fields["version"])
        answered, self._answered = self._answered, 0
        for _ in range(answered):
            self.on_update()

    def _follow(self, version: int) -> None:
        """Sync the target network when the server's version crosses a multiple of
        ``target_update_every`` (or goes back: a server restored from a checkpoint)."""
        every = getattr(self.algo.cfg, "target_update_every", 0)
        held = getattr(self.algo, "updates", self.server_version)  # restored with it
        if every and hasattr(self.algo, "sync_target") and version // every != held // every:
            self.algo.sync_target()
        self.server_version = version
        if hasattr(self.algo, "updates"):
            self.algo.updates = version  # the algorithm's counter is the server's

    def peers(self) -> frozenset[str]:
        return frozenset({self.link})

    def lost(self) -> None:
        """The server lost the gradients in flight: a fresh socket (late replies to the
        old ones cannot arrive); they are not resent (newer ones follow)."""
        self.watch.close()
        self.node.reopen(self.link)
        self.watch.attach(self.node.sockets[self.link])
        self.pending = 0
        self.reconnects += 1

    def metrics(self) -> dict[str, Any]:
        return {"pending_grads": self.pending, "server_version": self.server_version,
                "param_server_reconnects": self.reconnects}

    def close(self) -> None:
        self.watch.close()
