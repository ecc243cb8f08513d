"""What a learner trains on is what the env made (issue 30's Pong diagnosis).

A real SEED actor and inference broker play Atari Pong while the test stands in for the
learner on its ``experience`` port. Replaying the actor's envs from their seed with the
actions the unrolls record must give back, byte for byte, every frame of every unroll
(the frame stack and its channel order included), every reward, and every episode end
in its step: what the env made reaches the learner's batch as it was made, so a Pong
that does not learn is not a data-path defect.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

pytest.importorskip("ale_py", reason="Atari needs pip install 'zmqrl[atari]'")

from zmqrl.bus import wire  # noqa: E402
from zmqrl.bus.endpoints import Endpoints  # noqa: E402
from zmqrl.parts.envs import make_vector_env  # noqa: E402
from zmqrl.run.topology import load  # noqa: E402

from conftest import write_topology  # noqa: E402

ENVS = 4


def test_pong_unrolls_replay_exactly_from_the_actors_seed(processes, tmp_path):
    topo_path = write_topology(tmp_path, "seed_atari.yaml", nodes={
        "actor": {"replicas": 1, "args": {"envs": ENVS, "lanes": 1}},  # one connection
        "broker": {"args": {"device": "cpu"}}})
    topo, run_dir = load(topo_path), tmp_path / "run"
    experience = zmq.Context.instance().socket(zmq.ROUTER)
    experience.setsockopt(zmq.LINGER, 0)
    address = Endpoints(topo, run_dir).bind_address("learner", "experience", 0)
    if address.startswith("ipc://"):
        Path(address[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True)
    experience.bind(address)
    for node in ("broker", "actor"):
        processes.zmqrl("node", str(topo_path), node, "--run-dir", str(run_dir),
                        log=tmp_path / f"{node}.log")

    # ----- be the learner until some episode has ended (random Pong: ~800-1100 steps)
    unrolls: list[wire.Message] = []
    deadline = time.monotonic() + 240
    try:
        while not any(u["done"].any() for u in unrolls):
            assert time.monotonic() < deadline, (
                f"{len(unrolls)} unrolls and no episode end", (tmp_path / "broker.log")
                .read_text()[-2000:])
            if not experience.poll(1000):
                continue
            identity, *frames = experience.recv_multipart()
            msg = wire.decode(frames)
            if msg.type == wire.UNROLL:
                unrolls.append(msg)
                experience.send_multipart([identity, *wire.encode(wire.CREDIT, n=1)])
            elif msg.type == wire.PING:
                experience.send_multipart([identity, *wire.encode(wire.PONG)])
    finally:
        experience.close()

    # ----- one connection, consecutive blocks overlapping by one observation
    T = topo.algo_config.unroll
    for u in unrolls:
        assert u["obs"].shape == (T + 1, ENVS, 4, 84, 84) and u["obs"].dtype == np.uint8
    for a, b in zip(unrolls, unrolls[1:], strict=False):
        assert np.array_equal(a["obs"][T], b["obs"][0])

    # ----- replay the actor's envs (nodes/actor.py: seed + 10,000 x (replica + 1); the
    # remote driver's first vector env adds 1000 x 0) with the recorded actions
    seed = topo.seed + 10_000
    env = make_vector_env(topo.env, ENVS, seed)
    obs, _ = env.reset(seed=seed)
    ends = 0
    try:
        for k, u in enumerate(unrolls):
            for t in range(T):
                where = f"unroll {k}, step {t}"
                assert np.array_equal(u["obs"][t], obs), f"{where}: the frames differ"
                obs, reward, term, trunc, _ = env.step(u["action"][t])
                assert np.array_equal(u["reward"][t], reward.astype(np.float32)), where
                assert np.array_equal(u["done"][t], term | trunc), where
                ends += int(term.sum())
            assert np.array_equal(u["obs"][T], obs), f"unroll {k}: the bootstrap frames"
    finally:
        env.close()
    assert ends >= 1  # an episode end, in its step, followed by the next episode's frames
    nonzero = np.concatenate([u["reward"].ravel() for u in unrolls])
    assert (nonzero != 0).any()  # points were scored, and counted where they were
