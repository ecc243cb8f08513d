"""``zmqrl plot``: learning curves of finished or running runs, from their metrics CSVs.

A run's curve is its supervisor's ``metrics/run.csv`` (the run's env steps, wall time and
mean return); a run without one (started by honcho from the Procfile) falls back to its
first learner's CSV, which has returns where the learner sees episodes (the unroll
topologies: SEED, IMPALA, A2C, PPO), not in a replay-fed one. Runs are grouped by
topology name (from the run's ``topology.yaml``; with the env id added when the runs
cover several envs): a group of one run is drawn as its curve, a group of several (seeds)
as their mean with a band of ± one standard deviation, over the env steps (or time) that
every run of the group reached.

Two panels: return against env steps, and against wall time. Needs matplotlib
(``pip install -e '.[plot]'``); nothing else in zmqrl imports it.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

METRICS = {"return_mean_100": "mean return, last 100 episodes",
           "return_mean_20": "mean return, last 20 episodes"}
GRID_POINTS = 200  # a group's runs are compared on this many common x values


@dataclass
class Curve:
    run_dir: Path
    name: str  # the topology's name
    env: str
    steps: np.ndarray
    seconds: np.ndarray
    returns: np.ndarray


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def load_curve(run_dir: Path, metric: str = "return_mean_100") -> Curve:
    """One run's curve; raises ``ValueError`` when the run has none to draw."""
    run_dir = Path(run_dir)
    topo: dict[str, Any] = {}
    if (run_dir / "topology.yaml").exists():
        topo = yaml.safe_load((run_dir / "topology.yaml").read_text()) or {}
    sources = [run_dir / "metrics" / "run.csv"]
    if not sources[0].exists():  # no supervisor: the learners saw every unroll
        sources = sorted((run_dir / "metrics").glob("learner*.csv"))[:1]
    rows = _rows(sources[0]) if sources and sources[0].exists() else []
    points = [(_num(r.get("env_steps")), _num(r.get("time_s")), _num(r.get(metric)))
              for r in rows]
    points = [p for p in points if not any(map(math.isnan, p))]
    if not points:
        raise ValueError(f"{run_dir}: no {metric} to plot (no episode finished, or no "
                         "metrics/run.csv or learner CSV with it)")
    steps, seconds, returns = (np.array(c, dtype=float) for c in zip(*points, strict=True))
    if not topo:  # no supervisor wrote topology.yaml: every node's status file names it
        for path in sorted((run_dir / "status").glob("*.json")):
            try:
                status = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            topo = {"name": status.get("topology"), "env": {"id": status.get("env", "")}}
            break
    env = str((topo.get("env") or {}).get("id", ""))
    return Curve(run_dir, str(topo.get("name") or run_dir.name), env, steps, seconds, returns)


def _mean_band(curves: list[Curve], axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The group's mean and std on a grid up to where the shortest run stops."""
    xs = [getattr(c, axis) for c in curves]
    lo = max(x[0] for x in xs)
    hi = min(x[-1] for x in xs)
    grid = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.array([lo])
    ys = np.stack([np.interp(grid, x, c.returns) for x, c in zip(xs, curves, strict=True)])
    return grid, ys.mean(axis=0), ys.std(axis=0)


def group(curves: list[Curve]) -> dict[str, list[Curve]]:
    """Curves by topology name (and env id, where the runs cover several envs)."""
    several_envs = len({c.env for c in curves}) > 1
    out: dict[str, list[Curve]] = defaultdict(list)
    for c in curves:
        out[f"{c.name} ({c.env})" if several_envs and c.env else c.name].append(c)
    return dict(out)


def load_learner_curve(run_dir: Path, column: str) -> Curve:
    """A learner metric of one run (``entropy``, ``loss_value``, ...) against its env steps
    and the run's wall time, from its first learner's CSV; raises ``ValueError`` when it
    has none."""
    run_dir = Path(run_dir)
    try:
        base: Curve | None = load_curve(run_dir)
    except ValueError:  # no return to place it by: the learner's own clock
        base = None
    sources = sorted((run_dir / "metrics").glob("learner*.csv"))[:1]
    rows = _rows(sources[0]) if sources else []
    points = [(_num(r.get("env_steps")), _num(r.get("time_s")), _num(r.get(column)))
              for r in rows]
    points = [p for p in points if not any(map(math.isnan, p))]
    if not points:
        raise ValueError(f"{run_dir}: no learner column '{column}' to plot")
    steps, seconds, values = (np.array(c, dtype=float) for c in zip(*points, strict=True))
    name, env = (base.name, base.env) if base is not None else (run_dir.name, "")
    if base is not None and len(base.steps) > 1:
        # On the run's clock, by env steps: a learner's own clock starts again at 0 in
        # each incarnation (a restart, a --resume), the run's goes on.
        seconds = np.interp(steps, base.steps, base.seconds)
    return Curve(run_dir, name, env, steps, seconds, values)


def plot_runs(run_dirs: list[Path], out: Path, metric: str = "return_mean_100",
              title: str | None = None, size_px: tuple[int, int] = (1200, 450),
              dpi: int = 100, learner_metrics: tuple[str, ...] = (),
              frame_skip: int = 1) -> Path:
    """Draw the runs in ``run_dirs`` into the PNG ``out`` (``size_px`` pixels): a row of
    return panels, then a row per learner metric in ``learner_metrics``. With
    ``frame_skip`` K > 1 the step axis counts frames (env steps x K), as Atari papers do."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    curves = [load_curve(Path(d), metric) for d in run_dirs]
    rows = [(METRICS.get(metric, metric), curves)]
    rows += [(column, [load_learner_curve(Path(d), column) for d in run_dirs])
             for column in learner_metrics]
    fig, grid = plt.subplots(len(rows), 2, figsize=(size_px[0] / dpi, size_px[1] / dpi),
                             dpi=dpi, layout="constrained", squeeze=False)
    use_minutes = max(c.seconds[-1] for c in curves) > 600
    groups = group(curves)
    sizes = {len(members) for members in groups.values()}
    same = len(sizes) == 1  # every topology has as many runs: say it once, in the legend
    for axes, (ylabel, row_curves) in zip(grid, rows, strict=True):
        _draw_row(axes, group(row_curves), same, use_minutes, frame_skip)
        for ax in axes:
            ax.set_ylabel(ylabel)
    step_label = "env steps" if frame_skip == 1 else f"frames (env steps x {frame_skip})"
    grid[-1][0].set_xlabel(step_label)
    grid[-1][1].set_xlabel("wall time (min)" if use_minutes else "wall time (s)")
    # Below the panels, not over the curves.
    n = max(sizes)
    fig.legend(*grid[0][0].get_legend_handles_labels(), loc="outside lower center",
               ncols=min(len(groups), 6), fontsize="small", frameon=False,
               title=(f"mean of {n} runs each, band ± 1 std" if same and n > 1 else
                      "band ± 1 std" if n > 1 else None), title_fontsize="small")
    envs = sorted({c.env for c in curves if c.env})
    shown = ", ".join([METRICS.get(metric, metric), *learner_metrics])
    fig.suptitle(title or f"{', '.join(envs) or 'learning curves'}: {shown}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def _draw_row(axes: Any, groups: dict[str, list[Curve]], same: bool, use_minutes: bool,
              frame_skip: int) -> None:
    """One metric's two panels: against env steps (or frames) and against wall time."""
    for i, (label, members) in enumerate(sorted(groups.items())):
        colour = f"C{i % 10}"
        for ax, axis in zip(axes, ("steps", "seconds"), strict=True):
            scale = (60.0 if use_minutes else 1.0) if axis == "seconds" else 1 / frame_skip
            if len(members) == 1:
                c = members[0]
                ax.plot(getattr(c, axis) / scale, c.returns, color=colour, linewidth=1.5,
                        label=label)
                continue
            grid, mean, std = _mean_band(members, axis)
            ax.plot(grid / scale, mean, color=colour, linewidth=1.5,
                    label=label if same else f"{label} (mean of {len(members)})")
            ax.fill_between(grid / scale, mean - std, mean + std, color=colour, alpha=0.2,
                            linewidth=0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)  # from the start: a slow start-up is part of the picture
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4), useMathText=True)
