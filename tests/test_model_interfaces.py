"""The model interfaces' contracts (zmqrl.parts.models.interfaces): every built-in model
kind passes ``check_model`` for the interface it declares, on each small env it can be
built for, and a broken model gets a problem naming the method."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import pytest
import torch
from torch import nn

from zmqrl import plugins
from zmqrl.parts.actor_critic.models import ActorCritic
from zmqrl.parts.dqn.models import DuelingQNetwork
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import model_interface, model_type
from zmqrl.parts.models.interfaces import PROTOCOLS, check_model

torch.set_num_threads(1)

F32, U8, I64 = np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int64)
SPECS = {
    "discrete": EnvSpec((4,), F32, (), I64, 2),
    "box": EnvSpec((3,), F32, (2,), F32, None, np.array([-1.0, 0.0], np.float32),
                   np.array([1.0, 2.0], np.float32)),
    "minatar": EnvSpec((4, 10, 10), U8, (), I64, 3),  # MinAtar-like frames
    "board": EnvSpec((3, 3, 3), F32, (), I64, 9),  # tic-tac-toe planes
}

# Tiny options per kind (a kind not listed is built with its defaults).
_NATURE = {"convs": [[4, 3, 2]], "hidden": 8}
_IMPALA = {"channels": [4], "blocks": 1, "hidden": 8}
SMALL = {
    "mlp": {"hidden": [8]}, "dueling_mlp": {"hidden": [8]}, "board_mlp": {"hidden": [8]},
    "lstm_q": {"hidden": [8], "lstm": 8}, "lstm_ac": {"hidden": [8], "lstm": 8},
    "pv_mlp": {"hidden": [8]}, "pv_conv": {"channels": 4, "blocks": 1, "hidden": 8},
    "nature_cnn": _NATURE, "dueling_nature_cnn": _NATURE,
    "nature_cnn_lstm": {**_NATURE, "lstm": 8}, "nature_cnn_lstm_q": {**_NATURE, "lstm": 8},
    "impala_cnn": _IMPALA, "dueling_impala_cnn": _IMPALA,
    "impala_cnn_lstm": {**_IMPALA, "lstm": 8}, "impala_cnn_lstm_q": {**_IMPALA, "lstm": 8},
    "td3_mlp": {"hidden": [8]}, "sac_mlp": {"hidden": [8]},
    "muzero_mlp": {"latent_size": 4, "hidden": 8, "support_size": 2},
    "muzero_conv": {"channels": 4, "latent_size": 4, "hidden": 8, "support_size": 2},
}

# zmqrl's own kinds (an installed plug-in's are its own business)
BUILT_IN = [name for name in plugins.names("model")
            if plugins.import_path("model", name).startswith("zmqrl.")]


def test_every_interface_an_algorithm_needs_has_a_protocol():
    for name in plugins.names("algo"):
        need = getattr(plugins.resolve("algo", name), "model_interface", None)
        if need is not None and plugins.import_path("algo", name).startswith("zmqrl."):
            assert need in PROTOCOLS, name


@pytest.mark.parametrize("kind", BUILT_IN)
def test_built_in_kind_meets_its_interface(kind):
    make = model_type(kind)
    interface = model_interface(make)
    assert interface in PROTOCOLS, f"{kind} declares {interface!r}"
    checked, refused = [], {}
    for spec_name, spec in SPECS.items():
        torch.manual_seed(0)
        try:
            model = make(spec, **SMALL.get(kind, {}))
        except ValueError as exc:  # this env does not fit the kind
            refused[spec_name] = str(exc)
            continue
        assert check_model(interface, model, spec) == [], (kind, spec_name)
        checked.append(spec_name)
    if not checked:
        pytest.skip(f"{kind} builds for none of the test specs: {refused}")


# ------------------------------------------------------------------ broken models

def _q_problems(model: nn.Module) -> list[str]:
    return check_model("q", model, SPECS["discrete"])


class NoQValues(nn.Module):
    interface = "q"

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, obs):
        return self.net(obs)


class WrongShapeQ(NoQValues):
    def q_values(self, obs):
        return self(obs)[:, :1]  # [B, 1], not [B, A]


def test_missing_method_is_named():
    problems = _q_problems(NoQValues())
    assert len(problems) == 1 and "NoQValues.q_values" in problems[0], problems
    assert "missing" in problems[0]


def test_wrong_shape_is_named():
    problems = _q_problems(WrongShapeQ())
    assert len(problems) == 1, problems
    assert "WrongShapeQ.q_values" in problems[0] and "[3, 2]" in problems[0], problems
    assert "[3, 1]" in problems[0]


def test_a_raising_method_and_a_data_attribute_are_named():
    class Raises(WrongShapeQ):
        def q_values(self, obs):
            raise RuntimeError("boom")

    assert any("Raises.q_values: raised RuntimeError" in p for p in _q_problems(Raises()))
    model = NoQValues()
    model.q_values = 3  # present, not a method
    assert any("q_values: expected a method" in p for p in _q_problems(model))


def test_wrong_interface_is_caught():
    # a Q-network offered as an actor-critic lacks act/evaluate/state_values
    model = DuelingQNetwork(SPECS["discrete"], hidden=[8])
    problems = check_model("actor_critic", model, SPECS["discrete"])
    assert {p.split(":")[0] for p in problems} == {
        "DuelingQNetwork.act", "DuelingQNetwork.evaluate", "DuelingQNetwork.state_values"}


def test_wrong_tuple_is_named():
    class OneValue(ActorCritic):
        def state_values(self, obs):
            return super().state_values(obs).unsqueeze(-1)  # [B, 1], not [B]

    problems = check_model("actor_critic", OneValue(SPECS["box"], hidden=[8]), SPECS["box"])
    assert len(problems) == 1 and problems[0].startswith("OneValue.state_values"), problems


# ------------------------------------------------------------ a plug-in's interface

@runtime_checkable
class Scorer(Protocol):
    def score(self, obs: torch.Tensor) -> torch.Tensor: ...


class PluginModel(nn.Module):
    interface = "scorer"  # not zmqrl's
    interface_protocol = Scorer

    def score(self, obs):
        return obs.sum(-1)


def test_plugin_interface_protocol():
    assert check_model("scorer", PluginModel(), SPECS["discrete"]) == []

    class Lacks(nn.Module):
        interface = "scorer"
        interface_protocol = Scorer

    problems = check_model("scorer", Lacks(), SPECS["discrete"])
    assert len(problems) == 1 and "Lacks.score" in problems[0], problems


def test_unknown_interface_without_protocol_has_nothing_to_check():
    assert check_model("something_else", nn.Linear(2, 2), SPECS["discrete"]) == []
