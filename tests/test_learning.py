"""The SEED topology really learns CartPole (a shortened run, not a benchmark)."""

from __future__ import annotations

import re

from conftest import read_csv, write_topology


def test_seed_topology_learns_cartpole(processes, tmp_path):
    topo = write_topology(tmp_path)  # seed.yaml exactly as shipped
    run_dir = tmp_path / "run"
    log = tmp_path / "up.log"
    # A random policy averages ~22 on CartPole; 150 over 100 episodes is real learning.
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), "--target-return", "150",
                           "--max-seconds", "240", log=log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    out = log.read_text()
    reached = re.search(r"target return 150 reached: mean of the last 100 episodes ([\d.]+)", out)
    assert reached, out[-3000:]
    assert float(reached.group(1)) >= 150
    rows = read_csv(run_dir / "metrics" / "learner.csv")
    assert int(rows[-1]["updates"]) > 10
