"""The registry of algorithms and what their learners share (no sockets).

An algorithm is its config dataclass (torch-free, registered in the ``zmqrl.algos``
entry-point group or named by import path) and the learner class that config names
(``Config.learner``); :func:`make_algo` builds the learner object from a parsed config.
What a learner class must provide is :class:`zmqrl.run.contracts.Learner`. ``ALGOS`` is a
read-only view of the registered ones.

Each algorithm family sits in its own folder, laid out as a plug-in is
(``zmqrl.parts.dqn``, ``.r2d2``, ``.actor_critic``, ``.alphazero``, ``.continuous``,
``.muzero``: config, models, acting, learner). This package holds the pieces several
families' learners share: the gradient step (:mod:`.gradients`), optimizers and
schedules (:mod:`.optim`) and the target-network base of the Q-learners
(:mod:`.target_q`: DQN, R2D2, TD3 and SAC).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from zmqrl import plugins
from zmqrl.parts import algo_config
from zmqrl.parts.algo_config import AlgoConfig, learner_type


class _Registered(Mapping[str, tuple[type, type]]):
    """Registered ``algo.kind`` -> (config dataclass, learner class)."""

    def __getitem__(self, kind: str) -> tuple[type, type]:
        cfg = algo_config.CONFIGS[kind]
        return cfg, learner_type(cfg)

    def __iter__(self) -> Iterator[str]:
        return iter(plugins.names("algo"))

    def __len__(self) -> int:
        return len(plugins.names("algo"))


ALGOS: Mapping[str, tuple[type, type]] = _Registered()


# The registered algorithms that train on unrolls (read once, at import).
UNROLL_ALGOS = frozenset(k for k, c in algo_config.CONFIGS.items()
                         if c.items == algo_config.UNROLLS)


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
    return learner_type(cfg)(cfg, model, **extra)
