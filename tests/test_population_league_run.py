"""Capture the Flag's recipe as real processes (topologies/population_league.yaml on
tic-tac-toe, two members): the members play each other through one broker, the league
rates every game, PBT ranks by rating — and the run loses no ratings, lineage or member
state when any of its nodes is killed: a member's learner, the broker, the league, the
PBT controller, one after the other, each restarted by the supervisor from its
checkpoint while the others go on."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("pyspiel")

from conftest import REPO, pid_of, read_csv, wait_for  # noqa: E402


def _last(run_dir: Path, label: str, column: str) -> float:
    path = run_dir / "metrics" / f"{label}.csv"
    values = [r[column] for r in read_csv(path) if r.get(column) not in (None, "")] \
        if path.exists() else []
    return float(values[-1]) if values else 0.0


def _checkpoint(run_dir: Path, name: str) -> Path:
    return run_dir / "checkpoints" / name


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_the_population_survives_losing_any_node(processes, tmp_path):
    raw = yaml.safe_load((REPO / "topologies" / "population_league.yaml").read_text())
    raw["env"]["id"] = "zmqrl/OpenSpiel-tic_tac_toe-v0"
    raw["model"]["hidden"] = [64, 64]
    raw["algo"].update(unroll=8, batch_size=16)
    raw["population"].update(size=2, ready_after_steps=3000)
    nodes = raw["nodes"]
    nodes["actor"].update(replicas=1, args={"envs": 16})
    nodes["broker"]["args"].update(snapshot_every=5, checkpoint_every_s=2.0)
    nodes["league"]["args"] = {"checkpoint_every_s": 1.0}
    nodes["learner"]["args"]["checkpoint_every"] = 5
    path = tmp_path / "population.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir, up_log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(path), "--run-dir", str(run_dir), "--max-seconds", "400",
                           log=up_log)

    def log() -> str:
        return up_log.read_text()[-5000:]

    def running(predicate):
        """``predicate``, failing at once (with the run's log) if the run has ended."""
        def check():
            assert proc.poll() is None, f"the run ended early:\n{log()}"
            return predicate()
        return check

    league_ckpt = _checkpoint(run_dir, "league.json")
    # Members play each other; the league rates the games; snapshots join.
    wait_for(running(lambda: _json(league_ckpt).get("ratings", {}).get("games", 0) >= 300
                     and _checkpoint(run_dir, "broker.roster.pt").exists()
                     and _checkpoint(run_dir, "learner_m1.pt").exists()),
             180, "300 rated games, a roster and a member's checkpoint")
    assert proc.poll() is None, log()
    players = _json(league_ckpt)["ratings"]["players"]
    assert {"m0", "m1"} <= set(players) and any("@" in p for p in players), players

    # 1. A member's learner: it comes back from its checkpoint, not from scratch.
    saved = torch.load(_checkpoint(run_dir, "learner_m1.pt"), weights_only=True)["updates"]
    os.kill(pid_of(run_dir, "learner_m1"), signal.SIGKILL)
    wait_for(running(lambda: log().count("learner_m1: up (incarnation") >= 2
                     and _last(run_dir, "learner_m1", "updates") > saved),
             90, "learner_m1 back, updating on from its checkpoint")
    assert f"at update {saved}" in (run_dir / "logs" / "learner_m1.log").read_text() \
        or "resumed from" in (run_dir / "logs" / "learner_m1.log").read_text()

    # the broker recounts member 1's credit with the restarted learner (a new incarnation)
    wait_for(running(lambda: _last(run_dir, "broker", "experience_1_recounts") >= 1), 30,
             "the broker recounting member 1's credit")

    # 2. The broker: it plays its saved snapshots again, and games go on being rated.
    snapshots = _last(run_dir, "broker", "snapshots")
    os.kill(pid_of(run_dir, "broker"), signal.SIGKILL)
    rated = _json(league_ckpt)["ratings"]["games"]
    wait_for(running(lambda: "resumed the roster" in
                     (run_dir / "logs" / "broker.log").read_text()
                     and _json(league_ckpt).get("ratings", {}).get("games", 0) > rated + 100),
             90, "the broker back with its roster, its games rated")
    resumed = re.findall(r"resumed the roster: (.*)", (run_dir / "logs" / "broker.log").read_text())
    assert snapshots >= 1 and resumed and "@v" in resumed[-1], resumed  # not "no snapshots"

    # the broker hears the league on its games link (its liveness pings are answered)
    assert "peer on 'games' silent" not in (run_dir / "logs" / "broker.log").read_text()

    # 3. The league: every rating it had checkpointed comes back, and it rates on.
    before = _json(league_ckpt)["ratings"]
    os.kill(pid_of(run_dir, "league"), signal.SIGKILL)
    wait_for(running(lambda: log().count("league: up (incarnation") >= 2), 60, "the league back")
    wait_for(running(lambda: _json(league_ckpt).get("ratings", {}).get("games", 0)
                     > before["games"] + 100), 90, "games rated after the league's restart")
    after = _json(league_ckpt)["ratings"]
    assert set(before["players"]) & {"m0", "m1"} <= set(after["players"])
    # it came back with what it had checkpointed (or a later checkpoint), not from zero
    resumed = re.findall(r"resumed: \d+ players, (\d+) games rated",
                         (run_dir / "logs" / "league.log").read_text())
    assert resumed and int(resumed[-1]) >= before["games"], resumed
    assert all(after["players"][p]["games"] >= before["players"][p]["games"]
               for p in ("m0", "m1"))

    # 4. The PBT controller: its members, ratings and lineage survive.
    wait_for(running(lambda: _checkpoint(run_dir, "pbt.json").exists()), 30, "pbt checkpoint")
    members = _json(_checkpoint(run_dir, "pbt.json"))["members"]
    lineage = run_dir / "pbt" / "lineage.jsonl"
    exploits = lineage.read_text().count("\n") if lineage.exists() else 0
    os.kill(pid_of(run_dir, "pbt"), signal.SIGKILL)
    wait_for(running(lambda: log().count("pbt: up (incarnation") >= 2), 60, "pbt back")
    wait_for(running(lambda: "resumed" in (run_dir / "logs" / "pbt.log").read_text()), 30,
             "pbt resumed from its checkpoint")
    resumed = re.findall(r"resumed: (\d+) members, (\d+) exploits",
                         (run_dir / "logs" / "pbt.log").read_text())
    assert resumed and int(resumed[-1][0]) >= len(members), resumed
    assert set(_json(_checkpoint(run_dir, "pbt.json"))["members"]) >= set(members)
    assert (lineage.read_text().count("\n") if lineage.exists() else 0) >= exploits

    # The run goes on: both members keep training, the league keeps rating, and nobody
    # refused a message.
    updates = [_last(run_dir, f"learner_m{k}", "updates") for k in (0, 1)]
    games = _last(run_dir, "league", "games_rated")
    wait_for(running(lambda: all(_last(run_dir, f"learner_m{k}", "updates") > updates[k]
                                 for k in (0, 1))
                     and _last(run_dir, "league", "games_rated") > games + 100),
             90, "both members training and games rated after every restart")
    assert proc.poll() is None, log()
    rows = read_csv(run_dir / "metrics" / "pbt.csv")
    assert any(r.get("best_rating") for r in rows), "pbt never heard the league's ratings"
    for label in ("broker", "league", "pbt", "learner_m0", "learner_m1", "actor"):
        assert _last(run_dir, label, "bad_messages") == 0, (label, log())

