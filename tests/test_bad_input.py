"""Bad input sent to a running node: each is rejected with a logged error and an error
reply, and the node goes on answering good requests."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.topology import load

from conftest import read_csv, wait_for, write_topology

LIMIT = 1 << 20  # the node's message limit for this test


@pytest.fixture
def broker(tmp_path, processes):
    topo_path = write_topology(tmp_path, network={"max_message_bytes": LIMIT})
    run_dir = tmp_path / "run"
    log = tmp_path / "broker.log"
    proc = processes.zmqrl("node", str(topo_path), "broker", "--run-dir", str(run_dir), log=log)
    address = Endpoints(load(topo_path), run_dir).bind_address("broker", "policy", 0)
    return proc, address, run_dir, log


def good_step(n: int = 3, seq: int = 1) -> list:
    return wire.encode(wire.STEP, {
        "obs": np.zeros((n, 4), np.float32), "reward": np.zeros(n, np.float32),
        "done": np.zeros(n, np.bool_),
    }, seq=seq)


def header(**fields) -> bytes:
    return msgpack.packb({"v": wire.PROTOCOL_VERSION, "t": wire.STEP, "arrays": [], **fields})


BIG = np.zeros(64 * 1024, np.float32)  # 256 KiB: travels as its own frame
BAD_INPUTS = {
    "not msgpack": ([b"\xc1\xc1 definitely not msgpack"], "header is not msgpack"),
    "msgpack but not a map": ([msgpack.packb([1, 2, 3])], "not a map"),
    "wrong version": ([header(v=99)], "protocol version 99 not supported"),
    "unknown type": ([header(t="launch_missiles")], "unknown message type 'launch_missiles'"),
    "missing frame": ([header(arrays=[["obs", "float32", [3, 4]]])],
                      "announces 1 array frame(s) but 0 arrived"),
    "extra frame": ([header(), b"\x00" * 8], "announces 0 array frame(s) but 1 arrived"),
    "short frame": ([header(arrays=[["obs", "float32", [3, 4]]]), b"\x00" * 47],
                    "array 'obs': 47 bytes but float32(3, 4) needs 48"),
    "bad dtype": ([header(arrays=[["obs", "object", [1], b"x"]])], "dtype 'object' not allowed"),
    "oversized": (wire.encode(wire.STEP, {"obs": np.zeros((5, 1 << 16), np.float32)}),
                  f"exceeds the limit of {LIMIT}"),
    "wrong message for the port": (wire.encode(wire.UNROLL, {"x": BIG}),
                                   "policy port takes 'step', not 'unroll'"),
    "wrong observation shape": (wire.encode(wire.STEP, {"obs": np.zeros((2, 7), np.float32)}),
                                "step needs 'obs' of shape [n, 4], got (2, 7)"),
    "wrong observation dtype": (wire.encode(wire.STEP, {"obs": np.zeros((2, 4), np.float64)}),
                                "step 'obs' must be float32, got float64"),
    "unhashable type field": ([msgpack.packb({"v": 1, "t": [], "arrays": []})],
                              "unknown message type []"),
    "missing rewards": (wire.encode(wire.STEP, {"obs": np.zeros((2, 4), np.float32)}),
                        "step needs 'reward' of shape [2]"),
}


def test_bad_input_is_rejected_and_node_keeps_serving(broker, client_factory):
    proc, address, run_dir, log = broker
    client = client_factory(address)
    assert client.request(wire.encode(wire.PING), timeout=30).type == wire.PONG

    for name, (frames, reason) in BAD_INPUTS.items():
        client.send_raw(frames)
        reply = client.recv()
        assert reply.type == wire.ERROR, name
        assert reason in reply.fields["error"], (name, reply.fields["error"])
        # ... and it still answers a good request right after.
        act = client.request(good_step(seq=7))
        assert act.type == wire.ACT and act.fields["seq"] == 7, name
        assert act["action"].shape == (3,) and set(act["action"].tolist()) <= {0, 1}

    assert proc.poll() is None, "the broker died"
    rows = wait_for(lambda: [r for r in read_csv(run_dir / "metrics" / "broker.csv")
                             if int(r["bad_messages"]) >= len(BAD_INPUTS)], 10,
                    "the broker's metrics to count the rejected messages")
    assert int(rows[-1]["bad_messages"]) == len(BAD_INPUTS)
    logged = wait_for(lambda: log.read_text().count("rejected message"), 5, "log lines")
    assert logged == len(BAD_INPUTS)


def test_req_clients_are_served_too(broker):
    """A REQ socket (adds an empty delimiter frame) gets its reply like a DEALER."""
    import zmq

    _, address, _, _ = broker
    req = zmq.Context.instance().socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(address)
    try:
        req.send_multipart(wire.encode(wire.PING))
        assert req.poll(30_000), "no pong"
        assert wire.decode(req.recv_multipart()).type == wire.PONG
        req.send_multipart(good_step())
        assert req.poll(10_000), "no act"
        assert wire.decode(req.recv_multipart()).type == wire.ACT
    finally:
        req.close()


def test_recurrent_broker_rejects_dones_that_are_not_bool(tmp_path, processes, client_factory):
    """The defect: with ``lstm_ac`` the broker took ``done`` of any dtype — float crashed
    it, and integers were used as indices and zeroed the wrong envs' LSTM state. ``done``
    is bool [n] by declaration now: anything else is an error reply, and the connection's
    state is untouched (its next good steps are served as before)."""
    topo_path = write_topology(tmp_path, model={"kind": "lstm_ac", "hidden": [16], "lstm": 8})
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("node", str(topo_path), "broker", "--run-dir", str(run_dir),
                           log=tmp_path / "broker.log")
    client = client_factory(Endpoints(load(topo_path), run_dir).bind_address("broker", "policy", 0))
    assert client.request(wire.encode(wire.PING), timeout=60).type == wire.PONG
    assert client.request(good_step(seq=1)).type == wire.ACT
    for seq, done in enumerate((np.array([1.0, 0.0, 0.0], np.float32),
                                np.array([2, 0, 0], np.int64),
                                np.array([1, 0, 0], np.uint8)), start=2):
        bad = wire.encode(wire.STEP, {"obs": np.zeros((3, 4), np.float32),
                                      "reward": np.zeros(3, np.float32), "done": done}, seq=seq)
        reply = client.request(bad)
        assert reply.type == wire.ERROR and "'done' must be bool" in reply.fields["error"], \
            reply.fields
        act = client.request(good_step(seq=10 + seq))
        assert act.type == wire.ACT and act.fields["seq"] == 10 + seq
    assert proc.poll() is None, "the broker died"
