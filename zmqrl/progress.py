"""The supervisor's one-line progress view of a run (env steps, rate, returns, updates)."""

from __future__ import annotations

import time

from rich.text import Text

from zmqrl.runmetrics import RunMetrics


class Progress:
    """Formats :class:`RunMetrics` as the live line ``zmqrl up`` shows."""

    def __init__(self, run: RunMetrics, started: float):
        self.run = run
        self.started = started
        self._mark = (started, run.total_env_steps)
        self.steps_per_s = 0.0

    def line(self, final: bool = False) -> Text:
        """The one-line summary; ``final`` shows the whole run's average rate."""
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
            f"episodes {run.base_episodes + run.episodes}",
            f"return(20) {run.mean_return(20):.1f}",
            f"return(100) {run.mean_return():.1f}",
        ]
        row = run.learner_row
        if row:
            parts.append(f"updates {row.get('updates', 0)}")
            if row.get("policy_lag") is not None:
                parts.append(f"lag {row.get('policy_lag')}")
        if run.rejected:
            parts.append(f"rejected reports {run.rejected}")
        return Text(" | ".join(parts), style="bold")
