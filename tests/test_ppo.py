"""PPO: GAE against a brute-force sum, the clipped objective on a hand example, updates
that reduce the loss, and two gloo ranks that stay bitwise identical."""

from __future__ import annotations

import math
import multiprocessing
import socket
import time
from datetime import timedelta

import numpy as np
import pytest
import torch

from zmqrl.parts.actor_critic.a2c import nstep_returns
from zmqrl.parts.actor_critic.ppo import PPOConfig, PPOLearner, gae, ppo_loss
from zmqrl.parts.algos import ALGOS, UNROLL_ALGOS, make_algo
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import build_model

BOX = EnvSpec(obs_shape=(3,), obs_dtype=np.dtype(np.float32), action_shape=(2,),
              action_dtype=np.dtype(np.float32), num_actions=None,
              action_low=np.array([-1.0, 0.0], np.float32),
              action_high=np.array([1.0, 3.0], np.float32))
DISCRETE = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
                   action_dtype=np.dtype(np.int64), num_actions=3)
KEYS = {"loss_policy", "loss_value", "entropy", "approx_kl", "clip_frac", "grad_norm", "lr",
        "loss_total"}


def on_policy_batch(model, spec: EnvSpec, T: int, B: int, seed: int) -> dict:
    """Random observations and rewards, actions and behaviour log-probs from ``model``."""
    g = torch.Generator().manual_seed(seed)
    obs = 2 + 3 * torch.randn(T + 1, B, *spec.obs_shape, generator=g)
    torch.manual_seed(seed)
    action, logp = model.act(obs[:T].reshape(T * B, *spec.obs_shape))
    return {
        "obs": obs,
        "action": action.reshape(T, B, *spec.action_shape).clone(),
        "logp": logp.reshape(T, B).clone(),
        "reward": torch.randn(T, B, generator=g),
        "done": torch.rand(T, B, generator=g) < 0.15,
    }


# ------------------------------------------------------------------ GAE


def reference_gae(rewards, values, bootstrap, discounts, lam):
    """A_s = sum_{t>=s} (prod_{i=s}^{t-1} discount_i lam) delta_t, summed explicitly."""
    T, B = rewards.shape
    v_ext = np.concatenate([values, bootstrap[None]], axis=0)
    adv = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, weight = 0.0, 1.0
            for t in range(s, T):
                delta = rewards[t, b] + discounts[t, b] * v_ext[t + 1, b] - v_ext[t, b]
                total += weight * delta
                weight *= discounts[t, b] * lam
            adv[s, b] = total
    return adv


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
@pytest.mark.parametrize("seed,T,B", [(0, 6, 3), (1, 13, 4)])
def test_gae_matches_brute_force(seed, T, B, lam):
    rng = np.random.default_rng(seed)
    rewards, values = rng.normal(size=(T, B)), rng.normal(size=(T, B))
    bootstrap = rng.normal(size=B)
    done = rng.random((T, B)) < 0.25
    assert done.any()  # episode ends are exercised
    discounts = 0.99 * (1.0 - done)
    tensors = [torch.as_tensor(a) for a in (rewards, values, bootstrap, discounts)]
    adv, ret = gae(*tensors, lam)
    np.testing.assert_allclose(adv.numpy(), reference_gae(rewards, values, bootstrap,
                                                          discounts, lam), atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), adv.numpy() + values, atol=1e-12)
    if lam == 1.0:  # Monte Carlo returns bootstrapped at the end
        expected = nstep_returns(tensors[0], tensors[3], tensors[2])
        np.testing.assert_allclose(ret.numpy(), expected.numpy(), atol=1e-10)


# ------------------------------------------------------------------ loss


def test_clipped_objective_hand_example():
    cfg = PPOConfig(clip=0.2, normalize_advantages=False, value_cost=0.5, entropy_cost=0.01)
    ratio = torch.tensor([0.5, 1.0, 1.5, 1.1], dtype=torch.float64)
    new_logp = ratio.log().requires_grad_(True)
    old_logp = torch.zeros(4, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0], dtype=torch.float64)
    new_v = torch.tensor([0.1, 0.5, -0.3, 1.0], dtype=torch.float64, requires_grad=True)
    old_v = torch.zeros(4, dtype=torch.float64)
    ret = torch.tensor([1.0, 1.0, -1.0, 0.0], dtype=torch.float64)
    entropy = torch.full((4,), 2.0, dtype=torch.float64)
    loss, stats = ppo_loss(cfg, new_logp, old_logp, adv, new_v, old_v, ret, entropy)
    # max(-A r, -A clip(r)): [-0.5, 1.0, -2.4, 2.2] -> mean 0.075. Sample 2 (r = 1.5,
    # A > 0) is clipped; sample 0 (r = 0.5, A > 0) keeps the unclipped, pessimistic term.
    assert stats["loss_policy"].item() == pytest.approx(0.075)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    # Value: clipped V = [0.1, 0.2, -0.2, 0.2]; max of squared errors
    # [0.81, 0.64, 0.64, 1.0] -> 0.5 * mean = 0.38625.
    assert stats["loss_value"].item() == pytest.approx(0.38625)
    kl = np.mean([(r - 1) - math.log(r) for r in (0.5, 1.0, 1.5, 1.1)])
    assert stats["approx_kl"].item() == pytest.approx(kl)
    assert loss.item() == pytest.approx(0.075 + 0.5 * 0.38625 - 0.01 * 2.0)
    loss.backward()
    # d/dlogp of -A r is -A r / N where the unclipped term is the max, 0 where clipped.
    np.testing.assert_allclose(new_logp.grad.numpy(), [-0.5 / 4, 1 / 4, 0.0, 2.2 / 4])
    # Value: samples 1 and 2 take the clipped branch (no gradient), 0 and 3 the plain one.
    np.testing.assert_allclose(new_v.grad.numpy(), 0.5 * 0.5 * 2 / 4 * np.array(
        [0.1 - 1.0, 0.0, 0.0, 1.0 - 0.0]))

    cfg_plain = PPOConfig(clip=0.2, normalize_advantages=False, clip_value=False)
    _, plain = ppo_loss(cfg_plain, new_logp, old_logp, adv, new_v, old_v, ret, entropy)
    assert plain["loss_value"].item() == pytest.approx(0.5 * np.mean([0.81, 0.25, 0.49, 1.0]))


# ------------------------------------------------------------------ learner


@pytest.mark.parametrize("spec,options", [(BOX, {"squash": "clip"}),
                                          (BOX, {"squash": "tanh", "log_std": "learned"}),
                                          (DISCRETE, {})])
def test_ppo_update_reduces_loss(spec, options):
    model = build_model({"hidden": [32], **options}, spec, seed=0)
    cfg = PPOConfig(epochs=4, minibatches=4, lr=3e-3, light_adam=True)
    learner = PPOLearner(cfg, model)
    batch = on_policy_batch(model, spec, T=8, B=4, seed=1)
    samples = learner.prepare(batch)
    before, stats = learner.loss(samples)
    assert stats["approx_kl"].abs().item() < 1e-6  # behaviour logp = pre-update policy's
    terms = learner.update(batch)
    assert set(terms) == KEYS and all(math.isfinite(v) for v in terms.values())
    assert learner.optimizer.step_count == cfg.epochs * cfg.minibatches
    after = learner.loss(samples)[0].item()
    assert after < before.item() - 0.05


def test_anneal_lr_and_registration():
    model = build_model({"hidden": [8]}, BOX, seed=0)
    with pytest.raises(ValueError, match="anneal_updates"):
        PPOLearner(PPOConfig(anneal_lr=True), model)
    learner = make_algo({"kind": "ppo", "lr": 0.1, "anneal_lr": True, "anneal_updates": 4,
                         "epochs": 1, "minibatches": 2, "light_adam": True}, model)
    assert isinstance(learner, PPOLearner) and "ppo" in UNROLL_ALGOS and "ppo" in ALGOS
    batch = on_policy_batch(model, BOX, T=3, B=2, seed=0)
    lrs = [learner.update(batch)["lr"] for _ in range(6)]
    np.testing.assert_allclose(lrs, [0.1, 0.075, 0.05, 0.025, 0.0, 0.0])
    with pytest.raises(ValueError, match="minibatches"):
        learner.update(on_policy_batch(model, BOX, T=1, B=1, seed=0))


def test_single_rank_allreduce_is_a_no_op():
    """The flatten / allreduce / unflatten path with one rank equals no hook, bitwise."""
    results = []
    calls = []
    for hook in (None, calls.append):  # one rank: the average is the tensor itself
        model = build_model({"hidden": [16], "obs_norm": True}, BOX, seed=0)
        learner = PPOLearner(PPOConfig(epochs=2, minibatches=3, light_adam=True), model, hook)
        batch = on_policy_batch(model, BOX, T=6, B=2, seed=3)
        torch.manual_seed(9)
        learner.update(batch)
        results.append(model.state_dict())
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])
    n_params = sum(p.numel() for p in model.parameters())
    # One flat gradient buffer per optimizer step, then one obs-norm reduce.
    assert len(calls) == 2 * 3 + 1
    assert all(len(c) == 1 and c[0].numel() == n_params for c in calls[:-1])


# ------------------------------------------------------------------ two gloo ranks

T_DP, B_DP, UPDATES_DP = 6, 8, 3  # each of the two ranks trains on 4 of the 8 columns


def dp_model_and_batch():
    model = build_model({"hidden": [16], "obs_norm": True}, BOX, seed=0)
    return model, on_policy_batch(model, BOX, T=T_DP, B=B_DP, seed=5)


def rank_main(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    try:
        def allreduce(tensors: list[torch.Tensor]) -> None:
            for t in tensors:
                dist.all_reduce(t)
                t.div_(world)

        model, batch = dp_model_and_batch()
        cols = B_DP // world
        local = {k: v[:, rank * cols:(rank + 1) * cols] for k, v in batch.items()}
        learner = PPOLearner(PPOConfig(epochs=2, minibatches=4, lr=1e-2, light_adam=True),
                             model, allreduce)
        torch.manual_seed(100 + rank)  # the ranks shuffle differently
        for _ in range(UPDATES_DP):
            learner.update(local)
        torch.save(model.state_dict(), out)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_stay_bitwise_identical(tmp_path):
    # Fork, not spawn: a fresh interpreter would spend ~2 s of CPU importing torch per
    # rank. The ranks set one intra-op thread first thing, as DataLoader workers do.
    ctx = multiprocessing.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(rank, 2, port, str(tmp_path / f"rank{rank}.pt")),
                         daemon=True) for rank in range(2)]
    deadline = time.monotonic() + 60
    try:
        for proc in procs:
            proc.start()
        # Poll both: a rank that fails must not leave us waiting on its stuck peer.
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.02)
        codes = [p.exitcode for p in procs]  # None: still running at the deadline
        assert codes == [0, 0], f"rank exit codes {codes} (tracebacks on stderr)"
    finally:  # never leave a rank behind, whatever failed
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    start, batch = dp_model_and_batch()
    assert set(states[0]) == set(states[1]) == set(start.state_dict())
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    params = [k for k, _ in start.named_parameters()]
    assert all(not torch.equal(states[0][k], start.state_dict()[k]) for k in params)
    # The statistics are those of both halves (each update saw the whole batch once).
    obs = batch["obs"][:T_DP].reshape(-1, 3).double()
    torch.testing.assert_close(states[0]["obs_norm.mean"], obs.mean(0))
    torch.testing.assert_close(states[0]["obs_norm.var"], obs.var(0, unbiased=False))


