"""The ``muzero`` algorithm's hyperparameters (a topology's ``algo`` section) and the parts
it is made of. No torch here: every node reads its config.

MuZero (Schrittwieser et al. 2020) for single-player envs with discrete actions: actors
search in the learned model (``latent_search``) and store, per position, the actions,
rewards, n-step value targets and search visit distributions of the ``unroll_steps``
that follow (``search_targets``) in a replay; the learner unrolls the model along them
(``zmqrl.parts.muzero.learner``). Defaults are the paper's (Appendix B–G), scaled down
where the paper's were for Atari on TPUs (simulations, batch size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zmqrl.parts.algo_config import SEARCH, AlgoConfig
from zmqrl.parts.bounds import ranged

# What items carry for a reanalyse node (zmqrl.parts.muzero.messages): all or none;
# the unroll's observations also for the consistency loss.
UNROLL_OBS = "obs_unroll"
BOOTSTRAP_ARRAYS = ("obs_bootstrap", "partial_return", "bootstrap_discount")
REANALYSE_ARRAYS = (UNROLL_OBS, *BOOTSTRAP_ARRAYS)


@dataclass
class MuZeroConfig(AlgoConfig):
    """Hyperparameters of MuZero: the search the actors run, the targets they build and
    the learner's unrolled loss."""

    kind: str = "muzero"
    messages: ClassVar[tuple[str, ...]] = ("muzero",)  # zmqrl.parts.muzero.messages
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "lr_final", "anneal_updates", "batch_size", "value_cost", "weight_decay",
        "max_grad_norm", "priority_eps"})
    family: ClassVar[str] = SEARCH
    learner: ClassVar[str] = "zmqrl.parts.muzero.learner:MuZeroLearner"
    items: ClassVar[str] = "search_targets"
    behaviour: ClassVar[str] = "latent_search"
    source: ClassVar[str] = "replay"
    model_interface: ClassVar[str | None] = "muzero"
    # Search (zmqrl.parts.muzero.search, MuZero's pUCT with min-max normalized Q).
    num_simulations: int = ranged(25, ge=1)  # simulations per move (paper: 50 on Atari)
    # Discount of rewards, in the search's backups and in the n-step value targets.
    discount: float = ranged(0.997, ge=0, le=1)
    # pUCT exploration: pb_c_init + log((N + pb_c_base + 1) / pb_c_base) weighs the prior.
    pb_c_base: float = ranged(19652.0, gt=0)
    pb_c_init: float = ranged(1.25, ge=0)
    dirichlet_alpha: float = ranged(0.25, gt=0)  # root noise Dir(alpha) over the actions ...
    # ... mixed into the root priors with this weight (0: no noise)
    dirichlet_fraction: float = ranged(0.25, ge=0, le=1)
    # Actions are drawn in proportion to N^(1/temperature) of the root's visits;
    # 0: the most visited action.
    temperature: float = ranged(1.0, ge=0)
    # Targets: K, the steps the learner unrolls the dynamics past each position, and the
    # n of the n-step value target z_t = sum_{i<n} gamma^i u_{t+i} + gamma^n v_{t+n}
    # (v the search's root value; the sum stops at an episode's end).
    unroll_steps: int = ranged(5, ge=1)
    td_steps: int = ranged(10, ge=1)
    # Items also carry what a reanalyse node needs to recompute their targets with newer
    # parameters (nodes/reanalyse.py): the observations at t+1..t+K and at each value
    # target's bootstrap, and the reward sums and discounts of the value targets.
    # Several times an item's observation bytes: off unless a reanalyse node runs.
    reanalyse: bool = False
    # A target network for the value targets (LightZero's and EfficientZero's
    # ``target_model``; not the paper's MuZero, whose targets are the actors' search
    # values): with N > 0 the learner recomputes every n-step value target from the
    # stored reward sums and bootstrap observations with a copy of its network refreshed
    # every N updates, so a target is never staler than N updates, however long the item
    # has been held. Items then carry the bootstrap arrays (as for a reanalyse node).
    # 0: the stored targets.
    target_update_every: int = ranged(0, ge=0)
    # Learner.
    batch_size: int = ranged(128, ge=1)  # positions (each with K unrolled steps) per update
    lr: float = ranged(1e-3, gt=0)  # Adam (the start value when annealed)
    # With anneal_updates > 0 the lr falls linearly from lr to lr_final over that many
    # updates, then stays (muzero-general decays its lr; the paper's Atari lr steps down)
    anneal_updates: int = ranged(0, ge=0)
    lr_final: float = ranged(1e-4, ge=0)
    # L2 penalty on the weights (biases excluded), added to the loss: weight_decay * sum w^2.
    weight_decay: float = ranged(1e-4, ge=0)
    # Weight of the value cross-entropy (the paper's 0.25 for reanalysed Atari).
    value_cost: float = ranged(0.25, ge=0)
    # EfficientZero's self-supervised consistency (Ye et al. 2021), not the paper's
    # MuZero (0: off): at each unrolled step k, minus the cosine similarity of the
    # dynamics' latent and the representation of the observation really reached at
    # t+k (its gradient stopped). It teaches the dynamics the actions' effect from
    # the observations themselves, where MuZero learns it only through the value,
    # policy and reward. Items then carry the unroll's observations (``obs_unroll``).
    consistency_cost: float = ranged(0.0, ge=0)
    max_grad_norm: float = ranged(5.0, gt=0)  # global gradient-norm clip of each step
    # Priorities: |v - z| of the first step (the actor's search value, then the
    # learner's predicted value, vs its target) plus this. Never 0: a prioritized
    # replay's importance weights are scaled by the smallest priority it holds.
    priority_eps: float = ranged(1e-3, gt=0)

    def message_dims(self) -> dict[str, int]:
        return {"K": self.unroll_steps}  # the replay's layout, whoever inserts first

    def optional_arrays(self) -> dict[str, bool]:
        # the reanalyse arrays come exactly when a reanalyse node runs; the bootstrap
        # arrays also for the target network, the unroll's observations also for the
        # consistency loss
        return {**dict.fromkeys(BOOTSTRAP_ARRAYS,
                                self.reanalyse or self.target_update_every > 0),
                UNROLL_OBS: self.reanalyse or self.consistency_cost > 0}

    @property
    def unroll_observations(self) -> bool:
        """Whether items carry the observations at t+1..t+K."""
        return self.optional_arrays()[UNROLL_OBS]

    @property
    def bootstrap_arrays(self) -> bool:
        """Whether items carry each value target's reward sum and bootstrap."""
        return self.optional_arrays()[BOOTSTRAP_ARRAYS[0]]

    def items_per_env_step(self) -> int:
        # One position per env step. (An episode's end completes the targets of the
        # positions still waiting for their n-step values at once; nothing reads this
        # method today to size a replay's insert.)
        return 1
