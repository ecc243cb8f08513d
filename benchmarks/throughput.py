"""Env steps per second while learning, and whether the learner keeps up.

    python benchmarks/throughput.py [--seeds 1 2 3] [--seconds 60] [--warmup 10]
        [--set key.path=value ...] T.yaml...

Each run is `zmqrl up T --max-seconds S --set seed=N` in a fresh process. From its
metrics, over the steady state (after ``--warmup`` seconds, to the last row before the
stop), it reports per run: env steps/s; the share of those env steps the learner trained
on (updates x batch_size x unroll over env steps: 1.0 means it keeps up, and a broker
that cannot hand unrolls over stops its actors rather than dropping them); the learner's
policy lag (parameter versions between acting and training, median of its rows); the
mean return of the last 100 episodes at the end; and the CPU of each node (cores, from
their ``cpu_cores`` column). Prints one markdown row per run and a median row per
topology.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from zmqrl.cli import _overrides
from zmqrl.run.topology import load


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def steady(table: list[dict[str, str]], warmup: float) -> list[dict[str, str]]:
    """Rows after the warm-up, without the last (written while stopping)."""
    return [r for r in table[:-1] if float(r["time_s"]) >= warmup]


def rate(table: list[dict[str, str]], column: str) -> float:
    first, last = table[0], table[-1]
    return ((float(last[column]) - float(first[column]))
            / (float(last["time_s"]) - float(first["time_s"])))


def run(topology: str, seed: int, seconds: float, warmup: float,
        overrides: list[str]) -> dict:
    topo = load(topology, _overrides(tuple(overrides)))
    steps_per_update = topo.algo_config.batch_size * topo.algo_config.unroll
    with tempfile.TemporaryDirectory(prefix="zmqrl-throughput-") as tmp:
        cmd = [sys.executable, "-m", "zmqrl.cli", "up", topology, "--max-seconds",
               str(seconds), "--set", f"seed={seed}", "--run-dir", tmp]
        for override in overrides:
            cmd += ["--set", override]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        metrics = Path(tmp) / "metrics"
        run_rows = steady(rows(metrics / "run.csv"), warmup)
        learner = steady(rows(metrics / "learner.csv"), warmup)
        cpu = {p.stem: statistics.mean(float(r["cpu_cores"]) for r in steady(rows(p), warmup))
               for p in sorted(metrics.glob("*.csv")) if p.stem != "run"}
    env_rate = rate(run_rows, "env_steps")
    return {"steps_per_s": env_rate,
            "trained": rate(run_rows, "updates") * steps_per_update / env_rate,
            "lag": statistics.median(float(r["policy_lag"]) for r in learner
                                     if r.get("policy_lag") not in ("", None)),
            "return_100": float(run_rows[-1]["return_mean_100"]),
            "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topologies", nargs="+")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=10)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="topology override, as for zmqrl up")
    args = parser.parse_args()
    print("| topology | seed | env steps/s | trained on | policy lag | return(100) at the end "
          "| CPU (cores) |")
    print("|---|---|---|---|---|---|---|")
    for topology in args.topologies:
        runs = []
        for seed in args.seeds:
            r = run(topology, seed, args.seconds, args.warmup, args.overrides)
            runs.append(r)
            cpu = ", ".join(f"{label} {cores:.2f}" for label, cores in r["cpu"].items())
            print(f"| {Path(topology).stem} | {seed} | {r['steps_per_s']:,.0f} | "
                  f"{r['trained']:.3f} | {r['lag']:.2f} | {r['return_100']:.1f} | {cpu} |",
                  flush=True)
        print(f"| {Path(topology).stem} | median | "
              f"{statistics.median(r['steps_per_s'] for r in runs):,.0f} | "
              f"{statistics.median(r['trained'] for r in runs):.3f} | "
              f"{statistics.median(r['lag'] for r in runs):.2f} | "
              f"{statistics.median(r['return_100'] for r in runs):.1f} | |", flush=True)


if __name__ == "__main__":
    main()
