"""`zmqrl up` as a user runs it: real node processes, real sockets, real envs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, read_csv, stop_process, wait_for, write_topology

pytestmark = pytest.mark.minutes(2)  # tests/conftest.py: long modules first

SMALL = {"nodes": {"actor": {"replicas": 2, "args": {"envs": 4}}}}


def pids_with(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (our run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and "zmqrl.cli" in cmdline:
            found.append(int(entry.name))
    return found


def learner_rows(run_dir: Path) -> list[dict[str, str]]:
    return read_csv(run_dir / "metrics" / "learner.csv")


def start_up(processes, tmp_path: Path, *args: str, **overrides):
    topo = write_topology(tmp_path, **(overrides or SMALL))
    run_dir = tmp_path / "run"
    log = tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), *args, log=log)
    return proc, run_dir, log


def test_up_stops_by_itself_and_fills_the_run_directory(processes, tmp_path):
    proc, run_dir, log = start_up(processes, tmp_path, "--max-steps", "30000")
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    out = log.read_text()
    assert "--max-steps 30000 reached" in out
    # every node's lines, prefixed with its name
    for label in ("learner", "broker", "actor.0", "actor.1"):
        assert f" {label.ljust(7)} | INFO {label}: up (incarnation" in out, label
        assert (run_dir / "logs" / f"{label}.log").exists()
    resolved = yaml.safe_load((run_dir / "topology.yaml").read_text())
    assert resolved["nodes"]["actor"]["replicas"] == 2
    rows = learner_rows(run_dir)
    assert rows and int(rows[-1]["env_steps"]) > 0 and int(rows[-1]["updates"]) > 0
    for column in ("return_mean_20", "return_mean_100", "policy_lag", "loss_policy",
                   "steps_per_s", "experience_msgs_per_s", "experience_bytes_per_s"):
        assert column in rows[-1], column
    assert (run_dir / "checkpoints" / "learner.pt").exists()
    assert pids_with(str(run_dir)) == []


def test_sigterm_stops_everything_within_seconds(processes, tmp_path):
    proc, run_dir, log = start_up(processes, tmp_path)
    wait_for(lambda: any(int(r["updates"]) > 0 for r in learner_rows(run_dir)), 60,
             "the learner to make updates")
    assert len(pids_with(str(run_dir))) == 5  # supervisor + 4 nodes
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert time.monotonic() - started < 8
    assert pids_with(str(run_dir)) == []
    assert "stopped (SIGTERM received)" in log.read_text()


def test_killed_actor_is_restarted_and_experience_flows_again(processes, tmp_path):
    proc, run_dir, log = start_up(processes, tmp_path)
    wait_for(lambda: any(int(r["updates"]) > 0 for r in learner_rows(run_dir)), 60,
             "the learner to make updates")
    actor = wait_for(lambda: [p for p in pids_with(str(run_dir))
                              if b" actor --replica 0 " in Path(f"/proc/{p}/cmdline")
                              .read_bytes().replace(b"\0", b" ")], 10, "actor.0's pid")[0]
    os.kill(actor, signal.SIGKILL)
    actor_log = run_dir / "logs" / "actor.0.log"
    actor_csv = run_dir / "metrics" / "actor.0.csv"
    wait_for(lambda: actor_log.read_text().count("up (incarnation") == 2, 30,
             "actor.0 to come back")
    assert "actor.0 exited with -9; restart 1/" in log.read_text()
    def last(node: str) -> int:
        rows = read_csv(run_dir / "metrics" / f"{node}.csv")
        return int(rows[-1]["env_steps"]) if rows else 0

    broker_before, actor_rows_before = last("broker"), len(read_csv(actor_csv))
    wait_for(lambda: len(read_csv(actor_csv)) > actor_rows_before and last("actor.0") > 0
             and last("broker") > broker_before, 20, "the new actor's experience to flow")
    assert proc.poll() is None
    stop_process(proc)


def test_node_that_keeps_failing_fails_the_run(processes, tmp_path):
    crashing = {"kind": None, "impl": "tests.nodes_for_tests:CrashingActor", "max_restarts": 1}
    topo = write_topology(tmp_path, nodes={"actor": crashing})
    raw = yaml.safe_load(topo.read_text())
    raw["nodes"]["actor"].pop("kind")
    topo.write_text(yaml.safe_dump(raw))
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), log=log)
    assert proc.wait(timeout=90) == 1
    out = log.read_text()
    assert "RuntimeError: crashing on purpose" in out
    assert "restart 1/1" in out
    assert "actor.0 failed for good" in out or "actor.1 failed for good" in out
    assert pids_with(str(run_dir)) == []


def test_up_rejects_a_bad_topology_before_starting_anything(tmp_path):
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 0}})
    result = subprocess.run([sys.executable, "-m", "zmqrl.cli", "up", str(topo)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert f"error: {topo}: node 'actor', field 'replicas'" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_repository_procfile_matches_the_seed_topology():
    result = subprocess.run([sys.executable, "-m", "zmqrl.cli", "procfile",
                             "topologies/seed.yaml"], capture_output=True, text=True,
                            cwd=REPO, timeout=60, check=True)
    assert (REPO / "Procfile").read_text() == result.stdout


@pytest.mark.skipif(not Path(sys.executable).with_name("honcho").exists(),
                    reason="honcho is not installed (pip install -e '.[dev]')")
def test_honcho_runs_the_procfile_and_experience_reaches_the_learner(processes, tmp_path):
    app = tmp_path / "app"
    (app / "topologies").mkdir(parents=True)
    (app / "topologies" / "seed.yaml").write_text((REPO / "topologies" / "seed.yaml").read_text())
    (app / "Procfile").write_text((REPO / "Procfile").read_text())
    bin_dir = str(Path(sys.executable).parent)
    honcho = processes.start([str(Path(bin_dir) / "honcho"), "start"], cwd=app,
                             log=tmp_path / "honcho.log",
                             env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    run_dir = app / "runs" / "seed-cartpole"
    wait_for(lambda: any(int(r["env_steps"]) > 0 and int(r["updates"]) > 0
                         for r in learner_rows(run_dir)), 90,
             "experience to reach the learner under honcho")
    assert honcho.poll() is None
    stop_process(honcho)


def test_pipelined_lanes_are_separate_connections(processes, tmp_path):
    """An actor with lanes: 2 keeps two requests in flight; the broker sees two actors."""
    proc, run_dir, log = start_up(
        processes, tmp_path, "--max-seconds", "60",
        nodes={"actor": {"replicas": 1, "args": {"envs": 8, "lanes": 2}}},
    )
    wait_for(lambda: any(int(r["updates"]) > 0 for r in learner_rows(run_dir)), 60,
             "the learner to make updates")
    broker = wait_for(lambda: [r for r in read_csv(run_dir / "metrics" / "broker.csv")
                               if r["actors"] == "2"], 10, "two connections at the broker")
    assert int(broker[-1]["env_steps"]) > 0
    stop_process(proc)


def _procfile_node_pids(app: Path, node: str, replica: int) -> tuple[list[int], list[int]]:
    """(watchdogs, node processes) that honcho started in ``app`` for one Procfile line:
    the node process is the innermost one running the line's node (without a watchdog,
    the only one)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(entry / "cwd")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if cwd == str(app) and f" node topologies/seed.yaml {node} --replica {replica} " \
                in cmdline and not cmdline.startswith("/bin/sh"):
            parents[int(entry.name)] = ppid
    nodes = [pid for pid in parents if pid not in parents.values()]
    return [pid for pid in parents if pid not in nodes], nodes


@pytest.mark.skipif(not Path(sys.executable).with_name("honcho").exists(),
                    reason="honcho is not installed (pip install -e '.[dev]')")
def test_honcho_run_survives_a_node_killed_with_sigkill(processes, tmp_path):
    """A segfaulting simulator or the OOM killer, as a new user would try it: `kill -9`
    of the actor_0 node process. Its watchdog restarts it; honcho stops nothing."""
    app = tmp_path / "app"
    (app / "topologies").mkdir(parents=True)
    (app / "topologies" / "seed.yaml").write_text((REPO / "topologies" / "seed.yaml").read_text())
    (app / "Procfile").write_text((REPO / "Procfile").read_text())
    bin_dir = str(Path(sys.executable).parent)
    honcho_log = tmp_path / "honcho.log"
    honcho = processes.start([str(Path(bin_dir) / "honcho"), "start"], cwd=app, log=honcho_log,
                             env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    run_dir = app / "runs" / "seed-cartpole"
    wait_for(lambda: any(int(r["updates"]) > 0 for r in learner_rows(run_dir)), 90,
             "experience to reach the learner under honcho")
    _, actor = wait_for(lambda: _procfile_node_pids(app, "actor", 0)[1] and
                        _procfile_node_pids(app, "actor", 0), 10, "actor_0's node process")
    others = {n: _procfile_node_pids(app, n, r)[1] for n, r in
              (("learner", 0), ("broker", 0), ("actor", 1))}
    assert all(len(pids) == 1 for pids in others.values()), others
    os.kill(actor[0], signal.SIGKILL)
    wait_for(lambda: honcho_log.read_text().count("INFO actor.0: up (incarnation") == 2, 30,
             "actor_0's watchdog to restart it")
    assert "node exited with -9; restart 1/" in honcho_log.read_text()
    updates = int(learner_rows(run_dir)[-1]["updates"])
    wait_for(lambda: int(learner_rows(run_dir)[-1]["updates"]) > updates + 3, 60,
             "the learner to keep training")
    assert honcho.poll() is None, honcho_log.read_text()[-3000:]
    for node, pids in others.items():  # nobody else was stopped or restarted
        assert Path(f"/proc/{pids[0]}").exists(), node
    assert "sending SIGTERM" not in honcho_log.read_text()
    stop_process(honcho)
