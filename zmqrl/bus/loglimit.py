"""A log that says at most so many lines per window, and how many it kept quiet.

A node logs every message it rejects; a peer that sends garbage without end must not
fill the log disk. Each node rejection goes through one :class:`LimitedLog`: the first
``burst`` lines of a window are written, the rest only counted, and the next line
written after a quiet stretch says how many were not (the node's ``bad_messages``
metric counts every one regardless).
"""

from __future__ import annotations

import logging
import time


class LimitedLog:
    def __init__(self, log: logging.Logger, burst: int = 20, window_s: float = 10.0):
        self.log = log
        self.burst = burst
        self.window_s = window_s
        self._window_start = -window_s
        self._written = 0
        self.suppressed = 0  # lines not written since the last one that was

    def error(self, line: str) -> None:
        now = time.monotonic()
        if now - self._window_start >= self.window_s:
            self._window_start, self._written = now, 0
        if self._written >= self.burst:
            self.suppressed += 1
            return
        self._written += 1
        if self.suppressed:
            self.log.error("(%d more like the below not logged; bad_messages counts them all)",
                           self.suppressed)
            self.suppressed = 0
        self.log.error("%s", line)
