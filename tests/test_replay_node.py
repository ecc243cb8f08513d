"""The replay node as a real process: what it stores, which sample requests it keeps
waiting, and which priority updates it applies across its own restarts.

* Inserts are checked against the env and the algorithm before they are stored: an
  action outside the action space, a NaN, a discount outside [0, 1] is an error reply
  (and no credit), never an item a learner samples again and again.
* Sample requests wait bounded: per peer, per client (a learner that reconnects replaces
  its old requests), and a gone peer's requests neither get served nor use up the rate
  limiter's budget that the live learner is waiting for.
* Keys repeat after a restart (a replay restores its last checkpoint, not the keys it
  issued since): priorities that name an earlier incarnation are skipped, neither
  applied to the new items that now hold those keys nor answered with an error.
* The rate limiter's settings are validated against the inserts producers really send
  (``envs x n_step`` items), not one item per insert.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.parts.replay import RateLimiter
from zmqrl.run.topology import load

from conftest import REPO, Client, read_csv, wait_for

OBS = 4  # CartPole


def topology(tmp_path: Path, **replay_args) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({
        "name": "replay-node", "env": {"id": "CartPole-v1"},
        "model": {"kind": "dueling_mlp", "hidden": [8]},
        "algo": {"kind": "dqn", "batch_size": 8, "n_step": 3},
        "nodes": {"replay": {"kind": "replay",
                             "args": {"checkpoint_every_s": 0, **replay_args}}},
    }))
    return path


class Replay:
    """A replay node process and its two ports."""

    def __init__(self, processes, tmp_path: Path, topo: Path, run_dir: Path | None = None):
        self.processes, self.tmp_path, self.topo = processes, tmp_path, topo
        self.run_dir = run_dir or tmp_path / "run"
        endpoints = Endpoints(load(topo), self.run_dir)
        self.experience = endpoints.bind_address("replay", "experience", 0)
        self.sample = endpoints.bind_address("replay", "sample", 0)
        self.starts = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> Replay:
        self.proc = self.processes.zmqrl("node", str(self.topo), "replay", "--run-dir",
                                         str(self.run_dir),
                                         log=self.tmp_path / f"replay-{self.starts}.log")
        self.starts += 1
        return self

    def log(self) -> str:
        return (self.tmp_path / f"replay-{self.starts - 1}.log").read_text()

    def metrics(self) -> list[dict[str, str]]:
        return read_csv(self.run_dir / "metrics" / "replay.csv")


def transitions(n: int, seed: int = 0, **override: np.ndarray | None) -> list:
    """An insert of ``n`` CartPole transitions; ``override`` replaces arrays (None
    leaves one out)."""
    rng = np.random.default_rng(seed)
    items = {"obs": rng.standard_normal((n, OBS)).astype(np.float32),
             "action": rng.integers(0, 2, n).astype(np.int64),
             "reward": np.ones(n, np.float32),
             "discount": np.full(n, 0.97, np.float32),
             "next_obs": rng.standard_normal((n, OBS)).astype(np.float32)}
    items.update(override)
    return wire.encode(wire.INSERT, {k: v for k, v in items.items() if v is not None},
                       version=0)


def insert(client: Client, frames: list) -> wire.Message:
    reply = client.request(frames, timeout=60)
    assert reply.type == wire.CREDIT, reply.fields
    return reply


def quiet(client: Client, timeout: float = 1.0) -> bool:
    """Nothing arrives within ``timeout`` (the replay had nothing to say)."""
    return not client.sock.poll(int(timeout * 1000))


# ----- defect: the replay stored whatever producers sent -----------------------------
BAD_INSERTS = {
    "action outside the action space": ({"action": np.array([0, 7, 1], np.int64)},
                                        "'action' must be inside the action space"),
    "negative action": ({"action": np.array([0, -1, 1], np.int64)},
                        "'action' must be inside the action space"),
    "action of another dtype": ({"action": np.array([0, 1, 1], np.int32)},
                                "'action' must be int64, got int32"),
    "NaN reward": ({"reward": np.array([1, np.nan, 1], np.float32)},
                   "'reward' must be finite"),
    "infinite observation": ({"obs": np.full((3, OBS), np.inf, np.float32)},
                             "'obs' must be finite"),
    "discount above 1": ({"discount": np.array([0.9, 1.5, 0.9], np.float32)},
                         "'discount' must be in [0, 1]"),
    "negative discount": ({"discount": np.array([0.9, -0.1, 0.9], np.float32)},
                          "'discount' must be in [0, 1]"),
    "observation of another shape": ({"obs": np.zeros((3, 5), np.float32)},
                                     "'obs' of shape [B, 4], got (3, 5)"),
    "batch sizes that differ": ({"reward": np.ones(2, np.float32)},
                                "'reward' of shape [3], got (2,)"),
    "a field no learner reads": ({"done": np.zeros(3, bool)}, "unexpected array 'done'"),
    "a missing field": ({"discount": None}, "needs 'discount'"),
    "negative priority": ({"priority": np.array([1, -1, 1], np.float32)},
                          "'priority' must be finite and >= 0"),
}


def test_bad_inserts_are_refused_and_never_sampled(processes, tmp_path):
    replay = Replay(processes, tmp_path, topology(tmp_path, min_size=1,
                                                  sampler="prioritized")).start()
    producer, learner = Client(replay.experience), Client(replay.sample)
    try:
        for name, (override, reason) in BAD_INSERTS.items():
            reply = producer.request(transitions(3, **override), timeout=60)
            assert reply.type == wire.ERROR, (name, reply.type)  # and no credit
            assert reason in reply.fields["error"], (name, reply.fields["error"])
        insert(producer, transitions(5, seed=1))
        batch = learner.request(wire.encode(wire.SAMPLE, batch_size=64), timeout=30)
        assert batch.type == wire.BATCH
        # Only the good insert's five items exist to be sampled.
        assert set(batch["key"].tolist()) <= set(range(5))
        assert np.isin(batch["action"], [0, 1]).all()
        assert ((batch["discount"] >= 0) & (batch["discount"] <= 1)).all()
        assert np.isfinite(batch["reward"]).all() and np.isfinite(batch["obs"]).all()
        assert replay.proc.poll() is None
    finally:
        producer.close()
        learner.close()


# ----- defect: abandoned sample requests piled up and were served first ---------------
def test_requests_of_gone_or_replaced_peers_do_not_take_the_live_learners_batch(
        processes, tmp_path):
    """A ratio limiter that allows exactly one batch of 10 after 10 inserts: it must go to
    the live learner, not to a closed socket, nor to the socket a learner replaced."""
    replay = Replay(processes, tmp_path, topology(
        tmp_path, min_size=10, samples_per_insert=1.0, error_buffer=10.0)).start()
    producer = Client(replay.experience)
    gone, replaced, live = (Client(replay.sample) for _ in range(3))
    try:
        for client in (gone, replaced, live):  # connected before anything waits
            assert client.request(wire.encode(wire.PING), timeout=60).type == wire.PONG
        # warm-up: every request waits
        for _ in range(3):
            gone.send(wire.encode(wire.SAMPLE, batch_size=10))
        for _ in range(2):
            replaced.send(wire.encode(wire.SAMPLE, batch_size=10, client="learner"))
        for client in (gone, replaced):  # a pong after them: the requests arrived
            assert client.request(wire.encode(wire.PING), timeout=30).type == wire.PONG
        gone.close()  # a learner that gave up (reopened its socket, or died)
        # The same learner on a new socket (still connected, e.g. across a partition
        # where the old connection is not known to be dead): its requests replace the old.
        live.send(wire.encode(wire.SAMPLE, batch_size=10, client="learner"))
        # The replaced socket's two are dropped; the closed socket's three still wait:
        # only a reply shows the replay that that peer is gone.
        wait_for(lambda: any(r["waiting_samples"] == "4" and r["waiting_dropped"] == "2"
                             for r in replay.metrics()), 30,
                 "the replay to drop the replaced socket's requests")
        insert(producer, transitions(10))
        batch = live.recv(timeout=30)
        assert batch.type == wire.BATCH and len(batch["key"]) == 10
        # Its requests were dropped, not served: each told so (error, retry), no batch
        # (a forged client must not leave a live learner waiting for good: issue 29).
        for _ in range(2):
            told = replaced.recv(timeout=30)
            assert told.type == wire.ERROR and told.fields.get("retry") is True, told
        assert quiet(replaced)
        rows = wait_for(lambda: [r for r in replay.metrics() if r["samples"] == "10"], 30,
                        "a metrics row after the batch")
        assert rows[-1]["waiting_samples"] == "0"
        assert int(rows[-1]["waiting_dropped"]) == 5
    finally:
        for client in (producer, replaced, live):
            client.close()


def test_waiting_requests_are_bounded_per_peer(processes, tmp_path):
    replay = Replay(processes, tmp_path, topology(tmp_path, min_size=10,
                                                  max_waiting_per_peer=4)).start()
    learner = Client(replay.sample)
    try:
        for i in range(20):
            learner.send(wire.encode(wire.SAMPLE, batch_size=i + 1))
        rows = wait_for(lambda: [r for r in replay.metrics() if r["waiting_dropped"] == "16"],
                        30, "the replay to drop all but 4 of 20 waiting requests")
        assert rows[-1]["waiting_samples"] == "4"
        producer = Client(replay.experience)
        insert(producer, transitions(10))
        producer.close()
        # The newest four are served (in order); the older ones were dropped.
        sizes = [len(learner.recv(timeout=30)["key"]) for _ in range(4)]
        assert sizes == [17, 18, 19, 20]
        assert quiet(learner)
    finally:
        learner.close()


# ----- check: keys reused after a restart --------------------------------------------
def test_priorities_for_an_earlier_incarnations_keys_are_skipped(processes, tmp_path):
    """Keys 100..149 of the killed incarnation are issued again by the next one; late
    priority updates for the old items must neither hit the new ones nor be an error."""
    topo = topology(tmp_path, min_size=1, sampler="prioritized", checkpoint_every_s=3600)
    replay = Replay(processes, tmp_path, topo)
    producer = learner = None

    def connect() -> None:
        nonlocal producer, learner
        producer, learner = Client(replay.experience), Client(replay.sample)

    def disconnect() -> None:
        producer.close()
        learner.close()

    def sample() -> wire.Message:
        batch = learner.request(wire.encode(wire.SAMPLE, batch_size=64), timeout=30)
        assert batch.type == wire.BATCH, batch.fields
        return batch

    try:
        replay.start()  # 1: 100 items, checkpointed at exit
        connect()
        insert(producer, transitions(100))
        os.killpg(replay.proc.pid, signal.SIGTERM)
        assert replay.proc.wait(30) == 0
        disconnect()
        replay.start()  # 2: restores 100, issues 100..149, killed before any checkpoint
        connect()
        wait_for(lambda: "restored 100 items" in replay.log(), 60, "the restore")
        insert(producer, transitions(50, seed=2))
        old = sample()
        old_source = old.fields["source"]
        assert (old["key"] >= 100).any()
        os.kill(replay.proc.pid, signal.SIGKILL)
        replay.proc.wait(10)
        disconnect()

        replay.start()  # 3: restores the same 100; next_key is 100 again
        connect()
        wait_for(lambda: "restored 100 items" in replay.log(), 60, "the restore")
        # Keys this incarnation never issued (yet): skipped, no error reply.
        learner.send(wire.encode(wire.PRIORITIES, {
            "key": np.array([120, 130], np.int64), "priority": np.ones(2, np.float32)},
            source=old_source))
        assert learner.request(wire.encode(wire.PING), timeout=30).type == wire.PONG
        # Keys issued again, to other items: the old incarnation's update is not applied.
        insert(producer, transitions(50, seed=3))
        batch = sample()
        source = batch.fields["source"]
        assert source != old_source
        # a key issued again and served to us (priorities count only for those)
        again = int(next(k for k in batch["key"] if 100 <= k < 150))
        learner.send(wire.encode(wire.PRIORITIES, {
            "key": np.array([again], np.int64), "priority": np.array([1e6], np.float32)},
            source=old_source))
        assert (sample()["key"] == again).sum() < 10  # 150 items of equal priority: ~0.4 each
        # The same update from this incarnation's batch is applied.
        learner.send(wire.encode(wire.PRIORITIES, {
            "key": np.array([again], np.int64), "priority": np.array([1e6], np.float32)},
            source=source))
        assert (sample()["key"] == again).sum() > 50
        rows = wait_for(lambda: [r for r in replay.metrics()
                                 if r.get("stale_priority_updates") == "3"], 30,
                        "the skipped updates in the metrics")
        assert rows and replay.proc.poll() is None
        assert "Traceback" not in replay.log()
    finally:
        if producer is not None:
            disconnect()


def test_priorities_are_the_sampling_learners_and_no_item_collapses_the_weights(
        processes, tmp_path):
    """Issue 43 §2.2: a stranger's ``{key: [0], priority: [0]}`` took apex.yaml's mean
    importance weight from 0.80 to 0.035. Priorities now count only for keys served to
    the connection that sends them, and a stored priority is at least 1 % of the mean,
    so the learner's own priority of 0 scales the others' weights by at most 100^-beta."""
    topo = topology(tmp_path, min_size=1, sampler="prioritized", beta=0.4, beta_final=0.4)
    replay = Replay(processes, tmp_path, topo).start()
    producer, learner, stranger = (Client(replay.experience), Client(replay.sample),
                                   Client(replay.sample))

    def sample() -> wire.Message:
        batch = learner.request(wire.encode(wire.SAMPLE, batch_size=64), timeout=30)
        assert batch.type == wire.BATCH, batch.fields
        return batch

    try:
        insert(producer, transitions(200))  # every item at the same (the largest) priority
        batch = sample()
        source = batch.fields["source"]
        # The stranger zeroes the learner's batch and key 0, which it was never served.
        for keys in (batch["key"], np.array([0], np.int64)):
            stranger.send(wire.encode(wire.PRIORITIES, {
                "key": keys, "priority": np.zeros(len(keys), np.float32)}, source=source))
        assert stranger.request(wire.encode(wire.PING), timeout=30).type == wire.PONG
        weights = np.concatenate([sample()["weight"] for _ in range(5)])
        np.testing.assert_allclose(weights, 1.0)  # nothing applied: all equal still
        rows = wait_for(lambda: [r for r in replay.metrics()
                                 if r.get("unserved_priority_updates") == "65"], 30,
                        "the skipped keys in the metrics")
        assert rows
        assert "not served" in replay.log()
        # The learner's own 0 for one of its keys is applied, floored at 1 % of the mean.
        batch = sample()
        learner.send(wire.encode(wire.PRIORITIES, {
            "key": batch["key"][:1], "priority": np.zeros(1, np.float32)}, source=source))
        assert learner.request(wire.encode(wire.PING), timeout=30).type == wire.PONG
        weights = np.concatenate([sample()["weight"] for _ in range(5)])
        # the others: (1 / 0.01)^-0.4 = 0.158 (without the floor (1 / 1e-6^0.6)^-0.4 = 0.036)
        assert np.median(weights) == pytest.approx(0.01 ** 0.4, rel=0.02)
        assert replay.proc.poll() is None and "Traceback" not in replay.log()
    finally:
        for client in (producer, learner, stranger):
            client.close()


# ----- check: the rate limiter's validation assumed one item per insert ---------------
def test_rate_limiter_settings_are_checked_against_real_insert_sizes(tmp_path):
    """Ape-X actors insert up to envs x n_step = 12 transitions at once. With batches of
    128, samples_per_insert 4 and error_buffer 70 the run deadlocks as soon as the
    warm-up ends (checked on the limiter itself), so validate must refuse it."""
    limiter = RateLimiter(1000, 4.0, 70.0)
    limiter.check_batch(128)  # one item per insert: would be fine
    with pytest.raises(ValueError, match="deadlock"):
        limiter.check_batch(128, 12)
    while limiter.can_insert(12, limiter.inserts):
        limiter.on_insert(12)
    assert limiter.inserts >= 1000  # warm-up over, and now neither may proceed:
    assert not limiter.can_insert(12, limiter.inserts)
    assert not limiter.can_sample(128, limiter.inserts)

    raw = yaml.safe_load((REPO / "topologies" / "apex.yaml").read_text())
    raw["nodes"]["replay"]["args"]["error_buffer"] = 70.0
    # one step's items per insert (insert_batch adds up to 15 held-back items: counted
    # since issue 29, see test_replay_survives.py)
    raw["nodes"]["actor"]["args"]["insert_batch"] = 1
    path = tmp_path / "apex-tight.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = subprocess.run([sys.executable, "-m", "zmqrl.cli", "validate", str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode != 0, result.stdout
    assert "inserts of 12 item(s) can deadlock" in result.stdout + result.stderr
    # The shipped topologies leave room for their real insert sizes.
    for name in ("apex", "gorila", "r2d2", "seed_r2d2"):
        load(REPO / "topologies" / f"{name}.yaml")
