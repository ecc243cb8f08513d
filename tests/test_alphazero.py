"""AlphaZero on the bus: OpenSpiel games as env ids, batched MCTS, leaf evaluation in the
inference broker, and a short real run that moves self-play games into the replay and
trains on them."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("pyspiel")

from zmqrl.bus import messages, wire  # noqa: E402
from zmqrl.parts.acting import ActingSetup, act_batched, behaviour_for  # noqa: E402
from zmqrl.parts.alphazero.config import AlphaZeroConfig  # noqa: E402
from zmqrl.parts.alphazero.learner import AlphaZeroLearner  # noqa: E402
from zmqrl.parts.envs import env_spec  # noqa: E402
from zmqrl.parts.games import Game, GameEnv, env_id, game_name  # noqa: E402
from zmqrl.parts.models import build_model  # noqa: E402
from zmqrl.parts.search.mcts import (  # noqa: E402
    BatchedMCTS,
    SearchParams,
    SelfPlay,
    search,
    uniform_for,
)
from zmqrl.parts.search.minimax import Minimax  # noqa: E402
from zmqrl.run.topology import TopologyError, from_dict  # noqa: E402

from conftest import REPO, read_csv  # noqa: E402

pytestmark = pytest.mark.minutes(1.2)  # tests/conftest.py: long modules first

TTT = env_id("tic_tac_toe")


def test_search_takes_the_win_and_blocks_with_uniform_priors():
    """Plain PUCT (equal priors, value 0 at every leaf): the game's own ends make the
    search find a win in one and the one move that stops the opponent's, for either
    player."""
    game = Game("tic_tac_toe")
    params = SearchParams(num_simulations=200, dirichlet_fraction=0.0)
    positions = {
        2: game.state_from([0, 3, 1, 4]),  # x (0, 1) to move: 2 wins
        6: game.state_from([0, 4, 8, 2]),  # x (0, 8) to move: o (4, 2) wins at 6 unless
        5: game.state_from([0, 3, 1, 4, 8]),  # o (3, 4) to move: 5 wins at once
    }
    visits = search(game, list(positions.values()), uniform_for(game), params)
    for (move, state), row in zip(positions.items(), visits, strict=True):
        assert row.sum() == params.num_simulations
        assert row.argmax() == move and row[move] > 0.6 * row.sum(), (str(state), row)
        assert (row[~game.legal_mask(state)] == 0).all()
    # each game's tree is its own: searched alone, a position gets the same visits
    for row, state in zip(visits, positions.values(), strict=True):
        np.testing.assert_array_equal(search(game, [state], uniform_for(game), params)[0], row)
    # what a perfect player says of the same positions
    minimax = Minimax()
    best = [minimax.best_actions(s) for s in positions.values()]
    assert best[:2] == [[2], [6]] and 5 in best[2]  # (o at 2 would win too, a move later)
    assert minimax.value(game.new_state()) == 0.0  # tic-tac-toe is a draw


def test_self_play_records_positions_visits_and_outcomes():
    game = Game("tic_tac_toe")
    play = SelfPlay(game, 8, SearchParams(num_simulations=8), seed=3)
    evaluate = uniform_for(game)
    while play.games_played < 8:
        obs = play.leaves()
        assert obs.shape[1:] == game.obs_shape and 1 <= len(obs) <= 8
        play.feed(*evaluate(obs))
    records = play.take_finished()
    assert len(records) >= 8 and play.simulations >= 8 * play.moves
    for r in records:
        t = np.arange(len(r.outcome))
        assert np.allclose(r.policy.sum(-1), 1.0)
        # seen by the player to move: own pieces first, the opponent's second
        assert (r.obs[:, 0].sum((1, 2)) == t // 2).all()
        assert (r.obs[:, 1].sum((1, 2)) == (t + 1) // 2).all()
        assert (r.outcome == np.where(t % 2 == 0, r.returns[0], r.returns[1])).all()
        assert r.returns[0] == -r.returns[1]


def _play(game: Game, params: SearchParams, games: int = 8) -> list:
    play, evaluate = SelfPlay(game, games, params, seed=3), uniform_for(game)
    while play.games_played < games:
        play.feed(*evaluate(play.leaves()))
    return play.take_finished()


def test_observations_are_what_pyspiel_says_each_player_sees():
    """The leaves' observations come from OpenSpiel's reused observation buffer (fast):
    they equal pyspiel's ``observation_tensor`` lists for every position and player, in
    the net's plane order; and a single observation is a copy, not a view of the buffer
    the next call overwrites."""
    rng = np.random.default_rng(0)
    for name in ("tic_tac_toe", "connect_four"):
        game = Game(name)
        states = []
        for _ in range(60):
            state = game.new_state()
            for _ in range(int(rng.integers(0, 12))):
                if state.is_terminal():
                    break
                state.apply_action(int(rng.choice(state.legal_actions())))
            states.append(state)
        players = rng.integers(0, 2, len(states))
        expected = []
        for state, player in zip(states, players.tolist(), strict=True):
            planes = np.array(state.observation_tensor(player), np.float32)
            planes = planes.reshape(game.obs_shape)
            expected.append(planes if game._planes is None else planes[game._planes[player]])
        np.testing.assert_array_equal(game.observations(states, players), np.stack(expected))
        first = game.observation(states[-1], 0)
        kept = first.copy()
        game.observation(states[-2], 1)
        np.testing.assert_array_equal(first, kept)


def test_mirror_is_the_same_position_with_the_columns_reversed():
    game = Game("connect_four")
    obs = game.observation(game.state_from([0, 0, 1, 3]))
    policy = np.arange(7, dtype=np.float32) / 21
    m_obs, m_policy = game.mirror(obs[None], policy[None])
    assert np.array_equal(m_obs[0], game.observation(game.state_from([6, 6, 5, 3])))
    assert np.array_equal(m_policy[0], policy[::-1])
    ttt = Game("tic_tac_toe")
    # X in the top-left corner, O in the centre of the top row -> X top-right
    m_obs, m_policy = ttt.mirror(ttt.observation(ttt.state_from([0, 1]))[None],
                                 np.eye(9, dtype=np.float32)[[0, 5]])
    assert np.array_equal(m_obs[0], ttt.observation(ttt.state_from([2, 1])))
    assert m_policy[0].argmax() == 2 and m_policy[1].argmax() == 3


def test_self_play_mirrors_games_and_mixes_the_root_value_into_the_target():
    game = Game("tic_tac_toe")
    plain = _play(game, SearchParams(num_simulations=8))
    # the same games (the options change what is recorded, not the play)
    mirrored = _play(game, SearchParams(num_simulations=8, mirror_games=True))
    for r, m in zip(plain, mirrored, strict=True):
        t = len(r.outcome)
        assert len(m.outcome) == 2 * t and m.returns == r.returns
        assert np.array_equal(m.obs[:t], r.obs) and np.array_equal(m.outcome[t:], r.outcome)
        m_obs, m_policy = game.mirror(r.obs, r.policy)
        assert np.array_equal(m.obs[t:], m_obs) and np.array_equal(m.policy[t:], m_policy)
    root = _play(game, SearchParams(num_simulations=8, value_target_mix=1.0))
    half = _play(game, SearchParams(num_simulations=8, value_target_mix=0.5))
    z = np.concatenate([r.outcome for r in plain])
    q = np.concatenate([r.outcome for r in root])
    assert np.allclose(np.concatenate([r.outcome for r in half]), (z + q) / 2, atol=1e-6)
    assert (np.abs(q) <= 1).all() and not np.array_equal(q, z)
    # a position one move from the end: the mover's search sees its win or its loss
    last = np.array([r.outcome[-1] for r in root])
    assert (np.sign(last) == np.sign([r.outcome[-1] for r in plain])).mean() > 0.5


def test_fast_searches_are_played_and_not_recorded():
    """Playout cap randomization: a quarter of the moves get the full search and are
    recorded, the rest the fast one; the recorded positions keep their outcome for the
    player to move, and the simulations add up to full and fast budgets exactly."""
    game = Game("tic_tac_toe")
    params = SearchParams(num_simulations=16, full_search_fraction=0.25, fast_simulations=4)
    play, evaluate = SelfPlay(game, 32, params, seed=5), uniform_for(game)
    while play.games_played < 32:
        play.feed(*evaluate(play.leaves()))
    records = play.take_finished()
    recorded = sum(len(r.outcome) for r in records)
    moves = sum(r.moves for r in records)
    assert 0 < len(records) <= play.games_played and 0.13 < recorded / moves < 0.37
    for r in records:
        assert len(r.outcome) <= r.moves <= 9 and np.allclose(r.policy.sum(-1), 1.0)
        # the pieces on the board tell each recorded position's move number, so its mover
        number = r.obs[:, :2].sum((1, 2, 3)).astype(int)
        assert (np.diff(number) > 0).all() and (number < r.moves).all()
        assert (r.outcome == np.where(number % 2 == 0, r.returns[0], r.returns[1])).all()
    # each search evaluates its root, then runs its budget of simulations through it
    full = recorded + sum(len(h) for h in play.history)
    mcts = play.mcts
    in_flight = mcts.root_visits(np.arange(32)).sum() + mcts.expanded[:, 0].sum()
    assert play.simulations == 17 * full + 5 * (play.moves - full) + in_flight
    # a fast search's root keeps the network's priors; a full one's gets noise
    mcts = BatchedMCTS(game, 2, SearchParams(num_simulations=4), np.random.default_rng(0))
    for slot, noise in enumerate((False, True)):
        mcts.reset(slot, game.new_state(), noise=noise)
    mcts.select(np.arange(2))
    mcts.expand(np.arange(2), np.zeros((2, 9), np.float32), np.zeros(2, np.float32))
    assert np.allclose(mcts.prior[0, 0], 1 / 9) and not np.allclose(mcts.prior[1, 0], 1 / 9)


def _check_tree(mcts: BatchedMCTS, slot: int) -> None:
    """Every edge of ``slot``'s tree leads to the state its move reaches, and every
    expanded node's visits are those of its children plus its own evaluation."""
    size, states = int(mcts.size[slot]), mcts.states[slot]
    for node in range(size):
        for move in np.flatnonzero(mcts.child[slot, node] >= 0).tolist():
            kid = int(mcts.child[slot, node, move])
            assert node < kid < size
            assert states[kid].history() == states[node].history() + [move]
            through = mcts.visits[slot, kid].sum()
            expected = through + 1 if mcts.expanded[slot, kid] else through
            assert mcts.visits[slot, node, move] >= expected
    assert all(s is None for s in states[size:]) and (mcts.child[slot, size:] < 0).all()


def test_a_kept_subtree_is_the_child_s_tree_and_saves_simulations():
    game = Game("connect_four")
    params = SearchParams(num_simulations=64, dirichlet_fraction=0.0)
    mcts = BatchedMCTS(game, 1, params, np.random.default_rng(0))
    mcts.reset(0, game.new_state(), noise=False)
    evaluate = uniform_for(game)
    while mcts.root_visits(np.arange(1))[0] < 64:
        mcts.select(np.arange(1))
        if mcts.leaf[0] >= 0:
            mcts.expand(np.arange(1), *evaluate(mcts.leaf_observations(np.arange(1))))
    _check_tree(mcts, 0)
    move = int(mcts.visits[0, 0].argmax())
    old = int(mcts.child[0, 0, move])
    below = mcts.visits[0, old].copy()
    state = game.new_state()
    state.apply_action(move)
    mcts.advance(0, move, state, noise=False)
    assert mcts.states[0][0].history() == [move]
    np.testing.assert_array_equal(mcts.visits[0, 0], below)
    assert mcts.root_visits(np.arange(1))[0] == below.sum() > 0
    _check_tree(mcts, 0)
    # a kept root of a full search gets its noise when it becomes the root
    noisy = BatchedMCTS(game, 1, replace(params, dirichlet_fraction=0.25),
                        np.random.default_rng(0))
    for array in ("child", "visits", "value_sum", "prior", "legal", "expanded", "size"):
        getattr(noisy, array)[:] = getattr(mcts, array)
    noisy.states = [list(mcts.states[0])]
    kid = int(np.flatnonzero(mcts.child[0, 0] >= 0)[0])
    before = mcts.prior[0, int(mcts.child[0, 0, kid])].copy()
    noisy.advance(0, kid, None, noise=True)
    assert not np.allclose(noisy.prior[0, 0], before)
    assert np.isclose(noisy.prior[0, 0].sum(), 1.0, atol=1e-5)
    # a move never evaluated starts a fresh tree
    mcts.reset(0, game.new_state())
    mcts.advance(0, move, state)
    assert mcts.size[0] == 1 and mcts.root_visits(np.arange(1))[0] == 0
    assert mcts.states[0][0].history() == [move]
    # self-play keeps the subtrees: the same number of moves for fewer evaluations
    for fraction in (1.0, 0.5):
        costs = []
        for reuse in (False, True):
            params = SearchParams(num_simulations=32, reuse_trees=reuse,
                                  full_search_fraction=fraction, fast_simulations=8)
            play = SelfPlay(game, 16, params, seed=1)
            while play.moves < 400:
                play.feed(*evaluate(play.leaves()))
            for slot in range(16):
                _check_tree(play.mcts, slot)
            for r in play.take_finished():
                number = r.obs[:, :2].sum((1, 2, 3)).astype(int)
                assert (r.outcome == np.where(number % 2 == 0, *r.returns)).all()
            costs.append(play.simulations / play.moves)
        assert costs[1] < 0.85 * costs[0], costs


def test_game_is_an_env_id():
    spec = env_spec({"id": TTT})
    assert (spec.obs_shape, spec.num_actions, spec.obs_dtype) == ((3, 3, 3), 9, np.float32)
    assert game_name({"id": env_id("connect_four")}) == "connect_four"
    with pytest.raises(ValueError, match="not an OpenSpiel game"):
        game_name({"id": "CartPole-v1"})
    env = gym.make(TTT)  # against a uniformly random opponent, in a random seat
    returns = []
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            assert obs.shape == (3, 3, 3) and info["legal_mask"].any()
            action = int(np.flatnonzero(info["legal_mask"])[0])
            obs, reward, done, _, info = env.step(action)
        returns.append(reward)
    assert set(returns) <= {-1.0, 0.0, 1.0} and len(set(returns)) > 1
    selfplay = GameEnv("tic_tac_toe", opponent="self")
    selfplay.reset(seed=0)
    _, reward, done, _, info = selfplay.step(0)
    assert (reward, done, info["player"]) == (0.0, False, 1)
    _, reward, done, _, info = selfplay.step(0)  # taken: the mover loses
    assert (reward, done, info["illegal"]) == (-1.0, True, True)


def test_evaluate_behaviour_batched_equals_alone():
    """The broker's behaviour for search: the leaves of several connections in one
    forward pass give each the same logits and values as alone, in the reply."""
    spec = env_spec({"id": TTT})
    model = build_model({"kind": "pv_mlp", "hidden": [32]}, spec, seed=0)
    cls = behaviour_for(AlphaZeroConfig)  # (the 'search' family has MuZero's too)
    setup = ActingSetup(spec, model, AlphaZeroConfig())
    rng = np.random.default_rng(0)
    obs = [rng.integers(0, 2, (n, 3, 3, 3)).astype(np.float32) for n in (2, 5)]
    together = [cls(setup, len(o)) for o in obs]
    for b, o in zip(together, obs, strict=True):
        b.observe(o)
    act_batched(model, together, 0)
    for b, o in zip(together, obs, strict=True):
        alone = cls(setup, len(o))
        alone.observe(o)
        (action,) = act_batched(model, [alone], 0)
        reply, single = b.reply(action), alone.reply(action)
        np.testing.assert_allclose(reply["logits"], single["logits"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(reply["value"], single["value"], rtol=1e-5, atol=1e-6)
        logits, value = model(torch.from_numpy(o))
        np.testing.assert_allclose(reply["logits"], logits.detach().numpy(), atol=1e-5)
        msg = wire.decode(wire.encode(wire.ACT, reply, seq=1))
        ctx = messages.Context.from_env(spec)
        assert messages.check(msg, messages.spec(wire.ACT, "evaluation"), ctx)["n"] == len(o)


def test_learner_fits_visit_counts_and_outcomes():
    spec = env_spec({"id": TTT})
    model = build_model({"kind": "pv_mlp", "hidden": [64]}, spec, seed=0)
    learner = AlphaZeroLearner(AlphaZeroConfig(lr=3e-3, l2=0.0, light_adam=True), model)
    rng = np.random.default_rng(1)
    policy = rng.dirichlet(np.ones(9), 32).astype(np.float32)
    batch = {"obs": torch.from_numpy(rng.integers(0, 2, (32, 3, 3, 3)).astype(np.float32)),
             "policy": torch.from_numpy(policy),
             "outcome": torch.from_numpy(rng.choice([-1.0, 0.0, 1.0], 32).astype(np.float32))}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the learner node runs (two threads crawl on a busy machine)
    try:
        first = learner.update(batch)
        for _ in range(150):
            last = learner.update(batch)
    finally:
        torch.set_num_threads(threads)
    assert last["loss"] < first["loss"]
    assert last["policy_kl"] < 0.2 * first["policy_kl"]
    assert last["value_loss"] < 0.2 * first["value_loss"]


def test_conv_net_acts_channels_last_with_plain_parameters():
    """pv_conv runs its activations channels-last (faster on CPU) and gives what the
    same layers give on plain NCHW tensors; its parameters stay C-contiguous arrays, so
    they cross the wire and load into another copy unchanged; and it still learns."""
    from zmqrl.parts.models import load_state_arrays, state_arrays

    spec = env_spec({"id": env_id("connect_four")})
    model = build_model({"kind": "pv_conv", "hidden": 16}, spec, seed=0)
    rng = np.random.default_rng(2)
    obs = torch.from_numpy(rng.integers(0, 2, (5, *spec.obs_shape)).astype(np.float32))
    logits, value = model(obs)
    plain = model.blocks(model.stem(obs.contiguous()))  # the layers without the switch
    np.testing.assert_allclose(logits.detach().numpy(), model.policy(plain).detach().numpy(),
                               atol=1e-5)
    np.testing.assert_allclose(value.detach().numpy(),
                               torch.tanh(model.value(plain)).squeeze(-1).detach().numpy(),
                               atol=1e-5)
    arrays = state_arrays(model)
    assert all(a.flags["C_CONTIGUOUS"] for a in arrays.values())
    copy = build_model({"kind": "pv_conv", "hidden": 16}, spec, seed=1)
    load_state_arrays(copy, wire.decode(wire.encode(wire.PARAMS, arrays, version=1)).arrays)
    np.testing.assert_array_equal(copy(obs)[0].detach().numpy(), logits.detach().numpy())

    learner = AlphaZeroLearner(AlphaZeroConfig(lr=3e-3, l2=0.0, light_adam=True), model)
    batch = {"obs": obs, "policy": torch.from_numpy(rng.dirichlet(np.ones(7), 5)
                                                    .astype(np.float32)),
             "outcome": torch.tensor([1.0, -1.0, 0.0, 1.0, -1.0])}
    first = learner.update(batch)
    for _ in range(60):
        last = learner.update(batch)
    assert last["policy_kl"] < 0.2 * first["policy_kl"]
    assert last["value_loss"] < 0.2 * first["value_loss"]


def test_learner_anneals_the_lr_and_resumes_the_schedule_from_its_checkpoint():
    spec = env_spec({"id": TTT})
    model = build_model({"kind": "pv_mlp", "hidden": [8]}, spec, seed=0)
    cfg = AlphaZeroConfig(lr=0.1, lr_final=0.02, anneal_updates=4, light_adam=True)
    learner = AlphaZeroLearner(cfg, model)
    rng = np.random.default_rng(0)
    batch = {"obs": torch.from_numpy(rng.integers(0, 2, (4, 3, 3, 3)).astype(np.float32)),
             "policy": torch.full((4, 9), 1 / 9), "outcome": torch.zeros(4)}
    lrs = [learner.update(batch)["lr"] for _ in range(3)]
    restored = AlphaZeroLearner(cfg, model)
    restored.load_state_dict(learner.state_dict())
    lrs += [restored.update(batch)["lr"] for _ in range(3)]
    np.testing.assert_allclose(lrs, [0.1, 0.08, 0.06, 0.04, 0.02, 0.02])
    assert AlphaZeroLearner(AlphaZeroConfig(lr=0.1), model).update(batch)["lr"] == 0.1


def test_validate_checks_the_search_actor():
    raw = yaml.safe_load((REPO / "topologies" / "alphazero.yaml").read_text())
    from_dict(raw)  # the repository's topology is valid
    raw["algo"] = {"kind": "dqn"}
    raw["model"] = {"kind": "dueling_mlp"}
    raw["env"] = {"id": "CartPole-v1"}
    with pytest.raises(TopologyError) as err:
        from_dict(raw)
    text = str(err.value)
    assert "searches with algo 'alphazero'" in text and "not an OpenSpiel game" in text
    raw = yaml.safe_load((REPO / "topologies" / "alphazero.yaml").read_text())
    raw["algo"].update(mirror_games=True, value_target_mix=1.5, anneal_updates=-1,
                       full_search_fraction=0.0, num_simulations=16, fast_simulations=32)
    raw["env"]["kwargs"] = {"game": "breakthrough"}
    with pytest.raises(TopologyError) as err:
        from_dict(raw)
    text = str(err.value)
    assert "breakthrough has no known mirror symmetry" in text
    assert "'algo.value_target_mix': 1.5: must be in [0, 1]" in text
    assert "'algo.anneal_updates': -1: must be >= 0" in text
    assert "'algo.full_search_fraction': 0.0: must be in (0, 1]" in text
    assert "'algo.fast_simulations': 32: must be <= num_simulations (16)" in text
    raw = yaml.safe_load((REPO / "topologies" / "alphazero.yaml").read_text())
    raw["algo"].update(reuse_trees=True, full_search_fraction=0.25, fast_simulations=12)
    params = SearchParams.of(from_dict(raw).algo_config)
    assert (params.reuse_trees, params.full_search_fraction, params.fast_simulations) == \
        (True, 0.25, 12)


def _topology(tmp_path, raw: dict) -> str:
    path = tmp_path / "alphazero.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _rows(run_dir, label: str) -> list[dict[str, str]]:
    return read_csv(run_dir / "metrics" / f"{label}.csv")


def test_leaves_of_two_actors_share_one_forward_pass(processes, tmp_path):
    """Two actors of one game each (one leaf per request): the broker's forward passes
    carry more than one leaf, so the leaves of both actors were evaluated together."""
    raw = yaml.safe_load((REPO / "topologies" / "alphazero.yaml").read_text())
    raw["env"] = {"id": TTT}
    raw["algo"].update(num_simulations=8, fast_simulations=2)
    raw["nodes"] = {
        "broker": {"kind": "inference_broker", "args": {"max_batch": 2, "max_wait_ms": 20.0}},
        "actor": {"kind": "mcts_actor", "replicas": 2, "args": {"games": 1, "lanes": 1},
                  "links": {"policy": "broker.policy"}},
    }
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("up", _topology(tmp_path, raw), "--run-dir", str(run_dir),
                           "--max-steps", "200", "--max-seconds", "60",
                           log=tmp_path / "up.log")
    assert proc.wait(timeout=120) == 0, (tmp_path / "up.log").read_text()[-3000:]
    broker = _rows(run_dir, "broker")
    assert max(float(r["batch_envs_mean"]) for r in broker) > 1.0, broker
    for replica in (0, 1):
        actor = _rows(run_dir, f"actor.{replica}")
        assert max(float(r["leaves_per_request"]) for r in actor) == 1.0
        assert int(actor[-1]["simulations"]) > 0 and int(actor[-1]["bad_messages"]) == 0


def test_alphazero_moves_games_into_the_replay_and_learns(processes, tmp_path):
    """A short real run of topologies/alphazero.yaml on tic-tac-toe, plus one actor that
    evaluates its leaves itself (``policy: local``): the actors' games reach the replay,
    the learner trains on them and its loss falls, and the local actor follows the
    learner's parameters."""
    raw = yaml.safe_load((REPO / "topologies" / "alphazero.yaml").read_text())
    raw["env"] = {"id": TTT}
    raw["model"] = {"kind": "pv_mlp", "hidden": [64, 64]}
    raw["algo"].update(num_simulations=16, fast_simulations=4, temperature_moves=3,
                       batch_size=64)
    raw["nodes"]["replay"]["args"].update(min_size=200)
    raw["nodes"]["actor"]["args"].update(games=16)
    raw["nodes"]["local_actor"] = {
        "kind": "mcts_actor", "args": {"policy": "local", "games": 16, "lanes": 1},
        "links": {"experience": "replay.experience", "params": "learner.params"}}
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("up", _topology(tmp_path, raw), "--run-dir", str(run_dir),
                           "--max-seconds", "30", log=tmp_path / "up.log")
    assert proc.wait(timeout=120) == 0, (tmp_path / "up.log").read_text()[-3000:]
    replay = _rows(run_dir, "replay")
    assert int(replay[-1]["inserts"]) >= 200 and int(replay[-1]["bad_messages"]) == 0
    learner = [r for r in _rows(run_dir, "learner") if r.get("loss")]
    assert int(learner[-1]["updates"]) >= 20, learner[-1]
    losses = [float(r["loss"]) for r in learner]
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    actors = [_rows(run_dir, label)[-1] for label in ("actor.0", "actor.1", "local_actor")]
    assert all(int(a["games"]) > 0 and int(a["positions_sent"]) > 0 for a in actors)
    assert int(actors[2]["param_version"]) > 0  # the local actor searched with new params
