"""CURVE + ZAP on tcp endpoints: a real node answers only clients holding the run's keys.

The clients here are plain pyzmq sockets configured from the key files, as a third-party
client would be, so the test checks the documented key layout, not just our own helpers.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
import zmq
from zmq.auth.certs import load_certificate

from zmqrl.bus import security, sockets, wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.topology import TopologyError, load

from conftest import REPO, free_base_port, read_csv, wait_for

HOST = "127.0.0.1"
KEY_FILES = ("server.key", "server.key_secret", "client.key", "client.key_secret")


def zmqrl_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zmqrl.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def topology(path: Path, keys: str, base_port: int = 47100) -> Path:
    """A broker on tcp (CURVE) and a replay on ipc (plain), in one CURVE topology."""
    raw = {
        "name": "curve-test",
        "env": {"id": "CartPole-v1"},
        "model": {"kind": "mlp", "hidden": [16]},
        "algo": {"kind": "vtrace"},
        "network": {"base_port": base_port, "curve": {"keys": keys}},
        "nodes": {
            "broker": {"kind": "inference_broker", "host": HOST},
            "replay": {"kind": "replay"},
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def dealer(curve: tuple[bytes, bytes, bytes] | None) -> zmq.Socket:
    """A DEALER; ``curve`` = (client public, client secret, server public), z85."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
    return sock


def replies_within(sock: zmq.Socket, deadline: float) -> bool:
    """Whether anything arrives on ``sock`` before the monotonic ``deadline``."""
    return bool(sock.poll(max(0, int((deadline - time.monotonic()) * 1000))))


def zmtp_mechanism(port: int) -> bytes:
    """The security mechanism a tcp port announces in its ZMTP 3 greeting."""
    with socket.create_connection((HOST, port), timeout=10) as raw:
        # Our signature and major version only: that is all a peer waits for before
        # sending the rest of its greeting (a full greeting naming another mechanism
        # would make it hang up first).
        raw.sendall(b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03")
        received = b""
        while len(received) < 64:
            chunk = raw.recv(64 - len(received))
            if not chunk:
                break
            received += chunk
    return received[12:32].rstrip(b"\x00")  # after signature (10) and version (2)


def test_keys_command_writes_refuses_to_overwrite_and_forces(tmp_path):
    keys = tmp_path / "keys"
    result = zmqrl_cli("keys", str(keys))
    assert result.returncode == 0, result.stderr
    for name in KEY_FILES:
        assert f"wrote {keys / name}" in result.stdout
        mode = stat.S_IMODE((keys / name).stat().st_mode)
        assert mode == (0o600 if name.endswith("_secret") else 0o644), (name, oct(mode))
    server_public, server_secret = load_certificate(keys / "server.key_secret")
    assert load_certificate(keys / "server.key") == (server_public, None)
    assert security.check_key_dir(keys) == []

    again = zmqrl_cli("keys", str(keys))
    assert again.returncode == 1
    assert "already holds server.key" in again.stderr and "--force" in again.stderr
    assert load_certificate(keys / "server.key_secret") == (server_public, server_secret)

    forced = zmqrl_cli("keys", "--force", str(keys))
    assert forced.returncode == 0, forced.stderr
    assert load_certificate(keys / "server.key_secret")[0] != server_public


def test_validate_says_which_key_dir_or_key_file_is_missing(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    security.write_keys(conf / "good")  # what `zmqrl keys` runs (tested above)
    security.write_keys(conf / "partial")
    (conf / "partial" / "client.key").unlink()
    no_dir = topology(conf / "no_dir.yaml", "missing")  # relative: to the file's directory
    no_file = topology(conf / "no_file.yaml", "partial")
    good = topology(conf / "good.yaml", "good")
    elsewhere = tmp_path / "elsewhere"  # the working directory must not matter
    elsewhere.mkdir()
    result = zmqrl_cli("validate", str(no_dir), str(no_file), str(good), cwd=elsewhere)
    assert result.returncode == 1
    errors = result.stderr.splitlines()
    assert (f"error: {no_dir}: field 'network.curve.keys': key directory {conf / 'missing'} "
            f"does not exist (make one with: zmqrl keys {conf / 'missing'})") in errors
    assert (f"error: {no_file}: field 'network.curve.keys': client public key: "
            f"{conf / 'partial' / 'client.key'} is missing") in errors
    assert len(errors) == 2, errors
    assert f"ok: {good}: 2 nodes, 2 processes" in result.stdout

    # A path given with --set is relative to the working directory instead.
    monkeypatch.chdir(conf)
    topo = load(no_dir, {"network": {"curve": {"keys": "good"}}})
    assert topo.network["curve"]["keys"] == str(conf / "good")
    (conf / "good" / "client.key_secret").unlink()
    with pytest.raises(TopologyError, match="client secret key: .*client.key_secret is missing"):
        load(good)


def test_curve_node_answers_only_clients_holding_the_keys(tmp_path, processes):
    keys = tmp_path / "keys"
    assert zmqrl_cli("keys", str(keys)).returncode == 0
    topo_path = topology(tmp_path / "topology.yaml", "keys", free_base_port(1))
    run_dir = tmp_path / "run"
    endpoints = Endpoints(load(topo_path), run_dir)
    broker_address = endpoints.bind_address("broker", "policy", 0)
    replay_address = endpoints.bind_address("replay", "sample", 0)
    assert broker_address.startswith(f"tcp://{HOST}:") and replay_address.startswith("ipc://")
    logs = {name: tmp_path / f"{name}.log" for name in ("broker", "replay")}
    for name, log in logs.items():
        processes.zmqrl("node", str(topo_path), name, "--run-dir", str(run_dir), log=log)

    client_public, client_secret = load_certificate(keys / "client.key_secret")
    server_public, _ = load_certificate(keys / "server.key")
    good = dealer((client_public, client_secret, server_public))
    good.connect(broker_address)
    good.send_multipart(wire.encode(wire.PING))
    assert good.poll(60_000), f"no pong with the right keys:\n{logs['broker'].read_text()}"
    assert wire.decode(good.recv_multipart()).type == wire.PONG

    # The port speaks CURVE: everything after the greeting is encrypted.
    assert zmtp_mechanism(int(broker_address.rsplit(":", 1)[1])) == b"CURVE"

    stranger_public, stranger_secret = zmq.curve_keypair()
    other_server_public, _ = zmq.curve_keypair()
    intruders = {
        "a client with its own keypair": dealer((stranger_public, stranger_secret,
                                                 server_public)),
        "a client expecting another server key": dealer((client_public, client_secret,
                                                         other_server_public)),
        "a plain client without CURVE": dealer(None),
    }
    try:
        for sock in intruders.values():
            sock.connect(broker_address)
            # Never a blocking send to a port that refuses us: a DEALER whose pipe
            # libzmq dropped after the refused handshake blocks forever (test_ray saw it).
            with contextlib.suppress(zmq.Again):
                sock.send_multipart(wire.encode(wire.PING), zmq.NOBLOCK)
        deadline = time.monotonic() + 5.0  # one deadline for all: they wait concurrently
        for what, sock in intruders.items():
            assert not replies_within(sock, deadline), f"{what} got a reply"
    finally:
        for sock in intruders.values():
            sock.close()

    # The node is undisturbed: the right client is still served.
    good.send_multipart(wire.encode(wire.PING))
    assert good.poll(10_000) and wire.decode(good.recv_multipart()).type == wire.PONG
    good.close()

    # The refused key is counted and logged; the unknown key's text is in the log.
    rows = wait_for(lambda: [r for r in read_csv(run_dir / "metrics" / "broker.csv")
                             if int(r.get("auth_denied") or 0) > 0], 10,
                    "the broker to count the refused handshake")
    assert int(rows[-1]["bad_messages"]) == 0  # refused before any message got in
    assert f"unknown public key {stranger_public.decode()}" in logs["broker"].read_text()

    # ipc endpoints stay plain under the same topology: a key-free client is served.
    plain = dealer(None)
    plain.connect(replay_address)
    try:
        plain.send_multipart(wire.encode(wire.PING))
        assert plain.poll(60_000), f"no pong over ipc:\n{logs['replay'].read_text()}"
        assert wire.decode(plain.recv_multipart()).type == wire.PONG
    finally:
        plain.close()
    assert "auth_denied" not in read_csv(run_dir / "metrics" / "replay.csv")[-1]


def test_curve_server_without_its_zap_handler_refuses_everyone(tmp_path):
    """Fail closed: a CURVE server whose process runs no ZAP handler lets nobody in
    (libzmq's default would let any CURVE client in)."""
    security.write_keys(tmp_path / "keys")
    keys = security.load_keys(tmp_path / "keys")
    ctx = zmq.Context()
    opts = sockets.SocketOptions(curve=keys, linger_ms=0)
    address = f"tcp://{HOST}:{free_base_port(1)}"
    server = sockets.bind(ctx, "router", address, opts)
    client = sockets.connect(ctx, "dealer", [address], opts)
    try:
        client.send_multipart(wire.encode(wire.PING))
        assert not server.poll(2000), "a CURVE client got in without a ZAP handler"
        auth = security.Authenticator(ctx, keys, logging.getLogger("test"))
        auth.start()  # with the handler, the same client gets in on its next attempt
        try:
            reopened = sockets.connect(ctx, "dealer", [address], opts)
            reopened.send_multipart(wire.encode(wire.PING))
            assert server.poll(10_000), "the allowed client was refused with the handler"
            reopened.close()
        finally:
            auth.stop()
    finally:
        client.close()
        server.close()
        ctx.term()
