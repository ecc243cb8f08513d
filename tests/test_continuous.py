"""Gaussian ActorCritic heads checked against torch.distributions, observation
normalization against numpy, and the actor-critic learners on continuous batches."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from zmqrl.parts.actor_critic.a2c import A2CConfig, A2CLearner
from zmqrl.parts.actor_critic.learner import evaluate_unrolls
from zmqrl.parts.actor_critic.models import ActorCritic
from zmqrl.parts.actor_critic.vtrace import VTraceConfig, VTraceLearner, impala_loss, vtrace
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import build_model, load_state_arrays, state_arrays
from zmqrl.parts.models.feedforward import init_orthogonal, mlp
from zmqrl.parts.models.normalization import RunningNorm

DISCRETE = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
                   action_dtype=np.dtype(np.int64), num_actions=3)
# Asymmetric bounds, so the affine part of the tanh squash is exercised.
LOW = np.array([-1.0, 0.0], np.float32)
HIGH = np.array([1.0, 3.0], np.float32)
BOX = EnvSpec(obs_shape=(3,), obs_dtype=np.dtype(np.float32), action_shape=(2,),
              action_dtype=np.dtype(np.float32), num_actions=None,
              action_low=LOW, action_high=HIGH)
HEADS = [("state_independent", "clip"), ("learned", "clip"),
         ("state_independent", "tanh"), ("learned", "tanh")]


def box_model(log_std: str, squash: str, seed: int = 0, **options) -> ActorCritic:
    model = build_model({"kind": "mlp", "hidden": [16, 16], "log_std": log_std,
                         "squash": squash, **options}, BOX, seed)
    assert isinstance(model, ActorCritic)
    return model


def reference_dist(model: ActorCritic, obs: torch.Tensor):
    """The same policy as a torch.distributions object (per-dimension log-probs)."""
    out = model.policy(obs)
    if model.learned_std:
        mean, log_std = out.split(model.action_dim, dim=-1)
        log_std = log_std.clamp(-20, 2)
    else:
        mean, log_std = out, model.log_std.expand_as(out)
    base = Normal(mean, log_std.exp())
    if model.squash == "clip":
        return base, base
    low, high = (torch.as_tensor(b, dtype=mean.dtype) for b in (LOW, HIGH))
    squashed = TransformedDistribution(
        base, [TanhTransform(), AffineTransform(loc=(high + low) / 2, scale=(high - low) / 2)])
    return base, squashed


# ------------------------------------------------------------------ Gaussian heads


@pytest.mark.parametrize("log_std,squash", HEADS)
def test_gaussian_logp_and_entropy_match_torch_distributions(log_std, squash):
    # float64 so the comparison is about the formula, not rounding.
    model = box_model(log_std, squash, seed=1, log_std_init=-0.3).double()
    with torch.no_grad():  # a non-trivial policy: means and spreads vary by state
        for p in model.policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    g = torch.Generator().manual_seed(2)
    obs = torch.randn(64, 3, generator=g, dtype=torch.float64)
    base, dist = reference_dist(model, obs)
    # |u| <= 6 keeps tanh actions clear of the [-1 + 1e-6, 1 - 1e-6] clamp that makes
    # atanh finite on the bounds (beyond it the model's density is the clamped point's).
    u = base.sample().clamp(-6, 6)
    action = u if squash == "clip" else dist.transforms[1](torch.tanh(u))
    logp, entropy, value = model.evaluate(obs, action)
    assert logp.shape == entropy.shape == value.shape == (64,)
    torch.testing.assert_close(logp, dist.log_prob(action).sum(-1), rtol=1e-9, atol=1e-9)
    # tanh: the base Gaussian's entropy (documented: no closed form after squashing).
    torch.testing.assert_close(entropy, base.entropy().sum(-1), rtol=1e-12, atol=1e-12)
    if squash == "tanh":
        assert ((action > torch.from_numpy(LOW).double())
                & (action < torch.from_numpy(HIGH).double())).all()
    else:
        # Clip mode: log-probs of raw samples outside the bounds are the Gaussian's too.
        far = action + 5.0
        torch.testing.assert_close(model.evaluate(obs, far)[0],
                                   base.log_prob(far).sum(-1), rtol=1e-9, atol=1e-9)


def test_tanh_logp_finite_on_the_bounds():
    model = box_model("state_independent", "tanh")
    obs = torch.randn(4, 3)
    for bound in (LOW, HIGH):
        action = torch.from_numpy(np.tile(bound, (4, 1)))
        logp = model.evaluate(obs, action)[0]
        assert torch.isfinite(logp).all()


@pytest.mark.parametrize("log_std,squash", HEADS)
def test_act_matches_evaluate(log_std, squash):
    model = box_model(log_std, squash, seed=3, log_std_init=1.0)  # wide: hits the bounds
    obs = torch.randn(256, 3)
    torch.manual_seed(0)
    action, logp = model.act(obs)
    assert action.dtype == torch.float32 and action.shape == (256, 2)
    assert logp.dtype == torch.float32 and logp.shape == (256,)
    low, high = torch.from_numpy(LOW), torch.from_numpy(HIGH)
    inside = ((action >= low) & (action <= high)).all()
    # clip: the raw sample ships (the env side clips); tanh: always inside the bounds.
    assert bool(inside) == (squash == "tanh")
    with torch.no_grad():
        torch.testing.assert_close(model.evaluate(obs, action)[0], logp, rtol=1e-5,
                                   atol=1e-5)


def test_gaussian_init_and_options():
    model = box_model("state_independent", "clip", log_std_init=-0.5)
    assert torch.equal(model.log_std.detach(), torch.full((2,), -0.5))
    assert set(model.state_dict()) == {"log_std", "policy.0.weight", "policy.0.bias",
                                       "policy.2.weight", "policy.2.bias", "policy.4.weight",
                                       "policy.4.bias", "value.0.weight", "value.0.bias",
                                       "value.2.weight", "value.2.bias", "value.4.weight",
                                       "value.4.bias"}
    learned = box_model("learned", "tanh", log_std_init=-1.0)
    head = learned.policy[-1]
    assert head.out_features == 4 and torch.equal(head.bias[2:], torch.full((2,), -1.0))
    assert torch.equal(head.bias[:2], torch.zeros(2))
    # Orthogonal init, small policy head: rows of the (4 x 16) head are orthogonal * 0.01.
    gram = head.weight @ head.weight.T
    torch.testing.assert_close(gram, 1e-4 * torch.eye(4), atol=1e-9, rtol=0)
    # The bounds are derived buffers, not shipped parameters.
    assert "action_low" not in learned.state_dict()
    with pytest.raises(ValueError, match="log_std"):
        build_model({"log_std": "fixed"}, BOX)
    with pytest.raises(ValueError, match="squash"):
        build_model({"squash": "sigmoid"}, BOX)
    unbounded = EnvSpec((3,), np.dtype(np.float32), (2,), np.dtype(np.float32), None,
                        np.full(2, -np.inf, np.float32), np.full(2, np.inf, np.float32))
    with pytest.raises(ValueError, match="finite"):
        build_model({"squash": "tanh"}, unbounded)
    build_model({"squash": "clip"}, unbounded)  # clip needs no bounds


# ------------------------------------------------------------------ discrete unchanged


class OldActorCritic(nn.Module):
    """The discrete ActorCritic before Gaussian heads, verbatim."""

    def __init__(self, spec: EnvSpec, hidden=(64, 64)):
        hidden = list(hidden)
        super().__init__()
        obs_dim = int(torch.tensor(spec.obs_shape).prod()) if spec.obs_shape else 1
        self.policy = mlp([obs_dim, *hidden, spec.num_actions])
        self.value = mlp([obs_dim, *hidden, 1])
        init_orthogonal(self.policy, 0.01)
        init_orthogonal(self.value, 1.0)

    def forward(self, obs):
        flat = obs.reshape(obs.shape[0], -1)
        return self.policy(flat), self.value(flat).squeeze(-1)

    @torch.inference_mode()
    def act(self, obs):
        logp_all = torch.log_softmax(self.policy(obs.reshape(obs.shape[0], -1)), dim=-1)
        action = torch.multinomial(logp_all.exp(), 1)
        return action.squeeze(-1), logp_all.gather(-1, action).squeeze(-1)


def test_discrete_unchanged_bit_for_bit():
    torch.manual_seed(7)
    old = OldActorCritic(DISCRETE, hidden=[32, 16])
    new = build_model({"hidden": [32, 16]}, DISCRETE, seed=7)
    assert new.obs_norm is None
    old_state, new_state = old.state_dict(), new.state_dict()
    assert list(old_state) == list(new_state)
    assert all(torch.equal(old_state[k], new_state[k]) for k in old_state)
    obs = torch.randn(50, 4)
    torch.manual_seed(1)
    a_old, lp_old = old.act(obs)
    torch.manual_seed(1)
    a_new, lp_new = new.act(obs)
    assert torch.equal(a_old, a_new) and torch.equal(lp_old, lp_new)
    for x, y in zip(old(obs), new(obs), strict=True):
        assert torch.equal(x, y)
    logp, entropy, value = new.evaluate(obs, a_new.clone())  # clone: not an inference tensor
    torch.testing.assert_close(logp, lp_new)
    logp_all = torch.log_softmax(old(obs)[0], -1)
    torch.testing.assert_close(entropy, -(logp_all.exp() * logp_all).sum(-1))
    torch.testing.assert_close(value, old(obs)[1])


# ------------------------------------------------------------------ observation norm


def test_running_norm_matches_numpy_over_chunks():
    rng = np.random.default_rng(0)
    data = rng.normal(loc=[100.0, -3.0, 0.0], scale=[5.0, 0.1, 1.0], size=(300, 3))
    norm = RunningNorm(3)
    x0 = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(norm(x0), x0, atol=1e-4, rtol=0)  # identity before updates
    for chunk in np.array_split(data, [1, 50, 51, 200]):  # incl. one-sample chunks
        norm.update(torch.from_numpy(chunk).float())
    data32 = data.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), data32.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norm.var.numpy(), data32.var(0), rtol=1e-8)
    assert norm.count.item() == 300
    out = norm(torch.from_numpy(data).float())
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.mean(0).numpy(), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(0, unbiased=False).numpy(), 1.0, atol=1e-4)
    far = norm(torch.tensor([[1e6, 0.0, -1e6]]))
    assert far[0, 0] == 10.0 and far[0, 2] == -10.0  # clipped


def test_running_norm_reduce_merges_all_ranks():
    """Two "ranks" in threads with a summing reduce end with identical statistics: those
    of the union of their batches."""
    rng = np.random.default_rng(1)
    batches = [[torch.from_numpy(rng.normal(r, 1 + r, size=(n, 2))) for n in (7, 30)]
               for r in range(2)]
    packs: list[torch.Tensor | None] = [None, None]
    barrier = threading.Barrier(2, timeout=10)

    def reduce_for(rank: int):
        def reduce(t: torch.Tensor) -> None:
            packs[rank] = t.clone()
            barrier.wait()
            total = packs[0] + packs[1]  # the same order on both ranks
            barrier.wait()
            t.copy_(total)
        return reduce

    norms = [RunningNorm(2), RunningNorm(2)]

    def run(rank: int) -> None:
        for batch in batches[rank]:
            norms[rank].update(batch, reduce=reduce_for(rank))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    everything = torch.cat([b for rank in batches for b in rank]).numpy()
    for key in ("mean", "var", "count"):
        assert torch.equal(getattr(norms[0], key), getattr(norms[1], key))
    np.testing.assert_allclose(norms[0].mean.numpy(), everything.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norms[0].var.numpy(), everything.var(0), rtol=1e-10)
    assert norms[0].count.item() == len(everything)


def test_obs_norm_in_model_travels_with_state():
    learner_side = box_model("state_independent", "clip", obs_norm=True)
    actor_side = box_model("state_independent", "clip", obs_norm=True)
    assert isinstance(learner_side.obs_norm, RunningNorm)
    learner_side.obs_norm.update(10 + 3 * torch.randn(100, 3))
    arrays = state_arrays(learner_side)
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(arrays)
    load_state_arrays(actor_side, arrays)
    obs = 10 + 3 * torch.randn(5, 3)
    torch.testing.assert_close(actor_side.state_values(obs), learner_side.state_values(obs))
    torch.testing.assert_close(actor_side(obs)[0], learner_side(obs)[0])


# ------------------------------------------------------------------ learners


def continuous_batch(T: int = 6, B: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(T + 1, B, 3, generator=g),
        "action": torch.rand(T, B, 2, generator=g) * 2 - 0.5,  # some beyond the bounds
        "logp": -2.0 - torch.rand(T, B, generator=g),
        "reward": torch.randn(T, B, generator=g),
        "done": torch.rand(T, B, generator=g) < 0.2,
    }


@pytest.mark.parametrize("squash", ["clip", "tanh"])
def test_evaluate_unrolls_continuous(squash):
    model = box_model("state_independent", squash)
    batch = continuous_batch(T=5, B=3)
    logp, entropy, values = evaluate_unrolls(model, batch)
    assert logp.shape == entropy.shape == (5, 3) and values.shape == (6, 3)
    flat_logp, _, flat_values = model.evaluate(batch["obs"][:5].reshape(15, 3),
                                               batch["action"].reshape(15, 2))
    torch.testing.assert_close(logp.reshape(-1), flat_logp)
    torch.testing.assert_close(values[:5].reshape(-1), flat_values)
    torch.testing.assert_close(values[5], model.state_values(batch["obs"][5]))
    assert logp.requires_grad and values.requires_grad


def fixed_target_loss(model, batch, returns, cfg: VTraceConfig) -> float:
    """The IMPALA loss with V-trace targets held at ``returns``: the objective the first
    step descends (the learner recomputes the targets each step)."""
    with torch.no_grad():
        logp, entropy, values = evaluate_unrolls(model, batch)
        T = batch["action"].shape[0]
        return impala_loss(logp, entropy, values[:T], returns, cfg.baseline_cost,
                           cfg.entropy_cost)[0].item()


@pytest.mark.parametrize("squash", ["clip", "tanh"])
def test_vtrace_update_reduces_loss_on_continuous_batch(squash):
    model = box_model("learned", squash, seed=4)
    cfg = VTraceConfig(lr=1e-3, light_adam=True)
    learner = VTraceLearner(cfg, model)
    batch = continuous_batch()
    with torch.no_grad():
        logp, _, values = evaluate_unrolls(model, batch)
        returns = vtrace(batch["logp"], logp, batch["reward"], values[:-1], values[-1],
                         cfg.discount * (~batch["done"]).float())
    before = fixed_target_loss(model, batch, returns, cfg)
    for _ in range(10):
        terms = learner.update(batch)
    assert all(np.isfinite(v) for v in terms.values())
    assert fixed_target_loss(model, batch, returns, cfg) < before - 0.05


def test_vtrace_updates_obs_norm_with_unroll_steps_only():
    model = box_model("state_independent", "clip", obs_norm=True)
    learner = VTraceLearner(VTraceConfig(light_adam=True), model)
    batch = continuous_batch(T=6, B=4)
    learner.update(batch)
    assert model.obs_norm.count.item() == 6 * 4  # not the bootstrap row
    np.testing.assert_allclose(model.obs_norm.mean.numpy(),
                               batch["obs"][:6].reshape(-1, 3).double().mean(0).numpy(),
                               rtol=1e-6)


def test_a2c_runs_on_continuous_batch():
    model = box_model("state_independent", "tanh", seed=5)
    learner = A2CLearner(A2CConfig(), model)
    start = [p.detach().clone() for p in model.parameters()]
    terms = learner.update(continuous_batch())
    assert np.isfinite(terms["loss_total"])
    assert any(not torch.equal(p, s) for p, s in zip(model.parameters(), start, strict=True))
