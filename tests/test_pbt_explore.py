"""PBT's explore and selection (issue 44): resampling at the stated rate, the bottom
quantile copying the top, an explore interval wider than the draws (a population whose
draws are all bad climbs out of them, within bounds), ready points by updates, and the
league told of every exploit so the recipient's rating becomes its donor's."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from test_pbt_safety import _answer, _FakeLearner, _next, _report

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.population import Member, Population, Settings, decide, perturb
from zmqrl.run.topology import TopologyError, load

from conftest import write_topology

LR = {"loguniform": [1e-5, 3e-4]}
ALGO = {"kind": "vtrace"}


def _members(returns: list[float], lr: float = 1e-4) -> dict[int, Member]:
    return {i: Member(steps=100, mean_return=r, hyperparameters={"lr": lr},
                      checkpointed=True) for i, r in enumerate(returns)}


def _settings(**kw) -> Settings:
    base = dict(size=8, hyperparameters={"lr": LR}, truncation=0.25,
                resample_probability=0.0, ready_after_steps=100, algo=ALGO)
    return Settings(**{**base, **kw})


def test_resampling_happens_at_the_stated_rate():
    members, rng = _members([float(i) for i in range(8)]), random.Random(7)
    n, p = 4000, 0.3
    hows = [decide(0, members, _settings(resample_probability=p), rng).how["lr"]
            for _ in range(n)]
    share = hows.count("resample") / n
    assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / n), share  # 4 sigma of a binomial
    assert set(hows) == {"resample", "perturb x0.8", "perturb x1.2"}
    never = [decide(0, members, _settings(), rng).how["lr"] for _ in range(200)]
    assert "resample" not in never


def test_the_bottom_quantile_copies_the_top():
    returns = [5.0, 80.0, 10.0, 60.0, 90.0, 40.0, 20.0, 70.0]  # ranked: 0 2 6 5 3 7 1 4
    members, rng = _members(returns), random.Random(0)
    settings = _settings()  # truncation 0.25 of 8: the bottom two copy the top two
    for member in range(8):
        decisions = [decide(member, members, settings, rng) for _ in range(50)]
        if member in (0, 2):
            assert {d.donor for d in decisions} == {1, 4}
        else:
            assert decisions == [None] * 50


def test_an_explore_interval_lets_values_leave_the_draws_and_no_further():
    explore = {**LR, "explore": [1e-5, 1e-2]}
    value = 3e-4
    for _ in range(40):  # x1.2 forty times is x1470: stops at the explore interval's top
        value = perturb(value, 1.2, explore)
    assert value == 1e-2
    assert perturb(3e-4, 1.2, LR) == 3e-4  # without one: the draw interval, as before
    # Through decide: a population of bad draws moves up, within the interval and the
    # field's declared range, however many exploits.
    settings = _settings(hyperparameters={"lr": explore})
    members, rng = _members([float(i) for i in range(8)], lr=3e-4), random.Random(1)
    seen = [decide(0, members, settings, rng).hyperparameters["lr"] for _ in range(500)]
    assert max(seen) > 3e-4 and all(1e-5 <= v <= 1e-2 for v in seen)


@pytest.mark.parametrize("explore, says", [
    ({"choice": [1e-4, 1e-3], "explore": [1e-5, 1e-2]}, "only a uniform or loguniform"),
    ({**LR, "explore": [1e-4, 1e-2]}, "must hold the draw interval"),
    ({**LR, "explore": [0.0, 1e-2]}, "both ends must be > 0"),
    ({"uniform": [0.0, 0.01], "explore": [-0.1, 0.5]}, "entropy_cost"),
])
def test_a_bad_explore_interval_is_refused_naming_it(explore, says):
    name = "entropy_cost" if "uniform" in explore else "lr"
    problems = Settings(size=4, hyperparameters={name: explore}, algo=ALGO).errors()
    assert len(problems) == 1 and says in problems[0] and "explore" in problems[0], problems


def test_ready_points_by_updates_ignore_env_steps():
    pop = Population(_settings(size=4, ready_after_updates=50), seed=0)
    for i, r in enumerate([10.0, 50.0, 30.0, 90.0]):
        assert pop.on_report(i, 10_000, r, {"lr": 1e-4}, True, updates=40) is None
    decision = pop.on_report(0, 10_000, 10.0, {"lr": 1e-4}, True, updates=50)
    assert decision is not None and decision.donor == 3
    pop.on_loaded(0)
    assert pop.on_report(0, 90_000, 10.0, {"lr": 1e-4}, True, updates=99) is None
    assert pop.on_report(0, 90_000, 10.0, {"lr": 1e-4}, True, updates=100) is not None


def test_a_recipient_takes_its_donors_rating():
    pop = Population(_settings(size=4, rank_by="rating"), seed=0)
    for i, rating in enumerate([900.0, 1000.0, 1050.0, 1200.0]):
        pop.on_rating(i, rating)
        pop.on_report(i, 50, None, {"lr": 1e-4}, True)
    assert pop.on_report(0, 100, None, {"lr": 1e-4}, True).donor == 3
    pop.on_loaded(0)
    assert pop.members[0].rating == 1200.0


def test_a_donor_must_be_clearly_stronger_when_a_win_probability_is_set():
    """min_donor_win_probability: the bottom member copies the top one only when the
    top one's expected score against it, by their ratings, reaches the threshold."""
    def rated(ratings: list[float]) -> dict[int, Member]:
        return {i: Member(steps=100, rating=r, hyperparameters={"lr": 1e-4},
                          checkpointed=True) for i, r in enumerate(ratings)}

    settings = _settings(size=4, rank_by="rating", min_donor_win_probability=0.7)
    rng = random.Random(0)
    # 50 points apart: 0.57 expected, under 0.7: no exploit (without the rule, one)
    close = rated([1000.0, 1020.0, 1030.0, 1050.0])
    assert decide(0, close, settings, rng) is None
    assert decide(0, close, _settings(size=4, rank_by="rating"), rng).donor == 3
    # 150 points apart: 0.70: the bottom copies the top; the top never copies
    far = rated([1000.0, 1020.0, 1030.0, 1150.0])
    assert decide(0, far, settings, rng).donor == 3
    assert decide(3, far, settings, rng) is None
    unrated = {**far, 0: Member(steps=100, hyperparameters={"lr": 1e-4}, checkpointed=True)}
    assert decide(0, unrated, settings, rng) is None
    off = Settings.parse({"size": 4, "hyperparameters": {"lr": LR}, "rank_by": "rating",
                          "min_donor_win_probability": None}, ALGO)  # null: the rule off
    assert decide(0, close, off, rng).donor == 3


@pytest.mark.parametrize("section, says", [
    ({"rank_by": "mean_return", "min_donor_win_probability": 0.7}, "needs rank_by: rating"),
    ({"rank_by": "rating", "min_donor_confidence": 0.95}, "needs rank_by: mean_return"),
    ({"min_donor_confidence": 1.0}, "min_donor_confidence"),
    ({"min_donor_confidence": 0.3}, "min_donor_confidence"),
    ({"rank_by": "rating", "min_donor_lead": 0.5}, "needs rank_by: mean_return"),
    ({"min_donor_lead": -1.0}, "min_donor_lead"),
    ({"rank_by": "rating", "ranked_episodes": 50}, "needs rank_by: mean_return"),
    ({"ranked_episodes": 1}, "ranked_episodes"),
    ({"ranked_episodes": 101}, "ranked_episodes"),
    ({"rank_by": "rating", "min_donor_win_probability": 1.0}, "min_donor_win_probability"),
    ({"rank_by": "rating", "min_donor_win_probability": 0.4}, "min_donor_win_probability"),
])
def test_a_bad_win_probability_is_refused_naming_it(section, says):
    from zmqrl.run import population

    raw = {"population": {"size": 2, "hyperparameters": {"lr": LR}, **section},
           "algo": ALGO, "nodes": {}}
    with pytest.raises(ValueError, match=says):
        population.expand(raw)


def test_a_donor_must_be_ahead_beyond_noise_when_a_confidence_is_set():
    """min_donor_confidence (the PBT paper's t-test selection): the bottom member copies
    the top one only when Welch's t-test over their reported episodes says the top one's
    mean return is above its own with that confidence."""
    def spread(stats: list[tuple[float, float]], episodes: int = 20) -> dict[int, Member]:
        return {i: Member(steps=100, mean_return=m, return_std=sd, episodes=episodes,
                          hyperparameters={"lr": 1e-4}, checkpointed=True)
                for i, (m, sd) in enumerate(stats)}

    settings = _settings(size=4, min_donor_confidence=0.95)
    rng = random.Random(0)
    # 120 against 140, each +-60 over 20 episodes: t = 1.05, 85 % sure: no exploit
    # (without the rule, the bottom copies the top)
    noisy = spread([(120.0, 60.0), (125.0, 60.0), (130.0, 60.0), (140.0, 60.0)])
    assert decide(0, noisy, settings, rng) is None
    assert decide(0, noisy, _settings(size=4), rng).donor == 3
    # 120 against 200: t = 4.2, all but certain: it copies; the top never copies
    ahead = spread([(120.0, 60.0), (125.0, 60.0), (130.0, 60.0), (200.0, 60.0)])
    assert decide(0, ahead, settings, rng).donor == 3
    assert decide(3, ahead, settings, rng) is None
    # the same means from 2 episodes each are not enough to be sure
    assert decide(0, spread([(120.0, 60.0), (125.0, 60.0), (130.0, 60.0), (200.0, 60.0)],
                            episodes=2), settings, rng) is None
    # a member that reported no spread is not judged, nor copied
    silent = {**ahead, 0: Member(steps=100, mean_return=120.0, hyperparameters={"lr": 1e-4},
                                 checkpointed=True)}
    assert decide(0, silent, settings, rng) is None
    off = Settings.parse({"size": 4, "hyperparameters": {"lr": LR},
                          "min_donor_confidence": None}, ALGO)  # null: the rule off
    assert decide(0, noisy, off, rng).donor == 3


def test_a_donor_must_lead_by_the_stated_margin_when_a_lead_is_set():
    """min_donor_lead: the bottom member copies the top one only when the top one's mean
    return is at least that much above its own, however sure the t-test is: at chance,
    a lead the test passes on noise is too small to act on."""
    def spread(means: list[float], sd: float = 0.05) -> dict[int, Member]:
        return {i: Member(steps=100, mean_return=m, return_std=sd, episodes=20,
                          hyperparameters={"lr": 1e-4}, checkpointed=True)
                for i, m in enumerate(means)}

    rng = random.Random(0)
    both = _settings(size=4, min_donor_confidence=0.95, min_donor_lead=0.5)
    # 0.40 against 0.60, spreads of 0.05 over 20 episodes: the t-test alone is sure
    # (t ~ 12.6) and copies; with a lead of 0.5 asked, it does not
    chance = spread([0.40, 0.45, 0.50, 0.60])
    assert decide(0, chance, _settings(size=4, min_donor_confidence=0.95), rng).donor == 3
    assert decide(0, chance, both, rng) is None
    # a lead of exactly 0.5 is enough; the top never copies
    assert decide(0, spread([0.40, 0.45, 0.50, 0.90]), both, rng).donor == 3
    assert decide(3, spread([0.40, 0.45, 0.50, 0.90]), both, rng) is None
    # the lead alone, without the t-test: a wide spread does not hold it back
    lead_only = _settings(size=4, min_donor_lead=0.5)
    wide = spread([0.40, 0.45, 0.50, 1.40], sd=3.0)
    assert decide(0, wide, lead_only, rng).donor == 3
    assert decide(0, wide, both, rng) is None  # ... the t-test does (t ~ 1.05)
    off = Settings.parse({"size": 4, "hyperparameters": {"lr": LR},
                          "min_donor_lead": None}, ALGO)  # null: the rule off
    assert decide(0, chance, off, rng).donor == 3


def test_welchs_test_agrees_with_the_tables():
    """The t CDF behind min_donor_confidence, against Student's tables and Welch's df."""
    from zmqrl.run.significance import student_t_cdf, welch_confidence

    for t, df, p in ((2.086, 20, 0.975), (1.725, 20, 0.95), (12.706, 1, 0.975),
                     (2.776, 4, 0.975), (1.960, 1e6, 0.975), (0.0, 7, 0.5)):
        assert student_t_cdf(t, df) == pytest.approx(p, abs=2e-4)
        assert student_t_cdf(-t, df) == pytest.approx(1 - p, abs=2e-4)
    # equal spreads and counts: Welch's t is Student's, df = 2n - 2
    t = (130 - 100) / math.sqrt(2 * 40**2 / 20)
    assert welch_confidence(130, 40, 20, 100, 40, 20) == pytest.approx(student_t_cdf(t, 38))
    assert welch_confidence(100, 40, 20, 130, 40, 20) < 0.05
    assert welch_confidence(130, 40, 1, 100, 40, 20) == 0.0  # one episode: nothing to judge
    assert welch_confidence(500, 0, 20, 100, 0, 20) == 1.0  # no spread: the means decide
    with pytest.raises(ValueError, match="df >= 1"):
        student_t_cdf(1.0, 0.5)


def test_a_report_carries_the_spread_of_the_returns_it_ranks_by():
    from zmqrl.bus.metrics import EpisodeStats
    from zmqrl.parts.learning.pbt_member import ranked_returns, return_summary

    episodes = EpisodeStats()
    episodes.add(np.arange(30, dtype=np.float64), np.full(30, 10))
    summary = return_summary(ranked_returns(episodes, at_load=0))
    last = np.arange(10, 30, dtype=np.float64)  # the last 20
    assert summary == {"mean_return": pytest.approx(last.mean()), "episodes": 20,
                       "return_std": pytest.approx(last.std(ddof=1))}
    assert return_summary(ranked_returns(episodes, at_load=episodes.count)) == {}
    assert "return_std" not in return_summary([7.0])  # one return: no spread


def test_the_population_sets_how_many_episodes_a_mean_return_is_over(tmp_path):
    """``ranked_episodes`` reaches every member's learner, and a member's report, sent
    over a real socket, carries the mean and spread of that many of its latest episodes
    (20 when the population does not say); a learner told more than it keeps is refused
    naming the argument."""
    from types import SimpleNamespace

    import zmq

    from zmqrl.bus import sockets
    from zmqrl.bus.metrics import EpisodeStats
    from zmqrl.parts.learning.pbt_member import PBTMember

    topo = load(write_topology(tmp_path, "pbt_minatar.yaml",
                               population={"ranked_episodes": 100}))
    learners = [spec for name, spec in topo.nodes.items() if name.startswith("learner_m")]
    assert [spec.args["ranked_episodes"] for spec in learners] == [100] * 4
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind(f"ipc://{tmp_path}/controller")
    dealer.connect(f"ipc://{tmp_path}/controller")
    try:
        learner = _FakeLearner(dealer, tmp_path, wire.MAX_MESSAGE_BYTES)
        learner.source = SimpleNamespace(state=lambda: {"env_steps": 0},
                                         episodes=EpisodeStats())
        learner.source.episodes.add(np.arange(150, dtype=np.float64), np.full(150, 10))
        for ranked, kwargs in ((100, {"ranked_episodes": 100}), (20, {})):
            PBTMember(learner, 0, {}, **kwargs).report()
            assert router.poll(5000), "no report reached the controller"
            report = wire.decode(sockets.split_envelope(router.recv_multipart())[1])
            last = np.arange(150 - ranked, 150, dtype=np.float64)
            assert report.type == wire.PBT_REPORT and report.fields["episodes"] == ranked
            assert report.fields["mean_return"] == pytest.approx(last.mean())
            assert report.fields["return_std"] == pytest.approx(last.std(ddof=1))
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
    too_many = write_topology(tmp_path, "seed.yaml",
                              nodes={"learner": {"args": {"ranked_episodes": 500}}})
    with pytest.raises(TopologyError, match="ranked_episodes"):
        load(too_many)


def test_the_league_is_told_of_every_exploit(processes, tmp_path, client_factory):
    """A real controller with a ``league`` link: when member 0 has loaded member 3's
    state, an ``exploited`` message reaches the league's ``games`` port."""
    import zmq

    from zmqrl.bus import sockets

    path = write_topology(
        tmp_path, "pbt_seed.yaml",
        population={"ready_after_steps": 100, "shared": ["league"]},
        nodes={"pbt": {"kind": "pbt", "links": {"league": "league.games"}},
               "league": {"kind": "population_league"}})
    run_dir = tmp_path / "run"
    endpoints = Endpoints(load(path), run_dir)
    league = zmq.Context.instance().socket(zmq.ROUTER)  # the league's games port
    league.setsockopt(zmq.LINGER, 0)
    league.bind(endpoints.bind_address("league", "games", 0))
    try:
        processes.zmqrl("node", str(path), "pbt", "--run-dir", str(run_dir),
                        log=tmp_path / "pbt.log")
        address = endpoints.bind_address("pbt", "members", 0)
        peers = [client_factory(address) for _ in range(4)]
        assert peers[0].request(wire.encode(wire.PING), timeout=90).type == wire.PONG
        for member, ret in ((1, 50.0), (2, 30.0), (3, 90.0)):
            assert _answer(peers[member], _report(member, 50, ret)) == "ok"
        assert _answer(peers[0], _report(0, 100, 10.0)) == "ok"  # ready: copies member 3
        _next(peers[3], wire.PBT_GET_STATE)
        state = {"state": np.frombuffer(b"member 3 weights", np.uint8)}
        assert _answer(peers[3], wire.encode(wire.PBT_STATE, state, member=3, request=0,
                                             hyperparameters={"lr": 1e-3}, updates=5)) == "ok"
        _next(peers[0], wire.PBT_LOAD)
        assert _answer(peers[0], wire.encode(
            wire.PBT_LOADED, member=0, request=0, donor=3, donor_updates=5,
            hyperparameters={"lr": 1e-3})) == "ok"
        while True:  # the controller's hello and heartbeats may come first
            assert league.poll(30_000), "no exploited message reached the league"
            msg = wire.decode(sockets.split_envelope(league.recv_multipart())[1])
            if msg.type == wire.EXPLOITED:
                break
        assert (msg.fields["recipient"], msg.fields["donor"]) == (0, 3)
    finally:
        league.close()


def test_a_league_link_must_name_a_games_port(tmp_path):
    path = write_topology(tmp_path, "pbt_seed.yaml",
                          nodes={"pbt": {"kind": "pbt", "links": {"league": "nowhere.games"}}})
    with pytest.raises(TopologyError, match="nowhere"):
        load(path)


def test_a_member_is_ranked_only_by_episodes_since_its_last_load():
    """The episodes before a load were the replaced policy's: a recipient reports no
    return until five of its own have finished, then the mean of its own only."""
    from zmqrl.bus.metrics import EpisodeStats
    from zmqrl.parts.learning.pbt_member import ranked_returns, return_summary

    def ranked_return(episodes: EpisodeStats, at_load: int) -> float | None:
        """The mean return a report carries (None: the report has none)."""
        return return_summary(ranked_returns(episodes, at_load)).get("mean_return")

    episodes = EpisodeStats()
    episodes.add(np.full(30, 10.0), np.full(30, 10))  # the old policy's
    assert ranked_return(episodes, at_load=0) == 10.0
    at_load = episodes.count  # it loads a donor's state here
    episodes.add(np.full(4, 200.0), np.full(4, 200))
    assert ranked_return(episodes, at_load) is None  # 4 of its own: not ranked yet
    episodes.add(np.full(1, 200.0), np.full(1, 200))
    assert ranked_return(episodes, at_load) == 200.0  # 5: its own, none of the old
    episodes.add(np.full(30, 100.0), np.full(30, 100))
    assert ranked_return(episodes, at_load) == 100.0  # then the last 20
