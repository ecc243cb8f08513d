"""Population play (zmqrl.parts.selfplay.population_acting, zmqrl.parts.selfplay.roster) on
real game envs: every seat a member's current policy plays trains that member, whole
games packed into its unrolls with the outcome attributed to the right move; a
snapshot's seat trains no one; each row is played by its own player's model; every
game's result waits for the league; the roster's snapshots keep their cadence and
survive a checkpoint; PBT ranks members by the league's ratings."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

pytest.importorskip("pyspiel")

from zmqrl.parts.acting import ActingSetup, act_batched  # noqa: E402
from zmqrl.parts.actor_critic.config import VTraceConfig  # noqa: E402
from zmqrl.parts.envs import env_spec, make_vector_env  # noqa: E402
from zmqrl.parts.games import env_id  # noqa: E402
from zmqrl.parts.models import build_model  # noqa: E402
from zmqrl.parts.selfplay.acting import frozen_copy  # noqa: E402
from zmqrl.parts.selfplay.matchmaking import make  # noqa: E402
from zmqrl.parts.selfplay.population_acting import bind  # noqa: E402
from zmqrl.parts.selfplay.roster import Roster  # noqa: E402
from zmqrl.run import population  # noqa: E402

TTT = {"id": env_id("tic_tac_toe"), "kwargs": {"opponent": "self"}}


def population_setup(members: int = 2, snapshot_every: int = 10, pool_size: int = 2,
                     matchmaker=None, unroll: int = 4, columns: int | None = 3):
    spec = env_spec(TTT)
    model = build_model({"kind": "mlp", "hidden": [32]}, spec, 0)
    models = [model] + [frozen_copy(model) for _ in range(members - 1)]
    roster = Roster(models, snapshot_every, pool_size)
    cls = bind(roster, make(matchmaker or {"kind": "uniform"}), columns)
    return cls, ActingSetup(spec, model, VTraceConfig(unroll=unroll), seed=0), roster


def test_roster_snapshots_each_member_on_its_cadence_and_keeps_the_newest():
    roster = Roster(["a", "b"], snapshot_every=10, pool_size=2)
    made = []
    for version in (0, 5, 10, 12, 20, 30):
        roster.on_version(0, version, lambda v=version: made.append(v) or f"a@{v}")
    assert made == [0, 10, 20, 30]
    assert [s.name for s in roster.snapshots.values()] == ["m0@v20", "m0@v30"]
    roster.on_version(1, 40, lambda: "b@40")
    ids, cands = roster.candidates()
    assert [c.name for c in cands] == ["m0", "m1", "m0@v20", "m0@v30", "m1@v40"]
    assert [c.current for c in cands] == [True, True, False, False, False]
    # an unrated snapshot stands at its member's rating until the league rates it
    roster.ratings = {"m0": 1200.0, "m0@v20": 900.0}
    assert [c.rating for c in roster.candidates()[1]] == [1200.0, 1000.0, 900.0, 1200.0,
                                                          1000.0]
    # an evicted snapshot's games are finished by its member's current model
    gone = ids[2]
    roster.on_version(0, 40, lambda: "a@40")
    assert roster.model(gone) is None and not roster.intact(gone)
    assert (roster.member_of(gone), roster.name(gone)) == (0, "m0@v20")
    # a restarted learner counts from where it is
    roster.on_version(0, 3, lambda: "a@3")
    assert roster.next_at[0] == 10


def test_roster_snapshots_survive_a_checkpoint():
    roster = Roster(["a", "b"], 10, 3)
    for v in (0, 10):
        roster.on_version(1, v, lambda v=v: f"b@{v}")
    back = Roster(["a", "b"], 10, 1)  # a smaller pool keeps the newest
    back.restore(roster.state(lambda m: m.upper()), lambda w: w.lower())
    assert [(s.name, s.model) for s in back.snapshots.values()] == [("m1@v10", "b@10")]
    assert back.next_at == roster.next_at
    with pytest.raises(ValueError, match="another population size"):
        Roster(["a"], 10, 3).restore(roster.state(str), str)
    with pytest.raises(ValueError, match="format"):
        back.restore({"format": 7}, str)


def drive(behaviours, envs, steps):
    """Step connections of real GameEnv vectors as the broker does. Ground truth per
    connection and env: one entry per move (obs, seat to move, players in the seats,
    action, reward, done)."""
    truth = [[[] for _ in range(b.n)] for b in behaviours]
    items = [[] for _ in behaviours]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    for b, o in zip(behaviours, obs, strict=True):
        b.observe(o.astype(np.float32))
    for _ in range(steps):
        players = [b.players.copy() for b in behaviours]
        movers = [b.to_move.copy() for b in behaviours]
        actions = act_batched(behaviours[0].model, behaviours, 0)
        for c, (b, env, action) in enumerate(zip(behaviours, envs, actions, strict=True)):
            before = obs[c]
            obs[c], reward, term, trunc, _ = env.step(action)
            done = term | trunc
            for i in range(b.n):
                truth[c][i].append((before[i].copy(), int(movers[c][i]),
                                    tuple(players[c][i]), int(action[i]), float(reward[i]),
                                    bool(done[i])))
            b.outcome(reward.astype(np.float32), done, np.zeros(b.n, bool),
                      np.zeros((0, 3, 3, 3), np.float32))
            b.observe(obs[c].astype(np.float32))
            items[c] += b.take()
    return truth, items


def expected_games(truth_env, members):
    """Per finished game of one env: (member, its seat's moves as (action, reward,
    done)) for each seat a current policy played; and the game's result for the league."""
    games, results, moves = [], [], {0: [], 1: []}
    for obs, mover, players, action, reward, done in truth_env:
        moves[mover].append([obs, action, reward, False])
        other = moves[1 - mover]
        if other and reward:
            other[-1][2] -= reward  # the reply that ended the game: zero-sum
        if done:
            for s in (0, 1):
                if moves[s]:
                    moves[s][-1][3] = True
                    if players[s] < members:
                        games.append((players[s], tuple((a, r, d) for _, a, r, d in moves[s])))
            outcome = reward if mover == 0 else -reward
            results.append((players, 1.0 if outcome > 0 else 0.0 if outcome < 0 else 0.5))
            moves = {0: [], 1: []}
    return games, results


def shipped_games(behaviour, unrolls, member):
    """The games in ``member``'s unrolls (and still in its packer), column by column."""
    mine = [u for u in unrolls if u.fields["member"] == member]
    games = []
    for col in range(behaviour.packers[member].cols.__len__()):
        rows = [(int(u.arrays["action"][t, col]), float(u.arrays["reward"][t, col]),
                 bool(u.arrays["done"][t, col])) for u in mine
                for t in range(u.arrays["action"].shape[0])]
        rows += [(int(r[1]), float(r[3]), bool(r[4])) for r in behaviour.packers[member].cols[col]]
        game = []
        for row in rows:
            game.append(row)
            if row[2]:
                games.append((member, tuple(game)))
                game = []
        assert not game, "a column ends inside a game"
    return games


def test_every_current_seat_trains_its_member_with_the_outcome_attributed():
    members = 3
    cls, setup, roster = population_setup(members, snapshot_every=1000)
    roster.on_version(0, 0, lambda: frozen_copy(roster.members[0]))  # one snapshot: m0@v0
    n = 8
    behaviour = cls(setup, n)
    truth, items = drive([behaviour], [make_vector_env(TTT, n, seed=0)], 200)
    unrolls = items[0]
    assert behaviour.mismatches == 0 and unrolls
    for u in unrolls:  # V-trace's arrays, time-major, columns wide
        assert u.type == "unroll" and u.arrays["obs"].shape == (5, 3, 3, 3, 3)
        assert u.arrays["action"].shape == u.arrays["reward"].shape == (4, 3)
    want, results = [], []
    for i in range(n):
        g, r = expected_games(truth[0][i], members)
        want += g
        results += r
    got = [g for m in range(members) for g in shipped_games(behaviour, unrolls, m)]
    assert collections.Counter(got) == collections.Counter(want)
    trained = {m for m, _ in want}
    assert trained == set(range(members))  # every member trained
    # a snapshot's seats (id >= members) played but trained no one
    assert any(p >= members for players, _ in results for p in players)
    # every finished game went to the league's queue, named, with seat 0's score
    assert len(roster.games) == len(results)
    names = {i: roster.name(i) for i in range(members + 1)}
    assert collections.Counter(roster.games) == collections.Counter(
        (names[p0], names[p1], s) for (p0, p1), s in results)
    # the members' own games ride along for their learners' metrics
    returns = np.concatenate([u.arrays["ep_return"] for u in unrolls])
    assert set(returns.tolist()) <= {-1.0, 0.0, 1.0} and len(returns) > 10


def test_each_row_is_played_by_its_players_model_in_one_pass_each():
    """Member 0 always plays cell 0, member 1 cell 4, the snapshot cell 8: every move
    shows whose it was, and each model runs once per batch over every connection."""
    cls, setup, roster = population_setup(2, snapshot_every=1000)
    snap = roster.on_version(1, 0, lambda: frozen_copy(roster.members[1]))
    calls = collections.Counter()
    for player, cell in ((0, 0), (1, 4), (snap.id, 8)):
        model = roster.model(player)
        with torch.no_grad():
            model.policy[-1].bias.copy_(torch.where(torch.arange(9) == cell, 50.0, -50.0))
        act = model.act
        model.act = lambda obs, act=act, p=player: (calls.update({p: 1}), act(obs))[1]
    behaviours = [cls(setup, 6), cls(setup, 5)]
    for b in behaviours:
        b.observe(np.concatenate([np.zeros((b.n, 2, 3, 3)), np.ones((b.n, 1, 3, 3))],
                                 1).astype(np.float32))
    actions = act_batched(setup.model, behaviours, 0)
    cell = {0: 0, 1: 4, snap.id: 8}
    for b, a in zip(behaviours, actions, strict=True):
        np.testing.assert_array_equal(a, [cell[p] for p in b.players[:, 0]])
    present = {int(p) for b in behaviours for p in b.players[:, 0]}
    assert calls == {p: 1 for p in present}


def step_all(behaviour, env, obs, steps):
    """``steps`` broker turns of one connection over ``env``; the last observations."""
    for _ in range(steps):
        [action] = act_batched(behaviour.model, [behaviour], 0)
        obs, reward, term, trunc, _ = env.step(action)
        behaviour.outcome(reward.astype(np.float32), term | trunc, np.zeros(behaviour.n, bool),
                          np.zeros((0, 3, 3, 3), np.float32))
        behaviour.observe(obs.astype(np.float32))
    return obs


def test_a_game_whose_snapshot_is_evicted_is_finished_by_its_member_and_not_rated():
    cls, setup, roster = population_setup(
        2, snapshot_every=1000, pool_size=1, matchmaker={"kind": "uniform",
                                                         "latest_fraction": 0.0})
    snap = roster.on_version(1, 0, lambda: frozen_copy(roster.members[1]))
    n = 6
    behaviour = cls(setup, n)
    assert (behaviour.players == snap.id).any(axis=1).all()  # every game: against m1@v0
    env = make_vector_env(TTT, n, seed=0)
    obs = env.reset(seed=0)[0].astype(np.float32)
    behaviour.observe(obs)
    obs = step_all(behaviour, env, obs, 1)
    roster.on_version(1, 1000, lambda: frozen_copy(roster.members[1]))  # evicts m1@v0
    assert not roster.intact(snap.id)
    step_all(behaviour, env, obs, 12)  # every first game has ended (at most 9 moves)
    assert roster.unrated >= n
    assert all("m1@v0" not in (a, b) for a, b, _ in roster.games), roster.games


def test_a_game_joined_mid_way_trains_but_is_not_rated():
    """A reconnecting actor's boards already hold pieces: those games are played and
    trained on, but their results do not go to the league."""
    cls, setup, roster = population_setup(2)
    n = 4
    behaviour = cls(setup, n)
    env = make_vector_env(TTT, n, seed=0)
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.array([4, 4, 0, 0]))  # one move made in every game
    behaviour.observe(obs.astype(np.float32))
    assert behaviour.joined.all()
    step_all(behaviour, env, obs, 12)
    assert roster.unrated == n and roster.finished == len(roster.games) > 0


def test_matchmaking_picks_opponents_by_the_leagues_ratings():
    """With 'close' matchmaking, a member rated far above everyone meets its equals:
    the games it is dealt are mostly against itself."""
    cls, setup, roster = population_setup(
        3, matchmaker={"kind": "close", "latest_fraction": 1.0, "sharpness": 4.0})
    roster.ratings = {"m0": 2000.0, "m1": 1000.0, "m2": 1000.0}
    b = cls(setup, 400)
    m0_games = [set(p) for p in b.players.tolist() if 0 in p]
    alone = sum(p == {0} for p in m0_games)
    assert alone > 0.9 * len(m0_games), m0_games


def test_pbt_ranks_members_by_rating_when_told():
    """rank_by: rating: the bottom member by rating copies the top one, whatever their
    returns say."""
    settings = population.Settings.parse(
        {"size": 4, "hyperparameters": {"lr": {"loguniform": [1e-4, 1e-2]}},
         "ready_after_steps": 10, "rank_by": "rating"})
    pop = population.Population(settings, 0)
    for m, (ret, rating) in enumerate([(9.0, 900.0), (1.0, 1300.0), (5.0, 1000.0),
                                       (3.0, 1100.0)]):
        pop.on_rating(m, rating)
        pop.on_report(m, 0, ret, {"lr": 1e-3}, True)
    decision = pop.on_report(0, 20, 9.0, {"lr": 1e-3}, True)  # best return, worst rating
    assert decision is not None and decision.donor == 1
    assert (decision.recipient_score, decision.donor_score) == (900.0, 1300.0)
    assert pop.on_report(1, 20, 1.0, {"lr": 1e-3}, True) is None  # the top stays
    state = pop.state()
    back = population.Population(settings, 0)
    back.restore(state)
    assert back.members[1].rating == 1300.0
    with pytest.raises(Exception, match="rank_by|is not one of"):
        population.Settings.parse({"size": 2, "hyperparameters": {"lr": {"uniform": [0, 1]}},
                                   "rank_by": "elo"})
