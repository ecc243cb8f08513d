"""Values bounded, not only finite (issue 29, defect 3).

"finite" let 3e38 through: one unroll with reward 3e38 made every a2c parameter NaN after
one update, an AlphaZero replay stored outcomes of 3e38 and policy rows summing to 9,
and a broker loaded NaN parameters and acted on with them. Now:

* ports bound each field: observations, rewards, log-probabilities, recurrent states and
  continuous actions by the env's ``max_abs_value`` (default 1e6, a topology setting),
  outcomes and search values in [-1, 1], policy rows summing to 1;
* an optimizer step whose gradient norm is not finite is skipped and counted
  (``updates_skipped``), never applied;
* no node publishes, checkpoints or loads non-finite parameters.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from zmqrl.bus import messages, wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.bus.node import NodeContext
from zmqrl.run.topology import from_dict, load_class

UNROLL, N, OBS = 4, 4, 4
BOUND = "'{}' must be finite .* of magnitude at most"  # the error of rule "bounded"


def topology(max_abs: float | None = None) -> dict:
    env = {"id": "CartPole-v1"}
    if max_abs is not None:
        env["max_abs_value"] = max_abs
    return {"name": "bounded", "env": env, "model": {"kind": "mlp", "hidden": [8]},
            "algo": {"kind": "a2c", "unroll": UNROLL, "batch_size": N},
            "nodes": {"learner": {"kind": "learner",
                                  "args": {"device": "cpu", "checkpoint_every": 0}}}}


def in_process(raw: dict, name: str, run_dir: Path):
    topo = from_dict(raw)
    spec = topo.nodes[name]
    node = load_class(spec.target)(NodeContext(topo, spec, 0, run_dir, Endpoints(topo, run_dir)))
    node._open_sockets()
    node.setup()
    return node


def close(node) -> None:
    for sock in node.sockets.values():
        sock.close(linger=0)


def unroll(**arrays: np.ndarray) -> wire.Message:
    a = {"obs": np.zeros((UNROLL + 1, N, OBS), np.float32),
         "action": np.zeros((UNROLL, N), np.int64), "logp": np.full((UNROLL, N), -0.7, np.float32),
         "reward": np.ones((UNROLL, N), np.float32), "done": np.zeros((UNROLL, N), bool)}
    return wire.decode(wire.encode(wire.UNROLL, {**a, **arrays}, version=0))


def positions(**arrays: np.ndarray) -> wire.Message:
    a = {"obs": np.zeros((3, 2, 3, 3), np.float32),
         "policy": np.full((3, 9), 1 / 9, np.float32),
         "outcome": np.array([1, 0, -1], np.float32)}
    return wire.decode(wire.encode(wire.INSERT, {**a, **arrays}))


# ----- the ports' rules --------------------------------------------------------------
def test_huge_but_finite_values_are_refused_by_field():
    ctx = messages.Context(obs_shape=(OBS,), action_shape=(), num_actions=2,
                           dims={"T": UNROLL})
    spec = messages.spec(wire.UNROLL)
    messages.check(unroll(), spec, ctx)  # the good one passes
    for name in ("reward", "obs", "logp"):
        good = unroll()[name]
        bad = good.copy()
        bad.flat[1] = 3e38
        with pytest.raises(wire.ProtocolError, match=BOUND.format(name)):
            messages.check(unroll(**{name: bad}), spec, ctx)
    # the bound is the topology's: a tighter one refuses a reward of 11
    tight = messages.Context(obs_shape=(OBS,), action_shape=(), num_actions=2,
                             dims={"T": UNROLL}, max_abs=10.0)
    with pytest.raises(wire.ProtocolError, match=BOUND.format("reward")):
        messages.check(unroll(reward=np.full((UNROLL, N), 11, np.float32)), spec, tight)


def test_search_positions_need_outcomes_in_sign_range_and_policies_that_sum_to_one():
    ctx = messages.Context(obs_shape=(2, 3, 3), action_shape=(), num_actions=9)
    spec = messages.spec(wire.INSERT, "positions")
    messages.check(positions(), spec, ctx)
    with pytest.raises(wire.ProtocolError, match=r"'outcome' must be in \[-1, 1\]"):
        messages.check(positions(outcome=np.array([1, 3e38, -1], np.float32)), spec, ctx)
    with pytest.raises(wire.ProtocolError, match="each row summing to 1"):
        messages.check(positions(policy=np.ones((3, 9), np.float32)), spec, ctx)  # sums to 9


def test_env_max_abs_value_reaches_the_ports(tmp_path):
    raw = topology(max_abs=50.0)
    assert from_dict(raw).env_spec().max_abs == 50.0
    learner = in_process(raw, "learner", tmp_path)
    try:
        assert learner.check.max_abs == 50.0
        with pytest.raises(wire.ProtocolError, match=BOUND.format("reward")):
            learner.on_experience([b"peer"], unroll(reward=np.full((UNROLL, N), 51,
                                                                   np.float32)))
    finally:
        close(learner)


# ----- steps that would poison the model ----------------------------------------------
def test_a_step_with_a_non_finite_gradient_norm_is_skipped():
    from zmqrl.parts.algos import gradients

    layer = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in layer.parameters()]
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.1)
    loss = (layer(torch.ones(1, 2)) * torch.tensor(float("inf"))).sum()
    loss.backward()
    norm = gradients.clip_and_step(list(layer.parameters()), optimizer, 1.0)
    assert not np.isfinite(norm)
    assert all(torch.equal(b, p) for b, p in zip(before, layer.parameters(), strict=True))


def test_a_learner_skips_and_counts_an_overflowing_update(tmp_path):
    # a bound as loose as float32 allows lets 3e38 through the port: the step must not
    learner = in_process(topology(max_abs=3.4e38), "learner", tmp_path)
    try:
        learner.on_experience([b"peer"], unroll(reward=np.full((UNROLL, N), 3e38, np.float32)))
        learner.after_poll()
        assert learner.updates == 1 and learner.updates_skipped == 1
        assert all(torch.isfinite(p).all() for p in learner.model.parameters())
        assert learner.metrics()["updates_skipped"] == 1
        learner.on_experience([b"peer"], unroll())  # and good data trains
        learner.after_poll()
        assert learner.updates == 2 and learner.updates_skipped == 1
    finally:
        close(learner)


def test_non_finite_parameters_are_never_published_checkpointed_or_loaded(tmp_path):
    from zmqrl.parts.acting.params import ParamsFollower
    from zmqrl.parts.models import state_arrays

    learner = in_process(topology(), "learner", tmp_path)
    try:
        good = state_arrays(learner.model)
        # a follower (broker, local actor) refuses NaN parameters and keeps its own
        poisoned = {k: v.copy() for k, v in good.items()}
        first = next(iter(poisoned))
        poisoned[first][...] = np.nan
        follower = ParamsFollower(learner.model, learner)
        before = learner.bad_messages
        offered = wire.decode(wire.encode(wire.PARAMS, poisoned, version=5, source="x"))
        assert follower.offer(offered) is False
        assert learner.bad_messages == before + 1 and follower.version == 0
        assert all(torch.isfinite(p).all() for p in learner.model.parameters())
        # a learner holding NaN parameters publishes nothing and keeps its checkpoint
        sent = []
        learner.send = lambda name, frames, *a, **k: sent.append(name) or True
        with torch.no_grad():
            next(learner.model.parameters()).fill_(float("nan"))
        learner._publish()
        assert sent == []
        with pytest.raises(ValueError, match="is not finite: not checkpointed"):
            learner.state()
        # and a checkpoint holding them is not restored
        state = {"model": learner.model.state_dict(), "updates": 0, "env_steps": 0}
        with pytest.raises(ValueError, match="is not finite"):
            learner.restore(state)
    finally:
        close(learner)


# ----- counts, found by the fuzz (tests/test_fuzz_nodes.py) -----------------------------
def test_a_count_one_message_cannot_carry_is_refused():
    """``grads`` with ``env_steps`` 2^63 − 1 and then any more ended the parameter server:
    its running total overflowed TensorBoard's int64 step inside the metrics timer."""
    spec = messages.spec(wire.GRADS)
    grads = wire.decode(wire.encode(wire.GRADS, {"w": np.zeros(2, np.float32)},
                                    env_steps=2**63 - 1))
    with pytest.raises(wire.ProtocolError, match=r"'env_steps' must be an int in \[0, 2\^31\)"):
        messages.check(grads, spec, messages.Context())


def test_tensorboard_takes_any_count_as_its_step(tmp_path):
    pytest.importorskip("tensorboard")
    from zmqrl.bus.tensorboard import ScalarWriter

    writer = ScalarWriter(tmp_path / "tb")
    writer.write({"x": 1.0}, 2**64)  # raised ValueError out of the metrics timer
    writer.close()


def test_the_sink_checks_what_it_takes(tmp_path):
    raw = topology()
    raw["nodes"] = {"sink": {"kind": "sink"}}
    sink = in_process(raw, "sink", tmp_path)
    try:
        with pytest.raises(wire.ProtocolError, match="'action' must be int64, got int32"):
            sink.on_experience([b"peer"], unroll(action=np.zeros((UNROLL, N), np.int32)))
        assert sink.unrolls == 0
    finally:
        close(sink)


# ----- found by the soak (benchmarks/soak.py) ------------------------------------------
def test_episode_returns_are_bounded_too():
    """A ``step`` whose ``ep_return`` was 3e38 was acted on and counted: the run's
    return(100) read 9e36, and PBT ranked members by it."""
    ctx = messages.Context(obs_shape=(OBS,), action_shape=(), num_actions=2)
    step = wire.decode(wire.encode(wire.STEP, {
        "obs": np.zeros((2, OBS), np.float32), "reward": np.zeros(2, np.float32),
        "done": np.ones(2, bool), "ep_return": np.array([3e38, 1], np.float32),
        "ep_length": np.array([5, 5], np.int32)}, seq=1))
    with pytest.raises(wire.ProtocolError, match="'ep_return' must be finite, of magnitude "
                                                 "at most `max_abs_value` x 10"):
        messages.check(step, messages.spec(wire.STEP), ctx)
    # a return is a sum: one past the per-value bound is a legitimate score
    step.arrays["ep_return"] = np.array([5e6, 1], np.float32)
    messages.check(step, messages.spec(wire.STEP), ctx)


def test_a_learner_bounds_what_waits_for_it(tmp_path):
    """An unroll of 3,676 envs kept a learner training, deaf to pings, for seconds; a
    peer ignoring credit could queue without end. Now: an unroll wider than
    ``max_unroll_envs`` is refused, a full queue stops the port being read until a batch
    is taken, and a loop turn runs a bounded number of updates."""
    raw = topology()
    raw["nodes"]["learner"]["args"]["max_unroll_envs"] = 8
    learner = in_process(raw, "learner", tmp_path)
    paused: list[tuple[str, bool]] = []
    learner.set_polling = lambda port, on: paused.append((port, on))
    try:
        wide = {"obs": np.zeros((UNROLL + 1, 9, OBS), np.float32),
                "action": np.zeros((UNROLL, 9), np.int64),
                "logp": np.full((UNROLL, 9), -0.7, np.float32),
                "reward": np.ones((UNROLL, 9), np.float32), "done": np.zeros((UNROLL, 9), bool)}
        with pytest.raises(wire.ProtocolError, match="9 envs exceeds this learner's "
                                                     "max_unroll_envs 8"):
            learner.on_experience([b"peer"], wire.decode(wire.encode(wire.UNROLL, wide,
                                                                     version=0)))
        # hold at 2 batches (4 columns each) + one widest unroll (8) = 16 columns
        for _ in range(4):
            learner.on_experience([b"peer"], unroll())
        assert paused == [("experience", False)]
        learner.after_poll()  # a bounded number of updates, then reading resumes
        assert paused[-1] == ("experience", True)
        assert learner.updates == 4
    finally:
        close(learner)


def test_validate_refuses_producers_wider_than_the_learner_takes(tmp_path):
    import subprocess
    import sys

    import yaml

    from conftest import REPO

    raw = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    raw["nodes"]["learner"].setdefault("args", {})["max_unroll_envs"] = 4
    path = tmp_path / "seed-narrow.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = subprocess.run([sys.executable, "-m", "zmqrl.cli", "validate", str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode != 0
    assert "sends unrolls of up to" in result.stdout + result.stderr


def test_a_learner_takes_no_unroll_wider_than_its_widest_producer():
    """seed.yaml's broker sends unrolls of its actors' 16 envs: the learner refuses one
    of 17, however plausible (the soak's peers made up 1000-env unrolls, each worth
    dozens of batches, and the return fell from 500 to 21)."""
    from nodes.learner import unroll_width_cap
    from zmqrl.run.topology import load

    from conftest import REPO

    topo = load(REPO / "topologies" / "seed.yaml")
    assert unroll_width_cap(topo.nodes["learner"], topo, 1024) == 16
    del topo.nodes["broker"].links["experience"]  # no producer that can tell: the arg
    assert unroll_width_cap(topo.nodes["learner"], topo, 1024) == 1024


def test_a_replay_fed_learners_experience_port_takes_no_large_frame(tmp_path):
    """A learner fed by a replay refuses every unroll, so its experience port takes pings
    only: ZeroMQ drops a peer that announces a frame over wire.CONTROL_FRAME_BYTES
    before any of it is buffered (the soak's hostile unrolls had queued 300 MiB at an
    Ape-X learner while it trained), and the port goes on serving everyone else."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    raw = {"name": "capped", "env": {"id": "CartPole-v1"}, "model": {"kind": "dueling_mlp"},
           "algo": {"kind": "dqn"},
           "nodes": {"replay": {"kind": "replay"},
                     "learner": {"kind": "learner", "links": {"replay": "replay.sample"},
                                 "args": {"device": "cpu", "checkpoint_every": 0}}}}
    learner = in_process(raw, "learner", tmp_path)
    port = learner.sockets["experience"]
    address = port.getsockopt(zmq.LAST_ENDPOINT).decode()
    assert port.getsockopt(zmq.MAXMSGSIZE) == wire.CONTROL_FRAME_BYTES
    ctx = zmq.Context.instance()
    small = big = monitor = None
    try:
        # An honest mistake (a small unroll) is still answered with why.
        small = ctx.socket(zmq.DEALER)
        small.connect(address)
        small.send_multipart(wire.encode(wire.UNROLL, {
            "obs": np.zeros((UNROLL + 1, N, OBS), np.float32)}, version=0))
        deadline = time.monotonic() + 10
        while not port.poll(0):
            assert time.monotonic() < deadline, "the small unroll never arrived"
            time.sleep(0.01)
        learner._drain(port)
        assert small.poll(10_000), "no answer to a small unroll"
        reply = wire.decode(small.recv_multipart())
        assert reply.type == wire.ERROR and "takes no unrolls" in reply.fields["error"], \
            reply.fields

        # A 1 MiB frame: the learner's ZeroMQ drops the connection.
        big = ctx.socket(zmq.DEALER)
        monitor = big.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        big.connect(address)
        big.send_multipart(wire.encode(wire.UNROLL, {
            "obs": np.zeros((UNROLL + 1, 1024, 64), np.float32)}, version=0))
        events, deadline = [], time.monotonic() + 10
        while zmq.EVENT_DISCONNECTED not in events:
            assert time.monotonic() < deadline, f"never dropped: events {events}"
            if monitor.poll(100):
                events.append(recv_monitor_message(monitor)["event"])
        learner._drain(port)
        assert not big.poll(200), "the large frame was read and answered"

        # ... and the port still serves pings.
        small.send_multipart(wire.encode(wire.PING))
        deadline = time.monotonic() + 10
        while not small.poll(0):
            assert time.monotonic() < deadline, "no pong after the drop"
            learner._drain(port)
            time.sleep(0.01)
        assert wire.decode(small.recv_multipart()).type == wire.PONG
    finally:
        for sock in (small, big, monitor):
            if sock is not None:
                sock.close(linger=0)
        close(learner)
