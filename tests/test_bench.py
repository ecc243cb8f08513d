"""``zmqrl bench`` measures both sides for real and says where the time goes: the limit's
split between envs and the model, and the CPU every node of the topology used per env
step (the ``cpu_cores`` column each node writes). Its figures are benchmarks, not
asserted here: BENCHMARKS.md records them."""

from __future__ import annotations

import json

from zmqrl.run.runmetrics import RunMetrics, StopConditions
from zmqrl.run.topology import load

from conftest import REPO, read_csv


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
    """``cpu_cores`` is the process's CPU time over the interval's wall time: a node
    measured in-process over a busy and an idle interval, each checked against the same
    quotient taken by the test around it (the pytest process may run other threads, so
    the figure is compared, not assumed to be 1 or 0)."""
    import time

    from zmqrl.bus.endpoints import Endpoints
    from zmqrl.bus.node import Node, NodeContext
    from zmqrl.run.topology import from_dict

    topo = from_dict({"name": "cpu", "env": {"id": "CartPole-v1"},
                      "nodes": {"n": {"impl": "zmqrl.bus.node:Node"}}})
    node = Node(NodeContext(topo, topo.nodes["n"], 0, tmp_path, Endpoints(topo, tmp_path)))
    # Each interval runs from the start of one report to the start of the next, as the
    # node measures it: the report's own work (CSV, TensorBoard) falls in the interval.
    cpu, wall = time.process_time(), time.monotonic()
    node._emit_metrics()
    expected = []
    for busy in (True, False):
        if busy:
            while time.process_time() < cpu + 0.3:
                pass
        else:
            time.sleep(0.3)
        now_cpu, now_wall = time.process_time(), time.monotonic()
        expected.append((now_cpu - cpu) / (now_wall - wall))
        cpu, wall = now_cpu, now_wall
        node._emit_metrics()
    node._metrics_log.close()
    reported = [float(r["cpu_cores"]) for r in read_csv(tmp_path / "metrics" / "n.csv")][1:]
    assert len(reported) == 2
    for got, want in zip(reported, expected, strict=True):
        assert abs(got - want) < 0.05, (reported, expected)
    assert reported[0] > reported[1] + 0.2, reported  # busy above idle


def test_stepping_seconds_count_from_the_first_env_step(tmp_path):
    """``max_stepping_seconds`` (what the bench measures by): start-up does not count,
    however long it takes."""
    class Stepping(RunMetrics):
        steps = 0

        @property
        def total_env_steps(self) -> int:
            return self.steps

    run = Stepping(load(str(REPO / "topologies" / "seed.yaml")),
                   StopConditions(max_stepping_seconds=5.0, max_seconds=600.0), tmp_path)
    assert run.stop_reason(100.0) is None  # 100 s of start-up, no step yet
    run.steps = 64
    assert run.stop_reason(101.0) is None and run.stop_reason(105.9) is None
    assert run.stop_reason(106.0) == "5 s of stepping reached"
    assert run.stop_reason(600.0) == "--max-seconds 600 reached"


def test_target_return_averages_over_its_window_and_the_100_mean_stays_100(tmp_path):
    """``--target-window 20``: the target is judged on the last 20 episodes, while the
    progress line's and run.csv's return(100) still averages the last 100."""
    run = RunMetrics(load(str(REPO / "topologies" / "seed.yaml")),
                     StopConditions(target_return=-300.0, window=20), tmp_path)
    run.returns.extend([-1000.0] * 19)
    assert run.stop_reason(1.0) is None  # 19 episodes: not yet a window
    run.returns.extend([-1000.0] * 81 + [-250.0] * 20)
    assert run.mean_return(20) == -250.0 and run.mean_return() == -1000.0 * 0.8 - 50.0
    assert run.stop_reason(2.0) == ("target return -300 reached: mean of the last 20 "
                                    "episodes -250.0")


def test_bench_measures_a_topology_whose_actors_act_locally(processes, tmp_path):
    """Issue 29, Low 10: apex.yaml's actors act locally with a Q-network into a replay;
    the limit acts through the same behaviour, and the actors' own rows give the rate
    (it ended in ``'DuelingQNetwork' object has no attribute 'act'``)."""
    out, log = tmp_path / "bench.json", tmp_path / "bench.log"
    proc = processes.zmqrl("bench", "--topology", str(REPO / "topologies" / "apex.yaml"),
                           "--actors", "1", "--envs", "4", "--seconds", "3",
                           "--json", str(out), log=log)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    report = json.loads(out.read_text())
    assert report["limit_steps_per_s"] > 0 and report["topology_steps_per_s"] > 0
    assert {"actor", "replay", "learner"} <= set(report["cpu_cores"]), report["cpu_cores"]


def test_bench_refuses_what_it_cannot_measure_with_the_reason(processes, tmp_path):
    log = tmp_path / "bench.log"
    proc = processes.zmqrl("bench", "--topology", str(REPO / "topologies" / "a3c.yaml"),
                           "--seconds", "1", log=log)
    assert proc.wait(timeout=60) != 0
    assert "ship gradients" in log.read_text() and "Traceback" not in log.read_text()
