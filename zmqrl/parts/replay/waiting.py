"""Sample requests the rate limiter holds back, in arrival order, bounded. No sockets.

A learner keeps a few ``sample`` requests in flight and, when the replay is slow to
answer (warm-up, a rate limiter holding it back), may give up on them and reconnect with
a new socket identity, or restart. Its old requests must not pile up here, nor be served
first to a peer that is gone while the live ones wait. So:

* at most ``per_peer`` requests per peer (socket identity): a newer one replaces that
  peer's oldest;
* a request that names its ``client`` (a stable id of the requesting node, e.g. its
  label) drops the waiting requests of the same client from other identities: those
  came from a socket it has since replaced, or from its previous incarnation;
* at most ``total`` requests in all (a last bound against many identities): the oldest
  goes first, being the likeliest abandoned;
* the replay drops all of a peer's requests (:meth:`drop_peer`) when a reply to it
  cannot be delivered (ZeroMQ knows that peer is gone).

A request dropped for its ``client`` or for the total may belong to a live peer: anyone
can name a learner's ``client``, and many identities can fill the total. Those are kept
in :meth:`take_evicted` for the replay to tell their peers (an ``error`` with ``retry``),
who then ask again: a forged ``client`` or a flood costs a learner a round trip, never
its requests for good. (A peer over its own bound is not told: it sent more than it may
have waiting.)
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["Request", "WaitingSamples"]


@dataclass
class Request:
    envelope: list  # the ROUTER envelope the reply goes to
    batch_size: int
    client: str | None = None
    since: float = field(default_factory=time.monotonic)
    peer: tuple[bytes, ...] = field(init=False)  # the envelope as a dict key

    def __post_init__(self) -> None:
        self.peer = tuple(bytes(f) for f in self.envelope)


class WaitingSamples:
    """The queue described in the module docstring; ``dropped`` counts what it dropped."""

    def __init__(self, per_peer: int = 16, total: int = 1024) -> None:
        if per_peer < 1 or total < 1:
            raise ValueError(f"per_peer and total must be >= 1, got {per_peer}, {total}")
        self.per_peer = per_peer
        self.total = total
        self._queue: deque[Request] = deque()
        self._per_peer: dict[tuple[bytes, ...], int] = {}
        self.dropped = 0
        self._evicted: list[Request] = []  # dropped while their peer may be live

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def add(self, request: Request) -> int:
        """Queue ``request``; returns how many older requests it made us drop."""
        peer = request.peer
        dropped = 0
        if request.client is not None:
            dropped += self._drop(lambda r: r.client == request.client and r.peer != peer,
                                  evict=True)
        if self._per_peer.get(peer, 0) >= self.per_peer:  # its own doing: not told
            oldest = next(r for r in self._queue if r.peer == peer)
            dropped += self._drop(lambda r: r is oldest)
        if len(self._queue) >= self.total:
            oldest = self._queue[0]
            dropped += self._drop(lambda r: r is oldest, evict=True)
        self._queue.append(request)
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        return dropped

    def first(self) -> Request | None:
        return self._queue[0] if self._queue else None

    def pop(self) -> Request:
        request = self._queue.popleft()
        self._forget(request.peer)
        return request

    def drop_peer(self, peer: tuple[bytes, ...]) -> int:
        """Drop every request of ``peer`` (it is gone); returns how many."""
        return self._drop(lambda r: r.peer == peer)

    def take_evicted(self) -> list[Request]:
        """The requests :meth:`add` dropped since the last call (their peers may be
        live and waiting for an answer)."""
        evicted, self._evicted = self._evicted, []
        return evicted

    def _drop(self, match, evict: bool = False) -> int:
        gone = [r for r in self._queue if match(r)]
        if evict:
            self._evicted += gone
        if gone:
            self._queue = deque(r for r in self._queue if not match(r))
            for r in gone:
                self._forget(r.peer)
            self.dropped += len(gone)
        return len(gone)

    def _forget(self, peer: tuple[bytes, ...]) -> None:
        left = self._per_peer[peer] - 1
        if left:
            self._per_peer[peer] = left
        else:
            del self._per_peer[peer]
