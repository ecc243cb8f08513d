"""A label's reports are believed only from the peer that said hello with the secret its
supervisor handed that label's process (``ZMQRL_NODE_SECRET``), not from one that knows
the label and the node's pid (issue 29, defect 4).

One test against a running ``zmqrl up`` (a foreign DEALER on the supervisor's socket
sends a hello as the actor with the actor's real pid, then steps enough to stop the
run); the rest against :class:`~zmqrl.run.runmetrics.RunMetrics` directly (the binding
of a label to the identity that first said hello, a restart's new secret).
"""

from __future__ import annotations

import msgpack
import pytest
import zmq

from zmqrl.bus import wire
from zmqrl.bus.endpoints import supervisor_address
from zmqrl.run.runmetrics import RunMetrics, StopConditions, new_secret
from zmqrl.run.topology import load

from conftest import REPO, pid_of, read_csv, stop_process, wait_for, write_topology


def raw(msg_type: str, **fields) -> list[bytes]:
    return [msgpack.packb({"v": 1, "t": msg_type, **fields, "arrays": []}, use_bin_type=True)]


def hello(label: str, pid: int, **extra) -> wire.Message:
    node = label.split(".")[0]
    return wire.decode(raw(wire.HELLO, label=label, kind=node, node=node, replica=0,
                           incarnation="ab12", pid=pid, role="acts", **extra))


def metrics(label: str, steps: int) -> wire.Message:
    return wire.decode(raw(wire.METRICS, label=label, row={"env_steps": steps},
                           episodes=[]))


def test_a_peer_that_knows_the_label_and_the_pid_cannot_take_over_its_reports(
        processes, tmp_path):
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 1, "args": {"envs": 4}}})
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), "--max-steps",
                           str(10**9), log=log)
    # The real actor said hello (with its secret): its steps are counted.
    wait_for(lambda: read_csv(run_dir / "metrics" / "run.csv")
             and int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"]) > 0, 90,
             "the run to count the actor's steps")
    actor_pid = pid_of(run_dir, "actor")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(supervisor_address(run_dir))
    try:
        for frames in (
                raw(wire.HELLO, label="actor", kind="actor", node="actor", replica=0,
                    incarnation="f00d", pid=actor_pid, role="acts"),
                raw(wire.HELLO, label="actor", kind="actor", node="actor", replica=0,
                    incarnation="f00d", pid=actor_pid, role="acts", secret="0" * 32),
                raw(wire.METRICS, label="actor", row={"env_steps": 10**10}, episodes=[])):
            sock.send_multipart(frames)
        wait_for(lambda: log.read_text().count("supervisor: rejected report") >= 3, 20,
                 "the three reports to be rejected")
    finally:
        sock.close()
    out = log.read_text()
    assert "without the secret" in out, out[-3000:]
    # The real actor still reports (its label was not taken over) and nothing stopped.
    steps = int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"])
    wait_for(lambda: int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"]) > steps,
             30, "the actor's steps to keep counting")
    assert proc.poll() is None, log.read_text()[-3000:]
    assert "reached" not in log.read_text()
    assert all(int(r["env_steps"]) < 10**10 for r in read_csv(run_dir / "metrics" / "run.csv"))
    stop_process(proc)


@pytest.fixture
def run(tmp_path) -> RunMetrics:
    return RunMetrics(load(str(REPO / "topologies" / "seed.yaml")),
                      StopConditions(max_steps=10**6), tmp_path)


def test_the_label_binds_to_the_identity_that_said_hello_with_its_secret(run):
    secret = new_secret()
    run.started("actor", "actor", 4242, secret)
    # Its pid alone, a wrong secret, a secret of the wrong type: not believed.
    for bad in (hello("actor", 4242), hello("actor", 4242, secret="x" * 32),
                hello("actor", 4242, secret=secret[:-1] + ("1" if secret[-1] == "0" else "0")),
                hello("actor", 4242, secret="é" * 32)):
        with pytest.raises(wire.ProtocolError, match="without the secret"):
            run.handle(b"spoof", bad)
    with pytest.raises(wire.ProtocolError, match="did not say hello"):
        run.handle(b"spoof", metrics("actor", 10**7))
    assert run.handle(b"real", hello("actor", 4242, secret=secret)) == "actor"
    run.handle(b"real", metrics("actor", 100))
    # Bound to the first identity: even the secret does not move it to another one.
    with pytest.raises(wire.ProtocolError, match="second peer"):
        run.handle(b"other", hello("actor", 4242, secret=secret))
    for msg in (metrics("actor", 10**7), wire.decode(raw(wire.HEARTBEAT, label="actor"))):
        with pytest.raises(wire.ProtocolError, match="did not say hello"):
            run.handle(b"other", msg)
    assert run.total_env_steps == 100 and run.stop_reason(1.0) is None


def test_a_restart_gets_a_new_secret_and_the_old_one_is_worthless(run):
    old = new_secret()
    run.started("actor", "actor", 4242, old)
    run.handle(b"first", hello("actor", 4242, secret=old))
    new = new_secret()
    assert new != old
    run.started("actor", "actor", 4343, new)  # restarted: a new process, a new secret
    with pytest.raises(wire.ProtocolError, match="without the secret"):
        run.handle(b"first", hello("actor", 4242, secret=old))
    with pytest.raises(wire.ProtocolError, match="did not say hello"):
        run.handle(b"first", metrics("actor", 5))
    assert run.handle(b"second", hello("actor", 4343, secret=new)) == "actor"
