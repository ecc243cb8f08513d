"""The ``/tmp`` fallback directory of a run's socket files (``zmqrl-<hash>``, used when
the run directory's path is too long for a Unix socket) goes when the run that made it
ends (issue 29, Low 9): after ``zmqrl up`` stops, after a node run alone stops, and never
while another process of the same run directory still listens in it."""

from __future__ import annotations

import socket

import yaml

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints, ipc_dir, remove_ipc_dir
from zmqrl.run.topology import load

from conftest import REPO

LONG = "a-run-directory-whose-path-is-too-long-for-a-unix-socket" * 2


def _broker_only(tmp_path):
    seed = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    raw = {k: seed[k] for k in ("seed", "env", "model", "algo")}
    raw.update(name="ipc", nodes={"broker": {"kind": "inference_broker",
                                             "args": {"device": "cpu"}}})
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_fallback_directory_goes_with_the_run_and_stays_while_used(tmp_path):
    run_dir = tmp_path / LONG
    directory = ipc_dir(run_dir)
    assert directory.parent != run_dir  # the fallback in /tmp
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(directory / "broker-0-policy"))
    live.listen()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(directory / "learner-0-params"))
    stale.close()  # a file left by a process that is gone
    try:
        assert not remove_ipc_dir(run_dir) and directory.exists()  # still listened on
    finally:
        live.close()
    assert remove_ipc_dir(run_dir) and not directory.exists()
    assert not remove_ipc_dir(run_dir)  # nothing left to remove


def test_zmqrl_up_and_a_node_run_alone_remove_it_when_they_stop(processes, tmp_path,
                                                                client_factory):
    path = _broker_only(tmp_path)
    run_dir = tmp_path / LONG / "up"
    directory = ipc_dir(run_dir)
    up = processes.zmqrl("up", str(path), "--run-dir", str(run_dir), "--max-seconds", "4",
                         log=tmp_path / "up.log")
    assert up.wait(timeout=120) == 0, (tmp_path / "up.log").read_text()[-3000:]
    assert not directory.exists(), list(directory.iterdir())

    run_dir = tmp_path / LONG / "node"
    directory = ipc_dir(run_dir)
    node = processes.zmqrl("node", str(path), "broker", "--run-dir", str(run_dir),
                           log=tmp_path / "node.log")
    client = client_factory(Endpoints(load(path), run_dir).bind_address("broker", "policy", 0))
    assert client.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    assert directory.exists()
    node.terminate()
    assert node.wait(timeout=30) == 0, (tmp_path / "node.log").read_text()[-3000:]
    assert not directory.exists(), list(directory.iterdir())
