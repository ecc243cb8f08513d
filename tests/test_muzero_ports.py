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
                         (positions(4, 5, only=("obs_bootstrap",)), "must come together"),
                         (positions(4, 5, only=("obs_unroll",)), "is not sent in this run")):
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


@pytest.mark.parametrize("missing,why", [
    (("obs_unroll",), "configuration sends it"),
    (("partial_return", "bootstrap_discount"), "must come together")])
def test_reanalyse_refuses_a_batch_missing_some_arrays(tmp_path, missing, why):
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
        with pytest.raises(wire.ProtocolError, match=why):
            node.on_replay([], batch)
        assert node.revised == 0
    finally:
        for sock in node.sockets.values():
            sock.close(linger=0)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _revise(client: Client, batch: wire.Message) -> None:
    client.send(wire.encode(wire.REVISE, {"key": batch["key"], "value": batch["value"],
                                          "policy": batch["policy"]},
                            source=batch.fields["source"]))


def test_revision_peeks_are_bounded(processes, tmp_path):
    """``sample {revise: true}`` was answered at once with up to the whole table, to
    anyone, as often as asked: 600 requests from a peer that never read took a replay
    from 65 MiB to 1.2 GiB. Now only a linked reviser's batch size is served, one peek
    per connection until its ``revise``, and no more than ``revisions_per_insert`` per
    item inserted."""
    path = topology(tmp_path / "none.yaml", reanalyse=True, capacity=4096)
    replay = ReplayProcess(processes, path, tmp_path / "run-none")
    stranger = Client(replay.sample)
    try:
        reply = stranger.request(wire.encode(wire.SAMPLE, batch_size=4, revise=True), 60)
        assert reply.type == wire.ERROR and "no reviser" in reply.fields["error"]
    finally:
        stranger.close()
    stop_all([replay.proc])

    raw = yaml.safe_load(topology(tmp_path / "t.yaml", reanalyse=True, capacity=4096,
                                  revisions_per_insert=1.0).read_text())
    raw["nodes"]["reanalyse"] = {"kind": "reanalyse", "args": {"batch_size": 8},
                                 "links": {"replay": "replay.sample"}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    replay = ReplayProcess(processes, path, tmp_path / "run")  # the reanalyse node not run
    actor, reviser, stranger = (Client(a) for a in (replay.experience, replay.sample,
                                                    replay.sample))
    try:
        for seed in range(8):  # 4,096 items, ~1.6 MB a peek of the whole table
            reply = actor.request(positions(512, 5, reanalyse=True, seed=seed), 60)
            assert reply.type == wire.CREDIT, reply.fields
        reply = reviser.request(wire.encode(wire.SAMPLE, batch_size=4096, revise=True), 30)
        assert reply.type == wire.ERROR and "exceeds 8" in reply.fields["error"]
        before = _rss_mib(replay.proc.pid)
        for _ in range(600):  # never read: replies would queue in the socket
            stranger.send(wire.encode(wire.SAMPLE, batch_size=8, revise=True))
        assert stranger.request(wire.encode(wire.PING), 30).type != wire.PONG  # its batch
        replies = [stranger.recv(30).type for _ in range(600)]
        assert replies[-1] == wire.PONG and replies.count(wire.BATCH) == 0
        assert replies.count(wire.ERROR) == 599  # "already outstanding", each
        assert _rss_mib(replay.proc.pid) - before < 30
        # The ratio: 4,096 inserted, 8 of slack: 513 peeks of 8, then "ask again".
        served = 0
        while True:
            reply = reviser.request(wire.encode(wire.SAMPLE, batch_size=8, revise=True), 30)
            if reply.type == wire.ERROR:
                break
            served += 1
            _revise(reviser, reply)
        assert served == (4096 + 8) // 8 - 1, served  # the stranger's peek counted too
        assert reply.fields.get("retry") is True and "ahead of inserts" in reply.fields["error"]
        assert actor.request(positions(16, 5, reanalyse=True), 30).type == wire.CREDIT
        assert reviser.request(wire.encode(wire.SAMPLE, batch_size=8, revise=True),
                               30).type == wire.BATCH
    finally:
        for client in (actor, reviser, stranger):
            client.close()


def _roots(n: int) -> list:
    zeros = np.zeros(n, np.int32)
    return wire.encode(wire.STEP, {
        "root": np.ones(n, bool), "obs": np.zeros((n, OBS), np.float32), "parent": zeros,
        "action": np.zeros(n, np.int64), "node": zeros}, seq=1)


def test_the_brokers_latents_are_counted(processes, tmp_path):
    """A MuZero broker keeps every game's tree of latents: 6.8 MB for a connection of
    1,024 games (25 simulations, 64-wide), ~1.7 GB at the default connection caps,
    which they did not count. Now ``max_held_mib`` bounds them: a connection that would
    pass it is told to ask again, and nothing is kept for it."""
    raw = yaml.safe_load(topology(tmp_path / "t.yaml").read_text())
    raw["model"] = {"kind": "muzero_mlp", "latent_size": 64, "hidden": 8, "support_size": 3}
    raw["nodes"] = {"broker": {"kind": "inference_broker", "args": {
        "device": "cpu", "max_held_mib": 10, "reclaim_idle_s": 60}}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    address = Endpoints(load(path), run_dir).bind_address("broker", "policy", 0)
    processes.zmqrl("node", str(path), "broker", "--run-dir", str(run_dir),
                    log=tmp_path / "broker.log")
    first, second = Client(address), Client(address)
    try:
        reply = first.request(_roots(1024), timeout=60)  # 26 nodes x 257 B x 1,024: 6.5 MiB
        assert reply.type == wire.ACT, reply.fields
        reply = second.request(_roots(1024), timeout=30)
        assert reply.type == wire.ERROR and reply.fields.get("retry") is True
        assert "max_held_mib 10" in reply.fields["error"], reply.fields
        assert second.request(_roots(256), timeout=30).type == wire.ACT  # 1.6 MiB fits
        rows = wait_for(lambda: [r for r in read_csv(run_dir / "metrics" / "broker.csv")
                                 if r["actors"] == "2"], 30, "a metrics row of both")
        assert 8.0 < float(rows[-1]["held_mib"]) <= 10
    finally:
        first.close()
        second.close()
