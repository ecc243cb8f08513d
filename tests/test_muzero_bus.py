"""MuZero as real processes: topologies/muzero_reanalyse.yaml (muzero.yaml with a
reanalyse node added in YAML) learns CartPole while its broker and its reanalyse node
are killed under it. The search's queries cross the broker, positions the replay, the
learner trains; a killed broker costs the actors a search, a killed reanalyse node
nothing."""

from __future__ import annotations

import os
import signal

import pytest
import yaml

from conftest import REPO, pid_of, read_csv, wait_for


def test_reanalyse_topology_is_muzero_with_a_reanalyse_node():
    """muzero_reanalyse.yaml is muzero.yaml plus what reanalysing takes, so what is
    measured of one holds for the other's algorithm."""
    plain, re = (yaml.safe_load((REPO / "topologies" / f"{name}.yaml").read_text())
                 for name in ("muzero", "muzero_reanalyse"))
    assert re["algo"] == {**plain["algo"], "reanalyse": True}
    assert re["model"] == plain["model"] and re["env"] == plain["env"]
    assert re["nodes"].pop("reanalyse")["links"] == {"replay": "replay.sample",
                                                     "params": "learner.params"}
    assert re["nodes"]["replay"]["args"].pop("revisions_per_insert") > 0
    assert re["nodes"] == plain["nodes"]


def _rows(run_dir, label: str) -> list[dict[str, str]]:
    path = run_dir / "metrics" / f"{label}.csv"
    return read_csv(path) if path.exists() else []


def _last(run_dir, label: str, column: str) -> float:
    values = [r[column] for r in _rows(run_dir, label) if r.get(column) not in (None, "")]
    return float(values[-1]) if values else 0.0


# A smaller model than the topology's (64 wide, a 32-wide latent): with the topology's
# seed 1 it reached the bar in 45-58 s on two days; the 128-wide one took ~250 s to 100;
# over seeds the two learn alike (BENCHMARKS.md). With the kills below the test takes
# 1-2.5 minutes. Exclusive (tests/machine_share.py): its bound measures the agent, not
# the tests beside it.
SMALL_MODEL = ["--set", "model.hidden=64", "--set", "model.latent_size=32"]


@pytest.mark.exclusive
def test_muzero_learns_cartpole_through_a_broker_and_a_reanalyse_restart(processes,
                                                                          tmp_path):
    """The mean return of the last 20 episodes reaches 60, about three times random
    play's, although early in the run the broker is killed (the actors' next queries
    name latents the new broker does not hold: they search the move again from the
    roots) and then the reanalyse node (it keeps nothing: restarted, it revises on,
    and the replay lost no item)."""
    path = REPO / "topologies" / "muzero_reanalyse.yaml"
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("up", str(path), "--run-dir", str(run_dir), "--max-seconds", "240",
                           "--target-return", "60", "--target-window", "20", *SMALL_MODEL,
                           log=tmp_path / "up.log")

    def log() -> str:
        return (tmp_path / "up.log").read_text()[-4000:]

    wait_for(lambda: _last(run_dir, "replay", "revised") >= 16 or proc.poll() is not None,
             120, "the learner's parameters and a revision")
    assert proc.poll() is None, log()
    assert _last(run_dir, "broker", "evaluations") > 0, log()
    os.kill(pid_of(run_dir, "broker"), signal.SIGKILL)
    wait_for(lambda: _last(run_dir, "actor.0", "search_restarts") >= 1
             or proc.poll() is not None, 60, "an actor searching again from its roots")
    sims = _last(run_dir, "actor.0", "simulations")
    wait_for(lambda: _last(run_dir, "actor.0", "simulations") > sims + 500
             or proc.poll() is not None, 60, "simulations after the broker's restart")
    size, revised = _last(run_dir, "replay", "size"), _last(run_dir, "replay", "revised")
    os.kill(pid_of(run_dir, "reanalyse"), signal.SIGKILL)
    wait_for(lambda: _last(run_dir, "replay", "revised") > revised + 16
             or proc.poll() is not None, 60, "revisions from the restarted reanalyse node")
    assert _last(run_dir, "replay", "size") >= size  # nothing lost
    assert proc.wait(timeout=300) == 0, log()
    text = (tmp_path / "up.log").read_text()
    assert "target return 60 reached" in text, text[-3000:]
    assert text.count("reanalyse: up (incarnation") >= 2  # a new incarnation revised
    assert "searching the move again from its roots" in text
    for label in ("actor.0", "actor.1", "broker", "replay", "learner", "reanalyse"):
        assert _last(run_dir, label, "bad_messages") == 0, (label, log())
