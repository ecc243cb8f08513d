"""R2D2 pieces: value rescaling, sequence targets against plain-Python loops, burn-in,
priorities, the recurrent Q-network, and sequences cut while acting."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from zmqrl.parts.algos import ALGOS, make_algo
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import MODEL_KINDS, build_model
from zmqrl.parts.models.recurrent import LSTMCore
from zmqrl.parts.r2d2.learner import (
    R2D2Config,
    R2D2Learner,
    first_flags,
    h,
    h_inv,
    n_step_rescaled_targets,
    sequence_priorities,
    sequence_td,
)
from zmqrl.parts.r2d2.models import RecurrentQNetwork
from zmqrl.parts.sequences import RecurrentEnvs, SequenceBuilder, truncation_bootstrap

SPEC = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
               action_dtype=np.dtype(np.int64), num_actions=3)
EPS = 1e-3


# ------------------------------------------------------------------ value rescaling


def test_h_and_h_inv_are_inverse_over_a_wide_range():
    mags = np.logspace(-6, 8, 400)
    x = torch.from_numpy(np.concatenate([-mags[::-1], [0.0], mags]))
    assert torch.allclose(h_inv(h(x, EPS), EPS), x, rtol=1e-4, atol=0)
    y = torch.from_numpy(np.concatenate([-mags[::-1], [0.0], mags])) / 1e3  # h grows slowly
    assert torch.allclose(h(h_inv(y, EPS), EPS), y, rtol=1e-4, atol=0)
    assert h(torch.zeros(1, dtype=torch.float64)).item() == 0.0
    assert h_inv(torch.zeros(1, dtype=torch.float64)).item() == 0.0
    assert (h(x).diff() > 0).all() and (h_inv(y).diff() > 0).all()  # strictly monotone


def test_h_inv_equals_the_papers_closed_form():
    x = torch.from_numpy(np.concatenate([-np.logspace(-1, 6, 50), np.logspace(-1, 6, 50)]))
    paper = torch.sign(x) * (((torch.sqrt(1 + 4 * EPS * (x.abs() + 1 + EPS)) - 1)
                              / (2 * EPS)) ** 2 - 1)
    assert torch.allclose(h_inv(x, EPS), paper, rtol=1e-8)


# ------------------------------------------------------------------ targets


def brute_force_target(q_online, q_target, reward, done, gamma, n, t, b):
    """The rescaled double-Q target of step t of column b, by walking forward."""
    L = len(reward)
    total, k = 0.0, 0
    while True:
        total += gamma**k * reward[t + k, b]
        if done[t + k, b]:
            return float(h(torch.tensor(total), EPS))  # episode ended: no bootstrap
        if k + 1 == n or t + k + 1 == L:  # n rewards, or the sequence ran out
            s = t + k + 1
            best = int(np.argmax(q_online[s, b]))
            value = float(h_inv(torch.tensor(q_target[s, b, best]), EPS))
            return float(h(torch.tensor(total + gamma ** (k + 1) * value), EPS))
        k += 1


def random_sequence(L, B, A, done_prob, seed):
    rng = np.random.default_rng(seed)
    q_online = rng.normal(size=(L + 1, B, A)) * 3
    q_target = rng.normal(size=(L + 1, B, A)) * 3
    reward = rng.normal(size=(L, B)).round(2)
    done = rng.random((L, B)) < done_prob
    action = rng.integers(0, A, size=(L, B))
    return q_online, q_target, action, reward, done


@pytest.mark.parametrize("n", [1, 3, 5, 30])
@pytest.mark.parametrize("done_prob", [0.0, 0.2])
def test_n_step_rescaled_targets_match_loop(n, done_prob):
    L, B, A, gamma = 12, 5, 3, 0.9
    q_online, q_target, action, reward, done = random_sequence(L, B, A, done_prob, seed=n)
    if done_prob:
        assert done.any() and done[:-1].any()  # episode ends inside the sequence
    got = n_step_rescaled_targets(*map(torch.from_numpy, (q_online, q_target, action,
                                                          reward, done)), gamma, n, EPS)
    want = np.array([[brute_force_target(q_online, q_target, reward, done, gamma, n, t, b)
                      for b in range(B)] for t in range(L)])
    assert got.shape == (L, B)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


def test_targets_use_double_q():
    # Online prefers action 0 at the bootstrap obs, the target net action 1.
    q_online = torch.tensor([[[0.0, 0.0]], [[5.0, 1.0]]], dtype=torch.float64)
    q_target = torch.tensor([[[0.0, 0.0]], [[2.0, 9.0]]], dtype=torch.float64)
    got = n_step_rescaled_targets(q_online, q_target, torch.zeros(1, 1), torch.zeros(1, 1,
                                  dtype=torch.float64), torch.zeros(1, 1, dtype=torch.bool),
                                  0.5, 1, EPS)
    assert got.item() == pytest.approx(h(0.5 * h_inv(torch.tensor(2.0))).item())


def test_burn_in_steps_get_no_gradient_and_do_not_count():
    L, B, A, burn_in = 10, 3, 4, 4
    q_online, q_target, action, reward, done = map(
        torch.from_numpy, random_sequence(L, B, A, 0.2, seed=7))
    q_online.requires_grad_(True)
    td = sequence_td(q_online, q_target, action, reward, done, 0.9, 3, EPS, burn_in)
    assert td.shape == (L - burn_in, B)
    (td**2).sum().backward()
    assert (q_online.grad[:burn_in] == 0).all()
    assert (q_online.grad[burn_in:L] != 0).any()
    # Same TD from the learning part alone: burn-in steps never enter the targets.
    alone = sequence_td(q_online[burn_in:], q_target[burn_in:], action[burn_in:],
                        reward[burn_in:], done[burn_in:], 0.9, 3, EPS)
    assert torch.equal(td, alone)


def test_sequence_priorities_mix_max_and_mean():
    td_abs = torch.tensor([[1.0, 0.0], [3.0, 2.0], [2.0, 0.0]])
    got = sequence_priorities(td_abs, eta=0.9)
    assert torch.allclose(got, torch.tensor([0.9 * 3 + 0.1 * 2, 0.9 * 2 + 0.1 * 2 / 3]))
    assert torch.allclose(sequence_priorities(td_abs, eta=0.0), td_abs.mean(0))


def test_first_flags():
    done = torch.tensor([[False, True], [True, False]])
    assert first_flags(done).tolist() == [[False, False], [False, True], [True, False]]


# ------------------------------------------------------------------ config


def test_config_reports_bad_fields_by_name():
    assert R2D2Config.field_errors({}) == []
    assert ALGOS["r2d2"] == (R2D2Config, R2D2Learner)
    for bad, field in [({"burn_in": 40}, "burn_in"), ({"overlap": 40}, "overlap"),
                       ({"n_step": 0}, "n_step"), ({"eta": 1.5}, "eta"),
                       ({"rescale_eps": 0.0}, "rescale_eps"),
                       ({"sequence_length": 8}, "burn_in")]:
        with pytest.raises(ValueError, match=f"algo.{field}:"):
            R2D2Config(**bad)
        assert [k for k, _ in R2D2Config.field_errors(bad)][0] == field
    # Wrong types are the topology type check's to report, not a crash here.
    assert R2D2Config.field_errors({"burn_in": "ten", "sequence_length": None}) == []


# ------------------------------------------------------------------ network


def small_model(seed=0, lstm=8) -> RecurrentQNetwork:
    return build_model({"kind": "lstm_q", "hidden": [16], "lstm": lstm}, SPEC, seed)


def test_recurrent_q_network_shapes_and_registration():
    assert MODEL_KINDS["lstm_q"] is RecurrentQNetwork
    model = small_model()
    assert model.state_size == 8
    T, B = 5, 3
    q, (hh, cc) = model(torch.randn(T, B, 4), torch.zeros(T, B, dtype=torch.bool),
                        model.initial_state(B))
    assert q.shape == (T, B, 3) and hh.shape == cc.shape == (B, 8)
    with pytest.raises(ValueError, match="discrete"):
        RecurrentQNetwork(dataclasses.replace(SPEC, num_actions=None, action_shape=(2,)))
    assert RecurrentQNetwork(SPEC, hidden=[], lstm=4)(torch.randn(2, 1, 4),
                                                      torch.zeros(2, 1, dtype=torch.bool),
                                                      LSTMCore(4, 4).initial_state(1))[0].shape \
        == (2, 1, 3)


def test_reset_at_first_and_step_matches_forward():
    torch.manual_seed(1)
    model = small_model()
    T, B, k = 6, 2, 3
    obs = torch.randn(T, B, 4)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[k, 0] = True
    state = (torch.randn(B, 8), torch.randn(B, 8))
    q, _ = model(obs, first, state)
    # From step k on, column 0 is as if a fresh episode started there with a zero state.
    fresh, _ = model(obs[k:, :1], torch.zeros(T - k, 1, dtype=torch.bool),
                     model.initial_state(1))
    assert torch.allclose(q[k:, 0], fresh[:, 0], atol=1e-6)
    assert not torch.allclose(q[k:, 1], model(obs[k:, 1:], first[k:, 1:],
                                              model.initial_state(1))[0][:, 0])
    # Stepping one observation at a time gives the same Q-values.
    s = state
    for t in range(T):
        q_t, s = model.step(obs[t], first[t], s)
        assert torch.allclose(q_t, q[t], atol=1e-6)


# ------------------------------------------------------------------ learner


def make_batch(B, L, seed, done_prob=0.15, H=8):
    rng = np.random.default_rng(seed)
    return {
        "obs": torch.from_numpy(rng.normal(size=(B, L + 1, 4)).astype(np.float32)),
        "action": torch.from_numpy(rng.integers(0, 3, size=(B, L))),
        "reward": torch.from_numpy(rng.normal(size=(B, L)).astype(np.float32)),
        "done": torch.from_numpy(rng.random((B, L)) < done_prob),
        "state_h": torch.from_numpy(rng.normal(size=(B, H)).astype(np.float32) * 0.1),
        "state_c": torch.from_numpy(rng.normal(size=(B, H)).astype(np.float32) * 0.1),
        "weight": torch.from_numpy(rng.uniform(0.5, 1.0, size=B).astype(np.float32)),
    }


def test_learner_burns_in_without_grad_from_the_stored_state():
    cfg = R2D2Config(sequence_length=8, burn_in=3, overlap=4, n_step=2, light_adam=True)
    learner = R2D2Learner(cfg, small_model())
    calls = []

    def spy(name):
        def hook(module, args, output):
            obs, first, (hh, cc) = args
            calls.append((name, obs.shape[0], torch.is_grad_enabled(), hh.clone(),
                          first.clone()))
        return hook

    learner.model.register_forward_hook(spy("online"))
    learner.target_model.register_forward_hook(spy("target"))
    batch = make_batch(4, 8, seed=3)
    batch["done"][:, 2] = True  # a reset right at the first learning step
    learner.loss(batch)
    (n0, t0, g0, h0, _), (n1, t1, g1, h1, _) = calls[:2]
    assert (n0, t0, g0, n1, t1, g1) == ("online", 3, False, "target", 3, False)
    assert torch.equal(h0, batch["state_h"]) and torch.equal(h1, batch["state_h"])
    learn = {name: (T, grad, first) for name, T, grad, _, first in calls[2:]}
    assert learn["online"][:2] == (6, True) and learn["target"][:2] == (6, False)
    assert learn["online"][2][0].all()  # done[2] -> obs 3 (the learning start) resets


def test_learner_loss_ignores_burn_in_rewards_and_actions():
    cfg = R2D2Config(sequence_length=8, burn_in=3, overlap=4, n_step=3, light_adam=True)
    learner = R2D2Learner(cfg, small_model())
    batch = make_batch(4, 8, seed=4)
    loss, _, prio = learner.loss(batch)
    other = dict(batch, action=batch["action"].clone(), reward=batch["reward"].clone())
    other["action"][:, :3] = (other["action"][:, :3] + 1) % 3
    other["reward"][:, :3] += 10.0
    loss2, _, prio2 = learner.loss(other)
    assert loss.item() == loss2.item() and torch.equal(prio, prio2)


def test_learner_update_weights_terms_and_target_sync():
    cfg = R2D2Config(sequence_length=6, burn_in=2, overlap=2, n_step=2,
                     target_update_every=2, light_adam=True)
    learner = make_algo({"kind": "r2d2", **dataclasses.asdict(cfg)}, small_model())
    assert isinstance(learner, R2D2Learner) and not learner.target_model.training
    assert not any(p.requires_grad for p in learner.target_model.parameters())
    batch = make_batch(5, 6, seed=5)
    terms, prio = learner.update(batch)
    assert set(terms) == {"loss", "q_mean", "td_abs_mean", "grad_norm"}
    assert prio.shape == (5,) and prio.dtype == torch.float32 and prio.device.type == "cpu"
    assert (prio > 0).all()
    # The target net lags one update, then is synced on the 2nd.
    w = "advantage.weight"
    assert not torch.equal(learner.model.state_dict()[w], learner.target_model.state_dict()[w])
    learner.update(batch)
    assert torch.equal(learner.model.state_dict()[w], learner.target_model.state_dict()[w])
    # Importance weights scale each sequence's loss; zero weights give no gradient.
    loss, _, _ = learner.loss(dict(batch, weight=torch.zeros(5)))
    assert loss.item() == 0.0
    half, _, _ = learner.loss(dict(batch, weight=torch.full((5,), 0.5)))
    full, _, _ = learner.loss({k: v for k, v in batch.items() if k != "weight"})
    assert half.item() == pytest.approx(0.5 * full.item())


# ------------------------------------------------------------------ sequences


def scripted_run(n, L, overlap, steps, dones, epsilon=0.0, H=2):
    """Drive RecurrentEnvs without a model: obs[t, i] = (t, i, 0, 0); the state after
    obs t of env i is (t + 1, 10 * i + t + 1) (unless reset); q makes action t % 3
    greedy. Returns the sequences emitted and the state passed in at each step."""
    cfg = R2D2Config(sequence_length=L, overlap=overlap, burn_in=1, n_step=2)
    envs = RecurrentEnvs(SPEC, cfg, n, H, epsilon, seed=0)
    out, states = [], []
    for t in range(steps):
        obs = np.zeros((n, 4), np.float32)
        obs[:, 0], obs[:, 1] = t, np.arange(n)
        first, hh, cc = envs.inputs()
        states.append((first.copy(), hh.copy(), cc.copy()))
        q = np.zeros((n, 3), np.float32)
        q[:, t % 3] = 1.0
        new_h = np.stack([np.full(n, t + 1.0), 10 * np.arange(n) + t + 1.0], -1)
        action = envs.record(obs, q, new_h, -new_h)
        if np.isscalar(epsilon) and epsilon == 0.0:
            assert (action == t % 3).all() and action.dtype == np.int64
        seq = envs.outcome(np.full(n, float(t)), dones[t])
        if seq is not None:
            out.append((t, seq))
    return out, states


def test_sequences_overlap_cross_episode_ends_and_store_states():
    n, L, overlap, steps = 3, 6, 2, 15  # a sequence starts every 4 steps
    dones = np.zeros((steps, n), bool)
    dones[1, 1] = True  # env 1: an episode ends mid-sequence
    dones[3, 2] = True  # env 2: obs 4 (the 2nd sequence's first) starts an episode
    out, states = scripted_run(n, L, overlap, steps, dones)
    assert [t for t, _ in out] == [6, 10, 14]  # emitted once obs L is in
    for k, (_, seq) in enumerate(out):
        start = 4 * k
        assert seq["obs"].shape == (n, L + 1, 4) and seq["obs"].dtype == np.float32
        assert seq["action"].shape == (n, L) and seq["action"].dtype == np.int64
        assert seq["reward"].shape == (n, L) and seq["reward"].dtype == np.float32
        assert seq["done"].shape == (n, L) and seq["done"].dtype == np.bool_
        assert seq["state_h"].shape == seq["state_c"].shape == (n, 2)
        assert seq["state_h"].dtype == np.float32
        assert seq["priority"].shape == (n,) and seq["priority"].dtype == np.float32
        assert "q" not in seq
        np.testing.assert_array_equal(seq["obs"][:, :, 0], np.arange(start, start + L + 1)
                                      + np.zeros((n, 1)))
        np.testing.assert_array_equal(seq["obs"][:, 0, 1], np.arange(n))
        np.testing.assert_array_equal(seq["reward"][0], np.arange(start, start + L))
        np.testing.assert_array_equal(seq["action"][0], np.arange(start, start + L) % 3)
        np.testing.assert_array_equal(seq["done"], dones[start:start + L].T)
        # The stored state is the one passed in with the sequence's first observation.
        np.testing.assert_array_equal(seq["state_h"], states[start][1])
        np.testing.assert_array_equal(seq["state_c"], states[start][2])
    first_seq, second = out[0][1], out[1][1]
    assert first_seq["done"][1].tolist() == [False, True, False, False, False, False]
    np.testing.assert_array_equal(first_seq["state_h"], 0.0)  # all envs start fresh
    # 2nd sequence: state recorded at step L - overlap = 4; env 2 was reset there.
    assert second["state_h"][0].tolist() == [4.0, 4.0]
    assert second["state_c"][1].tolist() == [-4.0, -14.0]
    assert second["state_h"][2].tolist() == [0.0, 0.0]
    assert states[4][0].tolist() == [False, False, True]
    # env 1's reset after step 1: the state passed in with obs 2 was zero.
    assert states[2][1][1].tolist() == [0.0, 0.0] and states[2][0].tolist() == [
        False, True, False]
    # The overlap: the 2nd sequence's first `overlap` + 1 obs are the 1st's last ones.
    np.testing.assert_array_equal(second["obs"][:, :overlap + 1],
                                  first_seq["obs"][:, L - overlap:])


def test_sequences_without_overlap_and_per_env_epsilon():
    n, L, steps = 2, 3, 10
    out, _ = scripted_run(n, L, 0, steps, np.zeros((steps, n), bool),
                          epsilon=np.array([0.0, 1.0]))
    assert [t for t, _ in out] == [3, 6, 9]
    seqs = [s for _, s in out]
    assert all((s["action"][0] == np.arange(3 * k, 3 * k + 3) % 3).all()
               for k, s in enumerate(seqs))  # env 0: greedy; env 1 random
    assert any((s["action"][1] != np.arange(3 * k, 3 * k + 3) % 3).any()
               for k, s in enumerate(seqs))


def test_builder_rejects_bad_overlap():
    with pytest.raises(ValueError, match="overlap"):
        SequenceBuilder(SPEC, 4, 4, 1, 2)


@pytest.mark.parametrize("burn_in", [0, 3])
def test_actor_priorities_match_the_learner(burn_in):
    """With the learner's target net equal to the acting net, the learner recomputes
    exactly the Q-values recorded while acting (stored state, resets at episode ends),
    so its priorities equal the ones shipped."""
    L, n, steps = 8, 4, 30
    cfg = R2D2Config(sequence_length=L, burn_in=burn_in, overlap=4, n_step=3,
                     discount=0.9, light_adam=True)
    model = small_model(seed=2)
    envs = RecurrentEnvs(SPEC, cfg, n, model.state_size, epsilon=0.3, seed=1)
    rng = np.random.default_rng(0)
    seqs = []
    for _ in range(steps):
        envs.act(model, rng.normal(size=(n, 4)).astype(np.float32))
        seq = envs.outcome(rng.normal(size=n).astype(np.float32), rng.random(n) < 0.15)
        if seq is not None:
            seqs.append(seq)
    assert len(seqs) == 6
    items = {k: np.concatenate([s[k] for s in seqs]) for k in seqs[0]}
    assert items["done"][:, 1:].any()
    learner = R2D2Learner(cfg, model)
    batch = {k: torch.from_numpy(v) for k, v in items.items() if k != "priority"}
    _, _, prio = learner.loss(batch)
    np.testing.assert_allclose(prio.numpy(), items["priority"], rtol=1e-4, atol=1e-5)


def test_truncation_bootstrap_adds_the_discounted_unrescaled_value():
    cfg = R2D2Config(sequence_length=4, burn_in=1, overlap=1, discount=0.9)
    model = small_model(seed=3)
    envs = RecurrentEnvs(SPEC, cfg, 2, model.state_size, epsilon=0.0, seed=0)
    envs.act(model, np.ones((2, 4), np.float32))
    final = np.full((1, 4), 2.0, np.float32)
    reward = envs.bootstrap_truncated(model, np.array([1.0, 1.0], np.float32),
                                      np.array([False, True]), final)
    q, _ = model.step(torch.from_numpy(final), torch.zeros(1, dtype=torch.bool),
                      (torch.from_numpy(envs.h[1:]), torch.from_numpy(envs.c[1:])))
    want = 1.0 + truncation_bootstrap(q.numpy(), 0.9, cfg.rescale_eps)[0]
    assert reward[0] == 1.0 and reward[1] == pytest.approx(want)
    assert want == pytest.approx(1.0 + 0.9 * h_inv(q.max()).item(), rel=1e-6)
