"""Restart policy, shared by the ``zmqrl up`` supervisor and the ``zmqrl node`` watchdog.

A node's topology entry names its ``restart`` policy (``always``, ``on-failure``,
``never``) and ``max_restarts``. Whoever runs the node process asks :class:`Restarts`
after every exit whether to start it again and after how long: the same exponential
backoff everywhere, so a node behaves alike under ``up`` and under honcho.
"""

from __future__ import annotations

from dataclasses import dataclass

from zmqrl.run.topology import NodeSpec

# Backoff before restart k (k = 1, 2, ...): BASE * 2**(k-1), at most MAX.
RESTART_BACKOFF_BASE_S = 0.5
RESTART_BACKOFF_MAX_S = 10.0
# A node that ran this long before exiting starts its restart count afresh:
# max_restarts bounds a crash loop, not the crashes of a run that lasts days.
HEALTHY_AFTER_S = 300.0


def backoff_s(restart: int) -> float:
    """Seconds to wait before the ``restart``-th restart (1-based)."""
    return min(RESTART_BACKOFF_BASE_S * 2 ** (restart - 1), RESTART_BACKOFF_MAX_S)


def wants_restart(policy: str, exit_code: int) -> bool:
    return policy == "always" or (policy == "on-failure" and exit_code != 0)


@dataclass
class Restarts:
    """The restart bookkeeping of one node replica."""

    spec: NodeSpec
    count: int = 0  # restarts since the node was last healthy

    def after_exit(self, exit_code: int, ran_s: float) -> float | None:
        """Seconds until the restart, or None if the node stays down (finished or
        failed for good). Counts the restart."""
        if ran_s > HEALTHY_AFTER_S:
            self.count = 0
        if not wants_restart(self.spec.restart, exit_code) or \
                self.count >= self.spec.max_restarts:
            return None
        self.count += 1
        return backoff_s(self.count)

