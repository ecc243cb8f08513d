"""MuZero's ports against hostile or mismatched peers, each against the real node:

* the replay's layout (K, the reanalyse arrays) is the configuration's, not whatever the
  first insert brought, and a ``--resume`` under another ``unroll_steps`` drops the
  restored items it could no longer serve, with a count, instead of refusing every insert;
* the reanalyse node refuses a batch that lacks some of its arrays instead of crashing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.topology import load

from conftest import Client, read_csv, stop_all, wait_for

OBS, A = 4, 2  # CartPole
REANALYSE = ("obs_unroll", "obs_bootstrap", "partial_return", "bootstrap_discount")


def topology(path: Path, unroll_steps: int = 5, reanalyse: bool = False,
             **replay_args) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "muzero-ports", "env": {"id": "CartPole-v1"},
        "model": {"kind": "muzero_mlp", "latent_size": 8, "hidden": 8, "support_size": 3},
        "algo": {"kind": "muzero", "unroll_steps": unroll_steps, "batch_size": 8,
                 "reanalyse": reanalyse},
        "nodes": {"replay": {"kind": "replay", "args": {
            "capacity": 256, "min_size": 8, "checkpoint_every_s": 0, **replay_args}}},
    }))
    return path


def positions(n: int, k: int, reanalyse: bool = False, only: tuple[str, ...] = (),
              seed: int = 0) -> list:
    """An insert of ``n`` positions with ``k`` unrolled steps; with ``reanalyse`` the
    four reanalyse arrays, or ``only`` those named."""
    rng = np.random.default_rng(seed)
    policy = rng.uniform(0.1, 1.0, (n, k + 1, A)).astype(np.float32)
    mask = np.ones((n, k + 1), bool)
    items = {"obs": rng.standard_normal((n, OBS)).astype(np.float32),
             "action": rng.integers(0, A, (n, k)).astype(np.int64),
             "reward": np.ones((n, k), np.float32),
             "value": rng.uniform(0, 10, (n, k + 1)).astype(np.float32),
             "policy": policy / policy.sum(-1, keepdims=True), "mask": mask,
             "priority": np.full(n, 0.5, np.float32)}
    extra = {"obs_unroll": np.zeros((n, k, OBS), np.float32),
             "obs_bootstrap": np.zeros((n, k + 1, OBS), np.float32),
             "partial_return": np.ones((n, k + 1), np.float32),
             "bootstrap_discount": np.full((n, k + 1), 0.5, np.float32)}
    items.update({name: extra[name] for name in (REANALYSE if reanalyse else only)})
    return wire.encode(wire.INSERT, items, version=0)


class ReplayProcess:
    def __init__(self, processes, topo: Path, run_dir: Path):
        self.processes, self.topo, self.run_dir = processes, topo, run_dir
        endpoints = Endpoints(load(topo), run_dir)
        self.experience = endpoints.bind_address("replay", "experience", 0)
        self.sample = endpoints.bind_address("replay", "sample", 0)
        self.proc = processes.zmqrl("node", str(topo), "replay", "--run-dir", str(run_dir),
                                    log=run_dir.parent / f"{topo.stem}-replay.log")

    def metrics(self) -> list[dict[str, str]]:
        return read_csv(self.run_dir / "metrics" / "replay.csv")


def test_the_first_insert_does_not_fix_the_layout(processes, tmp_path):
    """A peer's valid-looking insert with K = 1 used to fix the table's layout, after
    which every real actor's insert (K = 5) was refused and the run stalled. Now K is
    the configuration's from the start, and the reanalyse arrays come all or none, as
    ``algo.reanalyse`` says."""
    replay = ReplayProcess(processes, topology(tmp_path / "t.yaml"), tmp_path / "run")
    actor = Client(replay.experience)
    try:
        reply = actor.request(positions(4, k=1), timeout=60)
        assert reply.type == wire.ERROR and "'action' of shape [4, 5], got (4, 1)" in \
            reply.fields["error"]
        for bad, why in ((positions(4, 5, reanalyse=True), "is not sent in this run"),
                         (positions(4, 5, only=("obs_unroll",)), "must come together")):
            reply = actor.request(bad, timeout=30)
            assert reply.type == wire.ERROR and why in reply.fields["error"], reply.fields
        assert actor.request(positions(4, 5), timeout=30).type == wire.CREDIT
    finally:
        actor.close()
    # With a reanalyse node in the run, the arrays are required of every insert.
    replay = ReplayProcess(processes, topology(tmp_path / "r.yaml", reanalyse=True),
                           tmp_path / "run-r")
    actor = Client(replay.experience)
    try:
        reply = actor.request(positions(4, 5), timeout=60)
        assert reply.type == wire.ERROR and "configuration sends it" in reply.fields["error"]
        assert actor.request(positions(4, 5, reanalyse=True), timeout=30).type == wire.CREDIT
    finally:
        actor.close()


def test_a_resume_under_another_unroll_drops_the_items_it_cannot_serve(processes, tmp_path):
    run_dir = tmp_path / "run"
    first = ReplayProcess(processes, topology(tmp_path / "k5.yaml", checkpoint_every_s=60),
                          run_dir)
    actor = Client(first.experience)
    try:
        assert actor.request(positions(20, 5), timeout=60).type == wire.CREDIT
    finally:
        actor.close()
    stop_all([first.proc])  # SIGTERM: it saves its table at exit
    assert (run_dir / "checkpoints" / "replay.replay.npz").exists()
    second = ReplayProcess(processes, topology(tmp_path / "k3.yaml", unroll_steps=3,
                                               checkpoint_every_s=60), run_dir)
    actor = Client(second.experience)
    try:
        # before: the restored K = 5 table refused every K = 3 insert of the new run
        reply = actor.request(positions(8, 3), timeout=60)
        assert reply.type == wire.CREDIT, reply.fields
        rows = wait_for(lambda: [r for r in second.metrics()
                                 if r["dropped_restored_items"] == "20"], 30,
                        "the replay to count the restored items it dropped")
        assert rows[-1]["size"] == "8"
    finally:
        actor.close()
    log = (tmp_path / "k3-replay.log").read_text()
    assert "dropped the 20 restored items" in log and "'action' of shape [1, 3], got (1, 5)" in log


@pytest.mark.parametrize("missing", [("obs_unroll",), ("partial_return", "bootstrap_discount")])
def test_reanalyse_refuses_a_batch_missing_some_arrays(tmp_path, missing):
    """A batch from the replay with some reanalyse arrays left out is an error (logged,
    counted), not a KeyError in the search that kills the node."""
    from zmqrl.bus.node import NodeContext
    from zmqrl.run.topology import from_dict, load_class

    raw = yaml.safe_load(topology(tmp_path / "t.yaml", reanalyse=True).read_text())
    raw["nodes"]["reanalyse"] = {"kind": "reanalyse", "args": {"batch_size": 4},
                                 "links": {"replay": "replay.sample"}}
    topo = from_dict(raw)
    spec = topo.nodes["reanalyse"]
    node = load_class(spec.target)(NodeContext(topo, spec, 0, tmp_path,
                                               Endpoints(topo, tmp_path)))
    node._open_sockets()
    try:
        node.setup()
        insert = wire.decode(positions(4, 5, reanalyse=True))
        arrays = {k: v for k, v in insert.arrays.items()
                  if k not in missing and k != "priority"}
        arrays.update(key=np.arange(4, dtype=np.int64), weight=np.ones(4, np.float32))
        batch = wire.decode(wire.encode(wire.BATCH, arrays, source="x"))
        with pytest.raises(wire.ProtocolError, match="must come together"):
            node.on_replay([], batch)
        assert node.revised == 0
    finally:
        for sock in node.sockets.values():
            sock.close(linger=0)
