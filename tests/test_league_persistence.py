"""League and self-play opponent-pool state survive a restart (docs/reliability.md).

A league node and a self-play inference broker run on tic-tac-toe while the test plays
the learner (it publishes parameters, a new version each time the league finishes an
evaluation) and an actor (it steps real games through the broker). Once both hold a
few snapshots, results and ratings, they are stopped and started again on the same run
directory: with no new parameters or games they save exactly what they restored (the
league's members, weights, results, Elo ratings and counters; the pool's snapshots,
weights and win/draw/loss counts), and a league given parameters again evaluates on
from there, so ``league.json`` keeps its earlier entries rather than starting afresh.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq

pytest.importorskip("pyspiel")

from zmqrl.bus import wire  # noqa: E402
from zmqrl.bus.endpoints import Endpoints  # noqa: E402
from zmqrl.parts.envs import env_spec, make_vector_env  # noqa: E402
from zmqrl.parts.models import build_model, state_arrays  # noqa: E402
from zmqrl.run.topology import load  # noqa: E402

from conftest import Client, wait_for, write_topology  # noqa: E402

LAST_VERSION = 6  # versions 0..6, snapshots every 2: members/snapshots v2, v4, v6 (pool 3)
ENVS = 8
OVERRIDES = {
    "model": {"kind": "board_mlp", "hidden": [16]},
    "self_play": {"snapshot_every": 2, "pool_size": 3, "latest_fraction": 0.0},
    "nodes": {
        # no learner runs: unrolls wait in the broker's outbox, which must not pause us
        "broker": {"args": {"device": "cpu", "max_outbox": 100_000}},
        "league": {"args": {"eval_every_s": 0.05, "games": 2, "mcts_simulations": 2,
                            "round_robin_games": 2, "pool_size": 3}},
    },
}


class FakeLearner:
    """Publishes parameters on the learner's ``params`` port: version v's weights are a
    model initialised with seed v, so every snapshot holds different weights."""

    def __init__(self, topo: Any, run_dir: Path):
        address = Endpoints(topo, run_dir).bind_address("learner", "params", 0)
        if address.startswith("ipc://"):
            Path(address[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True)
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.topo, self.spec = topo, env_spec(topo.env)
        self.cache: dict[int, list] = {}
        self.sent_at = 0.0

    def publish(self, version: int) -> None:
        """At most every 50 ms (a subscriber that joins late still gets one soon)."""
        if time.monotonic() - self.sent_at < 0.05:
            return
        if version not in self.cache:
            model = build_model(self.topo.model, self.spec, seed=100 + version)
            self.cache[version] = wire.encode(wire.PARAMS, state_arrays(model),
                                              version=version, source="test-learner")
        self.sock.send_multipart(self.cache[version])
        self.sent_at = time.monotonic()

    def close(self) -> None:
        self.sock.close()


class FakeActor:
    """One connection of real tic-tac-toe games stepped through the broker."""

    def __init__(self, topo: Any, run_dir: Path):
        self.client = Client(Endpoints(topo, run_dir).bind_address("broker", "policy", 0))
        self.env = make_vector_env(topo.env, ENVS, seed=0)
        self.obs, _ = self.env.reset(seed=0)
        self.reward = np.zeros(ENVS, np.float32)
        self.done = np.zeros(ENVS, np.bool_)
        self.seq, self.episodes = 0, 0

    def step(self) -> None:
        self.seq += 1
        reply = self.client.request(wire.encode(wire.STEP, {
            "obs": self.obs.astype(np.float32), "reward": self.reward, "done": self.done,
        }, seq=self.seq), timeout=30)
        assert reply.type == wire.ACT, reply.fields
        self.obs, reward, term, trunc, _ = self.env.step(reply["action"])
        self.reward = reward.astype(np.float32)
        self.done = np.asarray(term | trunc, np.bool_)
        self.episodes += int(self.done.sum())


def league_doc(run_dir: Path) -> dict:
    path = run_dir / "league.json"
    return json.loads(path.read_text()) if path.exists() else {}


def checkpoint(run_dir: Path, name: str) -> dict:
    return torch.load(run_dir / "checkpoints" / name, weights_only=True)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, as `zmqrl up` stops its nodes: they checkpoint at exit."""
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Equal, tensors included (element for element)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, list(a), list(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


def test_league_and_pool_continue_from_their_checkpoints(processes, tmp_path):
    topo_path = write_topology(tmp_path, "selfplay.yaml", **OVERRIDES)
    topo, run_dir = load(topo_path), tmp_path / "run"

    def start(node: str, n: int) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{node}-{n}.log"
        return processes.zmqrl("node", str(topo_path), node, "--run-dir", str(run_dir),
                               log=log), log

    learner = FakeLearner(topo, run_dir)
    try:
        # ----- 1: play until the league and the pool hold a few snapshots and results
        (league, _), (broker, _) = start("league", 1), start("broker", 1)
        actor = FakeActor(topo, run_dir)
        version, episodes_at_last = 0, 0
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, ("no league/pool progress", league_doc(run_dir))
            learner.publish(version)
            actor.step()
            evaluated = league_doc(run_dir).get("param_version")
            if version < LAST_VERSION and evaluated == version:
                # the league has evaluated this version (and maybe admitted it): the next
                version += 1
                episodes_at_last = actor.episodes
            elif evaluated == LAST_VERSION and actor.episodes - episodes_at_last >= 40:
                break  # (games against the pool's snapshots, the last one's included)
        stop(league)
        stop(broker)
        actor.client.close()
        doc = league_doc(run_dir)
        saved_league = checkpoint(run_dir, "league.league.pt")
        saved_pool = checkpoint(run_dir, "broker.pool.pt")
        members = [m["name"] for m in saved_league["members"]]
        assert len(members) == 3 and members[-1] == f"v{LAST_VERSION}", members
        assert [m["version"] for m in saved_league["members"]] == [2, 4, 6]
        assert saved_league["evaluations"] == doc["evaluations"] >= LAST_VERSION + 1
        assert saved_league["ratings"] == doc["elo"] and set(members) <= set(doc["elo"])
        assert len(saved_league["results"]) == len(doc["table"])
        # (the broker may see a version late: 3 instead of 2; the last one is 6)
        versions = [s["version"] for s in saved_pool["snapshots"]]
        assert len(versions) == 3 and versions[-1] == LAST_VERSION, versions
        assert sum(sum(s["results"]) for s in saved_pool["snapshots"]) > 0
        weights = [s["model"] for s in saved_pool["snapshots"]]
        assert not torch.equal(next(iter(weights[0].values())), next(iter(weights[1].values())))

        # ----- 2: restarted with nothing new, both save exactly what they restored
        (league, league_log), (broker, broker_log) = start("league", 2), start("broker", 2)
        wait_for(lambda: log_has(league_log, "resumed: "), 60, "the league to resume")
        wait_for(lambda: log_has(broker_log, "resumed the opponent pool"), 60,
                 "the broker to resume its pool")
        stop(league)
        stop(broker)
        assert_same(checkpoint(run_dir, "league.league.pt"), saved_league, "league")
        assert_same(checkpoint(run_dir, "broker.pool.pt"), saved_pool, "pool")
        assert league_doc(run_dir) == doc  # a resumed league waits for the learner's policy

        # ----- 3: given parameters again, the league evaluates on from where it was
        league, league_log = start("league", 3)

        def evaluated_again() -> bool:
            learner.publish(LAST_VERSION)
            return league_doc(run_dir).get("evaluations", 0) > doc["evaluations"]

        wait_for(evaluated_again, 60, "the resumed league's next evaluation")
        stop(league)
        after = league_doc(run_dir)
        # It counts on from the restored count: one more per evaluation it logged (it plays
        # one every 50 ms, so more than one may finish before it is stopped).
        played = league_log.read_text().count("league: v")
        assert played >= 1 and after["evaluations"] == doc["evaluations"] + played, \
            (played, after["evaluations"], doc["evaluations"])
        assert set(members) <= set(after["elo"])
        earlier = {(r["a"], r["b"]): r for r in doc["table"] if not r["a"].startswith("latest@")}
        kept = {(r["a"], r["b"]): r for r in after["table"]}
        assert earlier and all(kept.get(k) == r for k, r in earlier.items()), (earlier, kept)
        resumed = checkpoint(run_dir, "league.league.pt")
        assert [m["name"] for m in resumed["members"]] == members
        assert_same([m["model"] for m in resumed["members"]],
                    [m["model"] for m in saved_league["members"]], "members' weights")
    finally:
        learner.close()


def test_checkpoints_that_cannot_be_taken_say_why_and_a_smaller_pool_keeps_the_newest():
    from zmqrl.parts.selfplay.config import SelfPlayConfig
    from zmqrl.parts.selfplay.league_state import LeagueState
    from zmqrl.parts.selfplay.pool import OpponentPool, SavedPool

    with pytest.raises(ValueError, match="league checkpoint format 7, expected 1"):
        LeagueState.from_dict({"format": 7})
    with pytest.raises(ValueError, match="missing or mistyped 'results'"):
        LeagueState.from_dict({"format": 1, "members": []})
    state = LeagueState(results={("v2", "random"): (1.0, 0.0, 1.0)}, evaluations=3)
    assert LeagueState.from_dict(state.to_dict()) == state

    class Weights:  # a model as the pool sees one: state_dict() out, load() back
        def __init__(self, w: int):
            self.w = w

        def state_dict(self) -> dict:
            return {"w": self.w}

    pool = OpponentPool(SelfPlayConfig(snapshot_every=1, pool_size=3))
    for v in range(3):
        pool.maybe_snapshot(v, lambda v=v: Weights(v))
        pool.record(next(reversed(pool.snapshots)), 1.0)
    saved = SavedPool(pool, lambda sd: Weights(sd["w"])).state()
    smaller = OpponentPool(SelfPlayConfig(snapshot_every=1, pool_size=2))
    SavedPool(smaller, lambda sd: Weights(sd["w"])).restore(saved)
    assert [(s.version, s.model.w, s.results) for s in smaller.snapshots.values()] == \
        [(1, 1, [1, 0, 0]), (2, 2, [1, 0, 0])]
    assert smaller.next_at == 3 and smaller.taken == 3
    assert smaller.maybe_snapshot(3, lambda: Weights(3)).id == 3  # ids go on
    with pytest.raises(ValueError, match="opponent pool checkpoint format None"):
        SavedPool(smaller, dict).restore({})
