"""Which keys each connection was served: a replay applies ``priorities`` only for those.

A priority update is the sampling learner's verdict on the batch it trained on. ZeroMQ's
ROUTER names every connection (its routing id) and refuses a second connection under a
name in use, so "the connection that was served these keys" is the sampling learner's
identity on the wire: a stranger's ``priorities`` for keys it was never served are
skipped and counted, whatever it sends. (A stranger that samples for itself gets keys of
its own; what its priorities can do to them is bounded by the table's priority floor.)

Bounded, and cheap on the hot path (one lookup per ``priorities`` message): the newest
``batches`` batches of each of the ``connections`` most recently served connections. A
learner's priorities come a batch or two after its sample (its prefetch, 2 by default),
far inside that window; one that comes later is skipped like a stranger's, which costs
that batch's priorities and nothing else.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np


class ServedKeys:
    """Recently served keys per connection (the envelope's bytes)."""

    def __init__(self, batches: int = 16, connections: int = 64):
        if batches < 1 or connections < 1:
            raise ValueError(f"batches and connections must be >= 1, got {batches}, "
                             f"{connections}")
        self.batches, self.connections = int(batches), int(connections)
        # connection -> its newest batches' keys; the least recently served first
        self._by_connection: OrderedDict[bytes, deque[np.ndarray]] = OrderedDict()

    def served(self, connection: bytes, keys: np.ndarray) -> None:
        """``keys`` went to ``connection`` in a batch."""
        batches = self._by_connection.pop(connection, None)
        if batches is None:
            batches = deque(maxlen=self.batches)
        batches.append(np.asarray(keys, dtype=np.int64))
        self._by_connection[connection] = batches
        if len(self._by_connection) > self.connections:
            self._by_connection.popitem(last=False)

    def claimed(self, connection: bytes, keys: np.ndarray) -> np.ndarray:
        """A bool mask over ``keys``: which of them were served to ``connection``."""
        batches = self._by_connection.get(connection)
        if not batches:
            return np.zeros(np.shape(keys)[0], dtype=bool)
        return np.isin(keys, np.concatenate(batches))
