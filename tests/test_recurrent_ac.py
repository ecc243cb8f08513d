"""The recurrent actor-critic (model kind lstm_ac): its unroll against step-by-step
acting, evaluate_unrolls on recurrent batches, the initial state UnrollBuilder records,
and V-trace updates through the LSTM."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from zmqrl.parts.actor_critic.learner import evaluate_unrolls
from zmqrl.parts.actor_critic.models import RecurrentActorCritic
from zmqrl.parts.actor_critic.vtrace import VTraceConfig, VTraceLearner
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import MODEL_KINDS, build_model, load_state_arrays, state_arrays
from zmqrl.parts.models.recurrent import reset_state
from zmqrl.parts.unroll import UnrollBuilder

DISCRETE = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
                   action_dtype=np.dtype(np.int64), num_actions=3)
BOX = EnvSpec(obs_shape=(3,), obs_dtype=np.dtype(np.float32), action_shape=(2,),
              action_dtype=np.dtype(np.float32), num_actions=None,
              action_low=np.array([-1.0, 0.0], np.float32),
              action_high=np.array([1.0, 3.0], np.float32))
SPECS = {"discrete": DISCRETE, "box": BOX}
H = 8


def make_model(spec: EnvSpec, seed: int = 0) -> RecurrentActorCritic:
    model = build_model({"kind": "lstm_ac", "hidden": [16], "lstm": H,
                         "log_std_init": -0.5}, spec, seed)
    assert isinstance(model, RecurrentActorCritic)
    with torch.no_grad():  # a non-trivial policy (the init makes it nearly uniform)
        model.policy.weight.add_(0.5 * torch.randn_like(model.policy.weight))
    return model


def random_first(T: int, B: int, g: torch.Generator) -> torch.Tensor:
    first = torch.rand(T, B, generator=g) < 0.25
    first[2, 0] = True  # at least one reset inside the unroll
    return first


def act_loop(model, obs, first, state):
    """step() one observation row at a time: actions, logps, values (step_values on
    the same state) and the state before each step (after its reset)."""
    actions, logps, values, used = [], [], [], []
    for t in range(obs.shape[0]):
        used.append(reset_state(state, first[t]))
        values.append(model.step_values(obs[t], first[t], state))
        action, logp, state = model.step(obs[t], first[t], state)
        actions.append(action)
        logps.append(logp)
    return torch.stack(actions), torch.stack(logps), torch.stack(values), used, state


# ------------------------------------------------------------------ the model


def test_registered_and_options():
    assert MODEL_KINDS["lstm_ac"] is RecurrentActorCritic
    model = make_model(BOX)
    assert model.recurrent and model.state_size == H
    assert model.log_std.detach().eq(-0.5).all()
    with pytest.raises(ValueError, match="log_std"):
        build_model({"kind": "lstm_ac", "log_std": "learned"}, BOX)
    # Parameters travel as for every model.
    other = make_model(BOX, seed=1)
    load_state_arrays(other, state_arrays(model))
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", SPECS)
def test_unroll_equals_stepping(kind):
    spec = SPECS[kind]
    model = make_model(spec)
    g = torch.Generator().manual_seed(3)
    T, B = 6, 5
    obs = torch.randn(T + 1, B, *spec.obs_shape, generator=g)
    first = random_first(T + 1, B, g)
    state = tuple(torch.randn(B, H, generator=g) for _ in range(2))
    actions, logps, values, used, _ = act_loop(model, obs, first, state)
    assert logps.dtype == torch.float32 and logps.shape == (T + 1, B)
    if kind == "discrete":
        assert actions.dtype == torch.int64 and actions.shape == (T + 1, B)
    else:
        assert actions.dtype == torch.float32 and actions.shape == (T + 1, B, 2)

    logp, entropy, v = model.unroll(obs, first, state, actions[:T])
    assert logp.shape == entropy.shape == (T, B) and v.shape == (T + 1, B)
    assert logp.requires_grad and v.requires_grad
    v[T].sum().backward()  # the bootstrap row is a constant
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    torch.testing.assert_close(logp, logps[:T], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, values, rtol=1e-5, atol=1e-5)

    # Log-probs and entropies against torch.distributions, one step at a time from the
    # state step() used.
    for t in range(T):
        head, _, _ = model(obs[t:t + 1], torch.zeros(1, B, dtype=torch.bool), used[t])
        with torch.no_grad():
            if kind == "discrete":
                dist = Categorical(logits=head[0])
                ref_logp, ref_entropy = dist.log_prob(actions[t]), dist.entropy()
            else:
                dist = Normal(head[0], model.log_std.exp().expand_as(head[0]))
                ref_logp = dist.log_prob(actions[t]).sum(-1)
                ref_entropy = dist.entropy().sum(-1)
        torch.testing.assert_close(logp[t].detach(), ref_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy[t].detach(), ref_entropy, rtol=1e-5, atol=1e-5)


def test_resets_and_the_callers_state():
    model = make_model(DISCRETE)
    g = torch.Generator().manual_seed(4)
    obs = torch.randn(3, 4, generator=g)
    state = tuple(torch.randn(3, H, generator=g) for _ in range(2))
    kept = tuple(s.clone() for s in state)
    first = torch.tensor([True, False, True])
    values = model.step_values(obs, first, state)
    torch.manual_seed(0)
    _, logp, new_state = model.step(obs, first, state)
    assert all(torch.equal(a, b) for a, b in zip(state, kept, strict=True))  # untouched
    # A reset row acts as if from the initial state, whatever the state held.
    zero = model.initial_state(3)
    torch.manual_seed(0)
    _, logp0, state0 = model.step(obs, torch.zeros(3, dtype=torch.bool), zero)
    assert torch.equal(logp[first], logp0[first])
    assert torch.equal(new_state[0][first], state0[0][first])
    assert not torch.equal(new_state[0][~first], state0[0][~first])
    torch.testing.assert_close(values[first], model.step_values(obs, ~first, zero)[first])


# ------------------------------------------------------------------ evaluate_unrolls


def random_batch(spec: EnvSpec, model, T: int, B: int, seed: int) -> dict[str, torch.Tensor]:
    """An on-policy batch as the actors would ship it: done flags, the state used with
    obs[0] (random, as if mid-episode; zeroed where obs[0] starts an episode)."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T + 1, B, *spec.obs_shape, generator=g)
    done = torch.rand(T, B, generator=g) < 0.2
    done[1, 0] = True
    first = torch.cat([torch.zeros(1, B, dtype=torch.bool), done])
    state = tuple(torch.randn(B, H, generator=g) for _ in range(2))
    actions, logps, _, _, _ = act_loop(model, obs, first, state)
    return {"obs": obs, "action": actions[:T], "logp": logps[:T],
            "reward": torch.randn(T, B, generator=g), "done": done,
            "state_h": state[0].unsqueeze(0), "state_c": state[1].unsqueeze(0)}


@pytest.mark.parametrize("kind", SPECS)
def test_evaluate_unrolls_matches_a_manual_loop(kind):
    spec = SPECS[kind]
    model = make_model(spec)
    T, B = 5, 4
    batch = random_batch(spec, model, T, B, seed=5)
    logp, entropy, values = evaluate_unrolls(model, batch)
    assert logp.shape == entropy.shape == (T, B) and values.shape == (T + 1, B)
    # On-policy: the learner's log-probs are the behaviour's.
    torch.testing.assert_close(logp.detach(), batch["logp"], rtol=1e-5, atol=1e-5)

    # The loop: the stored state for obs[0], a zero state after every done.
    h, c = batch["state_h"][0], batch["state_c"][0]
    for t in range(T + 1):
        head, v, (h, c) = model(batch["obs"][t:t + 1], torch.zeros(1, B, dtype=torch.bool),
                                (h, c))
        torch.testing.assert_close(values[t], v[0], rtol=1e-5, atol=1e-5)
        if t < T:
            ref_logp, _ = model._logp_entropy(head[0], batch["action"][t])
            torch.testing.assert_close(logp[t], ref_logp, rtol=1e-5, atol=1e-5)
            keep = (~batch["done"][t]).float().unsqueeze(-1)
            h, c = h * keep, c * keep

    # The batch-major [B, H] state reads the same.
    flat = dict(batch, state_h=batch["state_h"][0], state_c=batch["state_c"][0])
    torch.testing.assert_close(evaluate_unrolls(model, flat)[0], logp)


# ------------------------------------------------------------------ UnrollBuilder


def test_unroll_builder_records_the_initial_state():
    n, T = 2, 3
    builder = UnrollBuilder(DISCRETE, T, n, state_size=H)
    finished = []
    states = []
    for step in range(2 * T + 1):
        if step:
            builder.outcome(np.full(n, step, np.float32), np.array([step == 2, False]))
        out = builder.observe(np.full((n, 4), step, np.float32))
        if out is not None:
            finished.append(out[0])
        h = np.full((n, H), step, np.float32)
        c = -h
        states.append((h, c))
        builder.act(np.zeros(n, np.int64), np.zeros(n, np.float32), step, (h, c))
        h += 100  # the caller's arrays move on: the builder must have copied
    assert len(finished) == 2
    for k, unroll in enumerate(finished):
        assert unroll["state_h"].shape == unroll["state_c"].shape == (1, n, H)
        assert unroll["state_h"].dtype == np.float32
        # The state of each unroll's first step, which observed its obs[0].
        np.testing.assert_array_equal(unroll["state_h"][0], states[k * T][0] - 100)
        np.testing.assert_array_equal(unroll["state_c"][0], states[k * T][1])
        np.testing.assert_array_equal(unroll["obs"][0], k * T)
    assert finished[1]["state_h"][0, 0, 0] == T  # the second unroll's first step

    with pytest.raises(ValueError, match="recurrent state"):
        UnrollBuilder(DISCRETE, T, n, state_size=H).act(np.zeros(n), np.zeros(n), 0)
    plain = UnrollBuilder(DISCRETE, 1, n)  # no state: the keys as before
    plain.observe(np.zeros((n, 4), np.float32))
    plain.act(np.zeros(n, np.int64), np.zeros(n, np.float32), 0)
    plain.outcome(np.zeros(n), np.zeros(n, bool))
    unroll, _ = plain.observe(np.zeros((n, 4), np.float32))
    assert set(unroll) == {"obs", "action", "logp", "reward", "done"}


@pytest.mark.parametrize("kind", SPECS)
def test_acting_through_the_builder_is_on_policy(kind):
    """Actor loop (step, zero the state at episode ends, record the state) -> unrolls
    -> evaluate_unrolls: the learner reproduces the behaviour log-probs and values."""
    spec = SPECS[kind]
    model = make_model(spec)
    rng = np.random.default_rng(6)
    n, T = 3, 4
    builder = UnrollBuilder(spec, T, n, state_size=H)
    h, c = (np.zeros((n, H), np.float32) for _ in range(2))
    first = np.ones(n, bool)
    unrolls, values = [], []
    for step in range(3 * T + 1):
        obs = rng.normal(size=(n, *spec.obs_shape)).astype(np.float32)
        out = builder.observe(obs)
        if out is not None:
            unrolls.append(out[0])
        state = (torch.from_numpy(h), torch.from_numpy(c))
        values.append(model.step_values(torch.from_numpy(obs), torch.from_numpy(first),
                                        state).numpy())
        action, logp, (h2, c2) = model.step(torch.from_numpy(obs), torch.from_numpy(first),
                                            state)
        builder.act(action.numpy(), logp.numpy(), step, (h, c))  # the state used
        done = rng.random(n) < 0.3
        builder.outcome(rng.normal(size=n).astype(np.float32), done)
        h, c = h2.numpy().copy(), c2.numpy().copy()
        h[done] = 0.0  # the next observation starts an episode: its state is zero
        c[done] = 0.0
        first = done
    assert len(unrolls) == 3
    for k, unroll in enumerate(unrolls):
        batch = {key: torch.from_numpy(v) for key, v in unroll.items()}
        logp, _, v = evaluate_unrolls(model, batch)
        torch.testing.assert_close(logp.detach(), batch["logp"], rtol=1e-5, atol=1e-5)
        ref = torch.from_numpy(np.stack(values[k * T:(k + 1) * T + 1]))
        torch.testing.assert_close(v.detach(), ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ learning


@pytest.mark.parametrize("kind", SPECS)
def test_vtrace_update_trains_through_the_lstm(kind):
    spec = SPECS[kind]
    model = make_model(spec)
    T, B = 5, 6
    # Two unrolls of 3 columns joined on axis 1, as the learner node batches them.
    parts = [random_batch(spec, model, T, 3, seed=s) for s in (7, 8)]
    batch = {k: torch.cat([p[k] for p in parts], dim=1) for k in parts[0]}
    assert batch["state_h"].shape == (1, B, H)
    learner = VTraceLearner(VTraceConfig(unroll=T, batch_size=B, lr=1e-2, minibatches=2,
                                         light_adam=True),
                            model)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    terms = learner.update(batch)
    assert np.isfinite(terms["loss_total"]) and terms["grad_norm"] > 0
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), name
    # The recurrent weights got a gradient: credit flows back through time.
    for name in ("weight_hh", "weight_ih"):
        grad = getattr(model.core.cell, name).grad
        assert grad is not None and grad.abs().sum() > 0, name
