"""The supervisor's progress view of a run: one line (env steps, rate, returns, updates)
and, when the run has a stop condition, a bar with the fraction done and the time left.

The fraction is that of the condition nearest to stopping the run: env steps against
``--max-steps``, time against ``--max-seconds``, the mean return of the last 100
episodes against ``--target-return`` (from 0, once 100 episodes are in; no time left is
guessed for a return). Time left comes from the recent env steps/s.
"""

from __future__ import annotations

import math
import time

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from zmqrl.run.runmetrics import RunMetrics


class Progress:
    """Formats :class:`RunMetrics` as the live line ``zmqrl up`` shows."""

    def __init__(self, run: RunMetrics, started: float):
        self.run = run
        self.started = started
        self._mark = (started, run.total_env_steps)
        self.steps_per_s = 0.0

    def line(self, final: bool = False, with_done: bool = True) -> Text:
        """The one-line summary; ``final`` shows the whole run's average rate, and
        ``with_done`` the fraction done and time left (when there is a stop condition)."""
        run, now = self.run, time.monotonic()
        total = run.total_env_steps
        t0, steps0 = self._mark
        if final:
            self.steps_per_s = (total - run.base_env_steps) / max(now - self.started, 1e-9)
        elif now - t0 >= 1.0:
            self.steps_per_s = (total - steps0) / (now - t0)
            self._mark = (now, total)
        parts = [
            f"{now - self.started:6.1f}s",
            f"env steps {total:,}",
            f"{self.steps_per_s:,.0f} steps/s",
        ]
        shown = run.shown()
        episodes = run.base_episodes + run.episodes
        # A run whose nodes show their own measure (a search's games, a league's win
        # rate) and report no episodes has no return to show: self-play's is meaningless.
        if episodes or not shown:
            parts += [f"episodes {episodes}", f"return(20) {run.mean_return(20):.1f}",
                      f"return(100) {run.mean_return():.1f}"]
        parts += [f"{name} {_number(value)}" for name, value in shown.items()]
        row = run.learner_row
        if row:
            parts.append(f"updates {row.get('updates', 0)}")
            if row.get("policy_lag") is not None:
                parts.append(f"lag {row.get('policy_lag')}")
        if run.rejected:
            parts.append(f"rejected reports {run.rejected}")
        done = self.done(now)
        if done is not None and with_done and not final:
            parts.append(_done_text(*done))
        return Text(" | ".join(parts), style="bold")

    def done(self, now: float | None = None) -> tuple[float, float | None] | None:
        """(fraction done, seconds left or None) of the nearest stop condition; None
        without one."""
        run, stop = self.run, self.run.stop
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        found: list[tuple[float, float | None]] = []
        if stop.max_steps:
            total = run.total_env_steps
            left = (stop.max_steps - total) / self.steps_per_s if self.steps_per_s > 0 \
                else None
            found.append((total / stop.max_steps, left))
        if stop.max_seconds:
            found.append((elapsed / stop.max_seconds, stop.max_seconds - elapsed))
        if stop.target_return is not None:
            mean = run.mean_return(stop.window)
            full = len(run.returns) >= stop.window and not math.isnan(mean)
            if stop.target_return > 0:  # a fraction of a negative target means nothing
                found.append((max(mean, 0.0) / stop.target_return if full else 0.0, None))
        if not found:
            return None
        fraction, left = max(found, key=lambda f: f[0])
        known = [f[1] for f in found if f[1] is not None]
        return min(max(fraction, 0.0), 1.0), (max(min(known), 0.0) if known else None)

    def view(self) -> Group | Text:
        """What ``zmqrl up`` shows live: the line, and under it the bar when the run has
        a stop condition."""
        line = self.line(with_done=False)
        done = self.done()
        if done is None:
            return line
        fraction, _ = done
        bar = Table.grid(padding=(0, 1))
        bar.add_column(width=40)
        bar.add_column()
        bar.add_row(ProgressBar(total=1.0, completed=fraction, width=40),
                    Text(_done_text(*done), style="bold"))
        return Group(line, bar)


def _done_text(fraction: float, left: float | None) -> str:
    text = f"{fraction:.0%} done"
    if left is not None and math.isfinite(left):
        minutes, seconds = divmod(int(round(left)), 60)
        hours, minutes = divmod(minutes, 60)
        text += f", {hours}:{minutes:02d}:{seconds:02d} left" if hours \
            else f", {minutes}:{seconds:02d} left"
    return text


def _number(value: float) -> str:
    """A shown field: counts with thousands separators, rates and scores with 3 digits."""
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.3g}"
