"""Pinning (node field ``cores``): a pinned replica's main thread runs on a core of its
own and every other thread of the run stays off that core; bad ``cores`` are named
before anything runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zmqrl.bus import cores
from zmqrl.run.topology import TopologyError, load

from conftest import read_csv, wait_for, write_topology

AVAILABLE = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cores = pytest.mark.skipif(len(AVAILABLE) < 2,
                                     reason="pinning one core needs another for the rest")


def _refusal(tmp_path: Path, **overrides) -> str:
    with pytest.raises(TopologyError) as info:
        load(write_topology(tmp_path, **overrides))
    return str(info.value)


def test_each_pinned_replica_needs_a_core_of_its_own(tmp_path):
    assert "field 'cores': lists 1 core(s) for 2 replicas" in _refusal(
        tmp_path, nodes={"actor": {"replicas": 2, "cores": [0]}})
    assert "field 'cores': lists a core twice" in _refusal(
        tmp_path, nodes={"actor": {"replicas": 2, "cores": [0, 0]}})
    message = _refusal(tmp_path, nodes={"actor": {"replicas": 1, "cores": [0]},
                                        "broker": {"cores": [0]}})
    assert "core 0 is already pinned by node" in message
    assert "field 'cores.0': -1 is less than the minimum of 0" in _refusal(
        tmp_path, nodes={"actor": {"cores": [-1]}})


def test_cores_this_machine_lacks_are_named(tmp_path):
    missing = max(AVAILABLE, default=0) + 1000
    topo = load(write_topology(tmp_path, nodes={"actor": {"replicas": 1,
                                                          "cores": [missing]}}))
    assert [f"node 'actor', field 'cores': core {missing} is not one this machine runs "
            "us on"] == [p.split(" (available")[0] for p in cores.host_errors(topo)]
    every = load(write_topology(tmp_path, nodes={"actor": {"replicas": len(AVAILABLE),
                                                           "cores": AVAILABLE}}))
    assert "leave at least one" in " ".join(cores.host_errors(every))


def test_up_refuses_bad_cores_before_starting_anything(processes, tmp_path):
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 1, "cores": [10_000]}})
    run_dir = tmp_path / "run"
    proc = processes.zmqrl("up", str(topo), "--run-dir", str(run_dir),
                           log=tmp_path / "up.log")
    assert proc.wait(timeout=60) == 2
    out = (tmp_path / "up.log").read_text()
    assert "core 10000 is not one this machine runs us on" in out
    assert not (run_dir / "logs").exists()  # no node was started


def test_plan_gives_the_replica_its_core_and_the_rest_the_other_cores(tmp_path):
    topo = load(write_topology(tmp_path, nodes={"actor": {"replicas": 1,
                                                          "cores": [AVAILABLE[0]]}}))
    assert cores.plan(topo, "actor", 0) == cores.CorePlan(
        AVAILABLE[0], frozenset(AVAILABLE[1:]))
    assert cores.plan(topo, "broker", 0) == cores.CorePlan(None, frozenset(AVAILABLE[1:]))
    unpinned = load(write_topology(tmp_path))
    assert cores.plan(unpinned, "actor", 0) is None


def test_bench_pins_the_first_cores_and_leaves_one_for_the_rest():
    from zmqrl.run.bench import actor_cores

    assert actor_cores(1, pin=False) is None
    if len(AVAILABLE) >= 2:
        assert actor_cores(len(AVAILABLE) - 1, pin=True) == AVAILABLE[:-1]
    with pytest.raises(ValueError, match="--pin needs more cores than actors"):
        actor_cores(len(AVAILABLE), pin=True)


def _allowed(pid: int, tid: int) -> set[int]:
    """The cores a thread may run on, as the kernel reports them."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    listed = status.split("Cpus_allowed_list:")[1].split()[0]
    out: set[int] = set()
    for part in listed.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def _threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _pid(run_dir: Path, label: str) -> int | None:
    try:
        return json.loads((run_dir / "status" / f"{label}.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


@needs_two_cores
def test_a_pinned_actor_has_its_core_to_itself(processes, tmp_path):
    core = AVAILABLE[0]
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 1, "cores": [core],
                                                     "args": {"envs": 4}}})
    run_dir = tmp_path / "run"
    processes.zmqrl("up", str(topo), "--run-dir", str(run_dir), log=tmp_path / "up.log")
    labels = ("actor", "broker", "learner")
    # A status file is written with each metrics row, after the actor pinned itself and
    # moved the threads it started since.
    wait_for(lambda: all(_pid(run_dir, label) for label in labels), 90,
             "every node's status file")
    actor = _pid(run_dir, "actor")
    assert actor is not None
    log = (run_dir / "logs" / "actor.log").read_text()
    assert f"cores: main thread on core {core}, other threads on cores" in log
    assert _allowed(actor, actor) == {core}
    others = [(label, pid, tid) for label in labels for pid in [_pid(run_dir, label)]
              if pid is not None for tid in _threads(pid) if tid != actor]
    assert len(others) >= 5  # the actor's ZeroMQ threads and two whole nodes
    for label, pid, tid in others:
        assert core not in _allowed(pid, tid), f"{label} thread {tid} may run on core {core}"
    # ...and the actor still steps its envs there
    wait_for(lambda: any(int(r["env_steps"] or 0) > 0
                         for r in read_csv(run_dir / "metrics" / "actor.csv")), 60,
             "the pinned actor's env steps")
