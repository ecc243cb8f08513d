"""Torch networks. ``build_model`` turns a topology's ``model`` section into a module.

``MODEL_KINDS`` maps ``model.kind`` to a class (or a class with its torso chosen)
taking (EnvSpec, model config); the networks live in one module per family
(feed-forward, recurrent, conv).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from zmqrl.devices import pick_device  # noqa: F401 (re-exported: nodes import it here)
from zmqrl.envs import EnvSpec
from zmqrl.models.board import BoardActorCritic
from zmqrl.models.conv import (
    ConvActorCritic,
    ConvDuelingQNetwork,
    ConvLSTMActorCritic,
    ConvLSTMQNetwork,
)
from zmqrl.models.feedforward import ActorCritic, DuelingQNetwork
from zmqrl.models.policy_value import PolicyValueConv, PolicyValueMLP
from zmqrl.models.recurrent import RecurrentActorCritic, RecurrentQNetwork

MODEL_KINDS: dict[str, Callable[..., nn.Module]] = {
    "mlp": ActorCritic, "dueling_mlp": DuelingQNetwork}
MODEL_KINDS["lstm_q"] = RecurrentQNetwork
MODEL_KINDS["lstm_ac"] = RecurrentActorCritic
MODEL_KINDS.update(pv_mlp=PolicyValueMLP, pv_conv=PolicyValueConv)  # search (AlphaZero)
MODEL_KINDS["board_mlp"] = BoardActorCritic  # games: illegal moves masked


def _on_torso(cls: Callable[..., nn.Module], torso: str) -> Callable[..., nn.Module]:
    """``cls`` with its torso fixed by the kind's name (not an option of the YAML)."""
    def make(spec: EnvSpec, **options: Any) -> nn.Module:
        if "torso" in options:
            raise ValueError("the torso is part of the kind (nature_cnn, impala_cnn, ...); "
                             "drop the option 'torso'")
        return cls(spec, torso=torso, **options)
    return make


# Pixels (zmqrl.models.conv): each head on the Nature and the IMPALA torso.
for _torso in ("nature", "impala"):
    MODEL_KINDS[f"{_torso}_cnn"] = _on_torso(ConvActorCritic, _torso)
    MODEL_KINDS[f"{_torso}_cnn_lstm"] = _on_torso(ConvLSTMActorCritic, _torso)
    MODEL_KINDS[f"dueling_{_torso}_cnn"] = _on_torso(ConvDuelingQNetwork, _torso)
    MODEL_KINDS[f"{_torso}_cnn_lstm_q"] = _on_torso(ConvLSTMQNetwork, _torso)

# The algorithms each model can serve (checked by ``zmqrl validate``): actor-critic
# heads for the unroll algorithms, Q heads for the replay ones (PPO with a recurrent
# policy takes minibatches of whole sequences: zmqrl.algos.recurrent_ppo).
MODEL_ALGOS: dict[str, frozenset[str]] = {
    "mlp": frozenset({"vtrace", "a2c", "ppo"}),
    "lstm_ac": frozenset({"vtrace", "a2c", "ppo"}),
    "board_mlp": frozenset({"vtrace", "a2c", "ppo"}),
    "dueling_mlp": frozenset({"dqn"}),
    "lstm_q": frozenset({"r2d2"}),
    "pv_mlp": frozenset({"alphazero"}), "pv_conv": frozenset({"alphazero"}),
}
for _torso in ("nature", "impala"):
    MODEL_ALGOS[f"{_torso}_cnn"] = MODEL_ALGOS["mlp"]
    MODEL_ALGOS[f"{_torso}_cnn_lstm"] = MODEL_ALGOS["lstm_ac"]
    MODEL_ALGOS[f"dueling_{_torso}_cnn"] = MODEL_ALGOS["dueling_mlp"]
    MODEL_ALGOS[f"{_torso}_cnn_lstm_q"] = MODEL_ALGOS["lstm_q"]


def bootstrap_truncated(reward: np.ndarray, truncated: np.ndarray, final_obs: np.ndarray,
                        model: nn.Module, discount: float, reward_scale: float = 1.0
                        ) -> np.ndarray:
    """Rewards with ``discount * V(final_obs)`` added where an episode was cut by a time
    limit rather than ended (SB3 does the same). The episode end still cuts the trace
    (done stays true), so the learner needs no special case; ``final_obs`` holds the
    final observations of the truncated envs, in order. V predicts returns in the
    learner's scaled units, so it is divided by ``reward_scale`` here."""
    if not truncated.any():
        return reward
    device = next(model.parameters()).device
    values = model.state_values(torch.from_numpy(np.array(final_obs)).to(device))
    out = np.array(reward, np.float32)
    out[truncated] += discount * values.float().cpu().numpy() / reward_scale
    return out


def build_model(model_cfg: dict[str, Any], spec: EnvSpec, seed: int = 0) -> nn.Module:
    kind = model_cfg.get("kind", "mlp")
    if kind not in MODEL_KINDS:
        raise ValueError(f"model.kind: unknown model '{kind}' (known: {', '.join(MODEL_KINDS)})")
    options = {k: v for k, v in model_cfg.items() if k != "kind"}
    torch.manual_seed(seed)  # every process builds the same initial parameters
    try:
        return MODEL_KINDS[kind](spec, **options)
    except TypeError as exc:  # an option the model does not take
        raise ValueError(f"model ({kind}): {exc}") from None




def state_arrays(model: nn.Module) -> dict:
    """Parameters as numpy arrays, ready to be message frames."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def wants_params(version: int, source: Any, held_version: int, held_source: Any) -> bool:
    """Whether a subscriber holding ``held_version`` from publisher ``held_source``
    should load ``params`` of ``version`` from ``source`` (an incarnation id): newer ones
    always; older ones when they come from another publisher, which means the publisher
    restarted from a checkpoint behind what we hold, and its line is the one that
    continues. (Equal versions from another publisher are the data-parallel replicas'
    identical copies: nothing to load.)"""
    if version > held_version:
        return True
    return source is not None and source != held_source and version < held_version


def load_state_arrays(model: nn.Module, arrays: dict) -> None:
    state = {k: torch.tensor(v) for k, v in arrays.items()}  # frames are read-only: copy
    model.load_state_dict(state, strict=True)


