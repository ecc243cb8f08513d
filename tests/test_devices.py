"""Devices: how batches reach the model (``zmqrl.parts.devices``), and the CUDA paths.

The CPU tests run everywhere. Tests marked ``gpu`` need a CUDA device and are skipped
cleanly without one (``pytest -m gpu`` runs only them on a GPU machine): the pinned
staging buffers, a SEED run with broker and learner on CUDA, and data-parallel learners
over NCCL (two GPUs).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zmqrl.parts.devices import HostToDevice, pick_device

from conftest import REPO

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu


def test_cpu_batches_share_writable_memory_and_copy_read_only_frames():
    move = HostToDevice(torch.device("cpu"))
    writable = np.arange(12, dtype=np.uint8).reshape(3, 4)
    shared = move("obs", writable)
    assert shared.dtype == torch.uint8 and shared.data_ptr() == writable.ctypes.data
    frame = np.frombuffer(bytes(range(12)), np.uint8).reshape(3, 4)  # as decoded: read-only
    copied = move("obs", frame)
    assert copied.data_ptr() != frame.ctypes.data
    assert np.array_equal(copied.numpy(), frame)


def test_pick_device_names_the_missing_gpu():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if CUDA else "cpu")
    if not CUDA:
        with pytest.raises(ValueError, match="no CUDA device"):
            pick_device("cuda")


@gpu
def test_cuda_copies_keep_dtype_and_survive_the_next_copy():
    """A staging buffer is reused only after its last copy finished: a tensor already
    handed out keeps its values when the next batch goes through the same buffer."""
    move = HostToDevice(pick_device("cuda"))
    first = np.random.default_rng(0).integers(0, 255, (64, 4, 84, 84), dtype=np.uint8)
    second = first[::-1].copy()
    a = move("obs", first)
    b = move("obs", second)
    assert a.is_cuda and a.dtype == torch.uint8
    assert np.array_equal(a.cpu().numpy(), first)
    assert np.array_equal(b.cpu().numpy(), second)
    bigger = np.ones((128, 4, 84, 84), np.uint8)  # outgrows the buffer: a new one
    assert int(move("obs", bigger).sum()) == bigger.size


@gpu
def test_seed_with_broker_and_learner_on_cuda(tmp_path: Path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "zmqrl.cli", "up", "topologies/seed.yaml", "--max-steps", "20000",
         "--run-dir", str(run_dir), "--set", "nodes.broker.args.device=cuda",
         "--set", "nodes.learner.args.device=cuda"],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert re.search(r"model on cuda", logs), logs[-2000:]
    assert re.search(r"on cuda:0, batch", logs), logs[-2000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
@gpu
def test_data_parallel_learners_over_nccl(tmp_path: Path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "zmqrl.cli", "up", "topologies/ppo.yaml", "--max-steps", "20000",
         "--run-dir", str(run_dir), "--set", "nodes.learner.replicas=2",
         "--set", "nodes.learner.args.device=cuda"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("learner*.log"))
    assert "on cuda:0" in logs and "on cuda:1" in logs, logs[-2000:]
