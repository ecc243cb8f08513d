"""Algorithm fields validated by range (issue 29, "tried as a new user would"): every
numeric field of every algorithm config declares its range next to its default
(zmqrl/parts/bounds.py), `zmqrl validate` names a field out of range, a config built
with one raises; `validate --set` checks what `up --set` would run; and a replay that
cannot hold one of the learner's samples is refused (issue 29, low 5)."""

from __future__ import annotations

import dataclasses
import math
import sys
import typing

import pytest
from click.testing import CliRunner

from zmqrl.cli import main
from zmqrl.parts import algo_config, bounds
from zmqrl.parts.actor_critic.config import PPOConfig, VTraceConfig
from zmqrl.parts.algo_config import CONFIGS
from zmqrl.parts.alphazero.config import AlphaZeroConfig
from zmqrl.parts.bounds import Range
from zmqrl.parts.r2d2.config import R2D2Config
from zmqrl.run.topology import TopologyError, load

from conftest import REPO

SEED = str(REPO / "topologies" / "seed.yaml")


def _numeric(hint: typing.Any) -> bool:
    args = typing.get_args(hint) or (hint,)
    return any(a in (int, float) for a in args)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_every_numeric_algo_field_declares_its_range(kind):
    cls = CONFIGS[kind]
    hints = typing.get_type_hints(cls)
    numeric = [f.name for f in dataclasses.fields(cls) if _numeric(hints[f.name])]
    assert numeric, kind
    assert [n for n in numeric if bounds.range_of(cls, n) is None] == []
    cls()  # every default lies in its own range


def test_validate_names_each_algo_field_out_of_range():
    """The issue's five values on seed.yaml, each refused with the field named (they
    all passed before; `--set` is how a user tries them without editing the file)."""
    runner = CliRunner()
    for key, value, says in [("batch_size", "0", "must be >= 1"),
                             ("unroll", "0", "must be >= 1"),
                             ("discount", "1.5", "must be in [0, 1]"),
                             ("lr", "-1.0", "must be > 0"),
                             ("entropy_cost", "-1.0", "must be >= 0")]:
        result = runner.invoke(main, ["validate", SEED, "--set", f"algo.{key}={value}"])
        assert result.exit_code == 1, (key, result.output)
        assert f"field 'algo.{key}': {float(value) if '.' in value else int(value)!r}: " \
               f"{says}" in result.output, result.output
    ok = runner.invoke(main, ["validate", SEED, "--set", "algo.lr=1e-3",
                              "--set", "algo.clip_rho=null"])
    assert ok.exit_code == 0, ok.output


def test_validate_takes_set_like_up():
    runner = CliRunner()
    bad = runner.invoke(main, ["validate", SEED, "--set", "nodes.actor.args.envs=0"])
    assert bad.exit_code == 1 and "envs" in bad.output and "must be >= 1" in bad.output
    both = runner.invoke(main, ["validate", SEED, SEED, "--set", "algo.epochs=0"])
    assert both.exit_code == 1 and both.output.count("field 'algo.epochs'") == 2
    malformed = runner.invoke(main, ["validate", SEED, "--set", "algo.lr"])
    assert malformed.exit_code == 2 and "KEY=VALUE" in malformed.output


def test_a_config_built_with_a_value_out_of_range_raises():
    for cls, bad in [(VTraceConfig, {"discount": 1.5}), (PPOConfig, {"minibatches": 0}),
                     (AlphaZeroConfig, {"full_search_fraction": 0.0}),
                     (VTraceConfig, {"lr": math.nan}), (VTraceConfig, {"max_grad_norm": math.inf}),
                     (R2D2Config, {"eta": 2.0})]:
        (name, _), = bad.items()
        with pytest.raises(ValueError, match=f"algo.{name}:"):
            cls(**bad)
    VTraceConfig(clip_rho=None, ppo_clip=0.2)  # nullable fields take None
    # PBT applies hyperparameters with dataclasses.replace: held to the ranges too
    with pytest.raises(ValueError, match="algo.minibatches"):
        dataclasses.replace(PPOConfig(), minibatches=0)


def test_cross_field_checks_stay_with_their_configs():
    assert [k for k, _ in algo_config.errors({"kind": "r2d2", "sequence_length": 8})] == \
        ["burn_in", "overlap"]
    assert algo_config.errors({"kind": "r2d2", "burn_in": -1}) == \
        [("burn_in", "-1: must be >= 0")]
    fast = {"kind": "alphazero", "full_search_fraction": 0.5, "fast_simulations": 60}
    assert [k for k, _ in algo_config.errors(fast)] == ["fast_simulations"]
    assert algo_config.errors({**fast, "full_search_fraction": 1.0}) == []
    # wrong types are the type check's, reported once
    assert algo_config.errors({"kind": "r2d2", "burn_in": "ten"}) == \
        [("burn_in", "'ten' is not int")]


def test_a_range_says_what_it_is_and_clips_into_itself():
    assert str(Range(ge=0, le=1)) == "must be in [0, 1]"
    assert str(Range(gt=0, le=1)) == "must be in (0, 1]"
    assert str(Range(gt=0, why="it divides")) == "must be > 0 (it divides)"
    assert Range(ge=1).check(0) == "0: must be >= 1"
    assert Range(ge=1).check(None) is None and Range(ge=1).check("x") is None
    assert Range(ge=0).check(True) is None  # a bool is no number: the type check's
    assert Range(ge=0).check(math.inf) is not None
    assert Range(ge=1).clip(0) == 1 and isinstance(Range(ge=1).clip(0), int)
    assert Range(gt=0).clip(-3) == 1
    assert 0 < Range(gt=0.0).clip(-1.0) < 1e-300
    assert Range(ge=0, le=1).clip(1.188) == 1.0
    assert Range(lt=1.0).clip(2.0) < 1.0
    with pytest.raises(ValueError, match="default"):
        bounds.ranged(0, ge=1)


def test_a_plugin_config_gets_its_ranges_checked_for_free(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples" / "plugins" / "boltzmann"))
    sys.modules.pop("zmqrl_boltzmann.config", None)
    from zmqrl_boltzmann.config import BoltzmannQConfig

    assert algo_config.config_errors(BoltzmannQConfig, {"temperature": 0.0}) == \
        [("temperature", "0.0: must be > 0 (the policy divides Q by it)")]
    found = algo_config.errors({"kind": "zmqrl_boltzmann.config:BoltzmannQConfig",
                                "discount": 1.5})
    assert found == [("discount", "1.5: must be in [0, 1]")]
    with pytest.raises(ValueError, match="algo.temperature"):
        BoltzmannQConfig(temperature=-1.0)


def test_a_replay_smaller_than_one_sample_is_refused():
    """Low 5: batch_size above the replay's capacity passed validation; the learner then
    crash-looped on 'the replay rejected our request'. Compared in items (transitions
    for apex, sequences for r2d2: the replay's unit)."""
    small = {"nodes": {"replay": {"args": {"capacity": 100, "min_size": 50}}},
             "algo": {"batch_size": 128}}
    with pytest.raises(TopologyError) as caught:
        load(REPO / "topologies" / "apex.yaml", small)
    line, = [e for e in caught.value.errors if "capacity" in e]
    assert "node 'replay', field 'args.capacity'" in line
    assert "100 items" in line and "algo.batch_size 128" in line
    # r2d2 samples batch_size sequences; a section without batch_size samples the default
    r2d2 = {"nodes": {"replay": {"args": {"capacity": 50, "min_size": 10}}}}
    with pytest.raises(TopologyError, match="50 items cannot hold one sample of "
                                            "algo.batch_size 64 items"):
        load(REPO / "topologies" / "r2d2.yaml", r2d2)
    assert algo_config.field_value({"kind": "r2d2"}, "batch_size") == 32
    assert algo_config.field_value({"kind": "nope"}, "batch_size") is None
    fits = {"nodes": {"replay": {"args": {"capacity": 128, "min_size": 64}}},
            "algo": {"batch_size": 128}}
    load(REPO / "topologies" / "apex.yaml", fits)
