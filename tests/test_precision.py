"""Reduced-precision forward passes (``precision``: the inference broker, the AlphaZero
learner, a local search actor): checked before a run starts, ``auto`` made concrete per
device, outputs that leave the model as float32 arrays close to float32's, parameters
that stay float32, and a learner that still learns. The CUDA run is marked ``gpu``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("pyspiel")

from zmqrl.parts.acting import ActingSetup, act_batched, behaviour_for  # noqa: E402
from zmqrl.parts.algo_config import REPLAY, SEARCH, SEQUENCE  # noqa: E402
from zmqrl.parts.alphazero.config import AlphaZeroConfig  # noqa: E402
from zmqrl.parts.alphazero.learner import AlphaZeroLearner  # noqa: E402
from zmqrl.parts.devices import (  # noqa: E402
    autocast,
    check_precision,
    native_bfloat16,
    resolve_precision,
)
from zmqrl.parts.dqn.config import DQNConfig  # noqa: E402
from zmqrl.parts.envs import EnvSpec, env_spec  # noqa: E402
from zmqrl.parts.games import env_id  # noqa: E402
from zmqrl.parts.models import build_model, load_state_arrays, state_arrays  # noqa: E402
from zmqrl.parts.r2d2.config import R2D2Config  # noqa: E402
from zmqrl.run.topology import TopologyError, from_dict  # noqa: E402

from conftest import REPO  # noqa: E402

CPU = torch.device("cpu")
CONNECT_FOUR = env_id("connect_four")


def test_precision_names_are_checked_and_auto_is_made_concrete():
    assert check_precision("float32") is None and check_precision("bfloat16", "cpu") is None
    assert "'half' is not one of auto, float32, bfloat16, float16" in check_precision("half")
    assert "CUDA only" in check_precision("float16", "cpu")
    with pytest.raises(ValueError, match="float16 runs on CUDA only"):
        resolve_precision("float16", CPU)
    assert resolve_precision("auto", CPU) == ("bfloat16" if native_bfloat16(CPU) else "float32")
    assert resolve_precision("float32", CPU) == "float32"
    assert resolve_precision("bfloat16", CPU) == "bfloat16"  # asked for: even if emulated


def test_validate_names_a_precision_a_node_cannot_run():
    raw = yaml.safe_load((REPO / "topologies" / "alphazero.yaml").read_text())
    from_dict(raw)  # the repository's topology (precision auto) is valid
    raw["nodes"]["learner"]["args"]["precision"] = "half"
    raw["nodes"]["broker"]["args"].update(precision="float16", device="cpu")
    with pytest.raises(TopologyError) as err:
        from_dict(raw)
    text = str(err.value)
    assert "'half' is not one of" in text and "float16 runs on CUDA only" in text
    seed = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    seed["nodes"]["learner"].setdefault("args", {})["precision"] = "bfloat16"
    with pytest.raises(TopologyError, match="algo 'vtrace' trains in float32 only"):
        from_dict(seed)


def _forward(setup: ActingSetup, family: str, obs: np.ndarray) -> dict[str, np.ndarray]:
    """One act_batched over two connections; what each behaviour's forward returned."""
    cls = behaviour_for(setup.cfg)  # the algorithm's own: a family may have several
    seen: list[dict[str, np.ndarray]] = []
    record = cls.record

    def keep(self, outputs, version):
        seen.append(outputs)
        return record(self, outputs, version)

    cls.record = keep
    try:
        halves = np.array_split(obs, 2)
        behaviours = [cls(setup, len(h)) for h in halves]
        for b, h in zip(behaviours, halves, strict=True):
            b.observe(h)
        act_batched(setup.model, behaviours, 0)
    finally:
        cls.record = record
    return {k: np.concatenate([s[k] for s in seen]) for k in seen[0]}


@pytest.mark.parametrize("family", [SEARCH, REPLAY, SEQUENCE])
def test_reduced_precision_outputs_are_float32_and_close_to_float32(family):
    """The leaves of a search (pv_conv), Q-values (dueling MLP) and an LSTM's Q-values
    with its state: the same inputs through float32 and bfloat16 forward passes give
    float32 arrays that agree to bfloat16's precision."""
    rng = np.random.default_rng(0)
    if family == SEARCH:
        spec = env_spec({"id": CONNECT_FOUR})
        model = build_model({"kind": "pv_conv", "hidden": 16}, spec, 0)
        cfg = AlphaZeroConfig()
        obs = rng.integers(0, 2, (12, *spec.obs_shape)).astype(np.float32)
    else:
        spec = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
                       action_dtype=np.dtype(np.int64), num_actions=3)
        kind = "dueling_mlp" if family == REPLAY else "lstm_q"
        options = {"hidden": [16], "lstm": 8} if family == SEQUENCE else {"hidden": [16]}
        model = build_model({"kind": kind, **options}, spec, 0)
        cfg = DQNConfig() if family == REPLAY else R2D2Config()
        assert cfg.family == family
        obs = rng.normal(size=(12, 4)).astype(np.float32)
    full = _forward(ActingSetup(spec, model, cfg, 0.0, 0), family, obs)
    half = _forward(ActingSetup(spec, model, cfg, 0.0, 0, precision="bfloat16"), family, obs)
    assert full.keys() == half.keys()
    for key, value in half.items():
        assert value.dtype == full[key].dtype, key
        if value.dtype.kind == "f":
            assert value.dtype == np.float32, key
            scale = max(1.0, float(np.abs(full[key]).max()))
            np.testing.assert_allclose(value, full[key], atol=0.05 * scale, err_msg=key)
            assert not np.array_equal(value, full[key]), f"{key}: no bfloat16 rounding"


def test_alphazero_learner_in_bfloat16_learns_with_float32_parameters():
    """The conv net's training forward pass in bfloat16: the loss falls as in float32,
    the parameters and the optimizer's state stay float32 (what goes on the wire and
    into checkpoints), and they load into a float32 copy unchanged."""
    spec = env_spec({"id": CONNECT_FOUR})
    model = build_model({"kind": "pv_conv", "hidden": 16}, spec, seed=0)
    learner = AlphaZeroLearner(AlphaZeroConfig(lr=3e-3, l2=0.0, light_adam=True), model,
                               precision="bfloat16")
    rng = np.random.default_rng(1)
    obs = rng.integers(0, 2, (32, *spec.obs_shape)).astype(np.float32)
    # an outcome the network can learn: who has more stones on the board
    outcome = np.where(obs[:, 0].sum((1, 2)) > obs[:, 1].sum((1, 2)), 1.0, -1.0)
    batch = {"obs": torch.from_numpy(obs),
             "policy": torch.from_numpy(rng.dirichlet(np.ones(7), 32).astype(np.float32)),
             "outcome": torch.from_numpy(outcome.astype(np.float32))}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = learner.update(batch)
        for _ in range(100):
            last = learner.update(batch)
    finally:
        torch.set_num_threads(threads)
    assert last["policy_kl"] < 0.1 * first["policy_kl"]
    assert last["value_loss"] < 0.1 * first["value_loss"]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    moments = learner.state_dict()["optimizer"]  # LightAdam's (light_adam: true)
    assert moments["exp_avg"] and all(t.dtype == torch.float32 for t in
                                      moments["exp_avg"] + moments["exp_avg_sq"])
    copy = build_model({"kind": "pv_conv", "hidden": 16}, spec, seed=1)
    load_state_arrays(copy, state_arrays(model))
    obs = batch["obs"][:4]
    for a, b in zip(model(obs), copy(obs), strict=True):
        assert torch.equal(a, b)


def test_autocast_is_nothing_for_float32():
    model = torch.nn.Linear(3, 2)
    with autocast(CPU, "float32"):
        assert model(torch.ones(1, 3)).dtype == torch.float32
    with autocast(CPU, "bfloat16"):
        assert model(torch.ones(1, 3)).dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_alphazero_with_broker_and_learner_on_cuda_in_reduced_precision(tmp_path: Path,
                                                                        precision: str):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "zmqrl.cli", "up", "topologies/alphazero.yaml",
         "--max-seconds", "40", "--run-dir", str(run_dir),
         "--set", f"env.id={env_id('tic_tac_toe')}",
         "--set", "nodes.broker.args.device=cuda",
         "--set", f"nodes.broker.args.precision={precision}",
         "--set", "nodes.learner.args.device=cuda",
         "--set", f"nodes.learner.args.precision={precision}"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert re.search(rf"model on cuda:0 in {precision}", logs), logs[-2000:]
    assert re.search(rf"on cuda:0, batch \d+, forward passes in {precision}", logs), \
        logs[-2000:]
    rows = (run_dir / "metrics" / "learner.csv").read_text().splitlines()
    header = rows[0].split(",")
    updates = int(rows[-1].split(",")[header.index("updates")])
    assert updates > 0, rows[-3:]
