"""The learner node against peers played by the test: a producer of unrolls, a replay
and a parameter server, each a real ZeroMQ socket on the address the topology gives the
real node, and the learner a real process (``zmqrl node``).

Pinned defects: unrolls with a non-integer ``version`` or 2-D episode statistics were
credited and then crashed the learner; a bad ``batch`` from the replay crashed it; a
replay that answers pings but holds samples back (warm-up, rate limiter) made it
reconnect and resend; Gorila's ``pending_grads`` went to 0 on any reply.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zmq

from zmqrl.bus import sockets, wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.parts.envs import env_spec
from zmqrl.parts.models import build_model, state_arrays
from zmqrl.run.topology import load

from conftest import read_csv, wait_for

pytestmark = pytest.mark.minutes(1.1)  # tests/conftest.py: long modules first

UNROLL, OBS, BATCH = 4, 4, 8
MODEL = {"kind": "mlp", "hidden": [8]}
Q_MODEL = {"kind": "dueling_mlp", "hidden": [8]}


def topology(tmp_path: Path, algo: dict, model: dict, links: dict | None = None,
             args: dict | None = None) -> Path:
    nodes: dict[str, Any] = {
        "learner": {"kind": "learner", "links": links or {},
                    "args": {"device": "cpu", "checkpoint_every": 0, **(args or {})}},
    }
    if links:  # the peers the test plays: declared so the addresses exist, never started
        nodes["replay"] = {"kind": "replay", "args": {"capacity": 64, "min_size": 2}}
        nodes["param_server"] = {"kind": "param_server"}
        nodes["actor"] = {"kind": "actor", "args": {"policy": "local"},
                          "links": {"experience": "replay.experience"}}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({"name": "learner-test", "env": {"id": "CartPole-v1"},
                                    "model": model, "algo": algo, "nodes": nodes}))
    return path


@dataclass
class Learner:
    proc: Any
    log: Path
    run_dir: Path
    endpoints: Endpoints

    def rows(self) -> list[dict[str, str]]:
        return read_csv(self.run_dir / "metrics" / "learner.csv")

    def last(self, column: str) -> float:
        rows = [r for r in self.rows() if r.get(column) not in (None, "")]
        return float(rows[-1][column]) if rows else 0.0

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"learner died:\n{self.log.read_text()[-3000:]}"
        assert "Traceback" not in self.log.read_text(), self.log.read_text()[-3000:]


def start_learner(processes, tmp_path: Path, topo_path: Path) -> Learner:
    run_dir = tmp_path / "run"
    log = tmp_path / "learner.log"
    proc = processes.zmqrl("node", str(topo_path), "learner", "--run-dir", str(run_dir),
                           log=log)
    return Learner(proc, log, run_dir, Endpoints(load(topo_path), run_dir))


class Server:
    """A ROUTER bound where a node of the topology would be: the test plays it."""

    def __init__(self, address: str):
        self.address = address
        self.sock = self._bind()

    def _bind(self) -> zmq.Socket:
        if self.address.startswith("ipc://"):
            Path(self.address[6:]).unlink(missing_ok=True)
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.address)
        return sock

    def restart(self) -> None:
        """Close and bind again: the peer's connection drops, as when a process restarts."""
        self.sock.close()
        self.sock = self._bind()

    def recv(self, timeout: float, answer_pings: bool = True) -> tuple[list, wire.Message]:
        """The next message that is not a ping (answered with a pong) within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            if not self.sock.poll(int(left * 1000)):
                raise TimeoutError(f"nothing within {timeout:.1f}s")
            envelope, body = sockets.split_envelope(self.sock.recv_multipart())
            msg = wire.decode(body)
            if msg.type == wire.PING:
                if answer_pings:
                    sockets.send(self.sock, wire.encode(wire.PONG, node="test"), envelope)
                continue
            return envelope, msg

    def collect(self, seconds: float, msg_type: str) -> list[tuple[list, wire.Message]]:
        """Every ``msg_type`` message for ``seconds`` (answering pings meanwhile)."""
        got = []
        deadline = time.monotonic() + seconds
        while True:  # at least one pass: collect(0) takes what is there now
            try:
                envelope, msg = self.recv(deadline - time.monotonic())
            except TimeoutError:
                break
            if msg.type == msg_type:
                got.append((envelope, msg))
        return got

    def reply(self, envelope: list, frames: list) -> None:
        sockets.send(self.sock, frames, envelope)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.close()


def batch(fields: dict | None = None, **bad: np.ndarray) -> list:
    rng = np.random.default_rng(0)
    arrays = {"obs": rng.normal(size=(BATCH, OBS)).astype(np.float32),
              "action": rng.integers(0, 2, BATCH).astype(np.int64),
              "reward": np.ones(BATCH, np.float32),
              "discount": np.full(BATCH, 0.97, np.float32),
              "next_obs": rng.normal(size=(BATCH, OBS)).astype(np.float32),
              "key": np.arange(BATCH, dtype=np.int64),
              "weight": np.ones(BATCH, np.float32)}
    return wire.encode(wire.BATCH, {**arrays, **bad}, **(fields or {}))


def unroll(n: int = 4, version: Any = 0, **extra: np.ndarray) -> list:
    arrays = {"obs": np.zeros((UNROLL + 1, n, OBS), np.float32),
              "action": np.zeros((UNROLL, n), np.int64),
              "logp": np.full((UNROLL, n), -0.7, np.float32),
              "reward": np.ones((UNROLL, n), np.float32),
              "done": np.zeros((UNROLL, n), bool), **extra}
    return wire.encode(wire.UNROLL, arrays, version=version)


# ----- defect 4: check every field and array before storing or crediting -----------
def test_bad_unrolls_are_rejected_before_credit_and_good_ones_train(
        processes, tmp_path, client_factory):
    learner = start_learner(processes, tmp_path, topology(
        tmp_path, {"kind": "a2c", "unroll": UNROLL, "batch_size": 4}, MODEL))
    client = client_factory(learner.endpoints.bind_address("learner", "experience", 0))
    assert client.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    bad = {
        "string version": unroll(version="x"),
        "float version": unroll(version=1.5),
        "2-D ep_return": unroll(ep_return=np.ones((2, 2), np.float32),
                                ep_length=np.ones((2, 2), np.int32)),
        "ep_length of another length": unroll(ep_return=np.ones(2, np.float32),
                                              ep_length=np.ones(3, np.int32)),
        "NaN ep_return": unroll(ep_return=np.array([np.nan], np.float32),
                                ep_length=np.ones(1, np.int32)),
        "uint8 done": unroll(done=np.zeros((UNROLL, 4), np.uint8)),
    }
    for what, frames in bad.items():
        reply = client.request(frames)
        assert reply.type == wire.ERROR, f"{what}: got '{reply.type}', not an error"
    good = unroll(version=0, ep_return=np.array([21.0], np.float32),
                  ep_length=np.array([21], np.int32))
    assert client.request(good).type == wire.CREDIT
    wait_for(lambda: learner.last("updates") >= 1 and learner.last("episodes") >= 1
             and learner.last("bad_messages") == len(bad), 20,
             "the learner to train on the good unroll and count its episode")
    assert learner.last("return_mean_100") == 21.0
    learner.assert_alive()


# ----- defect 3: a bad batch from the replay is a protocol error, not a crash -------
def dqn_learner(processes, tmp_path, servers, args: dict | None = None,
                param_server: bool = False) -> tuple[Learner, Server, Server | None]:
    links = {"replay": "replay.sample"}
    if param_server:
        links["param_server"] = "param_server.grads"
    topo_path = topology(tmp_path, {"kind": "dqn", "batch_size": BATCH}, Q_MODEL, links,
                         {"prefetch": 2, **(args or {})})
    endpoints = Endpoints(load(topo_path), tmp_path / "run")
    servers.append(Server(endpoints.bind_address("replay", "sample", 0)))
    ps = None
    if param_server:
        servers.append(ps := Server(endpoints.bind_address("param_server", "grads", 0)))
    return start_learner(processes, tmp_path, topo_path), servers[0], ps


def test_bad_batches_are_rejected_and_the_learner_keeps_asking(processes, tmp_path, servers):
    learner, replay, _ = dqn_learner(processes, tmp_path, servers)
    bad = [batch(action=np.full(BATCH, 7, np.int64)),  # CartPole has 2 actions
           batch(obs=np.full((BATCH, OBS), np.nan, np.float32)),
           batch(reward=np.ones(BATCH + 1, np.float32)),
           batch(discount=np.full(BATCH, 1.5, np.float32)),
           batch(key=np.arange(BATCH, dtype=np.float32))]
    for frames in bad:
        envelope, msg = replay.recv(90)  # each answered request is asked again
        assert msg.type == wire.SAMPLE, msg.type
        replay.reply(envelope, frames)
    envelope, msg = replay.recv(10)
    assert msg.type == wire.SAMPLE and msg.fields.get("client") == "learner"
    replay.reply(envelope, batch({"source": "replay-incarnation-1"}))
    # Trained on the good one: its priorities come back, naming the keys' source.
    got = replay.collect(3, wire.PRIORITIES)
    assert [m.fields.get("source") for _, m in got] == ["replay-incarnation-1"]
    wait_for(lambda: learner.last("updates") >= 1 and learner.last("bad_messages") == len(bad)
             and learner.last("batches_rejected") == len(bad), 10,
             "the metrics to show the update and the rejected batches")
    learner.assert_alive()


# ----- defect 10: pongs are liveness; held-back samples are waiting, not loss -------
def test_a_replay_that_holds_samples_back_is_waited_for_not_asked_again(
        processes, tmp_path, servers):
    learner, replay, _ = dqn_learner(processes, tmp_path, servers)
    requests = [replay.recv(90)]
    # Past start-up: the loop runs and its first liveness check is done. (A set-up
    # slower than peer_timeout_s counts as silence and costs one reconnect: a quirk of
    # the runtime's liveness clock, not what this test is about.)
    while not learner.rows():
        requests += replay.collect(0.5, wire.SAMPLE)
    requests += replay.collect(2, wire.SAMPLE)
    held = [r for r in requests if r[0] == requests[-1][0]]  # the current connection's
    assert len(held) == 2, f"{len(held)} sample requests in flight, want prefetch = 2"
    reconnects = learner.last("replay_reconnects")
    # Warm-up: answer pings, serve nothing, for longer than the old 10 s request timeout.
    again = replay.collect(12, wire.SAMPLE)
    assert again == [], f"{len(again)} sample requests sent again while we held them"
    for envelope, _ in held:  # the replay is warm: both requests get their batch
        replay.reply(envelope, batch())
    wait_for(lambda: learner.last("updates") >= 2, 10, "the learner to train on both")
    assert learner.last("replay_reconnects") == reconnects
    learner.assert_alive()


def test_a_replay_that_restarted_is_asked_again_at_once(processes, tmp_path, servers):
    learner, replay, _ = dqn_learner(processes, tmp_path, servers)
    replay.recv(90)
    replay.restart()  # faster than any liveness timeout: the new one answers pings
    t0 = time.monotonic()
    got = replay.collect(3, wire.SAMPLE)
    assert len(got) == 2, f"{len(got)} sample requests reached the restarted replay"
    assert time.monotonic() - t0 < 3.5
    for envelope, _ in got:
        replay.reply(envelope, batch())
    wait_for(lambda: learner.last("updates") >= 2, 10, "the learner to train on again")
    learner.assert_alive()


# ----- defect 11: each parameter-server reply answers one gradient ------------------
def test_each_param_server_reply_frees_one_gradient_slot(processes, tmp_path, servers):
    learner, replay, ps = dqn_learner(processes, tmp_path, servers,
                                      {"max_pending_grads": 2}, param_server=True)
    topo = load(tmp_path / "topology.yaml")
    model = build_model(topo.model, env_spec(topo.env), topo.seed)
    params = state_arrays(model)

    def serve_replay(seconds: float) -> list[tuple[list, wire.Message]]:
        """Serve every sample at once for ``seconds``; return what reached the server."""
        grads = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for envelope, _ in replay.collect(0, wire.SAMPLE):
                replay.reply(envelope, batch())
            grads += ps.collect(min(left, 0.02), wire.GRADS)
        return grads

    grads: list[tuple[list, wire.Message]] = []
    deadline = time.monotonic() + 90
    while not learner.rows() and time.monotonic() < deadline:  # past start-up (see above)
        grads += serve_replay(0.5)
    grads += serve_replay(2)
    grads = [g for g in grads if g[0] == grads[-1][0]]  # the current connection's
    assert len(grads) == 2, f"{len(grads)} gradients in flight, want max_pending_grads = 2"
    assert serve_replay(2) == [], "more gradients than max_pending_grads in flight"
    ps.reply(grads[0][0], wire.encode(wire.PARAMS, params, version=1))
    more = serve_replay(3)
    assert len(more) == 1, f"{len(more)} gradients after one reply (want exactly 1)"
    wait_for(lambda: learner.last("pending_grads") == 2 and learner.last("updates") == 1, 5,
             "the metrics to show two gradients pending and one update")
    learner.assert_alive()


# ----- data-parallel replicas: uneven round-robin must not stall the group ----------
def test_data_parallel_replicas_pool_unrolls_that_reached_only_one(
        processes, tmp_path, client_factory):
    """Producers' DEALER round-robin need not split unrolls evenly (a replica that binds
    late or reconnects gets fewer). Here every unroll reaches replica 0: both replicas
    must still train, on equal shares, into bitwise equal parameters, and a stop of one
    must stop both cleanly (no replica left waiting in a collective)."""
    import os
    import signal

    obs, T, n = 3, 4, 2  # Pendulum-v1: Box observations [3], actions [1]
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({
        "name": "dp-test", "env": {"id": "Pendulum-v1"}, "model": {"kind": "mlp", "hidden": [8]},
        "algo": {"kind": "ppo", "unroll": T, "batch_size": 4, "epochs": 1, "minibatches": 1,
                 "light_adam": True},
        "nodes": {"learner": {"kind": "learner", "replicas": 2,
                              "args": {"device": "cpu", "checkpoint_every": 0}}}}))
    run_dir = tmp_path / "run"
    procs = [processes.zmqrl("node", str(path), "learner", "--replica", str(r), "--run-dir",
                             str(run_dir), log=tmp_path / f"learner.{r}.log") for r in (0, 1)]
    endpoints = Endpoints(load(path), run_dir)
    client = client_factory(endpoints.bind_address("learner", "experience", 0))
    assert client.request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    rng = np.random.default_rng(0)
    for _ in range(4):  # 4 x 2 columns: two updates of 2 + 2 columns
        frames = wire.encode(wire.UNROLL, {
            "obs": rng.normal(size=(T + 1, n, obs)).astype(np.float32),
            "action": rng.normal(size=(T, n, 1)).astype(np.float32),
            "logp": np.full((T, n), -1.0, np.float32),
            "reward": rng.normal(size=(T, n)).astype(np.float32),
            "done": np.zeros((T, n), bool)}, version=0)
        assert client.request(frames).type == wire.CREDIT

    def digests() -> list[str]:
        rows = [read_csv(run_dir / "metrics" / f"learner.{r}.csv") for r in (0, 1)]
        return [next((row["params_digest"] for row in reversed(rs)
                      if row.get("digest_updates") == "2"), "") for rs in rows]

    wait_for(lambda: all(digests()), 60, "both replicas to make two updates")
    first, second = digests()
    assert first == second, "the replicas' parameters differ"
    os.killpg(procs[0].pid, signal.SIGTERM)  # one replica stops: both must, cleanly
    for r, proc in enumerate(procs):
        assert proc.wait(timeout=30) == 0, (tmp_path / f"learner.{r}.log").read_text()[-3000:]
        assert (run_dir / "checkpoints" / f"learner.{r}.pt").exists()


# ----- Gorila: the target network follows the server's version ----------------------
def test_gorila_target_network_follows_the_servers_version():
    """Two learners each see about half the server's updates: a target copy every
    ``target_update_every`` of *their own* replies would come twice as late as the
    algorithm says. It follows the version in the server's replies instead."""
    import logging

    import torch

    from zmqrl.parts.algos import make_algo
    from zmqrl.parts.learning.checks import context
    from zmqrl.parts.learning.updaters import GradientPush

    env = env_spec({"id": "CartPole-v1"})
    model = build_model(Q_MODEL, env, seed=0)
    algo = make_algo({"kind": "dqn", "batch_size": BATCH, "target_update_every": 4}, model)

    class Node:  # what GradientPush uses of a node: a socket, send, expect_reply, log
        log = logging.getLogger("test")
        sockets = {"param_server": zmq.Context.instance().socket(zmq.DEALER)}
        expect_reply = staticmethod(lambda msg, t, peer: None)

    push = GradientPush(Node(), context(env, model), max_pending=2)
    updates = []
    push.bind(algo, lambda: updates.append(1))
    server = build_model(Q_MODEL, env, seed=1)  # other parameters than ours

    def target_equals(m: torch.nn.Module) -> bool:
        theirs = m.state_dict()
        return all(torch.equal(v, theirs[k]) for k, v in algo.target_model.state_dict().items())

    try:
        for version in (2, 3):  # the other learner's replies took versions 1 and ...
            push.on_reply(wire.decode(wire.encode(wire.PARAMS, state_arrays(server),
                                                  version=version)))
            push.poll()
            assert not target_equals(server), f"target copied at server version {version}"
        push.on_reply(wire.decode(wire.encode(wire.PARAMS, state_arrays(server), version=5)))
        push.poll()  # crossed 4: copied, although this learner saw only 3 replies
        assert target_equals(server) and target_equals(model)
        assert len(updates) == 3 and algo.updates == 5
    finally:
        push.close()
        Node.sockets["param_server"].close()


# ----- replay client: prefetch bounds what waits, not only what is asked -------------
def test_replay_client_keeps_at_most_prefetch_batches_asked_or_waiting():
    """A learner slower than its replay (Gorila's waits on the parameter server) used to
    ask again whenever a batch arrived, so untrained batches piled up without end (973
    after 42 s in a Gorila run): stale samples, memory, and a rate limiter counting
    batches nobody trained on. Asked-for plus waiting stays within ``prefetch``."""
    import torch

    from zmqrl.parts.learning.checks import context
    from zmqrl.parts.learning.sources import ReplayClient

    spec = env_spec({"id": "CartPole-v1"})
    model = build_model({"kind": "dueling_mlp", "hidden": [8]}, spec)
    sent: list[wire.Message] = []
    sock = zmq.Context.instance().socket(zmq.DEALER)

    class Node:  # what the client uses of a node: its socket, send, label, log
        sockets = {"replay": sock}
        ctx = type("Ctx", (), {"label": "learner"})()
        log = __import__("logging").getLogger("test")

        def send(self, link: str, frames: list) -> None:
            sent.append(wire.decode(frames))

        def expect_reply(self, msg: wire.Message, want: str, who: str) -> None:
            assert msg.type == want

    B = 4
    client = ReplayClient(Node(), context(spec, model), B, prefetch=2,
                          device=torch.device("cpu"))
    rng = np.random.default_rng(0)

    def batch() -> wire.Message:
        return wire.decode(wire.encode(wire.BATCH, {
            "obs": rng.normal(size=(B, 4)).astype(np.float32),
            "action": np.zeros(B, np.int64), "reward": np.ones(B, np.float32),
            "discount": np.full(B, 0.99, np.float32),
            "next_obs": rng.normal(size=(B, 4)).astype(np.float32),
            "weight": np.ones(B, np.float32), "key": np.arange(B, dtype=np.int64)}))

    try:
        client.poll()
        assert len(sent) == 2  # prefetch requests out
        for _ in range(10):  # the replay answers each request; the learner trains on none
            for _ in range(client.in_flight):
                client.on_message([], batch())
            client.poll()
        assert len(client.batches) == 2 and len(sent) == 2, (len(client.batches), len(sent))
        assert client.next_batch(0) is not None  # trained on one: one more may be asked
        client.poll()
        assert len(sent) == 3 and client.in_flight == 1 and len(client.batches) == 1
    finally:
        client.close()
        sock.close(linger=0)
