"""Env steps/s while learning Pong, configurations taking turns (A B C A B C ...).

    python benchmarks/pong_speed.py --rounds 2 --seconds 90 \\
        --config "shipped=" \\
        --config "learner 2 threads=nodes.learner.args.threads=2" \\
        --config "v-trace (before)=/tmp/seed_atari_before.yaml"

Each configuration is ``topologies/seed_atari.yaml`` (``--topology``), or the topology
file its first item names (ending in ``.yaml``), with its ``--set``s (comma-separated
after the ``=``), run by ``zmqrl up --max-seconds`` on its own, one after
the other in rounds, so that the machine's drift (10-30 % a minute here) spreads over all
of them. Reported per run: the learner's env steps/s (the rows after ``--skip`` seconds:
start-up and the first updates left out), and every node's CPU in cores, which says
which node limits the run and how much of the machine stays idle; then each
configuration's mean over its rounds and its ratio to the first configuration's.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(topology: Path, sets: list[str], seconds: float, skip: float, work: Path
             ) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(dir=work))
    args = [sys.executable, "-m", "zmqrl.cli", "up", str(topology), "--run-dir",
            str(run_dir / "run"), "--max-seconds", str(seconds)]
    for s in sets:
        args += ["--set", s]
    subprocess.run(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, timeout=seconds + 120)
    metrics = run_dir / "run" / "metrics"
    out: dict[str, float] = {}
    for path in sorted(metrics.glob("*.csv")):
        rows = [r for r in csv.DictReader(path.open()) if float(r["time_s"]) >= skip]
        if path.stem == "learner":
            steps = [(float(r["time_s"]), float(r["env_steps"])) for r in rows]
            out["steps_per_s"] = (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])
        cpu = [float(r["cpu_cores"]) for r in rows if r.get("cpu_cores")]
        if cpu:
            out[f"cpu_{path.stem}"] = statistics.mean(cpu)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topology", type=Path, default=REPO / "topologies" / "seed_atari.yaml")
    p.add_argument("--config", action="append", required=True, metavar="NAME=SET,SET",
                   help="a configuration: its name, then its --sets (comma-separated)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--skip", type=float, default=30.0)
    a = p.parse_args()
    configs = []
    for c in a.config:
        name, _, items = c.partition("=")
        sets = [s for s in items.split(",") if s]
        topology = Path(sets.pop(0)) if sets and sets[0].endswith(".yaml") else a.topology
        configs.append((name, topology, sets))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in configs}
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            for name, topology, sets in configs:
                m = run_once(topology, sets, a.seconds, a.skip, Path(work))
                results[name].append(m)
                cpus = "  ".join(f"{k[4:]} {v:.2f}" for k, v in sorted(m.items())
                                 if k.startswith("cpu_"))
                print(f"round {r + 1}  {name:28} {m['steps_per_s']:7.0f} steps/s   "
                      f"cores: {cpus}", flush=True)
    base = statistics.mean(m["steps_per_s"] for m in results[configs[0][0]])
    print()
    for name, _, _ in configs:
        rates = [m["steps_per_s"] for m in results[name]]
        print(f"{name:28} mean {statistics.mean(rates):7.0f} steps/s "
              f"(runs {', '.join(f'{x:.0f}' for x in rates)})  "
              f"ratio {statistics.mean(rates) / base:.2f}")


if __name__ == "__main__":
    main()
