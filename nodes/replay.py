"""Replay node: a replay service over ``zmqrl.replay`` (table + sampler + rate limiter).

``experience`` (ROUTER) takes ``insert`` messages: batch-major items (any fields; the
first insert fixes their shapes and dtypes) and an optional ``priority`` array.
``sample`` (ROUTER) takes ``sample`` requests (``batch_size``), answered with ``batch``
(``key``, ``weight`` and the items' arrays), and ``priorities`` updates (``key``,
``priority``).

The rate limiter decides when each may happen. A sample it refuses waits here (the
learner simply gets its reply later); an insert it refuses waits too, and while one
waits we stop reading ``experience``, so the actors' outboxes fill and they pause. So
neither side can outrun the other, and the metrics say which one is waiting.

Persistence: every ``checkpoint_every_s`` seconds and at exit the table (items, keys,
priorities, counters, sampler RNG) and the rate limiter's counters go to
``checkpoints/<label>.replay.npz`` in the run directory: plain arrays in an uncompressed
``np.savez`` (no pickled objects), written crash-safely (``zmqrl.checkpoint``). A replay
that finds that file when it starts (a restart after a crash, or ``zmqrl up --resume``)
restores it, so the learner does not start over from an empty buffer. Requests in
flight at a crash are lost: the learner re-sends its samples after its
``request_timeout_s`` and producers get their credit back after ``credit_timeout_s``.
The replay serves nothing while it saves; the log and the ``checkpoint_s`` metric say
how long a save took.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl import wire
from zmqrl.checkpoint import atomic_write, checkpoint_dir
from zmqrl.node import Node
from zmqrl.replay import RateLimiter, ReplayTable
from zmqrl.topology import NodeSpec, Topology

SAMPLERS = ("uniform", "prioritized", "fifo")
_LIMITER_PREFIX = "limiter/"  # rate limiter counters in the checkpoint; the rest is the table's


class Replay(Node):
    binds = {"experience": "router", "sample": "router"}
    port_hwm = {"experience": 16}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        capacity: int = 100_000
        sampler: str = "uniform"  # uniform | prioritized | fifo
        alpha: float = 0.6
        beta: float = 0.4
        beta_final: float = 1.0
        beta_steps: int = 100_000
        min_size: int = 1000  # items before the first sample
        samples_per_insert: float | None = None  # None: no ratio, only min_size
        error_buffer: float | None = None
        # seconds between checkpoints of the table (also written at exit); 0: the replay
        # neither saves nor restores its contents
        checkpoint_every_s: float = 60.0

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        args = cls.Args(**spec.args)
        where = ("nodes", spec.name, "args")
        errors = []
        if args.sampler not in SAMPLERS:
            errors.append(((*where, "sampler"), f"'{args.sampler}' is not one of "
                                                f"{', '.join(SAMPLERS)}"))
        if args.capacity < 1:
            errors.append(((*where, "capacity"), "must be >= 1"))
        try:
            limiter = RateLimiter(args.min_size, args.samples_per_insert, args.error_buffer)
            batch = topo.algo.get("batch_size")
            if isinstance(batch, int):
                limiter.check_batch(batch)
        except ValueError as exc:
            errors.append((where, f"rate limiter: {exc}"))
        if args.checkpoint_every_s < 0:
            errors.append(((*where, "checkpoint_every_s"), "must be >= 0 (0: no checkpoints)"))
        if args.min_size > args.capacity:
            errors.append(((*where, "min_size"), f"{args.min_size} exceeds capacity "
                                                 f"{args.capacity}: sampling could never start"))
        return errors

    def setup(self) -> None:
        a = self.args
        self.table = ReplayTable(a.capacity, a.sampler, a.alpha, a.beta, a.beta_final,
                                 a.beta_steps, seed=self.ctx.topo.seed)
        self.limiter = RateLimiter(a.min_size, a.samples_per_insert, a.error_buffer)
        self.waiting_samples: deque[tuple[list, int]] = deque()
        self.waiting_insert: tuple[list, wire.Message] | None = None
        self._mark = (time.monotonic(), 0, 0)
        self.sample_wait_s = 0.0  # time learners spent waiting for a sample
        self.insert_wait_s = 0.0  # time actors' inserts spent waiting
        self._waits_since: dict[str, float] = {}
        self.checkpoint_path = checkpoint_dir(self.ctx.run_dir) / f"{self.ctx.label}.replay.npz"
        self.checkpoint_s = 0.0  # how long the last save took
        self._saved_at = time.monotonic()  # when the last save ended
        self.restored_items = 0
        if a.checkpoint_every_s > 0:
            if self.checkpoint_path.exists():
                self._restore(self.checkpoint_path)
            self.every(a.checkpoint_every_s, self._periodic_checkpoint)

    # ----- inserts ------------------------------------------------------------------
    def on_experience(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.INSERT:
            raise wire.ProtocolError(f"experience port takes '{wire.INSERT}', not '{msg.type}'")
        items = {k: v for k, v in msg.arrays.items() if k != "priority"}
        sizes = {v.shape[0] if v.ndim else -1 for v in items.values()}
        if not items or len(sizes) != 1 or -1 in sizes or 0 in sizes:
            raise wire.ProtocolError("insert needs arrays with one common, non-zero first axis")
        n = sizes.pop()
        priority = msg.arrays.get("priority")
        if priority is not None and (priority.shape != (n,) or not np.all(priority >= 0)
                                     or not np.isfinite(priority).all()):
            raise wire.ProtocolError(f"insert 'priority' must be {n} finite values >= 0")
        # A NaN stored here would reach a learner in every batch that samples it.
        bad = [k for k, v in items.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
        if bad:
            raise wire.ProtocolError(f"insert fields {', '.join(sorted(bad))} hold NaN or "
                                     "infinite values")
        if self.waiting_insert is not None or not self.limiter.can_insert(n, self.table.size):
            if self.waiting_insert is not None:  # we stopped reading; cannot normally happen
                raise wire.ProtocolError("insert arrived while another was waiting")
            self.waiting_insert = (envelope, msg)
            self._waits_since["insert"] = time.monotonic()
            self.set_polling("experience", False)
            return
        self._insert(envelope, msg)

    def _insert(self, envelope: list, msg: wire.Message) -> None:
        items = {k: v for k, v in msg.arrays.items() if k != "priority"}
        try:
            self.table.insert(items, msg.arrays.get("priority"))
        except ValueError as exc:
            raise wire.ProtocolError(f"insert rejected: {exc}") from None
        self.limiter.on_insert(next(iter(items.values())).shape[0])
        self.grant_credit("experience", envelope)  # that actor may send its next insert

    # ----- samples and priorities ---------------------------------------------------
    def on_sample(self, envelope: list, msg: wire.Message) -> None:
        if msg.type == wire.PRIORITIES:
            keys, prios = msg.arrays.get("key"), msg.arrays.get("priority")
            if keys is None or prios is None or keys.shape != prios.shape or keys.ndim != 1:
                raise wire.ProtocolError("priorities needs 'key' and 'priority' of one length")
            if not np.all(prios >= 0):
                raise wire.ProtocolError("priorities must be >= 0")
            try:
                self.table.update_priorities(keys.astype(np.int64), prios)
            except ValueError as exc:  # keys we never issued, non-finite priorities
                raise wire.ProtocolError(f"priorities rejected: {exc}") from None
            return
        if msg.type != wire.SAMPLE:
            raise wire.ProtocolError(f"sample port takes '{wire.SAMPLE}' or "
                                     f"'{wire.PRIORITIES}', not '{msg.type}'")
        batch_size = msg.fields.get("batch_size")
        if type(batch_size) is not int or not 1 <= batch_size <= self.table.capacity:
            raise wire.ProtocolError(f"sample 'batch_size' must be an int in "
                                     f"[1, {self.table.capacity}], got {batch_size!r}")
        if not self.waiting_samples:
            self._waits_since["sample"] = time.monotonic()
        self.waiting_samples.append((envelope, batch_size))

    def after_poll(self) -> None:
        if self.waiting_insert is not None:
            envelope, msg = self.waiting_insert
            n = next(v for k, v in msg.arrays.items() if k != "priority").shape[0]
            if self.limiter.can_insert(n, self.table.size):
                self.waiting_insert = None
                self.insert_wait_s += time.monotonic() - self._waits_since.pop("insert")
                self.set_polling("experience", True)
                try:
                    self._insert(envelope, msg)
                except wire.ProtocolError as exc:  # as _drain would have handled it
                    self.bad_messages += 1
                    self.log.error("rejected message on 'experience': %s", exc)
                    self.send("experience", wire.error_reply(str(exc)), envelope)
        while self.waiting_samples:
            envelope, batch_size = self.waiting_samples[0]
            if not self.limiter.can_sample(batch_size, self.table.size):
                return
            self.waiting_samples.popleft()
            sample = self.table.sample(batch_size)
            self.limiter.on_sample(len(sample.keys))
            arrays = {"key": sample.keys, "weight": sample.weights, **sample.items}
            self.send("sample", wire.encode(wire.BATCH, arrays), envelope)
            now = time.monotonic()
            self.sample_wait_s += now - self._waits_since.pop("sample", now)
            if self.waiting_samples:
                self._waits_since["sample"] = now

    # ----- checkpoints ---------------------------------------------------------------
    def _periodic_checkpoint(self) -> None:
        # The timer counts from the start of a save; a buffer that takes about as long to
        # save as the period would then save back to back. Leave at least half a period
        # between the end of one save and the next, for serving.
        if time.monotonic() - self._saved_at >= 0.5 * self.args.checkpoint_every_s:
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        t0 = time.monotonic()
        state = self.table.state_dict()
        state.update({_LIMITER_PREFIX + k: v for k, v in self.limiter.state_dict().items()})
        atomic_write(self.checkpoint_path, lambda f: np.savez(f, **state))
        self._saved_at = time.monotonic()
        self.checkpoint_s = self._saved_at - t0
        self.log.info("checkpoint: %d items in %.3fs -> %s", self.table.size,
                      self.checkpoint_s, self.checkpoint_path)

    def _restore(self, path: Path) -> None:
        t0 = time.monotonic()
        with np.load(path, allow_pickle=False) as f:
            state = {k: f[k] for k in f.files}
        try:
            self.table.load_state_dict(state)
        except (KeyError, ValueError) as exc:
            # Refuse rather than silently start empty: the data may be all a run has.
            raise RuntimeError(f"cannot restore {path}: {exc}; move it away to start this "
                               "replay empty") from exc
        self.limiter.load_state_dict({k[len(_LIMITER_PREFIX):]: v for k, v in state.items()
                                      if k.startswith(_LIMITER_PREFIX)})
        self.restored_items = self.table.size
        self._mark = (time.monotonic(), self.limiter.inserts, self.limiter.samples)
        self.log.info("restored %d items (keys %d..%d) from %s in %.3fs", self.table.size,
                      self.table.oldest_key, self.table.next_key - 1, path,
                      time.monotonic() - t0)

    def teardown(self) -> None:
        if self.args.checkpoint_every_s > 0:
            self.save_checkpoint()

    def metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        t0, inserts0, samples0 = self._mark
        dt = max(now - t0, 1e-9)
        inserts, samples = self.limiter.inserts, self.limiter.samples
        self._mark = (now, inserts, samples)
        return {
            "size": self.table.size,
            "fill": round(self.table.size / self.table.capacity, 4),
            "inserts": inserts,
            "samples": samples,
            "inserts_per_s": round((inserts - inserts0) / dt, 1),
            "samples_per_s": round((samples - samples0) / dt, 1),
            "samples_per_insert": round(samples / inserts, 3) if inserts else 0.0,
            "evictions": self.table.evictions,
            "waiting_samples": len(self.waiting_samples),
            "insert_waiting": int(self.waiting_insert is not None),
            "sample_wait_s": round(self.sample_wait_s, 3),
            "insert_wait_s": round(self.insert_wait_s, 3),
            "restored_items": self.restored_items,
            "checkpoint_s": round(self.checkpoint_s, 4),
        }
