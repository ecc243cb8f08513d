"""board_mlp masks illegal moves: its legal moves are the game's own, on positions of real
games of both board kinds, and no pass (acting, the learner's evaluation) gives an
illegal move any probability."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("pyspiel")

from zmqrl.parts.envs import env_spec  # noqa: E402
from zmqrl.parts.games import GameEnv, env_id  # noqa: E402
from zmqrl.parts.models import build_model  # noqa: E402


def positions(game: str, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Observations and legal masks of ``count`` positions of random games (mid-game
    ones: the game's own legality, from pyspiel, is the truth)."""
    env = GameEnv(game, opponent="self")
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    boards, masks = [], []
    while len(boards) < count:
        boards.append(obs)
        masks.append(info["legal_mask"])
        obs, _, done, _, info = env.step(rng.choice(np.flatnonzero(info["legal_mask"])))
        if done:
            obs, info = env.reset()
    return np.stack(boards), np.stack(masks)


@pytest.mark.parametrize("game", ["tic_tac_toe", "connect_four"])
def test_board_model_plays_only_legal_moves(game):
    spec = env_spec({"id": env_id(game)})
    model = build_model({"kind": "board_mlp", "hidden": [32]}, spec, seed=1)
    obs, legal = positions(game, 300)
    assert (~legal).any()  # positions with illegal moves to mask
    assert np.array_equal(model.legal(torch.from_numpy(obs)).numpy(), legal)

    actions, logp = model.act(torch.from_numpy(obs).repeat(20, 1, 1, 1))
    assert np.tile(legal, (20, 1))[np.arange(len(actions)), actions.numpy()].all()
    assert torch.isfinite(logp).all()

    logits, _ = model(torch.from_numpy(obs))
    probs = torch.softmax(logits, -1).detach().numpy()
    assert np.allclose(probs.sum(-1), 1.0) and (probs[~legal] == 0).all()
    some_legal = torch.from_numpy(legal.argmax(1))
    logp, entropy, _ = model.evaluate(torch.from_numpy(obs), some_legal)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    # the entropy of a near-uniform policy over the legal moves only
    assert np.allclose(entropy.detach().numpy(), np.log(legal.sum(1)), atol=0.05)


def test_board_model_refuses_what_is_not_a_board():
    with pytest.raises(ValueError, match="board_mlp needs a board game's planes"):
        build_model({"kind": "board_mlp"}, env_spec({"id": "CartPole-v1"}))
