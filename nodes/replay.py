"""Replay node: a replay service over ``zmqrl.parts.replay`` (table + sampler + rate limiter).

``experience`` (ROUTER) takes ``insert`` messages: batch-major items and an optional
``priority`` array. Their fields, dtypes, shapes and values are checked against the
run's env and algorithm before anything is stored (``zmqrl.bus.messages``: ``insert``
transitions or sequences; actions inside the action space, finite floats, discounts in
[0, 1], bool dones), because a bad item would be served to every learner again and
again. ``sample`` (ROUTER) takes
``sample`` requests (``batch_size``, optional ``client``), answered with ``batch``
(``key``, ``weight`` and the items' arrays; field ``source``: this replay's
incarnation), and ``priorities`` updates (``key``, ``priority``, optional ``source``).

Keys are unique only within one incarnation: a restarted replay issues again the keys
its previous incarnation issued after its last checkpoint. So a ``priorities`` message
that names another ``source`` than ours is stale: skipped and counted
(``stale_priority_updates``), never applied to whatever holds those keys now, and not
an error (a learner should not fail over a replay restart). Learners echo the batch's
``source`` in their ``priorities``. Priorities are the sampling learner's: they are
applied only for keys this replay sent to the connection that sends them
(``zmqrl.parts.replay.served``); others are skipped, counted
(``unserved_priority_updates``) and logged. And no stored priority is below
``priority_floor`` times the mean, so no item can rescale the others' weights by
orders of magnitude (``zmqrl.parts.replay.table``).

A **reviser** (a reanalyse node, e.g. MuZero Reanalyse) rewrites stored items with
fresher targets: a ``sample`` with ``revise: true`` is answered at once with items drawn
uniformly, outside the rate limiter and every counter (the learners' ratio stays
theirs), and ``revise`` (``key``, the revised arrays, ``source``) overwrites the arrays of
the items still held. What may be revised is the item kind's ``revise`` declaration
(``zmqrl.bus.messages``: a plug-in's MessageSet declares it); keys of another
incarnation, or evicted since, are skipped and counted (``stale_revisions``). Revision
peeks are bounded as samples are: served only where the topology links a reviser to
this port (``Node.revise_batch``), at most the largest batch a linked reviser asks for,
one outstanding per connection until its ``revise`` comes (or ``revise_timeout_s``
passes), a few connections at a time, and, with ``revisions_per_insert``, no more items
handed to revisers than that many per item inserted (``error`` with ``retry`` past it).

The rate limiter decides when each may happen. A sample it refuses waits here (the
learner simply gets its reply later); an insert it refuses waits too, and while one
waits we stop reading ``experience``, so the actors' outboxes fill and they pause. So
neither side can outrun the other, and the metrics say which one is waiting. Waiting
samples are bounded (``zmqrl.parts.replay.waiting``): per peer, per client (a learner that
reconnects or restarts replaces its old requests) and in all; a request whose peer is
gone when its turn comes is dropped with the rest of that peer's, its sample undone.

Persistence (``zmqrl.parts.checkpoint``: this node is the Saveable, a Checkpointer decides
when): every ``checkpoint_every_s`` seconds (counted from the end of the last save) and
at exit the table (items, keys, priorities, counters, sampler RNG) and the rate
limiter's counters go to ``checkpoints/<label>.replay.npz`` in the run directory: plain
arrays in an uncompressed ``np.savez`` (no pickled objects), written crash-safely. A replay
that finds that file when it starts (a restart after a crash, or ``zmqrl up --resume``)
restores it, so the learner does not start over from an empty buffer. Requests in
flight at a crash are lost: the learner asks again when the connection drops or the
replay goes silent, and producers recount their credit from our new incarnation.
The replay serves nothing while it saves; the log and the ``checkpoint_s`` metric say
how long a save took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.bus import messages, wire
from zmqrl.bus.node import Node
from zmqrl.parts import algo_config, bounds
from zmqrl.parts.checkpoint import NPZ, Checkpointer, node_checkpoint
from zmqrl.parts.envs import env_spec
from zmqrl.parts.replay import RateLimiter, ReplayTable
from zmqrl.parts.replay.revisions import RevisionGate
from zmqrl.parts.replay.served import ServedKeys
from zmqrl.parts.replay.table import NORMALIZATIONS
from zmqrl.parts.replay.waiting import Request, WaitingSamples
from zmqrl.run.topology import NodeSpec, Topology, load_class

SAMPLERS = ("uniform", "prioritized", "fifo")
_SAMPLE = messages.spec(wire.SAMPLE)
_PRIORITIES = messages.spec(wire.PRIORITIES)
_LIMITER_PREFIX = "limiter/"  # rate limiter counters in the checkpoint; the rest is the table's


class Replay(Node):
    binds = {"experience": "router", "sample": "router"}
    accepts = {"experience": (wire.INSERT,),
               "sample": (wire.SAMPLE, wire.PRIORITIES, wire.REVISE)}
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
        # prioritized: importance weights relative to the largest any held item could
        # get (table) or to the largest in the batch (batch); zmqrl.parts.replay.table
        normalize_weights: str = "table"
        # prioritized: a stored priority is at least this times the mean one, so one
        # tiny priority cannot scale every other item's weight by orders of magnitude
        priority_floor: float = 0.01
        min_size: int = 1000  # items before the first sample
        samples_per_insert: float | None = None  # None: no ratio, only min_size
        error_buffer: float | None = None
        # seconds between checkpoints of the table (also written at exit); 0: the replay
        # neither saves nor restores its contents
        checkpoint_every_s: float = 60.0
        # sample requests held back by the rate limiter: per peer, and in all
        max_waiting_per_peer: int = 16
        max_waiting: int = 1024
        # items handed to revisers (reanalyse) per item inserted; None: no ratio
        revisions_per_insert: float | None = None
        # a revision peek not followed by its revise within this long no longer counts
        # as outstanding on its connection
        revise_timeout_s: float = 60.0

    @classmethod
    def samples_by_priority(cls, spec: NodeSpec) -> bool:
        """Whether this replay samples by priority, so that inserts should carry |δ|
        (``zmqrl.parts.dqn.acting.replay_samples_by_priority`` asks)."""
        return spec.args.get("sampler", "uniform") == "prioritized"

    @classmethod
    def runs_torch(cls, spec: NodeSpec) -> bool:
        return False  # numpy arrays in, numpy arrays out

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: Topology) -> list[tuple[tuple, str]]:
        args = cls.Args(**spec.args)
        where = ("nodes", spec.name, "args")
        errors = []
        if args.sampler not in SAMPLERS:
            errors.append(((*where, "sampler"), f"'{args.sampler}' is not one of "
                                                f"{', '.join(SAMPLERS)}"))
        if args.normalize_weights not in NORMALIZATIONS:
            errors.append(((*where, "normalize_weights"),
                           f"'{args.normalize_weights}' is not one of "
                           f"{', '.join(NORMALIZATIONS)}"))
        if args.capacity < 1:
            errors.append(((*where, "capacity"), "must be >= 1"))
        if not 0 <= args.priority_floor < 1:
            errors.append(((*where, "priority_floor"), "must be in [0, 1)"))
        try:
            limiter = RateLimiter(args.min_size, args.samples_per_insert, args.error_buffer)
            batch = algo_config.field_value(topo.algo, "batch_size")  # default included
            largest, unknown = largest_insert(spec.name, topo)
            if type(batch) is int:
                limiter.check_batch(batch, largest)
            if limiter.samples_per_insert is not None:
                # The runtime refuses an insert too large to fit; a producer that cannot
                # tell its largest would find out only then, so it must say.
                errors += [(("nodes", producer), "cannot tell the largest insert it sends to "
                            f"'{spec.name}', whose rate limiter must fit it: give its class "
                            "a largest_insert, or a command: node 'args.largest_insert'")
                           for producer in unknown]
        except ValueError as exc:
            errors.append((where, f"rate limiter: {exc}"))
        for name in ("max_waiting_per_peer", "max_waiting"):
            if getattr(args, name) < 1:
                errors.append(((*where, name), "must be >= 1"))
        if args.revisions_per_insert is not None and not args.revisions_per_insert > 0:
            errors.append(((*where, "revisions_per_insert"), "must be > 0 (or null: no ratio)"))
        if not args.revise_timeout_s > 0:
            errors.append(((*where, "revise_timeout_s"), "must be > 0"))
        if args.checkpoint_every_s < 0:
            errors.append(((*where, "checkpoint_every_s"), "must be >= 0 (0: no checkpoints)"))
        if args.min_size > args.capacity:
            errors.append(((*where, "min_size"), f"{args.min_size} exceeds capacity "
                                                 f"{args.capacity}: sampling could never start"))
        # A learner samples algo.batch_size items (transitions, sequences or positions:
        # the unit of capacity too); more than the table holds is refused every time.
        sampled = any(target == f"{spec.name}.sample"
                      for other in topo.nodes.values() for target in other.all_targets())
        wanted = algo_config.field_value(topo.algo, "batch_size")
        if sampled and bounds.is_number(wanted) and wanted > args.capacity:
            errors.append(((*where, "capacity"),
                           f"{args.capacity} items cannot hold one sample of algo.batch_size "
                           f"{wanted} items: every sample request would be refused"))
        return errors

    def setup(self) -> None:
        a = self.args
        topo = self.ctx.topo
        self._empty_table()
        # What producers must insert: the item kind of the algorithm's family (n-step
        # transitions, R2D2's sequences, AlphaZero's positions); the declarations are
        # zmqrl.bus.messages'.
        # (A replay in a topology whose learner takes unrolls holds transitions: what a
        # replay holds when nothing names its items.)
        parts = topo.parts_config
        items = "transitions" if parts.unrolls else parts.items
        self.insert_spec = messages.spec(wire.INSERT, items)
        # What a reviser (a reanalyse node) may rewrite of the items: the item kind's
        # ``revise`` variant, where its declarations have one.
        self.items = items
        try:
            self.revise_spec: messages.MessageSpec | None = messages.spec(wire.REVISE, items)
        except KeyError:
            self.revise_spec = None
        self.peek_rng = np.random.default_rng(topo.seed + 7)
        self.revised = self.stale_revisions = 0  # items rewritten; for evicted keys
        # Revision peeks: bounded by the largest batch a linked reviser asks for (none
        # linked: refused) and by connections holding one (room for reconnects).
        max_batch, revisers = linked_revisers(self.ctx.spec.name, topo)
        self.revisions = RevisionGate(max_batch, 2 * revisers, self.args.revisions_per_insert,
                                      self.args.revise_timeout_s)
        # (the algorithm fixes what its items' layout depends on, e.g. MuZero's K: the
        # first insert cannot set it for everyone)
        self.checks = messages.Context.from_env(
            env_spec(topo.env),
            sequence_length=getattr(topo.algo_config, "sequence_length", None),
            algo=topo.algo_config)
        self.waiting_samples = WaitingSamples(a.max_waiting_per_peer, a.max_waiting)
        self.waiting_insert: tuple[list, wire.Message, int] | None = None
        # The algorithm's batch: what sizes the largest insert the rate limiter can
        # always admit (validate checked the producers' largest inserts against it).
        batch = getattr(topo.algo_config, "batch_size", 1)
        self.largest_batch = batch if type(batch) is int and batch >= 1 else 1
        self.refused_inserts = 0  # inserts too large to ever fit (error replies)
        self.largest_insert_seen = 0  # items in the largest insert admitted
        self._mark = (time.monotonic(), 0, 0)
        self.sample_wait_s = 0.0  # time learners spent waiting for a sample
        self.insert_wait_s = 0.0  # time actors' inserts spent waiting
        self._waits_since: dict[str, float] = {}
        self.stale_priorities = 0  # priorities messages for another incarnation's keys
        # priorities are taken only for keys served to the connection that sends them
        # (zmqrl.parts.replay.served): a window of the newest batches sent
        self.served = ServedKeys()
        self.unserved_priorities = 0  # keys in priorities that their sender was not served
        self.restored_items = 0
        self.dropped_restored_items = 0  # restored, but of another layout than the run's
        self.checkpointer: Checkpointer | None = None
        if a.checkpoint_every_s > 0:
            self.checkpointer = Checkpointer(
                node_checkpoint(self.ctx.run_dir, self.ctx.label, ".replay" + NPZ.suffix),
                self, every_s=a.checkpoint_every_s, format=NPZ, log=self.log)
            t0 = time.monotonic()
            if self.checkpointer.restore_if_present():
                self.log.info("restored %d items (keys %d..%d) from %s in %.3fs",
                              self.table.size, self.table.oldest_key, self.table.next_key - 1,
                              self.checkpointer.path, time.monotonic() - t0)
                self._drop_restored_items_unlike_the_run()

    def _empty_table(self) -> None:
        """A new empty table and rate limiter, as the args say."""
        a = self.args
        self.table = ReplayTable(a.capacity, a.sampler, a.alpha, a.beta, a.beta_final,
                                 a.beta_steps, seed=self.ctx.topo.seed,
                                 normalize=a.normalize_weights,  # type: ignore[arg-type]
                                 floor=a.priority_floor)
        self.limiter = RateLimiter(a.min_size, a.samples_per_insert, a.error_buffer)

    # ----- inserts ------------------------------------------------------------------
    def on_experience(self, envelope: list, msg: wire.Message) -> None:
        if msg.type != wire.INSERT:
            raise wire.ProtocolError(f"experience port takes '{wire.INSERT}', not '{msg.type}'")
        n = messages.check(msg, self.insert_spec, self.checks)["B"]
        self._refuse_if_too_large(n)
        if not self.limiter.can_insert(n, self.table.size):
            if self.waiting_insert is not None:  # we stopped reading; cannot normally happen
                raise wire.ProtocolError("insert arrived while another was waiting")
            self.waiting_insert = (envelope, msg, n)
            self._waits_since["insert"] = time.monotonic()
            self.set_polling("experience", False)
            return
        self._insert(envelope, msg, n)

    def _too_large(self, n: int) -> str | None:
        """Why an insert of ``n`` items must be refused, or None. One too large for the
        rate limiter's window could wait for good (``RateLimiter.largest_fitting_insert``),
        and while it waits no other insert is read: refused, naming the limit, rather
        than the run stopping without a word. (While the table fills to ``min_size``
        every insert goes in, as it always did.)"""
        largest = self.limiter.largest_fitting_insert(self.largest_batch)
        if largest is None or n <= largest or \
                self.table.size + n <= self.limiter.min_size_to_sample:
            return None
        return (f"an insert of {n} items can never be admitted: with samples_per_insert "
                f"{self.limiter.samples_per_insert:g}, error_buffer "
                f"{self.limiter.error_buffer:g} and samples of {self.largest_batch} items "
                f"at most {largest} fit in one insert (send smaller inserts, or raise the "
                "replay's error_buffer)")

    def _refuse_if_too_large(self, n: int) -> None:
        problem = self._too_large(n)
        if problem is not None:
            self.refused_inserts += 1
            raise wire.ProtocolError(problem)

    def _insert(self, envelope: list, msg: wire.Message, n: int) -> None:
        items = {k: v for k, v in msg.arrays.items() if k != "priority"}
        try:
            self.table.insert(items, msg.arrays.get("priority"))
        except ValueError as exc:  # fields that differ from the table's
            raise wire.ProtocolError(f"insert rejected: {exc}") from None
        self.limiter.on_insert(n)
        self.largest_insert_seen = max(self.largest_insert_seen, n)
        self.grant_credit("experience", envelope)  # that actor may send its next insert

    # ----- samples and priorities ---------------------------------------------------
    def on_sample(self, envelope: list, msg: wire.Message) -> None:
        if msg.type == wire.PRIORITIES:
            self._priorities(envelope, msg)
            return
        if msg.type == wire.REVISE:
            self._revise(envelope, msg)
            return
        if msg.type != wire.SAMPLE:
            raise wire.ProtocolError(f"sample port takes '{wire.SAMPLE}', "
                                     f"'{wire.PRIORITIES}' or '{wire.REVISE}', not "
                                     f"'{msg.type}'")
        messages.check(msg, _SAMPLE, self.checks)
        batch_size = msg.fields["batch_size"]
        if batch_size > self.table.capacity:
            raise wire.ProtocolError(f"sample 'batch_size' must be at most the capacity, "
                                     f"{self.table.capacity}, got {batch_size}")
        if msg.fields.get("revise") is True:
            self._peek(envelope, batch_size)
            return
        if batch_size > self.largest_batch:
            # Larger than the algorithm's batch, which sizes the inserts we admit: it must
            # still be servable beside the largest insert taken so far, or it would wait
            # at the head of the queue for good, and every request behind it with it.
            # (A request never changes what inserts are admitted: anyone can send one.)
            try:
                self.limiter.check_batch(batch_size, max(1, self.largest_insert_seen))
            except ValueError as exc:
                raise wire.ProtocolError(f"sample refused: {exc}") from None
        client = msg.fields.get("client")
        if client is not None and type(client) is not str:
            raise wire.ProtocolError(f"sample 'client' must be a str, got {client!r:.40}")
        if not self.waiting_samples:
            self._waits_since["sample"] = time.monotonic()
        self.waiting_samples.add(Request(envelope, batch_size, client))
        for evicted in self.waiting_samples.take_evicted():
            # (its peer may be live: a forged client or a flood of requests dropped it)
            self.send("sample", wire.encode(wire.ERROR, error="sample request dropped "
                                            "unserved (a queue bound of this replay); "
                                            "ask again", retry=True), evicted.envelope)

    def _priorities(self, envelope: list, msg: wire.Message) -> None:
        messages.check(msg, _PRIORITIES, self.checks)
        keys, prios = msg["key"], msg["priority"]
        source = msg.fields.get("source")
        if source is not None and type(source) is not str:
            raise wire.ProtocolError(f"priorities 'source' must be a str, got {source!r:.40}")
        if source is not None and source != self.incarnation:
            # Keys from another incarnation: ours may name other items now, or none yet.
            self.stale_priorities += 1
            self.table.stale_priority_updates += int(keys.shape[0])
            return
        mine = self.served.claimed(b"".join(bytes(f) for f in envelope), keys)
        if not mine.all():
            # Keys this connection was not sent (a stranger's, or a learner's answered
            # after the window): never applied, since whoever sends them would be
            # setting the priorities of items someone else trained on.
            unserved = int(keys.shape[0] - mine.sum())
            self.unserved_priorities += unserved
            self.log_rejection("sample", f"skipped the priorities of {unserved} keys "
                                         "this connection was not served")
            keys, prios = keys[mine], prios[mine]
        try:
            self.table.update_priorities(keys, prios)
        except ValueError as exc:  # keys we never issued
            raise wire.ProtocolError(f"priorities rejected: {exc}") from None

    # ----- revisions (a reanalyse node) -------------------------------------------------
    def _peek(self, envelope: list, batch_size: int) -> None:
        """A reviser's sample: answered now, uniform, outside the rate limiter (what
        it revises is not trained on by it; the learners' ratio stays theirs), and
        bounded (the module docstring): a stranger's peeks cannot pile batches up here
        or in the socket's queue."""
        if self.revise_spec is None:
            raise wire.ProtocolError(f"this replay's items ({self.items}) declare no "
                                     f"'{wire.REVISE}' variant: nothing of them can be revised")
        key = b"".join(bytes(f) for f in envelope)
        invalid = self.revisions.invalid(key, batch_size)
        if invalid is not None:
            raise wire.ProtocolError(invalid)
        why = self.revisions.wait(batch_size, self.limiter.inserts, self.table.size,
                                  self.limiter.min_size_to_sample)
        if why is not None:
            self.send("sample", wire.encode(wire.ERROR, retry=True, error=f"{why}; ask again"),
                      envelope)
            return
        sample = self.table.peek(batch_size, self.peek_rng)
        arrays = {"key": sample.keys, "weight": sample.weights, **sample.items}
        if self.send("sample", wire.encode(wire.BATCH, arrays, source=self.incarnation),
                     envelope):
            self.revisions.served(key, batch_size)

    def _revise(self, envelope: list, msg: wire.Message) -> None:
        if self.revise_spec is None:
            raise wire.ProtocolError(f"this replay's items ({self.items}) declare no "
                                     f"'{wire.REVISE}' variant: nothing of them can be revised")
        messages.check(msg, self.revise_spec, self.checks)
        # that connection's peek is answered: it may peek again
        self.revisions.answered(b"".join(bytes(f) for f in envelope))
        source = msg.fields.get("source")
        keys = msg["key"]
        if source != self.incarnation:
            self.stale_revisions += int(keys.shape[0])  # another incarnation's keys
            return
        arrays = {k: v for k, v in msg.arrays.items() if k != "key"}
        try:
            applied = self.table.revise(keys, arrays)
        except ValueError as exc:
            raise wire.ProtocolError(f"revise rejected: {exc}") from None
        self.revised += applied
        self.stale_revisions += int(keys.shape[0]) - applied

    def after_poll(self) -> None:
        if self.waiting_insert is not None:
            envelope, msg, n = self.waiting_insert
            if self.limiter.can_insert(n, self.table.size) or self._too_large(n):
                self.waiting_insert = None
                self.insert_wait_s += time.monotonic() - self._waits_since.pop("insert")
                self.set_polling("experience", True)
                try:
                    # (a learner asked for a larger batch since it came: it may no
                    # longer fit, and is refused now rather than wait for good)
                    self._refuse_if_too_large(n)
                    self._insert(envelope, msg, n)
                except wire.ProtocolError as exc:  # as _drain would have handled it
                    self.bad_messages += 1
                    self.log_rejection("experience", f"rejected message on 'experience': {exc}")
                    self.send("experience", wire.error_reply(str(exc)), envelope)
        self._serve_samples()
        if self.checkpointer is not None and self.checkpointer.maybe_save():
            self._log_save()

    def _serve_samples(self) -> None:
        waiting = self.waiting_samples
        while waiting:
            request = waiting.first()
            if not self.limiter.can_sample(request.batch_size, self.table.size):
                break
            waiting.pop()
            sample = self.table.sample(request.batch_size)
            arrays = {"key": sample.keys, "weight": sample.weights, **sample.items}
            if not self.send("sample", wire.encode(wire.BATCH, arrays, source=self.incarnation),
                             request.envelope):
                # The peer is gone (or not reading): undo the sample, so it counts against
                # no ratio and fifo items stay, and drop what else that peer left here.
                self.table.undo_sample(sample)
                waiting.dropped += 1  # this one, popped already
                waiting.drop_peer(request.peer)
            else:
                self.limiter.on_sample(len(sample.keys))
                self.served.served(b"".join(bytes(f) for f in request.envelope),
                                   sample.keys)
            now = time.monotonic()
            self.sample_wait_s += now - self._waits_since.pop("sample", now)
            if waiting:
                self._waits_since["sample"] = now

    # ----- checkpoints (zmqrl.parts.checkpoint.Saveable) ------------------------------------
    def state(self) -> dict[str, Any]:
        state = self.table.state_dict()
        state.update({_LIMITER_PREFIX + k: v for k, v in self.limiter.state_dict().items()})
        return state

    def restore(self, state: dict[str, Any]) -> None:
        self.table.load_state_dict(state)
        self.limiter.load_state_dict({k[len(_LIMITER_PREFIX):]: v for k, v in state.items()
                                      if k.startswith(_LIMITER_PREFIX)})
        self.restored_items = self.table.size
        self._mark = (time.monotonic(), self.limiter.inserts, self.limiter.samples)

    def _drop_restored_items_unlike_the_run(self) -> None:
        """Restored items of another layout than this run's inserts (a ``--resume``
        that changed e.g. MuZero's ``unroll_steps``) would make every insert fail
        against the table's fields: they are dropped, with a count, and the table
        starts empty. Judged by checking one held item as an insert of this run."""
        if self.table.size == 0:
            return
        item = self.table.peek(1, np.random.default_rng(0))
        try:
            messages.check(wire.decode(wire.encode(wire.INSERT, item.items)),
                           self.insert_spec, self.checks)
            return
        except wire.ProtocolError as exc:
            problem = str(exc)
        self.dropped_restored_items = self.table.size
        self._empty_table()
        self.restored_items = 0
        self.log.warning("dropped the %d restored items: they are not what this run "
                         "inserts (%s)", self.dropped_restored_items, problem)

    def _log_save(self) -> None:
        assert self.checkpointer is not None
        self.log.info("checkpoint: %d items in %.3fs -> %s", self.table.size,
                      self.checkpointer.last_save_s, self.checkpointer.path)

    def teardown(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.save()
            self._log_save()

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
            "refused_inserts": self.refused_inserts,
            "sample_wait_s": round(self.sample_wait_s, 3),
            "insert_wait_s": round(self.insert_wait_s, 3),
            "waiting_dropped": self.waiting_samples.dropped,
            "stale_priority_updates": self.table.stale_priority_updates,
            "unserved_priority_updates": self.unserved_priorities,
            "revised": self.revised,
            "revision_peeks": self.revisions.peeked,
            "refused_peeks": self.revisions.refused,
            "stale_revisions": self.stale_revisions,
            "restored_items": self.restored_items,
            "dropped_restored_items": self.dropped_restored_items,
            "checkpoint_s": round(self.checkpointer.last_save_s if self.checkpointer else 0.0, 4),
        }


_UNLOADABLE = object()  # a class the topology check reports: nothing to ask


def _declared(spec: NodeSpec, topo: Topology, hook: str) -> Any:
    """What node ``spec`` declares through its class's ``hook`` (``largest_insert``,
    ``revise_batch``) or, for a ``command:`` node (an external program), its
    ``args.<hook>``: a positive int or None; ``_UNLOADABLE`` for a class that fails to
    load."""
    if spec.target is None:
        found = spec.args.get(hook)
        return found if type(found) is int and found >= 1 else None
    try:
        return getattr(load_class(spec.target), hook)(spec, topo)
    except (ImportError, AttributeError, TypeError, ValueError):
        return _UNLOADABLE


def linked_revisers(name: str, topo: Topology) -> tuple[int, int]:
    """The revisers linked to replay ``name``'s ``sample`` port: the largest batch one
    asks for (``Node.revise_batch``; a ``command:`` node its ``args.revise_batch``) and
    their replicas in all; ``(0, 0)`` where none is."""
    largest = replicas = 0
    for spec in topo.nodes.values():
        if any(spec.links_to(link, f"{name}.sample") for link in spec.links):
            found = _declared(spec, topo, "revise_batch")
            if found and found is not _UNLOADABLE:
                largest = max(largest, found)
                replicas += spec.replicas
    return largest, replicas


def largest_insert(name: str, topo: Topology) -> tuple[int, list[str]]:
    """The most items one insert into replay ``name`` can carry, as far as the topology
    tells: the largest any producer linked to its ``experience`` port declares
    (``Node.largest_insert``: an actor one step's items of all its envs, a broker one
    connection's worth, an MCTS actor its ``max_insert_positions`` and one game more;
    a ``command:`` node its ``args.largest_insert``), and the producers that cannot
    tell."""
    largest, unknown = 1, []
    for spec in topo.nodes.values():
        if not spec.links_to("experience", f"{name}.experience"):
            continue
        found = _declared(spec, topo, "largest_insert")
        if found is _UNLOADABLE:
            continue  # the topology check reports a class it cannot load
        if found is None:
            unknown.append(spec.name)
        largest = max(largest, found or 1)
    return largest, unknown
