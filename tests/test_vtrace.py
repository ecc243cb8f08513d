"""V-trace checked against an independent numpy reference of the paper's sum."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zmqrl.parts.actor_critic.vtrace import VTraceReturns, impala_loss, vtrace

CLIPS = [(1.0, 1.0), (0.5, 0.9), (2.0, 1.0), (None, None)]


def _clip(x: float, threshold: float | None) -> float:
    return x if threshold is None else min(x, threshold)


def reference_vtrace(blogp, tlogp, rewards, values, bootstrap, discounts, clip_rho, clip_c,
                     clip_pg_rho):
    """Espeholt et al. 2018 eq. (1), written as the explicit sum (no recursion):
    vs_s = V(x_s) + sum_{t>=s} (prod_{k=s}^{t-1} gamma_k) (prod_{i=s}^{t-1} c_i) delta_t.
    """
    T, B = rewards.shape
    ratios = np.exp(tlogp - blogp)
    v_ext = np.concatenate([values, bootstrap[None]], axis=0)  # V(x_0..x_T)
    vs = np.zeros((T, B))
    pg_adv = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total = v_ext[s, b]
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):
                    weight *= discounts[i, b] * _clip(ratios[i, b], clip_c)
                rho_t = _clip(ratios[t, b], clip_rho)
                delta = rho_t * (rewards[t, b] + discounts[t, b] * v_ext[t + 1, b] - v_ext[t, b])
                total += weight * delta
            vs[s, b] = total
    vs_ext = np.concatenate([vs, bootstrap[None]], axis=0)
    for b in range(B):
        for s in range(T):
            rho = _clip(ratios[s, b], clip_pg_rho)
            pg_adv[s, b] = rho * (rewards[s, b] + discounts[s, b] * vs_ext[s + 1, b] - values[s, b])
    return vs, pg_adv


def random_inputs(seed: int, T: int, B: int, episode_ends: bool, gamma: float = 0.99):
    rng = np.random.default_rng(seed)
    blogp = np.log(rng.uniform(0.05, 1.0, size=(T, B)))
    tlogp = blogp + rng.normal(0.0, 0.5, size=(T, B))  # ratios both above and below 1
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap = rng.normal(size=B)
    done = rng.random((T, B)) < 0.25 if episode_ends else np.zeros((T, B), dtype=bool)
    discounts = gamma * (1.0 - done)
    return blogp, tlogp, rewards, values, bootstrap, discounts


def run_torch(arrays, **clips) -> VTraceReturns:
    return vtrace(*(torch.as_tensor(a, dtype=torch.float64) for a in arrays), **clips)


@pytest.mark.parametrize("clip_rho,clip_c", CLIPS)
@pytest.mark.parametrize("episode_ends", [False, True])
@pytest.mark.parametrize("seed,T,B", [(0, 5, 3), (1, 11, 4), (2, 20, 7), (3, 16, 5)])
def test_vtrace_matches_paper_sum(seed, T, B, episode_ends, clip_rho, clip_c):
    arrays = random_inputs(seed, T, B, episode_ends)
    if episode_ends:
        assert (arrays[-1] == 0).any()  # the test really exercises cut traces
    clips = dict(clip_rho=clip_rho, clip_c=clip_c, clip_pg_rho=clip_rho)
    ref_vs, ref_pg = reference_vtrace(*arrays, **clips)
    out = run_torch(arrays, **clips)
    assert out.vs.shape == (T, B) and out.pg_advantages.shape == (T, B)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_pg, rtol=0, atol=1e-5)


@pytest.mark.parametrize("clip_pg_rho", [0.3, 1.0, None])
def test_pg_rho_clip_is_independent(clip_pg_rho):
    arrays = random_inputs(7, 9, 4, episode_ends=True)
    ref_vs, ref_pg = reference_vtrace(*arrays, clip_rho=1.0, clip_c=1.0, clip_pg_rho=clip_pg_rho)
    out = run_torch(arrays, clip_rho=1.0, clip_c=1.0, clip_pg_rho=clip_pg_rho)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_pg, rtol=0, atol=1e-5)


def test_float32_matches_reference():
    arrays = random_inputs(11, 20, 6, episode_ends=True)
    ref_vs, ref_pg = reference_vtrace(*arrays, clip_rho=1.0, clip_c=1.0, clip_pg_rho=1.0)
    out = vtrace(*(torch.as_tensor(a, dtype=torch.float32) for a in arrays))
    assert out.vs.dtype == torch.float32
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_pg, rtol=0, atol=1e-5)


@pytest.mark.parametrize("episode_ends", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_policy_equals_n_step_return(seed, episode_ends):
    blogp, _, rewards, values, bootstrap, discounts = random_inputs(seed, 12, 5, episode_ends)
    arrays = (blogp, blogp, rewards, values, bootstrap, discounts)
    out = run_torch(arrays, clip_rho=None, clip_c=None, clip_pg_rho=None)

    T, B = rewards.shape
    expected = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            ret, scale = 0.0, 1.0
            for t in range(s, T):
                ret += scale * rewards[t, b]
                scale *= discounts[t, b]
            expected[s, b] = ret + scale * bootstrap[b]
    np.testing.assert_allclose(out.vs.numpy(), expected, rtol=0, atol=1e-8)
    # On-policy, pg advantage is the one-step TD error against the V-trace target.
    next_vs = np.concatenate([expected[1:], bootstrap[None]], axis=0)
    np.testing.assert_allclose(
        out.pg_advantages.numpy(), rewards + discounts * next_vs - values, rtol=0, atol=1e-8
    )


def _loss_setup(baseline_cost: float = 0.5, entropy_cost: float = 0.01):
    blogp, tlogp, rewards, values, bootstrap, discounts = (
        torch.as_tensor(a, dtype=torch.float64) for a in random_inputs(5, 8, 3, True)
    )
    tlogp.requires_grad_(True)
    values.requires_grad_(True)
    entropy = torch.rand(8, 3, dtype=torch.float64, requires_grad=True)
    vt = vtrace(blogp, tlogp, rewards, values, bootstrap, discounts)
    loss, terms = impala_loss(tlogp, entropy, values, vt, baseline_cost, entropy_cost)
    return tlogp, values, entropy, vt, loss, terms


def test_impala_loss_gradients():
    baseline_cost, entropy_cost = 0.5, 0.01
    tlogp, values, entropy, vt, loss, _ = _loss_setup(baseline_cost, entropy_cost)
    assert not vt.vs.requires_grad and not vt.pg_advantages.requires_grad
    assert vt.vs.grad_fn is None and vt.pg_advantages.grad_fn is None
    loss.backward()
    n = tlogp.numel()
    # Policy term: d/dlogp of -mean(adv * logp) is -adv / N (advantages are constants).
    torch.testing.assert_close(tlogp.grad, -vt.pg_advantages / n)
    # Baseline term: d/dV of c * 0.5 * mean((vs - V)^2) is c * (V - vs) / N (vs constant).
    torch.testing.assert_close(values.grad, baseline_cost * (values.detach() - vt.vs) / n)
    torch.testing.assert_close(entropy.grad, torch.full_like(entropy, -entropy_cost / n))


def test_impala_loss_terms_are_finite_floats():
    tlogp, values, entropy, vt, loss, terms = _loss_setup()
    assert set(terms) == {"loss_policy", "loss_baseline", "loss_entropy", "loss_total"}
    for value in terms.values():
        assert isinstance(value, float) and math.isfinite(value)
    assert loss.dim() == 0
    assert terms["loss_total"] == pytest.approx(loss.item())
    assert terms["loss_total"] == pytest.approx(
        terms["loss_policy"] + terms["loss_baseline"] + terms["loss_entropy"]
    )
    assert terms["loss_baseline"] > 0 and terms["loss_entropy"] < 0
    expected_policy = -(vt.pg_advantages * tlogp.detach()).mean().item()
    assert terms["loss_policy"] == pytest.approx(expected_policy)


def test_light_adam_matches_torch_adam():
    from zmqrl.parts.algos.optim import LightAdam

    torch.manual_seed(0)
    a = torch.nn.Linear(5, 3)
    b = torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    start = a.weight.detach().clone()
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    opt_b = LightAdam(b.parameters(), lr=1e-2, eps=1e-5)
    for _ in range(20):
        x = torch.randn(8, 5)
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)
    assert (a.weight - start).abs().max() > 1e-3  # it did train
