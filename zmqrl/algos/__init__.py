"""Pure loss functions over tensors, and the learners built from them: no sockets.

``ALGOS`` maps a topology's ``algo.kind`` to (config dataclass, learner class).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from zmqrl.algos.a2c import A2CConfig, A2CLearner
from zmqrl.algos.dqn import DQNConfig, DQNLearner
from zmqrl.algos.vtrace import VTraceConfig, VTraceLearner

ALGOS: dict[str, tuple[type, type]] = {
    "vtrace": (VTraceConfig, VTraceLearner),
    "a2c": (A2CConfig, A2CLearner),
    "dqn": (DQNConfig, DQNLearner),
}
# Algorithms that learn from unrolls of the current policy (actor-critic family) versus
# from replayed transitions (Q-learning family): this decides a learner's data path
# and an actor's local behaviour.
UNROLL_ALGOS = frozenset({"vtrace", "a2c"})
REPLAY_ALGOS = frozenset({"dqn"})


def make_algo(algo_cfg: dict[str, Any], model: torch.nn.Module) -> Any:
    kind = algo_cfg.get("kind", "vtrace")
    if kind not in ALGOS:
        raise ValueError(f"algo.kind: unknown algorithm '{kind}' (known: {', '.join(ALGOS)})")
    config_type, learner_type = ALGOS[kind]
    known = {f.name for f in dataclasses.fields(config_type)}
    return learner_type(config_type(**{k: v for k, v in algo_cfg.items() if k in known}), model)
