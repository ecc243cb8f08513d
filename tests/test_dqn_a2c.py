"""n-step DQN and A2C pieces checked against independent plain-Python loops."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from zmqrl.parts.actor_critic.a2c import A2CConfig, A2CLearner, a2c_loss, nstep_returns
from zmqrl.parts.dqn.learner import (
    DQNConfig,
    DQNLearner,
    NStepAccumulator,
    double_dqn_targets,
    n_step_returns,
    td_priorities,
)
from zmqrl.parts.dqn.models import DuelingQNetwork
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import MODEL_KINDS, build_model

GAMMA = 0.9
SPEC = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
               action_dtype=np.dtype(np.int64), num_actions=3)


# ------------------------------------------------------------------ n-step transitions


def make_stream(T: int, E: int, done_prob: float, seed: int):
    """Random rewards/dones for E envs; observations encode (t, env, is_final) so every
    transition can be traced back. SAME_STEP autoreset: at a done, next_obs is the final
    observation, and the next step's obs is the first one of a new episode."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, E)).round(3)
    dones = rng.random((T, E)) < done_prob
    obs = np.zeros((T + 1, E, 3), dtype=np.float32)
    for t in range(T + 1):
        for i in range(E):
            obs[t, i] = (t, i, 0)
    next_obs = obs[1:].copy()
    for t in range(T):
        for i in range(E):
            if dones[t, i]:
                next_obs[t, i] = (t, i, 1)  # final observation, not obs[t + 1]
    actions = rng.integers(0, 3, size=(T, E))
    return rewards, dones, obs[:T], actions, next_obs


def brute_force(rewards, dones, next_obs, n, gamma, t, i):
    """The n-step transition starting at step t of env i, by walking forward.
    Returns (reward, discount, next_obs, complete) where complete is False when the block
    ended first (then: truncated at the block end with gamma^m)."""
    T = len(rewards)
    total, k = 0.0, 0
    while True:
        total += gamma**k * rewards[t + k, i]
        if dones[t + k, i]:
            return total, 0.0, next_obs[t + k, i], True
        if k + 1 == n:
            return total, gamma**n, next_obs[t + k, i], True
        if t + k + 1 == T:
            return total, gamma ** (k + 1), next_obs[t + k, i], False
        k += 1


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("done_prob", [0.0, 0.25])
def test_nstep_accumulator_and_block_returns_match_loop(n, done_prob):
    T, E = 23, 3
    rewards, dones, obs, actions, next_obs = make_stream(T, E, done_prob, seed=n)
    if done_prob > 0:
        assert dones.any()
    acc = NStepAccumulator(E, n, GAMMA)
    got = {}  # (t, env) -> (reward, discount, next_obs, action)
    for t in range(T):
        out = acc.push(obs[t], actions[t], rewards[t], dones[t], next_obs[t])
        if out is None:
            continue
        assert set(out) == {"obs", "action", "reward", "discount", "next_obs"}
        keys = [(int(o[0]), int(o[1])) for o in out["obs"]]
        assert [k[1] for k in keys] == sorted(k[1] for k in keys)  # ordered by env
        for j, key in enumerate(keys):
            assert key not in got and key[0] <= t
            got[key] = (out["reward"][j], out["discount"][j], out["next_obs"][j],
                        out["action"][j])

    block_ret, block_disc = n_step_returns(rewards, dones, GAMMA, n)
    pending = np.zeros(E, dtype=int)
    for i in range(E):
        for t in range(T):
            r, d, nxt, complete = brute_force(rewards, dones, next_obs, n, GAMMA, t, i)
            assert block_ret[t, i] == pytest.approx(r, abs=1e-9)
            assert block_disc[t, i] == pytest.approx(d, abs=1e-12)
            if not complete:
                assert (t, i) not in got
                pending[i] += 1
                continue
            gr, gd, gnext, ga = got[(t, i)]
            assert gr == pytest.approx(r, abs=1e-5)
            assert gd == pytest.approx(d, abs=1e-6)
            np.testing.assert_array_equal(gnext, nxt)
            assert ga == actions[t, i]
        assert sum(1 for key in got if key[1] == i) == T - pending[i]
    np.testing.assert_array_equal(acc.pending, pending)
    assert (pending <= n - 1).all()

    # flush() emits the tail truncated at the block end, as n_step_returns defines it.
    tail = acc.flush()
    if n == 1:
        assert tail is None and pending.sum() == 0
        return
    assert len(tail["obs"]) == pending.sum()
    for j, o in enumerate(tail["obs"]):
        t, i = int(o[0]), int(o[1])
        assert tail["reward"][j] == pytest.approx(block_ret[t, i], abs=1e-5)
        assert tail["discount"][j] == pytest.approx(block_disc[t, i], abs=1e-6)
        np.testing.assert_array_equal(tail["next_obs"][j], next_obs[T - 1, i])
    assert (acc.pending == 0).all()


def test_nstep_episode_end_flushes_with_zero_discount():
    acc = NStepAccumulator(num_envs=1, n=3, discount=0.5)
    o = lambda v: np.array([[v]], dtype=np.float32)  # noqa: E731
    assert acc.push(o(0), [0], [1.0], [False], o(1)) is None
    out = acc.push(o(1), [1], [2.0], [True], o(99))  # terminal: final obs 99
    np.testing.assert_allclose(out["reward"], [1.0 + 0.5 * 2.0, 2.0])
    np.testing.assert_array_equal(out["discount"], [0.0, 0.0])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [99, 99])
    # Truncation also flushes, but bootstraps from the final observation.
    acc.push(o(5), [0], [1.0], [False], o(6))
    out = acc.push(o(6), [0], [1.0], [False], o(77), truncated=[True])
    np.testing.assert_allclose(out["discount"], [0.25, 0.5])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [77, 77])


def test_n_step_returns_torch_matches_numpy():
    rewards, dones, *_ = make_stream(11, 2, 0.3, seed=7)
    r_np, d_np = n_step_returns(rewards, dones, GAMMA, 3)
    r_t, d_t = n_step_returns(torch.tensor(rewards), torch.tensor(dones), GAMMA, 3)
    np.testing.assert_allclose(r_t.numpy(), r_np)
    np.testing.assert_allclose(d_t.numpy(), d_np)


# ------------------------------------------------------------------ DQN


def test_double_dqn_targets_match_loop_and_differ_from_vanilla():
    torch.manual_seed(0)
    B, A = 8, 4
    q_online, q_target = torch.randn(B, A), torch.randn(B, A)
    rewards, discounts = torch.randn(B), torch.rand(B)
    got = double_dqn_targets(q_online, q_target, rewards, discounts)
    for b in range(B):
        best = max(range(A), key=lambda a, b=b: q_online[b, a].item())
        expected = rewards[b].item() + discounts[b].item() * q_target[b, best].item()
        assert got[b].item() == pytest.approx(expected, rel=1e-6)
    vanilla = rewards + discounts * q_target.max(-1).values
    disagree = q_online.argmax(-1) != q_target.argmax(-1)
    assert disagree.any()
    assert (got[disagree] < vanilla[disagree]).all()
    torch.testing.assert_close(got[~disagree], vanilla[~disagree])


def test_dueling_q_is_v_plus_centered_advantage():
    assert MODEL_KINDS["dueling_mlp"] is DuelingQNetwork
    model = build_model({"kind": "dueling_mlp", "hidden": [16, 8]}, SPEC, seed=0)
    obs = torch.randn(5, 4)
    q = model(obs)
    assert q.shape == (5, 3)
    h = model.torso(obs)
    v, adv = model.value(h), model.advantage(h)
    manual = v + adv - adv.mean(-1, keepdim=True)
    torch.testing.assert_close(q, manual)
    torch.testing.assert_close(q.mean(-1), v.squeeze(-1))
    assert model.q_values(obs).shape == (5, 3)
    assert not model.q_values(obs).requires_grad


def _dqn_batch(B=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(B, 4, generator=g),
        "action": torch.randint(0, 3, (B,), generator=g),
        "reward": torch.randn(B, generator=g),
        "discount": torch.where(torch.rand(B, generator=g) < 0.2, 0.0, GAMMA**3),
        "next_obs": torch.randn(B, 4, generator=g),
        "weight": torch.rand(B, generator=g) + 0.5,
    }


def _weighted_loss(learner, batch):
    with torch.no_grad():
        q = learner.model(batch["obs"]).gather(-1, batch["action"][:, None]).squeeze(-1)
        best = learner.model(batch["next_obs"]).argmax(-1, keepdim=True)
        q_next = learner.target_model(batch["next_obs"]).gather(-1, best).squeeze(-1)
        target = batch["reward"] + batch["discount"] * q_next
        td = target - q
        huber = torch.where(td.abs() <= 1.0, 0.5 * td**2, td.abs() - 0.5)
        return (batch["weight"] * huber).mean().item(), td.abs()


def test_dqn_update_reduces_loss_and_returns_td_priorities():
    model = build_model({"kind": "dueling_mlp", "hidden": [32]}, SPEC, seed=1)
    learner = DQNLearner(DQNConfig(lr=1e-3, target_update_every=1000), model)
    batch = _dqn_batch()
    before, td_before = _weighted_loss(learner, batch)
    initial = td_priorities(model, batch["obs"].numpy(), batch["action"].numpy(),
                            batch["reward"].numpy(), batch["discount"].numpy(),
                            batch["next_obs"].numpy(), target_model=learner.target_model)
    terms, priorities = learner.update(batch)
    assert terms["loss"] == pytest.approx(before, rel=1e-5)
    assert {"loss", "q_mean", "td_abs_mean", "grad_norm"} <= set(terms)
    assert priorities.dtype == torch.float32 and priorities.device.type == "cpu"
    assert not priorities.requires_grad
    torch.testing.assert_close(priorities, td_before)
    np.testing.assert_allclose(initial, td_before.numpy(), rtol=1e-5)
    after, _ = _weighted_loss(learner, batch)
    assert after < before


def test_dqn_target_syncs_every_n_updates():
    model = build_model({"kind": "dueling_mlp", "hidden": [16]}, SPEC, seed=2)
    learner = DQNLearner(DQNConfig(lr=1e-2, target_update_every=3), model)
    start = copy.deepcopy(model.state_dict())

    def target_equals(state):
        return all(torch.equal(v, state[k]) for k, v in learner.target_model.state_dict().items())

    for step in range(1, 7):
        learner.update(_dqn_batch(seed=step))
        if step % 3 == 0:
            assert target_equals(model.state_dict())
        else:
            assert not target_equals(model.state_dict())
        if step < 3:
            assert target_equals(start)
    assert not any(p.requires_grad for p in learner.target_model.parameters())


# ------------------------------------------------------------------ A2C


def test_nstep_returns_match_loop():
    torch.manual_seed(3)
    T, B = 7, 4
    rewards = torch.randn(T, B)
    discounts = GAMMA * (torch.rand(T, B) > 0.3).float()
    bootstrap = torch.randn(B)
    got = nstep_returns(rewards, discounts, bootstrap)
    for b in range(B):
        for t in range(T):
            g, scale = 0.0, 1.0
            for k in range(t, T):
                g += scale * rewards[k, b].item()
                scale *= discounts[k, b].item()
            g += scale * bootstrap[b].item()
            assert got[t, b].item() == pytest.approx(g, rel=1e-5, abs=1e-6)


def test_a2c_loss_gradients():
    torch.manual_seed(4)
    T, B = 5, 3
    N = T * B
    logp = torch.randn(T, B, requires_grad=True)
    entropy = torch.rand(T, B, requires_grad=True)
    values = torch.randn(T, B, requires_grad=True)
    returns = torch.randn(T, B)
    loss, terms = a2c_loss(logp, entropy, values, returns, baseline_cost=0.5, entropy_cost=0.01)
    loss.backward()
    adv = (returns - values).detach()
    torch.testing.assert_close(logp.grad, -adv / N)
    # Only the baseline term reaches the values: the policy term's advantage is detached.
    torch.testing.assert_close(values.grad, -0.5 * adv / N)
    torch.testing.assert_close(entropy.grad, torch.full((T, B), -0.01 / N))
    assert terms["loss_total"] == pytest.approx(loss.item())
    expected = -(adv * logp).mean() + 0.25 * (adv**2).mean() - 0.01 * entropy.mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def _a2c_batch(T=5, B=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(T + 1, B, 4, generator=g),
        "action": torch.randint(0, 3, (T, B), generator=g),
        "logp": torch.full((T, B), -1.1),
        "reward": torch.randn(T, B, generator=g),
        "done": torch.rand(T, B, generator=g) < 0.2,
    }


def test_a2c_gradients_then_apply_equals_update():
    cfg = A2CConfig(lr=1e-2, max_grad_norm=0.5)
    local = A2CLearner(cfg, build_model({"hidden": [16]}, SPEC, seed=5))
    server = A2CLearner(cfg, build_model({"hidden": [16]}, SPEC, seed=5))
    worker = A2CLearner(cfg, build_model({"hidden": [16]}, SPEC, seed=5))
    ref = A2CLearner(cfg, build_model({"hidden": [16]}, SPEC, seed=5))  # plain backward/step
    start = [p.detach().clone() for p in local.model.parameters()]
    for step in range(3):
        batch = _a2c_batch(seed=step)
        terms = local.update(batch)
        grads, worker_terms = worker.gradients(batch)
        assert [g.shape for g in grads] == [p.shape for p in worker.model.parameters()]
        applied = server.apply_gradients([g.numpy() for g in grads])  # as if off the wire
        assert applied["grad_norm"] == pytest.approx(terms["grad_norm"], rel=1e-5)
        assert worker_terms["loss_total"] == pytest.approx(terms["loss_total"], rel=1e-5)
        # A3C worker pulls the server's parameters again.
        worker.model.load_state_dict(server.model.state_dict())
        ref.optimizer.zero_grad()
        ref._loss(batch)[0].backward()
        torch.nn.utils.clip_grad_norm_(ref.model.parameters(), cfg.max_grad_norm)
        ref.optimizer.step()
    for a, b, c in zip(local.model.parameters(), server.model.parameters(),
                       ref.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)
    moved = zip(local.model.parameters(), start, strict=True)
    assert any(not torch.equal(a, s) for a, s in moved)
    assert terms["grad_norm"] > cfg.max_grad_norm  # clipping was exercised
