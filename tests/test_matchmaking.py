"""Matchmaking and per-game ratings of a population (zmqrl.parts.selfplay.matchmaking,
zmqrl.parts.selfplay.ratings): ratings follow the players' true strengths, the samplers
prefer what they say they prefer, and a sampler is a part named in YAML like any other."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from zmqrl.parts.selfplay.matchmaking import Candidate, make
from zmqrl.parts.selfplay.ratings import Ratings


def play(ratings: Ratings, a: str, b: str, p_a: float, games: int, rng) -> None:
    for _ in range(games):
        ratings.update(a, b, float(rng.random() < p_a))


def test_ratings_follow_true_strength_and_snapshots_settle():
    """A player who wins 80 % against another ends about 240 Elo above it (a 10^(240/400)
    odds ratio of 4); a frozen snapshot's K shrinks with its games, a current policy's
    does not."""
    rng = np.random.default_rng(0)
    r = Ratings(k=16)
    r.add("m0")
    r.add("m0@v20", frozen=True)
    play(r, "m0", "m0@v20", 0.8, 3000, rng)
    gap = r.rating("m0") - r.rating("m0@v20")
    assert 170 < gap < 310, gap
    assert r.games == 3000 and r.players["m0"].games == 3000
    assert r._k(r.players["m0"]) == 16
    assert r._k(r.players["m0@v20"]) == r.k_min


def test_a_rating_update_is_zero_sum_between_equal_ks_and_refuses_bad_scores():
    r = Ratings(k=20)
    r.add("a", 1100)
    r.add("b", 1000)
    total = r.rating("a") + r.rating("b")
    r.update("a", "b", 0.0)  # the favourite lost: it loses more than K/2
    assert r.rating("a") < 1100 - 10 and r.rating("a") + r.rating("b") == pytest.approx(total)
    r.update("a", "a", 1.0)  # against itself: nothing learned
    assert r.games == 1
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="score"):
            r.update("a", "b", bad)


def test_ratings_survive_their_checkpoint_and_refuse_a_bad_one():
    rng = np.random.default_rng(1)
    r = Ratings()
    play(r, "m0", "m1", 0.6, 50, rng)
    back = Ratings()
    back.restore(r.state())
    assert back.table() == r.table() and back.games == 50
    with pytest.raises(ValueError, match="format"):
        back.restore({"format": 9})
    with pytest.raises(ValueError, match="missing or mistyped"):
        back.restore({"format": 1, "games": 3, "players": {"m0": {"rating": 1.0}}})
    with pytest.raises(ValueError, match="not a number"):
        back.restore({"format": 1, "games": 3,
                      "players": {"m0": {"rating": "nan", "games": 1, "frozen": False}}})


POOL = [Candidate("m0", 1000, True), Candidate("m1", 1010, True),
        Candidate("m0@v20", 1000, False), Candidate("m1@v20", 1400, False),
        Candidate("m0@v40", 600, False)]


def counts(matchmaker, learner, n=4000, seed=0) -> collections.Counter:
    rng = np.random.default_rng(seed)
    return collections.Counter(POOL[matchmaker.choose(learner, POOL, rng)].name
                               for _ in range(n))


def test_close_matchmaking_prefers_even_matches_and_keeps_the_latest_share():
    learner = POOL[0]
    seen = counts(make({"kind": "close", "latest_fraction": 0.3}), learner)
    current = seen["m0"] + seen["m1"]
    assert 0.25 < current / 4000 < 0.35, seen
    # among the snapshots: the even one (1000) far more often than a 400-point gap
    assert seen["m0@v20"] > 2 * seen["m1@v20"] and seen["m0@v20"] > 2 * seen["m0@v40"]
    assert seen["m1@v20"] > 0 and seen["m0@v40"] > 0  # the floor: every one stays possible


def test_openai_five_plays_mostly_the_latest_and_the_strong_past():
    seen = counts(make({"kind": "openai_five"}), POOL[0])
    assert 0.75 < (seen["m0"] + seen["m1"]) / 4000 < 0.85, seen
    assert seen["m1@v20"] > 3 * seen["m0@v20"] > 3 * seen["m0@v40"], seen


def test_uniform_and_an_empty_group_fall_back_to_the_other():
    only_current = POOL[:2]
    rng = np.random.default_rng(0)
    mm = make({"kind": "uniform", "latest_fraction": 0.0})  # always "past", but there is none
    assert {mm.choose(POOL[0], only_current, rng) for _ in range(50)} == {0, 1}
    with pytest.raises(ValueError, match="no candidates"):
        mm.choose(POOL[0], [], rng)


def test_a_bad_matchmaker_spec_is_named():
    with pytest.raises(ValueError, match="unknown matchmaker 'closest'.*close"):
        make({"kind": "closest"})
    with pytest.raises(ValueError, match="matchmaker.sharpnes: unknown"):
        make({"kind": "close", "sharpnes": 2})
    with pytest.raises(ValueError, match="latest_fraction 1.5"):
        make({"kind": "close", "latest_fraction": 1.5})
    with pytest.raises(ValueError, match="is not float"):
        make({"kind": "close", "latest_fraction": "half"})


def test_a_users_matchmaker_plugs_in_by_import_path(tmp_path):
    """Through the user's door: a class in the user's own module, named in YAML."""
    (tmp_path / "my_matchmaking.py").write_text(
        "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\n"
        "class Strongest:\n"
        "    def choose(self, learner, candidates, rng):\n"
        "        return max(range(len(candidates)), key=lambda i: candidates[i].rating)\n"
        "class NoChoose:\n"
        "    pass\n")
    mm = make({"kind": "my_matchmaking:Strongest"}, [str(tmp_path)])
    assert POOL[mm.choose(POOL[0], POOL, np.random.default_rng(0))].name == "m1@v20"
    with pytest.raises(ValueError, match="has no choose"):
        make({"kind": "my_matchmaking:NoChoose"}, [str(tmp_path)])
