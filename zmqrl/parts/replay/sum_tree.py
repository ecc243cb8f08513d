"""Array-backed sum tree (plus a parallel min tree) over float64 priorities.

The prioritized sampler of :class:`zmqrl.parts.replay.table.ReplayTable` sits on this:
``find`` turns uniform draws in ``[0, total)`` into slots with probability
proportional to their priority, and ``min`` gives the smallest priority, which
bounds the largest importance weight (Schaul et al. 2016, section 3.4).

Layout: a classic implicit binary heap. ``_sums[1]`` is the root; the children of
node ``i`` are ``2i`` and ``2i + 1``; leaf ``j`` (slot ``j``) lives at ``_size + j``,
where ``_size`` is the capacity rounded up to a power of two. Padding leaves hold
priority 0 in the sum tree and ``+inf`` in the min tree, so they are never found and
never the minimum. Every operation works on whole index arrays, one tree level at a
time, so a batch costs ``O(log capacity)`` numpy calls rather than Python loops over
items.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SumTree"]


class SumTree:
    """Binary sum tree over ``capacity`` float64 priorities, all initially unset.

    A slot is *filled* once ``update`` has written it; unfilled slots count as
    priority 0 for ``total``/``find`` and are ignored by ``min``.
    """

    def __init__(self, capacity: int) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be a positive int, got {capacity}")
        self._capacity = capacity
        size = 1
        while size < capacity:
            size *= 2
        self._size = size
        self._depth = size.bit_length() - 1  # levels between the root and the leaves
        # Index 0 is unused so that parent/child arithmetic stays ``i // 2``, ``2i``.
        self._sums = np.zeros(2 * size, dtype=np.float64)
        self._mins = np.full(2 * size, np.inf, dtype=np.float64)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self._sums[1])

    def min(self) -> float:
        """Smallest priority over the filled slots (``+inf`` if none is filled)."""
        return float(self._mins[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Priorities of ``indices`` (0 for unfilled slots)."""
        idx = self._check_indices(indices)
        return self._sums[self._size + idx]

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set ``priorities[k]`` at slot ``indices[k]``; for a repeated index the last wins."""
        idx = self._check_indices(indices)
        prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if prio.shape != idx.shape:
            raise ValueError(
                f"indices and priorities differ in length: {idx.shape[0]} vs {prio.shape[0]}"
            )
        if idx.size == 0:
            return
        if not np.all(np.isfinite(prio)) or np.any(prio < 0):
            raise ValueError("priorities must be finite and >= 0")
        # "Last duplicate wins": np.unique reports the first occurrence, so look at the
        # reversed arrays. Deduplicating also keeps the fancy assignments below well
        # defined (numpy does not promise which duplicate write lands).
        uniq, first = np.unique(idx[::-1], return_index=True)
        node = uniq + self._size
        self._sums[node] = prio[::-1][first]
        self._mins[node] = self._sums[node]
        # Recompute each touched parent from its children rather than adding deltas, so
        # rounding errors cannot accumulate over millions of updates. ``node`` stays
        # sorted and on one level, so ``node[0] > 1`` means "not yet at the root".
        while node[0] > 1:
            node = np.unique(node >> 1)
            left = node << 1
            self._sums[node] = self._sums[left] + self._sums[left + 1]
            self._mins[node] = np.minimum(self._mins[left], self._mins[left + 1])

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """Slots ``i`` with ``cumsum[i-1] <= s < cumsum[i]`` for each query ``s``.

        All queries descend together, one level per step. Queries below 0 are treated
        as 0; queries at or above ``total`` (which float rounding of ``u * total`` can
        produce) map to the last slot with a positive priority. A slot with priority 0
        is never returned.
        """
        if self._sums[1] <= 0.0:
            raise ValueError("cannot find in a sum tree whose total priority is 0")
        s = np.array(prefix_sums, dtype=np.float64).reshape(-1)
        if np.any(np.isnan(s)):
            raise ValueError("prefix sums must not be NaN")
        np.maximum(s, 0.0, out=s)
        node = np.ones(s.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = node << 1
            left_sum = self._sums[left]
            # Go right only into a subtree with positive mass: when rounding leaves
            # ``s >= left_sum`` with an empty right subtree we stay left, which ends on
            # the last positive leaf instead of a zero-priority (or padding) one.
            go_right = (s >= left_sum) & (self._sums[left + 1] > 0.0)
            s = np.where(go_right, s - left_sum, s)
            node = left + go_right
        return node - self._size

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices).reshape(-1)
        if idx.size == 0:
            return idx.astype(np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        if idx.min() < 0 or idx.max() >= self._capacity:
            raise ValueError(
                f"indices must lie in [0, {self._capacity}), got range "
                f"[{idx.min()}, {idx.max()}]"
            )
        return idx
