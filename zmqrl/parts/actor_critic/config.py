"""The actor-critic algorithms' hyperparameters (a topology's ``algo`` section) and the
parts each is made of: ``vtrace`` (IMPALA), ``a2c`` (A2C/A3C) and ``ppo``. No torch here:
every node reads its config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zmqrl.parts.algo_config import UNROLL, AlgoConfig
from zmqrl.parts.bounds import ranged


@dataclass
class VTraceConfig(AlgoConfig):
    """Hyperparameters of the V-trace learner (the topology's ``algo`` section).

    The defaults are V-trace and the IMPALA loss as in the paper; the knobs after
    ``adam_eps`` are optional extras (each off by default).
    """

    kind: str = "vtrace"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "discount", "baseline_cost", "entropy_cost", "clip_rho", "clip_c",
        "clip_pg_rho", "max_grad_norm", "epochs", "minibatches", "normalize_advantages",
        "reward_scale", "ppo_clip"})
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.actor_critic.vtrace:VTraceLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    unroll: int = ranged(20, ge=1)  # steps per unroll; the broker assembles unrolls this long
    batch_size: int = ranged(32, ge=1)  # env columns (unrolls) per update
    lr: float = ranged(6e-4, gt=0)
    discount: float = ranged(0.99, ge=0, le=1)
    baseline_cost: float = ranged(0.5, ge=0)
    entropy_cost: float = ranged(0.01, ge=0)
    clip_rho: float | None = ranged(1.0, gt=0)  # None: importance weights not clipped
    clip_c: float | None = ranged(1.0, gt=0)
    clip_pg_rho: float | None = ranged(1.0, gt=0)
    max_grad_norm: float = ranged(40.0, gt=0)
    epochs: int = ranged(1, ge=1)  # SGD passes over each batch (V-trace corrects the drift)
    minibatches: int = ranged(1, ge=1)  # column splits per pass
    normalize_advantages: bool = False
    adam_eps: float = ranged(1e-5, gt=0)
    # Rewards are multiplied by this before V-trace (values learn the scaled return).
    reward_scale: float = ranged(1.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up (see there).
    light_adam: bool = False
    # Clipped surrogate (PPO/IMPACT style) in place of the IMPALA policy term: with
    # epsilon set, the policy loss is -min(r A, clip(r, 1-eps, 1+eps) A), r = pi/mu,
    # A = r_s + gamma_s v_{s+1} - V(x_s) from the V-trace targets (rho not applied, r
    # carries it). A trust region that makes several epochs per batch safe.
    ppo_clip: float | None = ranged(None, gt=0)


@dataclass
class A2CConfig(AlgoConfig):
    """Hyperparameters of the A2C learner (the topology's ``algo`` section)."""

    kind: str = "a2c"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "discount", "baseline_cost", "entropy_cost", "normalize_advantages",
        "max_grad_norm"})
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.actor_critic.a2c:A2CLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    unroll: int = ranged(5, ge=1)  # steps per unroll
    batch_size: int = ranged(32, ge=1)  # env columns (unrolls) per update
    lr: float = ranged(7e-4, gt=0)
    discount: float = ranged(0.99, ge=0, le=1)
    baseline_cost: float = ranged(0.5, ge=0)
    entropy_cost: float = ranged(0.01, ge=0)
    max_grad_norm: float = ranged(0.5, gt=0)
    adam_eps: float = ranged(1e-5, gt=0)
    normalize_advantages: bool = False


@dataclass
class PPOConfig(AlgoConfig):
    """Hyperparameters of the PPO learner (the topology's ``algo`` section). Defaults are
    CleanRL's ``ppo_continuous_action.py`` (MuJoCo)."""

    kind: str = "ppo"
    live_fields: ClassVar[frozenset[str]] = frozenset({
        "lr", "discount", "gae_lambda", "reward_scale", "clip", "clip_value",
        "value_cost", "entropy_cost", "normalize_advantages", "epochs", "minibatches",
        "max_grad_norm"})
    family: ClassVar[str] = UNROLL
    learner: ClassVar[str] = "zmqrl.parts.actor_critic.ppo:PPOLearner"
    behaviour: ClassVar[str] = "actor_critic"
    gradient_behaviour: ClassVar[str | None] = "a3c_gradients"
    model_interface: ClassVar[str | None] = "actor_critic"
    data_parallel: ClassVar[bool] = True
    unroll: int = ranged(128, ge=1)  # steps per unroll (T); the broker assembles unrolls this long
    # Env columns per update, summed over all learner ranks (each rank takes its share:
    # batch_size / ranks columns, the same on every rank).
    batch_size: int = ranged(16, ge=1)
    lr: float = ranged(3e-4, gt=0)  # Adam step size (the start value when annealed)
    anneal_lr: bool = False  # decay lr linearly to 0 ...
    anneal_updates: int = ranged(0, ge=0)  # ... over this many updates (required with anneal_lr)
    discount: float = ranged(0.99, ge=0, le=1)  # gamma
    # GAE lambda (1: Monte Carlo returns, 0: one-step TD)
    gae_lambda: float = ranged(0.95, ge=0, le=1)
    epochs: int = ranged(10, ge=1)  # passes over each batch
    # Minibatches per pass, over the rank's T x B local samples; with a recurrent model
    # (lstm_ac), over its B local env columns, each a whole sequence (recurrent_ppo.py).
    minibatches: int = ranged(32, ge=1)
    clip: float = ranged(0.2, gt=0)  # surrogate clip: ratio kept within [1 - clip, 1 + clip]
    clip_value: bool = True  # clip the value change around the old value by `clip` too
    value_cost: float = ranged(0.5, ge=0)  # weight of the value loss (0.5 * squared error)
    entropy_cost: float = ranged(0.0, ge=0)  # weight of the entropy bonus
    # global gradient-norm clip (after averaging across ranks)
    max_grad_norm: float = ranged(0.5, gt=0)
    normalize_advantages: bool = True  # per minibatch, as CleanRL
    adam_eps: float = ranged(1e-5, gt=0)
    # Rewards are multiplied by this before GAE (values learn the scaled return).
    reward_scale: float = ranged(1.0, gt=0)
    # zmqrl.parts.algos.optim.LightAdam instead of torch.optim.Adam: same update, ~1 s less
    # learner start-up.
    light_adam: bool = False
