"""AlphaZero's hyperparameters (a topology's ``algo`` section) and the parts it is made
of: search at the actors (``zmqrl.parts.search``), a policy-value learner. No torch here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from zmqrl.parts.algo_config import SEARCH, AlgoConfig
from zmqrl.parts.bounds import ranged


@dataclass
class AlphaZeroConfig(AlgoConfig):
    """Hyperparameters of AlphaZero (the topology's ``algo`` section): the search the
    actors run (``zmqrl.parts.search``) and the learner's loss (``zmqrl.parts.alphazero.learner``).
    The search defaults suit small board games (tic-tac-toe, connect four)."""

    kind: str = "alphazero"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "lr_final", "anneal_updates", "batch_size", "value_cost", "l2",
        "max_grad_norm"})
    family: ClassVar[str] = SEARCH
    learner: ClassVar[str] = "zmqrl.parts.alphazero.learner:AlphaZeroLearner"
    items: ClassVar[str] = "positions"
    behaviour: ClassVar[str] = "evaluate"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "policy_value"
    reduced_precision: ClassVar[bool] = True
    num_simulations: int = ranged(50, ge=1)  # MCTS simulations per move
    c_puct: float = ranged(1.5, gt=0)  # exploration weight of the PUCT rule
    dirichlet_alpha: float = ranged(1.0, gt=0)  # root noise Dir(alpha) over the legal moves ...
    # ... mixed into the root priors with this weight
    dirichlet_fraction: float = ranged(0.25, ge=0, le=1)
    # The first moves of each game are sampled in proportion to the root's visit counts
    # (temperature 1); later ones take the most visited move.
    temperature_moves: int = ranged(4, ge=0)
    # A position's value target: the game's outcome z for the player to move, or
    # (1 - mix) z + mix q with q the search's value of the position (its root), which
    # is less noisy than one game's result (what Oracle's connect-four AlphaZero found).
    value_target_mix: float = ranged(0.0, ge=0, le=1)
    # Each finished game goes to the replay mirrored left-right as well (games whose
    # rules are symmetric: tic-tac-toe, connect four), twice the positions per game.
    mirror_games: bool = False
    # Playout cap randomization (KataGo, Wu 2019): this fraction of moves, drawn at random,
    # is searched with num_simulations (root noise on) and recorded; the others with
    # fast_simulations, no noise, not recorded. More games for the same search: more
    # independent outcomes for the value target. 1: every move searched fully.
    full_search_fraction: float = ranged(1.0, gt=0, le=1)
    fast_simulations: int = ranged(20, ge=1)  # <= num_simulations: cross_field_errors
    # Each move's search starts from the subtree of the move just played, whose visits
    # count towards its simulations (instead of a fresh tree).
    reuse_trees: bool = False
    batch_size: int = ranged(128, ge=1)  # positions per update
    lr: float = ranged(1e-3, gt=0)  # Adam (the start value when annealed)
    # With anneal_updates > 0 the lr falls linearly from lr to lr_final over that many
    # updates and then stays at lr_final (AlphaZero lowered its lr in steps); 0: constant.
    anneal_updates: int = ranged(0, ge=0)
    lr_final: float = ranged(1e-4, ge=0)
    # weight of the value MSE (the policy cross-entropy has 1)
    value_cost: float = ranged(1.0, ge=0)
    l2: float = ranged(1e-4, ge=0)  # weight of the sum of squared weights (biases excluded)
    max_grad_norm: float = ranged(10.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False

    @classmethod
    def cross_field_errors(cls, v: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A fast search is the cheaper one (when fast searches are on at all)."""
        fast, full = v["fast_simulations"], v["num_simulations"]
        if v["full_search_fraction"] != 1.0 and \
                all(isinstance(x, int) and not isinstance(x, bool) for x in (fast, full)) \
                and fast > full:
            return [("fast_simulations", f"{fast!r}: must be <= num_simulations ({full})"
                                         " when full_search_fraction < 1")]
        return []
