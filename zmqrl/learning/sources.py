"""Data sources of a learner: where its training batches come from.

A source takes the messages of its socket (``on_message``), hands out training batches
(``next_batch``: a dict of tensors, or None while it has none), is told what training on
one gave (``done``: new priorities) and keeps its requests going (``poll``). Two exist:

* :class:`UnrollInbox` (unroll algorithms): unrolls arrive on the learner's bound
  ``experience`` port from an inference broker or local-policy actors, under credit
  (``zmqrl.node.Outbox``); it checks them, queues them and stacks ``columns`` env
  columns into each batch, and measures the policy lag.
* :class:`ReplayClient` (replay and sequence algorithms): it asks the ``replay`` link
  for batches, keeping ``prefetch`` requests in flight so the replay works while we
  train, and sends the new priorities back.

Both are transport-agnostic about training: what a batch trains is the updater's
business (``zmqrl.learning.updaters``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from zmqrl import wire
from zmqrl.learning.checks import (
    SEQUENCE_KEYS,
    STATE_KEYS,
    TRANSITION_KEYS,
    UNROLL_KEYS,
    ExperienceSpec,
    check_batch,
    check_unroll,
)
from zmqrl.learning.connection import DisconnectWatch
from zmqrl.metrics import EpisodeStats


@dataclass
class Batch:
    """A training batch and what its source needs back after training on it."""

    tensors: dict[str, torch.Tensor]
    keys: np.ndarray | None = None  # replay keys, for the new priorities


class Source(Protocol):
    def on_message(self, envelope: list, msg: wire.Message) -> None: ...

    def next_batch(self, version: int) -> Batch | None: ...

    def done(self, batch: Batch, priorities: torch.Tensor | None) -> None: ...

    def poll(self) -> None: ...

    def lost(self) -> None: ...

    def metrics(self) -> dict[str, Any]: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


class UnrollInbox:
    """Unrolls from the ROUTER port ``port`` of ``node``, ``columns`` env columns a batch.

    A batch is exactly ``columns`` columns: an unroll that does not fit is split and its
    rest waits for the next batch (so data-parallel replicas always train on equal
    shares). At most one batch's worth waits here; the rest waits in the producers'
    outboxes (credit: backpressure, nothing dropped).
    """

    def __init__(self, node: Any, spec: ExperienceSpec, columns: int,
                 device: torch.device, port: str = "experience"):
        self.node = node
        self.spec = spec
        self.columns = columns
        self.device = device
        self.port = port
        self.keys = UNROLL_KEYS + (STATE_KEYS if spec.state_size else ())
        # (arrays of self.keys [T(+1), n, ...], parameter version that acted) per unroll
        self.queue: deque[tuple[dict[str, np.ndarray], int]] = deque()
        self.queued_columns = 0
        self.env_steps = 0
        self.episodes = EpisodeStats(window=100)
        self.lags: list[int] = []
        self._rate_mark = (time.monotonic(), 0)

    def on_message(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.UNROLL:
            raise wire.ProtocolError(f"{self.port} port takes '{wire.UNROLL}', "
                                     f"not '{msg.type}'")
        n = check_unroll(msg, self.spec)  # everything, before we count, store or credit
        self.env_steps += msg["action"].shape[0] * n
        if "ep_return" in msg.arrays:
            self.episodes.add(msg["ep_return"], msg["ep_length"])
        self.queue.append(({k: msg[k] for k in self.keys}, msg.fields.get("version", 0)))
        self.queued_columns += n
        # Credit on receipt (not when trained on): a producer may then have its credit's
        # worth in flight while we train, and a batch that needs more messages than one
        # producer's credit can still fill.
        self.node.grant_credit(self.port, envelope)

    def next_batch(self, version: int) -> Batch | None:
        if self.queued_columns < self.columns:
            return None
        parts: list[dict[str, np.ndarray]] = []
        need = self.columns
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
        self.queued_columns -= self.columns
        tensors = {k: torch.from_numpy(np.concatenate([p[k] for p in parts], axis=1))
                   .to(self.device) for k in self.keys}
        return Batch(tensors)

    def done(self, batch: Batch, priorities: torch.Tensor | None) -> None:
        pass  # unrolls are trained on once; nothing goes back

    def poll(self) -> None:
        pass

    def lost(self) -> None:
        pass  # producers connect to us; their credit comes back by itself

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


class ReplayClient:
    """Batches from the replay behind DEALER link ``link`` of ``node``.

    Keeps ``prefetch`` ``sample`` requests in flight. A replay may hold them back for a
    long time (warm-up, its rate limiter); that is waiting, not loss, and nothing is
    resent. They are lost only when the replay is (see ``zmqrl.learning.connection``):
    then the socket is reopened and the requests sent again. A ``batch`` that fails the
    checks is rejected (a ``ProtocolError``: logged and counted by the node runtime)
    and still answers its request, so we keep asking.
    """

    def __init__(self, node: Any, spec: ExperienceSpec, batch_size: int, prefetch: int,
                 device: torch.device, sequences: bool = False, link: str = "replay"):
        self.node = node
        self.spec = spec
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.device = device
        self.sequences = sequences
        self.link = link
        self.keys = SEQUENCE_KEYS if sequences else TRANSITION_KEYS
        self.batches: deque[wire.Message] = deque()
        self.in_flight = 0
        self.rejected = 0  # batches that failed the checks
        self.reconnects = 0
        self.watch = DisconnectWatch(node.sockets[link])

    def on_message(self, _envelope: list, msg: wire.Message) -> None:
        self.node.expect_reply(msg, wire.BATCH, "the replay")
        self.in_flight = max(0, self.in_flight - 1)  # answered, good or bad
        try:
            check_batch(msg, self.spec, self.sequences)
        except wire.ProtocolError:
            self.rejected += 1
            raise
        self.batches.append(msg)

    def next_batch(self, version: int) -> Batch | None:
        self.poll()
        if not self.batches:
            return None
        msg = self.batches.popleft()
        tensors = {k: torch.from_numpy(np.array(msg[k])).to(self.device) for k in self.keys}
        tensors["weights"] = torch.from_numpy(np.array(msg["weight"])).to(self.device)
        return Batch(tensors, keys=msg["key"])

    def done(self, batch: Batch, priorities: torch.Tensor | None) -> None:
        if priorities is not None:
            self.node.send(self.link, wire.encode(wire.PRIORITIES, {
                "key": batch.keys, "priority": priorities.numpy().astype(np.float32)}))

    def poll(self) -> None:
        if self.watch.dropped():
            self.node.log.warning("connection to the replay dropped; asking again")
            self.lost()
        while self.in_flight < self.prefetch:
            self.node.send(self.link, wire.encode(wire.SAMPLE, batch_size=self.batch_size))
            self.in_flight += 1

    def lost(self) -> None:
        """The replay lost our requests: a fresh socket (late replies to the old ones
        cannot arrive), and the next :meth:`poll` asks again."""
        self.watch.close()
        self.node.reopen(self.link)
        self.watch.attach(self.node.sockets[self.link])
        self.in_flight = 0
        self.reconnects += 1

    def metrics(self) -> dict[str, Any]:
        return {"batches_waiting": len(self.batches), "batches_rejected": self.rejected,
                "replay_reconnects": self.reconnects}

    def state(self) -> dict[str, Any]:
        return {"env_steps": 0, "episodes": {"returns": [], "lengths": [], "count": 0}}

    def restore(self, state: dict[str, Any]) -> None:
        pass  # a replay learner keeps no episode statistics (the actors report them)
