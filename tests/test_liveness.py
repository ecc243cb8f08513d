"""Failures that must cost a run only seconds, done for real to a running `zmqrl up`:
a node killed with SIGKILL, a node frozen with SIGSTOP (silent but alive), and a
learner paused for 30 s while everything else keeps running in bounded memory."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import pid_of, read_csv, stop_process, wait_for, write_topology

pytestmark = pytest.mark.minutes(1.7)  # tests/conftest.py: long modules first

# Peers declare a silent link peer dead after 2 s here (default 5 s), so the tests wait
# less; the supervisor uses the same timeout for its own "silent" report.
FAST_LIVENESS = {"network": {"heartbeat_s": 0.5, "peer_timeout_s": 2.0},
                 "nodes": {"actor": {"replicas": 2, "args": {"envs": 4}}}}


def last(run_dir: Path, label: str, column: str) -> int:
    rows = read_csv(run_dir / "metrics" / f"{label}.csv")
    return int(float(rows[-1][column])) if rows and rows[-1].get(column) else 0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError(pid)


def start(processes, tmp_path: Path, **overrides) -> tuple:
    topo = write_topology(tmp_path, **{**FAST_LIVENESS, **overrides})
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), log=log)
    wait_for(lambda: last(run_dir, "learner", "updates") > 5, 60, "the learner to update")
    return proc, run_dir, log


def test_killed_actor_is_back_within_10s_and_the_learner_never_stops(processes, tmp_path):
    proc, run_dir, log = start(processes, tmp_path)
    os.kill(pid_of(run_dir, "actor", 0), signal.SIGKILL)
    killed_at = time.monotonic()
    updates_at_kill = last(run_dir, "learner", "updates")
    # The other actor keeps the learner busy while actor.0 is down.
    wait_for(lambda: last(run_dir, "learner", "updates") > updates_at_kill, 10,
             "the learner to keep updating")
    actor_log = run_dir / "logs" / "actor.0.log"
    wait_for(lambda: actor_log.read_text().count("up (incarnation") == 2, 10,
             "actor.0 to be restarted")
    rows_before = len(read_csv(run_dir / "metrics" / "actor.0.csv"))

    def new_actor_stepping() -> bool:
        rows = read_csv(run_dir / "metrics" / "actor.0.csv")
        return len(rows) > rows_before and int(rows[-1]["env_steps"]) > 0

    wait_for(new_actor_stepping, max(0.5, 10 - (time.monotonic() - killed_at)),
             "the restarted actor's experience to flow within 10 s of the kill")
    assert "actor.0 exited with -9; restart 1/" in log.read_text()
    stop_process(proc)


def test_killed_broker_restarts_and_actors_resend(processes, tmp_path):
    proc, run_dir, log = start(processes, tmp_path)
    os.kill(pid_of(run_dir, "broker"), signal.SIGKILL)
    broker_log = run_dir / "logs" / "broker.log"
    wait_for(lambda: broker_log.read_text().count("up (incarnation") == 2, 20,
             "the broker to be restarted")
    updates = last(run_dir, "learner", "updates")
    # Actors noticed the silence (pings unanswered), reconnected and resent; the new
    # broker serves them and its unrolls reach the learner again.
    wait_for(lambda: last(run_dir, "learner", "updates") > updates + 5, 40,
             "the learner to update from the restarted broker")
    actor_log = (run_dir / "logs" / "actor.0.log").read_text()
    assert "peer on 'policy' silent" in actor_log or "reconnecting and resending" in actor_log
    assert proc.poll() is None
    stop_process(proc)


def test_frozen_broker_is_declared_dead_by_peers_and_supervisor(processes, tmp_path):
    proc, run_dir, log = start(processes, tmp_path)
    broker = pid_of(run_dir, "broker")
    os.kill(broker, signal.SIGSTOP)
    try:
        actor_log = run_dir / "logs" / "actor.0.log"
        wait_for(lambda: "peer on 'policy' silent" in actor_log.read_text(), 10,
                 "actor.0 to declare the broker dead")
        wait_for(lambda: "supervisor: broker silent for" in log.read_text(), 10,
                 "the supervisor to report the broker silent")
    finally:
        os.kill(broker, signal.SIGCONT)
    updates = last(run_dir, "learner", "updates")
    wait_for(lambda: last(run_dir, "learner", "updates") > updates + 5, 30,
             "the run to continue once the broker answers again")
    wait_for(lambda: "supervisor: broker is back after" in log.read_text(), 10,
             "the supervisor to see the broker back")
    assert "answers again" in (run_dir / "logs" / "actor.0.log").read_text()
    stop_process(proc)


def test_paused_learner_holds_every_producer_at_its_credit(processes, tmp_path):
    """A learner frozen for longer than any timer: the broker sends nothing beyond its
    credit (it was once re-granted every 5 s), the actors stop stepping, memory stays flat."""
    proc, run_dir, log = start(processes, tmp_path)
    learner = pid_of(run_dir, "learner")
    others = {"broker": pid_of(run_dir, "broker"), "actor.0": pid_of(run_dir, "actor", 0),
              "actor.1": pid_of(run_dir, "actor", 1)}
    broker_csv = run_dir / "metrics" / "broker.csv"
    os.kill(learner, signal.SIGSTOP)
    try:
        baseline = {label: rss_kib(pid) for label, pid in others.items()}
        peak = dict(baseline)

        def held() -> dict | None:
            """The broker's row once its outbox is full and two rows show no step."""
            rows = read_csv(broker_csv)
            if len(rows) >= 2 and int(rows[-1]["outbox"]) >= 2 and \
                    rows[-1]["env_steps"] == rows[-2]["env_steps"]:
                return rows[-1]
            return None

        frozen = wait_for(held, 20, "the broker to hold (outbox full, no steps)")
        deadline = time.monotonic() + 12  # over twice the old 5 s credit timer
        while time.monotonic() < deadline:
            for label, pid in others.items():
                peak[label] = max(peak[label], rss_kib(pid))
            time.sleep(0.5)
        still = read_csv(broker_csv)[-1]
    finally:
        os.kill(learner, signal.SIGCONT)
    assert float(still["time_s"]) - float(frozen["time_s"]) >= 10
    # Credit: not one unroll sent while the learner could not consume, not one env step.
    assert still["env_steps"] == frozen["env_steps"], "the actors kept stepping"
    assert still["experience_sent"] == frozen["experience_sent"], (frozen, still)
    assert int(still["outbox"]) <= 2  # max_outbox: what waits is bounded too
    # 32 MiB leaves room for allocator noise; a queue of unrolls would pass it in seconds.
    for label in others:
        assert peak[label] - baseline[label] < 32 * 1024, (label, baseline, peak)
    assert last(run_dir, "broker", "backpressure_pauses") >= 1
    updates = last(run_dir, "learner", "updates")
    wait_for(lambda: last(run_dir, "learner", "updates") > updates + 5, 30,
             "the run to recover after SIGCONT")
    assert "recounting credit" not in (run_dir / "logs" / "broker.log").read_text()
    assert proc.poll() is None
    stop_process(proc)


def test_killed_learner_comes_back_and_the_broker_recovers_credit_and_params(
        processes, tmp_path):
    """The real broker, not a test playing it: its credit, lost with the learner's
    queue, is recounted once the new learner answers, and it takes the new learner's
    parameters (it resubscribes; the learner publishes on each new subscription)."""
    proc, run_dir, log = start(processes, tmp_path)
    os.kill(pid_of(run_dir, "learner"), signal.SIGKILL)
    learner_log = run_dir / "logs" / "learner.log"
    wait_for(lambda: learner_log.read_text().count("up (incarnation") == 2, 30,
             "the learner to be restarted")
    assert "learner exited with -9; restart 1/" in log.read_text()
    broker_log = run_dir / "logs" / "broker.log"
    wait_for(lambda: "consumer learner restarted" in broker_log.read_text(), 20,
             "the broker to see the learner's new incarnation")
    rows_before = len(read_csv(run_dir / "metrics" / "learner.csv"))

    def trains_on() -> bool:
        rows = read_csv(run_dir / "metrics" / "learner.csv")[rows_before:]
        return len(rows) >= 2 and int(rows[-1]["updates"]) >= int(rows[0]["updates"]) + 5

    wait_for(trains_on, 40, "the restarted learner to train on the broker's unrolls")
    learner_now = last(run_dir, "learner", "updates")
    wait_for(lambda: 1 <= last(run_dir, "broker", "param_version") <= learner_now + 10, 20,
             "the broker to act with the new learner's parameters")
    assert proc.poll() is None
    stop_process(proc)
