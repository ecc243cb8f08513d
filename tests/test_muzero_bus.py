"""MuZero as real processes: the search's queries cross the broker, positions the replay,
the learner trains and learns; the broker killed mid-run costs the actors a search,
not the run."""

from __future__ import annotations

import os
import signal

import yaml

from conftest import REPO, pid_of, read_csv, wait_for


def _topology(tmp_path, name: str, **changes) -> str:
    raw = yaml.safe_load((REPO / "topologies" / name).read_text())
    for key, value in changes.items():
        section = raw
        *path, last = key.split(".")
        for part in path:
            section = section[part]
        section[last] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _rows(run_dir, label: str) -> list[dict[str, str]]:
    path = run_dir / "metrics" / f"{label}.csv"
    return read_csv(path) if path.exists() else []


def _last(run_dir, label: str, column: str) -> float:
    rows = [r for r in _rows(run_dir, label) if r.get(column)]
    return float(rows[-1][column]) if rows else 0.0


def test_minatar_queries_cross_the_broker_and_survive_its_restart_and_reanalyse_s(
        processes, tmp_path):
    """muzero_minatar.yaml, scaled down, with a reanalyse node added in YAML: uint8 pixels
    go to the broker as root queries, positions reach the replay, the learner updates
    and the reanalyse node revises stored targets. Then the broker is killed: the
    actors' next queries name latents the new broker does not hold, so they search the
    move again from the roots, and acting and learning go on. Then the reanalyse node
    is killed: restarted, it revises on, and the replay lost no item."""
    path = _topology(tmp_path, "muzero_minatar.yaml", **{
        "algo.num_simulations": 4, "algo.batch_size": 32, "algo.reanalyse": True,
        "nodes.replay.args.min_size": 100, "nodes.actor.replicas": 1,
        "nodes.actor.args": {"envs": 16, "lanes": 2, "max_insert_positions": 64},
        "nodes.reanalyse": {"kind": "reanalyse", "args": {"batch_size": 8},
                            "links": {"replay": "replay.sample",
                                      "params": "learner.params"}}})
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("up", path, "--run-dir", str(run_dir), "--max-seconds", "200",
                           log=tmp_path / "up.log")

    def log() -> str:
        return (tmp_path / "up.log").read_text()[-4000:]

    wait_for(lambda: _last(run_dir, "replay", "revised") >= 16 or proc.poll() is not None,
             120, "three learner updates and a revision")
    assert proc.poll() is None, log()
    assert _last(run_dir, "broker", "evaluations") > 0 and \
        _last(run_dir, "learner", "updates") >= 1, log()
    os.kill(pid_of(run_dir, "broker"), signal.SIGKILL)
    wait_for(lambda: _last(run_dir, "actor", "search_restarts") >= 1, 40,
             "the actor searching again from its roots")
    sims, updates = _last(run_dir, "actor", "simulations"), _last(run_dir, "learner", "updates")
    wait_for(lambda: _last(run_dir, "actor", "simulations") > sims + 500
             and _last(run_dir, "learner", "updates") > updates, 40,
             "simulations and updates after the broker's restart")
    size, revised = _last(run_dir, "replay", "size"), _last(run_dir, "replay", "revised")
    os.kill(pid_of(run_dir, "reanalyse"), signal.SIGKILL)
    wait_for(lambda: _last(run_dir, "replay", "revised") > revised + 16, 60,
             "revisions from the restarted reanalyse node")
    # a new incarnation did it
    assert (tmp_path / "up.log").read_text().count("reanalyse: up (incarnation") >= 2, log()
    assert _last(run_dir, "replay", "size") >= size  # nothing lost
    for label in ("actor", "broker", "replay", "learner", "reanalyse"):
        assert _last(run_dir, label, "bad_messages") == 0, (label, log())
    assert proc.poll() is None, log()


def test_muzero_learns_cartpole(processes, tmp_path):
    """topologies/muzero.yaml as it is: the mean return of the last 20 episodes reaches
    60, about three times random play's (BENCHMARKS.md: ~110 s on a quiet machine; 250
    at 5 minutes)."""
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("up", str(REPO / "topologies" / "muzero.yaml"), "--run-dir",
                           str(run_dir), "--max-seconds", "270", "--target-return", "60",
                           "--target-window", "20", log=tmp_path / "up.log")
    assert proc.wait(timeout=330) == 0, (tmp_path / "up.log").read_text()[-3000:]
    text = (tmp_path / "up.log").read_text()
    assert "target return 60 reached" in text, text[-3000:]
