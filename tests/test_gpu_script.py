"""``benchmarks/gpu.sh --dry-run``: the GPU machine's one prepared script runs end to end on
a CPU, with tiny budgets, before any device time is spent on it."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO

pytestmark = pytest.mark.minutes(1.5)  # tests/conftest.py: long modules first

DEADLINE_S = 420  # the dry run takes ~2 minutes on a loaded 2-core machine


def test_gpu_script_dry_run_writes_every_step(processes, tmp_path):
    out, log = tmp_path / "out", tmp_path / "gpu.log"
    proc = processes.start(["bash", str(REPO / "benchmarks" / "gpu.sh"), "--dry-run",
                            "--out", str(out)], log=log)
    try:
        code = proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:  # the fixture's teardown stops its process group
        raise AssertionError(f"dry run past {DEADLINE_S}s:\n{log.read_text()[-4000:]}") from None
    assert code == 0, log.read_text()[-4000:]
    results = json.loads((out / "gpu.json").read_text())
    steps = results["steps"]
    assert set(steps) == {"gpu_tests", "bench", "pong", "scaling"}
    assert all(step["status"] == "ok" for step in steps.values()), steps
    assert results["failed"] == [] and results["dry_run"] is True

    tests = steps["gpu_tests"]  # no CUDA here: every gpu test skips
    assert tests["failed"] == 0 and tests["passed"] + tests["skipped"] > 0, tests

    bench = steps["bench"]["runs"]
    assert [run["topology"] for run in bench] == ["topologies/seed.yaml"]
    assert all(run["report"]["topology_steps_per_s"] > 0 for run in bench), bench

    pong = steps["pong"]
    assert (out / "pong" / "run.csv").read_text().startswith("time_s,")
    assert (out / "pong" / "run.tar.gz").exists() and (out / "logs.tar.gz").exists()
    assert pong["curve"] and all(len(point) == 2 for point in pong["curve"])
    assert pong["env_steps"] > 0 and pong["frames_per_s"] > 0
    assert pong["gpu"] is None or pong["gpu"]["samples"]  # None without nvidia-smi

    rows = {row["actors"]: row for row in steps["scaling"]["rows"]}
    assert set(rows) == {1, 2}
    assert all(row["ratio"] > 0 and row["copies_steps_per_s"] > 0 for row in rows.values())
    assert len(rows[2]["copy_steps_per_s"]) == 2
