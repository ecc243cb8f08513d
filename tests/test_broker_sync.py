"""The inference broker's sync mode (A2C): strictly on-policy while the actors' rollouts
end together, and no stall when they do not (an actor that started late or restarted).

A real learner and broker run as processes; two test clients play the two actors the
topology links, so the test chooses exactly when each one steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import yaml

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.topology import load

from conftest import read_csv, wait_for

UNROLL = 4
ENVS = 4  # per client; two clients make the learner's batch of 8 unrolls
TIMEOUT_MS = 3000


def _start(processes, tmp_path: Path, timeout_ms: int = TIMEOUT_MS) -> tuple[str, Path]:
    raw = {
        "name": "broker-sync", "seed": 3, "env": {"id": "CartPole-v1"},
        "model": {"kind": "mlp", "hidden": [16]},
        "algo": {"kind": "a2c", "unroll": UNROLL, "batch_size": 2 * ENVS},
        "nodes": {
            "learner": {"kind": "learner", "args": {"device": "cpu"}},
            "broker": {"kind": "inference_broker",
                       "args": {"mode": "sync", "sync_timeout_ms": timeout_ms, "device": "cpu"},
                       "links": {"params": "learner.params",
                                 "experience": "learner.experience"}},
            # Never started: the clients below stand in for its two replicas.
            "actor": {"kind": "actor", "replicas": 2, "args": {"envs": ENVS},
                      "links": {"policy": "broker.policy"}},
        },
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    for node in ("learner", "broker"):
        processes.zmqrl("node", str(path), node, "--run-dir", str(run_dir),
                        log=tmp_path / f"{node}.log")
    return Endpoints(load(path), run_dir).bind_address("broker", "policy", 0), run_dir


def _step(seq: int) -> list:
    rng = np.random.default_rng(seq)
    return wire.encode(wire.STEP, {"obs": rng.normal(0, 0.05, (ENVS, 4)).astype(np.float32),
                                   "reward": np.ones(ENVS, np.float32),
                                   "done": np.zeros(ENVS, bool)}, seq=seq)


def _round(clients, seqs) -> None:
    """Both clients step at once and get their actions."""
    for client, seq in zip(clients, seqs, strict=True):
        client.send(_step(seq))
    replies = [client.recv(timeout=30) for client in clients]
    assert all(r.type == wire.ACT for r in replies), replies


def _policy_lags(run_dir: Path, updates: int) -> list[float]:
    """The learner's policy lag per metrics row that trained, once ``updates`` counted."""
    def rows() -> list[dict[str, str]] | None:
        got = read_csv(run_dir / "metrics" / "learner.csv")
        return got if got and int(got[-1]["updates"]) >= updates else None
    lags = [float(r["policy_lag"]) for r in wait_for(rows, 30, f"{updates} updates")]
    return [lag for lag in lags if lag == lag]  # (NaN in a row without an update)


def test_rollouts_that_end_together_wait_for_the_parameters_trained_on_them(
        processes, tmp_path, client_factory):
    # A long sync timeout: a loaded machine's learner may take seconds to publish its
    # first update, and a wait given up acts with stale parameters (CI saw a lag of 0.75)
    address, run_dir = _start(processes, tmp_path, timeout_ms=20_000)
    a, b = client_factory(address), client_factory(address)
    assert a.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    for i in range(1, 4 * UNROLL + 2):  # four rollouts on each connection
        _round([a, b], [i, i])
    # Strictly on-policy: every rollout was acted on (from its first step) with the
    # parameters of every update before it, so the learner never saw a stale one.
    lags = _policy_lags(run_dir, 4)
    assert lags and all(lag == 0.0 for lag in lags), lags


def test_rollouts_that_end_a_step_apart_do_not_stall_each_update(
        processes, tmp_path, client_factory):
    address, run_dir = _start(processes, tmp_path)
    a, b = client_factory(address), client_factory(address)
    assert a.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    # A steps alone first (B "started late"): the broker serves it after the sync
    # timeout, and from then on A's rollouts end one step before B's.
    a.send(_step(1))
    assert a.recv(timeout=30).type == wire.ACT
    began = time.perf_counter()
    for i in range(1, 6 * UNROLL + 1):  # six rollouts on each connection
        _round([a, b], [i + 1, i])
    took = time.perf_counter() - began
    # Before the fix each of A's rollouts waited sync_timeout_ms for parameters the
    # learner could not make without B's: six rollouts took over 6 x 3 s.
    assert took < TIMEOUT_MS / 1e3, f"{6 * UNROLL} rounds took {took:.1f}s"
    # The learner trained on every pair; A's next rollout began one step before the
    # update it waited for no longer, so it is at most one version behind.
    lags = _policy_lags(run_dir, 5)
    assert lags and all(lag <= 1.0 for lag in lags), lags
