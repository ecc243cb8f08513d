"""MuZero's search in a learned model (zmqrl.parts.muzero.search): pUCT with min-max
normalized Q and discounted backup, checked by hand on a tiny deterministic model; root
noise; choosing the move; the in-process search, batched or one row per call; and
several trees at once searching as each would alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from zmqrl.parts.muzero.search import LatentMCTS, SearchParams, choose_action, search, softmax


# ----- a tiny model: the latent is the last action taken --------------------------------
def last_action_initial(obs: np.ndarray):
    m = len(obs)
    return np.full((m, 1), -1.0), np.zeros((m, 2)), np.zeros(m)


def last_action_recurrent(latent: np.ndarray, action: np.ndarray):
    """Action 0 pays 1 and leads to a state worth 0; action 1 pays 0 and leads to a state
    worth 3. Uniform priors everywhere."""
    m = len(action)
    reward = (action == 0).astype(np.float64)
    value = np.where(action == 1, 3.0, 0.0)
    return action[:, None].astype(np.float64), reward, np.zeros((m, 2)), value


def test_search_by_hand_on_a_two_action_model():
    """Six simulations, discount 0.5, no noise, traced by hand. c(N) is pUCT's
    pb_c_init + log((N + pb_c_base + 1) / pb_c_base) = 1.25 + ~5e-5 (N + 1).
    N(s): the root's simulations so far; another node's visits, its own evaluation first.

    1. Root N=0 (counted as 1): equal priors, equal scores, the tie goes to action 0 ->
       node 1 (r 1, v 0).
       Edge (0,0) adds 1 + 0.5*0 = 1: Q(0,0) = 1; min = max = 1.
    2. Root N=1: a0 scores Q 1 (max <= min: Q as is) + 0.5*1/2*c = 1.31; a1 0.5*1*c = 0.63
       -> a0, to node 1 (N=1, nothing visited, tie) -> a0: node 2 (r 1, v 0).
       Edge (1,0) adds 1; edge (0,0) adds 1 + 0.5*1 = 1.5: Q(0,0) = 2.5/2 = 1.25.
       min 1, max 1.25.
    3. Root N=2: a0 Qn (1.25-1)/0.25 = 1, + 0.5*sqrt2/3*c = 1.295; a1 0.5*sqrt2*c = 0.884
       -> a0. Node 1 (N=2): (1,0) Qn 0 + 0.5*sqrt2/2*c = 0.442; (1,1) 0.884 -> a1: node 3
       (r 0, v 3). Edge (1,1) adds 0 + 0.5*3 = 1.5; edge (0,0) 1 + 0.5*1.5 = 1.75:
       Q(0,0) = 4.25/3 = 1.4167. min 1, max 1.5.
    4. Root N=3: a0 Qn 0.4167/0.5 = 0.8333 + 0.5*sqrt3/4*c = 1.1040; a1 0.5*sqrt3*c = 1.0827
       -> a0. Node 1 (N=3): (1,0) Qn 0 + 0.541; (1,1) Qn 1 + 0.541 -> a1, to node 3 (N=1,
       tie) -> a0: node 4 (r 1, v 0). Edge (3,0) adds 1; (1,1) 0 + 0.5*1 = 0.5: Q(1,1) =
       2/2 = 1; (0,0) 1 + 0.5*0.5 = 1.25: Q(0,0) = 5.5/4 = 1.375. min 1, max 1.5 still.
    5. Root N=4: a0 Qn 0.375/0.5 = 0.75 + 0.5*2/5*c = 1.00005; a1 0.5*2*c = 1.25025 -> a1:
       node 5 (r 0, v 3). Edge (0,1) adds 0 + 0.5*3 = 1.5.
    6. Root N=5: a0 0.75 + 0.5*sqrt5/5*c = 1.030; a1 Qn 1 + 0.5*sqrt5/2*c = 1.699 -> a1, to
       node 5 (N=1, tie) -> a0: node 6 (r 1, v 0). Edge (5,0) adds 1; (0,1) 0 + 0.5*1 =
       0.5: Q(0,1) = 2/2 = 1.
    Root: visits (4, 2); value (5.5 + 2) / 6 = 1.25."""
    params = SearchParams(num_simulations=6, discount=0.5, dirichlet_fraction=0.0)
    mcts = LatentMCTS(1, 2, params, np.random.default_rng(0))
    # (the root's value 1 opens the min-max range: the same as the first Q below)
    mcts.set_roots(np.zeros((1, 2)), np.array([1.0]))
    assert mcts.root_value()[0] == 1.0  # the model's, until a simulation is done
    expected = [(0, 0, 1), (1, 0, 2), (1, 1, 3), (3, 0, 4), (0, 1, 5), (5, 0, 6)]
    for step, want in enumerate(expected):
        assert not mcts.done
        parent, action, node = mcts.select()
        assert (int(parent[0]), int(action[0]), int(node[0])) == want, step
        assert parent.dtype == action.dtype == node.dtype == np.int64
        _, reward, logits, value = last_action_recurrent(None, action)
        mcts.expand(reward, logits, value)
    assert mcts.done and mcts.simulations == 6
    np.testing.assert_array_equal(mcts.root_visits(), [[4, 2]])
    assert mcts.root_value()[0] == pytest.approx(1.25, abs=1e-12)
    assert (mcts.q_min[0], mcts.q_max[0]) == (1.0, 1.5)
    # the edge means along the way
    q = mcts.value_sum[0] / np.maximum(mcts.visits[0], 1)
    assert q[0, 0] == pytest.approx(1.375) and q[0, 1] == pytest.approx(1.0)
    assert q[1, 0] == pytest.approx(1.0) and q[1, 1] == pytest.approx(1.0)
    with pytest.raises(RuntimeError):
        mcts.select()  # its simulations are done
    # the same through search(), which keeps the latents itself (root value 1 as above)
    def initial(obs: np.ndarray):
        latent, logits, value = last_action_initial(obs)
        return latent, logits, value + 1.0

    visits, value = search(initial, last_action_recurrent, np.zeros((1, 3)), params,
                           np.random.default_rng(0))
    np.testing.assert_array_equal(visits, [[4, 2]])
    assert value[0] == pytest.approx(1.25, abs=1e-12)


def test_select_and_expand_in_order():
    mcts = LatentMCTS(2, 2, SearchParams(num_simulations=2), np.random.default_rng(0))
    with pytest.raises(RuntimeError):
        mcts.select()  # no roots yet
    mcts.set_roots(np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(RuntimeError):
        mcts.expand(np.zeros(2), np.zeros((2, 2)), np.zeros(2))  # nothing selected
    mcts.select()
    with pytest.raises(RuntimeError):
        mcts.select()  # the last selection is not evaluated
    with pytest.raises(ValueError):
        mcts.set_roots(np.zeros((3, 2)), np.zeros(3))  # not one row per slot


def test_min_max_normalization_makes_the_search_indifferent_to_reward_scale():
    """Rewards of 100 and 200 (values 0, uniform priors): pUCT on raw Q would score the
    first action tried at >= 100 against an exploration term below 3 for the other and
    never try it. Normalized, the search explores and prefers the better action, and
    makes the same choices as with rewards of 1 and 2."""
    params = SearchParams(num_simulations=30, dirichlet_fraction=0.0)

    def scaled(k: float):
        def recurrent(latent: np.ndarray, action: np.ndarray):
            m = len(action)
            return latent, k * (action + 1.0), np.zeros((m, 2)), np.zeros(m)
        return recurrent

    large, value = search(last_action_initial, scaled(100.0), np.zeros((1, 1)), params,
                          np.random.default_rng(0))
    small, small_value = search(last_action_initial, scaled(1.0), np.zeros((1, 1)), params,
                                np.random.default_rng(0))
    np.testing.assert_array_equal(large, small)
    assert large[0, 1] > large[0, 0] > 0 and large.sum() == 30
    assert value[0] == pytest.approx(100 * small_value[0])
    # the first action tried, 0, got its Q of 100 first; action 1 has its turn at the
    # root by the fifth simulation all the same
    mcts = LatentMCTS(1, 2, params, np.random.default_rng(0))
    mcts.set_roots(np.zeros((1, 2)), np.zeros(1))
    choices = []
    while len(choices) < 5:
        parent, action, _ = mcts.select()
        choices.append((int(parent[0]), int(action[0])))
        mcts.expand(100.0 * (action + 1.0), np.zeros((1, 2)), np.zeros(1))
    assert choices == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]


def test_root_noise():
    """Dirichlet noise changes the root's priors only with a positive fraction (and
    ``noise``), keeps them a distribution, and never reaches the nodes below."""
    logits = np.array([[0.0, 1.0, 2.0, -1.0], [3.0, 0.0, 0.0, 0.0]])
    clean = softmax(logits)
    for fraction, noise in ((0.0, True), (0.25, False)):
        mcts = LatentMCTS(2, 4, SearchParams(num_simulations=3, dirichlet_fraction=fraction),
                          np.random.default_rng(0))
        mcts.set_roots(logits, np.zeros(2), noise=noise)
        np.testing.assert_array_equal(mcts.prior[:, 0], clean)
    params = SearchParams(num_simulations=3, dirichlet_fraction=0.25, dirichlet_alpha=0.3)
    mcts = LatentMCTS(2, 4, params, np.random.default_rng(0))
    mcts.set_roots(logits, np.zeros(2))
    prior = mcts.prior[:, 0].copy()
    assert not np.allclose(prior, clean)
    np.testing.assert_allclose(prior.sum(-1), 1.0)
    noise = (prior - 0.75 * clean) / 0.25  # P = (1 - f) P + f * noise
    assert (noise >= -1e-12).all()
    np.testing.assert_allclose(noise.sum(-1), 1.0)
    assert not np.allclose(noise[0], noise[1])  # a draw per root
    # a fresh search draws fresh noise
    mcts.set_roots(logits, np.zeros(2))
    assert not np.allclose(mcts.prior[:, 0], prior)
    # below the root: the model's priors as they are
    parent, action, node = mcts.select()
    mcts.expand(np.zeros(2), logits, np.zeros(2))
    np.testing.assert_array_equal(mcts.prior[[0, 1], node], clean)


def test_choose_action_greedy_breaks_ties_at_random():
    visits = np.tile([3.0, 5.0, 5.0, 1.0], (400, 1))
    picks = choose_action(visits, 0.0, np.random.default_rng(1))
    assert picks.dtype == np.int64 and set(picks.tolist()) == {1, 2}
    assert 120 < (picks == 1).sum() < 280
    seen = {int(choose_action(visits[:1], 0.0, np.random.default_rng(seed))[0])
            for seed in range(20)}
    assert seen == {1, 2}
    np.testing.assert_array_equal(choose_action(np.array([[0, 9, 2], [7, 1, 0]]), 0.0,
                                                np.random.default_rng(0)), [1, 0])


def test_choose_action_samples_in_proportion():
    rng = np.random.default_rng(2)
    draws = 20000
    visits = np.tile([1.0, 0.0, 3.0, 6.0], (draws, 1))
    freq = np.bincount(choose_action(visits, 1.0, rng), minlength=4) / draws
    np.testing.assert_allclose(freq, [0.1, 0.0, 0.3, 0.6], atol=0.015)
    assert freq[1] == 0  # never an unvisited action
    # T = 0.5: in proportion to N^2 = (1, 0, 9, 36) / 46
    freq = np.bincount(choose_action(visits, 0.5, rng), minlength=4) / draws
    np.testing.assert_allclose(freq, np.array([1, 0, 9, 36]) / 46, atol=0.015)
    # a tiny temperature neither overflows nor picks anything but the most visited
    assert (choose_action(visits[:100] * 1000, 1e-3, rng) == 3).all()


# ----- a model whose numbers depend on its latent: trees that differ per root ----------
A, L = 3, 4
_weights = np.random.default_rng(7).normal(size=(A, L, L))
_head = np.random.default_rng(8).normal(size=(L, A + 2))


def make_model(calls: dict[str, int] | None = None):
    """Deterministic callables, row by row (the same row gives the same answer alone or
    in a batch); ``calls`` counts their calls."""
    calls = calls if calls is not None else {}
    calls.setdefault("initial", 0)
    calls.setdefault("recurrent", 0)

    def heads(latent: np.ndarray):
        out = (latent[:, :, None] * _head[None]).sum(1)
        return out[:, :A], out[:, A], out[:, A + 1]  # logits, value, reward

    def initial(obs: np.ndarray):
        calls["initial"] += 1
        latent = np.tanh(obs.reshape(len(obs), L))
        logits, value, _ = heads(latent)
        return latent, logits, value

    def recurrent(latent: np.ndarray, action: np.ndarray):
        calls["recurrent"] += 1
        nxt = np.tanh((latent[:, :, None] * _weights[action]).sum(1) + 0.1 * action[:, None])
        logits, value, reward = heads(nxt)
        return nxt, reward, logits, value
    return initial, recurrent


def observations(n: int) -> np.ndarray:
    return np.random.default_rng(3).normal(size=(n, 2, 2)).astype(np.float32)


def test_one_by_one_searches_the_same_and_calls_per_row():
    params = SearchParams(num_simulations=8)  # root noise on: the same seed, the same draws
    obs = observations(5)
    batched_calls: dict[str, int] = {}
    visits, value = search(*make_model(batched_calls), obs, params, np.random.default_rng(4))
    assert batched_calls == {"initial": 1, "recurrent": 8}  # once per round
    single_calls: dict[str, int] = {}
    visits1, value1 = search(*make_model(single_calls), obs, params, np.random.default_rng(4),
                             one_by_one=True)
    assert single_calls == {"initial": 5, "recurrent": 5 * 8}  # once per slot per round
    np.testing.assert_array_equal(visits1, visits)
    np.testing.assert_allclose(value1, value, rtol=1e-12)
    assert visits.shape == (5, A) and (visits.sum(-1) == 8).all()


def test_slots_search_as_each_would_alone():
    """Vectorized over slots: each tree gets what it gets searched by itself."""
    params = SearchParams(num_simulations=12, dirichlet_fraction=0.0)
    obs = observations(6)
    visits, value = search(*make_model(), obs, params, np.random.default_rng(0))
    assert len({tuple(row) for row in visits.tolist()}) > 1  # the trees differ
    for i in range(len(obs)):
        alone, alone_value = search(*make_model(), obs[i:i + 1], params,
                                    np.random.default_rng(0))
        np.testing.assert_array_equal(alone[0], visits[i])
        np.testing.assert_allclose(alone_value[0], value[i], rtol=1e-12)
    # and the trees themselves, node by node
    initial, recurrent = make_model()
    trees = []
    for rows in (obs, *(obs[i:i + 1] for i in range(len(obs)))):
        latent, logits, root_value = initial(rows)
        mcts = LatentMCTS(len(rows), A, params, np.random.default_rng(0))
        mcts.set_roots(logits, root_value)
        latents = np.zeros((len(rows), params.num_simulations + 1, L))
        latents[:, 0] = latent
        index = np.arange(len(rows))
        while not mcts.done:
            parent, action, node = mcts.select()
            latent, reward, logits, v = recurrent(latents[index, parent], action)
            latents[index, node] = latent
            mcts.expand(reward, logits, v)
        trees.append(mcts)
    together = trees[0]
    for i, alone in enumerate(trees[1:]):
        np.testing.assert_array_equal(alone.child[0], together.child[i])
        np.testing.assert_array_equal(alone.visits[0], together.visits[i])
        np.testing.assert_allclose(alone.value_sum[0], together.value_sum[i], rtol=1e-12)
        assert alone.q_min[0] == pytest.approx(together.q_min[i])
        assert alone.q_max[0] == pytest.approx(together.q_max[i])
    assert together.simulations == len(obs) * params.num_simulations


def test_search_params_of_a_config():
    cfg = SimpleNamespace(num_simulations=7, discount=0.9, lr=1e-3, temperature=0.0)
    params = SearchParams.of(cfg, dirichlet_fraction=0.0)
    assert (params.num_simulations, params.discount, params.temperature) == (7, 0.9, 0.0)
    assert params.dirichlet_fraction == 0.0 and params.pb_c_init == 1.25
