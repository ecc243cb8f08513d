"""PBT among hostile or failing peers (issue 29, defect 6 and low points 1-3): a member
is bound to the connection that first reported as it, and only the asked donor and the
recipient take part in an exploit; a bad ``pbt_load`` is refused with nothing touched;
a stopped controller never blocks a member; a state too large to copy says so at once;
and a load is published under a new version and checkpointed before it is reported."""

from __future__ import annotations

import io
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zmq

from zmqrl.bus import sockets, wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.bus.node import Node
from zmqrl.parts.learning.pbt_member import PBTMember
from zmqrl.run.population import Bindings
from zmqrl.run.topology import load

from conftest import wait_for, write_topology


# ----- member bindings ----------------------------------------------------------------
def test_a_member_is_bound_to_its_first_peer_until_that_peer_has_gone():
    bindings = Bindings(idle_s=30.0)
    a, b = (b"a",), (b"b",)
    connected = {a, b}

    def gone(identity: tuple) -> bool:
        return identity not in connected

    assert bindings.claim(0, a, 0.0, gone) is None
    assert "another peer" in bindings.claim(0, b, 1.0, gone)  # a is still there
    assert "reports as member 0" in bindings.claim(1, a, 1.0, gone)  # one peer, one member
    assert bindings.claim(0, a, 20.0, gone) is None
    assert bindings.claim(0, b, 40.0, gone) is not None  # a reported 20 s ago
    assert bindings.claim(0, b, 51.0, gone) is None  # silent for 30 s: passes on
    assert bindings.member_of(b) == 0 and bindings.member_of(a) is None
    connected.discard(b)  # b's connection closed (its learner restarted): a new one binds
    assert bindings.claim(0, a, 52.0, gone) is None and bindings.peers[0] == a


def _report(member: int, steps: int, ret: float) -> list:
    return wire.encode(wire.PBT_REPORT, member=member, steps=steps, mean_return=ret,
                       hyperparameters={"lr": 1e-3}, checkpointed=True)


_SEQ = iter(range(1, 1 << 30))


def _answer(client, frames: list) -> str:
    """Send ``frames`` then a ping: 'ok' if nothing but the ping's pong comes back
    (reports and answers get no reply), else the error text. (The controller's probes
    are pongs without our seq.)"""
    seq = next(_SEQ)
    client.send(frames)
    client.send(wire.encode(wire.PING, seq=seq))
    answer = "ok"
    while True:
        reply = client.recv(10)
        if reply.type == wire.ERROR:
            answer = reply.fields["error"]
        elif reply.type == wire.PONG and reply.fields.get("seq") == seq:
            return answer
        else:
            assert reply.type == wire.PONG, reply


def _next(client, msg_type: str, timeout: float = 10) -> wire.Message:
    """The next ``msg_type`` the controller sends ``client`` (its probes are pongs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = client.recv(max(0.1, deadline - time.monotonic()))
        if msg.type == msg_type:
            return msg
        assert msg.type == wire.PONG, msg
    raise AssertionError(f"no {msg_type} within {timeout}s")


def test_only_a_members_own_peer_speaks_for_it_in_an_exploit(processes, tmp_path,
                                                            client_factory):
    """Four peers report as members 0-3; member 0 at its ready point is to copy member 3.
    A second peer reporting as member 0 is refused; a `pbt_state` from any peer but the
    asked donor, or naming a member the sender is not, is refused and never forwarded;
    so is a `pbt_loaded` from any peer but the recipient; the real ones complete the
    exploit. A donor that answers `error` (its state too large) drops the exploit at once:
    the recipient's next ready point asks again, with no 30 s timeout, and the controller
    logs the reason once."""
    path = write_topology(tmp_path, "pbt_seed.yaml", population={"ready_after_steps": 100})
    run_dir, log = tmp_path / "run", tmp_path / "pbt.log"
    processes.zmqrl("node", str(path), "pbt", "--run-dir", str(run_dir), log=log)
    address = Endpoints(load(path), run_dir).bind_address("pbt", "members", 0)
    peers = [client_factory(address) for _ in range(4)]
    assert peers[0].request(wire.encode(wire.PING), timeout=90).type == wire.PONG
    for member, ret in ((1, 50.0), (2, 30.0), (3, 90.0)):  # not at a ready point yet
        assert _answer(peers[member], _report(member, 50, ret)) == "ok"
    stranger = client_factory(address)
    assert "another peer" in _answer(stranger, _report(3, 50, 1000.0))
    assert "reports as member 1" in _answer(peers[1], _report(2, 50, 1000.0))

    assert _answer(peers[0], _report(0, 100, 10.0)) == "ok"  # ready: copies member 3
    ask = _next(peers[3], wire.PBT_GET_STATE)
    assert ask.fields["request"] == 0
    fake = {"state": np.frombuffer(b"their weights", np.uint8)}
    real = {"state": np.frombuffer(b"member 3 weights", np.uint8)}
    state = dict(request=0, hyperparameters={"lr": 1e-3}, updates=5)
    assert "does not report as that member" in _answer(
        peers[1], wire.encode(wire.PBT_STATE, fake, member=3, **state))
    assert "no exploit waits" in _answer(
        peers[1], wire.encode(wire.PBT_STATE, fake, member=1, **state))
    assert _answer(peers[3], wire.encode(wire.PBT_STATE, real, member=3, **state)) == "ok"
    load_msg = _next(peers[0], wire.PBT_LOAD)
    assert bytes(load_msg["state"]) == b"member 3 weights" and load_msg.fields["donor"] == 3
    loaded = dict(request=0, donor=3, donor_updates=5, hyperparameters={"lr": 1e-3})
    assert "does not report as that member" in _answer(
        peers[3], wire.encode(wire.PBT_LOADED, member=0, **loaded))
    assert "no load" in _answer(peers[1], wire.encode(wire.PBT_LOADED, member=1, **loaded))
    lineage = run_dir / "pbt" / "lineage.jsonl"
    assert not lineage.exists() or not lineage.read_text().strip()
    assert _answer(peers[0], wire.encode(wire.PBT_LOADED, member=0, **loaded)) == "ok"
    assert len(lineage.read_text().splitlines()) == 1

    # Low 2: the donor cannot send its state; the controller hears why and moves on.
    too_large = "member 3's state is 300000000 bytes ... network.max_message_bytes"
    for steps in (200, 300):
        assert _answer(peers[0], _report(0, steps, 10.0)) == "ok"
        ask = _next(peers[3], wire.PBT_GET_STATE)
        assert ask.fields["request"] == 0
        # (and a ping after it: two peers' messages have no order, so the next report
        # must not overtake this answer)
        _answer(peers[3], wire.encode(wire.ERROR, error=too_large, request=0))
    assert _answer(peers[3], _report(3, 50, 90.0)) == "ok"  # the errors were taken
    assert log.read_text().count(too_large) == 1, log.read_text()[-3000:]

    # A member whose peer has gone (its learner restarted) binds to the new one.
    peers[2].close()
    again = client_factory(address)
    wait_for(lambda: _answer(again, _report(2, 50, 30.0)) == "ok", 10,
             "member 2's new peer to be bound")
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


# ----- the member's side --------------------------------------------------------------
class _FakeLearner:
    """Just what PBTMember touches of a learner, with the node's real ``send``."""

    def __init__(self, sock: zmq.Socket, tmp_path: Path, max_message_bytes: int):
        self.model = torch.nn.Linear(64, 64)
        self.algo = SimpleNamespace(state_dict=lambda: {"updates": 0})
        self.updates = 0
        self.source = SimpleNamespace(state=lambda: {"env_steps": 0})
        self.checkpointer = SimpleNamespace(path=tmp_path / "none.pt")
        self.log = SimpleNamespace(warning=lambda *a: None, info=lambda *a: None)
        self.max_message_bytes = max_message_bytes
        self.sockets, self.dropped, self._traffic = {"pbt": sock}, 0, {"pbt": [0, 0, 0, 0]}

    def send(self, name: str, frames: list, envelope: list | None = None, flags: int = 0):
        return Node.send(self, name, frames, envelope, flags)  # type: ignore[arg-type]

    def every(self, seconds: float, callback) -> None:  # noqa: ANN001
        pass


@pytest.fixture
def dealer(tmp_path):
    """A member's pbt DEALER at a small HWM, its controller gone (nobody binds there);
    a send that would block fails after 2 s instead of hanging the test."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 2)
    sock.setsockopt(zmq.SNDTIMEO, 2000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{tmp_path}/gone-controller")
    yield sock
    sock.close()


def test_a_gone_controller_never_blocks_a_member(tmp_path, dealer):
    """Low 1: with the queue to the controller full, reports are dropped and counted at
    once (a learner's real socket has no send timeout: it blocked for good)."""
    member = PBTMember(_FakeLearner(dealer, tmp_path, wire.MAX_MESSAGE_BYTES), 0, {})
    t0 = time.monotonic()
    for _ in range(6):
        member.report()
    assert time.monotonic() - t0 < 1.0
    assert member.metrics()["pbt_reports_dropped"] >= 4


def test_a_donor_too_large_to_copy_says_so(tmp_path):
    """Low 2: a state over network.max_message_bytes gets an error naming its size, the
    limit and the setting, not a state no peer would take."""
    ctx = zmq.Context.instance()
    router, sock = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    address = f"ipc://{tmp_path}/controller"
    router.bind(address)
    sock.connect(address)
    try:
        learner = _FakeLearner(sock, tmp_path, 1 << 16)  # a 64x64 Linear is ~17 KB
        member = PBTMember(learner, 3, {})
        member.on_message(wire.Message(wire.PBT_GET_STATE, {"request": 0}, {}))
        assert router.poll(5000)
        reply = wire.decode(sockets.split_envelope(router.recv_multipart())[1])
        assert reply.type == wire.ERROR and reply.fields["request"] == 0
        assert "network.max_message_bytes = 65536" in reply.fields["error"]
        learner.max_message_bytes = wire.MAX_MESSAGE_BYTES
        member.on_message(wire.Message(wire.PBT_GET_STATE, {"request": 0}, {}))
        assert router.poll(5000)
        assert wire.decode(sockets.split_envelope(router.recv_multipart())[1]).type == \
            wire.PBT_STATE
    finally:
        router.close(linger=0)
        sock.close(linger=0)


# ----- a real learner given bad and good loads ----------------------------------------
def _state_bytes(state: dict) -> np.ndarray:
    buf = io.BytesIO()
    torch.save(state, buf)
    return np.frombuffer(buf.getvalue(), np.uint8)


def test_a_learner_refuses_a_bad_load_and_publishes_and_checkpoints_a_good_one(
        processes, tmp_path):
    """Defect 6: garbage, a state of another shape or with NaN, and an unknown, mistyped
    or out-of-range hyperparameter each get `error`, and the learner keeps the state it
    had. Low 3: a good load is published under a version above every earlier one, and
    is in the learner's checkpoint by the time it answers `pbt_loaded`."""
    path = write_topology(tmp_path, "pbt_seed.yaml")
    run_dir = tmp_path / "run"
    topo = load(path)
    endpoints = Endpoints(topo, run_dir)
    ctx = zmq.Context.instance()
    controller, params = ctx.socket(zmq.ROUTER), ctx.socket(zmq.SUB)
    for sock in (controller, params):
        sock.setsockopt(zmq.LINGER, 0)
    controller.bind(endpoints.bind_address("pbt", "members", 0))
    params.setsockopt(zmq.SUBSCRIBE, b"")
    params.connect(endpoints.bind_address("learner_m0", "params", 0))
    log = tmp_path / "learner.log"
    proc = processes.zmqrl("node", str(path), "learner_m0", "--run-dir", str(run_dir), log=log)
    versions: list[int] = []
    published_arrays: dict[int, dict] = {}  # version -> its arrays
    try:
        def recv(msg_type: str, timeout: float = 10) -> tuple[list, wire.Message]:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if controller.poll(100):
                    envelope, body = sockets.split_envelope(controller.recv_multipart())
                    msg = wire.decode(body)
                    if msg.type == msg_type:
                        return envelope, msg
                    if msg.type == wire.PING:  # the learner's liveness check of its link
                        controller.send_multipart(envelope + wire.encode(wire.PONG))
                        continue
                    assert msg.type == wire.PBT_REPORT, msg
                while params.poll(0):
                    update = wire.decode(params.recv_multipart())
                    versions.append(update.fields["version"])
                    published_arrays[update.fields["version"]] = update.arrays
                assert proc.poll() is None, log.read_text()[-3000:]
            raise AssertionError(f"no {msg_type} within {timeout}s: "
                                 f"{log.read_text()[-3000:]}")

        envelope, _ = recv(wire.PBT_REPORT, 90)

        def request(msg_type: str, arrays: dict | None = None, **fields) -> None:
            controller.send_multipart(envelope + wire.encode(msg_type, arrays, **fields))

        def model_state() -> dict:
            request(wire.PBT_GET_STATE, request=1)
            msg = recv(wire.PBT_STATE)[1]
            return torch.load(io.BytesIO(msg["state"].tobytes()), weights_only=True)

        before = model_state()
        good = {**before, "model": {k: torch.full_like(v, 0.25)
                                    for k, v in before["model"].items()}}
        first = next(iter(good["model"]))
        nan = {**good, "model": {**good["model"], first: good["model"][first] * np.nan}}
        shape = {**good, "model": {**good["model"], first: torch.zeros(3)}}
        lr = {"lr": 1e-3}
        bad_loads = [
            (np.frombuffer(b"not a state at all", np.uint8), lr, "does not decode"),
            (_state_bytes(nan), lr, "non-finite"),
            (_state_bytes(shape), lr, "shape"),
            (_state_bytes(good), {"nope": 1}, "nope"),
            (_state_bytes(good), {"lr": "fast"}, "lr"),
            (_state_bytes(good), {"discount": 1.5}, "discount"),
            (_state_bytes({"model": good["model"]}), lr, "updates"),
        ]
        for state, hyper, why in bad_loads:
            request(wire.PBT_LOAD, {"state": state}, request=0, donor=1, hyperparameters=hyper)
            error = recv(wire.ERROR)[1].fields["error"]
            assert why in error, (why, error)
        after = model_state()
        for name, value in before["model"].items():  # nothing was loaded
            assert torch.equal(after["model"][name], value), name
        assert after["algo"]["optimizer"]["param_groups"][0]["lr"] == \
            before["algo"]["optimizer"]["param_groups"][0]["lr"]

        wait_for(lambda: recv(wire.PBT_REPORT) and versions, 30, "the learner's params")
        published = max(versions)
        # Counted before the load: the learner publishes the loaded params before it
        # checkpoints and answers, so they may arrive before `pbt_loaded` does.
        n = len(versions)
        request(wire.PBT_LOAD, {"state": _state_bytes(good)}, request=0, donor=1,
                hyperparameters=lr)
        loaded = recv(wire.PBT_LOADED)[1]
        assert loaded.fields["donor"] == 1
        checkpoint = torch.load(run_dir / "checkpoints" / "learner_m0.pt", weights_only=True)
        assert torch.equal(checkpoint["model"][first], good["model"][first])
        assert checkpoint["pbt"]["hyperparameters"] == lr
        wait_for(lambda: len(versions) > n or recv(wire.PBT_REPORT) and len(versions) > n,
                 10, "the loaded params published")
        newest = max(versions[n:])
        assert newest > published, (published, versions)
        assert np.all(published_arrays[newest][first] == 0.25), "published, but not the load"
        assert proc.poll() is None
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    finally:
        controller.close()
        params.close()
