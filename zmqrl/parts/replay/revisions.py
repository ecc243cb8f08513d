"""Revision peeks: how much of a replay its revisers (reanalyse nodes) may take.

A reviser's ``sample {revise: true}`` is answered at once, outside the rate limiter
(what it revises is not trained on by it), so it needs bounds of its own or a stranger
could pump the replay's memory into its socket queue: at most the largest batch a linked
reviser asks for, one outstanding peek per connection until its ``revise`` comes (or
``timeout_s`` passes), a few connections at a time, and, with ``per_insert``, no more
items handed out than that many per item inserted. The replay node asks; this decides.
"""

from __future__ import annotations

import time


class RevisionGate:
    """Which revision peeks a replay serves. ``max_batch``: the largest ``batch_size`` of
    a linked reviser (0: none is linked, every peek is refused); ``max_outstanding``:
    connections that may hold a peek at once; ``per_insert``: items handed to revisers
    per item inserted (None: no ratio)."""

    def __init__(self, max_batch: int, max_outstanding: int, per_insert: float | None,
                 timeout_s: float):
        self.max_batch = max_batch
        self.max_outstanding = max_outstanding
        self.per_insert = per_insert
        self.timeout_s = timeout_s
        self.outstanding: dict[bytes, float] = {}  # connection -> when its peek was served
        self.peeked = 0  # items handed to revisers
        self.refused = 0  # peeks refused (retry, or an error)

    def invalid(self, connection: bytes, batch_size: int) -> str | None:
        """Why this peek is a protocol error (the peer misbehaves), or None."""
        if not self.max_batch:
            return ("no reviser (a reanalyse node) is linked to this replay's sample port: "
                    "revision peeks are refused")
        if batch_size > self.max_batch:
            return (f"a revision peek of {batch_size} items exceeds {self.max_batch}, the "
                    "largest batch_size of the revisers linked to this replay")
        self._expire(time.monotonic())
        if connection in self.outstanding:
            self.refused += 1
            return ("a revision peek is already outstanding on this connection: send its "
                    "revise first")
        return None

    def wait(self, batch_size: int, inserts: int, held: int, min_held: int) -> str | None:
        """Why this valid peek must be asked again later (a ``retry`` error), or None."""
        why = None
        if len(self.outstanding) >= self.max_outstanding:
            why = (f"{len(self.outstanding)} connections hold revision peeks, this "
                   "replay's most")
        elif self.per_insert is not None and \
                self.peeked + batch_size > self.per_insert * inserts + self.max_batch:
            why = f"revisions are ahead of inserts (revisions_per_insert {self.per_insert:g})"
        elif held < max(batch_size, min_held):
            why = f"{held} items held, fewer than {max(batch_size, min_held)}"
        if why is not None:
            self.refused += 1
        return why

    def served(self, connection: bytes, batch_size: int) -> None:
        """A peek went out on ``connection``."""
        self.outstanding[connection] = time.monotonic()
        self.peeked += batch_size

    def answered(self, connection: bytes) -> None:
        """``connection`` sent its revise: it may peek again."""
        self.outstanding.pop(connection, None)

    def _expire(self, now: float) -> None:
        for peer, served in list(self.outstanding.items()):
            if now - served > self.timeout_s:
                del self.outstanding[peer]
