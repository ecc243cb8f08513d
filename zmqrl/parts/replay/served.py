"""Which keys each connection was served: a replay applies ``priorities`` only for those.

A priority update is the sampling learner's verdict on the batch it trained on. ZeroMQ's
ROUTER names every connection (its routing id) and refuses a second connection under a
name in use, so "the connection that was served these keys" is the sampling learner's
identity on the wire: a stranger's ``priorities`` for keys it was never served are
skipped and counted, whatever it sends. (A stranger that samples for itself gets keys of
its own; what its priorities can do to them is bounded by the table's priority floor.)

Bounded: the newest served batches are kept, at most ``max_keys`` keys over all
connections, the oldest forgotten first. A learner's priorities come a few batches
after its sample (its prefetch), far inside that window; one that comes later is
skipped like a stranger's, which costs that batch's priorities and nothing else.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class ServedKeys:
    """Recently served keys per connection (the envelope's bytes)."""

    def __init__(self, max_keys: int):
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = int(max_keys)
        self.held = 0
        self._order: deque[tuple[bytes, np.ndarray]] = deque()  # oldest first
        self._by_connection: dict[bytes, deque[np.ndarray]] = {}

    def served(self, connection: bytes, keys: np.ndarray) -> None:
        """``keys`` went to ``connection`` in a batch."""
        keys = np.asarray(keys, dtype=np.int64)
        self._order.append((connection, keys))
        self._by_connection.setdefault(connection, deque()).append(keys)
        self.held += keys.shape[0]
        while self.held > self.max_keys and len(self._order) > 1:
            old_connection, old = self._order.popleft()
            batches = self._by_connection[old_connection]
            batches.popleft()  # a connection's batches leave in the order they came
            if not batches:
                del self._by_connection[old_connection]
            self.held -= old.shape[0]

    def claimed(self, connection: bytes, keys: np.ndarray) -> np.ndarray:
        """A bool mask over ``keys``: which of them were served to ``connection``."""
        batches = self._by_connection.get(connection)
        if not batches:
            return np.zeros(np.shape(keys)[0], dtype=bool)
        return np.isin(keys, np.concatenate(batches))
