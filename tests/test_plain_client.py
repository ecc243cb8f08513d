"""examples/plain_actor.py (pyzmq + msgpack only, no zmqrl) against a real inference broker.

This is the test that docs/protocol.md is enough to write a node from.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import zmq

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.topology import load

REPO = Path(__file__).resolve().parents[1]
STARTUP_S = 30.0  # torch import on a cold, busy machine; normally ~2 s


def stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group, wait, then SIGKILL whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture
def broker(tmp_path):
    """A lone inference broker node; yields (policy address, run dir, log path)."""
    seed = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    topo = {k: seed[k] for k in ("seed", "env", "model", "algo")}
    topo.update(name="plain-client", nodes={"broker": {"kind": "inference_broker",
                                                       "args": {"device": "cpu"}}})
    topo_path = tmp_path / "topology.yaml"
    topo_path.write_text(yaml.safe_dump(topo))
    run_dir = tmp_path / "run"
    address = Endpoints(load(topo_path), run_dir).bind_address("broker", "policy", 0)
    log = tmp_path / "broker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zmqrl.cli", "node", str(topo_path), "broker",
             "--run-dir", str(run_dir)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for_pong(address, proc, log)
        yield address, run_dir, log
    finally:
        stop_group(proc)


def wait_for_pong(address: str, proc: subprocess.Popen, log: Path) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    deadline = time.monotonic() + STARTUP_S
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"broker exited with {proc.returncode}:\n{log.read_text()}")
            sock.send_multipart(wire.encode(wire.PING))
            if sock.poll(250):
                msg = wire.decode(sock.recv_multipart())
                assert msg.type == wire.PONG and msg.fields["node"] == "broker"
                return
        pytest.fail(f"no pong from {address} in {STARTUP_S:.0f}s:\n{log.read_text()}")
    finally:
        sock.close()


def test_plain_actor_runs_against_a_real_broker(broker):
    address, _run_dir, log = broker
    envs, steps = 4, 200
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "plain_actor.py"), address, str(envs),
         str(steps)],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\nbroker:\n{log.read_text()}"
    assert f"steps={steps} env_steps={steps * envs}" in result.stdout
    assert "rejected" not in log.read_text()


def test_broker_answers_a_bad_step_with_an_error_and_keeps_serving(broker):
    """What the doc's section 10 promises a plain client, checked on the real broker."""
    address, _run_dir, _log = broker
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(wire.encode(wire.STEP, {"obs": np.zeros((2, 7), np.float32)}))
        assert sock.poll(5000)
        reply = wire.decode(sock.recv_multipart())
        assert reply.type == wire.ERROR and "obs" in reply.fields["error"]
        n = 3
        sock.send_multipart(wire.encode(wire.STEP, {
            "obs": np.zeros((n, 4), np.float32), "reward": np.zeros(n, np.float32),
            "done": np.zeros(n, np.bool_)}, seq=5))
        assert sock.poll(5000)
        reply = wire.decode(sock.recv_multipart())
        assert reply.type == wire.ACT and reply.fields["seq"] == 5
        assert reply["action"].shape == (n,) and reply["action"].dtype == np.int64
    finally:
        sock.close()
