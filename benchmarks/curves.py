"""Learning curves: one topology, several env ids and seeds, a fixed budget of env steps
each; what BENCHMARKS.md records for continuous control (MuJoCo) and pixels (MinAtar).

    python benchmarks/curves.py topologies/ppo.yaml --envs Hopper-v5 HalfCheetah-v5 \\
        --seeds 1 2 3 --max-steps 1000000 --plot-dir docs
    python benchmarks/curves.py topologies/seed_minatar.yaml --max-steps 5000000

Each run is `zmqrl up T --set env.id=E --set seed=S --max-steps N` in a fresh process,
(without --envs: the topology's own env), with its run directory kept under runs/curves/
(a finished run is not run again, and an
interrupted one continues from its checkpoints with `zmqrl up --resume`). The curve is
the supervisor's metrics/run.csv: the mean return of the last 20 episodes against env
steps. Prints one markdown row per env (final mean return over the last 100 episodes:
median and mean ± std over seeds, each seed, wall time) and draws one PNG per env with
`zmqrl plot`'s code: the seeds' mean with a band, against env steps and wall time (needs matplotlib:
`pip install -e .[plot]`).
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNS = Path("runs/curves")


def short_name(env_id: str) -> str:
    """``zmqrl/MinAtar-Breakout-v1`` -> ``minatar_breakout``, ``Hopper-v5`` -> ``hopper``."""
    return re.sub(r"-v\d+$", "", env_id.rsplit("/", 1)[-1]).lower().replace("-", "_")


def run(topology: Path, env_id: str, seed: int, max_steps: int) -> dict:
    run_dir = RUNS / f"{topology.stem}-{short_name(env_id)}-s{seed}"
    done_marker = run_dir / "finished.txt"
    if not done_marker.exists():
        # An interrupted run continues from its checkpoints (--max-steps counts them too).
        where = ["--resume" if (run_dir / "topology.yaml").exists() else "--run-dir",
                 str(run_dir)]
        cmd = [sys.executable, "-m", "zmqrl.cli", "up", str(topology), "--set",
               f"env.id={env_id}", "--set", f"seed={seed}", "--max-steps", str(max_steps),
               *where]
        start = time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
        wall = time.monotonic() - start
        if "--max-steps" not in out.splitlines()[-1]:
            raise SystemExit(f"{run_dir}: run did not finish:\n{out[-2000:]}")
        done_marker.write_text(f"{wall:.1f}\n")
    rows = list(csv.DictReader(open(run_dir / "metrics" / "run.csv")))
    return {"seed": seed, "wall_s": float(done_marker.read_text()),
            "final": float(rows[-1]["return_mean_100"]), "run_dir": run_dir}


def plot(env_id: str, topology: str, runs: list[dict], path: Path) -> None:
    from zmqrl.run.plot import plot_runs

    plot_runs([r["run_dir"] for r in runs], path, metric="return_mean_20",
              title=f"{topology} on {env_id} ({len(runs)} seeds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topology", type=Path)
    parser.add_argument("--envs", nargs="+", default=None,
                        help="env ids (default: the topology's own)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--max-steps", type=int, default=1_000_000)
    parser.add_argument("--plot-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.envs is None:
        from zmqrl.run.topology import load

        args.envs = [load(args.topology).env["id"]]
    print("| topology | env | final return(100), median | mean ± std | per seed "
          "| wall time per run |")
    print("|---|---|---|---|---|---|")
    for env_id in args.envs:
        runs = [run(args.topology, env_id, seed, args.max_steps) for seed in args.seeds]
        finals = [r["final"] for r in runs]
        spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
        walls = statistics.mean(r["wall_s"] for r in runs)
        print(f"| {args.topology.stem} | {env_id} | {statistics.median(finals):,.1f} | "
              f"{statistics.mean(finals):,.1f} ± {spread:,.1f} | "
              f"{', '.join(f'{f:,.1f}' for f in finals)} | "
              f"{walls / 60:.1f} min |", flush=True)
        if args.plot_dir:
            args.plot_dir.mkdir(parents=True, exist_ok=True)
            name = f"{args.topology.stem}_{short_name(env_id)}.png"
            plot(env_id, args.topology.stem, runs, args.plot_dir / name)


if __name__ == "__main__":
    main()
