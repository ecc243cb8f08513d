"""``zmqrl bench`` measures both sides for real and says where the time goes: the limit's
split between envs and the model, and the CPU every node of the topology used per env
step (the ``cpu_cores`` column each node writes). Its figures are benchmarks, not
asserted here: BENCHMARKS.md records them."""

from __future__ import annotations

import json

from conftest import read_csv


def test_bench_reports_rates_and_each_nodes_cpu_per_env_step(processes, tmp_path):
    out = tmp_path / "bench.json"
    log = tmp_path / "bench.log"
    proc = processes.zmqrl("bench", "--actors", "1", "--envs", "16", "--lanes", "2",
                           "--seconds", "4", "--json", str(out), log=log)
    assert proc.wait(timeout=120) == 0, log.read_text()
    report = json.loads(out.read_text())
    assert report["limit_steps_per_s"] > 0 and report["topology_steps_per_s"] > 0
    assert len(report["limit_before_after"]) == 2 and min(report["limit_before_after"]) > 0
    split = report["limit_us_per_step"]
    assert split["env"] > 0 and split["model"] > 0
    # every node of the topology (one actor, the broker, the sink in the learner's place)
    assert set(report["cpu_cores"]) == {"actor", "broker", "learner"}, report["cpu_cores"]
    cores = report["cpu_cores"]
    assert cores["actor"] > 0.05 and cores["broker"] > 0.05
    assert cores["learner"] < cores["actor"]  # a sink only takes unrolls
    for label, cores in report["cpu_cores"].items():
        us = report["cpu_us_per_step"][label]
        assert abs(us - cores / report["topology_steps_per_s"] * 1e6) < 0.01 + 0.01 * us
    # the actor's time inside the envs' step: a share of its wall time (one thread steps)
    assert report["env_us_per_step"]["actor"] > 0 and 0 < report["env_cores"]["actor"] <= 1.05
    printed = log.read_text()
    assert "CPU per env step: limit" in printed and "broker" in printed


def test_every_node_reports_its_cpu_use(tmp_path):
    """A busy node's ``cpu_cores`` is near 1 and an idle one's near 0: a node measured
    in-process, its metrics row read back from the CSV."""
    import time

    from zmqrl.endpoints import Endpoints
    from zmqrl.node import Node, NodeContext
    from zmqrl.topology import from_dict

    topo = from_dict({"name": "cpu", "env": {"id": "CartPole-v1"},
                      "nodes": {"n": {"impl": "zmqrl.node:Node"}}})
    node = Node(NodeContext(topo, topo.nodes["n"], 0, tmp_path, Endpoints(topo, tmp_path)))
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # a busy interval
        pass
    node._emit_metrics()
    time.sleep(0.3)  # an idle one
    node._emit_metrics()
    node._metrics_log.close()
    busy, idle = (float(r["cpu_cores"]) for r in read_csv(tmp_path / "metrics" / "n.csv"))
    assert busy > 0.5 and idle < 0.2, (busy, idle)
