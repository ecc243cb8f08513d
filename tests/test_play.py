"""`zmqrl play RUN_DIR`: a trained run's checkpoint plays its env here, prints returns,
records a video a reader can open, and refuses what it cannot play with a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO, write_topology

pytestmark = pytest.mark.minutes(1)  # tests/conftest.py: long modules first


def zmqrl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zmqrl.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def episode_returns(out: str) -> list[float]:
    return [float(line.split("return ")[1].split()[0]) for line in out.splitlines()
            if line.startswith("episode ")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real CartPole run of seed.yaml stopped once it learned: mean return of the
    last 20 episodes 150 (random play: ~22)."""
    tmp = tmp_path_factory.mktemp("trained")
    topo = write_topology(tmp, nodes={"actor": {"replicas": 2, "args": {"envs": 8}}})
    run_dir = tmp / "run"
    result = zmqrl("up", str(topo), "--run-dir", str(run_dir), "--target-return", "150",
                   "--target-window", "20", "--max-seconds", "240", timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "reached" in result.stdout + result.stderr, (result.stdout + result.stderr)[-2000:]
    assert (run_dir / "checkpoints" / "learner.pt").is_file()
    return run_dir


def fake_run(tmp_path: Path, base: str = "seed.yaml", **overrides) -> Path:
    """A run directory as `zmqrl up` leaves one, with no run behind it: its resolved
    topology and a learner checkpoint of the topology's untrained model."""
    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.run.topology import load

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    topo_file = write_topology(tmp_path, base, **overrides)
    (run_dir / "topology.yaml").write_text(topo_file.read_text())
    topo = load(topo_file)
    model = build_model(topo.model, env_spec(topo.env), topo.seed)
    torch.save({"format": 1, "model": model.state_dict(), "updates": 0},
               run_dir / "checkpoints" / "learner.pt")
    return run_dir


def test_a_trained_run_plays_better_than_its_untrained_model(trained, tmp_path):
    result = zmqrl("play", str(trained), "--episodes", "3", "--greedy")
    assert result.returncode == 0, result.stderr
    assert "learner.pt (greedy actions)" in result.stdout
    returns = episode_returns(result.stdout)
    assert len(returns) == 3 and "mean return" in result.stdout
    untrained = zmqrl("play", str(fake_run(tmp_path)), "--episodes", "3", "--greedy")
    assert untrained.returncode == 0, untrained.stderr
    before = episode_returns(untrained.stdout)
    assert len(before) == 3
    # what it learned shows: the untrained net's greedy play drops the pole in ~10-40 steps
    assert np.mean(returns) >= 100 > np.mean(before), (returns, before)
    sampled = zmqrl("play", str(trained), "--episodes", "2", "--seed", "7")
    assert sampled.returncode == 0 and "(sampled actions)" in sampled.stdout
    assert len(episode_returns(sampled.stdout)) == 2


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_video_holds_every_step_of_every_episode(trained, tmp_path, suffix):
    import imageio.v3 as iio

    video = tmp_path / f"play{suffix}"
    result = zmqrl("play", str(trained), "--episodes", "2", "--max-steps", "40",
                   "--video", str(video))
    assert result.returncode == 0, result.stderr
    assert f"wrote {video}" in result.stdout
    lengths = [int(line.split(" in ")[1].split()[0]) for line in result.stdout.splitlines()
               if line.startswith("episode ")]
    frames = iio.imread(video)  # every frame, decoded: a reader can open it
    expected = sum(n + 1 for n in lengths)  # the first frame of each episode, one per step
    if suffix == ".gif":  # Pillow merges identical neighbours into one longer frame
        from PIL import Image, ImageSequence

        with Image.open(video) as gif:
            shown_ms = sum(f.info["duration"] for f in ImageSequence.Iterator(gif))
        assert shown_ms == pytest.approx(expected * 1000 / 50, rel=0.05)  # CartPole: 50 fps
        assert 1 < frames.shape[0] <= expected
    else:
        assert frames.shape[0] == expected, (frames.shape, lengths)
    assert frames.shape[-1] == 3 and frames.shape[1:3] == (400, 600)  # CartPole's screen
    assert frames.std() > 0  # a picture, not a blank


def test_a_missing_run_or_checkpoint_is_a_clear_error(tmp_path):
    result = zmqrl("play", str(tmp_path / "nowhere"))
    assert result.returncode == 1
    assert "is not a run directory: it has no topology.yaml" in result.stderr
    run_dir = fake_run(tmp_path)
    (run_dir / "checkpoints" / "learner.pt").unlink()
    result = zmqrl("play", str(run_dir))
    assert result.returncode == 1 and "has no learner checkpoint" in result.stderr
    result = zmqrl("play", str(run_dir), "--checkpoint", "member3")
    assert result.returncode == 1 and "no checkpoint 'member3'" in result.stderr


def test_a_foreign_or_broken_checkpoint_is_refused_naming_the_mismatch(tmp_path):
    run_dir = fake_run(tmp_path)
    other = fake_run(tmp_path / "other", model={"hidden": [32]})  # another width
    foreign = other / "checkpoints" / "learner.pt"
    result = zmqrl("play", str(run_dir), "--checkpoint", str(foreign))
    assert result.returncode == 1
    assert "does not fit this run's model (mlp on CartPole-v1)" in result.stderr
    assert "size mismatch" in result.stderr
    broken = run_dir / "checkpoints" / "learner.pt"
    broken.write_bytes(b"not a checkpoint")
    result = zmqrl("play", str(run_dir), "--checkpoint", "learner")
    assert result.returncode == 1 and "is not a zmqrl checkpoint" in result.stderr
    torch.save({"items": torch.zeros(3)}, run_dir / "checkpoints" / "replay.pt")
    result = zmqrl("play", str(run_dir), "--checkpoint", "replay")
    assert result.returncode == 1 and "holds no model parameters" in result.stderr
    assert "Traceback" not in result.stderr


def test_what_cannot_be_played_says_why(tmp_path):
    minatar = fake_run(tmp_path / "m", "seed_minatar.yaml")
    result = zmqrl("play", str(minatar), "--video", str(tmp_path / "x.mp4"))
    assert result.returncode == 1
    assert "cannot render frames for a video" in result.stderr
    cartpole = fake_run(tmp_path / "c")
    result = zmqrl("play", str(cartpole), "--video", str(tmp_path / "x.avi"))
    assert result.returncode == 1 and "write .mp4 or .gif" in result.stderr
    lstm = fake_run(tmp_path / "l", "ppo_lstm.yaml")
    result = zmqrl("play", str(lstm), "--greedy", "--episodes", "1")
    assert result.returncode == 1 and "has no greedy mode" in result.stderr
    result = zmqrl("play", str(lstm), "--episodes", "1", "--max-steps", "20")
    assert result.returncode == 0, result.stderr  # sampling plays it, state and all
    assert yaml.safe_load((lstm / "topology.yaml").read_text())["model"]["kind"] == "lstm_ac"


@pytest.mark.parametrize("base", ["apex.yaml", "seed_mujoco.yaml"])
@pytest.mark.parametrize("mode", ["--greedy", "--sample"])
def test_every_behaviour_family_plays_in_both_modes(tmp_path, base, mode):
    """ε-greedy Q-learning (greedy: ε 0) and a Gaussian policy (greedy: its mean) play
    through their own behaviours, as the discrete actor-critic does above."""
    run_dir = fake_run(tmp_path, base)
    result = zmqrl("play", str(run_dir), "--episodes", "2", "--max-steps", "50", mode)
    assert result.returncode == 0, result.stderr
    returns = episode_returns(result.stdout)
    assert len(returns) == 2 and all(np.isfinite(returns))
