"""SEED on the bus against single-process PPO (Stable-Baselines3), side by side.

    pip install -e '.[sb3]'
    python benchmarks/vs_sb3.py [--seeds 1 2 3 4 5] [--max-seconds 120]

For each seed, alternately (so both see the same machine): Stable-Baselines3's PPO with
the rl-zoo CartPole-v1 settings, in a fresh process, until the mean return of its last
20 episodes reaches 475; then ``zmqrl up topologies/seed.yaml --target-return 475``
(the mean of the last 100 episodes, a stricter bar). Wall time is measured around each
whole process, interpreter and imports included: what a user waits for. Prints one
markdown row per run and the medians.

``--sb3-only-child SEED`` is this script's own SB3 process (not for direct use).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import run as zmqrl_run  # noqa: E402 (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
TARGET = 475.0
SB3_WINDOW = 20  # episodes SB3's bar averages over (the issue's table)
SB3_DONE = re.compile(r"sb3: reached=(\w+) env_steps=(\d+) return=([\d.]+)")


def sb3_child(seed: int, max_seconds: float) -> None:
    """Train SB3 PPO (rl-zoo's CartPole-v1 hyperparameters) until the mean of the last
    20 episodes reaches 475, then print one result line."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)

    class StopAtTarget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.started = time.monotonic()
            self.reached = False

        def _on_step(self) -> bool:
            episodes = self.model.ep_info_buffer
            if len(episodes) >= SB3_WINDOW:
                mean = sum(e["r"] for e in episodes) / len(episodes)
                if mean >= TARGET:
                    self.reached = True
                    return False
            return time.monotonic() - self.started < max_seconds

    # rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 (linear schedules as there).
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                n_epochs=20, ent_coef=0.0, learning_rate=lambda f: 1e-3 * f,
                clip_range=lambda f: 0.2 * f, stats_window_size=SB3_WINDOW, seed=seed,
                device="cpu", verbose=0)
    stop = StopAtTarget()
    # rl-zoo trains 1e5 steps: its linear schedules decay over those
    model.learn(total_timesteps=100_000, callback=stop)
    episodes = model.ep_info_buffer
    mean = sum(e["r"] for e in episodes) / max(1, len(episodes))
    print(f"sb3: reached={stop.reached} env_steps={model.num_timesteps} return={mean:.1f}",
          flush=True)


def sb3_run(seed: int, max_seconds: float) -> dict:
    start = time.monotonic()
    out = subprocess.run([sys.executable, __file__, "--sb3-only-child", str(seed),
                          "--max-seconds", str(max_seconds)], capture_output=True, text=True,
                         check=True).stdout
    wall = time.monotonic() - start
    reached, steps, ret = SB3_DONE.search(out).groups()
    return {"reached": reached == "True", "wall_s": wall, "env_steps": int(steps),
            "return": ret, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--max-seconds", type=float, default=120)
    parser.add_argument("--sb3-only-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_only_child is not None:
        sb3_child(args.sb3_only_child, args.max_seconds)
        return
    topology = str(REPO / "topologies" / "seed.yaml")
    print("| seed | SB3 PPO: wall s / env steps / return(20) | zmqrl SEED: wall s / env steps "
          "/ return(100) | load (1 min) |")
    print("|---|---|---|---|")
    results: dict[str, list[dict]] = {"sb3": [], "zmqrl": []}
    for seed in args.seeds:
        sb3 = sb3_run(seed, args.max_seconds)
        ours = zmqrl_run(topology, seed, TARGET, args.max_seconds, [])
        results["sb3"].append(sb3)
        results["zmqrl"].append(ours)
        mark = {True: "", False: " (not reached)"}
        print(f"| {seed} | {sb3['wall_s']:.1f} / {sb3['env_steps']:,} / {sb3['return']}"
              f"{mark[sb3['reached']]} | {ours['wall_s']:.1f} / {ours['env_steps']:,} / "
              f"{ours['return_100']}{mark[ours['reached']]} | {ours['load']:.1f} |", flush=True)
    for name, runs in results.items():
        ok = [r for r in runs if r["reached"]]
        if ok:
            print(f"{name}: {len(ok)}/{len(runs)} reached; median wall "
                  f"{statistics.median(r['wall_s'] for r in ok):.1f} s, env steps "
                  f"{statistics.median(r['env_steps'] for r in ok):,.0f}")
        else:
            print(f"{name}: 0/{len(runs)} reached")


if __name__ == "__main__":
    main()
