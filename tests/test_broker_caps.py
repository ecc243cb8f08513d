"""The inference broker's memory is bounded per connection and per broker (issue 29,
defect 9): a ``step`` wider than ``max_envs_per_connection`` and a connection beyond
``max_connections`` get an ``error`` reply naming the count and the cap, nothing is kept
for them, and the connections already held keep being served; ``validate`` refuses a
topology whose actors could not fit."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.topology import TopologyError, load

from conftest import REPO, read_csv, wait_for, write_topology


def _step(n: int, seq: int) -> list:
    return wire.encode(wire.STEP, {"obs": np.zeros((n, 4), np.float32),
                                   "reward": np.zeros(n, np.float32),
                                   "done": np.zeros(n, bool)}, seq=seq)


def test_a_wide_step_and_one_connection_too_many_are_refused_and_hold_nothing(
        processes, tmp_path, client_factory):
    seed = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    raw = {k: seed[k] for k in ("seed", "env", "model", "algo")}
    raw.update(name="broker-caps", nodes={"broker": {"kind": "inference_broker", "args": {
        "device": "cpu", "max_envs_per_connection": 8, "max_connections": 2,
        "reclaim_idle_s": 600.0}}})  # none idle long enough to make room
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir, log = tmp_path / "run", tmp_path / "broker.log"
    processes.zmqrl("node", str(path), "broker", "--run-dir", str(run_dir), log=log)
    address = Endpoints(load(path), run_dir).bind_address("broker", "policy", 0)
    first, second, third = (client_factory(address) for _ in range(3))
    assert first.request(wire.encode(wire.PING), timeout=90).type == wire.PONG

    wide = first.request(_step(9, 1))
    assert wide.type == wire.ERROR, wide
    assert "9 envs" in wide.fields["error"] and "max_envs_per_connection 8" in wide.fields["error"]

    for seq in (2, 3):  # two connections: within the cap, served, and served again
        for client in (first, second):
            assert client.request(_step(8, seq)).type == wire.ACT
    extra = third.request(_step(1, 1))
    assert extra.type == wire.ERROR and extra.fields.get("retry") is True, extra
    assert "make 3" in extra.fields["error"] and "max_connections 2" in extra.fields["error"]
    for client in (first, second):  # the ones held keep being served
        assert client.request(_step(8, 4)).type == wire.ACT

    def row() -> dict[str, str] | None:
        rows = read_csv(run_dir / "metrics" / "broker.csv")
        return rows[-1] if rows and int(rows[-1]["refused_steps"] or 0) >= 2 else None

    # What the broker holds: the two connections it serves, not the refused ones.
    last = wait_for(row, 20, "a metrics row counting the refused steps")
    assert int(last["actors"]) == 2 and int(last["refused_steps"]) == 2, last
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def test_validate_refuses_actors_the_broker_caps_cannot_fit(tmp_path):
    # seed.yaml: 2 actors x 16 envs in one lane each
    # (half of max_connections is room for reconnects)
    load(write_topology(tmp_path, nodes={"broker": {"args": {
        "max_envs_per_connection": 16, "max_connections": 4}}}))
    load(write_topology(tmp_path, nodes={  # 2 lanes of 8: 4 connections of 8 envs
        "broker": {"args": {"max_envs_per_connection": 8, "max_connections": 8}},
        "actor": {"args": {"lanes": 2}}}))
    with pytest.raises(TopologyError) as wide:
        load(write_topology(tmp_path, nodes={"broker": {"args": {
            "max_envs_per_connection": 15}}}))
    assert "node 'actor' steps 16 envs per connection" in str(wide.value)
    assert "max_envs_per_connection 15" in str(wide.value)
    with pytest.raises(TopologyError) as many:
        load(write_topology(tmp_path, nodes={"broker": {"args": {"max_connections": 3}}}))
    assert "open 2 connections" in str(many.value) and "max_connections 3" in str(many.value)
    with pytest.raises(TopologyError) as zero:
        load(write_topology(tmp_path, nodes={"broker": {"args": {"max_connections": 0}}}))
    assert "max_connections" in str(zero.value) and "must be >= 1" in str(zero.value)


def test_at_the_cap_an_idle_connection_makes_room_for_a_new_one(processes, tmp_path,
                                                                  client_factory):
    """An actor that restarted opens new connections while its old ones are still held:
    one idle for reclaim_idle_s (no step waiting) gives way, the newcomer is served."""
    seed = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    raw = {k: seed[k] for k in ("seed", "env", "model", "algo")}
    raw.update(name="broker-reclaim", nodes={"broker": {"kind": "inference_broker", "args": {
        "device": "cpu", "max_connections": 1, "reclaim_idle_s": 0.2}}})
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    processes.zmqrl("node", str(path), "broker", "--run-dir", str(run_dir),
                    log=tmp_path / "broker.log")
    address = Endpoints(load(path), run_dir).bind_address("broker", "policy", 0)
    old, new = client_factory(address), client_factory(address)
    assert old.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    assert old.request(_step(4, 1)).type == wire.ACT
    # the old connection goes quiet (its actor restarted): after reclaim_idle_s it gives way
    reply = wait_for(lambda: (lambda r: r if r.type == wire.ACT else None)(
        new.request(_step(4, 1))), 20, "the new connection to be served")
    assert reply.type == wire.ACT


def test_an_actor_told_to_retry_asks_again_rather_than_crash():
    """A full broker answers error with retry: the remote actor logs it and resends
    after RETRY_S (as its request timeout would), never raising out of its loop."""
    import time

    from zmqrl.parts.acting import remote

    class Actor:
        class args:  # noqa: N801
            request_timeout_s = 10.0

        def log_rejection(self, _port, _line):
            pass

    lanes = remote.RemoteLanes.__new__(remote.RemoteLanes)  # no envs: only the reply
    lanes.actor = Actor()
    lane = type("Lane", (), {"socket": "policy", "sent_at": time.perf_counter(), "seq": 3})()
    lanes._on_act(lane, wire.decode(wire.encode(wire.ERROR, error="full", retry=True)))
    due = lane.sent_at + Actor.args.request_timeout_s - time.perf_counter()
    assert 0 < due <= remote.RETRY_S  # after_poll resends once this passes
