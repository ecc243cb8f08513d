"""PBT perturbs within bounds (issue 29, defect 8): ``type(v)(v * factor)`` turned int 1
x 0.8 into 0 (``minibatches = 0`` crashes the next update) and pushed ``discount`` above
1. A perturbed value stays inside its distribution (clipped, or the neighbouring choice),
an int stays >= 1, and the result passes the algorithm config's own checks; `validate`
refuses a population hyperparameter the algorithm cannot take."""

from __future__ import annotations

import random

import pytest

from zmqrl.parts import algo_config
from zmqrl.parts.actor_critic.config import VTraceConfig
from zmqrl.run import population
from zmqrl.run.population import Member, Settings, decide, sample_all
from zmqrl.run.topology import TopologyError, load

from conftest import REPO

PBT_SEED = REPO / "topologies" / "pbt_seed.yaml"
HYPER = {"lr": {"loguniform": [1e-4, 1e-2]},
         "discount": {"uniform": [0.95, 1.0]},
         "minibatches": {"choice": [1, 2, 4]},
         "epochs": {"choice": [1, 2]}}
ALGO = {"kind": "vtrace", "batch_size": 32, "unroll": 16, "light_adam": True}


def _exploits(settings: Settings, count: int = 200) -> list[dict]:
    """``count`` exploits from a seeded RNG: member 0 (the worst) copies one of the
    others, whose hyperparameters were drawn from the section (as `expand` draws them)."""
    rng = random.Random(0)
    out = []
    while len(out) < count:
        members = {i: Member(steps=100, mean_return=float(10 * i), checkpointed=True,
                             hyperparameters=sample_all(settings, rng)) for i in range(4)}
        decision = decide(0, members, settings, rng)
        assert decision is not None
        out.append(decision.hyperparameters)
    return out


def test_perturbed_values_stay_within_their_distribution_and_ints_at_least_one():
    """Without the algo known (a Settings built by hand), the distribution bounds it:
    before the fix 200 exploits gave minibatches/epochs 0 and discounts above 1."""
    settings = Settings(size=4, hyperparameters=HYPER, truncation=0.25,
                        resample_probability=0.25)
    results = _exploits(settings)
    below_one = [h for h in results if h["minibatches"] < 1 or h["epochs"] < 1]
    above_one = [h for h in results if h["discount"] > 1.0]
    assert (len(below_one), len(above_one)) == (0, 0)
    assert all(h["minibatches"] in (1, 2, 4) and h["epochs"] in (1, 2) for h in results)
    assert all(1e-4 <= h["lr"] <= 1e-2 and isinstance(h["minibatches"], int)
               for h in results)
    # and they still move: both directions of the factor show up
    assert len({h["minibatches"] for h in results}) == 3


def test_every_exploit_passes_the_algorithm_config_checks():
    settings = Settings(size=4, hyperparameters=HYPER, truncation=0.25,
                        resample_probability=0.25, algo=ALGO)
    for hyper in _exploits(settings):
        assert algo_config.errors({**ALGO, **hyper}) == [], hyper
        VTraceConfig(**ALGO, **hyper)  # builds: __post_init__ holds it to its ranges


def test_a_value_outside_the_distribution_is_clipped_to_the_field_range():
    """A donor whose value is not one the section draws (an int with no distribution, a
    discount at the field's bound) is still kept in the algo field's range."""
    settings = Settings(size=2, hyperparameters={"lr": {"choice": [1e-3]}},
                        resample_probability=0.0, perturb=(0.5, 1.5), algo=ALGO)
    rng = random.Random(1)
    for _ in range(50):
        members = {0: Member(mean_return=0.0, checkpointed=True),
                   1: Member(mean_return=1.0, checkpointed=True,
                             hyperparameters={"lr": 1e-3, "discount": 1.0,
                                              "minibatches": 1, "clip_rho": None})}
        hyper = decide(0, members, settings, rng).hyperparameters
        assert 0.0 <= hyper["discount"] <= 1.0 and hyper["minibatches"] >= 1
        assert hyper["clip_rho"] is None
        VTraceConfig(**ALGO, **hyper)


def test_perturb_steps_ints_and_choices():
    perturb = population.perturb
    assert perturb(1, 0.8, None) == 1  # was 0
    assert perturb(2, 1.2, None) == 3  # 2.4 rounds to 2: an int moves by one at least
    assert perturb(4, 1.2, None) == 5 and perturb(4, 0.8, None) == 3
    assert perturb(10, 0.8, None) == 8 and isinstance(perturb(10, 0.8, None), int)
    assert perturb(2, 1.2, {"choice": [1, 2, 4]}) == 4
    assert perturb(2, 0.8, {"choice": [1, 2, 4]}) == 1
    assert perturb(4, 1.2, {"choice": [1, 2, 4]}) == 4  # at the end it stays
    assert perturb(0.99, 1.2, {"uniform": [0.9, 1.0]}) == 1.0
    assert perturb(1e-4, 0.8, {"loguniform": [1e-4, 1e-2]}) == 1e-4
    assert perturb(0.5, 1.2, None) == pytest.approx(0.6)


@pytest.mark.parametrize("hyper, says", [
    ({"bogus": {"uniform": [0.0, 1.0]}}, "VTraceConfig has no field 'bogus'"),
    ({"discount": {"uniform": [0.9, 1.5]}}, "reaches outside algo.discount's range: 1.5: "
                                            "must be in [0, 1]"),
    ({"minibatches": {"choice": [0, 2]}}, "0: must be >= 1"),
    ({"minibatches": {"uniform": [1, 8]}}, "algo.minibatches is int: give its values as "
                                           "choice"),
    ({"minibatches": {"choice": [1.5]}}, "1.5 is not int"),
    ({"lr": {"loguniform": [0.0, 1e-3]}}, "both ends must be > 0"),
    ({"entropy_cost": {"uniform": [1e-2, 1e-3]}}, "the low end is above the high end"),
])
def test_validate_refuses_a_hyperparameter_the_algorithm_cannot_take(hyper, says):
    with pytest.raises(TopologyError) as caught:
        load(PBT_SEED, {"population": {"hyperparameters": hyper}})
    assert says in str(caught.value), str(caught.value)
    assert f"population: hyperparameters.{next(iter(hyper))}" in str(caught.value)


def test_validate_accepts_hyperparameters_within_range():
    topo = load(PBT_SEED, {"population": {"hyperparameters": {
        "minibatches": {"choice": [1, 2, 4]}, "discount": {"uniform": [0.9, 1.0]},
        "clip_rho": {"choice": [None, 1.0]}}}})
    assert topo.nodes["learner_m0"].args["hyperparameters"]["minibatches"] in (1, 2, 4)
