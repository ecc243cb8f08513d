"""MuZero's model side: the value transform and its categorical support, the two
networks of the ``muzero`` interface, and the learner's unrolled loss."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.muzero.config import MuZeroConfig
from zmqrl.parts.muzero.learner import MuZeroLearner, muzero_loss, scale_gradient
from zmqrl.parts.muzero.models import MuZeroConv, MuZeroMLP
from zmqrl.parts.muzero.support import h, h_inverse, scalar_to_support, support_to_scalar

torch.set_num_threads(1)

CARTPOLE = EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int64), 2)
MINATAR = EnvSpec((4, 10, 10), np.dtype(np.uint8), (), np.dtype(np.int64), 3)
BOX = EnvSpec((3,), np.dtype(np.float32), (1,), np.dtype(np.float32), None,
              np.array([-1.0], np.float32), np.array([1.0], np.float32))


def test_h_and_its_inverse():
    x = torch.cat([torch.linspace(-1e4, 1e4, 2001), torch.linspace(-3, 3, 601),
                   torch.tensor([0.0, 1e-6, -1e-6, 117.0, -117.0])])
    back = h_inverse(h(x))
    assert torch.allclose(back, x, rtol=1e-5, atol=1e-4), (back - x).abs().max()
    y = torch.linspace(-200, 200, 801)
    assert torch.allclose(h(h_inverse(y)), y, rtol=1e-5, atol=1e-4)
    # known points: h(0) = 0, h(3) = 1 + 3e-3, h(-8) = -(2 + 8e-3), h(99) = 9 + 0.099
    known = h(torch.tensor([0.0, 3.0, -8.0, 99.0]))
    assert torch.allclose(known, torch.tensor([0.0, 1.003, -2.008, 9.099]), atol=1e-6)
    assert h(torch.tensor(0.0)).item() == 0.0 and h_inverse(torch.tensor(0.0)).item() == 0.0
    # eps = 0: the plain square-root transform, still inverted
    assert torch.allclose(h_inverse(h(x, eps=0.0), eps=0.0), x, rtol=1e-5, atol=1e-4)


def test_two_hot_and_round_trip():
    size = 10
    limit = h_inverse(torch.tensor(float(size))).item()  # ~118: the support's reach
    x = torch.cat([torch.linspace(-limit, limit, 1001),
                   torch.tensor([0.0, 1.0, -1.0, 0.5, 3.0, limit, -limit])])
    two_hot = scalar_to_support(x, size)
    assert two_hot.shape == (x.numel(), 2 * size + 1)
    assert (two_hot >= 0).all()
    assert torch.allclose(two_hot.sum(-1), torch.ones(x.numel()))
    # at most two bins, adjacent
    for row in two_hot:
        bins = torch.nonzero(row).flatten()
        assert 1 <= bins.numel() <= 2
        if bins.numel() == 2:
            assert bins[1] - bins[0] == 1
    # the expectation of the bins is h(x)
    bins = torch.arange(-size, size + 1, dtype=torch.float32)
    assert torch.allclose((two_hot * bins).sum(-1), h(x), atol=1e-5)
    # scalar -> support -> logits -> scalar
    back = support_to_scalar(torch.log(two_hot), size)
    assert torch.allclose(back, x, atol=1e-4, rtol=1e-6), (back - x).abs().max()
    # outside the support's range: clipped to its ends
    outside = torch.tensor([1e4, -1e4, 500.0])
    clipped = support_to_scalar(torch.log(scalar_to_support(outside, size)), size)
    assert torch.allclose(clipped, torch.tensor([limit, -limit, limit]), rtol=1e-5)
    # batch shape kept: [B, K] -> [B, K, bins]
    assert scalar_to_support(torch.zeros(3, 5), size).shape == (3, 5, 2 * size + 1)
    assert support_to_scalar(torch.zeros(3, 5, 2 * size + 1), size).shape == (3, 5)


@pytest.mark.parametrize("make,spec,obs", [
    (MuZeroMLP, CARTPOLE, lambda n: torch.randn(n, 4)),
    (MuZeroConv, MINATAR, lambda n: torch.randint(0, 2, (n, 4, 10, 10), dtype=torch.uint8)),
])
def test_models_shapes_and_init(make, spec, obs):
    torch.manual_seed(0)
    model = make(spec, latent_size=16, hidden=32, support_size=5)
    assert model.interface == "muzero"
    assert (model.latent_size, model.support_size, model.num_actions) == \
        (16, 5, spec.num_actions)
    x = obs(6)
    latent = model.represent(x)
    assert latent.shape == (6, 16) and latent.dtype == torch.float32
    assert latent.min() >= 0 and latent.max() <= 1
    # per row: the smallest entry 0, the largest 1
    assert torch.allclose(latent.min(-1).values, torch.zeros(6))
    assert torch.allclose(latent.max(-1).values, torch.ones(6))
    action = torch.arange(6) % spec.num_actions
    next_latent, reward_logits = model.dynamics(latent, action)
    assert next_latent.shape == (6, 16) and reward_logits.shape == (6, 11)
    assert next_latent.min() >= 0 and next_latent.max() <= 1
    policy_logits, value_logits = model.predict(next_latent)
    assert policy_logits.shape == (6, spec.num_actions) and value_logits.shape == (6, 11)
    # zero-initialised heads: uniform policy, value and reward 0
    assert (policy_logits == 0).all() and (value_logits == 0).all()
    assert (reward_logits == 0).all()
    assert torch.allclose(support_to_scalar(value_logits, 5), torch.zeros(6), atol=1e-6)
    latent0, logits, value = model.initial_inference(x)
    assert latent0.shape == (6, 16) and logits.shape == (6, spec.num_actions)
    assert value.shape == (6,)
    out = model.recurrent_inference(latent0, action)
    assert [t.shape for t in out] == [(6, 16), (6,), (6, spec.num_actions), (6,)]


def test_models_refuse_what_they_cannot_serve():
    with pytest.raises(ValueError, match="discrete action space"):
        MuZeroMLP(BOX)
    with pytest.raises(ValueError, match="discrete action space"):
        MuZeroConv(EnvSpec((3, 5, 5), np.dtype(np.float32), (1,), np.dtype(np.float32), None))
    with pytest.raises(ValueError, match=r"\[C, H, W\]"):
        MuZeroConv(CARTPOLE)


def test_scale_gradient():
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = scale_gradient(x * 2, 0.25)
    assert torch.equal(y, x.detach() * 2)
    y.sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 0.5))


K, A, B = 3, 2, 8


def _batch(seed: int = 0, size: int = B) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    policy = torch.rand(size, K + 1, A, generator=g)
    mask = torch.ones(size, K + 1, dtype=torch.bool)
    mask[: size // 2, 2:] = False  # half the items end after one step
    return {"obs": torch.randn(size, 4, generator=g),
            "action": torch.randint(0, A, (size, K), generator=g),
            "reward": torch.rand(size, K, generator=g) * 2,
            "value": torch.randn(size, K + 1, generator=g) * 3,
            "policy": policy / policy.sum(-1, keepdim=True),
            "mask": mask, "weight": torch.ones(size)}


def _setup(**overrides):
    torch.manual_seed(1)
    model = MuZeroMLP(CARTPOLE, latent_size=16, hidden=32, support_size=5)
    cfg = MuZeroConfig(**{"unroll_steps": K, "batch_size": B, "lr": 3e-3, **overrides})
    return model, MuZeroLearner(cfg, model)


def _paper_loss(model, batch, value_cost):
    """The unrolled loss as the paper's pseudocode (``update_weights``) computes it: the
    hidden state's gradient scaled by 0.5 *after* each recurrent step's predictions,
    each unrolled step's loss scaled by 1/K."""
    from zmqrl.parts.muzero.learner import _cross_entropy

    size = model.support_size
    value_t = scalar_to_support(batch["value"], size)
    reward_t = scalar_to_support(batch["reward"], size)
    mask = batch["mask"].float()
    hidden = model.represent(batch["obs"])
    policy, value = model.predict(hidden)
    loss = value_cost * _cross_entropy(value, value_t[:, 0]) + \
        _cross_entropy(policy, batch["policy"][:, 0]) * mask[:, 0]
    for k in range(1, K + 1):
        hidden, reward = model.dynamics(hidden, batch["action"][:, k - 1])
        policy, value = model.predict(hidden)
        step = (value_cost * _cross_entropy(value, value_t[:, k])
                + _cross_entropy(policy, batch["policy"][:, k]) * mask[:, k]
                + _cross_entropy(reward, reward_t[:, k - 1]) * mask[:, k - 1])
        loss = loss + step / K
        hidden = scale_gradient(hidden, 0.5)
    return loss


def test_unrolled_gradient_is_the_papers():
    """Every parameter's gradient equals that of the paper's pseudocode, where the 0.5
    scale sits after each step's predictions (step k's losses reach the representation
    with 0.5^(k-1)). Scaled before them, as it was, step 1's value and policy losses
    reached the dynamics and representation halved."""
    model, _ = _setup()
    with torch.no_grad():  # heads that pass gradient on (they start at zero)
        for name in ("value", "policy", "reward"):
            getattr(model, name).weight.normal_(std=0.3)
    batch = _batch()
    ours = muzero_loss(model, batch, 0.25)[0].sum()
    theirs = _paper_loss(copy.deepcopy(model), batch, 0.25).sum()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    grads = torch.autograd.grad(ours, list(model.parameters()))
    reference = copy.deepcopy(model)
    ref_loss = _paper_loss(reference, batch, 0.25).sum()
    ref_grads = torch.autograd.grad(ref_loss, list(reference.parameters()))
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads, strict=True):
        assert r.abs().max() > 1e-4, name  # every parameter is reached
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-6), name


def test_learner_fits_a_fixed_batch():
    model, learner = _setup(lr=1e-2)
    batch = _batch()
    first, priorities = learner.update(batch)
    assert set(first) >= {"loss", "value_loss", "reward_loss", "policy_loss", "value_mean",
                          "grad_norm", "lr"}
    assert all(math.isfinite(v) for v in first.values())
    assert priorities.shape == (B,) and torch.isfinite(priorities).all()
    # at init the value is 0: the priority is |z_0| + eps
    assert torch.allclose(priorities, batch["value"][:, 0].abs() + 1e-3, atol=1e-5)
    for _ in range(99):
        learner.update(batch)
    with torch.no_grad():  # what the next update's priorities are: its error before it
        _, _, before = muzero_loss(model, batch, 0.25)
    terms, priorities = learner.update(batch)
    assert torch.allclose(priorities, (before - batch["value"][:, 0]).abs() + 1e-3, atol=1e-5)
    # (the cross-entropies cannot reach 0: two-hot and random policy targets have entropy)
    assert terms["loss"] < 0.6 * first["loss"], (first, terms)
    for key in ("value_loss", "reward_loss", "policy_loss"):
        assert terms[key] < first[key], key
    with torch.no_grad():
        _, _, value = muzero_loss(model, batch, 0.25)
    error = (value - batch["value"][:, 0]).abs()
    assert error.mean() < 0.3 * batch["value"][:, 0].abs().mean(), error
    assert learner.updates == 101


def test_policy_loss_ignores_masked_positions():
    model, _ = _setup()
    with torch.no_grad():  # a policy that is not uniform (else every target scores log A)
        model.policy.weight.normal_(std=0.5)
    batch = _batch()
    changed = dict(batch, policy=batch["policy"].clone())
    masked = ~batch["mask"]
    assert masked.any()
    changed["policy"][masked] = torch.tensor([1.0, 0.0])
    loss, terms, _ = muzero_loss(model, batch, 0.25)
    loss2, terms2, _ = muzero_loss(model, changed, 0.25)
    assert torch.equal(loss, loss2) and torch.equal(terms["policy_loss"],
                                                    terms2["policy_loss"])
    # where the mask is true, it does count
    changed["policy"][batch["mask"]] = torch.tensor([1.0, 0.0])
    assert not torch.equal(muzero_loss(model, changed, 0.25)[0], loss)
    # the reward of a step past the end is masked too (mask[:, k-1] for reward k)
    rewards = dict(batch, reward=batch["reward"].clone())
    rewards["reward"][~batch["mask"][:, :K]] += 5.0
    assert torch.equal(muzero_loss(model, rewards, 0.25)[0], loss)


def test_importance_weights_scale_the_loss():
    batch = _batch()
    _, learner = _setup(weight_decay=0.0)
    terms, _ = learner.update(batch)
    _, learner = _setup(weight_decay=0.0)
    halved, _ = learner.update(dict(batch, weight=torch.full((B,), 0.5)))
    assert halved["loss"] == pytest.approx(0.5 * terms["loss"], rel=1e-5)
    assert halved["grad_norm"] == pytest.approx(0.5 * terms["grad_norm"], rel=1e-4)
    # one item's weight 0: its loss is left out
    model, learner = _setup(weight_decay=0.0)
    weights = torch.ones(B)
    weights[0] = 0.0
    per_item, _, _ = muzero_loss(model, batch, learner.cfg.value_cost)
    terms, _ = learner.update(dict(batch, weight=weights))
    assert terms["loss"] == pytest.approx(per_item[1:].sum().item() / B, rel=1e-5)


def test_state_dict_round_trip():
    model, learner = _setup()
    batch = _batch()
    for _ in range(3):
        learner.update(batch)
    twin_model = copy.deepcopy(model)
    twin = MuZeroLearner(learner.cfg, twin_model)
    # a copy, as a checkpoint's: torch's Adam loads its state tensors without copying
    twin.load_state_dict(copy.deepcopy(learner.state_dict()))
    assert twin.updates == 3
    a, pa = learner.update(batch)
    b, pb = twin.update(batch)
    assert a == b and torch.equal(pa, pb)
    for p, q in zip(model.parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_config():
    cfg = MuZeroConfig()
    assert (cfg.kind, cfg.family, cfg.items, cfg.behaviour, cfg.source,
            cfg.model_interface) == ("muzero", "search", "search_targets", "latent_search",
                                     "replay", "muzero")
    assert cfg.items_per_env_step() == 1
    assert (cfg.unroll_steps, cfg.td_steps, cfg.num_simulations) == (5, 10, 25)
    with pytest.raises(ValueError, match="algo.discount"):
        MuZeroConfig(discount=1.5)
    with pytest.raises(ValueError, match="algo.unroll_steps"):
        MuZeroConfig(unroll_steps=0)


def test_consistency_loss_teaches_the_dynamics_what_it_reaches():
    """With ``consistency_cost`` (EfficientZero's term) each unrolled latent is pulled
    toward the representation of the observation really reached (its gradient
    stopped): the term falls as the learner fits a fixed batch, and the represented
    targets are not what it moves (no gradient reaches them through the target)."""
    model, learner = _setup(consistency_cost=2.0, lr=1e-2)
    batch = _batch()
    g = torch.Generator().manual_seed(3)
    batch["obs_unroll"] = torch.randn(B, K, 4, generator=g)
    loss, terms, _ = muzero_loss(model, batch, 0.25, consistency_cost=2.0)
    plain, _, _ = muzero_loss(model, batch, 0.25)
    assert -1.0 <= terms["consistency_loss"].item() <= 1.0
    assert not torch.allclose(loss, plain)  # the term counts
    first = learner.update(batch)[0]
    for _ in range(60):
        last = learner.update(batch)[0]
    assert last["consistency_loss"] < first["consistency_loss"] - 0.05, (first, last)
    # the target's gradient is stopped: nothing flows back into obs_unroll
    reached = batch["obs_unroll"].clone().requires_grad_()
    consistency, _, _ = muzero_loss(model, dict(batch, obs_unroll=reached), 0.0,
                                    consistency_cost=1.0)
    consistency.sum().backward()
    assert reached.grad is None


def _with_bootstrap(batch: dict[str, torch.Tensor], seed: int = 5) -> dict[str, torch.Tensor]:
    """``batch`` plus the bootstrap arrays: some targets bootstrap (discount 0.9^2),
    the rest end in a terminal state (discount 0, the observation zeros)."""
    g = torch.Generator().manual_seed(seed)
    size = batch["obs"].shape[0]
    discount = torch.full((size, K + 1), 0.81)
    discount[: size // 2, 2:] = 0.0
    obs = torch.randn(size, K + 1, 4, generator=g) * (discount > 0)[..., None]
    return {**batch, "obs_bootstrap": obs, "bootstrap_discount": discount,
            "partial_return": torch.rand(size, K + 1, generator=g) * 3}


def test_bootstrapped_values_are_the_reward_sum_and_the_discounted_value():
    from zmqrl.parts.muzero.learner import bootstrapped_values

    model, _ = _setup()
    batch = _with_bootstrap(_batch())
    z = bootstrapped_values(model, batch)
    with torch.no_grad():
        _, logits = model.predict(model.represent(batch["obs_bootstrap"].flatten(0, 1)))
        v = support_to_scalar(logits, model.support_size).view(B, K + 1)
    expected = batch["partial_return"] + batch["bootstrap_discount"] * v
    assert torch.allclose(z, expected, atol=1e-5)
    ended = batch["bootstrap_discount"] == 0
    assert ended.any() and torch.equal(z[ended], batch["partial_return"][ended])


def test_target_network_sets_the_value_targets_and_lags_n_updates():
    """With ``target_update_every`` N the stored value targets are not what the learner
    fits: it recomputes them with a copy of its network taken every N updates."""
    from zmqrl.parts.muzero.learner import bootstrapped_values

    with pytest.raises(ValueError, match="algo.target_update_every"):
        MuZeroConfig(target_update_every=-1)
    assert MuZeroConfig(target_update_every=10).bootstrap_arrays
    assert not MuZeroConfig().bootstrap_arrays
    assert not MuZeroConfig(target_update_every=10).unroll_observations
    model, learner = _setup(target_update_every=3)
    batch = _with_bootstrap(_batch())
    # the stored targets are garbage: the priorities show they were not used
    garbage = dict(batch, value=torch.full((B, K + 1), 1e3))
    snapshots = []
    for _ in range(7):
        before = copy.deepcopy(model)
        _, priorities = learner.update(garbage)
        snapshots.append(before)
        assert (priorities < 100).all()  # |v - z| with z recomputed, not 1e3
    # updates 0..6: the target was taken before updates 0, 3 and 6
    for name, p in learner.target.state_dict().items():
        assert torch.equal(p, snapshots[6].state_dict()[name]), name
    z = bootstrapped_values(snapshots[6], batch)
    assert torch.allclose(bootstrapped_values(learner.target, batch), z)
    assert not torch.allclose(bootstrapped_values(model, batch), z)  # it moved since
    # the target travels with the learner's state (a resumed run keeps its lag)
    twin = MuZeroLearner(learner.cfg, copy.deepcopy(model))
    twin.load_state_dict(copy.deepcopy(learner.state_dict()))
    assert torch.allclose(bootstrapped_values(twin.target, batch), z)
