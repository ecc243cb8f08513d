"""Does a trained HalfCheetah policy run upright or on its back? HalfCheetah's known local
optimum is a cheetah that flipped and runs on its back (~1,000): this rolls the run's
learner out for one deterministic episode and reports the return and the root's pitch.

    python benchmarks/halfcheetah_pitch.py RUN_DIR [RUN_DIR ...] [--label learner]

The run's own topology builds the model; its ``checkpoints/<label>.pt`` gives the weights;
``model.act`` (the policy's action, no exploration noise) steps ``HalfCheetah-v5`` from
seed 0 for one episode. The pitch is ``qpos[2]`` (radians; upright near 0, on its back
near ±pi): reported as its mean and the share of steps past pi/2.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

from zmqrl.parts.envs import env_spec
from zmqrl.parts.models import build_model
from zmqrl.run.topology import load


def rollout(run_dir: str, label: str) -> tuple[float, np.ndarray]:
    topo = load(f"{run_dir}/topology.yaml")
    model = build_model(topo.model, env_spec(topo.env), topo.seed, algo=topo.algo_config)
    state = torch.load(f"{run_dir}/checkpoints/{label}.pt", map_location="cpu",
                       weights_only=True)
    model.load_state_dict(state["model"])
    model.eval()
    env = gym.make("HalfCheetah-v5")
    obs, _ = env.reset(seed=0)
    total, pitch = 0.0, []
    while True:
        with torch.no_grad():
            action = model.act(torch.as_tensor(obs, dtype=torch.float32)[None])[0].numpy()
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        pitch.append(float(env.unwrapped.data.qpos[2]))
        if terminated or truncated:
            return total, np.array(pitch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--label", default="learner", help="the checkpoint's node label")
    args = parser.parse_args()
    for run_dir in args.run_dirs:
        total, pitch = rollout(run_dir, args.label)
        flipped = float(np.mean(np.cos(pitch) < 0))
        print(f"{run_dir}: return {total:.0f}; pitch mean {pitch.mean():.2f} rad, past pi/2 "
              f"in {flipped:.0%} of steps ({'on its back' if flipped > 0.5 else 'upright'})")


if __name__ == "__main__":
    main()
