"""The population league (nodes/population_league.py) as a real process: games sent to
its ``games`` port move the Elo it publishes on ``ratings``; a snapshot starts at its
member's rating and is forgotten when idle; a malformed message is refused whole; the
ratings survive a SIGKILL (from the last checkpoint) and a SIGTERM (saved at exit); and
the topology loader refuses bad knobs, naming them."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zmq

from nodes.population_league import MAX_GAMES
from zmqrl.bus import messages, wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.parts.selfplay.ratings import Ratings
from zmqrl.run.population import population_size
from zmqrl.run.topology import TopologyError, from_dict, load

from conftest import Client, read_csv, wait_for

NODE = "league"
FAST = {"publish_every_s": 0.2, "history_every_s": 0.3, "checkpoint_every_s": 0.3}
TOPOLOGY: dict[str, Any] = {
    "name": "population-league-test",
    "seed": 1,
    "env": {"id": "zmqrl/OpenSpiel-tic_tac_toe-v0", "kwargs": {"opponent": "self"}},
    "model": {"kind": "board_mlp", "hidden": [16]},
    "algo": {"kind": "vtrace", "unroll": 8, "batch_size": 32},
    # (a league in a population topology counts its size; alone it is told K)
    "nodes": {NODE: {"kind": "population_league", "args": {"members": 2}}},
}
Game = tuple[str, str, float]  # seat 0, seat 1, seat 0's score


def topology(tmp_path: Path, **args: Any) -> Path:
    raw = copy.deepcopy(TOPOLOGY)
    raw["nodes"][NODE]["args"] = {**FAST, "members": 2, **args}
    path = tmp_path / f"topology-{len(list(tmp_path.glob('topology-*')))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


class League:
    """One league process, with a DEALER on its ``games`` and a SUB on its ``ratings``."""

    def __init__(self, processes, path: Path, run_dir: Path, log: Path):
        self.proc: subprocess.Popen = processes.zmqrl(
            "node", str(path), NODE, "--run-dir", str(run_dir), log=log)
        endpoints = Endpoints(load(path, node=NODE), run_dir)
        self.games = Client(endpoints.bind_address(NODE, "games", 0))
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoints.bind_address(NODE, "ratings", 0))
        self.log = log
        assert self.games.request(wire.encode(wire.PING), timeout=60).type == wire.PONG
        self._seq = 0

    def send(self, games: list[Game], players: list | None = None) -> str:
        return self.send_raw(games_message(games, players))

    def send_raw(self, frames: list) -> str:
        """Send ``frames``, then a ping: 'ok' if only the pong comes back, else the
        error's text (a games message is not answered)."""
        self._seq += 1
        self.games.send(frames)
        self.games.send(wire.encode(wire.PING, seq=self._seq))
        answer = "ok"
        while True:
            reply = self.games.recv(20)
            if reply.type == wire.ERROR:
                answer = reply.fields["error"]
            elif reply.type == wire.PONG and reply.fields.get("seq") == self._seq:
                return answer

    def ratings(self, until: Callable[[wire.Message], bool] = lambda m: True,
                timeout: float = 20.0) -> wire.Message:
        """The next published ratings that satisfy ``until``."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.sub.poll(int(left * 1000) + 1):
                break
            msg = wire.decode(self.sub.recv_multipart())
            messages.check(msg, messages.spec(wire.RATINGS), messages.Context())
            if until(msg):
                return msg
        raise AssertionError(f"no such ratings published within {timeout:.0f}s")

    def games_rated(self, n: int) -> wire.Message:
        return self.ratings(lambda m: m.fields["games"] == n)

    def close(self) -> None:
        self.games.close()
        self.sub.close()


def games_message(games: list[Game], players: list | None = None) -> list:
    """``games`` as one ``games`` message; ``players`` (the index table) defaults to
    every name in order of appearance."""
    if players is None:
        players = list(dict.fromkeys(name for a, b, _ in games for name in (a, b)))
    index = {name: i for i, name in enumerate(players)}
    return wire.encode(wire.GAMES, {
        "first": np.array([index[a] for a, _, _ in games], np.int32),
        "second": np.array([index[b] for _, b, _ in games], np.int32),
        "score": np.array([s for _, _, s in games], np.float32)},
        players=players, source="test-broker")


def raw_games(players: list, first: list, second: list, score: list) -> list:
    return wire.encode(wire.GAMES, {"first": np.array(first, np.int32),
                                    "second": np.array(second, np.int32),
                                    "score": np.array(score, np.float32)}, players=players)


def beats(a: str, b: str, n: int, start: int = 0) -> list[Game]:
    """``n`` games of ``a`` against ``b``, seats alternating: ``a`` wins 4 of every 5."""
    out = []
    for i in range(start, start + n):
        a_score = 0.0 if i % 5 == 4 else 1.0
        out.append((a, b, a_score) if i % 2 == 0 else (b, a, 1.0 - a_score))
    return out


def expected(games: list[Game], ratings: Ratings | None = None) -> Ratings:
    """What the league should hold after ``games``: its rules, replayed here."""
    r = ratings or Ratings()
    for a, b, score in games:
        for name in (a, b):
            if name not in r.players:
                member, at, _ = name.partition("@")
                start = r.rating(member) if at and member in r.players else None
                r.add(name, start, frozen=bool(at))
        r.update(a, b, score)
    return r


def test_games_move_the_published_ratings(processes, tmp_path):
    """200 games where m0 beats m1 80 % of the time: m0 ends ~240 Elo above m1 (odds
    of 4), exactly as the ratings replayed here; the metrics and the history say so too."""
    run_dir = tmp_path / "run"
    league = League(processes, topology(tmp_path), run_dir, tmp_path / "league.log")
    start = league.ratings()  # published at once to a new subscriber
    assert start.fields["games"] == 0 and start.fields["ratings"] == {}
    games = beats("m0", "m1", 200)
    for i in range(0, 200, 50):  # the index table's order differs between messages
        players = ["m1", "m0"] if i % 100 else None
        assert league.send(games[i:i + 50], players) == "ok"
    msg = league.games_rated(200)
    ratings = msg.fields["ratings"]
    assert 150 <= ratings["m0"] - ratings["m1"] <= 350, ratings
    assert ratings == expected(games).table()
    assert msg.fields["source"] and msg.fields["source"] != "test-broker"

    def metrics_row() -> dict | None:
        rows = read_csv(run_dir / "metrics" / f"{NODE}.csv")
        return next((r for r in reversed(rows) if r.get("games_rated") == "200"), None)

    row = wait_for(metrics_row, 10, "a metrics row with 200 games rated")
    assert row["players"] == "2"
    assert float(row["population/elo_m0"]) == ratings["m0"]
    assert float(row["population/elo_m1"]) == ratings["m1"]
    assert float(row["population/elo_best"]) == ratings["m0"]

    history = run_dir / "league" / "ratings.jsonl"

    def last_line() -> dict | None:
        lines = history.read_text().splitlines() if history.exists() else []
        last = json.loads(lines[-1]) if lines else None
        return last if last and last["games"] == 200 else None

    line = wait_for(last_line, 10, "a history line with 200 games")
    assert line["ratings"] == {"m0": ratings["m0"], "m1": ratings["m1"]}
    assert "Traceback" not in league.log.read_text()
    league.close()


def test_an_exploit_gives_the_recipient_its_donors_rating(processes, tmp_path):
    """PBT's ``exploited``: member 1 now plays with member 0's weights, so it is rated as
    member 0 is at once (not after games move it there); a message naming a player that
    is not a member is refused and changes nothing."""
    league = League(processes, topology(tmp_path), tmp_path / "run", tmp_path / "league.log")
    assert league.send(beats("m0", "m1", 100)) == "ok"
    before = league.games_rated(100).fields["ratings"]
    assert before["m0"] - before["m1"] > 100, before
    assert "not a member" in league.send_raw(wire.encode(wire.EXPLOITED, recipient=1,
                                                         donor=7))
    assert league.send_raw(wire.encode(wire.EXPLOITED, recipient=1, donor=0)) == "ok"
    after = league.ratings(lambda m: m.fields["ratings"]["m1"] != before["m1"]).fields
    assert after["ratings"] == {"m0": before["m0"], "m1": before["m0"]}
    assert after["games"] == 100  # no game was invented for it
    league.close()


def test_a_snapshot_starts_at_its_members_rating_and_is_forgotten_when_idle(
        processes, tmp_path):
    """``m0@v20``, first seen, starts where m0 is (``m7@v3``, whose member is unrated,
    at the initial 1000); once no game names them for forget_after_s they are dropped,
    the members never."""
    league = League(processes, topology(tmp_path, forget_after_s=2.0), tmp_path / "run",
                    tmp_path / "league.log")
    games = beats("m0", "m1", 100)
    assert league.send(games) == "ok"
    before = league.games_rated(100).fields["ratings"]
    assert before["m0"] > 1100  # far from the initial rating
    snapshots = [("m0@v20", "m1", 0.5), ("m1", "m7@v3", 0.5)]
    assert league.send(snapshots) == "ok"
    after = league.games_rated(102).fields["ratings"]
    assert after == expected(games + snapshots).table()
    assert abs(after["m0@v20"] - before["m0"]) < 16  # one game from m0's rating
    assert abs(after["m7@v3"] - 1000) < 16

    idle = league.ratings(lambda m: "m0@v20" not in m.fields["ratings"], timeout=10)
    assert set(idle.fields["ratings"]) == {"m0", "m1"}  # both snapshots went together
    assert idle.fields["games"] == 102 and idle.fields["ratings"]["m0"] == after["m0"]
    league.close()


def test_a_malformed_games_message_is_refused_whole(processes, tmp_path):
    """Each bad message carries a good game before its fault: an error names the fault,
    and not even that good game is rated."""
    league = League(processes, topology(tmp_path), tmp_path / "run", tmp_path / "league.log")
    good = beats("m0", "m1", 10)
    assert league.send(good) == "ok"
    league.games_rated(10)
    players = ["m0", "m1"]
    bad = {
        "index 2": raw_games(players, [0, 2], [1, 0], [1.0, 0.0]),
        "'players' must be a list of at most 4096 names": raw_games(["m0", 5], [0, 1],
                                                                    [1, 0], [1.0, 0.0]),
        "'score' must be in [0, 1]": raw_games(players, [0, 1], [1, 0], [1.0, 1.5]),
        "got ['m0', 'm1', 'p0'": raw_games(
            players + [f"p{i}" for i in range(messages.MAX_PLAYERS - 1)], [0, 2], [1, 0],
            [1.0, 1.0]),
        "got ['mmmm": raw_games(["m" * 65, "m1"], [0, 1], [1, 0], [1.0, 0.0]),
        "expected 'games'": wire.encode(wire.RATINGS, ratings={"m0": 3000.0}, games=5),
        f"{MAX_GAMES + 1} games": raw_games(players, [0] * (MAX_GAMES + 1),
                                            [1] * (MAX_GAMES + 1), [1.0] * (MAX_GAMES + 1)),
    }
    for fault, frames in bad.items():
        answer = league.send_raw(frames)
        assert fault in answer, (fault, answer)
    last = [("m1", "m0", 1.0)]
    assert league.send(last) == "ok"
    msg = league.games_rated(11)
    assert msg.fields["ratings"] == expected(good + last).table()
    log = league.log.read_text()
    assert "Traceback" not in log and log.count("rejected message on 'games'") == len(bad)
    league.close()


def test_ratings_survive_a_kill_from_the_checkpoint_and_a_stop_saves_them(processes,
                                                                           tmp_path):
    """SIGKILL once the checkpoint holds every game: the restarted league's first ratings
    are the checkpoint's, snapshots still frozen. SIGTERM saves at exit (a second life
    that checkpoints only hourly)."""
    run_dir = tmp_path / "run"
    league = League(processes, topology(tmp_path), run_dir, tmp_path / "league-1.log")
    games = beats("m0", "m1", 30) + [("m0@v20", "m1", 1.0), ("m1", "m0@v20", 0.0)]
    assert league.send(games) == "ok"
    first_life = league.games_rated(len(games))
    path = run_dir / "checkpoints" / f"{NODE}.json"

    def checkpointed() -> dict | None:
        saved = json.loads(path.read_text()) if path.exists() else None
        return saved if saved and saved["ratings"]["games"] == len(games) else None

    saved = wait_for(checkpointed, 10, "a checkpoint of every game")
    os.killpg(league.proc.pid, signal.SIGKILL)
    assert league.proc.wait(10) == -signal.SIGKILL
    league.close()
    players = saved["ratings"]["players"]
    assert players["m0@v20"]["frozen"] and not players["m0"]["frozen"]
    assert set(saved["idle_s"]) == {"m0", "m1", "m0@v20"}

    league = League(processes, topology(tmp_path, checkpoint_every_s=3600.0), run_dir,
                    tmp_path / "league-2.log")
    resumed = league.ratings()
    assert resumed.fields["games"] == len(games)
    assert resumed.fields["ratings"] == first_life.fields["ratings"] == \
        {n: round(p["rating"], 1) for n, p in players.items()}
    assert resumed.fields["source"] != first_life.fields["source"]
    assert "resumed: 3 players, 32 games rated" in league.log.read_text()

    more = beats("m1", "m0", 5)
    assert league.send(more) == "ok"
    league.games_rated(len(games) + len(more))
    os.killpg(league.proc.pid, signal.SIGTERM)
    assert league.proc.wait(20) == 0
    league.close()
    back = Ratings()
    back.restore(json.loads(path.read_text())["ratings"])
    assert back.games == len(games) + len(more)
    assert back.table() == expected(games + more).table()


def test_made_up_players_can_neither_freeze_the_ratings_nor_outstay_the_members(
        processes, tmp_path):
    """Issue 43 §2.1: one message naming 4,094 made-up players (``m9`` among them, which
    matched the member pattern) filled the league; every later batch with a new snapshot
    was refused whole, members' games too, and the checkpoint kept the fakes. Now the
    members are the population's K, a batch is rated as far as there is room (the least
    recently seen non-members evicted first), and idle non-members are forgotten."""
    run_dir = tmp_path / "run"
    league = League(processes, topology(tmp_path, forget_after_s=3.0), run_dir,
                    tmp_path / "league.log")
    honest = beats("m0", "m1", 10)
    assert league.send(honest) == "ok"
    league.games_rated(10)
    fakes = ["m9"] + [f"x{i}" for i in range(messages.MAX_PLAYERS - 3)]  # the league full
    flood = [(fakes[i], fakes[i + 1], 1.0) for i in range(0, len(fakes) - 1, 2)]
    assert league.send(flood) == "ok"
    rated = 10 + len(flood)
    league.games_rated(rated)
    # a new snapshot and the members' games: rated whole (a fake makes room)
    later = [("m0@v1", "m1", 1.0), ("m0", "m1", 1.0)]
    assert league.send(later) == "ok"
    msg = league.games_rated(rated + 2)
    assert "m0@v1" in msg.fields["ratings"] and len(msg.fields["ratings"]) == \
        messages.MAX_PLAYERS
    # More new players than room even with every other non-member gone: the part that
    # fits is rated, the rest skipped and counted; the members' places are kept.
    more = [f"y{i}" for i in range(messages.MAX_PLAYERS - 1)]
    assert league.send([("m0", name, 0.5) for name in more]) == "ok"
    fits = messages.MAX_PLAYERS - 2  # every place but the two members'
    msg = league.games_rated(rated + 2 + fits)
    assert {"m0", "m1", *more[:fits]} == set(msg.fields["ratings"])
    wait_for(lambda: any(r.get("games_skipped") == str(len(more) - fits)
                         for r in read_csv(run_dir / "metrics" / f"{NODE}.csv")),
             10, "the skipped game in the metrics")
    # Idle, every non-member goes, in the ratings and in the checkpoint: m9 too.
    idle = league.ratings(lambda m: len(m.fields["ratings"]) == 2, timeout=15)
    assert set(idle.fields["ratings"]) == {"m0", "m1"}
    path = run_dir / "checkpoints" / f"{NODE}.json"
    wait_for(lambda: path.exists() and set(json.loads(path.read_text())["ratings"]
                                           ["players"]) == {"m0", "m1"},
             10, "a checkpoint of the members alone")
    assert "Traceback" not in league.log.read_text()
    league.close()


def test_a_league_outside_a_population_must_be_told_its_members():
    raw = copy.deepcopy(TOPOLOGY)
    raw["nodes"][NODE]["args"] = {}
    with pytest.raises(TopologyError) as refused:
        from_dict(raw, "t.yaml")
    assert any(f"node '{NODE}', field 'args.members': the league rates a population's "
               "members" in e for e in refused.value.errors), refused.value.errors
    shipped = load(Path(__file__).parents[1] / "topologies" / "population_league.yaml")
    assert population_size(shipped) == 4  # the shipped league counts its population's K


def test_an_unreadable_checkpoint_stops_the_league_naming_the_file(processes, tmp_path):
    """As every Checkpointer does: a checkpoint may be all a run has, so it is never
    silently replaced by a fresh start."""
    run_dir = tmp_path / "run"
    path = run_dir / "checkpoints" / f"{NODE}.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "ratings": {"format": 1, "games": "x"}}')
    log = tmp_path / "league.log"
    proc = processes.zmqrl("node", str(topology(tmp_path)), NODE, "--run-dir", str(run_dir),
                           log=log)
    assert proc.wait(60) != 0
    assert f"cannot restore {path}" in log.read_text()


def test_the_loader_refuses_bad_knobs_naming_them():
    good = copy.deepcopy(TOPOLOGY)
    assert from_dict(good).nodes[NODE].kind == "population_league"
    cases = {
        "args.k_min': must be in (0, k] (k is 4)": {"k": 4.0, "k_min": 8.0},
        "args.k': must be finite and > 0": {"k": 0.0, "k_min": 0.0},
        "args.publish_every_s': must be finite and > 0": {"publish_every_s": 0.0},
        "args.initial': must be finite": {"initial": float("inf")},
    }
    for text, args in cases.items():
        raw = copy.deepcopy(TOPOLOGY)
        raw["nodes"][NODE]["args"] = args
        with pytest.raises(TopologyError) as refused:
            from_dict(raw, "t.yaml")
        assert any(f"node '{NODE}', field '{text}" in e for e in refused.value.errors), \
            (text, refused.value.errors)
