"""BENCHMARKS.md's rows from a fetched ``benchmarks/gpu.sh`` result, and the Pong curve.

    python benchmarks/gpu_report.py OUT_DIR [-o docs/pong_gpu.png]

Reads ``OUT_DIR/gpu.json`` (and ``OUT_DIR/pong/run.csv`` for the full curve, where it
came back), prints markdown tables (host, the CUDA tests, zmqrl bench, the Pong run, the
scaling) and draws return(100) against wall time with a line at 18 (matplotlib).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any

TARGET = 18.0


def fmt(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def host(results: dict[str, Any]) -> str:
    h = results.get("host", {})
    smi = h.get("nvidia_smi") or []
    gpu = h.get("gpu") or (smi[0] if smi else "no GPU")
    memory = f", {smi[1]} MiB" if len(smi) > 1 else ""
    return (f"{results.get('started_utc', '?')[:10]}: {gpu}{memory}, "
            f"{h.get('cpus_usable', '?')} cores, torch {h.get('torch', '?')}, "
            f"Python {h.get('python', '?')}; the script took {fmt(results.get('seconds'))} s"
            + (" (dry run)" if results.get("dry_run") else "")
            + (f"; failed: {', '.join(results['failed'])}" if results.get("failed") else ""))


def tests(step: dict[str, Any]) -> str:
    return table(["pytest -m gpu", "passed", "failed", "skipped", "seconds"],
                 [[step.get("status", "?"), fmt(step.get("passed")), fmt(step.get("failed")),
                   fmt(step.get("skipped")), fmt(step.get("seconds"))]])


def bench(step: dict[str, Any]) -> str:
    rows = []
    for run in step.get("runs", []):
        r = run.get("report")
        if r is None:
            rows.append([Path(run["topology"]).stem,
                         f"{run['actors']} × {run['envs']}", str(run["lanes"])]
                        + ["failed"] + ["—"] * 4)
            continue
        latency = (f"{r['latency_p50_ms']} / {r['latency_p99_ms']} ms"
                   if r.get("latency_p50_ms") is not None else "—")
        rows.append([f"{Path(run['topology']).stem} ({r['env']})",
                     f"{r['actors']} × {r['envs_per_actor']}", str(r["lanes"]),
                     fmt(r["limit_steps_per_s"]), fmt(r["topology_steps_per_s"]),
                     f"**{r['ratio']:.2f}**", fmt(r["batch_envs_mean"], 1), latency])
    return table(["topology", "actors × envs", "lanes", "limit, 1 process (steps/s)",
                  "topology (steps/s)", "ratio", "broker batch", "latency p50 / p99"], rows)


def at(curve: list[list[float]], seconds: float) -> float | None:
    """return(100) of the last point at or before ``seconds``."""
    before = [r for t, r in curve if t <= seconds]
    return before[-1] if before else None


def pong(step: dict[str, Any], curve: list[list[float]]) -> str:
    budget = step.get("seconds_budget") or 300
    marks = [budget * f for f in (0.2, 0.5, 1.0)]
    returns = " → ".join(fmt(at(curve, t), 1) for t in marks)
    gpu = step.get("gpu")
    actors = step.get("actors_cpu") or {}
    reached = step.get("first_reached_18_s")
    return table(
        ["env steps", "frames/s", "learner updates (/s)", "return(100) at "
         + " → ".join(f"{t:g} s" for t in marks), "first ≥ 18", "GPU util mean / max",
         "actors' CPU (cores each)", "broker / learner CPU"],
        [[fmt(step.get("env_steps")), fmt(step.get("frames_per_s")),
          f"{fmt(step.get('learner_updates'))} ({fmt(step.get('updates_per_s'), 1)})",
          returns, f"**{reached:g} s**" if reached is not None else "not reached",
          f"{gpu['util_mean']} / {gpu['util_max']} %" if gpu else "—",
          f"{fmt(actors.get('cores_mean'), 2)} ({actors['count']} "
          f"actor{'s' if actors['count'] != 1 else ''})"
          if actors else "—",
          f"{fmt(step.get('cpu_cores', {}).get('broker'), 2)} / "
          f"{fmt(step.get('cpu_cores', {}).get('learner'), 2)}"]])


def scaling(step: dict[str, Any]) -> str:
    rows = []
    for row in step.get("rows", []):
        if "ratio" not in row:
            rows.append([str(row["actors"]), "failed"] + ["—"] * 4)
            continue
        rows.append([str(row["actors"]), fmt(row["topology_steps_per_s"]),
                     fmt(row["copies_steps_per_s"]), f"**{row['ratio']:.2f}**",
                     fmt(row["bench_ratio"], 2), fmt(row["cpu_cores"].get("broker"), 2)])
    goal = step.get("goal")
    note = (f"\n\nGoal ≥ 0.8 at {goal['actors']} actors: {goal['ratio']:.2f}, "
            + ("met" if goal["met"] else "not met")) if goal else ""
    return table(["actors", "topology (steps/s)", "N copies of the limit (steps/s)",
                  "ratio", "zmqrl bench's ratio (1 process, N × envs)", "broker (cores)"],
                 rows) + note


def full_curve(out: Path, step: dict[str, Any]) -> list[list[float]]:
    """return(100) against wall time: the copied run.csv where it came back, else the
    JSON's (thinned) curve."""
    path = out / "pong" / "run.csv"
    if path.exists():
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r.get("episodes") or 0) > 0]
        points = [[float(r["time_s"]), float(r["return_mean_100"])] for r in rows
                  if r["return_mean_100"] not in ("", "nan")]
        if points:
            return points
    return step.get("curve") or []


def draw(curve: list[list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([t for t, _ in curve], [r for _, r in curve], label="return(100)")
    ax.axhline(TARGET, color="grey", linestyle="--", label=f"{TARGET:g}")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("mean return, last 100 episodes")
    ax.set_ylim(-21.5, 21.5)
    ax.set_xlim(left=0)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder holding gpu.json")
    parser.add_argument("-o", "--plot", type=Path,
                        help="the Pong curve's PNG (default: OUT/pong_curve.png)")
    args = parser.parse_args()
    results = json.loads((args.out / "gpu.json").read_text())
    steps = results.get("steps", {})
    print(host(results) + "\n")
    if "gpu_tests" in steps:
        print(tests(steps["gpu_tests"]) + "\n")
    if "bench" in steps:
        print(bench(steps["bench"]) + "\n")
    if "pong" in steps:
        curve = full_curve(args.out, steps["pong"])
        print(pong(steps["pong"], curve) + "\n")
        if curve:
            plot = args.plot or args.out / "pong_curve.png"
            gpu = (results.get("host", {}).get("gpu") or "CPU")
            draw(curve, plot, f"SEED on Pong, {gpu}")
            print(f"![Pong: return(100) against wall time]({plot})\n")
    if "scaling" in steps:
        print(scaling(steps["scaling"]))


if __name__ == "__main__":
    main()
