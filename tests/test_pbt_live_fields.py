"""PBT hyperparameters take effect, or validation refuses them (issue 43 §2.3).

A population over TD3/SAC's ``actor_lr``, ``critic_lr``, ``alpha_lr`` validated and the
lineage recorded its changes, but the optimizer kept the rates it was built with; a
replay-fed learner's ``batch_size`` likewise (its replay client read it once). Now each
algorithm config names its ``live_fields``, the learner applies every one of them
(``apply_hyperparameters`` for an optimizer's groups, the live config for the rest), and
a population over any other field is refused when the topology loads.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import zmq

from zmqrl.bus import wire
from zmqrl.parts import algo_config
from zmqrl.parts.algos import make_algo, make_algo_config
from zmqrl.parts.envs import env_spec
from zmqrl.parts.learning.checks import context
from zmqrl.parts.learning.pbt_member import set_hyperparameters
from zmqrl.parts.learning.sources import ReplayClient
from zmqrl.parts.models import build_model
from zmqrl.run.topology import TopologyError, load

from conftest import REPO

PENDULUM = env_spec({"id": "Pendulum-v1"})


def twin_q_learner(kind: str):
    cfg = make_algo_config({"kind": kind, "batch_size": 8})
    model = build_model({"kind": "td3_mlp" if kind == "td3" else "sac_mlp", "hidden": [8]},
                        PENDULUM, algo=cfg)
    return make_algo(cfg, model)


@pytest.mark.parametrize("kind, rates", [
    ("td3", {"critic_lr": 3e-5, "actor_lr": 7e-4}),
    ("sac", {"critic_lr": 3e-5, "actor_lr": 7e-4, "alpha_lr": 2e-2}),
])
def test_each_optimizer_group_takes_its_rate(kind, rates):
    learner = twin_q_learner(kind)
    set_hyperparameters(learner, rates)
    groups = [g["lr"] for g in learner.optimizer.param_groups]
    assert groups == [rates[field] for field in learner.group_rates()]
    assert {f: getattr(learner.cfg, f) for f in rates} == rates


def test_a_replay_fed_learner_asks_for_the_batch_size_it_was_given():
    """The learner's replay client sizes each request by the algorithm's config as it
    is now: after a member's batch_size changes, the next request asks for the new one."""
    cfg = make_algo_config({"kind": "dqn", "batch_size": 32})
    model = build_model({"kind": "dueling_mlp", "hidden": [8]}, env_spec({"id": "CartPole-v1"}))
    sent: list[wire.Message] = []
    sock = zmq.Context.instance().socket(zmq.DEALER)

    class Learner:  # what ReplayClient.for_learner reads of a learner node
        sockets = {"replay": sock}
        ctx = type("Ctx", (), {"label": "learner",
                               "topo": type("Topo", (), {"parts_config": cfg})()})()
        args = type("Args", (), {"prefetch": 1})()
        log = logging.getLogger("test")
        device = torch.device("cpu")
        check = context(env_spec({"id": "CartPole-v1"}), model)
        algo = make_algo(cfg, model)

        def send(self, link: str, frames: list) -> None:
            sent.append(wire.decode(frames))

    learner = Learner()
    client = ReplayClient.for_learner(learner)
    try:
        client.poll()
        set_hyperparameters(learner.algo, {"batch_size": 16})
        client.in_flight = 0  # (as if answered)
        client.poll()
        assert [m.fields["batch_size"] for m in sent] == [32, 16]
    finally:
        client.close()
        sock.close(linger=0)


@pytest.mark.parametrize("topology, hyper, field", [
    ("pbt_seed.yaml", {"batch_size": {"choice": [16, 32]}}, "batch_size"),  # unrolls per
    ("pbt_seed.yaml", {"unroll": {"choice": [8, 16]}}, "unroll"),  # update; the actors'
])
def test_validate_refuses_a_field_the_learner_reads_only_when_built(topology, hyper, field):
    with pytest.raises(TopologyError) as caught:
        load(REPO / "topologies" / topology, {"population": {"hyperparameters": hyper}})
    assert f"hyperparameters.{field}: algo.{field} does not take effect while " \
           "VTraceConfig's learner runs (its live_fields: baseline_cost, clip_c" \
        in str(caught.value), str(caught.value)


def test_validate_refuses_an_actors_field_of_td3():
    raw = {"name": "t", "seed": 0, "env": {"id": "Pendulum-v1"},
           "model": {"kind": "td3_mlp", "hidden": [8]},
           "algo": {"kind": "td3"},
           "population": {"size": 2, "hyperparameters": {
               "actor_lr": {"loguniform": [1e-4, 1e-3]},
               "exploration_noise": {"uniform": [0.05, 0.3]}}},
           "nodes": {"learner": {"kind": "learner"}}}
    from zmqrl.run.topology import from_dict

    with pytest.raises(TopologyError) as caught:
        from_dict(raw, "t.yaml")
    text = str(caught.value)
    assert "algo.exploration_noise does not take effect" in text, text
    assert "algo.actor_lr does not" not in text, text  # a live one passes


def test_live_fields_are_fields():
    for name in ("dqn", "r2d2", "vtrace", "ppo", "a2c", "alphazero", "td3", "sac", "muzero"):
        cls = algo_config.config_type(name)
        fields = {f.name for f in dataclasses.fields(cls)}
        assert cls.live_fields <= fields - {"kind"}, (name, cls.live_fields - fields)
