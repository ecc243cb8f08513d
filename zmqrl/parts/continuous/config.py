"""The ``td3`` and ``sac`` algorithms' hyperparameters (a topology's ``algo`` section)
and the parts each is made of. No torch here: every node reads its config.

Defaults are the papers' and Stable-Baselines3's for MuJoCo (Fujimoto et al. 2018;
Haarnoja et al. 2018), with Ape-X DPG's additions: n-step transitions (``n_step``,
summed where they are made) and prioritized replay with importance weights (the
replay's ``sampler``). How many updates each env step pays for is the replay's
``samples_per_insert`` (SB3's ``train_freq``/``gradient_steps``), not a field here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zmqrl.parts.algo_config import REPLAY, AlgoConfig
from zmqrl.parts.bounds import ranged


@dataclass
class TwinQConfig(AlgoConfig):
    """What TD3 and SAC share: twin critics learned from n-step transitions sampled by
    priority, Polyak-averaged targets."""

    family: ClassVar[str] = REPLAY
    items: ClassVar[str] = "transitions"
    source: ClassVar[str] = "replay"
    batch_size: int = ranged(256, ge=1)  # transitions sampled from replay per update
    actor_lr: float = ranged(3e-4, gt=0)  # Adam step size of the policy
    critic_lr: float = ranged(3e-4, gt=0)  # Adam step size of the twin critics
    discount: float = ranged(0.99, ge=0, le=1)
    # Steps summed before bootstrapping, by the actors (NStepAccumulator); the learner
    # reads each transition's own discount (gamma^m, 0 at a terminal).
    n_step: int = ranged(1, ge=1)
    tau: float = ranged(0.005, gt=0, le=1)  # Polyak step of the target networks
    # Gradient-norm clip of each step; the default only guards (a non-finite norm skips
    # the step: zmqrl.parts.algos.gradients.clip_and_step).
    max_grad_norm: float = ranged(1000.0, gt=0)
    adam_eps: float = ranged(1e-8, gt=0)
    # New priorities: |δ| of the twin critics, averaged, plus this floor.
    priority_eps: float = ranged(1e-3, ge=0)


@dataclass
class TD3Config(TwinQConfig):
    """TD3 (twin critics, target-policy smoothing, delayed policy updates) as the
    learner of Ape-X DPG: actors add Gaussian noise to the deterministic policy."""

    kind: str = "td3"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "actor_lr", "critic_lr", "batch_size", "tau", "policy_delay", "max_grad_norm",
        "target_noise", "target_noise_clip"})
    learner: ClassVar[str] = "zmqrl.parts.continuous.td3:TD3Learner"
    behaviour: ClassVar[str] = "gaussian_noise"
    model_interface: ClassVar[str | None] = "deterministic_actor_twin_q"
    # Acting noise: std as a fraction of each action dimension's half-range, unless an
    # actor's behaviour argument `noise` gives its own (a per-replica schedule).
    exploration_noise: float = ranged(0.1, ge=0)
    # Target-policy smoothing: noise std and clip, fractions of the half-range.
    target_noise: float = ranged(0.2, ge=0)
    target_noise_clip: float = ranged(0.5, ge=0)
    policy_delay: int = ranged(2, ge=1)  # critic updates per policy (and target) update


@dataclass
class SACConfig(TwinQConfig):
    """Soft actor-critic: a tanh-squashed Gaussian policy, twin critics, and an entropy
    temperature learned towards ``target_entropy``."""

    kind: str = "sac"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "actor_lr", "critic_lr", "alpha_lr", "batch_size", "tau", "policy_delay",
        "max_grad_norm", "learn_alpha"})
    learner: ClassVar[str] = "zmqrl.parts.continuous.sac:SACLearner"
    behaviour: ClassVar[str] = "squashed_gaussian"
    model_interface: ClassVar[str | None] = "stochastic_actor_twin_q"
    alpha_lr: float = ranged(3e-4, gt=0)  # Adam step size of log(alpha)
    learn_alpha: bool = True  # False: alpha stays at the model's initial value
    # The entropy the temperature steers to; None: -(action dimensions), as SAC.
    target_entropy: float | None = ranged(None, le=1e3, ge=-1e3)
    policy_delay: int = ranged(1, ge=1)  # critic updates per policy and alpha update
