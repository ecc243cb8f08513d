"""Side by side: how long each run took to a return, in env steps and wall time.

Reads each run directory's ``metrics/run.csv`` (a ``zmqrl up`` run, or
``benchmarks/pong_reference.py``'s ``--out``, which writes the same file) and prints, for
each, the first point where the mean return of the last 100 episodes reached ``--target``
(100 episodes finished at least), the env steps (and frames) and seconds to it, the mean
env steps/s up to it, and the wall-time ratio to the first run given (the reference):

    python benchmarks/pong_compare.py runs/pong-reference runs/seed-atari-pong-* --target -15

A run that never got there is reported with how far it got.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import yaml

FRAME_SKIP = 4


def first_reach(run_dir: Path, target: float) -> dict[str, float | str | None]:
    rows = list(csv.DictReader((run_dir / "metrics" / "run.csv").open()))
    name = yaml.safe_load((run_dir / "topology.yaml").read_text()).get("name", run_dir.name)
    best, last = float("-inf"), rows[-1] if rows else {}
    for r in rows:
        ret, episodes = r.get("return_mean_100"), float(r.get("episodes") or 0)
        if not ret or episodes < 100:
            continue
        best = max(best, float(ret))
        if float(ret) >= target:
            return {"name": name, "steps": float(r["env_steps"]), "seconds": float(r["time_s"]),
                    "best": best, "reached": "yes"}
    return {"name": name, "steps": float(last.get("env_steps") or 0),
            "seconds": float(last.get("time_s") or 0), "best": best, "reached": None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories; the first is the "
                   "reference of the ratio")
    p.add_argument("--target", type=float, default=-15.0)
    a = p.parse_args()
    results = [(run, first_reach(run, a.target)) for run in a.runs]
    ref_seconds = results[0][1]["seconds"] if results[0][1]["reached"] else None
    print(f"{'run':40} {'reached':>8} {'env steps':>10} {'frames':>7} {'minutes':>8} "
          f"{'steps/s':>8} {'best':>6} {'time ratio':>10}")
    for run, r in results:
        steps, seconds = float(r["steps"]), float(r["seconds"])
        ratio = (f"{seconds / ref_seconds:.2f}" if ref_seconds and r["reached"] else "-")
        print(f"{str(r['name'])[:24] + ' ' + run.name[-15:]:40} "
              f"{'yes' if r['reached'] else 'no':>8} {steps:>10,.0f} "
              f"{steps * FRAME_SKIP / 1e6:>6.2f}M {seconds / 60:>8.1f} "
              f"{steps / max(seconds, 1e-9):>8.0f} {r['best']:>6.1f} {ratio:>10}")


if __name__ == "__main__":
    main()
