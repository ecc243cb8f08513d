"""The supervisor believes no peer blindly: malformed hello/heartbeat/metrics reports are
rejected with a log line (the run goes on), and a report for a node's label counts only
from the process the supervisor started for it, so nobody can spoof an actor's steps or
returns into --max-steps or --target-return."""

from __future__ import annotations

import os
import signal

import msgpack
import zmq

from zmqrl.bus import wire
from zmqrl.bus.endpoints import supervisor_address

from conftest import pid_of, read_csv, stop_process, wait_for, write_topology

SMALL = {"nodes": {"actor": {"replicas": 2, "args": {"envs": 4}}}}


def raw(msg_type: str, **fields) -> list[bytes]:
    """A header as a hostile peer would pack it (anything goes in the fields)."""
    return [msgpack.packb({"v": 1, "t": msg_type, **fields, "arrays": []}, use_bin_type=True)]


def test_bad_and_spoofed_reports_neither_crash_nor_stop_the_run(processes, tmp_path):
    topo = write_topology(tmp_path, **SMALL)
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), "--max-steps",
                           str(10**9), "--target-return", "400", log=log)
    wait_for(lambda: read_csv(run_dir / "metrics" / "learner.csv"), 60, "the learner's metrics")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(supervisor_address(run_dir))
    try:
        bad = [
            raw(wire.HELLO, label=7),
            raw(wire.METRICS, label="actor.0", row={}, episodes=["x"]),
            raw(wire.METRICS, label="actor.0", row={"env_steps": "many"}, episodes=[]),
            raw(wire.METRICS, label="actor.0", row=[1, 2], episodes=[]),
            raw(wire.METRICS, label={"a": 1}, row={}, episodes=[]),
            raw(wire.HEARTBEAT),
            # spoofing: a hello as actor.0 from a process the supervisor did not start,
            # then that actor's steps and returns enough to stop the run twice over
            raw(wire.HELLO, label="actor.0", kind="actor", node="actor", replica=0,
                incarnation="spoof", pid=os.getpid()),
            raw(wire.METRICS, label="actor.0", row={"env_steps": 10**12},
                episodes=[1000.0] * 200),
            raw(wire.METRICS, label="nobody", row={"env_steps": 10**12}, episodes=[]),
        ]
        for frames in bad:
            sock.send_multipart(frames)
        wait_for(lambda: log.read_text().count("supervisor: rejected report") >= len(bad), 20,
                 "every report to be rejected")
    finally:
        sock.close()
    # The run went on and still counts the real actors.
    steps = int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"])
    wait_for(lambda: int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"]) > steps,
             30, "the run's env steps to grow")
    assert proc.poll() is None, log.read_text()[-3000:]
    rows = read_csv(run_dir / "metrics" / "run.csv")
    assert int(rows[-1]["env_steps"]) < 10**9
    assert all(r["return_mean_100"] in ("nan", "") or float(r["return_mean_100"]) < 1000
               for r in rows)
    assert "reached" not in log.read_text()
    stop_process(proc)


def test_steps_of_actors_the_supervisor_did_not_start_count(processes, tmp_path):
    """A foreign actor (started by hand against the run's broker) drives --max-steps: the
    broker counts every connection it serves."""
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 1, "args": {"envs": 4}}})
    foreign_topo = write_topology(tmp_path, nodes={"actor": {"replicas": 2,
                                                             "args": {"envs": 4}}})
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), "--max-steps", "6000",
                           log=log)
    # Once our actor has reported steps, the supervisor counts actors' reports...
    wait_for(lambda: any(int(r["env_steps"]) > 0 for r in
                         read_csv(run_dir / "metrics" / "actor.csv")), 60,
             "our actor to report steps")
    ours = pid_of(run_dir, "actor")
    os.kill(ours, signal.SIGSTOP)  # from now on only the foreign actor steps
    try:
        processes.zmqrl("node", str(foreign_topo), "actor", "--replica", "1", "--run-dir",
                        str(run_dir), log=tmp_path / "foreign.log")
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        try:
            os.kill(ours, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert "--max-steps 6000 reached" in log.read_text()


def test_episodes_of_actors_the_supervisor_did_not_start_count(processes, tmp_path):
    """The run's return (--target-return) pools the episodes every connection of the
    broker finished, a foreign actor's included: remote actors report their episodes in
    their steps, and the broker, which sees every connection, reports them on."""
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 1, "args": {"envs": 4}}})
    foreign_topo = write_topology(tmp_path, nodes={"actor": {"replicas": 2,
                                                             "args": {"envs": 4}}})
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    # 100 episodes of random CartPole average ~22: any window of them passes 10.
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), "--target-return",
                           "10", log=log)

    def our_actor() -> int | None:
        try:
            return pid_of(run_dir, "actor")
        except LookupError:
            return None

    # Stopped as soon as it exists (it takes seconds to import and build its envs), so
    # the episodes that fill the window can only be the foreign actor's.
    ours = wait_for(our_actor, 60, "our actor's process")
    os.kill(ours, signal.SIGSTOP)
    try:
        processes.zmqrl("node", str(foreign_topo), "actor", "--replica", "1", "--run-dir",
                        str(run_dir), log=tmp_path / "foreign.log")
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        try:
            os.kill(ours, signal.SIGCONT)
        except ProcessLookupError:
            pass
    ours_csv = run_dir / "metrics" / "actor.csv"
    assert not ours_csv.exists() or all(int(r["episodes"]) < 100 for r in read_csv(ours_csv))
    assert "target return 10 reached" in log.read_text()
