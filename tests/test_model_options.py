"""A model callable that takes ``algo`` is given the run's algorithm config, so a
hyperparameter both need (QR-DQN's quantiles) is stated once, in ``algo:``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import build_model
from zmqrl.run.topology import from_dict

SPEC = EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int64), 2)


class ReadsTheAlgorithm(nn.Module):
    interface = "q"

    def __init__(self, spec: EnvSpec, hidden: int = 8, algo=None):
        super().__init__()
        self.n_step = algo.n_step  # a value the learner reads too
        self.net = nn.Linear(spec.obs_shape[0], spec.num_actions * self.n_step)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)[:, :2]  # [B, A], as the q interface promises

    @torch.inference_mode()
    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.forward(obs)


def test_a_model_that_takes_algo_gets_the_runs_config():
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        topo = from_dict({"name": "t", "env": {"id": "CartPole-v1"},
                          "model": {"kind": "test_model_options:ReadsTheAlgorithm",
                                    "hidden": 4},
                          "algo": {"kind": "dqn", "n_step": 5},
                          "nodes": {"replay": {"kind": "replay"},
                                    "learner": {"kind": "learner",
                                                "links": {"replay": "replay.sample"}}}})
        model = build_model(topo.model, SPEC, algo=topo.algo_config)
        assert model.n_step == 5 and model.net.out_features == 10
        # a model that does not take it is built as before
        plain = build_model({"kind": "mlp", "hidden": [8]}, SPEC, algo=topo.algo_config)
        assert isinstance(plain, nn.Module)
    finally:
        sys.path.remove(str(Path(__file__).parent))
