"""Surgery done for real (issue 45): `zmqrl up` runs seed.yaml, stops, and `zmqrl up
WIDE.yaml --resume` carries the learner into a wider, deeper model before any node
starts. The resumed learner publishes the carried parameters — the old function, in
the new shapes — at the saved update count and trains on; the run's counters continue,
its first row after the surgery is marked, and the old checkpoints are kept aside. A
change that cannot be carried stops `up` naming the layer, the run untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_resume import resume_taking_first_params, rows, stop_run, updates_at_least

from zmqrl.bus import wire

from conftest import REPO, read_csv, wait_for, write_topology

pytestmark = pytest.mark.minutes(0.8)

SMALL = {"nodes": {"actor": {"replicas": 1, "args": {"envs": 16}},
                   "learner": {"args": {"device": "cpu"}}}}
# a surgery part of the user's own (beside the topology): net2net with another tanh gain
# (the carried function then within 1e-4: each unit off by at most gain^2 / 3)
EXACT = ("from zmqrl.parts.surgery.net2net import Net2Net\n\n\n"
         "class Exact(Net2Net):\n    tanh_gain = 1e-4\n")
WIDE = {**SMALL, "model": {"hidden": [128, 128, 128]},
        "parts": {"surgery": "exact_surgery:Exact"}}


def outputs(state: dict[str, torch.Tensor], topology: Path, obs: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.run.topology import load

    topo = load(topology)
    model = build_model(topo.model, env_spec(topo.env), topo.seed, algo=topo.algo_config)
    model.load_state_dict({k: v if torch.is_tensor(v) else torch.tensor(v)
                           for k, v in state.items()})
    with torch.no_grad():
        logits, value = model(obs)[:2]
    return logits, value


def test_resume_under_a_wider_deeper_model_carries_the_learner_on(processes, tmp_path):
    old_topology = write_topology(tmp_path, **SMALL)
    (tmp_path / "exact_surgery.py").write_text(EXACT)
    wide = write_topology(tmp_path, **WIDE)
    run_dir = tmp_path / "run"
    first = processes.zmqrl("up", str(old_topology), "--run-dir", str(run_dir),
                            "--max-seconds", "120", log=tmp_path / "up-1.log")
    wait_for(lambda: updates_at_least(run_dir, 3), 60, "the learner to make 3 updates")
    stop_run(first)
    checkpoint = run_dir / "checkpoints" / "learner.pt"
    saved_bytes = checkpoint.read_bytes()
    saved = torch.load(checkpoint, weights_only=True)
    n, steps_before = saved["updates"], saved["env_steps"]
    run_before = read_csv(run_dir / "metrics" / "run.csv")
    rows_before = len(rows(run_dir, "learner"))

    second, msg = resume_taking_first_params(processes, wide, run_dir, tmp_path / "up-2.log")
    # the carried function, in the new shapes, at the saved update count
    assert msg.type == wire.PARAMS and msg.fields["version"] == n
    assert msg["policy.0.weight"].shape == (128, 4) and "policy.6.weight" in msg.arrays
    x = 2.0 * torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    old_logits, old_value = outputs(saved["model"], old_topology, x)
    new_logits, new_value = outputs(msg.arrays, wide, x)
    assert (new_logits - old_logits).abs().max() < 1e-4
    assert (new_value - old_value).abs().max() < 1e-4
    log = (tmp_path / "up-2.log").read_text()
    assert "surgery: learner.pt: largest output difference" in log
    assert "0.0001 x identity (tanh)" in log  # the user's part did it
    assert "surgery: the old checkpoints are in" in log
    # the old checkpoint kept aside, bit for bit, with the old topology
    backup = run_dir / "checkpoints" / "before-surgery-1"
    assert (backup / "learner.pt").read_bytes() == saved_bytes
    assert "hidden:\n  - 64\n  - 64" in (backup / "topology.yaml").read_text()

    # it trains on: counts continue, the first row after the surgery says so
    wait_for(lambda: updates_at_least(run_dir, n + 3, rows_before), 60,
             f"the resumed learner to pass update {n + 3}")
    new_rows = rows(run_dir, "learner")[rows_before:]
    assert all(int(r["updates"]) >= n and int(r["env_steps"]) >= steps_before
               for r in new_rows)
    wait_for(lambda: len(read_csv(run_dir / "metrics" / "run.csv")) > len(run_before) + 1,
             30, "the resumed run's rows")
    after = read_csv(run_dir / "metrics" / "run.csv")[len(run_before):]
    assert after[0]["surgery"] == "1" and all(not r["surgery"] for r in after[1:])
    # the run's update count never goes back (before the learner's first report too)
    assert all(int(r["updates"]) >= int(run_before[-1]["updates"]) for r in after)
    assert int(after[0]["env_steps"]) >= int(run_before[-1]["env_steps"])
    assert "size mismatch" not in (run_dir / "logs" / "learner.log").read_text()
    stop_run(second)
    # resumed again under the same topology: no second surgery
    from zmqrl.run import surgery
    from zmqrl.run.topology import load

    assert not surgery.needed(run_dir, load(wide)) and surgery.surgeries(run_dir) == 1


def test_resume_under_a_model_it_cannot_carry_touches_nothing(tmp_path):
    """A narrower layer: `up --resume` stops before any node, naming the layer."""
    from test_surgery import _run_dir

    run_dir = _run_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()}
    narrow = write_topology(tmp_path, **{**SMALL, "model": {"hidden": [32, 64]}})
    refused = subprocess.run(
        [sys.executable, "-m", "zmqrl.cli", "up", str(narrow), "--resume", str(run_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "surgery refused, the run is untouched: learner.pt: policy.0: 64 outputs -> 32" \
        in refused.stderr
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()} == before
    assert not (run_dir / "logs").exists()
