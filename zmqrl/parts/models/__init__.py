"""Torch networks. ``build_model`` turns a topology's ``model`` section into a module.

``model.kind`` is a part like any other (:mod:`zmqrl.plugins`): a short name registered
in the ``zmqrl.models`` entry-point group (zmqrl's own are in its pyproject.toml) or an
import path ``module:Name``. Either names a callable taking (EnvSpec, **options) — a
class or a factory — whose ``interface`` attribute says what the network provides
(``actor_critic``, ``q``, ``recurrent_q``, ``policy_value``, or a plug-in's own): an
algorithm's config names the interface its learner needs (``model_interface``), and
``zmqrl validate`` checks that the two agree. Each algorithm family's networks live in
its own folder (``zmqrl.parts.dqn.models``, ``zmqrl.parts.actor_critic.models``, ...),
registered as a plug-in's are; this package holds what they share: the MLP helpers
(:mod:`.feedforward`), the LSTM core (:mod:`.recurrent`), the pixel torsos
(:mod:`.conv`), observation normalization and the interfaces' contracts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from zmqrl import plugins
from zmqrl.parts.devices import pick_device  # noqa: F401 (re-exported: nodes import it here)
from zmqrl.parts.envs import EnvSpec

DEFAULT_MODEL = "mlp"


class _Serves(Mapping[str, frozenset[str]]):
    """Registered model kind -> the registered algorithms it can serve (their config's
    ``model_interface`` is the model's ``interface``)."""

    def __getitem__(self, kind: str) -> frozenset[str]:
        interface = model_interface(MODEL_KINDS[kind])
        return frozenset(name for name in plugins.names("algo")
                         if getattr(plugins.resolve("algo", name), "model_interface", None)
                         == interface)

    def __iter__(self) -> Iterator[str]:
        return iter(MODEL_KINDS)

    def __len__(self) -> int:
        return len(MODEL_KINDS)


MODEL_KINDS: Mapping[str, Callable[..., nn.Module]] = plugins.Registered("model")
MODEL_ALGOS: Mapping[str, frozenset[str]] = _Serves()


def model_type(kind: str, import_paths: tuple[str, ...] | list[str] = ()
               ) -> Callable[..., nn.Module]:
    """The callable ``model.kind`` names (ValueError naming the known kinds)."""
    try:
        return plugins.resolve("model", kind, import_paths)
    except plugins.PluginError as exc:
        raise ValueError(f"model.kind: {exc}") from None


def _takes_algo(make: Any) -> bool:
    try:
        return "algo" in inspect.signature(make).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def model_interface(make: Any) -> str | None:
    """What a model kind provides (its ``interface``), or None if it does not say."""
    return getattr(make, "interface", None)


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


def build_model(model_cfg: dict[str, Any], spec: EnvSpec, seed: int = 0,
                import_paths: tuple[str, ...] | list[str] = (), algo: Any = None
                ) -> nn.Module:
    """The topology's model for ``spec``. A model whose callable takes an ``algo``
    parameter gets the run's algorithm config there: a hyperparameter both need (QR-DQN's
    number of quantiles, a distributional support) is stated once, in ``algo:``, and
    read by both."""
    kind = model_cfg.get("kind", DEFAULT_MODEL)
    make = model_type(kind, import_paths)
    options = {k: v for k, v in model_cfg.items() if k != "kind"}
    if algo is not None and "algo" not in options and _takes_algo(make):
        options["algo"] = algo
    torch.manual_seed(seed)  # every process builds the same initial parameters
    try:
        return make(spec, **options)
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
    """Load published parameters into ``model``; ValueError naming the first tensor
    that is not finite (then nothing is loaded: a NaN weight would act on for good)."""
    bad = nonfinite(arrays)
    if bad:
        raise ValueError(f"tensor '{bad[0]}' is not finite ({len(bad)} such)")
    state = {k: torch.tensor(v) for k, v in arrays.items()}  # frames are read-only: copy
    model.load_state_dict(state, strict=True)


def nonfinite(state: Any) -> list[str]:
    """Names of the floating-point tensors or arrays in ``state`` (a state dict, a
    module's, or name -> numpy array) holding a NaN or inf."""
    if isinstance(state, nn.Module):
        state = state.state_dict()
    bad = []
    for name, value in state.items():
        if isinstance(value, np.ndarray):  # frames: read-only, no tensor made of them
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                bad.append(name)
        elif torch.is_tensor(value) and value.is_floating_point() and \
                not bool(torch.isfinite(value).all()):
            bad.append(name)
    return bad


