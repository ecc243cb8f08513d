"""A node's metrics report is bounded by construction (issue 29, defect 2): a broker
that takes more finished episodes in one interval than one report can carry keeps
running, and the run still counts every episode."""

from __future__ import annotations

import numpy as np
import yaml

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.bus.metrics import RecentReturns
from zmqrl.run.topology import load

from conftest import REPO, read_csv, wait_for


def test_recent_returns_keep_the_newest_and_count_the_rest():
    log = RecentReturns(keep=3)
    log.extend([1.0, 2.0])
    log.extend([3.0, 4.0, 5.0])
    assert log.take() == ([3.0, 4.0, 5.0], 2)
    assert log.take() == ([], 0)


def test_a_step_with_120k_episodes_neither_kills_the_broker_nor_loses_a_count(
        processes, tmp_path, client_factory):
    seed = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    raw = {k: seed[k] for k in ("seed", "env", "model", "algo")}
    raw.update(name="many-episodes", nodes={"broker": {"kind": "inference_broker",
                                                       "args": {"device": "cpu"}}})
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    processes.zmqrl("up", str(path), "--run-dir", str(run_dir), "--max-seconds", "300",
                    log=log)
    client = client_factory(Endpoints(load(path), run_dir).bind_address("broker", "policy", 0))
    assert client.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    k = 120_000  # past ~116k returns, one report's header would exceed 1 MiB
    step = wire.encode(wire.STEP, {
        "obs": np.zeros((1, 4), np.float32), "reward": np.zeros(1, np.float32),
        "done": np.zeros(1, bool), "ep_return": np.ones(k, np.float32),
        "ep_length": np.ones(k, np.int32)}, seq=1)
    assert client.request(step, timeout=30).type == wire.ACT

    def episodes() -> int:
        rows = read_csv(run_dir / "metrics" / "run.csv")
        return int(rows[-1]["episodes"]) if rows else 0

    wait_for(lambda: episodes() >= k, 60, "the run to count every episode")
    assert episodes() == k
    assert client.request(wire.encode(wire.PING), timeout=10).type == wire.PONG
    text = log.read_text()
    assert "exited with" not in text and "Traceback" not in text, text[-3000:]


def test_the_pbt_controller_survives_messages_that_are_not_for_it(processes, tmp_path,
                                                                  client_factory):
    """Issue 29, defect 5: well-formed messages of other ports (insert, heartbeat, credit,
    get_params) and a report whose hyperparameters hold raw bytes are refused with an
    error reply; the controller keeps answering and keeps checkpointing."""
    path = REPO / "topologies" / "pbt_seed.yaml"
    run_dir = tmp_path / "run"
    log = tmp_path / "pbt.log"
    processes.zmqrl("node", str(path), "pbt", "--run-dir", str(run_dir),
                    "--set", "nodes.pbt.kind=pbt", "--set", "nodes.pbt.args.checkpoint_every_s=0.5",
                    log=log)
    client = client_factory(Endpoints(load(path), run_dir).bind_address("pbt", "members", 0))
    assert client.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    foreign = [
        wire.encode(wire.INSERT, {"obs": np.zeros((1, 4), np.float32)}),
        wire.encode(wire.HEARTBEAT, label="pbt"),
        wire.encode(wire.CREDIT, n=1),
        wire.encode(wire.GET_PARAMS),
        wire.encode(wire.PBT_REPORT, member=0, steps=10, checkpointed=False,
                    hyperparameters={"lr": b"\\x00raw"}),
    ]
    for frames in foreign:
        assert client.request(frames, timeout=10).type == wire.ERROR
    checkpoint = run_dir / "checkpoints" / "pbt.json"
    checkpoint.unlink(missing_ok=True)
    wait_for(checkpoint.exists, 20, "the controller's next checkpoint")
    assert client.request(wire.encode(wire.PING), timeout=10).type == wire.PONG
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
