"""A replay table: fixed-capacity ring-buffer storage plus one sampling strategy.

The replay node (later) owns one or more tables and moves items between sockets and
them; everything here is plain numpy and single-threaded.

* Items are dicts of numpy arrays, batch-major. The first insert fixes the schema
  (field names, dtypes, per-item shapes); storage is one preallocated
  ``[capacity, ...]`` array per field.
* Every inserted item gets a unique, ever-increasing int64 *key*; it lives in slot
  ``key % capacity``. The table holds exactly the keys in ``[oldest_key, next_key)``:
  an insert into a full table overwrites the oldest item (FIFO eviction), and the
  ``fifo`` sampler consumes from the old end.
* Samplers: ``uniform`` (with replacement), ``prioritized`` (proportional,
  stratified, with importance weights; Schaul et al. 2016, "Prioritized Experience
  Replay") and ``fifo`` (a queue: each item is returned at most once, in insert order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import numpy as np

from zmqrl.parts.replay.sum_tree import SumTree

__all__ = ["ReplayTable", "Sample", "SamplerKind"]

SamplerKind = Literal["uniform", "prioritized", "fifo"]
_SAMPLERS = ("uniform", "prioritized", "fifo")
NORMALIZATIONS = ("table", "batch")  # what importance weights are divided by
_STATE_VERSION = 1
_ITEM_PREFIX = "items/"
_U64 = (1 << 64) - 1


class Sample(NamedTuple):
    keys: np.ndarray  # int64 [n]
    items: dict[str, np.ndarray]  # field -> [n, ...], copies (safe to keep or modify)
    weights: np.ndarray  # float32 [n] importance weights (all 1 unless prioritized)
    probabilities: np.ndarray  # float64 [n] probability each item had of being drawn


class ReplayTable:
    """Fixed-capacity item storage with one sampler (see the module docstring).

    Prioritized parameters: stored priority is ``(p + eps) ** alpha``; importance
    weights use an exponent annealed linearly from ``beta`` to ``beta_final`` over
    ``beta_steps`` **calls** to :meth:`sample` (not items sampled), so the schedule
    does not depend on the batch size. ``normalize`` says what the weights are divided
    by: ``table``, the largest weight any held item could get (Schaul et al.: that of
    the smallest priority held), or ``batch``, the largest weight in the batch drawn
    (muzero-general's and EfficientZero's: every batch's largest weight is 1).
    ``floor`` bounds what one small priority can do to the others: a stored priority is
    at least ``floor`` times the mean stored priority when it is set, so under ``table``
    normalization no item scales the weights of the rest by more than about
    ``(1/floor)**beta`` (0.01: 6.3 at beta 0.4), where a priority of 0 once scaled them
    by orders of magnitude. ``seed``
    seeds the table's own generator.
    """

    def __init__(
        self,
        capacity: int,
        sampler: SamplerKind = "uniform",
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_final: float = 1.0,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        seed: int = 0,
        normalize: Literal["table", "batch"] = "table",
        floor: float = 0.01,
    ) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity}")
        if sampler not in _SAMPLERS:
            raise ValueError(f"sampler must be one of {_SAMPLERS}, got {sampler!r}")
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not (beta >= 0 and beta_final >= 0):
            raise ValueError(f"beta and beta_final must be >= 0, got {beta}, {beta_final}")
        if int(beta_steps) < 0:
            raise ValueError(f"beta_steps must be >= 0, got {beta_steps}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        if not 0 <= floor < 1:
            raise ValueError(f"floor must be in [0, 1), got {floor}")
        self.normalize = normalize
        self.floor = float(floor)
        self._capacity = capacity
        self._sampler: SamplerKind = sampler
        self.alpha = float(alpha)
        self.beta_initial = float(beta)
        self.beta_final = float(beta_final)
        self.beta_steps = int(beta_steps)
        self.eps = float(eps)
        self._rng = np.random.Generator(np.random.PCG64(seed))

        self._storage: dict[str, np.ndarray] | None = None  # fixed by the first insert
        self._tree = SumTree(capacity) if sampler == "prioritized" else None
        self._max_priority = 1.0  # largest raw priority seen; the default for new items
        self._next_key = 0
        self._oldest_key = 0  # also the fifo read position
        self._sample_calls = 0  # drives the beta schedule
        self.inserts = 0  # items inserted (including ones evicted within the same insert)
        self.samples = 0  # items returned by sample()
        self.evictions = 0  # items overwritten before being consumed
        self.stale_priority_updates = 0  # update_priorities keys that were already evicted

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def sampler(self) -> SamplerKind:
        return self._sampler

    @property
    def size(self) -> int:
        return self._next_key - self._oldest_key

    @property
    def next_key(self) -> int:
        """The key the next inserted item will get."""
        return self._next_key

    @property
    def oldest_key(self) -> int:
        """The smallest key still held (for ``fifo``: the next one to be sampled)."""
        return self._oldest_key

    @property
    def beta(self) -> float:
        """The importance-weight exponent the next :meth:`sample` call will use."""
        if self.beta_steps == 0:
            return self.beta_final
        frac = min(1.0, self._sample_calls / self.beta_steps)
        return self.beta_initial + (self.beta_final - self.beta_initial) * frac

    @property
    def fields(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Field name -> (dtype, per-item shape); empty before the first insert."""
        if self._storage is None:
            return {}
        return {k: (v.dtype, v.shape[1:]) for k, v in self._storage.items()}

    # ---------------------------------------------------------------------- insert
    def insert(
        self, items: Mapping[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Append a batch of items (every array's first axis is the batch); return their keys.

        ``priorities`` (prioritized only; ignored otherwise) are raw priorities ``p >= 0``,
        one per item; None gives every item the largest raw priority seen so far (1.0 at
        first), so new data is sampled at least once soon. Inserting more than
        ``capacity`` items at once keeps only the last ``capacity``; all keys are
        returned regardless.
        """
        # Validate everything before touching state: a rejected insert changes nothing
        # (in particular it does not fix the schema).
        arrays = self._check_items(items)
        n = next(iter(arrays.values())).shape[0]
        prio: np.ndarray | None = None
        if self._tree is not None:
            if priorities is None:
                raw = np.full(n, self._max_priority, dtype=np.float64)
            else:
                raw = self._check_priorities(priorities, n)
            prio = self._stored_priority(raw)
            if n:
                self._max_priority = max(self._max_priority, float(raw.max()))
        if self._storage is None:
            self._storage = {
                name: np.zeros((self._capacity, *arr.shape[1:]), dtype=arr.dtype)
                for name, arr in arrays.items()
            }

        keys = np.arange(self._next_key, self._next_key + n, dtype=np.int64)
        keep = min(n, self._capacity)  # earlier ones would be overwritten by later ones
        if keep:
            slots = keys[n - keep:] % self._capacity
            assert self._storage is not None
            for name, arr in arrays.items():
                self._storage[name][slots] = arr[n - keep:]
            if self._tree is not None and prio is not None:
                self._tree.update(slots, prio[n - keep:])
        self._next_key += n
        new_oldest = max(self._oldest_key, self._next_key - self._capacity)
        self.evictions += new_oldest - self._oldest_key
        self._oldest_key = new_oldest
        self.inserts += n
        return keys

    # ---------------------------------------------------------------------- sample
    def sample(self, batch_size: int) -> Sample:
        """Draw ``batch_size`` items.

        uniform / prioritized: with replacement; raise ValueError on an empty table.
        fifo: the oldest ``min(batch_size, size)`` unsampled items, which are removed;
        this may return fewer than asked (zero on an empty table) and never raises for
        lack of items. fifo and uniform report weights of 1; fifo reports probability 1
        (the items were certain to be chosen), uniform ``1 / size``.
        """
        n = int(batch_size)
        if n < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        size = self.size
        if self._sampler == "fifo":
            m = min(n, size)
            keys = np.arange(self._oldest_key, self._oldest_key + m, dtype=np.int64)
            self._oldest_key += m
            weights = np.ones(m, dtype=np.float32)
            probs = np.ones(m, dtype=np.float64)
        else:
            if size == 0:
                raise ValueError(f"cannot sample {n} items from an empty table")
            if self._tree is None:  # uniform
                keys = self._oldest_key + self._rng.integers(0, size, size=n, dtype=np.int64)
                weights = np.ones(n, dtype=np.float32)
                probs = np.full(n, 1.0 / size, dtype=np.float64)
            else:
                keys, weights, probs = self._sample_prioritized(n, size)
        self._sample_calls += 1
        self.samples += keys.shape[0]
        slots = keys % self._capacity
        assert self._storage is not None or keys.shape[0] == 0
        items = {} if self._storage is None else {
            name: arr[slots] for name, arr in self._storage.items()  # fancy index: a copy
        }
        return Sample(keys=keys, items=items, weights=weights, probabilities=probs)

    def peek(self, batch_size: int, rng: np.random.Generator) -> Sample:
        """``batch_size`` held items drawn uniformly (with replacement) by ``rng``, for a
        reviser (a reanalyse node): no counter, schedule or fifo position moves, so the
        learners' sampling is as if it had not happened. ValueError on an empty table."""
        n = int(batch_size)
        if n < 1 or self.size == 0 or self._storage is None:
            raise ValueError(f"cannot peek at {n} items of {self.size}")
        keys = self._oldest_key + rng.integers(0, self.size, size=n, dtype=np.int64)
        slots = keys % self._capacity
        items = {name: arr[slots] for name, arr in self._storage.items()}
        return Sample(keys=keys, items=items, weights=np.ones(n, np.float32),
                      probabilities=np.full(n, 1.0 / self.size))

    def revise(self, keys: np.ndarray, arrays: Mapping[str, np.ndarray]) -> int:
        """Overwrite fields of held items (a reanalyse node's fresh targets); return how
        many were applied. Keys already evicted are skipped (the reviser raced the
        writers); keys never issued, or fields, dtypes or shapes unlike the table's, are
        an error."""
        k = np.asarray(keys, np.int64).reshape(-1)
        if k.size and (k.min() < 0 or k.max() >= self._next_key):
            raise ValueError(f"keys must be ones this table issued, in [0, {self._next_key})")
        if self._storage is None:
            return 0
        for name, arr in arrays.items():
            want = self._storage.get(name)
            if want is None:
                raise ValueError(f"field {name!r} is not one of the table's "
                                 f"({', '.join(sorted(self._storage))})")
            if arr.dtype != want.dtype or arr.shape != (k.size, *want.shape[1:]):
                raise ValueError(f"field {name!r}: needs {want.dtype} "
                                 f"{[k.size, *want.shape[1:]]}, got {arr.dtype} "
                                 f"{list(arr.shape)}")
        live = k >= self._oldest_key
        slots = k[live] % self._capacity
        for name, arr in arrays.items():
            self._storage[name][slots] = arr[live]
        return int(live.sum())

    def undo_sample(self, sample: Sample) -> None:
        """Take back the :meth:`sample` call that returned ``sample``, when it was the
        last change to the table (its items could not be delivered): fifo items become
        unsampled again and the counters go back. The generator stays advanced."""
        m = int(sample.keys.shape[0])
        if self._sampler == "fifo" and m:
            if int(sample.keys[0]) != self._oldest_key - m or \
                    self._next_key - int(sample.keys[0]) > self._capacity:
                raise ValueError("only the last fifo sample can be undone, before any insert")
            self._oldest_key -= m
        self._sample_calls = max(0, self._sample_calls - 1)
        self.samples -= m

    def _sample_prioritized(
        self, n: int, size: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tree = self._tree
        assert tree is not None
        total = tree.total
        # Stratified: one uniform draw in each of n equal segments of [0, total). Same
        # marginal distribution as iid draws, lower variance within a batch.
        segment = total / n
        prefix = (np.arange(n, dtype=np.float64) + self._rng.random(n)) * segment
        slots = tree.find(prefix)
        prio = tree.get(slots)
        probs = prio / total
        # w_i = (N P(i))^-beta / max_j (N P(j))^-beta. The max is reached at the smallest
        # priority (of the table, or of this batch), so w_i = (p_i / p_min)^-beta: N and
        # total cancel, which also avoids overflow of (N P)^-beta for tiny P.
        least = tree.min() if self.normalize == "table" else prio.min()
        weights = (prio / least) ** (-self.beta)
        # Slot -> key: the unique held key in [oldest, oldest + capacity) with that slot.
        keys = self._oldest_key + (slots - self._oldest_key) % self._capacity
        return keys.astype(np.int64), weights.astype(np.float32), probs

    # ------------------------------------------------------------------ priorities
    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Set raw priorities of held items; return how many were applied.

        Keys already evicted are skipped and counted in ``stale_priority_updates`` (a
        learner's update can race with the writers). Keys never issued are an error.
        A no-op returning 0 unless the sampler is ``prioritized``. For a repeated key the
        last priority wins.
        """
        if self._tree is None:
            return 0
        k = np.asarray(keys).reshape(-1)
        if k.size and not np.issubdtype(k.dtype, np.integer):
            raise ValueError(f"keys must be integers, got dtype {k.dtype}")
        k = k.astype(np.int64, copy=False)
        raw = self._check_priorities(priorities, k.shape[0])
        if k.size and (k.min() < 0 or k.max() >= self._next_key):
            raise ValueError(
                f"keys must be ones this table issued, in [0, {self._next_key}); got range "
                f"[{k.min()}, {k.max()}]"
            )
        live = k >= self._oldest_key
        raw = raw[live]
        stored = self._stored_priority(raw)
        self.stale_priority_updates += int(k.shape[0] - live.sum())
        if not live.any():
            return 0
        self._tree.update(k[live] % self._capacity, stored)
        self._max_priority = max(self._max_priority, float(raw.max()))
        return int(live.sum())

    def _stored_priority(self, raw: np.ndarray) -> np.ndarray:
        stored = (raw + self.eps) ** self.alpha
        if np.any(stored <= 0):
            # An item with stored priority 0 can never be drawn, and p_min = 0 would make
            # the max importance weight infinite.
            raise ValueError("a priority of 0 with eps=0 (and alpha>0) is not allowed; use eps>0")
        held = self.size
        if self.floor and held and self._tree is not None:
            return np.maximum(stored, self.floor * self._tree.total / held)
        return stored

    @staticmethod
    def _check_priorities(priorities: np.ndarray, n: int) -> np.ndarray:
        raw = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if raw.shape[0] != n:
            raise ValueError(f"expected {n} priorities (one per item), got {raw.shape[0]}")
        if not np.all(np.isfinite(raw)) or np.any(raw < 0):
            raise ValueError("priorities must be finite and >= 0")
        return raw

    # -------------------------------------------------------------------- schema
    def _check_items(self, items: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not isinstance(items, Mapping) or not items:
            raise ValueError("items must be a non-empty dict of field name -> array")
        arrays = {str(name): np.asarray(a) for name, a in items.items()}
        lengths = set()
        for name, arr in arrays.items():
            if arr.ndim == 0:
                raise ValueError(f"field {name!r}: needs a leading batch axis, got a 0-d array")
            if arr.dtype.hasobject:
                raise ValueError(f"field {name!r}: object arrays cannot be stored")
            lengths.add(arr.shape[0])
        if len(lengths) != 1:
            detail = ", ".join(f"{k}: {v.shape[0]}" for k, v in arrays.items())
            raise ValueError(f"all fields must have the same batch size, got {detail}")
        if self._storage is None:
            return arrays  # the first insert fixes the schema
        missing = self._storage.keys() - arrays.keys()
        extra = arrays.keys() - self._storage.keys()
        if missing or extra:
            raise ValueError(
                f"fields differ from the table's: missing {sorted(missing)}, "
                f"unexpected {sorted(extra)}"
            )
        for name, arr in arrays.items():
            want = self._storage[name]
            if arr.dtype != want.dtype:
                raise ValueError(
                    f"field {name!r}: dtype {arr.dtype} does not match the table's {want.dtype}"
                )
            if arr.shape[1:] != want.shape[1:]:
                raise ValueError(
                    f"field {name!r}: per-item shape {arr.shape[1:]} does not match the "
                    f"table's {want.shape[1:]}"
                )
        return arrays

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as numpy arrays, ints, floats and strs.

        Flat (no nesting) so it can go straight into ``np.savez``. Only held items are
        stored, oldest first: ``keys`` int64[size], ``items/<field>`` [size, ...] and,
        for ``prioritized``, ``priorities`` float64[size] (stored, i.e. after alpha).
        """
        keys = np.arange(self._oldest_key, self._next_key, dtype=np.int64)
        slots = keys % self._capacity
        bg = self._rng.bit_generator.state
        state = {
            "version": _STATE_VERSION,
            "sampler": self._sampler,
            "capacity": self._capacity,
            "next_key": self._next_key,
            "oldest_key": self._oldest_key,  # the fifo read position
            "sample_calls": self._sample_calls,  # the beta schedule's progress
            "inserts": self.inserts,
            "samples": self.samples,
            "evictions": self.evictions,
            "stale_priority_updates": self.stale_priority_updates,
            "max_priority": self._max_priority,
            "keys": keys,
            # PCG64's 128-bit state and increment split into uint64 halves, so the RNG
            # state is one plain array rather than a nested dict of big Python ints.
            "rng_state": np.array(
                [
                    bg["state"]["state"] >> 64, bg["state"]["state"] & _U64,
                    bg["state"]["inc"] >> 64, bg["state"]["inc"] & _U64,
                    bg["has_uint32"], bg["uinteger"],
                ],
                dtype=np.uint64,
            ),
        }
        if self._storage is not None:
            for name, arr in self._storage.items():
                state[_ITEM_PREFIX + name] = arr[slots]
        if self._tree is not None:
            state["priorities"] = self._tree.get(slots)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (values may also be 0-d arrays, as after
        ``np.load``). The table must have been built with the same capacity and sampler;
        alpha/beta/eps come from the constructor, not the checkpoint."""
        if int(state["version"]) != _STATE_VERSION:
            raise ValueError(f"unsupported replay table state version {state['version']}")
        if str(state["sampler"]) != self._sampler or int(state["capacity"]) != self._capacity:
            raise ValueError(
                f"checkpoint is for a {state['sampler']} table of capacity {state['capacity']}, "
                f"this is a {self._sampler} table of capacity {self._capacity}"
            )
        keys = np.asarray(state["keys"], dtype=np.int64)
        next_key, oldest_key = int(state["next_key"]), int(state["oldest_key"])
        if not np.array_equal(keys, np.arange(oldest_key, next_key)) or keys.size > self._capacity:
            raise ValueError("checkpoint keys do not match its oldest_key/next_key")
        slots = keys % self._capacity
        fields = {k[len(_ITEM_PREFIX):]: np.asarray(v) for k, v in state.items()
                  if k.startswith(_ITEM_PREFIX)}
        storage = None
        if fields:
            storage = {}
            for name, arr in fields.items():
                if arr.shape[0] != keys.size:
                    raise ValueError(f"checkpoint field {name!r} has {arr.shape[0]} items, "
                                     f"expected {keys.size}")
                storage[name] = np.zeros((self._capacity, *arr.shape[1:]), dtype=arr.dtype)
                storage[name][slots] = arr
        tree = None
        if self._sampler == "prioritized":
            tree = SumTree(self._capacity)
            tree.update(slots, np.asarray(state["priorities"], dtype=np.float64))

        r = [int(x) for x in np.asarray(state["rng_state"], dtype=np.uint64)]
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": (r[0] << 64) | r[1], "inc": (r[2] << 64) | r[3]},
            "has_uint32": r[4],
            "uinteger": r[5],
        }
        # Everything validated; commit.
        self._storage, self._tree, self._rng = storage, tree, rng
        self._next_key, self._oldest_key = next_key, oldest_key
        self._sample_calls = int(state["sample_calls"])
        self._max_priority = float(state["max_priority"])
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])
        self.evictions = int(state["evictions"])
        self.stale_priority_updates = int(state["stale_priority_updates"])
