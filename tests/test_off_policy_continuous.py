"""Off-policy continuous control (zmqrl.parts.continuous): TD3 and SAC learners, the
Gaussian-noise and squashed-Gaussian behaviours, and the two topologies built of them
(apex_dpg.yaml: local actors; seed_sac.yaml: the broker acts), each retargeted by
``env.id`` alone and held to a learning bar."""

from __future__ import annotations

import copy
import math
import os
import re

import numpy as np
import pytest
import torch

from zmqrl.parts.acting import ActingSetup, act_batched, behaviour_type
from zmqrl.parts.continuous.config import SACConfig, TD3Config
from zmqrl.parts.continuous.models import (
    DeterministicActorTwinQ,
    GaussianActorTwinQ,
    squashed_log_prob,
)
from zmqrl.parts.continuous.sac import SACLearner
from zmqrl.parts.continuous.td3 import TD3Learner, td3_target
from zmqrl.parts.envs import env_spec
from zmqrl.run.topology import load

from conftest import REPO, read_csv
from runs import assert_data_crossed_every_link

PENDULUM = env_spec({"id": "Pendulum-v1"})  # 3 floats; one action in [-2, 2]


def batch(n: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(n, 3, generator=g), "next_obs": torch.randn(n, 3, generator=g),
            "action": torch.rand(n, 1, generator=g) * 4 - 2,
            "reward": torch.randn(n, generator=g),
            "discount": torch.full((n,), 0.99 ** 3), "weight": torch.ones(n)}


# ----- the networks ---------------------------------------------------------------------

def test_squashed_log_prob_matches_torch_distributions_and_numpy():
    torch.manual_seed(0)  # away from tanh's saturation, where the reference clamps
    mean, log_std = torch.randn(16, 3) * 0.5, torch.randn(16, 3).clamp(-2, 0)
    noise = torch.randn(16, 3)
    u = mean + log_std.exp() * noise
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform()])
    expected = dist.log_prob(torch.tanh(u).clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)
    ours = squashed_log_prob(noise, log_std, u)
    assert torch.allclose(ours, expected, atol=1e-3)
    ours_np = squashed_log_prob(noise.numpy(), log_std.numpy(), u.numpy())
    assert np.allclose(ours_np, ours.numpy(), atol=1e-5)


def test_actions_stay_inside_the_box_and_critics_see_them_in_unit_scale():
    model = DeterministicActorTwinQ(PENDULUM, hidden=[32])
    obs = torch.randn(256, 3) * 100  # saturates the tanh
    action = model.act(obs)
    assert action.shape == (256, 1) and float(action.detach().abs().max()) <= 2.0
    assert torch.allclose(model.to_unit(torch.tensor([[-2.0], [0.0], [2.0]])),
                          torch.tensor([[-1.0], [0.0], [1.0]]))
    sac = GaussianActorTwinQ(PENDULUM, hidden=[32], init_alpha=0.5)
    sampled, logp = sac.sample(obs)
    assert float(sampled.detach().abs().max()) <= 2.0 and torch.isfinite(logp).all()
    assert math.isclose(float(sac.log_alpha.detach().exp()), 0.5, rel_tol=1e-6)


def test_a_discrete_env_is_refused_naming_the_model(tmp_path):
    with pytest.raises(ValueError, match="needs a Box action space"):
        load(REPO / "topologies" / "apex_dpg.yaml", {"env": {"id": "CartPole-v1"}})


# ----- the learners ---------------------------------------------------------------------

def test_td3_target_is_the_smaller_twin_at_the_target_policys_action():
    model = DeterministicActorTwinQ(PENDULUM, hidden=[32])
    b = batch()
    with torch.no_grad():
        got = td3_target(model, b["reward"], b["discount"], b["next_obs"])
        q1, q2 = model.q(b["next_obs"], model.act(b["next_obs"]))
    assert torch.allclose(got, b["reward"] + b["discount"] * torch.minimum(q1, q2))


def test_td3_delays_the_policy_and_moves_targets_by_polyak():
    model = DeterministicActorTwinQ(PENDULUM, hidden=[32])
    learner = TD3Learner(TD3Config(policy_delay=2, tau=0.5), model)
    policy0 = [p.detach().clone() for p in model.policy_parameters()]
    target0 = [p.detach().clone() for p in learner.target_model.critic_parameters()]
    terms, priorities = learner.update(batch())
    assert "policy_loss" not in terms  # the first update moves the critics only
    assert all(torch.equal(a, b) for a, b in zip(policy0, model.policy_parameters(),
                                                 strict=True))
    assert all(torch.equal(a, b) for a, b in zip(target0, learner.target_model
                                                 .critic_parameters(), strict=True))
    assert priorities.shape == (64,) and bool((priorities > 0).all())
    terms, _ = learner.update(batch(seed=1))
    assert "policy_loss" in terms
    assert not all(torch.equal(a, b) for a, b in zip(policy0, model.policy_parameters(),
                                                     strict=True))
    for online, before, after in zip(model.critic_parameters(), target0,
                                     learner.target_model.critic_parameters(), strict=True):
        assert torch.allclose(after, 0.5 * before + 0.5 * online.detach(), atol=1e-6)


def test_importance_weights_scale_the_critic_loss():
    """Weight 0 on every item: no gradient reaches the critics (prioritized replay's
    correction really enters the loss)."""
    model = DeterministicActorTwinQ(PENDULUM, hidden=[32])
    learner = TD3Learner(TD3Config(policy_delay=1000), model)
    before = [p.detach().clone() for p in model.critic_parameters()]
    b = batch()
    b["weight"] = torch.zeros(64)
    learner.update(b)
    assert all(torch.equal(a, b) for a, b in zip(before, model.critic_parameters(),
                                                 strict=True))
    b["weight"] = torch.ones(64)
    learner.update(b)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.critic_parameters(),
                                                     strict=True))


def test_sac_lowers_alpha_while_the_policy_is_more_random_than_its_target():
    model = GaussianActorTwinQ(PENDULUM, hidden=[32])
    learner = SACLearner(SACConfig(alpha_lr=1e-2, target_entropy=-5.0), model)
    for i in range(20):
        terms, _ = learner.update(batch(seed=i))
    assert terms["entropy"] > -5.0 and float(model.log_alpha.detach()) < 0.0


def test_a_learners_state_restores_its_targets_optimizer_and_counter():
    for make, config in ((DeterministicActorTwinQ, TD3Config), (GaussianActorTwinQ, SACConfig)):
        learner = make_learner(make, config)
        for i in range(3):
            learner.update(batch(seed=i))
        fresh = make_learner(make, config)
        fresh.model.load_state_dict(learner.model.state_dict())
        # as a checkpoint holds it: a copy (torch's optimizer would share the tensors)
        fresh.load_state_dict(copy.deepcopy(learner.state_dict()))
        assert fresh.updates == 3
        b = batch(seed=9)
        torch.manual_seed(5)
        terms_a, prio_a = learner.update(b)
        torch.manual_seed(5)
        terms_b, prio_b = fresh.update(b)
        assert torch.allclose(prio_a, prio_b) and terms_a == pytest.approx(terms_b)


def make_learner(make, config):
    torch.manual_seed(0)
    model = make(PENDULUM, hidden=[32])
    learner_type = TD3Learner if config is TD3Config else SACLearner
    return learner_type(config(), model)


# ----- the behaviours -------------------------------------------------------------------

def acting(name: str, model, n: int, args: dict | None = None, cfg=None, insert_batch=1):
    cfg = cfg or (TD3Config(n_step=2) if name == "gaussian_noise" else SACConfig(n_step=2))
    return behaviour_type(name)(ActingSetup(PENDULUM, model, cfg, seed=3, args=args or {},
                                            insert_batch=insert_batch), n)


def test_gaussian_noise_has_the_actors_own_scale_and_stays_in_bounds():
    model = DeterministicActorTwinQ(PENDULUM, hidden=[32])
    b = acting("gaussian_noise", model, 4096, args={"noise": 0.25})
    obs = np.zeros((4096, 3), np.float32)
    b.observe(obs)
    [action] = act_batched(model, [b], version=1)
    with torch.no_grad():
        mean = float(model.act(torch.zeros(1, 3))[0, 0])
    inside = action[(action > -2) & (action < 2)]
    # std = 0.25 x half-range 2 = 0.5, around the policy's action
    assert abs(inside.mean() - mean) < 0.05 and abs(inside.std() - 0.5) < 0.05
    assert action.min() >= -2 and action.max() <= 2 and action.dtype == np.float32
    # a remote actor's own argument arrives in its step header's args
    b.observe(obs, {"args": {"noise": 0.0}})
    [action] = act_batched(model, [b], version=2)
    assert np.allclose(action, mean)


@pytest.mark.parametrize("name, make", [("gaussian_noise", DeterministicActorTwinQ),
                                        ("squashed_gaussian", GaussianActorTwinQ)])
def test_the_first_random_steps_are_uniform_over_the_bounds_then_the_policy(name, make):
    """TD3's start_timesteps: 4 envs, random_steps 2000 -> 500 uniform vectors of
    actions, whatever the policy says, then the policy's own (noise 0: exactly)."""
    model = make(PENDULUM, hidden=[32])
    b = acting(name, model, 4, args={"noise": 0.0 if name == "gaussian_noise" else 1e-6,
                                     "random_steps": 2000})
    obs = np.zeros((4, 3), np.float32)
    drawn = []
    for version in range(500):
        b.observe(obs)
        [action] = act_batched(model, [b], version=version)
        drawn.append(action)
    drawn = np.concatenate(drawn)
    # U(-2, 2): mean 0, std 4 / sqrt(12) = 1.155; the policy's own are one value
    assert abs(drawn.mean()) < 0.1 and abs(drawn.std() - 1.155) < 0.05
    assert drawn.min() >= -2 and drawn.max() <= 2 and drawn.min() < -1.9 < 1.9 < drawn.max()
    b.observe(obs)
    [after] = act_batched(model, [b], version=500)
    with torch.no_grad():
        own = float(model.act(torch.zeros(1, 3))[0, 0]) if name == "gaussian_noise" else \
            float(2 * torch.tanh(model.mean_log_std(torch.zeros(1, 3))[0])[0, 0])
    assert np.allclose(after, own, atol=1e-3)
    with pytest.raises(ValueError, match="random_steps"):
        acting(name, model, 4, args={"random_steps": 2.5})


def test_behaviours_ship_n_step_transitions_with_priorities_from_the_acting_critics():
    for name, model in (("gaussian_noise", DeterministicActorTwinQ(PENDULUM, hidden=[32])),
                        ("squashed_gaussian", GaussianActorTwinQ(PENDULUM, hidden=[32]))):
        b = acting(name, model, 2, insert_batch=6)
        rng = np.random.default_rng(0)
        items = []
        for _ in range(4):
            b.observe(rng.standard_normal((2, 3)).astype(np.float32))
            items += b.take()
            act_batched(model, [b], version=7)
            b.outcome(np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool),
                      np.zeros((0, 3), np.float32))
        b.observe(rng.standard_normal((2, 3)).astype(np.float32))
        items += b.take()
        [item] = items  # 2 envs x 3 complete 2-step transitions, held back until 6
        arrays = item.arrays
        assert item.fields == {"version": 7} and len(arrays["action"]) == 6
        assert np.allclose(arrays["reward"], 1.99) and np.allclose(arrays["discount"], 0.99**2)
        assert arrays["action"].shape == (6, 1) and (arrays["priority"] >= 0).all()
        assert np.isfinite(arrays["priority"]).all() and arrays["priority"].max() > 0


# ----- the topologies learn -------------------------------------------------------------

# (topology, env id, target mean return of the last 20 episodes, seconds). Pendulum-v1:
# a random policy averages about -1200; the bar is -300 within 180 s, reached in
# 30-55 s on a quiet machine. On CI's loaded machine, beside other tests, these runs
# took 200 s at a quarter of a quiet machine's env steps a second and missed the bar: so
# they are `exclusive` (tests/machine_share.py), every other test waiting while they run.
# They check what a data-path test did before them: data crossed every link, the
# learner updated. InvertedPendulum-v5: 1000 is every one of the last 20 episodes
# balanced to its time limit, 20,000 env steps of balancing once learned, at the
# topology's replay ratio (two env steps per update) 10,000 updates: 120-180 s on a
# quiet machine each, more than CI's 20 minutes can spare beside the suite, so those two
# run on request (ZMQRL_LONG_TESTS=1; BENCHMARKS.md has the command).
LONG = pytest.mark.skipif(not os.environ.get("ZMQRL_LONG_TESTS"),
                          reason="a 2-5 minute learning run: set ZMQRL_LONG_TESTS=1")
RUNS = [pytest.param(topo, env, target, seconds, id=f"{topo}-{env}",
                     marks=[pytest.mark.exclusive, *marks])
        for topo in ("apex_dpg", "seed_sac")
        for env, target, seconds, marks in (("Pendulum-v1", -300.0, 180, []),
                                            ("InvertedPendulum-v5", 1000.0, 300, [LONG]))]


@pytest.mark.parametrize("name,env,target,seconds", RUNS)
def test_topology_retargeted_by_env_id_learns(name, env, target, seconds, processes,
                                              tmp_path):
    """The topology with ``env.id`` changed alone reaches the bar; on the way data
    crossed every link and the learner updated."""
    path = REPO / "topologies" / f"{name}.yaml"
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.zmqrl("up", str(path), "--run-dir", str(run_dir), "--set",
                           f"env.id={env}", "--target-return", str(target),
                           "--target-window", "20", "--max-seconds", str(seconds), log=log)
    assert proc.wait(timeout=seconds + 60) == 0, log.read_text()[-3000:]
    out = log.read_text()
    reached = re.search(rf"target return {target:g} reached: mean of the last 20 episodes "
                        r"(-?[\d.]+)", out)
    assert reached, f"{name} on {env} did not learn:\n{out[-3000:]}"
    assert_data_crossed_every_link(load(path, {"env": {"id": env}}), run_dir)
    rows = read_csv(run_dir / "metrics" / "learner.csv")
    assert max(int(float(r["updates"])) for r in rows) >= 100
