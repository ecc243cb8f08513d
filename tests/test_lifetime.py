"""No node outlives whoever runs it, and one run directory holds one run: a killed or
hung-up supervisor takes every node with it, a node's exit takes its process group with
it, and a second run refuses a directory where any process of the first still lives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from zmqrl.bus import lifetime

from conftest import read_csv, stop_process, wait_for, write_topology

pytestmark = pytest.mark.minutes(1.1)  # tests/conftest.py: long modules first

SMALL = {"nodes": {"actor": {"replicas": 2, "args": {"envs": 4}}}}


def pids_in(run_dir: Path) -> list[int]:
    """Live processes whose command line names ``run_dir`` (supervisor and nodes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(run_dir) in cmdline and "zmqrl.cli" in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def all_nodes_up(run_dir: Path, labels: tuple[str, ...]) -> bool:
    return all((run_dir / "logs" / f"{label}.log").exists()
               and "up (incarnation" in (run_dir / "logs" / f"{label}.log").read_text()
               for label in labels)


def start_up(processes, tmp_path: Path, *args: str):
    topo = write_topology(tmp_path, **SMALL)
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), *args, log=log)
    wait_for(lambda: all_nodes_up(run_dir, ("learner", "broker", "actor.0", "actor.1")), 60,
             "every node to be up")
    return proc, run_dir, log, topo


def test_killed_supervisor_takes_every_node_with_it(processes, tmp_path):
    proc, run_dir, _, topo = start_up(processes, tmp_path)
    assert len(pids_in(run_dir)) == 5  # supervisor + 4 nodes
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not pids_in(run_dir), 10, "the orphaned nodes to exit")
    # and the directory is free again: the run resumes
    resumed = processes.zmqrl("up", "--resume", str(run_dir), "--max-seconds", "1",
                              log=tmp_path / "resume.log")
    assert resumed.wait(timeout=90) == 0, (tmp_path / "resume.log").read_text()[-2000:]


def test_hangup_stops_the_run_cleanly(processes, tmp_path):
    proc, run_dir, log, _ = start_up(processes, tmp_path)
    os.kill(proc.pid, signal.SIGHUP)  # the terminal `zmqrl up` ran in was closed
    assert proc.wait(timeout=20) == 0
    assert "stopped (SIGHUP received)" in log.read_text()
    assert pids_in(run_dir) == []


def test_a_second_run_is_refused_while_the_first_lives(processes, tmp_path):
    proc, run_dir, _, topo = start_up(processes, tmp_path)
    second = subprocess.run([sys.executable, "-m", "zmqrl.cli", "up", "--resume", str(run_dir)],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    assert "in use by a live run" in second.stderr and "supervisor (pid " in second.stderr
    assert proc.poll() is None
    stop_process(proc)
    assert pids_in(run_dir) == []


def test_a_run_is_refused_beside_a_leftover_node(processes, tmp_path):
    """An orphan of an earlier run (here: a learner started by hand) keeps its lock."""
    topo = write_topology(tmp_path, **SMALL)
    run_dir = tmp_path / "run"
    learner = processes.zmqrl("node", str(topo), "learner", "--run-dir", str(run_dir),
                              log=tmp_path / "learner.log")
    wait_for(lambda: "up (incarnation" in (tmp_path / "learner.log").read_text(), 60,
             "the learner to be up")
    up = subprocess.run([sys.executable, "-m", "zmqrl.cli", "up", str(topo), "--resume",
                         str(run_dir)], capture_output=True, text=True, timeout=60)
    assert up.returncode == 2, up.stderr
    assert f"learner (pid {learner.pid})" in up.stderr
    again = subprocess.run([sys.executable, "-m", "zmqrl.cli", "node", str(topo), "learner",
                            "--run-dir", str(run_dir)], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 1
    assert f"node learner already runs in {run_dir} (pid {learner.pid})" in again.stderr
    assert learner.poll() is None
    # SIGHUP stops a node cleanly, too
    os.killpg(learner.pid, signal.SIGHUP)
    assert learner.wait(timeout=20) == 0
    assert "SIGHUP received, stopping" in (tmp_path / "learner.log").read_text()


def test_a_node_exit_takes_its_process_group_with_it(processes, tmp_path):
    topo = write_topology(tmp_path, nodes={"actor": {
        "impl": "tests.nodes_for_lifetime:ForkingCrasher", "replicas": 1, "max_restarts": 1}})
    raw = yaml.safe_load(topo.read_text())
    raw["nodes"]["actor"].pop("kind")
    topo.write_text(yaml.safe_dump(raw))
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), log=log)
    pid_file = run_dir / "grandchild-actor.pid"
    first = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60,
                         "the first actor's grandchild"))
    # The actor crashed and is restarted; by then its grandchild must be gone.
    wait_for(lambda: "restart 1/1" in log.read_text(), 30, "the first restart")
    assert not alive(first), "the crashed node's grandchild outlived it"
    assert proc.wait(timeout=60) == 1  # the second crash fails the run
    second = int(pid_file.read_text())
    assert second != first and not alive(second)
    assert pids_in(run_dir) == []


def test_end_group_returns_once_no_process_of_the_group_runs():
    """What the supervisor calls after a node's exit: on return the group is gone, with no
    delay left to chance (SIGKILL is delivered asynchronously)."""
    leader = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & sleep 300 & wait"],
                              start_new_session=True)
    try:
        members = wait_for(lambda: [p for p in _group_members(leader.pid) if p != leader.pid]
                           if len(_group_members(leader.pid)) == 3 else None, 10,
                           "both sleeps to start")
        assert lifetime.end_group(leader.pid, timeout_s=10)
        assert not any(alive(pid) for pid in [leader.pid, *members])
        assert lifetime.end_group(leader.pid)  # an empty group is gone at once
    finally:
        lifetime.signal_group(leader.pid, signal.SIGKILL)
        leader.wait()


def _group_members(pgid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_sigterm_to_the_watchdog_stops_its_node(processes, tmp_path):
    topo = write_topology(tmp_path, **SMALL)
    run_dir, log = tmp_path / "run", tmp_path / "learner.log"
    watchdog = processes.zmqrl("node", str(topo), "learner", "--run-dir", str(run_dir),
                               "--watchdog", log=log)
    wait_for(lambda: "up (incarnation" in log.read_text(), 60, "the learner to be up")
    node = [p for p in pids_in(run_dir) if p != watchdog.pid]
    assert len(node) == 1
    os.kill(watchdog.pid, signal.SIGTERM)
    assert watchdog.wait(timeout=20) == 0
    assert not alive(node[0])
    assert "learner: stopped" in log.read_text()
    # A watchdog killed outright does not leave its node behind either.
    watchdog = processes.zmqrl("node", str(topo), "learner", "--run-dir", str(run_dir),
                               "--watchdog", log=log)
    wait_for(lambda: log.read_text().count("up (incarnation") == 1, 60, "the learner")
    node = wait_for(lambda: [p for p in pids_in(run_dir) if p != watchdog.pid], 10, "its pid")
    os.kill(watchdog.pid, signal.SIGKILL)
    watchdog.wait()
    started = time.monotonic()
    wait_for(lambda: not alive(node[0]), 10, "the node to exit with its watchdog")
    assert time.monotonic() - started < 10
    assert read_csv(run_dir / "metrics" / "learner.csv")
