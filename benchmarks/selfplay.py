"""Self-play with an opponent pool: what BENCHMARKS.md records for topologies/selfplay.yaml.

    python benchmarks/selfplay.py [--budget 300] [--every 30] [--games 100]
                                  [--game tic_tac_toe] [--mcts-simulations 25]

Runs the topology for ``--budget`` seconds of wall time, its league evaluating the latest
policy every ``--every`` seconds with ``--games`` games per fixed opponent (half in each
seat), and prints one row per evaluation from the league's metrics: seconds since the
start, the parameter version, the win rate and score (draws half) against a uniformly
random player and against OpenSpiel's MCTS bot, and the latest policy's Elo (random = 0).
The last line says the machine's load average: on a shared machine that is what makes
figures comparable.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300.0)
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument("--games", type=int, default=100)
    parser.add_argument("--game", default="tic_tac_toe")
    parser.add_argument("--mcts-simulations", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zmqrl-selfplay-") as tmp:
        run_dir = Path(tmp) / "run"
        sets = {"env.id": f"zmqrl/OpenSpiel-{args.game}-v0",
                "nodes.league.args.eval_every_s": args.every,
                "nodes.league.args.games": args.games,
                "nodes.league.args.mcts_simulations": args.mcts_simulations}
        command = [sys.executable, "-m", "zmqrl.cli", "up", str(REPO / "topologies" /
                   "selfplay.yaml"), "--run-dir", str(run_dir), "--max-seconds",
                   str(args.budget)]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True)
        load = os.getloadavg()[0]
        with open(run_dir / "metrics" / "league.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    print(f"{args.game}, {args.games} games an evaluation, MCTS-{args.mcts_simulations}")
    print("seconds  version  win_random  score_random  win_mcts  score_mcts  elo_latest")
    seen = set()
    for row in rows:
        n = row.get("eval/evaluations")
        if not n or n in seen:
            continue
        seen.add(n)
        print(f"{float(row['time_s']):7.0f}  {row['eval/param_version']:>7}  "
              f"{float(row['eval/win_rate_random']):10.2f}  {float(row['eval/score_random']):12.2f}"
              f"  {float(row['eval/win_rate_mcts']):8.2f}  {float(row['eval/score_mcts']):10.2f}"
              f"  {float(row['population/elo_latest']):10.0f}")
    print(f"load {load:.1f} (1-minute average at the end)")


if __name__ == "__main__":
    main()
