"""Time and env steps to a target return, per topology: what BENCHMARKS.md records.

    python benchmarks/learning.py [--seeds 1 2 3] [--target 475] [--max-seconds 120]
        [--set key.path=value ...] T.yaml...

Each run is `zmqrl up T --target-return R --max-seconds S --set seed=N` in a fresh
process; wall time is measured around it, so process start-up is included. Prints one
markdown row per topology: median wall time and env steps over the seeds that reached
the target, how many did, env steps/s, and per run the machine's mean load average
over the run (sampled every 5 s; the run's own processes count too: on a shared
machine it says how comparable runs are).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FINAL = re.compile(r"env steps ([\d,]+) \| ([\d,]+) steps/s .* return\(100\) ([\d.na]+)")


def run(topology: str, seed: int, target: float, max_seconds: float,
        overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="zmqrl-learning-") as run_dir:
        cmd = [sys.executable, "-m", "zmqrl.cli", "up", topology, "--target-return", str(target),
               "--max-seconds", str(max_seconds), "--set", f"seed={seed}", "--run-dir", run_dir]
        for override in overrides:
            cmd += ["--set", override]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        loads = []
        while True:
            try:
                out = proc.communicate(timeout=5)[0]
                break
            except subprocess.TimeoutExpired:
                loads.append(os.getloadavg()[0])
        wall = time.monotonic() - start
    final = FINAL.findall(out)[-1]
    return {"reached": "target return" in out, "wall_s": wall,
            "env_steps": int(final[0].replace(",", "")),
            "steps_per_s": int(final[1].replace(",", "")), "return_100": final[2],
            "load": statistics.mean(loads) if loads else os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topologies", nargs="+")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--target", type=float, default=475)
    parser.add_argument("--max-seconds", type=float, default=120)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="topology override, as for zmqrl up")
    args = parser.parse_args()
    print("| topology | reached | wall time to target (median) | env steps to target (median) "
          "| env steps/s | runs (wall s / env steps / final return(100) / load avg) |")
    print("|---|---|---|---|---|---|")
    for topology in args.topologies:
        runs = [run(topology, seed, args.target, args.max_seconds, args.overrides)
                for seed in args.seeds]
        ok = [r for r in runs if r["reached"]]
        detail = "; ".join(f"{r['wall_s']:.1f} / {r['env_steps']:,} / {r['return_100']} / "
                           f"{r['load']:.1f}" for r in runs)
        wall = f"{statistics.median(r['wall_s'] for r in ok):.1f} s" if ok else "—"
        steps = f"{statistics.median(r['env_steps'] for r in ok):,.0f}" if ok else "—"
        rate = statistics.median(r["steps_per_s"] for r in runs)
        print(f"| {Path(topology).stem} | {len(ok)}/{len(runs)} | {wall} | {steps} | "
              f"{rate:,.0f} | {detail} |", flush=True)


if __name__ == "__main__":
    main()
