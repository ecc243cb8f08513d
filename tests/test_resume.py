"""Checkpoints and resume, done for real: `zmqrl up` runs, `kill -9`, `up --resume`.

* The learner checkpoints its whole state and a resumed run publishes exactly the saved
  parameters, with the saved update count as their version, then trains on from there;
  `up` refuses a run directory with checkpoints unless told `--resume`.
* Killing a learner at any moment, mid-write included, leaves a loadable checkpoint.
* A replay killed with `kill -9` comes back (supervisor restart) with the items of its
  last checkpoint, bit for bit; a resumed Ape-X run restores the learner and the replay
  together instead of refilling an empty buffer.

docs/reliability.md says what this guarantees.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from zmqrl.bus import wire
from zmqrl.bus.endpoints import ipc_dir

from conftest import REPO, Client, process_argv, read_csv, wait_for, write_topology

pytestmark = pytest.mark.minutes(1.6)  # tests/conftest.py: long modules first

SEED_SMALL = {"nodes": {"actor": {"replicas": 1, "args": {"envs": 16}},
                        "learner": {"args": {"device": "cpu"}}}}
APEX_SMALL = {
    "nodes": {
        "replay": {"args": {"min_size": 200, "checkpoint_every_s": 1}},
        "learner": {"args": {"device": "cpu"}},
        "actor": {"replicas": 2},
    },
}


def address(run_dir: Path, node: str, port: str) -> str:
    """A bound port's ipc address (protocol.md §2), as every node derives it."""
    return f"ipc://{ipc_dir(run_dir)}/{node}-0-{port}"


def rows(run_dir: Path, label: str) -> list[dict[str, str]]:
    return read_csv(run_dir / "metrics" / f"{label}.csv")


def log_text(run_dir: Path, label: str) -> str:
    path = run_dir / "logs" / f"{label}.log"
    return path.read_text() if path.exists() else ""


def node_pid(run_dir: Path, node: str) -> int | None:
    """The pid of ``zmqrl node ... NODE`` of this run (a child of the supervisor)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = process_argv(entry)
        except (OSError, ValueError):
            continue
        if "zmqrl.cli" in cmd and "node" in cmd and node in cmd and str(run_dir) in cmd:
            return int(entry.name)
    return None


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def updates_at_least(run_dir: Path, n: int, since_row: int = 0) -> bool:
    return any(int(r["updates"]) >= n for r in rows(run_dir, "learner")[since_row:])


def resume_taking_first_params(processes, topology: Path, run_dir: Path, log: Path
                               ) -> tuple[subprocess.Popen, wire.Message]:
    """``zmqrl up TOPOLOGY --resume RUN_DIR`` and the resumed learner's first ``params``
    (subscribed before the learner binds: the first message is its first publish)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RECONNECT_IVL, 20)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(address(run_dir, "learner", "params"))
    try:
        proc = processes.zmqrl("up", str(topology), "--resume", str(run_dir),
                               "--max-seconds", "120", log=log)
        assert sub.poll(60_000), "no params from the resumed learner within 60s"
        return proc, wire.decode(sub.recv_multipart())
    finally:
        sub.close()


def stop_run(proc: subprocess.Popen) -> None:
    """Ctrl-C a `zmqrl up`: its nodes checkpoint at exit."""
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


# ----- the learner ----------------------------------------------------------------------
def test_resume_publishes_the_saved_parameters_and_trains_on(processes, tmp_path):
    topo = write_topology(tmp_path, **SEED_SMALL)
    run_dir = tmp_path / "run"
    first = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), "--max-seconds", "120",
                            log=tmp_path / "up-1.log")
    wait_for(lambda: updates_at_least(run_dir, 3), 60, "the learner to make 3 updates")
    stop_run(first)
    checkpoint = run_dir / "checkpoints" / "learner.pt"
    saved_copy = tmp_path / "learner-at-stop.pt"
    shutil.copy(checkpoint, saved_copy)  # the resumed learner will overwrite it
    saved = torch.load(saved_copy, weights_only=True)
    n = saved["updates"]
    assert n >= 3 and saved["env_steps"] > 0

    # Without --resume the directory is refused, and nothing is started or touched.
    refused = subprocess.run(
        [sys.executable, "-m", "zmqrl.cli", "up", str(topo), "--run-dir", str(run_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert f"run directory {run_dir} already holds checkpoints (learner.pt)" in refused.stderr
    assert f"zmqrl up --resume {run_dir}" in refused.stderr
    assert checkpoint.read_bytes() == saved_copy.read_bytes()
    assert log_text(run_dir, "learner").count("up (incarnation") == 1

    # The first message must be the restore.
    rows_before = len(rows(run_dir, "learner"))
    run_rows_before = read_csv(run_dir / "metrics" / "run.csv")
    second, msg = resume_taking_first_params(processes, topo, run_dir, tmp_path / "up-2.log")
    assert msg.type == wire.PARAMS and msg.fields["version"] == n
    assert set(msg.arrays) == set(saved["model"])
    for name, tensor in saved["model"].items():
        expected = tensor.numpy()
        assert msg[name].dtype == expected.dtype and msg[name].tobytes() == expected.tobytes()
    # The supervisor copies a node's output into its log file from a thread of its own: the
    # line may land after the parameters the learner published once it had logged it.
    resumed = f"resumed from {checkpoint} at update {n}"
    wait_for(lambda: resumed in log_text(run_dir, "learner"), 30, f"'{resumed}' in the log")

    # Its metrics continue from update n (never below), and it trains on.
    wait_for(lambda: updates_at_least(run_dir, n + 3, rows_before), 60,
             f"the resumed learner to pass update {n + 3}")
    new_rows = rows(run_dir, "learner")[rows_before:]
    assert all(int(r["updates"]) >= n for r in new_rows)
    assert all(int(r["env_steps"]) >= saved["env_steps"] for r in new_rows)
    run_rows = read_csv(run_dir / "metrics" / "run.csv")[len(run_rows_before):]
    assert run_rows and float(run_rows[0]["time_s"]) > float(run_rows_before[-1]["time_s"])
    assert "zmqrl up: resuming seed-cartpole" in (tmp_path / "up-2.log").read_text()
    stop_run(second)


def test_killing_the_learner_at_any_moment_leaves_a_loadable_checkpoint(processes, tmp_path):
    """Ten kill -9s, half at random moments, half the instant a checkpoint write starts."""
    topo = write_topology(
        tmp_path, model={"hidden": [512, 512]},  # a checkpoint big enough to be caught writing
        algo={"batch_size": 8, "epochs": 1, "minibatches": 1},
        nodes={"learner": {"args": {"checkpoint_every": 1, "device": "cpu"}}})
    run_dir = tmp_path / "run"
    checkpoint = run_dir / "checkpoints" / "learner.pt"
    tmp_file = checkpoint.with_name(checkpoint.name + ".tmp")
    # We are the broker: unrolls of 8 CartPole columns, one update each.
    rng = np.random.default_rng(0)
    unroll = wire.encode(wire.UNROLL, {
        "obs": rng.standard_normal((17, 8, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (16, 8)).astype(np.int64),
        "logp": np.full((16, 8), np.log(0.5), np.float32),
        "reward": np.ones((16, 8), np.float32),
        "done": np.zeros((16, 8), bool),
    }, version=0)
    client = Client(address(run_dir, "learner", "experience"))
    outstanding = 0

    def feed() -> None:
        nonlocal outstanding
        while client.sock.poll(0):
            reply = client.recv()
            if reply.type == wire.CREDIT:
                outstanding = max(0, outstanding - reply.fields["n"])
        while outstanding < 2:
            client.send(unroll)
            outstanding += 1

    def feed_until(predicate: Callable[[], bool], timeout: float) -> bool:
        """Keep the learner training until ``predicate`` holds (False: timed out)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            feed()
            time.sleep(0.001)
        return True

    def inode() -> int:
        try:
            return checkpoint.stat().st_ino
        except FileNotFoundError:
            return -1

    moments = random.Random(7)
    updates, mid_write = 0, 0
    try:
        for kill in range(10):
            learner = processes.zmqrl("node", str(topo), "learner", "--run-dir", str(run_dir),
                                      log=tmp_path / f"learner-{kill}.log")
            log = tmp_path / f"learner-{kill}.log"
            if kill:
                line = f"resumed from {checkpoint} at update {updates}"
                wait_for(lambda line=line, log=log: line in log.read_text(), 60,
                         f"learner incarnation {kill} to log '{line}'")
            outstanding = 0  # credit held by the dead learner is gone with it
            # Training again once a new checkpoint replaced the last (and any stale .tmp).
            before = inode()
            assert feed_until(lambda b=before: inode() != b, 60), "no new checkpoint"
            if kill % 2:
                feed_until(tmp_file.exists, 5)  # the instant a write starts (else in 5 s)
            else:
                end = time.monotonic() + moments.uniform(0, 0.3)
                feed_until(lambda e=end: time.monotonic() >= e, 1)
            os.kill(learner.pid, signal.SIGKILL)
            learner.wait(10)
            mid_write += tmp_file.exists()
            state = torch.load(checkpoint, weights_only=True)  # must never fail
            assert {"model", "algo", "updates", "env_steps", "rng"} <= state.keys()
            assert state["updates"] > updates  # it resumed from the last one and trained on
            updates = state["updates"]
    finally:
        client.close()
    # Evidence that the kills did land inside writes, not only between them.
    assert mid_write >= 1, "no kill caught a checkpoint being written"


# ----- the replay -----------------------------------------------------------------------
def load_replay_checkpoint(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def restored_counts(run_dir: Path) -> list[int]:
    """Item counts of the replay's "restored N items" log lines, oldest first."""
    return [int(n) for n in re.findall(r"restored (\d+) items", log_text(run_dir, "replay"))]


def test_killed_replay_comes_back_and_resume_restores_it_with_the_learner(
        processes, tmp_path, client_factory):
    """One Ape-X run: kill -9 the replay mid-run, then stop the run and resume it."""
    topo = write_topology(tmp_path, base="apex.yaml", **APEX_SMALL)
    run_dir = tmp_path / "run"
    up = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), "--max-seconds", "120",
                         log=tmp_path / "up-1.log")
    checkpoint = run_dir / "checkpoints" / "replay.replay.npz"
    wait_for(lambda: re.search(r"checkpoint: ([2-9]\d\d|\d{4,}) items",
                               log_text(run_dir, "replay")), 60,
             "a replay checkpoint of at least 200 items")
    pid = wait_for(lambda: node_pid(run_dir, "replay"), 10, "the replay's pid")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), 10, "the replay to die")
    saved = load_replay_checkpoint(checkpoint)  # the last one it wrote: it is dead now
    size = len(saved["keys"])
    assert size >= 200

    wait_for(lambda: restored_counts(run_dir), 60, "the restarted replay to restore")
    assert restored_counts(run_dir) == [size]
    assert "replay exited with -9; restart 1/" in (tmp_path / "up-1.log").read_text()
    restarted = wait_for(lambda: [r for r in rows(run_dir, "replay")
                                  if r.get("restored_items") == str(size)], 30,
                         "the restarted replay's metrics")
    assert int(restarted[0]["size"]) >= size

    # What it serves for the old keys is what the checkpoint holds, bit for bit.
    client = client_factory(address(run_dir, "replay", "sample"))
    fields = [k.removeprefix("items/") for k in saved if k.startswith("items/")]
    assert fields
    # New inserts dilute the restored items as the run goes on (one 64-item sample once
    # held only 7 of them on a loaded machine): sample until 8 have been compared.
    compared, deadline = 0, time.monotonic() + 30
    while compared < 8:
        assert time.monotonic() < deadline, f"only {compared} restored items sampled in 30 s"
        batch = client.request(wire.encode(wire.SAMPLE, batch_size=64), timeout=30)
        assert batch.type == wire.BATCH, batch.fields
        assert set(fields) <= set(batch.arrays)
        for j, k in enumerate(batch["key"]):
            if int(k) < int(saved["next_key"]):
                i = int(k) - int(saved["keys"][0])
                for field in fields:
                    assert batch[field][j].tobytes() == saved[f"items/{field}"][i].tobytes(), \
                        field
                compared += 1
    client.close()
    # The learner reconnected to the restarted replay by itself and trains on. (Actors that
    # batch their inserts fill 200 items before a loaded machine's learner has reported.)
    learner_rows = wait_for(lambda: rows(run_dir, "learner"), 60, "the learner's metrics")
    now = max(int(r["updates"]) for r in learner_rows)
    wait_for(lambda: updates_at_least(run_dir, now + 5), 60,
             "the learner to update from the restarted replay")

    # Stop the run (both checkpoint at exit) and resume it: from the run's own
    # topology.yaml (no TOPOLOGY given), learner and replay restored together.
    wait_for(lambda: updates_at_least(run_dir, 3), 60, "the learner to make 3 updates")
    assert up.poll() is None
    stop_run(up)
    saved = load_replay_checkpoint(checkpoint)
    size = len(saved["keys"])
    updates = torch.load(run_dir / "checkpoints" / "learner.pt", weights_only=True)["updates"]
    assert size >= 200 and updates >= 3
    learner_rows_before = len(rows(run_dir, "learner"))
    replay_rows_before = len(rows(run_dir, "replay"))
    restores_before = len(restored_counts(run_dir))
    resumed = processes.zmqrl("up", "--resume", str(run_dir), "--max-seconds", "120",
                              log=tmp_path / "up-2.log")
    wait_for(lambda: len(restored_counts(run_dir)) > restores_before, 60,
             "the replay to restore")
    assert restored_counts(run_dir)[restores_before:] == [size]
    line = f"resumed from {run_dir / 'checkpoints' / 'learner.pt'} at update {updates}"
    wait_for(lambda: line in log_text(run_dir, "learner"), 60, f"the learner to log '{line}'")
    # The learner trains on at once from the restored buffer: no refill to min_size first.
    wait_for(lambda: updates_at_least(run_dir, updates + 3, learner_rows_before), 60,
             f"the resumed learner to pass update {updates + 3}")
    replay_rows = rows(run_dir, "replay")[replay_rows_before:]
    assert replay_rows and all(int(r["size"]) >= size for r in replay_rows)
    assert all(int(r["inserts"]) >= int(saved["limiter/inserts"]) for r in replay_rows)
    stop_run(resumed)


def test_subscribers_follow_a_restarted_publisher_back_but_not_a_replica():
    from zmqrl.parts.models import wants_params

    assert wants_params(5, "a", 4, "a")  # newer: always
    assert not wants_params(4, "a", 4, "a") and not wants_params(3, "a", 4, "a")
    assert wants_params(3, "b", 7, "a")  # a new publisher behind us: it restarted
    assert not wants_params(7, "b", 7, "a")  # a data-parallel replica's equal copy
    assert not wants_params(3, None, 7, "a")  # no source field: versions only
