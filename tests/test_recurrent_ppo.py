"""PPO with a recurrent policy (lstm_ac): minibatches are whole env columns evaluated in
time order from their stored initial state (against a column-by-column, step-by-step
forward), updates train through the LSTM, two gloo ranks equal one learner on the whole
batch, and ``zmqrl validate`` accepts ppo with lstm_ac."""

from __future__ import annotations

import math
import multiprocessing
import socket
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from zmqrl.cli import main
from zmqrl.parts.actor_critic.ppo import PPOConfig, PPOLearner
from zmqrl.parts.actor_critic.recurrent_ppo import evaluate_sequences
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import build_model

from conftest import REPO

DISCRETE = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
                   action_dtype=np.dtype(np.int64), num_actions=3)
BOX = EnvSpec(obs_shape=(3,), obs_dtype=np.dtype(np.float32), action_shape=(2,),
              action_dtype=np.dtype(np.float32), num_actions=None,
              action_low=np.array([-1.0, 0.0], np.float32),
              action_high=np.array([1.0, 3.0], np.float32))
SPECS = {"discrete": DISCRETE, "box": BOX}
H = 8


def make_model(spec: EnvSpec, seed: int = 0) -> torch.nn.Module:
    model = build_model({"kind": "lstm_ac", "hidden": [16], "lstm": H, "log_std_init": -0.5},
                        spec, seed)
    with torch.no_grad():  # a non-trivial policy (the init makes it nearly uniform)
        model.policy.weight.add_(0.5 * torch.randn_like(model.policy.weight))
    return model


def on_policy_batch(model, spec: EnvSpec, T: int, B: int, seed: int) -> dict:
    """An unroll batch as the learner receives it: the model acted step by step from a
    non-zero stored state [1, B, H], its state zeroed after every done."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T + 1, B, *spec.obs_shape, generator=g)
    done = torch.rand(T, B, generator=g) < 0.2
    done[1, 0] = True  # an episode starts inside column 0
    h0, c0 = (0.5 * torch.randn(B, H, generator=g) for _ in range(2))
    torch.manual_seed(seed)
    state, first = (h0, c0), torch.zeros(B, dtype=torch.bool)
    actions, logps = [], []
    for t in range(T):
        action, logp, state = model.step(obs[t], first, state)
        actions.append(action)
        logps.append(logp)
        first = done[t]
    return {"obs": obs, "action": torch.stack(actions), "logp": torch.stack(logps),
            "reward": torch.randn(T, B, generator=g), "done": done,
            "state_h": h0.unsqueeze(0), "state_c": c0.unsqueeze(0)}


def column_alone(model, batch: dict, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and values [T] of column ``b`` on its own, one step per forward call,
    from its stored state, zeroing the state after a done."""
    T = batch["action"].shape[0]
    state = (batch["state_h"][0, b:b + 1], batch["state_c"][0, b:b + 1])
    no_reset = torch.zeros(1, 1, dtype=torch.bool)
    logps, values = [], []
    for t in range(T):
        if t and batch["done"][t - 1, b]:
            state = (torch.zeros_like(state[0]), torch.zeros_like(state[1]))
        head, value, state = model(batch["obs"][t:t + 1, b:b + 1], no_reset, state)
        logp, _ = model._logp_entropy(head[0], batch["action"][t, b:b + 1])
        logps.append(logp[0])
        values.append(value[0, 0])
    return torch.stack(logps), torch.stack(values)


@pytest.mark.parametrize("kind", SPECS)
def test_sequence_minibatch_matches_each_column_alone(kind):
    spec = SPECS[kind]
    model = make_model(spec)
    T, B = 7, 5
    batch = on_policy_batch(model, spec, T, B, seed=1)
    learner = PPOLearner(PPOConfig(unroll=T, batch_size=B, minibatches=2), model)
    samples = learner.prepare(batch)
    assert samples["obs"].shape == (B, T, *spec.obs_shape)
    assert samples["state_h"].shape == (B, H)

    cols = torch.tensor([3, 0])  # shuffled, as the learner draws them
    mb = {k: v[cols] for k, v in samples.items()}
    old, logp, entropy, values = evaluate_sequences(model, mb)
    assert logp.shape == entropy.shape == values.shape == old["logp"].shape == (2 * T,)
    assert logp.requires_grad and values.requires_grad
    for i, b in enumerate(cols.tolist()):
        ref_logp, ref_values = column_alone(model, batch, b)
        rows = slice(i * T, (i + 1) * T)  # each column whole, in time order
        torch.testing.assert_close(logp[rows], ref_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values[rows], ref_values, rtol=1e-5, atol=1e-5)
        # The old terms line up with the new ones: the behaviour's log-probs (on-policy:
        # equal to the new ones), the pre-update values.
        torch.testing.assert_close(old["logp"][rows], batch["logp"][:, b])
        torch.testing.assert_close(old["logp"][rows], ref_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(old["value"][rows], ref_values, rtol=1e-5, atol=1e-5)

    # The stored state matters: from a zero state the first steps read differently.
    zeroed = dict(mb, state_h=torch.zeros_like(mb["state_h"]),
                  state_c=torch.zeros_like(mb["state_c"]))
    assert not torch.allclose(evaluate_sequences(model, zeroed)[1][0], logp[0], atol=1e-4)


@pytest.mark.parametrize("kind", SPECS)
def test_update_trains_through_the_lstm(kind):
    spec = SPECS[kind]
    model = make_model(spec)
    T, B = 8, 6
    cfg = PPOConfig(unroll=T, batch_size=B, epochs=4, minibatches=3, lr=3e-3,
                    light_adam=True)
    learner = PPOLearner(cfg, model)
    batch = on_policy_batch(model, spec, T, B, seed=2)
    samples = learner.prepare(batch)
    before, stats = learner.loss(samples)
    assert stats["approx_kl"].abs().item() < 1e-5  # behaviour logp = pre-update policy's
    terms = learner.update(batch)
    assert all(math.isfinite(v) for v in terms.values())
    assert learner.optimizer.step_count == cfg.epochs * cfg.minibatches
    assert learner.loss(samples)[0].item() < before.item() - 0.05
    for name in ("weight_hh", "weight_ih"):  # credit flowed back through time
        grad = getattr(model.core.cell, name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    # Minibatches are env columns: 6 columns cannot make 7 (T x B = 48 steps could).
    with pytest.raises(ValueError, match="6 env columns"):
        PPOLearner(PPOConfig(minibatches=7), model).update(batch)


# ------------------------------------------------------------------ two gloo ranks

T_DP, B_DP, EPOCHS_DP = 6, 4, 3
DP_CFG = dict(unroll=T_DP, epochs=EPOCHS_DP, minibatches=1, lr=1e-2, light_adam=True,
              # per-minibatch normalisation would differ between a half and the whole
              normalize_advantages=False)


def dp_model_and_batch():
    model = make_model(DISCRETE, seed=3)
    return model, on_policy_batch(model, DISCRETE, T=T_DP, B=B_DP, seed=4)


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
        cols = B_DP // world  # each rank trains on its own columns, sequences whole
        local = {k: v[:, rank * cols:(rank + 1) * cols] for k, v in batch.items()}
        learner = PPOLearner(PPOConfig(batch_size=B_DP, **DP_CFG), model, allreduce)
        learner.update(local)
        torch.save(model.state_dict(), out)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_equal_one_learner_on_the_whole_batch(tmp_path):
    """Each rank takes half the columns (whole sequences with their stored states) and
    the gradients are averaged every step: the ranks stay bitwise identical and equal
    one learner that trains on all the columns at once."""
    ctx = multiprocessing.get_context("fork")  # no second torch import per rank
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, str(tmp_path / f"rank{r}.pt")),
                         daemon=True) for r in range(2)]
    deadline = time.monotonic() + 60
    try:
        for proc in procs:
            proc.start()
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.02)
        codes = [p.exitcode for p in procs]
        assert codes == [0, 0], f"rank exit codes {codes} (tracebacks on stderr)"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key

    model, batch = dp_model_and_batch()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    PPOLearner(PPOConfig(batch_size=B_DP, **DP_CFG), model).update(batch)
    for key, value in model.state_dict().items():
        assert not torch.equal(value, start[key]), key  # it trained
        torch.testing.assert_close(states[0][key], value, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ the topology


def test_validate_accepts_ppo_with_lstm_ac(tmp_path):
    """ppo.yaml with an LSTM policy on masked CartPole passes ``zmqrl validate``; a
    Q-network still cannot serve ppo."""
    raw = yaml.safe_load((REPO / "topologies" / "ppo.yaml").read_text())
    raw["env"] = {"id": "zmqrl/CartPoleNoVelocity-v1"}
    raw["model"] = {"kind": "lstm_ac", "hidden": [16], "lstm": 16}
    good, bad = tmp_path / "ppo-lstm.yaml", tmp_path / "ppo-lstm-q.yaml"
    good.write_text(yaml.safe_dump(raw))
    raw["model"]["kind"] = "lstm_q"
    bad.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    result = runner.invoke(main, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["validate", str(bad)])
    assert result.exit_code != 0 and "model 'lstm_q' cannot serve algo 'ppo'" in result.output
