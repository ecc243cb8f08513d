"""Surgery's function-preserving transforms (zmqrl/parts/surgery/net2net.py, issue 45):
each keeps a trained model's outputs within 1e-5 on random inputs — wider, deeper (ReLU
exactly, tanh through its linear range), new observation features, new actions — and a
part that cannot be carried is refused naming the layer, before the new model changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zmqrl.parts.actor_critic.models import ActorCritic, RecurrentActorCritic
from zmqrl.parts.dqn.models import DuelingQNetwork
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.r2d2.models import RecurrentQNetwork
from zmqrl.parts.surgery.net2net import SurgeryRefused, carry, check

TOL = 1e-5


def spec(obs: int = 4, actions: int = 2) -> EnvSpec:
    return EnvSpec(obs_shape=(obs,), obs_dtype=np.dtype(np.float32), action_shape=(),
                   action_dtype=np.dtype(np.int64), num_actions=actions)


def trained(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """A model whose weights are not the initialisation's (small last layers would hide
    a transform's error): every parameter perturbed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def obs(n: int = 256, width: int = 4, seed: int = 1) -> torch.Tensor:
    return 2.0 * torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


def outputs(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("old_hidden, new_hidden", [
    ((64, 64), (128, 128)),           # wider
    ((64, 64), (64, 64, 64)),         # deeper (tanh: through its linear range)
    ((64, 64), (128, 128, 128)),      # both: the benchmark 1
    ((32,), (48, 64, 64)),            # two layers inserted
])
def test_actor_critic_keeps_its_logits_and_values(old_hidden, new_hidden):
    torch.manual_seed(0)
    old = trained(ActorCritic(spec(), hidden=old_hidden))
    new = ActorCritic(spec(), hidden=new_hidden)
    report = carry(old, new)
    x = obs()
    for a, b in zip(outputs(old, x), outputs(new, x), strict=True):
        assert (a - b).abs().max() < TOL, (a - b).abs().max()
    assert report.transformed and not report.fresh
    assert max(check(old, new, x).values()) < TOL


@pytest.mark.parametrize("old_hidden, new_hidden", [
    ((64, 64), (128, 96)), ((64, 64), (64, 64, 64, 64)), ((64,), (128, 128))])
def test_dueling_q_keeps_its_q_values_exactly(old_hidden, new_hidden):
    torch.manual_seed(0)
    old = trained(DuelingQNetwork(spec(), hidden=old_hidden))
    new = DuelingQNetwork(spec(), hidden=new_hidden)
    carry(old, new)
    x = obs()
    assert (old(x) - new(x)).abs().max() < 1e-6  # ReLU: the identity is exact


def test_new_observation_features_are_seen_by_nobody_old():
    """Masked CartPole (position, angle) -> full CartPole: the old columns sit at 0 and 2
    of the new observation, the velocities (1, 3) are new and start with zero weights."""
    torch.manual_seed(0)
    old = trained(ActorCritic(spec(obs=2), hidden=(64, 64)))
    new = ActorCritic(spec(obs=4), hidden=(64, 64))
    report = carry(old, new, inputs=[0, 2])
    full = obs(width=4)
    for a, b in zip(outputs(old, full[:, [0, 2]]), outputs(new, full), strict=True):
        assert (a - b).abs().max() < TOL
    assert "inputs 2 -> 4" in report.transformed["policy.0.weight"]
    assert max(check(old, new, full, inputs=[0, 2]).values()) < TOL
    q_old = trained(DuelingQNetwork(spec(obs=2)))
    q_new = DuelingQNetwork(spec(obs=4))
    carry(q_old, q_new, inputs=[0, 2])
    assert (q_old(full[:, [0, 2]]) - q_new(full)).abs().max() < 1e-6


def test_new_actions_keep_the_old_policy_within_the_tolerance():
    torch.manual_seed(0)
    tolerance = 1e-4
    old = trained(ActorCritic(spec(actions=2), hidden=(64, 64)))
    new = ActorCritic(spec(actions=3), hidden=(64, 64))
    carry(old, new, logit_tolerance=tolerance)
    x = obs()
    p_old = torch.softmax(outputs(old, x)[0], -1)
    p_new = torch.softmax(outputs(new, x)[0], -1)
    assert p_new[:, 2].max() <= tolerance
    assert (p_old - p_new[:, :2]).abs().max() <= tolerance
    assert (outputs(old, x)[1] - outputs(new, x)[1]).abs().max() < TOL  # values
    # dueling Q: the new action's advantage is the old ones' mean: old Q-values exact
    q_old = trained(DuelingQNetwork(spec(actions=2)))
    q_new = DuelingQNetwork(spec(actions=3))
    carry(q_old, q_new)
    assert (q_old(x) - q_new(x)[:, :2]).abs().max() < 1e-6


@pytest.mark.parametrize("make_new, says", [
    (lambda: ActorCritic(spec(), hidden=(32, 64)), "policy.0: 64 outputs -> 32"),
    (lambda: ActorCritic(spec(), hidden=(64,)), "fewer layers"),
    (lambda: ActorCritic(spec(obs=3), hidden=(64, 64)), "policy.0: 4 inputs -> 3"),
    (lambda: ActorCritic(spec(actions=1), hidden=(64, 64)), "removed actions"),
    (lambda: DuelingQNetwork(spec()), "value: the old model has no value chain"),
])
def test_what_cannot_be_carried_is_refused_naming_the_layer(make_new, says):
    torch.manual_seed(0)
    old = trained(ActorCritic(spec(), hidden=(64, 64)))
    new = make_new()
    before = {k: v.clone() for k, v in new.state_dict().items()}
    with pytest.raises(SurgeryRefused, match=says.replace("(", r"\(")):
        carry(old, new)
    assert all(torch.equal(before[k], v) for k, v in new.state_dict().items())  # untouched


class Opaque(torch.nn.Module):
    """A user's model that does not say how it may be carried."""

    def __init__(self, width: int):
        super().__init__()
        self.layer = torch.nn.Linear(4, width)


def test_a_model_that_declares_no_chains_is_refused_naming_it():
    with pytest.raises(SurgeryRefused, match="Opaque does not say"):
        carry(Opaque(16), Opaque(32))


def sequence_outputs(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A recurrent model's outputs along x [T, B, F] from the initial state, an episode
    starting at t = 0 and again at t = 3."""
    first = torch.zeros(x.shape[:2], dtype=torch.bool)
    first[0] = first[3] = True
    with torch.no_grad():
        out = model(x, first, model.initial_state(x.shape[1]))
    return tuple(o for o in out[:-1])  # (the state after: not an output)


@pytest.mark.parametrize("make", [
    lambda o, h: RecurrentActorCritic(spec(obs=o), hidden=h, lstm=16),
    lambda o, h: RecurrentQNetwork(spec(obs=o), hidden=h, lstm=16),
], ids=["lstm_ac", "lstm_q"])
def test_recurrent_models_take_new_observation_features(make):
    """Masked CartPole -> full CartPole under an LSTM (seed_r2d2's and ppo_lstm's POMDP):
    the torso's first layer gains the velocity columns at 0, the LSTM and heads are
    copied, so the whole unroll — memory included — is the old one's."""
    torch.manual_seed(0)
    old = trained(make(2, (32,)))
    new = make(4, (32,))
    report = carry(old, new, inputs=[0, 2])
    x = obs(n=6 * 8, width=4).reshape(6, 8, 4)
    for a, b in zip(sequence_outputs(old, x[..., [0, 2]]), sequence_outputs(new, x),
                    strict=True):
        assert (a - b).abs().max() < TOL, (a - b).abs().max()
    assert "inputs 2 -> 4" in report.transformed["torso.0.weight"]
    assert "torso.0.bias" in report.copied  # new columns: the bias as it was
    assert "core.cell.weight_ih" in report.copied
    flat = x.reshape(-1, 4)
    assert max(check(old, new, flat, inputs=[0, 2]).values()) < TOL


def test_a_recurrent_torso_grows_deeper_exactly_under_relu():
    torch.manual_seed(0)
    old = trained(RecurrentQNetwork(spec(), hidden=(16, 16), lstm=16))
    new = RecurrentQNetwork(spec(), hidden=(16, 24, 16), lstm=16)
    carry(old, new)
    x = obs(n=40).reshape(5, 8, 4)
    (a,), (b,) = sequence_outputs(old, x), sequence_outputs(new, x)
    assert (a - b).abs().max() < 1e-6


@pytest.mark.parametrize("make_new, says", [
    (lambda: RecurrentQNetwork(spec(), hidden=(16,), lstm=32), "core.cell.weight_ih"),
    (lambda: RecurrentQNetwork(spec(), hidden=(32,), lstm=16), "torso.0: features outputs"),
])
def test_what_a_recurrent_model_cannot_carry_is_refused_naming_it(make_new, says):
    """The LSTM is carried as it is: a wider one, or a torso whose output (the LSTM's
    input) grows, is refused naming the layer, with the new model untouched."""
    old = trained(RecurrentQNetwork(spec(), hidden=(16,), lstm=16))
    new = make_new()
    before = {k: v.clone() for k, v in new.state_dict().items()}
    with pytest.raises(SurgeryRefused, match=says):
        carry(old, new)
    assert all(torch.equal(before[k], v) for k, v in new.state_dict().items())


# ----- zmqrl surgery RUN_DIR NEW.yaml --check ---------------------------------------------
def _run_dir(tmp_path, env=None, **model):
    """A stopped seed.yaml run: its topology and a learner checkpoint of a model whose
    weights are not the initialisation's."""
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.run.topology import load

    from conftest import write_topology

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    old = write_topology(tmp_path, "seed.yaml", **({"model": model} if model else {}),
                         **({"env": env} if env else {}))
    (run_dir / "topology.yaml").write_text(old.read_text())
    topo = load(old)
    model = trained(build_model(topo.model, env_spec(topo.env), topo.seed))
    torch.save({"model": model.state_dict(), "updates": 7}, run_dir / "checkpoints" / "learner.pt")
    return run_dir


def test_surgery_check_reports_what_is_carried_and_the_output_difference(tmp_path):
    from click.testing import CliRunner

    from zmqrl.cli import main

    from conftest import write_topology

    def differences(output: str) -> list[float]:
        line = next(x for x in output.splitlines() if x.startswith("largest output"))
        assert "from CartPole-v1 under random actions" in line
        return [float(v.split()[-1]) for v in line.split(": ", 1)[1].split(", ")]

    run_dir = _run_dir(tmp_path)
    wide = write_topology(tmp_path, "seed.yaml", model={"hidden": [128, 128]})
    result = CliRunner().invoke(main, ["surgery", str(run_dir), str(wide), "--check"])
    assert result.exit_code == 0, result.output
    assert "== learner.pt" in result.output
    assert "transformed  policy.0.weight: units 64 -> 128" in result.output
    assert all(d < TOL for d in differences(result.output)), result.output  # exact
    deeper = write_topology(tmp_path, "seed.yaml", model={"hidden": [128, 128, 128]})
    result = CliRunner().invoke(main, ["surgery", str(run_dir), str(deeper), "--check"])
    assert result.exit_code == 0, result.output
    assert "0.001 x identity (tanh), the next layer / 0.001" in result.output
    assert all(d < TOL for d in differences(result.output)), result.output
    # nothing was written
    assert torch.load(run_dir / "checkpoints" / "learner.pt")["model"]["policy.0.weight"] \
        .shape == (64, 4)


def test_surgery_check_names_the_layer_it_cannot_carry(tmp_path):
    from click.testing import CliRunner

    from zmqrl.cli import main

    from conftest import write_topology

    run_dir = _run_dir(tmp_path)
    narrow = write_topology(tmp_path, "seed.yaml", model={"hidden": [32, 64]})
    result = CliRunner().invoke(main, ["surgery", str(run_dir), str(narrow), "--check"])
    assert result.exit_code == 1
    assert "refused: policy.0: 64 outputs -> 32" in result.output
    masked = write_topology(tmp_path, "seed.yaml", env={"id": "zmqrl/CartPoleNoVelocity-v1"})
    result = CliRunner().invoke(main, ["surgery", str(run_dir), str(masked), "--check"])
    assert result.exit_code == 1 and "policy.0: 4 inputs -> 2" in result.output


def test_surgery_check_places_the_old_features_in_the_new_observation(tmp_path):
    """Masked CartPole's run, checked against full CartPole with the old columns at 0, 2."""
    from click.testing import CliRunner

    from zmqrl.cli import main

    from conftest import write_topology

    run_dir = _run_dir(tmp_path, env={"id": "zmqrl/CartPoleNoVelocity-v1"})
    full = write_topology(tmp_path, "seed.yaml")
    result = CliRunner().invoke(main, ["surgery", str(run_dir), str(full), "--check",
                                       "--inputs", "0,2"])
    assert result.exit_code == 0, result.output
    assert "inputs 2 -> 4 (new columns 0)" in result.output
    line = next(x for x in result.output.splitlines() if x.startswith("largest output"))
    assert all(float(v.split()[-1]) < TOL for v in line.split(": ", 1)[1].split(", ")), line


@pytest.mark.parametrize("light", [False, True], ids=["torch-adam", "light-adam"])
def test_adam_moments_follow_the_carried_parameters(light):
    """After a wider carry the old moments sit where the old values went; new entries
    start at 0 as a fresh Adam's; a parameter made anew has none; where anything is
    fresh the step count restarts (zero moments under an old count step ~3-6x the lr),
    and a model carried whole keeps it."""
    from zmqrl.parts.algos.optim import make_adam
    from zmqrl.parts.surgery.moments import carry_moments

    old = trained(ActorCritic(spec(), hidden=(64, 64)))
    old_opt = make_adam(old.parameters(), lr=1e-3, eps=1e-8, light=light)
    for seed in range(3):
        old_opt.zero_grad()
        logits, value = old(obs(seed=seed))[:2]
        (logits.square().mean() + value.square().mean()).backward()
        old_opt.step()
    new = ActorCritic(spec(obs=6), hidden=(128, 64, 64))
    report = carry(old, new, inputs=[0, 2, 3, 5])
    new_opt = make_adam(new.parameters(), lr=1e-3, eps=1e-8, light=light)
    done, total = carry_moments(old_opt, new_opt, old, new, report.placed)
    assert total == len(list(new.parameters())) and 0 < done < total

    def moments(opt, model):
        names = dict(model.named_parameters())
        if light:
            return {n: (opt.exp_avg[i], opt.exp_avg_sq[i]) for i, n in
                    enumerate(n for p in opt.params for n, q in names.items() if q is p)}
        return {n: (opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])
                for n, p in names.items() if p in opt.state}

    before, after = moments(old_opt, old), moments(new_opt, new)
    m_old, v_old = before["policy.0.weight"]
    m_new, v_new = after["policy.0.weight"]
    assert torch.equal(m_new[:64][:, [0, 2, 3, 5]], m_old)
    assert torch.equal(v_new[:64][:, [0, 2, 3, 5]], v_old)
    assert not m_new[64:].any() and not m_new[:, [1, 4]].any()
    assert torch.equal(after["value.2.bias"][0][:64], before["value.2.bias"][0])
    # the inserted identity layer (policy.4) is new: no moments carried into it
    assert "policy.4.weight" not in report.placed
    if light:
        assert old_opt.step_count == 3 and new_opt.step_count == 0
        assert not after["policy.4.weight"][0].any()
    else:
        assert "policy.4.weight" not in after
        steps = {n: int(new_opt.state[p]["step"]) for n, p in new.named_parameters()
                 if p in new_opt.state}
        assert steps["policy.0.weight"] == steps["value.2.weight"] == 0  # grown
        assert steps["value.2.bias"] == 3  # copied whole: its own count
    # the same model carried whole: every moment and the count as they were
    same = ActorCritic(spec(), hidden=(64, 64))
    same_report = carry(old, same)
    same_opt = make_adam(same.parameters(), lr=1e-3, eps=1e-8, light=light)
    count = len(list(same.parameters()))
    assert carry_moments(old_opt, same_opt, old, same, same_report.placed) == (count, count)
    kept = moments(same_opt, same)
    assert all(torch.equal(kept[n][0], before[n][0]) for n in before)
    if light:
        assert same_opt.step_count == 3
    else:
        assert all(int(s["step"]) == 3 for s in same_opt.state.values())


def _npz_replay(run_dir, items: dict[str, np.ndarray]) -> None:
    n = len(next(iter(items.values())))
    state = {"version": 1, "sampler": "uniform", "capacity": 100, "next_key": n,
             "oldest_key": 0, "keys": np.arange(n, dtype=np.int64),
             **{f"items/{k}": v for k, v in items.items()}}
    np.savez(run_dir / "checkpoints" / "replay.replay.npz", **state)


def test_surgery_carries_a_replays_items_into_the_new_observations(tmp_path):
    """A masked-CartPole Ape-X run resumed on full CartPole: its learner is carried, its
    replay's observations gain the velocity columns (0), nothing else of an item moves,
    and the old checkpoints are kept aside with the old topology."""
    from zmqrl.run import surgery
    from zmqrl.run.topology import load

    from conftest import write_topology

    masked = {"id": "zmqrl/CartPoleNoVelocity-v1"}
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    old_path = write_topology(tmp_path, "apex.yaml", env=masked)
    (run_dir / "topology.yaml").write_text(old_path.read_text())
    old = load(old_path)
    from zmqrl.parts.algos import make_algo
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model

    model = trained(build_model(old.model, env_spec(old.env), old.seed, algo=old.algo_config))
    algo = make_algo(old.algo_config, model)
    torch.save({"model": model.state_dict(), "algo": algo.state_dict(), "updates": 9,
                "env_steps": 1000, "episodes": 40}, run_dir / "checkpoints" / "learner.pt")
    rng = np.random.default_rng(0)
    items = {"obs": rng.normal(size=(30, 2)).astype(np.float32),
             "next_obs": rng.normal(size=(30, 2)).astype(np.float32),
             "action": rng.integers(0, 2, 30), "reward": np.ones(30, np.float32)}
    _npz_replay(run_dir, items)
    new = load(write_topology(tmp_path, "apex.yaml"))
    assert surgery.needed(run_dir, new)
    results, fates = surgery.perform(run_dir, new, inputs=[0, 2])
    assert "replay.replay.npz: 30 items carried (observations (2,) -> (4,), the new " \
           "features 0)" in fates
    carried = np.load(run_dir / "checkpoints" / "replay.replay.npz")
    for name in ("obs", "next_obs"):
        grown = carried[f"items/{name}"]
        assert grown.shape == (30, 4) and not grown[:, [1, 3]].any()
        np.testing.assert_array_equal(grown[:, [0, 2]], items[name])
    np.testing.assert_array_equal(carried["items/action"], items["action"])
    state = torch.load(run_dir / "checkpoints" / "learner.pt", weights_only=True)
    assert (state["updates"], state["env_steps"], state["episodes"]) == (9, 1000, 40)
    assert state["model"]["torso.0.weight"].shape[1] == 4
    assert max(results[0].differences.values()) < TOL
    # the target network is the carried model, the counters as they were
    assert state["algo"]["updates"] == algo.updates
    for key, value in state["algo"]["target_model"].items():
        assert torch.equal(value, state["model"][key]), key
    backup = run_dir / "checkpoints" / "before-surgery-1"
    assert sorted(p.name for p in backup.iterdir()) == [
        "learner.pt", "replay.replay.npz", "topology.yaml"]
    assert load(backup / "topology.yaml").env["id"] == masked["id"]
    assert surgery.surgeries(run_dir) == 1


def test_surgery_carries_a_recurrent_run_and_its_stored_sequences(tmp_path):
    """seed_r2d2.yaml's POMDP lifted: a masked-CartPole R2D2 run resumed on full
    CartPole. The LSTM Q-network is carried (its unrolls unchanged, checked on the
    replay's own observations), and every stored sequence [T+1] of observations gains
    the velocity columns at 0, its LSTM states and actions as they were."""
    from zmqrl.parts.algos import make_algo
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.run import surgery
    from zmqrl.run.topology import load

    from conftest import write_topology

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    old_path = write_topology(tmp_path, "r2d2.yaml")  # its env: masked CartPole
    (run_dir / "topology.yaml").write_text(old_path.read_text())
    old = load(old_path)
    assert env_spec(old.env).obs_shape == (2,)
    model = trained(build_model(old.model, env_spec(old.env), old.seed, algo=old.algo_config))
    algo = make_algo(old.algo_config, model)
    torch.save({"model": model.state_dict(), "algo": algo.state_dict(), "updates": 7,
                "env_steps": 500, "episodes": 12}, run_dir / "checkpoints" / "learner.pt")
    rng = np.random.default_rng(0)
    items = {"obs": rng.normal(size=(8, 21, 2)).astype(np.float32),
             "action": rng.integers(0, 2, (8, 20)),
             "state_h": rng.normal(size=(8, 64)).astype(np.float32)}
    _npz_replay(run_dir, items)
    new = load(write_topology(tmp_path, "r2d2.yaml", env={"id": "CartPole-v1"}))
    results, fates = surgery.perform(run_dir, new, inputs=[0, 2])
    assert "replay.replay.npz: 8 items carried (observations (2,) -> (4,), the new " \
           "features 0)" in fates
    carried = np.load(run_dir / "checkpoints" / "replay.replay.npz")
    grown = carried["items/obs"]
    assert grown.shape == (8, 21, 4) and not grown[..., [1, 3]].any()
    np.testing.assert_array_equal(grown[..., [0, 2]], items["obs"])
    np.testing.assert_array_equal(carried["items/state_h"], items["state_h"])
    assert max(results[0].differences.values()) < TOL
    state = torch.load(run_dir / "checkpoints" / "learner.pt", weights_only=True)
    assert state["updates"] == 7
    new_model = build_model(new.model, env_spec(new.env), new.seed, algo=new.algo_config)
    new_model.load_state_dict(state["model"])
    x = torch.as_tensor(grown[:, :20]).transpose(0, 1)  # [T, B, 4]
    (a,), (b,) = sequence_outputs(model, x[..., [0, 2]]), sequence_outputs(new_model, x)
    assert (a - b).abs().max() < TOL


def test_surgery_on_a_run_that_never_checkpointed_carries_nothing(tmp_path):
    from zmqrl.run import surgery
    from zmqrl.run.topology import load

    from conftest import write_topology

    run_dir = _run_dir(tmp_path)
    (run_dir / "checkpoints" / "learner.pt").unlink()
    new = load(write_topology(tmp_path, "seed.yaml", model={"hidden": [128, 128]}))
    assert surgery.perform(run_dir, new) == ([], [])
    assert surgery.surgeries(run_dir) == 0 and not list((run_dir / "checkpoints").iterdir())


def test_surgery_drops_replay_items_it_cannot_carry_with_their_count(tmp_path):
    from zmqrl.run import surgery
    from zmqrl.run.topology import load

    from conftest import write_topology

    run_dir = _run_dir(tmp_path)
    _npz_replay(run_dir, {"obs": np.zeros((12, 4, 4), np.float32)})
    new = load(write_topology(tmp_path, "seed.yaml", model={"hidden": [128, 128]}))
    _, fates = surgery.perform(run_dir, new)
    assert "replay.replay.npz: 12 items kept (the same observations)" in fates
    assert (run_dir / "checkpoints" / "replay.replay.npz").exists()
    masked = load(write_topology(tmp_path, "seed.yaml", model={"hidden": [128, 128]},
                                 env={"id": "zmqrl/MinAtar-Breakout-v1"}))
    fate = surgery._carry_replay(run_dir / "checkpoints" / "replay.replay.npz",
                                 tmp_path / "out.npz", load(run_dir / "topology.yaml"),
                                 masked, None)
    assert fate.startswith("out.npz: 12 items dropped (observations (4,) -> (4, 10, 10)")
    assert not (tmp_path / "out.npz").exists()


def test_a_surgery_part_of_ones_own_is_the_one_used(tmp_path):
    """``parts: {surgery: module:Name}``: the user's part carries (here: refuses, naming
    its layer), not net2net; an unknown name is refused when the topology is checked."""
    from click.testing import CliRunner

    from zmqrl.cli import main

    from conftest import write_topology

    (tmp_path / "frozen_surgery.py").write_text(
        "class Frozen:\n"
        "    @staticmethod\n"
        "    def carry(old, new, inputs=None, logit_tolerance=1e-4):\n"
        "        raise ValueError('core.7: this model is never carried')\n\n"
        "    @staticmethod\n"
        "    def check(old, new, obs, inputs=None):\n"
        "        return {}\n")
    run_dir = _run_dir(tmp_path)
    wide = write_topology(tmp_path, "seed.yaml", model={"hidden": [128, 128]},
                          parts={"surgery": "frozen_surgery:Frozen"})
    result = CliRunner().invoke(main, ["surgery", str(run_dir), str(wide), "--check"])
    assert result.exit_code == 1, result.output
    assert "refused: core.7: this model is never carried" in result.output
    unknown = write_topology(tmp_path, "seed.yaml", parts={"surgery": "net3net"})
    result = CliRunner().invoke(main, ["validate", str(unknown)])
    assert result.exit_code != 0 and "parts.surgery" in result.output \
        and "net3net" in result.output, result.output
