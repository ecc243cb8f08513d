"""The parameter server keeps a checkpoint: killed (kill -9) and restarted as a real
process, it resumes from its last checkpoint, publishes those parameters with that
version and keeps counting from there, with its optimizer state intact."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import torch
import yaml
import zmq

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.parts.algos import make_algo
from zmqrl.parts.envs import env_spec
from zmqrl.parts.models import build_model
from zmqrl.run.topology import load

from conftest import Client, wait_for

EVERY = 5  # checkpoint_every
TOPOLOGY = {
    "name": "ps-resume",
    "seed": 3,
    "env": {"id": "CartPole-v1"},
    "model": {"kind": "dueling_mlp", "hidden": [16]},
    # dqn: the checkpoint must carry Adam's moments and the target network's sync timing
    "algo": {"kind": "dqn", "batch_size": 8, "lr": 1.0e-2, "target_update_every": 3,
             "max_grad_norm": 10.0},
    "nodes": {"param_server": {"kind": "param_server",
                               "args": {"checkpoint_every": EVERY}}},
}


def grads_for(step: int, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {name: rng.standard_normal(shape).astype(np.float32)
            for name, shape in shapes.items()}


def same_params(msg: wire.Message, expected: dict[str, np.ndarray]) -> None:
    assert set(msg.arrays) == set(expected)
    for name, value in expected.items():
        assert msg[name].tobytes() == value.tobytes(), name


def test_killed_param_server_resumes_from_its_last_checkpoint(processes, tmp_path: Path):
    topo_path = tmp_path / "topology.yaml"
    topo_path.write_text(yaml.safe_dump(TOPOLOGY))
    run_dir = tmp_path / "run"
    endpoints = Endpoints(load(topo_path), run_dir)
    grads_address = endpoints.bind_address("param_server", "grads", 0)
    checkpoint = run_dir / "checkpoints" / "param_server.pt"

    # The reference: the same model and optimizer in this process, never interrupted.
    ref_model = build_model(TOPOLOGY["model"], env_spec(TOPOLOGY["env"]), TOPOLOGY["seed"])
    ref = make_algo(TOPOLOGY["algo"], ref_model)
    shapes = {n: tuple(p.shape) for n, p in ref_model.named_parameters() if p.requires_grad}

    def apply_ref(step: int) -> None:
        g = grads_for(step, shapes)
        ref.apply_gradients([torch.from_numpy(g[n]) for n in shapes])

    def start(i: int):
        return processes.zmqrl("node", str(topo_path), "param_server", "--run-dir",
                               str(run_dir), log=tmp_path / f"ps-{i}.log")

    def push(client: Client, step: int) -> wire.Message:
        reply = client.request(wire.encode(wire.GRADS, grads_for(step, shapes), env_steps=10),
                               timeout=60)
        assert reply.type == wire.PARAMS, reply.fields
        assert reply.fields["version"] == step
        return reply

    first = start(0)
    client = Client(grads_address)
    try:
        initial = client.request(wire.encode(wire.GET_PARAMS), timeout=60)
        assert initial.fields["version"] == 0
        at_checkpoint = None
        for step in range(1, 2 * EVERY + 3):  # 12 updates: checkpoints at 5 and 10
            reply = push(client, step)
            if step == 2 * EVERY:
                at_checkpoint = {k: np.array(v) for k, v in reply.arrays.items()}
                wait_for(lambda: torch.load(checkpoint, weights_only=True)["version"]
                         == 2 * EVERY if checkpoint.exists() else False, 10,
                         "the checkpoint of version 10")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        client.close()

    # Restarted: versions 11 and 12 were lost with the crash; it resumes at 10.
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RECONNECT_IVL, 20)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoints.bind_address("param_server", "params", 0))
    second = start(1)
    client = Client(grads_address)
    try:
        assert sub.poll(60_000), "the restarted parameter server published nothing in 60s"
        published = wire.decode(sub.recv_multipart())
        assert published.fields["version"] == 2 * EVERY
        same_params(published, at_checkpoint)
        resumed = client.request(wire.encode(wire.GET_PARAMS), timeout=60)
        assert resumed.fields["version"] == 2 * EVERY
        same_params(resumed, at_checkpoint)
        assert f"resumed from {checkpoint} at version {2 * EVERY}" in \
            (tmp_path / "ps-1.log").read_text()

        # Versions go on from 10, and update 11 is what an uninterrupted server makes of
        # gradients 1..11: Adam's moments and the target network's timing came back with
        # the parameters (a fresh optimizer's first step would differ).
        for step in range(1, 2 * EVERY + 2):
            apply_ref(step)
        reply = push(client, 2 * EVERY + 1)
        for name, tensor in ref_model.state_dict().items():
            np.testing.assert_allclose(reply[name], tensor.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=name)
        # A clean stop checkpoints at exit: the next start is exactly where it stopped.
        os.killpg(second.pid, signal.SIGTERM)
        assert second.wait(30) == 0
        assert torch.load(checkpoint, weights_only=True)["version"] == 2 * EVERY + 1
    finally:
        client.close()
        sub.close()
    start(2)
    client = Client(grads_address)
    try:
        assert client.request(wire.encode(wire.GET_PARAMS),
                              timeout=60).fields["version"] == 2 * EVERY + 1
    finally:
        client.close()
