"""Surgery's function-preserving transforms (zmqrl/parts/surgery/net2net.py, issue 45):
each keeps a trained model's outputs within 1e-5 on random inputs — wider, deeper (ReLU
exactly, tanh through its linear range), new observation features, new actions — and a
part that cannot be carried is refused naming the layer, before the new model changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zmqrl.parts.actor_critic.models import ActorCritic
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


def test_a_model_that_declares_no_chains_is_refused_naming_it():
    old = RecurrentQNetwork(spec(), hidden=(16,), lstm=16)
    with pytest.raises(SurgeryRefused, match="RecurrentQNetwork does not say"):
        carry(old, RecurrentQNetwork(spec(), hidden=(32,), lstm=16))


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

    run_dir = _run_dir(tmp_path)
    wide = write_topology(tmp_path, "seed.yaml", model={"hidden": [128, 128, 128]})
    result = CliRunner().invoke(main, ["surgery", str(run_dir), str(wide), "--check"])
    assert result.exit_code == 0, result.output
    assert "== learner.pt" in result.output
    assert "transformed  policy.0.weight: units 64 -> 128" in result.output
    assert "identity" in result.output  # the inserted layer
    line = next(x for x in result.output.splitlines() if x.startswith("largest output"))
    assert "from CartPole-v1 under random actions" in line
    assert all(float(v.split()[-1]) < TOL for v in line.split(": ", 1)[1].split(", ")), line
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
