"""Data sources of a learner: where its training batches come from.

A source takes the messages of its socket (``on_message``), hands out training batches
(``next_batch``: a dict of tensors, or None while it has none), is told what training on
one gave (``done``: new priorities) and keeps its requests going (``poll``). Two exist:

* :class:`UnrollInbox` (unroll algorithms): unrolls arrive on the learner's bound
  ``experience`` port from an inference broker or local-policy actors, under credit
  (``zmqrl.bus.node.Outbox``); it checks them, queues them and stacks ``columns`` env
  columns into each batch, and measures the policy lag.
* :class:`ReplayClient` (replay and sequence algorithms): it asks the ``replay`` link
  for batches, keeping ``prefetch`` requests in flight so the replay works while we
  train, and sends the new priorities back.

Both are transport-agnostic about training: what a batch trains is the updater's
business (``zmqrl.parts.learning.updaters``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from zmqrl.bus import messages, wire
from zmqrl.bus.metrics import RETURN_WINDOW, EpisodeStats
from zmqrl.parts.devices import HostToDevice
from zmqrl.parts.learning.checks import (
    STATE_KEYS,
    UNROLL_KEYS,
    check_batch,
    check_unroll,
    item_keys,
)
from zmqrl.parts.learning.connection import DisconnectWatch

WEIGHT = "weight"  # a replay batch's importance weights, named as on the wire


class ReadTensors(dict):
    """A batch's tensors that note which keys the learner read (``[]`` or ``get``), so
    the learner node can tell a learner that never reads the importance weights of a
    prioritized batch (a silent uniform update) in its log."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


@dataclass
class Batch:
    """A training batch and what its source needs back after training on it."""

    tensors: dict[str, torch.Tensor]
    keys: np.ndarray | None = None  # replay keys, for the new priorities
    source: str | None = None  # the replay incarnation that issued the keys


class Source(Protocol):
    """A learner's data source (a part: ``zmqrl.sources`` entry points, or
    ``parts.source: module:Class``). ``for_learner`` builds it for a learner node (its
    sockets, ``check``, ``model``, ``cfg``, ``device``, ``args``, ``world``)."""

    @classmethod
    def for_learner(cls, learner: Any) -> Source: ...

    def on_message(self, envelope: list, msg: wire.Message) -> None: ...

    def next_batch(self, version: int) -> Batch | None: ...

    def done(self, batch: Batch, priorities: torch.Tensor | None) -> None: ...

    def poll(self) -> None: ...

    def peers(self) -> frozenset[str]:
        """The links whose peer this source waits on: when one falls silent, ``lost()``."""
        ...

    def lost(self) -> None: ...

    def close(self) -> None: ...

    def metrics(self) -> dict[str, Any]: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


class UnrollInbox:
    """Unrolls from the ROUTER port ``port`` of ``node``, ``columns`` env columns a batch.

    A batch is exactly ``columns`` columns: an unroll that does not fit is split and its
    rest waits for the next batch (so data-parallel replicas always train on equal
    shares). At most one batch's worth waits here; the rest waits in the producers'
    outboxes (credit: backpressure, nothing dropped).

    Credit is what a producer grants itself, so a peer that ignores it is bounded here
    too: an unroll wider than ``max_envs`` is refused, and once ``hold_columns`` wait
    we stop reading the port until a batch is taken (its sender waits, as credit would
    have had it; nothing is dropped).
    """

    def __init__(self, node: Any, check: messages.Context, columns: int,
                 device: torch.device, recurrent: bool = False, port: str = "experience",
                 max_envs: int = 1024):
        self.max_envs = max_envs
        self.hold_columns = 2 * columns + max_envs
        self.holding = False  # not reading the port: hold_columns wait
        self.node = node
        self.check = check
        self.recurrent = recurrent  # unrolls carry the state they began with (lstm_ac)
        self.columns = columns
        self.device = device
        self.to_device = HostToDevice(device)  # pinned, non-blocking copies on CUDA
        self.port = port
        self.keys = UNROLL_KEYS + (STATE_KEYS if recurrent else ())
        # (arrays of self.keys [T(+1), n, ...], parameter version that acted) per unroll
        self.queue: deque[tuple[dict[str, np.ndarray], int]] = deque()
        self.queued_columns = 0
        self.env_steps = 0
        self.episodes = EpisodeStats(window=RETURN_WINDOW)
        self.lags: list[int] = []
        self._rate_mark = (time.monotonic(), 0)

    @classmethod
    def for_learner(cls, learner: Any) -> UnrollInbox:
        """The unrolls on the learner's ``experience`` port; data-parallel replicas pool
        what they receive (:class:`SharedUnrollInbox`)."""
        recurrent = getattr(learner.model, "recurrent", False)
        columns = learner.cfg.batch_size // learner.world
        max_envs = learner.unroll_width_cap
        if learner.world > 1:
            return SharedUnrollInbox(learner, learner.check, columns, learner.device,
                                     learner.ctx.replica, learner.world, recurrent, max_envs)
        return cls(learner, learner.check, columns, learner.device, recurrent,
                   max_envs=max_envs)

    def on_message(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.UNROLL:
            raise wire.ProtocolError(f"{self.port} port takes '{wire.UNROLL}', "
                                     f"not '{msg.type}'")
        # everything, before we count, store or credit
        n = check_unroll(msg, self.check, self.recurrent)
        if n > self.max_envs:
            raise wire.ProtocolError(f"an unroll of {n} envs exceeds this learner's "
                                     f"max_unroll_envs {self.max_envs}")
        self.env_steps += msg["action"].shape[0] * n
        if "ep_return" in msg.arrays:
            self.episodes.add(msg["ep_return"], msg["ep_length"])
        self.queue.append(({k: msg[k] for k in self.keys}, msg.fields.get("version", 0)))
        self.queued_columns += n
        # Credit on receipt (not when trained on): a producer may then have its credit's
        # worth in flight while we train, and a batch that needs more messages than one
        # producer's credit can still fill.
        self.node.grant_credit(self.port, envelope)
        if self.queued_columns >= self.hold_columns and not self.holding:
            self.holding = True
            self.node.set_polling(self.port, False)

    def next_batch(self, version: int) -> Batch | None:
        if self.queued_columns < self.columns:
            return None
        arrays = self._take(self.columns, version)
        return Batch(self.to_device.batch(arrays))

    def _take(self, columns: int, version: int) -> dict[str, np.ndarray]:
        """The first ``columns`` queued env columns, [T(+1), columns, ...] per key."""
        parts: list[dict[str, np.ndarray]] = []
        need = columns
        while need:
            arrays, acted = self.queue[0]
            n = arrays["action"].shape[1]
            if n <= need:
                self.queue.popleft()
                parts.append(arrays)
            else:  # split along the env axis; the rest stays first in line
                parts.append({k: v[:, :need] for k, v in arrays.items()})
                self.queue[0] = ({k: v[:, need:] for k, v in arrays.items()}, acted)
            self.lags.append(version - acted)
            need -= min(n, need)
        self.queued_columns -= columns
        if self.holding and self.queued_columns < self.hold_columns:
            self.holding = False
            self.node.set_polling(self.port, True)
        return {k: np.concatenate([p[k] for p in parts], axis=1) for k in self.keys}

    def done(self, batch: Batch, priorities: torch.Tensor | None) -> None:
        pass  # unrolls are trained on once; nothing goes back

    def poll(self) -> None:
        pass

    def peers(self) -> frozenset[str]:
        return frozenset()  # producers connect to us: we wait on no one peer

    def lost(self) -> None:
        pass  # producers connect to us; their credit comes back by itself

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        t0, steps0 = self._rate_mark
        self._rate_mark = (now, self.env_steps)
        row = {
            "env_steps": self.env_steps,
            "steps_per_s": round((self.env_steps - steps0) / max(now - t0, 1e-9), 1),
            "episodes": self.episodes.count,
            "return_mean_20": round(self.episodes.mean_return(20), 2),
            "return_mean_100": round(self.episodes.mean_return(), 2),
            "length_mean_100": round(self.episodes.mean_length(), 1),
            "policy_lag": round(float(np.mean(self.lags)), 2) if self.lags else math.nan,
            "queue": len(self.queue),
        }
        self.lags = []
        return row

    def state(self) -> dict[str, Any]:
        return {"env_steps": self.env_steps,
                "episodes": {"returns": list(self.episodes.returns),
                             "lengths": list(self.episodes.lengths),
                             "count": self.episodes.count}}

    def restore(self, state: dict[str, Any]) -> None:
        self.env_steps = int(state["env_steps"])
        episodes = state.get("episodes")
        if episodes:
            self.episodes.returns.extend(episodes["returns"])
            self.episodes.lengths.extend(episodes["lengths"])
            self.episodes.count = int(episodes["count"])
        self._rate_mark = (time.monotonic(), self.env_steps)


class SharedUnrollInbox(UnrollInbox):
    """The inbox of data-parallel replicas (rank ``rank`` of ``world``), which pool
    what they receive so that each trains on exactly ``columns`` columns per update.

    Producers spread unrolls over the replicas by DEALER round-robin, and that need not
    be even: a replica that binds late or reconnects gets fewer (the link sends only to
    connected peers), and the phase shifts whenever a rollout is not a multiple of the
    replicas. Left alone, one replica would then hold a full batch, start its update
    and block in the gradient allreduce while the other has nothing to train on.

    So every loop turn the replicas exchange, in one small allreduce, how many columns
    each holds and whether one is stopping. When together they hold a full batch, each
    contributes in rank order, the columns are all-gathered and replica r trains on
    slice r. Every decision is a function of the exchanged numbers, so all replicas make
    the same collective calls in the same order; a stop on one stops all at the same
    point (each then writes its checkpoint at the same update).
    """

    def __init__(self, node: Any, check: messages.Context, columns: int,
                 device: torch.device, rank: int, world: int, recurrent: bool = False,
                 max_envs: int = 1024):
        super().__init__(node, check, columns, device, recurrent, max_envs=max_envs)
        self.rank, self.world = rank, world
        self.said_stop = False  # an exchange carried a stop bit: all ranks know
        T, H = check.dims["T"], check.dims.get("H", 0)
        obs, action = tuple(check.obs_shape or ()), tuple(check.action_shape or ())
        f32 = np.dtype(np.float32)
        # (leading dim, trailing dims) and dtype of each key, as messages declares them
        self.layout: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            "obs": ((T + 1, *obs), np.dtype(check.obs_dtype)),
            "action": ((T, *action), np.dtype(check.action_dtype or np.float32)),
            "logp": ((T,), f32), "reward": ((T,), f32), "done": ((T,), np.dtype(np.bool_)),
            "state_h": ((1, H), f32), "state_c": ((1, H), f32),
        }

    def _exchange(self) -> tuple[list[int], bool]:
        import torch.distributed as dist

        mine = torch.zeros(2 * self.world, dtype=torch.int64)
        mine[2 * self.rank] = self.queued_columns
        mine[2 * self.rank + 1] = int(self.node.stopping)
        dist.all_reduce(mine)
        stopping = bool(mine[1::2].any())
        self.said_stop = self.said_stop or stopping  # every rank saw it, in this exchange
        return mine[0::2].tolist(), stopping

    def close(self) -> None:
        """A stop signal that arrived during an exchange ends our loop before the next
        one could carry it: the peers would wait in their next exchange for a rank that
        is gone. Say it in one more exchange, the one they are waiting in."""
        if self.said_stop:
            return
        self.node.stopping = True
        try:
            self._exchange()
        except RuntimeError:
            pass  # the peers are gone already

    def next_batch(self, version: int) -> Batch | None:
        try:
            counts, stopping = self._exchange()
        except RuntimeError:
            # A peer that left the group: after a stop signal that reached it between
            # two exchanges (we were told to stop too, and are stopping), else a crash.
            if self.node.stopping:
                return None
            raise
        if stopping:  # one replica stops: all stop here, none left in a collective
            self.node.stopping = True
            return None
        total = self.columns * self.world
        if sum(counts) < total:
            return None
        shares, need = [], total
        for count in counts:  # rank order
            shares.append(min(count, need))
            need -= shares[-1]
        mine = self._take(shares[self.rank], version) if shares[self.rank] else {}
        lo = self.rank * self.columns
        tensors = {}
        for k in self.keys:
            joined = _all_gather_columns(mine.get(k), shares, self.rank, *self.layout[k])
            tensors[k] = self.to_device(k, joined[:, lo:lo + self.columns])
        return Batch(tensors)


def _all_gather_columns(local: np.ndarray | None, shares: list[int], rank: int,
                        shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Every rank's ``local`` [lead, shares[r], *rest] joined along the env axis in rank
    order. ``shape`` is (lead, *rest) and ``dtype`` the array's (declared, so every rank
    knows them even when it contributes nothing); padded to the widest share, because
    the collective needs equal sizes."""
    import torch.distributed as dist

    width = max(shares)
    wire_dtype = np.dtype(np.uint8) if dtype == np.bool_ else dtype  # gloo has no bool
    padded = np.zeros((shape[0], width, *shape[1:]), wire_dtype)
    if shares[rank]:
        padded[:, :shares[rank]] = local
    mine = torch.from_numpy(padded)
    out = [torch.empty_like(mine) for _ in shares]
    dist.all_gather(out, mine)
    joined = np.concatenate([o.numpy()[:, :n] for o, n in zip(out, shares, strict=True)],
                            axis=1)
    return joined.astype(dtype, copy=False)


class ReplayClient:
    """Batches from the replay behind DEALER link ``link`` of ``node``.

    Keeps at most ``prefetch`` batches asked for or waiting to be trained on. A replay
    may hold requests back for a long time (warm-up, its rate limiter); that is waiting,
    not loss, and nothing is
    resent. They are lost only when the replay is (see ``zmqrl.parts.learning.connection``):
    then the socket is reopened and the requests sent again. A ``batch`` that fails the
    checks is rejected (a ``ProtocolError``: logged and counted by the node runtime)
    and still answers its request, so we keep asking.
    """

    def __init__(self, node: Any, check: messages.Context,
                 batch_size: int | Callable[[], int], prefetch: int,
                 device: torch.device, items: str = "transitions", link: str = "replay"):
        self.node = node
        self.check = check
        # an int, or what reads the live one (a PBT member's batch_size may change)
        self._batch_size = batch_size
        self.prefetch = prefetch
        self.device = device
        self.to_device = HostToDevice(device)  # pinned, non-blocking copies on CUDA
        self.items = items  # the item kind (Parts.items): an insert/batch variant
        self.link = link
        self.keys = item_keys(items, check.arrays)
        self.batches: deque[wire.Message] = deque()
        self.in_flight = 0
        self.rejected = 0  # batches that failed the checks
        self.dropped = 0  # requests the replay dropped unserved (and we asked again)
        self.reconnects = 0
        self.watch = DisconnectWatch(node.sockets[link])

    @property
    def batch_size(self) -> int:
        size = self._batch_size
        return size() if callable(size) else size

    @batch_size.setter
    def batch_size(self, size: int | Callable[[], int]) -> None:
        self._batch_size = size

    @classmethod
    def for_learner(cls, learner: Any) -> ReplayClient:
        """Batches of the topology's item kind from the learner's ``replay`` link, of
        the algorithm's ``batch_size`` as it is now (PBT may change it)."""
        return cls(learner, learner.check, lambda: learner.algo.cfg.batch_size,
                   learner.args.prefetch, learner.device,
                   items=learner.ctx.topo.parts_config.items)

    def on_message(self, _envelope: list, msg: wire.Message) -> None:
        if msg.type == wire.ERROR and msg.fields.get("retry") is True:
            # Dropped unserved by a queue bound (someone named our client, or a flood
            # filled the replay's queue): answered all the same; poll() asks again.
            self.in_flight = max(0, self.in_flight - 1)
            self.dropped += 1
            self.node.log_rejection(self.link, f"the replay dropped a sample request: "
                                               f"{msg.fields.get('error')}")
            return
        self.node.expect_reply(msg, wire.BATCH, "the replay")
        self.in_flight = max(0, self.in_flight - 1)  # answered, good or bad
        try:
            check_batch(msg, self.check, self.items)
        except wire.ProtocolError:
            self.rejected += 1
            raise
        self.batches.append(msg)

    def next_batch(self, version: int) -> Batch | None:
        self.poll()
        if not self.batches:
            return None
        msg = self.batches.popleft()
        # the arrays of the item kind, and its importance weights as on the wire: weight
        tensors = ReadTensors({k: self.to_device(k, msg[k]) for k in self.keys})
        tensors[WEIGHT] = self.to_device(WEIGHT, msg[WEIGHT])
        source = msg.fields.get("source")
        return Batch(tensors, keys=msg["key"], source=source if type(source) is str else None)

    def done(self, batch: Batch, priorities: torch.Tensor | None) -> None:
        if priorities is not None and not bool(torch.isfinite(priorities).all()):
            # a step skipped for a non-finite loss: the items keep their priorities
            # (the replay would refuse these, and its error would end this learner)
            priorities = None
        if priorities is not None:
            # The batch's source goes back with its keys: a restarted replay, which may
            # issue the same keys for other items, then skips them instead of erring.
            extra = {"source": batch.source} if batch.source is not None else {}
            self.node.send(self.link, wire.encode(wire.PRIORITIES, {
                "key": batch.keys, "priority": priorities.numpy().astype(np.float32)},
                **extra))

    def poll(self) -> None:
        if self.watch.dropped():
            self.node.log.warning("connection to the replay dropped; asking again")
            self.lost()
        # prefetch bounds requested *and* received-but-untrained batches: a learner slower
        # than the replay (Gorila's, waiting on the parameter server) would otherwise pile
        # up batches without end, train on ever staler samples, and let the rate limiter
        # count as learned-from what only sits in this queue.
        while self.in_flight + len(self.batches) < self.prefetch:
            # client: our label, the same after a reconnect or restart, so the replay
            # replaces what an earlier connection of ours still has waiting there
            self.node.send(self.link, wire.encode(wire.SAMPLE, batch_size=self.batch_size,
                                                  client=self.node.ctx.label))
            self.in_flight += 1

    def peers(self) -> frozenset[str]:
        return frozenset({self.link})

    def lost(self) -> None:
        """The replay lost our requests: a fresh socket (late replies to the old ones
        cannot arrive), and the next :meth:`poll` asks again. Batches of the old
        connection are dropped too: a restarted replay may not know their keys, and
        their priorities would only earn an ``error``."""
        self.watch.close()
        self.node.reopen(self.link)
        self.watch.attach(self.node.sockets[self.link])
        self.in_flight = 0
        self.batches.clear()
        self.reconnects += 1

    def close(self) -> None:
        self.watch.close()

    def metrics(self) -> dict[str, Any]:
        return {"batches_waiting": len(self.batches), "batches_rejected": self.rejected,
                "requests_dropped": self.dropped, "replay_reconnects": self.reconnects}

    def state(self) -> dict[str, Any]:
        return {"env_steps": 0, "episodes": {"returns": [], "lengths": [], "count": 0}}

    def restore(self, state: dict[str, Any]) -> None:
        pass  # a replay learner keeps no episode statistics (the actors report them)
