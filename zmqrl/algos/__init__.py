"""Pure loss functions over tensors, and the learners built from them: no sockets.

``ALGOS`` maps a topology's ``algo.kind`` to (config dataclass, learner class).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from zmqrl.algos.a2c import A2CConfig, A2CLearner
from zmqrl.algos.dqn import DQNConfig, DQNLearner
from zmqrl.algos.ppo import PPOConfig, PPOLearner
from zmqrl.algos.r2d2 import R2D2Config, R2D2Learner
from zmqrl.algos.vtrace import VTraceConfig, VTraceLearner

ALGOS: dict[str, tuple[type, type]] = {
    "vtrace": (VTraceConfig, VTraceLearner),
    "a2c": (A2CConfig, A2CLearner),
    "dqn": (DQNConfig, DQNLearner),
}
ALGOS["r2d2"] = (R2D2Config, R2D2Learner)
ALGOS["ppo"] = (PPOConfig, PPOLearner)
# Algorithms that learn from unrolls of the current policy (actor-critic family) versus
# from replayed transitions (Q-learning family): this decides a learner's data path
# and an actor's local behaviour. Sequence algorithms are the replay algorithms whose
# items are fixed-length sequences with a stored recurrent state (R2D2).
UNROLL_ALGOS = frozenset({"vtrace", "a2c", "ppo"})
REPLAY_ALGOS = frozenset({"dqn", "r2d2"})
SEQUENCE_ALGOS = frozenset({"r2d2"})


def make_algo_config(algo_cfg: dict[str, Any]) -> Any:
    """The config dataclass of ``algo_cfg`` (for nodes that act by it, not learn)."""
    config_type = ALGOS[algo_cfg.get("kind", "vtrace")][0]
    known = {f.name for f in dataclasses.fields(config_type)}
    return config_type(**{k: v for k, v in algo_cfg.items() if k in known})


def make_algo(algo_cfg: dict[str, Any], model: torch.nn.Module, **extra: Any) -> Any:
    """The learner object for ``algo_cfg``; ``extra`` goes to learners that take it
    (``allreduce`` for data-parallel PPO)."""
    kind = algo_cfg.get("kind", "vtrace")
    if kind not in ALGOS:
        raise ValueError(f"algo.kind: unknown algorithm '{kind}' (known: {', '.join(ALGOS)})")
    return ALGOS[kind][1](make_algo_config(algo_cfg), model, **extra)
