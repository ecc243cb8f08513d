"""``zmqrl surgery RUN_DIR NEW.yaml --check``: what a changed topology would do to a
stopped run's trained models, before anything is touched.

For every model checkpoint of the run (a file of ``checkpoints/`` holding ``model``: the
learners'), the run's own topology (``RUN_DIR/topology.yaml``) builds the old model and
loads it, the new topology builds the new one, and
:func:`zmqrl.parts.surgery.net2net.carry` carries one into the other in memory. Reported
per checkpoint: each parameter copied, transformed (and how) or new, or the refusal
naming the layer; and the largest difference of each output on a sample of
observations — the replay's stored ones where its checkpoint has them, else ones the new
topology's env gives under random actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.parts.checkpoint import TORCH, existing_checkpoints
from zmqrl.run.topology import Topology, load

SAMPLE = 256  # observations the outputs are compared on


@dataclass
class Checked:
    """One checkpoint's surgery, as it would be done."""

    path: Path
    lines: list[str] = field(default_factory=list)
    refused: str | None = None
    differences: dict[str, float] = field(default_factory=dict)
    observations: str = ""


def check(run_dir: Path, new: Topology, inputs: list[int] | None = None,
          logit_tolerance: float = 1e-4) -> list[Checked]:
    """What carrying each of ``run_dir``'s model checkpoints into ``new``'s model does."""
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.parts.surgery.net2net import SurgeryRefused, carry
    from zmqrl.parts.surgery.net2net import check as compare

    old = load(run_dir / "topology.yaml")
    old_spec, new_spec = env_spec(old.env), env_spec(new.env)
    obs, where = _observations(run_dir, new, new_spec)
    results = []
    for path in existing_checkpoints(run_dir):
        if not path.name.endswith(TORCH.suffix):
            continue
        state = TORCH.load(path)
        if not isinstance(state, dict) or "model" not in state:
            continue  # not a model's checkpoint (a pool, a roster, the broker's)
        checked = Checked(path, observations=where)
        old_model = build_model(old.model, old_spec, old.seed, algo=old.algo_config)
        old_model.load_state_dict(state["model"])
        new_model = build_model(new.model, new_spec, new.seed, algo=new.algo_config)
        try:
            report = carry(old_model, new_model, inputs=inputs,
                           logit_tolerance=logit_tolerance)
        except SurgeryRefused as exc:
            checked.refused = str(exc)
        else:
            checked.lines = report.lines()
            checked.differences = compare(old_model, new_model, obs, inputs)
        results.append(checked)
    return results


def _observations(run_dir: Path, topo: Topology, spec: Any) -> tuple[Any, str]:
    """Observations to compare the models on: the replay's stored ``obs`` when they have
    the new env's shape, else the new env's under random actions."""
    import torch

    from zmqrl.parts.checkpoint import NPZ

    for path in existing_checkpoints(run_dir):
        if path.name.endswith(NPZ.suffix):
            try:
                stored = NPZ.load(path)
            except (OSError, ValueError):
                continue
            for key, value in stored.items():
                if key.split("/")[-1] == "obs" and value.ndim >= 1 and len(value) \
                        and tuple(value.shape[1:]) == tuple(spec.obs_shape):
                    pick = np.random.default_rng(0).choice(len(value),
                                                           min(SAMPLE, len(value)),
                                                           replace=False)
                    return torch.as_tensor(value[pick]), f"{len(pick)} stored in {path.name}"
    import gymnasium as gym

    env = gym.make(topo.env["id"], **topo.env.get("kwargs", {}))
    env.action_space.seed(0)
    rows, (ob, _) = [], env.reset(seed=0)
    while len(rows) < SAMPLE:
        rows.append(np.asarray(ob))
        ob, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            ob, _ = env.reset()
    env.close()
    return torch.as_tensor(np.stack(rows)), f"{SAMPLE} from {topo.env['id']} under random actions"
