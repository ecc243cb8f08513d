"""Population-based training: the population section's expansion, the exploit/explore
decision, the controller's checkpoint (ray#27170, ray#62173), and a real `zmqrl up` of a
CartPole SEED population in which a member copies another."""

from __future__ import annotations

import json
import math
import random

import pytest

from zmqrl.parts.checkpoint import JSON, Checkpointer
from zmqrl.run.population import Member, Population, Settings, decide, expand
from zmqrl.run.topology import TopologyError, load

from conftest import REPO, read_csv, wait_for, write_topology

PBT_SEED = REPO / "topologies" / "pbt_seed.yaml"
SETTINGS = Settings(size=4, hyperparameters={"lr": {"loguniform": [1e-4, 1e-2]}},
                    truncation=0.25, resample_probability=0.0, ready_after_steps=100)


def test_population_expands_into_members_with_their_own_learners():
    topo = load(PBT_SEED, {"population": {"size": 3}})
    assert set(topo.nodes) == {"pbt"} | {f"{n}_m{i}" for n in ("learner", "broker", "actor")
                                         for i in range(3)}
    lrs = []
    for i in range(3):
        learner = topo.nodes[f"learner_m{i}"]
        assert learner.args["member"] == i
        assert learner.links == {"pbt": "pbt.members"}
        assert topo.nodes[f"broker_m{i}"].links == {"params": f"learner_m{i}.params",
                                                    "experience": f"learner_m{i}.experience"}
        assert topo.nodes[f"actor_m{i}"].links == {"policy": f"broker_m{i}.policy"}
        lr = learner.args["hyperparameters"]["lr"]
        assert 3e-5 <= lr <= 3e-3
        lrs.append(lr)
    assert len(set(lrs)) == 3  # each member drew its own
    assert topo.nodes["pbt"].args["population"]["size"] == 3
    # The same seed draws the same population; the resolved topology has no section left.
    assert load(PBT_SEED, {"population": {"size": 3}}).to_dict() == topo.to_dict()
    assert "population" not in topo.to_dict()
    assert expand({"nodes": {}}) == {"nodes": {}}  # no section: untouched


def test_a_bad_population_section_is_reported():
    with pytest.raises(TopologyError, match="population"):
        load(PBT_SEED, {"population": {"size": 1}})
    with pytest.raises(TopologyError, match="population"):
        load(PBT_SEED, {"population": {"hyperparameters": {"lr": {"normal": [0, 1]}}}})


def test_a_member_learner_must_have_one_replica():
    raw = {"seed": 0, "population": {"size": 2, "hyperparameters": {"lr": {"choice": [1e-3]}}},
           "nodes": {"learner": {"kind": "learner", "replicas": 2}}}
    with pytest.raises(ValueError, match="one replica"):
        expand(raw)


def _members(returns: list[float | None], checkpointed: list[bool] | None = None) -> dict:
    checkpointed = checkpointed or [True] * len(returns)
    return {i: Member(steps=100, mean_return=r, hyperparameters={"lr": 1e-3 * (i + 1)},
                      checkpointed=c) for i, (r, c) in enumerate(zip(returns, checkpointed,
                                                                     strict=True))}


def test_the_bottom_member_copies_a_top_one_and_perturbs():
    members = _members([10.0, 50.0, 30.0, 90.0])
    rng = random.Random(0)
    for other in (1, 2, 3):  # not in the bottom quarter: stays as it is
        assert decide(other, members, SETTINGS, rng) is None
    decision = decide(0, members, SETTINGS, rng)
    assert decision is not None and decision.donor == 3
    assert decision.recipient_return == 10.0 and decision.donor_return == 90.0
    ratio = decision.hyperparameters["lr"] / members[3].hyperparameters["lr"]
    assert min(abs(ratio - 0.8), abs(ratio - 1.2)) < 1e-12
    assert decision.how["lr"] in ("perturb x0.8", "perturb x1.2")
    resample = Settings(**{**SETTINGS.__dict__, "resample_probability": 1.0})
    decision = decide(0, members, resample, rng)
    assert decision.how == {"lr": "resample"}
    assert 1e-4 <= decision.hyperparameters["lr"] <= 1e-2


def test_a_member_that_never_checkpointed_is_never_copied():
    """ray#27170: the best member has no checkpoint yet, so it cannot be a donor; with
    no other member in the top fraction, nobody is copied."""
    members = _members([10.0, 50.0, 30.0, 90.0], checkpointed=[True, True, True, False])
    rng = random.Random(0)
    assert all(decide(0, members, SETTINGS, rng) is None for _ in range(50))
    half = Settings(**{**SETTINGS.__dict__, "truncation": 0.5})  # top two: 1 and 3
    assert {decide(0, members, half, rng).donor for _ in range(50)} == {1}
    # Members without a return yet are not ranked.
    assert decide(0, _members([10.0, None, None, None]), SETTINGS, rng) is None


def test_ready_points_come_every_ready_after_steps():
    pop = Population(SETTINGS, seed=0)
    for i, r in enumerate([10.0, 50.0, 30.0, 90.0]):
        pop.on_report(i, 50, r, {"lr": 1e-3}, True)  # before the ready point: nothing
    assert not pop.pending
    assert pop.on_report(0, 100, 10.0, {"lr": 1e-3}, True).donor == 3
    assert pop.on_report(0, 150, 10.0, {"lr": 1e-3}, True) is None  # busy loading
    pop.on_loaded(0)
    assert pop.exploits == 1
    assert pop.on_report(0, 150, 10.0, {"lr": 1e-3}, True) is None  # next at 200
    assert pop.on_report(0, 200, 10.0, {"lr": 1e-3}, True) is not None


def test_the_controller_restores_its_state_and_perturbed_hyperparameters(tmp_path):
    """ray#62173: hyperparameters perturbed at exploit time survive a restore, and so do
    the ready points and the RNG (the restored controller decides as the first would)."""
    pop = Population(SETTINGS, seed=3)
    for i, r in reversed(list(enumerate([10.0, 50.0, 30.0, 90.0]))):  # 0 ready last
        pop.on_report(i, 100, r, {"lr": 1e-3 * (i + 1)}, True)
    decision = pop.on_loaded(0)
    assert decision is not None and decision.donor == 3
    perturbed = decision.hyperparameters["lr"]
    assert not math.isclose(perturbed, 1e-3)
    path = tmp_path / "checkpoints" / "pbt.json"
    Checkpointer(path, pop, format=JSON).save()

    again = Population(SETTINGS, seed=999)  # another seed: the RNG must come from the file
    assert Checkpointer(path, again, format=JSON).restore_if_present()
    assert again.members[0].hyperparameters == {"lr": perturbed}
    assert again.members[0].last_ready == 100 and again.exploits == 1
    assert again.on_report(0, 150, 10.0, {"lr": perturbed}, True) is None  # not ready
    assert again.members[0].hyperparameters == {"lr": perturbed}
    nxt = [p.on_report(0, 200, 10.0, {"lr": perturbed}, True) for p in (pop, again)]
    assert nxt[0] == nxt[1]


def test_a_population_exploits_under_zmqrl_up(processes, tmp_path):
    """K=2 CartPole SEED members: at a ready point the worse one loads the better one's
    weights and optimizer state, and its learner reports the new lr."""
    path = write_topology(tmp_path, "pbt_seed.yaml",
                          population={"size": 2, "ready_after_steps": 1500},
                          nodes={"learner": {"args": {"checkpoint_every": 2}},
                                 "actor": {"args": {"envs": 8}}})
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("up", str(path), "--run-dir", str(run_dir), "--max-seconds", "120",
                           log=tmp_path / "up.log")
    lineage = run_dir / "pbt" / "lineage.jsonl"
    wait_for(lambda: lineage.exists() and lineage.read_text().strip() or proc.poll() is not None,
             100, "an exploit in pbt/lineage.jsonl")
    assert lineage.exists(), (tmp_path / "up.log").read_text()[-3000:]
    row = json.loads(lineage.read_text().splitlines()[0])
    assert {row["recipient"], row["donor"]} == {0, 1}
    assert row["donor_updates"] >= 1
    assert row["recipient_return"] <= row["donor_return"]
    lr = row["hyperparameters"]["lr"]
    donor_lr = _initial_lr(path, row["donor"])  # the first exploit: the donor's own draw
    assert row["how"]["lr"] == "resample" or any(math.isclose(lr, donor_lr * f)
                                                 for f in (0.8, 1.2))
    assert row["old_hyperparameters"]["lr"] == _initial_lr(path, row["recipient"])

    def reported() -> bool:
        rows = read_csv(run_dir / "metrics" / f"learner_m{row['recipient']}.csv")
        return any(int(r.get("pbt_loads") or 0) >= 1 and int(r["pbt_donor"]) == row["donor"]
                   and math.isclose(float(r["hp_lr"]), lr) for r in rows)

    wait_for(reported, 30, "the recipient's learner reporting the donor and new lr")


def _initial_lr(path, member: int) -> float:
    return load(path).nodes[f"learner_m{member}"].args["hyperparameters"]["lr"]
