"""MuZero's acting parts in one process: the targets an episode's positions become, a
lane's rounds of queries, and the broker's behaviour that keeps the latents."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zmqrl.bus import messages, wire
from zmqrl.parts.acting import ActingSetup, act_batched
from zmqrl.parts.envs import env_spec, make_vector_env
from zmqrl.parts.muzero.acting import SEARCH_AGAIN, LatentSearchBehaviour
from zmqrl.parts.muzero.config import MuZeroConfig
from zmqrl.parts.muzero.models import MuZeroMLP
from zmqrl.parts.muzero.search import SearchParams
from zmqrl.parts.muzero.selfplay import LatentLane, Targets

torch.set_num_threads(1)
A = 2


def _add(targets: Targets, rewards: list[float], values: list[float]) -> None:
    for t, (r, v) in enumerate(zip(rewards, values, strict=True)):
        policy = np.eye(A, dtype=np.float32)[t % A]
        targets.add(0, np.full(4, t, np.float32), t % A, r, policy, v)


def test_targets_by_hand_while_the_episode_goes_on():
    """K = 2, n = 2, γ = 0.5: position 0 ships once position 0 + K + n = 4 is searched,
    with z_s = r_s + γ r_{s+1} + γ² ν_{s+2}."""
    targets = Targets(1, A, unroll_steps=2, td_steps=2, discount=0.5)
    rewards, values = [1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 20.0, 30.0, 40.0, 50.0]
    _add(targets, rewards[:4], values[:4])
    assert targets.take() is None  # position 0's targets need ν_4
    _add(targets, rewards[4:], values[4:])
    item = targets.take()
    assert item is not None and len(item["obs"]) == 1
    z = [1 + 0.5 * 2 + 0.25 * 30, 2 + 0.5 * 3 + 0.25 * 40, 3 + 0.5 * 4 + 0.25 * 50]
    np.testing.assert_allclose(item["value"][0], z)
    np.testing.assert_array_equal(item["action"][0], [0, 1])
    np.testing.assert_array_equal(item["reward"][0], [1.0, 2.0])
    np.testing.assert_array_equal(item["policy"][0], np.eye(A)[[0, 1, 0]])
    assert item["mask"].all()
    np.testing.assert_allclose(item["priority"], [abs(10 - z[0]) + 1e-3])
    np.testing.assert_array_equal(item["obs"][0], np.zeros(4))


def test_targets_at_a_terminal_end_and_a_time_limit():
    """A terminal state bootstraps nothing and masks what lies past it; a time limit
    bootstraps from the last searched value."""
    targets = Targets(1, A, unroll_steps=2, td_steps=2, discount=0.5)
    _add(targets, [1.0, 1.0, 1.0], [4.0, 4.0, 4.0])
    targets.end(0, truncated=False)
    item = targets.take()
    assert len(item["obs"]) == 3  # every position, now final
    # z_0 = 1 + 0.5 + 0.25 ν_2 = 2.5; z_1 = 1 + 0.5 = 1.5 (ν_3 past the end: terminal)
    np.testing.assert_allclose(item["value"][:, 0], [2.5, 1.5, 1.0])
    np.testing.assert_array_equal(item["mask"], [[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(item["value"][2], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(item["reward"][2], [1.0, 0.0])
    np.testing.assert_allclose(item["policy"][2, 1:], 0.5)  # uniform past the end
    targets.end(0, truncated=False)
    assert targets.take() is None

    _add(targets, [1.0, 1.0, 1.0], [4.0, 4.0, 4.0])
    targets.end(0, truncated=True)
    item = targets.take()
    # a time limit is no terminal state: the last searched value ν_2 (which counts r_2
    # already) bootstraps: z_1 = r_1 + 0.5 ν_2 = 3, z_2 = ν_2 = 4; past the end, ν_2
    np.testing.assert_allclose(item["value"][:, 0], [2.5, 3.0, 4.0])
    np.testing.assert_allclose(item["value"][2], [4.0, 4.0, 4.0])


def test_no_position_gets_priority_zero():
    """A time-limit-cut episode's last position has z = ν (it bootstraps from its own
    value): its priority is priority_eps, not 0. One 0 held by a prioritized replay
    scaled every importance weight down (they were relative to the smallest priority
    held): α 0.6, β 0.4 took a batch's mean weight to ~0.03. With the ε it stays
    near what the spread of priorities gives, and MuZero's α = β = 1 keeps weights
    that train with ``weights: batch`` (relative to the batch's largest)."""
    from zmqrl.parts.replay import ReplayTable

    targets = Targets(1, A, unroll_steps=2, td_steps=2, discount=0.5, priority_eps=1e-3)
    _add(targets, [1.0] * 6, [2.0, 1.0, 3.0, 0.5, 2.5, 1.5])
    targets.end(0, truncated=True)
    item = targets.take()
    assert item["priority"][-1] == pytest.approx(1e-3)  # |ν - z| = 0 there
    assert item["priority"].min() >= 1e-3
    rng = np.random.default_rng(0)
    typical = rng.uniform(0.1, 2.0, 32)  # priorities of a typical spread

    def mean_weight(alpha: float, beta: float, normalize: str) -> float:
        table = ReplayTable(64, "prioritized", alpha=alpha, beta=beta, beta_final=beta,
                            beta_steps=0,
                            normalize=normalize)
        table.insert({"x": np.zeros((32, 1), np.float32)}, typical)
        table.insert({"x": np.zeros((len(item["priority"]), 1), np.float32)},
                     item["priority"])
        return float(table.sample(256).weights.mean())

    assert mean_weight(0.6, 0.4, "table") > 0.15  # 0.03 with a priority of 0
    assert mean_weight(1.0, 1.0, "batch") > 0.05  # ~1e-7 with 0 and table weights
    with pytest.raises(ValueError, match="priority_eps"):
        Targets(1, A, unroll_steps=2, td_steps=2, discount=0.5, priority_eps=0.0)


def test_unroll_observations_alone_for_the_consistency_loss():
    """``unroll_obs`` without ``reanalyse``: items carry the observations at t+1..t+K
    (zeros past the end) and none of the bootstrap arrays."""
    targets = Targets(1, A, unroll_steps=2, td_steps=2, discount=0.5, unroll_obs=True)
    _add(targets, [1.0, 1.0, 1.0], [4.0, 4.0, 4.0])
    targets.end(0, truncated=False)
    item = targets.take()
    assert "obs_bootstrap" not in item and "partial_return" not in item
    np.testing.assert_array_equal(item["obs_unroll"][:, :, 0], [[1, 2], [2, 0], [0, 0]])


@pytest.mark.parametrize("end", ["running", "terminal", "time limit"])
def test_reanalyse_data_recomputes_the_value_targets(end):
    """With ``reanalyse``, an item carries what recomputing its value targets takes:
    partial_return + bootstrap_discount * v(obs_bootstrap) is the target, for the value
    v the actor's search gave each observation (here obs row t holds t, ν_t = 10 (t + 1))."""
    targets = Targets(1, A, unroll_steps=2, td_steps=2, discount=0.5, reanalyse=True)
    count = 7
    _add(targets, [float(t + 1) for t in range(count)], [10.0 * (t + 1) for t in range(count)])
    if end != "running":
        targets.end(0, truncated=end == "time limit")
    item = targets.take()
    t_of = item["obs_bootstrap"][..., 0]  # the position each target bootstraps from
    z = item["partial_return"] + item["bootstrap_discount"] * 10.0 * (t_of + 1)
    np.testing.assert_allclose(z, item["value"], rtol=1e-6)
    mask = item["mask"]
    np.testing.assert_array_equal(item["obs_unroll"][..., 0],
                                  np.where(mask[:, 1:], item["obs"][:, :1] + [1, 2], 0))
    if end != "time limit":  # (past a time limit's end the last value stands in)
        assert (item["bootstrap_discount"][~mask] == 0).all()
    if end == "terminal":  # the last position bootstraps from nothing
        assert item["bootstrap_discount"][-1, 0] == 0


def _fake_answers(query: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    n = len(query["root"])
    return np.zeros((n, A), np.float32), np.zeros(n, np.float32), np.ones(n, np.float32)


def test_a_lane_queries_roots_then_one_leaf_per_simulation_and_plays():
    env = make_vector_env({"id": "CartPole-v1"}, 3, seed=0)
    obs, _ = env.reset(seed=0)

    def step(action):
        o, r, term, trunc, _ = env.step(action)
        return o.astype(np.float32), r.astype(np.float32), term, trunc

    params = SearchParams(num_simulations=4, discount=0.9)
    lane = LatentLane(obs.astype(np.float32), step, A, params, unroll_steps=2, td_steps=2)
    check = messages.Context.from_env(env_spec({"id": "CartPole-v1"}))
    spec = messages.spec(wire.STEP, "latent_search")
    for move in range(6):
        for sim in range(params.num_simulations + 1):
            query = lane.query()
            messages.check(wire.decode(wire.encode(wire.STEP, query, seq=1)), spec, check)
            assert query["root"].all() == (sim == 0)
            if sim:  # each simulation adds node sim: its parent is an older node
                assert (query["node"] == sim).all() and (query["parent"] < sim).all()
            lane.answer(*_fake_answers(query))
        assert lane.moves == 3 * (move + 1)
    item = lane.targets.take()
    assert item is not None and item["value"].shape[1] == 3
    messages.check(wire.decode(wire.encode(wire.INSERT, item)),
                   messages.spec(wire.INSERT, "search_targets"), check)
    lane.restart_search()
    assert lane.query()["root"].all()
    env.close()


def _behaviour(model, n: int = 2) -> LatentSearchBehaviour:
    spec = env_spec({"id": "CartPole-v1"})
    return LatentSearchBehaviour(ActingSetup(spec, model, MuZeroConfig(num_simulations=3)), n)


def _step(root, obs, parent, action, node) -> wire.Message:
    return wire.Message(wire.STEP, {}, {
        "root": np.array(root), "obs": np.array(obs, np.float32).reshape(-1, 4),
        "parent": np.array(parent, np.int32), "action": np.array(action, np.int64),
        "node": np.array(node, np.int32)})


def test_the_broker_keeps_latents_and_batches_connections_as_one():
    model = MuZeroMLP(env_spec({"id": "CartPole-v1"}), latent_size=8, hidden=16)
    rng = np.random.default_rng(0)
    roots = rng.normal(size=(2, 4)).astype(np.float32)
    together, alone = [_behaviour(model), _behaviour(model)], [_behaviour(model)]
    for b in together + alone:
        b.observe_step(_step([True, True], roots, [0, 0], [0, 0], [0, 0]))
    act_batched(model, together, 0)
    act_batched(model, alone, 0)
    for b in together + alone:  # a simulation from each root
        b.observe_step(_step([False, False], np.zeros((0, 4)), [0, 0], [1, 0], [1, 1]))
    act_batched(model, together, 0)
    act_batched(model, alone, 0)
    a, b = together[0].reply(np.zeros(2)), alone[0].reply(np.zeros(2))
    for key in ("logits", "value", "reward"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # what the model says for root 0, action 1
        latent = model.represent(torch.from_numpy(roots[:1]))
        nxt, _ = model.dynamics(latent, torch.tensor([1]))
    np.testing.assert_allclose(together[0].latents[0, 1], nxt[0].numpy(), rtol=1e-5,
                               atol=1e-6)
    fresh = _behaviour(model)  # a restarted broker holds no latents
    with pytest.raises(wire.ProtocolError, match=SEARCH_AGAIN):
        fresh.observe_step(_step([False, False], np.zeros((0, 4)), [0, 0], [1, 0], [1, 1]))
    with pytest.raises(wire.ProtocolError, match="a tree has 4"):
        fresh.observe_step(_step([True, True], roots, [0, 0], [0, 0], [0, 4]))


def test_bootstrap_arrays_alone_for_the_target_network():
    """``bootstrap`` without ``reanalyse``: items carry the value targets' parts (the
    learner's target network recomputes them) and not the unroll's observations."""
    targets = Targets(1, A, unroll_steps=2, td_steps=2, discount=0.5, bootstrap=True)
    _add(targets, [1.0, 1.0, 1.0, 1.0], [4.0, 4.0, 4.0, 4.0])
    targets.end(0, truncated=True)
    item = targets.take()
    assert "obs_unroll" not in item
    t_of = item["obs_bootstrap"][..., 0]
    z = item["partial_return"] + item["bootstrap_discount"] * 4.0 * (t_of > 0)
    np.testing.assert_allclose(z, item["value"], rtol=1e-6)
