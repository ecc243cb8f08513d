"""Off-policy continuous control on the bus against single-process SAC (Stable-Baselines3),
side by side in one sitting, at the same wall-clock budget.

    python3 -m venv ~/sb3venv && ~/sb3venv/bin/pip install torch==2.13.0 \\
        stable-baselines3 'gymnasium[mujoco]>=1.1'      # SB3 in its own venv, not ours
    python benchmarks/off_policy_mujoco.py --sb3-python ~/sb3venv/bin/python \\
        [--seeds 1 2 3] [--minutes 15] [--env HalfCheetah-v5] [--out runs/offpolicy]
    python benchmarks/off_policy_mujoco.py --report --out runs/offpolicy   # tables of all runs
    zmqrl plot runs/offpolicy/*/ -o docs/offpolicy_halfcheetah.png --metric return_mean_20

For each seed, one after another (so every arm sees the same machine): SB3's SAC with its
defaults and rl-zoo's ``learning_starts: 10000`` for MuJoCo, in a fresh process of its
own venv with torch's default threads (what a user gets); then ``zmqrl up`` of
``apex_dpg.yaml`` and of ``seed_sac.yaml``, each for the same budget. Every arm writes a
run directory (``metrics/run.csv``: wall time, env steps, mean return of the last 20 and
100 episodes, updates; ``topology.yaml`` names it), so ``zmqrl plot`` draws all three.
Wall time starts with the process: imports and start-up count, as a user waits for them.

Prints one markdown row per run (return at the end, env steps/s, updates/s, the replay
ratio: updates × batch / env steps; the worst-busy node's CPU for zmqrl) and per arm the
median return at the budget and when each zmqrl run first reached SB3's median.

``--sb3-child SEED RUN_DIR`` is this script's own SB3 process (not for direct use).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ZMQRL_TOPOLOGIES = ("apex_dpg", "seed_sac")
FIELDS = ("time_s", "env_steps", "episodes", "return_mean_20", "return_mean_100", "updates")


def sb3_child(seed: int, run_dir: Path, seconds: float, env_id: str) -> None:
    """SB3 SAC until ``seconds`` of wall time, writing run.csv rows every 5 s."""
    started = time.monotonic()
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    (run_dir / "topology.yaml").write_text(f"name: sb3-sac\nenv: {{id: {env_id}}}\n")
    out = open(run_dir / "metrics" / "run.csv", "w", newline="")
    writer = csv.writer(out)
    writer.writerow(FIELDS)

    class Log(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_row = 0.0
            self.returns: list[float] = []

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            now = time.monotonic() - started
            if now >= self.next_row:
                self.next_row = now + 5.0
                last20, last100 = self.returns[-20:], self.returns[-100:]
                writer.writerow([round(now, 2), self.num_timesteps, len(self.returns),
                                 round(sum(last20) / len(last20), 2) if last20 else "nan",
                                 round(sum(last100) / len(last100), 2) if last100 else "nan",
                                 self.model._n_updates])
                out.flush()
            return now < seconds

    model = SAC("MlpPolicy", env_id, learning_starts=10_000, seed=seed, device="cpu",
                verbose=0)
    model.learn(total_timesteps=10**8, callback=Log())
    out.close()


def final_row(run_dir: Path) -> dict[str, float]:
    with open(run_dir / "metrics" / "run.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    return {k: float(rows[-1][k]) for k in FIELDS}


def first_reaching(run_dir: Path, value: float) -> float | None:
    """Seconds at which the run's mean return of the last 20 episodes first reached
    ``value`` (None: never)."""
    with open(run_dir / "metrics" / "run.csv", newline="") as f:
        for r in csv.DictReader(f):
            ret = float(r["return_mean_20"])
            if ret == ret and ret >= value:
                return float(r["time_s"])
    return None


def node_cpu(run_dir: Path) -> str:
    """Each node replica's mean cpu_cores over the run."""
    parts = []
    for path in sorted((run_dir / "metrics").glob("*.csv")):
        if path.stem == "run":
            continue
        with open(path, newline="") as f:
            cpu = [float(r["cpu_cores"]) for r in csv.DictReader(f) if r.get("cpu_cores")]
        if cpu:
            parts.append(f"{path.stem} {statistics.mean(cpu):.2f}")
    return ", ".join(parts)


def at_time(run_dir: Path, seconds: float) -> float | None:
    """The run's mean return of the last 20 episodes at its last row by ``seconds``."""
    with open(run_dir / "metrics" / "run.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if float(r["time_s"]) <= seconds]
    value = float(rows[-1]["return_mean_20"]) if rows else float("nan")
    return None if value != value else value


def row(arm: str, seed: int, run_dir: Path) -> str:
    """One markdown row of the results table (the replay ratio: updates × 256 / env steps)."""
    end = final_row(run_dir)
    ratio = end["updates"] * 256 / max(end["env_steps"], 1)
    cpu = "(one process)" if arm == "sb3" else node_cpu(run_dir)
    return (f"| {arm} | {seed} | {end['return_mean_20']:.0f} | {end['env_steps']:,.0f} | "
            f"{end['env_steps'] / end['time_s']:.0f} | {end['updates'] / end['time_s']:.0f} "
            f"| {ratio:.1f} | {cpu} |")


def summary(runs: dict[str, list[Path]], minutes: float) -> None:
    """Per arm: the median return at the budget, the return by wall time of each run,
    and when each zmqrl run first reached SB3's median."""
    medians = {arm: statistics.median(final_row(d)["return_mean_20"] for d in dirs)
               for arm, dirs in runs.items() if dirs}
    for arm, value in medians.items():
        print(f"{arm}: median return(20) at {minutes:g} min: {value:.0f}")
    marks = [m for m in (2.5, 5, 7.5, 10, 12.5, 15) if m <= minutes]
    print("\n| arm | seed | " + " | ".join(f"{m:g} min" for m in marks) + " |")
    print("|---|---|" + "---|" * len(marks))
    for arm, dirs in runs.items():
        for d in dirs:
            cells = [at_time(d, m * 60) for m in marks]
            print(f"| {arm} | {d.name.rsplit('seed', 1)[1]} | "
                  + " | ".join("–" if c is None else f"{c:.0f}" for c in cells) + " |")
    if "sb3" in medians:
        for arm in ZMQRL_TOPOLOGIES:
            if runs.get(arm):
                reached = [first_reaching(d, medians["sb3"]) for d in runs[arm]]
                shown = ", ".join("never" if r is None else f"{r:.0f} s" for r in reached)
                print(f"{arm}: first reached SB3's median {medians['sb3']:.0f} at {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sb3-python", help="the python of a venv with stable-baselines3")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--out", default="runs/offpolicy")
    parser.add_argument("--arms", nargs="+", default=["sb3", *ZMQRL_TOPOLOGIES])
    parser.add_argument("--report", action="store_true",
                        help="run nothing: the tables of every finished run under --out")
    parser.add_argument("--sb3-child", nargs=2, metavar=("SEED", "RUN_DIR"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    seconds = args.minutes * 60
    if args.sb3_child:
        sb3_child(int(args.sb3_child[0]), Path(args.sb3_child[1]), seconds, args.env)
        return
    out = Path(args.out)
    runs: dict[str, list[Path]] = {arm: [] for arm in args.arms}
    print("| arm | seed | return(20) at the end | env steps | env steps/s | updates/s | "
          "replay ratio | mean cpu_cores per node |")
    print("|---|---|---|---|---|---|---|---|")
    if args.report:  # runs made by earlier invocations (seeds split across sittings)
        for arm in args.arms:
            for run_dir in sorted(out.glob(f"{arm}-seed*")):
                # finished: its rows reach the budget (one running now is left out)
                if (run_dir / "metrics" / "run.csv").exists() and \
                        final_row(run_dir)["time_s"] >= seconds - 15:
                    runs[arm].append(run_dir)
                    print(row(arm, int(run_dir.name.rsplit("seed", 1)[1]), run_dir))
        summary(runs, args.minutes)
        return
    for seed in args.seeds:
        for arm in args.arms:
            run_dir = out / f"{arm}-seed{seed}"
            if arm == "sb3":
                if not args.sb3_python:
                    parser.error("the sb3 arm needs --sb3-python")
                cmd = [args.sb3_python, __file__, "--sb3-child", str(seed), str(run_dir),
                       "--minutes", str(args.minutes), "--env", args.env]
            else:
                cmd = [sys.executable, "-m", "zmqrl.cli", "up",
                       str(REPO / "topologies" / f"{arm}.yaml"), "--run-dir", str(run_dir),
                       "--max-seconds", str(seconds), "--set", f"seed={seed}",
                       "--set", f"env.id={args.env}"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            runs[arm].append(run_dir)
            print(row(arm, seed, run_dir), flush=True)
    summary(runs, args.minutes)


if __name__ == "__main__":
    main()
