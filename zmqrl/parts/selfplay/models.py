"""The actor-critic MLP for board games, with the illegal moves masked out of its policy.

A game env of ``zmqrl.parts.games`` observes the board from the mover's side as planes
[own pieces, opponent's pieces, empty] ([3, H, W]), and an illegal move loses the game.
An unmasked policy has to learn the rules from those losses (in self-play on tic-tac-toe
7-8 % of the games were lost so). This model reads the legal moves off the empty plane
and gives the others a logit of -1e9, in every pass: acting (broker, local actor, the
league's matches), the learner's log-probabilities and entropy, so behaviour and target
policy agree and no probability is spent on a move that cannot be made.

Two board kinds, told apart by the action count:

* **placement** (tic-tac-toe): one action per cell (``H * W`` actions); a move is legal
  where the cell is empty;
* **drop** (connect four): one action per column (``W`` actions); a move is legal where
  the column's top cell is empty. Which row is the top is read from the game
  (``top_row``, pyspiel's connect four fills row 0 first, so its top is row ``H - 1``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zmqrl.parts.actor_critic.models import ActorCritic
from zmqrl.parts.envs import EnvSpec

ILLEGAL_LOGIT = -1e9  # finite: a board with no legal move (a final one) stays NaN-free


class BoardActorCritic(ActorCritic):
    """:class:`ActorCritic` whose logits are masked by the legal moves of the board."""

    def __init__(self, spec: EnvSpec, hidden: Sequence[int] = (64, 64), top_row: int = -1):
        shape = tuple(spec.obs_shape)
        if spec.num_actions is None or len(shape) != 3 or shape[0] != 3:
            raise ValueError(f"board_mlp needs a board game's planes [own, opponent's, empty] "
                             f"([3, H, W]) and discrete moves, not observations {shape} "
                             f"with {spec.num_actions} actions (use a zmqrl/OpenSpiel-* env)")
        _, rows, cols = shape
        if spec.num_actions == rows * cols:
            drop = False
        elif spec.num_actions == cols:
            drop = True
        else:
            raise ValueError(f"board_mlp: {spec.num_actions} actions are neither one per cell "
                             f"({rows * cols}) nor one per column ({cols}) of a {rows}x{cols} "
                             "board")
        super().__init__(spec, hidden)
        self.drop = drop
        self.top_row = top_row % rows

    def legal(self, obs: torch.Tensor) -> torch.Tensor:
        """bool [N, A]: the legal moves of each board."""
        empty = obs[:, 2] > 0.5  # [N, H, W]
        if self.drop:
            return empty[:, self.top_row, :]
        return empty.reshape(empty.shape[0], -1)

    def _logits(self, obs: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.policy(features).masked_fill(~self.legal(obs), ILLEGAL_LOGIT)
