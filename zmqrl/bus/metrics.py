"""Metric rows to CSV, and the small running statistics nodes keep.

Each node appends one row per metrics interval to ``<run_dir>/metrics/<node>.csv``.
A column that first appears later (a link that only starts moving data after a while)
extends the header: the file is rewritten once with the wider header, so every row of a
file always has the same columns.
"""

from __future__ import annotations

import csv
import math
import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class CsvLog:
    def __init__(self, path: Path):
        self.path = path
        self._columns: list[str] = []
        self._file: Any = None
        self._writer: csv.DictWriter | None = None

    def write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self._columns]
        if new or self._writer is None:
            self._reopen(self._columns + new)
        self._writer.writerow(row)
        self._file.flush()

    def _reopen(self, columns: list[str]) -> None:
        # Rows already on disk (a wider header, or a restarted node's earlier life) stay.
        old_rows: list[dict[str, str]] = []
        if self._file is not None:
            self._file.close()
        if self.path.exists():
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                old_rows = list(reader)
                columns = list(reader.fieldnames or []) + [
                    c for c in columns if c not in (reader.fieldnames or [])
                ]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._columns = columns
        # Rewrite beside the file and rename, so a reader never sees it half written.
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, columns, restval="")
            writer.writeheader()
            writer.writerows(old_rows)
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", newline="")  # kept open between rows
        self._writer = csv.DictWriter(self._file, columns, restval="")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


RETURN_WINDOW = 100  # the episodes an EpisodeStats keeps unless told otherwise


class EpisodeStats:
    """Returns and lengths of completed episodes, with windowed means."""

    def __init__(self, window: int = RETURN_WINDOW):
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.count = 0

    def add(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        self.returns.extend(returns.tolist())
        self.lengths.extend(lengths.tolist())
        self.count += len(returns)

    def mean_return(self, last: int | None = None) -> float:
        if not self.returns:
            return math.nan
        values = list(self.returns)[-last:] if last else self.returns
        return float(np.mean(values))

    def mean_length(self) -> float:
        return float(np.mean(self.lengths)) if self.lengths else math.nan


class RecentReturns:
    """Returns of the episodes finished since the last metrics report, bounded by
    construction: the newest ``keep`` are kept, the rest only counted. A fast broker
    over many short episodes can finish more in one interval than one report may carry
    (the header is capped at 1 MiB); the run's mean needs only the newest, and its
    episode count gets the rest as a number."""

    def __init__(self, keep: int):
        self.kept: deque[float] = deque(maxlen=keep)
        self.count = 0  # episodes since the last take

    def extend(self, returns: Sequence[float]) -> None:
        self.count += len(returns)
        self.kept.extend(returns)

    def take(self) -> tuple[list[float], int]:
        """(the kept returns, how many more finished than are kept); then empty."""
        kept, more = list(self.kept), self.count - len(self.kept)
        self.kept.clear()
        self.count = 0
        return kept, more


class LatencyReservoir:
    """The last ``size`` latencies, for p50/p99 without unbounded memory."""

    def __init__(self, size: int = 4096):
        self._values: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._values.append(seconds)

    def percentiles_ms(self) -> tuple[float, float]:
        if not self._values:
            return math.nan, math.nan
        p50, p99 = np.percentile(np.fromiter(self._values, float), [50, 99])
        return round(float(p50) * 1e3, 3), round(float(p99) * 1e3, 3)
