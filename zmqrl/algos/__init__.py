"""Pure loss functions over tensors, and the learners built from them: no sockets.

``ALGOS`` maps a topology's ``algo.kind`` to (config dataclass, learner class). The
configs themselves live in :mod:`zmqrl.algo_config` (torch-free, defaults in one place);
``make_algo`` builds the learner object from a parsed config.
"""

from __future__ import annotations

from typing import Any

import torch

from zmqrl import algo_config
from zmqrl.algo_config import REPLAY, SEQUENCE, UNROLL, AlgoConfig
from zmqrl.algos.a2c import A2CConfig, A2CLearner
from zmqrl.algos.alphazero import AlphaZeroConfig, AlphaZeroLearner
from zmqrl.algos.dqn import DQNConfig, DQNLearner
from zmqrl.algos.ppo import PPOConfig, PPOLearner
from zmqrl.algos.r2d2 import R2D2Config, R2D2Learner
from zmqrl.algos.vtrace import VTraceConfig, VTraceLearner

ALGOS: dict[str, tuple[type, type]] = {
    "vtrace": (VTraceConfig, VTraceLearner),
    "a2c": (A2CConfig, A2CLearner),
    "dqn": (DQNConfig, DQNLearner),
    "r2d2": (R2D2Config, R2D2Learner),
    "ppo": (PPOConfig, PPOLearner),
    "alphazero": (AlphaZeroConfig, AlphaZeroLearner),
}
# The kinds of each family (``AlgoConfig.family``): unrolls of the current policy
# (actor-critic) versus replayed items (Q-learning); sequence algorithms are the replay
# algorithms whose items are sequences with a stored recurrent state (R2D2).
UNROLL_ALGOS = frozenset(k for k, (c, _) in ALGOS.items() if c.family == UNROLL)
REPLAY_ALGOS = frozenset(k for k, (c, _) in ALGOS.items() if c.family in (REPLAY, SEQUENCE))
SEQUENCE_ALGOS = frozenset(k for k, (c, _) in ALGOS.items() if c.family == SEQUENCE)


def make_algo_config(algo_cfg: dict[str, Any] | AlgoConfig) -> AlgoConfig:
    """The typed config of ``algo_cfg`` (a raw ``algo`` section, or a parsed one)."""
    if not isinstance(algo_cfg, dict):
        return algo_cfg
    return algo_config.parse(algo_cfg)


def make_algo(algo_cfg: dict[str, Any] | AlgoConfig, model: torch.nn.Module,
              **extra: Any) -> Any:
    """The learner object for ``algo_cfg``; ``extra`` goes to learners that take it
    (``allreduce`` for data-parallel PPO)."""
    cfg = make_algo_config(algo_cfg)
    return ALGOS[cfg.kind][1](cfg, model, **extra)
