"""Surgery on a stopped run: ``zmqrl surgery RUN_DIR NEW.yaml --check`` says what a
changed topology would do to its trained models; ``zmqrl up NEW.yaml --resume RUN_DIR``
does it (:func:`perform`) before any node starts.

For every model checkpoint of the run (a file of ``checkpoints/`` holding ``model``: the
learners'), the run's own topology (``RUN_DIR/topology.yaml``) builds the old model and
loads it, the new topology builds the new one, and
:func:`zmqrl.parts.surgery.net2net.carry` carries one into the other in memory
(:func:`carry_checkpoint`). Reported per checkpoint: each parameter copied, transformed
(and how) or new, or the refusal naming the layer; and the largest difference of each
output on a sample of observations — the replay's stored ones where its checkpoint has
them, else ones the new topology's env gives under random actions.

:func:`perform` then writes what resuming needs, only once every checkpoint could be
carried: the old ``checkpoints/`` go to ``checkpoints/before-surgery-N/`` with the old
topology (the surgery undone is those files moved back and the old topology resumed);
each learner's checkpoint is written anew with the carried model, its algorithm's state
rebuilt around it (Adam's moments carried where the parameters were,
:mod:`zmqrl.parts.surgery.moments`; a target network copied from the carried model;
counters kept) and its update, env-step and episode counts as they were; each replay's
items are carried when their observations are vectors that gained features (the old
columns placed, the new ones 0) and dropped with a count otherwise; anything else (a
broker's pool, a league) starts afresh. The surgery is recorded in ``surgeries.json``
and marked on the run's first row after it (``metrics/run.csv``'s ``surgery`` column,
TensorBoard's ``run/surgery``).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl import plugins
from zmqrl.parts.checkpoint import (
    NPZ,
    TORCH,
    atomic_write,
    checkpoint_dir,
    existing_checkpoints,
)
from zmqrl.run.topology import Topology, load

RECORD = "surgeries.json"  # in the run directory: one entry per surgery done
BACKUP_PREFIX = "before-surgery-"

SAMPLE = 256  # observations the outputs are compared on


@dataclass
class Checked:
    """One checkpoint's surgery, as it would be done."""

    path: Path
    lines: list[str] = field(default_factory=list)
    refused: str | None = None
    differences: dict[str, float] = field(default_factory=dict)
    observations: str = ""
    state: dict[str, Any] | None = None  # the checkpoint to write (None: refused)


class SurgeryError(RuntimeError):
    """The surgery cannot be done; nothing of the run was touched."""


def needed(run_dir: Path, new: Topology) -> bool:
    """Whether resuming ``run_dir`` under ``new`` changes a trained model's shape: its
    model section, or the env's observation or action spaces."""
    from zmqrl.parts.envs import env_spec

    old = load(run_dir / "topology.yaml")
    if old.model != new.model:
        return True
    a, b = env_spec(old.env), env_spec(new.env)
    return (tuple(a.obs_shape), a.num_actions, tuple(a.action_shape)) != \
        (tuple(b.obs_shape), b.num_actions, tuple(b.action_shape))


def check(run_dir: Path, new: Topology, inputs: list[int] | None = None,
          logit_tolerance: float = 1e-4) -> list[Checked]:
    """What carrying each of ``run_dir``'s model checkpoints into ``new``'s model does."""
    from zmqrl.parts.envs import env_spec

    old = load(run_dir / "topology.yaml")
    obs, where = _observations(run_dir, new, env_spec(new.env))
    results = []
    for path in existing_checkpoints(run_dir):
        if not path.name.endswith(TORCH.suffix):
            continue
        state = TORCH.load(path)
        if not isinstance(state, dict) or "model" not in state:
            continue  # not a model's checkpoint (a pool, a roster, the broker's)
        checked = carry_checkpoint(state, old, new, inputs, logit_tolerance, obs)
        checked.path, checked.observations = path, where
        results.append(checked)
    return results


def carry_checkpoint(state: dict[str, Any], old: Topology, new: Topology,
                     inputs: list[int] | None, logit_tolerance: float,
                     obs: Any) -> Checked:
    """One learner checkpoint carried into ``new``'s model: the report, the output
    differences on ``obs``, and the checkpoint to write (module docstring)."""
    from zmqrl.parts.algos import make_algo
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.parts.surgery.moments import carry_moments, optimizers

    checked = Checked(Path())
    part = plugins.resolve("surgery", new.parts_config.surgery)
    old_model = build_model(old.model, env_spec(old.env), old.seed, algo=old.algo_config)
    old_model.load_state_dict(state["model"])
    new_model = build_model(new.model, env_spec(new.env), new.seed, algo=new.algo_config)
    try:
        report = part.carry(old_model, new_model, inputs=inputs,
                            logit_tolerance=logit_tolerance)
    except ValueError as exc:  # net2net.SurgeryRefused, or a part's own refusal
        checked.refused = str(exc)
        return checked
    checked.lines = report.lines()
    checked.differences = part.check(old_model, new_model, obs, inputs)
    # the algorithm's state around the carried model: built afresh (a target network is
    # the carried model), then the old optimizers' moments and counters carried
    new_algo = make_algo(new.algo_config, new_model)
    fresh = new_algo.state_dict()
    old_state = state.get("algo")
    old_algo = None
    if old_state is not None and old.algo_config.kind == new.algo_config.kind:
        old_algo = make_algo(old.algo_config, old_model)
        try:
            old_algo.load_state_dict(old_state)
        except (KeyError, RuntimeError, ValueError) as exc:
            checked.lines.append(f"optimizer    afresh: the old state did not load ({exc})")
            old_algo = None
    if old_algo is None:
        checked.lines.append("optimizer    afresh (another algorithm, or no state)")
    else:
        old_opts = optimizers(old_algo)
        for name, opt in optimizers(new_algo).items():
            if name not in old_opts:
                checked.lines.append(f"optimizer    {name}: afresh (not in the old one)")
                continue
            done, total = carry_moments(old_opts[name], opt, old_model, new_model,
                                        report.placed)
            checked.lines.append(f"optimizer    {name}: moments carried for {done} of "
                                 f"{total} parameters (the others start at 0)")
        fresh = new_algo.state_dict()
        for key, value in old_state.items():  # counters (updates: a schedule's place)
            if key in fresh and isinstance(value, int | float) and \
                    isinstance(fresh[key], int | float):
                fresh[key] = value
    checked.state = {**state, "model": new_model.state_dict(), "algo": fresh}
    return checked


def perform(run_dir: Path, new: Topology, inputs: list[int] | None = None,
            logit_tolerance: float = 1e-4) -> tuple[list[Checked], list[str]]:
    """Carry ``run_dir``'s checkpoints into ``new`` (module docstring). Raises
    :class:`SurgeryError`, having touched nothing, if a checkpoint cannot be carried.
    Returns the learners' reports and one line per other checkpoint's fate (none for a
    run that never checkpointed: there is nothing to carry, and it starts afresh)."""
    if not existing_checkpoints(run_dir):
        return [], []
    results = check(run_dir, new, inputs, logit_tolerance)
    refused = [c for c in results if c.refused]
    if refused:
        raise SurgeryError("; ".join(f"{c.path.name}: {c.refused}" for c in refused))
    directory = checkpoint_dir(run_dir)
    done = _record(run_dir)
    backup = directory / f"{BACKUP_PREFIX}{len(done) + 1}"
    backup.mkdir()
    old_topology = run_dir / "topology.yaml"
    shutil.copy2(old_topology, backup / "topology.yaml")
    carried = {c.path.name: c for c in results}
    fates = []
    for path in existing_checkpoints(run_dir):
        moved = backup / path.name
        path.rename(moved)
        if path.name in carried:
            _write(TORCH, carried[path.name].state, path)
            fates.append(f"{path.name}: the model carried")
        elif path.name.endswith(NPZ.suffix):
            fates.append(_carry_replay(moved, path, load(old_topology), new, inputs))
        else:
            fates.append(f"{path.name}: kept aside (starts afresh)")
    done.append({"number": len(done) + 1, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "backup": str(backup.relative_to(run_dir)),
                 "learners": {c.path.name: c.lines for c in results},
                 "differences": {c.path.name: c.differences for c in results},
                 "checkpoints": fates})
    (run_dir / RECORD).write_text(json.dumps(done, indent=1))
    return results, fates


def _write(fmt: Any, state: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda f: fmt.dump(state, f))


def _record(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / RECORD
    return json.loads(path.read_text()) if path.exists() else []


def surgeries(run_dir: Path) -> int:
    """How many surgeries the run has had."""
    return len(_record(run_dir))


def _carry_replay(old_path: Path, path: Path, old: Topology, new: Topology,
                  inputs: list[int] | None) -> str:
    """A replay checkpoint's items under the new observations: the same shape, kept;
    vectors that gained features, carried (old columns placed, the new ones 0);
    otherwise dropped (the new replay starts empty) with their count."""
    from zmqrl.bus import messages, wire
    from zmqrl.parts.envs import env_spec

    try:
        state = NPZ.load(old_path)
    except (OSError, ValueError) as exc:
        return f"{path.name}: unreadable ({exc}), kept aside"
    held = int(np.asarray(state.get("keys", np.zeros(0))).size)
    a, b = env_spec(old.env), env_spec(new.env)
    old_shape, new_shape = tuple(a.obs_shape), tuple(b.obs_shape)
    if old_shape == new_shape:
        shutil.copy2(old_path, path)
        return f"{path.name}: {held} items kept (the same observations)"
    if len(old_shape) != 1 or len(new_shape) != 1:
        return (f"{path.name}: {held} items dropped (observations {old_shape} -> "
                f"{new_shape}: only vectors gaining features are carried)")
    columns = list(inputs) if inputs is not None else list(range(old_shape[0]))
    try:
        insert = messages.spec(wire.INSERT, new.algo_config.items)
    except KeyError:
        return f"{path.name}: {held} items dropped (no insert declared)"
    obs_fields = {arr.name for arr in insert.arrays if arr.dtype == "obs"}
    out = dict(state)
    for key, value in state.items():
        name = key.split("/", 1)[-1]
        if key.startswith("items/") and name in obs_fields:
            value = np.asarray(value)
            grown = np.zeros((*value.shape[:-1], new_shape[0]), value.dtype)
            grown[..., columns] = value
            out[key] = grown
    _write(NPZ, out, path)
    return (f"{path.name}: {held} items carried (observations {old_shape} -> {new_shape}, "
            "the new features 0)")


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
