"""Rate limiter: decides whether an insert or a sample may proceed now.

Modelled on Reverb's ``MinSize`` and ``SampleToInsertRatio`` limiters. It only
counts; the replay node asks it before touching a table and blocks (or queues) the
request while the answer is no.

With ``samples_per_insert`` set it tracks ``diff = inserts * samples_per_insert -
samples`` (items, not calls) and keeps it inside ``[min_diff, max_diff]``, a window of
``+-error_buffer`` around ``min_size_to_sample * samples_per_insert`` (the diff at the
moment sampling first becomes possible). Inserts push ``diff`` up, samples pull it
down; a writer that runs ahead is held back at ``max_diff`` and a learner that runs
ahead at ``min_diff``, so over any stretch the observed ratio stays within
``error_buffer`` items of the target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["RateLimiter"]


class RateLimiter:
    """``min_size_to_sample`` alone, or with a samples-per-insert ratio (see module doc)."""

    def __init__(
        self,
        min_size_to_sample: int = 1,
        samples_per_insert: float | None = None,
        error_buffer: float | None = None,
    ) -> None:
        if int(min_size_to_sample) != min_size_to_sample or min_size_to_sample < 1:
            raise ValueError(
                f"min_size_to_sample must be an int >= 1, got {min_size_to_sample}: "
                "a sample must never be asked of an empty table"
            )
        self.min_size_to_sample = int(min_size_to_sample)
        self.samples_per_insert: float | None = None
        self.error_buffer: float | None = None
        self.min_diff = -math.inf
        self.max_diff = math.inf
        self._tol = 0.0
        if samples_per_insert is None:
            if error_buffer is not None:
                raise ValueError(
                    "error_buffer only has a meaning together with samples_per_insert; "
                    "set samples_per_insert or drop error_buffer"
                )
        else:
            spi = float(samples_per_insert)
            if not (math.isfinite(spi) and spi > 0):
                raise ValueError(
                    f"samples_per_insert must be a finite number > 0, got {samples_per_insert}: "
                    "with 0 or less every sample would push the diff further out of "
                    "bounds and sampling would stop for good (use None for no ratio)"
                )
            if error_buffer is None:
                raise ValueError(
                    "samples_per_insert needs an error_buffer (how many sampled items the "
                    "actual count may run ahead of or behind the target); it must be at "
                    f"least max(1, samples_per_insert) = {max(1.0, spi):g} and, to let a "
                    "batch of B items through, at least (B + samples_per_insert) / 2"
                )
            eb = float(error_buffer)
            if not (math.isfinite(eb) and eb >= max(1.0, spi)):
                raise ValueError(
                    f"error_buffer={error_buffer} is smaller than max(1, samples_per_insert)"
                    f" = {max(1.0, spi):g}: one insert moves the diff by "
                    f"samples_per_insert={spi:g} and one sampled item by 1, so no single "
                    "insert or sample could ever fit in the allowed window of "
                    "+-error_buffer and writers and samplers could block each other "
                    f"forever. Use error_buffer >= {max(1.0, spi):g}"
                )
            self.samples_per_insert = spi
            self.error_buffer = eb
            offset = self.min_size_to_sample * spi
            self.min_diff = offset - eb
            self.max_diff = offset + eb
            # Slack for float rounding of inserts * samples_per_insert (0.1 * 3 != 0.3),
            # so an exact boundary is not refused by a last-bit error.
            self._tol = 1e-9 * max(1.0, abs(offset) + eb)
        self.inserts = 0  # items
        self.samples = 0  # items

    @property
    def diff(self) -> float:
        """``inserts * samples_per_insert - samples`` (0 without a ratio)."""
        if self.samples_per_insert is None:
            return 0.0
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int = 1, size: int | None = None) -> bool:
        """May ``n`` items be inserted now?

        Always yes while the table (``size`` items; if not given, the inserts counted
        so far stand in for it) would hold at most ``min_size_to_sample`` items after
        the insert, so the table can always fill up to where sampling starts.
        """
        if self.samples_per_insert is None:
            return True
        held = self.inserts if size is None else int(size)
        if held + n <= self.min_size_to_sample:
            return True
        after = (self.inserts + n) * self.samples_per_insert - self.samples
        return after <= self.max_diff + self._tol

    def largest_fitting_insert(self, batch_size: int = 1) -> int | None:
        """The most items one insert may carry and never stall, interleaved with samples
        of ``batch_size`` (:meth:`check_batch`'s rule solved for the insert); None: any
        size fits (no ratio). A larger insert may find the diff where neither it nor a
        sample fits, and since a replay reads no other insert while one waits, nothing
        would move the diff again: the replay refuses such an insert instead."""
        if self.samples_per_insert is None or self.error_buffer is None:
            return None
        room = 2 * self.error_buffer - batch_size + self._tol
        return max(0, math.floor(room / self.samples_per_insert))

    def can_sample(self, n: int, size: int) -> bool:
        """May ``n`` items be sampled now from a table holding ``size`` items?"""
        if size < self.min_size_to_sample:
            return False
        if self.samples_per_insert is None:
            return True
        return self.diff - n >= self.min_diff - self._tol

    def on_insert(self, n: int = 1) -> None:
        self.inserts += int(n)

    def on_sample(self, n: int) -> None:
        self.samples += int(n)

    def check_batch(self, batch_size: int, insert_size: int = 1) -> None:
        """Raise ValueError unless samples of ``batch_size`` items, interleaved with
        inserts of ``insert_size`` items, can keep going forever.

        Two ways to fail. (1) ``batch_size > 2 * error_buffer``: the diff never exceeds
        ``max_diff``, so ``diff - batch_size >= min_diff`` can never hold. (2)
        ``batch_size + insert_size * samples_per_insert > 2 * error_buffer``: then some
        diff just below ``max_diff`` refuses both the next insert (it would pass
        ``max_diff``) and the next sample (it would pass ``min_diff``), a deadlock.
        Check (2) is conservative: it ignores that diffs only take values on a lattice,
        so a few settings it refuses would in fact run.
        """
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size}")
        if int(insert_size) != insert_size or insert_size < 1:
            raise ValueError(f"insert_size must be an int >= 1, got {insert_size}")
        if self.samples_per_insert is None or self.error_buffer is None:
            return  # only min size applies, and a full enough table serves any batch
        window = 2 * self.error_buffer
        step = insert_size * self.samples_per_insert
        if batch_size > window + self._tol:
            raise ValueError(
                f"a sample of {batch_size} items can never be allowed: it lowers the diff "
                f"by {batch_size} but the allowed window [min_diff, max_diff] is only "
                f"2 * error_buffer = {window:g} wide. Raise error_buffer to at least "
                f"{(batch_size + step) / 2:g} or sample smaller batches"
            )
        if batch_size + step > window + self._tol:
            raise ValueError(
                f"samples of {batch_size} items with inserts of {insert_size} item(s) can "
                f"deadlock: once the diff is within {step:g} (one insert) of max_diff no "
                f"insert fits, yet it may still be less than {batch_size} (one sample) above "
                f"min_diff, so no sample fits either; this needs batch_size + insert_size * "
                f"samples_per_insert <= 2 * error_buffer ({batch_size} + {step:g} > "
                f"{window:g}). Raise error_buffer to at least {(batch_size + step) / 2:g} "
                "or sample smaller batches"
            )

    def state_dict(self) -> dict[str, Any]:
        """Counters only: the settings come from the constructor."""
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])
